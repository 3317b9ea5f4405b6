#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

# Documentation only: numa_plan is an action plugin (plugins/action/numa_plan.py) that runs on the
# controller; nothing of it is sent to the managed host.

DOCUMENTATION = r"""
module: numa_plan
short_description: Plan where each model service runs (NUMA node, CPUs, memory, GPUs, MIG, MPS)
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Turns a host's placements (O(placements), usually the host variable C(numafleet_placements))
    into a plan from the host's topology facts, and publishes it as
    RV(ansible_facts.numafleet_plan). The plan is what the roles apply (for example
    C(numafleet.tuning.pinned_services)).
  - Runs on the controller only. No module is sent to the host and nothing on the host is read or
    changed. The facts come from M(numafleet.tuning.numa_facts) and
    M(numafleet.tuning.gpu_topology_facts), which must run first.
  - Placements are planned in declaration order and greedily, so appending a placement never moves
    the ones before it. With the plan the last apply recorded (O(recorded), by default
    C(ansible_facts.numafleet_recorded) of M(numafleet.tuning.numa_facts)), a placement whose
    request (C(cpus), C(gpus), C(memory), C(hugepages), C(node), C(near), C(mig_profile), C(mps),
    C(allow_span)) did not change keeps its node, CPUs, memory nodes, GPUs, MIG slot and MPS share
    while they still exist and fit; the others are planned around the kept ones, a changed one on
    its old node when it fits there. So editing, reordering or removing one placement never moves
    another. A recorded plan that is invalid, not a plan, for another host, or without a
    placement's resources fails the task naming the file and the fix (O(repack)).
  - With O(changes), it also computes the change plan (RV(ansible_facts.numafleet_changes), and
    RV(changes) as lines for people) and refuses, before anything is changed, a plan that removes
    every unit the collection manages on the host or more than O(max_removals) units, unless
    O(allow_removals). Whole-GPU requests go to one NUMA node that holds enough free GPUs with
    known locality, enough whole cores, memory budget and hugepage capacity; among fitting nodes
    the one left least fragmented wins. Multi-GPU requests prefer GPUs under one PCIe switch, then
    NVLink-connected sets. CPUs are whole cores (SMT siblings together), never reserved, isolated,
    offline or already given, never outside the allowed cpuset, and a count placement never gets
    a CPU whose SMT sibling is isolated (whole cores only; an explicit C(cpus) pin on such a CPU
    is kept with a warning naming both CPUs). Memory binds to the CPU node, or, when the CPU node
    has none, to the nearest allowed node with memory, faster memory first; a node that is a
    GPU's memory is never chosen by default, and the plan warns when memory falls back to a
    farther or slower node.
  - The allowed cpuset (RV(numafleet.tuning.numa_facts#module:ansible_facts.numa.allowed), the
    cgroup cpusets above the services and PID 1's affinity) bounds every placement. When it narrows
    the host the plan says so in its warnings, naming the sets and their source files; a pinned
    C(cpus) or C(node) outside it, or a placement that cannot fit inside it, fails the task naming
    the sets, the source and the fix.
  - GPU-memory and tiered nodes. A node that is a GPU's memory (C(nodes[].gpu_owner), as on
    GH200, GB200, POWER9 with V100) is never bound by default; C(node) or C(numafleet_hugepages_extra)
    on it fails naming the GPU. Nodes in a lower memory tier, CXL- or DAX-backed, or without a
    normal memory zone are used only after faster ones, with a warning.
  - Boot-time hugepages. When C(numafleet_hugepages_boot_reserve) puts pages on the kernel
    command line, site.yml's input checks compare the facts' C(kernel.osrelease) with Linux 5.16
    (per-node C(hugepages=)) and, in render mode, decide C(numafleet_hugepages_bootloader=auto)
    below the render root; an unknown or older release, or an undecidable bootloader, fails
    the host before the plan gate, naming the host variable and the fix.
  - Explicit pins (GPU addresses or UUIDs in C(gpus), a NUMA node in C(node), a cpulist in
    C(cpus)) are honoured and validated. A GPU whose NUMA locality is unknown is used
    only when pinned or when no known-locality GPU fits, and the plan then carries a warning.
  - The allowed cpuset (C(ansible_facts.numa.allowed)) bounds the plan. A GPU on a node none of
    whose CPUs a placement can use (outside the allowed cpuset, isolated or reserved) stays on
    its node; a GPU count never takes it, C(gpus) listing it (also a placement the plan applied
    last there) fails naming the node, the sets and their cpus file, unless C(allow_span) (then
    the placement warns that its GPU traffic crosses nodes). An allowed cpuset that names no
    online CPU or memory node fails naming its file. Messages about memory nodes name the mems
    file (C(cpuset.mems.effective)), and C(node) on a node without usable CPUs fails saying why.
  - C(near) anchors a placement on a PCI device of C(ansible_facts.numa.pci_devices) (a NIC, an
    NVMe drive, CXL memory or a GPU), given by its address (V(0000:4b:00.0) or the short
    V(4b:00.0)). The placement is planned as if C(node) were the device's node, so its CPUs,
    memory and GPUs come from that node. A device of unknown locality, a device on a node without usable CPUs,
    or a C(node) that disagrees with the device is an error.
  - Input that is malformed or cannot fit fails the task with one message that names the host, the
    variable (for example numafleet_placements[2] (llm-70b).memory), what is wrong, and the fix;
    infeasible plans list what is free per node. Nothing is planned for that host.
  - Every run renders the plan's units, drop-ins, tenant slices and MPS files (with O(hardening),
    O(unit_dir), O(mps_unit_dir), O(mps_control_path) and O(mps_nvidia_smi_path)), so a value the
    renderers refuse (a NEL or newline in a text field, V($) in a program path) fails here, on the
    controller, naming the host variable or role input, before anything is changed on any host.
  - Check mode computes the same plan.
options:
  numa:
    description:
      - The host's NUMA facts, as returned by M(numafleet.tuning.numa_facts).
      - Defaults to C(ansible_facts.numa) of the host; the task fails when neither is set.
    type: dict
  gpu_topology:
    description:
      - The host's GPU facts, as returned by M(numafleet.tuning.gpu_topology_facts).
      - Defaults to C(ansible_facts.gpu_topology) of the host, or no GPUs when that is not set.
    type: dict
  placements:
    description:
      - The placements to plan, a list of dicts with the keys C(name), C(tenant), C(exec) or
        C(unit), C(user), C(group), C(description), C(gpus), C(cpus), C(node), C(near),
        C(memory), C(hugepages), C(environment), C(mig_profile), C(mps), C(allow_span),
        C(hardening), C(memory_limit), C(cpu_weight), C(io_weight) and C(tasks_max); see the
        collection README for each key.
      - Usually the host variable C(numafleet_placements), which the planner's messages name.
        V(null) means none.
    type: raw
    default: []
  tenants:
    description:
      - The tenants placements may name, a list of dicts with C(name), optional C(memory_max) and
        C(description). Each tenant becomes a slice C(numafleet-<name>.slice).
      - Usually the host variable C(numafleet_tenants). V(null) means none.
    type: raw
    default: []
  reserved_cpus:
    description:
      - CPUs never given to a placement (kernel cpulist text such as V(0-1,64-65)), for
        housekeeping and interrupts. Usually the host variable C(numafleet_reserved_cpus).
      - Reserving every online CPU of a NUMA node is an error.
    type: raw
    default: ""
  partition:
    description:
      - Whether the plan partitions the host. With V(true) and at least one placement,
        the plan gets a C(partition) key (C(housekeeping_cpus), the online and allowed CPUs of
        O(reserved_cpus); C(units)) from which the units layer writes C(AllowedCPUs=) drop-ins
        for C(system.slice), C(user.slice) and C(init.scope) and a C(CPUAffinity=) drop-in in
        C(/etc/systemd/system.conf.d/). Usually the host variable C(numafleet_partition).
      - V(true) with an empty O(reserved_cpus), with none of them online (and allowed), or with a
        placement on one of them is an error.
    type: bool
    default: false
  memory_headroom_pct:
    description:
      - Percentage of each NUMA node's memory kept free when planning (0 to 90).
      - Usually the host variable C(numafleet_memory_headroom_pct).
    type: raw
    default: 15
  hugepages_extra:
    description:
      - Hugepages wanted outside the placements (a database, DPDK), per NUMA node, as a list of dicts
        with C(node) (NUMA node id), C(size) (V(2M), V(1G), V(2048kB) or the page size in kB as a
        number) and C(count) (pages, 0 or more).
      - They are reserved on their node before any placement is planned, count against the node's
        memory budget, and are part of the plan's C(nodes[].hugepages) totals (and listed in
        C(nodes[].hugepages_extra)), which the role C(numafleet.tuning.hugepages) applies and
        C(playbooks/verify.yml) checks.
      - Usually the host variable C(numafleet_hugepages_extra), which the planner's messages name.
        V(null) means none.
    type: raw
    default: []
  gpu_partitions:
    description:
      - Declared partition state per GPU, both vendors, one list. NVIDIA entries take the keys of
        O(mig_gpus) (C(gpu), C(mode), C(layout)); AMD Instinct entries take C(gpu) (PCI address or
        UUID), C(compute_partition) (V(SPX), V(DPX), V(TPX), V(QPX), V(CPX)) and
        C(memory_partition) (V(NPS1), V(NPS2), V(NPS4), V(NPS8)). An entry with keys of both
        vendors is refused.
      - Placements with C(partition) (V(cpx) ...) take logical GPUs of AMD GPUs in that mode.
      - Usually the host variable C(numafleet_gpu_partitions). V(null) means none. Setting both
        this and O(mig_gpus) is refused; O(mig_gpus) alone still works, with a deprecation warning.
    type: raw
    default: []
  mig_gpus:
    description:
      - Deprecated name of O(gpu_partitions) (same keys), kept for callers of the module.
      - Declared NVIDIA MIG state per GPU, as a list of dicts with C(gpu) (PCI address or C(GPU-...)
        UUID), C(mode) (V(enabled), the default, or V(disabled)) and optionally C(layout), a list of
        GPU-instance profile names (V(3g.40gb)) or dicts with C(profile), C(start) (placement start
        slice) and C(compute_profile) (V(1c.3g.40gb); default one compute instance over the whole
        GPU instance).
      - With a C(layout), the GPU's instances are exactly those; placements with C(mig_profile) on
        it take instances of that layout, existing ones first. Without C(layout), the layout is the
        GPU's instances plus those the placements need. V(disabled) makes the GPU a whole GPU.
      - The plan's C(gpus[].mig) holds the result, which the role C(numafleet.tuning.nvidia_mig)
        applies. Profiles are checked against the GPU's own profile list from its facts.
      - Usually the deprecated host variable C(numafleet_mig_gpus). V(null) means none.
    type: raw
    default: []
  host:
    description:
      - Host name used in the plan and in messages. Defaults to C(inventory_hostname).
    type: str
  recorded:
    description:
      - What the last apply recorded on the host, as M(numafleet.tuning.numa_facts) publishes it
        with its option C(recorded_root) (C(state), C(plan), C(error), C(files)).
      - Defaults to C(ansible_facts.numafleet_recorded); without either, everything is planned
        from scratch.
    type: dict
  repack:
    description:
      - Plan every placement from scratch, in declaration order, ignoring (and not checking) the
        recorded plan; placements may move. Usually the host variable C(numafleet_repack).
    type: bool
    default: false
  changes:
    description:
      - Compute the change plan and apply the blast-radius guards (see O(max_removals)).
    type: bool
    default: false
  restart:
    description:
      - V(auto) lists the units the apply restarts; V(never) lists them as awaiting a restart
        instead (the apply then restarts nothing). Usually the host variable C(numafleet_restart).
    type: str
    choices: [auto, never]
    default: auto
  max_removals:
    description:
      - With O(changes), the most managed units (services, vendor units unpinned, MPS daemons) the
        plan may remove; more fails the task unless O(allow_removals). Usually the host variable
        C(numafleet_max_removals).
    type: int
    default: 2
  allow_removals:
    description:
      - Allow a plan that removes more than O(max_removals) units, or every managed unit of the
        host. Usually the host variable C(numafleet_allow_removals).
    type: bool
    default: false
  amd_reset_ok:
    description:
      - With O(changes), whether the amd layer may reload the amdgpu driver for a memory
        partition change (every AMD GPU of the host is reset); without it the change plan lists
        such a change as waiting (C(reset_required)). Usually the host variable
        C(numafleet_amd_reset_ok).
    type: bool
    default: false
  refuse:
    description:
      - Fail the task when a guard of O(changes) fires (the default). With V(false) the task
        only reports, and the guards' messages are added to RV(changes) (C(drift_check.yml) uses it).
    type: bool
    default: true
  hardening:
    description:
      - The C(hardening) option the units are rendered with (the role variable
        C(pinned_services_hardening)), for the rendering and the change plan.
    type: bool
    default: true
  preflight:
    description:
      - The C(preflight) option the units are rendered with (the role variable
        C(pinned_services_preflight), from C(numafleet_preflight) under site.yml), for the rendering and
        the change plan. A unit whose file differs only in the preflight's C(ExecStartPre=) line is
        listed as C(rewritten), not restarted.
    type: str
    choices: [enforce, warn, "off"]
    default: warn
  unit_dir:
    description: Directory of the pinned units on the host (C(pinned_services_unit_dir)), for the rendering and the change plan.
    type: str
    default: /etc/systemd/system
  mps_unit_dir:
    description: Directory of the MPS units on the host (C(nvidia_mps_unit_dir)), for the rendering and the change plan.
    type: str
    default: /etc/systemd/system
  mps_control_path:
    description: C(nvidia-cuda-mps-control) as the MPS units name it (C(nvidia_mps_control_path)), for the rendering and the change plan.
    type: str
    default: /usr/bin/nvidia-cuda-mps-control
  mps_nvidia_smi_path:
    description: C(nvidia-smi) as the MPS units name it (C(nvidia_mps_nvidia_smi_path)), for the rendering and the change plan.
    type: str
    default: /usr/bin/nvidia-smi
  playbook:
    description:
      - Plan as that playbook of the collection does, from the host's own variables
        (C(hostvars[inventory_hostname]); docs/host_variables.md lists them).
      - Every option the task leaves out is read from its host variable (O(placements) from
        C(numafleet_placements), O(restart) from C(numafleet_restart), ...), with the schema's
        default, and O(hardening), O(unit_dir) and the C(mps_*) options from the role inputs the
        apply would use (C(pinned_services_hardening), C(nvidia_mps_unit_dir), ...).
      - V(site.yml) computes the change plan and refuses what it must (as O(changes=true),
        O(refuse=true)); V(drift_check.yml) reports what site.yml would refuse (O(refuse=false));
        V(verify.yml) makes the plan only.
      - After the plan, it runs every input check of the playbook on the controller, so that a
        bad input fails here, before the plan gate, naming the host variable or role input and
        the fix. V(site.yml) and V(drift_check.yml) check everything M(numafleet.tuning.host_apply)
        would be given (the same code shapes its arguments); V(drift_check.yml) adds the
        measurement settings and C(numafleet_drift_fail); V(verify.yml) checks the render root
        and the measurement settings.
      - Unset (the default), the options are taken as given and nothing else is checked.
    type: str
    choices: [site.yml, drift_check.yml, verify.yml]
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.conn
  - action_common_attributes.flow
  - action_common_attributes.facts
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.controller_action
attributes:
  check_mode:
    support: full
    details: The same plan is computed in check mode.
  delegation:
    support: none
    details: The plan is computed on the controller anyway; delegation changes nothing.
  diff_mode:
    support: none
  facts:
    support: full
  idempotent:
    support: full
  platform:
    platforms: all
notes:
  - The planner is deterministic; the same facts and inputs give the same plan on every run.
seealso:
  - module: numafleet.tuning.numa_facts
  - module: numafleet.tuning.gpu_topology_facts
  - module: numafleet.tuning.pinned_units
"""

EXAMPLES = r"""
- name: Plan as site.yml does, from the host variables, with every input check
  numafleet.tuning.numa_plan:
    playbook: site.yml

- name: Gather NUMA topology
  numafleet.tuning.numa_facts:

- name: Gather GPU topology
  numafleet.tuning.gpu_topology_facts:

- name: Plan this host's placements
  numafleet.tuning.numa_plan:
    placements: "{{ numafleet_placements | default([]) }}"
    tenants: "{{ numafleet_tenants | default([]) }}"
    reserved_cpus: "{{ numafleet_reserved_cpus | default('') }}"
    memory_headroom_pct: "{{ numafleet_memory_headroom_pct | default(15) }}"
    hugepages_extra: "{{ numafleet_hugepages_extra | default([]) }}"
    gpu_partitions: "{{ numafleet_gpu_partitions | default([]) }}"
  register: plan

- name: Print one line per host
  ansible.builtin.debug:
    msg: "{{ plan.summary }}"

- name: Plan inline placements
  numafleet.tuning.numa_plan:
    placements:
      - name: llm-70b
        exec: /opt/vllm/bin/vllm serve /srv/models/llama-3-70b --port 8000
        user: vllm
        gpus: 2
        cpus: 16
        memory: 64G
        hugepages: {size: 2M, count: 8192}
      - name: embed
        exec: /opt/tei/bin/text-embeddings-router --port 8081
        mig_profile: 1g.10gb
        cpus: 4
        memory: 8G
      - name: feature-store
        exec: /opt/fs/bin/serve --data /srv/nvme0
        near: "0000:65:00.0"
        cpus: 8
        memory: 16G

- name: Gather the facts and what the last apply recorded
  numafleet.tuning.numa_facts:
    gpu: true
    recorded_root: /

- name: Plan from the recorded plan, with the change plan and its guards
  numafleet.tuning.numa_plan:
    placements: "{{ numafleet_placements | default([]) }}"
    changes: true
    max_removals: 2
  register: planned

- name: Show what an apply would add, move, remove and restart
  ansible.builtin.debug:
    msg: "{{ planned.changes }}"

- name: Show the CPUs of each placement
  ansible.builtin.debug:
    msg: "{{ item.name }}: node {{ item.node }} cpus {{ item.cpus | numafleet.tuning.cpulist }}"
  loop: "{{ ansible_facts.numafleet_plan.placements }}"
"""

RETURN = r"""
changes:
  description: The change plan as short lines for people (printed by C(site.yml) before the apply).
  returned: with O(changes)
  type: list
  elements: str
  sample:
    - "gpu-a100-01: change plan: 0 added, 1 moved, 0 removed, 5 kept"
    - "  ~ move    rerank-b: node0 cpus 7-8,71-72 gpus 31:00.0 mps -> node0 cpus 7-8,11,71-72,75 gpus 31:00.0 mps (its request changed (cpus 4 -> 6))"
    - "  restart: numafleet-rerank-b.service"
summary:
  description:
    - One line describing the plan (placements, node, CPUs, GPUs, warnings), then the change
      plan in a few words.
    - "A placement whose MIG instance does not exist yet ends in
      V((waits for MIG instance <profile> at slice <start> of GPU <address>: <reason>)); the
      change plan counts it as V(waiting for a MIG instance), not as started."
    - "A plan narrowed to the allowed cpuset (C(ansible_facts.numa.allowed)) shows, after the
      warnings, V(; allowed CPUs <cpulist> and memory nodes <list>)."
    - "A placement with C(exec) and no C(user) shows V(as root) after where it runs (systemd runs
      a unit without C(User=) as root); the plan also warns about it."
  returned: success
  type: str
  sample: "gpu-a100-01: 2 placements: llm-70b node1 cpus 32-39,96-103 gpus b1:00.0,ca:00.0; embed node0 cpus 2-3,66-67 gpus 17:00.0 (MIG 1g.10gb); 0 warnings"
ansible_facts:
  description: Facts published by the action.
  returned: success
  type: dict
  contains:
    numafleet_plan:
      description:
        - The plan, JSON-ready with sorted lists.
      returned: success
      type: dict
      contains:
        version:
          description: Version of the plan's shape.
          type: int
          sample: 1
        host:
          description: The host the plan is for.
          type: str
          sample: gpu-a100-01
        reserved_cpus:
          description: Reserved CPUs, sorted.
          type: list
          elements: int
          sample: [0, 1]
        memory_headroom_pct:
          description: Per-node memory headroom used.
          type: int
          sample: 15
        partition:
          description:
            - Only when O(partition) is true and the host has placements (absent otherwise, and in
              plans of older releases) - C(housekeeping_cpus) (the online, allowed CPUs of
              O(reserved_cpus), sorted) and C(units) (V(init.scope), V(system.slice),
              V(user.slice), the units confined to them).
            - It depends only on O(reserved_cpus) and the facts, never on the placements, so a
              placement change leaves the partition's files unchanged.
          type: dict
          returned: when the host is partitioned
          sample: {housekeeping_cpus: [0, 64], units: [init.scope, system.slice, user.slice]}
        placements:
          description:
            - One entry per placement, in declaration order, with C(name), C(index), C(unit),
              C(unit_kind) (V(service) or V(dropin)), C(exec), C(argv), C(description), C(user),
              C(group), C(tenant), C(slice), C(node), C(nodes), C(spans), C(near), C(cpus),
              C(cpus_requested), C(mems), C(memory_node) (the node charged with its memory),
              C(memory_kb), C(hugepages), C(gpus), C(cuda_visible_devices), C(mps),
              C(environment), C(waits_for), C(hardening), C(request) (what it asks for in
              resources, compared with the recorded plan's) and C(warnings).
            - C(limits), only on a placement with resource limits, holds the values written
              into its unit, each only when set - C(memory_max_bytes) (C(MemoryMax=)),
              C(memory_high_bytes) (C(MemoryHigh=)), C(cpu_weight), C(io_weight) (ints) and
              C(tasks_max) (a string - a count, V(25%) or V(infinity)).
            - C(priority), only on a placement that is not V(normal), is V(high) or V(low) (its own
              C(priority), else its tenant's). A V(high) placement's unit gets C(MemoryLow=) of
              its C(memory_kb) in bytes, and the slices above it the sum of those under them.
            - C(near) is the PCI device the placement is anchored on (C(address), C(kind),
              C(node)), or V(null) without C(near).
            - C(waits_for) is V(null), or, for a placement whose MIG instance does not exist yet,
              C(mig_instance) (V(1g.10gb at slice 2 of GPU 0000:17:00.0)), C(gpu), C(profile),
              C(start) and C(reason) - V(created in this run) (the MIG layer creates it),
              V(created in this run once MIG mode is on) (MIG mode is off; a GPU that needs a
              reset for it waits for the reset) or V(mode change pending a reset) (MIG mode is
              set but applies only after a GPU reset or reboot). Such a placement's unit is
              written with C(CUDA_VISIBLE_DEVICES) empty but never enabled, started or
              restarted; the plan made once the instance exists (the re-plan of
              M(numafleet.tuning.host_apply) in the same run, or a later run) names the MIG
              device, and that run enables and starts the unit. The change plan and RV(summary)
              say that it waits.
            - On an AMD Instinct GPU (facts C(gpus[].amd)), a C(gpus) entry also has C(partition) -
              V(null) for the whole GPU, or for a placement with C(partition) the logical GPU (XCP)
              it got, C(mode) (V(CPX)), C(index), C(uuid), C(render_minor), C(xcds) and C(existing).
              Its C(environment) sets C(ROCR_VISIBLE_DEVICES) to UUIDs (never indices) and no
              C(CUDA_*) key, when each UUID names one logical GPU of the host. When one does not
              (the logical GPUs of a partitioned GPU carry the GPU's KFD unique_id, or a GPU has
              none), the entry has C(device_allow) instead, V([/dev/kfd, /dev/dri/renderD<N>, ...])
              (the render node of each of its GPUs), and no C(ROCR_VISIBLE_DEVICES); its unit gets
              C(DevicePolicy=closed) and one C(DeviceAllow=<path> rw) per path, and ROCm skips
              every GPU whose render node it may not open. Other entries have no C(device_allow)
              key. A logical GPU that appears only once the compute partition changes
              has C(uuid) V(null), C(ROCR_VISIBLE_DEVICES) empty and a C(waits_for) with
              C(partition) (V(CPX logical GPU 0 of GPU 0000:43:00.0)), C(gpu), C(mode), C(index)
              and C(reason) V(created when the compute partition changes).
          type: list
          elements: dict
          sample:
            - name: llm-70b
              index: 0
              unit: numafleet-llm-70b.service
              unit_kind: service
              node: 1
              nodes: [1]
              spans: false
              cpus: [32, 33, 34, 35, 96, 97, 98, 99]
              mems: [1]
              memory_kb: 67108864
              cuda_visible_devices: GPU-27a1a97b-100a-5f4e-9236-eb21e9fcfce0
        tenants:
          description: Tenants with their slice, memory limit, CPU and memory-node unions and placements.
          type: list
          elements: dict
        nodes:
          description:
            - Per NUMA node, the memory budget, planned memory, usable and planned CPUs, hugepage pools and GPUs.
            - C(hugepages) are the node's pool totals (C(size_kb), C(count)), the placements' pages plus
              O(hugepages_extra); C(hugepages_extra) lists the O(hugepages_extra) part alone. C(planned_memory_kb)
              includes both.
          type: list
          elements: dict
        gpus:
          description:
            - Per GPU, how it is used (V(whole), V(mig), V(mps), V(partition) (logical GPUs of an
              AMD GPU) or V(free)), by which placements, and its MIG layout or MPS daemon.
            - C(mig) (V(null) for a GPU without MIG) has C(mode) (the planned mode), C(mode_current) (from the facts),
              C(declared) (whether O(mig_gpus) declares the GPU) and C(layout), one entry per GPU instance with
              C(profile), C(placement_start), C(placement_size), C(placement) (the placement it serves, or V(null)),
              C(device_uuid) (V(null) until the instance exists) and C(compute_profile) (V(null) for one compute
              instance over the whole GPU instance), and C(reset_required) (the facts' MIG mode change is pending
              until a GPU reset).
            - No new MIG instance is planned on a GPU whose C(reset_required) is true; a placement that needs one is
              refused, naming the GPU, both modes and the fix (reset the GPU, or reboot). A placement kept from the
              recorded plan keeps its existing instance, or keeps waiting for the one it already waited for
              (C(waits_for) reason V(mode change pending a reset)), with a warning.
          type: list
          elements: dict
        mps_daemons:
          description:
            - One entry per MPS daemon the plan needs (device UUID, pipe and log directories, clients).
            - C(unit) (V(nvidia-mps@<instance>.service)) and C(instance) (the device UUID; both V(null) while the
              MIG instance it serves is not created yet, when C(waits_for) is its client's, and the daemon is neither
              written nor started), C(gpu_uuid) (the physical GPU), C(mig) (whether it serves a
              MIG device), C(node), C(cpus) and C(mems) (the online, not isolated, allowed CPUs and nearest memory node of its GPU's node,
              so that one client's change does not change the daemon), C(user) and C(group) (its clients',
              which must agree), C(active_thread_percentage) and C(pinned_memory_limit_kb) (the largest of its
              clients').
            - C(priority), only when it is not V(normal), is the highest C(priority) of its clients.
          type: list
          elements: dict
        mig_gpus:
          description:
            - The MIG state to apply, one entry per GPU that O(mig_gpus) declares or that is in MIG mode, in
              the shape of the C(gpus) option of M(numafleet.tuning.nvidia_mig) (C(gpu), C(uuid), C(mode),
              C(layout) of C(profile), C(start), C(compute_profile)). GPUs with MIG off that are not declared
              are not listed, so they are never touched.
          type: list
          elements: dict
        amd_partitions:
          description:
            - Only on a host with AMD Instinct GPUs - one entry per AMD GPU, in address order, the
              partition state the C(amd) layer applies - C(address), C(uuid), C(node),
              C(compute_partition) and C(memory_partition) (each C(current) and C(planned)),
              C(declared) (in O(gpu_partitions)), C(change), C(reset_required) (the memory
              partition changes, which needs an amdgpu driver reload), C(logical_gpus) (C(index),
              C(uuid), C(placement)) and C(owned_units) (the units of the placements on the GPU).
          type: list
          elements: dict
          returned: when the host has AMD GPUs with partition facts
        stability:
          description:
            - Per placement name, V(kept) (its recorded resources), V(new), or why it was planned
              again (its request changed, a CPU went offline, a GPU is gone...). Not recorded on
              the host.
          type: dict
          sample: {llm-70b: kept, embed: "its request changed (cpus 4 -> 8)"}
        warnings:
          description:
            - Warnings of the plan, for example a GPU with unknown NUMA locality.
            - Those about facts the planner does not trust come first and start with C(facts:) (a
              node of kind V(unknown) that gets no placement, CPUs with unknown SMT siblings, the
              allowed cpuset when it narrows, CPUs whose SMT sibling is isolated);
              those of a placement start with C(placement <name>:).
          type: list
          elements: str
        allowed:
          description:
            - The CPUs and memory nodes the plan stays inside, from C(ansible_facts.numa.allowed)
              (the cgroup cpusets above the services). Every placement's and MPS daemon's
              C(cpus) and C(mems) lie inside them.
          type: dict
          contains:
            cpus:
              description: The online CPUs the plan may use, sorted.
              type: list
              elements: int
            mems:
              description: The memory nodes the plan may use, sorted.
              type: list
              elements: int
            narrowed:
              description: Whether they lack an online CPU or node.
              type: bool
            sources:
              description: V(<source> (<file>)) of each source that narrows them; empty when not narrowed.
              type: list
              elements: str
    numafleet_changes:
      description:
        - The change plan of the host, from the recorded plan and file digests to this plan.
      returned: with O(changes), when no guard refused it (or with O(refuse=false))
      type: dict
      contains:
        host:
          description: The host.
          type: str
          sample: gpu-a100-01
        recorded:
          description: Whether a recorded plan was compared (V(false) on a first run).
          type: bool
          sample: true
        changed:
          description: Whether anything is added, moved, removed, started, restarted or stopped.
          type: bool
          sample: true
        placements:
          description:
            - C(added) and C(unrecorded) (C(name), C(to)), C(moved) (C(name), C(from), C(to),
              C(reason)), C(removed) (C(name), C(from)) and C(kept) (C(name), C(at)); C(from),
              C(to) and C(at) read like V(node0 cpus 1-4,65-68 gpus 17:00.0 mig 3g.40gb@4).
              C(unrecorded) are placements whose unit exists although no plan was recorded.
            - "Added, unrecorded, moved and kept entries have C(waits) - V(null), or
              V(waits for MIG instance 1g.10gb at slice 2 of GPU 0000:17:00.0: created in this run)
              when the placement's MIG instance does not exist yet (see C(waits_for))."
          type: dict
          sample: {added: [], moved: [], removed: [], kept: [{name: embed, at: node0 cpus 1-4}], unrecorded: []}
        units:
          description:
            - C(start), C(stop), C(unpin) (vendor units whose drop-in goes), C(restart),
              C(restart_if_running) (vendor units pinned by a drop-in), C(restart_through) and
              C(stop_through) (unit -> the C(Requires=)/C(BindsTo=)/C(PartOf=) that makes systemd
              restart or stop it), C(awaiting_restart) (with O(restart=never)), C(not_removed)
              (host paths a manifest lists that are no longer as numafleet wrote them, for example
              edited, a link, or outside the unit directory; the apply modules keep them, never
              stopped or deleted), C(waiting) (unit -> a line saying which MIG instance it waits
              for and why; written, not started, not in C(start)), C(reload) and
              C(restart_reasons) (MPS daemon unit -> why it restarts when its CPUs or memory
              nodes change; it starts with V(its CPUs change) and names the old and new CPUs, those
              that left the allowed cpuset and its source; and placement unit -> a text starting with
              V(its limits change) that names each changed limit, old -> new, when its resource
              limits change; the
              change plan prints it as a C(why) line). A unit
              that waited in the recorded plan and waits no more is in C(start), not C(restart).
          type: dict
          sample: {start: [], stop: [], restart: [numafleet-rerank-b.service], restart_through: {}}
        mig:
          description: Per GPU whose MIG layout changes, C(gpu), C(mode) (V(null) or V(disabled -> enabled)), C(create) and C(destroy) (V(profile@start)).
          type: list
          elements: dict
          sample: [{gpu: "0000:17:00.0", mode: null, create: [1g.10gb@2], destroy: [2g.20gb@2]}]
        amd:
          description:
            - Per AMD GPU whose compute or memory partition changes (C(amd_partitions) of the
              plan), C(gpu), C(compute) and C(memory) (V(null) or V(CPX -> SPX)),
              C(reset_required) (a memory partition change without O(amd_reset_ok), which waits,
              and nothing changes on that GPU) and C(restart), the units the amd layer stops and
              starts around the change (also in C(units.restart), whatever O(restart) says).
            - A memory partition change reloads the amdgpu driver, which resets every AMD GPU of
              the host.
          type: list
          elements: dict
          sample: [{gpu: "0000:e3:00.0", compute: CPX -> SPX, memory: null, reset_required: false, restart: [numafleet-small-08.service]}]
        removals:
          description: C(units) the plan removes, C(max) (O(max_removals)) and C(allowed) (O(allow_removals)).
          type: dict
          sample: {units: [], max: 2, allowed: false}
        refused:
          description: The guards that fired (empty here; a refused plan fails the task with them).
          type: list
          elements: str
          sample: []
        kernel_cmdline:
          description:
            - Under a playbook (O(playbook)) only. The kernel command line the hugepages layer
              writes (boot-time hugepages, then the kernel CPU isolation of
              C(numafleet_kernel_isolation)) against what it wrote last
              (C(ansible_facts.numafleet_recorded.kernel_args)) and the running one
              (C(ansible_facts.numa.kernel.cmdline), from C(/proc/cmdline)).
            - C(before), C(after), C(added), C(removed) (argument lists), C(changed), C(missing)
              (the C(after) arguments C(/proc/cmdline) lacks, V(null) when unknown) and
              C(reboot_required) (changed, or a reboot still pending). A change adds a
              C(kernel command line) line to RV(changes) and C(kernel command line to change
              (reboot)) or C(reboot pending) to the summary.
          type: dict
          returned: with O(playbook)
          sample:
            before: []
            after: [nohz_full=2-7, rcu_nocbs=2-7, irqaffinity=0-1]
            added: [nohz_full=2-7, rcu_nocbs=2-7, irqaffinity=0-1]
            removed: []
            changed: true
            missing: null
            reboot_required: true
        lines:
          description: RV(changes).
          type: list
          elements: str
          sample: ["gpu-a100-01: change plan: 0 added, 0 moved, 0 removed, 6 kept; no change"]
"""
