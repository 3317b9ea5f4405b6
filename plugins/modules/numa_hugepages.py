#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: numa_hugepages
short_description: Set hugepage pools per NUMA node, read them back, and keep them across reboots
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Writes the total of each managed hugepage pool of each NUMA node to
    C(<sysfs_root>/devices/system/node/node<N>/hugepages/hugepages-<size>kB/nr_hugepages) and reads
    it back. It reads C(nr_hugepages), C(free_hugepages) and C(surplus_hugepages) of the same
    directories first, and C(<procfs_root>/sys/kernel/osrelease) when pages are reserved at boot.
  - The managed page sizes are the sizes named in O(pools) plus the sizes the state file of an
    earlier run records as managed, so that a size that leaves O(pools) goes back to 0 pages. For a
    managed size, every node without an entry in O(pools) wants 0 pages.
  - A pool is never shrunk below its pages in use (C(nr_hugepages) - C(free_hugepages)); it is
    set to the pages in use instead and RV(warnings) says so.
  - When the kernel grants a pool other than the total written (a short grant, when the node's
    free memory is too small or too fragmented), every pool written in this run is restored to its
    previous total and the module fails with the requested and granted pages per node; nothing
    changes. The message suggests reserving the pages at boot (O(boot_reserve_sizes_kb)).
  - The totals are kept across reboots below O(root) by C(/etc/numafleet/hugepages.json) (per-node
    totals and managed sizes; the module's state file), a small Python 3 program
    C(/usr/local/libexec/numafleet-hugepages) that applies that file, reads each pool back and
    exits 1 on a short grant, and the oneshot unit C(/etc/systemd/system/numafleet-hugepages.service)
    that runs it early at boot (before C(sysinit.target), so before every service).
  - Sizes in O(boot_reserve_sizes_kb) are reserved on the kernel command line instead, with the
    per-node syntax C(hugepagesz=1G hugepages=0:4,1:4) (Linux 5.16 or newer), and are never
    written at runtime. With O(bootloader=grub_d) the arguments go to
    C(/etc/default/grub.d/60-numafleet-hugepages.cfg); with O(bootloader=grubby) they are returned
    as RV(grubby_argvs) for the caller to run; with O(bootloader=none) they are only returned in
    RV(kernel_args). RV(reboot_required) is true when the command line changed.
  - Each entry of O(mounts) is a hugetlbfs mount of one page size, made by a systemd mount unit
    C(/etc/systemd/system/<systemd-escape --path PATH>.mount) below O(root) (for example
    C(dev-hugepages1G.mount) for C(/dev/hugepages1G)), mounted before C(sysinit.target). Mount units
    an earlier run wrote (recorded in the state file) that are no longer in O(mounts) are removed.
  - The module runs no command. Reloading systemd, enabling the unit, starting, restarting and
    stopping the mount units, C(update-grub), C(grubby) and rebooting are the caller's, see
    RV(would_run) and the role C(numafleet.tuning.hugepages).
options:
  pools:
    description:
      - Desired pool totals, one entry per node and page size. Entries for the same node and size
        add up, so the pages of several placements can be listed one by one.
      - An empty list releases the sizes an earlier run managed (back to 0 pages, or to the pages
        in use).
    type: list
    elements: dict
    required: true
    suboptions:
      node:
        description: NUMA node id, as in C(/sys/devices/system/node/node<N>).
        type: int
        required: true
      size_kb:
        description: Page size in kB, V(2048) for 2 MiB or V(1048576) for 1 GiB pages.
        type: int
        required: true
      count:
        description: Pages wanted in this node's pool, in total (not added to what is there).
        type: int
        required: true
  root:
    description:
      - Directory that stands for C(/) of the host; the state file, the boot program, the unit and
        the GRUB drop-in are read and written below it.
      - Set it to a scratch directory to render the files without touching the host's C(/etc)
        (render mode), together with O(service_manager=none). The pools are still written to
        O(sysfs_root).
    type: path
    default: /
  service_manager:
    description:
      - V(systemd) on a host whose unit the caller reloads and enables; V(none) in render mode.
      - The module runs no command either way; RV(would_run) lists what the caller has to run.
    type: str
    choices: [systemd, none]
    default: systemd
  boot_reserve_sizes_kb:
    description:
      - Page sizes (kB) reserved on the kernel command line instead of at runtime, for example
        V([1048576]) for 1 GiB pages, which a running host can rarely find contiguous memory for.
      - Needs Linux 5.16 or newer (per-node C(hugepages=<node>:<count>)); older kernels fail with
        a message.
    type: list
    elements: int
    default: []
  bootloader:
    description:
      - How the kernel command line of O(boot_reserve_sizes_kb) is made permanent.
      - V(grub_d) writes C(/etc/default/grub.d/60-numafleet-hugepages.cfg) (Debian, Ubuntu; run
        C(update-grub) afterwards). V(grubby) returns RV(grubby_argvs) (RHEL). V(none) only returns
        RV(kernel_args).
      - V(auto) picks V(grubby) when C(grubby) exists below O(root), else V(grub_d) when
        C(/etc/default/grub) or C(update-grub) does, and fails otherwise. It is only consulted when
        there are kernel arguments to add or remove.
    type: str
    choices: [auto, grub_d, grubby, none]
    default: auto
  kernel_args:
    description:
      - More kernel command line arguments written with those of O(boot_reserve_sizes_kb), after
        them, through the same O(bootloader) file or C(grubby) call, for example the kernel CPU
        isolation of the host variable C(numafleet_kernel_isolation)
        (V([nohz_full=2-7, rcu_nocbs=2-7, irqaffinity=0-1])).
      - Each entry is one argument (C(name) or C(name=value)) without spaces or quotes. An empty
        list removes the ones an earlier run wrote, and only those.
    type: list
    elements: str
    default: []
  mounts:
    description:
      - hugetlbfs mounts, one per mount point, each of one page size, so that the pages of a
        placement can be mapped through files.
      - Every entry is checked before anything is written. An empty list removes the mount units an
        earlier run wrote.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description:
          - The mount point, an absolute path other than C(/) without control characters or C(.)
            and C(..) components, for example C(/dev/hugepages1G). Each path may appear once.
        type: str
        required: true
      size_kb:
        description:
          - Page size of the mount in kB, one the kernel offers (a C(hugepages-<size>kB) pool under
            C(<sysfs_root>/devices/system/node/node<N>/hugepages)), V(2048) or V(1048576) on x86_64.
        type: int
        required: true
      mode:
        description: Mode of the mount's root directory, an octal string of 3 or 4 digits.
        type: str
        default: "1770"
      group:
        description:
          - Group (name or numeric gid) owning the mount's root directory (C(gid=)); the owner's
            group of the mount point when left out.
        type: str
extends_documentation_fragment:
  - numafleet.tuning.file_safety
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: In check mode the pools and files are read and the change computed; nothing is written.
  diff_mode:
    support: full
    details:
      - The diff holds the per-node totals that change (C(node1 2048kB), before and after), then
        one entry per file that is created, changed or removed.
  idempotent:
    support: full
requirements:
  - Root on the target (sysfs pool files are writable by root only).
  - C(/usr/bin/python3) on the target for the boot program.
notes:
  - A pool kept above its desired total because its pages are in use is shrunk by the next run
    after the services holding them stopped. At boot the program writes the desired totals.
  - The boot program writes the totals at every boot; pools of a managed size set by other means
    (C(vm.nr_hugepages), C(hugepages=) without a node) are overridden per node.
  - With O(bootloader=grubby), only one page size can be reserved at boot (grubby keeps one value
    per argument name).
  - RV(reboot_required) is true in the run that changes the command line, and in every later run
    while C(<procfs_root>/cmdline) lacks one of RV(kernel_args) (the host has not rebooted since;
    RV(reboot_pending)). Without that file (a recording) only the run that changes it says so.
  - A mount unit file at the path of a wanted mount that an earlier run did not write and that lacks
    the numafleet header is never overwritten; the module fails instead.
  - A changed mount unit is restarted (unmounted and mounted again), which fails while a process has
    files of the mount open or mapped.
seealso:
  - module: numafleet.tuning.numa_facts
  - module: numafleet.tuning.numa_plan
"""

EXAMPLES = r"""
- name: Reserve 2 MiB pages on both nodes of a host
  numafleet.tuning.numa_hugepages:
    pools:
      - {node: 0, size_kb: 2048, count: 512}
      - {node: 1, size_kb: 2048, count: 8192}
  register: hugepages

- name: Show the pools that were kept because their pages are in use
  ansible.builtin.debug:
    var: hugepages.warnings

- name: Reserve 1 GiB pages at boot through GRUB, and 2 MiB pages at runtime
  numafleet.tuning.numa_hugepages:
    pools:
      - {node: 0, size_kb: 1048576, count: 4}
      - {node: 1, size_kb: 1048576, count: 4}
      - {node: 1, size_kb: 2048, count: 1024}
    boot_reserve_sizes_kb: [1048576]
    bootloader: grub_d
  register: hugepages_boot

- name: Mount 1 GiB pages at /dev/hugepages1G for the members of group llm
  numafleet.tuning.numa_hugepages:
    pools:
      - {node: 1, size_kb: 1048576, count: 16}
    mounts:
      - {path: /dev/hugepages1G, size_kb: 1048576, mode: "1770", group: llm}
  register: hugepages_mounts

- name: Render the persistence files of a recorded host into a scratch directory
  numafleet.tuning.numa_hugepages:
    pools: "{{ numafleet_plan.placements | map(attribute='hugepages') | select | list }}"
    sysfs_root: /srv/captures/gpu-01/sys
    procfs_root: /srv/captures/gpu-01/proc
    root: /srv/render/gpu-01
    service_manager: none
"""

RETURN = r"""
drift:
  description:
    - Every managed pool whose C(nr_hugepages) differs from its planned total before the run;
      C(setting) is C(node<N> <size>kB pages), values are pages. C(reason) says why a run does
      not fix it (pages in use hold the pool, or the size is reserved at boot and takes the
      total at the next reboot), empty when this run writes it.
    - Each entry is C(setting), C(planned), C(actual), C(reason) and C(pending) (true only for a
      difference the run cannot make in this mode; it is neither drift nor a failed check).
  returned: always
  type: list
  elements: dict
  sample:
    - setting: node0 2048kB pages
      planned: 4096
      actual: 8192
      reason: >-
        8192 pages in use (nr_hugepages - free_hugepages): a shrink stops at 8192; stop the
        services holding them, then run again
      pending: false
pools:
  description:
    - Every managed pool of every node that has one, sorted by node and size, before and after
      this run (or as it would be, in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    node:
      description: NUMA node id.
      returned: always
      type: int
      sample: 1
    size_kb:
      description: Page size in kB.
      returned: always
      type: int
      sample: 2048
    before:
      description: Pages in the pool (C(nr_hugepages)) before the run.
      returned: always
      type: int
      sample: 48
    after:
      description:
        - Pages in the pool after the run, max(RV(pools[].desired), RV(pools[].in_use)).
        - For a size reserved at boot, the pages the next boot reserves.
      returned: always
      type: int
      sample: 32
    desired:
      description: Pages asked for (0 for a node without an entry in O(pools)).
      returned: always
      type: int
      sample: 8
    in_use:
      description: Pages in use before the run, C(nr_hugepages) - C(free_hugepages).
      returned: always
      type: int
      sample: 32
    boot:
      description: Whether the size is reserved on the kernel command line (not written at runtime).
      returned: always
      type: bool
      sample: false
warnings:
  description: One line per pool kept above its desired total because its pages are in use.
  returned: always
  type: list
  elements: str
  sample:
    - "node 1, 2048 kB pages: 32 in use, 8 desired; the pool is kept at 32 instead of shrinking
      below the pages in use: stop the services holding them, then run again"
files:
  description: The persistence files, as on the host (below O(root)), with what happened to each.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path of the file as on the host.
      returned: always
      type: str
      sample: /etc/numafleet/hugepages.json
    state:
      description: V(create), V(update), V(remove) or V(unchanged).
      returned: always
      type: str
      sample: create
reload_needed:
  description: Whether the unit file was (or would be) created or changed, so that systemd must
    reload and the unit be enabled.
  returned: always
  type: bool
  sample: true
reboot_required:
  description:
    - Whether a reboot is owed for the kernel command line, RV(cmdline_changed) or
      RV(reboot_pending).
  returned: always
  type: bool
  sample: false
cmdline_changed:
  description: Whether this run changes the kernel command line (file or C(grubby) arguments).
  returned: always
  type: bool
  sample: false
reboot_pending:
  description:
    - Whether RV(kernel_args) are not all on the running kernel's command line
      (C(<procfs_root>/cmdline)), so the host has not rebooted since they were written. False when
      that file is absent.
  returned: always
  type: bool
  sample: false
kernel_args_missing:
  description: The entries of RV(kernel_args) that C(<procfs_root>/cmdline) lacks ([] when it is absent).
  returned: always
  type: list
  elements: str
  sample: [nohz_full=2-7]
cpu_isolation:
  description:
    - What the running kernel isolates, for verify's C(kernel_isolation) check.
  returned: when O(kernel_args) is not empty
  type: dict
  contains:
    isolated:
      description: CPUs of C(<sysfs_root>/devices/system/cpu/isolated), V(null) when absent.
      type: list
      elements: int
    nohz_full:
      description: CPUs of C(<sysfs_root>/devices/system/cpu/nohz_full), V(null) when absent.
      type: list
      elements: int
    cmdline_known:
      description: Whether C(<procfs_root>/cmdline) exists.
      type: bool
  sample: {isolated: [], nohz_full: [2, 3, 4, 5, 6, 7], cmdline_known: true}
kernel_args:
  description:
    - The kernel command line arguments that reserve the boot-reserved sizes per node, then
      O(kernel_args).
  returned: always
  type: list
  elements: str
  sample: [hugepagesz=1G, "hugepages=0:4,1:4"]
kernel_args_removed:
  description: The arguments of the previous run, to remove from the command line when it changed.
  returned: always
  type: list
  elements: str
  sample: []
bootloader:
  description: The bootloader handling used (V(grub_d), V(grubby) or V(none)), O(bootloader) resolved.
  returned: always
  type: str
  sample: grub_d
grubby_argvs:
  description: The C(grubby) commands (argv lists) that make the command line change permanent.
  returned: always
  type: list
  elements: list
  sample: [[grubby, --update-kernel=ALL, "--args=hugepagesz=1G hugepages=0:4,1:4"]]
handler_enable:
  description:
    - Whether the caller has to reload systemd and enable C(numafleet-hugepages.service) now, that
      is RV(reload_needed) outside check mode and with O(service_manager=systemd).
  returned: always
  type: bool
  sample: true
would_run:
  description:
    - The commands the caller has to run after this change, in order (C(systemctl daemon-reload),
      C(systemctl enable numafleet-hugepages.service), C(systemctl disable --now), C(restart) or
      C(enable --now) of mount units, C(update-grub) or C(grubby)), whatever
      O(service_manager) and check mode. The module itself runs none of them.
  returned: always
  type: list
  elements: str
  sample: [systemctl daemon-reload, systemctl enable numafleet-hugepages.service]
mounts:
  description: The hugetlbfs mounts of O(mounts), sorted by path, with their mount units.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The mount point, slashes simplified.
      returned: always
      type: str
      sample: /dev/hugepages1G
    unit:
      description: The mount unit's name (C(systemd-escape --path)).
      returned: always
      type: str
      sample: dev-hugepages1G.mount
    size_kb:
      description: Page size of the mount in kB.
      returned: always
      type: int
      sample: 1048576
    mode:
      description: Mode of the mount's root directory.
      returned: always
      type: str
      sample: "1770"
    group:
      description: Group of the mount's root directory, null when not set.
      returned: always
      type: str
      sample: llm
    state:
      description: What happened to the unit file, V(create), V(update) or V(unchanged).
      returned: always
      type: str
      sample: create
handler_mount_start:
  description:
    - Mount units created in this run, for the caller to C(systemctl enable --now) after
      C(systemctl daemon-reload); empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: [dev-hugepages1G.mount]
handler_mount_restart:
  description:
    - Mount units changed in this run, for the caller to C(systemctl restart) after
      C(systemctl daemon-reload); empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: []
handler_mount_stop:
  description:
    - Mount units removed in this run, for the caller to C(systemctl disable --now) before
      C(systemctl daemon-reload); empty in check mode and with O(service_manager=none).
  returned: always
  type: list
  elements: str
  sample: ["mnt-huge\\x2d2m.mount"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers


def main() -> None:
    module = AnsibleModule(argument_spec=layers.SPECS["hugepages"], supports_check_mode=True)
    layers.run_module(module, "hugepages")


if __name__ == "__main__":
    main()
