# Private to this collection: may change in any release.
"""Verify: the plan + what numa_locality_info measured -> checks, and the checks -> reports. Pure.

A check is one verdict on one subject (a service or ``nodeN``) of one host: ``pass``, ``fail``,
``warn`` or ``skipped``. Skipped means "could not be checked" and never counts as passed.

Rules (docs/architecture.md, "Verify: metrics and checks"):

- ``running``: the unit's cgroup has processes. A placement whose MIG instance does not exist
  yet (plan ``waits_for``) is not started by design: ``running`` warns with the reason and its
  other checks are skipped.
- ``cpus_binding`` / ``mems_binding``: every process's ``Cpus_allowed_list`` / ``Mems_allowed_list``
  lies within the plan's cpus / mems. When they do but together miss some of them (the kernel
  narrowed the binding to a cgroup cpuset, or the service its own affinity), it warns naming the
  missing CPUs / nodes: never a pass.
- ``offnode_share``: anonymous + hugetlb memory on nodes outside the plan's mems, as a percentage of
  all of it. It fails when the share is *above* ``cross_node_target_pct``; exactly at the target
  passes. A service with no such pages resident is skipped. A placement the memory guard moved
  (``numafleet_memory_act: migrate``; the guard's state file lists it under ``spilled``, read on
  the host into the measurement's ``guard``) warns instead of failing:
  ``spilled (numafleet-guard moved it to node 0 at 2026-01-31T12:00:00Z)``.
- ``gpu_locality``: every planned GPU sits on one of the placement's nodes or mems; a GPU whose
  node is unknown (sysfs ``numa_node`` -1) warns. Only services with GPUs get this check.
- ``memory_used`` (per node with memory): warns at ``memory_warn_pct`` or more, fails at
  ``memory_fail_pct`` or more (exactly 80 warns, exactly 90 fails with the defaults).
- ``guard_service`` / ``guard_config`` / ``guard_last_run`` (``guard_checks``, only where the
  memory guard is enabled): numafleet-guard.service is active, its config's settings equal the
  host's, its last round is at most 3 x interval_s old (read on the host by host_apply's
  measurement, ``locality.read_guard``).
- ``hugepages_total`` (per node with a planned or reserved pool): the reserved total (not the free
  count) of each page size equals the plan's; a reserved pool of a size the plan does not use warns.
- ``rendered_units`` (static, per unit, also in render mode): the files on disk equal what
  ``units.render_files(plan)`` renders. From pinned_units' check-mode ``files`` list
  (``rendered_unit_checks``), a file whose state is not ``unchanged`` fails its unit (the manifest
  its own subject, ``manifest``).

- ``effective_units`` (static, per planned service and tenant slice, also in render mode): what
  systemd will use for the unit - every unit file and drop-in it reads, merged as systemd merges
  them (effective.py), and on a live host what ``systemctl show`` reports - equals every setting
  numafleet's files assign in ``[Unit]`` and the type section (CPUAffinity, NUMAPolicy,
  NUMAMask, AllowedCPUs, AllowedMemoryNodes, Slice, MemoryMax, ExecStart, ...) and each planned
  Environment variable (also as changed by EnvironmentFile= and UnsetEnvironment=). It fails
  naming each differing property, its planned and effective value, the file that sets it (a
  foreign drop-in, a ``systemctl set-property`` file, a link with its target, the drop-in and
  its environment file) and the fix for that file; it fails when a file systemd reads cannot be
  read (a link out of the root, a loop, a FIFO, a missing EnvironmentFile=), and warns only for
  a dangling drop-in link, which systemd ignores. From the units layer's ``effective`` list
  (``effective_unit_checks``).
  Outside render mode, a service whose effective CPU properties (CPUAffinity, AllowedCPUs)
  differ fails ``cpus_binding``, and one whose memory properties (NUMAPolicy, NUMAMask,
  AllowedMemoryNodes) differ fails ``mems_binding``, naming the file, whatever its processes
  show now (they may not have been restarted since).

In render mode nothing runs: every runtime check is skipped with the reason "render mode: nothing
runs"; the static checks still run.

JSON report schema ``numafleet.verify/1`` (``as_json_report``)::

    {"schema": "numafleet.verify/1",
     "generated_at": "2025-01-31T12:00:00Z",
     "run": {...whatever the caller passed besides generated_at...},
     "status": "pass|warn|fail|skipped",
     "status_text": "pass (12 of 40 checks not run)",
     "hosts": {"<host>": {"status": ..., "summary": "<summary_line>",
                          "status_text": "pass (render: 27 of 34 checks not run)",
                          "not_run": n,
                          "counts": {"pass": n, "fail": n, "warn": n, "skipped": n},
                          "checks": [<check>, ...]}},
     "totals": {"hosts": n, "checks": n, "pass": n, "fail": n, "warn": n, "skipped": n,
                "hosts_by_status": {"pass": n, "fail": n, "warn": n, "skipped": n}}}

where ``<check>`` is ``Check.as_dict()``: host, check, subject, status, measured, target, unit,
message, detail. A host's status is fail if any check failed, else warn if any warned, else pass if
any passed, else skipped. ``status`` stays the machine field; ``status_text`` says how many checks
were not run (skipped), so a pass with most checks skipped never reads as a plain pass, and
``not_run`` counts them (also in JUnit as the testsuite property ``not_run`` and in Prometheus as
``numafleet_verify_checks_not_run``). With numafleet_verify_require_runtime, ``require_runtime``
turns skipped runtime checks into failures.
"""

from __future__ import annotations

import difflib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, Optional

from .cpulist import format_cpulist
from .effective import CPU_PROPERTIES, MEM_PROPERTIES, UNREADABLE, escape_text, fix_text, shown
from .errors import NumaTuneError, VerifyError
from .gpu_amd import logical_uuid_counts, render_node
from .units import DEFAULT_MANIFEST_PATH, render_files, unit_of

SCHEMA = "numafleet.verify/1"
STATUSES = ("pass", "fail", "warn", "skipped")
# Worst first: the status a host gets from its checks.
_SEVERITY = ("fail", "warn", "pass", "skipped")
DEFAULT_THRESHOLDS = {
    "cross_node_target_pct": 2,
    "memory_warn_pct": 80,
    "memory_fail_pct": 90,
}
RENDER_MODE_REASON = "render mode: nothing runs"
# The detail of a waiting placement's running check (plan waits_for): summary_line counts them.
_WAITS_PREFIX = "waits for MIG instance "
SERVICE_CHECKS = ("running", "cpus_binding", "mems_binding", "offnode_share", "gpu_locality")
NODE_CHECKS = ("memory_used", "hugepages_total")
STATIC_CHECKS = ("rendered_units", "effective_units")
# The memory guard's checks (guard_checks), where the guard is enabled on the host.
GUARD_CHECKS = ("guard_service", "guard_config", "guard_last_run")
GUARD_UNIT = "numafleet-guard.service"
GUARD_ACTS = ("reclaim", "throttle", "migrate")
# guard option key -> the host variable it comes from (verify.yml), its default and its range.
GUARD_OPTION = {
    "enabled": ("numafleet_memory_guard", True, None),
    "warn_pct": ("numafleet_memory_warn_pct", 80, (1, 100)),
    "act_pct": ("numafleet_memory_act_pct", 90, (1, 100)),
    "act": ("numafleet_memory_act", "reclaim", GUARD_ACTS),
    "interval_s": ("numafleet_memory_guard_interval", 15, (1, 3600)),
}
# A guard whose last round is older than this many intervals is stuck or stopped.
GUARD_STALE_INTERVALS = 3
# The detail of a binding check failed by the effective unit settings (not by a measurement): the
# drift report counts it as drift, like the effective_units check it repeats.
EFFECTIVE_DIFFER = "effective settings differ"
RUNTIME_CHECKS = SERVICE_CHECKS + NODE_CHECKS + GUARD_CHECKS
_SUMMARY_PROBLEMS = 5


@dataclass(frozen=True)
class Check:
    """One verdict. ``measured`` and ``target`` are JSON-ready, in ``unit``; ``detail`` is short."""

    host: str
    check: str
    subject: str
    status: str
    measured: Any
    target: Any
    unit: str
    message: str
    detail: str = ""

    def as_dict(self) -> dict:
        """JSON-ready dict of the check (the report's check entry)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


_FIELDS = tuple(field.name for field in fields(Check))


def as_check(value) -> Check:
    """A Check from a Check or its as_dict() (checks gathered from hostvars); raises VerifyError."""
    if isinstance(value, Check):
        return value
    if not isinstance(value, dict):
        raise VerifyError(
            f"a check is {type(value).__name__}, not a mapping; pass the checks that "
            "numafleet verify produced"
        )
    missing = [name for name in _FIELDS[:-1] if name not in value]
    if missing:
        raise VerifyError(
            f"check {value!r} lacks {', '.join(missing)}; pass the checks that numafleet verify produced"
        )
    if value["status"] not in STATUSES:
        raise VerifyError(
            f"check {value.get('check')!r} of host {value.get('host')!r} has status "
            f"{value['status']!r}; a status is one of {', '.join(STATUSES)}"
        )
    return Check(**{name: value.get(name, "") for name in _FIELDS})


# --- inputs ------------------------------------------------------------------------------------


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise VerifyError(
            f"verify threshold {name} is {value!r}, not a number; set it to a percentage "
            "between 0 and 100"
        )
    if not 0 <= value <= 100:
        raise VerifyError(
            f"verify threshold {name} is {value!r}; set it to a percentage between 0 and 100"
        )
    return value


def parse_thresholds(thresholds: Optional[dict]) -> dict:
    """The thresholds with defaults filled in; raises VerifyError for unknown keys or bad values."""
    if thresholds is None:
        thresholds = {}
    if not isinstance(thresholds, dict):
        raise VerifyError(
            f"verify thresholds are {type(thresholds).__name__}, not a mapping; give a mapping "
            f"with any of {', '.join(DEFAULT_THRESHOLDS)}"
        )
    unknown = sorted(str(key) for key in thresholds if key not in DEFAULT_THRESHOLDS)
    if unknown:
        raise VerifyError(
            f"verify thresholds have unknown key(s) {', '.join(unknown)}; the keys are "
            f"{', '.join(DEFAULT_THRESHOLDS)}"
        )
    out = dict(DEFAULT_THRESHOLDS)
    for key, value in thresholds.items():
        if value is not None:
            out[key] = _number(value, key)
    if out["memory_warn_pct"] > out["memory_fail_pct"]:
        raise VerifyError(
            f"verify threshold memory_warn_pct ({out['memory_warn_pct']}) is above "
            f"memory_fail_pct ({out['memory_fail_pct']}); set memory_warn_pct to at most "
            "memory_fail_pct"
        )
    return out


def _mapping(value, what: str, host: str) -> dict:
    if not isinstance(value, dict):
        raise VerifyError(
            f"host {host}: {what} is {type(value).__name__}, not a mapping; pass "
            + (
                "ansible_facts.numafleet_plan"
                if what == "plan"
                else "the result of numafleet.tuning.numa_locality_info"
            )
        )
    return value


def _pct(value: float, digits: int = 1) -> str:
    text = f"{value:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _versus(measured: float, op: str, target: float) -> str:
    """'7.1% > 2%', with more digits when the rounding would hide the difference."""
    for digits in range(1, 7):
        left, right = _pct(measured, digits), _pct(target, digits)
        if left != right or measured == target:
            break
    return f"{left}% {op} {right}%"


def _size(kb: int) -> str:
    if kb >= 1048576 and kb % 1048576 == 0:
        return f"{kb // 1048576} GiB"
    if kb >= 1024 and kb % 1024 == 0:
        return f"{kb // 1024} MiB"
    return f"{kb} kB"


# --- checks ------------------------------------------------------------------------------------


class _Checks:
    """Collects the checks of one host."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.out: list[Check] = []

    def add(self, check, subject, status, measured, target, unit, message, detail="") -> None:
        self.out.append(
            Check(self.host, check, str(subject), status, measured, target, unit, message, detail)
        )

    def skip(self, check: str, subject: str, reason: str, target=None, unit: str = "") -> None:
        self.add(check, subject, "skipped", None, target, unit, f"skipped: {reason}", reason)


def _first_difference(want: str, got: str) -> str:
    for line in difflib.unified_diff(
        want.splitlines(), got.splitlines(), "plan", "disk", lineterm="", n=0
    ):
        if line.startswith("@@"):
            return f" (first difference: {line})"
    return " (line endings or trailing newline differ)"


def _check_rendered(out: _Checks, plan: dict, current: dict, render_options: dict) -> None:
    try:
        want = render_files(plan, **render_options)
    except NumaTuneError as exc:
        out.add(
            "rendered_units",
            "plan",
            "fail",
            None,
            None,
            "file",
            f"the plan cannot be rendered: {exc}",
            "plan does not render",
        )
        return
    by_unit: dict = {}
    for path in sorted(want):
        by_unit.setdefault(unit_of(path), []).append(path)
    for unit in sorted(by_unit):
        states: dict = {}
        problems = []
        for path in by_unit[unit]:
            got = current.get(path)
            if got is None:
                states[path] = "missing"
                problems.append(f"{path} is missing")
            elif got != want[path]:
                states[path] = "differs"
                problems.append(f"{path} differs from the plan{_first_difference(want[path], got)}")
            else:
                states[path] = "matches"
        if problems:
            bad = [state for state in states.values() if state != "matches"]
            out.add(
                "rendered_units",
                unit,
                "fail",
                states,
                "matches",
                "file",
                "; ".join(problems) + "; run the playbook again to write the plan's units",
                f"{len(bad)} of {len(states)} file(s) {'/'.join(sorted(set(bad)))}",
            )
        else:
            out.add(
                "rendered_units",
                unit,
                "pass",
                states,
                "matches",
                "file",
                f"{len(states)} file(s) match the plan",
            )


# pinned_units' check-mode state of a file -> what it says about the file on disk.
_UNIT_STATES = {
    "unchanged": "matches",
    "create": "missing",
    "update": "differs",
    "remove": "not planned",
}


def rendered_unit_checks(
    host: str, states, manifest_path: str = DEFAULT_MANIFEST_PATH
) -> list[Check]:
    """``rendered_units`` checks from pinned_units' check-mode ``files`` ([{path, state}]).

    One check per unit (drop-ins count for their unit), plus ``manifest`` for ``manifest_path``:
    it passes when every file is ``unchanged`` and fails naming each file that would be created,
    updated or removed. No files at all (nothing planned, nothing on disk) is one passing check of
    subject ``units``. Raises VerifyError for entries of the wrong shape or an unknown state.
    """
    if not isinstance(states, (list, tuple)):
        raise VerifyError(
            f"host {host}: unit_states is {type(states).__name__}, not a list; pass the files "
            "list that numafleet.tuning.pinned_units returns in check mode"
        )
    by_subject: dict = {}
    for entry in states:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise VerifyError(
                f"host {host}: unit_states entry {entry!r} is not a mapping with a path; pass the "
                "files list that numafleet.tuning.pinned_units returns in check mode"
            )
        state = entry.get("state")
        if state not in _UNIT_STATES:
            raise VerifyError(
                f"host {host}: unit_states entry {entry['path']} has state {state!r}; a state is "
                f"one of {', '.join(_UNIT_STATES)}"
            )
        path = entry["path"]
        subject = "manifest" if path == manifest_path else unit_of(path)
        by_subject.setdefault(subject, {})[path] = _UNIT_STATES[state]
    out = _Checks(host)
    if not by_subject:
        out.add(
            "rendered_units",
            "units",
            "pass",
            {},
            "matches",
            "file",
            "no units planned, none on disk",
        )
        return out.out
    for subject in sorted(by_subject):
        files = dict(sorted(by_subject[subject].items()))
        bad = {path: state for path, state in files.items() if state != "matches"}
        if not bad:
            out.add(
                "rendered_units",
                subject,
                "pass",
                files,
                "matches",
                "file",
                f"{len(files)} file(s) match the plan",
            )
            continue
        problems = [
            f"{path} {'differs from the plan' if state == 'differs' else 'is ' + state}"
            for path, state in bad.items()
        ]
        out.add(
            "rendered_units",
            subject,
            "fail",
            files,
            "matches",
            "file",
            "; ".join(problems) + "; run site.yml to write the plan's units",
            f"{len(bad)} of {len(files)} file(s) {'/'.join(sorted(set(bad.values())))}",
        )
    return out.out


def _effective_problems(entry: dict) -> dict:
    """{property: text} of the properties of an ``effective`` entry that differ from the plan:
    the planned and effective value and the file (or ``systemctl show``) that sets it, with the
    fix for that file; UNREADABLE for files systemd reads that could not be read."""
    problems = {}
    unit = str(entry.get("unit"))
    if entry.get("masked"):
        problems["LoadState"] = f"{unit} is masked by {entry['masked']}"
    unread = [
        item
        for item in entry.get("unread") or ()
        if isinstance(item, dict) and not item.get("ignored")
    ]
    if unread:
        problems[UNREADABLE] = "; ".join(
            f"{escape_text(str(item.get('path')))} cannot be read ({escape_text(str(item.get('reason')))}"
            + (f", EnvironmentFile= of {item['via']}" if item.get("via") else "")
            + f"): make it readable or {fix_text(unit, str(item.get('path')), '')}"
            for item in unread
        )
    live = entry.get("live") or {}
    for prop, item in sorted((entry.get("properties") or {}).items()):
        if not isinstance(item, dict):
            continue
        if not item.get("ok"):
            source = item.get("source") or "(no file)"
            detail = item.get("detail") or ""
            where = f"{escape_text(source)} ({detail})" if detail else escape_text(source)
            problems[prop] = (
                f"{prop} is {shown(item.get('effective'))} (planned {shown(item.get('planned'))}), "
                f"set by {where}: {fix_text(unit, source, detail)}"
            )
        elif prop in live and live[prop] != item.get("planned"):
            problems[prop] = (
                f"{prop} is {shown(live[prop])} in the running service manager (systemctl show; "
                f"planned {shown(item.get('planned'))}): a daemon-reload is owed or a drop-in "
                f"outside the unit directories sets it"
            )
    return problems


def _subjects(plan: dict) -> dict:
    """{unit: verify subject}: a placement's name for its unit, the slice for a tenant slice."""
    subjects = {}
    for tenant in plan.get("tenants") or ():
        if isinstance(tenant, dict) and isinstance(tenant.get("slice"), str):
            subjects[tenant["slice"]] = tenant["slice"]
    for placement in plan.get("placements") or ():
        if isinstance(placement, dict) and isinstance(placement.get("unit"), str):
            subjects[placement["unit"]] = str(placement.get("name"))
    return subjects


_EFFECTIVE_FIX = (
    "then systemctl daemon-reload and restart the unit: numafleet does not remove files it did "
    "not write"
)


def effective_unit_checks(host: str, plan: dict, entries) -> list[Check]:
    """``effective_units`` checks from the units layer's ``effective`` list (one per unit).

    Passes when every planned property is in effect; fails naming each differing property, its
    planned and effective value and the file that sets it; warns when a file systemd reads could
    not be read (a link, a FIFO). Raises VerifyError for entries of the wrong shape.
    """
    if not isinstance(entries, (list, tuple)):
        raise VerifyError(
            f"host {host}: effective is {type(entries).__name__}, not a list; pass the effective "
            "list of host_apply's units layer"
        )
    subjects = _subjects(plan)
    out = _Checks(host)
    for entry in sorted(
        (e for e in entries if isinstance(e, dict) and e.get("unit")), key=lambda e: e["unit"]
    ):
        unit = entry["unit"]
        subject = subjects.get(unit, unit)
        planned = {
            prop: item.get("planned")
            for prop, item in sorted((entry.get("properties") or {}).items())
            if isinstance(item, dict)
        }
        measured = {
            prop: item.get("effective")
            for prop, item in sorted((entry.get("properties") or {}).items())
            if isinstance(item, dict)
        }
        problems = _effective_problems(entry)
        if problems:
            out.add(
                "effective_units",
                subject,
                "fail",
                measured,
                planned,
                "setting",
                f"{unit}: " + "; ".join(problems.values()) + "; " + _EFFECTIVE_FIX,
                ", ".join(sorted(problems)) + " overridden",
            )
        elif entry.get("unread"):
            paths = ", ".join(str(item.get("path")) for item in entry["unread"])
            out.add(
                "effective_units",
                subject,
                "warn",
                measured,
                planned,
                "setting",
                f"{unit}: the planned settings are in effect; {paths} is a symbolic link to a "
                "file that does not exist, which systemd ignores",
                "dangling link(s)",
            )
        else:
            out.add(
                "effective_units",
                subject,
                "pass",
                measured,
                planned,
                "setting",
                f"{unit}: {len(planned)} planned setting(s) in effect",
            )
    return out.out


def _effective_bindings(out: _Checks, placements: list, entries) -> None:
    """Fail cpus_binding / mems_binding of services whose effective settings differ."""
    by_unit = {e.get("unit"): e for e in entries or () if isinstance(e, dict)}
    for placement in placements:
        entry = by_unit.get(placement.get("unit"))
        if entry is None:
            continue
        problems = _effective_problems(entry)
        name = str(placement.get("name"))
        for kind, props in (("cpus", CPU_PROPERTIES), ("mems", MEM_PROPERTIES)):
            texts = [problems[p] for p in sorted(problems) if p in props or p == "LoadState"]
            if not texts:
                continue
            check = f"{kind}_binding"
            planned = format_cpulist(placement.get(kind) or ())
            message = (
                f"{entry['unit']}: " + "; ".join(texts) + "; the service runs (or will run after "
                "its next restart) outside the plan's binding: " + _EFFECTIVE_FIX
            )
            for index, old in enumerate(out.out):
                if old.check == check and old.subject == name:
                    out.out[index] = Check(
                        out.host,
                        check,
                        name,
                        "fail",
                        old.measured,
                        planned,
                        "cpulist",
                        message,
                        EFFECTIVE_DIFFER,
                    )
                    break


def _find_service(services: list, placement: dict) -> Optional[dict]:
    for key in ("name", "unit"):
        for entry in services:
            if isinstance(entry, dict) and entry.get(key) == placement.get(key):
                return entry
    return None


def _check_binding(out: _Checks, name: str, kind: str, binding: dict, planned: list) -> None:
    check = f"{kind}_binding"
    field = "Cpus_allowed_list" if kind == "cpus" else "Mems_allowed_list"
    allowed = binding.get(f"{kind}_allowed")
    flag = binding.get(f"{kind}_ok")
    if allowed is None and flag is None:
        out.skip(check, name, f"no {field} measured", format_cpulist(planned), "cpulist")
        return
    ok = flag is not False
    if allowed is not None:
        ok = ok and set(allowed) <= set(planned)
    measured = None if allowed is None else format_cpulist(allowed)
    target = format_cpulist(planned)
    missing = format_cpulist(set(planned) - set(allowed)) if ok and allowed is not None else ""
    if missing:
        _narrower(out, check, name, field, (measured, target, missing))
        return
    if ok:
        out.add(check, name, "pass", measured, target, "cpulist", f"{field} within {target}")
        return
    outside = format_cpulist(set(allowed or ()) - set(planned))
    text = f"{field} {measured} is not within the plan's {target or '(none)'}"
    if outside:
        text += f" ({outside} outside)"
    fix = (
        "; restart the unit so systemd applies its CPUAffinity/AllowedCPUs"
        if kind == "cpus"
        else "; restart the unit so systemd applies AllowedMemoryNodes (NUMAPolicy=bind alone "
        "leaves Mems_allowed_list at all nodes)"
    )
    out.add(
        check,
        name,
        "fail",
        measured,
        target,
        "cpulist",
        text + fix,
        f"{measured} not within {target}",
    )


def _narrower(out: _Checks, check: str, name: str, field: str, lists: tuple) -> None:
    """Warn that no process of a service may use some of its planned CPUs or memory nodes.

    ``lists``: (measured, planned, missing) as cpulist text. The kernel narrowed the binding
    (a cgroup cpuset above the unit, see ansible_facts.numa.allowed) or the service narrowed
    its own affinity: either way it does not run as planned, so the check does not pass.
    """
    measured, target, missing = lists
    what = "CPUs" if check == "cpus_binding" else "memory nodes"
    out.add(
        check,
        name,
        "warn",
        measured,
        target,
        "cpulist",
        f"{field} {measured} is narrower than the plan's {target}: no process may use planned "
        f"{what} {missing}; the kernel narrowed the binding (a cgroup cpuset above the unit: "
        "see ansible_facts.numa.allowed) or the service narrowed its own affinity. Widen that "
        "cpuset, or gather facts and plan again so the plan stays inside it",
        f"{measured} narrower than {target} ({missing} missing)",
    )


def _spill_text(record: dict) -> str:
    """'spilled (numafleet-guard moved it to node 0 at 2026-01-31T12:00:00Z)' of a spilled entry."""
    nodes = [str(n) for n in record.get("to") or ()]
    where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {','.join(nodes) or '?'}"
    since = record.get("since")
    when = (
        datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if isinstance(since, (int, float)) and not isinstance(since, bool)
        else "an unknown time"
    )
    return f"spilled (numafleet-guard moved it to {where} at {when})"


def _check_offnode(
    out: _Checks, name: str, entry: dict, target_pct: float, spill: Optional[dict] = None
) -> None:
    share = entry.get("offnode_share")
    if share is None:
        out.skip(
            "offnode_share",
            name,
            "no anonymous or hugetlb pages resident",
            target_pct,
            "pct",
        )
        return
    pct = share * 100
    if share > target_pct / 100 and isinstance(spill, dict):
        text = _spill_text(spill)
        out.add(
            "offnode_share",
            name,
            "warn",
            pct,
            target_pct,
            "pct",
            f"{_pct(pct)}% of its anonymous and hugetlb memory is on nodes outside the plan's "
            f"mems (target at most {_pct(target_pct)}%): {text}, as numafleet_memory_act: "
            "migrate does when its node is over the act threshold; it ends when the pages "
            "come back or the service restarts",
            f"{_versus(pct, '>', target_pct)}, {text}",
        )
    elif share > target_pct / 100:
        out.add(
            "offnode_share",
            name,
            "fail",
            pct,
            target_pct,
            "pct",
            f"{_pct(pct)}% of its anonymous and hugetlb memory is on nodes outside the plan's "
            f"mems (target at most {_pct(target_pct)}%); restart it under the planned binding, or "
            "look for memory allocated before the binding applied",
            _versus(pct, ">", target_pct),
        )
    else:
        out.add(
            "offnode_share",
            name,
            "pass",
            pct,
            target_pct,
            "pct",
            f"{_pct(pct)}% off-node (target at most {_pct(target_pct)}%)",
            _versus(pct, "<=", target_pct),
        )


def _check_gpus(out: _Checks, name: str, placement: dict, entry: dict) -> None:
    planned = [gpu for gpu in placement.get("gpus") or () if isinstance(gpu, dict)]
    local = set(placement.get("nodes") or ()) | set(placement.get("mems") or ())
    target = sorted(local)
    seen = {
        gpu.get("address"): gpu
        for gpu in entry.get("gpu_locality") or ()
        if isinstance(gpu, dict) and gpu.get("address")
    }
    measured: dict = {}
    far, unknown, missing = [], [], []
    for gpu in sorted(planned, key=lambda item: str(item.get("address"))):
        address = gpu.get("address")
        got = seen.get(address)
        if got is None:
            missing.append(address)
            measured[address] = None
            continue
        node = got.get("node") if "node" in got else None
        measured[address] = node
        if node is None:
            if got.get("ok") is False:
                far.append(f"{address} (node unknown)")
            else:
                unknown.append(address)
        elif node not in local:
            far.append(f"{address} on node{node}")
    if far or missing:
        parts = []
        if far:
            parts.append(f"{', '.join(far)} not on the placement's nodes {format_cpulist(local)}")
        if missing:
            parts.append(f"{', '.join(missing)} not found on the host")
        out.add(
            "gpu_locality",
            name,
            "fail",
            measured,
            target,
            "node",
            "; ".join(parts) + "; gather facts again and re-plan",
            "; ".join(parts),
        )
    elif unknown:
        out.add(
            "gpu_locality",
            name,
            "warn",
            measured,
            target,
            "node",
            f"NUMA node of {', '.join(unknown)} is unknown (sysfs numa_node is -1): locality "
            "cannot be checked",
            f"{', '.join(unknown)} node unknown",
        )
    else:
        out.add(
            "gpu_locality",
            name,
            "pass",
            measured,
            target,
            "node",
            f"{len(measured)} GPU(s) on node(s) {format_cpulist(local)}",
        )


def _check_waiting(out: _Checks, placement: dict, entry: Optional[dict], checks) -> bool:
    """Whether placement waits for its MIG instance (waits_for); then ``running`` warns with the
    reason (not started by design: neither a failure nor a pass) and the other checks skip."""
    waits = placement.get("waits_for")
    if not isinstance(waits, dict):
        return False
    name, unit = str(placement.get("name")), placement.get("unit")
    why = f"{_WAITS_PREFIX}{waits.get('mig_instance')}: {waits.get('reason')}"
    running = bool(entry and entry.get("running"))
    message = (
        f"{unit} runs although it {why}; it has no MIG device: stop it until the instance exists"
        if running
        else f"{unit} is not started: it {why}; it is started once the instance exists"
    )
    out.add("running", name, "warn", running, False, "bool", message, why)
    for check in checks[1:]:
        out.skip(check, name, why)
    return True


def _check_service(
    out: _Checks,
    placement: dict,
    entry: Optional[dict],
    thresholds: dict,
    spilled: Optional[dict] = None,
) -> None:
    name = str(placement.get("name"))
    has_gpus = bool(placement.get("gpus"))
    checks = SERVICE_CHECKS if has_gpus else SERVICE_CHECKS[:-1]
    if _check_waiting(out, placement, entry, checks):
        return
    if entry is None:
        out.add(
            "running",
            name,
            "fail",
            None,
            True,
            "bool",
            f"no measurement for {placement.get('unit')}; pass every planned service to "
            "numafleet.tuning.numa_locality_info",
            "not measured",
        )
        for check in checks[1:]:
            out.skip(check, name, "service not measured")
        return
    pids = entry.get("pids") or []
    if not entry.get("running"):
        out.add(
            "running",
            name,
            "fail",
            False,
            True,
            "bool",
            f"{placement.get('unit')} is not running (no processes in its cgroup); start it "
            f"with systemctl start {placement.get('unit')}",
            "not running",
        )
        for check in checks[1:]:
            out.skip(check, name, "service not running")
        return
    out.add(
        "running", name, "pass", True, True, "bool", f"{placement.get('unit')}: {len(pids)} PID(s)"
    )
    binding = entry.get("binding") or {}
    _check_binding(out, name, "cpus", binding, list(placement.get("cpus") or ()))
    _check_binding(out, name, "mems", binding, list(placement.get("mems") or ()))
    _check_offnode(out, name, entry, thresholds["cross_node_target_pct"], (spilled or {}).get(name))
    if has_gpus:
        _check_gpus(out, name, placement, entry)


def _check_memory(out: _Checks, node: dict, thresholds: dict) -> None:
    subject = f"node{node.get('id')}"
    total, used = node.get("memory_total_kb"), node.get("memory_used_kb")
    warn, fail = thresholds["memory_warn_pct"], thresholds["memory_fail_pct"]
    if total and used is not None:
        pct = used * 100 / total
        # Integer comparison: exactly at a threshold counts as reaching it.
        at_fail, at_warn = used * 100 >= fail * total, used * 100 >= warn * total
    elif node.get("memory_used_pct") is not None:
        pct = node["memory_used_pct"]
        at_fail, at_warn = pct >= fail, pct >= warn
    else:
        out.skip("memory_used", subject, "no memory use measured", warn, "pct")
        return
    if at_fail:
        status, target, op = "fail", fail, ">="
    elif at_warn:
        status, target, op = "warn", warn, ">="
    else:
        status, target, op = "pass", warn, "<"
    message = f"{_pct(pct)}% of its memory in use"
    if status != "pass":
        message += (
            f" (warn at {_pct(warn)}%, fail at {_pct(fail)}%); move a placement or lower its memory"
        )
    out.add("memory_used", subject, status, pct, target, "pct", message, _versus(pct, op, target))


def _pools(entries, count_key: str) -> dict:
    pools: dict = {}
    for entry in entries or ():
        if isinstance(entry, dict) and entry.get("size_kb") is not None:
            pools[int(entry["size_kb"])] = int(entry.get(count_key) or 0)
    return pools


def _check_hugepages(out: _Checks, nid, planned: dict, node: Optional[dict]) -> None:
    subject = f"node{nid}"
    target = {str(size): count for size, count in sorted(planned.items())}
    if node is None:
        out.add(
            "hugepages_total",
            subject,
            "fail",
            None,
            target,
            "pages",
            f"node {nid} has hugepage pools in the plan but was not measured",
            "not measured",
        )
        return
    reserved = _pools(node.get("hugepages"), "total")
    measured = {str(size): count for size, count in sorted(reserved.items()) if count}
    short = [
        f"{_size(size)}: {reserved.get(size, 0)} != {count}"
        for size, count in sorted(planned.items())
        if reserved.get(size, 0) != count
    ]
    extra = [
        f"{_size(size)}: {count} reserved, none planned"
        for size, count in sorted(reserved.items())
        if count and size not in planned
    ]
    if short:
        out.add(
            "hugepages_total",
            subject,
            "fail",
            measured,
            target,
            "pages",
            "reserved hugepages differ from the plan (reserved != planned): "
            + ", ".join(short + extra)
            + "; reserve the planned counts (numafleet.tuning.numa_hugepages) or re-plan",
            ", ".join(short),
        )
    elif extra:
        out.add(
            "hugepages_total",
            subject,
            "warn",
            measured,
            target,
            "pages",
            f"pools outside the plan hold memory: {', '.join(extra)}",
            ", ".join(extra),
        )
    else:
        out.add(
            "hugepages_total",
            subject,
            "pass",
            measured,
            target,
            "pages",
            "reserved hugepages match the plan",
        )


def evaluate(
    host: str,
    plan: dict,
    measured: Optional[dict],
    thresholds: Optional[dict] = None,
    render_mode: bool = False,
    current_files: Optional[dict] = None,
    render_options: Optional[dict] = None,
    unit_states: Optional[list] = None,
    effective: Optional[list] = None,
) -> list[Check]:
    """The checks of one host; raises VerifyError for bad thresholds or inputs of the wrong shape.

    ``measured`` is numa_locality_info's result ({services, nodes}, and ``guard`` when host_apply
    read the memory guard's files: its ``spilled`` map turns an offnode_share failure into a
    warning); it may be None in render mode.
    ``current_files`` is {host path: text or None when absent} of the rendered files (as
    ``units.read_files`` returns them); None skips ``rendered_units``. ``render_options`` are the
    keyword arguments of ``units.render_files`` (header, hardening_default, unit_dir).
    ``unit_states`` is pinned_units' check-mode ``files`` list; when given it decides
    ``rendered_units`` (``rendered_unit_checks``) instead of ``current_files``.
    ``effective`` is the units layer's ``effective`` list (host_apply); when given it adds the
    ``effective_units`` checks and, outside render mode, fails the binding checks of services
    whose effective settings differ from the plan.
    """
    limits = parse_thresholds(thresholds)
    plan = _mapping(plan, "plan", host)
    out = _Checks(host)
    if unit_states is not None:
        out.out.extend(rendered_unit_checks(host, unit_states))
    elif current_files is None:
        out.skip("rendered_units", "units", "no rendered files given", "matches", "file")
    else:
        _check_rendered(
            out, plan, _mapping(current_files, "current_files", host), render_options or {}
        )
    if effective is not None:
        out.out.extend(effective_unit_checks(host, plan, effective))
    placements = sorted(
        (p for p in plan.get("placements") or () if isinstance(p, dict)),
        key=lambda p: str(p.get("name")),
    )
    plan_nodes = sorted(
        (n for n in plan.get("nodes") or () if isinstance(n, dict) and n.get("id") is not None),
        key=lambda n: n["id"],
    )
    planned_pools = {n["id"]: _pools(n.get("hugepages"), "count") for n in plan_nodes}
    if render_mode:
        for placement in placements:
            has_gpus = bool(placement.get("gpus"))
            checks = SERVICE_CHECKS if has_gpus else SERVICE_CHECKS[:-1]
            # A waiting placement is not started in render mode either: running warns so.
            if _check_waiting(out, placement, None, checks):
                continue
            for check in checks:
                out.skip(check, str(placement.get("name")), RENDER_MODE_REASON)
        for node in plan_nodes:
            if node.get("memory_kb"):
                out.skip("memory_used", f"node{node['id']}", RENDER_MODE_REASON)
            if any(planned_pools[node["id"]].values()):
                out.skip("hugepages_total", f"node{node['id']}", RENDER_MODE_REASON)
        return out.out
    if measured is None:
        raise VerifyError(
            f"host {host}: no measurement outside render mode; pass the result of "
            "numafleet.tuning.numa_locality_info"
        )
    measured = _mapping(measured, "measured", host)
    services = [s for s in measured.get("services") or () if isinstance(s, dict)]
    guard = measured.get("guard")
    spilled = guard.get("spilled") if isinstance(guard, dict) else None
    spilled = spilled if isinstance(spilled, dict) else {}
    for placement in placements:
        _check_service(out, placement, _find_service(services, placement), limits, spilled)
    if effective is not None:
        _effective_bindings(out, placements, effective)
    nodes = {
        n["id"]: n
        for n in measured.get("nodes") or ()
        if isinstance(n, dict) and n.get("id") is not None
    }
    for nid in sorted(nodes):
        node = nodes[nid]
        if node.get("memory_total_kb") or node.get("memory_used_pct") is not None:
            _check_memory(out, node, limits)
    for nid in sorted(set(nodes) | set(planned_pools)):
        planned = {size: count for size, count in planned_pools.get(nid, {}).items() if count}
        node = nodes.get(nid)
        reserved = _pools(node.get("hugepages"), "total") if node else {}
        if planned or any(reserved.values()):
            _check_hugepages(out, nid, planned, node)
    return out.out


# --- the memory guard ----------------------------------------------------------------------------


def _guard_bool(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0"):
        return False
    raise VerifyError(f"{name} is {value!r}; set it to true or false")


def _guard_int(value, name: str, low: int, high: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise VerifyError(f"{name} is {value!r}; set it to an integer from {low} to {high}")
    return value


def parse_guard(guard: Optional[dict]) -> dict:
    """numa_verify's ``guard`` option with defaults filled in; raises VerifyError naming the host
    variable and the fix.

    Keys (each from a host variable, see GUARD_OPTION): enabled (numafleet_memory_guard, default
    true), warn_pct (80) and act_pct (90) (numafleet_memory_warn_pct / _act_pct, integers 1-100,
    warn below act), act (numafleet_memory_act: reclaim, throttle or migrate) and interval_s
    (numafleet_memory_guard_interval, seconds 1-3600, default 15). None or {}: all defaults.
    A missing or null key takes its default; numeric and boolean strings are accepted.
    """
    if guard is None:
        guard = {}
    if not isinstance(guard, dict):
        raise VerifyError(
            f"verify option guard is {type(guard).__name__}, not a mapping; give a mapping with "
            f"any of {', '.join(GUARD_OPTION)}"
        )
    unknown = sorted(str(key) for key in guard if key not in GUARD_OPTION)
    if unknown:
        raise VerifyError(
            f"verify option guard has unknown key(s) {', '.join(unknown)}; the keys are "
            f"{', '.join(GUARD_OPTION)}"
        )
    out = {}
    for key, (name, default, allowed) in GUARD_OPTION.items():
        value = guard.get(key)
        value = default if value is None else value
        if key == "enabled":
            out[key] = _guard_bool(value, name)
        elif key == "act":
            if value not in GUARD_ACTS:
                raise VerifyError(f"{name} is {value!r}; use one of {', '.join(GUARD_ACTS)}")
            out[key] = value
        else:
            out[key] = _guard_int(value, name, *allowed)
    if out["warn_pct"] >= out["act_pct"]:
        raise VerifyError(
            f"numafleet_memory_warn_pct ({out['warn_pct']}) is not below numafleet_memory_act_pct "
            f"({out['act_pct']}); set the warn threshold below the act threshold"
        )
    return out


def _guard_config(out: _Checks, want: dict, read: dict) -> None:
    path = str(read.get("config_file") or "/etc/numafleet/guard.json")
    got = read.get("settings")
    if not isinstance(got, dict):
        reason = read.get("config_reason") or "has no settings"
        out.add(
            "guard_config",
            path,
            "fail",
            None,
            want,
            "settings",
            f"{path} {reason}: the guard runs without this host's settings; run site.yml (role "
            "numafleet.tuning.memory_guard) to write it",
            reason,
        )
        return
    differ = []
    for key in ("warn_pct", "act_pct", "act", "interval_s"):
        mine, theirs = want[key], got.get(key)
        same = (
            theirs == mine
            if key == "act"
            else isinstance(theirs, (int, float))
            and not isinstance(theirs, bool)
            and theirs == mine
        )
        if not same:
            differ.append(f"{key} is {theirs!r} there, {GUARD_OPTION[key][0]} is {mine!r}")
    measured = {key: got.get(key) for key in ("warn_pct", "act_pct", "act", "interval_s")}
    if differ:
        out.add(
            "guard_config",
            path,
            "fail",
            measured,
            want,
            "settings",
            f"{path}: {'; '.join(differ)}; run site.yml to write it (the guard reads it again "
            "by itself, no restart)",
            ", ".join(d.split(" there")[0] for d in differ),
        )
    else:
        out.add(
            "guard_config",
            path,
            "pass",
            measured,
            want,
            "settings",
            f"{path} has this host's settings (warn {want['warn_pct']}%, act "
            f"{want['act_pct']}%, {want['act']}, every {want['interval_s']} s)",
        )


def _guard_service(out: _Checks, read: dict) -> None:
    active = read.get("active")
    if active is None:
        reason = read.get("active_reason") or "its state is unknown"
        out.skip(
            "guard_service", GUARD_UNIT, f"systemctl was not asked: {reason}", "active", "state"
        )
    elif active == "active":
        out.add(
            "guard_service",
            GUARD_UNIT,
            "pass",
            active,
            "active",
            "state",
            f"{GUARD_UNIT} is active",
        )
    else:
        out.add(
            "guard_service",
            GUARD_UNIT,
            "fail",
            active,
            "active",
            "state",
            f"{GUARD_UNIT} is {active}, so nothing watches the nodes' memory; journalctl -u "
            f"numafleet-guard says why, then systemctl start {GUARD_UNIT} (or run site.yml)",
            active,
        )


def _guard_last_run(out: _Checks, want: dict, read: dict) -> None:
    limit = GUARD_STALE_INTERVALS * want["interval_s"]
    last, now = read.get("last_run"), read.get("read_at")
    path = read.get("state_file") or "/run/numafleet-guard/state.json"
    if not isinstance(last, (int, float)) or not isinstance(now, (int, float)):
        reason = read.get("state_reason") or "has no last_run"
        out.add(
            "guard_last_run",
            GUARD_UNIT,
            "fail",
            None,
            limit,
            "s",
            f"{path} {reason}: the guard has not finished a round since the host booted; "
            f"journalctl -u numafleet-guard says why",
            f"state file {reason}",
        )
        return
    age = max(now - last, 0.0)
    shown = f"{age:.0f} s"
    if age > limit:
        out.add(
            "guard_last_run",
            GUARD_UNIT,
            "fail",
            round(age, 1),
            limit,
            "s",
            f"the guard's last round was {shown} ago, more than {GUARD_STALE_INTERVALS} x "
            f"{want['interval_s']} s: it is stuck or stopped; journalctl -u numafleet-guard "
            "says why",
            f"{shown} > {limit} s",
        )
    else:
        out.add(
            "guard_last_run",
            GUARD_UNIT,
            "pass",
            round(age, 1),
            limit,
            "s",
            f"the guard's last round was {shown} ago (at most {limit} s)",
            f"{shown} <= {limit} s",
        )


def guard_checks(
    host: str,
    guard: Optional[dict],
    measured: Optional[dict],
    render_mode: bool = False,
    plan: Optional[dict] = None,
) -> list[Check]:
    """The memory guard's checks of one host, only where it is enabled and the plan has
    placements (the role installs nothing on a host without any); raises VerifyError.

    ``guard`` is numa_verify's option (parse_guard); ``measured`` host_apply's measurement, whose
    ``guard`` (locality.read_guard: service state, the config's settings, the state file's
    last run) is read. Checks, subject numafleet-guard.service unless said:
    ``guard_service`` (systemctl is-active says active), ``guard_config`` (subject the config
    file: its warn_pct, act_pct, act and interval_s equal the host's) and ``guard_last_run``
    (the last round at most 3 x interval_s ago, by the host's clock). Skipped in render mode and
    when the measurement did not read the guard.
    """
    want = parse_guard(guard)
    out = _Checks(host)
    if not want["enabled"] or (isinstance(plan, dict) and not plan.get("placements")):
        return out.out
    read = (measured or {}).get("guard") if isinstance(measured, dict) else None
    if render_mode or not isinstance(read, dict):
        reason = (
            RENDER_MODE_REASON
            if render_mode
            else "the measurement did not read the guard's files (host_apply measure.guard)"
        )
        out.skip("guard_service", GUARD_UNIT, reason, "active", "state")
        out.skip("guard_config", "/etc/numafleet/guard.json", reason, want, "settings")
        out.skip(
            "guard_last_run", GUARD_UNIT, reason, GUARD_STALE_INTERVALS * want["interval_s"], "s"
        )
        return out.out
    _guard_service(out, read)
    _guard_config(out, want, read)
    _guard_last_run(out, want, read)
    return out.out


# --- reports -----------------------------------------------------------------------------------


def _counts(checks: list) -> dict:
    counts = dict.fromkeys(STATUSES, 0)
    for check in checks:
        counts[check.status] += 1
    return counts


def _status(counts: dict) -> str:
    for status in _SEVERITY:
        if counts.get(status):
            return status
    return "skipped"


def not_applicable(check) -> bool:
    """Whether ``check`` (a Check) was skipped because it does not apply to the host: a layer
    check (LAYER_CHECKS) of a layer the host does not have (no NVIDIA GPU for mig_layout and
    mps_settings, no managed hugepage pool, IRQ pinning off). Such a check is not "not run"."""
    return check.status == "skipped" and check.check in LAYER_CHECKS


def not_run(checks) -> list:
    """The skipped checks of ``checks`` (Check objects) that could have run: every skipped check
    but the ones that do not apply (``not_applicable``)."""
    return [check for check in checks if check.status == "skipped" and not not_applicable(check)]


def status_text(checks) -> str:
    """The status of ``checks`` (Check objects) for people: 'pass', or with the checks not run,
    'pass (render: 27 of 34 checks not run)' ('render: ' when checks were skipped because render
    mode measures nothing). Checks that do not apply to the host (``not_applicable``) are left out
    of both numbers."""
    status = _status(_counts(checks))
    skipped = not_run(checks)
    if not skipped:
        return status
    render = any(check.detail == RENDER_MODE_REASON for check in skipped)
    total = sum(1 for check in checks if not not_applicable(check))
    return f"{status} ({'render: ' if render else ''}{len(skipped)} of {total} checks not run)"


def require_runtime(checks) -> list:
    """``checks`` (Check objects) with every skipped runtime check (SERVICE_CHECKS, NODE_CHECKS,
    GUARD_CHECKS: what only a measurement of the running host can show) turned into a failure:
    numafleet_verify_require_runtime is true, so not run is not good enough. The static checks and
    the layer checks (LAYER_CHECKS, skipped when a layer does not apply) stay skipped, and so do the
    checks of a placement that waits for its MIG instance (not started by design)."""
    out = []
    for check in checks:
        waits = (check.detail or "").startswith(_WAITS_PREFIX)
        if check.status == "skipped" and check.check in RUNTIME_CHECKS and not waits:
            check = Check(
                check.host,
                check.check,
                check.subject,
                "fail",
                check.measured,
                check.target,
                check.unit,
                f"not run ({check.detail or check.message}); "
                "numafleet_verify_require_runtime is true: run verify on the host itself (not in "
                "render mode), or set it to false",
                "not run",
            )
        out.append(check)
    return out


def _by_host(checks) -> dict:
    hosts: dict = {}
    for check in map(as_check, checks):
        hosts.setdefault(check.host, []).append(check)
    return dict(sorted(hosts.items()))


def summary_line(host: str, checks) -> str:
    """'<host>: 12 passed, 1 failed, 3 skipped; FAIL offnode_share embed 7.1% > 2%' for one host,
    with '; 1 waiting for a MIG instance (classify)' after the counts when placements wait for
    their MIG instance (plan waits_for), and '; status pass (N of M checks not run)' when checks
    were skipped."""
    mine = [check for check in map(as_check, checks) if check.host == host]
    counts = _counts(mine)
    parts = [f"{counts['pass']} passed"]
    if counts["warn"]:
        parts.append(f"{counts['warn']} warned")
    parts += [f"{counts['fail']} failed", f"{counts['skipped']} skipped"]
    line = f"{host}: {', '.join(parts)}"
    waiting = sorted(
        check.subject
        for check in mine
        if check.check == "running" and str(check.detail or "").startswith(_WAITS_PREFIX)
    )
    if waiting:
        line += f"; {len(waiting)} waiting for a MIG instance ({', '.join(waiting)})"
    if not_run(mine):
        line += f"; status {status_text(mine)}"
    problems = [c for c in mine if c.status == "fail"] + [c for c in mine if c.status == "warn"]
    notes = [
        f"{check.status.upper()} {check.check} {check.subject}"
        + (f" {check.detail}" if check.detail else "")
        for check in problems[:_SUMMARY_PROBLEMS]
    ]
    if len(problems) > _SUMMARY_PROBLEMS:
        notes.append(f"and {len(problems) - _SUMMARY_PROBLEMS} more")
    return "; ".join([line] + notes)


def _generated_at(run: Optional[dict]) -> str:
    value = (run or {}).get("generated_at")
    if not isinstance(value, str) or not value:
        raise VerifyError(
            f"verify run has generated_at {value!r}; pass an ISO 8601 time such as "
            "2025-01-31T12:00:00Z (ansible_date_time.iso8601 on the controller)"
        )
    return value


def _timestamp(run: Optional[dict]) -> float:
    text = _generated_at(run)
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise VerifyError(
            f"verify run has generated_at {text!r}, which is not ISO 8601; pass a time such as "
            "2025-01-31T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def as_json_report(run: dict, checks) -> dict:
    """The JSON-ready report of schema numafleet.verify/1 (see the module docstring); raises VerifyError."""
    generated_at = _generated_at(run)
    _timestamp(run)
    hosts: dict = {}
    totals = dict.fromkeys(STATUSES, 0)
    by_status = dict.fromkeys(STATUSES, 0)
    for host, mine in _by_host(checks).items():
        counts = _counts(mine)
        status = _status(counts)
        hosts[host] = {
            "status": status,
            "status_text": status_text(mine),
            "not_run": len(not_run(mine)),
            "summary": summary_line(host, mine),
            "counts": counts,
            "checks": [check.as_dict() for check in mine],
        }
        by_status[status] += 1
        for key, value in counts.items():
            totals[key] += value
    return {
        "schema": SCHEMA,
        "generated_at": generated_at,
        "run": {key: value for key, value in sorted(run.items()) if key != "generated_at"},
        "status": _status(by_status),
        "status_text": _run_status_text(by_status, totals),
        "hosts": hosts,
        "totals": {
            "hosts": len(hosts),
            "checks": sum(totals.values()),
            **totals,
            "hosts_by_status": by_status,
        },
    }


def _run_status_text(by_status: dict, totals: dict) -> str:
    status = _status(by_status)
    if not totals["skipped"]:
        return status
    return f"{status} ({totals['skipped']} of {sum(totals.values())} checks not run)"


def _xml_text(value) -> str:
    """Text XML 1.0 can carry: other control characters become U+FFFD."""
    text = str(value)
    return "".join(
        ch
        if ch in "\t\n\r"
        or ("\x20" <= ch <= "\ud7ff")
        or ("\ue000" <= ch <= "\ufffd")
        or ch > "\uffff"
        else "\ufffd"
        for ch in text
    )


def as_junit_xml(checks, run: Optional[dict] = None) -> str:
    """JUnit XML text: a testsuite per host, a testcase per host x check x subject."""
    root = ET.Element("testsuites", name="numafleet verify")
    totals = dict.fromkeys(STATUSES, 0)
    stamp = None if run is None else _generated_at(run)
    for host, mine in _by_host(checks).items():
        counts = _counts(mine)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_xml_text(host),
            tests=str(len(mine)),
            failures=str(counts["fail"]),
            errors="0",
            skipped=str(counts["skipped"]),
            time="0",
        )
        if stamp is not None:
            suite.set("timestamp", _xml_text(stamp))
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="warnings", value=str(counts["warn"]))
        ET.SubElement(properties, "property", name="status", value=_status(counts))
        ET.SubElement(properties, "property", name="status_text", value=status_text(mine))
        ET.SubElement(properties, "property", name="not_run", value=str(len(not_run(mine))))
        for check in mine:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=_xml_text(f"{host}.{check.check}"),
                name=_xml_text(check.subject),
                time="0",
            )
            if check.status == "fail":
                failure = ET.SubElement(
                    case, "failure", message=_xml_text(check.message), type=check.check
                )
                failure.text = _xml_text(
                    f"measured {check.measured!r} {check.unit}, target {check.target!r}"
                )
            elif check.status == "skipped":
                ET.SubElement(case, "skipped", message=_xml_text(check.message))
            elif check.status == "warn":
                ET.SubElement(case, "system-out").text = _xml_text(f"WARN: {check.message}")
        for key, value in counts.items():
            totals[key] += value
    root.set("tests", str(sum(totals.values())))
    root.set("failures", str(totals["fail"]))
    root.set("errors", "0")
    root.set("skipped", str(totals["skipped"]))
    root.set("time", "0")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _label(value) -> str:
    """A label value escaped per the text exposition format (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(number) -> str:
    return repr(float(number))


def _labels(pairs: tuple) -> str:
    return "{" + ",".join(f'{key}="{_label(value)}"' for key, value in pairs) + "}"


METRICS = {
    "numafleet_check_status": "1 for the status a verify check has, 0 for the other statuses "
    "(pass, fail, warn, skipped)",
    "numafleet_verify_checks": "Number of verify checks of the host by status",
    "numafleet_verify_checks_not_run": "Number of verify checks of the host that were not run "
    "(skipped: render mode, nothing to measure)",
    "numafleet_verify_last_run_timestamp_seconds": "Unix time the verify run was generated",
    "numafleet_offnode_share_ratio": "Share of a service's anonymous and hugetlb memory on nodes "
    "outside its planned mems (0-1)",
    "numafleet_remote_access_ratio": "node-load-misses / node-loads of a service's cgroup over "
    "the sampling window (perf; absent when unavailable)",
    "numafleet_node_memory_used_ratio": "Used / total memory of a NUMA node (0-1); used = "
    "MemTotal - MemFree - file LRU pages",
    "numafleet_node_allocation_miss_ratio": "numastat other_node / (local_node + other_node) of a "
    "NUMA node over the sampling window (allocations, not accesses)",
}


def as_prometheus_text(checks, measured: Optional[dict] = None, run: Optional[dict] = None) -> str:
    """Prometheus text exposition (node_exporter textfile) of checks and measurements.

    ``measured`` is {host: numa_locality_info result}; ``run`` gives generated_at for the
    last-run timestamp. Raises VerifyError for a bad generated_at.
    """
    hosts = _by_host(checks)
    families: dict = {name: [] for name in METRICS}
    for host, mine in hosts.items():
        for check in mine:
            for status in STATUSES:
                pairs = (("host", host), ("check", check.check), ("subject", check.subject))
                families["numafleet_check_status"].append(
                    (pairs + (("status", status),), 1 if check.status == status else 0)
                )
        counts = _counts(mine)
        for status in STATUSES:
            families["numafleet_verify_checks"].append(
                ((("host", host), ("status", status)), counts[status])
            )
        families["numafleet_verify_checks_not_run"].append(((("host", host),), len(not_run(mine))))
    if run is not None:
        stamp = _timestamp(run)
        for host in sorted(set(hosts) | set(measured or {})):
            families["numafleet_verify_last_run_timestamp_seconds"].append(
                ((("host", host),), stamp)
            )
    for host in sorted(measured or {}):
        result = measured[host] or {}
        if not isinstance(result, dict):
            raise VerifyError(
                f"host {host}: measured is {type(result).__name__}, not a mapping; pass "
                "{host: result of numafleet.tuning.numa_locality_info}"
            )
        services = sorted(
            (s for s in result.get("services") or () if isinstance(s, dict) and s.get("name")),
            key=lambda s: str(s["name"]),
        )
        for service in services:
            pairs = (("host", host), ("service", service["name"]))
            if service.get("offnode_share") is not None:
                families["numafleet_offnode_share_ratio"].append((pairs, service["offnode_share"]))
            remote = service.get("remote_access") or {}
            if remote.get("available") and remote.get("ratio") is not None:
                families["numafleet_remote_access_ratio"].append((pairs, remote["ratio"]))
        nodes = sorted(
            (
                n
                for n in result.get("nodes") or ()
                if isinstance(n, dict) and n.get("id") is not None
            ),
            key=lambda n: n["id"],
        )
        for node in nodes:
            pairs = (("host", host), ("node", node["id"]))
            total, used = node.get("memory_total_kb"), node.get("memory_used_kb")
            if total and used is not None:
                families["numafleet_node_memory_used_ratio"].append((pairs, used / total))
            miss = (node.get("numastat") or {}).get("miss_ratio")
            if miss is not None:
                families["numafleet_node_allocation_miss_ratio"].append((pairs, miss))
    lines = prometheus_lines(families, METRICS)
    return "\n".join(lines) + "\n" if lines else ""


def prometheus_lines(families: dict, helps: dict) -> list:
    """Text-format lines of gauge ``families`` ({name: [(label pairs, value)]}, in order).

    Each family with samples gets its HELP (``helps[name]``) and TYPE lines; a series (the same
    label pairs) appears once, the first sample winning, or the file would be invalid.
    """
    lines = []
    for name, samples in families.items():
        if not samples:
            continue
        lines.append(f"# HELP {name} {_help(helps[name])}")
        lines.append(f"# TYPE {name} gauge")
        seen = set()
        for pairs, value in samples:
            if pairs not in seen:
                seen.add(pairs)
                lines.append(f"{name}{_labels(pairs) if pairs else ''} {_value(value)}")
    return lines


# --- layer checks: host_apply's check-mode layer results against the plan ---------------------

# One named check per apply layer (host_apply's ``layers`` result, check mode), in render mode too
# (the recorded sysfs, procfs and GPU snapshot are the host there).
LAYER_CHECKS = ("hugepage_pools", "kernel_settings", "mig_layout", "mps_settings", "irq_affinity")
_NOT_RUN = (
    "host_apply did not run the {layer} layer (no NVIDIA GPU on this host for mig and mps, or the "
    "layer was left out of host_apply's layers)"
)


def _layer(states: dict, name: str) -> Optional[dict]:
    value = states.get(name)
    return value if isinstance(value, dict) else None


def _drift_reason(entry: dict) -> str:
    reason = str(entry.get("reason") or "")
    return f" ({reason})" if reason else ""


def _check_pools(out: _Checks, result: Optional[dict]) -> None:
    if result is None:
        out.skip("hugepage_pools", "pools", _NOT_RUN.format(layer="hugepages"))
        return
    reasons = {
        str(entry.get("setting")): entry
        for entry in result.get("drift") or ()
        if isinstance(entry, dict)
    }
    pools = [p for p in result.get("pools") or () if isinstance(p, dict)]
    if not pools:
        out.skip("hugepage_pools", "pools", "no hugepage pool is managed on this host")
        return
    for pool in pools:
        subject = f"node{pool.get('node')} {pool.get('size_kb')}kB"
        planned, actual = pool.get("desired"), pool.get("before")
        if planned == actual:
            out.add(
                "hugepage_pools", subject, "pass", actual, planned, "pages",
                "nr_hugepages matches the plan",
            )  # fmt: skip
            continue
        entry = reasons.get(f"{subject} pages") or {}
        if entry.get("pending"):  # reserved on a command line the host has not booted yet
            out.add(
                "hugepage_pools", subject, "warn", actual, planned, "pages",
                f"nr_hugepages is {actual}, the plan has {planned}{_drift_reason(entry)}",
                "reboot pending",
            )  # fmt: skip
            continue
        out.add(
            "hugepage_pools", subject, "fail", actual, planned, "pages",
            f"nr_hugepages is {actual}, the plan has {planned}{_drift_reason(entry)}; run "
            "site.yml (numafleet.tuning.host_apply) to converge it",
            f"{actual} != {planned}",
        )  # fmt: skip


def _check_settings(out: _Checks, result: Optional[dict], check: str, irq: bool) -> None:
    layer = "kernel"
    if result is None:
        out.skip(check, "kernel", _NOT_RUN.format(layer=layer))
        return
    settings = [
        s
        for s in result.get("settings") or ()
        if isinstance(s, dict) and str(s.get("name", "")).startswith("irq_affinity[") == irq
    ]
    if not settings:
        reason = (
            "IRQ pinning is off (numafleet_irq_affinity), or no IRQ of the plan's GPUs and NICs "
            "is listed in /proc/irq"
            if irq
            else "no kernel setting is managed on this host (every knob is left alone)"
        )
        out.skip(check, "irq" if irq else "kernel", reason)
        return
    for setting in settings:
        name = str(setting.get("name"))
        subject = f"irq {name[len('irq_affinity[') : -1]}" if irq else name
        planned, actual = setting.get("after"), setting.get("before")
        where = f" ({setting['source']})" if setting.get("source") else ""
        if planned == actual:
            out.add(check, subject, "pass", actual, planned, "", f"{name} matches the plan{where}")
        else:
            out.add(
                check, subject, "fail", actual, planned, "",
                f"{name} is {actual!r}{where}, the plan has {planned!r}; run site.yml to set it",
                f"{actual!r} != {planned!r}",
            )  # fmt: skip


def _check_mig(out: _Checks, result: Optional[dict]) -> None:
    if result is None:
        out.skip("mig_layout", "gpus", _NOT_RUN.format(layer="mig"))
        return
    gpus = [g for g in result.get("gpus") or () if isinstance(g, dict)]
    if not gpus:
        out.skip("mig_layout", "gpus", "no MIG GPU in the plan (numafleet_gpu_partitions)")
        return
    drift = {
        str(entry.get("setting")): entry
        for entry in result.get("drift") or ()
        if isinstance(entry, dict)
    }
    for gpu in gpus:
        subject = f"GPU {gpu.get('address')}"
        entry = drift.get(f"{subject} MIG layout")
        layout = ", ".join(
            f"{item.get('profile')}@{item.get('start')}"
            for item in gpu.get("layout") or ()
            if isinstance(item, dict)
        )
        if entry is None:
            out.add(
                "mig_layout", subject, "pass", layout, layout, "",
                "MIG mode and instances (profile@placement start) match the plan",
            )  # fmt: skip
        elif entry.get("pending"):
            out.skip(
                "mig_layout",
                subject,
                f"{entry.get('reason')}: recorded {entry.get('actual')}, planned "
                f"{entry.get('planned')}",
                entry.get("planned"),
            )
        else:
            out.add(
                "mig_layout", subject, "fail", entry.get("actual"), entry.get("planned"), "",
                f"MIG layout is {entry.get('actual')}, the plan has {entry.get('planned')}"
                f"{_drift_reason(entry)}; run site.yml to apply it",
                "layout differs",
            )  # fmt: skip


def _check_mps(out: _Checks, result: Optional[dict], render_mode: bool) -> None:
    if result is None:
        out.skip("mps_settings", "mps", _NOT_RUN.format(layer="mps"))
        return
    daemons = [d for d in result.get("daemons") or () if isinstance(d, dict)]
    if not daemons:
        out.skip("mps_settings", "mps", "no MPS daemon in the plan")
        return
    read = {
        str(entry.get("unit")): entry
        for entry in result.get("settings") or ()
        if isinstance(entry, dict)
    }
    for daemon in daemons:
        unit = str(daemon.get("unit"))
        entry = read.get(unit)
        if entry is None:
            reason = (
                "render mode: no daemon runs and none is recorded"
                if render_mode
                else "the daemon is not running (site.yml starts it with the planned defaults)"
            )
            out.skip("mps_settings", unit, reason)
            continue
        wrong, shown = [], {}
        for name in ("active_thread_percentage", "pinned_memory_limit_mib"):
            value = entry.get(name) or {}
            planned, running = value.get("planned"), value.get("running")
            shown[name] = running
            if planned is not None and running is not None and planned != running:
                wrong.append(f"{name} {running} (planned {planned})")
        planned = {
            name: (entry.get(name) or {}).get("planned")
            for name in ("active_thread_percentage", "pinned_memory_limit_mib")
        }
        if wrong:
            out.add(
                "mps_settings", unit, "fail", shown, planned, "",
                f"the running daemon's defaults differ from the plan: {', '.join(wrong)}; run "
                "site.yml to set them",
                ", ".join(wrong),
            )  # fmt: skip
        else:
            out.add(
                "mps_settings", unit, "pass", shown, planned, "",
                "the running daemon's defaults match the plan",
            )  # fmt: skip


def layer_checks(host: str, layer_states, render_mode: bool = False) -> list[Check]:
    """The LAYER_CHECKS of one host from host_apply's check-mode ``layers`` result; no I/O.

    ``layer_states``: {layer: that layer's result} (hugepages, kernel, mig, mps; what a layer
    reads is in its module's documentation). ``hugepage_pools``: per node and page size,
    ``nr_hugepages`` as read against the plan (a pool held above the plan by pages in use
    fails, with the reason); ``kernel_settings``: per managed knob (numa_balancing,
    zone_reclaim_mode, THP, numad, IRQBALANCE_BANNED_CPUS); ``mig_layout``: per planned MIG
    GPU, mode and instances by profile and placement start (render mode: a layout the
    read-only snapshot cannot show is skipped with both layouts named); ``mps_settings``: per
    planned MPS daemon, the defaults the running daemon reports; ``irq_affinity``: per IRQ of
    the plan's GPUs and NICs (/proc/irq/N/smp_affinity_list) when IRQ pinning is on. A layer
    that did not run, or has nothing to check, gives one skipped check with the reason. Raises
    VerifyError when ``layer_states`` is not a mapping.
    """
    if not isinstance(layer_states, dict):
        raise VerifyError(
            f"host {host}: layer_states is {type(layer_states).__name__}, not a mapping; pass "
            "the layers of numafleet.tuning.host_apply's check-mode result"
        )
    states = layer_states
    out = _Checks(host)
    _check_pools(out, _layer(states, "hugepages"))
    _check_settings(out, _layer(states, "kernel"), "kernel_settings", irq=False)
    _check_mig(out, _layer(states, "mig"))
    _check_mps(out, _layer(states, "mps"), render_mode)
    _check_settings(out, _layer(states, "kernel"), "irq_affinity", irq=True)
    _check_isolation(out, _layer(states, "hugepages"))
    return out.out


# Where the running kernel shows each planned set (Documentation/ABI/testing/sysfs-devices-system-cpu).
_ISOLATION_FILES = {
    "isolated": "/sys/devices/system/cpu/isolated",
    "nohz_full": "/sys/devices/system/cpu/nohz_full",
}


def _check_isolation(out: _Checks, result: Optional[dict]) -> None:
    """``kernel_isolation``, only when the hugepages layer writes kernel CPU isolation (its
    ``cpu_isolation`` result): per planned set (isolcpus= -> isolated, nohz_full=), the running
    kernel's sysfs file against the plan; warn while the reboot is pending (/proc/cmdline lacks
    the arguments), skipped when /proc/cmdline is unknown (a recording)."""
    from .cmdline import planned_isolation

    running = (result or {}).get("cpu_isolation")
    if not isinstance(running, dict):
        return
    planned = planned_isolation(result.get("kernel_args") or [])
    missing = [a for a in result.get("kernel_args_missing") or () if isinstance(a, str)]
    for key in sorted(planned):
        want, got, path = planned[key], running.get(key), _ISOLATION_FILES[key]
        want_text, got_text = format_cpulist(want), None if got is None else format_cpulist(got)
        if not running.get("cmdline_known"):
            out.skip(
                "kernel_isolation", key,
                "the running kernel command line is unknown (no /proc/cmdline: a recording)",
                want_text,
            )  # fmt: skip
        elif missing:
            out.add(
                "kernel_isolation", key, "warn", got_text, want_text, "cpus",
                f"pending reboot: /proc/cmdline lacks {' '.join(missing)}; {path} takes the "
                "planned CPUs at the next boot",
                "reboot pending",
            )  # fmt: skip
        elif got == want:
            out.add(
                "kernel_isolation", key, "pass", got_text, want_text, "cpus",
                f"{path} matches the plan",
            )  # fmt: skip
        else:
            out.add(
                "kernel_isolation", key, "fail", got_text, want_text, "cpus",
                f"{path} is {got_text!r}, the plan has {want_text!r} (numafleet_kernel_isolation), "
                "although the host booted with the arguments: another isolation setting (a "
                "second isolcpus=/nohz_full= on the command line, a kernel without "
                "CONFIG_NO_HZ_FULL) wins; check /proc/cmdline",
                f"{got_text!r} != {want_text!r}",
            )  # fmt: skip


# --- AMD partitions and visibility: the plan against the GPU facts ----------------------------

PARTITION_CHECK = "gpu_partitions"
ROCR_VARIABLE = "ROCR_VISIBLE_DEVICES"


def _amd_gpus(gpu_topology) -> list:
    """The GPU entries of gpu_topology facts that carry an ``amd`` record."""
    gpus = (gpu_topology or {}).get("gpus") if isinstance(gpu_topology, dict) else None
    return [g for g in gpus or () if isinstance(g, dict) and isinstance(g.get("amd"), dict)]


def _mode(record, key: str):
    value = record.get(key) if isinstance(record, dict) else None
    return value.get("current") if isinstance(value, dict) else None


def _rocr_uuids(placement: dict) -> Optional[list]:
    """The UUIDs of a placement's ROCR_VISIBLE_DEVICES ([] when empty), None when not set."""
    value = placement.get("rocr_visible_devices")
    if value is None:
        value = (placement.get("environment") or {}).get(ROCR_VARIABLE)
    if value is None:
        return None
    return [item.strip() for item in str(value).split(",") if item.strip()]


def _uuid_owners(gpus: list) -> dict:
    """{UUID: the GPU entry} of every AMD GPU and of each of its logical GPUs."""
    owners = {}
    for gpu in gpus:
        amd = gpu["amd"]
        for uuid in (gpu.get("uuid"), amd.get("uuid")):
            if uuid:
                owners[str(uuid)] = gpu
        for logical in amd.get("logical_gpus") or ():
            if isinstance(logical, dict) and logical.get("uuid"):
                owners[str(logical["uuid"])] = gpu
    return owners


def _render_owners(gpus: list) -> dict:
    """{/dev/dri/renderD<minor>: the GPU entry} of every AMD GPU and each of its logical GPUs."""
    owners = {}
    for gpu in gpus:
        amd = gpu["amd"]
        minors = [amd.get("render_minor")] + [
            logical.get("render_minor")
            for logical in amd.get("logical_gpus") or ()
            if isinstance(logical, dict)
        ]
        for minor in minors:
            if isinstance(minor, int):
                owners[render_node(minor)] = gpu
    return owners


def partition_checks(host: str, plan, gpu_topology) -> list[Check]:
    """The ``gpu_partitions`` checks of one host: the plan's AMD partitions and visible devices
    against the GPU facts (ansible_facts.gpu_topology, its ``amd`` records); no I/O.

    Per plan ``amd_partitions`` entry (subject ``GPU <address>``): the compute and memory
    partition the facts show (amd.compute_partition.current, amd.memory_partition.current)
    equal the planned ones: pass; a memory-partition change that waits for the driver reload
    (``reset_required``, numafleet_amd_reset_ok unset) warns "pending reset"; another
    difference, or a GPU the facts lack, fails. Per placement with a ``ROCR_VISIBLE_DEVICES``
    (subject: its name): each UUID is a GPU's or a logical GPU's UUID in the facts, and that
    GPU's NUMA node (facts ``node``) is one of the placement's planned nodes or mems; an empty
    value (the logical GPU waits for a compute partition change) is skipped, and a UUID that
    more than one logical GPU carries fails (ROCr then exposes no device). Per placement with
    ``device_allow`` (selected by render node): each render node is a GPU's or logical GPU's
    in the facts, on one of the placement's nodes. A plan without
    ``amd_partitions`` (no AMD GPU) gives no check. Raises VerifyError when plan is no mapping.
    """
    if not isinstance(plan, dict):
        raise VerifyError(
            f"host {host}: plan is {type(plan).__name__}, not a mapping; pass "
            "ansible_facts.numafleet_plan of numafleet.tuning.numa_plan"
        )
    planned = plan.get("amd_partitions")
    if planned is None:
        return []
    out = _Checks(host)
    gpus = _amd_gpus(gpu_topology)
    by_address = {str(gpu.get("address")): gpu for gpu in gpus}
    for entry in planned:
        if isinstance(entry, dict):
            _check_partition_modes(out, entry, by_address.get(str(entry.get("address"))))
    owners = _uuid_owners(gpus)
    counts = logical_uuid_counts(gpu["amd"] for gpu in gpus)
    renders = _render_owners(gpus)
    for placement in plan.get("placements") or ():
        if not isinstance(placement, dict):
            continue
        if isinstance(placement.get("device_allow"), list):
            _check_render_nodes(out, placement, renders)
        else:
            _check_visible(out, placement, owners, counts)
    return out.out


def _check_partition_modes(out: _Checks, entry: dict, gpu: Optional[dict]) -> None:
    subject = f"GPU {entry.get('address')}"
    want = {
        key: (entry.get(key) or {}).get("planned")
        for key in ("compute_partition", "memory_partition")
    }
    target = f"{want['compute_partition']}/{want['memory_partition']}"
    if gpu is None:
        out.add(
            PARTITION_CHECK, subject, "fail", None, target, "mode",
            f"{subject} is planned but not in the GPU facts; gather facts again and re-plan",
            "GPU not found",
        )  # fmt: skip
        return
    got = {key: _mode(gpu["amd"], key) for key in want}
    measured = f"{got['compute_partition']}/{got['memory_partition']}"
    differ = [key for key in want if want[key] is not None and got[key] != want[key]]
    if not differ:
        out.add(
            PARTITION_CHECK, subject, "pass", measured, target, "mode",
            "compute and memory partition match the plan",
        )  # fmt: skip
    elif entry.get("reset_required") and differ == ["memory_partition"]:
        out.add(
            PARTITION_CHECK, subject, "warn", measured, target, "mode",
            f"pending reset: the memory partition is {got['memory_partition']}, the plan has "
            f"{want['memory_partition']}, which needs an amdgpu driver reload; set "
            "numafleet_amd_reset_ok: true for site.yml to reload it (all AMD GPUs of the host)",
            "pending reset",
        )  # fmt: skip
    else:
        named = ", ".join(
            f"{key.replace('_', ' ')} {got[key]} (plan {want[key]})" for key in differ
        )
        out.add(
            PARTITION_CHECK, subject, "fail", measured, target, "mode",
            f"{named}; run site.yml to apply numafleet_gpu_partitions",
            f"{measured} != {target}",
        )  # fmt: skip


def _check_render_nodes(out: _Checks, placement: dict, renders: dict) -> None:
    name = str(placement.get("name"))
    paths = [p for p in placement["device_allow"] if str(p).startswith("/dev/dri/")]
    local = set(placement.get("nodes") or ()) | set(placement.get("mems") or ())
    measured, missing, far = {}, [], []
    for path in paths:
        gpu = renders.get(str(path))
        measured[str(path)] = None if gpu is None else gpu.get("node")
        if gpu is None:
            missing.append(str(path))
        elif gpu.get("node") is None or gpu.get("node") not in local:
            far.append(f"{path} (GPU {gpu.get('address')}, node {gpu.get('node')})")
    parts = [f"{', '.join(missing)} not a GPU's render node on the host"] if missing else []
    if far:
        parts.append(f"{', '.join(far)} not on the placement's nodes {format_cpulist(local)}")
    if not paths:
        parts.append("no render node allowed")
    _device_result(out, name, "DeviceAllow", f"{len(paths)} render node(s)", measured, local, parts)


def _device_result(
    out: _Checks, name: str, what: str, count: str, measured: dict, local: set, parts: list
) -> None:
    """The check of a placement's selected devices: fail naming ``parts`` (what is wrong),
    else pass with ``count`` (how many devices) on its nodes."""
    if parts:
        out.add(
            PARTITION_CHECK, name, "fail", measured, sorted(local), "node",
            f"{what}: " + "; ".join(parts) + "; gather facts again and re-plan",
            "; ".join(parts),
        )  # fmt: skip
    else:
        out.add(
            PARTITION_CHECK, name, "pass", measured, sorted(local), "node",
            f"{what}: {count} on the host, on node(s) {format_cpulist(local)}",
        )  # fmt: skip


def _check_visible(out: _Checks, placement: dict, owners: dict, counts: dict) -> None:
    uuids = _rocr_uuids(placement)
    if uuids is None:
        return
    name = str(placement.get("name"))
    if not uuids:
        out.skip(
            PARTITION_CHECK,
            name,
            f"{ROCR_VARIABLE} is empty: the logical GPU is created when the compute partition "
            "changes (the re-plan after the amd layer sets it)",
        )
        return
    local = set(placement.get("nodes") or ()) | set(placement.get("mems") or ())
    measured, missing, far, shared = {}, [], [], []
    for uuid in uuids:
        gpu = owners.get(uuid)
        if gpu is None:
            missing.append(uuid)
            measured[uuid] = None
            continue
        if counts.get(uuid.lower(), 0) > 1:
            shared.append(f"{uuid} ({counts[uuid.lower()]} logical GPUs)")
        node = gpu.get("node")
        measured[uuid] = node
        if node is None or node not in local:
            far.append(f"{uuid} (GPU {gpu.get('address')}, node {node})")
    parts = [f"{', '.join(missing)} not on the host"] if missing else []
    if far:
        parts.append(f"{', '.join(far)} not on the placement's nodes {format_cpulist(local)}")
    if shared:
        parts.append(f"{', '.join(shared)} shared, so ROCm exposes no device")
    _device_result(out, name, ROCR_VARIABLE, f"{len(uuids)} device(s)", measured, local, parts)
