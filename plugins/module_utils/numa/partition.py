# Private to this collection: may change in any release.
"""The housekeeping partition of a host: system daemons and logins kept off the placements' CPUs.

With ``numafleet_partition: true`` and at least one placement, ``numafleet_reserved_cpus``
becomes the housekeeping set (the "reserved" set of OpenShift's PerformanceProfile, TuneD's
cpu-partitioning ``no_balance_cores`` complement, kubelet's ``reservedSystemCPUs``), and the
units layer writes (render_files, paths below the unit directory's parent ``/etc/systemd``):

- ``system.slice.d/50-numafleet.conf`` and ``user.slice.d/50-numafleet.conf``:
  ``[Slice] AllowedCPUs=<housekeeping>`` (systemd.resource-control(5): AllowedCPUs= applies to
  slices, scopes and services, in their ``[Slice]``/``[Scope]``/``[Service]`` section). Every
  system service that has no slice of its own, and every login session, is then confined by
  its slice's cpuset.
- ``init.scope.d/50-numafleet.conf``: ``[Scope] AllowedCPUs=<housekeeping>``. init.scope is a
  unit systemd creates itself; like any unit it reads drop-ins from ``<unit>.d/`` in the unit
  load path (systemd.unit(5)); ``systemctl set-property init.scope AllowedCPUs=`` writes the
  same kind of drop-in (to system.control/).
- ``/etc/systemd/system.conf.d/50-numafleet.conf``: ``[Manager] CPUAffinity=<housekeeping>``
  (systemd-system.conf(5)): the CPU affinity of PID 1 and the default of every process it
  forks. systemd reads it when it starts or re-executes (``systemctl daemon-reexec``), not on
  daemon-reload; the apply runs daemon-reexec when that file changes (no unit is restarted).

The placements are untouched by this: each keeps its own ``AllowedCPUs=``/``CPUAffinity=`` and
runs in ``numafleet.slice`` or its tenant's slice. ``numafleet.slice`` itself is NOT confined:
numa_facts reads that slice's cpuset as a source that narrows what the planner may use
(allowed.py), so a housekeeping cpuset there would shrink the next plan to the housekeeping
CPUs.

The housekeeping set depends only on ``numafleet_reserved_cpus`` and the host's facts, never on
the placements: adding, editing or removing a placement does not change these files, and no
slice or scope is ever restarted (a daemon-reload applies slice and scope properties).

Pure: no I/O. Errors are PlacementError (bad host variables, refused before the plan gate).
"""

from __future__ import annotations

import posixpath
from typing import Optional

from .cpulist import format_cpulist
from .errors import PlacementError

PARTITION_VAR = "numafleet_partition"
RESERVED_VAR = "numafleet_reserved_cpus"
DROPIN_NAME = "50-numafleet.conf"
# (unit, section) confined to the housekeeping CPUs: never numafleet.slice (see above).
CONFINED = (("init.scope", "Scope"), ("system.slice", "Slice"), ("user.slice", "Slice"))
MANAGER_DIR = "system.conf.d"
MANAGER_UNIT = "system.conf"


def parse_flag(host: str, value) -> bool:
    """numafleet_partition as a bool (None: false); raises PlacementError for anything else."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise PlacementError(
        host, f"{PARTITION_VAR}: {value!r} is not a boolean; write true or false (the default)"
    )


def housekeeping_cpus(reserved, online, allowed: Optional[list] = None) -> list:
    """The housekeeping CPUs: numafleet_reserved_cpus that are online and (when the host's
    allowed cpuset narrows the plan) allowed; sorted ints."""
    usable = set(online)
    if allowed is not None:
        usable &= set(allowed)
    return sorted(cpu for cpu in set(reserved) if cpu in usable)


def plan_partition(
    host: str, flag, reserved, online, allowed: Optional[list], placements: list
) -> Optional[dict]:
    """The plan's optional ``partition`` key: {"housekeeping_cpus": [int], "units": [unit]};
    None when partitioning is off (``flag`` false) or the host has no placements.

    ``reserved``: numafleet_reserved_cpus parsed; ``online``: ansible_facts.numa.cpus.online;
    ``allowed``: the allowed cpuset when it narrows the plan (None: not narrowed);
    ``placements``: the plan's placements (each with ``cpus`` and ``where``-less ``name``).
    Raises PlacementError naming the host, the variable and the fix when the flag is not a
    bool, numafleet_reserved_cpus is empty, none of its CPUs is online and allowed, or a
    placement's CPUs overlap it.
    """
    if not parse_flag(host, flag) or not placements:
        return None
    if not reserved:
        raise PlacementError(
            host,
            f"{PARTITION_VAR} is true but {RESERVED_VAR} is empty: the housekeeping CPUs that "
            "system.slice, user.slice and init.scope are confined to come from it. Set "
            f"{RESERVED_VAR} to the CPUs system daemons and logins may use (e.g. '0' or "
            f"'0-1,64-65'), or set {PARTITION_VAR}: false",
        )
    cpus = housekeeping_cpus(reserved, online, allowed)
    if not cpus:
        where = "online" if allowed is None else "online and in the allowed cpuset"
        raise PlacementError(
            host,
            f"{PARTITION_VAR} is true but none of {RESERVED_VAR} (CPUs "
            f"{format_cpulist(sorted(set(reserved)))}) is {where}: system daemons would have "
            f"no CPU. Add an online CPU to {RESERVED_VAR}, or set {PARTITION_VAR}: false",
        )
    for entry in placements:
        overlap = sorted(set(entry.get("cpus") or ()) & set(cpus))
        if overlap:
            raise PlacementError(
                host,
                f"{PARTITION_VAR}: placement {entry.get('name')} has CPUs "
                f"{format_cpulist(overlap)}, which are in {RESERVED_VAR} (the housekeeping "
                "CPUs); pin the placement to other CPUs or remove them from "
                f"{RESERVED_VAR}",
            )
    return {"housekeeping_cpus": cpus, "units": [unit for unit, dummy in CONFINED]}


def no_reserved_warning(reserved, placements: list) -> Optional[str]:
    """The plan warning of a host with placements and no numafleet_reserved_cpus, else None."""
    if reserved or not placements:
        return None
    return (
        f"{RESERVED_VAR} is empty: system daemons, logins and interrupts may run on any CPU, "
        "including the placements' (and any CPU, CPU 0 too, may go to a placement); set "
        f"{RESERVED_VAR} to the housekeeping CPUs (e.g. '0'), and {PARTITION_VAR}: true to "
        "confine system.slice and user.slice to them"
    )


def manager_path(unit_dir: str) -> str:
    """The system.conf drop-in path beside ``unit_dir`` (/etc/systemd/system.conf.d/50-...)."""
    return posixpath.join(posixpath.dirname(unit_dir), MANAGER_DIR, DROPIN_NAME)


def is_manager_file(path: str) -> bool:
    """Whether ``path`` is a ``.../system.conf.d/50-numafleet.conf`` drop-in (not a unit)."""
    parent, base = posixpath.split(path)
    return base == DROPIN_NAME and posixpath.basename(parent) == MANAGER_DIR


def partition_of(plan) -> Optional[dict]:
    """The plan's ``partition`` entry when it is a well-formed one, else None (off)."""
    entry = plan.get("partition") if isinstance(plan, dict) else None
    if not isinstance(entry, dict):
        return None
    cpus = entry.get("housekeeping_cpus")
    if not isinstance(cpus, list) or not cpus:
        return None
    if not all(isinstance(cpu, int) and not isinstance(cpu, bool) and cpu >= 0 for cpu in cpus):
        return None
    return entry


def render_partition(plan: dict, header: list, unit_dir: str) -> dict:
    """{path: text} of the partition drop-ins of ``plan`` ({} when partitioning is off).

    ``header``: the comment lines every managed file starts with (units.header_lines).
    """
    entry = partition_of(plan)
    if entry is None:
        return {}
    cpus = format_cpulist(sorted(set(entry["housekeeping_cpus"])))
    # As units.unit_document lays a file out: the header, a blank line, the section.
    head = "\n".join(header) + "\n\n" if header else ""
    out = {}
    for unit, section in CONFINED:
        out[posixpath.join(unit_dir, f"{unit}.d", DROPIN_NAME)] = (
            f"{head}[{section}]\nAllowedCPUs={cpus}\n"
        )
    out[manager_path(unit_dir)] = f"{head}[Manager]\nCPUAffinity={cpus}\n"
    return out


def pid1_reset_argv(plan) -> Optional[list]:
    """argv giving PID 1 (all its threads) every CPU of the plan's ``allowed`` set again, for the
    run that removes the system.conf.d drop-in; None when the plan has no such set.

    systemd applies ``CPUAffinity=`` of system.conf only when it is set: with the drop-in gone, a
    re-executed PID 1 keeps the housekeeping affinity (src/core/main.c, update_cpu_affinity),
    and every process it forks inherits it, until the next boot. ``taskset -a -p -c`` (util-linux)
    sets it back to what PID 1 has at boot: the online CPUs its cpuset allows.
    """
    allowed = plan.get("allowed") if isinstance(plan, dict) else None
    cpus = allowed.get("cpus") if isinstance(allowed, dict) else None
    if not isinstance(cpus, list) or not cpus:
        return None
    if not all(isinstance(cpu, int) and not isinstance(cpu, bool) and cpu >= 0 for cpu in cpus):
        return None
    return ["taskset", "-a", "-p", "-c", format_cpulist(sorted(set(cpus))), "1"]


def irqbalance_banned(plan, online, quiet=()) -> Optional[list]:
    """The CPUs irqbalance must not use when the plan partitions the host: every online CPU
    outside the housekeeping set, plus ``quiet`` (isolated, nohz_full); None when the plan
    does not partition (the caller keeps its own rule)."""
    entry = partition_of(plan)
    if entry is None:
        return None
    keep = set(entry["housekeeping_cpus"])
    return sorted((set(online) - keep) | set(quiet))


__all__ = [
    "PARTITION_VAR",
    "housekeeping_cpus",
    "irqbalance_banned",
    "is_manager_file",
    "manager_path",
    "no_reserved_warning",
    "parse_flag",
    "partition_of",
    "pid1_reset_argv",
    "plan_partition",
    "render_partition",
]
