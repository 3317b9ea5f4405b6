"""numafleet.tuning.gpu_topology_facts through run_module: options, NVML, nvidia-smi, snapshots."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest

UNIT = Path(__file__).resolve().parents[2]
if str(UNIT / "fixtures") not in sys.path:
    sys.path.insert(0, str(UNIT / "fixtures"))

import trees  # noqa: E402

SNAPSHOTS = UNIT / "fixtures" / "gpu_snapshots"


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


needs_no_gpu = pytest.mark.skipif(_nvml_works(), reason="NVML answers here: this is a GPU host")
needs_no_nvidia_smi = pytest.mark.skipif(
    shutil.which("nvidia-smi", path=os.environ.get("PATH", "") + ":/sbin:/usr/sbin:/usr/local/sbin")
    is not None,
    reason="nvidia-smi is installed here",
)


@pytest.fixture
def host(tmp_path):
    """Scratch fsroot of the 4x A100 machine: module arguments for its sysfs/procfs."""
    root = trees.materialize("synthetic-2x6338-4xa100", tmp_path / "host")
    return {"sysfs_root": f"{root}/sys", "procfs_root": f"{root}/proc"}


@pytest.fixture
def hanging_nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi first on PATH that never returns (a wedged driver), through a child process."""
    bindir = tmp_path / "hang-bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text("#!/bin/sh\nsleep 1000\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '')}")
    return script


def unblock_fifo_later(path, seconds=3.0):
    """Open ``path`` for writing after ``seconds`` if a reader waits on it, so no test hangs."""

    def release():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody opened it for reading, as it should be
            pass

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()


@needs_no_gpu
@needs_no_nvidia_smi
def test_without_a_gpu_driver_nvml_reports_why_and_sysfs_is_reported(run_module, host):
    result = run_module("gpu_topology_facts", host)
    assert result["failed"] is False and result["changed"] is False
    assert result["snapshot_written"] is False
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["nvml"]["available"] is False
    assert facts["nvml"]["reason"] == "nvmlInit failed: NVML Shared Library Not Found"
    assert facts["nvidia_smi"] == {
        "used": False,
        "reason": "nvidia-smi was not found in PATH",
        "driver_version": None,
    }
    assert facts["snapshot"] == {"path": None, "recorded_from": None}
    assert [g["address"] for g in facts["gpus"]] == trees.GPU_ADDRESSES["synthetic-2x6338-4xa100"]
    assert [g["node"] for g in facts["gpus"]] == [0, 0, 1, 1]
    assert all(g["uuid"] is None and set(g["sources"].values()) == {"sysfs"} for g in facts["gpus"])


def test_no_gpu_means_an_empty_list(run_module, tmp_path):
    root = trees.materialize("qemu-2node-pxb", tmp_path / "qemu")
    result = run_module(
        "gpu_topology_facts", {"sysfs_root": f"{root}/sys", "nvidia_smi": "never"}, check_mode=True
    )
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["gpus"] == []
    assert facts["nvidia_smi"]["reason"] in (
        "not tried: nvidia_smi=never",
        "not needed: NVML answered",
    )


def test_snapshot_is_read_instead_of_nvml(run_module, host):
    snapshot = str(SNAPSHOTS / "synthetic-2x6338-4xa100.json")
    result = run_module("gpu_topology_facts", dict(host, snapshot=snapshot))
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["snapshot"] == {"path": snapshot, "recorded_from": "nvml"}
    assert facts["nvml"]["available"] is True  # as recorded on the host
    first = facts["gpus"][0]
    assert first["sources"]["uuid"] == first["sources"]["mig"] == "snapshot"
    assert first["sources"]["node"] == "sysfs"
    assert [gi["profile_name"] for gi in first["mig"]["gpu_instances"]] == [
        "3g.40gb",
        "2g.20gb",
        "2g.20gb",
    ]
    assert facts["warnings"] == []


def test_check_mode_writes_no_snapshot(run_module, host, tmp_path):
    out = tmp_path / "out.json"
    args = dict(
        host, snapshot=str(SNAPSHOTS / "synthetic-2x6338-4xa100.json"), snapshot_out=str(out)
    )
    result = run_module("gpu_topology_facts", args, check_mode=True)
    assert result["failed"] is False
    assert result["snapshot_written"] is False
    assert not out.exists()


def test_snapshot_out_records_the_gpu_state(run_module, host, tmp_path):
    source = SNAPSHOTS / "synthetic-2x6338-4xa100.json"
    out = tmp_path / "out.json"
    result = run_module(
        "gpu_topology_facts", dict(host, snapshot=str(source), snapshot_out=str(out))
    )
    assert result["snapshot_written"] is True and result["changed"] is False
    assert json.loads(out.read_text()) == json.loads(source.read_text())
    again = run_module("gpu_topology_facts", dict(host, snapshot=str(out)))
    first, second = (r["ansible_facts"]["gpu_topology"]["gpus"] for r in (result, again))
    assert first == second


@needs_no_gpu
def test_snapshot_out_without_nvml_records_why(run_module, host, tmp_path):
    out = tmp_path / "out.json"
    run_module("gpu_topology_facts", dict(host, snapshot_out=str(out), nvidia_smi="never"))
    recorded = json.loads(out.read_text())
    assert recorded["recorded_from"] is None and recorded["gpus"] == []
    assert recorded["nvml"]["reason"] == "nvmlInit failed: NVML Shared Library Not Found"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot be read (No such file or directory)"),
        ("{}", 'is not a GPU snapshot (no "format": "numafleet.tuning/gpu-snapshot")'),
    ],
)
def test_bad_snapshot_fails_with_the_file_and_the_reason(
    run_module, host, tmp_path, content, message
):
    path = tmp_path / "snapshot.json"
    if content is not None:
        path.write_text(content)
    result = run_module("gpu_topology_facts", dict(host, snapshot=str(path)))
    assert result["failed"] is True
    assert result["msg"].startswith(f"GPU snapshot {path}: {message}")


@needs_no_gpu
def test_nvidia_smi_fallback_runs_the_binary_with_argv_and_c_locale(
    run_module, tmp_path, fake_nvidia_smi
):
    root = trees.materialize("synthetic-8xh100-2s", tmp_path / "h100")
    result = run_module("gpu_topology_facts", {"sysfs_root": f"{root}/sys"})
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["nvidia_smi"] == {"used": True, "reason": None, "driver_version": "560.35.03"}
    seen = next(g for g in facts["gpus"] if g["address"] == "0000:db:00.0")
    assert seen["name"] == "NVIDIA H100 80GB HBM3" and seen["sources"]["name"] == "nvidia-smi"
    assert len(facts["warnings"]) == 7  # the other GPUs nvidia-smi did not show (a Slurm job)


def test_nvidia_smi_always_uses_it_even_where_nvml_would_answer(
    run_module, tmp_path, fake_nvidia_smi
):
    root = trees.materialize("synthetic-8xh100-2s", tmp_path / "h100")
    result = run_module("gpu_topology_facts", {"sysfs_root": f"{root}/sys", "nvidia_smi": "always"})
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["nvml"]["reason"] == "not used: nvidia_smi=always"
    assert facts["nvidia_smi"]["used"] is True


@needs_no_nvidia_smi
def test_nvidia_smi_always_without_the_binary_fails(run_module, host):
    result = run_module("gpu_topology_facts", dict(host, nvidia_smi="always"))
    assert result["failed"] is True
    assert result["msg"] == (
        "nvidia-smi -q -x: nvidia-smi was not found in PATH; install the NVIDIA driver utilities "
        "or use auto"
    )


@needs_no_gpu
def test_hanging_nvidia_smi_times_out_in_auto_mode(run_module, host, hanging_nvidia_smi):
    started = time.monotonic()
    result = run_module("gpu_topology_facts", dict(host, nvidia_smi_timeout=1))
    assert time.monotonic() - started < 15
    assert result["failed"] is False
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["nvidia_smi"] == {
        "used": False,
        "reason": "timed out after 1 s",
        "driver_version": None,
    }
    assert len(facts["gpus"]) == 4 and all(g["uuid"] is None for g in facts["gpus"])


def test_hanging_nvidia_smi_fails_the_task_in_always_mode(run_module, host, hanging_nvidia_smi):
    started = time.monotonic()
    result = run_module("gpu_topology_facts", dict(host, nvidia_smi="always", nvidia_smi_timeout=1))
    assert time.monotonic() - started < 15
    assert result["failed"] is True
    assert result["msg"] == (
        "nvidia-smi -q -x: timed out after 1 s; raise nvidia_smi_timeout if the driver is only "
        "slow, or find out why nvidia-smi hangs"
    )


def test_nvidia_smi_timeout_below_one_second_is_refused(run_module, host):
    result = run_module("gpu_topology_facts", dict(host, nvidia_smi_timeout=0))
    assert result["failed"] is True
    assert result["msg"] == (
        "nvidia-smi -q -x: nvidia_smi_timeout is 0; set it to a whole number of seconds, 1 or more"
    )


def test_snapshot_fifo_fails_without_hanging(run_module, host, tmp_path):
    fifo = tmp_path / "snapshot.json"
    os.mkfifo(fifo)
    unblock_fifo_later(str(fifo))
    result = run_module("gpu_topology_facts", dict(host, snapshot=str(fifo)))
    assert result["failed"] is True
    assert result["msg"].startswith(f"GPU snapshot {fifo}: is not a regular file (it is a FIFO).")


def test_snapshot_out_in_a_missing_directory_says_to_create_it(run_module, host, tmp_path):
    out = tmp_path / "nonexistent" / "x.json"
    snapshot = str(SNAPSHOTS / "synthetic-2x6338-4xa100.json")
    result = run_module("gpu_topology_facts", dict(host, snapshot=snapshot, snapshot_out=str(out)))
    assert result["failed"] is True
    assert result["msg"] == (
        f"GPU snapshot {out}: cannot be written (No such file or directory). Make sure the "
        f"directory of snapshot_out ({out.parent}) exists and is writable on the host, and that "
        "snapshot_out is not itself a directory."
    )


def test_bad_option_value_is_refused(run_module, host):
    result = run_module("gpu_topology_facts", dict(host, nvidia_smi="sometimes"))
    assert result["failed"] is True
    assert "nvidia_smi" in result["msg"] and "sometimes" in result["msg"]
