"""The collection as a user gets it: built tarball, ansible-galaxy install, playbooks run by FQCN.

The tracked files of this checkout are copied to a scratch source tree, with runtime output
planted in it (reports/ at the top and deeper, capture tarballs, a .demo tree); the tarball that
``ansible-galaxy collection build`` makes of it must hold none of them. It is installed with
``ansible-galaxy collection install`` into a scratch collections path, and a scratch project
directory (its own ansible.cfg without any callback setting, the demo inventory, two demo hosts'
trees, and three extra hosts: one unreachable, one with a misspelt variable) runs
``numafleet.tuning.site``, ``numafleet.tuning.verify`` and ``numafleet.tuning.drift_check`` by
FQCN from there. The reports land in the project, never in the installed collection; every host
is blamed as itself (drift, fail, unreachable) and the exit status says a host needs attention;
a report directory that cannot be written fails the run naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from system_helpers import REPO, SYSTEM, Run

BIN = REPO / ".venv" / "bin"
HOSTS = ("gpu-a100-01", "qemu-2node-01")
EDITED = ("gpu-a100-01", "root/etc/systemd/system/numafleet-embed.service")
DEAD, TYPO = "dead-01", "typo-01"
FINAL_DRIFT = "Fail the host when it drifted, failed or was unreachable"
FINAL_VERIFY = "Fail the host when a verify check failed"
# Runtime output planted in the source tree before the build: none of it may ship.
PLANTED = (
    "reports/verify.json",
    "reports/drift/20250131T120000Z/drift.json",
    "playbooks/reports/verify.json",
    "roles/drift_timer/reports/drift.prom",
    "captures/gpu-a100-01.tar.gz",
    "captures/notes.txt",
    "inventories/demo/captures/x.txt",
    ".demo/gpu-a100-01/root/etc/marker",
)
EXTRA_INVENTORY = f"""\
all:
  hosts:
    {DEAD}:
      ansible_connection: ssh
      ansible_host: 127.0.0.1
      ansible_port: 1
      ansible_ssh_common_args: -o ConnectTimeout=5
    {TYPO}:
      ansible_connection: local
      ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
      numafleet_placemnts: []
"""


@dataclass
class Installed:
    tarball: Path
    members: list
    collection: Path  # the installed collection's root
    project: Path


def _run(argv, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def playbook(installed: Installed, name: str, *args: str, inventories=("inventories/demo",)) -> Run:
    """ansible-playbook numafleet.tuning.<name> from the project, with the project's ansible.cfg
    (the test-only JSON stdout callback gives the results; no callback of the collection)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ANSIBLE_", "NUMAFLEET_"))
    }
    env.update(
        ANSIBLE_CONFIG=str(installed.project / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(SYSTEM / "callback_plugins"),
        ANSIBLE_STDOUT_CALLBACK="numafleet_results",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="0",
    )
    argv = [str(BIN / "ansible-playbook")]
    for inventory in inventories:
        argv += ["-i", inventory]
    argv += [f"numafleet.tuning.{name}", *args]
    proc = _run(argv, installed.project, env)
    doc: dict = {}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            doc = json.loads(line)
            break
    return Run(proc.returncode, doc, proc.stdout, proc.stderr, 0.0)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, ansible_ready) -> Installed:
    import trees

    base = tmp_path_factory.mktemp("installed")
    source = base / "src"
    listed = _run(["git", "ls-files", "-z"], REPO)
    assert listed.returncode == 0, listed.stderr
    for rel in filter(None, listed.stdout.split("\0")):
        path = REPO / rel
        if path.is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / rel)
    for rel in PLANTED:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("runtime output\n")
    dist = base / "dist"
    built = _run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "build",
            str(source),
            "--output-path",
            str(dist),
        ],
        base,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = dist.glob("numafleet-tuning-*.tar.gz")
    with tarfile.open(tarball) as archive:
        members = archive.getnames()
    collections = base / "collections"
    done = _run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "install",
            str(tarball),
            "-p",
            str(collections),
        ],
        base,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collection = collections / "ansible_collections" / "numafleet" / "tuning"
    assert (collection / "MANIFEST.json").is_file()

    project = base / "project"
    shutil.copytree(REPO / "inventories" / "demo", project / "inventories" / "demo")
    (project / "inventories" / "extra.yml").write_text(EXTRA_INVENTORY)
    trees.materialize_demo(project / ".demo")
    (project / "ansible.cfg").write_text(
        "[defaults]\n"
        f"collections_path = {collections}\n"
        "interpreter_python = auto_silent\n"
        "retry_files_enabled = false\n"
        "host_key_checking = false\n"
    )
    return Installed(tarball, members, collection, project)


@pytest.fixture(scope="module")
def converged(installed) -> Run:
    run = playbook(installed, "site", "--limit", ",".join(HOSTS))
    assert run.rc == 0, run.explain()
    return run


def test_runtime_output_never_ships(installed):
    for rel in PLANTED:
        assert rel not in installed.members, rel
    shipped = [
        name
        for name in installed.members
        if set(name.split("/")) & {"reports", "captures", ".demo"}
    ]
    assert shipped == [], shipped
    # What a user needs does ship.
    for rel in ("MANIFEST.json", "playbooks/drift_check.yml", "plugins/action/drift_report.py"):
        assert rel in installed.members, (rel, installed.members[:20])


def test_verify_by_fqcn_reports_into_the_project(installed, converged):
    run = playbook(installed, "verify", "--limit", ",".join(HOSTS))
    assert run.rc == 0, run.explain()
    report = json.loads((installed.project / "reports" / "verify.json").read_text())
    assert sorted(report["hosts"]) == sorted(HOSTS)
    for host in HOSTS:
        entry = report["hosts"][host]
        # Render mode: most checks are not run, and the status says so.
        assert entry["status"] == "pass", entry["summary"]
        assert entry["status_text"].startswith("pass (render: "), entry["status_text"]
        assert entry["status_text"].endswith(" checks not run)")
        assert 0 < entry["not_run"] <= entry["counts"]["skipped"]
    assert not list(installed.collection.rglob("reports"))
    assert not (installed.collection.parent.parent.parent / "reports").exists()


RUNTIME_CHECKS = (
    "running",
    "cpus_binding",
    "mems_binding",
    "offnode_share",
    "gpu_locality",
    "memory_used",
    "hugepages_total",
)


def test_require_runtime_fails_the_checks_not_run(installed, converged, tmp_path):
    run = playbook(
        installed,
        "verify",
        "--limit",
        HOSTS[1],
        "-e",
        "numafleet_verify_require_runtime=true",
        "-e",
        f"numafleet_report_dir={tmp_path}",
    )
    assert run.rc == 2, run.explain()
    report = json.loads((tmp_path / "verify.json").read_text())
    entry = report["hosts"][HOSTS[1]]
    assert entry["status"] == "fail"
    # Only runtime checks fail for not being run; a layer check of a layer the host does not
    # have (no GPU: mig_layout, mps_settings) stays skipped and is not "not run".
    left = [c for c in entry["checks"] if c["status"] == "skipped"]
    assert entry["not_run"] == 0
    assert not {c["check"] for c in left} & set(RUNTIME_CHECKS), left
    assert all(c["status"] == "fail" for c in entry["checks"] if c["check"] in RUNTIME_CHECKS)
    assert run.one(HOSTS[1], FINAL_VERIFY)["status"] == "failed"


def test_drift_by_fqcn_blames_each_host_as_itself(installed, converged):
    unit = installed.project / ".demo" / EDITED[0] / EDITED[1]
    text = unit.read_text()
    unit.write_text(
        "".join(
            "CPUAffinity=0-63\n" if line.startswith("CPUAffinity=") else line
            for line in text.splitlines(keepends=True)
        )
    )
    try:
        run = playbook(
            installed,
            "drift_check",
            "--limit",
            ",".join([*HOSTS, DEAD, TYPO]),
            inventories=("inventories/demo", "inventories/extra.yml"),
        )
    finally:
        unit.write_text(text)
    assert run.rc == 2, run.explain()
    latest = installed.project / "reports" / "drift" / "latest"
    report = json.loads((latest / "drift.json").read_text())
    assert sorted(p.name for p in latest.iterdir()) == [
        "drift.json",
        "drift.junit.xml",
        "drift.prom",
    ]
    assert not list(installed.collection.rglob("reports"))
    statuses = {host: entry["status"] for host, entry in report["hosts"].items()}
    assert statuses == {EDITED[0]: "drift", HOSTS[1]: "clean", DEAD: "unreachable", TYPO: "fail"}
    assert report["hosts"][DEAD]["unreachable"]["task"] == "Gather NUMA and GPU topology"
    (failed,) = report["hosts"][TYPO]["failed_tasks"]
    assert failed["task"] == "Check the host variables" and "numafleet_placemnts" in failed["msg"]
    (drift,) = report["hosts"][EDITED[0]]["drift"]
    assert drift["role"] == "pinned_services"
    assert drift["changes"][0]["settings"] == ["CPUAffinity"]
    # Each host that needs attention fails as itself; the clean host does not fail.
    final = {r["host"]: r["status"] for r in run.results(task=FINAL_DRIFT)}
    assert final == {EDITED[0]: "failed", DEAD: "failed", TYPO: "failed", HOSTS[1]: "skipped"}
    assert run.stats[HOSTS[1]]["failures"] == 0, run.stats
    assert run.stats[EDITED[0]]["failures"] == 1, run.stats
    # Each summary line leads with the host's own status; a host never checked is not "no drift".
    lines = {r["host"]: r["msg"] for r in run.results(task="Print the drift summary")}
    assert lines[DEAD].startswith(f"{DEAD}: drift check unreachable; not checked;"), lines
    assert lines[TYPO].startswith(f"{TYPO}: drift check fail; not checked;"), lines
    assert lines[HOSTS[1]].startswith(f"{HOSTS[1]}: drift check clean; no drift;"), lines
    assert "Make the host reachable" in next(r["msg"] for r in run.results(DEAD, FINAL_DRIFT))
    msg = next(r["msg"] for r in run.results(EDITED[0], FINAL_DRIFT))
    assert msg.startswith(f"{EDITED[0]}: drift; 1 change(s) in pinned_services"), msg


def test_verify_writes_its_report_when_every_host_failed(installed, tmp_path):
    run = playbook(
        installed,
        "verify",
        "--limit",
        f"{DEAD},{TYPO}",
        "-e",
        f"numafleet_report_dir={tmp_path}",
        inventories=("inventories/demo", "inventories/extra.yml"),
    )
    assert run.rc == 2, run.explain()
    report = json.loads((tmp_path / "verify.json").read_text())
    assert {host: entry["status"] for host, entry in report["hosts"].items()} == {
        DEAD: "fail",
        TYPO: "fail",
    }
    (dead,) = report["hosts"][DEAD]["checks"]
    assert dead["check"] == "verified" and "unreachable" in dead["message"]
    (typo,) = report["hosts"][TYPO]["checks"]
    assert "Check the host variables" in typo["message"]
    final = {r["host"]: r["status"] for r in run.results(task=FINAL_VERIFY)}
    assert final == {DEAD: "failed", TYPO: "failed"}


def test_an_unwritable_report_dir_fails_loudly(installed, converged):
    blocker = installed.project / "not-a-dir"
    blocker.write_text("")
    run = playbook(
        installed, "drift_check", "--limit", HOSTS[1], "-e", f"numafleet_report_dir={blocker}"
    )
    assert run.rc != 0, run.explain()
    (failed,) = [r for r in run.results() if r["status"] == "failed"]
    assert failed["task"] == "Write the drift report on the controller"
    assert f"cannot write the drift report in {blocker}/drift" in failed["msg"]
    assert "Not a directory" in failed["msg"]


def test_a_report_dir_inside_the_installed_collection_is_refused(installed, converged):
    inside = installed.collection / "reports"
    run = playbook(installed, "verify", "--limit", HOSTS[1], "-e", f"numafleet_report_dir={inside}")
    assert run.rc != 0, run.explain()
    assert "lies inside the installed collection" in run.stdout
    assert not inside.exists()
