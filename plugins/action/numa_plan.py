# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.numa_plan: plan a host's placements from its facts.

Nothing is sent to the host: the planner (``module_utils/numa/planner.py``) is pure and runs here,
on the facts that numa_facts / gpu_topology_facts already returned. Documentation:
``plugins/modules/numa_plan.py``.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mps, partition, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import (
    add_kernel_cmdline,
    change_plan,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cmdline import cmdline_change
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    PlanError,
    UnitRenderError,
    escape_controls,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.placements import (
    gpu_partitions_input,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
    plan_summary,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import PLAN_PATH
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _apply_args, _plan_inputs
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    ControllerAction,
    HostVariables,
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
    partition=dict(type="bool", default=False),
    memory_headroom_pct=dict(type="raw", default=15),
    hugepages_extra=dict(type="raw", default=[]),
    gpu_partitions=dict(type="raw", default=[]),
    mig_gpus=dict(type="raw", default=[]),
    host=dict(type="str"),
    recorded=dict(type="dict"),
    repack=dict(type="bool", default=False),
    changes=dict(type="bool", default=False),
    restart=dict(type="str", default="auto", choices=["auto", "never"]),
    max_removals=dict(type="int", default=2),
    allow_removals=dict(type="bool", default=False),
    amd_reset_ok=dict(type="bool", default=False),
    refuse=dict(type="bool", default=True),
    hardening=dict(type="bool", default=True),
    preflight=dict(
        type="str", default=units.DEFAULT_PREFLIGHT, choices=list(units.PREFLIGHT_MODES)
    ),
    unit_dir=dict(type="str", default=units.DEFAULT_UNIT_DIR),
    mps_unit_dir=dict(type="str", default=units.DEFAULT_UNIT_DIR),
    mps_control_path=dict(type="str", default=mps.DEFAULT_CONTROL),
    mps_nvidia_smi_path=dict(type="str", default=mps.DEFAULT_NVIDIA_SMI),
    playbook=dict(type="str", choices=["site.yml", "drift_check.yml", "verify.yml"]),
)

# Under a playbook, options the task leaves out come from the host variables: the plan's inputs,
# and the renderers' settings from the role inputs the playbook's apply would use.
_RENDER_INPUTS = {
    "hardening": "pinned_services_hardening",
    "preflight": "pinned_services_preflight",
    "unit_dir": "pinned_services_unit_dir",
    "mps_unit_dir": "nvidia_mps_unit_dir",
    "mps_control_path": "nvidia_mps_control_path",
    "mps_nvidia_smi_path": "nvidia_mps_nvidia_smi_path",
}
# What each playbook asks of the plan: the change plan, and whether a refused plan fails.
_PLAYBOOK_MODE = {
    "site.yml": {"changes": True, "refuse": True},
    "drift_check.yml": {"changes": True, "refuse": False},
    "verify.yml": {"changes": False, "refuse": True},
}

# The renderers' names of the path and program options -> the role inputs that set them.
_UNIT_OPTIONS = {"unit_dir": "pinned_services_unit_dir"}
_MPS_OPTIONS = {
    "unit_dir": "nvidia_mps_unit_dir",
    "nvidia_cuda_mps_control": "nvidia_mps_control_path",
    "nvidia_smi": "nvidia_mps_nvidia_smi_path",
}


# The plan's lists -> the host variables they were planned from (placements[2] of the plan is
# numafleet_placements[2]: the planner keeps the order and the index).
_PLAN_LISTS = {"plan placements[": "numafleet_placements[", "plan tenants[": "numafleet_tenants["}


def _named(host: str, text: str, options: dict) -> str:
    """text of a renderer's error, naming the role input or host variable the value came from."""
    prefix = f"host {host}: "
    if text.startswith(prefix):
        text = text[len(prefix) :]
    for option, role_input in options.items():
        if text.startswith(f"{option}: "):
            text = f"{role_input} ({option} of the renderer): {text[len(option) + 2 :]}"
    for plan_list, host_var in _PLAN_LISTS.items():
        if text.startswith(plan_list):
            text = host_var + text[len(plan_list) :]
    return prefix + text


class ActionModule(ControllerAction):
    """Plan one host's placements on the controller; returns ansible_facts.numafleet_plan."""

    NAME = "numafleet.tuning.numa_plan"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, host, args = self.start(tmp, task_vars)

        facts = task_vars.get("ansible_facts") or {}
        variables = inputs = None
        if args["playbook"] is not None:
            variables = HostVariables(task_vars, host)
            inputs = _apply_args.site_inputs(variables)
            self._host_name = host
            args = self._from_host_vars(args, variables, inputs)
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
        try:
            # One list for the planner, both vendors; numafleet_mig_gpus is its old name.
            gpu_partitions, notes = gpu_partitions_input(
                host, plain(args["gpu_partitions"]), plain(args["mig_gpus"])
            )
        except NumaTuneError as exc:
            result.update(failed=True, msg=escape_controls(str(exc)))
            return result
        policy = {
            "reserved_cpus": plain(reserved),
            "memory_headroom_pct": plain(args["memory_headroom_pct"]),
            "partition": plain(args["partition"]),
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
                mig_gpus=gpu_partitions,
                recorded=kept,
                recorded_daemons=((recorded or {}).get("plan") or {}).get("mps_daemons")
                if kept is not None
                else None,
            )
            summary = plan_summary(plan)
            old_plan = recorded["plan"] if valid is not None else None
            # Every run renders the units and MPS files of the plan, so that what the renderers
            # refuse is refused here, on the controller, before the plan gate.
            unit_files, mps_files = self._render(host, args, plan)
            changes = None
            if args["changes"]:
                changes = self._changes(
                    host, args, old_plan, recorded, plan, gpu_topology, unit_files, mps_files
                )
                plan["awaiting_restart"] = changes["units"]["awaiting_restart"]
            else:
                # Restarts that await a window (numafleet_restart: never) stay recorded.
                plan["awaiting_restart"] = list((old_plan or {}).get("awaiting_restart") or [])
        except NumaTuneError as exc:
            msg = escape_controls(str(exc))
            if args["gpu_partitions"]:
                # The planner may name the list by its old name: name the one the host set.
                msg = msg.replace("numafleet_mig_gpus[", "numafleet_gpu_partitions[")
            if not msg.startswith(f"host {host}: "):
                msg = f"host {host}: {msg}"
            result.update(failed=True, msg=msg)
            return result

        if changes is not None:
            # A manifest that is a link, malformed or foreign stops its apply module; refuse the
            # host here, before the gate, so that no earlier layer changes first.
            changes["refused"] += [
                f"host {host}: {text}" for text in (recorded or {}).get("manifest_errors") or ()
            ]
        if changes is not None and changes["refused"] and not args["refuse"]:
            # A report (drift_check.yml): what site.yml would refuse is part of the change plan.
            changes["lines"] += [
                f"  site.yml would refuse this run: {text}" for text in changes["refused"]
            ]
        elif changes is not None and changes["refused"]:
            # Only the message and the change plan: the plan itself would bury them.
            result.update(failed=True, msg=" ".join(changes["refused"]), changes=changes["lines"])
            return result
        if inputs is not None:
            problems = self._input_problems(host, args["playbook"], variables, inputs, plan, facts)
            if problems:
                result.update(failed=True, msg=" ".join(problems), problems=problems)
                return result
            if changes is not None:
                self._kernel_cmdline(host, changes, inputs, plan, facts, recorded)
        new_facts = {"numafleet_plan": plan}
        if changes is not None:
            new_facts["numafleet_changes"] = changes
            result["changes"] = changes["lines"]
            summary = f"{summary}; {changes['summary']}"
        result.update(changed=False, ansible_facts=new_facts, summary=summary)
        # A host note, not a note of this run's facts: kept out of plan["warnings"] (and so out
        # of the summary's warning count); shown as a [WARNING] line on every run.
        note = partition.no_reserved_warning(plan.get("reserved_cpus"), plan.get("placements"))
        shown = notes + list(plan.get("warnings") or ()) + ([note] if note else [])
        if inputs is not None:
            shown += _apply_args.isolation_warnings(inputs, plan)
        if shown:
            # Shown as [WARNING] lines, which carry no host name of their own.
            result["warnings"] = [f"host {host}: {warning}" for warning in shown]
        return result

    @staticmethod
    def _kernel_cmdline(host, changes, inputs, plan, facts, recorded) -> None:
        """Add the kernel command line to the change plan: what the hugepages layer wrote last
        (numafleet_recorded.kernel_args) against what it writes now, and /proc/cmdline (facts
        numa.kernel.cmdline) for a reboot still owed."""
        facts = plain(facts)
        wanted = _apply_args.kernel_cmdline_args(host, inputs, plan, facts)
        kernel = (facts.get("numa") or {}).get("kernel") or {}
        written = (recorded or {}).get("kernel_args")
        running = kernel.get("cmdline") if isinstance(kernel, dict) else None
        add_kernel_cmdline(changes, cmdline_change(written, wanted, running))

    def _from_host_vars(self, args: dict, variables, inputs: dict) -> dict:
        """args with every option the task left out taken from the host variables."""
        given = set(self._task.args)
        args = dict(args, **_PLAYBOOK_MODE[args["playbook"]])
        for option, value in _plan_inputs.plan_inputs(variables).items():
            if option not in given:
                args[option] = value
        for option, role_input in _RENDER_INPUTS.items():
            if option not in given and role_input in inputs:
                args[option] = inputs[role_input]
        # The host variables' values get the options' types (host_vars_check refused what
        # cannot have them, before this task).
        validated = ArgumentSpecValidator(ARGUMENT_SPEC).validate(args)
        if validated.error_messages:
            raise AnsibleActionFail(
                f"host {self._host_name}: {self.NAME}: " + "; ".join(validated.error_messages)
            )
        return validated.validated_parameters

    @staticmethod
    def _input_problems(host, playbook, variables, inputs, plan, facts) -> list:
        """Every message the playbook's input checks give (the apply's inputs, the measurement
        settings), with control characters escaped; [] when the inputs are right."""
        facts = plain(facts)
        problems = []
        if playbook in ("site.yml", "drift_check.yml"):
            applied = _apply_args.build(host, inputs, plan, facts)
            problems += _apply_args.name_host_variables(applied.problems)
        if playbook == "site.yml":
            problems += _apply_args.guard_problems(host, variables)
        if playbook == "drift_check.yml":
            problems += _apply_args.measure_problems(host, variables)
        if playbook == "verify.yml":
            problems += _apply_args.verify_problems(host, variables)
        return [escape_controls(text) for text in problems]

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
    def _render(host, args, plan) -> tuple:
        """({path: text} of the units, of the MPS files) of plan; raises UnitRenderError.

        A message about a path or program option names the role input that sets it.
        """
        try:
            unit_files = units.render_files(
                plan, units.DEFAULT_HEADER, args["hardening"], args["unit_dir"], args["preflight"]
            )
        except UnitRenderError as exc:
            raise UnitRenderError(_named(host, str(exc), _UNIT_OPTIONS)) from None
        try:
            daemons, dummy = mps.plan_daemons(plan)
            mps_files = mps.render_files(
                daemons,
                units.DEFAULT_HEADER,
                args["mps_unit_dir"],
                args["mps_control_path"],
                args["mps_nvidia_smi_path"],
            )
        except UnitRenderError as exc:
            raise UnitRenderError(_named(host, str(exc), _MPS_OPTIONS)) from None
        return unit_files, mps_files

    @staticmethod
    def _changes(host, args, old_plan, recorded, plan, gpu_topology, unit_files, mps_files):
        """The change plan (numafleet_changes): recorded state -> this plan; raises NumaTuneError."""
        recorded = recorded or {}
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
            amd_reset_ok=args["amd_reset_ok"],
            # Unit files that differ from the recorded ones only in the preflight line.
            preflight_variants=lambda: [
                units.render_files(
                    plan, units.DEFAULT_HEADER, args["hardening"], args["unit_dir"], mode
                )
                for mode in units.PREFLIGHT_MODES
                if mode != args["preflight"]
            ],
        )
