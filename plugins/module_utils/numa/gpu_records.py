# Private to this collection: may change in any release.
"""The GPU records and helpers that gpu.py and its readers share. Pure, no I/O.

gpu.py (sysfs inventory, merge), gpu_nvml.py (NVML), gpu_smi.py (``nvidia-smi -q -x``) and
gpu_snapshot.py (recorded state) import from here; this module imports none of them.
SysfsGpu is a GPU as sysfs shows it; GpuState is what NVML, nvidia-smi or a snapshot said,
its per-GPU records holding every ENRICHED_FIELDS key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import pci

SOURCE_SYSFS = "sysfs"
SOURCE_NVML = "nvml"
SOURCE_NVIDIA_SMI = "nvidia-smi"
SOURCE_SNAPSHOT = "snapshot"
SNAPSHOT_FORMAT = "numafleet.tuning/gpu-snapshot"
SNAPSHOT_VERSION = 1
NVIDIA_SMI_COMMAND = "nvidia-smi -q -x"

# Values the GPU's enrichment (NVML, nvidia-smi or snapshot) provides, in facts order.
ENRICHED_FIELDS = (
    "uuid",
    "name",
    "memory_total_mib",
    "compute_mode",
    "persistence_mode",
    "mig",
    "processes",
    "nvlink_peers",
    "nvlink_switches",
    "nvml_numa_node",
    "nvml_cpu_affinity",
)

# Words (64 CPUs each) asked of nvmlDeviceGetCpuAffinityWithinScope: 8192 CPUs, Linux's
# largest NR_CPUS.
NVML_AFFINITY_WORDS = 128

MIB = 1 << 20
GIB = 1 << 30

# Longest piece of a file or command output quoted in a message.
QUOTE_LIMIT = 80


@dataclass(frozen=True)
class SysfsGpu:
    """A GPU as sysfs shows it: PCI identity, locality and (AMD Instinct) partition modes."""

    address: str
    vendor: str
    vendor_id: Optional[str]
    device_id: Optional[str]
    numa_node: Optional[int]
    node: Optional[int]
    node_source: Optional[str]
    local_cpus: Optional[tuple]
    switch: Optional[str]
    root_port: Optional[str]
    partition: Optional[dict]
    numa_node_raw: Optional[int] = None  # the sysfs numa_node as written (-1: unknown)


@dataclass(frozen=True)
class GpuState:
    """What NVML, nvidia-smi or a snapshot said about the GPUs.

    ``gpus`` maps a PCI address (``0000:17:00.0``) to a record holding every ENRICHED_FIELDS key
    plus ``unavailable`` ({field: reason} for values the source could not give). ``source`` is
    where the records came from on the host that produced them (``nvml``, ``nvidia-smi`` or None);
    ``snapshot_path`` is set when they were read back from a snapshot file.
    """

    source: Optional[str]
    nvml: dict
    nvidia_smi: dict
    gpus: dict
    warnings: tuple = ()
    snapshot_path: Optional[str] = None
    amd: Optional[dict] = None  # {"amdsmi": fact, "gpus": {address: amd record}} (gpu_amd)

    @property
    def label(self) -> Optional[str]:
        """The source name each enriched value is credited to in the facts."""
        return SOURCE_SNAPSHOT if self.snapshot_path else self.source


# ---------------------------------------------------------------------------------------------
# Shared helpers


def clip(text: str) -> str:
    """``text`` cut to QUOTE_LIMIT characters with an ellipsis, so no message quotes a whole file."""
    return text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "..."


def quote(value) -> str:
    """repr() of ``value`` for a message, its text cut as by clip."""
    return repr(clip(value)) if isinstance(value, str) else clip(repr(value))


def normalise_bus_id(bus_id) -> str:
    """Kernel-style address (``0000:db:00.0``) of an NVML/nvidia-smi bus id; raises ValueError.

    NVML and nvidia-smi print an 8-digit upper-case domain (``00000000:DB:00.0``); the kernel
    prints at least 4 lower-case digits, so ``00000001:00:00.0`` (Hyper-V) becomes ``0001:00:00.0``.
    """
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    text = str(bus_id).replace("\0", "").strip()
    try:
        domain, bus, device, function = pci.parse_address(text)
    except ValueError:
        raise ValueError(f"{quote(text)} is not a PCI bus id like 00000000:DB:00.0") from None
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def mig_memory_gb(memory_mib: int, total_bytes: Optional[int]) -> Optional[int]:
    """The GB in a MIG profile name (``10`` in ``1g.10gb``), or None without the GPU's total.

    As nvidia-smi and go-nvlib do: the profile's share of the GPU memory is rounded up to whole
    eighths, times the GPU memory in whole GiB (rounded up), rounded half up.
    """
    if not total_bytes or total_bytes <= 0 or memory_mib <= 0:
        return None
    eighths = -(-(memory_mib * MIB * 8) // total_bytes)
    total_gb = -(-total_bytes // GIB)
    return (eighths * total_gb + 4) // 8


def clean_text(value) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = str(value).replace("\0", "").strip()
    return text or None


def empty_record() -> dict:
    record: dict = dict.fromkeys(ENRICHED_FIELDS)
    record["unavailable"] = {}
    return record


def address_key(address: str) -> tuple:
    try:
        return (0,) + pci.parse_address(address)
    except ValueError:
        return (1, address)


def sorted_warnings(warnings) -> list:
    unique = {(w["path"], w["reason"]) for w in warnings}
    return [{"path": path, "reason": reason} for path, reason in sorted(unique)]


def nvml_unavailable(reason: str, driver_version: Optional[str] = None) -> GpuState:
    """GPU state saying NVML cannot be used, and why; nothing else is known."""
    return GpuState(
        source=None,
        nvml={"available": False, "reason": reason, "driver_version": driver_version},
        nvidia_smi={"used": False, "reason": None, "driver_version": None},
        gpus={},
    )
