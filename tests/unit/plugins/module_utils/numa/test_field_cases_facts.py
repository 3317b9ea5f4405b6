"""Facts field cases: facts and messages on real
dumps edited to each case (tests/unit/fixtures/field_cases.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import field_cases

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.summary import (
    summarize_topology,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

SYSFS = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs"


def facts_of(root: str) -> dict:
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    return json.loads(json.dumps(read_numa_facts(reader)))


# ---------------------------------------------------------------------------------------------
# physical_package_id -1 is the kernel's "unknown", not a package


def test_package_id_minus_one_is_no_package(fixture_root):
    root = fixture_root("128arm-2pa2n8cluster4co", writable=True)
    before = facts_of(root)
    assert before["nodes_per_package"] == 2 and before["snc_like"] is True
    changed = field_cases.package_ids_unknown(root)
    assert changed and all(new == -1 for dummy, new in changed.values())
    facts = facts_of(root)
    assert facts["packages"] == []
    assert facts["nodes_per_package"] is None and facts["snc_like"] is False
    assert {cpu["package"] for cpu in facts["per_cpu"]} == {None}
    assert not [f for f in facts["consistency"] if f["kind"] == "nodes_cross_packages"]
    assert "snc-like" not in summarize_topology(facts)


# ---------------------------------------------------------------------------------------------
# the topology summary shows the new facts when they matter, on one line


def test_summary_line_notes_only_what_matters(fixture_root):
    line = summarize_topology(facts_of(fixture_root("qemu-2node-pxb")))
    for word in ("allowed", "GPU memory", "slower memory", "vNUMA"):
        assert word not in line

    root = fixture_root("qemu-2node-pxb", writable=True)
    field_cases.qemu_vnuma_crossed(root)
    field_cases.allowed_pid1_only(root)  # PID 1 may use CPUs 0-2 of 0-3
    facts = facts_of(root)
    assert facts["allowed"]["narrowed"] is True
    line = summarize_topology(facts)
    assert "\n" not in line
    assert " | allowed CPUs 0-2 memory nodes 0-1 | " in line
    assert " | vNUMA nodes 0,1 cross packages 0,1 | " in line


def golden(machine: str) -> dict:
    return json.loads((SYSFS / f"{machine}.numa.json").read_text(encoding="utf-8"))


def test_summary_line_names_gpu_memory_and_slower_nodes():
    gh200 = summarize_topology(golden("synthetic-gh200"))
    assert " | n1=GPU memory of 0009:01:00.0 | " in gh200
    assert "slower memory" not in gh200  # the GPU's HBM is named as such, the empty nodes not
    power9 = summarize_topology(golden("nvidiagpunumanodes"))
    assert " | GPU memory nodes 250-255 (6 GPUs) | " in power9
    tiers = summarize_topology(golden("fakeheteromemtiers"))
    assert " | slower memory n2(dax) n4(dax) n6(dax) n8(dax) n9(dax) | " in tiers
    epyc = golden("synthetic-epyc-nps4")
    epyc["nodes"][0]["memory_tier"], epyc["nodes"][2]["memory_tier"] = 22, 4
    assert " | slower memory n0(tier 22) | " in summarize_topology(epyc)


# ---------------------------------------------------------------------------------------------
# the kernel-release refusal names what the user set, and a malformed release file


BOOT_ARGS = {
    "pools": [{"node": 1, "size_kb": 2048, "count": 4}],
    "boot_reserve_sizes_kb": [2048],
    "bootloader": "grub_d",
    "mounts": [],
    "root": "/",
}


def _site_problems(numa: dict) -> list:
    from ansible_collections.numafleet.tuning.plugins.plugin_utils import (
        _apply_args,
        _module_inputs,
    )

    role = _module_inputs.problems("numa_hugepages", dict(BOOT_ARGS), "h", numa)
    return role, _apply_args.name_host_variables(role)


def test_release_refusal_names_the_role_input_and_the_host_variable():
    numa = golden("128arm-2pa2n8cluster4co")  # kernel 5.15 from its recorded /proc/version
    (role,), (site,) = _site_problems(numa)
    assert "boot_reserve_sizes_kb" not in role and "boot_reserve_sizes_kb" not in site
    # the role's own runs: the role input; site.yml and drift_check.yml: the host variable
    assert "remove the size from hugepages_boot_reserve to reserve it at runtime" in role
    assert site.startswith(
        "host h: hugepages_boot_reserve (set from numafleet_hugepages_boot_reserve by site.yml "
        "and drift_check.yml): numafleet_hugepages_boot_reserve: the kernel is 5.15"
    )
    assert "remove the size from numafleet_hugepages_boot_reserve to reserve it" in site


def test_malformed_release_file_is_named_malformed(fixture_root):
    root = fixture_root("qemu-2node-pxb", writable=True)
    field_cases.add_osrelease(root, "garbage-kernel")
    numa = facts_of(root)
    assert numa["kernel"]["osrelease"] is None
    (role,), (site,) = _site_problems(numa)
    path = os.path.join(root, "proc", "sys", "kernel", "osrelease")
    assert f"osrelease is null: {path} is malformed: 'garbage-kernel' is not a kernel" in site
    assert "could not be read" not in site and "was there" not in site
    # no file at all: said so, not "malformed"
    missing = dict(numa, warnings=[])
    (role,), (site,) = _site_problems(missing)
    assert "neither <procfs_root>/sys/kernel/osrelease nor <procfs_root>/version was there" in site


# ---------------------------------------------------------------------------------------------
# bootloader auto below a render root is decided before the gate


def test_auto_bootloader_below_a_render_root_is_refused_before_the_gate(tmp_path):
    render = tmp_path / "root"  # a recording's render root: no /etc/default/grub, no grubby
    args = dict(BOOT_ARGS, bootloader="auto", root=str(render))
    numa = dict(golden("synthetic-epyc-nps4"))
    numa["kernel"] = dict(numa["kernel"], osrelease="6.1.0-50-amd64")
    (role,), (site,) = _site_problems_for(args, numa)
    assert site.startswith(
        "host h: hugepages_bootloader (set from numafleet_hugepages_bootloader by site.yml and "
        "drift_check.yml): numafleet_hugepages_bootloader: auto found neither grubby"
    )
    assert f"below the render root '{render}'" in site
    assert "puts hugepagesz=2M hugepages=1:4 on the kernel command line" in site
    assert "Set numafleet_hugepages_bootloader to grub_d" in site
    assert "remove the size from numafleet_hugepages_boot_reserve" in site
    assert "Set hugepages_bootloader to grub_d" in role
    # decided: a GRUB host's render root, an explicit choice, the host itself, or no boot pages
    (render / "etc" / "default").mkdir(parents=True)
    (render / "etc" / "default" / "grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    assert _site_problems_for(args, numa) == ([], [])
    for change in ({"root": str(tmp_path / "other"), "bootloader": "grub_d"}, {"root": "/"}):
        assert _site_problems_for(dict(args, **change), numa) == ([], [])
    runtime = dict(args, root=str(tmp_path / "other"), boot_reserve_sizes_kb=[G1])
    assert _site_problems_for(runtime, numa) == ([], [])


G1 = 1048576


def _site_problems_for(args: dict, numa: dict) -> tuple:
    from ansible_collections.numafleet.tuning.plugins.plugin_utils import (
        _apply_args,
        _module_inputs,
    )

    role = _module_inputs.problems("numa_hugepages", args, "h", numa)
    return role, _apply_args.name_host_variables(role)


# ---------------------------------------------------------------------------------------------
# Findings 9 and 14: the module docs describe what the facts and the planner do now


def _description(module: str) -> str:
    import importlib

    import yaml

    mod = importlib.import_module(f"ansible_collections.numafleet.tuning.plugins.modules.{module}")
    return " ".join(" ".join(yaml.safe_load(mod.DOCUMENTATION)["description"]).split())


def test_numa_plan_doc_describes_the_issue_22_rules():
    text = _description("numa_plan")
    for words in (
        "never outside the allowed cpuset",
        "SMT sibling is isolated",
        "a node that is a GPU's memory is never chosen by default",
        "lower memory tier",
        "kernel.osrelease",
        "numafleet_hugepages_bootloader=auto",
    ):
        assert words in text, words


def test_locality_docs_name_the_subset_rule_and_the_raw_value():
    facts = _description("numa_facts")
    assert "inferred only when the device's local CPUs equal exactly" not in facts
    assert "proper, non-empty subset of exactly one node's CPUs" in facts
    assert "numa_node_raw" in facts
    gpus = _description("gpu_topology_facts")
    assert "numa_node_raw" in gpus and "proper non-empty subset" in gpus
    assert "NVML's CPU affinity at NODE scope" in gpus
