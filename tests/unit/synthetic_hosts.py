"""Small synthetic host facts for planner tests: numa facts of N nodes and NVIDIA GPU entries."""

from __future__ import annotations


def synthetic(
    cpus_per_node=(4, 4),
    mem_gb=(16, 16),
    smt=2,
    distances=None,
    isolated=(),
    offline=(),
    hugepage_sizes=(2048, 1048576),
):
    """Small numa facts: node i has cpus_per_node[i] CPUs (0 = memory-only) and mem_gb[i] GiB.

    CPUs are numbered node by node; SMT siblings are CPU c and c + half of the node's CPUs.
    """
    nodes, per_cpu, first = [], [], 0
    count = len(cpus_per_node)
    for nid, (ncpu, gb) in enumerate(zip(cpus_per_node, mem_gb, strict=True)):
        cpus = list(range(first, first + ncpu))
        first += ncpu
        kind = {(True, True): "cpu+memory", (True, False): "cpu-only"}.get(
            (bool(ncpu), bool(gb)), "memory-only" if gb else "empty"
        )
        row = distances[nid] if distances else [10 if o == nid else 20 for o in range(count)]
        nodes.append(
            {
                "id": nid,
                "kind": kind,
                "cpus": cpus,
                "memory_kb": gb << 20,
                "distances": row,
                "hugepages": [{"size_kb": size} for size in hugepage_sizes],
            }
        )
        half = max(ncpu // smt, 1)
        for position, cpu in enumerate(cpus):
            core = position % half
            siblings = [c for i, c in enumerate(cpus) if i % half == core] if smt > 1 else [cpu]
            per_cpu.append(
                {"id": cpu, "node": nid, "online": cpu not in offline, "siblings": siblings}
            )
    every = list(range(first))
    return {
        "node_ids": list(range(count)),
        "nodes": nodes,
        "cpus": {
            "online": [c for c in every if c not in offline],
            "offline": sorted(offline),
            "isolated": sorted(isolated),
        },
        "per_cpu": per_cpu,
    }


def synthetic_gpu(address, node, switch=None, peers=(), uuid=None, memory_mib=81920, mig=None):
    return {
        "address": address,
        "uuid": uuid or f"GPU-{address.replace(':', '').replace('.', '')}",
        "node": node,
        "numa_node": node,
        "vendor": "nvidia",
        "switch": switch,
        "nvlink_peers": list(peers),
        "memory_total_mib": memory_mib,
        "mig": mig,
    }
