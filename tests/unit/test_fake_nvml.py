"""The fake NVML (fake_nvml.py) keeps to the installed nvidia-ml-py's API, so it proves something."""

from __future__ import annotations

import ctypes
import inspect
import sys
from pathlib import Path

import pynvml
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import fake_nvml as fake  # noqa: E402

FAKE_FUNCTIONS = sorted(
    name
    for name, value in vars(fake.FakeNvml).items()
    if name.startswith("nvml") and callable(value)
)


def test_the_fake_implements_what_the_core_calls():
    numa = HERE.parents[1] / "plugins" / "module_utils" / "numa"
    core = "".join(
        (numa / name).read_text() for name in ("gpu.py", "gpu_nvml.py", "gpu_settings.py")
    )
    called = set()
    for name in dir(pynvml):
        if name.startswith("nvml") and f'"{name}"' in core:
            called.add(name)
    assert called, "the core names no pynvml function"
    assert called <= set(FAKE_FUNCTIONS)


@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_every_fake_function_has_pynvmls_name_and_parameters(name):
    real = getattr(pynvml, name, None)
    assert callable(real), f"pynvml has no {name}"
    wanted = list(inspect.signature(real).parameters)
    got = list(inspect.signature(getattr(fake.FakeNvml, name)).parameters)[1:]  # without self
    assert got == wanted


def test_constants_structs_and_errors_are_pynvmls_own():
    nvml = fake.FakeNvml([])
    assert nvml.NVMLError is pynvml.NVMLError
    assert nvml.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert nvml.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    assert nvml.NVML_GPU_INSTANCE_PROFILE_COUNT == pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT


def test_calls_before_init_fail_like_nvml_and_errors_carry_their_value():
    nvml = fake.FakeNvml([fake.FakeGpu("00000000:17:00.0", "GPU", 1024)])
    with pytest.raises(pynvml.NVMLError_Uninitialized) as err:
        nvml.nvmlDeviceGetCount()
    assert err.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_NotSupported) as err:
        nvml.nvmlDeviceGetMigMode(handle)
    assert str(err.value) == "Not Supported"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)


def test_array_calls_fill_the_callers_ctypes_array_and_count():
    profile = fake.A100_80GB_PROFILES[0]
    gpu = fake.FakeGpu(
        "00000000:17:00.0",
        "NVIDIA A100 80GB PCIe",
        81920,
        mig=(pynvml.NVML_DEVICE_MIG_ENABLE,) * 2,
        profiles=fake.A100_80GB_PROFILES,
    )
    nvml = fake.FakeNvml([gpu])
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile.id, None, ctypes.byref(count))
    assert count.value == 7
    array = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, profile.id, array, ctypes.byref(count)
        )
