"""The planner's core groups and distance rows, checked against the plain computations.

The planner once had fast paths here (group shapes in groups_for, _single_cpu beside
_fit_node, distance rows built with zip); issue 24 kept one plain implementation of each.
groups_for is checked against walking the groups and the distance rows against assigning
position by position; the plan corpus (tests/unit/plan_corpus.py) holds the whole plans.
"""

from __future__ import annotations

import random

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import planner
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.placements import (
    parse_policy,
)

POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 4}
    entry.update(changes)
    return entry


def synthetic(cpus_per_node=(4, 4), mem_gb=None, isolated=()) -> dict:
    """Numa facts: CPUs numbered node by node, SMT siblings c and c + half of the node's CPUs."""
    mem_gb = mem_gb or (16,) * len(cpus_per_node)
    nodes, per_cpu, first, count = [], [], 0, len(cpus_per_node)
    for nid, (ncpu, gb) in enumerate(zip(cpus_per_node, mem_gb, strict=True)):
        cpus = list(range(first, first + ncpu))
        first += ncpu
        kind = "cpu+memory" if ncpu and gb else ("cpu-only" if ncpu else "memory-only")
        nodes.append(
            {
                "id": nid,
                "kind": kind,
                "cpus": cpus,
                "memory_kb": gb << 20,
                "distances": [10 if o == nid else 20 for o in range(count)],
                "hugepages": [{"size_kb": 2048}],
            }
        )
        half = max(ncpu // 2, 1)
        for position, cpu in enumerate(cpus):
            siblings = [c for i, c in enumerate(cpus) if i % half == position % half]
            per_cpu.append({"id": cpu, "node": nid, "online": True, "siblings": siblings})
    every = list(range(first))
    return {
        "node_ids": list(range(count)),
        "nodes": nodes,
        "cpus": {"online": every, "offline": [], "isolated": sorted(isolated)},
        "per_cpu": per_cpu,
    }


def plain_groups_for(groups: list, free: int, count: int) -> int:
    """groups_for without the shortcut: walk the groups from the front."""
    if free < count:
        return -1
    total = 0
    for taken, group in enumerate(groups, 1):
        total += len(group)
        if total >= count:
            return taken
    return -1


def host(numa: dict, reserved: str = "") -> planner._Host:
    policy = parse_policy("h", {"reserved_cpus": reserved, "memory_headroom_pct": 15})
    return planner._Host("h", numa, None, policy)


def test_groups_for_matches_walking_the_groups():
    rng = random.Random(7)
    for dummy in range(300):
        groups = [tuple(range(rng.choice((1, 2, 2, 2, 4)))) for dummy in range(rng.randint(0, 9))]
        state = host(synthetic(cpus_per_node=(4,), mem_gb=(16,)))
        state.free_groups[0] = groups
        state.free_cpus[0] = sum(map(len, groups))
        for count in range(state.free_cpus[0] + 3):
            want = plain_groups_for(groups, state.free_cpus[0], count)
            assert state.groups_for(0, count) == want, (groups, count)


@pytest.mark.parametrize(
    ("ids", "distances"),
    [
        ([0, 1], [10, 20]),
        ([0, 1, 2], [10, 20]),  # short row: 255 for the rest
        ([0, 1], [10, 20, 30]),  # long row: cut
        ([0, 1, 0], [10, 20, 30]),  # a repeated id keeps its last distance
        ([0, 1, 0], [10, 20]),  # ... which may be 255
        ([0, 1], []),
        ((0, 1), (10, 21)),  # not lists: the position-by-position loop
    ],
)
def test_distance_rows_match_assigning_by_position(ids, distances):
    numa = synthetic(cpus_per_node=(2, 2))
    numa["node_ids"] = ids
    numa["nodes"][0]["distances"] = distances
    want = {}
    for position, other in enumerate(ids):
        want[other] = distances[position] if position < len(distances) else 255
    want[0] = want.get(0, 10)
    assert host(numa).dist[0] == want
