# Private to this collection: may change in any release.
"""The running kernel's release (``uname -r``), read from procfs.

Source: ``<procfs_root>/sys/kernel/osrelease`` (the release alone, e.g. ``6.1.0-18-amd64``);
when that file is absent, the first line of ``<procfs_root>/version`` (``Linux version <release>
(builder@host) ...``), which the kernel writes from the same string. Recorded trees of older
capture tools (hwloc-gather-topology) keep only ``/proc/version``.
"""

from __future__ import annotations

import re
from typing import Optional

from .sysfs import Reader

_RELEASE_RE = re.compile(r"^[0-9]+\.[0-9]+[^\s\x00]*\Z")
_VERSION_RE = re.compile(r"^Linux version (\S+)")
OSRELEASE = ("sys", "kernel", "osrelease")
VERSION = ("version",)


def parse_osrelease(text: str) -> str:
    """The release of an osrelease file ('6.1.0-18-amd64'); raises ValueError when the text is
    not 'MAJOR.MINOR...' on one line."""
    release = text.strip()
    if not _RELEASE_RE.match(release):
        raise ValueError(f"{release[:60]!r} is not a kernel release (MAJOR.MINOR...)")
    return release


def parse_proc_version(text: str) -> str:
    """The release named by a /proc/version text ('Linux version 5.15.0-rc1 (...) ...');
    raises ValueError."""
    match = _VERSION_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text.strip()[:60]!r} does not start with 'Linux version <release>'")
    return parse_osrelease(match.group(1))


def read_osrelease(reader: Reader) -> tuple:
    """(release, the file it came from as a host path: "/proc/sys/kernel/osrelease" or
    "/proc/version") of the host behind ``reader``, or (None, None).

    <procfs_root>/sys/kernel/osrelease first, else <procfs_root>/version; both optional (a
    missing file is no warning, a malformed one is). Both reads go through ``reader``, so a
    capture (topology_capture) records the file that was used.
    """
    for parts, parse in ((OSRELEASE, parse_osrelease), (VERSION, parse_proc_version)):
        path = reader.proc(*parts)
        text = reader.text(path, optional=True)
        if text is None:
            if reader.exists(path):  # there but unusable (warned): do not look further
                return None, None
            continue
        try:
            return parse(text), "/" + "/".join(("proc",) + parts)
        except ValueError as exc:
            reader.warn(path, f"malformed: {exc}")
            return None, None
    return None, None


def kernel_facts(reader: Reader) -> dict:
    """{"osrelease": str | None, "osrelease_source": host path | None} (ansible_facts.numa.kernel)."""
    release, source = read_osrelease(reader)
    return {"osrelease": release, "osrelease_source": source}


def release_tuple(release: Optional[str]) -> Optional[tuple]:
    """(major, minor) of a release string, or None."""
    match = re.match(r"^([0-9]+)\.([0-9]+)", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None
