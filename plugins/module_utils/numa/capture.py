# Private to this collection: may change in any release.
"""Recording of a host's topology: exactly the sysfs/procfs entries the readers used, as a tarball."""

from __future__ import annotations

import io
import os
import re
import tarfile
import time

from .errors import TopologyError
from .sysfs import Reader


def _relative(path: str, roots: dict) -> tuple:
    """(top-level name in the archive, path inside it) for a path under one of the roots, or None."""
    for name, root in roots.items():
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return name, os.path.relpath(path, root)
    return None


def plan_capture(reader: Reader) -> list:
    """Sorted archive entries for everything ``reader`` accessed.

    Each entry is ``(kind, archive_name, target)``: kind ``dir``, ``file`` (target = real path to
    read) or ``link`` (target = the link text, kept relative as the kernel writes it). Symlinked
    components along a path (``bus/pci/devices/X``) are kept as links and the files stored at
    their real location, so the recorded tree resolves the same way as the live one.
    """
    given = {"sys": reader.sysfs_root, "proc": reader.procfs_root}
    real_roots = {name: os.path.realpath(root) for name, root in given.items()}
    entries: dict = {}
    for path in sorted(reader.accessed):
        # Readers that resolve links (class/drm/cardN) record real paths: accept both forms.
        located = _relative(path, given) or _relative(path, real_roots)
        if located is None or not os.path.lexists(path):
            continue
        top, rel = located
        current = real_roots[top]
        for part in [] if rel == "." else rel.split(os.sep):
            candidate = os.path.join(current, part)
            name = _archive_name(candidate, real_roots)
            if name is None or not os.path.lexists(candidate):
                current = None
                break
            if os.path.islink(candidate):
                entries[name] = ("link", name, os.readlink(candidate))
                candidate = os.path.realpath(candidate)
            current = candidate
        name = None if current is None else _archive_name(current, real_roots)
        if name is None:
            continue
        kind = "file" if os.path.isfile(current) else "dir"
        entries.setdefault(name, (kind, name, current))
    return sorted(entries.values(), key=lambda entry: entry[1])


def _archive_name(real: str, real_roots: dict):
    located = _relative(real, real_roots)
    if located is None:
        return None
    top, rel = located
    return top if rel == "." else os.path.normpath(os.path.join(top, rel))


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def check_capture_name(name: str) -> str:
    """``name`` if it is a safe top-level directory name for a capture; raises TopologyError."""
    if not _NAME_RE.match(name or "") or ".." in name:
        raise TopologyError(
            f"name={name!r}",
            "a capture's name must be one directory name of letters, digits, '.', '_' and '-' "
            "(usually the inventory hostname); it must not be empty or contain '/' or '..'",
        )
    return name


def write_capture(entries: list, dest: str, prefix: str) -> int:
    """Write the entries as a gzip tarball at ``dest`` under ``prefix/``; returns files stored.

    File contents are read, not stat-sized (sysfs reports 4096 bytes for every file). Files that
    cannot be read (write-only, EIO) are skipped. Raises TopologyError if ``dest`` cannot be written.
    """
    check_capture_name(prefix)
    if not dest:
        raise TopologyError("dest=''", "dest must be the path of the tarball to write")
    stored = 0
    now = int(time.time())
    try:
        # Never through a link at dest; mode 0644 whatever the umask.
        fd = os.open(
            dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as archive:
            for kind, name, target in entries:
                info = tarfile.TarInfo(f"{prefix}/{name}")
                info.mtime = now
                if kind == "link":
                    info.type, info.linkname = tarfile.SYMTYPE, target
                    archive.addfile(info)
                elif kind == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
                else:
                    try:
                        with open(target, "rb") as handle:
                            data = handle.read(1 << 20)
                    except OSError:
                        continue
                    info.size, info.mode = len(data), 0o444
                    archive.addfile(info, io.BytesIO(data))
                    stored += 1
    except OSError as exc:
        raise TopologyError(dest, f"cannot write the capture: {exc.strerror or exc}") from None
    return stored
