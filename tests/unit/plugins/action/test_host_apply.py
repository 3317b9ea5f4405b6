"""The host_apply action plugin: host variables or role inputs -> the module's arguments.

The module execution itself is replaced by a recorder (the module has its own tests); what is
tested here is what the controller sends: one execution, the checks before it, the recorded-state
digest, the measurement settings, the re-plan inputs and the notes it adds to the result.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.numafleet.tuning.plugins.action.host_apply import ActionModule
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import state_digest

HOST = "node-01"
PLAN = {
    "version": 1,
    "host": HOST,
    "placements": [],
    "tenants": [],
    "nodes": [{"id": 0, "hugepages": []}],
    "gpus": [],
    "mig_gpus": [],
    "mps_daemons": [],
    "reserved_cpus": [],
}
RECORDED = {"kind": "file", "plan_sha256": "ab", "files": {"/etc/numafleet/manifest.json": "cd"}}
FACTS = {
    "numafleet_plan": PLAN,
    "numafleet_recorded": RECORDED,
    "numa": {"sysfs_root": "/srv/rec/sys", "procfs_root": "/srv/rec/proc", "nodes": []},
    "gpu_topology": {"gpus": []},
}


# A recorded tree, as render mode needs (the render-mode checks refuse the live /sys and /proc).
RECORDING = {"numafleet_sysfs_root": "/srv/rec/sys", "numafleet_procfs_root": "/srv/rec/proc"}


def run_action(args, host_vars, facts=None, check_mode=False, module_result=None):
    facts = FACTS if facts is None else facts
    task = SimpleNamespace(
        args=dict(args), async_val=0, check_mode=check_mode, diff=False,
        action="numafleet.tuning.host_apply",
    )  # fmt: skip
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = ActionModule(task, connection, None, None, None)
    action._load_name = "numafleet.tuning.host_apply"
    sent = []

    def execute(module_name, module_args, task_vars):
        sent.append((module_name, module_args))
        return dict(module_result or {"changed": False, "layers": {}})

    action._execute_module = execute
    task_vars = {
        "inventory_hostname": HOST,
        "ansible_facts": facts,
        "hostvars": {HOST: dict(RECORDING, **host_vars, ansible_facts=facts)},
    }
    return action.run(task_vars=task_vars), sent


def test_site_mode_sends_one_execution_with_the_host_and_the_recorded_digest():
    result, sent = run_action({}, {"numafleet_render_root": "/srv/render/node-01"})
    assert not result.get("failed"), result
    ((name, args),) = sent
    assert name == "numafleet.tuning.host_apply"
    assert args["host"] == HOST and args["plan"] == PLAN
    assert args["recorded_digest"] == state_digest(RECORDED)
    assert args["root"] == "/srv/render/node-01" and args["service_manager"] == "none"
    # Render mode runs nothing, so it measures nothing either.
    assert "measure" not in args


def test_no_recorded_state_no_digest():
    facts = {key: value for key, value in FACTS.items() if key != "numafleet_recorded"}
    dummy, sent = run_action({}, {}, facts=facts)
    ((dummy, args),) = sent
    assert "recorded_digest" not in args


def test_measure_reads_the_measurement_settings_of_the_host():
    host_vars = {"numafleet_verify_window_s": 0, "numafleet_cgroup_root": "/cg"}
    dummy, sent = run_action({"measure": True, "layers": ["units"]}, host_vars)
    ((dummy, args),) = sent
    assert args["layers"] == ["units"]
    assert args["measure"]["window_s"] == 0.0 and args["measure"]["cgroup_root"] == "/cg"


def test_awaited_restarts_are_handed_over():
    facts = dict(FACTS, numafleet_changes={"units": {"restart_awaited": ["numafleet-a.service"]}})
    dummy, sent = run_action({}, {}, facts=facts)
    assert sent[0][1]["restart_awaited"] == ["numafleet-a.service"]


def test_a_bad_input_fails_before_anything_is_sent():
    result, sent = run_action({}, {"numafleet_render_root": "relative/root"})
    assert result["failed"] and sent == []
    assert result["msg"].startswith(f"host {HOST}: ")
    assert "numafleet_render_root" in result["msg"]


def test_role_mode_uses_the_inputs_not_the_host_variables():
    inputs = {"pinned_services_plan": PLAN, "pinned_services_render_root": "/srv/r"}
    result, sent = run_action(
        {"layers": ["units"], "plan": PLAN, "inputs": inputs},
        {"numafleet_render_root": "/elsewhere"},
    )
    assert not result.get("failed"), result
    ((dummy, args),) = sent
    assert args["root"] == "/srv/r" and args["layers"] == ["units"]
    assert "recorded_digest" not in args and "replan" not in args


def test_changed_layers_are_named_after_the_roles():
    layers = {
        "hugepages": {"changed": True},
        "kernel": {"changed": False},
        "units": {"changed": True},
    }
    result, dummy = run_action({}, {}, module_result={"changed": True, "layers": layers})
    assert result["changed_layers"] == ["hugepages", "pinned_services"]


@pytest.mark.parametrize("check_mode", [True, False])
def test_in_check_mode_a_layer_that_differs_from_the_plan_counts_as_changed(check_mode):
    """A pool held above the plan changes nothing, but check mode reports the layer (drift);
    a difference render mode cannot make (pending) does not count."""
    held = {"setting": "node0 2048kB pages", "planned": 4096, "actual": 8192, "pending": False}
    layers = {
        "hugepages": {"changed": False, "drift": [held]},
        "mig": {"changed": False, "drift": [dict(held, pending=True)]},
        "units": {"changed": False, "drift": []},
    }
    result, dummy = run_action(
        {}, {}, check_mode=check_mode, module_result={"changed": False, "layers": layers}
    )
    assert result["changed_layers"] == (["hugepages"] if check_mode else [])


@pytest.mark.parametrize(("reboot_ok", "noted"), [(False, True), (True, False)])
def test_a_reboot_owed_is_a_warning_unless_the_play_may_reboot(reboot_ok, noted):
    module_result = {"changed": True, "layers": {}, "reboot_required": True,
                     "kernel_args": ["hugepagesz=1G", "hugepages=4"]}  # fmt: skip
    result, dummy = run_action({}, {"numafleet_reboot_ok": reboot_ok}, module_result=module_result)
    assert result["reboot_ok"] is reboot_ok
    notes = [w for w in result.get("warnings") or [] if "kernel command line changed" in w]
    assert bool(notes) is noted
    if noted:
        assert notes[0].startswith(f"host {HOST}: ") and "hugepagesz=1G hugepages=4" in notes[0]


def test_module_options_go_to_the_module_as_given():
    """Called as the module's documentation shows (root, service_manager, layer options), the
    action shapes nothing: the task's arguments are the module's."""
    args = {"plan": PLAN, "layers": ["units"], "root": "/srv/r", "service_manager": "none"}
    result, sent = run_action(args, {"numafleet_render_root": "relative/root"})
    assert not result.get("failed"), result
    assert sent == [("numafleet.tuning.host_apply", args)]


FOREIGN = [
    {
        "unit": "numafleet-embed.service",
        "property": "NUMAPolicy",
        "planned": "bind",
        "effective": "default",
        "source": "/etc/systemd/system/numafleet-embed.service.d/override.conf",
    }
]


def test_a_foreign_override_is_drift_in_check_mode_and_a_warning_in_both_modes():
    module_result = {
        "changed": False,
        "layers": {"units": {"changed": False, "foreign_overrides": FOREIGN}},
    }
    host_vars = {"numafleet_render_root": "/srv/render/node-01"}
    result, dummy = run_action({}, host_vars, check_mode=True, module_result=module_result)
    assert result["changed_layers"] == ["pinned_services"]
    # site.yml --check --diff warns too: the review shows the plan will not take effect
    (checked,) = [w for w in result["warnings"] if "override.conf" in w]
    assert checked.startswith(f"host {HOST}: numafleet-embed.service: NUMAPolicy is default")
    result, dummy = run_action({}, host_vars, module_result=module_result)
    assert result["changed_layers"] == []
    (warning,) = [w for w in result["warnings"] if "override.conf" in w]
    assert warning.startswith(f"host {HOST}: numafleet-embed.service: NUMAPolicy is default")
    assert "planned bind" in warning and "systemctl revert numafleet-embed.service" in warning
    assert warning == checked


def test_an_unreadable_dropin_warns_with_its_reason():
    item = {
        "unit": "numafleet-embed.service",
        "property": "(unreadable)",
        "planned": None,
        "effective": None,
        "source": "/etc/systemd/system/numafleet-embed.service.d/link.conf",
        "detail": "is a symbolic link to ../x.conf: leads out of the root",
    }
    module_result = {
        "changed": False,
        "layers": {"units": {"changed": False, "foreign_overrides": [item]}},
    }
    host_vars = {"numafleet_render_root": "/srv/render/node-01"}
    result, dummy = run_action({}, host_vars, check_mode=True, module_result=module_result)
    assert result["changed_layers"] == ["pinned_services"]
    (warning,) = [w for w in result["warnings"] if "link.conf" in w]
    assert "which numafleet cannot read (is a symbolic link to ../x.conf" in warning
