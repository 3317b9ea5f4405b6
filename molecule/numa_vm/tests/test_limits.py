"""Resource limits on the real 2-node guest: numa-bound has memory_limit: max (MemoryMax= of its
512M budget), cpu_weight: 200 and tasks_max: 64; cpu-only has memory_limit: high (MemoryHigh= of
128M). systemd and the kernel hold those values; a process that allocates past numa-bound's limit
inside its cgroup is OOM-killed there, cpu-only keeps running untouched, and numa-bound is
running again afterwards (systemd's OOMPolicy=stop, then Restart=on-failure). Changing one
placement's limit restarts only that placement's unit, and the change plan says why."""

import json
import shlex
import time

from vm_helpers import (
    main_pid,
    placements,
    record,
    run_playbook,
    site,
    unit,
    wait_until_touched,
)

testinfra_hosts = ["numa-vm"]
MIB = 1 << 20


def show(host, name: str, prop: str) -> str:
    return host.check_output(f"systemctl show -p {prop} --value {unit(name)}")


def cgroup(host, name: str) -> str:
    """The unit's cgroup directory under /sys/fs/cgroup (systemctl show ControlGroup)."""
    path = show(host, name, "ControlGroup")
    assert path.startswith("/"), f"{unit(name)} has no control group: {path!r}"
    return f"/sys/fs/cgroup{path}"


def read(host, path: str) -> str:
    return host.check_output(f"cat {path}")


def events(host, directory: str) -> dict:
    """memory.events of a cgroup directory as {key: count}."""
    out = {}
    for line in read(host, f"{directory}/memory.events").splitlines():
        key, dummy, value = line.partition(" ")
        out[key] = int(value)
    return out


def test_systemd_and_the_kernel_hold_the_planned_limits(host):
    wait_until_touched(host, "numa-bound")
    bound, cpu_only = cgroup(host, "numa-bound"), cgroup(host, "cpu-only")
    measured = {
        "numa-bound": {
            "MemoryMax": show(host, "numa-bound", "MemoryMax"),
            "memory.max": read(host, f"{bound}/memory.max"),
            "CPUWeight": show(host, "numa-bound", "CPUWeight"),
            "cpu.weight": read(host, f"{bound}/cpu.weight"),
            "TasksMax": show(host, "numa-bound", "TasksMax"),
            "pids.max": read(host, f"{bound}/pids.max"),
            "memory.current": read(host, f"{bound}/memory.current"),
        },
        "cpu-only": {
            "MemoryHigh": show(host, "cpu-only", "MemoryHigh"),
            "memory.high": read(host, f"{cpu_only}/memory.high"),
            "memory.max": read(host, f"{cpu_only}/memory.max"),
        },
    }
    record("limits_measured", measured)
    assert measured["numa-bound"]["MemoryMax"] == str(512 * MIB)
    assert measured["numa-bound"]["memory.max"] == str(512 * MIB)
    assert (measured["numa-bound"]["CPUWeight"], measured["numa-bound"]["cpu.weight"]) == (
        "200",
        "200",
    )
    assert (measured["numa-bound"]["TasksMax"], measured["numa-bound"]["pids.max"]) == ("64", "64")
    # 256 MiB anonymous memory touched, and 32 hugepages (64 MiB) that memory.max does not charge
    assert 256 * MIB <= int(measured["numa-bound"]["memory.current"]) < 512 * MIB
    assert measured["cpu-only"]["MemoryHigh"] == str(128 * MIB)
    assert measured["cpu-only"]["memory.high"] == str(128 * MIB)
    assert measured["cpu-only"]["memory.max"] == "max"  # high throttles, it does not cap


def test_allocating_past_memory_max_is_oom_killed_inside_the_service_only(host):
    wait_until_touched(host, "numa-bound")
    other = wait_until_touched(host, "cpu-only")
    other_invocation = show(host, "cpu-only", "InvocationID")
    bound = cgroup(host, "numa-bound")
    parent = bound.rsplit("/", 1)[0]  # numafleet.slice: its memory.events count descendants
    other_events = events(host, cgroup(host, "cpu-only"))
    before = events(host, parent)
    restarts = int(show(host, "numa-bound", "NRestarts"))
    since = host.check_output("date +%s")
    # A second workload inside numa-bound's cgroup that touches 768 MiB: past its 512 MiB limit.
    # The inner shell moves itself into the cgroup and becomes the workload; the outer one stays
    # outside and prints how the workload ended (a remote command killed by a signal would make
    # ssh itself exit 255, which testinfra reports as a connection error).
    inner = (
        f"echo 1000 > /proc/self/oom_score_adj && echo $$ > {bound}/cgroup.procs && "
        "exec /usr/bin/python3 /usr/local/libexec/numafleet-touch --anon-mib 768"
    )
    try:
        hog = host.run(f"sh -c {shlex.quote(inner)}; echo workload-status=$?")
        after = events(host, parent)
        status = hog.stdout.rpartition("workload-status=")[2].strip()
        assert status == "137", f"the 768 MiB workload was not SIGKILLed: {hog.stdout} {hog.stderr}"
        assert after["oom_kill"] >= before["oom_kill"] + 1, (before, after)
        assert events(host, cgroup(host, "cpu-only"))["oom_kill"] == other_events["oom_kill"]
        assert main_pid(host, "cpu-only") == other
        assert show(host, "cpu-only", "InvocationID") == other_invocation  # never restarted
        journal = host.run(f"journalctl -o cat -u {unit('numa-bound')} --since @{since}").stdout
        assert "OOM killer" in journal, journal[-2000:]
        record(
            "limits_oom",
            {
                "workload_status": status,
                "slice_oom_kill_before_after": [before["oom_kill"], after["oom_kill"]],
                "cpu_only_oom_kill": other_events["oom_kill"],
                "journal": [
                    line for line in journal.splitlines() if "OOM" in line or "oom" in line
                ],
            },
        )
    finally:
        # systemd's default OOMPolicy=stop stops the service; Restart=on-failure starts it again.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and show(host, "numa-bound", "ActiveState") != "active":
            time.sleep(2)
        if show(host, "numa-bound", "ActiveState") != "active":
            host.run(f"systemctl reset-failed {unit('numa-bound')}")
            host.run(f"systemctl start {unit('numa-bound')}")
        wait_until_touched(host, "numa-bound")
    record("limits_oom_restarts", [restarts, int(show(host, "numa-bound", "NRestarts"))])


def test_changing_one_limit_restarts_only_that_unit(host, tmp_path):
    bound, cpu_only = wait_until_touched(host, "numa-bound"), wait_until_touched(host, "cpu-only")
    edited = json.loads(json.dumps(placements()))
    next(p for p in edited if p["name"] == "cpu-only")["cpu_weight"] = 300
    try:
        proc, output, seconds = site(tmp_path, "weight", edited)
        assert proc.returncode == 0, output[-4000:]
        assert (
            "why numafleet-cpu-only.service restarts: its limits change: CPUWeight (none) -> 300"
        ) in output, output[-4000:]
        assert show(host, "cpu-only", "CPUWeight") == "300"
        assert main_pid(host, "numa-bound") == bound  # not restarted
        assert wait_until_touched(host, "cpu-only") != cpu_only  # restarted
        record("limits_day2_edit_s", seconds)
    finally:
        proc, output, dummy = run_playbook("../site.yml")  # back to the scenario's placements
        assert proc.returncode == 0, output[-4000:]
    assert main_pid(host, "numa-bound") == bound
    wait_until_touched(host, "cpu-only")
