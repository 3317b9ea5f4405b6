#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: pinned_units
short_description: Write the systemd units, drop-ins and tenant slices of a NUMA placement plan
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Renders the plan made by M(numafleet.tuning.numa_plan) into systemd files and writes them
    below O(root) in O(unit_dir) (default C(/etc/systemd/system)), C(numafleet-<name>.service) for
    a placement with C(exec), C(<unit>.d/50-numafleet.conf) for a placement that names an existing
    C(unit), and C(numafleet-<tenant>.slice) for every tenant that has placements.
  - Services and drop-ins pin the process with C(CPUAffinity=), C(NUMAPolicy=bind),
    C(NUMAMask=), C(AllowedCPUs=) and C(AllowedMemoryNodes=), put it in its tenant's slice
    (C(Slice=)), set C(Environment=) (C(CUDA_VISIBLE_DEVICES) and the MPS variables among them)
    and C(LimitMEMLOCK=infinity). Services run C(Type=simple) with C(Restart=on-failure) and,
    with O(hardening), a set of sandboxing settings that leaves C(/dev) alone. Placements that use
    MPS get C(Requires=) and C(After=) on their daemon C(nvidia-mps@<device>.service) (role
    C(numafleet.tuning.nvidia_mps)), so a client never runs outside MPS; placements on a MIG
    instance start C(After=numafleet-mig.service), which re-creates the instances at boot
    (role C(numafleet.tuning.nvidia_mig)). A drop-in first assigns the empty
    value to C(CPUAffinity=), C(NUMAMask=), C(AllowedCPUs=) and C(AllowedMemoryNodes=), which
    systemd would otherwise merge with the vendor unit's own values.
  - "A placement's resource limits (plan key C(limits), from its C(memory_limit), C(cpu_weight),
    C(io_weight) and C(tasks_max)) follow C(LimitMEMLOCK=) in its service or drop-in:
    C(MemoryMax=) or C(MemoryHigh=) (its memory budget in bytes), C(CPUWeight=), C(IOWeight=) and
    C(TasksMax=). A drop-in's value replaces the vendor unit's (the last assignment wins).
    Changing a limit rewrites that placement's file only, and the unit is restarted like for any
    change of its file."
  - Tenant slices set C(AllowedCPUs=) and C(AllowedMemoryNodes=) to the union of their
    placements, and C(MemoryMax=) when the tenant has a memory limit.
  - A plan with a C(partition) key (host variable C(numafleet_partition)) also gets the
    housekeeping partition - C(system.slice.d/50-numafleet.conf), C(user.slice.d/50-numafleet.conf)
    (C([Slice] AllowedCPUs=)) and C(init.scope.d/50-numafleet.conf) (C([Scope] AllowedCPUs=)) in
    O(unit_dir), and C(system.conf.d/50-numafleet.conf) (C([Manager] CPUAffinity=)) beside it
    (C(/etc/systemd/system.conf.d/)), all set to the housekeeping CPUs. C(numafleet.slice) is not
    confined. Slices and scopes are listed in RV(slices) and never restarted (C(daemon-reload)
    applies them); a change of the C(system.conf.d) file sets RV(reexec_needed) (C(systemctl
    daemon-reexec), which makes PID 1 read it; no unit is restarted). They are recorded in the
    manifest like every other file, and removed (C(.d) directories left empty too) when the plan
    no longer has a C(partition).
  - Every value is written so that systemd reads back exactly it, or the module fails naming the
    field and the fix. C(ExecStart=) words and C(Environment=) assignments are double-quoted with
    backslashes and C(") escaped and C(%) doubled (C($) too in C(ExecStart=)); unquoted values
    (C(Description=), C(User=), C(Group=), unit and slice names) have C(%) doubled and may not
    start or end with a space (systemd trims it) nor end in a backslash (systemd would join the
    next line, losing its setting).
  - Refused everywhere - control characters (tabs, newlines and NEL U+0085 included), line and
    paragraph separators (U+2028, U+2029) and Unicode noncharacters. The program must be an
    absolute normalised path (no C(.), C(..), C(//) or trailing C(/)) under 4096 bytes with
    components of at most 255, or a plain file name, without quotes, backslashes, C($) or a
    leading prefix character; C(User=)/C(Group=) take letters, digits and C(_ . -) (at most 31
    characters, not starting with a digit, C(.) or C(-)) or a numeric id other than 65535.
  - The files written are recorded in the manifest O(manifest_path) (JSON). A file listed there
    that the plan no longer asks for is removed, and its C(.d) directory when that is left empty;
    other files in O(unit_dir) are never touched.
  - With O(service_manager=systemd), a removed C(numafleet-*.service) is first stopped and
    disabled with C(systemctl disable --now <unit>). Reloading, restarting and starting are left to
    the caller's handlers, through RV(reload_needed), RV(handler_restart), RV(handler_try_restart)
    and RV(handler_start).
  - A unit pinned by a drop-in is only ever try-restarted (C(systemctl try-restart), restarted if
    it is running), so that a vendor service that was stopped stays stopped.
  - A placement whose MIG instance does not exist yet (its plan entry's C(waits_for)) has its
    unit written, with C(CUDA_VISIBLE_DEVICES) empty, but it is never enabled, started or
    restarted (listed in RV(waiting) and RV(would_run); a warning when its file changed). A unit
    that waited in the plan recorded at O(plan_path) and waits no more is enabled and started
    (RV(handler_start)), not restarted, because it never ran.
  - Files are written atomically (a temporary file renamed over the old one), mode C(0644).
options:
  plan:
    description:
      - The plan of one host, the C(numafleet_plan) fact set by M(numafleet.tuning.numa_plan).
      - It is used as it is; a plan that lacks a key or has a value systemd cannot take fails the
        module with a message that names the placement and the key.
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
        wrote. It must be an absolute path.
      - Removing the manifest makes the module forget its files; they are then no longer removed
        when their placement goes.
    type: path
    default: /etc/numafleet/manifest.json
  plan_path:
    description:
      - Path, as on the host (below O(root)), where O(plan) is recorded as JSON (mode 0644,
        written atomically after the units and the manifest), without its C(stability) key.
      - M(numafleet.tuning.numa_facts) (option C(recorded_root)) reads it back, and
        M(numafleet.tuning.numa_plan) starts the next plan from it, so that placements whose
        request did not change keep their resources. It is never removed.
    type: path
    default: /etc/numafleet/plan.json
  header:
    description:
      - Comment block written as the first lines of every file, for example
        C({{ ansible_managed | comment }}). Every line must start with C(#) or C(;).
      - An empty string writes no header.
    type: str
    default: "# Managed by numafleet.tuning"
  hardening:
    description:
      - Whether C(numafleet-*.service) units get the sandboxing settings C(NoNewPrivileges=yes),
        C(ProtectSystem=full), C(ProtectHome=read-only), C(PrivateTmp=yes),
        C(ProtectKernelTunables=yes), C(ProtectKernelModules=yes), C(ProtectControlGroups=yes),
        C(RestrictSUIDSGID=yes), C(LockPersonality=yes) and C(RestrictRealtime=yes).
      - A placement's own C(hardening) in the plan wins over this default. Drop-ins never get them.
    type: bool
    default: true
  preflight:
    description:
      - The preflight of the memory guard (the role C(numafleet.tuning.memory_guard) installs the program)
        in every unit and drop-in, as C(ExecStartPre=).
      - V(enforce) writes C(ExecStartPre=/usr/local/sbin/numafleet-guard preflight --mode enforce <name>),
        so that a failed check (a planned GPU on another NUMA node, CPUs offline, the memory node over
        its act threshold, hugepages short) stops the start.
      - V(warn) writes the same line with C(--mode warn) and the C(-) prefix, so neither a failed
        check nor a missing program stops the service; the result goes to the journal.
      - V(off) writes no line.
      - A change of only this line rewrites the unit file but restarts nothing; it takes effect at the
        unit's next start.
    type: str
    choices: [enforce, warn, "off"]
    default: warn
  service_manager:
    description:
      - V(systemd) stops and disables removed C(numafleet-*.service) units with C(systemctl) and
        fills RV(handler_restart), RV(handler_try_restart) and RV(handler_start).
      - V(none) only writes files and never runs C(systemctl), for render mode; RV(would_run) still
        lists what systemd would have to do.
    type: str
    choices: [systemd, none]
    default: systemd
extends_documentation_fragment:
  - numafleet.tuning.file_safety
  - numafleet.tuning.file_safety.manifest
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: In check mode the files are rendered and compared, nothing is written or run.
  diff_mode:
    support: full
    details: The diff holds one entry per file that is created, changed or removed, the manifest included.
  idempotent:
    support: full
requirements:
  - C(systemctl) on the target when O(service_manager=systemd) and a unit has to be removed.
notes:
  - Changes of C(AllowedCPUs=) and the other pinning settings take effect when systemd has reloaded
    its configuration and the service has been restarted; the module does neither (see RV(would_run)).
  - With O(root) other than C(/), use O(service_manager=none); C(systemctl) acts on the running host.
seealso:
  - module: numafleet.tuning.numa_plan
  - module: numafleet.tuning.numa_facts
  - module: numafleet.tuning.gpu_topology_facts
"""

EXAMPLES = r"""
- name: Write the pinned units of this host's plan
  numafleet.tuning.pinned_units:
    plan: "{{ numafleet_plan }}"
    header: "{{ ansible_managed | comment }}"
  register: pinned

- name: Reload systemd and restart the services whose pinning changed
  ansible.builtin.systemd_service:
    name: "{{ item }}"
    state: restarted
    daemon_reload: true
  loop: "{{ pinned.handler_restart }}"

- name: Restart the pinned vendor services, only those that are running
  ansible.builtin.command:
    argv: [systemctl, try-restart, "{{ item }}"]
  changed_when: true
  loop: "{{ pinned.handler_try_restart }}"

- name: Render the files into a scratch directory instead of the host
  numafleet.tuning.pinned_units:
    plan: "{{ numafleet_plan }}"
    root: /tmp/render/{{ inventory_hostname }}
    service_manager: none
  register: rendered

- name: Show what systemd would have to do
  ansible.builtin.debug:
    var: rendered.would_run
"""

RETURN = r"""
files:
  description:
    - Every file the module manages, as on the host (below O(root)), sorted by path, then the
      manifest and the recorded plan (O(plan_path)), with what happened to it (or would happen,
      in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path of the file as on the host.
      returned: always
      type: str
      sample: /etc/systemd/system/numafleet-llm-70b.service
    state:
      description: V(create), V(update), V(remove) or V(unchanged).
      returned: always
      type: str
      sample: create
  sample:
    - path: /etc/systemd/system/numafleet-llm-70b.service
      state: create
    - path: /etc/numafleet/manifest.json
      state: create
    - path: /etc/numafleet/plan.json
      state: create
units:
  description:
    - Services whose C(numafleet-*.service) file or C(50-numafleet.conf) drop-in is new, changed,
      removed or unchanged.
    - A removed C(numafleet-*.service) is stopped and disabled; a unit whose drop-in is new,
      changed or removed keeps its own enablement and is listed in RV(handler_try_restart).
  returned: always
  type: dict
  contains:
    new:
      description: Units whose file or drop-in is created.
      returned: always
      type: list
      elements: str
      sample: [numafleet-llm-70b.service]
    changed:
      description: Units whose file or drop-in is rewritten.
      returned: always
      type: list
      elements: str
      sample: [vllm.service]
    removed:
      description: Units whose file or drop-in is removed.
      returned: always
      type: list
      elements: str
      sample: []
    unchanged:
      description: Units whose file or drop-in is already as planned.
      returned: always
      type: list
      elements: str
      sample: []
slices:
  description: Tenant slices (C(numafleet-<tenant>.slice)), and the housekeeping partition's
    C(system.slice), C(user.slice) and C(init.scope) drop-ins, by state, as in RV(units).
  returned: always
  type: dict
  contains:
    new:
      description: Slices whose file is created.
      returned: always
      type: list
      elements: str
      sample: ['numafleet-team\x2da.slice']
    changed:
      description: Slices whose file is rewritten.
      returned: always
      type: list
      elements: str
      sample: []
    removed:
      description: Slices whose file is removed.
      returned: always
      type: list
      elements: str
      sample: []
    unchanged:
      description: Slices whose file is already as planned.
      returned: always
      type: list
      elements: str
      sample: []
reload_needed:
  description: Whether a unit, drop-in or slice file was (or would be) created, changed or removed,
    so that systemd has to reload its configuration.
  returned: always
  type: bool
  sample: true
reexec_needed:
  description: Whether the housekeeping partition's C(system.conf.d/50-numafleet.conf) was (or
    would be) created, changed or removed, so that systemd has to re-execute
    (C(systemctl daemon-reexec), after the reload) to apply C(CPUAffinity=) to PID 1.
  returned: always
  type: bool
  sample: false
rewritten:
  description:
    - Units (and units pinned by a drop-in) whose file changed only in the memory guard's
      preflight line (C(ExecStartPre=), O(preflight)). They are written and never restarted;
      the line takes effect at the unit's next start.
  returned: always
  type: list
  elements: str
  sample: [numafleet-llm.service]
pid1_affinity_reset:
  description: When that file is removed, the argv run right after the re-exec to give PID 1 the
    plan's allowed CPUs back (systemd leaves PID 1's affinity as it is when C(CPUAffinity=) is
    unset); empty otherwise.
  returned: always
  type: list
  elements: str
  sample: [taskset, -a, -p, -c, 0-63, "1"]
would_run:
  description:
    - The C(systemctl) commands that bring the running services in line with the files, in order
      (C(disable --now) removed services, C(daemon-reload), C(restart) changed ones, C(try-restart)
      units whose drop-in is new, changed or removed, C(enable --now) new ones), whatever
      O(service_manager) and check mode.
    - "Then one line per unit waiting for its MIG instance, which is no command -
      V(<unit>: not started, waits for MIG instance <instance>: <reason>; enabled and started once it exists)."
  returned: always
  type: list
  elements: str
  sample: [systemctl daemon-reload, systemctl enable --now numafleet-llm-70b.service]
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
  description: The commands the module ran (only C(systemctl disable --now) of removed services).
  returned: always
  type: list
  elements: str
  sample: [systemctl disable --now numafleet-old.service]
handler_restart:
  description:
    - C(numafleet-*.service) units to restart after a C(daemon-reload), for the caller's handlers.
    - Empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: [numafleet-llm-70b.service]
handler_try_restart:
  description:
    - Units pinned by a drop-in that is new, changed or removed, to restart after a
      C(daemon-reload) only if they are running (C(systemctl try-restart)); a stopped unit stays
      stopped.
    - Empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: [vllm.service]
handler_start:
  description:
    - New C(numafleet-*.service) units to enable and start after a C(daemon-reload).
    - Empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: [numafleet-llm-70b.service]
waiting:
  description:
    - The units whose MIG instance does not exist yet (the plan's C(waits_for)) - written, not
      enabled, started or restarted.
  returned: always
  type: list
  elements: dict
  contains:
    unit:
      description: The unit.
      type: str
      sample: numafleet-classify.service
    mig_instance:
      description: The instance it waits for.
      type: str
      sample: 1g.10gb at slice 2 of GPU 0000:17:00.0
    gpu:
      description: The PCI address of the GPU.
      type: str
      sample: "0000:17:00.0"
    profile:
      description: The MIG profile of the instance.
      type: str
      sample: 1g.10gb
    start:
      description: The slice the instance starts at.
      type: int
      sample: 2
    reason:
      description: Why it does not exist yet (V(created in this run), V(created in this run once MIG mode is on) or V(mode change pending a reset)).
      type: str
      sample: created in this run
effective:
  description:
    - Per planned unit (services, units pinned by a drop-in, tenant slices, sorted by unit), what
      systemd will use - every unit file and C(*.conf) drop-in it reads for the unit (the load
      path of systemd.unit(5) from C(/etc/systemd/system.control) to C(/usr/lib/systemd/system),
      prefix drop-ins such as C(numafleet-.service.d/), type drop-ins C(service.d/) and
      C(slice.d/), C(systemctl set-property) files), merged as systemd merges them, with
      numafleet's own files as this run leaves them (also in check mode). A drop-in, drop-in
      directory or environment file that is a link is followed below O(root) (an absolute
      target is taken below it); a target outside O(root) or a loop is not read (see
      C(unread)).
    - C(EnvironmentFile=) files (C(-) before the path - a missing file is ignored; an empty
      assignment resets the list) are read and override C(Environment=); C(UnsetEnvironment=)
      then removes a variable or an exact C(VAR=VALUE).
    - Values and paths are shown with control characters and bytes that are not UTF-8 escaped
      (C(\x00), C(\xff)).
    - Computed in every mode. On the host itself (O(root=/), O(service_manager=systemd)) one
      read-only C(systemctl show) of every unit adds C(live).
  returned: always
  type: list
  elements: dict
  contains:
    unit:
      description: The unit.
      returned: always
      type: str
      sample: numafleet-embed.service
    fragment:
      description: The unit file systemd loads, or null.
      returned: always
      type: str
      sample: /etc/systemd/system/numafleet-embed.service
    dropins:
      description: The drop-ins applied, in systemd's order (lexicographic by file name).
      returned: always
      type: list
      elements: str
      sample: [/etc/systemd/system/numafleet-embed.service.d/override.conf]
    masked:
      description: The file (a link to /dev/null or an empty file) that masks the unit, or null.
      returned: always
      type: str
    masked_dropins:
      description: Drop-ins hidden by a drop-in of the same name in a higher-priority directory.
      returned: always
      type: list
      elements: str
    unread:
      description:
        - Files or directories systemd reads that could not be read (a link out of O(root) or in
          a loop, a FIFO, a missing C(EnvironmentFile=) without C(-), an error), with C(path),
          C(reason), C(via) (the drop-in naming an environment file) and C(ignored) (true for a
          dangling drop-in link, which systemd ignores). Each one not C(ignored) is also in
          RV(foreign_overrides) with property V((unreadable)).
      returned: always
      type: list
      elements: dict
    links:
      description: Drop-in or unit file links followed -> the path read below O(root).
      returned: always
      type: dict
    properties:
      description:
        - Every setting numafleet's files assign in C([Unit]) and the type section (C([Service]),
          C([Slice])) - C(CPUAffinity), C(NUMAPolicy), C(NUMAMask), C(AllowedCPUs),
          C(AllowedMemoryNodes), C(Slice), C(MemoryMax) of a tenant slice, C(ExecStart), C(User),
          C(LimitMEMLOCK), the resource limits (C(MemoryMax), C(MemoryHigh), C(CPUWeight),
          C(IOWeight), C(TasksMax)), the hardening settings, C(Description), C(After)/C(Requires), and
          C(Environment.NAME) per variable the plan sets - -> C(planned), C(effective), C(source)
          (the file that set the effective value), C(ok) and C(detail) (how that file sets it -
          C(EnvironmentFile=PATH), C(UnsetEnvironment=VAR), C(link to PATH)).
        - Merged per setting as systemd does - cpulists are merged until an empty assignment
          resets them and normalised as C(0-3,8); Exec lines are a list joined by C( ; );
          dependencies accumulate and are in effect when every planned unit is listed; the rest
          is last-wins (empty resets, null when unset), sizes in bytes (C(4G) = C(4294967296)),
          booleans as C(yes)/C(no). C([Install]) is not compared (only C(systemctl enable)
          reads it).
      returned: always
      type: dict
      sample:
        CPUAffinity: {planned: 2-9, effective: 2-9, source: /etc/systemd/system/numafleet-embed.service, ok: true}
    live:
      description: Property -> the value C(systemctl show) reports (on the host itself only, for loaded units whose files this run does not change).
      type: dict
      returned: on a live systemd host
  sample: []
foreign_overrides:
  description:
    - Planned properties whose effective value differs from the plan, set by a file numafleet
      did not write (a C(systemctl edit) C(override.conf), a runtime drop-in in
      C(/run/systemd/system), a C(systemctl set-property) file, a vendor drop-in), or reported
      differently by C(systemctl show) (C(source) V(systemctl show), C(dropins) the drop-ins
      systemd reported that numafleet did not write); V(LoadState) when the unit is masked.
      C(source) is the file that sets the value (for an C(EnvironmentFile=) or
      C(UnsetEnvironment=), the drop-in that names it), C(detail) how it sets it (the
      environment file, the link's target).
    - Property V((unreadable)) (C(planned) and C(effective) null) - a file systemd reads for the
      unit that numafleet cannot read (C(source) the file, C(detail) why), so the planned
      settings may not be in effect.
    - numafleet never removes them (it removes only what it wrote). In check mode the drift check
      counts them as drift of the C(pinned_services) layer; M(numafleet.tuning.host_apply) warns
      about each, in check mode too.
  returned: always
  type: list
  elements: dict
  sample:
    - unit: numafleet-embed.service
      property: NUMAPolicy
      planned: bind
      effective: default
      source: /etc/systemd/system/numafleet-embed.service.d/override.conf
    - unit: numafleet-rerank-a.service
      property: Environment.CUDA_VISIBLE_DEVICES
      planned: MIG-5f1c0e9a-1b2c-5d3e-8f4a-0b1c2d3e4f5a
      effective: "0"
      source: /etc/systemd/system/numafleet-rerank-a.service.d/env.conf
      detail: EnvironmentFile=/etc/default/rerank
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers


def main() -> None:
    module = AnsibleModule(argument_spec=layers.SPECS["units"], supports_check_mode=True)
    layers.run_module(module, "units")


if __name__ == "__main__":
    main()
