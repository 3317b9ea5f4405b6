# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """Shared attributes blocks for the collection's modules."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
  idempotent:
    description: Running the module twice with the same arguments changes nothing the second time.
"""

    # The collection's action plugins that run on the controller only (no module is sent):
    # numa_plan, host_vars_check, numa_verify, verify_report, drift_report.
    CONTROLLER_ACTION = r"""
options: {}
attributes:
  action:
    support: full
  async:
    support: none
  become:
    support: none
  bypass_host_loop:
    support: none
  connection:
    support: none
"""

    # The controller actions that write a report per run (verify_report, drift_report).
    CONTROLLER_REPORT = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: The report is the output of the run and is written on the controller in check mode too.
  delegation:
    support: none
    details: The files are always written on the controller.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every run writes a new report; the task still reports no change, as nothing on a host changed.
  platform:
    platforms: all
"""

    FACTS_MODULE = r"""
options: {}
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
  check_mode:
    support: full
  diff_mode:
    support: N/A
    details: Facts modules change nothing, so there is no diff.
  idempotent:
    support: full
"""
