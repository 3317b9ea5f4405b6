# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to this collection: shared base of the controller-side action plugins.

numa_plan, numa_verify, verify_report and drift_report run on the controller only (no module is sent) and feed
plain Python data to the pure core in ``module_utils/numa``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase


def plain(value):
    """Plain dict/list/str/int copies of Ansible's tagged and lazy containers, for the pure core."""
    if isinstance(value, dict):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


class ControllerAction(ActionBase):
    """An action that runs on the controller only; subclasses set NAME and ARGUMENT_SPEC."""

    NAME = ""
    ARGUMENT_SPEC: dict = {}
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def start(self, tmp, task_vars):
        """(result, host, validated args); a bad option fails naming the host and the action."""
        result = super().run(tmp, task_vars)
        host = str(self._task.args.get("host") or task_vars.get("inventory_hostname", "localhost"))
        try:
            dummy, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        except AnsibleActionFail as exc:
            raise AnsibleActionFail(f"host {host}: {self.NAME}: {exc.message}") from None
        return result, host, args


def registered(hostvars, host: str, name):
    """The plain value (a dict) that ``host`` registered as variable ``name`` in ``hostvars``, or
    None when ``name`` is empty, the host is unknown, or the value is not a dict, undefined or
    broken (a task that never ran on the host, a host that failed before it)."""
    if not name or host not in hostvars:
        return None
    try:
        value = plain(hostvars[host].get(name))
    except AnsibleError:
        return None
    return value if isinstance(value, dict) else None


class HostVariables(Mapping):
    """Read-only view of one host's variables (``hostvars[host]``), each value plain and templated.

    The host's own variables only: inventory, extra vars and facts, never a play's vars or a
    role's defaults. ``get(name, default)`` returns default when the variable is not set or when
    it refers to a variable the host does not have (it is then the playbook's to template).
    """

    def __init__(self, task_vars: dict, host: str):
        self._variables = (task_vars.get("hostvars") or {}).get(host) or {}
        self._cache: dict = {}

    def __contains__(self, key) -> bool:
        return key in self._variables

    def __iter__(self):
        return iter(list(self._variables))

    def __len__(self) -> int:
        return len(self._variables)

    def get(self, key: str, default=None):
        if key in self._cache:
            return self._cache[key]
        if key not in self._variables:
            return default
        try:
            value = plain(self._variables[key])
        except AnsibleError:
            return default
        self._cache[key] = value
        return value

    def __getitem__(self, key: str):
        if key not in self._variables:
            raise KeyError(key)
        return self.get(key)
