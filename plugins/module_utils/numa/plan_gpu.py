# Private to this collection: may change in any release.
"""The planner's GPU record (Gpu) and its partition slots (Slot). Pure, no I/O.

Gpu: one GPU of the facts (gpu_topology.gpus[]) and what the plan has given of it so far;
Slot: one MIG GPU instance of it, existing or declared, or one logical GPU (XCP) of an AMD GPU.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


def profile_maps(profiles: list) -> tuple:
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


class Slot(NamedTuple):
    """One partition slot of a GPU: a MIG GPU instance (or, on AMD, a logical GPU of a partition).

    Sorted and compared as the tuple (start, size, ...): a GPU's slots sort by start.
    """

    start: int  # MIG: first memory slice; AMD: partition index
    size: int  # MIG: slices; AMD: 1
    profile: str  # MIG profile ('3g.40gb') or compute mode ('CPX')
    device_uuid: Optional[str]  # MIG device / logical GPU UUID; None until it exists
    placement: Optional[str]  # the placement given the slot
    existing: bool  # exists on the GPU now
    compute_profile: Optional[str] = None  # MIG compute-instance profile; None on AMD


class Gpu:
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
        "amd",
        "amd_compute",
        "amd_compute_planned",
        "amd_memory",
        "amd_memory_planned",
        "amd_declared",
        "xcp_slots",
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
        self.mig_existing: list = []  # Slot of each existing GPU instance, by start
        if self.mig_mode == "enabled" and profiles is not None:
            self.mig_profiles, self.mig_memory = profile_maps(profiles)
            self.mig_existing = sorted(
                (
                    Slot(
                        instance["placement_start"],
                        instance["placement_size"],
                        instance.get("profile_name"),
                        instance.get("mig_device_uuid"),
                        None,
                        True,
                    )
                    for instance in mig.get("gpu_instances") or ()
                    if instance.get("placement_start") is not None
                ),
                key=lambda item: item[0],
            )
        self.use: Optional[str] = None  # None (free), "whole", "mps"
        self.placements: list = []
        # MIG: a Slot per GPU instance, existing or planned, by start.
        self.slots = list(self.mig_existing)
        self.claimed: set = set()  # starts of existing instances given to a placement
        self.mps_clients: list = []
        self.mps_pinned_kb = 0
        self.mps_pct: list = []
        # AMD Instinct (facts amd record; None for every other GPU): compute partition
        # (SPX/DPX/TPX/QPX/CPX) and memory partition (NPS1/NPS4), current and planned (the
        # numafleet_gpu_partitions entry, AmdPartitionDecl, else current), and a Slot per
        # logical GPU (XCP) of the planned mode (plan_gpu_amd.py).
        amd = entry.get("amd") if entry.get("vendor") == "amd" else None
        self.amd = amd if isinstance(amd, dict) else None
        self.amd_declared = None
        self.amd_compute = self.amd_memory = None
        self.xcp_slots: list = []
        if self.amd is not None:
            self.amd_compute = (self.amd.get("compute_partition") or {}).get("current")
            self.amd_memory = (self.amd.get("memory_partition") or {}).get("current")
            self.xcp_slots = sorted(
                (
                    Slot(lg["index"], 1, self.amd_compute or "SPX", lg.get("uuid"), None, True)
                    for lg in self.amd.get("logical_gpus") or ()
                    if isinstance(lg, dict) and isinstance(lg.get("index"), int)
                ),
                key=lambda slot: slot.start,
            )
        self.amd_compute_planned = self.amd_compute
        self.amd_memory_planned = self.amd_memory

    @property
    def mig_capable(self) -> bool:
        return self.mig_profiles is not None

    def mig_pick(
        self, profile: str, start: Optional[int] = None, pending_ok: bool = False
    ) -> Optional[Slot]:
        """The Slot of the instance a new MIG client gets (start, size, device_uuid, existing
        are what counts), or None.

        start: only the instance at that slice (a kept placement's recorded slot). While the
        GPU's MIG mode is pending (mig_pending) only existing instances are given, unless
        pending_ok (a kept placement that was already waiting for its instance).
        """
        for slot in self.mig_existing:
            if start is not None and slot.start != start:
                continue
            if slot.profile == profile and slot.start not in self.claimed:
                return slot
        if self.mig_pending and not pending_ok:
            return None
        if self.mig_declared is not None and self.mig_declared.layout is not None:
            # A declared layout is exact: only its instances still to be created are left.
            for slot in self.slots:
                if (start is None or slot.start == start) and slot.profile == profile:
                    if not slot.existing and slot.placement is None:
                        return slot
            return None
        for slot_start, size in self.mig_profiles.get(profile) or ():
            if start is not None and slot_start != start:
                continue
            end = slot_start + size
            if all(end <= s.start or slot_start >= s.start + s.size for s in self.slots):
                return Slot(slot_start, size, profile, None, None, False)
        return None

    def mps_room(self, pinned_kb: int) -> bool:
        if self.memory_mib is None or not pinned_kb:
            return True
        return self.mps_pinned_kb + pinned_kb <= self.memory_mib * 1024


def by_vendor(pool: list) -> dict:
    """{vendor: its GPUs of pool}, in the order of their first GPU in pool."""
    groups: dict = {}
    for gpu in pool:
        groups.setdefault(gpu.vendor, []).append(gpu)
    return groups


def one_vendor(pool: list, vendor: Optional[str]) -> list:
    """The GPUs of pool of ``vendor``; with None, those of the vendor with the most GPUs in pool
    (pool sorted by address: the vendor of the lower address on a tie); pool itself when it
    holds one vendor."""
    groups = by_vendor(pool)
    if vendor is not None:
        return groups.get(vendor, [])
    if len(groups) <= 1:
        return pool
    return max(groups.values(), key=len)


def choose_gpus(pool: list, count: int) -> Optional[list]:
    """count GPUs of pool (sorted by address), all of one vendor (a program drives GPUs of one
    vendor: CUDA or ROCm): one switch, else NVLink-connected, else lowest; None when no vendor
    has count GPUs in pool."""
    if len(pool) < count:
        return None
    if count == 0:
        return []
    groups = by_vendor(pool)
    if len(groups) > 1:
        for group in groups.values():  # the vendor of the lowest address first
            chosen = choose_gpus(group, count)
            if chosen is not None:
                return chosen
        return None
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
