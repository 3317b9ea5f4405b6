# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    UnitRenderError,
)


def _environment(value, what: str) -> list:
    if not isinstance(value, dict):
        raise UnitRenderError(f"{what}: {value!r} is not a mapping of variable names")
    for key in value:
        if not isinstance(value[key], str):
            raise UnitRenderError(
                f'{what}.{key}: {value[key]!r} is not a string; quote it (e.g. "8")'
            )
    return [units.quote_environment(key, value[key], what) for key in sorted(value, key=str)]


def _exec(value, what: str) -> str:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UnitRenderError(f"{what}: {value!r} is not a list of strings")
    return units.exec_line(list(value), what)


def _string(function):
    def run(value, what: str):
        if not isinstance(value, str):
            raise UnitRenderError(f"{what}: {value!r} is not a string")
        return function(value, what)

    return run


# context: function(value, what) -> text for the unit file; raises UnitRenderError.
CONTEXTS = {
    "text": _string(units.escape_specifiers),
    "path": _string(units.escape_path),
    "program": _string(units.program_path),
    "arg": _string(units.quote_exec_arg),
    "exec": _exec,
    "environment": _environment,
    "account": _string(units.account_name),
    "calendar": _string(units.calendar_value),
    "timespan": units.timespan_value,
}


def systemd_value(value, context: str, name: str = "value", check: bool = False):
    """``value`` written for a unit file in ``context`` so that systemd reads back exactly it.

    With ``check=True``: an empty string when it can be written, else the reason it cannot.
    """
    if context not in CONTEXTS:
        raise AnsibleFilterError(
            f"numafleet.tuning.systemd_value: context {context!r} is not one of "
            f"{', '.join(sorted(CONTEXTS))}"
        )
    try:
        text = CONTEXTS[context](value, name)
    except NumaTuneError as exc:
        if check:
            return str(exc)
        raise AnsibleFilterError(f"numafleet.tuning.systemd_value: {exc}") from None
    return "" if check else text


class FilterModule:
    """Escaping of values for systemd unit files."""

    def filters(self):
        return {"systemd_value": systemd_value}
