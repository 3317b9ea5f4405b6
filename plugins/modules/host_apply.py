#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: host_apply
short_description: Apply a host's NUMA plan, every layer in one module run, then restart what changed
version_added: 0.3.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Called with the options below, the module runs with them as given. Called with no option,
    or only O(layers), C(plan), C(measure=true) and C(inputs), the action plugin of the same name
    builds every option on the controller first, from the host's variables (as C(site.yml),
    C(drift_check.yml) and C(verify.yml) call it), or from the role inputs in C(inputs) (as the
    collection's roles call it), runs every input check there, and fails before the module is
    sent when one fails.
  - Runs the apply layers of this collection on one host in one process, in this order whatever
    the order of O(layers) - hugepages (M(numafleet.tuning.numa_hugepages)), kernel
    (M(numafleet.tuning.numa_kernel)), gpu (M(numafleet.tuning.nvidia_gpu_settings)), amd
    (M(numafleet.tuning.amd_partition)), mig (M(numafleet.tuning.nvidia_mig)), mps
    (M(numafleet.tuning.nvidia_mps)) and units (M(numafleet.tuning.pinned_units)). Each layer is
    the same code as that module, with the same result.
  - The plan O(plan) is checked once (version 1, made for O(host) when given, the lists the
    enabled layers read); each layer's options (O(hugepages), O(kernel), ...) are checked against
    that module's options before anything runs.
  - When the amd layer changed the partition modes of AMD GPUs (new logical GPUs exist), or the
    mig layer changed the GPUs (new MIG devices exist), and O(replan) is given, the GPUs
    are read again as M(numafleet.tuning.numa_facts) reads them and the plan is made again with
    the same planner as M(numafleet.tuning.numa_plan), starting from O(plan) so that placements
    keep their resources; the mps and units layers then use the new plan (RV(plan)). Without
    O(replan) they use O(plan) and the module warns.
  - A placement whose MIG instance does not exist yet (C(waits_for) in the plan, for example an
    instance the mig layer creates in this run, or a MIG mode change pending a GPU reset) has its
    unit written but not enabled, started or restarted, and an MPS daemon of such an instance is
    not written at all. When the re-plan after the mig layer finds the instance, the new plan
    names the MIG device and the handler pass of the same run enables and starts the unit (and
    its MPS daemon); otherwise the first run after the instance exists does.
  - After the layers, with O(service_manager=systemd) and not in check mode, the module runs the
    commands the roles' handlers ran (the handler pass), in this order - C(systemctl disable --now)
    of the hugetlbfs mount units no longer wanted; ONE C(systemctl daemon-reload) when any layer
    wrote or removed a unit file; C(systemctl daemon-reexec) when the units layer wrote, changed
    or removed the housekeeping partition's C(system.conf.d) drop-in (host variable
    C(numafleet_partition)), and after a removal C(taskset -a -p -c <allowed CPUs> 1), which gives
    PID 1 its CPUs back; C(systemctl enable numafleet-hugepages.service), mount units
    restarted and started; C(update-grub) or C(grubby) when the boot-time hugepages changed;
    C(systemctl enable numafleet-mig.service) when that unit was written; MPS daemons enabled and
    restarted (O(restart=auto)) and new ones started; pinned units restarted, units pinned by a
    drop-in try-restarted (both O(restart=auto)) and new units started; then O(restart_awaited)
    try-restarted (O(restart=auto)). Every command runs with C(LC_ALL=C); one that fails fails the
    module naming it and what ran.
  - The module never reboots. When the kernel command line changed, RV(reboot_required) is true
    and RV(kernel_args) says what the next boot gets; the play reboots (M(ansible.builtin.reboot)).
  - Every failure message starts with C(host NAME:) when O(host) is given.
  - A layer that fails stops the run; the message names the layer, RV(ran) lists what ran and
    RV(layers) holds the results of the layers that completed.
options:
  plan:
    description:
      - The host's plan, the C(numafleet_plan) fact M(numafleet.tuning.numa_plan) sets
        (C(ansible_facts.numafleet_plan)), used as it is.
    type: dict
    required: true
  host:
    description:
      - The inventory name of the host; when given, a plan made for another host is refused.
    type: str
  layers:
    description:
      - The layers to run. They always run in the order V(hugepages), V(kernel), V(gpu), V(amd),
        V(mig), V(mps), V(units), whatever the order here; a layer not listed is not run (and not
        in RV(layers)).
    type: list
    elements: str
    choices: [hugepages, kernel, gpu, amd, mig, mps, units]
    default: [hugepages, kernel, gpu, amd, mig, mps, units]
  root:
    description:
      - Directory that stands for C(/) of the host, given to every layer. Set it to a scratch
        directory with O(service_manager=none) to render the files without touching the host.
    type: path
    default: /
  service_manager:
    description:
      - Given to every layer. V(systemd) runs the handler pass; V(none) runs no command and
        RV(would_run) lists what systemd would have to do.
    type: str
    choices: [systemd, none]
    default: systemd
  restart:
    description:
      - V(auto) restarts the MPS daemons and pinned units whose files changed, try-restarts the
        units pinned by a drop-in and those of O(restart_awaited).
      - V(never) restarts nothing (units are still started and enabled); the restarts are left to
        a maintenance window, and are not in RV(would_run).
    type: str
    choices: [auto, never]
    default: auto
  restart_awaited:
    description:
      - Units an earlier run left to restart (the plan's C(awaiting_restart)); try-restarted at the
        end of the handler pass with O(restart=auto), listed in RV(would_run) otherwise.
    type: list
    elements: str
    default: []
  hugepages:
    description:
      - Options of M(numafleet.tuning.numa_hugepages) except O(root), O(service_manager) and
        C(pools), which is made from the plan (one C({node, size_kb, count}) per
        C(nodes[].hugepages[]) entry).
    type: dict
    default: {}
  kernel:
    description:
      - Options of M(numafleet.tuning.numa_kernel) except O(root) and O(service_manager).
    type: dict
    default: {}
  gpu:
    description:
      - Options of M(numafleet.tuning.nvidia_gpu_settings) except O(root), O(service_manager) and
        C(mps_gpus) (the GPUs of the plan's C(mps_daemons)). Without C(gpus) the layer changes
        nothing.
    type: dict
    default: {}
  amd:
    description:
      - Options of M(numafleet.tuning.amd_partition) except O(root), O(service_manager), C(gpus)
        (the plan's C(amd_partitions), V([]) when absent) and C(owned_units) (their
        C(owned_units)).
    type: dict
    default: {}
  mig:
    description:
      - Options of M(numafleet.tuning.nvidia_mig) except O(root), O(service_manager), C(gpus) (the
        plan's C(mig_gpus)) and C(owned_units) (the units of the plan's C(placements) and
        C(mps_daemons)).
    type: dict
    default: {}
  mps:
    description:
      - Options of M(numafleet.tuning.nvidia_mps) except O(root), O(service_manager) and C(plan).
    type: dict
    default: {}
  units:
    description:
      - Options of M(numafleet.tuning.pinned_units) except O(root), O(service_manager) and C(plan).
    type: dict
    default: {}
  replan:
    description:
      - The planner's inputs, to make the plan again when the mig layer created or destroyed MIG
        devices. Without it the mps and units layers use O(plan) as it is.
    type: dict
    suboptions:
      numa:
        description: C(ansible_facts.numa); read again from O(replan.sysfs_root) when empty.
        type: dict
      placements:
        description: The host's C(numafleet_placements).
        type: list
        elements: dict
        default: []
      tenants:
        description: The host's C(numafleet_tenants).
        type: list
        elements: dict
        default: []
      policy:
        description: C(reserved_cpus), C(memory_headroom_pct) and C(partition), as M(numafleet.tuning.numa_plan) takes them.
        type: dict
        default: {}
      hugepages_extra:
        description: The host's C(numafleet_hugepages_extra).
        type: list
        elements: dict
        default: []
      mig_gpus:
        description: The host's C(numafleet_mig_gpus).
        type: list
        elements: raw
        default: []
      gpu_partitions:
        description:
          - The host's C(numafleet_gpu_partitions) (both vendors), given to the planner when not
            empty.
        type: list
        elements: raw
        default: []
      sysfs_root:
        description: Where sysfs is mounted, as for M(numafleet.tuning.numa_facts).
        type: path
        default: /sys
      procfs_root:
        description: Where procfs is mounted, as for M(numafleet.tuning.numa_facts).
        type: path
        default: /proc
      gpu_snapshot:
        description: A recorded GPU state read instead of NVML, as for M(numafleet.tuning.numa_facts).
        type: path
  measure:
    description:
      - After the layers (and the handler pass), measure the plan's placements as
        M(numafleet.tuning.numa_locality_info) does, read-only, and return the measurement in
        RV(locality). C(verify.yml) and C(drift_check.yml) use it, so that the comparison and the
        measurement are one module run per host.
      - Unset (the default), nothing is measured.
    type: dict
    suboptions:
      sysfs_root:
        description: Where sysfs is mounted.
        type: path
        default: /sys
      procfs_root:
        description: Where procfs is mounted.
        type: path
        default: /proc
      cgroup_root:
        description: Where the cgroup file system is mounted.
        type: path
        default: /sys/fs/cgroup
      window_s:
        description: The sampling window in seconds (V(0) is one sample), as for M(numafleet.tuning.numa_locality_info).
        type: float
        default: 5
      perf:
        description: V(auto) uses C(perf stat) when it is installed; V(never) does not.
        type: str
        choices: [auto, never]
        default: auto
      guard:
        description:
          - Also read the memory guard's files (C(numafleet-guard)) into C(guard) of
            RV(locality) for the verify checks (spilled placements, the guard's config, last run
            and service state). Unset (the default), they are not read.
        type: dict
        suboptions:
          state_file:
            description: The guard's state file (its last round and spilled placements).
            type: path
            default: /run/numafleet-guard/state.json
          config_file:
            description: The guard's config file (its settings).
            type: path
            default: /etc/numafleet/guard.json
          service:
            description: Whether to ask C(systemctl is-active numafleet-guard.service) (the guard is enabled on the host).
            type: bool
            default: false
  recorded_digest:
    description:
      - The digest of the host's recorded state (the plan file and the files the last apply
        wrote, as C(ansible_facts.numafleet_recorded) of M(numafleet.tuning.numa_facts) read it)
        that the caller planned from and showed its change plan for.
      - When given, the module reads that state again under its lock, before anything changes,
        and fails when it differs, naming the fix. Another run applied in between, or the facts
        came from a stale fact cache, so the change plan that was shown is not what would happen.
      - When given and not in check mode, the module also returns the state after the apply as
        RV(ansible_facts.numafleet_recorded) and RV(ansible_facts.numafleet_state_paths), so that
        a fact cache holds the new state.
    type: str
extends_documentation_fragment:
  - numafleet.tuning.file_safety
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: Every layer runs in check mode; nothing is written or run, RV(would_run) lists the commands.
  diff_mode:
    support: full
    details: RV(diff) holds the diffs of every layer, in layer order.
  idempotent:
    support: full
requirements:
  - What each enabled layer's module requires on the target.
notes:
  - The per-host lock is held once, for all the layers (not in check mode).
  - The mps and units layers remove only the files their manifests list, as
    M(numafleet.tuning.nvidia_mps) and M(numafleet.tuning.pinned_units) do; files they keep are in
    their C(kept) results and warnings.
seealso:
  - module: numafleet.tuning.numa_plan
  - module: numafleet.tuning.numa_hugepages
  - module: numafleet.tuning.numa_kernel
  - module: numafleet.tuning.nvidia_mig
  - module: numafleet.tuning.nvidia_mps
  - module: numafleet.tuning.pinned_units
"""

EXAMPLES = r"""
- name: Apply the host's plan, every layer, in one module run
  numafleet.tuning.host_apply:
    plan: "{{ ansible_facts.numafleet_plan }}"
    host: "{{ inventory_hostname }}"
    restart_awaited: "{{ ansible_facts.numafleet_plan.awaiting_restart | default([]) }}"
    hugepages:
      bootloader: grub_d
    mig:
      reset_ok: true
  register: applied
  notify: Reboot for the boot-time hugepages

- name: Render only the pinned units into a scratch directory
  numafleet.tuning.host_apply:
    plan: "{{ ansible_facts.numafleet_plan }}"
    layers: [units]
    root: /tmp/render/{{ inventory_hostname }}
    service_manager: none
  register: rendered

- name: Show what systemd would have to do
  ansible.builtin.debug:
    var: rendered.would_run
"""

RETURN = r"""
locality:
  description:
    - The measurement of the plan's placements (keys C(services) and C(nodes)), as
      M(numafleet.tuning.numa_locality_info) returns it.
    - "With O(measure.guard), also C(guard): C(service), C(active) (the word of C(systemctl
      is-active), or V(null)), C(active_reason), C(config_file), C(settings) (C(warn_pct),
      C(act_pct), C(act), C(interval_s) of the guard's config, or V(null)), C(config_reason),
      C(state_file), C(last_run) (epoch seconds of the guard's last round, or V(null)),
      C(spilled) (placement to C(from), C(to), C(since), C(bytes)), C(state_reason) and
      C(read_at) (epoch seconds, the host's clock)."
  returned: when O(measure) is given
  type: dict
  sample: {services: [], nodes: []}
ansible_facts:
  description: The host's recorded state after the apply.
  returned: when O(recorded_digest) is given, not in check mode
  type: complex
  contains:
    numafleet_recorded:
      description: As M(numafleet.tuning.numa_facts) publishes it for O(root).
      type: dict
    numafleet_state_paths:
      description: The collection's state files below O(root) that exist, as M(numafleet.tuning.numa_facts) publishes them.
      type: list
      elements: str
layers:
  description:
    - Layer name -> the result of that layer, as its module returns it (see the RETURN of
      M(numafleet.tuning.numa_hugepages), M(numafleet.tuning.numa_kernel),
      M(numafleet.tuning.nvidia_gpu_settings), M(numafleet.tuning.nvidia_mig),
      M(numafleet.tuning.nvidia_mps) and
      M(numafleet.tuning.pinned_units)); a layer that did not run is absent. On failure, the
      layers that completed.
    - The hugepages, kernel, gpu, mig and mps results have C(drift), every difference from the plan
      found before the run (C(setting), C(planned), C(actual), C(reason), C(pending)), also where
      the apply does not change it (a pool held above the plan by pages in use). The action
      plugin's C(changed_layers) counts a layer with a C(drift) entry that is not C(pending) in
      check mode, and M(numafleet.tuning.numa_verify) judges them (O(numafleet.tuning.numa_verify#module:layer_states)).
    - The units layer's C(effective) and C(foreign_overrides) say what systemd will use for each
      planned unit, whoever wrote the files (see M(numafleet.tuning.pinned_units)). The action
      plugin counts a non-empty C(foreign_overrides) in check mode as a change of the
      C(pinned_services) layer (RV(changed_layers)), and outside check mode warns about each,
      naming the file, the property, the planned and effective value and the fix (remove the file,
      or C(systemctl revert UNIT), then daemon-reload and restart the unit).
  returned: always
  type: dict
  sample: {units: {changed: true, files: [], reload_needed: true, would_run: [], ran: []}}
changed_layers:
  description:
    - Set by the action plugin when it built the options (site.yml, drift_check.yml, verify.yml,
      the roles) - the roles whose layer changed or would change the host (V(hugepages),
      V(numa_kernel), V(nvidia_gpu), V(nvidia_mig), V(nvidia_mps), V(pinned_services)), in layer
      order. In check
      mode a units layer with C(foreign_overrides) counts as V(pinned_services).
  returned: when the action plugin built the options
  type: list
  elements: str
  sample: [pinned_services]
ran:
  description: Every command that ran, the layers' own and then the handler pass's, in order.
  returned: always
  type: list
  elements: str
  sample: [systemctl daemon-reload, systemctl restart numafleet-llm-70b.service]
would_run:
  description:
    - In check mode or with O(service_manager=none), the commands that would run, in order - every
      layer's, with ONE C(systemctl daemon-reload), restarts left out with O(restart=never), then
      the try-restarts of O(restart_awaited). Empty otherwise.
  returned: always
  type: list
  elements: str
  sample: [systemctl daemon-reload, systemctl enable --now numafleet-embed.service]
reboot_required:
  description:
    - Whether a reboot is owed for the kernel command line (hugepages layer) - it changed in this
      run, or RV(reboot_pending); the module does not reboot.
  returned: always
  type: bool
  sample: false
reboot_pending:
  description:
    - Whether the kernel command line written by an earlier run is not yet the running one
      (C(/proc/cmdline) lacks some of RV(kernel_args)), so the host has not rebooted since.
  returned: always
  type: bool
  sample: false
kernel_args:
  description:
    - The arguments numafleet puts on the kernel command line (hugepages layer - boot-reserved
      hugepages, then the kernel CPU isolation of C(numafleet_kernel_isolation)), or V([]).
  returned: always
  type: list
  elements: str
  sample: [hugepagesz=1G, hugepages=0:16,1:16]
reset_required:
  description:
    - Whether a GPU needs a reset for its MIG mode (mig layer), or the amdgpu driver a reload for
      a memory partition (amd layer, without C(reset_ok)), else false.
  returned: always
  type: bool
  sample: false
mig_devices:
  description: The MIG devices of the mig layer's result, or V([]).
  returned: always
  type: list
  elements: dict
  sample: []
plan:
  description: The plan made again after the MIG change (see O(replan)).
  returned: when the plan was made again
  type: dict
  sample: {version: 1, host: gpu-a100-01, placements: []}
summary:
  description:
    - The one-line summary of RV(plan), then C(; re-planned after the MIG layout changed), the
      placements that waited for their MIG instance and were started in this run
      (C(; 1 started once its MIG instance existed (classify))) and those still waiting
      (C(; 1 waiting for a MIG instance (embed))).
  returned: when the plan was made again
  type: str
  sample: "gpu-a100-01: 2 placements: embed node0 cpus 2-9 gpus 17:00.0; ...; re-planned after
    the MIG layout changed; 1 started once its MIG instance existed (classify)"
diff:
  description: The diffs of every layer, in layer order.
  returned: in diff mode
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

_LAYER_OPTION = dict(type="dict", default={})
# The planner's inputs (option replan) and the measurement's settings (option measure).
REPLAN_SPEC = dict(
    numa=dict(type="dict"),
    placements=dict(type="list", elements="dict", default=[]),
    tenants=dict(type="list", elements="dict", default=[]),
    policy=dict(type="dict", default={}),
    hugepages_extra=dict(type="list", elements="dict", default=[]),
    mig_gpus=dict(type="list", elements="raw", default=[]),
    gpu_partitions=dict(type="list", elements="raw", default=[]),
    sysfs_root=dict(type="path", default="/sys"),
    procfs_root=dict(type="path", default="/proc"),
    gpu_snapshot=dict(type="path"),
)
MEASURE_SPEC = dict(
    sysfs_root=dict(type="path", default="/sys"),
    procfs_root=dict(type="path", default="/proc"),
    cgroup_root=dict(type="path", default="/sys/fs/cgroup"),
    window_s=dict(type="float", default=5),
    perf=dict(type="str", choices=["auto", "never"], default="auto"),
    guard=dict(
        type="dict",
        options=dict(
            state_file=dict(type="path", default="/run/numafleet-guard/state.json"),
            config_file=dict(type="path", default="/etc/numafleet/guard.json"),
            service=dict(type="bool", default=False),
        ),
    ),
)


def load_pynvml():
    """The pynvml module of nvidia-ml-py, or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def load_amdsmi():
    """The amdsmi module of ROCm, or None when it is not installed (or cannot load)."""
    try:
        import amdsmi
    except (ImportError, OSError):
        return None
    return amdsmi


def _fail(module, msg: str, **extra) -> None:
    """fail_json with ``msg`` led by "host NAME: " when the host option is given."""
    host = module.params["host"]
    if host and not msg.startswith(f"host {host}: "):
        msg = f"host {host}: {msg}"
    module.fail_json(msg=msg, **extra)


def _layer_params(module, name: str, plan: dict) -> dict:
    """The validated options of layer ``name``; fails the module naming the option."""
    given = dict(module.params[name] or {})
    supplied = [key for key in layers.SUPPLIED[name] if key in given]
    if supplied:
        _fail(
            module,
            f"{name}: {', '.join(supplied)} cannot be set here: host_apply sets "
            f"{', '.join(layers.SUPPLIED[name])} of this layer itself (from its root, "
            f"service_manager and plan options); remove {', '.join(supplied)} from {name}",
        )
    params = dict(given)
    params.update(
        layers.supplied_params(name, plan, module.params["root"], module.params["service_manager"])
    )
    checked = ArgumentSpecValidator(layers.SPECS[name]).validate(params)
    if checked.error_messages:
        _fail(module, f"{name}: {'; '.join(checked.error_messages)}")
    return checked.validated_parameters


def main() -> None:
    spec = dict(
        plan=dict(type="dict", required=True),
        host=dict(type="str"),
        layers=dict(
            type="list", elements="str", choices=list(layers.LAYERS), default=list(layers.LAYERS)
        ),
        root=dict(type="path", default="/"),
        service_manager=dict(type="str", choices=["systemd", "none"], default="systemd"),
        restart=dict(type="str", choices=["auto", "never"], default="auto"),
        restart_awaited=dict(type="list", elements="str", default=[]),
        replan=dict(type="dict", options=REPLAN_SPEC),
        measure=dict(type="dict", options=MEASURE_SPEC),
        recorded_digest=dict(type="str"),
        **{name: dict(_LAYER_OPTION) for name in layers.LAYERS},
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    params = module.params
    enabled = [name for name in layers.LAYERS if name in params["layers"]]
    plan, replanned = params["plan"], None
    try:
        layers.check_plan(plan, params["host"], enabled)
    except layers.LayerError as exc:
        _fail(module, exc.msg)
    options = {name: _layer_params(module, name, plan) for name in enabled}
    if "mps" in options:  # render mode records a restarted daemon's defaults only if restarted
        options["mps"]["restart"] = params["restart"]

    host = layers.ModuleHost(module, load_pynvml, load_amdsmi)
    results, ran, current = {}, [], None
    try:
        with layers.lock(params["root"], host.check_mode):
            if params["recorded_digest"] is not None and not host.check_mode:
                _check_recorded(module)
            for current in enabled:
                if current in ("mps", "units") and replanned is not None:
                    options[current]["plan"] = replanned
                results[current] = layers.run(current, options[current], host)
                ran += results[current].get("ran") or []
                if current in ("amd", "mig") and results[current].get("gpu_changed"):
                    if not {"mps", "units"} & set(enabled):
                        continue
                    what = "AMD partition modes" if current == "amd" else "MIG layout"
                    if params["replan"] is None:
                        module.warn(
                            f"the {what} changed and replan is not given: the mps and units "
                            "layers use the plan as given, whose GPU device UUIDs may be stale; "
                            "run again (numa_facts and numa_plan read the new devices)"
                        )
                    else:
                        replanned = layers.replan(
                            replanned or plan, params["replan"], host, current
                        )
            current = None
            ran += _handler_pass(module, results)
    except layers.LayerError as exc:
        where = f"layer {current}: " if current else ""
        ran += exc.ran or []
        _fail(module, f"{where}{exc.msg}", ran=ran, layers=results)

    render = host.check_mode or params["service_manager"] == "none"
    hugepages, mig = results.get("hugepages") or {}, results.get("mig") or {}
    amd = results.get("amd") or {}
    result = dict(
        changed=any(result.get("changed") for result in results.values()) or bool(ran),
        layers=results,
        ran=ran,
        would_run=layers.merged_would_run(results, params["restart"], params["restart_awaited"])
        if render
        else [],
        reboot_required=bool(hugepages.get("reboot_required")),
        reboot_pending=bool(hugepages.get("reboot_pending")),
        kernel_args=list(hugepages.get("kernel_args") or []),
        reset_required=bool(mig.get("reset_required") or amd.get("reset_required")),
        mig_devices=list(mig.get("mig_devices") or []),
    )
    if replanned is not None:
        amd_only = amd.get("gpu_changed") and not mig.get("gpu_changed")
        what = "the AMD partition modes" if amd_only else "the MIG layout"
        result.update(plan=replanned, summary=_replanned_summary(plan, replanned, what))
    if params["measure"] is not None:
        result["locality"] = _measure(module, replanned or plan)
    if params["recorded_digest"] is not None and not host.check_mode:
        result["ansible_facts"] = _recorded_facts(params["root"])
    if module._diff:
        diff = []
        for name in enabled:
            entry = results[name].get("diff") or []
            diff += entry if isinstance(entry, list) else [entry]
        result["diff"] = diff
    module.exit_json(**result)


def _replanned_summary(plan: dict, replanned: dict, what: str = "the MIG layout") -> str:
    """The summary line of the plan made again after the MIG change, naming the placements that
    waited for their MIG instance and were started in this run, and those still waiting."""

    def waiting(some: dict) -> list:
        return sorted(
            str(p.get("name")) for p in some.get("placements") or () if p.get("waits_for")
        )

    line = layers.summary(replanned) + f"; re-planned after {what} changed"
    still = waiting(replanned)
    started = [name for name in waiting(plan) if name not in still]
    if started:
        line += f"; {len(started)} started once its MIG instance existed ({', '.join(started)})"
    if still:
        line += f"; {len(still)} waiting for a MIG instance ({', '.join(still)})"
    return line


def _check_recorded(module) -> None:
    """Fail, before anything changes, when the host's recorded state is not what the caller
    planned from (recorded.state_digest of a fresh read against O(recorded_digest))."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
        read_recorded,
        state_digest,
    )

    if state_digest(read_recorded(module.params["root"])) != module.params["recorded_digest"]:
        _fail(
            module,
            "the host's recorded state (the plan in /etc/numafleet/plan.json and the files the "
            "last apply wrote) changed after the facts were read: another run applied in "
            "between, or the facts came from a stale fact cache, so the change plan shown is "
            "not what would happen. Nothing was changed; run again (with --flush-cache when a "
            "fact cache is configured).",
            ran=[],
            layers={},
        )


def _recorded_facts(root: str) -> dict:
    """numafleet_recorded and numafleet_state_paths below root, read after the apply."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import (
        read_state_paths,
        state_files_below,
    )
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
        read_recorded,
    )

    return {
        "numafleet_recorded": read_recorded(root),
        "numafleet_state_paths": read_state_paths(state_files_below(root)),
    }


def _measure(module, plan: dict) -> dict:
    """The measurement of plan's placements (locality.measure_on_host); fails the module."""
    import functools
    import time

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
        NumaTuneError,
    )
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.locality import (
        measure_on_host,
    )

    run = functools.partial(module.run_command, check_rc=False)
    try:
        return measure_on_host(
            plan.get("placements") or [],
            module.params["measure"],
            run,
            module.get_bin_path,
            time.sleep,
        )
    except NumaTuneError as exc:
        _fail(module, f"measure: {exc}")


def _handler_pass(module, results: dict) -> list:
    """Run the handler pass (layers.handler_argvs) with systemd, not in check mode; the lines run."""
    params = module.params
    if module.check_mode or params["service_manager"] != "systemd":
        return []
    done = []
    for argv in layers.handler_argvs(results, params["restart"], params["restart_awaited"]):
        line = " ".join(argv)
        path = module.get_bin_path(argv[0], required=False) or argv[0]
        rc, dummy, err = module.run_command([path] + argv[1:], environ_update=dict(layers.ENVIRON))
        if rc != 0:
            raise layers.LayerError(
                f"handler pass: {line} failed (rc {rc}): {err.strip()}; the layers' files are "
                "written: fix it and run again (or run the rest by hand)",
                done,
            )
        done.append(line)
    return done


if __name__ == "__main__":
    main()
