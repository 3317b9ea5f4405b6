"""The kit's CUDA client (tests/gpu/cuda_client.py) where no CUDA framework is installed: its
UUID spelling, and the error it reports instead of devices."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import cuda_client
import pytest

CLIENT = Path(cuda_client.__file__)


@pytest.mark.parametrize(
    "spelling",
    [
        lambda u: u.bytes,  # CuPy: the 16 bytes of cudaDeviceProp.uuid
        str,  # PyTorch: the canonical text
        lambda u: u.hex,  # 32 hex digits
        lambda u: f"GPU-{u}",  # already in CUDA_VISIBLE_DEVICES form
    ],
)
def test_uuid_spellings_give_the_nvml_form(spelling):
    made = uuid.UUID("3b1e9a2c-5d4f-4e6a-8b7c-9d0e1f2a3b4c")
    assert cuda_client._uuid_text(spelling(made)) == "GPU-3b1e9a2c-5d4f-4e6a-8b7c-9d0e1f2a3b4c"


def test_without_a_framework_the_client_says_why(tmp_path):
    env = {"GPU_PROOF_FRAMEWORK": "torch", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    (tmp_path / "torch.py").write_text("raise ImportError('no torch here')\n")
    done = subprocess.run(
        [sys.executable, str(CLIENT), "count"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    event = json.loads(done.stdout.splitlines()[-1])
    assert event == {"event": "error", "reason": "no CUDA framework: torch: no torch here"}
