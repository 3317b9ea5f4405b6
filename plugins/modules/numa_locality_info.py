#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: numa_locality_info
short_description: Measure where planned services run and where their memory is
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Reads, for each planned service, the PIDs in C(cgroup.procs) of the unit's cgroup and its
    sub-cgroups under C(<cgroup_root>) (cgroup v2, else the v1 C(systemd) and C(cpuset)
    hierarchies), then C(<procfs_root>/<pid>/status) (C(Cpus_allowed_list), C(Mems_allowed_list))
    and C(<procfs_root>/<pid>/numa_maps) of every PID.
  - Reads C(<sysfs_root>/devices/system/node/node*/{meminfo,numastat,hugepages/}) for per-node
    memory use, hugepage totals and allocation counters, and
    C(<sysfs_root>/bus/pci/devices/<address>/numa_node) for the node of each planned GPU.
  - When O(perf=auto) and C(perf) is installed, runs
    C(perf stat -x, -e node-loads,node-load-misses -G <cgroup> -a -- sleep <window_s>) once per
    running service on cgroup v2.
  - Off-node share counts anonymous and hugetlb pages only (mappings with C(anon=) or C(huge));
    file-backed pages are reported apart and never in the ratio.
  - A process that exits while it is read is skipped. A unit without a cgroup is reported as not
    running, which is a measurement, not a failure.
options:
  services:
    description:
      - The planned services to measure. The placements of the plan
        (C(ansible_facts.numafleet_plan.placements)) can be passed as they are; keys other than
        those below are ignored.
      - "Each entry needs C(name). C(unit) (default V(<name>.service)) is the systemd unit whose
        cgroup holds the processes; C(slice), when set, is a slice the unit's cgroup must sit in."
      - "C(cpus) and C(mems) are the planned CPUs and memory nodes (sorted lists of ints): every
        process's C(Cpus_allowed_list) and C(Mems_allowed_list) must be inside them, and pages on
        nodes outside C(mems) are off-node."
      - "C(gpus) is a list of planned GPUs, each a dict with C(address) (PCI address) and C(node)."
    type: list
    elements: dict
    required: true
  cgroup_root:
    description: Where the host's cgroup file system is mounted. It must be a directory.
    type: path
    default: /sys/fs/cgroup
  window_s:
    description:
      - Seconds between the two C(numastat) samples, and the C(perf) measuring window.
      - V(0) takes one sample; RV(nodes[].numastat) then holds the counters since boot and
        RV(nodes[].numastat.miss_ratio) is V(null).
    type: float
    default: 5
  perf:
    description:
      - V(auto) runs C(perf) when it is on the PATH; V(never) does not run it.
      - Without C(perf), RV(services[].remote_access.available) is V(false) with the reason.
    type: str
    choices: [auto, never]
    default: auto
extends_documentation_fragment:
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
requirements:
  - C(perf) (optional, for RV(services[].remote_access))
notes:
  - Reading other users' C(numa_maps) needs root; run with C(become=true).
  - C(numastat) counts page allocations, not memory accesses.
seealso:
  - module: numafleet.tuning.numa_facts
"""

EXAMPLES = r"""
- name: Measure the planned services
  numafleet.tuning.numa_locality_info:
    services: "{{ ansible_facts.numafleet_plan.placements }}"
  register: __locality

- name: Show each service's off-node share
  ansible.builtin.debug:
    msg: "{{ item.name }}: {{ item.offnode_share }}"
  loop: "{{ __locality.services }}"

- name: Measure one service without perf and without waiting
  numafleet.tuning.numa_locality_info:
    services:
      - name: embed
        unit: embed.service
        cpus: [2, 3]
        mems: [1]
    window_s: 0
    perf: never
"""

RETURN = r"""
services:
  description: One entry per O(services) entry, in the same order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Name of the service.
      type: str
      sample: embed
    unit:
      description: The unit whose cgroup was read.
      type: str
      sample: embed.service
    running:
      description: Whether at least one process of the unit was read.
      type: bool
      sample: true
    pids:
      description: PIDs that were read, sorted.
      type: list
      elements: int
      sample: [1101]
    cgroup:
      description: Where the unit's cgroup was found, or V(null).
      type: dict
      contains:
        version:
          description: V(2) (unified) or V(1).
          type: int
          sample: 2
        path:
          description: Path relative to the hierarchy's root.
          type: str
          sample: numafleet.slice/embed.service
    binding:
      description: Allowed CPUs and nodes of the processes against the plan.
      type: dict
      contains:
        cpus_allowed:
          description: Union of the processes' C(Cpus_allowed_list).
          type: list
          elements: int
          sample: [2, 3]
        mems_allowed:
          description: Union of the processes' C(Mems_allowed_list).
          type: list
          elements: int
          sample: [1]
        cpus_ok:
          description: Every process's CPUs are inside the plan's; V(null) when not running.
          type: bool
          sample: true
        mems_ok:
          description: Every process's nodes are inside the plan's; V(null) when not running.
          type: bool
          sample: true
    pages_kb:
      description: Resident kB per node (node ids as strings).
      type: dict
      contains:
        anon_huge_by_node:
          description: Anonymous and hugetlb pages.
          type: dict
          sample: {"1": 20436}
        file_by_node:
          description: File-backed pages.
          type: dict
          sample: {"1": 13220}
    offnode_share:
      description: Anonymous and hugetlb kB outside the plan's nodes, divided by all of them; V(null) without any.
      type: float
      sample: 0.0
    gpu_locality:
      description: One entry per planned GPU.
      type: list
      elements: dict
      contains:
        address:
          description: PCI address.
          type: str
          sample: "0000:81:00.0"
        node:
          description: The GPU's node (sysfs, else the plan's), V(null) when unknown.
          type: int
          sample: 1
        ok:
          description: Whether that node is a planned node; V(null) when unknown.
          type: bool
          sample: true
    remote_access:
      description: C(node-load-misses / node-loads) of the unit's cgroup over the window.
      type: dict
      contains:
        available:
          description: Whether perf measured it.
          type: bool
          sample: false
        ratio:
          description: The ratio, or V(null).
          type: float
          sample: null
        reason:
          description: Why it is unavailable, or V(null).
          type: str
          sample: perf reports node-loads <not supported>
nodes:
  description: One entry per online NUMA node, sorted by id.
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: Node id.
      type: int
      sample: 1
    memory_total_kb:
      description: C(MemTotal) of C(nodeN/meminfo).
      type: int
      sample: 2015616
    memory_file_kb:
      description: C(Active(file)) plus C(Inactive(file)) of C(nodeN/meminfo), page cache the kernel can drop; V(null) when a line is missing.
      type: int
      sample: 27576
    memory_used_kb:
      description:
        - C(MemTotal) minus C(MemFree) minus RV(nodes[].memory_file_kb), never below 0; V(null)
          when a field is missing.
        - The memory guard (C(numafleet-guard)) uses the same definition, so the C(memory_used)
          check of verify and the guard judge a node alike. Shmem/tmpfs, mlocked pages, slab and
          the hugepage pool count as used.
      type: int
      sample: 172136
    memory_used_pct:
      description: RV(nodes[].memory_used_kb) over C(MemTotal) in percent, two decimals.
      type: float
      sample: 8.54
    hugepages:
      description: Hugepage pools of the node.
      type: list
      elements: dict
      contains:
        size_kb:
          description: Page size in kB.
          type: int
          sample: 2048
        total:
          description: Pages in the pool (C(nr_hugepages)), not free pages.
          type: int
          sample: 48
    numastat:
      description: Allocation counters of C(nodeN/numastat) over the window.
      type: dict
      contains:
        local_node:
          description: Pages allocated on this node for a process running on it.
          type: int
          sample: 1200
        other_node:
          description: Pages allocated on this node for a process running on another node.
          type: int
          sample: 12
        miss_ratio:
          description: C(other_node / (local_node + other_node)); V(null) without allocations or with O(window_s=0).
          type: float
          sample: 0.0099
"""

import functools
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.locality import (
    measure_on_host,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            services=dict(type="list", elements="dict", required=True),
            sysfs_root=dict(type="path", default="/sys"),
            procfs_root=dict(type="path", default="/proc"),
            cgroup_root=dict(type="path", default="/sys/fs/cgroup"),
            window_s=dict(type="float", default=5),
            perf=dict(type="str", default="auto", choices=["auto", "never"]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["window_s"] < 0:
        module.fail_json(msg=f"window_s={params['window_s']} must be 0 or more seconds")
    run = functools.partial(module.run_command, check_rc=False)
    try:
        result = measure_on_host(params["services"], params, run, module.get_bin_path, time.sleep)
    except NumaTuneError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
