"""The drift_report action: every play host's registered results -> one report run directory."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ansible_collections.numafleet.tuning.plugins.action.drift_report import (
    ActionModule as DriftAction,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _reports

NAME = "numafleet.tuning.drift_report"


def run_action(cls, name, args, task_vars):
    task = SimpleNamespace(args=dict(args), async_val=0, check_mode=False, action=name)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = cls(task, connection, None, None, None)
    action._load_name = name
    return action.run(task_vars=task_vars)


ARGS = {
    "plan_var": "__plan",
    "apply_var": "__apply",
    "verify_var": "__verify",
    "failure_var": "__failure",
    "connect_vars": {"Gather NUMA and GPU topology": "__facts", "Check the placements": "__apply"},
    "started": "2025-01-31T12:00:00Z",
    "playbook": "/p/playbooks/drift_check.yml",
}


def fleet_vars():
    hostvars = {
        "clean-01": {
            "__facts": {"changed": False},
            "__plan": {"changes": ["clean-01: change plan: nothing to do"]},
            "__apply": {"changed": False, "layers": {"units": {"changed": False}}},
            "__verify": {"checks": [], "status_text": "pass (render: 27 of 34 checks not run)"},
        },
        "drift-01": {
            "__facts": {"changed": False},
            "__apply": {
                "changed": True,
                "layers": {"units": {"changed": False, "foreign_overrides": ["/etc/x.conf"]}},
            },
            "__verify": {"checks": []},
        },
        "fail-01": {"__failure": {"task": "Plan placements", "msg": "no node has 8 CPUs"}},
        "dead-01": {"__facts": {"unreachable": True, "msg": "ssh: connection refused"}},
    }
    return {
        "inventory_hostname": "clean-01",
        "ansible_play_hosts_all": sorted(hostvars),
        "ansible_inventory_sources": ["/p/inventories/demo"],
        "hostvars": hostvars,
    }


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NUMAFLEET_DRIFT_REPORT_DIR", raising=False)
    monkeypatch.delenv("NUMAFLEET_DRIFT_REPORT_KEEP", raising=False)
    return tmp_path


def test_every_host_is_reported_as_itself_under_the_working_directory(project):
    result = run_action(DriftAction, NAME, ARGS, fleet_vars())
    assert not result.get("failed"), result
    assert result["report_dir"] == str(project / "reports" / "drift")
    statuses = {host: entry["status"] for host, entry in result["hosts"].items()}
    assert statuses == {
        "clean-01": "clean",
        "dead-01": "unreachable",
        "drift-01": "drift",
        "fail-01": "fail",
    }
    errors = {host: entry["errors"] for host, entry in result["hosts"].items()}
    assert errors == {"clean-01": False, "dead-01": True, "drift-01": False, "fail-01": True}
    data = json.loads(Path(result["files"]["json"]).read_text())
    assert data["version"] == 2 and data["started"] == "2025-01-31T12:00:00Z"
    assert data["inventory"] == ["/p/inventories/demo"]
    assert data["hosts"]["dead-01"]["unreachable"] == {
        "task": "Gather NUMA and GPU topology",
        "msg": "ssh: connection refused",
    }
    assert data["hosts"]["clean-01"]["verify_status"] == "pass (render: 27 of 34 checks not run)"
    assert data["hosts"]["fail-01"]["failed_tasks"][0]["task"] == "Plan placements"
    assert (project / "reports" / "drift" / "latest" / "drift.prom").is_file()
    assert "4 host(s), 1 clean, 1 drift, 1 fail, 1 unreachable" in result["summary"]


def test_report_dir_and_the_environment(project, monkeypatch):
    args = dict(ARGS, report_dir="out", keep=1)
    first = run_action(DriftAction, NAME, args, fleet_vars())
    assert first["report_dir"] == str(project / "out" / "drift")
    monkeypatch.setenv("NUMAFLEET_DRIFT_REPORT_DIR", str(project / "timer"))
    second = run_action(DriftAction, NAME, args, fleet_vars())
    assert second["report_dir"] == str(project / "timer")  # drift_timer's directory wins
    monkeypatch.setenv("NUMAFLEET_DRIFT_REPORT_KEEP", "0")
    bad = run_action(DriftAction, NAME, ARGS, fleet_vars())
    assert bad["failed"] is True and "NUMAFLEET_DRIFT_REPORT_KEEP" in bad["msg"]


def test_an_unwritable_directory_fails_loudly_naming_it(project):
    blocker = project / "file"
    blocker.write_text("")
    args = dict(ARGS, report_dir=str(blocker))
    result = run_action(DriftAction, NAME, args, fleet_vars())
    assert result["failed"] is True
    assert f"cannot write the drift report in {blocker}/drift" in result["msg"]
    assert "Not a directory" in result["msg"]


def test_a_directory_inside_the_installed_collection_is_refused(project, monkeypatch):
    installed = project / "collections" / "ansible_collections" / "numafleet" / "tuning"
    installed.mkdir(parents=True)
    (installed / "MANIFEST.json").write_text("{}")
    monkeypatch.setattr(_reports, "COLLECTION_ROOT", str(installed))
    monkeypatch.chdir(installed)  # ansible-playbook run from inside the installed collection
    result = run_action(DriftAction, NAME, ARGS, fleet_vars())
    assert result["failed"] is True
    assert f"{installed}/reports/drift" in result["msg"]
    assert (
        "inside the installed collection" in result["msg"]
        and "numafleet_report_dir" in result["msg"]
    )
    assert not (installed / "reports").exists()
    elsewhere = run_action(
        DriftAction, NAME, dict(ARGS, report_dir=str(project / "r")), fleet_vars()
    )
    assert not elsewhere.get("failed"), elsewhere


def test_installed_collection_holding(tmp_path):
    installed = tmp_path / "tuning"
    installed.mkdir()
    inside = str(installed / "reports")
    assert _reports.installed_collection_holding(inside, str(installed)) is None  # a checkout
    (installed / "MANIFEST.json").write_text("{}")
    assert _reports.installed_collection_holding(inside, str(installed)) == str(installed)
    assert _reports.installed_collection_holding(str(tmp_path / "proj"), str(installed)) is None
    assert _reports.installed_collection_holding(str(tmp_path / "tuning2"), str(installed)) is None
