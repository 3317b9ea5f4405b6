"""nvidia_gpu_settings through main(): render mode check/apply/again, refusals, argument spec."""

from __future__ import annotations

import json
from pathlib import Path

from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings

UNIT = Path(__file__).parents[2]
SNAPSHOT = UNIT / "fixtures" / "gpu_snapshots" / "synthetic-8xh100-2s.json"
GPU = "0000:18:00.0"


def render_args(tmp_path, **gpu):
    snapshot = tmp_path / "gpu-snapshot.json"
    if not snapshot.exists():
        snapshot.write_text(SNAPSHOT.read_text())
    return {
        "gpus": [dict({"gpu": GPU}, **gpu)],
        "snapshot": str(snapshot),
        "root": str(tmp_path),
        "service_manager": "none",
    }


def test_render_check_apply_again(run_module, tmp_path):
    args = render_args(tmp_path, compute_mode="EXCLUSIVE_PROCESS", persistence=False)
    before = (tmp_path / "gpu-snapshot.json").read_text()
    check = run_module("nvidia_gpu_settings", args, check_mode=True, diff=True)
    assert check["changed"] and not check["failed"], check
    assert (tmp_path / "gpu-snapshot.json").read_text() == before
    assert check["diff"][0]["after"] == "persistence: disabled\ncompute_mode: EXCLUSIVE_PROCESS\n"
    assert check["would_run"] == [
        f"nvidia-smi -i {GPU} -pm 0",
        f"nvidia-smi -i {GPU} -c EXCLUSIVE_PROCESS",
    ]
    applied = run_module("nvidia_gpu_settings", args)
    assert applied["changed"] and applied["snapshot_written"] and "diff" not in applied
    record = json.loads((tmp_path / "gpu-snapshot.json").read_text())["gpus"][0]
    assert (record["persistence_mode"], record["compute_mode"]) == ("disabled", "exclusive_process")
    again = run_module("nvidia_gpu_settings", args)
    assert not again["changed"] and again["changes"] == []


def test_warning_for_persistence_without_the_daemon(run_module, tmp_path, monkeypatch):
    # module.warn() lands in the result as on a host (see test_host_apply.py).
    monkeypatch.setattr(ansible_internal, "is_controller", False)
    ansible_warnings._global_warnings.clear()
    result = run_module("nvidia_gpu_settings", render_args(tmp_path, persistence=False))
    ansible_warnings._global_warnings.clear()
    assert "nvidia-persistenced.service is not installed" in json.dumps(result["warnings"])


def test_refusal_is_a_failed_task_with_the_message(run_module, tmp_path):
    result = run_module("nvidia_gpu_settings", render_args(tmp_path, gpu="GPU-nope"))
    assert result["failed"]
    assert "gpus[0].gpu: GPU GPU-nope is not on this host" in result["msg"]


def test_the_argument_spec_refuses_a_wrong_type(run_module, tmp_path):
    result = run_module("nvidia_gpu_settings", render_args(tmp_path, power_limit_w="lots"))
    assert result["failed"] and "power_limit_w" in result["msg"]
