"""verify.guard_checks: the memory guard's service, config and last run, and the guard option."""

from __future__ import annotations

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import verify
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import VerifyError

HOST = "gpu-a100-01"
NOW = 1738324800.0
ON = {"enabled": True, "warn_pct": 80, "act_pct": 90, "act": "migrate", "interval_s": 15}


def read(**overrides) -> dict:
    """host_apply's measured guard (locality.read_guard) of a guard that runs as planned."""
    base = {
        "service": "numafleet-guard.service",
        "active": "active",
        "active_reason": None,
        "config_file": "/etc/numafleet/guard.json",
        "settings": {"warn_pct": 80, "act_pct": 90, "act": "migrate", "interval_s": 15},
        "config_reason": None,
        "state_file": "/run/numafleet-guard/state.json",
        "last_run": NOW - 10,
        "spilled": {},
        "state_reason": None,
        "read_at": NOW,
    }
    base.update(overrides)
    return base


def checks_of(guard=None, measured_guard=None, render_mode=False) -> dict:
    guard = ON if guard is None else guard
    measured = {"services": [], "nodes": [], "guard": measured_guard or read()}
    got = verify.guard_checks(HOST, guard, measured, render_mode)
    assert len({c.check for c in got}) == len(got)
    return {c.check: c for c in got}


def test_a_guard_running_as_planned_passes_all_three():
    got = checks_of()
    assert {name: c.status for name, c in got.items()} == {
        "guard_service": "pass",
        "guard_config": "pass",
        "guard_last_run": "pass",
    }
    assert got["guard_config"].subject == "/etc/numafleet/guard.json"
    assert got["guard_config"].message == (
        "/etc/numafleet/guard.json has this host's settings (warn 80%, act 90%, migrate, every "
        "15 s)"
    )
    last = got["guard_last_run"]
    assert (last.subject, last.measured, last.target, last.unit, last.detail) == (
        "numafleet-guard.service",
        10.0,
        45,
        "s",
        "10 s <= 45 s",
    )


@pytest.mark.parametrize(("age", "status"), [(45.0, "pass"), (45.5, "fail"), (-3.0, "pass")])
def test_last_run_boundary_is_three_intervals(age, status):
    check = checks_of(measured_guard=read(last_run=NOW - age))["guard_last_run"]
    assert check.status == status
    if status == "fail":
        assert check.message == (
            "the guard's last round was 46 s ago, more than 3 x 15 s: it is stuck or stopped; "
            "journalctl -u numafleet-guard says why"
        )


def test_no_state_file_fails_last_run_naming_the_file():
    check = checks_of(measured_guard=read(last_run=None, state_reason="absent"))["guard_last_run"]
    assert (check.status, check.detail) == ("fail", "state file absent")
    assert check.message.startswith("/run/numafleet-guard/state.json absent: the guard has not")


@pytest.mark.parametrize("word", ["inactive", "failed", "activating"])
def test_a_service_that_is_not_active_fails(word):
    check = checks_of(measured_guard=read(active=word))["guard_service"]
    assert (check.status, check.measured, check.detail) == ("fail", word, word)
    assert check.message.startswith(f"numafleet-guard.service is {word}, so nothing watches")
    assert "systemctl start numafleet-guard.service" in check.message


def test_a_service_state_not_asked_is_skipped_with_the_reason():
    check = checks_of(measured_guard=read(active=None, active_reason="systemctl is not installed"))
    assert check["guard_service"].status == "skipped"
    assert check["guard_service"].message == (
        "skipped: systemctl was not asked: systemctl is not installed"
    )


def test_config_differences_are_named_with_their_variables():
    settings = {"warn_pct": 80, "act_pct": 95, "act": "reclaim", "interval_s": 15.0}
    check = checks_of(measured_guard=read(settings=settings))["guard_config"]
    assert check.status == "fail"
    assert check.message == (
        "/etc/numafleet/guard.json: act_pct is 95 there, numafleet_memory_act_pct is 90; act is "
        "'reclaim' there, numafleet_memory_act is 'migrate'; run site.yml to write it (the guard "
        "reads it again by itself, no restart)"
    )
    assert check.detail == "act_pct is 95, act is 'reclaim'"
    assert check.measured == settings and check.target == {**ON}


def test_an_absent_config_fails_with_the_fix():
    check = checks_of(measured_guard=read(settings=None, config_reason="absent"))["guard_config"]
    assert (check.status, check.detail) == ("fail", "absent")
    assert check.message == (
        "/etc/numafleet/guard.json absent: the guard runs without this host's settings; run "
        "site.yml (role numafleet.tuning.memory_guard) to write it"
    )


def test_disabled_or_unset_guard_adds_no_check():
    assert checks_of(guard={"enabled": False}) == {}
    assert checks_of(guard={"enabled": "false"}) == {}
    assert verify.guard_checks(HOST, None, None) != []  # None: defaults, enabled: true


def test_a_plan_without_placements_adds_no_check():
    """The role installs nothing on such a host (no placement to guard, no unit to preflight)."""
    measured = {"services": [], "nodes": [], "guard": read(active="inactive", settings=None)}
    assert verify.guard_checks(HOST, ON, measured, plan={"placements": []}) == []
    planned = verify.guard_checks(HOST, ON, measured, plan={"placements": [{"name": "llm"}]})
    assert {c.check: c.status for c in planned}["guard_service"] == "fail"


def test_render_mode_and_no_guard_read_skip_the_three():
    for got, reason in (
        (checks_of(render_mode=True), "render mode: nothing runs"),
        (
            {c.check: c for c in verify.guard_checks(HOST, ON, {"services": [], "nodes": []})},
            "the measurement did not read the guard's files (host_apply measure.guard)",
        ),
    ):
        assert sorted(got) == sorted(verify.GUARD_CHECKS)
        assert all(c.status == "skipped" and c.detail == reason for c in got.values())


def test_require_runtime_fails_skipped_guard_checks():
    got = verify.require_runtime(verify.guard_checks(HOST, ON, None, render_mode=True))
    assert [c.status for c in got] == ["fail", "fail", "fail"]


def test_parse_guard_defaults_and_strings():
    assert verify.parse_guard(None) == {
        "enabled": True,
        "warn_pct": 80,
        "act_pct": 90,
        "act": "reclaim",
        "interval_s": 15,
    }
    given = {"enabled": "True", "warn_pct": "70", "act_pct": 85.0, "act": "throttle"}
    assert verify.parse_guard(dict(given, interval_s=None)) == {
        "enabled": True,
        "warn_pct": 70,
        "act_pct": 85,
        "act": "throttle",
        "interval_s": 15,
    }


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ([], "verify option guard is list, not a mapping"),
        ({"interval": 5}, "verify option guard has unknown key(s) interval; the keys are enabled"),
        ({"enabled": "maybe"}, "numafleet_memory_guard is 'maybe'; set it to true or false"),
        ({"act": "move"}, "numafleet_memory_act is 'move'; use one of reclaim, throttle, migrate"),
        ({"interval_s": 0}, "numafleet_memory_guard_interval is 0; set it to an integer from 1"),
        ({"warn_pct": 90}, "numafleet_memory_warn_pct (90) is not below numafleet_memory_act_pct"),
        ({"act_pct": 80.5}, "numafleet_memory_act_pct is 80.5; set it to an integer from 1 to 100"),
    ],
)
def test_parse_guard_refuses_naming_the_variable(guard, message):
    with pytest.raises(VerifyError) as err:
        verify.parse_guard(guard)
    assert message in str(err.value)
