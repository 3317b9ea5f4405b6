"""The injection matrix (injection.py): every case is refused before the gate, or read back exactly.

A case refused by a module after the controller's input pass accepted it (``late``) would leave
the host half-changed while the other hosts go on; a case accepted everywhere and read back by
systemd as something else (``wrong_render``) would run something other than what was written.
Both must be none. Counts: tests/output/security/injection-matrix.json (also printed at the end
of the run).
"""

from __future__ import annotations

import fnmatch

import injection
import pytest

from ansible_collections.numafleet.tuning.plugins.plugin_utils import _host_vars

# (field, payload) cases a renderer is known to write so that systemd reads back something else.
# Empty: every context escapes or refuses. An entry would make the test below fail once fixed.
KNOWN_RENDER_GAPS: set = set()


def _of(matrix, kind):
    return [o for o in matrix if o.kind == kind]


def test_the_base_host_passes_every_layer(matrix_env):
    import copy

    msg, plan, modules = injection.controller_pass(matrix_env, copy.deepcopy(injection.BASE))
    assert msg is None, msg
    results, refused = injection.later_layers(matrix_env, modules)
    assert refused == []
    files = injection.rendered(results)
    assert "/etc/systemd/system/numafleet-llm.service" in files
    assert any(path.endswith(".mount") for path in files)
    assert any(".service.d/" in path and "nvidia-mps@" in path for path in files)


def test_no_late_rejection(matrix):
    """What a module or renderer refuses, the controller's input pass refused first."""
    late = _of(matrix, "late")
    assert late == [], "\n".join(f"{o.field} x {o.payload}: {o.detail}" for o in late)


def test_every_rejection_names_the_host_and_the_variable(matrix):
    """Messages start with the host, name the variable, show control characters escaped."""
    unnamed = _of(matrix, "unnamed")
    assert unnamed == [], "\n".join(f"{o.field} x {o.payload}: {o.detail!r}" for o in unnamed)


def test_accepted_values_read_back_exactly(matrix):
    wrong = {(o.field, o.payload): o.detail for o in _of(matrix, "wrong_render")}
    new = {case: detail for case, detail in wrong.items() if case not in KNOWN_RENDER_GAPS}
    assert new == {}, "\n".join(f"{f} x {p}: {d}" for (f, p), d in new.items())
    fixed = KNOWN_RENDER_GAPS - set(wrong)
    assert fixed == set(), f"fixed now, remove from KNOWN_RENDER_GAPS: {sorted(fixed)}"


def test_the_matrix_reads_back_what_it_accepts(matrix):
    """Fields written into unit files are read back: most accepted cases round-trip."""
    counts = injection.counts(matrix)
    assert counts["cases"] == len(injection.FIELDS) * len(injection.PAYLOADS)
    assert counts["round_trip"] >= 150
    assert counts["rejected"] >= 900


@pytest.mark.parametrize("payload", ["nel", "trailing-newline", "nul", "carriage-return"])
def test_control_payloads_are_refused_in_every_field(matrix, payload):
    """A NEL, a trailing newline, a CR or a NUL never reaches a host: refused before the gate."""
    kinds = {o.field: o.kind for o in matrix if o.payload == payload}
    assert set(kinds.values()) == {"rejected"}, kinds


@pytest.mark.parametrize("payload", sorted(injection.TYPE_PAYLOADS))
def test_values_of_the_wrong_type_never_end_in_a_traceback(matrix_env, payload):
    """A number, list, mapping, bool or null where a string goes: refused or taken, no crash."""
    outcomes = [injection.run_case(matrix_env, field, payload) for field in injection.FIELDS]
    bad = [o for o in outcomes if o.kind not in ("rejected", "accepted")]
    assert bad == [], "\n".join(f"{o.field}: {o.kind} {o.detail}" for o in bad)


def _schema_strings() -> set:
    """Every string-valued host variable and key of the schema, as the matrix names them."""
    names = set()
    for var in _host_vars.HOST_VARS:
        if var.type in ("str", "path", "raw") or var.elements in ("raw", "str"):
            names.add(var.name)
        for key in var.keys:
            if key.type in ("str", "raw", "dict", "list"):
                names.add(f"{var.name}.{key.name}")
    return names


# Schema names -> the matrix fields that cover them (the field ids of injection.FIELDS).
COVERED_BY = {
    "numafleet_placements.name": "placement.name",
    "numafleet_placements.tenant": "placement.tenant",
    "numafleet_placements.exec": "placement.exec.word",
    "numafleet_placements.unit": "placement.unit",
    "numafleet_placements.user": "placement.user",
    "numafleet_placements.group": "placement.group",
    "numafleet_placements.description": "placement.description",
    "numafleet_placements.gpus": "placement.gpus",
    "numafleet_placements.cpus": "placement.cpus",
    "numafleet_placements.near": "placement.near",
    "numafleet_placements.memory": "placement.memory",
    "numafleet_placements.hugepages": "placement.hugepages.size",
    "numafleet_placements.environment": "placement.environment.value",
    "numafleet_placements.mig_profile": "placement.mig_profile",
    "numafleet_placements.mps": "placement.mps.pinned_memory_limit",
    "numafleet_tenants.name": "tenant.name",
    "numafleet_tenants.memory_max": "tenant.memory_max",
    "numafleet_tenants.description": "tenant.description",
    "numafleet_reserved_cpus": "reserved_cpus",
    "numafleet_hugepages_extra.size": "hugepages_extra.size",
    "numafleet_mig_gpus.gpu": "mig_gpus.gpu",
    "numafleet_mig_gpus.mode": "mig_gpus.mode",
    "numafleet_mig_gpus.layout": "mig_gpus.layout.profile",
    "numafleet_hugepages_boot_reserve": "hugepages_boot_reserve",
    "numafleet_hugepages_bootloader": "hugepages_bootloader",
    "numafleet_hugepages_mounts.path": "hugepages_mounts.path",
    "numafleet_hugepages_mounts.size": "hugepages_mounts.size",
    "numafleet_hugepages_mounts.mode": "hugepages_mounts.mode",
    "numafleet_hugepages_mounts.group": "hugepages_mounts.group",
    "numafleet_numa_balancing": "numa_balancing",
    "numafleet_zone_reclaim_mode": "zone_reclaim_mode",
    "numafleet_thp_enabled": "thp_enabled",
    "numafleet_thp_defrag": "thp_defrag",
    "numafleet_numad": "numad",
    "numafleet_irqbalance_banned": "irqbalance_banned",
    "numafleet_mig_backend": "mig_backend",
    "numafleet_gpu_partitions.gpu": "gpu_partitions.gpu",
    "numafleet_gpu_partitions.mode": "gpu_partitions.mode",
    "numafleet_gpu_partitions.layout": "gpu_partitions.layout.profile",
    "numafleet_gpu_partitions.compute_partition": "gpu_partitions.compute_partition",
    "numafleet_gpu_partitions.memory_partition": "gpu_partitions.memory_partition",
    "numafleet_placements.partition": "placement.partition",
    "numafleet_amd_backend": "amd_backend",
    "numafleet_placements.memory_limit": "placement.memory_limit",
    "numafleet_placements.tasks_max": "placement.tasks_max",
    "numafleet_placements.priority": "placement.priority",
    "numafleet_tenants.priority": "tenant.priority",
    "numafleet_gpu_settings.gpu": "gpu_settings.gpu",
    "numafleet_gpu_settings.compute_mode": "gpu_settings.compute_mode",
    "numafleet_gpu_settings.application_clocks": "gpu_settings.application_clocks",
    "numafleet_kernel_isolation": "kernel_isolation",
    "numafleet_mig_parted_config": "mig_parted_config",
    "numafleet_restart": "restart",
    "numafleet_preflight": "preflight",
    "numafleet_memory_act": "memory_act",
    "numafleet_memory_guard_textfile_dir": "memory_guard_textfile_dir",
    "numafleet_render_root": "render_root",
}
# Left out (injection.LEFT_OUT says why).
LEFT_OUT = {
    "numafleet_sysfs_root",
    "numafleet_procfs_root",
    "numafleet_gpu_snapshot",
    "numafleet_cgroup_root",
    "numafleet_capture_dir",
    "numafleet_report_dir",
    "numafleet_serial",
    "numafleet_max_fail_percentage",
    "numafleet_verify_perf",
}


def test_every_string_of_the_schema_is_in_the_matrix_or_left_out_with_a_reason():
    fields = {field.id for field in injection.FIELDS}
    assert set(COVERED_BY.values()) <= fields
    missing = _schema_strings() - set(COVERED_BY) - LEFT_OUT
    assert missing == set(), f"add a matrix field (or a reason to leave out) for {missing}"
    patterns = [part.strip() for key in injection.LEFT_OUT for part in key.split(",")]
    for name in LEFT_OUT:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
