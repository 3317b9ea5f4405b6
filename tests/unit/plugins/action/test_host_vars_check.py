"""The host_vars_check action plugin: a host's own variables against the schema, one message.

Driven as the task executor would (see test_numa_plan.py): an ActionModule with the task's args, a
connection it never uses, and task vars whose ``hostvars`` holds the host's inventory variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable

from ansible_collections.numafleet.tuning.plugins.action.host_vars_check import ActionModule

HOST = "gpu-a100-01"
FIX = "Fix the host variable; nothing was changed."
# What the demo inventory gives a host (inventories/demo), as hostvars shows it.
DEMO = {
    "ansible_connection": "local",
    "ansible_python_interpreter": "/usr/bin/python3",
    "demo_root": "/srv/demo/gpu-a100-01",
    "numafleet_sysfs_root": "/srv/demo/gpu-a100-01/sys",
    "numafleet_procfs_root": "/srv/demo/gpu-a100-01/proc",
    "numafleet_render_root": "/srv/demo/gpu-a100-01/root",
    "numafleet_gpu_snapshot": "/srv/demo/gpu-a100-01/gpu-snapshot.json",
    "numafleet_placements": [{"name": "llm", "exec": "/opt/vllm/bin/vllm serve", "cpus": 16}],
    "numafleet_reserved_cpus": "0,64",
    "inventory_hostname": HOST,
    "group_names": ["demo"],
    "__numafleet_site_plan": {"changed": False},
    "ansible_facts": {"numa": {}, "numafleet_plan": {}},
}


def run_action(hostvars, args=None, host=HOST, facts=None, extra_vars=None):
    task = SimpleNamespace(
        args=dict(args or {}),
        async_val=0,
        check_mode=False,
        action="numafleet.tuning.host_vars_check",
    )
    if extra_vars is not None:
        manager = SimpleNamespace(extra_vars=extra_vars)
        task.get_variable_manager = lambda: manager
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = ActionModule(task, connection, None, None, None)
    action._load_name = "numafleet.tuning.host_vars_check"
    task_vars = {
        "inventory_hostname": host,
        "ansible_facts": facts if facts is not None else hostvars.get("ansible_facts", {}),
        "hostvars": {host: hostvars},
    }
    return action.run(task_vars=task_vars)


def test_the_demo_hosts_variables_pass():
    result = run_action(DEMO)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["problems"] == []
    # The plan's variables are left to numa_plan; the paths are checked.
    assert result["checked"] == [
        "numafleet_gpu_snapshot",
        "numafleet_procfs_root",
        "numafleet_render_root",
        "numafleet_sysfs_root",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"numafleet_placement": [{"name": "llm", "exec": "/bin/serve", "cpus": 4}]},
            "host gpu-a100-01: numafleet_placement is not a variable of numafleet.tuning; did "
            f"you mean numafleet_placements? {FIX}",
        ),
        (
            {"numafleet_thp_enable": "never"},
            "host gpu-a100-01: numafleet_thp_enable is not a variable of numafleet.tuning; did "
            f"you mean numafleet_thp_enabled? {FIX}",
        ),
        (
            {"numa_kernel_thp_enabled": "never"},
            "host gpu-a100-01: numa_kernel_thp_enabled is set for this host, but site.yml sets "
            "it from numafleet_thp_enabled; set numafleet_thp_enabled instead (the playbook reads "
            f"that host variable, not the role input, so this one would be ignored). {FIX}",
        ),
        (
            {"numafleet_thp_enabled": "sometimes"},
            "host gpu-a100-01: value of numafleet_thp_enabled must be one of: always, madvise, "
            f"never, leave, got: sometimes. {FIX}",
        ),
    ],
    ids=["placement-typo", "thp-typo", "role-input", "choice"],
)
def test_a_problem_fails_the_host_with_one_message(extra, message):
    result = run_action({**DEMO, **extra})
    assert result["failed"] is True
    assert result["msg"] == message
    assert len(result["problems"]) == 1


def test_every_problem_of_a_host_is_in_its_message():
    result = run_action(
        {
            **DEMO,
            "numafleet_thp_enable": "never",
            "nvidia_mps_restart": "never",
            "numafleet_reboot_ok": "maybe",
        }
    )
    assert result["failed"] is True
    assert [problem.split()[0] for problem in result["problems"]] == [
        "numafleet_thp_enable",
        "nvidia_mps_restart",
        "argument",
    ]
    assert "set numafleet_restart instead" in result["msg"]
    assert result["msg"].startswith("host gpu-a100-01: numafleet_thp_enable ")
    assert result["msg"].endswith(FIX)


@pytest.mark.parametrize(
    "extra",
    [
        {"pinned_services_hardening": False},
        {"pinned_services_unit_dir": "/run/systemd/system", "nvidia_mps_control_path": "/opt/m"},
        {"numafleet_restart": "never", "numafleet_max_removals": 0, "numafleet_repack": True},
        {"numafleet_plan": {"version": 1}, "numafleet_state_paths": []},  # injected facts
    ],
    ids=["hardening", "unit-dir", "new-variables", "injected-facts"],
)
def test_role_inputs_the_playbooks_leave_alone_and_facts_pass(extra):
    result = run_action({**DEMO, **extra})
    assert not result.get("failed"), result


def test_a_fact_of_any_name_is_not_an_unknown_variable():
    hostvars = {**DEMO, "numafleet_future_fact": 1}
    assert run_action(hostvars, facts={"numafleet_future_fact": 1}).get("failed") is not True
    assert run_action(hostvars, facts={})["failed"] is True


def test_verify_checks_unknown_names_but_not_what_it_does_not_read():
    hostvars = {**DEMO, "numa_kernel_thp_enabled": "never", "numafleet_thp_enabled": "bad"}
    result = run_action(hostvars, {"playbook": "verify.yml"})
    assert not result.get("failed"), result
    assert "numafleet_thp_enabled" not in result["checked"]
    result = run_action({**hostvars, "numafleet_cgroup_root": ["/sys/fs/cgroup"]}, {})
    assert result["failed"] is True  # site.yml: the role input and the choice
    assert len(result["problems"]) == 2
    typo = run_action({**DEMO, "numafleet_placement": []}, {"playbook": "verify.yml"})
    assert typo["failed"] is True
    assert "did you mean numafleet_placements?" in typo["msg"]


def test_drift_check_names_itself_in_the_role_input_message():
    result = run_action({**DEMO, "hugepages_reboot_ok": True}, {"playbook": "drift_check.yml"})
    assert "but drift_check.yml sets it from numafleet_reboot_ok;" in result["msg"]


def test_play_keyword_variables_must_be_extra_vars():
    hostvars = {**DEMO, "numafleet_serial": 2}
    assert run_action(hostvars, extra_vars={"numafleet_serial": 2}).get("failed") is not True
    refused = run_action(hostvars, extra_vars={})
    assert refused["failed"] is True
    assert refused["msg"].startswith(
        "host gpu-a100-01: numafleet_serial is set for this host, but a play keyword reads it"
    )
    # A task that cannot tell extra vars from the inventory does not guess.
    assert run_action(hostvars).get("failed") is not True


class Unresolvable(Mapping):
    """hostvars whose one value refers to a variable the host does not have."""

    def __init__(self, data, broken):
        self.data, self.broken = data, broken

    def __getitem__(self, key):
        if key == self.broken:
            raise AnsibleUndefinedVariable("'play_only_var' is undefined")
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def test_a_value_that_cannot_be_templated_here_is_left_to_the_playbook():
    hostvars = Unresolvable({**DEMO, "numafleet_reboot_ok": "{{ x }}"}, "numafleet_reboot_ok")
    result = run_action(hostvars)
    assert not result.get("failed"), result
    assert "numafleet_reboot_ok" not in result["checked"]


def test_check_mode_gives_the_same_result():
    action_args = {**DEMO, "numafleet_placement": []}
    normal = run_action(action_args)
    task = SimpleNamespace(args={}, async_val=0, check_mode=True, action="x")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = ActionModule(task, connection, None, None, None)
    action._load_name = "numafleet.tuning.host_vars_check"
    check = action.run(
        task_vars={"inventory_hostname": HOST, "ansible_facts": {}, "hostvars": {HOST: action_args}}
    )
    assert check == normal


def test_a_bad_option_names_the_host_and_the_action():
    with pytest.raises(
        AnsibleActionFail, match=r"^host gpu-a100-01: numafleet.tuning.host_vars_check: "
    ):
        run_action(DEMO, {"playbook": "other.yml"})


def test_a_host_missing_from_hostvars_fails_with_its_name():
    task = SimpleNamespace(args={}, async_val=0, check_mode=False, action="x")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = ActionModule(task, connection, None, None, None)
    action._load_name = "numafleet.tuning.host_vars_check"
    result = action.run(task_vars={"inventory_hostname": "lost", "hostvars": {}})
    assert result["failed"] is True
    assert result["msg"].startswith("host lost: numafleet.tuning.host_vars_check: ")


@pytest.mark.parametrize("value", ["never\n", "a\x85b", "nul\x00", "line\u2028sep"])
def test_a_control_character_of_a_value_shows_escaped(value):
    """Argument-spec messages quote the value as it is: its newline or NUL is shown escaped."""
    result = run_action({**DEMO, "numafleet_thp_enabled": value})
    assert result["failed"] is True
    assert result["msg"].startswith("host gpu-a100-01: value of numafleet_thp_enabled ")
    assert result["msg"].isprintable(), repr(result["msg"])
    assert repr(value)[1:-1] in result["msg"]
