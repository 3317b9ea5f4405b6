"""serial_batches / fail_percentage: site.yml's rolling-update keywords, checked with a fix."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.filter.batches import (
    fail_percentage,
    failed_plans,
    serial_batches,
)


@pytest.mark.parametrize(
    ("value", "want"),
    [(0, 0), ("3", 3), (5, 5), ("25%", "25%"), ([1, "10%", "50"], [1, "10%", 50])],
)
def test_batch_sizes_ansible_takes(value, want):
    assert serial_batches(value) == want


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("abc", "numafleet_serial: 'abc'"),
        ("", "numafleet_serial: ''"),
        (-1, "numafleet_serial: -1"),
        ("0%", "numafleet_serial: '0%'"),
        ("101%", "numafleet_serial: '101%'"),
        (True, "numafleet_serial: True"),
        ([1, "x"], "numafleet_serial[1]: 'x'"),
        ([], "numafleet_serial: []"),
    ],
)
def test_bad_batch_sizes_name_the_variable_and_the_forms(value, where):
    with pytest.raises(AnsibleFilterError) as err:
        serial_batches(value)
    assert str(err.value).startswith(where)
    assert "a percentage of the play's hosts ('25%')" in str(err.value)


@pytest.mark.parametrize(("value", "want"), [(0, 0), ("100", 100), (25, 25)])
def test_fail_percentages(value, want):
    assert fail_percentage(value) == want


@pytest.mark.parametrize("value", ["abc", 101, -5, True, "", None])
def test_bad_fail_percentages(value):
    with pytest.raises(AnsibleFilterError, match="numafleet_max_fail_percentage: .* whole number"):
        fail_percentage(value)


def test_failed_plans_names_only_hosts_whose_plan_failed():
    hostvars = {
        "ok": {"__plan": {"failed": False}},
        "bad-plan": {"__plan": {"failed": True, "msg": "x"}},
        "bad-vars": {"__check": {"failed": True}, "__plan": {"skipped": True}},
        "unreachable": {},
        "still-in": {"__plan": {"failed": True}},
    }
    hosts = list(hostvars)
    failed = failed_plans(hostvars, hosts, ["ok", "still-in"], ["__check", "__plan"])
    assert failed == ["bad-plan", "bad-vars"]


def test_failed_plans_is_empty_when_every_host_is_in():
    hostvars = {"a": {"__plan": {"failed": True}}}
    assert failed_plans(hostvars, ["a"], ["a"], ["__plan"]) == []
