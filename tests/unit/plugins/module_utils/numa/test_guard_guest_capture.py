"""The guard's core on files captured from the real 2-node QEMU guest (kernel 6.1, systemd 252).

tests/unit/fixtures/guard/qemu-guest-hog-at-floor: during the guest's memory guard test, node 1
held numa-bound (priority high, MemoryLow= 512 MiB) and hog (priority low), which had grown past
the act threshold; the guard had throttled hog's memory.high down to the 256 MiB floor while the
swap file was full, so the kernel could not hold hog there. See fixtures/PROVENANCE.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard

ROOT = Path(__file__).parents[3] / "fixtures" / "guard" / "qemu-guest-hog-at-floor"
SYS = str(ROOT / "sys")
CGROUP = str(ROOT / "sys" / "fs" / "cgroup")
SPECS = guard.parse_placements(
    {
        "placements": [
            {"name": "numa-bound", "unit": "numafleet-numa-bound.service", "mems": [1],
             "memory_kb": 524288, "priority": "high"},
            {"name": "hog", "unit": "numafleet-hog.service", "mems": [1], "memory_kb": 262144,
             "priority": "low"},
            {"name": "cpu-only", "unit": "numafleet-cpu-only.service", "mems": [0],
             "memory_kb": 131072},
        ]
    }
)  # fmt: skip
MIB = 1024 * 1024


def meminfo_kb(node: int) -> dict:
    """The node's meminfo fields in kB, read here independently of the guard's parser."""
    out = {}
    text = (ROOT / f"sys/devices/system/node/node{node}/meminfo").read_text()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[-1] == "kB":
            out[parts[2].rstrip(":")] = int(parts[3])
    return out


def read():
    nodes, warnings = guard.read_nodes(guard.read_path, SYS)
    placements, more = guard.read_placements(guard.read_path, SPECS, CGROUP)
    assert warnings == [] and more == []
    return {n.id: n for n in nodes}, {p.name: p for p in placements}


def test_node_use_leaves_the_file_lru_out_and_node_1_is_over_act():
    nodes, dummy = read()
    for node in (0, 1):
        raw = meminfo_kb(node)
        used = raw["MemTotal"] - raw["MemFree"] - raw["Active(file)"] - raw["Inactive(file)"]
        assert nodes[node].used_kb == used
        assert nodes[node].total_kb == raw["MemTotal"]
    assert nodes[1].used_ratio > 0.90 > nodes[0].used_ratio
    assert dict(nodes[1].distances) == {0: 20, 1: 10}
    pools = {(p.size_kb, p.total, p.free) for p in nodes[1].hugepages}
    assert (2048, 32, 0) in pools  # numa-bound's 32 pages, all in use


def test_placements_as_the_kernel_counts_them():
    dummy, placements = read()
    bound, hog, cpu_only = placements["numa-bound"], placements["hog"], placements["cpu-only"]
    assert bound.low_bytes == 512 * MIB and bound.high_bytes is None  # memory.high "max"
    assert bound.offnode_share((1,)) == 0.0
    assert hog.high_bytes == 256 * MIB  # throttled to the floor...
    assert hog.current_bytes > 1400 * MIB  # ...which the kernel could not enforce (swap full)
    assert hog.bytes_on(0) == 0 and hog.bytes_on(1) > 1400 * MIB
    assert cpu_only.bytes_on(1) == 0 and cpu_only.bytes_on(0) > 64 * MIB


@pytest.mark.parametrize("mode", ["reclaim", "throttle"])
def test_acting_on_the_captured_node_never_touches_the_high_placement(mode):
    nodes, placements = read()
    thresholds = guard.parse_thresholds({"mode": mode})
    state = guard.GuardState(over_rounds=((1, thresholds.act_rounds - 1),))
    decision = guard.decide(
        tuple(nodes.values()), tuple(placements.values()), SPECS, state, thresholds
    )
    assert all(a.placement != "numa-bound" for a in decision.actions)
    if mode == "reclaim":
        (action,) = decision.actions
        excess = nodes[1].used_kb * 1024 - int(nodes[1].total_kb * 1024 * 0.90)
        assert (action.action, action.placement, action.node) == ("reclaim", "hog", 1)
        assert action.amount_bytes == min(excess, placements["hog"].bytes_on(1))
    else:
        # hog's memory.high is at the 256 MiB floor already: nothing is left to lower
        assert decision.actions == ()
