"""The schema of the host variables, the Python that reads them, the playbooks and the roles agree.

site.yml and drift_check.yml hand the host variables to the apply in Python: numa_plan (option
playbook) checks every input of the apply before the gate, and host_apply shapes the module's
arguments with the same code (plugin_utils/_apply_args.py site_inputs and build,
_plan_inputs.py). No play variable stands between the inventory and them. That only holds while

- every role option is handed over by site_inputs (from the host variable the schema names, with
  the schema's default), left to the inventory (the schema's INVENTORY_ROLE_INPUTS), or the plan;
- the schema's type, choices, default and keys of each host variable are those of the role
  inputs it feeds (meta/argument_specs.yml);
- every numafleet_* variable a playbook, the Python it runs, a role or an inventory of the
  repository reads is in the schema, with that playbook among its readers, so that the check
  never calls it unknown;
- the schema's keys of the plan's variables are the planner's (placements.py) and its defaults
  are those of numa_plan and numa_verify.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.numafleet.tuning.plugins.action.numa_plan import (
    ARGUMENT_SPEC as PLAN_SPEC,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import placements
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.verify import (
    DEFAULT_THRESHOLDS,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _apply_args, _plan_inputs
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _host_vars as schema

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
ROLES = [
    "hugepages",
    "numa_kernel",
    "nvidia_gpu",
    "amd_partition",
    "nvidia_mig",
    "nvidia_mps",
    "pinned_services",
]
SOURCES = schema.role_input_sources()
# A numafleet_* name that is read: not an attribute (ansible_facts.numafleet_plan), not internal
# (__numafleet_site_plan), not a file name (numafleet_drift.prom).
READ = re.compile(r"(?<![\w./])numafleet_[a-z0-9_]+(?![a-z0-9_])(?!\.(?:prom|json|ya?ml|py)\b)")
DEFAULT = re.compile(r"(?<![\w.])(numafleet_\w+)\s*\|\s*default\(([^()]*)\)")
# The host variables each playbook's tasks read in Python (numa_plan with playbook:, host_apply).
_APPLY_READS = set(SOURCES.values()) | set(_plan_inputs.PLAN_VARIABLES.values())
_MEASURE_READS = {name for name, dummy in _plan_inputs.MEASURE_VARIABLES.values()}
PYTHON_READS = {
    schema.SITE: _APPLY_READS | set(_plan_inputs.TOPOLOGY_VARIABLES.values()),
    schema.DRIFT: _APPLY_READS | _MEASURE_READS | {"numafleet_drift_fail"},
    # The plan (not its change plan: restart, the removal guard and the AMD reset do not matter
    # there), the units layer in check mode and the measurement.
    schema.VERIFY: set(_plan_inputs.PLAN_VARIABLES.values())
    - {
        "numafleet_restart",
        "numafleet_max_removals",
        "numafleet_allow_removals",
        "numafleet_amd_reset_ok",
    }
    | _MEASURE_READS
    | {"numafleet_render_root", "numafleet_gpu_snapshot"},
}


def _options(role: str) -> dict:
    spec = yaml.safe_load(
        (REPO / "roles" / role / "meta" / "argument_specs.yml").read_text("utf-8")
    )
    return spec["argument_specs"]["main"]["options"]


ALL_OPTIONS = {name: option for role in ROLES for name, option in _options(role).items()}


def _strings(node, messages=True):
    """Every string (keys and values) of a loaded YAML document; messages=False skips msg:."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not messages and key in ("msg", "fail_msg", "success_msg"):
                continue
            yield from _strings(key, messages)
            yield from _strings(value, messages)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, messages)
    elif isinstance(node, str):
        yield node


def _read_names(*paths) -> set:
    names = set()
    for path in paths:
        for text in _strings(yaml.safe_load(path.read_text(encoding="utf-8"))):
            names.update(READ.findall(text))
    return names - set(schema.FACT_NAMES)


def _literal(text: str):
    """The value of a default() argument written as a literal; ... (Ellipsis) for expressions."""
    text = text.strip()
    if text in ("none", "None"):
        return None
    if text in ("true", "false", "[]", "{}") or re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):
        return yaml.safe_load(text)
    if re.fullmatch(r"'[^']*'|\"[^\"]*\"", text):
        return text[1:-1]
    return ...


# -- site_inputs and the roles --------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_every_role_option_is_handed_over_left_to_the_inventory_or_the_plan(role):
    options = set(_options(role))
    handed = {name for name in _apply_args.site_inputs({}) if name.startswith(role + "_")}
    handed_from_host_vars = {name for name in handed if name in SOURCES}
    left = {name for name in options if name in schema.INVENTORY_ROLE_INPUTS}
    assert handed == options - {f"{role}_plan"}, options ^ handed
    assert handed_from_host_vars | left == handed, handed - handed_from_host_vars - left
    assert f"{role}_plan" in schema.PLAN_INPUTS


def test_the_inputs_left_to_the_inventory_are_role_options():
    assert set(schema.INVENTORY_ROLE_INPUTS) <= set(ALL_OPTIONS)
    assert not set(schema.INVENTORY_ROLE_INPUTS) & set(SOURCES)
    # site.yml reads them from the host as they are.
    for name in schema.INVENTORY_ROLE_INPUTS:
        assert _apply_args.site_inputs({name: "given"})[name] == "given"


@pytest.mark.parametrize("role_input", sorted(SOURCES))
def test_site_inputs_hand_each_input_the_host_variable_the_schema_names(role_input):
    given = {SOURCES[role_input]: "from-the-host"}
    if role_input in ("nvidia_mig_snapshot", "nvidia_gpu_snapshot"):  # render mode only
        given["numafleet_render_root"] = "/srv/render"
    assert _apply_args.site_inputs(given)[role_input] == "from-the-host"


@pytest.mark.parametrize("role_input", sorted(SOURCES))
def test_site_inputs_defaults_are_the_schemas(role_input):
    assert _apply_args.site_inputs({})[role_input] == schema.BY_NAME[SOURCES[role_input]].default


@pytest.mark.parametrize("role_input", sorted(SOURCES))
def test_the_schema_has_the_argument_spec_of_each_role_input(role_input):
    var = schema.BY_NAME[SOURCES[role_input]]
    option = ALL_OPTIONS[role_input]
    assert var.type == option["type"], role_input
    assert list(var.choices) == list(option.get("choices", [])), role_input
    assert var.default == option.get("default"), role_input
    assert var.elements == option.get("elements"), role_input
    keys = {key.name: key for key in var.keys}
    suboptions = option.get("options", {})
    assert sorted(keys) == sorted(suboptions), role_input
    for name, sub in suboptions.items():
        assert keys[name].type == sub["type"], (role_input, name)
        assert (keys[name].default is schema.REQUIRED) == bool(sub.get("required")), name


@pytest.mark.parametrize("role_input", sorted(SOURCES))
def test_each_role_input_defaults_to_its_specs_default(role_input):
    role = next(role for role in ROLES if role_input.startswith(role + "_"))
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text("utf-8"))
    assert defaults[role_input] == ALL_OPTIONS[role_input].get("default")


def test_restart_is_the_same_input_of_both_roles():
    for name in ("pinned_services_restart", "nvidia_mps_restart"):
        option = ALL_OPTIONS[name]
        assert option["type"] == "str" and option["choices"] == ["auto", "never"]
        assert option["default"] == "auto"
    assert (
        ALL_OPTIONS["pinned_services_restart"]["description"]
        == ALL_OPTIONS["nvidia_mps_restart"]["description"]
    )


# -- the playbooks -------------------------------------------------------------------------------


@pytest.mark.parametrize("playbook", schema.PLAYBOOKS)
def test_every_variable_a_playbook_reads_is_in_the_schema_with_that_reader(playbook):
    names = (_read_names(PLAYBOOKS / playbook) | PYTHON_READS.get(playbook, set())) - set(
        schema.PLAY_VARIABLES
    )
    assert names, playbook
    unknown = sorted(names - set(schema.BY_NAME))
    assert not unknown, f"{playbook} reads {unknown}: add them to _host_vars.HOST_VARS"
    readers = {name for name in names if playbook in schema.BY_NAME[name].used_by}
    assert names == readers, f"add {playbook} to used_by of {sorted(names - readers)}"


@pytest.mark.parametrize("playbook", schema.PLAYBOOKS)
def test_the_playbooks_defaults_are_the_schemas(playbook):
    for path in [PLAYBOOKS / playbook]:
        # Messages print unset values their own way (numafleet_render_root | default('')).
        for text in _strings(yaml.safe_load(path.read_text(encoding="utf-8")), messages=False):
            for name, argument in DEFAULT.findall(text):
                value = _literal(argument)
                if value is not ... and name in schema.BY_NAME:
                    assert value == schema.BY_NAME[name].default, (path.name, name, argument)


def test_the_roles_and_inventories_name_only_known_variables():
    paths = [
        *REPO.glob("roles/*/*/*.yml"),
        *REPO.glob("inventories/**/*.yml"),
        REPO / "molecule" / "numa_vm" / "molecule.yml",
    ]
    unknown = {
        path.relative_to(REPO).as_posix(): sorted(_read_names(path) - set(schema.BY_NAME))
        for path in paths
    }
    assert not {path: names for path, names in unknown.items() if names}


def flat_tasks(tasks) -> list:
    """Every task of ``tasks``, the tasks inside block/rescue/always included, in order."""
    out = []
    for task in tasks or ():
        out.append(task)
        for key in ("block", "rescue", "always"):
            out.extend(flat_tasks(task.get(key)))
    return out


def test_the_play_variables_are_set_by_their_playbook():
    play = yaml.safe_load((PLAYBOOKS / "drift_check.yml").read_text(encoding="utf-8"))[0]
    # numafleet_drift_run is retired (it fed the callback, which writes nothing now): still
    # refused as a host variable, no longer set by the play.
    assert "numafleet_drift_run" not in play["vars"]
    assert set(schema.PLAY_VARIABLES) - {"numafleet_drift_run"} <= set(play["vars"])


@pytest.mark.parametrize("playbook", ["site.yml", "drift_check.yml", "verify.yml"])
def test_the_playbooks_check_the_host_variables_then_plan_from_them(playbook):
    """host_vars_check first (before the facts and the plan, whose guards would otherwise answer
    a misspelt numafleet_placements before the "did you mean"), then numa_plan reads the host
    variables and runs the playbook's input checks; host_apply takes no play variable."""
    plays = yaml.safe_load((PLAYBOOKS / playbook).read_text(encoding="utf-8"))
    tasks = [task for play in plays for task in flat_tasks(play["tasks"])]
    names = [task["name"] for task in tasks]
    first = next(task for task in tasks if "numafleet.tuning.host_vars_check" in task)
    assert first["numafleet.tuning.host_vars_check"] == {"playbook": playbook}
    (plan,) = [task for task in tasks if "numafleet.tuning.numa_plan" in task]
    assert plan["numafleet.tuning.numa_plan"] == {"playbook": playbook}
    assert names.index(first["name"]) < names.index("Gather NUMA and GPU topology")
    assert names.index("Gather NUMA and GPU topology") < names.index(plan["name"])
    (apply,) = [task for task in tasks if "numafleet.tuning.host_apply" in task]
    assert set(apply["numafleet.tuning.host_apply"] or {}) <= {"layers", "measure"}
    assert not any("vars_files" in play for play in plays)


def test_site_yml_plans_every_host_before_it_applies_any():
    plays = yaml.safe_load((PLAYBOOKS / "site.yml").read_text(encoding="utf-8"))
    plan, apply = plays
    assert "serial" not in plan and "serial" in apply
    gate = plan["tasks"][-1]
    assert gate["run_once"] and gate["any_errors_fatal"] and "ansible.builtin.fail" in gate
    registered = [task.get("register") for task in plan["tasks"]]
    assert {"__numafleet_inputs_check", "__numafleet_site_plan"} <= set(registered)
    assert "['__numafleet_inputs_check', '__numafleet_site_plan']" in json.dumps(gate["vars"])
    # The memory guard first: the pinned units' ExecStartPre= runs its preflight.
    assert [task["name"] for task in apply["tasks"]][:2] == [
        "Install the memory guard",
        "Apply the placements",
    ]


def test_verify_checks_the_host_variables_before_reading_the_host():
    tasks = flat_tasks(yaml.safe_load((PLAYBOOKS / "verify.yml").read_text("utf-8"))[0]["tasks"])
    names = [task["name"] for task in tasks]
    check = names.index("Check the host variables")
    assert tasks[check]["numafleet.tuning.host_vars_check"] == {"playbook": "verify.yml"}
    assert check < names.index("Gather NUMA and GPU topology")


# -- the plan's variables ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "keys"),
    [
        ("numafleet_placements", placements.PLACEMENT_KEYS),
        ("numafleet_tenants", placements.TENANT_KEYS),
        ("numafleet_hugepages_extra", placements.HUGEPAGES_EXTRA_KEYS),
        ("numafleet_mig_gpus", placements.MIG_GPU_KEYS),
        ("numafleet_gpu_partitions", placements.GPU_PARTITION_KEYS),
    ],
)
def test_the_schema_has_the_planners_keys_in_its_order(var, keys):
    assert tuple(key.name for key in schema.BY_NAME[var].keys) == keys


def test_the_schema_has_the_planners_nested_keys():
    placement = {key.name: key for key in schema.BY_NAME["numafleet_placements"].keys}
    assert tuple(key.name for key in placement["hugepages"].keys) == placements.HUGEPAGE_KEYS
    assert tuple(key.name for key in placement["mps"].keys) == placements.MPS_KEYS
    mig = {key.name: key for key in schema.BY_NAME["numafleet_mig_gpus"].keys}
    assert tuple(key.name for key in mig["layout"].keys) == placements.MIG_INSTANCE_KEYS
    assert mig["mode"].choices == placements.MIG_MODES
    partitions = {key.name: key for key in schema.BY_NAME["numafleet_gpu_partitions"].keys}
    assert partitions["compute_partition"].choices == placements.AMD_COMPUTE_PARTITIONS
    assert partitions["memory_partition"].choices == placements.AMD_MEMORY_PARTITIONS
    assert placement["cpus"].default is schema.REQUIRED
    assert placement["name"].default is schema.REQUIRED


def test_the_plan_and_verify_defaults_are_the_schemas():
    for option, var in (
        ("placements", "numafleet_placements"),
        ("tenants", "numafleet_tenants"),
        ("reserved_cpus", "numafleet_reserved_cpus"),
        ("memory_headroom_pct", "numafleet_memory_headroom_pct"),
        ("hugepages_extra", "numafleet_hugepages_extra"),
        ("mig_gpus", "numafleet_mig_gpus"),
        ("gpu_partitions", "numafleet_gpu_partitions"),
    ):
        assert PLAN_SPEC[option]["default"] == schema.BY_NAME[var].default, option
        assert schema.BY_NAME[var].checked_by == "numafleet.tuning.numa_plan", var
    assert schema.BY_NAME["numafleet_memory_headroom_pct"].default == (
        placements.DEFAULT_HEADROOM_PCT
    )
    for threshold, value in DEFAULT_THRESHOLDS.items():
        assert schema.BY_NAME[f"numafleet_{threshold}"].default == value
