"""GPU topology core: sysfs inventory, NVML (fake, injected), nvidia-smi XML, snapshots, merge."""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import re
import sys
import threading
from pathlib import Path

import pynvml
import pytest

UNIT = Path(__file__).resolve().parents[3]
for _extra in (UNIT, UNIT / "fixtures", UNIT / "fixtures" / "gpu_snapshots"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import fake_nvml as fake  # noqa: E402
import make_snapshots  # noqa: E402
import trees  # noqa: E402

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (  # noqa: E402
    gpu,
    gpu_nvml,
    gpu_smi,
    gpu_snapshot,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (  # noqa: E402
    CommandOutputError,
    SnapshotError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import (  # noqa: E402
    Reader,
)

CMD = UNIT / "fixtures" / "cmd" / "nvidia-smi"
SNAPSHOTS = UNIT / "fixtures" / "gpu_snapshots"
H100_XML = CMD / "h100-sxm-q-x.xml"
H100_TEXT = CMD / "h100-sxm-q.txt"
A30_TEXT = CMD / "a30-mig-lgip-lgipp-lgi.txt"
ENABLE, DISABLE = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


def recorded(path: Path) -> str:
    """The command output part of a recorded fixture (below the '# ----' header line)."""
    text = path.read_text(encoding="utf-8")
    return text.split("---- command output below this line", 1)[1].split("\n", 1)[1]


def facts_of(machine: str, tmp_path, state: gpu.GpuState) -> dict:
    root = trees.materialize(machine, tmp_path / machine)
    return gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)


def by_address(facts: dict) -> dict:
    return {entry["address"]: entry for entry in facts["gpus"]}


def a100_fleet(**changes):
    gpus = make_snapshots.fleet()["synthetic-2x6338-4xa100"]
    for key, value in changes.items():
        setattr(gpus[0], key, value)
    return gpus


# ---------------------------------------------------------------------------------------------
# Small pure helpers


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [
        ("00000000:DB:00.0", "0000:db:00.0"),  # NVML / nvidia-smi: 8-digit upper-case domain
        (b"00000000:17:00.0", "0000:17:00.0"),  # a bytes busId from an older nvidia-ml-py
        ("00000001:00:00.0", "0001:00:00.0"),  # Hyper-V / Azure passthrough domain
        ("00000009:01:00.0", "0009:01:00.0"),  # GH200
        ("00010000:E1:00.0", "10000:e1:00.0"),  # VMD domain: the kernel prints 5 digits
        ("0000:3A:00.0", "0000:3a:00.0"),  # NVML's legacy 4-digit form
        ("00000000:DB:00.0\0\0", "0000:db:00.0"),  # NUL padding of a C buffer
    ],
)
def test_bus_ids_become_kernel_addresses(bus_id, address):
    assert gpu.normalise_bus_id(bus_id) == address


@pytest.mark.parametrize("bus_id", ["", "DB:00.0", "00000000:DB:00", "0000000000:DB:00.0", "x"])
def test_bad_bus_ids_are_refused_with_the_value(bus_id):
    with pytest.raises(ValueError, match="is not a PCI bus id"):
        gpu.normalise_bus_id(bus_id)


@pytest.mark.parametrize(
    ("memory_mib", "total_mib", "gb"),
    [
        (9728, 81920, 10),  # A100 80GB 1g.10gb (9.50 GiB)
        (19968, 81920, 20),  # A100 80GB 1g.20gb / 2g.20gb (19.50 GiB)
        (40192, 81920, 40),  # A100 80GB 3g.40gb / 4g.40gb (39.25 GiB)
        (81152, 81920, 80),  # A100 80GB 7g.80gb
        (5952, 24576, 6),  # A30 1g.6gb (5.81 GiB in the recording)
        (11968, 24576, 12),  # A30 2g.12gb (11.69 GiB)
        (24064, 24576, 24),  # A30 4g.24gb (23.50 GiB)
    ],
)
def test_mig_memory_gb_rounds_to_eighths_of_the_gpu(memory_mib, total_mib, gb):
    assert gpu.mig_memory_gb(memory_mib, total_mib << 20) == gb


def test_mig_memory_gb_needs_the_gpu_total():
    assert gpu.mig_memory_gb(9728, None) is None
    assert gpu.mig_memory_gb(0, 81920 << 20) is None


# ---------------------------------------------------------------------------------------------
# NVML through the fake


def test_nvml_enriches_every_gpu_and_sysfs_keeps_the_locality(tmp_path):
    nvml = fake.FakeNvml(a100_fleet())
    facts = facts_of("synthetic-2x6338-4xa100", tmp_path, gpu_nvml.read_nvml(nvml))
    assert facts["nvml"] == {"available": True, "reason": None, "driver_version": "560.35.03"}
    assert facts["nvidia_smi"]["used"] is False
    assert facts["warnings"] == []
    addresses = [entry["address"] for entry in facts["gpus"]]
    assert addresses == trees.GPU_ADDRESSES["synthetic-2x6338-4xa100"]
    first = facts["gpus"][0]
    assert first["name"] == "NVIDIA A100 80GB PCIe"
    assert first["memory_total_mib"] == 81920
    assert first["uuid"].startswith("GPU-")
    assert (first["compute_mode"], first["persistence_mode"]) == ("default", "enabled")
    assert first["processes"] == []
    assert (first["nvlink_peers"], first["nvlink_switches"]) == ([], [])
    assert (first["numa_node"], first["node"], first["node_source"]) == (0, 0, "numa_node")
    assert first["sources"]["node"] == "sysfs"
    assert first["sources"]["uuid"] == first["sources"]["mig"] == "nvml"
    assert first["partition"] is None
    assert [g["node"] for g in facts["gpus"]] == [0, 0, 1, 1]
    assert nvml.initialised == 0 and nvml.shutdowns == 1


def test_mig_enabled_gpu_lists_instances_profiles_and_mig_device_uuids(tmp_path):
    facts = facts_of(
        "synthetic-2x6338-4xa100", tmp_path, gpu_nvml.read_nvml(fake.FakeNvml(a100_fleet()))
    )
    mig = by_address(facts)["0000:17:00.0"]["mig"]
    assert (mig["mode_current"], mig["mode_pending"]) == ("enabled", "enabled")
    layout = [
        (
            gi["id"],
            gi["profile_name"],
            gi["profile_id"],
            gi["placement_start"],
            gi["placement_size"],
        )
        for gi in mig["gpu_instances"]
    ]
    assert layout == [(2, "3g.40gb", 9, 4, 4), (3, "2g.20gb", 14, 0, 2), (4, "2g.20gb", 14, 2, 2)]
    for gi in mig["gpu_instances"]:
        (compute,) = gi["compute_instances"]
        assert compute["id"] == 0
        assert compute["profile_name"] == gi["profile_name"]
        assert compute["mig_device_uuid"].startswith("MIG-")
        assert gi["mig_device_uuid"] == compute["mig_device_uuid"]
    assert len({gi["mig_device_uuid"] for gi in mig["gpu_instances"]}) == 3
    profiles = {p["name"]: (p["id"], p["max_count"]) for p in mig["supported_profiles"]}
    assert profiles == {  # 19 is 1g.10gb on A100-80GB, 4x20 GB is 1g.20gb (15)
        "1g.10gb": (19, 7),
        "1g.10gb+me": (20, 1),
        "1g.20gb": (15, 4),
        "2g.20gb": (14, 3),
        "3g.40gb": (9, 2),
        "4g.40gb": (5, 1),
        "7g.80gb": (0, 1),
    }
    three = next(p for p in mig["supported_profiles"] if p["name"] == "3g.40gb")
    assert three["placements"] == [{"start": 0, "size": 4}, {"start": 4, "size": 4}]
    assert (three["slice_count"], three["memory_mib"]) == (3, 40192)


def test_mig_disabled_gpu_has_no_instances_and_profiles_only_if_nvml_lists_them(tmp_path):
    cautious = gpu_nvml.read_nvml(fake.FakeNvml(a100_fleet(), profiles_need_mig=True))
    cautious = cautious.gpus["0000:31:00.0"]
    assert cautious["mig"]["mode_current"] == "disabled"
    assert cautious["mig"]["gpu_instances"] == []
    assert cautious["mig"]["supported_profiles"] is None
    assert cautious["unavailable"]["mig.supported_profiles"] == (
        "nvmlDeviceGetGpuInstanceProfileInfo: Not Supported"
    )
    listing = gpu_nvml.read_nvml(fake.FakeNvml(a100_fleet()))  # as driver 580 on an H200 does
    record = listing.gpus["0000:31:00.0"]
    assert [p["id"] for p in record["mig"]["supported_profiles"]] == [19, 20, 15, 14, 9, 5, 0]
    assert record["mig"]["gpu_instances"] == []


def test_gpu_without_mig_or_nvlink_reports_null_with_reasons():
    l40s = make_snapshots.fleet()["synthetic-epyc-nps4"]
    record = gpu_nvml.read_nvml(fake.FakeNvml(l40s)).gpus["0000:41:00.0"]
    assert record["mig"] is None
    assert record["unavailable"]["mig"] == "nvmlDeviceGetMigMode: Not Supported"
    assert record["nvlink_peers"] is None and record["nvlink_switches"] is None
    assert record["unavailable"]["nvlink_peers"] == "nvmlDeviceGetNvLinkState: Not Supported"
    assert record["name"] == "NVIDIA L40S"


LIB_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (LIB_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    ],
)
def test_failing_init_makes_nvml_unavailable_with_its_reason(tmp_path, code, message):
    nvml = fake.FakeNvml(a100_fleet(), init_error=code)
    state = gpu_nvml.read_nvml(nvml)
    assert state.nvml == {
        "available": False,
        "reason": f"nvmlInit failed: {message}",
        "driver_version": None,
    }
    assert state.gpus == {}
    assert nvml.shutdowns == 0  # nothing to shut down
    facts = facts_of("synthetic-2x6338-4xa100", tmp_path, state)
    assert len(facts["gpus"]) == 4
    assert all(entry["uuid"] is None and entry["unavailable"] == {} for entry in facts["gpus"])
    assert facts["warnings"] == []  # no enrichment, so nothing to disagree with


@pytest.mark.parametrize(
    ("function", "code", "field", "reason"),
    [
        ("nvmlDeviceGetComputeMode", pynvml.NVML_ERROR_NOT_SUPPORTED, "compute_mode", "Not Supported"),
        ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_NO_PERMISSION, "uuid", "Insufficient Permissions"),
        ("nvmlDeviceGetName", pynvml.NVML_ERROR_GPU_IS_LOST, "name", "GPU is lost"),
        ("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, "memory_total_mib", "Unknown Error"),
        ("nvmlDeviceGetPersistenceMode", pynvml.NVML_ERROR_NOT_SUPPORTED, "persistence_mode", "Not Supported"),
        ("nvmlDeviceGetMigMode", pynvml.NVML_ERROR_NOT_SUPPORTED, "mig", "Not Supported"),
    ],
)  # fmt: skip
def test_each_nvml_error_costs_only_its_own_value(function, code, field, reason):
    state = gpu_nvml.read_nvml(fake.FakeNvml(a100_fleet(failures={function: code})))
    record = state.gpus["0000:17:00.0"]
    assert record[field] is None
    assert record["unavailable"][field] == f"{function}: {reason}"
    untouched = {"uuid", "name", "compute_mode", "persistence_mode"} - {field}
    assert all(record[key] is not None for key in untouched)
    assert state.nvml["available"] is True


def test_unknown_memory_leaves_profile_names_to_the_driver():
    state = gpu_nvml.read_nvml(
        fake.FakeNvml(a100_fleet(failures={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_UNKNOWN}))
    )
    names = [p["name"] for p in state.gpus["0000:17:00.0"]["mig"]["supported_profiles"]]
    assert names[0] == "1g.10gb"  # from the v2 struct's name
    nameless = gpu_nvml.read_nvml(
        fake.FakeNvml(
            a100_fleet(failures={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_UNKNOWN}),
            driver_profile_names=False,
        )
    )
    assert {p["name"] for p in nameless.gpus["0000:17:00.0"]["mig"]["supported_profiles"]} == {None}


def test_functions_missing_from_an_old_nvidia_ml_py_are_reasons_not_crashes():
    missing = ("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetMaxMigDeviceCount")
    state = gpu_nvml.read_nvml(fake.FakeNvml(a100_fleet(), missing=missing))
    record = state.gpus["0000:17:00.0"]
    assert (
        "nvmlDeviceGetNumaNodeId is missing from this nvidia-ml-py"
        in record["unavailable"]["nvml_numa_node"]
    )
    assert "nvmlDeviceGetMaxMigDeviceCount" in record["unavailable"]["mig.mig_device_uuid"]
    assert all(gi["mig_device_uuid"] is None for gi in record["mig"]["gpu_instances"])


def test_a_gpu_nvml_cannot_open_is_a_warning_and_sysfs_still_lists_it(tmp_path):
    gpus = a100_fleet()
    gpus[1].failures = {"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST}
    nvml = fake.FakeNvml(gpus)
    facts = facts_of("synthetic-2x6338-4xa100", tmp_path, gpu_nvml.read_nvml(nvml))
    assert {"path": "nvml:device1", "reason": "nvmlDeviceGetHandleByIndex: GPU is lost"} in facts[
        "warnings"
    ]
    assert {
        "path": "0000:31:00.0",
        "reason": "nvml did not report this GPU (another driver, a cgroup, or lost)",
    } in facts["warnings"]
    lost = by_address(facts)["0000:31:00.0"]
    assert lost["uuid"] is None and lost["node"] == 0
    reason = "nvml did not report this GPU (another driver, a cgroup, or lost)"
    assert lost["unavailable"] == dict.fromkeys(sorted(gpu.ENRICHED_FIELDS), reason)
    assert nvml.shutdowns == 1


def test_processes_join_compute_and_graphics_and_survive_one_failing():
    gpus = a100_fleet(compute_pids=(4711, 815), graphics_pids=(815, 99))
    assert gpu_nvml.read_nvml(fake.FakeNvml(gpus)).gpus["0000:17:00.0"]["processes"] == [
        99,
        815,
        4711,
    ]
    gpus[0].failures = {"nvmlDeviceGetGraphicsRunningProcesses": pynvml.NVML_ERROR_NOT_SUPPORTED}
    assert gpu_nvml.read_nvml(fake.FakeNvml(gpus)).gpus["0000:17:00.0"]["processes"] == [815, 4711]
    gpus[0].failures["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    record = gpu_nvml.read_nvml(fake.FakeNvml(gpus)).gpus["0000:17:00.0"]
    assert record["processes"] is None
    assert record["unavailable"]["processes"] == (
        "nvmlDeviceGetComputeRunningProcesses: Insufficient Permissions; "
        "nvmlDeviceGetGraphicsRunningProcesses: Not Supported"
    )


def test_gpus_on_common_nvswitches_are_all_to_all_peers(tmp_path):
    facts = facts_of("synthetic-8xh100-2s", tmp_path, make_snapshots.state("synthetic-8xh100-2s"))
    addresses = trees.GPU_ADDRESSES["synthetic-8xh100-2s"]
    for entry in facts["gpus"]:
        assert entry["nvlink_peers"] == [a for a in addresses if a != entry["address"]]
        assert entry["nvlink_switches"] == [
            "0000:05:00.0",
            "0000:06:00.0",
            "0000:07:00.0",
            "0000:08:00.0",
        ]
    assert [entry["node"] for entry in facts["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_direct_nvlink_bridges_pair_gpus_without_switches():
    gpus = a100_fleet()
    gpus[0].nvlinks = (fake.FakeLink("00000000:31:00.0"),) * 4 + (
        fake.FakeLink("x", active=False),
    ) * 8
    gpus[1].nvlinks = (fake.FakeLink("00000000:17:00.0"),) * 4 + (
        fake.FakeLink("x", active=False),
    ) * 8
    state = gpu_nvml.read_nvml(fake.FakeNvml(gpus))
    assert state.gpus["0000:17:00.0"]["nvlink_peers"] == ["0000:31:00.0"]
    assert state.gpus["0000:31:00.0"]["nvlink_peers"] == ["0000:17:00.0"]
    assert state.gpus["0000:b1:00.0"]["nvlink_peers"] == []


def test_nvml_numa_node_is_kept_apart_from_the_sysfs_node(tmp_path):
    facts = facts_of("synthetic-gh200", tmp_path, make_snapshots.state("synthetic-gh200"))
    (entry,) = facts["gpus"]
    assert entry["address"] == "0009:01:00.0"  # NVML's 00000009:01:00.0, normalised and joined
    assert entry["nvml_numa_node"] == 1  # the GPU's memory node
    assert (entry["numa_node"], entry["node"]) == (0, 0)  # the CPU node, from sysfs
    assert entry["sources"]["node"] == "sysfs" and entry["sources"]["nvml_numa_node"] == "nvml"


def test_unknown_sysfs_node_is_not_filled_in_from_nvml(tmp_path):
    state = make_snapshots.state("synthetic-vm-gpu-numa-unknown")
    facts = facts_of("synthetic-vm-gpu-numa-unknown", tmp_path, state)
    first, second = facts["gpus"]
    assert (first["numa_node"], first["node"], first["node_source"]) == (None, None, None)
    assert (second["numa_node"], second["node"], second["node_source"]) == (
        None,
        1,
        "local_cpulist",
    )
    assert "node" not in first["sources"] and first["sources"]["uuid"] == "nvml"
    assert first["persistence_mode"] == "disabled"


# A30 24GB: what nvidia-smi mig -lgip / -lgipp / -lgi printed on a real card.
A30_INSTANCES = ((3, 0), (4, 1), (5, 2), (6, 3))  # (GPU instance id, placement start)


def _a30_recording():
    text = recorded(A30_TEXT)
    rows = re.findall(r"\|\s+0\s+MIG (\S+)\s+(\d+)\s+\d+/(\d+)\s+([\d.]+)\s", text)
    profiles = {name: (int(pid), int(total), float(gib)) for name, pid, total, gib in rows}
    placements = {}
    for pid, starts, size in re.findall(
        r"Profile ID\s+(\d+) Placements? ?: \{([\d,]+)\}:(\d+)", text
    ):
        placements[int(pid)] = [{"start": int(s), "size": int(size)} for s in starts.split(",")]
    instances = re.findall(r"\|\s+0\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|", text)
    return profiles, placements, instances


def test_a30_profiles_and_instances_match_the_recorded_nvidia_smi_output():
    profiles, placements, instances = _a30_recording()
    assert len(profiles) == 4 and len(placements) == 4 and len(instances) == 4
    bus = "00000000:D8:00.0"
    catalogue = fake.A30_24GB_PROFILES
    one = fake.profile_named(catalogue, "1g.6gb")
    a30 = fake.FakeGpu(
        bus_id=bus,
        name="NVIDIA A30",
        memory_total_mib=24576,
        mig=(ENABLE, ENABLE),
        profiles=catalogue,
        gpu_instances=tuple(
            fake.gpu_instance(bus, gi, one, start, 1) for gi, start in A30_INSTANCES
        ),
    )
    # Names derived from slices and memory (driver_profile_names=False), as for old drivers.
    state = gpu_nvml.read_nvml(fake.FakeNvml([a30], driver_profile_names=False))
    mig = state.gpus["0000:d8:00.0"]["mig"]
    got = {
        p["name"]: (p["id"], p["max_count"], round(p["memory_mib"] / 1024, 2))
        for p in mig["supported_profiles"]
    }
    assert got == profiles
    assert {p["id"]: p["placements"] for p in mig["supported_profiles"]} == placements
    assert [
        (
            gi["profile_name"],
            str(gi["profile_id"]),
            str(gi["id"]),
            str(gi["placement_start"]),
            str(gi["placement_size"]),
        )
        for gi in mig["gpu_instances"]
    ] == instances


# ---------------------------------------------------------------------------------------------
# AMD Instinct partitions


def test_mi300x_partitions_come_from_sysfs(tmp_path):
    facts = facts_of("synthetic-mi300x-cpx", tmp_path, gpu.nvml_unavailable("no NVIDIA"))
    assert [entry["vendor"] for entry in facts["gpus"]] == ["amd"] * 8
    for entry in facts["gpus"]:
        spx = entry["address"] in ("0000:03:00.0", "0000:23:00.0")
        assert entry["partition"] == {
            "compute": {
                "current": "SPX" if spx else "CPX",
                "available": ["SPX", "DPX", "QPX", "CPX"],
            },
            "memory": {"current": "NPS1", "available": ["NPS1", "NPS4"]},
        }
        assert entry["sources"]["partition"] == "sysfs"
        # One logical GPU per SPX GPU, eight per CPX GPU, each with its own render node; all
        # carry the GPU's UUID (the driver's unique_id), and the xcp cards are no GPUs.
        logical = entry["amd"]["logical_gpus"]
        assert len(logical) == (1 if spx else 8)
        assert {item["uuid"] for item in logical} == {entry["uuid"]}
        assert len({item["render_minor"] for item in logical}) == len(logical)
        assert entry["uuid"] == logical[0]["uuid"] and entry["uuid"].startswith("GPU-")
        assert [item["xcds"] for item in logical] == (
            [list(range(8))] if spx else [[index] for index in range(8)]
        )
        assert entry["mig"] is None and entry["unavailable"] == {}
    assert facts["warnings"] == []


def _card(root: Path, name: str, device_dir: str, files: dict) -> None:
    device = root / "sys" / device_dir
    (device / "drm" / name).mkdir(parents=True)
    for file_name, text in files.items():
        (device / file_name).write_text(text)
    link = root / "sys" / "class" / "drm" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("../../" + device_dir) / "drm" / name)


def test_partition_reader_skips_platform_cards_and_tolerates_missing_files(tmp_path):
    _card(tmp_path, "card1", "devices/pci0000:00/0000:00:01.1/0000:03:00.0", {
        "current_compute_partition": "spx\n",  # lower case, no available_ file
    })  # fmt: skip
    _card(
        tmp_path, "card9", "devices/platform/amdgpu_xcp.0", {"current_compute_partition": "CPX\n"}
    )
    _card(tmp_path, "card2", "devices/pci0000:00/0000:00:02.1/0000:05:00.0", {})
    (tmp_path / "sys" / "class" / "drm" / "renderD128").mkdir()
    reader = Reader(str(tmp_path / "sys"))
    assert gpu.read_amd_partitions(reader) == {
        "0000:03:00.0": {"compute": {"current": "SPX", "available": []}, "memory": None}
    }
    assert reader.warnings == []


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q -x


def test_recorded_h100_xml_parses_to_the_values_of_the_text_recording():
    state = gpu_smi.parse_nvidia_smi_xml(H100_XML.read_text(encoding="utf-8"))
    assert state.source == "nvidia-smi"
    assert state.nvidia_smi == {"used": True, "reason": None, "driver_version": "560.35.03"}
    assert list(state.gpus) == ["0000:db:00.0"]
    record = state.gpus["0000:db:00.0"]
    text = recorded(H100_TEXT)

    def field(label):
        return re.search(rf"^\s*{label}\s*: (.*?)\s*$", text, re.MULTILINE).group(1)

    assert record["uuid"] == field("GPU UUID")
    assert record["name"] == field("Product Name")
    assert f"{record['memory_total_mib']} MiB" == re.search(
        r"FB Memory Usage\n\s+Total\s+: (.*)", text
    ).group(1)
    assert record["compute_mode"] == field("Compute Mode").lower()
    assert record["persistence_mode"] == field("Persistence Mode").lower()
    assert record["mig"] == {
        "mode_current": "disabled",
        "mode_pending": "disabled",
        "gpu_instances": [],
        "supported_profiles": None,
    }
    assert record["processes"] == []  # "Processes : None"
    assert gpu.normalise_bus_id(field("Bus Id")) == "0000:db:00.0"
    assert record["nvlink_peers"] is None
    assert record["unavailable"]["nvlink_peers"] == "not reported by nvidia-smi -q"


def test_slurm_job_seeing_one_of_eight_gpus_enriches_that_one_and_warns_for_the_rest(tmp_path):
    xml = H100_XML.read_text(encoding="utf-8")
    state = gpu.read_gpu_state(
        fake.FakeNvml([], init_error=LIB_NOT_FOUND),
        nvidia_smi=lambda: (0, xml, ""),
    )
    facts = facts_of("synthetic-8xh100-2s", tmp_path, state)
    assert facts["nvml"]["available"] is False
    assert facts["nvml"]["reason"] == "nvmlInit failed: NVML Shared Library Not Found"
    assert facts["nvidia_smi"] == {"used": True, "reason": None, "driver_version": "560.35.03"}
    seen = by_address(facts)["0000:db:00.0"]
    assert seen["sources"]["uuid"] == "nvidia-smi" and seen["node"] == 1
    warned = {w["path"] for w in facts["warnings"]}
    assert warned == set(trees.GPU_ADDRESSES["synthetic-8xh100-2s"]) - {"0000:db:00.0"}


MIG_XML = """<?xml version="1.0" ?>
<nvidia_smi_log>
  <driver_version>550.54.15</driver_version>
  <gpu id="00000000:17:00.0">
    <product_name>NVIDIA A100 80GB PCIe</product_name>
    <uuid>GPU-1</uuid>
    <persistence_mode>Enabled</persistence_mode>
    <mig_mode><current_mig>Enabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <mig_devices>
      <mig_device><index>0</index><gpu_instance_id>2</gpu_instance_id><compute_instance_id>0</compute_instance_id></mig_device>
      <mig_device><index>1</index><gpu_instance_id>3</gpu_instance_id><compute_instance_id>0</compute_instance_id></mig_device>
      <mig_device><index>2</index><gpu_instance_id>3</gpu_instance_id><compute_instance_id>1</compute_instance_id></mig_device>
    </mig_devices>
    <fb_memory_usage><total>81920 MiB</total></fb_memory_usage>
    <compute_mode>Exclusive_Process</compute_mode>
    <processes>
      <process_info><gpu_instance_id>2</gpu_instance_id><pid>4711</pid><type>C</type></process_info>
      <process_info><gpu_instance_id>3</gpu_instance_id><pid>815</pid><type>C</type></process_info>
    </processes>
  </gpu>
  <gpu id="00000000:41:00.0">
    <product_name>NVIDIA L40S</product_name>
    <mig_mode><current_mig>N/A</current_mig><pending_mig>N/A</pending_mig></mig_mode>
    <fb_memory_usage><total>[Insufficient Permissions]</total></fb_memory_usage>
  </gpu>
  <gpu><product_name>no bus id</product_name></gpu>
</nvidia_smi_log>
"""  # hand-made: the shapes of mig_devices and processes in public nvidia-smi -q -x output


def test_xml_mig_devices_processes_and_not_available_values():
    state = gpu_smi.parse_nvidia_smi_xml(MIG_XML)
    a100, l40s = state.gpus["0000:17:00.0"], state.gpus["0000:41:00.0"]
    assert (a100["mig"]["mode_current"], a100["mig"]["mode_pending"]) == ("enabled", "disabled")
    assert [
        (gi["id"], [ci["id"] for ci in gi["compute_instances"]])
        for gi in a100["mig"]["gpu_instances"]
    ] == [(2, [0]), (3, [0, 1])]
    assert a100["processes"] == [815, 4711]
    assert a100["compute_mode"] == "exclusive_process"
    assert a100["unavailable"]["mig.gpu_instances"].startswith("nvidia-smi -q gives instance ids")
    assert l40s["mig"] is None
    assert l40s["unavailable"]["mig"] == "nvidia-smi reports N/A for <mig_mode/current_mig>"
    assert l40s["memory_total_mib"] is None
    assert "[Insufficient Permissions]" in l40s["unavailable"]["memory_total_mib"]
    assert l40s["processes"] is None
    assert state.warnings == (
        {"path": "nvidia-smi:gpu[2]", "reason": "'' is not a PCI bus id like 00000000:DB:00.0"},
    )


ODD_XML = """<?xml version="1.0" ?>
<nvidia_smi_log>
  <driver_version>999.1</driver_version>
  <gpu id="00000000:17:00.0">
    <product_name>NVIDIA A100 80GB PCIe</product_name>
    <uuid>GPU-1</uuid>
    <persistence_mode>maybe</persistence_mode>
    <compute_mode>weird</compute_mode>
    <mig_mode><current_mig>whatever</current_mig><pending_mig>Enabled</pending_mig></mig_mode>
    <fb_memory_usage><total>81920 MiB</total></fb_memory_usage>
    <processes></processes>
  </gpu>
  <gpu id="00000000:31:00.0">
    <persistence_mode>ENABLED</persistence_mode>
    <compute_mode>Exclusive_Thread</compute_mode>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>soon</pending_mig></mig_mode>
  </gpu>
</nvidia_smi_log>
"""  # hand-made: values a newer or odd driver might print


def test_odd_nvidia_smi_values_are_null_with_reasons_and_survive_a_snapshot(tmp_path):
    state = gpu_smi.parse_nvidia_smi_xml(ODD_XML)
    odd, other = state.gpus["0000:17:00.0"], state.gpus["0000:31:00.0"]
    assert (odd["persistence_mode"], odd["compute_mode"], odd["mig"]) == (None, None, None)
    assert odd["unavailable"]["persistence_mode"] == (
        "nvidia-smi: persistence_mode 'maybe' is not one of Enabled, Disabled"
    )
    assert odd["unavailable"]["compute_mode"] == (
        "nvidia-smi: compute_mode 'weird' is not one of Default, Exclusive_Thread, Prohibited, "
        "Exclusive_Process"
    )
    assert odd["unavailable"]["mig"] == (
        "nvidia-smi: mig mode_current 'whatever' is not one of Enabled, Disabled"
    )
    assert (other["persistence_mode"], other["compute_mode"]) == ("enabled", "exclusive_thread")
    assert (other["mig"]["mode_current"], other["mig"]["mode_pending"]) == ("disabled", None)
    assert other["unavailable"]["mig.mode_pending"] == (
        "nvidia-smi: mig mode_pending 'soon' is not one of Enabled, Disabled"
    )
    facts = facts_of("synthetic-2x6338-4xa100", tmp_path, state)
    entry = by_address(facts)["0000:17:00.0"]
    assert entry["persistence_mode"] is None and "persistence_mode" not in entry["sources"]
    assert entry["unavailable"]["persistence_mode"].startswith("nvidia-smi: persistence_mode")
    path = tmp_path / "odd.json"
    gpu_snapshot.write_snapshot(str(path), state)
    again = gpu_snapshot.read_snapshot(str(path))
    assert again.gpus == state.gpus


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "output is not XML"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "not XML",
        ),
        ("<nvidia_smi_log><gpu>", "not XML"),
        ("<html><body/></html>", "root element is <html>, not <nvidia_smi_log>"),
    ],
)
def test_output_that_is_not_nvidia_smi_xml_is_refused(text, message):
    with pytest.raises(CommandOutputError, match=re.escape(message)) as err:
        gpu_smi.parse_nvidia_smi_xml(text)
    assert str(err.value).startswith("nvidia-smi -q -x: ")


def test_nvidia_smi_runner_outcomes():
    missing = gpu.read_nvidia_smi(None, required=False)
    assert missing.nvidia_smi == {
        "used": False,
        "reason": "nvidia-smi was not found in PATH",
        "driver_version": None,
    }
    with pytest.raises(CommandOutputError, match="not found in PATH; install the NVIDIA driver"):
        gpu.read_nvidia_smi(None, required=True)

    def failing():
        return (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            "",
        )

    state = gpu.read_nvidia_smi(failing, required=False)
    assert state.nvidia_smi["reason"] == (
        "exited with status 9: NVIDIA-SMI has failed because it couldn't communicate with the "
        "NVIDIA driver."
    )
    with pytest.raises(CommandOutputError, match="exited with status 9"):
        gpu.read_nvidia_smi(failing, required=True)
    garbage = gpu.read_nvidia_smi(lambda: (0, "oops", ""), required=False)
    assert garbage.nvidia_smi["reason"].startswith("output is not XML")


def test_nvidia_smi_runs_under_coreutils_timeout_when_there_is_one():
    smi, killer = "/usr/bin/nvidia-smi", "/usr/bin/timeout"
    assert gpu.nvidia_smi_argv(smi, killer, 30) == [
        killer,
        "--kill-after=5",
        "30",
        smi,
        "-q",
        "-x",
    ]
    assert gpu.nvidia_smi_argv(smi, None, 30) == [smi, "-q", "-x"]  # no timeout: no limit
    assert gpu.nvidia_smi_argv(None, killer, 30) is None  # no nvidia-smi: nothing to run
    for bad in (0, -5):
        with pytest.raises(CommandOutputError) as err:
            gpu.nvidia_smi_argv(smi, killer, bad)
        assert str(err.value) == (
            f"nvidia-smi -q -x: nvidia_smi_timeout is {bad}; set it to a whole number of "
            "seconds, 1 or more"
        )


@pytest.mark.parametrize("rc", [124, 137])
def test_nvidia_smi_that_timed_out_says_so(rc):
    def runner():
        return rc, "", ""

    state = gpu.read_gpu_state(None, "no pynvml", runner, nvidia_smi_timeout=30)
    assert state.nvidia_smi == {
        "used": False,
        "reason": "timed out after 30 s",
        "driver_version": None,
    }
    assert state.nvml["reason"] == "no pynvml"
    with pytest.raises(CommandOutputError) as err:
        gpu.read_gpu_state(None, None, runner, "always", nvidia_smi_timeout=30)
    assert str(err.value) == (
        "nvidia-smi -q -x: timed out after 30 s; raise nvidia_smi_timeout if the driver is only "
        "slow, or find out why nvidia-smi hangs"
    )
    # Without coreutils timeout, a status of 124 is nvidia-smi's own.
    plain = gpu.read_nvidia_smi(runner, required=False)
    assert plain.nvidia_smi["reason"] == f"exited with status {rc}"


def test_huge_nvidia_smi_output_is_refused_before_parsing():
    huge = "<nvidia_smi_log>" + " " * (64 << 20)
    state = gpu.read_nvidia_smi(lambda: (0, huge, ""), required=False)
    assert state.nvidia_smi["reason"] == (
        "printed more than 64 MiB, which is no nvidia-smi -q -x report"
    )


def test_messages_quote_at_most_80_characters_of_a_file_or_an_output():
    long = "E" * 100_000
    failed = gpu.read_nvidia_smi(lambda: (3, "", long + "\nsecond line\n"), required=False)
    assert failed.nvidia_smi["reason"] == f"exited with status 3: {'E' * 80}..."
    xml = (
        f'<nvidia_smi_log><gpu id="{long}"/><gpu id="00000000:17:00.0">'
        f"<persistence_mode>{long}</persistence_mode>"
        f"<fb_memory_usage><total>{long}</total></fb_memory_usage>"
        f"<compute_mode>[{long}]</compute_mode></gpu></nvidia_smi_log>"
    )
    state = gpu_smi.parse_nvidia_smi_xml(xml)
    quoted = f"'{'E' * 80}...'"
    assert state.warnings[0]["reason"] == f"{quoted} is not a PCI bus id like 00000000:DB:00.0"
    miss = state.gpus["0000:17:00.0"]["unavailable"]
    assert miss["persistence_mode"] == (
        f"nvidia-smi: persistence_mode {quoted} is not one of Enabled, Disabled"
    )
    assert miss["memory_total_mib"] == f"nvidia-smi printed {quoted}, not a size in MiB"
    assert miss["compute_mode"] == f"nvidia-smi reports [{'E' * 79}... for <compute_mode>"
    doc = good_doc()
    doc["gpus"][0]["mig"]["mode_current"] = long
    with pytest.raises(SnapshotError) as err:
        gpu_snapshot.parse_snapshot(json.dumps(doc), "/srv/host.json")
    assert f"gpus[0].mig.mode_current is {quoted}; expected one of" in str(err.value)
    assert len(str(err.value)) < 300
    for change, where in (
        (_set(["gpus", 0, long], 1), "gpus[0] has unknown key(s)"),
        (_set(["gpus", 0, "address"], long), "gpus[0].address: "),
        (_set(["version"], [long]), "has version "),
        (_set(["gpus", 0, "unavailable", long], 3), "gpus[0].unavailable.EEE"),
    ):
        with pytest.raises(SnapshotError) as err:
            gpu_snapshot.parse_snapshot(json.dumps(change(good_doc())), "/srv/host.json")
        assert where in str(err.value) and len(str(err.value)) < 300, str(err.value)[:300]


def test_gpu_state_modes():
    xml = H100_XML.read_text(encoding="utf-8")

    def runner():
        return 0, xml, ""

    nvml = fake.FakeNvml(make_snapshots.fleet()["synthetic-8xh100-2s"])
    assert gpu.read_gpu_state(nvml, nvidia_smi=runner).source == "nvml"  # NVML first
    always = gpu.read_gpu_state(nvml, nvidia_smi=runner, nvidia_smi_mode="always")
    assert always.source == "nvidia-smi"
    assert always.nvml["reason"] == "not used: nvidia_smi=always"
    never = gpu.read_gpu_state(None, "no pynvml here", nvidia_smi=runner, nvidia_smi_mode="never")
    assert never.nvml["reason"] == "no pynvml here"
    assert never.nvidia_smi["reason"] == "not tried: nvidia_smi=never"
    assert never.gpus == {}


# ---------------------------------------------------------------------------------------------
# Snapshots


def test_snapshot_round_trip_and_snapshot_facts(tmp_path):
    state = make_snapshots.state("synthetic-2x6338-4xa100")
    path = tmp_path / "gpu.json"
    gpu_snapshot.write_snapshot(str(path), state)
    again = gpu_snapshot.read_snapshot(str(path))
    assert again.gpus == state.gpus
    assert (again.nvml, again.nvidia_smi, again.source) == (state.nvml, state.nvidia_smi, "nvml")
    assert gpu_snapshot.as_snapshot(again) == gpu_snapshot.as_snapshot(state)
    live = facts_of("synthetic-2x6338-4xa100", tmp_path, state)
    replayed = facts_of("synthetic-2x6338-4xa100", tmp_path, again)
    assert replayed["snapshot"] == {"path": str(path), "recorded_from": "nvml"}
    assert live["snapshot"] == {"path": None, "recorded_from": None}
    for before, after in zip(live["gpus"], replayed["gpus"], strict=True):
        assert after["sources"] == {
            key: ("snapshot" if value == "nvml" else value)
            for key, value in before["sources"].items()
        }
        assert {k: v for k, v in after.items() if k != "sources"} == {
            k: v for k, v in before.items() if k != "sources"
        }


@pytest.mark.parametrize("machine", sorted(make_snapshots.fleet()))
def test_snapshot_files_are_current_and_match_their_trees(tmp_path, machine):
    path = SNAPSHOTS / f"{machine}.json"
    assert path.read_text(encoding="utf-8") == make_snapshots.render(machine), (
        f"{path.name} is stale: run {Path(make_snapshots.__file__).relative_to(UNIT.parents[1])}"
    )
    facts = facts_of(machine, tmp_path, gpu_snapshot.read_snapshot(str(path)))
    assert facts["warnings"] == []
    assert [entry["address"] for entry in facts["gpus"]] == trees.GPU_ADDRESSES[machine]
    assert all(entry["sources"]["uuid"] == "snapshot" for entry in facts["gpus"])


def good_doc() -> dict:
    return json.loads(make_snapshots.render("synthetic-2x6338-4xa100"))


def _set(path, value):
    def change(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc

    return change


def _delete(path):
    def change(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return doc

    return change


def _duplicate(doc):
    doc["gpus"].append(dict(doc["gpus"][0]))
    return doc


BAD_SNAPSHOTS = [
    ("not JSON", lambda doc: "{", "is not JSON"),
    ("a list", lambda doc: [], 'is not a GPU snapshot (no "format": "numafleet.tuning/gpu-snapshot")'),
    ("other format", _set(["format"], "something-else"), "is not a GPU snapshot"),
    ("newer version", _set(["version"], 2), "has version 2; this collection reads version 1"),
    ("no gpus", _delete(["gpus"]), "the top level lacks gpus"),
    ("typo key", _set(["gpus", 0, "memory_total_gib"], 80), "gpus[0] has unknown key(s) 'memory_total_gib'"),
    ("string memory", _set(["gpus", 0, "memory_total_mib"], "80 GB"), "gpus[0].memory_total_mib must be an integer, not a string"),
    ("bool id", _set(["gpus", 0, "mig", "gpu_instances", 0, "id"], True), "gpus[0].mig.gpu_instances[0].id must be an integer, not a boolean"),
    ("bad mode", _set(["gpus", 0, "mig", "mode_current"], "Enabled"), "gpus[0].mig.mode_current is 'Enabled'; expected one of enabled, disabled"),
    ("bad address", _set(["gpus", 0, "address"], "17:00.0"), "gpus[0].address: '17:00.0' is not a PCI address"),
    ("bad peer", _set(["gpus", 0, "nvlink_peers"], ["GPU1"]), "gpus[0].nvlink_peers[0]: 'GPU1' is not a PCI address"),
    ("repeated gpu", _duplicate, "gpus[4] repeats address 0000:17:00.0"),
    ("reason not text", _set(["gpus", 1, "unavailable", "mig"], 3), "gpus[1].unavailable.mig must be a string, not a number"),
    ("bad source", _set(["recorded_from"], "dcgm"), "recorded_from is 'dcgm'; expected one of nvml, nvidia-smi"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "change", "message"), BAD_SNAPSHOTS, ids=[c[0] for c in BAD_SNAPSHOTS]
)
def test_bad_snapshots_are_refused_with_a_message_naming_file_and_place(case, change, message):
    doc = change(good_doc())
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(SnapshotError) as err:
        gpu_snapshot.parse_snapshot(text, "/srv/host.json")
    assert message in str(err.value)
    assert str(err.value).startswith("GPU snapshot /srv/host.json: ")
    assert str(err.value).endswith("snapshot_out=PATH on the host.")
    assert err.value.path == "/srv/host.json"


def test_snapshot_files_that_cannot_be_read_or_written(tmp_path):
    with pytest.raises(SnapshotError, match="cannot be read \\(No such file or directory\\)"):
        gpu_snapshot.read_snapshot(str(tmp_path / "missing.json"))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SnapshotError, match="is not UTF-8 text"):
        gpu_snapshot.read_snapshot(str(binary))
    target = tmp_path / "no-such-dir" / "out.json"
    with pytest.raises(SnapshotError) as err:
        gpu_snapshot.write_snapshot(str(target), make_snapshots.state("synthetic-gh200"))
    assert str(err.value) == (
        f"GPU snapshot {target}: cannot be written (No such file or directory). Make sure the "
        f"directory of snapshot_out ({target.parent}) exists and is writable on the host, and "
        "that snapshot_out is not itself a directory."
    )
    assert "Record a new one" not in str(err.value)
    assert not target.parent.exists()


def unblock_fifo_later(path, seconds=3.0):
    """Open ``path`` for writing after ``seconds`` if a reader waits on it, so no test hangs."""

    def release():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody opened it for reading, as it should be
            pass

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()
    return timer


@pytest.mark.parametrize("kind", ["FIFO", "directory", "character device"])
def test_snapshot_that_is_not_a_regular_file_is_refused_unopened(tmp_path, kind):
    if kind == "FIFO":
        path = tmp_path / "snapshot.json"
        os.mkfifo(path)
        unblock_fifo_later(str(path))
    elif kind == "directory":
        path = tmp_path
    else:
        path = Path(os.devnull)
    with pytest.raises(SnapshotError) as err:
        gpu_snapshot.read_snapshot(str(path))
    assert str(err.value) == (
        f"GPU snapshot {path}: is not a regular file (it is a {kind}). Point snapshot at a JSON "
        "file written by numafleet.tuning.gpu_topology_facts snapshot_out=PATH."
    )
    assert err.value.path == str(path)


def test_snapshot_error_says_how_to_fix_it():
    default = SnapshotError("/x.json", "is broken")
    assert str(default) == (
        "GPU snapshot /x.json: is broken. Record a new one with "
        "numafleet.tuning.gpu_topology_facts snapshot_out=PATH on the host."
    )
    custom = SnapshotError("/x.json", "cannot be written (Read-only file system)", fix="Fix it.")
    assert str(custom) == "GPU snapshot /x.json: cannot be written (Read-only file system). Fix it."
    assert (custom.path, custom.reason, custom.fix) == (
        "/x.json",
        "cannot be written (Read-only file system)",
        "Fix it.",
    )


def test_snapshot_replaces_nvml_entirely(tmp_path):
    path = SNAPSHOTS / "synthetic-gh200.json"
    nvml = fake.FakeNvml([])
    state = gpu.read_gpu_state(
        nvml, nvidia_smi=lambda: pytest.fail("ran nvidia-smi"), snapshot=str(path)
    )
    assert nvml.calls == []
    assert state.snapshot_path == str(path) and state.label == "snapshot"


# ---------------------------------------------------------------------------------------------
# One gathering (gpu_topology_facts and numa_facts gpu=true), and the NVML import it skips


def test_nvml_library_name_and_reason_are_those_of_pynvml():
    """The shortcut must say what pynvml's own nvmlInit says when libnvidia-ml cannot load."""
    source = inspect.getsource(pynvml._LoadNvmlLibrary)
    assert f'CDLL("{gpu.NVML_LIBRARY}")' in source
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in source
    error = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert f"nvmlInit failed: {error}" == gpu.NVML_LIBRARY_MISSING


def test_nvml_library_probe():
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    assert gpu.read_nvml_library(missing) is False
    assert gpu.read_nvml_library(lambda name: object()) is True
    try:
        ctypes.CDLL(gpu.NVML_LIBRARY)
    except OSError:
        loads = False
    else:
        loads = True
    assert gpu.read_nvml_library() is loads


def test_without_the_library_pynvml_is_not_imported_and_the_reason_is_nvmlinit_s(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml")
    calls = []

    def load():
        calls.append("import")
        return pynvml, None

    got = gpu.load_nvml_if_usable(load, library_loads=lambda: False)
    if sys.platform.startswith("linux"):
        assert got == (None, gpu.NVML_LIBRARY_MISSING) and calls == []
    # Where the library loads, or pynvml is already imported, the import decides as before.
    assert gpu.load_nvml_if_usable(load, library_loads=lambda: True) == (pynvml, None)
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    assert gpu.load_nvml_if_usable(load, library_loads=lambda: False) == (pynvml, None)


def test_a_missing_pynvml_is_reported_by_the_import_itself(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml")
    monkeypatch.setattr(sys, "path", [])  # nothing can be found: find_spec says so
    reason = "nvidia-ml-py (import pynvml) is not installed"
    got = gpu.load_nvml_if_usable(lambda: (None, reason), library_loads=lambda: False)
    assert got == (None, reason)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pynvml loads nvml.dll there")
def test_the_shortcut_gives_the_state_read_nvml_gives(monkeypatch):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML answers here: this is a GPU host")
    real = gpu.read_gpu_state(pynvml, None, None, "never")
    monkeypatch.delitem(sys.modules, "pynvml")
    nvml, reason = gpu.load_nvml_if_usable(lambda: pytest.fail("pynvml was imported"))
    assert gpu.read_gpu_state(nvml, reason, None, "never") == real


def test_gather_runs_nvidia_smi_with_argv_under_timeout_and_loads_no_nvml_with_a_snapshot(
    tmp_path,
):
    root = trees.materialize("synthetic-8xh100-2s", tmp_path / "h100")
    ran, loaded = [], []

    def runner(argv):
        ran.append(argv)
        return 0, recorded_xml(), ""

    def which(name):
        return {"nvidia-smi": "/usr/bin/nvidia-smi", "timeout": "/usr/bin/timeout"}.get(name)

    def load():
        loaded.append(True)
        return None, "not installed"

    facts, written = gpu.gather_gpu_topology(
        Reader(f"{root}/sys", f"{root}/proc"), runner, which, load, nvidia_smi_timeout=7
    )
    assert written is False and facts["nvidia_smi"]["used"] is True
    assert ran == [["/usr/bin/timeout", "--kill-after=5", "7", "/usr/bin/nvidia-smi", "-q", "-x"]]
    out = tmp_path / "snap.json"
    facts, written = gpu.gather_gpu_topology(
        Reader(f"{root}/sys", f"{root}/proc"),
        runner,
        which,
        load,
        snapshot=str(SNAPSHOTS / "synthetic-8xh100-2s.json"),
        snapshot_out=str(out),
    )
    assert written is True and loaded == [True] and len(ran) == 1
    assert facts["snapshot"]["path"] == str(SNAPSHOTS / "synthetic-8xh100-2s.json")
    assert (
        gpu_snapshot.read_snapshot(str(out)).gpus
        == gpu_snapshot.read_snapshot(facts["snapshot"]["path"]).gpus
    )
    facts, written = gpu.gather_gpu_topology(
        Reader(f"{root}/sys", f"{root}/proc"),
        runner,
        which,
        load,
        snapshot=str(out),
        snapshot_out=str(tmp_path / "not-in-check-mode.json"),
        check_mode=True,
    )
    assert written is False and not (tmp_path / "not-in-check-mode.json").exists()


def recorded_xml() -> str:
    return H100_XML.read_text(encoding="utf-8")


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_snapshot_out_is_never_written_through_a_link_and_has_mode_0644(tmp_path, mask):
    """Failed before: a link at the predictable temporary name (or at the file) was followed,
    and the mode followed the umask (issue 19)."""
    theirs = tmp_path / "theirs"
    theirs.write_text("theirs\n")
    target = tmp_path / "out.json"
    target.symlink_to(theirs)
    (tmp_path / f".out.json.{os.getpid()}.tmp").symlink_to(theirs)
    old = os.umask(mask)
    try:
        gpu_snapshot.write_snapshot(str(target), make_snapshots.state("synthetic-gh200"))
    finally:
        os.umask(old)
    assert theirs.read_text() == "theirs\n" and not target.is_symlink()
    assert target.stat().st_mode & 0o777 == 0o644


def test_a_gpu_instance_may_be_marked_rendered_and_nothing_else():
    # "rendered": a render-mode apply made it in the recording (mig_nvml.render_into_snapshot);
    # older snapshots lack the key, which is fine, and only true/false is accepted.
    doc = good_doc()
    instance = doc["gpus"][0]["mig"]["gpu_instances"][0]
    assert "rendered" not in instance
    gpu_snapshot.parse_snapshot(json.dumps(doc), "/srv/host.json")
    instance["rendered"] = True
    state = gpu_snapshot.parse_snapshot(json.dumps(doc), "/srv/host.json")
    assert state.gpus["0000:17:00.0"]["mig"]["gpu_instances"][0]["rendered"] is True
    instance["rendered"] = "yes"
    with pytest.raises(SnapshotError) as err:
        gpu_snapshot.parse_snapshot(json.dumps(doc), "/srv/host.json")
    assert "gpus[0].mig.gpu_instances[0].rendered must be true or false, not a string" in str(
        err.value
    )
