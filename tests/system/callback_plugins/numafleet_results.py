# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-only stdout callback: one JSON document with every task result per host, and the recap.

ansible-core has no JSON stdout callback (ansible.posix.json is not installed here). The system
tests (tests/system/) select this one with ANSIBLE_CALLBACK_PLUGINS=tests/system/callback_plugins
and ANSIBLE_STDOUT_CALLBACK=numafleet_results, then parse stdout:

    {"results": [{"host", "task", "handler", "status", "changed", "msg", "diff", ...}, ...],
     "timings": [["<task name>", <seconds over all hosts>], ...],
     "stats": {"<host>": {"ok", "changed", "failures", "unreachable", "skipped", ...}}}
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: numafleet_results
type: stdout
short_description: Every task result as one JSON document (tests only)
description:
  - Collects selected keys of every task result per host and prints them with the play recap as
    one JSON document when the playbook ends.
author: numafleet.tuning contributors (@numafleet)
"""

import json  # noqa: E402 (after DOCUMENTATION, as in every Ansible plugin)
import time  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402

# Result keys worth keeping; the facts modules' full results are large and not needed.
KEEP = (
    "changed",
    "failed",
    "skipped",
    "msg",
    "diff",
    "summary",
    "would_run",
    "ran",
    "files",
    "units",
    "reload_needed",
    "handler_restart",
    "handler_try_restart",
    "handler_start",
    "warnings",
    # numafleet.tuning.host_apply: every layer's result, and the facts it returns.
    "layers",
    "changed_layers",
    "reboot_required",
    "cached",
)


def _parts(result):
    """(host name, task, result dict) of a callback result, on ansible-core 2.17 to 2.19+."""
    host = getattr(result, "host", None) or result._host
    task = getattr(result, "task", None) or result._task
    data = getattr(result, "result", None)
    if data is None:
        data = result._result
    return host.get_name(), task, data


class CallbackModule(CallbackBase):
    """Collect results; print them as JSON at the end."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "numafleet_results"

    def __init__(self):
        super().__init__()
        self._results = []
        self._timings = []  # [task name, seconds] in the order the tasks started
        self._started = None

    def _close_task(self):
        if self._started is not None:
            self._timings[-1][1] = round(time.monotonic() - self._started, 3)
            self._started = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close_task()
        self._timings.append([task.get_name(), None])
        self._started = time.monotonic()

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def _record(self, result, status):
        host, task, data = _parts(result)
        entry = {
            "host": host,
            "task": task.get_name(),
            "action": task.action,
            "handler": type(task).__name__ == "Handler",
            "status": status,
        }
        entry.update({key: data[key] for key in KEEP if key in data})
        if "results" in data:  # loops: keep the per-item essentials
            entry["items"] = [
                {key: item[key] for key in KEEP if key in item} for item in data["results"]
            ]
        self._results.append(entry)

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        self._close_task()
        hosts = sorted(stats.processed.keys())
        doc = {
            "results": self._results,
            "timings": self._timings,
            "stats": {host: stats.summarize(host) for host in hosts},
        }
        self._display.display(json.dumps(doc, default=str, sort_keys=True))
