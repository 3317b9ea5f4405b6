"""Plan entries in the shape numa_plan publishes (planner.py), for tests of what consumes a plan.

The renderer, pinned_units and the verify checks are tested against small hand-made plans; this
is their one builder of a placement entry, so a change of the plan's shape is made here once.
"""

from __future__ import annotations


def placement(name: str = "llm", **overrides) -> dict:
    """A service placement entry of a plan (4 CPUs on node 0, no GPU), with overrides."""
    base = {
        "name": name,
        "index": 0,
        "unit": f"numafleet-{name}.service",
        "unit_kind": "service",
        "exec": "/usr/bin/sleep infinity",
        "argv": ["/usr/bin/sleep", "infinity"],
        "description": f"numafleet placement {name}",
        "user": None,
        "group": None,
        "tenant": None,
        "slice": "numafleet.slice",
        "node": 0,
        "nodes": [0],
        "spans": False,
        "near": None,
        "cpus": [2, 3, 4, 5],
        "cpus_requested": 4,
        "mems": [0],
        "memory_kb": 0,
        "hugepages": None,
        "gpus": [],
        "cuda_visible_devices": "",
        "mps": None,
        "environment": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""},
        "waits_for": None,
        "hardening": None,
        "warnings": [],
    }
    base.update(overrides)
    return base
