"""layers.py: the specs' defaults, the handler pass and the merged would_run (no I/O)."""

from __future__ import annotations

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    amd_partition,
    hugepages,
    layers,
    mig,
    mps,
    units,
)


def test_spec_defaults_are_the_core_defaults():
    # layers.py repeats them so that building a spec imports no layer's core file.
    assert layers.SPECS["mig"]["state_path"]["default"] == mig.DEFAULT_STATE_PATH
    assert layers.SPECS["mig"]["boot_program_path"]["default"] == mig.DEFAULT_BOOT_PROGRAM_PATH
    assert layers.SPECS["mig"]["mig_parted_config"]["default"] == mig.DEFAULT_MIG_PARTED_PATH
    assert layers.SPECS["mig"]["unit_dir"]["default"] == units.DEFAULT_UNIT_DIR
    assert layers.SPECS["mps"]["manifest_path"]["default"] == mps.DEFAULT_MANIFEST_PATH
    assert layers.SPECS["mps"]["nvidia_cuda_mps_control"]["default"] == mps.DEFAULT_CONTROL
    assert layers.SPECS["mps"]["nvidia_smi"]["default"] == mps.DEFAULT_NVIDIA_SMI
    assert layers.SPECS["mps"]["header"]["default"] == units.DEFAULT_HEADER
    assert layers.SPECS["units"]["header"]["default"] == units.DEFAULT_HEADER
    assert layers.SPECS["units"]["manifest_path"]["default"] == units.DEFAULT_MANIFEST_PATH
    assert layers.SPECS["units"]["plan_path"]["default"] == units.DEFAULT_PLAN_PATH
    assert layers.MIG_UNIT == mig.UNIT_NAME
    assert layers.AMD_UNIT == amd_partition.UNIT_NAME
    assert layers.SPECS["amd"]["state_path"]["default"] == amd_partition.DEFAULT_STATE_PATH
    assert (
        layers.SPECS["amd"]["boot_program_path"]["default"]
        == amd_partition.DEFAULT_BOOT_PROGRAM_PATH
    )
    assert layers.SPECS["amd"]["backend"]["choices"] == list(amd_partition.BACKENDS)
    assert layers.HUGEPAGES_UNIT == hugepages.UNIT_NAME
    assert tuple(layers.SPECS) == layers.LAYERS


RESULTS = {
    "hugepages": {
        "handler_mount_stop": ["old.mount"],
        "handler_enable": True,
        "handler_mount_restart": ["a.mount"],
        "handler_mount_start": ["b.mount"],
        "reboot_required": True,
        "bootloader": "grub_d",
        "grubby_argvs": [],
        "would_run": ["systemctl daemon-reload", "update-grub"],
    },
    "mig": {"files": [{"path": "/etc/systemd/system/numafleet-mig.service", "state": "create"}]},
    "mps": {
        "reload_needed": True,
        "handler_restart": ["mps-0.service"],
        "handler_start": ["mps-1.service"],
        "would_run": ["systemctl daemon-reload", "systemctl restart mps-0.service"],
    },
    "units": {
        "reload_needed": True,
        "handler_restart": ["numafleet-a.service"],
        "handler_try_restart": ["vendor.service"],
        "handler_start": ["numafleet-b.service"],
        "would_run": [
            "systemctl daemon-reload",
            "systemctl restart numafleet-a.service",
            "systemctl try-restart vendor.service",
            "systemctl enable --now numafleet-b.service",
        ],
    },
}


def test_handler_pass_reloads_once_in_the_roles_order():
    lines = [" ".join(argv) for argv in layers.handler_argvs(RESULTS, "auto", ["late.service"])]
    assert lines == [
        "systemctl disable --now old.mount",
        "systemctl daemon-reload",
        "systemctl enable numafleet-hugepages.service",
        "systemctl restart a.mount",
        "systemctl enable --now b.mount",
        "update-grub",
        "systemctl enable numafleet-mig.service",
        "systemctl enable mps-0.service",
        "systemctl restart mps-0.service",
        "systemctl enable --now mps-1.service",
        "systemctl restart numafleet-a.service",
        "systemctl try-restart vendor.service",
        "systemctl enable --now numafleet-b.service",
        "systemctl try-restart late.service",
    ]


def test_restart_never_keeps_starts_and_mounts_only():
    lines = [" ".join(argv) for argv in layers.handler_argvs(RESULTS, "never", ["late.service"])]
    assert "systemctl restart a.mount" in lines  # a remount is not a service restart
    assert not [line for line in lines if "service" in line and "restart" in line]
    assert lines[-1] == "systemctl enable --now numafleet-b.service"


@pytest.mark.parametrize(
    "results",
    [
        {},
        {"units": {"reload_needed": False}},
        {"mig": {"files": [{"path": "/x", "state": "create"}]}},
    ],
)
def test_nothing_to_do_runs_nothing(results):
    assert layers.handler_argvs(results) == []


def test_a_removed_mig_unit_only_reloads():
    results = {"mig": {"files": [{"path": "/e/numafleet-mig.service", "state": "remove"}]}}
    assert layers.handler_argvs(results) == [["systemctl", "daemon-reload"]]


def test_merged_would_run_has_one_reload():
    lines = layers.merged_would_run(RESULTS, "auto", ["late.service"])
    assert lines.count("systemctl daemon-reload") == 1
    assert lines[0] == "systemctl daemon-reload"
    assert lines[-1] == "systemctl try-restart late.service"
    never = layers.merged_would_run(RESULTS, "never", ["late.service"])
    assert never == [
        "systemctl daemon-reload",
        "update-grub",
        "systemctl enable --now numafleet-b.service",
    ]


def test_the_amd_boot_unit_is_enabled_after_the_one_reload():
    results = {
        "amd": {"files": [{"path": "/etc/systemd/system/" + layers.AMD_UNIT, "state": "create"}]}
    }
    assert layers.handler_argvs(results) == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", layers.AMD_UNIT],
    ]


def test_amd_params_come_from_the_plans_amd_partitions():
    plan = {
        "amd_partitions": [{"address": "0000:43:00.0", "owned_units": ["b.service", "a.service"]}]
    }
    got = layers.supplied_params("amd", plan, "/", "systemd")
    assert got["gpus"] == plan["amd_partitions"]
    assert got["owned_units"] == ["a.service", "b.service"]
    assert layers.supplied_params("amd", {}, "/", "none")["gpus"] == []
