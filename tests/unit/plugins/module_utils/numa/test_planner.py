"""The planner on the fixture machines' facts (golden numa JSON + GPU snapshots) and small
synthetic hosts: placement rules, MIG, MPS, tenants, memory, spanning and infeasible messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import trees  # tests/unit/fixtures/trees.py (on sys.path through tests/unit/conftest.py)
from synthetic_hosts import synthetic, synthetic_gpu  # tests/unit/synthetic_hosts.py

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, gpu_snapshot, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import format_cpulist
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

SYSFS = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs"
A100, H100, NPS4 = "synthetic-2x6338-4xa100", "synthetic-8xh100-2s", "synthetic-epyc-nps4"
VM, GH200, MI300X = "synthetic-vm-gpu-numa-unknown", "synthetic-gh200", "synthetic-mi300x-cpx"
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}


@pytest.fixture(scope="session")
def machine_facts(fixture_root):
    """Factory: (numa, gpu_topology) of a fixture machine, fresh copies for each call."""
    cache: dict = {}

    def make(machine: str) -> tuple:
        if machine not in cache:
            numa = json.loads((SYSFS / f"{machine}.numa.json").read_text(encoding="utf-8"))
            root = fixture_root(machine)
            snapshot = trees.GPU_SNAPSHOT_DIR / f"{machine}.json"
            state = (
                gpu_snapshot.read_snapshot(str(snapshot))
                if snapshot.is_file()
                else gpu.nvml_unavailable("no snapshot in the fixtures")
            )
            topology = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
            cache[machine] = (numa, json.loads(json.dumps(topology)))
        return copy.deepcopy(cache[machine])

    return make


def p(name: str, **changes) -> dict:
    """A placement of host_vars: exec /bin/app as user app, cpus 4 unless changed (user: None:
    runs as root, which the plan warns about)."""
    entry = {"name": name, "exec": "/bin/app", "cpus": 4}
    if "unit" not in changes:
        entry["user"] = "app"
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not None or key != "user"}


def plan(machine_facts, machine, placements, tenants=(), policy=None, host="h"):
    numa, gpus = machine_facts(machine)
    return plan_host(host, numa, gpus, list(placements), list(tenants), policy or POLICY)


def by_name(result: dict) -> dict:
    return {entry["name"]: entry for entry in result["placements"]}


def addresses(entry: dict) -> list:
    return [g["address"] for g in entry["gpus"]]


# ---------------------------------------------------------------------------------------------
# Whole GPUs


def test_two_gpus_come_from_one_node_with_its_cpus_and_memory(machine_facts):
    result = plan(machine_facts, A100, [p("llm", gpus=2, cpus=16, memory="64G")])
    (entry,) = result["placements"]
    # node 0 has one whole GPU (0000:17:00.0 has MIG enabled): only node 1 fits
    assert addresses(entry) == ["0000:b1:00.0", "0000:ca:00.0"]
    assert (entry["node"], entry["nodes"], entry["mems"], entry["spans"]) == (1, [1], [1], False)
    assert entry["cpus"] == list(range(32, 40)) + list(range(96, 104))
    assert entry["environment"]["CUDA_VISIBLE_DEVICES"] == ",".join(
        g["uuid"] for g in entry["gpus"]
    )
    assert entry["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert entry["cuda_visible_devices"] == entry["environment"]["CUDA_VISIBLE_DEVICES"]
    assert result["warnings"] == [] and entry["warnings"] == []


@pytest.mark.parametrize("given", ["b1:00.0", "B1:00.0", "0000:B1:00.0"])
def test_gpus_may_be_listed_by_the_short_address_the_summary_prints(machine_facts, given):
    result = plan(machine_facts, A100, [p("g", gpus=[given])])
    assert addresses(result["placements"][0]) == ["0000:b1:00.0"]
    assert "gpus b1:00.0" in plan_summary(result)


def test_short_address_in_another_pci_domain(machine_facts):
    result = plan(machine_facts, GH200, [p("g", gpus=["01:00.0"])])
    assert addresses(result["placements"][0]) == ["0009:01:00.0"]


def test_short_address_matching_gpus_of_two_domains_is_ambiguous():
    numa = synthetic()
    topology = {
        "gpus": [synthetic_gpu("0000:b1:00.0", 0), synthetic_gpu("0001:b1:00.0", 1)],
    }
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, topology, [p("g", gpus=["b1:00.0"])], [], POLICY)
    assert str(err.value) == (
        "host h: numafleet_placements[0] (g).gpus: b1:00.0 is ambiguous: it matches GPUs "
        "0000:b1:00.0, 0001:b1:00.0 (several PCI domains); write the full address with its "
        "domain, e.g. 0000:b1:00.0"
    )
    result = plan_host("h", numa, topology, [p("g", gpus=["0001:b1:00.0"])], [], POLICY)
    assert addresses(result["placements"][0]) == ["0001:b1:00.0"]


@pytest.mark.parametrize(
    ("requests", "want"),
    [
        # one GPU first: the smallest switch group that fits is a pair; the lowest address wins
        ([1, 2], [["0000:18:00.0"], ["0000:3a:00.0", "0000:5d:00.0"]]),
        # then a single GPU prefers the switch group with one GPU left over a full pair
        ([1, 2, 1], [["0000:18:00.0"], ["0000:3a:00.0", "0000:5d:00.0"], ["0000:2a:00.0"]]),
        ([2, 2], [["0000:18:00.0", "0000:2a:00.0"], ["0000:3a:00.0", "0000:5d:00.0"]]),
        # 3 GPUs: no switch holds 3, the NVLink-connected set of the lowest addresses
        ([3], [["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"]]),
        (
            [4, 4],
            [
                ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"],
                ["0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"],
            ],
        ),
    ],
)
def test_h100_prefers_gpus_under_one_pcie_switch(machine_facts, requests, want):
    result = plan(machine_facts, H100, [p(f"p{i}", gpus=n) for i, n in enumerate(requests)])
    assert [addresses(entry) for entry in result["placements"]] == want


def test_least_fragmentation_picks_the_node_left_with_fewest_free_gpus(machine_facts):
    result = plan(machine_facts, H100, [p("a", gpus=3), p("b", gpus=1), p("c", gpus=1)])
    got = by_name(result)
    # after a (3 GPUs on node 0) node 0 has 1 free GPU: b takes it (0 left) rather than node 1
    assert got["b"]["node"] == 0 and addresses(got["b"]) == ["0000:5d:00.0"]
    assert got["c"]["node"] == 1 and addresses(got["c"]) == ["0000:9a:00.0"]


def test_cpu_only_placements_go_to_the_node_with_fewest_free_gpus(machine_facts):
    result = plan(machine_facts, A100, [p("batch", cpus=8)])
    (entry,) = result["placements"]
    assert (entry["node"], entry["gpus"], entry["cuda_visible_devices"]) == (0, [], "")
    assert "CUDA_VISIBLE_DEVICES" not in entry["environment"]
    result = plan(machine_facts, H100, [p("llm", gpus=4), p("batch", cpus=8)])
    assert by_name(result)["batch"]["node"] == 0  # node 0 has no free GPU left


def test_cpu_only_ties_go_to_the_best_fit_then_lowest_node():
    numa = synthetic(cpus_per_node=(8, 4, 4), mem_gb=(16, 16, 16))
    result = plan_host("h", numa, None, [p("a", cpus=2), p("b", cpus=4)], [], POLICY)
    a, b = result["placements"]
    assert a["node"] == 1  # nodes 1 and 2 fit tighter than node 0; lowest id of those
    assert b["node"] == 2


# ---------------------------------------------------------------------------------------------
# CPUs


def test_smt_siblings_stay_together_and_counts_round_up_to_whole_cores(machine_facts):
    result = plan(machine_facts, A100, [p("a", cpus=3), p("b", cpus=1)])
    a, b = result["placements"]
    assert (a["cpus"], a["cpus_requested"]) == ([0, 1, 64, 65], 3)
    assert (b["cpus"], b["cpus_requested"]) == ([2, 66], 1)


def test_reserved_cpus_are_never_planned(machine_facts):
    policy = {"reserved_cpus": "0-1,64-65", "memory_headroom_pct": 15}
    result = plan(machine_facts, A100, [p("a", cpus=4)], policy=policy)
    assert result["reserved_cpus"] == [0, 1, 64, 65]
    assert result["placements"][0]["cpus"] == [2, 3, 66, 67]
    node0 = result["nodes"][0]
    assert not {0, 1, 64, 65} & set(node0["cpus_usable"])
    assert node0["cpus_planned"] == [2, 3, 66, 67]


def test_a_reserved_cpu_leaves_its_sibling_as_a_core_of_its_own():
    numa = synthetic(cpus_per_node=(4,), mem_gb=(16,))  # cores (0,2) and (1,3)
    result = plan_host(
        "h", numa, None, [p("a", cpus=2), p("b", cpus=1)], [], {"reserved_cpus": "0"}
    )
    a, b = result["placements"]
    assert (a["cpus"], b["cpus"]) == ([1, 3], [2])


def test_explicit_cpus_are_taken_as_given_and_isolated_ones_warn():
    numa = synthetic(cpus_per_node=(4, 4), isolated=(6,))
    result = plan_host(
        "h", numa, None, [p("pin", cpus="5-6"), p("count", cpus=1, node=1)], [], POLICY
    )
    pin, count = result["placements"]
    assert (pin["cpus"], pin["node"], pin["cpus_requested"]) == ([5, 6], 1, 2)
    assert "CPUs 6 are isolated" in pin["warnings"][0]
    assert result["warnings"][1].startswith("placement pin: CPUs 6 are isolated")
    # 6 is isolated (never usable for counts), and so is 4, its SMT sibling (a half-core);
    # 5's sibling 7 is left as a core of its own
    assert count["cpus"] == [7]


def test_explicit_cpus_across_nodes_span_with_a_warning():
    numa = synthetic()
    result = plan_host("h", numa, None, [p("pin", cpus="3-4")], [], POLICY)
    (entry,) = result["placements"]
    assert (entry["nodes"], entry["spans"], entry["mems"]) == ([0, 1], True, [0, 1])
    assert "span NUMA nodes 0, 1" in entry["warnings"][0]


# ---------------------------------------------------------------------------------------------
# Memory, hugepages


def test_memory_budget_keeps_the_headroom(machine_facts):
    numa, dummy = machine_facts(A100)
    budget = numa["nodes"][0]["memory_kb"] * 85 // 100
    result = plan(machine_facts, A100, [p("fits", node=0, memory=budget * 1024)])
    node0 = result["nodes"][0]
    assert (node0["budget_kb"], node0["planned_memory_kb"]) == (budget, budget)
    with pytest.raises(PlanError) as err:
        plan(machine_facts, A100, [p("big", node=0, memory=(budget + 1) * 1024)])
    assert str(err.value).startswith(
        "host h: numafleet_placements[0] (big) needs 214.1 GiB memory (hugepages included) on "
        "the memory node next to its CPUs on NUMA node 0, within the budget (capacity minus "
        "headroom); free per node: "
        "node0 1 GPU, 64 CPUs, 214.1 GiB memory; node1 2 GPUs, 64 CPUs, 216.3 GiB memory. "
        "Lower memory or hugepages, lower numafleet_memory_headroom_pct"
    )
    zero = plan(
        machine_facts,
        A100,
        [p("all", node=0, memory=numa["nodes"][0]["memory_kb"] * 1024)],
        policy={"memory_headroom_pct": 0},
    )
    assert zero["nodes"][0]["budget_kb"] == numa["nodes"][0]["memory_kb"]


def test_hugepages_are_charged_to_the_memory_node_and_pooled():
    numa = synthetic(mem_gb=(8, 8))  # budget 6.8 GiB per node at 15 %
    placements = [
        p("a", cpus=1, memory="4G", hugepages={"size": "2M", "count": 1024}),  # 6 GiB on node 0
        p(
            "b", cpus=1, memory="1G", hugepages={"size": "2M", "count": 512}
        ),  # no room left on node 0
        p("c", cpus=1, hugepages={"size": "1G", "count": 1}),
    ]
    result = plan_host("h", numa, None, placements, [], POLICY)
    a, b, c = result["placements"]
    assert a["hugepages"] == {"size_kb": 2048, "count": 1024, "node": 0}
    assert (b["node"], b["hugepages"]["node"]) == (1, 1)
    assert c["hugepages"] == {"size_kb": 1048576, "count": 1, "node": 1}
    assert result["nodes"][0]["planned_memory_kb"] == 6 << 20
    assert result["nodes"][0]["hugepages"] == [{"size_kb": 2048, "count": 1024}]
    assert result["nodes"][1]["hugepages"] == [
        {"size_kb": 2048, "count": 512},
        {"size_kb": 1048576, "count": 1},
    ]
    assert result["nodes"][1]["planned_memory_kb"] == 3 << 20  # b 1G + 1G pages, c 1G page


def test_hugepage_size_the_node_does_not_offer():
    numa = synthetic(hugepage_sizes=(2048,))
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("a", hugepages={"size": "1G", "count": 1})], [], POLICY)
    assert str(err.value) == (
        "host h: numafleet_placements[0] (a).hugepages.size: 1 GiB pages are not offered by the "
        "node (offered: 2 MiB); pick an offered size"
    )


# numafleet_hugepages_extra: planned, charged to the node first, part of nodes[].hugepages.


def test_hugepages_extra_are_planned_on_their_node():
    numa = synthetic(mem_gb=(8, 8))
    extra = [
        {"node": 0, "size": "2M", "count": 512},
        {"node": 1, "size": "1G", "count": 1},
        {"node": 0, "size": 2048, "count": 256},  # kB as a number
        {"node": 1, "size": "2048kB", "count": 0},
    ]
    placements = [p("a", cpus=1, node=0, hugepages={"size": "2M", "count": 1024})]
    result = plan_host("h", numa, None, placements, [], POLICY, hugepages_extra=extra)
    node0, node1 = result["nodes"]
    assert node0["hugepages"] == [{"size_kb": 2048, "count": 1024 + 512 + 256}]
    assert node0["hugepages_extra"] == [{"size_kb": 2048, "count": 768}]
    assert node0["planned_memory_kb"] == (1024 + 768) * 2048
    assert node1["hugepages"] == node1["hugepages_extra"] == [{"size_kb": 1048576, "count": 1}]
    assert node1["planned_memory_kb"] == 1 << 20
    # Through the policy as well; and no extras: the same plan as before, with empty lists.
    assert (
        plan_host("h", numa, None, placements, [], {**POLICY, "hugepages_extra": extra}) == result
    )
    plain = plan_host("h", numa, None, placements, [], POLICY)
    assert [n["hugepages_extra"] for n in plain["nodes"]] == [[], []]
    assert plain["nodes"][0]["hugepages"] == [{"size_kb": 2048, "count": 1024}]
    assert plan_host("h", numa, None, placements, [], POLICY, hugepages_extra=None) == plain


def test_hugepages_extra_reduce_the_budget_of_their_node():
    numa = synthetic(mem_gb=(8, 8))  # budget 6.8 GiB per node at 15 %
    placements = [p("a", cpus=1, node=0, memory="5G")]
    assert plan_host("h", numa, None, placements, [], POLICY)["placements"][0]["mems"] == [0]
    extra = [{"node": 0, "size": "2M", "count": 1024}]  # 2 GiB first: 4.8 GiB left on node 0
    with pytest.raises(PlanError) as err:
        plan_host("h", numa, None, placements, [], POLICY, hugepages_extra=extra)
    message = str(err.value)
    assert message.startswith(
        "host h: numafleet_placements[0] (a) needs 5 GiB memory (hugepages included) on the "
        "memory node next to its CPUs on NUMA node 0, within the budget (capacity minus "
        "headroom); free per node: node0 0 GPUs, 4 CPUs, 4.8 GiB memory; "
    )
    assert message.endswith(
        "Lower memory or hugepages, lower numafleet_hugepages_extra (reserved first), lower "
        "numafleet_memory_headroom_pct, or remove another placement."
    )
    # On the other node they leave node 0 alone.
    other = [{"node": 1, "size": "2M", "count": 1024}]
    result = plan_host("h", numa, None, placements, [], POLICY, hugepages_extra=other)
    assert result["nodes"][1]["planned_memory_kb"] == 2 << 20


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"node": 0, "size": "2M", "count": 512},
            "numafleet_hugepages_extra: {'node': 0, 'size': '2M', 'count': 512} is not a list; "
            "write a list of {node: 0, size: 2M, count: 512}",
        ),
        (
            ["0:2M:512"],
            "numafleet_hugepages_extra[0]: '0:2M:512' is not a mapping; write "
            "{node: 0, size: 2M, count: 512}",
        ),
        (
            [{"node": 0, "size": "2M", "count": 1, "nodes": 1}],
            "numafleet_hugepages_extra[0]: unknown key 'nodes'; allowed keys: node, size, count",
        ),
        (
            [{"size": "2M", "count": 1}],
            "numafleet_hugepages_extra[0].node: None is not a NUMA node id; write e.g. node: 0",
        ),
        (
            [{"node": 0, "size": "2M", "count": 1}, {"node": -1, "size": "2M", "count": 1}],
            "numafleet_hugepages_extra[1].node: -1 is not a NUMA node id; write e.g. node: 0",
        ),
        (
            [{"node": True, "size": "2M", "count": 1}],
            "numafleet_hugepages_extra[0].node: True is not a NUMA node id; write e.g. node: 0",
        ),
        (
            [{"node": 0, "size": "3M", "count": 1}],
            "numafleet_hugepages_extra[0].size: '3M' is not a hugepage size; write 2M, 1G or the "
            "page size in kB (2048)",
        ),
        (
            [{"node": 0, "count": 1}],
            "numafleet_hugepages_extra[0].size: None is not a hugepage size; write 2M, 1G or the "
            "page size in kB (2048)",
        ),
        (
            [{"node": 0, "size": "2M", "count": -1}],
            "numafleet_hugepages_extra[0].count: -1 is not a count >= 0; write e.g. count: 512",
        ),
        (
            [{"node": 0, "size": "2M", "count": "512"}],
            "numafleet_hugepages_extra[0].count: '512' is not a count >= 0; write e.g. count: 512",
        ),
        (
            [{"node": 5, "size": "2M", "count": 1}],
            "numafleet_hugepages_extra[0].node: node 5 does not exist (nodes: 0, 1, 2); pick an "
            "existing node",
        ),
        (
            [{"node": 2, "size": "2M", "count": 1}],
            "numafleet_hugepages_extra[0].node: node 2 has no memory for hugepages (kind "
            "cpu-only); pick one of 0, 1",
        ),
        (
            [{"node": 1, "size": "1G", "count": 1}],
            "numafleet_hugepages_extra[0].size: 1 GiB pages are not offered by node 1 (offered: "
            "2 MiB); pick an offered size",
        ),
        (
            [{"node": 0, "size": "1G", "count": 7}],
            "numafleet_hugepages_extra[0]: 7 x 1 GiB pages (7 GiB) do not fit in the memory "
            "budget of node 0 (6.8 GiB, capacity minus headroom); lower count, lower "
            "numafleet_memory_headroom_pct, or put some of the pages on another node",
        ),
        (
            [{"node": 0, "size": "1G", "count": 4}, {"node": 0, "size": "2M", "count": 2048}],
            "numafleet_hugepages_extra[1]: 2048 x 2 MiB pages (4 GiB) do not fit in the memory "
            "budget of node 0 (6.8 GiB, capacity minus headroom, 4 GiB of it taken by earlier "
            "entries); lower count, lower numafleet_memory_headroom_pct, or put some of the "
            "pages on another node",
        ),
    ],
)
def test_bad_hugepages_extra_fail_with_their_message(extra, message):
    numa = synthetic(cpus_per_node=(4, 4, 4), mem_gb=(8, 8, 0))
    numa["nodes"][1]["hugepages"] = [{"size_kb": 2048}]
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("a", cpus=1)], [], POLICY, hugepages_extra=extra)
    assert str(err.value) == f"host h: {message}"


@pytest.mark.parametrize(
    ("placement", "mems"),
    [
        (p("a", node=1), [0]),  # CPU-only node 1: memory nodes 0 and 2 tie at 12 -> 0
        (p("b", node=3), [0]),
        (p("c", node=1, memory="300G"), [0]),
    ],
)
def test_memory_less_cpu_node_gets_the_nearest_memory_node(machine_facts, placement, mems):
    result = plan(machine_facts, NPS4, [placement])
    entry = result["placements"][0]
    assert (entry["node"], entry["mems"]) == (placement["node"], mems)
    # The plan says that the memory is not on the CPU node, and why.
    node = placement["node"]
    assert entry["warnings"] == [
        f"memory on node 0, not on its CPU node {node} (distance 12 from node {node}): "
        f"node {node} has no memory"
    ]


def test_memory_less_cpu_node_moves_to_the_next_memory_node_when_the_nearest_is_full(
    machine_facts,
):
    result = plan(
        machine_facts, NPS4, [p("fill", node=0, memory="300G"), p("next", node=1, memory="100G")]
    )
    assert by_name(result)["next"]["mems"] == [2]
    assert result["nodes"][2]["planned_memory_kb"] == 100 << 20
    assert result["nodes"][1]["budget_kb"] == 0


def test_cpu_only_nodes_are_used_for_gpus_next_to_them(machine_facts):
    result = plan(machine_facts, NPS4, [p("l40s", gpus=1, memory="8G")])
    (entry,) = result["placements"]
    assert (entry["node"], entry["mems"], addresses(entry)) == (2, [2], ["0000:41:00.0"])


# ---------------------------------------------------------------------------------------------
# MIG


def test_mig_reuses_existing_instances_lowest_start_first(machine_facts):
    result = plan(
        machine_facts,
        A100,
        [
            p("e1", mig_profile="2g.20gb"),
            p("e2", mig_profile="2g.20gb"),
            p("e3", mig_profile="3g.40gb"),
        ],
    )
    e1, e2, e3 = result["placements"]
    assert e1["gpus"][0]["mig"] == {
        "profile": "2g.20gb",
        "placement_start": 0,
        "placement_size": 2,
        "device_uuid": "MIG-4d5fc52b-3870-57b6-a399-78174c05bf0a",
        "existing": True,
    }
    assert e1["cuda_visible_devices"] == "MIG-4d5fc52b-3870-57b6-a399-78174c05bf0a"
    assert e2["gpus"][0]["mig"]["placement_start"] == 2
    assert e3["gpus"][0]["mig"]["device_uuid"] == "MIG-d2370484-ec09-58f3-9dd0-11e29c0f61ab"
    assert {e["node"] for e in (e1, e2, e3)} == {0}
    mig_gpu = result["gpus"][0]
    assert (mig_gpu["address"], mig_gpu["use"], mig_gpu["placements"]) == (
        "0000:17:00.0",
        "mig",
        ["e1", "e2", "e3"],
    )
    assert [
        (s["profile"], s["placement_start"], s["placement"]) for s in mig_gpu["mig"]["layout"]
    ] == [
        ("2g.20gb", 0, "e1"),
        ("2g.20gb", 2, "e2"),
        ("3g.40gb", 4, "e3"),
    ]
    with pytest.raises(PlanError) as err:
        plan(machine_facts, A100, [p(f"e{i}", mig_profile="2g.20gb") for i in range(1, 4)])
    assert str(err.value).startswith(
        "host h: numafleet_placements[2] (e3) needs a free 2g.20gb MIG slot and 4 CPUs on one "
        "NUMA node; free per node: "
    )
    assert str(err.value).endswith(
        "Profiles with a free slot on the MIG GPUs: 3g.40gb; pick one of those, free a slot, or "
        "remove another placement."
    )
    with pytest.raises(PlanError) as err:
        plan(machine_facts, A100, [*placements_e1_e3(), p("e4", mig_profile="1g.10gb")])
    assert str(err.value).endswith(
        ". No MIG profile has a free slot left on the MIG GPUs; free a slot or remove another "
        "placement."
    )
    with pytest.raises(PlanError) as err:
        plan(machine_facts, A100, [p("e1", mig_profile="2g.20gb", cpus=100)])
    assert str(err.value).endswith(". Lower cpus or memory, or remove another placement.")


def placements_e1_e3() -> list:
    return [
        p("e1", mig_profile="2g.20gb"),
        p("e2", mig_profile="2g.20gb"),
        p("e3", mig_profile="3g.40gb"),
    ]


def test_new_mig_instance_takes_the_lowest_free_placement_start(machine_facts):
    numa, topology = machine_facts(A100)
    mig = topology["gpus"][0]["mig"]
    mig["gpu_instances"] = [i for i in mig["gpu_instances"] if i["profile_name"] != "3g.40gb"]
    placements = [p("new", mig_profile="3g.40gb", mps={"active_thread_percentage": 50})]
    result = plan_host("h", numa, topology, placements, [], POLICY)
    (entry,) = result["placements"]
    assert entry["gpus"][0]["mig"] == {
        "profile": "3g.40gb",
        "placement_start": 4,  # 0 overlaps the existing 2g.20gb at 0
        "placement_size": 4,
        "device_uuid": None,
        "existing": False,
    }
    assert entry["cuda_visible_devices"] == ""
    # No GPU at all until the instance exists (not every GPU the process would otherwise see).
    assert entry["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "does not exist yet" in entry["warnings"][0]
    layout = result["gpus"][0]["mig"]["layout"]
    assert [(s["placement_start"], s["placement"]) for s in layout] == [
        (0, None),
        (2, None),
        (4, "new"),
    ]
    # the new instance gets its own MPS daemon
    (daemon,) = result["mps_daemons"]
    assert daemon["clients"] == ["new"] and daemon["device_uuid"] is None
    # no unit, never started: it waits for the instance as its client does
    assert daemon["unit"] is None and daemon["waits_for"] == entry["waits_for"]
    assert daemon["active_thread_percentage"] == 50
    assert entry["mps"]["pipe_dir"] == daemon["pipe_dir"]


@pytest.mark.parametrize(
    ("machine", "placement", "message"),
    [
        (
            A100,
            p("m", mig_profile="5g.50gb"),
            "host h: numafleet_placements[0] (m).mig_profile: '5g.50gb' is not offered by the "
            "MIG-enabled GPUs (offered: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, "
            "7g.80gb); pick one of those",
        ),
        (
            H100,
            p("m", mig_profile="1g.10gb"),
            "host h: numafleet_placements[0] (m).mig_profile: no GPU of this host has MIG enabled; "
            "enable MIG (nvidia-smi -mig 1) on a GPU or remove mig_profile",
        ),
        (
            A100,
            p("m", mig_profile="1g.10gb", gpus=["0000:31:00.0"]),
            "host h: numafleet_placements[0] (m).gpus: 0000:31:00.0 does not have MIG enabled; "
            "list one of 0000:17:00.0 or enable MIG on it",
        ),
        (
            A100,
            p("m", gpus=["0000:17:00.0"]),
            "host h: numafleet_placements[0] (m).gpus: 0000:17:00.0 has MIG enabled and only "
            "serves MIG instances; set mig_profile or list another GPU",
        ),
    ],
)
def test_mig_errors(machine_facts, machine, placement, message):
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, machine, [placement])
    assert str(err.value) == message


def test_mig_gpu_is_never_given_whole_and_whole_gpus_never_get_mig(machine_facts):
    result = plan(machine_facts, A100, [p("w", gpus=1, node=0), p("m", mig_profile="2g.20gb")])
    got = by_name(result)
    assert addresses(got["w"]) == ["0000:31:00.0"] and addresses(got["m"]) == ["0000:17:00.0"]
    by = {g["address"]: g for g in result["gpus"]}
    assert (by["0000:31:00.0"]["use"], by["0000:31:00.0"]["mig"]) == (
        "whole",
        {
            "mode": "disabled",
            "mode_current": "disabled",
            "declared": False,
            "layout": [],
            "reset_required": False,
        },
    )
    assert by["0000:17:00.0"]["use"] == "mig"
    with pytest.raises(PlanError, match=r"\(w\) needs 2 GPUs on NUMA node 0"):
        plan(machine_facts, A100, [p("w", gpus=2, node=0)])


# ---------------------------------------------------------------------------------------------
# MPS


def test_mps_clients_of_one_daemon_must_share_a_user(machine_facts):
    placements = [
        p("a", gpus=1, user="tei", mps={"active_thread_percentage": 40}),
        p("b", gpus=1, user="vllm", mps={"active_thread_percentage": 60}),
    ]
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, H100, placements)
    message = str(err.value)
    assert "numafleet_placements[1] (b).user" in message
    assert "a runs as tei, b runs as vllm" in message
    assert "0700" not in message and "private to its user" in message


def test_mps_clients_share_a_gpu_and_one_daemon(machine_facts):
    placements = [
        p("a", gpus=1, mps={"active_thread_percentage": 40, "pinned_memory_limit": "8G"}),
        p("b", gpus=1, mps={"active_thread_percentage": 60}),
        p("whole", gpus=1),
    ]
    result = plan(machine_facts, H100, placements)
    a, b, whole = result["placements"]
    assert addresses(a) == addresses(b) == ["0000:18:00.0"]
    assert a["gpus"][0]["shared_mps"] and not whole["gpus"][0]["shared_mps"]
    assert addresses(whole) == ["0000:2a:00.0"]
    uuid = a["gpus"][0]["uuid"]
    assert a["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/nvidia-mps/{uuid}"
    assert a["environment"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert a["environment"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in b["environment"]
    assert a["mps"] == {
        "pipe_dir": f"/run/nvidia-mps/{uuid}",
        "log_dir": f"/var/log/nvidia-mps/{uuid}",
        "active_thread_percentage": 40,
        "pinned_memory_limit_kb": 8 << 20,
    }
    assert result["mps_daemons"] == [
        {
            "device_uuid": uuid,
            "gpu_address": "0000:18:00.0",
            "pipe_dir": f"/run/nvidia-mps/{uuid}",
            "log_dir": f"/var/log/nvidia-mps/{uuid}",
            "clients": ["a", "b"],
            "active_thread_percentage": 60,
            "waits_for": None,
            "instance": uuid,
            "unit": f"nvidia-mps@{uuid}.service",
            "gpu_uuid": uuid,
            "mig": False,
            "node": a["node"],
            # the usable CPUs of the GPU's node, not the clients' union: a client's change
            # must not change (and restart) the daemon
            "cpus": next(n for n in result["nodes"] if n["id"] == a["node"])["cpus_usable"],
            "mems": a["mems"],
            "user": "app",
            "group": None,
            "pinned_memory_limit_kb": 8 << 20,
        }
    ]
    shared = result["gpus"][0]
    assert (shared["use"], shared["mps"]["clients"]) == ("mps", ["a", "b"])
    assert shared["mps"]["pinned_memory_limit_kb_total"] == 8 << 20


def test_mps_pinned_memory_must_fit_the_gpu(machine_facts):
    limit = {"pinned_memory_limit": "60G"}
    result = plan(machine_facts, H100, [p("a", gpus=1, mps=limit), p("b", gpus=1, mps=limit)])
    a, b = result["placements"]
    assert addresses(a) != addresses(b)  # 120 GiB does not fit one 80 GiB H100


def test_mps_does_not_share_a_whole_gpu(machine_facts):
    result = plan(machine_facts, A100, [p("w", gpus=1, node=0), p("m", gpus=1, mps={})])
    assert addresses(by_name(result)["m"]) == ["0000:b1:00.0"]


# ---------------------------------------------------------------------------------------------
# Tenants, units, output


def test_two_tenants_get_slices_with_the_union_of_their_placements(machine_facts):
    tenants = [
        {"name": "team-b", "memory_max": "infinity"},
        {"name": "team-a", "memory_max": "200G"},
    ]
    placements = [
        p("a1", tenant="team-a", gpus=1),
        p("b1", tenant="team-b", cpus=2),
        p("a2", tenant="team-a", gpus=1, node=1),
        p("free", cpus=2),
    ]
    result = plan(machine_facts, A100, placements, tenants=tenants)
    assert [t["name"] for t in result["tenants"]] == ["team-a", "team-b"]
    team_a, team_b = result["tenants"]
    got = by_name(result)
    assert team_a == {
        "name": "team-a",
        "slice": "numafleet-team\\x2da.slice",
        "memory_max_kb": 200 << 20,
        "description": "numafleet tenant team-a",
        "cpus": sorted(got["a1"]["cpus"] + got["a2"]["cpus"]),
        "mems": [0, 1],
        "placements": ["a1", "a2"],
    }
    assert (team_b["memory_max_kb"], team_b["placements"]) == (None, ["b1"])
    assert got["b1"]["slice"] == "numafleet-team\\x2db.slice"
    assert got["free"]["slice"] == "numafleet.slice" and got["free"]["tenant"] is None


@pytest.mark.parametrize(
    ("name", "slice_name"),
    [
        ("a", "numafleet-a.slice"),
        ("team-a", "numafleet-team\\x2da.slice"),
        ("a_b-c", "numafleet-a_b\\x2dc.slice"),
    ],
)
def test_tenant_slices_are_systemd_escaped(name, slice_name):
    assert units.slice_name(name) == slice_name


def test_tenant_memory_max_must_hold_its_placements(machine_facts):
    placements = [
        p("a", tenant="team-a", memory="8G"),
        p("b", tenant="team-a", memory="2G", hugepages={"size": "2M", "count": 1024}),
        p("c", tenant="team-a", hugepages={"size": "2M", "count": 1}),
        p("other", tenant="team-b", memory="100G"),
    ]
    tenants = [{"name": "team-a", "memory_max": "10G"}, {"name": "team-b"}]
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, A100, placements, tenants=tenants)
    assert str(err.value) == (
        "host h: numafleet_tenants[0] (team-a).memory_max: 10 GiB is less than the 12 GiB of "
        "memory and hugepages its placements ask for (a 8 GiB, b 2 GiB + 2 GiB hugepages, c 2 "
        "MiB hugepages); raise memory_max to at least 12290M, lower their memory or hugepages, "
        "or move a placement to another tenant"
    )
    tenants[0]["memory_max"] = "12290M"  # exactly enough
    assert len(plan(machine_facts, A100, placements, tenants=tenants)["placements"]) == 4


def test_unit_placements_are_dropins(machine_facts):
    result = plan(machine_facts, A100, [p("vllm", exec=None, unit="vllm.service")])
    (entry,) = result["placements"]
    assert (entry["unit"], entry["unit_kind"], entry["exec"], entry["argv"]) == (
        "vllm.service",
        "dropin",
        None,
        [],
    )
    assert entry["hardening"] is None


def test_plan_shape_and_summary(machine_facts):
    placements = [
        p("llm-70b", exec="/opt/llm/bin/serve --port 8000", user="llm", gpus=2, cpus=16),
        p("embed", mig_profile="2g.20gb", mps={}, environment={"HF_HOME": "/srv/hf"}),
    ]
    result = plan(machine_facts, A100, placements, host="gpu-a100-01")
    assert list(result) == [
        "version",
        "host",
        "reserved_cpus",
        "memory_headroom_pct",
        "placements",
        "tenants",
        "nodes",
        "gpus",
        "mps_daemons",
        "mig_gpus",
        "stability",
        "warnings",
        "allowed",
    ]
    assert list(result["placements"][0]) == [
        "name", "index", "unit", "unit_kind", "exec", "argv", "description", "user", "group",
        "tenant", "slice", "node", "nodes", "spans", "near", "cpus", "cpus_requested", "mems",
        "memory_node", "memory_kb", "hugepages", "gpus", "cuda_visible_devices", "mps",
        "environment", "waits_for", "hardening", "request", "warnings",
    ]  # fmt: skip
    assert list(result["nodes"][0]) == [
        "id", "kind", "memory_kb", "budget_kb", "planned_memory_kb", "cpus_usable",
        "cpus_planned", "hugepages", "hugepages_extra", "gpus",
    ]  # fmt: skip
    assert list(result["gpus"][0]) == ["address", "uuid", "node", "use", "placements", "mig", "mps"]
    assert result["placements"][1]["environment"]["HF_HOME"] == "/srv/hf"
    assert json.loads(json.dumps(result)) == result
    assert plan_summary(result) == (
        "gpu-a100-01: 2 placements: llm-70b node1 cpus 32-39,96-103 gpus b1:00.0,ca:00.0; "
        "embed node0 cpus 0-1,64-65 gpus 17:00.0 mig 2g.20gb@0 mps"
    )
    assert (
        plan_summary({"host": "x", "placements": [], "warnings": ["w"]})
        == "x: 0 placements; 1 warning"
    )


def test_planning_is_deterministic_and_inputs_are_not_changed(machine_facts):
    numa, topology = machine_facts(H100)
    placements = [p("a", gpus=2), p("b", gpus=1, mps={}), p("c", cpus=10, allow_span=True)]
    before = copy.deepcopy((numa, topology, placements))
    first = plan_host("h", numa, topology, placements, [], POLICY)
    second = plan_host("h", numa, topology, placements, [], POLICY)
    assert first == second
    assert (numa, topology, placements) == before


def test_hosts_without_gpu_facts_plan_cpu_only(machine_facts):
    numa, dummy = machine_facts(A100)
    for topology in (None, {}, {"gpus": []}):
        result = plan_host("h", numa, topology, [p("a")], [], POLICY)
        assert result["gpus"] == [] and result["placements"][0]["node"] == 0


# ---------------------------------------------------------------------------------------------
# Unknown locality, spanning


def test_unknown_locality_gpu_is_a_fallback_with_a_warning(machine_facts):
    result = plan(machine_facts, VM, [p("one", gpus=1, cpus=2)])
    (entry,) = result["placements"]
    assert addresses(entry) == ["0000:07:00.0"] and entry["warnings"] == []  # known first
    result = plan(machine_facts, VM, [p("two", gpus=2, cpus=2)], host="vm-gpu-01")
    (entry,) = result["placements"]
    assert addresses(entry) == ["0000:06:00.0", "0000:07:00.0"]
    assert entry["node"] == 1
    assert result["warnings"] == [
        "placement two: GPU 0000:06:00.0 has unknown NUMA locality (numa_node -1, or a node that "
        "does not exist); CPUs and "
        "memory were placed on node 1 by CPU/memory fit. Set node: if you know the GPU's node"
    ]


def test_pinned_unknown_locality_gpu_is_placed_by_cpu_fit(machine_facts):
    result = plan(machine_facts, VM, [p("vm", gpus=["0000:06:00.0"], cpus=2, node=1)])
    (entry,) = result["placements"]
    assert (entry["node"], entry["gpus"][0]["node"]) == (1, None)
    assert "unknown NUMA locality" in entry["warnings"][0]
    result = plan(machine_facts, VM, [p("vm", gpus=["0000:06:00.0"], cpus=2)])
    assert result["placements"][0]["node"] == 0  # by fit: node 0 has no free GPU to keep


def test_node_or_cpus_away_from_a_listed_gpu_need_allow_span(machine_facts):
    for changes in ({"node": 1}, {"cpus": "32-35"}):
        result = plan(
            machine_facts, A100, [p("g", gpus=["0000:31:00.0"], allow_span=True, **changes)]
        )
        (entry,) = result["placements"]
        assert entry["node"] == 1 and addresses(entry) == ["0000:31:00.0"]
        assert (
            "GPU 0000:31:00.0 is on node 0, not next to the placement's CPUs"
            in (entry["warnings"][0])
        )
    # agreeing with the GPU needs nothing
    result = plan(machine_facts, A100, [p("g", gpus=["31:00.0"], node=0, cpus="4-5")])
    assert result["placements"][0]["cpus"] == [4, 5] and result["warnings"] == []


def test_allow_span_takes_the_nearest_nodes(machine_facts):
    result = plan(machine_facts, H100, [p("huge", cpus=200, allow_span=True)])
    (entry,) = result["placements"]
    assert (entry["nodes"], entry["spans"], entry["mems"]) == ([0, 1], True, [0, 1])
    assert len(entry["cpus"]) == 200
    assert "spans NUMA nodes 0, 1" in entry["warnings"][0]
    result = plan(machine_facts, H100, [p("wide", gpus=6, allow_span=True)])
    (entry,) = result["placements"]
    assert len(entry["gpus"]) == 6 and entry["spans"]


def test_span_only_when_no_single_node_fits(machine_facts):
    result = plan(machine_facts, H100, [p("small", cpus=8, allow_span=True)])
    assert result["placements"][0]["spans"] is False and result["warnings"] == []


# ---------------------------------------------------------------------------------------------
# Errors that need the facts


@pytest.mark.parametrize(
    ("machine", "placements", "policy", "message"),
    [
        (
            A100,
            [p("big", gpus=3)],
            None,
            "host h: numafleet_placements[0] (big) needs 3 GPUs on one NUMA node; free per node: "
            "node0 1 GPU, 64 CPUs, 214.1 GiB memory; node1 2 GPUs, 64 CPUs, 216.3 GiB memory. "
            "Lower gpus, set allow_span: true, or remove another placement.",
        ),
        (
            H100,
            [p("big", cpus=200)],
            None,
            "host h: numafleet_placements[0] (big) needs 200 CPUs on one NUMA node; free per "
            "node: node0 4 GPUs, 112 CPUs, 856.5 GiB memory; node1 4 GPUs, 112 CPUs, 865.2 GiB "
            "memory. Lower cpus, set allow_span: true, or remove another placement.",
        ),
        (
            H100,
            [p("a", gpus=8, cpus=8, allow_span=True), p("b", gpus=1)],
            None,
            "host h: numafleet_placements[1] (b) needs 1 GPU on one NUMA node; free per node: "
            "node0 0 GPUs, 104 CPUs",
        ),
        (
            A100,
            [p("big", cpus=300, allow_span=True)],
            None,
            "needs 300 CPUs, even spanning nodes; free per node: node0 1 GPU, "
            "64 CPUs, 214.1 GiB memory; node1 2 GPUs, 64 CPUs, 216.3 GiB memory. Lower cpus, or "
            "remove another placement.",
        ),
        (
            H100,
            [p("w", gpus=9, cpus=8, allow_span=True)],
            None,
            "host h: numafleet_placements[0] (w) needs 9 GPUs and 8 CPUs, even spanning nodes; "
            "free per node: node0 4 GPUs, 112 CPUs, 856.5 GiB memory; node1 4 GPUs, 112 CPUs, "
            "865.2 GiB memory. Lower gpus, or remove another placement.",
        ),
        (
            A100,
            [p("w", cpus=130, node=1, allow_span=True)],
            None,
            "host h: numafleet_placements[0] (w) needs 130 CPUs from NUMA node 1, even spanning "
            "nodes; free per node",
        ),
        (
            A100,
            [p("g", gpus=["0000:31:00.0"], node=1)],
            None,
            "host h: numafleet_placements[0] (g).node: node 1 is not the node of GPU "
            "0000:31:00.0, which is on node 0; drop node: (the CPUs follow the GPUs), list GPUs "
            "of node 1, or set allow_span: true to run the CPUs on node 1 anyway",
        ),
        (
            A100,
            [p("g", gpus=["0000:31:00.0"], cpus="30-33")],
            None,
            "host h: numafleet_placements[0] (g).cpus: CPUs 32-33 are on node 1, but GPU "
            "0000:31:00.0 is on node 0; pin CPUs of node 0, list GPUs of node 1, or set "
            "allow_span: true to keep the CPUs away from the GPU",
        ),
        (
            A100,
            [p("g", gpus=["0000:31:00.0", "0000:b1:00.0"], node=0)],
            None,
            "host h: numafleet_placements[0] (g).gpus: the listed GPUs sit on nodes 0, 1; list "
            "GPUs of one node or set allow_span: true",
        ),
        (
            A100,
            [p("g", gpus=["b1:00.0", "0000:b1:00.0"])],
            None,
            "host h: numafleet_placements[0] (g).gpus lists 0000:b1:00.0 twice (as b1:00.0 and "
            "0000:b1:00.0); list it once",
        ),
        (
            A100,
            [p("g", gpus=["99:00.0"])],
            None,
            "host h: numafleet_placements[0] (g).gpus: 99:00.0 is not a GPU of this host (known: "
            "0000:17:00.0, 0000:31:00.0, 0000:b1:00.0, 0000:ca:00.0)",
        ),
        (
            A100,
            [p("n", node=1, cpus=8), p("m", node=1, cpus=60)],
            None,
            "host h: numafleet_placements[1] (m) needs 60 CPUs on NUMA node 1; free per node: "
            "node0 1 GPU, 64 CPUs, 214.1 GiB memory; node1 2 GPUs, 56 CPUs",
        ),
        (
            A100,
            [p("g", gpus=["0000:99:00.0"])],
            None,
            "host h: numafleet_placements[0] (g).gpus: 0000:99:00.0 is not a GPU of this host "
            "(known: 0000:17:00.0, 0000:31:00.0, 0000:b1:00.0, 0000:ca:00.0); list PCI addresses "
            "or UUIDs from ansible_facts.gpu_topology",
        ),
        (
            A100,
            [p("g", gpus=["0000:31:00.0", "GPU-fdb5df64-11ce-5c72-a560-9702875cecd6"])],
            None,
            "host h: numafleet_placements[0] (g).gpus lists 0000:31:00.0 twice (by address and "
            "UUID); list it once",
        ),
        (
            A100,
            [p("a", gpus=1, node=0), p("b", gpus=["0000:31:00.0"])],
            None,
            "host h: numafleet_placements[1] (b) lists GPU 0000:31:00.0, already given to a; "
            "list another GPU or use gpus: <count>",
        ),
        (
            A100,
            [p("g", gpus=["0000:31:00.0", "0000:b1:00.0"])],
            None,
            "host h: numafleet_placements[0] (g).gpus: the listed GPUs sit on nodes 0, 1; list "
            "GPUs of one node or set allow_span: true",
        ),
        (
            A100,
            [p("n", node=2)],
            None,
            "host h: numafleet_placements[0] (n).node: node 2 does not exist (nodes: 0, 1); "
            "pick an existing node",
        ),
        (
            GH200,
            [p("n", node=1)],
            None,
            "host h: numafleet_placements[0] (n).node: node 1 has no CPUs a placement can use "
            "(kind memory-only, memory of GPU 0009:01:00.0); pick one of 0",
        ),
        (
            A100,
            [p("c", cpus="200-201")],
            None,
            "host h: numafleet_placements[0] (c).cpus: CPU 200 does not exist on this host (it "
            "has 0-127); fix the cpulist",
        ),
        (
            A100,
            [p("c", cpus="0-3")],
            {"reserved_cpus": "2"},
            "host h: numafleet_placements[0] (c).cpus: CPU 2 is in numafleet_reserved_cpus; pin "
            "other CPUs or shrink the reserved set",
        ),
        (
            A100,
            [p("a", cpus="4-7"), p("b", cpus="7-8")],
            None,
            "host h: numafleet_placements[1] (b).cpus: CPU 7 is already given to a; pin other "
            "CPUs or use a count",
        ),
        (
            A100,
            [p("a", cpus="4-7", node=1)],
            None,
            "host h: numafleet_placements[0] (a): cpus 4-7 are on node(s) 0, not on node 1; drop "
            "node: or pin CPUs of that node",
        ),
        (
            A100,
            [p("a")],
            {"reserved_cpus": "0-200"},
            "host h: numafleet_reserved_cpus: CPUs 128-200 are not on this host (it has 0-127); "
            "fix the cpulist",
        ),
        (
            A100,
            [p("a")],
            {"reserved_cpus": "32-63,96-127"},
            "host h: numafleet_reserved_cpus covers every online CPU of node 1 (32-63,96-127); "
            "leave at least one core of each node for placements",
        ),
        (
            MI300X,
            [p("a", gpus=1, mps={})],
            None,
            "host h: numafleet_placements[0] (a).mps: every GPU of this host is AMD; MPS is "
            "NVIDIA only; use partition: cpx to share an AMD GPU",
        ),
        (
            MI300X,
            [p("a", gpus=["0000:03:00.0"], mps={})],
            None,
            "host h: numafleet_placements[0] (a).mps: GPU 0000:03:00.0 is AMD; MPS is NVIDIA "
            "only; use partition: cpx to share an AMD GPU",
        ),
        (
            A100,
            [p("a", gpus=1, environment={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})],
            None,
            "host h: numafleet_placements[0] (a).environment sets CUDA_DEVICE_ORDER, which the "
            "planner sets for this placement from its GPUs; remove it",
        ),
    ],
)
def test_errors_name_host_placement_and_fix(machine_facts, machine, placements, policy, message):
    with pytest.raises(PlanError) as err:
        plan(machine_facts, machine, placements, policy=policy)
    assert message in str(err.value)
    assert str(err.value).startswith("host h: numafleet_")


def test_offline_cpus_cannot_be_pinned():
    numa = synthetic(offline=(3,))
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("a", cpus="2-3")], [], POLICY)
    assert str(err.value) == (
        "host h: numafleet_placements[0] (a).cpus: CPU 3 is offline; pin online CPUs only"
    )
    result = plan_host("h", numa, None, [p("b", cpus=3, node=0)], [], POLICY)
    assert 3 not in result["placements"][0]["cpus"]


def test_offline_fixture_machine_plans_around_offline_cpus(machine_facts):
    numa = json.loads((SYSFS / "16em64t-4s2c2t-offlines.numa.json").read_text(encoding="utf-8"))
    offline = set(numa["cpus"]["offline"])
    result = plan_host("h", numa, None, [p("a", cpus=8)], [], POLICY)
    assert offline and not offline & set(result["placements"][0]["cpus"])


def test_amd_gpus_are_visible_by_uuid_through_rocr_not_cuda(machine_facts):
    result = plan(machine_facts, MI300X, [p("rocm", gpus=2)])
    (entry,) = result["placements"]
    assert (
        entry["cuda_visible_devices"] == "" and "CUDA_VISIBLE_DEVICES" not in entry["environment"]
    )
    # The two whole (SPX) GPUs of node 0; the CPX GPUs are never given whole.
    assert addresses(entry) == ["0000:03:00.0", "0000:23:00.0"]
    uuids = [gpu["uuid"] for gpu in entry["gpus"]]
    assert all(uuid.startswith("GPU-") for uuid in uuids)
    assert entry["environment"]["ROCR_VISIBLE_DEVICES"] == ",".join(uuids)
    assert not any("has no UUID" in warning for warning in entry["warnings"])


def test_no_numa_facts_is_an_error():
    with pytest.raises(PlanError, match="host h: no NUMA facts"):
        plan_host("h", {}, None, [], [], POLICY)


# ---------------------------------------------------------------------------------------------
# Second break test: MPS memory, MIG locality, MIG + MPS


def test_mps_pinned_memory_over_a_listed_gpu_names_the_gpu_and_its_clients(machine_facts):
    limit = {"pinned_memory_limit": "40G"}
    placements = [p(f"r{i}", gpus=["31:00.0"], mps=limit, cpus=2) for i in range(3)]
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, A100, placements)
    assert str(err.value) == (
        "host h: numafleet_placements[2] (r2).mps.pinned_memory_limit: 40 GiB does not fit GPU "
        "0000:31:00.0: it has 80 GiB of memory and its MPS clients r0, r1 already pinned 80 GiB, "
        "0 KiB is left; list another GPU, or use gpus: 1 to let the planner pick a GPU with room"
    )
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, A100, [p("big", gpus=["31:00.0"], mps={"pinned_memory_limit": "100G"})])
    assert str(err.value) == (
        "host h: numafleet_placements[0] (big).mps.pinned_memory_limit: 100 GiB does not fit GPU "
        "0000:31:00.0: it has 80 GiB of memory and no other MPS client pinned any of it; lower "
        "pinned_memory_limit to at most 80G, list another GPU, or use gpus: 1 to let the planner "
        "pick a GPU with room"
    )
    placements[2] = p("r2", gpus=["31:00.0"], mps={"pinned_memory_limit": "60G"}, cpus=2)
    placements[1] = p("r1", gpus=["31:00.0"], mps={"pinned_memory_limit": "10G"}, cpus=2)
    with pytest.raises(
        PlacementError,
        match=r"already pinned 50 GiB, 30 GiB is left; lower "
        r"pinned_memory_limit to at most 30G, list another GPU",
    ):
        plan(machine_facts, A100, placements)
    placements[2] = p("r2", gpus=["31:00.0"], mps={"pinned_memory_limit": "30G"}, cpus=2)
    assert len(plan(machine_facts, A100, placements)["placements"]) == 3  # exactly full


def test_mig_away_from_the_mig_gpus_node_is_refused_like_whole_gpus(machine_facts):
    # the only MIG GPU, 0000:17:00.0, is on node 0
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, A100, [p("m", mig_profile="2g.20gb", node=1, cpus=2)])
    assert str(err.value) == (
        "host h: numafleet_placements[0] (m).node: node 1 is not the node of the MIG GPU(s) "
        "offering 2g.20gb (0000:17:00.0 on node 0); drop node: (the CPUs follow the GPUs), "
        "enable MIG on a GPU of node 1, or set allow_span: true to run the CPUs on node 1 anyway"
    )
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, A100, [p("m", mig_profile="2g.20gb", cpus="32-33")])
    assert str(err.value) == (
        "host h: numafleet_placements[0] (m).cpus: CPUs 32-33 are on node 1, but the MIG GPU(s) "
        "offering 2g.20gb (0000:17:00.0 on node 0) are on node 0; pin CPUs of node 0, use a "
        "count of cpus, or set allow_span: true to keep the CPUs away from the GPU"
    )


@pytest.mark.parametrize("where", [{"node": 1, "cpus": 2}, {"cpus": "32-33"}])
def test_mig_away_from_its_gpu_with_allow_span_runs_the_cpus_there(machine_facts, where):
    result = plan(machine_facts, A100, [p("m", mig_profile="2g.20gb", allow_span=True, **where)])
    (entry,) = result["placements"]
    assert entry["node"] == 1 and entry["cpus"] in ([32, 33], [32, 96])
    assert addresses(entry) == ["0000:17:00.0"]
    assert entry["gpus"][0]["mig"]["placement_start"] == 0
    assert any("GPU 0000:17:00.0 is on node 0, not next to" in w for w in entry["warnings"])


def test_mig_mps_pinned_memory_must_fit_one_instance(machine_facts):
    mps = {"pinned_memory_limit": "30G"}
    with pytest.raises(PlacementError) as err:
        plan(machine_facts, A100, [p("m", mig_profile="2g.20gb", mps=mps)])
    assert str(err.value) == (
        "host h: numafleet_placements[0] (m).mps.pinned_memory_limit: 30 GiB is more than the "
        "19.5 GiB of memory of one 2g.20gb MIG instance; lower pinned_memory_limit to at most "
        "19968M, or pick a larger mig_profile"
    )
    mps = {"pinned_memory_limit": "19968M"}
    (entry,) = plan(machine_facts, A100, [p("m", mig_profile="2g.20gb", mps=mps)])["placements"]
    assert entry["environment"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=19968M"


def test_two_mps_placements_cannot_share_one_mig_instance(machine_facts):
    placements = [p(f"m{i}", mig_profile="3g.40gb", mps={}, cpus=2) for i in range(2)]
    with pytest.raises(PlanError) as err:
        plan(machine_facts, A100, placements)
    text = str(err.value)
    assert text.startswith("host h: numafleet_placements[1] (m1) needs a free 3g.40gb MIG slot")
    assert (
        ". Sharing one MIG instance between placements is not supported (each MIG placement "
        "gets its own instance; the 3g.40gb instances are taken by m0): to share one, make it a "
        "single placement. " in text
    )


def test_counts_take_whole_free_cores_before_siblings_of_pinned_cpus(machine_facts):
    result = plan(machine_facts, A100, [p("p1", cpus="1-1"), p("p2", cpus=3, node=0)])
    p1, p2 = result["placements"]
    assert p1["cpus"] == [1]
    # CPU 65 is the sibling of p1's CPU 1: whole cores 0/64 and 2/66 come first
    assert p2["cpus"] == [0, 2, 64, 66] and p2["warnings"] == []
    assert result["warnings"] == []


def test_a_count_that_gets_a_pinned_cpus_sibling_warns():
    numa = synthetic(cpus_per_node=(8,), mem_gb=(16,))  # cores 0/4, 1/5, 2/6, 3/7
    placements = [p("a", cpus="1-3"), p("b", cpus=3)]
    result = plan_host("h", numa, None, placements, [], POLICY)
    a, b = result["placements"]
    assert b["cpus"] == [0, 4, 5]  # the whole core 0/4 first, then CPU 5 (sibling of a's 1)
    assert b["warnings"] == [
        "CPU 5 shares a core with CPU 1 of a (SMT siblings): no whole free core was left for "
        "it; pin CPUs with cpus: to choose others"
    ]
    assert result["warnings"] == [f"placement b: {b['warnings'][0]}"]


def _siblings(numa: dict, **lists) -> dict:
    """numa with the siblings of some CPUs replaced: _siblings(numa, cpu0=None, cpu2=[])."""
    for entry in numa["per_cpu"]:
        key = f"cpu{entry['id']}"
        if key in lists:
            entry["siblings"] = lists[key]
    return numa


@pytest.mark.parametrize(
    ("numa", "reserved", "cpus", "planned"),
    [
        # Facts without siblings for a CPU (None or []): every CPU without them is a core alone.
        (
            _siblings(synthetic(), cpu0=None, cpu5=None, cpu2=[], cpu7=[]),
            "",
            [2, 2, 1, 1],
            [[0, 1, 3], [4, 6], [2], [5]],
        ),
        # Sibling lists that disagree (0: 0+1, 1: 1+2): one CPU per group, lowest first.
        (_siblings(synthetic(), cpu0=[0, 1], cpu1=[1, 2]), "", [1, 2, 1], [[4, 6], [5, 7], [0, 1]]),
        # A sibling on another node (1: 1+5) is left out of the group on node 0.
        (_siblings(synthetic(), cpu1=[1, 5]), "", [1, 2, 2], [[4, 6], [5, 7], [0, 2]]),
        # A reserved CPU leaves its sibling a core of one CPU, taken last.
        (synthetic(), "0", [1, 2, 1], [[1, 3], [4, 6], [2]]),
        # An isolated CPU's SMT sibling is never given to a count: whole cores only.
        (synthetic(isolated=(2,)), "", [1, 2, 1], [[1, 3], [4, 6], [5, 7]]),
        (synthetic(offline=(7,)), "4-5", [1], [[6]]),
    ],
)
def test_cores_from_irregular_sibling_facts(numa, reserved, cpus, planned):
    placements = [p(f"c{i}", cpus=count) for i, count in enumerate(cpus)]
    policy = {"reserved_cpus": reserved, "memory_headroom_pct": 15}
    result = plan_host("h", numa, None, placements, [], policy)
    assert [entry["cpus"] for entry in result["placements"]] == planned


def test_reserved_cpus_and_offline_ones_may_not_leave_a_node_without_cpus():
    numa = synthetic(offline=(7,))
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("a", cpus=1)], [], {"reserved_cpus": "4-6"})
    assert str(err.value) == (
        "host h: numafleet_reserved_cpus covers every online CPU of node 1 (4-6); leave at least "
        "one core of each node for placements"
    )


def test_multi_gpu_requests_prefer_one_pcie_switch_over_node_fragmentation(machine_facts):
    singles = [
        p(f"s{i}", gpus=[a], cpus=2) for i, a in enumerate(["18:00.0", "3a:00.0", "9a:00.0"])
    ]
    result = plan(machine_facts, H100, [*singles, p("pair", gpus=2)])
    # node 0 keeps 2a:00.0 + 5d:00.0 (two switches), node 1 keeps ab, ba + db (one switch)
    pair = by_name(result)["pair"]
    assert (pair["node"], addresses(pair)) == (1, ["0000:ba:00.0", "0000:db:00.0"])


# ---------------------------------------------------------------------------------------------
# near: a placement anchored on a PCI device's node (NIC, NVMe drive, CXL memory, GPU)

A100_NIC, A100_NVME = "0000:4b:00.0", "0000:65:00.0"  # both on node 0 of the A100 tree


def _without(entry: dict, *keys) -> dict:
    return {key: value for key, value in entry.items() if key not in keys}


@pytest.mark.parametrize(
    ("near", "kind"),
    [(A100_NIC, "nic"), ("4B:00.0", "nic"), (A100_NVME, "nvme"), ("65:00.0", "nvme")],
)
def test_near_plans_the_placement_as_node_of_the_device(machine_facts, near, kind):
    # x takes a GPU of node 1: a CPU-only placement then goes to node 1 by itself (tighter fit)
    first = p("x", gpus=["b1:00.0"])
    free = plan(machine_facts, A100, [first, p("d", cpus=8, memory="16G")])
    assert by_name(free)["d"]["node"] == 1 and by_name(free)["d"]["near"] is None
    anchored = plan(machine_facts, A100, [first, p("d", cpus=8, memory="16G", near=near)])
    pinned = plan(machine_facts, A100, [first, p("d", cpus=8, memory="16G", node=0)])
    entry = by_name(anchored)["d"]
    address = A100_NIC if kind == "nic" else A100_NVME
    assert entry["near"] == {"address": address, "kind": kind, "node": 0}
    assert (entry["node"], entry["nodes"], entry["mems"]) == (0, [0], [0])
    assert entry["cpus"] == [0, 1, 2, 3, 64, 65, 66, 67]
    # exactly what node: 0 gives, apart from the near entry
    assert _without(entry, "near", "request") == _without(by_name(pinned)["d"], "near", "request")
    assert (entry["request"]["near"], entry["request"]["node"]) == (near.lower(), None)
    assert by_name(pinned)["d"]["near"] is None
    assert _without(anchored, "placements") == _without(pinned, "placements")
    assert plan_summary(anchored) == (
        "h: 2 placements: x node1 cpus 32-33,96-97 gpus b1:00.0; "
        f"d node0 cpus 0-3,64-67 near {address[5:]}"
    )


def test_near_also_sets_the_node_of_counted_gpus(machine_facts):
    result = plan(machine_facts, H100, [p("free", gpus=2)])
    assert result["placements"][0]["node"] == 0  # by itself: node 0
    result = plan(machine_facts, H100, [p("rdma", gpus=2, near="9b:00.0")])
    (entry,) = result["placements"]
    assert entry["near"] == {"address": "0000:9b:00.0", "kind": "nic", "node": 1}
    assert entry["node"] == 1 and all(g["node"] == 1 for g in entry["gpus"])
    assert len(entry["gpus"]) == 2 and result["warnings"] == []
    assert plan_summary(result).endswith(" near 9b:00.0")


def test_near_gpus_must_come_from_the_anchor_node(machine_facts):
    # node 0 of the A100 has one whole GPU (17:00.0 is in MIG mode): two do not fit there
    with pytest.raises(PlanError) as err:
        plan(machine_facts, A100, [p("d", gpus=2, near=A100_NIC)])
    assert str(err.value).startswith(
        "host h: numafleet_placements[0] (d) needs 2 GPUs on NUMA node 0 (from near: "
        "0000:4b:00.0); free per node: node0 1 GPU, 64 CPUs"
    )
    assert str(err.value).endswith("Lower gpus, set allow_span: true, or remove another placement.")
    result = plan(machine_facts, A100, [p("d", gpus=1, near=A100_NIC)])
    assert addresses(result["placements"][0]) == ["0000:31:00.0"]


def test_near_with_a_listed_gpu_of_the_anchor_node(machine_facts):
    result = plan(machine_facts, A100, [p("d", gpus=["31:00.0"], near=A100_NVME, cpus="4-5")])
    (entry,) = result["placements"]
    assert (entry["node"], entry["cpus"], addresses(entry)) == (0, [4, 5], ["0000:31:00.0"])
    assert entry["near"]["kind"] == "nvme" and result["warnings"] == []


def test_near_with_allow_span_keeps_the_cpus_next_to_the_device(machine_facts):
    placements = [p("d", gpus=["b1:00.0"], near=A100_NIC, allow_span=True)]
    (entry,) = plan(machine_facts, A100, placements)["placements"]
    assert entry["node"] == 0 and addresses(entry) == ["0000:b1:00.0"]
    assert "GPU 0000:b1:00.0 is on node 1, not next to the placement's CPUs" in entry["warnings"][0]


def test_near_a_device_whose_node_was_inferred_from_its_local_cpus(machine_facts):
    # 07:00.0 of the VM has numa_node -1, but its local_cpulist is exactly node 1's CPUs
    result = plan(machine_facts, VM, [p("d", cpus=2, near="07:00.0")])
    (entry,) = result["placements"]
    assert entry["near"] == {"address": "0000:07:00.0", "kind": "gpu", "node": 1}
    assert entry["node"] == 1 and entry["gpus"] == []


def test_near_and_node_that_agree(machine_facts):
    result = plan(machine_facts, A100, [p("d", near=A100_NIC, node=0)])
    assert result["placements"][0]["near"] == {"address": A100_NIC, "kind": "nic", "node": 0}


NEAR_ERRORS = [
    (
        "unknown device",
        A100,
        [p("d", near="0000:99:00.0")],
        "host h: numafleet_placements[0] (d).near: 0000:99:00.0 is not a GPU, NIC, NVMe drive or "
        "CXL memory device of this host (known: 0000:4b:00.0 (nic, node 0), 0000:65:00.0 (nvme, "
        "node 0), 0000:17:00.0 (gpu, node 0), 0000:31:00.0 (gpu, node 0), 0000:b1:00.0 (gpu, "
        "node 1) and 1 more); write an address of ansible_facts.numa.pci_devices",
    ),
    (
        "unknown short address",
        H100,
        [p("d", near="4b:00.0")],
        "(d).near: 4b:00.0 is not a GPU, NIC, NVMe drive or CXL memory device of this host "
        "(known: 0000:19:00.0 (nic, node 0), 0000:3b:00.0 (nic, node 0), 0000:9b:00.0 (nic, "
        "node 1), 0000:bb:00.0 (nic, node 1), 0000:18:00.0 (gpu, node 0) and 7 more)",
    ),
    (
        "unknown locality",
        VM,
        [p("d", cpus=2, near="06:00.0")],
        "host h: numafleet_placements[0] (d).near: GPU 0000:06:00.0 has unknown NUMA locality "
        "(numa_node -1 and its local CPUs lie in no single node), so it gives no node to anchor "
        "on; drop near: and pin node: N instead if you know the node it is attached to (nodes "
        "with CPUs: 0, 1)",
    ),
    (
        "unknown locality NIC",
        VM,
        [p("d", cpus=2, near="0000:01:00.0", node=1)],
        "(d).near: NIC 0000:01:00.0 has unknown NUMA locality",
    ),
    (
        "node disagrees",
        A100,
        [p("d", near=A100_NIC, node=1)],
        "host h: numafleet_placements[0] (d): node: 1 and near: 0000:4b:00.0 disagree: NIC "
        "0000:4b:00.0 is on node 0; drop node: (near: pins the placement to the device's node) "
        "or drop near: to keep node 1",
    ),
    (
        "listed GPU of another node",
        A100,
        [p("d", gpus=["b1:00.0"], near=A100_NIC)],
        "host h: numafleet_placements[0] (d).near: node 0 (from near: 0000:4b:00.0) is not the "
        "node of GPU 0000:b1:00.0, which is on node 1; drop near: (the CPUs follow the GPUs), "
        "list GPUs of node 0, or set allow_span: true to run the CPUs on node 0 anyway",
    ),
    (
        "listed GPU of another node, node: too",
        A100,
        [p("d", gpus=["b1:00.0"], near=A100_NIC, node=0)],
        "(d).near: node 0 (from near: 0000:4b:00.0) is not the node of GPU 0000:b1:00.0, which "
        "is on node 1; drop near: and node: (the CPUs follow the GPUs)",
    ),
    (
        "pinned CPUs of another node",
        A100,
        [p("d", cpus="32-35", near=A100_NVME)],
        "host h: numafleet_placements[0] (d): cpus 32-35 are on node(s) 1, not on node 0 (from "
        "near: 0000:65:00.0); drop near: or pin CPUs of that node",
    ),
    (
        "MIG GPU of another node",
        A100,
        [p("d", mig_profile="1g.10gb", near="b1:00.0")],
        "host h: numafleet_placements[0] (d).near: node 1 (from near: 0000:b1:00.0) is not the "
        "node of the MIG GPU(s) offering 1g.10gb (0000:17:00.0 on node 0); drop near: (the "
        "CPUs follow the GPUs), enable MIG on a GPU of node 1",
    ),
    (
        "too many CPUs",
        A100,
        [p("d", cpus=100, near=A100_NIC)],
        "host h: numafleet_placements[0] (d) needs 100 CPUs on NUMA node 0 (from near: "
        "0000:4b:00.0); free per node",
    ),
]


@pytest.mark.parametrize(
    ("case", "machine", "placements", "message"), NEAR_ERRORS, ids=[c[0] for c in NEAR_ERRORS]
)
def test_near_errors(machine_facts, case, machine, placements, message):
    with pytest.raises(PlanError) as err:
        plan(machine_facts, machine, placements)
    assert message in str(err.value), f"{case}: {err.value}"


def test_near_errors_are_placement_errors_with_distinct_messages(machine_facts):
    messages = set()
    for case, machine, placements, dummy in NEAR_ERRORS:
        with pytest.raises(PlanError) as err:
            plan(machine_facts, machine, placements)
        if case != "too many CPUs":  # infeasible, not bad input
            assert isinstance(err.value, PlacementError), case
        messages.add(str(err.value))
    assert len(messages) == len(NEAR_ERRORS)


def _with_devices(numa: dict, *devices) -> dict:
    numa["pci_devices"] = [
        {"address": address, "kind": kind, "numa_node": node, "node": node}
        for address, kind, node in devices
    ]
    return numa


def test_near_a_device_on_a_node_without_cpus():
    # node 2 is CXL memory (no CPUs), nearer to node 1 than to node 0
    numa = synthetic(
        cpus_per_node=(4, 4, 0),
        mem_gb=(16, 16, 64),
        distances=[[10, 20, 30], [20, 10, 15], [30, 15, 10]],
    )
    numa = _with_devices(numa, ("0000:c0:00.0", "cxl_memory", 2), ("0000:4b:00.0", "nic", 1))
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("kv", cpus=2, near="c0:00.0")], [], POLICY)
    assert str(err.value) == (
        "host h: numafleet_placements[0] (kv).near: CXL memory device 0000:c0:00.0 is on node 2, "
        "which has no CPUs a placement can use (kind memory-only); write node: 1 (the nearest "
        "node with CPUs) instead of near:"
    )
    result = plan_host("h", numa, None, [p("kv", cpus=2, near="4b:00.0")], [], POLICY)
    assert result["placements"][0]["node"] == 1


def test_near_a_short_address_of_two_pci_domains_is_ambiguous():
    numa = _with_devices(synthetic(), ("0000:4b:00.0", "nic", 0), ("0001:4b:00.0", "nvme", 1))
    with pytest.raises(PlacementError) as err:
        plan_host("h", numa, None, [p("d", near="4b:00.0")], [], POLICY)
    assert str(err.value) == (
        "host h: numafleet_placements[0] (d).near: 4b:00.0 is ambiguous: it matches PCI devices "
        "0000:4b:00.0, 0001:4b:00.0 (several PCI domains); write the full address with its "
        "domain, e.g. 0000:4b:00.0"
    )
    result = plan_host("h", numa, None, [p("d", near="0001:4b:00.0")], [], POLICY)
    assert result["placements"][0]["near"] == {"address": "0001:4b:00.0", "kind": "nvme", "node": 1}


def test_near_on_a_host_whose_facts_list_no_pci_device():
    for numa in (synthetic(), _with_devices(synthetic())):
        with pytest.raises(PlacementError) as err:
            plan_host("h", numa, None, [p("d", near="4b:00.0")], [], POLICY)
        assert str(err.value) == (
            "host h: numafleet_placements[0] (d).near: 4b:00.0 is not a PCI device of this host, "
            "which lists no GPU, NIC, NVMe drive or CXL memory device "
            "(ansible_facts.numa.pci_devices is empty); pin node: instead"
        )


def test_near_does_not_move_earlier_placements(machine_facts):
    before = plan(machine_facts, H100, [p("a", gpus=2), p("b", cpus=8)])
    after = plan(machine_facts, H100, [p("a", gpus=2), p("b", cpus=8), p("c", near="bb:00.0")])
    assert after["placements"][:2] == before["placements"]
    assert after["placements"][2]["node"] == 1


# ---------------------------------------------------------------------------------------------
# Declared MIG layouts (numafleet_mig_gpus)

MIG_GPU = "0000:17:00.0"  # A100 fixture: 2g.20gb@0, 2g.20gb@2, 3g.40gb@4 exist


def plan_mig(machine_facts, machine, placements, mig_gpus):
    numa, gpus = machine_facts(machine)
    return plan_host("h", numa, gpus, list(placements), [], POLICY, mig_gpus=mig_gpus)


def layout_of(result: dict, address: str = MIG_GPU) -> list:
    mig = {g["address"]: g for g in result["gpus"]}[address]["mig"]
    return [
        (s["profile"], s["placement_start"], s["placement"], s["device_uuid"] is not None)
        for s in mig["layout"]
    ]


def test_declared_layout_keeps_matching_instances_and_adds_new_ones(machine_facts):
    declared = [
        {
            "gpu": "17:00.0",
            "layout": ["3g.40gb", {"profile": "2g.20gb", "start": 0}, "1g.10gb", "1g.10gb"],
        }
    ]
    result = plan_mig(machine_facts, A100, [p("small", mig_profile="1g.10gb")], declared)
    # 2g.20gb@2 is not declared: it is left out (the role destroys it); the two 1g.10gb
    # instances take the lowest free slices, and the placement gets the first of them.
    assert layout_of(result) == [
        ("2g.20gb", 0, None, True),
        ("1g.10gb", 2, "small", False),
        ("1g.10gb", 3, None, False),
        ("3g.40gb", 4, None, True),
    ]
    mig = {g["address"]: g for g in result["gpus"]}[MIG_GPU]["mig"]
    assert (mig["mode"], mig["mode_current"], mig["declared"]) == ("enabled", "enabled", True)
    small = by_name(result)["small"]
    assert small["gpus"][0]["mig"]["placement_start"] == 2
    assert any("does not exist yet" in w for w in small["warnings"])


def test_declared_layout_is_exact_for_placements(machine_facts):
    declared = [{"gpu": MIG_GPU, "layout": ["3g.40gb"]}]
    result = plan_mig(machine_facts, A100, [p("e", mig_profile="3g.40gb")], declared)
    assert layout_of(result) == [("3g.40gb", 4, "e", True)]
    with pytest.raises(
        PlanError, match=r"\(f\).*0000:17:00.0 \(numafleet_mig_gpus\[0\]\) is declared"
    ):
        plan_mig(
            machine_facts,
            A100,
            [p("e", mig_profile="3g.40gb"), p("f", mig_profile="1g.10gb")],
            declared,
        )


def test_declared_compute_profile_is_planned(machine_facts):
    declared = [
        {"gpu": MIG_GPU, "layout": [{"profile": "3g.40gb", "compute_profile": "1c.3g.40gb"}]}
    ]
    result = plan_mig(machine_facts, A100, [], declared)
    mig = {g["address"]: g for g in result["gpus"]}[MIG_GPU]["mig"]
    # The existing 3g.40gb has a full-size compute instance: a new one is planned instead.
    assert [(s["profile"], s["compute_profile"], s["device_uuid"]) for s in mig["layout"]] == [
        ("3g.40gb", "1c.3g.40gb", None)
    ]


def test_declared_disabled_gpu_is_whole_only_once_mig_is_off(machine_facts):
    declared = [{"gpu": MIG_GPU, "mode": "disabled"}]
    # While MIG is still on (the change may wait for a reset), nobody gets the GPU.
    result = plan_mig(machine_facts, A100, [p("three", gpus=3, cpus=4, allow_span=True)], declared)
    assert MIG_GPU not in addresses(by_name(result)["three"])
    mig = {g["address"]: g for g in result["gpus"]}[MIG_GPU]["mig"]
    assert mig == {
        "mode": "disabled",
        "mode_current": "enabled",
        "declared": True,
        "layout": [],
        "reset_required": False,
    }
    with pytest.raises(PlanError, match="needs 4 GPUs"):
        plan_mig(machine_facts, A100, [p("all", gpus=4, cpus=4, allow_span=True)], declared)
    with pytest.raises(PlacementError) as err:
        plan_mig(machine_facts, A100, [p("w", gpus=[MIG_GPU])], declared)
    assert str(err.value) == (
        "host h: numafleet_placements[0] (w).gpus: 0000:17:00.0 leaves MIG mode in this run "
        "(numafleet_mig_gpus[0].mode: disabled), which may need a GPU reset; list it once MIG is "
        "off (run site.yml again after the change), or list another GPU"
    )
    # Once the facts show MIG off, the same declaration makes it a whole GPU.
    numa, gpus = machine_facts(A100)
    entry = next(g for g in gpus["gpus"] if g["address"] == MIG_GPU)
    entry["mig"].update(mode_current="disabled", mode_pending="disabled", gpu_instances=[])
    result = plan_host(
        "h", numa, gpus, [p("all", gpus=4, cpus=4, allow_span=True)], [], POLICY, mig_gpus=declared
    )
    assert MIG_GPU in addresses(by_name(result)["all"])


@pytest.mark.parametrize(
    ("compute", "message"),
    [
        (
            "4c.3g.40gb",
            "compute_profile: 4c.3g.40gb asks for 4 slices, but a 3g.40gb GPU instance on "
            "0000:17:00.0 takes compute instances of 1, 2, 3 slices; write one of 1c.3g.40gb, "
            "2c.3g.40gb or leave compute_profile out",
        ),
        ("0c.3g.40gb", "compute_profile: 0c.3g.40gb asks for 0 slices"),
    ],
)
def test_declared_compute_profile_must_fit_the_instance(machine_facts, compute, message):
    declared = [
        {"gpu": MIG_GPU, "layout": ["2g.20gb", {"profile": "3g.40gb", "compute_profile": compute}]}
    ]
    with pytest.raises(PlacementError) as err:
        plan_mig(machine_facts, A100, [], declared)
    assert str(err.value).startswith(f"host h: numafleet_mig_gpus[0].layout[1].{message}")


def test_declared_enable_on_a_gpu_without_listed_profiles(machine_facts):
    gpu = "0000:18:00.0"  # H100 fixture: MIG disabled, profiles not listed
    result = plan_mig(machine_facts, H100, [p("whole", gpus=8, cpus=2)][:0], [{"gpu": gpu}])
    mig = {g["address"]: g for g in result["gpus"]}[gpu]["mig"]
    assert mig == {
        "mode": "enabled",
        "mode_current": "disabled",
        "declared": True,
        "layout": [],
        "reset_required": False,
    }
    with pytest.raises(PlanError, match="needs 8 GPUs"):
        plan_mig(machine_facts, H100, [p("whole", gpus=8, cpus=2, allow_span=True)], [{"gpu": gpu}])
    with pytest.raises(PlacementError) as err:
        plan_mig(machine_facts, H100, [], [{"gpu": gpu, "layout": ["1g.10gb"]}])
    assert str(err.value) == (
        "host h: numafleet_mig_gpus[0].layout: MIG is disabled on 0000:18:00.0 and its driver "
        "lists MIG profiles only in MIG mode, so the layout cannot be checked yet; run once with "
        "mode: enabled and no layout (that enables MIG), then add the layout"
    )


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (
            [{"gpu": "0000:99:00.0"}],
            "numafleet_mig_gpus[0].gpu: 0000:99:00.0 is not a GPU of this host (GPUs: "
            "0000:17:00.0, 0000:31:00.0, 0000:b1:00.0, 0000:ca:00.0); write one of those "
            "addresses or its UUID",
        ),
        (
            [{"gpu": MIG_GPU, "layout": ["5g.50gb"]}],
            "numafleet_mig_gpus[0].layout[0].profile: 5g.50gb is not offered by 0000:17:00.0 "
            "(offered: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb); pick an "
            "offered profile",
        ),
        (
            [{"gpu": MIG_GPU, "layout": [{"profile": "3g.40gb", "start": 2}]}],
            "numafleet_mig_gpus[0].layout[0].start: 3g.40gb cannot start at slice 2 on "
            "0000:17:00.0 (possible starts: 0, 4); pick one of them or leave start out",
        ),
        (
            [{"gpu": MIG_GPU, "layout": ["4g.40gb", "3g.40gb", "1g.10gb"]}],
            "numafleet_mig_gpus[0].layout[2]: 1g.10gb does not fit on 0000:17:00.0 next to "
            "4g.40gb@0, 3g.40gb@4; give the instances start: values that fit (nvidia-smi mig "
            "-lgipp lists them) or drop one",
        ),
        (
            [{"gpu": MIG_GPU, "layout": ["3g.40gb"] * 3}],
            "numafleet_mig_gpus[0].layout: 3 x 3g.40gb on 0000:17:00.0, which allows at most 2; "
            "lower the count",
        ),
        (
            [{"gpu": MIG_GPU}, {"gpu": "17:00.0", "mode": "disabled"}],
            "numafleet_mig_gpus[1].gpu: 0000:17:00.0 is also numafleet_mig_gpus[0]; declare each "
            "GPU once",
        ),
        (
            {"gpu": MIG_GPU},
            "numafleet_mig_gpus: {'gpu': '0000:17:00.0'} is not a list; write a list of {gpu: "
            "0000:17:00.0, mode: enabled, layout: [3g.40gb, 2g.20gb]}",
        ),
        (
            [{"gpu": MIG_GPU, "mode": "on"}],
            "numafleet_mig_gpus[0].mode: 'on' is not one of enabled, disabled; write mode: "
            "enabled or mode: disabled (YAML reads a bare on/off/yes/no as true/false)",
        ),
        (
            [{"gpu": MIG_GPU, "layout": [{"start": 0}]}],
            "numafleet_mig_gpus[0].layout[0]: profile is missing; write {profile: 3g.40gb, "
            "start: 4}",
        ),
        (
            [{"gpu": MIG_GPU, "mode": "disabled", "layout": ["1g.10gb"]}],
            "numafleet_mig_gpus[0].layout: a GPU with mode: disabled has no MIG instances; remove "
            "layout or set mode: enabled",
        ),
        (
            [{"gpu": MIG_GPU, "layout": ["MIG 3g.40gb"]}],
            "numafleet_mig_gpus[0].layout[0].profile: 'MIG 3g.40gb' is not a GPU-instance profile "
            "name; write it as nvidia-smi mig -lgip prints it without 'MIG ', e.g. 3g.40gb or "
            "1g.10gb",
        ),
        (
            [{"gpu": MIG_GPU, "layout": [{"profile": "3g.40gb", "compute_profile": "1c.2g.20gb"}]}],
            "numafleet_mig_gpus[0].layout[0].compute_profile: '1c.2g.20gb' is not a "
            "compute-instance profile of 3g.40gb; write Nc.3g.40gb (N slices of it) or leave it out",
        ),
        (
            [{"gpu": MIG_GPU, "layout": [{"profile": "3g.40gb", "slices": 3}]}],
            "numafleet_mig_gpus[0].layout[0]: unknown key 'slices'; allowed keys: profile, start, "
            "compute_profile",
        ),
    ],
)
def test_declared_mig_errors(machine_facts, declared, message):
    with pytest.raises(PlacementError) as err:
        plan_mig(machine_facts, A100, [], declared)
    assert str(err.value) == f"host h: {message}"


def test_plan_lists_the_mig_state_to_apply(machine_facts):
    declared = [{"gpu": MIG_GPU, "layout": ["3g.40gb", "2g.20gb", "2g.20gb"]}]
    result = plan_mig(machine_facts, A100, [p("e", mig_profile="3g.40gb")], declared)
    assert result["mig_gpus"] == [
        {
            "gpu": MIG_GPU,
            "uuid": {g["address"]: g for g in result["gpus"]}[MIG_GPU]["uuid"],
            "mode": "enabled",
            "layout": [
                {"profile": "2g.20gb", "start": 0, "compute_profile": None},
                {"profile": "2g.20gb", "start": 2, "compute_profile": None},
                {"profile": "3g.40gb", "start": 4, "compute_profile": None},
            ],
        }
    ]
    # Undeclared GPUs with MIG off are never listed; the MIG GPU is, with the plan's layout.
    undeclared = plan(machine_facts, A100, [p("w", gpus=1)])
    assert [entry["gpu"] for entry in undeclared["mig_gpus"]] == [MIG_GPU]
    assert plan(machine_facts, H100, [])["mig_gpus"] == []


# ---------------------------------------------------------------------------------------------
# Placements whose MIG instance does not exist yet (waits_for)


def _mig_off(machine_facts, pending: str) -> tuple:
    """The A100 fixture with GPU 17:00.0's MIG mode off (mode_pending as given), no instance."""
    numa, gpus = machine_facts(A100)
    entry = next(g for g in gpus["gpus"] if g["address"] == MIG_GPU)
    entry["mig"].update(mode_current="disabled", mode_pending=pending, gpu_instances=[])
    return numa, gpus


@pytest.mark.parametrize(
    ("pending", "reason"),
    [("disabled", "created in this run once MIG mode is on")],
)
def test_placement_waits_for_an_instance_of_a_gpu_whose_mig_mode_is_off(
    machine_facts, pending, reason
):
    numa, gpus = _mig_off(machine_facts, pending)
    declared = [{"gpu": MIG_GPU, "layout": ["3g.40gb", "1g.10gb"]}]
    result = plan_host(
        "h", numa, gpus, [p("small", mig_profile="1g.10gb")], [], POLICY, mig_gpus=declared
    )
    small = by_name(result)["small"]
    start = small["gpus"][0]["mig"]["placement_start"]
    assert small["waits_for"] == {
        "mig_instance": f"1g.10gb at slice {start} of GPU {MIG_GPU}",
        "gpu": MIG_GPU,
        "profile": "1g.10gb",
        "start": start,
        "reason": reason,
    }
    assert small["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    (warning,) = [w for w in small["warnings"] if "does not exist yet" in w]
    assert f"({reason})" in warning and "not enabled or started" in warning
    assert (
        f"gpus 17:00.0 mig 1g.10gb@{start} (waits for MIG instance 1g.10gb at slice {start} "
        f"of GPU {MIG_GPU}: {reason}); 1 warning"
    ) in plan_summary(result)


def test_placement_waits_for_an_instance_created_in_this_run(machine_facts):
    declared = [
        {"gpu": MIG_GPU, "layout": ["3g.40gb", {"profile": "2g.20gb", "start": 0}, "1g.10gb"]}
    ]
    result = plan_mig(machine_facts, A100, [p("small", mig_profile="1g.10gb")], declared)
    small = by_name(result)["small"]
    assert small["waits_for"]["reason"] == "created in this run"
    assert small["waits_for"]["mig_instance"] == f"1g.10gb at slice 2 of GPU {MIG_GPU}"
    assert (
        f"small node0 cpus {format_cpulist(small['cpus'])} gpus 17:00.0 mig 1g.10gb@2 "
        f"(waits for MIG instance 1g.10gb at slice 2 of GPU {MIG_GPU}: created in this run)"
    ) in plan_summary(result)


def test_placement_on_an_existing_instance_waits_for_nothing(machine_facts):
    result = plan(machine_facts, A100, [p("e", mig_profile="3g.40gb"), p("w", gpus=1)])
    for entry in result["placements"]:
        assert entry["waits_for"] is None, entry["name"]
    e = by_name(result)["e"]
    assert e["environment"]["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert "waits for" not in plan_summary(result)


def test_waiting_placement_gets_its_instance_in_the_plan_made_after_it_exists(machine_facts):
    """The re-plan (or the next run): the recorded slot is kept and the new device named."""
    declared = [
        {"gpu": MIG_GPU, "layout": ["3g.40gb", {"profile": "2g.20gb", "start": 0}, "1g.10gb"]}
    ]
    numa, gpus = machine_facts(A100)
    first = plan_host(
        "h", numa, gpus, [p("small", mig_profile="1g.10gb")], [], POLICY, mig_gpus=declared
    )
    assert by_name(first)["small"]["waits_for"] is not None
    # The MIG layer destroyed the 2g.20gb at 2 and created the 1g.10gb there.
    entry = next(g for g in gpus["gpus"] if g["address"] == MIG_GPU)
    created = dict(
        next(i for i in entry["mig"]["gpu_instances"] if i["placement_start"] == 2),
        profile_name="1g.10gb",
        placement_size=1,
        mig_device_uuid="MIG-00000000-1111-2222-3333-444444444444",
    )
    entry["mig"]["gpu_instances"] = [
        i for i in entry["mig"]["gpu_instances"] if i["placement_start"] != 2
    ] + [created]
    recorded = parse_recorded("h", {"state": "present", "plan": first}, "/etc/numafleet/plan.json")
    again = plan_host(
        "h", numa, gpus, [p("small", mig_profile="1g.10gb")], [], POLICY, mig_gpus=declared,
        recorded=recorded,
    )  # fmt: skip
    small = by_name(again)["small"]
    assert small["waits_for"] is None
    assert small["cpus"] == by_name(first)["small"]["cpus"]
    assert small["environment"]["CUDA_VISIBLE_DEVICES"] == created["mig_device_uuid"]
    assert not any("does not exist yet" in w for w in small["warnings"])
