# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that check the rolling-update play keywords of site.yml before Ansible reads them."""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

_PERCENT = re.compile(r"\A(\d{1,3})%\Z")
_COUNT = re.compile(r"\A\d+\Z")
_SERIAL_FIX = (
    "write a number of hosts (5), a percentage of the play's hosts ('25%') or a list of them "
    "([1, '10%', '50%']); 0 (the default) is one batch of every host"
)


def _batch(item, where: str):
    """One batch size: an int >= 0 or 'N%' with N in 1-100, as Ansible's serial takes it."""
    if isinstance(item, bool):
        raise AnsibleFilterError(f"{where}: {item!r} is not a batch size; {_SERIAL_FIX}")
    if isinstance(item, int) and item >= 0:
        return item
    text = str(item).strip() if isinstance(item, (str, int)) else ""
    if _COUNT.match(text):
        return int(text)
    match = _PERCENT.match(text)
    if match and 1 <= int(match.group(1)) <= 100:
        return text
    raise AnsibleFilterError(f"{where}: {item!r} is not a batch size; {_SERIAL_FIX}")


def serial_batches(value):
    """numafleet_serial checked for the play keyword serial: a batch size or a list of them."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise AnsibleFilterError(f"numafleet_serial: [] has no batch size; {_SERIAL_FIX}")
        return [_batch(item, f"numafleet_serial[{index}]") for index, item in enumerate(value)]
    return _batch(value, "numafleet_serial")


def fail_percentage(value):
    """numafleet_max_fail_percentage checked for the play keyword max_fail_percentage (0-100)."""
    text = (
        str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    )
    if _COUNT.match(text) and int(text) <= 100:
        return int(text)
    raise AnsibleFilterError(
        f"numafleet_max_fail_percentage: {value!r} is not a percentage; write a whole number from "
        "0 (stop at the first failed host of a batch) to 100 (only when a whole batch failed)"
    )


def failed_plans(hostvars, all_hosts, active_hosts, registered):
    """Sorted names of the hosts that left the play because a planning task failed.

    hostvars: Ansible's hostvars; all_hosts, active_hosts: ansible_play_hosts_all and
    ansible_play_hosts; registered: names of registered results whose ``failed`` marks a failed
    plan (site.yml: the host-variable check and the plan). A host that left the play for another
    reason (unreachable when the facts were gathered) is not a failed plan.
    """
    active = set(active_hosts)
    failed = []
    for host in all_hosts:
        if host in active:
            continue
        variables = hostvars[host]
        for name in registered:
            result = variables.get(name) if name in variables else None
            if isinstance(result, dict) and result.get("failed"):
                failed.append(str(host))
                break
    return sorted(set(failed))


class FilterModule:
    """Rolling-update and plan-gate filters for site.yml."""

    def filters(self):
        return {
            "serial_batches": serial_batches,
            "fail_percentage": fail_percentage,
            "failed_plans": failed_plans,
        }
