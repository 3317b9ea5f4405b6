"""The test-side systemd unit parser (tests/unit/systemd_syntax.py) against hand-written units.

Where systemd-analyze is installed, the texts the parser accepts are also given to
``systemd-analyze verify``, so that the parser's idea of "valid" is checked against systemd's.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import systemd_syntax as sd

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def test_comments_sections_and_trimming():
    text = (
        "# a comment\n"
        "; another\n"
        "[Unit]\n"
        "  Description =  spaced value \t\n"
        "\n"
        "[Service]\r\n"
        "ExecStart=/bin/true\r"
        "Environment=A=1\n"
    )
    assert sd.parse_unit(text) == [
        ("Unit", "Description", "spaced value"),
        ("Service", "ExecStart", "/bin/true"),
        ("Service", "Environment", "A=1"),
    ]


def test_trailing_backslash_joins_the_next_line_with_a_space():
    text = "[Unit]\nDescription=reranker \\\nRequires=nvidia-mps@GPU-1.service\nAfter=x.service\n"
    assert sd.parse_unit(text) == [
        ("Unit", "Description", "reranker  Requires=nvidia-mps@GPU-1.service"),
        ("Unit", "After", "x.service"),
    ]


def test_comment_lines_inside_a_continuation_are_skipped():
    text = "[Service]\nExecStart=/bin/echo a \\\n# not here\n  b\n"
    assert sd.parse_unit(text) == [("Service", "ExecStart", "/bin/echo a    b")]


@pytest.mark.parametrize(
    ("line", "continues"),
    [
        ("Description=a\\", True),
        ("Description=a\\\\", False),
        ("Description=a\\\\\\", True),
        ("Description=\\x\\", True),
        ("Description=a\\ ", False),
    ],
)
def test_only_an_unpaired_final_backslash_continues(line, continues):
    entries = sd.parse_unit(f"[Unit]\n{line}\nAfter=b.service\n")
    assert (len(entries) == 1) is continues


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Description=x\n", "outside of any section"),
        ("[Unit]\nDescription\n", "has no '='"),
        ("[Unit]\n=x\n", "missing key name"),
        ("[Unit\nA=b\n", "invalid section header"),
        ("[Unit]\nA=b\x00c\n", "NUL"),
    ],
)
def test_unit_errors(text, message):
    with pytest.raises(sd.UnitSyntaxError, match=message):
        sd.parse_unit(text)


@pytest.mark.parametrize(
    ("raw", "want"),
    [("100%% sure", "100% sure"), ("plain", "plain"), ("%%%%", "%%"), ("a\\b", "a\\b")],
)
def test_specifiers(raw, want):
    assert sd.description(raw) == want


@pytest.mark.parametrize(
    ("raw", "spec"), [("%i", "i"), ("a %n b", "n"), ("ends %", ""), ("%%%H", "H")]
)
def test_unresolved_specifiers_are_reported(raw, spec):
    with pytest.raises(sd.UnresolvedSpecifier) as err:
        sd.description(raw)
    assert err.value.specifier == spec


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ('"A=1" B=2', {"A": "1", "B": "2"}),
        ('\'A=x y\' "B=a\\"b"', {"A": "x y", "B": 'a"b'}),
        ('"A=100%%" "B=$HOME"', {"A": "100%", "B": "$HOME"}),
        ('"A=back\\\\slash" A2=\\x41', {"A": "back\\slash", "A2": "A"}),
        ("A=1 A=2", {"A": "2"}),
        ('"A=\\u00e9\\303\\251"', {"A": "éé"}),
        ('"A="', {"A": ""}),
    ],
)
def test_environment(raw, want):
    assert sd.environment(raw) == want


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ('"A=1', sd.UnitSyntaxError),
        ('"1A=1"', sd.UnitSyntaxError),
        ("NOEQUALS", sd.UnitSyntaxError),
        ('"A=%i"', sd.UnresolvedSpecifier),
        ('"A=\\q"', sd.UnitSyntaxError),
        ('"A=\\x00"', sd.UnitSyntaxError),
    ],
)
def test_environment_errors(raw, error):
    with pytest.raises(error):
        sd.environment(raw)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("/bin/echo a b", ("", ["/bin/echo", "a", "b"])),
        ('"/bin/echo" "a b" c\\td', ("", ["/bin/echo", "a b", "c\td"])),
        ("-/bin/echo 'x'\"y\"", ("-", ["/bin/echo", "xy"])),
        ("+@/bin/echo echo", ("+@", ["/bin/echo", "echo"])),
        ("!!/bin/true", ("!!", ["/bin/true"])),
        ('/bin/echo "$$HOME" 100%%', ("", ["/bin/echo", "$HOME", "100%"])),
        ("/bin/echo \\; x", ("", ["/bin/echo", ";", "x"])),
        ('/bin/echo ";"', ("", ["/bin/echo", ";"])),
        ("/bin/echo $ a$", ("", ["/bin/echo", "$", "a$"])),
        ("/bin/echo \\x41\\101\\u00e9\\n", ("", ["/bin/echo", "AAé\n"])),
        ("true", ("", ["true"])),
    ],
)
def test_exec_command(raw, want):
    assert sd.exec_command(raw) == want


def test_a_lone_semicolon_separates_commands():
    assert sd.exec_commands("/bin/a 1 ; /bin/b 2") == [("", ["/bin/a", "1"]), ("", ["/bin/b", "2"])]
    with pytest.raises(sd.UnitSyntaxError, match="2 commands"):
        sd.exec_command("/bin/a ; /bin/b")


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        ("/bin/echo $HOME", sd.UnexpandedVariable, r"\$HOME"),
        ("/bin/echo x${HOME}y", sd.UnexpandedVariable, r"\$HOME"),
        ("/bin/echo %n", sd.UnresolvedSpecifier, "%n"),
        ("/usr/bin/", sd.UnitSyntaxError, "directory"),
        ("/usr/../bin/true", sd.UnitSyntaxError, "normalised"),
        ("/usr//bin/true", sd.UnitSyntaxError, "normalised"),
        ("bin/true", sd.UnitSyntaxError, "neither"),
        ('"/bin/a\\"b"', sd.UnitSyntaxError, "special"),
        ("/bin/$$x", sd.UnitSyntaxError, "holds \\$"),
        ("/" + "a" * 256, sd.UnitSyntaxError, "NAME_MAX"),
        ("/" + "/".join(["a" * 200] * 21), sd.UnitSyntaxError, "PATH_MAX"),
        ("-", sd.UnitSyntaxError, "empty program"),
        ("+!/bin/true", sd.UnitSyntaxError, "exclude"),
        ("/bin/echo 'open", sd.UnitSyntaxError, "unterminated"),
        ("/bin/echo trailing\\", sd.UnitSyntaxError, "lone backslash"),
        ("/bin/echo \\xff", sd.UnitSyntaxError, "UTF-8"),
        ("", sd.UnitSyntaxError, "no command"),
    ],
)
def test_exec_command_errors(raw, error, message):
    with pytest.raises(error, match=message):
        sd.exec_command(raw)


def test_paths_users_and_unit_lists():
    assert sd.path_value("/var/lib/x%%y") == "/var/lib/x%y"
    for bad in ("relative/x", "/a/./b", "/a//b", "/a/.."):
        with pytest.raises(sd.UnitSyntaxError):
            sd.path_value(bad)
    assert sd.unit_list("a.service  b.service") == ["a.service", "b.service"]
    assert sd.user_group("llm-svc") == "llm-svc"
    assert sd.user_group("1000") == "1000"
    for bad in ("a:b", "a/b", " a", "65535", "4294967295", "9x", "a" * 32, "a\nb"):
        with pytest.raises(sd.UnitSyntaxError):
            sd.user_group(bad)


def test_lookup():
    entries = sd.parse_unit("[Unit]\nAfter=a\nAfter=b\n[Service]\nAfter=c\n")
    assert sd.lookup(entries, "Unit", "After") == ["a", "b"]


# --- the parser's "valid" against systemd's -------------------------------------------------

ACCEPTED = """\
# header
[Unit]
Description=100%% done, with a trailing escaped pair \\\\
After=network.target \\
 ; a comment inside the continuation
 local-fs.target

[Service]
Type=oneshot
Environment="A=x y" 'B=q\\"r' C=\\x41
ExecStart=-/bin/echo "a b" '$$HOME' \\; 100%%
ExecStart=/bin/true
"""


def verify_findings(tmp_path, name: str, text: str) -> list:
    """Lines systemd-analyze verify prints about ``name`` (empty: systemd is silent)."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    env = dict(os.environ, LC_ALL="C", SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if name in line]
    return lines + ([f"rc={proc.returncode}"] if proc.returncode else [])


def test_accepted_unit_parses(tmp_path):
    entries = sd.parse_unit(ACCEPTED)
    assert sd.description(sd.lookup(entries, "Unit", "Description")[0]) == (
        "100% done, with a trailing escaped pair \\\\"
    )
    assert sd.unit_list(sd.lookup(entries, "Unit", "After")[0]) == [
        "network.target",
        "local-fs.target",
    ]
    assert sd.environment(sd.lookup(entries, "Service", "Environment")[0]) == {
        "A": "x y",
        "B": 'q"r',
        "C": "A",
    }
    first, second = sd.lookup(entries, "Service", "ExecStart")
    assert sd.exec_command(first) == ("-", ["/bin/echo", "a b", "$HOME", ";", "100%"])
    assert sd.exec_command(second) == ("", ["/bin/true"])


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_accepts_what_the_parser_accepts(tmp_path):
    assert verify_findings(tmp_path, "parser-accepted.service", ACCEPTED) == []


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(
    "exec_start",
    ["/usr/bin/", "/" + "a" * 256, "bin/true", '"/bin/a\\"b"', "/bin/echo 'open"],
)
def test_systemd_analyze_refuses_what_the_parser_refuses(tmp_path, exec_start):
    """Same verdict as systemd 252. The parser is stricter on purpose for a program path that is
    not normalised (``/a/../b``, ``/a//b``): 252 simplifies or keeps it silently, so the path
    systemd runs is not the text that was written."""
    with pytest.raises(sd.UnitSyntaxError):
        sd.exec_command(exec_start)
    text = f"[Service]\nType=oneshot\nExecStart={exec_start}\n"
    assert verify_findings(tmp_path, "parser-refused.service", text) != []
