# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark helper: count the module executions each host costs in a playbook run.

A module execution is one call of ``ActionBase._execute_module``: one AnsiballZ payload built,
sent and run on the host (or locally with ``ansible_connection: local``). Controller-only tasks
(assert, debug, set_fact, numafleet.tuning.numa_plan) never reach it, and an action plugin that
runs two modules counts two. Each worker process appends one JSON line per execution to
``$NUMAFLEET_MODULE_LOG`` (O_APPEND, one write per line); at the end of the run the callback folds
the log into ``$NUMAFLEET_MODULE_COUNTS``:
``{"hosts": {host: {module: count}}, "per_host": {host: total}, "total": N,
"tasks_per_host": {host: count}}``; a host-task is any task result for the host (ok, changed,
failed, skipped), the unit of Ansible's per-task cost on the controller and in its workers.
"""

from __future__ import annotations

import collections
import json
import os

from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: module_count
type: aggregate
short_description: Count module executions per host (benchmarks only)
description:
  - Wraps C(ActionBase._execute_module) so that every module execution appends a JSON line
    C({host, module, task}) to the file named by C($NUMAFLEET_MODULE_LOG); at the end of the run
    writes per-host counts to C($NUMAFLEET_MODULE_COUNTS).
requirements:
  - enabled with C(ANSIBLE_CALLBACKS_ENABLED=module_count) and both environment variables set
"""

_ORIGINAL = ActionBase._execute_module


def _counted(self, module_name=None, module_args=None, tmp=None, task_vars=None, *args, **kwargs):
    log = os.environ.get("NUMAFLEET_MODULE_LOG")
    if log:
        host = (task_vars or {}).get("inventory_hostname") or self._play_context.remote_addr
        line = json.dumps(
            {
                "host": host,
                "module": module_name or self._task.action,
                "task": self._task.get_name(),
            }
        )
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    return _ORIGINAL(self, module_name, module_args, tmp, task_vars, *args, **kwargs)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_count"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._tasks = collections.Counter()
        # Patched here, in the controller process, before the workers fork.
        ActionBase._execute_module = _counted

    def _count(self, result, *args, **kwargs):
        self._tasks[result._host.get_name()] += 1

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_skipped = _count

    def v2_playbook_on_stats(self, stats):
        log = os.environ.get("NUMAFLEET_MODULE_LOG")
        out = os.environ.get("NUMAFLEET_MODULE_COUNTS")
        if not (log and out):
            return
        hosts = collections.defaultdict(collections.Counter)
        if os.path.exists(log):
            with open(log, encoding="utf-8") as handle:
                for line in handle:
                    entry = json.loads(line)
                    hosts[entry["host"]][entry["module"]] += 1
        for host in stats.processed:
            hosts.setdefault(host, collections.Counter())
        result = {
            "hosts": {h: dict(sorted(c.items())) for h, c in sorted(hosts.items())},
            "per_host": {h: sum(c.values()) for h, c in sorted(hosts.items())},
            "total": sum(sum(c.values()) for c in hosts.values()),
            "tasks_per_host": {h: self._tasks[h] for h in sorted(hosts)},
        }
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1, sort_keys=True)
