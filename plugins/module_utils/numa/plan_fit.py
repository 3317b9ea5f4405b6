# Private to this collection: may change in any release.
"""CPU and memory fit of the planner. Pure, no I/O.

Free core groups, the fit of a placement on one node or a span of nodes, the memory node
and hugepages it takes, and the refusal that says why nothing fits.
"""

from __future__ import annotations

from typing import Optional

from .cpulist import format_cpulist
from .errors import PlacementError, PlanError
from .placements import HEADROOM_VAR, HUGEPAGES_EXTRA_VAR, RESERVED_VAR, format_kb
from .plan_common import counted
from .plan_gpu import Slot, choose_gpus, one_vendor
from .plan_gpu_amd import partitioned
from .plan_gpu_partitions import pending_refusal


class Fit:
    """One way to place a placement: nodes, CPUs, GPUs, memory node and its rank."""

    __slots__ = ("nodes", "groups", "cpus", "gpus", "mig", "mem_node", "mems", "rank", "spans")

    def __init__(self) -> None:
        self.nodes: list = []
        self.groups: dict = {}  # node -> number of free groups taken from the front
        self.cpus: Optional[tuple] = None  # explicit CPUs
        self.gpus: list = []
        self.mig: Optional[Slot] = None  # the MIG instance (plan_gpu.Slot) of a MIG fit
        self.mem_node: Optional[int] = None
        self.mems: list = []
        self.rank: tuple = ()
        self.spans = False

    @classmethod
    def on_node(cls, rank: tuple, nid: int, taken: int, picked: tuple, mem_node: int) -> Fit:
        """The fit on the one node nid: taken free groups, picked (gpus, mig), memory node."""
        fit = cls()
        fit.nodes = [nid]
        fit.groups = {nid: taken}
        fit.gpus, fit.mig = picked
        fit.mem_node = mem_node
        fit.mems = [mem_node]
        fit.rank = rank
        return fit


def core_groups(usable: list, siblings: dict) -> list:
    """SMT sibling groups of the usable CPUs (sorted), in the order of their lowest CPU."""
    lists = list(map(siblings.get, usable))
    if not all(lists) and (None in lists or [] in lists):
        lists = [siblings.get(cpu) or (cpu,) for cpu in usable]
    keys = dict.fromkeys(map(tuple, lists))
    usable_set = set(usable)
    groups = []
    for key in keys:
        if not usable_set.issuperset(key):
            key = tuple(c for c in key if c in usable_set)
        groups.append(key)
    if sum(map(len, groups)) == len(usable) and all(groups):
        return groups
    # Sibling lists that disagree with each other: one CPU, one group, lowest CPU first.
    groups = []
    for cpu in usable:
        if cpu in usable_set:
            group = tuple(c for c in siblings.get(cpu) or () if c in usable_set) or (cpu,)
            if cpu not in group:
                group = (cpu,)
            usable_set.difference_update(group)
            groups.append(group)
    return groups


class CpuMemoryFit:
    """_Planner part: the CPUs and memory nodes a placement fits on, and the refusal when none."""

    def _pin(self, p) -> tuple:
        """(key, node text, fix) naming p's node pin in messages: node: or near: <address>."""
        anchor = self.anchors.get(p.index)
        if anchor is None:
            return "node", f"node {p.node}", "drop node:"
        device, node_given = anchor
        return (
            "near",
            f"node {p.node} (from near: {device['address']})",
            "drop near: and node:" if node_given else "drop near:",
        )

    def _check_hugepages(self, p) -> None:
        state = self.state
        size = p.hugepages.size_kb
        nodes = state.mem_nodes
        if p.node is not None and p.node in state.near_mem:
            nodes = state.near_mem[p.node]
        if not any(size in state.hp_sizes[nid] for nid in nodes):
            offered = sorted({s for nid in nodes for s in state.hp_sizes[nid]})
            names = ", ".join(f"{s}K" if s < 1024 else format_kb(s) for s in offered) or "none"
            raise PlacementError(
                state.host,
                f"{p.where}.hugepages.size: {format_kb(size)} pages are not offered by the "
                f"node (offered: {names}); pick an offered size",
            )

    def _explicit_cpus(self, p, warnings: list) -> list:
        state = self.state
        nodes = set()
        self._check_allowed_cpus(p)
        for cpu in p.cpu_list:
            node = state.cpu_node.get(cpu)
            if node is None:
                raise PlacementError(
                    state.host,
                    f"{p.where}.cpus: CPU {cpu} does not exist on this host (it has "
                    f"{format_cpulist(state.cpu_node)}); fix the cpulist",
                )
            if cpu in state.offline or cpu not in state.online:
                raise PlacementError(
                    state.host, f"{p.where}.cpus: CPU {cpu} is offline; pin online CPUs only"
                )
            if cpu in state.reserved:
                raise PlacementError(
                    state.host,
                    f"{p.where}.cpus: CPU {cpu} is in {RESERVED_VAR}; pin other CPUs or "
                    "shrink the reserved set",
                )
            if cpu in state.taken_cpus:
                owner = next(entry["name"] for entry in self.out if cpu in entry["cpus"])
                raise PlacementError(
                    state.host,
                    f"{p.where}.cpus: CPU {cpu} is already given to {owner}; "
                    "pin other CPUs or use a count",
                )
            nodes.add(node)
        isolated = [cpu for cpu in p.cpu_list if cpu in state.isolated]
        if isolated:
            warnings.append(
                f"CPUs {format_cpulist(isolated)} are isolated (isolcpus): the scheduler does "
                "not balance threads across them"
            )
        halves = state.half_core_text(p.cpu_list)
        if halves is not None:
            warnings.append(halves)
        if p.node is not None and nodes != {p.node}:
            dummy, pin, drop = self._pin(p)
            raise PlacementError(
                state.host,
                f"{p.where}: cpus {format_cpulist(p.cpu_list)} are on node(s) "
                f"{', '.join(str(n) for n in sorted(nodes))}, not on {pin}; {drop} "
                "or pin CPUs of that node",
            )
        return sorted(nodes)

    def _check_allowed_cpus(self, p) -> None:
        """Refuse explicit cpus: outside the allowed cpuset, naming them and the set's source."""
        state = self.state
        if state.allowed_cpus is None:
            return
        outside = [
            cpu
            for cpu in p.cpu_list
            if cpu not in state.allowed_cpus and cpu in state.online and cpu in state.cpu_node
        ]
        if outside:
            raise PlacementError(
                state.host,
                f"{p.where}.cpus: {counted(len(outside), 'CPU', False)} {format_cpulist(outside)} "
                f"{'is' if len(outside) == 1 else 'are'} outside the CPUs services may use "
                f"({format_cpulist(state.allowed_out['cpus'])}, the allowed cpuset from "
                f"{state.allowed_source_text('cpus')}): the kernel would narrow or refuse the binding; "
                "pin CPUs inside it or widen that cpuset",
            )

    def _check_stranded(self, p, listed: list, warnings: list) -> None:
        """Listed GPUs on a node whose CPUs no placement can use (outside the allowed cpuset,
        isolated, reserved): refused, unless allow_span: true, which keeps them remote to the
        placement's CPUs with a warning (the GPU-crossing warning of _gpu_part names the node)."""
        state = self.state
        away = [g for g in listed if g.cpu_node is not None and g.cpu_node not in state.usable]
        if not away:
            return
        nid = away[0].cpu_node
        gpus = ", ".join(g.address for g in away if g.cpu_node == nid)
        why = state.no_cpus_text(nid)
        if p.allow_span:
            warnings.append(
                f"GPU {gpus} of node {nid} is used from another node's CPUs (allow_span): node "
                f"{nid} has no CPUs a placement can use ({why})"
            )
            return
        raise PlacementError(
            state.host,
            f"{p.where}.gpus: GPU {gpus} sits on node {nid}, which has no CPUs a placement can "
            f"use ({why}); its CPUs and memory would run on another node, away from the GPU. "
            f"Widen that cpuset (or free node {nid}'s CPUs), list GPUs of node "
            f"{', '.join(str(n) for n in state.cpu_nodes) or 'none'}, or set allow_span: true "
            "to use the GPU from another node's CPUs",
        )

    def check_allowed_leaves_room(self, placements: list) -> None:
        """Refuse an allowed cpuset that leaves no online CPU or no memory node a placement
        can use (a cgroup naming CPUs or nodes that are not online), naming the sets and the
        files they come from; raises PlacementError. Nothing to refuse without placements."""
        state = self.state
        if not placements or not state.allowed_out["narrowed"]:
            return
        online = format_cpulist(sorted(state.online)) or "none"
        named_cpus = format_cpulist(sorted(state.allowed_named["cpus"] or ())) or "none"
        named_mems = format_cpulist(sorted(state.allowed_named["mems"] or ())) or "none"
        if state.allowed_cpus is not None and not (state.allowed_cpus & state.online):
            raise PlacementError(
                state.host,
                f"the allowed cpuset from {state.allowed_source_text('cpus')} leaves no online "
                f"CPU (it names CPUs {named_cpus}; online: {online}): fix that cgroup's "
                "cpuset.cpus (or PID 1's affinity); nothing was planned",
            )
        if state.allowed_mems is not None and not state.mem_nodes:
            with_memory = [
                nid for nid in state.node_ids if (state.node[nid].get("memory_kb") or 0) > 0
            ]
            raise PlacementError(
                state.host,
                f"the allowed cpuset from {state.allowed_source_text('mems')} leaves no online "
                f"memory node a placement can use (it names nodes "
                f"{named_mems}; nodes with memory: "
                f"{format_cpulist(with_memory) or 'none'}): fix that cgroup's cpuset.mems; "
                "nothing was planned",
            )

    def _check_node(self, p) -> None:
        state = self.state
        if p.node not in state.node:
            raise PlacementError(
                state.host,
                f"{p.where}.node: node {p.node} does not exist (nodes: "
                f"{', '.join(str(n) for n in state.node_ids)}); pick an existing node",
            )
        if p.node not in state.usable:
            raise PlacementError(
                state.host,
                f"{p.where}.node: node {p.node} has no CPUs a placement can use "
                f"({state.no_cpus_text(p.node)}); pick one of "
                f"{', '.join(str(n) for n in state.cpu_nodes)}",
            )

    # -- fitting ---------------------------------------------------------------------------

    def _fit_node(
        self, p, nid: int, listed: list, fallback: bool, far: bool = False
    ) -> Optional[tuple]:
        """(rank, node, groups taken, (gpus, mig), memory node) of p on node nid, or None."""
        state = self.state
        if p.cpu_list is None:
            taken = state.groups_for(nid, p.cpu_count)
            if taken < 0:
                return None
        else:
            taken = 0
        if p.gpu_count or p.mig_profile is not None or p.partition is not None or listed:
            picked = self._gpu_pick(p, nid, listed, fallback, far)
            if picked is None:
                return None
        else:
            picked = ([], None)
        hugepages = p.hugepages
        if hugepages is None:
            mem = state.mem_for(nid, p.memory_kb, 0, None)
        else:
            mem = state.mem_for(
                nid, p.memory_kb, hugepages.size_kb * hugepages.count, hugepages.size_kb
            )
        if mem is None:
            return None
        free_whole = len(state.free_whole.get(nid, ()))
        cores_left = len(state.free_groups[nid]) - taken
        gpus = picked[0]
        if gpus:
            whole_left = free_whole - sum(
                1
                for g in gpus
                if g.use is None and g.cpu_node == nid and not g.mig_capable and not partitioned(g)
            )
            # PCIe switches the GPUs span first (locality), then fragmentation, then cores.
            switches = len({g.switch or g.address for g in gpus}) if len(gpus) > 1 else 1
            return ((switches, whole_left, cores_left, nid), nid, taken, picked, mem)
        return ((0, free_whole, cores_left, nid), nid, taken, picked, mem)

    def _single(
        self, p, nodes: list, listed: list, fallback: bool, far: bool = False
    ) -> Optional[Fit]:
        best = None
        for nid in nodes:
            found = self._fit_node(p, nid, listed, fallback, far)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return None
        return Fit.on_node(*best)

    def _span(self, p, nodes: list, listed: list) -> Optional[Fit]:
        """CPUs (and GPUs) from the best node plus its nearest nodes, or None."""
        state = self.state
        whole = p.mig_profile is None and p.partition is None and p.mps is None and not listed
        need_gpus = p.gpu_count if whole else 0

        def cover(nid):
            gpus = len(state.free_whole.get(nid, ())) if whole else 0
            return (-min(gpus, need_gpus), -min(state.free_cpus[nid], p.cpu_count), nid)

        hp_size = p.hugepages.size_kb if p.hugepages else None
        hp_kb = p.hugepages.size_kb * p.hugepages.count if p.hugepages else 0
        for best in sorted(nodes, key=cover):
            device = None
            if not whole:
                device = self._gpu_pick(p, best, listed, True)
                if device is None and (
                    p.mig_profile is not None
                    or p.partition is not None
                    or p.mps is not None
                    or listed
                ):
                    continue
            order = sorted(state.cpu_nodes, key=lambda other, b=best: (state.dist[b][other], other))
            fit = Fit()
            cpus_left, gpus_left = p.cpu_count, need_gpus
            vendor = None  # the GPUs of a placement are of one vendor
            for nid in order:
                if cpus_left <= 0 and gpus_left <= 0:
                    break
                take_gpus = []
                if gpus_left > 0:
                    pool = one_vendor(state.free_whole.get(nid, []), vendor)
                    take_gpus = choose_gpus(pool, min(len(pool), gpus_left)) or []
                    vendor = take_gpus[0].vendor if take_gpus else vendor
                take_cpus = min(cpus_left, state.free_cpus[nid])
                if not take_gpus and take_cpus <= 0:
                    continue
                fit.nodes.append(nid)
                fit.gpus.extend(take_gpus)
                gpus_left -= len(take_gpus)
                groups = state.groups_for(nid, take_cpus) if take_cpus > 0 else 0
                fit.groups[nid] = groups
                cpus_left -= sum(len(g) for g in state.free_groups[nid][:groups])
            if cpus_left > 0 or gpus_left > 0:
                continue  # another first node may pick another vendor's GPUs
            mem = state.mem_for(best, p.memory_kb, hp_kb, hp_size)
            if mem is None:
                mem = next(
                    (
                        nid
                        for nid in state.mem_order(best)
                        if (hp_size is None or hp_size in state.hp_sizes[nid])
                        and state.used_kb[nid] + p.memory_kb + hp_kb <= state.budget[nid]
                    ),
                    None,
                )
            if mem is None:
                return None
            if device is not None:
                fit.gpus, fit.mig = device
            fit.mem_node = mem
            fit.mems = sorted(
                {state.near_mem[nid][0] for nid in fit.nodes if state.near_mem[nid]} | {mem}
            )
            fit.spans = True
            return fit
        return None

    def _infeasible(self, p, nodes: list, listed: list, spanned: bool) -> PlanError:
        state = self.state
        # whole GPUs a placement can get together: those of one vendor
        if spanned:  # nodes were tried together: what is short is short on the whole host
            on = f" from NUMA {self._pin(p)[1]}" if p.node is not None else ""
            seen = [g for n in state.cpu_nodes for g in state.free_whole.get(n, ())]
            gpu_free = len(one_vendor(seen, None))
            cpu_free = sum(state.free_cpus.get(n, 0) for n in state.cpu_nodes)
        else:
            on = f" on NUMA {self._pin(p)[1]}" if p.node is not None else " on one NUMA node"
            seen = [g for n in nodes for g in state.free_whole.get(n, ())]
            gpu_free = max(
                (len(one_vendor(state.free_whole.get(n, []), None)) for n in nodes), default=0
            )
            cpu_free = max((state.free_cpus.get(n, 0) for n in nodes), default=0)
        vendors = sorted({str(g.vendor) for g in seen})
        hp_kb = p.hugepages.size_kb * p.hugepages.count if p.hugepages else 0
        if p.mig_profile is not None:
            need = f"needs a free {p.mig_profile} MIG slot and {counted(p.cpu_count, 'CPU')}{on}"
            free = self._free_mig_profiles(listed)
            if p.mig_profile not in free:
                pending = [
                    g
                    for g in listed or state.gpus
                    if g.mig_pending
                    and g.mig_capable
                    and g.mig_pick(p.mig_profile, pending_ok=True) is not None
                ]
                if pending:
                    return pending_refusal(state.host, p.where, p.mig_profile, pending)
            where = f"GPU {listed[0].address}" if listed else "the MIG GPUs"
            if p.mig_profile in free:
                fix = "Lower cpus or memory, or remove another placement."
            elif free:
                fix = (
                    f"Profiles with a free slot on {where}: {', '.join(free)}; pick one of "
                    "those, free a slot, or remove another placement."
                )
            else:
                fix = (
                    f"No MIG profile has a free slot left on {where}; free a slot or remove "
                    "another placement."
                )
            declared = [
                g
                for g in listed or state.gpus
                if g.mig_capable
                and g.mig_declared is not None
                and g.mig_declared.layout is not None
            ]
            if declared:
                fix += (
                    " The layout of "
                    + ", ".join(f"{g.address} ({g.mig_declared.where})" for g in declared)
                    + f" is declared and exact: add a {p.mig_profile} instance to it."
                )
            if p.mps is not None:
                owners = sorted(
                    {
                        slot.placement
                        for g in listed or state.gpus
                        if g.mig_capable
                        for slot in g.slots
                        if slot.profile == p.mig_profile and slot.placement is not None
                    }
                )
                if owners:
                    fix = (
                        f"Sharing one MIG instance between placements is not supported (each MIG "
                        f"placement gets its own instance; the {p.mig_profile} instances are "
                        f"taken by {', '.join(owners)}): to share one, make it a single "
                        f"placement. {fix}"
                    )
        elif p.partition is not None:
            free = [
                f"{g.address} (node {g.node}) {sum(1 for s in g.xcp_slots if s.placement is None)}"
                for g in listed or state.gpus
                if g.amd is not None and g.amd_compute_planned == p.partition
            ]
            need = (
                f"needs a free {p.partition} logical GPU and {counted(p.cpu_count, 'CPU')}{on} "
                f"(free logical GPUs: {', '.join(free) or 'none'})"
            )
            fix = (
                "Lower cpus or memory, pin node: to a node with a free logical GPU, set "
                "allow_span: true, or remove another placement."
            )
        elif listed:
            need = (
                f"needs {counted(p.cpu_count, 'CPU')} and {format_kb(p.memory_kb + hp_kb)} memory next to "
                f"GPU(s) {', '.join(g.address for g in listed)}"
            )
            fix = "Lower cpus or memory, set allow_span: true, or remove another placement."
        elif p.gpu_count and p.mps is None and gpu_free < p.gpu_count:
            need = f"needs {counted(p.gpu_count, 'GPU')}{on}"
            if spanned:
                need = f"needs {counted(p.gpu_count, 'GPU')} and {counted(p.cpu_count, 'CPU')}{on}"
            if len(vendors) > 1:
                need += f" of one vendor (the free GPUs are {' and '.join(vendors)})"
            fix = "Lower gpus, set allow_span: true, or remove another placement."
        elif p.mps is not None:
            need = f"needs a GPU for MPS and {counted(p.cpu_count, 'CPU')}{on}"
            fix = "Lower cpus or pinned_memory_limit, or remove another placement."
        elif cpu_free < p.cpu_count:
            need = f"needs {counted(p.cpu_count, 'CPU')}{on}"
            fix = "Lower cpus, set allow_span: true, or remove another placement."
        elif p.memory_kb + hp_kb:
            need = (
                f"needs {format_kb(p.memory_kb + hp_kb)} memory (hugepages included) on the memory "
                f"node next to its CPUs{on}, within the budget (capacity minus headroom)"
            )
            fix = f"Lower memory or hugepages, lower {HEADROOM_VAR}, or remove another placement."
            if state.hp_extra:
                fix = (
                    f"Lower memory or hugepages, lower {HUGEPAGES_EXTRA_VAR} (reserved first), "
                    f"lower {HEADROOM_VAR}, or remove another placement."
                )
        else:
            need = f"needs {counted(p.gpu_count, 'GPU')} and {counted(p.cpu_count, 'CPU')} together{on}"
            fix = "Lower gpus or cpus, set allow_span: true, or remove another placement."
        if spanned:
            need += ", even spanning nodes"
        if p.allow_span:
            fix = fix.replace(" set allow_span: true,", "")
        return state.fail(
            p, f"{need}; free per node: {state.free_text()}. {fix}{state.allowed_hint()}"
        )
