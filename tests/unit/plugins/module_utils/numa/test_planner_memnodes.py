"""The planner and the kinds of memory nodes.

GPU memory exposed as a node (POWER9 + V100 nodes 250-255, GH200 node 1) is never a
placement's memory; slower memory (a lower memory tier, CXL/DAX-backed, no normal zone) comes
after fast memory; a placement whose memory is not on its CPU node says so, in its warnings
and in the summary line (``mems``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
    slow_memory_nodes,
)

SYSFS = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs"
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}
V100_NODES = {250, 251, 252, 253, 254, 255}
_CACHE: dict = {}


def numa_of(machine: str) -> dict:
    """A fresh copy of the golden ansible_facts.numa of a fixture machine."""
    if machine not in _CACHE:
        _CACHE[machine] = json.loads((SYSFS / f"{machine}.numa.json").read_text())
    return copy.deepcopy(_CACHE[machine])


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "user": "app", "cpus": 4}
    entry.update(changes)
    return entry


def plan(numa: dict, placements: list, host: str = "h", **kwargs) -> dict:
    return plan_host(host, numa, None, placements, [], POLICY, **kwargs)


def test_v100_memory_is_never_a_placements_memory():
    # Nodes 0 and 8 nearly full: the only memory left with room is the V100s' (12.75 GiB of
    # budget each, distance 80). The plan refuses rather than bind to GPU memory.
    placements = [
        p("fill0", node=0, memory="100G"),
        p("fill8", node=8, memory="100G"),
        p("small", memory="10G", allow_span=True),
    ]
    with pytest.raises(PlanError) as err:
        plan(numa_of("nvidiagpunumanodes"), placements)
    message = str(err.value)
    assert message.startswith("host h: numafleet_placements[2] (small) needs 10 GiB memory")
    assert "node250 0 GPUs, 0 CPUs, memory of GPU 0035:05:00.0 (never planned)" in message
    assert "node255 0 GPUs, 0 CPUs, memory of GPU 0004:05:00.0 (never planned)" in message


def test_v100_nodes_have_no_budget_and_no_placement_uses_them():
    placements = [p(f"s{i}", memory="20G", allow_span=True) for i in range(8)]
    result = plan(numa_of("nvidiagpunumanodes"), placements)
    assert {m for entry in result["placements"] for m in entry["mems"]} <= {0, 8}
    budgets = {node["id"]: node["budget_kb"] for node in result["nodes"]}
    assert {budgets[n] for n in V100_NODES} == {0}
    assert budgets[0] > 0 and budgets[8] > 0


def test_fallback_to_a_farther_node_is_said_in_warnings_and_summary():
    result = plan(
        numa_of("nvidiagpunumanodes"),
        [p("fill0", node=0, memory="100G"), p("next", node=0, memory="6G", allow_span=True)],
        host="power9-v100-01",
    )
    entry = result["placements"][1]
    assert (entry["nodes"], entry["mems"], entry["memory_node"]) == ([0], [0, 8], 8)
    note = (
        "memory on node 8, not on its CPU node 0 (distance 40 from node 0): the memory budget "
        "of node 0 is full"
    )
    assert note in entry["warnings"]
    assert f"placement next: {note}" in result["warnings"]
    summary = plan_summary(result)
    assert "fill0 node0 cpus 0-3; next node0 cpus 4-7 mems 0+8;" in summary
    assert " mems " not in summary.split(";")[0]  # fill0: memory on its own node, not shown


def test_memory_less_cpu_node_shows_its_memory_node_in_the_summary():
    result = plan(numa_of("synthetic-epyc-nps4"), [p("ingest", node=1, memory="64G")])
    assert plan_summary(result).startswith(
        "h: 1 placement: ingest node1 cpus 24-25,120-121 mems 0;"
    )


def test_gh200_memory_stays_off_the_hbm_node():
    numa = numa_of("synthetic-gh200")
    result = plan(numa, [p("triton", cpus=32, memory="200G")])
    assert result["placements"][0]["mems"] == [0]
    assert "mems" not in plan_summary(result)
    with pytest.raises(PlanError) as err:
        plan(numa, [p("big", memory="380G"), p("more", memory="40G", allow_span=True)])
    assert "node1 0 GPUs, 0 CPUs, memory of GPU 0009:01:00.0 (never planned)" in str(err.value)


def test_without_gpu_owner_the_hbm_node_would_be_taken():
    # The same host as the driver-less facts of an older collection: node 1 is plain memory-only
    # memory then, and the planner spills onto it. gpu_owner is what keeps it off.
    numa = numa_of("synthetic-gh200")
    for node in numa["nodes"]:
        node["gpu_owner"] = None
        node["normal_memory"] = None
    result = plan(numa, [p("big", memory="380G"), p("more", memory="40G", allow_span=True)])
    assert result["placements"][1]["mems"] == [0, 1]


def test_hugepages_extra_on_gpu_memory_are_refused_naming_the_gpu():
    with pytest.raises(PlacementError) as err:
        plan(
            numa_of("nvidiagpunumanodes"),
            [p("a")],
            hugepages_extra=[{"node": 250, "size": "2M", "count": 16}],
        )
    assert (
        "node 250 has no memory for hugepages (kind memory-only, memory of GPU 0035:05:00.0)"
        in (str(err.value))
    )


def _nps4_with(node0: dict, node2: dict) -> dict:
    numa = numa_of("synthetic-epyc-nps4")
    numa["nodes"][0].update(node0)
    numa["nodes"][2].update(node2)
    return numa


@pytest.mark.parametrize(
    ("node0", "node2", "why"),
    [
        ({"memory_tier": 22}, {"memory_tier": 4}, "memory tier 22, below tier 4"),
        ({"memory_backing": "cxl"}, {}, "CXL-backed"),
        ({"memory_backing": "dax"}, {}, "DAX-backed"),
        ({"normal_memory": False}, {"normal_memory": True}, "no normal memory zone"),
    ],
)
def test_memory_less_cpu_node_prefers_fast_memory_over_the_nearest_id(node0, node2, why):
    # CPU-only node 1: memory nodes 0 and 2 both at distance 12; node 0 wins the tie unless
    # it is the slower memory.
    numa = _nps4_with(node0, node2)
    assert slow_memory_nodes([numa["nodes"][0], numa["nodes"][2]]) == {0: why}
    result = plan(numa, [p("a", node=1, memory="8G")])
    assert result["placements"][0]["mems"] == [2]
    # When the fast memory is full, the slow node is taken, and the note says it is slower.
    result = plan(numa, [p("fill", node=2, memory="300G"), p("a", node=1, memory="100G")])
    entry = result["placements"][1]
    assert entry["mems"] == [0]
    assert entry["warnings"] == [
        f"memory on node 0, not on its CPU node 1 (distance 12 from node 1): node 1 has no "
        f"memory; node 0 is slower memory ({why})"
    ]


def test_same_tier_and_normal_memory_keep_the_distance_order():
    numa = _nps4_with({"memory_tier": 4, "normal_memory": True}, {"memory_tier": 4})
    assert slow_memory_nodes([numa["nodes"][0], numa["nodes"][2]]) == {}
    assert plan(numa, [p("a", node=1)])["placements"][0]["mems"] == [0]


def test_odd_fact_values_are_ignored_not_trusted():
    numa = _nps4_with({"memory_tier": True, "memory_backing": 7, "gpu_owner": 5}, {})
    assert plan(numa, [p("a", node=1)])["placements"][0]["mems"] == [0]


def test_a_kept_placement_on_gpu_memory_is_planned_again():
    numa = numa_of("nvidiagpunumanodes")
    placements = [p("solver", memory="4G")]
    first = plan(numa, placements)
    entry = copy.deepcopy(first["placements"][0])
    entry["mems"], entry["memory_node"] = [250], 250  # as an older plan could have recorded it
    recorded = parse_recorded(
        "h",
        {"state": "present", "plan": dict(first, placements=[entry]), "error": None},
        "/etc/numafleet/plan.json",
    )
    again = plan(numa, placements, recorded=recorded)
    assert again["placements"][0]["mems"] == [0]
    assert again["stability"]["solver"] == (
        "its memory node 250 is the memory of GPU 0035:05:00.0, which placements never use"
    )


def test_dax_memory_is_taken_after_farther_dram(fixture_root):
    """32em64t with its DAX range onlined as node 5 (distance 17 from node 0, DRAM node 1 at
    21): a placement of node 0 whose memory does not fit there takes node 1, not the nearer
    DAX node; only when node 1 is full too does it get node 5, and the warning says so."""
    import field_cases  # tests/unit/fixtures/field_cases.py

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import (
        read_numa_facts,
    )
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

    root = field_cases.dax_kmem_node_online(
        fixture_root("32em64t-2n8c+dax+nvme+mic+dimms", writable=True)
    )
    numa = read_numa_facts(Reader(f"{root}/sys", f"{root}/proc"))
    fill = p("fill0", node=0, cpus=2, memory="13G")
    spill = p("spill", node=0, cpus=2, memory="2G", allow_span=True)
    entry = plan(copy.deepcopy(numa), [fill, spill])["placements"][1]
    assert (entry["nodes"], entry["mems"]) == ([0], [0, 1])
    fill1 = p("fill1", node=1, cpus=2, memory="13G")
    entry = plan(copy.deepcopy(numa), [fill, fill1, spill])["placements"][2]
    assert (entry["nodes"], entry["mems"]) == ([0], [0, 5])
    assert entry["warnings"][-1] == (
        "memory on node 5, not on its CPU node 0 (distance 17 from node 0): the memory budget "
        "of node 0 is full; node 5 is slower memory (DAX-backed)"
    )
