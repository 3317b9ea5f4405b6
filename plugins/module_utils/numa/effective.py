# Private to this collection: may change in any release.
"""Effective unit state: what systemd will use for each managed unit, whoever wrote the files.

Our own files (units.render_files) are only part of what systemd reads for a unit. This file
finds every unit file and drop-in systemd reads for a system unit below a root, merges them the
way systemd does, and compares the properties numafleet plans with what wins.

Where systemd looks (systemd.unit(5), "Unit File Load Path", system mode), highest priority
first: /etc/systemd/system.control, /run/systemd/system.control (``systemctl set-property``
writes ``<unit>.d/50-<Property>.conf`` there), /run/systemd/transient,
/run/systemd/generator.early, /etc/systemd/system, /etc/systemd/system.attached,
/run/systemd/system, /run/systemd/system.attached, /run/systemd/generator,
/usr/local/lib/systemd/system, /usr/lib/systemd/system, /run/systemd/generator.late
(``SYSTEM_UNIT_PATH``).

- The fragment is the unit file of the first directory that holds ``<unit>`` (for an instance
  ``a@i.service`` without its own file, the template ``a@.service``); a link to /dev/null
  (or an empty file) masks the unit.
- Drop-ins (systemd.unit(5), "Description"): every ``*.conf`` (any name, hidden files ignored)
  in ``<unit>.d/`` of every directory of the path, and in the prefix directories made by
  truncating the name after each dash (``numafleet-a-b.service`` also reads
  ``numafleet-a-.service.d/`` and ``numafleet-.service.d/``), in ``<template>.d/`` for an
  instance, and in the type directory (``service.d/``, ``slice.d/``). A drop-in with the same
  file name in a higher-priority directory (or a more specific directory of the same priority)
  masks the other one; one linked to /dev/null masks it and sets nothing. All drop-ins are
  then applied after the fragment in lexicographic order of their file names, wherever they
  lie ("Drop-in files ... are applied in lexicographic order, regardless of which of the
  directories they reside in").
- Compared: every setting numafleet's own files assign for the unit in ``[Unit]`` and in the
  type section (``[Service]``, ``[Slice]``); ``[Install]`` is read only by ``systemctl enable``
  and is not compared.
- Merging (systemd.syntax(7), systemd.exec(5), systemd.resource-control(5)): single-value
  settings (NUMAPolicy=, Slice=, MemoryMax=, User=...) - the last assignment wins, an empty one
  resets to the default; CPUAffinity=, NUMAMask=, AllowedCPUs=, AllowedMemoryNodes= -
  assignments are merged (union), an empty assignment resets; ExecStart= and the other Exec
  lines and DeviceAllow= - a list, an empty assignment resets; dependencies (After=, Requires=...) accumulate and
  are in effect when every planned unit is listed; Environment= - words accumulate, a later
  assignment of a variable overrides an earlier one, an empty assignment resets the list.
  EnvironmentFile= (a list, empty resets; ``-`` before the path: a missing file is ignored) is
  read below the root (``parse_env_file``): its variables override Environment=, files in
  order. UnsetEnvironment= (a list, empty resets) then removes a variable (``VAR``) or one exact
  assignment (``VAR=VALUE``). Booleans (true/on as yes, false/off as no) and sizes (``4G`` in
  bytes, base 1024) are compared normalised.

Files are read without following a link out of the root (``resolve_in_root``): a drop-in,
drop-in directory or environment file that is a link is followed below the root - an absolute
target is taken below the root - and is named with its target; a link to /dev/null masks. A
target outside the root, a loop, a FIFO or a file that cannot be read is reported in ``unread``
and, because systemd may apply settings from it that cannot be compared, as a foreign override
``(unreadable)`` of the unit; a dangling drop-in link (systemd ignores it) is reported in
``unread`` only. Nothing is raised. Values and paths in the results have control characters and
bytes that are not UTF-8 escaped (``\\x00``, ``\\xff``).

On a live host, ``show_argv`` / ``parse_show`` give the same properties as the running service
manager has loaded them (``systemctl show``): CPUAffinity/NUMAMask/AllowedCPUs/
AllowedMemoryNodes as cpulists ("0-3 8" or "0-3,8"), NUMAPolicy as a word, Environment as
space-separated, possibly quoted ``K=V`` words.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import files
from .cpulist import format_cpulist, parse_cpulist
from .errors import NumaTuneError, escape_controls

SYSTEM_UNIT_PATH = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/run/systemd/generator.late",
)
# The properties compared with the plan, per unit type. Sets are cpulists; "Environment" stands
# for one entry per variable the plan sets ("Environment.NAME").
SERVICE_PROPERTIES = (
    "CPUAffinity",
    "NUMAPolicy",
    "NUMAMask",
    "AllowedCPUs",
    "AllowedMemoryNodes",
    "Slice",
)
SLICE_PROPERTIES = ("AllowedCPUs", "AllowedMemoryNodes")
SETS = ("CPUAffinity", "NUMAMask", "AllowedCPUs", "AllowedMemoryNodes")
# List settings: every assignment adds an entry, an empty one resets (systemd.service(5)).
EXEC_LISTS = (
    "ExecCondition",
    "ExecStartPre",
    "ExecStart",
    "ExecStartPost",
    "ExecReload",
    "ExecStop",
    "ExecStopPost",
)
# Dependencies accumulate (systemd.unit(5)); in effect when every planned unit is listed.
DEPENDENCIES = (
    "After",
    "Before",
    "Requires",
    "Requisite",
    "Wants",
    "BindsTo",
    "PartOf",
    "Upholds",
    "Conflicts",
    "OnFailure",
    "OnSuccess",
)
# Device access (systemd.resource-control(5)): every assignment adds a device, an empty one
# resets. In effect when every planned entry is allowed and no other DRM device: one more render
# node (or char-drm, every one) shows the unit more GPUs; another device (an RDMA adapter) is
# the user's to add.
DEVICE_LISTS = ("DeviceAllow",)
_DRM_DEVICES = ("/dev/dri/", "char-drm")
# Read into the environment (systemd.exec(5)); lists, an empty assignment resets.
ENV_LISTS = ("EnvironmentFile", "UnsetEnvironment")
# The property of a foreign_overrides entry for a file systemd reads but numafleet could not.
UNREADABLE = "(unreadable)"
_TRUE = ("yes", "true", "on", "1", "y", "t")
_FALSE = ("no", "false", "off", "0", "n", "f")
_SIZE = re.compile(r"^([0-9]+)(?:\.([0-9]+))?\s*([KMGTPE]?)$", re.IGNORECASE)
_SIZE_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
# Which verify binding check a differing property fails.
CPU_PROPERTIES = ("CPUAffinity", "AllowedCPUs")
MEM_PROPERTIES = ("NUMAPolicy", "NUMAMask", "AllowedMemoryNodes")
_SECTIONS = {
    ".service": ("Unit", "Service"),
    ".slice": ("Unit", "Slice"),
    ".scope": ("Unit", "Scope"),  # init.scope of the housekeeping partition (partition.py)
}
SHOW_PROPERTIES = (
    "Id",
    "LoadState",
    "CPUAffinity",
    "NUMAPolicy",
    "NUMAMask",
    "AllowedCPUs",
    "AllowedMemoryNodes",
    "Environment",
    "Slice",
    "DropInPaths",
    "FragmentPath",
    # Limits of limits.py (TasksMax= is left to the file comparison: systemctl shows a
    # percentage as the count it resolves to).
    "MemoryMax",
    "MemoryHigh",
    "CPUWeight",
    "IOWeight",
    # MemoryLow= of a high placement and of the slices above it (priority.py); shown in bytes.
    "MemoryLow",
)
SHOW_SOURCE = "systemctl show"
_DEV_NULL = "/dev/null"
_READ_LIMIT = 1 << 20
_MAX_LINKS = 40  # systemd's and the kernel's limit of links followed in one path (ELOOP)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def escape_text(text: str) -> str:
    """``text`` with control characters and line separators escaped (``\\x00``, ``\\n``;
    ``errors.escape_controls``), and bytes that were not UTF-8 (``decode``) as ``\\xff``."""
    if any(0xDC80 <= ord(char) <= 0xDCFF for char in text):
        text = "".join(
            f"\\x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else char
            for char in text
        )
    return escape_controls(text)


def decode(data: bytes) -> str:
    """Text of a file; bytes that are not UTF-8 kept as surrogates (``escape_text`` shows them)."""
    return data.decode("utf-8", errors="surrogateescape")


class _Unreadable(NumaTuneError):
    pass


def _fail(path: str, reason: str) -> _Unreadable:
    return _Unreadable(f"{path}: {reason}")


# --- parsing -----------------------------------------------------------------------------------


def parse_assignments(text: str) -> list:
    """[(section, key, value)] of a unit file's text in file order (systemd.syntax(7)).

    Comments (``#``/``;`` lines, also inside a continuation), ``[Section]`` headers, a trailing
    backslash joining the next line (with a space), key and value stripped of whitespace. Lines
    without ``=`` or outside a section are ignored, as systemd ignores them (with a warning).
    """
    out, section, pending = [], None, None
    for raw in text.splitlines():
        line = raw.strip()
        if pending is not None:
            if line.startswith(("#", ";")):
                continue
            line = pending + " " + line if line else pending
            pending = None
        elif not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section is None or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    if pending is not None and section is not None and "=" in pending:
        key, value = pending.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    return out


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}


def split_words(value: str) -> list:
    """Words of a setting (systemd's extract_first_word with quotes and C escapes); ``%%`` -> ``%``."""
    words, word, quote, index, started = [], [], None, 0, False
    while index < len(value):
        char = value[index]
        if char == "\\" and index + 1 < len(value):
            nxt = value[index + 1]
            if nxt == "x" and index + 3 < len(value):
                try:
                    word.append(chr(int(value[index + 2 : index + 4], 16)))
                    index += 4
                    started = True
                    continue
                except ValueError:
                    pass
            word.append(_ESCAPES.get(nxt, nxt))
            index += 2
            started = True
            continue
        if quote:
            if char == quote:
                quote = None
            else:
                word.append(char)
        elif char in "\"'":
            quote, started = char, True
        elif char in " \t\n\r":
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(char)
            started = True
        index += 1
    if started:
        words.append("".join(word))
    return [word.replace("%%", "%") for word in words]


def normalise(prop: str, value: Optional[str]) -> Optional[str]:
    """A comparable value: cpulists as "0-3,8" ("" for none), NUMAPolicy lowercased, None unset.

    A set that does not parse as a cpulist (``numa``, a specifier) is kept as written.
    """
    if value is None:
        return None
    value = value.strip()
    if prop in SETS:
        try:
            return format_cpulist(parse_cpulist(",".join(value.replace(",", " ").split())))
        except NumaTuneError:
            return value
    if prop == "NUMAPolicy":
        return None if value in ("", "n/a") else value.lower()
    if prop.startswith(("Memory", "Limit")):
        return _size(value)
    lowered = value.lower()
    if lowered in _TRUE[:3]:
        return "yes"
    if lowered in _FALSE[:3]:
        return "no"
    return value


def _size(value: str) -> str:
    """A size in bytes ("4G" -> "4294967296", base 1024), "infinity"; ``A:A`` rlimits as ``A``."""
    soft, sep, hard = value.partition(":")
    if sep and soft == hard:
        value = soft
    if value.lower() == "infinity":
        return "infinity"
    match = _SIZE.match(value)
    if not match:
        return value
    whole, frac, unit = match.groups()
    scale = 1024 ** _SIZE_UNITS[unit.lower()]
    number = int(whole) * scale
    if frac:
        number += int(frac) * scale // 10 ** len(frac)
    return str(number)


def parse_env_file(text: str) -> list:
    r"""[(name, value)] of an environment file in file order (systemd's parse_env_file).

    ``KEY=VALUE`` lines; blank lines and lines starting with ``#`` or ``;`` are skipped; the
    key and the unquoted value are stripped of whitespace; single quotes keep everything
    literally, double quotes take ``\"``, ``\\``, ``\` `` and ``\$`` as escapes; an unquoted
    backslash keeps the next character; a backslash before a newline (quoted or not) joins the
    next line. Lines without ``=`` and keys that are not variable names are ignored, as systemd
    ignores them.
    """
    out, index, size = [], 0, len(text)
    while index < size:
        while index < size and text[index] in " \t\r\n":
            index += 1
        if index >= size:
            break
        if text[index] in "#;":
            while index < size and text[index] != "\n":
                index += 1
            continue
        start = index
        while index < size and text[index] not in "=\n":
            index += 1
        if index >= size or text[index] == "\n":
            continue
        key = text[start:index].strip()
        index += 1
        while index < size and text[index] in " \t":
            index += 1
        value, trailing, quote = [], 0, None
        while index < size:
            char = text[index]
            if quote is None:
                if char == "\n":
                    index += 1
                    break
                if char == "\\":
                    if index + 1 < size and text[index + 1] != "\n":
                        value.append(text[index + 1])
                        trailing = 0
                    index += 2
                    continue
                if char in "'\"":
                    quote, trailing = char, 0
                else:
                    value.append(char)
                    trailing = trailing + 1 if char in " \t\r" else 0
            elif quote == "'":
                if char == "'":
                    quote = None
                else:
                    value.append(char)
            elif char == '"':
                quote = None
            elif char == "\\" and index + 1 < size:
                nxt = text[index + 1]
                if nxt in '"\\`$':
                    value.append(nxt)
                elif nxt != "\n":
                    value += [char, nxt]
                index += 2
                continue
            else:
                value.append(char)
            index += 1
        if trailing:
            value = value[:-trailing]
        if _ENV_NAME.match(key):
            out.append((key, "".join(value)))
    return out


def _unique(words: list) -> list:
    return list(dict.fromkeys(words))


def merge(
    documents: list,
    suffix: str,
    read_env: Optional[Callable] = None,
    details: Optional[dict] = None,
    unread: Optional[list] = None,
) -> dict:
    """{property: (value or None, source path or None)} of ``documents`` [(path, text)] in order.

    Properties: every key of ``[Unit]`` and of the type section (``[Service]``, ``[Slice]``),
    and ``Environment.NAME`` per variable, each merged by its rule (module docstring): sets and
    dependencies merged, Exec lines a list (joined by `` ; ``), the rest last-wins; the source is
    the last file that assigned it. Values are normalised (``normalise``) and escaped
    (``escape_text``). ``read_env(path) -> (pairs or None when absent, path read)`` reads an
    EnvironmentFile= (raising NumaTuneError when it cannot); without it EnvironmentFile= is not
    read. ``details`` (filled) gets {property: how the file sets it} for values from an
    environment file or removed by UnsetEnvironment=; ``unread`` (filled) gets
    {path, reason, via} for environment files that could not be read.
    """
    sections = _SECTIONS.get(suffix, ())
    single: dict = {}
    lists: dict = {}
    env: dict = {}
    env_lists: dict = {key: [] for key in ENV_LISTS}
    service = suffix == ".service"
    for path, text in documents:
        for section, key, value in parse_assignments(text):
            if section not in sections:
                continue
            if service and section == "Service" and key == "Environment":
                if not value:
                    env = {}
                    continue
                for word in split_words(value):
                    name, sep, val = word.partition("=")
                    if sep:
                        env[name] = (val, path, "")
                continue
            if service and section == "Service" and key in ENV_LISTS:
                if not value:
                    env_lists[key] = []
                else:
                    env_lists[key] += [(word, path) for word in split_words(value)]
                continue
            if key in SETS or key in EXEC_LISTS or key in DEPENDENCIES or key in DEVICE_LISTS:
                items, dummy = lists.get(key, ([], None))
                if not value and key not in DEPENDENCIES:
                    lists[key] = ([], path)
                elif key in DEPENDENCIES:
                    lists[key] = (items + split_words(value), path)
                else:
                    lists[key] = (items + [value.replace("%%", "%")], path)
                continue
            plain = split_words(value)
            single[key] = (" ".join(plain) if plain else None, path)
    out = {}
    for key, (value, path) in single.items():
        out[key] = (normalise(key, value), path)
    for key, (items, path) in lists.items():
        if key in SETS:
            value = normalise(key, " ".join(items)) if items else None
        elif key in DEPENDENCIES:
            value = " ".join(_unique(items)) if items else None
        else:
            value = " ; ".join(items) if items else None
        out[key] = (value, path)
    for word, path in env_lists["EnvironmentFile"]:
        optional = word.startswith("-")
        name = word[1:] if optional else word
        if read_env is None:
            break
        how = f"EnvironmentFile={word}"
        try:
            pairs, read = read_env(name)
        except NumaTuneError as exc:
            if unread is not None:
                unread.append({"path": name, "reason": str(exc), "via": path})
            continue
        if pairs is None:
            if not optional and unread is not None:
                unread.append(
                    {
                        "path": name,
                        "reason": f"{name}: does not exist, and {how} (without -) makes "
                        "systemd refuse to start the unit",
                        "via": path,
                    }
                )
            continue
        if read != name:
            how += f" (link to {read})"
        for var, val in pairs:
            env[var] = (val, path, how)
    for word, path in env_lists["UnsetEnvironment"]:
        name, sep, val = word.partition("=")
        if name in env and (not sep or env[name][0] == val):
            env[name] = (None, path, f"UnsetEnvironment={word}")
    for name, (value, path, how) in env.items():
        out[f"Environment.{name}"] = (value, path)
        if how and details is not None:
            details[f"Environment.{name}"] = escape_text(how)
    return {
        prop: (None if value is None else escape_text(value), path)
        for prop, (value, path) in out.items()
    }


# --- finding the files -------------------------------------------------------------------------


def dropin_dir_names(unit: str) -> list:
    """The ``.d`` directory names read for ``unit``, most specific first (systemd.unit(5))."""
    stem, dot, suffix = unit.rpartition(".")
    names = [unit]
    if "@" in stem:
        template = stem.split("@", 1)[0] + "@"
        names.append(f"{template}.{suffix}")
        base = template[:-1]
    else:
        base = stem
    prefix = base
    while "-" in prefix.rstrip("-"):
        prefix = prefix.rstrip("-").rsplit("-", 1)[0] + "-"
        names.append(f"{prefix}.{suffix}")
    names.append(suffix)  # service.d, slice.d
    return [f"{name}.d" for name in names]


@dataclass(frozen=True)
class Entry:
    """One file systemd would consider: ``kind`` file, link (its target) or unreadable."""

    path: str
    kind: str
    target: str = ""
    reason: str = ""


def _listdir(root: str, path: str, unread: list, quiet_links: bool = False) -> Optional[dict]:
    """{name: Entry} of the directory ``path`` below ``root``; None when absent or unreadable.

    A drop-in directory reached through a link is listed at its target below the root (as
    systemd follows it): its entries are links (``Entry.target``) that ``_read`` follows; a
    target out of the root or a loop is reported in ``unread``. A directory of the load path
    itself reached through a link (``quiet_links``, e.g. a merged-/usr link) is not listed.
    """
    try:
        fd = files.open_dir(root, path, _fail)
    except NumaTuneError as exc:
        if quiet_links and "symbolic link" in str(exc):
            return None
        if "symbolic link" in str(exc):
            return _listdir_linked(root, path, unread)
        unread.append({"path": path, "reason": str(exc)})
        return None
    if fd is None:
        return None
    found = {}
    try:
        for name in sorted(os.listdir(fd)):
            full = posixpath.join(path, name)
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    found[name] = Entry(full, "link", os.readlink(name, dir_fd=fd))
                elif stat.S_ISREG(info.st_mode):
                    found[name] = Entry(full, "file")
                elif stat.S_ISDIR(info.st_mode):
                    found[name] = Entry(full, "dir")
                else:
                    found[name] = Entry(full, "other", reason="is not a regular file")
            except OSError as exc:
                found[name] = Entry(full, "unreadable", reason=exc.strerror or "cannot be read")
    except OSError as exc:
        unread.append({"path": path, "reason": exc.strerror or "cannot be listed"})
        return None
    finally:
        os.close(fd)
    return found


def resolve_in_root(root: str, path: str) -> Optional[str]:
    """``path`` below ``root`` with every link in it followed below the root; None when absent.

    A link's absolute target is taken below ``root`` (as systemd sees it in that tree); ``..``
    may not leave ``root`` (except when ``root`` is ``/``, where ``/..`` is ``/``). Raises
    NumaTuneError for a target outside the root, a loop (more than 40 links) or a component
    that cannot be examined.
    """
    top = os.path.realpath(root) == "/"
    root = os.path.normpath(root)
    pending = [part for part in path.split("/") if part and part != "."]
    done: list = []
    links = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            if done:
                done.pop()
            elif not top:
                raise _fail(path, f"leads out of the root {root}, which numafleet does not follow")
            continue
        real = os.path.join(root, *done, name)
        try:
            info = os.lstat(real)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _fail(path, exc.strerror or "cannot be examined") from None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise _fail(path, "too many levels of symbolic links (a loop)")
            target = os.readlink(real)
            if target.startswith("/"):
                done = []
            pending = [part for part in target.split("/") if part and part != "."] + pending
            continue
        done.append(name)
    return "/" + "/".join(done)


def read_in_root(root: str, path: str) -> tuple:
    """(text or None when absent, the path read) of ``path`` below ``root``, links followed
    below the root (``resolve_in_root``). Raises NumaTuneError when it cannot be read."""
    resolved = resolve_in_root(root, path)
    if resolved is None:
        return None, path
    data = files.read_file(root, resolved, _fail, limit=_READ_LIMIT)
    return (None if data is None else decode(data)), resolved


def _listdir_linked(root: str, path: str, unread: list) -> Optional[dict]:
    """``_listdir`` of a directory reached through a link: {name: Entry(kind link)}."""
    try:
        resolved = resolve_in_root(root, path)
        if resolved is None:
            return None
        listed = _listdir(root, resolved, unread)
    except NumaTuneError as exc:
        reason = str(exc)
        if reason.startswith(f"{path}: "):
            reason = reason[len(path) + 2 :]
        unread.append({"path": path, "reason": f"is reached through a symbolic link: {reason}"})
        return None
    if listed is None:
        return None
    return {
        name: Entry(
            posixpath.join(path, name),
            "link" if entry.kind in ("file", "link") else entry.kind,
            entry.target if entry.kind == "link" else entry.path,
            entry.reason,
        )
        for name, entry in listed.items()
    }


def _read(root: str, entry: Entry, overlay: dict, unread: list, links: dict) -> Optional[str]:
    """The text of ``entry`` (``overlay`` first); None for a mask or what cannot be read.

    A link is followed below the root (``links`` gets {link: target read}); a dangling one is
    reported as ignored (systemd ignores it)."""
    if entry.path in overlay:
        return overlay[entry.path]
    if entry.kind == "link":
        if entry.target == _DEV_NULL:
            return None
        try:
            text, read = read_in_root(root, entry.path)
        except NumaTuneError as exc:
            reason = str(exc)
            if reason.startswith(f"{entry.path}: "):
                reason = reason[len(entry.path) + 2 :]
            unread.append(
                {"path": entry.path, "reason": f"is a symbolic link to {entry.target}: {reason}"}
            )
            return None
        if text is None:
            unread.append(
                {
                    "path": entry.path,
                    "reason": f"is a symbolic link to {entry.target}, which does not exist: "
                    "systemd ignores it",
                    "ignored": True,
                }
            )
            return None
        links[entry.path] = read
        return text
    if entry.kind != "file":
        unread.append({"path": entry.path, "reason": entry.reason or f"is a {entry.kind}"})
        return None
    try:
        data = files.read_file(root, entry.path, _fail, limit=_READ_LIMIT)
    except NumaTuneError as exc:
        unread.append({"path": entry.path, "reason": str(exc)})
        return None
    return None if data is None else decode(data)


@dataclass
class UnitFiles:
    """What systemd reads for one unit: fragment, drop-ins in apply order, masks, unread files."""

    unit: str
    fragment: Optional[str] = None
    masked: Optional[str] = None
    dropins: list = field(default_factory=list)
    documents: list = field(default_factory=list)
    masked_dropins: list = field(default_factory=list)
    unread: list = field(default_factory=list)
    links: dict = field(default_factory=dict)


def find_unit_files(
    root: str,
    unit: str,
    overlay: Optional[dict] = None,
    unit_path=SYSTEM_UNIT_PATH,
    disk: Optional[dict] = None,
) -> UnitFiles:
    """The files systemd reads for the system unit ``unit`` below ``root``, in systemd's order.

    ``overlay`` {host path: text or None}: files as they will be (our planned files; None =
    removed), taking the place of what is on disk. ``disk`` caches directory listings between
    calls for the same root. Never raises for a file it cannot read: it is listed in ``unread``.
    """
    overlay = dict(overlay or {})
    found = UnitFiles(unit)
    listings = {}
    disk = {} if disk is None else disk

    def listing(path: str) -> dict:
        if path not in listings:
            if path not in disk:
                problems: list = []
                disk[path] = (_listdir(root, path, problems, path in unit_path) or {}, problems)
            entries, problems = disk[path]
            found.unread.extend(problems)
            entries = dict(entries)
            for over, text in overlay.items():
                if posixpath.dirname(over) == path:
                    name = posixpath.basename(over)
                    if text is None:
                        entries.pop(name, None)
                    else:
                        entries[name] = Entry(over, "file")
            listings[path] = entries
        return listings[path]

    stem = unit.rpartition(".")[0]
    names = [unit]
    if "@" in stem and not stem.endswith("@"):
        names.append(stem.split("@", 1)[0] + "@." + unit.rpartition(".")[2])
    for name in names:
        for directory in unit_path:
            entry = listing(directory).get(name)
            if entry is None or entry.kind == "dir":
                continue
            text = _read(root, entry, overlay, found.unread, found.links)
            if (
                entry.kind == "link"
                and entry.target == _DEV_NULL
                or (text is not None and not text.strip() and entry.kind == "file")
            ):
                found.masked = entry.path
            elif text is not None:
                found.fragment = entry.path
                found.documents.append((entry.path, text))
            break
        if found.fragment or found.masked:
            break
    chosen: dict = {}
    for directory in unit_path:
        for dirname in dropin_dir_names(unit):
            dpath = posixpath.join(directory, dirname)
            if dirname not in listing(directory) and not any(
                posixpath.dirname(over) == dpath for over in overlay
            ):
                continue
            for name, entry in sorted(listing(dpath).items()):
                if not name.endswith(".conf") or name.startswith(".") or entry.kind == "dir":
                    continue
                if name in chosen:
                    found.masked_dropins.append(entry.path)
                    continue
                chosen[name] = entry
    for name in sorted(chosen):
        entry = chosen[name]
        text = _read(root, entry, overlay, found.unread, found.links)
        if text is None:
            continue
        found.dropins.append(entry.path)
        found.documents.append((entry.path, text))
    return found


# --- comparing with the plan -------------------------------------------------------------------


def planned_properties(unit: str, own_texts: list) -> dict:
    """{property: value} numafleet sets for ``unit``: every key its own files assign in
    ``[Unit]`` and the type section (``Environment.NAME`` per variable), merged."""
    suffix = "." + unit.rpartition(".")[2]
    merged = merge(own_texts, suffix)
    assigned = set()
    for dummy, text in own_texts:
        for section, key, value in parse_assignments(text):
            if section in _SECTIONS.get(suffix, ()):
                if key == "Environment":
                    assigned.update(
                        f"Environment.{w.partition('=')[0]}" for w in split_words(value) if "=" in w
                    )
                elif key not in ENV_LISTS:
                    assigned.add(key)
    return {prop: merged[prop][0] for prop in merged if prop in assigned}


def _device_entries(value: Optional[str]) -> set:
    return {item.strip() for item in (value or "").split(" ; ") if item.strip()}


def in_effect(prop: str, planned: Optional[str], effective_value: Optional[str]) -> bool:
    """Whether the effective value is the planned one; a dependency when it lists every planned
    unit (more are harmless); DeviceAllow when it allows every planned device and no other DRM
    device."""
    if prop in DEPENDENCIES:
        return set((planned or "").split()) <= set((effective_value or "").split())
    if prop in DEVICE_LISTS:
        want, have = _device_entries(planned), _device_entries(effective_value)
        wider = [entry for entry in have - want if entry.startswith(_DRM_DEVICES)]
        return want <= have and not wider
    return planned == effective_value


def shown(value: Optional[str]) -> str:
    """A value for messages: ``(unset)`` for None, ``(empty)`` for "", controls escaped."""
    if value is None:
        return "(unset)"
    return escape_text(value) if value != "" else "(empty)"


_REVERTED = re.compile(r"^/(etc|run)/systemd/system(\.control)?/(?P<dir>[^/]+)\.d/[^/]+$")


def fix_text(unit: str, source: str, detail: str = "") -> str:
    """What removes the foreign setting, for the file that sets it (``source``).

    ``systemctl revert UNIT`` removes only ``UNIT.d/`` drop-ins in /etc and /run (with
    ``system.control``); a prefix (``numafleet-.service.d/``), type (``service.d/``), template or
    /usr/lib drop-in stays: remove it, or mask it for this unit with a /dev/null link of the same
    name in ``UNIT.d/`` (of /etc/systemd/system, or of the same directory where that one ranks
    higher), which the more specific or higher-priority directory makes win."""
    if source == SHOW_SOURCE:
        return (
            f"find what sets it with systemctl cat {unit} and systemctl show {unit} (a "
            "daemon-reload may be owed)"
        )
    if source == "(no file)":
        return "run site.yml to write the plan's units"
    path = escape_text(source)
    if detail.startswith(("is a symbolic link", "link to ")):
        what = "remove the link"
    else:
        what = "remove that file"
    if detail.startswith(("EnvironmentFile=", "UnsetEnvironment=")):
        what = f"remove the {detail.split('=', 1)[0]}= line from {path}, or that file"
    match = _REVERTED.match(source)
    if match and match.group("dir") == unit:
        return (
            f"{what} (or run systemctl revert {unit}, which removes the unit's drop-ins in /etc "
            "and /run, numafleet's own too: run site.yml again after it)"
        )
    parent = posixpath.dirname(source)
    if parent.endswith(".d"):
        scope = posixpath.basename(parent)[:-2]
        top = posixpath.dirname(parent)
        if top not in SYSTEM_UNIT_PATH[:4]:
            top = "/etc/systemd/system"  # above /run and /usr/lib in the load path
        mask = posixpath.join(top, f"{unit}.d", posixpath.basename(source))
        return (
            f"{what}; systemctl revert does not remove it (it is a drop-in of {scope}, read for "
            f"{unit}); to keep it for other units, mask it for this one with a link to /dev/null "
            f"of the same name in the unit's own drop-in directory: ln -s /dev/null "
            f"{escape_text(mask)}"
        )
    return what


@dataclass(frozen=True)
class Override:
    """A planned property whose effective value differs, set by a file numafleet did not write.

    ``property`` UNREADABLE: a file systemd reads for the unit that numafleet could not read
    (``detail`` says why); ``detail`` otherwise says how the file sets the value (an
    environment file, UnsetEnvironment=, the target of a link)."""

    unit: str
    property: str
    planned: Optional[str]
    effective: Optional[str]
    source: str
    dropins: tuple = ()
    detail: str = ""

    def as_dict(self) -> dict:
        """{unit, property, planned, effective, source} (+ dropins for systemctl show, + detail)."""
        out = {
            "unit": self.unit,
            "property": self.property,
            "planned": self.planned,
            "effective": self.effective,
            "source": self.source,
        }
        if self.dropins:
            out["dropins"] = list(self.dropins)
        if self.detail:
            out["detail"] = self.detail
        return out

    def message(self, host: str = "") -> str:
        """The warning: unit, property, planned and effective value, the file, and the fix."""
        who = f"host {host}: " if host else ""
        where = escape_text(self.source)
        fix = fix_text(self.unit, self.source, self.detail)
        tail = "then systemctl daemon-reload and restart the unit"
        if self.property == UNREADABLE:
            return (
                f"{who}{self.unit}: systemd reads {where}, which numafleet cannot read "
                f"({escape_text(self.detail)}), so the planned settings may not be in effect: "
                f"make it readable or {fix}, {tail}"
            )
        if self.detail:
            where += f" ({escape_text(self.detail)})"
        if self.dropins:
            where += f" (drop-ins: {', '.join(escape_text(d) for d in self.dropins)})"
        return (
            f"{who}{self.unit}: {self.property} is {shown(self.effective)}, planned "
            f"{shown(self.planned)}, set by {where}, which numafleet did not write and does not "
            f"remove: {fix}, {tail}"
        )


def evaluate_unit(
    root: str,
    unit: str,
    own: dict,
    overlay: Optional[dict] = None,
    unit_path=SYSTEM_UNIT_PATH,
    disk: Optional[dict] = None,
) -> tuple:
    """(effective entry, [Override]) of ``unit``.

    ``own`` {host path: text} are numafleet's files for the unit as planned; ``overlay`` maps
    every planned or removed path to its planned text (None = removed), so that check mode
    judges the state after the apply. The entry: {unit, fragment, dropins, masked,
    masked_dropins, unread: [{path, reason, via?, ignored?}], links: {link: target read},
    properties: {property: {planned, effective, source, ok, detail?}}}. Every unread file not
    ``ignored`` is also an Override UNREADABLE.
    """
    merged_overlay = dict(overlay or {})
    merged_overlay.update(own)
    found = find_unit_files(root, unit, merged_overlay, unit_path, disk)
    suffix = "." + unit.rpartition(".")[2]
    planned = planned_properties(unit, sorted(own.items()))
    details: dict = {}
    env_unread: list = []

    def read_env(path: str) -> tuple:
        if not path.startswith("/"):
            raise _fail(path, "is not an absolute path; systemd ignores it")
        if any(char in path for char in "*?["):
            raise _fail(path, "is a wildcard, which numafleet does not expand")
        text, read = read_in_root(root, path)
        return (None if text is None else parse_env_file(text)), read

    effective = merge(found.documents, suffix, read_env, details, env_unread)
    found.unread.extend(env_unread)
    properties, overrides = {}, []
    for prop in sorted(planned):
        value, source = effective.get(prop, (None, None))
        ok = in_effect(prop, planned[prop], value)
        detail = details.get(prop, "")
        if not detail and source in found.links:
            detail = f"link to {found.links[source]}"
        source = source and escape_text(source)
        properties[prop] = {
            "planned": planned[prop],
            "effective": value,
            "source": source,
            "ok": ok,
        }
        if detail:
            properties[prop]["detail"] = detail
        if not ok:
            overrides.append(
                Override(unit, prop, planned[prop], value, source or "(no file)", (), detail)
            )
    if found.masked:
        overrides.insert(0, Override(unit, "LoadState", "loaded", "masked", found.masked))
    for item in found.unread:
        if not item.get("ignored"):
            reason = escape_text(str(item.get("reason")))
            if item.get("via"):
                reason = f"{reason} (EnvironmentFile= of {escape_text(item['via'])})"
            overrides.append(
                Override(unit, UNREADABLE, None, None, escape_text(item["path"]), (), reason)
            )
    entry = {
        "unit": unit,
        "fragment": found.fragment and escape_text(found.fragment),
        "dropins": [escape_text(path) for path in found.dropins],
        "masked": found.masked and escape_text(found.masked),
        "masked_dropins": sorted(escape_text(path) for path in found.masked_dropins),
        "unread": [
            {key: escape_text(val) if isinstance(val, str) else val for key, val in item.items()}
            for item in found.unread
        ],
        "links": {escape_text(k): escape_text(v) for k, v in found.links.items()},
        "properties": properties,
    }
    foreign = [item for item in overrides if item.source not in own]
    return entry, foreign


def evaluate(
    root: str, desired: dict, overlay: Optional[dict] = None, unit_path=SYSTEM_UNIT_PATH
) -> tuple:
    """([effective entry per unit], [Override]) of every unit ``desired`` renders.

    ``desired`` is units.render_files' {host path: text}; the unit of a path is its name, or
    ``X`` for ``X.d/50-numafleet.conf``. Sorted by unit.
    """
    by_unit: dict = {}
    for path, text in desired.items():
        parent, base = posixpath.split(path)
        unit = posixpath.basename(parent)[:-2] if parent.endswith(".d") else base
        if "." + unit.rpartition(".")[2] not in _SECTIONS:
            continue  # not a unit: the partition's system.conf.d drop-in (PID 1's settings)
        by_unit.setdefault(unit, {})[path] = text
    entries, foreign, disk = [], [], {}
    for unit in sorted(by_unit):
        entry, overrides = evaluate_unit(root, unit, by_unit[unit], overlay, unit_path, disk)
        entries.append(entry)
        foreign.extend(overrides)
    return entries, foreign


# --- systemctl show ----------------------------------------------------------------------------


def show_argv(systemctl: str, units_: list) -> list:
    """argv of one read-only ``systemctl show`` of SHOW_PROPERTIES for every unit of ``units_``."""
    return [systemctl, "show", "--no-pager", "-p", ",".join(SHOW_PROPERTIES)] + list(units_)


def parse_show(text: str) -> dict:
    """{unit Id: {property: raw value}} of ``systemctl show -p ...`` output (blocks per unit)."""
    blocks, current = {}, {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if current.get("Id"):
                blocks[current["Id"]] = current
            current = {}
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    return blocks


def compare_live(entries: list, shown_units: dict, own_paths, skip_units=()) -> list:
    """[Override] of the live values (``parse_show``) against each entry's planned properties.

    Units in ``skip_units`` (numafleet changes their files in this run) and units not loaded are
    skipped, and so are properties the output does not hold (an older systemd); a property the
    file comparison already reported is not reported again. Each entry gains ``live``
    {property: value}.
    """
    out = []
    for entry in entries:
        unit = entry["unit"]
        data = shown_units.get(unit)
        if data is None or data.get("LoadState") != "loaded" or unit in skip_units:
            continue
        env = {}
        for word in split_words(data.get("Environment", "")):
            name, sep, value = word.partition("=")
            if sep:
                env[f"Environment.{name}"] = value
        live = {}
        dropins = tuple(
            path for path in split_words(data.get("DropInPaths", "")) if path not in own_paths
        )
        for prop, item in entry["properties"].items():
            if prop.startswith("Environment."):
                if "Environment" not in data:
                    continue  # not shown: nothing to compare
                value = env.get(prop)
                pair = f"{prop[len('Environment.') :]}={item['planned']}"
                if value != item["planned"] and pair in data["Environment"]:
                    value = item["planned"]  # shown unquoted with its spaces
            else:
                if prop not in data:
                    continue  # a property this systemd does not know (older releases)
                value = normalise(prop, data[prop])
                if prop in SETS and value == "":
                    value = None
            live[prop] = value
            if value != item["planned"] and item["ok"]:
                out.append(Override(unit, prop, item["planned"], value, SHOW_SOURCE, dropins))
        entry["live"] = live
    return out


def effective_state(
    root: str,
    desired: dict,
    overlay: dict,
    pending_units=(),
    show: Optional[Callable] = None,
) -> dict:
    """{"effective": [...], "foreign_overrides": [...]} for the units layer result.

    ``show(units) -> text or None`` runs ``systemctl show`` on a live host (None in render
    mode); ``pending_units`` are the units whose files this run changes (their live values are
    not compared).
    """
    entries, foreign = evaluate(root, desired, overlay)
    if show is not None and entries:
        text = show([entry["unit"] for entry in entries])
        if text:
            foreign += compare_live(entries, parse_show(text), set(desired), set(pending_units))
    return {"effective": entries, "foreign_overrides": [item.as_dict() for item in foreign]}


def override_message(item: dict, host: str = "") -> str:
    """``Override.message`` of a foreign_overrides entry (as ``Override.as_dict`` gives it)."""
    return Override(
        str(item.get("unit")),
        str(item.get("property")),
        item.get("planned"),
        item.get("effective"),
        str(item.get("source")),
        tuple(item.get("dropins") or ()),
        str(item.get("detail") or ""),
    ).message(host)
