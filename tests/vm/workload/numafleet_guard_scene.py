"""Guest side of the memory guard test: the polling loops, run inside the QEMU guest.

    numafleet-guard-scene grow --ratio 0.93 [--action reclaim] [--since EPOCH]
    numafleet-guard-scene actions ACTION --since EPOCH [--timeout S]
    numafleet-guard-scene node-below RATIO [--timeout S]
    numafleet-guard-scene held [--timeout S]
    numafleet-guard-scene spilled [--timeout S]
    numafleet-guard-scene calm [--timeout S]
    numafleet-guard-scene journal --since EPOCH
    numafleet-guard-scene node

The test drives the guest through testinfra's ansible connection, which costs a second or more
per command on an emulated (TCG) CPU; a loop that polls the node's meminfo, the hog's cgroup and
the guard's journal every half second from there spends most of its time in that connection. Each
command here does one such loop locally and prints one JSON object on stdout: what it saw, and
``since`` (the guest's clock, for the journal queries that follow). A wait that runs out prints
``{"error": ..., "diagnosis": ...}`` and exits 1. The assertions stay in the test.

The scene: the placement ``hog`` (unit numafleet-hog.service) runs numafleet-touch with
``--grow-file /run/numafleet-hog.mib`` on NUMA node 1; ``grow`` raises that MiB target until the
node's used ratio (the guard's: MemTotal - MemFree - file LRU, from
/sys/devices/system/node/node<N>/meminfo) reaches ``--ratio`` or the guard took ``--action``.
Sources: the node's meminfo, the unit's cgroup (memory.current, memory.swap.current,
memory.high, memory.events), ``journalctl -o json SYSLOG_IDENTIFIER=numafleet-guard`` and the
guard's state file /run/numafleet-guard/state.json.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

MIB = 1 << 20
STATE = "/run/numafleet-guard/state.json"


class Timeout(Exception):
    """A wait ran out; the message names what was awaited."""


def node_memory(node: int) -> dict:
    """kB fields of node<N>/meminfo plus used_kb and the guard's used ratio."""
    fields = {}
    with open(f"/sys/devices/system/node/node{node}/meminfo", encoding="ascii") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 4:
                fields[parts[2].rstrip(":")] = int(parts[3])
    used = (
        fields["MemTotal"] - fields["MemFree"] - fields["Active(file)"] - fields["Inactive(file)"]
    )
    fields["used_kb"] = used
    fields["ratio"] = round(used / fields["MemTotal"], 4)
    return fields


def show(unit: str, prop: str) -> str:
    return subprocess.run(
        ["systemctl", "show", "-p", prop, "--value", unit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def cgroup_dir(unit: str) -> str:
    path = show(unit, "ControlGroup")
    if not path.startswith("/"):
        raise Timeout(f"{unit} has no control group: {path!r}")
    return f"/sys/fs/cgroup{path}"


def read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def footprint_mib(unit: str) -> int:
    """The unit's memory wherever it is, in MiB: memory.current plus memory.swap.current."""
    base = cgroup_dir(unit)
    return (
        sum(int(read(f"{base}/{name}") or 0) for name in ("memory.current", "memory.swap.current"))
        // MIB
    )


def set_target(args, mib: int) -> None:
    """Write hog's MiB target; SIGUSR1 makes it read the target at once (a throttled hog sleeps
    in its page faults and would not look for a long time)."""
    with open(args.grow_file, "w", encoding="ascii") as handle:
        handle.write(f"{int(mib)}\n")
    pid = int(show(args.unit, "MainPID") or 0)
    if pid > 0:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def journal(since: float) -> list:
    """The guard's journal records since the epoch time ``since``: MESSAGE and NUMAFLEET_*."""
    out = subprocess.run(
        [
            "journalctl",
            "-o",
            "json",
            "--no-pager",
            "SYSLOG_IDENTIFIER=numafleet-guard",
            "--since",
            f"@{int(since)}",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    records = []
    for line in out.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records.append(
                {k: v for k, v in record.items() if k == "MESSAGE" or k.startswith("NUMAFLEET_")}
            )
    return records


def actions(since: float, action: str) -> list:
    """The guard's ``action`` records since ``since`` that took effect (fully or partly)."""
    return [
        r
        for r in journal(since)
        if r.get("NUMAFLEET_ACTION") == action and r.get("NUMAFLEET_RESULT") in ("ok", "partial")
    ]


def state() -> dict:
    try:
        with open(STATE, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def wait_for(what: str, probe, timeout_s: float, every_s: float = 0.5):
    """probe()'s first truthy value within timeout_s, else Timeout naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)


def diagnosis(args, since: float) -> dict:
    """What the guard did and saw since ``since``, for a failed wait's message."""
    base = cgroup_dir(args.unit)
    return {
        f"node{args.node}": {
            k: v for k, v in node_memory(args.node).items() if k in ("ratio", "MemFree")
        },
        "hog memory.current/high": [read(f"{base}/memory.current"), read(f"{base}/memory.high")],
        "hog memory.events": read(f"{base}/memory.events"),
        "swap": read("/proc/swaps"),
        "guard": [
            (r.get("NUMAFLEET_ACTION"), r.get("NUMAFLEET_RESULT"), r.get("MESSAGE"))
            for r in journal(since)
        ][-12:],
    }


def cmd_grow(args) -> dict:
    """Grow hog until the node's used ratio reaches --ratio, or until the guard took --action
    (it acts at its act threshold, before the test's ratio: growing on after that would make hog
    grow back where the guard just took memory away).

    Each step waits until hog holds what it was asked for (in memory or in swap) before it
    measures again, so that a node the kernel's kswapd holds at its watermark does not make the
    target run away into swap (a full swap file leaves nothing for the guard to reclaim).
    """
    target = int(read(args.grow_file) or args.start_mib)
    for dummy in range(args.steps):
        now = node_memory(args.node)
        acted = bool(args.action) and bool(actions(args.since, args.action))
        if now["ratio"] >= args.ratio or acted:
            base = cgroup_dir(args.unit)
            return {
                "target_mib": target,
                "node": now,
                "acted": acted,
                "hog_current": int(read(f"{base}/memory.current") or 0),
            }
        target += int((args.ratio - now["ratio"]) * now["MemTotal"] / 1024) + 16
        set_target(args, target)
        deadline = time.monotonic() + 60  # a throttled hog grows slowly: measure anyway then
        while footprint_mib(args.unit) < target - 32 and time.monotonic() < deadline:
            time.sleep(0.5)  # 16 MiB chunks: within 32 MiB of the target is there
        time.sleep(0.5)
    raise Timeout(f"node {args.node} did not reach {args.ratio:.0%} in {args.steps} steps")


def cmd_actions(args) -> dict:
    records = wait_for(
        f"a {args.name} action on hog", lambda: actions(args.since, args.name), args.timeout
    )
    return {"records": records}


def cmd_node_below(args) -> dict:
    def below():
        now = node_memory(args.node)
        return now["ratio"] < args.ratio and now

    return {"node": wait_for(f"node {args.node} under {args.ratio:.0%}", below, args.timeout)}


def cmd_held(args) -> dict:
    """Wait until hog's memory.high is lowered and hog holds to it (within 8 MiB)."""
    base = cgroup_dir(args.unit)

    def held():
        high = read(f"{base}/memory.high")
        current = int(read(f"{base}/memory.current") or 0)
        return high not in ("", "max") and current <= int(high) + 8 * MIB and (int(high), current)

    high, current = wait_for("hog held at its lowered memory.high", held, args.timeout)
    return {"memory_high": high, "memory_current": current}


def cmd_spilled(args) -> dict:
    spilled = wait_for(
        "hog recorded as spilled", lambda: state().get("spilled", {}).get("hog"), args.timeout
    )
    return {"spilled": spilled}


def cmd_calm(args) -> dict:
    """Shrink hog to its start size; wait until the node is under 75 % and the guard says ok."""
    set_target(args, args.start_mib)
    node = wait_for(
        f"node {args.node} back under 75 %",
        lambda: (m := node_memory(args.node))["ratio"] < 0.75 and m,
        args.timeout,
    )
    wait_for(
        f"the guard's level for node {args.node} back to ok",
        lambda: state().get("levels", {}).get(str(args.node)) == "ok",
        args.timeout,
    )
    return {"node": node}


def cmd_journal(args) -> dict:
    return {"records": journal(args.since)}


def cmd_node(args) -> dict:
    return {"node": node_memory(args.node)}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--node", type=int, default=1)
    parser.add_argument("--unit", default="numafleet-hog.service")
    parser.add_argument("--grow-file", default="/run/numafleet-hog.mib")
    parser.add_argument("--start-mib", type=int, default=32)
    sub = parser.add_subparsers(dest="command", required=True)
    grow = sub.add_parser("grow")
    grow.add_argument("--ratio", type=float, required=True)
    grow.add_argument("--action", default="")
    grow.add_argument("--steps", type=int, default=20)
    named = sub.add_parser("actions")
    named.add_argument("name", choices=("reclaim", "throttle", "release", "migrate"))
    below = sub.add_parser("node-below")
    below.add_argument("ratio", type=float)
    sub.add_parser("held")
    sub.add_parser("spilled")
    sub.add_parser("calm")
    sub.add_parser("journal")
    sub.add_parser("node")
    for command in sub.choices.values():
        command.add_argument("--since", type=float, default=None)
        command.add_argument("--timeout", type=float, default=120)
    return parser.parse_args(argv)


COMMANDS = {
    "grow": cmd_grow,
    "actions": cmd_actions,
    "node-below": cmd_node_below,
    "held": cmd_held,
    "spilled": cmd_spilled,
    "calm": cmd_calm,
    "journal": cmd_journal,
    "node": cmd_node,
}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.since is None:
        args.since = time.time()
    try:
        out = COMMANDS[args.command](args)
    except Timeout as exc:
        try:
            seen = diagnosis(args, args.since)
        except (OSError, ValueError, subprocess.SubprocessError, Timeout) as why:
            seen = {"unavailable": str(why)}
        out = {"error": str(exc), "since": args.since, "diagnosis": seen}
        print(json.dumps(out))
        return 1
    out["since"] = args.since
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
