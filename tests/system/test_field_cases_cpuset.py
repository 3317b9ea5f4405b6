"""The allowed cpuset on a demo host (render mode, #22).

qemu-2node-01 (the real qemu-2node-pxb dump: CPUs 0-1 on node 0, 2-3 on node 1) is edited by
``field_cases.allowed_cgroup2_container`` into a container confined to CPUs 1,3 and memory
node 1. site.yml plans its kv-cache placement (node 1, one CPU) only inside that set: the
plan summary names the allowed sets, the plan warns naming their source, and the rendered unit
pins CPU 3 (without the edit it pins CPU 2, which the container may not use).
"""

from __future__ import annotations

import json
import shutil

import pytest
from system_helpers import REPO, ansible_playbook

HOST = "qemu-2node-01"
MACHINE = "qemu-2node-pxb"
SITE = REPO / "site.yml"
SUMMARY_TASK = "Print the plan summary"
UNIT = "etc/systemd/system/numafleet-kv-cache.service"


def _site(base, edit):
    import field_cases
    import trees

    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    root = trees.materialize(MACHINE, base / ".demo" / HOST)
    if edit:
        field_cases.allowed_cgroup2_container(root)
    run = ansible_playbook(SITE, inventory, "--limit", HOST)
    return run, base / ".demo" / HOST


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory, ansible_ready):
    return _site(tmp_path_factory.mktemp("cpuset"), edit=True)


@pytest.fixture(scope="module")
def unedited(tmp_path_factory, ansible_ready):
    return _site(tmp_path_factory.mktemp("cpuset-plain"), edit=False)


def _unit_cpus(root) -> str:
    text = (root / "root" / UNIT).read_text()
    return text.split("\nCPUAffinity=", 1)[1].split("\n", 1)[0]


def test_the_plan_summary_names_the_allowed_sets(narrowed):
    run, root = narrowed
    assert run.rc == 0, run.explain()
    line = run.one(HOST, SUMMARY_TASK)["msg"]
    assert line.startswith(f"{HOST}: 1 placement: kv-cache node1 cpus 3"), line
    assert "; 1 warning; allowed CPUs 1,3 and memory nodes 1" in line, line


def test_no_placement_gets_a_cpu_outside_the_allowed_set(narrowed):
    run, root = narrowed
    assert _unit_cpus(root) == "3"
    plans = list((root / "root").rglob("plan.json"))
    assert plans, sorted(p.name for p in (root / "root").rglob("*"))
    plan = json.loads(plans[0].read_text())
    taken = {cpu for entry in plan["placements"] for cpu in entry["cpus"]}
    assert taken and taken <= set(plan["allowed"]["cpus"]) == {1, 3}
    warning = plan["warnings"][0]
    assert warning.startswith(
        "facts: services may use only CPUs 1,3 and memory nodes 1 (the allowed cpuset, from "
        "cgroup2_container ("
    ), warning
    assert "docker-4f1c2a9e7b3d.scope/cpuset.cpus.effective" in warning


def test_without_the_cgroup_files_the_plan_is_as_before(unedited):
    run, root = unedited
    assert run.rc == 0, run.explain()
    line = run.one(HOST, SUMMARY_TASK)["msg"]
    assert "allowed" not in line and "kv-cache node1 cpus 2" in line, line
    assert _unit_cpus(root) == "2"
