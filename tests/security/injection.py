"""The injection matrix: every user-settable string field x a payload corpus, through every layer.

Each case is one host's variables: a valid base (``BASE``: placements with exec, a drop-in, MPS,
a tenant, a hugetlbfs mount, the MIG and kernel settings) with one field set to one payload. The
case goes through:

1. the controller's input pass, as site.yml runs it before the plan gate: the action
   ``numafleet.tuning.host_vars_check``, the action ``numafleet.tuning.numa_plan`` (changes: true,
   which renders the units and MPS files), and the roles' module checks
   (``plugin_utils/_module_inputs.py``, which ``plugin_utils/_apply_args.py`` runs for numa_plan
   and the host_apply action);
2. when the pass accepts it: every apply module of site.yml, run in-process in check mode and
   render mode (pinned_units, nvidia_mps, numa_hugepages, numa_kernel, nvidia_mig), as the roles'
   apply tasks call them;
3. when every module accepts it: the files the modules would write, read back with the systemd
   unit-file reader of the tests (``tests/unit/systemd_syntax.py``), must give the payload back.

Outcomes: ``rejected`` (by the input pass, naming the host and the variable), ``round_trip``
(accepted and read back exactly), ``accepted`` (accepted; the field is not written into a unit
file, so there is nothing to read back), ``late`` (accepted by the input pass, refused by a module:
by then other files of the host were written), ``wrong_render`` (accepted everywhere, read back
differently) and ``unnamed`` (rejected without the host and the variable in the message).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

from ansible.module_utils.testing import patch_module_args

from ansible_collections.numafleet.tuning.plugins.action.host_vars_check import (
    ActionModule as HostVarsCheck,
)
from ansible_collections.numafleet.tuning.plugins.action.numa_plan import ActionModule as NumaPlan
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _apply_args, _host_vars

HOST = "inj-01"
UNIT_DIR = "/etc/systemd/system"

# -- the payload corpus ---------------------------------------------------------------------------
PAYLOADS = {
    "specifier": "a%nb",
    "percent-percent": "a%%b",
    "dollar-var": "a$HOME",
    "dollar-brace": "a${X}b",
    "dollar-dollar": "a$$b",
    "single-quote": "it's",
    "double-quote": 'say "hi"',
    "backslash": "a\\tb",
    "trailing-backslash": "abc\\",
    "newline": "a\nb",
    "trailing-newline": "abc\n",
    "carriage-return": "a\rb",
    "tab": "a\tb",
    "nel": "a\x85b",
    "line-separator": "a\u2028b",
    "nul": "a\x00b",
    "long-5000": "x" * 5000,
    "accents": "café-naïve",
    "emoji": "gpu-\U0001f680",
    "rtl": "\u05e9\u05dc\u05d5\u05dd",
    "traversal": "../../etc/passwd",
    "leading-space": " abc",
    "trailing-space": "abc ",
    "empty": "",
    "semicolon": "a;b",
    "hash": "#x",
}

# -- the base host: every field below is valid in it -----------------------------------------------
BASE = {
    "numafleet_placements": [
        {
            "name": "llm",
            "tenant": "team-a",
            "description": "LLM server",
            "exec": "/opt/vllm/bin/vllm serve --port 8000",
            "user": "vllm",
            "group": "vllm",
            "gpus": 1,
            "cpus": 8,
            "memory": "16G",
            "hugepages": {"size": "2M", "count": 16},
            "environment": {"HF_HOME": "/srv/hf"},
        },
        {
            "name": "rerank",
            "exec": "/opt/tei/bin/router --port 8082",
            "user": "tei",
            "gpus": 1,
            "mps": {"active_thread_percentage": 50, "pinned_memory_limit": "8G"},
            "cpus": 4,
        },
        {"name": "vendor", "unit": "vendor.service", "cpus": 4},
    ],
    "numafleet_tenants": [{"name": "team-a", "memory_max": "200G", "description": "Team A"}],
    "numafleet_reserved_cpus": "0,64",
    "numafleet_hugepages_mounts": [
        {"path": "/dev/hugepages2M", "size": "2M", "mode": "1770", "group": "vllm"}
    ],
    "numafleet_mig_gpus": [{"gpu": "0000:17:00.0", "mode": "enabled", "layout": ["3g.40gb"]}],
    "numafleet_mig_parted_config": "/etc/numafleet/mig-parted.yaml",
    "numafleet_irqbalance_banned": "auto",
}


def _set(path: tuple) -> Callable[[dict, str], None]:
    def setter(hostvars: dict, value: str) -> None:
        target = hostvars
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return setter


def _env_key(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][0]["environment"] = {value: "1"}


def _exec_word(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][0]["exec"] = "/opt/vllm/bin/vllm " + shlex.quote(value)


def _exec_program(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][0]["exec"] = shlex.quote("/opt/" + value) + " serve"


def _exec_raw(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][0]["exec"] = "/opt/vllm/bin/vllm serve " + value


def _tenant_name(hostvars: dict, value: str) -> None:
    hostvars["numafleet_tenants"][0]["name"] = value
    hostvars["numafleet_placements"][0]["tenant"] = value


def _mps_user(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][1]["user"] = value


def _unit_name(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][2]["unit"] = value + ".service"


def _kernel_choice(name: str):
    return lambda hostvars, value: hostvars.__setitem__(name, value)


def _path(name: str):
    """An absolute path that holds the payload: /srv/<payload>."""
    return lambda hostvars, value: hostvars.__setitem__(name, "/srv/" + value)


def _gpu_partitions(entry: dict) -> Callable[[dict, str], None]:
    """numafleet_gpu_partitions (instead of the deprecated numafleet_mig_gpus of the base) with
    one entry, the payload where entry holds None (a list: its first item)."""

    def setter(hostvars: dict, value: str) -> None:
        def fill(got):
            return value if got is None else [value] if got == [None] else got

        hostvars.pop("numafleet_mig_gpus", None)
        hostvars["numafleet_gpu_partitions"] = [{key: fill(got) for key, got in entry.items()}]

    return setter


def _amd_partition_placement(hostvars: dict, value: str) -> None:
    hostvars["numafleet_placements"][0].pop("gpus", None)
    hostvars["numafleet_placements"][0]["partition"] = value


def _boot_reserve(hostvars: dict, value: str) -> None:
    hostvars["numafleet_hugepages_boot_reserve"] = [value]


@dataclass(frozen=True)
class Field:
    """A user-settable string: its id, the variable the message must name, and how to set it."""

    id: str
    variable: str
    apply: Callable[[dict, str], None]
    # (layer, reader) of the round trip: the file of the rendered output and how to read it back.
    check: Optional[str] = None


P0 = ("numafleet_placements", 0)
FIELDS = (
    Field("placement.name", "numafleet_placements", _set((*P0, "name")), "name"),
    Field("placement.description", "numafleet_placements", _set((*P0, "description")), "desc"),
    Field("placement.exec.word", "numafleet_placements", _exec_word, "exec_word"),
    Field("placement.exec.program", "numafleet_placements", _exec_program, "exec_program"),
    Field("placement.exec.raw", "numafleet_placements", _exec_raw, "exec_raw"),
    Field("placement.environment.key", "numafleet_placements", _env_key, "env_key"),
    Field(
        "placement.environment.value",
        "numafleet_placements",
        _set((*P0, "environment", "HF_HOME")),
        "env_value",
    ),
    Field("placement.user", "numafleet_placements", _set((*P0, "user")), "user"),
    Field("placement.group", "numafleet_placements", _set((*P0, "group")), "group"),
    Field("placement.user (MPS client)", "numafleet_placements", _mps_user, "mps_user"),
    Field("placement.unit", "numafleet_placements", _unit_name, "unit"),
    Field("placement.tenant", "numafleet_placements", _set((*P0, "tenant"))),
    Field("placement.memory_limit", "numafleet_placements", _set((*P0, "memory_limit"))),
    Field("placement.tasks_max", "numafleet_placements", _set((*P0, "tasks_max"))),
    Field("placement.priority", "numafleet_placements", _set((*P0, "priority"))),
    Field(
        "placement.gpus",
        "numafleet_placements",
        lambda h, v: h["numafleet_placements"][0].update(gpus=[v]),
    ),  # fmt: skip
    Field("placement.near", "numafleet_placements", _set((*P0, "near"))),
    Field("placement.cpus", "numafleet_placements", _set((*P0, "cpus"))),
    Field("placement.memory", "numafleet_placements", _set((*P0, "memory"))),
    Field("placement.hugepages.size", "numafleet_placements", _set((*P0, "hugepages", "size"))),
    Field("placement.mig_profile", "numafleet_placements", _set((*P0, "mig_profile"))),
    Field(
        "placement.mps.pinned_memory_limit",
        "numafleet_placements",
        _set(("numafleet_placements", 1, "mps", "pinned_memory_limit")),
    ),
    Field("tenant.name", "numafleet_tenants", _tenant_name, "tenant_name"),
    Field(
        "tenant.description",
        "numafleet_tenants",
        _set(("numafleet_tenants", 0, "description")),
        "tenant_desc",
    ),
    Field("tenant.memory_max", "numafleet_tenants", _set(("numafleet_tenants", 0, "memory_max"))),
    Field("tenant.priority", "numafleet_tenants", _set(("numafleet_tenants", 0, "priority"))),
    Field("reserved_cpus", "numafleet_reserved_cpus", _kernel_choice("numafleet_reserved_cpus")),
    Field(
        "hugepages_mounts.path",
        "numafleet_hugepages_mounts",
        lambda h, v: h["numafleet_hugepages_mounts"][0].update(path="/srv/" + v),
        "mount_path",
    ),  # fmt: skip
    Field(
        "hugepages_mounts.mode",
        "numafleet_hugepages_mounts",
        _set(("numafleet_hugepages_mounts", 0, "mode")),
        "mount_mode",
    ),
    Field(
        "hugepages_mounts.group",
        "numafleet_hugepages_mounts",
        _set(("numafleet_hugepages_mounts", 0, "group")),
        "mount_group",
    ),
    Field(
        "hugepages_mounts.size",
        "numafleet_hugepages_mounts",
        _set(("numafleet_hugepages_mounts", 0, "size")),
    ),
    Field("hugepages_boot_reserve", "numafleet_hugepages_boot_reserve", _boot_reserve),
    Field(
        "hugepages_bootloader",
        "numafleet_hugepages_bootloader",
        _kernel_choice("numafleet_hugepages_bootloader"),
    ),
    Field(
        "hugepages_extra.size",
        "numafleet_hugepages_extra",
        lambda h, v: h.update(numafleet_hugepages_extra=[{"node": 0, "size": v, "count": 1}]),
    ),  # fmt: skip
    Field("mig_gpus.gpu", "numafleet_mig_gpus", _set(("numafleet_mig_gpus", 0, "gpu"))),
    Field("mig_gpus.mode", "numafleet_mig_gpus", _set(("numafleet_mig_gpus", 0, "mode"))),
    Field(
        "mig_gpus.layout.profile",
        "numafleet_mig_gpus",
        _set(("numafleet_mig_gpus", 0, "layout", 0)),
    ),
    Field(
        "mig_gpus.layout.compute_profile",
        "numafleet_mig_gpus",
        lambda h, v: h.update(
            numafleet_mig_gpus=[
                {"gpu": "0000:17:00.0", "layout": [{"profile": "3g.40gb", "compute_profile": v}]}
            ]
        ),
    ),  # fmt: skip
    Field("mig_backend", "numafleet_mig_backend", _kernel_choice("numafleet_mig_backend")),
    Field("gpu_partitions.gpu", "numafleet_gpu_partitions", _gpu_partitions({"gpu": None})),
    Field(
        "gpu_partitions.mode",
        "numafleet_gpu_partitions",
        _gpu_partitions({"gpu": "0000:17:00.0", "mode": None}),
    ),  # fmt: skip
    Field(
        "gpu_partitions.layout.profile",
        "numafleet_gpu_partitions",
        _gpu_partitions({"gpu": "0000:17:00.0", "layout": [None]}),
    ),  # fmt: skip
    Field(
        "gpu_partitions.compute_partition",
        "numafleet_gpu_partitions",
        _gpu_partitions({"gpu": "0000:17:00.0", "compute_partition": None}),
    ),  # fmt: skip
    Field(
        "gpu_partitions.memory_partition",
        "numafleet_gpu_partitions",
        _gpu_partitions({"gpu": "0000:17:00.0", "memory_partition": None}),
    ),  # fmt: skip
    Field("placement.partition", "numafleet_placements", _amd_partition_placement),
    Field("amd_backend", "numafleet_amd_backend", _kernel_choice("numafleet_amd_backend")),
    Field(
        "gpu_settings.gpu",
        "numafleet_gpu_settings",
        lambda h, v: h.update(numafleet_gpu_settings=[{"gpu": v, "power_limit_w": 300}]),
    ),
    Field(
        "gpu_settings.compute_mode",
        "numafleet_gpu_settings",
        lambda h, v: h.update(numafleet_gpu_settings=[{"gpu": "0000:17:00.0", "compute_mode": v}]),
    ),
    Field(
        "gpu_settings.application_clocks",
        "numafleet_gpu_settings",
        lambda h, v: h.update(
            numafleet_gpu_settings=[{"gpu": "0000:17:00.0", "application_clocks": v}]
        ),
    ),
    Field(
        "kernel_isolation",
        "numafleet_kernel_isolation",
        _kernel_choice("numafleet_kernel_isolation"),
    ),
    Field(
        "mig_parted_config",
        "numafleet_mig_parted_config",
        _path("numafleet_mig_parted_config"),
        "parted",
    ),
    Field(
        "irqbalance_banned",
        "numafleet_irqbalance_banned",
        _kernel_choice("numafleet_irqbalance_banned"),
    ),
    Field("numa_balancing", "numafleet_numa_balancing", _kernel_choice("numafleet_numa_balancing")),
    Field(
        "zone_reclaim_mode",
        "numafleet_zone_reclaim_mode",
        _kernel_choice("numafleet_zone_reclaim_mode"),
    ),
    Field("thp_enabled", "numafleet_thp_enabled", _kernel_choice("numafleet_thp_enabled")),
    Field("thp_defrag", "numafleet_thp_defrag", _kernel_choice("numafleet_thp_defrag")),
    Field("numad", "numafleet_numad", _kernel_choice("numafleet_numad")),
    Field("restart", "numafleet_restart", _kernel_choice("numafleet_restart")),
    Field("preflight", "numafleet_preflight", _kernel_choice("numafleet_preflight")),
    Field("memory_act", "numafleet_memory_act", _kernel_choice("numafleet_memory_act")),
    Field(
        "memory_guard_textfile_dir",
        "numafleet_memory_guard_textfile_dir",
        _path("numafleet_memory_guard_textfile_dir"),
    ),
    Field(
        "render_root",
        "numafleet_render_root",
        # Deep enough that ../../ stays below a directory that does not exist: whether the host
        # has a file where the render root points is the host's state, not the value's.
        lambda h, v: h.update(numafleet_render_root="/nonexistent/numafleet/render/" + v),
    ),
    Field(
        "pinned_services_unit_dir",
        "pinned_services_unit_dir",
        _path("pinned_services_unit_dir"),
        "unit_dir",
    ),
    Field(
        "pinned_services_manifest_path",
        "pinned_services_manifest_path",
        _path("pinned_services_manifest_path"),
        "manifest",
    ),
    Field(
        "nvidia_mps_unit_dir",
        "nvidia_mps_unit_dir",
        _path("nvidia_mps_unit_dir"),
        "mps_unit_dir",
    ),
    Field(
        "nvidia_mps_manifest_path",
        "nvidia_mps_manifest_path",
        _path("nvidia_mps_manifest_path"),
        "mps_manifest",
    ),
    Field(
        "nvidia_mps_control_path",
        "nvidia_mps_control_path",
        _path("nvidia_mps_control_path"),
        "mps_control",
    ),
    Field(
        "nvidia_mps_nvidia_smi_path",
        "nvidia_mps_nvidia_smi_path",
        _path("nvidia_mps_nvidia_smi_path"),
        "mps_smi",
    ),
)
# Fields left out, and why (quoted by the report).
LEFT_OUT = {
    "numafleet_sysfs_root, numafleet_procfs_root, numafleet_gpu_snapshot, numafleet_cgroup_root": (
        "read on the host by the facts modules, never written into a file; a bad path fails the "
        "facts task, before the plan, and nothing is written"
    ),
    "numafleet_report_dir, numafleet_capture_dir": (
        "controller directories of verify.yml, drift_check.yml and capture_topology.yml, which "
        "write no host"
    ),
    "numafleet_serial, numafleet_max_fail_percentage": "play keywords (extra vars only)",
    "numafleet_verify_*, numafleet_*_pct": "numbers of verify.yml and drift_check.yml",
    "drift_timer_*": (
        "the drift_timer role is not part of site.yml; its settings are checked by its own role "
        "(see the report)"
    ),
    "pinned_services_hardening, numafleet_repack, numafleet_allow_removals, *_ok": "booleans",
}


# -- running the layers -----------------------------------------------------------------------------
ROLE_DEFAULTS = {
    "pinned_services_hardening": True,
    "pinned_services_unit_dir": UNIT_DIR,
    "pinned_services_manifest_path": "/etc/numafleet/manifest.json",
    "nvidia_mps_unit_dir": UNIT_DIR,
    "nvidia_mps_manifest_path": "/etc/numafleet/mps-units.json",
    "nvidia_mps_control_path": "/usr/bin/nvidia-cuda-mps-control",
    "nvidia_mps_nvidia_smi_path": "/usr/bin/nvidia-smi",
}


def _action(cls, name: str, args: dict, task_vars: dict):
    task = SimpleNamespace(args=dict(args), async_val=0, check_mode=False, action=name)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    action = cls(task, connection, None, None, None)
    action._load_name = name
    return action.run(task_vars=task_vars)


def var(hostvars: dict, name: str):
    """The value a playbook reads: the host's, else the schema's (or role's) default."""
    if name in hostvars:
        return hostvars[name]
    if name in ROLE_DEFAULTS:
        return ROLE_DEFAULTS[name]
    return _host_vars.BY_NAME[name].default


@dataclass
class Env:
    """The host the cases run against: its facts and a recorded tree for the modules."""

    facts: dict
    fsroot: str
    snapshot: str
    render_root: str


def controller_pass(env: Env, hostvars: dict) -> tuple:
    """(message or None, plan or None, module args) of site.yml's plan play for the host.

    The same actions site.yml runs: host_vars_check, then numa_plan with ``playbook: site.yml``
    (the plan and every input check of the apply, _apply_args.build); the module arguments are
    what the host_apply action derives from the same host variables.
    """
    task_vars = {"inventory_hostname": HOST, "ansible_facts": {}, "hostvars": {HOST: hostvars}}
    result = _action(
        HostVarsCheck, "numafleet.tuning.host_vars_check", {"playbook": "site.yml"}, task_vars
    )
    if result.get("failed"):
        return result["msg"], None, None
    facts = copy.deepcopy(env.facts)
    task_vars = {
        "inventory_hostname": HOST,
        "ansible_facts": facts,
        "hostvars": {HOST: dict(hostvars, ansible_facts=facts)},
    }
    result = _action(NumaPlan, "numafleet.tuning.numa_plan", {"playbook": "site.yml"}, task_vars)
    if result.get("failed"):
        return result["msg"], None, None
    plan = result["ansible_facts"]["numafleet_plan"]
    return None, plan, module_args(env, hostvars, plan)


# The module of each layer of host_apply (the later layers run each module in check mode).
MODULE_OF = {
    "hugepages": "numa_hugepages",
    "kernel": "numa_kernel",
    "mig": "nvidia_mig",
    "mps": "nvidia_mps",
    "units": "pinned_units",
}


def module_args(env: Env, hostvars: dict, plan: dict) -> dict:
    """The arguments each apply module gets: host_apply's layer options as the host_apply action
    builds them (_apply_args.build on site_inputs), plus what host_apply supplies per layer
    (layers.supplied_params: pools, gpus, owned units, the plan, root, service_manager)."""
    applied = _apply_args.build(HOST, _apply_args.site_inputs(hostvars), plan, env.facts)
    options = applied.module_args
    modules = {}
    for layer, module in MODULE_OF.items():
        args = dict(options.get(layer) or {})
        args.update(
            layers.supplied_params(layer, plan, options["root"], options["service_manager"])
        )
        args.pop("service_manager", None)  # later_layers sets it (none: the matrix only reads)
        modules[module] = args
    return modules


def run_module(name: str, args: dict) -> dict:
    """The result of the collection's module ``name`` run in-process in check and diff mode."""
    import importlib

    module = importlib.import_module(f"ansible_collections.numafleet.tuning.plugins.modules.{name}")
    args = dict(args, _ansible_check_mode=True, _ansible_diff=True)
    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out):
        try:
            module.main()
        except SystemExit:
            pass
        except Exception as exc:  # a module's traceback (a late failure) is what a case may find
            return {"failed": True, "msg": f"Traceback: {exc!r}"}
    return json.loads(out.getvalue())


def later_layers(env: Env, modules: dict) -> tuple:
    """({module: result} of every apply module, [messages of the modules that refused])."""
    render = env.render_root
    extra = {
        "numa_hugepages": {
            "sysfs_root": f"{env.fsroot}/sys",
            "procfs_root": f"{env.fsroot}/proc",
            "service_manager": "none",
        },
        "numa_kernel": {
            "sysfs_root": f"{env.fsroot}/sys",
            "procfs_root": f"{env.fsroot}/proc",
            "service_manager": "none",
        },
        "nvidia_mig": {
            "snapshot": env.snapshot,
            "sysfs_root": f"{env.fsroot}/sys",
            "procfs_root": f"{env.fsroot}/proc",
            "service_manager": "none",
        },
        "nvidia_mps": {"service_manager": "none"},
        "pinned_units": {"service_manager": "none"},
    }
    results, refused = {}, []
    for name, args in modules.items():
        # Render mode: the module writes under a scratch root (check mode: it writes nothing),
        # or under the render root of the case.
        root = args.get("root") if args.get("root") not in (None, "/") else render
        args = dict(args, **extra[name], root=root)
        result = run_module(name, args)
        results[name] = result
        if result.get("failed"):
            refused.append(f"{name}: {result.get('msg')}")
    return results, refused


def rendered(results: dict) -> dict:
    """{host path: text} of every file the modules would write (their diffs, check mode)."""
    files = {}
    for result in results.values():
        for diff in result.get("diff") or []:
            if isinstance(diff, dict) and isinstance(diff.get("after"), str):
                files[diff.get("after_header")] = diff["after"]
    return files


# -- one case, the whole matrix ---------------------------------------------------------------------
# Characters a message must show escaped (repr/JSON), never raw.
_RAW = ("Cc", "Zl", "Zp")


@dataclass(frozen=True)
class Outcome:
    """What became of one (field, payload) case."""

    field: str
    payload: str
    kind: str  # rejected, round_trip, accepted, late, wrong_render, unnamed
    detail: str = ""


# Values of the wrong type: refused or accepted, never a traceback (run without the round trip).
TYPE_PAYLOADS = {
    "int": 5,
    "negative": -1,
    "float": 1.5,
    "bool": True,
    "null": None,
    "list": ["a"],
    "dict": {"a": 1},
}


def run_case(env: Env, field: Field, payload_name: str) -> Outcome:
    """The outcome of ``field`` set to the payload ``payload_name`` in a copy of BASE."""
    import unicodedata

    import roundtrip

    hostvars = copy.deepcopy(BASE)
    if payload_name in TYPE_PAYLOADS:
        try:
            field.apply(hostvars, TYPE_PAYLOADS[payload_name])
        except TypeError:  # a field built from a string ("/srv/" + value): not applicable
            return Outcome(field.id, payload_name, "rejected", "not applicable")
    else:
        field.apply(hostvars, PAYLOADS[payload_name])
    try:
        msg, dummy, modules = controller_pass(env, hostvars)
    except Exception as exc:  # a traceback on the controller is what a case may find
        return Outcome(field.id, payload_name, "unnamed", f"Traceback: {exc!r}")
    if msg is not None:
        named = msg.startswith(f"host {HOST}: ") and field.variable in msg
        raw = any(unicodedata.category(char) in _RAW for char in msg)
        if not named or raw or "Traceback" in msg:
            return Outcome(field.id, payload_name, "unnamed", msg[:300])
        return Outcome(field.id, payload_name, "rejected", msg[:300])
    results, refused = later_layers(env, modules)
    if refused:
        return Outcome(field.id, payload_name, "late", refused[0][:300])
    if field.check is None or payload_name in TYPE_PAYLOADS:
        return Outcome(field.id, payload_name, "accepted")
    files = rendered(results)
    try:
        want, got = roundtrip.read_back(field.check, hostvars, files)
    except (roundtrip.Missing, ValueError) as exc:  # UnitSyntaxError is a ValueError
        return Outcome(field.id, payload_name, "wrong_render", repr(exc)[:300])
    if want != got:
        return Outcome(field.id, payload_name, "wrong_render", f"{want!r} -> {got!r}"[:300])
    return Outcome(field.id, payload_name, "round_trip")


def run_matrix(env: Env) -> list:
    """Outcome of every field x payload."""
    return [run_case(env, field, name) for field in FIELDS for name in PAYLOADS]


KINDS = ("rejected", "round_trip", "accepted", "late", "wrong_render", "unnamed")


def counts(outcomes: list) -> dict:
    """{kind: number of cases} plus the matrix's size."""
    out = dict.fromkeys(KINDS, 0)
    for outcome in outcomes:
        out[outcome.kind] += 1
    out.update(cases=len(outcomes), fields=len(FIELDS), payloads=len(PAYLOADS))
    return out
