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

    def __init__(self, sysfs_root: str = "/sys", procfs_root: str = "/proc") -> None:
        self.sysfs_root = os.path.abspath(sysfs_root) if sysfs_root else ""
        self.procfs_root = os.path.abspath(procfs_root) if procfs_root else ""
        self.warnings: list[dict] = []
        self.accessed: set[str] = set()

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

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling link does not); recorded as accessed."""
        self.accessed.add(path)
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (or a link to one); recorded as accessed."""
        self.accessed.add(path)
        return os.path.isdir(path)

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
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device would block or stream
                self.warn(path, "not a regular file")
                return None
            with open(path, "rb") as handle:
                raw = handle.read(1 << 20)
        except FileNotFoundError:
            if not optional:
                self.warn(path, "missing")
            return None
        except OSError as exc:
            self.warn(path, exc.strerror or "cannot be read")
            return None
        return raw.decode("utf-8", errors="replace").replace("\0", "").strip()

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
        return self.parsed(path, parse_cpulist, optional=optional)

    def cpumask(self, path: str, optional: bool = False) -> Optional[list[int]]:
        """Sorted CPUs of a cpumask file, or None with a warning."""
        return self.parsed(path, parse_cpumask, optional=optional)

    def listdir(self, path: str, optional: bool = False) -> list[str]:
        """Sorted entry names of a directory; [] (and a warning unless optional) on error."""
        self.accessed.add(path)
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            if not optional:
                self.warn(path, "missing")
        except OSError as exc:
            self.warn(path, exc.strerror or "cannot be listed")
        return []

    def realpath(self, path: str) -> str:
        """Symlink-resolved path, keeping the link itself in ``accessed``."""
        self.accessed.add(path)
        return os.path.realpath(path)
