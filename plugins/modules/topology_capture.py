#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: topology_capture
short_description: Record the sysfs/procfs files the topology readers use, as a tarball
version_added: 0.1.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Runs the same readers as M(numafleet.tuning.numa_facts) and M(numafleet.tuning.gpu_topology_facts)
    against O(sysfs_root) and O(procfs_root), and writes exactly the files, directories and symlinks
    they read into a gzip tarball at O(dest) on the target, under a top-level directory O(name).
  - The tarball unpacks to C(<name>/sys/...) and C(<name>/proc/...), the layout that O(sysfs_root)
    and O(procfs_root) of the facts modules accept, so a recorded host can be planned and rendered
    like a live one. PCI C(bus/pci/devices/*) entries stay relative symlinks, as the kernel writes them.
  - File contents are read (sysfs sizes are not real); write-only or unreadable files are skipped.
options:
  dest:
    description:
      - Path of the tarball to write on the target. Its directory must exist.
    type: path
    required: true
  name:
    description:
      - Name of the top-level directory inside the tarball, usually the host name.
      - Letters, digits, V(.), V(_) and V(-) only; no V(/) and no V(..).
    type: str
    required: true
  gpu_snapshot:
    description:
      - Path, on the target, of a GPU snapshot written by M(numafleet.tuning.gpu_topology_facts)
        O(numafleet.tuning.gpu_topology_facts#module:snapshot_out). It is stored as
        C(<name>/gpu-snapshot.json).
    type: path
extends_documentation_fragment:
  - numafleet.tuning.roots
  - numafleet.tuning._attributes
attributes:
  check_mode:
    support: full
    details: In check mode the files are read and counted, and nothing is written.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every run records the host anew and rewrites O(dest).
seealso:
  - module: numafleet.tuning.numa_facts
  - module: numafleet.tuning.gpu_topology_facts
"""

EXAMPLES = r"""
- name: Record this host's topology
  numafleet.tuning.topology_capture:
    dest: /tmp/topology.tar.gz
    name: "{{ inventory_hostname }}"
  register: capture

- name: Bring the recording to the controller
  ansible.builtin.fetch:
    src: "{{ capture.archive }}"
    dest: "captures/{{ inventory_hostname }}.tar.gz"
    flat: true
"""

RETURN = r"""
archive:
  description: Path of the tarball on the target (O(dest)).
  returned: always
  type: str
  sample: /tmp/topology.tar.gz
entries:
  description: Files, directories and symlinks recorded (or that would be recorded in check mode).
  returned: always
  type: int
  sample: 129
files:
  description: Regular files stored in the tarball (0 in check mode).
  returned: always
  type: int
  sample: 101
warnings_count:
  description: Number of files the readers could not use (see the facts modules' C(warnings)).
  returned: always
  type: int
  sample: 0
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.capture import (
    check_capture_name,
    plan_capture,
    write_capture,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            name=dict(type="str", required=True),
            gpu_snapshot=dict(type="path"),
            sysfs_root=dict(type="path", default="/sys"),
            procfs_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    reader = Reader(params["sysfs_root"], params["procfs_root"])
    try:
        check_capture_name(params["name"])
        facts = read_numa_facts(reader)
        gpu.read_gpus(reader, {node["id"]: node["cpus"] for node in facts["nodes"]})
        entries = plan_capture(reader)
        if params["gpu_snapshot"]:
            if not os.path.isfile(params["gpu_snapshot"]):
                module.fail_json(
                    msg=f"gpu_snapshot {params['gpu_snapshot']} is not a file on the host: "
                    "write it first with numafleet.tuning.gpu_topology_facts snapshot_out"
                )
            entries.append(("file", "gpu-snapshot.json", params["gpu_snapshot"]))
        files = 0
        if not module.check_mode:
            files = write_capture(entries, params["dest"], params["name"])
    except NumaTuneError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=True,
        archive=params["dest"],
        entries=len(entries),
        files=files,
        warnings_count=len(reader.warnings),
    )


if __name__ == "__main__":
    main()
