"""guard.py: node/cgroup reading on recorded and guest-layout trees, decisions, the textfile."""

from __future__ import annotations

import json
import re

import guard_trees
import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import GuardError

MIB = 1024 * 1024


def _round(root: str, plan: dict, state=None, thresholds=None, now=1.0, **kwargs):
    return guard.run_round(
        guard.read_path,
        guard.parse_placements(plan),
        state or guard.GuardState(),
        thresholds or guard.Thresholds(),
        now,
        sysfs_root=f"{root}/sys",
        cgroup_root=f"{root}/sys/fs/cgroup",
        **kwargs,
    )


@pytest.fixture
def guest(tmp_path):
    """The issue's guest scenario at its peak (node 1 at 92%)."""
    return guard_trees.make("guest-over-act", tmp_path / "guest")


# --- reading ---------------------------------------------------------------------------------


def test_read_nodes_on_the_real_guest_capture(fixture_root):
    """qemu-2node-pxb: every file written by a real 6.1 kernel (node meminfo, hugepage pools)."""
    root = fixture_root("qemu-2node-pxb")
    nodes, warnings = guard.read_nodes(guard.read_path, f"{root}/sys")
    assert warnings == []
    assert [n.id for n in nodes] == [0, 1]
    node1 = nodes[1]
    # Node 1 MemTotal 2015616, MemFree 1815904, Active(file) 15824, Inactive(file) 11752.
    assert (node1.total_kb, node1.free_kb, node1.file_kb) == (2015616, 1815904, 27576)
    assert node1.used_kb == 2015616 - 1815904 - 27576
    assert node1.used_ratio == pytest.approx(172136 / 2015616)
    assert node1.hugepages == (
        guard.HugePool(size_kb=2048, total=48, free=16),
        guard.HugePool(size_kb=1048576, total=0, free=0),
    )


def test_read_placements_in_guest_layout(guest):
    root, plan = guest
    specs = guard.parse_placements(plan)
    memories, warnings = guard.read_placements(guard.read_path, specs, f"{root}/sys/fs/cgroup")
    assert warnings == []
    by_name = {m.name: m for m in memories}
    etl = by_name["etl"]
    assert etl.cgroup == "numafleet.slice/numafleet-team\\x2da.slice/numafleet-etl.service"
    assert etl.running and etl.high_bytes is None and etl.low_bytes == 0
    high = by_name["kv-high"]
    assert high.low_bytes == 600 * MIB
    assert high.bytes_on(1) == 600 * MIB * 9 // 10 + 600 * MIB // 10
    assert high.bytes_on(0) == 6 * MIB
    assert high.offnode_share((1,)) == pytest.approx(6 / 606)
    assert high.offnode_share((0, 1)) == 0.0


def test_a_stopped_placement_is_not_running_without_warning(guest):
    root, plan = guest
    plan["placements"].append(
        {"name": "stopped", "unit": "numafleet-stopped.service", "mems": [0], "memory_kb": 1}
    )
    result = _round(root, plan)
    stopped = [m for m in result.placements if m.name == "stopped"][0]
    assert not stopped.running and result.warnings == ()
    assert 'placement="stopped"' not in result.textfile


@pytest.mark.parametrize(
    ("relpath", "text", "reason"),
    [
        ("memory.numa_stat", "anon N0=1 N1=x\nfile N0=0 N1=0\n", "is not N<node>=<bytes>"),
        ("memory.numa_stat", "file N0=0 N1=0\n", "no anon line"),
        ("memory.high", "lots\n", "neither a number of bytes nor max"),
        ("memory.current", "-1\n", "neither a number of bytes nor max"),
    ],
)
def test_a_malformed_cgroup_file_is_a_warning_and_the_placement_is_left_alone(
    guest, relpath, text, reason
):
    root, plan = guest
    cgroup = f"{root}/sys/fs/cgroup/numafleet.slice/numafleet-kv-low.service"
    with open(f"{cgroup}/{relpath}", "w", encoding="ascii") as handle:
        handle.write(text)
    state = guard.GuardState()
    for dummy in range(3):
        result = _round(root, plan, state)
        state = result.decision.state
    assert [w["path"] for w in result.warnings] == [cgroup]
    assert reason in result.warnings[0]["reason"]
    assert all(a.placement != "kv-low" for a in result.decision.actions)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "Node 1 MemTotal: 100 kB\nNode 1 MemFree: 10 kB\nNode 1 Active(file): 1 kB\n",
            "no Inactive(file) line",
        ),
        ("Node 1 MemTotal: lots kB\n", "MemTotal: is 'lots'"),
        ("", "no MemTotal line"),
    ],
)
def test_a_malformed_node_meminfo_leaves_the_node_out_with_a_warning(guest, text, reason):
    root, plan = guest
    path = f"{root}/sys/devices/system/node/node1/meminfo"
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)
    nodes, warnings = guard.read_nodes(guard.read_path, f"{root}/sys")
    assert [n.id for n in nodes] == [0]
    assert warnings[0]["path"] == path and reason in warnings[0]["reason"]


def test_no_numa_sysfs_is_a_warning_not_an_error(tmp_path):
    nodes, warnings = guard.read_nodes(guard.read_path, str(tmp_path))
    assert nodes == ()
    assert warnings == [
        {
            "path": f"{tmp_path}/devices/system/node/online",
            "reason": "absent: the kernel shows no NUMA nodes",
        }
    ]


def test_an_unreadable_file_is_a_guard_error_naming_it(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(GuardError) as err:
        guard.read_path(str(tmp_path / "dir"))
    assert str(err.value).startswith(f"{tmp_path}/dir: ")


def test_numa_stat_ignores_types_it_does_not_use_wherever_they_appear():
    text = "new_kind N0=5\nanon N0=1 N1=2\nzswap N0=9 N1=9\nfile N0=3 N1=4\n"
    assert guard.parse_numa_stat(text) == {"anon": {0: 1, 1: 2}, "file": {0: 3, 1: 4}}


# --- plan and settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("numafleet.slice", "numafleet.slice"),
        ("numafleet-team\\x2da.slice", "numafleet.slice/numafleet-team\\x2da.slice"),
        ("a-b-c.slice", "a.slice/a-b.slice/a-b-c.slice"),
        ("-.slice", ""),
    ],
)
def test_slice_path_nests_like_systemd(name, path):
    assert guard.slice_path(name) == path


@pytest.mark.parametrize("name", ["a--b.slice", "-a.slice", "a.service", "a/b.slice", ".slice"])
def test_slice_path_refuses_what_is_not_a_slice(name):
    with pytest.raises(GuardError, match="is not a systemd slice name"):
        guard.slice_path(name)


GOOD = {"name": "svc", "unit": "numafleet-svc.service", "mems": [1], "memory_kb": 1024}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"priority": "urgent"},
            "plan placement 'svc'.priority is 'urgent'; use one of low, normal, high",
        ),
        ({"mems": []}, "plan placement 'svc'.mems is [], not a list of node ids"),
        ({"mems": [True]}, "plan placement 'svc'.mems is [True], not a list of node ids"),
        (
            {"unit": "../etc.service"},
            "plan placement 'svc'.unit is '../etc.service', not a unit name",
        ),
        ({"unit": 5}, "plan placement 'svc'.unit is 5"),
        ({"memory_kb": -1}, "plan placement 'svc'.memory_kb is -1"),
        ({"slice": "x--y.slice"}, "slice 'x--y.slice' is not a systemd slice name"),
    ],
)
def test_parse_placements_refuses_bad_entries_naming_them(change, message):
    entry = dict(GOOD, **change)
    with pytest.raises(GuardError) as err:
        guard.parse_placements({"placements": [entry]})
    assert message in str(err.value)
    assert "run site.yml to record a new plan" in str(err.value)


def test_parse_placements_defaults_and_order():
    specs = guard.parse_placements(
        {"placements": [dict(GOOD, name="z"), dict(GOOD, name="a", priority="low", mems=[1, 0, 1])]}
    )
    assert [(s.name, s.priority, s.slice, s.mems) for s in specs] == [
        ("a", "low", "numafleet.slice", (0, 1)),
        ("z", "normal", "numafleet.slice", (1,)),
    ]


def test_parse_placements_refuses_a_duplicate_name():
    with pytest.raises(GuardError, match="two placements named 'svc'"):
        guard.parse_placements({"placements": [GOOD, GOOD]})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"warn_pct": 95},
            "numafleet_memory_warn_pct (95) is above numafleet_memory_act_pct (90.0)",
        ),
        ({"act_pct": 0}, "numafleet_memory_act_pct is 0; set it to a number from 1 to 100"),
        ({"act_pct": "90"}, "numafleet_memory_act_pct is '90'"),
        (
            {"mode": "move"},
            "numafleet_memory_act is 'move'; use one of reclaim, throttle, migrate",
        ),
        ({"act_rounds": 0}, "guard setting act_rounds is 0; set it to an integer from 1 to 1000"),
        ({"bogus": 1}, "unknown guard setting 'bogus'"),
    ],
)
def test_parse_thresholds_refuses_naming_the_setting(values, message):
    with pytest.raises(GuardError) as err:
        guard.parse_thresholds(values)
    assert message in str(err.value)


def test_parse_thresholds_defaults():
    assert guard.parse_thresholds({}) == guard.Thresholds()


def test_parse_thresholds_accepts_migrate():
    assert guard.parse_thresholds({"mode": "migrate"}).mode == "migrate"
    assert guard.Thresholds().warn_pct == 80.0 and guard.Thresholds().act_pct == 90.0


# --- deciding on the guest scenario ----------------------------------------------------------


def test_guest_scenario_reclaims_the_low_placement_after_k_rounds(guest):
    root, plan = guest
    first = _round(root, plan)
    assert first.decision.actions == ()  # one round over: not yet (act_rounds 2)
    (event,) = first.decision.events
    assert (event.node, event.level, event.previous) == (1, "act", "ok")
    assert [name for name, dummy in event.top_users] == ["kv-low", "kv-high", "etl"]
    fields = event.journal_fields()
    assert fields["NUMAFLEET_NODE"] == "1" and fields["NUMAFLEET_LEVEL"] == "act"
    assert fields["NUMAFLEET_TOP_USERS"].startswith("kv-low=")
    second = _round(root, plan, first.decision.state)
    (action,) = second.decision.actions
    node1 = second.nodes[1]
    excess = node1.used_kb * 1024 - int(node1.total_kb * 1024 * 0.9)
    assert (action.action, action.placement, action.node) == ("reclaim", "kv-low", 1)
    assert action.path == "numafleet.slice/numafleet-kv-low.service/memory.reclaim"
    assert action.amount_bytes == excess and action.value == str(excess)
    assert second.decision.events == ()  # still act: no new journal line
    assert action.journal_fields()["NUMAFLEET_AFTER"] == str(excess)


def test_high_is_never_acted_on_even_when_it_is_the_only_user(guest):
    root, plan = guest
    plan["placements"] = [p for p in plan["placements"] if p["name"] == "kv-high"]
    state = guard.GuardState()
    for dummy in range(5):
        result = _round(root, plan, state)
        state = result.decision.state
        assert result.decision.actions == ()


def test_throttle_lowers_memory_high_then_releases_it_below_the_margin(guest, tmp_path):
    root, plan = guest
    thresholds = guard.Thresholds(mode="throttle", act_rounds=1, min_high_bytes=64 * MIB)
    over = _round(root, plan, thresholds=thresholds)
    (action,) = over.decision.actions
    low = [m for m in over.placements if m.name == "kv-low"][0]
    assert (action.action, action.before) == ("throttle", "max")
    assert int(action.value) == low.current_bytes - action.amount_bytes
    assert dict(over.decision.state.throttled) == {"kv-low": (1, None)}
    # between warn - margin (75%) and act: kept throttled, nothing written
    nodes, cgroups, dummy = guard_trees.scenario("calm")
    nodes[1] = guard_trees.node(1, 78.0)
    band_root = guard_trees.write_tree(tmp_path / "band", nodes, cgroups)
    held = _round(band_root, plan, over.decision.state, thresholds)
    assert held.decision.actions == ()
    assert dict(held.decision.state.throttled) == {"kv-low": (1, None)}
    calm_root, dummy = guard_trees.make("calm", tmp_path / "calm")
    calm = _round(calm_root, plan, held.decision.state, thresholds)
    (release,) = calm.decision.actions
    assert (release.action, release.placement, release.value) == ("release", "kv-low", "max")
    assert release.path == "numafleet.slice/numafleet-kv-low.service/memory.high"
    assert calm.decision.state.throttled == ()
    assert [e.level for e in calm.decision.events] == ["ok"]


def test_without_memory_reclaim_the_guard_throttles(guest):
    root, plan = guest
    result = _round(root, plan, thresholds=guard.Thresholds(act_rounds=1), reclaim_available=False)
    assert [a.action for a in result.decision.actions] == ["throttle"]


def test_state_survives_a_json_round_trip(guest):
    root, plan = guest
    state = guard.GuardState()
    for dummy in range(3):
        state = _round(root, plan, state, guard.Thresholds(mode="throttle")).decision.state
    assert guard.parse_state(state.as_dict()) == state


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"over_rounds": [], "levels": {}, "throttled": {}, "actions_total": []},
        {"over_rounds": {}, "levels": {"0": "panic"}, "throttled": {}, "actions_total": []},
    ],
)
def test_a_bad_saved_state_is_refused_with_the_fix(data):
    with pytest.raises(GuardError, match="starts afresh"):
        guard.parse_state(data)


# --- the textfile ----------------------------------------------------------------------------

SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? \S+$'
)


def test_textfile_follows_the_exposition_format(guest):
    root, plan = guest
    state = guard.GuardState()
    for now in (100.0, 115.0):
        result = _round(root, plan, state, now=now)
        state = result.decision.state
    lines = result.textfile.splitlines()
    assert result.textfile.endswith("\n")
    families = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert families == [
        "numafleet_node_memory_used_ratio",
        "numafleet_placement_offnode_share_ratio",
        "numafleet_guard_actions_total",
        "numafleet_guard_last_run_timestamp_seconds",
    ]
    assert "# TYPE numafleet_guard_actions_total counter" in lines
    for line in lines:
        assert line.startswith(("# HELP ", "# TYPE ")) or SAMPLE.match(line)
    assert (
        'numafleet_guard_actions_total{node="1",action="reclaim",placement="kv-low"} 1.0' in lines
    )
    assert "numafleet_guard_last_run_timestamp_seconds 115.0" in lines
    assert 'numafleet_node_memory_used_ratio{node="1"} ' in result.textfile


def test_textfile_escapes_label_values():
    spec = guard.PlacementSpec('a"b\\c\nd', "u.service", "numafleet.slice", (0,), 0, "normal")
    memory = guard.PlacementMemory(spec.name, "x", True, 10, None, 0, ((0, 5), (1, 5)), ())
    text = guard.as_textfile((), (memory,), (spec,), guard.GuardState(), 1.0)
    assert 'numafleet_placement_offnode_share_ratio{placement="a\\"b\\\\c\\nd"} 0.5' in text
    for line in text.splitlines():
        assert line.startswith("#") or SAMPLE.match(line)


def test_throttle_skips_a_placement_already_under_the_floor_and_takes_the_next():
    specs = (
        guard.PlacementSpec("small", "s.service", "numafleet.slice", (0,), 0, "low"),
        guard.PlacementSpec("big", "b.service", "numafleet.slice", (0,), 0, "normal"),
    )
    memories = (
        guard.PlacementMemory(
            "small", "numafleet.slice/s.service", True, 32 * MIB, None, 0, ((0, 32 * MIB),), ()
        ),
        guard.PlacementMemory(
            "big", "numafleet.slice/b.service", True, 900 * MIB, None, 0, ((0, 900 * MIB),), ()
        ),
    )
    node = guard.NodeMemory(0, 1_000_000, 50_000, 0)  # 95% used
    thresholds = guard.Thresholds(mode="throttle", act_rounds=1, min_high_bytes=64 * MIB)
    decision = guard.decide((node,), memories, specs, guard.GuardState(), thresholds)
    (action,) = decision.actions
    assert (action.placement, action.action) == ("big", "throttle")
    assert action.amount_bytes == 900 * MIB - int(action.value) > 0
    assert dict(decision.state.throttled) == {"big": (0, None)}


def test_low_goes_before_normal_and_normal_takes_what_is_left():
    specs = tuple(
        guard.PlacementSpec(name, f"{name}.service", "numafleet.slice", (0,), 0, priority)
        for name, priority in (("hi", "high"), ("lo", "low"), ("mid", "normal"))
    )
    memories = tuple(
        guard.PlacementMemory(
            name, f"numafleet.slice/{name}.service", True, size, None, 0, ((0, size),), ()
        )
        for name, size in (("hi", 500 * MIB), ("lo", 10 * MIB), ("mid", 500 * MIB))
    )
    node = guard.NodeMemory(0, 1_000_000, 50_000, 0)  # 95% used: 5% of 1e6 kB over act
    thresholds = guard.Thresholds(act_rounds=1)
    decision = guard.decide((node,), memories, specs, guard.GuardState(), thresholds)
    excess = 950_000 * 1024 - int(1_000_000 * 1024 * 0.9)
    assert [(a.placement, a.amount_bytes) for a in decision.actions] == [
        ("lo", 10 * MIB),
        ("mid", excess - 10 * MIB),
    ]
    small_step = guard.Thresholds(act_rounds=1, max_step_bytes=4 * MIB)
    decision = guard.decide((node,), memories, specs, guard.GuardState(), small_step)
    assert [(a.placement, a.amount_bytes) for a in decision.actions] == [("lo", 4 * MIB)]


def test_sixteen_placements_on_disk_act_on_the_largest_low_one_of_the_hot_node(tmp_path):
    root, plan = guard_trees.make("sixteen", tmp_path / "sixteen")
    state = guard.GuardState()
    for now in (0.0, 15.0):
        result = _round(root, plan, state, now=now)
        state = result.decision.state
    assert result.warnings == ()
    assert [m.running for m in result.placements] == [True] * 16
    (action,) = result.decision.actions
    assert (action.node, action.placement, action.action) == (1, "svc-15", "reclaim")
    node1 = result.nodes[1]
    assert action.amount_bytes == node1.used_kb * 1024 - int(node1.total_kb * 1024 * 0.9)
    assert result.textfile.count("numafleet_placement_offnode_share_ratio{") == 16


def test_round_report_is_json_ready_and_complete(guest):
    root, plan = guest
    state = guard.GuardState()
    for dummy in range(2):
        result = _round(root, plan, state)
        state = result.decision.state
    report = json.loads(json.dumps(result.as_dict(guard.parse_placements(plan))))
    assert [n["id"] for n in report["nodes"]] == [0, 1]
    assert report["nodes"][1]["hugepages"][0] == {"size_kb": 2048, "total": 48, "free": 16}
    high = [p for p in report["placements"] if p["name"] == "kv-high"][0]
    assert (high["priority"], high["mems"], high["low_bytes"]) == ("high", [1], 600 * MIB)
    assert high["bytes_by_node"] == {"0": 6 * MIB, "1": 600 * MIB}
    assert [(a["action"], a["placement"]) for a in report["actions"]] == [("reclaim", "kv-low")]
    assert report["state"]["over_rounds"] == {"0": 0, "1": 2}


@pytest.mark.parametrize(
    ("level", "previous", "priority", "words"),
    [
        ("warn", "ok", "4", "over the warn threshold; top users (bytes on the node): a=5,b=3"),
        ("act", "warn", "4", "over the act threshold; top users (bytes on the node): a=5,b=3"),
        (
            "ok",
            "warn",
            "5",
            "back below the warn threshold; top users (bytes on the node): a=5,b=3",
        ),
    ],
)
def test_event_journal_fields(level, previous, priority, words):
    event = guard.Event(1, level, previous, 0.8234, (("a", 5), ("b", 3)))
    fields = event.journal_fields()
    assert fields["MESSAGE"] == f"numafleet-guard: NUMA node 1 memory 82.3% used, {words}"
    assert (fields["PRIORITY"], fields["NUMAFLEET_RATIO"]) == (priority, "0.8234")
    assert (fields["NUMAFLEET_LEVEL"], fields["NUMAFLEET_PREVIOUS_LEVEL"]) == (level, previous)
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", key) for key in fields)
