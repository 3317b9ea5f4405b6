"""playbooks/drift_check.yml on the real 2-node guest: clean after site.yml; a change made by hand
on the guest is reported with its host, role and setting, and the drift run changes nothing."""

import json
from pathlib import Path

from vm_helpers import HOST, record, run_playbook

testinfra_hosts = ["numa-vm"]


def run_drift(report_dir: Path) -> tuple:
    """Run the drift playbook against the guest; (exit status, drift.json, output). The playbook
    writes the report itself (no callback); numafleet_report_dir puts it in <report_dir>/drift."""
    proc, output, seconds = run_playbook(
        "drift_check.yml", "-e", f"numafleet_report_dir={report_dir}"
    )
    report_dir = report_dir / "drift"
    report_file = report_dir / "latest" / "drift.json"
    assert report_file.exists(), f"no drift report (exit {proc.returncode}):\n{output[-4000:]}"
    report = json.loads(report_file.read_text())
    report["_elapsed_s"] = seconds
    return proc.returncode, report, output


def state_digest(host) -> str:
    """What site.yml manages on the guest: unit files, numafleet state, the NUMA knobs."""
    return host.check_output(
        "{ cat /etc/systemd/system/numafleet-* /etc/numafleet/*.json; "
        "sysctl -n kernel.numa_balancing vm.zone_reclaim_mode; "
        "cat /sys/devices/system/node/node*/hugepages/hugepages-2048kB/nr_hugepages; } | sha256sum"
    )


def test_guest_after_site_yml_has_no_drift(host, tmp_path):
    before = state_digest(host)
    rc, report, output = run_drift(tmp_path / "clean")
    assert rc == 0, output[-4000:]
    guest = report["hosts"][HOST]
    assert guest["status"] == "clean" and guest["drift"] == [], guest
    assert report["totals"]["drift"] == 0
    assert state_digest(host) == before
    record("drift_clean_s", report["_elapsed_s"])


def test_hand_made_change_on_the_guest_is_reported(host, tmp_path):
    assert host.check_output("sysctl -n kernel.numa_balancing") == "0"
    host.run_expect([0], "sysctl -w kernel.numa_balancing=1")
    try:
        before = state_digest(host)
        rc, report, output = run_drift(tmp_path / "drift")
        assert state_digest(host) == before  # the drift run changes nothing
    finally:
        host.run_expect([0], "sysctl -w kernel.numa_balancing=0")
    assert rc != 0, output[-4000:]
    guest = report["hosts"][HOST]
    assert guest["status"] == "drift", guest
    assert {entry["role"] for entry in guest["drift"]} == {"numa_kernel"}, guest["drift"]
    assert "numa_balancing" in json.dumps(guest["drift"]), guest["drift"]
    metrics = (tmp_path / "drift" / "drift" / "latest" / "drift.prom").read_text()
    assert f'numafleet_host_drift{{host="{HOST}"}} 1' in metrics
    record("drift_detected_s", report["_elapsed_s"])
