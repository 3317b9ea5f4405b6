"""verify.py: checks from plan + measurement, boundaries, and reports read back by real parsers."""

from __future__ import annotations

import json

import plan_shapes  # tests/unit/plan_shapes.py (on sys.path through tests/unit/conftest.py)
import pytest
from junitparser import Failure, JUnitXml, Skipped
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units, verify
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    VerifyError,
)

HOST = "gpu-a100-01"
RUN = {"generated_at": "2025-01-31T12:00:00Z", "mode": "live"}
RUN_EPOCH = 1738324800.0
GPU = "0000:17:00.0"


def placement(name="embed", **overrides) -> dict:
    """A placement in the plan's shape, without environment, with overrides."""
    return plan_shapes.placement(name, **{"environment": {}, **overrides})


def make_plan(*placements, nodes=None) -> dict:
    return {
        "version": 1,
        "host": HOST,
        "reserved_cpus": [0, 1],
        "memory_headroom_pct": 15,
        "placements": list(placements),
        "tenants": [],
        "nodes": nodes if nodes is not None else [plan_node(0)],
        "gpus": [],
        "mps_daemons": [],
        "warnings": [],
    }


def plan_node(nid, hugepages=(), memory_kb=1000) -> dict:
    return {
        "id": nid,
        "kind": "cpu+memory",
        "memory_kb": memory_kb,
        "budget_kb": memory_kb * 85 // 100,
        "hugepages": [{"size_kb": size, "count": count} for size, count in hugepages],
    }


def service(name="embed", **overrides) -> dict:
    """A measured service in numa_locality_info's shape (spec Part E)."""
    base = {
        "name": name,
        "unit": f"numafleet-{name}.service",
        "running": True,
        "pids": [100, 101],
        "binding": {
            "cpus_allowed": [2, 3, 4, 5],
            "mems_allowed": [0],
            "cpus_ok": True,
            "mems_ok": True,
        },
        "pages_kb": {"anon_huge_by_node": {"0": 1000}, "file_by_node": {"1": 50}},
        "offnode_share": 0.0,
        "gpu_locality": [],
        "remote_access": {"available": False, "ratio": None, "reason": "perf not found"},
    }
    base.update(overrides)
    return base


def mnode(nid, used_kb=100, total_kb=1000, hugepages=(), miss_ratio=None) -> dict:
    """A measured node in numa_locality_info's shape."""
    return {
        "id": nid,
        "memory_total_kb": total_kb,
        "memory_used_kb": used_kb,
        "memory_used_pct": round(used_kb * 100 / total_kb, 1) if total_kb else None,
        "hugepages": [{"size_kb": size, "total": total} for size, total in hugepages],
        "numastat": {"local_node": 10, "other_node": 0, "miss_ratio": miss_ratio},
    }


def measure(*services, nodes=None) -> dict:
    return {"services": list(services), "nodes": nodes if nodes is not None else [mnode(0)]}


def pick(checks, check, subject=None) -> verify.Check:
    found = [c for c in checks if c.check == check and (subject is None or c.subject == subject)]
    assert len(found) == 1, found
    return found[0]


# --- thresholds --------------------------------------------------------------------------------


def test_default_thresholds():
    assert verify.parse_thresholds(None) == {
        "cross_node_target_pct": 2,
        "memory_warn_pct": 80,
        "memory_fail_pct": 90,
    }
    assert verify.parse_thresholds({"memory_warn_pct": 70, "cross_node_target_pct": None}) == {
        "cross_node_target_pct": 2,
        "memory_warn_pct": 70,
        "memory_fail_pct": 90,
    }


@pytest.mark.parametrize(
    ("thresholds", "message"),
    [
        ([], "verify thresholds are list, not a mapping"),
        ({"memory_pct": 5}, "unknown key(s) memory_pct; the keys are cross_node_target_pct"),
        ({"memory_warn_pct": "80"}, "memory_warn_pct is '80', not a number"),
        ({"memory_warn_pct": True}, "memory_warn_pct is True, not a number"),
        ({"memory_fail_pct": 101}, "memory_fail_pct is 101; set it to a percentage between 0"),
        ({"cross_node_target_pct": -1}, "cross_node_target_pct is -1; set it"),
        ({"memory_warn_pct": 95}, "memory_warn_pct (95) is above memory_fail_pct (90)"),
    ],
)
def test_bad_thresholds_are_named(thresholds, message):
    with pytest.raises(VerifyError) as err:
        verify.parse_thresholds(thresholds)
    assert message in str(err.value)
    assert isinstance(err.value, NumaTuneError)


# --- per-service checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("share", "target", "status", "detail"),
    [
        (0.0, None, "pass", "0% <= 2%"),
        (0.02, None, "pass", "2% <= 2%"),  # exactly at the target passes
        (2 / 100, None, "pass", "2% <= 2%"),
        (0.0201, None, "fail", "2.01% > 2%"),  # rounding would hide it: more digits
        (1 / 14, None, "fail", "7.1% > 2%"),
        (0.05, 5, "pass", "5% <= 5%"),
        (0.051, 5, "fail", "5.1% > 5%"),
        (1.0, 0, "fail", "100% > 0%"),
        (0.0, 0, "pass", "0% <= 0%"),
    ],
)
def test_offnode_share_boundaries(share, target, status, detail):
    thresholds = None if target is None else {"cross_node_target_pct": target}
    checks = verify.evaluate(
        HOST, make_plan(placement()), measure(service(offnode_share=share)), thresholds
    )
    check = pick(checks, "offnode_share", "embed")
    assert (check.status, check.detail, check.unit) == (status, detail, "pct")
    assert check.measured == pytest.approx(share * 100)
    assert check.target == (2 if target is None else target)


def test_offnode_share_without_pages_is_skipped_not_passed():
    checks = verify.evaluate(HOST, make_plan(placement()), measure(service(offnode_share=None)))
    check = pick(checks, "offnode_share")
    assert check.status == "skipped"
    assert check.message == "skipped: no anonymous or hugetlb pages resident"


def spilled_measure(*services, spilled=None) -> dict:
    """A measurement with host_apply's ``guard`` (the memory guard's state file read)."""
    out = measure(*services)
    out["guard"] = {"spilled": spilled or {}, "last_run": RUN_EPOCH, "state_reason": None}
    return out


SPILL = {"from": [0], "to": [1], "since": RUN_EPOCH, "bytes": 943718400}


def test_a_placement_the_guard_moved_warns_spilled_instead_of_failing():
    checks = verify.evaluate(
        HOST,
        make_plan(placement(), placement("kv")),
        spilled_measure(
            service(offnode_share=0.3), service("kv", offnode_share=0.3), spilled={"embed": SPILL}
        ),
    )
    embed = pick(checks, "offnode_share", "embed")
    text = "spilled (numafleet-guard moved it to node 1 at 2025-01-31T12:00:00Z)"
    assert (embed.status, embed.detail) == ("warn", f"30% > 2%, {text}")
    assert embed.message.startswith(
        "30% of its anonymous and hugetlb memory is on nodes outside the plan's mems (target at "
        f"most 2%): {text}, as numafleet_memory_act: migrate does"
    )
    assert pick(checks, "offnode_share", "kv").status == "fail"  # not spilled: still a failure


def test_a_spilled_placement_back_under_the_target_passes():
    checks = verify.evaluate(
        HOST,
        make_plan(placement()),
        spilled_measure(service(offnode_share=0.01), spilled={"embed": SPILL}),
    )
    assert pick(checks, "offnode_share", "embed").status == "pass"


def test_spilled_to_two_nodes_and_no_guard_state():
    spill = dict(SPILL, to=[1, 2])
    checks = verify.evaluate(
        HOST,
        make_plan(placement()),
        spilled_measure(service(offnode_share=0.3), spilled={"embed": spill}),
    )
    assert "moved it to nodes 1,2 at" in pick(checks, "offnode_share").detail
    plain = measure(service(offnode_share=0.3))
    plain["guard"] = None  # host_apply did not read the guard's files
    assert pick(verify.evaluate(HOST, make_plan(placement()), plain), "offnode_share").status == (
        "fail"
    )


@pytest.mark.parametrize(
    ("binding", "cpus", "mems"),
    [
        ({"cpus_allowed": [2, 3, 4, 5], "mems_allowed": [0]}, "pass", "pass"),
        # narrower than planned (2-5): the kernel or the service narrowed it, never a pass
        (
            {"cpus_allowed": [2], "mems_allowed": [0], "cpus_ok": True, "mems_ok": True},
            "warn",
            "pass",
        ),
        ({"cpus_allowed": [0, 1, 2, 3], "mems_allowed": [0, 1]}, "fail", "fail"),
        # the module's per-PID verdict wins when the union looks fine
        ({"cpus_allowed": [2, 3], "mems_allowed": [0], "cpus_ok": False}, "fail", "pass"),
        ({"cpus_ok": True, "mems_ok": False}, "pass", "fail"),
        ({}, "skipped", "skipped"),
    ],
)
def test_binding(binding, cpus, mems):
    checks = verify.evaluate(HOST, make_plan(placement()), measure(service(binding=binding)))
    assert pick(checks, "cpus_binding").status == cpus
    assert pick(checks, "mems_binding").status == mems


def test_binding_failure_messages_name_the_lists_and_the_fix():
    binding = {"cpus_allowed": list(range(8)), "mems_allowed": [0, 1]}
    checks = verify.evaluate(HOST, make_plan(placement()), measure(service(binding=binding)))
    cpus, mems = pick(checks, "cpus_binding"), pick(checks, "mems_binding")
    assert cpus.message.startswith(
        "Cpus_allowed_list 0-7 is not within the plan's 2-5 (0-1,6-7 outside); restart"
    )
    assert (cpus.measured, cpus.target, cpus.unit) == ("0-7", "2-5", "cpulist")
    assert "Mems_allowed_list 0-1 is not within the plan's 0 (1 outside)" in mems.message
    assert "AllowedMemoryNodes" in mems.message


def test_a_binding_the_kernel_narrowed_warns_naming_the_missing_cpus():
    """A cpuset above the unit allows 2-3 of the planned 2-5: systemd's AllowedCPUs=2-5 ends
    up as Cpus_allowed_list 2-3, within the plan but not the plan (#22)."""
    binding = {"cpus_allowed": [2, 3], "mems_allowed": [0], "cpus_ok": True, "mems_ok": True}
    checks = verify.evaluate(HOST, make_plan(placement()), measure(service(binding=binding)))
    cpus = pick(checks, "cpus_binding")
    assert (cpus.status, cpus.measured, cpus.target) == ("warn", "2-3", "2-5")
    assert cpus.message.startswith(
        "Cpus_allowed_list 2-3 is narrower than the plan's 2-5: no process may use planned "
        "CPUs 4-5; the kernel narrowed the binding"
    )
    assert cpus.detail == "2-3 narrower than 2-5 (4-5 missing)"
    assert pick(checks, "mems_binding").status == "pass"
    assert verify.status_text(checks).startswith("warn")


def test_service_not_running_fails_and_skips_the_rest():
    plan = make_plan(placement(gpus=[{"address": GPU, "uuid": "GPU-1", "node": 0}]))
    checks = verify.evaluate(HOST, plan, measure(service(running=False, pids=[])))
    running = pick(checks, "running")
    assert running.status == "fail"
    assert running.message == (
        "numafleet-embed.service is not running (no processes in its cgroup); start it with "
        "systemctl start numafleet-embed.service"
    )
    rest = [c for c in checks if c.subject == "embed" and c.check != "running"]
    assert [c.check for c in rest] == [
        "cpus_binding",
        "mems_binding",
        "offnode_share",
        "gpu_locality",
    ]
    assert {c.status for c in rest} == {"skipped"}
    # only node0's memory passes: the skipped checks are not counted as passed
    assert verify.summary_line(HOST, checks) == (
        f"{HOST}: 1 passed, 1 failed, 5 skipped; status fail (5 of 7 checks not run); "
        "FAIL running embed not running"
    )


WAITS = {
    "mig_instance": "1g.10gb at slice 2 of GPU 0000:17:00.0",
    "gpu": "0000:17:00.0",
    "profile": "1g.10gb",
    "start": 2,
    "reason": "mode change pending a reset",
}


@pytest.mark.parametrize("running", [False, True])
def test_a_placement_waiting_for_its_mig_instance_warns_not_fails(running):
    gpus = [{"address": GPU, "uuid": "GPU-1", "node": 0, "mig": {"profile": "1g.10gb"}}]
    plan = make_plan(placement(gpus=gpus, waits_for=WAITS))
    measured = service(running=running, pids=[7] if running else [])
    checks = verify.evaluate(HOST, plan, measure(measured))
    check = pick(checks, "running", "embed")
    why = (
        "waits for MIG instance 1g.10gb at slice 2 of GPU 0000:17:00.0: mode change pending a reset"
    )
    assert (check.status, check.detail) == ("warn", why)
    if running:
        assert check.message.startswith(f"numafleet-embed.service runs although it {why}")
    else:
        assert check.message == (
            f"numafleet-embed.service is not started: it {why}; it is started once the "
            "instance exists"
        )
    rest = [c for c in checks if c.subject == "embed" and c.check != "running"]
    assert {(c.status, c.detail) for c in rest} == {("skipped", why)}
    # not measured at all (never started): the same warning, no failure
    alone = verify.evaluate(HOST, plan, measure())
    assert pick(alone, "running", "embed").status == "warn"
    assert "fail" not in {c.status for c in alone}


def test_service_missing_from_the_measurement_fails():
    checks = verify.evaluate(HOST, make_plan(placement()), measure(service("other")))
    running = pick(checks, "running", "embed")
    assert (running.status, running.detail) == ("fail", "not measured")
    assert "pass every planned service to numafleet.tuning.numa_locality_info" in running.message


def test_service_is_matched_by_unit_when_names_differ():
    measured = measure(service("renamed", unit="numafleet-embed.service"))
    checks = verify.evaluate(HOST, make_plan(placement()), measured)
    assert pick(checks, "running", "embed").status == "pass"


@pytest.mark.parametrize(
    ("plan_gpus", "measured_gpus", "status", "in_message"),
    [
        ([{"address": GPU, "node": 0}], [{"address": GPU, "node": 0, "ok": True}], "pass", "1 GPU"),
        (
            [{"address": GPU, "node": 0}],
            [{"address": GPU, "node": 1, "ok": False}],
            "fail",
            f"{GPU} on node1 not on the placement's nodes 0",
        ),
        (
            [{"address": GPU, "node": None}],
            [{"address": GPU, "node": None, "ok": None}],
            "warn",
            "numa_node is -1",
        ),
        ([{"address": GPU, "node": 0}], [], "fail", f"{GPU} not found on the host"),
    ],
)
def test_gpu_locality(plan_gpus, measured_gpus, status, in_message):
    plan = make_plan(placement(gpus=plan_gpus))
    checks = verify.evaluate(HOST, plan, measure(service(gpu_locality=measured_gpus)))
    check = pick(checks, "gpu_locality", "embed")
    assert check.status == status
    assert in_message in check.message


def test_gpu_on_a_memory_node_of_the_placement_is_local():
    plan = make_plan(placement(nodes=[0], mems=[2], gpus=[{"address": GPU, "node": 2}]))
    measured = measure(service(gpu_locality=[{"address": GPU, "node": 2, "ok": True}]))
    assert pick(verify.evaluate(HOST, plan, measured), "gpu_locality").status == "pass"


def test_service_without_gpus_has_no_gpu_check():
    checks = verify.evaluate(HOST, make_plan(placement()), measure(service()))
    assert [c.check for c in checks if c.subject == "embed"] == [
        "running",
        "cpus_binding",
        "mems_binding",
        "offnode_share",
    ]


# --- per-node checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used_kb", "total_kb", "thresholds", "status", "detail"),
    [
        (0, 1000, None, "pass", "0% < 80%"),
        (799, 1000, None, "pass", "79.9% < 80%"),
        (800, 1000, None, "warn", "80% >= 80%"),  # exactly 80 warns
        (899, 1000, None, "warn", "89.9% >= 80%"),
        (900, 1000, None, "fail", "90% >= 90%"),  # exactly 90 fails
        (1000, 1000, None, "fail", "100% >= 90%"),
        # 79.99999% rounds to 80 but is below it: more digits
        (7999999, 10000000, None, "pass", "79.99999% < 80%"),
        (500, 1000, {"memory_warn_pct": 50, "memory_fail_pct": 50}, "fail", "50% >= 50%"),
    ],
)
def test_memory_used_boundaries(used_kb, total_kb, thresholds, status, detail):
    measured = measure(nodes=[mnode(0, used_kb, total_kb)])
    check = pick(verify.evaluate(HOST, make_plan(), measured, thresholds), "memory_used", "node0")
    assert check.status == status
    assert check.detail == detail


def test_memory_used_falls_back_to_the_percentage():
    node = {"id": 1, "memory_used_pct": 85.0, "hugepages": []}
    checks = verify.evaluate(HOST, make_plan(nodes=[]), measure(nodes=[node]))
    check = pick(checks, "memory_used", "node1")
    assert (check.status, check.measured, check.target) == ("warn", 85.0, 80)


def test_memoryless_node_has_no_memory_check():
    checks = verify.evaluate(HOST, make_plan(), measure(nodes=[mnode(0), mnode(1, 0, 0)]))
    assert [c.subject for c in checks if c.check == "memory_used"] == ["node0"]


@pytest.mark.parametrize(
    ("planned", "reserved", "status", "in_message"),
    [
        ([(2048, 512)], [(2048, 512)], "pass", "match the plan"),
        ([(2048, 512)], [(2048, 510)], "fail", "2 MiB: 510 != 512"),
        ([(2048, 512)], [], "fail", "2 MiB: 0 != 512"),
        ([(1048576, 4)], [(1048576, 4), (2048, 0)], "pass", "match the plan"),
        ([(2048, 512)], [(2048, 512), (1048576, 2)], "warn", "1 GiB: 2 reserved, none planned"),
        ([], [(1048576, 2)], "warn", "1 GiB: 2 reserved, none planned"),
    ],
)
def test_hugepages_total(planned, reserved, status, in_message):
    plan = make_plan(nodes=[plan_node(0, planned)])
    check = pick(
        verify.evaluate(HOST, plan, measure(nodes=[mnode(0, hugepages=reserved)])),
        "hugepages_total",
        "node0",
    )
    assert check.status == status
    assert in_message in check.message
    assert check.unit == "pages"


def test_hugepages_compare_totals_not_free_pages():
    # numa_locality_info reports totals; a fully used pool (free 0) still matches.
    node = mnode(0, hugepages=[(2048, 512)])
    node["hugepages"][0]["free"] = 0
    plan = make_plan(nodes=[plan_node(0, [(2048, 512)])])
    assert pick(verify.evaluate(HOST, plan, measure(nodes=[node])), "hugepages_total").status == (
        "pass"
    )


def test_no_hugepage_check_without_pools_and_fail_for_unmeasured_node():
    plan = make_plan(nodes=[plan_node(0), plan_node(1, [(2048, 8)])])
    checks = verify.evaluate(HOST, plan, measure(nodes=[mnode(0)]))
    hp = [c for c in checks if c.check == "hugepages_total"]
    assert [(c.subject, c.status) for c in hp] == [("node1", "fail")]
    assert "not measured" in hp[0].message


# --- modes and static check --------------------------------------------------------------------


def test_render_mode_skips_runtime_checks_and_runs_the_static_one():
    plan = make_plan(
        placement(gpus=[{"address": GPU, "node": 0}]),
        nodes=[plan_node(0, [(2048, 4)]), plan_node(1, memory_kb=0)],
    )
    current = dict(units.render_files(plan))
    checks = verify.evaluate(HOST, plan, None, render_mode=True, current_files=current)
    rendered = pick(checks, "rendered_units")
    assert (rendered.subject, rendered.status) == ("numafleet-embed.service", "pass")
    runtime = [c for c in checks if c.check != "rendered_units"]
    assert [(c.check, c.subject) for c in runtime] == [
        ("running", "embed"),
        ("cpus_binding", "embed"),
        ("mems_binding", "embed"),
        ("offnode_share", "embed"),
        ("gpu_locality", "embed"),
        ("memory_used", "node0"),
        ("hugepages_total", "node0"),
    ]
    assert {(c.status, c.message) for c in runtime} == {
        ("skipped", "skipped: render mode: nothing runs")
    }
    assert verify.summary_line(HOST, checks) == (
        f"{HOST}: 1 passed, 0 failed, 7 skipped; status pass (render: 7 of 8 checks not run)"
    )


def test_render_mode_warns_for_a_waiting_placement_and_the_summary_says_so():
    # Not started in render mode either: running warns with the reason, never a plain skip.
    gpus = [{"address": GPU, "uuid": "GPU-1", "node": 0, "mig": {"profile": "1g.10gb"}}]
    plan = make_plan(placement(gpus=gpus, waits_for=WAITS))
    checks = verify.evaluate(HOST, plan, None, render_mode=True, current_files={})
    check = pick(checks, "running", "embed")
    why = (
        "waits for MIG instance 1g.10gb at slice 2 of GPU 0000:17:00.0: mode change pending a reset"
    )
    assert (check.status, check.detail) == ("warn", why)
    assert check.message.startswith("numafleet-embed.service is not started: it waits for")
    rest = [c for c in checks if c.subject == "embed" and c.check != "running"]
    assert rest and {(c.status, c.detail) for c in rest} == {("skipped", why)}
    line = verify.summary_line(HOST, checks)
    assert "; 1 waiting for a MIG instance (embed)" in line
    assert f"WARN running embed {why}" in line


def test_live_mode_needs_a_measurement():
    with pytest.raises(VerifyError) as err:
        verify.evaluate(HOST, make_plan(), None)
    assert str(err.value) == (
        f"host {HOST}: no measurement outside render mode; pass the result of "
        "numafleet.tuning.numa_locality_info"
    )


@pytest.mark.parametrize(
    ("plan", "measured", "message"),
    [
        ([], {}, f"host {HOST}: plan is list, not a mapping; pass ansible_facts.numafleet_plan"),
        ({}, "x", f"host {HOST}: measured is str, not a mapping; pass the result of numafleet"),
    ],
)
def test_inputs_of_the_wrong_shape(plan, measured, message):
    with pytest.raises(VerifyError) as err:
        verify.evaluate(HOST, plan, measured)
    assert str(err.value).startswith(message)


def test_rendered_units_missing_and_differing_files():
    plan = make_plan(placement(), placement("llm", unit="vllm.service", unit_kind="dropin"))
    want = units.render_files(plan)
    service_path = "/etc/systemd/system/numafleet-embed.service"
    dropin_path = "/etc/systemd/system/vllm.service.d/50-numafleet.conf"
    assert set(want) == {service_path, dropin_path}
    current = {service_path: want[service_path].replace("2-5", "2-7"), dropin_path: None}
    checks = verify.evaluate(HOST, plan, None, render_mode=True, current_files=current)
    embed = pick(checks, "rendered_units", "numafleet-embed.service")
    assert embed.status == "fail"
    assert embed.measured == {service_path: "differs"}
    assert f"{service_path} differs from the plan (first difference: @@ -" in embed.message
    vllm = pick(checks, "rendered_units", "vllm.service")
    assert (vllm.status, vllm.detail) == ("fail", "1 of 1 file(s) missing")
    assert vllm.message == (
        f"{dropin_path} is missing; run the playbook again to write the plan's units"
    )


def test_rendered_units_from_pinned_units_states():
    """pinned_units' check-mode files list: one check per unit, drop-ins with their unit."""
    states = [
        {"path": "/etc/systemd/system/numafleet-embed.service", "state": "unchanged"},
        {"path": "/etc/systemd/system/numafleet-llm.service", "state": "update"},
        {"path": "/etc/systemd/system/old.service.d/50-numafleet.conf", "state": "remove"},
        {"path": "/etc/systemd/system/vllm.service.d/50-numafleet.conf", "state": "create"},
        {"path": "/etc/numafleet/manifest.json", "state": "update"},
    ]
    plan = make_plan(placement())
    checks = verify.evaluate(HOST, plan, None, render_mode=True, unit_states=states)
    rendered = [c for c in checks if c.check == "rendered_units"]
    assert [(c.subject, c.status) for c in rendered] == [
        ("manifest", "fail"),
        ("numafleet-embed.service", "pass"),
        ("numafleet-llm.service", "fail"),
        ("old.service", "fail"),
        ("vllm.service", "fail"),
    ]
    llm = pick(checks, "rendered_units", "numafleet-llm.service")
    assert llm.measured == {"/etc/systemd/system/numafleet-llm.service": "differs"}
    assert "/etc/systemd/system/numafleet-llm.service differs from the plan" in llm.message
    assert "is not planned" in pick(checks, "rendered_units", "old.service").message
    assert "is missing" in pick(checks, "rendered_units", "vllm.service").message
    # unit_states wins over current_files; runtime checks are still skipped in render mode.
    both = verify.evaluate(
        HOST, plan, None, render_mode=True, current_files={}, unit_states=states[:1]
    )
    assert pick(both, "rendered_units").status == "pass"
    assert all(c.status == "skipped" for c in both if c.check != "rendered_units")


def test_rendered_units_from_no_states_passes_and_bad_states_raise():
    (check,) = verify.rendered_unit_checks(HOST, [])
    assert (check.subject, check.status) == ("units", "pass")
    with pytest.raises(VerifyError, match="state 'gone'; a state is one of"):
        verify.rendered_unit_checks(HOST, [{"path": "/etc/x.service", "state": "gone"}])
    with pytest.raises(VerifyError, match="not a mapping with a path"):
        verify.rendered_unit_checks(HOST, ["/etc/x.service"])
    with pytest.raises(VerifyError, match="unit_states is dict, not a list"):
        verify.rendered_unit_checks(HOST, {})


def test_rendered_units_without_files_is_skipped_and_bad_plan_fails():
    checks = verify.evaluate(HOST, make_plan(), measure())
    assert pick(checks, "rendered_units").status == "skipped"
    bad = make_plan()
    bad["version"] = 99
    check = pick(verify.evaluate(HOST, bad, measure(), current_files={}), "rendered_units")
    assert (check.subject, check.status) == ("plan", "fail")
    assert "plan version is 99" in check.message


# --- summary and reports -----------------------------------------------------------------------


def mixed_checks() -> list:
    """Checks of two hosts: one failing and warning, one clean."""
    plan = make_plan(placement(), placement("llm", cpus=[6, 7]))
    measured = measure(
        service(offnode_share=1 / 14),
        service("llm", binding={"cpus_allowed": [6, 7], "mems_allowed": [0]}),
        nodes=[mnode(0, 850)],
    )
    first = verify.evaluate(HOST, plan, measured, current_files=units.render_files(plan))
    second = verify.evaluate("cpu-01", make_plan(), measure(nodes=[mnode(0, 10)]))
    return first + second


def test_summary_line():
    checks = mixed_checks()
    assert verify.summary_line(HOST, checks) == (
        f"{HOST}: 9 passed, 1 warned, 1 failed, 0 skipped; FAIL offnode_share embed 7.1% > 2%; "
        "WARN memory_used node0 85% >= 80%"
    )
    assert verify.summary_line("cpu-01", checks) == (
        "cpu-01: 1 passed, 0 failed, 1 skipped; status pass (1 of 2 checks not run)"
    )


def test_summary_line_caps_the_problems():
    checks = [
        verify.Check(HOST, "running", f"s{i}", "fail", False, True, "bool", "m", "not running")
        for i in range(7)
    ]
    line = verify.summary_line(HOST, checks)
    assert line.endswith("FAIL running s4 not running; and 2 more")


def test_json_report_schema():
    checks = mixed_checks()
    report = json.loads(json.dumps(verify.as_json_report(RUN, checks)))
    assert report["schema"] == "numafleet.verify/1"
    assert report["generated_at"] == RUN["generated_at"]
    assert report["run"] == {"mode": "live"}
    assert report["status"] == "fail"
    assert list(report["hosts"]) == ["cpu-01", HOST]
    assert report["hosts"]["cpu-01"]["status"] == "pass"
    assert report["hosts"][HOST]["status"] == "fail"
    assert report["hosts"][HOST]["summary"] == verify.summary_line(HOST, checks)
    assert report["totals"] == {
        "hosts": 2,
        "checks": 13,
        "pass": 10,
        "fail": 1,
        "warn": 1,
        "skipped": 1,
        "hosts_by_status": {"pass": 1, "fail": 1, "warn": 0, "skipped": 0},
    }
    entry = report["hosts"][HOST]["checks"][0]
    assert set(entry) == {
        "host",
        "check",
        "subject",
        "status",
        "measured",
        "target",
        "unit",
        "message",
        "detail",
    }
    # Checks come back from JSON (hostvars) and give the same report.
    again = [c for host in report["hosts"].values() for c in host["checks"]]
    assert verify.as_json_report(RUN, again) == report


def test_only_skipped_host_is_skipped_not_passed():
    checks = verify.evaluate(HOST, make_plan(placement()), None, render_mode=True)
    report = verify.as_json_report(RUN, checks)
    assert report["hosts"][HOST]["status"] == "skipped"
    assert report["totals"]["pass"] == 0


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({}, "verify run has generated_at None; pass an ISO 8601 time"),
        ({"generated_at": "yesterday"}, "generated_at 'yesterday', which is not ISO 8601"),
    ],
)
def test_report_needs_a_generation_time(run, message):
    with pytest.raises(VerifyError) as err:
        verify.as_json_report(run, [])
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "a check is str, not a mapping"),
        ({"host": HOST}, "lacks check, subject, status, measured, target, unit, message"),
        (
            {**verify.Check(HOST, "c", "s", "pass", 1, 1, "pct", "m").as_dict(), "status": "ok"},
            "has status 'ok'; a status is one of pass, fail, warn, skipped",
        ),
    ],
)
def test_bad_checks_are_reported(value, message):
    with pytest.raises(VerifyError) as err:
        verify.summary_line(HOST, [value])
    assert message in str(err.value)


def test_junit_xml_parses_with_junitparser():
    checks = mixed_checks()
    text = verify.as_junit_xml(checks, RUN)
    xml = JUnitXml.fromstring(text)
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (13, 1, 0, 1)
    suites = {suite.name: suite for suite in xml}
    assert sorted(suites) == ["cpu-01", HOST]
    suite = suites[HOST]
    assert (suite.tests, suite.failures, suite.skipped, suite.timestamp) == (
        11,
        1,
        0,
        RUN["generated_at"],
    )
    assert {p.name: p.value for p in suite.properties()} == {
        "warnings": "1",
        "status": "fail",
        "status_text": "fail",
        "not_run": "0",
    }
    cases = {(case.classname, case.name): case for case in suite}
    assert len(cases) == 11
    failed = cases[(f"{HOST}.offnode_share", "embed")]
    (result,) = failed.result
    assert isinstance(result, Failure)
    assert result.message.startswith("7.1% of its anonymous and hugetlb memory is on nodes")
    assert result.type == "offnode_share"
    assert cases[(f"{HOST}.memory_used", "node0")].system_out.startswith("WARN: 85% of its")
    assert cases[(f"{HOST}.running", "embed")].is_passed
    skipped = next(case for case in suites["cpu-01"] if case.name == "units")
    assert isinstance(skipped.result[0], Skipped)
    assert skipped.result[0].message == "skipped: no rendered files given"


def test_junit_xml_escapes_markup_and_control_characters():
    nasty = 'a<b>&"c"\x01\x1b[0m'
    checks = [verify.Check(HOST, "running", nasty, "fail", None, True, "bool", nasty)]
    xml = JUnitXml.fromstring(verify.as_junit_xml(checks))
    (case,) = next(iter(xml))
    assert case.name == 'a<b>&"c"\ufffd\ufffd[0m'
    assert case.result[0].message == case.name


def test_prometheus_text_parses_with_the_client_parser():
    checks = mixed_checks()
    measured = {
        HOST: measure(
            service(offnode_share=0.25, remote_access={"available": True, "ratio": 0.1}),
            service("llm", offnode_share=None),
            nodes=[mnode(0, 850, miss_ratio=0.05), mnode(1, 250)],
        ),
        "cpu-01": measure(nodes=[mnode(0, 10)]),
    }
    text = verify.as_prometheus_text(checks, measured, RUN)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert sorted(families) == sorted(verify.METRICS)
    assert {f.type for f in families.values()} == {"gauge"}
    assert all(f.documentation for f in families.values())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }

    def value(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    status = families["numafleet_check_status"].samples
    assert len(status) == 4 * 13
    assert value(
        "numafleet_check_status", host=HOST, check="offnode_share", subject="embed", status="fail"
    ) == (1.0)
    assert value(
        "numafleet_check_status", host=HOST, check="offnode_share", subject="embed", status="pass"
    ) == (0.0)
    assert sum(s.value for s in status) == 13  # one status per check
    assert value("numafleet_verify_checks", host=HOST, status="warn") == 1.0
    assert value("numafleet_verify_last_run_timestamp_seconds", host="cpu-01") == RUN_EPOCH
    assert value("numafleet_offnode_share_ratio", host=HOST, service="embed") == 0.25
    assert ("numafleet_offnode_share_ratio", (("host", HOST), ("service", "llm"))) not in samples
    assert value("numafleet_remote_access_ratio", host=HOST, service="embed") == 0.1
    assert value("numafleet_node_memory_used_ratio", host=HOST, node="1") == 0.25
    assert value("numafleet_node_allocation_miss_ratio", host=HOST, node="0") == 0.05
    # Every line is a comment or a sample; HELP and TYPE come before each family's samples.
    lines = text.splitlines()
    assert text.endswith("\n")
    for name in verify.METRICS:
        help_at = lines.index(next(line for line in lines if line.startswith(f"# HELP {name} ")))
        assert lines[help_at + 1] == f"# TYPE {name} gauge"
        assert lines[help_at + 2].startswith(name + "{")


@pytest.mark.parametrize(
    "label",
    ['quote"d', "back\\slash", "new\nline", "brace}{=,", "ünïcode", "trailing\\"],
)
def test_prometheus_label_values_round_trip(label):
    checks = [verify.Check(label, "running", label, "pass", True, True, "bool", "m")]
    measured = {label: {"services": [service(label, offnode_share=0.5)], "nodes": []}}
    text = verify.as_prometheus_text(checks, measured)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (share,) = families["numafleet_offnode_share_ratio"].samples
    assert share.labels == {"host": label, "service": label}
    assert {s.labels["subject"] for s in families["numafleet_check_status"].samples} == {label}


def test_prometheus_text_of_nothing_is_empty():
    assert verify.as_prometheus_text([]) == ""
    assert list(text_string_to_metric_families(verify.as_prometheus_text([]))) == []


def test_prometheus_series_appear_once():
    check = verify.Check(HOST, "running", "embed", "pass", True, True, "bool", "m")
    twice = {HOST: measure(service(offnode_share=0.1), service(offnode_share=0.9), nodes=[])}
    text = verify.as_prometheus_text([check, check], twice)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert len(families["numafleet_check_status"].samples) == 4
    (share,) = families["numafleet_offnode_share_ratio"].samples
    assert share.value == 0.1


# --- skipped is not pass (issue 21) -----------------------------------------------------------


def render_checks(host=HOST):
    passed = verify.Check(host, "rendered_units", "u.service", "pass", True, True, "file", "ok")
    skipped = [
        verify.Check(
            host,
            "running",
            f"s{i}",
            "skipped",
            None,
            True,
            "bool",
            f"skipped: {verify.RENDER_MODE_REASON}",
            verify.RENDER_MODE_REASON,
        )
        for i in range(3)
    ]
    return [passed, *skipped]


def test_status_text_says_how_many_checks_were_not_run():
    checks = render_checks()
    assert verify.status_text(checks) == "pass (render: 3 of 4 checks not run)"
    assert verify.status_text(checks[:1]) == "pass"
    no_pages = verify.Check(
        HOST, "offnode_share", "e", "skipped", None, 2, "pct", "skipped: no pages", "no pages"
    )
    live = [*checks[:1], no_pages]
    assert verify.status_text(live) == "pass (1 of 2 checks not run)"
    report = verify.as_json_report(RUN, checks)
    assert report["status"] == "pass"  # the machine field keeps its values
    assert report["status_text"] == "pass (3 of 4 checks not run)"
    assert report["hosts"][HOST]["status_text"] == "pass (render: 3 of 4 checks not run)"
    assert report["hosts"][HOST]["not_run"] == 3
    prom = verify.as_prometheus_text(checks, None, RUN)
    assert f'numafleet_verify_checks_not_run{{host="{HOST}"}} 3.0' in prom.splitlines()


def test_require_runtime_turns_skipped_runtime_checks_into_failures():
    checks = verify.require_runtime(render_checks())
    assert [c.status for c in checks] == ["pass", "fail", "fail", "fail"]
    assert checks[1].message == (
        "not run (render mode: nothing runs); numafleet_verify_require_runtime is true: run "
        "verify on the host itself (not in render mode), or set it to false"
    )
    assert verify.status_text(checks) == "fail"


# --- effective_units ---------------------------------------------------------------------------


def _effective(tmp_path, plan, extra=None):
    """The units layer's effective list for ``plan`` written under tmp_path, plus ``extra`` files."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import effective

    desired = units.render_files(plan)
    for path, text in {**desired, **(extra or {})}.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    entries, dummy = effective.evaluate(str(tmp_path), desired)
    return entries


OVERRIDE = "/etc/systemd/system/numafleet-embed.service.d/override.conf"


def test_effective_units_pass_when_nothing_overrides(tmp_path):
    plan = make_plan(placement())
    entries = _effective(tmp_path, plan)
    checks = verify.evaluate(HOST, plan, measure(service()), effective=entries)
    check = pick(checks, "effective_units", "embed")
    assert check.status == "pass"
    assert check.measured["NUMAPolicy"] == "bind"
    assert pick(checks, "cpus_binding", "embed").status == "pass"


def test_foreign_override_fails_effective_and_binding_checks_naming_the_file(tmp_path):
    plan = make_plan(placement())
    entries = _effective(
        tmp_path, plan, {OVERRIDE: "[Service]\nCPUAffinity=\nNUMAPolicy=default\n"}
    )
    # The processes still run with the old binding (not restarted): measured within the plan.
    checks = verify.evaluate(HOST, plan, measure(service()), effective=entries)
    check = pick(checks, "effective_units", "embed")
    assert check.status == "fail"
    assert OVERRIDE in check.message and "systemctl revert numafleet-embed.service" in check.message
    assert check.measured["NUMAPolicy"] == "default" and check.target["NUMAPolicy"] == "bind"
    cpus, mems = pick(checks, "cpus_binding", "embed"), pick(checks, "mems_binding", "embed")
    assert cpus.status == mems.status == "fail"
    assert "CPUAffinity is (unset)" in cpus.message and OVERRIDE in cpus.message
    assert "NUMAPolicy is default" in mems.message and "CPUAffinity" not in mems.message


def test_effective_units_runs_in_render_mode(tmp_path):
    plan = make_plan(placement())
    extra = {
        "/etc/systemd/system.control/numafleet-embed.service.d/50-AllowedMemoryNodes.conf": (
            "[Service]\nAllowedMemoryNodes=0-1\n"
        )
    }
    entries = _effective(tmp_path, plan, extra)
    checks = verify.evaluate(HOST, plan, None, render_mode=True, effective=entries)
    assert pick(checks, "effective_units", "embed").status == "fail"
    assert "50-AllowedMemoryNodes.conf" in pick(checks, "effective_units", "embed").message
    assert pick(checks, "mems_binding", "embed").status == "skipped"


def test_live_difference_fails_effective_units(tmp_path):
    plan = make_plan(placement())
    entries = _effective(tmp_path, plan)
    entries[0]["live"] = {"NUMAPolicy": "default"}
    checks = verify.evaluate(HOST, plan, measure(service()), effective=entries)
    check = pick(checks, "effective_units", "embed")
    assert check.status == "fail" and "systemctl show" in check.message
    assert pick(checks, "mems_binding", "embed").status == "fail"


def test_unreadable_dropin_warns(tmp_path):
    import os

    plan = make_plan(placement())
    (tmp_path / "etc/systemd/system/numafleet-embed.service.d").mkdir(parents=True)
    os.symlink("/etc/elsewhere.conf", tmp_path / OVERRIDE.lstrip("/"))
    entries = _effective(tmp_path, plan)
    check = pick(
        verify.evaluate(HOST, plan, None, render_mode=True, effective=entries), "effective_units"
    )
    assert check.status == "warn" and OVERRIDE in check.message


def test_effective_of_the_wrong_shape_is_refused():
    with pytest.raises(VerifyError, match="effective is dict"):
        verify.evaluate(HOST, make_plan(placement()), None, render_mode=True, effective={})


def test_require_runtime_keeps_layer_static_and_waiting_checks_skipped():
    """Only runtime checks fail for not being run: a layer check skipped because the host has no
    such layer, a static check and the checks of a placement waiting for its MIG instance stay
    skipped."""

    def skipped(check, reason):
        return verify.Check(
            HOST, check, "x", "skipped", None, None, "", f"skipped: {reason}", reason
        )

    checks = [
        skipped("mig_layout", "no MIG GPU in the plan (numafleet_gpu_partitions)"),
        skipped("effective_units", "no effective state given"),
        skipped("cpus_binding", "waits for MIG instance 1g.10gb at slice 2: created in this run"),
        skipped("memory_used", verify.RENDER_MODE_REASON),
    ]
    assert [c.status for c in verify.require_runtime(checks)] == [
        "skipped", "skipped", "skipped", "fail"
    ]  # fmt: skip
    # render: names render mode even when other checks were skipped for their own reasons; the
    # layer check of a layer the host does not have is not "not run" and not counted
    assert verify.status_text(checks) == "skipped (render: 3 of 3 checks not run)"
    assert [c.check for c in verify.not_run(checks)] == [
        "effective_units", "cpus_binding", "memory_used"
    ]  # fmt: skip
    report = verify.as_json_report(RUN, checks)
    assert report["hosts"][HOST]["not_run"] == 3


def test_unreadable_dropin_fails_not_passes(tmp_path):
    import os

    plan = make_plan(placement())
    (tmp_path / "etc/systemd/system/numafleet-embed.service.d").mkdir(parents=True)
    os.mkfifo(tmp_path / OVERRIDE.lstrip("/"))
    entries = _effective(tmp_path, plan)
    check = pick(
        verify.evaluate(HOST, plan, None, render_mode=True, effective=entries), "effective_units"
    )
    assert check.status == "fail" and OVERRIDE in check.message
    assert "cannot be read" in check.message and "(unreadable) overridden" in check.detail


def test_fix_names_revert_only_for_the_units_own_dropins(tmp_path):
    plan = make_plan(placement())
    prefix = "/etc/systemd/system/numafleet-.service.d/10-x.conf"
    entries = _effective(tmp_path, plan, {prefix: "[Service]\nNUMAPolicy=interleave\n"})
    check = pick(
        verify.evaluate(HOST, plan, None, render_mode=True, effective=entries), "effective_units"
    )
    assert check.status == "fail" and prefix in check.message
    assert "systemctl revert numafleet-embed.service" not in check.message
    assert "systemctl revert does not remove it" in check.message
