# Private to this collection: may change in any release.
"""Placement priorities (``priority: high | normal | low``): parsing, the plan key, what the
units render from it, and why a priority change restarts a unit. Pure, no I/O.

A placement without ``priority`` takes its tenant's, else ``normal`` (``DEFAULT_PRIORITY``).
The plan carries the key ``priority`` only where it is not normal (``add_to_entry``), so plans
of hosts that set no priority stay as they were; readers take a missing key as normal
(``of_entry``). An MPS daemon entry carries the highest priority of its clients (``highest``).

What it renders (systemd.resource-control(5), the kernel's Documentation/admin-guide/cgroup-v2.rst):
a ``high`` placement's unit gets ``MemoryLow=`` equal to its memory budget in bytes
(``memory_kb * 1024``; hugepages are not charged to ``memory.current``, so they are not part of
it): cgroup v2 ``memory.low``, best-effort protection from reclaim while other cgroups still
have reclaimable memory. A cgroup's effective ``memory.low`` is limited by the ``memory.low``
of every ancestor, and the ``memory_recursiveprot`` mount option (Linux 5.7+, systemd v247+)
only shares an ancestor's protection that its children did not claim: an ancestor at 0 has
none to share. So every slice between the unit and the root slice carries the sum of the
budgets of the high placements under it (``slice_memory_low``): the tenant slice
``numafleet-<tenant>.slice`` and ``numafleet.slice`` above it (the root slice ``-.slice`` is
exempt). ``normal`` and ``low`` render nothing; the runtime memory guard throttles and reclaims
``low`` placements first and never touches ``high`` ones.
"""

from __future__ import annotations

from typing import Optional

from .errors import PlacementError, UnitRenderError
from .limits import restarted_pairs

PRIORITIES = ("high", "normal", "low")
DEFAULT_PRIORITY = "normal"
# Order of precedence: the guard acts on the lowest first; an MPS daemon takes the highest.
RANK = {"low": 0, "normal": 1, "high": 2}
# The slice every placement slice sits under (numafleet-<tenant>.slice is its child).
TOP_SLICE = "numafleet.slice"
_REPLAN = "plan again with the numafleet.tuning.numa_plan of the same collection release"


def parse_priority(host: str, where: str, value) -> Optional[str]:
    """The ``priority`` of a placement or tenant entry, None when not set; raises PlacementError.

    ``where`` names the entry (``numafleet_placements[0] (llm)``, ``numafleet_tenants[1] (a)``).
    """
    if value is None:
        return None
    if value.__class__ is str and value in PRIORITIES:
        return value
    raise PlacementError(
        host,
        f"{where}.priority: {value!r} is not a priority; write one of high, normal, low "
        f"(default {DEFAULT_PRIORITY}: high protects the placement's memory budget from reclaim "
        "(MemoryLow=), low is throttled first when its memory node runs short)",
    )


def resolve(own: Optional[str], tenant: Optional[str]) -> str:
    """A placement's priority: its own, else its tenant's, else DEFAULT_PRIORITY."""
    if own is not None:
        return own
    return tenant if tenant is not None else DEFAULT_PRIORITY


def highest(priorities) -> str:
    """The highest of ``priorities`` (names of PRIORITIES); DEFAULT_PRIORITY for none."""
    best = None
    for value in priorities:
        if best is None or RANK[value] > RANK[best]:
            best = value
    return DEFAULT_PRIORITY if best is None else best


def of_entry(entry: dict, where: str) -> str:
    """The priority of a plan entry (placement or MPS daemon): its ``priority``, normal when
    absent; raises UnitRenderError for a value that is not one of PRIORITIES."""
    value = entry.get("priority", DEFAULT_PRIORITY)
    if value.__class__ is not str or value not in PRIORITIES:
        raise UnitRenderError(
            f"{where}.priority is {value!r}, not one of {', '.join(PRIORITIES)}; {_REPLAN}"
        )
    return value


def add_to_entry(entry: dict, priority: str) -> dict:
    """``entry`` with the key ``priority`` when it is not DEFAULT_PRIORITY (so plans without
    priorities stay as they were); returns the same dict."""
    if priority != DEFAULT_PRIORITY:
        entry["priority"] = priority
    return entry


def memory_low_bytes(entry: dict, where: str) -> Optional[int]:
    """MemoryLow= of a plan placement: its memory budget in bytes (``memory_kb`` * 1024) when
    it is high and has a budget, else None; raises UnitRenderError for a malformed entry."""
    if of_entry(entry, where) != "high":
        return None
    memory_kb = entry.get("memory_kb")
    if memory_kb.__class__ is not int or memory_kb < 0:
        raise UnitRenderError(f"{where}.memory_kb is {memory_kb!r}, not a size in kB; {_REPLAN}")
    return memory_kb * 1024 if memory_kb else None


def service_entries(entry: dict, where: str) -> list:
    """[("MemoryLow", bytes)] for a high placement with a memory budget, else []."""
    low = memory_low_bytes(entry, where)
    return [] if low is None else [("MemoryLow", str(low))]


def slice_memory_low(placements: list) -> dict:
    """{slice unit: MemoryLow= bytes} of the slices above high placements: each placement's
    slice and numafleet.slice (the parent of every tenant slice) get the sum of the budgets of
    the high placements under them; slices without one are left out."""
    sums: dict = {}
    for index, entry in enumerate(placements):
        if not isinstance(entry, dict):
            continue
        low = memory_low_bytes(entry, f"plan placements[{index}]")
        if low is None:
            continue
        slices = [TOP_SLICE]
        if isinstance(entry.get("slice"), str) and entry["slice"] != TOP_SLICE:
            slices.append(entry["slice"])
        for name in slices:
            sums[name] = sums.get(name, 0) + low
    return sums


def warning(name: str, priority: str, memory_kb: int) -> Optional[str]:
    """The plan warning of a high placement without a memory budget (nothing to protect)."""
    if priority != "high" or memory_kb:
        return None
    return (
        f"{name} is priority high but has no memory: budget, so no MemoryLow= protects its "
        "memory from reclaim (the memory guard still never throttles it); add memory:"
    )


def _shown(entry: Optional[dict]) -> str:
    value = (entry or {}).get("priority", DEFAULT_PRIORITY)
    return value if isinstance(value, str) else repr(value)


def restart_reasons(old_plan: Optional[dict], new_plan: dict, restarted) -> dict:
    """{unit: why} for each placement unit in ``restarted`` whose priority changes between the
    recorded and the new plan: 'its priority changes: normal -> high (MemoryLow=68719476736)'.
    A unit without a recorded entry (new) has none."""
    reasons = {}
    for unit, old, entry in restarted_pairs(old_plan, new_plan, restarted):
        before, after = _shown(old), _shown(entry)
        if before == after:
            continue
        low = entry.get("memory_kb") if after == "high" else None
        if isinstance(low, int) and low > 0:
            what = f"MemoryLow={low * 1024}"
        elif before == "high":
            what = "no MemoryLow="
        else:
            what = "the memory guard's order"
        reasons[unit] = f"its priority changes: {before} -> {after} ({what})"
    return reasons
