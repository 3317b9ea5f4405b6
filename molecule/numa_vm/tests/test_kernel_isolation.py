"""Kernel CPU isolation on the real guest: the command line is shown, written and owed.

The guest boots its kernel directly (QEMU -kernel, no GRUB), so the drop-in is reviewed in check
mode with numafleet_hugepages_bootloader grub_d (nothing runs, nothing is written), and applied
with bootloader none (the arguments are recorded and reported, no bootloader is touched). The
guest's real /proc/cmdline lacks them: every run after that keeps reboot_required (pending)
until the isolation is turned off again, which the test does last. The guest is not rebooted.
"""

import json
import re

from vm_helpers import run_ansible, run_playbook

testinfra_hosts = ["numa-vm"]

GRUB = "/etc/default/grub.d/60-numafleet-hugepages.cfg"
STATE = "/etc/numafleet/hugepages.json"
ARGS = "nohz_full=1-3 rcu_nocbs=1-3 irqaffinity=0"  # reserved CPU 0 (molecule.yml), CPUs 0-3


def _site(*extra: str) -> tuple:
    return run_playbook("../site.yml", "-e", "numafleet_kernel_isolation=nohz_full", *extra, "-v")


def test_the_guest_facts_read_the_running_command_line():
    proc = run_ansible(
        "-m",
        "numafleet.tuning.numa_facts",
        "-a",
        "gpu=false",
    )
    # molecule forces colour (ANSIBLE_FORCE_COLOR) whatever ANSIBLE_NOCOLOR says
    plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    dummy, arrow, rest = plain.partition("=> ")
    assert proc.returncode == 0 and arrow, proc.stdout[-4000:] + proc.stderr[-2000:]
    facts = json.loads(rest)["ansible_facts"]["numa"]["kernel"]
    assert facts["nohz_full_supported"] is True  # Debian's kernel has CONFIG_NO_HZ_FULL
    assert "root=" in facts["cmdline"] and "nohz_full=" not in facts["cmdline"]


def test_check_mode_shows_the_drop_in_and_writes_nothing(host):
    proc, output, dummy = _site("-e", "numafleet_hugepages_bootloader=grub_d", "--check", "--diff")
    assert proc.returncode == 0, output[-4000:]
    assert (
        "kernel command line: + nohz_full=1-3, + rcu_nocbs=1-3, + irqaffinity=0 (reboot required)"
    ) in output, output[-4000:]
    assert f'+GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {ARGS}"' in output, output[-4000:]
    assert not host.file(GRUB).exists


def test_apply_records_the_arguments_and_the_reboot_stays_owed(host):
    before = host.file(STATE).content_string if host.file(STATE).exists else None
    try:
        proc, output, dummy = _site("-e", "numafleet_hugepages_bootloader=none")
        assert proc.returncode == 0, output[-4000:]
        assert "the kernel command line changed (" + ARGS in output, output[-4000:]
        assert json.loads(host.file(STATE).content_string)["kernel_args"] == ARGS.split()
        assert not host.file(GRUB).exists  # bootloader none: only reported
        again, output, dummy = _site("-e", "numafleet_hugepages_bootloader=none")
        assert again.returncode == 0, output[-4000:]
        assert "reboot pending: the kernel command line numafleet wrote" in output
        assert '"reboot_pending": true' in output
        assert "no change; reboot pending" in output
    finally:
        proc, output, dummy = run_playbook("../site.yml")  # isolation off again
        assert proc.returncode == 0, output[-4000:]
    state = json.loads(host.file(STATE).content_string)
    assert state["kernel_args"] == []
    if before is not None:
        assert state == json.loads(before)
