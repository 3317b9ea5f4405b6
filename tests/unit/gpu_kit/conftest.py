"""Fixtures of the GPU proof kit's tests (tests/gpu): a kit Context over fakes and fixture trees.

The kit's checks run unchanged; what this machine lacks is stood in for: NVML by the fake NVML
(tests/unit/fake_nvml.py), nvidia-smi by recorded outputs, the CUDA client by ``stub_client.py``,
``nvidia-cuda-mps-control`` by ``fakes/nvidia-cuda-mps-control``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
KIT = REPO / "tests" / "gpu"
SMI_FIXTURES = REPO / "tests" / "unit" / "fixtures" / "cmd" / "nvidia-smi"
for _extra in (KIT, HERE):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import gpu_proof  # noqa: E402  (needs the sys.path lines above)
from kit_helpers import fake_which  # noqa: E402


@pytest.fixture
def kit_context(tmp_path, monkeypatch):
    """Factory: a gpu_proof.Context writing to a scratch out dir, with the fakes' ``which``."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)

    def make(**fields) -> gpu_proof.Context:
        fields.setdefault("which", fake_which)
        fields.setdefault("client", str(HERE / "stub_client.py"))
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        return gpu_proof.Context(out=out, **fields)

    return make
