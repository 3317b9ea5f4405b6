# Private to this collection: may change in any release.
"""numafleet-guard: the memory guard's program (config, loop, applying actions, journal, state).

Installed on a managed host as the package ``numafleet_guard`` (copies of this file and its
siblings guard, guard_preflight, guard_migrate, cpulist, errors) under
``/usr/local/lib/numafleet-guard`` and run by the launcher ``/usr/local/sbin/numafleet-guard``
from ``numafleet-guard.service`` (Type=simple). It imports only those siblings (relative
imports) and the standard library.

Subcommands (``main(argv)``; exit 0 ok, 1 a failed preflight check, 2 a usage or config error):

- ``run [--config PATH] [--once]``: a round every ``settings.interval_s`` seconds on a monotonic
  schedule until SIGTERM or SIGINT (a long-running service, not a timer: one round costs about a
  millisecond of CPU, a fresh interpreter tens of milliseconds, and a guard that must act when
  memory is tight should not have to start one then). The config is read again when its mtime,
  size or inode changes; a bad new config is logged and the old one kept. A round that fails is
  logged and the loop goes on.
- ``once --config PATH [--json]``: one round, applied, with the state and textfile written; the
  report (``Round.as_dict`` plus ``applied``) printed as JSON with ``--json``.
- ``preflight [--mode enforce|warn] [--config PATH] <placement>``: the unit's start-up check,
  ``guard_preflight.main(args, None)`` (args: the words after ``preflight``; it reads the config
  they name).
- ``check-config [--config PATH]``: validate the config and print a one-line summary.

Files:

- config ``/etc/numafleet/guard.json`` (written by the memory_guard role from the plan)::

    {"version": 1, "host": "<inventory_hostname>",
     "settings": {"warn_pct": 80, "act_pct": 90, "act": "reclaim|throttle|migrate",
                  "interval_s": 15, "preflight": "enforce|warn|off",
                  "textfile": "<dir>/numafleet_guard.prom" or null,
                  "state_file": "/run/numafleet-guard/state.json"},
     "placements": [plan placement entries (name unit slice mems memory_kb priority ...)]}

- lock ``<state_file>.lock``: ``run`` and ``once`` hold an exclusive flock(2) on it, so a
  second guard (``once`` while the service runs) exits 1 instead of writing the state too.
- state ``settings.state_file``: ``GuardState.as_dict()`` plus ``spilled`` ({placement: {from,
  to, since, bytes}}), ``throttle_written`` ({placement: bytes of memory.high the guard wrote})
  and ``last_run`` (epoch seconds). Written atomically each round; a state file that does not
  parse is logged and the guard starts afresh.
- textfile ``settings.textfile``: ``guard.as_textfile`` of the round after the actions were
  applied (failed writes in ``numafleet_guard_action_failures_total``), written atomically
  (temporary file in the same directory, then rename).

Applying (``Action.path`` is relative to the cgroup root):

- reclaim: the byte count into ``memory.reclaim``; EAGAIN (the kernel reclaimed less than
  asked) is a partial success, logged with the ``memory.current`` after. Where reclaim cannot
  lower the used ratio (no memory.reclaim, or ``SwapFree: 0 kB`` in /proc/meminfo: see
  ``reclaim_blocker``) the core throttles instead and says why in the action's reason.
- throttle: the new limit into ``memory.high``; the guard keeps the value it wrote. While it
  holds a throttle and finds ``memory.high`` looser than that value (systemd re-applies a unit's
  MemoryHigh= at daemon-reload), it writes its value again.
- release: the value before the first throttle back into ``memory.high``, only while
  ``memory.high`` still holds the value the guard wrote (else systemd or a person changed it: it
  is left as it is and logged).
- migrate: ``guard_migrate.migrate_cgroup(cgroup_dir, [hot node], [target node])``; a moved
  placement is recorded as spilled until its node is back under warn_pct - release_margin_pct
  and its off-node share is under 2 %.

A write that fails counts in ``failures_total`` (not in ``actions_total``); a cgroup gone
between read and write (the unit stopped) counts in neither.

Journal: records through the journal's native protocol (AF_UNIX datagrams to
``/run/systemd/journal/socket``, ``KEY=value`` lines, the length-prefixed form for values with
a newline), ``SYSLOG_IDENTIFIER=numafleet-guard``; without that socket one line per record on
stderr, with a ``<priority>`` prefix that systemd reads when stderr goes to the journal.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import importlib
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from . import guard
from .errors import GuardError

DEFAULT_CONFIG = "/etc/numafleet/guard.json"
DEFAULT_STATE = "/run/numafleet-guard/state.json"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "numafleet-guard"
TEXTFILE_NAME = "numafleet_guard.prom"
CONFIG_VERSION = 1
ACTS = ("reclaim", "throttle", "migrate")
PREFLIGHT_MODES = ("enforce", "warn", "off")
INTERVAL_RANGE = (1, 3600)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_SETTINGS = ("warn_pct", "act_pct", "act", "interval_s", "preflight", "textfile", "state_file")
_FIX = "run site.yml (the memory_guard role writes this file from the plan)"
# errno of a write into a cgroup that went away between the read and the write.
_GONE = (errno.ENOENT, errno.ENODEV, errno.ESRCH)

Writer = Callable[[str, str], None]


# --- config ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """A parsed guard.json (see the module docstring)."""

    path: str
    host: str
    thresholds: guard.Thresholds
    specs: tuple
    act: str
    interval_s: float
    preflight: str
    textfile: Optional[str]
    state_file: str
    raw: dict

    def summary(self) -> str:
        """One line: host, placements, thresholds, interval, preflight, textfile."""
        t = self.thresholds
        return (
            f"host {self.host}, {len(self.specs)} placement(s), warn {t.warn_pct:g}%, act "
            f"{t.act_pct:g}% ({self.act}), every {self.interval_s:g} s, preflight "
            f"{self.preflight}, textfile {self.textfile or 'none'}, state {self.state_file}"
        )


def _refuse(path: str, host: Optional[str], what: str) -> GuardError:
    where = f"{path} (host {host})" if host else path
    return GuardError(f"{where}: {what}")


def _abs_path(value, path, host, key, variable) -> str:
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or any(c in value for c in "\0\n\r")
        or "/../" in value + "/"
    ):
        _refuse_raise(
            path, host, f"settings.{key} is {value!r}, not an absolute path; set {variable}"
        )
    return value


def _refuse_raise(path, host, what) -> None:
    raise _refuse(path, host, f"{what} and {_FIX}")


def parse_config(data, path: str = DEFAULT_CONFIG) -> Config:
    """Config from the parsed JSON ``data``; raises GuardError naming the file, the host, the
    setting (its host variable) and the fix. Absent settings take their defaults."""
    if not isinstance(data, dict):
        raise _refuse(path, None, f"is a JSON {type(data).__name__}, not an object; {_FIX}")
    host = data.get("host")
    if not isinstance(host, str) or not host:
        raise _refuse(path, None, f"host is {host!r}, not a host name; {_FIX}")
    if data.get("version") != CONFIG_VERSION:
        raise _refuse(
            path,
            host,
            f"version is {data.get('version')!r}; this numafleet-guard reads version "
            f"{CONFIG_VERSION}; {_FIX} with the same collection release",
        )
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise _refuse(path, host, f"settings is {type(settings).__name__}, not a mapping; {_FIX}")
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise _refuse(
            path,
            host,
            f"unknown setting settings.{unknown[0]}; use {', '.join(_SETTINGS)} and {_FIX}",
        )
    act = settings.get("act", "reclaim")
    if act not in ACTS:
        _refuse_raise(
            path,
            host,
            f"settings.act is {act!r}; set numafleet_memory_act to one of {', '.join(ACTS)}",
        )
    thresholds_in = {"mode": act}
    for key in ("warn_pct", "act_pct"):
        if key in settings:
            thresholds_in[key] = settings[key]
    try:
        thresholds = guard.parse_thresholds(thresholds_in)
        specs = guard.parse_placements(data)
    except GuardError as exc:
        text = str(exc)
        raise _refuse(path, host, text if "run site.yml" in text else f"{text}; {_FIX}") from None
    interval = settings.get("interval_s", 15)
    low, high = INTERVAL_RANGE
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not low <= interval <= high
    ):
        _refuse_raise(
            path,
            host,
            f"settings.interval_s is {interval!r}; set numafleet_memory_guard_interval to "
            f"seconds from {low} to {high}",
        )
    preflight = settings.get("preflight", "warn")
    if preflight not in PREFLIGHT_MODES:
        _refuse_raise(
            path,
            host,
            f"settings.preflight is {preflight!r}; set numafleet_preflight to one of "
            f"{', '.join(PREFLIGHT_MODES)}",
        )
    textfile = settings.get("textfile")
    if textfile is not None:
        textfile = _abs_path(
            textfile, path, host, "textfile", "numafleet_memory_guard_textfile_dir"
        )
        if not textfile.endswith(".prom"):
            _refuse_raise(
                path,
                host,
                f"settings.textfile is {textfile!r}; node_exporter reads only *.prom files "
                f"(<dir>/{TEXTFILE_NAME}); set numafleet_memory_guard_textfile_dir",
            )
    state_file = _abs_path(
        settings.get("state_file", DEFAULT_STATE),
        path,
        host,
        "state_file",
        "the guard's state file",
    )
    return Config(
        path, host, thresholds, specs, act, float(interval), preflight, textfile, state_file, data
    )


def read_config_json(path: str):
    """The parsed JSON of ``path``; raises GuardError naming the file and the fix."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise GuardError(
            f"{path}: {exc.strerror or 'cannot be read'}; {_FIX} (numafleet_memory_guard or "
            "numafleet_preflight enabled), or pass --config"
        ) from None
    except UnicodeDecodeError:
        raise GuardError(f"{path}: not UTF-8 text; {_FIX}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise GuardError(f"{path}: not JSON ({exc}); {_FIX}") from None


def load_config(path: str) -> Config:
    """parse_config of the file at ``path``; raises GuardError."""
    return parse_config(read_config_json(path), path)


def _config_stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


# --- journal ---------------------------------------------------------------------------------


def encode_journal(fields: dict) -> bytes:
    """One journal native-protocol datagram of ``fields`` (KEY=value lines; a value holding a
    newline as KEY, newline, its length as 64-bit little endian, the value, newline)."""
    out = bytearray()
    for key, value in fields.items():
        name = key.encode("ascii")
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        if b"\n" in data:
            out += name + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name + b"=" + data + b"\n"
    return bytes(out)


class Journal:
    """Sends records (dicts of journal fields) to the journal, or one line each to ``stream``
    when its socket is absent or refuses them. ``records`` keeps the last ones sent (tests)."""

    def __init__(self, socket_path: Optional[str] = JOURNAL_SOCKET, stream=None) -> None:
        self.socket_path = socket_path
        self.stream = stream
        self._sock = None

    def _stream(self):
        return self.stream if self.stream is not None else sys.stderr

    def send(self, fields: dict) -> None:
        """Send one record; ``SYSLOG_IDENTIFIER`` is added; never raises for a logging failure."""
        record = {"SYSLOG_IDENTIFIER": IDENTIFIER}
        record.update(fields)
        if self.socket_path and os.path.exists(self.socket_path):
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.sendto(encode_journal(record), self.socket_path)
                return
            except OSError:
                pass  # too large, or journald restarting: the line below still gets out
        try:
            message = str(record.get("MESSAGE", "")).replace("\n", " ")
            self._stream().write(f"<{record.get('PRIORITY', '6')}>{message}\n")
            self._stream().flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class ListJournal:
    """A journal sink that keeps the records in ``records`` (for tests and ``once``)."""

    def __init__(self) -> None:
        self.records: list = []

    def send(self, fields: dict) -> None:
        record = {"SYSLOG_IDENTIFIER": IDENTIFIER}
        record.update(fields)
        self.records.append(record)

    def close(self) -> None:
        pass


def _message(text: str, priority: int, **extra) -> dict:
    fields = {"MESSAGE": f"{IDENTIFIER}: {text}", "PRIORITY": str(priority)}
    fields.update({f"NUMAFLEET_{k.upper()}": str(v) for k, v in extra.items()})
    return fields


# --- files -----------------------------------------------------------------------------------


def write_file(path: str, text: str) -> None:
    """Write ``text`` to an existing file in one write(2) (cgroup files: no create, no
    temporary file); raises OSError."""
    data = text.encode("ascii")
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same directory (a name
    node_exporter skips), then rename; the directory is created when absent. Raises OSError."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".numafleet-guard.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def lock(state_file: str) -> Optional[int]:
    """An exclusive flock(2) on ``<state_file>.lock`` (its directory created when absent): the
    descriptor, held until the process ends; None when another numafleet-guard holds it (two
    guards would each write the state and lose the other's throttles). Raises OSError."""
    path = f"{state_file}.lock"
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _default_migrate(cgroup_dir: str, from_nodes: list, to_nodes: list):
    migrate = importlib.import_module(".guard_migrate", __package__)
    return migrate.migrate_cgroup(cgroup_dir, from_nodes, to_nodes)


@dataclass
class Host:
    """What the program touches on the host; tests pass tmp trees and fakes of the outside."""

    sysfs_root: str = "/sys"
    cgroup_root: str = "/sys/fs/cgroup"
    procfs_root: str = "/proc"
    read: guard.Reader = guard.read_path
    write: Writer = write_file
    write_atomic: Callable[[str, str], None] = write_atomic
    migrate: Callable = _default_migrate
    journal: object = None
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.journal is None:
            self.journal = Journal()


# --- state -----------------------------------------------------------------------------------


@dataclass
class Saved:
    """What the program carries between rounds and restarts (the state file)."""

    state: guard.GuardState = dataclasses.field(default_factory=guard.GuardState)
    spilled: dict = dataclasses.field(default_factory=dict)
    throttle_written: dict = dataclasses.field(default_factory=dict)
    last_run: Optional[float] = None

    def as_dict(self) -> dict:
        out = self.state.as_dict()
        out["spilled"] = {k: dict(v) for k, v in sorted(self.spilled.items())}
        out["throttle_written"] = dict(sorted(self.throttle_written.items()))
        out["last_run"] = self.last_run
        return out


def parse_saved(data) -> Saved:
    """Saved from the state file's JSON; raises GuardError (the caller starts afresh)."""
    state = guard.parse_state(data)
    try:
        spilled = guard.parse_spilled(data["spilled"]) if data.get("spilled") else {}
        written = {str(k): int(v) for k, v in data.get("throttle_written", {}).items()}
        last = data.get("last_run")
        last = None if last is None else float(last)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GuardError(
            f"the guard's saved state does not parse ({type(exc).__name__}: {exc}); it is "
            "discarded and the guard starts afresh"
        ) from None
    return Saved(state, spilled, written, last)


def load_saved(path: str, journal) -> Saved:
    """The saved state at ``path``; absent: a fresh one; bad: a fresh one and a warning."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return Saved()
    except (OSError, UnicodeDecodeError) as exc:
        why = f"cannot be read ({exc}); the guard starts afresh"
    else:
        try:
            return parse_saved(json.loads(text))
        except GuardError as exc:
            why = str(exc)
        except ValueError as exc:
            why = f"not JSON ({exc}); the guard starts afresh"
    journal.send(_message(f"{path}: {why}", 4, path=path))
    return Saved()


# --- applying --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """What became of one action: result ok | partial | failed | skipped | gone."""

    action: guard.Action
    result: str
    detail: str = ""
    current_after: Optional[int] = None
    reapply: bool = False  # a throttle written again, not one of decide's actions

    @property
    def took_effect(self) -> bool:
        return self.result in ("ok", "partial")

    def as_dict(self) -> dict:
        """The action's fields (guard.Action.as_dict) with result, detail and current_after."""
        out = self.action.as_dict()
        out.update(result=self.result, detail=self.detail, current_after=self.current_after)
        return out

    def journal_fields(self) -> dict:
        fields = self.action.journal_fields()
        a = self.action
        if self.result == "failed":
            fields["MESSAGE"] = (
                f"{IDENTIFIER}: {a.action} {a.placement} on node {a.node} FAILED: {self.detail}"
            )
            fields["PRIORITY"] = "3"
        elif self.result in ("skipped", "gone"):
            fields["MESSAGE"] = (
                f"{IDENTIFIER}: {a.action} {a.placement} on node {a.node} not done: {self.detail}"
            )
            fields["PRIORITY"] = "4" if self.result == "skipped" else "6"
        elif self.detail:
            fields["MESSAGE"] += f"; {self.detail}"
        fields["NUMAFLEET_RESULT"] = self.result
        if self.detail:
            fields["NUMAFLEET_DETAIL"] = self.detail
        if self.current_after is not None:
            fields["NUMAFLEET_CURRENT_AFTER_BYTES"] = str(self.current_after)
        return fields


def _error_text(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else "error"
    return f"{exc.strerror or exc} ({name})"


def _read_bytes(host: Host, path: str) -> Optional[int]:
    try:
        text = host.read(path)
        return None if text is None else guard.parse_limit(text)
    except (GuardError, ValueError):
        return None


def _page_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) or 4096
    except (OSError, ValueError):
        return 4096


# The kernel keeps memory.high in pages: it reads back rounded down to the page size.
PAGE_BYTES = _page_bytes()


def holds_written(text: Optional[str], written: int, page_bytes: int = PAGE_BYTES) -> bool:
    """Whether a memory.high text is the value the guard wrote, as the kernel keeps it (in whole
    pages: 1479574732 written reads back as 1479573504 with 4 KiB pages)."""
    try:
        value = guard.parse_limit(text or "")
    except (GuardError, ValueError):
        return False
    return value is not None and value in (written, written - written % page_bytes)


def apply_action(action: guard.Action, host: Host, written: Optional[int]) -> Applied:
    """Make the write of one action (see the module docstring); never raises for a write."""
    path = f"{host.cgroup_root}/{action.path}"
    if (
        action.action == "release"
        and written is not None
        and not holds_written(action.before, written)
    ):
        return Applied(
            action,
            "skipped",
            f"memory.high is {action.before}, not the {written} the guard wrote (systemd or "
            "someone changed it); left as it is",
        )
    if action.action == "migrate":
        return _apply_migrate(action, host, path)
    try:
        host.write(path, action.value + "\n")
    except OSError as exc:
        if action.action == "reclaim" and exc.errno == errno.EAGAIN:
            after = _read_bytes(host, path.rsplit("/", 1)[0] + "/memory.current")
            return Applied(
                action,
                "partial",
                f"the kernel reclaimed less than {action.value} bytes (EAGAIN); memory.current "
                f"is {after} bytes after",
                after,
            )
        if exc.errno in _GONE:
            return Applied(action, "gone", f"{path}: the cgroup is gone (unit stopped)")
        return Applied(action, "failed", f"{path}: {_error_text(exc)}")
    if action.action == "reclaim":
        after = _read_bytes(host, path.rsplit("/", 1)[0] + "/memory.current")
        return Applied(action, "ok", f"memory.current is {after} bytes after", after)
    return Applied(action, "ok")


def _apply_migrate(action: guard.Action, host: Host, path: str) -> Applied:
    try:
        target = int(action.value)
        result = host.migrate(path, [action.node], [target])
    except (OSError, GuardError, ValueError, ImportError) as exc:
        return Applied(action, "failed", f"{path}: migrate_pages: {exc}")
    pids, errors = tuple(result.pids), tuple(result.errors)
    if not pids:
        return Applied(action, "skipped", f"{path}/cgroup.procs lists no process")
    problems = "; ".join(f"pid {pid}: {message}" for pid, message in errors)
    if len(errors) >= len(pids):
        return Applied(action, "failed", problems)
    detail = f"{len(pids) - len(errors)} process(es) moved from node {action.node} to node {target}"
    if result.not_moved_pages:
        detail += f", {result.not_moved_pages} page(s) not moved"
    if errors:
        detail += f"; failed: {problems}"
    return Applied(action, "partial" if errors or result.not_moved_pages else "ok", detail)


def _reapplies(round_: guard.Round, state: guard.GuardState, written: dict, acted: set) -> list:
    """Throttles the guard holds whose memory.high was put back looser (systemd reload)."""
    held = dict(state.throttled)
    out = []
    for memory in round_.placements:
        value = written.get(memory.name)
        if memory.name not in held or value is None or memory.name in acted:
            continue
        if not memory.running or (memory.high_bytes is not None and memory.high_bytes <= value):
            continue
        before = "max" if memory.high_bytes is None else str(memory.high_bytes)
        out.append(
            guard.Action(
                held[memory.name][0],
                "throttle",
                memory.name,
                f"{memory.cgroup}/memory.high",
                str(value),
                0,
                before,
                f"memory.high is {before}, not the {value} the guard holds (systemd re-applied "
                "the unit's MemoryHigh=, e.g. at daemon-reload): written again",
            )
        )
    return out


def _bump(table: dict, key, by: int) -> None:
    table[key] = table.get(key, 0) + by
    if table[key] <= 0:
        del table[key]


def settle(
    previous: guard.GuardState, decided: guard.GuardState, applied: list, written: dict
) -> tuple:
    """(GuardState, throttle_written) after the writes: failed or skipped actions leave
    actions_total, failed ones count in failures_total, a throttle that never took effect is
    not held, a failed release is held again (it is retried next round)."""
    totals = dict(decided.actions_total)
    failures = dict(previous.failures_total)
    throttled = dict(decided.throttled)
    written = dict(written)
    was_held = dict(previous.throttled)
    for item in applied:
        a = item.action
        key = (a.node, a.action, a.placement)
        if item.reapply:  # decide did not count it; the value written stays the same
            if item.took_effect:
                _bump(totals, key, 1)
            elif item.result == "failed":
                _bump(failures, key, 1)
            continue
        if item.took_effect:
            if a.action == "throttle":
                written[a.placement] = int(a.value)
            elif a.action == "release":
                written.pop(a.placement, None)
            continue
        _bump(totals, key, -1)
        if item.result == "failed":
            _bump(failures, key, 1)
        if a.action == "throttle" and a.placement not in was_held:
            throttled.pop(a.placement, None)
        elif a.action == "release":
            if item.result == "failed":
                throttled[a.placement] = (a.node, guard.parse_limit(a.value))
            else:
                written.pop(a.placement, None)
    written = {k: v for k, v in written.items() if k in throttled}
    state = dataclasses.replace(
        decided,
        throttled=tuple(sorted(throttled.items())),
        actions_total=tuple(sorted(totals.items())),
        failures_total=tuple(sorted(failures.items())),
    )
    return state, written


# --- spills (guard.record_spill, guard.clear_spills and guard.parse_spilled: the core's) -----


def _clear_spills(spilled: dict, round_: guard.Round, config: Config) -> tuple:
    """(spilled, names whose spill ended this round)."""
    if not spilled:
        return spilled, ()
    kept = guard.clear_spills(
        spilled, round_.nodes, round_.placements, config.thresholds, config.specs
    )
    return kept, tuple(sorted(set(spilled) - set(kept)))


# --- one round -------------------------------------------------------------------------------


def reclaim_available(cgroup_root: str, specs: tuple) -> bool:
    """memory.reclaim exists (Linux >= 5.19): at the cgroup root or in a placement's cgroup."""
    if os.path.exists(f"{cgroup_root}/memory.reclaim"):
        return True
    seen_cgroup = False
    for spec in specs:
        base = f"{cgroup_root}/{spec.cgroup}"
        if os.path.exists(f"{base}/memory.reclaim"):
            return True
        seen_cgroup = seen_cgroup or os.path.isdir(base)
    return not seen_cgroup


def swap_free_kb(read: guard.Reader, procfs_root: str) -> Optional[int]:
    """SwapFree of ``<procfs_root>/meminfo`` in kB; None when the file or the line is missing."""
    text = read(f"{procfs_root}/meminfo")
    for line in (text or "").splitlines():
        key, dummy, value = line.partition(":")
        if key == "SwapFree":
            fields = value.split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


def reclaim_blocker(host: Host, specs: tuple) -> str:
    """Why memory.reclaim cannot lower a node's used ratio on this host, or "" when it can.

    The used ratio leaves file pages out (MemTotal - MemFree - file LRU), so what reclaim can
    lower it by is anonymous memory, and the kernel reclaims that only into swap: with no free
    swap (``SwapFree: 0 kB`` in /proc/meminfo: no swap, or all of it in use) a write to
    memory.reclaim ends in EAGAIN having freed nothing that counts. The guard then throttles.
    """
    if not reclaim_available(host.cgroup_root, specs):
        return "this kernel has no memory.reclaim (Linux before 5.19)"
    if swap_free_kb(host.read, host.procfs_root) == 0:
        return (
            "no free swap (SwapFree 0 kB in /proc/meminfo): the kernel cannot reclaim anonymous "
            "memory, and file pages do not count as used"
        )
    return ""


@dataclass(frozen=True)
class Outcome:
    """One applied round: the core's Round, the writes and the state carried on."""

    round: guard.Round
    applied: tuple
    saved: Saved
    textfile: str
    spills_cleared: tuple

    def as_dict(self, specs: tuple) -> dict:
        report = self.round.as_dict(specs)
        report["state"] = self.saved.state.as_dict()
        report["applied"] = [item.as_dict() for item in self.applied]
        report["spilled"] = {k: dict(v) for k, v in sorted(self.saved.spilled.items())}
        report["spills_cleared"] = list(self.spills_cleared)
        report["throttle_written"] = dict(sorted(self.saved.throttle_written.items()))
        report["last_run"] = self.saved.last_run
        return report


def apply_round(config: Config, saved: Saved, host: Host) -> Outcome:
    """Read, decide, write the actions, render the textfile; pure of files other than the
    actions' (the caller writes the state and textfile). Raises GuardError from reading."""
    now = host.clock()
    blocked = reclaim_blocker(host, config.specs) if config.thresholds.mode != "throttle" else ""
    round_ = guard.run_round(
        host.read,
        config.specs,
        saved.state,
        config.thresholds,
        now,
        sysfs_root=host.sysfs_root,
        cgroup_root=host.cgroup_root,
        reclaim_available=not blocked,
        reclaim_blocked=blocked,
    )
    applied = []
    for action in round_.decision.actions:
        applied.append(apply_action(action, host, saved.throttle_written.get(action.placement)))
    acted = {a.placement for a in round_.decision.actions}
    for action in _reapplies(round_, round_.decision.state, saved.throttle_written, acted):
        applied.append(dataclasses.replace(apply_action(action, host, None), reapply=True))
    state, written = settle(saved.state, round_.decision.state, applied, saved.throttle_written)
    spilled = dict(saved.spilled)
    for item in applied:
        if item.action.action == "migrate" and item.took_effect:
            spilled = guard.record_spill(spilled, item.action, now)
    spilled, cleared = _clear_spills(spilled, round_, config)
    text = guard.as_textfile(round_.nodes, round_.placements, config.specs, state, now)
    return Outcome(
        round_, tuple(applied), Saved(state, spilled, written, now), text, tuple(cleared)
    )


class Program:
    """The guard between rounds: config (reloaded on change), saved state, journal."""

    def __init__(self, config: Config, host: Host) -> None:
        self.config = config
        self.host = host
        self.journal = host.journal
        self.saved = load_saved(config.state_file, self.journal)
        self._stamp = _config_stamp(config.path)
        self._warnings: set = set()

    def maybe_reload(self) -> bool:
        """Re-read the config when its mtime, size or inode changed; True when it was replaced.
        A bad new config is logged (once per change) and the old one kept."""
        stamp = _config_stamp(self.config.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            config = load_config(self.config.path)
        except GuardError as exc:
            self.journal.send(_message(f"config not reloaded, the old one stays: {exc}", 3))
            return False
        if config.state_file != self.config.state_file:
            self.saved = load_saved(config.state_file, self.journal)
        self.config = config
        self.journal.send(_message(f"config reloaded from {config.path}: {config.summary()}", 5))
        return True

    def round(self) -> Outcome:
        """One applied round; logs it, writes the textfile and the state. Raises GuardError
        from reading (the loop logs it)."""
        outcome = apply_round(self.config, self.saved, self.host)
        self.saved = outcome.saved
        for event in outcome.round.decision.events:
            self.journal.send(event.journal_fields())
        for item in outcome.applied:
            self.journal.send(item.journal_fields())
        for name in outcome.spills_cleared:
            self.journal.send(
                _message(
                    f"{name} is no longer spilled (its node has room again)", 5, placement=name
                )
            )
        warnings = {(w["path"], w["reason"]) for w in outcome.round.warnings}
        for path, reason in sorted(warnings - self._warnings):
            self.journal.send(_message(f"{path}: {reason}", 4, path=path))
        self._warnings = warnings
        if self.config.textfile:
            try:
                self.host.write_atomic(self.config.textfile, outcome.textfile)
            except OSError as exc:
                self.journal.send(
                    _message(f"textfile {self.config.textfile}: {_error_text(exc)}", 3)
                )
        try:
            self.host.write_atomic(
                self.config.state_file,
                json.dumps(self.saved.as_dict(), indent=1, sort_keys=True) + "\n",
            )
        except OSError as exc:
            self.journal.send(
                _message(f"state file {self.config.state_file}: {_error_text(exc)}", 3)
            )
        return outcome

    def safe_round(self) -> Optional[Outcome]:
        """round(), with a failure logged instead of raised (the loop goes on)."""
        try:
            return self.round()
        except GuardError as exc:
            self.journal.send(_message(f"round failed: {exc}", 3))
        except Exception as exc:  # one bad round must not end the guard
            self.journal.send(_message(f"round failed: {type(exc).__name__}: {exc}", 3))
        return None


def run_loop(program: Program, stop: threading.Event, once: bool = False) -> int:
    """Rounds on a monotonic schedule (start + k * interval; a late round skips the missed
    slots rather than bursting) until ``stop`` is set."""
    host = program.host
    program.journal.send(_message(f"started: {program.config.summary()}", 6))
    next_at = host.monotonic()
    while not stop.is_set():
        program.maybe_reload()
        program.safe_round()
        if once:
            break
        interval = program.config.interval_s
        next_at += interval
        now = host.monotonic()
        if next_at <= now:
            next_at += ((now - next_at) // interval + 1) * interval
        stop.wait(next_at - now)
    return EXIT_OK


# --- command line ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors: exit 2 with the usage, no traceback
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=IDENTIFIER, description="numafleet.tuning's NUMA memory guard")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def common(p) -> None:
        p.add_argument("--config", default=DEFAULT_CONFIG, help="guard.json (%(default)s)")
        p.add_argument("--sysfs-root", default="/sys", help="sysfs to read (%(default)s)")
        p.add_argument(
            "--cgroup-root", default="/sys/fs/cgroup", help="cgroup v2 root (%(default)s)"
        )
        p.add_argument("--procfs-root", default="/proc", help="procfs to read (%(default)s)")
        p.add_argument(
            "--journal-socket",
            default=JOURNAL_SOCKET,
            help="journal socket (%(default)s); absent or empty: one line per record on stderr",
        )

    run = sub.add_parser("run", help="guard rounds until SIGTERM (the service)")
    common(run)
    run.add_argument("--once", action="store_true", help="one round, then exit")
    once = sub.add_parser("once", help="one round, applied; --json prints the report")
    common(once)
    once.add_argument("--json", action="store_true", help="print the round's report as JSON")
    check = sub.add_parser("check-config", help="validate the config")
    check.add_argument("--config", default=DEFAULT_CONFIG)
    sub.add_parser("preflight", help="a unit's start-up check", add_help=False)
    return parser


def _preflight(rest: list, err) -> int:
    """``guard_preflight.main(args, None)``: it parses its own words (``--mode``, ``--config``,
    the placement) and reads the config they name."""
    try:
        preflight = importlib.import_module(".guard_preflight", __package__)
    except ImportError as exc:
        err.write(
            f"{IDENTIFIER} preflight: not installed with this program ({exc}); run site.yml "
            "(the memory_guard role installs it)\n"
        )
        return EXIT_USAGE
    return preflight.main(rest, None)


def _host(args, journal) -> Host:
    return Host(
        sysfs_root=args.sysfs_root,
        cgroup_root=args.cgroup_root,
        procfs_root=args.procfs_root,
        journal=journal,
    )


def main(argv: Optional[list] = None, host: Optional[Host] = None, stop=None, out=None) -> int:
    """The command line (see the module docstring); returns the exit code.

    host: the Host to use (tests; default: the real one with the --*-root options); stop: a
    threading.Event that ends ``run`` (default: one set by SIGTERM and SIGINT); out: where
    reports go (default stdout)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = out if out is not None else sys.stdout
    if argv[:1] == ["preflight"]:
        return _preflight(argv[1:], sys.stderr)
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except GuardError as exc:
        sys.stderr.write(f"{IDENTIFIER}: {exc}\n")
        return EXIT_USAGE
    if args.command == "check-config":
        out.write(f"{IDENTIFIER}: {config.path} is valid: {config.summary()}\n")
        return EXIT_OK
    try:
        held = lock(config.state_file)
    except OSError as exc:
        sys.stderr.write(f"{IDENTIFIER}: {config.state_file}.lock: {_error_text(exc)}\n")
        return EXIT_FAILED
    if held is None:
        sys.stderr.write(
            f"{IDENTIFIER}: another numafleet-guard (numafleet-guard.service?) holds "
            f"{config.state_file}.lock; its last round is in {config.state_file} and the "
            "journal (journalctl -t numafleet-guard)\n"
        )
        return EXIT_FAILED
    if host is None:
        host = _host(args, Journal(args.journal_socket or None))
    program = Program(config, host)
    try:
        if args.command == "once":
            outcome = program.round()
            if args.json:
                out.write(json.dumps(outcome.as_dict(program.config.specs), indent=2) + "\n")
            else:
                out.write(_summary(outcome))
            return EXIT_OK
        if stop is None:
            stop = threading.Event()
            received = []

            def handler(signum, frame):
                received.append(signal.Signals(signum).name)
                stop.set()

            signal.signal(signal.SIGTERM, handler)
            signal.signal(signal.SIGINT, handler)
        else:
            received = []
        code = run_loop(program, stop, once=args.once)
        why = f" on {received[0]}" if received else ""
        program.journal.send(_message(f"stopped{why}", 6))
        return code
    except GuardError as exc:
        sys.stderr.write(f"{IDENTIFIER}: {exc}\n")
        return EXIT_FAILED
    finally:
        host.journal.close()
        os.close(held)


def _summary(outcome: Outcome) -> str:
    lines = []
    levels = dict(outcome.saved.state.levels)
    for node in outcome.round.nodes:
        if node.used_ratio is not None:
            lines.append(
                f"node {node.id}: {node.used_ratio:.1%} used ({levels.get(node.id, 'ok')})"
            )
    for item in outcome.applied:
        a = item.action
        lines.append(f"{a.action} {a.placement} on node {a.node}: {item.result} {item.detail}")
    for warning in outcome.round.warnings:
        lines.append(f"warning: {warning['path']}: {warning['reason']}")
    return "".join(line.rstrip() + "\n" for line in lines)
