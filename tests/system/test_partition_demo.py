"""The housekeeping partition (numafleet_partition) on one demo host, in render mode: the
drop-ins rendered from the plan, --check writing nothing, a second run changing nothing, a
placement edit leaving the partition files alone, partition off removing them, and bad inputs
refused before the gate. Runs on a scratch copy of the demo fleet; qemu-2node-01's host_vars
get numafleet_reserved_cpus "0" and numafleet_partition: true.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, read_tree, tree_digest

HOST = "qemu-2node-01"
DRIFT = REPO / "playbooks" / "drift_check.yml"
CHANGES_TASK = "Show the change plan"
PLAN_TASK = "Plan placements"
WOULD_RUN = "Report what would run (render mode)"
UNITS = "etc/systemd/system"
PARTITION = [
    "etc/systemd/system.conf.d/50-numafleet.conf",
    f"{UNITS}/init.scope.d/50-numafleet.conf",
    f"{UNITS}/system.slice.d/50-numafleet.conf",
    f"{UNITS}/user.slice.d/50-numafleet.conf",
]
HEADER = "# Managed by numafleet.tuning\n\n"


class Fleet:
    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.vars_file = self.inventory / "host_vars" / f"{HOST}.yml"
        self.original = yaml.safe_load(self.vars_file.read_text())

    @property
    def root(self) -> Path:
        return self.base / ".demo" / HOST / "root"

    def write(self, **changes) -> None:
        data = dict(self.original, **changes)
        self.vars_file.write_text(yaml.safe_dump(data, sort_keys=False))

    def run(self, *args):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", HOST, *args)


def lines(run, task: str) -> list:
    return [line for r in run.results(HOST, task) for line in r.get("msg") or []]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    fleet = Fleet(tmp_path_factory.mktemp("partition"))
    fleet.write(numafleet_reserved_cpus="0", numafleet_partition=True)
    return fleet


def test_partition_round_trip(fleet):
    # --check --diff: the drop-ins in the diff and the change plan, nothing written.
    before = tree_digest(fleet.root)
    check = fleet.run("--check", "--diff")
    assert check.rc == 0, check.explain()
    assert tree_digest(fleet.root) == before
    plan = lines(check, CHANGES_TASK)
    assert "  new slice: init.scope, system.slice, user.slice (applied at daemon-reload)" in plan
    assert any("daemon-reexec (no restarts)" in line for line in plan), plan
    assert "/etc/systemd/system/system.slice.d/50-numafleet.conf" in check.stdout

    # The apply renders them from the plan; PID 1 re-executes once, after the one reload.
    first = fleet.run()
    assert first.rc == 0, first.explain()
    tree = read_tree(fleet.root)
    assert tree[PARTITION[0]] == HEADER + "[Manager]\nCPUAffinity=0\n"
    assert tree[PARTITION[1]] == HEADER + "[Scope]\nAllowedCPUs=0\n"
    for path in PARTITION[2:]:
        assert tree[path] == HEADER + "[Slice]\nAllowedCPUs=0\n", path
    assert not [path for path in tree if path.startswith(f"{UNITS}/numafleet.slice")]
    would = lines(first, WOULD_RUN)
    reload_at = would.index("would run: systemctl daemon-reload")
    assert would[reload_at + 1] == "would run: systemctl daemon-reexec", would
    assert not [line for line in would if "restart" in line and ".slice" in line], would
    recorded = (fleet.root / "etc/numafleet/plan.json").read_text()
    assert '"housekeeping_cpus": [\n   0\n  ]' in recorded

    # A second run changes nothing.
    digest = tree_digest(fleet.root)
    again = fleet.run()
    assert again.rc == 0, again.explain()
    assert tree_digest(fleet.root) == digest
    assert lines(again, CHANGES_TASK)[0].endswith("; no change")

    # drift_check.yml reports a hand-edited drop-in; site.yml writes it back.
    edited = fleet.root / PARTITION[2]
    edited.write_text(HEADER + "[Slice]\nAllowedCPUs=0-3\n")
    reports = fleet.base / "reports"
    drift = ansible_playbook(
        DRIFT, fleet.inventory, "--limit", HOST, "-e", f"numafleet_report_dir={reports}"
    )
    entry = json.loads((reports / "drift" / "latest" / "drift.json").read_text())["hosts"][HOST]
    assert drift.rc != 0 and entry["status"] == "drift", drift.explain()
    (changed,) = entry["drift"]
    assert changed["role"] == "pinned_services"
    assert changed["changes"] == [
        {
            "path_or_header": "/" + PARTITION[2],
            "state": "update",
            "added": 1,
            "removed": 1,
            "settings": ["AllowedCPUs"],
        }
    ]
    failed = [(c["check"], c["subject"]) for c in entry["checks"] if c["status"] == "fail"]
    assert ("rendered_units", "system.slice") in failed, failed
    repaired = fleet.run()
    assert repaired.rc == 0, repaired.explain()
    assert tree_digest(fleet.root) == digest

    # A placement edit (day 2) leaves the partition files as they are.
    placements = [dict(entry) for entry in fleet.original["numafleet_placements"]]
    placements[0]["cpus"] = 2
    fleet.write(
        numafleet_reserved_cpus="0", numafleet_partition=True, numafleet_placements=placements
    )
    edit = fleet.run()
    assert edit.rc == 0, edit.explain()
    after = read_tree(fleet.root)
    assert {path: after[path] for path in PARTITION} == {path: tree[path] for path in PARTITION}
    assert not any("slice:" in line for line in lines(edit, CHANGES_TASK))

    # Partition off: our four files go, and nothing restarts for it.
    fleet.write(numafleet_reserved_cpus="0", numafleet_placements=placements)
    off = fleet.run()
    assert off.rc == 0, off.explain()
    gone = read_tree(fleet.root)
    assert not [path for path in PARTITION if path in gone]
    assert not (fleet.root / "etc/systemd/system.conf.d").exists()
    plan = lines(off, CHANGES_TASK)
    assert "  removed slice: init.scope, system.slice, user.slice (applied at daemon-reload)" in (
        plan
    )
    assert not any(line.startswith("  restart") for line in plan), plan
    # PID 1 keeps the housekeeping affinity across the re-exec: reset after it.
    would = lines(off, WOULD_RUN)
    at = would.index("would run: systemctl daemon-reexec")
    assert would[at + 1].startswith("would run: taskset -a -p -c 0-"), would
    assert would[at + 1].endswith(" 1"), would


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"numafleet_partition": True},
            "numafleet_partition is true but numafleet_reserved_cpus is empty",
        ),
        (
            {"numafleet_partition": True, "numafleet_reserved_cpus": "0", "cpus_pinned": "0-1"},
            "CPU 0 is in numafleet_reserved_cpus",
        ),
    ],
)
def test_bad_partition_inputs_are_refused_before_the_gate(fleet, changes, fragment):
    changes = dict(changes)
    pinned = changes.pop("cpus_pinned", None)
    data = dict(fleet.original, **changes)
    if pinned:
        data["numafleet_placements"] = [
            dict(entry, cpus=pinned, node=None) if index == 0 else entry
            for index, entry in enumerate(fleet.original["numafleet_placements"])
        ]
        data["numafleet_placements"][0].pop("node")
    fleet.vars_file.write_text(yaml.safe_dump(data, sort_keys=False))
    digest = tree_digest(fleet.root)
    run = fleet.run()
    assert run.rc != 0
    (failed,) = run.results(HOST, PLAN_TASK)
    assert failed["status"] == "failed" and fragment in failed["msg"], failed
    assert f"host {HOST}: " in failed["msg"]
    assert tree_digest(fleet.root) == digest
