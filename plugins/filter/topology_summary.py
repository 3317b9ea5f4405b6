# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.summary import (
    summarize_topology,
)


def topology_summary(numa, gpu_topology=None):
    """One-line summary of ansible_facts.numa (and optionally ansible_facts.gpu_topology)."""
    if not isinstance(numa, dict):
        raise AnsibleFilterError(
            "numafleet.tuning.topology_summary expects ansible_facts.numa (a dict); "
            "run numafleet.tuning.numa_facts first"
        )
    if gpu_topology is not None and not isinstance(gpu_topology, dict):
        raise AnsibleFilterError(
            "numafleet.tuning.topology_summary: the argument must be ansible_facts.gpu_topology "
            f"(a dict) or nothing, not {type(gpu_topology).__name__}"
        )
    try:
        return summarize_topology(numa, gpu_topology)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(
            "numafleet.tuning.topology_summary: the input does not have the shape of "
            f"ansible_facts.numa / ansible_facts.gpu_topology ({exc}); pass the facts gathered by "
            "numafleet.tuning.numa_facts and numafleet.tuning.gpu_topology_facts"
        ) from None


class FilterModule:
    """Topology summary filter."""

    def filters(self):
        return {"topology_summary": topology_summary}
