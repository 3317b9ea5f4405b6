"""The apply modules' input checks on the controller (plugin_utils/_module_inputs.py).

Each check runs the core functions the module runs; a value the module refuses gives one message
naming the host, the role input (and the host variable the playbooks set it from) and the fix.
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.filter.module_input_problems import (
    module_input_problems,
)
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _module_inputs

HOST = "h1"
PLAN = {"version": 1, "host": HOST, "placements": [], "tenants": [], "mps_daemons": []}
MOUNT = {"path": "/dev/hugepages2M", "size_kb": 2048, "mode": "1770", "group": "vllm"}
NUMA = {"nodes": [{"id": 0, "hugepages": [{"size_kb": 2048}, {"size_kb": 1048576}]}]}
GOOD = {
    "numa_hugepages": {"pools": [], "mounts": [MOUNT], "root": "/", "bootloader": "auto"},
    "numa_kernel": {"thp_enabled": "madvise", "numad": "masked", "irqbalance_banned_cpus": "0-1"},
    "nvidia_mig": {"gpus": [], "mig_parted_config": "/etc/numafleet/mig-parted.yaml"},
    "nvidia_mps": {"plan": PLAN, "unit_dir": "/etc/systemd/system"},
    "pinned_units": {"plan": PLAN, "manifest_path": "/etc/numafleet/manifest.json"},
}


@pytest.mark.parametrize("module", sorted(GOOD))
def test_good_arguments_pass(module):
    assert _module_inputs.problems(module, GOOD[module], HOST, NUMA) == []


@pytest.mark.parametrize(
    ("module", "change", "expect"),
    [
        (
            "numa_hugepages",
            {"mounts": [dict(MOUNT, group="vllm\n")]},
            "host h1: hugepages_mounts (set from numafleet_hugepages_mounts by site.yml and "
            "drift_check.yml): mounts[0].group is 'vllm\\n'; give a group name",
        ),
        (
            "numa_hugepages",
            {"mounts": [dict(MOUNT, mode="17%0")]},
            "host h1: hugepages_mounts (set from numafleet_hugepages_mounts by site.yml and "
            "drift_check.yml): mounts[0].mode is '17%0'; give the mount's mode as an octal",
        ),
        (
            "numa_hugepages",
            {"mounts": [dict(MOUNT, size_kb=64)]},
            "mounts[0].size_kb is 64; this kernel has no 64 kB hugepages",
        ),
        (
            "numa_hugepages",
            {"root": "/srv/$USER/render"},
            "host h1: hugepages_render_root (set from numafleet_render_root by site.yml and "
            'drift_check.yml): root is "/srv/$USER/render"; the module\'s path options expand',
        ),
        (
            "numa_hugepages",
            {"root": "/srv/" + "x" * 300},
            "a name of 300; Linux takes paths below 4096 bytes with names of at most 255",
        ),
        (
            "pinned_units",
            {"manifest_path": "/srv" + "/x" * 2100},
            'host h1: pinned_services_manifest_path: manifest_path: "/srv/x/x/x/x/x/x/x/',
        ),
        (
            "nvidia_mig",
            {"mig_parted_config": "/etc/" + "m" * 256},
            "host h1: nvidia_mig_parted_config (set from numafleet_mig_parted_config by site.yml "
            "and drift_check.yml): mig_parted_config: ",
        ),
        (
            "numa_kernel",
            {"irqbalance_banned_cpus": "0-1;x"},
            "host h1: numa_kernel_irqbalance_banned (set from numafleet_irqbalance_banned by "
            "site.yml and drift_check.yml): irqbalance_banned_cpus: invalid CPU set '0-1;x'",
        ),
        (
            "numa_kernel",
            {"thp_enabled": "never\x85"},
            "numa_kernel_thp_enabled (set from numafleet_thp_enabled",
        ),
        (
            "nvidia_mig",
            {"mig_parted_config": "/etc/numafleet/mig\nparted.yaml"},
            "host h1: nvidia_mig_parted_config (set from numafleet_mig_parted_config by site.yml "
            "and drift_check.yml): mig_parted_config: '/etc/numafleet/mig\\nparted.yaml' holds "
            "the control character U+000A",
        ),
        ("nvidia_mig", {"backend": "nvml\n"}, 'backend is "nvml\\n"; use one of auto, nvml'),
        (
            "nvidia_mps",
            {"unit_dir": "/etc/systemd/$X"},
            'host h1: nvidia_mps_unit_dir: unit_dir is "/etc/systemd/$X"; the module\'s path',
        ),
        (
            "nvidia_mps",
            {"manifest_path": "/etc/numafleet/m\x00.json"},
            "host h1: nvidia_mps_manifest_path: manifest_path: '/etc/numafleet/m\\x00.json' holds",
        ),
        (
            "pinned_units",
            {"manifest_path": "~/manifest.json"},
            'host h1: pinned_services_manifest_path: manifest_path is "~/manifest.json"',
        ),
        (
            "pinned_units",
            {"plan": {"version": 1, "host": HOST, "placements": "x"}},
            "host h1: pinned_services_plan: ",
        ),
    ],
)
def test_what_the_module_refuses_is_refused_naming_the_role_input(module, change, expect):
    problems = _module_inputs.problems(module, {**GOOD[module], **change}, HOST, NUMA)
    assert len(problems) == 1, problems
    (text,) = problems
    assert expect in text, text
    assert text.startswith("host h1: ")
    assert text.endswith(_module_inputs.FIX)
    assert text.isprintable(), repr(text)
    assert len(text) < 1000, "a long value is cut in the message"


def test_every_bad_option_has_its_own_message():
    args = {**GOOD["pinned_units"], "manifest_path": "rel", "root": "rel"}
    problems = _module_inputs.problems("pinned_units", args, HOST)
    assert [p.split(": ")[1] for p in problems] == [
        "pinned_services_manifest_path",
        "pinned_services_render_root (set from numafleet_render_root by site.yml and "
        "drift_check.yml)",
    ]


def test_a_shape_the_core_does_not_expect_is_a_message_not_a_traceback():
    problems = _module_inputs.problems("nvidia_mig", {"gpus": [{"gpu": 5, "layout": 3}]}, HOST)
    assert problems and all(p.startswith("host h1: nvidia_mig_plan") for p in problems)


def test_a_render_root_relative_to_the_inventory_passes():
    args = {**GOOD["numa_hugepages"], "root": "/srv/inventories/demo/../../.demo/h1/root"}
    assert _module_inputs.problems("numa_hugepages", args, HOST, NUMA) == []


def test_without_facts_the_mount_size_is_left_to_the_module():
    args = {**GOOD["numa_hugepages"], "mounts": [dict(MOUNT, size_kb=64)]}
    assert _module_inputs.problems("numa_hugepages", args, HOST) == []


def test_the_filter_wraps_the_checks():
    args = {**GOOD["nvidia_mig"], "mig_parted_config": "relative.yaml"}
    (text,) = module_input_problems(args, "nvidia_mig", HOST)
    assert "nvidia_mig_parted_config" in text
    with pytest.raises(AnsibleFilterError, match="module is 'nvidia_smi'"):
        module_input_problems(args, "nvidia_smi", HOST)
