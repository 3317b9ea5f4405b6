"""guard_program.py: the numafleet-guard program on guest-layout tmp trees (guard_trees).

Writes go into the tmp tree (memory.reclaim there is a plain file); what the kernel would answer
that a plain file cannot (EAGAIN, a cgroup gone mid-round) comes from a writer passed in.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import guard_trees
import pytest
import yaml

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard_program as gp
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import GuardError

MIB = 1024 * 1024
REPO = Path(__file__).resolve().parents[5]
CORE = REPO / "plugins" / "module_utils" / "numa"
LAUNCHER = REPO / "roles" / "memory_guard" / "files" / "numafleet-guard"
# The modules the memory_guard role installs (its vars): the launcher tests run exactly those, so a
# module the program imports but the role leaves out fails here.
PACKAGE_FILES = tuple(
    name.removesuffix(".py")
    for name in yaml.safe_load((REPO / "roles" / "memory_guard" / "vars" / "main.yml").read_text())[
        "__memory_guard_modules"
    ]
)
KV_LOW = "numafleet.slice/numafleet-kv-low.service"
KV_HIGH = "numafleet.slice/numafleet-kv-high.service"


def _config(root, plan, tmp_path, **settings) -> dict:
    base = {
        "warn_pct": 80,
        "act_pct": 90,
        "act": "reclaim",
        "interval_s": 15,
        "preflight": "warn",
        "textfile": f"{tmp_path}/textfile/numafleet_guard.prom",
        "state_file": f"{tmp_path}/run/state.json",
    }
    base.update(settings)
    return {"version": 1, "host": "guest", "settings": base, "placements": plan["placements"]}


def _write_config(tmp_path, data) -> str:
    path = tmp_path / "guard.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


class Clock:
    """time.time / time.monotonic stand-ins: each call moves on by ``step`` seconds."""

    def __init__(self, start: float = 1000.0, step: float = 0.0) -> None:
        self.now, self.step = start, step

    def __call__(self) -> float:
        value = self.now
        self.now += self.step
        return value


@dataclasses.dataclass
class Setup:
    root: str
    plan: dict
    config_path: str
    host: gp.Host
    journal: gp.ListJournal
    clock: Clock

    def program(self) -> gp.Program:
        return gp.Program(gp.load_config(self.config_path), self.host)

    def cg(self, rel: str) -> Path:
        return Path(self.root) / "sys" / "fs" / "cgroup" / rel

    def set_node(self, nid: int, pct: float) -> None:
        path = Path(self.root) / "sys" / "devices" / "system" / "node" / f"node{nid}" / "meminfo"
        path.write_text(guard_trees.meminfo_text(guard_trees.node(nid, pct)), encoding="ascii")

    def messages(self) -> list:
        return [r["MESSAGE"] for r in self.journal.records]


def _setup(tmp_path, scenario="guest-over-act", write=gp.write_file, **settings) -> Setup:
    root, plan = guard_trees.make(scenario, tmp_path / "tree")
    config_path = _write_config(tmp_path, _config(root, plan, tmp_path, **settings))
    journal, clock = gp.ListJournal(), Clock(step=15.0)
    host = gp.Host(
        sysfs_root=f"{root}/sys",
        cgroup_root=f"{root}/sys/fs/cgroup",
        procfs_root=f"{root}/proc",  # no meminfo there unless a test writes one: swap unknown
        write=write,
        journal=journal,
        clock=clock,
        monotonic=Clock(),
    )
    return Setup(root, plan, config_path, host, journal, clock)


# --- config ----------------------------------------------------------------------------------


def test_a_good_config_parses(tmp_path):
    s = _setup(tmp_path, act="throttle", warn_pct=75, act_pct=88, interval_s=5)
    config = gp.load_config(s.config_path)
    assert config.host == "guest"
    assert (config.thresholds.warn_pct, config.thresholds.act_pct) == (75.0, 88.0)
    assert config.thresholds.mode == "throttle" and config.act == "throttle"
    assert config.interval_s == 5.0 and config.preflight == "warn"
    assert [spec.name for spec in config.specs] == ["etl", "kv-high", "kv-low"]
    assert config.state_file == f"{tmp_path}/run/state.json"
    assert "3 placement(s), warn 75%, act 88% (throttle), every 5 s" in config.summary()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"version": 2}, r"version is 2; this numafleet-guard reads version 1"),
        ({"host": ""}, r"host is ''"),
        ({"settings": []}, r"settings is list"),
        ({"settings": {"warn_pct": 80, "colour": 1}}, r"unknown setting settings.colour"),
        ({"settings": {"act": "kill"}}, r"settings.act is 'kill'; set numafleet_memory_act"),
        ({"settings": {"interval_s": 0}}, r"numafleet_memory_guard_interval to seconds from 1"),
        ({"settings": {"interval_s": True}}, r"settings.interval_s is True"),
        ({"settings": {"preflight": "maybe"}}, r"set numafleet_preflight to one of enforce"),
        ({"settings": {"textfile": "rel/x.prom"}}, r"numafleet_memory_guard_textfile_dir"),
        ({"settings": {"textfile": "/var/lib/x.txt"}}, r"reads only \*.prom files"),
        ({"settings": {"state_file": "/run/../etc/x"}}, r"settings.state_file .* not an absolute"),
        ({"settings": {"warn_pct": 95, "act_pct": 90}}, r"numafleet_memory_warn_pct \(95\)"),
        ({"placements": [{"name": "x"}]}, r"plan placement 'x'.unit is None"),
    ],
)
def test_a_bad_config_is_refused_naming_file_host_variable_and_fix(tmp_path, change, expected):
    s = _setup(tmp_path)
    data = json.loads(Path(s.config_path).read_text(encoding="utf-8"))
    data.update(change)
    with pytest.raises(GuardError, match=expected) as caught:
        gp.parse_config(data, s.config_path)
    message = str(caught.value)
    assert message.startswith(s.config_path)
    assert "(host guest)" in message or "host is" in message
    assert "run site.yml" in message


# The keys of a plan placement the memory_guard role writes into guard.json (decision 2).
CONFIG_KEYS = {
    "name", "unit", "unit_kind", "slice", "node", "nodes", "mems", "memory_node", "memory_kb",
    "cpus", "hugepages", "gpus", "device_allow", "near", "priority",
}  # fmt: skip


def test_every_plan_of_the_corpus_is_a_guard_config():
    """Each plan the planner makes from the plan corpus (unit tests + demo fleet) parses."""
    import plan_corpus

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import planner

    parsed = 0
    for call in plan_corpus.load_inputs():
        try:
            plan = planner.plan_host(**json.loads(json.dumps(call)))
        except Exception:  # a refused input: no plan, nothing for the guard
            continue
        placements = [
            {k: v for k, v in entry.items() if k in CONFIG_KEYS} for entry in plan["placements"]
        ]
        data = {"version": 1, "host": "h", "settings": {}, "placements": placements}
        config = gp.parse_config(data, "/etc/numafleet/guard.json")
        assert len(config.specs) == len(placements)
        parsed += 1
    assert parsed > 100


def test_check_config_exit_codes(tmp_path, capsys):
    s = _setup(tmp_path)
    assert gp.main(["check-config", "--config", s.config_path]) == 0
    assert f"{s.config_path} is valid: host guest" in capsys.readouterr().out
    Path(s.config_path).write_text("{not json", encoding="utf-8")
    assert gp.main(["check-config", "--config", s.config_path]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert gp.main(["check-config", "--config", str(tmp_path / "absent.json")]) == 2
    err = capsys.readouterr().err
    assert "absent.json: No such file or directory" in err and "run site.yml" in err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as caught:
        gp.main(["explode"])
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_migrate_act_parses(tmp_path):
    s = _setup(tmp_path, act="migrate")
    assert gp.load_config(s.config_path).thresholds.mode == "migrate"


# --- applying a round ------------------------------------------------------------------------


def test_reclaim_writes_the_bytes_and_leaves_high_alone(tmp_path):
    s = _setup(tmp_path)
    program = s.program()
    first = program.round()
    assert first.applied == ()  # act_rounds 2: the first round over act only warns
    second = program.round()
    [item] = second.applied
    assert (item.action.action, item.action.placement, item.result) == ("reclaim", "kv-low", "ok")
    assert s.cg(KV_LOW + "/memory.reclaim").read_text() == f"{item.action.amount_bytes}\n"
    assert s.cg(KV_HIGH + "/memory.reclaim").read_text() == ""
    assert item.current_after == int(s.cg(KV_LOW + "/memory.current").read_text())
    assert dict(second.saved.state.actions_total) == {(1, "reclaim", "kv-low"): 1}
    assert second.saved.state.failures_total == ()


def test_eagain_is_a_partial_reclaim_logged_with_memory_current(tmp_path):
    def write(path, text):
        if path.endswith("/memory.reclaim"):
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        gp.write_file(path, text)

    s = _setup(tmp_path, write=write)
    program = s.program()
    program.round()
    [item] = program.round().applied
    assert item.result == "partial" and item.took_effect
    assert "EAGAIN" in item.detail
    record = s.journal.records[-1]
    assert record["NUMAFLEET_RESULT"] == "partial"
    assert (
        record["NUMAFLEET_CURRENT_AFTER_BYTES"]
        == s.cg(KV_LOW + "/memory.current").read_text(encoding="ascii").strip()
    )
    assert dict(program.saved.state.actions_total) == {(1, "reclaim", "kv-low"): 1}


def test_a_failed_write_counts_as_a_failure_not_an_action(tmp_path):
    s = _setup(tmp_path)
    reclaim = s.cg(KV_LOW + "/memory.reclaim")
    reclaim.unlink()
    reclaim.mkdir()  # a write into a directory fails for real (EISDIR)
    program = s.program()
    program.round()
    outcome = program.round()
    [item] = outcome.applied
    assert item.result == "failed" and "EISDIR" in item.detail
    state = outcome.saved.state
    assert state.actions_total == ()
    assert dict(state.failures_total) == {(1, "reclaim", "kv-low"): 1}
    record = s.journal.records[-1]
    assert record["PRIORITY"] == "3" and "FAILED" in record["MESSAGE"]
    text = Path(tmp_path / "textfile" / "numafleet_guard.prom").read_text()
    assert "# TYPE numafleet_guard_action_failures_total counter" in text
    assert (
        'numafleet_guard_action_failures_total{node="1",action="reclaim",placement="kv-low"} 1.0'
        in text
    )
    assert "numafleet_guard_actions_total{" not in text
    saved = json.loads(Path(tmp_path / "run" / "state.json").read_text())
    assert saved["failures_total"] == [
        {"node": 1, "action": "reclaim", "placement": "kv-low", "count": 1}
    ]


def test_a_cgroup_gone_mid_round_is_neither_action_nor_failure(tmp_path):
    def write(path, text):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    s = _setup(tmp_path, write=write)
    program = s.program()
    program.round()
    [item] = program.round().applied
    assert item.result == "gone"
    assert program.saved.state.actions_total == () == program.saved.state.failures_total


def _throttled(tmp_path):
    s = _setup(tmp_path, act="throttle")
    program = s.program()
    program.round()
    outcome = program.round()
    [item] = outcome.applied
    assert (item.action.action, item.action.placement, item.result) == ("throttle", "kv-low", "ok")
    return s, program, int(item.action.value)


def test_throttle_writes_memory_high_and_keeps_the_value(tmp_path):
    s, program, value = _throttled(tmp_path)
    assert s.cg(KV_LOW + "/memory.high").read_text() == f"{value}\n"
    assert program.saved.throttle_written == {"kv-low": value}
    assert dict(program.saved.state.throttled) == {"kv-low": (1, None)}
    assert s.cg(KV_HIGH + "/memory.high").read_text() == "max\n"


def test_a_throttle_put_back_by_systemd_is_written_again(tmp_path):
    s, program, value = _throttled(tmp_path)
    s.set_node(1, 85.0)  # in the warn band: decide neither throttles further nor releases
    s.cg(KV_LOW + "/memory.high").write_text("max\n")  # daemon-reload re-applied MemoryHigh=
    outcome = program.round()
    [item] = outcome.applied
    assert item.reapply and item.result == "ok"
    assert (item.action.action, item.action.before, item.action.value) == (
        "throttle",
        "max",
        str(value),
    )
    assert s.cg(KV_LOW + "/memory.high").read_text() == f"{value}\n"
    assert dict(outcome.saved.state.actions_total)[(1, "throttle", "kv-low")] == 2
    assert "written again" in s.journal.records[-1]["MESSAGE"]
    assert program.round().applied == ()  # holds now: nothing more to write


def test_a_tighter_memory_high_is_not_loosened(tmp_path):
    s, program, value = _throttled(tmp_path)
    s.set_node(1, 85.0)
    s.cg(KV_LOW + "/memory.high").write_text(f"{value - MIB}\n")
    assert program.round().applied == ()
    assert s.cg(KV_LOW + "/memory.high").read_text() == f"{value - MIB}\n"


def test_release_writes_the_old_value_back(tmp_path):
    s, program, value = _throttled(tmp_path)
    s.set_node(1, 40.0)
    outcome = program.round()
    [item] = outcome.applied
    assert (item.action.action, item.action.before, item.result) == ("release", str(value), "ok")
    assert s.cg(KV_LOW + "/memory.high").read_text() == "max\n"
    assert outcome.saved.state.throttled == () and outcome.saved.throttle_written == {}


def test_release_after_the_kernel_rounded_memory_high_to_whole_pages(tmp_path):
    """Found on the guest: 1479574732 written, 1479573504 read back (4 KiB pages)."""
    s, program, value = _throttled(tmp_path)
    rounded = value - value % 4096  # what the kernel keeps of the value written
    s.cg(KV_LOW + "/memory.high").write_text(f"{rounded}\n")
    s.set_node(1, 40.0)
    [item] = program.round().applied
    assert (item.action.action, item.result) == ("release", "ok")
    assert s.cg(KV_LOW + "/memory.high").read_text() == "max\n"


@pytest.mark.parametrize(
    ("text", "written", "held"),
    [
        ("1479573504\n", 1479574732, True),  # the guest's pair
        ("1479574732\n", 1479574732, True),
        ("1479569408\n", 1479574732, False),  # a page lower: someone else's value
        ("max\n", 1479574732, False),
        ("junk", 1479574732, False),
    ],
)
def test_holds_written_allows_only_the_kernels_page_rounding(text, written, held):
    assert gp.holds_written(text, written, page_bytes=4096) is held


def test_release_is_skipped_when_memory_high_was_changed(tmp_path):
    s, program, value = _throttled(tmp_path)
    s.set_node(1, 40.0)
    s.cg(KV_LOW + "/memory.high").write_text(f"{2048 * MIB}\n")  # someone set their own limit
    outcome = program.round()
    [item] = outcome.applied
    assert item.action.action == "release" and item.result == "skipped"
    assert s.cg(KV_LOW + "/memory.high").read_text() == f"{2048 * MIB}\n"
    assert f"not the {value} the guard wrote" in item.detail
    assert s.journal.records[-1]["PRIORITY"] == "4"
    assert (1, "release", "kv-low") not in dict(outcome.saved.state.actions_total)
    assert outcome.saved.state.throttled == () and outcome.saved.throttle_written == {}


def test_a_failed_release_is_retried(tmp_path):
    s, program, value = _throttled(tmp_path)
    s.set_node(1, 40.0)
    high = s.cg(KV_LOW + "/memory.high")

    def busy(path, text):
        raise OSError(errno.EBUSY, "Device or resource busy")

    program.host.write = busy
    [failed] = program.round().applied
    assert failed.result == "failed"
    assert dict(program.saved.state.throttled) == {"kv-low": (1, None)}
    program.host.write = gp.write_file
    [retried] = program.round().applied
    assert (retried.action.action, retried.result) == ("release", "ok")
    assert high.read_text() == "max\n"
    assert dict(program.saved.state.failures_total) == {(1, "release", "kv-low"): 1}


def test_a_failed_first_throttle_is_not_held(tmp_path):
    high = []

    def write(path, text):
        high.append(path)
        raise OSError(errno.EINVAL, "Invalid argument")

    s = _setup(tmp_path, act="throttle", write=write)
    program = s.program()
    program.round()
    [item] = program.round().applied
    assert item.result == "failed" and high
    assert program.saved.state.throttled == () and program.saved.throttle_written == {}


# --- migrate (guard_migrate and the spill helpers) ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class FakeMigrateResult:
    pids: tuple
    not_moved_pages: int
    errors: tuple


def _migrate_action():
    return guard.Action(1, "migrate", "kv-low", KV_LOW, "0", 900 * MIB, None, "node 1 at 92%")


def test_migrate_calls_migrate_cgroup_with_the_nodes(tmp_path):
    s = _setup(tmp_path)
    calls = []

    def migrate(cgroup_dir, from_nodes, to_nodes):
        calls.append((cgroup_dir, from_nodes, to_nodes))
        return FakeMigrateResult((4242,), 3, ())

    s.host.migrate = migrate
    item = gp.apply_action(_migrate_action(), s.host, None)
    assert calls == [(f"{s.host.cgroup_root}/{KV_LOW}", [1], [0])]
    assert item.result == "partial" and "3 page(s) not moved" in item.detail


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (FakeMigrateResult((1, 2), 0, ()), "ok"),
        (FakeMigrateResult((1, 2), 0, ((2, "EPERM"),)), "partial"),
        (FakeMigrateResult((1,), 0, ((1, "EPERM"),)), "failed"),
        (FakeMigrateResult((), 0, ()), "skipped"),
    ],
)
def test_migrate_results(tmp_path, result, expected):
    s = _setup(tmp_path)
    s.host.migrate = lambda *args: result
    assert gp.apply_action(_migrate_action(), s.host, None).result == expected


def test_the_real_migrate_cgroup_is_called(tmp_path):
    s = _setup(tmp_path)
    pid_file = s.cg(KV_LOW + "/cgroup.procs")
    pid_file.write_text(f"{os.getpid()}\n")  # this test's own process, node 1 -> node 0
    item = gp.apply_action(_migrate_action(), gp.Host(cgroup_root=s.host.cgroup_root), None)
    assert item.result in ("ok", "partial", "failed")  # a 1-node host refuses node 1: no crash


def test_spills_are_recorded_and_cleared_with_the_core_helpers(tmp_path):
    s = _setup(tmp_path)
    program = s.program()
    outcome = program.round()
    spilled = guard.record_spill({}, _migrate_action(), 1000.0)
    saved = dataclasses.replace(outcome.saved, spilled=spilled)
    assert gp.parse_saved(json.loads(json.dumps(saved.as_dict()))).spilled == spilled
    program.saved = saved
    s.set_node(1, 40.0)
    program.round()
    assert program.saved.spilled == {}
    assert any("kv-low is no longer spilled" in m for m in s.messages())


# --- journal ---------------------------------------------------------------------------------


def test_journal_native_protocol_encoding():
    data = gp.encode_journal({"MESSAGE": "two\nlines", "PRIORITY": "4", "EMPTY": ""})
    assert data == (
        b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\n" + b"PRIORITY=4\n" + b"EMPTY=\n"
    )


def test_journal_records_reach_a_datagram_socket(tmp_path):
    path = str(tmp_path / "journal.socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    try:
        journal = gp.Journal(path, stream=io.StringIO())
        action = _migrate_action()
        journal.send(gp.Applied(action, "ok", "moved").journal_fields())
        data = server.recv(65536)
    finally:
        server.close()
        journal.close()
    fields = dict(line.split("=", 1) for line in data.decode().splitlines())
    assert fields["SYSLOG_IDENTIFIER"] == "numafleet-guard"
    assert fields["NUMAFLEET_ACTION"] == "migrate" and fields["NUMAFLEET_PLACEMENT"] == "kv-low"
    assert fields["NUMAFLEET_RESULT"] == "ok" and fields["NUMAFLEET_AFTER"] == "0"
    assert journal.stream.getvalue() == ""


def test_journal_falls_back_to_one_stderr_line(tmp_path):
    stream = io.StringIO()
    journal = gp.Journal(str(tmp_path / "absent.socket"), stream=stream)
    journal.send({"MESSAGE": "numafleet-guard: a\nb", "PRIORITY": "4"})
    assert stream.getvalue() == "<4>numafleet-guard: a b\n"


def test_a_round_logs_events_actions_and_new_warnings_once(tmp_path):
    s = _setup(tmp_path)
    program = s.program()
    program.round()
    program.round()
    levels = [r.get("NUMAFLEET_LEVEL") for r in s.journal.records if "NUMAFLEET_LEVEL" in r]
    assert levels == ["act"]  # an event when the level changes, not every round
    assert [r.get("NUMAFLEET_ACTION") for r in s.journal.records if "NUMAFLEET_ACTION" in r] == [
        "reclaim"
    ]
    s.cg(KV_HIGH + "/memory.numa_stat").write_text("garbage\n")
    program.round()
    program.round()
    assert sum("memory.numa_stat" in m or "no anon line" in m for m in s.messages()) == 1


# --- textfile and state ----------------------------------------------------------------------


def test_textfile_is_replaced_atomically_and_parses(tmp_path):
    s = _setup(tmp_path)
    program = s.program()
    program.round()
    program.round()
    directory = tmp_path / "textfile"
    assert sorted(p.name for p in directory.iterdir()) == ["numafleet_guard.prom"]
    path = directory / "numafleet_guard.prom"
    assert path.stat().st_mode & 0o777 == 0o644
    text = path.read_text()
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert families["numafleet_guard_actions"].type == "counter"
    [sample] = families["numafleet_guard_actions"].samples
    assert sample.labels == {"node": "1", "action": "reclaim", "placement": "kv-low"}
    assert families["numafleet_guard_last_run_timestamp_seconds"].samples[0].value == 1015.0


def test_write_atomic_leaves_no_temporary_file_on_failure(tmp_path):
    target = tmp_path / "dir" / "numafleet_guard.prom"
    target.mkdir(parents=True)  # rename onto a directory fails
    with pytest.raises(IsADirectoryError):
        gp.write_atomic(str(target), "x\n")
    assert sorted(p.name for p in target.parent.iterdir()) == ["numafleet_guard.prom"]


def test_state_round_trip_and_restart(tmp_path):
    s, program, value = _throttled(tmp_path)
    saved = program.saved
    assert gp.parse_saved(json.loads(json.dumps(saved.as_dict()))) == saved
    data = json.loads(Path(tmp_path / "run" / "state.json").read_text())
    assert data["throttle_written"] == {"kv-low": value}
    assert data["last_run"] == 1015.0 and data["spilled"] == {}
    assert data["throttled"] == {"kv-low": {"node": 1, "high_before": None}}
    restarted = s.program()  # a restart reads it back: the throttle is still released later
    assert restarted.saved == saved
    s.set_node(1, 40.0)
    [item] = restarted.round().applied
    assert (item.action.action, item.result) == ("release", "ok")


@pytest.mark.parametrize("text", ["{", "[]", '{"over_rounds": 3}', "\xff"])
def test_a_bad_state_file_starts_afresh_with_a_warning(tmp_path, text):
    s = _setup(tmp_path)
    state = tmp_path / "run" / "state.json"
    state.parent.mkdir()
    state.write_text(text, encoding="latin-1")
    program = s.program()
    assert program.saved == gp.Saved()
    assert s.messages()[-1].startswith(f"numafleet-guard: {state}: ")
    assert s.messages()[-1].endswith("starts afresh")
    assert s.journal.records[-1]["PRIORITY"] == "4"
    program.round()
    assert json.loads(state.read_text())["levels"] == {"0": "ok", "1": "act"}


def test_failures_total_round_trips_and_old_states_read():
    state = guard.GuardState(failures_total=(((1, "reclaim", "a"), 2),))
    assert guard.parse_state(state.as_dict()) == state
    old = state.as_dict()
    del old["failures_total"]  # a state file written before failures were counted
    assert guard.parse_state(old).failures_total == ()


# --- config reload and the loop --------------------------------------------------------------


def _touch_later(path: str) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_config_is_reloaded_when_it_changes(tmp_path):
    s = _setup(tmp_path)
    program = s.program()
    assert not program.maybe_reload()
    data = json.loads(Path(s.config_path).read_text())
    data["settings"]["act_pct"] = 95
    Path(s.config_path).write_text(json.dumps(data))
    _touch_later(s.config_path)
    assert program.maybe_reload()
    assert program.config.thresholds.act_pct == 95.0
    assert "config reloaded" in s.messages()[-1]
    program.round()
    program.round()
    assert program.saved.state.actions_total == ()  # 92% is under the new act threshold


def test_a_bad_new_config_keeps_the_old_one(tmp_path):
    s = _setup(tmp_path)
    program = s.program()
    Path(s.config_path).write_text('{"version": 1, "host": "guest", "settings": {"act": "x"}}')
    _touch_later(s.config_path)
    assert not program.maybe_reload()
    assert program.config.act == "reclaim"
    assert "config not reloaded, the old one stays" in s.messages()[-1]
    assert not program.maybe_reload()  # logged once per change


class CountingStop(threading.Event):
    """Ends the loop after ``rounds`` waits; keeps the timeouts it was asked to wait and moves
    ``clock`` (the loop's monotonic clock) on by them."""

    def __init__(self, rounds: int, clock=None) -> None:
        super().__init__()
        self.rounds, self.timeouts, self.clock = rounds, [], clock

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        if self.clock is not None:
            self.clock.now += timeout
        if len(self.timeouts) >= self.rounds:
            self.set()
        return self.is_set()


def test_the_loop_keeps_a_monotonic_schedule(tmp_path):
    s = _setup(tmp_path)
    s.host.monotonic = Clock(start=50.0, step=2.0)  # each round "takes" 2 s
    stop = CountingStop(3, s.host.monotonic)
    assert gp.run_loop(s.program(), stop) == 0
    assert stop.timeouts == [13.0, 13.0, 13.0]


def test_a_late_round_skips_the_missed_slots(tmp_path):
    s = _setup(tmp_path)
    s.host.monotonic = Clock(start=0.0, step=40.0)  # 40 s per round: slots missed each time
    stop = CountingStop(2, s.host.monotonic)
    gp.run_loop(s.program(), stop)
    assert stop.timeouts == [5.0, 5.0]


def test_a_bad_round_is_logged_and_the_loop_goes_on(tmp_path):
    s = _setup(tmp_path)
    calls = []

    def read(path):
        calls.append(path)
        if len(calls) == 1:
            raise GuardError(f"{path}: Permission denied")
        return guard.read_path(path)

    s.host.read = read
    stop = CountingStop(3)
    gp.run_loop(s.program(), stop)
    failed = [m for m in s.messages() if "round failed" in m]
    assert len(failed) == 1 and "Permission denied" in failed[0]
    assert Path(tmp_path / "run" / "state.json").exists()


def test_once_json_reports_the_round_and_what_was_applied(tmp_path, capsys):
    s = _setup(tmp_path)
    argv = ["once", "--config", s.config_path]
    assert gp.main(argv, host=s.host) == 0
    assert capsys.readouterr().out == "node 0: 30.0% used (ok)\nnode 1: 92.0% used (act)\n"
    assert gp.main([*argv, "--json"], host=s.host) == 0
    report = json.loads(capsys.readouterr().out)
    assert [a["placement"] for a in report["actions"]] == ["kv-low"]
    assert report["applied"][0]["result"] == "ok"
    assert report["state"]["actions_total"][0]["count"] == 1
    assert {n["id"] for n in report["nodes"]} == {0, 1}


def test_run_once_runs_one_round(tmp_path):
    s = _setup(tmp_path)
    assert gp.main(["run", "--once", "--config", s.config_path], host=s.host) == 0
    assert "started: host guest" in s.messages()[0]
    assert s.messages()[-1] == "numafleet-guard: stopped"
    assert Path(tmp_path / "run" / "state.json").exists()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / ".collections")
    return env


def test_sigterm_ends_the_service_loop_cleanly(tmp_path):
    s = _setup(tmp_path, interval_s=600)  # SIGTERM must end the wait, not the next round
    state = tmp_path / "run" / "state.json"
    code = (
        "import sys\n"
        "from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard_program\n"
        "sys.exit(guard_program.main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", code, "run", "--config", s.config_path]
    argv += ["--sysfs-root", f"{s.root}/sys", "--cgroup-root", f"{s.root}/sys/fs/cgroup"]
    argv += ["--journal-socket", str(tmp_path / "no-journal")]
    proc = subprocess.Popen(argv, env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        for dummy in range(600):  # wait for the first round (at most 60 s on a loaded machine)
            if state.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "<6>numafleet-guard: stopped on SIGTERM" in err
    assert "Traceback" not in err
    assert json.loads(state.read_text())["levels"]["1"] == "act"


# --- the launcher and the installed package layout -------------------------------------------


def _install(prefix: Path, leave_out: tuple = ()) -> list:
    """The role's layout under ``prefix``: sbin/numafleet-guard and lib/numafleet-guard/
    numafleet_guard/ with the role's modules (less ``leave_out``) and an empty __init__.py."""
    package = prefix / "lib" / "numafleet-guard" / "numafleet_guard"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    copied = []
    for name in PACKAGE_FILES:
        source = CORE / f"{name}.py"
        if name not in leave_out:
            shutil.copy(source, package / source.name)
            copied.append(name)
    (prefix / "sbin").mkdir()
    shutil.copy(LAUNCHER, prefix / "sbin" / "numafleet-guard")
    os.chmod(prefix / "sbin" / "numafleet-guard", 0o755)
    return copied


def _launcher_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = "/nonexistent"  # -I ignores it: the program comes from the prefix only
    return env


@pytest.fixture
def installed(tmp_path):
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the launcher runs /usr/bin/python3, which this machine lacks")
    return _install(tmp_path / "usr" / "local")


def test_the_launcher_runs_the_copied_package(tmp_path, installed):
    assert set(installed) == set(PACKAGE_FILES)
    s = _setup(tmp_path)
    argv = [str(tmp_path / "usr" / "local" / "sbin" / "numafleet-guard")]
    argv += ["once", "--config", s.config_path, "--json", "--sysfs-root", f"{s.root}/sys"]
    argv += ["--cgroup-root", f"{s.root}/sys/fs/cgroup", "--journal-socket", ""]
    argv += ["--procfs-root", f"{s.root}/proc"]  # swap unknown there: reclaim as configured
    for dummy in range(2):
        done = subprocess.run(
            argv, env=_launcher_env(), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(a["action"], a["placement"], a["result"]) for a in report["applied"]] == [
        ("reclaim", "kv-low", "ok")
    ]
    assert s.cg(KV_LOW + "/memory.reclaim").read_text().strip() == str(
        report["applied"][0]["value"]
    )


def test_the_launcher_exit_code_for_a_bad_config(tmp_path, installed):
    launcher = str(tmp_path / "usr" / "local" / "sbin" / "numafleet-guard")
    done = subprocess.run(
        [launcher, "check-config", "--config", str(tmp_path / "absent.json")],
        env=_launcher_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "absent.json: No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_launcher_runs_preflight(tmp_path, installed):
    s = _setup(tmp_path)
    launcher = str(tmp_path / "usr" / "local" / "sbin" / "numafleet-guard")
    done = subprocess.run(
        [launcher, "preflight", "--mode", "warn", "--config", s.config_path, "kv-low"],
        env=_launcher_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # warn mode: 0 whatever the checks say
    assert "numafleet-guard preflight kv-low" in done.stdout
    assert "Traceback" not in done.stderr


def test_preflight_with_an_unreadable_config_exits_2(tmp_path, capsys):
    code = gp.main(["preflight", "--config", str(tmp_path / "absent.json"), "kv-low"])
    assert code == 2
    assert "absent.json: No such file or directory" in capsys.readouterr().out


def test_preflight_missing_from_the_package_exits_2(tmp_path):
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the launcher runs /usr/bin/python3, which this machine lacks")
    prefix = tmp_path / "usr" / "local"
    _install(prefix, leave_out=("guard_preflight",))
    done = subprocess.run(
        [str(prefix / "sbin" / "numafleet-guard"), "preflight", "kv-low"],
        env=_launcher_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "numafleet-guard preflight: not installed with this program" in done.stderr
    assert "Traceback" not in done.stderr


def test_preflight_refuses_an_unknown_placement(tmp_path):
    s = _setup(tmp_path)
    code = gp.main(["preflight", "--mode", "warn", "--config", s.config_path, "nope"])
    assert code == 2  # an unknown placement is a usage/config error (decision 6)


def test_a_migrate_round_moves_records_and_clears_the_spill(tmp_path):
    s = _setup(tmp_path, act="migrate")
    calls = []

    def migrate(cgroup_dir, from_nodes, to_nodes):
        calls.append((cgroup_dir, from_nodes, to_nodes))
        return FakeMigrateResult((4242,), 0, ())

    s.host.migrate = migrate
    program = s.program()
    program.round()
    outcome = program.round()
    [item] = outcome.applied
    assert (item.action.action, item.action.placement, item.result) == ("migrate", "kv-low", "ok")
    assert calls == [(f"{s.host.cgroup_root}/{KV_LOW}", [1], [0])]
    spill = outcome.saved.spilled["kv-low"]
    assert (spill["from"], spill["to"], spill["since"]) == ([1], [0], 1015.0)
    saved = json.loads(Path(tmp_path / "run" / "state.json").read_text())
    assert saved["spilled"]["kv-low"]["to"] == [0]
    text = Path(tmp_path / "textfile" / "numafleet_guard.prom").read_text()
    assert 'numafleet_guard_actions_total{node="1",action="migrate",placement="kv-low"} 1.0' in text
    s.set_node(1, 40.0)  # room again; kv-low's bytes are all on its planned node 1 in the tree
    program.round()
    assert program.saved.spilled == {}
    assert any("kv-low is no longer spilled" in m for m in s.messages())


def test_without_memory_reclaim_the_program_throttles(tmp_path):
    s = _setup(tmp_path)
    for path in Path(s.root, "sys", "fs", "cgroup").rglob("memory.reclaim"):
        path.unlink()  # a kernel before 5.19
    assert not gp.reclaim_available(s.host.cgroup_root, s.program().config.specs)
    program = s.program()
    program.round()
    [item] = program.round().applied
    assert (item.action.action, item.action.placement, item.result) == ("throttle", "kv-low", "ok")
    assert s.cg(KV_LOW + "/memory.high").read_text() == f"{item.action.value}\n"
    record = s.journal.records[-1]
    assert (record["NUMAFLEET_BEFORE"], record["NUMAFLEET_AFTER"]) == ("max", item.action.value)


def _proc_meminfo(s: Setup, swap_free_kb: int) -> None:
    """/proc/meminfo in the kernel's layout (values in kB), with the given SwapFree."""
    path = Path(s.root) / "proc" / "meminfo"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        ("MemTotal", 4012572),
        ("MemFree", 276112),
        ("SwapCached", 0),
        ("SwapTotal", 786428 if swap_free_kb else 0),
        ("SwapFree", swap_free_kb),
        ("Zswap", 0),
    ]
    path.write_text("".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in rows), encoding="ascii")


@pytest.mark.parametrize(
    ("act", "swap_free_kb", "expected"),
    [
        ("reclaim", 0, "throttle"),
        ("reclaim", 786428, "reclaim"),
        ("throttle", 786428, "throttle"),
    ],
)
def test_reclaim_without_free_swap_throttles_and_says_why(tmp_path, act, swap_free_kb, expected):
    s = _setup(tmp_path, act=act)
    _proc_meminfo(s, swap_free_kb)
    program = s.program()
    program.round()
    [item] = program.round().applied
    assert (item.action.action, item.action.placement) == (expected, "kv-low")
    blocked = "throttled, not reclaimed: no free swap (SwapFree 0 kB in /proc/meminfo)"
    assert (blocked in item.action.reason) == (act == "reclaim" and not swap_free_kb)
    assert (blocked in s.journal.records[-1]["MESSAGE"]) == (blocked in item.action.reason)


def test_swap_free_is_read_from_meminfo_and_unknown_when_missing(tmp_path):
    s = _setup(tmp_path)
    assert gp.swap_free_kb(s.host.read, s.host.procfs_root) is None
    assert gp.reclaim_blocker(s.host, gp.load_config(s.config_path).specs) == ""
    _proc_meminfo(s, 1234)
    assert gp.swap_free_kb(s.host.read, s.host.procfs_root) == 1234
    _proc_meminfo(s, 0)
    assert "no free swap" in gp.reclaim_blocker(s.host, gp.load_config(s.config_path).specs)
    for path in Path(s.root, "sys", "fs", "cgroup").rglob("memory.reclaim"):
        path.unlink()  # a kernel before 5.19 says so first
    assert "Linux before 5.19" in gp.reclaim_blocker(s.host, gp.load_config(s.config_path).specs)


def test_a_second_guard_is_refused_while_one_holds_the_lock(tmp_path, capsys):
    s = _setup(tmp_path)
    state_file = gp.load_config(s.config_path).state_file
    held = gp.lock(state_file)
    try:
        assert held is not None
        assert gp.main(["once", "--config", s.config_path], host=s.host) == 1
        assert "another numafleet-guard" in capsys.readouterr().err
        assert not Path(state_file).exists()  # it wrote nothing
    finally:
        os.close(held)
    assert gp.main(["once", "--config", s.config_path], host=s.host) == 0
    with open(f"{state_file}.lock") as handle:  # released when main returned
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
