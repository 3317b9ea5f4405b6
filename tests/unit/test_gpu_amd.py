"""gpu_amd on the synthetic MI300X tree with KFD nodes added: SPX and CPX GPUs, NPS4, amdsmi."""

from __future__ import annotations

import os
import tarfile

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, gpu_amd
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader
from tests.unit import fake_amdsmi as fake

TREE = "synthetic-mi300x-cpx"
TARBALL = os.path.join(os.path.dirname(__file__), "fixtures", "sysfs", f"{TREE}.tar.gz")
SPX = ("0000:03:00.0", "0000:23:00.0")
UNIQUE = 0x2BD3D5B45FF06A00


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")


@pytest.fixture(name="tree")
def fixture_tree(tmp_path):
    """The synthetic tree, two GPUs set to SPX/NPS1, with KFD topology and VRAM files.

    KFD nodes: 0-1 CPUs, then per GPU one node (SPX, num_xcc 8) or eight (CPX, num_xcc 1), each
    with the GPU's domain/location_id, its own unique_id (partition id in the low bits) and
    render minor.
    """
    with tarfile.open(TARBALL) as tar:
        tar.extractall(tmp_path, filter="data")
    sys_root = os.path.join(tmp_path, TREE, "sys")
    kfd = os.path.join(sys_root, "class/kfd/kfd/topology/nodes")
    for node in (0, 1):
        _write(f"{kfd}/{node}/gpu_id", "0")
        _write(f"{kfd}/{node}/properties", "cpu_cores_count 96\nsimd_count 0")
    devices = os.path.join(sys_root, "bus/pci/devices")
    amd = []
    for name in sorted(os.listdir(devices)):
        with open(os.path.join(devices, name, "vendor")) as handle:
            if handle.read().strip() == "0x1002":
                amd.append(name)
    node, minor = 2, 128
    for number, address in enumerate(amd):
        device = os.path.join(devices, address)
        spx = address in SPX
        if spx:
            _write(f"{device}/current_compute_partition", "SPX")
            _write(f"{device}/current_memory_partition", "NPS1")
        _write(f"{device}/mem_info_vram_total", str(196592 << 20))
        _write(
            f"{device}/compute_partition_config/supported_nps_configs",
            "NPS1" if spx else "NPS1, NPS4",
        )
        domain, bus, rest = address.split(":")
        dev_fn = rest.split(".")
        location = (int(bus, 16) << 8) | (int(dev_fn[0], 16) << 3) | int(dev_fn[1], 16)
        for part in range(1 if spx else 8):
            props = {
                "simd_count": 1216 if spx else 152,
                "gfx_target_version": 90402,
                "domain": int(domain, 16),
                "location_id": location | part,  # current kernels: partition id in the low bits
                "drm_render_minor": minor,
                "num_xcc": 8 if spx else 1,
                "unique_id": UNIQUE + (number << 4) + part,
            }
            _write(f"{kfd}/{node}/gpu_id", str(50000 + node))
            _write(f"{kfd}/{node}/properties", "\n".join(f"{k} {v}" for k, v in props.items()))
            node, minor = node + 1, minor + 1
    return sys_root, os.path.join(tmp_path, TREE, "proc"), amd


def _facts(tree, load=None):
    sys_root, proc_root, dummy = tree
    state = gpu.read_gpu_state(None, "no NVML here", None, "never")
    return gpu.read_gpu_topology(Reader(sys_root, proc_root), state, load)


def _by_address(facts):
    return {entry["address"]: entry for entry in facts["gpus"]}


def test_spx_and_cpx_gpus_from_sysfs(tree):
    facts = _facts(tree)
    assert facts["amdsmi"] == {
        "available": False,
        "reason": "amdsmi not requested",
        "version": None,
    }
    gpus = _by_address(facts)
    assert len(gpus) == 8
    spx = gpus["0000:03:00.0"]["amd"]
    assert spx["compute_partition"]["current"] == "SPX"
    assert spx["memory_partition"] == {"current": "NPS1", "available": ["NPS1", "NPS4"]}
    assert spx["kfd_node"] == 2 and spx["render_minor"] == 128 and spx["xcd_count"] == 8
    assert spx["uuid"] == f"GPU-{UNIQUE:016x}" and spx["unique_id"] == hex(UNIQUE)
    assert [lg["xcds"] for lg in spx["logical_gpus"]] == [list(range(8))]
    assert spx["vram_total_mib"] == 196592 and spx["drm_card"] == "card1"
    assert spx["compatible_memory_partitions"]["SPX"] == ["NPS1"]
    assert spx["compatible_memory_partitions"]["CPX"] == ["NPS1", "NPS4"]
    assert spx["compatible_source"] == "sysfs" and spx["source"] == "sysfs"
    assert gpus["0000:03:00.0"]["uuid"] == spx["uuid"]
    assert gpus["0000:03:00.0"]["memory_total_mib"] == 196592
    cpx_address = next(a for a in gpus if a not in SPX)
    cpx = gpus[cpx_address]["amd"]
    assert cpx["compute_partition"]["current"] == "CPX"
    assert cpx["memory_partition"]["current"] == "NPS1"
    assert [lg["index"] for lg in cpx["logical_gpus"]] == list(range(8))
    assert [lg["xcds"] for lg in cpx["logical_gpus"]] == [[i] for i in range(8)]
    # this fixture gives each partition a unique_id of its own (the tree's share the GPU's)
    uuids = [lg["uuid"] for lg in cpx["logical_gpus"]]
    assert len(set(uuids)) == 8 and cpx["uuid"] == uuids[0]
    # no hive_id in these KFD nodes: in no XGMI hive
    assert {g["amd"]["hive_id"] for g in gpus.values()} == {None}
    minors = [lg["render_minor"] for lg in cpx["logical_gpus"]]
    assert minors == list(range(minors[0], minors[0] + 8))
    assert cpx["xcd_count"] == 8


def test_amdsmi_enrichment(tree):
    module = fake.make_module(fake.mi300x_gpus(8, "CPX", "NPS4"))
    module.gpus[0].compute_partition = module.gpus[1].compute_partition = "SPX"
    module.gpus[0].memory_partition = module.gpus[1].memory_partition = "NPS1"
    module.gpus[2].processes.append({"name": "python3", "pid": 4242, "mem": 0})
    facts = _facts(tree, lambda: (module, None))
    assert facts["amdsmi"] == {"available": True, "reason": None, "version": "25.3.0"}
    gpus = _by_address(facts)
    first = gpus["0000:03:00.0"]
    assert first["amd"]["source"] == "amdsmi"
    assert first["name"] == first["amd"]["model"] == "AMD Instinct MI300X"
    assert first["sources"]["name"] == "amdsmi"
    assert gpus["0000:43:00.0"]["amd"]["processes"] == [{"pid": 4242, "name": "python3"}]
    assert first["amd"]["processes"] == []
    assert module.calls[0] == "amdsmi_init" and module.calls[-1] == "amdsmi_shut_down"


def test_amdsmi_missing_or_raising(tree):
    facts = _facts(tree, lambda: (None, "amdsmi is not importable: No module named 'amdsmi'"))
    assert facts["amdsmi"]["available"] is False
    assert "No module" in facts["amdsmi"]["reason"]
    assert all(e["amd"]["source"] == "sysfs" for e in facts["gpus"])
    module = fake.make_module([], init_error=fake.AmdSmiRetCode.DRIVER_NOT_LOADED)
    facts = _facts(tree, lambda: (module, None))
    assert facts["amdsmi"]["available"] is False
    assert "AMDSMI_STATUS_DRIVER_NOT_LOADED" in facts["amdsmi"]["reason"]
    broken = fake.mi300x_gpus(8)
    for item in broken:
        item.fail = fake.AmdSmiRetCode.DRM_ERROR
    facts = _facts(tree, lambda: (fake.make_module(broken), None))
    assert facts["amdsmi"]["available"] is True  # per-GPU failures lose fields, not the run
    assert all(e["amd"]["model"] is None for e in facts["gpus"])


def test_loader_not_called_without_amd_gpu():
    calls = []
    facts = {"gpus": [{"address": "0000:17:00.0", "vendor": "nvidia"}]}
    fact = gpu_amd.annotate(Reader("/nonexistent"), facts["gpus"], lambda: calls.append(1))
    assert calls == [] and facts["gpus"][0]["amd"] is None
    assert fact["available"] is False


def test_uuid_and_table():
    assert gpu_amd.gpu_uuid(0) is None
    assert gpu_amd.gpu_uuid(0x2BD3D5B45FF06A3A) == "GPU-2bd3d5b45ff06a3a"
    table, source = gpu_amd.compatible_memory_partitions(
        {"current": "SPX", "available": ["SPX", "CPX"]},
        {"current": "NPS1", "available": ["NPS1"]},
        None,
        90402,
    )
    assert table == {"SPX": ["NPS1"], "CPX": ["NPS1"]} and source == "table"
    assert gpu_amd.compatible_memory_partitions(None, None, None, 90402) == (None, None)


def test_snapshot_round_trip(tree, tmp_path):
    sys_root, proc_root, dummy = tree
    module = fake.make_module(fake.mi300x_gpus(8, "CPX", "NPS4"))
    module.gpus[3].processes.append({"name": "vllm", "pid": 77})
    out = str(tmp_path / "snap.json")

    def never(argv):
        raise AssertionError(f"no command expected: {argv}")

    facts, written = gpu.gather_gpu_topology(
        Reader(sys_root, proc_root),
        never,
        lambda name: None,
        lambda: (None, "no pynvml"),
        nvidia_smi_mode="never",
        snapshot_out=out,
        load_amdsmi=lambda: (module, None),
    )
    assert written
    calls = []
    replay, dummy = gpu.gather_gpu_topology(
        Reader(sys_root, proc_root),
        never,
        lambda name: None,
        lambda: (None, "no pynvml"),
        nvidia_smi_mode="never",
        snapshot=out,
        load_amdsmi=lambda: calls.append(1),
    )
    assert calls == []
    assert replay["amdsmi"] == facts["amdsmi"]
    for live, back in zip(facts["gpus"], replay["gpus"], strict=True):
        assert back["amd"]["source"] == "snapshot"
        assert dict(back["amd"], source="amdsmi") == live["amd"]
        assert back["uuid"] == live["uuid"] and back["name"] == "AMD Instinct MI300X"
    assert replay["gpus"][3]["amd"]["processes"] == [{"pid": 77, "name": "vllm"}]


def test_supported_nps_configs_describes_the_mode_xcp_config_selects(tree):
    """amdgpu_xcp.c: supported_nps_configs is for the configuration selected in xcp_config
    (root may select another mode there to read its resources; the partition does not change)."""
    sys_root, proc_root, dummy = tree
    device = os.path.join(sys_root, "bus/pci/devices/0000:03:00.0/compute_partition_config")
    _write(f"{device}/xcp_config", "CPX")
    _write(f"{device}/supported_nps_configs", "NPS1, NPS4")
    spx = _by_address(_facts(tree))["0000:03:00.0"]["amd"]
    assert spx["compute_partition"]["current"] == "SPX"
    assert spx["compatible_memory_partitions"]["CPX"] == ["NPS1", "NPS4"]
    assert spx["compatible_memory_partitions"]["SPX"] == ["NPS1"]  # the table's row stays


def test_supported_nps_configs_not_supported_falls_back_to_the_table(tree):
    """The driver prints 'Not supported' when the XCP config has no compatible NPS modes."""
    sys_root, proc_root, dummy = tree
    device = os.path.join(sys_root, "bus/pci/devices/0000:03:00.0/compute_partition_config")
    _write(f"{device}/supported_nps_configs", "Not supported")
    spx = _by_address(_facts(tree))["0000:03:00.0"]["amd"]
    assert spx["compatible_memory_partitions"]["SPX"] == ["NPS1"]
    assert spx["compatible_source"] == "table"
