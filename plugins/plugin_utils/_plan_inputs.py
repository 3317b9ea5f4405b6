# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Private to this collection: the planner's inputs from a host's variables.

numa_plan (``playbook:`` set) reads them before the plan gate, and host_apply hands them to the
module so that it can plan again with the same inputs once new MIG devices exist. Defaults are
the host-variable schema's (``_host_vars.HOST_VARS``); an empty host_vars key (YAML null) means
"none", as numa_plan reads it.
"""

from __future__ import annotations

from ansible_collections.numafleet.tuning.plugins.plugin_utils._host_vars import BY_NAME

# numa_plan option: the host variable it comes from under site.yml, drift_check.yml and verify.yml.
PLAN_VARIABLES = {
    "placements": "numafleet_placements",
    "tenants": "numafleet_tenants",
    "reserved_cpus": "numafleet_reserved_cpus",
    "partition": "numafleet_partition",
    "memory_headroom_pct": "numafleet_memory_headroom_pct",
    "hugepages_extra": "numafleet_hugepages_extra",
    "gpu_partitions": "numafleet_gpu_partitions",
    "mig_gpus": "numafleet_mig_gpus",
    "repack": "numafleet_repack",
    "restart": "numafleet_restart",
    "max_removals": "numafleet_max_removals",
    "allow_removals": "numafleet_allow_removals",
    # The change plan says whether a memory partition change reloads amdgpu or waits.
    "amd_reset_ok": "numafleet_amd_reset_ok",
}
# Where the topology is read (numa_facts' options), for the re-read after a MIG change.
TOPOLOGY_VARIABLES = {
    "sysfs_root": "numafleet_sysfs_root",
    "procfs_root": "numafleet_procfs_root",
    "gpu_snapshot": "numafleet_gpu_snapshot",
}


def _value(variables, name: str):
    """The host variable's value, or the schema's default when it is not set."""
    return variables.get(name, BY_NAME[name].default)


def plan_inputs(variables) -> dict:
    """{numa_plan option: value} from the host variables (schema defaults where unset)."""
    return {option: _value(variables, name) for option, name in PLAN_VARIABLES.items()}


def _list(value) -> list:
    return [] if value is None else value


def replan_inputs(variables, facts: dict) -> dict:
    """The module host_apply's ``replan`` option: what numa_plan planned from, on the host.

    Shape: {numa, placements, tenants, policy: {reserved_cpus, memory_headroom_pct, partition},
    hugepages_extra, mig_gpus, sysfs_root, procfs_root, gpu_snapshot (left out when unset)}.
    """
    inputs = plan_inputs(variables)
    gpu = {option: _value(variables, name) for option, name in TOPOLOGY_VARIABLES.items()}
    replan = {
        "numa": facts.get("numa") or {},
        "placements": _list(inputs["placements"]),
        "tenants": _list(inputs["tenants"]),
        "policy": {
            "reserved_cpus": "" if inputs["reserved_cpus"] is None else inputs["reserved_cpus"],
            "memory_headroom_pct": inputs["memory_headroom_pct"],
            "partition": inputs["partition"],
        },
        "hugepages_extra": _list(inputs["hugepages_extra"]),
        # numafleet_gpu_partitions, else the deprecated numafleet_mig_gpus (numa_plan refused
        # both set before the gate): the one list the planner gets, under its old key.
        "mig_gpus": _list(inputs["gpu_partitions"]) or _list(inputs["mig_gpus"]),
    }
    replan.update({key: value for key, value in gpu.items() if value is not None})
    return replan


# What the measurement of the planned services reads (numa_locality_info's options).
MEASURE_VARIABLES = {
    "sysfs_root": ("numafleet_sysfs_root", "/sys"),
    "procfs_root": ("numafleet_procfs_root", "/proc"),
    "cgroup_root": ("numafleet_cgroup_root", "/sys/fs/cgroup"),
    "window_s": ("numafleet_verify_window_s", 5),
    "perf": ("numafleet_verify_perf", "auto"),
}


def measure_inputs(variables) -> dict:
    """The module host_apply's ``measure`` option from the host variables (verify.yml's
    measurement settings, checked before by verify_problems / the drift input checks)."""
    measured = {}
    for option, (name, default) in MEASURE_VARIABLES.items():
        value = variables.get(name, default)
        measured[option] = default if value is None else value
    measured["window_s"] = float(measured["window_s"])
    # The memory guard's files are read on every host (a spilled placement is reported as such
    # whatever the host's settings now); its service is asked about where the guard is enabled.
    enabled = variables.get("numafleet_memory_guard", True)
    measured["guard"] = {
        "service": enabled is not False and str(enabled).lower() not in ("false", "no", "0", "off")
    }
    return measured
