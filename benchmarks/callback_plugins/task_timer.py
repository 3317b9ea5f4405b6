# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark helper: wall time of each task per host, written as JSON to $NUMAFLEET_TASK_TIMES."""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: task_timer
type: aggregate
short_description: Record the wall time of every task (benchmarks only)
description:
  - Writes a JSON list of C({task, host, seconds}) to the file named by C($NUMAFLEET_TASK_TIMES).
requirements:
  - enabled with C(ANSIBLE_CALLBACKS_ENABLED=task_timer)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._started = {}
        self._rows = []

    def v2_runner_on_start(self, host, task):
        self._started[(host.get_name(), task._uuid)] = time.perf_counter()

    def _done(self, result):
        key = (result._host.get_name(), result._task._uuid)
        start = self._started.pop(key, None)
        if start is not None:
            self._rows.append(
                {
                    "task": result._task.get_name(),
                    "host": key[0],
                    "seconds": time.perf_counter() - start,
                }
            )

    v2_runner_on_ok = _done
    v2_runner_on_failed = _done
    v2_runner_on_skipped = _done

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("NUMAFLEET_TASK_TIMES")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self._rows, handle, indent=1)
