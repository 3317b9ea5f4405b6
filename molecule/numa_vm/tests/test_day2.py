"""Day 2 on the real 2-node guest: changing one placement (its command line) restarts only that
service (the other keeps its main PID), the change plan says so before anything changes,
verify.yml still passes, and a plan that would remove every service is refused with nothing
changed."""

import json

from vm_helpers import HOST, main_pid, placements, record, run_playbook, site, wait_until_touched

testinfra_hosts = ["numa-vm"]


def test_changing_one_placement_restarts_only_it(host, tmp_path):
    wanted = placements()
    bound, cpu_only = wait_until_touched(host, "numa-bound"), wait_until_touched(host, "cpu-only")
    edited = json.loads(json.dumps(wanted))
    changed = next(p for p in edited if p["name"] == "cpu-only")
    changed["exec"] = changed["exec"].replace("--anon-mib 64", "--anon-mib 96")
    try:
        proc, output, seconds = site(tmp_path, "edited", edited)
        assert proc.returncode == 0, output[-4000:]
        assert "change plan: 0 added, 0 moved, 0 removed, 2 kept" in output, output[-4000:]
        assert "restart: numafleet-cpu-only.service" in output
        assert (
            "numafleet-numa-bound.service"
            not in output.split("TASK [Show the change plan]")[1].split("TASK")[0]
        )
        assert main_pid(host, "numa-bound") == bound  # not restarted
        assert wait_until_touched(host, "cpu-only") != cpu_only  # restarted
        record("day2_edit_one_placement_s", seconds)
        proc, output, dummy = run_playbook(
            "verify.yml",
            "-e",
            f"@{tmp_path / 'edited.json'}",
            "-e",
            f"numafleet_report_dir={tmp_path}",
        )
        assert proc.returncode == 0, output[-4000:]
        assert json.loads((tmp_path / "verify.json").read_text())["hosts"][HOST]["status"] == "pass"
    finally:
        proc, output, dummy = run_playbook("../site.yml")  # back to the scenario's placements
        assert proc.returncode == 0, output[-4000:]
    assert main_pid(host, "numa-bound") == bound  # still not restarted


def test_a_plan_without_placements_is_refused_and_changes_nothing(host, tmp_path):
    before = {name: main_pid(host, name) for name in ("numa-bound", "cpu-only")}
    units = host.check_output("ls /etc/systemd/system/ | grep numafleet- | sha256sum")
    proc, output, dummy = site(tmp_path, "empty", [])
    assert proc.returncode != 0
    assert "would remove every unit numafleet manages here" in output, output[-4000:]
    assert {name: main_pid(host, name) for name in before} == before
    assert host.check_output("ls /etc/systemd/system/ | grep numafleet- | sha256sum") == units
