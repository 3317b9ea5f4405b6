"""The drift_report callback: a fake result stream in, the three report files out (real parsers)."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.numafleet.tuning.plugins.callback import drift_report
from ansible_collections.numafleet.tuning.plugins.callback.drift_report import (
    FORMAT,
    JUNIT_LAYERS,
    CallbackModule,
    DriftRun,
    as_junit_xml,
    as_prometheus_text,
    diff_changes,
    prune,
    write_report,
)

STARTED = datetime(2025, 1, 31, 12, 0, 0, tzinfo=UTC)
FINISHED = STARTED + timedelta(minutes=2, seconds=5)
UNIT = "/etc/systemd/system/numafleet-embed.service"
UNIT_BEFORE = "[Service]\nCPUAffinity=1-4,65-68\nNUMAPolicy=bind\nNUMAMask=0\n"
UNIT_AFTER = "[Service]\nCPUAffinity=0-63\nNUMAPolicy=bind\nNUMAMask=0\n"
POOLS = "hugepage pools (pages per node)"

MODULES = {
    "hugepages": "numafleet.tuning.numa_hugepages",
    "numa_kernel": "numafleet.tuning.numa_kernel",
    "nvidia_mig": "numafleet.tuning.nvidia_mig",
    "nvidia_mps": "numafleet.tuning.nvidia_mps",
    "pinned_services": "numafleet.tuning.pinned_units",
}


# --- a fake result stream ------------------------------------------------------------------------


class FakeRole:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self, include_role_fqcn: bool = True) -> str:
        return f"numafleet.tuning.{self.name}" if include_role_fqcn else self.name


class FakeTask:
    def __init__(self, name, action, role=None, check_mode=None):
        self._role = FakeRole(role) if role else None
        self.name = f"numafleet.tuning.{role} : {name}" if role else name
        self.action = action
        self.check_mode = check_mode

    def get_name(self) -> str:
        return self.name


class Handler(FakeTask):
    """Named like ansible's Handler: the callback tells handlers by their class name."""


class FakeHost:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


def result(host, task, **data):
    return SimpleNamespace(host=FakeHost(host), task=task, result=data)


def layer_task(role: str, check_mode=True) -> FakeTask:
    return FakeTask("Apply", MODULES[role], role=role, check_mode=check_mode)


def check(host, name, subject, status, measured=None, unit="pct", message="", detail=""):
    return {
        "host": host,
        "check": name,
        "subject": subject,
        "status": status,
        "measured": measured,
        "target": 2,
        "unit": unit,
        "message": message or f"{name} {subject} {status}",
        "detail": detail,
    }


VERIFY = FakeTask("Evaluate the verify checks", "numafleet.tuning.numa_verify")
PLAN = FakeTask("Plan placements", "numafleet.tuning.numa_plan")
FINAL = FakeTask("Fail when drift or verify failures were found", "ansible.builtin.fail")


def feed(callback: CallbackModule, events) -> None:
    for kind, res in events:
        if kind == "failed":
            callback.v2_runner_on_failed(res)
        else:
            getattr(callback, f"v2_runner_on_{kind}")(res)


def clean_events(host: str, layers=tuple(MODULES)) -> list:
    events = [("ok", result(host, PLAN, changed=False))]
    events += [("ok", result(host, layer_task(layer), changed=False)) for layer in layers]
    events += [("skipped", result(host, layer_task(layer), skipped=True)) for layer in MODULES]
    events.append(
        (
            "ok",
            result(
                host,
                VERIFY,
                changed=False,
                checks=[
                    check(host, "rendered_units", "numafleet-embed.service", "pass", unit=""),
                    check(host, "offnode_share", "embed", "pass", 0.5),
                    check(host, "memory_used", "node0", "pass", 41.0),
                    check(host, "memory_used", "node1", "skipped", None),
                ],
            ),
        )
    )
    return events


def drift_events() -> list:
    host = "gpu-a100-01"
    return [
        ("ok", result(host, PLAN, changed=False)),
        (
            "ok",
            result(
                host,
                layer_task("hugepages"),
                changed=True,
                diff=[
                    {
                        "before_header": POOLS,
                        "after_header": POOLS,
                        "before": "node1 2048kB: 4096\n",
                        "after": "node1 2048kB: 8192\n",
                    }
                ],
            ),
        ),
        ("ok", result(host, layer_task("numa_kernel"), changed=False)),
        (
            "ok",
            result(
                host,
                layer_task("pinned_services"),
                changed=True,
                diff=[
                    {
                        "before_header": UNIT,
                        "after_header": UNIT,
                        "before": UNIT_BEFORE,
                        "after": UNIT_AFTER,
                    },
                    {
                        "before_header": "/etc/systemd/system/numafleet-vision.service",
                        "after_header": "/etc/systemd/system/numafleet-vision.service",
                        "before": "",
                        "after": "[Unit]\nDescription=vision\n[Service]\nExecStart=/bin/true\n",
                    },
                ],
            ),
        ),
        # A handler notified by the change: not counted again (in check mode it only predicts).
        (
            "ok",
            result(
                host,
                Handler(
                    "Restart pinned units", "ansible.builtin.systemd_service", "pinned_services"
                ),
                changed=True,
            ),
        ),
        (
            "ok",
            result(
                host,
                VERIFY,
                changed=False,
                checks=[
                    check(
                        host,
                        "rendered_units",
                        "numafleet-embed.service",
                        "fail",
                        unit="",
                        message="1 of 1 file(s) differs",
                        detail="1 of 1 file(s) differs",
                    ),
                    check(host, "offnode_share", "embed", "fail", 7.1, detail="7.1% > 2%"),
                    check(host, "memory_used", "node0", "warn", 85.0),
                ],
            ),
        ),
        ("failed", result(host, FINAL, failed=True, msg="drift on gpu-a100-01")),
    ]


def new_callback(play_vars=None, playbook="playbooks/drift_check.yml") -> CallbackModule:
    callback = CallbackModule()
    callback.v2_playbook_on_start(SimpleNamespace(_file_name=playbook))
    callback.v2_playbook_on_play_start(
        SimpleNamespace(vars={"numafleet_drift_run": True} if play_vars is None else play_vars)
    )
    return callback


def report_of(events, play_vars=None) -> dict:
    callback = new_callback(play_vars)
    feed(callback, events)
    assert callback._run is not None
    return callback._run.as_report(FINISHED)


# --- JSON ----------------------------------------------------------------------------------------


def test_a_clean_run_reports_every_host_clean():
    report = report_of(clean_events("a") + clean_events("b", layers=("hugepages", "numa_kernel")))
    assert report["format"] == FORMAT == "numafleet.tuning/drift-report"
    assert report["version"] == 1
    assert report["finished"] == "2025-01-31T12:02:05Z"
    assert report["playbook"] == os.path.abspath("playbooks/drift_check.yml")
    assert sorted(report["hosts"]) == ["a", "b"]
    for host in ("a", "b"):
        entry = report["hosts"][host]
        assert entry["status"] == "clean"
        assert entry["drift"] == [] and entry["failed_tasks"] == []
        assert len(entry["checks"]) == 4 and entry["verified"] is True
        assert entry["summary"] == f"{host}: clean"
    assert sorted(report["hosts"]["b"]["layers"]) == ["hugepages", "numa_kernel"]
    assert report["totals"] == {
        "hosts": 2,
        "clean": 2,
        "drift": 0,
        "fail": 0,
        "unreachable": 0,
        "changes": 0,
        "checks": {"pass": 6, "fail": 0, "warn": 0, "skipped": 2},
    }
    json.loads(json.dumps(report))  # JSON-ready


def test_drift_names_host_role_file_and_setting():
    report = report_of(drift_events() + clean_events("xeon-01"))
    entry = report["hosts"]["gpu-a100-01"]
    assert entry["status"] == "fail"  # a verify check failed as well
    assert [d["role"] for d in entry["drift"]] == ["hugepages", "pinned_services"]
    pools, units = entry["drift"]
    assert pools["task"] == "numafleet.tuning.hugepages : Apply"
    assert pools["changes"] == [
        {
            "path_or_header": POOLS,
            "state": "update",
            "added": 1,
            "removed": 1,
            "settings": ["node1 2048kB"],
        }
    ]
    assert units["changes"] == [
        {
            "path_or_header": UNIT,
            "state": "update",
            "added": 1,
            "removed": 1,
            "settings": ["CPUAffinity"],
        },
        {
            "path_or_header": "/etc/systemd/system/numafleet-vision.service",
            "state": "create",
            "added": 4,
            "removed": 0,
            "settings": [],
        },
    ]
    # The final task's failure is the run's verdict, not a failure of the host it ran on.
    assert entry["failed_tasks"] == []
    assert "2 change(s) in hugepages, pinned_services" in entry["summary"]
    assert "FAIL offnode_share embed 7.1% > 2%" in entry["summary"]
    assert "CPUAffinity=0-63" not in json.dumps(report)  # a summary, never the text
    assert report["hosts"]["xeon-01"]["status"] == "clean"
    assert report["totals"]["changes"] == 2
    assert report["totals"]["fail"] == 1 and report["totals"]["clean"] == 1


@pytest.mark.parametrize(
    ("events", "status"),
    [
        ([("ok", result("h", layer_task("numa_kernel"), changed=True))], "drift"),
        ([("ok", result("h", layer_task("numa_kernel", check_mode=False), changed=True))], "clean"),
        ([("failed", result("h", PLAN, failed=True, msg="infeasible"))], "fail"),
        (
            [("unreachable", result("h", PLAN, unreachable=True, msg="ssh: no route"))],
            "unreachable",
        ),
        ([("ok", result("h", VERIFY, checks=[check("h", "running", "x", "fail")]))], "fail"),
        (
            [("ok", result("h", VERIFY, checks=[check("h", "memory_used", "node0", "warn")]))],
            "clean",
        ),
    ],
    ids=["changed", "changed-not-in-check-mode", "failed", "unreachable", "check-failed", "warn"],
)
def test_host_status(events, status):
    assert report_of(events)["hosts"]["h"]["status"] == status


def test_plays_without_the_play_variable_are_ignored():
    callback = new_callback(play_vars={"something": True})
    feed(callback, drift_events())
    assert callback._run is None
    callback.v2_playbook_on_stats(SimpleNamespace(processed={"gpu-a100-01": 1}))  # writes nothing


def test_a_failed_task_and_an_unreachable_host_are_reported():
    events = [
        ("failed", result("a", layer_task("hugepages"), failed=True, msg="short grant on node1")),
        ("failed", result("b", PLAN, failed=True, msg="placement embed: no node has 8 CPUs")),
        ("unreachable", result("c", PLAN, unreachable=True, msg="ssh: connect timed out")),
    ]
    report = report_of(events)
    assert report["hosts"]["a"]["failed_tasks"] == [
        {
            "role": "hugepages",
            "task": "numafleet.tuning.hugepages : Apply",
            "msg": "short grant on node1",
        }
    ]
    assert report["hosts"]["a"]["layers"]["hugepages"] == {"results": 1, "changed": 0, "failed": 1}
    assert report["hosts"]["b"]["status"] == "fail"
    assert report["hosts"]["c"]["unreachable"] == {
        "task": "Plan placements",
        "msg": "ssh: connect timed out",
    }
    cases = junit_cases(as_junit_xml(report))
    assert cases[("a", "hugepages")][0] == "failure"
    assert "short grant on node1" in cases[("a", "hugepages")][2]
    assert cases[("b", "verify")][0] == "failure"
    assert "no node has 8 CPUs" in cases[("b", "verify")][2]
    assert cases[("c", "verify")] == ("failure", "c unreachable", "ssh: connect timed out")
    assert cases[("c", "hugepages")][0] == "skipped"


# --- diff summaries ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("diff", "want"),
    [
        (None, []),
        ({}, []),
        (
            {"before_header": "kernel settings", "before": "a: 1\nb: 2\n", "after": "a: 1\nb: 3\n"},
            [
                {
                    "path_or_header": "kernel settings",
                    "state": "update",
                    "added": 1,
                    "removed": 1,
                    "settings": ["b"],
                }
            ],
        ),
        (
            [{"after_header": "/f", "before": "x=1\ny=2\n", "after": ""}],
            [{"path_or_header": "/f", "state": "remove", "added": 0, "removed": 2, "settings": []}],
        ),
        (
            {"before": {"node0": 1}, "after": {"node0": 2}},
            [
                {
                    "path_or_header": "",
                    "state": "update",
                    "added": 1,
                    "removed": 1,
                    "settings": ["node0"],
                }
            ],
        ),
        (
            {"prepared": "--- a\n+++ b\n-Environment=A=1\n+Environment=A=2\n+Nice=5\n"},
            [
                {
                    "path_or_header": "",
                    "state": "update",
                    "added": 2,
                    "removed": 1,
                    "settings": ["Environment", "Nice"],
                }
            ],
        ),
        ([{"before": "same\n", "after": "same\n"}], []),
    ],
    ids=["none", "empty", "settings", "removed-file", "dicts", "prepared", "no-change"],
)
def test_diff_changes(diff, want):
    assert diff_changes(diff) == want


def test_settings_are_capped():
    before = "".join(f"key{i}: 0\n" for i in range(30))
    after = "".join(f"key{i}: 1\n" for i in range(30))
    (change,) = diff_changes({"before": before, "after": after})
    assert len(change["settings"]) == 20 and change["added"] == 30


# --- JUnit ---------------------------------------------------------------------------------------


def junit_cases(text: str) -> dict:
    """{(host, layer): (outcome, message, text)} parsed with xml.etree."""
    root = ET.fromstring(text.encode())
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = {}
    for case in suite.findall("testcase"):
        outcome, message, body = "pass", "", ""
        for tag in ("failure", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome, message, body = tag, found.get("message"), found.text or ""
        cases[(case.get("classname"), case.get("name"))] = (outcome, message, body)
    assert int(suite.get("tests")) == len(cases) == int(root.get("tests"))
    assert int(suite.get("failures")) == sum(v[0] == "failure" for v in cases.values())
    assert int(suite.get("skipped")) == sum(v[0] == "skipped" for v in cases.values())
    return cases


def test_junit_has_one_testcase_per_host_and_layer():
    report = report_of(drift_events() + clean_events("xeon-01", layers=("hugepages",)))
    cases = junit_cases(as_junit_xml(report))
    assert sorted(cases) == sorted(
        (host, layer) for host in ("gpu-a100-01", "xeon-01") for layer in JUNIT_LAYERS
    )
    outcome, message, body = cases[("gpu-a100-01", "pinned_services")]
    assert outcome == "failure"
    assert message == "gpu-a100-01: pinned_services drifted (1 change(s))"
    assert f"{UNIT}: +1 -1 (CPUAffinity)" in body
    assert cases[("gpu-a100-01", "hugepages")][0] == "failure"
    assert f"{POOLS}: +1 -1 (node1 2048kB)" in cases[("gpu-a100-01", "hugepages")][2]
    assert cases[("gpu-a100-01", "numa_kernel")][0] == "pass"
    assert cases[("gpu-a100-01", "nvidia_mig")][0] == "skipped"  # no result for the layer
    verify = cases[("gpu-a100-01", "verify")]
    assert verify[0] == "failure" and "2 verify check(s) failed" in verify[1]
    assert "FAIL offnode_share embed" in verify[2]
    assert cases[("xeon-01", "hugepages")][0] == "pass"
    assert cases[("xeon-01", "verify")][0] == "pass"
    assert cases[("xeon-01", "numa_kernel")][0] == "skipped"


def test_junit_escapes_control_characters():
    report = report_of([("failed", result("h", PLAN, failed=True, msg="bad \x07 byte"))])
    cases = junit_cases(as_junit_xml(report))
    assert "bad \ufffd byte" in cases[("h", "verify")][2]


# --- Prometheus ----------------------------------------------------------------------------------


def samples(text: str) -> dict:
    """{(metric, frozenset(labels)): value} parsed with prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        assert family.documentation, family.name
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def labels(**pairs) -> frozenset:
    return frozenset(pairs.items())


def test_prometheus_text_of_a_drifted_host():
    report = report_of(drift_events() + clean_events("xeon-01", layers=("hugepages",)))
    got = samples(as_prometheus_text(report))
    host = "gpu-a100-01"
    assert got[("numafleet_drift_changes", labels(host=host, role="hugepages"))] == 1
    assert got[("numafleet_drift_changes", labels(host=host, role="pinned_services"))] == 1
    assert got[("numafleet_drift_changes", labels(host=host, role="numa_kernel"))] == 0
    assert ("numafleet_drift_changes", labels(host=host, role="nvidia_mig")) not in got
    assert got[("numafleet_drift_changes", labels(host="xeon-01", role="hugepages"))] == 0
    assert got[("numafleet_host_drift", labels(host=host))] == 1
    assert got[("numafleet_host_drift", labels(host="xeon-01"))] == 0
    assert got[("numafleet_host_status", labels(host=host, status="fail"))] == 1
    assert got[("numafleet_host_status", labels(host=host, status="drift"))] == 0
    assert got[("numafleet_host_status", labels(host="xeon-01", status="clean"))] == 1
    failed = "numafleet_verify_check_failed"
    assert got[(failed, labels(host=host, check="offnode_share", subject="embed"))] == 1
    assert got[(failed, labels(host=host, check="memory_used", subject="node0"))] == 0
    assert got[("numafleet_offnode_share_ratio", labels(host=host, service="embed"))] == (
        pytest.approx(0.071)
    )
    assert got[("numafleet_node_memory_used_ratio", labels(host=host, node="0"))] == 0.85
    assert got[("numafleet_node_memory_used_ratio", labels(host="xeon-01", node="0"))] == 0.41
    # A skipped check has no measurement: no sample rather than a made-up one.
    assert ("numafleet_node_memory_used_ratio", labels(host="xeon-01", node="1")) not in got
    assert got[("numafleet_last_run_timestamp_seconds", frozenset())] == FINISHED.timestamp()


def test_prometheus_text_escapes_label_values():
    events = [
        ("ok", result('we"ird\\host', VERIFY, checks=[check("x", "running", "a\nb", "fail")]))
    ]
    got = samples(as_prometheus_text(report_of(events)))
    key = (
        "numafleet_verify_check_failed",
        labels(host='we"ird\\host', check="running", subject="a\nb"),
    )
    assert got[key] == 1


# --- files on disk -------------------------------------------------------------------------------


def test_write_report_writes_three_parsable_files_and_points_latest(tmp_path):
    report = report_of(drift_events())
    folder = write_report(str(tmp_path), report, FINISHED, keep=3)
    assert os.path.basename(folder) == "20250131T120205Z"
    latest = tmp_path / "latest"
    assert latest.is_symlink() and os.readlink(latest) == "20250131T120205Z"
    assert sorted(os.listdir(latest)) == ["drift.json", "drift.junit.xml", "drift.prom"]
    assert json.loads((latest / "drift.json").read_text()) == report
    junit_cases((latest / "drift.junit.xml").read_text())
    samples((latest / "drift.prom").read_text())
    assert all(not name.startswith(".") for name in os.listdir(tmp_path))  # no temp file left
    again = write_report(str(tmp_path), report, FINISHED, keep=3)  # same second: a new dir
    assert os.path.basename(again) == "20250131T120205Z-1"
    assert os.readlink(latest) == "20250131T120205Z-1"


def test_old_runs_beyond_keep_are_pruned(tmp_path):
    report = report_of(clean_events("a"))
    for minute in range(5):
        write_report(str(tmp_path), report, FINISHED + timedelta(minutes=minute), keep=3)
    (tmp_path / "notes").mkdir()  # not a run directory: left alone
    assert sorted(os.listdir(tmp_path)) == [
        "20250131T120405Z",
        "20250131T120505Z",
        "20250131T120605Z",
        "latest",
        "notes",
    ]
    assert prune(str(tmp_path), 0, "20250131T120605Z") == ["20250131T120405Z", "20250131T120505Z"]
    assert os.readlink(tmp_path / "latest") == "20250131T120605Z"


def stats(*hosts):
    return SimpleNamespace(processed=dict.fromkeys(hosts, 1))


def test_callback_writes_the_report_at_the_end(tmp_path, monkeypatch):
    callback = new_callback()
    options = {"report_dir": str(tmp_path / "reports"), "keep": 2}
    monkeypatch.setattr(callback, "get_option", options.__getitem__)
    shown = []
    monkeypatch.setattr(callback._display, "display", lambda msg, *a, **k: shown.append(msg))
    feed(callback, clean_events("a"))
    callback.v2_playbook_on_stats(stats("a", "b"))  # b: in the recap, nothing else known
    report = json.loads((tmp_path / "reports" / "latest" / "drift.json").read_text())
    assert report["hosts"]["a"]["status"] == "clean"
    assert report["hosts"]["b"]["status"] == "clean" and report["hosts"]["b"]["verified"] is False
    assert junit_cases((tmp_path / "reports" / "latest" / "drift.junit.xml").read_text())[
        ("b", "verify")
    ][0] == ("skipped")
    assert shown and "2 host(s), 2 clean" in shown[-1]


def test_callback_warns_when_it_cannot_write(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    callback = new_callback()
    options = {"report_dir": str(blocker / "reports"), "keep": 2}
    monkeypatch.setattr(callback, "get_option", options.__getitem__)
    warned = []
    monkeypatch.setattr(callback._display, "warning", lambda msg, *a, **k: warned.append(msg))
    feed(callback, clean_events("a"))
    callback.v2_playbook_on_stats(stats("a"))
    assert len(warned) == 1
    assert (
        "cannot write the drift report" in warned[0] and "NUMAFLEET_DRIFT_REPORT_DIR" in warned[0]
    )


def test_documented_options():
    doc = yaml.safe_load(drift_report.DOCUMENTATION)
    assert doc["type"] == "aggregate" and doc["name"] == "drift_report"
    options = doc["options"]
    assert options["report_dir"]["default"] == "./reports/drift"
    assert options["report_dir"]["env"] == [{"name": "NUMAFLEET_DRIFT_REPORT_DIR"}]
    assert options["report_dir"]["ini"] == [
        {"section": "numafleet_drift_report", "key": "report_dir"}
    ]
    assert options["keep"]["default"] == 10 and options["keep"]["type"] == "int"
    assert options["keep"]["env"] == [{"name": "NUMAFLEET_DRIFT_REPORT_KEEP"}]
    assert CallbackModule.CALLBACK_NEEDS_ENABLED is True
    assert CallbackModule.CALLBACK_TYPE == "aggregate"


def test_drift_run_records_checks_only_as_mappings():
    run = DriftRun(STARTED, ["inventories/demo"], "drift_check.yml")
    run.checks("h", [check("h", "running", "x", "pass"), "junk"])
    report = run.as_report(FINISHED)
    assert report["inventory"] == ["inventories/demo"]
    assert len(report["hosts"]["h"]["checks"]) == 1


def test_the_change_plan_of_the_plan_task_is_in_the_report():
    lines = [
        "a: change plan: 0 added, 1 moved, 0 removed, 2 kept",
        "  restart: numafleet-x.service",
    ]
    events = clean_events("a")
    events[0] = ("ok", result("a", PLAN, changed=False, changes=lines))
    report = report_of(events + clean_events("b"))
    assert report["hosts"]["a"]["change_plan"] == lines
    assert report["hosts"]["b"]["change_plan"] == []  # the plan task carried none


# --- numafleet.tuning.host_apply: every layer in one result ----------------------------------------

APPLY = FakeTask("Check the placements", "numafleet.tuning.host_apply", check_mode=True)


def test_one_apply_result_gives_each_layer_its_result_and_drift():
    """The same report as five role results: layers named after the roles, drift per layer."""
    pools_diff = {
        "before_header": POOLS,
        "after_header": POOLS,
        "before": "node1 2048kB: 4096\n",
        "after": "node1 2048kB: 8192\n",
    }
    unit_diff = {"before_header": UNIT, "after_header": UNIT, "before": UNIT_BEFORE,
                 "after": UNIT_AFTER}  # fmt: skip
    layers = {
        "hugepages": {"changed": True, "diff": [pools_diff]},
        "kernel": {"changed": False},
        "units": {"changed": True, "diff": [unit_diff]},
    }
    apply_result = result("gpu-a100-01", APPLY, changed=True, layers=layers, diff=[])
    report = report_of([("ok", result("gpu-a100-01", PLAN, changed=False)), ("ok", apply_result)])
    entry = report["hosts"]["gpu-a100-01"]
    assert entry["status"] == "drift"
    assert sorted(entry["layers"]) == ["hugepages", "numa_kernel", "pinned_services"]
    assert entry["layers"]["numa_kernel"] == {"results": 1, "changed": 0, "failed": 0}
    assert [d["role"] for d in entry["drift"]] == ["hugepages", "pinned_services"]
    pools, units = entry["drift"]
    assert pools["task"] == units["task"] == "Check the placements"
    assert pools["changes"][0]["settings"] == ["node1 2048kB"]
    assert units["changes"][0]["settings"] == ["CPUAffinity"]


def test_a_failed_apply_is_reported_on_its_layer():
    failed = result(
        "h", APPLY, failed=True, msg="host h: mig: GPU busy", layer="mig",
        layers={"hugepages": {"changed": False}},
    )  # fmt: skip
    entry = report_of([("failed", failed)])["hosts"]["h"]
    assert entry["status"] == "fail"
    assert entry["layers"]["nvidia_mig"] == {"results": 1, "changed": 0, "failed": 1}
    assert entry["layers"]["hugepages"]["failed"] == 0
    assert entry["failed_tasks"] == [
        {"role": "nvidia_mig", "task": "Check the placements", "msg": "host h: mig: GPU busy"}
    ]


def test_an_apply_outside_check_mode_is_no_drift():
    applied = FakeTask("Apply the placements", "numafleet.tuning.host_apply", check_mode=False)
    data = {"changed": True, "layers": {"units": {"changed": True, "diff": []}}}
    entry = report_of([("ok", result("h", applied, **data))])["hosts"]["h"]
    assert entry["status"] == "clean" and entry["drift"] == []
