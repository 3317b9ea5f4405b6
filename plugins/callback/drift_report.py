# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Deprecated callback: playbooks/drift_check.yml writes its report itself now; this writes nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
name: drift_report
type: aggregate
short_description: Deprecated - the drift check playbook writes its report itself
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
deprecated:
  why: >-
    C(playbooks/drift_check.yml) writes the drift report itself (action
    M(numafleet.tuning.drift_report)), also when the collection is installed and run by FQCN
    without this repository's C(ansible.cfg).
  removed_in: 1.0.0
  alternative: Nothing to enable; set C(numafleet_report_dir) to choose where the report goes.
description:
  - Kept so that an C(ansible.cfg) or C(ANSIBLE_CALLBACKS_ENABLED) that still names
    C(numafleet.tuning.drift_report) keeps loading. It writes nothing and says so once per run.
  - The report (C(drift.json), C(drift.junit.xml), C(drift.prom)) is written by the playbook into
    C(<numafleet_report_dir>/drift/) (default C(<cwd>/reports/drift)) or C(NUMAFLEET_DRIFT_REPORT_DIR);
    see M(numafleet.tuning.drift_report) for the schema.
requirements:
  - None. Remove it from C(callbacks_enabled).
"""

from ansible.plugins.callback import CallbackBase

NOTICE = (
    "numafleet.tuning.drift_report: this callback is deprecated (to be removed in 1.0.0) and "
    "writes nothing; "
    "playbooks/drift_check.yml writes the drift report itself (numafleet_report_dir, default "
    "<cwd>/reports/drift). Remove numafleet.tuning.drift_report from callbacks_enabled."
)


class CallbackModule(CallbackBase):
    """Say once per run that the playbook writes the drift report now."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "numafleet.tuning.drift_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._told = False

    def v2_playbook_on_start(self, playbook):
        if not self._told:
            self._told = True
            self._display.warning(NOTICE)
