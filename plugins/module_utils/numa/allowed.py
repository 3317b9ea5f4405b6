# Private to this collection: may change in any release.
"""The CPUs and memory nodes the collection's services may use (cgroup cpusets, PID 1).

Services started by systemd run inside the cpuset of every cgroup above them: the kernel
narrows (or refuses) a CPUAffinity=/AllowedCPUs= outside it. read_allowed() gives that set and
where it came from, as ansible_facts.numa.allowed; read_pid1() gives PID 1's own affinity, as
ansible_facts.numa.pid1. Sources, each read only when its files exist (a missing file is no
error: recorded dumps usually lack them):

- ``cgroup2_root``: <sysfs_root>/fs/cgroup/cpuset.cpus.effective and cpuset.mems.effective
  (the cgroup v2 layout: <sysfs_root>/fs/cgroup/cgroup.controllers exists).
- ``cgroup1_root``: <sysfs_root>/fs/cgroup/cpuset/cpuset.effective_cpus and
  cpuset.effective_mems (the cgroup v1 cpuset hierarchy).
- ``cgroup2_container`` / ``cgroup1_container``: the same files of the cgroup PID 1 runs in,
  from <procfs_root>/1/cgroup, when that is not the root (less a trailing ``/init.scope``): the
  "host" is a container, and the container's cpuset holds every service it starts.
- ``cgroup2_slice``: numafleet.slice below that cgroup, the slice every placement's unit runs
  in (tenant slices are below it; their own sets are the plan's and are not read).
- ``system_slice``: system.slice below it. Reported but not applied: placements run in
  numafleet.slice, so a system.slice kept to housekeeping CPUs does not bind them.
- ``pid1``: Cpus_allowed_list and Mems_allowed_list of <procfs_root>/1/status. Applied only
  when no cgroup cpuset file could be read (a container whose cgroup tree is not visible);
  isolated CPUs missing from it are not taken as narrowed (isolcpus takes them out of PID 1's
  affinity, not out of what a unit may set). A CPUAffinity= in systemd's system.conf narrows
  PID 1 too, and units that set their own CPUAffinity= (ours do) are not bound by it.

An unreadable or malformed file, and an empty set (the kernel never writes one for a cgroup
with tasks), is a reader warning and not used.
"""

from __future__ import annotations

from typing import Optional

from .cpulist import format_cpulist, parse_cpulist
from .sysfs import Reader

CGROUP_DIR = ("fs", "cgroup")
# (cpus file, mems file) of a cgroup directory, per cgroup version.
V2_FILES = ("cpuset.cpus.effective", "cpuset.mems.effective")
V1_FILES = ("cpuset.effective_cpus", "cpuset.effective_mems")
# The slice of every placement (units.DEFAULT_SLICE; tenant slices are below it).
PLACEMENT_SLICE = "numafleet.slice"
SYSTEM_SLICE = "system.slice"
INIT_SCOPE = "/init.scope"


def parse_status_lists(text: str) -> dict:
    """{"cpus_allowed": [...], "mems_allowed": [...]} of a /proc/<pid>/status text.

    A missing line is None; raises ValueError (CpulistError) for a line that is not a cpulist.
    """
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    out: dict = {}
    for key, name in (("cpus_allowed", "Cpus_allowed_list"), ("mems_allowed", "Mems_allowed_list")):
        out[key] = parse_cpulist(fields[name]) if name in fields else None
    if out["cpus_allowed"] is None and out["mems_allowed"] is None:
        raise ValueError("no Cpus_allowed_list or Mems_allowed_list line")
    return out


def parse_proc_cgroup(text: str) -> dict:
    """{"v2": path or None, "cpuset": path or None} of a /proc/<pid>/cgroup text.

    ``0::/path`` is the cgroup v2 path; ``N:...cpuset...:/path`` the v1 cpuset path. Raises
    ValueError for a line that is not ``hierarchy:controllers:/path``.
    """
    found: dict = {"v2": None, "cpuset": None}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            raise ValueError(f"line {line.strip()!r} is not 'hierarchy:controllers:/path'")
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            found["v2"] = path
        elif "cpuset" in controllers.split(","):
            found["cpuset"] = path
    return found


def container_base(path: Optional[str]) -> Optional[str]:
    """The cgroup path (no leading /) holding PID 1's services, or None when it is the root.

    systemd moves itself into init.scope of its cgroup: ``/init.scope`` (a host) is the root,
    ``/docker/abc/init.scope`` or ``/docker/abc`` (a container) is ``docker/abc``. A path with
    ``..`` parts (never written by the kernel) is None.
    """
    if not path:
        return None
    if path.endswith(INIT_SCOPE):
        path = path[: -len(INIT_SCOPE)]
    parts = [part for part in path.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        return None
    return "/".join(parts)


def _set(reader: Reader, path: str) -> Optional[list]:
    """The non-empty cpulist of ``path``, None when missing, or None with a warning."""
    found = reader.cpulist(path, optional=True)
    if found == []:
        reader.warn(path, "is empty; the kernel never writes an empty effective set: not used")
        return None
    return found


def _cgroup_source(reader: Reader, source: str, directory: str, files: tuple, applies: bool):
    """The source entry of one cgroup directory, or None when neither file gives a set."""
    cpus_path, mems_path = f"{directory}/{files[0]}", f"{directory}/{files[1]}"
    cpus, mems = _set(reader, cpus_path), _set(reader, mems_path)
    if cpus is None and mems is None:
        return None
    return {
        "source": source,
        "path": cpus_path,
        "mems_path": mems_path,
        "cpus": cpus,
        "mems": mems,
        "applies": applies,
    }


def read_pid1(reader: Reader) -> dict:
    """{"cpus_allowed", "mems_allowed", "path"} of <procfs_root>/1/status; lists None if unknown."""
    path = reader.proc("1", "status")
    parsed = reader.parsed(path, parse_status_lists, optional=True) if reader.procfs_root else None
    parsed = parsed or {}
    return {
        "cpus_allowed": parsed.get("cpus_allowed"),
        "mems_allowed": parsed.get("mems_allowed"),
        "path": path,
    }


def _cgroup_sources(reader: Reader) -> list:
    """Source entries of the cgroup cpuset files that exist (module docstring)."""
    root = reader.sys(*CGROUP_DIR)
    cgroups: dict = {"v2": None, "cpuset": None}
    if reader.procfs_root:
        path = reader.proc("1", "cgroup")
        cgroups = reader.parsed(path, parse_proc_cgroup, optional=True) or cgroups
    sources: list = []
    if reader.exists(f"{root}/cgroup.controllers"):
        base = container_base(cgroups["v2"])
        below = root if base is None else f"{root}/{base}"
        sources.append(_cgroup_source(reader, "cgroup2_root", root, V2_FILES, True))
        if base is not None:
            sources.append(_cgroup_source(reader, "cgroup2_container", below, V2_FILES, True))
        for source, name, applies in (
            ("cgroup2_slice", PLACEMENT_SLICE, True),
            ("system_slice", SYSTEM_SLICE, False),
        ):
            sources.append(_cgroup_source(reader, source, f"{below}/{name}", V2_FILES, applies))
    v1 = f"{root}/cpuset"
    if reader.isdir(v1):
        sources.append(_cgroup_source(reader, "cgroup1_root", v1, V1_FILES, True))
        base = container_base(cgroups["cpuset"])
        if base is not None:
            sources.append(
                _cgroup_source(reader, "cgroup1_container", f"{v1}/{base}", V1_FILES, True)
            )
    return [source for source in sources if source is not None]


def read_allowed(
    reader: Reader,
    online: list,
    node_ids: list,
    isolated: list = (),
    pid1: Optional[dict] = None,
) -> dict:
    """ansible_facts.numa.allowed: the CPUs and memory nodes the collection's services may use.

    ``online``: the online CPUs; ``node_ids``: the online NUMA nodes; ``isolated``: the isolated
    CPUs (see the module docstring for the pid1 source); ``pid1``: read_pid1() when the caller
    has it already. Returns {"cpus": sorted CPUs,
    "mems": sorted nodes, "narrowed": bool, "sources": [{"source", "path", "mems_path", "cpus",
    "mems", "applies"}]}: every source read (cpus or mems None when its file gave none), and
    cpus/mems the intersection of the applied ones with ``online`` / ``node_ids``. Without any
    source, cpus == online, mems == node_ids and narrowed is false. Never raises.
    """
    sources = _cgroup_sources(reader)
    if pid1 is None:
        pid1 = read_pid1(reader)
    if pid1["cpus_allowed"] is not None or pid1["mems_allowed"] is not None:
        cpus_allowed = pid1["cpus_allowed"]
        if cpus_allowed is not None and isolated:
            cpus_allowed = sorted(set(cpus_allowed) | set(isolated))
        sources.append(
            {
                "source": "pid1",
                "path": pid1["path"],
                "mems_path": pid1["path"],
                "cpus": cpus_allowed,
                "mems": pid1["mems_allowed"],
                "applies": not sources,
            }
        )
    cpus, mems = set(online), set(node_ids)
    for source in sources:
        if not source["applies"]:
            continue
        for key, path_key, every, noun in (
            ("cpus", "path", online, "CPUs"),
            ("mems", "mems_path", node_ids, "memory nodes"),
        ):
            named = source[key]
            if named is not None and not set(named) & set(every):
                reader.warn(
                    source[path_key],
                    f"names {noun} {format_cpulist(named)}, none of them online (online: "
                    f"{format_cpulist(every) or 'none'}): services may run nowhere; the planner "
                    "refuses to plan",
                )
        if source["cpus"] is not None:
            cpus &= set(source["cpus"])
        if source["mems"] is not None:
            mems &= set(source["mems"])
    return {
        "cpus": sorted(cpus),
        "mems": sorted(mems),
        "narrowed": cpus != set(online) or mems != set(node_ids),
        "sources": sources,
    }


def narrowing_sources(allowed: dict, online: list, node_ids: list, which: str = "both") -> list:
    """'cgroup2_slice (<path>)' of each applied source that takes CPUs or nodes away.

    which: "cpus" names the sources that narrow the CPUs by their cpus file
    (cpuset.cpus.effective), "mems" those that narrow the memory nodes by their mems file
    (cpuset.mems.effective), "both" either, with both files when a source narrows both.
    """
    named = []
    for source in allowed.get("sources") or ():
        if not isinstance(source, dict) or not source.get("applies"):
            continue
        cpus, mems = source.get("cpus"), source.get("mems")
        fewer_cpus = isinstance(cpus, list) and not set(cpus) >= set(online)
        fewer_mems = isinstance(mems, list) and not set(mems) >= set(node_ids)
        paths = []
        if fewer_cpus and which in ("cpus", "both"):
            paths.append(source.get("path"))
        if fewer_mems and which in ("mems", "both") and source.get("mems_path") not in paths:
            paths.append(source.get("mems_path"))
        if paths:
            named.append(f"{source.get('source')} ({', '.join(str(p) for p in paths)})")
    return named


def allowed_text(cpus, mems) -> str:
    """'CPUs 0-5 and memory nodes 0': how messages name an allowed set."""
    return (
        f"CPUs {format_cpulist(cpus) or 'none'} and memory nodes {format_cpulist(mems) or 'none'}"
    )
