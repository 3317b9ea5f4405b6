"""amd_partition through main(): render mode on a scratch sysfs tree, check mode, bad inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings

NUMA_TESTS = Path(__file__).parents[1] / "module_utils" / "numa"
if str(NUMA_TESTS) not in sys.path:
    sys.path.insert(0, str(NUMA_TESTS))
from test_amd_partition import B, current, entry, make_tree  # noqa: E402


def render_args(tmp_path, gpus, **kw):
    sys_root, proc_root = (
        make_tree(tmp_path)
        if not (tmp_path / "sys").exists()
        else (
            str(tmp_path / "sys"),
            str(tmp_path / "proc"),
        )
    )
    args = {
        "gpus": gpus,
        "sysfs_root": sys_root,
        "procfs_root": proc_root,
        "root": str(tmp_path / "root"),
        "service_manager": "none",
        "backend": "sysfs",
    }
    args.update(kw)
    return args


def test_render_mode_check_apply_again(run_module, tmp_path):
    args = render_args(tmp_path, [entry(B, compute="CPX")])
    check = run_module("amd_partition", args, check_mode=True, diff=True)
    assert check["changed"] and not (tmp_path / "root").exists()
    assert current(str(tmp_path / "sys"), B, "compute") == "SPX"
    assert check["diff"][0]["after"] == f"GPU {B}: compute CPX, memory NPS1\n"
    applied = run_module("amd_partition", args)
    assert applied["changed"] and applied["gpu_changed"]
    assert current(str(tmp_path / "sys"), B, "compute") == "CPX"
    state = json.loads((tmp_path / "root/etc/numafleet/amd-partition.json").read_text())
    assert state["gpus"][0]["compute"] == "CPX"
    assert applied["would_run"][-2:] == [
        "systemctl daemon-reload",
        "systemctl enable numafleet-amd-partition.service",
    ]
    again = run_module(
        "amd_partition", dict(args, gpus=[entry(B, compute="CPX", now=("CPX", "NPS1"))])
    )
    assert not again["changed"] and again["ran"] == []


def test_memory_change_without_reset_ok_warns_and_keeps_the_mode(run_module, tmp_path, monkeypatch):
    # module.warn() lands in the result as on a host, not on the display of controller code
    # that earlier tests of this process imported.
    monkeypatch.setattr(ansible_internal, "is_controller", False)
    ansible_warnings._global_warnings.clear()
    args = render_args(tmp_path, [entry(B, compute="CPX", memory="NPS4")])
    got = run_module("amd_partition", args)
    ansible_warnings._global_warnings.clear()
    assert got["reset_required"] and current(str(tmp_path / "sys"), B, "memory") == "NPS1"
    assert got["gpus"][0]["reset_required"] and got["drift"][0]["pending"]
    assert "needs a reload of the amdgpu driver" in json.dumps(got["warnings"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backend": "rocm"}, "value of backend must be one of"),
        ({"gpus": [entry(B, compute="XPX")]}, "'XPX' is not one of SPX, DPX, TPX, QPX, CPX"),
        ({"gpus": [entry(B, compute="TPX")]}, "compute partition TPX is not available"),
        ({"state_path": "etc/amd.json"}, "state_path"),
    ],
)
def test_bad_inputs_fail_with_the_message(run_module, tmp_path, change, message):
    args = dict(render_args(tmp_path, [entry(B, compute="CPX")]), **change)
    got = run_module("amd_partition", args)
    assert got["failed"] and message in got["msg"]
    assert current(str(tmp_path / "sys"), B, "compute") == "SPX"
