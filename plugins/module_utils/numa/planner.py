# Private to this collection: may change in any release.
"""The planner: host facts + placements -> the plan (fact numafleet_plan). Pure, no I/O.

Greedy in declaration order: each placement takes what it needs from what earlier ones left,
so appending a placement never moves an earlier one. With the plan applied last (recorded on the
host), placements whose request did not change are committed first on their recorded resources,
so editing, reordering or removing one placement never moves another. See docs/architecture.md, "The plan".
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain, filterfalse, islice
from operator import itemgetter
from typing import Optional

from . import limits
from .allowed import allowed_text, narrowing_sources
from .cpulist import format_cpulist
from .errors import PlacementError, PlanError
from .packages import crossed_nodes, crossed_warning
from .partition import plan_partition
from .placements import (
    GPU_SHORT_ADDRESS,
    HEADROOM_VAR,
    HUGEPAGES_EXTRA_VAR,
    PLACEMENTS_VAR,
    RESERVED_VAR,
    TENANTS_VAR,
    format_kb,
    parse_hugepages_extra,
    parse_mig_gpus,
    parse_placements,
    parse_policy,
    parse_tenants,
)
from .units import slice_name

PLAN_VERSION = 1
_CI_SLICES = (1, 2, 3, 4, 6, 7, 8)
CPU_KINDS = ("cpu+memory", "cpu-only")
MEMORY_KINDS = ("cpu+memory", "memory-only")
MPS_PIPE_ROOT = "/run/nvidia-mps"
MPS_LOG_ROOT = "/var/log/nvidia-mps"
DEFAULT_SLICE = "numafleet.slice"
_ADDRESS = itemgetter("address")
# How messages name a PCI device kind of ansible_facts.numa.pci_devices.
_KIND_NAMES = {"gpu": "GPU", "nic": "NIC", "nvme": "NVMe drive", "cxl_memory": "CXL memory device"}
_KNOWN_DEVICES_SHOWN = 5


def _count(number: int, noun: str, with_number: bool = True) -> str:
    """'1 GPU', '2 GPUs' (or just the noun in the right number)."""
    word = noun if number == 1 else noun + "s"
    return f"{number} {word}" if with_number else word


def _short_address(address: str) -> str:
    return address[5:] if address.startswith("0000:") else address


def _device_label(device: dict) -> str:
    """'NIC 0000:4b:00.0': a PCI device of the facts as messages name it."""
    kind = device.get("kind")
    return f"{_KIND_NAMES.get(kind, kind or 'device')} {device['address']}"


def _device_hint(device: dict) -> str:
    """'0000:4b:00.0 (nic, node 0)': address, kind and node of a PCI device for a known: list."""
    node = device.get("node")
    return f"{device['address']} ({device.get('kind')}, node {'unknown' if node is None else node})"


def _profile_maps(profiles: list) -> tuple:
    """({profile name: sorted (start, size) placements}, {profile name: memory_mib}) of a GPU."""
    placements = {
        profile["name"]: sorted(
            (slot["start"], slot["size"]) for slot in profile.get("placements") or ()
        )
        for profile in profiles
        if profile.get("name")
    }
    memory = {
        profile["name"]: profile["memory_mib"]
        for profile in profiles
        if profile.get("name") and profile.get("memory_mib")
    }
    return placements, memory


class _Gpu:
    """One GPU of the facts and what the plan has given of it so far."""

    __slots__ = (
        "address",
        "uuid",
        "node",
        "cpu_node",
        "vendor",
        "switch",
        "peers",
        "memory_mib",
        "mig_mode",
        "mig_mode_current",
        "mig_mode_pending",
        "mig_declared",
        "mig_leaving",
        "mig_supported",
        "mig_profiles",
        "mig_memory",
        "mig_existing",
        "use",
        "placements",
        "slots",
        "claimed",
        "mps_clients",
        "mps_pinned_kb",
        "mps_pct",
        "mig_pending",
    )

    def __init__(self, entry: dict, cpu_node: Optional[int]) -> None:
        self.address = entry["address"]
        self.uuid = entry.get("uuid")
        self.node = entry.get("node")
        self.cpu_node = cpu_node
        self.vendor = entry.get("vendor")
        self.switch = entry.get("switch")
        self.peers = frozenset(entry.get("nvlink_peers") or ())
        self.memory_mib = entry.get("memory_total_mib")
        mig = entry.get("mig") or {}
        self.mig_mode = mig.get("mode_current")
        self.mig_mode_current = self.mig_mode
        # The mode the driver applies at the next GPU reset (nvidia-smi's pending_mig).
        self.mig_mode_pending = mig.get("mode_pending", self.mig_mode)
        # A MIG mode change waits for a GPU reset (facts mig.reset_required): no new instance
        # is planned on this GPU until it applies (pending_refusal).
        self.mig_pending = (
            self.mig_mode_current is not None
            and self.mig_mode_pending is not None
            and self.mig_mode_current != self.mig_mode_pending
        )
        self.mig_declared = None  # the numafleet_mig_gpus entry of this GPU
        self.mig_leaving = False  # declared disabled while MIG is on: not a whole GPU yet
        profiles = mig.get("supported_profiles")
        self.mig_supported = profiles
        self.mig_profiles = None
        self.mig_memory: dict = {}  # profile name -> memory_mib of one instance
        self.mig_existing: list = []
        if self.mig_mode == "enabled" and profiles is not None:
            self.mig_profiles, self.mig_memory = _profile_maps(profiles)
            self.mig_existing = sorted(
                (
                    (
                        instance["placement_start"],
                        instance["placement_size"],
                        instance.get("profile_name"),
                        instance.get("mig_device_uuid"),
                    )
                    for instance in mig.get("gpu_instances") or ()
                    if instance.get("placement_start") is not None
                ),
                key=lambda item: item[0],
            )
        self.use: Optional[str] = None  # None (free), "whole", "mps"
        self.placements: list = []
        # MIG: (start, size, profile, device_uuid, placement name or None, existing,
        # compute profile or None)
        self.slots = [(s, z, p, u, None, True, None) for s, z, p, u in self.mig_existing]
        self.claimed: set = set()  # starts of existing instances given to a placement
        self.mps_clients: list = []
        self.mps_pinned_kb = 0
        self.mps_pct: list = []

    @property
    def mig_capable(self) -> bool:
        return self.mig_profiles is not None

    def mig_pick(
        self, profile: str, start: Optional[int] = None, pending_ok: bool = False
    ) -> Optional[tuple]:
        """(start, size, device_uuid, existing) of the instance a new MIG client gets, or None.

        start: only the instance at that slice (a kept placement's recorded slot). While the
        GPU's MIG mode is pending (mig_pending) only existing instances are given, unless
        pending_ok (a kept placement that was already waiting for its instance).
        """
        for slot_start, size, name, uuid in self.mig_existing:
            if start is not None and slot_start != start:
                continue
            if name == profile and slot_start not in self.claimed:
                return slot_start, size, uuid, True
        if self.mig_pending and not pending_ok:
            return None
        if self.mig_declared is not None and self.mig_declared.layout is not None:
            # A declared layout is exact: only its instances still to be created are left.
            for slot in self.slots:
                if (start is None or slot[0] == start) and slot[2] == profile:
                    if not slot[5] and slot[4] is None:
                        return slot[0], slot[1], None, False
            return None
        for slot_start, size in self.mig_profiles.get(profile) or ():
            if start is not None and slot_start != start:
                continue
            end = slot_start + size
            if all(end <= s or slot_start >= s + z for s, z, *dummy in self.slots):
                return slot_start, size, None, False
        return None

    def mps_room(self, pinned_kb: int) -> bool:
        if self.memory_mib is None or not pinned_kb:
            return True
        return self.mps_pinned_kb + pinned_kb <= self.memory_mib * 1024


# Why a placement's MIG instance does not exist yet (its plan entry's waits_for.reason).
WAIT_PENDING_RESET = "mode change pending a reset"
WAIT_MODE_THEN_CREATE = "created in this run once MIG mode is on"
WAIT_CREATE = "created in this run"


def waits_for_instance(gpu: _Gpu, profile: str, start: int) -> dict:
    """waits_for of a placement whose MIG instance does not exist yet (no I/O).

    {"mig_instance": "<profile> at slice <start> of GPU <address>", "gpu": address, "profile",
    "start", "reason"}: reason is WAIT_PENDING_RESET when the GPU's MIG mode change is pending
    until a GPU reset (facts mig.reset_required; only a kept placement that already waited gets
    this: a new one is refused, pending_refusal), WAIT_MODE_THEN_CREATE when MIG mode is off (the
    MIG layer enables it, then creates the instance, unless the GPU needs a reset first), else
    WAIT_CREATE (the MIG layer creates it in this run).
    """
    if gpu.mig_pending:
        reason = WAIT_PENDING_RESET
    elif gpu.mig_mode_current == "enabled":
        reason = WAIT_CREATE
    else:
        reason = WAIT_MODE_THEN_CREATE
    return {
        "mig_instance": f"{profile} at slice {start} of GPU {gpu.address}",
        "gpu": gpu.address,
        "profile": profile,
        "start": start,
        "reason": reason,
    }


def pending_text(gpu: _Gpu) -> str:
    """'GPU 0000:17:00.0 has MIG mode disabled with enabled pending until a GPU reset'."""
    return (
        f"GPU {gpu.address} has MIG mode {gpu.mig_mode_current} with {gpu.mig_mode_pending} "
        "pending until a GPU reset (facts mig.reset_required)"
    )


PENDING_FIX = (
    "reset the GPU so that the pending mode applies (nvidia-smi --gpu-reset -i {address} once "
    "nothing holds it) or reboot the host, then run site.yml again"
)


def pending_refusal(host: str, where: str, profile: str, gpus: list) -> PlacementError:
    """The error of a placement (at ``where``) that needs a new ``profile`` MIG instance and
    whose only candidate GPUs ``gpus`` have a MIG mode change pending (no I/O)."""
    first = gpus[0]
    named = "; ".join(pending_text(gpu) for gpu in gpus)
    return PlacementError(
        host,
        f"{where}.mig_profile: {profile} needs a new MIG instance, but {named}: no MIG "
        f"instance is planned on {'it' if len(gpus) == 1 else 'them'} until the mode applies; "
        + PENDING_FIX.format(address=first.address),
    )


def waits_text(entry: dict) -> str:
    """'waits for MIG instance 1g.10gb at slice 2 of GPU 0000:17:00.0: created in this run', or
    '' for a plan entry (placement) that waits for nothing."""
    waits = entry.get("waits_for")
    if not isinstance(waits, dict):
        return ""
    return f"waits for MIG instance {waits.get('mig_instance')}: {waits.get('reason')}"


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


class _Fit:
    """One way to place a placement: nodes, CPUs, GPUs, memory node and its rank."""

    __slots__ = ("nodes", "groups", "cpus", "gpus", "mig", "mem_node", "mems", "rank", "spans")

    def __init__(self) -> None:
        self.nodes: list = []
        self.groups: dict = {}  # node -> number of free groups taken from the front
        self.cpus: Optional[tuple] = None  # explicit CPUs
        self.gpus: list = []
        self.mig: Optional[tuple] = None
        self.mem_node: Optional[int] = None
        self.mems: list = []
        self.rank: tuple = ()
        self.spans = False

    @classmethod
    def on_node(cls, rank: tuple, nid: int, taken: int, picked: tuple, mem_node: int) -> _Fit:
        """The fit on the one node nid: taken free groups, picked (gpus, mig), memory node."""
        fit = cls.__new__(cls)  # every slot is set here: no empty lists to throw away
        fit.nodes = [nid]
        fit.groups = {nid: taken}
        fit.cpus = None
        fit.gpus, fit.mig = picked
        fit.mem_node = mem_node
        fit.mems = [mem_node]
        fit.rank = rank
        fit.spans = False
        return fit


class _Host:
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
            if distances.__class__ is list and ids.__class__ is list:
                # As assigning position by position: a repeated id keeps its last distance,
                # ids past the end of distances get 255.
                row = dict(zip(ids, distances))
                if len(distances) < len(ids):
                    row.update(dict.fromkeys(islice(ids, len(distances), None), 255))
            else:
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
        # node -> (size, count): the first count free groups of the node all have size CPUs
        # (see groups_for and _group_shape); _commit keeps it as it takes or pins groups.
        self.group_shape: dict = {}
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
            groups = _core_groups(usable, {} if nid in self.crossed else siblings)
            self.free_groups[nid] = groups
            self.free_cpus[nid] = len(usable)
            self.group_shape[nid] = _group_shape(groups)
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
            key=_ADDRESS,
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
            if _int_list(cpus) and not set(cpus) >= self.online:
                self.allowed_cpus = frozenset(cpus)
            if _int_list(mems) and not set(mems) >= set(node_ids):
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
                    if _int_list(named) and not set(named) >= set(every):
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
                f"{RESERVED_VAR}: {_count(len(missing), 'CPU', False)} {format_cpulist(missing)} "
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
            gpu = _Gpu(entry, cpu_node)
            if node is not None and node not in self.dist:
                gpu.node = None  # a node that does not exist: unknown, as numa_node -1
            self.gpus.append(gpu)
            self.gpu_by_id[gpu.address] = gpu
            if gpu.uuid:
                self.gpu_by_id[gpu.uuid] = gpu
        for declared in mig_gpus:
            self._declare_mig(declared)
        # Free whole GPUs (MIG-enabled ones only ever serve MIG instances), by CPU node.
        self.free_whole: dict = {nid: [] for nid in self.node_ids}
        self.free_unknown: list = []
        for gpu in self.gpus:
            if gpu.mig_mode == "enabled" or gpu.mig_leaving:
                continue
            if gpu.cpu_node is None:
                self.free_unknown.append(gpu)
            else:
                self.free_whole[gpu.cpu_node].append(gpu)

    # -- declared MIG layouts (numafleet_mig_gpus) ------------------------------------------

    def _declare_mig(self, declared) -> None:
        """Make a GPU's MIG mode and layout the declared ones; raises PlacementError."""
        where = declared.where
        gpu = self.gpu_by_id.get(declared.gpu)
        if gpu is None and GPU_SHORT_ADDRESS.match(declared.gpu):
            found = [g for g in self.gpus if g.address.endswith(":" + declared.gpu)]
            gpu = found[0] if len(found) == 1 else None
        if gpu is None:
            known = ", ".join(g.address for g in self.gpus) or "none"
            raise PlacementError(
                self.host,
                f"{where}.gpu: {declared.gpu} is not a GPU of this host (GPUs: {known}); write "
                "one of those addresses or its UUID",
            )
        if gpu.mig_declared is not None:
            raise PlacementError(
                self.host,
                f"{where}.gpu: {gpu.address} is also {gpu.mig_declared.where}; declare each GPU "
                "once",
            )
        if gpu.mig_mode_current is None:
            raise PlacementError(
                self.host,
                f"{where}.gpu: {gpu.address} ({gpu.vendor or 'unknown vendor'}) reports no MIG "
                "support (no MIG mode in its facts, or NVML was unavailable); remove this entry, "
                "or gather the facts where NVML or nvidia-smi works",
            )
        gpu.mig_declared = declared
        if declared.mode == "disabled":
            gpu.mig_mode, gpu.mig_profiles, gpu.mig_memory = "disabled", None, {}
            gpu.mig_existing, gpu.slots = [], []
            # Leaving MIG mode may need a GPU reset (Ampere) and happens during the run: this
            # plan gives the GPU to nobody; the plan made once MIG is off can.
            gpu.mig_leaving = gpu.mig_mode_current != "disabled"
            return
        gpu.mig_mode = "enabled"
        profiles = gpu.mig_supported
        if profiles is None:
            if declared.layout:
                raise PlacementError(
                    self.host,
                    f"{where}.layout: MIG is {gpu.mig_mode_current} on {gpu.address} and its "
                    "driver lists MIG profiles only in MIG mode, so the layout cannot be checked "
                    "yet; run once with mode: enabled and no layout (that enables MIG), then add "
                    "the layout",
                )
            gpu.mig_profiles, gpu.mig_memory, gpu.mig_existing, gpu.slots = {}, {}, [], []
            return
        if gpu.mig_profiles is None:  # MIG off now, but the driver lists the profiles
            gpu.mig_profiles, gpu.mig_memory = _profile_maps(profiles)
        if declared.layout is not None:
            self._declared_slots(gpu, declared, profiles)

    def _check_compute_profile(self, here: str, gpu: _Gpu, item) -> None:
        """Refuse a compute-instance profile that the GPU instance cannot hold."""
        if item.compute_profile is None:
            return
        slices = int(item.compute_profile.split("c.", 1)[0])
        gi_slices = int(item.profile.split("g.", 1)[0])
        # NVML's compute-instance profiles: 1, 2, 3, 4, 6, 7 or 8 slices, at most the GPU
        # instance's; a 4-slice GPU instance has no 3-slice one (nvidia-smi mig -lcip).
        offered = [n for n in _CI_SLICES if n <= gi_slices and not (n == 3 and gi_slices == 4)]
        if slices in offered:
            return
        raise PlacementError(
            self.host,
            f"{here}.compute_profile: {item.compute_profile} asks for {slices} slices, but a "
            f"{item.profile} GPU instance on {gpu.address} takes compute instances of "
            f"{', '.join(str(n) for n in offered)} slices; write one of "
            f"{', '.join(f'{n}c.{item.profile}' for n in offered if n < gi_slices)} or leave "
            "compute_profile out (one compute instance over the whole GPU instance)",
        )

    def _declared_slots(self, gpu: _Gpu, declared, profiles: list) -> None:
        """Slots of a declared layout: kept instances, then new ones at their start or the lowest fit."""
        where = declared.where
        counts = {p["name"]: p.get("max_count") for p in profiles if p.get("name")}
        existing = list(gpu.mig_existing)
        kept, todo = [], []
        for position, item in enumerate(declared.layout):
            here = f"{where}.layout[{position}]"
            legal = gpu.mig_profiles.get(item.profile)
            if legal is None:
                raise PlacementError(
                    self.host,
                    f"{here}.profile: {item.profile} is not offered by {gpu.address} (offered: "
                    f"{', '.join(sorted(gpu.mig_profiles)) or 'none'}); pick an offered profile",
                )
            if item.start is not None and item.start not in [start for start, dummy in legal]:
                raise PlacementError(
                    self.host,
                    f"{here}.start: {item.profile} cannot start at slice {item.start} on "
                    f"{gpu.address} (possible starts: "
                    f"{', '.join(str(start) for start, dummy in legal)}); pick one of them or "
                    "leave start out",
                )
            self._check_compute_profile(here, gpu, item)
            match = next(
                (
                    instance
                    for instance in existing
                    if instance[2] == item.profile and item.start in (None, instance[0])
                ),
                None,
            )
            if match is not None and item.compute_profile is None:
                existing.remove(match)
                kept.append(match + (None, True, None))
            else:
                todo.append((position, item))
        for count_name, limit in counts.items():
            wanted = sum(1 for item in declared.layout if item.profile == count_name)
            if limit is not None and wanted > limit:
                raise PlacementError(
                    self.host,
                    f"{where}.layout: {wanted} x {count_name} on {gpu.address}, which allows at "
                    f"most {limit}; lower the count",
                )
        slots = [(s, z, p, u, owner, True, compute) for s, z, p, u, owner, dummy, compute in kept]
        order = sorted(todo, key=lambda pair: (pair[1].start is None, pair[0]))
        for position, item in order:
            choices = gpu.mig_profiles[item.profile]
            if item.start is not None:
                choices = [pair for pair in choices if pair[0] == item.start]
            free = [
                (start, size)
                for start, size in choices
                if all(start + size <= s[0] or start >= s[0] + s[1] for s in slots)
            ]
            if not free:
                taken = ", ".join(f"{s[2]}@{s[0]}" for s in sorted(slots)) or "nothing"
                raise PlacementError(
                    self.host,
                    f"{where}.layout[{position}]: {item.profile}"
                    f"{'' if item.start is None else '@' + str(item.start)} does not fit on "
                    f"{gpu.address} next to {taken}; give the instances start: values that "
                    "fit (nvidia-smi mig -lgipp lists them) or drop one",
                )
            start, size = free[0]
            slots.append((start, size, item.profile, None, None, False, item.compute_profile))
        slots.sort(key=lambda slot: slot[0])
        gpu.mig_existing = [slot[:4] for slot in slots if slot[5]]
        gpu.slots = slots
        lacking = [f"{slot[2]}@{slot[0]}" for slot in slots if not slot[5]]
        if gpu.mig_pending and lacking:
            self.facts_warnings.append(
                f"{pending_text(gpu)}: {where}.layout lacks {', '.join(lacking)}, which "
                "no run creates until the mode applies; " + PENDING_FIX.format(address=gpu.address)
            )

    # -- messages --------------------------------------------------------------------------

    def fail(self, placement, message: str) -> PlanError:
        return PlanError(self.host, f"{placement.where} {message}")

    def free_text(self) -> str:
        parts = []
        for nid in self.node_ids:
            kind = self.node[nid].get("kind")
            if kind not in CPU_KINDS and kind not in MEMORY_KINDS:
                continue
            gpus, cpus = len(self.free_whole.get(nid, ())), self.free_cpus.get(nid, 0)
            text = f"node{nid} {_count(gpus, 'GPU')}, {_count(cpus, 'CPU')}"
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
            parts.append(f"{_count(len(self.free_unknown), 'GPU')} of unknown node")
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
        size, uniform = self.group_shape[nid]
        if 0 < count <= size * uniform:  # the groups it takes all have size CPUs
            return -(-count // size)
        total = 0
        for taken, group in enumerate(self.free_groups[nid], 1):
            total += len(group)
            if total >= count:
                return taken
        return -1


def _group_shape(groups: list) -> tuple:
    """(size, count): the first count groups all have size CPUs (SMT threads per core)."""
    if not groups:
        return 0, 0
    lengths = list(map(len, groups))
    size = lengths[0]
    others = set(lengths)
    others.discard(size)
    return size, min(map(lengths.index, others)) if others else len(lengths)


def _core_groups(usable: list, siblings: dict) -> list:
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


def _choose_gpus(pool: list, count: int) -> Optional[list]:
    """count GPUs of pool (sorted by address): one switch, else NVLink-connected, else lowest."""
    if len(pool) < count:
        return None
    if count == 0:
        return []
    switches: dict = {}
    for gpu in pool:
        switches.setdefault(gpu.switch or gpu.address, []).append(gpu)
    fitting = [group for group in switches.values() if len(group) >= count]
    if fitting:
        best = min(fitting, key=lambda group: (len(group), group[0].address))
        return best[:count]
    if count > 1:
        for position, seed in enumerate(pool):
            chosen = [seed]
            for gpu in pool[position + 1 :]:
                if all(gpu.address in other.peers for other in chosen):
                    chosen.append(gpu)
                    if len(chosen) == count:
                        return chosen
    return pool[:count]


class _Planner:
    def __init__(self, state: _Host, placements: list, slices: dict) -> None:
        self.state = state
        self.placements = placements
        self.slices = slices  # tenant name -> its slice unit, escaped once per plan
        self.out: list = []
        # placement index -> (PCI device of near:, whether node: was written too)
        self.anchors: dict = {}
        # placement name -> "kept", "new", or why it was planned again (stable plans)
        self.keep: dict = {}
        self.requests: dict = {}  # placement index -> placement_request(p)

    # -- request checks against the facts --------------------------------------------------

    def _gpu_of(self, p, ident: str) -> _Gpu:
        """The GPU a gpus: entry names (PCI address, BB:DD.F short address or UUID)."""
        state = self.state
        gpu = state.gpu_by_id.get(ident)
        if gpu is not None:
            return gpu
        if GPU_SHORT_ADDRESS.match(ident):
            matches = [g for g in state.gpus if g.address.partition(":")[2] == ident]
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus: {ident} is ambiguous: it matches GPUs "
                    f"{', '.join(g.address for g in matches)} (several PCI domains); write the "
                    f"full address with its domain, e.g. {matches[0].address}",
                )
        known = ", ".join(g.address for g in state.gpus) or "none"
        raise PlacementError(
            state.host,
            f"{p.where}.gpus: {ident} is not a GPU of this host (known: {known}); "
            "list PCI addresses or UUIDs from ansible_facts.gpu_topology",
        )

    def _listed_gpus(self, p) -> list:
        state = self.state
        gpus = []
        for ident in p.gpu_ids or ():
            gpu = self._gpu_of(p, ident)
            if gpu in gpus:
                first = p.gpu_ids[gpus.index(gpu)]
                how = (
                    "by address and UUID"
                    if gpu.uuid in (first, ident)
                    else f"as {first} and {ident}"
                )
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus lists {gpu.address} twice ({how}); list it once",
                )
            gpus.append(gpu)
        for gpu in gpus:
            if gpu.mig_leaving:
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus: {gpu.address} leaves MIG mode in this run "
                    f"({gpu.mig_declared.where}.mode: disabled), which may need a GPU reset; "
                    "list it once MIG is off (run site.yml again after the change), or list "
                    "another GPU",
                )
            if p.mig_profile is None and gpu.mig_mode == "enabled":
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus: {gpu.address} has MIG enabled and only serves MIG "
                    "instances; set mig_profile or list another GPU",
                )
            if p.mig_profile is None and gpu.use is not None:
                if gpu.use == "mps" and p.mps is not None:
                    continue
                raise self.state.fail(
                    p,
                    f"lists GPU {gpu.address}, already given to {', '.join(gpu.placements)}; "
                    "list another GPU or use gpus: <count>",
                )
            if p.mps is not None and not gpu.uuid:
                raise PlacementError(
                    state.host,
                    f"{p.where}.mps: GPU {gpu.address} has no UUID (not an NVIDIA GPU?); MPS "
                    "needs an NVIDIA GPU: remove mps",
                )
        return gpus

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

    def _near_device(self, p) -> dict:
        """The PCI device of the facts that p's near: names (full or BB:DD.F address)."""
        state = self.state
        matches = [d for d in state.pci if d["address"] == p.near]
        if not matches and GPU_SHORT_ADDRESS.match(p.near):
            matches = [d for d in state.pci if d["address"].partition(":")[2] == p.near]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise PlacementError(
                state.host,
                f"{p.where}.near: {p.near} is ambiguous: it matches PCI devices "
                f"{', '.join(d['address'] for d in matches)} (several PCI domains); write the "
                f"full address with its domain, e.g. {matches[0]['address']}",
            )
        if not state.pci:
            raise PlacementError(
                state.host,
                f"{p.where}.near: {p.near} is not a PCI device of this host, which lists no "
                "GPU, NIC, NVMe drive or CXL memory device (ansible_facts.numa.pci_devices is "
                "empty); pin node: instead",
            )
        # GPUs last: near: is mostly for NICs and drives, GPUs are usually chosen with gpus:.
        devices = sorted(state.pci, key=lambda d: (d.get("kind") == "gpu", d["address"]))
        known = ", ".join(_device_hint(d) for d in devices[:_KNOWN_DEVICES_SHOWN])
        if len(devices) > _KNOWN_DEVICES_SHOWN:
            known += f" and {len(devices) - _KNOWN_DEVICES_SHOWN} more"
        raise PlacementError(
            state.host,
            f"{p.where}.near: {p.near} is not a GPU, NIC, NVMe drive or CXL memory device of "
            f"this host (known: {known}); write an address of ansible_facts.numa.pci_devices",
        )

    def _anchor(self, p):
        """p with node: set to the node of its near: device; raises PlacementError."""
        state = self.state
        device = self._near_device(p)
        label = _device_label(device)
        nid = device.get("node")
        gpu = state.gpu_by_id.get(device["address"])
        if nid is None and gpu is not None and gpu.node is not None:
            # The PCI facts say unknown; the GPU facts know it (NVML's CPU affinity).
            nid = gpu.node
            device = dict(device, node=nid, node_source="gpu_topology")
        if nid is None:
            raise PlacementError(
                state.host,
                f"{p.where}.near: {label} has unknown NUMA locality (numa_node -1 and its local "
                "CPUs lie in no single node), so it gives no node to anchor on; drop near: and "
                "pin node: N instead if you know the node it is attached to (nodes with CPUs: "
                f"{', '.join(str(n) for n in state.cpu_nodes)})",
            )
        if nid not in state.usable:
            kind = state.kind_text(nid) if nid in state.node else "kind not in the NUMA facts"
            nearest = sorted(
                state.cpu_nodes,
                key=lambda other: (state.dist.get(nid, {}).get(other, 255), other),
            )
            fix = (
                f"write node: {nearest[0]} (the nearest node with CPUs) instead of near:"
                if nearest and nid in state.dist
                else "pin node: to one of "
                f"{', '.join(str(n) for n in state.cpu_nodes)} instead of near:"
            )
            raise PlacementError(
                state.host,
                f"{p.where}.near: {label} is on node {nid}, which has no CPUs a placement can "
                f"use ({kind}); {fix}",
            )
        if p.node is not None and p.node != nid:
            raise PlacementError(
                state.host,
                f"{p.where}: node: {p.node} and near: {device['address']} disagree: {label} is "
                f"on node {nid}; drop node: (near: pins the placement to the device's node) or "
                f"drop near: to keep node {p.node}",
            )
        self.anchors[p.index] = (device, p.node is not None)
        return p if p.node is not None else replace(p, node=nid)

    def _check_mig(self, p, listed: list) -> None:
        state = self.state
        capable = [gpu for gpu in state.gpus if gpu.mig_capable]
        pending = [gpu for gpu in listed or state.gpus if gpu.mig_pending]
        if not capable and pending:
            raise pending_refusal(state.host, p.where, p.mig_profile, pending)
        if not capable:
            raise PlacementError(
                state.host,
                f"{p.where}.mig_profile: no GPU of this host has MIG enabled; enable MIG "
                "(nvidia-smi -mig 1) on a GPU or remove mig_profile",
            )
        candidates = listed or capable
        if listed and not listed[0].mig_capable and listed[0].mig_pending:
            raise pending_refusal(state.host, p.where, p.mig_profile, listed[:1])
        if listed and not listed[0].mig_capable:
            raise PlacementError(
                state.host,
                f"{p.where}.gpus: {listed[0].address} does not have MIG enabled; list one of "
                f"{', '.join(g.address for g in capable)} or enable MIG on it",
            )
        if not any(p.mig_profile in gpu.mig_profiles for gpu in candidates):
            offered = sorted({name for gpu in candidates for name in gpu.mig_profiles})
            raise PlacementError(
                state.host,
                f"{p.where}.mig_profile: {p.mig_profile!r} is not offered by "
                f"{'GPU ' + listed[0].address if listed else 'the MIG-enabled GPUs'} "
                f"(offered: {', '.join(offered)}); pick one of those",
            )
        self._check_mig_mps(p, candidates)

    def _check_mps_room(self, p, gpu: _Gpu) -> None:
        """Refuse an MPS client whose pinned_memory_limit does not fit the listed GPU's memory."""
        pinned = p.mps.pinned_memory_limit_kb
        if gpu.mps_room(pinned):
            return
        total = gpu.memory_mib * 1024
        left = max(total - gpu.mps_pinned_kb, 0)
        if gpu.mps_pinned_kb:
            already = (
                f"its MPS clients {', '.join(gpu.mps_clients)} already pinned "
                f"{format_kb(gpu.mps_pinned_kb)}, {format_kb(left)} is left"
            )
        else:
            already = "no other MPS client pinned any of it"
        lower = (
            f"lower pinned_memory_limit to at most {_size_text(left // 1024 * 1024)}, "
            if left >= 1024
            else ""
        )
        raise PlacementError(
            self.state.host,
            f"{p.where}.mps.pinned_memory_limit: {format_kb(pinned)} does not fit GPU "
            f"{gpu.address}: it has {format_kb(total)} of memory and {already}; {lower}list "
            "another GPU, or use gpus: 1 to let the planner pick a GPU with room",
        )

    def _check_mig_mps(self, p, listed: list) -> None:
        """Refuse an MPS pinned_memory_limit above the memory of one instance of the profile."""
        pinned = p.mps.pinned_memory_limit_kb if p.mps is not None else None
        if not pinned:
            return
        sizes = [
            g.mig_memory[p.mig_profile]
            for g in listed or self.state.gpus
            if g.mig_capable and p.mig_profile in g.mig_memory
        ]
        if not sizes or pinned <= max(sizes) * 1024:
            return
        memory = max(sizes) * 1024
        raise PlacementError(
            self.state.host,
            f"{p.where}.mps.pinned_memory_limit: {format_kb(pinned)} is more than the "
            f"{format_kb(memory)} of memory of one {p.mig_profile} MIG instance; lower "
            f"pinned_memory_limit to at most {_size_text(memory)}, or pick a larger mig_profile",
        )

    def _check_mig_nodes(self, p, pinned_nodes: Optional[list]) -> bool:
        """Whether no MIG GPU offering the profile is on the node(s) p asks for.

        Refuses that (unless allow_span) like node:/cpus away from a listed GPU; True means
        the instance is to come from a MIG GPU of another node.
        """
        state = self.state
        wanted = set(pinned_nodes) if pinned_nodes is not None else {p.node}
        offering = [g for g in state.gpus if g.mig_capable and p.mig_profile in g.mig_profiles]
        if any(g.cpu_node is None or g.cpu_node in wanted for g in offering):
            return False
        if p.allow_span:
            return True
        gpu_nodes = sorted({g.cpu_node for g in offering})
        where = ", ".join(f"{g.address} on node {g.node}" for g in offering)
        theirs = f"the MIG GPU(s) offering {p.mig_profile} ({where})"
        nodes_text = " or ".join(str(n) for n in gpu_nodes)
        if pinned_nodes is None:
            key, pin, drop = self._pin(p)
            raise PlacementError(
                state.host,
                f"{p.where}.{key}: {pin} is not the node of {theirs}; {drop} (the CPUs follow "
                f"the GPUs), enable MIG on a GPU of node {p.node}, or set allow_span: true to "
                f"run the CPUs on node {p.node} anyway",
            )
        raise PlacementError(
            state.host,
            f"{p.where}.cpus: CPUs {format_cpulist(p.cpu_list)} are on node "
            f"{', '.join(str(n) for n in pinned_nodes)}, but {theirs} are on node "
            f"{nodes_text}; pin CPUs of node {nodes_text}, use a count of cpus, or set "
            "allow_span: true to keep the CPUs away from the GPU",
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
                f"{p.where}.cpus: {_count(len(outside), 'CPU', False)} {format_cpulist(outside)} "
                f"{'is' if len(outside) == 1 else 'are'} outside the CPUs services may use "
                f"({format_cpulist(state.allowed_out['cpus'])}, the allowed cpuset from "
                f"{state.allowed_source_text('cpus')}): the kernel would narrow or refuse the binding; "
                "pin CPUs inside it or widen that cpuset",
            )

    def _check_gpu_nodes(self, p, listed: list, pinned_nodes: Optional[list]) -> None:
        """Refuse node: or pinned cpus on another node than a listed GPU (unless allow_span)."""
        state = self.state
        known = [g for g in listed if g.node is not None and g.cpu_node is not None]
        if not known:
            return
        gpu_nodes = {g.cpu_node for g in known}
        if len(gpu_nodes) > 1:
            raise PlacementError(
                state.host,
                f"{p.where}.gpus: the listed GPUs sit on nodes "
                f"{', '.join(str(n) for n in sorted(gpu_nodes))}; list GPUs of one node or set "
                "allow_span: true",
            )
        if p.node is not None and p.node not in gpu_nodes:
            gpu = known[0]
            near = "" if gpu.cpu_node == gpu.node else f" (its nearest CPUs: node {gpu.cpu_node})"
            key, pin, drop = self._pin(p)
            raise PlacementError(
                state.host,
                f"{p.where}.{key}: {pin} is not the node of GPU {gpu.address}, which is "
                f"on node {gpu.node}{near}; {drop} (the CPUs follow the GPUs), list GPUs of "
                f"node {p.node}, or set allow_span: true to run the CPUs on node {p.node} anyway",
            )
        if pinned_nodes is not None:
            away = [n for n in pinned_nodes if n not in gpu_nodes]
            if away:
                gpu = known[0]
                away_cpus = [c for c in p.cpu_list if state.cpu_node[c] in away]
                raise PlacementError(
                    state.host,
                    f"{p.where}.cpus: CPUs {format_cpulist(away_cpus)} are on node "
                    f"{', '.join(str(n) for n in away)}, but GPU {gpu.address} is on node "
                    f"{gpu.node}; pin CPUs of node {gpu.cpu_node}, list GPUs of node "
                    f"{away[0]}, or set allow_span: true to keep the CPUs away from the GPU",
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

    def _gpu_pick(self, p, nid: int, listed: list, fallback: bool, far: bool = False):
        """GPUs (and MIG slot) for placement p with CPUs on node nid; None if none fit.

        far: MIG GPUs of any node, nearest to nid first (allow_span with node: or pinned cpus).
        """
        state = self.state
        if p.mig_profile is not None:
            pool = listed or [
                g
                for g in state.gpus
                if g.mig_capable
                and (far or g.cpu_node == nid or (fallback and g.cpu_node is None))
                and p.mig_profile in g.mig_profiles
            ]
            if far and not listed:
                row = state.dist[nid]
                pool.sort(key=lambda g: (g.cpu_node is None, row.get(g.cpu_node, 255), g.address))
            for gpu in pool:
                pick = gpu.mig_pick(p.mig_profile)
                if pick is not None:
                    return [gpu], pick
            return None
        if listed:
            if p.mps is not None and not listed[0].mps_room(p.mps.pinned_memory_limit_kb or 0):
                return None
            return listed, None
        if p.gpu_count == 0:
            return [], None
        if p.mps is not None:
            pinned = p.mps.pinned_memory_limit_kb or 0
            shared = [
                g
                for g in state.gpus
                if g.use == "mps"
                and (g.cpu_node == nid or (fallback and g.cpu_node is None))
                and g.mps_room(pinned)
            ]
            if shared:
                return shared[:1], None
            pool = [g for g in state.free_whole.get(nid, ()) if g.uuid and g.mps_room(pinned)]
            if not pool and fallback:
                pool = [g for g in state.free_unknown if g.uuid and g.mps_room(pinned)]
            return (pool[:1], None) if pool else None
        known = state.free_whole.get(nid, [])
        if not fallback:
            chosen = _choose_gpus(known, p.gpu_count)
            return None if chosen is None else (chosen, None)
        if len(known) + len(state.free_unknown) < p.gpu_count:
            return None
        chosen = _choose_gpus(known, min(len(known), p.gpu_count)) or []
        return chosen + state.free_unknown[: p.gpu_count - len(chosen)], None

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
        if p.gpu_count or p.mig_profile is not None or listed:
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
                1 for g in gpus if g.use is None and g.cpu_node == nid and not g.mig_capable
            )
            # PCIe switches the GPUs span first (locality), then fragmentation, then cores.
            switches = len({g.switch or g.address for g in gpus}) if len(gpus) > 1 else 1
            return ((switches, whole_left, cores_left, nid), nid, taken, picked, mem)
        return ((0, free_whole, cores_left, nid), nid, taken, picked, mem)

    def _single(
        self, p, nodes: list, listed: list, fallback: bool, far: bool = False
    ) -> Optional[_Fit]:
        if (
            p.cpu_list is None
            and p.hugepages is None
            and not (p.gpu_count or p.mig_profile is not None or listed)
        ):
            return self._single_cpu(p, nodes)
        best = None
        for nid in nodes:
            found = self._fit_node(p, nid, listed, fallback, far)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return None
        return _Fit.on_node(*best)

    def _single_cpu(self, p, nodes: list) -> Optional[_Fit]:
        """_single for a placement of a CPU count, no GPUs and no hugepages (most of them).

        The same fit as _fit_node on each node (rank (0, free whole GPUs, cores left, node),
        the memory node mem_for gives), without its per-node calls.
        """
        state = self.state
        count, need_kb = p.cpu_count, p.memory_kb
        free_cpus, group_shape, free_groups = state.free_cpus, state.group_shape, state.free_groups
        near_mem, used_kb, budget = state.near_mem, state.used_kb, state.budget
        free_whole = state.free_whole
        best = None
        for nid in nodes:
            if free_cpus.get(nid, 0) < count:
                continue
            size, uniform = group_shape[nid]
            taken = (
                -(-count // size) if 0 < count <= size * uniform else state.groups_for(nid, count)
            )
            if taken < 0:
                continue
            for mem in near_mem[nid]:
                if used_kb[mem] + need_kb <= budget[mem]:
                    break
            else:
                continue
            rank = (0, len(free_whole.get(nid, ())), len(free_groups[nid]) - taken, nid)
            if best is None or rank < best[0]:
                best = (rank, nid, taken, mem)
        if best is None:
            return None
        rank, nid, taken, mem = best
        return _Fit.on_node(rank, nid, taken, ([], None), mem)

    def _span(self, p, nodes: list, listed: list) -> Optional[_Fit]:
        """CPUs (and GPUs) from the best node plus its nearest nodes, or None."""
        state = self.state
        whole = p.mig_profile is None and p.mps is None and not listed
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
                if device is None and (p.mig_profile is not None or p.mps is not None or listed):
                    continue
            order = sorted(state.cpu_nodes, key=lambda other, b=best: (state.dist[b][other], other))
            fit = _Fit()
            cpus_left, gpus_left = p.cpu_count, need_gpus
            for nid in order:
                if cpus_left <= 0 and gpus_left <= 0:
                    break
                take_gpus = []
                if gpus_left > 0:
                    pool = state.free_whole.get(nid, [])
                    take_gpus = _choose_gpus(pool, min(len(pool), gpus_left)) or []
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
                return None
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

    def _free_mig_profiles(self, listed: list) -> list:
        """Names of the MIG profiles that still have a free slot on the (listed) MIG GPUs."""
        gpus = [g for g in listed or self.state.gpus if g.mig_capable]
        return sorted({name for g in gpus for name in g.mig_profiles if g.mig_pick(name)})

    def _infeasible(self, p, nodes: list, listed: list, spanned: bool) -> PlanError:
        state = self.state
        if spanned:  # nodes were tried together: what is short is short on the whole host
            on = f" from NUMA {self._pin(p)[1]}" if p.node is not None else ""
            gpu_free = sum(len(state.free_whole.get(n, ())) for n in state.cpu_nodes)
            cpu_free = sum(state.free_cpus.get(n, 0) for n in state.cpu_nodes)
        else:
            on = f" on NUMA {self._pin(p)[1]}" if p.node is not None else " on one NUMA node"
            gpu_free = max((len(state.free_whole.get(n, ())) for n in nodes), default=0)
            cpu_free = max((state.free_cpus.get(n, 0) for n in nodes), default=0)
        hp_kb = p.hugepages.size_kb * p.hugepages.count if p.hugepages else 0
        if p.mig_profile is not None:
            need = f"needs a free {p.mig_profile} MIG slot and {_count(p.cpu_count, 'CPU')}{on}"
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
                        slot[4]
                        for g in listed or state.gpus
                        if g.mig_capable
                        for slot in g.slots
                        if slot[2] == p.mig_profile and slot[4] is not None
                    }
                )
                if owners:
                    fix = (
                        f"Sharing one MIG instance between placements is not supported (each MIG "
                        f"placement gets its own instance; the {p.mig_profile} instances are "
                        f"taken by {', '.join(owners)}): to share one, make it a single "
                        f"placement. {fix}"
                    )
        elif listed:
            need = (
                f"needs {_count(p.cpu_count, 'CPU')} and {format_kb(p.memory_kb + hp_kb)} memory next to "
                f"GPU(s) {', '.join(g.address for g in listed)}"
            )
            fix = "Lower cpus or memory, set allow_span: true, or remove another placement."
        elif p.gpu_count and p.mps is None and gpu_free < p.gpu_count:
            need = f"needs {_count(p.gpu_count, 'GPU')}{on}"
            if spanned:
                need = f"needs {_count(p.gpu_count, 'GPU')} and {_count(p.cpu_count, 'CPU')}{on}"
            fix = "Lower gpus, set allow_span: true, or remove another placement."
        elif p.mps is not None:
            need = f"needs a GPU for MPS and {_count(p.cpu_count, 'CPU')}{on}"
            fix = "Lower cpus or pinned_memory_limit, or remove another placement."
        elif cpu_free < p.cpu_count:
            need = f"needs {_count(p.cpu_count, 'CPU')}{on}"
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
            need = (
                f"needs {_count(p.gpu_count, 'GPU')} and {_count(p.cpu_count, 'CPU')} together{on}"
            )
            fix = "Lower gpus or cpus, set allow_span: true, or remove another placement."
        if spanned:
            need += ", even spanning nodes"
        if p.allow_span:
            fix = fix.replace(" set allow_span: true,", "")
        return state.fail(
            p, f"{need}; free per node: {state.free_text()}. {fix}{state.allowed_hint()}"
        )

    # -- commit ----------------------------------------------------------------------------

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
        needs_gpu = bool(p.gpu_count or p.mig_profile)
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

    def _commit(self, p, fit: _Fit, warnings: list) -> dict:
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
                    state.group_shape[nid] = _group_shape(groups)
        else:
            cpus = []
            shared = state.shared
            for nid in fit.nodes:
                taken = fit.groups.get(nid, 0)
                if taken:
                    free_groups = state.free_groups[nid]
                    groups = free_groups[:taken]
                    del free_groups[:taken]
                    size, uniform = state.group_shape[nid]
                    state.group_shape[nid] = (
                        (size, uniform - taken) if taken <= uniform else _group_shape(free_groups)
                    )
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
        if fit.gpus:
            gpus_out, visible, mps_out, waits = self._gpu_part(p, fit, environment, warnings)
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
        return limits.add_to_entry(entry, p.limits, p.memory_kb)

    def _near_out(self, p) -> Optional[dict]:
        """The plan's near entry of p: the PCI device it is anchored on, or None."""
        anchor = self.anchors.get(p.index)
        if anchor is None:
            return None
        device = anchor[0]
        return {"address": device["address"], "kind": device.get("kind"), "node": device["node"]}

    def _gpu_part(self, p, fit: _Fit, environment: dict, warnings: list) -> tuple:
        """GPU entries, CUDA_VISIBLE_DEVICES and MPS settings of a placement that has GPUs."""
        gpus_out, devices, mps_out = self._commit_gpus(p, fit)
        visible = ",".join(devices) if all(devices) else ""
        if any(g.vendor == "nvidia" or (g.uuid or "").startswith("GPU-") for g in fit.gpus):
            environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        waits = None
        if visible:
            environment["CUDA_VISIBLE_DEVICES"] = visible
        elif fit.mig is not None and not fit.mig[3]:
            # The instance does not exist yet: no GPU at all rather than every GPU the process
            # would otherwise see. The unit is written but not enabled or started (waits_for);
            # the plan made after the instance is created names it.
            environment["CUDA_VISIBLE_DEVICES"] = ""
            waits = waits_for_instance(fit.gpus[0], p.mig_profile, fit.mig[0])
        if mps_out is not None:
            environment["CUDA_MPS_PIPE_DIRECTORY"] = mps_out["pipe_dir"]
            if mps_out["active_thread_percentage"] is not None:
                environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(
                    mps_out["active_thread_percentage"]
                )
            if mps_out["pinned_memory_limit_kb"] is not None:
                environment["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = (
                    f"0={max(mps_out['pinned_memory_limit_kb'] // 1024, 1)}M"
                )
        unknown = [g.address for g in fit.gpus if g.node is None]
        for address in unknown:
            warnings.append(
                f"GPU {address} has unknown NUMA locality (numa_node -1, or a node that does "
                "not exist); CPUs and memory were "
                f"placed on node {fit.nodes[0]} by CPU/memory fit. Set node: if you know the "
                "GPU's node"
            )
        missing_uuid = [g.address for g in fit.gpus if not g.uuid]
        if missing_uuid:
            warnings.append(
                f"GPU {', '.join(missing_uuid)} has no UUID (not NVIDIA, or NVML unavailable): "
                "CUDA_VISIBLE_DEVICES is not set; select the device in the program"
            )
        elif waits is not None:
            warnings.append(
                f"MIG instance {waits['mig_instance']} does not exist yet ({waits['reason']}): "
                "its unit is written with CUDA_VISIBLE_DEVICES empty (no GPU) but not enabled "
                "or started until the instance exists and the plan is made again"
            )
        if fit.mig is not None and fit.gpus[0].mig_pending:
            warnings.append(
                f"{pending_text(fit.gpus[0])}: its MIG instance {p.mig_profile}@{fit.mig[0]} is "
                "kept (no move, no removal) and no new instance is planned on this GPU until the "
                f"mode applies; {PENDING_FIX.format(address=fit.gpus[0].address)}"
            )
        for gpu in fit.gpus:
            if gpu.cpu_node is not None and gpu.cpu_node not in fit.nodes:
                warnings.append(
                    f"GPU {gpu.address} is on node {gpu.node}, not next to the placement's CPUs "
                    f"(node {', '.join(str(n) for n in fit.nodes)}): its traffic crosses nodes"
                )
        return gpus_out, visible, mps_out, waits

    def _commit_gpus(self, p, fit: _Fit) -> tuple:
        gpus_out, devices = [], []
        mps_out = None
        for gpu in fit.gpus:
            gpu.placements.append(p.name)
            mig = None
            device = gpu.uuid
            if fit.mig is not None:
                start, size, uuid, existing = fit.mig
                if existing:
                    gpu.claimed.add(start)
                    gpu.slots = [
                        s if s[0] != start or not s[5] else s[:4] + (p.name,) + s[5:]
                        for s in gpu.slots
                    ]
                elif any(s[0] == start and not s[5] for s in gpu.slots):  # a declared instance
                    gpu.slots = [
                        s if s[0] != start or s[5] else s[:4] + (p.name,) + s[5:] for s in gpu.slots
                    ]
                else:
                    gpu.slots.append((start, size, p.mig_profile, None, p.name, False, None))
                    gpu.slots.sort(key=lambda s: s[0])
                mig = {
                    "profile": p.mig_profile,
                    "placement_start": start,
                    "placement_size": size,
                    "device_uuid": uuid,
                    "existing": existing,
                }
                device = uuid
            elif p.mps is not None:
                if gpu.use is None:
                    self._take_whole(gpu)
                    gpu.use = "mps"
            else:
                self._take_whole(gpu)
                gpu.use = "whole"
            if p.mps is not None:
                pinned = p.mps.pinned_memory_limit_kb
                gpu.mps_clients.append(p.name)
                gpu.mps_pinned_kb += pinned or 0
                if p.mps.active_thread_percentage is not None:
                    gpu.mps_pct.append(p.mps.active_thread_percentage)
                key = device or f"{gpu.uuid or gpu.address}-mig{fit.mig[0] if fit.mig else ''}"
                mps_out = {
                    "pipe_dir": f"{MPS_PIPE_ROOT}/{key}",
                    "log_dir": f"{MPS_LOG_ROOT}/{key}",
                    "active_thread_percentage": p.mps.active_thread_percentage,
                    "pinned_memory_limit_kb": pinned,
                }
            gpus_out.append(
                {
                    "address": gpu.address,
                    "uuid": gpu.uuid,
                    "node": gpu.node,
                    "mig": mig,
                    "shared_mps": p.mps is not None,
                }
            )
            devices.append(device)
        if not p.gpu_ids:
            order = sorted(range(len(gpus_out)), key=lambda i: gpus_out[i]["address"])
            gpus_out = [gpus_out[i] for i in order]
            devices = [devices[i] for i in order]
        return gpus_out, devices, mps_out

    @staticmethod
    def _shared_core(group: tuple, owners: tuple, warnings: list) -> None:
        """Warn that a count placement got CPUs whose SMT siblings another placement pinned."""
        names = sorted({name for dummy, name in owners})
        siblings = format_cpulist([cpu for cpu, dummy in owners])
        warnings.append(
            f"{_count(len(group), 'CPU', False)} {format_cpulist(group)} "
            f"{'shares' if len(group) == 1 else 'share'} a core with "
            f"{_count(len(owners), 'CPU', False)} {siblings} of "
            f"{', '.join(names)} (SMT siblings): no whole free core was left for it; pin CPUs "
            "with cpus: to choose others"
        )

    def _take_whole(self, gpu: _Gpu) -> None:
        state = self.state
        pool = state.free_unknown if gpu.cpu_node is None else state.free_whole[gpu.cpu_node]
        if gpu in pool:
            pool.remove(gpu)

    # -- the plan --------------------------------------------------------------------------

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
            changed = _request_change(old.get("request"), self.requests[p.index])
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

    # -- kept placements -------------------------------------------------------------------

    def _keep(self, p, old: dict) -> Optional[str]:
        """Commit p on the resources of its recorded entry old; the reason it cannot, or None."""
        state = self.state
        if p.near is not None:
            p = self._anchor(p)
        listed = self._listed_gpus(p) if p.gpu_ids else []
        nodes = list(old["nodes"])
        if p.node is not None and nodes[0] != p.node:
            return f"its recorded node {nodes[0]} is not node {p.node}"
        lost = [nid for nid in nodes if nid in state.untrusted]
        if lost:
            raise PlanError(
                state.host,
                f"{p.where} runs on node {lost[0]} (the plan applied last), whose facts cannot "
                f"be trusted now: numa_facts could not use {state.untrusted[lost[0]]}; "
                "planning it elsewhere would move a running service, so fix the host's sysfs "
                "(or the /sys the facts read) and gather facts again, or set "
                "numafleet_repack: true to place every placement anew",
            )
        cpus = old["cpus"]
        for cpu in cpus:
            node = state.cpu_node.get(cpu)
            if node is None:
                return f"its CPU {cpu} no longer exists"
            if cpu in state.offline or cpu not in state.online:
                return f"its CPU {cpu} is offline"
            if cpu in state.reserved:
                return f"its CPU {cpu} is now in {RESERVED_VAR}"
            if cpu in state.isolated and p.cpu_list is None:
                return f"its CPU {cpu} is now isolated"
            if state.allowed_cpus is not None and cpu not in state.allowed_cpus:
                return (
                    f"its CPU {cpu} is now outside the allowed cpuset "
                    f"({format_cpulist(state.allowed_out['cpus'])}, from "
                    f"{state.allowed_source_text('cpus')})"
                )
            if cpu in state.taken_cpus:
                return f"its CPU {cpu} is pinned by another placement"
            if node not in nodes:
                return f"its CPU {cpu} is now on node {node}, not on node {nodes[0]}"
        warnings: list = []
        if p.cpu_list is not None:
            self._explicit_cpus(p, warnings)
        elif len(cpus) < p.cpu_count:
            return f"it recorded {len(cpus)} CPUs for cpus: {p.cpu_count}"
        mem_node = old.get("memory_node")
        if mem_node is None:
            hugepages = old.get("hugepages")
            mem_node = hugepages["node"] if hugepages else old["mems"][0]
        if state.allowed_mems is not None:
            for mem in sorted(set(old["mems"]) | {mem_node}):
                if mem not in state.allowed_mems:
                    return f"its memory node {mem} is now outside {state.allowed_mems_text()}"
        gpu_mems = [m for m in old["mems"] if m in state.gpu_memory]
        if gpu_mems:
            return (
                f"its memory node {gpu_mems[0]} is the memory of GPU "
                f"{state.gpu_memory[gpu_mems[0]]}, which placements never use"
            )
        if mem_node not in state.budget:
            return f"its memory node {mem_node} has no memory now"
        hp_kb = 0
        if p.hugepages is not None:
            if p.hugepages.size_kb not in state.hp_sizes[mem_node]:
                return f"node {mem_node} no longer offers {format_kb(p.hugepages.size_kb)} pages"
            hp_kb = p.hugepages.size_kb * p.hugepages.count
        if state.used_kb[mem_node] + p.memory_kb + hp_kb > state.budget[mem_node]:
            return f"its memory no longer fits the budget of node {mem_node}"
        fit = _Fit()
        fit.nodes = nodes
        fit.cpus = tuple(cpus)
        fit.mem_node = mem_node
        fit.mems = list(old["mems"])
        fit.spans = bool(old.get("spans"))
        for entry in old["gpus"]:
            gpu = state.gpu_by_id.get(entry["address"])
            if gpu is None:
                return f"its GPU {entry['address']} is gone"
            if listed and gpu not in listed:
                return f"its GPU {entry['address']} is not listed in gpus"
            mig = entry.get("mig")
            if mig is not None:
                if not gpu.mig_capable or p.mig_profile is None:
                    return f"GPU {gpu.address} no longer serves MIG instances"
                pick = gpu.mig_pick(p.mig_profile, mig["placement_start"])
                if pick is None and gpu.mig_pending and mig.get("existing") is False:
                    # It waited for its instance already: it keeps waiting on its slot (no
                    # move, no removal); the MIG layer creates it only once the mode applies.
                    pick = gpu.mig_pick(p.mig_profile, mig["placement_start"], pending_ok=True)
                if pick is None:
                    return (
                        f"its MIG slot {p.mig_profile}@{mig['placement_start']} of GPU "
                        f"{gpu.address} is no longer free"
                    )
                fit.mig = pick
            elif gpu.mig_capable or gpu.mig_leaving or gpu.mig_mode == "enabled":
                return f"GPU {gpu.address} is now in MIG mode"
            elif entry.get("shared_mps"):
                if gpu.use not in (None, "mps"):
                    return f"GPU {gpu.address} is now given whole to another placement"
                if p.mps is None or not gpu.mps_room(p.mps.pinned_memory_limit_kb or 0):
                    return f"GPU {gpu.address} has no room left for its MPS share"
            elif gpu.use is not None:
                return f"GPU {gpu.address} is now used by {', '.join(gpu.placements)}"
            fit.gpus.append(gpu)
        if fit.spans:
            warnings.append(
                f"spans NUMA nodes {', '.join(str(n) for n in nodes)} (kept from the recorded plan)"
            )
        halves = state.half_core_text(cpus) if p.cpu_list is None else None
        if halves is not None:  # kept: a running service is not moved for it
            warnings.append(f"{halves} (kept from the recorded plan)")
        self.out.append(self._commit(p, fit, warnings))
        return None


def _gpus_out(state: _Host, order: dict) -> tuple:
    """(plan gpus, whole-GPU MPS daemons); order: placement name -> declaration index."""
    gpus, daemons = [], []
    for gpu in state.gpus:
        # Declaration order, whatever order kept and new placements were committed in.
        gpu.placements.sort(key=order.__getitem__)
        gpu.mps_clients.sort(key=order.__getitem__)
        mig = None
        declared = gpu.mig_declared is not None
        if gpu.mig_mode == "enabled":
            mig = {
                "mode": gpu.mig_mode,
                "mode_current": gpu.mig_mode_current,
                "declared": declared,
                "layout": [
                    {
                        "profile": profile,
                        "placement_start": start,
                        "placement_size": size,
                        "placement": owner,
                        "device_uuid": uuid,
                        "compute_profile": compute,
                    }
                    for start, size, profile, uuid, owner, dummy, compute in gpu.slots
                ],
                "reset_required": gpu.mig_pending,
            }
        elif gpu.mig_mode is not None:
            mig = {
                "mode": gpu.mig_mode,
                "mode_current": gpu.mig_mode_current,
                "declared": declared,
                "layout": [],
                "reset_required": gpu.mig_pending,
            }
        mps = None
        if gpu.use == "mps":
            pipe = f"{MPS_PIPE_ROOT}/{gpu.uuid}"
            log = f"{MPS_LOG_ROOT}/{gpu.uuid}"
            mps = {
                "device_uuid": gpu.uuid,
                "pipe_dir": pipe,
                "log_dir": log,
                "clients": list(gpu.mps_clients),
                "pinned_memory_limit_kb_total": gpu.mps_pinned_kb,
            }
            daemons.append(
                {
                    "device_uuid": gpu.uuid,
                    "gpu_address": gpu.address,
                    "pipe_dir": pipe,
                    "log_dir": log,
                    "clients": list(gpu.mps_clients),
                    "active_thread_percentage": max(gpu.mps_pct) if gpu.mps_pct else None,
                    "waits_for": None,
                }
            )
        if gpu.use is not None:
            use = gpu.use
        elif gpu.claimed or any(not s[5] for s in gpu.slots):
            use = "mig"
        else:
            use = "free"
        gpus.append(
            {
                "address": gpu.address,
                "uuid": gpu.uuid,
                "node": gpu.node,
                "use": use,
                "placements": list(gpu.placements),
                "mig": mig,
                "mps": mps,
            }
        )
    return gpus, daemons


def _mig_gpus_out(gpus: list) -> list:
    """The desired MIG state per GPU, as numafleet.tuning.nvidia_mig takes it (option gpus).

    Listed: GPUs that numafleet_mig_gpus declares and GPUs in MIG mode; a GPU with MIG off that
    is not declared is left alone. On a GPU whose MIG mode change is pending (reset_required)
    the only instances still to be created are those planned before (kept placements, declared
    layouts): the MIG layer creates them once the mode applies (its reset, or the boot unit after
    a reboot), never while it is pending.
    """
    out = []
    for gpu in gpus:
        mig = gpu["mig"]
        if mig is None or not (mig["declared"] or mig["mode"] == "enabled"):
            continue
        out.append(
            {
                "gpu": gpu["address"],
                "uuid": gpu["uuid"],
                "mode": mig["mode"],
                "layout": [
                    {
                        "profile": slot["profile"],
                        "start": slot["placement_start"],
                        "compute_profile": slot["compute_profile"],
                    }
                    for slot in mig["layout"]
                ],
            }
        )
    return out


def _mig_daemons(plan_placements: list) -> list:
    daemons = []
    for entry in plan_placements:
        if entry["mps"] is None or not entry["gpus"] or entry["gpus"][0]["mig"] is None:
            continue
        mig = entry["gpus"][0]["mig"]
        daemons.append(
            {
                "device_uuid": mig["device_uuid"],
                "gpu_address": entry["gpus"][0]["address"],
                "pipe_dir": entry["mps"]["pipe_dir"],
                "log_dir": entry["mps"]["log_dir"],
                "clients": [entry["name"]],
                "active_thread_percentage": entry["mps"]["active_thread_percentage"],
                # Its MIG instance does not exist yet: no unit, never started (as its client).
                "waits_for": entry.get("waits_for"),
            }
        )
    return daemons


def _kept_daemon_cpus(daemon: dict, node: int, cpus: list, recorded_daemons) -> list:
    """The CPUs the daemon recorded last when it may keep them, else ``cpus``.

    recorded_daemons: mps_daemons of the plan applied last (None: plan from scratch). A daemon
    of the same unit on the same node keeps its recorded CPUs while each of them is still one
    it may use (``cpus``: online, not isolated, allowed, of its node): narrowing or widening
    what it may use around them changes nothing, so its unit and, through Requires=, its
    clients are not restarted for it (day-2 rule: never restart what the user did not change).
    """
    for old in recorded_daemons or ():
        if not isinstance(old, dict) or old.get("unit") != daemon.get("unit"):
            continue
        kept = old.get("cpus")
        if old.get("node") == node and _int_list(kept) and kept and set(kept) <= set(cpus):
            return sorted(kept)
    return cpus


def _daemon_details(
    host: str,
    daemons: list,
    entries: list,
    parsed: list,
    gpus: list,
    state: _Host,
    recorded_daemons=None,
) -> None:
    """Add unit, instance, node, CPUs, memory nodes, user and limits to each MPS daemon entry.

    A daemon serves its clients only when they run as the user it runs as (its pipe directory is
    0700), so the clients of one daemon must share one user; raises PlacementError otherwise.
    The daemon runs on the online, not isolated, allowed CPUs of its GPU's node (of its first
    client's node when the GPU's node is unknown or has no CPUs; housekeeping CPUs included)
    and binds memory to that node's nearest memory node:
    not on the union of its clients' CPUs, so that adding, removing or resizing one client does
    not change the daemon's unit and restart, through Requires=, every other client.
    """
    if not daemons:
        return
    by_name = {entry["name"]: entry for entry in entries}
    gpu_uuid = {gpu["address"]: gpu["uuid"] for gpu in gpus}
    for daemon in daemons:
        clients = [by_name[name] for name in daemon["clients"]]
        # Whole-GPU daemons serve a GPU-... UUID; MIG ones a MIG-... UUID or a pending instance.
        mig = not (daemon["device_uuid"] or "").startswith("GPU-")
        users = sorted({(c["user"] or "root", c["group"] or "") for c in clients})
        if len(users) > 1:
            where = {p.name: p.where for p in parsed}
            named = ", ".join(f"{c['name']} runs as {c['user'] or 'root'}" for c in clients)
            raise PlacementError(
                host,
                f"{where[clients[-1]['name']]}.user: the MPS clients of one daemon (GPU "
                f"{daemon['gpu_address']}) must run as one user and group, because the daemon's "
                f"pipe directory {daemon['pipe_dir']} is private to its user ({named}); give "
                "them the same user (and group), or put them on different GPUs",
            )
        pinned = [
            c["mps"]["pinned_memory_limit_kb"]
            for c in clients
            if c["mps"] and c["mps"]["pinned_memory_limit_kb"] is not None
        ]
        instance = daemon["device_uuid"]
        gpu = state.gpu_by_id.get(daemon["gpu_address"])
        node = gpu.cpu_node if gpu is not None and gpu.cpu_node in state.usable else None
        if node is None:
            node = clients[0]["node"]
        # The node's online CPUs but isolated ones, reserved (housekeeping) CPUs included: a
        # control daemon, whose pinning then changes only with the node, not with
        # numafleet_reserved_cpus or the other placements.
        cpus = [
            cpu
            for cpu in state.node[node].get("cpus") or ()
            if cpu in state.online and cpu not in state.isolated
        ]
        if state.allowed_cpus is not None:  # never outside the allowed cpuset either
            cpus = [cpu for cpu in cpus if cpu in state.allowed_cpus]
        unit = f"nvidia-mps@{instance}.service" if instance else None
        if unit is not None and cpus:
            cpus = _kept_daemon_cpus({"unit": unit}, node, cpus, recorded_daemons)
        daemon.update(
            {
                "instance": instance,
                "unit": unit,
                "gpu_uuid": gpu_uuid.get(daemon["gpu_address"]),
                "mig": mig,
                "node": node,
                "cpus": cpus or list(clients[0]["cpus"]),
                "mems": state.near_mem[node][:1] or list(clients[0]["mems"]),
                "user": clients[0]["user"],
                "group": clients[0]["group"],
                "pinned_memory_limit_kb": max(pinned) if pinned else None,
            }
        )


def placement_request(p) -> dict:
    """What a placement asks for in resources (JSON-ready); a kept placement's must not change.

    Only the keys that decide where it runs: cpus (count or list), gpus (count or list),
    memory_kb, hugepages, node, near, mig_profile, MPS share and allow_span. exec, environment,
    user, tenant and the like change the unit, not the placement.
    """
    return {
        "cpus": list(p.cpu_list) if p.cpu_list is not None else p.cpu_count,
        "gpus": list(p.gpu_ids) if p.gpu_ids else p.gpu_count,
        "memory_kb": p.memory_kb,
        "hugepages": (
            None
            if p.hugepages is None
            else {"size_kb": p.hugepages.size_kb, "count": p.hugepages.count}
        ),
        "node": p.node,
        "near": p.near,
        "mig_profile": p.mig_profile,
        "mps": p.mps is not None,
        "mps_pinned_memory_limit_kb": None if p.mps is None else p.mps.pinned_memory_limit_kb,
        "allow_span": p.allow_span,
    }


def _request_change(old: Optional[dict], new: dict) -> str:
    """'' when old equals new, else the changed keys as 'cpus 4 -> 8, memory_kb ...'."""
    if old == new:
        return ""
    if not isinstance(old, dict):
        return "no request was recorded"
    return ", ".join(
        f"{key} {old.get(key)!r} -> {new[key]!r}".replace("'", "")
        for key in new
        if old.get(key) != new[key]
    )


_RECORDED_FIX = (
    "move the file away, or set numafleet_repack: true for this host to plan every placement "
    "from scratch (placements may then move)"
)


def parse_recorded(host: str, recorded: Optional[dict], path: str) -> Optional[dict]:
    """name -> placement entry of the recorded plan (None when there is none); raises PlanError.

    recorded: ansible_facts.numafleet_recorded (numa_facts option recorded_plan): ``state``
    (absent, present or invalid), ``plan`` (the parsed file) and ``error``. A file that is not
    a plan of this collection for this host, or one in which a placement lacks its resources,
    is refused with the path and the fix: it is never trusted blindly.
    """
    if not recorded or recorded.get("state") in (None, "absent"):
        return None

    def refuse(why: str) -> PlanError:
        return PlanError(host, f"the recorded plan {path} {why}; {_RECORDED_FIX}")

    if recorded.get("state") != "present":
        if recorded.get("kind") in ("directory", "other"):
            raise PlanError(
                host,
                f"the recorded plan {path} {recorded.get('error') or 'is not a regular file'}: "
                "move it away (numafleet_repack: true cannot replace it). Nothing was changed.",
            )
        raise refuse(recorded.get("error") or "cannot be read")
    plan = recorded.get("plan")
    if not isinstance(plan, dict) or not isinstance(plan.get("placements"), list):
        raise refuse("is not a plan of numafleet.tuning (no placements list)")
    if plan.get("version") != PLAN_VERSION:
        raise refuse(f"has plan version {plan.get('version')!r}, not {PLAN_VERSION}")
    if plan.get("host") != host:
        raise refuse(f"was recorded for host {plan.get('host')!r}, not {host}")
    awaiting = plan.get("awaiting_restart", [])
    if not isinstance(awaiting, list) or not all(isinstance(u, str) for u in awaiting):
        raise refuse("has an awaiting_restart that is not a list of unit names")
    out = {}
    for position, entry in enumerate(plan["placements"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name in out:
            raise refuse(f"has a bad or repeated name at placements[{position}]")
        ok = (
            _int_list(entry.get("cpus"))
            and _int_list(entry.get("nodes"))
            and entry["nodes"]
            and _int_list(entry.get("mems"))
            and entry["mems"]
            and isinstance(entry.get("gpus"), list)
            and all(
                isinstance(g, dict) and isinstance(g.get("address"), str) for g in entry["gpus"]
            )
        )
        if not ok:
            raise refuse(f"has a placement {name} without valid cpus, nodes, mems or gpus")
        out[name] = entry
    return out


def _int_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    )


def _size_text(kb: int) -> str:
    """A size value that writes kb exactly: 64G, 1536M or 100K."""
    for suffix, scale in (("T", 1 << 30), ("G", 1 << 20), ("M", 1 << 10)):
        if kb % scale == 0:
            return f"{kb // scale}{suffix}"
    return f"{kb}K"


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
            f"{_size_text(total)}, lower their memory or hugepages, or move a placement to "
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
    its recorded CPUs while they are all still ones it may use (_kept_daemon_cpus).
    """
    if hugepages_extra is None:
        hugepages_extra = (policy or {}).get("hugepages_extra")
    parsed_policy = parse_policy(host, policy)
    parsed_extra = parse_hugepages_extra(host, hugepages_extra)
    if mig_gpus is None:
        mig_gpus = (policy or {}).get("mig_gpus")
    parsed_mig = parse_mig_gpus(host, mig_gpus)
    parsed_tenants = parse_tenants(host, tenants)
    parsed = parse_placements(host, placements, parsed_tenants)
    if parsed_tenants:
        _check_tenant_memory(host, parsed_tenants, parsed)
    state = _Host(host, numa, gpu_topology, parsed_policy, parsed_mig)
    state.reserve_extra(parsed_extra)
    slices = {tenant.name: slice_name(tenant.name) for tenant in parsed_tenants}
    planner = _Planner(state, parsed, slices)
    planner.check_allowed_leaves_room(parsed)
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
    gpus_out, daemons = _gpus_out(state, {entry["name"]: entry["index"] for entry in planner.out})
    daemons.extend(_mig_daemons(planner.out))
    daemons.sort(key=lambda d: (d["gpu_address"], d["pipe_dir"]))
    _daemon_details(host, daemons, planner.out, parsed, gpus_out, state, recorded_daemons)
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
        "mig_gpus": _mig_gpus_out(gpus_out),
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
    if partition is not None:
        out["partition"] = partition  # optional: absent = no partition (older plans too)
    return out


def placement_text(entry: dict) -> str:
    """Where a plan entry runs: 'node1 cpus 32-39 gpus b1:00.0,ca:00.0', ' mig 1g.10gb@2', ' mps'.

    Memory nodes other than the CPU nodes follow the CPUs: 'node1 cpus 25-48 mems 0'.
    """
    nodes = "+".join(str(n) for n in entry["nodes"])
    text = f"node{nodes} cpus {format_cpulist(entry['cpus'])}"
    mems = entry.get("mems") or ()
    if any(m not in entry["nodes"] for m in mems):
        text += " mems " + "+".join(str(m) for m in mems)
    if entry["gpus"]:
        text += " gpus " + ",".join(_short_address(g["address"]) for g in entry["gpus"])
        mig = entry["gpus"][0]["mig"]
        if mig is not None:
            text += f" mig {mig['profile']}@{mig['placement_start']}"
        if entry["mps"] is not None:
            text += " mps"
    return text


def plan_summary(plan: dict) -> str:
    """One line per host: '<host>: 2 placements: a node0 cpus 2-17 gpus 17:00.0; ...; 1 warning'.

    A placement anchored with near: ends in ' near <BB:DD.F>' (' near 4b:00.0'); an exec
    placement without user: in ' as root' (systemd's default account); one whose MIG
    instance does not exist yet in ' (waits for MIG instance ...: <reason>)' (waits_text).
    A plan narrowed to the allowed cpuset ends in '; allowed CPUs 1,3 and memory nodes 1'.
    """
    placements = plan.get("placements") or []
    parts = []
    for entry in placements:
        text = f"{entry['name']} {placement_text(entry)}"
        near = entry.get("near")
        if near:
            text += f" near {_short_address(near['address'])}"
        if limits.runs_as(entry) == "root":  # exec without user: (the plan warns)
            text += " as root"
        if entry.get("waits_for"):
            text += f" ({waits_text(entry)})"
        parts.append(text)
    count = len(placements)
    line = f"{plan.get('host')}: {count} placement{'' if count == 1 else 's'}"
    if parts:
        line += ": " + "; ".join(parts)
    warnings = len(plan.get("warnings") or [])
    if warnings:
        line += f"; {warnings} warning{'' if warnings == 1 else 's'}"
    narrowed = plan.get("allowed") or {}
    if narrowed.get("narrowed"):  # the allowed cpuset: the plan stays inside it
        line += f"; allowed {allowed_text(narrowed.get('cpus') or (), narrowed.get('mems') or ())}"
    return line


__all__ = [
    "PLACEMENTS_VAR",
    "parse_recorded",
    "placement_request",
    "plan_host",
    "plan_summary",
    "waits_text",
]
