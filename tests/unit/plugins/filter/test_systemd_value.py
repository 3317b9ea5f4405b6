"""numafleet.tuning.systemd_value: the drift_timer templates' escaping, read back by systemd_syntax."""

from __future__ import annotations

import pytest
import systemd_syntax as sd
from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.filter.systemd_value import (
    FilterModule,
    systemd_value,
)


def test_registered():
    assert FilterModule().filters() == {"systemd_value": systemd_value}


@pytest.mark.parametrize(
    ("value", "context", "read"),
    [
        ("drift of /srv/inv 100%", "text", sd.description),
        ("/srv/my project", "path", sd.path_value),
        ("root", "account", sd.plain_value),
        ("Mon..Fri 06:30", "calendar", sd.plain_value),
        ("2h 30min", "timespan", sd.plain_value),
    ],
)
def test_unquoted_contexts_read_back(value, context, read):
    assert read(systemd_value(value, context)) == value


def test_exec_and_environment_read_back():
    argv = ["/usr/bin/flock", "/srv/my inv 100%", "x=$HOME \"q\" 'q' \\", ";", ""]
    assert sd.exec_command(systemd_value(argv, "exec")) == ("", argv)
    env = {"B": "100% $x \\", "A": ""}
    words = systemd_value(env, "environment")
    assert [sd.environment(word) for word in words] == [{"A": ""}, {"B": "100% $x \\"}]


@pytest.mark.parametrize(
    ("value", "context", "fragment"),
    [
        ("/srv/inv\\", "path", "ends in a backslash"),
        ("drift \\", "text", "ends in a backslash"),
        ("/srv/inv/", "path", "not normalised"),
        ("65535", "account", "reserved"),
        ("daily%H", "calendar", "no quotes, backslashes or %"),
        ("15min\\", "timespan", "ends in a backslash"),
        ({"HF_HOME\n": "x"}, "environment", "not an environment variable name"),
        ({"A": 8}, "environment", "quote it"),
        (["/usr/bin/flock", "a\x85"], "exec", "U+0085"),
        ("a\u2028b", "arg", "U+2028"),
        (5, "path", "not a string"),
    ],
)
def test_refusals(value, context, fragment):
    message = systemd_value(value, context, "drift_timer_x", check=True)
    assert fragment in message
    assert message.startswith("drift_timer_x")
    with pytest.raises(AnsibleFilterError, match="numafleet.tuning.systemd_value: drift_timer_x"):
        systemd_value(value, context, "drift_timer_x")


def test_check_is_empty_when_accepted_and_contexts_are_checked():
    assert systemd_value("/srv/inv", "path", check=True) == ""
    with pytest.raises(AnsibleFilterError, match="not one of"):
        systemd_value("x", "bogus")
