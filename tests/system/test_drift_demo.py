"""playbooks/drift_check.yml on a scratch demo fleet: clean after site.yml, then deliberate drift.

The demo inventory is copied to <tmp>/inventories/demo and the trees are materialised to
<tmp>/.demo (as in test_site_demo.py). site.yml runs once; drift_check.yml then runs on the whole
fleet (zero drift expected), and again after three hand-made changes, limited to the changed hosts
and one untouched control host (to keep the test near 3 minutes):

* gpu-a100-01: CPUAffinity= of the rendered numafleet-embed.service edited;
* qemu-2node-01: node1's 2 MiB pool in the scratch sysfs set from 64 to 32 pages;
* epyc-nps4-01: the rendered numafleet-vision.service removed.

The playbook writes the report itself (task numafleet.tuning.drift_report, no callback): the clean
run into <numafleet_report_dir>/drift, the drift run into NUMAFLEET_DRIFT_REPORT_DIR (as the
drift_timer role sets it); the three files are read with json, xml.etree and prometheus_client's
parser. Each drifted host fails as itself; the untouched host does not fail.
"""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from system_helpers import REPO, Run, ansible_playbook, tree_digest

PLAYBOOK = REPO / "playbooks" / "drift_check.yml"
UNITS = "root/etc/systemd/system"
EDITED = ("gpu-a100-01", f"{UNITS}/numafleet-embed.service")
POOL = ("qemu-2node-01", "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages")
REMOVED = ("epyc-nps4-01", f"{UNITS}/numafleet-vision.service")
CONTROL = "gh200-01"
DRIFTED = sorted({EDITED[0], POOL[0], REMOVED[0]})
LAYERS = (
    "hugepages",
    "numa_kernel",
    "nvidia_gpu",
    "nvidia_mig",
    "nvidia_mps",
    "pinned_services",
    "verify",
)
SUMMARY_TASK = "Print the drift summary"
FINAL_TASK = "Fail the host when it drifted, failed or was unreachable"


@dataclass
class Report:
    folder: Path
    data: dict
    junit: dict  # (host, layer) -> (outcome, message, text)
    prom: dict  # (metric, frozenset(labels)) -> value


@dataclass
class DriftFleet:
    base: Path
    hosts: list
    site: Run
    clean: Run
    drift: Run
    clean_report: Report | None
    drift_report: Report | None
    digests: dict  # "site", "clean", "edited", "drift" -> {host: digest of .demo/<host>}
    pool_before: str


def read_report(report_dir: Path) -> Report | None:
    latest = report_dir / "latest"
    if not latest.is_dir():
        return None
    data = json.loads((latest / "drift.json").read_text())
    root = ET.fromstring((latest / "drift.junit.xml").read_bytes())
    junit = {}
    for case in root.iter("testcase"):
        outcome, message, text = "pass", "", ""
        for tag in ("failure", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome, message, text = tag, found.get("message") or "", found.text or ""
        junit[(case.get("classname"), case.get("name"))] = (outcome, message, text)
    prom = {}
    for family in text_string_to_metric_families((latest / "drift.prom").read_text()):
        for sample in family.samples:
            prom[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Report(latest.resolve(), data, junit, prom)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    import trees

    base = tmp_path_factory.mktemp("drift")
    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    trees.materialize_demo(base / ".demo")
    hosts = sorted(trees.DEMO_HOSTS)

    def digests() -> dict:
        return {host: tree_digest(base / ".demo" / host) for host in hosts}

    snapshots = {}
    site = ansible_playbook(REPO / "site.yml", inventory)
    snapshots["site"] = digests()
    clean = ansible_playbook(
        PLAYBOOK, inventory, "-e", f"numafleet_report_dir={base / 'reports-clean'}"
    )
    snapshots["clean"] = digests()

    unit = base / ".demo" / EDITED[0] / EDITED[1]
    text = unit.read_text()
    lines = [
        "CPUAffinity=0-63" if line.startswith("CPUAffinity=") else line
        for line in text.splitlines()
    ]
    unit.write_text("\n".join(lines) + "\n")
    pool = base / ".demo" / POOL[0] / POOL[1]
    pool_before = pool.read_text().strip()
    pool.write_text("32\n")
    (base / ".demo" / REMOVED[0] / REMOVED[1]).unlink()
    snapshots["edited"] = digests()
    env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(base / "reports-drift")}
    drift = ansible_playbook(PLAYBOOK, inventory, "--limit", ",".join([*DRIFTED, CONTROL]), env=env)
    snapshots["drift"] = digests()
    print(
        f"\ndemo fleet: site.yml {site.seconds:.1f} s, clean drift check {clean.seconds:.1f} s, "
        f"drift check after changes {drift.seconds:.1f} s"
    )
    return DriftFleet(
        base,
        hosts,
        site,
        clean,
        drift,
        read_report(base / "reports-clean" / "drift"),
        read_report(base / "reports-drift"),
        snapshots,
        pool_before,
    )


def test_site_converged_the_fleet_first(fleet):
    assert fleet.site.rc == 0, fleet.site.explain()
    assert fleet.pool_before == "64"  # site.yml reserved the pool the test then shrinks


def test_fresh_fleet_has_zero_drift(fleet):
    run, report = fleet.clean, fleet.clean_report
    assert run.rc == 0, run.explain()
    assert report is not None, run.explain()
    data = report.data
    assert data["format"] == "numafleet.tuning/drift-report" and data["version"] == 2
    assert data["inventory"] == [str(fleet.base / "inventories" / "demo")]
    assert data["playbook"] == str(PLAYBOOK)
    assert data["started"] <= data["finished"]
    assert sorted(data["hosts"]) == fleet.hosts
    assert data["totals"]["clean"] == len(fleet.hosts), json.dumps(data["totals"])
    assert data["totals"]["changes"] == 0 and data["totals"]["checks"]["fail"] == 0
    for host, entry in data["hosts"].items():
        assert entry["status"] == "clean", (host, entry["summary"])
        assert entry["drift"] == [] and entry["verified"], host
        for layer in LAYERS:
            assert report.junit[(host, layer)][0] in ("pass", "skipped"), (host, layer)
        assert report.junit[(host, "pinned_services")][0] == "pass", host
        assert report.junit[(host, "verify")][0] == "pass", host
    # A GPU host without MIG or MPS work still gets its testcase, as skipped.
    assert report.junit[("arm-kunpeng-01", "nvidia_mig")][0] == "skipped"
    drift = {k: v for k, v in report.prom.items() if k[0] == "numafleet_host_drift"}
    assert len(drift) == len(fleet.hosts) and set(drift.values()) == {0.0}
    changes = {k: v for k, v in report.prom.items() if k[0] == "numafleet_drift_changes"}
    assert changes and set(changes.values()) == {0.0}
    failed = {k: v for k, v in report.prom.items() if k[0] == "numafleet_verify_check_failed"}
    assert failed and set(failed.values()) == {0.0}
    assert report.prom[("numafleet_last_run_timestamp_seconds", frozenset())] > 0
    for host in fleet.hosts:
        line = run.one(host, SUMMARY_TASK)["msg"]
        assert line.startswith(f"{host}: drift check clean; no drift; verify checks: {host}: "), (
            line
        )


def test_drift_check_writes_nothing_on_the_hosts(fleet):
    assert fleet.digests["clean"] == fleet.digests["site"]
    assert fleet.digests["drift"] == fleet.digests["edited"]


def test_report_keeps_runs_and_points_latest(fleet):
    report = fleet.clean_report
    assert report is not None
    folders = [p for p in (fleet.base / "reports-clean" / "drift").iterdir() if not p.is_symlink()]
    assert [p.name for p in folders] == [report.folder.name]
    assert os.readlink(fleet.base / "reports-clean" / "drift" / "latest") == report.folder.name
    assert sorted(p.name for p in report.folder.iterdir()) == [
        "drift.json",
        "drift.junit.xml",
        "drift.prom",
    ]


def test_deliberate_drift_fails_each_drifted_host_as_itself(fleet):
    run = fleet.drift
    assert run.rc == 2, run.explain()
    final = {r["host"]: r for r in run.results(task=FINAL_TASK)}
    assert sorted(final) == sorted([*DRIFTED, CONTROL]), run.explain()
    for host in DRIFTED:
        assert final[host]["status"] == "failed", final[host]
        assert final[host]["msg"].startswith(f"{host}: drift; "), final[host]["msg"]
    assert final[CONTROL]["status"] == "skipped", final[CONTROL]
    # Blame: only the drifted hosts have a failed task, the untouched one none.
    assert run.stats[CONTROL]["failures"] == 0, run.stats
    for host in DRIFTED:
        assert run.stats[host]["failures"] == 1, run.stats


def test_edited_unit_is_reported(fleet):
    report = fleet.drift_report
    assert report is not None, fleet.drift.explain()
    host, path = EDITED[0], "/" + EDITED[1].split("/", 1)[1]
    entry = report.data["hosts"][host]
    # A hand-edited unit of ours is drift; its rendered_units check fails as well, and says so.
    assert entry["status"] == "drift", entry["summary"]
    (drift,) = entry["drift"]
    assert drift["role"] == "pinned_services"
    assert drift["changes"] == [
        {
            "path_or_header": path,
            "state": "update",
            "added": 1,
            "removed": 1,
            "settings": ["CPUAffinity"],
        }
    ]
    failed = [c for c in entry["checks"] if c["status"] == "fail"]
    assert [(c["check"], c["subject"]) for c in failed] == [
        ("rendered_units", "numafleet-embed.service")
    ]
    outcome, message, text = report.junit[(host, "pinned_services")]
    assert outcome == "failure" and "pinned_services drifted" in message
    assert f"{path}: +1 -1 (CPUAffinity)" in text
    assert report.junit[(host, "verify")][0] == "failure"
    assert report.junit[(host, "hugepages")][0] == "pass"
    assert (
        report.prom[
            (
                "numafleet_drift_changes",
                frozenset({"host": host, "role": "pinned_services"}.items()),
            )
        ]
        == 1
    )
    key = frozenset(
        {"host": host, "check": "rendered_units", "subject": "numafleet-embed.service"}.items()
    )
    assert report.prom[("numafleet_verify_check_failed", key)] == 1
    line = fleet.drift.one(host, SUMMARY_TASK)["msg"]
    assert line.startswith(f"{host}: drift check drift; drift in pinned_services; verify"), line


def test_changed_hugepage_count_is_reported(fleet):
    report = fleet.drift_report
    assert report is not None, fleet.drift.explain()
    host = POOL[0]
    entry = report.data["hosts"][host]
    assert entry["status"] == "drift", entry["summary"]
    (drift,) = entry["drift"]
    assert drift["role"] == "hugepages"
    (change,) = drift["changes"]
    assert change["path_or_header"] == "hugepage pools (pages per node)"
    assert change["settings"] == ["node1 2048kB"]
    assert report.junit[(host, "hugepages")][0] == "failure"
    assert "node1 2048kB" in report.junit[(host, "hugepages")][2]
    assert report.junit[(host, "pinned_services")][0] == "pass"
    assert report.prom[("numafleet_host_drift", frozenset({"host": host}.items()))] == 1
    assert (
        report.prom[
            ("numafleet_drift_changes", frozenset({"host": host, "role": "hugepages"}.items()))
        ]
        == 1
    )


def test_removed_unit_is_reported(fleet):
    report = fleet.drift_report
    assert report is not None, fleet.drift.explain()
    host, path = REMOVED[0], "/" + REMOVED[1].split("/", 1)[1]
    entry = report.data["hosts"][host]
    assert entry["status"] == "drift", entry["summary"]
    (drift,) = entry["drift"]
    assert drift["role"] == "pinned_services"
    (change,) = drift["changes"]
    assert change["path_or_header"] == path and change["state"] == "create"
    assert change["removed"] == 0 and change["added"] > 0
    failed = [
        (c["check"], c["subject"], c["detail"]) for c in entry["checks"] if c["status"] == "fail"
    ]
    assert failed == [("rendered_units", "numafleet-vision.service", "1 of 1 file(s) missing")]


def test_untouched_host_stays_clean(fleet):
    report = fleet.drift_report
    assert report is not None, fleet.drift.explain()
    assert sorted(report.data["hosts"]) == sorted([*DRIFTED, CONTROL])
    assert report.data["hosts"][CONTROL]["status"] == "clean"
    assert report.data["totals"] == {
        **report.data["totals"],
        "hosts": 4,
        "clean": 1,
        "drift": 3,
        "fail": 0,
        "unreachable": 0,
        "changes": 3,
    }
    assert report.prom[("numafleet_host_drift", frozenset({"host": CONTROL}.items()))] == 0


def test_bad_measurement_setting_fails_with_the_roles_inputs(fleet):
    """A typo in a drift-only setting is reported by the input pass, with its value and the fix."""
    inventory = fleet.base / "inventories" / "demo"
    env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(fleet.base / "reports-bad")}
    run = ansible_playbook(
        PLAYBOOK, inventory, "--limit", CONTROL, "-e", "numafleet_drift_fail=maybe", env=env
    )
    assert run.rc != 0, run.explain()
    # The plan fails (recorded by the rescue), then the host fails as itself at the end: a failed
    # task fails the host whatever numafleet_drift_fail says.
    failed = [r for r in run.results(CONTROL) if r["status"] == "failed"]
    assert [r["task"] for r in failed] == ["Plan placements", FINAL_TASK], failed
    failed = failed[0]
    assert failed["msg"].startswith(f"host {CONTROL}: numafleet_drift_fail is 'maybe'; use true"), (
        failed
    )
    assert "numafleet_verify_window_s" not in failed["msg"], failed  # only the bad one is named
    # A fractional window is a right value: the input pass lets it through.
    run = ansible_playbook(
        PLAYBOOK, inventory, "--limit", CONTROL, "-e", "numafleet_verify_window_s=0.5", env=env
    )
    assert "Plan placements" not in [
        r["task"] for r in run.results(CONTROL) if r["status"] == "failed"
    ], run.explain()
