# Private to this collection: may change in any release.
"""Controller-side report files (verify_report and drift_report actions): where and how."""

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


# This collection's root directory (plugins/plugin_utils/_reports.py -> ../..).
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_report_dir(cwd: str | None = None) -> str:
    """``<cwd>/reports``: the default of numafleet_report_dir, under the directory ansible-playbook
    runs in (the user's project), never under the collection."""
    return os.path.join(os.path.abspath(cwd or os.getcwd()), "reports")


def installed_collection_holding(path: str, root: str | None = None) -> str | None:
    """The collection's root (``root``, default COLLECTION_ROOT) when ``path`` lies inside an
    installed copy of it, else None.

    An installed collection (``ansible-galaxy collection install``) has a MANIFEST.json at its
    root; a source checkout has none, and its ``reports/`` is git-ignored and never built.
    Links are resolved on both sides.
    """
    real_root = os.path.realpath(root or COLLECTION_ROOT)
    if not os.path.isfile(os.path.join(real_root, "MANIFEST.json")):
        return None
    real = os.path.realpath(path)
    if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
        return real_root
    return None


def inside_collection_problem(what: str, path: str, variable: str, default: str) -> str:
    """'' when ``path`` (a controller directory the run writes) lies outside the installed
    collection, else the message refusing it: ``what`` names the directory (with where it came
    from), ``variable`` the host variable that moves it, ``default`` where it goes by default.
    Runtime output never lands inside an installed collection."""
    inside = installed_collection_holding(path)
    if inside is None:
        return ""
    return (
        f"{what} lies inside the installed collection {inside}; run ansible-playbook from your own "
        f"project directory ({default}) or set {variable} to a directory of your project"
    )
