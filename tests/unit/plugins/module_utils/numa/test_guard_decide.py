"""guard.decide properties (hypothesis): never high, bounded per round, hysteresis without flapping."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard

TOTAL_KB = 1_000_000
MIB = 1024 * 1024


def node(nid: int, used_pct: float) -> guard.NodeMemory:
    used = int(TOTAL_KB * used_pct / 100)
    return guard.NodeMemory(nid, TOTAL_KB, TOTAL_KB - used, 0)


placement_st = st.fixed_dictionaries(
    {
        "priority": st.sampled_from(guard.PRIORITIES),
        "node": st.integers(0, 1),
        "local_mib": st.one_of(st.integers(0, 80), st.integers(0, 900)),  # small: under the floor
        "remote_mib": st.integers(0, 100),
        "running": st.booleans(),
        "high_mib": st.one_of(st.none(), st.integers(1, 1200)),
    }
)

thresholds_st = st.builds(
    guard.Thresholds,
    warn_pct=st.sampled_from([70.0, 80.0]),
    act_pct=st.sampled_from([85.0, 90.0, 95.0]),
    act_rounds=st.integers(1, 3),
    release_margin_pct=st.sampled_from([0.0, 5.0, 10.0]),
    max_step_bytes=st.integers(1, 2048 * MIB),
    mode=st.sampled_from(guard.MODES),
    min_high_bytes=st.sampled_from([0, 64 * MIB]),
)


def build(raw: list) -> tuple:
    specs, memories = [], []
    for index, item in enumerate(raw):
        name = f"p{index}"
        here, other = item["node"], 1 - item["node"]
        specs.append(
            guard.PlacementSpec(
                name, f"{name}.service", "numafleet.slice", (here,), 0, item["priority"]
            )
        )
        anon = ((here, item["local_mib"] * MIB), (other, item["remote_mib"] * MIB))
        current = (item["local_mib"] + item["remote_mib"]) * MIB
        high = None if item["high_mib"] is None else item["high_mib"] * MIB
        memories.append(
            guard.PlacementMemory(
                name,
                f"numafleet.slice/{name}.service",
                item["running"],
                current,
                high,
                0,
                tuple(sorted(anon)),
                (),
            )
        )
    return tuple(specs), tuple(memories)


USED_ST = st.one_of(st.floats(0, 100), st.floats(85, 100))  # often over the act threshold
UNDER_THE_FLOOR = {
    "priority": "low",
    "node": 1,
    "local_mib": 10,
    "remote_mib": 0,
    "running": True,
    "high_mib": None,
}


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(placement_st, max_size=8),
    used=st.tuples(USED_ST, USED_ST),
    rounds=st.integers(1, 4),
    thresholds=thresholds_st,
    reclaim_available=st.booleans(),
)
@example(
    raw=[UNDER_THE_FLOOR],
    used=(10.0, 99.0),
    rounds=1,
    thresholds=guard.Thresholds(mode="throttle", act_rounds=1, min_high_bytes=64 * MIB),
    reclaim_available=True,
)
def test_never_high_and_bounded_per_round(raw, used, rounds, thresholds, reclaim_available):
    specs, memories = build(raw)
    priority = {s.name: s.priority for s in specs}
    by_name = {m.name: m for m in memories}
    nodes = (node(0, used[0]), node(1, used[1]))
    state = guard.GuardState()
    for dummy in range(rounds):
        decision = guard.decide(nodes, memories, specs, state, thresholds, reclaim_available)
        state = decision.state
        names = [a.placement for a in decision.actions]
        assert len(names) == len(set(names))  # one action per placement per round
        for n in nodes:
            mine = [a for a in decision.actions if a.node == n.id and a.action != "release"]
            # migrate moves a placement's bytes on the node at once (not bounded by the step);
            # test_guard_spill.py has its property.
            moves = [a for a in mine if a.action == "migrate"]
            assert len(moves) <= 1
            mine = [a for a in mine if a.action != "migrate"]
            if moves:
                assert not mine
            excess = n.used_kb * 1024 - int(n.total_kb * 1024 * thresholds.act_pct / 100)
            assert sum(a.amount_bytes for a in mine) <= min(
                max(excess, 1), thresholds.max_step_bytes
            )
            if mine:
                assert n.used_ratio * 100 >= thresholds.act_pct
            for action in mine:
                assert priority[action.placement] != "high"
                assert by_name[action.placement].running
                assert 0 < action.amount_bytes <= by_name[action.placement].bytes_on(n.id)
                if action.action == "throttle":
                    assert int(action.value) >= thresholds.min_high_bytes
                    assert action.before == guard._limit_text(by_name[action.placement].high_bytes)


@settings(max_examples=300, deadline=None)
@given(
    ratios=st.lists(st.floats(0, 100), min_size=1, max_size=30),
    thresholds=thresholds_st,
    raw=st.lists(placement_st, min_size=1, max_size=5),
)
def test_hysteresis_acts_and_releases_only_across_the_band(ratios, thresholds, raw):
    """Throttle/reclaim only after act_rounds rounds at or over act; release only below
    warn - margin; a journal level change to ok only below warn - margin."""
    specs, memories = build([dict(item, running=True) for item in raw])
    state = guard.GuardState()
    history = []
    for pct in ratios:
        history.append(pct)
        nodes = (node(0, 10.0), node(1, pct))
        decision = guard.decide(nodes, memories, specs, state, thresholds)
        state = decision.state
        node1 = nodes[1].used_ratio * 100
        for action in decision.actions:
            assert action.node == 1
            if action.action == "release":
                assert node1 < thresholds.warn_pct - thresholds.release_margin_pct
            else:
                recent = [node(1, p).used_ratio * 100 for p in history[-thresholds.act_rounds :]]
                assert len(recent) == thresholds.act_rounds
                assert all(r >= thresholds.act_pct for r in recent)
        for event in decision.events:
            if event.level == "ok":
                assert node1 < thresholds.warn_pct - thresholds.release_margin_pct


@settings(max_examples=200, deadline=None)
@given(
    pct=st.floats(0, 100),
    thresholds=thresholds_st,
    raw=st.lists(placement_st, min_size=1, max_size=5),
    rounds=st.integers(2, 12),
)
def test_a_steady_node_does_not_flap(pct, thresholds, raw, rounds):
    """At a constant ratio the guard never both tightens and releases, and reports one level."""
    specs, memories = build([dict(item, running=True) for item in raw])
    state, kinds, levels = guard.GuardState(), set(), []
    for dummy in range(rounds):
        decision = guard.decide((node(0, 10.0), node(1, pct)), memories, specs, state, thresholds)
        state = decision.state
        kinds.update(a.action for a in decision.actions)
        levels.extend(e.level for e in decision.events if e.node == 1)
    assert not ({"release"} & kinds and {"throttle", "reclaim"} & kinds)
    assert len(levels) <= 1
