# Private to this collection: may change in any release.
"""The planner's indexes of one host's facts (Host). Pure, no I/O.

Built once per plan from ansible_facts.numa and gpu_topology: nodes, distances, usable CPUs
and their core groups, memory budgets, GPUs; then the free resources left while planning.
"""

from __future__ import annotations

from itertools import filterfalse
from typing import Optional

from .allowed import allowed_text, narrowing_sources
from .cpulist import format_cpulist
from .errors import PlacementError, PlanError
from .packages import crossed_nodes, crossed_warning
from .placements import HEADROOM_VAR, RESERVED_VAR, AmdPartitionDecl, format_kb
from .plan_common import BY_ADDRESS, CPU_KINDS, MEMORY_KINDS, counted, int_list
from .plan_fit import core_groups
from .plan_gpu import Gpu
from .plan_gpu_amd import AmdLayouts, partitioned, shared_uuids
from .plan_gpu_partitions import MigLayouts


def gpu_memory_nodes(nodes: list) -> dict:
    """{node id: PCI address} of the facts' nodes that are a GPU's own memory (gpu_owner)."""
    return {
        node["id"]: owner
        for node in nodes
        for owner in (node.get("gpu_owner"),)
        if isinstance(owner, str) and owner
    }


def _is_tier(value) -> bool:
    """Whether value is a memory tier id of the facts (an int; a bool is none)."""
    return isinstance(value, int) and not isinstance(value, bool)


def slow_memory_nodes(nodes: list) -> dict:
    """{node id: why} of the memory nodes slower than the host's best: a memory tier below the
    top one, CXL or DAX backing, or memory outside ZONE_NORMAL (has_normal_memory)."""
    tiers = [n.get("memory_tier") for n in nodes if _is_tier(n.get("memory_tier"))]
    top = min(tiers) if tiers else None
    slow = {}
    for node in nodes:
        tier, backing = node.get("memory_tier"), node.get("memory_backing")
        if _is_tier(tier) and top is not None and tier > top:
            slow[node["id"]] = f"memory tier {tier}, below tier {top}"
        elif backing in ("cxl", "dax"):
            slow[node["id"]] = f"{'CXL' if backing == 'cxl' else 'DAX'}-backed"
        elif node.get("normal_memory") is False:
            slow[node["id"]] = "no normal memory zone"
    return slow


class Host(MigLayouts, AmdLayouts):
    """Indexes of one host's facts, built once, and the free resources left while planning."""

    def __init__(
        self, host: str, numa: dict, gpu_topology: Optional[dict], policy, mig_gpus=()
    ) -> None:
        self.host = host
        self.headroom = policy.memory_headroom_pct
        self.reserved = frozenset(policy.reserved_cpus)
        if not isinstance(numa, dict) or not numa.get("nodes"):
            raise PlanError(
                host,
                "no NUMA facts (ansible_facts.numa has no nodes); gather them with "
                "numafleet.tuning.numa_facts before planning",
            )
        nodes = numa["nodes"]
        self.node_ids = [node["id"] for node in nodes]
        ids = numa.get("node_ids") or self.node_ids
        self.node = {node["id"]: node for node in nodes}
        self.dist: dict = {}
        for node in nodes:
            distances = node.get("distances") or ()
            # Position by position: a repeated id keeps its last distance, ids past the end
            # of distances get 255.
            row = {}
            for position, other in enumerate(ids):
                row[other] = distances[position] if position < len(distances) else 255
            row[node["id"]] = row.get(node["id"], 10)
            self.dist[node["id"]] = row
        cpus = numa.get("cpus") or {}
        self.online = frozenset(cpus.get("online") or ())
        self.offline = frozenset(cpus.get("offline") or ())
        self.isolated = frozenset(cpus.get("isolated") or ())
        self.cpu_node: dict = {}
        for node in nodes:
            self.cpu_node.update(dict.fromkeys(node.get("cpus") or (), node["id"]))
        per_cpu = numa.get("per_cpu") or ()
        # A comprehension: on Python 3.11 three times faster than dict(zip(map(itemgetter),
        # map(methodcaller))).
        siblings = {entry["id"]: entry.get("siblings") for entry in per_cpu}
        if len(siblings) > len(self.cpu_node):
            for entry in per_cpu:
                self.cpu_node.setdefault(entry["id"], entry.get("node"))
        self._check_reserved(nodes)
        self._untrusted_facts(numa, siblings)
        self._allowed_facts(numa)
        self._isolated_halves(siblings)
        blocked = self.reserved | self.isolated | frozenset(self.half_cores)
        self.usable: dict = {}
        self.free_groups: dict = {}
        self.free_cpus: dict = {}
        online = self.online if self.allowed_cpus is None else self.online & self.allowed_cpus
        for node in nodes:
            nid = node["id"]
            if node.get("kind") not in CPU_KINDS:
                continue
            # Facts list CPU sets sorted (CONTRIBUTING.md): no sorting here.
            cpus = node.get("cpus") or ()
            if not online.issuperset(cpus):
                cpus = [c for c in cpus if c in online]
            if blocked.isdisjoint(cpus):
                usable = list(cpus)
            else:
                usable = list(filterfalse(blocked.__contains__, cpus))
            if not usable:
                continue
            self.usable[nid] = usable
            # Nodes cut across by packages (vNUMA): their sibling lists are not trusted.
            groups = core_groups(usable, {} if nid in self.crossed else siblings)
            self.free_groups[nid] = groups
            self.free_cpus[nid] = len(usable)
        self.cpu_nodes = [nid for nid in self.node_ids if nid in self.usable]
        # A GPU's own memory exposed as a node (gpu_owner) is never a placement's memory.
        self.gpu_memory = gpu_memory_nodes(nodes)
        self.mem_nodes = [
            node["id"]
            for node in nodes
            if node.get("kind") in MEMORY_KINDS
            and (node.get("memory_kb") or 0) > 0
            and (self.allowed_mems is None or node["id"] in self.allowed_mems)
            and node["id"] not in self.gpu_memory
        ]
        mem_set = set(self.mem_nodes)
        self.budget = {
            nid: (self.node[nid].get("memory_kb") or 0) * (100 - self.headroom) // 100
            for nid in self.mem_nodes
        }
        self.used_kb = dict.fromkeys(self.mem_nodes, 0)
        self.hp_sizes = {
            nid: frozenset(h["size_kb"] for h in self.node[nid].get("hugepages") or ())
            for nid in self.mem_nodes
        }
        self.hp_planned: dict = {}
        self.hp_extra: dict = {}  # node -> {size_kb: count} of numafleet_hugepages_extra
        self.slow_mem = slow_memory_nodes([self.node[nid] for nid in self.mem_nodes])
        self.near_mem = {
            nid: [nid] if nid in mem_set else self.mem_order(nid) for nid in self.node_ids
        }
        self.taken_cpus: set = set()
        self.planned_cpus: dict = {}  # node -> CPUs given to placements
        # Free groups left of cores whose other SMT siblings a placement pinned: (cpu, owner)
        # pairs of those siblings. They sit at the end of free_groups, after the whole cores.
        self.shared: dict = {}
        # Placement-relevant PCI devices (GPUs, NICs, NVMe, CXL memory) that near: anchors on.
        self.pci = sorted(
            (d for d in numa.get("pci_devices") or () if isinstance(d, dict) and d.get("address")),
            key=BY_ADDRESS,
        )
        self._index_gpus(gpu_topology, mig_gpus)

    def _untrusted_facts(self, numa: dict, siblings: dict) -> None:
        """What the facts mark untrusted, and the plan warnings saying what the plan does.

        A node of kind unknown (numa_facts could not use its CPU list or meminfo) gets no
        placement, CPU or memory; online CPUs with unknown SMT siblings (``siblings`` null) are
        grouped by what their siblings' lists say, else one CPU per core. See
        docs/architecture.md, "Facts the planner does not trust".
        """
        self.untrusted: dict = {}  # node id -> the warnings of its files
        self.facts_warnings: list = []
        warned = [w for w in numa.get("warnings") or () if isinstance(w, dict)]
        for nid, node in self.node.items():
            if node.get("kind") != "unknown":
                continue
            inside = f"/node{nid}/"
            files = [
                f"{w.get('path')} ({w.get('reason')})"
                for w in warned
                if inside in str(w.get("path"))
            ]
            self.untrusted[nid] = "; ".join(files) or "see ansible_facts.numa.warnings"
            self.facts_warnings.append(
                f"node {nid} gets no placement: numa_facts could not use its CPU list or "
                f"meminfo ({self.untrusted[nid]}); fix the host's sysfs and gather facts again"
            )
        for finding in numa.get("consistency") or ():
            # A device that names a node that does not exist: its locality is taken as unknown
            # (or inferred from its local_cpulist); say so in the plan, not only in the facts.
            if isinstance(finding, dict) and finding.get("kind") == "device_on_missing_node":
                self.facts_warnings.append(str(finding.get("message")))
        self.crossed, crossed_packages = crossed_nodes(numa.get("consistency"))
        if self.crossed:
            self.facts_warnings.append(crossed_warning(self.crossed, crossed_packages))
        unsure = [cpu for cpu, listed in siblings.items() if listed is None and cpu in self.online]
        if unsure:
            self.facts_warnings.append(
                f"CPUs {format_cpulist(unsure)} have unknown SMT siblings (their "
                "thread_siblings_list could not be used, see ansible_facts.numa.warnings): "
                "grouped by their siblings' lists, else one CPU per core, so a placement may "
                "share a physical core with another"
            )

    def _allowed_facts(self, numa: dict) -> None:
        """The allowed cpuset of the facts (ansible_facts.numa.allowed), when it narrows.

        allowed_cpus / allowed_mems: frozensets, or None when the facts allow every online CPU
        / node (or carry no allowed key: facts of an older release). allowed_out is the plan's
        ``allowed``; a narrowed set is a plan warning naming the sets and their sources.
        """
        self.allowed_cpus = self.allowed_mems = None
        self.allowed_sources: list = []
        self.allowed_by: dict = {}  # "cpus" / "mems" -> the sources that narrow them
        # "cpus" / "mems" -> what the applied sources name, online or not (refusals name it)
        self.allowed_named: dict = {"cpus": None, "mems": None}
        allowed = numa.get("allowed")
        online = sorted(self.online)
        node_ids = list(self.node_ids)
        if isinstance(allowed, dict) and allowed.get("narrowed"):
            cpus = allowed.get("cpus")
            mems = allowed.get("mems")
            if int_list(cpus) and not set(cpus) >= self.online:
                self.allowed_cpus = frozenset(cpus)
            if int_list(mems) and not set(mems) >= set(node_ids):
                self.allowed_mems = frozenset(mems)
            self.allowed_sources = narrowing_sources(allowed, online, node_ids)
            self.allowed_by = {
                which: narrowing_sources(allowed, online, node_ids, which)
                for which in ("cpus", "mems")
            }
            for source in allowed.get("sources") or ():
                if not isinstance(source, dict) or not source.get("applies"):
                    continue
                for which, every in (("cpus", self.online), ("mems", node_ids)):
                    named = source.get(which)
                    if int_list(named) and not set(named) >= set(every):
                        have = self.allowed_named.get(which)
                        self.allowed_named[which] = (
                            set(named) if have is None else have & set(named)
                        )
        narrowed = self.allowed_cpus is not None or self.allowed_mems is not None
        cpus = online if self.allowed_cpus is None else sorted(self.allowed_cpus & self.online)
        mems = node_ids if self.allowed_mems is None else sorted(self.allowed_mems)
        self.allowed_out = {
            "cpus": cpus,
            "mems": mems,
            "narrowed": narrowed,
            "sources": self.allowed_sources if narrowed else [],
        }
        if narrowed:
            self.facts_warnings.append(
                f"services may use only {allowed_text(cpus, mems)} (the allowed cpuset, from "
                f"{self.allowed_source_text()}): the plan uses nothing outside them"
            )

    def _isolated_halves(self, siblings: dict) -> None:
        """half_cores: {online CPU: its isolated SMT siblings} of the CPUs not isolated themselves.

        A thread on such a CPU shares a core (caches, execution units) with an isolated CPU and
        disturbs what runs there: placements of a CPU count never get one (whole cores only);
        an explicit cpus: list may, with a warning (_explicit_cpus). A plan warning lists them.
        """
        self.half_cores: dict = {}
        if not self.isolated:
            return
        untrusted = []  # CPUs of crossed (vNUMA) nodes: their sibling lists are not trusted
        for cpu, listed in siblings.items():
            if cpu in self.isolated or cpu not in self.online or not isinstance(listed, list):
                continue
            if self.crossed and self.cpu_node.get(cpu) in self.crossed:
                if any(sibling in self.isolated for sibling in listed):
                    untrusted.append(cpu)
                continue
            near = sorted(sibling for sibling in listed if sibling in self.isolated)
            if near:
                self.half_cores[cpu] = near
        if self.half_cores:
            halves = sorted(self.half_cores)
            isolated = sorted({s for near in self.half_cores.values() for s in near})
            self.facts_warnings.append(
                f"CPUs {format_cpulist(halves)} share cores with isolated CPUs "
                f"{format_cpulist(isolated)} (SMT siblings): placements of a CPU count get whole "
                "cores only and never these; pin them with cpus: to use them"
            )
        if untrusted:
            self.facts_warnings.append(
                f"CPUs {format_cpulist(sorted(untrusted))} are listed as SMT siblings of isolated "
                "CPUs, but on nodes cut across by packages the sibling lists are not trusted: "
                "they are planned as cores of their own, like every CPU of those nodes"
            )

    def half_core_text(self, cpus) -> Optional[str]:
        """'CPU 4 shares a core with isolated CPU 6, ...' for the half-cores among cpus, or None."""
        pairs = [
            f"CPU {cpu} shares a core with isolated CPU {format_cpulist(self.half_cores[cpu])}"
            for cpu in cpus
            if cpu in self.half_cores
        ]
        if not pairs:
            return None
        return (
            "; ".join(pairs) + " (SMT siblings): its threads disturb what runs on the isolated CPU"
        )

    def allowed_source_text(self, which: str = "both") -> str:
        """'cgroup2_slice (<path>), pid1 (<path>)': where the allowed cpuset came from.

        which: "cpus" names the cpus files (cpuset.cpus.effective), "mems" the mems files
        (cpuset.mems.effective), "both" the files of whatever each source narrows.
        """
        named = self.allowed_by.get(which) if which != "both" else None
        return ", ".join(named or self.allowed_sources) or "ansible_facts.numa.allowed"

    def allowed_mems_text(self) -> str:
        """'the allowed memory nodes (0, from cgroup2_slice (<mems file>))'."""
        return (
            f"the allowed memory nodes ({format_cpulist(self.allowed_out['mems']) or 'none'}, "
            f"from {self.allowed_source_text('mems')})"
        )

    def allowed_hint(self) -> str:
        """' Services may use only CPUs ... (the allowed cpuset, from ...).' or ''."""
        if not self.allowed_out["narrowed"]:
            return ""
        sets = allowed_text(self.allowed_out["cpus"], self.allowed_out["mems"])
        return (
            f" Services may use only {sets}"
            f" (the allowed cpuset, from {self.allowed_source_text()}); widen that cpuset to "
            "plan outside it."
        )

    def kind_text(self, nid: int) -> str:
        """'kind memory-only', or for an untrusted node the files numa_facts could not use."""
        if nid in self.untrusted:
            return f"kind unknown: numa_facts could not use {self.untrusted[nid]}"
        if nid in self.gpu_memory:
            return f"kind {self.node[nid].get('kind')}, memory of GPU {self.gpu_memory[nid]}"
        return f"kind {self.node[nid].get('kind')}"

    def mem_order(self, nid: int) -> list:
        """The memory nodes for CPUs of node nid, best first: fast memory (top tier, normal,
        not CXL/DAX) before slow, then by distance from nid, then by id."""
        slow, row = self.slow_mem, self.dist[nid]
        return sorted(self.mem_nodes, key=lambda other: (other in slow, row[other], other))

    def memory_note(self, nodes: list, mems: list, hp_size: Optional[int]) -> Optional[str]:
        """The warning of a placement whose memory nodes are not its CPU nodes, else None.

        'memory on node 0, not on its CPU node 1 (distance 12): node 1 has no memory'.
        """
        far = [m for m in mems if m not in nodes]
        if not far:
            return None
        home = nodes[0]
        why = []
        for nid in nodes:
            if nid not in self.budget:
                why.append(self._no_budget_text(nid))
            elif hp_size is not None and hp_size not in self.hp_sizes[nid]:
                why.append(f"node {nid} offers no {format_kb(hp_size)} pages")
            else:
                why.append(f"the memory budget of node {nid} is full")
        distance = self.dist.get(home, {}).get(far[0], 255)
        nodes_text = "node" + ("s " if len(far) > 1 else " ") + ", ".join(map(str, far))
        cpu_text = "node" + ("s " if len(nodes) > 1 else " ") + ", ".join(map(str, nodes))
        slow = [m for m in far if m in self.slow_mem]
        tail = f"; node {slow[0]} is slower memory ({self.slow_mem[slow[0]]})" if slow else ""
        return (
            f"memory on {nodes_text}, not on its CPU {cpu_text} (distance {distance} from node "
            f"{home}): {', '.join(why)}{tail}"
        )

    def _no_budget_text(self, nid: int) -> str:
        """Why node nid takes no placement memory: not allowed, a GPU's memory, or none."""
        if nid in self.gpu_memory:
            return f"node {nid} is the memory of GPU {self.gpu_memory[nid]}"
        if self._mem_not_allowed(nid):
            return f"node {nid} is outside the allowed memory nodes"
        return f"node {nid} has no memory"

    def _mem_not_allowed(self, nid: int) -> bool:
        """Whether node nid has memory the allowed memory nodes leave out."""
        has_memory = (self.node.get(nid, {}).get("memory_kb") or 0) > 0
        return has_memory and self.allowed_mems is not None and nid not in self.allowed_mems

    def _has_online_cpus(self, nid: int) -> bool:
        """Whether node nid (of a kind with CPUs) has online CPUs, usable or not."""
        node = self.node.get(nid) or {}
        if node.get("kind") not in CPU_KINDS:
            return False
        return any(cpu in self.online for cpu in node.get("cpus") or ())

    def stranded(self) -> dict:
        """{node: [GPU addresses]} of the GPUs on nodes whose CPUs no placement can use."""
        found: dict = {}
        for gpu in self.gpus:
            if gpu.cpu_node is not None and gpu.cpu_node not in self.usable:
                found.setdefault(gpu.cpu_node, []).append(gpu.address)
        return found

    def no_cpus_text(self, nid: int) -> str:
        """Why node nid has no CPUs a placement can use: 'CPUs 32-63 are outside the allowed
        cpuset (CPUs 0-31, from cgroup2_slice (<cpus file>)); CPU 3 is isolated; ...'.

        Each online CPU of the node is named once, by the first rule that blocks it: outside the
        allowed cpuset, in numafleet_reserved_cpus, isolated, or an SMT sibling of an isolated CPU.
        """
        node = self.node.get(nid) or {}
        if node.get("kind") not in CPU_KINDS:
            return self.kind_text(nid)
        cpus = [cpu for cpu in node.get("cpus") or () if cpu in self.online]
        if not cpus:
            return f"{self.kind_text(nid)}, no online CPU"
        why: dict = {}
        for cpu in cpus:
            if self.allowed_cpus is not None and cpu not in self.allowed_cpus:
                why.setdefault("allowed", []).append(cpu)
            elif cpu in self.reserved:
                why.setdefault("reserved", []).append(cpu)
            elif cpu in self.isolated:
                why.setdefault("isolated", []).append(cpu)
            elif cpu in self.half_cores:
                why.setdefault("half", []).append(cpu)
        parts = []
        if "allowed" in why:
            parts.append(
                f"CPUs {format_cpulist(why['allowed'])} are outside the allowed cpuset (CPUs "
                f"{format_cpulist(self.allowed_out['cpus']) or 'none'}, from "
                f"{self.allowed_source_text('cpus')})"
            )
        if "reserved" in why:
            parts.append(f"CPUs {format_cpulist(why['reserved'])} are in {RESERVED_VAR}")
        if "isolated" in why:
            parts.append(f"CPUs {format_cpulist(why['isolated'])} are isolated")
        if "half" in why:
            parts.append(
                f"{self.half_core_text(why['half'])}; a placement of a CPU count never gets "
                "them (pin them with cpus:, or un-isolate the sibling)"
            )
        return "; ".join(parts) or self.kind_text(nid)

    def _check_reserved(self, nodes: list) -> None:
        missing = sorted(cpu for cpu in self.reserved if cpu not in self.cpu_node)
        if missing:
            raise PlacementError(
                self.host,
                f"{RESERVED_VAR}: {counted(len(missing), 'CPU', False)} {format_cpulist(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not on this host (it has "
                f"{format_cpulist(self.cpu_node)}); fix the cpulist",
            )
        if not self.reserved:
            return
        touched = {self.cpu_node[cpu] for cpu in self.reserved}
        for node in nodes:
            if node["id"] not in touched:
                continue
            cpus = node.get("cpus") or ()
            if any(cpu in self.online and cpu not in self.reserved for cpu in cpus):
                continue  # an online CPU of this node is left to placements
            online = [cpu for cpu in cpus if cpu in self.online]
            if online:
                raise PlacementError(
                    self.host,
                    f"{RESERVED_VAR} covers every online CPU of node {node['id']} "
                    f"({format_cpulist(online)}); leave at least one core of each node for "
                    "placements",
                )

    def _index_gpus(self, gpu_topology: Optional[dict], mig_gpus=()) -> None:
        entries = (gpu_topology or {}).get("gpus") or ()
        self.gpus: list = []
        self.gpu_by_id: dict = {}
        for entry in sorted(entries, key=lambda item: item["address"]):
            node = entry.get("node")
            cpu_node = None
            if node is not None and node in self.dist:
                cpu_node = node
                if node in self.usable or self._has_online_cpus(node):
                    # A node whose CPUs exist but none is usable (outside the allowed cpuset,
                    # isolated, reserved): its GPUs stay its own, remote to every usable CPU.
                    pass
                else:  # a GPU on a CPU-less node: its nearest CPU node
                    near = sorted(
                        self.cpu_nodes, key=lambda other, n=node: (self.dist[n][other], other)
                    )
                    cpu_node = near[0] if near else None
            gpu = Gpu(entry, cpu_node)
            if node is not None and node not in self.dist:
                gpu.node = None  # a node that does not exist: unknown, as numa_node -1
            self.gpus.append(gpu)
            self.gpu_by_id[gpu.address] = gpu
            if gpu.uuid:
                self.gpu_by_id[gpu.uuid] = gpu
        # UUIDs ROCR_VISIBLE_DEVICES cannot select by (logical GPUs sharing one): from the facts
        self.shared_uuids = shared_uuids(self.gpus)
        for declared in mig_gpus:
            if isinstance(declared, AmdPartitionDecl):
                self._declare_amd(declared)
            else:
                self._declare_mig(declared)
        self._check_amd_hives()
        # Free whole GPUs (MIG-enabled ones only ever serve MIG instances), by CPU node.
        self.free_whole: dict = {nid: [] for nid in self.node_ids}
        self.free_unknown: list = []
        for gpu in self.gpus:
            if gpu.mig_mode == "enabled" or gpu.mig_leaving or partitioned(gpu):
                continue
            if gpu.cpu_node is None:
                self.free_unknown.append(gpu)
            else:
                self.free_whole[gpu.cpu_node].append(gpu)

    def fail(self, placement, message: str) -> PlanError:
        return PlanError(self.host, f"{placement.where} {message}")

    def free_text(self) -> str:
        parts = []
        for nid in self.node_ids:
            kind = self.node[nid].get("kind")
            if kind not in CPU_KINDS and kind not in MEMORY_KINDS:
                continue
            gpus, cpus = len(self.free_whole.get(nid, ())), self.free_cpus.get(nid, 0)
            text = f"node{nid} {counted(gpus, 'GPU')}, {counted(cpus, 'CPU')}"
            if nid in self.budget:
                text += f", {format_kb(max(self.budget[nid] - self.used_kb[nid], 0))} memory"
            elif nid in self.gpu_memory:
                text += f", memory of GPU {self.gpu_memory[nid]} (never planned)"
            elif self._mem_not_allowed(nid):
                text += f", memory outside {self.allowed_mems_text()}"
            else:
                text += ", no memory"
            if gpus and kind in CPU_KINDS and nid not in self.usable:
                text += f" (GPUs not offered: {self.no_cpus_text(nid)})"
            parts.append(text)
        if self.free_unknown:
            parts.append(f"{counted(len(self.free_unknown), 'GPU')} of unknown node")
        return "; ".join(parts)

    # -- resources -------------------------------------------------------------------------

    def mem_for(self, cpu_node: int, need_kb: int, hp_kb: int, hp_size: Optional[int]):
        """The memory node that takes the charge for a CPU node, or None if none fits."""
        for nid in self.near_mem[cpu_node]:
            if hp_size is not None and hp_size not in self.hp_sizes[nid]:
                continue
            if self.used_kb[nid] + need_kb + hp_kb <= self.budget[nid]:
                return nid
        return None

    def _sizes_text(self, nodes) -> str:
        offered = sorted({s for nid in nodes for s in self.hp_sizes[nid]})
        return ", ".join(f"{s}K" if s < 1024 else format_kb(s) for s in offered) or "none"

    def reserve_extra(self, extras: list) -> None:
        """Charge numafleet_hugepages_extra to its nodes, before any placement is planned."""
        for extra in extras:
            where, nid = extra.where, extra.node
            if nid not in self.node:
                raise PlacementError(
                    self.host,
                    f"{where}.node: node {nid} does not exist (nodes: "
                    f"{', '.join(str(n) for n in self.node_ids)}); pick an existing node",
                )
            if nid not in self.budget:
                raise PlacementError(
                    self.host,
                    f"{where}.node: node {nid} has no memory for hugepages "
                    f"({self.kind_text(nid)}); pick one of "
                    f"{', '.join(str(n) for n in self.mem_nodes) or 'none'}",
                )
            if extra.size_kb not in self.hp_sizes[nid]:
                raise PlacementError(
                    self.host,
                    f"{where}.size: {format_kb(extra.size_kb)} pages are not offered by node "
                    f"{nid} (offered: {self._sizes_text([nid])}); pick an offered size",
                )
            need_kb = extra.size_kb * extra.count
            used = self.used_kb[nid]
            if used + need_kb > self.budget[nid]:
                earlier = f", {format_kb(used)} of it taken by earlier entries" if used else ""
                raise PlacementError(
                    self.host,
                    f"{where}: {extra.count} x {format_kb(extra.size_kb)} pages "
                    f"({format_kb(need_kb)}) do not fit in the memory budget of node {nid} "
                    f"({format_kb(self.budget[nid])}, capacity minus headroom{earlier}); lower "
                    f"count, lower {HEADROOM_VAR}, or put some of the pages on another node",
                )
            self.used_kb[nid] = used + need_kb
            for pools in (self.hp_planned, self.hp_extra):
                sizes = pools.setdefault(nid, {})
                sizes[extra.size_kb] = sizes.get(extra.size_kb, 0) + extra.count

    def groups_for(self, nid: int, count: int) -> int:
        """How many free groups (lowest first) of a node cover count CPUs; -1 if too few."""
        if self.free_cpus.get(nid, 0) < count:
            return -1
        total = 0
        for taken, group in enumerate(self.free_groups[nid], 1):
            total += len(group)
            if total >= count:
                return taken
        return -1
