"""gpu_amd_smi: amd-smi output -> the facts' amd record, on real public outputs.

Every amd-smi text here is a published output (tests/unit/fixtures/amd/PROVENANCE.md). amd-smi
prints its JSON document as text with upper-case keys, so the JSON inputs are made from the
parsed text with json.dumps (never written by hand); the one recorded JSON output (process) is
used as published.
"""

from __future__ import annotations

import json

import pytest
from amd_fixtures import amd_output

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu_amd_smi
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    CommandOutputError,
)

STATIC_MI300A = "amd-smi-static-4x-mi300a-spx-nps1.txt"
STATIC_CPX64 = "amd-smi-static-partition-8x-mi300x-cpx-nps4.txt"
STATIC_CPX1 = "amd-smi-static-partition-cpx-nps4-rocm6.3.txt"
LIST_2 = "amd-smi-list-2x-rocm6.3.txt"
PROCESS_TEXT = "amd-smi-process-rocm6.2.txt"
PROCESS_JSON = "amd-smi-process-rocm6.2.json"
PARTITION_SPX = "amd-smi-partition-4x-spx-nps1-excerpt.txt"
PARTITION_DPX = "amd-smi-partition-accelerator-mi300x-dpx-excerpt.txt"
RECORD_KEYS = {
    "model",
    "kfd_node",
    "gpu_id",
    "unique_id",
    "uuid",
    "hive_id",
    "drm_card",
    "render_minor",
    "vram_total_mib",
    "compute_partition",
    "memory_partition",
    "compatible_memory_partitions",
    "compatible_source",
    "xcd_count",
    "logical_gpus",
    "processes",
    "source",
}


def as_json(name: str) -> str:
    """The --json form of a text fixture: the parsed entries as amd-smi's logger dumps them."""
    return json.dumps(gpu_amd_smi.parse_devices(amd_output(name)), indent=4)


# -- the static output of 4x MI300A (SPX/NPS1) -------------------------------------------------


def test_static_text_gives_one_record_per_pci_gpu_with_the_contract_keys():
    records = gpu_amd_smi.parse_amd_smi(amd_output(STATIC_MI300A))
    assert list(records) == ["0000:01:00.0", "0001:01:00.0", "0002:01:00.0", "0003:01:00.0"]
    for record in records.values():
        assert set(record) == RECORD_KEYS
        assert record["source"] == "amd-smi"
    first = records["0000:01:00.0"]
    assert first["model"] == "MI300A"
    assert first["vram_total_mib"] == 64289
    assert first["compute_partition"] == {"current": "SPX", "available": []}
    assert first["memory_partition"] == {"current": "NPS1", "available": []}
    # static alone knows no KFD node, UUID or render node, nor the processes
    assert (first["kfd_node"], first["uuid"], first["render_minor"]) == (None, None, None)
    assert first["processes"] is None
    assert first["compatible_memory_partitions"] is None
    assert first["compatible_source"] is None
    assert first["logical_gpus"] == [
        {
            "index": 0,
            "uuid": None,
            "unique_id": None,
            "kfd_node": None,
            "gpu_id": None,
            "render_minor": None,
            "xcds": [],
        }
    ]


def test_static_text_skips_the_cpu_blocks_and_reads_numa_nodes():
    devices = gpu_amd_smi.parse_devices(amd_output(STATIC_MI300A))
    assert [d["gpu"] for d in devices] == [0, 1, 2, 3]
    assert devices[1]["bus"]["bdf"] == "0001:01:00.0"
    # repeated keys of one block (the pstate policies) are kept, not lost
    assert devices[0]["soc_pstate"]["policies"]["policy_id"] == ["0", "1", "2", "3"]
    assert gpu_amd_smi.numa_nodes(amd_output(STATIC_MI300A)) == {
        "0000:01:00.0": 0,
        "0001:01:00.0": 1,
        "0002:01:00.0": 2,
        "0003:01:00.0": 3,
    }


def test_static_json_form_gives_the_same_records_as_the_text():
    text = gpu_amd_smi.parse_amd_smi(amd_output(STATIC_MI300A))
    assert gpu_amd_smi.parse_amd_smi(as_json(STATIC_MI300A)) == text
    wrapped = json.dumps({"gpu_data": json.loads(as_json(STATIC_MI300A)), "cpu_data": []})
    assert gpu_amd_smi.parse_amd_smi(wrapped) == text
    upper = json.dumps(
        [{k.upper(): v for k, v in e.items()} for e in json.loads(as_json(STATIC_MI300A))]
    )
    assert gpu_amd_smi.parse_amd_smi(upper) == text


def test_vram_size_as_amd_smi_json_prints_it():
    entries = json.loads(as_json(STATIC_MI300A))
    for entry in entries:
        number, unit = entry["vram"]["size"].split()
        entry["vram"]["size"] = {"value": int(number), "unit": unit}
    records = gpu_amd_smi.parse_amd_smi(json.dumps(entries))
    assert {r["vram_total_mib"] for r in records.values()} == {64289}


# -- partitions ----------------------------------------------------------------------------------


def test_static_partition_of_8_mi300x_in_cpx_lists_64_logical_gpus():
    devices = gpu_amd_smi.parse_devices(amd_output(STATIC_CPX64))
    assert len(devices) == 64
    assert {d["partition"]["compute_partition"] for d in devices} == {"CPX"}
    assert {d["partition"]["memory_partition"] for d in devices} == {"NPS4"}
    ids = [int(d["partition"]["partition_id"]) for d in devices]
    assert ids == list(range(8)) * 8  # partition ids restart at 0 on each physical GPU


def test_static_partition_alone_is_refused_for_its_missing_pci_address():
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi(amd_output(STATIC_CPX64))
    assert str(err.value).startswith("amd-smi static --json: GPU 0 has no PCI address")
    assert "without a section option" in str(err.value)


def test_list_gives_bdf_kfd_node_and_gpu_id_when_static_lacks_the_bus():
    records = gpu_amd_smi.parse_amd_smi(amd_output(STATIC_CPX1), list_json=amd_output(LIST_2))
    assert list(records) == ["0000:23:00.0"]
    record = records["0000:23:00.0"]
    assert record["compute_partition"]["current"] == "CPX"
    assert record["memory_partition"]["current"] == "NPS4"
    assert (record["kfd_node"], record["gpu_id"]) == (1, 45412)
    # AMD redacted the UUID; amd-smi list's uuid is no ROCR_VISIBLE_DEVICES UUID anyway
    assert record["uuid"] is None and record["unique_id"] is None
    assert record["logical_gpus"][0]["index"] == 0


def test_list_json_hip_uuid_is_the_rocr_uuid_and_render_the_render_minor():
    """No public capture of ``amd-smi list -e`` was found: the recorded list gets the three keys
    -e adds (ROCm 6.4+), in the forms list_devices.py prints them (``renderD<minor>``,
    ``card<minor>``), with minors 128/129 (the first render minors of the recorded KFD
    topology) and hip_uuid N/A."""
    entries = gpu_amd_smi.parse_devices(amd_output(LIST_2))
    for entry, minor in zip(entries, (128, 129), strict=True):
        entry.update({"render": f"renderD{minor}", "card": f"card{minor - 127}", "hip_uuid": "N/A"})
    static = json.loads(as_json(STATIC_CPX1))
    records = gpu_amd_smi.parse_amd_smi(json.dumps(static), list_json=json.dumps(entries))
    record = records["0000:23:00.0"]
    assert (record["render_minor"], record["drm_card"]) == (128, "card1")
    assert record["uuid"] is None  # hip_uuid N/A: no UUID rather than a guess


def test_partition_tables_give_available_modes_and_profile_data():
    records = gpu_amd_smi.parse_amd_smi(
        amd_output(STATIC_MI300A), partition_json=amd_output(PARTITION_SPX)
    )
    first = records["0000:01:00.0"]
    assert first["compute_partition"] == {"current": "SPX", "available": ["SPX"]}
    # memory caps N/A in the table: no available list rather than a guess
    assert first["memory_partition"] == {"current": "NPS1", "available": []}
    assert first["xcd_count"] == 6  # 1 partition x 6 XCC (the MI300A's XCDs)
    assert first["logical_gpus"][0]["xcds"] == [0, 1, 2, 3, 4, 5]
    assert records["0001:01:00.0"]["xcd_count"] is None  # its profile rows are not recorded


def test_accelerator_profiles_of_an_mi300x_in_dpx():
    tables = gpu_amd_smi.parse_partition(amd_output(PARTITION_DPX))
    rows = tables["partition_profiles"]
    assert [r["resource_type"] for r in rows] == ["XCC", "DECODER", "DMA", "JPEG", "XCC"]
    assert [r["accelerator_type"] for r in rows if r["accelerator_type"]] == ["SPX", "DPX*"]
    assert rows[1]["gpu_id"] == "" and rows[4]["gpu_id"] == ""  # continuation rows
    profiles = gpu_amd_smi._profiles(rows)
    assert profiles == [
        {"type": "SPX", "caps": ["NPS1"], "partitions": 1, "xcc": 8, "current": False},
        {"type": "DPX", "caps": ["NPS1"], "partitions": 2, "xcc": 4, "current": True},
    ]


def test_partition_json_form_gives_the_same_tables():
    tables = gpu_amd_smi.parse_partition(amd_output(PARTITION_SPX))
    assert gpu_amd_smi.parse_partition(json.dumps(tables)) == tables
    records = gpu_amd_smi.parse_amd_smi(
        amd_output(STATIC_MI300A), partition_json=json.dumps(tables)
    )
    assert records["0000:01:00.0"]["compute_partition"]["available"] == ["SPX"]


# -- processes -----------------------------------------------------------------------------------


def test_processes_from_the_recorded_json_and_text():
    records = gpu_amd_smi.parse_amd_smi(
        amd_output(STATIC_MI300A), process_json=amd_output(PROCESS_JSON)
    )
    assert records["0000:01:00.0"]["processes"] == [
        {"pid": 420157, "name": "TransferBench"},
        {"pid": 420315, "name": "rvs"},
    ]
    assert records["0001:01:00.0"]["processes"] == []
    records = gpu_amd_smi.parse_amd_smi(
        amd_output(STATIC_MI300A), process_json=amd_output(PROCESS_TEXT)
    )
    assert records["0000:01:00.0"]["processes"] == [{"pid": 1693982, "name": "TransferBench"}]


def test_no_process_message_and_unnamed_process():
    text = "GPU: 0\n    PROCESS_INFO:\n        No running processes detected\n"
    assert gpu_amd_smi.parse_devices(text) == [
        {"gpu": 0, "process_info": "No running processes detected"}
    ]
    records = gpu_amd_smi.parse_amd_smi(amd_output(STATIC_MI300A), process_json=text)
    assert records["0000:01:00.0"]["processes"] == []
    unnamed = amd_output(PROCESS_TEXT).replace("NAME: TransferBench", "NAME: N/A")
    records = gpu_amd_smi.parse_amd_smi(amd_output(STATIC_MI300A), process_json=unnamed)
    assert records["0000:01:00.0"]["processes"] == [{"pid": 1693982, "name": None}]


# -- logical GPUs of one PCI GPU -----------------------------------------------------------------


def test_logical_gpus_group_under_their_pci_gpu_by_partition_id():
    """The 64-GPU CPX listing with the BDFs amd-smi gives partitions (function = partition id)."""
    devices = gpu_amd_smi.parse_devices(amd_output(STATIC_CPX64))
    buses = ["05", "27", "47", "65", "85", "a7", "c7", "e5"]  # location_id >> 8 in the KFD capture
    for device in devices:
        pid = int(device["partition"]["partition_id"])
        device["bus"] = {"bdf": f"0000:{buses[device['gpu'] // 8]}:00.{pid}"}
    records = gpu_amd_smi.parse_amd_smi(json.dumps(devices))
    assert list(records) == [f"0000:{bus}:00.0" for bus in buses]
    for record in records.values():
        assert [lg["index"] for lg in record["logical_gpus"]] == list(range(8))
        assert record["compute_partition"]["current"] == "CPX"


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "output shows no 'GPU: <n>' block"),
        ("Traceback (most recent call last):", "output shows no 'GPU: <n>' block"),
        ("[{oops", "output is not JSON"),
        ('{"cpu_data": []}', "JSON object has no gpu_data list (keys: cpu_data)"),
        ("[1, 2]", "JSON is not a list of per-GPU objects"),
        ('[{"bus": {"bdf": "0000:01:00.0"}}]', "an entry has no GPU index (None)"),
        ('[{"gpu": true}]', "an entry has no GPU index (True)"),
        ("GPUX: 0\n", "line 1 'GPUX: 0' is no 'GPU: <n>' line"),
        ('[{"gpu": 0, "bus": {"bdf": "N/A"}}]', "GPU 0 has no PCI address (bus.bdf is 'N/A')"),
        ('[{"gpu": 0, "bus": {"bdf": "00:zz"}}]', "GPU 0: '00:zz' is not a PCI bus id"),
    ],
)
def test_bad_static_output_is_refused_naming_the_command(text, fragment):
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi(text)
    assert err.value.command == "amd-smi static --json"
    assert fragment in str(err.value)


def test_refusals_quote_at_most_80_characters():
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi("x" * 5000)
    assert "x" * 80 + "..." in str(err.value) and "x" * 81 not in str(err.value)
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi("[" + "x" * 5000)
    assert len(str(err.value)) < 200


def test_non_text_and_oversized_output_are_refused():
    with pytest.raises(CommandOutputError, match="output is bytes, not text"):
        gpu_amd_smi.parse_amd_smi(b"[]")
    with pytest.raises(CommandOutputError, match="printed more than 64 MiB"):
        gpu_amd_smi.parse_amd_smi("GPU: 0\n" + " " * (64 << 20))


def test_bad_partition_and_list_outputs_name_their_command():
    static = amd_output(STATIC_MI300A)
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi(static, partition_json="GPU: 0\n    MEMORY: NPS1\n")
    assert err.value.command == "amd-smi partition --json"
    assert "no partition table" in str(err.value)
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi(static, partition_json="[]")
    assert "not an object of partition tables" in str(err.value)
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi(static, list_json="{")
    assert err.value.command == "amd-smi list -e --json"
    with pytest.raises(CommandOutputError) as err:
        gpu_amd_smi.parse_amd_smi(static, process_json="nothing")
    assert err.value.command == "amd-smi process --json"


# -- argv and runner -----------------------------------------------------------------------------


def test_argv_runs_each_query_under_timeout():
    assert gpu_amd_smi.amd_smi_argv("/opt/rocm/bin/amd-smi", "/usr/bin/timeout", 30) == [
        "/usr/bin/timeout",
        "--kill-after=5",
        "30",
        "/opt/rocm/bin/amd-smi",
        "static",
        "--json",
    ]
    assert gpu_amd_smi.amd_smi_argv("amd-smi", None, 5, "list") == [
        "amd-smi",
        "list",
        "-e",
        "--json",
    ]
    assert gpu_amd_smi.amd_smi_argv(None, "/usr/bin/timeout", 5, "process") is None


@pytest.mark.parametrize("seconds", [0, -1, True, 2.5, "30"])
def test_argv_refuses_a_bad_time_limit(seconds):
    with pytest.raises(CommandOutputError, match="set it to a whole number of seconds, 1 or more"):
        gpu_amd_smi.amd_smi_argv("amd-smi", None, seconds)


def test_argv_refuses_an_unknown_query():
    with pytest.raises(CommandOutputError, match="no such query 'metric'; use one of static"):
        gpu_amd_smi.amd_smi_argv("amd-smi", None, 5, "metric")


def runner(answers: dict):
    calls = []

    def run(name):
        calls.append(name)
        return answers[name]

    run.calls = calls
    return run


def test_read_amd_smi_leaves_out_failing_optional_queries_with_a_warning():
    run = runner(
        {
            "static": (0, amd_output(STATIC_MI300A), ""),
            "partition": (2, "", "amd-smi: error: argument : invalid choice: 'partition'\n"),
            "list": (124, "", ""),
            "process": (0, amd_output(PROCESS_JSON), ""),
        }
    )
    records, fact = gpu_amd_smi.read_amd_smi(run, timeout_s=30)
    assert run.calls == ["static", "partition", "list", "process"]
    assert fact["used"] is True and fact["reason"] is None
    assert fact["warnings"] == [
        "amd-smi partition --json: exited with status 2: amd-smi: error: argument : invalid "
        "choice: 'partition'",
        "amd-smi list -e --json: timed out after 30 s",
    ]
    assert records["0000:01:00.0"]["processes"][0]["pid"] == 420157


def test_read_amd_smi_without_the_tool_or_with_a_failing_static():
    assert gpu_amd_smi.read_amd_smi(None) == (
        {},
        {"used": False, "reason": "amd-smi was not found in PATH", "warnings": []},
    )
    run = runner({"static": (1, "", "AMD SMI not initialized\n")})
    records, fact = gpu_amd_smi.read_amd_smi(run)
    assert records == {} and fact["used"] is False
    assert fact["reason"] == "amd-smi static --json: exited with status 1: AMD SMI not initialized"
    run = runner(dict.fromkeys(gpu_amd_smi.AMD_SMI_COMMANDS, (0, "garbage", "")))
    records, fact = gpu_amd_smi.read_amd_smi(run)
    assert records == {} and fact["reason"].startswith("amd-smi static --json: output shows no")


# -- enriching sysfs records -------------------------------------------------------------------


def test_enrich_records_adds_what_sysfs_lacks_and_keeps_what_it_read():
    smi = gpu_amd_smi.parse_amd_smi(
        amd_output(STATIC_MI300A),
        partition_json=amd_output(PARTITION_SPX),
        process_json=amd_output(PROCESS_JSON),
    )
    sysfs = {
        "0000:01:00.0": {
            "model": None,
            "kfd_node": 2,
            "gpu_id": 52000,
            "unique_id": "0x2a",
            "uuid": "GPU-000000000000002a",
            "drm_card": "card1",
            "render_minor": 128,
            "vram_total_mib": 65536,
            "compute_partition": {"current": "SPX", "available": ["SPX", "TPX", "CPX"]},
            "memory_partition": None,
            "compatible_memory_partitions": None,
            "compatible_source": None,
            "xcd_count": None,
            "logical_gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-000000000000002a",
                    "unique_id": "0x2a",
                    "kfd_node": 2,
                    "gpu_id": 52000,
                    "render_minor": 128,
                    "xcds": [],
                }
            ],
            "processes": None,
            "source": "sysfs",
        },
        "0000:c1:00.0": {"source": "sysfs"},
    }
    assert gpu_amd_smi.enrich_records(sysfs, smi) == ["0000:01:00.0"]
    record = sysfs["0000:01:00.0"]
    assert record["model"] == "MI300A" and record["vram_total_mib"] == 64289
    assert record["compute_partition"]["available"] == ["SPX", "TPX", "CPX"]  # sysfs kept
    assert record["memory_partition"] == {"current": "NPS1", "available": []}  # from amd-smi
    assert record["xcd_count"] == 6
    assert record["uuid"] == "GPU-000000000000002a" and record["kfd_node"] == 2
    assert [p["pid"] for p in record["processes"]] == [420157, 420315]
    assert record["source"] == "amd-smi"
    assert sysfs["0000:c1:00.0"] == {"source": "sysfs"}
