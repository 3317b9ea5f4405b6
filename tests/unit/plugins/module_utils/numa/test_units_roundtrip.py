"""Every unit-file context reads back exactly what was rendered, or the render is refused.

Each property renders a value with the escaping function of its context, parses the text back
with tests/unit/systemd_syntax.py (systemd.syntax(7), systemd.service(5) quoting, specifiers and
$ rules) and asserts the value came back unchanged; a refusal must match the documented rule of
that context (an independent predicate here), never be a blanket one.
"""

from __future__ import annotations

import os
import shutil
import string
import subprocess

import plan_shapes
import pytest
import systemd_syntax as sd
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import hugepages, mig, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import UnitRenderError

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
UNIT_DIR = "/etc/systemd/system"
NASTY = "ab %$\"'\\;#=:{}/. \t\n\r\x85\u2028\u2029\x00é€😀-+@!|*~"
VALUES = st.one_of(
    st.text(alphabet=st.sampled_from(NASTY), max_size=40),
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from("a%\\$ "), min_size=1, max_size=12),
)
SETTINGS = settings(max_examples=300, deadline=None)


def bad_char(value: str) -> bool:
    """Characters no context takes (the independent form of units.check_text's rule)."""
    for char in value:
        code = ord(char)
        if (
            code < 0x20
            or 0x7F <= code < 0xA0
            or code in (0x2028, 0x2029)
            or 0xD800 <= code <= 0xDFFF
            or 0xFDD0 <= code <= 0xFDEF
            or code & 0xFFFE == 0xFFFE
        ):
            return True
    return False


def unquoted_refused(value: str) -> bool:
    """An unquoted value cannot round-trip: bad characters, outer whitespace, final backslash."""
    return bad_char(value) or value != value.strip(" ") or value.endswith("\\")


def one(entries, section, key) -> str:
    values = sd.lookup(entries, section, key)
    assert len(values) == 1, (key, entries)
    return values[0]


# --- free text: Description= ---------------------------------------------------------------------


@SETTINGS
@given(VALUES)
@example("reranker \\")
@example("100% sure $HOME \"q\" 'q' a\\b")
@example("x" * 5000)
@example(" lead")
def test_description_round_trips(value):
    text = units.unit_document([], [("Unit", [("Description", "x"), ("After", "a.service")])])
    try:
        rendered = units.escape_specifiers(value, "description")
    except UnitRenderError:
        assert unquoted_refused(value)
        return
    assert not unquoted_refused(value)
    text = units.unit_document([], [("Unit", [("Description", rendered), ("After", "a.service")])])
    entries = sd.parse_unit(text)
    assert sd.description(one(entries, "Unit", "Description")) == value
    assert sd.lookup(entries, "Unit", "After") == ["a.service"]


# --- Environment= --------------------------------------------------------------------------------


@SETTINGS
@given(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), VALUES)
@example("A", "ends in \\")
@example("A", " both sides ")
@example("A", "%i $HOME ${X} \"'")
@example("A", "y" * 5000)
def test_environment_round_trips(key, value):
    try:
        rendered = units.quote_environment(key, value, "environment")
    except UnitRenderError:
        assert bad_char(value)
        return
    assert not bad_char(value)
    text = units.unit_document([], [("Service", [("Environment", rendered), ("Type", "simple")])])
    entries = sd.parse_unit(text)
    assert sd.environment(one(entries, "Service", "Environment")) == {key: value}
    assert sd.lookup(entries, "Service", "Type") == ["simple"]


@pytest.mark.parametrize("key", ["HF_HOME\n", "1A", "A-B", "", "A B", "Ä"])
def test_environment_keys_systemd_would_drop_are_refused(key):
    with pytest.raises(UnitRenderError, match="not an environment variable name"):
        units.quote_environment(key, "x", "environment")


# --- ExecStart= ----------------------------------------------------------------------------------

PROGRAM_PART = st.text(alphabet=st.sampled_from("ab-_.+@:%$\\\"' é"), min_size=1, max_size=8)


def program_refused(program: str) -> bool:
    if bad_char(program) or not program or program[0] in "-@:+!|":
        return True
    if set(program) & set("\\\"'$"):
        return True
    if not program.startswith("/"):
        return "/" in program or program in (".", "..") or len(program.encode()) > 255
    parts = program.split("/")[1:]
    return (
        any(part in ("", ".", "..") for part in parts)
        or len(program.encode()) >= 4096
        or max(len(p.encode()) for p in parts) > 255
    )


@SETTINGS
@given(
    st.one_of(
        st.builds(lambda parts: "/" + "/".join(parts), st.lists(PROGRAM_PART, max_size=4)),
        PROGRAM_PART,
    ),
    st.lists(VALUES, max_size=4),
)
@example("/opt/serve", ["--x", "a\\", ";", "", "$HOME", "${X}", "%i", "'q'", '"q"', " s "])
@example("/opt/bin/", ["x"])
@example("/opt/./bin", ["x"])
@example("/opt//bin", ["x"])
@example("/" + "a" * 256, [])
@example("/" + "/".join(["a" * 200] * 21), [])
@example("/" + "/".join(["a" * 200] * 20), [])
@example("serve", ["x"])
@example("/opt/a$b", [])
@example("/opt/100%", [])
def test_exec_start_round_trips(program, args):
    argv = [program, *args]
    try:
        rendered = units.exec_line(argv, "exec")
    except UnitRenderError:
        assert program_refused(program) or any(bad_char(arg) for arg in args)
        return
    assert not program_refused(program)
    text = units.unit_document([], [("Service", [("ExecStart", rendered), ("Type", "simple")])])
    entries = sd.parse_unit(text)
    assert sd.exec_command(one(entries, "Service", "ExecStart")) == ("", argv)


# --- paths ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    st.one_of(
        st.builds(lambda parts: "/" + "/".join(parts), st.lists(PROGRAM_PART, max_size=4)),
        VALUES,
    )
)
@example("/var/lib/x\\")
@example("/var/lib/x ")
@example("/var/lib/100%")
@example("/")
@example("relative")
def test_paths_round_trip(value):
    try:
        rendered = units.escape_path(value, "path")
    except UnitRenderError:
        assert (
            unquoted_refused(value)
            or not value.startswith("/")
            or (value != "/" and program_refused(value.replace("$", "").replace("'", "")))
            or program_refused(value.replace("\\", "").replace("$", "").replace("'", ""))
        )
        return
    text = units.unit_document([], [("Unit", [("ConditionPathExists", rendered)])])
    assert sd.path_value(one(sd.parse_unit(text), "Unit", "ConditionPathExists")) == value


# --- User= / Group= ------------------------------------------------------------------------------


@SETTINGS
@given(st.one_of(VALUES, st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,35}\$?", fullmatch=True)))
@example("llm")
@example("1000")
@example("65535")
@example("a:b")
@example("svc.llm")
@example("name\n")
def test_accounts_round_trip(value):
    try:
        rendered = units.account_name(value, "user")
    except UnitRenderError:
        return
    text = units.unit_document([], [("Service", [("User", rendered)])])
    raw = one(sd.parse_unit(text), "Service", "User")
    assert sd.plain_value(raw) == value
    assert value.isdigit() or (value[0] in string.ascii_letters + "_" and len(value) <= 31)
    if "." not in value and "$" not in value:
        assert sd.user_group(raw) == value


# --- unit and slice names ------------------------------------------------------------------------


def unescape_unit_part(text: str) -> str:
    data = bytearray()
    index = 0
    while index < len(text):
        if text.startswith("\\x", index):
            data.append(int(text[index + 2 : index + 4], 16))
            index += 4
        else:
            data.extend(text[index].encode())
            index += 1
    return data.decode("utf-8")


@SETTINGS
@given(st.text(max_size=60).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)))
@example("team-a")
@example("a" * 240)
@example("%i$\\")
def test_slice_names_round_trip(tenant):
    try:
        name = units.slice_name(tenant)
    except UnitRenderError:
        assert tenant == "" or len(f"numafleet-{units.systemd_escape(tenant)}.slice") > 255
        return
    units.check_unit_name(name, ".slice", "slice")
    text = units.unit_document([], [("Service", [("Slice", name)])])
    raw = one(sd.parse_unit(text), "Service", "Slice")
    assert sd.plain_value(raw) == name
    assert unescape_unit_part(name[len("numafleet-") : -len(".slice")]) == tenant


# --- timer fields --------------------------------------------------------------------------------


@SETTINGS
@given(VALUES)
@example("daily")
@example("*-*-* 03:00:00 Europe/Berlin")
@example("daily\\")
@example("daily%i")
@example("*-*-* 03:00:00")
@example("@1395716396")
def test_calendar_round_trips(value):
    try:
        rendered = units.calendar_value(value, "drift_timer_on_calendar")
    except UnitRenderError:
        assert (
            unquoted_refused(value)
            or not value
            or set(value) - set(string.ascii_letters + string.digits + " :*,./~_+@-")
        )
        return
    text = units.unit_document([], [("Timer", [("OnCalendar", rendered), ("Persistent", "true")])])
    entries = sd.parse_unit(text)
    assert sd.plain_value(one(entries, "Timer", "OnCalendar")) == value
    assert sd.lookup(entries, "Timer", "Persistent") == ["true"]


@SETTINGS
@given(st.one_of(VALUES, st.integers(min_value=0, max_value=10**6)))
@example("15min")
@example("2h 30min")
@example("infinity")
@example("15min\\")
def test_timespans_round_trip(value):
    try:
        rendered = units.timespan_value(value, "drift_timer_timeout")
    except UnitRenderError:
        assert isinstance(value, str)
        return
    text = units.unit_document([], [("Service", [("TimeoutStartSec", rendered)])])
    assert sd.plain_value(one(sd.parse_unit(text), "Service", "TimeoutStartSec")) == str(value)


# --- whole files: placements, drop-ins, slices, the MIG boot unit --------------------------------


def make_plan(*placements, tenants=()) -> dict:
    return {
        "version": units.PLAN_VERSION,
        "host": "gpu-a100-01",
        "placements": list(placements),
        "tenants": list(tenants),
        "mps_daemons": [],
    }


@SETTINGS
@given(VALUES, st.dictionaries(st.from_regex(r"[A-Z_]{1,6}", fullmatch=True), VALUES, max_size=3))
@example("reranker \\", {})
@example("ok", {"A": "v\\"})
def test_a_rendered_service_reads_back_whole(description, environment):
    entry = plan_shapes.placement(
        "llm",
        description=description,
        environment=environment,
        argv=["/opt/llm/serve", description, "%n"],
        mps={"pipe_dir": "/run/nvidia-mps/GPU-8e9f"},
    )
    files = None
    try:
        files = units.render_files(make_plan(entry))
    except UnitRenderError as exc:
        message = str(exc)
    else:
        message = None
    if message is not None:
        assert message.startswith("host gpu-a100-01: plan placements[0] (llm)")
        assert (
            unquoted_refused(description)
            or bad_char(description)
            or any(bad_char(v) for v in environment.values())
        )
        return
    entries = sd.parse_unit(files[f"{UNIT_DIR}/numafleet-llm.service"])
    want_description = description or "numafleet placement llm"
    assert sd.description(one(entries, "Unit", "Description")) == want_description
    assert sd.lookup(entries, "Unit", "Requires") == ["nvidia-mps@GPU-8e9f.service"]
    assert sd.lookup(entries, "Unit", "After") == ["nvidia-mps@GPU-8e9f.service"]
    got = {}
    for raw in sd.lookup(entries, "Service", "Environment"):
        got.update(sd.environment(raw))
    assert got == environment
    prefixes, argv = sd.exec_command(one(entries, "Service", "ExecStart"))
    assert argv == ["/opt/llm/serve", description, "%n"]


# --- regressions: a trailing backslash swallowed the next line ------------------------------------


def test_a_description_ending_in_a_backslash_no_longer_swallows_requires():
    """Before: 'Description=reranker \\' joined 'Requires=nvidia-mps@...' to the description."""
    entry = plan_shapes.placement(
        "reranker", description="reranker \\", mps={"pipe_dir": "/run/nvidia-mps/GPU-8e9f"}
    )
    with pytest.raises(UnitRenderError) as err:
        units.render_files(make_plan(entry))
    assert "plan placements[0] (reranker).description" in str(err.value)
    assert "ends in a backslash" in str(err.value)
    assert "remove the backslash" in str(err.value)


def test_a_mig_placement_ending_in_a_backslash_keeps_after_the_mig_unit():
    mig_gpu = {"address": "0000:17:00.0", "uuid": "GPU-8e9f", "mig": {"profile": "3g.40gb"}}
    entry = plan_shapes.placement("mig", description="on mig\\", gpus=[mig_gpu])
    with pytest.raises(UnitRenderError, match="ends in a backslash"):
        units.render_files(make_plan(entry))
    entry["description"] = "on mig \\\\ fine"
    text = units.render_files(make_plan(entry))[f"{UNIT_DIR}/numafleet-mig.service"]
    entries = sd.parse_unit(text)
    assert sd.lookup(entries, "Unit", "After") == [units.MIG_BOOT_UNIT]
    assert sd.description(one(entries, "Unit", "Description")) == "on mig \\\\ fine"


def test_a_tenant_description_ending_in_a_backslash_is_refused():
    tenant = {
        "name": "team",
        "slice": units.slice_name("team"),
        "description": "team \\",
        "cpus": [2],
        "mems": [0],
        "placements": ["llm"],
        "memory_max_kb": None,
    }
    with pytest.raises(UnitRenderError, match=r"tenants\[0\] \(team\).description"):
        units.render_files(make_plan(plan_shapes.placement("llm"), tenants=[tenant]))


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("user", "svc\n", "U+000A"),
        ("user", "a:b", "not a user or group name"),
        ("group", "65535", "reserved"),
        ("description", "nel\x85", "U+0085"),
        ("description", "line\u2028sep", "U+2028"),
        ("description", "  padded", "starts or ends with a space"),
        ("argv", ["/opt/" + "a" * 256], "component of 256"),
        ("argv", ["/" + "/".join(["a" * 200] * 21)], "under 4096 bytes"),
        ("argv", ["/opt/bin/"], "not normalised"),
        ("argv", ["/opt/../bin/x"], "not normalised"),
        ("argv", ["/opt/$x"], "wrapper script"),
    ],
)
def test_values_systemd_refuses_or_changes_are_refused(field, value, fragment):
    entry = plan_shapes.placement("llm", **{field: value})
    with pytest.raises(UnitRenderError) as err:
        units.render_files(make_plan(entry))
    assert fragment in str(err.value)
    assert "host gpu-a100-01" in str(err.value)


def test_the_mig_boot_unit_reads_back():
    text = mig.unit_text("/usr/local/lib/numafleet/mig 100%", "/etc/numafleet/mig state.json", "#")
    entries = sd.parse_unit(text)
    assert sd.exec_command(one(entries, "Service", "ExecStart")) == (
        "",
        [mig.PYTHON, "/usr/local/lib/numafleet/mig 100%", "/etc/numafleet/mig state.json"],
    )
    assert sd.path_value(one(entries, "Unit", "ConditionPathExists")) == (
        "/etc/numafleet/mig state.json"
    )
    for bad in ("/etc/x\\", "/etc/x/", "/etc/x "):
        with pytest.raises(UnitRenderError):
            mig.unit_text("/usr/lib/p", bad, "#")
    with pytest.raises(UnitRenderError, match="not a comment"):
        mig.unit_text("/usr/lib/p", "/etc/s", "# ok\nExecStartPre=/bin/evil")


def test_the_hugepage_mount_unit_reads_back():
    (mount,) = hugepages.parse_mounts([{"path": "/dev/huge 100%", "size_kb": 2048}], [2048])
    entries = sd.parse_unit(hugepages.render_mount(mount))
    assert sd.path_value(one(entries, "Mount", "Where")) == "/dev/huge 100%"
    assert sd.lookup(entries, "Unit", "DefaultDependencies") == ["no"]


# --- systemd's own verdict on rendered units with awkward values -----------------------------------


def verify_findings(paths) -> list:
    """Lines systemd-analyze verify prints about ``paths`` (it exits 0 even on Unknown key)."""
    env = dict(os.environ, LC_ALL="C", SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", *map(str, paths)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    names = [path.name for path in paths]
    lines = (proc.stdout + proc.stderr).splitlines()
    found = [line for line in lines if any(name in line for name in names)]
    return found + ([f"rc={proc.returncode}: {lines}"] if proc.returncode else [])


AWKWARD_TEXT = "100% \"q\" 'q' a\\b é $HOME ${X} ; #x"
AWKWARD_ARGV = ["/usr/bin/sleep", "a;b", ";", "$HOME", "%n", "tail\\", "", " spaced "]
AWKWARD_ENV = {"A": "x y \\", "B": "%i $X", "C": "", "D": " 'q' \"q\" "}


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_awkward_values_pass_systemd_analyze_verify_and_read_back(tmp_path):
    tenant = {
        "name": "team a/β",
        "slice": units.slice_name("team a/β"),
        "description": AWKWARD_TEXT,
        "cpus": [0],
        "mems": [0],
        "placements": ["llm"],
        "memory_max_kb": None,
    }
    entry = plan_shapes.placement(
        "llm",
        description=AWKWARD_TEXT,
        argv=AWKWARD_ARGV,
        environment=AWKWARD_ENV,
        user="llm_svc",
        group="llm-svc",
        slice=tenant["slice"],
    )
    files = units.render_files(make_plan(entry, tenants=[tenant]))
    files[f"{UNIT_DIR}/{mig.UNIT_NAME}"] = mig.unit_text(
        "/usr/local/lib/numafleet mig/boot 100%", "/etc/numafleet/mig state 100%.json", "# x"
    )
    paths = []
    for path, text in files.items():
        local = tmp_path / path.rsplit("/", 1)[1]
        local.write_text(text, encoding="utf-8")
        paths.append(local)
    assert verify_findings(paths) == []

    service = sd.parse_unit(files[f"{UNIT_DIR}/numafleet-llm.service"])
    assert sd.description(one(service, "Unit", "Description")) == AWKWARD_TEXT
    assert sd.exec_command(one(service, "Service", "ExecStart")) == ("", AWKWARD_ARGV)
    env = {}
    for raw in sd.lookup(service, "Service", "Environment"):
        env.update(sd.environment(raw))
    assert env == AWKWARD_ENV
    assert sd.plain_value(one(service, "Service", "Slice")) == tenant["slice"]
    slice_file = sd.parse_unit(files[f"{UNIT_DIR}/{tenant['slice']}"])
    assert sd.description(one(slice_file, "Unit", "Description")) == AWKWARD_TEXT


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_is_silent_on_a_swallowed_line(tmp_path):
    """Why the parser exists: verify says nothing when a trailing backslash eats Requires=."""
    unit = tmp_path / "swallowed.service"
    unit.write_text(
        "[Unit]\nDescription=reranker \\\nRequires=nvidia-mps@GPU-1.service\n"
        "[Service]\nExecStart=/usr/bin/sleep 1\n",
        encoding="utf-8",
    )
    assert verify_findings([unit]) == []
    entries = sd.parse_unit(unit.read_text(encoding="utf-8"))
    assert sd.lookup(entries, "Unit", "Requires") == []
