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
    # warnings are not recorded in plan.json: they are the plan task's
    assert "warnings" not in plan
    warning = run.one(HOST, "Plan placements")["warnings"][0]
    assert warning.startswith(
        f"host {HOST}: facts: services may use only CPUs 1,3 and memory nodes 1 (the allowed cpuset, from "
        "cgroup2_container ("
    ), warning
    assert "docker-4f1c2a9e7b3d.scope/cpuset.cpus.effective" in warning


def test_without_the_cgroup_files_the_plan_is_as_before(unedited):
    run, root = unedited
    assert run.rc == 0, run.explain()
    line = run.one(HOST, SUMMARY_TASK)["msg"]
    assert "allowed" not in line and "kv-cache node1 cpus 2" in line, line
    assert _unit_cpus(root) == "2"


# -- GPUs of a node without CPUs, empty cpusets, crossed nodes, plan records, on demo hosts

A100 = "gpu-a100-01"
PLAN_TASK = "Plan placements"
APPLY_TASK = "Apply the placements"


def _fleet(base, host, machine):
    """A scratch copy of the demo inventory and of host's tree (with its GPU snapshot)."""
    import trees

    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    root = trees.materialize(machine, base / ".demo" / host)
    snapshot = trees.GPU_SNAPSHOT_DIR / f"{machine}.json"
    if snapshot.is_file():
        shutil.copyfile(snapshot, f"{root}/gpu-snapshot.json")
    return inventory, root


def _v2_slice(root, cpus: str, mems: str) -> str:
    """numafleet.slice of a cgroup v2 host (PID 1 in the root's init.scope) set to cpus/mems."""
    from pathlib import Path

    cgroup = Path(root) / "sys" / "fs" / "cgroup"
    (cgroup / "numafleet.slice").mkdir(parents=True, exist_ok=True)
    (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    online = (Path(root) / "sys/devices/system/cpu/online").read_text().strip()
    nodes = (Path(root) / "sys/devices/system/node/online").read_text().strip()
    (cgroup / "cpuset.cpus.effective").write_text(online + "\n")
    (cgroup / "cpuset.mems.effective").write_text(nodes + "\n")
    (cgroup / "numafleet.slice" / "cpuset.cpus.effective").write_text(cpus + "\n")
    (cgroup / "numafleet.slice" / "cpuset.mems.effective").write_text(mems + "\n")
    (Path(root) / "proc" / "1").mkdir(parents=True, exist_ok=True)
    (Path(root) / "proc" / "1" / "cgroup").write_text("0::/init.scope\n")
    return str(cgroup / "numafleet.slice")


def test_node1_gpus_are_not_handed_to_node0_when_the_slice_leaves_node1_out(
    tmp_path, ansible_ready
):
    """#1: day 1 plans llm-70b on node 1 (b1:00.0, ca:00.0); numafleet.slice then narrows to
    node 0's CPUs: llm-70b is refused before the gate, naming node 1's GPUs and the file, and is
    not moved to node 0 with node-1 GPUs (the field report's silent move)."""
    inventory, root = _fleet(tmp_path, A100, "synthetic-2x6338-4xa100")
    day1 = ansible_playbook(SITE, inventory, "--limit", A100)
    assert day1.rc == 0, day1.explain()
    assert " llm-70b node1 " in day1.one(A100, SUMMARY_TASK)["msg"]
    from pathlib import Path

    unit = Path(root) / "root" / "etc/systemd/system"
    before = {p.name: p.read_text() for p in unit.rglob("*") if p.is_file()}
    slice_dir = _v2_slice(root, "0-31,64-95", "0-1")
    day2 = ansible_playbook(SITE, inventory, "--limit", A100)
    assert day2.rc != 0
    msg = day2.one(A100, PLAN_TASK)["msg"]
    assert msg.startswith(f"host {A100}: numafleet_placements[0] (llm-70b) needs 2 GPUs"), msg
    assert "(GPUs not offered: CPUs 32-63,96-127 are outside the allowed cpuset" in msg, msg
    assert f"{slice_dir}/cpuset.cpus.effective" in msg, msg
    assert not day2.results(A100, APPLY_TASK) or day2.one(A100, APPLY_TASK)["status"] != "changed"
    after = {p.name: p.read_text() for p in unit.rglob("*") if p.is_file()}
    assert after == before  # nothing was written


def test_a_slice_naming_no_online_memory_node_is_refused_naming_its_file(tmp_path, ansible_ready):
    """#11: numafleet.slice's cpuset.mems.effective names node 5 (not online)."""
    inventory, root = _fleet(tmp_path, HOST, MACHINE)
    slice_dir = _v2_slice(root, "0-3", "5")
    run = ansible_playbook(SITE, inventory, "--limit", HOST)
    assert run.rc != 0
    msg = run.one(HOST, PLAN_TASK)["msg"]
    assert msg == (
        f"host {HOST}: the allowed cpuset from cgroup2_slice ({slice_dir}/cpuset.mems.effective) "
        "leaves no online memory node a placement can use (it names nodes 5; nodes with memory: "
        "0-1): fix that cgroup's cpuset.mems; nothing was planned"
    ), msg


def test_crossed_vnuma_does_not_hold_back_a_listed_sibling_of_an_isolated_cpu(
    tmp_path, ansible_ready
):
    """#13: qemu-2node-01 with packages across nodes, siblings 2-3 and CPU 3 isolated: a fresh
    plan (numafleet_repack) still puts kv-cache (node: 1) on CPU 2."""
    import field_cases

    inventory, root = _fleet(tmp_path, HOST, MACHINE)
    field_cases.qemu_vnuma_crossed_isolated(root)
    run = ansible_playbook(SITE, inventory, "--limit", HOST, "-e", "numafleet_repack=true")
    assert run.rc == 0, run.explain()
    assert "kv-cache node1 cpus 2" in run.one(HOST, SUMMARY_TASK)["msg"]
    warned = " ".join(run.one(HOST, PLAN_TASK).get("warnings") or [])
    assert "CPUs 2 are listed as SMT siblings of isolated CPUs" in warned, warned
    assert "share cores with isolated CPUs" not in warned, warned


def test_a_facts_change_that_only_changes_warnings_changes_nothing(tmp_path, ansible_ready):
    """#17: after one run, the packages of qemu-2node-01 are made to cut across its nodes: the
    plan gains a warning, kv-cache is kept, and the second run writes no file (plan.json holds
    no warnings) and is not changed."""
    import field_cases
    from system_helpers import tree_digest

    inventory, root = _fleet(tmp_path, HOST, MACHINE)
    first = ansible_playbook(SITE, inventory, "--limit", HOST)
    assert first.rc == 0, first.explain()
    from pathlib import Path

    written = tree_digest(Path(root) / "root")
    field_cases.qemu_vnuma_crossed(root)
    again = ansible_playbook(SITE, inventory, "--limit", HOST)
    assert again.rc == 0, again.explain()
    line = again.one(HOST, SUMMARY_TASK)["msg"]
    assert line.endswith("warning; no change"), line
    assert again.one(HOST, APPLY_TASK)["status"] != "changed", again.explain()
    assert tree_digest(Path(root) / "root") == written


def test_mps_daemons_restarted_by_a_narrowed_container_cpuset_say_why(tmp_path, ansible_ready):
    """#2: gpu-a100-01 after day 1 becomes a container whose cpuset leaves CPUs 21-31 and
    85-95 of node 0 out; every placement is kept, the MPS daemons of node 0 restart (their
    CPUs change) and the change plan says why, naming the container's cpus file."""
    from pathlib import Path

    inventory, root = _fleet(tmp_path, A100, "synthetic-2x6338-4xa100")
    day1 = ansible_playbook(SITE, inventory, "--limit", A100)
    assert day1.rc == 0, day1.explain()
    cgroup = Path(root) / "sys" / "fs" / "cgroup"
    container = cgroup / "docker" / "abc"
    container.mkdir(parents=True)
    (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cgroup / "cpuset.cpus.effective").write_text("0-127\n")
    (cgroup / "cpuset.mems.effective").write_text("0-1\n")
    (container / "cpuset.cpus.effective").write_text("0-20,32-50,64-84,96-114\n")
    (container / "cpuset.mems.effective").write_text("0-1\n")
    (Path(root) / "proc" / "1").mkdir(parents=True, exist_ok=True)
    (Path(root) / "proc" / "1" / "cgroup").write_text("0::/docker/abc/init.scope\n")
    run = ansible_playbook(SITE, inventory, "--limit", A100, "--check")
    assert run.rc == 0, run.explain()
    lines = run.one(A100, "Show the change plan")["msg"]
    assert lines[0].startswith(f"{A100}: change plan: 0 added, 0 moved, 0 removed"), lines
    why = [line for line in lines if line.startswith("  why nvidia-mps@")]
    assert why, lines
    for line in why:
        assert " restarts: its CPUs change: " in line, line
        assert "are outside the allowed cpuset, from cgroup2_container (" in line, line
        assert f"{container}/cpuset.cpus.effective" in line, line
    assert any(line.startswith("  restarted by systemd: ") for line in lines), lines
