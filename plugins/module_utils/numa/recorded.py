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

from . import files
from .errors import NumaTuneError
from .units import read_manifest, removable, under_root

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


def state_digest(recorded) -> str:
    """sha256 hex of what a recording says about the host's own state: the plan file's digest,
    its kind and every owned file's digest (read_recorded's plan_sha256, kind and files).

    The controller computes it from the facts it planned from; host_apply computes it from the
    host under its lock before it changes anything, and refuses when the two differ (another run
    applied in between, or the facts came from a stale cache). Keys are sorted; the plan itself
    is represented by its file's digest, so no JSON round trip can change the result.
    """
    recorded = recorded if isinstance(recorded, dict) else {}
    files_seen = recorded.get("files") if isinstance(recorded.get("files"), dict) else {}
    state = {
        "kind": recorded.get("kind"),
        "plan_sha256": recorded.get("plan_sha256"),
        "files": {str(path): files_seen[path] for path in files_seen},
    }
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fail(path: str, reason: str) -> NumaTuneError:
    return NumaTuneError(f"{path}: {reason}")


def _file_digest(root: str, path: str) -> Optional[str]:
    """Digest of the file at path below root as the apply modules read it (no link followed in
    any component); None when absent, 'other' when it is no regular file (a link, a directory,
    or a linked parent), 'unreadable'."""
    try:
        info = files.lstat_file(root, path, _fail)
    except NumaTuneError:
        return "other"
    if info is None:
        return None
    if not stat.S_ISREG(info.st_mode):
        return "other"
    try:
        data = files.read_file(root, path, _fail)
    except NumaTuneError:
        return "unreadable"
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_recorded(root: str, plan_path: str = PLAN_PATH, manifest_paths=MANIFEST_PATHS) -> dict:
    """ansible_facts.numafleet_recorded below root ("/" = the host itself); never raises for content.

    Shape: {"root", "plan_path", "state": absent|present|invalid, "kind": absent|file|link|
    directory|other, "error": str|None, "plan": dict|None, "plan_sha256": sha256 hex of the plan
    file's bytes (None when absent; as "files" digests it), "files": {host path: sha256 hex,
    None (absent), "other" (a link, or no regular file), "unreadable" or "kept"} for every file
    a manifest lists, plus each manifest path itself, "manifest_errors": [str], "kept": [str]}.
    A malformed (or linked) manifest is named in manifest_errors (the apply modules refuse it
    with the fix); its files are then unknown. A listed file the apply modules would not remove
    as theirs (outside /etc/systemd/system, a link, content changed since it was written:
    units.removable) has "kept" as its digest and a message in kept. "kernel_args": the kernel
    command line arguments of the hugepages layer's state file (/etc/numafleet/hugepages.json;
    [] when absent, None when unusable), which the change plan compares with the wanted ones.
    """
    try:
        # A linked directory on the way (``/etc/numafleet`` a link): never read through it.
        files.lstat_file(root, plan_path, _fail)
    except NumaTuneError as exc:
        state, kind, plan, error = (
            "invalid",
            "link",
            None,
            f"cannot be reached without a link ({exc})",
        )
    else:
        state, kind, plan, error = _read_plan(under_root(root, plan_path))
    found_files: dict = {}
    errors, kept = [], []
    for manifest in manifest_paths:
        found = _file_digest(root, manifest)
        if found is None:
            continue
        found_files[manifest] = found
        try:
            listed = read_manifest(root, manifest)  # as pinned_units / nvidia_mps read it
            # The unit_dir the roles pass is not known here: any directory counts, so that a
            # custom pinned_services_unit_dir keeps its stops in the change plan (and its
            # blast-radius guard); the apply module checks the directory too.
            ours, refused = removable(root, listed, (), None)
        except NumaTuneError as exc:
            errors.append(str(exc))
            continue
        for path in listed.files:
            found_files[path] = _file_digest(root, path)
        for item in refused:
            found_files[item.path] = "kept"
            kept.append(item.message())
    return {
        "root": root,
        "plan_path": plan_path,
        "state": state,
        "kind": kind,
        "error": error,
        "plan": plan,
        "plan_sha256": _file_digest(root, plan_path),
        "files": dict(sorted(found_files.items())),
        "manifest_errors": errors,
        "kept": kept,
        "kernel_args": _kernel_args(root),
    }


def _kernel_args(root: str) -> Optional[list]:
    """The kernel_args the hugepages layer wrote last (its state file, hugepages.STATE_PATH),
    [] when there is none, None when it cannot be read (a link, malformed)."""
    from .hugepages import read_state  # only here: the rest of this file needs none of it

    try:
        state, dummy = read_state(root)
    except NumaTuneError:
        return None
    return [] if state is None else list(state.kernel_args)
