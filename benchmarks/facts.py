"""Benchmark: the two topology facts modules against ansible.builtin.setup's hardware subset.

    .venv/bin/python benchmarks/facts.py [--rounds N]

Writes benchmarks/results/facts.json and benchmarks/results/facts.md. Two parts, same run:

1. core: read_numa_facts + the GPU readers in-process on every fixture tree (median of runs);
2. ansible: one play on localhost interleaving numa_facts, gpu_topology_facts and
   `setup gather_subset=hardware`, task wall times recorded by benchmarks/callback_plugins/task_timer;
   once against this machine's live /sys and /proc, once against the largest fixture tree.
   Target: numa_facts + gpu_topology_facts <= 0.5 x setup(hardware).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures"))

import trees  # noqa: E402  (tests/unit/fixtures/trees.py, stdlib only)

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu  # noqa: E402
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import (  # noqa: E402
    read_numa_facts,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader  # noqa: E402

TARGET_RATIO = 0.5


def machine_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            model = next(
                (line.split(":", 1)[1].strip() for line in handle if "model name" in line), ""
            )
    except OSError:
        pass
    ansible = subprocess.run(
        [str(ROOT / ".venv/bin/ansible"), "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "ansible": ansible[0] if ansible else "",
        "kernel": platform.release(),
    }


def count_files(root: str) -> int:
    return sum(len(files) for dummy, dummy2, files in os.walk(root))


def bench_core(scratch: str, runs: int) -> list:
    rows = []
    for machine in trees.MACHINES:
        root = trees.materialize(machine, os.path.join(scratch, "core", machine))
        timings = []
        for dummy in range(runs):
            start = time.perf_counter()
            reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
            facts = read_numa_facts(reader)
            node_cpus = {node["id"]: node["cpus"] for node in facts["nodes"]}
            gpu.read_gpus(reader, node_cpus)
            timings.append(time.perf_counter() - start)
        rows.append(
            {
                "machine": machine,
                "files": count_files(root),
                "cpus": len(facts["per_cpu"]),
                "nodes": len(facts["nodes"]),
                "median_ms": round(statistics.median(timings) * 1000, 2),
            }
        )
    return rows


def bench_ansible(scratch: str, label: str, sysfs: str, procfs: str, rounds: int) -> dict:
    times_file = os.path.join(scratch, f"times-{len(os.listdir(scratch))}.json")
    inventory = os.path.join(scratch, "inventory.ini")
    with open(inventory, "w", encoding="utf-8") as handle:
        handle.write(
            f"bench ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        )
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "benchmarks" / "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED="task_timer",
        NUMAFLEET_TASK_TIMES=times_file,
    )
    argv = [
        str(ROOT / ".venv/bin/ansible-playbook"),
        "-i",
        inventory,
        str(ROOT / "benchmarks" / "facts_bench.yml"),
        "-e",
        json.dumps(
            {"bench_rounds": rounds, "bench_sysfs_root": sysfs, "bench_procfs_root": procfs}
        ),
    ]
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=str(ROOT))
    with open(times_file, encoding="utf-8") as handle:
        rows = json.load(handle)
    per_task: dict = {}
    for row in rows:
        if row["task"].startswith("Bench "):
            per_task.setdefault(row["task"][6:], []).append(row["seconds"])
    medians = {task: statistics.median(values) for task, values in per_task.items()}
    ours = medians["numa_facts"] + medians["gpu_topology_facts"]
    return {
        "label": label,
        "sysfs_root": sysfs,
        "rounds": rounds,
        "median_s": {task: round(value, 3) for task, value in medians.items()},
        "ours_s": round(ours, 3),
        "ratio": round(ours / medians["setup hardware"], 3),
        # Ansible's own floor for one module execution on this host: a task of ping.
        "floor_ratio": round(2 * medians["ping"] / medians["setup hardware"], 3),
        # The work each side adds above that floor: (ours - 2 pings) / (setup - 1 ping).
        "above_floor_ratio": round(
            (ours - 2 * medians["ping"]) / (medians["setup hardware"] - medians["ping"]), 3
        ),
        "target": TARGET_RATIO,
        "met": ours / medians["setup hardware"] <= TARGET_RATIO,
    }


def write_markdown(path: Path, result: dict) -> None:
    info = result["machine"]
    lines = [
        "# Facts benchmark",
        "",
        f"Machine: {info['cpus']} CPUs ({info['cpu_model']}), Python {info['python']}, "
        f"{info['ansible']}, kernel {info['kernel']}, {info['date_utc']}.",
        "",
        "## Ansible tasks (median wall seconds per task, same play, interleaved)",
        "",
        "| tree | numa_facts | gpu_topology_facts | ours | setup hardware | ping | ratio | "
        "2 x ping / setup | above floor | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["ansible"]:
        med = run["median_s"]
        lines.append(
            f"| {run['label']} | {med['numa_facts']} | {med['gpu_topology_facts']} | "
            f"{run['ours_s']} | {med['setup hardware']} | {med['ping']} | {run['ratio']} | "
            f"{run['floor_ratio']} | {run['above_floor_ratio']} | <= {run['target']} "
            f"| {'yes' if run['met'] else 'NO'} |"
        )
    lines += [
        "",
        "ping is Ansible's own floor for one module execution on this host; two module",
        "executions cost at least `2 x ping / setup` of setup's time. `above floor` compares the",
        "work each side adds above that floor: (ours - 2 x ping) / (setup - ping).",
        "",
        "## Core readers in-process (numa facts + GPU sysfs readers, median ms)",
        "",
        "| tree | files | CPUs | nodes | ms |",
        "|---|---|---|---|---|",
    ]
    for row in result["core"]:
        lines.append(
            f"| {row['machine']} | {row['files']} | {row['cpus']} | {row['nodes']} | "
            f"{row['median_ms']} |"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the 3 tasks")
    parser.add_argument("--core-runs", type=int, default=20, help="in-process runs per tree")
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="numafleet-bench-") as scratch:
        core = bench_core(scratch, args.core_runs)
        largest = max(core, key=lambda row: row["files"])["machine"]
        large_root = trees.materialize(largest, os.path.join(scratch, "ansible", largest))
        ansible = [
            bench_ansible(scratch, "live /sys (this machine)", "/sys", "/proc", args.rounds),
            bench_ansible(
                scratch,
                f"largest fixture ({largest})",
                os.path.join(large_root, "sys"),
                os.path.join(large_root, "proc"),
                args.rounds,
            ),
        ]
    result = {"machine": machine_info(), "ansible": ansible, "core": core}
    (out / "facts.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_markdown(out / "facts.md", result)
    print((out / "facts.md").read_text(encoding="utf-8"))
    return 0 if all(run["met"] for run in ansible) else 1


if __name__ == "__main__":
    sys.exit(main())
