#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_mps
short_description: Run one CUDA MPS control daemon per GPU or MIG device of a placement plan
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Writes, below O(root) in O(unit_dir) (default C(/etc/systemd/system)), the template unit
    C(nvidia-mps@.service) and one drop-in C(nvidia-mps@<device UUID>.service.d/50-numafleet.conf)
    per entry of the plan's C(mps_daemons), the MPS daemons that the plan made by
    M(numafleet.tuning.numa_plan) shares between its MPS client placements.
  - The template runs C(nvidia-cuda-mps-control -d) (C(Type=forking)) with
    C(CUDA_VISIBLE_DEVICES=%i) (the device UUID), C(CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/%i)
    (C(RuntimeDirectory=), mode C(0700), owned by the daemon's C(User=); never C(/tmp)) and
    C(CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps/%i) (C(LogsDirectory=)), stops with
    C(echo quit | nvidia-cuda-mps-control), and orders itself after C(numafleet-mig.service) and
    C(nvidia-persistenced.service).
  - The drop-in sets the clients' common C(User=)/C(Group=) (root when they differ or none is
    set), pins the daemon to its GPU's NUMA node (C(CPUAffinity=), C(NUMAPolicy=bind),
    C(NUMAMask=), C(AllowedCPUs=), C(AllowedMemoryNodes=)), and sends
    C(set_default_active_thread_percentage N) and C(set_default_device_pinned_mem_limit 0 <M>M)
    to the daemon in C(ExecStartPost=). The daemon forgets these defaults when it quits, so they
    are part of the unit, not a one-off command.
  - Compute mode. For a whole GPU the drop-in runs C(nvidia-smi -i <PCI address> -c
    EXCLUSIVE_PROCESS) in C(ExecStartPre=+) (privileged even with C(User=)) and C(-c DEFAULT) in
    C(ExecStopPost=+), as NVIDIA's MPS guide does for a multi-user system. For a MIG device it
    sets no compute mode; the MIG user guide (section "MIG with CUDA MPS") says EXCLUSIVE_PROCESS
    is not supported in MIG mode, where every MIG device runs its own MPS server.
  - A daemon whose MIG instance does not exist yet (C(instance) null in the plan) is skipped with
    a warning; it gets its unit when the instance exists and the plan is made again.
  - The files written are recorded in the manifest O(manifest_path). A daemon that left the plan
    is stopped and disabled (C(systemctl disable --now), with O(service_manager=systemd)) and its
    drop-in removed; the template goes with the last daemon. Other files are never touched.
  - Reloading, restarting and starting are left to the caller's handlers, through
    RV(reload_needed), RV(handler_restart) and RV(handler_start).
  - With O(service_manager=systemd), the live defaults of every active daemon are read back with
    C(get_default_active_thread_percentage) and C(get_default_device_pinned_mem_limit 0), sent to
    C(nvidia-cuda-mps-control) on standard input with the daemon's C(CUDA_MPS_PIPE_DIRECTORY), and
    returned in RV(settings). A daemon that runs with other values than planned, and is not
    restarted anyway, gets the planned ones set live (outside check mode), which counts as a change.
    A new default applies to MPS servers started after it; clients already connected keep theirs.
options:
  plan:
    description:
      - The plan of one host, the C(numafleet_plan) fact set by M(numafleet.tuning.numa_plan).
      - Only its C(mps_daemons) (and C(host), for messages) are used. A daemon entry that lacks a
        key or has a value systemd cannot take fails the module with a message naming the entry.
    type: dict
    required: true
  root:
    description:
      - Directory that stands for C(/) of the host. Every file is written, read and removed below it.
      - Set it to a scratch directory to render the files without touching the host (render mode),
        together with O(service_manager=none).
    type: path
    default: /
  unit_dir:
    description:
      - Directory of the unit files, as on the host (below O(root)). It must be an absolute path.
    type: path
    default: /etc/systemd/system
  manifest_path:
    description:
      - Path, as on the host (below O(root)), of the JSON manifest listing the files this module
        wrote. It must be an absolute path, and differ from the manifest of
        M(numafleet.tuning.pinned_units).
    type: path
    default: /etc/numafleet/mps-units.json
  header:
    description:
      - Comment block written as the first lines of every file, for example
        C({{ ansible_managed | comment }}). Every line must start with C(#) or C(;).
      - An empty string writes no header.
    type: str
    default: "# Managed by numafleet.tuning"
  service_manager:
    description:
      - V(systemd) stops and disables daemons that left the plan, reads back (and fixes) the
        live defaults of active daemons, and fills RV(handler_restart) and RV(handler_start).
      - V(none) only writes files and never runs a command, for render mode; RV(would_run) still
        lists what systemd would have to do.
    type: str
    choices: [systemd, none]
    default: systemd
  nvidia_cuda_mps_control:
    description:
      - Absolute path of C(nvidia-cuda-mps-control) on the host, written into the units and used
        for the read-back. Only letters, digits and C(/ . _ + -) are accepted.
    type: path
    default: /usr/bin/nvidia-cuda-mps-control
  nvidia_smi:
    description:
      - Absolute path of C(nvidia-smi) on the host, written into the units of whole-GPU daemons
        (compute mode). Only letters, digits and C(/ . _ + -) are accepted.
    type: path
    default: /usr/bin/nvidia-smi
extends_documentation_fragment:
  - numafleet.tuning.file_safety
  - numafleet.tuning.file_safety.manifest
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode the files are rendered and compared and the live defaults are read;
        nothing is written, set or stopped.
  diff_mode:
    support: full
    details: The diff holds one entry per file that is created, changed or removed, the manifest included.
  idempotent:
    support: full
requirements:
  - C(systemctl) and C(nvidia-cuda-mps-control) on the target when O(service_manager=systemd)
    and a daemon has to be removed or is active.
notes:
  - MPS clients of the plan get C(Requires=) and C(After=) on their daemon from
    M(numafleet.tuning.pinned_units), so restarting a daemon restarts its clients.
  - The daemon's pipe directory is mode C(0700) and owned by its C(User=); clients must run as
    that user (or root), which is what the plan's common user of the clients gives.
  - With O(root) other than C(/), use O(service_manager=none); C(systemctl) acts on the running host.
seealso:
  - module: numafleet.tuning.numa_plan
  - module: numafleet.tuning.pinned_units
  - module: numafleet.tuning.nvidia_mig
  - name: NVIDIA Multi-Process Service documentation
    description: Control daemon commands, environment variables and compute mode.
    link: https://docs.nvidia.com/deploy/mps/index.html
  - name: NVIDIA MIG user guide, MIG with CUDA MPS
    description: One MPS control daemon per MIG device; no EXCLUSIVE_PROCESS in MIG mode.
    link: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html
"""

EXAMPLES = r"""
- name: Write the MPS daemons of this host's plan
  numafleet.tuning.nvidia_mps:
    plan: "{{ numafleet_plan }}"
    header: "{{ ansible_managed | comment }}"
  register: mps

- name: Enable and start new MPS daemons
  ansible.builtin.systemd_service:
    name: "{{ item }}"
    state: started
    enabled: true
    daemon_reload: true
  loop: "{{ mps.handler_start }}"

- name: Render the MPS units into a scratch directory instead of the host
  numafleet.tuning.nvidia_mps:
    plan: "{{ numafleet_plan }}"
    root: /tmp/render/{{ inventory_hostname }}
    service_manager: none
  register: rendered

- name: Show what systemd would have to do
  ansible.builtin.debug:
    var: rendered.would_run
"""

RETURN = r"""
drift:
  description:
    - One entry per default a running daemon reports other than the plan (RV(settings));
      C(setting) is C(<unit> active_thread_percentage) or C(<unit> pinned_memory_limit_mib).
    - Each entry is C(setting), C(planned), C(actual), C(reason) and C(pending) (true only for a
      difference the run cannot make in this mode; it is neither drift nor a failed check).
  returned: always
  type: list
  elements: dict
  sample: [{setting: "nvidia-mps@GPU-1.service active_thread_percentage", planned: 50, actual: 100, reason: "", pending: false}]
files:
  description:
    - Every file the module manages, as on the host (below O(root)), sorted by path, the manifest
      last, with what happened to it (or would happen, in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path of the file as on the host.
      returned: always
      type: str
      sample: /etc/systemd/system/nvidia-mps@.service
    state:
      description: V(create), V(update), V(remove) or V(unchanged).
      returned: always
      type: str
      sample: create
  sample:
    - path: /etc/systemd/system/nvidia-mps@.service
      state: create
    - path: /etc/numafleet/mps-units.json
      state: create
daemons:
  description: The daemons of the plan that got a unit, sorted by unit (pending MIG ones left out).
  returned: always
  type: list
  elements: dict
  contains:
    unit:
      description: The daemon's unit.
      returned: always
      type: str
      sample: nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service
    instance:
      description: The device UUID, the unit's instance name and C(CUDA_VISIBLE_DEVICES).
      returned: always
      type: str
      sample: GPU-fdb5df64-11ce-5c72-a560-9702875cecd6
    gpu_address:
      description: PCI address of the GPU (the parent GPU of a MIG device).
      returned: always
      type: str
      sample: "0000:31:00.0"
    gpu_uuid:
      description: UUID of the (parent) GPU, null when unknown.
      returned: always
      type: str
      sample: GPU-fdb5df64-11ce-5c72-a560-9702875cecd6
    mig:
      description: Whether the device is a MIG device (then no compute mode is set).
      returned: always
      type: bool
      sample: false
    node:
      description: NUMA node of the GPU, null when unknown.
      returned: always
      type: int
      sample: 0
    cpus:
      description: CPUs the daemon is pinned to (sorted).
      returned: always
      type: list
      elements: int
      sample: [4, 5, 6, 7]
    mems:
      description: Memory nodes the daemon is bound to (sorted).
      returned: always
      type: list
      elements: int
      sample: [0]
    user:
      description: C(User=) of the daemon, null for root.
      returned: always
      type: str
      sample: tei
    group:
      description: C(Group=) of the daemon, null for the user's group.
      returned: always
      type: str
      sample: null
    active_thread_percentage:
      description: Default active thread percentage set after start, null when not set.
      returned: always
      type: int
      sample: 50
    pinned_memory_limit_mib:
      description: Default pinned device memory limit (MiB) set after start, null when not set.
      returned: always
      type: int
      sample: 16384
    pipe_dir:
      description: C(CUDA_MPS_PIPE_DIRECTORY) of the daemon and its clients.
      returned: always
      type: str
      sample: /run/nvidia-mps/GPU-fdb5df64-11ce-5c72-a560-9702875cecd6
    log_dir:
      description: C(CUDA_MPS_LOG_DIRECTORY) of the daemon.
      returned: always
      type: str
      sample: /var/log/nvidia-mps/GPU-fdb5df64-11ce-5c72-a560-9702875cecd6
    clients:
      description: Names of the placements that use the daemon.
      returned: always
      type: list
      elements: str
      sample: [rerank-a, rerank-b]
units:
  description: Daemons (C(nvidia-mps@<uuid>.service)) whose drop-in is new, changed, removed or unchanged.
  returned: always
  type: dict
  contains:
    new:
      description: Daemons whose drop-in is created.
      returned: always
      type: list
      elements: str
      sample: [nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service]
    changed:
      description: Daemons whose drop-in, or the template, is rewritten.
      returned: always
      type: list
      elements: str
      sample: []
    removed:
      description: Daemons whose drop-in is removed.
      returned: always
      type: list
      elements: str
      sample: []
    unchanged:
      description: Daemons whose files are already as planned.
      returned: always
      type: list
      elements: str
      sample: []
reload_needed:
  description: Whether a unit or drop-in file was (or would be) created, changed or removed.
  returned: always
  type: bool
  sample: true
would_run:
  description:
    - The C(systemctl) commands that bring the daemons in line with the files, in order
      (C(disable --now) removed daemons, C(daemon-reload), C(restart) changed ones, C(enable --now)
      new ones), whatever O(service_manager) and check mode.
  returned: always
  type: list
  elements: str
  sample: [systemctl daemon-reload, "systemctl enable --now nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service"]
kept:
  description:
    - Files the manifest lists that are not disabled or removed because numafleet did not write
      them as they are now (not named as numafleet names its files, outside O(unit_dir),
      content changed since written, a link), with the reason. Each is also a warning.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The file, as on the host.
      returned: always
      type: str
      sample: /usr/lib/systemd/system/sshd.service
    reason:
      description: Why it is kept.
      returned: always
      type: str
      sample: is not named as numafleet names its files (numafleet-*.service, numafleet*.slice, nvidia-mps@.service, <unit>.d/50-numafleet.conf)
  sample: []
ran:
  description: The commands the module ran (C(systemctl disable --now) and live settings).
  returned: always
  type: list
  elements: str
  sample: [systemctl disable --now nvidia-mps@GPU-0a1b.service]
settings:
  description:
    - Live defaults of every active daemon, planned next to running (empty with
      O(service_manager=none)). Running is null when the daemon's answer could not be read.
  returned: always
  type: list
  elements: dict
  contains:
    unit:
      description: The daemon's unit.
      returned: always
      type: str
      sample: nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service
    active_thread_percentage:
      description: C(planned) and C(running) default active thread percentage.
      returned: always
      type: dict
      sample: {planned: 50, running: 100}
    pinned_memory_limit_mib:
      description: C(planned) and C(running) default pinned device memory limit of device 0 (MiB).
      returned: always
      type: dict
      sample: {planned: 16384, running: 16384}
skipped:
  description:
    - One message per daemon of the plan that got no unit because its MIG instance does not exist
      yet (also given as a warning).
  returned: always
  type: list
  elements: str
  sample:
    - "host gpu-a100-01: MPS daemon for embed on GPU 0000:17:00.0 skipped: its MIG instance does
      not exist yet; create it (numafleet.tuning.nvidia_mig) and plan again"
handler_restart:
  description:
    - Daemons to restart after a C(daemon-reload), for the caller's handlers (their clients are
      restarted with them through C(Requires=)).
    - Empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: [nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service]
handler_start:
  description:
    - New daemons to enable and start after a C(daemon-reload).
    - Empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: [nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers


def main() -> None:
    module = AnsibleModule(argument_spec=layers.SPECS["mps"], supports_check_mode=True)
    layers.run_module(module, "mps")


if __name__ == "__main__":
    main()
