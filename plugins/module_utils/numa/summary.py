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


def summarize_topology(numa: dict, gpu_topology=None) -> str:
    """One line: nodes with their CPUs/memory, the SNC hint, CPU counts, the kernel release,
    hugepages, GPUs with nodes, warnings."""
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
