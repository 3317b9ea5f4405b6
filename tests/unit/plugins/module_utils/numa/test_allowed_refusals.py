"""The planner inside the allowed cpuset: GPUs of a left-out node, file names, reasons (#22).

Facts come from qemu-2node-pxb (CPUs 0-1 on node 0, 2-3 on node 1) edited by field_cases.py
(allowed_slice_one_node: numafleet.slice confined to node 0's CPUs); its GPUs are recorded
gpu_topology entries (the dump has no GPU) on node 1, where the field report had them.
"""

from __future__ import annotations

import json
import os

import field_cases
import pytest
from synthetic_hosts import synthetic_gpu

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.units import plan_record_text

MACHINE = "qemu-2node-pxb"
POLICY = {"memory_headroom_pct": 15}
GPU0, GPU1 = "0000:0a:00.0", "0000:0b:00.0"  # node 0, node 1


def facts_of(root: str) -> dict:
    return read_numa_facts(Reader(os.path.join(root, "sys"), os.path.join(root, "proc")))


def gpus() -> dict:
    return {"gpus": [synthetic_gpu(GPU0, 0), synthetic_gpu(GPU1, 1)]}


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "user": "app", "cpus": 1, "memory": "64M"}
    entry.update(changes)
    return entry


def recorded(plan: dict) -> dict:
    return parse_recorded(
        "h", {"state": "present", "plan": json.loads(plan_record_text(plan)), "error": None}, "/p"
    )


def narrowed(fixture_root, case=field_cases.allowed_slice_one_node, **kwargs) -> tuple:
    root = fixture_root(MACHINE, writable=True)
    slice_dir = case(root, **kwargs)
    return slice_dir, facts_of(root)


# -- #1: GPUs of a node whose CPUs are outside the allowed cpuset --------------------------------


def test_a_gpu_of_a_left_out_node_is_not_given_to_another_node(fixture_root):
    slice_dir, numa = narrowed(fixture_root)
    # one GPU: node 0's own GPU, never node 1's
    plan = plan_host("h", numa, gpus(), [p("a", gpus=1)], [], POLICY)
    assert [g["address"] for g in plan["placements"][0]["gpus"]] == [GPU0]
    assert plan["placements"][0]["warnings"] == []
    # two GPUs: node 1's GPU is not offered; the refusal counts it on node 1 and says why
    with pytest.raises(PlanError) as err:
        plan_host("h", numa, gpus(), [p("a", gpus=2)], [], POLICY)
    message = str(err.value)
    assert "needs 2 GPUs on one NUMA node; free per node: node0 1 GPU, 2 CPUs" in message
    assert (
        "node1 1 GPU, 0 CPUs, memory outside the allowed memory nodes (0, from cgroup2_slice "
        f"({slice_dir}/cpuset.mems.effective)) (GPUs not offered: CPUs 2-3 are outside the allowed "
        f"cpuset (CPUs 0-1, from cgroup2_slice ({slice_dir}/cpuset.cpus.effective)))"
    ) in message
    assert "of unknown node" not in message


def test_a_listed_gpu_of_a_left_out_node_is_refused_or_warned_with_allow_span(fixture_root):
    slice_dir, numa = narrowed(fixture_root)
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, gpus(), [p("a", gpus=[GPU1])], [], POLICY)
    assert str(err.value) == (
        f"host h: numafleet_placements[0] (a).gpus: GPU {GPU1} sits on node 1, which has no CPUs "
        "a placement can use (CPUs 2-3 are outside the allowed cpuset (CPUs 0-1, from "
        f"cgroup2_slice ({slice_dir}/cpuset.cpus.effective))); its CPUs and memory would run on "
        "another node, away from the GPU. Widen that cpuset (or free node 1's CPUs), list GPUs "
        "of node 0, or set allow_span: true to use the GPU from another node's CPUs"
    )
    plan = plan_host("h", numa, gpus(), [p("a", gpus=[GPU1], allow_span=True)], [], POLICY)
    (entry,) = plan["placements"]
    assert entry["nodes"] == [0] and [g["address"] for g in entry["gpus"]] == [GPU1]
    assert entry["warnings"][0].startswith(
        f"GPU {GPU1} of node 1 is used from another node's CPUs (allow_span): node 1 has no CPUs"
    )
    assert (
        f"GPU {GPU1} is on node 1, not next to the placement's CPUs (node 0)"
        in (entry["warnings"][1])
    )


def test_a_gpu_placement_kept_on_a_left_out_node_is_refused_not_moved(fixture_root):
    first = plan_host(
        "h", facts_of(fixture_root(MACHINE)), gpus(), [p("a", gpus=[GPU1])], [], POLICY
    )
    assert first["placements"][0]["nodes"] == [1]
    slice_dir, numa = narrowed(fixture_root)
    with pytest.raises(PlacementError, match=f"GPU {GPU1} sits on node 1, which has no CPUs"):
        plan_host("h", numa, gpus(), [p("a", gpus=[GPU1])], [], POLICY, recorded=recorded(first))
    counted = plan_host(
        "h", facts_of(fixture_root(MACHINE)), gpus(), [p("b", gpus=1, node=1)], [], POLICY
    )
    with pytest.raises(PlacementError, match=r"\(b\)\.node: node 1 has no CPUs a placement can use "
                       r"\(CPUs 2-3 are outside the allowed cpuset"):  # fmt: skip
        plan_host(
            "h", numa, gpus(), [p("b", gpus=1, node=1)], [], POLICY, recorded=recorded(counted)
        )


# -- #3 / #4: memory narrowing names the mems file; free per node says why --------------------


def test_memory_narrowing_names_the_mems_file(fixture_root):
    first = plan_host("h", facts_of(fixture_root(MACHINE)), None, [p("a", cpus="1-1")], [], POLICY)
    assert first["placements"][0]["mems"] == [0]
    root = fixture_root(MACHINE, writable=True)
    slice_dir = field_cases.allowed_slice_one_node(root, mems="1")
    numa = facts_of(root)
    again = plan_host("h", numa, None, [p("a", cpus="1-1")], [], POLICY, recorded=recorded(first))
    assert again["stability"]["a"] == (
        "its memory node 0 is now outside the allowed memory nodes (1, from cgroup2_slice "
        f"({slice_dir}/cpuset.mems.effective))"
    )
    assert "cpuset.cpus.effective" not in again["stability"]["a"]
    # the plan warning names both files of the slice, which narrows both
    assert (
        f"cgroup2_slice ({slice_dir}/cpuset.cpus.effective, {slice_dir}/cpuset.mems.effective)"
        in again["warnings"][0]
    )


def test_free_per_node_says_memory_is_outside_the_allowed_nodes(fixture_root):
    slice_dir, numa = narrowed(fixture_root)
    with pytest.raises(PlanError) as err:
        plan_host("h", numa, None, [p("big", cpus=3)], [], POLICY)
    message = str(err.value)
    assert (
        "node1 0 GPUs, 0 CPUs, memory outside the allowed memory nodes (0, from cgroup2_slice "
        f"({slice_dir}/cpuset.mems.effective))"
    ) in message
    assert "no memory" not in message


# -- #11: an allowed cpuset that leaves no online CPU or memory node ---------------------------


def test_an_allowed_cpuset_without_online_memory_node_is_refused_naming_it(fixture_root):
    slice_dir, numa = narrowed(fixture_root, mems="5")
    assert numa["allowed"]["mems"] == []
    assert {
        "path": f"{slice_dir}/cpuset.mems.effective",
        "reason": "names memory nodes 5, none of them online (online: 0-1): services may run "
        "nowhere; the planner refuses to plan",
    }.items() <= next(w for w in numa["warnings"] if "mems.effective" in w["path"]).items()
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("a", hugepages={"size": "2M", "count": 1})], [], POLICY)
    assert str(err.value) == (
        f"host h: the allowed cpuset from cgroup2_slice ({slice_dir}/cpuset.mems.effective) "
        "leaves no online memory node a placement can use (it names nodes 5; nodes with memory: "
        "0-1): fix that cgroup's cpuset.mems; nothing was planned"
    )
    plan_host("h", numa, None, [], [], POLICY)  # no placement: nothing to refuse


def test_an_allowed_cpuset_without_online_cpu_is_refused_naming_it(fixture_root):
    slice_dir, numa = narrowed(fixture_root, case=field_cases.allowed_slice_cpus_offline)
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, gpus(), [p("a", gpus=1)], [], POLICY)
    assert str(err.value) == (
        f"host h: the allowed cpuset from cgroup2_slice ({slice_dir}/cpuset.cpus.effective) "
        "leaves no online CPU (it names CPUs 200-201; online: 0-3): fix that cgroup's "
        "cpuset.cpus (or PID 1's affinity); nothing was planned"
    )


# -- #13: crossed vNUMA nodes and isolated SMT siblings ----------------------------------------


def test_crossed_nodes_do_not_hold_back_listed_siblings_of_isolated_cpus(fixture_root):
    root = fixture_root(MACHINE, writable=True)
    field_cases.qemu_vnuma_crossed_isolated(root)
    numa = facts_of(root)
    plan = plan_host("h", numa, None, [p("kv", node=1)], [], POLICY)
    assert plan["placements"][0]["cpus"] == [2]
    assert plan["placements"][0]["warnings"] == []
    assert not any("share cores with isolated" in w for w in plan["warnings"])
    assert (
        "facts: CPUs 2 are listed as SMT siblings of isolated CPUs, but on nodes cut across by "
        "packages the sibling lists are not trusted: they are planned as cores of their own, "
        "like every CPU of those nodes"
    ) in plan["warnings"]


def test_a_node_without_usable_cpus_says_why():
    from synthetic_hosts import synthetic

    # node 1: CPUs 4-7, cores (4,6) (5,7); 5 and 6 isolated, 4 reserved: 7 is a half-core
    numa = synthetic(isolated=(5, 6))
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("a", node=1)], [], dict(POLICY, reserved_cpus="4"))
    assert str(err.value) == (
        "host h: numafleet_placements[0] (a).node: node 1 has no CPUs a placement can use (CPUs "
        "4 are in numafleet_reserved_cpus; CPUs 5-6 are isolated; CPU 7 shares a core with "
        "isolated CPU 5 (SMT siblings): its threads disturb what runs on the isolated CPU; a "
        "placement of a CPU count never gets them (pin them with cpus:, or un-isolate the "
        "sibling)); pick one of 0"
    )


# -- #17: a change of warnings only is no change of the recorded plan -------------------------


def test_warnings_only_do_not_change_the_recorded_plan():
    from synthetic_hosts import synthetic

    services = [p("a", cpus=1, node=0)]
    first = plan_host("h", synthetic(), None, services, [], POLICY)
    numa = synthetic()
    numa["consistency"] = [
        {"kind": "device_on_missing_node", "message": "device 0000:06:00.0 names node 7"}
    ]
    again = plan_host("h", numa, None, services, [], POLICY, recorded=recorded(first))
    assert again["warnings"] == ["facts: device 0000:06:00.0 names node 7"] != first["warnings"]
    assert plan_record_text(again) == plan_record_text(first)
    assert "warnings" not in plan_record_text(again)
    # a placement's own warnings are not recorded either
    pinned = plan_host("h", synthetic(isolated=(2,)), None, [p("b", cpus="0-0")], [], POLICY)
    assert pinned["placements"][0]["warnings"]
    assert "warnings" not in json.loads(plan_record_text(pinned))["placements"][0]


# -- #2: MPS daemons when the allowed cpuset narrows under kept placements ----------------------


def _mps_plan(numa, before=None):
    import copy

    services = [
        p("a", cpus=2, gpus=1, mps={"active_thread_percentage": 50}),
        p("b", cpus=2, gpus=1, mps={"active_thread_percentage": 30}),
    ]
    return plan_host(
        "h",
        copy.deepcopy(numa),
        {"gpus": [synthetic_gpu("0000:17:00.0", 0)]},
        services,
        [],
        POLICY,
        recorded=recorded(before) if before else None,
        recorded_daemons=before["mps_daemons"] if before else None,
    )


def _narrow(numa, cpus):
    narrowed_numa = dict(numa)
    narrowed_numa["allowed"] = {
        "cpus": cpus, "mems": [0, 1], "narrowed": True,
        "sources": [{"source": "cgroup2_container", "path": "/c/cpuset.cpus.effective",
                     "mems_path": "/c/cpuset.mems.effective", "cpus": cpus, "mems": [0, 1],
                     "applies": True}],
    }  # fmt: skip
    return narrowed_numa


def test_a_daemon_restart_for_a_narrowed_cpuset_says_why_and_widening_keeps_it():
    from synthetic_hosts import synthetic

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mps, units
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import (
        change_plan,
    )
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
        MANIFEST_PATHS,
        digest,
    )

    def rendered(plan):
        unit_files = units.render_files(plan, units.DEFAULT_HEADER, True, units.DEFAULT_UNIT_DIR)
        daemons, dummy = mps.plan_daemons(plan)
        return unit_files, mps.render_files(daemons, units.DEFAULT_HEADER, units.DEFAULT_UNIT_DIR)

    def applied(plan):
        files = {
            path: digest(text) for path, text in {**rendered(plan)[0], **rendered(plan)[1]}.items()
        }
        files.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
        return files

    numa = synthetic(cpus_per_node=(16, 16), mem_gb=(64, 64))
    first = _mps_plan(numa)
    (daemon,) = first["mps_daemons"]
    assert daemon["cpus"] == list(range(16))
    # the container's cpuset narrows to CPUs 0-11: the clients keep their CPUs, the daemon's
    # CPUs 12-15 are no longer allowed: it restarts, and the change plan says why
    second = _mps_plan(_narrow(numa, list(range(12)) + list(range(16, 32))), first)
    assert set(second["stability"].values()) == {"kept"}
    assert second["mps_daemons"][0]["cpus"] == list(range(12))
    unit = daemon["unit"]
    result = change_plan("h", first, second, *rendered(second), applied(first))
    assert unit in result["units"]["restart"]
    why = (
        "its CPUs change: 0-15 -> 0-11 (CPUs 12-15 are outside the allowed cpuset, from "
        "cgroup2_container (/c/cpuset.cpus.effective))"
    )
    assert result["units"]["restart_reasons"] == {unit: why}
    assert f"  why {unit} restarts: {why}" in result["lines"]
    assert any(line.startswith("  restarted by systemd: numafleet-") for line in result["lines"])
    # widened again: its recorded CPUs are all still usable: kept, nothing restarts
    third = _mps_plan(numa, second)
    assert third["mps_daemons"][0]["cpus"] == list(range(12))
    again = change_plan("h", second, third, *rendered(third), applied(second))
    assert not again["changed"] and again["units"]["restart_reasons"] == {}
    # from scratch (numafleet_repack) it takes the whole node again
    assert _mps_plan(numa)["mps_daemons"][0]["cpus"] == list(range(16))
