"""Planner properties on small random hosts (Hypothesis): nothing given twice, locality,
append-stability, memory budgets, and single-node fits agreeing with a brute-force search."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import PlanError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import plan_host

# Small instances only: <= 4 nodes, <= 16 CPUs and <= 4 GPUs per node, <= 6 placements.
SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
HEADROOM = 10
GIB = 1 << 20  # kB


@st.composite
def hosts(draw):
    """(numa facts, gpu_topology facts) of a small random host."""
    count = draw(st.integers(1, 4))
    specs = []
    for dummy in range(count):
        cores = draw(st.integers(0, 8))
        smt = draw(st.sampled_from([1, 2])) if cores else 1
        mem_gb = draw(st.integers(0, 8))
        gpus = draw(st.integers(0, 4)) if cores else 0
        specs.append((cores, smt, mem_gb, gpus))
    if not any(cores for cores, *dummy in specs):
        specs[0] = (2, 2, specs[0][2], specs[0][3])
    far = draw(st.lists(st.integers(11, 40), min_size=count * count, max_size=count * count))
    nodes, per_cpu, gpus, first = [], [], [], 0
    for nid, (cores, smt, mem_gb, gpu_count) in enumerate(specs):
        cpus = list(range(first, first + cores * smt))
        first += cores * smt
        for position, cpu in enumerate(cpus):
            core = position % cores
            siblings = [cpus[core + cores * t] for t in range(smt)]
            per_cpu.append({"id": cpu, "node": nid, "online": True, "siblings": siblings})
        kind = "cpu+memory" if cpus and mem_gb else "cpu-only" if cpus else "memory-only"
        if not cpus and not mem_gb:
            kind = "empty"
        distances = [10 if other == nid else 0 for other in range(count)]
        nodes.append(
            {
                "id": nid,
                "kind": kind,
                "cpus": cpus,
                "memory_kb": mem_gb * GIB,
                "distances": distances,
                "hugepages": [{"size_kb": 2048}, {"size_kb": 1048576}],
            }
        )
        switches = draw(st.lists(st.integers(0, 1), min_size=gpu_count, max_size=gpu_count))
        for slot, switch in enumerate(switches):
            address = f"0000:{nid:01x}{slot:01x}:00.0"
            gpus.append(
                {
                    "address": address,
                    "uuid": f"GPU-{nid}-{slot}",
                    "node": nid,
                    "vendor": "nvidia",
                    "switch": f"sw{nid}{switch}",
                    "nvlink_peers": [],
                    "memory_total_mib": 16384,
                    "mig": None,
                }
            )
    for a in range(count):  # symmetric distances
        for b in range(a + 1, count):
            nodes[a]["distances"][b] = nodes[b]["distances"][a] = far[a * count + b]
    every = list(range(first))
    numa = {
        "node_ids": list(range(count)),
        "nodes": nodes,
        "cpus": {"online": every, "offline": [], "isolated": []},
        "per_cpu": per_cpu,
    }
    return numa, {"gpus": gpus}


@st.composite
def workloads(draw, max_size=6):
    count = draw(st.integers(1, max_size))
    placements = []
    for index in range(count):
        entry = {
            "name": f"p{index}",
            "exec": "/bin/app",
            "cpus": draw(st.integers(1, 10)),
            "gpus": draw(st.integers(0, 3)),
            "memory": f"{draw(st.integers(0, 4096))}M",
        }
        if draw(st.booleans()):
            entry["hugepages"] = {"size": "2M", "count": draw(st.integers(1, 512))}
        if draw(st.integers(0, 3)) == 0:
            entry["allow_span"] = True
        placements.append(entry)
    return placements


def plan(numa, gpus, placements):
    return plan_host("h", numa, gpus, placements, [], {"memory_headroom_pct": HEADROOM})


def feasible_prefix(numa, gpus, placements) -> tuple:
    """(plan of the longest prefix that plans, index of the first placement that did not)."""
    try:
        return plan(numa, gpus, placements), len(placements)
    except PlanError as exc:
        message = str(exc)
    match = re.search(r"numafleet_placements\[(\d+)\]", message)
    assert match, f"an infeasible plan names its placement: {message}"
    failed = int(match.group(1))
    return plan(numa, gpus, placements[:failed]), failed


def _node_of_cpu(numa) -> dict:
    return {cpu: node["id"] for node in numa["nodes"] for cpu in node["cpus"]}


@SETTINGS
@given(hosts(), workloads())
def test_nothing_is_given_twice_and_budgets_hold(host, placements):
    numa, gpus = host
    result, dummy = feasible_prefix(numa, gpus, placements)
    cpus = [cpu for entry in result["placements"] for cpu in entry["cpus"]]
    assert len(cpus) == len(set(cpus)), "a CPU is given twice"
    whole = [g["address"] for entry in result["placements"] for g in entry["gpus"]]
    assert len(whole) == len(set(whole)), "a GPU is given twice"
    for entry in result["placements"]:
        assert len(entry["cpus"]) >= entry["cpus_requested"]
        assert len(entry["gpus"]) == placements[entry["index"]]["gpus"]
    for node in result["nodes"]:
        assert node["planned_memory_kb"] <= node["budget_kb"], f"node {node['id']} over budget"
    charged: dict = {}
    for entry in result["placements"]:
        hugepages = entry["hugepages"]
        node = hugepages["node"] if hugepages else entry["mems"][0]
        extra = hugepages["size_kb"] * hugepages["count"] if hugepages else 0
        charged[node] = charged.get(node, 0) + entry["memory_kb"] + extra
    planned = {node["id"]: node["planned_memory_kb"] for node in result["nodes"]}
    assert sum(planned.values()) == sum(charged.values())
    if not any(entry["spans"] for entry in result["placements"]):  # one memory node each
        assert planned == {nid: charged.get(nid, 0) for nid in planned}


@SETTINGS
@given(hosts(), workloads())
def test_cpus_sit_on_the_gpus_node_when_one_node_fits(host, placements):
    numa, gpus = host
    result, dummy = feasible_prefix(numa, gpus, placements)
    node_of = _node_of_cpu(numa)
    for entry in result["placements"]:
        if entry["spans"]:
            continue
        assert {node_of[cpu] for cpu in entry["cpus"]} == {entry["node"]}
        assert all(g["node"] == entry["node"] for g in entry["gpus"])


@SETTINGS
@given(hosts(), workloads(), workloads(max_size=1))
def test_appending_a_placement_never_moves_earlier_ones(host, placements, extra):
    numa, gpus = host
    before, failed = feasible_prefix(numa, gpus, placements)
    extended = placements[:failed] + [dict(extra[0], name="appended")]
    try:
        after = plan(numa, gpus, extended)
    except PlanError:
        return  # the new one did not fit: nothing was planned, nothing moved
    assert after["placements"][:failed] == before["placements"]


def _single_node_fit(numa, gpus, placement, used) -> bool:
    """Brute force: does any node hold the placement with what earlier placements left?"""
    cpus_used, gpus_used, mem_used = used
    budget = {n["id"]: n["memory_kb"] * (100 - HEADROOM) // 100 for n in numa["nodes"]}
    memory_nodes = [n["id"] for n in numa["nodes"] if n["kind"] in ("cpu+memory", "memory-only")]
    need = int(placement["memory"][:-1]) * 1024
    if "hugepages" in placement:
        need += placement["hugepages"]["count"] * 2048
    for node in numa["nodes"]:
        if node["kind"] not in ("cpu+memory", "cpu-only") or not node["cpus"]:
            continue
        free_cpus = [cpu for cpu in node["cpus"] if cpu not in cpus_used]
        free_gpus = [
            g for g in gpus["gpus"] if g["node"] == node["id"] and g["address"] not in gpus_used
        ]
        if len(free_cpus) < placement["cpus"] or len(free_gpus) < placement["gpus"]:
            continue
        homes = [node["id"]] if node["id"] in memory_nodes else memory_nodes
        if any(mem_used.get(m, 0) + need <= budget[m] for m in homes):
            return True
    return False


@SETTINGS
@given(hosts(), workloads())
def test_single_node_fits_agree_with_brute_force(host, placements):
    numa, gpus = host
    for index in range(len(placements)):
        try:
            earlier = plan(numa, gpus, placements[:index])
        except PlanError:
            return
        used = (
            {cpu for entry in earlier["placements"] for cpu in entry["cpus"]},
            {g["address"] for entry in earlier["placements"] for g in entry["gpus"]},
            {node["id"]: node["planned_memory_kb"] for node in earlier["nodes"]},
        )
        fits = _single_node_fit(numa, gpus, placements[index], used)
        event(f"single-node fit: {fits}")
        result, failure = None, ""
        try:
            result = plan(numa, gpus, placements[: index + 1])
        except PlanError as exc:
            failure = str(exc)
        if result is None:
            assert not fits, f"placement {index} fits one node but the planner failed: {failure}"
            event("planner failed")
            return
        spans = result["placements"][index]["spans"]
        event(f"spans: {spans}")
        assert fits is not spans, (
            f"placement {index}: brute force fit={fits}, planner spans={spans}"
        )
