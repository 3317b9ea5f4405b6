"""roles/memory_guard: render mode twice (second run changed=0), check mode writes nothing, the
configuration carries the plan's placements reduced to the guard's keys, the rendered service
passes `systemd-analyze verify`, and bad inputs fail with the host, the variable and the fix
before anything is written or run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, tree_digest

ROLE = "numafleet.tuning.memory_guard : "
SERVICE = Path("etc/systemd/system/numafleet-guard.service")
CONFIG = Path("etc/numafleet/guard.json")
PACKAGE = Path("usr/local/lib/numafleet-guard/numafleet_guard")
TEXTFILE_DIR = "/var/lib/node_exporter/textfile"
MODULES = (
    "guard.py",
    "guard_program.py",
    "guard_preflight.py",
    "guard_migrate.py",
    "cpulist.py",
    "errors.py",
)


def _plan(host: str) -> dict:
    """A plan as numa_plan publishes it: one low placement on node 1 with a GPU, one normal."""
    return {
        "version": 1,
        "host": host,
        "placements": [
            {
                "name": "batch",
                "unit": "numafleet-batch.service",
                "unit_kind": "service",
                "slice": "numafleet.slice",
                "node": 1,
                "mems": [1],
                "cpus": [4, 5, 6, 7],
                "memory_kb": 1048576,
                "priority": "low",
                "argv": ["/usr/bin/sleep", "infinity"],
                "gpus": [{"address": "0000:81:00.0", "uuid": "GPU-1", "node": 1, "model": "x"}],
            },
            {
                "name": "web",
                "unit": "numafleet-web.service",
                "unit_kind": "service",
                "slice": "numafleet.slice",
                "node": 0,
                "mems": [0],
                "cpus": [0, 1],
                "argv": ["/usr/bin/sleep", "infinity"],
            },
        ],
    }


RENDER_HOSTS = {
    "full": {
        "memory_guard_warn_pct": 75,
        "memory_guard_act_pct": 85,
        "memory_guard_act": "throttle",
        "memory_guard_interval": 30,
        "memory_guard_textfile_dir": TEXTFILE_DIR,
        "memory_guard_preflight": "enforce",
    },
    "defaults": {},
    # The service disabled, the preflight still needs the program.
    "preflight-only": {"memory_guard_enabled": False},
    # Nothing runs the program: nothing is installed.
    "nothing": {"memory_guard_enabled": False, "memory_guard_preflight": "off"},
}


def _write(tmp_path: Path, hosts: dict, name: str) -> tuple[Path, Path]:
    inventory = tmp_path / f"{name}.inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    },
                    "hosts": hosts,
                }
            }
        ),
        encoding="utf-8",
    )
    playbook = tmp_path / f"{name}.playbook.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Install the memory guard",
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Apply the memory guard role",
                            "ansible.builtin.include_role": {
                                "name": "numafleet.tuning.memory_guard"
                            },
                        }
                    ],
                }
            ],
            sort_keys=False,
        ),
        encoding="utf-8",
    )
    return inventory, playbook


def _hosts(render: Path, table: dict) -> dict:
    return {
        host: {
            "memory_guard_plan": _plan(host),
            "memory_guard_render_root": str(render / host),
            **inputs,
        }
        for host, inputs in table.items()
    }


def _would_run(run, host: str) -> list[str]:
    return [
        r["msg"]
        for r in run.results(host)
        if isinstance(r.get("msg"), str) and r["msg"].startswith("would run: ")
    ]


def _message(result: dict) -> str:
    parts = [str(result.get("msg", ""))]
    for item in result.get("results", []) or []:
        if item.get("failed"):
            parts.append(str(item.get("msg", "")))
    return " ".join(parts)


def _unit(text: str) -> list:
    pairs = []
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, dummy, value = line.partition("=")
            pairs.append((key, value))
    return pairs


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, ansible_ready):
    """Check mode on a fresh render root, then two real render runs: (render dir, runs)."""
    tmp_path = tmp_path_factory.mktemp("memory_guard")
    render = tmp_path / "render"
    inventory, playbook = _write(tmp_path, _hosts(render, RENDER_HOSTS), "render")
    check = ansible_playbook(playbook, inventory, "--check", "--diff")
    check_digest = tree_digest(render)
    first = ansible_playbook(playbook, inventory)
    first_digest = tree_digest(render)
    second = ansible_playbook(playbook, inventory)
    return render, {
        "check": check,
        "check_digest": check_digest,
        "first": first,
        "first_digest": first_digest,
        "second": second,
        "second_digest": tree_digest(render),
    }


def test_check_mode_writes_nothing(rendered):
    render, runs = rendered
    check = runs["check"]
    assert check.rc == 0, check.explain()
    assert runs["check_digest"] == "absent", sorted(p.as_posix() for p in render.rglob("*"))
    for host in ("full", "defaults", "preflight-only"):
        assert check.stats[host]["changed"] > 0, check.stats
        written = check.one(host, ROLE + "Write the guard configuration")
        assert written["changed"] and written["diff"], written


def test_render_twice_second_run_changes_nothing(rendered):
    render, runs = rendered
    first, second = runs["first"], runs["second"]
    assert first.rc == 0, first.explain()
    assert second.rc == 0, second.explain()
    for host in RENDER_HOSTS:
        assert second.stats[host]["changed"] == 0, (host, second.stats, second.stdout[-3000:])
    assert runs["second_digest"] == runs["first_digest"]
    assert _would_run(first, "full") == [
        "would run: systemctl daemon-reload",
        "would run: systemctl restart numafleet-guard.service",
        "would run: systemctl enable --now numafleet-guard.service",
    ]
    assert _would_run(second, "full") == [
        "would run: systemctl enable --now numafleet-guard.service"
    ]
    assert _would_run(first, "preflight-only")[-1] == (
        "would run: systemctl disable --now numafleet-guard.service"
    )
    # Nothing runs the program on this host: nothing is written.
    assert first.stats["nothing"]["changed"] == 0, first.stats
    assert not (render / "nothing").exists()


def test_files_and_configuration(rendered):
    render, runs = rendered
    assert runs["first"].rc == 0, runs["first"].explain()
    full = render / "full"
    config = json.loads((full / CONFIG).read_text(encoding="utf-8"))
    assert config["version"] == 1 and config["host"] == "full"
    assert config["settings"] == {
        "warn_pct": 75,
        "act_pct": 85,
        "act": "throttle",
        "interval_s": 30,
        "preflight": "enforce",
        "textfile": f"{TEXTFILE_DIR}/numafleet_guard.prom",
        "state_file": "/run/numafleet-guard/state.json",
    }
    batch, web = config["placements"]
    # argv is no key the guard reads; a GPU keeps address, uuid, node, mig.
    assert "argv" not in batch and batch["priority"] == "low"
    assert batch["gpus"] == [{"address": "0000:81:00.0", "uuid": "GPU-1", "node": 1}]
    assert web == {
        "cpus": [0, 1],
        "mems": [0],
        "name": "web",
        "node": 0,
        "slice": "numafleet.slice",
        "unit": "numafleet-web.service",
        "unit_kind": "service",
    }
    text = (full / CONFIG).read_text(encoding="utf-8")
    assert text == json.dumps(config, indent=2, sort_keys=True) + "\n", "sorted, 2-space indent"
    assert oct((full / CONFIG).stat().st_mode & 0o777) == "0o644"
    assert (full / TEXTFILE_DIR.lstrip("/")).is_dir()
    defaults = json.loads((render / "defaults" / CONFIG).read_text(encoding="utf-8"))["settings"]
    assert (defaults["warn_pct"], defaults["act_pct"], defaults["act"]) == (80, 90, "reclaim")
    assert (defaults["interval_s"], defaults["preflight"], defaults["textfile"]) == (
        15,
        "warn",
        None,
    )
    for host in ("full", "preflight-only"):
        init = render / host / PACKAGE / "__init__.py"
        assert init.is_file()
        source = REPO / "plugins/module_utils/numa"
        for module in MODULES:
            if (source / module).is_file():
                copied = render / host / PACKAGE / module
                assert copied.read_bytes() == (source / module).read_bytes()
        launcher = REPO / "roles/memory_guard/files/numafleet-guard"
        if launcher.is_file():
            installed = render / host / "usr/local/sbin/numafleet-guard"
            assert installed.stat().st_mode & 0o777 == 0o755


def test_service_settings(rendered):
    render, runs = rendered
    assert runs["first"].rc == 0, runs["first"].explain()
    settings = _unit((render / "full" / SERVICE).read_text(encoding="utf-8"))
    values = dict(settings)
    assert values["Type"] == "simple"
    assert values["ExecStart"] == (
        "/usr/local/sbin/numafleet-guard run --config /etc/numafleet/guard.json"
    )
    for key, value in (
        ("Restart", "always"),
        ("RestartSec", "5"),
        ("RuntimeDirectory", "numafleet-guard"),
        ("RuntimeDirectoryPreserve", "yes"),
        ("OOMScoreAdjust", "-900"),
        ("Nice", "-5"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
    ):
        assert values[key] == value, key
    assert "MemoryMax" not in values
    writable = [value for key, value in settings if key == "ReadWritePaths"]
    assert writable == ["/sys/fs/cgroup", TEXTFILE_DIR]
    defaults = _unit((render / "defaults" / SERVICE).read_text(encoding="utf-8"))
    assert [value for key, value in defaults if key == "ReadWritePaths"] == ["/sys/fs/cgroup"]


def test_rendered_service_passes_systemd_analyze_verify(rendered, tmp_path):
    render, runs = rendered
    assert runs["first"].rc == 0, runs["first"].explain()
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing (Debian: apt-get install systemd)")
    # The unit names its launcher in ExecStart=; verify checks that it exists: a copy of the unit
    # pointing at a program this machine has keeps every other setting under test.
    text = (render / "full" / SERVICE).read_text(encoding="utf-8")
    unit = tmp_path / "numafleet-guard.service"
    unit.write_text(
        text.replace("/usr/local/sbin/numafleet-guard", shutil.which("true") or "/bin/true"),
        encoding="utf-8",
    )
    proc = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


# host: (inputs over a good host, fragments of the message, failing task)
BAD = {
    "empty-render-root": (
        {"memory_guard_render_root": ""},
        ["host empty-render-root: memory_guard_render_root is ''", "an empty string is refused"],
        "Check the render root",
    ),
    "other-host-plan": (
        {"memory_guard_plan": _plan("someone-else")},
        ["host other-host-plan: memory_guard_plan is not this host's plan", "numa_plan"],
        "Check the plan",
    ),
    "act-below-warn": (
        {"memory_guard_warn_pct": 90, "memory_guard_act_pct": 85},
        [
            "host act-below-warn: memory_guard_warn_pct is 90 and memory_guard_act_pct is 85",
            "1 <= warn < act <= 99",
        ],
        "Check the thresholds",
    ),
    "act-100": (
        {"memory_guard_act_pct": 100},
        ["memory_guard_act_pct is 100", "1 <= warn < act <= 99"],
        "Check the thresholds",
    ),
    "interval-0": (
        {"memory_guard_interval": 0},
        ["host interval-0: memory_guard_interval is 0", "from 1 to 3600"],
        "Check memory_guard_interval",
    ),
    "relative-textfile": (
        {"memory_guard_textfile_dir": "textfile"},
        ['memory_guard_textfile_dir is "textfile"', "e.g. /var/lib/node_exporter/textfile"],
        "Check memory_guard_textfile_dir",
    ),
    "newline-textfile": (
        {"memory_guard_textfile_dir": "/var/lib/x\nExecStartPost=/bin/sh"},
        ["host newline-textfile: memory_guard_textfile_dir is", "U+000A"],
        "Check memory_guard_textfile_dir",
    ),
    "bad-act": (
        {"memory_guard_act": "kill"},
        ["value of memory_guard_act must be one of: reclaim, throttle, migrate"],
        None,
    ),
}


def test_bad_inputs_fail_before_writing(tmp_path, ansible_ready):
    render = tmp_path / "render"
    hosts = {}
    for host, case in BAD.items():
        hosts[host] = {
            "memory_guard_plan": _plan(host),
            "memory_guard_render_root": str(render / host),
            **case[0],
        }
    inventory, playbook = _write(tmp_path, hosts, "bad")
    run = ansible_playbook(playbook, inventory)
    assert run.doc, run.explain()
    assert run.rc != 0
    for host, (dummy, fragments, task) in BAD.items():
        result = run.results(host)[-1]
        assert result["status"] == "failed", (host, result)
        if task is not None:
            assert result["task"] == ROLE + task, (host, result)
        for fragment in fragments:
            assert fragment in _message(result), (host, fragment, _message(result))
        assert run.stats[host]["changed"] == 0, (host, run.stats[host])
    assert tree_digest(render) == "absent"
