# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import (
    MAX_CPUS,
    format_cpulist,
    parse_cpulist,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    CpulistError,
    NumaTuneError,
)


def _number(item) -> int:
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise CpulistError(repr(item), "items must be CPU or node numbers (integers)")
    if isinstance(item, str):
        if not (item.isascii() and item.isdigit()):
            raise CpulistError(item, "items must be CPU or node numbers (integers)")
        item = int(item)
    if not 0 <= item < MAX_CPUS:
        raise CpulistError(str(item), f"numbers must be between 0 and {MAX_CPUS - 1}")
    return item


def cpulist(value):
    """Kernel cpulist text ("0-3,8") of a list of CPU or node numbers; a string is normalised."""
    try:
        if isinstance(value, str):
            return format_cpulist(parse_cpulist(value))
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise CpulistError(
                repr(value), "expected a list of CPU or node numbers, or cpulist text"
            )
        return format_cpulist(_number(item) for item in value)
    except NumaTuneError as exc:
        raise AnsibleFilterError(f"numafleet.tuning.cpulist: {exc}") from None


class FilterModule:
    """CPU-set filters for templates."""

    def filters(self):
        return {"cpulist": cpulist}
