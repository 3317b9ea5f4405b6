# Private to this collection: may change in any release.
"""The drift report of one run of playbooks/drift_check.yml: model, files and run directories.

Used on the controller by the action numafleet.tuning.drift_report (run once per play, from the
results every host registered). Schema of drift.json: ``plugins/modules/drift_report.py``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.effective import escape_text
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.verify import (
    EFFECTIVE_DIFFER,
    _xml_text,
    prometheus_lines,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils._reports import write_atomic

FORMAT = "numafleet.tuning/drift-report"
# Version 2 (issue 21): the report is written by the playbook (action drift_report), a failed
# state check (DRIFT_CHECKS) or foreign override is drift rather than fail, changes entries may have
# state "foreign", hosts have "verify_status" and "checks_not_run".
VERSION = 2
FILES = ("drift.json", "drift.junit.xml", "drift.prom")
# Layer (role short name) -> the module whose result is the layer's result.
LAYERS = {
    "hugepages": "numa_hugepages",
    "numa_kernel": "numa_kernel",
    "nvidia_gpu": "nvidia_gpu_settings",
    "amd_partition": "amd_partition",
    "nvidia_mig": "nvidia_mig",
    "nvidia_mps": "nvidia_mps",
    "pinned_services": "pinned_units",
}
JUNIT_LAYERS = tuple(LAYERS) + ("verify",)
# numafleet.tuning.host_apply runs every layer in one execution: its result's ``layers`` holds
# each layer's result under these names (a layer not named here keeps its own name).
APPLY_LAYERS = {
    "hugepages": "hugepages",
    "kernel": "numa_kernel",
    "gpu": "nvidia_gpu",
    "amd": "amd_partition",
    "mig": "nvidia_mig",
    "mps": "nvidia_mps",
    "units": "pinned_services",
}
STATUSES = ("clean", "drift", "fail", "unreachable")
# Verify checks that compare the host's state with the plan: what site.yml would change (or a
# foreign override of a planned value). When one fails the host drifted; any other failed check
# (or a failed task) makes the host fail.
DRIFT_CHECKS = frozenset(
    (
        "rendered_units",
        "effective_units",
        "hugepage_pools",
        "kernel_settings",
        "mig_layout",
        "mps_settings",
        "irq_affinity",
        # AMD partition modes or a visible device against the plan (verify.partition_checks).
        "gpu_partitions",
    )
)
CHECK_STATUSES = ("pass", "fail", "warn", "skipped")
RUN_DIR = re.compile(r"^[0-9]{8}T[0-9]{6}Z(-[0-9]+)?\Z")
_SETTING = re.compile(r"^\s*\"?([A-Za-z_][A-Za-z0-9_.\-/ ]*?)\"?\s*(?::\s|:$|=)")
_MAX_SETTINGS = 20
_MAX_MSG = 500
_SUMMARY_ITEMS = 5

METRICS = {
    "numafleet_drift_changes": "Number of tasks of a role that would change the host (check mode)",
    "numafleet_host_drift": "1 when the drift check found a change to make on the host, else 0",
    "numafleet_host_status": "1 for the host's drift check status (clean, drift, fail, "
    "unreachable), 0 for the others",
    "numafleet_verify_check_failed": "1 when the verify check failed in the drift run, else 0",
    "numafleet_offnode_share_ratio": "Share of a service's anonymous and hugetlb memory on nodes "
    "outside its planned mems (0-1)",
    "numafleet_node_memory_used_ratio": "Used / total memory of a NUMA node (0-1); used = "
    "MemTotal - MemFree - file LRU pages",
    "numafleet_last_run_timestamp_seconds": "Unix time the drift run finished",
}


# --- the run's data ---------------------------------------------------------------------------


def utc_iso(when: datetime) -> str:
    """ISO 8601 UTC text of ``when`` with a Z suffix, to the second."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"


def _mig_setting(line: str) -> str:
    """The setting a MIG diff line names: "MIG mode" for its mode line, else the GPU instance
    as profile@placement start ("3g.40gb@4" of "3g.40gb@4 (GI 2, CI 0 3g.40gb)")."""
    if line.startswith("mode "):
        return "MIG mode"
    return line.split(" ", 1)[0]


def diff_changes(diff) -> list:
    """[{path_or_header, state, added, removed, settings}] of a diff (a dict or a list of dicts)."""
    entries = diff if isinstance(diff, list) else [diff] if isinstance(diff, dict) else []
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        header = str(entry.get("after_header") or entry.get("before_header") or "")
        if "prepared" in entry:
            state = "update"
            lines = [
                line
                for line in _text(entry["prepared"]).splitlines()
                if not line.startswith(("+++", "---"))
            ]
        elif "before" in entry or "after" in entry:
            before, after = _text(entry.get("before")), _text(entry.get("after"))
            state = "create" if not before else "remove" if not after else "update"
            lines = list(
                difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            )[2:]
        else:
            continue
        added = [line[1:] for line in lines if line.startswith("+")]
        removed = [line[1:] for line in lines if line.startswith("-")]
        if not added and not removed and not header:
            continue
        names = set()
        if header.startswith("GPU "):  # the MIG layer: "mode ..." and "<profile>@<start> (GI ..)"
            names = {f"{header} {_mig_setting(line)}" for line in added + removed}
        elif state == "update":  # a whole file created or removed: its path says it all
            names = {m.group(1).strip() for m in map(_SETTING.match, added + removed) if m}
        out.append(
            {
                "path_or_header": header,
                "state": state,
                "added": len(added),
                "removed": len(removed),
                "settings": sorted(names)[:_MAX_SETTINGS],
            }
        )
    return out


def foreign_changes(foreign) -> list:
    """[{path_or_header, state: "foreign", added, removed, settings}] of a layer's
    ``foreign_overrides`` (a list of file paths, or of dicts naming the file and its settings)."""
    out = []
    for item in foreign or ():
        if isinstance(item, dict) and item.get("property"):
            # The units layer's shape: {unit, property, planned, effective, source, detail?};
            # property "(unreadable)" for a file systemd reads that could not be read.
            planned, effective = item.get("planned"), item.get("effective")
            path = item.get("source") or ""
            detail = f" ({item['detail']})" if item.get("detail") else ""
            if item.get("property") == "(unreadable)":
                names = [f"{item.get('unit')}: cannot be read{detail}"]
            else:
                names = [
                    f"{item.get('unit')} {item.get('property')}: planned "
                    f"{'(unset)' if planned is None else planned}, effective "
                    f"{'(unset)' if effective is None else effective}{detail}"
                ]
            names = [escape_text(name) for name in names]
        elif isinstance(item, dict):
            path = item.get("path") or item.get("file") or item.get("source") or ""
            names = item.get("settings") or item.get("properties") or item.get("setting") or ()
            if isinstance(names, dict):
                names = list(names)
            elif isinstance(names, str):
                names = [names]
        else:
            path, names = item, ()
        out.append(
            {
                "path_or_header": str(path),
                "state": "foreign",
                "added": 0,
                "removed": 0,
                "settings": sorted({str(name) for name in names})[:_MAX_SETTINGS],
            }
        )
    return out


def _new_host() -> dict:
    return {
        "unreachable": None,
        "drift": [],
        "checks": None,
        "failed_tasks": [],
        "layers": {},
        "change_plan": [],
        "verify_status": "",
    }


class DriftRun:
    """What one drift run found, fed task by task; ``as_report`` turns it into the JSON report."""

    def __init__(self, started: datetime, inventory=(), playbook: str = "") -> None:
        self.started = started
        self.inventory = [str(source) for source in inventory]
        self.playbook = str(playbook)
        self.hosts: dict = {}

    def host(self, name: str) -> dict:
        """The record of host ``name`` (created empty the first time)."""
        return self.hosts.setdefault(str(name), _new_host())

    def layer_result(self, host: str, layer: str, changed: bool, failed: bool = False) -> None:
        """Note that the module of ``layer`` returned a result on ``host``."""
        seen = self.host(host)["layers"].setdefault(
            layer, {"results": 0, "changed": 0, "failed": 0}
        )
        seen["results"] += 1
        seen["changed"] += int(bool(changed))
        seen["failed"] += int(bool(failed))

    def changed(self, host: str, role: str, task: str, diff=None, foreign=()) -> None:
        """A task of ``role`` that would change ``host`` (check mode), with its diff if any, or
        that found foreign overrides (``foreign_overrides`` of the layer's result)."""
        self.host(host)["drift"].append(
            {
                "role": str(role),
                "task": str(task),
                "changes": diff_changes(diff) + foreign_changes(foreign),
            }
        )

    def checks(self, host: str, checks, status_text: str = "") -> None:
        """The verify checks of ``host`` (numa_verify's ``checks`` list and ``status_text``)."""
        record = self.host(host)
        record["checks"] = [dict(check) for check in checks or () if isinstance(check, dict)]
        record["verify_status"] = str(status_text or "")

    def change_plan(self, host: str, lines) -> None:
        """What site.yml would do on ``host`` (numa_plan's ``changes`` lines)."""
        self.host(host)["change_plan"] = [str(line) for line in lines or ()]

    def failed(self, host: str, role: str, task: str, msg) -> None:
        """A task that failed on ``host``."""
        text = str(msg or "")
        if len(text) > _MAX_MSG:
            text = text[: _MAX_MSG - 3] + "..."
        self.host(host)["failed_tasks"].append({"role": str(role), "task": str(task), "msg": text})

    def unreachable(self, host: str, task: str, msg) -> None:
        """``host`` could not be reached (the first time counts)."""
        record = self.host(host)
        if record["unreachable"] is None:
            record["unreachable"] = {"task": str(task), "msg": str(msg or "")[:_MAX_MSG]}

    def as_report(self, finished: datetime) -> dict:
        """The JSON-ready report (schema in DOCUMENTATION)."""
        hosts = {}
        totals = dict.fromkeys(STATUSES, 0)
        changes = 0
        check_totals = dict.fromkeys(CHECK_STATUSES, 0)
        for name in sorted(self.hosts):
            record = self.hosts[name]
            checks = record["checks"] or []
            failed_checks = [c for c in checks if c.get("status") == "fail"]
            drift_checks = [
                c
                for c in failed_checks
                if c.get("check") in DRIFT_CHECKS or c.get("detail") == EFFECTIVE_DIFFER
            ]
            if record["unreachable"] is not None:
                status = "unreachable"
            elif record["failed_tasks"] or len(drift_checks) < len(failed_checks):
                status = "fail"
            elif record["drift"] or drift_checks:
                status = "drift"
            else:
                status = "clean"
            totals[status] += 1
            changes += len(record["drift"])
            for check in checks:
                if check.get("status") in check_totals:
                    check_totals[check["status"]] += 1
            hosts[name] = {
                "status": status,
                "summary": _summary(name, status, record, failed_checks),
                "drift": record["drift"],
                "checks": checks,
                "failed_tasks": record["failed_tasks"],
                "unreachable": record["unreachable"],
                "layers": {layer: dict(seen) for layer, seen in sorted(record["layers"].items())},
                "verified": record["checks"] is not None,
                "change_plan": record["change_plan"],
                "verify_status": record["verify_status"],
                "checks_not_run": sum(1 for c in checks if c.get("status") == "skipped"),
            }
        return {
            "format": FORMAT,
            "version": VERSION,
            "started": utc_iso(self.started),
            "finished": utc_iso(finished),
            "inventory": list(self.inventory),
            "playbook": self.playbook,
            "hosts": hosts,
            "totals": {"hosts": len(hosts), **totals, "changes": changes, "checks": check_totals},
        }


def _summary(name: str, status: str, record: dict, failed_checks: list) -> str:
    parts = [f"{name}: {status}"]
    if record["unreachable"] is not None:
        parts.append(f"unreachable: {record['unreachable']['msg']}")
    roles = sorted({entry["role"] for entry in record["drift"]})
    if roles:
        count = sum(len(entry["changes"]) or 1 for entry in record["drift"])
        parts.append(f"{count} change(s) in {', '.join(roles)}")
    if record.get("verify_status"):
        parts.append(f"verify {record['verify_status']}")
    for task in record["failed_tasks"][:_SUMMARY_ITEMS]:
        where = f"{task['role']} : {task['task']}" if task["role"] else task["task"]
        parts.append(f"FAILED {where}: {task['msg']}")
    for check in failed_checks[:_SUMMARY_ITEMS]:
        detail = f" {check.get('detail')}" if check.get("detail") else ""
        parts.append(f"FAIL {check.get('check')} {check.get('subject')}{detail}")
    if len(failed_checks) > _SUMMARY_ITEMS:
        parts.append(f"and {len(failed_checks) - _SUMMARY_ITEMS} more failed check(s)")
    return "; ".join(parts)


def _role_of(layer) -> str:
    """The report's name of a host_apply layer (its role's short name; others keep theirs)."""
    name = str(layer or "")
    return APPLY_LAYERS.get(name, name)


def add_host(
    run: DriftRun,
    host: str,
    plan=None,
    apply=None,
    verify=None,
    failure=None,
    unreachable=None,
    apply_task: str = "Check the placements",
) -> None:
    """Record what ``host`` registered in one drift play (all plain dicts, each may be None).

    ``plan`` is numa_plan's result (its ``changes`` lines), ``apply`` host_apply's check-mode
    result (``layers``: a layer that reports ``changed``, a non-pending entry in its ``drift`` list
    or a non-empty ``foreign_overrides`` is drift of that layer; ``layer`` names the layer of a failed apply), ``verify`` numa_verify's
    result (``checks``, ``status_text``), ``failure`` {task, msg, layer} of the task that failed on
    the host, ``unreachable`` {task, msg} when the host could not be reached.
    """
    run.host(host)
    if unreachable:
        run.unreachable(host, unreachable.get("task"), unreachable.get("msg"))
        return
    if isinstance(plan, dict) and isinstance(plan.get("changes"), list):
        run.change_plan(host, plan["changes"])
    if isinstance(apply, dict) and not apply.get("unreachable") and not apply.get("skipped"):
        layers = apply.get("layers") if isinstance(apply.get("layers"), dict) else {}
        names = [name for name in APPLY_LAYERS if name in layers]
        names += sorted(name for name in layers if name not in APPLY_LAYERS)
        for name in names:
            part = layers[name]
            if not isinstance(part, dict):
                continue
            foreign = part.get("foreign_overrides") or []
            if not isinstance(foreign, list):
                foreign = [foreign]
            # A layer's drift list: where the state differs from the plan although the apply
            # would not change it now (a pool held by pages in use); pending entries (a layout a
            # later step creates) are not drift.
            drifted = [
                entry
                for entry in part.get("drift") or ()
                if isinstance(entry, dict) and not entry.get("pending")
            ]
            changed = bool(part.get("changed")) or bool(drifted)
            run.layer_result(host, _role_of(name), changed or bool(foreign), False)
            if changed or foreign:
                run.changed(
                    host, _role_of(name), apply_task, part.get("diff") if changed else None, foreign
                )
        failed_layer = str(apply.get("layer") or "")
        if apply.get("failed") and failed_layer and failed_layer not in layers:
            run.layer_result(host, _role_of(failed_layer), False, True)
    if isinstance(verify, dict) and isinstance(verify.get("checks"), list):
        run.checks(host, verify["checks"], verify.get("status_text"))
    if failure:
        run.failed(
            host, _role_of(failure.get("layer")), failure.get("task") or "", failure.get("msg")
        )


# --- the three files --------------------------------------------------------------------------


def _layer_case(host: str, layer: str, report_host: dict) -> tuple:
    """(outcome, message, text) of one host x layer: outcome is pass, fail or skipped."""
    if layer == "verify":
        unreachable = report_host.get("unreachable")
        outside = [
            t
            for t in report_host["failed_tasks"]
            if t["role"] not in LAYERS and t["role"] not in report_host["layers"]
        ]
        failed = [c for c in report_host["checks"] if c.get("status") == "fail"]
        if unreachable:
            return "fail", f"{host} unreachable", unreachable["msg"]
        if outside or failed:
            lines = [f"FAILED {t['task']}: {t['msg']}" for t in outside]
            lines += [
                f"FAIL {c.get('check')} {c.get('subject')}: {c.get('message')}" for c in failed
            ]
            what = f"{len(failed)} verify check(s) failed" if failed else "a task failed"
            return "fail", f"{host}: {what}", "\n".join(lines)
        if not report_host.get("verified"):
            return "skipped", f"{host}: no verify checks", ""
        return "pass", "", ""
    drift = [entry for entry in report_host["drift"] if entry["role"] == layer]
    failed_tasks = [t for t in report_host["failed_tasks"] if t["role"] == layer]
    if failed_tasks:
        text = "\n".join(f"FAILED {t['task']}: {t['msg']}" for t in failed_tasks)
        return "fail", f"{host}: {layer} failed", text
    if drift:
        lines = []
        for entry in drift:
            lines.append(f"{entry['task']}:")
            for change in entry["changes"]:
                settings = f" ({', '.join(change['settings'])})" if change["settings"] else ""
                what = (
                    "foreign override"
                    if change["state"] == "foreign"
                    else f"+{change['added']} -{change['removed']}"
                )
                lines.append(f"  {change['path_or_header']}: {what}{settings}")
        return "fail", f"{host}: {layer} drifted ({len(drift)} change(s))", "\n".join(lines)
    if not report_host["layers"].get(layer, {}).get("results"):
        return "skipped", f"{host}: no {layer} result (layer not applied on this host)", ""
    return "pass", "", ""


def as_junit_xml(report: dict) -> str:
    """JUnit XML text: one testsuite for the run, one testcase per host x layer."""
    root = ET.Element("testsuites", name="numafleet drift")
    suite = ET.SubElement(
        root, "testsuite", name="numafleet drift check", timestamp=report["finished"], time="0"
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="started", value=report["started"])
    ET.SubElement(properties, "property", name="playbook", value=_xml_text(report["playbook"]))
    ET.SubElement(
        properties, "property", name="inventory", value=_xml_text(",".join(report["inventory"]))
    )
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for host, entry in report["hosts"].items():
        extra = sorted(layer for layer in entry["layers"] if layer not in JUNIT_LAYERS)
        for layer in JUNIT_LAYERS + tuple(extra):
            outcome, message, text = _layer_case(host, layer, entry)
            case = ET.SubElement(suite, "testcase", classname=_xml_text(host), name=layer, time="0")
            counts["tests"] += 1
            if outcome == "fail":
                counts["failures"] += 1
                failure = ET.SubElement(
                    case, "failure", message=_xml_text(message), type=f"drift.{layer}"
                )
                failure.text = _xml_text(text)
            elif outcome == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=_xml_text(message))
    for element in (suite, root):
        element.set("tests", str(counts["tests"]))
        element.set("failures", str(counts["failures"]))
        element.set("errors", "0")
        element.set("skipped", str(counts["skipped"]))
    root.set("time", "0")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _ratio(check: dict):
    measured = check.get("measured")
    if isinstance(measured, bool) or not isinstance(measured, (int, float)):
        return None
    return measured / 100 if check.get("unit") == "pct" else measured


def as_prometheus_text(report: dict) -> str:
    """Prometheus text exposition (node_exporter textfile) of the report."""
    families: dict = {name: [] for name in METRICS}
    for host, entry in report["hosts"].items():
        per_role: dict = {}
        for layer, seen in entry["layers"].items():
            if seen.get("results"):
                per_role.setdefault(layer, 0)
        for change in entry["drift"]:
            per_role[change["role"]] = per_role.get(change["role"], 0) + 1
        for role in sorted(per_role):
            families["numafleet_drift_changes"].append(
                ((("host", host), ("role", role)), per_role[role])
            )
        families["numafleet_host_drift"].append(((("host", host),), 1 if entry["drift"] else 0))
        for status in STATUSES:
            families["numafleet_host_status"].append(
                ((("host", host), ("status", status)), 1 if entry["status"] == status else 0)
            )
        for check in entry["checks"]:
            name, subject = str(check.get("check")), str(check.get("subject"))
            families["numafleet_verify_check_failed"].append(
                (
                    (("host", host), ("check", name), ("subject", subject)),
                    1 if check.get("status") == "fail" else 0,
                )
            )
            ratio = _ratio(check)
            if ratio is None:
                continue
            if name == "offnode_share":
                families["numafleet_offnode_share_ratio"].append(
                    ((("host", host), ("service", subject)), ratio)
                )
            elif name == "memory_used":
                node = subject[4:] if subject.startswith("node") else subject
                families["numafleet_node_memory_used_ratio"].append(
                    ((("host", host), ("node", node)), ratio)
                )
    finished = datetime.fromisoformat(report["finished"].replace("Z", "+00:00"))
    families["numafleet_last_run_timestamp_seconds"].append(((), finished.timestamp()))
    lines = prometheus_lines(families, METRICS)
    return "\n".join(lines) + "\n"


def run_dir_name(finished: datetime) -> str:
    """The run directory's name: the UTC time the run finished, e.g. 20250131T120000Z."""
    return finished.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def write_report(report_dir: str, report: dict, finished: datetime, keep: int = 10) -> str:
    """Write the three files into a new run directory, repoint ``latest``, prune; return the dir."""
    os.makedirs(report_dir, exist_ok=True)
    base = run_dir_name(finished)
    name, number = base, 0
    while os.path.lexists(os.path.join(report_dir, name)):
        number += 1
        name = f"{base}-{number}"
    folder = os.path.join(report_dir, name)
    os.mkdir(folder)
    texts = {
        "drift.json": json.dumps(report, indent=2, sort_keys=True) + "\n",
        "drift.junit.xml": as_junit_xml(report),
        "drift.prom": as_prometheus_text(report),
    }
    for file_name in FILES:
        write_atomic(os.path.join(folder, file_name), texts[file_name])
    latest = os.path.join(report_dir, "latest")
    temp = os.path.join(report_dir, f".latest.{os.getpid()}")
    if os.path.lexists(temp):
        os.unlink(temp)
    os.symlink(name, temp)
    if os.path.isdir(latest) and not os.path.islink(latest):
        shutil.rmtree(latest)
    os.replace(temp, latest)
    prune(report_dir, keep, name)
    return folder


def prune(report_dir: str, keep: int, current: str) -> list:
    """Remove the oldest run directories beyond ``keep`` (never ``current``); return those removed."""
    runs = sorted(
        (entry for entry in os.listdir(report_dir) if RUN_DIR.match(entry)),
        key=lambda entry: (entry[:16], int(entry[17:] or 0)),
    )
    removed = []
    for entry in runs[: max(len(runs) - max(int(keep), 1), 0)]:
        if entry == current:
            continue
        path = os.path.join(report_dir, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            removed.append(entry)
    return removed
