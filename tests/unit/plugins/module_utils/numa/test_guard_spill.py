"""guard.py mode migrate: node distances, the migrate decision, spilled bookkeeping; hypothesis:
a migrate target is never the hot node and never over warn after the round's moves."""

from __future__ import annotations

import guard_trees
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import GuardError

MIB = 1024 * 1024
TOTAL_KB = 1_000_000
MIGRATE = guard.Thresholds(mode="migrate", act_rounds=1)


def node(nid: int, used_pct: float, distances=(), total_kb: int = TOTAL_KB) -> guard.NodeMemory:
    used = int(total_kb * used_pct / 100)
    return guard.NodeMemory(nid, total_kb, total_kb - used, 0, (), tuple(distances))


def placement(name: str, by_node: dict, priority: str = "normal", mems=(1,), running=True):
    spec = guard.PlacementSpec(name, f"{name}.service", "numafleet.slice", tuple(mems), 0, priority)
    memory = guard.PlacementMemory(
        name,
        f"numafleet.slice/{name}.service",
        running,
        sum(by_node.values()),
        None,
        0,
        tuple(sorted(by_node.items())),
        (),
    )
    return spec, memory


def decide(nodes, pairs, thresholds=MIGRATE, state=None, reclaim_available=True):
    specs = tuple(s for s, dummy in pairs)
    memories = tuple(m for dummy, m in pairs)
    return guard.decide(
        tuple(nodes), memories, specs, state or guard.GuardState(), thresholds, reclaim_available
    )


# --- reading distances -----------------------------------------------------------------------


def test_read_nodes_reads_the_real_guest_distance_rows(fixture_root):
    """qemu-2node-pxb: node<N>/distance as QEMU's default SLIT (10 local, 20 remote)."""
    root = fixture_root("qemu-2node-pxb")
    nodes, warnings = guard.read_nodes(guard.read_path, f"{root}/sys")
    assert warnings == []
    assert [n.distances for n in nodes] == [((0, 10), (1, 20)), ((0, 20), (1, 10))]
    assert nodes[1].distance_to(0) == 20 and nodes[1].distance_to(7) == 255


@pytest.mark.parametrize(
    ("text", "reason"),
    [("10 x\n", "'10 x' is not a row of distances"), ("10\n", "1 distances for 2 online nodes")],
)
def test_a_malformed_distance_row_is_a_warning_and_the_distances_unknown(tmp_path, text, reason):
    root, dummy = guard_trees.make("calm", tmp_path / "calm")
    path = f"{root}/sys/devices/system/node/node1/distance"
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)
    nodes, warnings = guard.read_nodes(guard.read_path, f"{root}/sys")
    assert [n.id for n in nodes] == [0, 1]
    assert nodes[1].distances == () and nodes[0].distances == ((0, 10), (1, 20))
    assert warnings == [{"path": path, "reason": reason}]


def test_an_absent_distance_row_is_silently_unknown(tmp_path):
    root, dummy = guard_trees.make("calm", tmp_path / "calm")
    (tmp_path / "calm/sys/devices/system/node/node0/distance").unlink()
    nodes, warnings = guard.read_nodes(guard.read_path, f"{root}/sys")
    assert warnings == [] and nodes[0].distances == ()


# --- the migrate decision --------------------------------------------------------------------


def test_guest_scenario_migrates_the_low_placement_to_node_0(tmp_path):
    """Node 1 at 92% for two rounds: kv-low (low, 900 MiB) moves to node 0 (30%), at once."""
    root, plan = guard_trees.make("guest-over-act", tmp_path / "guest")
    specs = guard.parse_placements(plan)
    thresholds = guard.parse_thresholds({"mode": "migrate"})
    state = guard.GuardState()
    for round_number in (1, 2):
        result = guard.run_round(
            guard.read_path,
            specs,
            state,
            thresholds,
            float(round_number),
            sysfs_root=f"{root}/sys",
            cgroup_root=f"{root}/sys/fs/cgroup",
        )
        state = result.decision.state
    (action,) = result.decision.actions
    assert (action.node, action.action, action.placement) == (1, "migrate", "kv-low")
    assert (action.path, action.value, action.before) == (
        "numafleet.slice/numafleet-kv-low.service",
        "0",
        "1",
    )
    assert action.amount_bytes == 900 * MIB  # all of it, not capped by the excess or the step
    assert action.reason.startswith(
        "node 1 at 92.0% for 2 rounds (act at 90%), low priority, 943718400 bytes on the node "
        "moved to node 0 (distance 20, "
    )
    assert dict(state.actions_total) == {(1, "migrate", "kv-low"): 1}
    assert 'action="migrate",placement="kv-low"' in result.textfile
    fields = action.journal_fields()
    assert (fields["NUMAFLEET_BEFORE"], fields["NUMAFLEET_AFTER"]) == ("1", "0")
    report = result.as_dict(specs)
    assert report["nodes"][0]["distances"] == {"0": 10, "1": 20}


def test_the_nearest_node_with_room_is_the_target():
    nodes = [
        node(0, 10.0, ((0, 10), (1, 32), (2, 12), (3, 32))),
        node(1, 95.0, ((0, 32), (1, 10), (2, 21), (3, 12))),
        node(2, 20.0, ((0, 12), (1, 21), (2, 10), (3, 32))),
        node(3, 79.0, ((0, 32), (1, 12), (2, 32), (3, 10))),  # nearest, but no room
    ]
    pairs = [placement("batch", {1: 100 * MIB}, "low")]
    (action,) = decide(nodes, pairs).actions
    assert (action.action, action.value) == ("migrate", "2")  # distance 21 beats 0's 32
    assert "(distance 21, " in action.reason


def test_unknown_distances_fall_back_to_the_lowest_node_id():
    nodes = [node(0, 10.0), node(1, 95.0), node(2, 5.0)]
    (action,) = decide(nodes, [placement("batch", {1: 10 * MIB}, "low")]).actions
    assert action.value == "0" and "(distance 255, " in action.reason


def test_one_placement_per_node_low_first_and_never_high():
    nodes = [node(0, 10.0), node(1, 95.0)]
    pairs = [
        placement("kv", {1: 300 * MIB}, "high"),
        placement("web", {1: 200 * MIB}, "normal"),
        placement("batch", {1: 50 * MIB}, "low"),
        placement("batch2", {1: 60 * MIB}, "low"),
    ]
    actions = decide(nodes, pairs).actions
    assert [(a.action, a.placement) for a in actions] == [("migrate", "batch2")]


def test_a_candidate_too_big_for_any_node_gives_way_to_one_that_fits():
    nodes = [node(0, 70.0), node(1, 95.0)]  # node 0 has ~95 MiB below warn
    pairs = [placement("big", {1: 500 * MIB}, "low"), placement("small", {1: 50 * MIB})]
    (action,) = decide(nodes, pairs).actions
    assert (action.action, action.placement, action.value) == ("migrate", "small", "0")


@pytest.mark.parametrize(("available", "fallback"), [(True, "reclaim"), (False, "throttle")])
def test_no_room_anywhere_falls_back_to_reclaim_or_throttle(available, fallback):
    nodes = [node(0, 79.5), node(1, 95.0)]
    pairs = [placement("big", {1: 500 * MIB}, "low")]
    (action,) = decide(nodes, pairs, reclaim_available=available).actions
    assert (action.action, action.placement) == (fallback, "big")
    assert action.reason.endswith("bytes on the node; no node has room to take it below warn") == (
        available
    )
    assert ("throttled, not reclaimed: this kernel has no memory.reclaim" in action.reason) == (
        not available
    )


def test_a_blocked_reclaim_names_its_cause_in_the_throttle_reason():
    nodes = [node(0, 79.5), node(1, 95.0)]
    pairs = [placement("big", {1: 500 * MIB}, "low")]
    t = guard.Thresholds(act_rounds=1, mode="reclaim")
    memories = tuple(m for dummy, m in pairs)
    specs = tuple(spec for spec, dummy in pairs)
    why = "no free swap (SwapFree 0 kB in /proc/meminfo)"
    decision = guard.decide(tuple(nodes), memories, specs, guard.GuardState(), t, False, why)
    (action,) = decision.actions
    assert action.action == "throttle"
    assert action.reason.endswith(f"; throttled, not reclaimed: {why}")
    assert "no node has room" not in action.reason  # reclaim was the mode, not a fallback


def test_two_hot_nodes_do_not_overfill_one_target():
    """Bytes moved earlier in the round count against the target's room."""
    nodes = [node(0, 95.0), node(1, 95.0), node(2, 60.0), node(3, 50.0)]
    size = 150 * MIB  # ~15.7% of a node: node 2 takes one, not two
    pairs = [
        placement("a", {0: size}, "low", mems=(0,)),
        placement("b", {1: size}, "low"),
    ]
    actions = decide(nodes, pairs).actions
    assert [(a.node, a.placement, a.value) for a in actions] == [(0, "a", "2"), (1, "b", "3")]


def test_migrate_waits_for_act_rounds():
    thresholds = guard.Thresholds(mode="migrate", act_rounds=2)
    nodes = [node(0, 10.0), node(1, 95.0)]
    pairs = [placement("batch", {1: 10 * MIB}, "low")]
    first = decide(nodes, pairs, thresholds)
    assert first.actions == ()
    second = decide(nodes, pairs, thresholds, state=first.state)
    assert [a.action for a in second.actions] == ["migrate"]


# --- spilled bookkeeping ---------------------------------------------------------------------


def _migrate_action(placement_name="batch", hot=1, target=0, amount=100):
    return guard.Action(hot, "migrate", placement_name, "x", str(target), amount, str(hot), "r")


def test_record_spill_adds_and_merges():
    spilled = guard.record_spill({}, _migrate_action(), 1000.5)
    assert spilled == {"batch": {"from": [1], "to": [0], "since": 1000.5, "bytes": 100}}
    again = guard.record_spill(spilled, _migrate_action(hot=1, target=2, amount=50), 2000.0)
    assert again == {"batch": {"from": [1], "to": [0, 2], "since": 1000.5, "bytes": 150}}
    assert spilled["batch"]["to"] == [0]  # the input is left as it was


def test_record_spill_takes_only_migrate_actions():
    reclaim = guard.Action(1, "reclaim", "batch", "x", "1", 1, None, "r")
    with pytest.raises(GuardError, match="record_spill takes a migrate action, not 'reclaim'"):
        guard.record_spill({}, reclaim, 1.0)


def test_parse_spilled_round_trip_and_refusal():
    spilled = guard.record_spill({}, _migrate_action(), 5.0)
    assert guard.parse_spilled(spilled) == spilled
    assert guard.parse_spilled(None) == {}
    with pytest.raises(GuardError, match="spilled placements do not parse .* starts afresh"):
        guard.parse_spilled({"batch": {"from": [1], "to": [0]}})
    with pytest.raises(GuardError, match="has no from/to nodes"):
        guard.parse_spilled({"batch": {"from": [], "to": [0], "since": 1, "bytes": 1}})


SPILLED = {"batch": {"from": [1], "to": [0], "since": 5.0, "bytes": 100 * MIB}}


@pytest.mark.parametrize(
    ("node1_pct", "by_node", "running", "kept"),
    [
        (95.0, {0: 100 * MIB, 1: 10 * MIB}, True, True),  # still hot
        (76.0, {0: 1 * MIB, 1: 100 * MIB}, True, True),  # in the band: not under warn - margin
        (50.0, {0: 100 * MIB, 1: 10 * MIB}, True, True),  # calm, but its pages are still off-node
        (50.0, {0: 1 * MIB, 1: 100 * MIB}, True, False),  # calm and under 2 % off-node
        (95.0, {0: 100 * MIB}, False, False),  # stopped: its next start is on its nodes
    ],
)
def test_clear_spills(node1_pct, by_node, running, kept):
    spec, memory = placement("batch", by_node, "low", running=running)
    nodes = (node(0, 40.0), node(1, node1_pct))
    out = guard.clear_spills(SPILLED, nodes, (memory,), guard.Thresholds(), (spec,))
    assert out == (SPILLED if kept else {})


def test_clear_spills_without_specs_uses_the_nodes_it_was_moved_from():
    dummy, memory = placement("batch", {0: 1 * MIB, 1: 100 * MIB}, "low")
    nodes = (node(0, 40.0), node(1, 50.0))
    assert guard.clear_spills(SPILLED, nodes, (memory,), guard.Thresholds()) == {}
    assert guard.clear_spills(SPILLED, nodes, (), guard.Thresholds()) == {}  # gone from the plan


# --- property --------------------------------------------------------------------------------

placement_st = st.fixed_dictionaries(
    {
        "priority": st.sampled_from(guard.PRIORITIES),
        "node": st.integers(0, 3),
        "local_mib": st.integers(0, 600),
        "remote_mib": st.integers(0, 100),
        "running": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(placement_st, max_size=8),
    used=st.lists(st.one_of(st.floats(0, 100), st.floats(85, 100)), min_size=2, max_size=4),
    distances=st.lists(st.integers(11, 40), min_size=16, max_size=16),
    known=st.booleans(),
    warn=st.sampled_from([60.0, 70.0, 80.0]),
    act=st.sampled_from([85.0, 90.0]),
)
def test_a_migrate_target_is_never_the_hot_node_nor_over_warn_after_the_move(
    raw, used, distances, known, warn, act
):
    count = len(used)
    nodes = tuple(
        node(
            i,
            used[i],
            tuple((j, 10 if i == j else distances[i * 4 + j]) for j in range(count))
            if known
            else (),
        )
        for i in range(count)
    )
    pairs = []
    for index, item in enumerate(raw):
        home = item["node"] % count
        other = (home + 1) % count
        pairs.append(
            placement(
                f"p{index}",
                {home: item["local_mib"] * MIB, other: item["remote_mib"] * MIB},
                item["priority"],
                mems=(home,),
                running=item["running"],
            )
        )
    thresholds = guard.Thresholds(warn_pct=warn, act_pct=act, act_rounds=1, mode="migrate")
    decision = decide(nodes, pairs, thresholds)
    by_id = {n.id: n for n in nodes}
    memories = {m.name: m for dummy, m in pairs}
    specs = {s.name: s for s, dummy in pairs}
    moved: dict = {}
    per_node: dict = {}
    for action in decision.actions:
        if action.action != "migrate":
            continue
        hot, target = by_id[action.node], by_id[int(action.value)]
        assert target.id != hot.id
        assert hot.used_ratio * 100 >= act
        assert specs[action.placement].priority != "high"
        assert memories[action.placement].running
        assert action.amount_bytes == memories[action.placement].bytes_on(hot.id) > 0
        per_node[hot.id] = per_node.get(hot.id, 0) + 1
        moved[target.id] = moved.get(target.id, 0) + action.amount_bytes
    assert all(value == 1 for value in per_node.values())  # one placement per node per round
    for target_id, extra in moved.items():
        target = by_id[target_id]
        assert (target.used_kb * 1024 + extra) * 100.0 < warn * target.total_kb * 1024
