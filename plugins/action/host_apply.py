# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.host_apply: inputs -> module arguments -> one execution.

The host's inputs (the role inputs a role passes in ``inputs``, or, without it, the host
variables site.yml and drift_check.yml read) are checked and shaped on the controller by
``plugin_utils/_apply_args.py``, the same code numa_plan runs before the plan gate; then the
module ``numafleet.tuning.host_apply`` is executed once on the host. Documentation:
``plugins/modules/host_apply.py``.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.effective import (
    override_message,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import escape_controls
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import state_digest
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _apply_args, _plan_inputs
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import (
    HostVariables,
    plain,
)

ARGUMENT_SPEC = dict(
    layers=dict(type="list", elements="str", choices=list(_apply_args.ALL_LAYERS)),
    inputs=dict(type="dict"),
    plan=dict(type="dict"),
    measure=dict(type="bool", default=False),
)

# Options only the module takes: a task that sets any of them calls the module directly, with its
# own arguments as given (the module's documentation and EXAMPLES), not shaped from host variables.
MODULE_OPTIONS = frozenset(
    (
        "host", "root", "service_manager", "restart", "restart_awaited", "replan",
        "recorded_digest", "hugepages", "kernel", "gpu", "amd", "mig", "mps", "units",
    )
)  # fmt: skip

# The role whose layer each layer is (reports and summaries name the roles).
ROLE_OF = {
    "hugepages": "hugepages",
    "kernel": "numa_kernel",
    "gpu": "nvidia_gpu",
    "amd": "amd_partition",
    "mig": "nvidia_mig",
    "mps": "nvidia_mps",
    "units": "pinned_services",
}


def standing_drift(layer_result) -> list:
    """The entries of a layer result's ``drift`` that count as drift (not ``pending``: a
    difference render mode cannot make, such as a MIG layout against a read-only snapshot)."""
    entries = (layer_result or {}).get("drift") if isinstance(layer_result, dict) else None
    return [e for e in entries or () if isinstance(e, dict) and not e.get("pending")]


class ActionModule(ActionBase):
    """Check and shape one host's inputs, then run the module host_apply once on the host."""

    NAME = "numafleet.tuning.host_apply"
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        host = str(task_vars.get("inventory_hostname", "localhost"))
        given = dict(self._task.args)
        if MODULE_OPTIONS & set(given) or isinstance(given.get("measure"), dict):
            result.update(
                self._execute_module(module_name=self.NAME, module_args=given, task_vars=task_vars)
            )
            return result
        try:
            dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        except AnsibleActionFail as exc:
            raise AnsibleActionFail(f"host {host}: {self.NAME}: {exc.message}") from None
        facts = plain(task_vars.get("ansible_facts") or {})
        plan = plain(args["plan"]) if args["plan"] is not None else facts.get("numafleet_plan")
        layers = tuple(args["layers"] or _apply_args.ALL_LAYERS)
        site = args["inputs"] is None
        try:
            variables = HostVariables(task_vars, host)
            inputs = _apply_args.site_inputs(variables) if site else plain(args["inputs"])
            applied = _apply_args.build(host, inputs, plan, facts, layers)
        except AnsibleError as exc:
            result.update(failed=True, msg=f"host {host}: {self.NAME}: {exc}")
            return result
        problems = _apply_args.name_host_variables(applied.problems) if site else applied.problems
        if problems:
            msg = " ".join(escape_controls(text) for text in problems)
            result.update(failed=True, msg=msg, problems=problems)
            return result
        module_args = dict(applied.module_args)
        module_args.setdefault("host", host)
        if site:
            recorded = facts.get("numafleet_recorded")
            if isinstance(recorded, dict):
                # The state the plan and its change plan were made from: the module refuses to
                # apply when the host's state differs now (another run, a stale fact cache).
                module_args["recorded_digest"] = state_digest(recorded)
            changes = facts.get("numafleet_changes") or {}
            awaited = (changes.get("units") or {}).get("restart_awaited") or []
            if awaited:
                module_args["restart_awaited"] = list(awaited)
            if {"mig", "amd"} & set(module_args.get("layers", ())):
                module_args["replan"] = _plan_inputs.replan_inputs(variables, facts)
            if args["measure"] and module_args.get("service_manager") == "systemd":
                # Render mode runs nothing, so there is nothing to measure.
                module_args["measure"] = _plan_inputs.measure_inputs(variables)
        self._display.vvv(f"host {host}: {self.NAME}: layers {module_args.get('layers')}")
        result.update(
            self._execute_module(
                module_name=self.NAME, module_args=module_args, task_vars=task_vars
            )
        )
        result["reboot_ok"] = applied.reboot_ok
        layer_results = result.get("layers") if isinstance(result.get("layers"), dict) else {}
        # In check mode a layer also counts when the host differs from the plan in a way the
        # apply would not change (its ``drift``: a pool held by pages in use, for example), and
        # the units layer when a foreign override changes a planned unit property (site.yml would
        # not change a file: it cannot fix it).
        check = getattr(self._play_context, "check_mode", False) is True or (
            getattr(self._task, "check_mode", None) is True
        )
        foreign = (layer_results.get("units") or {}).get("foreign_overrides") or []
        result["changed_layers"] = [
            ROLE_OF[name]
            for name in _apply_args.ALL_LAYERS
            if (layer_results.get(name) or {}).get("changed")
            or (check and standing_drift(layer_results.get(name)))
            or (name == "units" and check and foreign)
        ]
        if not result.get("failed"):
            result.setdefault("warnings", [])
            result["warnings"] += self._notes(host, result, applied, module_args)
            # Also in check mode: a reviewer of --check --diff learns that the plan will not take
            # effect while the foreign file stays.
            result["warnings"] += [override_message(item, host) for item in foreign]
        return result

    @staticmethod
    def _notes(host, result, applied, module_args) -> list:
        """Warnings for what a person must do: a reboot owed, a GPU reset owed."""
        notes = []
        systemd = module_args.get("service_manager") == "systemd"
        hugepages = (result.get("layers") or {}).get("hugepages") or {}
        changed = hugepages.get("cmdline_changed", result.get("reboot_required"))
        if result.get("reboot_required") and not changed:
            # Written by an earlier run, not booted yet: the play's reboot handler is not notified.
            notes.append(
                f"host {host}: reboot pending: the kernel command line numafleet wrote is not "
                "the running one (/proc/cmdline lacks "
                f"{' '.join(hugepages.get('kernel_args_missing') or [])}); it takes effect at "
                "the next reboot. Reboot the host when a window allows."
            )
        elif result.get("reboot_required") and not (applied.reboot_ok and systemd):
            args = " ".join(result.get("kernel_args") or []) or "hugepage arguments removed"
            notes.append(
                f"host {host}: the kernel command line changed ({args}); it takes effect "
                "(boot-time hugepages, kernel CPU isolation) at the next reboot. Reboot the "
                "host, or set "
                "numafleet_reboot_ok: true (hugepages_reboot_ok for the role) to let the "
                "collection do it."
            )
        mig = (result.get("layers") or {}).get("mig") or {}
        if mig.get("reset_required"):
            gpus = ", ".join(
                str(gpu.get("address"))
                for gpu in mig.get("gpus") or []
                if gpu.get("reset_required")
            )
            blockers = mig.get("reset_blockers") or []
            held = f" Holding the GPU: {'; '.join(blockers)}." if blockers else ""
            notes.append(
                f"host {host}: the MIG mode change of {gpus} is pending until the GPU is reset; "
                f"its layout is applied by the next run after the reset.{held} Reset it "
                "(nvidia-smi --gpu-reset -i ADDRESS) or reboot, or set numafleet_mig_reset_ok: "
                "true (nvidia_mig_reset_ok for the role) to let the collection reset a GPU that "
                "nothing uses."
            )
        amd = (result.get("layers") or {}).get("amd") or {}
        if amd.get("reset_required"):
            gpus = ", ".join(
                str(gpu.get("address"))
                for gpu in amd.get("gpus") or []
                if gpu.get("reset_required")
            )
            notes.append(
                f"host {host}: the memory partition change of {gpus} needs a reload of the "
                "amdgpu driver (every AMD GPU of the host is reset); nothing was changed on "
                "them. Set numafleet_amd_reset_ok: true (amd_partition_reset_ok for the role) "
                "with every AMD GPU idle, or reboot (the boot unit sets the recorded modes)."
            )
        return notes
