"""Benchmark: one memory-guard round (read + decide + render) on a host with 16 placements.

    .venv/bin/python benchmarks/guard_round.py [--rounds N] [--batch N]

Writes benchmarks/results/guard.json and benchmarks/results/guard.md. The tree is
``guard_trees.scenario("sixteen")`` (tests/unit/fixtures/guard_trees.py): 2 NUMA nodes in the
QEMU guest's layout, 16 placements (4 high, 8 normal, 4 low) with their cgroup v2 memory files,
node 1 at 93% so every round past the first acts (the busiest steady case). The timed part is
guard.run_round() with the state carried from round to round (the files are read each round:
about 80 small files). Rounds are timed in batches; the figure is CPU ms per round of the
median batch (time.process_time, this process only). The tree lies in a temporary directory,
not in sysfs: the kernel's cost of generating meminfo and memory.numa_stat text is not in it
(the guest scenario measures that on a real kernel).

Also measured: the parts of a round alone, and the interpreter start plus the import of the
guard core (what a timer-started guard pays each round, a long-running one once).
Target: < 5 ms CPU per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import guard_trees  # noqa: E402  (tests/unit/fixtures/guard_trees.py, stdlib only)
from facts import machine_info  # noqa: E402  (benchmarks/facts.py)

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard  # noqa: E402

TARGET_MS = 5.0
SCENARIO = "sixteen"
IMPORT = (
    "import sys; sys.path.insert(0, {path!r}); "
    "from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard"
)


def batches(step, count: int, size: int) -> tuple:
    """(CPU ms per call, wall ms per call) of each of ``count`` batches of ``size`` calls."""
    cpu, wall = [], []
    for dummy in range(count):
        start, cpu_start = time.perf_counter(), time.process_time()
        for dummy in range(size):
            step()
        cpu.append((time.process_time() - cpu_start) * 1000 / size)
        wall.append((time.perf_counter() - start) * 1000 / size)
    return cpu, wall


def startup_ms(code: str, runs: int) -> float:
    """Median wall ms of ``python -c code`` (a fresh interpreter each time)."""
    times = []
    for dummy in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def files_read(specs: tuple, sysfs: str, cgroup: str) -> int:
    """How many files one round reads (the reader counted)."""
    paths = []

    def counting(path: str):
        paths.append(path)
        return guard.read_path(path)

    guard.run_round(counting, specs, guard.GuardState(), guard.Thresholds(), 0.0, sysfs, cgroup)
    return len(paths)


def r3(value: float) -> float:
    return round(value, 3)


def measure(root: str, plan: dict, rounds: int, size: int) -> dict:
    specs = guard.parse_placements(plan)
    thresholds = guard.Thresholds()
    sysfs, cgroup = f"{root}/sys", f"{root}/sys/fs/cgroup"
    holder = {"state": guard.GuardState(), "now": 1.7e9}

    def one_round() -> None:
        result = guard.run_round(
            guard.read_path, specs, holder["state"], thresholds, holder["now"], sysfs, cgroup
        )
        holder["state"] = result.decision.state
        holder["now"] += 15.0

    for dummy in range(size):  # warm-up, and the state past act_rounds
        one_round()
    count = max(rounds // size, 1)
    cpu, wall = batches(one_round, count, size)
    last = guard.run_round(guard.read_path, specs, holder["state"], thresholds, 0.0, sysfs, cgroup)
    nodes, dummy = guard.read_nodes(guard.read_path, sysfs)
    memories, dummy = guard.read_placements(guard.read_path, specs, cgroup)
    state = last.decision.state
    parts = {
        "read_nodes": lambda: guard.read_nodes(guard.read_path, sysfs),
        "read_placements": lambda: guard.read_placements(guard.read_path, specs, cgroup),
        "decide": lambda: guard.decide(nodes, memories, specs, state, thresholds),
        "as_textfile": lambda: guard.as_textfile(nodes, memories, specs, state, 0.0),
    }
    part_ms = {
        name: r3(statistics.median(batches(step, count, size)[0])) for name, step in parts.items()
    }
    return {
        "batches": count,
        "batch_size": size,
        "cpu_ms_median": r3(statistics.median(cpu)),
        "cpu_ms_min": r3(min(cpu)),
        "cpu_ms_max": r3(max(cpu)),
        "wall_ms_median": r3(statistics.median(wall)),
        "parts_cpu_ms_median": part_ms,
        "actions_last_round": len(last.decision.actions),
        "textfile_bytes": len(last.textfile.encode()),
        "files_read_per_round": files_read(specs, sysfs, cgroup),
    }


def write_markdown(path: Path, result: dict) -> None:
    machine = result["machine"]
    parts = result["parts_cpu_ms_median"]
    lines = [
        "# Memory guard round benchmark",
        "",
        f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
        f"kernel {machine['kernel']}, {machine['date_utc']}.",
        "",
        f"One round = guard.run_round() (read + decide + render) on scenario `{SCENARIO}`: "
        f"{result['nodes']} NUMA nodes, {result['placements']} placements, "
        f"{result['files_read_per_round']} files read per round, state carried, node 1 over "
        f"the act threshold ({result['actions_last_round']} actions in the last round). "
        f"{result['batches']} batches of {result['batch_size']} rounds.",
        "",
        "| CPU ms per round (median batch) | min | max | wall ms (median) | target | met |",
        "|---|---|---|---|---|---|",
        f"| {result['cpu_ms_median']} | {result['cpu_ms_min']} | {result['cpu_ms_max']} | "
        f"{result['wall_ms_median']} | < {TARGET_MS} ms | {'yes' if result['met'] else 'NO'} |",
        "",
        "Parts alone (CPU ms, median batch):",
        "",
        "| read_nodes | read_placements | decide | as_textfile |",
        "|---|---|---|---|",
        f"| {parts['read_nodes']} | {parts['read_placements']} | {parts['decide']} | "
        f"{parts['as_textfile']} |",
        "",
        f"Start of a fresh interpreter: {result['python_start_ms']} ms; with the import of the "
        f"guard core: {result['python_start_import_ms']} ms (wall, median of "
        f"{result['startup_runs']}). A timer-started guard pays this every round; a "
        "long-running one once.",
        "",
        "The tree is in a temporary directory, not sysfs: the kernel's cost of generating "
        "meminfo and memory.numa_stat is not included.",
        "",
        f"Load average (1 min) at the end of the run: {result['load_average_1m']}.",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--startup-runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="guard-bench-") as scratch:
        root, plan = guard_trees.make(SCENARIO, Path(scratch) / SCENARIO)
        result = measure(root, plan, args.rounds, args.batch)
    result["python_start_ms"] = r3(startup_ms("pass", args.startup_runs))
    result["python_start_import_ms"] = r3(
        startup_ms(IMPORT.format(path=str(ROOT / ".collections")), args.startup_runs)
    )
    nodes, dummy, plan = guard_trees.scenario(SCENARIO)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {
        "machine": machine_info(),
        "scenario": SCENARIO,
        "nodes": len(nodes),
        "placements": len(plan["placements"]),
        **result,
        "startup_runs": args.startup_runs,
        "target_ms": TARGET_MS,
        "met": result["cpu_ms_median"] < TARGET_MS,
        "load_average_1m": None if load is None else round(load, 2),
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "guard.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_markdown(out / "guard.md", result)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
