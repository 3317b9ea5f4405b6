#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

# Documentation only: drift_report is an action plugin (plugins/action/drift_report.py) that runs
# on the controller; nothing of it is sent to a managed host.

DOCUMENTATION = r"""
module: drift_report
short_description: Write the drift report of every host of the drift play (JSON, JUnit, Prometheus)
version_added: 0.3.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Gathers, for every host of the play (failed and unreachable ones included), what the drift play
    of C(playbooks/drift_check.yml) registered on it - the change plan of
    M(numafleet.tuning.numa_plan), the check-mode result of M(numafleet.tuning.host_apply), the
    checks of M(numafleet.tuning.numa_verify), the task that failed on it and whether it could be
    reached - and writes one report per run on the controller. Use it with C(run_once).
  - The report goes into a new directory C(<drift dir>/<UTC time>/) (for example
    C(20250131T120000Z)); the symbolic link C(<drift dir>/latest) is pointed at it and the oldest
    run directories beyond O(keep) are removed. Each file is written to a temporary file and
    renamed, so a reader never sees half a file. The drift directory is the environment variable
    C(NUMAFLEET_DRIFT_REPORT_DIR) when set (the role M(numafleet.tuning.drift_timer) sets it), else
    C(<report_dir>/drift), else C(<cwd>/reports/drift), where C(cwd) is the directory
    ansible-playbook runs in (your project). A directory inside an installed copy of this
    collection is refused, and a directory that cannot be written fails the task with the
    directory and the OS error.
  - >-
    C(drift.json) has this schema (format V(numafleet.tuning/drift-report), version V(2))
    C({"format", "version", "started", "finished", "inventory": [source, ...], "playbook",
    "hosts": {host: {"status": "clean|drift|fail|unreachable", "summary", "drift": [{"role",
    "task", "changes": [{"path_or_header", "state", "added", "removed", "settings"}]}], "checks":
    [check, ...], "failed_tasks": [{"role", "task", "msg"}], "unreachable": null or {"task",
    "msg"}, "layers": {layer: {"results", "changed", "failed"}}, "verified", "change_plan": [line,
    ...], "verify_status", "checks_not_run"}}, "totals": {"hosts", "clean", "drift", "fail",
    "unreachable", "changes", "checks": {"pass", "fail", "warn", "skipped"}}}).
  - >-
    C(started) and C(finished) are ISO 8601 UTC times (C(2025-01-31T12:00:00Z)); C(inventory)
    lists the inventory sources of the run (absolute paths where they are files or directories).
    C(role) is the layer, named after its role (C(hugepages), C(numa_kernel), C(nvidia_mig),
    C(nvidia_mps), C(pinned_services)); a layer of M(numafleet.tuning.host_apply) without a role
    keeps its own name. C(layers) counts, per layer, its results (none when the layer did not run
    on the host, for example C(nvidia_mps) without a GPU); C(verified) tells whether the verify
    checks were evaluated; C(verify_status) is numa_verify's status text (such as
    C(pass (render: 27 of 34 checks not run))) and C(checks_not_run) the number of its skipped
    checks; a C(summary) is one line for people. C(totals.changes) counts the drift entries of all
    hosts. C(change_plan) is what C(site.yml) would do on the host now, as it prints it, from the
    C(changes) of M(numafleet.tuning.numa_plan); V([]) when the plan was not made.
  - >-
    A C(changes) entry stands for one entry of the layer's diff and never holds its text: the
    header (a file path, or a name such as C(hugepage pools) or C(kernel settings)), C(state)
    (V(create) or V(remove) when the whole text is new or gone, V(update) for a change, V(foreign)
    for a file we did not write that overrides a planned value - the layer's
    C(foreign_overrides)), the number of lines added and removed, and C(settings), the names of
    the settings on the changed lines (such as C(node1 2048kB) or C(CPUAffinity), at most 20). A
    check is an entry of the C(checks) list of M(numafleet.tuning.numa_verify).
  - >-
    A host's status is C(unreachable) when it could not be reached, else C(fail) when a task
    failed on it or one of its verify checks failed (other than a state check, below), else
    C(drift) when a layer would change it or reports foreign overrides, or a state check failed
    (C(rendered_units), C(effective_units), C(hugepage_pools), C(kernel_settings), C(mig_layout),
    C(mps_settings), C(irq_affinity): the host differs from its plan, which is drift), else
    C(clean). A hand-edited unit of ours is therefore C(drift).
  - >-
    C(drift.junit.xml) holds one testsuite for the run and one testcase per host and layer
    (C(hugepages), C(numa_kernel), C(nvidia_mig), C(nvidia_mps), C(pinned_services), any other
    layer the host reported, and C(verify)), with a failure element (the summary) when the layer
    drifted or failed and a skipped element when the host has no result for the layer. A task that
    failed outside the layers, and an unreachable host, fail the host's C(verify) testcase.
  - >-
    C(drift.prom) is a Prometheus text file for node_exporter's textfile collector, with the
    gauges C(numafleet_drift_changes{host,role}), C(numafleet_host_drift{host}) (0 or 1),
    C(numafleet_host_status{host,status}) (1 for the host's status),
    C(numafleet_verify_check_failed{host,check,subject}) (0 or 1),
    C(numafleet_offnode_share_ratio{host,service}), C(numafleet_node_memory_used_ratio{host,node})
    and C(numafleet_last_run_timestamp_seconds).
  - Version 1 of the report was written by the callback C(numafleet.tuning.drift_report) (now a
    deprecated shim that writes nothing); version 2 counts a failed state check and foreign
    overrides as drift and adds C(verify_status) and C(checks_not_run).
options:
  report_dir:
    description:
      - The report directory of the run (C(numafleet_report_dir)); the drift reports go into its
        subdirectory C(drift). Relative paths are taken from the directory ansible-playbook runs
        in. Defaults to C(<cwd>/reports). C(NUMAFLEET_DRIFT_REPORT_DIR) overrides it.
    type: path
  keep:
    description:
      - Number of run directories kept, the new one included, at least 1. Defaults to
        C(NUMAFLEET_DRIFT_REPORT_KEEP), else 10.
    type: int
  hosts:
    description:
      - Hosts in the report. Defaults to every host of the play (C(ansible_play_hosts_all)).
    type: list
    elements: str
  plan_var:
    description: Variable each host registered the result of M(numafleet.tuning.numa_plan) in.
    type: str
  apply_var:
    description: Variable each host registered the check-mode result of M(numafleet.tuning.host_apply) in.
    type: str
  verify_var:
    description: Variable each host registered the result of M(numafleet.tuning.numa_verify) in.
    type: str
  failure_var:
    description:
      - Variable a host sets when one of its tasks failed (the play's C(rescue)), a dict with
        C(task), C(msg) and C(layer) (the failed layer of M(numafleet.tuning.host_apply), if any).
    type: str
  connect_vars:
    description:
      - Task name -> the variable it registered, for the tasks that connect to the host and run with
        C(ignore_unreachable); the first with C(unreachable) makes the host C(unreachable).
    type: dict
    default: {}
  apply_task:
    description: The task name the drift entries of M(numafleet.tuning.host_apply) are reported under.
    type: str
    default: Check the placements
  started:
    description: ISO 8601 time the run started; defaults to now.
    type: str
  playbook:
    description: The playbook path stored in the report.
    type: str
    default: ""
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.conn
  - action_common_attributes.flow
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.controller_action
  - numafleet.tuning._attributes.controller_report
notes:
  - The task returns C(changed=false), because no managed host changes.
seealso:
  - module: numafleet.tuning.verify_report
  - module: numafleet.tuning.host_apply
"""

EXAMPLES = r"""
- name: Write the drift report on the controller
  numafleet.tuning.drift_report:
    report_dir: "{{ numafleet_report_dir | default(omit) }}"
    plan_var: planned
    apply_var: applied
    verify_var: verified
    failure_var: failure
    connect_vars:
      Gather NUMA and GPU topology: facts
  run_once: true
  register: drift

- name: Fail the hosts that need attention
  ansible.builtin.fail:
    msg: "{{ drift.hosts[inventory_hostname].summary }}"
  when: drift.hosts[inventory_hostname].status != 'clean'
"""

RETURN = r"""
report_dir:
  description: The drift report directory (absolute).
  returned: success
  type: str
  sample: /srv/project/reports/drift
folder:
  description: The run directory written.
  returned: success
  type: str
  sample: /srv/project/reports/drift/20250131T120000Z
latest:
  description: The link to the latest run directory.
  returned: success
  type: str
  sample: /srv/project/reports/drift/latest
files:
  description: The files written (keys C(json), C(junit), C(prometheus)).
  returned: success
  type: dict
  sample: {json: /srv/project/reports/drift/20250131T120000Z/drift.json}
hosts:
  description:
    - Host -> its C(status) and C(summary) line, as in C(drift.json), and C(errors), true when a
      task failed on the host or it was unreachable (not only drift or a failed check).
  returned: success
  type: dict
  sample: {gpu-a100-01: {status: drift, summary: "gpu-a100-01: drift; 1 change(s) in pinned_services"}}
totals:
  description: The C(totals) of C(drift.json).
  returned: success
  type: dict
  sample: {hosts: 2, clean: 1, drift: 1, fail: 0, unreachable: 0, changes: 1}
summary:
  description: One line with the counts and the run directory.
  returned: success
  type: str
  sample: "drift report: 2 host(s), 1 clean, 1 drift, 0 fail, 0 unreachable: /srv/project/reports/drift/..."
"""
