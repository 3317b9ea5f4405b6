# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.verify_report: the checks of every play host -> report files.

Runs once for the play (run_once) and writes only on the controller: verify.json, verify.junit.xml
and verify.prom in report_dir, each atomically. Documentation: ``plugins/modules/verify_report.py``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import verify
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    ControllerAction,
    plain,
    registered,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils._reports import (
    default_report_dir,
    inside_collection_problem,
    write_atomic,
)

ARGUMENT_SPEC = dict(
    report_dir=dict(type="path"),
    result_var=dict(type="str"),
    failure_var=dict(type="str"),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    hosts=dict(type="list", elements="str"),
    run=dict(type="dict", default={}),
)
FILES = {"json": "verify.json", "junit": "verify.junit.xml", "prometheus": "verify.prom"}


def not_verified(host: str, result, failure=None) -> dict:
    """The one check of a host whose numa_verify produced no checks (failed earlier, unreachable);
    ``failure`` is {task, msg} of the task that failed on the host (the play's rescue), if known."""
    why = result.get("msg") if isinstance(result, dict) else None
    if isinstance(failure, dict) and failure.get("msg"):
        why = f"{failure.get('task') or 'a task'}: {failure['msg']}"
    message = (
        f"verify did not run on this host: {why}"
        if why
        else "verify did not run on this host: an earlier task failed or the host was unreachable "
        "(see the play output)"
    )
    return {
        "host": host,
        "check": "verified",
        "subject": "host",
        "status": "fail",
        "measured": False,
        "target": True,
        "unit": "bool",
        "message": message,
        "detail": "not verified",
    }


class ActionModule(ControllerAction):
    """Gather the verify checks of the play's hosts and write the reports on the controller."""

    NAME = "numafleet.tuning.verify_report"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, dummy, args = self.start(tmp, task_vars)
        given = args["report_dir"]
        folder = default_report_dir() if given is None else os.path.abspath(given)
        if (given is not None and not given.strip()) or folder == os.path.abspath(os.sep):
            result.update(
                failed=True,
                msg=(
                    f"numafleet.tuning.verify_report: report_dir {given!r} is not a "
                    "report directory; set numafleet_report_dir to a directory of its own on the "
                    "controller, e.g. /var/lib/numafleet/reports"
                ),
            )
            return result
        problem = inside_collection_problem(
            f"the report directory {folder}",
            folder,
            "numafleet_report_dir",
            "reports go to <cwd>/reports",
        )
        if problem:
            result.update(failed=True, msg=f"numafleet.tuning.verify_report: {problem}")
            return result
        paths = {key: os.path.join(folder, FILES[key]) for key in FILES}
        if args["state"] == "absent":
            # Run first: a run that fails before its report leaves no stale report behind.
            removed = []
            try:
                for path in paths.values():
                    if os.path.lexists(path):
                        os.remove(path)
                        removed.append(path)
            except OSError as exc:
                result.update(
                    failed=True,
                    msg=f"numafleet.tuning.verify_report: cannot remove the old report: {exc}",
                )
                return result
            result.update(changed=False, removed=removed)
            return result
        if not args["result_var"]:
            result.update(
                failed=True,
                msg="numafleet.tuning.verify_report: result_var is required with state=present",
            )
            return result

        hosts = args["hosts"]
        if hosts is None:
            hosts = task_vars.get("ansible_play_hosts_all") or []
        hostvars = task_vars.get("hostvars") or {}
        name = args["result_var"]
        checks, measured, missing = [], {}, []
        for host in sorted(str(h) for h in hosts):
            found = registered(hostvars, host, name)  # None: not verified
            failure = registered(hostvars, host, args["failure_var"])
            if found is not None and isinstance(found.get("checks"), list):
                checks.extend(found["checks"])
                if isinstance(found.get("measured"), dict):
                    measured[host] = found["measured"]
            else:
                missing.append(host)
                checks.append(not_verified(host, found, failure))

        run = dict(plain(args["run"]) or {})
        run.setdefault("generated_at", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        try:
            report = verify.as_json_report(run, checks)
            texts = {
                "json": json.dumps(report, indent=2, sort_keys=True) + "\n",
                "junit": verify.as_junit_xml(checks, run),
                "prometheus": verify.as_prometheus_text(checks, measured, run),
            }
        except NumaTuneError as exc:
            result.update(failed=True, msg=f"numafleet.tuning.verify_report: {exc}")
            return result
        try:
            os.makedirs(folder, exist_ok=True)
            for key, path in paths.items():
                write_atomic(path, texts[key])
        except OSError as exc:
            result.update(
                failed=True,
                msg=(
                    f"numafleet.tuning.verify_report: cannot write the report in {folder} on the "
                    f"controller: {exc}; set numafleet_report_dir to a writable directory"
                ),
            )
            return result

        result.update(
            changed=False,
            files=paths,
            status=report["status"],
            status_text=report["status_text"],
            report_dir=folder,
            hosts_by_status=report["totals"]["hosts_by_status"],
            not_verified=missing,
            summary=(
                f"verify report of {report['totals']['hosts']} host(s), status {report['status_text']}: "
                f"{', '.join(paths[key] for key in FILES)}"
            ),
        )
        return result
