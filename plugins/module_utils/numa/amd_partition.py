# Private to this collection: may change in any release.
"""Apply the compute and memory partition modes of AMD Instinct GPUs (the ``amd`` layer).

What the driver and the tools do (sources, as read 2026-12):

- Compute partition (SPX/DPX/TPX/QPX/CPX: 1/2/3/4/8 XCPs, logical GPUs, on an MI300X with 8
  XCDs): ``/sys/bus/pci/devices/<address>/current_compute_partition`` reads the mode and, written
  by root, switches it at run time; ``available_compute_partition`` lists the modes the GPU
  accepts in its current memory partition. The driver's switch
  (aqua_vanjaram.c ``aqua_vanjaram_switch_partition_mode``) refuses a mode the memory partition
  does not allow (-EINVAL, "Invalid compute partition mode requested ... available memory
  partitions"), then takes ``amdgpu_amdkfd_check_and_lock_kfd``: kfd_device.c
  ``kgd2kfd_check_and_lock_kfd`` returns -EBUSY while the KFD process table is not empty (in
  older kernels any KFD process of any GPU; newer ones also count ``kfd_processes_count`` per
  device). The XCPs (platform devices ``amdgpu_xcp_N``, each with its own
  ``/dev/dri/renderD*`` and KFD topology node) are torn down and made again
  (``amdgpu_xcp_pre/post_partition_switch``), so every client of the GPU's render nodes must let
  go first. Sources: Linux drivers/gpu/drm/amd/amdgpu/aqua_vanjaram.c, amdgpu_xcp.c,
  amdgpu_gfx.c (``amdgpu_gfx_set_compute_partition``), drivers/gpu/drm/amd/amdkfd/kfd_device.c;
  https://instinct.docs.amd.com/projects/amdgpu-docs/en/latest/gpu-partitioning/mi300x/quick-start-guide.html
- Memory partition (NPS1/NPS2/NPS4/NPS8): ``current_memory_partition`` /
  ``available_memory_partition``. Writing it only *requests* the mode: the driver applies an
  NPS switch when it is loaded again (``is_nps_switch_requested``, a reset on init; "Add NPS
  switch support for GC 9.4.3", Lijo Lazar, 2024-10), so a memory-partition change needs a reload
  of amdgpu, which resets every AMD GPU of the host: ``modprobe -r amdgpu && modprobe amdgpu``,
  ``amdsmi_gpu_driver_reload()`` (https://rocm.docs.amd.com/projects/amdsmi/en/latest/doxygen/docBin/html/group__tagDriverControl.html:
  "Any process or workload using the AMD GPU driver is REQUIRED to be stopped"), or
  ``amd-smi reset -r``. Hence ``reset_ok`` and "every AMD GPU idle".
- amdsmi: ``amdsmi_set_gpu_compute_partition(handle, AmdSmiComputePartitionType.CPX)``,
  ``amdsmi_set_gpu_memory_partition(handle, AmdSmiMemoryPartitionType.NPS4)`` (newer releases
  also ``amdsmi_set_gpu_memory_partition_mode``); errors are ``AmdSmiLibraryException``
  (https://rocm.docs.amd.com/projects/amdsmi/en/latest/doxygen/docBin/html/group__compute__partition.html).
  amd-smi CLI: ``amd-smi set -g <BDF> --compute-partition CPX`` and ``--memory-partition NPS4``.
- Compatibility (MI300X, documented table): SPX/DPX/QPX with NPS1, CPX with NPS1 or NPS4
  (https://instinct.docs.amd.com/projects/amdgpu-docs/en/latest/gpu-partitioning/index.html,
  compatibility matrix). The plan entry may carry ``compatible_memory_partitions``; else the
  GPU's ``available_*`` files are the authority.
- Persistence: the modes are set at run time and the driver loads with its default (SPX/NPS1,
  or the host-wide amdgpu module parameter ``user_partt_mode`` for the compute mode), so the
  layer records the modes and a boot unit (``numafleet-amd-partition.service``, before the
  owned units) applies them again, as numafleet-mig.service does for MIG.

Users of a GPU (``read_amd_holders``): processes with ``/dev/kfd`` open (KFD is one device for
every AMD GPU: such a process holds them all), or one of the GPU's DRM nodes
(``/dev/dri/renderD<minor>`` of any of its KFD nodes, ``/dev/dri/card<N>`` of its PCI device),
read from procfs fd links like mig_holders (the shared ``open_devices``).
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from .backends import Way, pick_backend
from .errors import NumaTuneError
from .gpu_amd import MI300_COMPATIBLE, render_node
from .mig_holders import KIND_PROCESS, Holder, open_devices, process_ids, read_comm

COMPUTE_MODES = ("SPX", "DPX", "TPX", "QPX", "CPX")
MEMORY_MODES = ("NPS1", "NPS2", "NPS4", "NPS8")
BACKENDS = ("auto", "amdsmi", "amd-smi", "sysfs")
KFD = "/dev/kfd"
DRI = "/dev/dri/"
UNIT_NAME = "numafleet-amd-partition.service"
DEFAULT_STATE_PATH = "/etc/numafleet/amd-partition.json"
DEFAULT_BOOT_PROGRAM_PATH = "/usr/local/libexec/numafleet-amd-partition"
STATE_FORMAT = "numafleet.tuning/amd-partition"
PYTHON = "/usr/bin/python3"


class AmdPartitionError(NumaTuneError):
    """A partition change refused or failed; ``str()`` is the complete message."""


# ---------------------------------------------------------------------------------------------
# Reading the GPU (sysfs) and its users (procfs)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(4096).replace("\0", "").strip()
    except (OSError, UnicodeDecodeError):
        return None


def device_dir(sysfs_root: str, address: str) -> str:
    """<sysfs_root>/bus/pci/devices/<address>."""
    return os.path.join(sysfs_root, "bus", "pci", "devices", address)


def parse_modes(text: Optional[str]) -> list:
    """'SPX, DPX,QPX CPX' -> ['SPX', 'DPX', 'QPX', 'CPX'] (upper case); [] for None."""
    return [m.upper() for m in (text or "").replace(",", " ").split() if m]


def read_modes(sysfs_root: str, address: str) -> dict:
    """{compute: {current, available}, memory: {current, available}} of GPU ``address`` from
    current_/available_compute_partition and current_/available_memory_partition (current None
    and available [] where the file is missing)."""
    base = device_dir(sysfs_root, address)
    out = {}
    for key, name in (("compute", "compute"), ("memory", "memory")):
        current = _read(os.path.join(base, f"current_{name}_partition"))
        out[key] = {
            "current": current.upper() if current else None,
            "available": parse_modes(_read(os.path.join(base, f"available_{name}_partition"))),
        }
    return out


def _kfd_address(props: str) -> Optional[str]:
    values = {}
    for line in props.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    location = values.get("location_id")
    if not location:
        return None
    domain = values.get("domain", 0)
    bus, devfn = location >> 8, location & 0xFF
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


def read_dri_nodes(sysfs_root: str) -> dict:
    """{PCI address: sorted /dev/dri paths}: the renderD<drm_render_minor> of every KFD topology
    node (<sysfs_root>/class/kfd/kfd/topology/nodes/N/properties: location_id, domain; one node
    per XCP) and the card*/renderD* entries of the PCI device's drm directory."""
    nodes: dict = {}
    base = os.path.join(sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        names = []
    for name in names:
        props = _read(os.path.join(base, name, "properties")) or ""
        address = _kfd_address(props)
        minor = None
        for line in props.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "drm_render_minor" and parts[1].isdigit():
                minor = int(parts[1])
        if address and minor:
            nodes.setdefault(address, set()).add(render_node(minor))
    pci = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        devices = os.listdir(pci)
    except OSError:
        devices = []
    for address in devices:
        try:
            entries = os.listdir(os.path.join(pci, address, "drm"))
        except OSError:
            continue
        for entry in entries:
            if entry.startswith(("card", "renderD")):
                nodes.setdefault(address, set()).add(DRI + entry)
    return {address: sorted(paths) for address, paths in nodes.items()}


def read_amd_holders(procfs_root: str, sysfs_root: str, exclude_pids=()) -> list:
    """Every process holding an AMD GPU (mig_holders.Holder, kind process), by pid; never
    raises. /dev/kfd holds every AMD GPU (``gpus`` ()); a DRM node holds the GPU read_dri_nodes
    maps it to (other DRM nodes: not AMD)."""
    from .mig_holders import read_pid_unit

    owners = {}
    for address, paths in read_dri_nodes(sysfs_root).items():
        for path in paths:
            owners.setdefault(path, set()).add(address)
    holders = []
    for pid in process_ids(procfs_root, exclude_pids):
        devices = open_devices(os.path.join(procfs_root, str(pid), "fd"), (KFD, DRI))
        devices = [d for d in devices if d == KFD or d in owners]
        if not devices:
            continue
        every = KFD in devices
        gpus = set()
        for device in devices:
            gpus.update(owners.get(device, ()))
        holders.append(
            Holder(
                KIND_PROCESS,
                pid,
                read_comm(procfs_root, pid),
                read_pid_unit(procfs_root, pid),
                tuple(devices),
                () if every else tuple(sorted(gpus)),
            )
        )
    return holders


# ---------------------------------------------------------------------------------------------
# Backends: sysfs (also render mode), amdsmi (injected module), amd-smi (injected runner)


class SysfsBackend:
    """Reads and writes current_*_partition under ``sysfs_root``; ``reload`` runs modprobe."""

    name = "sysfs"

    def __init__(self, sysfs_root: str, runner: Optional[Callable] = None, modprobe="modprobe"):
        self.sysfs_root = sysfs_root
        self.runner = runner
        self.modprobe = modprobe

    def read(self, address: str) -> dict:
        return read_modes(self.sysfs_root, address)

    def _write(self, address: str, kind: str, mode: str) -> str:
        path = os.path.join(device_dir(self.sysfs_root, address), f"current_{kind}_partition")
        try:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(mode + "\n")
        except OSError as exc:
            raise AmdPartitionError(
                f"GPU {address}: writing {mode} to {path} failed: {exc.strerror or exc}. The "
                "driver refuses a switch while a process uses the GPU (/dev/kfd, render nodes); "
                "check that none does and run again"
            ) from None
        return f"echo {mode} > {path}"

    def set_compute(self, address: str, mode: str) -> str:
        return self._write(address, "compute", mode)

    def set_memory(self, address: str, mode: str) -> str:
        return self._write(address, "memory", mode)

    def reload_argvs(self) -> list:
        return [[self.modprobe, "-r", "amdgpu"], [self.modprobe, "amdgpu"]]


class AmdsmiBackend:
    """The amdsmi Python library (``module``, injected): handles by BDF, get/set partitions."""

    name = "amdsmi"

    def __init__(self, module, sysfs_root: str) -> None:
        self.lib = module
        self.sysfs_root = sysfs_root
        try:
            module.amdsmi_init()
            self.handles = {
                str(module.amdsmi_get_gpu_device_bdf(h)).lower(): h
                for h in module.amdsmi_get_processor_handles()
            }
        except module.AmdSmiException as exc:
            raise AmdPartitionError(f"amdsmi: cannot initialise the library: {exc}") from None

    def close(self) -> None:
        try:
            self.lib.amdsmi_shut_down()
        except self.lib.AmdSmiException:
            pass

    def _handle(self, address: str):
        handle = self.handles.get(address.lower())
        if handle is None:
            raise AmdPartitionError(
                f"GPU {address}: amdsmi does not list it (amdsmi_get_processor_handles); check "
                "the address in the plan, or use backend sysfs"
            )
        return handle

    def read(self, address: str) -> dict:
        modes = read_modes(self.sysfs_root, address)
        handle = self._handle(address)
        try:
            compute = self.lib.amdsmi_get_gpu_compute_partition(handle)
            memory = self.lib.amdsmi_get_gpu_memory_partition(handle)
        except self.lib.AmdSmiException as exc:
            raise AmdPartitionError(
                f"GPU {address}: amdsmi cannot read the partitions: {exc}"
            ) from None
        modes["compute"]["current"] = str(compute).upper() or modes["compute"]["current"]
        modes["memory"]["current"] = str(memory).upper() or modes["memory"]["current"]
        return modes

    def _set(self, address: str, call: str, enum: str, mode: str) -> str:
        try:
            value = getattr(getattr(self.lib, enum), mode)
            getattr(self.lib, call)(self._handle(address), value)
        except self.lib.AmdSmiException as exc:
            raise AmdPartitionError(
                f"GPU {address}: {call}({mode}) failed: {exc}. The driver refuses a switch while a "
                "process uses the GPU; check that none does and run again"
            ) from None
        return f"{call}({address}, {mode})"

    def set_compute(self, address: str, mode: str) -> str:
        return self._set(
            address, "amdsmi_set_gpu_compute_partition", "AmdSmiComputePartitionType", mode
        )

    def set_memory(self, address: str, mode: str) -> str:
        return self._set(
            address, "amdsmi_set_gpu_memory_partition", "AmdSmiMemoryPartitionType", mode
        )

    def reload(self) -> str:
        try:
            self.lib.amdsmi_gpu_driver_reload()
        except self.lib.AmdSmiException as exc:
            raise AmdPartitionError(
                f"amdsmi_gpu_driver_reload failed: {exc}; every process using an AMD GPU must be "
                "stopped first. The memory partition is requested and applies at the next driver "
                "load (or reboot)"
            ) from None
        return "amdsmi_gpu_driver_reload()"


class SmiBackend:
    """The amd-smi CLI through ``runner(argv) -> (rc, out, err)``; reads back from sysfs."""

    name = "amd-smi"

    def __init__(self, runner: Callable, path: str, sysfs_root: str) -> None:
        self.runner = runner
        self.path = path
        self.sysfs_root = sysfs_root

    def read(self, address: str) -> dict:
        return read_modes(self.sysfs_root, address)

    def _run(self, argv: list, address: str) -> str:
        rc, out, err = self.runner(argv)
        line = " ".join(["amd-smi"] + argv[1:])
        if rc != 0:
            said = (err or out or "").strip().splitlines()
            raise AmdPartitionError(
                f"GPU {address}: {line} failed (rc {rc}): {said[0] if said else 'no message'}; "
                "run it by hand to see amd-smi's full message"
            )
        return line

    def set_compute(self, address: str, mode: str) -> str:
        return self._run([self.path, "set", "-g", address, "--compute-partition", mode], address)

    def set_memory(self, address: str, mode: str) -> str:
        return self._run([self.path, "set", "-g", address, "--memory-partition", mode], address)

    def reload(self) -> str:
        return self._run([self.path, "reset", "-r"], "(all)")


def choose_backend(choice: str, render: bool, sysfs_root: str, runner, which, load_amdsmi):
    """The backend for ``choice`` (BACKENDS): render mode is always sysfs (the scratch tree);
    auto tries amdsmi, then amd-smi, then sysfs. Raises AmdPartitionError naming every reason."""
    if render or choice == "sysfs":
        return SysfsBackend(
            sysfs_root, runner, (which("modprobe") if which else None) or "modprobe"
        )
    backend, reasons = pick_backend(
        choice,
        (
            Way(
                "amdsmi",
                lambda: load_amdsmi() if load_amdsmi else None,
                lambda module: AmdsmiBackend(module, sysfs_root),
                "the amdsmi Python library is not installed for the target's Python",
            ),
            Way(
                "amd-smi",
                lambda: (which("amd-smi") if which else None) or None,
                lambda path: SmiBackend(runner, path, sysfs_root),
                "amd-smi is not on the PATH",
            ),
        ),
        (AmdPartitionError,),
    )
    if backend is not None:
        return backend
    if choice == "auto":
        return SysfsBackend(
            sysfs_root, runner, (which("modprobe") if which else None) or "modprobe"
        )
    raise AmdPartitionError(
        f"backend={choice}: no way to reach the GPUs: {'; '.join(reasons)}. Install ROCm's "
        "amd-smi / amdsmi, or use backend sysfs (or auto)"
    )


# ---------------------------------------------------------------------------------------------
# Planning the change: the whole layout validated before anything changes


@dataclass(frozen=True)
class Change:
    """One GPU of the plan: modes before and wanted (``compute``/``memory``: (before, after))."""

    address: str
    uuid: Optional[str]
    compute: tuple
    memory: tuple
    owned_units: tuple
    declared: bool = True  # in the host's declared partitions: recorded for the boot unit

    @property
    def compute_change(self) -> bool:
        return self.compute[0] != self.compute[1]

    @property
    def memory_change(self) -> bool:
        return self.memory[0] != self.memory[1]

    def as_dict(self, reset_required: bool = False) -> dict:
        return {
            "address": self.address,
            "uuid": self.uuid,
            "compute": {"before": self.compute[0], "after": self.compute[1]},
            "memory": {"before": self.memory[0], "after": self.memory[1]},
            "reset_required": reset_required,
        }


def _planned(entry: dict, key: str, where: str, choices: tuple) -> Optional[str]:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise AmdPartitionError(
            f"{where}.{key}: {value!r} is not {{current, planned}}; pass plan.amd_partitions as "
            "numa_plan made it; nothing was changed"
        )
    planned = value.get("planned")
    if planned is None:
        return None
    planned = str(planned).upper()
    if planned not in choices:
        raise AmdPartitionError(
            f"{where}.{key}.planned: {value.get('planned')!r} is not one of {', '.join(choices)}; "
            "fix numafleet_gpu_partitions; nothing was changed"
        )
    return planned


def plan_changes(gpus: list, backend) -> list:
    """One Change per entry of ``gpus`` (plan.amd_partitions), in address order, after checking
    the whole layout against the GPUs as read now: the GPU is found, each planned mode is in
    its available list, the memory mode is compatible with the compute mode. Raises
    AmdPartitionError naming every problem (nothing is changed)."""
    problems, changes = [], []
    for index, entry in enumerate(gpus):
        where = f"gpus[{index}]"
        if not isinstance(entry, dict) or not entry.get("address"):
            raise AmdPartitionError(
                f"{where}: needs an address (plan.amd_partitions entries); nothing was changed"
            )
        address = str(entry["address"]).lower()
        compute = _planned(entry, "compute_partition", where, COMPUTE_MODES)
        memory = _planned(entry, "memory_partition", where, MEMORY_MODES)
        state = backend.read(address)
        now_c, now_m = state["compute"]["current"], state["memory"]["current"]
        if now_c is None and now_m is None:
            problems.append(
                f"GPU {address}: no current_compute_partition / current_memory_partition under "
                f"{device_dir(getattr(backend, 'sysfs_root', '/sys'), address)} (not an AMD "
                "Instinct GPU with partitions, or the address is wrong)"
            )
            continue
        want_c, want_m = compute or now_c, memory or now_m
        for kind, want, now, avail in (
            ("compute", want_c, now_c, state["compute"]["available"]),
            ("memory", want_m, now_m, state["memory"]["available"]),
        ):
            if want != now and avail and want not in avail:
                problems.append(
                    f"GPU {address}: {kind} partition {want} is not available "
                    f"(available_{kind}_partition: {', '.join(avail)})"
                )
        table = entry.get("compatible_memory_partitions") or MI300_COMPATIBLE
        allowed = table.get(want_c) if isinstance(table, dict) else None
        if want_m and allowed and want_m not in allowed and (want_c, want_m) != (now_c, now_m):
            problems.append(
                f"GPU {address}: memory partition {want_m} is not allowed with compute partition "
                f"{want_c} (allowed: {', '.join(allowed)})"
            )
        units = tuple(str(u) for u in entry.get("owned_units") or ())
        declared = entry.get("declared", True) is not False
        changes.append(
            Change(address, entry.get("uuid"), (now_c, want_c), (now_m, want_m), units, declared)
        )
    if problems:
        raise AmdPartitionError(
            "the partition layout is refused, nothing was changed: "
            + "; ".join(problems)
            + ". Fix numafleet_gpu_partitions for this host"
        )
    return sorted(changes, key=lambda c: c.address)


def busy_refusal(blocked: dict, what: dict) -> AmdPartitionError:
    """The refusal for {address: [Holder]} with {address: 'a compute partition change'}."""
    lines = [
        f"GPU {address} ({what[address]}) is used by {'; '.join(h.text() for h in hs)}"
        for address, hs in sorted(blocked.items())
    ]
    kfd = any(KFD in h.devices for hs in blocked.values() for h in hs)
    risk = (
        " /dev/kfd is one device for every AMD GPU: a ROCm process on any GPU of the host "
        "blocks the change."
        if kfd
        else ""
    )
    return AmdPartitionError(
        "the partition change is refused: "
        + ". ".join(lines)
        + "."
        + risk
        + " Stop them (systemctl stop the unit) and run again; units of the plan's placements "
        "on these GPUs are stopped and started again by the change itself"
    )


# ---------------------------------------------------------------------------------------------
# The run


def _diff_text(changes: list, side: int) -> str:
    return "".join(
        f"GPU {c.address}: compute {c.compute[side]}, memory {c.memory[side]}\n" for c in changes
    )


def state_text(changes: list) -> str:
    """The recorded modes (JSON) the boot program applies again."""
    gpus = [
        {"address": c.address, "uuid": c.uuid, "compute": c.compute[1], "memory": c.memory[1]}
        for c in changes
    ]
    return json.dumps({"format": STATE_FORMAT, "version": 1, "gpus": gpus}, indent=2) + "\n"


def unit_text(boot_program_path: str, state_path: str, header: str, owned_units=()) -> str:
    """numafleet-amd-partition.service: a oneshot that sets the recorded modes at boot, before
    the owned units (and multi-user.target)."""
    from .units import boot_unit_text

    return boot_unit_text(
        header,
        "Set the AMD GPU partition modes recorded by numafleet.tuning",
        "systemd-modules-load.service",
        " ".join(["multi-user.target"] + sorted(owned_units)),
        [PYTHON, boot_program_path, state_path],
        state_path,
    )


BOOT_PROGRAM = r"""#!/usr/bin/python3
# Written by numafleet.tuning (amd_partition): sets the recorded AMD GPU partition modes at boot.
# Usage: numafleet-amd-partition STATE_FILE. Memory partitions first (one amdgpu reload when one
# changed), then compute partitions, through /sys/bus/pci/devices/<address>/current_*_partition.
import json
import subprocess
import sys

SYS = "/sys/bus/pci/devices/"


def log(text):
    sys.stderr.write("numafleet-amd-partition: " + text + "\n")


def current(address, kind):
    try:
        with open(SYS + address + "/current_" + kind + "_partition") as handle:
            return handle.read().strip().upper()
    except OSError:
        return None


def write(address, kind, mode):
    try:
        with open(SYS + address + "/current_" + kind + "_partition", "w") as handle:
            handle.write(mode + "\n")
        return True
    except OSError as exc:
        log("%s: %s partition %s: %s" % (address, kind, mode, exc))
        return False


def main(argv):
    path = argv[1] if len(argv) > 1 else "/etc/numafleet/amd-partition.json"
    try:
        with open(path) as handle:
            state = json.load(handle)
    except (OSError, ValueError) as exc:
        log("%s: cannot read the recorded modes (%s)" % (path, exc))
        return 1
    if not isinstance(state, dict) or state.get("format") != "numafleet.tuning/amd-partition":
        log(path + " is not a numafleet.tuning/amd-partition file")
        return 1
    ok, reload = True, False
    for gpu in state.get("gpus", []):
        mode = gpu.get("memory")
        if mode and current(gpu["address"], "memory") not in (None, mode):
            reload = write(gpu["address"], "memory", mode) or reload
    if reload:
        for argv in (["modprobe", "-r", "amdgpu"], ["modprobe", "amdgpu"]):
            if subprocess.call(argv) != 0:
                log(" ".join(argv) + " failed")
                ok = False
    for gpu in state.get("gpus", []):
        mode = gpu.get("compute")
        if mode and current(gpu["address"], "compute") not in (None, mode):
            ok = write(gpu["address"], "compute", mode) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
"""


def run(params: dict, check_mode: bool, runner, which, load_amdsmi, exclude_pids=()) -> dict:
    """The amd layer's result for its ``params`` (root, sysfs_root, procfs_root,
    service_manager, gpus = plan.amd_partitions, owned_units, reset_ok, backend, state_path,
    boot_program_path, unit_dir); raises AmdPartitionError (nothing changed when raised before
    the first write).

    Result: changed, gpus [{address, uuid, compute {before, after}, memory {before, after},
    reset_required}], reset_required, warnings, busy (holders of GPUs to change), stopped_units,
    ran, would_run, gpu_changed, files, reload_needed, drift, diff.
    """
    from .units import check_host_path, read_files, write_files
    from .units import plan_changes as file_changes

    gpus = params.get("gpus") or []
    root = params.get("root") or "/"
    render = params.get("service_manager") == "none"
    sysfs_root = params.get("sysfs_root") or "/sys"
    procfs_root = params.get("procfs_root") or "/proc"
    reset_ok = bool(params.get("reset_ok"))
    if params.get("backend", "auto") not in BACKENDS:
        raise AmdPartitionError(
            f"backend: {params.get('backend')!r} is not one of {', '.join(BACKENDS)}"
        )
    state_path = check_host_path("state_path", params.get("state_path") or DEFAULT_STATE_PATH)
    program_path = check_host_path(
        "boot_program_path", params.get("boot_program_path") or DEFAULT_BOOT_PROGRAM_PATH
    )
    unit_dir = check_host_path("unit_dir", params.get("unit_dir") or "/etc/systemd/system")
    unit_path = posixpath.join(unit_dir, UNIT_NAME)
    on_disk = read_files(root, [program_path, state_path])
    for path in (program_path, state_path):
        text = on_disk.get(path)
        if text is not None and "numafleet" not in text[:300]:
            raise AmdPartitionError(
                f"{path} holds a file numafleet did not write; it is never overwritten nor "
                "removed. Move it away, or give boot_program_path / state_path a path of its own"
            )
    warnings: list = []
    changes: list = []
    backend = None
    if gpus:
        backend = choose_backend(
            params.get("backend", "auto"), render, sysfs_root, runner, which, load_amdsmi
        )
    try:
        if backend is not None:
            changes = plan_changes(gpus, backend)
        context = RunContext(
            params,
            check_mode,
            render,
            reset_ok,
            runner,
            which,
            procfs_root,
            sysfs_root,
            tuple(exclude_pids),
            warnings,
        )
        result = _converge(changes, backend, context)
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    # Boot persistence: the recorded modes and the unit that sets them again at boot.
    owned = tuple(
        sorted({u for c in changes for u in c.owned_units} | set(params.get("owned_units") or ()))
    )
    desired = {}
    recorded = [c for c in changes if c.declared or c.compute_change or c.memory_change]
    if recorded:
        desired = {
            state_path: state_text(recorded),
            program_path: BOOT_PROGRAM,
            posixpath.join(unit_dir, UNIT_NAME): unit_text(
                program_path, state_path, "# Managed by numafleet.tuning", owned
            ),
        }
    paths = sorted(set(desired) | {state_path, program_path, posixpath.join(unit_dir, UNIT_NAME)})
    files = list(file_changes(read_files(root, paths), desired, paths))
    if not check_mode:
        write_files(root, files)
    unit_path = posixpath.join(unit_dir, UNIT_NAME)
    unit_changed = any(f.path == unit_path and f.state != "unchanged" for f in files)
    files_changed = any(f.state != "unchanged" for f in files)
    would_run = list(result["would_run"])
    if unit_changed and (check_mode or render):
        would_run += ["systemctl daemon-reload", f"systemctl enable {UNIT_NAME}"]
    result.update(
        changed=result["changed"] or files_changed,
        files=[f.as_dict() for f in files],
        reload_needed=unit_changed,
        would_run=would_run,
        warnings=warnings,
    )
    result["diff"] = result["diff"] + [f.as_diff() for f in files if f.state != "unchanged"]
    return result


class RunContext(NamedTuple):
    """What one run of the layer works with besides the changes and the backend: the module's
    ``params``, its mode (``check_mode``; ``render``: service_manager none), ``reset_ok``, the
    injected ``runner(argv) -> (rc, out, err)`` and ``which(name) -> path or None``, the roots
    the holders are read from, the PIDs that are not holders, and ``warnings`` (a list the run
    appends to)."""

    params: dict
    check_mode: bool
    render: bool
    reset_ok: bool
    runner: Callable
    which: Optional[Callable]
    procfs_root: str
    sysfs_root: str
    exclude_pids: tuple
    warnings: list


def _converge(changes, backend, context: RunContext) -> dict:
    """Check holders, then predict (check mode) or apply, re-read and check; the result dict."""
    params, check_mode, render = context.params, context.check_mode, context.render
    runner, which, warnings = context.runner, context.which, context.warnings
    owned = set(params.get("owned_units") or ())
    for change in changes:
        owned.update(change.owned_units)
    memory = [c for c in changes if c.memory_change]
    deferred = set()
    if memory and not context.reset_ok:
        for c in memory:
            deferred.add(c.address)
        warnings.append(
            "memory partition change of GPU(s) "
            + ", ".join(c.address for c in memory)
            + " needs a reload of the amdgpu driver (every AMD GPU of the host is reset): "
            "nothing was changed on them. Set numafleet_amd_reset_ok: true (role input "
            "amd_partition_reset_ok) to allow it, or reboot into the mode"
        )
    # GPUs with deferred memory changes are left entirely alone (compute too): the compute mode
    # may not be available before the memory mode changes.
    todo = [
        c for c in changes if (c.compute_change or c.memory_change) and c.address not in deferred
    ]
    reload = any(c.memory_change for c in todo)
    holders = (
        read_amd_holders(context.procfs_root, context.sysfs_root, context.exclude_pids)
        if todo
        else []
    )
    addresses = {c.address for c in todo}
    what = {
        c.address: "a memory partition change (amdgpu reload)"
        if c.memory_change
        else "a compute partition change"
        for c in todo
    }
    blocked, busy, stop = {}, [], set()
    for h in holders:
        hit = [a for a in sorted(addresses) if h.holds(a)] if not reload else sorted(addresses)
        if not hit:
            continue
        busy.append(h)
        if h.unit and h.unit in owned:
            stop.add(h.unit)
            continue
        for address in hit:
            blocked.setdefault(address, []).append(h)
    if blocked and not render:
        raise busy_refusal(blocked, what)
    stop_units = sorted(stop) if not render else []
    would_run, ran = [], []
    for unit in stop_units:
        would_run.append(f"systemctl stop {unit}")
    for c in todo:
        if c.memory_change:
            would_run.append(f"set memory partition of {c.address} to {c.memory[1]}")
        if c.compute_change:
            would_run.append(f"set compute partition of {c.address} to {c.compute[1]}")
    if reload and not render:
        would_run.append("reload the amdgpu driver")
    would_run += [f"systemctl start {unit}" for unit in stop_units]
    after = {c.address: (c.compute[1], c.memory[1]) for c in todo}
    if todo and not check_mode:
        ran = _apply(todo, backend, stop_units, reload and not render, runner, which, render)
        for c in todo:
            got = backend.read(c.address)
            now = (got["compute"]["current"], got["memory"]["current"])
            if now != after[c.address]:
                raise AmdPartitionError(
                    f"GPU {c.address}: after the change the GPU shows compute {now[0]}, memory "
                    f"{now[1]}, not {after[c.address][0]}, {after[c.address][1]}: the driver "
                    "refused part of it; see dmesg and run again"
                )
    gpus = [c.as_dict(c.address in deferred) for c in changes]
    shown = list(todo)
    drift = [
        {
            "setting": f"GPU {c.address} partition modes",
            "planned": f"compute {c.compute[1]}, memory {c.memory[1]}",
            "actual": f"compute {c.compute[0]}, memory {c.memory[0]}",
            "reason": "the memory partition change waits for an amdgpu reload (reset_ok)"
            if c.address in deferred
            else "",
            "pending": c.address in deferred,
        }
        for c in changes
        if c.compute_change or c.memory_change
    ]
    diff = []
    if shown:
        diff.append(
            {
                "before_header": "AMD GPU partitions",
                "after_header": "AMD GPU partitions",
                "before": _diff_text(shown, 0),
                "after": _diff_text(shown, 1),
            }
        )
    return {
        "changed": bool(todo),
        "gpus": gpus,
        "reset_required": bool(deferred),
        # RV(busy) of the amd module has no kind: every AMD holder is a process
        "busy": [{k: v for k, v in h.as_dict().items() if k != "kind"} for h in busy],
        "stopped_units": [] if check_mode else stop_units,
        "ran": ran,
        "would_run": would_run if (check_mode or render) else [],
        "gpu_changed": bool(todo) and not check_mode,
        "drift": drift,
        "diff": diff,
    }


def _apply(todo, backend, stop_units, reload, runner, which, render) -> list:
    """Stop owned units, set memory modes, reload once, set compute modes, start the units."""
    ran: list = []
    systemctl = (which("systemctl") if which else None) or "systemctl"

    def command(argv, line):
        rc, dummy, err = runner(argv)
        if rc != 0:
            raise AmdPartitionError(f"{line} failed (rc {rc}): {(err or '').strip()}")
        ran.append(line)

    stopped, error = [], None
    try:
        for unit in stop_units:
            command([systemctl, "stop", unit], f"systemctl stop {unit}")
            stopped.append(unit)
        for c in todo:
            if c.memory_change:
                ran.append(backend.set_memory(c.address, c.memory[1]))
        if reload:
            if hasattr(backend, "reload"):
                ran.append(backend.reload())
            else:
                for argv in backend.reload_argvs():
                    command(argv, " ".join(["modprobe"] + argv[1:]))
        for c in todo:
            if c.compute_change:
                ran.append(backend.set_compute(c.address, c.compute[1]))
    except AmdPartitionError as exc:
        error = exc
    failed = []
    for unit in stopped:
        try:
            command([systemctl, "start", unit], f"systemctl start {unit}")
        except AmdPartitionError as exc:
            failed.append(str(exc))
    if error is not None:
        extra = f" Also: {'; '.join(failed)}" if failed else ""
        raise AmdPartitionError(f"{error}{extra}") from None
    if failed:
        raise AmdPartitionError("the partition change was applied, but " + "; ".join(failed))
    return ran
