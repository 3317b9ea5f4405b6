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
from ansible.plugins.action import ActionBase

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    plan_host,
    plan_summary,
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
    host=dict(type="str"),
)


def _plain(value):
    """Plain dict/list/str/int copies of Ansible's tagged and lazy containers, for the pure core."""
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


class ActionModule(ActionBase):
    """Plan one host's placements on the controller; returns ansible_facts.numafleet_plan."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp  # no effect since ansible-core 2.x; kept for the signature

        host = str(self._task.args.get("host") or task_vars.get("inventory_hostname", "localhost"))
        try:
            dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        except AnsibleActionFail as exc:
            raise AnsibleActionFail(
                f"host {host}: numafleet.tuning.numa_plan: {exc.message}"
            ) from None

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
        policy = {
            "reserved_cpus": _plain(reserved),
            "memory_headroom_pct": _plain(args["memory_headroom_pct"]),
        }
        try:
            plan = plan_host(
                host,
                _plain(numa),
                _plain(gpu_topology),
                _plain(placements),
                _plain(tenants),
                policy,
            )
            summary = plan_summary(plan)
        except NumaTuneError as exc:
            result.update(failed=True, msg=str(exc))
            return result

        result.update(
            changed=False,
            ansible_facts={"numafleet_plan": plan},
            summary=summary,
        )
        if plan.get("warnings"):
            # Shown as [WARNING] lines, which carry no host name of their own.
            result["warnings"] = [f"host {host}: {warning}" for warning in plan["warnings"]]
        return result
