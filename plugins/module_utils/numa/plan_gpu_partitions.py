# Private to this collection: may change in any release.
"""GPU partitions in the planner: MIG slots. Pure, no I/O.

Declared MIG layouts (numafleet_mig_gpus) made a GPU's slots, the checks of a placement
asking for a MIG instance, the instances a placement waits for, the plan's mig_gpus.
"""

from __future__ import annotations

from typing import Optional

from .cpulist import format_cpulist
from .errors import PlacementError
from .placements import GPU_SHORT_ADDRESS
from .plan_common import CI_SLICES
from .plan_gpu import Gpu, Slot, profile_maps

# Why a placement's MIG instance does not exist yet (its plan entry's waits_for.reason).
WAIT_PENDING_RESET = "mode change pending a reset"
WAIT_MODE_THEN_CREATE = "created in this run once MIG mode is on"
WAIT_CREATE = "created in this run"


def waits_for_instance(gpu: Gpu, profile: str, start: int) -> dict:
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


def pending_text(gpu: Gpu) -> str:
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
    if "partition" in waits:  # AMD: a logical GPU of a compute partition still to be made
        return f"waits for {waits.get('partition')}: {waits.get('reason')}"
    return f"waits for MIG instance {waits.get('mig_instance')}: {waits.get('reason')}"


def declared_gpu(host, declared) -> Gpu:
    """The GPU of ``host`` (the planner's Host) that a numafleet_gpu_partitions (or
    numafleet_mig_gpus) entry names: by PCI address or UUID, or by a short address (``17:00.0``)
    matching exactly one GPU. Both vendors' declarations use it. Raises PlacementError naming
    the entry and the host's GPUs."""
    gpu = host.gpu_by_id.get(declared.gpu)
    if gpu is None and GPU_SHORT_ADDRESS.match(declared.gpu):
        found = [g for g in host.gpus if g.address.endswith(":" + declared.gpu)]
        gpu = found[0] if len(found) == 1 else None
    if gpu is None:
        known = ", ".join(g.address for g in host.gpus) or "none"
        raise PlacementError(
            host.host,
            f"{declared.where}.gpu: {declared.gpu} is not a GPU of this host (GPUs: {known}); "
            "write one of those addresses or its UUID",
        )
    return gpu


class MigLayouts:
    """Host part: the declared MIG layouts (numafleet_mig_gpus) made the GPUs' slots."""

    def _declare_mig(self, declared) -> None:
        """Make a GPU's MIG mode and layout the declared ones; raises PlacementError."""
        where = declared.where
        gpu = declared_gpu(self, declared)
        if gpu.amd is not None:
            raise PlacementError(
                self.host,
                f"{where}: mode/layout (NVIDIA MIG keys) on GPU {gpu.address}, which is an AMD "
                "GPU; declare its compute_partition (SPX/DPX/QPX/CPX) and memory_partition "
                "(NPS1/NPS4) instead",
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
            gpu.mig_profiles, gpu.mig_memory = profile_maps(profiles)
        if declared.layout is not None:
            self._declared_slots(gpu, declared, profiles)

    def _check_compute_profile(self, here: str, gpu: Gpu, item) -> None:
        """Refuse a compute-instance profile that the GPU instance cannot hold."""
        if item.compute_profile is None:
            return
        slices = int(item.compute_profile.split("c.", 1)[0])
        gi_slices = int(item.profile.split("g.", 1)[0])
        # NVML's compute-instance profiles: 1, 2, 3, 4, 6, 7 or 8 slices, at most the GPU
        # instance's; a 4-slice GPU instance has no 3-slice one (nvidia-smi mig -lcip).
        offered = [n for n in CI_SLICES if n <= gi_slices and not (n == 3 and gi_slices == 4)]
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

    def _declared_slots(self, gpu: Gpu, declared, profiles: list) -> None:
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
                    if instance.profile == item.profile and item.start in (None, instance.start)
                ),
                None,
            )
            if match is not None and item.compute_profile is None:
                existing.remove(match)
                kept.append(match)  # existing, no placement, no compute profile
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
        slots = list(kept)
        order = sorted(todo, key=lambda pair: (pair[1].start is None, pair[0]))
        for position, item in order:
            choices = gpu.mig_profiles[item.profile]
            if item.start is not None:
                choices = [pair for pair in choices if pair[0] == item.start]
            free = [
                (start, size)
                for start, size in choices
                if all(start + size <= s.start or start >= s.start + s.size for s in slots)
            ]
            if not free:
                taken = ", ".join(f"{s.profile}@{s.start}" for s in sorted(slots)) or "nothing"
                raise PlacementError(
                    self.host,
                    f"{where}.layout[{position}]: {item.profile}"
                    f"{'' if item.start is None else '@' + str(item.start)} does not fit on "
                    f"{gpu.address} next to {taken}; give the instances start: values that "
                    "fit (nvidia-smi mig -lgipp lists them) or drop one",
                )
            start, size = free[0]
            slots.append(Slot(start, size, item.profile, None, None, False, item.compute_profile))
        slots.sort(key=lambda slot: slot.start)
        gpu.mig_existing = [slot for slot in slots if slot.existing]
        gpu.slots = slots
        lacking = [f"{slot.profile}@{slot.start}" for slot in slots if not slot.existing]
        if gpu.mig_pending and lacking:
            self.facts_warnings.append(
                f"{pending_text(gpu)}: {where}.layout lacks {', '.join(lacking)}, which "
                "no run creates until the mode applies; " + PENDING_FIX.format(address=gpu.address)
            )


class MigChecks:
    """_Planner part: the checks of a placement that asks for a MIG instance."""

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

    def _free_mig_profiles(self, listed: list) -> list:
        """Names of the MIG profiles that still have a free slot on the (listed) MIG GPUs."""
        gpus = [g for g in listed or self.state.gpus if g.mig_capable]
        return sorted({name for g in gpus for name in g.mig_profiles if g.mig_pick(name)})


def plan_mig_gpus(gpus: list) -> list:
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
