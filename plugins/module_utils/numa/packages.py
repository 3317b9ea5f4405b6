# Private to this collection: may change in any release.
"""How NUMA nodes and CPU packages (sockets) sit in each other, from sysfs alone.

Source: each online CPU's ``devices/system/cpu/cpuN/topology/physical_package_id`` and the node
CPU lists ``devices/system/node/nodeN/cpulist``, as read_topology gives them in
``Topology.packages`` (``[{"id", "cpus", "nodes"}]``). Nothing here is guessed from package or
die counts, CPU models or firmware modes: a package "holds" a node when one of the node's CPUs
has that package's id.

* Sub-NUMA clustering (Intel SNC, AMD NPS, cluster-on-die, multi-chip modules): a package holds
  several nodes, each node lies in that package alone (``snc_like``).
* Contradictory virtual NUMA: a package spans several nodes AND a node spans several packages,
  as vNUMA guests whose ``-numa``/vNUMA layout was not lined up with their sockets present
  (finding ``nodes_cross_packages``). The guest's socket/core/thread layout then matches neither
  its nodes nor the host, so the planner does not group such nodes' CPUs by SMT siblings.
"""

from __future__ import annotations

from typing import Optional

from .cpulist import format_cpulist

KIND_CROSS = "nodes_cross_packages"


def _ids(values) -> str:
    return ", ".join(str(value) for value in values)


def _entries(packages) -> list:
    """(package id, sorted node ids, sorted cpus) of well-formed package entries, by id."""
    found = []
    for entry in packages or ():
        if not isinstance(entry, dict):
            continue
        pid = entry.get("id")
        nodes = entry.get("nodes")
        cpus = entry.get("cpus")
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(nodes, list):
            continue
        if pid < 0:  # physical_package_id -1: the kernel does not know the package
            continue
        nodes = sorted({n for n in nodes if isinstance(n, int) and not isinstance(n, bool)})
        cpus = sorted({c for c in cpus or () if isinstance(c, int) and not isinstance(c, bool)})
        found.append((pid, nodes, cpus))
    return sorted(found, key=lambda item: item[0])


def package_layout(packages) -> dict:
    """{"nodes_per_package": int | {package id (str): int} | None, "snc_like": bool}.

    ``packages`` is Topology.packages (or ansible_facts.numa.packages). nodes_per_package counts
    the nodes holding CPUs of each package: one int when every package has the same count, else
    a map by package id (strings, as JSON keys are), None when no CPU has a package id (offline
    or no topology/ directory). snc_like is true when some package holds two or more nodes and
    each of those nodes lies in that package alone (SNC, NPS, cluster-on-die); never true for
    nodes that cut across packages (see cross_findings). Raises nothing for any input.
    """
    entries = _entries(packages)
    if not entries:
        return {"nodes_per_package": None, "snc_like": False}
    counts = {pid: len(nodes) for pid, nodes, dummy in entries}
    values = set(counts.values())
    per_package = (
        values.pop() if len(values) == 1 else {str(pid): count for pid, count in counts.items()}
    )
    homes: dict = {}
    for pid, nodes, dummy in entries:
        for nid in nodes:
            homes.setdefault(nid, set()).add(pid)
    snc_like = any(
        len(nodes) >= 2 and all(homes[nid] == {pid} for nid in nodes)
        for pid, nodes, dummy in entries
    )
    return {"nodes_per_package": per_package, "snc_like": snc_like}


def cross_findings(packages) -> list:
    """Consistency findings (kind ``nodes_cross_packages``) of nodes and packages that cut
    across each other in both directions: some package spans several nodes and some node spans
    several packages. [] otherwise (SNC-like packages, one node over several sockets).

    The one finding names, in ``nodes`` and ``packages``, every node and package tied together
    by such a split (the connected part of the node-package relation that holds both kinds of
    span), and in ``cpus`` their CPUs. Raises nothing for any input.
    """
    entries = _entries(packages)
    node_packages: dict = {}
    package_nodes: dict = {}
    package_cpus: dict = {}
    for pid, nodes, cpus in entries:
        package_nodes[pid] = set(nodes)
        package_cpus[pid] = cpus
        for nid in nodes:
            node_packages.setdefault(nid, set()).add(pid)
    findings = []
    seen: set = set()
    for start in sorted(package_nodes):
        if start in seen:
            continue
        # The packages and nodes connected to ``start`` through shared CPUs' node ids.
        pkgs, nodes, todo = {start}, set(), [start]
        while todo:
            pid = todo.pop()
            for nid in package_nodes[pid] - nodes:
                nodes.add(nid)
                for other in node_packages[nid] - pkgs:
                    pkgs.add(other)
                    todo.append(other)
        seen |= pkgs
        wide_packages = sorted(pid for pid in pkgs if len(package_nodes[pid]) > 1)
        wide_nodes = sorted(nid for nid in nodes if len(node_packages[nid]) > 1)
        if not (wide_packages and wide_nodes):
            continue
        cpus = sorted(cpu for pid in pkgs for cpu in package_cpus[pid])
        spans = "; ".join(
            f"package {pid} holds nodes {_ids(sorted(package_nodes[pid]))}" for pid in wide_packages
        )
        crossed = "; ".join(
            f"node {nid} holds CPUs of packages {_ids(sorted(node_packages[nid]))}"
            for nid in wide_nodes
        )
        findings.append(
            {
                "kind": KIND_CROSS,
                "cpus": cpus,
                "nodes": sorted(nodes),
                "packages": sorted(pkgs),
                "message": f"NUMA nodes {_ids(sorted(nodes))} and packages {_ids(sorted(pkgs))} "
                f"cut across each other ({spans}; {crossed}), as a virtual machine whose vNUMA "
                "layout is not lined up with its sockets presents: the SMT siblings of CPUs "
                f"{format_cpulist(cpus)} are not trusted, the planner takes each of them as a "
                "core of its own. Line up the guest's NUMA nodes with its sockets (or give it "
                "one socket per node)",
            }
        )
    return findings


def crossed_nodes(consistency) -> tuple:
    """(node ids, package ids) named by the ``nodes_cross_packages`` findings of
    ansible_facts.numa.consistency: the nodes whose CPUs the planner plans one by one.
    Two empty frozensets when there is none; raises nothing for any input."""
    nodes: set = set()
    pkgs: set = set()
    if not isinstance(consistency, (list, tuple)):
        return frozenset(), frozenset()
    for finding in consistency:
        if not isinstance(finding, dict) or finding.get("kind") != KIND_CROSS:
            continue
        for key, into in (("nodes", nodes), ("packages", pkgs)):
            listed = finding.get(key)
            if isinstance(listed, list):
                into.update(n for n in listed if isinstance(n, int) and not isinstance(n, bool))
    return frozenset(nodes), frozenset(pkgs)


def crossed_warning(nodes, pkgs) -> str:
    """The plan warning of nodes planned one CPU per core because packages cut across them."""
    node_text = _ids(sorted(nodes))
    package_text = _ids(sorted(pkgs)) or "?"
    return (
        f"NUMA nodes {node_text} and packages {package_text} cut across each other "
        f"(finding {KIND_CROSS}): the SMT sibling lists of their CPUs are not trusted, each CPU "
        f"of nodes {node_text} is planned as a core of its own, so a placement there may share "
        "a physical core with another"
    )


def layout_text(numa: dict) -> Optional[str]:
    """'snc-like 4 nodes/package' for the topology summary, or None when no package holds
    several nodes alone (or the facts lack the keys)."""
    if not isinstance(numa, dict) or numa.get("snc_like") is not True:
        return None
    per = numa.get("nodes_per_package")
    if isinstance(per, int) and not isinstance(per, bool):
        return f"snc-like {per} nodes/package"
    if isinstance(per, dict):
        shown = ",".join(f"p{pid}:{count}" for pid, count in sorted(per.items(), key=str))
        return f"snc-like nodes/package {shown}"
    return "snc-like"
