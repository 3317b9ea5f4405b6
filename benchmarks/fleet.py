"""Benchmark: site.yml, verify.yml and drift_check.yml on a generated demo fleet, against ping.

    .venv/bin/python benchmarks/fleet.py [--hosts 50,200,500] [--placements 1,8,32] [--forks N]

Writes benchmarks/results/fleet.json and benchmarks/results/fleet.md. The fleet is the demo fleet
(inventories/demo: ten recorded or synthetic machines, render mode, ``ansible_connection: local``)
cloned to N hosts: host ``<demo host>-NNN`` gets its own scratch copy of the demo host's topology
and GPU snapshot and the demo host's own host_vars. For every fleet size, in one run:

1. a one-task ``ansible.builtin.ping`` play on the same hosts (Ansible's own floor: one module
   execution per host), before and after the others (the mean of the two is the reference);
2. ``site.yml`` on fresh scratch trees (first run: everything is written);
3. for one size (--full-at, default the smallest): the second run (nothing changes), without and
   with the jsonfile fact cache the first run filled (README, "Large fleets"), then
   ``verify.yml`` and ``drift_check.yml``, and a play of four ping tasks: the floor of four module
   executions per host, which the 4 x target is about.

Each run counts module executions and host-tasks (task results, skipped ones included) per host
with benchmarks/callback_plugins/module_count.py.
Targets: site.yml (first run) <= 3 x ping at every size, the second run with the fact cache
<= 2 x ping, drift_check <= site.yml, verify <= 2.5 x ping, at most 8 host-tasks per host in
site.yml, and a flat cost per host from the smallest to the largest fleet (controller work
O(hosts)): site.yml's x ping at the largest size within 1.25 x of the smallest's.
The placements sweep runs site.yml (first run) on 20 hosts of the five largest machines with 1, 8
and 32 generated CPU placements each, to show how cost grows with placements.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trees  # noqa: E402  (tests/unit/fixtures/trees.py, stdlib only)
from facts import machine_info  # noqa: E402  (benchmarks/facts.py)

RESULTS = ROOT / "benchmarks" / "results"
DEMO_INVENTORY = ROOT / "inventories" / "demo"
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
TARGETS = {
    "site_first": 3.0,
    "site_second": 2.0,
    "verify": 2.5,
    "site_tasks_per_host": 8,
    "flat_cost": 1.25,
}
# Machines with room for 32 two-CPU placements (64 CPUs plus the reserved ones).
LARGE_HOSTS = ["arm-kunpeng-01", "epyc-nps4-01", "gpu-a100-01", "gpu-h100-01", "mi300x-01"]

PING_PLAY = """\
- name: Ansible's floor, one module execution per host
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""

PING4_PLAY = """\
- name: Four module executions per host, nothing else
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping 1
      ansible.builtin.ping:
    - name: Ping 2
      ansible.builtin.ping:
    - name: Ping 3
      ansible.builtin.ping:
    - name: Ping 4
      ansible.builtin.ping:
"""

GROUP_VARS = """\
ansible_connection: local
ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
demo_root: "{hosts_dir}/{{{{ inventory_hostname }}}}"
numafleet_sysfs_root: "{{{{ demo_root }}}}/sys"
numafleet_procfs_root: "{{{{ demo_root }}}}/proc"
numafleet_render_root: "{{{{ demo_root }}}}/root"
"""


def generated_placements(count: int) -> str:
    """host_vars text with ``count`` two-CPU, 1 GiB placements, no GPU (fits every LARGE_HOSTS)."""
    entries = [
        {
            "name": f"svc-{i:02d}",
            "exec": f"/opt/svc/bin/serve --port {8000 + i}",
            "cpus": 2,
            "memory": "1G",
        }
        for i in range(count)
    ]
    return "numafleet_placements: " + json.dumps(entries) + "\n"


class Fleet:
    """A generated inventory under ``work``: hosts cloned from the demo hosts ``bases``."""

    def __init__(self, work: Path, template: Path, size: int, bases: list, placements=None):
        self.work = work
        self.template = template
        self.inventory = work / "inventory"
        self.hosts_dir = work / "hosts"
        self.hosts = {}
        for i in range(size):
            base = bases[i % len(bases)]
            self.hosts[f"{base}-{i // len(bases):03d}"] = base
        shutil.rmtree(work, ignore_errors=True)
        (self.inventory / "host_vars").mkdir(parents=True)
        (self.inventory / "group_vars").mkdir()
        (self.inventory / "hosts.yml").write_text(
            json.dumps({"fleet": {"hosts": dict.fromkeys(self.hosts)}}, indent=1) + "\n"
        )
        (self.inventory / "group_vars" / "fleet.yml").write_text(
            GROUP_VARS.format(hosts_dir=self.hosts_dir)
        )
        for host, base in self.hosts.items():
            source = DEMO_INVENTORY / "host_vars" / f"{base}.yml"
            target = self.inventory / "host_vars" / f"{host}.yml"
            if placements is not None:
                # Generated placements; the demo host's recorded GPU state stays (render mode).
                own = yaml.safe_load(source.read_text()) if source.exists() else {}
                text = generated_placements(placements)
                if "numafleet_gpu_snapshot" in (own or {}):
                    text += f"numafleet_gpu_snapshot: {json.dumps(own['numafleet_gpu_snapshot'])}\n"
                target.write_text(text)
            elif source.exists():
                shutil.copyfile(source, target)
        self.fresh_trees()

    def fresh_trees(self) -> None:
        """Replace every host's scratch tree with a pristine copy (render root removed)."""
        shutil.rmtree(self.hosts_dir, ignore_errors=True)
        self.hosts_dir.mkdir()
        for host, base in self.hosts.items():
            subprocess.run(
                ["cp", "-a", str(self.template / base), str(self.hosts_dir / host)], check=True
            )


def run_playbook(fleet: Fleet, playbook: Path, label: str, forks: int, fact_cache=None) -> dict:
    """Run ``playbook`` on the fleet; wall seconds, rc, module executions per host."""
    log = fleet.work / f"{label}.modules.jsonl"
    counts = fleet.work / f"{label}.counts.json"
    for path in (log, counts):
        path.unlink(missing_ok=True)
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "benchmarks" / "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED="module_count",
        ANSIBLE_FORKS=str(forks),
        NUMAFLEET_MODULE_LOG=str(log),
        NUMAFLEET_MODULE_COUNTS=str(counts),
        NUMAFLEET_DRIFT_REPORT_DIR=str(fleet.work / "drift-reports"),
    )
    if fact_cache is not None:
        env.update(
            ANSIBLE_CACHE_PLUGIN="ansible.builtin.jsonfile",
            ANSIBLE_CACHE_PLUGIN_CONNECTION=str(fact_cache),
            ANSIBLE_CACHE_PLUGIN_TIMEOUT="86400",
        )
    argv = [str(PLAYBOOK), "-i", str(fleet.inventory), str(playbook)]
    started = time.monotonic()
    with open(fleet.work / f"{label}.log", "w", encoding="utf-8") as out:
        proc = subprocess.run(
            argv, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT, check=False
        )
    wall = time.monotonic() - started
    data = json.loads(counts.read_text()) if counts.exists() else {"per_host": {}, "hosts": {}}
    per_host = data["per_host"]
    tasks = data.get("tasks_per_host", {})
    by_base = {}
    for host, total in per_host.items():
        by_base.setdefault(fleet.hosts.get(host, host), set()).add(total)
    return {
        "label": label,
        "playbook": str(playbook.relative_to(ROOT)) if playbook.is_relative_to(ROOT) else "ping",
        "rc": proc.returncode,
        "seconds": round(wall, 2),
        "modules_total": sum(per_host.values()),
        "modules_per_host_mean": round(statistics.mean(per_host.values()), 2) if per_host else 0,
        "modules_per_host_max": max(per_host.values(), default=0),
        "tasks_per_host_mean": round(statistics.mean(tasks.values()), 1) if tasks else 0,
        "modules_by_demo_host": {b: sorted(v) for b, v in sorted(by_base.items())},
        "modules_by_name": _by_module(data["hosts"]),
    }


def _by_module(hosts: dict) -> dict:
    total = {}
    for counter in hosts.values():
        for module, count in counter.items():
            total[module] = total.get(module, 0) + count
    return dict(sorted(total.items()))


def bench_size(template: Path, work: Path, size: int, forks: int, full: bool) -> dict:
    """Ping, site.yml (first run), ping; with ``full`` also the second runs, verify and drift."""
    bases = sorted(trees.DEMO_HOSTS)
    fleet = Fleet(work, template, size, bases)
    ping = work / "ping.yml"
    ping.write_text(PING_PLAY)
    cache = work / "fact-cache" if full else None
    runs = [run_playbook(fleet, ping, "ping-before", forks)]
    runs.append(run_playbook(fleet, ROOT / "site.yml", "site-first", forks, fact_cache=cache))
    if full:
        runs.append(run_playbook(fleet, ROOT / "site.yml", "site-second", forks))
        runs.append(run_playbook(fleet, ROOT / "site.yml", "site-second-cached", forks, cache))
        runs.append(run_playbook(fleet, ROOT / "playbooks" / "verify.yml", "verify", forks))
        drift = ROOT / "playbooks" / "drift_check.yml"
        runs.append(run_playbook(fleet, drift, "drift_check", forks))
        ping4 = work / "ping4.yml"
        ping4.write_text(PING4_PLAY)
        runs.append(run_playbook(fleet, ping4, "ping-x4", forks))
    runs.append(run_playbook(fleet, ping, "ping-after", forks))
    return summarise(size, None, runs)


def bench_placements(template: Path, work: Path, size: int, count: int, forks: int) -> dict:
    fleet = Fleet(work, template, size, LARGE_HOSTS, placements=count)
    ping = work / "ping.yml"
    ping.write_text(PING_PLAY)
    runs = [run_playbook(fleet, ping, "ping-before", forks)]
    runs.append(run_playbook(fleet, ROOT / "site.yml", "site-first", forks))
    runs.append(run_playbook(fleet, ping, "ping-after", forks))
    return summarise(size, count, runs)


def summarise(size: int, placements, runs: list) -> dict:
    by_label = {r["label"]: r for r in runs}
    ping = statistics.mean([by_label["ping-before"]["seconds"], by_label["ping-after"]["seconds"]])
    for run in runs:
        run["x_ping"] = round(run["seconds"] / ping, 2)
    result = {"hosts": size, "placements": placements, "ping_seconds": round(ping, 2), "runs": runs}
    checks = {}
    if "site-first" in by_label:
        checks["site_first_x_ping"] = (by_label["site-first"]["x_ping"], TARGETS["site_first"])
    if "site-second" in by_label:
        best = min(
            by_label[k]["x_ping"] for k in ("site-second", "site-second-cached") if k in by_label
        )
        checks["site_second_x_ping"] = (best, TARGETS["site_second"])
    if "drift_check" in by_label:
        checks["drift_x_site"] = (
            round(by_label["drift_check"]["seconds"] / by_label["site-first"]["seconds"], 2),
            1.0,
        )
    if "verify" in by_label:
        checks["verify_x_ping"] = (by_label["verify"]["x_ping"], TARGETS["verify"])
    if "site-first" in by_label:
        checks["site_tasks_per_host"] = (
            by_label["site-first"]["tasks_per_host_mean"],
            TARGETS["site_tasks_per_host"],
        )
    result["checks"] = {k: {"value": v, "target": t, "met": v <= t} for k, (v, t) in checks.items()}
    return result


def _flat_cost(sizes: list):
    """site.yml's x ping at the largest fleet over that at the smallest (1.0: the same cost per
    host, each against its own ping; above TARGETS["flat_cost"]: super-linear controller work)."""
    firsts = [
        (entry["hosts"], run["x_ping"])
        for entry in sizes
        for run in entry["runs"]
        if run["label"] == "site-first"
    ]
    if len(firsts) < 2:
        return None
    (small, small_x), (large, large_x) = min(firsts), max(firsts)
    value = round(large_x / small_x, 2)
    return {
        "from_hosts": small,
        "to_hosts": large,
        "value": value,
        "target": TARGETS["flat_cost"],
        "met": value <= TARGETS["flat_cost"],
    }


def _floor_lines(runs: list) -> list:
    """Why a x-ping target is missed: what four bare module executions cost next to site.yml."""
    by_label = {r["label"]: r for r in runs}
    floor, site = by_label.get("ping-x4"), by_label.get("site-first")
    if not (floor and site):
        return []
    return [
        f"- floor: four ping tasks (four module executions per host, nothing else) cost "
        f"{floor['x_ping']}x ping; site.yml runs {site['modules_per_host_mean']} module executions "
        f"and {site.get('tasks_per_host_mean', '?')} tasks per host, each of its modules costing "
        "more than ping (the collection code it imports is compiled on every execution), and each "
        "controller task adding its own share."
    ]


def write_markdown(path: Path, result: dict) -> None:
    m = result["machine"]
    lines = [
        "# Fleet benchmark",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, {m['ansible']}, "
        f"kernel {m['kernel']}, {m['date_utc']}. forks={result['forks']}, "
        "`ansible_connection: local`, render mode (the demo fleet's settings).",
        "",
        "`x ping` divides a run's wall time by the mean of a one-task `ansible.builtin.ping` play",
        "on the same hosts before and after (Ansible's floor: one module execution per host).",
        "`modules/host` counts module executions (AnsiballZ runs) per host with",
        "benchmarks/callback_plugins/module_count.py; controller-only tasks are not counted.",
        "`tasks/host` counts host-tasks (every task result of a host, skipped ones included).",
        "`ping-x4` is a play of four ping tasks: four module executions per host and nothing else.",
        "",
    ]
    for entry in result["sizes"] + result["placements"]:
        title = f"## {entry['hosts']} hosts"
        if entry["placements"] is not None:
            title += f", {entry['placements']} generated placements each (five largest machines)"
        else:
            title += " (demo fleet cloned, the demo's own placements)"
        lines += [
            title,
            "",
            "| run | rc | seconds | x ping | modules/host mean | max | tasks/host | per demo host |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for run in entry["runs"]:
            per = ", ".join(
                f"{b} {'/'.join(map(str, v))}" for b, v in run["modules_by_demo_host"].items()
            )
            lines.append(
                f"| {run['label']} | {run['rc']} | {run['seconds']} | {run['x_ping']} | "
                f"{run['modules_per_host_mean']} | {run['modules_per_host_max']} | "
                f"{run.get('tasks_per_host_mean', '')} | {per} |"
            )
        lines.append("")
        for name, check in entry["checks"].items():
            met = "met" if check["met"] else "NOT met"
            lines.append(f"- {name}: {check['value']} (target <= {check['target']}): {met}")
        lines += _floor_lines(entry["runs"])
        lines.append("")
    flat = result.get("flat_cost")
    if flat:
        met = "met" if flat["met"] else "NOT met"
        lines += [
            "## Cost per host across fleet sizes",
            "",
            f"- site.yml first run, x ping at {flat['to_hosts']} hosts over x ping at "
            f"{flat['from_hosts']} hosts: {flat['value']} (target <= {flat['target']}): {met}",
            "",
        ]
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", default="50,200,500", help="fleet sizes, comma separated")
    parser.add_argument("--placements", default="1,8,32", help="placements sweep ('' for none)")
    parser.add_argument("--placements-hosts", type=int, default=20)
    parser.add_argument(
        "--full-at", type=int, help="fleet size that also gets the cached, verify and drift runs"
    )
    parser.add_argument("--forks", type=int, default=5)
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    parser.add_argument("--out", default=str(RESULTS / "fleet"), help="results path without suffix")
    args = parser.parse_args()
    sizes = [int(s) for s in args.hosts.split(",") if s]
    counts = [int(s) for s in args.placements.split(",") if s]
    scratch = Path(args.work or tempfile.mkdtemp(prefix="numafleet-fleet-"))
    template = scratch / "template"
    trees.materialize_demo(template)
    result = {"machine": machine_info(), "forks": args.forks, "sizes": [], "placements": []}
    for size in sizes:
        print(f"fleet: {size} hosts", flush=True)
        full = size == (args.full_at or min(sizes))
        work = scratch / f"fleet-{size}"
        result["sizes"].append(bench_size(template, work, size, args.forks, full))
    for count in counts:
        print(f"fleet: {args.placements_hosts} hosts x {count} placements", flush=True)
        result["placements"].append(
            bench_placements(
                template, scratch / f"placements-{count}", args.placements_hosts, count, args.forks
            )
        )
    flat = _flat_cost(result["sizes"])
    if flat is not None:
        result["flat_cost"] = flat
    result["load_average_1m_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(out.with_suffix(".md"), result)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
