# Private to this collection: may change in any release.
"""Atomic file writes shared by the modules that write files below a root (units, pools, knobs)."""

from __future__ import annotations

import os
import tempfile
from typing import Callable

from .errors import NumaTuneError


def write_atomic(
    real: str,
    text: str,
    mode: int,
    fail: Callable[[str, str], NumaTuneError],
    dir_mode: int = 0o755,
) -> None:
    """Write ``text`` to the file ``real`` atomically, with ``mode``; raises ``fail(path, reason)``.

    A parent directory that is a symbolic link is refused (nothing is written through a link;
    a link at ``real`` itself is replaced, never followed). Missing parent directories are made
    with ``dir_mode``; the text goes to a temporary file in
    the same directory, is flushed to disk (fsync), gets ``mode`` and replaces ``real`` in one
    rename, so a reader sees the old or the new file, never a part. On an error the temporary
    file is removed and ``fail`` is called with the path that failed (the directory, or the file)
    and the system's reason.
    """
    parent = os.path.dirname(real)
    if os.path.islink(parent):
        # Never write through a link: the file would land wherever the link points.
        raise fail(parent, "is a symbolic link; numafleet writes only into real directories")
    try:
        os.makedirs(parent, mode=dir_mode, exist_ok=True)
        handle, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(real)}.", suffix=".tmp", dir=parent
        )
    except OSError as exc:
        raise fail(parent, exc.strerror or "cannot be created") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except OSError as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise fail(real, exc.strerror or "cannot be written") from None
