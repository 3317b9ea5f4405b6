"""Benchmark: plan a fleet of 1,000 GPU hosts with 16 placements each, in-process.

    .venv/bin/python benchmarks/planner.py [--hosts N] [--rounds N]

Writes benchmarks/results/planner.json and benchmarks/results/planner.md. Hosts cycle through
the fixture GPU machines (golden numa facts + GPU facts replayed from the recorded snapshots);
each gets a 16-placement list that mixes whole GPUs, MIG, MPS, hugepages, tenants and CPU-only
placements. The timed part is plan_host() for every host (validation included; facts are read
once before timing). Target: the whole fleet in < 1 s, for a first plan and for the daily case,
a plan made from each host's recorded plan (every placement kept; parse_recorded timed too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trees  # noqa: E402  (tests/unit/fixtures/trees.py, stdlib only)
from facts import machine_info  # noqa: E402  (benchmarks/facts.py)

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, gpu_snapshot  # noqa: E402
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (  # noqa: E402
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader  # noqa: E402

TARGET_S = 1.0
PLACEMENTS_PER_HOST = 16
TENANTS = [{"name": "team-a", "memory_max": "400G"}, {"name": "team-b"}]
POLICY = {"reserved_cpus": "0-1", "memory_headroom_pct": 15}


def _p(name: str, **options) -> dict:
    entry = {"name": name, "exec": f"/opt/{name}/bin/serve --port 8000", "cpus": 4}
    entry.update(options)
    return entry


def _cpu_only(count: int, cpus: int) -> list:
    return [_p(f"batch-{i}", cpus=cpus, memory="2G", tenant="team-b") for i in range(count)]


# 16 placements per machine, each list feasible on its machine.
WORKLOADS = {
    "synthetic-2x6338-4xa100": [
        _p("llm", gpus=2, cpus=16, memory="64G", hugepages={"size": "2M", "count": 1024}),
        _p("rag", gpus=1, cpus=8, memory="16G", tenant="team-a"),
        _p("embed-a", mig_profile="2g.20gb", mps={"active_thread_percentage": 40}),
        _p("embed-b", mig_profile="2g.20gb"),
        _p("rerank", mig_profile="3g.40gb", memory="8G"),
        *_cpu_only(11, 4),
    ],
    "synthetic-8xh100-2s": [
        _p("llm-0", gpus=4, cpus=32, memory="256G", hugepages={"size": "1G", "count": 64}),
        _p("llm-1", gpus=2, cpus=16, memory="128G", tenant="team-a"),
        _p("vision", gpus=1, cpus=8, memory="32G"),
        _p("mps-a", gpus=1, mps={"pinned_memory_limit": "20G"}, memory="8G"),
        _p("mps-b", gpus=1, mps={"active_thread_percentage": 50}, memory="8G"),
        _p("pinned", cpus="200-203"),
        *_cpu_only(10, 6),
    ],
    "synthetic-epyc-nps4": [
        _p("l40s", gpus=1, cpus=16, memory="64G"),
        _p("etl", node=1, cpus=24, memory="100G"),
        _p("etl-2", node=3, cpus=24, memory="100G"),
        *_cpu_only(13, 6),
    ],
    "synthetic-mi300x-cpx": [
        _p("train", gpus=4, cpus=48, memory="512G"),
        _p("infer-a", gpus=2, cpus=16, memory="64G", tenant="team-a"),
        _p("infer-b", gpus=1, cpus=8, memory="32G"),
        _p("wide", cpus=80, allow_span=True),
        *_cpu_only(12, 2),
    ],
    "synthetic-gh200": [
        _p("hopper", gpus=1, cpus=32, memory="200G"),
        *_cpu_only(15, 2),
    ],
}


def load_facts(scratch: str) -> dict:
    facts = {}
    for machine in WORKLOADS:
        numa = json.loads((trees.SYSFS / f"{machine}.numa.json").read_text(encoding="utf-8"))
        root = trees.materialize(machine, Path(scratch) / machine)
        snapshot = trees.GPU_SNAPSHOT_DIR / f"{machine}.json"
        state = (
            gpu_snapshot.read_snapshot(str(snapshot))
            if snapshot.is_file()
            else gpu.nvml_unavailable("no snapshot")
        )
        topology = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
        facts[machine] = (numa, json.loads(json.dumps(topology)))
    return facts


def fleet(facts: dict, hosts: int) -> list:
    machines = sorted(WORKLOADS)
    rows = []
    for index in range(hosts):
        machine = machines[index % len(machines)]
        numa, topology = facts[machine]
        rows.append((f"host-{index:04d}", machine, numa, topology, WORKLOADS[machine]))
    return rows


def run_once(rows: list, recorded=None) -> tuple:
    """(wall seconds, CPU seconds of this process, placements planned, plans) of one fleet run.

    recorded: host -> numafleet_recorded facts (the plan of an earlier run), or None.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    placed, plans = 0, {}
    for host, dummy, numa, topology, placements in rows:
        kept = None
        if recorded is not None:
            kept = parse_recorded(host, recorded[host], "/etc/numafleet/plan.json")
        plan = plan_host(host, numa, topology, placements, TENANTS, POLICY, recorded=kept)
        placed += len(plan["placements"])
        plans[host] = plan
    return time.perf_counter() - start, time.process_time() - cpu_start, placed, plans


def rounds(rows: list, count: int, recorded=None) -> tuple:
    """(wall timings, CPU timings, placements, plans of the last round) of count fleet runs."""
    timings, cpu_timings, placed, plans = [], [], 0, {}
    for dummy in range(count):
        seconds, cpu_seconds, placed, plans = run_once(rows, recorded)
        timings.append(seconds)
        cpu_timings.append(cpu_seconds)
    return timings, cpu_timings, placed, plans


def write_markdown(path: Path, result: dict) -> None:
    machine = result["machine"]
    lines = [
        "# Planner benchmark",
        "",
        f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
        f"kernel {machine['kernel']}, {machine['date_utc']}.",
        "",
        f"{result['hosts']} hosts x {result['placements_per_host']} placements "
        f"({result['placements']} placements), plan_host() in one process, "
        f"{result['rounds']} rounds.",
        "",
        "| median s | min s | max s | median CPU s | us per placement (median) | target | met |",
        "|---|---|---|---|---|---|---|",
        f"| {result['median_s']} | {result['min_s']} | {result['max_s']} | "
        f"{result['median_cpu_s']} | {result['us_per_placement']} | < {TARGET_S} s | "
        f"{'yes' if result['met'] else 'NO'} |",
        "",
        "From each host's recorded plan (the daily run: every placement kept, "
        f"{result['stable_kept']} of {result['placements']} kept):",
        "",
        "| median s | min s | max s | median CPU s | target |",
        "|---|---|---|---|---|",
        f"| {result['stable_median_s']} | {result['stable_min_s']} | {result['stable_max_s']} | "
        f"{result['stable_median_cpu_s']} | < {TARGET_S} s |",
        "",
        f"Load average (1 min) at the end of the run: {result['load_average_1m']} "
        "(other work on the machine slows the wall times).",
        "",
        "## Hosts",
        "",
        "| machine | hosts | placements each |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {count} | {PLACEMENTS_PER_HOST} |"
        for name, count in result["machines"].items()
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="planner-bench-") as scratch:
        facts = load_facts(scratch)
    rows = fleet(facts, args.hosts)
    for machine, placements in WORKLOADS.items():
        if len(placements) != PLACEMENTS_PER_HOST:
            raise SystemExit(f"{machine}: {len(placements)} placements, not {PLACEMENTS_PER_HOST}")
    run_once(rows[: len(WORKLOADS)])  # warm-up (imports, caches of the interpreter)
    timings, cpu_timings, placed, plans = rounds(rows, args.rounds)
    recorded = {
        host: {"state": "present", "plan": json.loads(json.dumps(plan))}
        for host, plan in plans.items()
    }
    stable, stable_cpu, dummy, again = rounds(rows, args.rounds, recorded)
    kept = sum(
        1 for plan in again.values() for state in plan["stability"].values() if state == "kept"
    )
    median = statistics.median(timings)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    counts: dict = {}
    for row in rows:
        machine = row[1]
        counts[machine] = counts.get(machine, 0) + 1
    result = {
        "machine": machine_info(),
        "hosts": args.hosts,
        "placements_per_host": PLACEMENTS_PER_HOST,
        "placements": placed,
        "rounds": args.rounds,
        "median_s": round(median, 3),
        "min_s": round(min(timings), 3),
        "max_s": round(max(timings), 3),
        "median_cpu_s": round(statistics.median(cpu_timings), 3),
        "load_average_1m": None if load is None else round(load, 2),
        "us_per_placement": round(median / placed * 1e6, 1),
        "target_s": TARGET_S,
        "met": median < TARGET_S and statistics.median(stable) < TARGET_S,
        "stable_median_s": round(statistics.median(stable), 3),
        "stable_min_s": round(min(stable), 3),
        "stable_max_s": round(max(stable), 3),
        "stable_median_cpu_s": round(statistics.median(stable_cpu), 3),
        "stable_kept": kept,
        "machines": dict(sorted(counts.items())),
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "planner.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_markdown(out / "planner.md", result)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
