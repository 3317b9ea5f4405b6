# Private to this collection: may change in any release.
"""The planner: host facts + placements -> the plan (fact numafleet_plan). Pure, no I/O.

Greedy in declaration order: each placement takes what it needs from what earlier ones left,
so appending a placement never moves an earlier one. With the plan applied last (recorded on the
host), placements whose request did not change are committed first on their recorded resources,
so editing, reordering or removing one placement never moves another. See docs/architecture.md, "The plan".
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Optional

from . import limits, priority
from .cpulist import format_cpulist
from .errors import PlacementError
from .partition import plan_partition
from .placements import (
    AMD_PARTITION_KEYS,
    GPU_PARTITIONS_VAR,
    PLACEMENTS_VAR,
    TENANTS_VAR,
    format_kb,
    parse_gpu_partitions,
    parse_hugepages_extra,
    parse_mig_gpus,
    parse_placements,
    parse_policy,
    parse_tenants,
)
from .plan_common import DEFAULT_SLICE, PLAN_VERSION, counted, size_text
from .plan_facts import Host, gpu_memory_nodes, slow_memory_nodes
from .plan_fit import CpuMemoryFit, Fit
from .plan_gpu import Slot
from .plan_gpu_amd import AmdChecks, plan_amd_partitions
from .plan_gpu_choice import GpuChoice
from .plan_gpu_partitions import MigChecks, plan_mig_gpus, waits_text
from .plan_keep import KeepRecorded, parse_recorded, placement_request, request_change
from .plan_mps import MpsChecks, daemon_details, mig_daemons
from .plan_output import placement_text, plan_gpus_out, plan_summary
from .units import slice_name

# The planner's parts (docs/architecture.md, "The plan"):
#   plan_facts.py           Host: indexes of the facts, free CPUs/memory left while planning
#   plan_fit.py             CPU and memory fit (one node, a span), the refusal when none fits
#   plan_gpu.py             the GPU record (Gpu) and its partition slots (Slot)
#   plan_gpu_choice.py      which GPUs a placement gets, the GPU part of its entry
#   plan_gpu_partitions.py  declared MIG layouts, MIG checks, instances a placement waits for
#   plan_gpu_amd.py         AMD compute/memory partitions: declared modes, XCP slots, checks
#   plan_mps.py             MPS room and the plan's MPS daemons
#   plan_keep.py            the recorded plan and keeping placements on their resources
#   plan_output.py          the plan's GPU entries, placement_text and plan_summary
# This file: the greedy loop (_Planner) and plan_host. Names kept for the tests and callers:
_Host, _Fit = Host, Fit


class _Planner(GpuChoice, CpuMemoryFit, MigChecks, AmdChecks, MpsChecks, KeepRecorded):
    """Greedy placement of the placements in declaration order on what the Host has left."""

    def __init__(self, state: Host, placements: list, slices: dict) -> None:
        self.state = state
        self.placements = placements
        self.slices = slices  # tenant name -> its slice unit, escaped once per plan
        self.out: list = []
        # placement index -> (PCI device of near:, whether node: was written too)
        self.anchors: dict = {}
        # placement name -> "kept", "new", or why it was planned again (stable plans)
        self.keep: dict = {}
        self.requests: dict = {}  # placement index -> placement_request(p)

    def _place(self, p, prefer: Optional[int] = None) -> dict:
        """Plan p; prefer: the node it ran on (a changed placement stays there if it fits)."""
        state = self.state
        warnings: list = []
        if p.near is not None:  # a node pin derived from the device: planned as node: <its node>
            p = self._anchor(p)
        listed = self._listed_gpus(p) if p.gpu_ids else []
        if listed:
            self._check_stranded(p, listed, warnings)
        if p.mig_profile is not None:
            self._check_mig(p, listed)
        elif listed and p.mps is not None and p.mps.pinned_memory_limit_kb:
            self._check_mps_room(p, listed[0])
        if p.hugepages is not None:
            self._check_hugepages(p)
        if p.node is not None:
            self._check_node(p)
        pinned_nodes = self._explicit_cpus(p, warnings) if p.cpu_list is not None else None
        if listed and not p.allow_span:
            self._check_gpu_nodes(p, listed, pinned_nodes)
        mig_away = False
        if p.mig_profile is not None and not listed and (p.node is not None or pinned_nodes):
            mig_away = self._check_mig_nodes(p, pinned_nodes)
        if pinned_nodes is not None:
            nodes = pinned_nodes[:1]
        elif p.node is not None:
            nodes = [p.node]
        elif listed and listed[0].cpu_node in state.usable:
            nodes = [listed[0].cpu_node]
        else:
            nodes = state.cpu_nodes
        fit = None
        if prefer is not None and prefer in nodes and len(nodes) > 1:
            fit = self._single(p, [prefer], listed, False)
        if fit is None:
            fit = self._single(p, nodes, listed, False)
        needs_gpu = bool(p.gpu_count or p.mig_profile or p.partition)
        if fit is None and needs_gpu and not listed:
            fit = self._single(p, nodes, listed, True)
        if fit is None and mig_away:  # allow_span: a MIG GPU of another node, nearest first
            fit = self._single(p, nodes, listed, True, True)
        if fit is None and p.allow_span and pinned_nodes is None:
            fit = self._span(p, nodes, listed)
            if fit is not None:
                warnings.append(
                    f"spans NUMA nodes {', '.join(str(n) for n in fit.nodes)}: no single node "
                    "had room (allow_span)"
                )
        if fit is None:
            raise self._infeasible(p, nodes, listed, p.allow_span and pinned_nodes is None)
        if pinned_nodes is not None and len(pinned_nodes) > 1:
            fit.nodes = pinned_nodes
            fit.spans = True
            fit.mems = sorted({state.near_mem[n][0] for n in pinned_nodes} | {fit.mem_node})
            warnings.append(
                f"cpus {format_cpulist(p.cpu_list)} span NUMA nodes "
                f"{', '.join(str(n) for n in pinned_nodes)}"
            )
        return self._commit(p, fit, warnings)

    def _commit(self, p, fit: Fit, warnings: list) -> dict:
        state = self.state
        explicit = p.cpu_list if p.cpu_list is not None else fit.cpus
        if explicit is not None:
            cpus = list(explicit)
            pinned = set(cpus)
            for cpu in cpus:
                state.planned_cpus.setdefault(state.cpu_node[cpu], []).append(cpu)
            shared = state.shared
            for nid in {state.cpu_node[c] for c in cpus}:
                if nid in state.free_groups:
                    groups, partial = [], []
                    for group in state.free_groups[nid]:
                        if pinned.isdisjoint(group):
                            rest = group
                        else:
                            rest = tuple(c for c in group if c not in pinned)
                        if not rest:
                            shared.pop(group, None)
                        elif len(rest) < len(group):
                            owners = tuple((c, p.name) for c in group if c in pinned)
                            shared[rest] = shared.pop(group, ()) + owners
                            partial.append(rest)
                        elif group in shared:
                            partial.append(rest)
                        else:
                            groups.append(rest)
                    groups.extend(partial)  # whole cores first: counts take them before these
                    state.free_groups[nid] = groups
                    state.free_cpus[nid] = sum(map(len, groups))
        else:
            cpus = []
            shared = state.shared
            for nid in fit.nodes:
                taken = fit.groups.get(nid, 0)
                if taken:
                    free_groups = state.free_groups[nid]
                    groups = free_groups[:taken]
                    del free_groups[:taken]
                    node_cpus = list(chain.from_iterable(groups))
                    if shared:
                        for group in groups:
                            if group in shared:
                                self._shared_core(group, shared.pop(group), warnings)
                    state.free_cpus[nid] -= len(node_cpus)
                    state.planned_cpus.setdefault(nid, []).extend(node_cpus)
                    cpus.extend(node_cpus)
            cpus.sort()
        state.taken_cpus.update(cpus)
        note = state.memory_note(
            fit.nodes, fit.mems, p.hugepages.size_kb if p.hugepages is not None else None
        )
        if note is not None:
            warnings.append(note)
        hp_kb = p.hugepages.size_kb * p.hugepages.count if p.hugepages else 0
        state.used_kb[fit.mem_node] += p.memory_kb + hp_kb
        hugepages = None
        if p.hugepages is not None:
            pools = state.hp_planned.setdefault(fit.mem_node, {})
            pools[p.hugepages.size_kb] = pools.get(p.hugepages.size_kb, 0) + p.hugepages.count
            hugepages = {
                "size_kb": p.hugepages.size_kb,
                "count": p.hugepages.count,
                "node": fit.mem_node,
            }
        environment: dict = {}
        extra: dict = {}  # optional keys of the entry, only where set (device_allow)
        if fit.gpus:
            gpus_out, visible, mps_out, waits = self._gpu_part(p, fit, environment, warnings, extra)
        else:
            gpus_out, visible, mps_out, waits = [], "", None, None
        for key, value in p.environment:
            if key in environment:
                raise PlacementError(
                    state.host,
                    f"{p.where}.environment sets {key}, which the planner sets for this "
                    "placement from its GPUs; remove it",
                )
            environment[key] = value
        tenant_slice_name = self.slices[p.tenant] if p.tenant else DEFAULT_SLICE
        entry = {
            "name": p.name,
            "index": p.index,
            "unit": p.unit if p.unit else f"numafleet-{p.name}.service",
            "unit_kind": "dropin" if p.unit else "service",
            "exec": p.exec,
            "argv": list(p.argv),
            "description": p.description,
            "user": p.user,
            "group": p.group,
            "tenant": p.tenant,
            "slice": tenant_slice_name,
            "node": fit.nodes[0],
            "nodes": sorted(fit.nodes) if fit.spans else [fit.nodes[0]],
            "spans": fit.spans,
            "near": None if p.near is None else self._near_out(p),
            "cpus": cpus,
            "cpus_requested": p.cpu_count,
            "mems": fit.mems,
            "memory_node": fit.mem_node,
            "memory_kb": p.memory_kb,
            "hugepages": hugepages,
            "gpus": gpus_out,
            "cuda_visible_devices": visible,
            "mps": mps_out,
            "environment": dict(sorted(environment.items())) if environment else {},
            "waits_for": waits,
            "hardening": p.hardening,
            # as written (p may carry the node of its near: device by now)
            "request": self.requests.get(p.index) or placement_request(p),
            "warnings": warnings,
        }
        entry.update(extra)
        limits.add_to_entry(entry, p.limits, p.memory_kb)
        note = priority.warning(p.name, p.priority, p.memory_kb)
        if note is not None:
            warnings.append(note)
        return priority.add_to_entry(entry, p.priority)

    @staticmethod
    def _shared_core(group: tuple, owners: tuple, warnings: list) -> None:
        """Warn that a count placement got CPUs whose SMT siblings another placement pinned."""
        names = sorted({name for dummy, name in owners})
        siblings = format_cpulist([cpu for cpu, dummy in owners])
        warnings.append(
            f"{counted(len(group), 'CPU', False)} {format_cpulist(group)} "
            f"{'shares' if len(group) == 1 else 'share'} a core with "
            f"{counted(len(owners), 'CPU', False)} {siblings} of "
            f"{', '.join(names)} (SMT siblings): no whole free core was left for it; pin CPUs "
            "with cpus: to choose others"
        )

    def run(self, recorded: Optional[dict] = None) -> None:
        """Plan every placement; with a recorded plan, unchanged ones keep their resources first.

        recorded: name -> the placement's entry of the plan applied last (see parse_recorded).
        Kept placements are committed before any other, in declaration order; new, changed and
        no longer fitting ones are then planned around them, in declaration order. self.keep
        records, per name, "kept" or the reason it was planned again.
        """
        todo = []
        for p in self.placements:
            self.requests[p.index] = placement_request(p)
            old = (recorded or {}).get(p.name)
            if old is None:
                self.keep[p.name] = "new"
                todo.append(p)
                continue
            changed = request_change(old.get("request"), self.requests[p.index])
            if changed:
                self.keep[p.name] = f"its request changed ({changed})"
                todo.append(p)
                continue
            reason = self._keep(p, old)
            if reason is None:
                self.keep[p.name] = "kept"
            else:
                self.keep[p.name] = reason
                todo.append(p)
        for p in todo:
            old = (recorded or {}).get(p.name)
            self.out.append(self._place(p, old["nodes"][0] if old and old.get("nodes") else None))
        self.out.sort(key=itemgetter("index"))


def _check_tenant_memory(host: str, tenants: list, placements: list) -> None:
    """Refuse a tenant whose memory_max is below what its placements ask for."""
    limited = {t.name: t for t in tenants if t.memory_max_kb is not None}
    if not limited:
        return
    totals = dict.fromkeys(limited, 0)
    for p in placements:
        if p.tenant in limited:
            hp_kb = p.hugepages.size_kb * p.hugepages.count if p.hugepages else 0
            totals[p.tenant] += p.memory_kb + hp_kb
    for name, tenant in limited.items():
        total = totals[name]
        if total <= tenant.memory_max_kb:
            continue
        parts = []
        for p in placements:
            hp_kb = p.hugepages.size_kb * p.hugepages.count if p.hugepages else 0
            if p.tenant != name or not p.memory_kb + hp_kb:
                continue
            text = f"{p.name} {format_kb(p.memory_kb)}" if p.memory_kb else p.name
            if hp_kb:
                text += f"{' +' if p.memory_kb else ''} {format_kb(hp_kb)} hugepages"
            parts.append(text)
        raise PlacementError(
            host,
            f"{TENANTS_VAR}[{tenant.index}] ({name}).memory_max: "
            f"{format_kb(tenant.memory_max_kb)} is less than the {format_kb(total)} of memory and "
            f"hugepages its placements ask for ({', '.join(parts)}); raise memory_max to at least "
            f"{size_text(total)}, lower their memory or hugepages, or move a placement to "
            "another tenant",
        )


def plan_host(
    host,
    numa,
    gpu_topology,
    placements,
    tenants,
    policy,
    hugepages_extra=None,
    mig_gpus=None,
    recorded=None,
    recorded_daemons=None,
) -> dict:
    """The plan (fact numafleet_plan) of one host; raises PlanError (PlacementError for bad vars).

    hugepages_extra (numafleet_hugepages_extra, also read from policy["hugepages_extra"] when not
    given) are pages wanted outside the placements: they are reserved on their node before any
    placement is planned, count against its memory budget, and are part of nodes[].hugepages.
    recorded (parse_recorded: name -> entry of the plan applied last, or None to plan from
    scratch) makes the plan stable: a placement whose request did not change keeps its node,
    CPUs, memory nodes, GPUs, MIG slot and MPS share while they still exist and fit; the plan's
    ``stability`` says, per placement, "kept", "new" or why it was planned again.
    recorded_daemons (the recorded plan's mps_daemons, with recorded) lets an MPS daemon keep
    its recorded CPUs while they are all still ones it may use (kept_daemon_cpus).
    """
    if hugepages_extra is None:
        hugepages_extra = (policy or {}).get("hugepages_extra")
    parsed_policy = parse_policy(host, policy)
    parsed_extra = parse_hugepages_extra(host, hugepages_extra)
    if mig_gpus is None:
        mig_gpus = (policy or {}).get("mig_gpus")
    if isinstance(mig_gpus, list) and any(
        isinstance(entry, dict) and any(key in entry for key in AMD_PARTITION_KEYS)
        for entry in mig_gpus
    ):  # numafleet_gpu_partitions with AMD entries: both vendors, routed per GPU (Host)
        nvidia, amd = parse_gpu_partitions(host, mig_gpus, GPU_PARTITIONS_VAR)
        parsed_mig = nvidia + amd
    else:
        parsed_mig = parse_mig_gpus(host, mig_gpus)
    parsed_tenants = parse_tenants(host, tenants)
    parsed = parse_placements(host, placements, parsed_tenants)
    if parsed_tenants:
        _check_tenant_memory(host, parsed_tenants, parsed)
    state = Host(host, numa, gpu_topology, parsed_policy, parsed_mig)
    state.reserve_extra(parsed_extra)
    slices = {tenant.name: slice_name(tenant.name) for tenant in parsed_tenants}
    planner = _Planner(state, parsed, slices)
    planner.check_allowed_leaves_room(parsed)
    planner.check_amd_placements(parsed)
    planner.check_amd_changes(parsed, recorded)
    planner.run(recorded)
    tenants_out = []
    for tenant in sorted(parsed_tenants, key=lambda t: t.name):
        members = [entry for entry in planner.out if entry["tenant"] == tenant.name]
        tenants_out.append(
            {
                "name": tenant.name,
                "slice": slices[tenant.name],
                "memory_max_kb": tenant.memory_max_kb,
                "description": tenant.description,
                "cpus": sorted(set(chain.from_iterable(entry["cpus"] for entry in members))),
                "mems": sorted(set(chain.from_iterable(entry["mems"] for entry in members))),
                "placements": [entry["name"] for entry in members],
            }
        )
    planned = state.planned_cpus
    gpus_by_node: dict = {}
    for gpu in state.gpus:
        if gpu.node is not None:
            gpus_by_node.setdefault(gpu.node, []).append(gpu.address)
    nodes_out = []
    for nid in state.node_ids:
        node = state.node[nid]
        pools = state.hp_planned.get(nid, {})
        extra = state.hp_extra.get(nid, {})
        nodes_out.append(
            {
                "id": nid,
                "kind": node.get("kind"),
                "memory_kb": node.get("memory_kb") or 0,
                "budget_kb": state.budget.get(nid, 0),
                "planned_memory_kb": state.used_kb.get(nid, 0),
                "cpus_usable": state.usable.get(nid, []),
                "cpus_planned": sorted(planned.get(nid, [])),
                "hugepages": [
                    {"size_kb": size, "count": pools[size]} for size in sorted(pools) if pools[size]
                ],
                "hugepages_extra": [
                    {"size_kb": size, "count": extra[size]} for size in sorted(extra) if extra[size]
                ],
                "gpus": gpus_by_node.get(nid, []),
            }
        )
    gpus_out, daemons = plan_gpus_out(
        state, {entry["name"]: entry["index"] for entry in planner.out}
    )
    daemons.extend(mig_daemons(planner.out))
    daemons.sort(key=lambda d: (d["gpu_address"], d["pipe_dir"]))
    daemon_details(host, daemons, planner.out, parsed, gpus_out, state, recorded_daemons)
    # The housekeeping partition (partition.py): from numafleet_reserved_cpus and the facts
    # only, never from the placements' CPUs, so a placement edit leaves its files as they are.
    partition = plan_partition(
        host,
        (policy or {}).get("partition"),
        state.reserved,
        state.online,
        None if state.allowed_cpus is None else sorted(state.allowed_cpus),
        planner.out,
    )
    out = {
        "version": PLAN_VERSION,
        "host": host,
        "reserved_cpus": sorted(state.reserved),
        "memory_headroom_pct": parsed_policy.memory_headroom_pct,
        "placements": planner.out,
        "tenants": tenants_out,
        "nodes": nodes_out,
        "gpus": gpus_out,
        "mps_daemons": daemons,
        "mig_gpus": plan_mig_gpus(gpus_out),
        "stability": dict(sorted(planner.keep.items())),
        # Facts the planner does not trust first, then the placements' in declaration order,
        # whatever order kept and new placements were committed in.
        "warnings": [f"facts: {text}" for text in state.facts_warnings]
        + [
            f"placement {entry['name']}: {text}"
            for entry in planner.out
            for text in entry["warnings"]
        ],
        # The CPUs and memory nodes the plan stays inside (ansible_facts.numa.allowed).
        "allowed": state.allowed_out,
    }
    amd_partitions = plan_amd_partitions(
        state, {entry["name"]: entry["unit"] for entry in planner.out}
    )
    if amd_partitions is not None:  # only hosts with AMD GPUs (older plans stay identical)
        out["amd_partitions"] = amd_partitions
    if partition is not None:
        out["partition"] = partition  # optional: absent = no partition (older plans too)
    return out


__all__ = [
    "PLACEMENTS_VAR",
    "Slot",
    "gpu_memory_nodes",
    "placement_text",
    "slow_memory_nodes",
    "parse_recorded",
    "placement_request",
    "plan_host",
    "plan_summary",
    "waits_text",
]
