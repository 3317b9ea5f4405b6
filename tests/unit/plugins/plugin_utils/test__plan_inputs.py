"""The planner's and the measurement's inputs from a host's variables, and verify.yml's checks
(_apply_args.verify_problems, next to drift_check.yml's measure_problems)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.action.numa_plan import (
    ARGUMENT_SPEC as PLAN_SPEC,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _apply_args, _plan_inputs
from ansible_collections.numafleet.tuning.plugins.plugin_utils._host_vars import BY_NAME

LLM = {"name": "llm", "exec": "/opt/llm/bin/serve", "cpus": 8, "memory": "16G"}


def test_unset_variables_take_the_schema_defaults():
    inputs = _plan_inputs.plan_inputs({})
    assert inputs == {
        option: BY_NAME[name].default for option, name in _plan_inputs.PLAN_VARIABLES.items()
    }
    assert inputs["placements"] == [] and inputs["max_removals"] == 2
    assert inputs["restart"] == "auto" and inputs["allow_removals"] is False
    assert inputs["amd_reset_ok"] is False
    assert _plan_inputs.plan_inputs({"numafleet_amd_reset_ok": True})["amd_reset_ok"] is True


def test_every_plan_variable_feeds_an_option_of_numa_plan():
    assert set(_plan_inputs.PLAN_VARIABLES) <= set(PLAN_SPEC)
    for name in _plan_inputs.PLAN_VARIABLES.values():
        assert name in BY_NAME, name


def test_set_variables_are_taken_as_they_are():
    variables = {"numafleet_placements": [LLM], "numafleet_reserved_cpus": "0-1", "other": 1}
    inputs = _plan_inputs.plan_inputs(variables)
    assert inputs["placements"] == [LLM] and inputs["reserved_cpus"] == "0-1"


def test_replan_inputs_are_options_of_the_module():
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    from ansible_collections.numafleet.tuning.plugins.modules import host_apply

    replan = _plan_inputs.replan_inputs({"numafleet_gpu_snapshot": "/x.json"}, {"numa": {}})
    checked = ArgumentSpecValidator(host_apply.REPLAN_SPEC).validate(replan)
    assert not checked.error_messages
    measured = _plan_inputs.measure_inputs({})
    assert not ArgumentSpecValidator(host_apply.MEASURE_SPEC).validate(measured).error_messages


def test_replan_inputs_read_null_as_none_and_keep_the_roots():
    variables = {
        "numafleet_placements": None,
        "numafleet_tenants": None,
        "numafleet_reserved_cpus": None,
        "numafleet_sysfs_root": "/srv/rec/sys",
        "numafleet_gpu_snapshot": "/srv/rec/gpu.json",
    }
    replan = _plan_inputs.replan_inputs(variables, {"numa": {"nodes": []}})
    assert replan["numa"] == {"nodes": []}
    assert replan["placements"] == [] and replan["tenants"] == []
    assert replan["policy"] == {"reserved_cpus": "", "memory_headroom_pct": 15, "partition": False}
    assert (replan["sysfs_root"], replan["procfs_root"], replan["gpu_snapshot"]) == (
        "/srv/rec/sys",
        "/proc",
        "/srv/rec/gpu.json",
    )


def test_replan_inputs_leave_out_an_unset_snapshot():
    replan = _plan_inputs.replan_inputs({}, {})
    assert "gpu_snapshot" not in replan and replan["numa"] == {}


def test_measure_inputs_defaults_and_window_as_a_number():
    assert _plan_inputs.measure_inputs({}) == {
        "sysfs_root": "/sys",
        "procfs_root": "/proc",
        "cgroup_root": "/sys/fs/cgroup",
        "window_s": 5.0,
        "perf": "auto",
        "guard": {"service": True},
    }
    measured = _plan_inputs.measure_inputs({"numafleet_verify_window_s": "0.5"})
    assert measured["window_s"] == 0.5


@pytest.mark.parametrize(
    ("value", "service"), [(True, True), (False, False), ("false", False), ("yes", True)]
)
def test_measure_inputs_ask_the_guard_service_where_the_guard_is_enabled(value, service):
    measured = _plan_inputs.measure_inputs({"numafleet_memory_guard": value})
    assert measured["guard"] == {"service": service}


@pytest.mark.parametrize("window", [0, 5, "5", "0.5", 3600, "3600.0"])
def test_verify_accepts_right_settings(window):
    assert _apply_args.verify_problems("h", {"numafleet_verify_window_s": window}) == []


@pytest.mark.parametrize("window", [-1, "5s", "", "3601", "1e3", "٣", True, [5]])
def test_verify_refuses_a_bad_window_naming_both_settings(window):
    (problem,) = _apply_args.verify_problems("h", {"numafleet_verify_window_s": window})
    assert problem.startswith("host h: numafleet_verify_window_s is '")
    assert "numafleet_verify_perf is 'auto'" in problem
    assert "a number of seconds from 0 to 3600" in problem


def test_verify_refuses_a_bad_perf_setting():
    (problem,) = _apply_args.verify_problems("h", {"numafleet_verify_perf": "always"})
    assert "numafleet_verify_perf is 'always'" in problem and "auto or never" in problem


@pytest.mark.parametrize("root", ["", "/", "//", "render", ["/x"]])
def test_verify_refuses_a_render_root_that_is_not_an_absolute_directory(root):
    problems = _apply_args.verify_problems("h", {"numafleet_render_root": root})
    assert len(problems) == 1 and problems[0].startswith("host h: numafleet_render_root is '")
    assert "absolute directory other than /" in problems[0]


def test_verify_accepts_no_render_root_or_an_absolute_one():
    assert _apply_args.verify_problems("h", {"numafleet_render_root": None}) == []
    assert _apply_args.verify_problems("h", {"numafleet_render_root": "/srv/r/h/"}) == []


@given(st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none()))
def test_verify_never_raises(window):
    problems = _apply_args.verify_problems("h", {"numafleet_verify_window_s": window})
    assert isinstance(problems, list)


MIG = [{"gpu": "0000:17:00.0", "mode": "enabled"}]


@pytest.mark.parametrize("name", ["numafleet_gpu_partitions", "numafleet_mig_gpus"])
def test_replan_hands_the_one_partition_list_under_either_name(name):
    replan = _plan_inputs.replan_inputs({name: MIG}, {})
    assert replan["mig_gpus"] == MIG
    assert "gpu_partitions" not in replan
