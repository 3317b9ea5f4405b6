# Private to this collection: may change in any release.
"""Where a planned service's memory really is: numa_maps, binding, cgroup PIDs, numastat, perf.

docs/architecture.md ("Verify: metrics and checks") defines the metrics. Everything here reads
host files through roots given as arguments (``procfs_root``, ``sysfs_root``, ``cgroup_root``)
or parses text; a command (``perf``) is run only by the caller, through a ``run_perf`` callable.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .cpulist import parse_cpulist
from .errors import CpulistError, GuardError, LocalityError
from .guard import parse_spilled
from .sysfs import Reader
from .topology import NODE_DIR, parse_counters, parse_meminfo, read_topology

PERF_EVENTS = ("node-loads", "node-load-misses")
_ADDR_RE = re.compile(r"^[0-9a-f]+\Z")
_NODE_TOKEN_RE = re.compile(r"^N([0-9]+)=([0-9]+)\Z")
_NODE_DIR_RE = re.compile(r"^node([0-9]+)\Z")
# A process that exits between listing and reading: its /proc files vanish (ENOENT) or, while it
# is a zombie being reaped, reads fail with ESRCH.
_GONE = (errno.ENOENT, errno.ESRCH)
ROOT_FIX = "Run the module as root (become: true): numa_maps of other users' processes is private"


@dataclass(frozen=True)
class NumaMaps:
    """Resident kB per node of one process: anonymous, hugetlb and file-backed, counted apart."""

    anon_kb_by_node: dict = field(default_factory=dict)
    huge_kb_by_node: dict = field(default_factory=dict)
    file_kb_by_node: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ProcStatus:
    """The binding fields of /proc/<pid>/status."""

    cpus_allowed: tuple
    mems_allowed: tuple


@dataclass(frozen=True)
class UnitCgroup:
    """Where a unit's cgroup was found: hierarchy (v2 or v1), path relative to it, directory."""

    version: int
    relpath: str
    directory: str


def _add(table: dict, node: int, kb: int) -> None:
    table[node] = table.get(node, 0) + kb


def parse_numa_maps(text: str, source: str = "numa_maps") -> NumaMaps:
    """kB per node of anonymous, hugetlb and file-backed mappings; raises LocalityError.

    A mapping is ``huge`` when marked so (hugetlbfs, whatever its ``file=``); otherwise ``anon``
    when it has no ``file=``; otherwise its ``anon=`` pages (copied on write) are ``anon`` and
    the rest of its pages (page cache) ``file``. Pages (``N<node>=<pages>``) are weighted by the
    mapping's ``kernelpagesize_kB``.

    numa_maps does not split a mapping's pages per node by kind. In a private file mapping (a
    program's or library's ``.data``) the pages copied on write were allocated under the
    mapping's memory policy (the second field, ``bind:0``), while its page cache lies wherever the
    file was first read and is not the process's to place. So its anonymous pages are counted on
    the nodes the policy names first, as many as each holds, then on the nodes holding most pages
    (also for policies that name no node, ``default`` or ``local``); the other pages are ``file``.
    """
    anon: dict = {}
    huge: dict = {}
    files: dict = {}
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue
        if not _ADDR_RE.match(tokens[0]) or len(tokens) < 2:
            raise LocalityError(
                source,
                f"line {number} {line.strip()[:80]!r} does not start with '<address> <policy>'",
            )
        pages: dict = {}
        page_kb = None
        is_huge = has_file = False
        anon_pages = 0
        for token in tokens[2:]:
            match = _NODE_TOKEN_RE.match(token)
            if match:
                pages[int(match.group(1))] = int(match.group(2))
            elif token.startswith("kernelpagesize_kB="):
                value = token.partition("=")[2]
                if not (value.isascii() and value.isdigit()) or int(value) == 0:
                    raise LocalityError(source, f"line {number}: bad page size {token!r}")
                page_kb = int(value)
            elif token == "huge":
                is_huge = True
            elif token.startswith("anon="):
                value = token.partition("=")[2]
                anon_pages = int(value) if value.isascii() and value.isdigit() else 0
            elif token.startswith("file="):
                has_file = True
            elif token.startswith("N") and "=" in token:
                raise LocalityError(source, f"line {number}: bad node count {token!r}")
        if not any(pages.values()):
            continue
        if page_kb is None:
            raise LocalityError(
                source, f"line {number} has N<node>= pages but no kernelpagesize_kB"
            )
        if is_huge or not has_file:
            for node, count in pages.items():
                if count:
                    _add(huge if is_huge else anon, node, count * page_kb)
            continue
        policy = _policy_nodes(tokens[1])
        order = sorted(pages, key=lambda node: (node not in policy, -pages[node], node))
        for node in order:
            copied = min(anon_pages, pages[node])
            anon_pages -= copied
            if copied:
                _add(anon, node, copied * page_kb)
            if pages[node] - copied:
                _add(files, node, (pages[node] - copied) * page_kb)
    return NumaMaps(anon, huge, files)


def _policy_nodes(policy: str) -> set:
    """The nodes a numa_maps policy field names (``bind:0-1``, ``prefer:1``); none for
    ``default``, ``local`` or one that does not parse."""
    nodes = policy.partition(":")[2]
    try:
        return set(parse_cpulist(nodes)) if nodes else set()
    except CpulistError:
        return set()


def _status_list(fields: dict, name: str, source: str) -> tuple:
    if name not in fields:
        raise LocalityError(source, f"no {name} line (kernels since 2.6.26 write it)")
    try:
        return tuple(parse_cpulist(fields[name]))
    except CpulistError as exc:
        raise LocalityError(source, f"{name}: {exc}") from None


def parse_status(text: str, source: str = "status") -> ProcStatus:
    """Cpus_allowed_list and Mems_allowed_list of a /proc/<pid>/status text; raises LocalityError."""
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    return ProcStatus(
        cpus_allowed=_status_list(fields, "Cpus_allowed_list", source),
        mems_allowed=_status_list(fields, "Mems_allowed_list", source),
    )


def _hierarchies(cgroup_root: str) -> list:
    """(version, directory) of the hierarchies to search, unified first."""
    if os.path.isfile(os.path.join(cgroup_root, "cgroup.controllers")):
        return [(2, cgroup_root)]
    found = []
    for version, name in ((2, "unified"), (1, "systemd"), (1, "cpuset")):
        path = os.path.join(cgroup_root, name)
        if os.path.isdir(path):
            found.append((version, path))
    return found


def find_unit_cgroup(
    cgroup_root: str, unit: str, slice_name: Optional[str] = None
) -> Optional[UnitCgroup]:
    """The cgroup directory named ``unit`` (inside ``slice_name`` when given), or None if absent.

    Searches the cgroup v2 tree (``<cgroup_root>`` or its ``unified/``), then the v1 ``systemd``
    and ``cpuset`` hierarchies. Among several matches the shortest path wins.
    """
    for version, top in _hierarchies(cgroup_root):
        matches = []
        for directory, dirs, dummy in os.walk(top):
            dirs.sort()
            if os.path.basename(directory) != unit or directory == top:
                continue
            relpath = os.path.relpath(directory, top)
            if slice_name and slice_name not in relpath.split(os.sep)[:-1]:
                continue
            if os.path.isfile(os.path.join(directory, "cgroup.procs")):
                matches.append(relpath)
        if matches:
            relpath = min(matches, key=lambda path: (path.count(os.sep), path))
            return UnitCgroup(version, relpath, os.path.join(top, relpath))
    return None


def _read_procs(path: str) -> list:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError as exc:
        if exc.errno in _GONE:  # the cgroup was removed while we walked it
            return []
        raise LocalityError(path, exc.strerror or "cannot be read") from None
    pids = []
    for line in text.split():
        if not line.isdigit():
            raise LocalityError(path, f"{line[:40]!r} is not a PID")
        pids.append(int(line))
    return pids


def read_unit_pids(cgroup_root: str, unit: str, slice_name: Optional[str] = None) -> list:
    """Sorted PIDs of the unit's cgroup and its sub-cgroups; [] when it has none (not running)."""
    return cgroup_pids(find_unit_cgroup(cgroup_root, unit, slice_name))


def cgroup_pids(cgroup: Optional[UnitCgroup]) -> list:
    """Sorted PIDs in cgroup.procs of the cgroup and its sub-cgroups; [] for None."""
    if cgroup is None:
        return []
    pids = set()
    for directory, dirs, files in os.walk(cgroup.directory):
        dirs.sort()
        if "cgroup.procs" in files:
            pids.update(_read_procs(os.path.join(directory, "cgroup.procs")))
    return sorted(pids)


def _read_proc_file(procfs_root: str, pid: int, name: str) -> Optional[str]:
    """Text of /proc/<pid>/<name>, or None when the process has gone; raises LocalityError."""
    path = os.path.join(procfs_root, str(pid), name)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        fix = ROOT_FIX if exc.errno in (errno.EACCES, errno.EPERM) else ""
        raise LocalityError(path, exc.strerror or "cannot be read", fix) from None


def read_process(procfs_root: str, pid: int) -> Optional[tuple]:
    """(ProcStatus, NumaMaps) of one process, or None when it exited; raises LocalityError."""
    status = _read_proc_file(procfs_root, pid, "status")
    maps = _read_proc_file(procfs_root, pid, "numa_maps")
    if status is None or maps is None:
        return None
    base = os.path.join(procfs_root, str(pid))
    return (
        parse_status(status, os.path.join(base, "status")),
        parse_numa_maps(maps, os.path.join(base, "numa_maps")),
    )


def read_numastat(sysfs_root: str) -> dict:
    """{node id: counters} of <sysfs_root>/devices/system/node/node*/numastat; {} without NUMA."""
    reader = Reader(sysfs_root, "")
    node_dir = reader.sys(*NODE_DIR)
    result = {}
    for name in reader.listdir(node_dir, optional=True):
        match = _NODE_DIR_RE.match(name)
        if match:
            counters = reader.parsed(f"{node_dir}/{name}/numastat", parse_counters, optional=True)
            if counters is not None:
                result[int(match.group(1))] = counters
    return result


def miss_ratio(local: Optional[int], other: Optional[int]) -> Optional[float]:
    """other / (local + other), or None when either is unknown or both are zero."""
    if local is None or other is None or local + other == 0:
        return None
    return other / (local + other)


def numastat_delta(before: dict, after: dict) -> dict:
    """{node: {local_node, other_node, miss_ratio}} of two read_numastat samples; raises LocalityError.

    Nodes present in only one sample are left out. A counter that went down means the
    samples are not from one boot of one host.
    """
    result = {}
    for node in sorted(set(before) & set(after)):
        counts = {}
        for name in ("local_node", "other_node"):
            first, last = before[node].get(name), after[node].get(name)
            if first is None or last is None:
                counts[name] = None
            elif last < first:
                raise LocalityError(
                    f"node{node}/numastat",
                    f"{name} went down from {first} to {last} during the window",
                    "Take both samples on the same host without a reboot in between",
                )
            else:
                counts[name] = last - first
        counts["miss_ratio"] = miss_ratio(counts["local_node"], counts["other_node"])
        result[node] = counts
    return result


@dataclass(frozen=True)
class PerfStat:
    """Counts of ``perf stat -x,`` events; ``unavailable`` maps an event to perf's reason."""

    counts: dict
    unavailable: dict


def parse_perf_stat(text: str, source: str = "perf stat") -> PerfStat:
    """Counts of ``perf stat -x, [-G CGROUP]`` CSV lines; raises LocalityError on a malformed line.

    Each line is ``value,unit,event[,cgroup],run-time,percent,metric,metric-unit`` (perf-stat(1),
    "-x"); a value of ``<not supported>`` or ``<not counted>`` marks the event unavailable.
    Lines that are not CSV (comments, warnings) are ignored.
    """
    counts: dict = {}
    unavailable: dict = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "," not in line:
            continue
        parts = line.split(",")
        if len(parts) < 3 or not parts[2]:
            raise LocalityError(source, f"line {line[:80]!r} has no event name in field 3")
        value, event = parts[0].strip(), parts[2].strip()
        if value.startswith("<") and value.endswith(">"):
            unavailable[event] = value
            continue
        try:
            counts[event] = float(value)
        except ValueError:
            raise LocalityError(source, f"line {line[:80]!r}: {value!r} is not a count") from None
    return PerfStat(counts, unavailable)


def remote_access(stat: PerfStat) -> dict:
    """{available, ratio, reason}: node-load-misses / node-loads of a PerfStat."""
    for event in PERF_EVENTS:
        if event in stat.unavailable:
            return _unavailable(f"perf reports {event} {stat.unavailable[event]}")
        if event not in stat.counts:
            return _unavailable(f"perf printed no {event} count")
    loads = stat.counts["node-loads"]
    if loads <= 0:
        return _unavailable("no node-loads were counted in the window")
    return {"available": True, "ratio": stat.counts["node-load-misses"] / loads, "reason": None}


def _unavailable(reason: str) -> dict:
    return {"available": False, "ratio": None, "reason": reason}


def _gpu_node(reader: Reader, gpu: dict) -> Optional[int]:
    """The GPU's numa_node from sysfs when the device is there, else the plan's.

    None (unknown) for -1 and for a node that has no ``devices/system/node/node<N>`` directory
    on a host that has the others: such a numa_node lies, as numa_facts reports it.
    """
    address = gpu.get("address")
    if address:
        path = reader.sys("bus", "pci", "devices", address, "numa_node")
        if reader.exists(path):
            node = reader.integer(path)
            if node is None or node < 0:
                return None
            nodes = reader.sys("devices", "system", "node")
            if reader.isdir(nodes) and not reader.isdir(f"{nodes}/node{node}"):
                return None
            return node
    return gpu.get("node")


def _subset(values: set, allowed: list) -> Optional[bool]:
    return None if not values and not allowed else values <= set(allowed)


def _int_list(value, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value
    ):
        raise LocalityError(where, f"{value!r} is not a list of non-negative integers")
    return sorted(set(value))


def parse_services(services) -> list:
    """Checked copies of planned services (plan placements work as they are); raises LocalityError.

    Each needs ``name``; ``unit`` (default ``<name>.service``), ``slice``, ``cpus``, ``mems`` and
    ``gpus`` (``[{address, node}]``) are read, other keys are ignored.
    """
    if not isinstance(services, (list, tuple)):
        raise LocalityError("services", "must be a list of planned services (placements)")
    checked = []
    for index, service in enumerate(services):
        where = f"services[{index}]"
        if not isinstance(service, dict) or not isinstance(service.get("name"), str):
            raise LocalityError(where, "needs a name (a planned service, as in plan placements)")
        gpus = service.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(gpu, dict) for gpu in gpus):
            raise LocalityError(f"{where}.gpus", "must be a list of {address, node} dicts")
        checked.append(
            {
                "name": service["name"],
                "unit": service.get("unit") or f"{service['name']}.service",
                "slice": service.get("slice") or None,
                "cpus": _int_list(service.get("cpus"), f"{where}.cpus"),
                "mems": _int_list(service.get("mems"), f"{where}.mems"),
                "gpus": [{"address": g.get("address"), "node": g.get("node")} for g in gpus],
            }
        )
    return checked


def offnode_share(kb_by_node: dict, mems) -> Optional[float]:
    """Share (0..1) of ``kb_by_node`` ({node: kB}) on nodes outside ``mems``; None when empty."""
    total = sum(kb_by_node.values())
    outside = sum(kb for node, kb in kb_by_node.items() if node not in mems)
    return outside / total if total else None


def measure_service(service: dict, procfs_root: str, sysfs_root: str, cgroup_root: str) -> dict:
    """Measured state of one planned service (see measure_services); raises LocalityError."""
    cpus, mems = list(service.get("cpus") or []), list(service.get("mems") or [])
    unit = service.get("unit") or f"{service['name']}.service"
    cgroup = find_unit_cgroup(cgroup_root, unit, service.get("slice"))
    pids, cpus_seen, mems_seen, cpus_ok, mems_ok = [], set(), set(), True, True
    inside: dict = {}
    files: dict = {}
    for pid in cgroup_pids(cgroup):
        measured = read_process(procfs_root, pid)
        if measured is None:  # exited while we read: not an error
            continue
        status, maps = measured
        pids.append(pid)
        cpus_seen.update(status.cpus_allowed)
        mems_seen.update(status.mems_allowed)
        cpus_ok = cpus_ok and set(status.cpus_allowed) <= set(cpus)
        mems_ok = mems_ok and set(status.mems_allowed) <= set(mems)
        for table in (maps.anon_kb_by_node, maps.huge_kb_by_node):
            for node, kb in table.items():
                _add(inside, node, kb)
        for node, kb in maps.file_kb_by_node.items():
            _add(files, node, kb)
    reader = Reader(sysfs_root, "")
    return {
        "name": service["name"],
        "unit": unit,
        "running": bool(pids),
        "pids": pids,
        "cgroup": None if cgroup is None else {"version": cgroup.version, "path": cgroup.relpath},
        "binding": {
            "cpus_allowed": sorted(cpus_seen),
            "mems_allowed": sorted(mems_seen),
            "cpus_ok": cpus_ok if pids else None,
            "mems_ok": mems_ok if pids else None,
        },
        "pages_kb": {
            "anon_huge_by_node": {str(node): kb for node, kb in sorted(inside.items())},
            "file_by_node": {str(node): kb for node, kb in sorted(files.items())},
        },
        "offnode_share": offnode_share(inside, mems),
        "gpu_locality": [
            _gpu_locality(_gpu_node(reader, gpu), gpu, mems) for gpu in service.get("gpus") or []
        ],
    }


def _gpu_locality(node: Optional[int], gpu: dict, mems: list) -> dict:
    return {
        "address": gpu.get("address"),
        "node": node,
        "ok": None if node is None else node in mems,
    }


def measure_services(services: list, procfs_root: str, sysfs_root: str, cgroup_root: str) -> list:
    """One measurement dict per planned service, in the given order; raises LocalityError.

    Keys: name, unit, running, pids, cgroup {version, path}, binding {cpus_allowed, mems_allowed,
    cpus_ok, mems_ok}, pages_kb {anon_huge_by_node, file_by_node} (node ids as strings, kB),
    offnode_share (None without anonymous/huge pages), gpu_locality [{address, node, ok}].
    """
    return [measure_service(s, procfs_root, sysfs_root, cgroup_root) for s in services]


def _file_kb(reader: Reader, node_id: int, numa: bool) -> Optional[int]:
    """Active(file) + Inactive(file) kB of a node (node<N>/meminfo; /proc/meminfo without NUMA
    sysfs), or None when either line is missing."""
    path = reader.sys(*NODE_DIR, f"node{node_id}", "meminfo") if numa else reader.proc("meminfo")
    meminfo = reader.parsed(path, parse_meminfo) or {}
    active, inactive = meminfo.get("Active(file)"), meminfo.get("Inactive(file)")
    return None if active is None or inactive is None else active + inactive


def node_report(sysfs_root: str, procfs_root: str, numastat: dict) -> list:
    """Per-node memory use, hugepage totals and the given numastat counters, sorted by id.

    memory_used_kb is the memory guard's definition: MemTotal - MemFree - (Active(file) +
    Inactive(file)) (never below 0; page cache the kernel can drop is not used), so verify's
    memory_used check and numafleet-guard judge a node alike; memory_file_kb is those file LRU
    pages. None when a field is missing.
    """
    reader = Reader(sysfs_root, procfs_root)
    topology = read_topology(reader)
    numa = reader.isdir(reader.sys(*NODE_DIR))
    nodes = []
    for node in topology.nodes:
        total, free = node.memory_kb, node.memfree_kb
        file_kb = _file_kb(reader, node.id, numa)
        used = (
            None
            if total is None or free is None or file_kb is None
            else max(total - free - file_kb, 0)
        )
        counts = numastat.get(node.id) or {}
        nodes.append(
            {
                "id": node.id,
                "memory_total_kb": total,
                "memory_file_kb": file_kb,
                "memory_used_kb": used,
                "memory_used_pct": round(100.0 * used / total, 2)
                if used is not None and total
                else None,
                "hugepages": [{"size_kb": p.size_kb, "total": p.total} for p in node.hugepages],
                "numastat": {
                    "local_node": counts.get("local_node"),
                    "other_node": counts.get("other_node"),
                    "miss_ratio": counts.get("miss_ratio"),
                },
            }
        )
    return nodes


def measure(
    services: list,
    procfs_root: str,
    sysfs_root: str,
    cgroup_root: str,
    window_s: float,
    run_perf: Optional[Callable[[str, float], Optional[str]]] = None,
    perf_reason: str = "perf is not used (perf=never)",
    sleep: Optional[Callable[[float], None]] = None,
) -> dict:
    """{services, nodes}: measure_services plus remote_access, and nodes over a window.

    numastat is sampled before and after the window (``window_s`` 0: one sample, miss_ratio None).
    ``run_perf(cgroup_relpath, window_s)`` returns perf's CSV text (None on failure) and takes the
    window itself; without it ``sleep(window_s)`` does. Raises LocalityError.
    """
    Reader(sysfs_root, procfs_root).check_roots()
    if not os.path.isdir(cgroup_root):
        raise LocalityError(
            cgroup_root,
            f"no such directory, so cgroup_root={cgroup_root!r} is not a cgroup tree",
            "Point cgroup_root at the host's /sys/fs/cgroup",
        )
    before = read_numastat(sysfs_root)
    measured = measure_services(parse_services(services), procfs_root, sysfs_root, cgroup_root)
    perf_ran = False
    for service in measured:
        cgroup = service["cgroup"]
        if not service["running"]:
            service["remote_access"] = _unavailable("the unit is not running")
        elif run_perf is None:
            service["remote_access"] = _unavailable(perf_reason)
        elif cgroup["version"] != 2:
            service["remote_access"] = _unavailable(
                "the unit's cgroup is on cgroup v1; perf -G is used with cgroup v2 only"
            )
        else:
            text = run_perf(cgroup["path"], window_s)
            perf_ran = True
            service["remote_access"] = (
                _unavailable("perf stat failed")
                if text is None
                else remote_access(parse_perf_stat(text))
            )
    if window_s > 0:
        if not perf_ran and sleep is not None:
            sleep(window_s)
        numastat = numastat_delta(before, read_numastat(sysfs_root))
    else:
        numastat = {
            node: {
                "local_node": c.get("local_node"),
                "other_node": c.get("other_node"),
                "miss_ratio": None,
            }
            for node, c in before.items()
        }
    return {"services": measured, "nodes": node_report(sysfs_root, procfs_root, numastat)}


# numafleet-guard (the memory guard service) as the role memory_guard installs it.
GUARD_SERVICE = "numafleet-guard.service"
GUARD_STATE_FILE = "/run/numafleet-guard/state.json"
GUARD_CONFIG_FILE = "/etc/numafleet/guard.json"
GUARD_SETTINGS = ("warn_pct", "act_pct", "act", "interval_s")
_GUARD_FILE_MAX_BYTES = 4 * 1024 * 1024


def _read_json(path: str) -> tuple:
    """(data, None) of a JSON file, or (None, reason): absent, unreadable, too large, not JSON."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_GUARD_FILE_MAX_BYTES + 1)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, "absent"
        return None, f"cannot be read: {exc.strerror or exc}"
    if len(data) > _GUARD_FILE_MAX_BYTES:
        return None, f"larger than {_GUARD_FILE_MAX_BYTES} bytes"
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"not a JSON object but {type(value).__name__}"
    return value, None


def read_guard(
    state_file: str = GUARD_STATE_FILE,
    config_file: str = GUARD_CONFIG_FILE,
    now: Optional[float] = None,
    active: Optional[str] = None,
    active_reason: Optional[str] = None,
) -> dict:
    """What verify needs of numafleet-guard on this host; never raises.

    Keys: service (the unit name), active (``systemctl is-active``'s word, given by the caller,
    or None) and active_reason (why it is None); config_file, settings ({warn_pct, act_pct, act,
    interval_s} of the config's ``settings``, or None) and config_reason; state_file, last_run
    (epoch s of the guard's last round, or None), spilled ({placement: {from, to, since, bytes}},
    {} when the state file is absent) and state_reason; read_at (epoch s, this host's clock,
    ``now`` when given).
    """
    out = {
        "service": GUARD_SERVICE,
        "active": active,
        "active_reason": active_reason,
        "config_file": config_file,
        "settings": None,
        "config_reason": None,
        "state_file": state_file,
        "last_run": None,
        "spilled": {},
        "state_reason": None,
        "read_at": time.time() if now is None else now,
    }
    config, reason = _read_json(config_file)
    if config is not None:
        settings = config.get("settings")
        if isinstance(settings, dict):
            out["settings"] = {key: settings.get(key) for key in GUARD_SETTINGS}
        else:
            reason = "has no settings mapping"
    out["config_reason"] = reason
    state, reason = _read_json(state_file)
    if state is not None:
        last_run = state.get("last_run")
        if isinstance(last_run, (int, float)) and not isinstance(last_run, bool):
            out["last_run"] = float(last_run)
        else:
            reason = f"last_run is {last_run!r}, not epoch seconds"
        try:
            out["spilled"] = parse_spilled(state.get("spilled"))
        except GuardError as exc:
            reason = str(exc)
    out["state_reason"] = reason
    return out


def _guard_on_host(guard: dict, run_command: Callable, get_bin_path: Callable) -> dict:
    """read_guard with the service's ``systemctl is-active`` word when guard['service'] is true."""
    active, why = None, "not asked (the guard is not enabled on the host)"
    if guard.get("service"):
        systemctl = get_bin_path("systemctl")
        if systemctl is None:
            why = "systemctl is not installed"
        else:
            rc, out, err = run_command(
                [systemctl, "is-active", GUARD_SERVICE],
                environ_update={"LC_ALL": "C", "LANG": "C"},
            )
            words = out.split()
            active, why = (words[0], None) if words else (None, f"systemctl is-active: rc {rc}")
    return read_guard(
        guard.get("state_file") or GUARD_STATE_FILE,
        guard.get("config_file") or GUARD_CONFIG_FILE,
        active=active,
        active_reason=why,
    )


def measure_on_host(
    services: list, settings: dict, run_command: Callable, get_bin_path: Callable, sleep: Callable
) -> dict:
    """measure() as a module runs it on the host; raises LocalityError.

    settings: {sysfs_root, procfs_root, cgroup_root, window_s (seconds, 0 or more), perf (auto:
    ``perf stat`` when installed; never), guard (optional: {state_file, config_file, service
    (bool: ask ``systemctl is-active numafleet-guard.service``)}; when given the result has a
    ``guard`` key, see read_guard)}. run_command and get_bin_path are AnsibleModule's
    (``perf`` is run through coreutils ``timeout`` when that exists); sleep takes the window when
    perf does not run. numa_locality_info and host_apply (option measure) call it.
    """
    window_s = settings["window_s"]
    if window_s < 0:
        raise LocalityError(
            "window_s", f"{window_s} is less than 0 seconds", "Give 0 (one sample) or more"
        )
    perf = get_bin_path("perf") if settings["perf"] == "auto" else None
    timeout = get_bin_path("timeout")

    def run_perf(cgroup, window):
        argv = [timeout, str(int(window) + 30)] if timeout else []
        argv += [perf, "stat", "-x", ",", "-e", ",".join(PERF_EVENTS), "-G", cgroup, "-a"]
        argv += ["--", "sleep", str(window)]
        rc, dummy, err = run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C"})
        return err if rc == 0 else None

    reason = "perf is not installed" if settings["perf"] == "auto" else "perf=never"
    result = measure(
        services,
        settings["procfs_root"],
        settings["sysfs_root"],
        settings["cgroup_root"],
        window_s,
        run_perf=run_perf if perf else None,
        perf_reason=reason,
        sleep=sleep,
    )
    if settings.get("guard") is not None:
        result["guard"] = _guard_on_host(settings["guard"], run_command, get_bin_path)
    return result
