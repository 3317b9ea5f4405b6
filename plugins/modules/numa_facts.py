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
  - "Reads the cpusets that bind services, where they exist: C(<sysfs_root>/fs/cgroup/cpuset.{cpus,mems}.effective)
    of the cgroup v2 root, of the cgroup PID 1 runs in (C(<procfs_root>/1/cgroup); a container),
    of its C(numafleet.slice) and C(system.slice) (reported only), C(<sysfs_root>/fs/cgroup/cpuset/cpuset.effective_{cpus,mems})
    of a cgroup v1 cpuset hierarchy, and C(<procfs_root>/1/status) (PID 1's C(Cpus_allowed_list) and
    C(Mems_allowed_list)), and publishes the intersection as RV(ansible_facts.numa.allowed) with each source."
  - Reports raw kernel truth. A PCI C(numa_node) of V(-1) is reported as V(null), never as node 0;
    the node is then inferred only from the device's local CPUs (C(local_cpulist), else
    C(local_cpus)) when they equal exactly one node's CPUs, or are a proper, non-empty subset of
    exactly one node's CPUs (C(node_source) says which). C(numa_node_raw) keeps the file's value
    as read.
  - A kernel without C(/sys/devices/system/node) yields one node 0 built from C(/proc/meminfo) and
    the online CPUs, with RV(ansible_facts.numa.numa_enabled=false).
  - A file that is unreadable, malformed, not a regular file, or missing although every kernel
    writes it, never fails the module; it becomes an entry in RV(ansible_facts.numa.warnings) with
    its path and the reason. Files that older kernels lack are read when present.
  - A file holding what the kernel never writes is such a warning too, and its value unknown,
    never an empty set - NUL bytes alone or inside the text (trailing NUL padding is fine), an
    empty C(online), C(possible), C(present) or C(node/online) list, an empty cpumask, a node CPU
    list naming CPUs beyond C(possible), an SMT sibling list without the CPU itself, a distance
    row of the wrong width or out of range, a negative hugepage count, a PCI C(numa_node) naming
    a node that does not exist. An empty node C(cpulist) is a CPU-less memory node (CXL, HBM,
    GPU memory), not a warning.
  - Fails, naming the option, when O(sysfs_root) has no C(devices/system/cpu) directory or
    O(procfs_root) is not a directory, so a mistyped root is never read as an empty machine.
  - With O(gpu=true) it also publishes C(ansible_facts.gpu_topology), exactly what
    M(numafleet.tuning.gpu_topology_facts) publishes for the same roots, snapshot and
    C(nvidia-smi) options (NVML through C(pynvml), else C(nvidia-smi -q -x), else sysfs only;
    see that module). The sysfs files both facts need are read once.
  - With O(state_paths) it also publishes C(ansible_facts.numafleet_state_paths), the listed paths
    that exist on the host, so that a play can skip a role that has nothing to apply and nothing
    to remove without running another module.
  - With O(recorded_root) it also publishes C(ansible_facts.numafleet_recorded) - what the last
    apply left below that root - the plan it recorded (C(/etc/numafleet/plan.json)) and the
    sha256 digests of the files its manifests (C(/etc/numafleet/manifest.json),
    C(/etc/numafleet/mps-units.json)) list, so that the next plan keeps placements where they are
    and the change plan knows which units will change.
  - One execution of this module with O(gpu=true), O(state_paths) and O(recorded_root) gathers
    everything the collection's roles read from a host.
options:
  gpu:
    description:
      - Also gather the host's GPUs and publish them as C(ansible_facts.gpu_topology), as
        M(numafleet.tuning.gpu_topology_facts) does, in the same module execution.
      - O(gpu_snapshot), O(gpu_snapshot_out), O(nvidia_smi) and O(nvidia_smi_timeout) are used
        only when this is V(true).
    type: bool
    default: false
  gpu_snapshot:
    description:
      - A GPU snapshot file, read instead of NVML and C(nvidia-smi), as
        O(numafleet.tuning.gpu_topology_facts#module:snapshot) is.
      - Such a file is written by O(gpu_snapshot_out) or by
        O(numafleet.tuning.gpu_topology_facts#module:snapshot_out).
      - A file that is missing or malformed fails the module with the reason.
    type: path
  gpu_snapshot_out:
    description:
      - Write the GPU state that was read (from NVML, C(nvidia-smi) or O(gpu_snapshot)) to this
        file on the target, as JSON, replacing it.
      - Nothing is written in check mode; RV(gpu_snapshot_written) says whether the file was
        written.
    type: path
  nvidia_smi:
    description:
      - When to run C(nvidia-smi -q -x) for the GPU facts, as the option of the same name of
        M(numafleet.tuning.gpu_topology_facts).
      - V(auto) runs it only when NVML cannot be used and C(nvidia-smi) is found in C(PATH); its
        failure is reported in C(ansible_facts.gpu_topology.nvidia_smi.reason) (documented in
        M(numafleet.tuning.gpu_topology_facts)), not as a failed task.
      - V(always) uses it instead of NVML and fails the task when it is missing or fails.
      - V(never) does not run it.
      - Ignored with O(gpu_snapshot).
    type: str
    choices: [auto, always, never]
    default: auto
  nvidia_smi_timeout:
    description:
      - How many seconds C(nvidia-smi -q -x) may run before it is stopped (C(SIGTERM), then
        C(SIGKILL) 5 seconds later), through coreutils C(timeout).
      - Must be 1 or more.
    type: int
    default: 30
  state_paths:
    description:
      - Absolute paths on the host to look for; those that exist (a dangling symbolic link
        counts) are published in RV(ansible_facts.numafleet_state_paths), in the order given.
      - Meant for the collection's own state files (for example C(/etc/numafleet/mig.json) or
        C(/etc/numafleet/mps-units.json)), so that the controller can skip a role that has
        nothing to apply and nothing to remove, without another module execution.
      - A relative path fails the module, naming the entry of O(state_paths).
      - With the default V([]) nothing is looked for and the fact is not published.
    type: list
    elements: path
    default: []
  recorded_root:
    description:
      - Directory below which the collection's files of the last apply are read; V(/) for the host
        itself, or the render root in render mode.
      - Publishes RV(ansible_facts.numafleet_recorded). A plan file that is a symbolic link, not a
        regular file, not JSON or too large is reported as V(invalid) with the reason, never used.
      - Unset (the default), nothing is read and the fact is not published.
    type: path
  reuse_cached:
    description:
      - Decided on the controller. With V(true), when the host's facts (from a fact cache, or an
        earlier task of the run) answer this task - the same O(sysfs_root) and O(procfs_root),
        GPU facts when O(gpu=true), the recorded state below the same root and the state paths
        when O(state_root) or O(recorded_root) is given - no module is sent and the task returns
        those facts, with RV(cached=true).
      - Cached facts of another format (RV(ansible_facts.numa.facts_version) is not this
        release's, e.g. kept by a fact cache from an older release) never answer; the module
        runs and the cache gets the new facts.
      - Explicit O(state_paths) or O(gpu_snapshot_out) always run the module.
      - C(site.yml) sets it, because its apply (M(numafleet.tuning.host_apply), option C(recorded_digest))
        compares the collection's recorded state with the host under its lock before it changes
        anything, refuses a stale one, and returns the state afresh for the cache. The topology
        itself is trusted from the cache until it expires, so flush it (C(--flush-cache)) after
        hardware or driver changes.
    type: bool
    default: false
  state_root:
    description:
      - The root of the collection's own files on the host, V(/) for the host itself or the
        render root in render mode. Shorthand for O(recorded_root) (when that is unset) plus
        O(state_paths) C(<root>/etc/numafleet/mig.json) and C(<root>/etc/numafleet/mps-units.json),
        which is what C(site.yml) and C(drift_check.yml) read.
      - A value that is not an absolute path (an empty or relative render root) reads nothing; the
        input checks of M(numafleet.tuning.numa_plan) then refuse it, naming the host variable.
    type: str
extends_documentation_fragment:
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.facts_module
attributes:
  check_mode:
    support: full
    details: In check mode the facts are gathered as usual and O(gpu_snapshot_out) is not written.
  diff_mode:
    support: none
  idempotent:
    support: full
  facts:
    support: full
requirements:
  - With O(gpu=true), nvidia-ml-py (C(import pynvml)) on the target for NVML data; optional.
  - With O(gpu=true), C(nvidia-smi) on the target for the fallback; optional.
  - With O(gpu=true), coreutils C(timeout) on the target to enforce O(nvidia_smi_timeout); optional.
notes:
  - hwloc hides some of what this module reports (offline CPUs, CPU-only memory-less nodes); this
    module reports sysfs as it is, and the planner decides what is usable.
  - With O(gpu=true) on Linux, C(pynvml) is imported only when NVML's library
    C(libnvidia-ml.so.1) loads; otherwise C(nvmlInit) could only fail, and its reason
    (C(NVML Shared Library Not Found)) is reported without the import, which costs more than the
    rest of the run. M(numafleet.tuning.gpu_topology_facts) does the same.
  - The module always returns C(changed=false), also when it writes O(gpu_snapshot_out), which is
    a recording, not a change to the host.
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

- name: Gather NUMA, GPU and state-file facts in one module execution
  numafleet.tuning.numa_facts:
    gpu: true
    state_paths:
      - /etc/numafleet/mig.json
      - /etc/numafleet/mps-units.json

- name: Show each GPU's node, and whether MIG state was recorded on this host
  ansible.builtin.debug:
    msg: >-
      {{ ansible_facts.gpu_topology.gpus | map(attribute='node') | list }};
      MIG state file {{ 'present' if '/etc/numafleet/mig.json' in ansible_facts.numafleet_state_paths else 'absent' }}

- name: Plan a host from a recorded tree and GPU snapshot
  numafleet.tuning.numa_facts:
    sysfs_root: /srv/captures/gpu-node-17/sys
    procfs_root: /srv/captures/gpu-node-17/proc
    gpu: true
    gpu_snapshot: /srv/captures/gpu-node-17/gpu-snapshot.json
  register: __facts
"""

RETURN = r"""
cached:
  description: Whether the facts came from the host's cached facts (O(reuse_cached)) rather than from the host.
  returned: always
  type: bool
  sample: false
gpu_snapshot_written:
  description: Whether O(gpu_snapshot_out) was written (never in check mode, never without O(gpu=true)).
  returned: always
  type: bool
  sample: false
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
              description:
                - CPUs of the node (C(nodeN/cpulist), else C(nodeN/cpumap) on kernels without
                  C(cpulist)); empty for a CPU-less node.
                - Also empty when the list could not be used (NUL bytes, garbage); the node's
                  C(kind) is then V(unknown) and the file is in RV(ansible_facts.numa.warnings).
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
              description:
                - ACPI SLIT row (C(nodeN/distance)), aligned with RV(ansible_facts.numa.node_ids).
                - Empty when the row could not be used - not one entry per online node, not 10 to
                  the node itself, or not 11-255 to another (see RV(ansible_facts.numa.warnings)).
              type: list
              elements: int
              sample: [10, 20]
            hugepages:
              description:
                - Per-node hugepage pools, one per page size, sorted by size.
                - A count that is unreadable or negative is V(null) (see
                  RV(ansible_facts.numa.warnings)).
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
            normal_memory:
              description:
                - Whether the node is listed in C(/sys/devices/system/node/has_normal_memory)
                  (it has ZONE_NORMAL memory); V(null) when the file is missing.
                - V(false) for a memory-less node, and for memory onlined movable only (GPU memory,
                  DAX memory onlined movable).
              type: bool
              sample: true
            gpu_owner:
              description:
                - PCI address of the GPU whose own memory this node is, from the C(Node:) line of
                  the NVIDIA driver's C(/proc/driver/nvidia/gpus/<address>/numa_status)
                  (POWER9+V100, Grace Hopper, GB200); V(null) otherwise.
                - The planner never binds a placement's memory to such a node.
                - A C(numa_status) naming a node that has CPUs is not trusted, as a GPU's memory node has
                  none; that node's C(gpu_owner) stays V(null) and C(warnings) names the file.
              type: str
              sample: "0004:05:00.0"
            memory_tier:
              description:
                - Id N of the C(/sys/devices/virtual/memory_tiering/memory_tierN) whose
                  C(nodelist) holds the node (Linux 6.1+); a smaller N is a faster tier.
                - V(null) without memory tiers.
              type: int
              sample: 4
            memory_backing:
              description:
                - V(cxl) when a DAX device below a CXL region (C(/sys/bus/cxl/devices/regionZ))
                  targets the node (C(/sys/bus/dax/devices/daxX.Y/target_node)), V(dax) when a DAX
                  device that is not CXL does (persistent memory, soft-reserved or HBM ranges).
                - V(null) when no DAX device targets the node.
              type: str
              sample: cxl
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
              description: >-
                C(topology/physical_package_id), V(null) when offline, absent or V(-1) (the
                kernel's "unknown", as arch_topology reports on platforms whose firmware or
                device tree gives no package).
              type: int
            die:
              description: C(topology/die_id), V(null) when absent or V(-1).
              type: int
            core:
              description: C(topology/core_id) (unique within a package only).
              type: int
            siblings:
              description:
                - SMT siblings of the CPU including itself (C(thread_siblings_list), else the
                  C(thread_siblings) mask); empty for an offline CPU.
                - V(null) (unknown) for an online CPU when neither file gives a set holding the
                  CPU itself (a C(siblings_unknown) finding in RV(ansible_facts.numa.consistency)).
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
            osrelease:
              description:
                - The running kernel's release, from C(<procfs_root>/sys/kernel/osrelease), else
                  the first line of C(<procfs_root>/version) (C(Linux version <release> ...)).
                - V(null) when neither can be read (a malformed file is a warning).
                - M(numafleet.tuning.topology_capture) records the file used, so boot-time hugepage
                  reservations render from a recording; numa_plan refuses them before the gate
                  when the release is unknown or older than 5.16.
              type: str
              sample: 6.1.0-18-amd64
            osrelease_source:
              description: V(/proc/sys/kernel/osrelease) or V(/proc/version) (as on the host), V(null) with no release.
              type: str
              sample: /proc/sys/kernel/osrelease
            cmdline:
              description:
                - The running kernel's command line, C(<procfs_root>/cmdline), V(null) when absent
                  (recordings usually lack it). The change plan and the hugepages layer compare
                  it with the arguments numafleet wrote (the reboot contract).
              type: str
              sample: BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/vda1 ro nohz_full=2-7
            nohz_full_supported:
              description:
                - Whether C(<sysfs_root>/devices/system/cpu/nohz_full) exists, which the kernel
                  creates only when built with C(CONFIG_NO_HZ_FULL); V(null) when the CPU
                  directory itself is absent. C(numafleet_kernel_isolation=nohz_full) is refused
                  when V(false).
              type: bool
              sample: true
        consistency:
          description: Findings about the machine itself (not about files).
          type: list
          elements: dict
          returned: always
          contains:
            kind:
              description:
                - V(split_core) (a core's SMT siblings sit in two nodes) or
                  V(cpus_in_offline_node).
                - V(cpus_without_node) - online CPUs that no node's CPU list holds (its C(nodes)
                  are the nodes of kind V(unknown)); placements never use them.
                - V(siblings_unknown) - online CPUs whose SMT siblings could not be read; the
                  planner groups them by their siblings' lists, else one CPU per core.
                - V(device_on_missing_node) - a PCI device whose C(numa_node) names a node that
                  does not exist (in C(nodes)); its locality is unknown, as for V(-1).
                - V(nodes_cross_packages) - NUMA nodes and CPU packages cut across each other both
                  ways (a package spans several nodes and a node spans several packages, from
                  C(physical_package_id) and the node CPU lists), as a vNUMA guest not lined up
                  with its sockets presents; C(nodes), C(packages) and C(cpus) name them. The
                  planner does not trust the SMT siblings there and plans each CPU of those nodes
                  as a core of its own.
              type: str
            cpus:
              description: CPUs concerned.
              type: list
              elements: int
            nodes:
              description: Nodes concerned.
              type: list
              elements: int
            packages:
              description: Packages concerned (C(physical_package_id)); only in V(nodes_cross_packages) findings.
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
              description:
                - C(numa_node) file; V(null) when the kernel says V(-1) (unknown).
                - Also V(null) when it names a node that does not exist (a
                  C(device_on_missing_node) finding); C(node) is then inferred as for V(-1).
              type: int
            local_cpus:
              description: C(local_cpulist) (else C(local_cpus)) of the device.
              type: list
              elements: int
            node:
              description: The node to use for placement, or V(null) when unknown.
              type: int
            node_source:
              description:
                - V(numa_node) (sysfs said so), V(local_cpulist) (C(numa_node) unknown, local CPUs
                  equal exactly one node's CPUs), V(local_cpulist_subset) (C(numa_node) unknown,
                  local CPUs a proper, non-empty subset of exactly one node's CPUs), or V(null).
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
            numa_node_raw:
              description: The C(numa_node) file as read (V(-1) included, or a node that does not exist); V(null) when the file is missing or unreadable.
              type: int
              sample: -1
        nodes_per_package:
          description:
            - How many nodes hold CPUs of each package (C(physical_package_id) of the online CPUs
              and the node CPU lists; never guessed from package or die counts).
            - One number when every package has the same count, else a mapping of package id
              (a string) to count; V(null) when no CPU has a package id (a
              C(physical_package_id) of V(-1) is no package id).
          type: raw
          returned: always
          sample: 4
        snc_like:
          description:
            - V(true) when a package holds two or more nodes, each of them inside that package
              alone (Intel SNC, AMD NPS, cluster-on-die, multi-chip modules). Nodes that cut
              across packages (a V(nodes_cross_packages) finding) are not SNC-like.
          type: bool
          returned: always
          sample: true
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
        allowed:
          description:
            - The CPUs and memory nodes the collection's services may use - the intersection of
              the cgroup cpusets above them - and where that came from. The planner plans only
              inside them. See the module's description for the files.
            - Without any of those files (a recorded dump usually lacks them) it is every online
              CPU and node, and RV(ansible_facts.numa.allowed.narrowed=false).
          type: dict
          returned: always
          contains:
            cpus:
              description: The online CPUs every applied source allows, sorted.
              type: list
              elements: int
              sample: [0, 1, 2, 3]
            mems:
              description: The online NUMA nodes every applied source allows, sorted.
              type: list
              elements: int
              sample: [0]
            narrowed:
              description: Whether RV(ansible_facts.numa.allowed.cpus) or RV(ansible_facts.numa.allowed.mems) lacks an online CPU or node.
              type: bool
            sources:
              description: Every source read, in the order read.
              type: list
              elements: dict
              contains:
                source:
                  description:
                    - V(cgroup2_root), V(cgroup2_container) (the cgroup PID 1 runs in, when the host is a
                      container), V(cgroup2_slice) (numafleet.slice), V(system_slice) (system.slice,
                      reported only), V(cgroup1_root), V(cgroup1_container), or V(pid1)
                      (C(<procfs_root>/1/status), applied only when no cgroup file was read).
                  type: str
                path:
                  description: The file the CPUs came from.
                  type: str
                mems_path:
                  description: The file the memory nodes came from.
                  type: str
                cpus:
                  description: The CPUs it allows; V(null) when its file gave none.
                  type: list
                  elements: int
                mems:
                  description: The memory nodes it allows; V(null) when its file gave none.
                  type: list
                  elements: int
                applies:
                  description: Whether it is part of the intersection.
                  type: bool
        pid1:
          description: PID 1's own affinity, from C(Cpus_allowed_list) and C(Mems_allowed_list) of C(<procfs_root>/1/status).
          type: dict
          returned: always
          contains:
            cpus_allowed:
              description: The CPUs PID 1 may run on, sorted; V(null) when the file is missing or unusable.
              type: list
              elements: int
            mems_allowed:
              description: The memory nodes PID 1 may allocate on, sorted; V(null) when unknown.
              type: list
              elements: int
            path:
              description: The file read.
              type: str
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
        facts_version:
          description:
            - The format of these facts, bumped when a release adds keys the controller needs
              (V(2) added C(allowed), C(pid1), C(kernel.osrelease) and the node and
              device keys).
            - O(reuse_cached) answers only with cached facts of the current format; older
              cached facts are gathered again.
          type: int
          returned: always
          sample: 2
    gpu_topology:
      description:
        - GPUs of the host and where their values came from, exactly as
          M(numafleet.tuning.gpu_topology_facts) publishes them for the same roots and options
          (C(gpus), C(sources), C(driver_version), C(warnings) and more). The RETURN of that module
          documents every key; both modules publish it from the same code, this one in the same
          execution as the NUMA facts.
      returned: when O(gpu=true)
      type: dict
    numafleet_state_paths:
      description:
        - The entries of O(state_paths) that exist on the host (C(os.path.lexists); a dangling
          symbolic link counts), in the order given.
        - A playbook skips a role when none of its state files is listed and it has nothing to
          apply.
      returned: when O(state_paths) is not empty
      type: list
      elements: str
      sample: ["/etc/numafleet/mig.json"]
    numafleet_recorded:
      description:
        - What the last apply left below O(recorded_root).
      returned: when O(recorded_root) is set
      type: dict
      contains:
        root:
          description: O(recorded_root).
          type: str
          sample: /
        plan_path:
          description: Where the plan is recorded, as on the host.
          type: str
          sample: /etc/numafleet/plan.json
        state:
          description: V(absent), V(present) or V(invalid) (see RV(ansible_facts.numafleet_recorded.error)).
          type: str
          sample: present
        error:
          description: Why the plan file is V(invalid); V(null) otherwise.
          type: str
          sample: is not JSON (Expecting value, line 1 column 1 (char 0))
        plan:
          description: The recorded plan (the C(numafleet_plan) fact of the last apply); V(null) unless V(present).
          type: dict
          sample: {version: 1, host: gpu-a100-01, placements: []}
        plan_sha256:
          description:
            - The sha256 hex digest of the plan file's bytes; V(null) when it is absent, or V(other)
              or V(unreadable) as in RV(ansible_facts.numafleet_recorded.files).
            - M(numafleet.tuning.host_apply) compares it, with RV(ansible_facts.numafleet_recorded.files),
              against the host before it changes anything.
          type: str
          sample: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
        files:
          description:
            - Every file the manifests list, and each manifest, as on the host, mapped to the
              sha256 hex digest of its content, V(null) when absent, or V(other) (a symbolic
              link, or reached through one, or no regular file), V(unreadable), or V(kept).
            - V(kept) marks a file the apply modules will not remove as theirs (a link, or content
              changed since numafleet wrote it); see
              RV(ansible_facts.numafleet_recorded.kept).
          type: dict
          sample: {/etc/systemd/system/numafleet-embed.service: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}
        manifest_errors:
          description: Manifests that could not be read or parsed (or are links), with the reason.
          type: list
          elements: str
          sample: []
        kept:
          description:
            - One message per file a manifest lists that numafleet will not stop or remove,
              with the reason; the change plan leaves these files out of its stops and removals.
          type: list
          elements: str
          sample: []
        kernel_args:
          description:
            - The kernel command line arguments the hugepages layer wrote last (its state file
              C(/etc/numafleet/hugepages.json)); V([]) without that file, V(null) when it cannot
              be read.
          type: list
          elements: str
          sample: [hugepagesz=1G, "hugepages=0:4,1:4", nohz_full=2-7]
"""

import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import (
    gather_facts,
    state_files_below,
)


def load_nvml() -> tuple:
    """(pynvml module, None), or (None, why it cannot be imported)."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py (import pynvml) is not installed for {sys.executable}: {exc}"
    return pynvml, None


def load_amdsmi() -> tuple:
    """(amdsmi module, None), or (None, why it cannot be imported); asked only on AMD hosts."""
    try:
        import amdsmi
    except Exception as exc:  # ImportError, or the library failing to load libamd_smi.so
        return None, f"amdsmi is not importable for {sys.executable}: {exc}"
    return amdsmi, None


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            procfs_root=dict(type="path", default="/proc"),
            gpu=dict(type="bool", default=False),
            gpu_snapshot=dict(type="path"),
            gpu_snapshot_out=dict(type="path"),
            nvidia_smi=dict(type="str", default="auto", choices=["auto", "always", "never"]),
            nvidia_smi_timeout=dict(type="int", default=30),
            state_paths=dict(type="list", elements="path", default=[]),
            recorded_root=dict(type="path"),
            state_root=dict(type="str"),
            reuse_cached=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = dict(module.params)
    params.pop("reuse_cached")  # decided on the controller (plugins/action/numa_facts.py)
    root = params.pop("state_root")
    if root is not None and root.startswith("/"):
        params["state_paths"] = list(params["state_paths"]) + state_files_below(root)
        if params["recorded_root"] is None:
            params["recorded_root"] = root.rstrip("/") or "/"

    def run(argv: list) -> tuple:
        return module.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C"})

    try:
        facts, written = gather_facts(
            params, module.check_mode, run, module.get_bin_path, load_nvml, load_amdsmi
        )
    except NumaTuneError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, gpu_snapshot_written=written, ansible_facts=facts)


if __name__ == "__main__":
    main()
