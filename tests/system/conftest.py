"""System tests: real ansible-playbook runs of site.yml on scratch demo trees (make system).

Helpers live in system_helpers.py (this folder is put on sys.path for them and for
tests/unit/fixtures/trees.py, which materialises the recorded topologies).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SYSTEM = Path(__file__).resolve().parent
for _extra in (SYSTEM, SYSTEM.parents[1] / "tests" / "unit" / "fixtures"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

from system_helpers import REPO  # noqa: E402


@pytest.fixture(scope="session")
def ansible_ready():
    """Fail with the fix when the checkout was not set up (`make setup`)."""
    link = REPO / ".collections" / "ansible_collections" / "numafleet" / "tuning"
    if not (REPO / ".venv" / "bin" / "ansible-playbook").exists() or not link.exists():
        pytest.fail("run `make setup` first: .venv and the .collections symlink are missing")
    return True


@pytest.fixture
def scratch_demo(tmp_path, ansible_ready):
    """DemoHost(tmp_path, host): the demo inventory and one host's scratch tree, runs limited
    to it (system_helpers.DemoHost)."""
    from system_helpers import DemoHost

    return lambda host: DemoHost(tmp_path, host)
