"""Effective unit state on the real guest: a `systemctl edit`-style override.conf and a
`systemctl set-property` file on a pinned unit are drift (drift_check.yml, pinned_services, the
files named) and fail verify's binding checks; removing them (and `systemctl revert`) makes the
guest clean again. The real `systemctl show` output is kept in the figures."""

import json
from pathlib import Path

import pytest
from vm_helpers import HOST, checks, record, run_playbook, run_verify, unit, wait_until_touched

testinfra_hosts = ["numa-vm"]
NAME = "cpu-only"  # pinned to CPU 1, node 0: restarts quickly whatever its binding
UNIT = unit(NAME)
OVERRIDE = f"/etc/systemd/system/{UNIT}.d/override.conf"
# What `systemctl edit` writes when the operator resets the affinity and the memory policy.
OVERRIDE_TEXT = "[Service]\nCPUAffinity=\nNUMAPolicy=default\n"
SET_PROPERTY = f"/etc/systemd/system.control/{UNIT}.d/50-AllowedMemoryNodes.conf"
SHOW = "Id,LoadState,CPUAffinity,NUMAPolicy,NUMAMask,AllowedCPUs,AllowedMemoryNodes,Environment,Slice,DropInPaths,FragmentPath"


def run_drift(report_dir: Path) -> tuple:
    # The playbook writes the report itself; NUMAFLEET_DRIFT_REPORT_DIR names the drift directory.
    env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(report_dir)}
    proc, output, seconds = run_playbook("drift_check.yml", env=env)
    report_file = report_dir / "latest" / "drift.json"
    assert report_file.exists(), f"no drift report (exit {proc.returncode}):\n{output[-4000:]}"
    return proc.returncode, json.loads(report_file.read_text()), output


def _restart(host) -> int:
    host.check_output("systemctl daemon-reload")
    host.check_output(f"systemctl restart {UNIT}")
    return wait_until_touched(host, NAME)


@pytest.fixture(scope="module")
def overridden(host):
    """cpu-only with an override.conf (as systemctl edit writes it) and a set-property file."""
    host.check_output(f"mkdir -p /etc/systemd/system/{UNIT}.d")
    host.check_output(f"printf '%s' '{OVERRIDE_TEXT}' > {OVERRIDE}")
    host.check_output(f"systemctl set-property {UNIT} AllowedMemoryNodes=0-1")
    _restart(host)
    shown = host.check_output(f"systemctl show -p {SHOW} {UNIT}")
    record("effective_systemctl_show_overridden", shown)
    yield shown
    host.check_output(f"rm -f {OVERRIDE}")
    host.check_output(f"systemctl revert {UNIT}")
    _restart(host)
    assert not host.file(SET_PROPERTY).exists


def test_systemctl_show_reports_the_override(overridden):
    fields = dict(line.split("=", 1) for line in overridden.splitlines() if "=" in line)
    assert fields["NUMAPolicy"] == "default", overridden
    assert fields["CPUAffinity"] == "", overridden
    assert OVERRIDE in fields["DropInPaths"] and SET_PROPERTY in fields["DropInPaths"]


def test_drift_check_reports_the_override_on_the_host(host, overridden, tmp_path):
    rc, report, output = run_drift(tmp_path / "drift")
    assert rc != 0, output[-4000:]
    guest = report["hosts"][HOST]
    assert guest["status"] in ("drift", "fail"), guest
    drift = [entry for entry in guest["drift"] if entry["role"] == "pinned_services"]
    assert drift, guest["drift"]
    text = json.dumps(drift)
    assert OVERRIDE in text and SET_PROPERTY in text, text
    assert "NUMAPolicy: planned bind, effective default" in text
    record("effective_drift_changes", [c for entry in drift for c in entry["changes"]])


def test_verify_fails_the_binding_checks(overridden, tmp_path):
    rc, report, output = run_verify(tmp_path)
    assert rc != 0, output[-4000:]
    found = checks(report, NAME)
    assert found["effective_units"]["status"] == "fail", found["effective_units"]
    assert OVERRIDE in found["effective_units"]["message"]
    assert found["cpus_binding"]["status"] == "fail", found["cpus_binding"]
    assert found["mems_binding"]["status"] == "fail", found["mems_binding"]
    assert (
        SET_PROPERTY in found["mems_binding"]["message"]
        or OVERRIDE in found["mems_binding"]["message"]
    )


def test_clean_again_after_removing_them(overridden, host, tmp_path):
    # runs last in this file (pytest keeps file order); the fixture is torn down at module end,
    # so undo here explicitly and check.
    host.check_output(f"rm -f {OVERRIDE}")
    host.check_output(f"systemctl revert {UNIT}")
    _restart(host)
    assert not host.file(SET_PROPERTY).exists and not host.file(OVERRIDE).exists
    rc, report, output = run_drift(tmp_path / "clean")
    assert rc == 0, output[-4000:]
    assert report["hosts"][HOST]["status"] == "clean", report["hosts"][HOST]
    rc, verified, output = run_verify(tmp_path / "verify")
    assert rc == 0, output[-4000:]
    assert checks(verified, NAME)["effective_units"]["status"] == "pass"
