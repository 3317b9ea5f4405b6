"""plugin_utils/_controller.py: reading what hosts registered."""

from __future__ import annotations

from ansible.errors import AnsibleUndefinedVariable

from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import registered


class Broken(dict):
    """A host's variables whose registered value cannot be templated."""

    def get(self, name, default=None):
        raise AnsibleUndefinedVariable(f"{name} is undefined")


def test_registered_returns_a_plain_dict_or_none():
    hostvars = {"a": {"r": {"checks": [1], "n": 2}, "s": "text"}, "b": Broken()}
    assert registered(hostvars, "a", "r") == {"checks": [1], "n": 2}
    assert registered(hostvars, "a", "s") is None  # not a registered result
    assert registered(hostvars, "a", "missing") is None
    assert registered(hostvars, "a", None) is None and registered(hostvars, "a", "") is None
    assert registered(hostvars, "z", "r") is None  # a host of the play without variables
    assert registered(hostvars, "b", "r") is None  # undefined or broken: as if never registered
