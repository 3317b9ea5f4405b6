"""The allowed cpuset on the real guest (cgroup v2, systemd): numa_facts reads the real cpuset
files, PID 1's affinity and the kernel release; when numafleet.slice is narrowed under running
placements (`systemctl set-property --runtime numafleet.slice AllowedCPUs=`), the kernel narrows
their affinity at once, the facts name the slice's file, and a plan that no longer fits is
refused before the gate with the allowed sets named (verify fails too). Undoing it makes verify
pass again."""

import json
import re

import pytest
from vm_helpers import (
    EXPECTED,
    checks,
    main_pid,
    record,
    run_ansible,
    run_playbook,
    run_verify,
    status_field,
)

testinfra_hosts = ["numa-vm"]
SLICE_FILE = "/sys/fs/cgroup/numafleet.slice/cpuset.cpus.effective"
NAME = "numa-bound"  # CPUs 2-3 on node 1
NARROWED = "0-2"  # takes CPU 3 away from numa-bound


def guest_facts() -> dict:
    """ansible_facts.numa of the guest, from an ad-hoc numa_facts run."""
    result = run_ansible("-m", "numafleet.tuning.numa_facts")
    # molecule forces colour (ANSIBLE_FORCE_COLOR) whatever ANSIBLE_NOCOLOR says
    plain = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    dummy, arrow, rest = plain.partition("=> ")
    assert result.returncode == 0 and arrow, result.stdout[-4000:] + result.stderr[-2000:]
    return json.loads(rest)["ansible_facts"]["numa"]


def status_list(host, field: str) -> list:
    """The cpulist ``field`` of the guest's /proc/1/status, as a list of ints."""
    for line in host.file("/proc/1/status").content_string.splitlines():
        if line.startswith(field + ":"):
            ids = []
            for part in line.split(":", 1)[1].strip().split(","):
                first, dummy, last = part.partition("-")
                ids.extend(range(int(first), int(last or first) + 1))
            return ids
    raise AssertionError(f"/proc/1/status has no {field}")


def test_facts_report_the_guest_cpuset_pid1_and_kernel(host):
    numa = guest_facts()
    allowed = numa["allowed"]
    record("allowed_facts_clean", allowed)
    assert allowed["narrowed"] is False, allowed
    assert allowed["cpus"] == numa["cpus"]["online"], allowed
    assert allowed["mems"] == [0, 1], allowed
    sources = {entry["source"]: entry for entry in allowed["sources"]}
    assert sources["cgroup2_root"]["path"] == "/sys/fs/cgroup/cpuset.cpus.effective", sources
    assert sources["cgroup2_slice"]["path"] == SLICE_FILE, sources
    assert numa["kernel"]["osrelease"] == host.check_output("uname -r").strip()
    assert numa["pid1"]["cpus_allowed"] == status_list(host, "Cpus_allowed_list"), numa["pid1"]
    assert numa["pid1"]["mems_allowed"] == status_list(host, "Mems_allowed_list"), numa["pid1"]


@pytest.fixture
def narrowed_slice(host):
    host.check_output(f"systemctl set-property --runtime numafleet.slice AllowedCPUs={NARROWED}")
    yield host.file(SLICE_FILE).content_string.strip()
    # An empty AllowedCPUs= drops the slice's cpuset from systemd's mask without rewriting the
    # file, and revert removes only the drop-in: write the whole set back, then revert.
    host.check_output("systemctl set-property --runtime numafleet.slice AllowedCPUs=0-3")
    host.check_output("systemctl revert numafleet.slice")
    host.check_output("systemctl daemon-reload")


def test_a_narrowed_slice_is_named_and_the_plan_refused(host, narrowed_slice, tmp_path):
    assert narrowed_slice == NARROWED
    # The kernel narrowed the running service at once: CPU 3 is gone from its affinity.
    assert status_field(host, main_pid(host, NAME), "Cpus_allowed_list") == "2"
    numa = guest_facts()
    allowed = numa["allowed"]
    record("allowed_facts_narrowed", allowed)
    assert allowed["narrowed"] is True and allowed["cpus"] == [0, 1, 2], allowed
    applied = [s for s in allowed["sources"] if s["source"] == "cgroup2_slice"]
    assert applied and applied[0]["cpus"] == [0, 1, 2], allowed["sources"]

    # numa-bound no longer fits on node 1 (one allowed CPU left): the plan is refused before the
    # gate, naming the allowed sets and the slice's file; verify cannot pass either.
    proc, output, seconds = run_playbook("../site.yml", "--check", "--diff")
    assert proc.returncode != 0, output[-4000:]
    assert "allowed" in output and SLICE_FILE in output and NAME in output, output[-4000:]
    record("allowed_site_refusal_s", seconds)
    rc, report, output = run_verify(tmp_path / "verify")
    assert rc != 0, output[-4000:]
    assert SLICE_FILE in output or SLICE_FILE in json.dumps(report), output[-4000:]


def test_verify_passes_again_after_revert(host, tmp_path):
    assert host.file(SLICE_FILE).content_string.strip() == "0-3"
    assert status_field(host, main_pid(host, NAME), "Cpus_allowed_list") == EXPECTED[NAME]["cpus"]
    rc, report, output = run_verify(tmp_path / "verify")
    assert rc == 0, output[-4000:]
    assert checks(report, NAME)["cpus_binding"]["status"] == "pass"
