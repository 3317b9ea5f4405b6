"""Effective unit state on a scratch demo fleet (render mode): foreign settings that win over ours.

site.yml renders the fleet; then three hosts get a file numafleet did not write that changes a
planned property of one of their services, each in another place systemd reads:

* gpu-a100-01: ``numafleet-embed.service.d/override.conf`` in /etc (what ``systemctl edit``
  writes) resetting CPUAffinity= and setting NUMAPolicy=default;
* qemu-2node-01: a runtime drop-in in /run/systemd/system resetting NUMAMask=;
* epyc-nps4-01: a ``systemctl set-property`` file in /etc/systemd/system.control
  (``50-AllowedCPUs.conf``);
* gpu-h100-01: a drop-in with ``EnvironmentFile=/etc/default/numafleet-site`` whose file changes
  a planned environment variable (EnvironmentFile= values win over Environment=);
* arm-kunpeng-01: ``systemctl set-property numafleet-batch.slice MemoryMax=infinity`` lifting
  the tenant's memory limit.

drift_check.yml (limited to those hosts and one untouched control host) reports drift of
pinned_services on exactly those hosts, naming the file; verify.yml fails their
``effective_units`` check naming the file; the control host stays clean.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from system_helpers import REPO, Run, ansible_playbook, tree_digest

DRIFT = REPO / "playbooks" / "drift_check.yml"
VERIFY = REPO / "playbooks" / "verify.yml"
ETC = "/etc/systemd/system"
OVERRIDES = {
    "gpu-a100-01": (
        "numafleet-embed.service",
        f"{ETC}/numafleet-embed.service.d/override.conf",
        "[Service]\nCPUAffinity=\nNUMAPolicy=default\n",
        "NUMAPolicy",
    ),
    "qemu-2node-01": (
        None,  # the host's first placement service
        "/run/systemd/system/{unit}.d/90-runtime.conf",
        "[Service]\nNUMAMask=\n",
        "NUMAMask",
    ),
    "epyc-nps4-01": (
        None,
        "/etc/systemd/system.control/{unit}.d/50-AllowedCPUs.conf",
        '# This is a drop-in unit file extension, created via "systemctl set-property"\n'
        "# or an equivalent operation. Do not edit.\n[Service]\nAllowedCPUs=0-1\n",
        "AllowedCPUs",
    ),
    "gpu-h100-01": (
        None,
        f"{ETC}/{{unit}}.d/60-env.conf",
        "[Service]\nEnvironmentFile=/etc/default/numafleet-site\n",
        "Environment",  # the first variable the unit plans
    ),
    "arm-kunpeng-01": (
        "numafleet-batch.slice",
        "/etc/systemd/system.control/{unit}.d/50-MemoryMax.conf",
        "[Slice]\nMemoryMax=infinity\n",
        "MemoryMax",
    ),
}
CONTROL = "gh200-01"


@dataclass
class Fleet:
    base: Path
    paths: dict  # host -> (unit, path of the foreign file, property it changes)
    site: Run
    drift: Run
    verify: Run
    report: dict
    verified: dict
    before: dict
    after: dict
    applied: Run
    reviewed: Run


def first_service(root: Path, needs: str = "CPUAffinity=") -> str:
    names = sorted(
        p.name
        for p in (root / ETC.lstrip("/")).glob("numafleet-*.service")
        if "CPUAffinity=" in p.read_text()  # a placement, not numafleet-hugepages.service
        and needs in p.read_text()
    )
    assert names, root
    return names[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    import trees

    base = tmp_path_factory.mktemp("effective")
    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    trees.materialize_demo(base / ".demo")
    site = ansible_playbook(REPO / "site.yml", inventory)
    paths = {}
    for host, (unit, path, text, prop) in OVERRIDES.items():
        root = base / ".demo" / host / "root"
        unit = unit or first_service(root, "\nEnvironment=" if prop == "Environment" else "")
        path = path.format(unit=unit)
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if prop == "Environment":
            unit_text = (root / ETC.lstrip("/") / unit).read_text()
            name = unit_text.split("\nEnvironment=", 1)[1].strip('"').split("=", 1)[0]
            prop = f"Environment.{name}"
            env = root / "etc/default/numafleet-site"
            env.parent.mkdir(parents=True, exist_ok=True)
            env.write_text(f"# not numafleet's\n{name}='changed by the site'\n")
        paths[host] = (unit, path, prop)
    hosts = sorted([*OVERRIDES, CONTROL])
    before = {host: tree_digest(base / ".demo" / host) for host in hosts}
    env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(base / "reports-drift")}
    drift = ansible_playbook(DRIFT, inventory, "--limit", ",".join(hosts), env=env)
    verify = ansible_playbook(
        VERIFY,
        inventory,
        "--limit",
        ",".join(hosts),
        "-e",
        f"numafleet_report_dir={base / 'reports-verify'}",
    )
    after = {host: tree_digest(base / ".demo" / host) for host in hosts}
    # site.yml --check --diff (the review) warns about it as the real run does.
    reviewed = ansible_playbook(
        REPO / "site.yml", inventory, "--limit", "gpu-a100-01", "--check", "--diff"
    )
    # site.yml on one host: it cannot fix the override (not its file), so it warns and keeps it.
    applied = ansible_playbook(REPO / "site.yml", inventory, "--limit", "gpu-a100-01")
    latest = base / "reports-drift" / "latest" / "drift.json"
    report = json.loads(latest.read_text()) if latest.exists() else {}
    verify_file = base / "reports-verify" / "verify.json"
    verified = json.loads(verify_file.read_text()) if verify_file.exists() else {}
    return Fleet(
        base, paths, site, drift, verify, report, verified, before, after, applied, reviewed
    )


def test_site_rendered_the_fleet(fleet):
    assert fleet.site.rc == 0, fleet.site.explain()


def test_drift_check_fails_the_run_and_writes_nothing(fleet):
    assert fleet.drift.rc == 2, fleet.drift.explain()
    assert fleet.report, fleet.drift.explain()
    assert fleet.after == fleet.before


@pytest.mark.parametrize("host", sorted(OVERRIDES))
def test_foreign_setting_is_drift_of_pinned_services_on_its_host(fleet, host):
    unit, path, prop = fleet.paths[host]
    entry = fleet.report["hosts"][host]
    assert entry["status"] == "drift", entry["summary"]
    drift = [d for d in entry["drift"] if d["role"] == "pinned_services"]
    assert drift, entry["drift"]
    changes = [c for d in drift for c in d["changes"] if c["state"] == "foreign"]
    assert changes, drift
    assert {c["path_or_header"] for c in changes} == {path}
    assert any(s.startswith(f"{unit} {prop}: planned ") for c in changes for s in c["settings"])
    assert entry["layers"]["pinned_services"]["changed"] == 1
    line = fleet.drift.one(host, "Print the drift summary")["msg"]
    assert "drift in pinned_services" in line, line


def test_override_file_is_named_by_the_failed_verify_check(fleet):
    assert fleet.verify.rc != 0, fleet.verify.explain()
    for host in OVERRIDES:
        unit, path, dummy = fleet.paths[host]
        checks = fleet.verified["hosts"][host]["checks"]
        failed = [c for c in checks if c["check"] == "effective_units" and c["status"] == "fail"]
        assert len(failed) == 1, (host, failed)
        assert path in failed[0]["message"] and unit in failed[0]["message"], failed[0]
        assert fleet.verified["hosts"][host]["status"] == "fail"
    none_failed = [c for c in fleet.verified["hosts"][CONTROL]["checks"] if c["status"] == "fail"]
    assert none_failed == []


def test_control_host_stays_clean(fleet):
    entry = fleet.report["hosts"][CONTROL]
    assert entry["status"] == "clean" and entry["drift"] == [], entry["summary"]
    checks = [c for c in entry["checks"] if c["check"] == "effective_units"]
    assert checks and all(c["status"] == "pass" for c in checks)


def test_site_warns_about_the_override_and_keeps_it(fleet):
    run = fleet.applied
    assert run.rc == 0, run.explain()
    unit, path, dummy = fleet.paths["gpu-a100-01"]
    text = " ".join((run.stdout + run.stderr).split())
    assert f"host gpu-a100-01: {unit}: NUMAPolicy is default, planned bind, set by {path}" in text
    assert "which numafleet did not write and does not remove" in text
    assert (fleet.base / ".demo" / "gpu-a100-01" / "root" / path.lstrip("/")).exists()


def test_check_mode_review_warns_about_the_override_too(fleet):
    run = fleet.reviewed
    assert run.rc == 0, run.explain()
    unit, path, dummy = fleet.paths["gpu-a100-01"]
    text = " ".join((run.stdout + run.stderr).split())
    assert f"host gpu-a100-01: {unit}: NUMAPolicy is default, planned bind, set by {path}" in text


def test_environment_file_is_named_with_its_dropin(fleet):
    unit, path, prop = fleet.paths["gpu-h100-01"]
    changes = [
        c
        for d in fleet.report["hosts"]["gpu-h100-01"]["drift"]
        for c in d["changes"]
        if c["state"] == "foreign"
    ]
    (setting,) = [s for c in changes for s in c["settings"]]
    assert setting.startswith(f"{unit} {prop}: planned ")
    assert setting.endswith(
        "effective changed by the site (EnvironmentFile=/etc/default/numafleet-site)"
    )
