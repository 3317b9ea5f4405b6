"""Topology field cases, as users see them on the demo fleet (render mode).

The follow-ups at the end show the summary
line's new notes, the boot-reserve refusals naming the host variables, and facts cached by an
older release being gathered again.

The demo inventory is copied to <tmp>/inventories/demo and the trees are materialised to
<tmp>/.demo; then two hosts' scratch trees are edited (tests/unit/fixtures/field_cases.py):

* qemu-2node-01 (real QEMU guest): sockets enumerated across its two NUMA nodes (a vNUMA layout
  not lined up with the sockets), and the guest kernel's release (6.1.0-50-amd64, from the
  tree's README) written to proc/sys/kernel/osrelease;
* vm-gpu-01: the A10 at 06:00.0 (numa_node -1) gets local CPUs 0-1, inside node 0 only.

playbooks/facts.yml shows the finding count, the inferred GPU node, the SNC hint of
epyc-nps4-01 and the kernel release (arm-kunpeng-01 from its recorded /proc/version); a
scratch playbook prints the facts a user would look up; site.yml plans qemu-2node-01 with the
planner's warning about the crossed nodes and renders its boot-time hugepage reservation from
the tree's osrelease, while epyc-nps4-01 (no release recorded) fails with a clear message.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import field_cases
import pytest
import trees
from system_helpers import REPO, ansible_playbook

FACTS = REPO / "playbooks" / "facts.yml"
SITE = REPO / "site.yml"
SUMMARY = "Print the topology summary"
GRUB = "etc/default/grub.d/60-numafleet-hugepages.cfg"

SHOW = """---
- name: Show the field-case facts
  hosts: all
  gather_facts: false
  tasks:
    - name: Gather NUMA facts
      numafleet.tuning.numa_facts:
        sysfs_root: "{{ numafleet_sysfs_root }}"
        procfs_root: "{{ numafleet_procfs_root }}"
    - name: Show the consistency findings
      ansible.builtin.debug:
        msg: "{{ ansible_facts.numa.consistency | map(attribute='message') | list }}"
    - name: Show the package layout and kernel
      ansible.builtin.debug:
        msg: >-
          nodes_per_package={{ ansible_facts.numa.nodes_per_package }}
          snc_like={{ ansible_facts.numa.snc_like }}
          osrelease={{ ansible_facts.numa.kernel.osrelease }}
          from={{ ansible_facts.numa.kernel.osrelease_source }}
    - name: Show the PCI locality
      ansible.builtin.debug:
        msg: >-
          {{ ansible_facts.numa.pci_devices
             | map(attribute='address') | zip(
               ansible_facts.numa.pci_devices | map(attribute='numa_node_raw'),
               ansible_facts.numa.pci_devices | map(attribute='node'),
               ansible_facts.numa.pci_devices | map(attribute='node_source')) | list }}
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    base = tmp_path_factory.mktemp("topo22")
    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    roots = trees.materialize_demo(base / ".demo")
    field_cases.qemu_vnuma_crossed(roots["qemu-2node-01"])
    field_cases.add_osrelease(roots["qemu-2node-01"], "6.1.0-50-amd64")
    field_cases.pci_local_subset(roots["vm-gpu-01"], "0000:06:00.0", "0-1", "03")
    show = base / "show.yml"
    show.write_text(SHOW)
    return base, inventory, roots, show


def msg(run, host, task):
    return run.one(host, task)["msg"]


def test_facts_playbook_summary_lines(fleet):
    base, inventory, roots, show = fleet
    hosts = "qemu-2node-01,vm-gpu-01,epyc-nps4-01,arm-kunpeng-01"
    run = ansible_playbook(FACTS, inventory, "--limit", hosts)
    assert run.rc == 0, run.explain()
    qemu = msg(run, "qemu-2node-01", SUMMARY)
    assert " | kernel 6.1.0-50-amd64 | " in qemu and qemu.endswith("findings=1")
    assert "snc-like" not in qemu  # sockets across nodes are no sub-NUMA clustering
    assert "0000:06:00.0@n0" in msg(run, "vm-gpu-01", SUMMARY)
    epyc = msg(run, "epyc-nps4-01", SUMMARY)
    assert " | snc-like 4 nodes/package | " in epyc and "kernel" not in epyc
    arm = msg(run, "arm-kunpeng-01", SUMMARY)
    assert " | snc-like 2 nodes/package | " in arm
    assert " | kernel 5.15.0-rc1-00005-g4c1b4a4d90b6-dirty | " in arm


def test_facts_name_the_finding_the_source_and_the_raw_value(fleet):
    base, inventory, roots, show = fleet
    run = ansible_playbook(show, inventory, "--limit", "qemu-2node-01,vm-gpu-01,epyc-nps4-01")
    assert run.rc == 0, run.explain()
    (finding,) = msg(run, "qemu-2node-01", "Show the consistency findings")
    assert finding.startswith(
        "NUMA nodes 0, 1 and packages 0, 1 cut across each other (package 0 holds nodes 0, 1;"
    )
    assert "Line up the guest's NUMA nodes with its sockets" in finding
    layout = msg(run, "qemu-2node-01", "Show the package layout and kernel")
    assert layout == (
        "nodes_per_package=2 snc_like=False osrelease=6.1.0-50-amd64 "
        "from=/proc/sys/kernel/osrelease"
    )
    assert msg(run, "epyc-nps4-01", "Show the package layout and kernel").startswith(
        "nodes_per_package=4 snc_like=True osrelease= from="
    )
    devices = {entry[0]: entry[1:] for entry in msg(run, "vm-gpu-01", "Show the PCI locality")}
    assert devices["0000:06:00.0"] == [-1, 0, "local_cpulist_subset"]
    assert devices["0000:07:00.0"] == [-1, 1, "local_cpulist"]


def test_site_warns_about_crossed_nodes_and_renders_boot_hugepages(fleet):
    base, inventory, roots, show = fleet
    run = ansible_playbook(
        SITE,
        inventory,
        "--limit",
        "qemu-2node-01,epyc-nps4-01",
        "-e",
        '{"numafleet_hugepages_boot_reserve": ["2M"], "numafleet_hugepages_bootloader": "grub_d",'
        ' "numafleet_stop_on_plan_failure": false}',
    )
    plan = run.one("qemu-2node-01", "Plan placements")
    warned = " ".join(plan.get("warnings") or [])
    assert "NUMA nodes 0, 1 and packages 0, 1 cut across each other" in warned, run.explain()
    assert "each CPU of nodes 0, 1 is planned as a core of its own" in warned
    applied = run.one("qemu-2node-01", "Apply the placements")
    assert applied["status"] == "ok", run.explain()
    grub = Path(roots["qemu-2node-01"]) / "root" / GRUB
    assert "hugepagesz=2M hugepages=1:64" in grub.read_text()
    # no release in the facts: refused before the gate, naming the host variable; not applied
    failed = run.one("epyc-nps4-01", "Plan placements")
    assert failed["status"] == "failed"
    assert "numafleet_hugepages_boot_reserve" in failed["msg"]
    assert (
        "the kernel release is unknown (ansible_facts.numa.kernel.osrelease is null"
        in (failed["msg"])
    )
    assert not run.results("epyc-nps4-01", "Apply the placements")
    assert not (Path(roots["epyc-nps4-01"]) / "root").exists()


# ---------------------------------------------------------------------------------------------
# Refusals, summary notes and the fact cache


def test_facts_summary_names_vnuma_gpu_memory_and_unknown_packages(fleet):
    base, inventory, roots, show = fleet
    arm = base / "arm-unknown-packages"
    shutil.copytree(roots["arm-kunpeng-01"], arm, symlinks=True)
    field_cases.package_ids_unknown(arm)  # physical_package_id -1 everywhere
    run = ansible_playbook(FACTS, inventory, "--limit", "qemu-2node-01,gh200-01")
    assert run.rc == 0, run.explain()
    assert " | vNUMA nodes 0,1 cross packages 0,1 | " in msg(run, "qemu-2node-01", SUMMARY)
    assert " | n1=GPU memory of 0009:01:00.0 | " in msg(run, "gh200-01", SUMMARY)
    run = ansible_playbook(
        FACTS, inventory, "--limit", "arm-kunpeng-01", "-e", f"numafleet_sysfs_root={arm}/sys"
    )
    assert run.rc == 0, run.explain()
    line = msg(run, "arm-kunpeng-01", SUMMARY)
    assert "snc-like" not in line and "vNUMA" not in line, line


def test_boot_reserve_refusals_name_the_host_variables_before_the_gate(fleet):
    base, inventory, roots, show = fleet
    # epyc-nps4-01: a release file the kernel never writes; qemu-2node-01: release 6.1 but the
    # default bootloader auto, and its render root has no GRUB or grubby (a recording's never has)
    field_cases.add_osrelease(roots["epyc-nps4-01"], "garbage-kernel")
    assert not (Path(roots["qemu-2node-01"]) / "root" / "etc" / "default" / "grub").exists()
    run = ansible_playbook(
        SITE,
        inventory,
        "--limit",
        "qemu-2node-01,epyc-nps4-01",
        "-e",
        '{"numafleet_hugepages_boot_reserve": ["2M"], "numafleet_stop_on_plan_failure": false}',
    )
    qemu = run.one("qemu-2node-01", "Plan placements")
    assert qemu["status"] == "failed", run.explain()
    assert "numafleet_hugepages_bootloader: auto found neither grubby" in qemu["msg"]
    assert "Set numafleet_hugepages_bootloader to grub_d" in qemu["msg"]
    epyc = run.one("epyc-nps4-01", "Plan placements")
    assert epyc["status"] == "failed", run.explain()
    assert "/proc/sys/kernel/osrelease is malformed: 'garbage-kernel'" in epyc["msg"]
    assert "remove the size from numafleet_hugepages_boot_reserve" in epyc["msg"]
    assert "boot_reserve_sizes_kb" not in epyc["msg"] + qemu["msg"]
    for host in ("qemu-2node-01", "epyc-nps4-01"):
        assert not run.results(host, "Apply the placements")


def test_facts_cached_by_an_older_release_are_gathered_again(fleet, tmp_path):
    base, inventory, roots, show = fleet
    cache = tmp_path / "facts"
    env = {"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache)}
    gather = "Gather NUMA and GPU topology"

    def site():
        run = ansible_playbook(SITE, inventory, "--limit", "qemu-2node-01", env=env)
        assert run.rc == 0, run.explain()
        return run.one("qemu-2node-01", gather)["cached"]

    assert site() is False
    assert site() is True  # the cache answers
    # what the release before facts_version cached: no facts_version, allowed, pid1, osrelease
    (path,) = [p for p in cache.iterdir() if p.name.endswith("qemu-2node-01")]
    data = json.loads(path.read_text())
    payload = json.loads(data["__payload__"]) if "__payload__" in data else data
    numa = payload["numa"]
    for key in ("facts_version", "allowed", "pid1"):
        numa.pop(key)
    numa["kernel"].pop("osrelease")
    if "__payload__" in data:
        data["__payload__"] = json.dumps(payload)
    path.write_text(json.dumps(payload if "__payload__" not in data else data))
    assert site() is False  # gathered again, not planned from the old facts
    assert site() is True
