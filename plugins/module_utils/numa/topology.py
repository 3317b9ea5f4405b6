# Private to this collection: may change in any release.
"""NUMA nodes, CPUs, hugepage pools and kernel NUMA knobs read from sysfs/procfs."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Optional

from . import cmdline, osrelease, packages
from .cpulist import format_cpulist, parse_cpulist, parse_cpumask
from .frozen import frozen_builder
from .memnodes import drop_cpu_gpu_owners, memory_kinds, node_memory_fields
from .sysfs import Reader

NODE_DIR = ("devices", "system", "node")
CPU_DIR = ("devices", "system", "cpu")
KIND_CPU_MEMORY = "cpu+memory"
KIND_CPU_ONLY = "cpu-only"
KIND_MEMORY_ONLY = "memory-only"
KIND_EMPTY = "empty"
KIND_UNKNOWN = "unknown"
_NODE_RE = re.compile(r"^node([0-9]+)\Z")
_CPU_RE = re.compile(r"^cpu([0-9]+)\Z")
_POOL_RE = re.compile(r"^hugepages-([0-9]+)kB\Z")
# Values as_plain() passes through as they are.
_LEAVES = (str, int, float, bool, type(None))
# Field names of each dataclass as_plain() has met, in field order.
_FIELD_NAMES: dict = {}
_MEMINFO_RE = re.compile(r"^(?:Node\s+\d+\s+)?([A-Za-z0-9_()]+):\s+(\d+)(?:\s+kB)?\Z")
# ACPI SLIT / device-tree distances as Linux accepts them: 10 to itself, 11-255 to any other.
LOCAL_DISTANCE = 10
MAX_DISTANCE = 255


@dataclass(frozen=True)
class HugepagePool:
    """One hugepage pool: page size and page counts (pages, not kB)."""

    size_kb: int
    total: Optional[int]
    free: Optional[int]
    surplus: Optional[int]
    reserved: Optional[int]


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node as sysfs shows it."""

    id: int
    cpus: tuple
    memory_kb: Optional[int]
    memfree_kb: Optional[int]
    kind: str
    distances: tuple
    hugepages: tuple
    numastat: dict = field(default_factory=dict)
    # What the node's memory is (memnodes.py): in has_normal_memory (None: file missing), the
    # PCI address of the GPU whose memory it is, its memory tier id, "cxl"/"dax" backing.
    normal_memory: Optional[bool] = None
    gpu_owner: Optional[str] = None
    memory_tier: Optional[int] = None
    memory_backing: Optional[str] = None


@dataclass(frozen=True)
class Cpu:
    """One logical CPU; topology fields are None when the CPU is offline (no topology/ dir)."""

    id: int
    online: bool
    node: Optional[int]
    package: Optional[int]
    die: Optional[int]
    core: Optional[int]
    siblings: tuple


@dataclass(frozen=True)
class Topology:
    """Everything numa_facts reports except PCI devices."""

    numa_enabled: bool
    node_ids: tuple
    nodes: tuple
    cpus: dict
    per_cpu: tuple
    packages: tuple
    hugepages: tuple
    default_hugepage_size_kb: Optional[int]
    kernel: dict
    consistency: tuple
    # packages.package_layout: nodes per package (int, or a map by package id) and snc_like.
    nodes_per_package: object = None
    snc_like: bool = False


_cpu = frozen_builder(Cpu)


def parse_meminfo(text: str) -> dict:
    """{field: int} of a /proc/meminfo or nodeN/meminfo text (values in kB or pages); raises ValueError."""
    values: dict = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        match = _MEMINFO_RE.match(line)
        if not match:
            raise ValueError(f"line {line!r} is not 'Field: value'")
        values[match.group(1)] = int(match.group(2))
    if not values:
        raise ValueError("no fields")
    return values


def parse_counters(text: str) -> dict:
    """{name: int} of a 'name value' per line file (nodeN/numastat); raises ValueError."""
    values: dict = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not (parts[1].isascii() and parts[1].isdigit()):
            raise ValueError(f"line {line.strip()!r} is not 'name count'")
        values[parts[0]] = int(parts[1])
    if not values:
        raise ValueError("no counters")
    return values


def parse_distances(text: str) -> tuple:
    """Distance row of a nodeN/distance file; raises ValueError."""
    row = tuple(int(value) for value in text.split())
    if not row:
        raise ValueError("empty distance row")
    return row


def parse_selected(text: str) -> str:
    """The bracketed choice of a sysfs selector ("always [madvise] never" -> "madvise"); raises ValueError."""
    match = re.search(r"\[([^\]]+)\]", text)
    if not match:
        raise ValueError(f"no [selected] value in {text!r}")
    return match.group(1)


def node_kind(cpus, memory_kb: Optional[int]) -> str:
    """cpu+memory, cpu-only, memory-only or empty; unknown when CPUs or memory could not be read.

    ``cpus`` or ``memory_kb`` is None when its file was unreadable: the kind is then never guessed.
    """
    if cpus is None or memory_kb is None:
        return KIND_UNKNOWN
    has_memory = bool(memory_kb)
    if cpus:
        return KIND_CPU_MEMORY if has_memory else KIND_CPU_ONLY
    return KIND_MEMORY_ONLY if has_memory else KIND_EMPTY


def _page_count(reader: Reader, path: str, optional: bool = False) -> Optional[int]:
    """A hugepage counter of ``path``; None with a warning when unreadable or negative."""
    count = reader.integer(path, optional)
    if count is not None and count < 0:
        reader.warn(path, f"is {count}; a page count is never negative: not used")
        return None
    return count


def _read_pools(reader: Reader, directory: str, with_reserved: bool) -> tuple:
    pools = []
    for name in reader.listdir(directory, optional=True):
        match = _POOL_RE.match(name)
        if not match:
            continue
        pool = f"{directory}/{name}"
        pools.append(
            HugepagePool(
                size_kb=int(match.group(1)),
                total=_page_count(reader, f"{pool}/nr_hugepages"),
                free=_page_count(reader, f"{pool}/free_hugepages"),
                surplus=_page_count(reader, f"{pool}/surplus_hugepages", optional=True),
                reserved=_page_count(reader, f"{pool}/resv_hugepages", optional=True)
                if with_reserved
                else None,
            )
        )
    return tuple(sorted(pools, key=lambda pool: pool.size_kb))


def _listed_ids(reader: Reader, directory: str, pattern) -> list:
    ids = []
    for name in reader.listdir(directory, optional=True):
        match = pattern.match(name)
        if match:
            ids.append(int(match.group(1)))
    return sorted(ids)


def _node_cpus(reader: Reader, base: str) -> Optional[list]:
    """CPUs of a node directory from cpulist, else cpumap (old kernels have no cpulist).

    None (and a warning naming the file) when the file is unreadable, NUL bytes or garbage: a
    cpulist that is there but lies is not replaced by cpumap, a view of the same kernel mask.
    Empty text is a node without CPUs (a memory-only node: CXL, HBM, GPU memory).
    """
    if reader.exists(f"{base}/cpulist"):
        return reader.cpulist(f"{base}/cpulist")
    return reader.cpumask(f"{base}/cpumap")


def read_node_cpus(reader: Reader) -> dict:
    """{node id: CPUs} of <sysfs_root>/devices/system/node/node*/cpulist (else cpumap); {} without NUMA.

    Only online nodes (node/online, when it reads), as read_topology lists them; a node whose
    CPU list is unusable (a warning) has no CPUs here.
    """
    node_dir = reader.sys(*NODE_DIR)
    listed = _listed_ids(reader, node_dir, _NODE_RE)
    if listed:
        online = _nonempty_cpulist(reader, f"{node_dir}/online")
        if online is not None:
            listed = sorted(set(online) & set(listed))
    return {
        node_id: tuple(_node_cpus(reader, f"{node_dir}/node{node_id}") or ()) for node_id in listed
    }


def _read_node(reader: Reader, node_id: int) -> NumaNode:
    base = reader.sys(*NODE_DIR, f"node{node_id}")
    cpus = _node_cpus(reader, base)
    meminfo = reader.parsed(f"{base}/meminfo", parse_meminfo) or {}
    memory_kb = meminfo.get("MemTotal")
    return NumaNode(
        id=node_id,
        cpus=tuple(cpus or ()),
        memory_kb=memory_kb,
        memfree_kb=meminfo.get("MemFree"),
        kind=node_kind(cpus, memory_kb),
        distances=reader.parsed(f"{base}/distance", parse_distances) or (),
        hugepages=_read_pools(reader, f"{base}/hugepages", with_reserved=False),
        numastat=reader.parsed(f"{base}/numastat", parse_counters, optional=True) or {},
    )


def _nonempty_cpulist(reader: Reader, path: str) -> Optional[list]:
    """CPUs of a cpulist the kernel never writes empty (the CPU reading it is in it), or None.

    An empty list is a warning naming the file, and None: the caller falls back as for a
    missing file instead of taking "no CPU at all".
    """
    cpus = reader.cpulist(path, optional=True)
    if cpus == []:
        reader.warn(path, "is empty, which the kernel never writes for this file: not used")
        return None
    return cpus


def check_distances(reader: Reader, nodes: tuple, node_ids: list) -> tuple:
    """``nodes`` with each distance row the kernel could not have written emptied, and warned.

    A row must have one entry per online node (the order of ``node_ids``), 10 for the node
    itself and 11-255 for every other; anything else (a row of another width, a table shifted
    by a lost entry) cannot be lined up with the nodes, so the planner gets no row at all and
    ranks the node's neighbours as unknown (distance 255).
    """
    checked = []
    for node in nodes:
        row = node.distances
        problem = None
        if not row:
            pass
        elif len(row) != len(node_ids):
            problem = f"has {len(row)} entries for {len(node_ids)} online nodes"
        else:
            for other, distance in zip(node_ids, row):
                low = LOCAL_DISTANCE if other == node.id else LOCAL_DISTANCE + 1
                high = LOCAL_DISTANCE if other == node.id else MAX_DISTANCE
                if not low <= distance <= high:
                    problem = f"gives distance {distance} to node {other} (want {low}-{high})"
                    break
        if problem is None:
            checked.append(node)
            continue
        path = reader.sys(*NODE_DIR, f"node{node.id}", "distance")
        reader.warn(path, f"{problem}: not used")
        checked.append(replace(node, distances=()))
    return tuple(checked)


def check_node_cpus(reader: Reader, nodes: tuple, possible: list) -> tuple:
    """``nodes`` with each node whose CPU list names CPUs beyond ``possible`` made unknown.

    The kernel's node masks only ever hold possible CPUs: a list naming others is garbage, the
    whole of it. Such a node gets no CPUs and kind unknown, with a warning naming its file.
    """
    if not possible:
        return nodes
    allowed = set(possible)
    checked = []
    for node in nodes:
        beyond = [cpu for cpu in node.cpus if cpu not in allowed]
        if not beyond:
            checked.append(node)
            continue
        base = reader.sys(*NODE_DIR, f"node{node.id}")
        path = f"{base}/cpulist" if reader.exists(f"{base}/cpulist") else f"{base}/cpumap"
        reader.warn(
            path,
            f"names CPUs {format_cpulist(beyond)}, beyond the possible CPUs "
            f"{format_cpulist(possible)}: not used",
        )
        checked.append(replace(node, cpus=(), kind=KIND_UNKNOWN))
    return tuple(checked)


def _cpu_sets(reader: Reader, cpu_ids: list) -> dict:
    base = reader.sys(*CPU_DIR)
    sets = {}
    for name in ("possible", "present", "online"):
        sets[name] = _nonempty_cpulist(reader, f"{base}/{name}")
    for name in ("offline", "isolated", "nohz_full"):
        sets[name] = reader.cpulist(f"{base}/{name}", optional=True)
    if sets["online"] is None:  # old kernels: derive from cpuN/online (cpu0 often has none)
        sets["online"] = [
            cpu
            for cpu in cpu_ids
            if reader.integer(f"{base}/cpu{cpu}/online", optional=True) in (None, 1)
        ]
    if sets["offline"] is None:
        sets["offline"] = sorted(set(cpu_ids) - set(sets["online"]))
    for name in ("possible", "present"):
        if sets[name] is None:
            sets[name] = list(cpu_ids)
    for name in ("isolated", "nohz_full"):
        if sets[name] is None:
            sets[name] = []
    return sets


def _read_cpu(reader: Reader, cpu_dir: str, cpu: int, online: bool, node_of: dict) -> Cpu:
    topo = f"{cpu_dir}/cpu{cpu}/topology"
    package = f"{topo}/physical_package_id"
    if not online or not reader.exists_given(topo, package):
        return _cpu(
            id=cpu,
            online=online,
            node=node_of.get(cpu),
            package=None,
            die=None,
            core=None,
            siblings=(),
        )
    die = reader.integer(f"{topo}/die_id", optional=True)
    siblings = _siblings(reader, topo, cpu)
    # -1 is the kernel's "unknown" (arch_topology with no package from firmware or cpu-map).
    package_id = reader.integer(package)
    return _cpu(
        id=cpu,
        online=True,
        node=node_of.get(cpu),
        package=None if package_id is None or package_id < 0 else package_id,
        die=None if die is None or die < 0 else die,
        core=reader.integer(f"{topo}/core_id"),
        siblings=siblings,
    )


def _own_siblings(reader: Reader, path: str, parse, cpu: int, optional: bool) -> Optional[tuple]:
    """The CPU set of ``path`` when it holds ``cpu``; else None, with a warning if it read."""
    found = reader.cpuset(path, parse, optional)
    if found is None or cpu in found:
        return found
    listed = format_cpulist(found) or "nothing"
    reader.warn(
        path,
        f"lists {listed}, not CPU {cpu} itself (an online CPU is always its own SMT sibling): "
        "not used",
    )
    return None


def _siblings(reader: Reader, topo: str, cpu: int) -> Optional[tuple]:
    """SMT siblings of online ``cpu`` (thread_siblings_list, else the thread_siblings mask).

    None when neither file gives a set holding the CPU itself (each such file is a warning):
    the siblings are then unknown, never guessed as the CPU alone.
    """
    siblings = _own_siblings(reader, f"{topo}/thread_siblings_list", parse_cpulist, cpu, True)
    if siblings is None:
        siblings = _own_siblings(reader, f"{topo}/thread_siblings", parse_cpumask, cpu, False)
    return siblings


def _packages(per_cpu: tuple) -> tuple:
    packages: dict = {}
    for cpu in per_cpu:
        if cpu.package is None:
            continue
        entry = packages.setdefault(cpu.package, {"id": cpu.package, "cpus": [], "nodes": set()})
        entry["cpus"].append(cpu.id)
        if cpu.node is not None:
            entry["nodes"].add(cpu.node)
    return tuple(
        {"id": pid, "cpus": sorted(entry["cpus"]), "nodes": sorted(entry["nodes"])}
        for pid, entry in sorted(packages.items())
    )


def check_consistency(nodes: tuple, per_cpu: tuple, offline_nodes: list) -> tuple:
    """Consistency findings: nodes that split a core's SMT siblings, CPUs listed in offline
    nodes, online CPUs that no node lists, online CPUs whose SMT siblings are unknown.
    """
    findings = []
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}
    seen = set()
    for cpu in per_cpu:
        group = tuple(sorted(set(cpu.siblings or ()) | {cpu.id}))
        if len(group) < 2 or group in seen:
            continue
        seen.add(group)
        owners = sorted({node_of[s] for s in group if s in node_of})
        if len(owners) > 1:
            findings.append(
                {
                    "kind": "split_core",
                    "cpus": list(group),
                    "nodes": owners,
                    "message": f"SMT siblings {format_cpulist(group)} are split across "
                    f"nodes {owners}; placements keep whole cores and cannot use this core",
                }
            )
    for node in nodes:
        if node.id in offline_nodes and node.cpus:
            findings.append(
                {
                    "kind": "cpus_in_offline_node",
                    "cpus": list(node.cpus),
                    "nodes": [node.id],
                    "message": f"node {node.id} is offline but lists CPUs "
                    f"{format_cpulist(node.cpus)}",
                }
            )
    homeless = [cpu.id for cpu in per_cpu if cpu.online and cpu.node is None]
    if homeless:
        unknown = [node.id for node in nodes if node.kind == KIND_UNKNOWN]
        findings.append(
            {
                "kind": "cpus_without_node",
                "cpus": homeless,
                "nodes": unknown,
                "message": f"online CPUs {format_cpulist(homeless)} are in no node's CPU list"
                + (
                    f" (the CPU list of node {', '.join(map(str, unknown))} could not be used, "
                    "see warnings)"
                    if unknown
                    else ""
                )
                + "; placements never use them",
            }
        )
    unsure = [cpu.id for cpu in per_cpu if cpu.online and cpu.siblings is None]
    if unsure:
        findings.append(
            {
                "kind": "siblings_unknown",
                "cpus": unsure,
                "nodes": sorted({cpu.node for cpu in per_cpu if cpu.id in unsure} - {None}),
                "message": f"SMT siblings of online CPUs {format_cpulist(unsure)} are unknown "
                "(thread_siblings_list and thread_siblings unusable, see warnings); the planner "
                "counts each as a core of its own, so two placements may share a physical core",
            }
        )
    return tuple(findings)


def _kernel_knobs(reader: Reader) -> dict:
    thp = reader.sys("kernel", "mm", "transparent_hugepage")
    return {
        "numa_balancing": reader.integer(
            reader.proc("sys", "kernel", "numa_balancing"), optional=True
        ),
        "zone_reclaim_mode": reader.integer(
            reader.proc("sys", "vm", "zone_reclaim_mode"), optional=True
        ),
        "thp_enabled": reader.parsed(f"{thp}/enabled", parse_selected, optional=True),
        "thp_defrag": reader.parsed(f"{thp}/defrag", parse_selected, optional=True),
        **osrelease.kernel_facts(reader),
        **cmdline.read_cmdline_facts(reader),
    }


def _fallback_node(reader: Reader, online: list, meminfo: dict) -> NumaNode:
    """Node 0 of a kernel without NUMA sysfs, from /proc/meminfo and the online CPUs."""
    memory_kb = meminfo.get("MemTotal")
    return NumaNode(
        id=0,
        cpus=tuple(online),
        memory_kb=memory_kb,
        memfree_kb=meminfo.get("MemFree"),
        kind=node_kind(online, memory_kb),
        distances=(10,),
        hugepages=_read_pools(reader, reader.sys("kernel", "mm", "hugepages"), False),
        numastat={},
    )


def read_topology(reader: Reader) -> Topology:
    """NUMA topology of the host behind ``reader``; never raises for bad files (see reader.warnings)."""
    node_dir = reader.sys(*NODE_DIR)
    numa_enabled = reader.isdir(node_dir)
    cpu_ids = _listed_ids(reader, reader.sys(*CPU_DIR), _CPU_RE)
    sets = _cpu_sets(reader, cpu_ids)
    # With NUMA sysfs, /proc/meminfo only gives the default page size (dumps of old kernels may
    # lack it); without, it is node 0's memory and must be there.
    meminfo = reader.parsed(reader.proc("meminfo"), parse_meminfo, optional=numa_enabled) or {}
    if numa_enabled:
        listed = _listed_ids(reader, node_dir, _NODE_RE)
        online_nodes = _nonempty_cpulist(reader, f"{node_dir}/online")
        node_ids = listed if online_nodes is None else sorted(set(online_nodes) & set(listed))
        nodes = tuple(_read_node(reader, node_id) for node_id in node_ids)
        nodes = check_distances(reader, nodes, node_ids)
        nodes = check_node_cpus(reader, nodes, sets["possible"])
        kinds = drop_cpu_gpu_owners(
            reader, memory_kinds(reader), {node.id: node.cpus for node in nodes}
        )
        nodes = tuple(replace(n, **node_memory_fields(kinds, n.id)) for n in nodes)
        offline_nodes = sorted(set(listed) - set(node_ids))
        offline_dirs = tuple(_read_node(reader, node_id) for node_id in offline_nodes)
    else:
        node_ids = [0]
        nodes = (_fallback_node(reader, sets["online"], meminfo),)
        offline_nodes, offline_dirs = [], ()
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}
    online = set(sets["online"])
    all_cpus = sorted(set(cpu_ids) | set(sets["possible"] if not cpu_ids else []))
    cpu_dir = reader.sys(*CPU_DIR)
    per_cpu = tuple(_read_cpu(reader, cpu_dir, cpu, cpu in online, node_of) for cpu in all_cpus)
    size = meminfo.get("Hugepagesize")
    package_list = _packages(per_cpu)
    return Topology(
        numa_enabled=numa_enabled,
        node_ids=tuple(node_ids),
        nodes=nodes,
        cpus=sets,
        per_cpu=per_cpu,
        packages=package_list,
        hugepages=_read_pools(reader, reader.sys("kernel", "mm", "hugepages"), True)
        if numa_enabled
        else nodes[0].hugepages,
        default_hugepage_size_kb=size,
        kernel=_kernel_knobs(reader),
        consistency=check_consistency(nodes + offline_dirs, per_cpu, offline_nodes)
        + tuple(packages.cross_findings(package_list)),
        **packages.package_layout(package_list),
    )


def as_facts(topology: Topology) -> dict:
    """JSON-ready dict of a Topology (the non-PCI part of ansible_facts.numa)."""
    return as_plain(topology)


def as_plain(value):
    """JSON-ready copy of ``value``: dataclasses become dicts in field order, tuples lists.

    The result equals that of dataclasses.asdict() with every tuple turned into a list, without
    asdict()'s deep copy of each leaf (ints, strings and None need none).
    """
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is tuple or kind is list:
        return [item if type(item) in _LEAVES else as_plain(item) for item in value]
    if kind is dict:
        return {
            key: item if type(item) in _LEAVES else as_plain(item) for key, item in value.items()
        }
    names = _FIELD_NAMES.get(kind)
    if names is None and is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[kind] = tuple(item.name for item in fields(value))
    if names is not None:
        plain = {}
        for name in names:
            item = getattr(value, name)
            plain[name] = item if type(item) in _LEAVES else as_plain(item)
        return plain
    if isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [as_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: as_plain(item) for key, item in value.items()}
    return copy.deepcopy(value)
