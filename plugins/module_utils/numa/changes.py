# Private to this collection: may change in any release.
"""The change plan of one host: what an apply will add, move, remove, start, restart and stop.

change_plan() runs on the controller after planning and before any host is changed. It compares
the plan recorded by the last apply (ansible_facts.numafleet_recorded.plan) with the new plan,
and the digests of the files the last apply wrote (ansible_facts.numafleet_recorded.files) with
the files the new plan renders (units.render_files, mps.render_files), so it names exactly the
units whose files change. It adds what systemd does by itself: a unit that is restarted or
stopped takes with it every unit whose files say Requires=, BindsTo= or PartOf= on it
(systemd.unit(5)), transitively. It lists the MIG layout changes and the AMD partition changes
(plan.amd_partitions) with the units the amd layer stops and starts around them. It also guards
the blast radius: removing every managed unit of a host, or more than max_removals, is refused
unless allowed. Pure: no I/O.
"""

from __future__ import annotations

from typing import Callable, Optional

from . import limits, mps, priority, units
from .cpulist import format_cpulist
from .partition import is_manager_file
from .planner import placement_text, waits_text
from .recorded import MANIFEST_PATHS, digest
from .units import unit_of

# systemd.unit(5): a unit listing one of these on X is stopped or restarted with X.
PROPAGATING = ("Requires", "BindsTo", "PartOf")


def file_changes(desired: dict, recorded: dict, owned) -> list:
    """units.plan_changes on digests: desired texts against the recorded digests of owned files.

    recorded maps a host path to the sha256 digest read there (None: absent); the FileChanges
    carry digests, not texts.
    """
    wanted = {path: digest(text) for path, text in desired.items()}
    return units.plan_changes(recorded, wanted, owned)


def dependents(texts: dict) -> dict:
    """{unit: sorted [(dependent unit, key)]} from the Requires=/BindsTo=/PartOf= of unit files.

    texts maps a unit file or drop-in path to its text; every assignment of the keys counts
    (values are space-separated unit names).
    """
    found: dict = {}
    for path, text in texts.items():
        owner = unit_of(path)
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if not sep or key.strip() not in PROPAGATING:
                continue
            for target in value.split():
                found.setdefault(target, set()).add((owner, key.strip()))
    return {unit: sorted(pairs) for unit, pairs in found.items()}


def _propagate(seeds: list, deps: dict, skip: set) -> dict:
    """{unit: (cause unit, key)} of every unit systemd takes along with seeds, transitively."""
    via: dict = {}
    todo = list(seeds)
    while todo:
        cause = todo.pop(0)
        for unit, key in deps.get(cause, ()):
            if unit in skip or unit in via or unit in seeds:
                continue
            via[unit] = (cause, key)
            todo.append(unit)
    return dict(sorted(via.items()))


def _resources(entry: dict) -> dict:
    gpus = entry.get("gpus") or []
    mig = gpus[0].get("mig") if gpus else None
    return {
        "nodes": entry.get("nodes"),
        "cpus": entry.get("cpus"),
        "mems": entry.get("mems"),
        "gpus": [g.get("address") for g in gpus],
        "mig": None if not mig else f"{mig.get('profile')}@{mig.get('placement_start')}",
        "mps": (entry.get("mps") or {}).get("pipe_dir"),
    }


def _mig_layouts(gpu_topology: dict) -> dict:
    """{GPU address: (MIG mode, sorted 'profile@start')} of the GPUs' current state."""
    out = {}
    for gpu in (gpu_topology or {}).get("gpus") or ():
        mig = gpu.get("mig") or {}
        instances = sorted(
            f"{gi.get('profile_name')}@{gi.get('placement_start')}"
            for gi in mig.get("gpu_instances") or ()
            if gi.get("placement_start") is not None
        )
        out[gpu.get("address")] = (mig.get("mode_current"), instances)
    return out


def _mig_changes(new_plan: dict, gpu_topology: dict) -> list:
    current = _mig_layouts(gpu_topology)
    out = []
    for entry in new_plan.get("mig_gpus") or ():
        mode_now, have = current.get(entry["gpu"], (None, []))
        want = sorted(f"{slot['profile']}@{slot['start']}" for slot in entry.get("layout") or ())
        if entry["mode"] != "enabled":
            want = []
        create = [slot for slot in want if slot not in have]
        destroy = [slot for slot in have if slot not in want]
        mode = None if mode_now == entry["mode"] else f"{mode_now} -> {entry['mode']}"
        if create or destroy or mode:
            out.append({"gpu": entry["gpu"], "mode": mode, "create": create, "destroy": destroy})
    return out


def _mode_change(entry: dict, key: str) -> Optional[str]:
    """'CPX -> SPX' when the entry's planned mode of ``key`` differs from the current one."""
    modes = entry.get(key) or {}
    now, planned = modes.get("current"), modes.get("planned")
    return None if now == planned or planned is None else f"{now} -> {planned}"


def _amd_changes(new_plan: dict, reset_ok: bool, idle) -> list:
    """One item per AMD GPU of plan.amd_partitions whose compute or memory partition changes.

    {"gpu": address, "compute": "CPX -> SPX" or None, "memory": "NPS4 -> NPS1" or None,
    "reset_required": bool, "restart": [units]}. A memory partition change needs a reload of the
    amdgpu driver, which resets every AMD GPU of the host: without reset_ok
    (numafleet_amd_reset_ok) the amd layer changes nothing on that GPU (reset_required true,
    restart []). Else the amd layer stops the units it owns that hold the GPU, changes the modes
    and starts them again. A process using ROCm holds /dev/kfd, which holds every AMD GPU
    (amd_partition.read_amd_holders; the driver refuses a switch while a KFD process runs), so
    ``restart`` is every owned unit of the host (plan.amd_partitions[].owned_units) but those in
    ``idle`` (not running before the run: new, stopped for good, or waiting for their logical
    GPU).
    """
    entries = [e for e in new_plan.get("amd_partitions") or () if isinstance(e, dict)]
    owned = sorted({unit for e in entries for unit in e.get("owned_units") or ()} - set(idle))
    out = []
    for entry in entries:
        compute = _mode_change(entry, "compute_partition")
        memory = _mode_change(entry, "memory_partition")
        if not (compute or memory):
            continue
        waits = bool(memory) and not reset_ok
        out.append(
            {
                "gpu": entry.get("address"),
                "compute": compute,
                "memory": memory,
                "reset_required": waits,
                "restart": [] if waits else list(owned),
            }
        )
    return out


def _pools(plan: Optional[dict]) -> dict:
    """{(node, size_kb): count} of a plan's per-node hugepage pools."""
    return {
        (node["id"], pool["size_kb"]): pool["count"]
        for node in (plan or {}).get("nodes") or ()
        for pool in node.get("hugepages") or ()
    }


def _pool_changes(old_plan: Optional[dict], new_plan: dict) -> list:
    """['node0 2048kB 8192 -> 9216', ...]: the hugepage pools the plan changes (none unrecorded)."""
    if old_plan is None:
        return []
    before, after = _pools(old_plan), _pools(new_plan)
    return [
        f"node{node} {size}kB {before.get((node, size), 0)} -> {after.get((node, size), 0)}"
        for node, size in sorted(set(before) | set(after))
        if before.get((node, size), 0) != after.get((node, size), 0)
    ]


def _managed_units(paths) -> list:
    """The services the files at paths configure (slices and the MPS template left out)."""
    found = set()
    for path in paths:
        unit = unit_of(path)
        if unit.endswith(".service") and unit != mps.TEMPLATE_UNIT:
            found.add(unit)
    return sorted(found)


def _set_text(values) -> str:
    return format_cpulist(sorted(values)) or "none"


def _placement_reasons(old_plan: Optional[dict], new_plan: dict, restarted) -> dict:
    """{unit: why} of restarted placements whose limits or priority change (both: joined by
    '; '), in the order of the new plan's placements."""
    by_limits = limits.restart_reasons(old_plan, new_plan, restarted)
    by_priority = priority.restart_reasons(old_plan, new_plan, restarted)
    reasons = {}
    for entry in new_plan.get("placements") or ():
        unit = entry.get("unit")
        parts = [why for why in (by_limits.get(unit), by_priority.get(unit)) if why]
        if parts:
            reasons[unit] = "; ".join(parts)
    return reasons


def daemon_restart_reasons(old_plan: Optional[dict], new_plan: dict, restarted) -> dict:
    """{unit: why}: why each MPS daemon in ``restarted`` restarts, from the plans' mps_daemons.

    'its CPUs change: 0-31,64-95 -> 0-20,64-84 (CPUs 21-31,85-95 are outside the allowed
    cpuset, from <source> (<file>))', the same for memory nodes; CPUs that leave while still
    allowed are isolated or offline now, CPUs that join are usable again. Only daemons recorded
    with other CPUs or memory nodes are named (a new daemon, or one whose other settings
    changed, has no entry).
    """
    old_by = {
        d.get("unit"): d
        for d in (old_plan or {}).get("mps_daemons") or ()
        if isinstance(d, dict) and d.get("unit")
    }
    allowed = new_plan.get("allowed") or {}
    allowed_cpus = set(allowed.get("cpus") or ()) if allowed.get("narrowed") else None
    sources = ", ".join(allowed.get("sources") or ()) or "ansible_facts.numa.allowed"
    reasons = {}
    for new in new_plan.get("mps_daemons") or ():
        unit = new.get("unit")
        old = old_by.get(unit)
        if unit not in restarted or old is None:
            continue
        parts = []
        before, after = set(old.get("cpus") or ()), set(new.get("cpus") or ())
        if before != after:
            gone, why = sorted(before - after), []
            outside = [c for c in gone if allowed_cpus is not None and c not in allowed_cpus]
            if outside:
                why.append(
                    f"CPUs {_set_text(outside)} are outside the allowed cpuset, from {sources}"
                )
            other = [c for c in gone if c not in outside]
            if other:
                why.append(f"CPUs {_set_text(other)} are isolated or offline now")
            if after - before:
                why.append(f"CPUs {_set_text(after - before)} are usable again")
            parts.append(
                f"its CPUs change: {_set_text(before)} -> {_set_text(after)} ({'; '.join(why)})"
            )
        before, after = set(old.get("mems") or ()), set(new.get("mems") or ())
        if before != after:
            parts.append(f"its memory nodes change: {_set_text(before)} -> {_set_text(after)}")
        if parts:
            reasons[unit] = "; ".join(parts)
    return reasons


def change_plan(
    host: str,
    old_plan: Optional[dict],
    new_plan: dict,
    unit_files: dict,
    mps_files: dict,
    recorded_files: dict,
    gpu_topology: Optional[dict] = None,
    restart: str = "auto",
    max_removals: int = 2,
    allow_removals: bool = False,
    repack: bool = False,
    awaited=(),
    amd_reset_ok: bool = False,
    preflight_variants: Optional[Callable[[], list]] = None,
) -> dict:
    """ansible_facts.numafleet_changes of one host (see the module docs of numa_plan).

    unit_files / mps_files: the files the new plan renders ({host path: text}) for
    pinned_units / nvidia_mps; recorded_files: numafleet_recorded.files (digests of what the
    last apply wrote, the manifests included). awaited: the units an earlier run with
    restart "never" left to restart (the recorded plan's awaiting_restart): restarted now with
    "auto", still awaiting with "never" (units.awaiting_restart, which the caller records in
    the plan). amd_reset_ok: numafleet_amd_reset_ok (the amd layer's reset_ok): whether a
    memory partition change reloads the amdgpu driver or waits (``amd``, _amd_changes). The
    units the amd layer stops and starts around a partition change are in units.restart
    whatever ``restart`` says (the layer does not read it); a unit that systemd stops with them
    (Requires=, BindsTo=, PartOf=) is not started again by that layer: it is in stop_through.
    ``refused`` lists the blast-radius guards that fired (empty when allowed); the caller fails
    the host with them, before the gate. preflight_variants: called only when a unit file
    changes, it returns the unit files rendered with the other preflight modes ([{host path:
    text}]); a unit whose recorded digest is that of such a variant differs only in
    numafleet-guard's ExecStartPre= line: it is ``rewritten`` and not restarted.
    """
    owned = [
        path
        for path in recorded_files
        if path not in MANIFEST_PATHS
        and (unit_of(path).endswith((".service", ".slice", ".scope")) or is_manager_file(path))
        and recorded_files[path] != "kept"  # not ours any more: never stopped or removed
    ]
    # Listed by a manifest but no longer as numafleet wrote them (edited, a link, a foreign
    # path): the apply modules keep them, so the change plan says so instead of "stop".
    not_removed = sorted(
        path
        for path, found in recorded_files.items()
        if found == "kept" and path not in unit_files and path not in mps_files
    )
    owned_mps = [p for p in owned if unit_of(p).startswith("nvidia-mps@")]
    owned_units = [p for p in owned if p not in owned_mps]
    waiting = units.waiting_units(new_plan)
    unit_changes = file_changes(unit_files, recorded_files, owned_units)
    pinned = units.plan_actions(
        unit_changes,
        waiting,
        set(units.waiting_units(old_plan)),
        _preflight_paths(unit_changes, preflight_variants),
    )
    daemons, dummy = mps.plan_daemons(new_plan)
    daemon_actions = mps.plan_actions(file_changes(mps_files, recorded_files, owned_mps), daemons)

    start = sorted(set(pinned.start) | set(daemon_actions.start))
    stop = sorted(set(pinned.disable) | set(daemon_actions.disable))
    restart_units = sorted(set(pinned.restart) | set(daemon_actions.restart))
    try_restart = sorted(pinned.try_restart)
    unpinned = sorted(
        unit for unit in pinned.units["removed"] if unit not in pinned.disable
    )  # drop-ins removed: the vendor unit stays, unpinned (try-restarted)
    deps = dependents({**unit_files, **mps_files})
    busy = set(start) | set(stop) | set(restart_units) | set(try_restart)
    present = set(_managed_units([*unit_files, *mps_files]))
    never = restart == "never"
    # Units an earlier "never" run left: still there and not restarted (or stopped) anyway.
    restart_awaited = sorted(u for u in set(awaited) if u in present and u not in busy)
    seeds = restart_units + try_restart + ([] if never else restart_awaited)
    via_restart = _propagate(seeds, deps, busy | set(restart_awaited))
    via_stop = _propagate(stop, deps, busy | set(via_restart))
    amd = _amd_changes(new_plan, amd_reset_ok, set(start) | set(stop) | set(waiting))
    amd_restart = sorted({unit for item in amd for unit in item["restart"]})
    via_amd = _propagate(
        amd_restart, deps, busy | set(amd_restart) | set(via_restart) | set(restart_awaited)
    )

    old_by = {e["name"]: e for e in (old_plan or {}).get("placements") or ()}
    new_by = {e["name"]: e for e in new_plan.get("placements") or ()}
    stability = new_plan.get("stability") or {}
    managed = _managed_units(owned)
    placements: dict = {"added": [], "moved": [], "removed": [], "kept": [], "unrecorded": []}
    for name, entry in new_by.items():
        old = old_by.get(name)
        waits = waits_text(entry) or None
        if old is None:
            key = "unrecorded" if old_plan is None and entry["unit"] in managed else "added"
            placements[key].append({"name": name, "to": placement_text(entry), "waits": waits})
        elif _resources(old) == _resources(entry):
            why = stability.get(name, "kept")
            placements["kept"].append(
                {
                    "name": name,
                    "at": placement_text(entry),
                    "changed": None if why in ("kept", "new") else why,
                    "waits": waits,
                }
            )
        else:
            placements["moved"].append(
                {
                    "name": name,
                    "from": placement_text(old),
                    "to": placement_text(entry),
                    "reason": stability.get(name, "planned again"),
                    "waits": waits,
                }
            )
    for name, old in old_by.items():
        if name not in new_by:
            placements["removed"].append({"name": name, "from": placement_text(old)})

    mig = _mig_changes(new_plan, gpu_topology or {})
    removals = sorted(set(stop) | set(unpinned))
    refused = []
    disturbed = sorted(
        (
            set(restart_units)
            | set(try_restart)
            | set(via_restart)
            | set(stop)
            | set(unpinned)
            | set(amd_restart)
            | set(via_amd)
        )
        & set(managed)
    )
    if old_plan is None and managed and disturbed and not repack:
        # Without the recorded plan nothing can be kept: refuse to move running services.
        refused.append(
            f"host {host}: no plan is recorded on this host although numafleet manages "
            f"{len(managed)} unit{'' if len(managed) == 1 else 's'} there (the plan file is "
            "missing, or was written by an older numafleet.tuning), so placements cannot be "
            f"kept where they run, and this run would restart or stop {', '.join(disturbed)}. "
            "Run site.yml once with the placements as they were applied, which records the "
            "plan, then make the change; or set numafleet_repack: true for this run to plan from "
            "scratch. Nothing was changed."
        )
    if not allow_removals:
        if managed and set(managed) <= set(removals):
            refused.append(
                f"host {host}: this run would remove every unit numafleet manages here "
                f"({', '.join(removals)}): numafleet_placements plans "
                f"{len(new_by)} placement{'' if len(new_by) == 1 else 's'}. If that is meant, set "
                "numafleet_allow_removals: true for this run (-e numafleet_allow_removals=true); "
                "if not, check the variable's name and that its host_vars/group_vars file loads. "
                "Nothing was changed."
            )
        elif len(removals) > max_removals:
            refused.append(
                f"host {host}: this run would remove {len(removals)} units ({', '.join(removals)}),"
                f" more than numafleet_max_removals ({max_removals}). Set "
                "numafleet_allow_removals: true for this run, or raise numafleet_max_removals. "
                "Nothing was changed."
            )
    result = {
        "host": host,
        "recorded": old_plan is not None,
        "placements": placements,
        "units": {
            "start": start,
            "stop": stop,
            "unpin": unpinned,
            # The amd layer stops and starts its units whatever numafleet_restart says.
            "restart": sorted(set([] if never else restart_units) | set(amd_restart)),
            "restart_if_running": [] if never else try_restart,
            "restart_through": {} if never else _via_text(via_restart),
            "stop_through": _via_text(dict(sorted({**via_stop, **via_amd}.items()))),
            "restart_awaited": [] if never else restart_awaited,
            # Changed only in numafleet-guard's ExecStartPre=: written, not restarted.
            "rewritten": list(pinned.rewritten),
            "awaiting_restart": (
                sorted(
                    set(restart_units) | set(try_restart) | set(via_restart) | set(restart_awaited)
                )
                if never
                else []
            ),
            "not_removed": not_removed,
            # Written but not started: their MIG instance does not exist yet (waits_for).
            "waiting": {unit: units.waiting_line(unit, waits) for unit, waits in pinned.waiting},
            "slices": {key: pinned.slices[key] for key in ("new", "changed", "removed")},
            # The partition's system.conf.d drop-in changes: PID 1 re-executes (no restart).
            "reexec": pinned.reexec_needed,
            "reload": pinned.reload_needed or daemon_actions.reload_needed,
            # Why an MPS daemon restarts (its clients then restart through Requires=).
            "restart_reasons": {
                **daemon_restart_reasons(old_plan, new_plan, set(restart_units) | set(via_restart)),
                # A placement whose limits (MemoryMax=, CPUWeight=...) or priority change.
                **_placement_reasons(old_plan, new_plan, set(restart_units) | set(try_restart)),
            },
        },
        "mig": mig,
        "amd": amd,
        "hugepages": _pool_changes(old_plan, new_plan),
        "removals": {"units": removals, "max": max_removals, "allowed": allow_removals},
        "refused": refused,
    }
    result["changed"] = bool(
        placements["added"]
        or placements["moved"]
        or placements["removed"]
        or start
        or stop
        or unpinned
        or restart_units
        or try_restart
        or pinned.rewritten
        or result["units"]["restart_awaited"]
        or mig
        or amd
        or result["hugepages"]
        or any(result["units"]["slices"].values())
        or result["units"]["reexec"]
    )
    result["lines"] = change_lines(result)
    result["summary"] = change_summary(result)
    return result


def _preflight_paths(changes: list, variants: Optional[Callable[[], list]]) -> set:
    """Paths of updated unit files whose recorded digest (FileChange.before) is the digest of the
    same file rendered with another preflight mode: only the ExecStartPre= line differs."""
    updated = [change for change in changes if change.state == "update"]
    if not updated or variants is None:
        return set()
    found = set()
    for files in variants():
        for change in updated:
            text = files.get(change.path)
            if text is not None and digest(text) == change.before:
                found.add(change.path)
    return found


def _via_text(via: dict) -> dict:
    return {unit: f"{key}={cause}" for unit, (cause, key) in via.items()}


def change_summary(changes: dict) -> str:
    """The change plan in a few words for the summary line: 'changes: 1 moved; 1 restarted'."""
    placements, unit_actions = changes["placements"], changes["units"]
    moves = [
        f"{len(placements[key])} {key}" for key in ("added", "moved", "removed") if placements[key]
    ]
    restarted = len(unit_actions["restart"]) + len(unit_actions["restart_if_running"])
    restarted += len(unit_actions["restart_through"]) + len(unit_actions["restart_awaited"])
    counts = (
        ("started", len(unit_actions["start"])),
        ("restarted", restarted),
        ("stopped", len(unit_actions["stop"]) + len(unit_actions["stop_through"])),
        ("awaiting a restart", len(unit_actions["awaiting_restart"])),
        ("waiting for a MIG instance", len(unit_actions.get("waiting") or ())),
    )
    units_text = [f"{count} {label}" for label, count in counts if count]
    slices = sum(len(names) for names in unit_actions["slices"].values())
    if slices:
        units_text.append(f"{slices} slice{'' if slices == 1 else 's'} written")
    rewritten = len(unit_actions.get("rewritten") or ())
    if rewritten:
        units_text.append(f"{rewritten} rewritten for the preflight")
    if unit_actions.get("reexec"):
        units_text.append("systemd re-executed")
    if changes["hugepages"]:
        pools = len(changes["hugepages"])
        units_text.append(f"{pools} hugepage pool{'' if pools == 1 else 's'} to change")
    if changes["mig"]:
        layouts = len(changes["mig"])
        units_text.append(f"{layouts} MIG layout{'' if layouts == 1 else 's'} to change")
    amd = changes.get("amd") or ()
    for waits, label in ((False, ""), (True, " awaiting a reset")):
        count = sum(1 for item in amd if bool(item["reset_required"]) == waits)
        if count:
            units_text.append(f"{count} AMD partition change{'' if count == 1 else 's'}{label}")
    if not moves and not units_text:
        return "no change"
    return "changes: " + "; ".join(
        part for part in (", ".join(moves), ", ".join(units_text)) if part
    )


def change_lines(changes: dict) -> list:
    """The change plan as short lines for people: counts, then one line per change."""
    placements, unit_actions = changes["placements"], changes["units"]
    counts = ", ".join(
        f"{len(placements[key])} {key}"
        for key in ("added", "moved", "removed", "kept", "unrecorded")
        if placements[key] or key != "unrecorded"
    )
    lines = [
        f"{changes['host']}: change plan: {counts}" + ("" if changes["changed"] else "; no change")
    ]
    if not changes["recorded"]:
        lines.append("  (no recorded plan on the host: every placement is planned from scratch)")

    def waits(item: dict) -> str:
        return f" ({item['waits']})" if item.get("waits") else ""

    for item in placements["added"]:
        lines.append(f"  + add     {item['name']}: {item['to']}{waits(item)}")
    for item in placements["unrecorded"]:
        lines.append(
            f"  ? planned {item['name']}: {item['to']} (its unit exists; not recorded){waits(item)}"
        )
    for item in placements["moved"]:
        lines.append(
            f"  ~ move    {item['name']}: {item['from']} -> {item['to']} ({item['reason']})"
            f"{waits(item)}"
        )
    for item in placements["removed"]:
        lines.append(f"  - remove  {item['name']}: {item['from']}")
    for item in placements["kept"]:
        if item.get("changed"):
            lines.append(
                f"  = keep    {item['name']}: {item['at']} ({item['changed']}; its resources "
                f"are kept){waits(item)}"
            )
    labels = (
        ("start", "start"),
        ("restart", "restart"),
        ("restart_awaited", "restart (awaited since a run with numafleet_restart: never)"),
        ("restart_if_running", "restart if running"),
        ("stop", "stop"),
        ("unpin", "unpin (drop-in removed)"),
        ("awaiting_restart", "awaiting a restart (numafleet_restart: never)"),
    )
    for key, label in labels:
        if unit_actions[key]:
            lines.append(f"  {label}: {', '.join(unit_actions[key])}")
    if unit_actions.get("rewritten"):
        lines.append(
            f"  rewritten; ExecStartPre= (preflight) takes effect at its next start: "
            f"{', '.join(unit_actions['rewritten'])}"
        )
    for unit, why in (unit_actions.get("restart_reasons") or {}).items():
        if unit in unit_actions["restart"] or unit in unit_actions["restart_if_running"]:
            lines.append(f"  why {unit} restarts: {why}")
    for key, label in (
        ("restart_through", "restarted by systemd"),
        ("stop_through", "stopped by systemd"),
    ):
        for unit, cause in unit_actions[key].items():
            lines.append(f"  {label}: {unit} ({cause})")
    for line in (unit_actions.get("waiting") or {}).values():
        lines.append(f"  {line}")
    for path in unit_actions.get("not_removed") or ():
        lines.append(
            f"  not removed: {path} (listed by a manifest, but not as numafleet wrote it: "
            "edited, a link or a foreign path; kept, never stopped or deleted)"
        )
    for state, names in unit_actions["slices"].items():
        if names:
            lines.append(f"  {state} slice: {', '.join(names)} (applied at daemon-reload)")
    if unit_actions.get("reexec"):
        lines.append(
            "  systemd manager: CPUAffinity of the housekeeping partition (system.conf.d) "
            "changes; applied by systemctl daemon-reexec (no restarts)"
        )
    if changes["hugepages"]:
        lines.append(f"  hugepage pools: {'; '.join(changes['hugepages'])}")
    for item in changes["mig"]:
        parts = []
        if item["mode"]:
            parts.append(f"mode {item['mode']}")
        if item["destroy"]:
            parts.append(f"destroy {', '.join(item['destroy'])}")
        if item["create"]:
            parts.append(f"create {', '.join(item['create'])}")
        lines.append(f"  MIG {item['gpu']}: {'; '.join(parts)}")
    lines += _amd_lines(changes.get("amd") or ())
    return lines


def _amd_lines(amd) -> list:
    """The change plan's lines of the AMD partition changes (change_plan's ``amd`` items)."""
    lines = []
    for item in amd:
        modes = "; ".join(f"{kind} {item[kind]}" for kind in ("compute", "memory") if item[kind])
        if item["reset_required"]:
            lines.append(
                f"  amd {item['gpu']}: {modes}: waits as reset_required, nothing changes on this "
                "GPU: a memory partition change needs a reload of the amdgpu driver, which resets "
                "every AMD GPU of the host; set numafleet_amd_reset_ok: true for a run in a "
                "maintenance window (or reboot into the mode)"
            )
        elif item["memory"]:
            lines.append(
                f"  amd {item['gpu']}: {modes}; reloads the amdgpu driver, which resets EVERY "
                "AMD GPU of the host"
            )
        else:
            lines.append(f"  amd {item['gpu']}: {modes}")
    applied = [item for item in amd if not item["reset_required"]]
    restart = sorted({unit for item in applied for unit in item["restart"]})
    if restart:
        lines.append(
            f"  amd: stops and starts {', '.join(restart)} around the partition change (a "
            "process using ROCm holds /dev/kfd, and with it every AMD GPU of the host)"
        )
    if applied:
        lines.append(
            "  amd: a process outside these units that holds /dev/kfd or a render node of a "
            "GPU to change fails the run before any partition change"
        )
    return lines


def add_kernel_cmdline(changes: dict, change: dict) -> dict:
    """``changes`` (change_plan's result) with the kernel command line part ``change``
    (cmdline.cmdline_change) added as ``kernel_cmdline``: its lines appended, ``changed`` and the
    summary updated. Returns ``changes``."""
    from .cmdline import change_lines as cmdline_lines

    changes["kernel_cmdline"] = change
    changes["lines"] += cmdline_lines(change)
    if change["changed"]:
        changes["changed"] = True
        note = "kernel command line to change (reboot)"
    elif change["missing"]:
        note = "reboot pending"
    else:
        return changes
    summary = changes["summary"]
    if summary == "no change":
        changes["summary"] = f"changes: {note}" if change["changed"] else f"no change; {note}"
    else:
        changes["summary"] = f"{summary}; {note}"
    return changes


__all__ = [
    "add_kernel_cmdline",
    "change_lines",
    "change_plan",
    "change_summary",
    "dependents",
    "file_changes",
]
