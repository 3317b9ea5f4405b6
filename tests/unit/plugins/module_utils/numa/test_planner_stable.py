"""Stable plans: a plan made from the recorded one keeps every placement whose request did not
change (node, CPUs, memory nodes, GPUs, MIG slot, MPS share), moves the others with a reason, and
refuses a corrupt or foreign recording. Hypothesis drives random edit sequences."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_hosts import synthetic, synthetic_gpu

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import PlanError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.units import plan_record_text

POLICY = {"reserved_cpus": "", "memory_headroom_pct": 10}
PATH = "/etc/numafleet/plan.json"
# 2 nodes x 24 CPUs (SMT 2), 64 GiB each; two GPUs per node.
GPUS = {
    "gpus": [
        synthetic_gpu("0000:17:00.0", 0),
        synthetic_gpu("0000:31:00.0", 0),
        synthetic_gpu("0000:b1:00.0", 1),
        synthetic_gpu("0000:ca:00.0", 1),
    ]
}


def host(**changes) -> dict:
    return synthetic(cpus_per_node=(24, 24), mem_gb=(64, 64), **changes)


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "user": "app", "cpus": 4, "memory": "2G"}
    entry.update(changes)
    return entry


def recorded(plan: dict) -> dict:
    """numa_facts' numafleet_recorded after an apply of plan (the file's JSON read back)."""
    return {"state": "present", "plan": json.loads(plan_record_text(plan)), "error": None}


def make(placements, before=None, numa=None, gpus=None, policy=None, name="h") -> dict:
    kept = None if before is None else parse_recorded(name, recorded(before), PATH)
    return plan_host(
        name,
        copy.deepcopy(numa or host()),
        copy.deepcopy(gpus if gpus is not None else GPUS),
        copy.deepcopy(placements),
        [],
        policy or POLICY,
        recorded=kept,
    )


def where(plan: dict) -> dict:
    """name -> (nodes, cpus, mems, GPU addresses, MIG slot, MPS pipe) of every placement."""
    out = {}
    for entry in plan["placements"]:
        mig = entry["gpus"][0]["mig"] if entry["gpus"] else None
        out[entry["name"]] = (
            entry["nodes"],
            entry["cpus"],
            entry["mems"],
            [g["address"] for g in entry["gpus"]],
            None if mig is None else (mig["profile"], mig["placement_start"]),
            (entry["mps"] or {}).get("pipe_dir"),
        )
    return out


SERVICES = [
    p("llm", gpus=2, cpus=8, memory="16G"),
    p("embed", gpus=1, cpus=4),
    p("cache", cpus=2),  # CPU only
    p("tail", cpus=6),
]


def test_resizing_one_placement_moves_no_other():
    numa = synthetic(cpus_per_node=(8, 12), mem_gb=(64, 64))
    services = [p("a"), p("b"), p("c", cpus=2)]
    first = make(services, numa=numa, gpus={})
    grown = copy.deepcopy(services)
    grown[0]["cpus"] = 8
    fresh = make(grown, numa=numa, gpus={})  # from scratch: b hops from node 0 to node 1
    assert (where(first)["b"][0], where(fresh)["b"][0]) == ([0], [1])
    stable = make(grown, before=first, numa=numa, gpus={})
    for name in ("b", "c"):
        assert where(stable)[name] == where(first)[name], name
    assert stable["stability"] == {
        "a": "its request changed (cpus 4 -> 8)",
        "b": "kept",
        "c": "kept",
    }


def test_a_changed_placement_stays_on_its_node_when_it_fits():
    first = make(SERVICES)
    grown = copy.deepcopy(SERVICES)
    grown[1]["cpus"] = 8
    stable = make(grown, before=first)
    assert where(stable)["embed"][0] == where(first)["embed"][0]
    assert set(where(first)["embed"][1]) <= set(where(stable)["embed"][1])


def test_removing_and_reordering_move_no_other():
    first = make(SERVICES)
    removed = make(SERVICES[1:], before=first)
    assert {n: where(removed)[n] for n in where(removed)} == {
        n: where(first)[n] for n in ("embed", "cache", "tail")
    }
    reordered = make(list(reversed(SERVICES)), before=first)
    assert where(reordered) == where(first)
    assert set(reordered["stability"].values()) == {"kept"}
    # the plan lists placements in declaration order whatever was kept first
    assert [e["name"] for e in reordered["placements"]] == [s["name"] for s in reversed(SERVICES)]


def test_a_new_placement_is_planned_around_the_kept_ones():
    first = make(SERVICES[2:])
    more = make(SERVICES[:1] + SERVICES[2:], before=first)
    assert where(more)["cache"] == where(first)["cache"]
    assert where(more)["tail"] == where(first)["tail"]
    assert more["stability"]["llm"] == "new"
    taken = set(where(more)["cache"][1]) | set(where(more)["tail"][1])
    assert taken.isdisjoint(where(more)["llm"][1])


def test_an_unchanged_plan_is_kept_exactly():
    first = make(SERVICES)
    again = make(SERVICES, before=first)
    assert {k: v for k, v in again.items() if k != "stability"} == {
        k: v for k, v in first.items() if k != "stability"
    }


def test_repack_is_deterministic():
    assert make(SERVICES) == make(SERVICES)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda numa, gpus, policy: policy.update(reserved_cpus="0-1"), "is now in"),
        (
            lambda numa, gpus, policy: gpus["gpus"].pop(2),
            "its GPU 0000:b1:00.0 is gone",
        ),
    ],
)
def test_a_kept_placement_that_no_longer_fits_moves_with_the_reason(change, reason):
    numa, gpus, policy = host(), copy.deepcopy(GPUS), dict(POLICY)
    first = make(SERVICES, numa=numa, gpus=gpus, policy=policy)
    change(numa, gpus, policy)
    again = make(SERVICES, before=first, numa=numa, gpus=gpus, policy=policy)
    moved = {name: why for name, why in again["stability"].items() if why != "kept"}
    assert moved and all(reason in why for why in moved.values()), moved
    for name, why in again["stability"].items():
        if why == "kept":
            assert where(again)[name] == where(first)[name]


def test_offline_cpu_moves_only_its_placement():
    first = make(SERVICES)
    cpu = where(first)["cache"][1][0]
    numa = host(offline=(cpu,))
    again = make(SERVICES, before=first, numa=numa)
    assert again["stability"]["cache"] == f"its CPU {cpu} is offline"
    assert cpu not in where(again)["cache"][1]
    for name in ("llm", "embed", "tail"):
        assert where(again)[name] == where(first)[name]


def test_mps_share_and_mig_slot_are_kept():
    mig = {
        "mode_current": "enabled",
        "mode_pending": "enabled",
        "supported_profiles": [
            {"name": "1g.10gb", "id": 19, "memory_mib": 9856, "placements": [
                {"start": s, "size": 1} for s in range(7)]},
        ],
        "gpu_instances": [],
    }  # fmt: skip
    gpus = copy.deepcopy(GPUS)
    gpus["gpus"][0]["mig"] = mig
    services = [
        p("a", gpus=1, mps={"active_thread_percentage": 50}),
        p("b", gpus=1, mps={"active_thread_percentage": 50}),
        p("m1", mig_profile="1g.10gb", cpus=2),
        p("m2", mig_profile="1g.10gb", cpus=2),
    ]
    first = make(services, gpus=gpus)
    again = make(services[1:], before=first, gpus=gpus)
    for name in ("b", "m1", "m2"):
        assert where(again)[name] == where(first)[name], name
    # the MPS daemon did not change although a client left
    (daemon_before,) = [d for d in first["mps_daemons"] if not d["mig"]]
    (daemon_after,) = [d for d in again["mps_daemons"] if not d["mig"]]
    assert (daemon_after["cpus"], daemon_after["mems"]) == (
        daemon_before["cpus"],
        daemon_before["mems"],
    )


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"state": "invalid", "error": "is not JSON (x)"}, "is not JSON (x)"),
        ({"state": "present", "plan": {"hello": 1}}, "is not a plan of numafleet.tuning"),
        (
            {"state": "present", "plan": {"version": 1, "host": "other", "placements": []}},
            "was recorded for host 'other', not h",
        ),
        (
            {"state": "present", "plan": {"version": 9, "host": "h", "placements": []}},
            "has plan version 9",
        ),
        (
            {
                "state": "present",
                "plan": {"version": 1, "host": "h", "placements": [{"name": "a", "cpus": "x"}]},
            },
            "placement a without valid cpus",
        ),
    ],
)
def test_a_corrupt_or_foreign_recording_is_refused_with_path_and_fix(facts, message):
    with pytest.raises(PlanError) as err:
        parse_recorded("h", facts, PATH)
    text = str(err.value)
    assert text.startswith(f"host h: the recorded plan {PATH} ")
    assert message in text and "numafleet_repack: true" in text


def test_no_recording_plans_from_scratch():
    assert parse_recorded("h", {"state": "absent"}, PATH) is None
    assert parse_recorded("h", None, PATH) is None


# -- random edit sequences ----------------------------------------------------------------------

NAMES = [f"s{i}" for i in range(8)]


@st.composite
def edits(draw):
    """A start list of placements and a sequence of edits (add, remove, resize, reorder)."""
    start = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["add", "remove", "resize", "reorder", "gpu"]),
                st.sampled_from(NAMES),
                st.integers(1, 6),
            ),
            min_size=1,
            max_size=6,
        )
    )
    return start, steps


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(edits())
def test_random_edits_never_move_a_kept_placement(case):
    start, steps = case
    services = [p(name, cpus=2) for name in start]
    try:
        current = make(services)
    except PlanError:
        return
    for action, name, size in steps:
        edited = copy.deepcopy(services)
        names = [s["name"] for s in edited]
        if action == "add" and name not in names:
            edited.append(p(name, cpus=size))
        elif action == "remove" and name in names and len(names) > 1:
            edited = [s for s in edited if s["name"] != name]
        elif action == "resize" and name in names:
            edited[names.index(name)]["cpus"] = size
        elif action == "gpu" and name in names:
            edited[names.index(name)]["gpus"] = 1
        elif action == "reorder":
            edited.reverse()
        try:
            nxt = make(edited, before=current)
        except PlanError:
            continue  # refused before anything changes: the recorded plan stays
        before = {s["name"]: s for s in services}
        for entry in edited:
            old = before.get(entry["name"])
            if old == entry:
                assert nxt["stability"][entry["name"]] == "kept"
                assert where(nxt)[entry["name"]] == where(current)[entry["name"]]
        taken = [cpu for entry in nxt["placements"] for cpu in entry["cpus"]]
        assert len(taken) == len(set(taken))
        services, current = edited, nxt


def test_the_run_after_an_edit_records_the_same_plan():
    """A changed placement is committed after the kept ones; the plan still lists GPUs' users in
    declaration order, so the next run rewrites nothing."""
    services = [
        p("a", gpus=1, mps={"active_thread_percentage": 40}),
        p("b", gpus=1, mps={"active_thread_percentage": 40}),
    ]
    first = make(services)
    edited = copy.deepcopy(services)
    edited[0]["cpus"] = 6
    second = make(edited, before=first)
    third = make(edited, before=second)
    assert plan_record_text(third) == plan_record_text(second)
    (gpu,) = [g for g in second["gpus"] if g["placements"]]
    assert gpu["placements"] == ["a", "b"] and gpu["mps"]["clients"] == ["a", "b"]


def test_an_mps_daemon_does_not_follow_the_reserved_cpus():
    services = [p("a", gpus=1, mps={}), p("b", gpus=1, mps={}), p("c", cpus=2)]
    first = make(services)
    policy = dict(POLICY, reserved_cpus="11,23")  # a core no placement uses
    again = make(services, before=first, policy=policy)
    assert set(again["stability"].values()) == {"kept"}
    assert again["mps_daemons"] == first["mps_daemons"]


def test_warnings_keep_declaration_order_when_a_placement_is_planned_again():
    numa = host(isolated=(10, 11, 12, 13))
    services = [p("a", cpus="10-11"), p("b", cpus="12-13")]
    first = make(services, numa=numa)
    edited = copy.deepcopy(services)
    edited[0]["memory"] = "3G"  # planned again, after b
    second = make(edited, before=first, numa=numa)
    # (after the facts warning that 0-1,22-23, SMT siblings of isolated 10-13, are half-cores)
    assert [w.split(":")[0] for w in second["warnings"]] == [
        "facts",
        "placement a",
        "placement b",
    ]
    assert plan_record_text(make(edited, before=second, numa=numa)) == plan_record_text(second)
