# Private to this collection: may change in any release.
"""Per-placement resource limits (memory_limit, cpu_weight, io_weight, tasks_max) and who a
placement's service runs as.

The placement keys are checked here (``parse_limits``, called by placements.py before the gate),
carried in the plan as the optional entry key ``limits`` (absent: no limit; ``as_plan``), and
rendered into the [Service] section of the placement's unit or drop-in (``service_entries``).
Semantics follow systemd.resource-control(5): MemoryMax= is the cgroup v2 ``memory.max`` (the
kernel's OOM killer acts inside the unit's cgroup above it), MemoryHigh= is ``memory.high``
(allocations above it are throttled and reclaimed, nothing is killed), CPUWeight= and IOWeight=
are ``cpu.weight`` / ``io.weight`` (1-10000, systemd's default 100), TasksMax= is ``pids.max``
(a count, a percentage of the system's limit, or infinity). Hugepages are not charged to
``memory.max`` (cgroup v2 charges them to the separate hugetlb controller unless the cgroup2
file system is mounted with memory_hugetlb_accounting, Linux 6.6+), so the memory limit is the
``memory:`` budget alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .errors import PlacementError, UnitRenderError

MEMORY_LIMITS = ("none", "high", "max")
DEFAULT_MEMORY_LIMIT = "none"
LIMIT_KEYS = ("memory_limit", "cpu_weight", "io_weight", "tasks_max")
WEIGHT_MIN, WEIGHT_MAX = 1, 10000
# The [Service] property each limit renders, in the order they are written.
PROPERTIES = {
    "memory_max_bytes": "MemoryMax",
    "memory_high_bytes": "MemoryHigh",
    "cpu_weight": "CPUWeight",
    "io_weight": "IOWeight",
    "tasks_max": "TasksMax",
}
_PERCENT = re.compile(r"^([0-9]{1,3})%\Z")
_COUNT = re.compile(r"^[1-9][0-9]{0,18}\Z")


@dataclass(frozen=True)
class Limits:
    """A placement's limits: memory_limit (none|high|max), weights (None: systemd's default),
    tasks_max ('64', '25%', 'infinity' or None)."""

    memory_limit: str
    cpu_weight: Optional[int]
    io_weight: Optional[int]
    tasks_max: Optional[str]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _weight(host: str, where: str, key: str, value) -> Optional[int]:
    if value is None:
        return None
    if not _is_int(value) or not WEIGHT_MIN <= value <= WEIGHT_MAX:
        prop = "CPUWeight=" if key == "cpu_weight" else "IOWeight="
        raise PlacementError(
            host,
            f"{where}.{key}: {value!r} is not a weight {WEIGHT_MIN}-{WEIGHT_MAX} ({prop}, "
            "systemd's default is 100); write e.g. 200, or leave it out",
        )
    return value


def _tasks_max(host: str, where: str, value) -> Optional[str]:
    if value is None:
        return None
    text = str(value).strip() if isinstance(value, str) else None
    if _is_int(value) and value >= 1:
        return str(value)
    if text is not None:
        if text.lower() == "infinity":
            return "infinity"
        if _COUNT.match(text):
            return text
        match = _PERCENT.match(text)
        if match and 1 <= int(match.group(1)) <= 100:
            return f"{int(match.group(1))}%"
    raise PlacementError(
        host,
        f"{where}.tasks_max: {value!r} is not a task limit (TasksMax=); write a count >= 1 "
        '(e.g. 512), a percentage 1%-100% of the system\'s limit ("25%"), or infinity',
    )


def parse_limits(host: str, where: str, entry: dict, memory_kb: int) -> Optional[Limits]:
    """The Limits of a placement entry, None when it sets none; raises PlacementError.

    ``where`` names the entry (numafleet_placements[i] (name)); ``memory_kb`` is its parsed
    ``memory:`` (0: not given), which memory_limit high or max needs.
    """
    if not any(key in entry for key in LIMIT_KEYS):
        return None
    memory_limit = entry.get("memory_limit")
    if memory_limit is None:
        memory_limit = DEFAULT_MEMORY_LIMIT
    if not isinstance(memory_limit, str) or memory_limit not in MEMORY_LIMITS:
        raise PlacementError(
            host,
            f"{where}.memory_limit: {memory_limit!r} is not one of {', '.join(MEMORY_LIMITS)}; "
            "write max (MemoryMax=, OOM kill above the budget), high (MemoryHigh=, throttled "
            "above it) or none",
        )
    if memory_limit != "none" and not memory_kb:
        raise PlacementError(
            host,
            f"{where}.memory_limit: {memory_limit} limits the service to its memory budget, and "
            "this placement has no memory:; add memory: (e.g. memory: 64G) or set "
            "memory_limit: none",
        )
    limits = Limits(
        memory_limit,
        _weight(host, where, "cpu_weight", entry.get("cpu_weight")),
        _weight(host, where, "io_weight", entry.get("io_weight")),
        _tasks_max(host, where, entry.get("tasks_max")),
    )
    if limits == Limits(DEFAULT_MEMORY_LIMIT, None, None, None):
        return None
    return limits


def as_plan(limits: Optional[Limits], memory_kb: int) -> Optional[dict]:
    """The plan entry's ``limits`` {memory_max_bytes?, memory_high_bytes?, cpu_weight?,
    io_weight?, tasks_max?} (only the keys set), or None for a placement without limits."""
    if limits is None:
        return None
    out: dict = {}
    if limits.memory_limit == "max":
        out["memory_max_bytes"] = memory_kb * 1024
    elif limits.memory_limit == "high":
        out["memory_high_bytes"] = memory_kb * 1024
    for key in ("cpu_weight", "io_weight", "tasks_max"):
        value = getattr(limits, key)
        if value is not None:
            out[key] = value
    return out or None


def service_entries(placement: dict, where: str) -> list:
    """[(property, value)] of the plan entry's ``limits`` for its [Service] section, in the
    order of PROPERTIES; [] without limits. Raises UnitRenderError for a malformed entry."""
    limits = placement.get("limits")
    if limits is None:
        return []
    if not isinstance(limits, dict) or not set(limits) <= set(PROPERTIES):
        raise UnitRenderError(
            f"{where}.limits is {limits!r}, not a mapping of {', '.join(PROPERTIES)}; plan "
            "again with the numafleet.tuning.numa_plan of the same collection release"
        )
    entries = []
    for key, prop in PROPERTIES.items():
        value = limits.get(key)
        if value is None:
            continue
        if key == "tasks_max":
            ok = isinstance(value, str) and (
                value == "infinity" or _COUNT.match(value) or _PERCENT.match(value)
            )
        else:
            low = 1 if key.endswith("_bytes") else WEIGHT_MIN
            high = None if key.endswith("_bytes") else WEIGHT_MAX
            ok = _is_int(value) and value >= low and (high is None or value <= high)
        if not ok:
            raise UnitRenderError(
                f"{where}.limits.{key} is {value!r}, not a value for {prop}=; plan again with "
                "the numafleet.tuning.numa_plan of the same collection release"
            )
        entries.append((prop, str(value)))
    return entries


def runs_as(entry: dict) -> Optional[str]:
    """Who a plan entry's service runs as: its user, 'root' for an exec placement without
    user (no User= line: systemd's default), None for a drop-in (the pinned unit decides)."""
    if entry.get("unit_kind") == "dropin":
        return None
    return entry.get("user") or "root"


def root_warning(entry: dict) -> Optional[str]:
    """The plan warning of an exec placement that runs as root, else None."""
    if runs_as(entry) != "root":
        return None
    return (
        f"{entry.get('unit')} runs as root (no user:): set user: to the account the service "
        "should run as"
    )


def add_to_entry(entry: dict, limits: Optional[Limits], memory_kb: int) -> dict:
    """``entry`` (a plan placement) with its ``limits`` key (only when it has limits, so plans
    without limits stay as before) and the runs-as-root warning; returns the same dict."""
    planned = as_plan(limits, memory_kb)
    if planned is not None:
        entry["limits"] = planned
    warning = root_warning(entry)
    if warning is not None:
        entry["warnings"].append(warning)
    return entry


def _shown(limits: Optional[dict], key: str) -> str:
    value = (limits or {}).get(key)
    return "(none)" if value is None else str(value)


def restarted_pairs(old_plan: Optional[dict], new_plan: dict, restarted):
    """(unit, recorded entry, new entry) of each placement unit in ``restarted`` that the
    recorded plan has too (a new unit has nothing to compare), in the new plan's order."""
    old_by = {
        entry.get("unit"): entry
        for entry in (old_plan or {}).get("placements") or ()
        if isinstance(entry, dict)
    }
    for entry in new_plan.get("placements") or ():
        unit = entry.get("unit")
        old = old_by.get(unit)
        if unit in restarted and old is not None:
            yield unit, old, entry


def restart_reasons(old_plan: Optional[dict], new_plan: dict, restarted) -> dict:
    """{unit: why} for each placement unit in ``restarted`` whose limits change between the
    recorded and the new plan: 'its limits change: MemoryMax 536870912 -> (none)'. A unit
    without a recorded entry (new) has none."""
    reasons = {}
    for unit, old, entry in restarted_pairs(old_plan, new_plan, restarted):
        before, after = old.get("limits"), entry.get("limits")
        parts = [
            f"{prop} {_shown(before, key)} -> {_shown(after, key)}"
            for key, prop in PROPERTIES.items()
            if _shown(before, key) != _shown(after, key)
        ]
        if parts:
            reasons[unit] = "its limits change: " + ", ".join(parts)
    return reasons
