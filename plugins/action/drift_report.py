# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.drift_report: what every play host registered -> report.

Runs once for the play (run_once) and writes only on the controller: a run directory
``<report_dir>/drift/<UTC time>/`` with drift.json, drift.junit.xml and drift.prom, the link
``latest`` and the pruning of old runs (``plugin_utils/_drift_report.py``). Documentation:
``plugins/modules/drift_report.py``.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

from ansible_collections.numafleet.tuning.plugins.plugin_utils import _drift_report
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    ControllerAction,
    registered,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils._reports import (
    default_report_dir,
    inside_collection_problem,
)

ARGUMENT_SPEC = dict(
    report_dir=dict(type="path"),
    keep=dict(type="int"),
    hosts=dict(type="list", elements="str"),
    plan_var=dict(type="str"),
    apply_var=dict(type="str"),
    verify_var=dict(type="str"),
    failure_var=dict(type="str"),
    connect_vars=dict(type="dict", default={}),
    apply_task=dict(type="str", default="Check the placements"),
    started=dict(type="str"),
    playbook=dict(type="str", default=""),
)
ENV_DIR = "NUMAFLEET_DRIFT_REPORT_DIR"
ENV_KEEP = "NUMAFLEET_DRIFT_REPORT_KEEP"
DEFAULT_KEEP = 10


def _started(text, now: datetime) -> datetime:
    """The run's start from ``started`` (ISO 8601), else ``now``."""
    if not text:
        return now
    try:
        when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return now
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def report_folder(option, environ) -> tuple:
    """(drift report directory, where it came from): NUMAFLEET_DRIFT_REPORT_DIR, else
    ``<report_dir>/drift``, else ``<cwd>/reports/drift``; absolute."""
    if environ.get(ENV_DIR):
        return os.path.abspath(os.path.expanduser(environ[ENV_DIR])), ENV_DIR
    if option:
        return os.path.join(os.path.abspath(option), "drift"), "numafleet_report_dir"
    return os.path.join(default_report_dir(), "drift"), "the default (<cwd>/reports)"


def _keep(option, environ):
    """The number of runs kept (at least 1), or an error message."""
    value = option if option is not None else environ.get(ENV_KEEP) or DEFAULT_KEEP
    try:
        keep = int(value)
    except (TypeError, ValueError):
        keep = 0
    if keep < 1:
        return None, f"keep ({ENV_KEEP} or the option keep) is {value!r}; give a whole number >= 1"
    return keep, ""


class ActionModule(ControllerAction):
    """Gather what every host of the drift play registered and write the drift report."""

    NAME = "numafleet.tuning.drift_report"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def _now(self) -> datetime:
        return datetime.now(timezone.utc)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, dummy, args = self.start(tmp, task_vars)
        folder, source = report_folder(args["report_dir"], os.environ)
        keep, problem = _keep(args["keep"], os.environ)
        if problem:
            result.update(failed=True, msg=f"{self.NAME}: {problem}")
            return result
        problem = inside_collection_problem(
            f"the drift report directory {folder} (from {source})",
            folder,
            "numafleet_report_dir",
            "reports go to <cwd>/reports/drift",
        )
        if problem:
            result.update(failed=True, msg=f"{self.NAME}: {problem}")
            return result

        hosts = args["hosts"]
        if hosts is None:
            hosts = task_vars.get("ansible_play_hosts_all") or []
        hostvars = task_vars.get("hostvars") or {}
        now = self._now()
        sources = task_vars.get("ansible_inventory_sources") or ()
        inventory = [os.path.abspath(s) if os.path.exists(s) else str(s) for s in sources]
        run = _drift_report.DriftRun(_started(args["started"], now), inventory, args["playbook"])
        for host in sorted(str(h) for h in hosts):
            unreachable = None
            for task, name in (args["connect_vars"] or {}).items():
                found = registered(hostvars, host, name)
                if found and found.get("unreachable"):
                    unreachable = {"task": str(task), "msg": found.get("msg")}
                    break
            _drift_report.add_host(
                run,
                host,
                plan=registered(hostvars, host, args["plan_var"]),
                apply=registered(hostvars, host, args["apply_var"]),
                verify=registered(hostvars, host, args["verify_var"]),
                failure=registered(hostvars, host, args["failure_var"]),
                unreachable=unreachable,
                apply_task=args["apply_task"],
            )
        report = run.as_report(now)
        try:
            written = _drift_report.write_report(folder, report, now, keep)
        except OSError as exc:
            result.update(
                failed=True,
                msg=(
                    f"{self.NAME}: cannot write the drift report in {folder} (from {source}) on "
                    f"the controller: {exc}; set numafleet_report_dir (or {ENV_DIR}) to a "
                    "writable directory"
                ),
            )
            return result
        totals = report["totals"]
        result.update(
            changed=False,
            report_dir=folder,
            folder=written,
            latest=os.path.join(folder, "latest"),
            files={
                "json": os.path.join(written, "drift.json"),
                "junit": os.path.join(written, "drift.junit.xml"),
                "prometheus": os.path.join(written, "drift.prom"),
            },
            hosts={
                name: {
                    "status": entry["status"],
                    "summary": entry["summary"],
                    "errors": bool(entry["failed_tasks"] or entry["unreachable"]),
                }
                for name, entry in report["hosts"].items()
            },
            totals=totals,
            summary=(
                f"drift report: {totals['hosts']} host(s), {totals['clean']} clean, "
                f"{totals['drift']} drift, {totals['fail']} fail, {totals['unreachable']} "
                f"unreachable: {written} (latest: {os.path.join(folder, 'latest')})"
            ),
        )
        return result
