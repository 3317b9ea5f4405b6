"""Placement priorities: the placement and tenant key priority (high | normal | low) is checked
before the gate, a placement takes its tenant's when it sets none (else normal), the plan carries
it only when it is not normal, MPS daemons take the highest of their clients, a high placement's
unit gets MemoryLow= of its budget and its slices the sum above it, and a change names why the
unit restarts."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st
from synthetic_hosts import synthetic, synthetic_gpu

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    effective,
    priority,
    units,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import (
    change_lines,
    change_plan,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    UnitRenderError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.placements import (
    parse_placements,
    parse_tenants,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
    MANIFEST_PATHS,
    digest,
)

NUMA = synthetic(cpus_per_node=(8, 8), mem_gb=(64, 64))
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 10}
GIB = 1 << 30
UNIT_DIR = "/etc/systemd/system"
TOP = f"{UNIT_DIR}/numafleet.slice"


def svc(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 2, "memory": "1G", "user": "app"}
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not None}


def plan_of(placements, tenants=(), before=None, numa=NUMA, gpus=None) -> dict:
    recorded = None
    if before is not None:
        recorded = parse_recorded("h", {"state": "present", "plan": before}, "/p")
    return plan_host(
        "h",
        copy.deepcopy(numa),
        copy.deepcopy(gpus or {"gpus": []}),
        copy.deepcopy(list(placements)),
        copy.deepcopy(list(tenants)),
        POLICY,
        recorded=recorded,
    )


def render(plan: dict) -> dict:
    return units.render_files(plan, units.DEFAULT_HEADER, True, units.DEFAULT_UNIT_DIR)


def section(text: str, name: str) -> list:
    return text.split(f"[{name}]\n", 1)[1].split("\n\n", 1)[0].splitlines()


# --- parsing -----------------------------------------------------------------------------------


def parsed(placements, tenants=()) -> list:
    return parse_placements("h", list(placements), parse_tenants("h", list(tenants)))


def test_a_placement_takes_its_own_priority_else_its_tenants_else_normal():
    tenants = [{"name": "gold", "priority": "high"}, {"name": "plain"}]
    got = parsed(
        [
            svc("own", priority="low"),
            svc("none"),
            svc("gold-inherits", tenant="gold"),
            svc("gold-own", tenant="gold", priority="low"),
            svc("plain-inherits", tenant="plain"),
        ],
        tenants,
    )
    assert [p.priority for p in got] == ["low", "normal", "high", "low", "normal"]
    assert [t.priority for t in parse_tenants("h", tenants)] == ["high", None]


@pytest.mark.parametrize(
    "value", ["High", "urgent", "", " high", 1, True, None.__class__, ["high"]]
)
def test_a_bad_placement_priority_is_refused_naming_host_variable_and_values(value):
    with pytest.raises(PlacementError) as err:
        parsed([svc("a", priority=value)])
    assert str(err.value).startswith(
        f"host h: numafleet_placements[0] (a).priority: {value!r} is not a priority; write one "
        "of high, normal, low (default normal"
    )


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["high", "normal", "low", "HIGH", "Low", "high ", "medium"]),
    st.lists(st.sampled_from(["high", "low"]), max_size=2),
)


@given(VALUES)
def test_parse_priority_takes_the_three_names_and_refuses_everything_else(value):
    if value is None:
        assert priority.parse_priority("h", "w", value) is None
    elif isinstance(value, str) and value in priority.PRIORITIES:
        assert priority.parse_priority("h", "w", value) == value
    else:
        with pytest.raises(PlacementError) as err:
            priority.parse_priority("h", "w", value)
        assert str(err.value).startswith(f"host h: w.priority: {value!r} is not a priority")


def test_a_bad_tenant_priority_is_refused_naming_the_tenant():
    with pytest.raises(PlacementError) as err:
        parse_tenants("h", [{"name": "gold", "priority": "gold"}])
    assert str(err.value).startswith(
        "host h: numafleet_tenants[0] (gold).priority: 'gold' is not a priority; write one of "
        "high, normal, low"
    )


@pytest.mark.parametrize("memory", [None, 0, "0"])
def test_a_high_placement_without_a_memory_budget_is_refused(memory):
    with pytest.raises(PlacementError) as err:
        plan_of([svc("a", memory=memory, priority="high")])
    assert str(err.value) == (
        "host h: numafleet_placements[0] (a).priority: high protects the placement's memory "
        "budget from reclaim (MemoryLow=), and this placement has no memory:; add memory: (e.g. "
        "memory: 64G), or write priority: normal"
    )


def test_a_placement_of_a_high_tenant_without_memory_is_planned_with_a_warning():
    plan = plan_of([svc("a", memory=None, tenant="gold")], [{"name": "gold", "priority": "high"}])
    (entry,) = plan["placements"]
    assert entry["priority"] == "high"
    assert any("no MemoryLow= protects its memory" in w for w in entry["warnings"])
    files = render(plan)
    assert not any("MemoryLow" in text for text in files.values())


# --- the plan ----------------------------------------------------------------------------------


def test_the_plan_carries_priority_only_when_it_is_not_normal():
    plan = plan_of(
        [svc("h", priority="high"), svc("n", priority="normal"), svc("l", priority="low"), svc("d")]
    )
    got = {e["name"]: e.get("priority", "(absent)") for e in plan["placements"]}
    assert got == {"h": "high", "n": "(absent)", "l": "low", "d": "(absent)"}
    without = plan_of([svc("n"), svc("d")])
    assert plan_of([svc("n", priority="normal"), svc("d")]) == without


def test_mps_daemons_take_the_highest_priority_of_their_clients():
    numa = synthetic(cpus_per_node=(8, 8), mem_gb=(64, 64))
    gpus = {"gpus": [synthetic_gpu("0000:18:00.0", 0), synthetic_gpu("0000:98:00.0", 1)]}
    mps = {"active_thread_percentage": 50}

    def daemon_priorities(*clients) -> list:
        plan = plan_of(
            [svc(n, gpus=["0000:18:00.0"], mps=mps, priority=pr) for n, pr in clients],
            numa=numa,
            gpus=gpus,
        )
        return [d.get("priority", "(absent)") for d in plan["mps_daemons"]]

    assert daemon_priorities(("a", "low"), ("b", "high"), ("c", None)) == ["high"]
    assert daemon_priorities(("a", "low"), ("b", None)) == ["(absent)"]  # normal: no key
    assert daemon_priorities(("a", "low"), ("b", "low")) == ["low"]


def test_highest_and_resolve():
    assert priority.highest([]) == "normal"
    assert priority.highest(["low", "normal"]) == "normal"
    assert priority.highest(["low", "high", "normal"]) == "high"
    assert priority.resolve(None, None) == "normal"
    assert priority.resolve(None, "low") == "low"
    assert priority.resolve("high", "low") == "high"


# --- units -------------------------------------------------------------------------------------


def test_a_high_placement_gets_memory_low_of_its_budget_without_hugepages():
    plan = plan_of(
        [
            svc("a", memory="8G", hugepages={"size": "2M", "count": 64}, priority="high"),
            svc("b", user=None, exec=None, unit="vllm.service", memory="2G", priority="high"),
            svc("low", priority="low"),
            svc("plain"),
        ]
    )
    files = render(plan)
    assert f"MemoryLow={8 * GIB}" in section(files[f"{UNIT_DIR}/numafleet-a.service"], "Service")
    dropin = files[f"{UNIT_DIR}/vllm.service.d/50-numafleet.conf"]
    assert f"MemoryLow={2 * GIB}" in section(dropin, "Service")
    for name in ("low", "plain"):
        assert "MemoryLow" not in files[f"{UNIT_DIR}/numafleet-{name}.service"]
    # numafleet.slice, the parent of every placement's slice, grants the sum of both
    assert section(files[TOP], "Slice") == [f"MemoryLow={10 * GIB}"]


def test_tenant_slices_grant_the_sum_of_their_high_placements():
    tenants = [{"name": "gold", "priority": "high", "memory_max": "32G"}, {"name": "plain"}]
    plan = plan_of(
        [
            svc("g1", tenant="gold", memory="4G"),
            svc("g2", tenant="gold", memory="2G"),
            svc("g3", tenant="gold", memory="1G", priority="low"),
            svc("p1", tenant="plain", memory="3G", priority="high"),
            svc("p2", tenant="plain"),
            svc("top", memory="5G", priority="high"),
        ],
        tenants,
    )
    files = render(plan)
    gold = section(files[f"{UNIT_DIR}/numafleet-gold.slice"], "Slice")
    assert gold[-2:] == [f"MemoryMax={32 * GIB}", f"MemoryLow={6 * GIB}"]
    plain = section(files[f"{UNIT_DIR}/numafleet-plain.slice"], "Slice")
    assert plain[-1] == f"MemoryLow={3 * GIB}"
    assert section(files[TOP], "Slice") == [f"MemoryLow={14 * GIB}"]


def test_without_high_placements_no_slice_or_unit_gains_memory_low():
    tenants = [{"name": "t", "priority": "low"}]
    before = render(plan_of([svc("a", tenant="t"), svc("b")], [{"name": "t"}]))
    files = render(plan_of([svc("a", tenant="t"), svc("b", priority="low")], tenants))
    assert files == before
    assert TOP not in files and not any("MemoryLow" in text for text in files.values())


def test_a_malformed_plan_priority_is_refused_at_render():
    plan = plan_of([svc("a")])
    plan["placements"][0]["priority"] = "urgent"
    with pytest.raises(UnitRenderError) as err:
        render(plan)
    assert "plan placements[0] (a).priority is 'urgent', not one of high, normal, low" in str(
        err.value
    )


def test_memory_low_is_compared_live_in_bytes():
    assert "MemoryLow" in effective.SHOW_PROPERTIES
    entry = {
        "unit": "numafleet-a.service",
        "properties": {"MemoryLow": {"planned": str(GIB), "ok": True}},
    }
    shown = {"numafleet-a.service": {"LoadState": "loaded", "MemoryLow": "0"}}
    (item,) = effective.compare_live([entry], shown, set())
    assert (item.property, item.planned, item.effective) == ("MemoryLow", str(GIB), "0")
    shown["numafleet-a.service"]["MemoryLow"] = str(GIB)
    assert effective.compare_live([entry], shown, set()) == []


def test_an_admin_dropin_lowering_memory_low_is_reported(tmp_path):
    own = render(plan_of([svc("a", priority="high")]))
    override = tmp_path / "etc/systemd/system/numafleet-a.service.d/override.conf"
    override.parent.mkdir(parents=True)
    override.write_text("[Service]\nMemoryLow=0\n")
    dummy, foreign = effective.evaluate(str(tmp_path), own)
    assert [(i.unit, i.property, i.planned, i.effective) for i in foreign] == [
        ("numafleet-a.service", "MemoryLow", str(GIB), "0")
    ]


# --- changes -----------------------------------------------------------------------------------


def test_a_priority_change_restarts_only_its_unit_and_says_why():
    first = plan_of([svc("a", memory="2G"), svc("b", priority="high"), svc("c")])
    files = render(first)
    recorded = {path: digest(text) for path, text in files.items()}
    recorded.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
    new = plan_of(
        [
            svc("a", memory="2G", priority="high"),
            svc("b", cpu_weight=200),
            svc("c", priority="low"),
        ],
        before=first,
    )
    assert [e["cpus"] for e in new["placements"]] == [e["cpus"] for e in first["placements"]]
    new_files = render(new)
    result = change_plan("h", first, new, new_files, {}, recorded)
    # c: low renders nothing, so its unit is unchanged and it does not restart
    assert result["units"]["restart"] == ["numafleet-a.service", "numafleet-b.service"]
    assert result["units"]["restart_reasons"] == {
        "numafleet-a.service": f"its priority changes: normal -> high (MemoryLow={2 * GIB})",
        "numafleet-b.service": (
            "its limits change: CPUWeight (none) -> 200; its priority changes: high -> normal "
            "(no MemoryLow=)"
        ),
    }
    # numafleet.slice now grants a's 2G instead of b's 1G
    assert result["units"]["slices"]["changed"] == ["numafleet.slice"]
    lines = change_lines(result)
    assert (
        f"  why numafleet-a.service restarts: its priority changes: normal -> high "
        f"(MemoryLow={2 * GIB})"
    ) in lines


def test_the_last_high_placement_going_removes_numafleet_slice():
    first = plan_of([svc("a", priority="high")])
    files = render(first)
    assert TOP in files
    recorded = {path: digest(text) for path, text in files.items()}
    recorded.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
    new = plan_of([svc("a")], before=first)
    new_files = render(new)
    assert TOP not in new_files
    result = change_plan("h", first, new, new_files, {}, recorded)
    assert result["units"]["slices"]["removed"] == ["numafleet.slice"]
