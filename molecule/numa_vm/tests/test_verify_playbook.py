"""playbooks/verify.yml on the guest: passes on the pinned fleet, fails on an unpinned control."""

import pytest
from vm_helpers import checks, record, run_verify, unit, wait_until_touched

testinfra_hosts = ["numa-vm"]
DROP_IN_DIR = f"/run/systemd/system/{unit('numa-bound')}.d"
# The same workload, started unpinned: every binding reset and memory interleaved over all nodes.
# No hugepages: interleaving them would need pages on node 0, whose pool is empty.
CONTROL = """[Service]
CPUAffinity=
NUMAPolicy=default
NUMAMask=
AllowedCPUs=
AllowedMemoryNodes=
ExecStart=
ExecStart=/usr/bin/numactl --interleave=all /usr/bin/python3 /usr/local/libexec/numafleet-touch --anon-mib 256
"""


def _restart(host):
    host.check_output("systemctl daemon-reload")
    host.check_output(f"systemctl restart {unit('numa-bound')}")
    return wait_until_touched(host, "numa-bound")


@pytest.fixture
def unpinned_control(host):
    """numa-bound restarted unpinned under numactl --interleave=all (a runtime drop-in), then restored."""
    host.check_output(f"mkdir -p {DROP_IN_DIR}")
    host.check_output(f"printf '%s' '{CONTROL}' > {DROP_IN_DIR}/99-unpinned-control.conf")
    yield _restart(host)
    host.check_output(f"rm -rf {DROP_IN_DIR}")
    _restart(host)


def test_verify_passes_on_the_pinned_guest(tmp_path):
    rc, report, output = run_verify(tmp_path)
    assert rc == 0, output[-4000:]
    assert report["hosts"]["numa-vm"]["status"] == "pass"
    bound = checks(report, "numa-bound")
    assert bound["offnode_share"]["status"] == "pass"
    assert bound["offnode_share"]["measured"] <= 2
    record(
        "pinned_offnode_share_pct",
        {n: checks(report, n)["offnode_share"]["measured"] for n in ("numa-bound", "cpu-only")},
    )
    record("verify_playbook_s", report["_elapsed_s"])


def test_verify_fails_on_the_unpinned_control(host, unpinned_control, tmp_path):
    pid = unpinned_control
    assert host.file(f"/proc/{pid}/status").contains("Mems_allowed_list:\t0-1")
    rc, report, output = run_verify(tmp_path)
    assert rc != 0, "verify.yml passed on an unpinned, interleaved service"
    bound = checks(report, "numa-bound")
    share = bound["offnode_share"]
    assert share["status"] == "fail"
    assert share["measured"] >= 20, share
    assert bound["cpus_binding"]["status"] == "fail"
    assert bound["mems_binding"]["status"] == "fail"
    assert report["hosts"]["numa-vm"]["status"] == "fail"
    assert "offnode_share numa-bound" in output
    record("control_offnode_share_pct", share["measured"])


def test_verify_passes_again_after_the_control(tmp_path):
    rc, report, output = run_verify(tmp_path)
    assert rc == 0, output[-4000:]
    assert checks(report, "numa-bound")["offnode_share"]["measured"] <= 2
