"""Helpers of the system tests: run ansible-playbook, parse its JSON output, hash trees.

Each run uses the checkout's ansible.cfg (FQCNs resolve through the .collections symlink of
`make setup`) and the test-only stdout callback ``callback_plugins/numafleet_results.py``, which
prints every task result and the recap as one JSON document.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEM = Path(__file__).resolve().parent
FIXTURES = REPO / "tests" / "unit" / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

PLAYBOOK_TIMEOUT = 300


@dataclass
class Run:
    """One ansible-playbook run: exit status, parsed results, stderr and wall time."""

    rc: int
    doc: dict
    stdout: str
    stderr: str
    seconds: float

    def results(self, host: str | None = None, task: str | None = None) -> list:
        return [
            r
            for r in self.doc.get("results", [])
            if (host is None or r["host"] == host) and (task is None or r["task"] == task)
        ]

    def one(self, host: str, task: str) -> dict:
        found = self.results(host, task)
        assert len(found) == 1, f"{host}: expected one result of {task!r}, got {found}"
        return found[0]

    @property
    def stats(self) -> dict:
        return self.doc.get("stats", {})

    def explain(self) -> str:
        return f"rc={self.rc}\n--- stderr\n{self.stderr[-4000:]}\n--- stdout\n{self.stdout[-4000:]}"


def ansible_playbook(playbook, inventory, *args, env=None) -> Run:
    """Run .venv's ansible-playbook from the repository root; parse the JSON callback output."""
    environ = dict(os.environ)
    environ.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(SYSTEM / "callback_plugins"),
        ANSIBLE_STDOUT_CALLBACK="numafleet_results",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORKS=environ.get("ANSIBLE_FORKS", "10"),
        ANSIBLE_DEPRECATION_WARNINGS="0",
    )
    environ.update(env or {})
    command = [
        str(REPO / ".venv" / "bin" / "ansible-playbook"),
        "-i",
        str(inventory),
        str(playbook),
        *args,
    ]
    start = time.monotonic()
    proc = subprocess.run(
        command,
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=PLAYBOOK_TIMEOUT,
        check=False,
    )
    seconds = time.monotonic() - start
    doc: dict = {}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            doc = json.loads(line)
            break
    return Run(proc.returncode, doc, proc.stdout, proc.stderr, seconds)


def _lock(rel: str) -> bool:
    """The per-host lock of the writing modules (run/numafleet/apply.lock, PID inside): made by
    every run that may write, so trees compare without it."""
    return rel in ("run", "run/numafleet") or rel.startswith("run/numafleet/")


def tree_digest(root: Path) -> str:
    """sha256 over every path, file mode and file content below ``root`` ("absent" if missing)."""
    root = Path(root)
    if not root.exists():
        return "absent"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if _lock(rel):
            continue
        stat = path.lstat()
        digest.update(f"{rel}\0{stat.st_mode:o}\0".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def read_tree(root: Path) -> dict:
    """{relative path: text} of every file below ``root``."""
    root = Path(root)
    return {
        path.relative_to(root).as_posix(): path.read_text()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not _lock(path.relative_to(root).as_posix())
    }


class DemoHost:
    """A scratch copy of the demo inventory and of ONE demo host's tree under ``base``; every run
    is limited to that host (fixture ``scratch_demo`` of conftest.py)."""

    def __init__(self, base: Path, host: str) -> None:
        import shutil

        import trees

        self.base, self.host = Path(base), host
        self.inventory = self.base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        machine = trees.DEMO_HOSTS[host]
        self.root = Path(trees.materialize(machine, self.base / ".demo" / host))
        snapshot = trees.GPU_SNAPSHOT_DIR / f"{machine}.json"
        if snapshot.is_file():
            shutil.copyfile(snapshot, self.root / "gpu-snapshot.json")

    def playbook(self, name: str, *args, env=None) -> Run:
        playbook = REPO / "site.yml" if name == "site.yml" else REPO / "playbooks" / name
        return ansible_playbook(playbook, self.inventory, "--limit", self.host, *args, env=env)

    def site(self, *args) -> Run:
        return self.playbook("site.yml", *args)

    def drift(self, name: str) -> tuple:
        """(the run, this host's entry of the drift report) of drift_check.yml."""
        env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(self.base / name)}
        run = self.playbook("drift_check.yml", env=env)
        report = json.loads((self.base / name / "latest" / "drift.json").read_text())
        return run, report["hosts"][self.host]

    def verify(self, name: str) -> tuple:
        """(the run, this host's entry of verify.json) of verify.yml."""
        run = self.playbook("verify.yml", "-e", f"numafleet_report_dir={self.base / name}")
        return run, json.loads((self.base / name / "verify.json").read_text())["hosts"][self.host]

    def unit(self, name: str) -> str:
        """The text of a rendered unit file (etc/systemd/system/<name>) of the render root."""
        return (self.root / "root" / "etc" / "systemd" / "system" / name).read_text()
