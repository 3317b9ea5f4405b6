# Private to this collection: may change in any release.
"""systemd files of a placement plan: pinned services, drop-ins, tenant slices, and the manifest.

``render_files`` turns the plan (``numafleet_plan``, see planner.py) into ``{path: text}``, paths as
on the host. ``plan_changes`` compares that with what is on disk and with the manifest of the
files written last time; ``write_files`` applies the changes under a root. Values are escaped for
systemd (specifiers ``%``, variables ``$``, quotes, backslashes); any control character is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import stat
import unicodedata
from dataclasses import dataclass
from typing import Optional

from . import files, limits, partition, priority
from .cpulist import format_cpulist
from .errors import UnitFileError, UnitRenderError

DEFAULT_HEADER = "# Managed by numafleet.tuning"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_MANIFEST_PATH = "/etc/numafleet/manifest.json"
# The plan applied last, read back by numa_facts (recorded_root) so the next plan keeps it.
DEFAULT_PLAN_PATH = "/etc/numafleet/plan.json"
# Plan keys not recorded: they describe this run, not the placements (a second run would
# otherwise always rewrite the file).
_UNRECORDED_PLAN_KEYS = ("stability", "warnings")
# Keys of a placement entry not recorded: notes about this run's facts (plan_record_text).
_UNRECORDED_ENTRY_KEYS = ("warnings",)
DROPIN_NAME = "50-numafleet.conf"
DEFAULT_SLICE = "numafleet.slice"
# numafleet-guard (role numafleet.tuning.memory_guard): its preflight runs as ExecStartPre= of
# every pinned unit. enforce: a failed check stops the start; warn: "-", so neither a failed check
# nor a missing program stops the service; off: no line.
GUARD_PROGRAM = "/usr/local/sbin/numafleet-guard"
PREFLIGHT_MODES = ("enforce", "warn", "off")
DEFAULT_PREFLIGHT = "warn"
_PREFLIGHT_LINE = re.compile(r"^ExecStartPre=-?" + re.escape(GUARD_PROGRAM) + r" preflight ")
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_.:@-]+\Z")
MANIFEST_VERSION = 2
PLAN_VERSION = 1
FILE_MODE = 0o644
DIR_MODE = 0o755
# `systemctl disable --now` waits for the unit to stop (TimeoutStopSec= defaults to 90 s).
STOP_TIMEOUT_S = 300
_KILL_AFTER_S = 10

# Hardening of numafleet services. Never PrivateDevices=: the GPUs live in /dev.
HARDENING = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "full"),
    ("ProtectHome", "read-only"),
    ("PrivateTmp", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectControlGroups", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("RestrictRealtime", "yes"),
)

_REPLAN = (
    "pass the numafleet_plan fact made by numafleet.tuning.numa_plan as it is, "
    "and fix the host_vars it was planned from"
)
# Characters systemd-escape keeps as they are (src/basic/unit-name.c VALID_CHARS, less "-" and "\").
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_.")
_UNIT_PREFIX = r"[A-Za-z0-9:_.\\-]+"
_UNIT_NAME = re.compile(rf"^{_UNIT_PREFIX}(@[A-Za-z0-9:_.\\-]*)?\.(service|slice)\Z")
_INSTANCE = re.compile(r"^[A-Za-z0-9:_.-]+\Z")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# ExecStart= prefixes systemd reads from the first word, even when it is quoted.
_EXEC_PREFIXES = "-@:+!|"
# Refused by systemd in the program path (string_is_safe), or not expanded there ($).
_PROGRAM_SPECIAL = "\\\"'$"
_UNIT_NAME_MAX = 255


# --- escaping ----------------------------------------------------------------------------------
#
# One function per unit-file context. Each returns text that systemd parses back to exactly the
# value given (systemd.syntax(7), systemd.unit(5) SPECIFIERS, systemd.service(5) COMMAND LINES),
# or raises UnitRenderError naming the value and the fix. tests/unit/systemd_syntax.py is the
# reader the round-trip tests use.
#
#   context                          function            systemd reads it as
#   free text (Description=), paths  escape_specifiers   %-specifiers only
#     only expanded for specifiers
#   Environment=                     quote_environment   quoted words, C escapes, then specifiers
#   ExecStart= argument              quote_exec_arg      specifiers, quoted words, C escapes, $
#   ExecStart= program               program_path        as above, but no quotes/escapes/$ taken
#   path settings                    escape_path         specifiers; absolute, normalised
#   User=/Group=                     account_name        specifiers; systemd's user name rules
#   unit and slice names             check_unit_name,    unit_name_is_valid()
#                                    slice_name
#   OnCalendar=, time spans          calendar_value,     parsed by systemd-analyze calendar/
#                                    timespan_value      timespan syntax; no quoting at all
#
# Rules every context shares (check_text, check_line): no control character (Unicode Cc, which
# includes TAB, LF, CR and NEL U+0085), no line or paragraph separator (U+2028, U+2029), no
# surrogate and no Unicode noncharacter (systemd drops such a line as "not UTF-8 clean"); a value
# written unquoted may not start or end with whitespace (systemd trims it) nor end in a backslash
# (systemd joins the next line to it); no line over LONG_LINE_MAX bytes.

# systemd's WHITESPACE: trimmed around keys and values, and separating words.
WHITESPACE = " \t\n\r"
# read_line() refuses longer lines (systemd's LONG_LINE_MAX, 1 MiB).
LONG_LINE_MAX = 1024 * 1024
# Linux PATH_MAX (a path is shorter) and NAME_MAX (per component), as systemd's path_is_valid().
PATH_MAX = 4096
NAME_MAX = 255
_ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?\Z")
_ACCOUNT_MAX = 31  # systemd's strict rule: UT_NAMESIZE - 1
_CALENDAR = re.compile(r"[A-Za-z0-9 :*,./~_+@-]+\Z")
_TIMESPAN = re.compile(r"[0-9][A-Za-z0-9 .]*\Z|infinity\Z")


_KINDS = {
    "Cc": "control character",
    "Cs": "surrogate",
    "Zl": "line separator",
    "Zp": "paragraph separator",
}


def _bad_char(char: str) -> bool:
    code = ord(char)
    return (
        unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp")
        or 0xFDD0 <= code <= 0xFDEF
        or (code & 0xFFFE) == 0xFFFE
    )


def check_text(value: str, what: str) -> str:
    """``value`` unchanged; raises UnitRenderError naming ``what`` on a character units cannot hold.

    Refused: control characters (Unicode Cc: TAB, LF, CR, NEL U+0085 ...), line and paragraph
    separators (U+2028, U+2029), surrogates and noncharacters (U+FDD0-U+FDEF, U+xFFFE, U+xFFFF).
    """
    if not isinstance(value, str):
        raise UnitRenderError(f"{what}: {value!r} is not a string; {_REPLAN}")
    for char in value:
        if _bad_char(char):
            kind = _KINDS.get(unicodedata.category(char), "noncharacter")
            raise UnitRenderError(
                f"{what}: {value!r} holds the {kind} U+{ord(char):04X}, which a systemd unit "
                "file cannot carry (control characters, line or paragraph separators and "
                "noncharacters): remove it from the host_vars (newlines and tabs included)"
            )
    return value


def check_line(value: str, what: str) -> str:
    """``value`` unchanged when systemd reads it back as written on an unquoted line.

    Raises UnitRenderError on check_text's characters, on leading or trailing whitespace (systemd
    trims it), on a trailing backslash (systemd joins the next line to it, which then loses its own
    setting) and on a value over LONG_LINE_MAX bytes.
    """
    check_text(value, what)
    if value != value.strip(WHITESPACE):
        raise UnitRenderError(
            f"{what}: {value!r} starts or ends with a space, which systemd trims off; remove it"
        )
    if value.endswith("\\"):
        raise UnitRenderError(
            f"{what}: {value!r} ends in a backslash, which systemd reads as a line continuation "
            "(the next setting of the unit would be lost); remove the backslash"
        )
    if len(value.encode("utf-8")) >= LONG_LINE_MAX - 64:
        raise UnitRenderError(
            f"{what}: the value is {len(value)} characters long; systemd reads unit lines of at "
            f"most {LONG_LINE_MAX} bytes: shorten it"
        )
    return value


def escape_specifiers(value: str, what: str) -> str:
    """A value of a setting that expands specifiers only (Description=, ConditionPathExists=...).

    ``%`` -> ``%%``; raises UnitRenderError as check_line does.
    """
    return check_line(value, what).replace("%", "%%")


def check_path(value: str, what: str, program: bool = False) -> str:
    """``value`` when systemd takes it as is for a path: absolute, normalised, within limits.

    Normalised means no ``.``/``..`` component, no ``//`` and no trailing ``/``; limits: under
    PATH_MAX bytes, components of at most NAME_MAX bytes. ``program``: the program of an
    ExecStart= line, which may also be a plain file name. Raises UnitRenderError.
    """
    check_text(value, what)
    kind = "program" if program else "path"
    example = "/opt/llm/bin/serve" if program else "/var/lib/numafleet"
    if not value.startswith("/") and not (program and value and "/" not in value):
        raise UnitRenderError(
            f"{what}: the {kind} {value!r} is not an absolute path; write e.g. {example}"
        )
    parts = value.split("/")[1:] if value.startswith("/") else [value]
    if (value != "/" or program) and (
        any(part in ("", ".", "..") for part in parts) or value.endswith("/")
    ):
        raise UnitRenderError(
            f"{what}: the {kind} {value!r} is not normalised (no '.', '..', '//' or trailing "
            f"'/'; systemd refuses or rewrites it); write it plainly, e.g. {example}"
        )
    size = len(value.encode("utf-8"))
    longest = max(len(part.encode("utf-8")) for part in parts)
    if size >= PATH_MAX or longest > NAME_MAX:
        raise UnitRenderError(
            f"{what}: the {kind} is {size} bytes long with a component of {longest}; systemd "
            f"takes paths under {PATH_MAX} bytes with components of at most {NAME_MAX}: "
            "shorten it (a symlink with a short path works)"
        )
    return value


def escape_path(value: str, what: str) -> str:
    """A path setting (WorkingDirectory=, Where=, ...): check_path, then escape_specifiers."""
    return escape_specifiers(check_path(value, what), what)


def quote_exec_arg(arg: str, what: str) -> str:
    """One ExecStart= word: double-quoted, ``\\``/``"`` escaped, ``%`` -> ``%%``, ``$`` -> ``$$``.

    Any string without check_text's characters round-trips (empty, spaces, quotes, a trailing
    backslash, ``;``). Raises UnitRenderError on those characters.
    """
    check_text(arg, what)
    body = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{body}"'


def program_path(program: str, what: str) -> str:
    """The program of an ExecStart= line (the first word), quoted like quote_exec_arg.

    An absolute normalised path (check_path) or a plain file name; raises UnitRenderError on a
    program starting with an ExecStart= prefix (one of - @ : + ! |) or holding a backslash, a
    quote or ``$``, which systemd does not take or not expand in the program path.
    """
    check_text(program, what)
    if not program or program[0] in _EXEC_PREFIXES or ("/" in program and program[0] != "/"):
        raise UnitRenderError(
            f"{what}: the program {program!r} must be an absolute path or a plain program "
            "name, not starting with one of - @ : + ! |; write e.g. /opt/llm/bin/serve"
        )
    special = sorted(set(program) & set(_PROGRAM_SPECIAL))
    if special:
        raise UnitRenderError(
            f"{what}: the program {program!r} holds {' '.join(special)}, which systemd "
            "does not take in the program path of ExecStart=; run it through a wrapper script "
            "or a symlink with a plain path"
        )
    check_path(program, what, program=True)
    return quote_exec_arg(program, what)


def exec_line(argv: list, what: str) -> str:
    """An ExecStart= value running ``argv`` (program_path, then quote_exec_arg per argument)."""
    if not isinstance(argv, (list, tuple)) or not argv:
        raise UnitRenderError(f"{what}: {argv!r} is not a non-empty list of strings; {_REPLAN}")
    words = [program_path(argv[0], what)]
    words.extend(quote_exec_arg(arg, what) for arg in argv[1:])
    return " ".join(words)


def quote_environment(key: str, value: str, what: str) -> str:
    """An Environment= assignment ``"K=V"`` with ``\\``/``"`` escaped and ``%`` -> ``%%``.

    ``$`` stays: systemd does not expand it in Environment=. Raises UnitRenderError on a key that
    is not a variable name, a value that is not a string, or check_text's characters.
    """
    if not isinstance(key, str) or not _ENV_KEY.match(key):
        raise UnitRenderError(
            f"{what}: {key!r} is not an environment variable name; use letters, digits and _, "
            "not starting with a digit"
        )
    if not isinstance(value, str):
        raise UnitRenderError(f"{what}.{key}: {value!r} is not a string; {_REPLAN}")
    check_text(value, f"{what}.{key}")
    body = f"{key}={value}".replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{body}"'


def account_name(value: str, what: str) -> str:
    """A User=/Group= value: a name of letters, digits, ``_ . -`` (not starting with a digit,
    ``.`` or ``-``; an optional final ``$``) of at most 31 characters, or a numeric id below
    4294967295 other than 65535. Raises UnitRenderError on anything else, which systemd refuses
    or reads as something else (``:``, ``/``, spaces, specifiers, control characters).
    """
    check_text(value, what)
    if value.isascii() and value.isdigit():
        if int(value) >= 0xFFFFFFFF or int(value) == 0xFFFF:
            raise UnitRenderError(
                f"{what}: {value} is not a user or group id systemd takes (65535 and "
                "4294967295 and above are reserved); give an account name or another id"
            )
        return value
    if not _ACCOUNT.match(value) or len(value) > _ACCOUNT_MAX:
        raise UnitRenderError(
            f"{what}: {value!r} is not a user or group name systemd takes; use the account's "
            f"name (letters, digits and _ . -, not starting with a digit, . or -, at most "
            f"{_ACCOUNT_MAX} characters) or its numeric id"
        )
    return value


def calendar_value(value: str, what: str) -> str:
    """An OnCalendar= value as written (letters, digits, spaces and ``:*,./~_+@-``).

    systemd-analyze calendar judges the syntax itself; this only keeps out what a unit line
    would change (quotes, backslashes, ``%``, control characters, outer spaces). Raises
    UnitRenderError.
    """
    if not isinstance(value, str) or not _CALENDAR.match(check_line(value, what)):
        raise UnitRenderError(
            f"{what}: {value!r} is not a calendar expression of letters, digits, spaces and "
            ":*,./~_+@- (no quotes, backslashes or %); write e.g. daily or *-*-* 03:00:00"
        )
    return value


def timespan_value(value, what: str) -> str:
    """A time span setting (RandomizedDelaySec=, TimeoutStartSec=) as written, e.g. ``15min``.

    A number, or a number followed by units and more numbers and units (digits, letters, spaces
    and ``.``), or ``infinity``. Raises UnitRenderError.
    """
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise UnitRenderError(f"{what}: {value!r} is not a time span; write e.g. 15min or 2h")
    check_line(text, what)
    if not _TIMESPAN.match(text):
        raise UnitRenderError(
            f"{what}: {text!r} is not a time span of digits, units and spaces; write e.g. "
            "15min, 2h 30min or infinity"
        )
    return text


def systemd_escape(text: str) -> str:
    """``text`` escaped like ``systemd-escape TEXT`` for one unit-name part, but ``/`` -> ``\\x2f``.

    Every byte outside ``[A-Za-z0-9:_.]`` (and a leading ``.``) becomes ``\\xNN``, so a ``-``
    cannot split a slice name into a hierarchy. Raises UnitRenderError on an empty string.
    """
    if not isinstance(text, str) or not text:
        raise UnitRenderError(
            f"cannot escape {text!r} for a unit name: it must be a non-empty string"
        )
    out = []
    for index, char in enumerate(text):
        if char in _PLAIN and not (index == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(out)


def slice_name(tenant: str) -> str:
    """The slice unit of a tenant, ``numafleet-<escaped tenant>.slice``; raises UnitRenderError.

    Refused: an empty name, and one whose escaped slice name is over 255 characters.
    """
    name = f"numafleet-{systemd_escape(tenant)}.slice"
    if len(name) > _UNIT_NAME_MAX:
        raise UnitRenderError(
            f"tenant {tenant!r}: its slice name {name} is {len(name)} characters long, over "
            f"systemd's {_UNIT_NAME_MAX}; give the tenant a shorter name"
        )
    return name


# --- plan access -------------------------------------------------------------------------------


def _get(obj: dict, key: str, kinds: tuple, where: str, required: bool = True):
    """obj[key] checked against ``kinds`` (None allowed when not required); raises UnitRenderError."""
    if not isinstance(obj, dict):
        raise UnitRenderError(f"{where} is not a mapping; {_REPLAN}")
    if key not in obj or (obj[key] is None and not required):
        if required:
            raise UnitRenderError(f"{where} has no {key!r}; {_REPLAN}")
        return None
    value = obj[key]
    wrong_bool = isinstance(value, bool) and bool not in kinds  # JSON true/false is no int
    if value is None or wrong_bool or not isinstance(value, kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise UnitRenderError(f"{where}.{key} is {value!r}, not a {names}; {_REPLAN}")
    return value


def _int_set(values: list, where: str) -> list[int]:
    if not isinstance(values, list) or not values:
        raise UnitRenderError(f"{where} is {values!r}, not a non-empty list of numbers; {_REPLAN}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UnitRenderError(f"{where} holds {value!r}, not a CPU or node number; {_REPLAN}")
    return sorted(set(values))


def check_unit_name(name: str, suffix: str, what: str) -> str:
    """``name`` when it is a valid systemd unit name ending in ``suffix``; raises UnitRenderError."""
    if (
        not isinstance(name, str)
        or not name.endswith(suffix)
        or len(name) > _UNIT_NAME_MAX
        or name.startswith(".")
        or not _UNIT_NAME.match(name)
    ):
        raise UnitRenderError(
            f"{what}: {name!r} is not a systemd {suffix} unit name; write it as systemctl "
            f"shows it, e.g. vllm{suffix}"
        )
    if suffix == ".slice":
        parts = name[: -len(suffix)].split("-")
        if "@" in name or not all(parts):
            raise UnitRenderError(
                f"{what}: {name!r} is not a valid slice name (dash-separated non-empty parts); "
                "make it with slice_name()"
            )
    return name


def check_host_path(option: str, value: str) -> str:
    """``value`` normalised when it is an absolute path; raises UnitRenderError naming ``option``."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise UnitRenderError(
            f"{option}: {value!r} is not an absolute path; give the path as on the host, "
            "e.g. /etc/systemd/system (use root for a render directory)"
        )
    check_text(value, option)
    return posixpath.normpath(value)


# --- rendering ---------------------------------------------------------------------------------


def header_lines(header: str) -> list[str]:
    """The lines of a unit header; raises UnitRenderError unless each is a # or ; comment."""
    if not isinstance(header, str):
        raise UnitRenderError(f"header: {header!r} is not a string of # comment lines")
    lines = header.rstrip("\n").split("\n") if header.strip() else []
    for line in lines:
        check_text(line, "header")
        if line.strip() and not line.lstrip().startswith(("#", ";")):
            raise UnitRenderError(
                f"header: line {line!r} is not a comment; start every line with # "
                '(e.g. header: "{{ ansible_managed | comment }}")'
            )
    return lines


def unit_document(header: list[str], sections: list[tuple[str, list[tuple[str, str]]]]) -> str:
    """A unit file: header lines, then each non-empty [section] with its key=value lines."""
    blocks = ["\n".join(header)] if header else []
    for name, entries in sections:
        for key, value in entries:
            # The last guard of every context: a value that systemd would trim, or that would
            # join the next line to its own, never reaches the file.
            check_line(value, f"[{name}] {key}=")
        if entries:
            blocks.append("\n".join([f"[{name}]"] + [f"{key}={value}" for key, value in entries]))
    return "\n\n".join(blocks) + "\n"


def boot_unit_text(
    header: str,
    description: str,
    after: str,
    before: str,
    argv: list,
    state_path: str,
) -> str:
    """A boot unit of a layer (numafleet-mig.service, numafleet-amd-partition.service): a oneshot
    wanted by multi-user.target that runs ``argv`` (interpreter, boot program at argv[1], state
    file) when ``state_path`` exists, After= ``after`` and Before= ``before`` (space-separated
    unit names). Raises UnitRenderError on a header line that is not a comment, or a path
    systemd would not read back as given (check_path: absolute, normalised, within limits)."""
    check_path(argv[1], "boot_program_path")
    unit = [
        ("Description", description),
        ("After", after),
        ("Before", before),
        ("ConditionPathExists", escape_path(state_path, "state_path")),
    ]
    service = [
        ("Type", "oneshot"),
        ("RemainAfterExit", "yes"),
        ("ExecStart", exec_line(argv, "boot_program_path")),
    ]
    return unit_document(
        header_lines(header),
        [("Unit", unit), ("Service", service), ("Install", [("WantedBy", "multi-user.target")])],
    )


def _mps_daemons(plan: dict) -> dict:
    """{pipe_dir: nvidia-mps@ unit, or None while the daemon's MIG instance does not exist yet}."""
    daemons = plan.get("mps_daemons") if isinstance(plan, dict) else None
    found: dict = {}
    for entry in daemons if isinstance(daemons, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("pipe_dir"), str):
            continue
        pending = entry.get("instance", entry.get("device_uuid")) is None
        unit = entry.get("unit")
        found[entry["pipe_dir"]] = None if pending else unit if isinstance(unit, str) else ""
    return found


def _mps_instance(placement: dict, where: str, daemons: Optional[dict] = None) -> Optional[str]:
    """The client's nvidia-mps@ unit; None without MPS or while its daemon is pending (MIG)."""
    mps = _get(placement, "mps", (dict,), where, required=False)
    if mps is None:
        return None
    pipe_dir = _get(mps, "pipe_dir", (str,), f"{where}.mps")
    planned = (daemons or {}).get(pipe_dir, "")
    if planned is None:
        return None  # the plan warns: the MIG instance is created first, then planned again
    if planned:
        return check_unit_name(planned, ".service", f"{where}.mps daemon unit")
    instance = posixpath.basename(pipe_dir.rstrip("/"))
    if not _INSTANCE.match(instance):
        raise UnitRenderError(
            f"{where}.mps.pipe_dir: {pipe_dir!r} does not end in a device UUID usable as the "
            f"nvidia-mps@ instance; {_REPLAN}"
        )
    return f"nvidia-mps@{instance}.service"


# Settings that systemd merges when they are assigned more than once (CPUAffinity= is documented
# so; the CPU and node sets of NUMAMask=, AllowedCPUs= and AllowedMemoryNodes= are parsed the same
# way): a drop-in first assigns the empty string, which resets what the vendor unit set, so the
# result is the plan's set and not a union with it.
_MERGED_SETS = ("CPUAffinity", "NUMAMask", "AllowedCPUs", "AllowedMemoryNodes")
# The devices a unit selected by render node may open (the plan's ``device_allow``): the KFD
# compute interface and DRM render nodes only.
_DEVICE_PATH = re.compile(r"^/dev/(kfd|dri/renderD[0-9]{1,6})\Z")


def _device_entries(placement: dict, where: str, dropin: bool) -> list:
    """[Service] entries of the plan entry's ``device_allow`` ([] without it).

    DevicePolicy=closed and one ``DeviceAllow=<path> rw`` per path: the unit's cgroup may open
    those devices (and the standard pseudo devices) only, so ROCm, which skips a GPU whose
    render node it may not open, sees exactly the planned GPUs. A drop-in first resets the
    vendor unit's DeviceAllow= list (an empty assignment), so a vendor-wide allowance cannot
    widen it; a later drop-in can still add devices the program needs (an RDMA adapter).
    """
    devices = placement.get("device_allow")
    if devices is None:
        return []
    if (
        not isinstance(devices, list)
        or not devices
        or not all(isinstance(path, str) and _DEVICE_PATH.match(path) for path in devices)
    ):
        raise UnitRenderError(
            f"{where}.device_allow is {devices!r}, not a list of /dev/kfd and "
            f"/dev/dri/renderD<N> paths; {_REPLAN}"
        )
    entries = [("DevicePolicy", "closed")]
    if dropin:
        entries.append(("DeviceAllow", ""))
    return entries + [("DeviceAllow", f"{path} rw") for path in devices]


# Re-creates the recorded MIG layout at boot (numafleet.tuning.nvidia_mig).
MIG_BOOT_UNIT = "numafleet-mig.service"


def _placement_entries(
    placement: dict, where: str, dropin: bool = False, daemons: Optional[dict] = None
) -> tuple[list, list]:
    """([Unit] entries for MPS, [Service] pinning entries) shared by services and drop-ins.

    MPS clients get Requires= and After= on their nvidia-mps@ daemon (numafleet.tuning.nvidia_mps
    runs it): the client starts only with its daemon, and is stopped and restarted with it, so it
    never runs outside MPS or against a daemon that has gone. A client whose daemon waits for its
    MIG instance gets neither (the plan carries a warning). Placements on a MIG instance start
    after numafleet-mig.service, which re-creates the instances at boot.
    """
    unit_entries = []
    gpus = placement.get("gpus") if isinstance(placement.get("gpus"), list) else []
    if any(isinstance(g, dict) and g.get("mig") for g in gpus):
        unit_entries.append(("After", MIG_BOOT_UNIT))
    daemon = _mps_instance(placement, where, daemons)
    if daemon:
        unit_entries += [("Requires", daemon), ("After", daemon)]
    slice_unit = check_unit_name(
        _get(placement, "slice", (str,), where), ".slice", f"{where}.slice"
    )
    cpus = format_cpulist(_int_set(_get(placement, "cpus", (list,), where), f"{where}.cpus"))
    mems = format_cpulist(_int_set(_get(placement, "mems", (list,), where), f"{where}.mems"))
    service = [
        ("Slice", slice_unit),
        ("CPUAffinity", cpus),
        ("NUMAPolicy", "bind"),
        ("NUMAMask", mems),
        ("AllowedCPUs", cpus),
        ("AllowedMemoryNodes", mems),
    ]
    if dropin:
        reset = []
        for key, value in service:
            if key in _MERGED_SETS:
                reset.append((key, ""))
            reset.append((key, value))
        service = reset
    environment = _get(placement, "environment", (dict,), where, required=False) or {}
    for key in sorted(environment, key=str):
        service.append(
            ("Environment", quote_environment(key, environment[key], f"{where}.environment"))
        )
    service.extend(_device_entries(placement, where, dropin))
    service.append(("LimitMEMLOCK", "infinity"))
    service.extend(limits.service_entries(placement, where))  # MemoryMax=, CPUWeight=...
    service.extend(priority.service_entries(placement, where))  # MemoryLow= of a high one
    return unit_entries, service


def _exec_start(placement: dict, where: str) -> str:
    argv = _get(placement, "argv", (list,), where)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise UnitRenderError(
            f"{where}.argv is {argv!r}, not a non-empty list of strings; {_REPLAN}"
        )
    return exec_line(argv, f"{where}.exec")


def preflight_entries(placement: dict, where: str, mode: str) -> list:
    """[("ExecStartPre", "...numafleet-guard preflight --mode <mode> <name>")] of a placement, or
    [] when ``mode`` is off. warn gets the "-" prefix: its exit status never fails the start (nor
    does a missing program). Raises UnitRenderError on a mode that is not in PREFLIGHT_MODES."""
    if mode not in PREFLIGHT_MODES:
        raise UnitRenderError(
            f"preflight is {mode!r}; use one of {', '.join(PREFLIGHT_MODES)} (numafleet_preflight)"
        )
    if mode == "off":
        return []
    name = _get(placement, "name", (str,), where)
    word = name if _PLAIN_WORD.match(name) else quote_exec_arg(name, f"{where}.name")
    prefix = "-" if mode == "warn" else ""
    return [("ExecStartPre", f"{prefix}{GUARD_PROGRAM} preflight --mode {mode} {word}")]


def preflight_only(before: Optional[str], after: Optional[str]) -> bool:
    """Whether two texts of a unit file differ only in numafleet-guard's ExecStartPre= line (the
    change matters at the unit's next start: nothing is restarted for it)."""
    if before is None or after is None or before == after:
        return False

    def rest(text: str) -> list:
        return [line for line in text.splitlines() if not _PREFLIGHT_LINE.match(line)]

    return rest(before) == rest(after)


def _render_service(
    placement: dict,
    where: str,
    header: list[str],
    hardening: bool,
    daemons: dict,
    preflight: str = "off",
) -> str:
    name = _get(placement, "name", (str,), where)
    description = _get(placement, "description", (str,), where, required=False)
    unit_entries, pinning = _placement_entries(placement, where, daemons=daemons)
    service = [("Type", "simple")]
    service.extend(preflight_entries(placement, where, preflight))
    service.append(("ExecStart", _exec_start(placement, where)))
    for key in ("user", "group"):
        value = _get(placement, key, (str,), where, required=False)
        if value:
            service.append((key.capitalize(), account_name(value, f"{where}.{key}")))
    service.extend(pinning)
    service.append(("Restart", "on-failure"))
    if hardening:
        service.extend(HARDENING)
    text = description or f"numafleet placement {name}"
    unit = [("Description", escape_specifiers(text, f"{where}.description"))] + unit_entries
    return unit_document(
        header,
        [("Unit", unit), ("Service", service), ("Install", [("WantedBy", "multi-user.target")])],
    )


def _render_slice(
    tenant: dict, where: str, header: list[str], memory_low: Optional[int] = None
) -> str:
    name = _get(tenant, "name", (str,), where)
    description = _get(tenant, "description", (str,), where, required=False)
    text = description or f"numafleet tenant {name}"
    entries = [
        (
            "AllowedCPUs",
            format_cpulist(_int_set(_get(tenant, "cpus", (list,), where), f"{where}.cpus")),
        ),
        (
            "AllowedMemoryNodes",
            format_cpulist(_int_set(_get(tenant, "mems", (list,), where), f"{where}.mems")),
        ),
    ]
    memory_max_kb = _get(tenant, "memory_max_kb", (int,), where, required=False)
    if memory_max_kb is not None:
        if memory_max_kb < 0:
            raise UnitRenderError(f"{where}.memory_max_kb is {memory_max_kb}, below 0; {_REPLAN}")
        entries.append(("MemoryMax", str(memory_max_kb * 1024)))
    if memory_low is not None:  # the budgets of its high placements (priority.py)
        entries.append(("MemoryLow", str(memory_low)))
    unit = [("Description", escape_specifiers(text, f"{where}.description"))]
    return unit_document(header, [("Unit", unit), ("Slice", entries)])


def _render_top_slice(memory_low: int, header: list[str]) -> str:
    """numafleet.slice, written only while a high placement needs its MemoryLow= (a unit's
    memory.low is effective only up to what every ancestor slice grants; priority.py)."""
    unit = [("Description", "numafleet placements")]
    return unit_document(header, [("Unit", unit), ("Slice", [("MemoryLow", str(memory_low))])])


def _host_prefix(plan: dict) -> str:
    host = plan.get("host") if isinstance(plan, dict) else None
    return f"host {host}: " if isinstance(host, str) and host else ""


def render_files(
    plan: dict,
    header: str = DEFAULT_HEADER,
    hardening_default: bool = True,
    unit_dir: str = DEFAULT_UNIT_DIR,
    preflight: str = "off",
) -> dict[str, str]:
    """{path as on the host: text} of every service, drop-in and tenant slice; raises UnitRenderError.

    ``preflight``: enforce, warn or off, numafleet-guard's ExecStartPre= line in each service and
    drop-in (preflight_entries; the modules default to warn, this function to off).
    """
    prefix = _host_prefix(plan)
    try:
        return _render_files(plan, header, hardening_default, unit_dir, preflight)
    except UnitRenderError as exc:
        if prefix and not str(exc).startswith(prefix):
            raise UnitRenderError(f"{prefix}{exc}") from None
        raise


def _render_files(
    plan: dict, header: str, hardening_default: bool, unit_dir: str, preflight: str = "off"
) -> dict[str, str]:
    unit_dir = check_host_path("unit_dir", unit_dir)
    if preflight not in PREFLIGHT_MODES:
        raise UnitRenderError(
            f"preflight is {preflight!r}; use one of {', '.join(PREFLIGHT_MODES)} "
            "(numafleet_preflight)"
        )
    lines = header_lines(header)
    if not isinstance(plan, dict):
        raise UnitRenderError(f"plan is {type(plan).__name__}, not a mapping; {_REPLAN}")
    version = plan.get("version")
    if version != PLAN_VERSION:
        raise UnitRenderError(
            f"plan version is {version!r}; this collection renders version {PLAN_VERSION}: "
            "plan again with the numafleet.tuning.numa_plan of the same collection release"
        )
    files: dict[str, str] = {}

    def add(path: str, text: str, what: str) -> None:
        if path in files:
            raise UnitRenderError(
                f"{what}: {path} is already written for another entry of the plan"
            )
        files[path] = text

    placements = _get(plan, "placements", (list,), "plan")
    daemons = _mps_daemons(plan)
    for index, placement in enumerate(placements):
        name = placement.get("name") if isinstance(placement, dict) else None
        where = f"plan placements[{index}] ({name})" if name else f"plan placements[{index}]"
        kind = _get(placement, "unit_kind", (str,), where)
        if kind == "service":
            unit = check_unit_name(
                _get(placement, "unit", (str,), where), ".service", f"{where}.unit"
            )
            hardening = _get(placement, "hardening", (bool,), where, required=False)
            text = _render_service(
                placement,
                where,
                lines,
                hardening_default if hardening is None else hardening,
                daemons,
                preflight,
            )
            add(posixpath.join(unit_dir, unit), text, where)
        elif kind == "dropin":
            unit = check_unit_name(
                _get(placement, "unit", (str,), where), ".service", f"{where}.unit"
            )
            unit_entries, service = _placement_entries(placement, where, True, daemons)
            # Appended to the vendor unit's own ExecStartPre= lines (never reset).
            service = preflight_entries(placement, where, preflight) + service
            text = unit_document(lines, [("Unit", unit_entries), ("Service", service)])
            add(posixpath.join(unit_dir, f"{unit}.d", DROPIN_NAME), text, where)
        else:
            raise UnitRenderError(
                f"{where}.unit_kind is {kind!r}, not service or dropin; {_REPLAN}"
            )
    tenants = _get(plan, "tenants", (list,), "plan", required=False) or []
    protected = priority.slice_memory_low(placements)
    for index, tenant in enumerate(tenants):
        name = tenant.get("name") if isinstance(tenant, dict) else None
        where = f"plan tenants[{index}] ({name})" if name else f"plan tenants[{index}]"
        if not _get(tenant, "placements", (list,), where, required=False):
            continue
        unit = check_unit_name(_get(tenant, "slice", (str,), where), ".slice", f"{where}.slice")
        text = _render_slice(tenant, where, lines, protected.get(unit))
        add(posixpath.join(unit_dir, unit), text, where)
    if priority.TOP_SLICE in protected:
        add(
            posixpath.join(unit_dir, priority.TOP_SLICE),
            _render_top_slice(protected[priority.TOP_SLICE], lines),
            "plan placements (priority high)",
        )
    # The housekeeping partition's drop-ins (system.slice, user.slice, init.scope) and the
    # system.conf.d one beside unit_dir: only when the plan has a partition key.
    for path, text in partition.render_partition(plan, lines, unit_dir).items():
        add(path, text, "plan partition")
    return dict(sorted(files.items()))


# --- changes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileChange:
    """One managed file: ``state`` is create, update, remove or unchanged; texts None when absent."""

    path: str
    state: str
    before: Optional[str]
    after: Optional[str]

    def as_dict(self) -> dict:
        """{"path", "state"} for the module's result."""
        return {"path": self.path, "state": self.state}

    def as_diff(self) -> dict:
        """One entry of Ansible's diff list."""
        return {
            "before_header": self.path,
            "after_header": self.path,
            "before": self.before or "",
            "after": self.after or "",
        }


def plan_changes(
    current: dict[str, Optional[str]], desired: dict[str, str], manifest_owned: list[str]
) -> list[FileChange]:
    """Changes per path, sorted: desired files created/updated/unchanged, owned ones no longer desired removed.

    ``current`` maps each path (desired or owned) to its text on disk, None when absent; an owned
    file already gone needs nothing and is left out.
    """
    changes = []
    for path in sorted(set(desired) | set(manifest_owned)):
        before = current.get(path)
        if path in desired:
            after = desired[path]
            state = "create" if before is None else "unchanged" if before == after else "update"
            changes.append(FileChange(path, state, before, after))
        elif before is not None:
            changes.append(FileChange(path, "remove", before, None))
    return changes


def unit_of(path: str) -> str:
    """The unit a managed path configures: the file's name, or ``X.service`` for ``X.service.d/...``."""
    parent, base = posixpath.split(path)
    if base == DROPIN_NAME and parent.endswith(".d"):
        return posixpath.basename(parent)[:-2]
    return base


def is_dropin(path: str) -> bool:
    """Whether ``path`` is a numafleet drop-in (``<unit>.d/50-numafleet.conf``)."""
    parent, base = posixpath.split(path)
    return base == DROPIN_NAME and parent.endswith(".d")


@dataclass(frozen=True)
class Actions:
    """What the service manager has to do after ``changes``, and the lists reported by the module."""

    units: dict
    slices: dict
    reload_needed: bool
    disable: tuple
    restart: tuple
    start: tuple
    # Units pinned by a drop-in: restarted only if running (try-restart), never started here.
    try_restart: tuple = ()
    # (unit, waits_for) of placements whose MIG instance does not exist yet: never started.
    waiting: tuple = ()
    # The system.conf.d drop-in (partition.py) was written or removed: PID 1 reads it only
    # when it re-executes (systemctl daemon-reexec; no unit is restarted).
    reexec_needed: bool = False
    # Units whose file changed only in numafleet-guard's ExecStartPre= (preflight_only): written,
    # never restarted; the line takes effect at the unit's next start.
    rewritten: tuple = ()

    def would_run(self) -> list[str]:
        """The systemctl command lines, in the order they are to run, then one line per waiting
        unit (no command: what happens to it once its MIG instance exists)."""
        lines = [f"systemctl disable --now {unit}" for unit in self.disable]
        if self.reload_needed:
            lines.append("systemctl daemon-reload")
        if self.reexec_needed:
            lines.append("systemctl daemon-reexec")
        lines.extend(f"systemctl restart {unit}" for unit in self.restart)
        lines.extend(f"systemctl try-restart {unit}" for unit in self.try_restart)
        lines.extend(f"systemctl enable --now {unit}" for unit in self.start)
        lines.extend(waiting_line(unit, waits) for unit, waits in self.waiting)
        return lines

    def waiting_dicts(self) -> list[dict]:
        """The module's ``waiting`` result: [{unit, mig_instance, gpu, profile, start, reason}]."""
        return [dict({"unit": unit}, **waits) for unit, waits in self.waiting]


def waiting_line(unit: str, waits: dict) -> str:
    """'<unit>: not started, waits for MIG instance <...>: <reason>' (a would-run line)."""
    reason = waits.get("reason")
    then = (
        "enabled and started once it exists"
        if reason != "mode change pending a reset"
        else "enabled and started by the first run after the GPU reset"
    )
    if "partition" in waits:  # AMD: a logical GPU of a compute partition still to be made
        what, then = waits.get("partition"), "enabled and started once the plan is made again"
    else:
        what = f"MIG instance {waits.get('mig_instance')}"
    return f"{unit}: not started, waits for {what}: {reason}; {then}"


def waiting_units(plan) -> dict:
    """{unit: waits_for} of the plan's placements whose MIG instance does not exist yet.

    A plan from before waits_for (or not a plan) has none.
    """
    placements = plan.get("placements") if isinstance(plan, dict) else None
    found = {}
    for entry in placements if isinstance(placements, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("waits_for"), dict):
            if isinstance(entry.get("unit"), str):
                found[entry["unit"]] = entry["waits_for"]
    return found


def recorded_waiting(text: Optional[str]) -> set:
    """The units that waited for their MIG instance in the recorded plan's ``text`` (None: no
    file); an unreadable record waits for nothing."""
    try:
        return set(waiting_units(json.loads(text))) if text else set()
    except ValueError:
        return set()


_UNIT_STATE = {"create": "new", "update": "changed", "remove": "removed", "unchanged": "unchanged"}


def plan_actions(
    changes: list[FileChange], waiting: Optional[dict] = None, waited=(), preflight_paths=()
) -> Actions:
    """Units and slices by state, and the services to disable, (try-)restart and start; no I/O.

    Slices and scopes (the partition's init.scope) are listed in ``slices`` and never
    restarted: daemon-reload applies them. The partition's system.conf.d drop-in is no unit:
    a change of it sets ``reexec_needed`` (systemctl daemon-reexec after the reload).

    numafleet-*.service units are restarted; units pinned by a drop-in are only try-restarted
    (restarted if running), so that a vendor service that was stopped stays stopped.
    ``waiting`` ({unit: waits_for}, waiting_units of the plan): units whose MIG instance does not
    exist yet; they are written but never enabled, started or (try-)restarted. ``waited``: the
    units that waited in the plan applied last (recorded_waiting); one that waits no more was
    never started, so it is enabled and started (not restarted), even when its file is unchanged.
    A unit (or drop-in) whose file changed only in numafleet-guard's ExecStartPre= line is in
    ``rewritten``, not restarted: the preflight runs at its next start anyway. ``preflight_paths``:
    paths known to differ only in that line where the changes carry digests, not texts (the
    change plan's; changes.change_plan).
    """
    waiting = waiting or {}
    units: dict = {state: [] for state in ("new", "changed", "removed", "unchanged")}
    slices: dict = {state: [] for state in ("new", "changed", "removed", "unchanged")}
    disable, restart, start, try_restart, rewritten = [], [], [], [], []
    reexec = False
    for change in changes:
        unit, state = unit_of(change.path), _UNIT_STATE[change.state]
        if partition.is_manager_file(change.path):
            reexec = reexec or state != "unchanged"  # not a unit: PID 1's own settings
            continue
        if unit.endswith((".slice", ".scope")):
            slices[state].append(unit)  # applied at daemon-reload: never restarted
            continue
        units[state].append(unit)
        if unit in waiting and state != "removed":
            continue
        if unit in waited and state in ("changed", "unchanged") and not is_dropin(change.path):
            start.append(unit)
            continue
        if state == "changed" and (
            change.path in preflight_paths or preflight_only(change.before, change.after)
        ):
            rewritten.append(unit)  # the preflight line alone: it matters at the next start
        elif is_dropin(change.path):
            if state != "unchanged":
                try_restart.append(unit)  # the user's unit: never enabled, disabled or started
        elif state == "new":
            start.append(unit)
        elif state == "changed":
            restart.append(unit)
        elif state == "removed":
            disable.append(unit)
    return Actions(
        units={state: sorted(names) for state, names in units.items()},
        slices={state: sorted(names) for state, names in slices.items()},
        reload_needed=any(change.state != "unchanged" for change in changes),
        disable=tuple(sorted(disable)),
        restart=tuple(sorted(restart)),
        start=tuple(sorted(start)),
        try_restart=tuple(sorted(try_restart)),
        waiting=tuple(sorted(waiting.items())),
        reexec_needed=reexec,
        rewritten=tuple(sorted(rewritten)),
    )


def disable_argv(systemctl: str, timeout: Optional[str], unit: str) -> list[str]:
    """argv of ``systemctl disable --now <unit>``, under coreutils ``timeout`` when given."""
    command = [systemctl, "disable", "--now", unit]
    if timeout is None:
        return command
    return [timeout, f"--kill-after={_KILL_AFTER_S}", str(STOP_TIMEOUT_S)] + command


# --- manifest ----------------------------------------------------------------------------------
#
# Version 2 (since issue 19) records, for every file written, the sha256 of its bytes:
#   {"version": 2, "files": {host path: sha256 hex}, "units": [unit, ...]}
# A file listed there that the run no longer wants is removed (and its unit disabled) only when
# it lies where this module writes (in unit_dir, named as a unit, slice or numafleet drop-in),
# is a regular file, and its sha256 now equals the recorded one. Version 1 manifests (a plain
# list of files, no hashes) are still read; their entries are trusted only when the file also
# starts with the header the module writes now (default "# Managed by numafleet.tuning"),
# since a version 1 entry says nothing about the content. Anything else is kept, reported in
# the module's `kept` result and as a warning, and left out of the next manifest.

MANIFEST_VERSIONS = (1, MANIFEST_VERSION)


def digest_bytes(data: bytes) -> str:
    """sha256 hex digest of a file's bytes, as the manifest records them."""
    return hashlib.sha256(data).hexdigest()


def digest_text(text: str) -> str:
    """sha256 hex digest of the bytes ``write_files`` writes for ``text``."""
    return digest_bytes(text.encode("utf-8", "surrogateescape"))


@dataclass(frozen=True)
class Manifest:
    """The manifest on disk: its text (None when absent), the files it lists, and their digests.

    ``digests`` maps each listed file to the sha256 recorded at write time (None in a version 1
    manifest, which recorded none).
    """

    path: str
    text: Optional[str]
    files: tuple
    digests: tuple = ()
    version: int = MANIFEST_VERSION

    def digest_of(self, path: str) -> Optional[str]:
        """The recorded sha256 of ``path``, None when none was recorded."""
        return dict(self.digests).get(path)


def manifest_text(desired: dict[str, str]) -> str:
    """Manifest JSON for ``desired``: version, each file with its sha256, and the units."""
    data = {
        "version": MANIFEST_VERSION,
        "files": {path: digest_text(text) for path, text in sorted(desired.items())},
        "units": sorted({unit_of(path) for path in desired}),
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _manifest_file_ok(path) -> bool:
    if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) != path:
        return False
    name = posixpath.basename(path)
    return is_dropin(path) or (name.endswith((".service", ".slice")) and len(name) > 8)


_HEX = re.compile(r"[0-9a-f]{64}")


def parse_manifest_digests(text: str, path: str) -> tuple:
    """(version, sorted ((file, sha256 or None), ...)) of a manifest's text; raises UnitFileError."""
    fix = (
        "Restore it from the last run, or remove it (the files it listed then stay in place "
        "and are no longer removed when their placement goes)"
    )
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UnitFileError(path, f"is not JSON ({exc})", fix) from None
    version = data.get("version") if isinstance(data, dict) else None
    if version not in MANIFEST_VERSIONS or isinstance(version, bool):
        raise UnitFileError(
            path, f"is not a version {MANIFEST_VERSION} (or 1) numafleet manifest", fix
        )
    listed = data.get("files")
    if version == 1:
        if not isinstance(listed, list):
            raise UnitFileError(path, "has no list of files", fix)
        entries = {entry: None for entry in listed if isinstance(entry, str)}
        odd = [entry for entry in listed if not isinstance(entry, str)]
    else:
        if not isinstance(listed, dict):
            raise UnitFileError(path, "has no mapping of files to their sha256", fix)
        entries, odd = dict(listed), []
        for entry, value in listed.items():
            if not isinstance(value, str) or not _HEX.fullmatch(value):
                raise UnitFileError(path, f"records {value!r} for {entry!r}, not a sha256", fix)
    for entry in odd + list(entries):
        if not _manifest_file_ok(entry):
            raise UnitFileError(
                path, f"lists {entry!r}, which is not a unit, slice or drop-in path", fix
            )
    return version, tuple(sorted(entries.items()))


def parse_manifest(text: str, path: str) -> tuple:
    """Sorted files listed by a manifest's text; raises UnitFileError when it is malformed."""
    return tuple(entry for entry, dummy in parse_manifest_digests(text, path)[1])


# --- I/O ---------------------------------------------------------------------------------------


def under_root(root: str, path: str) -> str:
    """Where the host path ``path`` lies below ``root`` ("/" = the host itself)."""
    return os.path.join(root, path.lstrip("/"))


def _fail_read(path: str, reason: str) -> UnitFileError:
    if "symbolic link" in reason:
        return UnitFileError(path, reason, "Replace the link with what it points at")
    if "regular file" in reason:
        return UnitFileError(path, reason, "Move it away; numafleet writes a file here")
    return UnitFileError(path, reason, "Check its permissions")


def _read_text(root: str, path: str, link_as_absent: bool = True) -> Optional[str]:
    """Text of ``path`` below ``root``, None when absent; never through a link.

    A link at a unit path reads as absent: the write replaces it with a file, and it is never
    removed as ours.
    """
    return files.read_text(root, path, _fail_read, link_as_absent)


def read_files(root: str, paths) -> dict[str, Optional[str]]:
    """{host path: text or None when absent} of ``paths`` below ``root``; raises UnitFileError."""
    return {path: _read_text(root, path) for path in sorted(paths)}


def read_manifest(root: str, manifest_path: str = DEFAULT_MANIFEST_PATH) -> Manifest:
    """The manifest at ``manifest_path`` below ``root`` (files () when absent); raises UnitFileError.

    A manifest that is a link is refused (never followed).
    """
    text = _read_text(root, manifest_path, link_as_absent=False)
    if text is None:
        return Manifest(manifest_path, None, ())
    version, entries = parse_manifest_digests(text, under_root(root, manifest_path))
    return Manifest(manifest_path, text, tuple(path for path, dummy in entries), entries, version)


@dataclass(frozen=True)
class Kept:
    """A file a manifest lists that is not removed: not ours, or changed since it was written."""

    path: str
    reason: str
    manifest: str

    def as_dict(self) -> dict:
        """{"path", "reason"} for the module's result."""
        return {"path": self.path, "reason": self.reason}

    def message(self) -> str:
        """The warning: the file, why it is kept, and what to do."""
        return (
            f"{self.path}: listed in the manifest {self.manifest} but {self.reason}; it is kept "
            "(not disabled, not removed): numafleet removes only files it wrote. Remove it by "
            "hand if it is no longer wanted"
        )


def in_unit_dir(path: str, unit_dir: str) -> bool:
    """Whether ``path`` is a unit, slice or numafleet drop-in directly in ``unit_dir``."""
    parent = posixpath.dirname(path)
    if partition.is_manager_file(path):
        return path == partition.manager_path(unit_dir)  # the one file beside unit_dir
    if is_dropin(path):
        return posixpath.dirname(parent) == unit_dir
    return parent == unit_dir and _manifest_file_ok(path)


# The names this collection gives the files it writes in a unit directory: its own services and
# slices, the MPS daemon template, and drop-ins (which pin a unit, and are removed as such). No
# other unit is ever removed, whatever a manifest lists and whatever its sha256.
_OWN_UNIT = re.compile(
    r"(numafleet-[^/]+\.service|numafleet(-[^/]+)?\.slice|nvidia-mps@\.service)\Z"
)


def own_name(path: str) -> bool:
    """Whether ``path``'s name is one numafleet gives its files: ``numafleet-*.service``,
    ``numafleet*.slice``, ``nvidia-mps@.service`` or a ``<unit>.d/50-numafleet.conf`` drop-in."""
    return is_dropin(path) or bool(_OWN_UNIT.match(posixpath.basename(path)))


def removable(
    root: str, manifest: Manifest, desired, unit_dir: Optional[str], header: str = DEFAULT_HEADER
) -> tuple:
    """(files of ``manifest`` that may be removed, [Kept]) for a run that wants ``desired``.

    A listed file no longer desired is removable only when it has a name numafleet gives its
    files (``own_name``), is in ``unit_dir``, is a regular file reached without a link, and its sha256 equals
    the one recorded (version 1 manifests: it starts with ``header``). Absent files need
    nothing and are in neither list. ``unit_dir`` None skips the directory check (numa_facts,
    which does not know the unit_dir the roles pass). Raises UnitFileError when a listed file
    cannot be read.
    """
    ours, kept = [], []
    first = header.rstrip("\n") + "\n" if header.strip() else None
    for path in manifest.files:
        if path in desired:
            continue
        if not own_name(path):
            kept.append(
                Kept(
                    path,
                    "is not named as numafleet names its files (numafleet-*.service, "
                    "numafleet*.slice, nvidia-mps@.service, <unit>.d/50-numafleet.conf)",
                    manifest.path,
                )
            )
            continue
        if unit_dir is not None and not in_unit_dir(path, unit_dir):
            kept.append(Kept(path, f"is not a unit file in unit_dir {unit_dir}", manifest.path))
            continue
        try:
            info = files.lstat_file(root, path, _fail_read)
        except UnitFileError as exc:
            kept.append(Kept(path, f"cannot be reached without a link ({exc})", manifest.path))
            continue
        if info is None:
            continue
        if stat.S_ISLNK(info.st_mode):
            kept.append(
                Kept(path, "is a symbolic link, which numafleet never writes", manifest.path)
            )
            continue
        if not stat.S_ISREG(info.st_mode):
            kept.append(Kept(path, "is not a regular file", manifest.path))
            continue
        data = files.read_file(root, path, _fail_read) or b""
        recorded = manifest.digest_of(path)
        if recorded is not None:
            if digest_bytes(data) != recorded:
                kept.append(
                    Kept(
                        path,
                        "its content changed since numafleet wrote it (sha256 "
                        f"{digest_bytes(data)[:12]}..., recorded {recorded[:12]}...): someone "
                        "edited it",
                        manifest.path,
                    )
                )
                continue
        elif first is None or not data.decode("utf-8", "replace").startswith(first):
            kept.append(
                Kept(
                    path,
                    "the version 1 manifest recorded no sha256 and the file does not start "
                    "with the header numafleet writes",
                    manifest.path,
                )
            )
            continue
        ours.append(path)
    return sorted(ours), kept


def plan_manifest(manifest: Manifest, desired: dict[str, str]) -> Optional[FileChange]:
    """The manifest's change for ``desired``; None when there is none and nothing to record."""
    after = manifest_text(desired)
    if manifest.text is None:
        return FileChange(manifest.path, "create", None, after) if desired else None
    state = "unchanged" if manifest.text == after else "update"
    return FileChange(manifest.path, state, manifest.text, after)


def plan_record_text(plan: dict) -> str:
    """The text of the recorded plan file: the plan as JSON, keys sorted, without stability.

    Warnings (the plan's ``warnings`` and each placement's) are notes about this run's facts,
    not resources: they are not recorded either, so that a facts change that only changes a
    warning (a memory tier, an isolated sibling, a GPU's locality) rewrites no file and is no
    difference for verify's and drift_check's rendered_units check.
    """
    kept = {key: value for key, value in plan.items() if key not in _UNRECORDED_PLAN_KEYS}
    if isinstance(kept.get("placements"), list):
        kept["placements"] = [
            {key: value for key, value in entry.items() if key not in _UNRECORDED_ENTRY_KEYS}
            if isinstance(entry, dict)
            else entry
            for entry in kept["placements"]
        ]
    return json.dumps(kept, indent=1, sort_keys=True) + "\n"


def plan_record_change(root: str, path: str, plan: dict) -> FileChange:
    """The change of the recorded plan file at ``path`` below ``root``; raises UnitFileError.

    A link there reads as absent, so it is replaced by a file (numa_facts refuses a link).
    """
    before = _read_text(root, path)
    after = plan_record_text(plan)
    state = "create" if before is None else "unchanged" if before == after else "update"
    if before is None and files.lstat_file(root, path, _fail_read) is not None:
        state = "update"  # a link (read as absent) is there: replaced by the file
    return FileChange(path, state, before, after)


_WRITE_FIX = "Check that the directory is writable, or set root/unit_dir to one that is"


def _fail_write(path: str, reason: str) -> UnitFileError:
    if "symbolic link" in reason:
        return UnitFileError(path, reason, "Replace the link with a directory")
    return UnitFileError(path, reason, _WRITE_FIX)


def write_files(root: str, changes: list[FileChange]) -> None:
    """Apply ``changes`` below ``root``: atomic writes (mode 0644), removals, empty .d dirs removed.

    Nothing is written, read or removed through a link (files.py); directories made get mode
    0755 and files 0644 whatever the umask. Raises UnitFileError.
    """
    for change in changes:
        if change.state in ("create", "update"):
            files.write_file(
                root, change.path, change.after or "", FILE_MODE, _fail_write, DIR_MODE
            )
        elif change.state == "remove":
            files.remove_file(root, change.path, _fail_write, prune_parent=is_dropin(change.path))


def write_manifest(root: str, change: Optional[FileChange]) -> None:
    """Write the manifest change from ``plan_manifest`` (nothing for None/unchanged); raises UnitFileError."""
    if change is not None:
        write_files(root, [change])
