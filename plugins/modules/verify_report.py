#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

# Documentation only: verify_report is an action plugin (plugins/action/verify_report.py) that runs
# on the controller; nothing of it is sent to a managed host.

DOCUMENTATION = r"""
module: verify_report
short_description: Write the verify checks of every host as JSON, JUnit XML and a Prometheus textfile
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Gathers the checks that M(numafleet.tuning.numa_verify) returned on every host of the play
    (the variable O(result_var) registered on each of O(hosts), including hosts whose verify
    failed) and writes three files into O(report_dir) on the controller.
  - "C(verify.json): the report of schema C(numafleet.verify/1): generated_at, run, status,
    status_text, per host its status, status_text, not_run, summary line, counts and checks, and
    totals. C(status) is the machine field (pass, warn, fail, skipped); C(status_text) adds the
    number of checks not run, such as C(pass (render: 27 of 34 checks not run)), and C(not_run)
    counts them, so that a pass with most checks skipped never reads as a plain pass."
  - C(verify.junit.xml) is JUnit XML with a testsuite per host (properties C(status),
    C(status_text), C(not_run) and C(warnings)) and a testcase per host, check and subject.
    Failed checks are failures, skipped checks are skipped, and warnings are passing testcases
    with a C(WARN) line in C(system-out).
  - C(verify.prom) is a Prometheus text exposition for node_exporter's textfile collector, with
    C(numafleet_check_status), C(numafleet_verify_checks), C(numafleet_verify_checks_not_run),
    C(numafleet_verify_last_run_timestamp_seconds) and the measured
    C(numafleet_offnode_share_ratio), C(numafleet_remote_access_ratio),
    C(numafleet_node_memory_used_ratio) and C(numafleet_node_allocation_miss_ratio), labelled with
    host, service or node.
  - A host without checks (its verify failed on bad input, an earlier task failed, or it was
    unreachable) gets one failing check C(verified) so that it is never missing from the report.
  - Runs on the controller only and writes nothing on a managed host. Use it with C(run_once).
    O(report_dir) is created when missing, and each file is written atomically (a temporary file
    renamed over the old one), mode C(0644).
options:
  report_dir:
    description:
      - Directory on the controller that receives the three files. It is created when missing.
        A relative path is taken from the directory ansible-playbook runs in.
      - Defaults to C(<cwd>/reports), where C(cwd) is the directory ansible-playbook runs in (your
        project). An empty string, C(/) and a directory inside an installed copy of this
        collection are refused.
    type: path
  result_var:
    description:
      - Name of the variable each host registered the result of M(numafleet.tuning.numa_verify) in.
      - Required with O(state=present).
    type: str
  failure_var:
    description:
      - Name of the variable a host sets when a task failed on it or it was unreachable (the
        play's C(rescue)), a dict with C(task) and C(msg); its check C(verified) names them.
    type: str
  state:
    description:
      - V(present) writes the report. V(absent) removes the three files of a previous report, which
        C(verify.yml) does first so that a run that fails before its report leaves no stale one.
    type: str
    choices: [present, absent]
    default: present
  hosts:
    description:
      - Hosts whose checks go into the report. Defaults to every host of the play
        (C(ansible_play_hosts_all)), failed ones included.
    type: list
    elements: str
  run:
    description:
      - Extra facts about the run, stored under C(run) in C(verify.json), for example the playbook
        name or the thresholds.
      - C(generated_at) (ISO 8601) defaults to the controller's current UTC time; it also sets the
        JUnit timestamps and C(numafleet_verify_last_run_timestamp_seconds).
    type: dict
    default: {}
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.conn
  - action_common_attributes.flow
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.controller_action
  - numafleet.tuning._attributes.controller_report
notes:
  - The task returns C(changed=false), because no managed host changes; the files are rewritten on
    every run.
seealso:
  - module: numafleet.tuning.numa_verify
"""

EXAMPLES = r"""
- name: Evaluate the verify checks
  numafleet.tuning.numa_verify:
    measured: "{{ locality }}"
    unit_states: "{{ units.files }}"
  register: verify_result

- name: Write the verify report on the controller
  numafleet.tuning.verify_report:
    report_dir: "{{ numafleet_report_dir | default(omit) }}"
    result_var: verify_result
    run:
      playbook: verify.yml
  run_once: true
  register: report

- name: Show where the report is
  ansible.builtin.debug:
    msg: "{{ report.files.json }}"
  run_once: true
"""

RETURN = r"""
removed:
  description: Paths of the old report files removed on the controller.
  returned: O(state=absent)
  type: list
  elements: str
  sample: [/srv/numafleet/reports/verify.json]
files:
  description: Paths of the files written on the controller.
  returned: success
  type: dict
  contains:
    json:
      description: The JSON report.
      returned: success
      type: str
      sample: /srv/numafleet/reports/verify.json
    junit:
      description: The JUnit XML report.
      returned: success
      type: str
      sample: /srv/numafleet/reports/verify.junit.xml
    prometheus:
      description: The Prometheus textfile.
      returned: success
      type: str
      sample: /srv/numafleet/reports/verify.prom
status:
  description: Status of the whole run, the worst host status (V(fail), V(warn), V(pass) or V(skipped)).
  returned: success
  type: str
  sample: pass
status_text:
  description: RV(status) with the number of checks not run, when any were skipped.
  returned: success
  type: str
  sample: "pass (54 of 68 checks not run)"
report_dir:
  description: The directory the files were written in (absolute).
  returned: success
  type: str
  sample: /srv/project/reports
hosts_by_status:
  description: Number of hosts per status.
  returned: success
  type: dict
  sample: {"pass": 8, "fail": 0, "warn": 0, "skipped": 0}
not_verified:
  description: Hosts that had no checks and got the failing check C(verified).
  returned: success
  type: list
  elements: str
  sample: []
summary:
  description: One line with the number of hosts, the status and the files.
  returned: success
  type: str
  sample: "verify report of 10 host(s), status pass: /srv/numafleet/reports/verify.json, ..."
"""
