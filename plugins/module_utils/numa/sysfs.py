# Private to this collection: may change in any release.
"""Tolerant access to a host's sysfs/procfs trees, with warnings and a record of what was read."""

from __future__ import annotations

import os
import stat
from typing import Callable, Optional, TypeVar

from .cpulist import parse_cpulist, parse_cpumask
from .errors import NumaTuneError, TopologyError

T = TypeVar("T")
# Longest reason kept in a warning: a malformed file's text is quoted, never the whole of it.
MAX_REASON = 200
# Most bytes read from one file; sysfs files are one page, /proc/meminfo a few kB.
READ_LIMIT = 1 << 20
# One os.read asks for this much: a read buffer of READ_LIMIT for every small file cost more
# than the rest of the read.
_CHUNK = 1 << 16
# What a file gave: (_OK, text), (_MISSING, None) or (_BAD, reason).
_OK, _MISSING, _BAD = 0, 1, 2


def parse_int(text: str) -> int:
    """Decimal ("-1", "08") or 0x-prefixed hex integer text; raises ValueError."""
    body = text.strip()
    if body.lower().startswith("0x"):
        return int(body[2:], 16)
    return int(body, 10)


class Reader:
    """Reads files under ``sysfs_root`` / ``procfs_root`` and never raises for a bad file.

    A file that cannot be read or parsed becomes an entry in ``warnings`` (``{"path", "reason"}``)
    and the caller gets ``None``. Every path opened, listed or followed is kept in ``accessed``
    (absolute paths), so a capture can copy exactly what the readers used.
    """

    def __init__(
        self, sysfs_root: str = "/sys", procfs_root: str = "/proc", remember: bool = False
    ) -> None:
        self.sysfs_root = os.path.abspath(sysfs_root) if sysfs_root else ""
        self.procfs_root = os.path.abspath(procfs_root) if procfs_root else ""
        self.warnings: list[dict] = []
        self.accessed: set[str] = set()
        # With ``remember``: what each file, listing and link gave, for sibling readers.
        self._share: Optional[dict] = {} if remember else None
        # Parsed CPU sets by (parser, text): many devices repeat their node's local_cpulist.
        self._cpusets: dict = {}
        # Resolved paths by path: every PCI device link shares the directories above it.
        self._resolved: dict = {}

    def sibling(self) -> Reader:
        """A reader of the same roots with its own ``warnings`` and ``accessed``.

        When this reader was made with ``remember=True``, the sibling gets what the files,
        listings and links this reader used gave, without reading them again; the warnings they
        caused are recorded again on the sibling. For two passes of one gathering only: a file
        that changes in between is not seen again.
        """
        twin = Reader(self.sysfs_root, self.procfs_root)
        twin._share = self._share
        twin._cpusets = self._cpusets
        twin._resolved = self._resolved
        return twin

    def sys(self, *parts: str) -> str:
        """Absolute path of ``parts`` under the sysfs root."""
        return os.path.join(self.sysfs_root, *parts)

    def proc(self, *parts: str) -> str:
        """Absolute path of ``parts`` under the procfs root."""
        return os.path.join(self.procfs_root, *parts)

    def warn(self, path: str, reason: str) -> None:
        """Record that ``path`` could not be used, and why."""
        if len(reason) > MAX_REASON:
            reason = reason[: MAX_REASON - 3] + "..."
        entry = {"path": path, "reason": reason}
        if entry not in self.warnings:
            self.warnings.append(entry)

    def _shared(self, kind: str, path: str, ask: Callable[[str], T]) -> T:
        """``ask(path)``, or what it gave a sibling reader for the same path."""
        self.accessed.add(path)
        if self._share is None:
            return ask(path)
        key = (kind, path)
        if key not in self._share:
            self._share[key] = ask(path)
        return self._share[key]

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling link does not); recorded as accessed."""
        return self._shared("exists", path, os.path.exists)

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (or a link to one); recorded as accessed."""
        return self._shared("isdir", path, os.path.isdir)

    def check_roots(self) -> None:
        """Raise TopologyError unless the roots look like a sysfs and a procfs mount.

        A sysfs always has ``devices/system/cpu``; a procfs root must be a directory. A mistyped
        root must fail loudly rather than read as a machine with no CPUs.
        """
        checks = (
            ("sysfs_root", self.sysfs_root, os.path.join("devices", "system", "cpu"), "sys"),
            ("procfs_root", self.procfs_root, "", "proc"),
        )
        for option, root, marker, name in checks:
            wanted = (os.path.join(root, marker) if marker else root) if root else ""
            self.accessed.add(wanted)
            if not wanted or not os.path.isdir(wanted):
                raise TopologyError(
                    wanted or "(empty path)",
                    f"no such directory, so {option}={root!r} is not a {name} tree. Point "
                    f"{option} at the host's /{name}, or at the {name}/ directory of an unpacked "
                    "capture",
                )

    def text(self, path: str, optional: bool = False) -> Optional[str]:
        """File content with trailing NULs and whitespace removed; None (and a warning) on error.

        With ``optional=True`` a missing file is not a warning: older kernels lack many files.
        """
        self.accessed.add(path)
        share = self._share
        if share is None:
            kind, value = _read_text(path)
        else:
            outcome = share.get(("text", path))
            if outcome is None:
                outcome = share[("text", path)] = _read_text(path)
            kind, value = outcome
        if kind == _OK:
            return value
        if kind == _BAD:
            self.warn(path, value)
        elif not optional:
            self.warn(path, "missing")
        return None

    def parsed(self, path: str, parse: Callable[[str], T], optional: bool = False) -> Optional[T]:
        """``parse(text)`` of the file, or None with a warning when it is unreadable or malformed."""
        text = self.text(path, optional=optional)
        if text is None:
            return None
        try:
            return parse(text)
        except NumaTuneError as exc:
            self.warn(path, str(exc))
        except ValueError as exc:
            self.warn(path, f"malformed: {exc}")
        return None

    def integer(self, path: str, optional: bool = False) -> Optional[int]:
        """Decimal (or 0x-prefixed hex) integer in the file, or None with a warning."""
        return self.parsed(path, parse_int, optional=optional)

    def cpulist(self, path: str, optional: bool = False) -> Optional[list[int]]:
        """Sorted CPUs of a cpulist file, or None with a warning."""
        return self._cpuset(path, parse_cpulist, optional)

    def cpumask(self, path: str, optional: bool = False) -> Optional[list[int]]:
        """Sorted CPUs of a cpumask file, or None with a warning."""
        return self._cpuset(path, parse_cpumask, optional)

    def _cpuset(self, path: str, parse: Callable, optional: bool) -> Optional[list[int]]:
        """As parsed(), remembering each text that parsed; every caller gets its own list."""

        def remembered(text: str) -> list[int]:
            known = self._cpusets.get((parse, text))
            if known is None:
                known = self._cpusets[(parse, text)] = tuple(parse(text))
            return list(known)

        return self.parsed(path, remembered, optional=optional)

    def listdir(self, path: str, optional: bool = False) -> list[str]:
        """Sorted entry names of a directory; [] (and a warning unless optional) on error."""
        kind, value = self._shared("listdir", path, _list_names)
        if kind == _OK:
            return list(value)
        if kind == _BAD:
            self.warn(path, value)
        elif not optional:
            self.warn(path, "missing")
        return []

    def realpath(self, path: str) -> str:
        """Symlink-resolved path (as os.path.realpath), keeping the link itself in ``accessed``.

        The directories resolved on the way are remembered for the reader's later calls.
        """
        self.accessed.add(path)
        if not os.path.isabs(path) or os.path.normpath(path) != path:
            return os.path.realpath(path)
        resolved = _resolve(path, self._resolved, set())
        return os.path.realpath(path) if resolved is None else resolved


def _read_text(path: str) -> tuple:
    """(_OK, text without trailing NULs and whitespace), (_MISSING, None) or (_BAD, reason).

    Anything but a regular file (a FIFO or a device would block or stream) is refused before
    it is opened. Reads up to READ_LIMIT bytes, _CHUNK at a time, until end of file; a file
    whose size the stat gave (a recorded tree on disk; sysfs says 4096 and procfs 0 whatever
    the content) is complete once that many bytes are read.
    """
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return _BAD, "not a regular file"
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = os.read(fd, _CHUNK)
            if raw and not 0 < info.st_size <= len(raw) < _CHUNK:
                chunks, left = [raw], READ_LIMIT - len(raw)
                while left > 0:
                    chunk = os.read(fd, min(left, _CHUNK))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    left -= len(chunk)
                raw = b"".join(chunks)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return _MISSING, None
    except OSError as exc:
        return _BAD, exc.strerror or "cannot be read"
    return _OK, raw.decode("utf-8", errors="replace").replace("\0", "").strip()


def _resolve(path: str, known: dict, pending: set) -> Optional[str]:
    """os.path.realpath(path) of an absolute normalised path, one component at a time.

    ``known`` maps paths to what they resolved to (a resolved path resolves to itself), so a
    link in a directory resolved before costs one lstat. None on a symlink loop or an unreadable
    link: the caller asks os.path.realpath, which handles those its own way.
    """
    found = known.get(path)
    if found is not None:
        return found
    parent, name = os.path.split(path)
    if not name:
        return path
    base = _resolve(parent, known, pending)
    if base is None:
        return None
    candidate = os.path.join(base, name)
    try:
        is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
    except OSError:
        is_link = False
    if is_link:
        if candidate in pending:
            return None
        pending.add(candidate)
        try:
            target = os.readlink(candidate)
        except OSError:
            return None
        base = os.sep if target.startswith(os.sep) else base
        for part in target.split(os.sep):
            if part in ("", os.curdir):
                continue
            if part == os.pardir:
                base = os.path.dirname(base)
                continue
            base = _resolve(os.path.join(base, part), known, pending)
            if base is None:
                return None
        pending.discard(candidate)
        candidate = base
    known[path] = candidate
    known[candidate] = candidate
    return candidate


def _list_names(path: str) -> tuple:
    """(_OK, sorted names), (_MISSING, None) or (_BAD, reason) of a directory listing."""
    try:
        return _OK, tuple(sorted(os.listdir(path)))
    except FileNotFoundError:
        return _MISSING, None
    except OSError as exc:
        return _BAD, exc.strerror or "cannot be listed"
