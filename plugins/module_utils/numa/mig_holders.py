# Private to this collection: may change in any release.
"""Who holds an NVIDIA GPU: what must let go before MIG instances are destroyed or a mode changes.

A MIG mode change, a GPU reset and destroying a GPU or compute instance all fail (or stay
pending) while a client has the GPU open, and NVML lists only the CUDA/graphics processes it
knows: a monitoring agent, DCGM or a stale ``nvidia-smi`` hold it without being listed
(NVIDIA/gpu-operator#118, NVIDIA/DCGM#95). So every process is looked at:

- ``<procfs_root>/<pid>/fd/*`` links whose target is ``/dev/nvidia*`` (os.readlink: the target
  need not exist where the tree is read). ``/dev/nvidiaN`` is the GPU with device minor N
  (``<procfs_root>/driver/nvidia/gpus/<address>/information``, line ``Device Minor:``); a minor
  nobody claims, and ``/dev/nvidiactl``, ``/dev/nvidia-uvm*``, ``/dev/nvidia-modeset`` and
  ``/dev/nvidia-caps/*``, count for every GPU;
- daemons by ``<procfs_root>/<pid>/comm``: nvidia-persistenced, nv-hostengine (DCGM) and
  nv-fabricmanager hold every GPU even when their descriptors cannot be read;
- a loaded ``nvidia_drm`` module (``<sysfs_root>/module/nvidia_drm``) holds every GPU.

A process's systemd unit comes from ``<procfs_root>/<pid>/cgroup`` (read_pid_unit),
so the MIG layer can stop units it owns and refuse the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

DEV_PREFIX = "/dev/nvidia"
# comm (cut to 15 characters by the kernel) -> (daemon, the unit that runs it)
DAEMONS = {
    "nvidia-persistenced": ("nvidia-persistenced", "nvidia-persistenced.service"),
    "nvidia-persiste": ("nvidia-persistenced", "nvidia-persistenced.service"),
    "nv-hostengine": ("nv-hostengine (DCGM)", "nvidia-dcgm.service"),
    "nv-fabricmanager": ("nv-fabricmanager", "nvidia-fabricmanager.service"),
    "nv-fabricmanage": ("nv-fabricmanager", "nvidia-fabricmanager.service"),
}
KIND_PROCESS, KIND_DAEMON, KIND_MODULE = "process", "daemon", "module"
_DELETED = " (deleted)"


@dataclass(frozen=True)
class Holder:
    """One holder of GPUs: NVIDIA ones (read_holders) or AMD ones (amd_partition.read_amd_holders).

    ``kind``: ``process`` (a GPU device file open: /dev/nvidia*, or /dev/kfd and /dev/dri/* for
    AMD), ``daemon`` (DAEMONS) or ``module``
    (nvidia_drm). ``pid``/``comm``/``unit`` are None for the module (``unit`` also when the
    process is in no systemd service). ``devices``: the /dev paths it has open, sorted.
    ``gpus``: the PCI addresses it holds; () means every GPU.
    """

    kind: str
    pid: Optional[int]
    comm: Optional[str]
    unit: Optional[str]
    devices: tuple
    gpus: tuple

    def holds(self, address: str) -> bool:
        """Whether this holder has GPU ``address`` open (or every GPU)."""
        return not self.gpus or address in self.gpus

    def text(self) -> str:
        """'pid 4242 (python3, team-a.service: /dev/nvidia0, /dev/nvidiactl)' and the like
        (AMD: 'pid 4242 (python3, team-a.service: /dev/dri/renderD128, /dev/kfd)')."""
        if self.kind == KIND_MODULE:
            return "the nvidia_drm kernel module (a display or DRM client may hold the GPU)"
        where = self.unit or "not in a systemd service"
        name = DAEMONS[self.comm][0] if self.kind == KIND_DAEMON else self.comm or "?"
        devices = f": {', '.join(self.devices)}" if self.devices else ""
        return f"pid {self.pid} ({name}, {where}{devices})"

    def as_dict(self) -> dict:
        """{kind, pid, comm, unit, devices, gpus} (lists), JSON-ready."""
        return {
            "kind": self.kind,
            "pid": self.pid,
            "comm": self.comm,
            "unit": self.unit,
            "devices": list(self.devices),
            "gpus": list(self.gpus),
        }


def parse_device_minor(text: str) -> Optional[int]:
    """The ``Device Minor:`` number of a /proc/driver/nvidia/gpus/<address>/information text."""
    for line in text.splitlines():
        key, dummy, value = line.partition(":")
        if key.strip() == "Device Minor":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


def read_gpu_minors(procfs_root: str = "/proc") -> dict:
    """{PCI address: device minor} from <procfs_root>/driver/nvidia/gpus/*/information; never raises."""
    base = os.path.join(procfs_root, "driver", "nvidia", "gpus")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    minors = {}
    for name in names:
        try:
            with open(os.path.join(base, name, "information"), encoding="utf-8") as handle:
                minor = parse_device_minor(handle.read(65536))
        except (OSError, UnicodeDecodeError):
            continue
        if minor is not None:
            minors[name.lower()] = minor
    return minors


def device_gpus(device: str, minors: dict) -> tuple:
    """The GPU addresses a /dev/nvidia* path reaches: the one of its minor, else () (every GPU)."""
    tail = device[len(DEV_PREFIX) :]
    if tail.isdigit():
        found = sorted(address for address, minor in minors.items() if minor == int(tail))
        return tuple(found)
    return ()


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(4096)
    except (OSError, UnicodeDecodeError):
        return None


def open_devices(fd_dir: str, prefixes=(DEV_PREFIX,)) -> list:
    """The sorted /dev paths starting with one of ``prefixes`` that the fd links of ``fd_dir``
    (``<procfs_root>/<pid>/fd``) point at (os.readlink: the target need not exist where the tree
    is read; a `` (deleted)`` tail is dropped); [] when unreadable. Shared by the MIG holders and
    the AMD partition holders (amd_partition.read_amd_holders)."""
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    devices = set()
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.endswith(_DELETED):
            target = target[: -len(_DELETED)]
        if target.startswith(tuple(prefixes)):
            devices.add(target)
    return sorted(devices)


def read_pid_unit(procfs_root: str, pid: int) -> Optional[str]:
    """The systemd service of ``pid`` (last ``.service`` in /proc/<pid>/cgroup), None if unknown."""
    try:
        with open(os.path.join(procfs_root, str(pid), "cgroup"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    lines.sort(key=lambda line: not line.startswith("0::"))  # the unified hierarchy first
    for line in lines:
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith(".service"):
                return part
    return None


def process_ids(procfs_root: str, exclude_pids=()) -> list:
    """The PIDs under ``procfs_root`` (numeric entries), ascending, without ``exclude_pids``."""
    skip = {int(pid) for pid in exclude_pids}
    try:
        names = os.listdir(procfs_root)
    except OSError:
        return []
    return [
        int(n) for n in sorted((n for n in names if n.isdigit()), key=int) if int(n) not in skip
    ]


def read_comm(procfs_root: str, pid: int) -> Optional[str]:
    """<procfs_root>/<pid>/comm stripped, None when unreadable or empty."""
    return (_read(os.path.join(procfs_root, str(pid), "comm")) or "").strip() or None


def read_holders(
    procfs_root: str = "/proc",
    sysfs_root: str = "/sys",
    minors: Optional[dict] = None,
    exclude_pids=(),
) -> list:
    """Every holder of NVIDIA GPUs on the host (Holder), sorted: processes by pid, then the module.

    ``minors``: {address: device minor} (read_gpu_minors when None). ``exclude_pids``: PIDs
    that are not holders to report (the module's own process, which has NVML open). Unreadable
    entries are skipped (a process may exit while it is read); never raises.
    """
    if minors is None:
        minors = read_gpu_minors(procfs_root)
    holders = []
    for pid in process_ids(procfs_root, exclude_pids):
        devices = open_devices(os.path.join(procfs_root, str(pid), "fd"))
        comm = read_comm(procfs_root, pid)
        daemon = comm in DAEMONS
        if not devices and not daemon:
            continue
        gpus: set = set()
        every = daemon
        for device in devices:
            reached = device_gpus(device, minors)
            if reached:
                gpus.update(reached)
            else:
                every = True
        holders.append(
            Holder(
                kind=KIND_DAEMON if daemon else KIND_PROCESS,
                pid=pid,
                comm=comm,
                unit=read_pid_unit(procfs_root, pid),
                devices=tuple(devices),
                gpus=() if every else tuple(sorted(gpus)),
            )
        )
    if os.path.exists(os.path.join(sysfs_root, "module", "nvidia_drm")):
        holders.append(Holder(KIND_MODULE, None, None, None, (), ()))
    return holders


def foreign(holders: list, owned_units) -> list:
    """Holders the MIG layer may not stop: daemons, the module, and processes outside
    ``owned_units`` (or in no unit)."""
    owned = set(owned_units)
    return [h for h in holders if h.kind != KIND_PROCESS or h.unit is None or h.unit not in owned]


def holders_message(blocked: dict, what: dict) -> str:
    """The refusal: ``blocked`` {address: [Holder]} of the GPUs a change would disrupt, with
    ``what`` {address: the change} ('destroying GPU instance(s) 2', 'a MIG mode change')."""
    lines = []
    for address in sorted(blocked):
        texts = "; ".join(h.text() for h in blocked[address])
        lines.append(f"GPU {address} ({what.get(address, 'a MIG change')}) is held by {texts}")
    return (
        "the MIG change is refused: "
        + ". ".join(lines)
        + ". Stop them (systemctl stop the unit, modprobe -r nvidia_drm) and run again, or "
        "reboot the host; units of the plan's placements and MPS daemons are stopped and "
        "started again by the change itself"
    )
