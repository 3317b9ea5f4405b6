"""Every case of tests/bad_inputs/ fails at the plan task with its own message; nothing is written.

Each ``tests/bad_inputs/<case>.yml`` holds ``machine`` (a demo host whose recorded topology the
case runs on), ``host_vars`` (what a user would write) and ``expect`` (message fragments, all of
which must appear). All cases run as hosts of ONE site.yml run over a generated inventory; every
host's render root is pre-populated with a unit the manifest owns (which a run that got past the
plan would remove), and must be byte-identical afterwards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, tree_digest

CASES_DIR = REPO / "tests" / "bad_inputs"
CASES = sorted(CASES_DIR.glob("*.yml"))
PLAN_TASK = "Plan placements"
# The host variables against the collection's schema (numafleet.tuning.host_vars_check: unknown
# names, role inputs site.yml reads from a host variable instead, types). The apply's own input
# checks run in the plan task (numa_plan with playbook: site.yml).
HOST_VARS_TASK = "Check the host variables"
GATE_TASK = "Stop before changing any host when a plan failed"
HOST_PREFIX = "bad-"
# A host with valid (empty) placements in the same run: the gate after the plan must stop it too,
# so its owned unit (which an applied empty plan would remove) stays. It sets a role input that
# site.yml does not set itself (left to the inventory): the host variables check lets it through.
GOOD_HOST = "good-gpu-a100-01"
GOOD_HOST_VARS = {"pinned_services_hardening": False}

OLD_UNIT = """\
# Managed by numafleet.tuning

[Service]
ExecStart="/opt/old/bin/serve"
"""


def _load(path: Path) -> dict:
    case = yaml.safe_load(path.read_text())
    assert set(case) <= {"machine", "host_vars", "expect"}, f"{path.name}: unknown keys"
    expect = case["expect"]
    case["expect"] = [expect] if isinstance(expect, str) else list(expect)
    case["host"] = HOST_PREFIX + path.stem.replace("_", "-")
    return case


def _seed_render_root(root: Path, host: str) -> None:
    """What an earlier good run left: one owned unit, listed in the manifest, and its plan."""
    unit = root / "etc" / "systemd" / "system" / "numafleet-old.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(OLD_UNIT)
    manifest = root / "etc" / "numafleet" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        '{"files": ["/etc/systemd/system/numafleet-old.service"], '
        '"units": ["numafleet-old.service"], "version": 1}\n'
    )
    # The recorded plan of that run (its one placement is not in the cases' placements).
    (root / "etc" / "numafleet" / "plan.json").write_text(
        json.dumps({"version": 1, "host": host, "placements": [], "awaiting_restart": []}) + "\n"
    )


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory, ansible_ready):
    import trees

    base = tmp_path_factory.mktemp("bad_inputs")
    cases = [_load(path) for path in CASES]
    machines = {}
    for case in cases:
        host = case["machine"]
        if host not in machines:
            machines[host] = trees.materialize(trees.DEMO_HOSTS[host], base / "trees" / host)
            snapshot = trees.GPU_SNAPSHOT_DIR / f"{trees.DEMO_HOSTS[host]}.json"
            if snapshot.is_file():
                shutil.copyfile(snapshot, Path(machines[host]) / "gpu-snapshot.json")
    hosts = {}
    roots = {case["host"]: base / "roots" / case["host"] for case in cases}
    roots[GOOD_HOST] = base / "roots" / GOOD_HOST
    good = {"machine": "gpu-a100-01", "host": GOOD_HOST, "host_vars": GOOD_HOST_VARS}
    for case in [*cases, good]:
        fsroot = Path(machines[case["machine"]])
        render_root = roots[case["host"]]
        _seed_render_root(render_root, case["host"])
        hostvars = {
            "numafleet_sysfs_root": str(fsroot / "sys"),
            "numafleet_procfs_root": str(fsroot / "proc"),
            "numafleet_render_root": str(render_root),
            # The seeded unit is there to show that nothing is written, not to test the removal
            # guard of numa_plan: without this, every case that plans no placement (a typo in a
            # kernel setting, say) would fail at the guard instead of with its own message.
            "numafleet_allow_removals": True,
        }
        if (fsroot / "gpu-snapshot.json").is_file():
            hostvars["numafleet_gpu_snapshot"] = str(fsroot / "gpu-snapshot.json")
        hostvars.update(case["host_vars"])
        hosts[case["host"]] = hostvars
    inventory = base / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "bad_inputs": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    },
                    "hosts": hosts,
                }
            },
            sort_keys=True,
        )
    )
    before = {host: tree_digest(root) for host, root in roots.items()}
    run = ansible_playbook(REPO / "site.yml", inventory)
    after = {host: tree_digest(root) for host, root in roots.items()}
    return {
        "cases": {case["host"]: case for case in cases},
        "run": run,
        "before": before,
        "after": after,
    }


def test_there_are_enough_cases():
    assert len(CASES) >= 20


def test_every_case_has_fragments():
    for path in CASES:
        case = _load(path)
        assert case["expect"] and all(isinstance(f, str) and f.strip() for f in case["expect"])
        assert "TODO" not in case["expect"], f"{path.name}: expect still has a TODO"


def test_the_run_fails_for_every_host(bad_run):
    run = bad_run["run"]
    assert run.rc != 0, run.explain()
    assert run.doc, run.explain()
    assert sorted(run.stats) == sorted([*bad_run["cases"], GOOD_HOST]), run.explain()
    for host in bad_run["cases"]:
        stats = run.stats[host]
        assert stats["failures"] == 1 and stats["unreachable"] == 0, (host, stats)


def test_the_gate_stops_the_good_host_before_it_is_changed(bad_run):
    run = bad_run["run"]
    good = run.results(GOOD_HOST)
    assert good[-1]["task"] == GATE_TASK and good[-1]["status"] == "failed", good
    assert [r["status"] for r in good if r["task"] == HOST_VARS_TASK] == ["ok"], good
    assert good[-1]["msg"].startswith("planning failed on bad-"), good[-1]["msg"]
    assert "so no host was changed" in good[-1]["msg"]
    assert bad_run["after"][GOOD_HOST] == bad_run["before"][GOOD_HOST]


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_fails_at_the_plan_with_its_message(bad_run, path):
    host = _load(path)["host"]
    case = bad_run["cases"][host]
    run = bad_run["run"]
    # Every input fails at the host-variable check or at the plan, before the gate.
    failed = [r for r in run.results(host) if r["status"] == "failed"]
    (result,) = failed
    assert result["task"] in (PLAN_TASK, HOST_VARS_TASK), result
    msg = result["msg"]
    assert msg.startswith(f"host {host}: "), msg
    for fragment in case["expect"]:
        assert fragment in msg, f"{path.name}: {fragment!r} not in {msg!r}"
    # Nothing after the failed check ran for the host.
    tasks = [r["task"] for r in run.results(host)]
    assert tasks[-1] == result["task"], tasks


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_leaves_the_render_root_unchanged(bad_run, path):
    host = _load(path)["host"]
    assert bad_run["after"][host] == bad_run["before"][host]


def test_messages_are_distinct(bad_run):
    """Each case gets its own message (not one generic "invalid input")."""
    run = bad_run["run"]
    messages = {}
    for host in bad_run["cases"]:
        (failed,) = [r for r in run.results(host) if r["status"] == "failed"]
        text = failed["msg"].split(": ", 1)[1]
        messages.setdefault(text, []).append(host)
    assert all(len(hosts) == 1 for hosts in messages.values()), messages
