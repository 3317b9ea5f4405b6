"""The numa_plan action plugin: defaults from facts, the plan fact, errors, check mode.

The plugin runs on the controller only, so it is driven here as the task executor would: an
ActionModule with the task's args, a connection it never uses, and the task vars.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import trees  # tests/unit/fixtures/trees.py (on sys.path through tests/unit/conftest.py)
from ansible.errors import AnsibleActionFail

from ansible_collections.numafleet.tuning.plugins.action.numa_plan import ActionModule
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, gpu_snapshot
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

SYSFS = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
A100 = "synthetic-2x6338-4xa100"


@pytest.fixture(scope="module")
def a100_facts(fixture_root):
    numa = json.loads((SYSFS / f"{A100}.numa.json").read_text(encoding="utf-8"))
    root = fixture_root(A100)
    state = gpu_snapshot.read_snapshot(str(trees.GPU_SNAPSHOT_DIR / f"{A100}.json"))
    topology = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
    return {"numa": numa, "gpu_topology": json.loads(json.dumps(topology))}


def run_action(args, facts, check_mode=False, host="gpu-a100-01"):
    task = SimpleNamespace(
        args=dict(args), async_val=0, check_mode=check_mode, action="numafleet.tuning.numa_plan"
    )
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = ActionModule(task, connection, None, None, None)
    action._load_name = "numafleet.tuning.numa_plan"
    task_vars = {"inventory_hostname": host, "ansible_facts": facts}
    return action.run(task_vars=task_vars)


LLM = {"name": "llm", "exec": "/opt/vllm/bin/vllm serve", "gpus": 2, "cpus": 16, "memory": "64G"}


def test_plans_from_the_hosts_facts(a100_facts):
    result = run_action({"placements": [LLM]}, a100_facts)
    assert not result.get("failed"), result
    assert result["changed"] is False
    plan = result["ansible_facts"]["numafleet_plan"]
    assert plan["host"] == "gpu-a100-01"
    assert plan["memory_headroom_pct"] == 15
    (entry,) = plan["placements"]
    # 0000:17:00.0 is in MIG mode, so node 1 is the one node with two whole GPUs.
    assert entry["node"] == 1
    assert [g["address"] for g in entry["gpus"]] == ["0000:b1:00.0", "0000:ca:00.0"]
    assert result["summary"].startswith("gpu-a100-01: 1 placement: llm node1 cpus ")


def test_check_mode_computes_the_same_plan(a100_facts):
    normal = run_action({"placements": [LLM]}, a100_facts)
    check = run_action({"placements": [LLM]}, a100_facts, check_mode=True)
    assert check == normal


def test_null_host_vars_mean_none(a100_facts):
    args = {"placements": None, "tenants": None, "reserved_cpus": None}
    result = run_action(args, a100_facts)
    assert result["ansible_facts"]["numafleet_plan"]["placements"] == []
    assert result["summary"] == "gpu-a100-01: 0 placements"


def test_explicit_facts_win_and_no_gpu_facts_mean_no_gpus(a100_facts):
    result = run_action(
        {"numa": a100_facts["numa"], "gpu_topology": {}, "placements": [LLM]},
        {"numa": {"nodes": []}},
    )
    assert result["failed"] is True
    assert result["msg"].startswith("host gpu-a100-01: numafleet_placements[0] (llm)")


def test_hugepages_extra_are_planned(a100_facts):
    extra = [{"node": 1, "size": "2M", "count": 512}]
    result = run_action({"placements": [LLM], "hugepages_extra": extra}, a100_facts)
    node1 = result["ansible_facts"]["numafleet_plan"]["nodes"][1]
    assert node1["hugepages_extra"] == [{"size_kb": 2048, "count": 512}]
    assert {"size_kb": 2048, "count": 512} in node1["hugepages"]
    assert (
        run_action({"hugepages_extra": None}, a100_facts)["summary"] == "gpu-a100-01: 0 placements"
    )
    bad = run_action({"hugepages_extra": [{"node": 1, "size": "2M"}]}, a100_facts)
    assert bad["failed"] is True
    assert bad["msg"] == (
        "host gpu-a100-01: numafleet_hugepages_extra[0].count: None is not a count >= 0; "
        "write e.g. count: 512"
    )


def test_a_bad_placement_fails_with_the_planners_message(a100_facts):
    bad = dict(LLM, memory="64 gigs")
    result = run_action({"placements": [bad]}, a100_facts)
    assert result["failed"] is True
    assert result["msg"] == (
        "host gpu-a100-01: numafleet_placements[0] (llm).memory: '64 gigs' is not a size; "
        "write e.g. 64G or 512M"
    )
    assert "ansible_facts" not in result


def test_plan_warnings_become_task_warnings_naming_the_host(a100_facts):
    pinned = dict(LLM, gpus=["0000:b1:00.0"], cpus=4)
    facts = json.loads(json.dumps(a100_facts))
    for entry in facts["gpu_topology"]["gpus"]:
        if entry["address"] == "0000:b1:00.0":
            entry["node"] = entry["numa_node"] = None
    result = run_action({"placements": [pinned]}, facts)
    assert not result.get("failed"), result
    assert result["warnings"]
    assert all(w.startswith("host gpu-a100-01: ") for w in result["warnings"])


def test_missing_numa_facts_say_what_to_run():
    result = run_action({"placements": []}, {})
    assert result["failed"] is True
    assert "run numafleet.tuning.numa_facts" in result["msg"].lower()


def test_unknown_option_names_the_host(a100_facts):
    with pytest.raises(AnsibleActionFail, match=r"^host gpu-a100-01: numafleet.tuning.numa_plan: "):
        run_action({"placement": [LLM]}, a100_facts)


def test_the_units_are_rendered_on_every_run(a100_facts):
    """A value the unit renderer refuses fails the plan even without changes: true."""
    bad = dict(LLM, exec="/opt/$APP/bin/serve")
    result = run_action({"placements": [bad]}, a100_facts)
    assert result["failed"] is True
    assert result["msg"].startswith("host gpu-a100-01: numafleet_placements[0] (llm).exec: ")
    assert "holds $" in result["msg"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"unit_dir": "/etc/systemd/sys\ntem"}, "pinned_services_unit_dir (unit_dir of the "),
        ({"mps_unit_dir": "relative/dir"}, "nvidia_mps_unit_dir (unit_dir of the renderer): "),
        ({"mps_control_path": "/usr/bin/mps control"}, "nvidia_mps_control_path (nvidia_cuda_"),
        ({"mps_nvidia_smi_path": "/usr/bin/smi\x85"}, "nvidia_mps_nvidia_smi_path (nvidia_smi "),
    ],
    ids=["unit-dir", "mps-unit-dir", "control", "nvidia-smi"],
)
def test_a_renderer_option_error_names_the_host_and_the_role_input(a100_facts, args, fragment):
    mps_client = {"name": "rr", "exec": "/opt/rr", "cpus": 4, "gpus": 1, "mps": True}
    result = run_action({"placements": [mps_client], **args}, a100_facts)
    assert result["failed"] is True
    assert result["msg"].startswith(f"host gpu-a100-01: {fragment}"), result["msg"]
    assert result["msg"].isprintable(), repr(result["msg"])


def test_a_manifest_the_apply_modules_refuse_stops_the_host_before_the_gate(a100_facts, tmp_path):
    """Before: the plan passed, the earlier roles applied, and pinned_units failed last."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
        read_recorded,
    )

    root = tmp_path / "root"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "manifest.json").write_text('{"version": 2, "files": {}, "units": []}\n')
    (root / "etc/numafleet").mkdir(parents=True)
    (root / "etc/numafleet/manifest.json").symlink_to(outside / "manifest.json")
    facts = dict(a100_facts, numafleet_recorded=read_recorded(str(root)))
    assert facts["numafleet_recorded"]["manifest_errors"]
    result = run_action({"placements": [LLM], "changes": True}, facts)
    assert result["failed"] is True
    assert result["msg"].startswith("host gpu-a100-01: ") and "manifest.json" in result["msg"]
    # drift_check.yml (refuse: false) reports it in the change plan instead
    report = run_action({"placements": [LLM], "changes": True, "refuse": False}, facts)
    assert not report.get("failed")
    assert any("site.yml would refuse this run" in line for line in report["changes"])


def test_a_plan_file_behind_a_linked_directory_is_not_read(tmp_path):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
        read_recorded,
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "plan.json").write_text('{"version": 1, "host": "h", "placements": []}\n')
    (tmp_path / "root/etc").mkdir(parents=True)
    (tmp_path / "root/etc/numafleet").symlink_to(elsewhere)
    recorded = read_recorded(str(tmp_path / "root"))
    assert (recorded["state"], recorded["kind"], recorded["plan"]) == ("invalid", "link", None)
    assert "cannot be reached without a link" in recorded["error"]


# -- numafleet_gpu_partitions and the deprecated numafleet_mig_gpus (issue 24) -----------------

MIG_OFF = [{"gpu": "0000:17:00.0", "mode": "disabled"}]
DEPRECATED = "numafleet_mig_gpus is deprecated: rename it numafleet_gpu_partitions (same keys)"


def test_gpu_partitions_plans_as_mig_gpus_did(a100_facts):
    new = run_action({"placements": [LLM], "gpu_partitions": MIG_OFF}, a100_facts)
    old = run_action({"placements": [LLM], "mig_gpus": MIG_OFF}, a100_facts)
    assert not new.get("failed"), new
    assert new["ansible_facts"] == old["ansible_facts"]
    assert new["ansible_facts"]["numafleet_plan"]["mig_gpus"]
    assert DEPRECATED not in " ".join(new.get("warnings") or ())


def test_mig_gpus_alone_warns_it_is_deprecated(a100_facts):
    result = run_action({"placements": [LLM], "mig_gpus": MIG_OFF}, a100_facts)
    assert f"host gpu-a100-01: {DEPRECATED}" in result["warnings"]


def test_both_variables_are_refused_before_planning(a100_facts):
    result = run_action({"gpu_partitions": MIG_OFF, "mig_gpus": MIG_OFF}, a100_facts)
    assert result["failed"] is True
    assert result["msg"].startswith(
        "host gpu-a100-01: numafleet_gpu_partitions and numafleet_mig_gpus are both set"
    )
    assert "ansible_facts" not in result


def _drift_run(hostvars: dict) -> dict:
    """numa_plan as drift_check.yml runs it: every option from the host variables."""
    from amd_facts import mi300x_host

    numa, topology = mi300x_host()
    host = "mi300x-01"
    task = SimpleNamespace(
        args={"playbook": "drift_check.yml"},
        async_val=0,
        check_mode=False,
        action="numafleet.tuning.numa_plan",
    )
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = ActionModule(task, connection, None, None, None)
    action._load_name = "numafleet.tuning.numa_plan"
    facts = {"numa": numa, "gpu_topology": topology}
    task_vars = {
        "inventory_hostname": host,
        "ansible_facts": facts,
        "hostvars": {host: dict(hostvars, ansible_facts=facts)},
    }
    return action.run(task_vars=task_vars)


@pytest.mark.parametrize("reset_ok", [False, True])
def test_numafleet_amd_reset_ok_reaches_the_change_plan(reset_ok):
    declared = [{"gpu": "0000:e3:00.0", "compute_partition": "SPX", "memory_partition": "NPS1"}]
    hostvars = {"numafleet_gpu_partitions": declared}
    if reset_ok:
        hostvars["numafleet_amd_reset_ok"] = True
    result = _drift_run(hostvars)
    assert not result.get("failed"), result
    (item,) = result["ansible_facts"]["numafleet_changes"]["amd"]
    assert item["gpu"] == "0000:e3:00.0" and item["memory"] == "NPS4 -> NPS1"
    assert item["reset_required"] is not reset_ok
    text = "\n".join(result["changes"])
    assert ("reloads the amdgpu driver" in text) is reset_ok
    assert ("waits as reset_required" in text) is not reset_ok
