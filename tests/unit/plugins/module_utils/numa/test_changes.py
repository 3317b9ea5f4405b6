"""The change plan: placements added / moved / removed / kept, the units systemd will start,
restart (through Requires= too) and stop, MIG layout changes, and the blast-radius guards."""

from __future__ import annotations

import copy

import pytest
from synthetic_hosts import synthetic, synthetic_gpu

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mps, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import (
    change_plan,
    dependents,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
    MANIFEST_PATHS,
    digest,
)

NUMA = synthetic(cpus_per_node=(16, 16), mem_gb=(64, 64))
GPUS = {"gpus": [synthetic_gpu("0000:17:00.0", 0), synthetic_gpu("0000:b1:00.0", 1)]}
MPS_UNIT = "nvidia-mps@GPU-000017000.service"


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 2, "memory": "1G"}
    entry.update(changes)
    return entry


SERVICES = [
    p("a", gpus=1, mps={"active_thread_percentage": 50}),
    p("b", gpus=1, mps={"active_thread_percentage": 30}),
    p("c"),
    p("d"),
]


def rendered(plan: dict) -> tuple:
    unit_files = units.render_files(plan, units.DEFAULT_HEADER, True, units.DEFAULT_UNIT_DIR)
    daemons, dummy = mps.plan_daemons(plan)
    return unit_files, mps.render_files(daemons, units.DEFAULT_HEADER, units.DEFAULT_UNIT_DIR)


def applied(plan: dict) -> dict:
    """numafleet_recorded.files after an apply of plan: digests of every file and manifest."""
    unit_files, mps_files = rendered(plan)
    files = {path: digest(text) for path, text in {**unit_files, **mps_files}.items()}
    files.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
    return files


def plan_of(services, before=None) -> dict:
    recorded = None
    if before is not None:
        recorded = parse_recorded("h", {"state": "present", "plan": before}, "/p")
    return plan_host(
        "h",
        copy.deepcopy(NUMA),
        copy.deepcopy(GPUS),
        copy.deepcopy(services),
        [],
        {"reserved_cpus": "", "memory_headroom_pct": 10},
        recorded=recorded,
    )


def changes(services, before, **options) -> dict:
    new = plan_of(services, before)
    unit_files, mps_files = rendered(new)
    return change_plan("h", before, new, unit_files, mps_files, applied(before), **options)


def test_nothing_changed_is_no_change():
    first = plan_of(SERVICES)
    result = changes(SERVICES, first)
    assert not result["changed"] and result["refused"] == []
    assert [item["name"] for item in result["placements"]["kept"]] == ["a", "b", "c", "d"]
    assert result["lines"] == ["h: change plan: 0 added, 0 moved, 0 removed, 4 kept; no change"]


def test_one_mps_client_resized_restarts_only_that_client():
    first = plan_of(SERVICES)
    edited = copy.deepcopy(SERVICES)
    edited[1]["cpus"] = 4
    result = changes(edited, first)
    assert result["units"]["restart"] == ["numafleet-b.service"]
    assert result["units"]["restart_through"] == {}
    (moved,) = result["placements"]["moved"]
    assert moved["name"] == "b" and moved["reason"] == "its request changed (cpus 2 -> 4)"
    assert [item["name"] for item in result["placements"]["kept"]] == ["a", "c", "d"]
    assert "  restart: numafleet-b.service" in result["lines"]


def test_a_daemon_restart_shows_the_clients_systemd_restarts_with_it():
    first = plan_of(SERVICES)
    edited = copy.deepcopy(SERVICES)
    edited[0]["mps"]["active_thread_percentage"] = 70  # the daemon's default follows the max
    result = changes(edited, first)
    assert result["units"]["restart"] == ["numafleet-a.service", MPS_UNIT]
    assert result["units"]["restart_through"] == {"numafleet-b.service": f"Requires={MPS_UNIT}"}
    assert f"  restarted by systemd: numafleet-b.service (Requires={MPS_UNIT})" in result["lines"]


def test_restart_never_lists_what_awaits_a_restart():
    first = plan_of(SERVICES)
    edited = copy.deepcopy(SERVICES)
    edited[0]["mps"]["active_thread_percentage"] = 70
    result = changes(edited, first, restart="never")
    assert result["units"]["restart"] == [] and result["units"]["restart_through"] == {}
    assert result["units"]["awaiting_restart"] == [
        "numafleet-a.service",
        "numafleet-b.service",
        MPS_UNIT,
    ]


def test_added_and_removed_placements_start_and_stop_their_units():
    first = plan_of(SERVICES)
    result = changes([*SERVICES[:3], p("e")], first)
    assert [i["name"] for i in result["placements"]["added"]] == ["e"]
    assert [i["name"] for i in result["placements"]["removed"]] == ["d"]
    assert result["units"]["start"] == ["numafleet-e.service"]
    assert result["units"]["stop"] == ["numafleet-d.service"]
    assert result["refused"] == []


WAITS = {
    "mig_instance": "1g.10gb at slice 2 of GPU 0000:17:00.0",
    "gpu": "0000:17:00.0",
    "profile": "1g.10gb",
    "start": 2,
    "reason": "created in this run",
}


def test_a_placement_waiting_for_its_mig_instance_is_added_but_not_started():
    first = plan_of(SERVICES)
    new = plan_of([*SERVICES, p("e")], first)
    new["placements"][-1]["waits_for"] = dict(WAITS)
    unit_files, mps_files = rendered(new)
    result = change_plan("h", first, new, unit_files, mps_files, applied(first))
    (added,) = result["placements"]["added"]
    assert added["waits"] == (
        "waits for MIG instance 1g.10gb at slice 2 of GPU 0000:17:00.0: created in this run"
    )
    assert result["units"]["start"] == []
    assert list(result["units"]["waiting"]) == ["numafleet-e.service"]
    assert (
        f"  + add     e: {added['to']} (waits for MIG instance 1g.10gb at slice 2 of GPU "
        "0000:17:00.0: created in this run)"
    ) in result["lines"]
    assert (
        "  numafleet-e.service: not started, waits for MIG instance 1g.10gb at slice 2 of GPU "
        "0000:17:00.0: created in this run; enabled and started once it exists"
    ) in result["lines"]
    assert result["summary"] == "changes: 1 added; 1 waiting for a MIG instance"
    # The run after the instance exists: the unit (never started) is started, not restarted.
    done = plan_of([*SERVICES, p("e")], new)
    unit_files, mps_files = rendered(done)
    later = change_plan("h", new, done, unit_files, mps_files, applied(new))
    assert later["units"]["start"] == ["numafleet-e.service"]
    assert later["units"]["restart"] == [] and later["units"]["waiting"] == {}
    assert later["summary"] == "changes: 1 started"
    # and the run after that: no change
    again = change_plan("h", done, done, unit_files, mps_files, applied(done))
    assert again["summary"] == "no change" and again["units"]["start"] == []


@pytest.mark.parametrize(
    ("services", "options", "refused"),
    [
        ([], {}, "would remove every unit numafleet manages here"),
        (SERVICES[3:], {}, "would remove 4 units"),  # a, b, c and the MPS daemon
        (SERVICES[3:], {"max_removals": 4}, None),
        ([], {"allow_removals": True}, None),
        (SERVICES[1:], {}, None),
    ],
)
def test_blast_radius_guards(services, options, refused):
    first = plan_of(SERVICES)
    result = changes(services, first, **options)
    if refused is None:
        assert result["refused"] == []
    else:
        (message,) = result["refused"]
        assert message.startswith("host h: ") and refused in message
        assert "numafleet_allow_removals: true" in message and "Nothing was changed." in message


def test_without_a_recording_existing_units_are_unrecorded_not_added():
    first = plan_of(SERVICES)
    unit_files, mps_files = rendered(first)
    result = change_plan("h", None, first, unit_files, mps_files, applied(first))
    assert [i["name"] for i in result["placements"]["unrecorded"]] == ["a", "b", "c", "d"]
    assert not result["changed"]
    assert "no recorded plan on the host" in result["lines"][1]


def test_mig_layout_changes_from_the_gpus_current_state():
    plan = {"mig_gpus": [{"gpu": "g", "mode": "enabled", "layout": [
        {"profile": "1g.10gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}],
        "placements": [], "mps_daemons": []}  # fmt: skip
    topology = {"gpus": [{"address": "g", "mig": {"mode_current": "enabled", "gpu_instances": [
        {"profile_name": "2g.20gb", "placement_start": 0},
        {"profile_name": "3g.40gb", "placement_start": 4}]}}]}  # fmt: skip
    result = change_plan("h", plan, plan, {}, {}, {}, gpu_topology=topology)
    assert result["mig"] == [
        {"gpu": "g", "mode": None, "create": ["1g.10gb@0"], "destroy": ["2g.20gb@0"]}
    ]
    assert "  MIG g: destroy 2g.20gb@0; create 1g.10gb@0" in result["lines"]


def test_dependents_follow_requires_bindsto_and_partof():
    texts = {
        "/etc/systemd/system/x.service": "[Unit]\nRequires=a.service b.service\n",
        "/etc/systemd/system/y.service.d/50-numafleet.conf": "[Unit]\nPartOf=x.service\n",
        "/etc/systemd/system/z.service": "[Unit]\nWants=a.service\nAfter=a.service\n",
    }
    assert dependents(texts) == {
        "a.service": [("x.service", "Requires")],
        "b.service": [("x.service", "Requires")],
        "x.service": [("y.service", "PartOf")],
    }


def test_restarts_awaited_since_a_never_run_happen_on_the_next_auto_run():
    first = plan_of(SERVICES)
    edited = copy.deepcopy(SERVICES)
    edited[0]["mps"]["active_thread_percentage"] = 70
    never = changes(edited, first, restart="never")
    waiting = never["units"]["awaiting_restart"]
    assert waiting == ["numafleet-a.service", "numafleet-b.service", MPS_UNIT]
    # the apply wrote the files and recorded the plan with what awaits a restart
    applied_plan = plan_of(edited, first)
    applied_plan["awaiting_restart"] = waiting
    again = change_plan(
        "h", applied_plan, plan_of(edited, applied_plan), *rendered(applied_plan),
        applied(applied_plan), restart="never", awaited=waiting,
    )  # fmt: skip
    assert again["units"]["awaiting_restart"] == waiting  # still waiting, nothing restarted
    auto = change_plan(
        "h", applied_plan, plan_of(edited, applied_plan), *rendered(applied_plan),
        applied(applied_plan), awaited=waiting,
    )  # fmt: skip
    assert auto["units"]["restart_awaited"] == waiting and auto["units"]["awaiting_restart"] == []
    assert auto["changed"] and "3 restarted" in auto["summary"]
    assert any(line.startswith("  restart (awaited since a run") for line in auto["lines"])


def test_without_a_recording_a_run_that_disturbs_running_units_is_refused():
    first = plan_of(SERVICES)
    edited = copy.deepcopy(SERVICES)
    edited[2]["cpus"] = 4
    new = plan_of(edited)
    result = change_plan("h", None, new, *rendered(new), applied(first))
    (message,) = result["refused"]
    assert "no plan is recorded on this host" in message and "numafleet-c.service" in message
    assert "numafleet_repack: true" in message
    assert change_plan("h", None, new, *rendered(new), applied(first), repack=True)["refused"] == []


def test_memory_slices_and_pools_are_in_the_plan_too():
    tenants = [{"name": "t"}]
    services = [p("x", tenant="t"), p("y", tenant="t", hugepages={"size": "2M", "count": 8})]
    before = plan_host("h", copy.deepcopy(NUMA), {}, services, tenants, {"reserved_cpus": ""})
    edited = copy.deepcopy(services)
    edited[0]["memory"] = "2G"  # kept, resources unchanged
    edited[1]["hugepages"]["count"] = 16
    edited[1]["cpus"] = 4
    recorded = parse_recorded("h", {"state": "present", "plan": before}, "/p")
    new = plan_host(
        "h", copy.deepcopy(NUMA), {}, edited, tenants, {"reserved_cpus": ""}, recorded=recorded
    )
    result = change_plan("h", before, new, *rendered(new), applied(before))
    assert any(
        line.startswith("  = keep    x: ") and "memory_kb 1048576 -> 2097152" in line
        for line in result["lines"]
    ), result["lines"]
    assert result["hugepages"] == ["node0 2048kB 8 -> 16"]
    assert result["units"]["slices"]["changed"] == ["numafleet-t.slice"]
    assert "  changed slice: numafleet-t.slice (applied at daemon-reload)" in result["lines"]


def test_files_a_manifest_lists_but_numafleet_did_not_write_as_they_are_are_not_stopped():
    first = plan_of(SERVICES)
    recorded = applied(first)
    edited = "/etc/systemd/system/numafleet-d.service"
    recorded[edited] = "kept"  # numa_facts: edited since the apply wrote it
    recorded["/usr/lib/systemd/system/sshd.service"] = "kept"  # a foreign path in the manifest
    new = plan_of(SERVICES[:3], first)
    unit_files, mps_files = rendered(new)
    result = change_plan("h", first, new, unit_files, mps_files, recorded)
    assert result["units"]["stop"] == []
    assert result["units"]["not_removed"] == [edited, "/usr/lib/systemd/system/sshd.service"]
    assert f"  not removed: {edited} (listed by a manifest, but not as numafleet wrote it: " in (
        "\n".join(result["lines"])
    )
    # Still planned: the apply rewrites it, so it is not listed as kept.
    again = change_plan("h", first, first, *rendered(first), recorded)
    assert again["units"]["not_removed"] == ["/usr/lib/systemd/system/sshd.service"]
