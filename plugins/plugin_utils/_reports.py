# Private to this collection: may change in any release.
"""Controller-side report files (verify_report action, drift_report callback)."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0644) through a temporary file in the same directory, then
    rename, so a reader (node_exporter's textfile collector) never sees a partial file.

    Raises OSError; the temporary file is removed on any error.
    """
    handle, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
