"""Helpers of the numa_vm scenario's testinfra tests (run by `molecule verify`).

Molecule runs pytest from the scenario folder with MOLECULE_* set and testinfra's ansible
connection on its inventory. Figures measured here (off-node shares, hugepage pools, timings) are
written to reports/numa_vm/figures.json in the checkout, for the record.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import yaml

REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
FIGURES_FILE = REPO / "reports" / "numa_vm" / "figures.json"
HOST = "numa-vm"
NVME = "0000:81:00.0"
# What molecule.yml places; the tests assert the kernel's view of it.
EXPECTED = {
    "numa-bound": {"cpus": "2-3", "mems": "1", "node": 1, "hugepages": 32},
    "cpu-only": {"cpus": "1", "mems": "0", "node": 0, "hugepages": 0},
}
HUGEPAGE_POOLS = {0: 8, 1: 32}  # 2 MiB pages per node: extra on node 0, numa-bound's on node 1

_figures: dict = {}


def record(key: str, value) -> None:
    """Keep one measured figure for reports/numa_vm/figures.json."""
    _figures[key] = value


def write_figures() -> None:
    """Merge the figures recorded in this run into reports/numa_vm/figures.json."""
    FIGURES_FILE.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(FIGURES_FILE.read_text()) if FIGURES_FILE.exists() else {}
    old.update(_figures)
    FIGURES_FILE.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


def unit(name: str) -> str:
    return f"numafleet-{name}.service"


def main_pid(host, name: str) -> int:
    pid = int(host.check_output(f"systemctl show -p MainPID --value {unit(name)}"))
    assert pid > 0, f"{unit(name)} has no main PID"
    return pid


def status_field(host, pid: int, field: str) -> str:
    for line in host.file(f"/proc/{pid}/status").content_string.splitlines():
        key, dummy, value = line.partition(":")
        if key == field:
            return value.strip()
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def pages_by_node(numa_maps: str) -> dict:
    """{'anon': {node: pages}, 'huge': {node: pages}} from /proc/PID/numa_maps text.

    A mapping counts as huge when it says `huge`, as anonymous when it says `anon=` (private
    anonymous pages, heap and stack included); N<node>=<pages> are that mapping's pages per node.
    """
    out = {"anon": {}, "huge": {}}
    for line in numa_maps.splitlines():
        fields = line.split()
        kind = (
            "huge"
            if "huge" in fields
            else "anon"
            if any(f.startswith("anon=") for f in fields)
            else None
        )
        if kind is None:
            continue
        for field in fields:
            if field.startswith("N") and "=" in field:
                node, pages = field[1:].split("=")
                out[kind][int(node)] = out[kind].get(int(node), 0) + int(pages)
    return out


def wait_until_touched(host, name: str, timeout_s: float = 240) -> int:
    """Main PID of the unit once its current invocation logged `touched:` (memory all faulted in)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        invocation = host.check_output(f"systemctl show -p InvocationID --value {unit(name)}")
        if invocation:
            log = host.run(f"journalctl -o cat _SYSTEMD_INVOCATION_ID={invocation}").stdout
            if "touched:" in log:
                return main_pid(host, name)
        time.sleep(3)
    raise AssertionError(f"{unit(name)} did not log 'touched:' within {timeout_s} s")


def run_ansible(*args: str, timeout_s: int = 600) -> subprocess.CompletedProcess:
    """`ansible numa-vm ARGS...` (an ad-hoc module run) against the guest, with the checkout's config."""
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible"), "-i", INVENTORY, HOST, *args],
        cwd=REPO,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1"),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


def ad_hoc_message(output: str) -> str:
    """The `msg` of an ad-hoc run's result (`numa-vm | FAILED! => {...}`), else the whole output."""
    dummy, arrow, rest = output.partition("=> ")
    try:
        return json.loads(rest)["msg"] if arrow else output
    except (ValueError, KeyError, TypeError):
        return output


def run_playbook(playbook: str, *extra_args: str, env=None) -> tuple:
    """Run playbooks/<playbook> against the guest; (CompletedProcess, output, seconds)."""
    environ = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), **(env or {}))
    started = time.monotonic()
    proc = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            INVENTORY,
            str(REPO / "playbooks" / playbook),
            *extra_args,
        ],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    return proc, proc.stdout + proc.stderr, round(time.monotonic() - started, 1)


def run_verify(report_dir: Path) -> tuple:
    """Run playbooks/verify.yml against the guest; (exit status, verify.json, output)."""
    proc, output, seconds = run_playbook("verify.yml", "-e", f"numafleet_report_dir={report_dir}")
    report_file = report_dir / "verify.json"
    assert report_file.exists(), (
        f"verify.yml wrote no report (exit {proc.returncode}):\n{output[-4000:]}"
    )
    report = json.loads(report_file.read_text())
    report["_elapsed_s"] = seconds
    return proc.returncode, report, output


def checks(report: dict, subject: str) -> dict:
    """{check name: check} of one subject (placement name or nodeN) in a verify.json report."""
    return {c["check"]: c for c in report["hosts"][HOST]["checks"] if c["subject"] == subject}


def placements() -> list:
    """numafleet_placements of the scenario's inventory (molecule.yml)."""
    scenario = yaml.safe_load((REPO / "molecule" / "numa_vm" / "molecule.yml").read_text())
    return scenario["provisioner"]["inventory"]["host_vars"][HOST]["numafleet_placements"]


def site(tmp_path, name: str, wanted: list, *args: str) -> tuple:
    """site.yml (or another playbook via args) with numafleet_placements given as extra vars."""
    extra = tmp_path / f"{name}.json"
    extra.write_text(json.dumps({"numafleet_placements": wanted}))
    return run_playbook("../site.yml", "-e", f"@{extra}", *args)
