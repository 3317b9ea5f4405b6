"""The numa_verify and verify_report action plugins, driven as the task executor would.

Both run on the controller only: an ActionModule with the task's args, a connection it never uses
and the task vars (hostvars as plain dicts).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from junitparser import JUnitXml
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.numafleet.tuning.plugins.action.numa_verify import (
    ActionModule as VerifyAction,
)
from ansible_collections.numafleet.tuning.plugins.action.verify_report import (
    ActionModule as ReportAction,
)

HOST = "gpu-a100-01"


def run_action(cls, name, args, task_vars):
    task = SimpleNamespace(args=dict(args), async_val=0, check_mode=False, action=name)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = cls(task, connection, None, None, None)
    action._load_name = name
    return action.run(task_vars=task_vars)


def plan(*placements):
    return {
        "version": 1,
        "host": HOST,
        "reserved_cpus": [],
        "placements": list(placements),
        "tenants": [],
        "nodes": [{"id": 0, "memory_kb": 1048576, "hugepages": []}],
        "gpus": [],
        "mps_daemons": [],
        "warnings": [],
    }


EMBED = {
    "name": "embed",
    "unit": "numafleet-embed.service",
    "cpus": [2, 3],
    "mems": [0],
    "gpus": [],
}
UNCHANGED = [{"path": "/etc/systemd/system/numafleet-embed.service", "state": "unchanged"}]


def verify_vars(host=HOST):
    return {"inventory_hostname": host, "ansible_facts": {"numafleet_plan": plan(EMBED)}}


def measured(share):
    return {
        "changed": False,
        "invocation": {"module_args": {}},
        "services": [
            {
                "name": "embed",
                "unit": "numafleet-embed.service",
                "running": True,
                "pids": [10],
                "binding": {"cpus_allowed": [2, 3], "mems_allowed": [0]},
                "offnode_share": share,
            }
        ],
        "nodes": [{"id": 0, "memory_total_kb": 1000, "memory_used_kb": 500, "memory_used_pct": 50}],
    }


def test_render_mode_skips_runtime_checks_and_passes_static():
    args = {"measured": {"skipped": True}, "unit_states": UNCHANGED, "render_mode": True}
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    assert not result.get("failed"), result
    assert result["status"] == "pass" and result["changed"] is False
    static = [c for c in result["checks"] if c["check"] == "rendered_units"]
    assert [c["status"] for c in static] == ["pass"]
    runtime = [c for c in result["checks"] if c["check"] != "rendered_units"]
    assert runtime and all(c["status"] == "skipped" for c in runtime)
    n = len(runtime)
    assert result["summary"] == (
        f"{HOST}: 1 passed, 0 failed, {n} skipped; status pass (render: {n} of {n + 1} checks "
        "not run)"
    )
    assert result["status"] == "pass" and result["not_run"] == n
    assert result["status_text"] == f"pass (render: {n} of {n + 1} checks not run)"


def test_require_runtime_fails_the_checks_not_run():
    args = {
        "measured": {"skipped": True},
        "unit_states": UNCHANGED,
        "render_mode": True,
        "require_runtime": True,
        "fail_on_failure": False,
    }
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    assert result["status"] == "fail" and not result.get("failed")
    runtime = [c for c in result["checks"] if c["check"] != "rendered_units"]
    assert runtime and all(c["status"] == "fail" for c in runtime)
    assert all("numafleet_verify_require_runtime is true" in c["message"] for c in runtime)
    assert "render mode: nothing runs" in runtime[0]["message"]
    static = [c for c in result["checks"] if c["check"] == "rendered_units"]
    assert [c["status"] for c in static] == ["pass"]
    assert result["status_text"] == "fail" and result["not_run"] == 0
    assert result["measured"] is None


def test_failed_check_fails_the_task_naming_service_value_and_target():
    args = {"measured": measured(0.071), "unit_states": UNCHANGED}
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    assert result["failed"] is True and result["status"] == "fail"
    assert result["msg"].startswith(f"host {HOST}: 1 verify check(s) failed: offnode_share embed: ")
    assert "measured 7.1%, target 2%" in result["msg"]
    assert set(result["measured"]) == {"services", "nodes"}  # no changed/invocation
    kept = dict(args, fail_on_failure=False)
    later = run_action(VerifyAction, "numafleet.tuning.numa_verify", kept, verify_vars())
    assert later["failed"] is False and later["msg"] == result["msg"]


def test_a_placement_the_guard_moved_warns_and_the_guard_read_is_kept():
    registered = measured(0.3)
    registered["guard"] = {
        "spilled": {"embed": {"from": [1], "to": [0], "since": 1738324800.0, "bytes": 1}},
        "last_run": 1738324815.0,
    }
    args = {"measured": registered, "unit_states": UNCHANGED}
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    assert not result.get("failed") and result["status"] == "warn"
    (check,) = [c for c in result["checks"] if c["check"] == "offnode_share"]
    assert check["detail"].endswith(
        "spilled (numafleet-guard moved it to node 0 at 2025-01-31T12:00:00Z)"
    )
    assert set(result["measured"]) == {"services", "nodes", "guard"}


def test_exactly_at_target_passes_and_string_thresholds_are_numbers():
    args = {
        "measured": measured(0.05),
        "unit_states": UNCHANGED,
        "thresholds": {"cross_node_target_pct": "5", "memory_warn_pct": "50"},
    }
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    assert not result.get("failed"), result
    assert result["status"] == "warn"  # 50% used, warn at 50%
    assert result["counts"]["warn"] == 1


def test_bad_thresholds_and_missing_plan_fail_with_the_fix():
    args = {
        "measured": measured(0.0),
        "unit_states": UNCHANGED,
        "thresholds": {"memory_fail_pct": 150},
    }
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    assert result["failed"] is True and "checks" not in result
    assert result["msg"].startswith(f"host {HOST}: verify threshold memory_fail_pct")
    assert "(numafleet_memory_fail_pct)" in result["msg"]
    none = run_action(
        VerifyAction, "numafleet.tuning.numa_verify", {}, {"inventory_hostname": HOST}
    )
    assert none["failed"] is True and "Run numafleet.tuning.numa_plan" in none["msg"]
    live = run_action(
        VerifyAction, "numafleet.tuning.numa_verify", {"measured": None}, verify_vars()
    )
    assert live["failed"] is True and "no measurement outside render mode" in live["msg"]


def test_unknown_option_names_the_host():
    with pytest.raises(AnsibleActionFail, match=f"host {HOST}: numafleet.tuning.numa_verify: "):
        run_action(VerifyAction, "numafleet.tuning.numa_verify", {"bogus": 1}, verify_vars())


def test_report_gathers_every_host_and_writes_three_parsable_files(tmp_path):
    ok = run_action(
        VerifyAction,
        "numafleet.tuning.numa_verify",
        {"measured": measured(0.0), "unit_states": UNCHANGED},
        verify_vars(),
    )
    bad = run_action(
        VerifyAction,
        "numafleet.tuning.numa_verify",
        {"measured": measured(0.5), "unit_states": UNCHANGED},
        verify_vars("b-host"),
    )
    hostvars = {
        HOST: {"__v": ok},
        "b-host": {"__v": bad},
        "c-host": {"__v": {"failed": True, "msg": "host c-host: verify threshold ..."}},
        "d-host": {},
        "e-host": {"__f": {"task": "Gather NUMA and GPU topology", "msg": "unreachable: ssh"}},
    }
    task_vars = {
        "inventory_hostname": HOST,
        "ansible_play_hosts_all": ["e-host", "d-host", "c-host", "b-host", HOST],
        "hostvars": hostvars,
    }
    folder = tmp_path / "new" / "reports"
    args = {
        "report_dir": str(folder),
        "result_var": "__v",
        "failure_var": "__f",
        "run": {"playbook": "verify.yml"},
    }
    result = run_action(ReportAction, "numafleet.tuning.verify_report", args, task_vars)
    assert not result.get("failed"), result
    assert result["changed"] is False and result["status"] == "fail"
    assert result["not_verified"] == ["c-host", "d-host", "e-host"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "verify.json",
        "verify.junit.xml",
        "verify.prom",
    ]
    report = json.loads((folder / "verify.json").read_text())
    assert report["run"] == {"playbook": "verify.yml"}
    statuses = {host: entry["status"] for host, entry in report["hosts"].items()}
    assert statuses == {
        "b-host": "fail",
        "c-host": "fail",
        "d-host": "fail",
        "e-host": "fail",
        HOST: "pass",
    }
    (e_check,) = report["hosts"]["e-host"]["checks"]
    assert e_check["message"] == (
        "verify did not run on this host: Gather NUMA and GPU topology: unreachable: ssh"
    )
    (c_check,) = report["hosts"]["c-host"]["checks"]
    assert c_check["check"] == "verified" and "verify threshold" in c_check["message"]
    suites = {suite.name for suite in JUnitXml.fromfile(str(folder / "verify.junit.xml"))}
    assert suites == {"b-host", "c-host", "d-host", "e-host", HOST}
    families = {
        f.name: f for f in text_string_to_metric_families((folder / "verify.prom").read_text())
    }
    shares = {s.labels["host"]: s.value for s in families["numafleet_offnode_share_ratio"].samples}
    assert shares == {HOST: 0.0, "b-host": 0.5}


def test_report_dir_that_cannot_be_made_fails_with_the_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    task_vars = {"ansible_play_hosts_all": [], "hostvars": {}}
    args = {"report_dir": str(blocker / "reports"), "result_var": "__v"}
    result = run_action(ReportAction, "numafleet.tuning.verify_report", args, task_vars)
    assert result["failed"] is True
    assert "set numafleet_report_dir to a writable directory" in result["msg"]


def test_the_guard_option_adds_the_guard_checks():
    registered = measured(0.0)
    registered["guard"] = {
        "active": "failed",
        "active_reason": None,
        "settings": {"warn_pct": 80, "act_pct": 90, "act": "reclaim", "interval_s": 15},
        "config_file": "/etc/numafleet/guard.json",
        "last_run": 1000.0,
        "read_at": 1010.0,
        "state_file": "/run/numafleet-guard/state.json",
    }
    guard = {"enabled": "True", "warn_pct": "80", "act_pct": 90, "act": "reclaim", "interval_s": 15}
    args = {"measured": registered, "unit_states": UNCHANGED, "guard": guard}
    result = run_action(VerifyAction, "numafleet.tuning.numa_verify", args, verify_vars())
    statuses = {c["check"]: c["status"] for c in result["checks"] if c["check"].startswith("guard")}
    assert statuses == {"guard_service": "fail", "guard_config": "pass", "guard_last_run": "pass"}
    assert "guard_service numafleet-guard.service: measured failed, target active" in result["msg"]
    bad = dict(args, guard={"act": "move"})
    refused = run_action(VerifyAction, "numafleet.tuning.numa_verify", bad, verify_vars())
    assert refused["failed"] is True
    assert refused["msg"] == (
        f"host {HOST}: numafleet_memory_act is 'move'; use one of reclaim, throttle, migrate"
    )
    off = dict(args, guard={"enabled": False})
    quiet = run_action(VerifyAction, "numafleet.tuning.numa_verify", off, verify_vars())
    assert not [c for c in quiet["checks"] if c["check"].startswith("guard")]
