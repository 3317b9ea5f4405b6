"""numa_vm testinfra tests: put this folder on sys.path for vm_helpers; write the figures at the end."""

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import vm_helpers  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _write_figures():
    yield
    vm_helpers.write_figures()
