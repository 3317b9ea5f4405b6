"""A fake NVML for tests and fixture generation, passed to the core in place of ``pynvml``.

It is not a mock: it has pynvml's function names and signatures (``test_fake_nvml.py`` checks
every ``nvml*`` function against the installed nvidia-ml-py), and it returns pynvml's own ctypes
structures, handle types and ``nvmlFriendlyObject`` process entries and raises pynvml's own
``NVMLError_*`` classes (with ``.value``). The NVML constants (``NVML_*``), structure types
(``c_nvml*``) and error classes are copied from the installed pynvml, so the core code that runs
against this fake is the code that runs against the real library; only the behaviour (what a GPU
answers) is made up, from the ``FakeGpu`` descriptions below.

Behaviour follows the NVML API reference: every call before ``nvmlInit`` raises
NVMLError_Uninitialized; a GPU without MIG answers NOT_SUPPORTED to the MIG calls; array-filling
calls (``...PossiblePlacements``, ``...GetGpuInstances``, ``...GetComputeInstances``) fill the
caller's ctypes array and write the count through the ``byref`` count; links past a GPU's last
NVLink answer INVALID_ARGUMENT. Whether NVML lists GPU-instance profiles while MIG is disabled is
not documented; a real H200 on driver 580.159.04 lists all 7 (the GPU proof kit's recording in
tests/unit/fixtures/gpu_proof/h200-580.159.04), so by default the fake does too;
``profiles_need_mig=True`` gives the other reading (NOT_SUPPORTED until MIG is on), which the
planner must also handle.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Optional

import pynvml

MIB = 1 << 20
ANY_INSTANCE = 0xFFFFFFFF  # what NVML puts in gpuInstanceId/computeInstanceId outside MIG


def fake_uuid(prefix: str, *parts) -> str:
    """A stable made-up UUID (``GPU-...``/``MIG-...``) for a synthetic device."""
    return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, '/'.join(map(str, parts)))}"


@dataclass(frozen=True)
class FakeProfile:
    """One GPU-instance profile as ``nvmlDeviceGetGpuInstanceProfileInfo`` describes it."""

    constant: str  # NVML_GPU_INSTANCE_PROFILE_* name
    id: int
    slices: int
    memory_mib: int
    max_count: int
    placements: tuple  # ((start, size), ...)
    name: str  # the driver's name in the v2 struct, e.g. "MIG 1g.10gb"
    multiprocessors: int = 0


@dataclass(frozen=True)
class FakeComputeInstance:
    id: int
    slices: int
    uuid: str  # MIG device UUID


@dataclass(frozen=True)
class FakeGpuInstance:
    id: int
    profile_id: int
    start: int
    size: int
    compute_instances: tuple = ()


@dataclass(frozen=True)
class FakeLink:
    """One NVLink: the remote end's NVML bus id and what it is (``gpu`` or ``switch``)."""

    remote: str
    kind: str = "gpu"
    active: bool = True


@dataclass
class FakeGpu:
    """What one GPU answers. ``mig`` None: no MIG support; ``nvlinks`` None: no NVLink."""

    bus_id: str  # NVML's form: 00000000:17:00.0
    name: str
    memory_total_mib: int
    uuid: str = ""
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    persistence: int = pynvml.NVML_FEATURE_ENABLED
    mig: Optional[tuple] = None  # (current, pending) NVML_DEVICE_MIG_* values
    profiles: tuple = ()
    gpu_instances: tuple = ()
    compute_pids: tuple = ()
    graphics_pids: tuple = ()
    nvlinks: Optional[tuple] = None
    numa_node_id: Optional[int] = None  # nvmlDeviceGetNumaNodeId; None: NOT_SUPPORTED
    pci_device_id: int = 0
    failures: dict = field(default_factory=dict)  # function name -> NVML_ERROR_* value
    architecture: int = pynvml.NVML_DEVICE_ARCH_AMPERE  # nvmlDeviceGetArchitecture
    # Whether a MIG mode change stays pending until a GPU reset (Ampere) or applies in place.
    reset_needed: bool = False
    # {pid: GPU instance id} of compute processes inside a MIG GPU instance (else ANY_INSTANCE).
    process_instances: dict = field(default_factory=dict)
    # CPUs of nvmlDeviceGetCpuAffinityWithinScope at NODE scope; None: NOT_SUPPORTED (as a
    # driver without the call answers).
    cpu_affinity: Optional[tuple] = None
    # Application clocks (memory MHz, graphics MHz) as nvmlDeviceGetApplicationsClock answers
    # them; None: NOT_SUPPORTED (as on GeForce boards). ``supported_clocks``: {memory MHz:
    # (graphics MHz, ...)} of nvmlDeviceGetSupportedMemoryClocks/GraphicsClocks.
    application_clocks: Optional[tuple] = None
    default_application_clocks: Optional[tuple] = None
    supported_clocks: dict = field(default_factory=dict)
    # Power management limit in milliwatts (nvmlDeviceGetPowerManagementLimit); None:
    # NOT_SUPPORTED. ``power_constraints_mw``: (min, max) of ...LimitConstraints.
    power_limit_mw: Optional[int] = None
    power_default_mw: Optional[int] = None
    power_constraints_mw: Optional[tuple] = None

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = fake_uuid("GPU", self.bus_id)


def _raise(code: int):
    raise pynvml.NVMLError(code)


def _target(ref):
    """The ctypes object behind ``ctypes.byref(obj)`` or ``ctypes.pointer(obj)``."""
    inner = getattr(ref, "_obj", None)
    return inner if inner is not None else ref.contents


class FakeNvml:
    """A pynvml-like object over ``gpus`` (FakeGpu), in the order NVML enumerates them."""

    def __init__(
        self,
        gpus,
        driver_version: str = "560.35.03",
        init_error: Optional[int] = None,
        profiles_need_mig: bool = False,
        driver_profile_names: bool = True,
        missing=(),
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML", "c_nvml", "struct_c_nvml", "nvmlPciInfo")):
                setattr(self, name, getattr(pynvml, name))
        self.nvmlFriendlyObject = pynvml.nvmlFriendlyObject
        for name in missing:  # an older nvidia-ml-py without these functions
            setattr(self, name, None)
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.init_error = init_error
        self.profiles_need_mig = profiles_need_mig
        self.driver_profile_names = driver_profile_names
        self.initialised = 0
        self.shutdowns = 0
        self.calls: list = []
        self._objects: dict = {}
        self._keep: list = []
        self._devices = [self._handle(pynvml.struct_c_nvmlDevice_t, ("gpu", gpu)) for gpu in gpus]

    # -- plumbing ------------------------------------------------------------------------------

    def _handle(self, struct, payload):
        obj = struct()
        self._keep.append(obj)
        self._objects[ctypes.addressof(obj)] = payload
        return ctypes.pointer(obj)

    def _enter(self, name: str, handle=None, kinds=("gpu",)):
        self.calls.append(name)
        if not self.initialised:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        try:
            payload = self._objects[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError, AttributeError):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if payload[0] not in kinds:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        owner = payload[1] if payload[0] == "gpu" else payload[1][0]
        if name in owner.failures:
            _raise(owner.failures[name])
        return payload

    @staticmethod
    def _mig_capable(gpu: FakeGpu) -> None:
        if gpu.mig is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profiles_visible(self, gpu: FakeGpu) -> None:
        self._mig_capable(gpu)
        if self.profiles_need_mig and gpu.mig[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _profile_by_id(gpu: FakeGpu, profile_id: int) -> FakeProfile:
        for profile in gpu.profiles:
            if profile.id == profile_id:
                return profile
        _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_devices(self, gpu: FakeGpu) -> list:
        out = []
        for gpu_instance in sorted(gpu.gpu_instances, key=lambda item: item.id):
            for compute in sorted(gpu_instance.compute_instances, key=lambda item: item.id):
                out.append((gpu_instance, compute))
        return out

    @staticmethod
    def _pci_info(bus_id: str, device_id: int = 0):
        info = pynvml.nvmlPciInfo_t()
        domain, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16) & 0xFFFF:04X}:{bus}:{rest}".encode()
        info.domain, info.bus = int(domain, 16), int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        info.pciDeviceId = device_id
        return info

    # -- initialisation ------------------------------------------------------------------------

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            _raise(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialised -= 1
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    # -- devices -------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._devices):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if "nvmlDeviceGetHandleByIndex" in gpu.failures:
            _raise(gpu.failures["nvmlDeviceGetHandleByIndex"])
        return self._devices[index]

    def nvmlDeviceGetPciInfo(self, handle):
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)[1]
        return self._pci_info(gpu.bus_id, gpu.pci_device_id)

    def nvmlDeviceGetUUID(self, handle):
        kind, payload = self._enter("nvmlDeviceGetUUID", handle, kinds=("gpu", "mig"))
        return payload.uuid if kind == "gpu" else payload[2].uuid

    def nvmlDeviceGetName(self, handle):
        return self._enter("nvmlDeviceGetName", handle)[1].name

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)[1]
        memory = pynvml.c_nvmlMemory_t()
        memory.total = gpu.memory_total_mib * MIB
        memory.used = 0
        memory.free = memory.total
        return memory

    def nvmlDeviceGetComputeMode(self, handle):
        return self._enter("nvmlDeviceGetComputeMode", handle)[1].compute_mode

    def nvmlDeviceGetPersistenceMode(self, handle):
        return self._enter("nvmlDeviceGetPersistenceMode", handle)[1].persistence

    def nvmlDeviceSetPersistenceMode(self, handle, mode):
        """NVML API reference: takes effect at once; INVALID_ARGUMENT for a mode other than
        NVML_FEATURE_ENABLED/DISABLED."""
        gpu = self._enter("nvmlDeviceSetPersistenceMode", handle)[1]
        if mode not in (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.persistence = mode
        return None

    def nvmlDeviceSetComputeMode(self, handle, mode):
        gpu = self._enter("nvmlDeviceSetComputeMode", handle)[1]
        modes = (
            pynvml.NVML_COMPUTEMODE_DEFAULT,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
            pynvml.NVML_COMPUTEMODE_PROHIBITED,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        )
        if mode not in modes:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode
        return None

    def _clocks(self, name, handle):
        gpu = self._enter(name, handle)[1]
        if gpu.application_clocks is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @staticmethod
    def _clock_index(clock_type) -> int:
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return 0
        if clock_type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return 1
        _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetApplicationsClock(self, handle, type):
        gpu = self._clocks("nvmlDeviceGetApplicationsClock", handle)
        return gpu.application_clocks[self._clock_index(type)]

    def nvmlDeviceGetDefaultApplicationsClock(self, handle, type):
        gpu = self._clocks("nvmlDeviceGetDefaultApplicationsClock", handle)
        pair = gpu.default_application_clocks or gpu.application_clocks
        return pair[self._clock_index(type)]

    def nvmlDeviceGetSupportedMemoryClocks(self, handle):
        gpu = self._clocks("nvmlDeviceGetSupportedMemoryClocks", handle)
        return sorted(gpu.supported_clocks, reverse=True)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle, memoryClockMHz):
        gpu = self._clocks("nvmlDeviceGetSupportedGraphicsClocks", handle)
        if memoryClockMHz not in gpu.supported_clocks:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return sorted(gpu.supported_clocks[memoryClockMHz], reverse=True)

    def nvmlDeviceSetApplicationsClocks(self, handle, maxMemClockMHz, maxGraphicsClockMHz):
        """INVALID_ARGUMENT for a pair the GPU does not list (NVML API reference: the clocks
        must be a combination nvmlDeviceGetSupportedGraphicsClocks gives)."""
        gpu = self._clocks("nvmlDeviceSetApplicationsClocks", handle)
        if maxGraphicsClockMHz not in gpu.supported_clocks.get(maxMemClockMHz, ()):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.application_clocks = (maxMemClockMHz, maxGraphicsClockMHz)
        return None

    def _power(self, name, handle):
        gpu = self._enter(name, handle)[1]
        if gpu.power_limit_mw is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return self._power("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle):
        gpu = self._power("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return gpu.power_default_mw if gpu.power_default_mw is not None else gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle):
        gpu = self._power("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        if gpu.power_constraints_mw is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.power_constraints_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle, limit):
        """INVALID_ARGUMENT outside ...LimitConstraints (NVML API reference), in milliwatts."""
        gpu = self._power("nvmlDeviceSetPowerManagementLimit", handle)
        low, high = gpu.power_constraints_mw or (limit, limit)
        if not low <= limit <= high:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = limit
        return None

    def nvmlDeviceGetNumaNodeId(self, handle):
        gpu = self._enter("nvmlDeviceGetNumaNodeId", handle)[1]
        if gpu.numa_node_id is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node_id

    def nvmlDeviceGetCpuAffinityWithinScope(self, handle, cpuSetSize, scope):
        """pynvml's return: a ``c_ulonglong * cpuSetSize`` array, bit b of word w = CPU 64*w+b
        (NVML API reference: CPUs 0, 1, 32 and 33 with cpuSetSize 2 on 32-bit words give
        result[0] = 0x3, result[1] = 0x3; pynvml uses 64-bit words). NODE and SOCKET scope
        answer the same CPUs here (one socket per node in the fake's machines)."""
        gpu = self._enter("nvmlDeviceGetCpuAffinityWithinScope", handle)[1]
        if scope not in (pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.cpu_affinity is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        words = (ctypes.c_ulonglong * cpuSetSize)()
        for cpu in gpu.cpu_affinity:
            if cpu // 64 >= cpuSetSize:
                _raise(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def _processes(self, name, handle, attribute):
        gpu = self._enter(name, handle)[1]
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": 512 * MIB,
                    "gpuInstanceId": gpu.process_instances.get(pid, ANY_INSTANCE),
                    "computeInstanceId": 0 if pid in gpu.process_instances else ANY_INSTANCE,
                }
            )
            for pid in getattr(gpu, attribute)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle, "compute_pids")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle, "graphics_pids")

    # -- NVLink --------------------------------------------------------------------------------

    def _link(self, name, device, link) -> FakeLink:
        gpu = self._enter(name, device)[1]
        if gpu.nvlinks is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlinks):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, device, link):
        active = self._link("nvmlDeviceGetNvLinkState", device, link).active
        return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device, link):
        return self._pci_info(self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link).remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        kind = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link).kind
        if kind == "switch":
            return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        return pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    # -- MIG: modes and GPU-instance profiles ----------------------------------------------------

    def nvmlDeviceGetMigMode(self, device):
        gpu = self._enter("nvmlDeviceGetMigMode", device)[1]
        self._mig_capable(gpu)
        return list(gpu.mig)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile, version=2):
        gpu = self._enter("nvmlDeviceGetGpuInstanceProfileInfo", device)[1]
        self._profiles_visible(gpu)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = [p for p in gpu.profiles if getattr(pynvml, p.constant) == profile]
        if not found:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fake = found[0]
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.name = (fake.name if self.driver_profile_names else "").encode()
        else:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id, info.sliceCount, info.instanceCount = fake.id, fake.slices, fake.max_count
        info.memorySizeMB, info.multiprocessorCount = fake.memory_mib, fake.multiprocessors
        info.isP2pSupported = 0
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device, profileId, placementsRef, countRef
    ):
        name = "nvmlDeviceGetGpuInstancePossiblePlacements"
        gpu = self._enter(name, device)[1]
        self._profiles_visible(gpu)
        profile = self._profile_by_id(gpu, profileId)
        count = _target(countRef)
        if placementsRef is None:
            count.value = len(profile.placements)
            return pynvml.NVML_SUCCESS
        if len(placementsRef) < len(profile.placements):
            _raise(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for index, (start, size) in enumerate(profile.placements):
            placementsRef[index].start, placementsRef[index].size = start, size
        count.value = len(profile.placements)
        return pynvml.NVML_SUCCESS

    # -- MIG: GPU instances ----------------------------------------------------------------------

    def nvmlDeviceGetGpuInstances(self, device, profileId, gpuInstancesRef, countRef):
        gpu = self._enter("nvmlDeviceGetGpuInstances", device)[1]
        self._profiles_visible(gpu)
        self._profile_by_id(gpu, profileId)
        chosen = [gi for gi in gpu.gpu_instances if gi.profile_id == profileId]
        if len(gpuInstancesRef) < len(chosen):
            _raise(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for index, gpu_instance in enumerate(chosen):
            gpuInstancesRef[index] = self._handle(
                pynvml.struct_c_nvmlGpuInstance_t, ("gi", (gpu, gpu_instance))
            )
        _target(countRef).value = len(chosen)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpuInstance):
        payload = self._enter("nvmlGpuInstanceGetInfo", gpuInstance, kinds=("gi",))[1]
        gpu_instance = payload[1]
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gpu_instance.id, gpu_instance.profile_id
        info.placement.start, info.placement.size = gpu_instance.start, gpu_instance.size
        return info

    # -- MIG: compute instances ------------------------------------------------------------------

    @staticmethod
    def _ci_slices(profile: int) -> Optional[int]:
        for slices in (1, 2, 3, 4, 7):
            if getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE") == profile:
                return slices
        return None

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device, profile, engProfile, version=2):
        name = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        gpu, gpu_instance = self._enter(name, device, kinds=("gi",))[1]
        parent = self._profile_by_id(gpu, gpu_instance.profile_id)
        slices = self._ci_slices(profile)
        # A g-slice GPU instance offers 1, 2, 3, 4 and 7-slice compute instances up to g, except
        # 3 in a 4-slice one (as nvidia-smi mig -lcip shows on A100).
        if slices is None or slices > parent.slices or (slices == 3 and parent.slices == 4):
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if version == 2:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            rest = parent.name[len("MIG ") :]
            label = rest if slices == parent.slices else f"{slices}c.{rest}"
            info.name = (f"MIG {label}" if self.driver_profile_names else "").encode()
        else:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
        info.id, info.sliceCount = profile, slices
        info.instanceCount = parent.slices // slices
        info.multiprocessorCount = parent.multiprocessors * slices // parent.slices
        return info

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance, profileId, computeInstancesRef, countRef
    ):
        name = "nvmlGpuInstanceGetComputeInstances"
        gpu, gpu_instance = self._enter(name, gpuInstance, kinds=("gi",))[1]
        chosen = [
            ci for ci in gpu_instance.compute_instances if self._ci_slices(profileId) == ci.slices
        ]
        if len(computeInstancesRef) < len(chosen):
            _raise(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for index, compute in enumerate(chosen):
            computeInstancesRef[index] = self._handle(
                pynvml.struct_c_nvmlComputeInstance_t, ("ci", (gpu, gpu_instance, compute))
            )
        _target(countRef).value = len(chosen)
        return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance):
        name = "nvmlComputeInstanceGetInfo"
        gpu, gpu_instance, compute = self._enter(name, computeInstance, kinds=("ci",))[1]
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id = compute.id
        info.profileId = getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{compute.slices}_SLICE")
        info.placement.start, info.placement.size = 0, compute.slices
        return info

    # -- MIG devices -----------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        gpu = self._enter("nvmlDeviceGetMaxMigDeviceCount", device)[1]
        self._mig_capable(gpu)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        gpu = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)[1]
        self._mig_capable(gpu)
        devices = self._mig_devices(gpu)
        if not 0 <= index < len(devices):
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        gpu_instance, compute = devices[index]
        return self._handle(pynvml.struct_c_nvmlDevice_t, ("mig", (gpu, gpu_instance, compute)))

    def nvmlDeviceGetGpuInstanceId(self, device):
        kind, payload = self._enter("nvmlDeviceGetGpuInstanceId", device, kinds=("gpu", "mig"))
        if kind != "mig":
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return payload[1].id

    def nvmlDeviceGetComputeInstanceId(self, device):
        kind, payload = self._enter("nvmlDeviceGetComputeInstanceId", device, kinds=("gpu", "mig"))
        if kind != "mig":
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return payload[2].id

    # -- MIG: changes (NVML's rules for a 7-slice GPU, as documented in the MIG user guide) ------

    def nvmlDeviceGetArchitecture(self, device):
        return self._enter("nvmlDeviceGetArchitecture", device)[1].architecture

    def nvmlDeviceSetMigMode(self, device, mode):
        gpu = self._enter("nvmlDeviceSetMigMode", device)[1]
        self._mig_capable(gpu)
        if mode not in (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.gpu_instances and mode == pynvml.NVML_DEVICE_MIG_DISABLE:
            _raise(pynvml.NVML_ERROR_IN_USE)  # instances must go first
        if gpu.compute_pids or gpu.graphics_pids:
            _raise(pynvml.NVML_ERROR_IN_USE)
        if gpu.reset_needed and mode != gpu.mig[0]:
            gpu.mig = (gpu.mig[0], mode)
            return pynvml.NVML_ERROR_RESET_REQUIRED  # activation status: pending until reset
        gpu.mig = (mode, mode)
        return pynvml.NVML_SUCCESS

    def reset(self, bus_id: str) -> None:
        """What ``nvidia-smi --gpu-reset`` does to the fake: the pending MIG mode applies."""
        for gpu in self.gpus:
            if gpu.bus_id.lower().endswith(bus_id.lower()[-12:]) and gpu.mig is not None:
                gpu.mig = (gpu.mig[1], gpu.mig[1])
                gpu.gpu_instances = ()

    def _gi_payload(self, name, handle):
        return self._enter(name, handle, kinds=("gi",))[1]

    def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId):
        gpu = self._enter("nvmlDeviceGetGpuInstanceById", device)[1]
        self._profiles_visible(gpu)
        for gpu_instance in gpu.gpu_instances:
            if gpu_instance.id == gpuInstanceId:
                return self._handle(pynvml.struct_c_nvmlGpuInstance_t, ("gi", (gpu, gpu_instance)))
        _raise(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device, profileId, placement):
        gpu = self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", device)[1]
        self._profiles_visible(gpu)
        profile = self._profile_by_id(gpu, profileId)
        spot = _target(placement)
        start, size = int(spot.start), int(spot.size)
        if (start, size) not in profile.placements:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        same = [gi for gi in gpu.gpu_instances if gi.profile_id == profileId]
        overlap = any(
            start < gi.start + gi.size and gi.start < start + size for gi in gpu.gpu_instances
        )
        if overlap or len(same) >= profile.max_count:
            _raise(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        new_id = 1 + max((gi.id for gi in gpu.gpu_instances), default=0)
        created = FakeGpuInstance(new_id, profileId, start, size, ())
        gpu.gpu_instances = tuple(gpu.gpu_instances) + (created,)
        return self._handle(pynvml.struct_c_nvmlGpuInstance_t, ("gi", (gpu, created)))

    def _current(self, gpu, gpu_instance):
        for item in gpu.gpu_instances:
            if item.id == gpu_instance.id:
                return item
        _raise(pynvml.NVML_ERROR_NOT_FOUND)

    def _store(self, gpu, updated):
        gpu.gpu_instances = tuple(
            updated if gi.id == updated.id else gi for gi in gpu.gpu_instances
        )

    def nvmlGpuInstanceDestroy(self, gpuInstance):
        gpu, gpu_instance = self._gi_payload("nvmlGpuInstanceDestroy", gpuInstance)
        current = self._current(gpu, gpu_instance)
        if current.compute_instances or current.id in gpu.process_instances.values():
            _raise(pynvml.NVML_ERROR_IN_USE)
        gpu.gpu_instances = tuple(gi for gi in gpu.gpu_instances if gi.id != current.id)

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance, profileId):
        gpu, gpu_instance = self._gi_payload("nvmlGpuInstanceCreateComputeInstance", gpuInstance)
        current = self._current(gpu, gpu_instance)
        parent = self._profile_by_id(gpu, current.profile_id)
        slices = self._ci_slices(profileId)
        if slices is None or slices > parent.slices or (slices == 3 and parent.slices == 4):
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        used = sum(ci.slices for ci in current.compute_instances)
        if used + slices > parent.slices:
            _raise(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        new_id = 1 + max((ci.id for ci in current.compute_instances), default=-1)
        compute = FakeComputeInstance(
            new_id, slices, fake_uuid("MIG", gpu.bus_id, current.id, new_id, len(self.calls))
        )
        updated = FakeGpuInstance(
            current.id,
            current.profile_id,
            current.start,
            current.size,
            current.compute_instances + (compute,),
        )
        self._store(gpu, updated)
        return self._handle(pynvml.struct_c_nvmlComputeInstance_t, ("ci", (gpu, updated, compute)))

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance, computeInstanceId):
        gpu, gpu_instance = self._gi_payload("nvmlGpuInstanceGetComputeInstanceById", gpuInstance)
        current = self._current(gpu, gpu_instance)
        for compute in current.compute_instances:
            if compute.id == computeInstanceId:
                return self._handle(
                    pynvml.struct_c_nvmlComputeInstance_t, ("ci", (gpu, current, compute))
                )
        _raise(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceDestroy(self, computeInstance):
        name = "nvmlComputeInstanceDestroy"
        gpu, gpu_instance, compute = self._enter(name, computeInstance, kinds=("ci",))[1]
        current = self._current(gpu, gpu_instance)
        if current.id in gpu.process_instances.values():
            _raise(pynvml.NVML_ERROR_IN_USE)
        kept = tuple(ci for ci in current.compute_instances if ci.id != compute.id)
        if len(kept) == len(current.compute_instances):
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        self._store(
            gpu, FakeGpuInstance(current.id, current.profile_id, current.start, current.size, kept)
        )


WRITE_FUNCTIONS = (
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
)


# ---------------------------------------------------------------------------------------------
# Profile catalogues. Profile IDs, counts and placements are those nvidia-smi mig -lgip/-lgipp
# print for the model (A30: tests/unit/fixtures/cmd/nvidia-smi/a30-mig-lgip-lgipp-lgi.txt;
# A100 80GB: NVIDIA's MIG user guide). memory_mib is the GiB column x 1024.


def _spots(starts, size) -> tuple:
    return tuple((start, size) for start in starts)


A100_80GB_PROFILES = (
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 19, 1, 9728, 7, _spots(range(7), 1), "MIG 1g.10gb", 14),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 20, 1, 9728, 1, _spots(range(7), 1), "MIG 1g.10gb+me", 14),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 15, 1, 19968, 4, _spots((0, 2, 4, 6), 2), "MIG 1g.20gb", 14),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 14, 2, 19968, 3, _spots((0, 2, 4), 2), "MIG 2g.20gb", 28),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 9, 3, 40192, 2, _spots((0, 4), 4), "MIG 3g.40gb", 42),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 5, 4, 40192, 1, _spots((0,), 4), "MIG 4g.40gb", 56),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 0, 7, 81152, 1, _spots((0,), 8), "MIG 7g.80gb", 98),
)  # fmt: skip

A30_24GB_PROFILES = (
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 14, 1, 5952, 4, _spots(range(4), 1), "MIG 1g.6gb", 14),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 21, 1, 5952, 1, _spots(range(4), 1), "MIG 1g.6gb+me", 14),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 5, 2, 11968, 2, _spots((0, 2), 2), "MIG 2g.12gb", 28),
    FakeProfile("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 0, 4, 24064, 1, _spots((0,), 4), "MIG 4g.24gb", 56),
)  # fmt: skip


def gpu_instance(gpu_bus_id: str, gi_id: int, profile: FakeProfile, start: int, size: int):
    """A FakeGpuInstance holding one full-size compute instance (id 0), as nvidia-smi -cgi -C makes."""
    compute = FakeComputeInstance(0, profile.slices, fake_uuid("MIG", gpu_bus_id, gi_id, 0))
    return FakeGpuInstance(gi_id, profile.id, start, size, (compute,))


def profile_named(profiles, name: str) -> FakeProfile:
    """The profile of ``profiles`` whose driver name is ``MIG <name>``."""
    return next(p for p in profiles if p.name == f"MIG {name}")
