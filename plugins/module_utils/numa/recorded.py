# Private to this collection: may change in any release.
"""What the last apply left on a host: its recorded plan and the digests of the files it owns.

read_recorded() is what numa_facts publishes as ansible_facts.numafleet_recorded (option
recorded_root). The controller reads it to keep placements stable (planner.parse_recorded) and
to say, before any host changes, which units will be started, restarted or stopped
(changes.change_plan). Nothing here trusts the files: a plan file that is a link, not a
regular file, too large or not JSON is reported as ``invalid`` with the reason, never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Optional

from .errors import NumaTuneError
from .units import read_manifest, under_root

PLAN_PATH = "/etc/numafleet/plan.json"
MANIFEST_PATHS = ("/etc/numafleet/manifest.json", "/etc/numafleet/mps-units.json")
# A plan of 1,000 placements is about 2 MiB of JSON: far below this.
MAX_PLAN_BYTES = 64 << 20


def digest(text: str) -> str:
    """sha256 hex digest of a file's text (UTF-8), as read_recorded reports files."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _read_plan(real: str) -> tuple:
    """(state, kind, plan or None, error or None) of the plan file at real.

    kind: absent, file, link (a symbolic link: never trusted, replaced by a file on the next
    write), directory or other (numafleet cannot write a file there).
    """
    try:
        info = os.lstat(real)
    except FileNotFoundError:
        return "absent", "absent", None, None
    except OSError as exc:
        return "invalid", "other", None, f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "invalid", "link", None, "is a symbolic link (numafleet writes a regular file there)"
    if stat.S_ISDIR(info.st_mode):
        return (
            "invalid",
            "directory",
            None,
            "is a directory (numafleet writes a regular file there)",
        )
    if not stat.S_ISREG(info.st_mode):
        return "invalid", "other", None, "is not a regular file"
    if info.st_size > MAX_PLAN_BYTES:
        return "invalid", "file", None, f"is {info.st_size} bytes, more than a plan can be"
    try:
        with open(real, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return "invalid", "file", None, f"cannot be read ({exc})"
    except ValueError as exc:
        return "invalid", "file", None, f"is not JSON ({exc})"
    if not isinstance(data, dict):
        return "invalid", "file", None, "is not a JSON object"
    return "present", "file", data, None


def _file_digest(real: str) -> Optional[str]:
    """Digest of the file at real as the apply modules read it (a link is followed); None when
    absent, 'other' when it is no regular file (a directory, a dangling link), 'unreadable'."""
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return "other" if os.path.lexists(real) else None
    except OSError:
        return "unreadable"
    if not stat.S_ISREG(info.st_mode):
        return "other"
    try:
        with open(real, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return "unreadable"


def read_recorded(root: str, plan_path: str = PLAN_PATH, manifest_paths=MANIFEST_PATHS) -> dict:
    """ansible_facts.numafleet_recorded below root ("/" = the host itself); never raises for content.

    Shape: {"root", "plan_path", "state": absent|present|invalid, "kind": absent|file|link|
    directory|other, "error": str|None, "plan": dict|None, "files": {host path: sha256 hex (a
    link followed, as the apply modules read it), None (absent), "other" or "unreadable"} for
    every file a manifest lists, plus each manifest path itself,
    "manifest_errors": [str]}. A malformed manifest is named in manifest_errors (the apply
    modules refuse it with the fix); its files are then unknown.
    """
    state, kind, plan, error = _read_plan(under_root(root, plan_path))
    files: dict = {}
    errors = []
    for manifest in manifest_paths:
        real = under_root(root, manifest)
        found = _file_digest(real)
        if found is None:
            continue
        files[manifest] = found
        try:
            listed = read_manifest(root, manifest).files  # as pinned_units / nvidia_mps read it
        except NumaTuneError as exc:
            errors.append(str(exc))
            continue
        for path in listed:
            files[path] = _file_digest(under_root(root, path))
    return {
        "root": root,
        "plan_path": plan_path,
        "state": state,
        "kind": kind,
        "error": error,
        "plan": plan,
        "files": dict(sorted(files.items())),
        "manifest_errors": errors,
    }
