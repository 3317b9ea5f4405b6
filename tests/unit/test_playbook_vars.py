"""playbooks/vars/roles.yml hands every apply role its inputs from the host variables.

site.yml and drift_check.yml skip the roles' own argument and input checks (tasks_from: apply,
rolespec_validate: false) because playbooks/tasks/check_inputs.yml checks them all first, against
the roles' own argument specs: so every role option must be handed over there, and the table that
names the host variable behind each input (for the messages) must agree with the templates.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = ["hugepages", "numa_kernel", "nvidia_mig", "nvidia_mps", "pinned_services"]
ROLE_VARS = yaml.safe_load((REPO / "playbooks" / "vars" / "roles.yml").read_text(encoding="utf-8"))
TABLE = ROLE_VARS["__numafleet_host_var_of"]
# Options the playbooks leave at the role's default (not host variables).
LEFT_AT_DEFAULT = {
    "nvidia_mps_gpu_topology",
    "nvidia_mps_unit_dir",
    "nvidia_mps_manifest_path",
    "nvidia_mps_control_path",
    "nvidia_mps_nvidia_smi_path",
    "pinned_services_hardening",
    "pinned_services_unit_dir",
    "pinned_services_manifest_path",
}
HOST_VAR = re.compile(r"\{\{\s*(numafleet_\w+)\b")


def _options(role: str) -> dict:
    spec = yaml.safe_load(
        (REPO / "roles" / role / "meta" / "argument_specs.yml").read_text("utf-8")
    )
    return spec["argument_specs"]["main"]["options"]


@pytest.mark.parametrize("role", ROLES)
def test_every_role_option_is_handed_over_or_left_at_its_default(role):
    options = set(_options(role))
    handed = {name for name in ROLE_VARS if name.startswith(role + "_")}
    assert handed <= options, handed - options
    assert options - handed == {o for o in options if o in LEFT_AT_DEFAULT}, options - handed


def test_every_plan_input_is_the_plan_fact():
    plans = {name: value for name, value in ROLE_VARS.items() if name.endswith("_plan")}
    assert sorted(plans) == sorted(f"{role}_plan" for role in ROLES)
    assert set(plans.values()) == {"{{ ansible_facts.numafleet_plan }}"}


def test_the_table_names_the_host_variable_of_every_template():
    templated = {
        name: HOST_VAR.search(value).group(1)
        for name, value in ROLE_VARS.items()
        if not name.startswith("__") and not name.endswith("_plan")
    }
    assert TABLE == templated


def test_the_table_only_names_role_options():
    options = set().union(*(_options(role) for role in ROLES))
    assert set(TABLE) <= options
    assert all(host_var.startswith("numafleet_") for host_var in TABLE.values())


@pytest.mark.parametrize("playbook", ["site.yml", "drift_check.yml"])
def test_the_playbooks_check_every_role_they_import_alone(playbook):
    """A role imported without its own checks must have had them run by check_inputs.yml."""
    text = (REPO / "playbooks" / playbook).read_text(encoding="utf-8")
    play = yaml.safe_load(text)[0]
    assert play["vars_files"] == ["vars/roles.yml"]
    pre = [task.get("ansible.builtin.import_tasks") for task in play["pre_tasks"]]
    assert "tasks/check_inputs.yml" in pre
    imports = [
        t["ansible.builtin.import_role"]
        for t in play["tasks"]
        if "ansible.builtin.import_role" in t
    ]
    assert sorted(i["name"] for i in imports) == sorted(f"numafleet.tuning.{r}" for r in ROLES)
    assert all(i["tasks_from"] == "apply" and i["rolespec_validate"] is False for i in imports)
    check = (REPO / "playbooks" / "tasks" / "check_inputs.yml").read_text(encoding="utf-8")
    for role in ROLES:
        assert f"../../roles/{role}/meta/argument_specs.yml" in check
        assert f"__{role}_input_errors" in check
