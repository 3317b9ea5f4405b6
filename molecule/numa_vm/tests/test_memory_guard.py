"""The runtime memory guard on the real 2-node guest (cgroup v2, systemd).

Two placements on node 1: numa-bound (priority high, 256 MiB touched, MemoryLow= its 512M budget)
and `hog` (priority low), whose workload grows on request (numafleet-touch --grow-file) until
node 1 passes the act threshold. A swap file exists for the reclaim and throttle tests only:
without swap, anonymous memory cannot be reclaimed, only throttled or moved (and the guard in
mode reclaim throttles).

- reclaim: the guard writes to hog's memory.reclaim; node 1 falls back under the act threshold;
  numa-bound is never acted on and keeps its memory on node 1 (off-node share < 2 %);
- throttle: the guard lowers hog's memory.high, the kernel holds hog to it, and the guard writes
  the old value back (release) once node 1 is below warn - margin;
- reclaim without swap: the guard throttles hog instead, and its journal line says why;
- migrate (no swap; a hugepage pool holds part of node 1, so that node 0 can take hog below
  warn): the guard moves hog's pages to node 0 (migrate_pages(2)), records it in its state file,
  and verify reports hog as spilled (a warning), not as a failure;
- the journal has the structured lines, the textfile the crossing and the actions;
- preflight (numafleet_preflight: enforce in molecule.yml): a unit whose anchor device is on
  another node than the plan says does not start, with a journal line naming the check; with the
  right plan it starts.

The waits (grow hog, wait for an action, for the node to calm) run inside the guest as
numafleet-guard-scene (tests/vm/workload/numafleet_guard_scene.py, installed by prepare.yml):
testinfra's ansible connection costs a second or more per command on the emulated CPU, and a test
that polled through it spent most of its time there.

Written for `make vm` (not run by units). Figures go to reports/numa_vm/figures.json.
"""

import base64
import json
import shlex
import time

import pytest
from vm_helpers import (
    HOST,
    main_pid,
    placements,
    record,
    run_playbook,
    site,
    unit,
    wait_until_touched,
)

testinfra_hosts = ["numa-vm"]
CONFIG = "/etc/numafleet/guard.json"
STATE = "/run/numafleet-guard/state.json"
TEXTFILE_DIR = (
    "/var/lib/node_exporter/textfile"  # numafleet_memory_guard_textfile_dir (molecule.yml)
)
TEXTFILE = f"{TEXTFILE_DIR}/numafleet_guard.prom"
GROW = "/run/numafleet-hog.mib"  # numafleet-guard-scene's --grow-file default
SCENE = "/usr/bin/python3 /usr/local/libexec/numafleet-guard-scene"  # put there by prepare.yml
SWAP = "/var/tmp/numafleet-guard-test.swap"
INTERVAL_S = 2
SCENE_VARS = {"numafleet_memory_guard_interval": INTERVAL_S}
HOG_START_MIB = 32
NODE = 1
HOG_MIGRATE_MIB = 768  # hog's size when node 1 passes act in the migrate test (see there)
POOL = f"/sys/devices/system/node/node{NODE}/hugepages/hugepages-2048kB/nr_hugepages"
MIB = 1 << 20


def hog_placement() -> dict:
    return {
        "name": "hog",
        "exec": f"/usr/bin/python3 /usr/local/libexec/numafleet-touch --anon-mib {HOG_START_MIB}"
        f" --grow-file {GROW}",
        "node": NODE,
        "cpus": 1,
        "memory": "256M",
        "priority": "low",
    }


def scene_cmd(host, *args, timeout_s: float = 120) -> dict:
    """Run numafleet-guard-scene (tests/vm/workload/numafleet_guard_scene.py) in the guest.

    Its polling loops run inside the guest: through testinfra's ansible connection each probe
    would cost a second or more on the emulated CPU. Returns its JSON object (with ``since``, the
    guest's clock); a wait that ran out fails the test with the guard's recent journal lines.
    """
    command = " ".join([SCENE, *(shlex.quote(str(a)) for a in args), "--timeout", str(timeout_s)])
    result = host.run(command)
    text = result.stdout.strip()
    data = json.loads(text) if text.startswith("{") else {}
    if result.rc != 0 or "error" in data:
        if data.get("error"):
            record(f"guard_failure_{args[0]}", data)
        raise AssertionError(
            f"{command}: {data.get('error') or result.stderr[-2000:]}\n"
            f"{json.dumps(data.get('diagnosis'), indent=1)}"
        )
    return data


def set_hog_mib(host, mib: int) -> None:
    """Give hog a new MiB target; SIGUSR1 makes it read it at once (a throttled hog sleeps in
    its page faults and would not look for a long time)."""
    host.run(
        f"echo {int(mib)} > {GROW} && kill -USR1"
        f" $(systemctl show -p MainPID --value {unit('hog')}) 2>/dev/null"
    )


def wait_for(what: str, probe, timeout_s: float = 60, every_s: float = 1.0):
    """probe()'s first truthy value within timeout_s, else AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def node_ratio(host) -> float:
    """Node 1's used ratio as the guard computes it (file LRU not counted as used)."""
    return scene_cmd(host, "node")["node"]["ratio"]


def cgroup_dir(host, name: str) -> str:
    path = host.check_output(f"systemctl show -p ControlGroup --value {unit(name)}")
    assert path.startswith("/"), f"{unit(name)} has no control group: {path!r}"
    return f"/sys/fs/cgroup{path}"


def numa_stat(host, name: str) -> dict:
    """{node: anon + file bytes} of the unit's memory.numa_stat."""
    out = {}
    for line in host.file(f"{cgroup_dir(host, name)}/memory.numa_stat").content_string.splitlines():
        key, *pairs = line.split()
        if key in ("anon", "file"):
            for pair in pairs:
                node, value = pair[1:].split("=")
                out[int(node)] = out.get(int(node), 0) + int(value)
    return out


def offnode_share(host, name: str, node: int = NODE) -> float:
    by_node = numa_stat(host, name)
    total = sum(by_node.values())
    return round(sum(v for n, v in by_node.items() if n != node) / total, 4) if total else 0.0


def guard_config(host) -> dict:
    return json.loads(host.file(CONFIG).content_string)


def write_config(host, config: dict) -> None:
    """Write the guard's config in place (the guard re-reads it when its mtime changes)."""
    data = base64.b64encode((json.dumps(config, indent=2) + "\n").encode()).decode()
    host.run_test(f"echo {data} | base64 -d > {CONFIG}.test && mv {CONFIG}.test {CONFIG}")


def set_act(host, act: str) -> None:
    config = guard_config(host)
    config["settings"]["act"] = act
    write_config(host, config)


def textfile_value(host, prefix: str) -> float:
    for line in host.file(TEXTFILE).content_string.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def state(host) -> dict:
    return json.loads(host.file(STATE).content_string)


@pytest.fixture(scope="module")
def scene(host, tmp_path_factory):
    """numa-bound (high, one CPU) and hog (low) on node 1, a 2 s guard interval, a swap file."""
    tmp = tmp_path_factory.mktemp("guard")
    host.run_test(
        f"fallocate -l 768M {SWAP} && chmod 600 {SWAP} && mkswap {SWAP} >/dev/null && swapon {SWAP}"
    )
    wanted = json.loads(json.dumps(placements()))
    for placement in wanted:
        if placement["name"] == "numa-bound":
            placement["cpus"] = 1  # node 1's other CPU is hog's
    wanted.append(hog_placement())
    proc, output, seconds = site(tmp, "guard", wanted, "-e", json.dumps(SCENE_VARS))
    assert proc.returncode == 0, output[-4000:]
    record("guard_site_with_hog_s", seconds)
    wait_until_touched(host, "numa-bound")
    wait_until_touched(host, "hog")
    wait_for(
        "the guard re-read its config", lambda: "hog" in host.file(TEXTFILE).content_string, 60
    )
    yield tmp
    set_hog_mib(host, 0)
    proc, output, dummy = run_playbook("../site.yml")  # back to the scenario's placements
    host.run(f"swapoff {SWAP} 2>/dev/null; rm -f {SWAP} {GROW}")
    assert proc.returncode == 0, output[-4000:]


def test_the_guard_runs_and_reports_each_round(host, scene):
    assert host.service("numafleet-guard.service").is_running
    settings = guard_config(host)["settings"]
    assert settings["interval_s"] == INTERVAL_S
    assert (settings["warn_pct"], settings["act_pct"]) == (80, 90)
    first = state(host)["last_run"]
    wait_for("a later round", lambda: state(host)["last_run"] > first, 30)
    text = host.file(TEXTFILE).content_string
    assert f'numafleet_node_memory_used_ratio{{node="{NODE}"}}' in text
    assert 'numafleet_placement_offnode_share_ratio{placement="hog"}' in text
    assert "numafleet_guard_last_run_timestamp_seconds" in text
    # The guard runs as a resident service: the loop pays Python's start-up once. Its CPU time
    # over about 10 rounds on the guest (TCG: an emulated CPU, many times slower than the host).
    cpu = "systemctl show -p CPUUsageNSec --value numafleet-guard.service"
    cpu_before, rounds_before = int(host.check_output(cpu)), state(host)["last_run"]
    time.sleep(10 * INTERVAL_S + 1)
    cpu_after, rounds_after = int(host.check_output(cpu)), state(host)["last_run"]
    rounds = round((rounds_after - rounds_before) / INTERVAL_S)
    assert rounds >= 5, (rounds_before, rounds_after)
    record(
        "guard_guest_cpu_ms_per_round",
        {"rounds": rounds, "cpu_ms_per_round": round((cpu_after - cpu_before) / 1e6 / rounds, 2)},
    )


def test_reclaim_brings_the_node_back_and_spares_the_high_placement(host, scene):
    set_act(host, "reclaim")
    bound_before = numa_stat(host, "numa-bound")
    bound_pid = main_pid(host, "numa-bound")
    grown = scene_cmd(host, "grow", "--ratio", 0.93, "--action", "reclaim", timeout_s=300)
    since = grown["since"]
    reclaims = scene_cmd(host, "actions", "reclaim", "--since", since)["records"]
    after = scene_cmd(host, "node-below", 0.90)["node"]
    records = scene_cmd(host, "journal", "--since", since)["records"]
    levels = [r for r in records if r.get("NUMAFLEET_LEVEL") in ("warn", "act")]
    record(
        "guard_reclaim",
        {
            "node1_ratio_over": grown["node"]["ratio"],
            "node1_ratio_after": after["ratio"],
            "actions": [
                {k: r.get(k) for k in ("NUMAFLEET_PLACEMENT", "NUMAFLEET_AMOUNT_BYTES", "MESSAGE")}
                for r in reclaims
            ],
            "level_messages": [r["MESSAGE"] for r in levels],
            "numa_bound_offnode_share": offnode_share(host, "numa-bound"),
            "numa_bound_bytes_before": bound_before,
            "numa_bound_bytes_after": numa_stat(host, "numa-bound"),
        },
    )
    assert {r["NUMAFLEET_PLACEMENT"] for r in reclaims} == {"hog"}
    assert all(
        r.get("NUMAFLEET_PLACEMENT") != "numa-bound" for r in records if "NUMAFLEET_ACTION" in r
    )
    assert any(r["NUMAFLEET_LEVEL"] == "act" and "hog=" in r["NUMAFLEET_TOP_USERS"] for r in levels)
    assert offnode_share(host, "numa-bound") < 0.02
    assert numa_stat(host, "numa-bound").get(NODE, 0) >= 0.95 * bound_before.get(NODE, 0)
    assert main_pid(host, "numa-bound") == bound_pid
    assert (
        textfile_value(
            host, f'numafleet_guard_actions_total{{node="{NODE}",action="reclaim",placement="hog"}}'
        )
        >= 1
    )
    scene_cmd(host, "calm")


def _bytes(text: str) -> int:
    return 1 << 62 if text in ("", "max") else int(text)


def test_throttle_lowers_memory_high_and_releases_it(host, scene):
    """With swap the kernel's own kswapd holds a bound node near its watermarks, so the node
    hovers just over the act threshold; what throttle must show is that the guard lowers hog's
    memory.high, the kernel holds hog to it, and the guard writes the old value back once the
    node is calm."""
    set_act(host, "throttle")
    hog = cgroup_dir(host, "hog")
    assert host.file(f"{hog}/memory.high").content_string.strip() == "max"
    grown = scene_cmd(host, "grow", "--ratio", 0.91, "--action", "throttle", timeout_s=300)
    since = grown["since"]
    scene_cmd(host, "actions", "throttle", "--since", since)
    held = scene_cmd(host, "held", "--since", since)
    # every throttle lowered memory.high from what it was (max at first), and what holds hog now
    # is the guard's last value (the kernel keeps memory.high in whole pages)
    throttles = scene_cmd(host, "actions", "throttle", "--since", since)["records"]
    assert throttles[0]["NUMAFLEET_BEFORE"] == "max", throttles[0]
    for r in throttles:
        assert int(r["NUMAFLEET_AFTER"]) < _bytes(r["NUMAFLEET_BEFORE"]), r
    mine = [r for r in throttles if 0 <= int(r["NUMAFLEET_AFTER"]) - held["memory_high"] < 4096]
    assert mine, (held, throttles)
    set_hog_mib(host, HOG_START_MIB)
    releases = scene_cmd(host, "actions", "release", "--since", since)["records"]
    record(
        "guard_throttle",
        {
            "hog_memory_current_at_grow_end": grown["hog_current"],
            "memory_high_lowered_to": held["memory_high"],
            "hog_memory_current_held": held["memory_current"],
            "throttle_messages": [r["MESSAGE"] for r in throttles],
            "release_messages": [r["MESSAGE"] for r in releases],
        },
    )
    assert host.file(f"{hog}/memory.high").content_string.strip() == "max"
    assert {r["NUMAFLEET_PLACEMENT"] for r in throttles + releases} == {"hog"}
    assert offnode_share(host, "numa-bound") < 0.02
    scene_cmd(host, "calm")


def swap_off(host) -> None:
    """No swap from here on (hog is small again after calm, so little comes back from it)."""
    if SWAP in host.run("swapon --show=NAME --noheadings").stdout:
        host.run_test(f"swapoff {SWAP}")


def test_reclaim_without_swap_throttles_and_says_why(host, scene):
    """Most inference hosts have no swap: there memory.reclaim cannot free hog's anonymous
    memory, so in mode reclaim the guard throttles, and its journal line says why."""
    swap_off(host)
    set_act(host, "reclaim")
    grown = scene_cmd(host, "grow", "--ratio", 0.91, "--action", "throttle", timeout_s=300)
    since = grown["since"]
    throttles = scene_cmd(host, "actions", "throttle", "--since", since)["records"]
    set_hog_mib(host, HOG_START_MIB)
    releases = scene_cmd(host, "actions", "release", "--since", since)["records"]
    records = scene_cmd(host, "journal", "--since", since)["records"]
    record(
        "guard_reclaim_without_swap",
        {
            "node1_ratio_over": grown["node"]["ratio"],
            "throttle_messages": [r["MESSAGE"] for r in throttles],
            "release_messages": [r["MESSAGE"] for r in releases],
        },
    )
    assert {r["NUMAFLEET_PLACEMENT"] for r in throttles + releases} == {"hog"}
    assert all(
        "throttled, not reclaimed: no free swap (SwapFree 0 kB in /proc/meminfo)" in r["MESSAGE"]
        for r in throttles
    ), throttles
    assert not [r for r in records if r.get("NUMAFLEET_ACTION") == "reclaim"]
    assert offnode_share(host, "numa-bound") < 0.02
    scene_cmd(host, "calm")


def test_migrate_moves_the_low_placement_and_verify_reports_it_spilled(host, scene):
    # Without swap: the kernel's kswapd then cannot hold node 1 at its watermark by swapping
    # hog out while it grows.
    swap_off(host)
    # The guard moves a placement only to a node that stays below warn after the move. hog alone
    # filling node 1 to 92 % would be about 1.5 GiB, more than node 0 (2 GiB) takes below 80 %;
    # a hugepage pool on node 1 (memory the guard counts as used, as it is on hosts that reserve
    # it) holds the rest, so hog is about HOG_MIGRATE_MIB when node 1 passes the act threshold.
    node = scene_cmd(host, "node")["node"]
    pool_before = int(host.file(POOL).content_string)
    extra = max(0, (int(0.92 * node["MemTotal"] - node["used_kb"]) >> 10) - HOG_MIGRATE_MIB) // 2
    set_act(host, "migrate")
    host.run_test(f"echo {pool_before + extra} > {POOL}")
    try:
        pool = int(host.file(POOL).content_string)
        grown = scene_cmd(host, "grow", "--ratio", 0.92, "--action", "migrate", timeout_s=300)
        moves = scene_cmd(host, "actions", "migrate", "--since", grown["since"])["records"]
        spilled = scene_cmd(host, "spilled", timeout_s=60)["spilled"]
    finally:
        host.run_test(f"echo {pool_before} > {POOL}")
    hog_share = offnode_share(host, "hog")
    # verify.yml with the scene's placements and the guard settings this test runs with
    proc, output, dummy = run_playbook(
        "verify.yml",
        "-e",
        f"@{scene / 'guard.json'}",
        "-e",
        json.dumps(dict(SCENE_VARS, numafleet_memory_act="migrate")),
        "-e",
        f"numafleet_report_dir={scene}",
    )
    code = proc.returncode
    report = json.loads((scene / "verify.json").read_text())
    hog_checks = [c for c in report["hosts"][HOST]["checks"] if c["subject"] == "hog"]
    record(
        "guard_migrate",
        {
            "node1_hugepages_held": {"asked": pool_before + extra, "got": pool},
            "node1_ratio_over": grown["node"]["ratio"],
            "messages": [r["MESSAGE"] for r in moves],
            "spilled": spilled,
            "hog_offnode_share": hog_share,
            "node1_ratio_after": node_ratio(host),
            "verify_hog": [(c["check"], c["status"], c.get("message")) for c in hog_checks],
            "verify_status": report["hosts"][HOST]["status"],
        },
    )
    assert {r["NUMAFLEET_PLACEMENT"] for r in moves} == {"hog"}
    assert spilled["to"] == [0]
    assert hog_share > 0.5
    assert offnode_share(host, "numa-bound") < 0.02
    assert code == 0, output[-4000:]
    assert any("spilled" in (c.get("message") or "") for c in hog_checks), hog_checks
    assert report["hosts"][HOST]["status"] != "fail"


def test_preflight_refuses_a_unit_whose_anchor_is_on_another_node(host, scene):
    config = guard_config(host)
    wrong = json.loads(json.dumps(config))
    entry = next(p for p in wrong["placements"] if p["name"] == "numa-bound")
    entry["node"] = 0  # the plan says node 0; the NVMe it is anchored on is on node 1
    entry["mems"] = [0]
    if entry.get("near"):
        entry["near"]["node"] = 0
    since = time.time()
    write_config(host, wrong)
    try:
        failed = host.run(f"systemctl restart {unit('numa-bound')}")
        state_now = [
            host.check_output(f"systemctl show -p {prop} --value {unit('numa-bound')}")
            for prop in ("ActiveState", "SubState")
        ]
        lines = host.run(
            f"journalctl -o cat --no-pager -u {unit('numa-bound')} --since @{int(since)}"
        ).stdout
    finally:
        write_config(host, config)
    record("guard_preflight_refusal", [line for line in lines.splitlines() if "preflight" in line])
    assert failed.rc != 0
    # not running: failed, or waiting for Restart= to try again (ExecStartPre= failed each time)
    assert state_now[0] in ("failed", "inactive", "activating"), state_now
    assert state_now[1] in ("failed", "dead", "auto-restart", "start-pre"), state_now
    assert "FAIL anchor 0000:81:00.0 is on NUMA node 1, planned node 0" in lines, lines[-3000:]
    host.run_test(f"systemctl reset-failed {unit('numa-bound')} || true")
    host.run_test(f"systemctl restart {unit('numa-bound')}")
    wait_until_touched(host, "numa-bound")
    assert host.service(unit("numa-bound")).is_running


def test_capture_the_guard_inputs_for_the_unit_tests(host, scene):
    """The real files the guard reads, kept in figures.json for tests/unit/fixtures."""
    paths = []
    for node in (0, 1):
        base = f"/sys/devices/system/node/node{node}"
        paths += [f"{base}/meminfo", f"{base}/distance"]
        paths += [f"{base}/hugepages/hugepages-2048kB/{f}_hugepages" for f in ("nr", "free")]
    paths.append("/sys/devices/system/node/online")
    for name in ("numa-bound", "hog", "cpu-only"):
        base = cgroup_dir(host, name)
        paths += [f"{base}/memory.{f}" for f in ("current", "high", "low", "numa_stat")]
    record("guard_capture", {path: host.file(path).content_string for path in paths})
