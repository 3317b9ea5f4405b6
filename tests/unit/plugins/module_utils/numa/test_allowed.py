"""The allowed cpuset (ansible_facts.numa.allowed, .pid1) and the planner inside it (#22).

Facts come from qemu-2node-pxb (CPUs 0-1 on node 0, 2-3 on node 1) edited by field_cases.py;
the planner tests plan on those facts, so the reader and the planner are tested together.
"""

from __future__ import annotations

import os

import field_cases
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_hosts import synthetic, synthetic_gpu

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import allowed
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.units import plan_record_text

MACHINE = "qemu-2node-pxb"
POLICY = {"memory_headroom_pct": 15}
_SCRATCH: dict = {}


def facts_of(root: str) -> dict:
    return read_numa_facts(Reader(os.path.join(root, "sys"), os.path.join(root, "proc")))


def edited(fixture_root, case) -> tuple:
    root = fixture_root(MACHINE, writable=True)
    case(root)
    return root, facts_of(root)


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "user": "app", "cpus": 1, "memory": "64M"}
    entry.update(changes)
    return entry


# -- facts ------------------------------------------------------------------------------------


def test_a_dump_without_cgroup_files_allows_every_online_cpu_and_node(fixture_root):
    numa = facts_of(fixture_root(MACHINE))
    assert numa["allowed"] == {
        "cpus": [0, 1, 2, 3],
        "mems": [0, 1],
        "narrowed": False,
        "sources": [],
    }
    assert numa["pid1"]["cpus_allowed"] is None and numa["pid1"]["mems_allowed"] is None
    assert not [w for w in numa["warnings"] if "cgroup" in w["path"] or "/1/" in w["path"]]


def test_a_container_host_is_narrowed_to_its_cgroup_with_every_source_named(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_cgroup2_container)
    got = numa["allowed"]
    assert (got["cpus"], got["mems"], got["narrowed"]) == ([1, 3], [1], True)
    cgroup = os.path.join(root, "sys", "fs", "cgroup")
    scope = os.path.join(cgroup, field_cases.CONTAINER_SCOPE)
    assert [
        (s["source"], s["path"], s["cpus"], s["mems"], s["applies"]) for s in got["sources"]
    ] == [
        ("cgroup2_root", f"{cgroup}/cpuset.cpus.effective", [0, 1, 2, 3], [0, 1], True),
        ("cgroup2_container", f"{scope}/cpuset.cpus.effective", [1, 3], [1], True),
        ("cgroup2_slice", f"{scope}/numafleet.slice/cpuset.cpus.effective", [1, 3], [1], True),
        # system.slice is reported, not applied: placements run in numafleet.slice
        ("system_slice", f"{scope}/system.slice/cpuset.cpus.effective", [1], [1], False),
        # PID 1's affinity applies only when no cgroup file read
        ("pid1", os.path.join(root, "proc", "1", "status"), [1, 3], [1], False),
    ]
    assert got["sources"][1]["mems_path"] == f"{scope}/cpuset.mems.effective"
    assert numa["pid1"] == {
        "cpus_allowed": [1, 3],
        "mems_allowed": [1],
        "path": os.path.join(root, "proc", "1", "status"),
    }
    assert numa["warnings"] == []


def test_a_cgroup1_container_is_read_from_the_cpuset_hierarchy(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_cgroup1_container)
    got = numa["allowed"]
    assert (got["cpus"], got["mems"], got["narrowed"]) == ([0, 1, 2], [0], True)
    assert [s["source"] for s in got["sources"]] == ["cgroup1_root", "cgroup1_container"]
    assert got["sources"][1]["path"].endswith("cpuset/docker/4f1c2a9e7b3d/cpuset.effective_cpus")


def test_pid1_applies_when_no_cgroup_file_reads(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_pid1_only)
    got = numa["allowed"]
    assert (got["cpus"], got["mems"], got["narrowed"]) == ([0, 1, 2], [0, 1], True)
    assert [(s["source"], s["applies"]) for s in got["sources"]] == [("pid1", True)]


def test_pid1_does_not_take_isolated_cpus_away(fixture_root):
    """isolcpus takes CPUs out of PID 1's affinity, not out of what a unit may set."""
    root = fixture_root(MACHINE, writable=True)
    field_cases.write_pid1_status(root, [0, 1, 2], [0, 1])
    with open(os.path.join(root, "sys/devices/system/cpu/isolated"), "w") as handle:
        handle.write("3\n")
    got = facts_of(root)["allowed"]
    assert (got["cpus"], got["narrowed"]) == ([0, 1, 2, 3], False)


def test_files_the_kernel_never_writes_are_warnings_and_narrow_nothing(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_garbage)
    assert numa["allowed"] == {
        "cpus": [0, 1, 2, 3],
        "mems": [0, 1],
        "narrowed": False,
        "sources": [],
    }
    warned = {os.path.relpath(w["path"], root): w["reason"] for w in numa["warnings"]}
    cgroup = "sys/fs/cgroup"
    assert set(warned) == {
        f"{cgroup}/cpuset.cpus.effective",
        f"{cgroup}/cpuset.mems.effective",
        f"{cgroup}/numafleet.slice/cpuset.cpus.effective",
        "proc/1/cgroup",
        "proc/1/status",
    }
    assert "empty" in warned[f"{cgroup}/cpuset.mems.effective"]
    assert "NUL" in warned[f"{cgroup}/numafleet.slice/cpuset.cpus.effective"]
    assert "hierarchy:controllers:/path" in warned["proc/1/cgroup"]


@pytest.mark.parametrize(
    ("path", "base"),
    [
        ("/init.scope", None),
        ("/", None),
        ("", None),
        ("/system.slice/docker-1.scope/init.scope", "system.slice/docker-1.scope"),
        ("/docker/abc", "docker/abc"),
        ("/docker/../etc", None),
    ],
)
def test_container_base(path, base):
    assert allowed.container_base(path) == base


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(
        st.one_of(st.binary(max_size=40), st.sampled_from([b"0-3\n", b"1\n", b"", b"0::/x\n"])),
        min_size=5,
        max_size=5,
    )
)
def test_any_bytes_in_the_allowed_files_never_raise(fixture_root, texts):
    if MACHINE not in _SCRATCH:  # one scratch tree for every example: all 5 files rewritten
        _SCRATCH[MACHINE] = field_cases.allowed_cgroup2_container(
            fixture_root(MACHINE, writable=True)
        )
    root = _SCRATCH[MACHINE]
    scope = f"sys/fs/cgroup/{field_cases.CONTAINER_SCOPE}"
    names = [
        "sys/fs/cgroup/cpuset.cpus.effective",
        f"{scope}/cpuset.mems.effective",
        f"{scope}/numafleet.slice/cpuset.cpus.effective",
        "proc/1/cgroup",
        "proc/1/status",
    ]
    for name, data in zip(names, texts, strict=True):
        with open(os.path.join(root, name), "wb") as handle:
            handle.write(data)
    numa = facts_of(root)
    got = numa["allowed"]
    assert set(got["cpus"]) <= {0, 1, 2, 3} and set(got["mems"]) <= {0, 1}
    plan_host("h", numa, None, [], [], POLICY)  # never a traceback from the planner either


# -- the planner inside the allowed cpuset -----------------------------------------------------


def test_the_plan_stays_inside_the_allowed_set_and_says_so(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_cgroup2_container)
    plan = plan_host("h", numa, None, [p("a", node=1), p("b", node=0)], [], POLICY)
    a, b = plan["placements"]
    assert (a["cpus"], b["cpus"]) == ([3], [1])
    # node 0's memory is not allowed: its CPU uses node 1's
    assert (b["mems"], b["memory_node"]) == ([1], 1)
    assert plan["allowed"]["cpus"] == [1, 3] and plan["allowed"]["narrowed"]
    scope = os.path.join(root, "sys", "fs", "cgroup", field_cases.CONTAINER_SCOPE)
    assert plan["warnings"][0] == (
        "facts: services may use only CPUs 1,3 and memory nodes 1 (the allowed cpuset, from "
        f"cgroup2_container ({scope}/cpuset.cpus.effective, {scope}/cpuset.mems.effective), "
        "cgroup2_slice "
        f"({scope}/numafleet.slice/cpuset.cpus.effective, "
        f"{scope}/numafleet.slice/cpuset.mems.effective)): the plan uses nothing outside them"
    )
    # b's memory is not on its CPU node: the plan says why
    assert plan["warnings"][1] == (
        "placement b: memory on node 1, not on its CPU node 0 (distance 20 from node 0): node 0 is "
        "outside the allowed memory nodes"
    )
    assert plan_summary(plan).endswith(
        "b node0 cpus 1 mems 1; 2 warnings; allowed CPUs 1,3 and memory nodes 1"
    )
    assert [n["cpus_usable"] for n in plan["nodes"]] == [[1], [3]]


def test_a_placement_that_does_not_fit_names_the_allowed_sets(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_cgroup2_container)
    with pytest.raises(PlanError) as err:
        plan_host("h", numa, None, [p("big", cpus=2, node=1)], [], POLICY)
    message = str(err.value)
    assert message.startswith("host h: numafleet_placements[0] (big) needs 2 CPUs on NUMA node 1")
    assert "Services may use only CPUs 1,3 and memory nodes 1 (the allowed cpuset, from " in message
    assert f"{field_cases.CONTAINER_SCOPE}/cpuset.cpus.effective" in message


def test_explicit_cpus_outside_the_allowed_set_are_refused(fixture_root):
    root, numa = edited(fixture_root, field_cases.allowed_cgroup2_container)
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("pin", cpus="0-1")], [], POLICY)
    assert str(err.value).startswith(
        "host h: numafleet_placements[0] (pin).cpus: CPU 0 is outside the CPUs services may use "
        "(1,3, the allowed cpuset from cgroup2_container ("
    )
    assert str(err.value).endswith(
        "the kernel would narrow or refuse the binding; pin CPUs inside it or widen that cpuset"
    )
    assert plan_host("h", numa, None, [p("pin", cpus="1,3")], [], POLICY)["placements"]


def _recorded(plan: dict) -> dict:
    import json

    return parse_recorded(
        "h", {"state": "present", "plan": json.loads(plan_record_text(plan)), "error": None}, "/p"
    )


def test_a_kept_placement_outside_a_narrowed_set_is_planned_again_and_says_why(fixture_root):
    before = facts_of(fixture_root(MACHINE))
    placements = [p("a", node=0), p("b", node=1)]
    first = plan_host("h", before, None, placements, [], POLICY)
    assert [e["cpus"] for e in first["placements"]] == [[0], [2]]
    root, after = edited(fixture_root, field_cases.allowed_cgroup2_container)
    again = plan_host("h", after, None, placements, [], POLICY, recorded=_recorded(first))
    assert [e["cpus"] for e in again["placements"]] == [[1], [3]]
    assert again["stability"]["a"].startswith(
        "its CPU 0 is now outside the allowed cpuset (1,3, from cgroup2_container ("
    )
    assert again["stability"]["b"].startswith("its CPU 2 is now outside the allowed cpuset")
    # inside the set: kept
    third = plan_host("h", after, None, placements, [], POLICY, recorded=_recorded(again))
    assert set(third["stability"].values()) == {"kept"}


def test_facts_without_the_allowed_key_plan_as_before():
    numa = synthetic()
    plan = plan_host("h", numa, None, [p("a", cpus=2)], [], POLICY)
    assert plan["allowed"]["narrowed"] is False and plan["warnings"] == []
    assert "allowed" not in plan_summary(plan)


def test_an_mps_daemon_runs_inside_the_allowed_set_too():
    numa = synthetic()  # node 0: CPUs 0-3, node 1: 4-7
    numa["allowed"] = {
        "cpus": [0, 1, 2, 5, 6, 7],
        "mems": [0, 1],
        "narrowed": True,
        "sources": [
            {"source": "cgroup2_slice", "path": "/sys/fs/cgroup/numafleet.slice/x", "cpus": [0, 1, 2, 5, 6, 7],
             "mems": [0, 1], "mems_path": "/m", "applies": True}
        ],
    }  # fmt: skip
    gpus = {"gpus": [synthetic_gpu("0000:17:00.0", 0)]}
    plan = plan_host("h", numa, gpus, [p("a", gpus=1, mps={}), p("b", gpus=1, mps={})], [], POLICY)
    (daemon,) = plan["mps_daemons"]
    assert daemon["cpus"] == [0, 1, 2]
    assert all(set(e["cpus"]) <= {0, 1, 2, 5, 6, 7} for e in plan["placements"])
    assert "cgroup2_slice (/sys/fs/cgroup/numafleet.slice/x)" in plan["warnings"][0]


# -- SMT siblings of isolated CPUs -------------------------------------------------------------


def test_count_placements_never_get_a_core_shared_with_an_isolated_cpu():
    # node 0: cores (0,2) (1,3); CPU 2 isolated leaves 0 a half-core
    numa = synthetic(isolated=(2,))
    plan = plan_host("h", numa, None, [p("a", cpus=2, node=0)], [], POLICY)
    assert plan["placements"][0]["cpus"] == [1, 3]
    assert plan["warnings"] == [
        "facts: CPUs 0 share cores with isolated CPUs 2 (SMT siblings): placements of a CPU "
        "count get whole cores only and never these; pin them with cpus: to use them"
    ]
    assert plan["nodes"][0]["cpus_usable"] == [1, 3]
    with pytest.raises(PlanError, match="needs 3 CPUs on NUMA node 0"):
        plan_host("h", numa, None, [p("a", cpus=3, node=0)], [], POLICY)


def test_an_explicit_half_core_warns_naming_its_isolated_sibling():
    numa = synthetic(isolated=(2,))
    plan = plan_host("h", numa, None, [p("pin", cpus="0-0")], [], POLICY)
    assert plan["placements"][0]["cpus"] == [0]
    assert plan["placements"][0]["warnings"] == [
        "CPU 0 shares a core with isolated CPU 2 (SMT siblings): its threads disturb what runs "
        "on the isolated CPU"
    ]


def test_a_kept_half_core_is_not_moved_but_warned():
    services = [p("a", cpus=1, node=0)]
    # CPU 2 reserved: a gets 0, alone on its core
    first = plan_host("h", synthetic(), None, services, [], dict(POLICY, reserved_cpus="2"))
    assert first["placements"][0]["cpus"] == [0]
    # now 2 is isolated instead: 0 is a half-core of an isolated CPU, but a running service
    # is not moved for it (its request did not change); it warns
    numa = synthetic(isolated=(2,))
    again = plan_host("h", numa, None, services, [], POLICY, recorded=_recorded(first))
    assert again["stability"] == {"a": "kept"}
    assert again["placements"][0]["cpus"] == [0]
    assert again["placements"][0]["warnings"] == [
        "CPU 0 shares a core with isolated CPU 2 (SMT siblings): its threads disturb what runs "
        "on the isolated CPU (kept from the recorded plan)"
    ]
    moved = plan_host(
        "h", synthetic(isolated=(0,)), None, services, [], POLICY, recorded=_recorded(first)
    )
    assert moved["stability"]["a"] == "its CPU 0 is now isolated"  # as before #22


def test_a_capture_records_the_allowed_cpuset_files(fixture_root, tmp_path):
    """capture_topology.yml records what the readers read: the same allowed facts come back."""
    import tarfile

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.capture import (
        plan_capture,
        write_capture,
    )

    root, numa = edited(fixture_root, field_cases.allowed_cgroup2_container)
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    read_numa_facts(reader)
    dest = str(tmp_path / "capture.tar.gz")
    write_capture(plan_capture(reader), dest, "host")
    with tarfile.open(dest) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path, filter="fully_trusted")
    assert "host/proc/1/status" in names and "host/proc/1/cgroup" in names
    again = facts_of(str(tmp_path / "host"))["allowed"]
    assert (again["cpus"], again["mems"], again["narrowed"]) == ([1, 3], [1], True)
    assert [s["source"] for s in again["sources"]] == [
        s["source"] for s in numa["allowed"]["sources"]
    ]
