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
- Merging (systemd.syntax(7), systemd.exec(5), systemd.resource-control(5)): single-value
  settings (NUMAPolicy=, Slice=) - the last assignment wins, an empty one resets to the default;
  CPUAffinity=, NUMAMask=, AllowedCPUs=, AllowedMemoryNodes= - assignments are merged (union),
  an empty assignment resets; Environment= - words accumulate, a later assignment of a
  variable overrides an earlier one, an empty assignment resets the list. EnvironmentFile= is
  not read.

Nothing is read through a link (files.open_dir walks each directory without following links; a
link in a unit directory is reported, except the /dev/null links that mask). A file that cannot
be read is reported in ``unread``, never raised.

On a live host, ``show_argv`` / ``parse_show`` give the same properties as the running service
manager has loaded them (``systemctl show``): CPUAffinity/NUMAMask/AllowedCPUs/
AllowedMemoryNodes as cpulists ("0-3 8" or "0-3,8"), NUMAPolicy as a word, Environment as
space-separated, possibly quoted ``K=V`` words.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import files
from .cpulist import format_cpulist, parse_cpulist
from .errors import NumaTuneError

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
# Which verify binding check a differing property fails.
CPU_PROPERTIES = ("CPUAffinity", "AllowedCPUs")
MEM_PROPERTIES = ("NUMAPolicy", "NUMAMask", "AllowedMemoryNodes")
_SECTIONS = {".service": ("Service",), ".slice": ("Slice",)}
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
)
SHOW_SOURCE = "systemctl show"
_DEV_NULL = "/dev/null"
_READ_LIMIT = 1 << 20


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
    return value


@dataclass
class _Setting:
    value: Optional[str] = None
    source: Optional[str] = None


def merge(documents: list, suffix: str) -> dict:
    """{property: (value or None, source path or None)} of ``documents`` [(path, text)] in order.

    Properties: SERVICE_PROPERTIES or SLICE_PROPERTIES by ``suffix``, and ``Environment.NAME``
    per variable. Sets are merged (union) until an empty assignment resets them; the source of a
    set is the last file that assigned it. Values are normalised (``normalise``).
    """
    props = SERVICE_PROPERTIES if suffix == ".service" else SLICE_PROPERTIES
    sections = _SECTIONS.get(suffix, ())
    state = {prop: _Setting() for prop in props}
    sets: dict = {prop: [] for prop in props if prop in SETS}
    env: dict = {}
    for path, text in documents:
        for section, key, value in parse_assignments(text):
            if section not in sections:
                continue
            if key == "Environment" and suffix == ".service":
                if not value:
                    env = {}
                    continue
                for word in split_words(value):
                    name, sep, val = word.partition("=")
                    if sep:
                        env[name] = (val, path)
                continue
            if key not in state:
                continue
            if key in sets:
                if not value:
                    sets[key] = []
                    state[key] = _Setting(None, path)
                else:
                    sets[key].append(value.replace("%%", "%"))
                    state[key] = _Setting(" ".join(sets[key]), path)
            else:
                plain = split_words(value)
                state[key] = _Setting(" ".join(plain) if plain else None, path)
    out = {
        prop: (normalise(prop, setting.value), setting.source) for prop, setting in state.items()
    }
    for name, (value, path) in env.items():
        out[f"Environment.{name}"] = (value, path)
    return out


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

    A directory reached through a link is not listed; it is reported in ``unread`` unless
    ``quiet_links`` (a directory of the load path itself, e.g. a merged-/usr link).
    """
    try:
        fd = files.open_dir(root, path, _fail)
    except NumaTuneError as exc:
        if not (quiet_links and "symbolic link" in str(exc)):
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


def _read(root: str, entry: Entry, overlay: dict, unread: list) -> Optional[str]:
    """The text of ``entry`` (``overlay`` first); None for a mask or what cannot be read."""
    if entry.path in overlay:
        return overlay[entry.path]
    if entry.kind == "link":
        if entry.target == _DEV_NULL:
            return None
        unread.append(
            {
                "path": entry.path,
                "reason": f"is a symbolic link (to {entry.target}), which numafleet does not "
                "follow; its settings are not counted",
            }
        )
        return None
    if entry.kind != "file":
        unread.append({"path": entry.path, "reason": entry.reason or f"is a {entry.kind}"})
        return None
    try:
        data = files.read_file(root, entry.path, _fail, limit=_READ_LIMIT)
    except NumaTuneError as exc:
        unread.append({"path": entry.path, "reason": str(exc)})
        return None
    return None if data is None else data.decode("utf-8", errors="replace")


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
            text = _read(root, entry, overlay, found.unread)
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
        text = _read(root, entry, overlay, found.unread)
        if text is None:
            continue
        found.dropins.append(entry.path)
        found.documents.append((entry.path, text))
    return found


# --- comparing with the plan -------------------------------------------------------------------


def planned_properties(unit: str, own_texts: list) -> dict:
    """{property: value} numafleet sets for ``unit``: what its own files assign, merged."""
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
                else:
                    assigned.add(key)
    return {prop: merged[prop][0] for prop in merged if prop in assigned}


def shown(value: Optional[str]) -> str:
    """A value for messages: ``(unset)`` for None, ``(empty)`` for ""."""
    if value is None:
        return "(unset)"
    return value if value != "" else "(empty)"


@dataclass(frozen=True)
class Override:
    """A planned property whose effective value differs, set by a file numafleet did not write."""

    unit: str
    property: str
    planned: Optional[str]
    effective: Optional[str]
    source: str
    dropins: tuple = ()

    def as_dict(self) -> dict:
        """{unit, property, planned, effective, source} (+ dropins for systemctl show)."""
        out = {
            "unit": self.unit,
            "property": self.property,
            "planned": self.planned,
            "effective": self.effective,
            "source": self.source,
        }
        if self.dropins:
            out["dropins"] = list(self.dropins)
        return out

    def message(self, host: str = "") -> str:
        """The warning: unit, property, planned and effective value, the file, and the fix."""
        who = f"host {host}: " if host else ""
        where = self.source
        if self.dropins:
            where += f" (drop-ins: {', '.join(self.dropins)})"
        return (
            f"{who}{self.unit}: {self.property} is {shown(self.effective)}, planned "
            f"{shown(self.planned)}, set by {where}, which numafleet did not write and does not "
            f"remove: remove that file (or run systemctl revert {self.unit}, which removes every "
            f"drop-in of the unit: run site.yml again after it), then systemctl daemon-reload "
            f"and restart the unit"
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
    judges the state after the apply. The entry: {unit, fragment, dropins, masked, unread,
    properties: {property: {planned, effective, source, ok}}}.
    """
    merged_overlay = dict(overlay or {})
    merged_overlay.update(own)
    found = find_unit_files(root, unit, merged_overlay, unit_path, disk)
    suffix = "." + unit.rpartition(".")[2]
    planned = planned_properties(unit, sorted(own.items()))
    effective = merge(found.documents, suffix)
    properties, overrides = {}, []
    for prop in sorted(planned):
        value, source = effective.get(prop, (None, None))
        ok = value == planned[prop]
        properties[prop] = {
            "planned": planned[prop],
            "effective": value,
            "source": source,
            "ok": ok,
        }
        if not ok:
            overrides.append(Override(unit, prop, planned[prop], value, source or "(no file)"))
    if found.masked:
        overrides.insert(0, Override(unit, "LoadState", "loaded", "masked", found.masked))
    entry = {
        "unit": unit,
        "fragment": found.fragment,
        "dropins": list(found.dropins),
        "masked": found.masked,
        "masked_dropins": sorted(found.masked_dropins),
        "unread": list(found.unread),
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
    ).message(host)
