#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: amd_partition
short_description: Set the compute and memory partition modes of AMD Instinct GPUs, and keep them across reboots
version_added: 0.3.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Reads C(/sys/bus/pci/devices/<address>/current_compute_partition),
    C(available_compute_partition), C(current_memory_partition) and C(available_memory_partition)
    of the GPUs listed in O(gpus), and changes them by writing those files (O(backend=sysfs)),
    with C(amdsmi_set_gpu_compute_partition) / C(amdsmi_set_gpu_memory_partition) of the amdsmi
    Python library (O(backend=amdsmi)), or with C(amd-smi set -g <address> --compute-partition MODE)
    / C(--memory-partition MODE) (O(backend=amd-smi)). GPUs not listed are never touched.
  - The whole layout is checked before anything changes - every GPU found, each planned mode in
    its C(available_*_partition) list, the memory mode allowed with the compute mode (the entry's
    C(compatible_memory_partitions), else the documented MI300X table - SPX, DPX and QPX with
    NPS1, CPX with NPS1 or NPS4).
  - A GPU whose mode changes must be idle. Processes with C(/dev/kfd) open (one device for every
    AMD GPU, so a ROCm process on any GPU counts) or one of the GPU's DRM nodes
    (C(/dev/dri/renderD*) of its KFD topology nodes, C(/dev/dri/card*) of its PCI device), read
    from the C(/proc/PID/fd) links, are refused with their PIDs and systemd units, unless they
    belong to a unit in O(owned_units) (or the entry's C(owned_units)); those are stopped with
    C(systemctl stop), the change is made, and they are started again (also when it failed).
  - A memory partition change needs a reload of the amdgpu driver, which resets every AMD GPU of
    the host - C(modprobe -r amdgpu) and C(modprobe amdgpu), C(amdsmi_gpu_driver_reload()) or
    C(amd-smi reset -r). It runs only with O(reset_ok=true), and then every AMD GPU must be idle;
    otherwise nothing is changed on that GPU, RV(reset_required) is true and the module warns.
  - After the change the modes are read again and the module fails when they differ.
  - Writes, below O(root), the recorded modes O(state_path) (JSON), the boot program
    O(boot_program_path) and C(numafleet-amd-partition.service) in O(unit_dir), a oneshot that sets
    the recorded modes again at boot (memory partitions first, with one driver reload, then compute
    partitions), before the owned units; the driver loads with its default modes. With O(gpus)
    empty those files are removed.
  - With O(service_manager=none) (render mode) the files under O(sysfs_root) of a scratch tree
    are written (backend sysfs whatever O(backend) says), nothing is reloaded or run, and a busy
    GPU is reported in RV(busy) but not refused.
options:
  gpus:
    description:
      - The plan's C(amd_partitions) entries (M(numafleet.tuning.numa_plan)), one per AMD GPU -
        C(address), C(uuid), C(compute_partition) and C(memory_partition) (each
        C({current, planned}); a missing or null C(planned) keeps the mode), C(owned_units) and
        optionally C(compatible_memory_partitions) (compute mode -> allowed memory modes).
    type: list
    elements: dict
    required: true
  reset_ok:
    description:
      - Allow the reload of the amdgpu driver that a memory partition change needs (every AMD GPU
        of the host is reset; all must be idle).
    type: bool
    default: false
  owned_units:
    description:
      - systemd units the module may stop and start again around a change (the units of the
        plan's placements on these GPUs).
    type: list
    elements: str
    default: []
  backend:
    description:
      - How the modes are set. V(auto) uses the amdsmi library when it loads, else C(amd-smi) when
        it is on the PATH, else the sysfs files.
    type: str
    choices: [auto, amdsmi, amd-smi, sysfs]
    default: auto
  root:
    description: Directory that stands for C(/) of the host for the files this module writes.
    type: path
    default: /
  state_path:
    description: Where the recorded modes are written (below O(root)).
    type: path
    default: /etc/numafleet/amd-partition.json
  boot_program_path:
    description: Where the boot program is written (below O(root)).
    type: path
    default: /usr/local/libexec/numafleet-amd-partition
  unit_dir:
    description: The directory of the boot unit (below O(root)).
    type: path
    default: /etc/systemd/system
  service_manager:
    description:
      - V(systemd) stops and starts owned units with C(systemctl); V(none) is render mode (see
        the description).
    type: str
    choices: [systemd, none]
    default: systemd
  procfs_root:
    description: Where procfs is mounted (the GPUs' users are read there).
    type: path
    default: /proc
  sysfs_root:
    description: Where sysfs is mounted (for containers that mount the host's sysfs elsewhere).
    type: path
    default: /sys
extends_documentation_fragment:
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: Nothing is written or run; RV(gpus), RV(would_run) and the diff show the change.
  diff_mode:
    support: full
    details: One entry with every changed GPU's modes before and after, then the files.
  idempotent:
    support: full
requirements:
  - The amdsmi Python library (ROCm) for O(backend=amdsmi), C(amd-smi) for O(backend=amd-smi).
notes:
  - Supported on AMD Instinct GPUs with partitions (MI300 series); the driver refuses a switch
    while a KFD process uses the GPU.
seealso:
  - module: numafleet.tuning.host_apply
  - module: numafleet.tuning.nvidia_mig
  - module: numafleet.tuning.numa_plan
"""

EXAMPLES = r"""
- name: Apply the AMD partition modes of the host's plan
  numafleet.tuning.amd_partition:
    gpus: "{{ ansible_facts.numafleet_plan.amd_partitions | default([]) }}"
    reset_ok: true
  register: amd_partitions

- name: Say which GPUs wait for a driver reload
  ansible.builtin.debug:
    msg: "{{ amd_partitions.gpus | selectattr('reset_required') | map(attribute='address') | list }}"
  when: amd_partitions.reset_required

- name: Render into a scratch tree (the demo)
  numafleet.tuning.amd_partition:
    gpus:
      - address: "0000:43:00.0"
        compute_partition: {current: SPX, planned: CPX}
        memory_partition: {current: NPS1, planned: NPS1}
    backend: sysfs
    sysfs_root: /tmp/render/sys
    root: /tmp/render
    service_manager: none
"""

RETURN = r"""
gpus:
  description: Every listed GPU, address order, with its modes before and after the run.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: PCI address.
      type: str
      sample: "0000:43:00.0"
    uuid:
      description: The GPU's UUID as the plan gives it.
      type: str
      sample: GPU-2bd3d5b45ff06a3a
    compute:
      description: The compute partition mode, C(before) and C(after) (planned).
      type: dict
      sample: {before: SPX, after: CPX}
    memory:
      description: The memory partition mode, C(before) and C(after) (planned).
      type: dict
      sample: {before: NPS1, after: NPS4}
    reset_required:
      description: Whether the GPU's change waits for a driver reload (O(reset_ok) false).
      type: bool
      sample: false
reset_required:
  description: Whether a memory partition change waits for a driver reload.
  returned: always
  type: bool
  sample: false
busy:
  description: The processes holding the GPUs that change (owned or, in render mode, any).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    comm:
      description: Process name.
      type: str
    unit:
      description: Its systemd service, or null.
      type: str
    devices:
      description: The device files it has open.
      type: list
      elements: str
    gpus:
      description: The GPU addresses it holds; V([]) means every AMD GPU (C(/dev/kfd)).
      type: list
      elements: str
  sample: []
stopped_units:
  description: Owned units stopped (and started again) around the change.
  returned: always
  type: list
  elements: str
  sample: [numafleet-small-0.service]
ran:
  description: What ran, in order.
  returned: always
  type: list
  elements: str
  sample: ["echo CPX > /sys/bus/pci/devices/0000:43:00.0/current_compute_partition"]
would_run:
  description: In check mode or render mode, what would run; else V([]).
  returned: always
  type: list
  elements: str
  sample: [set compute partition of 0000:43:00.0 to CPX]
gpu_changed:
  description: Whether a GPU's mode was changed (the logical GPUs changed; the plan is made again).
  returned: always
  type: bool
  sample: true
files:
  description: The recorded modes, boot program and boot unit - C(path) and C(state).
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/numafleet/amd-partition.json, state: create}]
reload_needed:
  description: Whether the boot unit file changed (systemd must reload).
  returned: always
  type: bool
  sample: true
drift:
  description:
    - One entry per GPU whose modes differ from the plan before the run (C(setting), C(planned),
      C(actual), C(reason), C(pending)); C(pending) when it waits for a driver reload.
  returned: always
  type: list
  elements: dict
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers


def load_amdsmi():
    """The amdsmi module of ROCm, or None when it is not installed (or cannot load)."""
    try:
        import amdsmi
    except (ImportError, OSError):
        return None
    return amdsmi


def main() -> None:
    module = AnsibleModule(argument_spec=layers.SPECS["amd"], supports_check_mode=True)
    layers.run_module(module, "amd", load_amdsmi=load_amdsmi)


if __name__ == "__main__":
    main()
