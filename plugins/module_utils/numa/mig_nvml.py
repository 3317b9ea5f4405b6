# Private to this collection: may change in any release.
"""MIG backends that need no command: NVML (a pynvml-like object passed in) and a snapshot file.

``NvmlBackend`` reads with the NVML readers of gpu.py and changes the layout with NVML's MIG calls;
``SnapshotBackend`` reads a gpu_topology snapshot for render mode and refuses every change.
"""

from __future__ import annotations

import ctypes
import json
import os
import posixpath
import uuid
from dataclasses import replace
from typing import Optional

from . import gpu_nvml, gpu_records
from .backends import NVML_MISSING, SMI_MISSING, Way, pick_backend
from .errors import MigBackendError, MigError
from .files import read_text, write_file
from .mig import (
    BOOT_PROGRAM,
    CI_PROFILE_IDS,
    CREATE_CI,
    CREATE_GI,
    DESTROY_CI,
    DESTROY_GI,
    UNIT_NAME,
    Action,
    ComputeInstance,
    GpuInstance,
    Host,
    MigGpu,
    Outcome,
    Profile,
    ci_name,
    converge,
    desired_files,
    is_our_parted_config,
    parse_request,
    recorded_parted_path,
    smi_command,
    unit_text,
)
from .units import check_host_path, plan_changes, read_files, under_root, write_files

_ANY_INSTANCE = 0xFFFFFFFF
_CI_SLICES = {value: key for key, value in CI_PROFILE_IDS.items()}
# Architectures the model name tells, for snapshots (they do not record the architecture).
_NAME_ARCHITECTURES = (
    ("GB200", "blackwell"),
    ("B200", "blackwell"),
    ("B100", "blackwell"),
    ("GH200", "hopper"),
    ("H100", "hopper"),
    ("H200", "hopper"),
    ("H800", "hopper"),
    ("H20", "hopper"),
    ("A100", "ampere"),
    ("A800", "ampere"),
    ("A30", "ampere"),
)
_NVML_FIXES = {
    "NVML_ERROR_IN_USE": "stop the processes that use the GPU instance and run again",
    "NVML_ERROR_INSUFFICIENT_RESOURCES": (
        "the placement is taken or the GPU is out of that profile; read the layout again "
        "(nvidia-smi mig -lgi) and fix the layout"
    ),
    "NVML_ERROR_NO_PERMISSION": "run the module as root (become: true)",
    "NVML_ERROR_RESET_REQUIRED": "reset the GPU (reset_ok) or reboot the host",
}


def architecture_from_name(name: Optional[str]) -> Optional[str]:
    """The architecture (``ampere``, ``hopper``...) of a GPU model name, None when not known."""
    text = (name or "").upper()
    for key, architecture in _NAME_ARCHITECTURES:
        if key in text:
            return architecture
    return None


def _to_profiles(items) -> tuple:
    out = []
    for item in items or ():
        placements = tuple(sorted((p["start"], p["size"]) for p in item.get("placements") or ()))
        out.append(
            Profile(
                name=item.get("name") or f"profile {item['id']}",
                id=int(item["id"]),
                slices=int(item["slice_count"]),
                memory_mib=int(item.get("memory_mib") or 0),
                max_count=int(item["max_count"]),
                placements=placements,
            )
        )
    return tuple(sorted(out, key=lambda p: p.id))


def _to_instances(items, where: str, call: str) -> tuple:
    out = []
    for item in items or ():
        if item.get("profile_id") is None or item.get("placement_start") is None:
            raise MigBackendError(
                where,
                call,
                f"GPU instance {item.get('id')} has no profile id or placement",
                "Record the state through NVML (nvidia-ml-py on the host), which gives both",
            )
        cis = []
        for ci in item.get("compute_instances") or ():
            slices = _CI_SLICES.get(ci.get("profile_id"))
            if slices is None:
                raise MigBackendError(
                    where,
                    call,
                    f"compute instance {ci.get('id')} of GPU instance {item['id']} has an "
                    f"unknown profile id {ci.get('profile_id')!r}",
                    "Record the state through NVML again",
                )
            cis.append(
                ComputeInstance(
                    int(ci["id"]), slices, int(ci["profile_id"]), ci.get("mig_device_uuid")
                )
            )
        out.append(
            GpuInstance(
                id=int(item["id"]),
                profile_id=int(item["profile_id"]),
                start=int(item["placement_start"]),
                size=int(item.get("placement_size") or 0),
                compute_instances=tuple(sorted(cis, key=lambda c: c.id)),
            )
        )
    return tuple(sorted(out, key=lambda g: g.id))


def _mode(mig: Optional[dict], key: str) -> Optional[str]:
    return mig.get(key) if mig else None


class SnapshotBackend:
    """Reads a gpu_topology snapshot (render mode); every write method raises MigBackendError."""

    source = "snapshot"

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> list:
        """Every GPU of the snapshot, sorted by address; raises SnapshotError or MigBackendError.

        A snapshot has no NVML index: GPUs get their position in PCI address order, the order
        NVML and nvidia-smi number them in. Processes are whole-GPU (no GPU instance known).
        """
        from . import gpu_snapshot  # imported only when a snapshot is read

        state = gpu_snapshot.read_snapshot(self.path)
        out = []
        for index, address in enumerate(sorted(state.gpus)):
            record = state.gpus[address]
            mig = record.get("mig")
            instances = ()
            if mig and mig.get("mode_current") == "enabled":
                instances = _to_instances(
                    mig.get("gpu_instances"), address, f"snapshot {self.path}"
                )
            out.append(
                MigGpu(
                    address=address,
                    index=index,
                    uuid=record.get("uuid"),
                    name=record.get("name"),
                    architecture=architecture_from_name(record.get("name")),
                    mode_current=_mode(mig, "mode_current"),
                    mode_pending=_mode(mig, "mode_pending") or _mode(mig, "mode_current"),
                    profiles=_to_profiles(mig.get("supported_profiles") if mig else None),
                    gpu_instances=instances,
                    processes=tuple(
                        (int(pid), None) for pid in sorted(record.get("processes") or ())
                    ),
                )
            )
        return out

    def _refuse(self, address: str, call: str):
        raise MigBackendError(
            address,
            call,
            "render mode reads a snapshot and changes nothing",
            "Leave out snapshot to change the GPUs of the host itself",
        )

    def set_mode(self, address: str, enabled: bool) -> None:
        """Refused: raises MigBackendError."""
        self._refuse(address, "set MIG mode")

    def create_gpu_instance(self, address: str, profile_id: int, start: int) -> int:
        """Refused: raises MigBackendError."""
        self._refuse(address, "create GPU instance")

    def create_compute_instance(self, address: str, gi_id: int, ci_profile_id: int) -> int:
        """Refused: raises MigBackendError."""
        self._refuse(address, "create compute instance")

    def destroy_compute_instance(self, address: str, gi_id: int, ci_id: int) -> None:
        """Refused: raises MigBackendError."""
        self._refuse(address, "destroy compute instance")

    def destroy_gpu_instance(self, address: str, gi_id: int) -> None:
        """Refused: raises MigBackendError."""
        self._refuse(address, "destroy GPU instance")

    def close(self) -> None:
        """Nothing to close."""

    @staticmethod
    def describe(action: Action) -> str:
        """The nvidia-smi command line the host would run for ``action``."""
        return smi_command(action)


class NvmlBackend:
    """MIG reads and changes through ``nvml``, a pynvml-like object; nvmlInit runs at creation.

    Raises MigBackendError from the constructor when nvmlInit fails, and from every method when
    an NVML call fails (naming the GPU, the call and the fix).
    """

    source = "nvml"

    def __init__(self, nvml) -> None:
        self.nvml = nvml
        self.query = gpu_nvml.NvmlQuery(nvml)
        self.handles: dict = {}
        self.profiles: dict = {}
        self.open = False
        self._call("all GPUs", "nvmlInit")
        self.open = True

    def _fix(self, exc) -> str:
        for name, fix in _NVML_FIXES.items():
            if self.query.is_code(exc, name):
                return fix[0].upper() + fix[1:]
        return "Check the driver (nvidia-smi, dmesg) and run again, or use backend=nvidia-smi"

    def _call(self, address: str, name: str, *args, label: Optional[str] = None):
        try:
            return self.query.call(name, *args)
        except self.query.failures as exc:
            raise MigBackendError(address, label or name, str(exc), self._fix(exc)) from None

    def _handle(self, address: str):
        if address not in self.handles:
            self.read()
        if address not in self.handles:
            raise MigBackendError(
                address, "nvmlDeviceGetHandleByIndex", "no such GPU", "Check the address"
            )
        return self.handles[address]

    def _architecture(self, handle) -> Optional[str]:
        value = self.query.attempt({}, "", "nvmlDeviceGetArchitecture", handle)
        if value is None:
            return None
        for name in dir(self.nvml):
            if name.startswith("NVML_DEVICE_ARCH_") and getattr(self.nvml, name) == value:
                word = name[len("NVML_DEVICE_ARCH_") :].lower()
                return None if word == "unknown" else word
        return None

    def _processes(self, handle) -> tuple:
        found = set()
        for name in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            try:
                entries = self.query.call(name, handle)
            except self.query.failures:
                continue
            for entry in entries:
                gi = getattr(entry, "gpuInstanceId", _ANY_INSTANCE)
                gi = None if gi is None or int(gi) == _ANY_INSTANCE else int(gi)
                found.add((int(entry.pid), gi))
        return tuple(sorted(found, key=lambda item: (item[0], -1 if item[1] is None else item[1])))

    def _read_one(self, index: int, handle, address: str) -> MigGpu:
        query = self.query
        text = gpu_records.clean_text
        uuid = text(query.attempt({}, "", "nvmlDeviceGetUUID", handle))
        name = text(query.attempt({}, "", "nvmlDeviceGetName", handle))
        modes = query.attempt({}, "", "nvmlDeviceGetMigMode", handle)
        current = pending = None
        profiles, instances = (), ()
        if modes is not None:
            enable = query.constant("NVML_DEVICE_MIG_ENABLE", 1)
            current = "enabled" if modes[0] == enable else "disabled"
            pending = "enabled" if modes[1] == enable else "disabled"
            miss: dict = {}
            memory = query.attempt(miss, "memory", "nvmlDeviceGetMemoryInfo", handle)
            total = int(memory.total) if memory is not None else None
            raw = gpu_nvml.read_gi_profiles(query, handle, total, miss)
            if raw is not None:
                profiles = _to_profiles([item[0] for item in raw])
                self.profiles[address] = {p.id: p for p in profiles}
            if current == "enabled":
                listed = gpu_nvml.read_gpu_instances(query, handle, raw, miss)
                for key in ("mig.supported_profiles", "mig.gpu_instances", "mig.compute_instances"):
                    if key in miss:
                        raise MigBackendError(
                            address,
                            "reading the MIG layout",
                            miss[key],
                            "Check the driver (nvidia-smi mig -lgi) and run again",
                        )
                instances = _to_instances(listed, address, "nvmlComputeInstanceGetInfo")
        return MigGpu(
            address=address,
            index=index,
            uuid=uuid,
            name=name,
            architecture=self._architecture(handle),
            mode_current=current,
            mode_pending=pending,
            profiles=profiles,
            gpu_instances=instances,
            processes=self._processes(handle),
        )

    def read(self) -> list:
        """Every NVIDIA GPU NVML lists, sorted by address; raises MigBackendError."""
        count = int(self._call("all GPUs", "nvmlDeviceGetCount"))
        out = []
        for index in range(count):
            handle = self._call(f"index {index}", "nvmlDeviceGetHandleByIndex", index)
            info = self._call(f"index {index}", "nvmlDeviceGetPciInfo", handle)
            try:
                address = gpu_records.normalise_bus_id(info.busId)
            except ValueError as exc:
                raise MigBackendError(
                    f"index {index}", "nvmlDeviceGetPciInfo", str(exc), "Check the driver"
                ) from None
            self.handles[address] = handle
            out.append(self._read_one(index, handle, address))
        return sorted(out, key=lambda g: g.address)

    def set_mode(self, address: str, enabled: bool) -> None:
        """nvmlDeviceSetMigMode; whether it applied in place shows in the next read()."""
        mode = self.query.constant(
            "NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE", int(enabled)
        )
        self._call(address, "nvmlDeviceSetMigMode", self._handle(address), mode)

    def create_gpu_instance(self, address: str, profile_id: int, start: int) -> int:
        """nvmlDeviceCreateGpuInstanceWithPlacement; returns the new GI id."""
        handle = self._handle(address)
        profile = self.profiles.get(address, {}).get(profile_id)
        sizes = [z for s, z in (profile.placements if profile else ()) if s == start]
        placement = self.nvml.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = sizes[0] if sizes else (profile.slices if profile else 1)
        label = f"nvmlDeviceCreateGpuInstanceWithPlacement(profile {profile_id}, start {start})"
        gi = self._call(
            address, "nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id,
            ctypes.byref(placement), label=label,
        )  # fmt: skip
        return int(self._call(address, "nvmlGpuInstanceGetInfo", gi).id)

    def _gpu_instance(self, address: str, gi_id: int):
        return self._call(
            address, "nvmlDeviceGetGpuInstanceById", self._handle(address), gi_id,
            label=f"nvmlDeviceGetGpuInstanceById(GI {gi_id})",
        )  # fmt: skip

    def create_compute_instance(self, address: str, gi_id: int, ci_profile_id: int) -> int:
        """nvmlGpuInstanceCreateComputeInstance in GI ``gi_id``; returns the new CI id."""
        gi = self._gpu_instance(address, gi_id)
        label = f"nvmlGpuInstanceCreateComputeInstance(GI {gi_id}, profile {ci_profile_id})"
        ci = self._call(
            address, "nvmlGpuInstanceCreateComputeInstance", gi, ci_profile_id, label=label
        )
        return int(self._call(address, "nvmlComputeInstanceGetInfo", ci).id)

    def destroy_compute_instance(self, address: str, gi_id: int, ci_id: int) -> None:
        """nvmlComputeInstanceDestroy of CI ``ci_id`` in GI ``gi_id``."""
        gi = self._gpu_instance(address, gi_id)
        label = f"nvmlGpuInstanceGetComputeInstanceById(GI {gi_id}, CI {ci_id})"
        ci = self._call(address, "nvmlGpuInstanceGetComputeInstanceById", gi, ci_id, label=label)
        self._call(
            address, "nvmlComputeInstanceDestroy", ci,
            label=f"nvmlComputeInstanceDestroy(GI {gi_id}, CI {ci_id})",
        )  # fmt: skip

    def destroy_gpu_instance(self, address: str, gi_id: int) -> None:
        """nvmlGpuInstanceDestroy of GI ``gi_id``."""
        gi = self._gpu_instance(address, gi_id)
        self._call(
            address, "nvmlGpuInstanceDestroy", gi, label=f"nvmlGpuInstanceDestroy(GI {gi_id})"
        )

    def close(self) -> None:
        """nvmlShutdown, once."""
        if self.open:
            self.open = False
            try:
                self.query.call("nvmlShutdown")
            except self.query.failures:
                pass

    @staticmethod
    def describe(action: Action) -> str:
        """The NVML call that performs ``action``, as text."""
        address = action.address
        gi = "new" if action.gpu_instance_id is None else action.gpu_instance_id
        if action.kind == DESTROY_CI:
            return (
                f"nvmlComputeInstanceDestroy({address}, GI {gi}, CI {action.compute_instance_id})"
            )
        if action.kind == DESTROY_GI:
            return f"nvmlGpuInstanceDestroy({address}, GI {gi})"
        if action.kind == CREATE_GI:
            return (
                f"nvmlDeviceCreateGpuInstanceWithPlacement({address}, profile {action.profile_id} "
                f"({action.profile_name}), start {action.start})"
            )
        if action.kind == CREATE_CI:
            return (
                f"nvmlGpuInstanceCreateComputeInstance({address}, GI {gi}, profile "
                f"{action.profile_id} ({action.profile_name}))"
            )
        return f"nvmlDeviceSetMigMode({address}, {'enable' if action.enabled else 'disable'})"


__all__ = ["NvmlBackend", "SnapshotBackend", "architecture_from_name"]


# ---------------------------------------------------------------------------------------------
# The nvidia_mig module's run: choose the backend, converge, write the files, shape the result


def choose_backend(choice: str, snapshot: Optional[str], runner, which, load_nvml):
    """The backend for the module's ``backend``/``snapshot`` options; raises MigError."""
    if snapshot:
        return SnapshotBackend(snapshot)

    def smi_backend(path):
        from . import mig_smi  # written alongside; imported only when needed

        return mig_smi.SmiBackend(runner, path)

    backend, reasons = pick_backend(
        choice,
        (
            Way("nvml", load_nvml, NvmlBackend, NVML_MISSING),
            Way("nvidia-smi", lambda: which("nvidia-smi"), smi_backend, SMI_MISSING),
        ),
        (MigBackendError,),
    )
    if backend is not None:
        return backend
    raise MigError(
        f"backend={choice}: no way to reach the GPUs: {'; '.join(reasons)}. Install the NVIDIA "
        "driver (nvidia-smi) or nvidia-ml-py, or remove the GPUs from gpus"
    )


def _result_gpu(item) -> dict:
    return {
        "address": item.plan.gpu.address,
        "uuid": item.plan.gpu.uuid,
        "mode_current": item.mode_current,
        "mode_pending": item.mode_pending,
        "reset_required": item.reset_required,
        "layout": [dict(entry) for entry in item.layout],
        "actions": list(item.actions),
    }


def _unit_would_run(changes: list, unit_path: str, systemd: bool) -> list:
    """Without a service manager (render mode): the systemctl lines the boot unit's change needs."""
    change = next((c for c in changes if c.path == unit_path and c.state != "unchanged"), None)
    if systemd or change is None:
        return []
    if change.state == "remove":
        return [f"systemctl disable --now {UNIT_NAME}", "systemctl daemon-reload"]
    return ["systemctl daemon-reload", f"systemctl enable {UNIT_NAME}"]


def _fail_state(path: str, reason: str) -> MigError:
    return MigError(f"{path}: {reason}")


def _is_our_boot_program(text: str) -> bool:
    """Whether ``text`` is a boot program this module wrote (this release's or an earlier one)."""
    return text == BOOT_PROGRAM or "# Written by numafleet.tuning (nvidia_mig)" in text[:200]


def _refuse_foreign(root: str, path: str, option: str, ours) -> None:
    """Raise MigError when a file numafleet did not write (``ours`` false) is at ``path``."""
    text = read_files(root, [path])[path]
    if text is not None and not ours(text):
        raise MigError(
            f"{option}: {path} holds a file numafleet did not write; it is never overwritten "
            f"(nor removed later). Give {option} a path of its own, or move that file away; no "
            "GPU was changed"
        )


def run(params: dict, check_mode: bool, runner, which, load_nvml) -> dict:
    """The nvidia_mig module's result for its ``params``; raises NumaTuneError.

    ``runner(argv) -> (rc, out, err)`` runs commands, ``which(name)`` finds a binary (None when
    absent), ``load_nvml()`` gives pynvml or None.
    """
    requests = parse_request(params["gpus"])
    state_path = check_host_path("state_path", params["state_path"])
    program_path = check_host_path("boot_program_path", params["boot_program_path"])
    unit_dir = check_host_path("unit_dir", params["unit_dir"])
    # The boot unit carries both paths: refuse what it cannot, before any GPU is changed.
    unit_text(program_path, state_path, "#")
    parted = params.get("mig_parted_config") or None
    if parted:
        parted = check_host_path("mig_parted_config", parted)
    render = bool(params.get("snapshot"))
    systemd = params["service_manager"] == "systemd" and not render
    root = params["root"]
    if not os.path.isabs(root):
        raise MigError(
            f"root: {root!r} is not an absolute path; give / (the host itself) or an absolute "
            "render directory"
        )
    # Read and check what is on disk before any GPU is changed: a foreign or corrupt state file,
    # or a file numafleet did not write at the boot program or mig-parted path, stops here.
    state_text = read_text(root, state_path, _fail_state)  # a link is refused, never followed
    earlier = recorded_parted_path(state_text, under_root(root, state_path))
    if requests:
        _refuse_foreign(root, program_path, "boot_program_path", _is_our_boot_program)
        if parted:
            _refuse_foreign(root, parted, "mig_parted_config", is_our_parted_config)
    outcome = Outcome((), (), (), (), (), ())
    if requests:
        backend = choose_backend(
            params["backend"], params.get("snapshot"), runner, which, load_nvml
        )
        try:
            host = Host(
                runner=runner,
                nvidia_smi=which("nvidia-smi") or "nvidia-smi",
                systemctl=(which("systemctl") or "systemctl") if systemd else "systemctl",
                procfs_root=params["procfs_root"],
                sysfs_root=params["sysfs_root"],
                exclude_pids=(os.getpid(),),  # this process has NVML open: not a holder
            )
            outcome = converge(
                backend,
                requests,
                host,
                check_mode=check_mode,
                render=render,
                reset_ok=params["reset_ok"],
                owned_units=tuple(params["owned_units"]) if systemd else (),
            )
        finally:
            backend.close()
    # Render mode: the predicted change is written into the snapshot (the recording), so the
    # re-plan of this run and every later read see the new instances; the outcome is then read
    # back from it, as an apply re-reads the GPU, for the new MIG-device UUIDs.
    rendered = False
    if render and requests and not check_mode:
        rendered = render_into_snapshot(params["snapshot"], outcome)
        if rendered:
            after = converge(SnapshotBackend(params["snapshot"]), requests, host, render=True)
            outcome = Outcome(
                tuple(
                    replace(item, layout=again.layout)
                    for item, again in zip(outcome.gpus, after.gpus)
                ),
                outcome.busy,
                outcome.stopped_units,
                outcome.reset_blockers,
                outcome.would_run,
                outcome.ran,
                outcome.holders,
            )
    # Every file this module can write; with no GPU requested none is wanted, and the ones an
    # earlier run wrote are removed (the boot unit disabled first), so a host whose MIG
    # declarations went away does not re-create an old layout at boot. A mig-parted config an
    # earlier run wrote elsewhere (recorded in the state file) is removed too.
    owned = desired_files(outcome, state_path, program_path, unit_dir, parted)
    desired = owned if requests else {}
    kept = []
    if earlier and earlier not in owned:
        # Only a file that is still the config this module wrote is removed.
        text = read_files(root, [earlier])[earlier]
        if text is not None and not is_our_parted_config(text):
            kept.append(
                {
                    "path": earlier,
                    "reason": f"recorded in {state_path} as the mig-parted config of an earlier "
                    "run, but it is not a config numafleet wrote (header and config name "
                    "differ); it is kept: remove it by hand if it is no longer wanted",
                }
            )
            earlier = None
    paths = set(owned) | ({earlier} if earlier else set())
    changes = plan_changes(read_files(root, paths), desired, sorted(paths))
    unit_path = posixpath.join(unit_dir, UNIT_NAME)
    extra_ran: list = []
    if not check_mode:
        removed_unit = any(c.path == unit_path and c.state == "remove" for c in changes)
        if systemd and removed_unit:
            argv = [which("systemctl") or "systemctl", "disable", "--now", UNIT_NAME]
            rc, dummy, err = runner(argv)
            if rc != 0:
                raise MigError(
                    f"systemctl disable --now {UNIT_NAME} failed (rc {rc}): {err.strip()}; its "
                    "unit file is kept: disable it by hand and run again"
                )
            extra_ran.append(" ".join(argv))
        write_files(root, changes)
    files_changed = any(c.state != "unchanged" for c in changes)
    diff = [
        {
            "before_header": f"GPU {item.plan.gpu.address}",
            "after_header": f"GPU {item.plan.gpu.address}",
            "before": "\n".join(item.before) + "\n",
            "after": "\n".join(item.after) + "\n",
        }
        for item in outcome.gpus
        if item.changed
    ] + [c.as_diff() for c in changes if c.state != "unchanged"]
    return {
        "changed": files_changed or (outcome.changed and not render) or rendered,
        "gpus": [_result_gpu(item) for item in outcome.gpus],
        "mig_devices": [
            {
                "gpu_address": item.plan.gpu.address,
                "gpu_uuid": item.plan.gpu.uuid,
                "profile": entry["profile"],
                "placement_start": entry["start"],
                "device_uuid": entry["device_uuid"],
            }
            for item in outcome.gpus
            for entry in item.layout
        ],
        "reset_required": any(item.reset_required for item in outcome.gpus),
        "reset_blockers": list(outcome.reset_blockers),
        "busy": [b.as_dict() for b in outcome.busy],
        "holders": [h.as_dict() for h in outcome.holders],
        "stopped_units": list(outcome.stopped_units),
        "would_run": list(outcome.would_run) + _unit_would_run(changes, unit_path, systemd),
        "ran": list(outcome.ran) + extra_ran,
        "gpu_changed": (bool(outcome.ran) and not check_mode and not render) or rendered,
        "snapshot_written": rendered,
        "files": [c.as_dict() for c in changes],
        "kept": kept,
        "reload_needed": any(c.path == unit_path and c.state != "unchanged" for c in changes),
        "diff": diff,
    }


# --- render mode: the apply's changes written into the recorded snapshot ------------------------

# Render mode keeps the recording a consistent kernel: what a render apply would have done on the
# GPU is written into the GPU snapshot it read (docs/architecture.md, "Render mode and the demo
# fleet"), so facts, plan, the re-plan of the same run and the next drift check see the instances
# as the driver would show them. Destroyed instances are removed; created ones get the next free
# GPU instance id, compute instance 0 and a synthetic MIG-device UUID (version-5 UUID of the GPU
# UUID, GI id and CI id in RENDERED_UUID_NAMESPACE) and are marked ``"rendered": true``. A mode
# change that needs a GPU reset stays pending (mode_pending) with the instances untouched, as the
# driver keeps it until the reset.
RENDERED_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_OID, "numafleet.tuning render mode MIG device")


def rendered_device_uuid(gpu_uuid: Optional[str], address: str, gi_id: int, ci_id: int) -> str:
    """The synthetic ``MIG-<uuid5>`` UUID render mode gives a compute instance it creates: the
    same GPU (UUID, else PCI address), GI id and CI id always give the same UUID."""
    name = f"{gpu_uuid or address}/{gi_id}/{ci_id}"
    return f"MIG-{uuid.uuid5(RENDERED_UUID_NAMESPACE, name)}"


def _rendered_instances(item, mig: dict, uuid_of_gpu: Optional[str]) -> list:
    """The snapshot's gpu_instances of GPU outcome ``item`` after its (predicted) change."""
    one = item.plan
    if one.target == "disabled":
        return []
    if one.deferred:  # the GPU lists its profiles only once MIG mode is on: nothing made yet
        return list(mig.get("gpu_instances") or [])
    keep = {slot.kept.id for slot in one.slots if slot.kept is not None}
    out = [gi for gi in mig.get("gpu_instances") or [] if gi.get("id") in keep]
    used = set(keep)
    for slot in sorted(one.slots, key=lambda s: s.start):
        if slot.kept is not None:
            continue
        gi_id = next(n for n in range(1, len(used) + 2) if n not in used)
        used.add(gi_id)
        full = slot.ci_slices == slot.profile.slices
        ci_profile = (
            slot.profile.name
            if full
            else ci_name(slot.profile.name, slot.profile.slices, slot.ci_slices)
        )
        device = rendered_device_uuid(uuid_of_gpu, one.gpu.address, gi_id, 0)
        out.append(
            {
                "id": gi_id,
                "profile_id": slot.profile.id,
                "profile_name": slot.profile.name,
                "placement_start": slot.start,
                "placement_size": slot.size,
                "compute_instances": [
                    {
                        "id": 0,
                        "profile_id": CI_PROFILE_IDS[slot.ci_slices],
                        "profile_name": ci_profile,
                        "mig_device_uuid": device,
                    }
                ],
                "mig_device_uuid": device,
                "rendered": True,
            }
        )
    return sorted(out, key=lambda gi: gi["id"])


def _fail_snapshot(path: str, reason: str) -> MigError:
    return MigError(
        f"snapshot: {path}: {reason}. Render mode writes the MIG instances it creates into the "
        "GPU snapshot (the recording is the host's kernel): point numafleet_gpu_snapshot at a "
        "writable scratch copy of the recording (a regular file, not a link); no GPU state was "
        "written"
    )


def render_into_snapshot(path: str, outcome: Outcome) -> bool:
    """Write the changes of ``outcome`` (predicted in render mode) into the GPU snapshot ``path``;
    whether it changed. Raises MigError (a link at ``path``, a directory that cannot be written),
    SnapshotError (the snapshot cannot be read)."""
    from . import gpu_snapshot

    changed = [item for item in outcome.gpus if item.changed]
    if not changed:
        return False
    if os.path.islink(path):
        raise _fail_snapshot(path, "is a symbolic link; it is never written through")
    state = gpu_snapshot.read_snapshot(path)
    for item in changed:
        record = state.gpus.get(item.plan.gpu.address)
        mig = (record or {}).get("mig")
        if not isinstance(mig, dict):
            continue
        mig["mode_current"] = item.mode_current or mig["mode_current"]
        mig["mode_pending"] = item.mode_pending or item.mode_current
        if not item.reset_required:
            mig["gpu_instances"] = _rendered_instances(item, mig, record.get("uuid"))
    text = json.dumps(gpu_snapshot.as_snapshot(state), indent=2, sort_keys=True) + "\n"
    with open(path, encoding="utf-8") as handle:
        if handle.read() == text:
            return False
    directory, name = os.path.split(os.path.abspath(path))
    write_file(directory, name, text, 0o644, _fail_snapshot)
    return True
