"""The apply roles' inputs in Python (plugin_utils/_apply_args.py): values and messages.

The messages are those the roles' input checks (their former vars/main.yml) gave, word for word;
the role inputs of site.yml are those the former playbooks/vars/roles.yml computed from the
numafleet_* host variables.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.plugin_utils._apply_args import (
    ALL_LAYERS,
    ROLE_DEFAULTS,
    build,
    guard_problems,
    measure_problems,
    name_host_variables,
    site_inputs,
)

REPO = Path(__file__).resolve().parents[4]
APPLY_ROLES = (
    "hugepages",
    "numa_kernel",
    "nvidia_gpu",
    "amd_partition",
    "nvidia_mig",
    "nvidia_mps",
    "pinned_services",
)
H = "h1"


def _plan(**extra):
    plan = {
        "version": 1,
        "host": H,
        "placements": [],
        "nodes": [{"id": 0, "cpus_usable": [2, 3], "hugepages": []}],
        "reserved_cpus": [0, 1],
        "gpus": [],
        "mig_gpus": [],
        "mps_daemons": [],
        "tenants": [],
    }
    plan.update(extra)
    return plan


FACTS = {
    "os_family": "Debian",
    "numa": {
        "sysfs_root": "/rec/sys",
        "procfs_root": "/rec/proc",
        "kernel": {"thp_enabled": "always", "thp_defrag": "madvise"},
        "cpus": {"isolated": [4, 5], "nohz_full": [6]},
        "pci_devices": [
            {"kind": "gpu", "node": 0, "address": "0000:17:00.0"},
            {"kind": "nic", "node": None, "address": "0000:18:00.0"},
        ],
        "nodes": [{"id": 0, "hugepages": [{"size_kb": 2048}, {"size_kb": 1048576}]}],
    },
    "gpu_topology": {"gpus": []},
    "numafleet_state_paths": [],
}


def test_defaults_equal_the_roles_defaults():
    loaded = {}
    for role in APPLY_ROLES:
        loaded.update(yaml.safe_load((REPO / "roles" / role / "defaults/main.yml").read_text()))
    assert ROLE_DEFAULTS == loaded


def test_good_inputs_give_the_module_args():
    args = build(H, {}, _plan(), FACTS)
    assert args.problems == []
    assert args.reboot_ok is False
    module = args.module_args
    assert module["layers"] == ["hugepages", "kernel", "units"]  # no GPU: mig and mps skip
    assert (module["root"], module["service_manager"], module["restart"]) == (
        "/",
        "systemd",
        "auto",
    )
    assert module["hugepages"] == {
        "sysfs_root": "/sys",
        "procfs_root": "/proc",
        "boot_reserve_sizes_kb": [],
        "bootloader": "grub_d",
        "mounts": [],
    }
    assert module["kernel"] == {
        "numa_balancing": None,  # auto and no placements
        "zone_reclaim_mode": 0,
        "thp_enabled": "madvise",
        "thp_defrag": "madvise",
        "numad": "masked",
        "irqbalance_banned_cpus": "4-6",
        "irq_affinity": [],
        "sysfs_root": "/rec/sys",
        "procfs_root": "/rec/proc",
    }
    assert module["mig"] == {
        "reset_ok": False,
        "backend": "auto",
        "mig_parted_config": "/etc/numafleet/mig-parted.yaml",
        "sysfs_root": "/sys",
        "procfs_root": "/proc",
    }
    assert module["mps"]["nvidia_smi"] == "/usr/bin/nvidia-smi"
    assert module["units"] == {
        "unit_dir": "/etc/systemd/system",
        "manifest_path": "/etc/numafleet/manifest.json",
        "hardening": True,
        "preflight": "warn",
    }


def test_reshaped_values():
    inputs = {
        "hugepages_boot_reserve": ["1G", 2048],
        "hugepages_mounts": [{"path": "/dev/hp1G", "size": "1G", "mode": 1770}],
        "hugepages_reboot_ok": "yes",
        "numa_kernel_irq_affinity": True,
        "numa_kernel_numa_balancing": "1",
        "numa_kernel_zone_reclaim_mode": "leave",
        "numa_kernel_thp_defrag": "leave",
        "numa_kernel_irqbalance_banned": "leave",
    }
    facts = dict(FACTS, os_family="Suse")
    args = build(H, inputs, _plan(placements=[]), facts, ("hugepages", "kernel"))
    assert args.problems == [] and args.reboot_ok is True
    hp, kernel = args.module_args["hugepages"], args.module_args["kernel"]
    assert hp["boot_reserve_sizes_kb"] == [1048576, 2048] and hp["bootloader"] == "auto"
    assert hp["mounts"] == [{"path": "/dev/hp1G", "size_kb": 1048576, "mode": "1770"}]
    assert kernel["numa_balancing"] == 1 and kernel["zone_reclaim_mode"] is None
    assert kernel["thp_defrag"] is None and kernel["irqbalance_banned_cpus"] is None
    assert kernel["irq_affinity"] == [{"address": "0000:17:00.0", "cpus": "2,3"}]
    assert set(args.module_args) == {
        "plan",
        "layers",
        "root",
        "service_manager",
        "restart",
        "hugepages",
        "kernel",
    }


def test_render_mode_and_runs():
    root = "/srv/r/h1"
    inputs = {f"{p}_render_root": root for p in APPLY_ROLES} | {"hugepages_sysfs_root": "/rec/sys"}
    gpu = {"vendor": "nvidia", "mig": {"mode_current": "disabled", "mode": "disabled"}}
    facts = dict(
        FACTS,
        gpu_topology={"gpus": [gpu]},
        numafleet_state_paths=[root + "/etc/numafleet/mig.json"],
    )
    args = build(H, inputs, _plan(gpus=[gpu]), facts)
    assert args.problems == []
    assert args.module_args["layers"] == ["hugepages", "kernel", "mig", "units"]  # no manifest
    assert (args.module_args["root"], args.module_args["service_manager"]) == (root, "none")
    facts["numafleet_state_paths"] = [root + "/etc/numafleet/mps-units.json"]
    assert build(H, inputs, _plan(gpus=[gpu]), facts).module_args["layers"] == [
        "hugepages",
        "kernel",
        "mps",
        "units",
    ]
    with_snapshot = build(H, inputs | {"nvidia_mig_snapshot": "/s.json"}, _plan(gpus=[gpu]), facts)
    assert with_snapshot.module_args["mig"]["snapshot"] == "/s.json"
    assert "snapshot" not in build(H, inputs, _plan(gpus=[gpu]), facts).module_args["mig"]
    del facts["numafleet_state_paths"]  # not known: both run
    # The gpu layer runs only where GPU settings are declared, the amd layer only where the plan
    # has AMD GPUs (amd_partitions).
    assert build(H, inputs, _plan(gpus=[gpu]), facts).module_args["layers"] == [
        layer for layer in ALL_LAYERS if layer not in ("gpu", "amd")
    ]
    amd = {"address": "0000:43:00.0", "compute_partition": {"current": "SPX", "planned": "CPX"}}
    args = build(H, inputs, _plan(gpus=[gpu], amd_partitions=[amd]), facts)
    assert args.problems == []
    assert "amd" in args.module_args["layers"]
    assert args.module_args["amd"] == {
        "reset_ok": False,
        "backend": "sysfs",  # render mode writes the scratch tree
        "sysfs_root": "/sys",
        "procfs_root": "/proc",
    }
    bad = build(H, inputs | {"amd_partition_backend": "rocm"}, _plan(amd_partitions=[amd]), facts)
    assert "amd_partition_backend (numafleet_amd_backend in site.yml) is 'rocm'" in bad.problems[0]


def _plan_text(role_input, shape, version="none", host="none"):
    return (
        f"host {H}: {role_input} is not this host's plan from numafleet.tuning.numa_plan "
        f"(version 1, host {H}, {shape}; got version {version}, host {host}). Run "
        f"numafleet.tuning.numa_plan on this host first and pass its fact: {role_input}: "
        '"{{ ansible_facts.numafleet_plan }}".'
    )


def _root_text(role_input, root, tail):
    return (
        f"host {H}: {role_input} is '{root}'; render mode needs an absolute directory other than "
        f"/, e.g. /srv/numafleet-render/{H}. To apply to the host itself, leave it unset "
        f"(null){tail}"
    )


LONG = (
    "; an empty string is refused so that a template that came out empty cannot turn a review "
    "run into a rollout."
)

# (layer, inputs, plan, facts changes, expected messages)
CASES = {
    "hugepages plan": (
        "hugepages",
        {},
        {"version": 2, "host": "x"},
        {},
        [_plan_text("hugepages_plan", "a nodes list", "2", "x")],
    ),
    "kernel plan": (
        "kernel",
        {},
        "not a plan",
        {},
        [_plan_text("numa_kernel_plan", "lists placements, nodes and reserved_cpus")],
    ),
    "mig plan": (
        "mig",
        {},
        {"version": 1, "host": H},
        {},
        [_plan_text("nvidia_mig_plan", "gpus and mig_gpus lists", "1", H)],
    ),
    "mps plan": (
        "mps",
        {},
        _plan(host="other"),
        {},
        [_plan_text("nvidia_mps_plan", "an mps_daemons list", "1", "other")],
    ),
    "units plan": (
        "units",
        {},
        None,
        {},
        [_plan_text("pinned_services_plan", "a placements list")],
    ),
    "hugepages root": (
        "hugepages",
        {"hugepages_render_root": "render", "hugepages_sysfs_root": "/rec/sys"},
        _plan(),
        {},
        [_root_text("hugepages_render_root (numafleet_render_root in site.yml)", "render", LONG)],
    ),
    "kernel root": (
        "kernel",
        {"numa_kernel_render_root": ""},
        _plan(),
        {},
        [_root_text("numa_kernel_render_root (numafleet_render_root in site.yml)", "", LONG)],
    ),
    "mig root": (
        "mig",
        {"nvidia_mig_render_root": "//"},
        _plan(),
        {},
        [
            _root_text(
                "nvidia_mig_render_root (numafleet_render_root in site.yml)",
                "//",
                "; an empty string is refused.",
            )
        ],
    ),
    "mps root": (
        "mps",
        {"nvidia_mps_render_root": "x"},
        _plan(),
        {},
        [_root_text("nvidia_mps_render_root", "x", ".")],
    ),
    "units root": (
        "units",
        {"pinned_services_render_root": "render"},
        _plan(),
        {},
        [
            _root_text(
                "pinned_services_render_root (numafleet_render_root in site.yml)", "render", LONG
            )
        ],
    ),
    "hugepages live sysfs": (
        "hugepages",
        {"hugepages_render_root": "/srv/r"},
        _plan(),
        {},
        [
            f"host {H}: hugepages_render_root is set (render mode) but hugepages_sysfs_root is /sys, "
            "so the pools would be written to this host's running kernel. Point hugepages_sysfs_root "
            "(numafleet_sysfs_root in site.yml) at a scratch copy of the host's tree "
            "(playbooks/capture_topology.yml), or review the host itself with --check --diff and no "
            "render root."
        ],
    ),
    "boot size": (
        "hugepages",
        {"hugepages_boot_reserve": ["1G", "3M"]},
        _plan(),
        {},
        [
            f'host {H}: hugepages_boot_reserve[1] is "3M"; give page sizes as 2M, 1G or a size in kB '
            "(e.g. [1G])."
        ],
    ),
    "mount": (
        "hugepages",
        {"hugepages_mounts": [{"path": "/d", "size": "1G"}, {"path": "/x", "size": "5G"}]},
        _plan(),
        {},
        [
            f'host {H}: hugepages_mounts[1] is {{"path": "/x", "size": "5G"}}; each entry needs path '
            "(an absolute mount point) and size (2M, 1G or the page size in kB as a number), "
            "optionally mode (an octal string, 1770 when left out) and group, e.g. "
            "{path: /dev/hugepages1G, size: 1G}."
        ],
    ),
    "banned": (
        "kernel",
        {"numa_kernel_irqbalance_banned": "0 - 1"},
        _plan(),
        {},
        [
            f"host {H}: numa_kernel_irqbalance_banned is '0 - 1'; give auto, leave, or a cpulist "
            'string such as "0-1,64-65" (no spaces).'
        ],
    ),
    "kernel live facts": (
        "kernel",
        {"numa_kernel_render_root": "/srv/r"},
        _plan(),
        {"numa": dict(FACTS["numa"], sysfs_root="/sys")},
        [
            f"host {H}: numa_kernel_render_root is set (render mode) but the NUMA facts were read "
            "from the live /sys and /rec/proc, where numa_kernel would change the running kernel. "
            "Point numafleet_sysfs_root and numafleet_procfs_root at a recording "
            "(playbooks/capture_topology.yml), or unset the render root to apply to the host."
        ],
    ),
    "parted config": (
        "mig",
        {"nvidia_mig_parted_config": "mig.yaml"},
        _plan(),
        {},
        [
            f"host {H}: nvidia_mig_parted_config (numafleet_mig_parted_config in site.yml) is "
            "'mig.yaml'; it must be an absolute path, or '' to write no mig-parted config. Fix the "
            "variable; nothing was changed."
        ],
    ),
    "mig require gpu": (
        "mig",
        {"nvidia_mig_require_gpu": True},
        _plan(),
        {},
        [
            f"host {H}: nvidia_mig_require_gpu is true but the host's facts show no GPU under "
            "/sys/bus/pci/devices. Check the driver and the PCI devices, or set "
            "nvidia_mig_require_gpu: false (numafleet_require_gpu in site.yml) for hosts without GPUs."
        ],
    ),
    "mig no mode": (
        "mig",
        {},
        _plan(gpus=[{"mig": None}], mig_gpus=[{"gpu": "0000:17:00.0"}]),
        {},
        [
            f"host {H}: the plan declares MIG state for 0000:17:00.0 but no GPU of the host reports a "
            "MIG mode; gather the GPU facts where NVML or nvidia-smi works."
        ],
    ),
    "mps require gpu": (
        "mps",
        {"nvidia_mps_require_gpu": True},
        _plan(),
        {},
        [
            f"host {H}: nvidia_mps_require_gpu is true but the host shows no NVIDIA GPU (gpu_topology "
            "facts list none). Set nvidia_mps_require_gpu: false to skip such hosts, or check the "
            "driver (nvidia-smi) and the facts."
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_role_check_messages(case):
    layer, inputs, plan, facts, expected = CASES[case]
    result = build(H, inputs, plan, dict(FACTS, **facts), (layer,))
    assert result.problems == expected


def test_every_failed_check_is_reported_in_order():
    result = build(H, {"pinned_services_render_root": "render"}, _plan(host="x"), FACTS, ("units",))
    assert [p.split(" is ")[0] for p in result.problems] == [
        f"host {H}: pinned_services_plan",
        f"host {H}: pinned_services_render_root (numafleet_render_root in site.yml)",
    ]


# Then what the module itself refuses, named as the filter module_input_problems names it.
MODULE_CASES = {
    "hugepages": ({"hugepages_bootloader": "lilo"}, "hugepages_bootloader"),
    "kernel": ({"numa_kernel_thp_enabled": "sometimes"}, "numa_kernel_thp_enabled"),
    "mig": ({"nvidia_mig_backend": "magic"}, "nvidia_mig_backend"),
    "mps": ({"nvidia_mps_unit_dir": "relative"}, "nvidia_mps_unit_dir"),
    "units": ({"pinned_services_manifest_path": "a\0b"}, "pinned_services_manifest_path"),
}


@pytest.mark.parametrize("layer", sorted(MODULE_CASES))
def test_module_refusals_follow_the_role_checks(layer):
    inputs, name = MODULE_CASES[layer]
    problems = build(H, inputs, _plan(), FACTS, (layer,)).problems
    assert len(problems) == 1 and problems[0].startswith(f"host {H}: ") and name in problems[0]
    # Only when the role's own checks passed.
    assert all(
        "is not this host's plan" in p for p in build(H, inputs, {}, FACTS, (layer,)).problems
    )


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(ROLE_DEFAULTS)), JUNK, max_size=6), JUNK, JUNK)
def test_wrong_types_give_problems_not_exceptions(inputs, plan, facts):
    result = build(H, inputs, plan, facts if isinstance(facts, dict) else {})
    assert isinstance(result.problems, list)
    assert all(isinstance(p, str) and p.startswith(f"host {H}") for p in result.problems)
    # A good plan: the module's own checks run on the junk too.
    result = build(H, inputs, _plan(), dict(FACTS))
    assert all(isinstance(p, str) and p.startswith(f"host {H}") for p in result.problems)


def test_measure_problems():
    assert measure_problems(H, {}) == []
    assert (
        measure_problems(H, {"numafleet_verify_window_s": "2.5", "numafleet_drift_fail": "no"})
        == []
    )
    assert measure_problems(H, {"numafleet_verify_window_s": 4000}) == [
        f"host {H}: numafleet_verify_window_s is '4000' and numafleet_verify_perf is 'auto'; the "
        "window is a number of seconds from 0 to 3600 (e.g. 5; 0 = one sample) and perf is auto "
        "or never."
    ]
    assert measure_problems(H, {"numafleet_verify_perf": ["x"]})
    # Only the bad setting is named.
    assert measure_problems(H, {"numafleet_drift_fail": "maybe"}) == [
        f"host {H}: numafleet_drift_fail is 'maybe'; use true (a host that drifted or failed a "
        "check fails the run) or false (report only)."
    ]


def test_site_inputs_take_host_vars_then_defaults():
    inputs = site_inputs(
        {
            "numafleet_reboot_ok": True,
            "numafleet_gpu_snapshot": "/s.json",
            "pinned_services_hardening": False,
        }
    )
    assert inputs["hugepages_reboot_ok"] is True
    assert inputs["nvidia_mig_snapshot"] is None  # only in render mode
    assert inputs["pinned_services_hardening"] is False
    assert not any(name.endswith("_plan") for name in inputs)
    assert set(inputs) == set(ROLE_DEFAULTS)
    render = site_inputs({"numafleet_render_root": "/r", "numafleet_gpu_snapshot": "/s.json"})
    assert (
        render["nvidia_mig_snapshot"] == "/s.json" and render["pinned_services_render_root"] == "/r"
    )


def test_site_messages_name_the_host_variable_of_each_role_input():
    problems = [
        'host h1: hugepages_mounts[0] is {"path": "/x"}; each entry needs path and size.',
        "host h1: hugepages_render_root (numafleet_render_root in site.yml) is 'r'; ...",
        "host h1: pinned_services_plan is not this host's plan.",
    ]
    named = name_host_variables(problems)
    assert named[0] == problems[0] + (
        " Under site.yml and drift_check.yml set it with numafleet_hugepages_mounts."
    )
    assert named[1:] == problems[1:]  # already named; the plan is not a host variable


# -- the gpu layer (numafleet_gpu_settings) ---------------------------------------------------------

GPU_FACTS = {
    "gpu_topology": {
        "gpus": [
            {"address": "0000:17:00.0", "vendor": "nvidia", "uuid": "GPU-a", "mig": None},
            {
                "address": "0000:31:00.0",
                "vendor": "nvidia",
                "uuid": "GPU-b",
                "mig": {"mode_current": "enabled"},
            },
            {"address": "0000:ca:00.0", "vendor": "nvidia", "uuid": "GPU-c", "mig": None},
        ]
    }
}
MPS_ON_CA = [{"gpu_address": "0000:ca:00.0", "unit": "numafleet-mps-x.service"}]


def _gpu_build(settings, **plan):
    inputs = {"nvidia_gpu_settings": settings}
    return build(H, inputs, _plan(**plan), GPU_FACTS, ("gpu",))


def test_gpu_layer_runs_with_declared_settings_only():
    assert _gpu_build([]).module_args["layers"] == []
    declared = [{"gpu": "GPU-a", "compute_mode": "EXCLUSIVE_PROCESS", "power_limit_w": 300}]
    got = _gpu_build(declared)
    assert got.problems == []
    assert got.module_args["layers"] == ["gpu"]
    assert got.module_args["gpu"]["gpus"] == declared


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"gpu": "0000:99:00.0"},
            "nvidia_gpu_settings[0] (numafleet_gpu_settings[0] in site.yml): GPU 0000:99:00.0 is not an "
            "NVIDIA GPU of this host's facts "
            "(NVIDIA GPUs: 0000:17:00.0, 0000:31:00.0, 0000:ca:00.0)",
        ),
        (
            {"gpu": "ca:00.0", "compute_mode": "DEFAULT"},
            "an MPS daemon of the plan shares it and its unit sets the compute mode",
        ),
        ({"gpu": "GPU-b", "compute_mode": "DEFAULT"}, "which is in MIG mode"),
        (
            {"gpu": "GPU-a", "power_limit_w": -5},
            "nvidia_gpu_settings (set from numafleet_gpu_settings by site.yml and "
            "drift_check.yml): gpus[0].power_limit_w: -5 is not a positive whole number of watts",
        ),
        (
            {"gpu": "GPU-a", "compute_mode": "exclusive"},
            "gpus[0].compute_mode: 'exclusive' is not one of DEFAULT, EXCLUSIVE_PROCESS",
        ),
    ],
)
def test_gpu_settings_refused_before_the_gate(entry, message):
    (problem,) = _gpu_build([entry], mps_daemons=MPS_ON_CA).problems
    assert problem.startswith(f"host {H}: nvidia_gpu_settings")
    assert message in problem
    assert problem.endswith("Fix the variable; nothing was changed.")


def test_gpu_settings_need_this_hosts_plan():
    got = build(H, {"nvidia_gpu_settings": [{"gpu": "GPU-a"}]}, {"version": 1}, GPU_FACTS, ("gpu",))
    (problem,) = got.problems
    assert problem.startswith(f"host {H}: nvidia_gpu_plan is not this host's plan")


def test_a_partitioned_plan_bans_every_cpu_outside_housekeeping_from_irqbalance():
    """numafleet_partition (the plan's partition key): auto bans every online CPU but the
    housekeeping ones, plus the isolated and nohz_full CPUs; a cpulist or leave still wins."""
    facts = dict(
        FACTS,
        numa=dict(FACTS["numa"], cpus=dict(FACTS["numa"]["cpus"], online=[0, 1, 2, 3, 4, 5, 6, 7])),
    )
    plan = _plan(partition={"housekeeping_cpus": [0, 1], "units": ["system.slice"]})
    kernel = build(H, {}, plan, facts, ("kernel",)).module_args["kernel"]
    assert kernel["irqbalance_banned_cpus"] == "2-7"
    given = build(H, {"numa_kernel_irqbalance_banned": "3"}, plan, facts, ("kernel",))
    assert given.module_args["kernel"]["irqbalance_banned_cpus"] == "3"
    off = build(H, {}, _plan(), facts, ("kernel",)).module_args["kernel"]
    assert off["irqbalance_banned_cpus"] == "4-6"


# -- the memory guard's host variables (site.yml, before the gate) ------------------------------


def test_guard_defaults_and_good_values_pass():
    assert guard_problems("h", {}) == []
    good = {
        "numafleet_memory_warn_pct": 75,
        "numafleet_memory_act_pct": 85.0,
        "numafleet_memory_guard_interval": 3600,
        "numafleet_memory_guard_textfile_dir": "/var/lib/node_exporter/textfile",
    }
    assert guard_problems("h", good) == []


@pytest.mark.parametrize(
    ("values", "fragments"),
    [
        (
            {"numafleet_memory_warn_pct": 90, "numafleet_memory_act_pct": 90},
            ["host h: numafleet_memory_warn_pct is 90 and numafleet_memory_act_pct is 90", "<="],
        ),
        ({"numafleet_memory_act_pct": 100}, ["numafleet_memory_act_pct is 100"]),
        ({"numafleet_memory_warn_pct": 80.5}, ["numafleet_memory_warn_pct is 80.5"]),
        ({"numafleet_memory_warn_pct": True}, ["numafleet_memory_warn_pct is true"]),
        ({"numafleet_memory_guard_interval": 0}, ["numafleet_memory_guard_interval is 0", "3600"]),
        ({"numafleet_memory_guard_interval": "15"}, ['numafleet_memory_guard_interval is "15"']),
        (
            {"numafleet_memory_guard_textfile_dir": "textfile"},
            ['numafleet_memory_guard_textfile_dir is "textfile"', "absolute path"],
        ),
        (
            {"numafleet_memory_guard_textfile_dir": "/var/lib/x/"},
            ["numafleet_memory_guard_textfile_dir is", "trailing '/'"],
        ),
        (
            {"numafleet_memory_guard_textfile_dir": "/var/lib/x\nExecStartPost=/bin/sh"},
            ["numafleet_memory_guard_textfile_dir is", "U+000A"],
        ),
    ],
)
def test_guard_bad_values_are_named(values, fragments):
    problems = guard_problems("h", values)
    assert len(problems) == 1, problems
    for fragment in fragments:
        assert fragment in problems[0], (fragment, problems[0])


def test_guard_values_are_not_checked_when_nothing_installs_the_program():
    off = {"numafleet_memory_guard": False, "numafleet_preflight": "off"}
    assert guard_problems("h", {**off, "numafleet_memory_act_pct": 100}) == []
    # The preflight alone installs the program and its configuration: checked.
    assert guard_problems("h", {"numafleet_memory_guard": False, "numafleet_memory_act_pct": 100})
