"""playbooks/verify.yml on a fresh scratch copy of the demo fleet (render mode, nothing runs).

site.yml renders the units first; verify.yml then reports every runtime check as skipped with the
render-mode reason, passes the static check (rendered units match the plan), writes the three
report files on the controller (read back with real parsers) and changes nothing under the render
roots. An edited unit file fails its host, naming the unit.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml, Skipped
from prometheus_client.parser import text_string_to_metric_families
from system_helpers import REPO, Run, ansible_playbook, tree_digest

VERIFY = REPO / "playbooks" / "verify.yml"
UNITS = "etc/systemd/system"
SUMMARY_TASK = "Print the verify summary"
FAIL_TASK = "Fail the host when a verify check failed"
REPORT_TASK = "Write the verify report on the controller"
RENDER_REASON = "render mode: nothing runs"
REPORT_FILES = ("verify.json", "verify.junit.xml", "verify.prom")
LAYER_CHECKS = ("hugepage_pools", "kernel_settings", "mig_layout", "mps_settings", "irq_affinity")


@dataclass
class Fleet:
    base: Path
    inventory: Path
    hosts: list
    site: Run
    verify: Run
    before: dict  # host -> render root digest before verify.yml
    after: dict  # host -> render root digest after verify.yml

    def root(self, host: str) -> Path:
        return self.base / ".demo" / host / "root"

    def digests(self) -> dict:
        return {host: tree_digest(self.root(host)) for host in self.hosts}

    def reports(self, name: str = "reports") -> Path:
        return self.base / name


def run_verify(fleet_base: Path, inventory: Path, reports: str, *args) -> Run:
    return ansible_playbook(
        VERIFY, inventory, "-e", f"numafleet_report_dir={fleet_base / reports}", *args
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    import trees

    base = tmp_path_factory.mktemp("verify")
    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    trees.materialize_demo(base / ".demo")
    hosts = sorted(trees.DEMO_HOSTS)
    site = ansible_playbook(REPO / "site.yml", inventory)
    assert site.rc == 0, site.explain()
    roots = {host: tree_digest(base / ".demo" / host / "root") for host in hosts}
    verify = run_verify(base, inventory, "reports")
    after = {host: tree_digest(base / ".demo" / host / "root") for host in hosts}
    print(f"\nverify.yml on the demo fleet: {verify.seconds:.1f} s")
    return Fleet(base, inventory, hosts, site, verify, roots, after)


def test_verify_passes_on_every_host(fleet):
    run = fleet.verify
    assert run.rc == 0, run.explain()
    assert sorted(run.stats) == fleet.hosts, run.explain()
    for host, stats in run.stats.items():
        assert stats["failures"] == 0 and stats["unreachable"] == 0, (host, stats)
        assert stats["changed"] == 0, (host, stats)
    assert all(r["status"] == "skipped" for r in run.results(task=FAIL_TASK))


def test_verify_writes_nothing_under_the_render_roots(fleet):
    assert fleet.after == fleet.before


# Actions that run on the controller only; everything else is a module sent to the host.
CONTROLLER_SIDE = {
    "numafleet.tuning.host_vars_check",
    "numafleet.tuning.numa_plan",
    "numafleet.tuning.numa_verify",
    "numafleet.tuning.verify_report",
    "ansible.builtin.assert",
    "ansible.builtin.debug",
    "ansible.builtin.fail",
    "ansible.builtin.set_fact",
}


def test_render_mode_sends_two_modules_per_host(fleet):
    """Facts (one module) + host_apply: every layer in check mode (nothing is measured in
    render mode, where nothing runs)."""
    for host in fleet.hosts:
        ran = [r["action"] for r in fleet.verify.results(host) if r["status"] != "skipped"]
        remote = sorted(a for a in ran if a not in CONTROLLER_SIDE)
        assert remote == ["numafleet.tuning.host_apply", "numafleet.tuning.numa_facts"], (
            host,
            ran,
        )
        (apply,) = [r for r in fleet.verify.results(host) if r["action"].endswith("host_apply")]
        assert {"hugepages", "kernel", "units"} <= set(apply["layers"]), (host, apply)
        assert not apply["changed"], (host, apply)


def test_one_summary_line_per_host(fleet):
    for host in fleet.hosts:
        line = fleet.verify.one(host, SUMMARY_TASK)["msg"]
        assert isinstance(line, str) and "\n" not in line
        assert line.startswith(f"{host}: ") and ", 0 failed, " in line, line
        # Render mode: the line says the pass is one with most checks not run.
        assert " skipped; status pass (render: " in line and line.endswith(" checks not run)"), line


def _report(fleet, name="reports") -> dict:
    return json.loads((fleet.reports(name) / "verify.json").read_text(encoding="utf-8"))


def test_report_files_are_returned_and_written_on_the_controller(fleet):
    (result,) = fleet.verify.results(task=REPORT_TASK)
    assert sorted(Path(p).name for p in result["files"].values()) == sorted(REPORT_FILES)
    for path in result["files"].values():
        assert Path(path).parent == fleet.reports()
        assert Path(path).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in fleet.reports().iterdir()) == sorted(REPORT_FILES)


# Checks that read files and facts, not the running host: they pass in render mode too
# (gpu_partitions: the partition modes and visible devices of hosts with AMD GPUs).
STATIC = ("rendered_units", "effective_units", "gpu_partitions")


def test_runtime_checks_skipped_with_reason_and_static_checks_pass(fleet):
    report = _report(fleet)
    assert report["schema"] == "numafleet.verify/1"
    assert sorted(report["hosts"]) == fleet.hosts
    assert report["status"] == "pass"
    for host, entry in report["hosts"].items():
        static = [c for c in entry["checks"] if c["check"] in STATIC]
        layer = [c for c in entry["checks"] if c["check"] in LAYER_CHECKS]
        runtime = [c for c in entry["checks"] if c not in static and c not in layer]
        assert static and all(c["status"] == "pass" for c in static), (host, static)
        assert runtime, host  # every demo host has at least one node with memory
        for check in runtime:
            assert check["status"] == "skipped", (host, check)
            assert RENDER_REASON in check["message"], (host, check)
        # the layer checks read the recording: each named, none failed, a skip says why
        assert {c["check"] for c in layer} == set(LAYER_CHECKS), host
        for check in layer:
            assert check["status"] in ("pass", "skipped"), (host, check)
            assert check["status"] == "pass" or check["message"].startswith("skipped: "), check
        passed = [c for c in layer if c["status"] == "pass"]
        # a skipped layer check does not apply to the host: neither "not run" nor counted
        not_run = len(runtime)
        total = len(static) + len(runtime) + len(passed)
        assert entry["counts"]["pass"] == len(static) + len(passed), host
        assert entry["counts"]["skipped"] == len(runtime) + len(layer) - len(passed), host
        assert entry["status_text"] == f"pass (render: {not_run} of {total} checks not run)"
        assert entry["not_run"] == not_run, host
    pools = [
        c for c in report["hosts"]["qemu-2node-01"]["checks"] if c["check"] == "hugepage_pools"
    ]
    assert pools and all(c["status"] == "pass" for c in pools), pools
    a100 = report["hosts"]["gpu-a100-01"]["checks"]
    subjects = {c["subject"] for c in a100 if c["check"] == "rendered_units"}
    assert {"numafleet-llm-70b.service", "numafleet-team\\x2da.slice", "manifest"} <= subjects
    # effective_units: one per planned service (its name) and tenant slice, also in render mode
    effective = {c["subject"]: c for c in a100 if c["check"] == "effective_units"}
    assert "numafleet-team\\x2da.slice" in effective and "llm-70b" in effective, sorted(effective)
    assert effective["llm-70b"]["target"]["NUMAPolicy"] == "bind"
    amd = [c for c in report["hosts"]["mi300x-01"]["checks"] if c["check"] == "gpu_partitions"]
    assert len(amd) == 8 + 17 and {c["status"] for c in amd} == {"pass"}, amd
    gh200 = {c["subject"] for c in report["hosts"]["gh200-01"]["checks"]}
    assert "tritonserver.service" in gh200  # a drop-in counts for its unit


def test_junit_report_parses_and_never_shows_skipped_as_passed(fleet):
    report = _report(fleet)
    xml = JUnitXml.fromfile(str(fleet.reports() / "verify.junit.xml"))
    suites = {suite.name: suite for suite in xml}
    assert sorted(suites) == fleet.hosts
    for host, suite in suites.items():
        checks = report["hosts"][host]["checks"]
        cases = list(suite)
        assert len(cases) == len(checks) == suite.tests
        skipped = [c for c in cases if any(isinstance(r, Skipped) for r in c.result)]
        failed = [c for c in cases if any(isinstance(r, Failure) for r in c.result)]
        assert len(skipped) == report["hosts"][host]["counts"]["skipped"] == suite.skipped
        assert failed == [] and suite.failures == 0
        for case in skipped:
            assert not case.classname.endswith(".rendered_units"), case.classname


def test_prometheus_textfile_parses(fleet):
    text = (fleet.reports() / "verify.prom").read_text(encoding="utf-8")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= {
        "numafleet_check_status",
        "numafleet_verify_checks",
        "numafleet_verify_last_run_timestamp_seconds",
    }
    per_host = {
        (s.labels["host"], s.labels["status"]): s.value
        for s in families["numafleet_verify_checks"].samples
    }
    report = _report(fleet)
    for host in fleet.hosts:
        for status, count in report["hosts"][host]["counts"].items():
            assert per_host[(host, status)] == count, (host, status)
    stamps = {
        s.labels["host"] for s in families["numafleet_verify_last_run_timestamp_seconds"].samples
    }
    assert stamps == set(fleet.hosts)
    # Nothing was measured in render mode: no measurement metrics at all.
    assert "numafleet_offnode_share_ratio" not in families


def test_edited_unit_fails_its_host_naming_the_unit(fleet):
    unit = fleet.root("gpu-a100-01") / UNITS / "numafleet-embed.service"
    unit.write_text(unit.read_text() + "CPUAffinity=0-127\n")
    before = fleet.digests()
    run = run_verify(
        fleet.base, fleet.inventory, "reports-edited", "--limit", "gpu-a100-01,mi300x-01"
    )
    assert fleet.digests() == before
    assert run.rc == 2, run.explain()
    assert run.stats["gpu-a100-01"]["failures"] == 1, run.stats
    assert run.stats["mi300x-01"]["failures"] == 0, run.stats
    fail = run.one("gpu-a100-01", FAIL_TASK)
    assert fail["status"] == "failed"
    msg = fail["msg"]
    assert msg.startswith("host gpu-a100-01: 1 verify check(s) failed: ")
    assert "rendered_units numafleet-embed.service" in msg
    assert "/etc/systemd/system/numafleet-embed.service differs from the plan" in msg
    summary = run.one("gpu-a100-01", SUMMARY_TASK)["msg"]
    assert "FAIL rendered_units numafleet-embed.service" in summary, summary
    # The failing host is still in the report (written before the host fails).
    report = _report(fleet, "reports-edited")
    assert report["status"] == "fail"
    assert report["hosts"]["gpu-a100-01"]["status"] == "fail"
    assert report["hosts"]["mi300x-01"]["status"] == "pass"
    xml = JUnitXml.fromfile(str(fleet.reports("reports-edited") / "verify.junit.xml"))
    failed = [
        case.name
        for suite in xml
        for case in suite
        if any(isinstance(r, Failure) for r in case.result)
    ]
    assert failed == ["numafleet-embed.service"]
