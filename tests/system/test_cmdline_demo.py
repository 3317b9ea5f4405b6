"""Kernel CPU isolation on the demo host qemu-2node-01 (render mode, grub_d).

numafleet_kernel_isolation: nohz_full with numafleet_reserved_cpus "0" puts
``nohz_full=1-3 rcu_nocbs=1-3 irqaffinity=0`` into the numafleet GRUB drop-in. ``--check --diff``
shows the file and the change plan line and writes nothing; the run writes it and reports the
reboot; the second run changes nothing. The recording has no /proc/cmdline; a scratch one
stands for the running kernel: without the arguments every run keeps reporting the reboot
(site.yml, drift_check.yml: pending, not drift), with them nothing is owed. A placement edit
leaves the command line alone; isolation set back to none removes the drop-in.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, tree_digest

HOST = "qemu-2node-01"
DRIFT = REPO / "playbooks" / "drift_check.yml"
PLAN_TASK = "Plan placements"
APPLY_TASK = "Apply the placements"
GRUB = "etc/default/grub.d/60-numafleet-hugepages.cfg"
ARGS = "nohz_full=1-3 rcu_nocbs=1-3 irqaffinity=0"
ISOLATION = {
    "numafleet_kernel_isolation": "nohz_full",
    "numafleet_reserved_cpus": "0",
    "numafleet_hugepages_bootloader": "grub_d",
}


class Demo:
    """A scratch copy of the demo fleet; runs limited to HOST."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.vars_path = self.inventory / "host_vars" / f"{HOST}.yml"
        self.original = yaml.safe_load(self.vars_path.read_text())
        self.root = base / ".demo" / HOST / "root"
        self.cmdline = base / ".demo" / HOST / "proc" / "cmdline"

    def host_vars(self, **extra) -> None:
        self.vars_path.write_text(yaml.safe_dump({**self.original, **extra}, sort_keys=True))

    def site(self, *args):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", HOST, *args)

    def drift(self, name: str):
        env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(self.base / name)}
        run = ansible_playbook(DRIFT, self.inventory, "--limit", HOST, env=env)
        report = json.loads((self.base / name / "latest" / "drift.json").read_text())
        return run, report["hosts"][HOST]


def _apply(run) -> dict:
    return run.one(HOST, APPLY_TASK)


def _plan_summary(run) -> str:
    return run.one(HOST, PLAN_TASK).get("summary") or ""


def _hugepages(run) -> dict:
    return _apply(run)["layers"]["hugepages"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, ansible_ready):
    demo = Demo(tmp_path_factory.mktemp("cmdline"))
    demo.host_vars(**ISOLATION)
    return demo


@pytest.fixture(scope="module")
def check_run(demo):
    before = tree_digest(demo.root) if demo.root.exists() else None
    run = demo.site("--check", "--diff")
    after = tree_digest(demo.root) if demo.root.exists() else None
    return run, before, after


def test_check_diff_shows_the_command_line_and_writes_nothing(check_run):
    run, before, after = check_run
    assert run.rc == 0, run.explain()
    assert before == after
    diff = _apply(run)["diff"]
    grub = [entry for entry in diff if entry.get("after_header", "").endswith(GRUB)]
    assert len(grub) == 1 and grub[0]["before"] == "", diff
    assert grub[0]["after"].endswith(f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {ARGS}"\n')
    assert "kernel command line to change (reboot)" in _plan_summary(run)
    assert _apply(run)["reboot_required"] is True


@pytest.fixture(scope="module")
def applied(demo, check_run):
    first = demo.site()
    second = demo.site()
    return first, second


def test_the_drop_in_is_written_and_the_reboot_reported(demo, applied):
    first, dummy = applied
    assert first.rc == 0, first.explain()
    text = (demo.root / GRUB).read_text()
    assert text.startswith("# Managed by numafleet.tuning")
    assert text.endswith(f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {ARGS}"\n')
    assert _apply(first)["reboot_required"] is True
    assert _hugepages(first)["kernel_args"] == ARGS.split()
    state = json.loads((demo.root / "etc/numafleet/hugepages.json").read_text())
    assert state["kernel_args"] == ARGS.split()


def test_the_second_run_changes_nothing(demo, applied):
    dummy, second = applied
    assert second.rc == 0, second.explain()
    assert second.stats[HOST]["changed"] == 0, second.explain()
    assert _apply(second)["reboot_required"] is False  # no /proc/cmdline in the recording


@pytest.fixture(scope="module")
def pending(demo, applied):
    demo.cmdline.write_text("BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/vda1 ro quiet\n")
    before = tree_digest(demo.root)
    run = demo.site()
    drift_run, drift = demo.drift("drift-pending")
    after = tree_digest(demo.root)
    return run, drift_run, drift, before, after


def test_reboot_stays_required_until_the_host_booted_with_the_arguments(pending):
    run, dummy, dummy2, before, after = pending
    assert run.rc == 0, run.explain()
    assert run.stats[HOST]["changed"] == 0
    assert before == after
    assert _apply(run)["reboot_required"] is True
    assert _hugepages(run)["reboot_pending"] is True
    assert _hugepages(run)["kernel_args_missing"] == ARGS.split()
    assert _plan_summary(run).endswith("no change; reboot pending")


def test_drift_check_reports_the_pending_reboot_without_failing(pending):
    dummy, drift_run, drift, dummy2, dummy3 = pending
    assert drift_run.rc == 0, drift_run.explain()
    line = "  kernel command line: reboot pending (/proc/cmdline lacks " + ARGS
    assert any(text.startswith(line) for text in drift.get("change_plan") or []), drift


def test_after_the_reboot_nothing_is_owed(demo, pending):
    demo.cmdline.write_text(f"BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro {ARGS}\n")
    run = demo.site()
    assert run.rc == 0, run.explain()
    assert _apply(run)["reboot_required"] is False and run.stats[HOST]["changed"] == 0
    assert "reboot" not in _plan_summary(run)


def test_a_placement_edit_leaves_the_command_line_alone(demo, pending):
    placements = [dict(demo.original["numafleet_placements"][0], cpus=2, memory="768M")]
    demo.host_vars(**ISOLATION, numafleet_placements=placements)
    grub = (demo.root / GRUB).read_text()
    run = demo.site()
    assert run.rc == 0, run.explain()
    assert (demo.root / GRUB).read_text() == grub
    assert _hugepages(run)["cmdline_changed"] is False
    assert "kernel command line" not in _plan_summary(run)


def test_isolation_none_removes_the_drop_in(demo, pending):
    demo.host_vars(numafleet_reserved_cpus="0", numafleet_hugepages_bootloader="grub_d")
    run = demo.site()
    assert run.rc == 0, run.explain()
    assert not (demo.root / GRUB).exists()
    assert "kernel command line to change (reboot)" in _plan_summary(run)
    assert _hugepages(run)["kernel_args_removed"] == ARGS.split()


def test_a_boot_reserve_change_shows_in_the_change_plan(demo, pending):
    release = demo.base / ".demo" / HOST / "proc" / "sys" / "kernel" / "osrelease"
    release.parent.mkdir(parents=True, exist_ok=True)
    release.write_text("6.1.0-18-amd64\n")
    demo.host_vars(
        numafleet_reserved_cpus="0",
        numafleet_hugepages_bootloader="grub_d",
        numafleet_hugepages_boot_reserve=["2M"],
    )
    before = tree_digest(demo.root)
    run = demo.site("--check")
    assert run.rc == 0, run.explain()
    assert tree_digest(demo.root) == before
    assert "kernel command line to change (reboot)" in _plan_summary(run)
    assert _hugepages(run)["kernel_args"] == ["hugepagesz=2M", "hugepages=1:64"]
