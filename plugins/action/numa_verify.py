# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.numa_verify: one host's plan + measurement -> checks.

Nothing is sent to the host: the checks (``module_utils/numa/verify.py``) are pure and run here, on
what numa_plan, pinned_units (check mode) and numa_locality_info already returned. Documentation:
``plugins/modules/numa_verify.py``.
"""

from __future__ import annotations

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import verify
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    ControllerAction,
    plain,
)

# Thresholds and the measurement are passed through untyped: verify.parse_thresholds names the
# threshold and the fix, which Ansible's own coercion could not do.
ARGUMENT_SPEC = dict(
    plan=dict(type="dict"),
    measured=dict(type="raw"),
    unit_states=dict(type="raw"),
    layer_states=dict(type="raw"),
    effective=dict(type="raw"),
    gpu_topology=dict(type="dict"),
    render_mode=dict(type="bool", default=False),
    require_runtime=dict(type="bool", default=False),
    fail_on_failure=dict(type="bool", default=True),
    thresholds=dict(type="raw", default={}),
    guard=dict(type="raw"),
    host=dict(type="str"),
)
# Threshold variables of verify.yml, for messages.
THRESHOLD_VARS = {
    "cross_node_target_pct": "numafleet_cross_node_target_pct",
    "memory_warn_pct": "numafleet_memory_warn_pct",
    "memory_fail_pct": "numafleet_memory_fail_pct",
}
_FAILURES_SHOWN = 5


def _number(text: str):
    """A numeric string (-e numafleet_memory_warn_pct=75 arrives as text) as a number, else the text."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _thresholds(value):
    if isinstance(value, dict):
        return {
            key: _number(item.strip()) if isinstance(item, str) else item
            for key, item in value.items()
        }
    return value


def _shown(value, unit: str) -> str:
    if value is None:
        return "none"
    if unit == "pct" and isinstance(value, (int, float)):
        return f"{value:.2f}".rstrip("0").rstrip(".") + "%"
    if isinstance(value, dict):
        return ", ".join(f"{key}={item}" for key, item in value.items()) or "none"
    return str(value)


def failure_message(host: str, checks: list) -> str:
    """One message naming the host, and per failed check the subject, measured value and target."""
    failed = [check for check in checks if check.status == "fail"]
    parts = [
        # A check that was not run (numafleet_verify_require_runtime) has nothing measured.
        f"{check.check} {check.subject}: {check.message}"
        if check.detail == "not run"
        else f"{check.check} {check.subject}: measured {_shown(check.measured, check.unit)}, "
        f"target {_shown(check.target, check.unit)} ({check.message})"
        for check in failed[:_FAILURES_SHOWN]
    ]
    if len(failed) > _FAILURES_SHOWN:
        parts.append(f"and {len(failed) - _FAILURES_SHOWN} more (see the report)")
    return f"host {host}: {len(failed)} verify check(s) failed: " + "; ".join(parts)


class ActionModule(ControllerAction):
    """Evaluate one host's verify checks on the controller; returns checks, summary and status."""

    NAME = "numafleet.tuning.numa_verify"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, host, args = self.start(tmp, task_vars)

        plan = args["plan"]
        if plan is None:
            plan = (task_vars.get("ansible_facts") or {}).get("numafleet_plan")
        if not plan:
            result.update(
                failed=True,
                msg=(
                    f"host {host}: no plan to verify: ansible_facts.numafleet_plan is not set and "
                    "the plan option is empty. Run numafleet.tuning.numa_plan on the host first "
                    "(playbooks/verify.yml does), or pass plan=."
                ),
            )
            return result
        measured = args["measured"]
        if isinstance(measured, dict):
            # A registered numa_locality_info result: only its data, not changed/invocation.
            if measured.get("skipped"):
                measured = None
            else:
                kept = {key: measured.get(key) for key in ("services", "nodes")}
                if measured.get("guard") is not None:  # host_apply read the memory guard's files
                    kept["guard"] = measured["guard"]
                measured = kept
        try:
            checks = verify.evaluate(
                host,
                plain(plan),
                plain(measured),
                thresholds=plain(_thresholds(args["thresholds"])),
                render_mode=args["render_mode"],
                unit_states=plain(args["unit_states"]),
                effective=plain(args["effective"]),
            )
            if args["layer_states"] is not None:
                checks += verify.layer_checks(
                    host, plain(args["layer_states"]), render_mode=args["render_mode"]
                )
            gpu_topology = args["gpu_topology"]
            if gpu_topology is None:
                gpu_topology = (task_vars.get("ansible_facts") or {}).get("gpu_topology")
            checks += verify.partition_checks(host, plain(plan), plain(gpu_topology))
            if args["guard"] is not None:
                checks += verify.guard_checks(
                    host,
                    plain(args["guard"]),
                    plain(measured),
                    render_mode=args["render_mode"],
                    plan=plain(plan),
                )
            if args["require_runtime"]:
                checks = verify.require_runtime(checks)
            summary = verify.summary_line(host, checks)
        except NumaTuneError as exc:
            msg = str(exc)
            for key, name in THRESHOLD_VARS.items():
                msg = msg.replace(f"threshold {key} ", f"threshold {key} ({name}) ")
            if not msg.startswith(f"host {host}"):
                msg = f"host {host}: {msg}"
            result.update(failed=True, msg=msg)
            return result

        counts = dict.fromkeys(verify.STATUSES, 0)
        for check in checks:
            counts[check.status] += 1
        status = next((s for s in ("fail", "warn", "pass") if counts[s]), "skipped")
        result.update(
            changed=False,
            checks=[check.as_dict() for check in checks],
            summary=summary,
            status=status,
            status_text=verify.status_text(checks),
            not_run=counts["skipped"],
            counts=counts,
            measured=plain(measured),
        )
        if status == "fail":
            result["msg"] = failure_message(host, checks)
            result["failed"] = args["fail_on_failure"]
        return result
