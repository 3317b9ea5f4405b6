"""Helpers of the GPU proof kit's tests: the stub GPU, the fakes' ``which``, item lookup."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKES = HERE / "fakes"
STUB_UUID = "GPU-11111111-2222-3333-4444-555555555555"
STUB_ADDRESS = "0000:00:04.0"


def fake_which(name: str):
    """The fake of ``name`` in fakes/ when there is one, else the real one in PATH."""
    path = FAKES / name
    return str(path) if path.is_file() else shutil.which(name)


def stub_gpu_entry(**changes) -> dict:
    """A gpu_topology facts entry of one made-up H200 on node 0 (the stub client's GPU)."""
    entry = {
        "address": STUB_ADDRESS,
        "vendor": "nvidia",
        "vendor_id": "0x10de",
        "device_id": "0x2335",
        "numa_node": 0,
        "node": 0,
        "node_source": "numa_node",
        "local_cpus": sorted(os.sched_getaffinity(0)),
        "switch": None,
        "root_port": None,
        "uuid": STUB_UUID,
        "name": "NVIDIA H200",
        "memory_total_mib": 143771,
        "compute_mode": "default",
        "persistence_mode": "enabled",
        "mig": {
            "mode_current": "disabled",
            "mode_pending": "disabled",
            "gpu_instances": [],
            "supported_profiles": None,
        },
        "processes": [],
        "nvlink_peers": [],
        "nvlink_switches": [],
        "nvml_numa_node": None,
        "partition": None,
        "sources": {},
        "unavailable": {},
    }
    entry.update(changes)
    return entry


def items(check) -> dict:
    """{item name: item} of a finished gpu_proof.Check."""
    return {item.name: item for item in check.items}
