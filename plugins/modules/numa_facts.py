#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: numa_facts
short_description: Gather NUMA nodes, CPUs, hugepage pools, PCI locality and kernel NUMA knobs
version_added: 0.1.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Reads C(<sysfs_root>/devices/system/node/node*/{cpulist,cpumap,meminfo,distance,numastat,hugepages/}),
    C(<sysfs_root>/devices/system/cpu/{online,offline,possible,present,isolated,nohz_full}),
    C(<sysfs_root>/devices/system/cpu/cpu*/topology/), C(<sysfs_root>/kernel/mm/hugepages/),
    C(<sysfs_root>/kernel/mm/transparent_hugepage/{enabled,defrag}),
    C(<sysfs_root>/bus/pci/devices/*/{class,vendor,device,numa_node,local_cpulist,local_cpus}),
    C(<procfs_root>/meminfo), C(<procfs_root>/sys/kernel/numa_balancing) and
    C(<procfs_root>/sys/vm/zone_reclaim_mode), and publishes them as C(ansible_facts.numa).
  - Reports raw kernel truth. A PCI C(numa_node) of V(-1) is reported as V(null), never as node 0;
    the node is then inferred only when the device's local CPUs equal exactly one node's CPUs.
  - A kernel without C(/sys/devices/system/node) yields one node 0 built from C(/proc/meminfo) and
    the online CPUs, with RV(ansible_facts.numa.numa_enabled=false).
  - A file that is unreadable, malformed, not a regular file, or missing although every kernel
    writes it, never fails the module; it becomes an entry in RV(ansible_facts.numa.warnings) with
    its path and the reason. Files that older kernels lack are read when present.
  - Fails, naming the option, when O(sysfs_root) has no C(devices/system/cpu) directory or
    O(procfs_root) is not a directory, so a mistyped root is never read as an empty machine.
options: {}
extends_documentation_fragment:
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.facts_module
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
  facts:
    support: full
notes:
  - hwloc hides some of what this module reports (offline CPUs, CPU-only memory-less nodes); this
    module reports sysfs as it is, and the planner decides what is usable.
seealso:
  - module: numafleet.tuning.gpu_topology_facts
"""

EXAMPLES = r"""
- name: Gather NUMA facts
  numafleet.tuning.numa_facts:

- name: Read a recorded topology instead of the live host
  numafleet.tuning.numa_facts:
    sysfs_root: /srv/captures/gpu-node-17/sys
    procfs_root: /srv/captures/gpu-node-17/proc

- name: Show the CPUs of each node
  ansible.builtin.debug:
    msg: "node {{ item.id }}: {{ item.cpus | numafleet.tuning.cpulist }} ({{ item.kind }})"
  loop: "{{ ansible_facts.numa.nodes }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts published by the module.
  returned: always
  type: dict
  contains:
    numa:
      description: NUMA topology of the host.
      returned: always
      type: dict
      contains:
        numa_enabled:
          description: Whether the kernel exposes NUMA nodes (C(/sys/devices/system/node) exists).
          type: bool
          returned: always
          sample: true
        node_ids:
          description: Online node ids, sorted; the order of every C(distances) row.
          type: list
          elements: int
          returned: always
          sample: [0, 1]
        nodes:
          description: One entry per online NUMA node, sorted by id.
          type: list
          elements: dict
          returned: always
          contains:
            id:
              description: Node id (ids can be sparse).
              type: int
              sample: 0
            cpus:
              description: CPUs of the node (C(nodeN/cpulist), else C(nodeN/cpumap)).
              type: list
              elements: int
              sample: [0, 1, 2, 3]
            memory_kb:
              description: C(MemTotal) of C(nodeN/meminfo) in kB, V(null) if unreadable.
              type: int
              sample: 1996992
            memfree_kb:
              description: C(MemFree) of C(nodeN/meminfo) in kB, V(null) if unreadable.
              type: int
              sample: 1815904
            kind:
              description:
                - V(cpu+memory), V(cpu-only), V(memory-only) or V(empty).
                - V(unknown) when the node's CPU list or its C(meminfo) could not be read (see
                  RV(ansible_facts.numa.warnings)); the kind is never guessed.
              type: str
              sample: cpu+memory
            distances:
              description: ACPI SLIT row (C(nodeN/distance)), aligned with RV(ansible_facts.numa.node_ids).
              type: list
              elements: int
              sample: [10, 20]
            hugepages:
              description: Per-node hugepage pools, one per page size, sorted by size.
              type: list
              elements: dict
              contains:
                size_kb:
                  description: Page size in kB.
                  type: int
                  sample: 2048
                total:
                  description: Pages in the pool (C(nr_hugepages)).
                  type: int
                  sample: 48
                free:
                  description: Free pages (C(free_hugepages)).
                  type: int
                  sample: 16
                surplus:
                  description: Surplus pages (C(surplus_hugepages)).
                  type: int
                  sample: 0
                reserved:
                  description: Always V(null) per node (the kernel keeps reservations only globally).
                  type: int
                  sample: null
            numastat:
              description: Counters of C(nodeN/numastat) (pages allocated, not accesses).
              type: dict
              sample: {numa_hit: 60410, numa_miss: 0, local_node: 56147, other_node: 4263}
        cpus:
          description: Kernel CPU sets of C(/sys/devices/system/cpu), each a sorted list of CPU ids.
          type: dict
          returned: always
          contains:
            possible:
              description: Possible CPUs.
              type: list
              elements: int
            present:
              description: Present CPUs.
              type: list
              elements: int
            online:
              description: Online CPUs (from C(online), else the per-CPU C(online) files).
              type: list
              elements: int
            offline:
              description: Offline CPUs.
              type: list
              elements: int
            isolated:
              description: CPUs isolated with C(isolcpus=).
              type: list
              elements: int
            nohz_full:
              description: Tickless CPUs (C(nohz_full=)); a kernel's V((null)) reads as empty.
              type: list
              elements: int
        per_cpu:
          description: One entry per CPU; topology fields are V(null) for offline CPUs.
          type: list
          elements: dict
          returned: always
          contains:
            id:
              description: CPU id.
              type: int
            online:
              description: Whether the CPU is online.
              type: bool
            node:
              description: Node whose CPU list holds the CPU, or V(null).
              type: int
            package:
              description: C(topology/physical_package_id).
              type: int
            die:
              description: C(topology/die_id), V(null) when absent or V(-1).
              type: int
            core:
              description: C(topology/core_id) (unique within a package only).
              type: int
            siblings:
              description: SMT siblings of the CPU including itself (C(thread_siblings_list)).
              type: list
              elements: int
        packages:
          description: Packages (sockets) with their CPUs and the nodes those CPUs belong to.
          type: list
          elements: dict
          returned: always
          contains:
            id:
              description: Package id.
              type: int
            cpus:
              description: Online CPUs of the package.
              type: list
              elements: int
            nodes:
              description: Nodes of those CPUs (several with SNC or NPS modes).
              type: list
              elements: int
        hugepages:
          description: System-wide hugepage pools (C(/sys/kernel/mm/hugepages)), same keys as a node's pools, with C(reserved) filled in.
          type: list
          elements: dict
          returned: always
        default_hugepage_size_kb:
          description: C(Hugepagesize) of C(/proc/meminfo) in kB, V(null) if unknown.
          type: int
          returned: always
          sample: 2048
        kernel:
          description: Kernel NUMA knobs; V(null) where the file is absent.
          type: dict
          returned: always
          contains:
            numa_balancing:
              description: C(/proc/sys/kernel/numa_balancing).
              type: int
              sample: 1
            zone_reclaim_mode:
              description: C(/proc/sys/vm/zone_reclaim_mode).
              type: int
              sample: 0
            thp_enabled:
              description: Selected value of C(transparent_hugepage/enabled).
              type: str
              sample: always
            thp_defrag:
              description: Selected value of C(transparent_hugepage/defrag).
              type: str
              sample: madvise
        consistency:
          description: Findings about the machine itself (not about files).
          type: list
          elements: dict
          returned: always
          contains:
            kind:
              description: V(split_core) (a core's SMT siblings sit in two nodes) or V(cpus_in_offline_node).
              type: str
            cpus:
              description: CPUs concerned.
              type: list
              elements: int
            nodes:
              description: Nodes concerned.
              type: list
              elements: int
            message:
              description: What was found and what it means for placement.
              type: str
        pci_devices:
          description: PCI functions that matter for placement (GPUs, NICs, NVMe, CXL memory), sorted by address.
          type: list
          elements: dict
          returned: always
          contains:
            address:
              description: PCI address C(DDDD:BB:DD.F); the domain may be 32 bits wide.
              type: str
              sample: "0000:81:00.0"
            domain:
              description: PCI domain number.
              type: int
            bus:
              description: PCI bus number.
              type: int
            kind:
              description: V(gpu) (NVIDIA C(0x10de) or AMD C(0x1002) display, 3D or accelerator class), V(nic), V(nvme) or V(cxl_memory).
              type: str
            class_code:
              description: C(class) file, as the kernel writes it.
              type: str
              sample: "0x030200"
            vendor_id:
              description: C(vendor) file.
              type: str
              sample: "0x10de"
            device_id:
              description: C(device) file.
              type: str
              sample: "0x20b5"
            numa_node:
              description: C(numa_node) file; V(null) when the kernel says V(-1) (unknown).
              type: int
            local_cpus:
              description: C(local_cpulist) (else C(local_cpus)) of the device.
              type: list
              elements: int
            node:
              description: The node to use for placement, or V(null) when unknown.
              type: int
            node_source:
              description: V(numa_node) (sysfs said so), V(local_cpulist) (local CPUs equal exactly one node's CPUs), or V(null).
              type: str
            host_bridge:
              description: Host bridge directory name (C(pci0000:80)) above the device.
              type: str
            upstream:
              description: PCI addresses between the host bridge and the device, root port first.
              type: list
              elements: str
            root_port:
              description: First entry of RV(ansible_facts.numa.pci_devices[].upstream), or V(null).
              type: str
            switch:
              description: Upstream port of the PCIe switch directly above the device, or V(null); devices with the same value share a switch.
              type: str
        sysfs_root:
          description: The sysfs root that was read.
          type: str
          returned: always
          sample: /sys
        procfs_root:
          description: The procfs root that was read.
          type: str
          returned: always
          sample: /proc
        warnings:
          description: Files that could not be used; each leaves the fields it feeds V(null) or empty.
          type: list
          elements: dict
          returned: always
          contains:
            path:
              description: The file or directory.
              type: str
            reason:
              description: Why it could not be used.
              type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            procfs_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )
    try:
        facts = read_numa_facts(Reader(module.params["sysfs_root"], module.params["procfs_root"]))
    except NumaTuneError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"numa": facts})


if __name__ == "__main__":
    main()
