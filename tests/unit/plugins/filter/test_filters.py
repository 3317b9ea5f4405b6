"""The cpulist and topology_summary filters: values, and clear errors for bad input."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.filter.cpulist import cpulist
from ansible_collections.numafleet.tuning.plugins.filter.topology_summary import topology_summary


@pytest.mark.parametrize(
    ("value", "text"),
    [([8, 3, 2, 1, 0], "0-3,8"), ([], ""), (["1", "2"], "1-2"), ("0,1,2-3,8", "0-3,8"), ("", "")],
)
def test_cpulist(value, text):
    assert cpulist(value) == text


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([-1, 2], "between 0 and"),
        ([1.5], "integers"),
        ([True, False], "integers"),
        ([99999999999], "between 0 and"),
        (42, "expected a list"),
        (None, "expected a list"),
        ({"a": 1}, "expected a list"),
        ("3-1", "runs backwards"),
    ],
)
def test_cpulist_rejects_with_a_message(value, reason):
    with pytest.raises(AnsibleFilterError) as err:
        cpulist(value)
    assert str(err.value).startswith("numafleet.tuning.cpulist: ") and reason in str(err.value)


@pytest.mark.parametrize(
    ("numa", "gpus", "reason"),
    [
        ("x", None, "expects ansible_facts.numa"),
        ({"nodes": "x"}, None, "does not have the shape"),
        ({"nodes": []}, "bad", "must be ansible_facts.gpu_topology"),
    ],
)
def test_topology_summary_rejects_with_a_message(numa, gpus, reason):
    with pytest.raises(AnsibleFilterError) as err:
        topology_summary(numa, gpus)
    assert reason in str(err.value)
