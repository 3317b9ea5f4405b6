"""topology_capture through main(): check mode writes nothing, the tarball is a usable tree."""

from __future__ import annotations

import json
import os
import tarfile


def test_check_mode_writes_nothing(run_module, fixture_root, tmp_path):
    root = fixture_root("qemu-2node-pxb")
    dest = tmp_path / "c.tar.gz"
    result = run_module(
        "topology_capture",
        {
            "sysfs_root": f"{root}/sys",
            "procfs_root": f"{root}/proc",
            "dest": str(dest),
            "name": "h",
        },
        check_mode=True,
    )
    assert result["failed"] is False and result["changed"] is True
    assert result["files"] == 0 and result["entries"] > 100
    assert not dest.exists()


def test_capture_with_gpu_snapshot(run_module, fixture_root, tmp_path):
    root = fixture_root("synthetic-2x6338-4xa100")
    snapshot = tmp_path / "gpu.json"
    facts = run_module(
        "gpu_topology_facts",
        {"sysfs_root": f"{root}/sys", "procfs_root": f"{root}/proc", "snapshot_out": str(snapshot)},
    )
    assert facts["snapshot_written"] is True
    dest = tmp_path / "c.tar.gz"
    result = run_module(
        "topology_capture",
        {
            "sysfs_root": f"{root}/sys",
            "procfs_root": f"{root}/proc",
            "dest": str(dest),
            "name": "gpu-a100-01",
            "gpu_snapshot": str(snapshot),
        },
    )
    assert result["failed"] is False and result["files"] > 100
    with tarfile.open(dest) as archive:
        archive.extractall(tmp_path / "out", filter="fully_trusted")
    recorded = tmp_path / "out" / "gpu-a100-01"
    assert json.loads((recorded / "gpu-snapshot.json").read_text()) == json.loads(
        snapshot.read_text()
    )
    again = run_module(
        "numa_facts", {"sysfs_root": f"{recorded}/sys", "procfs_root": f"{recorded}/proc"}
    )
    gpus = [d for d in again["ansible_facts"]["numa"]["pci_devices"] if d["kind"] == "gpu"]
    assert [g["address"] for g in gpus] == [
        "0000:17:00.0",
        "0000:31:00.0",
        "0000:b1:00.0",
        "0000:ca:00.0",
    ]
    assert [g["node"] for g in gpus] == [0, 0, 1, 1]


def test_missing_gpu_snapshot_fails_with_the_fix(run_module, fixture_root, tmp_path):
    root = fixture_root("2arm-2c")
    result = run_module(
        "topology_capture",
        {
            "sysfs_root": f"{root}/sys",
            "procfs_root": f"{root}/proc",
            "dest": str(tmp_path / "c.tar.gz"),
            "name": "h",
            "gpu_snapshot": str(tmp_path / "nope.json"),
        },
    )
    assert result["failed"] is True
    assert "nope.json" in result["msg"] and "snapshot_out" in result["msg"]
    assert not os.path.exists(tmp_path / "c.tar.gz")
