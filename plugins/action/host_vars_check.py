# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.host_vars_check: a host's variables against the schema.

Nothing is sent to the host. The variables are the host's own (``hostvars[inventory_hostname]``:
inventory, extra vars and facts, without the play's vars, vars_files and role defaults), checked
against ``plugin_utils/_host_vars.py``. Documentation: ``plugins/modules/host_vars_check.py``.
"""

from __future__ import annotations

from ansible.errors import AnsibleError

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import escape_controls
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _host_vars
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    ControllerAction,
    plain,
)

ARGUMENT_SPEC = dict(
    playbook=dict(type="str", choices=list(_host_vars.PLAYBOOKS), default=_host_vars.SITE),
)


class ActionModule(ControllerAction):
    """Check one host's variables; fails with one message naming the host and every problem."""

    NAME = "numafleet.tuning.host_vars_check"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, host, args = self.start(tmp, task_vars)
        playbook = args["playbook"]
        variables = (task_vars.get("hostvars") or {}).get(host)
        if variables is None:
            result.update(
                failed=True,
                problems=[],
                checked=[],
                msg=f"host {host}: {self.NAME}: hostvars has no entry for the host",
            )
            return result
        names = [str(name) for name in variables]
        # The host's facts, whose names are top-level variables too where inject_facts_as_vars is
        # on (the keys only: the facts themselves are not templated).
        facts = task_vars.get("ansible_facts") or {}
        problems = _host_vars.unknown_problems(names, ignore=[str(name) for name in facts])
        extra_vars = self._extra_var_names()
        problems += _host_vars.role_input_problems(names, playbook, extra_vars or ())
        if extra_vars is not None:
            problems += _host_vars.extra_vars_problems(names, extra_vars)
        values = {}
        for name in sorted(_host_vars.checked_names(playbook).intersection(names)):
            try:
                values[name] = plain(variables[name])
            except AnsibleError:
                # It refers to a variable the host does not have (a play variable, say): the
                # playbook templates it in its own context, and fails there if it is undefined.
                continue
        problems += _host_vars.type_problems(values)
        # A value's newline, NUL or NEL shows as an escape, never breaks or hides the message.
        problems = [escape_controls(text) for text in problems]
        result.update(changed=False, problems=problems, checked=sorted(values))
        if problems:
            result.update(failed=True, msg=_host_vars.message(host, problems))
        return result

    def _extra_var_names(self):
        """Names of the run's extra vars (-e), or None where the task does not know them."""
        manager = getattr(self._task, "get_variable_manager", lambda: None)()
        extra = getattr(manager, "extra_vars", None)
        return None if extra is None else [str(name) for name in extra]
