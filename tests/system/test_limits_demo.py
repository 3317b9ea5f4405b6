"""Resource limits through site.yml on one demo host (render mode, a scratch copy of the fleet):
qemu-2node-01's kv-cache gets memory_limit: max and the other limits, a second placement without
user: runs as root (summary and warning); check mode writes nothing, a second run changes
nothing, and changing one placement's limit rewrites and restarts only its unit, with the reason
in the change plan. Bad values are refused before the gate by tests/bad_inputs/ (memory_limit_*,
cpu_weight_*, tasks_max_*)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, read_tree, tree_digest

HOST = "qemu-2node-01"
PLAN_TASK = "Plan placements"
CHANGES_TASK = "Show the change plan"
UNITS = "etc/systemd/system"
KV = f"{UNITS}/numafleet-kv-cache.service"
BATCH = f"{UNITS}/numafleet-batch.service"
MIB = 1 << 20
LIMITS = {"memory_limit": "max", "cpu_weight": 200, "io_weight": 300, "tasks_max": "25%"}
BATCH_PLACEMENT = {
    "name": "batch",
    "exec": "/usr/bin/batch-worker",
    "node": 0,
    "cpus": 1,
    "memory": "256M",
    "memory_limit": "high",
}


class Fleet:
    """A scratch copy of the demo fleet with limits on HOST's placements."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.vars_file = self.inventory / "host_vars" / f"{HOST}.yml"
        self.data = yaml.safe_load(self.vars_file.read_text())
        self.data["numafleet_placements"][0].update(LIMITS)
        self.data["numafleet_placements"].append(dict(BATCH_PLACEMENT))
        self.write()

    def write(self) -> None:
        self.vars_file.write_text(yaml.safe_dump(self.data, sort_keys=False))

    def root(self) -> Path:
        return self.base / ".demo" / HOST / "root"

    def run(self, *args):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", HOST, *args)


def service_section(text: str) -> list:
    return text.split("[Service]\n", 1)[1].split("\n\n", 1)[0].splitlines()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    fleet = Fleet(tmp_path_factory.mktemp("limits"))
    fleet.first = fleet.run()
    assert fleet.first.rc == 0, fleet.first.explain()
    return fleet


def test_the_limits_are_rendered_into_the_placements_units(fleet):
    tree = read_tree(fleet.root())
    kv = service_section(tree[KV])
    start = kv.index("LimitMEMLOCK=infinity") + 1
    assert kv[start : start + 4] == [
        f"MemoryMax={512 * MIB}",
        "CPUWeight=200",
        "IOWeight=300",
        "TasksMax=25%",
    ]
    batch = service_section(tree[BATCH])
    assert f"MemoryHigh={256 * MIB}" in batch
    assert not any(line.startswith(("MemoryMax=", "CPUWeight=", "User=")) for line in batch)
    # The plan recorded on the host (/etc/numafleet/plan.json) carries them as planned.
    recorded = json.loads((fleet.root() / "etc/numafleet/plan.json").read_text())
    entries = {e["name"]: e for e in recorded["placements"]}
    assert entries["kv-cache"]["limits"] == {
        "memory_max_bytes": 512 * MIB,
        "cpu_weight": 200,
        "io_weight": 300,
        "tasks_max": "25%",
    }
    assert entries["batch"]["limits"] == {"memory_high_bytes": 256 * MIB}


def test_a_placement_without_user_runs_as_root_and_is_warned(fleet):
    plan = fleet.first.one(HOST, PLAN_TASK)
    summary = plan["summary"]
    assert " batch node0 cpus " in summary and summary.count(" as root") == 1, summary
    assert "batch node0 cpus 0 as root" in summary or "batch node0 cpus 1 as root" in summary
    root = [w for w in plan["warnings"] if "runs as root" in w]
    assert root == [
        f"host {HOST}: placement batch: numafleet-batch.service runs as root (no user:): set "
        "user: to the account the service should run as"
    ]


def test_check_mode_writes_nothing_and_a_second_run_changes_nothing(fleet):
    digest = tree_digest(fleet.root())
    check = fleet.run("--check")
    assert check.rc == 0, check.explain()
    assert tree_digest(fleet.root()) == digest
    (shown,) = check.results(HOST, CHANGES_TASK)
    assert shown["msg"] == [f"{HOST}: change plan: 0 added, 0 moved, 0 removed, 2 kept; no change"]
    again = fleet.run()
    assert again.rc == 0, again.explain()
    assert tree_digest(fleet.root()) == digest


def test_changing_one_limit_rewrites_and_restarts_only_that_unit(fleet):
    before = read_tree(fleet.root())
    fleet.data["numafleet_placements"][0]["memory_limit"] = "high"
    fleet.write()
    try:
        check = fleet.run("--check", "--diff")
        assert check.rc == 0, check.explain()
        assert read_tree(fleet.root()) == before  # check mode writes nothing
        (shown,) = check.results(HOST, CHANGES_TASK)
        assert shown["msg"] == [
            f"{HOST}: change plan: 0 added, 0 moved, 0 removed, 2 kept",
            "  restart: numafleet-kv-cache.service",
            f"  why numafleet-kv-cache.service restarts: its limits change: MemoryMax "
            f"{512 * MIB} -> (none), MemoryHigh (none) -> {512 * MIB}",
        ]
        applied = fleet.run()
        assert applied.rc == 0, applied.explain()
        after = read_tree(fleet.root())
        changed = sorted(
            path for path in set(before) | set(after) if before.get(path) != after.get(path)
        )
        assert [p for p in changed if p.startswith(UNITS)] == [KV]
        assert f"MemoryHigh={512 * MIB}" in after[KV] and "MemoryMax=" not in after[KV]
        assert after[BATCH] == before[BATCH]
    finally:
        fleet.data["numafleet_placements"][0]["memory_limit"] = "max"
        fleet.write()
        assert fleet.run().rc == 0
    assert read_tree(fleet.root())[KV] == before[KV]
