# Private to this collection: may change in any release.
"""GPU state read through NVML, with a pynvml-like module object the caller passes in.

Split from gpu.py so that a facts run without NVML does not compile it: gpu.read_gpu_state
imports this module only when it has a pynvml module to read.
"""

from __future__ import annotations

import ctypes
import re
from typing import Optional

from .errors import NumaTuneError
from .gpu_records import (
    MIB,
    NVML_AFFINITY_WORDS,
    SOURCE_NVML,
    GpuState,
    address_key,
    clean_text,
    empty_record,
    mig_memory_gb,
    normalise_bus_id,
    nvml_unavailable,
)

# NVML_GPU_INSTANCE_PROFILE_<n>_SLICE[_<variant>]: the variant decides the name suffix, as in
# nvidia-smi and NVIDIA's go-nvlib (REV1 = with media extensions, REV2 = double memory).
# Patterns only NVML needs are compiled when first used (re caches them), not at import.
_GI_CONSTANT_RE = r"^NVML_GPU_INSTANCE_PROFILE_([0-9]+)_SLICE(?:_([A-Z0-9_]+))?\Z"
_GI_SUFFIXES = {
    None: "",
    "REV1": "+me",
    "REV2": "",
    "GFX": "+gfx",
    "NO_ME": "-me",
    "ALL_ME": "+me.all",
}
_CI_CONSTANT_RE = r"^NVML_COMPUTE_INSTANCE_PROFILE_([0-9]+)_SLICE(?:_[A-Z0-9]+)?\Z"


class _NvmlMissing(NumaTuneError):
    """The pynvml-like object lacks a function (an old nvidia-ml-py)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is missing from this nvidia-ml-py; upgrade nvidia-ml-py")


class NvmlQuery:
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


def _compute_mode(query: NvmlQuery, value) -> Optional[str]:
    if value is None:
        return None
    names = {
        query.constant("NVML_COMPUTEMODE_DEFAULT", 0): "default",
        query.constant("NVML_COMPUTEMODE_EXCLUSIVE_THREAD", 1): "exclusive_thread",
        query.constant("NVML_COMPUTEMODE_PROHIBITED", 2): "prohibited",
        query.constant("NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", 3): "exclusive_process",
    }
    return names.get(value, f"unknown ({value})")


def _switch_word(query: NvmlQuery, value, enabled_name: str) -> Optional[str]:
    if value is None:
        return None
    return "enabled" if value == query.constant(enabled_name, 1) else "disabled"


def _profile_name(raw) -> Optional[str]:
    name = clean_text(raw)
    if name and name.startswith("MIG "):
        name = name[4:].strip()
    return name or None


def _constants(query: NvmlQuery, pattern: str) -> list:
    pattern = re.compile(pattern)
    found = []
    for name in dir(query.nvml):
        match = pattern.match(name)
        value = getattr(query.nvml, name, None) if match else None
        if isinstance(value, int) and not isinstance(value, bool):
            found.append((value, match.groups()[-1] if match.groups() else None))
    return sorted(set(found), key=lambda item: item[0])


def _read_placements(query: NvmlQuery, handle, profile_id: int, miss: dict) -> Optional[list]:
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


def read_gi_profiles(query: NvmlQuery, handle, total_bytes, miss: dict) -> Optional[list]:
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


def _read_mig_uuids(query: NvmlQuery, handle, miss: dict) -> dict:
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
            uuids[(gpu_instance, compute_instance)] = clean_text(query.call(name, mig))
        except query.failures as exc:
            if not query.is_code(exc, "NVML_ERROR_NOT_FOUND"):  # NOT_FOUND: an empty slot
                miss["mig.mig_device_uuid"] = query.reason(name, exc)
    return uuids


def _read_compute_instances(query: NvmlQuery, gpu_instance, parent: tuple, gi_id, uuids, miss):
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


def read_gpu_instances(query: NvmlQuery, handle, profiles, miss: dict) -> Optional[list]:
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


def _read_mig(query: NvmlQuery, handle, total_bytes, miss: dict) -> Optional[dict]:
    modes = query.attempt(miss, "mig", "nvmlDeviceGetMigMode", handle)
    if modes is None:
        return None
    current, pending = modes
    profiles = read_gi_profiles(query, handle, total_bytes, miss)
    enabled = current == query.constant("NVML_DEVICE_MIG_ENABLE", 1)
    return {
        "mode_current": _switch_word(query, current, "NVML_DEVICE_MIG_ENABLE"),
        "mode_pending": _switch_word(query, pending, "NVML_DEVICE_MIG_ENABLE"),
        "gpu_instances": read_gpu_instances(query, handle, profiles, miss) if enabled else [],
        "supported_profiles": [item[0] for item in profiles] if profiles is not None else None,
    }


def _read_processes(query: NvmlQuery, handle, miss: dict) -> Optional[list]:
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


def _read_nvlink(query: NvmlQuery, handle, miss: dict) -> tuple:
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


def _read_device(query: NvmlQuery, handle) -> dict:
    record = empty_record()
    miss = record["unavailable"]
    record["uuid"] = clean_text(query.attempt(miss, "uuid", "nvmlDeviceGetUUID", handle))
    record["name"] = clean_text(query.attempt(miss, "name", "nvmlDeviceGetName", handle))
    memory = query.attempt(miss, "memory_total_mib", "nvmlDeviceGetMemoryInfo", handle)
    total = int(memory.total) if memory is not None else None
    record["memory_total_mib"] = total // MIB if total is not None else None
    mode = query.attempt(miss, "compute_mode", "nvmlDeviceGetComputeMode", handle)
    record["compute_mode"] = _compute_mode(query, mode)
    persistence = query.attempt(miss, "persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    record["persistence_mode"] = _switch_word(query, persistence, "NVML_FEATURE_ENABLED")
    record["mig"] = _read_mig(query, handle, total, miss)
    record["processes"] = _read_processes(query, handle, miss)
    record["nvlink_peers"], record["nvlink_switches"] = _read_nvlink(query, handle, miss)
    node = query.attempt(miss, "nvml_numa_node", "nvmlDeviceGetNumaNodeId", handle)
    record["nvml_numa_node"] = node if isinstance(node, int) and node >= 0 else None
    record["nvml_cpu_affinity"] = _read_cpu_affinity(query, handle, miss)
    return record


def _read_cpu_affinity(query: NvmlQuery, handle, miss: dict) -> Optional[list]:
    """CPUs of the GPU's ideal CPU affinity within its NUMA node (nvmlDeviceGetCpuAffinityWithin
    Scope, NVML_AFFINITY_SCOPE_NODE): bit b of word w is CPU 64*w + b. None when NVML cannot
    say (the reason in ``miss``) or the mask is empty."""
    scope = query.constant("NVML_AFFINITY_SCOPE_NODE", 0)
    words = query.attempt(
        miss,
        "nvml_cpu_affinity",
        "nvmlDeviceGetCpuAffinityWithinScope",
        handle,
        NVML_AFFINITY_WORDS,
        scope,
    )
    if words is None:
        return None
    cpus = [
        64 * index + bit
        for index, word in enumerate(words)
        for bit in range(64)
        if int(word) >> bit & 1
    ]
    return cpus or None


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
        record["nvlink_peers"] = sorted(reach, key=address_key)


def _read_initialised(query: NvmlQuery) -> GpuState:
    status: dict = {}
    driver = clean_text(query.attempt(status, "driver", "nvmlSystemGetDriverVersion"))
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
    query = NvmlQuery(nvml)
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
