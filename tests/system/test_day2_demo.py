"""Day-2 runs of site.yml on a demo host that already runs services (render mode): stable
placements, the change plan printed before anything changes, numafleet_restart: never, and the
blast-radius guards. Each scenario edits the host_vars of gpu-a100-01 after a first apply and
asserts the exact change plan and that nothing else moved or was rewritten.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, read_tree, tree_digest

HOST = "gpu-a100-01"
OTHER = "qemu-2node-01"
LIMIT = f"{HOST},{OTHER}"
CHANGES_TASK = "Show the change plan"
UNITS = "etc/systemd/system"
MPS_DAEMON = "nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service"
# The first apply wrote the demo MIG GPU's planned instances into its recording (render mode
# keeps the recording a consistent kernel), so no later change plan has a MIG line or a unit
# waiting for its instance (test_mig_render_demo.py covers both).
WOULD_RUN = "Report what would run (render mode)"


class Host:
    """A scratch copy of the demo fleet, applied once; edit() changes HOST's host_vars."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.vars_file = self.inventory / "host_vars" / f"{HOST}.yml"
        self.original = self.vars_file.read_text()

    def root(self, host: str = HOST) -> Path:
        return self.base / ".demo" / host / "root"

    def run(self, *args):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", LIMIT, *args)

    def edit(self, change) -> None:
        data = yaml.safe_load(self.original)
        change(data)
        self.vars_file.write_text(yaml.safe_dump(data, sort_keys=False))

    def restore(self) -> None:
        self.vars_file.write_text(self.original)


@pytest.fixture(scope="module")
def host(tmp_path_factory, ansible_ready):
    fleet = Host(tmp_path_factory.mktemp("day2"))
    first = fleet.run()
    assert first.rc == 0, first.explain()
    (shown,) = first.results(HOST, CHANGES_TASK)
    assert shown["msg"][:2] == [
        f"{HOST}: change plan: 6 added, 0 moved, 0 removed, 0 kept",
        "  (no recorded plan on the host: every placement is planned from scratch)",
    ]
    assert (fleet.root() / "etc/numafleet/plan.json").is_file()
    return fleet


@pytest.fixture
def edited(host):
    """host for one test; afterwards its host_vars and, if the test applied, its state restored."""
    digest = tree_digest(host.root())
    yield host
    host.restore()
    if tree_digest(host.root()) != digest:
        assert host.run().rc == 0
        assert tree_digest(host.root()) == digest


def placement(data: dict, name: str) -> dict:
    return next(p for p in data["numafleet_placements"] if p["name"] == name)


def change_plan(run) -> list:
    (shown,) = run.results(HOST, CHANGES_TASK)
    return shown["msg"]


def would_run(run) -> list:
    """The service manager's part of the apply's would-run lines on HOST (the recorded MIG GPU's
    own actions, named on every run in render mode, left out)."""
    return [
        line
        for r in run.results(HOST, WOULD_RUN)
        for line in r.get("msg") or []
        if line.startswith("would run: systemctl ") and "numafleet-mig" not in line
    ]


def test_an_unchanged_host_has_an_empty_change_plan(host):
    run = host.run("--check")
    assert run.rc == 0, run.explain()
    # Nothing at all: the MIG GPU's recording has the planned layout since the first apply.
    assert change_plan(run) == [
        f"{HOST}: change plan: 0 added, 0 moved, 0 removed, 6 kept; no change",
    ]


def test_resizing_one_placement_moves_and_restarts_only_it(edited):
    before = read_tree(edited.root())
    edited.edit(lambda data: placement(data, "rerank-b").update(cpus=6))
    check = edited.run("--check")
    assert check.rc == 0, check.explain()
    assert change_plan(check) == [
        f"{HOST}: change plan: 0 added, 1 moved, 0 removed, 5 kept",
        "  ~ move    rerank-b: node0 cpus 7-8,71-72 gpus 31:00.0 mps -> node0 cpus 7-8,11,71-72,75"
        " gpus 31:00.0 mps (its request changed (cpus 4 -> 6))",
        "  restart: numafleet-rerank-b.service",
        "  changed slice: numafleet-team\\x2db.slice (applied at daemon-reload)",
    ]
    assert read_tree(edited.root()) == before  # --check wrote nothing
    run = edited.run()
    assert run.rc == 0, run.explain()
    after = read_tree(edited.root())
    changed = sorted(path for path in after if after[path] != before.get(path))
    assert changed == [
        "etc/numafleet/guard.json",  # the memory guard's placements (re-read, no restart)
        "etc/numafleet/manifest.json",  # records each file's sha256 (manifest version 2)
        "etc/numafleet/plan.json",
        f"{UNITS}/numafleet-rerank-b.service",
        f"{UNITS}/numafleet-team\\x2db.slice",  # the tenant slice's CPUs (no restart)
    ]
    # One reload and the one restart: the MPS daemon did not change.
    assert would_run(run) == [
        "would run: systemctl daemon-reload",
        "would run: systemctl restart numafleet-rerank-b.service",
    ]


def test_removing_one_placement_stops_only_it(edited):
    edited.edit(lambda data: data["numafleet_placements"].remove(placement(data, "classify")))
    run = edited.run("--check")
    assert run.rc == 0, run.explain()
    assert change_plan(run) == [
        f"{HOST}: change plan: 0 added, 0 moved, 1 removed, 5 kept",
        "  - remove  classify: node0 cpus 9,73 gpus 17:00.0 mig 1g.10gb@2",
        "  stop: numafleet-classify.service",
        "  changed slice: numafleet-team\\x2db.slice (applied at daemon-reload)",
    ]


def test_an_mps_change_shows_the_clients_systemd_restarts(edited):
    edited.edit(lambda data: placement(data, "rerank-a")["mps"].update(active_thread_percentage=60))
    run = edited.run("--check")
    assert run.rc == 0, run.explain()
    assert change_plan(run) == [
        f"{HOST}: change plan: 0 added, 0 moved, 0 removed, 6 kept",
        f"  restart: numafleet-rerank-a.service, {MPS_DAEMON}",
        f"  restarted by systemd: numafleet-rerank-b.service (Requires={MPS_DAEMON})",
    ]


def test_restart_never_writes_and_restarts_nothing(edited):
    edited.edit(lambda data: placement(data, "rerank-a")["mps"].update(active_thread_percentage=60))
    before = read_tree(edited.root())
    run = edited.run("-e", "numafleet_restart=never")
    assert run.rc == 0, run.explain()
    assert change_plan(run) == [
        f"{HOST}: change plan: 0 added, 0 moved, 0 removed, 6 kept",
        "  awaiting a restart (numafleet_restart: never): numafleet-rerank-a.service, "
        f"numafleet-rerank-b.service, {MPS_DAEMON}",
    ]
    after = read_tree(edited.root())
    assert sorted(p for p in after if after[p] != before.get(p)) == [
        "etc/numafleet/manifest.json",  # the manifests record each file's sha256 (version 2)
        "etc/numafleet/mps-units.json",
        "etc/numafleet/plan.json",
        f"{UNITS}/numafleet-rerank-a.service",
        f"{UNITS}/{MPS_DAEMON}.d/50-numafleet.conf",
    ]
    lines = would_run(run)
    assert lines and not any("restart" in line for line in lines), lines
    # The next run with the default restarts what awaited, although no file changes any more.
    awaited = ["numafleet-rerank-a.service", "numafleet-rerank-b.service", MPS_DAEMON]
    auto = edited.run()
    assert auto.rc == 0, auto.explain()
    assert change_plan(auto)[1] == (
        "  restart (awaited since a run with numafleet_restart: never): " + ", ".join(awaited)
    )
    assert [line for line in would_run(auto) if "try-restart" in line] == [
        f"would run: systemctl try-restart {unit}" for unit in awaited
    ]
    # and then nothing awaits any more
    third = edited.run("--check")
    assert change_plan(third) == [
        f"{HOST}: change plan: 0 added, 0 moved, 0 removed, 6 kept; no change"
    ]
    assert not any("awaited" in line for line in change_plan(third))


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (
            lambda data: data.update(numafleet_placement=data.pop("numafleet_placements")),
            "numafleet_placement is not a variable of numafleet.tuning; did you mean "
            "numafleet_placements?",
        ),
        (
            lambda data: data.update(numafleet_placements=[]),
            "would remove every unit numafleet manages here",
        ),
        (
            lambda data: data.update(numafleet_placements=data["numafleet_placements"][:2]),
            "more than numafleet_max_removals (2)",
        ),
    ],
)
def test_a_plan_that_removes_too_much_changes_no_host(edited, change, expect):
    digests = {h: tree_digest(edited.root(h)) for h in (HOST, OTHER)}
    edited.edit(change)
    run = edited.run()
    assert run.rc != 0, run.explain()
    assert expect in run.stdout, run.explain()
    assert "Nothing was changed" in run.stdout or "nothing was changed" in run.stdout
    assert {h: tree_digest(edited.root(h)) for h in (HOST, OTHER)} == digests


def test_allow_removals_lets_a_deliberate_removal_through(edited):
    edited.edit(lambda data: data.update(numafleet_placements=data["numafleet_placements"][:2]))
    run = edited.run("--check", "-e", "numafleet_allow_removals=true")
    assert run.rc == 0, run.explain()
    plan = change_plan(run)
    assert plan[0] == f"{HOST}: change plan: 0 added, 0 moved, 4 removed, 2 kept"
    assert any(line.startswith("  stop: ") and MPS_DAEMON in line for line in plan), plan


def test_without_the_recorded_plan_a_disturbing_run_is_refused(edited):
    plan_file = edited.root() / "etc/numafleet/plan.json"
    saved = plan_file.read_text()
    plan_file.unlink()
    try:
        edited.edit(lambda data: placement(data, "rerank-b").update(cpus=6))
        digest = tree_digest(edited.root())
        run = edited.run()
        assert run.rc != 0, run.explain()
        assert "no plan is recorded on this host" in run.stdout, run.explain()
        assert "numafleet-rerank-b.service" in run.stdout
        assert tree_digest(edited.root()) == digest
    finally:
        plan_file.write_text(saved)
