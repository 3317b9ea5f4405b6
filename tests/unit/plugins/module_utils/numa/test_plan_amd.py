"""The planner on AMD Instinct MI300X hosts: whole GPUs, partition (XCP) placements,
ROCR_VISIBLE_DEVICES by UUID, declared compute/memory partitions, refusals before the gate,
stable plans (day 2) and the plan key amd_partitions. Facts written by hand in the shape of
the facts contract (tests/unit/amd_facts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from amd_facts import HIVE, logical_uuid, mi300x, mi300x_hive_host, mi300x_host
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_hosts import synthetic, synthetic_gpu

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
)

POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}
HOST = "mi300x-01"
NODE1 = {"0000:83:00.0", "0000:a3:00.0", "0000:c3:00.0", "0000:e3:00.0"}


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "user": "app", "cpus": 2, "memory": "8G"}
    entry.update(changes)
    return entry


def small(count: int, **changes) -> list:
    return [p(f"small-{i}", partition="cpx", **changes) for i in range(count)]


def plan(placements, partitions=None, recorded=None, topology=None):
    numa, gpus = mi300x_host()
    return plan_host(
        HOST,
        numa,
        topology or gpus,
        list(placements),
        [],
        POLICY,
        mig_gpus=partitions,
        recorded=recorded,
    )


def by_name(result: dict) -> dict:
    return {entry["name"]: entry for entry in result["placements"]}


def amd_gpu(result: dict, address: str) -> dict:
    return next(g for g in result["amd_partitions"] if g["address"] == address)


def recorded(result: dict) -> dict:
    state = {"state": "present", "plan": json.loads(json.dumps(result))}
    return parse_recorded(HOST, state, "/var/lib/numafleet/plan.json")


# -- whole GPUs and partitions -------------------------------------------------------------------


def test_70b_on_two_whole_gpus_gets_the_two_spx_gpus_of_node0():
    result = plan([p("llm70b", cpus=16, gpus=2, memory="128G")])
    entry = by_name(result)["llm70b"]
    assert [g["address"] for g in entry["gpus"]] == ["0000:03:00.0", "0000:23:00.0"]
    assert entry["node"] == 0
    assert [g["partition"] for g in entry["gpus"]] == [None, None]
    assert entry["environment"] == {
        "ROCR_VISIBLE_DEVICES": f"{logical_uuid(0x03, 0)},{logical_uuid(0x23, 0)}"
    }
    assert not any(key.startswith("CUDA_") for key in entry["environment"])
    assert result["warnings"] == []


def test_a_cpx_gpu_is_never_given_whole():
    # Two SPX GPUs only: a third whole GPU does not exist though 6 CPX GPUs are free.
    with pytest.raises(PlanError, match="needs 3 GPUs"):
        plan([p("big", gpus=3)])


def test_sixteen_cpx_placements_fill_whole_cpx_gpus_pinned_to_their_node():
    placements = small(8, node=1) + small(16)[8:]
    result = plan(placements)
    entries = by_name(result)
    uuids = []
    per_gpu: dict = {}
    for entry in entries.values():
        (gpu,) = entry["gpus"]
        part = gpu["partition"]
        assert part["mode"] == "CPX" and part["existing"] is True
        assert entry["node"] == gpu["node"]
        assert entry["environment"] == {"ROCR_VISIBLE_DEVICES": part["uuid"]}
        assert part["xcds"] == [part["index"]]
        uuids.append(part["uuid"])
        per_gpu.setdefault(gpu["address"], []).append(part["index"])
    assert len(set(uuids)) == 16
    # Whole GPUs filled, lowest index first: no GPU half used.
    assert all(sorted(indexes) == list(range(8)) for indexes in per_gpu.values())
    assert len(per_gpu) == 2
    assert {g for g in per_gpu if g in NODE1} and all(
        entries[f"small-{i}"]["gpus"][0]["address"] in NODE1 for i in range(8)
    )
    gpu = amd_gpu(result, entries["small-0"]["gpus"][0]["address"])
    assert gpu["owned_units"] == sorted(f"numafleet-small-{i}.service" for i in range(8))
    assert [lg["placement"] for lg in gpu["logical_gpus"]] == [f"small-{i}" for i in range(8)]
    summary = plan_summary(result)
    assert "gpus 83:00.0/cpx3" in summary


def test_amd_partitions_lists_every_amd_gpu_in_address_order():
    result = plan([])
    gpus = result["amd_partitions"]
    assert [g["address"] for g in gpus] == sorted(g["address"] for g in gpus)
    assert len(gpus) == 8
    first = gpus[0]
    assert first["compute_partition"] == {"current": "SPX", "planned": "SPX"}
    assert first["memory_partition"] == {"current": "NPS1", "planned": "NPS1"}
    assert (first["declared"], first["change"], first["reset_required"]) == (False, False, False)
    assert first["logical_gpus"] == [{"index": 0, "uuid": logical_uuid(0x03, 0), "placement": None}]
    assert len(gpus[2]["logical_gpus"]) == 8


def test_listed_cpx_gpu_gives_its_lowest_free_logical_gpu():
    result = plan([p("a", partition="cpx", gpus=["0000:a3:00.0"]), p("b", partition="CPX")])
    entries = by_name(result)
    assert entries["a"]["gpus"][0]["partition"]["index"] == 0
    assert entries["a"]["node"] == 1
    assert entries["a"]["gpus"][0]["address"] == "0000:a3:00.0"


def test_host_without_amd_gpus_has_no_amd_partitions_key():
    numa = synthetic()
    result = plan_host("h", numa, {"gpus": [synthetic_gpu("0000:17:00.0", 0)]}, [], [], POLICY)
    assert "amd_partitions" not in result


def test_nvidia_entries_get_no_partition_key_beside_amd_ones():
    numa, topology = mi300x_host()
    topology["gpus"].append(synthetic_gpu("0000:f3:00.0", 1))
    result = plan_host(HOST, numa, topology, [p("cuda", gpus=["0000:f3:00.0"])], [], POLICY)
    (gpu,) = by_name(result)["cuda"]["gpus"]
    assert "partition" not in gpu
    assert by_name(result)["cuda"]["environment"]["CUDA_VISIBLE_DEVICES"] == gpu["uuid"]


def test_gpus_count_takes_gpus_of_one_vendor_only():
    numa = synthetic(cpus_per_node=(64, 64), mem_gb=(1024, 1024))
    mixed = {"gpus": [mi300x(0x03, 0), synthetic_gpu("0000:13:00.0", 0)]}
    # one AMD and one NVIDIA GPU on node 0: no program drives both as 2 GPUs
    vendor = r"needs 2 GPUs on NUMA node 0 of one vendor \(the free GPUs are amd and nvidia\)"
    with pytest.raises(PlanError, match=vendor):
        plan_host("h", numa, mixed, [p("tp2", gpus=2, node=0)], [], POLICY)
    # spanning nodes takes the two NVIDIA GPUs (one per node), never the AMD one
    mixed["gpus"].append(synthetic_gpu("0000:93:00.0", 1))
    result = plan_host("h", numa, mixed, [p("tp2", gpus=2, allow_span=True)], [], POLICY)
    spanned = by_name(result)["tp2"]
    assert [g["address"] for g in spanned["gpus"]] == ["0000:13:00.0", "0000:93:00.0"]
    assert spanned["spans"] is True
    mixed["gpus"].pop()
    mixed["gpus"].append(mi300x(0x23, 0))
    result = plan_host("h", numa, mixed, [p("tp2", gpus=2, node=0)], [], POLICY)
    entry = by_name(result)["tp2"]
    assert [g["address"] for g in entry["gpus"]] == ["0000:03:00.0", "0000:23:00.0"]
    assert "CUDA_VISIBLE_DEVICES" not in entry["environment"]


# -- declared partitions -------------------------------------------------------------------------


def test_declared_cpx_to_spx_on_an_unused_gpu_is_a_change_without_reset_at_nps1():
    numa, topology = mi300x_host()
    topology["gpus"][7]["amd"]["memory_partition"]["current"] = "NPS1"
    declared = [{"gpu": "0000:e3:00.0", "compute_partition": "SPX"}]
    result = plan([], declared, topology=topology)
    gpu = amd_gpu(result, "0000:e3:00.0")
    assert gpu["compute_partition"] == {"current": "CPX", "planned": "SPX"}
    assert (gpu["declared"], gpu["change"], gpu["reset_required"]) == (True, True, False)
    # Declared SPX but still CPX now: not given whole in this run.
    with pytest.raises(PlanError, match="needs 1 GPU"):
        plan([p("whole", gpus=1, node=1)], declared, topology=topology)


def test_declared_cpx_to_spx_with_nps4_to_nps1_needs_a_reset():
    declared = [{"gpu": "0000:e3:00.0", "compute_partition": "SPX", "memory_partition": "NPS1"}]
    result = plan([], declared)
    gpu = amd_gpu(result, "0000:e3:00.0")
    assert gpu["memory_partition"] == {"current": "NPS4", "planned": "NPS1"}
    assert (gpu["change"], gpu["reset_required"]) == (True, True)
    assert gpu["logical_gpus"] == [{"index": 0, "uuid": None, "placement": None}]


def test_partition_on_a_gpu_declared_cpx_waits_for_its_logical_gpu():
    declared = [{"gpu": "0000:03:00.0", "compute_partition": "CPX"}]
    result = plan([p("s", partition="cpx", gpus=["0000:03:00.0"])], declared)
    entry = by_name(result)["s"]
    part = entry["gpus"][0]["partition"]
    assert part == {
        "mode": "CPX",
        "index": 0,
        "uuid": None,
        "render_minor": None,
        "xcds": [0],
        "existing": False,
    }
    assert entry["environment"] == {"ROCR_VISIBLE_DEVICES": ""}
    assert entry["waits_for"]["reason"] == "created when the compute partition changes"
    assert "waits for CPX logical GPU 0 of GPU 0000:03:00.0" in plan_summary(result)
    gpu = amd_gpu(result, "0000:03:00.0")
    assert gpu["owned_units"] == ["numafleet-s.service"]
    assert gpu["logical_gpus"][0] == {"index": 0, "uuid": None, "placement": "s"}


# -- one XGMI hive, partitions sharing their GPU's UUID (as a real 8x MI300X shows them) ----------


def test_partitions_sharing_a_uuid_are_selected_by_render_node():
    numa, topology = mi300x_hive_host()
    result = plan(
        [p("llm70b", cpus=16, gpus=2, memory="128G"), *small(2, node=1)], topology=topology
    )
    entries = by_name(result)
    # whole SPX GPUs: their UUIDs name one logical GPU each
    assert entries["llm70b"]["environment"] == {
        "ROCR_VISIBLE_DEVICES": f"{logical_uuid(0x03, 0)},{logical_uuid(0x23, 0)}"
    }
    assert "device_allow" not in entries["llm70b"]
    # CPX logical GPUs of 83:00.0 share its UUID: ROCr would select none of them by it
    for index in (0, 1):
        entry = entries[f"small-{index}"]
        minor = entry["gpus"][0]["partition"]["render_minor"]
        assert minor == 128 + 8 * (0x83 >> 5) + index
        assert entry["device_allow"] == ["/dev/kfd", f"/dev/dri/renderD{minor}"]
        assert "ROCR_VISIBLE_DEVICES" not in entry["environment"]
        assert entry["warnings"] == []
    text = units.render_files(result)["/etc/systemd/system/numafleet-small-0.service"]
    assert "DevicePolicy=closed\n" in text
    assert "DeviceAllow=/dev/kfd rw\nDeviceAllow=/dev/dri/renderD160 rw\n" in text
    assert "ROCR_VISIBLE_DEVICES" not in text


def test_a_drop_in_selected_by_render_node_resets_the_vendor_device_list():
    numa, topology = mi300x_hive_host()
    entry = p("s", partition="cpx", node=0, unit="vllm.service")
    del entry["exec"], entry["user"]
    result = plan([entry], topology=topology)
    files = units.render_files(result)
    (text,) = [
        text
        for path, text in files.items()
        if path.startswith("/etc/systemd/system/vllm.service.d/")
    ]
    assert "DevicePolicy=closed\nDeviceAllow=\nDeviceAllow=/dev/kfd rw\n" in text


def test_a_memory_partition_change_of_one_gpu_of_a_hive_is_refused():
    numa, topology = mi300x_hive_host()
    message = _refused(
        r"numafleet_gpu_partitions\[0\]\.memory_partition: NPS4 on GPU 0000:e3:00.0 changes "
        f"the memory partition of XGMI hive {HIVE}",
        partitions=[{"gpu": "0000:e3:00.0", "memory_partition": "NPS4"}],
        topology=topology,
    )
    assert "0000:03:00.0 NPS1" in message and "0000:c3:00.0 NPS1" in message
    assert "declare memory_partition: NPS4 for every GPU of the hive" in message


def test_a_memory_partition_change_of_the_whole_hive_is_planned_with_a_reset():
    numa, topology = mi300x_hive_host()
    declared = [
        {"gpu": g["address"], "compute_partition": "CPX", "memory_partition": "NPS4"}
        for g in topology["gpus"]
    ]
    result = plan([], declared, topology=topology)
    assert {g["memory_partition"]["planned"] for g in result["amd_partitions"]} == {"NPS4"}
    assert all(g["reset_required"] for g in result["amd_partitions"])


def test_a_compute_partition_change_in_a_hive_changes_that_gpu_only():
    numa, topology = mi300x_hive_host()
    result = plan([], [{"gpu": "0000:e3:00.0", "compute_partition": "SPX"}], topology=topology)
    changed = [g["address"] for g in result["amd_partitions"] if g["change"]]
    assert changed == ["0000:e3:00.0"]
    assert not amd_gpu(result, "0000:e3:00.0")["reset_required"]


def test_gpus_in_no_hive_change_their_memory_partition_alone():
    # mi300x_host's GPUs carry no hive_id: e3 alone may go to NPS1 (and SPX)
    declared = [{"gpu": "0000:e3:00.0", "compute_partition": "SPX", "memory_partition": "NPS1"}]
    assert amd_gpu(plan([], declared), "0000:e3:00.0")["reset_required"]


# -- refusals ------------------------------------------------------------------------------------


def _refused(match: str, placements=(), partitions=None, topology=None, error=PlacementError):
    with pytest.raises(error, match=match) as info:
        plan(placements, partitions, topology=topology)
    assert str(info.value).startswith(f"host {HOST}")
    return str(info.value)


def test_compute_mode_not_available_is_refused():
    numa, topology = mi300x_host()
    topology["gpus"][0]["amd"]["compute_partition"]["available"] = ["SPX", "CPX"]
    message = _refused(
        r"numafleet_gpu_partitions\[0\]\.compute_partition: GPU 0000:03:00.0 does not offer QPX",
        partitions=[{"gpu": "0000:03:00.0", "compute_partition": "QPX"}],
        topology=topology,
    )
    assert "available: SPX, CPX" in message


def test_memory_mode_not_available_is_refused():
    _refused(
        r"memory_partition: GPU 0000:43:00.0 does not offer NPS8",
        partitions=[{"gpu": "0000:43:00.0", "memory_partition": "NPS8"}],
    )


def test_memory_mode_incompatible_with_compute_mode_is_refused():
    message = _refused(
        r"in compute partition SPX allows memory partition NPS1, not NPS4",
        partitions=[{"gpu": "0000:43:00.0", "compute_partition": "SPX"}],
    )
    assert "numafleet_gpu_partitions[0]" in message and "memory_partition: NPS1" in message


def test_nvidia_keys_on_an_amd_gpu_are_refused():
    _refused(
        r"mode/layout \(NVIDIA MIG keys\) on GPU 0000:43:00.0, which is an AMD GPU",
        partitions=[{"gpu": "0000:43:00.0", "mode": "enabled"}],
    )


def test_amd_keys_on_an_nvidia_gpu_are_refused():
    numa = synthetic()
    with pytest.raises(PlacementError, match="AMD keys.*0000:17:00.0.*not an AMD GPU"):
        plan_host(
            "h",
            numa,
            {"gpus": [synthetic_gpu("0000:17:00.0", 0)]},
            [],
            [],
            POLICY,
            mig_gpus=[{"gpu": "0000:17:00.0", "compute_partition": "CPX"}],
        )


def test_mps_on_a_listed_amd_gpu_is_refused():
    _refused(
        "MPS is NVIDIA only; use partition: cpx to share an AMD GPU",
        [p("m", gpus=["0000:03:00.0"], mps={"active_thread_percentage": 50})],
    )


def test_mps_where_every_gpu_is_amd_is_refused():
    _refused(
        r"numafleet_placements\[0\] \(m\)\.mps: every GPU of this host is AMD; MPS is NVIDIA "
        "only; use partition: cpx to share an AMD GPU",
        [p("m", gpus=1, mps={"active_thread_percentage": 50})],
    )


def test_mps_gpus_count_chooses_only_nvidia_gpus():
    numa, topology = mi300x_host()
    topology["gpus"].append(synthetic_gpu("0000:f3:00.0", 1))
    placements = [p("m", gpus=1, mps={"active_thread_percentage": 50})]
    result = plan_host(HOST, numa, topology, placements, [], POLICY)
    assert [g["address"] for g in by_name(result)["m"]["gpus"]] == ["0000:f3:00.0"]


def test_partition_with_no_gpu_in_that_mode_is_refused():
    message = _refused(
        r"numafleet_placements\[0\] \(q\)\.partition: no AMD GPU of this host is in compute "
        "partition QPX",
        [p("q", partition="qpx")],
    )
    assert "compute_partition: QPX" in message


def test_more_partition_placements_than_logical_gpus_are_refused():
    _refused(
        "49 placements ask for a CPX logical GPU .* have 48",
        small(49),
    )


def test_partition_on_a_listed_gpu_of_another_mode_is_refused():
    _refused(
        r"\.partition: GPU 0000:03:00.0 is in compute partition SPX \(current mode\), not CPX",
        [p("s", partition="cpx", gpus=["0000:03:00.0"])],
    )


def test_whole_gpu_listed_on_a_cpx_gpu_is_refused():
    _refused(
        r"\.gpus: 0000:43:00.0 is in compute partition CPX .* only serves partition placements",
        [p("w", gpus=["0000:43:00.0"])],
    )


def test_full_cpx_gpus_of_a_pinned_node_name_the_free_logical_gpus():
    _refused(
        r"needs a free CPX logical GPU .* on NUMA node 1",
        small(33, node=1),
        error=PlanError,
    )


# -- day 2 ---------------------------------------------------------------------------------------


def test_removing_one_cpx_placement_keeps_every_other_gpu_and_index():
    placements = small(16)
    first = plan(placements)
    where = {
        e["name"]: (e["gpus"][0]["address"], e["gpus"][0]["partition"]["index"])
        for e in first["placements"]
    }
    rest = [entry for entry in placements if entry["name"] != "small-5"]
    second = plan(rest, recorded=recorded(first))
    assert all(value == "kept" for value in second["stability"].values())
    for entry in second["placements"]:
        gpu = entry["gpus"][0]
        assert (gpu["address"], gpu["partition"]["index"]) == where[entry["name"]]
    # A new placement takes the freed logical GPU.
    third = plan(rest + [p("new", partition="cpx")], recorded=recorded(second))
    new = by_name(third)["new"]["gpus"][0]
    assert (new["address"], new["partition"]["index"]) == where["small-5"]


def test_reordering_cpx_placements_keeps_their_logical_gpus():
    placements = small(10)
    first = plan(placements)
    second = plan(list(reversed(placements)), recorded=recorded(first))
    assert set(second["stability"].values()) == {"kept"}
    before, after = by_name(first), by_name(second)
    assert all(before[name]["gpus"] == after[name]["gpus"] for name in before)


# -- property ------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from([None, 0, 1]), min_size=0, max_size=40),
    st.integers(min_value=0, max_value=39),
)
def test_partition_placements_get_distinct_logical_gpus_and_removal_moves_none(nodes, drop):
    placements = [
        p(f"s{i}", partition="cpx", cpus=1, memory="1G", **({} if n is None else {"node": n}))
        for i, n in enumerate(nodes)
    ]
    try:
        first = plan(placements)
    except (PlanError, PlacementError):
        return  # a node's 4 CPX GPUs (node 1) or 2 (node 0) are full: refused, fine
    taken = [
        (e["gpus"][0]["address"], e["gpus"][0]["partition"]["index"]) for e in first["placements"]
    ]
    assert len(set(taken)) == len(taken)
    for entry in first["placements"]:
        assert entry["node"] == entry["gpus"][0]["node"]
        assert entry["environment"]["ROCR_VISIBLE_DEVICES"] == entry["gpus"][0]["partition"]["uuid"]
    if not placements:
        return
    gone = placements[drop % len(placements)]["name"]
    rest = [entry for entry in placements if entry["name"] != gone]
    second = plan(rest, recorded=recorded(first))
    before = {e["name"]: e["gpus"] for e in first["placements"]}
    for entry in second["placements"]:
        assert entry["gpus"] == before[entry["name"]]


def test_declared_change_under_a_kept_placement_of_another_mode_is_refused():
    first = plan([p("w", gpus=1, node=0), *small(2, node=1)])
    whole = by_name(first)["w"]["gpus"][0]["address"]
    cpx = by_name(first)["small-0"]["gpus"][0]["address"]
    with pytest.raises(PlacementError, match=rf"compute_partition: CPX on GPU {whole}") as info:
        plan(
            [p("w", gpus=1, node=0), *small(2, node=1)],
            [{"gpu": whole, "compute_partition": "CPX"}],
            recorded=recorded(first),
        )
    assert "takes away the whole GPU that numafleet_placements[0] (w) runs on" in str(info.value)
    with pytest.raises(PlacementError, match="takes away CPX logical GPU 0 that"):
        plan(
            [p("w", gpus=1, node=0), *small(2, node=1)],
            [{"gpu": cpx, "compute_partition": "SPX", "memory_partition": "NPS1"}],
            recorded=recorded(first),
        )
    # Without the recorded plan (or once the placement moved) the change is planned.
    assert amd_gpu(plan([], [{"gpu": whole, "compute_partition": "CPX"}]), whole)["change"]


def test_waiting_line_names_the_logical_gpu():
    declared = [{"gpu": "0000:03:00.0", "compute_partition": "CPX"}]
    result = plan([p("s", partition="cpx", gpus=["0000:03:00.0"])], declared)
    line = units.waiting_line("numafleet-s.service", by_name(result)["s"]["waits_for"])
    assert "waits for CPX logical GPU 0 of GPU 0000:03:00.0" in line
    assert "None" not in line


def test_demo_host_vars_of_mi300x_01_plan_on_the_hand_written_facts():
    demo = Path(__file__).resolve().parents[5] / "inventories/demo/host_vars/mi300x-01.yml"
    host_vars = yaml.safe_load(demo.read_text(encoding="utf-8"))
    numa, topology = mi300x_hive_host()
    numa = synthetic(cpus_per_node=(96, 96), mem_gb=(1024, 1024))
    result = plan_host(
        HOST,
        numa,
        topology,
        host_vars["numafleet_placements"],
        [],
        POLICY,
        mig_gpus=host_vars["numafleet_gpu_partitions"],
    )
    entries = by_name(result)
    assert [g["address"] for g in entries["llm-70b"]["gpus"]] == ["0000:03:00.0", "0000:23:00.0"]
    for number in range(16):
        entry = entries[f"small-{number:02d}"]
        gpu = entry["gpus"][0]
        assert gpu["address"] == ("0000:43:00.0" if number < 8 else "0000:83:00.0")
        assert gpu["partition"]["index"] == number % 8
        assert entry["node"] == gpu["node"] == (0 if number < 8 else 1)
        assert entry["device_allow"][1] == f"/dev/dri/renderD{gpu['partition']['render_minor']}"
    changes = {g["address"]: g["reset_required"] for g in result["amd_partitions"] if g["change"]}
    assert changes == {"0000:e3:00.0": False}
    assert result["warnings"] == []
