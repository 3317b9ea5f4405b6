# Private to this collection: may change in any release.
"""The memory guard's pure core: read per-node and per-placement memory, decide, render metrics.

One guard round is ``run_round``: ``read_nodes`` + ``read_placements`` (through an injected
``read(path) -> text or None``; nothing else touches the host), ``decide`` (pure: thresholds,
priorities, hysteresis; returns actions as data, the caller writes the files) and
``as_textfile`` (Prometheus text exposition for node_exporter's textfile collector).

Sources (Linux, Documentation/admin-guide/cgroup-v2.rst and filesystems/proc.rst; sysfs ABI
Documentation/ABI/stable/sysfs-devices-node):

- ``/sys/devices/system/node/online``: the node ids (cpulist format).
- ``/sys/devices/system/node/node<N>/meminfo``: lines ``Node <N> <Field>: <value> kB``.
  **used = MemTotal - MemFree - (Active(file) + Inactive(file))**, all kB: the reclaimable
  file pages are the file LRU lists (page cache the kernel can drop or write back). Shmem/tmpfs
  (on the anon LRU), mlocked pages (Unevictable), slab and the hugepage pool (taken out of MemFree
  when reserved, used or not) all count as used: the kernel cannot hand them to a new ordinary
  allocation on that node without swap. ``FilePages`` is not used because it includes shmem and
  the swap cache.
- ``node<N>/hugepages/hugepages-<size>kB/{nr,free}_hugepages``: the pool per size (pages).
- ``node<N>/distance``: the node's distance row (ACPI SLIT: 10 to itself), one value per online
  node in id order; migrate picks the nearest node with room.
- Per placement, its cgroup v2 directory ``<cgroup root>/<slice path>/<unit>`` (systemd nests
  ``a-b.slice`` inside ``a.slice``; see ``slice_path``):
  ``memory.current`` (bytes, this cgroup and its descendants), ``memory.high`` / ``memory.low``
  (bytes or ``max``), ``memory.numa_stat`` (lines ``<type> N0=<bytes> N1=<bytes> ...``, bytes
  per node; added by kernel commit 5f9a4f4a7096 in 2020, present in the guest's 6.1; only
  ``anon`` and ``file`` are used: new types can appear anywhere).
  Hugetlb pages are not in memory.current unless cgroup2 is mounted with
  memory_hugetlb_accounting, and not in numa_stat's anon/file: the off-node share here is of
  anonymous + file (page cache) bytes.
- Acting: ``memory.reclaim`` takes a byte count (Linux >= 5.19; -EAGAIN when less was reclaimed;
  the reclaim cannot be limited to one node: the ``nodes=`` key was reverted before 6.1, so the
  amount asked of a placement is capped at its bytes on the node over the threshold).
  ``memory.high`` is the throttle limit: above it the cgroup's tasks are throttled and reclaimed
  directly, never OOM-killed; writing ``max`` (or the value it had) releases it.
  Mode ``migrate`` moves a placement's pages off the hot node with migrate_pages(2) (the caller,
  ``guard_migrate.migrate_cgroup``); the kernel keeps the task's cpuset, so new allocations go to
  its planned node again: the moved placement is "spilled" (``record_spill`` / ``clear_spills``)
  until the hot node is back under warn - margin and its off-node share under 2 %.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Callable, Optional

from .cpulist import parse_cpulist
from .errors import CpulistError, GuardError

PRIORITIES = ("low", "normal", "high")
_RANK = {"low": 0, "normal": 1, "high": 2}
MODES = ("reclaim", "throttle", "migrate")
ACTIONS = ("reclaim", "throttle", "release", "migrate")
LEVELS = ("ok", "warn", "act")
DEFAULT_SLICE = "numafleet.slice"
DEFAULT_HUGEPAGE_SIZES_KB = (2048, 1048576)
MIB = 1024 * 1024
# Files gone while the guard reads them: a unit stopped (cgroup removed) or no such node.
_GONE = (errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.ENOTDIR)
_MEMINFO_FIELDS = ("MemTotal", "MemFree", "Active(file)", "Inactive(file)")
_NUMA_STAT_TYPES = ("anon", "file")
_REPLAN = "run site.yml to record a new plan (/etc/numafleet/plan.json)"

Reader = Callable[[str], Optional[str]]


def read_path(path: str) -> Optional[str]:
    """Text of the file at ``path``, or None when it does not exist (stopped unit, absent node).

    Raises GuardError naming the path for any other failure (permission, I/O error).
    """
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise GuardError(f"{path}: {exc.strerror or 'cannot be read'}") from None


# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """The guard's settings.

    warn_pct / act_pct: node used ratio (percent, at or above) that warns / acts.
    act_rounds: consecutive rounds at or above act_pct before acting (hysteresis on the way up).
    release_margin_pct: a node's level drops back to ok, and its throttled placements get their
    memory.high back, only below warn_pct - release_margin_pct (hysteresis on the way down).
    max_step_bytes: most bytes the actions of one node ask for in one round (besides the excess
    over act_pct, which always bounds them).
    mode: ``reclaim`` (write memory.reclaim), ``throttle`` (lower memory.high) or ``migrate``
    (move one placement's pages on the hot node to the nearest node with room; see decide).
    min_high_bytes: throttling never sets memory.high below this.
    top_users: how many placements a journal line names per node.
    """

    warn_pct: float = 80.0
    act_pct: float = 90.0
    act_rounds: int = 2
    release_margin_pct: float = 5.0
    max_step_bytes: int = 1024 * MIB
    mode: str = "reclaim"
    min_high_bytes: int = 256 * MIB
    top_users: int = 3


# Setting -> the host variable that carries it, for messages (the others are guard settings
# whose variable names the role will fix).
_VARIABLES = {
    "warn_pct": "numafleet_memory_warn_pct",
    "act_pct": "numafleet_memory_act_pct",
    "mode": "numafleet_memory_act",
}


def _setting_name(key: str) -> str:
    return _VARIABLES.get(key, f"guard setting {key}")


def _number(values: dict, key: str, default, low, high, integer: bool):
    value = values.get(key, default)
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        raise GuardError(
            f"{_setting_name(key)} is {value!r}; set it to {'an integer' if integer else 'a number'}"
            f" from {low} to {high}"
        )
    return value


def parse_thresholds(values: dict) -> Thresholds:
    """Thresholds from ``values`` (keys as Thresholds' fields, absent ones default); raises
    GuardError naming the setting (host variable where one exists) and the fix."""
    if not isinstance(values, dict):
        raise GuardError(f"guard settings are {type(values).__name__}, not a mapping")
    unknown = sorted(set(values) - set(Thresholds.__dataclass_fields__))
    if unknown:
        raise GuardError(
            f"unknown guard setting {unknown[0]!r}; use one of "
            f"{', '.join(sorted(Thresholds.__dataclass_fields__))}"
        )
    base = Thresholds()
    warn = _number(values, "warn_pct", base.warn_pct, 1, 100, False)
    act = _number(values, "act_pct", base.act_pct, 1, 100, False)
    if warn > act:
        raise GuardError(
            f"numafleet_memory_warn_pct ({warn}) is above numafleet_memory_act_pct ({act}); set "
            "the warn threshold to at most the act threshold"
        )
    mode = values.get("mode", base.mode)
    if mode not in MODES:
        raise GuardError(f"{_setting_name('mode')} is {mode!r}; use one of {', '.join(MODES)}")
    return Thresholds(
        warn_pct=float(warn),
        act_pct=float(act),
        act_rounds=_number(values, "act_rounds", base.act_rounds, 1, 1000, True),
        release_margin_pct=float(
            _number(values, "release_margin_pct", base.release_margin_pct, 0, warn, False)
        ),
        max_step_bytes=_number(values, "max_step_bytes", base.max_step_bytes, 1, 1 << 50, True),
        mode=mode,
        min_high_bytes=_number(values, "min_high_bytes", base.min_high_bytes, 0, 1 << 50, True),
        top_users=_number(values, "top_users", base.top_users, 0, 100, True),
    )


# --- the plan's placements -------------------------------------------------------------------


def slice_path(name: str) -> str:
    """The cgroup path of a systemd slice relative to the cgroup root; raises GuardError.

    ``a-b-c.slice`` nests as ``a.slice/a-b.slice/a-b-c.slice`` (systemd.slice(5)); escaped
    dashes (``\\x2d``) do not split. ``-.slice`` is the root (``""``).
    """
    if name == "-.slice":
        return ""
    stem = name[: -len(".slice")] if name.endswith(".slice") else ""
    parts = stem.split("-")
    if not stem or "" in parts or "/" in name or "\0" in name:
        raise GuardError(
            f"slice {name!r} is not a systemd slice name (<name>[-<name>...].slice, no empty "
            f"part, no '/'); {_REPLAN}"
        )
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


@dataclass(frozen=True)
class PlacementSpec:
    """What the guard needs of a plan placement: where its cgroup is and where it should live."""

    name: str
    unit: str
    slice: str
    mems: tuple
    memory_kb: int
    priority: str

    @property
    def cgroup(self) -> str:
        """Its cgroup directory relative to the cgroup v2 root."""
        parent = slice_path(self.slice)
        return f"{parent}/{self.unit}" if parent else self.unit


def _field(entry: dict, key: str, kinds: tuple, where: str, default=None):
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise GuardError(f"{where}.{key} is {value!r}; {_REPLAN}")
    return value


def parse_placements(plan: dict) -> tuple:
    """PlacementSpec per ``plan['placements']`` entry, sorted by name; raises GuardError.

    Keys read: name, unit, slice (default numafleet.slice), mems (node ids), memory_kb (absent
    or null: 0), priority (absent: normal; high, normal or low).
    """
    entries = plan.get("placements") if isinstance(plan, dict) else None
    if not isinstance(entries, list):
        raise GuardError(f"the plan has no placements list; {_REPLAN}")
    specs, seen = [], set()
    for index, entry in enumerate(entries):
        where = f"plan placements[{index}]"
        if not isinstance(entry, dict):
            raise GuardError(f"{where} is not a mapping; {_REPLAN}")
        name = _field(entry, "name", (str,), where)
        where = f"plan placement {name!r}"
        unit = _field(entry, "unit", (str,), where)
        if not unit or "/" in unit or "\0" in unit or unit in (".", ".."):
            raise GuardError(f"{where}.unit is {unit!r}, not a unit name; {_REPLAN}")
        slice_name = _field(entry, "slice", (str,), where, DEFAULT_SLICE)
        slice_path(slice_name)
        mems = _field(entry, "mems", (list, tuple), where)
        if not mems or any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in mems):
            raise GuardError(f"{where}.mems is {mems!r}, not a list of node ids; {_REPLAN}")
        memory_kb = entry.get("memory_kb") or 0
        if isinstance(memory_kb, bool) or not isinstance(memory_kb, int) or memory_kb < 0:
            raise GuardError(f"{where}.memory_kb is {memory_kb!r}; {_REPLAN}")
        priority = entry.get("priority", "normal")
        if priority not in PRIORITIES:
            raise GuardError(
                f"{where}.priority is {priority!r}; use one of {', '.join(PRIORITIES)} and "
                f"{_REPLAN}"
            )
        if name in seen:
            raise GuardError(f"the plan has two placements named {name!r}; {_REPLAN}")
        seen.add(name)
        specs.append(
            PlacementSpec(name, unit, slice_name, tuple(sorted(set(mems))), memory_kb, priority)
        )
    return tuple(sorted(specs, key=lambda s: s.name))


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HugePool:
    """A node's hugepage pool of one size, in pages (nr_hugepages, free_hugepages)."""

    size_kb: int
    total: int
    free: int


@dataclass(frozen=True)
class NodeMemory:
    """One NUMA node's memory (kB, from node<N>/meminfo) and hugepage pools."""

    id: int
    total_kb: int
    free_kb: int
    file_kb: int
    hugepages: tuple = ()
    distances: tuple = ()  # ((node, distance), ...) from node<N>/distance; () when unknown

    def distance_to(self, other: int) -> int:
        """The SLIT distance to node ``other``; 255 (unreachable/unknown) when not known."""
        return dict(self.distances).get(other, 255)

    @property
    def used_kb(self) -> int:
        """MemTotal - MemFree - (Active(file) + Inactive(file)), never below 0."""
        return max(self.total_kb - self.free_kb - self.file_kb, 0)

    @property
    def used_ratio(self) -> Optional[float]:
        """used_kb / total_kb (0-1); None for a node without memory."""
        return self.used_kb / self.total_kb if self.total_kb else None


def parse_node_meminfo(text: str) -> dict:
    """{MemTotal, MemFree, Active(file), Inactive(file): kB} of a node<N>/meminfo text.

    Raises ValueError when one of them is missing or not a number.
    """
    found: dict = {}
    for line in text.splitlines():
        parts = line.split()
        # "Node 1 MemTotal:        2015616 kB"
        if len(parts) >= 4 and parts[2][:-1] in _MEMINFO_FIELDS and parts[2][-1:] == ":":
            if not parts[3].isdigit():
                raise ValueError(f"{parts[2]} is {parts[3]!r}, not a number of kB")
            found[parts[2][:-1]] = int(parts[3])
    missing = [f for f in _MEMINFO_FIELDS if f not in found]
    if missing:
        raise ValueError(f"no {missing[0]} line")
    return found


def parse_distance_row(text: str, ids: list) -> tuple:
    """((node, distance), ...) of a node<N>/distance text whose values follow the online ``ids``.

    Raises ValueError when a value is not a number or the row does not have one per node.
    """
    values = text.replace("\0", "").split()
    if not all(v.isascii() and v.isdigit() for v in values):
        raise ValueError(f"{text.strip()[:40]!r} is not a row of distances")
    if len(values) != len(ids):
        raise ValueError(f"{len(values)} distances for {len(ids)} online nodes")
    return tuple(zip(ids, (int(v) for v in values)))


def _count(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    text = text.replace("\0", "").strip()
    if not text.isdigit():
        raise ValueError(f"{text[:40]!r} is not a count")
    return int(text)


def read_nodes(
    read: Reader,
    sysfs_root: str = "/sys",
    hugepage_sizes_kb: tuple = DEFAULT_HUGEPAGE_SIZES_KB,
) -> tuple:
    """(NodeMemory per online node sorted by id, warnings [{path, reason}]).

    A node whose meminfo is absent or malformed is left out with a warning; a missing hugepage
    size or distance row is left out silently, a malformed distance row with a warning (the
    node's distances are then unknown). Raises GuardError only from ``read``.
    """
    base = f"{sysfs_root}/devices/system/node"
    warnings: list = []
    online_path = f"{base}/online"
    online = read(online_path)
    if online is None:
        warnings.append({"path": online_path, "reason": "absent: the kernel shows no NUMA nodes"})
        return (), warnings
    try:
        ids = parse_cpulist(online)
    except CpulistError as exc:
        warnings.append({"path": online_path, "reason": str(exc)})
        return (), warnings
    nodes = []
    for node_id in ids:
        path = f"{base}/node{node_id}/meminfo"
        text = read(path)
        if text is None:
            warnings.append({"path": path, "reason": "absent"})
            continue
        try:
            info = parse_node_meminfo(text)
        except ValueError as exc:
            warnings.append({"path": path, "reason": str(exc)})
            continue
        pools = []
        for size_kb in hugepage_sizes_kb:
            pool = f"{base}/node{node_id}/hugepages/hugepages-{size_kb}kB"
            try:
                total = _count(read(f"{pool}/nr_hugepages"))
                free = _count(read(f"{pool}/free_hugepages"))
            except ValueError as exc:
                warnings.append({"path": pool, "reason": str(exc)})
                continue
            if total is not None and free is not None:
                pools.append(HugePool(size_kb, total, free))
        distances: tuple = ()
        distance_path = f"{base}/node{node_id}/distance"
        distance_text = read(distance_path)
        if distance_text is not None:
            try:
                distances = parse_distance_row(distance_text, ids)
            except ValueError as exc:
                warnings.append({"path": distance_path, "reason": str(exc)})
        nodes.append(
            NodeMemory(
                node_id,
                info["MemTotal"],
                info["MemFree"],
                info["Active(file)"] + info["Inactive(file)"],
                tuple(pools),
                distances,
            )
        )
    return tuple(nodes), warnings


@dataclass(frozen=True)
class PlacementMemory:
    """A placement's cgroup as read this round (bytes); running False when it has no cgroup."""

    name: str
    cgroup: str
    running: bool
    current_bytes: Optional[int] = None
    high_bytes: Optional[int] = None  # None: "max" (or not running)
    low_bytes: Optional[int] = None
    anon_by_node: tuple = ()  # ((node, bytes), ...) sorted by node
    file_by_node: tuple = ()

    def bytes_on(self, node: int) -> int:
        """Anonymous + file bytes of the placement on ``node``."""
        return dict(self.anon_by_node).get(node, 0) + dict(self.file_by_node).get(node, 0)

    def bytes_by_node(self) -> dict:
        """{node: anonymous + file bytes}."""
        out: dict = {}
        for table in (self.anon_by_node, self.file_by_node):
            for node, value in table:
                out[node] = out.get(node, 0) + value
        return out

    def offnode_share(self, mems) -> Optional[float]:
        """Share (0-1) of its anon + file bytes on nodes outside ``mems``; None when it has none."""
        by_node = self.bytes_by_node()
        total = sum(by_node.values())
        if not total:
            return None
        return sum(v for node, v in by_node.items() if node not in mems) / total


def parse_numa_stat(text: str) -> dict:
    """{'anon': {node: bytes}, 'file': {node: bytes}} of a cgroup v2 memory.numa_stat text.

    Other types are skipped (new ones appear between releases). Raises ValueError when anon or
    file is missing or a field is not ``N<node>=<bytes>``.
    """
    out: dict = {}
    for line in text.splitlines():
        kind, dummy, rest = line.partition(" ")
        if kind not in _NUMA_STAT_TYPES:
            continue
        table = {}
        for field_text in rest.split():
            key, sep, value = field_text.partition("=")
            if not (sep and key[:1] == "N" and key[1:].isdigit() and value.isdigit()):
                raise ValueError(f"{kind}: {field_text[:40]!r} is not N<node>=<bytes>")
            table[int(key[1:])] = int(value)
        out[kind] = table
    missing = [k for k in _NUMA_STAT_TYPES if k not in out]
    if missing:
        raise ValueError(f"no {missing[0]} line")
    return out


def parse_limit(text: str) -> Optional[int]:
    """Bytes of a memory.high/low/max/current text; None for ``max``; raises ValueError."""
    text = text.strip()
    if text == "max":
        return None
    if not text.isdigit():
        raise ValueError(f"{text[:40]!r} is neither a number of bytes nor max")
    return int(text)


def _pairs(table: dict) -> tuple:
    return tuple(sorted(table.items()))


def read_placement(read: Reader, spec: PlacementSpec, cgroup_root: str) -> tuple:
    """(PlacementMemory, warnings) of one placement; see read_placements."""
    cgroup = spec.cgroup
    base = f"{cgroup_root}/{cgroup}"
    current_text = read(f"{base}/memory.current")
    if current_text is None:
        return PlacementMemory(spec.name, cgroup, False), []
    texts = {"memory.current": current_text}
    for name in ("memory.high", "memory.low", "memory.numa_stat"):
        texts[name] = read(f"{base}/{name}")
        if texts[name] is None:  # stopped between two reads, or no memory controller
            return PlacementMemory(spec.name, cgroup, False), [
                {"path": f"{base}/{name}", "reason": "absent while memory.current exists"}
            ]
    try:
        current = parse_limit(texts["memory.current"])
        high = parse_limit(texts["memory.high"])
        low = parse_limit(texts["memory.low"])
        stat = parse_numa_stat(texts["memory.numa_stat"])
    except ValueError as exc:
        return PlacementMemory(spec.name, cgroup, False), [{"path": base, "reason": str(exc)}]
    return (
        PlacementMemory(
            spec.name,
            cgroup,
            True,
            current,
            high,
            low,
            _pairs(stat["anon"]),
            _pairs(stat["file"]),
        ),
        [],
    )


def read_placements(read: Reader, specs: tuple, cgroup_root: str = "/sys/fs/cgroup") -> tuple:
    """(PlacementMemory per spec in order, warnings [{path, reason}]).

    Reads memory.current, memory.high, memory.low and memory.numa_stat of
    ``<cgroup_root>/<slice path>/<unit>``; a placement without that directory is not running
    (no warning); a malformed file makes it not running with a warning. Raises GuardError only
    from ``read``.
    """
    out, warnings = [], []
    for spec in specs:
        memory, more = read_placement(read, spec, cgroup_root)
        out.append(memory)
        warnings.extend(more)
    return tuple(out), warnings


# --- deciding --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One write the caller makes: ``value`` into ``<cgroup root>/<path>``.

    action: reclaim (memory.reclaim, value = bytes), throttle (memory.high lowered, value =
    bytes), release (memory.high back to ``before`` the first throttle, value = bytes or max)
    or migrate (no file: ``path`` is the cgroup directory, ``value`` the target node id; the
    caller moves the pages of every process in it from ``node`` to that node, see
    guard_migrate.migrate_cgroup).
    amount_bytes: bytes asked to reclaim, by which memory.high went down (0 for release), or
    the placement's anon + file bytes on the hot node (migrate).
    before: the file's value before (memory.high), None for reclaim (write-only file), the hot
    node id for migrate.
    """

    node: int
    action: str
    placement: str
    path: str
    value: str
    amount_bytes: int
    before: Optional[str]
    reason: str

    def as_dict(self) -> dict:
        """JSON-ready form: node, action, placement, path, value, amount_bytes, before, reason."""
        return {
            "node": self.node,
            "action": self.action,
            "placement": self.placement,
            "path": self.path,
            "value": self.value,
            "amount_bytes": self.amount_bytes,
            "before": self.before,
            "reason": self.reason,
        }

    def journal_fields(self) -> dict:
        """Structured journal fields (MESSAGE and NUMAFLEET_*) of the action."""
        return {
            "MESSAGE": f"numafleet-guard: {self.action} {self.placement} on node {self.node}: "
            f"{self.reason}",
            "PRIORITY": "5",
            "NUMAFLEET_ACTION": self.action,
            "NUMAFLEET_PLACEMENT": self.placement,
            "NUMAFLEET_NODE": str(self.node),
            "NUMAFLEET_PATH": self.path,
            "NUMAFLEET_BEFORE": "" if self.before is None else self.before,
            "NUMAFLEET_AFTER": self.value,
            "NUMAFLEET_AMOUNT_BYTES": str(self.amount_bytes),
        }


@dataclass(frozen=True)
class Event:
    """A node's level changed (ok, warn, act): one journal line with the top users."""

    node: int
    level: str
    previous: str
    ratio: float
    top_users: tuple  # ((placement, bytes on the node), ...), largest first

    def journal_fields(self) -> dict:
        """Structured journal fields: MESSAGE, PRIORITY (4 warning, 5 notice) and NUMAFLEET_*."""
        users = ",".join(f"{name}={value}" for name, value in self.top_users)
        verb = {"ok": "back below the warn threshold", "warn": "over the warn threshold"}.get(
            self.level, "over the act threshold"
        )
        return {
            "MESSAGE": f"numafleet-guard: NUMA node {self.node} memory {self.ratio:.1%} used, "
            f"{verb}" + (f"; top users (bytes on the node): {users}" if users else ""),
            "PRIORITY": "5" if self.level == "ok" else "4",
            "NUMAFLEET_NODE": str(self.node),
            "NUMAFLEET_LEVEL": self.level,
            "NUMAFLEET_PREVIOUS_LEVEL": self.previous,
            "NUMAFLEET_RATIO": f"{self.ratio:.4f}",
            "NUMAFLEET_TOP_USERS": users,
        }


@dataclass(frozen=True)
class GuardState:
    """What the guard carries from round to round (the caller keeps it, e.g. in /run).

    over_rounds: {node: consecutive rounds at or above act_pct}.
    levels: {node: ok | warn | act} as last reported.
    throttled: {placement: (node, memory.high before the first throttle, None for max)}.
    actions_total: {(node, action, placement): count} since the guard started.
    failures_total: {(node, action, placement): count} of actions whose write failed (the
    program that applies the actions keeps it; decide leaves it out of its next state).
    """

    over_rounds: tuple = ()
    levels: tuple = ()
    throttled: tuple = ()
    actions_total: tuple = ()
    failures_total: tuple = ()

    def as_dict(self) -> dict:
        """JSON-ready form (see parse_state)."""
        return {
            "over_rounds": {str(n): c for n, c in self.over_rounds},
            "levels": {str(n): level for n, level in self.levels},
            "throttled": {name: {"node": n, "high_before": h} for name, (n, h) in self.throttled},
            "actions_total": [
                {"node": n, "action": a, "placement": p, "count": c}
                for (n, a, p), c in self.actions_total
            ],
            "failures_total": [
                {"node": n, "action": a, "placement": p, "count": c}
                for (n, a, p), c in self.failures_total
            ],
        }


def parse_state(data) -> GuardState:
    """GuardState from as_dict()'s form; raises GuardError (the caller starts afresh)."""
    try:
        over = tuple(sorted((int(n), int(c)) for n, c in data["over_rounds"].items()))
        levels = tuple(sorted((int(n), str(v)) for n, v in data["levels"].items()))
        throttled = tuple(
            sorted(
                (
                    str(name),
                    (int(v["node"]), None if v["high_before"] is None else int(v["high_before"])),
                )
                for name, v in data["throttled"].items()
            )
        )
        totals = tuple(
            sorted(
                ((int(e["node"]), str(e["action"]), str(e["placement"])), int(e["count"]))
                for e in data["actions_total"]
            )
        )
        failures = tuple(
            sorted(
                ((int(e["node"]), str(e["action"]), str(e["placement"])), int(e["count"]))
                for e in data.get("failures_total", ())
            )
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GuardError(
            f"the guard's saved state does not parse ({type(exc).__name__}: {exc}); it is "
            "discarded and the guard starts afresh"
        ) from None
    if any(level not in LEVELS for dummy, level in levels):
        raise GuardError("the guard's saved state has an unknown level; it starts afresh")
    return GuardState(over, levels, throttled, totals, failures)


@dataclass(frozen=True)
class Decision:
    """decide()'s result: the writes to make, the journal events and the next state."""

    actions: tuple
    events: tuple
    state: GuardState


def _level(pct: float, previous: str, t: Thresholds) -> str:
    if pct >= t.act_pct:
        return "act"
    if pct >= t.warn_pct:
        return "warn"
    if pct < t.warn_pct - t.release_margin_pct:
        return "ok"
    return "ok" if previous == "ok" else "warn"


def _limit_text(value: Optional[int]) -> str:
    return "max" if value is None else str(value)


def decide(
    nodes: tuple,
    placements: tuple,
    specs: tuple,
    state: GuardState,
    thresholds: Thresholds,
    reclaim_available: bool = True,
    reclaim_blocked: str = "",
) -> Decision:
    """Actions, events and the next state of one round; pure.

    Per node with memory: level ok / warn / act from its used ratio (an event when it changes;
    back to ok only below warn_pct - release_margin_pct). At or above act_pct for act_rounds
    consecutive rounds, the node's running non-high placements with bytes on it are acted on,
    low before normal, then most bytes on the node first; each asks for at most its bytes on the
    node, and all of one node's actions for at most min(excess over act_pct, max_step_bytes)
    bytes. ``high`` placements are never acted on. Mode reclaim (throttle when
    ``reclaim_available`` is false: a kernel before 5.19, or a host without free swap, where
    reclaim cannot lower the used ratio; ``reclaim_blocked`` says which, in the throttle's reason)
    or throttle (memory.high lowered, never below min_high_bytes). Below
    warn_pct - release_margin_pct a node's throttled placements get their memory.high back
    (release). A placement gets at most one action per round.

    Mode migrate: per acting node at most one placement (the first candidate in the order above
    for which a target exists) has all its bytes on the node moved at once (not bounded by
    max_step_bytes) to a target: the nearest other node by node<N>/distance (then lowest id)
    whose used bytes, plus what this round already moves there, plus the placement's bytes stay
    below warn_pct. When no candidate fits anywhere the node falls back to reclaim (throttle
    when ``reclaim_available`` is false) as above.
    """
    t = thresholds
    by_spec = {s.name: s for s in specs}
    over_prev, levels_prev = dict(state.over_rounds), dict(state.levels)
    throttled, totals = dict(state.throttled), dict(state.actions_total)
    over_next, levels_next = {}, {}
    actions, events, acted = [], [], set()
    running = [m for m in placements if m.running and m.name in by_spec]
    incoming: dict = {}  # node id -> bytes this round's migrate actions move there

    def count(node: int, kind: str, name: str) -> None:
        key = (node, kind, name)
        totals[key] = totals.get(key, 0) + 1

    for node in sorted(nodes, key=lambda n: n.id):
        ratio = node.used_ratio
        if ratio is None:
            continue
        pct = ratio * 100.0
        over = over_prev.get(node.id, 0) + 1 if pct >= t.act_pct else 0
        over_next[node.id] = over
        previous = levels_prev.get(node.id, "ok")
        level = _level(pct, previous, t)
        levels_next[node.id] = level
        users = sorted(
            ((m.name, m.bytes_on(node.id)) for m in running if m.bytes_on(node.id) > 0),
            key=lambda pair: (-pair[1], pair[0]),
        )
        if level != previous:
            events.append(Event(node.id, level, previous, ratio, tuple(users[: t.top_users])))
        if pct < t.warn_pct - t.release_margin_pct:
            mine = sorted(name for name, (n, dummy) in throttled.items() if n == node.id)
            current = {m.name: m for m in placements}
            for name in mine:
                high_before = throttled.pop(name)[1]
                memory = current.get(name)
                if memory is None or not memory.running or name in acted:
                    continue  # stopped: its next start brings the unit's own MemoryHigh=
                acted.add(name)
                actions.append(
                    Action(
                        node.id,
                        "release",
                        name,
                        f"{memory.cgroup}/memory.high",
                        _limit_text(high_before),
                        0,
                        _limit_text(memory.high_bytes),
                        f"node {node.id} at {ratio:.1%}, below "
                        f"{t.warn_pct - t.release_margin_pct:g}%: memory.high restored",
                    )
                )
                count(node.id, "release", name)
        if over < t.act_rounds:
            continue
        total_bytes, used_bytes = node.total_kb * 1024, node.used_kb * 1024
        excess = max(used_bytes - int(total_bytes * t.act_pct / 100.0), 1)
        budget = min(excess, t.max_step_bytes)
        candidates = sorted(
            (
                m
                for m in running
                if by_spec[m.name].priority != "high"
                and m.bytes_on(node.id) > 0
                and m.name not in acted
            ),
            key=lambda m: (_RANK[by_spec[m.name].priority], -m.bytes_on(node.id), m.name),
        )
        mode = t.mode if reclaim_available or t.mode != "reclaim" else "throttle"
        fallback = ""
        if mode == "migrate":
            chosen = _migrate_choice(node, candidates, nodes, incoming, t)
            if chosen is not None:
                memory, target = chosen
                amount = memory.bytes_on(node.id)
                incoming[target.id] = incoming.get(target.id, 0) + amount
                after = (target.used_kb * 1024 + incoming[target.id]) / (target.total_kb * 1024)
                action = Action(
                    node.id,
                    "migrate",
                    memory.name,
                    memory.cgroup,
                    str(target.id),
                    amount,
                    str(node.id),
                    f"node {node.id} at {ratio:.1%} for {over} rounds (act at {t.act_pct:g}%), "
                    f"{by_spec[memory.name].priority} priority, {amount} bytes on the node moved "
                    f"to node {target.id} (distance {node.distance_to(target.id)}, "
                    f"{after:.1%} used after the move, warn at {t.warn_pct:g}%)",
                )
                acted.add(memory.name)
                actions.append(action)
                count(node.id, "migrate", memory.name)
                continue
            mode = "reclaim" if reclaim_available else "throttle"  # no node has room
            fallback = "no node has room to take it below warn"
        for memory in candidates:
            if budget <= 0:
                break
            amount = min(budget, memory.bytes_on(node.id))
            why = (
                f"node {node.id} at {ratio:.1%} for {over} rounds (act at {t.act_pct:g}%), "
                f"{by_spec[memory.name].priority} priority, {memory.bytes_on(node.id)} bytes "
                "on the node"
            )
            if fallback:
                why += f"; {fallback}"
            if mode == "throttle" and t.mode != "throttle":
                why += "; throttled, not reclaimed: " + (
                    reclaim_blocked or "this kernel has no memory.reclaim (Linux before 5.19)"
                )
            if mode == "reclaim":
                action = Action(
                    node.id,
                    "reclaim",
                    memory.name,
                    f"{memory.cgroup}/memory.reclaim",
                    str(amount),
                    amount,
                    None,
                    why,
                )
            else:
                base = memory.current_bytes or 0
                if memory.high_bytes is not None:
                    base = min(base, memory.high_bytes)
                new_high = max(base - amount, t.min_high_bytes)
                amount = base - new_high
                if amount <= 0:
                    continue  # at or under the floor already: nothing to take from it
                action = Action(
                    node.id,
                    "throttle",
                    memory.name,
                    f"{memory.cgroup}/memory.high",
                    str(new_high),
                    amount,
                    _limit_text(memory.high_bytes),
                    why,
                )
                if memory.name not in throttled:
                    throttled[memory.name] = (node.id, memory.high_bytes)
            acted.add(memory.name)
            actions.append(action)
            count(node.id, action.action, memory.name)
            budget -= amount
    next_state = GuardState(
        tuple(sorted(over_next.items())),
        tuple(sorted(levels_next.items())),
        tuple(sorted(throttled.items())),
        tuple(sorted(totals.items())),
    )
    return Decision(tuple(actions), tuple(events), next_state)


def _fits(target: NodeMemory, moved_bytes: int, warn_pct: float) -> bool:
    """True when ``target`` stays below warn_pct with ``moved_bytes`` more used."""
    total = target.total_kb * 1024
    return total > 0 and (target.used_kb * 1024 + moved_bytes) * 100.0 < warn_pct * total


def _migrate_choice(
    hot: NodeMemory, candidates: list, nodes: tuple, incoming: dict, t: Thresholds
) -> Optional[tuple]:
    """(placement, target node) of the first candidate that fits on a node, nearest first."""
    targets = sorted(
        (n for n in nodes if n.id != hot.id and n.total_kb > 0),
        key=lambda n: (hot.distance_to(n.id), n.id),
    )
    for memory in candidates:
        amount = memory.bytes_on(hot.id)
        for target in targets:
            if _fits(target, incoming.get(target.id, 0) + amount, t.warn_pct):
                return memory, target
    return None


# --- spilled placements (mode migrate) -------------------------------------------------------

SPILL_CLEAR_SHARE = 0.02  # a spill ends when the placement's off-node share is below this


def parse_spilled(data) -> dict:
    """The state file's ``spilled`` map, checked: {placement: {from: [node], to: [node], since:
    epoch s (float), bytes: int}}; None or absent -> {}. Raises GuardError (start afresh)."""
    if data is None:
        return {}
    out: dict = {}
    try:
        for name, entry in data.items():
            record = {
                "from": sorted({int(n) for n in entry["from"]}),
                "to": sorted({int(n) for n in entry["to"]}),
                "since": float(entry["since"]),
                "bytes": int(entry["bytes"]),
            }
            if not isinstance(name, str) or not record["from"] or not record["to"]:
                raise ValueError(f"{name!r} has no from/to nodes")
            out[name] = record
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GuardError(
            f"the guard's saved spilled placements do not parse ({type(exc).__name__}: {exc}); "
            "they are discarded and the guard starts afresh"
        ) from None
    return out


def record_spill(spilled: dict, action: Action, now: float) -> dict:
    """``spilled`` (parse_spilled's form) with a migrate ``action`` that took effect added.

    A placement spilled again keeps its first ``since``; its nodes are merged and bytes added.
    Raises GuardError for an action that is not a migrate.
    """
    if action.action != "migrate":
        raise GuardError(f"record_spill takes a migrate action, not {action.action!r}")
    out = {name: dict(record) for name, record in spilled.items()}
    old = out.get(action.placement)
    target = int(action.value)
    if old is None:
        out[action.placement] = {
            "from": [action.node],
            "to": [target],
            "since": float(now),
            "bytes": action.amount_bytes,
        }
    else:
        old["from"] = sorted(set(old["from"]) | {action.node})
        old["to"] = sorted(set(old["to"]) | {target})
        old["bytes"] = old["bytes"] + action.amount_bytes
    return out


def clear_spills(
    spilled: dict, nodes: tuple, placements: tuple, thresholds: Thresholds, specs: tuple = ()
) -> dict:
    """``spilled`` without the placements whose spill is over; pure.

    A spill is over when the placement is stopped or gone (its next start allocates on its
    planned nodes), or when every node it was moved from is below warn_pct -
    release_margin_pct AND its off-node share (of anon + file bytes, outside its planned
    ``mems`` from ``specs``, else outside the nodes it was moved from) is under 2 %.
    """
    t = thresholds
    by_name = {m.name: m for m in placements}
    by_node = {n.id: n for n in nodes}
    mems = {s.name: s.mems for s in specs}
    out = {}
    for name, record in spilled.items():
        memory = by_name.get(name)
        if memory is None or not memory.running:
            continue
        calm = all(
            by_node.get(n) is not None
            and by_node[n].used_ratio is not None
            and by_node[n].used_ratio * 100.0 < t.warn_pct - t.release_margin_pct
            for n in record["from"]
        )
        share = memory.offnode_share(mems.get(name, tuple(record["from"])))
        if calm and (share is None or share < SPILL_CLEAR_SHARE):
            continue
        out[name] = dict(record)
    return out


# --- metrics ---------------------------------------------------------------------------------

METRICS = (
    (
        "numafleet_node_memory_used_ratio",
        "gauge",
        "Used / total memory of a NUMA node (0-1); used = MemTotal - MemFree - file LRU pages",
    ),
    (
        "numafleet_placement_offnode_share_ratio",
        "gauge",
        "Share of a placement's anonymous and file bytes (cgroup memory.numa_stat) on nodes "
        "outside its planned mems (0-1)",
    ),
    (
        "numafleet_guard_actions_total",
        "counter",
        "Actions of the memory guard since it started, by node, action and placement",
    ),
    (
        "numafleet_guard_action_failures_total",
        "counter",
        "Actions of the memory guard whose write failed, by node, action and placement",
    ),
    (
        "numafleet_guard_last_run_timestamp_seconds",
        "gauge",
        "Unix time of the memory guard's last round",
    ),
)


def _label(value) -> str:
    """A label value escaped per the text exposition format (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(number) -> str:
    return repr(float(number))


def as_textfile(
    nodes: tuple, placements: tuple, specs: tuple, state: GuardState, now: float
) -> str:
    """Prometheus text exposition (node_exporter textfile collector) of one round.

    Families (HELP and TYPE, then samples sorted by label): node used ratio {node},
    placement off-node share {placement} (running placements with bytes), actions total and
    action failures total {node, action, placement} (from state) and the last-run timestamp.
    """
    mems = {s.name: s.mems for s in specs}
    samples: dict = {name: [] for name, dummy, dummy2 in METRICS}
    for node in sorted(nodes, key=lambda n: n.id):
        if node.used_ratio is not None:
            samples["numafleet_node_memory_used_ratio"].append(
                (f'node="{node.id}"', node.used_ratio)
            )
    for memory in sorted(placements, key=lambda m: m.name):
        share = memory.offnode_share(mems.get(memory.name, ())) if memory.running else None
        if share is not None:
            samples["numafleet_placement_offnode_share_ratio"].append(
                (f'placement="{_label(memory.name)}"', share)
            )
    for (node_id, action, name), total in state.actions_total:
        samples["numafleet_guard_actions_total"].append(
            (f'node="{node_id}",action="{action}",placement="{_label(name)}"', total)
        )
    for (node_id, action, name), total in state.failures_total:
        samples["numafleet_guard_action_failures_total"].append(
            (f'node="{node_id}",action="{action}",placement="{_label(name)}"', total)
        )
    samples["numafleet_guard_last_run_timestamp_seconds"].append(("", now))
    lines = []
    for name, kind, text in METRICS:
        if not samples[name]:
            continue
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples[name]:
            lines.append(
                f"{name}{{{labels}}} {_value(value)}" if labels else f"{name} {_value(value)}"
            )
    return "\n".join(lines) + "\n"


# --- one round -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """run_round()'s result: what was read, decided and rendered."""

    nodes: tuple
    placements: tuple
    decision: Decision
    warnings: tuple
    textfile: str

    def as_dict(self, specs: tuple) -> dict:
        """JSON-ready report of the round (kB for nodes, bytes for cgroups; node ids as strings).

        Keys: nodes [{id, total_kb, free_kb, file_kb, used_kb, used_ratio, hugepages [{size_kb,
        total, free}], distances {node: distance}}], placements [{name, priority, mems, cgroup, running, current_bytes,
        high_bytes, low_bytes, bytes_by_node, offnode_share}], actions [Action fields],
        events [{node, level, previous, ratio, top_users}], warnings [{path, reason}], state.
        """
        by_spec = {s.name: s for s in specs}
        placements = []
        for memory in self.placements:
            spec = by_spec.get(memory.name)
            mems = spec.mems if spec else ()
            placements.append(
                {
                    "name": memory.name,
                    "priority": spec.priority if spec else None,
                    "mems": list(mems),
                    "cgroup": memory.cgroup,
                    "running": memory.running,
                    "current_bytes": memory.current_bytes,
                    "high_bytes": memory.high_bytes,
                    "low_bytes": memory.low_bytes,
                    "bytes_by_node": {str(n): b for n, b in sorted(memory.bytes_by_node().items())},
                    "offnode_share": memory.offnode_share(mems) if memory.running else None,
                }
            )
        return {
            "nodes": [
                {
                    "id": n.id,
                    "total_kb": n.total_kb,
                    "free_kb": n.free_kb,
                    "file_kb": n.file_kb,
                    "used_kb": n.used_kb,
                    "used_ratio": n.used_ratio,
                    "hugepages": [
                        {"size_kb": p.size_kb, "total": p.total, "free": p.free}
                        for p in n.hugepages
                    ],
                    "distances": {str(other): d for other, d in n.distances},
                }
                for n in self.nodes
            ],
            "placements": placements,
            "actions": [a.as_dict() for a in self.decision.actions],
            "events": [
                {
                    "node": e.node,
                    "level": e.level,
                    "previous": e.previous,
                    "ratio": e.ratio,
                    "top_users": [[name, value] for name, value in e.top_users],
                }
                for e in self.decision.events
            ],
            "warnings": [dict(w) for w in self.warnings],
            "state": self.decision.state.as_dict(),
        }


def run_round(
    read: Reader,
    specs: tuple,
    state: GuardState,
    thresholds: Thresholds,
    now: float,
    sysfs_root: str = "/sys",
    cgroup_root: str = "/sys/fs/cgroup",
    hugepage_sizes_kb: tuple = DEFAULT_HUGEPAGE_SIZES_KB,
    reclaim_available: bool = True,
    reclaim_blocked: str = "",
) -> Round:
    """One guard round: read nodes and placements, decide, render the textfile.

    Raises GuardError only from ``read`` (a file that exists but cannot be read).
    """
    nodes, node_warnings = read_nodes(read, sysfs_root, hugepage_sizes_kb)
    placements, cgroup_warnings = read_placements(read, specs, cgroup_root)
    decision = decide(
        nodes, placements, specs, state, thresholds, reclaim_available, reclaim_blocked
    )
    textfile = as_textfile(nodes, placements, specs, decision.state, now)
    return Round(nodes, placements, decision, tuple(node_warnings + cgroup_warnings), textfile)
