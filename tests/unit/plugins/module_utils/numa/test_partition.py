"""partition.py: the housekeeping partition in the plan, its drop-ins, their removal, the
change plan, irqbalance's banned CPUs and the refusals (numafleet_partition)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_hosts import synthetic

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    changes,
    effective,
    layers,
    partition,
    units,
    verify,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import PlacementError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import digest

UNIT_DIR = "/etc/systemd/system"
SYSTEM = f"{UNIT_DIR}/system.slice.d/50-numafleet.conf"
USER = f"{UNIT_DIR}/user.slice.d/50-numafleet.conf"
INIT = f"{UNIT_DIR}/init.scope.d/50-numafleet.conf"
MANAGER = "/etc/systemd/system.conf.d/50-numafleet.conf"
PARTITION_FILES = [MANAGER, INIT, SYSTEM, USER]
ON = {"reserved_cpus": "0,8", "partition": True}


def host() -> dict:
    # 2 nodes x 8 CPUs (SMT 2: c and c+4 are siblings), 16 GiB each.
    return synthetic(cpus_per_node=(8, 8), mem_gb=(16, 16))


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 2, "memory": "1G"}
    entry.update(changes)
    return entry


def make(placements, policy=None, before=None, numa=None) -> dict:
    policy = ON if policy is None else policy
    kept = None
    if before is not None:
        record = {"state": "present", "plan": json.loads(units.plan_record_text(before))}
        kept = parse_recorded("h", dict(record, error=None), "/etc/numafleet/plan.json")
    return plan_host(
        "h", copy.deepcopy(numa or host()), {}, copy.deepcopy(placements), [], policy, recorded=kept
    )


def partition_files(plan) -> dict:
    return {p: t for p, t in units.render_files(plan).items() if p in PARTITION_FILES}


# --- the plan -----------------------------------------------------------------------------------


def test_partition_is_recorded_in_the_plan_from_the_reserved_cpus():
    plan = make([p("a"), p("b", node=1)])
    assert plan["partition"] == {
        "housekeeping_cpus": [0, 8],
        "units": ["init.scope", "system.slice", "user.slice"],
    }
    assert all(not {0, 8} & set(entry["cpus"]) for entry in plan["placements"])
    # recorded in plan.json (so the next run's change plan sees it)
    assert json.loads(units.plan_record_text(plan))["partition"] == plan["partition"]


@pytest.mark.parametrize(
    ("policy", "placements"),
    [
        ({"reserved_cpus": "0,8"}, [p("a")]),  # default off
        ({"reserved_cpus": "0,8", "partition": False}, [p("a")]),
        ({"reserved_cpus": "0,8", "partition": None}, [p("a")]),  # an empty host_vars key
        (ON, []),  # no placements: nothing to keep system daemons away from
    ],
)
def test_no_partition_key_when_off_or_without_placements(policy, placements):
    plan = make(placements, policy)
    assert "partition" not in plan
    assert partition_files(plan) == {}


def test_housekeeping_set_leaves_out_offline_and_not_allowed_cpus():
    numa = synthetic(cpus_per_node=(8, 8), mem_gb=(16, 16), offline=(8,))
    plan = make([p("a")], numa=numa)
    assert plan["partition"]["housekeeping_cpus"] == [0]
    assert partition.housekeeping_cpus([0, 1, 8], [0, 1, 2, 8], allowed=[1, 2]) == [1]


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "numa", "fragment"),
    [
        (
            {"reserved_cpus": "", "partition": True},
            None,
            "numafleet_partition is true but numafleet_reserved_cpus is empty",
        ),
        (
            {"reserved_cpus": "0", "partition": "yes"},
            None,
            "numafleet_partition: 'yes' is not a boolean",
        ),
        (
            {"reserved_cpus": "8", "partition": True},
            synthetic(cpus_per_node=(8, 8), mem_gb=(16, 16), offline=(8,)),
            "none of numafleet_reserved_cpus (CPUs 8) is online",
        ),
    ],
)
def test_bad_partition_inputs_are_refused_naming_the_variable_and_fix(policy, numa, fragment):
    with pytest.raises(PlacementError) as err:
        make([p("a", node=1)], policy, numa=numa)
    text = str(err.value)
    assert text.startswith("host h: ") and fragment in text, text
    assert "numafleet_partition" in text and ("true or false" in text or "reserved" in text)


def test_a_placement_pinned_onto_the_housekeeping_cpus_is_refused():
    with pytest.raises(PlacementError, match=r"cpus: CPU 0 is in numafleet_reserved_cpus"):
        make([p("a", cpus="0-1")])
    # the partition's own guard, for a plan made some other way
    with pytest.raises(PlacementError, match=r"placement a has CPUs 0, .*numafleet_reserved_cpus"):
        partition.plan_partition("h", True, [0], [0, 1], None, [{"name": "a", "cpus": [0, 1]}])


def test_no_reserved_warning_names_the_variable_only_with_placements():
    text = partition.no_reserved_warning([], [{"name": "a"}])
    assert text.startswith("numafleet_reserved_cpus is empty") and "numafleet_partition" in text
    assert partition.no_reserved_warning([0], [{"name": "a"}]) is None
    assert partition.no_reserved_warning([], []) is None


# --- rendering ------------------------------------------------------------------------------------


def test_drop_ins_confine_system_user_init_and_pid1_but_not_numafleet_slice():
    plan = make([p("a"), p("b", node=1)])
    files = units.render_files(plan)
    assert partition_files(plan) == {
        MANAGER: "# Managed by numafleet.tuning\n\n[Manager]\nCPUAffinity=0,8\n",
        INIT: "# Managed by numafleet.tuning\n\n[Scope]\nAllowedCPUs=0,8\n",
        SYSTEM: "# Managed by numafleet.tuning\n\n[Slice]\nAllowedCPUs=0,8\n",
        USER: "# Managed by numafleet.tuning\n\n[Slice]\nAllowedCPUs=0,8\n",
    }
    # numa_facts reads numafleet.slice's cpuset as a narrowing source: never confined.
    assert not [path for path in files if "numafleet.slice" in path]
    # effective.py reads the scope's [Scope] section and leaves the manager file out
    planned = effective.planned_properties("init.scope", [(INIT, files[INIT])])
    assert planned == {"AllowedCPUs": "0,8"}
    entries, dummy = effective.evaluate("/nonexistent", files)
    assert "system.conf" not in {entry["unit"] for entry in entries}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "grow", "move"]),
            st.integers(min_value=0, max_value=3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_day2_placement_edits_never_change_the_partition_files(edits):
    wanted = {"a": p("a"), "b": p("b", node=1)}
    plan = make(list(wanted.values()))
    first = partition_files(plan)
    for action, index in edits:
        name = f"x{index}"
        if action == "add":
            wanted.setdefault(name, p(name, cpus=1))
        elif action == "remove" and len(wanted) > 1:
            wanted.pop(sorted(wanted)[index % len(wanted)])
        elif action == "grow":
            key = sorted(wanted)[index % len(wanted)]
            wanted[key] = dict(wanted[key], cpus=1 + index % 3)
        elif action == "move":
            key = sorted(wanted)[index % len(wanted)]
            wanted[key] = dict(wanted[key], node=index % 2)
        plan = make(list(wanted.values()), before=plan)
        assert partition_files(plan) == first


# --- actions, manifest, change plan -------------------------------------------------------------


def test_slices_and_scope_are_never_restarted_and_pid1_is_reexecuted():
    plan = make([p("a")])
    desired = units.render_files(plan)
    actions = units.plan_actions(units.plan_changes({}, desired, []))
    assert actions.slices["new"] == ["init.scope", "system.slice", "user.slice"]
    assert actions.reexec_needed
    assert not {"init.scope", "system.slice", "user.slice", "system.conf"} & (
        set(actions.restart) | set(actions.try_restart) | set(actions.start)
    )
    assert actions.would_run() == [
        "systemctl daemon-reload",
        "systemctl daemon-reexec",
        "systemctl enable --now numafleet-a.service",
    ]
    again = units.plan_actions(units.plan_changes(dict(desired), desired, list(desired)))
    assert not again.reexec_needed and again.would_run() == []
    argvs = layers.handler_argvs({"units": {"reload_needed": True, "reexec_needed": True}})
    assert argvs == [["systemctl", "daemon-reload"], ["systemctl", "daemon-reexec"]]


def test_turning_partition_off_removes_only_our_files(tmp_path):
    root = str(tmp_path)
    plan = make([p("a")])
    desired = units.render_files(plan)
    manifest = units.read_manifest(root)
    units.write_files(root, units.plan_changes({}, desired, []))
    units.write_manifest(root, units.plan_manifest(manifest, desired))
    foreign = tmp_path / "etc/systemd/system/system.slice.d/10-admin.conf"
    foreign.write_text("[Slice]\nMemoryMax=8G\n")
    edited = tmp_path / "etc/systemd/system/user.slice.d/50-numafleet.conf"
    edited.write_text(edited.read_text() + "# edited by hand\n")

    off = units.render_files(make([p("a")], {"reserved_cpus": "0,8"}))
    manifest = units.read_manifest(root)
    assert set(PARTITION_FILES) <= set(manifest.files)
    owned, kept = units.removable(root, manifest, off, UNIT_DIR)
    assert owned == sorted([MANAGER, INIT, SYSTEM])
    assert [item.path for item in kept] == [USER]  # edited: kept, never removed
    todo = units.plan_changes(units.read_files(root, set(off) | set(owned)), off, owned)
    actions = units.plan_actions(todo)
    assert actions.slices["removed"] == ["init.scope", "system.slice"]
    assert actions.reexec_needed and actions.reload_needed
    units.write_files(root, todo)
    assert foreign.read_text() == "[Slice]\nMemoryMax=8G\n"
    assert not (tmp_path / "etc/systemd/system.conf.d").exists()
    assert not (tmp_path / "etc/systemd/system/init.scope.d").exists()
    assert edited.exists()


def test_the_manager_file_is_ours_only_beside_unit_dir():
    assert units.in_unit_dir(MANAGER, UNIT_DIR)
    assert not units.in_unit_dir("/etc/systemd/user.conf.d/50-numafleet.conf", UNIT_DIR)
    assert not units.in_unit_dir("/srv/system.conf.d/50-numafleet.conf", UNIT_DIR)
    assert not units.in_unit_dir(MANAGER, "/srv/units")
    assert partition.manager_path("/srv/units") == "/srv/system.conf.d/50-numafleet.conf"


def test_change_plan_lists_partition_files_and_restarts_nothing():
    plan = make([p("a")])
    desired = units.render_files(plan)
    unit = f"{UNIT_DIR}/numafleet-a.service"
    before = make([p("a")], {"reserved_cpus": "0,8"})
    recorded = {unit: digest(desired[unit])}
    result = changes.change_plan("h", before, plan, desired, {}, recorded)
    assert result["units"]["slices"]["new"] == ["init.scope", "system.slice", "user.slice"]
    assert result["units"]["reexec"] is True
    assert result["units"]["restart"] == [] and result["units"]["start"] == []
    assert result["changed"] is True
    assert (
        "  new slice: init.scope, system.slice, user.slice (applied at daemon-reload)"
        in (result["lines"])
    )
    assert any("daemon-reexec (no restarts)" in line for line in result["lines"])
    assert result["summary"] == "changes: 3 slices written, systemd re-executed"

    # partition off again: the recorded files are removed, nothing restarts
    recorded = {path: digest(text) for path, text in desired.items()}
    off = changes.change_plan("h", plan, before, units.render_files(before), {}, recorded)
    assert off["units"]["slices"]["removed"] == ["init.scope", "system.slice", "user.slice"]
    assert off["units"]["reexec"] is True
    assert off["units"]["stop"] == [] and off["units"]["restart"] == []
    assert off["refused"] == []


def test_irqbalance_bans_every_cpu_outside_housekeeping_when_partitioned():
    plan = make([p("a")])
    online = list(range(16))
    assert partition.irqbalance_banned(plan, online, [5]) == list(range(1, 8)) + list(range(9, 16))
    assert partition.irqbalance_banned(make([p("a")], {"reserved_cpus": "0"}), online) is None


def test_verify_judges_the_confined_units_live(tmp_path):
    """verify's effective_units: one check per confined unit; a system.slice that systemd runs
    with other CPUs than the drop-in says (systemctl show) fails, naming the property."""
    plan = make([p("a")])
    files = units.render_files(plan)
    entries, foreign = effective.evaluate(str(tmp_path), files)
    assert foreign == []
    show = "".join(
        f"Id={unit}\nLoadState=loaded\nAllowedCPUs={cpus}\n\n"
        for unit, cpus in (("init.scope", "0 8"), ("system.slice", "0-15"), ("user.slice", "0,8"))
    )
    overrides = effective.compare_live(entries, effective.parse_show(show), set(files))
    assert [(o.unit, o.property, o.planned, o.effective) for o in overrides] == [
        ("system.slice", "AllowedCPUs", "0,8", "0-15")
    ]
    checks = {c.subject: c for c in verify.effective_unit_checks("h", plan, entries)}
    assert {"init.scope", "system.slice", "user.slice"} <= set(checks)
    assert checks["system.slice"].status == "fail", checks["system.slice"]
    assert "AllowedCPUs" in checks["system.slice"].message
    assert checks["user.slice"].status == checks["init.scope"].status == "pass"


def test_turning_partition_off_gives_pid1_every_allowed_cpu_back():
    """systemd sets PID 1's affinity only when CPUAffinity= is set: with the drop-in removed,
    the handler pass re-executes and then resets PID 1 with taskset."""
    on, off = make([p("a")]), make([p("a")], {"reserved_cpus": "0,8"})
    assert partition.pid1_reset_argv(off) == ["taskset", "-a", "-p", "-c", "0-15", "1"]
    assert partition.pid1_reset_argv({"allowed": {"cpus": []}}) is None
    results = {
        "units": {
            "reload_needed": True,
            "reexec_needed": True,
            "pid1_affinity_reset": partition.pid1_reset_argv(off),
            "would_run": [
                "systemctl daemon-reload",
                "systemctl daemon-reexec",
                "taskset -a -p -c 0-15 1",
            ],
        },
        "hugepages": {"would_run": ["systemctl daemon-reload", "systemctl enable x.service"]},
    }
    assert layers.handler_argvs(results)[:3] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "daemon-reexec"],
        ["taskset", "-a", "-p", "-c", "0-15", "1"],
    ]
    assert layers.merged_would_run(results) == [
        "systemctl daemon-reload",
        "systemctl daemon-reexec",
        "taskset -a -p -c 0-15 1",
        "systemctl enable x.service",
    ]
    assert on["partition"]  # written, not removed: no reset
