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
    return summarize_topology(numa, gpu_topology if isinstance(gpu_topology, dict) else None)


class FilterModule:
    """Topology summary filter."""

    def filters(self):
        return {"topology_summary": topology_summary}
