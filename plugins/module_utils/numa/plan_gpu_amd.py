# Private to this collection: may change in any release.
"""GPU partitions in the planner: AMD Instinct compute partitions (XCP slots). Pure, no I/O.

An AMD GPU of the facts (gpu_topology.gpus[] with vendor "amd" and an ``amd`` record) has a
compute partition (SPX/DPX/TPX/QPX/CPX: 1/2/3/4/8 logical GPUs, XCPs) and a memory partition
(NPS1/NPS4). numafleet_gpu_partitions declares the wanted modes per GPU (AmdPartitionDecl); a
placement with ``partition: cpx`` takes one logical GPU (a Slot: start = partition index,
size 1, profile = compute mode) of a GPU in that mode. A GPU whose current or declared mode is
not SPX is never given whole. Here: the declared modes checked against the facts (Host part),
the checks of partition placements (planner part), the plan's ``amd_partitions``.
"""

from __future__ import annotations

from typing import Optional

from .errors import PlacementError
from .gpu_amd import logical_uuid_counts
from .placements import GPU_PARTITIONS_VAR, PLACEMENTS_VAR
from .plan_gpu import Gpu, Slot
from .plan_gpu_partitions import declared_gpu

# Logical GPUs (XCPs) per compute partition mode; CPX: one per XCD (xcd_count, 8 on MI300X).
XCP_COUNT = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4}
# waits_for.reason of a placement whose logical GPU appears only once the mode changes.
WAIT_COMPUTE_CHANGE = "created when the compute partition changes"
MPS_NOT_AMD = "MPS is NVIDIA only; use partition: cpx to share an AMD GPU"
# What a unit selected by render node may open (systemd DeviceAllow=, with DevicePolicy=closed):
# the KFD compute interface every ROCm process needs, then its GPUs' render nodes.
KFD_DEVICE = "/dev/kfd"


def shared_uuids(gpus) -> set:
    """The UUIDs (lower case) more than one logical GPU of the host carries
    (gpu_amd.logical_uuid_counts); ``gpus``: the planner's Gpu records."""
    counts = logical_uuid_counts(gpu.amd for gpu in gpus if gpu.amd is not None)
    return {uuid for uuid, count in counts.items() if count > 1}


def xcp_count(mode: str, xcd_count: Optional[int]) -> int:
    """Logical GPUs of an AMD GPU in compute partition mode (CPX: one per XCD, else 8)."""
    if mode == "CPX":
        return xcd_count or 8
    return XCP_COUNT.get(mode, 1)


def slot_xcds(gpu: Gpu, slot: Slot) -> list:
    """The XCDs of one logical GPU: the facts' for an existing one, else computed."""
    if slot.existing:
        for lg in gpu.amd.get("logical_gpus") or ():
            if lg.get("index") == slot.start:
                return list(lg.get("xcds") or ())
    count = gpu.amd.get("xcd_count") or 8
    per = max(count // xcp_count(slot.profile, count), 1)
    return list(range(slot.start * per, (slot.start + 1) * per))


def slot_render_minor(gpu: Gpu, slot: Slot) -> Optional[int]:
    """The render minor of an existing logical GPU (facts), None for one to be created."""
    if not slot.existing:
        return None
    for lg in gpu.amd.get("logical_gpus") or ():
        if lg.get("index") == slot.start:
            return lg.get("render_minor")
    return None


def partitioned(gpu: Gpu) -> bool:
    """Whether an AMD GPU is (or is declared) split in logical GPUs: never given whole."""
    if gpu.amd is None:
        return False
    return any(mode not in (None, "SPX") for mode in (gpu.amd_compute, gpu.amd_compute_planned))


def xcp_pick(gpu: Gpu, mode: str, index: Optional[int] = None) -> Optional[Slot]:
    """The lowest free logical GPU of gpu in mode (index: only that one), or None."""
    if gpu.amd is None or gpu.amd_compute_planned != mode:
        return None
    for slot in gpu.xcp_slots:
        if slot.placement is None and (index is None or slot.start == index):
            return slot
    return None


def _modes_text(modes) -> str:
    return ", ".join(modes) if modes else "none"


class AmdLayouts:
    """Host part: the declared AMD compute/memory partitions checked and made the GPUs' slots."""

    def _declare_amd(self, declared) -> None:
        """Make an AMD GPU's planned compute/memory partitions the declared ones; raises
        PlacementError for a GPU that is not AMD, a mode the GPU does not offer, or a memory
        partition its compute partition does not allow (amd.compatible_memory_partitions)."""
        where = declared.where
        gpu = declared_gpu(self, declared)
        keys = [
            key
            for key, value in (
                ("compute_partition", declared.compute_partition),
                ("memory_partition", declared.memory_partition),
            )
            if value is not None
        ]
        if gpu.amd is None:
            raise PlacementError(
                self.host,
                f"{where}: {', '.join(keys) or 'compute_partition'} (AMD keys) on GPU "
                f"{gpu.address}, which is {gpu.vendor or 'of unknown vendor'}, not an AMD GPU "
                "with partition facts; for an NVIDIA GPU write mode/layout (MIG), or gather the "
                "facts again if it is an AMD Instinct GPU",
            )
        if gpu.amd_declared is not None:
            raise PlacementError(
                self.host,
                f"{where}.gpu: {gpu.address} is also {gpu.amd_declared.where}; declare each "
                "GPU once",
            )
        amd = gpu.amd
        compute_facts = amd.get("compute_partition") or {}
        memory_facts = amd.get("memory_partition") or {}
        compute = declared.compute_partition or gpu.amd_compute
        memory = declared.memory_partition or gpu.amd_memory
        for key, value, facts in (
            ("compute_partition", declared.compute_partition, compute_facts),
            ("memory_partition", declared.memory_partition, memory_facts),
        ):
            if value is None:
                continue
            available = facts.get("available") or ()
            if value not in available:
                raise PlacementError(
                    self.host,
                    f"{where}.{key}: GPU {gpu.address} does not offer {value} (available: "
                    f"{_modes_text(available)}, from ansible_facts.gpu_topology); write one of "
                    "those",
                )
        compatible = amd.get("compatible_memory_partitions")
        if isinstance(compatible, dict) and compute in compatible and memory is not None:
            allowed = compatible.get(compute) or ()
            if memory not in allowed:
                raise PlacementError(
                    self.host,
                    f"{where}: GPU {gpu.address} in compute partition {compute} allows memory "
                    f"partition {_modes_text(allowed)}, not {memory}; set memory_partition: "
                    f"{allowed[0] if allowed else 'NPS1'} or another compute_partition",
                )
        gpu.amd_declared = declared
        gpu.amd_compute_planned = compute
        gpu.amd_memory_planned = memory
        if compute != gpu.amd_compute:
            # The logical GPUs of the new mode do not exist yet: no UUID until the amd layer
            # changed the mode and the plan is made again.
            count = xcp_count(compute, amd.get("xcd_count"))
            gpu.xcp_slots = [Slot(i, 1, compute, None, None, False) for i in range(count)]

    def _check_amd_hives(self) -> None:
        """Refuse a declared memory partition change that leaves the GPUs of one XGMI hive
        (amd.hive_id) in different memory partitions: the driver makes the request for every GPU
        of the hive and applies it at one reload, so they share it."""
        hives: dict = {}
        for gpu in self.gpus:
            hive = (gpu.amd or {}).get("hive_id")
            if hive:
                hives.setdefault(hive, []).append(gpu)
        for hive, members in sorted(hives.items()):
            changed = [g for g in members if g.amd_memory_planned != g.amd_memory]
            if not changed or len({g.amd_memory_planned for g in members}) == 1:
                continue
            first = changed[0]
            want = first.amd_memory_planned
            others = ", ".join(
                f"{g.address} {g.amd_memory_planned}"
                for g in members
                if g.amd_memory_planned != want
            )
            raise PlacementError(
                self.host,
                f"{first.amd_declared.where}.memory_partition: {want} on GPU {first.address} "
                f"changes the memory partition of XGMI hive {hive}, whose GPUs share one (the "
                f"driver sets it for every GPU of the hive at one reload), and {others} would "
                f"differ; declare memory_partition: {want} for every GPU of the hive "
                f"({', '.join(g.address for g in members)}) with a compute partition that "
                "allows it, or for none",
            )


class AmdChecks:
    """_Planner part: the checks of placements on AMD GPUs, before any is planned."""

    def _check_amd_listed(self, p, gpu: Gpu) -> None:
        """Refuse a listed AMD GPU a placement cannot get (mps, whole on a partitioned GPU,
        partition of another mode), and partition: on a GPU that is not AMD."""
        host = self.state.host
        if gpu.amd is None:
            if p.partition is not None:
                raise PlacementError(
                    host,
                    f"{p.where}.gpus: {gpu.address} is not an AMD GPU with partition facts; "
                    "partition: takes a logical GPU of an AMD Instinct GPU: list one, or use "
                    "mig_profile on an NVIDIA GPU",
                )
            return
        if p.mps is not None:
            raise PlacementError(host, f"{p.where}.mps: GPU {gpu.address} is AMD; {MPS_NOT_AMD}")
        if p.partition is None and partitioned(gpu):
            mode = gpu.amd_compute_planned
            raise PlacementError(
                host,
                f"{p.where}.gpus: {gpu.address} is in compute partition {mode} "
                f"({self._mode_source(gpu)}) and only serves partition placements; set "
                f"partition: {mode.lower()} or list another GPU",
            )
        if p.partition is not None and gpu.amd_compute_planned != p.partition:
            raise PlacementError(
                host,
                f"{p.where}.partition: GPU {gpu.address} is in compute partition "
                f"{gpu.amd_compute_planned} ({self._mode_source(gpu)}), not {p.partition}; "
                f"write partition: {(gpu.amd_compute_planned or 'spx').lower()}, list another "
                f"GPU, or declare {{gpu: {gpu.address}, compute_partition: {p.partition}}} in "
                f"{GPU_PARTITIONS_VAR}",
            )

    @staticmethod
    def _mode_source(gpu: Gpu) -> str:
        if gpu.amd_declared is not None and gpu.amd_compute_planned != gpu.amd_compute:
            return f"declared in {gpu.amd_declared.where}, now {gpu.amd_compute}"
        if gpu.amd_declared is not None:
            return f"declared in {gpu.amd_declared.where}"
        return "current mode"

    def check_amd_placements(self, placements: list) -> None:
        """Refuse, before any placement is planned: mps: where every GPU is AMD, partition:
        with no GPU in that mode, more partition placements of a mode than logical GPUs."""
        state = self.state
        amd = [g for g in state.gpus if g.amd is not None]
        if not amd:
            for p in placements:
                if p.partition is not None:
                    raise PlacementError(
                        state.host,
                        f"{p.where}.partition: this host has no AMD GPU with partition facts; "
                        "remove partition: (or gather the facts again on an AMD Instinct host)",
                    )
            return
        only_amd = all(g.amd is not None for g in state.gpus)
        wanted: dict = {}
        for p in placements:
            if p.mps is not None and not p.gpu_ids and only_amd:
                raise PlacementError(
                    state.host, f"{p.where}.mps: every GPU of this host is AMD; {MPS_NOT_AMD}"
                )
            if p.partition is not None:
                wanted.setdefault(p.partition, []).append(p)
        for mode, asking in wanted.items():
            gpus = [g for g in amd if g.amd_compute_planned == mode]
            if not gpus:
                modes = ", ".join(f"{g.address} {g.amd_compute_planned}" for g in amd)
                raise PlacementError(
                    state.host,
                    f"{asking[0].where}.partition: no AMD GPU of this host is in compute "
                    f"partition {mode} (GPUs: {modes}); declare one in {GPU_PARTITIONS_VAR}, "
                    f"e.g. {{gpu: {amd[0].address}, compute_partition: {mode}}}, or write the "
                    "partition of a GPU's mode",
                )
            slots = sum(len(g.xcp_slots) for g in gpus)
            if len(asking) > slots:
                raise PlacementError(
                    state.host,
                    f"{PLACEMENTS_VAR}: {len(asking)} placements ask for a {mode} logical GPU "
                    f"({', '.join(p.name for p in asking)}) and the GPUs in {mode} have "
                    f"{slots} ({', '.join(g.address for g in gpus)}); remove "
                    f"{len(asking) - slots} of them or declare another GPU {mode} in "
                    f"{GPU_PARTITIONS_VAR}",
                )

    def _amd_pool(self, p, nid: int, listed: list, fallback: bool, far: bool) -> list:
        """Candidate GPUs of a partition placement: listed, else those in its mode on nid."""
        if listed:
            return listed
        pool = [
            g
            for g in self.state.gpus
            if g.amd is not None
            and g.amd_compute_planned == p.partition
            and (far or g.cpu_node == nid or (fallback and g.cpu_node is None))
        ]
        if far:
            row = self.state.dist[nid]
            pool.sort(key=lambda g: (g.cpu_node is None, row.get(g.cpu_node, 255), g.address))
        return pool

    def _amd_pick(self, p, nid: int, listed: list, fallback: bool, far: bool = False):
        """([gpu], Slot) of the lowest free logical GPU for partition placement p, or None."""
        for gpu in self._amd_pool(p, nid, listed, fallback, far):
            slot = xcp_pick(gpu, p.partition)
            if slot is not None:
                return [gpu], slot
        return None


def commit_slot(gpu: Gpu, slot: Slot, name: str) -> None:
    """Give the logical GPU slot of gpu to placement name."""
    gpu.xcp_slots = [
        s._replace(placement=name) if s.start == slot.start else s for s in gpu.xcp_slots
    ]
    gpu.use = gpu.use or "partition"


def partition_out(gpu: Gpu, slot: Optional[Slot]) -> Optional[dict]:
    """A placement gpus[] entry's ``partition`` (None: the whole AMD GPU)."""
    if slot is None:
        return None
    return {
        "mode": slot.profile,
        "index": slot.start,
        "uuid": slot.device_uuid,
        "render_minor": slot_render_minor(gpu, slot),
        "xcds": slot_xcds(gpu, slot),
        "existing": slot.existing,
    }


def waits_for_partition(gpu: Gpu, slot: Slot) -> dict:
    """waits_for of a placement whose logical GPU appears once the compute partition changes."""
    return {
        "partition": f"{slot.profile} logical GPU {slot.start} of GPU {gpu.address}",
        "gpu": gpu.address,
        "mode": slot.profile,
        "index": slot.start,
        "reason": WAIT_COMPUTE_CHANGE,
    }


def plan_amd_partitions(state, units: dict) -> Optional[list]:
    """The plan's ``amd_partitions`` (None when the host has no AMD GPU with partition facts):
    one entry per AMD GPU, address order; units: placement name -> its unit."""
    amd = [g for g in state.gpus if g.amd is not None]
    if not amd:
        return None
    out = []
    for gpu in amd:
        compute = {"current": gpu.amd_compute, "planned": gpu.amd_compute_planned}
        memory = {"current": gpu.amd_memory, "planned": gpu.amd_memory_planned}
        out.append(
            {
                "address": gpu.address,
                "uuid": gpu.uuid,
                "node": gpu.node,
                "compute_partition": compute,
                "memory_partition": memory,
                "declared": gpu.amd_declared is not None,
                "change": compute["current"] != compute["planned"]
                or memory["current"] != memory["planned"],
                "reset_required": memory["current"] != memory["planned"],
                "logical_gpus": [
                    {"index": s.start, "uuid": s.device_uuid, "placement": s.placement}
                    for s in gpu.xcp_slots
                ],
                "owned_units": sorted({units[name] for name in gpu.placements if name in units}),
            }
        )
    return out
