"""Per-placement resource limits: the placement keys (memory_limit, cpu_weight, io_weight,
tasks_max) are checked before the gate, carried by the plan, rendered into the service or the
drop-in, changed one unit at a time, and named in the change plan; who the service runs as."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_hosts import synthetic

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import effective, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import (
    change_lines,
    change_plan,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    PlacementError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
    MANIFEST_PATHS,
    digest,
)

NUMA = synthetic(cpus_per_node=(8, 8), mem_gb=(64, 64))
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 10}
GIB = 1 << 30


def svc(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 2, "memory": "1G", "user": "app"}
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not None}


def plan_of(placements, before=None) -> dict:
    recorded = None
    if before is not None:
        recorded = parse_recorded("h", {"state": "present", "plan": before}, "/p")
    return plan_host(
        "h",
        copy.deepcopy(NUMA),
        {"gpus": []},
        copy.deepcopy(placements),
        [],
        POLICY,
        recorded=recorded,
    )


def render(plan: dict) -> dict:
    return units.render_files(plan, units.DEFAULT_HEADER, True, units.DEFAULT_UNIT_DIR)


def service_lines(text: str) -> list:
    section = text.split("[Service]\n", 1)[1].split("\n\n", 1)[0]
    return section.splitlines()


UNIT = "/etc/systemd/system/numafleet-a.service"
DROPIN = "/etc/systemd/system/vllm.service.d/50-numafleet.conf"
PROPS = ("MemoryMax", "MemoryHigh", "CPUWeight", "IOWeight", "TasksMax")


@pytest.mark.parametrize(
    ("keys", "planned", "lines"),
    [
        ({"memory_limit": "max"}, {"memory_max_bytes": GIB}, [f"MemoryMax={GIB}"]),
        ({"memory_limit": "high"}, {"memory_high_bytes": GIB}, [f"MemoryHigh={GIB}"]),
        ({"cpu_weight": 200}, {"cpu_weight": 200}, ["CPUWeight=200"]),
        ({"io_weight": 1}, {"io_weight": 1}, ["IOWeight=1"]),
        ({"tasks_max": 512}, {"tasks_max": "512"}, ["TasksMax=512"]),
        ({"tasks_max": "25%"}, {"tasks_max": "25%"}, ["TasksMax=25%"]),
        ({"tasks_max": "infinity"}, {"tasks_max": "infinity"}, ["TasksMax=infinity"]),
        (
            {"memory_limit": "max", "cpu_weight": 10000, "io_weight": 50, "tasks_max": "64"},
            {"memory_max_bytes": GIB, "cpu_weight": 10000, "io_weight": 50, "tasks_max": "64"},
            [f"MemoryMax={GIB}", "CPUWeight=10000", "IOWeight=50", "TasksMax=64"],
        ),
    ],
)
def test_each_limit_is_planned_and_rendered_in_the_service_and_the_dropin(keys, planned, lines):
    plan = plan_of([svc("a", **keys), svc("b", user=None, exec=None, unit="vllm.service", **keys)])
    a, b = plan["placements"]
    assert a["limits"] == planned == b["limits"]
    files = render(plan)
    for path in (UNIT, DROPIN):
        rendered = service_lines(files[path])
        # right after the pinning (LimitMEMLOCK=), in PROPERTIES order, each once
        start = rendered.index("LimitMEMLOCK=infinity") + 1
        assert rendered[start : start + len(lines)] == lines, (path, rendered)
        assert len([line for line in rendered if line.partition("=")[0] in PROPS]) == len(lines)


def test_no_limit_keys_leave_the_plan_and_the_unit_as_before():
    for keys in ({}, {"memory_limit": "none"}):
        plan = plan_of([svc("a", **keys)])
        assert "limits" not in plan["placements"][0]
        text = render(plan)[UNIT]
        assert not any(
            word in text for word in ("MemoryMax", "MemoryHigh", "CPUWeight", "IOWeight", "Tasks")
        )
        lines = service_lines(text)
        assert lines[lines.index("LimitMEMLOCK=infinity") + 1] == "Restart=on-failure"


def test_memory_limit_is_the_budget_without_the_hugepages():
    plan = plan_of(
        [svc("a", memory="512M", hugepages={"size": "2M", "count": 32}, memory_limit="max")]
    )
    assert plan["placements"][0]["limits"] == {"memory_max_bytes": 512 << 20}
    assert f"MemoryMax={512 << 20}" in render(plan)[UNIT]


@pytest.mark.parametrize(
    ("keys", "fragment"),
    [
        (
            {"memory": None, "memory_limit": "max"},
            "numafleet_placements[0] (a).memory_limit: max limits the service to its memory "
            "budget, and this placement has no memory:; add memory:",
        ),
        ({"memory_limit": "hard"}, "numafleet_placements[0] (a).memory_limit: 'hard' is not one"),
        ({"memory_limit": True}, "memory_limit: True is not one of none, high, max"),
        ({"cpu_weight": 0}, "numafleet_placements[0] (a).cpu_weight: 0 is not a weight 1-10000"),
        ({"cpu_weight": 10001}, "cpu_weight: 10001 is not a weight 1-10000 (CPUWeight="),
        ({"io_weight": "100"}, "io_weight: '100' is not a weight 1-10000 (IOWeight="),
        ({"cpu_weight": True}, "cpu_weight: True is not a weight"),
        ({"tasks_max": 0}, "numafleet_placements[0] (a).tasks_max: 0 is not a task limit"),
        ({"tasks_max": "0%"}, "tasks_max: '0%' is not a task limit (TasksMax=)"),
        ({"tasks_max": "101%"}, "tasks_max: '101%' is not a task limit"),
        ({"tasks_max": "many"}, "write a count >= 1 (e.g. 512), a percentage"),
        ({"tasks_max": 1.5}, "tasks_max: 1.5 is not a task limit"),
    ],
)
def test_bad_limits_are_refused_naming_host_placement_key_and_fix(keys, fragment):
    with pytest.raises(PlacementError) as err:
        plan_of([svc("a", **keys)])
    assert str(err.value).startswith("host h: ") or "h" in str(err.value)
    assert fragment in str(err.value)


def test_a_placement_without_user_runs_as_root_and_the_plan_says_so():
    plan = plan_of(
        [svc("a", user=None), svc("b"), svc("c", user=None, exec=None, unit="vllm.service")]
    )
    a, b, c = plan["placements"]
    root = [w for w in plan["warnings"] if "runs as root" in w]
    assert root == [
        "placement a: numafleet-a.service runs as root (no user:): set user: to the account the "
        "service should run as"
    ]
    assert b["warnings"] == [] and c["warnings"] == []  # a drop-in: the vendor unit's User=
    summary = plan_summary(plan)
    assert f"a {a['nodes'] and 'node'}{a['node']} cpus " in summary
    assert summary.split("; ")[0].endswith(" as root")  # a's part, and only a's
    assert summary.count(" as root") == 1
    assert "User=" not in render(plan)[UNIT]


def test_changing_one_placements_limit_rewrites_only_its_unit_and_says_why():
    services = [svc("a"), svc("b", memory_limit="max")]
    first = plan_of(services)
    files = render(first)
    recorded = {path: digest(text) for path, text in files.items()}
    recorded.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
    changed = [svc("a", cpu_weight=300), svc("b", memory_limit="high")]
    new = plan_of(changed, first)
    new_files = render(new)
    differ = sorted(path for path in new_files if new_files[path] != files.get(path))
    assert differ == [
        "/etc/systemd/system/numafleet-a.service",
        "/etc/systemd/system/numafleet-b.service",
    ]
    # placements keep their CPUs and memory: a limit is not a resource request
    assert [e["cpus"] for e in new["placements"]] == [e["cpus"] for e in first["placements"]]
    result = change_plan("h", first, new, new_files, {}, recorded)
    assert result["units"]["restart"] == ["numafleet-a.service", "numafleet-b.service"]
    assert result["units"]["restart_reasons"] == {
        "numafleet-a.service": "its limits change: CPUWeight (none) -> 300",
        "numafleet-b.service": (
            f"its limits change: MemoryMax {GIB} -> (none), MemoryHigh (none) -> {GIB}"
        ),
    }
    lines = change_lines(result)
    assert "  why numafleet-a.service restarts: its limits change: CPUWeight (none) -> 300" in lines

    only_b = plan_of([svc("a"), svc("b", memory_limit="max", tasks_max=99)], first)
    only_files = render(only_b)
    assert sorted(p for p in only_files if only_files[p] != files.get(p)) == [
        "/etc/systemd/system/numafleet-b.service"
    ]
    again = change_plan("h", first, only_b, only_files, {}, recorded)
    assert again["units"]["restart"] == ["numafleet-b.service"]


def test_an_admin_dropin_overriding_a_limit_is_reported(tmp_path):
    plan = plan_of([svc("a", memory_limit="max", cpu_weight=200)])
    own = render(plan)
    override = tmp_path / "etc/systemd/system/numafleet-a.service.d/override.conf"
    override.parent.mkdir(parents=True)
    override.write_text("[Service]\nMemoryMax=infinity\n")
    entries, foreign = effective.evaluate(str(tmp_path), own)
    props = entries[0]["properties"]
    assert props["MemoryMax"]["planned"] == str(GIB) and props["CPUWeight"]["ok"]
    (item,) = foreign
    assert (item.property, item.planned, item.effective) == ("MemoryMax", str(GIB), "infinity")
    assert "MemoryMax" in effective.SHOW_PROPERTIES and "CPUWeight" in effective.SHOW_PROPERTIES


def test_a_live_limit_that_differs_is_reported():
    plan = plan_of([svc("a", memory_limit="high")])
    own = render(plan)
    entry = {
        "unit": "numafleet-a.service",
        "properties": {"MemoryHigh": {"planned": str(GIB), "ok": True}},
    }
    shown = {"numafleet-a.service": {"LoadState": "loaded", "MemoryHigh": "infinity"}}
    (item,) = effective.compare_live([entry], shown, set(own))
    assert (item.property, item.effective) == ("MemoryHigh", "infinity")
    shown["numafleet-a.service"]["MemoryHigh"] = str(GIB)
    assert effective.compare_live([entry], shown, set(own)) == []


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=20000),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["none", "high", "max", "infinity", "50%", "0%", "100%", "7"]),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    memory=st.one_of(st.none(), st.sampled_from(["1G", "512M"])),
    memory_limit=VALUES,
    cpu_weight=VALUES,
    io_weight=VALUES,
    tasks_max=VALUES,
)
def test_any_limit_values_plan_and_render_or_are_refused(
    memory, memory_limit, cpu_weight, io_weight, tasks_max
):
    keys = {
        "memory": memory,
        "memory_limit": memory_limit,
        "cpu_weight": cpu_weight,
        "io_weight": io_weight,
        "tasks_max": tasks_max,
    }
    try:
        plan = plan_of([svc("a", **keys)])
    except PlacementError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert "numafleet_placements[0] (a)." in message
        return
    try:
        text = render(plan)[UNIT]
    except NumaTuneError as exc:  # a planned limit must render
        raise AssertionError(f"planned limits do not render: {exc}") from None
    limits = plan["placements"][0].get("limits") or {}
    for key, prop in (("cpu_weight", "CPUWeight"), ("io_weight", "IOWeight")):
        assert (f"{prop}=" in text) == (key in limits)
