#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

# Documentation only: numa_verify is an action plugin (plugins/action/numa_verify.py) that runs on
# the controller; nothing of it is sent to the managed host.

DOCUMENTATION = r"""
module: numa_verify
short_description: Check a host's measured NUMA locality and rendered units against its plan
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Compares what M(numafleet.tuning.numa_locality_info) measured on a host (O(measured)) and what
    M(numafleet.tuning.pinned_units) found in check mode (O(unit_states)) with the host's plan
    (O(plan), from M(numafleet.tuning.numa_plan)), and returns one check per host, service or node
    and rule in RV(checks), with one line in RV(summary).
  - Runs on the controller only. No module is sent to the host and nothing on the host is read or
    changed.
  - "Runtime checks per planned service: C(running) (its cgroup has processes), C(cpus_binding)
    and C(mems_binding) (every process's C(Cpus_allowed_list) and C(Mems_allowed_list) within the
    plan's cpus and mems), C(offnode_share) (anonymous and hugetlb memory on nodes outside the
    plan's mems, fails above C(cross_node_target_pct); exactly at the target passes) and, for
    services with GPUs, C(gpu_locality)."
  - "Runtime checks per NUMA node: C(memory_used) (warns at C(memory_warn_pct) or more, fails at
    C(memory_fail_pct) or more) and C(hugepages_total) (reserved totals, not free counts, equal the
    plan)."
  - "Static check per unit: C(rendered_units) fails a unit whose file or drop-in would be created,
    updated or removed, and the subject C(manifest) when the manifest differs."
  - "Layer checks, from the check-mode result of M(numafleet.tuning.host_apply) (O(layer_states)),
    in render mode too: C(hugepage_pools) per node and page size (C(nr_hugepages) against the
    plan; a pool held above the plan by pages in use fails with the reason), C(kernel_settings)
    per managed knob (numa_balancing, zone_reclaim_mode, THP, numad, IRQBALANCE_BANNED_CPUS),
    C(mig_layout) per planned MIG GPU (mode and instances by profile and placement start, read
    through NVML, nvidia-smi or the GPU snapshot; in render mode a layout the read-only snapshot
    cannot show is skipped with both layouts named), C(mps_settings) per planned MPS daemon (the
    defaults the running daemon reports through nvidia-cuda-mps-control) and C(irq_affinity) per
    IRQ of the plan's GPUs and NICs (C(/proc/irq/N/smp_affinity_list)). A layer that did not run
    or has nothing to check (no GPU, IRQ pinning off) gives one skipped check with the reason."
  - "Memory guard checks, where O(guard) enables them: C(guard_service), C(guard_config) and
    C(guard_last_run) (see O(guard))."
  - "With O(render_mode=true) nothing runs on the host, so every runtime check is V(skipped) with
    the reason C(render mode: nothing runs); the static check still runs. Skipped never counts as
    passed."
  - The task fails when any check failed (unless O(fail_on_failure=false)), with a message naming
    the host, and for each failed check the service or setting, the measured value and the target.
    A warning does not fail it. The checks are returned in either case, so a registered result can
    go into M(numafleet.tuning.verify_report).
options:
  plan:
    description:
      - The host's plan, as published by M(numafleet.tuning.numa_plan).
      - Defaults to C(ansible_facts.numafleet_plan) of the host; the task fails when neither is set.
    type: dict
  measured:
    description:
      - The registered result of M(numafleet.tuning.numa_locality_info) on the host (its
        C(services) and C(nodes) are used), or V(null) in render mode.
      - "The C(locality) of M(numafleet.tuning.host_apply) with C(measure.guard) also has
        C(guard), the memory guard's files read on the host: a placement listed under its
        C(spilled) (moved by C(numafleet_memory_act: migrate)) makes C(offnode_share) warn
        C(spilled (numafleet-guard moved it to node N at <time>)) instead of failing, and the
        O(guard) checks read its service state, settings and last run."
      - A skipped result counts as V(null). Outside render mode a measurement is required.
    type: raw
  unit_states:
    description:
      - The C(files) list that M(numafleet.tuning.pinned_units) returns in check mode, a list of
        dicts with C(path) and C(state) (V(create), V(update), V(remove) or V(unchanged)).
      - V(null) skips the C(rendered_units) check.
    type: raw
  layer_states:
    description:
      - The C(layers) dict of the result of M(numafleet.tuning.host_apply) in check mode (layer
        name to that layer's result; V(hugepages), V(kernel), V(mig) and V(mps) are read).
      - V(null) (the default) leaves out the layer checks C(hugepage_pools), C(kernel_settings),
        C(mig_layout), C(mps_settings) and C(irq_affinity).
  effective:
    description:
      - The C(effective) list of the units layer of M(numafleet.tuning.host_apply) (or
        M(numafleet.tuning.pinned_units)) - per planned unit, each planned property with its
        planned and effective value and the file that sets it, merged from every unit file and
        drop-in systemd reads, and the live values of C(systemctl show) on a live host.
      - Adds the static check C(effective_units) per planned service (subject its name) and tenant
        slice (subject the slice), also in render mode; outside render mode, a service whose
        effective CPUAffinity/AllowedCPUs differ from the plan fails C(cpus_binding), and one whose
        NUMAPolicy/NUMAMask/AllowedMemoryNodes differ fails C(mems_binding), naming the file,
        whatever its processes show now.
      - V(null) (the default) adds no such check.
    type: raw
  gpu_topology:
    description:
      - The GPU facts (C(ansible_facts.gpu_topology) of M(numafleet.tuning.numa_facts)) the AMD
        checks read; defaults to the host's C(ansible_facts.gpu_topology).
      - Adds the check C(gpu_partitions) when the plan has C(amd_partitions) (a host with AMD
        GPUs) - per AMD GPU (subject C(GPU <address>)) the compute and memory partition the facts
        show against the planned ones (a memory-partition change that waits for the driver
        reload warns C(pending reset)), per placement with C(ROCR_VISIBLE_DEVICES) that each
        UUID is exactly one GPU or logical GPU of the facts on one of the placement's planned
        nodes, and per placement with C(device_allow) that each render node is a GPU's or
        logical GPU's of the facts on one of those nodes.
    type: dict
  render_mode:
    description:
      - Whether the host is rendered into a directory instead of run (C(numafleet_render_root) is
        set). Runtime checks are then skipped with the reason.
    type: bool
    default: false
  require_runtime:
    description:
      - Whether a runtime check that was not run (skipped, for example in render mode or with
        nothing to measure) fails instead, with the reason it was not run
        (C(numafleet_verify_require_runtime)). The static check C(rendered_units) is never
        skipped for that reason.
    type: bool
    default: false
  fail_on_failure:
    description:
      - Whether the task fails when a check failed. With V(false) it returns the checks and the
        message in RV(msg) without failing, so that a later task can report every host first and
        then fail the ones with RV(status=fail) (C(playbooks/verify.yml) does).
      - Unusable input fails the task either way.
    type: bool
    default: true
  thresholds:
    description:
      - "Percentages (0 to 100): C(cross_node_target_pct) (default V(2)), C(memory_warn_pct)
        (default V(80)) and C(memory_fail_pct) (default V(90)). A missing or V(null) key takes its
        default; numeric strings are accepted."
      - C(memory_warn_pct) above C(memory_fail_pct), an unknown key or a value that is not a
        percentage fails the task with the fix.
    type: raw
    default: {}
  guard:
    description:
      - "The memory guard's settings of the host (C(playbooks/verify.yml) passes them from the
        host variables): C(enabled) (C(numafleet_memory_guard), default V(true)), C(warn_pct)
        (C(numafleet_memory_warn_pct), default V(80)), C(act_pct) (C(numafleet_memory_act_pct),
        default V(90), above C(warn_pct)), C(act) (C(numafleet_memory_act): V(reclaim),
        V(throttle) or V(migrate), default V(reclaim)) and C(interval_s)
        (C(numafleet_memory_guard_interval), seconds 1 to 3600, default V(15)). A missing or
        V(null) key takes its default; numeric and boolean strings are accepted."
      - "Where the guard is enabled, adds the checks C(guard_service) (C(systemctl is-active
        numafleet-guard.service) says V(active)), C(guard_config) (subject the config file,
        C(/etc/numafleet/guard.json): its C(warn_pct), C(act_pct), C(act) and C(interval_s)
        equal these) and C(guard_last_run) (the guard's last round, from its state file
        C(/run/numafleet-guard/state.json), at most 3 x C(interval_s) seconds ago by the host's
        clock), from C(guard) of O(measured) (M(numafleet.tuning.host_apply) with
        C(measure.guard)). They are skipped in render mode and when the measurement did not
        read the guard."
      - V(null) (the default) or C(enabled=false) adds no guard check. An unknown key or a bad
        value fails the task naming the host variable and the fix.
    type: raw
  host:
    description:
      - Host name used in the checks and messages. Defaults to C(inventory_hostname).
    type: str
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.conn
  - action_common_attributes.flow
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.controller_action
attributes:
  check_mode:
    support: full
    details: The same checks are computed in check mode.
  delegation:
    support: none
    details: The checks are computed on the controller anyway; delegation changes nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
  platform:
    platforms: all
notes:
  - The playbook C(playbooks/verify.yml) runs the whole sequence (facts, plan, pinned units in
    check mode, measurement, checks, report) on every host.
seealso:
  - module: numafleet.tuning.numa_locality_info
  - module: numafleet.tuning.numa_plan
  - module: numafleet.tuning.pinned_units
  - module: numafleet.tuning.verify_report
"""

EXAMPLES = r"""
- name: Compare the rendered units with the plan
  numafleet.tuning.pinned_units:
    plan: "{{ ansible_facts.numafleet_plan }}"
    service_manager: none
  check_mode: true
  register: units

- name: Measure the planned services
  numafleet.tuning.numa_locality_info:
    services: "{{ ansible_facts.numafleet_plan.placements }}"
  register: locality

- name: Evaluate the verify checks, failing later
  numafleet.tuning.numa_verify:
    measured: "{{ locality }}"
    unit_states: "{{ units.files }}"
    fail_on_failure: false
    thresholds:
      cross_node_target_pct: 2
      memory_warn_pct: 80
      memory_fail_pct: 90
  register: verify

- name: Print one line per host
  ansible.builtin.debug:
    msg: "{{ verify.summary }}"

- name: Fail the host when a check failed
  ansible.builtin.fail:
    msg: "{{ verify.msg }}"
  when: verify.status == 'fail'

- name: Check the rendered units only (render mode)
  numafleet.tuning.numa_verify:
    measured: null
    unit_states: "{{ units.files }}"
    render_mode: true

- name: Measure with the memory guard's files and check the guard too
  numafleet.tuning.host_apply:
    measure:
      guard:
        service: true
  check_mode: true
  register: applied

- name: Evaluate the checks, the guard's included
  numafleet.tuning.numa_verify:
    measured: "{{ applied.locality }}"
    unit_states: "{{ applied.layers.units.files }}"
    guard:
      enabled: true
      warn_pct: 80
      act_pct: 90
      act: migrate
      interval_s: 15
"""

RETURN = r"""
checks:
  description: One entry per host, check and subject, the rendered units first.
  returned: unless the inputs are unusable
  type: list
  elements: dict
  contains:
    host:
      description: The host.
      returned: always
      type: str
      sample: gpu-a100-01
    check:
      description:
        - The rule, one of V(rendered_units), V(running), V(cpus_binding), V(mems_binding),
          V(offnode_share), V(gpu_locality), V(memory_used), V(hugepages_total),
          V(hugepage_pools), V(kernel_settings), V(mig_layout), V(mps_settings) or
          V(irq_affinity).
      returned: always
      type: str
      sample: offnode_share
    subject:
      description: The service name, C(node<N>), the unit name, or C(manifest).
      returned: always
      type: str
      sample: llm-70b
    status:
      description: V(pass), V(fail), V(warn) or V(skipped).
      returned: always
      type: str
      sample: fail
    measured:
      description: The measured value in RV(checks[].unit), or V(null) when skipped.
      returned: always
      type: raw
      sample: 7.1
    target:
      description: The target in RV(checks[].unit).
      returned: always
      type: raw
      sample: 2
    unit:
      description: Unit of RV(checks[].measured) and RV(checks[].target), for example V(pct), V(cpulist) or V(file).
      returned: always
      type: str
      sample: pct
    message:
      description: What was found and, for a failure, the fix; a skipped check says why.
      returned: always
      type: str
      sample: "skipped: render mode: nothing runs"
    detail:
      description: A short form of the verdict, for the summary line.
      returned: always
      type: str
      sample: 7.1% > 2%
msg:
  description: When a check failed, the host and per failed check (the first five) the service or setting, the measured value and the target.
  returned: when a check failed
  type: str
  sample: "host gpu-a100-01: 1 verify check(s) failed: offnode_share embed: measured 7.1%, target 2% (...)"
summary:
  description: One line for the host, with counts by status and the first failures and warnings.
  returned: unless the inputs are unusable
  type: str
  sample: "gpu-a100-01: 4 passed, 0 failed, 16 skipped; status pass (render: 16 of 20 checks not run)"
status:
  description: V(fail) if any check failed, else V(warn) if any warned, else V(pass) if any passed, else V(skipped).
  returned: unless the inputs are unusable
  type: str
  sample: pass
status_text:
  description:
    - RV(status) for people, with the number of checks not run (skipped) when there are any, and
      C(render:) when all of them were skipped in render mode. A pass with most checks skipped
      never reads as a plain pass.
  returned: unless the inputs are unusable
  type: str
  sample: "pass (render: 16 of 20 checks not run)"
not_run:
  description: Number of checks not run (skipped).
  returned: unless the inputs are unusable
  type: int
  sample: 16
counts:
  description: Number of checks by status.
  returned: unless the inputs are unusable
  type: dict
  contains:
    pass:
      description: Checks that passed.
      type: int
      sample: 4
    fail:
      description: Checks that failed.
      type: int
      sample: 0
    warn:
      description: Checks that warned.
      type: int
      sample: 0
    skipped:
      description: Checks that could not run.
      type: int
      sample: 16
measured:
  description: The C(services) and C(nodes) of O(measured), or V(null); kept for the report's metrics.
  returned: unless the inputs are unusable
  type: dict
  sample: null
"""
