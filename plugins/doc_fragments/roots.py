# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """The sysfs_root / procfs_root options of every module that reads the host's topology."""

    DOCUMENTATION = r"""
options:
  sysfs_root:
    description:
      - Where the host's sysfs is mounted.
      - Set it when running in a container that mounts the host's C(/sys) elsewhere, or to read a
        recorded tree (see C(playbooks/capture_topology.yml)).
      - It must hold C(devices/system/cpu), as every sysfs does; otherwise the module fails and
        says so, rather than reading a mistyped path as a machine without CPUs.
    type: path
    default: /sys
  procfs_root:
    description:
      - Where the host's procfs is mounted, as for O(sysfs_root). It must be a directory.
    type: path
    default: /proc
"""
