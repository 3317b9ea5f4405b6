"""Benchmark: site.yml with Ansible's linear strategy against mitogen's ``mitogen_linear``.

    /tmp/mitogen-venv/bin/python benchmarks/mitogen_compare.py \
        --venv /tmp/mitogen-venv [--hosts 20,50] [--forks 5]

mitogen is never a dependency of this collection: install it in a separate virtual environment
with the same ansible-core pin as requirements-dev.txt (plus PyYAML), for example
``python3.11 -m venv /tmp/mitogen-venv && /tmp/mitogen-venv/bin/pip install
ansible-core==<pin> mitogen pyyaml``, and pass that environment with ``--venv``. Both strategies
run from that one environment, so they differ only in the strategy.

The fleet is benchmarks/fleet.py's (the demo fleet cloned to N hosts, render mode,
``ansible_connection: local``), built and run with its helpers. For every fleet size, in one run:
a one-task ``ansible.builtin.ping`` play and site.yml (first run, fresh scratch trees) with the
linear strategy, then the same two with ``mitogen_linear``, then the linear ping again (the
floor is the mean of the two linear pings).

Writes ``<out>.json`` and ``<out>.md`` (default benchmarks/results/mitogen).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fleet  # noqa: E402  (benchmarks/fleet.py: Fleet, run_playbook, PING_PLAY)
from facts import machine_info  # noqa: E402  (benchmarks/facts.py)


def mitogen_strategy_dir(python: Path) -> str:
    """The ansible_mitogen/plugins/strategy directory of the mitogen installed for ``python``."""
    code = "import ansible_mitogen, os; print(os.path.dirname(ansible_mitogen.__file__))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return str(Path(out.stdout.strip()) / "plugins" / "strategy")


def versions(python: Path) -> dict:
    """ansible-core and mitogen versions installed for ``python``."""
    code = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({n: m.version(n) for n in ('ansible-core', 'mitogen')}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run(work: Path, the_fleet, playbook: Path, label: str, forks: int, strategy: str) -> dict:
    """fleet.run_playbook with ANSIBLE_STRATEGY set for this run only."""
    saved = os.environ.get("ANSIBLE_STRATEGY")
    os.environ["ANSIBLE_STRATEGY"] = strategy
    try:
        result = fleet.run_playbook(the_fleet, playbook, label, forks)
    finally:
        if saved is None:
            os.environ.pop("ANSIBLE_STRATEGY", None)
        else:
            os.environ["ANSIBLE_STRATEGY"] = saved
    result["strategy"] = strategy
    print(f"  {label}: {result['seconds']} s rc={result['rc']}", flush=True)
    return result


def bench(template: Path, work: Path, size: int, forks: int) -> dict:
    """Linear ping, linear site.yml, mitogen ping, mitogen site.yml, linear ping."""
    the_fleet = fleet.Fleet(work, template, size, sorted(fleet.trees.DEMO_HOSTS))
    ping = work / "ping.yml"
    ping.write_text(fleet.PING_PLAY)
    runs = [run(work, the_fleet, ping, "ping-linear-before", forks, "linear")]
    runs.append(run(work, the_fleet, ROOT / "site.yml", "site-linear", forks, "linear"))
    the_fleet.fresh_trees()
    runs.append(run(work, the_fleet, ping, "ping-mitogen", forks, "mitogen_linear"))
    runs.append(run(work, the_fleet, ROOT / "site.yml", "site-mitogen", forks, "mitogen_linear"))
    runs.append(run(work, the_fleet, ping, "ping-linear-after", forks, "linear"))
    by = {r["label"]: r for r in runs}
    floor = (by["ping-linear-before"]["seconds"] + by["ping-linear-after"]["seconds"]) / 2
    failed = sorted(r["label"] for r in runs if r["rc"] != 0)
    tails = {}
    for label in failed:
        lines = (work / f"{label}.log").read_text(errors="replace").splitlines()
        tails[label] = lines[-15:]
    return {
        "hosts": size,
        "ping_linear_s": round(floor, 2),
        "site_linear_s": by["site-linear"]["seconds"],
        "ping_mitogen_s": by["ping-mitogen"]["seconds"],
        "site_mitogen_s": by["site-mitogen"]["seconds"],
        "failed_runs": failed,
        "failed_log_tails": tails,
        "runs": runs,
    }


def write_markdown(path: Path, result: dict) -> None:
    m = result["machine"]
    lines = [
        "# site.yml: linear strategy against mitogen_linear",
        "",
        f"Measured {m.get('date_utc')} on {m.get('cpus')} CPUs ({m.get('cpu_model')}), "
        f"forks {result['forks']}, one run each; ansible-core {result['versions']['ansible-core']}, "
        f"mitogen {result['versions']['mitogen']} (a separate virtual environment, never a "
        "dependency of the collection). Fleet: benchmarks/fleet.py's demo fleet clone "
        "(render mode, `ansible_connection: local`), fresh scratch trees for each site.yml run.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| hosts | ping (linear) | site.yml linear | ping (mitogen_linear) "
        "| site.yml mitogen_linear | mitogen / linear |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["sizes"]:
        ratio = row["site_mitogen_s"] / row["site_linear_s"] if row["site_linear_s"] else 0
        lines.append(
            f"| {row['hosts']} | {row['ping_linear_s']} s | {row['site_linear_s']} s "
            f"({row['site_linear_s'] / row['ping_linear_s']:.1f}x ping) "
            f"| {row['ping_mitogen_s']} s | {row['site_mitogen_s']} s "
            f"({row['site_mitogen_s'] / row['ping_linear_s']:.1f}x ping) | {ratio:.2f} |"
        )
    for row in result["sizes"]:
        for label, tail in row["failed_log_tails"].items():
            lines += ["", f"{row['hosts']} hosts, `{label}` failed (rc != 0); last lines:", "```"]
            lines += tail + ["```"]
    lines += ["", result.get("note", ""), ""]
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--venv", required=True, help="virtual environment with mitogen")
    parser.add_argument("--hosts", default="20,50")
    parser.add_argument("--forks", type=int, default=5)
    parser.add_argument("--out", default=str(fleet.RESULTS / "mitogen"))
    parser.add_argument("--note", default="", help="a paragraph appended to the markdown")
    args = parser.parse_args()
    venv = Path(args.venv)
    python = venv / "bin" / "python"
    fleet.PLAYBOOK = venv / "bin" / "ansible-playbook"
    os.environ["ANSIBLE_STRATEGY_PLUGINS"] = mitogen_strategy_dir(python)
    scratch = Path(tempfile.mkdtemp(prefix="numafleet-mitogen-"))
    template = scratch / "template"
    fleet.trees.materialize_demo(template)
    result = {
        "machine": machine_info(),
        "versions": versions(python),
        "forks": args.forks,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "note": args.note,
        "sizes": [],
    }
    for size in [int(s) for s in args.hosts.split(",") if s]:
        print(f"mitogen: {size} hosts", flush=True)
        result["sizes"].append(bench(template, scratch / f"fleet-{size}", size, args.forks))
    result["load_average_1m_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(out.with_suffix(".md"), result)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
