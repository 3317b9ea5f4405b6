"""A fake of AMD's ``amdsmi`` Python library (the read and partition-set calls we use).

It follows the public API of ``amdsmi`` (ROCm's py-interface ``amdsmi_interface.py`` and
``amdsmi_exception.py``; reference https://rocm.docs.amd.com/projects/amdsmi/en/latest/reference/amdsmi-py-api.html):
module-level functions taking a processor handle, dict results with the documented keys,
``AmdSmiLibraryException`` carrying ``err_code`` (an ``amdsmi_status_t`` value, here
``AmdSmiRetCode``) and ``err_info``, ``AmdSmiParameterException`` for a wrong argument type.

The fake holds a mutable model of N GPUs (:class:`FakeGpu`: modes, processes) so code that sets
a compute or memory partition sees the state change, and a set on a GPU with processes raises
``AmdSmiLibraryException(AMDSMI_STATUS_BUSY)`` like the real library (the driver refuses the
sysfs write with EBUSY). Real code paths get this module by dependency injection: build one with
:func:`make_module` and pass it where the ``amdsmi`` module would go. Nothing is monkeypatched.

Facts carried over (values, not prose): struct fields of ``amdsmi_kfd_info_t`` (kfd_id, node_id,
current_partition_id), ``amdsmi_enumeration_info_t`` (drm_render, drm_card, hsa_id, hip_id,
hip_uuid), ``amdsmi_asic_info_t`` (market_name, vendor_id, device_id, rev_id, asic_serial,
oam_id, num_compute_units, target_graphics_version), ``amdsmi_vram_info_t`` (vram_size in MB),
the partition enums (SPX/DPX/TPX/QPX/CPX, NPS1/NPS2/NPS4/NPS8) and status codes of amdsmi.h.
"""

from __future__ import annotations

import copy
import enum
import types
from dataclasses import dataclass, field
from typing import Optional

XCDS_MI300X = 8
_PARTITIONS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
MI300X_COMPATIBLE = {
    "SPX": ["NPS1"],
    "DPX": ["NPS1"],
    "QPX": ["NPS1", "NPS4"],
    "CPX": ["NPS1", "NPS4"],
}


class AmdSmiRetCode(enum.IntEnum):
    """``amdsmi_status_t`` (amdsmi.h) values the fake raises."""

    SUCCESS = 0
    INVAL = 1
    NOT_SUPPORTED = 2
    NOT_YET_IMPLEMENTED = 3
    FAIL_LOAD_MODULE = 4
    FAIL_LOAD_SYMBOL = 5
    DRM_ERROR = 6
    API_FAILED = 7
    TIMEOUT = 8
    RETRY = 9
    NO_PERM = 10
    INTERRUPT = 11
    IO = 12
    ADDRESS_FAULT = 13
    FILE_ERROR = 14
    OUT_OF_RESOURCES = 15
    INTERNAL_EXCEPTION = 16
    INPUT_OUT_OF_BOUNDS = 17
    INIT_ERROR = 18
    REFCOUNT_OVERFLOW = 19
    BUSY = 30
    NOT_FOUND = 31
    NOT_INIT = 32
    NO_SLOT = 33
    DRIVER_NOT_LOADED = 34


class AmdSmiException(Exception):
    """Base of the library's exceptions."""


class AmdSmiLibraryException(AmdSmiException):
    """An error of the C library: ``err_code`` (status value) and ``err_info`` (its name)."""

    def __init__(self, err_code):
        super().__init__(err_code)
        self.err_code = int(err_code)
        try:
            self.err_info = "AMDSMI_STATUS_" + AmdSmiRetCode(err_code).name
        except ValueError:
            self.err_info = "AMDSMI_STATUS_UNKNOWN_ERROR"

    def get_error_code(self):
        return self.err_code

    def get_error_info(self):
        return self.err_info

    def __str__(self):
        return f"An error occurred with code: {self.err_code}({self.err_info})"


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(AmdSmiRetCode.RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self):
        super().__init__(AmdSmiRetCode.TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    """A parameter of the wrong type (raised before the C library is called)."""

    def __init__(self, received, expected, msg=""):
        super().__init__(received, expected)
        self.actual_type = type(received)
        self.expected_type = expected
        self.err_info = msg or f"Invalid parameter type: expected {expected}, got {type(received)}"

    def __str__(self):
        return self.err_info


class AmdSmiInitFlags(enum.IntFlag):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1
    INIT_NON_AMD_CPUS = 1 << 2
    INIT_NON_AMD_GPUS = 1 << 3
    INIT_AMD_APUS = INIT_AMD_CPUS | INIT_AMD_GPUS


class AmdSmiComputePartitionType(enum.IntEnum):
    SPX = 0
    DPX = 1
    TPX = 2
    QPX = 3
    CPX = 4
    INVALID = 5


class AmdSmiMemoryPartitionType(enum.IntEnum):
    UNKNOWN = 0
    NPS1 = 1
    NPS2 = 2
    NPS4 = 4
    NPS8 = 8


@dataclass
class FakeGpu:
    """One GPU of the model. ``processes``: dicts like amdsmi_get_gpu_process_list's items."""

    bdf: str
    unique_id: int  # KFD properties unique_id of partition 0 (the real value is 64 bit)
    kfd_node: int
    gpu_id: int
    drm_card: int
    drm_render: int
    compute_partition: str = "SPX"
    memory_partition: str = "NPS1"
    available_compute: list[str] = field(default_factory=lambda: ["SPX", "DPX", "QPX", "CPX"])
    available_memory: list[str] = field(default_factory=lambda: ["NPS1", "NPS4"])
    market_name: str = "AMD Instinct MI300X"
    device_id: int = 0x74A1
    vram_mb: int = 196592
    processes: list[dict] = field(default_factory=list)
    fail: Optional[int] = None  # every call on this GPU raises AmdSmiLibraryException(fail)


class _Handle:
    """Opaque processor handle (the real one is a ctypes pointer)."""

    __slots__ = ("gpu",)

    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu

    def __repr__(self):
        return f"<amdsmi_processor_handle {self.gpu.bdf}>"


def make_module(gpus, *, init_error: Optional[int] = None, version: str = "25.3.0"):
    """A module object with the ``amdsmi`` API over the given :class:`FakeGpu` list.

    ``init_error``: amdsmi_init raises AmdSmiLibraryException(init_error) (e.g. driver not
    loaded). The module's ``gpus`` attribute is the live model (tests inspect it after a set);
    ``calls`` records every API call name in order.
    """
    gpus = list(gpus)
    state = {"init": False}
    mod = types.ModuleType("amdsmi")
    mod.gpus = gpus
    mod.calls = []
    for cls in (
        AmdSmiRetCode,
        AmdSmiException,
        AmdSmiLibraryException,
        AmdSmiRetryException,
        AmdSmiTimeoutException,
        AmdSmiParameterException,
        AmdSmiInitFlags,
        AmdSmiComputePartitionType,
        AmdSmiMemoryPartitionType,
    ):
        setattr(mod, cls.__name__, cls)

    def api(fn):
        def wrapper(*args, **kwargs):
            mod.calls.append(fn.__name__)
            return fn(*args, **kwargs)

        wrapper.__name__ = fn.__name__
        setattr(mod, fn.__name__, wrapper)
        return wrapper

    def gpu_of(handle) -> FakeGpu:
        if not state["init"]:
            raise AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)
        if not isinstance(handle, _Handle):
            raise AmdSmiParameterException(handle, _Handle)
        if handle.gpu.fail is not None:
            raise AmdSmiLibraryException(handle.gpu.fail)
        return handle.gpu

    @api
    def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        if not isinstance(flag, int):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if init_error is not None:
            raise AmdSmiLibraryException(init_error)
        state["init"] = True

    @api
    def amdsmi_shut_down():
        if not state["init"]:
            raise AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)
        state["init"] = False

    @api
    def amdsmi_get_lib_version():
        major, minor, release = (int(x) for x in version.split("."))
        return {"major": major, "minor": minor, "release": release, "build": f"{version}+fake"}

    @api
    def amdsmi_get_processor_handles():
        if not state["init"]:
            raise AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)
        return [_Handle(g) for g in gpus]

    @api
    def amdsmi_get_gpu_device_bdf(handle):
        return gpu_of(handle).bdf

    @api
    def amdsmi_get_gpu_device_uuid(handle):
        g = gpu_of(handle)
        # amdsmi forms its UUID from the device id and the unique id (8-4-4-4-12 hex)
        text = f"{g.device_id & 0xFFFF:04x}{g.unique_id & (2**64 - 1):016x}".rjust(32, "0")
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"

    @api
    def amdsmi_get_gpu_asic_info(handle):
        g = gpu_of(handle)
        return {
            "market_name": g.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": hex(g.device_id),
            "rev_id": "0x00",
            "asic_serial": f"0x{g.unique_id:016X}",
            "oam_id": gpus.index(g),
            "num_compute_units": 304 // _PARTITIONS[g.compute_partition],
            "target_graphics_version": "gfx942",
        }

    @api
    def amdsmi_get_gpu_kfd_info(handle):
        g = gpu_of(handle)
        return {"kfd_id": g.gpu_id, "node_id": g.kfd_node, "current_partition_id": 0}

    @api
    def amdsmi_get_gpu_enumeration_info(handle):
        g = gpu_of(handle)
        return {
            "drm_render": g.drm_render,
            "drm_card": g.drm_card,
            "hsa_id": g.kfd_node,
            "hip_id": gpus.index(g),
            "hip_uuid": f"GPU-{g.unique_id:016x}",
        }

    @api
    def amdsmi_get_gpu_vram_info(handle):
        g = gpu_of(handle)
        return {
            "vram_type": "HBM3",
            "vram_vendor": "UNKNOWN",
            "vram_size": g.vram_mb,
            "vram_bit_width": 8192,
            "vram_max_bandwidth": 5300,
        }

    @api
    def amdsmi_get_gpu_compute_partition(handle):
        return gpu_of(handle).compute_partition

    @api
    def amdsmi_get_gpu_memory_partition(handle):
        return gpu_of(handle).memory_partition

    @api
    def amdsmi_get_gpu_memory_partition_config(handle):
        g = gpu_of(handle)
        return {
            "partition_caps": list(g.available_memory),
            "mp_mode": g.memory_partition,
            "num_numa_ranges": 1 if g.memory_partition == "NPS1" else 4,
        }

    @api
    def amdsmi_get_gpu_process_list(handle):
        return copy.deepcopy(gpu_of(handle).processes)

    def set_mode(handle, value, enum_cls, available, attr):
        if not isinstance(value, enum_cls):
            raise AmdSmiParameterException(value, enum_cls)
        g = gpu_of(handle)
        if value.name not in getattr(g, available):
            raise AmdSmiLibraryException(AmdSmiRetCode.INVAL)
        if g.processes:
            raise AmdSmiLibraryException(AmdSmiRetCode.BUSY)
        if attr == "compute_partition" and g.memory_partition not in MI300X_COMPATIBLE.get(
            value.name, []
        ):
            raise AmdSmiLibraryException(AmdSmiRetCode.INVAL)
        setattr(g, attr, value.name)

    @api
    def amdsmi_set_gpu_compute_partition(handle, compute_partition):
        set_mode(
            handle,
            compute_partition,
            AmdSmiComputePartitionType,
            "available_compute",
            "compute_partition",
        )

    @api
    def amdsmi_set_gpu_memory_partition(handle, memory_partition):
        g = gpu_of(handle)
        if isinstance(
            memory_partition, AmdSmiMemoryPartitionType
        ) and memory_partition.name not in MI300X_COMPATIBLE.get(g.compute_partition, []):
            raise AmdSmiLibraryException(AmdSmiRetCode.INVAL)
        set_mode(
            handle,
            memory_partition,
            AmdSmiMemoryPartitionType,
            "available_memory",
            "memory_partition",
        )

    @api
    def amdsmi_gpu_driver_reload():
        # amdsmi_gpu_driver_reload(void) (amdsmi.h, driver control): reloads amdgpu, which
        # resets every AMD GPU; the driver cannot unload while a process uses any of them.
        if not state["init"]:
            raise AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)
        if any(g.processes for g in gpus):
            raise AmdSmiLibraryException(AmdSmiRetCode.BUSY)

    mod.amdsmi_set_gpu_memory_partition_mode = mod.amdsmi_set_gpu_memory_partition
    return mod


def mi300x_gpus(count: int = 8, compute: str = "SPX", memory: str = "NPS1") -> list:
    """``count`` MI300X models at the synthetic tree's addresses (KFD nodes from 2)."""
    addresses = [
        "0000:03:00.0",
        "0000:23:00.0",
        "0000:43:00.0",
        "0000:63:00.0",
        "0000:83:00.0",
        "0000:a3:00.0",
        "0000:c3:00.0",
        "0000:e3:00.0",
    ]
    return [
        FakeGpu(
            bdf=addresses[i],
            unique_id=0x2BD3D5B45FF06A00 + i,
            kfd_node=2 + i,
            gpu_id=40000 + i,
            drm_card=1 + i,
            drm_render=128 + i,
            compute_partition=compute,
            memory_partition=memory,
        )
        for i in range(count)
    ]
