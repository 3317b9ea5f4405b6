"""Shared fixtures for the unit tests.

``fixture_root(machine, writable=False)`` returns the fsroot (a directory with ``sys/`` and
``proc/``) of a scratch copy of one recorded or synthetic machine (``trees.MACHINES``):

* read-only use (the default) shares one copy per machine for the whole session, so each tarball
  is extracted once; tests must not write to it;
* ``writable=True`` gives the calling test its own fresh copy.

Extracting the big hwloc dumps takes seconds on slow disks. Set ``NUMAFLEET_FIXTURE_CACHE=DIR``
to keep the read-only extractions in DIR across sessions (one directory per tarball content).

This file also puts ``tests/unit`` and ``tests/unit/fixtures`` on ``sys.path`` so tests can
``import trees``, ``import hwloc_oracle`` and ``import regen_golden``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent
for _extra in (UNIT, UNIT / "fixtures"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))


def _persistent_copy(trees, machine: str, cache_dir: Path):
    """A cached extraction of a tarball machine keyed by the tarball's content, or None."""
    src = trees.source(machine)
    if not src.is_file():
        return None
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    dest = cache_dir / f"{machine}-{digest}"
    if not (dest / trees.MARKER).is_file():  # the marker is written last: absent = incomplete
        shutil.rmtree(dest, ignore_errors=True)
        trees.materialize(machine, dest)
    return str(dest)


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory):
    """Factory: fixture_root(machine, writable=False) -> fsroot path of a scratch copy."""
    import trees

    shared: dict = {}
    persistent = os.environ.get("NUMAFLEET_FIXTURE_CACHE")

    def make(machine: str, writable: bool = False) -> str:
        if machine not in shared:
            root = None
            if persistent:
                root = _persistent_copy(trees, machine, Path(persistent))
            if root is None:
                root = trees.materialize(machine, tmp_path_factory.mktemp("tree") / machine)
            shared[machine] = root
        if not writable:
            return shared[machine]
        dest = tmp_path_factory.mktemp("writable") / machine
        shutil.copytree(shared[machine], dest, symlinks=True)
        return str(dest)

    return make
