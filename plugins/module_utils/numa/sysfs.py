# Private to this collection: may change in any release.
"""Tolerant access to a host's sysfs/procfs trees, with warnings and a record of what was read."""

from __future__ import annotations

import errno
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
# What a file or listing gave: (_OK, value), (_MISSING, None) or (_BAD, reason); a file that
# read is given as its text alone (a str: no tuple to allocate and keep for each file read).
_OK, _MISSING, _BAD = 0, 1, 2
_GONE = (_MISSING, None)
_NOT_REGULAR = (_BAD, "not a regular file")
# Files the kernel never writes: read as unreadable (None and a warning), never as empty text.
_NUL_ONLY = (_BAD, "holds only NUL bytes (the kernel never writes that): not used")
_NUL_INSIDE = (_BAD, "holds NUL bytes inside its text (the kernel never writes that): not used")
# st_mode & _FILE_TYPE == _REGULAR is stat.S_ISREG(st_mode), without the call.
_FILE_TYPE, _REGULAR, _LINK = 0o170000, stat.S_IFREG, stat.S_IFLNK


def parse_int(text: str) -> int:
    """Decimal ("-1", "08") or 0x-prefixed hex integer text; raises ValueError."""
    if text.isdigit() and text.isascii():  # the common case: plain decimal digits
        return int(text)
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
        # With ``remember``: what each file, listing and link gave, for sibling readers; the
        # files' outcomes by path in ``_texts`` (the most asked), the rest by (kind, path).
        self._share: Optional[dict] = {} if remember else None
        self._texts: Optional[dict] = {} if remember else None
        # Without ``remember``: outcomes exists_given() read ahead, for text() to take.
        self._ahead: dict = {}
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
        twin._texts = self._texts
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

    def exists_given(self, path: str, witness: str) -> bool:
        """exists(path), where ``witness`` is a file under ``path`` that the caller reads next.

        A file that reads lies in an existing directory: then no stat of ``path`` is needed.
        ``witness`` is read ahead (not recorded as accessed, no warning) for text() to use.
        """
        texts = self._texts
        if texts is None:
            outcome = self._ahead[witness] = _read_text(witness)
        else:
            outcome = texts.get(witness)
            if outcome is None:
                outcome = texts[witness] = _read_text(witness)
        if isinstance(outcome, str):
            self.accessed.add(path)
            return True
        self._ahead.pop(witness, None)
        return self.exists(path)

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

    def text(self, path: str, optional: bool = False, at: Optional[str] = None) -> Optional[str]:
        """File content with trailing NULs and whitespace removed; None (and a warning) on error.

        A file of NUL bytes alone, or with NULs inside its text, is an error (the kernel never
        writes one): never empty text, which a CPU-less node's cpulist legitimately is.

        With ``optional=True`` a missing file is not a warning: older kernels lack many files.
        ``at`` is the same file's name without links on the way (see resolved()), opened
        instead of ``path``, which is what is recorded, remembered and warned about.
        """
        self.accessed.add(path)
        texts = self._texts
        if texts is None:
            outcome = self._ahead.pop(path, None)
            if outcome is None:
                outcome = _read_text(path if at is None else at)
        else:
            outcome = texts.get(path)
            if outcome is None:
                outcome = texts[path] = _read_text(path if at is None else at)
        if isinstance(outcome, str):
            return outcome
        kind, value = outcome
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

    def integer(self, path: str, optional: bool = False, at: Optional[str] = None) -> Optional[int]:
        """Decimal (or 0x-prefixed hex) integer in the file, or None with a warning."""
        text = self.text(path, optional, at)
        if text is None:
            return None
        try:
            return parse_int(text)
        except ValueError as exc:  # parse_int raises nothing else
            self.warn(path, f"malformed: {exc}")
        return None

    def cpulist(self, path: str, optional: bool = False) -> Optional[list[int]]:
        """Sorted CPUs of a cpulist file, or None with a warning."""
        known = self.cpuset(path, parse_cpulist, optional)
        return None if known is None else list(known)

    def cpumask(self, path: str, optional: bool = False) -> Optional[list[int]]:
        """Sorted CPUs of a cpumask file, or None with a warning."""
        known = self.cpuset(path, parse_cpumask, optional)
        return None if known is None else list(known)

    def cpuset(
        self, path: str, parse: Callable, optional: bool = False, at: Optional[str] = None
    ) -> Optional[tuple]:
        """As parsed(path, parse), as a tuple; each text is parsed once for the reader's family.

        The tuple may be shared with other callers (it is immutable); cpulist() and cpumask()
        give each caller its own list. ``at`` as for text(). An empty cpumask file (the
        kernel writes "0" words for no CPU) is a warning and None, as NUL bytes are (see text()).
        """
        text = self.text(path, optional, at)
        if text is None:
            return None
        if not text and parse is parse_cpumask:
            self.warn(path, "is empty; the kernel writes a cpumask as hex words: not used")
            return None
        known = self._cpusets.get((parse, text))
        if known is None:
            try:
                known = tuple(parse(text))
            except NumaTuneError as exc:
                self.warn(path, str(exc))
                return None
            except ValueError as exc:
                self.warn(path, f"malformed: {exc}")
                return None
            self._cpusets[(parse, text)] = known
        return known

    def once(self, key, compute: Callable[[], T]) -> T:
        """``compute()``, run once for this reader and its siblings when made with ``remember``.

        A later call with the same ``key`` (on this reader or a sibling) gives the same value
        (share it, do not change it) and records the paths and warnings the first run recorded,
        as running ``compute`` again on the remembered files would have. Without ``remember``
        it is ``compute()``.
        """
        share = self._share
        if share is None:
            return compute()
        done = share.get(("once", key))
        if done is None:
            outer_accessed, outer_warnings = self.accessed, self.warnings
            self.accessed, self.warnings = set(), []
            try:
                value = compute()
            finally:
                accessed, warnings = self.accessed, self.warnings
                self.accessed, self.warnings = outer_accessed, outer_warnings
                outer_accessed |= accessed
                for entry in warnings:
                    self.warn(entry["path"], entry["reason"])
            share[("once", key)] = (
                value,
                frozenset(accessed),
                tuple((entry["path"], entry["reason"]) for entry in warnings),
            )
            return value
        value, accessed, warnings = done
        self.accessed |= accessed
        for path, reason in warnings:
            self.warn(path, reason)
        return value

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
        known = self._resolved
        found = known.get(path)  # only absolute normalised paths are ever remembered
        if found is not None:
            return found
        plain = path[:1] == "/" and "//" not in path and "/." not in path and path[-1:] != "/"
        if not plain and (not os.path.isabs(path) or os.path.normpath(path) != path):
            return os.path.realpath(path)
        resolved = _resolve_link(path, known)
        if resolved is None:
            resolved = _resolve(path, known, set())
        return os.path.realpath(path) if resolved is None else resolved

    def resolved(self, path: str) -> Optional[str]:
        """What realpath(path) gave by walking the links itself; None when it was not asked or
        left the path to os.path.realpath (a link loop, an unreadable link, a relative path).

        Files under ``path`` are the files under the result: the walk met no link it did not
        follow. Not recorded as accessed.
        """
        return self._resolved.get(path)


def _read_text(path: str, _stat=os.stat, _open=os.open, _read=os.read, _close=os.close) -> tuple:
    """The text without trailing NULs and whitespace, (_MISSING, None) or (_BAD, reason).

    Anything but a regular file (a FIFO or a device would block or stream) is refused before
    it is opened. Reads up to READ_LIMIT bytes, _CHUNK at a time, until end of file; a file
    whose size the stat gave (a recorded tree on disk; sysfs says 4096 and procfs 0 whatever
    the content) is complete once that many bytes are read.
    """
    try:
        info = _stat(path)
        if info.st_mode & _FILE_TYPE != _REGULAR:
            return _NOT_REGULAR
        fd = _open(path, os.O_RDONLY)
        try:
            raw = _read(fd, _CHUNK)
            if raw and not 0 < info.st_size <= len(raw) < _CHUNK:
                chunks, left = [raw], READ_LIMIT - len(raw)
                while left > 0:
                    chunk = _read(fd, min(left, _CHUNK))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    left -= len(chunk)
                raw = b"".join(chunks)
        finally:
            _close(fd)
    except FileNotFoundError:
        return _GONE
    except OSError as exc:
        return _BAD, exc.strerror or "cannot be read"
    text = raw.decode("utf-8", "replace")
    if "\0" in text:
        # NULs after the text are padding some dumps and drivers add ("0-3\n\0", "\n\0" for
        # an empty list). NULs alone, before an empty line or inside the text the kernel never
        # writes: such a file is unreadable, never an empty value.
        padded = text.rstrip("\0")
        if "\0" not in padded:
            return padded.strip() if padded else _NUL_ONLY
        body = text.rstrip("\0 \t\n")
        if not body:
            return _NUL_ONLY
        if "\0" in body:
            return _NUL_INSIDE
        return body.strip()
    return text.strip()


def _resolve_link(path: str, known: dict) -> Optional[str]:
    """_resolve(path, known, set()) for the common case, or None to leave it to _resolve.

    The common case: the directory holding ``path`` is resolved already and ``path`` is a link
    (a device's ``bus/pci/devices`` entry) or not one; one readlink instead of an lstat and a
    readlink. Anything else (an error but "not a link", a path starting with ``//``) is None.
    """
    cut = path.rfind("/")
    parent = path[:cut]
    base = known.get(parent) if cut > 0 and not path.startswith("//") else None
    if base is None or base.startswith("//"):
        return None
    name = path[cut + 1 :]
    candidate = f"{base}/{name}" if base != "/" else f"/{name}"
    try:
        target = os.readlink(candidate)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # only EINVAL says for sure: it is there and no link
            return None
        known[path] = candidate
        known[candidate] = candidate
        return candidate
    pending = {candidate}
    base = "/" if target.startswith("/") else base
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            base = base[: base.rfind("/")] or "/"
            continue
        step = f"{base}/{part}" if base != "/" else f"/{part}"
        found = known.get(step)
        if found is not None:
            base = found
            continue
        # _resolve(step) with its directory ``base`` resolved: one lstat, unless a link.
        try:
            is_link = os.lstat(step).st_mode & _FILE_TYPE == _LINK
        except OSError:
            is_link = False
        if is_link:
            base = _resolve(step, known, pending)
            if base is None:
                return None
        else:
            known[step] = step
            base = step
    known[path] = base
    known[base] = base
    return base


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
