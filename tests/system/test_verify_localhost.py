"""playbooks/verify.yml against this machine itself (no render root): the live path runs.

This host has no placements, so the plan is empty and nothing is measured per service, but the
facts, the check-mode comparison of units under /, the measurement on the live /sys and /proc (one host_apply run),
the node checks and the report all run for real, and nothing on the host changes.
"""

from __future__ import annotations

import json

import pytest
from junitparser import JUnitXml
from prometheus_client.parser import text_string_to_metric_families
from system_helpers import REPO, ansible_playbook

SUMMARY_TASK = "Print the verify summary"


@pytest.fixture
def inventory(tmp_path, ansible_ready):
    """An inventory of this machine alone, over the local connection."""
    path = tmp_path / "hosts.yml"
    path.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: '{{ ansible_playbook_python }}'\n",
        encoding="utf-8",
    )
    return path


def test_verify_runs_on_localhost(tmp_path, inventory):
    reports = tmp_path / "reports"
    run = ansible_playbook(
        REPO / "playbooks" / "verify.yml",
        inventory,
        "-e",
        f"numafleet_report_dir={reports}",
        "-e",
        "numafleet_verify_window_s=0.5",
    )
    assert run.rc == 0, run.explain()
    assert run.stats["localhost"]["changed"] == 0, run.stats
    measure = run.one("localhost", "Compare the layers and measure the planned services")
    assert not measure.get("skipped"), measure
    assert {"hugepages", "kernel", "units"} <= set(measure["layers"]), measure
    summary = run.one("localhost", SUMMARY_TASK)["msg"]
    assert summary.startswith("localhost: ") and " 0 failed" in summary, summary

    report = json.loads((reports / "verify.json").read_text(encoding="utf-8"))
    host = report["hosts"]["localhost"]
    assert host["status"] in ("pass", "warn"), host
    checks = {(c["check"], c["subject"]) for c in host["checks"]}
    assert ("memory_used", "node0") in checks, checks
    layer = ("hugepage_pools", "kernel_settings", "mig_layout", "mps_settings", "irq_affinity")
    assert {c["check"] for c in host["checks"] if c["check"] in layer} == set(layer), checks
    # a layer check is skipped only where the layer has nothing here (no GPU, IRQ pinning off)
    for check in host["checks"]:
        if check["check"] in layer:
            assert check["status"] in ("pass", "skipped"), check
        else:
            assert check["status"] != "skipped", check
    suites = list(JUnitXml.fromfile(str(reports / "verify.junit.xml")))
    assert [suite.name for suite in suites] == ["localhost"]
    families = {
        f.name
        for f in text_string_to_metric_families(
            (reports / "verify.prom").read_text(encoding="utf-8")
        )
    }
    assert "numafleet_node_memory_used_ratio" in families, families


def test_a_run_whose_host_fails_replaces_the_stale_report_with_the_failure(tmp_path, inventory):
    reports = tmp_path / "reports"
    reports.mkdir()
    stale = reports / "verify.json"
    stale.write_text('{"status": "pass"}\n', encoding="utf-8")
    run = ansible_playbook(
        REPO / "playbooks" / "verify.yml",
        inventory,
        "-e",
        f"numafleet_report_dir={reports}",
        "-e",
        "numafleet_verify_window_s=0",
        "-e",
        "numafleet_cross_node_target_pct=abc",
    )
    assert run.rc != 0, run.explain()
    evaluate = run.one("localhost", "Evaluate the verify checks")
    assert "numafleet_cross_node_target_pct" in evaluate["msg"], evaluate
    # The host's failure is recorded (rescue) and the report is written with it: never the
    # previous run's pass.
    report = json.loads(stale.read_text(encoding="utf-8"))
    assert report["status"] == "fail", report
    (verified,) = report["hosts"]["localhost"]["checks"]
    assert verified["check"] == "verified", verified
    assert "Evaluate the verify checks" in verified["message"], verified
    assert "numafleet_cross_node_target_pct" in verified["message"], verified
    assert run.one("localhost", "Fail the host when a verify check failed")["status"] == "failed"
    refused = ansible_playbook(
        REPO / "playbooks" / "verify.yml", inventory, "-e", "numafleet_report_dir=/"
    )
    assert refused.rc != 0, refused.explain()
    message = refused.one("localhost", "Remove the previous verify report on the controller")["msg"]
    assert "set numafleet_report_dir to a directory of its own" in message, message


def test_bad_measurement_settings_name_host_and_variable(tmp_path, inventory):
    run = ansible_playbook(
        REPO / "playbooks" / "verify.yml",
        inventory,
        "-e",
        f"numafleet_report_dir={tmp_path / 'reports'}",
        "-e",
        "numafleet_verify_window_s=-1",
    )
    assert run.rc != 0, run.explain()
    message = run.one("localhost", "Plan placements")["msg"]
    assert message.startswith("host localhost: numafleet_verify_window_s is '-1'"), message
