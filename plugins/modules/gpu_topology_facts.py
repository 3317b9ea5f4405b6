#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_topology_facts
short_description: Gather GPUs with their NUMA locality, MIG layout, processes and NVLink peers
version_added: 0.1.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Lists every NVIDIA and AMD GPU under C(<sysfs_root>/bus/pci/devices) with its locality from
    C(<sysfs_root>/bus/pci/devices/*/{numa_node,local_cpulist,local_cpus}) and
    C(<sysfs_root>/devices/system/node/node*/cpulist), and publishes them as
    C(ansible_facts.gpu_topology).
  - For AMD Instinct GPUs it reads the partition modes in
    C(<sysfs_root>/class/drm/card*/device/{current,available}_{compute,memory}_partition), the
    KFD topology C(<sysfs_root>/class/kfd/kfd/topology/nodes/*/{gpu_id,properties}) (one node per
    logical GPU, or XCP, of a partitioned GPU) and the PCI directory's C(mem_info_vram_total) and
    C(compute_partition_config/supported_nps_configs), then enriches them through the C(amdsmi)
    Python library when it can be imported (model, VRAM, partition modes, processes).
  - NVIDIA GPUs are enriched through NVML (the C(pynvml) module of nvidia-ml-py, when it can be
    imported and C(nvmlInit) succeeds) with UUID, name, memory, compute and persistence modes,
    MIG modes, GPU and compute instances, supported GPU-instance profiles with their placements,
    running processes and NVLink peers.
  - When NVML cannot be used, RV(ansible_facts.gpu_topology.nvml.reason) says why, and
    C(nvidia-smi -q -x) is run instead if it is installed (see O(nvidia_smi)); otherwise only the
    sysfs values are reported.
  - sysfs stays the source of locality. A C(numa_node) of V(-1) is kept as C(numa_node_raw) and
    leaves C(node) to the GPU's local CPUs - equal to, or a proper non-empty subset of, exactly
    one node's CPUs - and then to NVML's CPU affinity at NODE scope; C(node_source) says which.
    NVML's own NUMA id (the node holding the GPU's memory on
    coherent systems such as GH200) is reported separately as C(nvml_numa_node), never as the
    GPU's node.
  - Every value records where it came from in the GPU's C(sources) (V(sysfs), V(nvml),
    V(nvidia-smi) or V(snapshot)); a value a source could not give is V(null), with the reason
    in the GPU's C(unavailable).
  - O(snapshot_out) records the GPU state (everything but sysfs) as JSON, and O(snapshot) reads
    such a file instead of NVML, so that a host can be planned and rendered from a recording.
  - Fails, naming the option, when O(sysfs_root) has no C(devices/system/cpu) directory or
    O(procfs_root) is not a directory; files that cannot be used become entries in
    RV(ansible_facts.gpu_topology.warnings).
  - M(numafleet.tuning.numa_facts) with O(numafleet.tuning.numa_facts#module:gpu=true) publishes
    exactly these facts in the same module execution as the NUMA facts.
options:
  snapshot:
    description:
      - A GPU snapshot file written by O(snapshot_out), read instead of NVML and C(nvidia-smi).
      - The enriched values are then credited to V(snapshot), and
        RV(ansible_facts.gpu_topology.nvml) and RV(ansible_facts.gpu_topology.nvidia_smi) are
        those of the host the snapshot was recorded on.
      - A file that is missing or malformed fails the module with the reason.
    type: path
  snapshot_out:
    description:
      - Write the GPU state that was read (from NVML, C(nvidia-smi) or O(snapshot)) to this file
        on the target, as JSON, replacing it.
      - Nothing is written in check mode; RV(snapshot_written) says whether the file was written.
    type: path
  nvidia_smi:
    description:
      - When to run C(nvidia-smi -q -x).
      - V(auto) runs it only when NVML cannot be used and C(nvidia-smi) is found in C(PATH); its
        failure is reported in RV(ansible_facts.gpu_topology.nvidia_smi.reason), not as a failed
        task.
      - V(always) uses it instead of NVML and fails the task when it is missing or fails.
      - V(never) does not run it.
      - Ignored with O(snapshot).
    type: str
    choices: [auto, always, never]
    default: auto
  nvidia_smi_timeout:
    description:
      - How many seconds C(nvidia-smi -q -x) may run before it is stopped (C(SIGTERM), then
        C(SIGKILL) 5 seconds later), through coreutils C(timeout).
      - A hung driver can make C(nvidia-smi) block forever; with O(nvidia_smi=auto) a timeout is
        reported in RV(ansible_facts.gpu_topology.nvidia_smi.reason), with
        O(nvidia_smi=always) it fails the task.
      - Must be 1 or more.
    type: int
    default: 30
extends_documentation_fragment:
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.facts_module
attributes:
  check_mode:
    support: full
    details: In check mode the facts are gathered as usual and O(snapshot_out) is not written.
  diff_mode:
    support: none
  idempotent:
    support: full
  facts:
    support: full
requirements:
  - nvidia-ml-py (C(import pynvml)) on the target for NVML data; optional.
  - C(nvidia-smi) on the target for the fallback; optional.
  - coreutils C(timeout) on the target to enforce O(nvidia_smi_timeout); optional.
notes:
  - O(procfs_root) is accepted for symmetry with M(numafleet.tuning.numa_facts); this version reads
    nothing under it.
  - The module always returns C(changed=false), also when it writes O(snapshot_out), which is a
    recording, not a change to the host.
  - Whether NVML lists GPU-instance profiles while MIG is disabled depends on the driver; when it
    does not, C(mig.supported_profiles) is V(null) with the reason in C(unavailable).
  - C(nvidia-smi -q) does not report MIG profiles, placements, MIG device UUIDs or NVLink peers;
    with the C(nvidia-smi) fallback those values are V(null).
  - Without coreutils C(timeout) in C(PATH) (busybox-only or minimal images), C(nvidia-smi) is
    run without a time limit and O(nvidia_smi_timeout) has no effect.
  - A value C(nvidia-smi) prints that the module does not know (a persistence, compute or MIG
    mode other than those documented) is V(null), with the reason in the GPU's C(unavailable).
  - On Linux, C(pynvml) is imported only when NVML's library C(libnvidia-ml.so.1) loads;
    otherwise C(nvmlInit) could only fail, and its reason (C(NVML Shared Library Not Found)) is
    reported without the import, which costs more than the rest of the run.
seealso:
  - module: numafleet.tuning.numa_facts
"""

EXAMPLES = r"""
- name: Gather GPU topology
  numafleet.tuning.gpu_topology_facts:

- name: Record the GPU state of this host for later planning
  numafleet.tuning.gpu_topology_facts:
    snapshot_out: /var/tmp/gpu-snapshot.json
  register: __gpu_record

- name: Plan a host from a recorded tree and GPU snapshot
  numafleet.tuning.gpu_topology_facts:
    sysfs_root: /srv/captures/gpu-node-17/sys
    snapshot: /srv/captures/gpu-node-17/gpu-snapshot.json

- name: Show each GPU's node and MIG mode
  ansible.builtin.debug:
    msg: >-
      {{ item.address }} ({{ item.name }}) on node {{ item.node }},
      MIG {{ item.mig.mode_current if item.mig else 'unsupported' }}
  loop: "{{ ansible_facts.gpu_topology.gpus }}"
"""

RETURN = r"""
snapshot_written:
  description: Whether O(snapshot_out) was written (never in check mode).
  returned: always
  type: bool
  sample: true
ansible_facts:
  description: Facts published by the module.
  returned: always
  type: dict
  contains:
    gpu_topology:
      description: GPUs of the host and where their values came from.
      returned: always
      type: dict
      contains:
        gpus:
          description: One entry per NVIDIA or AMD GPU under C(bus/pci/devices), sorted by PCI address; empty without GPUs.
          returned: always
          type: list
          elements: dict
          contains:
            address:
              description: PCI address C(DDDD:BB:DD.F) as sysfs names it.
              type: str
              sample: "0000:17:00.0"
            vendor:
              description: V(nvidia) or V(amd).
              type: str
              sample: nvidia
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
                - Also V(null) when it names a node that is not online (a warning naming the
                  file); C(node) is then inferred as for V(-1).
              type: int
              sample: 0
            node:
              description: The node to place work for this GPU on, or V(null) when unknown.
              type: int
              sample: 0
            node_source:
              description:
                - V(numa_node) (sysfs said so), V(local_cpulist) (local CPUs equal exactly one node's CPUs),
                  V(local_cpulist_subset) (a proper, non-empty subset of exactly one node's CPUs), V(nvml_cpu_affinity),
                  or V(null).
                - V(nvml_cpu_affinity) when sysfs leaves the node unknown and NVML's CPU affinity at NODE scope
                  (RV(ansible_facts.gpu_topology.gpus[].nvml_cpu_affinity)) lies within exactly one node's CPUs; C(sources.node) then
                  names NVML (or the snapshot).
              type: str
              sample: numa_node
            local_cpus:
              description: C(local_cpulist) (else C(local_cpus)) of the GPU.
              type: list
              elements: int
              sample: [0, 1, 2, 3]
            switch:
              description: Upstream port of the PCIe switch directly above the GPU, or V(null).
              type: str
              sample: "0000:16:00.0"
            root_port:
              description: PCIe root port above the GPU, or V(null).
              type: str
              sample: "0000:16:02.0"
            uuid:
              description: GPU UUID.
              type: str
              sample: GPU-59365d41-8075-51ae-aac5-77cbe78ed5ad
            name:
              description: Product name.
              type: str
              sample: NVIDIA A100 80GB PCIe
            memory_total_mib:
              description: Total framebuffer memory in MiB.
              type: int
              sample: 81920
            compute_mode:
              description: V(default), V(exclusive_process), V(prohibited) or V(exclusive_thread).
              type: str
              sample: default
            persistence_mode:
              description: V(enabled) or V(disabled).
              type: str
              sample: enabled
            mig:
              description: MIG state; V(null) when the GPU has no MIG or it is unknown.
              type: dict
              contains:
                mode_current:
                  description: V(enabled) or V(disabled).
                  type: str
                  sample: enabled
                mode_pending:
                  description: The mode after the next GPU reset, V(enabled) or V(disabled); V(null) when unknown.
                  type: str
                  sample: enabled
                gpu_instances:
                  description: Existing GPU instances by id (empty while MIG is disabled), or V(null) when they could not be listed.
                  type: list
                  elements: dict
                  contains:
                    id:
                      description: GPU instance id.
                      type: int
                      sample: 2
                    profile_id:
                      description: GPU-instance profile id, as the driver numbers it for this GPU.
                      type: int
                      sample: 9
                    profile_name:
                      description: Profile name as nvidia-smi prints it without C(MIG).
                      type: str
                      sample: 3g.40gb
                    placement_start:
                      description: First memory slice of the instance.
                      type: int
                      sample: 4
                    placement_size:
                      description: Memory slices of the instance.
                      type: int
                      sample: 4
                    compute_instances:
                      description: Compute instances of the GPU instance, by id.
                      type: list
                      elements: dict
                      contains:
                        id:
                          description: Compute instance id.
                          type: int
                          sample: 0
                        profile_id:
                          description: Compute-instance profile id.
                          type: int
                          sample: 2
                        profile_name:
                          description: Profile name (V(3g.40gb), or V(1c.3g.40gb) for a smaller compute instance).
                          type: str
                          sample: 3g.40gb
                        mig_device_uuid:
                          description: UUID of the MIG device this compute instance is (for C(CUDA_VISIBLE_DEVICES)).
                          type: str
                          sample: MIG-d2370484-ec09-58f3-9dd0-11e29c0f61ab
                    mig_device_uuid:
                      description: The MIG device UUID when the GPU instance holds exactly one compute instance, else V(null).
                      type: str
                      sample: MIG-d2370484-ec09-58f3-9dd0-11e29c0f61ab
                supported_profiles:
                  description: GPU-instance profiles the GPU offers, smallest first, or V(null) when NVML did not list them.
                  type: list
                  elements: dict
                  contains:
                    name:
                      description: Profile name (the driver's, else derived from slices and memory as nvidia-smi does).
                      type: str
                      sample: 1g.10gb
                    id:
                      description: Profile id on this GPU and driver (resolve names to ids here, never from a table).
                      type: int
                      sample: 19
                    max_count:
                      description: How many instances of the profile fit on the GPU.
                      type: int
                      sample: 7
                    slice_count:
                      description: Compute slices of the profile.
                      type: int
                      sample: 1
                    memory_mib:
                      description: Memory of an instance in MiB.
                      type: int
                      sample: 9728
                    placements:
                      description: Possible placements, or V(null) when unknown.
                      type: list
                      elements: dict
                      contains:
                        start:
                          description: First memory slice.
                          type: int
                          sample: 0
                        size:
                          description: Memory slices.
                          type: int
                          sample: 1
                reset_required:
                  description:
                    - V(true) when RV(ansible_facts.gpu_topology.gpus[].mig.mode_pending) is known and differs from
                      RV(ansible_facts.gpu_topology.gpus[].mig.mode_current) (a MIG mode change waits for a GPU reset or a
                      reboot; whichever source gave the modes).
                    - M(numafleet.tuning.numa_plan) plans no new MIG instance on such a GPU.
                  type: bool
                  sample: false
            processes:
              description: PIDs of the compute and graphics processes using the GPU, sorted.
              type: list
              elements: int
              sample: [4711]
            nvlink_peers:
              description: GPUs reachable over active NVLinks, directly or through an NVSwitch (V(null) without NVLink).
              type: list
              elements: str
              sample: ["0000:2a:00.0", "0000:3a:00.0"]
            nvlink_switches:
              description: PCI addresses of the NVSwitches the GPU's active NVLinks end at.
              type: list
              elements: str
              sample: ["0000:05:00.0"]
            nvml_numa_node:
              description: NVML's NUMA id of the GPU (the node holding its memory on coherent systems such as GH200). Not the CPU node; use C(node).
              type: int
              sample: 1
            nvml_cpu_affinity:
              description:
                - CPUs of the GPU's ideal CPU affinity within its NUMA node (NVML C(nvmlDeviceGetCpuAffinityWithinScope) at
                  C(NVML_AFFINITY_SCOPE_NODE)), sorted; V(null) when NVML cannot say (nvidia-smi does not give it).
                - Recorded in snapshots, so a snapshot replays the node it gives.
              type: list
              elements: int
              sample: [4, 5, 6, 7]
            partition:
              description: AMD Instinct partition modes, or V(null) (NVIDIA, or no partition files).
              type: dict
              contains:
                compute:
                  description: Compute partitioning, or V(null).
                  type: dict
                  contains:
                    current:
                      description: Current mode (C(current_compute_partition)).
                      type: str
                      sample: CPX
                    available:
                      description: Modes the GPU offers (C(available_compute_partition)).
                      type: list
                      elements: str
                      sample: [SPX, DPX, QPX, CPX]
                memory:
                  description: Memory partitioning, or V(null); same keys as C(compute).
                  type: dict
                  sample: {current: NPS4, available: [NPS1, NPS4]}
            amd:
              description:
                - AMD Instinct identity, partitions and logical GPUs; V(null) for other GPUs.
                - C(uuid) is C(GPU-) and the 16 hex digits of the KFD C(unique_id), the form
                  C(ROCR_VISIBLE_DEVICES) accepts; C(logical_gpus) has one entry per KFD node of the
                  GPU (one per XCP, so one in SPX and eight in CPX on an MI300X), in partition order, with
                  the XCDs it owns; C(compatible_memory_partitions) maps each compute partition to the
                  memory partitions it allows (C(compatible_source) V(sysfs) when the driver's
                  C(supported_nps_configs) gave the row of the mode C(xcp_config) selects, normally the
                  current one; V(table) for AMD's MI300 table).
                - The driver gives every logical GPU of one GPU the GPU's C(unique_id), so in DPX,
                  QPX or CPX the C(logical_gpus) share one C(uuid) and tell apart only by
                  C(render_minor) (the plan then selects them by render node).
                - C(hive_id) is the KFD C(hive_id) of the GPU's XGMI hive in hex, V(null) when the
                  GPU is in none; the GPUs of one hive share their memory partition.
                - C(source) is V(sysfs), V(amdsmi) (the library enriched it) or V(snapshot).
              type: dict
              sample:
                model: AMD Instinct MI300X
                kfd_node: 2
                gpu_id: 50002
                unique_id: "0x2bd3d5b45ff06a00"
                uuid: GPU-2bd3d5b45ff06a00
                hive_id: "0xd2c3a1f05b6e4471"
                drm_card: card1
                render_minor: 128
                vram_total_mib: 196592
                compute_partition: {current: SPX, available: [SPX, DPX, QPX, CPX]}
                memory_partition: {current: NPS1, available: [NPS1, NPS4]}
                compatible_memory_partitions: {SPX: [NPS1], DPX: [NPS1], QPX: [NPS1, NPS4], CPX: [NPS1, NPS4]}
                compatible_source: table
                xcd_count: 8
                logical_gpus:
                  - index: 0
                    uuid: GPU-2bd3d5b45ff06a00
                    unique_id: "0x2bd3d5b45ff06a00"
                    kfd_node: 2
                    gpu_id: 50002
                    render_minor: 128
                    xcds: [0, 1, 2, 3, 4, 5, 6, 7]
                processes: []
                source: amdsmi
            sources:
              description: For each field that has a value, where it came from.
              type: dict
              sample: {address: sysfs, node: sysfs, uuid: nvml, mig: nvml}
            unavailable:
              description: >-
                Fields the enrichment could not fill, with the reason (dotted keys name parts of C(mig)).
                For an NVIDIA GPU the enrichment did not report at all, every enriched field is listed with that reason
                (also given in RV(ansible_facts.gpu_topology.warnings)). Empty for AMD GPUs, and when nothing
                enriched the GPUs (see RV(ansible_facts.gpu_topology.nvml.reason) and
                RV(ansible_facts.gpu_topology.nvidia_smi.reason)).
              type: dict
              sample: {nvml_numa_node: "nvmlDeviceGetNumaNodeId: Not Supported"}
            numa_node_raw:
              description: The C(numa_node) file as the kernel wrote it (V(-1) when unknown), V(null) when it cannot be read.
              type: int
              sample: -1
        amdsmi:
          description: Whether the C(amdsmi) library enriched the AMD GPUs.
          returned: always
          type: dict
          contains:
            available:
              description: Whether amdsmi answered (V(false) on hosts without AMD GPUs, where it is not loaded).
              type: bool
            reason:
              description: Why not, or V(null).
              type: str
              sample: "amdsmi_init failed: An error occurred with code: 34(AMDSMI_STATUS_DRIVER_NOT_LOADED)"
            version:
              description: The library version (C(amdsmi_get_lib_version)), or V(null).
              type: str
              sample: 25.3.0
        nvml:
          description: Whether NVML was used.
          returned: always
          type: dict
          contains:
            available:
              description: Whether NVML answered.
              type: bool
              sample: false
            reason:
              description: Why NVML could not be used, or V(null).
              type: str
              sample: "nvmlInit failed: NVML Shared Library Not Found"
            driver_version:
              description: NVIDIA driver version NVML reported, or V(null).
              type: str
              sample: 560.35.03
        nvidia_smi:
          description: Whether C(nvidia-smi -q -x) was used.
          returned: always
          type: dict
          contains:
            used:
              description: Whether its output enriched the GPUs.
              type: bool
              sample: false
            reason:
              description: Why it was not used (not found, timed out, failed, not needed), or V(null).
              type: str
              sample: nvidia-smi was not found in PATH
            driver_version:
              description: Driver version from its output, or V(null).
              type: str
              sample: 560.35.03
        snapshot:
          description: The snapshot read instead of NVML, if any.
          returned: always
          type: dict
          contains:
            path:
              description: O(snapshot), or V(null).
              type: str
              sample: /srv/captures/gpu-node-17/gpu-snapshot.json
            recorded_from:
              description: What the snapshot was recorded from (V(nvml) or V(nvidia-smi)), or V(null).
              type: str
              sample: nvml
        sysfs_root:
          description: The sysfs root that was read.
          returned: always
          type: str
          sample: /sys
        warnings:
          description: Files that could not be used, and GPUs seen by only one of sysfs and the enrichment.
          returned: always
          type: list
          elements: dict
          contains:
            path:
              description: The file, the PCI address, or C(nvml:deviceN).
              type: str
              sample: "0000:17:00.0"
            reason:
              description: What went wrong.
              type: str
              sample: nvml did not report this GPU (another driver, a cgroup, or lost)
"""

import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader


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
            snapshot=dict(type="path"),
            snapshot_out=dict(type="path"),
            nvidia_smi=dict(type="str", default="auto", choices=["auto", "always", "never"]),
            nvidia_smi_timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    params = module.params

    def run(argv: list) -> tuple:
        return module.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C"})

    try:
        facts, written = gpu.gather_gpu_topology(
            Reader(params["sysfs_root"], params["procfs_root"]),
            run,
            module.get_bin_path,
            load_nvml,
            nvidia_smi_mode=params["nvidia_smi"],
            nvidia_smi_timeout=params["nvidia_smi_timeout"],
            snapshot=params["snapshot"],
            snapshot_out=params["snapshot_out"],
            check_mode=module.check_mode,
            load_amdsmi=load_amdsmi,
        )
    except NumaTuneError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, snapshot_written=written, ansible_facts={"gpu_topology": facts})


if __name__ == "__main__":
    main()
