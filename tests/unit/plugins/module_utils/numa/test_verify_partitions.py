"""verify.partition_checks: the plan's AMD partitions and ROCR_VISIBLE_DEVICES against the GPU
facts, with plans and facts shaped as the issue 24 contract fixes them."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import verify
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import VerifyError

HOST = "mi300x-01"


def _gpu(address: str, node: int, compute: str, memory: str, count: int, base: int) -> dict:
    uuid = f"GPU-{base:016x}"
    logical = [
        {"index": i, "uuid": f"GPU-{base + i:016x}", "kfd_node": 2 + i, "xcds": [i]}
        for i in range(count)
    ]
    return {
        "address": address,
        "uuid": uuid,
        "node": node,
        "amd": {
            "uuid": uuid,
            "compute_partition": {"current": compute, "available": ["SPX", "DPX", "QPX", "CPX"]},
            "memory_partition": {"current": memory, "available": ["NPS1", "NPS4"]},
            "logical_gpus": logical,
        },
    }


FACTS = {
    "gpus": [
        _gpu("0000:03:00.0", 0, "SPX", "NPS1", 1, 0x1000),
        _gpu("0000:43:00.0", 0, "CPX", "NPS4", 8, 0x4300),
        _gpu("0000:83:00.0", 1, "CPX", "NPS4", 8, 0x8300),
        # An NVIDIA GPU has amd: None and is left alone.
        {"address": "0000:17:00.0", "uuid": "GPU-nv", "node": 0, "amd": None},
    ]
}


def _entry(address, compute, memory, planned_compute=None, planned_memory=None, reset=False):
    return {
        "address": address,
        "compute_partition": {"current": compute, "planned": planned_compute or compute},
        "memory_partition": {"current": memory, "planned": planned_memory or memory},
        "declared": True,
        "change": bool(planned_compute or planned_memory),
        "reset_required": reset,
        "logical_gpus": [],
        "owned_units": [],
    }


def _placement(name, node, rocr, nodes=None):
    return {
        "name": name,
        "node": node,
        "nodes": nodes or [node],
        "mems": nodes or [node],
        "environment": {"ROCR_VISIBLE_DEVICES": rocr} if rocr is not None else {},
    }


PLAN = {
    "amd_partitions": [
        _entry("0000:03:00.0", "SPX", "NPS1"),
        _entry("0000:43:00.0", "CPX", "NPS4"),
        _entry("0000:83:00.0", "CPX", "NPS4"),
    ],
    "placements": [
        _placement("llm-70b", 0, "GPU-0000000000001000"),
        _placement("small-0", 0, "GPU-0000000000004303"),
        _placement("small-8", 1, "GPU-0000000000008300"),
        _placement("cpu-only", 1, None),
    ],
}


def _by_subject(checks) -> dict:
    assert all(check.check == "gpu_partitions" and check.host == HOST for check in checks)
    return {check.subject: check for check in checks}


def test_a_host_as_planned_passes_each_gpu_and_placement():
    checks = _by_subject(verify.partition_checks(HOST, PLAN, FACTS))
    assert sorted(checks) == [
        "GPU 0000:03:00.0", "GPU 0000:43:00.0", "GPU 0000:83:00.0",
        "llm-70b", "small-0", "small-8",
    ]  # fmt: skip
    assert {check.status for check in checks.values()} == {"pass"}
    assert checks["GPU 0000:43:00.0"].measured == "CPX/NPS4"
    assert checks["small-8"].measured == {"GPU-0000000000008300": 1}


def test_a_plan_without_amd_partitions_gives_no_check():
    assert verify.partition_checks(HOST, {"placements": []}, FACTS) == []


def test_a_compute_mode_other_than_planned_fails_with_the_fix():
    facts = copy.deepcopy(FACTS)
    facts["gpus"][1]["amd"]["compute_partition"]["current"] = "SPX"
    check = _by_subject(verify.partition_checks(HOST, PLAN, facts))["GPU 0000:43:00.0"]
    assert (check.status, check.measured, check.target) == ("fail", "SPX/NPS4", "CPX/NPS4")
    assert "compute partition SPX (plan CPX)" in check.message
    assert "run site.yml" in check.message


def test_a_memory_change_waiting_for_the_reset_warns_pending_reset():
    plan = copy.deepcopy(PLAN)
    plan["amd_partitions"][2] = _entry(
        "0000:83:00.0", "CPX", "NPS4", planned_compute="SPX", planned_memory="NPS1", reset=True
    )
    facts = copy.deepcopy(FACTS)
    facts["gpus"][2]["amd"]["compute_partition"]["current"] = "SPX"  # compute applied, NPS not
    check = _by_subject(verify.partition_checks(HOST, plan, facts))["GPU 0000:83:00.0"]
    assert (check.status, check.detail) == ("warn", "pending reset")
    assert "numafleet_amd_reset_ok" in check.message


def test_a_gpu_missing_from_the_facts_fails():
    facts = {"gpus": FACTS["gpus"][:1]}
    checks = _by_subject(verify.partition_checks(HOST, PLAN, facts))
    assert checks["GPU 0000:43:00.0"].status == "fail"
    assert checks["small-0"].status == "fail"
    assert "GPU-0000000000004303 not on the host" in checks["small-0"].message


def test_a_visible_device_on_another_node_fails():
    plan = copy.deepcopy(PLAN)
    plan["placements"][1] = _placement("small-0", 0, "GPU-0000000000008301")
    check = _by_subject(verify.partition_checks(HOST, plan, FACTS))["small-0"]
    assert check.status == "fail"
    assert "GPU 0000:83:00.0, node 1" in check.message
    assert "not on the placement's nodes 0" in check.message


def test_two_whole_gpus_by_uuid_pass():
    plan = copy.deepcopy(PLAN)
    facts = copy.deepcopy(FACTS)
    facts["gpus"].append(_gpu("0000:23:00.0", 0, "SPX", "NPS1", 1, 0x2300))
    plan["placements"][0] = _placement("llm-70b", 0, "GPU-0000000000001000,GPU-0000000000002300")
    check = _by_subject(verify.partition_checks(HOST, plan, facts))["llm-70b"]
    assert check.status == "pass"
    assert "2 device(s)" in check.message


def test_a_placement_waiting_for_its_partition_is_skipped():
    plan = copy.deepcopy(PLAN)
    plan["placements"][1] = _placement("small-0", 0, "")
    check = _by_subject(verify.partition_checks(HOST, plan, FACTS))["small-0"]
    assert check.status == "skipped"
    assert "created when the compute partition changes" in check.message


def test_the_plan_key_rocr_visible_devices_is_read_too():
    plan = copy.deepcopy(PLAN)
    plan["placements"] = [dict(_placement("small-0", 0, None), rocr_visible_devices="GPU-x")]
    check = _by_subject(verify.partition_checks(HOST, plan, FACTS))["small-0"]
    assert check.status == "fail"


def test_a_plan_that_is_no_mapping_is_refused():
    with pytest.raises(VerifyError, match="host mi300x-01: plan is list"):
        verify.partition_checks(HOST, [], FACTS)
