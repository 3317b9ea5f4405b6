# Private to this collection: may change in any release.
"""GPUs on PCI with their NUMA locality, enriched from NVML, ``nvidia-smi -q -x`` or a snapshot.

sysfs is the inventory and the only source of locality: a GPU is reported because it sits under
``/sys/bus/pci/devices``, and its node comes from there. NVML (through a pynvml-like object the
caller passes in), nvidia-smi's XML or a recorded snapshot only add what sysfs cannot know: UUID,
name, memory, modes, MIG layout, processes and NVLink peers. NVML's own NUMA id (the node of the
GPU's memory on coherent systems such as GH200) is kept apart as ``nvml_numa_node``.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib.util
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, replace
from typing import Callable, Optional

from . import pci, topology
from .errors import CommandOutputError, NumaTuneError, SnapshotError
from .sysfs import Reader

SOURCE_SYSFS = "sysfs"
SOURCE_NVML = "nvml"
SOURCE_NVIDIA_SMI = "nvidia-smi"
SOURCE_SNAPSHOT = "snapshot"
SNAPSHOT_FORMAT = "numafleet.tuning/gpu-snapshot"
SNAPSHOT_VERSION = 1
NVIDIA_SMI_COMMAND = "nvidia-smi -q -x"
NVIDIA_SMI_MODES = ("auto", "always", "never")
# The library pynvml's nvmlInit loads on Linux, and the reason read_nvml gives when that fails
# (pynvml raises NVMLError_LibraryNotFound, "NVML Shared Library Not Found").
NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_LIBRARY_MISSING = "nvmlInit failed: NVML Shared Library Not Found"
_NVML_MODULE = "pynvml"
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
)
_SYSFS_FIELDS = (
    "address",
    "vendor",
    "vendor_id",
    "device_id",
    "numa_node",
    "node",
    "local_cpus",
    "switch",
    "root_port",
    "partition",
)
_VENDORS = {pci.VENDOR_NVIDIA: "nvidia", pci.VENDOR_AMD: "amd"}
_MIB = 1 << 20
_GIB = 1 << 30
_SNAPSHOT_LIMIT = 64 << 20
_CARD_RE = re.compile(r"^card[0-9]+$")
# NVML_GPU_INSTANCE_PROFILE_<n>_SLICE[_<variant>]: the variant decides the name suffix, as in
# nvidia-smi and NVIDIA's go-nvlib (REV1 = with media extensions, REV2 = double memory).
# Patterns only NVML needs are compiled when first used (re caches them), not at import.
_GI_CONSTANT_RE = r"^NVML_GPU_INSTANCE_PROFILE_([0-9]+)_SLICE(?:_([A-Z0-9_]+))?$"
_GI_SUFFIXES = {
    None: "",
    "REV1": "+me",
    "REV2": "",
    "GFX": "+gfx",
    "NO_ME": "-me",
    "ALL_ME": "+me.all",
}
_CI_CONSTANT_RE = r"^NVML_COMPUTE_INSTANCE_PROFILE_([0-9]+)_SLICE(?:_[A-Z0-9]+)?$"
_NOT_AVAILABLE = ("", "n/a", "none")
# nvidia-smi's spellings of the values the facts give in lower case.
_XML_SWITCH = ("Enabled", "Disabled")
_XML_COMPUTE_MODES = ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")
# coreutils timeout: 124 when the command ran out of time, 137 when it had to be killed.
_TIMEOUT_STATUSES = (124, 137)
_KILL_AFTER_S = 5
# A real ``nvidia-smi -q -x`` report is well under a MiB per GPU.
_OUTPUT_LIMIT = 64 << 20
# Longest piece of a file or command output quoted in a message.
_QUOTE_LIMIT = 80
_SNAPSHOT_FILE_FIX = "Point snapshot at a JSON file written by numafleet.tuning.gpu_topology_facts snapshot_out=PATH."
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


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

    @property
    def label(self) -> Optional[str]:
        """The source name each enriched value is credited to in the facts."""
        return SOURCE_SNAPSHOT if self.snapshot_path else self.source


class _NvmlMissing(NumaTuneError):
    """The pynvml-like object lacks a function (an old nvidia-ml-py)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is missing from this nvidia-ml-py; upgrade nvidia-ml-py")


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _clip(text: str) -> str:
    """``text`` cut to _QUOTE_LIMIT characters with an ellipsis, so no message quotes a whole file."""
    return text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "..."


def _quote(value) -> str:
    """repr() of ``value`` for a message, its text cut as by _clip."""
    return repr(_clip(value)) if isinstance(value, str) else _clip(repr(value))


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
        raise ValueError(f"{_quote(text)} is not a PCI bus id like 00000000:DB:00.0") from None
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def mig_memory_gb(memory_mib: int, total_bytes: Optional[int]) -> Optional[int]:
    """The GB in a MIG profile name (``10`` in ``1g.10gb``), or None without the GPU's total.

    As nvidia-smi and go-nvlib do: the profile's share of the GPU memory is rounded up to whole
    eighths, times the GPU memory in whole GiB (rounded up), rounded half up.
    """
    if not total_bytes or total_bytes <= 0 or memory_mib <= 0:
        return None
    eighths = -(-(memory_mib * _MIB * 8) // total_bytes)
    total_gb = -(-total_bytes // _GIB)
    return (eighths * total_gb + 4) // 8


def _text(value) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = str(value).replace("\0", "").strip()
    return text or None


def _empty_record() -> dict:
    record: dict = dict.fromkeys(ENRICHED_FIELDS)
    record["unavailable"] = {}
    return record


def _address_key(address: str) -> tuple:
    try:
        return (0,) + pci.parse_address(address)
    except ValueError:
        return (1, address)


def _sorted_warnings(warnings) -> list:
    unique = {(w["path"], w["reason"]) for w in warnings}
    return [{"path": path, "reason": reason} for path, reason in sorted(unique)]


# ---------------------------------------------------------------------------------------------
# sysfs: the inventory and the locality


def _partition_modes(reader: Reader, device: str, kind: str) -> Optional[dict]:
    current = reader.text(f"{device}/current_{kind}_partition", optional=True)
    available = reader.text(f"{device}/available_{kind}_partition", optional=True)
    if current is None and available is None:
        return None
    modes = [token.upper() for token in re.split(r"[\s,]+", available or "") if token]
    return {"current": current.upper() if current else None, "available": modes}


def read_amd_partitions(reader: Reader) -> dict:
    """{PCI address: {compute, memory}} of AMD Instinct partition modes of class/drm/card* devices.

    Reads ``{current,available}_{compute,memory}_partition`` of each card's device (the directory
    two levels above the resolved ``class/drm/cardN`` link, which is what ``cardN/device`` points
    to); a kind the driver does not offer is None. Cards whose device is not a PCI function (the
    per-partition ``amdgpu_xcp`` platform devices in CPX mode) are skipped.
    """
    base = reader.sys("class", "drm")
    found: dict = {}
    for name in reader.listdir(base, optional=True):
        if not _CARD_RE.match(name):
            continue
        device = os.path.dirname(os.path.dirname(reader.realpath(f"{base}/{name}")))
        address = os.path.basename(device).lower()
        try:
            pci.parse_address(address)
        except ValueError:
            continue
        if address in found:
            continue
        compute = _partition_modes(reader, device, "compute")
        memory = _partition_modes(reader, device, "memory")
        if compute is not None or memory is not None:
            found[address] = {"compute": compute, "memory": memory}
    return found


def read_gpus(reader: Reader, node_cpus: dict) -> list:
    """NVIDIA and AMD GPUs under <sysfs_root>/bus/pci/devices with their locality, by address.

    ``node_cpus`` ({node: CPUs}) lets a GPU whose ``numa_node`` is -1 take the one node whose CPUs
    equal its local CPUs. Bad files become warnings on ``reader``; nothing raises.
    """
    partitions = read_amd_partitions(reader)
    gpus = []
    for dev in pci.read_pci_devices(reader, node_cpus):
        if dev.kind != "gpu":
            continue
        vendor = _VENDORS.get(dev.vendor_id or "", "unknown")
        gpus.append(
            SysfsGpu(
                address=dev.address,
                vendor=vendor,
                vendor_id=dev.vendor_id,
                device_id=dev.device_id,
                numa_node=dev.numa_node,
                node=dev.node,
                node_source=dev.node_source,
                local_cpus=dev.local_cpus,
                switch=dev.switch,
                root_port=dev.root_port,
                partition=partitions.get(dev.address) if vendor == "amd" else None,
            )
        )
    return gpus


# ---------------------------------------------------------------------------------------------
# NVML, through a pynvml-like object passed in by the caller


class _Query:
    """Calls into the pynvml-like object; NVMLError becomes a recorded reason where asked."""

    def __init__(self, nvml) -> None:
        self.nvml = nvml
        self.error = nvml.NVMLError
        self.failures = (nvml.NVMLError, _NvmlMissing)

    def call(self, name: str, *args):
        function = getattr(self.nvml, name, None)
        if function is None:
            raise _NvmlMissing(name)
        return function(*args)

    @staticmethod
    def reason(name: str, exc) -> str:
        return str(exc) if isinstance(exc, _NvmlMissing) else f"{name}: {exc}"

    def attempt(self, unavailable: dict, key: str, name: str, *args):
        try:
            return self.call(name, *args)
        except self.failures as exc:
            unavailable[key] = self.reason(name, exc)
        return None

    def constant(self, name: str, default: int) -> int:
        value = getattr(self.nvml, name, default)
        return value if isinstance(value, int) else default

    def is_code(self, exc, name: str) -> bool:
        return getattr(exc, "value", None) == getattr(self.nvml, name, object())

    def handles(self, function: str, owner, profile_id: int, handle_type, capacity: int) -> list:
        array = (handle_type * max(capacity, 1))()
        count = ctypes.c_uint(0)
        self.call(function, owner, profile_id, array, ctypes.byref(count))
        return [array[index] for index in range(min(count.value, len(array)))]


def nvml_unavailable(reason: str, driver_version: Optional[str] = None) -> GpuState:
    """GPU state saying NVML cannot be used, and why; nothing else is known."""
    return GpuState(
        source=None,
        nvml={"available": False, "reason": reason, "driver_version": driver_version},
        nvidia_smi={"used": False, "reason": None, "driver_version": None},
        gpus={},
    )


def _compute_mode(query: _Query, value) -> Optional[str]:
    if value is None:
        return None
    names = {
        query.constant("NVML_COMPUTEMODE_DEFAULT", 0): "default",
        query.constant("NVML_COMPUTEMODE_EXCLUSIVE_THREAD", 1): "exclusive_thread",
        query.constant("NVML_COMPUTEMODE_PROHIBITED", 2): "prohibited",
        query.constant("NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", 3): "exclusive_process",
    }
    return names.get(value, f"unknown ({value})")


def _switch_word(query: _Query, value, enabled_name: str) -> Optional[str]:
    if value is None:
        return None
    return "enabled" if value == query.constant(enabled_name, 1) else "disabled"


def _profile_name(raw) -> Optional[str]:
    name = _text(raw)
    if name and name.startswith("MIG "):
        name = name[4:].strip()
    return name or None


def _constants(query: _Query, pattern: str) -> list:
    pattern = re.compile(pattern)
    found = []
    for name in dir(query.nvml):
        match = pattern.match(name)
        value = getattr(query.nvml, name, None) if match else None
        if isinstance(value, int) and not isinstance(value, bool):
            found.append((value, match.groups()[-1] if match.groups() else None))
    return sorted(set(found), key=lambda item: item[0])


def _read_placements(query: _Query, handle, profile_id: int, miss: dict) -> Optional[list]:
    name = "nvmlDeviceGetGpuInstancePossiblePlacements"
    try:
        count = ctypes.c_uint(0)
        query.call(name, handle, profile_id, None, ctypes.byref(count))
        size = count.value
        array = (query.nvml.c_nvmlGpuInstancePlacement_t * max(size, 1))()
        count = ctypes.c_uint(size)
        query.call(name, handle, profile_id, array, ctypes.byref(count))
    except query.failures as exc:
        miss[f"mig.supported_profiles.{profile_id}.placements"] = query.reason(name, exc)
        return None
    spots = {(int(array[i].start), int(array[i].size)) for i in range(min(count.value, len(array)))}
    return [{"start": start, "size": size} for start, size in sorted(spots)]


def _read_gi_profiles(query: _Query, handle, total_bytes, miss: dict) -> Optional[list]:
    """[(public profile dict, gb, suffix)] of the GPU instance profiles the GPU supports."""
    name = "nvmlDeviceGetGpuInstanceProfileInfo"
    found, seen, last = [], set(), None
    for constant, variant in _constants(query, _GI_CONSTANT_RE):
        try:
            info = query.call(name, handle, constant)
        except query.failures as exc:  # NOT_SUPPORTED for profiles this GPU lacks
            last = query.reason(name, exc)
            continue
        profile_id = int(info.id)
        if profile_id in seen:
            continue
        seen.add(profile_id)
        slices, memory = int(info.sliceCount), int(info.memorySizeMB)
        suffix = _GI_SUFFIXES.get(variant, "")
        gb = mig_memory_gb(memory, total_bytes)
        derived = f"{slices}g.{gb}gb{suffix}" if gb is not None else None
        public = {
            "name": _profile_name(getattr(info, "name", None)) or derived,
            "id": profile_id,
            "max_count": int(info.instanceCount),
            "slice_count": slices,
            "memory_mib": memory,
            "placements": _read_placements(query, handle, profile_id, miss),
        }
        found.append((public, gb, suffix))
    if not found:
        miss["mig.supported_profiles"] = (
            last or "this nvidia-ml-py defines no GPU instance profiles"
        )
        return None
    found.sort(key=lambda item: (item[0]["slice_count"], item[0]["memory_mib"], item[0]["id"]))
    return found


def _read_mig_uuids(query: _Query, handle, miss: dict) -> dict:
    """{(GPU instance id, compute instance id): MIG device UUID}."""
    count = query.attempt(miss, "mig.mig_device_uuid", "nvmlDeviceGetMaxMigDeviceCount", handle)
    uuids = {}
    for index in range(count or 0):
        name = "nvmlDeviceGetMigDeviceHandleByIndex"
        try:
            mig = query.call(name, handle, index)
            name = "nvmlDeviceGetGpuInstanceId"
            gpu_instance = int(query.call(name, mig))
            name = "nvmlDeviceGetComputeInstanceId"
            compute_instance = int(query.call(name, mig))
            name = "nvmlDeviceGetUUID"
            uuids[(gpu_instance, compute_instance)] = _text(query.call(name, mig))
        except query.failures as exc:
            if not query.is_code(exc, "NVML_ERROR_NOT_FOUND"):  # NOT_FOUND: an empty slot
                miss["mig.mig_device_uuid"] = query.reason(name, exc)
    return uuids


def _read_compute_instances(query: _Query, gpu_instance, parent: tuple, gi_id, uuids, miss):
    public, gb, suffix = parent
    engine = query.constant("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    found, seen = [], set()
    for constant, dummy in _constants(query, _CI_CONSTANT_RE):
        name = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        try:
            info = query.call(name, gpu_instance, constant, engine)
            if int(info.id) in seen:
                continue
            seen.add(int(info.id))
            name = "nvmlGpuInstanceGetComputeInstances"
            handles = query.handles(
                name,
                gpu_instance,
                int(info.id),
                query.nvml.c_nvmlComputeInstance_t,
                int(info.instanceCount),
            )
            name = "nvmlComputeInstanceGetInfo"
            details = [query.call(name, handle) for handle in handles]
        except query.failures as exc:
            if not query.is_code(exc, "NVML_ERROR_NOT_SUPPORTED"):
                miss["mig.compute_instances"] = query.reason(name, exc)
            continue
        slices, gslices = int(info.sliceCount), public["slice_count"]
        derived = None
        if gb is not None:
            prefix = "" if slices == gslices else f"{slices}c."
            derived = f"{prefix}{gslices}g.{gb}gb{suffix}"
        profile_name = _profile_name(getattr(info, "name", None)) or derived
        for detail in details:
            found.append(
                {
                    "id": int(detail.id),
                    "profile_id": int(detail.profileId),
                    "profile_name": profile_name,
                    "mig_device_uuid": uuids.get((gi_id, int(detail.id))),
                }
            )
    return sorted(found, key=lambda item: item["id"])


def _read_gpu_instances(query: _Query, handle, profiles, miss: dict) -> Optional[list]:
    if profiles is None:
        miss["mig.gpu_instances"] = (
            "the GPU instance profiles are unknown, so no instance is listed"
        )
        return None
    uuids = _read_mig_uuids(query, handle, miss)
    instances = []
    for parent in profiles:
        public = parent[0]
        name = "nvmlDeviceGetGpuInstances"
        try:
            handles = query.handles(
                name, handle, public["id"], query.nvml.c_nvmlGpuInstance_t, public["max_count"]
            )
            name = "nvmlGpuInstanceGetInfo"
            infos = [(gi, query.call(name, gi)) for gi in handles]
        except query.failures as exc:
            miss["mig.gpu_instances"] = query.reason(name, exc)
            continue
        for gpu_instance, info in infos:
            gi_id = int(info.id)
            computes = _read_compute_instances(query, gpu_instance, parent, gi_id, uuids, miss)
            instances.append(
                {
                    "id": gi_id,
                    "profile_id": int(info.profileId),
                    "profile_name": public["name"],
                    "placement_start": int(info.placement.start),
                    "placement_size": int(info.placement.size),
                    "compute_instances": computes,
                    "mig_device_uuid": computes[0]["mig_device_uuid"]
                    if len(computes) == 1
                    else None,
                }
            )
    return sorted(instances, key=lambda item: item["id"])


def _read_mig(query: _Query, handle, total_bytes, miss: dict) -> Optional[dict]:
    modes = query.attempt(miss, "mig", "nvmlDeviceGetMigMode", handle)
    if modes is None:
        return None
    current, pending = modes
    profiles = _read_gi_profiles(query, handle, total_bytes, miss)
    enabled = current == query.constant("NVML_DEVICE_MIG_ENABLE", 1)
    return {
        "mode_current": _switch_word(query, current, "NVML_DEVICE_MIG_ENABLE"),
        "mode_pending": _switch_word(query, pending, "NVML_DEVICE_MIG_ENABLE"),
        "gpu_instances": _read_gpu_instances(query, handle, profiles, miss) if enabled else [],
        "supported_profiles": [item[0] for item in profiles] if profiles is not None else None,
    }


def _read_processes(query: _Query, handle, miss: dict) -> Optional[list]:
    pids, reasons, answered = set(), [], False
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            processes = query.call(name, handle)
        except query.failures as exc:
            reasons.append(query.reason(name, exc))
            continue
        answered = True
        pids.update(int(process.pid) for process in processes)
    if not answered:
        miss["processes"] = "; ".join(reasons)
        return None
    return sorted(pids)


def _read_nvlink(query: _Query, handle, miss: dict) -> tuple:
    """(direct GPU peers, NVSwitches) over active NVLinks; (None, None) without NVLink."""
    active = query.constant("NVML_FEATURE_ENABLED", 1)
    switch_type = query.constant("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    peers, switches = set(), set()
    for link in range(query.constant("NVML_NVLINK_MAX_LINKS", 18)):
        name = "nvmlDeviceGetNvLinkState"
        try:
            if query.call(name, handle, link) != active:
                continue
            name = "nvmlDeviceGetNvLinkRemotePciInfo"
            remote = normalise_bus_id(query.call(name, handle, link).busId)
        except query.failures as exc:
            if link == 0 and name == "nvmlDeviceGetNvLinkState":  # no NVLink at all
                miss["nvlink_peers"] = miss["nvlink_switches"] = query.reason(name, exc)
                return None, None
            continue  # links past the GPU's last one answer INVALID_ARGUMENT
        except ValueError as exc:
            miss[f"nvlink.link{link}"] = str(exc)
            continue
        kind = query.attempt({}, "", "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        (switches if kind == switch_type else peers).add(remote)
    return sorted(peers), sorted(switches)


def _read_device(query: _Query, handle) -> dict:
    record = _empty_record()
    miss = record["unavailable"]
    record["uuid"] = _text(query.attempt(miss, "uuid", "nvmlDeviceGetUUID", handle))
    record["name"] = _text(query.attempt(miss, "name", "nvmlDeviceGetName", handle))
    memory = query.attempt(miss, "memory_total_mib", "nvmlDeviceGetMemoryInfo", handle)
    total = int(memory.total) if memory is not None else None
    record["memory_total_mib"] = total // _MIB if total is not None else None
    mode = query.attempt(miss, "compute_mode", "nvmlDeviceGetComputeMode", handle)
    record["compute_mode"] = _compute_mode(query, mode)
    persistence = query.attempt(miss, "persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    record["persistence_mode"] = _switch_word(query, persistence, "NVML_FEATURE_ENABLED")
    record["mig"] = _read_mig(query, handle, total, miss)
    record["processes"] = _read_processes(query, handle, miss)
    record["nvlink_peers"], record["nvlink_switches"] = _read_nvlink(query, handle, miss)
    node = query.attempt(miss, "nvml_numa_node", "nvmlDeviceGetNumaNodeId", handle)
    record["nvml_numa_node"] = node if isinstance(node, int) and node >= 0 else None
    return record


def _link_switch_peers(gpus: dict) -> None:
    """GPUs on a common NVSwitch are NVLink peers of each other (HGX all-to-all)."""
    members: dict = {}
    for address, record in gpus.items():
        for switch in record["nvlink_switches"] or ():
            members.setdefault(switch, set()).add(address)
    for address, record in gpus.items():
        if record["nvlink_peers"] is None:
            continue
        reach = set(record["nvlink_peers"])
        for switch in record["nvlink_switches"] or ():
            reach |= members[switch]
        reach.discard(address)
        record["nvlink_peers"] = sorted(reach, key=_address_key)


def _read_initialised(query: _Query) -> GpuState:
    status: dict = {}
    driver = _text(query.attempt(status, "driver", "nvmlSystemGetDriverVersion"))
    try:
        count = int(query.call("nvmlDeviceGetCount"))
    except query.failures as exc:
        return nvml_unavailable(query.reason("nvmlDeviceGetCount", exc), driver)
    gpus, warnings = {}, []
    for index in range(count):
        name = "nvmlDeviceGetHandleByIndex"
        try:
            handle = query.call(name, index)
            name = "nvmlDeviceGetPciInfo"
            address = normalise_bus_id(query.call(name, handle).busId)
        except query.failures as exc:
            warnings.append({"path": f"nvml:device{index}", "reason": query.reason(name, exc)})
            continue
        except ValueError as exc:
            warnings.append({"path": f"nvml:device{index}", "reason": str(exc)})
            continue
        gpus[address] = _read_device(query, handle)
    _link_switch_peers(gpus)
    return GpuState(
        source=SOURCE_NVML,
        nvml={"available": True, "reason": None, "driver_version": driver},
        nvidia_smi={"used": False, "reason": "not needed: NVML answered", "driver_version": None},
        gpus=gpus,
        warnings=tuple(warnings),
    )


def read_nvml(nvml) -> GpuState:
    """GPU state read through ``nvml``, a pynvml-like module object; never raises for NVML errors.

    A failing ``nvmlInit`` (no driver, no libnvidia-ml) gives ``nvml.available: false`` and the
    reason. Each other NVMLError is caught per value: that value is None and the reason is kept
    in the GPU's ``unavailable`` map. ``nvmlShutdown`` is always called after a successful init.
    """
    query = _Query(nvml)
    try:
        query.call("nvmlInit")
    except query.failures as exc:
        return nvml_unavailable(f"nvmlInit failed: {exc}")
    try:
        return _read_initialised(query)
    finally:
        try:
            query.call("nvmlShutdown")
        except query.failures:
            pass


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q -x


def _xml_value(element, path: str, miss: dict, key: str) -> Optional[str]:
    found = element.find(path)
    if found is None:
        miss[key] = f"nvidia-smi printed no <{path}>"
        return None
    text = (found.text or "").strip()
    if text.lower() in _NOT_AVAILABLE or text.startswith("["):
        miss[key] = f"nvidia-smi reports {_clip(text) or 'nothing'} for <{path}>"
        return None
    return text


def _xml_choice(text: Optional[str], spellings: tuple, miss: dict, key: str, label: str):
    """The lower-case value of nvidia-smi's spelling ``text``; None (reason in ``miss``) if unknown.

    An unknown spelling must not pass through: a snapshot would record it and then refuse it.
    """
    if text is None:
        return None
    value = re.sub(r"[\s-]+", "_", text.strip()).lower()
    if value in (spelling.lower() for spelling in spellings):
        return value
    miss[key] = f"nvidia-smi: {label} {_quote(text)} is not one of {', '.join(spellings)}"
    return None


def _xml_int(text: Optional[str]) -> Optional[int]:
    token = (text or "").split(" ", 1)[0]
    return int(token) if token.isascii() and token.isdigit() else None


def _xml_mig(element, miss: dict) -> Optional[dict]:
    raw = _xml_value(element, "mig_mode/current_mig", miss, "mig")
    current = _xml_choice(raw, _XML_SWITCH, miss, "mig", "mig mode_current")
    if current is None:
        return None
    raw = _xml_value(element, "mig_mode/pending_mig", {}, "")
    pending = current
    if raw is not None:  # absent or N/A: no change is pending
        pending = _xml_choice(raw, _XML_SWITCH, miss, "mig.mode_pending", "mig mode_pending")
    instances: dict = {}
    for device in element.findall("mig_devices/mig_device"):
        gpu_instance = _xml_int(device.findtext("gpu_instance_id"))
        compute_instance = _xml_int(device.findtext("compute_instance_id"))
        if gpu_instance is None:
            continue
        computes = instances.setdefault(gpu_instance, set())
        if compute_instance is not None:
            computes.add(compute_instance)
    miss["mig.supported_profiles"] = "not reported by nvidia-smi -q"
    if instances:
        miss["mig.gpu_instances"] = "nvidia-smi -q gives instance ids only, not profiles or UUIDs"
    return {
        "mode_current": current,
        "mode_pending": pending,
        "gpu_instances": [
            {
                "id": gi_id,
                "profile_id": None,
                "profile_name": None,
                "placement_start": None,
                "placement_size": None,
                "compute_instances": [
                    {"id": ci_id, "profile_id": None, "profile_name": None, "mig_device_uuid": None}
                    for ci_id in sorted(instances[gi_id])
                ],
                "mig_device_uuid": None,
            }
            for gi_id in sorted(instances)
        ],
        "supported_profiles": None,
    }


def _xml_record(element) -> dict:
    record = _empty_record()
    miss = record["unavailable"]
    record["uuid"] = _xml_value(element, "uuid", miss, "uuid")
    record["name"] = _xml_value(element, "product_name", miss, "name")
    total = _xml_value(element, "fb_memory_usage/total", miss, "memory_total_mib")
    record["memory_total_mib"] = _xml_int(total)
    if total is not None and record["memory_total_mib"] is None:
        miss["memory_total_mib"] = f"nvidia-smi printed {_quote(total)}, not a size in MiB"
    for key, spellings in (("compute_mode", _XML_COMPUTE_MODES), ("persistence_mode", _XML_SWITCH)):
        value = _xml_value(element, key, miss, key)
        record[key] = _xml_choice(value, spellings, miss, key, key)
    record["mig"] = _xml_mig(element, miss)
    if element.find("processes") is None:
        miss["processes"] = "nvidia-smi printed no <processes>"
    else:
        pids = {
            _xml_int(item.findtext("pid")) for item in element.findall("processes/process_info")
        }
        record["processes"] = sorted(pid for pid in pids if pid is not None)
    for key in ("nvlink_peers", "nvlink_switches", "nvml_numa_node"):
        miss[key] = "not reported by nvidia-smi -q"
    return record


def parse_nvidia_smi_xml(text: str) -> GpuState:
    """GPU state from ``nvidia-smi -q -x`` output; raises CommandOutputError if it is not that XML.

    A ``<gpu>`` without a usable bus id becomes a warning; absent or ``N/A`` values are None with
    the reason in the GPU's ``unavailable`` map.
    """
    from xml.etree import ElementTree  # only nvidia-smi's output needs it: imported when used

    try:
        root = ElementTree.fromstring(text)
    except (ElementTree.ParseError, ValueError, LookupError) as exc:
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND, f"output is not XML ({_clip(str(exc))})"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND,
            f"output's root element is <{_clip(str(root.tag))}>, not <nvidia_smi_log>",
        )
    gpus, warnings = {}, []
    for position, element in enumerate(root.findall("gpu")):
        raw = element.get("id") or element.findtext("pci/pci_bus_id") or ""
        try:
            address = normalise_bus_id(raw)
        except ValueError as exc:
            warnings.append({"path": f"nvidia-smi:gpu[{position}]", "reason": str(exc)})
            continue
        gpus[address] = _xml_record(element)
    driver = _text(root.findtext("driver_version"))
    return GpuState(
        source=SOURCE_NVIDIA_SMI,
        nvml={"available": False, "reason": None, "driver_version": None},
        nvidia_smi={"used": True, "reason": None, "driver_version": driver},
        gpus=gpus,
        warnings=tuple(warnings),
    )


def _smi_unavailable(reason: str) -> GpuState:
    return GpuState(
        source=None,
        nvml={"available": False, "reason": None, "driver_version": None},
        nvidia_smi={"used": False, "reason": reason, "driver_version": None},
        gpus={},
    )


def nvidia_smi_argv(
    nvidia_smi: Optional[str], timeout: Optional[str], seconds: int
) -> Optional[list]:
    """argv running ``nvidia-smi -q -x`` under coreutils ``timeout``, or None without nvidia-smi.

    ``timeout`` is the path of coreutils ``timeout`` (None: run nvidia-smi without a limit);
    ``seconds`` is the limit. Raises CommandOutputError when ``seconds`` is below 1.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND,
            f"nvidia_smi_timeout is {_quote(seconds)}; set it to a whole number of seconds, "
            "1 or more",
        )
    if nvidia_smi is None:
        return None
    command = [nvidia_smi, "-q", "-x"]
    if timeout is None:
        return command
    return [timeout, f"--kill-after={_KILL_AFTER_S}", str(seconds)] + command


def _first_line(*texts) -> str:
    for text in texts:
        head = (text or "").lstrip()[: _QUOTE_LIMIT * 4]
        if head:
            return _clip(head.splitlines()[0].rstrip())
    return ""


def _smi_outcome(rc: int, out: str, err: str, timeout_s: Optional[int]) -> tuple:
    """(GPU state, None) of a finished nvidia-smi, or (None, (reason, how to fix or None))."""
    if timeout_s is not None and rc in _TIMEOUT_STATUSES:
        return None, (
            f"timed out after {timeout_s} s",
            "raise nvidia_smi_timeout if the driver is only slow, or find out why nvidia-smi hangs",
        )
    if rc != 0:
        return None, (f"exited with status {rc}: {_first_line(err, out)}".rstrip(": "), None)
    if len(out or "") > _OUTPUT_LIMIT:
        limit = _OUTPUT_LIMIT >> 20
        return None, (f"printed more than {limit} MiB, which is no nvidia-smi -q -x report", None)
    try:
        return parse_nvidia_smi_xml(out), None
    except CommandOutputError as exc:
        return None, (exc.reason, None)


def read_nvidia_smi(
    runner: Optional[Callable], required: bool, timeout_s: Optional[int] = None
) -> GpuState:
    """GPU state from ``runner()`` -> (rc, stdout, stderr) of ``nvidia-smi -q -x``.

    ``runner`` is None when nvidia-smi is not installed. ``timeout_s`` is set when the runner runs
    it under coreutils ``timeout`` with that limit, so that status 124 or 137 means it timed out.
    Unless ``required``, a missing binary, a timeout, a non-zero exit or unusable output gives
    ``nvidia_smi.used: false`` with the reason; with ``required`` they raise CommandOutputError.
    """
    if runner is None:
        reason = "nvidia-smi was not found in PATH"
        if required:
            raise CommandOutputError(
                NVIDIA_SMI_COMMAND, f"{reason}; install the NVIDIA driver utilities or use auto"
            )
        return _smi_unavailable(reason)
    rc, out, err = runner()
    state, failure = _smi_outcome(rc, out, err, timeout_s)
    if state is not None:
        return state
    reason, fix = failure
    if required:
        raise CommandOutputError(NVIDIA_SMI_COMMAND, f"{reason}; {fix}" if fix else reason)
    return _smi_unavailable(reason)


def read_gpu_state(
    nvml=None,
    nvml_reason: Optional[str] = None,
    nvidia_smi: Optional[Callable] = None,
    nvidia_smi_mode: str = "auto",
    snapshot: Optional[str] = None,
    nvidia_smi_timeout: Optional[int] = None,
) -> GpuState:
    """GPU state from a snapshot, else NVML, else nvidia-smi.

    Raises SnapshotError for a bad snapshot and CommandOutputError when ``always`` fails.

    ``nvml`` is the imported pynvml module (None when it cannot be imported, ``nvml_reason`` says
    why); ``nvidia_smi`` is the runner for :func:`read_nvidia_smi`, and ``nvidia_smi_timeout``
    the limit it runs under (None: no ``timeout``). ``nvidia_smi_mode``: ``auto``
    runs nvidia-smi only when NVML is unavailable, ``always`` uses it instead of NVML (and fails
    without it), ``never`` does not run it.
    """
    if nvidia_smi_mode not in NVIDIA_SMI_MODES:
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND,
            f"mode {nvidia_smi_mode!r} is not one of {', '.join(NVIDIA_SMI_MODES)}",
        )
    if snapshot is not None:
        return read_snapshot(snapshot)
    if nvidia_smi_mode == "always":
        state = read_nvidia_smi(nvidia_smi, True, nvidia_smi_timeout)
        skipped = {
            "available": False,
            "reason": "not used: nvidia_smi=always",
            "driver_version": None,
        }
        return replace(state, nvml=skipped)
    if nvml is None:
        state = nvml_unavailable(nvml_reason or "nvidia-ml-py (import pynvml) is not available")
    else:
        state = read_nvml(nvml)
    if state.nvml["available"]:
        return state
    if nvidia_smi_mode == "never":
        skipped = {"used": False, "reason": "not tried: nvidia_smi=never", "driver_version": None}
        return replace(state, nvidia_smi=skipped)
    return replace(read_nvidia_smi(nvidia_smi, False, nvidia_smi_timeout), nvml=state.nvml)


# ---------------------------------------------------------------------------------------------
# Snapshots: the GPU state as JSON, recorded on a host and read back anywhere

_STR, _INT, _BOOL = ("str",), ("int",), ("bool",)


def _opt(schema: tuple) -> tuple:
    return ("opt", schema)


def _list(schema: tuple) -> tuple:
    return ("list", schema)


def _obj(**fields) -> tuple:
    return ("obj", fields)


_SWITCH = ("enum", ("enabled", "disabled"))
_COMPUTE_INSTANCE = _obj(
    id=_INT, profile_id=_opt(_INT), profile_name=_opt(_STR), mig_device_uuid=_opt(_STR)
)
_GPU_INSTANCE = _obj(
    id=_INT,
    profile_id=_opt(_INT),
    profile_name=_opt(_STR),
    placement_start=_opt(_INT),
    placement_size=_opt(_INT),
    compute_instances=_opt(_list(_COMPUTE_INSTANCE)),
    mig_device_uuid=_opt(_STR),
)
_PROFILE = _obj(
    name=_opt(_STR),
    id=_INT,
    max_count=_INT,
    slice_count=_INT,
    memory_mib=_opt(_INT),
    placements=_opt(_list(_obj(start=_INT, size=_INT))),
)
_MIG = _obj(
    mode_current=_SWITCH,
    mode_pending=_opt(_SWITCH),
    gpu_instances=_opt(_list(_GPU_INSTANCE)),
    supported_profiles=_opt(_list(_PROFILE)),
)
_RECORD = _obj(
    address=("address",),
    uuid=_opt(_STR),
    name=_opt(_STR),
    memory_total_mib=_opt(_INT),
    compute_mode=_opt(_STR),
    persistence_mode=_opt(_SWITCH),
    mig=_opt(_MIG),
    processes=_opt(_list(_INT)),
    nvlink_peers=_opt(_list(("address",))),
    nvlink_switches=_opt(_list(("address",))),
    nvml_numa_node=_opt(_INT),
    unavailable=("map", _STR),
)
_SNAPSHOT = _obj(
    format=_STR,
    version=_INT,
    recorded_from=_opt(("enum", (SOURCE_NVML, SOURCE_NVIDIA_SMI))),
    nvml=_obj(available=_BOOL, reason=_opt(_STR), driver_version=_opt(_STR)),
    nvidia_smi=_obj(used=_BOOL, reason=_opt(_STR), driver_version=_opt(_STR)),
    gpus=_list(_RECORD),
    warnings=_list(_obj(path=_STR, reason=_STR)),
)
_JSON_TYPES = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"))


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return next((word for kind, word in _JSON_TYPES if isinstance(value, kind)), "unknown")


def _check(value, schema: tuple, where: str, path: str) -> None:
    """Raise SnapshotError unless ``value`` (parsed JSON) has the shape ``schema`` describes."""
    kind, place = schema[0], where or "the top level"
    if kind == "opt":
        if value is not None:
            _check(value, schema[1], where, path)
        return
    expected = {
        "str": (str, "a string"),
        "address": (str, "a PCI address string"),
        "enum": (str, "a string"),
        "int": (int, "an integer"),
        "bool": (bool, "true or false"),
        "list": (list, "a list"),
        "map": (dict, "an object"),
        "obj": (dict, "an object"),
    }[kind]
    if not isinstance(value, expected[0]) or (kind == "int" and isinstance(value, bool)):
        raise SnapshotError(path, f"{place} must be {expected[1]}, not {_json_type(value)}")
    if kind == "enum" and value not in schema[1]:
        choices = ", ".join(schema[1])
        raise SnapshotError(path, f"{place} is {_quote(value)}; expected one of {choices}")
    if kind == "address":
        try:
            pci.parse_address(value)
        except ValueError:
            raise SnapshotError(
                path, f"{place}: {_quote(value)} is not a PCI address DDDD:BB:DD.F"
            ) from None
    if kind == "list":
        for index, item in enumerate(value):
            _check(item, schema[1], f"{where}[{index}]", path)
    elif kind == "map":
        for key, item in value.items():
            _check(item, schema[1], f"{where}.{_clip(key)}", path)
    elif kind == "obj":
        fields = schema[1]
        missing = [key for key in fields if key not in value]
        if missing:
            raise SnapshotError(path, f"{place} lacks {', '.join(missing)}")
        extra = sorted(_quote(key) for key in value if key not in fields)
        if extra:
            raise SnapshotError(path, f"{place} has unknown key(s) {', '.join(extra)}")
        for key, item_schema in fields.items():
            _check(value[key], item_schema, f"{where}.{key}" if where else key, path)


def as_snapshot(state: GpuState) -> dict:
    """JSON-ready snapshot document of ``state`` (what ``snapshot_out`` writes)."""
    gpus = []
    for address in sorted(state.gpus, key=_address_key):
        record = copy.deepcopy(state.gpus[address])
        record["address"] = address
        gpus.append(record)
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "recorded_from": state.source,
        "nvml": dict(state.nvml),
        "nvidia_smi": dict(state.nvidia_smi),
        "gpus": gpus,
        "warnings": _sorted_warnings(state.warnings),
    }


def parse_snapshot(text: str, path: str) -> GpuState:
    """GPU state of a snapshot's JSON text (``path`` names it in errors); raises SnapshotError."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(path, f"is not JSON ({_clip(str(exc))})") from None
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(path, f'is not a GPU snapshot (no "format": "{SNAPSHOT_FORMAT}")')
    if doc.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(
            path,
            f"has version {_quote(doc.get('version'))}; this collection reads version "
            f"{SNAPSHOT_VERSION}",
        )
    _check(doc, _SNAPSHOT, "", path)
    gpus: dict = {}
    for index, item in enumerate(doc["gpus"]):
        address = item.pop("address").lower()
        if address in gpus:
            raise SnapshotError(path, f"gpus[{index}] repeats address {address}")
        gpus[address] = item
    return GpuState(
        source=doc["recorded_from"],
        nvml=doc["nvml"],
        nvidia_smi=doc["nvidia_smi"],
        gpus=gpus,
        warnings=tuple(doc["warnings"]),
        snapshot_path=path,
    )


def _not_regular(mode: int) -> Optional[str]:
    """Why a file of st_mode ``mode`` is no snapshot (a FIFO or device would block or stream)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((word for test, word in _FILE_KINDS if test(mode)), "not a file")
    return f"is not a regular file (it is {kind})"


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def read_snapshot(path: str) -> GpuState:
    """GPU state recorded in the snapshot file ``path``; raises SnapshotError.

    Anything but a regular file (a FIFO, a directory, a device) is refused before it is opened.
    """
    text = ""
    try:
        odd = _not_regular(os.stat(path).st_mode)
        if odd is None:
            with open(path, encoding="utf-8", opener=_open_nonblocking) as handle:
                odd = _not_regular(os.fstat(handle.fileno()).st_mode)  # replaced since the stat
                if odd is None:
                    text = handle.read(_SNAPSHOT_LIMIT + 1)
    except OSError as exc:
        raise SnapshotError(path, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(path, f"is not UTF-8 text ({exc.reason})") from None
    if odd is not None:
        raise SnapshotError(path, odd, fix=_SNAPSHOT_FILE_FIX)
    if len(text) > _SNAPSHOT_LIMIT:
        raise SnapshotError(path, f"is larger than {_SNAPSHOT_LIMIT >> 20} MiB")
    return parse_snapshot(text, path)


def write_snapshot(path: str, state: GpuState) -> None:
    """Write ``state`` as a snapshot file at ``path`` (atomically); raises SnapshotError."""
    text = json.dumps(as_snapshot(state), indent=2, sort_keys=True) + "\n"
    directory, name = os.path.split(os.path.abspath(path))
    scratch = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(scratch, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(scratch, path)
    except OSError as exc:
        try:
            os.unlink(scratch)
        except OSError:
            pass
        raise SnapshotError(
            path,
            f"cannot be written ({exc.strerror or exc})",
            fix=f"Make sure the directory of snapshot_out ({directory}) exists and is writable "
            "on the host, and that snapshot_out is not itself a directory.",
        ) from None


# ---------------------------------------------------------------------------------------------
# Facts


def merge(gpus: list, state: GpuState) -> tuple:
    """(facts GPU list, warnings): sysfs GPUs joined with ``state`` by PCI address.

    sysfs stays the source of identity and locality; enriched values are credited to
    ``state.label``. An address the enrichment reports but sysfs lacks, or an NVIDIA GPU the
    enrichment does not report, becomes a warning; the latter also gets the reason for each
    enriched field in its ``unavailable``.
    """
    label, entries, warnings = state.label, [], []
    for gpu in sorted(gpus, key=lambda item: _address_key(item.address)):
        entry = {
            "address": gpu.address,
            "vendor": gpu.vendor,
            "vendor_id": gpu.vendor_id,
            "device_id": gpu.device_id,
            "numa_node": gpu.numa_node,
            "node": gpu.node,
            "node_source": gpu.node_source,
            "local_cpus": list(gpu.local_cpus) if gpu.local_cpus is not None else None,
            "switch": gpu.switch,
            "root_port": gpu.root_port,
        }
        entry.update(dict.fromkeys(ENRICHED_FIELDS))
        entry["partition"] = copy.deepcopy(gpu.partition)
        sources = {key: SOURCE_SYSFS for key in _SYSFS_FIELDS if entry[key] is not None}
        record = state.gpus.get(gpu.address) if gpu.vendor == "nvidia" else None
        unavailable: dict = {}
        if record is not None:
            for key in ENRICHED_FIELDS:
                entry[key] = copy.deepcopy(record[key])
                if entry[key] is not None:
                    sources[key] = label
            unavailable = dict(record["unavailable"])
        elif gpu.vendor == "nvidia" and label is not None:
            reason = f"{label} did not report this GPU (another driver, a cgroup, or lost)"
            unavailable = dict.fromkeys(ENRICHED_FIELDS, reason)
            warnings.append({"path": gpu.address, "reason": reason})
        entry["sources"] = dict(sorted(sources.items()))
        entry["unavailable"] = dict(sorted(unavailable.items()))
        entries.append(entry)
    known = {gpu.address for gpu in gpus}
    for address in sorted(set(state.gpus) - known, key=_address_key):
        warnings.append(
            {"path": address, "reason": f"{label} reports a GPU that is not under bus/pci/devices"}
        )
    return entries, warnings


def read_gpu_topology(reader: Reader, state: GpuState) -> dict:
    """JSON-ready ansible_facts.gpu_topology: sysfs GPUs (via ``reader``) enriched by ``state``.

    Raises TopologyError when the roots are not a sysfs/procfs tree at all (Reader.check_roots).
    """
    reader.check_roots()
    gpus = read_gpus(reader, topology.read_node_cpus(reader))
    entries, warnings = merge(gpus, state)
    return {
        "gpus": entries,
        "nvml": dict(state.nvml),
        "nvidia_smi": dict(state.nvidia_smi),
        "snapshot": {
            "path": state.snapshot_path,
            "recorded_from": state.source if state.snapshot_path else None,
        },
        "sysfs_root": reader.sysfs_root,
        "warnings": _sorted_warnings(list(reader.warnings) + list(state.warnings) + warnings),
    }


# ---------------------------------------------------------------------------------------------
# One gathering: what gpu_topology_facts and numa_facts (gpu=true) run


def read_nvml_library(load: Callable = ctypes.CDLL) -> bool:
    """Whether NVML_LIBRARY loads, as pynvml's nvmlInit loads it on Linux; never raises."""
    try:
        load(NVML_LIBRARY)
    except OSError:
        return False
    return True


def _module_findable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True  # let the import itself say what is wrong


def load_nvml_if_usable(load_nvml: Callable, library_loads: Callable = read_nvml_library) -> tuple:
    """``load_nvml()`` -> (pynvml, None) or (None, reason), skipping an import that cannot help.

    Importing pynvml costs more than the rest of a facts run. On Linux, when pynvml is installed
    but not yet imported and NVML_LIBRARY does not load, its nvmlInit could only fail with
    NVML_LIBRARY_MISSING: that reason is returned without the import, exactly what read_nvml
    would have given. Anywhere else ``load_nvml`` is called.
    """
    if (
        sys.platform.startswith("linux")
        and _NVML_MODULE not in sys.modules
        and _module_findable(_NVML_MODULE)
        and not library_loads()
    ):
        return None, NVML_LIBRARY_MISSING
    return load_nvml()


def gather_gpu_topology(
    reader: Reader,
    runner: Callable,
    which: Callable,
    load_nvml: Callable,
    nvidia_smi_mode: str = "auto",
    nvidia_smi_timeout: int = 30,
    snapshot: Optional[str] = None,
    snapshot_out: Optional[str] = None,
    check_mode: bool = False,
    library_loads: Callable = read_nvml_library,
) -> tuple:
    """(ansible_facts.gpu_topology, whether ``snapshot_out`` was written) for the host.

    Raises CommandOutputError (bad ``nvidia_smi_timeout``, or ``always`` failed), SnapshotError
    (bad ``snapshot``, ``snapshot_out`` not writable) and TopologyError (roots not sysfs/procfs).

    ``runner(argv) -> (rc, out, err)`` runs a command in the C locale, ``which(name)`` finds a
    binary in PATH (None when absent), ``load_nvml()`` gives (pynvml, None) or (None, why it
    cannot be imported); NVML is not loaded at all with a ``snapshot``. ``snapshot_out`` is
    written unless ``check_mode``.
    """
    nvml, nvml_reason = (None, None)
    if not snapshot:
        nvml, nvml_reason = load_nvml_if_usable(load_nvml, library_loads)
    killer = which("timeout")
    argv = nvidia_smi_argv(which("nvidia-smi"), killer, nvidia_smi_timeout)
    state = read_gpu_state(
        nvml,
        nvml_reason,
        functools.partial(runner, argv) if argv else None,
        nvidia_smi_mode,
        snapshot=snapshot,
        nvidia_smi_timeout=nvidia_smi_timeout if killer else None,
    )
    facts = read_gpu_topology(reader, state)
    if snapshot_out and not check_mode:
        write_snapshot(snapshot_out, state)
        return facts, True
    return facts, False
