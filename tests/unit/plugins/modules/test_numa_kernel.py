"""numa_kernel through main(): check mode, apply, repeat, systemctl use, warnings, bad input."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
case "$1" in
    is-enabled) echo "${{FAKE_ENABLED:-enabled}}"; exit 0 ;;
    is-active) echo "${{FAKE_ACTIVE:-active}}"; [ "${{FAKE_ACTIVE:-active}}" = active ]; exit $? ;;
esac
if [ -n "$FAKE_SYSTEMCTL_FAIL" ]; then
    echo "Failed to $1 $2: $FAKE_SYSTEMCTL_FAIL" >&2
    exit 1
fi
"""
ALL = {
    "numa_balancing": 0,
    "zone_reclaim_mode": 0,
    "thp_enabled": "madvise",
    "thp_defrag": "madvise",
    "numad": "masked",
    "irqbalance_banned_cpus": "0",
}


def tree_hash(root) -> str:
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            if path.endswith(("/run", "/run/numafleet", "/run/numafleet/apply.lock")):
                continue  # the per-host lock file: made by every run that may write
            digest.update(os.path.relpath(path, root).encode())
            if os.path.islink(path):
                digest.update(os.readlink(path).encode())
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


@pytest.fixture
def tree(fixture_root):
    """Writable copy of the 2-node guest with a render root holding numad and irqbalance files."""
    base = Path(fixture_root("qemu-2node-pxb", writable=True))
    vendor = base / "root/usr/lib/systemd/system/numad.service"
    vendor.parent.mkdir(parents=True)
    vendor.write_text("[Service]\nExecStart=/usr/bin/numad -i 15\n")
    default = base / "root/etc/default/irqbalance"
    default.parent.mkdir(parents=True)
    default.write_text('#IRQBALANCE_BANNED_CPULIST=\nIRQBALANCE_ARGS="-j"\n')
    irq = base / "proc/irq/40/smp_affinity_list"
    irq.parent.mkdir(parents=True)
    irq.write_text("0-3\n")
    return base


@pytest.fixture
def run(run_module, monkeypatch):
    """run_module for numa_kernel, with module.warn() landing in the result as on a host.

    Once a test has imported controller code, ansible-core sends in-process warnings to the
    display instead of the result; a managed host never has that code loaded. Warnings of earlier
    in-process runs are dropped.
    """
    monkeypatch.setattr(ansible_internal, "is_controller", False)

    def call(args, check_mode=False, diff=False):
        ansible_warnings._global_warnings.clear()
        return run_module("numa_kernel", args, check_mode=check_mode, diff=diff)

    yield call
    ansible_warnings._global_warnings.clear()


@pytest.fixture
def systemctl(fake_systemctl):
    """A fake systemctl first in PATH; returns the log file of its calls (absent: never run)."""
    return fake_systemctl(FAKE_SYSTEMCTL)


def args(tree: Path, **extra) -> dict:
    base = {
        **ALL,
        "sysfs_root": str(tree / "sys"),
        "procfs_root": str(tree / "proc"),
        "root": str(tree / "root"),
        "service_manager": "none",
    }
    base.update(extra)
    return base


def calls(log: Path) -> list:
    return log.read_text().splitlines() if log.exists() else []


def warning_texts(result) -> list:
    return [str(w) for w in result.get("warnings", [])]


def test_check_mode_writes_nothing_and_predicts_the_change(run, tree, systemctl):
    before = tree_hash(tree)
    result = run(args(tree), check_mode=True, diff=True)
    assert result["failed"] is False and result["changed"] is True
    assert tree_hash(tree) == before
    assert not systemctl.exists()
    changed = {s["name"]: (s["before"], s["after"]) for s in result["settings"] if s["changed"]}
    assert changed == {
        "numa_balancing": (1, 0),
        "thp_enabled": ("always", "madvise"),
        "numad": ("present", "masked"),
        "irqbalance_banned_cpus": (None, "0"),
    }
    assert result["files"] == [
        {"path": "/etc/sysctl.d/60-numafleet-numa.conf", "state": "create"},
        {"path": "/etc/tmpfiles.d/numafleet-thp.conf", "state": "create"},
        {"path": "/etc/systemd/system/numad.service", "state": "create"},
        {"path": "/etc/default/irqbalance", "state": "update"},
    ]
    assert result["would_run"] == [
        "systemctl disable --now numad.service",
        "systemctl mask numad.service",
        "systemctl try-restart irqbalance.service",
    ]
    assert result["ran"] == []
    diff = result["diff"]
    assert diff[0]["before_header"] == "kernel settings"
    assert "numa_balancing: 0" in diff[0]["after"] and "numad: masked" in diff[0]["after"]
    assert [d["after_header"] for d in diff[1:]] == [f["path"] for f in result["files"]]
    assert diff[3]["after"] == "symlink -> /dev/null\n"
    assert diff[4]["after"].endswith('IRQBALANCE_ARGS="-j"\nIRQBALANCE_BANNED_CPULIST=0\n')


def test_apply_then_again_is_unchanged(run, tree, systemctl):
    options = args(tree, irq_affinity=[{"irq": 40, "cpus": "2-3"}])
    check = run(options, check_mode=True)
    applied = run(options)
    assert applied["changed"] is True and applied["failed"] is False
    assert applied["settings"] == check["settings"] and applied["files"] == check["files"]
    assert (tree / "proc/sys/kernel/numa_balancing").read_text() == "0\n"
    assert (tree / "proc/irq/40/smp_affinity_list").read_text() == "2-3\n"
    assert "[madvise]" in (tree / "sys/kernel/mm/transparent_hugepage/enabled").read_text()
    assert os.readlink(tree / "root/etc/systemd/system/numad.service") == "/dev/null"
    irqbalance = (tree / "root/etc/default/irqbalance").read_text()
    assert (
        irqbalance
        == '#IRQBALANCE_BANNED_CPULIST=\nIRQBALANCE_ARGS="-j"\nIRQBALANCE_BANNED_CPULIST=0\n'
    )
    assert applied["ran"] == [] and not systemctl.exists()  # render mode runs nothing
    before = tree_hash(tree)
    again = run(options, diff=True)
    assert again["changed"] is False and again["would_run"] == [] and again["diff"] == []
    assert {f["state"] for f in again["files"]} == {"unchanged"}
    assert not any(s["changed"] for s in again["settings"])
    assert tree_hash(tree) == before


def test_systemd_mode_runs_and_reports_systemctl(run, tree, systemctl):
    result = run(args(tree, service_manager="systemd"))
    assert (
        result["ran"]
        == result["would_run"]
        == [
            "systemctl disable --now numad.service",
            "systemctl mask numad.service",
            "systemctl try-restart irqbalance.service",
        ]
    )
    numad = next(s for s in result["settings"] if s["name"] == "numad")
    assert numad["before"] == "enabled, active"
    assert calls(systemctl) == [
        "is-enabled numad.service",
        "is-active numad.service",
        "is-enabled irqbalance.service",
        "is-active irqbalance.service",
        "disable --now numad.service",
        "mask numad.service",
        "try-restart irqbalance.service",
    ]
    # systemctl mask (faked here) makes the link, not the module
    assert not os.path.lexists(tree / "root/etc/systemd/system/numad.service")


def test_systemd_check_mode_only_asks(run, tree, systemctl):
    result = run(args(tree, service_manager="systemd"), check_mode=True)
    assert result["ran"] == [] and len(result["would_run"]) == 3
    assert calls(systemctl) == [
        "is-enabled numad.service",
        "is-active numad.service",
        "is-enabled irqbalance.service",
        "is-active irqbalance.service",
    ]


def test_stopped_or_missing_irqbalance_is_not_restarted(run, tree, systemctl, monkeypatch):
    """systemctl is-active says inactive for a unit that is stopped or not installed."""
    monkeypatch.setenv("FAKE_ACTIVE", "inactive")
    result = run(args(tree, service_manager="systemd", numad="leave"))
    assert result["changed"] is True and result["would_run"] == [] and result["ran"] == []
    assert "IRQBALANCE_BANNED_CPULIST=0" in (tree / "root/etc/default/irqbalance").read_text()
    assert not any(line.startswith("try-restart") for line in calls(systemctl))


def test_masked_numad_still_running_is_stopped(run, tree, systemctl, monkeypatch):
    (tree / "root/etc/systemd/system").mkdir(parents=True)
    (tree / "root/etc/systemd/system/numad.service").symlink_to("/dev/null")
    monkeypatch.setenv("FAKE_ENABLED", "masked")
    result = run(args(tree, service_manager="systemd"))
    assert result["ran"][0] == "systemctl stop numad.service"
    monkeypatch.setenv("FAKE_ACTIVE", "inactive")
    result = run(args(tree, service_manager="systemd"))
    assert "systemctl stop numad.service" not in result["would_run"]


def test_failed_systemctl_fails_with_its_message(run, tree, systemctl, monkeypatch):
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "Unit numad.service is locked")
    result = run(args(tree, service_manager="systemd"))
    assert result["failed"] is True
    assert "systemctl disable --now numad.service failed (rc 1)" in result["msg"]
    assert "Unit numad.service is locked" in result["msg"] and result["ran"] == []


def test_running_irqbalance_with_pinned_irqs_warns(run, tree, systemctl):
    options = args(tree, service_manager="systemd", irq_affinity=[{"irq": 40, "cpus": "1"}])
    result = run(options, check_mode=True)
    assert any("irqbalance is running" in w for w in warning_texts(result))
    assert "is-active irqbalance.service" in calls(systemctl)


def test_absent_knob_warns_and_asking_it_on_fails(run, tree):
    (tree / "proc/sys/kernel/numa_balancing").unlink()
    result = run(args(tree))
    assert result["failed"] is False
    assert any("has no automatic NUMA balancing" in w for w in warning_texts(result))
    sysctl = (tree / "root/etc/sysctl.d/60-numafleet-numa.conf").read_text()
    assert "numa_balancing" not in sysctl and "vm.zone_reclaim_mode = 0" in sysctl
    failed = run(args(tree, numa_balancing=1))
    assert failed["failed"] is True
    assert "numa_balancing=1" in failed["msg"] and "CONFIG_NUMA_BALANCING" in failed["msg"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"zone_reclaim_mode": 9}, "zone_reclaim_mode is 9, outside 0-7"),
        ({"numa_balancing": 2}, "numa_balancing is 2, outside 0-1; use 0 (off) or 1 (on)"),
        ({"thp_defrag": "defer+never"}, "thp_defrag is 'defer+never'; use one of always, defer"),
        ({"numad": "off"}, "numad is 'off'; use one of masked, leave, or null"),
        ({"irqbalance_banned_cpus": "0-3"}, "bans every online CPU"),
        ({"irqbalance_banned_cpus": "7"}, "names CPUs 7, which are not present"),
        ({"irq_affinity": [{"irq": 41, "cpus": "0"}]}, "IRQ 41 has no"),
        ({"irq_affinity": [{"irq": 40, "cpus": "9"}]}, "not online"),
        ({"irq_affinity": [{"cpus": "0"}]}, "needs exactly one of irq"),
        ({"sysfs_root": "/nonexistent/sys"}, "Point sysfs_root at the host's /sys"),
    ],
)
def test_bad_input_fails_before_any_write(run, tree, extra, fragment):
    before = tree_hash(tree)
    result = run(args(tree, **extra))
    assert result["failed"] is True
    assert fragment in result["msg"]
    assert "Traceback" not in result["msg"] and "exception" not in result
    assert tree_hash(tree) == before


def test_deprecated_mask_line_fails_and_keeps_the_file(run, tree):
    default = tree / "root/etc/default/irqbalance"
    default.write_text("IRQBALANCE_BANNED_CPUS=3\n")
    before = tree_hash(tree)
    result = run(args(tree))
    assert result["failed"] is True and "IRQBALANCE_BANNED_CPUS=3" in result["msg"]
    assert tree_hash(tree) == before


@pytest.mark.parametrize("explicit_nulls", [False, True])
def test_nothing_asked_changes_nothing(run, tree, explicit_nulls):
    """Omitted or null (what the role passes for leave): nothing is read, written or run."""
    before = tree_hash(tree)
    options = {
        "sysfs_root": str(tree / "sys"),
        "procfs_root": str(tree / "proc"),
        "root": str(tree / "root"),
        "service_manager": "none",
    }
    if explicit_nulls:
        options.update(dict.fromkeys(ALL))
    result = run(options)
    assert result["failed"] is False, result.get("msg")
    assert result["changed"] is False and result["settings"] == [] and result["files"] == []
    assert tree_hash(tree) == before


# --- issue 19: no links, modes independent of the umask ------------------------------------------


@pytest.mark.parametrize("level", ["etc", "etc/sysctl.d"])
def test_a_linked_directory_is_refused_and_nothing_lands_there(run, tree, tmp_path, level):
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tree / "root" / level
    if link.is_dir() and not link.is_symlink():
        import shutil

        shutil.rmtree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    result = run(args(tree))
    assert result["failed"] is True
    assert str(link) in result["msg"] and "symbolic link" in result["msg"]
    assert list(outside.rglob("*")) == []


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_files_and_directories_get_their_modes_under_any_umask(run, tree, mask):
    old = os.umask(mask)
    try:
        result = run(args(tree))
    finally:
        os.umask(old)
    assert result["failed"] is False, result.get("msg")
    sysctl = tree / "root/etc/sysctl.d/60-numafleet-numa.conf"
    assert sysctl.stat().st_mode & 0o777 == 0o644
    assert sysctl.parent.stat().st_mode & 0o777 == 0o755
