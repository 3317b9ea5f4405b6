#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: numa_kernel
short_description: Set the kernel's NUMA behaviour, numad, irqbalance's banned CPUs and IRQ affinity
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Writes C(<procfs_root>/sys/kernel/numa_balancing) (O(numa_balancing)),
    C(<procfs_root>/sys/vm/zone_reclaim_mode) (O(zone_reclaim_mode)),
    C(<sysfs_root>/kernel/mm/transparent_hugepage/enabled) (O(thp_enabled)),
    C(<sysfs_root>/kernel/mm/transparent_hugepage/defrag) (O(thp_defrag)) and
    C(<procfs_root>/irq/<N>/smp_affinity_list) (O(irq_affinity)), and reads every value back.
  - Persists the first two in C(/etc/sysctl.d/60-numafleet-numa.conf) and the THP modes as
    C(w) lines in C(/etc/tmpfiles.d/numafleet-thp.conf), both below O(root). A setting left null
    keeps the line these files already have for it (nothing is removed); other lines of these
    two files are overwritten.
  - With O(numad=masked), when C(numad.service) is installed (C(/etc/systemd/system),
    C(/usr/lib/systemd/system) or C(/lib/systemd/system) below O(root)), runs
    C(systemctl disable --now numad.service) and C(systemctl mask numad.service); a masked numad
    that still runs is stopped (C(systemctl stop numad.service)).
  - With O(irqbalance_banned_cpus), sets the line C(IRQBALANCE_BANNED_CPULIST=<cpulist>) of
    C(/etc/default/irqbalance), or of C(/etc/sysconfig/irqbalance) when only that one exists
    (below O(root)), keeping every other line; when the file changed and irqbalance runs
    (C(systemctl is-active irqbalance.service)), runs C(systemctl try-restart irqbalance.service).
    The deprecated C(IRQBALANCE_BANNED_CPUS) is never written.
  - With O(irq_affinity), pins IRQs to CPUs; an entry with an C(address) pins every MSI/MSI-X IRQ
    the device lists in C(<sysfs_root>/bus/pci/devices/<address>/msi_irqs/). IRQ affinity is not
    persisted (IRQ numbers change between boots).
  - Every option is checked before anything is written; a value that cannot work fails the task
    with a message naming the option and the fix, and nothing is written.
  - A knob whose kernel file is absent (a kernel built without the feature) behaves as off
    (V(0) for O(numa_balancing) and O(zone_reclaim_mode), V(never) for the THP modes). Asking for
    that value is a warning; asking for anything else fails, because the kernel cannot give it.
  - Warnings (absent knobs, devices without MSI IRQs, IRQs whose affinity the kernel manages,
    irqbalance running while IRQs are pinned) come back as the task's C(warnings).
options:
  numa_balancing:
    description:
      - Automatic NUMA balancing (C(kernel.numa_balancing)), V(0) (off) or V(1) (on). Off stops the
        kernel from scanning processes' memory and migrating it toward the CPUs that use it.
      - Null leaves it alone. Other values fail the task.
    type: int
  zone_reclaim_mode:
    description:
      - C(vm.zone_reclaim_mode), a bitmask from V(0) to V(7) (1 reclaim, 2 write dirty pages,
        4 swap) of what the kernel does before allocating on another node. V(0) is off.
      - Null leaves it alone. Other values fail the task.
    type: int
  thp_enabled:
    description:
      - Transparent hugepage mode (C(/sys/kernel/mm/transparent_hugepage/enabled)), V(always),
        V(madvise) or V(never), and one the kernel offers in that file.
      - Null leaves it alone. Other values fail the task.
    type: str
  thp_defrag:
    description:
      - Transparent hugepage defrag mode (C(/sys/kernel/mm/transparent_hugepage/defrag)),
        V(always), V(defer), V(defer+madvise), V(madvise) or V(never), and one the kernel offers in
        that file.
      - Null leaves it alone. Other values fail the task.
    type: str
  numad:
    description:
      - V(masked) stops, disables and masks C(numad.service) when it is installed; V(leave) (or
        null) does not look at it. Other values fail the task.
    type: str
    default: leave
  irqbalance_banned_cpus:
    description:
      - CPUs irqbalance must not put interrupts on, as a cpulist (C(0-1,64-65)); it must not be
        empty, name CPUs the host lacks, or ban every online CPU.
      - This list replaces irqbalance's own ban of isolated (C(isolcpus)) and C(nohz_full) CPUs,
        so include them.
      - Null leaves the irqbalance file alone.
    type: str
  irq_affinity:
    description:
      - IRQs to pin. Each entry has either O(irq_affinity[].irq) or O(irq_affinity[].address), and
        O(irq_affinity[].cpus). An empty list pins nothing.
      - An IRQ named twice must get the same CPUs.
    type: list
    elements: dict
    default: []
    suboptions:
      irq:
        description:
          - An IRQ number; C(<procfs_root>/irq/<irq>/smp_affinity_list) must exist.
        type: int
      address:
        description:
          - A PCI address as C(lspci -D) prints it (C(0000:17:00.0)); every IRQ listed in its
            C(msi_irqs/) is pinned. A device without MSI IRQs is a warning.
        type: str
      cpus:
        description:
          - The CPUs, as a cpulist (C(8-15)); every one must be online.
        type: str
        required: true
  root:
    description:
      - Directory that stands for C(/) of the host. The sysctl.d, tmpfiles.d and irqbalance files
        and the numad unit are read and written below it.
      - Set it to a scratch directory, with O(service_manager=none), to render the files without
        touching the host's C(/etc) (render mode).
    type: path
    default: /
  service_manager:
    description:
      - V(systemd) runs C(systemctl) (C(is-enabled) and C(is-active) to read the state of
        numad and irqbalance, then C(disable --now), C(mask), C(stop) and C(try-restart)).
      - V(none) never runs C(systemctl), for render mode; RV(would_run) lists what it would run,
        and masking numad writes the link C(/etc/systemd/system/numad.service -> /dev/null) below
        O(root) that C(systemctl mask) would have made, so a second run is unchanged.
    type: str
    choices: [systemd, none]
    default: systemd
extends_documentation_fragment:
  - numafleet.tuning.file_safety
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details:
      - Check mode reads everything (and, with O(service_manager=systemd), asks systemctl
        C(is-enabled)/C(is-active)), writes nothing and runs no other command.
  diff_mode:
    support: full
    details: The diff holds one entry with the settings that change (before and after), then one per file created or changed.
  idempotent:
    support: full
requirements:
  - C(systemctl) on the target when O(service_manager=systemd) and numad or irqbalance has to be
    acted on.
notes:
  - Writing C(/proc/sys), C(/sys/kernel/mm) and C(/proc/irq) needs root; in a container they must
    be mounted writable.
  - irqbalance reads C(IRQBALANCE_BANNED_CPULIST) from version 1.8.0 on. An active
    C(IRQBALANCE_BANNED_CPUS=) line in the same file wins over it, so the module fails and asks
    for that line to go instead of writing a list that would be ignored.
  - A running irqbalance moves pinned IRQs again unless told to leave them alone
    (C(IRQBALANCE_ARGS=--banirq=N)); the module warns when it runs while IRQs are pinned.
  - Writing the affinity of an IRQ the kernel manages (per-queue IRQs of NVMe and some NICs)
    fails with EIO; that IRQ is left as it is, with a warning.
  - With O(root) other than C(/), use O(service_manager=none); C(systemctl) acts on the running
    host.
seealso:
  - module: numafleet.tuning.numa_facts
  - module: numafleet.tuning.numa_plan
  - module: numafleet.tuning.pinned_units
"""

EXAMPLES = r"""
- name: Keep the kernel from migrating bound processes' pages, THP on request only, numad off
  numafleet.tuning.numa_kernel:
    numa_balancing: 0
    zone_reclaim_mode: 0
    thp_enabled: madvise
    thp_defrag: madvise
    numad: masked
    irqbalance_banned_cpus: "0-1,64-65"
  register: kernel

- name: Show what changed
  ansible.builtin.debug:
    msg: "{{ kernel.settings | selectattr('changed') | map(attribute='name') | list }}"

- name: Pin a GPU's MSI IRQs to CPUs of its node
  numafleet.tuning.numa_kernel:
    irq_affinity:
      - address: "0000:17:00.0"
        cpus: "2-31"

- name: Render the files below a scratch directory, against a recorded topology
  numafleet.tuning.numa_kernel:
    numa_balancing: 0
    numad: masked
    sysfs_root: /srv/recordings/host1/sys
    procfs_root: /srv/recordings/host1/proc
    root: /srv/render/host1
    service_manager: none
  register: rendered

- name: Show the commands systemd would run
  ansible.builtin.debug:
    var: rendered.would_run
"""

RETURN = r"""
drift:
  description:
    - Every managed setting whose value as read differs from the option before the run (the
      RV(settings) entries with C(changed)); C(setting) is the setting name, such as
      C(numa_balancing) or C(irq_affinity[42]).
    - Each entry is C(setting), C(planned), C(actual), C(reason) and C(pending) (true only for a
      difference the run cannot make in this mode; it is neither drift nor a failed check).
  returned: always
  type: list
  elements: dict
  sample: [{setting: numa_balancing, planned: 0, actual: 1, reason: "", pending: false}]
settings:
  description:
    - Every setting the options manage, in a fixed order (O(numa_balancing),
      O(zone_reclaim_mode), O(thp_enabled), O(thp_defrag), numad, O(irqbalance_banned_cpus), then
      one C(irq_affinity[N]) per IRQ by number), with its value before and after (or as it would
      be after, in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The option's name, C(numad), or C(irq_affinity[N]) for IRQ N.
      returned: always
      type: str
      sample: numa_balancing
    before:
      description:
        - The value found. Null when the kernel file is absent, or when the irqbalance file has no
          C(IRQBALANCE_BANNED_CPULIST) line.
        - For numad, V(absent), V(present) (render mode), V(masked), V(masked, active), or
          C(systemctl is-enabled) and C(is-active) joined by a comma (V(enabled, active)).
      returned: always
      type: raw
      sample: 1
    after:
      description: The value wanted (null when the kernel file is absent); cpulists normalised (C(0-3,8)).
      returned: always
      type: raw
      sample: 0
    source:
      description: The file the value is read from (the kernel file under the roots, the unit file, or the irqbalance file as on the host).
      returned: always
      type: str
      sample: /proc/sys/kernel/numa_balancing
    file:
      description: The file, as on the host, that persists the value; null when it is not persisted.
      returned: always
      type: str
      sample: /etc/sysctl.d/60-numafleet-numa.conf
    changed:
      description: Whether the value changes.
      returned: always
      type: bool
      sample: true
  sample:
    - name: numa_balancing
      before: 1
      after: 0
      source: /proc/sys/kernel/numa_balancing
      file: /etc/sysctl.d/60-numafleet-numa.conf
      changed: true
files:
  description:
    - The files the options touch, as on the host (below O(root)), with what happened to them (or
      would, in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path of the file as on the host.
      returned: always
      type: str
      sample: /etc/sysctl.d/60-numafleet-numa.conf
    state:
      description: V(create), V(update) or V(unchanged).
      returned: always
      type: str
      sample: create
  sample:
    - path: /etc/sysctl.d/60-numafleet-numa.conf
      state: create
    - path: /etc/tmpfiles.d/numafleet-thp.conf
      state: unchanged
would_run:
  description:
    - The C(systemctl) commands the change needs, in order (numad first, the irqbalance restart
      last), whatever O(service_manager) and check mode.
  returned: always
  type: list
  elements: str
  sample: [systemctl disable --now numad.service, systemctl mask numad.service]
ran:
  description: The commands the module ran (none in check mode or with O(service_manager=none)).
  returned: always
  type: list
  elements: str
  sample: [systemctl try-restart irqbalance.service]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers


def main() -> None:
    module = AnsibleModule(argument_spec=layers.SPECS["kernel"], supports_check_mode=True)
    layers.run_module(module, "kernel")


if __name__ == "__main__":
    main()
