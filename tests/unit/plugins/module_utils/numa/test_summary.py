"""The one-line topology summary."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.summary import (
    summarize_topology,
)

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "sysfs")


def golden(machine):
    with open(os.path.join(GOLDEN, f"{machine}.numa.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (
            "qemu-2node-pxb",
            "2 nodes | n0[0-1|1.9 GiB] n1[2-3|1.9 GiB] | cpus online=4 offline=0 isolated=0"
            " | hugepages 2M=64 | gpus=0 | warnings=0",
        ),
        (
            "16em64t-4s2c2t-offlines",
            "1 node | n0[0-15|16 GiB] | cpus online=12 offline=4 isolated=0 | gpus=0 | warnings=0",
        ),
    ],
)
def test_summary_of_recorded_machines(machine, expected):
    assert summarize_topology(golden(machine)) == expected


def test_gpus_show_node_unknown_and_mig():
    gpus = {
        "gpus": [
            {"address": "0000:06:00.0", "node": None, "mig": None},
            {"address": "0000:17:00.0", "node": 1, "mig": {"mode_current": "enabled"}},
        ],
        "warnings": [{"path": "x", "reason": "y"}],
    }
    line = summarize_topology(golden("2arm-2c"), gpus)
    assert line.startswith("1 node (no NUMA) | n0[0-1|0.3 GiB] |")
    assert "gpus=2 0000:06:00.0@n?,0000:17:00.0@n1 MIG" in line
    assert line.endswith("warnings=1")
