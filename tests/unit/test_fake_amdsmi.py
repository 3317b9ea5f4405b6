"""The fake amdsmi follows the documented API: names, result keys, exceptions, set semantics."""

from __future__ import annotations

import pytest

from tests.unit import fake_amdsmi as fake

DOCUMENTED = (
    "amdsmi_init",
    "amdsmi_shut_down",
    "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_device_bdf",
    "amdsmi_get_gpu_device_uuid",
    "amdsmi_get_gpu_asic_info",
    "amdsmi_get_gpu_kfd_info",
    "amdsmi_get_gpu_enumeration_info",
    "amdsmi_get_gpu_vram_info",
    "amdsmi_get_gpu_compute_partition",
    "amdsmi_get_gpu_memory_partition",
    "amdsmi_get_gpu_memory_partition_config",
    "amdsmi_get_gpu_process_list",
    "amdsmi_set_gpu_compute_partition",
    "amdsmi_set_gpu_memory_partition",
)


def _module(**kw):
    mod = fake.make_module(fake.mi300x_gpus(2), **kw)
    mod.amdsmi_init(mod.AmdSmiInitFlags.INIT_AMD_GPUS)
    return mod


def test_documented_names_and_keys():
    mod = _module()
    for name in DOCUMENTED:
        assert callable(getattr(mod, name))
    handle = mod.amdsmi_get_processor_handles()[0]
    assert mod.amdsmi_get_gpu_device_bdf(handle) == "0000:03:00.0"
    assert set(mod.amdsmi_get_gpu_kfd_info(handle)) == {"kfd_id", "node_id", "current_partition_id"}
    assert {"drm_render", "drm_card", "hsa_id", "hip_id", "hip_uuid"} <= set(
        mod.amdsmi_get_gpu_enumeration_info(handle)
    )
    assert mod.amdsmi_get_gpu_asic_info(handle)["market_name"] == "AMD Instinct MI300X"
    assert mod.amdsmi_get_gpu_vram_info(handle)["vram_size"] == 196592
    assert mod.amdsmi_get_gpu_compute_partition(handle) == "SPX"
    assert mod.amdsmi_get_gpu_memory_partition(handle) == "NPS1"
    assert len(mod.amdsmi_get_gpu_device_uuid(handle).split("-")) == 5
    mod.amdsmi_shut_down()
    with pytest.raises(fake.AmdSmiLibraryException) as err:
        mod.amdsmi_get_gpu_device_bdf(handle)
    assert err.value.err_code == fake.AmdSmiRetCode.NOT_INIT
    assert err.value.err_info == "AMDSMI_STATUS_NOT_INIT"


def test_init_error_and_parameter_type():
    mod = fake.make_module([], init_error=fake.AmdSmiRetCode.DRIVER_NOT_LOADED)
    with pytest.raises(fake.AmdSmiLibraryException) as err:
        mod.amdsmi_init()
    assert err.value.err_code == 34
    mod = _module()
    handle = mod.amdsmi_get_processor_handles()[0]
    with pytest.raises(fake.AmdSmiParameterException):
        mod.amdsmi_set_gpu_compute_partition(handle, "CPX")
    with pytest.raises(fake.AmdSmiParameterException):
        mod.amdsmi_get_gpu_device_bdf("0000:03:00.0")


def test_set_changes_the_model_and_busy_gpu_raises():
    mod = _module()
    first, second = mod.amdsmi_get_processor_handles()
    mod.amdsmi_set_gpu_compute_partition(first, mod.AmdSmiComputePartitionType.CPX)
    mod.amdsmi_set_gpu_memory_partition(first, mod.AmdSmiMemoryPartitionType.NPS4)
    assert (mod.gpus[0].compute_partition, mod.gpus[0].memory_partition) == ("CPX", "NPS4")
    # SPX is not compatible with NPS4 on MI300X
    with pytest.raises(fake.AmdSmiLibraryException) as err:
        mod.amdsmi_set_gpu_compute_partition(first, mod.AmdSmiComputePartitionType.SPX)
    assert err.value.err_code == fake.AmdSmiRetCode.INVAL
    mod.gpus[1].processes.append({"name": "python3", "pid": 4242})
    with pytest.raises(fake.AmdSmiLibraryException) as err:
        mod.amdsmi_set_gpu_compute_partition(second, mod.AmdSmiComputePartitionType.CPX)
    assert err.value.err_code == fake.AmdSmiRetCode.BUSY
    assert mod.gpus[1].compute_partition == "SPX"
    assert mod.amdsmi_get_gpu_process_list(second) == [{"name": "python3", "pid": 4242}]
