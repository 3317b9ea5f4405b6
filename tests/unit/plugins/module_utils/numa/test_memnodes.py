"""What each node's memory is: normal_memory, gpu_owner, memory_tier, memory_backing.

Real dumps: nvidiagpunumanodes (POWER9 + 6 V100, GPU memory as nodes 250-255, the NVIDIA
driver's numa_status files), fakeheteromemtiers (DRAM + DAX kmem nodes), 32em64t (DAX devices
whose target nodes are not online); the synthetic GH200; edited copies from field_cases.py.
"""

from __future__ import annotations

import os

import field_cases  # tests/unit/fixtures/field_cases.py
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.capture import plan_capture
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.memnodes import (
    parse_numa_status,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

FIELDS = ("normal_memory", "gpu_owner", "memory_tier", "memory_backing")
V100_OWNERS = {
    250: "0035:05:00.0",
    251: "0035:04:00.0",
    252: "0007:00:00.0",
    253: "0006:00:00.0",
    254: "0004:06:00.0",
    255: "0004:05:00.0",
}


def facts_of(root: str) -> dict:
    return read_numa_facts(Reader(f"{root}/sys", f"{root}/proc"))


def memory_warnings(facts: dict) -> list:
    """The warnings about files of the memory sources (driver numa_status, has_normal_memory)."""
    return [
        w
        for w in facts["warnings"]
        if "/proc/driver/nvidia/" in w["path"] or w["path"].endswith("/has_normal_memory")
    ]


def memory_of(facts: dict) -> dict:
    return {node["id"]: tuple(node[name] for name in FIELDS) for node in facts["nodes"]}


def test_v100_memory_nodes_name_their_gpu(fixture_root):
    facts = facts_of(fixture_root("nvidiagpunumanodes"))
    got = memory_of(facts)
    assert got[0] == got[8] == (True, None, None, None)
    for node, address in V100_OWNERS.items():
        # has_normal_memory is "0,8": the driver onlines GPU memory movable only.
        assert got[node] == (False, address, None, None)
    assert sorted(got) == [0, 8, *V100_OWNERS]
    assert not memory_warnings(facts)


def test_gh200_hbm_node_is_the_gpu_memory(fixture_root):
    got = memory_of(facts_of(fixture_root("synthetic-gh200")))
    assert got[0] == (True, None, None, None)
    assert got[1] == (False, "0009:01:00.0", None, None)
    assert {got[n] for n in range(2, 10)} == {(False, None, None, None)}


def test_dax_kmem_nodes_are_dax_backed_and_not_normal(fixture_root):
    got = memory_of(facts_of(fixture_root("fakeheteromemtiers")))
    assert got == {
        0: (True, None, None, None),
        1: (True, None, None, None),
        2: (False, None, None, "dax"),  # node with CPUs whose memory is HBM through dax3.0
        4: (False, None, None, "dax"),
        6: (False, None, None, "dax"),
        8: (False, None, None, "dax"),
        9: (False, None, None, "dax"),
    }


def test_memory_tiers_of_a_6_1_kernel(fixture_root):
    root = field_cases.memory_tiers_default(fixture_root("fakeheteromemtiers", writable=True))
    tiers = {node["id"]: node["memory_tier"] for node in facts_of(root)["nodes"]}
    assert tiers == {0: 4, 1: 4, 2: 22, 4: 22, 6: 22, 8: 22, 9: 22}


def test_dax_device_of_a_cxl_region_is_cxl_memory(fixture_root):
    root = field_cases.dax_under_cxl_region(fixture_root("fakeheteromemtiers", writable=True))
    backing = {node["id"]: node["memory_backing"] for node in facts_of(root)["nodes"]}
    assert backing == {0: None, 1: None, 2: "dax", 4: "dax", 6: "dax", 8: "cxl", 9: "dax"}


def test_dax_devices_of_nodes_not_online_back_no_node(fixture_root):
    # dax0.0 -> node 4, dax1.3/dax1.4 -> node 5: neither node is online in this dump.
    facts = facts_of(fixture_root("32em64t-2n8c+dax+nvme+mic+dimms"))
    assert memory_of(facts) == {0: (True, None, None, None), 1: (True, None, None, None)}


def test_missing_sources_are_unknown_not_errors(fixture_root):
    root = fixture_root("nvidiagpunumanodes", writable=True)
    os.remove(f"{root}/sys/devices/system/node/has_normal_memory")
    os.remove(f"{root}/proc/driver/nvidia/gpus/0004:05:00.0/numa_status")
    facts = facts_of(root)
    got = memory_of(facts)
    assert {value[0] for value in got.values()} == {None}
    assert got[255][1] is None and got[254][1] == "0004:06:00.0"
    assert not memory_warnings(facts)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "Node:      255\nStatus:    online\nAddress:   40000000000\nSize:      3f0000000\n",
            {"node": 255, "status": "online"},
        ),
        ("Node:      1\nStatus:    offline\n", {"node": 1, "status": "offline"}),  # not open yet
        ("Node:      -1\nStatus:    disabled\n", {"node": -1, "status": "disabled"}),
    ],
)
def test_numa_status_as_the_driver_writes_it(text, want):
    assert parse_numa_status(text) == want


def test_bad_numa_status_is_a_warning_and_names_no_owner(fixture_root):
    root = fixture_root("nvidiagpunumanodes", writable=True)
    path = f"{root}/proc/driver/nvidia/gpus/0006:00:00.0/numa_status"
    with open(path, "w") as handle:
        handle.write("Status: online\n")
    disabled = f"{root}/proc/driver/nvidia/gpus/0007:00:00.0/numa_status"
    with open(disabled, "w") as handle:
        handle.write("Node:      -1\nStatus:    disabled\n")
    facts = facts_of(root)
    got = memory_of(facts)
    assert got[253][1] is None and got[252][1] is None and got[251][1] == "0035:04:00.0"
    assert {"path": path, "reason": "malformed: no 'Node: <id>' line"} in facts["warnings"]


def test_two_gpus_naming_one_node_keep_the_lowest_address(fixture_root):
    root = fixture_root("nvidiagpunumanodes", writable=True)
    path = f"{root}/proc/driver/nvidia/gpus/0035:05:00.0/numa_status"
    with open(path, "w") as handle:
        handle.write("Node:      255\nStatus:    online\n")
    facts = facts_of(root)
    got = memory_of(facts)
    assert got[255][1] == "0004:05:00.0" and got[250][1] is None
    assert {
        "path": path,
        "reason": "names node 255, already GPU memory of 0004:05:00.0: not used",
    } in facts["warnings"]


def test_capture_records_every_memory_source(fixture_root):
    root = field_cases.dax_under_cxl_region(fixture_root("fakeheteromemtiers", writable=True))
    field_cases.memory_tiers_default(root)
    reader = Reader(f"{root}/sys", f"{root}/proc")
    read_numa_facts(reader)
    names = {entry[1] for entry in plan_capture(reader)}
    for wanted in (
        "sys/devices/system/node/has_normal_memory",
        "sys/devices/virtual/memory_tiering/memory_tier22/nodelist",
        "sys/bus/dax/devices/dax7.0",
        "sys/bus/cxl/devices/region0",
        "sys/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region7/dax7.0/target_node",
    ):
        assert wanted in names
    gpu_root = fixture_root("nvidiagpunumanodes")
    gpu_reader = Reader(f"{gpu_root}/sys", f"{gpu_root}/proc")
    read_numa_facts(gpu_reader)
    names = {entry[1] for entry in plan_capture(gpu_reader)}
    assert "proc/driver/nvidia/gpus/0035:05:00.0/numa_status" in names


def mutations(original: bytes):
    """As test_fuzz_sysfs: empty, NULs, padding, truncated, binary, text, near-miss values."""
    return st.one_of(
        st.just(b""),
        st.just(b"\x00" * 8),
        st.just(original + b"\n\x00"),
        st.integers(min_value=0, max_value=max(len(original) - 1, 0)).map(lambda n: original[:n]),
        st.binary(max_size=64),
        st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.sampled_from([b"-1\n", b"Node: x\n", b"Node:  -7\n", b"0-\n", b"4294967296\n"]),
    )


MEMORY_SOURCES = ("/proc/driver/nvidia/", "/has_normal_memory", "/memory_tiering/", "/target_node")


@pytest.mark.parametrize("machine", ["nvidiagpunumanodes", "fakeheteromemtiers"])
def test_mutated_memory_sources_become_warnings_never_tracebacks(machine, fixture_root):
    """The files this module reads, mutated as test_fuzz_sysfs mutates any file: facts, never a
    traceback, and a value only where the file still says one."""
    root = fixture_root(machine, writable=True)
    if machine == "fakeheteromemtiers":
        field_cases.memory_tiers_default(field_cases.dax_under_cxl_region(root))
    reader = Reader(f"{root}/sys", f"{root}/proc")
    read_numa_facts(reader)
    files = sorted(
        path
        for path in reader.accessed
        if any(part in path for part in MEMORY_SOURCES) and os.path.isfile(path)
    )
    assert len(files) >= 6

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        chosen = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=3, unique=True))
        saved = {}
        try:
            for path in chosen:
                with open(path, "rb") as handle:
                    saved[path] = handle.read()
                with open(path, "wb") as handle:
                    handle.write(data.draw(mutations(saved[path])))
            facts = facts_of(root)
            for node in facts["nodes"]:
                assert node["normal_memory"] in (None, True, False)
                assert node["gpu_owner"] is None or isinstance(node["gpu_owner"], str)
                tier = node["memory_tier"]
                assert tier is None or (isinstance(tier, int) and not isinstance(tier, bool))
                assert node["memory_backing"] in (None, "dax", "cxl")
        finally:
            for path, content in saved.items():
                with open(path, "wb") as handle:
                    handle.write(content)

    check()


def test_onlined_dax_kmem_node_is_dax_backed_and_not_normal(fixture_root):
    root = field_cases.dax_kmem_node_online(
        fixture_root("32em64t-2n8c+dax+nvme+mic+dimms", writable=True)
    )
    facts = facts_of(root)
    assert memory_of(facts) == {
        0: (True, None, None, None),
        1: (True, None, None, None),
        5: (False, None, None, "dax"),
    }
    assert facts["nodes"][2]["kind"] == "memory-only"


def test_numa_status_naming_a_cpu_node_is_not_trusted(fixture_root):
    root = fixture_root("nvidiagpunumanodes", writable=True)
    path = field_cases.numa_status_names_cpu_node(root, "0035:05:00.0", 0)
    facts = facts_of(root)
    got = memory_of(facts)
    assert got[0] == (True, None, None, None)  # node 0 keeps its CPUs' memory for placements
    assert got[250] == (False, None, None, None)  # the GPU named another node, not this one
    assert got[251] == (False, V100_OWNERS[251], None, None)
    (warning,) = memory_warnings(facts)
    assert warning["path"].endswith("/0035:05:00.0/numa_status") and path.endswith(
        "0035:05:00.0/numa_status"
    )
    assert "names node 0, which has CPUs" in warning["reason"] and "not used" in warning["reason"]
