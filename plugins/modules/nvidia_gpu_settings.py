#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_settings
short_description: Keep the persistence mode, compute mode, application clocks and power limit of NVIDIA GPUs
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Reads the persistence mode, compute mode, application clocks and power limit of every NVIDIA
    GPU through NVML (C(nvmlDeviceGetPersistenceMode), C(nvmlDeviceGetComputeMode),
    C(nvmlDeviceGetApplicationsClock), C(nvmlDeviceGetSupportedMemoryClocks),
    C(nvmlDeviceGetSupportedGraphicsClocks), C(nvmlDeviceGetPowerManagementLimit) and
    C(nvmlDeviceGetPowerManagementLimitConstraints), in milliwatts) or C(nvidia-smi -q -x), and
    changes the settings O(gpus) declares with C(nvmlDeviceSetPersistenceMode),
    C(nvmlDeviceSetComputeMode), C(nvmlDeviceSetApplicationsClocks) and
    C(nvmlDeviceSetPowerManagementLimit) (or C(nvidia-smi -i GPU -pm), C(-c), C(-ac) and C(-pl)).
    GPUs and settings not declared are never touched.
  - Persistence mode. Where C(nvidia-persistenced.service) is installed (C(systemctl show) reports it
    loaded), the daemon keeps the setting for every GPU of the host and across reboots - true runs
    C(systemctl enable --now nvidia-persistenced.service), false C(systemctl disable --now) - so
    every GPU that declares persistence must declare the same value. Without the daemon it is set
    per GPU through NVML, which NVIDIA documents as legacy and which a reboot undoes (a warning says
    so). Allowed on busy GPUs - persistence only decides whether the driver keeps a GPU initialised
    after its last client exits.
  - Compute mode (C(DEFAULT) or C(EXCLUSIVE_PROCESS)). A change to C(DEFAULT) only widens who may
    create contexts and is allowed on busy GPUs. A change to C(EXCLUSIVE_PROCESS) is refused, before
    anything is changed, while any process has the GPU's device file (C(/dev/nvidiaN), N its
    C(Device Minor) in C(/proc/driver/nvidia/gpus/ADDRESS/information)) open, naming the PIDs and
    their systemd units; daemons that only use NVML (nvidia-persistenced, DCGM) do not count. Refused
    on a GPU an MPS daemon shares (O(mps_gpus); its unit sets the compute mode) and on a GPU in MIG
    mode (NVML sets compute modes per MIG device there).
  - Application clocks (memory and graphics MHz; the pair must be one the GPU lists) and power limit
    (watts, inside the GPU's minimum and maximum). Both apply live and change how fast work runs, not
    whether it runs, so they are allowed on busy GPUs and listed in the change.
  - After a change every declared setting is read again and the module fails when the GPU reports
    otherwise. Compute mode, application clocks and power limit are lost at a reboot or driver
    reload; the drift check reports them and the next run sets them again.
  - With O(snapshot) (render mode), nothing runs on a GPU; the settings are read from the snapshot
    (C(persistence_mode), C(compute_mode) and the optional C(application_clocks) and C(power_limit) of
    each GPU record) and the commands a host would need are reported in RV(would_run) and the diff.
    Outside check mode the change is written into the snapshot. A busy GPU there is one whose
    recorded C(processes) list is not empty.
options:
  gpus:
    description:
      - The GPUs and the settings to keep on them. A setting left out (or null) is left alone.
    type: list
    elements: dict
    default: []
    suboptions:
      gpu:
        description:
          - The GPU's PCI address (C(0000:17:00.0) or C(17:00.0)) or UUID (C(GPU-...)).
        type: str
        required: true
      persistence:
        description:
          - Whether the driver keeps the GPU initialised when no client uses it.
        type: bool
      compute_mode:
        description:
          - V(DEFAULT) (many contexts) or V(EXCLUSIVE_PROCESS) (one process). Not on MPS-shared or
            MIG-mode GPUs.
        type: str
      application_clocks:
        description:
          - The application clocks, as C(nvidia-smi -q -d SUPPORTED_CLOCKS) lists them.
        type: dict
        suboptions:
          memory_mhz:
            description:
              - Memory clock in MHz.
            type: int
            required: true
          graphics_mhz:
            description:
              - Graphics clock in MHz.
            type: int
            required: true
      power_limit_w:
        description:
          - Power management limit in watts, inside the GPU's minimum and maximum.
        type: int
  mps_gpus:
    description:
      - PCI addresses of GPUs an MPS daemon of the plan shares; a compute mode declared for one of
        them is refused. M(numafleet.tuning.host_apply) fills it from the plan.
    type: list
    elements: str
    default: []
  backend:
    description:
      - How the GPUs are reached. V(auto) tries NVML, then C(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  snapshot:
    description:
      - A GPU snapshot (C(gpu_topology_facts) O(numafleet.tuning.gpu_topology_facts#module:snapshot_out))
        to read instead of the GPUs (render mode); outside check mode the change is written into it.
    type: path
  root:
    description:
      - The host's root directory. Only used for the host lock; C(/) on a real host.
    type: path
    default: /
  service_manager:
    description:
      - V(systemd) asks systemd about C(nvidia-persistenced.service) and runs C(systemctl). V(none)
        runs no C(systemctl) (persistence is then set per GPU).
    type: str
    choices: [systemd, none]
    default: systemd
  procfs_root:
    description:
      - Where procfs is mounted; the processes holding each GPU are read below it.
    type: path
    default: /proc
  sysfs_root:
    description:
      - Where sysfs is mounted (the nvidia_drm module is looked up below it).
    type: path
    default: /sys
extends_documentation_fragment:
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: Reads the GPUs and reports the change; sets nothing.
  diff_mode:
    support: full
    details: One entry per changed GPU (header C(NVIDIA GPU <address> settings)), one C(setting - value) line per changed setting.
  idempotent:
    support: full
requirements:
  - nvidia-ml-py (C(import pynvml)) on the target, or C(nvidia-smi).
notes:
  - Sources - NVML API reference (Device Commands, Device Queries), C(nvidia-smi(1)), and NVIDIA's
    Driver Persistence guide (the persistence daemon replaces the legacy persistence mode).
seealso:
  - module: numafleet.tuning.gpu_topology_facts
  - module: numafleet.tuning.nvidia_mig
  - module: numafleet.tuning.host_apply
"""

EXAMPLES = r"""
- name: Keep the first GPU persistent, exclusive to one process, at 600 W
  numafleet.tuning.nvidia_gpu_settings:
    gpus:
      - gpu: "0000:17:00.0"
        persistence: true
        compute_mode: EXCLUSIVE_PROCESS
        power_limit_w: 600
  register: gpu_settings

- name: Show what changed
  ansible.builtin.debug:
    var: gpu_settings.changes

- name: Predict the change on a recorded host (render mode)
  numafleet.tuning.nvidia_gpu_settings:
    gpus:
      - gpu: GPU-5d4d8e4e-3b8f-4c6a-9e1a-2f6f3c9d0b11
        application_clocks:
          memory_mhz: 2619
          graphics_mhz: 1755
    snapshot: /srv/render/gpu-h100-01/gpu-snapshot.json
    service_manager: none
  check_mode: true
"""

RETURN = r"""
backend:
  description: The backend that read the GPUs (V(nvml), V(nvidia-smi) or V(snapshot)); null when nothing is declared.
  returned: always
  type: str
  sample: nvml
gpus:
  description: Every declared GPU with its declared settings, as read before and after the run.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: PCI address.
      type: str
      sample: "0000:17:00.0"
    uuid:
      description: The GPU's UUID, null when the source does not give it.
      type: str
      sample: GPU-5d4d8e4e-3b8f-4c6a-9e1a-2f6f3c9d0b11
    settings:
      description:
        - Setting name (C(persistence), C(compute_mode), C(application_clocks), C(power_limit_w)) to
          C(declared), C(before) and C(after) (in check mode the predicted value) as shown text.
      type: dict
      sample: {"power_limit_w": {"declared": "600 W", "before": "700 W", "after": "600 W"}}
changes:
  description: The settings changed (in check mode, that would change), in order.
  returned: always
  type: list
  elements: dict
  contains:
    gpu:
      description: PCI address.
      type: str
      sample: "0000:17:00.0"
    setting:
      description: The setting.
      type: str
      sample: power_limit_w
    before:
      description: The value read before the run.
      type: str
      sample: 700 W
    after:
      description: The declared value.
      type: str
      sample: 600 W
    command:
      description: The C(nvidia-smi) line that makes the change by hand.
      type: str
      sample: nvidia-smi -i 0000:17:00.0 -pl 600
busy:
  description: Always empty on success (a busy GPU fails the task); kept for the result's shape.
  returned: always
  type: dict
  sample: {}
would_run:
  description: The commands the change needs, a C(systemctl) line for the persistence daemon first.
  returned: always
  type: list
  elements: str
  sample: ["systemctl enable --now nvidia-persistenced.service", "nvidia-smi -i 0000:17:00.0 -pl 600"]
ran:
  description: The commands and NVML calls run; empty in check mode and in render mode.
  returned: always
  type: list
  elements: str
  sample: ["GPU 0000:17:00.0 - nvmlDeviceSetPowerManagementLimit(600000)"]
drift:
  description:
    - One entry per declared setting the GPU reported otherwise before the run, and one for
      C(nvidia-persistenced.service) when it is not as declared.
  returned: always
  type: list
  elements: dict
  contains:
    setting:
      description: C(GPU <address> <setting>) or C(nvidia-persistenced.service).
      type: str
      sample: GPU 0000:17:00.0 power_limit_w
    planned:
      description: The declared value.
      type: str
      sample: 600 W
    actual:
      description: The value read.
      type: str
      sample: 700 W
    reason:
      description: Always empty.
      type: str
      sample: ""
    pending:
      description: Always false.
      type: bool
      sample: false
snapshot_written:
  description: Render mode, outside check mode - whether the change was written into O(snapshot).
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
    module = AnsibleModule(argument_spec=layers.SPECS["gpu"], supports_check_mode=True)
    layers.run_module(module, "gpu", load_pynvml)


if __name__ == "__main__":
    main()
