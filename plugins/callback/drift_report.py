# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Aggregate callback: one drift report per run of playbooks/drift_check.yml (JSON, JUnit, Prometheus)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: drift_report
type: aggregate
short_description: Write one drift report per run of the drift check playbook
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - >-
    Collects, per host, the tasks that would change in check mode (role, task and a summary of
    their diff), the verify checks and the failed or unreachable tasks of every play whose
    variables set C(numafleet_drift_run=true) (the play of C(playbooks/drift_check.yml)). Other
    plays and playbooks are ignored, so the callback can stay enabled for every run.
  - >-
    When the playbook ends it writes, on the controller, one report per run into a new directory
    C(<report_dir>/<UTC time>/) (for example C(20250131T120000Z)), points the symbolic link
    C(<report_dir>/latest) at it and removes the oldest run directories beyond O(keep). Each file
    is written to a temporary file and renamed, so a reader never sees half a file.
  - >-
    C(drift.json) has this schema (format V(numafleet.tuning/drift-report), version V(1))
    C({"format", "version", "started", "finished", "inventory": [source, ...], "playbook",
    "hosts": {host: {"status": "clean|drift|fail|unreachable", "summary", "drift": [{"role",
    "task", "changes": [{"path_or_header", "state", "added", "removed",
    "settings"}]}], "checks": [check,
    ...], "failed_tasks": [{"role", "task", "msg"}], "unreachable": null or {"task", "msg"},
    "layers": {layer: {"results", "changed", "failed"}}, "verified", "change_plan": [line, ...]}},
    "totals": {"hosts",
    "clean", "drift", "fail", "unreachable", "changes", "checks": {"pass", "fail", "warn",
    "skipped"}}}).
  - >-
    C(started) and C(finished) are ISO 8601 UTC times (C(2025-01-31T12:00:00Z)); C(inventory)
    lists the inventory sources of the run (absolute paths where they are files or directories).
    C(role) is the short role name (the layer, such as C(hugepages)); C(layers) counts, per layer,
    the results of the layer's module (none when the layer did not run on the host, for example
    C(nvidia_mps) without a GPU); C(verified) tells whether the verify checks were evaluated; a
    C(summary) is one line for people. C(totals.changes) counts the changed tasks of all hosts.
    C(change_plan) is what C(site.yml) would do on the host now, as it prints it (placements
    added, moved, removed and kept; units started, restarted, stopped, also by systemd through
    C(Requires=); MIG layout changes), from the C(changes) of M(numafleet.tuning.numa_plan); V([])
    when the plan was not made.
  - >-
    A C(changes) entry stands for one entry of the task's diff and never holds its text: the
    header (a file path, or a name such as C(hugepage pools) or C(kernel settings)), C(state)
    (V(create) or V(remove) when the whole text is new or gone, else V(update)), the number of
    lines added and removed, and, for an update, C(settings), the names of the settings on the
    changed lines (such as C(node1 2048kB) or C(CPUAffinity), at most 20). A check is an entry of
    the C(checks) list of M(numafleet.tuning.numa_verify) (C(host), C(check), C(subject),
    C(status), C(measured), C(target), C(unit), C(message), C(detail)).
  - >-
    A host's status is C(unreachable) when it could not be reached, else C(fail) when a task
    failed on it or one of its verify checks failed, else C(drift) when a task would change it,
    else C(clean).
  - >-
    C(drift.junit.xml) holds one testsuite for the run and one testcase per host and layer
    (C(hugepages), C(numa_kernel), C(nvidia_mig), C(nvidia_mps), C(pinned_services), C(verify)),
    with a failure element (the summary) when the layer drifted or failed and a skipped element
    when the host has no result for the layer (for example no GPU). A task that failed outside the
    layers, and an unreachable host, fail the host's C(verify) testcase.
  - >-
    C(drift.prom) is a Prometheus text file for node_exporter's textfile collector, with the
    gauges C(numafleet_drift_changes{host,role}) (number of changed tasks),
    C(numafleet_host_drift{host}) (0 or 1), C(numafleet_host_status{host,status}) (1 for the
    host's status), C(numafleet_verify_check_failed{host,check,subject}) (0 or 1),
    C(numafleet_offnode_share_ratio{host,service}) and C(numafleet_node_memory_used_ratio{host,node})
    (0 to 1, from the verify checks where they were measured) and
    C(numafleet_last_run_timestamp_seconds) (the time the run finished).
  - >-
    The callback does not change the exit status. C(playbooks/drift_check.yml) ends with a task that
    fails the run when a host drifted or failed a check (unless C(numafleet_drift_fail=false)).
requirements:
  - Enable it in C(ansible.cfg) (C(callbacks_enabled = numafleet.tuning.drift_report)) or with the
    environment variable C(ANSIBLE_CALLBACKS_ENABLED=numafleet.tuning.drift_report).
options:
  report_dir:
    description:
      - Directory on the controller that holds one subdirectory per run and the link C(latest).
      - It is created when missing. A relative path is taken from the current directory.
    type: path
    default: ./reports/drift
    env:
      - name: NUMAFLEET_DRIFT_REPORT_DIR
    ini:
      - section: numafleet_drift_report
        key: report_dir
  keep:
    description:
      - Number of run directories kept in O(report_dir), the new one included; older ones are
        removed after the new report is written. At least 1.
    type: int
    default: 10
    env:
      - name: NUMAFLEET_DRIFT_REPORT_KEEP
    ini:
      - section: numafleet_drift_report
        key: keep
"""

import difflib
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.verify import (
    _xml_text,
    prometheus_lines,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils._reports import write_atomic

FORMAT = "numafleet.tuning/drift-report"
VERSION = 1
FILES = ("drift.json", "drift.junit.xml", "drift.prom")
# Layer (role short name) -> the module whose result is the layer's result.
LAYERS = {
    "hugepages": "numa_hugepages",
    "numa_kernel": "numa_kernel",
    "nvidia_mig": "nvidia_mig",
    "nvidia_mps": "nvidia_mps",
    "pinned_services": "pinned_units",
}
JUNIT_LAYERS = tuple(LAYERS) + ("verify",)
# numafleet.tuning.host_apply runs every layer in one execution: its result's ``layers`` holds
# each layer's result under these names.
APPLY_ACTION = "host_apply"
APPLY_LAYERS = {
    "hugepages": "hugepages",
    "kernel": "numa_kernel",
    "mig": "nvidia_mig",
    "mps": "nvidia_mps",
    "units": "pinned_services",
}
STATUSES = ("clean", "drift", "fail", "unreachable")
CHECK_STATUSES = ("pass", "fail", "warn", "skipped")
PLAY_VAR = "numafleet_drift_run"
VERIFY_TASK = "Evaluate the verify checks"
PLAN_TASK = "Plan placements"
FINAL_TASK = "Fail when drift or verify failures were found"
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
    "numafleet_node_memory_used_ratio": "Used / total memory of a NUMA node (0-1)",
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
        if state == "update":  # a whole file created or removed: its path says it all
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


def _new_host() -> dict:
    return {
        "unreachable": None,
        "drift": [],
        "checks": None,
        "failed_tasks": [],
        "layers": {},
        "change_plan": [],
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

    def changed(self, host: str, role: str, task: str, diff=None) -> None:
        """A task of ``role`` that would change ``host`` (check mode), with its diff if any."""
        self.host(host)["drift"].append(
            {"role": str(role), "task": str(task), "changes": diff_changes(diff)}
        )

    def checks(self, host: str, checks) -> None:
        """The verify checks of ``host`` (numa_verify's ``checks`` list)."""
        self.host(host)["checks"] = [
            dict(check) for check in checks or () if isinstance(check, dict)
        ]

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
            if record["unreachable"] is not None:
                status = "unreachable"
            elif record["failed_tasks"] or failed_checks:
                status = "fail"
            elif record["drift"]:
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
        parts.append(f"{len(record['drift'])} change(s) in {', '.join(roles)}")
    for task in record["failed_tasks"][:_SUMMARY_ITEMS]:
        where = f"{task['role']} : {task['task']}" if task["role"] else task["task"]
        parts.append(f"FAILED {where}: {task['msg']}")
    for check in failed_checks[:_SUMMARY_ITEMS]:
        detail = f" {check.get('detail')}" if check.get("detail") else ""
        parts.append(f"FAIL {check.get('check')} {check.get('subject')}{detail}")
    if len(failed_checks) > _SUMMARY_ITEMS:
        parts.append(f"and {len(failed_checks) - _SUMMARY_ITEMS} more failed check(s)")
    return "; ".join(parts)


# --- the three files --------------------------------------------------------------------------


def _layer_case(host: str, layer: str, report_host: dict) -> tuple:
    """(outcome, message, text) of one host x layer: outcome is pass, fail or skipped."""
    if layer == "verify":
        unreachable = report_host.get("unreachable")
        outside = [t for t in report_host["failed_tasks"] if t["role"] not in LAYERS]
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
                lines.append(
                    f"  {change['path_or_header']}: +{change['added']} -{change['removed']}"
                    f"{settings}"
                )
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
        for layer in JUNIT_LAYERS:
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


# --- the callback -----------------------------------------------------------------------------


def _parts(result):
    """(host name, task, result dict) of a callback result, on ansible-core 2.17 to 2.19+."""
    host = getattr(result, "host", None) or result._host
    task = getattr(result, "task", None) or result._task
    data = getattr(result, "result", None)
    if data is None:
        data = result._result
    return host.get_name(), task, data


def _role(task) -> str:
    """Short name of the role a task belongs to ('' for play tasks)."""
    role = getattr(task, "_role", None)
    if role is None:
        return ""
    try:
        return str(role.get_name(include_role_fqcn=False))
    except TypeError:  # older signature
        return str(role.get_name()).rsplit(".", 1)[-1]


def _is_handler(task) -> bool:
    return type(task).__name__ == "Handler"


def _check_mode(task) -> bool:
    return getattr(task, "check_mode", None) is True or bool(context.CLIARGS.get("check"))


def _is_drift_play(play) -> bool:
    value = (getattr(play, "vars", None) or {}).get(PLAY_VAR)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return value is True


class CallbackModule(CallbackBase):
    """Collect the results of the drift play; write the report when the playbook ends."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "numafleet.tuning.drift_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._run = None
        self._active = False
        self._playbook = ""

    def _now(self) -> datetime:
        return datetime.now(timezone.utc)

    def v2_playbook_on_start(self, playbook):
        name = str(getattr(playbook, "_file_name", "") or "")
        self._playbook = os.path.abspath(name) if name else ""
        self._started = self._now()

    def v2_playbook_on_play_start(self, play):
        self._active = _is_drift_play(play)
        if self._active and self._run is None:
            sources = context.CLIARGS.get("inventory") or ()
            inventory = [
                os.path.abspath(source) if os.path.exists(source) else source for source in sources
            ]
            started = getattr(self, "_started", None) or self._now()
            self._run = DriftRun(started, inventory, self._playbook)

    def _result(self, result, outcome: str) -> None:
        if not self._active or self._run is None:
            return
        host, task, data = _parts(result)
        name = task.get_name()
        self._run.host(host)  # listed even when nothing else is recorded for it
        role = _role(task)
        if outcome == "unreachable":
            self._run.unreachable(host, name, data.get("msg"))
            return
        if outcome == "skipped":
            return
        if _is_handler(task):  # handlers follow a change already recorded; only failures count
            if outcome == "failed":
                self._run.failed(host, role, name, data.get("msg"))
            return
        if name == FINAL_TASK and not role:
            return
        action = str(getattr(task, "action", "") or "").rsplit(".", 1)[-1]
        if action == APPLY_ACTION:
            self._apply_result(host, task, data, outcome)
            return
        if role in LAYERS and action == LAYERS[role]:
            self._run.layer_result(host, role, data.get("changed"), outcome == "failed")
        if outcome == "failed":
            self._run.failed(host, role, name, data.get("msg"))
            return
        if name == VERIFY_TASK and isinstance(data.get("checks"), list):
            self._run.checks(host, data["checks"])
        if name == PLAN_TASK and not role and isinstance(data.get("changes"), list):
            self._run.change_plan(host, data["changes"])
        if data.get("changed") and _check_mode(task):
            diff = data.get("diff")
            if diff is None and isinstance(data.get("results"), list):
                diff = [
                    item_diff
                    for item in data["results"]
                    if isinstance(item, dict)
                    for item_diff in (
                        item.get("diff")
                        if isinstance(item.get("diff"), list)
                        else [item.get("diff")]
                    )
                    if isinstance(item_diff, dict)
                ]
            self._run.changed(host, role or "play", name, diff)

    def _apply_result(self, host: str, task, data: dict, outcome: str) -> None:
        """One host_apply result: a layer result (and its drift) per layer that ran."""
        name = task.get_name()
        layers = data.get("layers") if isinstance(data.get("layers"), dict) else {}
        failed_layer = APPLY_LAYERS.get(str(data.get("layer") or ""), "")
        for layer, role in APPLY_LAYERS.items():
            part = layers.get(layer)
            if not isinstance(part, dict):
                if outcome == "failed" and role == failed_layer:
                    self._run.layer_result(host, role, False, True)
                continue
            self._run.layer_result(host, role, part.get("changed"), False)
            if part.get("changed") and _check_mode(task):
                self._run.changed(host, role, name, part.get("diff"))
        if outcome == "failed":
            self._run.failed(host, failed_layer, name, data.get("msg"))

    def v2_runner_on_ok(self, result):
        self._result(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result(result, "ok" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._result(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._result(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        if self._run is None:
            return
        for host in getattr(stats, "processed", {}) or {}:
            self._run.host(str(host))
        finished = self._now()
        report = self._run.as_report(finished)
        report_dir = os.path.abspath(os.path.expanduser(str(self.get_option("report_dir"))))
        try:
            folder = write_report(report_dir, report, finished, int(self.get_option("keep")))
        except OSError as exc:
            self._display.warning(
                f"numafleet.tuning.drift_report: cannot write the drift report in {report_dir}: "
                f"{exc}; set NUMAFLEET_DRIFT_REPORT_DIR (or [numafleet_drift_report] report_dir "
                "in ansible.cfg) to a writable directory"
            )
            return
        totals = report["totals"]
        self._display.display(
            f"drift report: {totals['hosts']} host(s), {totals['clean']} clean, "
            f"{totals['drift']} drift, {totals['fail']} fail, {totals['unreachable']} unreachable: "
            f"{folder} (latest: {os.path.join(report_dir, 'latest')})"
        )
