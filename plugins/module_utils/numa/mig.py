# Private to this collection: may change in any release.
"""MIG layouts: the GPU's state as read now, the requested layout, the fit and the delta.

Shared model for every backend (NVML here, nvidia-smi in ``mig_smi.py``, a recorded
gpu_topology snapshot for render mode).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .errors import MigBackendError, MigError
from .mig_holders import (
    KIND_DAEMON,
    KIND_MODULE,
    foreign,
    holders_message,
    read_holders,
    read_pid_unit,
)
from .units import boot_unit_text

# Compute-instance profile ids by slice count: NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE in nvml.h
# (the same ids nvidia-smi mig -lcip prints). "Nc.<gi profile>" is a CI of N slices.
CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}

__all__ = [
    "CI_PROFILE_IDS",
    "ComputeInstance",
    "GpuInstance",
    "MigBackendError",
    "MigError",
    "MigGpu",
    "Profile",
]


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile, as the GPU itself reports it."""

    name: str  # "3g.40gb" (no "MIG " prefix)
    id: int  # GI profile id (NVML info.id == nvidia-smi -lgip "ID" column)
    slices: int
    memory_mib: int
    max_count: int
    placements: tuple  # ((start, size), ...) sorted


@dataclass(frozen=True)
class ComputeInstance:
    """One compute instance inside a GPU instance."""

    id: int
    slices: int
    profile_id: int  # CI profile id (CI_PROFILE_IDS value)
    device_uuid: Optional[str]  # MIG-... UUID, None when unknown


@dataclass(frozen=True)
class GpuInstance:
    """One GPU instance: its profile, placement and compute instances (sorted by id)."""

    id: int
    profile_id: int
    start: int
    size: int
    compute_instances: tuple


@dataclass(frozen=True)
class MigGpu:
    """One GPU as read now."""

    address: str  # sysfs form 0000:17:00.0 (lower case)
    index: Optional[int]
    uuid: Optional[str]
    name: Optional[str]
    architecture: Optional[str]  # "ampere", "hopper", "blackwell", ...; None unknown
    mode_current: Optional[str]  # "enabled" | "disabled"; None = MIG not supported
    mode_pending: Optional[str]
    profiles: tuple  # Profile, sorted by id; () when the driver does not list them
    gpu_instances: tuple  # GpuInstance, sorted by id
    processes: tuple  # ((pid, gpu_instance_id or None), ...) sorted


# Kinds of Action, in the order a GPU's changes run.
DESTROY_CI = "destroy_ci"
DESTROY_GI = "destroy_gi"
SET_MODE = "set_mode"
CREATE_GI = "create_gi"
CREATE_CI = "create_ci"


@dataclass(frozen=True)
class Action:
    """One change on one GPU, as handed to a backend's ``describe`` (and run by its methods).

    set_mode: ``enabled``. destroy_ci: ``gpu_instance_id``, ``compute_instance_id``.
    destroy_gi: ``gpu_instance_id``. create_gi: ``profile_id`` (GI profile id), ``start``,
    ``profile_name``. create_ci: ``gpu_instance_id`` (None while the GI is yet to be created: the
    one made by the create_gi just before), ``profile_id`` (CI profile id, CI_PROFILE_IDS),
    ``profile_name`` (CI profile name, ``1c.3g.40gb`` or ``3g.40gb`` for a full-size one),
    ``slices`` (CI slices) and ``full`` (True for a full-size CI: nvidia-smi -C).
    """

    kind: str
    address: str
    enabled: Optional[bool] = None
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    profile_id: Optional[int] = None
    start: Optional[int] = None
    profile_name: Optional[str] = None
    slices: Optional[int] = None
    full: bool = False


# ---------------------------------------------------------------------------------------------
# The request: what the module's `gpus` option asks for

MODES = ("enabled", "disabled")
RESET_COMMAND = "nvidia-smi --gpu-reset -i {address}"
# Architectures whose MIG mode change stays pending until a GPU reset (NVIDIA MIG user guide:
# "on Ampere GPUs a GPU reset is required"; Hopper and newer apply it in place).
RESET_ARCHITECTURES = ("ampere",)
_CI_SLICES = {value: key for key, value in CI_PROFILE_IDS.items()}


@dataclass(frozen=True)
class Entry:
    """One GPU instance requested in a layout: profile name, optional start and CI profile name."""

    profile: str
    start: Optional[int]
    compute_profile: Optional[str]


@dataclass(frozen=True)
class Request:
    """One element of the module's ``gpus`` option."""

    gpu: str
    mode: str
    layout: tuple  # Entry
    uuid: Optional[str] = None  # the GPU UUID the plan saw at ``gpu``; None = not checked


def _where(index: int, key: str = "") -> str:
    return f"gpus[{index}]" + (f".{key}" if key else "")


def parse_request(gpus: list) -> list[Request]:
    """Requests of the ``gpus`` option, in the given order; raises MigError on a malformed one."""
    if not isinstance(gpus, list):
        raise MigError("gpus: give a list of {gpu, mode, layout} dictionaries")
    requests = []
    for index, item in enumerate(gpus):
        if not isinstance(item, dict):
            raise MigError(f"{_where(index)}: {item!r} is not a dictionary; give gpu, mode, layout")
        gpu = item.get("gpu")
        if not isinstance(gpu, str) or not gpu.strip():
            raise MigError(
                f"{_where(index, 'gpu')}: give the GPU's PCI address (0000:17:00.0) or UUID (GPU-...)"
            )
        mode = item.get("mode") or "enabled"
        if mode not in MODES:
            raise MigError(f"{_where(index, 'mode')}: {mode!r} is not one of enabled, disabled")
        layout = item.get("layout") or []
        if not isinstance(layout, list):
            raise MigError(
                f"{_where(index, 'layout')}: give a list of {{profile, start, compute_profile}}"
            )
        if mode == "disabled" and layout:
            raise MigError(
                f"{_where(index, 'layout')}: GPU {gpu} has mode disabled, which allows no GPU "
                "instances; set mode: enabled or remove the layout"
            )
        uuid = item.get("uuid")
        if uuid is not None and (not isinstance(uuid, str) or not uuid.strip()):
            raise MigError(
                f"{_where(index, 'uuid')}: {uuid!r} is not a GPU UUID; give the plan's GPU-... "
                "UUID or leave uuid out"
            )
        entries = tuple(_entry(index, n, e) for n, e in enumerate(layout))
        requests.append(Request(gpu.strip(), mode, entries, uuid.strip() if uuid else None))
    return requests


def _entry(index: int, number: int, item) -> Entry:
    where = _where(index, f"layout[{number}]")
    if not isinstance(item, dict):
        raise MigError(
            f"{where}: {item!r} is not a dictionary; give profile (and start, compute_profile)"
        )
    profile = item.get("profile")
    if not isinstance(profile, str) or not profile.strip():
        raise MigError(f"{where}.profile: give a GPU instance profile name such as 3g.40gb")
    start = item.get("start")
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
        raise MigError(f"{where}.start: {start!r} is not a placement start (an integer >= 0)")
    compute = item.get("compute_profile")
    if compute is not None and (not isinstance(compute, str) or not compute.strip()):
        raise MigError(f"{where}.compute_profile: give a name such as 1c.3g.40gb, or leave it out")
    return Entry(_bare(profile), start, _bare(compute) if compute else None)


def _bare(name: str) -> str:
    name = name.strip()
    return name[4:].strip() if name.upper().startswith("MIG ") else name


# ---------------------------------------------------------------------------------------------
# Reading helpers shared by the backends


def normalise_address(text: str) -> Optional[str]:
    """``0000:17:00.0`` for ``17:00.0``, ``00000000:17:00.0`` or ``0000:17:00.0``; None if not PCI."""
    parts = text.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0"] + parts
    if len(parts) != 3 or "." not in parts[2]:
        return None
    device, dummy, function = parts[2].partition(".")
    try:
        domain, bus, dev, func = (
            int(parts[0], 16),
            int(parts[1], 16),
            int(device, 16),
            int(function, 16),
        )
    except ValueError:
        return None
    if bus > 0xFF or dev > 0x1F or func > 7:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{func}"


def find_gpu(gpus: list, wanted: str, where: str) -> MigGpu:
    """The GPU of ``gpus`` with address or UUID ``wanted``; raises MigError listing the GPUs found."""
    address = normalise_address(wanted)
    for gpu in gpus:
        if address is not None and gpu.address == address:
            return gpu
        if gpu.uuid and gpu.uuid.lower() == wanted.lower():
            return gpu
    found = ", ".join(f"{g.address} ({g.uuid or 'no UUID'})" for g in gpus) or "none"
    raise MigError(
        f"{where}: no NVIDIA GPU {wanted!r} on this host; GPUs found: {found}. "
        "Use one of these PCI addresses or UUIDs"
    )


def ci_name(profile_name: str, gi_slices: int, ci_slices: int) -> str:
    """The compute-instance profile name: ``3g.40gb`` for a full-size CI, else ``1c.3g.40gb``."""
    return profile_name if ci_slices == gi_slices else f"{ci_slices}c.{profile_name}"


# ---------------------------------------------------------------------------------------------
# Fitting a layout into a GPU and the delta against what is there


@dataclass(frozen=True)
class Slot:
    """One GPU instance of the resolved layout: where it goes, its CI, the existing GI it keeps."""

    profile: Profile
    start: int
    size: int
    ci_slices: int
    compute_profile: Optional[str]  # as requested; None = one full-size compute instance
    kept: Optional[GpuInstance]

    @property
    def ci_profile_id(self) -> int:
        """The CI profile id (CI_PROFILE_IDS) of the slot's compute instance."""
        return CI_PROFILE_IDS[self.ci_slices]


@dataclass(frozen=True)
class GpuPlan:
    """What one GPU needs: mode change, GIs to destroy, the slots (kept and new) of its layout.

    ``deferred``: the GPU lists no profiles yet (MIG off), so the layout is fitted after the mode
    change. ``reset_expected``: True when the mode change will stay pending until a GPU reset,
    False when it applies in place, None when the architecture does not tell.
    """

    index: int
    request: Request
    gpu: MigGpu
    profiles: tuple
    profiles_from: Optional[str]
    slots: tuple
    destroy: tuple
    mode_set: bool
    deferred: bool
    reset_expected: Optional[bool]

    @property
    def target(self) -> str:
        """The requested mode."""
        return self.request.mode

    @property
    def creates(self) -> tuple:
        """Slots that need a new GPU instance."""
        return tuple(slot for slot in self.slots if slot.kept is None)

    @property
    def changes_layout(self) -> bool:
        """Whether any GI is destroyed or created (or will be, once the mode is on)."""
        return bool(self.destroy or self.creates or (self.deferred and self.request.layout))


def _profile_by_name(profiles: tuple, name: str, where: str, gpu: MigGpu) -> Profile:
    for profile in profiles:
        if profile.name.lower() == name.lower():
            return profile
    offered = ", ".join(
        p.name for p in sorted(profiles, key=lambda p: (p.slices, p.memory_mib, p.id))
    )
    raise MigError(
        f"{where}.profile: GPU {gpu.address} ({gpu.name or 'unknown model'}) offers no GPU instance "
        f"profile {name!r}; it offers: {offered}. Use one of these names"
    )


def _ci_slices(profile: Profile, name: Optional[str], where: str) -> int:
    if name is None or name.lower() == profile.name.lower():
        slices = profile.slices
    else:
        count, dot, rest = name.partition("c.")
        if not (dot and count.isdigit() and rest.lower() == profile.name.lower()):
            raise MigError(
                f"{where}.compute_profile: {name!r} is not a compute profile of {profile.name}; "
                f"write it as <N>c.{profile.name} (e.g. 1c.{profile.name}) or leave it out for one "
                "full-size compute instance"
            )
        slices = int(count)
    if slices not in CI_PROFILE_IDS or slices > profile.slices:
        valid = sorted(n for n in CI_PROFILE_IDS if n <= profile.slices)
        raise MigError(
            f"{where}.compute_profile: {name!r} asks for {slices} slices; a {profile.name} GPU "
            f"instance takes compute instances of {', '.join(map(str, valid))} slices"
        )
    return slices


def _gi_matches(gi: GpuInstance, profile: Profile, start: Optional[int], ci_slices: int) -> bool:
    if gi.profile_id != profile.id or (start is not None and gi.start != start):
        return False
    return len(gi.compute_instances) == 1 and gi.compute_instances[0].slices == ci_slices


def _search(wants: list, fixed: dict) -> Optional[dict]:
    """{want index: (start, size)} fitting every want with ``fixed`` held; None when none fits."""
    taken = list(fixed.values())
    counts: dict = {}
    for index in fixed:
        counts[wants[index][1].id] = counts.get(wants[index][1].id, 0) + 1
    free = [i for i in range(len(wants)) if i not in fixed]
    free.sort(key=lambda i: (wants[i][0].start is None, -wants[i][1].slices, i))
    chosen: dict = dict(fixed)

    def place(position: int) -> bool:
        if position == len(free):
            return True
        index = free[position]
        entry, profile = wants[index][0], wants[index][1]
        if counts.get(profile.id, 0) >= profile.max_count:
            return False
        for start, size in profile.placements:
            if entry.start is not None and start != entry.start:
                continue
            if any(start < s + z and s < start + size for s, z in taken):
                continue
            taken.append((start, size))
            counts[profile.id] = counts.get(profile.id, 0) + 1
            chosen[index] = (start, size)
            if place(position + 1):
                return True
            taken.pop()
            counts[profile.id] -= 1
            del chosen[index]
        return False

    return chosen if place(0) else None


def layout_text(entries) -> str:
    """``[3g.40gb@4, 1c.2g.20gb]``: a requested layout for messages."""
    words = []
    for entry in entries:
        word = entry.compute_profile or entry.profile
        if entry.compute_profile and not entry.compute_profile.endswith(entry.profile):
            word = f"{entry.profile} ({entry.compute_profile})"
        words.append(word + (f"@{entry.start}" if entry.start is not None else ""))
    return "[" + ", ".join(words) + "]"


def fit_layout(gpu: MigGpu, profiles: tuple, entries: tuple, where: str) -> tuple:
    """(slots sorted by start, GIs to destroy) for ``entries`` on ``gpu``; raises MigError.

    Existing GIs that match an entry (profile, start when given, CI size) are kept in place; the
    rest are placed by backtracking over each profile's placements, never overlapping, within
    each profile's max_count. When no fit keeps the existing GIs, a fit that re-creates all of
    them is tried.
    """
    wants = []
    for number, entry in enumerate(entries):
        at = f"{where}.layout[{number}]"
        profile = _profile_by_name(profiles, entry.profile, at, gpu)
        if entry.start is not None and entry.start not in [s for s, z in profile.placements]:
            starts = ", ".join(str(s) for s, z in profile.placements) or "none"
            raise MigError(
                f"{at}.start: {entry.start} is not a placement of {profile.name} on GPU "
                f"{gpu.address}; its placements start at {starts}. Use one of them or leave start out"
            )
        wants.append((entry, profile, _ci_slices(profile, entry.compute_profile, at)))
    kept: dict = {}
    used: set = set()
    for index in sorted(range(len(wants)), key=lambda i: (wants[i][0].start is None, i)):
        entry, profile, slices = wants[index]
        for gi in gpu.gpu_instances:
            if gi.id not in used and _gi_matches(gi, profile, entry.start, slices):
                kept[index] = gi
                used.add(gi.id)
                break
    chosen = _search(wants, {i: (gi.start, gi.size) for i, gi in kept.items()})
    if chosen is None and kept:
        kept = {}
        chosen = _search(wants, {})
    if chosen is None:
        total = max((s + z for p in profiles for s, z in p.placements), default=0)
        raise MigError(
            f"{where}.layout: {layout_text(entries)} does not fit GPU {gpu.address} "
            f"({gpu.name or 'unknown model'}, {total} memory slices): the profiles' placements "
            "overlap or a profile is asked for more often than its max count. Use fewer or smaller "
            "profiles, or other starts (see gpu_topology_facts mig.supported_profiles)"
        )
    slots = [
        Slot(
            profile=wants[i][1],
            start=chosen[i][0],
            size=chosen[i][1],
            ci_slices=wants[i][2],
            compute_profile=wants[i][0].compute_profile,
            kept=kept.get(i),
        )
        for i in range(len(wants))
    ]
    keep_ids = {gi.id for gi in kept.values()}
    destroy = tuple(gi for gi in gpu.gpu_instances if gi.id not in keep_ids)
    return tuple(sorted(slots, key=lambda s: (s.start, s.profile.id))), destroy


def _borrowed_profiles(gpu: MigGpu, gpus: list) -> tuple:
    if gpu.profiles:
        return gpu.profiles, None
    for other in gpus:
        if other.profiles and other.name and other.name == gpu.name:
            return other.profiles, other.address
    return (), None


def _reset_expected(gpu: MigGpu, target: str) -> Optional[bool]:
    if gpu.mode_current == target:
        return False
    if gpu.mode_pending == target and gpu.mode_pending != gpu.mode_current:
        return True  # already set, still pending: only a reset (or reboot) applies it
    if gpu.architecture is None:
        return None
    return gpu.architecture in RESET_ARCHITECTURES


def plan_gpu(index: int, request: Request, gpus: list) -> GpuPlan:
    """The plan of one requested GPU against ``gpus`` as read; raises MigError."""
    where = _where(index)
    gpu = find_gpu(gpus, request.gpu, f"{where}.gpu")
    if request.uuid and gpu.uuid and gpu.uuid.lower() != request.uuid.lower():
        named = request.gpu if request.gpu == gpu.address else f"{request.gpu} ({gpu.address})"
        raise MigError(
            f"{where}.uuid: GPU {named} has UUID {gpu.uuid}, not "
            f"{request.uuid} as planned: the GPU was replaced or the plan is stale. Nothing was "
            "changed; re-gather facts and re-plan"
        )
    if gpu.mode_current is None:
        if request.mode == "enabled":
            raise MigError(
                f"{where}: GPU {gpu.address} ({gpu.name or 'unknown model'}) does not support MIG; "
                "remove it from gpus or set mode: disabled"
            )
        return GpuPlan(index, request, gpu, (), None, (), (), False, False, False)
    target = request.mode
    mode_set = gpu.mode_current != target or gpu.mode_pending != target
    profiles, source = _borrowed_profiles(gpu, gpus)
    slots, destroy, deferred = (), (), False
    if target == "disabled":
        destroy = gpu.gpu_instances
    elif profiles:
        slots, destroy = fit_layout(gpu, profiles, request.layout, where)
    elif gpu.mode_current == "enabled":
        raise MigError(
            f"{where}: GPU {gpu.address} has MIG enabled but its driver lists no GPU instance "
            "profiles; check the driver (nvidia-smi mig -lgip) and run again"
        )
    else:
        deferred = bool(request.layout)
    return GpuPlan(
        index=index,
        request=request,
        gpu=gpu,
        profiles=profiles,
        profiles_from=source,
        slots=slots,
        destroy=destroy,
        mode_set=mode_set,
        deferred=deferred,
        reset_expected=_reset_expected(gpu, target),
    )


def plan(gpus: list, requests: list) -> list[GpuPlan]:
    """Plans of every request, in order; raises MigError (also for a GPU listed twice)."""
    plans, seen = [], {}
    for index, request in enumerate(requests):
        one = plan_gpu(index, request, gpus)
        if one.gpu.address in seen:
            raise MigError(
                f"{_where(index, 'gpu')}: GPU {one.gpu.address} is already listed as "
                f"{_where(seen[one.gpu.address])}; list each GPU once"
            )
        seen[one.gpu.address] = index
        plans.append(one)
    return plans


def gpu_actions(one: GpuPlan) -> list[Action]:
    """The backend actions of ``one``, in order: destroy CIs and GIs, set the mode, create GIs+CIs.

    A deferred layout has no create actions yet: they are planned after the mode change.
    """
    address = one.gpu.address
    actions = []
    for gi in sorted(one.destroy, key=lambda g: g.id):
        for ci in gi.compute_instances:
            actions.append(
                Action(DESTROY_CI, address, gpu_instance_id=gi.id, compute_instance_id=ci.id)
            )
        actions.append(Action(DESTROY_GI, address, gpu_instance_id=gi.id))
    if one.mode_set:
        actions.append(Action(SET_MODE, address, enabled=one.target == "enabled"))
    for slot in one.creates:
        actions.extend(create_actions(address, slot))
    return actions


def create_actions(address: str, slot: Slot) -> list[Action]:
    """create_gi then create_ci of one new slot."""
    full = slot.ci_slices == slot.profile.slices
    return [
        Action(
            CREATE_GI,
            address,
            profile_id=slot.profile.id,
            start=slot.start,
            profile_name=slot.profile.name,
        ),
        Action(
            CREATE_CI,
            address,
            profile_id=slot.ci_profile_id,
            profile_name=ci_name(slot.profile.name, slot.profile.slices, slot.ci_slices),
            slices=slot.ci_slices,
            full=full,
        ),
    ]


def smi_command(action: Action) -> str:
    """The ``nvidia-smi`` command line that performs ``action`` (for would_run and the smi backend)."""
    address = action.address
    if action.kind == SET_MODE:
        return f"nvidia-smi -i {address} -mig {1 if action.enabled else 0}"
    gi = "<new>" if action.gpu_instance_id is None else str(action.gpu_instance_id)
    if action.kind == DESTROY_CI:
        return f"nvidia-smi mig -i {address} -dci -gi {gi} -ci {action.compute_instance_id}"
    if action.kind == DESTROY_GI:
        return f"nvidia-smi mig -i {address} -dgi -gi {gi}"
    if action.kind == CREATE_GI:
        return f"nvidia-smi mig -i {address} -cgi {action.profile_id}:{action.start}"
    return f"nvidia-smi mig -i {address} -cci {action.profile_id} -gi {gi}"


# ---------------------------------------------------------------------------------------------
# Processes, their units, and what blocks a GPU reset


# What a holder that blocks a reset is told (DAEMONS' comm -> the fix); nv-fabricmanager does
# not stop a reset, so it is not here.
_RESET_FIXES = {
    "nvidia-persistenced": "nvidia-persistenced (pid {pid}) keeps the GPUs open; "
    "stop nvidia-persistenced.service for the reset, or reboot instead",
    "nvidia-persiste": "nvidia-persistenced (pid {pid}) keeps the GPUs open; "
    "stop nvidia-persistenced.service for the reset, or reboot instead",
    "nv-hostengine": "nv-hostengine (DCGM, pid {pid}) keeps the GPUs open; "
    "stop nvidia-dcgm.service for the reset, or reboot instead",
}
_DRM_FIX = (
    "the nvidia_drm kernel module is loaded (a display or DRM client may hold the GPU); "
    "unload it (modprobe -r nvidia_drm) for the reset, or reboot instead"
)


def reset_blockers(holders: list) -> list[str]:
    """Sorted reasons a GPU reset would fail, from read_holders' ``holders``:
    nvidia-persistenced, nv-hostengine, nvidia_drm."""
    found = set()
    for holder in holders:
        if holder.kind == KIND_MODULE:
            found.add(_DRM_FIX)
        elif holder.kind == KIND_DAEMON and holder.comm in _RESET_FIXES:
            found.add(_RESET_FIXES[holder.comm].format(pid=holder.pid))
    return sorted(found)


def read_reset_blockers(procfs_root: str = "/proc", sysfs_root: str = "/sys") -> list[str]:
    """reset_blockers of the host behind procfs_root and sysfs_root (mig_holders.read_holders)."""
    return reset_blockers(read_holders(procfs_root, sysfs_root))


@dataclass(frozen=True)
class Busy:
    """A process that a change would disrupt, and its systemd unit (None when unknown)."""

    address: str
    pid: int
    unit: Optional[str]

    def as_dict(self) -> dict:
        """{address, pid, unit}."""
        return {"address": self.address, "pid": self.pid, "unit": self.unit}


def _reset_wanted(one: GpuPlan, reset_ok: bool, blockers: list) -> bool:
    return bool(reset_ok and not blockers and one.reset_expected)


def disrupted_pids(one: GpuPlan, reset: bool) -> tuple:
    """(PIDs a plan would disrupt, what disrupts them): every process for a mode change or reset,
    else those on a GI to destroy (an unattributed process counts as on every GI)."""
    processes = one.gpu.processes
    if not processes:
        return (), ""
    if one.mode_set or reset:
        what = "a MIG mode change" if one.mode_set else "a GPU reset"
        return tuple(sorted({pid for pid, dummy in processes})), what
    destroyed = {gi.id for gi in one.destroy}
    pids = sorted({pid for pid, gi in processes if destroyed and (gi is None or gi in destroyed)})
    ids = ", ".join(str(i) for i in sorted(destroyed))
    return tuple(pids), f"destroying GPU instance(s) {ids}"


def find_busy(plans: list, reset_ok: bool, blockers: list, procfs_root: Optional[str]) -> tuple:
    """(Busy entries, {address: what disrupts}); units from <procfs_root>/<pid>/cgroup."""
    busy, what = [], {}
    for one in plans:
        pids, reason = disrupted_pids(one, _reset_wanted(one, reset_ok, blockers))
        for pid in pids:
            unit = read_pid_unit(procfs_root, pid) if procfs_root else None
            busy.append(Busy(one.gpu.address, pid, unit))
        if pids:
            what[one.gpu.address] = reason
    return busy, what


def disruption(one: GpuPlan, reset: bool) -> str:
    """What of ``one`` needs the GPU free of holders ('a MIG mode change', 'a GPU reset',
    'destroying GPU instance(s) 2, 3'), or '' when it only creates instances (or nothing)."""
    if one.mode_set:
        return "a MIG mode change"
    if reset:
        return "a GPU reset"
    if one.destroy:
        return f"destroying GPU instance(s) {', '.join(str(gi.id) for gi in one.destroy)}"
    return ""


def check_holders(plans: list, holders: list, reset_ok: bool, blockers: list, owned_units) -> tuple:
    """(Busy entries of owned processes that hold a GPU a plan disrupts, the holders of the
    listed GPUs); raises MigError listing every foreign holder (mig_holders.foreign) of a GPU
    whose instances would be destroyed, whose mode would change or that would be reset."""
    blocked: dict = {}
    what: dict = {}
    extra = []
    listed = []
    for one in plans:
        address = one.gpu.address
        on_gpu = [h for h in holders if h.holds(address)]
        listed.extend(h for h in on_gpu if h not in listed)
        reason = disruption(one, _reset_wanted(one, reset_ok, blockers))
        if not reason or not on_gpu:
            continue
        strangers = foreign(on_gpu, owned_units)
        if strangers:
            blocked[address], what[address] = strangers, reason
            continue
        extra.extend(Busy(address, h.pid, h.unit) for h in on_gpu)
    if blocked:
        raise MigError(holders_message(blocked, what))
    return extra, tuple(listed)


def units_to_stop(busy: list, what: dict, owned_units: list) -> list[str]:
    """Owned units to stop so that the change can run; raises MigError when another process is busy."""
    owned = set(owned_units)
    strangers = [b for b in busy if b.unit is None or b.unit not in owned]
    if strangers:
        lines = []
        for address in sorted({b.address for b in strangers}):
            procs = ", ".join(
                f"pid {b.pid} ({b.unit or 'not in a systemd service'})"
                for b in strangers
                if b.address == address
            )
            lines.append(f"GPU {address} ({what[address]}): {procs}")
        raise MigError(
            "processes use the GPUs this change would disrupt: "
            + "; ".join(lines)
            + ". Stop them and run again, or list their units in owned_units so that the module "
            "stops and restarts them around the change"
        )
    return sorted({b.unit for b in busy if b.unit})


# ---------------------------------------------------------------------------------------------
# Running a change: predict (check/render mode) or apply, then re-read and check


@dataclass(frozen=True)
class Host:
    """How the core reaches the host: a runner ``argv -> (rc, stdout, stderr)`` and its paths."""

    runner: Optional[Callable] = None
    nvidia_smi: str = "nvidia-smi"
    systemctl: str = "systemctl"
    procfs_root: str = "/proc"
    sysfs_root: str = "/sys"
    # PIDs that hold the GPUs for this change itself (the module's own process has NVML open)
    exclude_pids: tuple = ()


@dataclass(frozen=True)
class GpuOutcome:
    """One listed GPU after the run (or as predicted): mode, layout, reset state, action lines."""

    plan: GpuPlan
    mode_current: Optional[str]
    mode_pending: Optional[str]
    reset_required: bool
    layout: tuple  # dicts: profile, start, size, gpu_instance_id, compute_profile, device_uuid
    actions: tuple  # str
    before: tuple  # str lines
    after: tuple  # str lines

    @property
    def changed(self) -> bool:
        """Whether anything ran (or would run) on this GPU."""
        return bool(self.actions) and any(not a.startswith("note: ") for a in self.actions)


@dataclass(frozen=True)
class Outcome:
    """Everything the module reports about the GPUs."""

    gpus: tuple  # GpuOutcome
    busy: tuple  # Busy
    stopped_units: tuple
    reset_blockers: tuple
    would_run: tuple
    ran: tuple
    holders: tuple = ()  # mig_holders.Holder of the listed GPUs (reported, never stopped)

    @property
    def changed(self) -> bool:
        """Whether a GPU was (or would be) changed."""
        return any(g.changed for g in self.gpus)


def _profile_names(one: GpuPlan, gpu: MigGpu) -> dict:
    return {p.id: p for p in (gpu.profiles or one.profiles)}


def _gi_line(gi: GpuInstance, profiles: dict) -> str:
    profile = profiles.get(gi.profile_id)
    name = profile.name if profile else f"profile {gi.profile_id}"
    slices = profile.slices if profile else None
    cis = ", ".join(f"CI {ci.id} {ci_name(name, slices, ci.slices)}" for ci in gi.compute_instances)
    return f"{name}@{gi.start} (GI {gi.id}, {cis or 'no CI'})"


def _mode_line(gpu: MigGpu) -> str:
    if gpu.mode_current is None:
        return "mode unsupported"
    line = f"mode {gpu.mode_current}"
    return line + (f" (pending {gpu.mode_pending})" if gpu.mode_pending != gpu.mode_current else "")


def state_lines(one: GpuPlan, gpu: MigGpu) -> tuple:
    """Diff lines of a GPU as read: its mode, then one line per GI by start."""
    profiles = _profile_names(one, gpu)
    gis = sorted(gpu.gpu_instances, key=lambda g: (g.start, g.id))
    return tuple([_mode_line(gpu)] + [_gi_line(gi, profiles) for gi in gis])


def _layout_of(one: GpuPlan, gpu: MigGpu) -> tuple:
    profiles = _profile_names(one, gpu)
    out = []
    for gi in sorted(gpu.gpu_instances, key=lambda g: (g.start, g.id)):
        profile = profiles.get(gi.profile_id)
        name = profile.name if profile else None
        single = gi.compute_instances[0] if len(gi.compute_instances) == 1 else None
        compute = None
        if single is not None and profile is not None and single.slices != profile.slices:
            compute = ci_name(profile.name, profile.slices, single.slices)
        out.append(
            {
                "profile": name,
                "start": gi.start,
                "size": gi.size,
                "gpu_instance_id": gi.id,
                "compute_profile": compute,
                "device_uuid": single.device_uuid if single else None,
            }
        )
    return tuple(out)


def _predicted_layout(one: GpuPlan) -> tuple:
    out = []
    for slot in one.slots:
        kept = slot.kept
        single = kept.compute_instances[0] if kept else None
        full = slot.ci_slices == slot.profile.slices
        out.append(
            {
                "profile": slot.profile.name,
                "start": slot.start,
                "size": slot.size,
                "gpu_instance_id": kept.id if kept else None,
                "compute_profile": None
                if full
                else ci_name(slot.profile.name, slot.profile.slices, slot.ci_slices),
                "device_uuid": single.device_uuid if single else None,
            }
        )
    if one.deferred:
        for entry in one.request.layout:
            out.append(
                {
                    "profile": entry.profile,
                    "start": entry.start,
                    "size": None,
                    "gpu_instance_id": None,
                    "compute_profile": entry.compute_profile,
                    "device_uuid": None,
                }
            )
    return tuple(out)


def _predicted_lines(one: GpuPlan, mode: Optional[str], pending: Optional[str]) -> tuple:
    lines = [_mode_line(replace_mode(one.gpu, mode, pending))]
    for item in _predicted_layout(one):
        gi = "new" if item["gpu_instance_id"] is None else item["gpu_instance_id"]
        kept = next(
            (s.kept for s in one.slots if s.kept and s.kept.id == item["gpu_instance_id"]), None
        )
        if kept is not None:
            lines.append(_gi_line(kept, _profile_names(one, one.gpu)))
            continue
        compute = item["compute_profile"] or item["profile"]
        start = "?" if item["start"] is None else item["start"]
        lines.append(f"{item['profile']}@{start} (GI {gi}, CI new {compute})")
    return tuple(lines)


def replace_mode(gpu: MigGpu, current: Optional[str], pending: Optional[str]) -> MigGpu:
    """``gpu`` with other mode values (a prediction)."""
    return MigGpu(
        gpu.address,
        gpu.index,
        gpu.uuid,
        gpu.name,
        gpu.architecture,
        current,
        pending,
        gpu.profiles,
        gpu.gpu_instances,
        gpu.processes,
    )


def _deferred_line(one: GpuPlan) -> str:
    return (
        f"note: create {layout_text(one.request.layout)} on {one.gpu.address} once MIG mode is "
        "enabled (the GPU lists its profiles only then)"
    )


def predict(
    backend, plans: list, reset_ok: bool, blockers: list, stop: list, busy: list
) -> Outcome:
    """The outcome of ``plans`` without touching a GPU (check mode, render mode)."""
    outcomes, would_run = [], [f"systemctl stop {unit}" for unit in stop]
    busy_addresses = {b.address for b in busy if b.unit not in stop}
    for one in plans:
        lines = [
            backend.describe(a)
            for a in gpu_actions(one)
            if a.kind in (DESTROY_CI, DESTROY_GI, SET_MODE)
        ]
        mode, pending, reset_required = one.gpu.mode_current, one.gpu.mode_pending, False
        blocked = False
        if one.mode_set or one.gpu.mode_current != one.target:
            pending = one.target
            if one.reset_expected is None:
                lines.append(
                    f"note: GPU {one.gpu.address}'s architecture is unknown, so the mode change "
                    "may need a GPU reset"
                )
                mode = one.target
            elif one.reset_expected:
                if reset_ok and not blockers and one.gpu.address not in busy_addresses:
                    lines.append(RESET_COMMAND.format(address=one.gpu.address))
                    mode = one.target
                else:
                    reset_required, blocked = True, True
            else:
                mode = one.target
        if not blocked:
            for slot in one.creates:
                lines.extend(backend.describe(a) for a in create_actions(one.gpu.address, slot))
            if one.deferred:
                lines.append(_deferred_line(one))
        would_run.extend(line for line in lines if not line.startswith("note: "))
        before = state_lines(one, one.gpu)
        after = (
            _predicted_lines(one, mode, pending)
            if not blocked
            else (_mode_line(replace_mode(one.gpu, mode, pending)),) + before[1:]
        )
        layout = _predicted_layout(one) if not blocked else _layout_of(one, one.gpu)
        if one.target == "disabled" and not blocked:
            layout, after = (), after[:1]
        outcomes.append(
            GpuOutcome(one, mode, pending, reset_required, layout, tuple(lines), before, after)
        )
    would_run.extend(f"systemctl start {unit}" for unit in stop)
    return Outcome(tuple(outcomes), tuple(busy), tuple(stop), tuple(blockers), tuple(would_run), ())


class _Runner:
    """Runs host commands and backend actions, recording each line in ``ran``."""

    def __init__(self, backend, host: Host) -> None:
        self.backend = backend
        self.host = host
        self.ran: list = []

    def command(self, argv: list, text: str, fix: str) -> None:
        rc, out, err = self.host.runner(argv)
        if rc != 0:
            said = (err or out or "").strip().splitlines()
            raise MigError(f"{text} failed (rc {rc}): {said[0] if said else 'no output'}. {fix}")
        self.ran.append(text)

    def action(self, action: Action, lines: list):
        text = self.backend.describe(action)
        address = action.address
        if action.kind == DESTROY_CI:
            self.backend.destroy_compute_instance(
                address, action.gpu_instance_id, action.compute_instance_id
            )
            result = None
        elif action.kind == DESTROY_GI:
            self.backend.destroy_gpu_instance(address, action.gpu_instance_id)
            result = None
        elif action.kind == SET_MODE:
            self.backend.set_mode(address, bool(action.enabled))
            result = None
        elif action.kind == CREATE_GI:
            result = self.backend.create_gpu_instance(address, action.profile_id, action.start)
        else:
            result = self.backend.create_compute_instance(
                address, action.gpu_instance_id, action.profile_id
            )
        self.ran.append(text)
        lines.append(text)
        return result


def reread(backend, address: str) -> MigGpu:
    """``address`` as the backend reads it now; raises MigError when it is gone."""
    for gpu in backend.read():
        if gpu.address == address:
            return gpu
    raise MigError(
        f"GPU {address} is no longer listed by the driver after a MIG change; check dmesg"
    )


def _apply_gpu(run: _Runner, one: GpuPlan, reset_ok: bool, blockers: list) -> tuple:
    """(GPU read after the changes, slots to check or None when a reset is pending, lines)."""
    lines: list = []
    address = one.gpu.address
    for action in gpu_actions(one):
        if action.kind in (DESTROY_CI, DESTROY_GI, SET_MODE):
            run.action(action, lines)
    gpu = reread(run.backend, address) if one.mode_set else one.gpu
    if gpu.mode_current != one.target:
        why = "the MIG mode change is pending until the GPU is reset (or the host rebooted)"
        if not reset_ok:
            lines.append(f"note: {why}; set reset_ok to reset it")
            return gpu, None, lines
        if blockers:
            lines.append(f"note: {why}; not reset: " + "; ".join(blockers))
            return gpu, None, lines
        if gpu.processes:
            pids = ", ".join(str(pid) for pid, dummy in gpu.processes)
            lines.append(f"note: {why}; not reset: processes {pids} use it")
            return gpu, None, lines
        text = RESET_COMMAND.format(address=address)
        run.command(
            [run.host.nvidia_smi, "--gpu-reset", "-i", address],
            text,
            "Stop whatever holds the GPU (nvidia-persistenced, DCGM, X) or reboot the host",
        )
        lines.append(text)
        gpu = reread(run.backend, address)
        if gpu.mode_current != one.target:
            raise MigError(
                f"GPU {address}: MIG mode is still {gpu.mode_current} after {text} "
                f"(pending {gpu.mode_pending}); reboot the host to apply the mode change"
            )
    slots = one.slots
    if one.deferred or (one.mode_set and one.target == "enabled"):
        profiles = gpu.profiles or one.profiles
        if not profiles:
            raise MigError(
                f"{_where(one.index)}: GPU {address} lists no GPU instance profiles although "
                "MIG is enabled; check the driver (nvidia-smi mig -lgip) and run again"
            )
        slots, destroy = fit_layout(gpu, profiles, one.request.layout, _where(one.index))
        for gi in destroy:
            for ci in gi.compute_instances:
                run.action(
                    Action(DESTROY_CI, address, gpu_instance_id=gi.id, compute_instance_id=ci.id),
                    lines,
                )
            run.action(Action(DESTROY_GI, address, gpu_instance_id=gi.id), lines)
    for slot in slots:
        if slot.kept is not None and slot.kept in gpu.gpu_instances:
            continue
        create_gi, create_ci = create_actions(address, slot)
        gi_id = run.action(create_gi, lines)
        run.action(replace(create_ci, gpu_instance_id=int(gi_id)), lines)
    return gpu, slots, lines


def layout_differences(gpu: MigGpu, target: str, slots: tuple, profiles: tuple) -> list[str]:
    """What the GPU as read lacks or has on top of ``slots``; [] when it matches."""
    names = {p.id: p.name for p in (gpu.profiles or profiles)}
    problems = []
    if gpu.mode_current != target:
        problems.append(f"MIG mode is {gpu.mode_current}, not {target}")
    have = [
        (gi.profile_id, gi.start, tuple(ci.slices for ci in gi.compute_instances), gi.id)
        for gi in gpu.gpu_instances
    ]
    for slot in slots:
        key = (slot.profile.id, slot.start, (slot.ci_slices,))
        match = next((h for h in have if h[:3] == key), None)
        if match is None:
            compute = ci_name(slot.profile.name, slot.profile.slices, slot.ci_slices)
            problems.append(f"{slot.profile.name}@{slot.start} with CI {compute} is missing")
        else:
            have.remove(match)
    for profile_id, start, cis, gi_id in have:
        problems.append(
            f"GI {gi_id} ({names.get(profile_id, f'profile {profile_id}')}@{start}, "
            f"{len(cis)} CI) is not in the layout"
        )
    return problems


def apply(
    backend, host: Host, plans: list, reset_ok: bool, blockers: list, stop: list, busy: list
) -> Outcome:
    """Run ``plans``: stop owned units, change each GPU, re-read and check, start the units again.

    Raises MigError (the units stopped are started again first) or MigBackendError.
    """
    run = _Runner(backend, host)
    stopped: list = []
    results: list = []
    error: Optional[Exception] = None
    try:
        for unit in stop:
            run.command(
                [host.systemctl, "stop", unit],
                f"systemctl stop {unit}",
                "Check the unit (systemctl status) and run again",
            )
            stopped.append(unit)
        if stop:
            plans = _after_stop(backend, plans, reset_ok, blockers)
        for one in plans:
            results.append((one,) + _apply_gpu(run, one, reset_ok, blockers))
        final = {gpu.address: gpu for gpu in backend.read()}
    except MigError as exc:
        error = exc
    failed_starts = []
    for unit in stopped:
        try:
            run.command(
                [host.systemctl, "start", unit], f"systemctl start {unit}", "Start it by hand"
            )
        except MigError as exc:
            failed_starts.append(str(exc))
    if error is not None:
        if failed_starts:
            raise MigError(f"{error} Also, after it: {'; '.join(failed_starts)}") from None
        raise error
    if failed_starts:
        raise MigError("the MIG change was applied, but " + "; ".join(failed_starts))
    return _applied_outcome(plans, results, final, busy, stopped, blockers, run.ran)


def _after_stop(backend, plans: list, reset_ok: bool, blockers: list) -> list:
    fresh = backend.read()
    replanned = plan(fresh, [one.request for one in plans])
    for one in replanned:
        pids, what = disrupted_pids(one, _reset_wanted(one, reset_ok, blockers))
        if pids:
            raise MigError(
                f"GPU {one.gpu.address}: processes {', '.join(map(str, pids))} still use it after "
                f"the owned units were stopped, so {what} cannot run; stop them and run again"
            )
    return replanned


def _applied_outcome(plans, results, final, busy, stopped, blockers, ran) -> Outcome:
    outcomes = []
    for one, gpu, slots, lines in results:
        after = final.get(one.gpu.address, gpu)
        pending = slots is None
        if not pending:
            problems = layout_differences(after, one.target, slots, one.profiles)
            if one.gpu.mode_current is None and one.target == "disabled":
                problems = []
            if problems:
                raise MigError(
                    f"GPU {one.gpu.address}: after the change the layout differs from "
                    f"{layout_text(one.request.layout)}: {'; '.join(problems)}. The driver refused "
                    "part of it; see nvidia-smi mig -lgi and run again"
                )
        outcomes.append(
            GpuOutcome(
                plan=one,
                mode_current=after.mode_current,
                mode_pending=after.mode_pending,
                reset_required=pending,
                layout=_layout_of(one, after),
                actions=tuple(lines),
                before=state_lines(one, one.gpu),
                after=state_lines(one, after),
            )
        )
    return Outcome(tuple(outcomes), tuple(busy), tuple(stopped), tuple(blockers), (), tuple(ran))


def converge(
    backend,
    requests: list,
    host: Host,
    check_mode: bool = False,
    render: bool = False,
    reset_ok: bool = False,
    owned_units: tuple = (),
) -> Outcome:
    """Read, plan, check for busy GPUs, then predict (check/render) or apply; raises MigError.

    Render mode (a snapshot backend) never runs anything and reports the snapshot's busy
    processes without refusing; otherwise a change that disrupts a process outside
    ``owned_units`` is refused. In every mode, a change that destroys instances, changes a mode
    or resets a GPU that a holder outside ``owned_units`` has open (check_holders: processes
    with /dev/nvidia* open, nvidia-persistenced, DCGM, nv-fabricmanager, nvidia_drm) is refused
    with the full list.
    """
    plans = plan(backend.read(), requests)
    # Every holder of a GPU whose instances are destroyed or whose mode changes, also those
    # NVML does not list, in every mode (render mode reads the roots it is given); one scan of
    # the processes serves the reset blockers too.
    holders = read_holders(host.procfs_root, host.sysfs_root, None, host.exclude_pids)
    blockers = [] if render else reset_blockers(holders)
    busy, what = find_busy(plans, reset_ok, blockers, None if render else host.procfs_root)
    extra, listed = check_holders(plans, holders, reset_ok, blockers, owned_units)
    known = {(b.address, b.pid) for b in busy}
    for item in extra:
        if (item.address, item.pid) not in known:
            busy.append(item)
            what.setdefault(item.address, disruption_of(plans, item.address, reset_ok, blockers))
    stop = [] if render else units_to_stop(busy, what, owned_units)
    if check_mode or render:
        outcome = predict(backend, plans, reset_ok, blockers, stop, busy)
    else:
        outcome = apply(backend, host, plans, reset_ok, blockers, stop, busy)
    gpus = tuple(
        replace(item, actions=item.actions + holder_notes(item.plan, listed, reset_ok, blockers))
        for item in outcome.gpus
    )
    return replace(outcome, gpus=gpus, holders=listed)


def holder_notes(one: GpuPlan, holders: tuple, reset_ok: bool, blockers: list) -> tuple:
    """'note: ...' action lines naming the (not blocking) holders of ``one``'s GPU."""
    reason = disruption(one, _reset_wanted(one, reset_ok, blockers))
    how = (
        f"its unit is stopped and started around {reason}"
        if reason
        else "creating instances in free slices does not disturb it"
    )
    return tuple(
        f"note: GPU {one.gpu.address} is held by {h.text()}; {how}"
        for h in holders
        if h.holds(one.gpu.address)
    )


def disruption_of(plans: list, address: str, reset_ok: bool, blockers: list) -> str:
    """disruption() of the plan of GPU ``address``."""
    one = next(item for item in plans if item.gpu.address == address)
    return disruption(one, _reset_wanted(one, reset_ok, blockers))


# ---------------------------------------------------------------------------------------------
# Files: the recorded layout, the boot program and its unit, the mig-parted config

STATE_FORMAT = "numafleet.tuning/mig-layout"
STATE_VERSION = 1
DEFAULT_STATE_PATH = "/etc/numafleet/mig.json"
DEFAULT_BOOT_PROGRAM_PATH = "/usr/local/libexec/numafleet-mig"
DEFAULT_MIG_PARTED_PATH = "/etc/numafleet/mig-parted.yaml"
UNIT_NAME = "numafleet-mig.service"
PYTHON = "/usr/bin/python3"


def _recorded_layout(one: GpuPlan, outcome: GpuOutcome) -> list:
    if one.target == "disabled":
        return []
    if one.slots and not one.deferred:
        return [
            {
                "profile": s.profile.name,
                "start": s.start,
                "compute_profile": None
                if s.ci_slices == s.profile.slices
                else ci_name(s.profile.name, s.profile.slices, s.ci_slices),
            }
            for s in one.slots
        ]
    if not one.deferred and outcome.layout:
        return [
            {"profile": i["profile"], "start": i["start"], "compute_profile": i["compute_profile"]}
            for i in outcome.layout
        ]
    return [
        {"profile": e.profile, "start": e.start, "compute_profile": e.compute_profile}
        for e in one.request.layout
    ]


def state_text(outcome: Outcome, mig_parted_path: Optional[str] = None) -> str:
    """The JSON of the state file: format, version, each listed GPU's mode and layout, and
    where the mig-parted config was written (None: nowhere), so a later run can remove it."""
    gpus = []
    for item in sorted(outcome.gpus, key=lambda g: g.plan.gpu.address):
        one = item.plan
        gpus.append(
            {
                "address": one.gpu.address,
                "uuid": one.gpu.uuid,
                "mode": one.target,
                "layout": _recorded_layout(one, item),
            }
        )
    data = {"format": STATE_FORMAT, "version": STATE_VERSION, "gpus": gpus}
    if mig_parted_path:
        data["mig_parted_config"] = mig_parted_path
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def recorded_parted_path(text: Optional[str], path: str = DEFAULT_STATE_PATH) -> Optional[str]:
    """The mig-parted config path an earlier run recorded in the state file text, or None.

    None too when there is no state file (``text`` None). Raises MigError, naming ``path`` and
    the fix, when the state file is not a numafleet MIG state (not JSON, another format or
    version): it is never silently rewritten, as the hugepages state and the manifests are not.
    """
    if text is None:
        return None
    fix = (
        "the MIG state file of numafleet.tuning is damaged. Restore it from the last run, or "
        "remove it and run again (a mig-parted config an earlier run wrote at another path is "
        "then no longer removed; remove it by hand)"
    )
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise MigError(f"{path}: is not JSON ({exc}); {fix}") from None
    if (
        not isinstance(data, dict)
        or data.get("format") != STATE_FORMAT
        or data.get("version") != STATE_VERSION
        or not isinstance(data.get("gpus", []), list)
    ):
        raise MigError(f"{path}: is not a {STATE_FORMAT} version {STATE_VERSION} file; {fix}")
    found = data.get("mig_parted_config")
    if found is not None and not isinstance(found, str):
        raise MigError(f"{path}: mig_parted_config is {found!r}, not a path; {fix}")
    return found if found and found.startswith("/") else None


def is_our_parted_config(text: str, header: str = "# Managed by numafleet.tuning") -> bool:
    """Whether ``text`` is a mig-parted config this module wrote (header and config name)."""
    return text.startswith(f"{header}\nversion: v1\nmig-configs:\n  numafleet:\n")


def mig_parted_text(outcome: Outcome, header: str) -> str:
    """A mig-parted config (config name ``numafleet``): one entry per listed GPU, by index."""
    lines = [header, "version: v1", "mig-configs:", "  numafleet:"]
    for item in sorted(
        outcome.gpus, key=lambda g: (g.plan.gpu.index is None, g.plan.gpu.index or 0)
    ):
        one = item.plan
        index = one.gpu.index
        lines.append(f"    - devices: [{index if index is not None else 'all'}]")
        lines.append(f"      mig-enabled: {'true' if one.target == 'enabled' else 'false'}")
        counts: dict = {}
        for entry in _recorded_layout(one, item):
            name = entry["compute_profile"] or entry["profile"]
            counts[name] = counts.get(name, 0) + 1
        if counts:
            lines.append("      mig-devices:")
            lines.extend(f'        "{name}": {count}' for name, count in sorted(counts.items()))
        else:
            lines.append("      mig-devices: {}")
    return "\n".join(lines) + "\n"


def unit_text(boot_program_path: str, state_path: str, header: str) -> str:
    """numafleet-mig.service: a oneshot that re-creates the recorded layout at boot.

    Raises UnitRenderError on a header line that is not a comment, or a path systemd would not
    read back as given (units.check_path: absolute, normalised, within PATH_MAX/NAME_MAX).
    """
    return boot_unit_text(
        header,
        "Re-create the MIG layout recorded by numafleet.tuning",
        "nvidia-persistenced.service",
        "multi-user.target",
        [PYTHON, boot_program_path, state_path],
        state_path,
    )


BOOT_PROGRAM = r"""#!/usr/bin/python3
# Written by numafleet.tuning (nvidia_mig): re-creates the recorded MIG layout at boot.
# Usage: numafleet-mig STATE_FILE. Only GPUs whose MIG mode is enabled and that have no GPU
# instances yet are touched; anything else is logged and skipped. Exit 1 when a command fails.
import json
import re
import subprocess
import sys

CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
NVIDIA_SMI = "nvidia-smi"


def log(text):
    sys.stderr.write("numafleet-mig: " + text + "\n")


def run(argv):
    proc = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
        env={"LC_ALL": "C", "LANG": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    return proc.returncode, proc.stdout


def mig_enabled(address):
    rc, out = run([NVIDIA_SMI, "-i", address, "--query-gpu=mig.mode.current",
                   "--format=csv,noheader"])
    return rc == 0 and out.strip().lower() == "enabled", out.strip()


def same_gpu(address, uuid):
    if not uuid:
        return True, ""
    rc, out = run([NVIDIA_SMI, "-i", address, "--query-gpu=uuid", "--format=csv,noheader"])
    return rc == 0 and out.strip().lower() == uuid.lower(), out.strip()


def has_instances(address):
    rc, out = run([NVIDIA_SMI, "mig", "-i", address, "-lgi"])
    if "No GPU instances found" in out:
        return False
    if rc != 0:
        raise RuntimeError("nvidia-smi mig -lgi: " + out.strip())
    return True


def create(address, entry):
    profile = entry["profile"]
    spec = profile if entry.get("start") is None else "%s:%d" % (profile, entry["start"])
    compute = entry.get("compute_profile")
    argv = [NVIDIA_SMI, "mig", "-i", address, "-cgi", spec]
    if not compute:
        argv.append("-C")
    rc, out = run(argv)
    log(" ".join(argv) + ": " + out.strip())
    if rc != 0:
        return False
    if not compute:
        return True
    found = re.search(r"GPU instance ID\s+(\d+)", out)
    if not found:
        log("cannot find the new GPU instance id in: " + out.strip())
        return False
    slices = int(compute.split("c.", 1)[0])
    argv = [NVIDIA_SMI, "mig", "-i", address, "-cci", str(CI_PROFILE_IDS[slices]),
            "-gi", found.group(1)]
    rc, out = run(argv)
    log(" ".join(argv) + ": " + out.strip())
    return rc == 0


def main(argv):
    path = argv[1] if len(argv) > 1 else "/etc/numafleet/mig.json"
    try:
        with open(path) as handle:
            state = json.load(handle)
    except (OSError, ValueError) as exc:
        log("%s: cannot read the recorded layout (%s); nothing done" % (path, exc))
        return 1
    if not isinstance(state, dict) or state.get("format") != "numafleet.tuning/mig-layout" or state.get("version") != 1:
        log(path + " is not a numafleet.tuning/mig-layout version 1 file")
        return 1
    ok = True
    for gpu in state.get("gpus", []):
        address, layout = gpu["address"], gpu.get("layout") or []
        if gpu.get("mode") != "enabled" or not layout:
            continue
        same, said = same_gpu(address, gpu.get("uuid"))
        if not same:
            log("%s: is %s now, not the recorded %s (GPU replaced?); skipped, run site.yml"
                % (address, said or "unknown", gpu.get("uuid")))
            ok = False
            continue
        enabled, said = mig_enabled(address)
        if not enabled:
            log("%s: MIG mode is not enabled (%s); skipped" % (address, said or "no answer"))
            continue
        try:
            if has_instances(address):
                log("%s: has GPU instances already; skipped" % address)
                continue
        except RuntimeError as exc:
            log("%s: %s" % (address, exc))
            ok = False
            continue
        for entry in layout:
            ok = create(address, entry) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
"""


def boot_program_text() -> str:
    """The boot program (a stdlib python3 script) that re-creates the recorded layout."""
    return BOOT_PROGRAM


def desired_files(
    outcome: Outcome,
    state_path: str,
    boot_program_path: str,
    unit_dir: str,
    mig_parted_path: Optional[str],
    header: str = "# Managed by numafleet.tuning",
) -> dict:
    """{host path: text} of the state file, boot program, unit and (optional) mig-parted config."""
    files = {
        state_path: state_text(outcome, mig_parted_path),
        boot_program_path: boot_program_text(),
        os.path.join(unit_dir, UNIT_NAME): unit_text(boot_program_path, state_path, header),
    }
    if mig_parted_path:
        files[mig_parted_path] = mig_parted_text(outcome, header)
    return files
