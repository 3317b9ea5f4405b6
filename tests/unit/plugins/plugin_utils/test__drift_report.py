"""The drift report model (plugin_utils/_drift_report.py): registered results in, three files out."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.numafleet.tuning.plugins.plugin_utils._drift_report import (
    FORMAT,
    JUNIT_LAYERS,
    VERSION,
    DriftRun,
    add_host,
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
VISION = "/etc/systemd/system/numafleet-vision.service"
POOLS = "hugepage pools (pages per node)"
TASK = "Check the placements"


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


def clean_checks(host):
    return [
        check(host, "rendered_units", "numafleet-embed.service", "pass", unit=""),
        check(host, "offnode_share", "embed", "pass", 0.5),
        check(host, "memory_used", "node0", "pass", 41.0),
        check(host, "memory_used", "node1", "skipped", None),
    ]


def clean(host, layers=("hugepages", "kernel", "mig", "mps", "units")):
    return {
        "plan": {"changed": False, "changes": []},
        "apply": {"changed": False, "layers": {name: {"changed": False} for name in layers}},
        "verify": {
            "checks": clean_checks(host),
            "status_text": "pass (1 of 4 checks not run)",
        },
    }


def drifted():
    host = "gpu-a100-01"
    pools = {"before_header": POOLS, "after_header": POOLS, "before": "node1 2048kB: 4096\n",
             "after": "node1 2048kB: 8192\n"}  # fmt: skip
    unit = {"before_header": UNIT, "after_header": UNIT, "before": UNIT_BEFORE,
            "after": UNIT_AFTER}  # fmt: skip
    vision = {"before_header": VISION, "after_header": VISION, "before": "",
              "after": "[Unit]\nDescription=vision\n[Service]\nExecStart=/bin/true\n"}  # fmt: skip
    return {
        "plan": {"changes": []},
        "apply": {
            "changed": True,
            "layers": {
                "hugepages": {"changed": True, "diff": [pools]},
                "kernel": {"changed": False},
                "units": {"changed": True, "diff": [unit, vision]},
            },
        },
        "verify": {
            "checks": [
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
            ],  # fmt: skip
        },
    }


def report_of(hosts: dict, playbook="/p/playbooks/drift_check.yml") -> dict:
    run = DriftRun(STARTED, ["/p/inventories/demo"], playbook)
    for name, results in hosts.items():
        add_host(run, name, **results)
    return run.as_report(FINISHED)


# --- JSON ----------------------------------------------------------------------------------------


def test_a_clean_run_reports_every_host_clean():
    report = report_of({"a": clean("a"), "b": clean("b", layers=("hugepages", "kernel"))})
    assert report["format"] == FORMAT == "numafleet.tuning/drift-report"
    assert report["version"] == VERSION == 2
    assert report["started"] == "2025-01-31T12:00:00Z"
    assert report["finished"] == "2025-01-31T12:02:05Z"
    assert report["playbook"] == "/p/playbooks/drift_check.yml"
    assert sorted(report["hosts"]) == ["a", "b"]
    for host in ("a", "b"):
        entry = report["hosts"][host]
        assert entry["status"] == "clean"
        assert entry["drift"] == [] and entry["failed_tasks"] == []
        assert len(entry["checks"]) == 4 and entry["verified"] is True
        assert entry["verify_status"] == "pass (1 of 4 checks not run)"
        assert entry["checks_not_run"] == 1
        assert entry["summary"] == f"{host}: clean; verify pass (1 of 4 checks not run)"
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
    report = report_of({"gpu-a100-01": drifted(), "xeon-01": clean("xeon-01")})
    entry = report["hosts"]["gpu-a100-01"]
    assert entry["status"] == "fail"  # offnode_share failed as well: not a state check
    assert [d["role"] for d in entry["drift"]] == ["hugepages", "pinned_services"]
    pools, units = entry["drift"]
    assert pools["task"] == units["task"] == TASK
    assert pools["changes"] == [
        {"path_or_header": POOLS, "state": "update", "added": 1, "removed": 1,
         "settings": ["node1 2048kB"]}
    ]  # fmt: skip
    assert units["changes"] == [
        {"path_or_header": UNIT, "state": "update", "added": 1, "removed": 1,
         "settings": ["CPUAffinity"]},
        {"path_or_header": VISION, "state": "create", "added": 4, "removed": 0, "settings": []},
    ]  # fmt: skip
    assert entry["failed_tasks"] == []
    assert "3 change(s) in hugepages, pinned_services" in entry["summary"]
    assert "FAIL offnode_share embed 7.1% > 2%" in entry["summary"]
    assert "CPUAffinity=0-63" not in json.dumps(report)  # a summary, never the text
    assert report["hosts"]["xeon-01"]["status"] == "clean"
    assert report["totals"]["changes"] == 2
    assert report["totals"]["fail"] == 1 and report["totals"]["clean"] == 1


def test_a_hand_edited_unit_is_drift_not_fail():
    """The rendered_units check fails with the units layer's change: both say drift."""
    results = drifted()
    results["verify"]["checks"] = [
        c for c in results["verify"]["checks"] if c["check"] != "offnode_share"
    ]
    entry = report_of({"h": results})["hosts"]["h"]
    assert entry["status"] == "drift", entry["summary"]
    assert "FAIL rendered_units numafleet-embed.service" in entry["summary"]


@pytest.mark.parametrize(
    ("results", "status"),
    [
        ({"apply": {"layers": {"kernel": {"changed": True}}}}, "drift"),
        (
            {"apply": {"layers": {"units": {"changed": False, "foreign_overrides": ["/x.conf"]}}}},
            "drift",
        ),
        ({"apply": {"layers": {"irq": {"changed": True, "diff": []}}}}, "drift"),
        ({"verify": {"checks": [check("h", "effective_units", "x", "fail")]}}, "drift"),
        ({"verify": {"checks": [check("h", "hugepage_pools", "node0", "fail")]}}, "drift"),
        (
            {"verify": {"checks": [check("h", "gpu_partitions", "GPU 0000:e3:00.0", "fail")]}},
            "drift",
        ),
        (
            {"verify": {"checks": [check("h", "gpu_partitions", "GPU 0000:e3:00.0", "warn")]}},
            "clean",
        ),
        ({"failure": {"task": "Plan placements", "msg": "infeasible", "layer": ""}}, "fail"),
        (
            {"unreachable": {"task": "Gather NUMA and GPU topology", "msg": "ssh: no route"}},
            "unreachable",
        ),
        ({"verify": {"checks": [check("h", "running", "x", "fail")]}}, "fail"),
        ({"verify": {"checks": [check("h", "memory_used", "node0", "warn")]}}, "clean"),
        (
            {"apply": {"unreachable": True, "msg": "gone", "layers": {"units": {"changed": True}}}},
            "clean",
        ),
        ({}, "clean"),
    ],  # fmt: skip
    ids=[
        "changed",
        "foreign-override",
        "new-layer",
        "effective-units-check",
        "pool-check",
        "amd-partition-check",
        "amd-pending-reset",
        "failed-task",
        "unreachable",
        "runtime-check-failed",
        "warn",
        "apply-unreachable-no-result",
        "nothing",
    ],  # fmt: skip
)
def test_host_status(results, status):
    assert report_of({"h": results})["hosts"]["h"]["status"] == status


def test_foreign_overrides_are_drift_of_their_layer_with_the_file_named():
    foreign = [
        {"path": "/etc/systemd/system/numafleet-embed.service.d/override.conf",
         "settings": ["NUMAPolicy", "CPUAffinity"]},
        "/run/systemd/system.control/numafleet-embed.service.d/50-AllowedCPUs.conf",
    ]  # fmt: skip
    results = {"apply": {"layers": {"units": {"changed": False, "foreign_overrides": foreign}}}}
    report = report_of({"h": results})
    (drift,) = report["hosts"]["h"]["drift"]
    assert drift["role"] == "pinned_services"
    assert drift["changes"] == [
        {"path_or_header": foreign[0]["path"], "state": "foreign", "added": 0, "removed": 0,
         "settings": ["CPUAffinity", "NUMAPolicy"]},
        {"path_or_header": foreign[1], "state": "foreign", "added": 0, "removed": 0,
         "settings": []},
    ]  # fmt: skip
    cases = junit_cases(as_junit_xml(report))
    assert cases[("h", "pinned_services")][0] == "failure"
    assert (
        f"{foreign[0]['path']}: foreign override (CPUAffinity, NUMAPolicy)"
        in cases[("h", "pinned_services")][2]
    )


def test_a_failed_task_and_an_unreachable_host_are_reported():
    hosts = {
        "a": {
            "apply": {"failed": True, "msg": "short grant on node1", "layer": "hugepages",
                      "layers": {}},
            "failure": {"task": TASK, "msg": "short grant on node1", "layer": "hugepages"},
        },
        "b": {"failure": {"task": "Plan placements", "msg": "placement embed: no node has 8 CPUs"}},
        "c": {"unreachable": {"task": "Gather NUMA and GPU topology",
                              "msg": "ssh: connect timed out"}},
    }  # fmt: skip
    report = report_of(hosts)
    assert report["hosts"]["a"]["failed_tasks"] == [
        {"role": "hugepages", "task": TASK, "msg": "short grant on node1"}
    ]
    assert report["hosts"]["a"]["layers"]["hugepages"] == {"results": 1, "changed": 0, "failed": 1}
    assert report["hosts"]["b"]["status"] == "fail"
    assert report["hosts"]["c"]["unreachable"] == {
        "task": "Gather NUMA and GPU topology",
        "msg": "ssh: connect timed out",
    }
    assert report["totals"]["unreachable"] == 1 and report["totals"]["fail"] == 2
    cases = junit_cases(as_junit_xml(report))
    assert cases[("a", "hugepages")][0] == "failure"
    assert "short grant on node1" in cases[("a", "hugepages")][2]
    assert cases[("b", "verify")][0] == "failure"
    assert "no node has 8 CPUs" in cases[("b", "verify")][2]
    assert cases[("c", "verify")] == ("failure", "c unreachable", "ssh: connect timed out")
    assert cases[("c", "hugepages")][0] == "skipped"


def test_the_change_plan_of_the_plan_result_is_in_the_report():
    lines = [
        "a: change plan: 0 added, 1 moved, 0 removed, 2 kept",
        "  restart: numafleet-x.service",
    ]
    a = clean("a")
    a["plan"] = {"changes": lines}
    report = report_of({"a": a, "b": clean("b")})
    assert report["hosts"]["a"]["change_plan"] == lines
    assert report["hosts"]["b"]["change_plan"] == []


def test_checks_are_recorded_only_as_mappings():
    run = DriftRun(STARTED, ["inventories/demo"], "drift_check.yml")
    run.checks("h", [check("h", "running", "x", "pass"), "junk"])
    report = run.as_report(FINISHED)
    assert report["inventory"] == ["inventories/demo"]
    assert len(report["hosts"]["h"]["checks"]) == 1


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
        (
            # The MIG layer: a GPU instance removed from the recording, to be created again.
            {
                "before_header": "GPU 0000:17:00.0",
                "before": "mode enabled\n2g.20gb@0 (GI 3, CI 0 2g.20gb)\n",
                "after": "mode enabled\n2g.20gb@0 (GI 3, CI 0 2g.20gb)\n"
                "3g.40gb@4 (GI new, CI new 3g.40gb)\n",
            },
            [
                {
                    "path_or_header": "GPU 0000:17:00.0",
                    "state": "update",
                    "added": 1,
                    "removed": 0,
                    "settings": ["GPU 0000:17:00.0 3g.40gb@4"],
                }
            ],
        ),
        (
            {
                "before_header": "GPU 0000:31:00.0",
                "before": "mode disabled\n",
                "after": "mode disabled (pending enabled)\n",
            },
            [
                {
                    "path_or_header": "GPU 0000:31:00.0",
                    "state": "update",
                    "added": 1,
                    "removed": 1,
                    "settings": ["GPU 0000:31:00.0 MIG mode"],
                }
            ],
        ),
    ],
    ids=[
        "none",
        "empty",
        "settings",
        "removed-file",
        "dicts",
        "prepared",
        "no-change",
        "mig",
        "mig-mode",
    ],  # fmt: skip
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
    report = report_of({"gpu-a100-01": drifted(), "xeon-01": clean("xeon-01", ("hugepages",))})
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


def test_junit_has_a_testcase_for_a_layer_without_a_role():
    report = report_of({"h": {"apply": {"layers": {"irq": {"changed": True, "diff": []}}}}})
    cases = junit_cases(as_junit_xml(report))
    assert cases[("h", "irq")][0] == "failure"


def test_junit_escapes_control_characters():
    report = report_of({"h": {"failure": {"task": "Plan placements", "msg": "bad \x07 byte"}}})
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
    report = report_of({"gpu-a100-01": drifted(), "xeon-01": clean("xeon-01", ("hugepages",))})
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
    assert ("numafleet_node_memory_used_ratio", labels(host="xeon-01", node="1")) not in got
    assert got[("numafleet_last_run_timestamp_seconds", frozenset())] == FINISHED.timestamp()


def test_prometheus_text_escapes_label_values():
    host = 'we"ird\\host'
    results = {"verify": {"checks": [check("x", "running", "a\nb", "fail")]}}
    got = samples(as_prometheus_text(report_of({host: results})))
    key = ("numafleet_verify_check_failed", labels(host=host, check="running", subject="a\nb"))
    assert got[key] == 1


# --- files on disk -------------------------------------------------------------------------------


def test_write_report_writes_three_parsable_files_and_points_latest(tmp_path):
    report = report_of({"gpu-a100-01": drifted()})
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
    report = report_of({"a": clean("a")})
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


def test_a_layer_that_differs_from_the_plan_without_a_change_is_drift_on_its_layer():
    """host_apply's drift list: a held pool is drift; a pending entry (a layout a later step
    creates) is not."""
    header = "hugepage pools not as planned (pages per node)"
    held = {"before_header": header, "after_header": header, "before": "node0 2048kB: 8192\n",
            "after": "node0 2048kB: 4096\n"}  # fmt: skip
    layers = {
        "hugepages": {"changed": False, "diff": [held],
                      "drift": [{"setting": "node0 2048kB pages", "pending": False}]},
        "mig": {"changed": False, "diff": [],
                "drift": [{"setting": "GPU 0000:17:00.0 MIG layout", "pending": True}]},
        "kernel": {"changed": False, "drift": []},
    }  # fmt: skip
    entry = report_of({"h": {"apply": {"changed": False, "layers": layers}}})["hosts"]["h"]
    assert entry["status"] == "drift"
    assert [d["role"] for d in entry["drift"]] == ["hugepages"]
    assert entry["drift"][0]["changes"][0]["settings"] == ["node0 2048kB"]
    assert entry["layers"]["hugepages"]["changed"] == 1
    assert entry["layers"]["nvidia_mig"]["changed"] == 0


def test_foreign_changes_name_the_env_file_and_unreadable_files():
    from ansible_collections.numafleet.tuning.plugins.plugin_utils._drift_report import (
        foreign_changes,
    )

    dropin = "/etc/systemd/system/numafleet-rerank-a.service.d/env.conf"
    changes = foreign_changes(
        [
            {
                "unit": "numafleet-rerank-a.service",
                "property": "Environment.CUDA_VISIBLE_DEVICES",
                "planned": "MIG-1",
                "effective": "0\x00",
                "source": dropin,
                "detail": "EnvironmentFile=/etc/default/rerank",
            },
            {
                "unit": "numafleet-whisper.service",
                "property": "(unreadable)",
                "planned": None,
                "effective": None,
                "source": "/etc/systemd/system/numafleet-whisper.service.d/link.conf",
                "detail": "is a symbolic link to ../x.conf: leads out of the root",
            },
        ]
    )
    assert [c["path_or_header"] for c in changes] == [
        dropin,
        "/etc/systemd/system/numafleet-whisper.service.d/link.conf",
    ]
    assert changes[0]["settings"] == [
        "numafleet-rerank-a.service Environment.CUDA_VISIBLE_DEVICES: planned MIG-1, effective "
        "0\\x00 (EnvironmentFile=/etc/default/rerank)"
    ]
    assert changes[1]["settings"] == [
        "numafleet-whisper.service: cannot be read (is a symbolic link to ../x.conf: leads out "
        "of the root)"
    ]
    assert all(c["state"] == "foreign" for c in changes)
