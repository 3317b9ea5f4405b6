# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

import os

from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.plugin_utils._reports import (
    inside_collection_problem,
)


def project_path(value, name: str = "path") -> str:
    """``value`` as an absolute controller path, a relative one taken from the directory
    ansible-playbook runs in (os.getcwd() of the controller process: the user's project).

    Unlike a relative path in a playbook (Ansible takes it from the playbook's directory, inside
    the collection when the playbook is run by FQCN) or the ``pipe`` lookup (run in the playbook's
    directory), this never lands inside an installed collection; a result inside one is refused.
    Raises AnsibleFilterError naming ``name`` for a value that is not a non-empty string.
    """
    if not isinstance(value, str) or not value.strip():
        raise AnsibleFilterError(
            f"numafleet.tuning.project_path: {name} is {value!r}; give a directory path"
        )
    path = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(value)))
    problem = inside_collection_problem(
        f"{name} {path}", path, name, "relative paths are taken from it"
    )
    if problem:
        raise AnsibleFilterError(f"numafleet.tuning.project_path: {problem}")
    return path


class FilterModule:
    """Controller paths relative to the user's project."""

    def filters(self):
        return {"project_path": project_path}
