# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import (
    format_cpulist,
    parse_cpulist,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError


def cpulist(value):
    """Kernel cpulist text ("0-3,8") of a list of CPU or node numbers; a string is normalised."""
    try:
        if isinstance(value, str):
            return format_cpulist(parse_cpulist(value))
        return format_cpulist(int(item) for item in value)
    except (NumaTuneError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"numafleet.tuning.cpulist: {exc}") from None


class FilterModule:
    """CPU-set filters for templates."""

    def filters(self):
        return {"cpulist": cpulist}
