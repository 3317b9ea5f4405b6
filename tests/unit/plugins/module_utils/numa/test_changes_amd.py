"""The change plan of AMD Instinct partition changes: per GPU the compute and memory modes old ->
new, the units the amd layer stops and starts (restarts, whatever numafleet_restart says), a
memory partition change that reloads amdgpu (every AMD GPU of the host is reset) or waits as
reset_required without numafleet_amd_reset_ok. Plans are the planner's, on the demo host
mi300x-01's host variables and the hand-written MI300X facts (tests/unit/amd_facts.py): the
demo's own (one XGMI hive in NPS1) and, for a memory partition change of one GPU, GPUs in no
hive with the six CPX GPUs in NPS4."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from amd_facts import mi300x_hive_host, mi300x_host
from synthetic_hosts import synthetic

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import change_plan
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
    MANIFEST_PATHS,
    digest,
)

HOST = "mi300x-01"
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}
DEMO = Path(__file__).resolve().parents[5] / "inventories/demo/host_vars/mi300x-01.yml"
E3 = "0000:e3:00.0"
# e3 back to SPX/NPS1 on GPUs in no hive (mi300x_host: the CPX GPUs in NPS4)
E3_WHOLE = [{"gpu": E3, "compute_partition": "SPX", "memory_partition": "NPS1"}]


@pytest.fixture(scope="module")
def demo_vars() -> dict:
    return yaml.safe_load(DEMO.read_text(encoding="utf-8"))


def plan_of(placements, partitions, before=None, topology=None) -> dict:
    numa, gpus = mi300x_hive_host()
    recorded = None
    if before is not None:
        recorded = parse_recorded(HOST, {"state": "present", "plan": before}, "/p")
    return plan_host(
        HOST,
        synthetic(cpus_per_node=(96, 96), mem_gb=(1024, 1024)),
        copy.deepcopy(topology or gpus),
        copy.deepcopy(placements),
        [],
        POLICY,
        mig_gpus=copy.deepcopy(partitions),
        recorded=recorded,
    )


def rendered(plan: dict) -> dict:
    return units.render_files(plan, units.DEFAULT_HEADER, True, units.DEFAULT_UNIT_DIR)


def applied(plan: dict) -> dict:
    """numafleet_recorded.files after an apply of plan."""
    files = {path: digest(text) for path, text in rendered(plan).items()}
    files.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
    return files


def day2(demo_vars, partitions=None, topology=None, **options) -> dict:
    """The change plan of a run after the demo's placements were applied (and recorded) with
    every GPU in the mode it runs now; partitions: the modes declared now."""
    placements = demo_vars["numafleet_placements"]
    before = plan_of(placements, [], topology=topology)
    new = plan_of(placements, partitions or demo_vars["numafleet_gpu_partitions"], before, topology)
    return change_plan(HOST, before, new, rendered(new), {}, applied(before), **options)


def owned(result: dict) -> list:
    return sorted(u for g in result["amd_partitions"] for u in g["owned_units"])


def test_the_demos_memory_partition_change_reloads_amdgpu_and_restarts_every_owned_unit(
    demo_vars,
):
    result = day2(demo_vars, E3_WHOLE, mi300x_host()[1], amd_reset_ok=True)
    every = sorted(f"numafleet-small-{n:02d}.service" for n in range(16))
    every.append("numafleet-llm-70b.service")
    assert result["amd"] == [
        {
            "gpu": E3,
            "compute": "CPX -> SPX",
            "memory": "NPS4 -> NPS1",
            "reset_required": False,
            "restart": sorted(every),
        }
    ]
    # Nothing else changes: the restarts are the amd layer's, and systemd's list them all.
    assert result["units"]["restart"] == sorted(every)
    assert result["units"]["start"] == [] and result["units"]["stop"] == []
    assert result["changed"]
    assert result["summary"] == "changes: 17 restarted, 1 AMD partition change"
    lines = result["lines"]
    assert (
        f"  amd {E3}: compute CPX -> SPX; memory NPS4 -> NPS1; reloads the amdgpu driver, "
        "which resets EVERY AMD GPU of the host"
    ) in lines
    (stops,) = [line for line in lines if line.startswith("  amd: stops and starts ")]
    assert "numafleet-llm-70b.service, numafleet-small-00.service" in stops
    assert f"  restart: {', '.join(sorted(every))}" in lines


def test_without_reset_ok_a_memory_partition_change_waits_and_restarts_nothing(demo_vars):
    result = day2(demo_vars, E3_WHOLE, mi300x_host()[1])
    (item,) = result["amd"]
    assert item == {
        "gpu": E3,
        "compute": "CPX -> SPX",
        "memory": "NPS4 -> NPS1",
        "reset_required": True,
        "restart": [],
    }
    assert result["units"]["restart"] == []
    assert result["summary"] == "changes: 1 AMD partition change awaiting a reset"
    (line,) = [line for line in result["lines"] if line.startswith("  amd")]
    assert line.startswith(f"  amd {E3}: compute CPX -> SPX; memory NPS4 -> NPS1: waits as ")
    assert "nothing changes on this GPU" in line and "numafleet_amd_reset_ok: true" in line


def test_a_compute_partition_change_needs_no_reset_and_restarts_the_units_on_kfd(demo_vars):
    result = day2(demo_vars)  # the demo's declared change: e3 CPX -> SPX, all GPUs in NPS1
    (item,) = result["amd"]
    assert (item["compute"], item["memory"], item["reset_required"]) == ("CPX -> SPX", None, False)
    # e3 serves nothing, yet every owned unit holds /dev/kfd and with it every AMD GPU.
    assert item["restart"] == result["units"]["restart"] and len(item["restart"]) == 17
    assert f"  amd {E3}: compute CPX -> SPX" in result["lines"]
    assert "reloads" not in "\n".join(result["lines"])
    assert result["summary"] == "changes: 17 restarted, 1 AMD partition change"


def test_the_amd_layer_restarts_even_with_restart_never(demo_vars):
    result = day2(demo_vars, restart="never")
    assert len(result["units"]["restart"]) == 17
    assert result["units"]["awaiting_restart"] == []


def test_a_first_run_restarts_nothing_the_units_are_new(demo_vars):
    new = plan_of(demo_vars["numafleet_placements"], demo_vars["numafleet_gpu_partitions"])
    result = change_plan(HOST, None, new, rendered(new), {}, {}, amd_reset_ok=True)
    (item,) = result["amd"]
    assert item["gpu"] == E3 and item["restart"] == []
    assert len(result["units"]["start"]) == 17 and result["units"]["restart"] == []
    assert not any(line.startswith("  amd: stops and starts") for line in result["lines"])
    assert "1 AMD partition change" in result["summary"]


def test_a_unit_waiting_for_its_logical_gpu_is_not_restarted():
    running = [{"name": "w", "exec": "/bin/w", "cpus": 2, "memory": "8G", "gpus": 1, "node": 0}]
    before = plan_of(running, [])
    waiting = [
        *running,
        {"name": "s", "exec": "/bin/s", "cpus": 2, "memory": "8G", "partition": "cpx",
         "gpus": ["0000:23:00.0"]},
    ]  # fmt: skip
    declared = [{"gpu": "0000:23:00.0", "compute_partition": "CPX"}]
    new = plan_of(waiting, declared, before)
    result = change_plan(HOST, before, new, rendered(new), {}, applied(before))
    (item,) = result["amd"]
    assert item["compute"] == "SPX -> CPX"
    assert "numafleet-s.service" in owned(new)
    assert item["restart"] == ["numafleet-w.service"]
    assert "numafleet-s.service" in result["units"]["waiting"]


def test_a_unit_that_requires_a_stopped_unit_is_stopped_by_systemd_not_started_again(demo_vars):
    placements = demo_vars["numafleet_placements"]
    before = plan_of(placements, [])
    new = plan_of(placements, demo_vars["numafleet_gpu_partitions"], before)
    # A unit of the host's files (say a log shipper) that Requires= one of the amd layer's units.
    shipper = {"/etc/systemd/system/ship.service": "[Unit]\nRequires=numafleet-small-08.service\n"}
    files = {**rendered(new), **shipper}
    recorded = {**applied(before), "/etc/systemd/system/ship.service": digest(shipper.popitem()[1])}
    result = change_plan(HOST, before, new, files, {}, recorded, amd_reset_ok=True)
    assert result["units"]["stop_through"] == {
        "ship.service": "Requires=numafleet-small-08.service"
    }
    assert (
        "  stopped by systemd: ship.service (Requires=numafleet-small-08.service)"
        in (result["lines"])
    )


def test_no_amd_gpu_no_amd_item(demo_vars):
    numa, topology = mi300x_host()
    for gpu in topology["gpus"]:
        gpu["amd"]["compute_partition"]["current"] = gpu["partition"]["compute"]
    # Every GPU declared as it runs: an empty list.
    declared = [
        {"gpu": g["address"], "compute_partition": g["partition"]["compute"]}
        for g in topology["gpus"]
    ]
    result = day2(demo_vars, declared)
    assert result["amd"] == [] and not result["changed"]
    assert result["summary"] == "no change"
