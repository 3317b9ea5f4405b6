# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.numa_plan: plan a host's placements from its facts.

Nothing is sent to the host: the planner (``module_utils/numa/planner.py``) is pure and runs here,
on the facts that numa_facts / gpu_topology_facts already returned. Documentation:
``plugins/modules/numa_plan.py``.
"""

from __future__ import annotations

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mps, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import change_plan
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import PLAN_PATH
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    ControllerAction,
    plain,
)

# Placements, tenants and the policy values are passed through untyped: the planner validates
# them and names the host variable (numafleet_placements[2] (llm).memory) in its message, which
# Ansible's own type coercion could not do (it would also split a string "a,b" into a list).
ARGUMENT_SPEC = dict(
    numa=dict(type="dict"),
    gpu_topology=dict(type="dict"),
    placements=dict(type="raw", default=[]),
    tenants=dict(type="raw", default=[]),
    reserved_cpus=dict(type="raw", default=""),
    memory_headroom_pct=dict(type="raw", default=15),
    hugepages_extra=dict(type="raw", default=[]),
    mig_gpus=dict(type="raw", default=[]),
    host=dict(type="str"),
    recorded=dict(type="dict"),
    repack=dict(type="bool", default=False),
    changes=dict(type="bool", default=False),
    restart=dict(type="str", default="auto", choices=["auto", "never"]),
    max_removals=dict(type="int", default=2),
    allow_removals=dict(type="bool", default=False),
    refuse=dict(type="bool", default=True),
    hardening=dict(type="bool", default=True),
    unit_dir=dict(type="str", default=units.DEFAULT_UNIT_DIR),
    mps_unit_dir=dict(type="str", default=units.DEFAULT_UNIT_DIR),
    mps_control_path=dict(type="str", default=mps.DEFAULT_CONTROL),
    mps_nvidia_smi_path=dict(type="str", default=mps.DEFAULT_NVIDIA_SMI),
)


class ActionModule(ControllerAction):
    """Plan one host's placements on the controller; returns ansible_facts.numafleet_plan."""

    NAME = "numafleet.tuning.numa_plan"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, host, args = self.start(tmp, task_vars)

        facts = task_vars.get("ansible_facts") or {}
        numa = args["numa"] if args["numa"] is not None else facts.get("numa")
        if not numa:
            result.update(
                failed=True,
                msg=(
                    f"host {host}: no NUMA facts to plan from: ansible_facts.numa is not set and "
                    "the numa option is empty. Run numafleet.tuning.numa_facts on the host first "
                    "(playbooks/site.yml does), or pass numa=."
                ),
            )
            return result
        gpu_topology = args["gpu_topology"]
        if gpu_topology is None:
            gpu_topology = facts.get("gpu_topology") or {}

        # An empty host_vars key (`numafleet_placements:`) is YAML null: read it as "none".
        placements = [] if args["placements"] is None else args["placements"]
        tenants = [] if args["tenants"] is None else args["tenants"]
        reserved = "" if args["reserved_cpus"] is None else args["reserved_cpus"]
        extra = [] if args["hugepages_extra"] is None else args["hugepages_extra"]
        mig_gpus = [] if args["mig_gpus"] is None else args["mig_gpus"]
        policy = {
            "reserved_cpus": plain(reserved),
            "memory_headroom_pct": plain(args["memory_headroom_pct"]),
        }
        recorded = args["recorded"]
        if recorded is None:
            recorded = facts.get("numafleet_recorded")
        recorded = plain(recorded) if recorded else None
        plan_path = (recorded or {}).get("plan_path") or PLAN_PATH
        try:
            valid = self._recorded(host, recorded, plan_path, args["repack"])
            kept = None if args["repack"] else valid
            plan = plan_host(
                host,
                plain(numa),
                plain(gpu_topology),
                plain(placements),
                plain(tenants),
                policy,
                hugepages_extra=plain(extra),
                mig_gpus=plain(mig_gpus),
                recorded=kept,
            )
            summary = plan_summary(plan)
            old_plan = recorded["plan"] if valid is not None else None
            changes = None
            if args["changes"]:
                changes = self._changes(host, args, old_plan, recorded, plan, gpu_topology)
                plan["awaiting_restart"] = changes["units"]["awaiting_restart"]
            else:
                # Restarts that await a window (numafleet_restart: never) stay recorded.
                plan["awaiting_restart"] = list((old_plan or {}).get("awaiting_restart") or [])
        except NumaTuneError as exc:
            result.update(failed=True, msg=str(exc))
            return result

        if changes is not None and changes["refused"] and not args["refuse"]:
            # A report (drift_check.yml): what site.yml would refuse is part of the change plan.
            changes["lines"] += [
                f"  site.yml would refuse this run: {text}" for text in changes["refused"]
            ]
        elif changes is not None and changes["refused"]:
            # Only the message and the change plan: the plan itself would bury them.
            result.update(failed=True, msg=" ".join(changes["refused"]), changes=changes["lines"])
            return result
        new_facts = {"numafleet_plan": plan}
        if changes is not None:
            new_facts["numafleet_changes"] = changes
            result["changes"] = changes["lines"]
            summary = f"{summary}; {changes['summary']}"
        result.update(changed=False, ansible_facts=new_facts, summary=summary)
        if plan.get("warnings"):
            # Shown as [WARNING] lines, which carry no host name of their own.
            result["warnings"] = [f"host {host}: {warning}" for warning in plan["warnings"]]
        return result

    @staticmethod
    def _recorded(host, recorded, plan_path, repack):
        """parse_recorded of the recorded plan, or None; raises PlanError.

        With repack an invalid recording is set aside (the apply replaces it), unless it is a
        directory or another file that no write can replace: that is refused either way.
        """
        try:
            return parse_recorded(host, recorded, plan_path)
        except PlanError:
            # parse_recorded refuses a directory (or another non-file) whatever repack says.
            if not repack or (recorded or {}).get("kind") not in ("file", "link"):
                raise
        return None

    @staticmethod
    def _changes(host, args, old_plan, recorded, plan, gpu_topology) -> dict:
        """The change plan (numafleet_changes): recorded state -> this plan; raises NumaTuneError."""
        recorded = recorded or {}
        unit_files = units.render_files(
            plan, units.DEFAULT_HEADER, args["hardening"], args["unit_dir"]
        )
        daemons, dummy = mps.plan_daemons(plan)
        mps_files = mps.render_files(
            daemons,
            units.DEFAULT_HEADER,
            args["mps_unit_dir"],
            args["mps_control_path"],
            args["mps_nvidia_smi_path"],
        )
        return change_plan(
            host,
            old_plan,
            plan,
            unit_files,
            mps_files,
            recorded.get("files") or {},
            gpu_topology=plain(gpu_topology),
            restart=args["restart"],
            max_removals=args["max_removals"],
            allow_removals=args["allow_removals"],
            repack=args["repack"],
            awaited=(old_plan or {}).get("awaiting_restart") or [],
        )
