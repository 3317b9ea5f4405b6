"""Benchmark: numa_facts (gpu: true) against setup's hardware subset, and our parse against hwloc.

    .venv/bin/python benchmarks/facts.py [--rounds N] [--core-runs N] [--process-runs N]

Writes benchmarks/results/facts.json and benchmarks/results/facts.md. Three parts, same run:

1. core: on every fixture tree, the sysfs work of one numa_facts gpu=true execution, in-process:
   read_numa_facts, then the GPU pass (read_gpu_topology through a sibling reader, NVML
   unavailable), median of runs. Next to it the same as a fresh Python process
   (``python -c``, start-up and imports included), and hwloc's ``lstopo-no-graphics --of xml``
   reading the same tree (HWLOC_FSROOT=<tree>, HWLOC_COMPONENTS=linux,stop, as hwloc's
   documentation asks for a foreign fsroot). Target: ours (in-process) / lstopo <= 1.0.
2. ansible: one play on localhost interleaving ONE numa_facts task with gpu: true and
   state_paths, the two-module way (numa_facts + gpu_topology_facts), `setup
   gather_subset=hardware` and ping; task wall times recorded by
   benchmarks/callback_plugins/task_timer; once against this machine's live /sys and /proc,
   once against the largest fixture tree. Target: numa_facts gpu=true <= 0.5 x setup(hardware).
3. module cost: what one numa_facts gpu=true execution pays on top of ping on the target, in
   Python compile time of the collection files it imports (AnsiballZ ships sources) and the
   pynvml import it avoids on a host without libnvidia-ml.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
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
CORE_TARGET_RATIO = 1.0
LSTOPO = "lstopo-no-graphics"
# The files the playbooks pass as state_paths (absent on this machine: the lookup still runs).
STATE_PATHS = ["/etc/numafleet/mig.json", "/etc/numafleet/mps-units.json"]
# The collection files numa_facts gpu=true imports, in import order.
MODULE_FILES = [
    "plugins/modules/numa_facts.py",
    "plugins/module_utils/numa/errors.py",
    "plugins/module_utils/numa/cpulist.py",
    "plugins/module_utils/numa/sysfs.py",
    "plugins/module_utils/numa/topology.py",
    "plugins/module_utils/numa/pci.py",
    "plugins/module_utils/numa/facts.py",
    "plugins/module_utils/numa/gpu.py",
]
# What one numa_facts gpu=true run computes from sysfs, in a fresh process (ours as a process).
PROCESS_SNIPPET = """
import sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader
reader = Reader(sys.argv[2] + "/sys", sys.argv[2] + "/proc", remember=True)
read_numa_facts(reader)
gpu.read_gpu_topology(reader.sibling(), gpu.nvml_unavailable("benchmark"))
"""


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
        "load_1min": round(os.getloadavg()[0], 2),
    }


def count_files(root: str) -> int:
    return sum(len(files) for dummy, dummy2, files in os.walk(root))


def core_parse(root: str) -> dict:
    """The sysfs part of one numa_facts gpu=true execution on the tree at ``root``."""
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"), remember=True)
    facts = read_numa_facts(reader)
    gpu.read_gpu_topology(reader.sibling(), gpu.nvml_unavailable("benchmark"))
    return facts


def lstopo_version() -> str:
    path = shutil.which(LSTOPO)
    if path is None:
        return ""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def time_process(argv: list, env: dict = None) -> tuple:
    """(CPU seconds, wall seconds, exit status, first stderr line) of one run of ``argv``.

    CPU is the child's user + system time: on a shared machine it moves far less with the load
    than the wall time does.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return cpu, wall, done.returncode, lines[0] if lines else ""


def _ms(values: list) -> float:
    return round(statistics.median(values) * 1000, 2)


def bench_core(scratch: str, runs: int, process_runs: int) -> list:
    lstopo = shutil.which(LSTOPO)
    # Ours as a process runs from cached bytecode, as an installed program does (kept under
    # scratch, so nothing is written into the checkout), even where PYTHONDONTWRITEBYTECODE is set.
    python_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    python_env["PYTHONPYCACHEPREFIX"] = os.path.join(scratch, "pycache")
    rows = []
    for machine in trees.MACHINES:
        root = trees.materialize(machine, os.path.join(scratch, "core", machine))
        core_parse(root)  # warm the page cache and the imports
        cpu, wall = [], []
        for dummy in range(runs):
            start, start_cpu = time.perf_counter(), time.process_time()
            facts = core_parse(root)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start)
        process_cpu, process_wall, hwloc_cpu, hwloc_wall, hwloc_failure = [], [], [], [], None
        env = dict(os.environ, HWLOC_FSROOT=root, HWLOC_COMPONENTS="linux,stop")
        ours_argv = [sys.executable, "-c", PROCESS_SNIPPET, str(ROOT / ".collections"), root]
        time_process(ours_argv, python_env)  # writes the bytecode cache
        for dummy in range(process_runs):  # interleaved, so load changes hit both alike
            seconds, elapsed, dummy2, dummy3 = time_process(ours_argv, python_env)
            process_cpu.append(seconds)
            process_wall.append(elapsed)
            if lstopo:
                seconds, elapsed, status, first = time_process([lstopo, "--of", "xml"], env)
                if status != 0:
                    hwloc_failure = f"exit status {status}: {first}"
                hwloc_cpu.append(seconds)
                hwloc_wall.append(elapsed)
        pci_dir = os.path.join(root, "sys", "bus", "pci", "devices")
        row = {
            "machine": machine,
            "files": count_files(root),
            "cpus": len(facts["per_cpu"]),
            "nodes": len(facts["nodes"]),
            "pci_functions": len(os.listdir(pci_dir)) if os.path.isdir(pci_dir) else 0,
            "median_ms": _ms(cpu),
            "wall_median_ms": _ms(wall),
            "process_median_ms": _ms(process_cpu),
            "process_wall_median_ms": _ms(process_wall),
            "lstopo_median_ms": None,
            "lstopo_wall_median_ms": None,
            "ratio": None,
            "process_ratio": None,
            "lstopo_failure": hwloc_failure,
        }
        if hwloc_cpu and hwloc_failure is None:
            row["lstopo_median_ms"] = _ms(hwloc_cpu)
            row["lstopo_wall_median_ms"] = _ms(hwloc_wall)
            row["ratio"] = round(row["median_ms"] / row["lstopo_median_ms"], 3)
            row["process_ratio"] = round(row["process_median_ms"] / row["lstopo_median_ms"], 3)
        rows.append(row)
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
            {
                "bench_rounds": rounds,
                "bench_sysfs_root": sysfs,
                "bench_procfs_root": procfs,
                "bench_state_paths": STATE_PATHS,
            }
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
    ours, setup, ping = medians["numa_facts gpu"], medians["setup hardware"], medians["ping"]
    two = medians["numa_facts"] + medians["gpu_topology_facts"]
    return {
        "label": label,
        "sysfs_root": sysfs,
        "rounds": rounds,
        "median_s": {task: round(value, 3) for task, value in medians.items()},
        "ours_s": round(ours, 3),
        "two_modules_s": round(two, 3),
        "above_ping_s": round(ours - ping, 3),
        "ratio": round(ours / setup, 3),
        "two_modules_ratio": round(two / setup, 3),
        # Ansible's own floor for one module execution on this host: a task of ping.
        "floor_ratio": round(ping / setup, 3),
        # The work each side adds above that floor: (ours - ping) / (setup - ping).
        "above_floor_ratio": round((ours - ping) / (setup - ping), 3),
        "target": TARGET_RATIO,
        "met": ours / setup <= TARGET_RATIO,
    }


_COMPILE_SNIPPET = """
import json, sys, time
out = {}
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    start = time.perf_counter()
    compile(source, path, "exec")
    out[path] = time.perf_counter() - start
print(json.dumps(out))
"""
_PYNVML_SNIPPET = """
import time, sys
import ansible.module_utils.basic  # what every module has imported before its own imports
start = time.perf_counter()
try:
    import pynvml
except ImportError:
    print("null"); sys.exit(0)
print(time.perf_counter() - start)
"""


def bench_module_cost(runs: int) -> dict:
    """Compile time of the collection files numa_facts gpu=true imports, and pynvml's import."""
    paths = [str(ROOT / name) for name in MODULE_FILES]
    compiles: dict = {name: [] for name in MODULE_FILES}
    pynvml_import = []
    for dummy in range(runs):  # fresh processes: no compile cache, nothing imported yet
        out = subprocess.run(
            [sys.executable, "-c", _COMPILE_SNIPPET, *paths],
            capture_output=True,
            text=True,
            check=True,
        )
        for name, seconds in zip(MODULE_FILES, json.loads(out.stdout).values(), strict=True):
            compiles[name].append(seconds)
        out = subprocess.run(
            [sys.executable, "-c", _PYNVML_SNIPPET], capture_output=True, text=True, check=True
        )
        value = json.loads(out.stdout)
        if value is not None:
            pynvml_import.append(value)
    files = [
        {
            "file": name,
            "lines": (ROOT / name).read_text(encoding="utf-8").count("\n"),
            "compile_ms": round(statistics.median(values) * 1000, 2),
        }
        for name, values in compiles.items()
    ]
    return {
        "files": files,
        "compile_ms_total": round(sum(row["compile_ms"] for row in files), 2),
        # zipimport (Python <= 3.12) compiles a module's source once to find its file name and
        # again to run it: what an AnsiballZ run pays for these files.
        "zipimport_compile_ms": round(2 * sum(row["compile_ms"] for row in files), 2),
        "pynvml_import_ms": round(statistics.median(pynvml_import) * 1000, 2)
        if pynvml_import
        else None,
    }


def _fmt(value, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value}{suffix}"


def write_markdown(path: Path, result: dict) -> None:
    info = result["machine"]
    lines = [
        "# Facts benchmark",
        "",
        f"Machine: {info['cpus']} CPUs ({info['cpu_model']}), Python {info['python']}, "
        f"{info['ansible']}, kernel {info['kernel']}, load {info['load_1min']} at the start, "
        f"{info['date_utc']}.",
        "",
        "## 1. Ansible tasks (median wall seconds per task, same play, interleaved)",
        "",
        "`numa_facts gpu` is the one task the playbooks run: numa_facts with gpu: true and",
        "state_paths. `two modules` is numa_facts + gpu_topology_facts, the way before.",
        "",
        "| tree | numa_facts gpu | above ping | two modules | setup hardware | ping | ratio | "
        "two modules ratio | ping / setup | above floor | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["ansible"]:
        med = run["median_s"]
        lines.append(
            f"| {run['label']} | {run['ours_s']} | {run['above_ping_s']} | "
            f"{run['two_modules_s']} | {med['setup hardware']} | {med['ping']} | {run['ratio']} | "
            f"{run['two_modules_ratio']} | {run['floor_ratio']} | {run['above_floor_ratio']} | "
            f"<= {run['target']} | {'yes' if run['met'] else 'NO'} |"
        )
    cost = result["module_cost"]
    lines += [
        "",
        "ping is Ansible's own floor for one module execution on this host (`ping / setup`);",
        "`above floor` compares the work each side adds above it: (ours - ping) / (setup - ping).",
        "",
        "### Where numa_facts' time above ping goes",
        "",
        "AnsiballZ ships the module and the module_utils it imports as Python sources in a zip;",
        "zipimport (Python <= 3.12) compiles each imported source twice (once to name the file,",
        "once to run it), in every execution. The files numa_facts gpu=true imports:",
        "",
        "| file | lines | compile ms |",
        "|---|---|---|",
    ]
    lines += [f"| {row['file']} | {row['lines']} | {row['compile_ms']} |" for row in cost["files"]]
    lines += [
        "",
        f"Compiled twice per execution: {cost['zipimport_compile_ms']} ms. Making the frozen "
        "dataclasses and regular expressions of those files adds a few ms more.",
        f"`import pynvml` after Ansible's own imports: {_fmt(cost['pynvml_import_ms'], ' ms')}; "
        "numa_facts and gpu_topology_facts skip it where libnvidia-ml.so.1 does not load (its "
        "nvmlInit could only fail; the facts carry the same reason).",
    ]
    gpu_ms = next(row["compile_ms"] for row in cost["files"] if row["file"].endswith("/gpu.py"))
    numa_only_ms = round(2 * (cost["compile_ms_total"] - gpu_ms), 1)
    for run in result["ansible"]:
        if run["met"]:
            continue
        med = run["median_s"]
        budget = round(run["target"] * med["setup hardware"] - med["ping"], 3)
        plain = round(med["numa_facts"] - med["ping"], 3)
        lines += [
            "",
            f"{run['label']}: the {run['target']} x target is not met. ping alone is "
            f"{run['floor_ratio']} x of setup hardware here, which leaves {budget} s above "
            f"ping for the module's own work; numa_facts gpu=true uses {run['above_ping_s']} s, "
            f"and numa_facts without gpu already {plain} s in the same play. Compiling the NUMA "
            f"files (all but gpu.py) twice per execution takes {numa_only_ms} ms, gpu.py "
            f"{round(2 * gpu_ms, 1)} ms more; the rest is making the frozen dataclasses, "
            "reading the host and Ansible's own argument and result handling.",
        ]
    lines += [
        "",
        "## 2. Our parse against hwloc (median CPU ms per tree)",
        "",
        f"hwloc: {result['lstopo'] or 'lstopo-no-graphics is not installed: no comparison'}. "
        "`ours` is the sysfs work of one numa_facts gpu=true execution in-process (NUMA facts, "
        "then the GPU pass reusing what the first pass read); `ours as process` is the same in a "
        "fresh `python -c` (start-up and imports from cached bytecode included); `lstopo` is "
        "`HWLOC_FSROOT=<tree> HWLOC_COMPONENTS=linux,stop lstopo-no-graphics --of xml`, a "
        "process too. Times are CPU time (user + system; a child's from getrusage), which the "
        "other work on this shared machine moves far less than wall time; wall medians are in "
        "facts.json. Target: ours / lstopo <= 1.0.",
        "",
        "| tree | files | CPUs | nodes | PCI functions | ours ms | ours as process ms | "
        "lstopo ms | ours / lstopo | ours as process / lstopo |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["core"]:
        lines.append(
            f"| {row['machine']} | {row['files']} | {row['cpus']} | {row['nodes']} | "
            f"{row['pci_functions']} | {row['median_ms']} | {row['process_median_ms']} | "
            f"{_fmt(row['lstopo_median_ms'])} | {_fmt(row['ratio'])} | "
            f"{_fmt(row['process_ratio'])} |"
        )
    over = [row for row in result["core"] if row["ratio"] is not None and row["ratio"] > 1.0]
    if over:
        lines += [
            "",
            f"Above 1.0 on {len(over)} of {len(result['core'])} trees: "
            + ", ".join(f"{row['machine']} ({row['ratio']})" for row in over)
            + ". Those are the trees with the most CPUs or PCI functions, where the cost is "
            "per file: ours is a stat (anything but a regular file is refused before it is "
            "opened), an open, a read and a close for each file, plus the Python around them; "
            "lstopo, in C, opens without a stat first. It tries more files than we read "
            "(strace, hwloc 2.9 on synthetic-8xh100-2s: about 4,000 opens, 3,400 of them for "
            "files the tree lacks), but each costs it a few microseconds.",
        ]
    failures = [row for row in result["core"] if row["lstopo_failure"]]
    if failures:
        lines += ["", "lstopo failed on: " + "; ".join(
            f"{row['machine']} ({row['lstopo_failure']})" for row in failures
        )]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the tasks")
    parser.add_argument("--core-runs", type=int, default=20, help="in-process runs per tree")
    parser.add_argument(
        "--process-runs", type=int, default=11, help="lstopo and python -c runs per tree"
    )
    parser.add_argument("--skip-ansible", action="store_true", help="only parts 1 and 3")
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    with tempfile.TemporaryDirectory(prefix="numafleet-bench-") as scratch:
        core = bench_core(scratch, args.core_runs, args.process_runs)
        ansible = []
        if not args.skip_ansible:
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
    result = {
        "machine": info,
        "ansible": ansible,
        "module_cost": bench_module_cost(args.process_runs),
        "lstopo": lstopo_version(),
        "core": core,
    }
    (out / "facts.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_markdown(out / "facts.md", result)
    print((out / "facts.md").read_text(encoding="utf-8"))
    core_met = all(row["ratio"] is None or row["ratio"] <= CORE_TARGET_RATIO for row in core)
    return 0 if all(run["met"] for run in ansible) and core_met else 1


if __name__ == "__main__":
    sys.exit(main())
