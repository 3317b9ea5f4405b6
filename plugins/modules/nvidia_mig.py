#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_mig
short_description: Set the MIG mode and GPU-instance layout of NVIDIA GPUs, and keep it across reboots
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Reads the MIG state of every NVIDIA GPU through NVML (C(nvmlDeviceGetMigMode),
    C(nvmlDeviceGetGpuInstances), ...) or C(nvidia-smi mig -lgi/-lci), and changes the GPUs listed in
    O(gpus) with C(nvmlDeviceSetMigMode), C(nvmlDeviceCreateGpuInstanceWithPlacement),
    C(nvmlGpuInstanceCreateComputeInstance), C(nvmlComputeInstanceDestroy) and
    C(nvmlGpuInstanceDestroy) (or the matching C(nvidia-smi mig) commands). GPUs not listed are never
    touched.
  - Profile names (C(3g.40gb)) are resolved to ids from the GPU itself. The whole layout is checked
    (names, placements, fit, counts) before anything changes. The layout is exact; GPU instances
    that it does not keep are destroyed (compute instances first).
  - A change that disrupts running processes (destroying a GPU instance they run on, changing the
    MIG mode, resetting the GPU) is refused and lists the PIDs and their systemd units, unless every
    one belongs to a unit in O(owned_units); those are stopped with C(systemctl stop), the change is
    applied, and they are started again (also when the change failed). Creating GPU instances in
    free slices of a busy GPU is allowed.
  - After the change the layout is read again and the module fails when it differs.
  - Writes, below O(root), the recorded layout O(state_path) (JSON), the boot program
    O(boot_program_path) and C(numafleet-mig.service) in O(unit_dir), a oneshot that re-creates the
    recorded layout at boot with C(nvidia-smi mig -cgi)/C(-cci) on GPUs whose MIG mode is enabled and
    that have no GPU instance yet. With O(mig_parted_config), also an equivalent NVIDIA mig-parted
    config (config name C(numafleet)).
  - With O(snapshot), nothing runs on a GPU; the GPUs are read from a snapshot and the changes the host
    would need are reported in RV(would_run) and the diff. Outside check mode the change is then
    written into the snapshot (the recording is the host's kernel in render mode) - destroyed GPU
    instances removed, created ones added with C(rendered) true and a synthetic C(MIG-) device
    UUID, a mode change that needs a GPU reset left pending - so that the next read sees what the
    driver would show.
options:
  gpus:
    description:
      - The GPUs to manage, each with its MIG mode and layout.
    type: list
    elements: dict
    required: true
    suboptions:
      gpu:
        description:
          - The GPU's PCI address (C(0000:17:00.0) or C(17:00.0)) or UUID (C(GPU-...)).
        type: str
        required: true
      uuid:
        description:
          - The UUID (C(GPU-...)) the plan saw at O(gpus[].gpu). When given and the GPU found there
            reports another UUID, the module fails before changing anything (the GPU was replaced
            or the plan is stale; re-gather facts and re-plan). Not checked when the driver reports
            no UUID.
        type: str
      mode:
        description:
          - The MIG mode. V(disabled) destroys every GPU instance first and allows no O(gpus[].layout).
        type: str
        choices: [enabled, disabled]
        default: enabled
      layout:
        description:
          - The GPU instances, one compute instance each. Instances on the GPU that this list does
            not keep are destroyed.
        type: list
        elements: dict
        default: []
        suboptions:
          profile:
            description:
              - GPU instance profile name as the GPU reports it, for example C(3g.40gb).
            type: str
            required: true
          start:
            description:
              - Placement start slice; must be one of the profile's placements. Left out, the
                module picks one that fits.
            type: int
          compute_profile:
            description:
              - Compute instance profile, C(<N>c.<profile>) such as C(1c.3g.40gb). Left out, one
                compute instance spans the whole GPU instance.
            type: str
  reset_ok:
    description:
      - When a mode change stays pending (Ampere GPUs), run C(nvidia-smi --gpu-reset -i <address>),
        but only when no process uses the GPU and no reset blocker (RV(reset_blockers)) is found.
      - Without it the module reports RV(reset_required) and leaves the reset (or a reboot) to you.
    type: bool
    default: false
  owned_units:
    description:
      - systemd units this collection owns (the placements' units and C(nvidia-mps@) daemons). When
        every process a change disrupts belongs to one of them, they are stopped and started again
        around the change.
    type: list
    elements: str
    default: []
  backend:
    description:
      - How the GPUs are read and changed. V(auto) uses NVML when C(import pynvml) works and
        C(nvmlInit) succeeds, else C(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  snapshot:
    description:
      - Render mode. Read the GPUs from this snapshot (written by
        M(numafleet.tuning.gpu_topology_facts) C(snapshot_out)) and never touch a GPU; the files
        are written, and (outside check mode) the changes into the snapshot itself, so point it at
        a writable scratch copy of the recording; a symbolic link is refused, never written
        through. O(service_manager) is treated as V(none).
    type: path
  root:
    description:
      - Directory the files are written below; V(/) is the host itself.
    type: path
    default: /
  state_path:
    description:
      - Where the recorded layout (JSON) is written, as a path on the host.
    type: path
    default: /etc/numafleet/mig.json
  boot_program_path:
    description:
      - Where the boot program is written, as a path on the host. The unit runs it with
        C(/usr/bin/python3).
    type: path
    default: /usr/local/libexec/numafleet-mig
  unit_dir:
    description:
      - Directory of C(numafleet-mig.service), as a path on the host.
    type: path
    default: /etc/systemd/system
  mig_parted_config:
    description:
      - Where an NVIDIA mig-parted config of the same layout is written. mig-parted places instances
        by count, not by start, so its placement may differ. An empty string writes none.
    type: str
    default: /etc/numafleet/mig-parted.yaml
  service_manager:
    description:
      - V(systemd) stops and starts O(owned_units) with C(systemctl); V(none) never calls
        C(systemctl), so a change that disrupts processes is refused.
    type: str
    choices: [systemd, none]
    default: systemd
  procfs_root:
    description:
      - Where procfs is mounted; processes' units and reset blockers are read there.
    type: path
    default: /proc
  sysfs_root:
    description:
      - Where sysfs is mounted (for containers that mount the host's sysfs elsewhere); the
        C(nvidia_drm) module is looked up there.
    type: path
    default: /sys
extends_documentation_fragment:
  - numafleet.tuning.file_safety
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: Predicts the GPU changes from the state read (the reset from the GPU architecture).
  diff_mode:
    support: full
    details: One entry per changed GPU (mode and instances, before and after) and per changed file.
  idempotent:
    support: full
requirements:
  - nvidia-ml-py (C(import pynvml)) on the target, or C(nvidia-smi).
notes:
  - A O(state_path) that is not a numafleet MIG state (not JSON, another format or version) fails
    the task naming the file and the fix; it is never rewritten silently.
  - MIG instances do not survive a reboot; enable C(numafleet-mig.service) so that the boot program
    re-creates them.
  - A mode change on Ampere GPUs needs a GPU reset (or a reboot); Hopper and newer apply it in place.
seealso:
  - module: numafleet.tuning.gpu_topology_facts
  - module: numafleet.tuning.pinned_units
"""

EXAMPLES = r"""
- name: Split the first GPU into two 3g.40gb instances
  numafleet.tuning.nvidia_mig:
    gpus:
      - gpu: "0000:17:00.0"
        layout:
          - profile: 3g.40gb
            start: 0
          - profile: 3g.40gb
            compute_profile: 1c.3g.40gb
    owned_units: [numafleet-llm.service]
  register: mig

- name: Show the MIG device UUIDs
  ansible.builtin.debug:
    msg: "{{ mig.mig_devices | map(attribute='device_uuid') | list }}"

- name: Render the layout from a recorded snapshot, changing no GPU
  numafleet.tuning.nvidia_mig:
    gpus:
      - gpu: "0000:31:00.0"
        mode: disabled
    snapshot: /srv/snapshots/gpu01.json
    root: /srv/render/gpu01
    service_manager: none
"""

RETURN = r"""
drift:
  description:
    - One entry per listed GPU whose mode or instances as read (NVML, nvidia-smi or the
      snapshot) differ from the request before the run; C(setting) is C(GPU <address> MIG
      layout), C(planned) and C(actual) are C(mode <mode>; <profile>@<start>, ...). With
      O(snapshot) (render mode) an apply writes its changes into the snapshot, so a difference
      found later is a change of the recording, drift as on a host.
    - Each entry is C(setting), C(planned), C(actual), C(reason) and C(pending) (true only for a
      MIG mode change that waits for a GPU reset; it is neither drift nor a failed check).
  returned: always
  type: list
  elements: dict
  sample:
    - setting: GPU 0000:17:00.0 MIG layout
      planned: "mode enabled; 1g.10gb@2, 3g.40gb@4"
      actual: "mode enabled; 2g.20gb@2, 3g.40gb@4"
      reason: ""
      pending: false
gpus:
  description: Each listed GPU after the run (as predicted in check and render mode).
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: PCI address.
      type: str
      sample: "0000:17:00.0"
    uuid:
      description: GPU UUID, null when unknown.
      type: str
      sample: GPU-59365d41-8075-51ae-aac5-77cbe78ed5ad
    mode_current:
      description: MIG mode in effect (V(enabled), V(disabled), null without MIG).
      type: str
      sample: enabled
    mode_pending:
      description: MIG mode after the next reset.
      type: str
      sample: enabled
    reset_required:
      description: Whether a mode change waits for a GPU reset or reboot.
      type: bool
      sample: false
    layout:
      description: GPU instances, by start.
      type: list
      elements: dict
      contains:
        profile:
          description: Profile name.
          type: str
          sample: 3g.40gb
        start:
          description: Placement start.
          type: int
          sample: 4
        size:
          description: Placement size in slices, null when not known yet.
          type: int
          sample: 4
        gpu_instance_id:
          description: GPU instance id, null for one not created yet (check mode).
          type: int
          sample: 2
        compute_profile:
          description: Compute profile, null for one full-size compute instance.
          type: str
          sample: 1c.3g.40gb
        device_uuid:
          description: MIG device UUID, null when not created yet.
          type: str
          sample: MIG-d2370484-ec09-58f3-9dd0-11e29c0f61ab
    actions:
      description: The NVML calls or commands run (or to run) on this GPU, and notes.
      type: list
      elements: str
      sample: ["nvmlDeviceCreateGpuInstanceWithPlacement(0000:17:00.0, profile 9 (3g.40gb), start 4)"]
mig_devices:
  description: Every GPU instance on the listed GPUs after the run.
  returned: always
  type: list
  elements: dict
  contains:
    gpu_address:
      description: PCI address of the GPU.
      type: str
      sample: "0000:17:00.0"
    gpu_uuid:
      description: UUID of the GPU.
      type: str
      sample: GPU-59365d41-8075-51ae-aac5-77cbe78ed5ad
    profile:
      description: Profile name.
      type: str
      sample: 3g.40gb
    placement_start:
      description: Placement start.
      type: int
      sample: 4
    device_uuid:
      description: MIG device UUID (for C(CUDA_VISIBLE_DEVICES)), null when not created yet.
      type: str
      sample: MIG-d2370484-ec09-58f3-9dd0-11e29c0f61ab
reset_required:
  description: Whether any listed GPU needs a reset (or a reboot) for its mode change.
  returned: always
  type: bool
  sample: false
reset_blockers:
  description: What would make a GPU reset fail (never stopped by the module).
  returned: always
  type: list
  elements: str
  sample: ["the nvidia_drm kernel module is loaded (a display or DRM client may hold the GPU); unload it"]
busy:
  description: Processes that the change disrupts, with their units.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: PCI address of the GPU.
      type: str
      sample: "0000:17:00.0"
    pid:
      description: Process id.
      type: int
      sample: 4242
    unit:
      description: systemd service of the process, null when none.
      type: str
      sample: numafleet-llm.service
holders:
  description:
    - Everything that holds a listed GPU (C(/proc/<pid>/fd) links to C(/dev/nvidia*), nvidia-persistenced, nv-hostengine
      (DCGM), nv-fabricmanager, a loaded C(nvidia_drm)), also in check and render mode.
    - A change that destroys instances, changes a mode or resets a GPU that a holder outside O(owned_units) has open is
      refused with the full list; creating instances in free slices is not.
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: V(process) (a C(/dev/nvidia*) file open), V(daemon) or V(module) (C(nvidia_drm)).
      type: str
      sample: process
    pid:
      description: Process id, null for the module.
      type: int
      sample: 4711
    comm:
      description: C(/proc/<pid>/comm), null for the module.
      type: str
      sample: text-embedding
    unit:
      description: systemd service of the process (from C(/proc/<pid>/cgroup)), null when none.
      type: str
      sample: numafleet-embed.service
    devices:
      description: The C(/dev/nvidia*) paths it has open, sorted.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidiactl]
    gpus:
      description:
        - PCI addresses of the GPUs it holds (C(/dev/nvidiaN) by the driver's C(Device Minor) in
          C(/proc/driver/nvidia/gpus/<address>/information)); empty means every GPU.
      type: list
      elements: str
      sample: []
stopped_units:
  description: Owned units stopped and started again around the change (to be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [numafleet-llm.service]
would_run:
  description:
    - In check and render mode, the calls and commands the change needs, in order.
    - Without a service manager (O(service_manager=none)) also the C(systemctl) lines that a
      changed or removed C(numafleet-mig.service) needs.
  returned: always
  type: list
  elements: str
  sample: ["nvidia-smi mig -i 0000:17:00.0 -cgi 9:4"]
ran:
  description: The calls and commands that ran.
  returned: always
  type: list
  elements: str
  sample: ["systemctl stop numafleet-llm.service"]
kept:
  description:
    - The mig-parted config path an earlier run recorded in O(state_path) when that file is no
      longer the config numafleet wrote (header and config name differ). It is kept, not
      removed, with the reason. Each is also a warning.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The file, as on the host.
      returned: always
      type: str
      sample: /etc/numafleet/old-mig-parted.yaml
    reason:
      description: Why it is kept.
      returned: always
      type: str
      sample: recorded in /etc/numafleet/mig.json as the mig-parted config of an earlier run, but it is not a config numafleet wrote
  sample: []
files:
  description:
    - The files written (or to write) and their state (create, update, remove, unchanged).
    - With no GPU in O(gpus), the files an earlier run wrote are removed (the boot unit is disabled
      first), so that a layout no longer declared is not re-created at boot.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path on the host.
      type: str
      sample: /etc/numafleet/mig.json
    state:
      description: V(create), V(update) or V(unchanged).
      type: str
      sample: create
reload_needed:
  description: Whether C(numafleet-mig.service) was created or changed, so that systemd must reload.
  returned: always
  type: bool
  sample: true
gpu_changed:
  description:
    - Whether a GPU was changed in this run (mode, GPU or compute instances), in render mode
      whether the change was written into the snapshot; false in check mode. New MIG devices then
      have UUIDs that a plan made before the run lacks, so C(site.yml) gathers the GPU facts and
      plans again.
  returned: always
  type: bool
  sample: false
snapshot_written:
  description:
    - Render mode, outside check mode - whether the change was written into O(snapshot).
  returned: always
  type: bool
  sample: false
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers


def load_pynvml():
    """The pynvml module of nvidia-ml-py, or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def main() -> None:
    module = AnsibleModule(argument_spec=layers.SPECS["mig"], supports_check_mode=True)
    layers.run_module(module, "mig", load_pynvml)


if __name__ == "__main__":
    main()
