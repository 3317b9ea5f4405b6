"""Our NUMA node CPU sets and PCI locality agree with hwloc's output for the same trees.

hwloc (tests/unit/fixtures/sysfs/hwloc, and lstopo run inside the qemu-2node-pxb guest) is an
independent reading of the same sysfs. ``hwloc_oracle.normalise_for_hwloc`` applies only hwloc's
documented differences (tests/unit/fixtures/sysfs/README.md); everything else must be equal.
"""

from __future__ import annotations

import hwloc_oracle
import pytest
import trees

CASES = hwloc_oracle.cases()


def test_every_dump_is_compared():
    compared = {case.machine for case in CASES}
    assert compared == {m for m in trees.MACHINES if not m.startswith("synthetic-")}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.expected.name)
def test_nodes_and_pci_locality_match_hwloc(case, fixture_root):
    result = hwloc_oracle.compare(case, fixture_root(case.machine))
    assert result.mismatches == ()
    assert result.nodes_compared > 0


# What each comparison covers, so a parser regression cannot make a case pass by seeing nothing.
# machine-file: (nodes, CPUs, PCI devices) hwloc shows.
COVERAGE = {
    "128arm-2pa2n8cluster4co.console": (4, 128, 0),
    "16em64t-4s2c2t-offlines-xml.xml": (1, 12, 0),
    "16em64t-4s2c2t-offlines.console": (1, 12, 0),
    "2arm-2c.console": (1, 2, 0),
    "32em64t-2n8c+dax+nvme+mic+dimms.xml": (2, 16, 136),
    "40intel64-2g2n4c+pcilocality.xml": (4, 40, 37),
    "48amd64-4pa2n6c-sparse.console": (8, 48, 0),
    "fakeheteromemtiers.console": (7, 6, 0),
    "nvidiagpunumanodes.console": (2, 32, 6),
    "qemu-2node-pxb.lstopo.xml": (2, 4, 5),
    "qemu-2node-pxb.lstopo.console": (2, 4, 4),
}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.expected.name)
def test_comparison_covers_what_hwloc_shows(case):
    view = hwloc_oracle.view_of(case.expected)
    cpus = set().union(*view.nodes.values())
    assert (len(view.nodes), len(cpus), len(view.pci)) == COVERAGE[case.expected.name]


def test_forced_pci_locality_is_read_from_the_test_file():
    test_file = hwloc_oracle.HWLOC_DIR / "40intel64-2g2n4c+pcilocality.test"
    inputs = hwloc_oracle.read_hwloc_inputs("/nonexistent", test_file)
    even = frozenset(range(0, 40, 2))
    odd = frozenset(range(1, 40, 2))
    assert inputs.pci_locality == ((0, 0x00, 0x09, even), (0, 0x40, 0x46, odd))


def test_forced_locality_is_not_what_sysfs_says(fixture_root):
    """40intel64: sysfs puts every device on all 40 CPUs; only HWLOC_PCI_LOCALITY splits them."""
    case = next(c for c in CASES if c.machine == "40intel64-2g2n4c+pcilocality")
    result = hwloc_oracle.compare(case, fixture_root(case.machine))
    assert result.raw_equal == (4, 0)
    assert "hwloc-pci-locality-env" in result.applied


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0x00000003", {0, 1}),
        ("0x000000ff,0xffffffff", set(range(40))),
        ("0x00000001,,0x00000001", {0, 64}),
        ("0x0", set()),
    ],
)
def test_parse_bitmap(text, cpus):
    assert hwloc_oracle.parse_bitmap(text) == frozenset(cpus)


def test_parse_bitmap_refuses_infinite_sets():
    with pytest.raises(ValueError, match="infinite"):
        hwloc_oracle.parse_bitmap("0xf...f")


def _facts(nodes, online, distances=None):
    ids = [nid for nid, *rest in nodes]
    return {
        "cpus": {"online": online},
        "nodes": [
            {
                "id": nid,
                "cpus": cpus,
                "memory_kb": mem,
                "distances": (distances or {}).get(nid, [10 if o == nid else 20 for o in ids]),
            }
            for nid, cpus, mem in nodes
        ],
    }


@pytest.mark.parametrize(
    ("nodes", "online", "inputs", "want", "rule"),
    [
        # offline CPUs leave every set
        ([(0, [0, 1, 2, 3], 8)], [0, 1], {}, {0: {0, 1}}, "offline"),
        # a CPU-only memory-less node is hidden
        ([(0, [0, 1], 8), (1, [2, 3], 0)], [0, 1, 2, 3], {}, {0: {0, 1}}, "cpu-only-memoryless"),
        # a later node overlapping an earlier one is dropped
        ([(0, [0, 1], 8), (1, [1, 2], 8)], [0, 1, 2], {}, {0: {0, 1}}, "overlapping"),
        # NVIDIA GPU memory nodes are hidden
        (
            [(0, [0, 1], 8), (5, [], 8)],
            [0, 1],
            {"nvidia_gpu_nodes": frozenset({5})},
            {0: {0, 1}},
            "nvidia-gpu-memory",
        ),
        # a CPU-less node takes its HMAT initiator's CPUs
        (
            [(0, [0, 1], 8), (1, [2, 3], 8), (2, [], 8)],
            [0, 1, 2, 3],
            {"initiators": {2: frozenset({1})}},
            {0: {0, 1}, 1: {2, 3}, 2: {2, 3}},
            "cpuless-initiators",
        ),
        # without initiators, when every other node is equally far: the whole machine
        (
            [(0, [0, 1], 8), (1, [2, 3], 8), (2, [], 8)],
            [0, 1, 2, 3],
            {},
            {0: {0, 1}, 1: {2, 3}, 2: {0, 1, 2, 3}},
            "cpuless-initiators",
        ),
    ],
)
def test_normalisation_rules(nodes, online, inputs, want, rule):
    got = hwloc_oracle.normalise_for_hwloc(
        _facts(nodes, online), [], hwloc_oracle.HwlocInputs(**inputs)
    )
    assert {nid: set(cpus) for nid, cpus in got.nodes.items()} == want
    assert rule in got.applied


def test_cpuless_node_takes_strictly_nearest_node_by_distance():
    facts = _facts(
        [(0, [0, 1], 8), (1, [2, 3], 8), (2, [], 8)],
        [0, 1, 2, 3],
        distances={2: [30, 20, 10]},
    )
    got = hwloc_oracle.normalise_for_hwloc(facts, [], hwloc_oracle.HwlocInputs())
    assert got.nodes[2] == frozenset({2, 3})
