"""units.py at its edges: the limits and rules of each unit-file context, found loose by mutation
testing (issue 19, section 5). Each test states a behaviour systemd depends on."""

from __future__ import annotations

import plan_shapes  # tests/unit/plan_shapes.py (on sys.path through tests/unit/conftest.py)
import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import UnitRenderError

UNIT_DIR = "/etc/systemd/system"


@pytest.mark.parametrize(
    "char", ["\ufffe", "\uffff", "\U0001fffe", "\U0010ffff", "\ufdd0", "\ufdef"]
)
def test_noncharacters_are_refused(char):
    with pytest.raises(UnitRenderError, match=f"noncharacter U\\+{ord(char):04X}"):
        units.check_text(f"a{char}b", "x")


@pytest.mark.parametrize("char", ["\ufffd", "\ufdcf", "\ufdf0", "\U0001fffd", "é", "\u00a0"])
def test_characters_next_to_the_noncharacters_are_kept(char):
    assert units.check_text(f"a{char}b", "x") == f"a{char}b"


def test_line_length_leaves_room_for_the_key_within_systemds_limit():
    """systemd reads lines of at most 1 MiB; the value keeps 64 bytes for "Key=" in front."""
    assert units.LONG_LINE_MAX == 1 << 20
    fits = "a" * ((1 << 20) - 65)
    assert units.check_line(fits, "x") == fits
    with pytest.raises(UnitRenderError, match="systemd reads unit lines of at most 1048576 bytes"):
        units.check_line(fits + "é", "x")  # one character, two bytes over
    with pytest.raises(UnitRenderError):
        units.check_line("a" * ((1 << 20) - 64), "x")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(" a", "starts or ends with a space"), ("a\\", "ends in a backslash"), ("a\\\\", "backslash")],
)
def test_values_systemd_would_change_on_a_line_are_refused(value, fragment):
    with pytest.raises(UnitRenderError, match=fragment):
        units.check_line(value, "x")


@pytest.mark.parametrize(
    ("value", "program", "fragment"),
    [
        (
            "var/lib/x",
            False,
            "the path 'var/lib/x' is not an absolute path; write e.g. /var/lib/numafleet",
        ),
        ("x", False, "is not an absolute path; write e.g. /var/lib/numafleet"),
        ("", True, "the program '' is not an absolute path; write e.g. /opt/llm/bin/serve"),
        ("bin/serve", True, "is not an absolute path; write e.g. /opt/llm/bin/serve"),
        ("/", True, "the program '/' is not normalised"),
        ("/a/./b", False, "is not normalised"),
        ("/a/../b", False, "is not normalised"),
        ("/a/", False, "is not normalised"),
        ("/" + "n" * 256, False, "component of 256"),
        ("/" + "/".join(["n" * 200] * 21), False, "is 4221 bytes long"),
    ],
)
def test_paths_systemd_refuses_or_rewrites_are_refused(value, program, fragment):
    with pytest.raises(UnitRenderError) as err:
        units.check_path(value, "x", program=program)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("value", "program"),
    [
        ("/", False),
        ("serve", True),
        ("/" + "n" * 255, False),
        ("/" + "/".join(["n" * 255] * 15) + "/" + "n" * 254, False),  # 4095 bytes
        ("/opt/é", False),
    ],
)
def test_paths_at_the_limits_are_taken(value, program):
    assert units.check_path(value, "x", program=program) == value


def test_a_path_of_path_max_bytes_is_refused():
    value = "/" + "/".join(["n" * 255] * 15) + "/" + "n" * 255  # 4096 bytes
    with pytest.raises(UnitRenderError, match="under 4096 bytes"):
        units.check_path(value, "x")


def test_escape_path_doubles_specifiers_of_a_checked_path():
    assert units.escape_path("/var/lib/50%", "x") == "/var/lib/50%%"
    with pytest.raises(UnitRenderError, match="not an absolute path"):
        units.escape_path("50%", "x")


@pytest.mark.parametrize("prefix", list("-@:+!|"))
def test_programs_starting_with_an_exec_prefix_are_refused(prefix):
    with pytest.raises(UnitRenderError, match="not starting with one of"):
        units.program_path(f"{prefix}serve", "x")
    with pytest.raises(UnitRenderError, match="not starting with one of"):
        units.exec_line([f"{prefix}/opt/serve"], "x")


@pytest.mark.parametrize(("char", "shown"), [("\\", "\\"), ('"', '"'), ("'", "'"), ("$", "$")])
def test_programs_with_characters_the_program_path_does_not_take_are_refused(char, shown):
    with pytest.raises(UnitRenderError) as err:
        units.program_path(f"/opt/a{char}b", "x")
    assert f"holds {shown}, which systemd does not take" in str(err.value)


def test_exec_line_quotes_each_word_and_refuses_no_words():
    assert units.exec_line(["serve", "a b", "%i", "$X"], "x") == '"serve" "a b" "%%i" "$$X"'
    assert units.exec_line(("/opt/serve",), "x") == '"/opt/serve"'
    for bad in ([], (), "serve", None):
        with pytest.raises(UnitRenderError, match="is not a non-empty list of strings"):
            units.exec_line(bad, "x")


def test_environment_values_must_be_strings():
    with pytest.raises(UnitRenderError, match=r"env\.A: 1 is not a string"):
        units.quote_environment("A", 1, "env")
    with pytest.raises(UnitRenderError, match="is not an environment variable name"):
        units.quote_environment(1, "x", "env")
    with pytest.raises(UnitRenderError, match=r"env\.A: 'a\\nb' holds the control character"):
        units.quote_environment("A", "a\nb", "env")


@pytest.mark.parametrize("value", ["0", "65534", "65536", "4294967294", "a" * 31, "_a.b-c$"])
def test_accounts_systemd_takes(value):
    assert units.account_name(value, "x") == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("65535", "65535 and 4294967295 and above are reserved"),
        ("4294967295", "reserved"),
        ("4294967296", "reserved"),
        ("a" * 32, "at most 31 characters"),
        ("1a", "not a user or group name"),
        ("\u0661", "not a user or group name"),  # a digit, but not an ASCII one
        ("-a", "not a user or group name"),
    ],
)
def test_accounts_systemd_refuses(value, fragment):
    with pytest.raises(UnitRenderError, match=fragment):
        units.account_name(value, "x")


def test_calendar_values():
    assert units.calendar_value("Mon *-*-* 03:00:00", "x") == "Mon *-*-* 03:00:00"
    with pytest.raises(UnitRenderError, match="is not a calendar expression"):
        units.calendar_value("daily%", "x")
    with pytest.raises(UnitRenderError, match="is not a calendar expression"):
        units.calendar_value(5, "x")


@pytest.mark.parametrize(
    ("value", "want"), [(15, "15"), ("2h 30min", "2h 30min"), ("infinity", "infinity")]
)
def test_timespans_taken(value, want):
    assert units.timespan_value(value, "x") == want


@pytest.mark.parametrize("value", [True, None, 1.5, "min", "15min%", " 5"])
def test_timespans_refused(value):
    with pytest.raises(UnitRenderError):
        units.timespan_value(value, "x")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (".a.b", "\\x2ea.b"),
        ("a-b", "a\\x2db"),
        ("ü", "\\xc3\\xbc"),
        ("a/b", "a\\x2fb"),
        ("A:_.9", "A:_.9"),
    ],
)
def test_systemd_escape(text, want):
    assert units.systemd_escape(text) == want


def test_slice_names_up_to_255_characters():
    longest = "a" * (255 - len("numafleet-.slice"))
    assert units.slice_name(longest) == f"numafleet-{longest}.slice"
    with pytest.raises(UnitRenderError, match="is 256 characters long, over systemd's 255"):
        units.slice_name(longest + "a")
    for bad in ("", None):
        with pytest.raises(UnitRenderError, match="must be a non-empty string"):
            units.slice_name(bad)


@pytest.mark.parametrize(
    ("name", "suffix"),
    [
        ("a.service", ".service"),
        ("a@.service", ".service"),
        ("a@b.service", ".service"),
        ("a-b.slice", ".slice"),
    ],
)
def test_unit_names_taken(name, suffix):
    assert units.check_unit_name(name, suffix, "x") == name


@pytest.mark.parametrize(
    ("name", "suffix"),
    [
        (5, ".service"),
        ("a.slice", ".service"),
        (".a.service", ".service"),
        ("a b.service", ".service"),
        ("a" * 248 + ".service", ".service"),
        ("a@b.slice", ".slice"),
        ("-a.slice", ".slice"),
    ],
)
def test_unit_names_refused(name, suffix):
    with pytest.raises(UnitRenderError):
        units.check_unit_name(name, suffix, "x")


def test_a_unit_name_of_255_characters_is_taken():
    name = "a" * 247 + ".service"
    assert units.check_unit_name(name, ".service", "x") == name


def test_host_paths_are_absolute_and_normalised():
    assert units.check_host_path("unit_dir", "/etc//systemd/./system/") == "/etc/systemd/system"
    for bad in ("etc", 5, None):
        with pytest.raises(UnitRenderError, match="unit_dir: .* is not an absolute path"):
            units.check_host_path("unit_dir", bad)
    with pytest.raises(UnitRenderError, match="control character"):
        units.check_host_path("unit_dir", "/etc/\n")


@pytest.mark.parametrize(
    ("header", "lines"),
    [
        ("", []),
        ("  \n", []),
        ("# a\n", ["# a"]),
        ("# a\n\n; b\n\n", ["# a", "", "; b"]),
        ("  # indented", ["  # indented"]),
    ],
)
def test_header_lines(header, lines):
    assert units.header_lines(header) == lines


@pytest.mark.parametrize("header", [5, None, "# a\nb", "#a\tb"])
def test_bad_headers_are_refused(header):
    with pytest.raises(UnitRenderError, match="header"):
        units.header_lines(header)


def test_unit_document_skips_empty_sections_and_checks_every_value():
    assert units.unit_document([], [("Unit", []), ("Service", [("A", "1")])]) == "[Service]\nA=1\n"
    assert units.unit_document(["# h"], [("Unit", [])]) == "# h\n"
    with pytest.raises(UnitRenderError, match=r"\[Service\] A=: 'x\\\\' ends in a backslash"):
        units.unit_document([], [("Service", [("A", "x\\")])])


# --- changes, manifest, removal -----------------------------------------------------------------

A = f"{UNIT_DIR}/numafleet-a.service"
D = f"{UNIT_DIR}/vllm.service.d/50-numafleet.conf"
S = f"{UNIT_DIR}/numafleet-t.slice"


def test_a_change_as_the_module_reports_it():
    change = units.FileChange(A, "create", None, "new\n")
    assert change.as_dict() == {"path": A, "state": "create"}
    assert change.as_diff() == {
        "before_header": A,
        "after_header": A,
        "before": "",
        "after": "new\n",
    }
    assert units.FileChange(A, "remove", "old", None).as_diff()["after"] == ""


def test_plan_changes_states():
    current = {A: None, D: "same", S: "old", "/x.service": "owned", "/gone.service": None}
    desired = {A: "a", D: "same", S: "new"}
    got = units.plan_changes(current, desired, ["/x.service", "/gone.service"])
    assert [(c.path, c.state) for c in got] == [
        (A, "create"),
        (S, "update"),
        (D, "unchanged"),
        ("/x.service", "remove"),
    ]


def test_actions_by_kind_of_file():
    changes = [
        units.FileChange(A, "create", None, "a"),
        units.FileChange(f"{UNIT_DIR}/numafleet-b.service", "update", "x", "y"),
        units.FileChange(f"{UNIT_DIR}/numafleet-c.service", "remove", "x", None),
        units.FileChange(f"{UNIT_DIR}/numafleet-d.service", "unchanged", "x", "x"),
        units.FileChange(D, "update", "x", "y"),
        units.FileChange(f"{UNIT_DIR}/tgi.service.d/50-numafleet.conf", "unchanged", "x", "x"),
        units.FileChange(S, "create", None, "s"),
    ]
    actions = units.plan_actions(changes)
    assert actions.start == ("numafleet-a.service",)
    assert actions.restart == ("numafleet-b.service",)
    assert actions.disable == ("numafleet-c.service",)
    assert actions.try_restart == ("vllm.service",)
    assert actions.slices == {
        "new": ["numafleet-t.slice"],
        "changed": [],
        "removed": [],
        "unchanged": [],
    }
    assert actions.units["unchanged"] == ["numafleet-d.service", "tgi.service"]
    assert actions.would_run() == [
        "systemctl disable --now numafleet-c.service",
        "systemctl daemon-reload",
        "systemctl restart numafleet-b.service",
        "systemctl try-restart vllm.service",
        "systemctl enable --now numafleet-a.service",
    ]


def test_disable_runs_under_a_timeout_when_one_is_given():
    assert units.disable_argv("systemctl", None, "a.service") == [
        "systemctl",
        "disable",
        "--now",
        "a.service",
    ]
    assert units.disable_argv("systemctl", "/usr/bin/timeout", "a.service") == [
        "/usr/bin/timeout",
        "--kill-after=10",
        "300",
        "systemctl",
        "disable",
        "--now",
        "a.service",
    ]


def test_unit_of_a_file_that_is_not_a_dropin():
    assert units.unit_of(f"{UNIT_DIR}/x.d/other.conf") == "other.conf"
    assert units.unit_of(f"{UNIT_DIR}/x/50-numafleet.conf") == "50-numafleet.conf"
    assert not units.is_dropin(f"{UNIT_DIR}/x/50-numafleet.conf")


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        (A, True),
        (D, True),
        (S, True),
        ("/etc/a.service", True),
        ("/etc/.service", False),
        ("/etc/passwd", False),
        ("etc/a.service", False),
        ("/etc//a.service", False),
        (3, False),
    ],
)
def test_which_manifest_entries_are_unit_files(tmp_path, path, ok):
    manifest = tmp_path / "m.json"
    manifest.write_text(units.json.dumps({"version": 1, "files": [path]}))
    if ok:
        assert units.read_manifest(str(tmp_path), "/m.json").files == (path,)
    else:
        with pytest.raises(units.UnitFileError, match="is not a unit, slice or drop-in path"):
            units.read_manifest(str(tmp_path), "/m.json")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"version": true, "files": []}', "is not a version 2 (or 1)"),
        ('{"version": 2, "files": {"/etc/a.service": 5}}', "records 5 for '/etc/a.service'"),
        ('{"version": 2, "files": {"/etc/a.service": "' + "A" * 64 + '"}}', "not a sha256"),
        ('{"version": 2, "files": {"/etc/a.service": "' + "a" * 65 + '"}}', "not a sha256"),
        ('{"version": 2, "files": {"/etc/passwd": "' + "a" * 64 + '"}}', "lists '/etc/passwd'"),
    ],
)
def test_more_bad_manifests_are_refused(tmp_path, text, fragment):
    (tmp_path / "m.json").write_text(text)
    with pytest.raises(units.UnitFileError) as err:
        units.read_manifest(str(tmp_path), "/m.json")
    assert fragment in str(err.value) and str(tmp_path / "m.json") in str(err.value)


def test_a_version_1_manifest_is_read_without_digests(tmp_path):
    (tmp_path / "m.json").write_text(
        '{"version": 1, "files": ["/etc/b.service", "/etc/a.service"]}'
    )
    manifest = units.read_manifest(str(tmp_path), "/m.json")
    assert manifest.version == 1 and manifest.files == ("/etc/a.service", "/etc/b.service")
    assert manifest.digest_of("/etc/a.service") is None


def test_a_linked_manifest_is_refused(tmp_path):
    (tmp_path / "theirs.json").write_text(units.manifest_text({}))
    (tmp_path / "m.json").symlink_to(tmp_path / "theirs.json")
    with pytest.raises(units.UnitFileError, match="symbolic link.*Replace the link"):
        units.read_manifest(str(tmp_path), "/m.json")


def _write(tmp_path, files: dict, manifest_path="/etc/numafleet/manifest.json"):
    root = str(tmp_path)
    units.write_files(root, [units.FileChange(p, "create", None, t) for p, t in files.items()])
    units.write_manifest(root, units.plan_manifest(units.read_manifest(root, manifest_path), files))
    return units.read_manifest(root, manifest_path)


def test_only_unchanged_regular_files_in_unit_dir_are_removable(tmp_path):
    root = str(tmp_path)
    mine = {
        A: "# Managed by numafleet.tuning\na\n",
        D: "# Managed by numafleet.tuning\nd\n",
        S: "# Managed by numafleet.tuning\ns\n",
        f"{UNIT_DIR}/numafleet-e.service": "e\n",
        f"{UNIT_DIR}/numafleet-l.service": "l\n",
        f"{UNIT_DIR}/numafleet-g.service": "g\n",
        f"{UNIT_DIR}/numafleet-f.service": "f\n",
        "/etc/other/numafleet-o.service": "o\n",
    }
    manifest = _write(tmp_path, mine)
    (tmp_path / f"{UNIT_DIR[1:]}/numafleet-e.service").write_text("edited\n")
    link = tmp_path / f"{UNIT_DIR[1:]}/numafleet-l.service"
    link.unlink()
    link.symlink_to(tmp_path / f"{UNIT_DIR[1:]}/numafleet-a.service")
    fifo = tmp_path / f"{UNIT_DIR[1:]}/numafleet-f.service"
    fifo.unlink()
    units.os.mkfifo(fifo)
    (tmp_path / f"{UNIT_DIR[1:]}/numafleet-g.service").unlink()  # already gone
    ours, kept = units.removable(root, manifest, {S: "wanted"}, UNIT_DIR)
    assert ours == [A, D]
    reasons = {k.path: k.reason for k in kept}
    assert sorted(reasons) == [
        "/etc/other/numafleet-o.service",
        f"{UNIT_DIR}/numafleet-e.service",
        f"{UNIT_DIR}/numafleet-f.service",
        f"{UNIT_DIR}/numafleet-l.service",
    ]
    assert reasons["/etc/other/numafleet-o.service"] == f"is not a unit file in unit_dir {UNIT_DIR}"
    assert reasons[f"{UNIT_DIR}/numafleet-l.service"].startswith("is a symbolic link")
    assert reasons[f"{UNIT_DIR}/numafleet-f.service"] == "is not a regular file"
    assert (
        "its content changed since numafleet wrote it (sha256 "
        in reasons[f"{UNIT_DIR}/numafleet-e.service"]
    )
    assert all(k.manifest == "/etc/numafleet/manifest.json" for k in kept)
    kept_e = next(k for k in kept if k.path.endswith("numafleet-e.service"))
    assert kept_e.as_dict() == {"path": kept_e.path, "reason": kept_e.reason}
    assert kept_e.message().startswith(
        f"{kept_e.path}: listed in the manifest /etc/numafleet/manifest.json but its content"
    )
    assert "numafleet removes only files it wrote" in kept_e.message()
    # without a unit_dir (numa_facts) the directory is not judged
    ours, kept = units.removable(root, manifest, {}, None)
    assert "/etc/other/numafleet-o.service" in ours


def test_a_dropin_in_another_directory_is_not_removable(tmp_path):
    other = "/etc/other/x.service.d/50-numafleet.conf"
    manifest = _write(tmp_path, {other: "x\n", D: "d\n"})
    ours, kept = units.removable(str(tmp_path), manifest, {}, UNIT_DIR)
    assert ours == [D] and [k.path for k in kept] == [other]


def test_a_file_reached_through_a_linked_directory_is_kept(tmp_path):
    manifest = _write(tmp_path, {D: "d\n"})
    ddir = tmp_path / f"{UNIT_DIR[1:]}/vllm.service.d"
    (tmp_path / "elsewhere").mkdir()
    (ddir / "50-numafleet.conf").rename(tmp_path / "elsewhere/50-numafleet.conf")
    ddir.rmdir()
    ddir.symlink_to(tmp_path / "elsewhere")
    ours, kept = units.removable(str(tmp_path), manifest, {}, UNIT_DIR)
    assert ours == [] and kept[0].reason.startswith("cannot be reached without a link (")


@pytest.mark.parametrize(
    ("header", "text", "removable"),
    [
        ("# Managed by numafleet.tuning", "# Managed by numafleet.tuning\n[Unit]\n", True),
        ("# Managed by numafleet.tuning\n", "# Managed by numafleet.tuning\n[Unit]\n", True),
        ("# Managed by numafleet.tuning", "# Managed by numafleet.tuningX\n", False),
        ("# Managed by numafleet.tuning", "[Unit]\n", False),
        ("", "[Unit]\n", False),
        ("  ", "  \n[Unit]\n", False),
    ],
)
def test_a_version_1_entry_is_ours_only_with_our_header(tmp_path, header, text, removable):
    (tmp_path / f"{UNIT_DIR[1:]}").mkdir(parents=True)
    (tmp_path / f"{UNIT_DIR[1:]}/numafleet-a.service").write_text(text)
    (tmp_path / "m.json").write_text(units.json.dumps({"version": 1, "files": [A]}))
    manifest = units.read_manifest(str(tmp_path), "/m.json")
    ours, kept = units.removable(str(tmp_path), manifest, {}, UNIT_DIR, header)
    assert (ours == [A]) is removable
    if not removable:
        assert "version 1 manifest recorded no sha256" in kept[0].reason


def test_the_manifest_change():
    empty = units.Manifest("/m.json", None, ())
    assert units.plan_manifest(empty, {}) is None
    created = units.plan_manifest(empty, {A: "a"})
    assert (created.state, created.before) == ("create", None)
    written = units.Manifest("/m.json", created.after, (A,))
    assert units.plan_manifest(written, {A: "a"}).state == "unchanged"
    update = units.plan_manifest(written, {})
    assert (update.state, update.before, update.path) == ("update", created.after, "/m.json")


def test_the_recorded_plan_leaves_out_stability_and_replaces_a_link(tmp_path):
    plan = {"version": 1, "b": [1], "a": "x", "stability": {"moved": 1}}
    text = units.plan_record_text(plan)
    assert text == '{\n "a": "x",\n "b": [\n  1\n ],\n "version": 1\n}\n'
    path = "/etc/numafleet/plan.json"
    change = units.plan_record_change(str(tmp_path), path, plan)
    assert (change.state, change.before, change.after) == ("create", None, text)
    units.write_files(str(tmp_path), [change])
    assert units.plan_record_change(str(tmp_path), path, plan).state == "unchanged"
    assert units.plan_record_change(str(tmp_path), path, {"version": 2}).state == "update"
    real = tmp_path / "etc/numafleet/plan.json"
    real.unlink()
    real.symlink_to(tmp_path / "elsewhere.json")
    change = units.plan_record_change(str(tmp_path), path, plan)
    assert (change.state, change.before) == ("update", None)


def test_write_errors_name_the_fix(tmp_path):
    (tmp_path / "etc").symlink_to(tmp_path)
    with pytest.raises(units.UnitFileError, match="Replace the link with a directory"):
        units.write_files(str(tmp_path), [units.FileChange(A, "create", None, "x")])
    units.write_manifest(str(tmp_path), None)
    units.write_manifest(str(tmp_path), units.FileChange("/m.json", "unchanged", "x", "x"))
    assert not (tmp_path / "m.json").exists()
    units.write_files(str(tmp_path), [units.FileChange("/m.json", "update", "x", "y")])
    assert (tmp_path / "m.json").read_text() == "y"
    units.write_files(str(tmp_path), [units.FileChange("/m.json", "remove", "y", None)])
    assert not (tmp_path / "m.json").exists()


def test_read_errors_name_the_fix(tmp_path):
    with pytest.raises(units.UnitFileError, match="Check its permissions"):
        units.read_files(str(tmp_path), ["/" + "n" * 300 + ".service"])
    (tmp_path / "d.service").mkdir()
    with pytest.raises(units.UnitFileError, match="Move it away"):
        units.read_files(str(tmp_path), ["/d.service"])
    (tmp_path / "l.service").symlink_to(tmp_path / "d.service")
    assert units.read_files(str(tmp_path), ["/l.service"]) == {"/l.service": None}


def test_a_hardened_service_carries_every_protection():
    """The settings numafleet's services run under (README, security model); never PrivateDevices=."""
    plan = {"version": 1, "host": "h", "placements": [plan_shapes.placement()], "tenants": []}
    text = units.render_files(plan)[f"{UNIT_DIR}/numafleet-llm.service"]
    service = text.split("[Service]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert service[-10:] == [
        "NoNewPrivileges=yes",
        "ProtectSystem=full",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RestrictRealtime=yes",
    ]
    assert "PrivateDevices" not in text


def test_a_tenant_without_placements_gets_no_slice():
    tenant = {"name": "t", "slice": "numafleet-t.slice", "cpus": [0], "mems": [0]}
    plan = {"version": 1, "host": "h", "placements": [], "tenants": [tenant]}
    assert units.render_files(plan) == {}
    tenant["placements"] = ["llm"]
    assert list(units.render_files(plan)) == [S]
