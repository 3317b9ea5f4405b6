# Private to this collection: may change in any release.
"""One-line, human-readable summaries of gathered facts."""

from __future__ import annotations

from .cpulist import format_cpulist
from .packages import layout_text


def _gib(kb) -> str:
    if kb is None:
        return "? GiB"
    gib = kb / 1048576
    return f"{gib:.1f} GiB" if gib < 10 else f"{gib:.0f} GiB"


def _slow_reason(node: dict, top) -> str:
    """Why a node's memory is slower than the host's best ('tier 22', 'cxl', 'dax',
    'no normal zone'), or '' (the same order of reasons as planner.slow_memory_nodes)."""
    tier, backing = node.get("memory_tier"), node.get("memory_backing")
    if isinstance(tier, int) and not isinstance(tier, bool) and top is not None and tier > top:
        return f"tier {tier}"
    if backing in ("cxl", "dax"):
        return str(backing)
    if node.get("normal_memory") is False:
        return "no normal zone"
    return ""


def field_notes(numa: dict) -> list:
    """Short notes, each only when it matters: the allowed cpuset when it narrows the host
    ('allowed CPUs 0-31,64-95 memory nodes 0'), nodes that are a GPU's memory ('n1=GPU memory
    of 0009:01:00.0', or 'GPU memory nodes 250-255 (6 GPUs)' for more than two), slower memory nodes ('slower memory n2(dax) n4(tier 22)') and nodes that
    cut across packages ('vNUMA nodes 0,1 cross packages 0,1'). Sources: ansible_facts.numa
    ``allowed``, ``nodes[].gpu_owner``/``memory_tier``/``memory_backing``/``normal_memory`` and
    ``consistency``. Raises nothing for any input."""
    notes = []
    allowed = numa.get("allowed")
    if isinstance(allowed, dict) and allowed.get("narrowed") is True:
        cpus, mems = allowed.get("cpus"), allowed.get("mems")
        notes.append(
            f"allowed CPUs {format_cpulist(cpus) if isinstance(cpus, list) else '?'} memory "
            f"nodes {format_cpulist(mems) if isinstance(mems, list) else '?'}"
            if isinstance(cpus, list) and isinstance(mems, list)
            else "allowed cpuset narrowed"
        )
    nodes = [n for n in numa.get("nodes") or [] if isinstance(n, dict)]
    owned = [n for n in nodes if isinstance(n.get("gpu_owner"), str)]
    if len(owned) <= 2:
        notes.extend(f"n{n.get('id')}=GPU memory of {n['gpu_owner']}" for n in owned)
    else:  # POWER9+V100, GB200: one note for them all
        ids = [n.get("id") for n in owned if isinstance(n.get("id"), int)]
        owners = len({n["gpu_owner"] for n in owned})
        notes.append(f"GPU memory nodes {format_cpulist(ids)} ({owners} GPUs)")
    tiers = [
        n.get("memory_tier")
        for n in nodes
        if isinstance(n.get("memory_tier"), int) and not isinstance(n.get("memory_tier"), bool)
    ]
    top = min(tiers) if tiers else None
    slow = [
        f"n{n.get('id')}({_slow_reason(n, top)})"
        for n in nodes
        if (n.get("memory_kb") or 0) > 0
        and not isinstance(n.get("gpu_owner"), str)
        and _slow_reason(n, top)
    ]
    if slow:
        notes.append("slower memory " + " ".join(slow))
    for finding in numa.get("consistency") or []:
        if isinstance(finding, dict) and finding.get("kind") == "nodes_cross_packages":
            nodes_of = ",".join(str(x) for x in finding.get("nodes") or [])
            packages_of = ",".join(str(x) for x in finding.get("packages") or [])
            notes.append(f"vNUMA nodes {nodes_of} cross packages {packages_of}")
    return notes


def summarize_topology(numa: dict, gpu_topology=None) -> str:
    """One line: nodes with their CPUs/memory, the SNC hint, the field notes (field_notes: a
    narrowed allowed cpuset, GPU-memory nodes, slower memory, crossed vNUMA), CPU counts, the
    kernel release, hugepages, GPUs with nodes, warnings."""
    nodes = numa.get("nodes") or []
    parts = []
    for node in nodes:
        cpus = format_cpulist(node.get("cpus") or []) or "-"
        parts.append(f"n{node.get('id')}[{cpus}|{_gib(node.get('memory_kb'))}]")
    cpus = numa.get("cpus") or {}
    line = [
        f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
        + ("" if numa.get("numa_enabled", True) else " (no NUMA)"),
        " ".join(parts),
        layout_text(numa) or "",
        *field_notes(numa),
        f"cpus online={len(cpus.get('online') or [])} offline={len(cpus.get('offline') or [])}"
        f" isolated={len(cpus.get('isolated') or [])}",
    ]
    release = (numa.get("kernel") or {}).get("osrelease")
    if isinstance(release, str) and release:
        line.append(f"kernel {release}")
    pools = {}
    for node in nodes:
        for pool in node.get("hugepages") or []:
            pools[pool["size_kb"]] = pools.get(pool["size_kb"], 0) + (pool.get("total") or 0)
    if any(pools.values()):
        line.append(
            "hugepages "
            + " ".join(f"{size // 1024}M={count}" for size, count in sorted(pools.items()) if count)
        )
    gpus = (gpu_topology or {}).get("gpus") or []
    if gpus:
        described = []
        for gpu in gpus:
            node = gpu.get("node")
            where = f"n{node}" if node is not None else "n?"
            mig = gpu.get("mig") or {}
            flag = " MIG" if mig.get("mode_current") in (True, "enabled", 1) else ""
            described.append(f"{gpu.get('address')}@{where}{flag}")
        line.append(f"gpus={len(gpus)} " + ",".join(described))
    else:
        line.append("gpus=0")
    # Both facts read some of the same files: count each unusable path once.
    warnings = len(
        {w.get("path") for w in (numa.get("warnings") or [])}
        | {w.get("path") for w in ((gpu_topology or {}).get("warnings") or [])}
    )
    findings = len(numa.get("consistency") or [])
    line.append(f"warnings={warnings}" + (f" findings={findings}" if findings else ""))
    return " | ".join(item for item in line if item)
