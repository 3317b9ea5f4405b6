#!/usr/bin/python
# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

# Documentation only: host_vars_check is an action plugin (plugins/action/host_vars_check.py) that
# runs on the controller; nothing of it is sent to the managed host.

DOCUMENTATION = r"""
module: host_vars_check
short_description: Check a host's variables against the collection's schema of host variables
version_added: 0.2.0
author: numafleet.tuning contributors (@numafleet)
description:
  - Reads the host's own variables, C(hostvars[inventory_hostname]) (inventory host and group
    variables, extra vars and facts, without the play's vars, vars_files and role defaults), and
    checks them against the collection's one schema of host variables, which
    C(docs/host_variables.md) lists.
  - A C(numafleet_*) variable that is not in the schema (a typo such as C(numafleet_placement)) is
    an error, with the closest known name as a suggestion. Facts of the collection
    (C(numafleet_plan), C(numafleet_state_paths)) and names starting with C(__) are ignored.
  - With O(playbook=site.yml) or O(playbook=drift_check.yml), a role input that the playbook reads
    from a host variable instead (for example C(numa_kernel_thp_enabled), read from
    C(numafleet_thp_enabled)) is an error that names the host variable to set, because the
    playbook would ignore it. Role inputs the playbooks read as they are (for example
    C(pinned_services_hardening)) are left alone.
  - A host variable that a play keyword reads (C(numafleet_serial) for C(serial)), which sees
    extra vars only, is an error when it comes from the inventory rather than from C(-e).
  - Every known host variable that O(playbook) reads and that is set is checked like an argument
    spec (type, choices, list elements, the keys of structured values). Variables that another
    task of the playbook validates with its own messages (C(numafleet_placements) and the other
    inputs of M(numafleet.tuning.numa_plan), the verify thresholds) are left to it.
  - All problems of a host are reported in one message that names the host and each host
    variable, and ends with C(Fix the host variable; nothing was changed.)
  - Runs on the controller only. No module is sent to the host and nothing is read from it or
    changed on it.
options:
  playbook:
    description:
      - The playbook (under C(playbooks/)) the check runs for. It selects the host variables whose
        values are checked (those the playbook reads), and whether role inputs set for the host are
        refused (V(site.yml) and V(drift_check.yml) read their host variables instead).
      - Unknown C(numafleet_*) names are errors for every playbook.
    type: str
    choices: [site.yml, verify.yml, drift_check.yml, facts.yml, capture_topology.yml]
    default: site.yml
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.conn
  - action_common_attributes.flow
  - numafleet.tuning._attributes
  - numafleet.tuning._attributes.controller_action
attributes:
  check_mode:
    support: full
    details: The same check runs in check mode.
  delegation:
    support: none
    details: The check runs on the controller anyway; delegation changes nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
  platform:
    platforms: all
notes:
  - A host variable whose value refers to a variable the host does not have (a play variable, for
    example) cannot be templated here; its value is left to the playbook, which fails where it is
    used if the reference is undefined.
seealso:
  - module: numafleet.tuning.numa_plan
"""

EXAMPLES = r"""
- name: Check the host variables before planning
  numafleet.tuning.host_vars_check:
    playbook: site.yml
  register: host_vars

- name: Show which host variables had their values checked
  ansible.builtin.debug:
    msg: "{{ host_vars.checked | join(', ') }}"

- name: Check the host variables that verify.yml reads
  numafleet.tuning.host_vars_check:
    playbook: verify.yml
"""

RETURN = r"""
problems:
  description:
    - One sentence per problem found, each naming the variable (empty when the host's variables
      are right).
  returned: always
  type: list
  elements: str
  sample:
    - numafleet_placement is not a variable of numafleet.tuning; did you mean numafleet_placements?
checked:
  description: The host variables whose values were checked, sorted.
  returned: always
  type: list
  elements: str
  sample: [numafleet_procfs_root, numafleet_render_root, numafleet_sysfs_root]
msg:
  description:
    - The message of a failed check, C(host <name>:), every problem, then C(Fix the host variable;
      nothing was changed.)
  returned: failure
  type: str
  sample: >-
    host gpu-a100-01: numafleet_placement is not a variable of numafleet.tuning; did you mean
    numafleet_placements? Fix the host variable; nothing was changed.
"""
