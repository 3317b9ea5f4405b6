"""The schema of the host variables and its pure checks (plugins/plugin_utils/_host_vars.py).

The schema's agreement with _apply_args.site_inputs, the playbooks and the roles' argument specs
is tested in tests/unit/test_playbook_vars.py; the action that runs these checks in
tests/unit/plugins/action/test_host_vars_check.py.
"""

from __future__ import annotations

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.numafleet.tuning.plugins.plugin_utils import _host_vars as schema

FIX = "Fix the host variable; nothing was changed."


# -- the table itself ------------------------------------------------------------------------------


def test_every_name_is_a_unique_numafleet_variable():
    names = [var.name for var in schema.HOST_VARS]
    assert len(names) == len(set(names))
    assert all(name.startswith("numafleet_") and name == name.lower() for name in names)
    assert set(schema.BY_NAME) == set(names)
    assert not set(names) & set(schema.FACT_NAMES)
    assert not set(names) & set(schema.PLAY_VARIABLES)


@pytest.mark.parametrize("var", schema.HOST_VARS, ids=lambda var: var.name)
def test_every_variable_is_described_and_read_by_a_playbook(var):
    assert var.meaning.strip() and var.meaning.rstrip().endswith((".", ")")), var.meaning
    assert var.used_by and set(var.used_by) <= set(schema.PLAYBOOKS), var.used_by
    assert var.type in ("str", "int", "bool", "float", "path", "list", "dict", "raw")
    if var.choices:
        assert var.type == "str" and var.default in var.choices
    if var.minimum is not None:
        assert var.type == "int" and var.default >= var.minimum
    if var.role_inputs:
        # A role input is set from its numafleet_* variable by site.yml and drift_check.yml.
        assert set(schema.ROLE_INPUT_PLAYBOOKS) <= set(var.used_by)


@pytest.mark.parametrize(
    "var",
    [var for var in schema.HOST_VARS if var.default is not None],
    ids=lambda var: var.name,
)
def test_every_default_passes_its_own_spec(var):
    result = ArgumentSpecValidator({var.name: var.spec()}).validate({var.name: var.default})
    assert result.error_messages == []


def test_role_inputs_are_fed_by_one_host_variable_each():
    pairs = [(role_input, var.name) for var in schema.HOST_VARS for role_input in var.role_inputs]
    assert len(pairs) == len(dict(pairs))
    assert schema.role_input_sources()["numa_kernel_thp_enabled"] == "numafleet_thp_enabled"
    assert schema.role_input_sources()["pinned_services_restart"] == "numafleet_restart"
    assert not set(schema.role_input_sources()) & set(schema.PLAN_INPUTS)
    assert not set(schema.role_input_sources()) & set(schema.INVENTORY_ROLE_INPUTS)


# -- unknown names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "numafleet_placement",
            "numafleet_placement is not a variable of numafleet.tuning; "
            "did you mean numafleet_placements?",
        ),
        (
            "numafleet_thp_enable",
            "numafleet_thp_enable is not a variable of numafleet.tuning; "
            "did you mean numafleet_thp_enabled?",
        ),
        (
            "numafleet_tenant",
            "numafleet_tenant is not a variable of numafleet.tuning; did you mean numafleet_tenants?",
        ),
        (
            "numafleet_verify_windows",
            "numafleet_verify_windows is not a variable of numafleet.tuning; "
            "did you mean numafleet_verify_window_s?",
        ),
        (
            "numafleet_reboot",
            "numafleet_reboot is not a variable of numafleet.tuning; "
            "did you mean numafleet_reboot_ok?",
        ),
        (
            "numafleet_xyz",
            "numafleet_xyz is not a variable of numafleet.tuning "
            "(docs/host_variables.md lists them).",
        ),
        (
            "numafleet_drift_run",
            "numafleet_drift_run is not a host variable: drift_check.yml set it for its own "
            "play up to 0.2, for the drift_report callback, which writes nothing now; remove it "
            "from the inventory.",
        ),
    ],
)
def test_an_unknown_name_is_a_problem_with_a_suggestion(name, expected):
    assert schema.unknown_problems([name, "numafleet_render_root"]) == [expected]


@pytest.mark.parametrize(
    "name",
    [
        "numafleet_placements",
        "numafleet_restart",
        "numafleet_plan",  # a fact (inject_facts_as_vars)
        "numafleet_state_paths",
        "numafleet_changes",
        "numafleet_recorded",
        "__numafleet_site_plan",  # registered by the playbooks
        "__numafleet_inputs_check",
        "demo_root",  # not ours
        "numa_kernel_thp_enabled",  # a role input: role_input_problems' business
        "ansible_connection",
    ],
)
def test_known_facts_internal_and_foreign_names_are_not_unknown(name):
    assert schema.unknown_problems([name]) == []


def test_any_fact_name_is_ignored():
    assert schema.unknown_problems(["numafleet_new_fact"], ignore=["numafleet_new_fact"]) == []


def test_unknown_names_are_reported_once_each_in_order():
    problems = schema.unknown_problems(["numafleet_zzz", "numafleet_aaa", "numafleet_zzz"])
    assert [p.split()[0] for p in problems] == ["numafleet_aaa", "numafleet_zzz"]


# -- role inputs set for a host ----------------------------------------------------------------


@pytest.mark.parametrize("playbook", schema.ROLE_INPUT_PLAYBOOKS)
def test_a_role_input_the_playbook_sets_names_the_host_variable(playbook):
    assert schema.role_input_problems(["numa_kernel_thp_enabled"], playbook) == [
        f"numa_kernel_thp_enabled is set for this host, but {playbook} sets it from "
        "numafleet_thp_enabled; set numafleet_thp_enabled instead (the playbook reads that host "
        "variable, not the role input, so this one would be ignored)."
    ]


def test_a_role_input_given_as_extra_var_is_refused_with_the_extra_var_to_use():
    assert schema.role_input_problems(
        ["numa_kernel_thp_enabled"], schema.SITE, ["numa_kernel_thp_enabled"]
    ) == [
        "numa_kernel_thp_enabled is set for this host, but site.yml sets it from "
        "numafleet_thp_enabled; pass -e numafleet_thp_enabled=... instead (one name for each "
        "setting)."
    ]


def test_a_plan_input_set_for_a_host_is_refused():
    (problem,) = schema.role_input_problems(["pinned_services_plan"])
    assert problem.startswith("pinned_services_plan is set for this host, but site.yml sets it")
    assert "ansible_facts.numafleet_plan" in problem and "numafleet_placements" in problem


@pytest.mark.parametrize(
    "name",
    [*schema.INVENTORY_ROLE_INPUTS, "hugepages_result", "numafleet_thp_enabled"],
)
def test_role_inputs_the_playbooks_leave_alone_are_fine(name):
    assert schema.role_input_problems([name]) == []


@pytest.mark.parametrize("playbook", [schema.VERIFY, schema.FACTS, schema.CAPTURE])
def test_playbooks_without_role_inputs_do_not_refuse_them(playbook):
    assert schema.role_input_problems(["numa_kernel_thp_enabled"], playbook) == []


# -- play keywords -----------------------------------------------------------------------------


def test_a_play_keyword_variable_set_in_the_inventory_is_refused():
    assert schema.extra_vars_problems(["numafleet_serial", "numafleet_thp_enabled"], []) == [
        "numafleet_serial is set for this host, but a play keyword reads it, which sees extra "
        "vars only, so this value would be ignored; pass it on the command line instead "
        "(-e numafleet_serial=...)."
    ]


def test_a_play_keyword_variable_given_as_extra_var_is_fine():
    names = ["numafleet_serial", "numafleet_max_fail_percentage"]
    assert schema.extra_vars_problems(names, names) == []
    assert {var.name for var in schema.HOST_VARS if var.extra_vars_only} == set(names)


# -- values ------------------------------------------------------------------------------------


def test_checked_names_follow_the_readers_and_leave_validated_ones_alone():
    site = schema.checked_names(schema.SITE)
    assert {"numafleet_thp_enabled", "numafleet_max_removals", "numafleet_restart"} <= site
    assert "numafleet_placements" not in site  # numa_plan's own messages
    assert "numafleet_cgroup_root" not in site  # not read by site.yml
    verify = schema.checked_names(schema.VERIFY)
    assert "numafleet_cgroup_root" in verify and "numafleet_thp_enabled" not in verify
    assert "numafleet_verify_window_s" not in verify  # the playbook's own check
    assert schema.checked_names(schema.FACTS) == {
        "numafleet_sysfs_root",
        "numafleet_procfs_root",
        "numafleet_gpu_snapshot",
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"numafleet_thp_enabled": "sometimes"},
            [
                "value of numafleet_thp_enabled must be one of: always, madvise, never, leave, "
                "got: sometimes."
            ],
        ),
        (
            {"numafleet_reboot_ok": "maybe"},
            [
                "argument 'numafleet_reboot_ok' is of type str and we were unable to convert to "
                "bool: The value 'maybe' is not a valid boolean; write true or false."
            ],
        ),
        (
            {"numafleet_max_removals": -1},
            ["numafleet_max_removals is -1; write a whole number 0 or more."],
        ),
        (
            {"numafleet_max_removals": "two"},
            [
                "argument 'numafleet_max_removals' is of type str and we were unable to convert "
                "to int: \"'two'\" cannot be converted to an int."
            ],
        ),
        (
            {"numafleet_restart": "sometimes"},
            ["value of numafleet_restart must be one of: auto, never, got: sometimes."],
        ),
        (
            {"numafleet_hugepages_mounts": [{"size": "1G", "bogus": 1}]},
            [
                "missing required arguments: path found in numafleet_hugepages_mounts.",
                "unknown key numafleet_hugepages_mounts.bogus; known keys: group, mode, path, "
                "size.",
            ],
        ),
        (
            {"numafleet_hugepages_mounts": "/dev/hugepages1G"},
            [
                "Elements value for option 'numafleet_hugepages_mounts' is of type str "
                "and we were unable to convert to dict: dictionary requested, could not parse "
                "JSON or key=value."
            ],
        ),
        (
            {"numafleet_irqbalance_banned": None},
            [
                "numafleet_irqbalance_banned is null (an empty value in YAML); write a value or "
                "remove it for the default (auto)."
            ],
        ),
    ],
    ids=["choice", "bool", "minimum", "int", "restart", "mount-keys", "mount-str", "null"],
)
def test_a_value_that_does_not_fit_names_the_host_variable(values, expected):
    assert schema.type_problems(values) == expected


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"numafleet_render_root": None, "numafleet_gpu_snapshot": None},  # null = unset
        {"numafleet_zone_reclaim_mode": 1},  # YAML int, read as "1"
        {"numafleet_reboot_ok": "yes", "numafleet_stop_on_plan_failure": "false"},  # -e strings
        {"numafleet_max_removals": "0", "numafleet_allow_removals": True},
        {"numafleet_hugepages_mounts": [{"path": "/dev/hugepages1G", "size": "1G"}]},
        {"numafleet_hugepages_boot_reserve": ["1G", 1048576]},
        {"numafleet_irqbalance_banned": "0-1,64-65", "numafleet_mig_parted_config": ""},
    ],
)
def test_values_that_fit_are_no_problem(values):
    assert schema.type_problems(values) == []


def test_the_message_names_the_host_and_ends_with_the_fix():
    problems = [
        "numafleet_placement is not a variable of numafleet.tuning; did you mean "
        "numafleet_placements?"
    ]
    assert schema.message("gpu-a100-01", problems) == (
        "host gpu-a100-01: numafleet_placement is not a variable of numafleet.tuning; did you "
        f"mean numafleet_placements? {FIX}"
    )
    assert schema.message("h", ["a.", "b."]) == f"host h: a. b. {FIX}"


@pytest.mark.parametrize(
    ("value", "text"),
    [(True, "true"), (False, "false"), ("", '""'), ([], "[]"), (None, "unset"), (15, "15")],
)
def test_default_text(value, text):
    assert schema.default_text(value) == text
    assert schema.default_text(schema.REQUIRED) == "required"


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("pinned_services_hardning", "pinned_services_hardening"),
        ("nvidia_mps_control_pth", "nvidia_mps_control_path"),
        ("numa_kernel_thp_enable", "numa_kernel_thp_enabled"),
    ],
)
def test_a_misspelt_role_input_gets_a_suggestion(name, meant):
    assert schema.role_input_problems([name]) == [
        f"{name} is not an input of the collection's roles; did you mean {meant}?"
    ]


@pytest.mark.parametrize(
    "name", ["hugepages_for_my_db", "pinned_services_result", "hugepages_reboot_required"]
)
def test_other_variables_with_a_role_prefix_are_left_alone(name):
    assert schema.role_input_problems([name]) == []
