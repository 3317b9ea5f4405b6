"""The planner's fast paths give what the general code they stand in for gives.

groups_for's shortcut (group shapes), _single_cpu (count placements without GPUs or hugepages)
and the distance rows built with zip are checked against the plain computations.
"""

from __future__ import annotations

import itertools
import random

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import placements, planner
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.placements import (
    parse_placements,
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


@pytest.mark.parametrize(
    ("groups", "shape"),
    [
        ([], (0, 0)),
        ([(0, 4), (1, 5)], (2, 2)),
        ([(0, 4), (1,), (2, 6)], (2, 1)),
        ([(1,), (0, 4)], (1, 1)),
        ([(0, 2, 4, 6), (1, 3, 5, 7), (8,)], (4, 2)),
    ],
)
def test_group_shape_is_the_uniform_prefix(groups, shape):
    assert planner._group_shape(groups) == shape


def test_groups_for_matches_walking_the_groups():
    rng = random.Random(7)
    for dummy in range(300):
        groups = [tuple(range(rng.choice((1, 2, 2, 2, 4)))) for dummy in range(rng.randint(0, 9))]
        state = host(synthetic(cpus_per_node=(4,), mem_gb=(16,)))
        state.free_groups[0] = groups
        state.free_cpus[0] = sum(map(len, groups))
        state.group_shape[0] = planner._group_shape(groups)
        for count in range(state.free_cpus[0] + 3):
            want = plain_groups_for(groups, state.free_cpus[0], count)
            assert state.groups_for(0, count) == want, (groups, count)


def test_group_shape_holds_for_the_free_groups_through_a_plan():
    numa = synthetic(cpus_per_node=(8, 8))
    state = host(numa, reserved="0")
    placements = [
        p("pin", cpus="9-9"),  # leaves CPU 13 (9's sibling) as a group of its own on node 1
        p("a", cpus=3),
        p("b", cpus=4, node=1),
        p("c", cpus=2),
        p("d", cpus=1, node=1),
    ]
    plan = planner._Planner(state, parse_placements("h", placements, []), {})
    for placement in plan.placements:
        plan.out.append(plan._place(placement))
        for nid, groups in state.free_groups.items():
            size, uniform = state.group_shape[nid]
            assert uniform <= len(groups)
            assert all(len(group) == size for group in groups[:uniform])


@pytest.mark.parametrize("reserved", ["", "0", "0-1,9"])
def test_single_cpu_fits_as_fit_node_does(reserved):
    numa = synthetic(cpus_per_node=(8, 0, 6, 4), mem_gb=(2, 64, 16, 8))
    for counts in itertools.product((1, 2, 3, 5), repeat=3):
        state = host(numa, reserved)
        entries = [p(f"x{i}", cpus=c, memory="1G") for i, c in enumerate(counts)]
        plan = planner._Planner(state, parse_placements("h", entries, []), {})
        for placement in plan.placements:
            found = [plan._fit_node(placement, nid, [], False) for nid in state.cpu_nodes]
            found = [f for f in found if f is not None]
            fit = plan._single_cpu(placement, state.cpu_nodes)
            if not found:
                assert fit is None
                break
            best = min(found, key=lambda f: f[0])
            want = planner._Fit.on_node(*best)
            assert (fit.nodes, fit.groups, fit.gpus, fit.mig, fit.mem_node, fit.rank) == (
                want.nodes,
                want.groups,
                want.gpus,
                want.mig,
                want.mem_node,
                want.rank,
            )
            plan.out.append(plan._commit(placement, fit, []))


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


def test_plans_are_the_same_with_the_fast_paths_off(monkeypatch):
    """Whole plans with _single_cpu and the groups_for shortcut replaced by the general code."""
    numa = synthetic(cpus_per_node=(8, 8, 0), mem_gb=(16, 16, 32), isolated=(5,))
    placements = [
        p("pin", cpus="1,9"),
        p("a", cpus=2, memory="1G"),
        p("b", cpus=1),
        p("c", cpus=1, node=1),
        p("d", cpus=2, memory="2G"),
        p("e", cpus=2, allow_span=True),
    ]
    fast = planner.plan_host("h", numa, None, placements, [], POLICY)

    def general(self, p, nodes, listed, fallback, far=False):
        best = None
        for nid in nodes:
            found = self._fit_node(p, nid, listed, fallback, far)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        return None if best is None else planner._Fit.on_node(*best)

    monkeypatch.setattr(planner._Planner, "_single", general)
    monkeypatch.setattr(planner, "_group_shape", lambda groups: (1, 0))
    assert planner.plan_host("h", numa, None, placements, [], POLICY) == fast


class _Text(str):
    """A str subclass: takes the general _identity path."""


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"user": "llm", "group": "gpu"},
        {"user": "Root User"},
        {"user": 7},
        {"group": "9x"},
        {"group": None, "user": None},
        {"exec": _Text("/bin/app --x")},
        {"exec": "/bin/app 'a b'"},
        {"exec": "relative/app"},
        {"exec": ""},
        {"exec": None, "unit": "vllm.service"},
        {"exec": "/bin/app", "unit": "vllm.service"},
        {"memory": "64G"},
        {"memory": 0},
        {"memory": "0"},
        {"memory": 64},
        {"memory": "512K"},
        {"memory": "64 gigs"},
        {"memory": 1.5},
        {"memory": True},
        {"memory": "1.5G"},
    ],
)
def test_placement_parse_shortcuts_match_identity_and_size(changes):
    """_placement's inline exec and memory checks give _identity's and _size's results."""
    entry = {"name": "a", "exec": "/bin/app", "cpus": 2, **changes}
    entry = {key: value for key, value in entry.items() if value is not None or key == "exec"}
    if entry["exec"] is None:
        del entry["exec"]
    where = "numafleet_placements[0] (a)"

    def outcome(call):
        try:
            return call()
        except placements.PlacementError as exc:
            return str(exc)

    got = outcome(lambda: placements._placement("h", 0, entry, set()))

    def general():
        exec_text, argv, unit, user, group = placements._identity("h", where, entry)
        memory = entry.get("memory")
        memory_kb = 0 if memory is None else placements._size("h", where, "memory", memory)
        return exec_text, argv, unit, user, group, memory_kb

    want = outcome(general)
    if isinstance(want, str):
        assert got == want
    else:
        assert (got.exec, got.argv, got.unit, got.user, got.group, got.memory_kb) == want
