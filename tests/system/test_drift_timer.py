"""roles/drift_timer: render mode twice (second run changed=0), check mode writes nothing, the
rendered service and timer pass `systemd-analyze verify` with no output, and bad inputs fail with
the host, the variable and the fix before anything is written or run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, tree_digest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import systemd_syntax as sd

ROLE = "numafleet.tuning.drift_timer : "
UNIT_DIR = Path("etc/systemd/system")
SERVICE = UNIT_DIR / "numafleet-drift.service"
TIMER = UNIT_DIR / "numafleet-drift.timer"
VENV_ANSIBLE_PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
TEXTFILE_DIR = "/var/lib/node_exporter/textfile"

# host: role inputs (the render root is added per test run). Binaries in ExecStart= are ones this
# machine has, so that `systemd-analyze verify` can check them.
RENDER_HOSTS = {
    "control": {
        "drift_timer_inventory": "/srv/ansible/inventories/production",
        "drift_timer_ansible_playbook": VENV_ANSIBLE_PLAYBOOK,
        "drift_timer_extra_args": ["-e", "numafleet_drift_fail=false"],
        "drift_timer_environment": {"ANSIBLE_CONFIG": "/srv/ansible/ansible.cfg"},
        "drift_timer_working_dir": "/srv/ansible",
        "drift_timer_report_dir": "/var/lib/numafleet/drift",
        "drift_timer_keep": 7,
        "drift_timer_on_calendar": "Mon..Fri 06:30",
        "drift_timer_randomized_delay": "1h",
        "drift_timer_textfile_dir": TEXTFILE_DIR,
    },
    # Defaults everywhere else: no textfile link, the collection's own playbook; timer disabled.
    "minimal": {
        "drift_timer_inventory": "/etc/ansible/hosts",
        "drift_timer_ansible_playbook": VENV_ANSIBLE_PLAYBOOK,
        "drift_timer_enabled": False,
    },
    # Values systemd would unquote, expand or trim if written raw: they must read back exactly.
    "quoting": {
        "drift_timer_inventory": "/srv/my inventories/prod 100%",
        "drift_timer_ansible_playbook": VENV_ANSIBLE_PLAYBOOK,
        "drift_timer_extra_args": ["-e", "note=$HOME ${X} \"q\" 'q' %i \\", "-e", ";"],
        "drift_timer_environment": {"NOTE": '100% $HOME "q" tail \\', "EMPTY": ""},
        "drift_timer_working_dir": "/srv/my project",
        "drift_timer_on_calendar": "*-*-* 03:00:00",
        "drift_timer_enabled": False,
    },
}


def _write(tmp_path: Path, hosts: dict, name: str) -> tuple[Path, Path]:
    """An inventory of local hosts carrying the role inputs as host vars, and a play applying it."""
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
                    "name": "Install the drift timer",
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Apply the drift timer role",
                            "ansible.builtin.include_role": {
                                "name": "numafleet.tuning.drift_timer"
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


def _render_hosts(render: Path) -> dict:
    return {
        host: {**inputs, "drift_timer_render_root": str(render / host)}
        for host, inputs in RENDER_HOSTS.items()
    }


def _would_run(run, host: str) -> list[str]:
    return [
        r["msg"]
        for r in run.results(host)
        if isinstance(r.get("msg"), str) and r["msg"].startswith("would run: ")
    ]


def _message(result: dict) -> str:
    """The failure message of a task, with those of its failed loop items."""
    items = [item.get("msg", "") for item in result.get("items", []) if item.get("failed")]
    return "\n".join([result.get("msg", ""), *items])


def _unit(text: str) -> list[tuple[str, str]]:
    """(key, value) of every setting of a unit file, in order, comments left out."""
    pairs = []
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, dummy, value = line.partition("=")
            pairs.append((key, value))
    return pairs


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, ansible_ready):
    """Check mode on a fresh render root, then two real render runs: (render dir, runs)."""
    tmp_path = tmp_path_factory.mktemp("drift_timer")
    render = tmp_path / "render"
    inventory, playbook = _write(tmp_path, _render_hosts(render), "render")
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
    for host in RENDER_HOSTS:
        assert check.stats[host]["changed"] > 0, check.stats
        written = check.one(host, ROLE + "Write the drift check timer")
        assert written["changed"] and written["diff"], written


def test_render_twice_second_run_changes_nothing(rendered):
    render, runs = rendered
    first, second = runs["first"], runs["second"]
    assert first.rc == 0, first.explain()
    assert second.rc == 0, second.explain()
    for host in RENDER_HOSTS:
        assert first.stats[host]["changed"] > 0, first.stats
        assert second.stats[host]["changed"] == 0, (host, second.stats, second.stdout[-3000:])
        assert (render / host / SERVICE).is_file() and (render / host / TIMER).is_file()
    assert runs["second_digest"] == runs["first_digest"]
    # Nothing of systemctl ran; what it would run is printed, the reload and restart only on change.
    assert _would_run(first, "control") == [
        "would run: systemctl daemon-reload",
        "would run: systemctl restart numafleet-drift.timer",
        "would run: systemctl enable --now numafleet-drift.timer",
    ]
    assert _would_run(first, "minimal") == [
        "would run: systemctl daemon-reload",
        "would run: systemctl disable --now numafleet-drift.timer",
    ]
    assert _would_run(second, "control") == [
        "would run: systemctl enable --now numafleet-drift.timer"
    ]


@pytest.mark.parametrize("host", sorted(RENDER_HOSTS))
def test_rendered_units_pass_systemd_analyze_verify(rendered, host):
    render, runs = rendered
    assert runs["first"].rc == 0, runs["first"].explain()
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: install systemd (Debian: apt-get install systemd)"
    units = [str(render / host / SERVICE), str(render / host / TIMER)]
    proc = subprocess.run(
        [analyze, "verify", *units],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "SYSTEMD_LOG_COLOR": "0"},
    )
    # systemd-analyze verify exits 0 on many findings ("Unknown key ..."): any output is a finding.
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), (proc.stdout, proc.stderr)


def test_rendered_timer_and_service(rendered):
    render, dummy = rendered
    control = render / "control"
    timer = (control / TIMER).read_text(encoding="utf-8")
    service = (control / SERVICE).read_text(encoding="utf-8")
    assert timer.startswith("#\n# Ansible managed\n#\n") and service.startswith(
        "#\n# Ansible managed"
    )
    settings = dict(_unit(timer))
    assert settings["OnCalendar"] == "Mon..Fri 06:30"
    assert settings["RandomizedDelaySec"] == "1h"
    assert settings["Persistent"] == "true"
    assert settings["Unit"] == "numafleet-drift.service"
    assert settings["WantedBy"] == "timers.target"

    pairs = _unit(service)
    settings = dict(pairs)
    assert settings["Type"] == "oneshot"
    assert settings["User"] == "root"
    assert settings["WorkingDirectory"] == "/srv/ansible"
    assert settings["StandardOutput"] == "journal" and settings["StandardError"] == "journal"
    assert settings["RuntimeDirectory"] == "numafleet-drift"
    assert [value for key, value in pairs if key == "Environment"] == [
        '"ANSIBLE_CONFIG=/srv/ansible/ansible.cfg"',
        '"NUMAFLEET_DRIFT_REPORT_DIR=/var/lib/numafleet/drift"',
        '"NUMAFLEET_DRIFT_REPORT_KEEP=7"',
    ]
    assert sd.environment(" ".join(v for k, v in pairs if k == "Environment")) == {
        "ANSIBLE_CONFIG": "/srv/ansible/ansible.cfg",
        "NUMAFLEET_DRIFT_REPORT_DIR": "/var/lib/numafleet/drift",
        "NUMAFLEET_DRIFT_REPORT_KEEP": "7",
    }
    prefixes, exec_start = sd.exec_command(settings["ExecStart"])
    assert prefixes == ""
    assert exec_start[:5] == [
        "/usr/bin/flock",
        "--nonblock",
        "--conflict-exit-code",
        "75",
        "/run/numafleet-drift/drift.lock",
    ]
    assert exec_start[5:10] == [
        VENV_ANSIBLE_PLAYBOOK,
        "-i",
        "/srv/ansible/inventories/production",
        "-e",
        "numafleet_drift_fail=false",
    ]
    # The default playbook is the collection's own, next to the role as installed.
    assert Path(exec_start[10]).resolve() == REPO / "playbooks" / "drift_check.yml"
    assert len(exec_start) == 11
    # A run that found drift exits non-zero and fails the unit; only a lock conflict is a success.
    assert settings["SuccessExitStatus"] == "75"

    link = control / TEXTFILE_DIR.lstrip("/") / "numafleet_drift.prom"
    assert link.is_symlink()
    assert str(link.readlink()) == "/var/lib/numafleet/drift/latest/drift.prom"
    assert (control / "var/lib/numafleet/drift").is_dir()

    minimal = render / "minimal"
    assert not (minimal / TEXTFILE_DIR.lstrip("/")).exists()
    settings = dict(_unit((minimal / TIMER).read_text(encoding="utf-8")))
    assert (settings["OnCalendar"], settings["RandomizedDelaySec"]) == ("daily", "15min")
    settings = dict(_unit((minimal / SERVICE).read_text(encoding="utf-8")))
    assert settings["WorkingDirectory"] == "/var/lib/numafleet/drift"
    assert '"NUMAFLEET_DRIFT_REPORT_KEEP=14"' in (minimal / SERVICE).read_text(encoding="utf-8")


def test_values_read_back_exactly(rendered):
    """Every value of the "quoting" host comes back from the units as written in the inventory."""
    render, dummy = rendered
    inputs = RENDER_HOSTS["quoting"]
    service = sd.parse_unit((render / "quoting" / SERVICE).read_text(encoding="utf-8"))
    timer = sd.parse_unit((render / "quoting" / TIMER).read_text(encoding="utf-8"))
    (description,) = sd.lookup(service, "Unit", "Description")
    assert sd.description(description) == (
        f"numafleet.tuning drift check of {inputs['drift_timer_inventory']}"
    )
    (workdir,) = sd.lookup(service, "Service", "WorkingDirectory")
    assert sd.path_value(workdir) == inputs["drift_timer_working_dir"]
    environment = {}
    for raw in sd.lookup(service, "Service", "Environment"):
        environment.update(sd.environment(raw))
    assert {k: environment[k] for k in inputs["drift_timer_environment"]} == (
        inputs["drift_timer_environment"]
    )
    (exec_start,) = sd.lookup(service, "Service", "ExecStart")
    dummy, argv = sd.exec_command(exec_start)
    assert argv[5:8] == [VENV_ANSIBLE_PLAYBOOK, "-i", inputs["drift_timer_inventory"]]
    assert argv[8:12] == inputs["drift_timer_extra_args"]
    (calendar,) = sd.lookup(timer, "Timer", "OnCalendar")
    assert sd.plain_value(calendar) == inputs["drift_timer_on_calendar"]
    (timer_description,) = sd.lookup(timer, "Unit", "Description")
    assert sd.description(timer_description) == "numafleet.tuning drift check (*-*-* 03:00:00)"


def _base(render: Path, host: str) -> dict:
    return {
        "drift_timer_inventory": "/etc/ansible/hosts",
        "drift_timer_ansible_playbook": VENV_ANSIBLE_PLAYBOOK,
        "drift_timer_render_root": str(render / host),
    }


# host: (inputs over the base, fragments of the message, failing task)
BAD_RENDER = {
    "no-inventory": (
        {"drift_timer_inventory": None},
        ["missing required arguments: drift_timer_inventory"],
        None,
    ),
    "empty-inventory": (
        {"drift_timer_inventory": ""},
        ['host empty-inventory: drift_timer_inventory is ""', "absolute path on this host"],
        "Check drift_timer_inventory",
    ),
    "relative-inventory": (
        {"drift_timer_inventory": "inventories/production"},
        ['drift_timer_inventory is "inventories/production"', "absolute path"],
        "Check drift_timer_inventory",
    ),
    "relative-report-dir": (
        {"drift_timer_report_dir": "reports/drift"},
        [
            'host relative-report-dir: drift_timer_report_dir is "reports/drift"',
            "absolute path other than /",
            "e.g. /var/lib/numafleet/drift",
        ],
        "Check the path inputs",
    ),
    "relative-textfile-dir": (
        {"drift_timer_textfile_dir": "textfile"},
        ['drift_timer_textfile_dir is "textfile"', "e.g. /var/lib/node_exporter/textfile"],
        "Check the path inputs",
    ),
    "directory-binary": (
        {"drift_timer_ansible_playbook": "/opt/venv/bin/ansible-playbook/"},
        ["drift_timer_ansible_playbook is", "is not normalised"],
        "Check the path inputs",
    ),
    "backslash-inventory": (
        {"drift_timer_inventory": "/srv/inventory\\"},
        ["drift_timer_inventory is", "ends in a backslash"],
        "Check drift_timer_inventory",
    ),
    "nel-environment": (
        {"drift_timer_environment": {"NOTE": "a\x85b"}},
        ['drift_timer_environment has "NOTE"', "U+0085"],
        "Check drift_timer_environment",
    ),
    "newline-key": (
        {"drift_timer_environment": {"HF_HOME\n": "/x"}},
        ["not an environment variable name"],
        "Check drift_timer_environment",
    ),
    "numeric-user": (
        {"drift_timer_user": "65535"},
        ["host numeric-user: drift_timer_user is", "reserved"],
        "Check drift_timer_user",
    ),
    "calendar-specifier": (
        {"drift_timer_on_calendar": "daily %H"},
        ["host calendar-specifier: drift_timer_on_calendar is", "no quotes, backslashes or %"],
        "Check the calendar and time spans are single-line values",
    ),
    "keep-zero": (
        {"drift_timer_keep": 0},
        ["host keep-zero: drift_timer_keep is 0", "at least 1"],
        "Check drift_timer_keep",
    ),
    "calendar-injection": (
        {"drift_timer_on_calendar": "daily\nExecStartPost=/bin/sh"},
        ["host calendar-injection: drift_timer_on_calendar is", "one line", "e.g. daily"],
        "Check the calendar and time spans are single-line values",
    ),
    "reserved-env": (
        {"drift_timer_environment": {"NUMAFLEET_DRIFT_REPORT_DIR": "/tmp/x"}},
        ['drift_timer_environment has "NUMAFLEET_DRIFT_REPORT_DIR"', "use drift_timer_report_dir"],
        "Check drift_timer_environment",
    ),
    "newline-arg": (
        {"drift_timer_extra_args": ["-e", "x=1\nExecStartPost=/bin/sh"]},
        ["drift_timer_extra_args[1] is", "U+000A"],
        "Check drift_timer_extra_args",
    ),
    "empty-render-root": (
        {"drift_timer_render_root": ""},
        ["host empty-render-root: drift_timer_render_root is ''", "an empty string is refused"],
        "Check the render root",
    ),
}


def test_bad_inputs_fail_before_writing(tmp_path, ansible_ready):
    render = tmp_path / "render"
    hosts = {}
    for host, case in BAD_RENDER.items():
        merged = {**_base(render, host), **case[0]}
        hosts[host] = {key: value for key, value in merged.items() if value is not None}
    inventory, playbook = _write(tmp_path, hosts, "bad")
    run = ansible_playbook(playbook, inventory)
    assert run.doc, run.explain()
    assert run.rc != 0
    for host, (dummy, fragments, task) in BAD_RENDER.items():
        result = run.results(host)[-1]
        assert result["status"] == "failed", (host, result)
        if task is not None:
            assert result["task"] == ROLE + task, (host, result)
        for fragment in fragments:
            assert fragment in _message(result), (host, fragment, _message(result))
        assert run.stats[host]["changed"] == 0, (host, run.stats[host])
    assert tree_digest(render) == "absent"


def test_host_mode_checks_with_systemd_and_check_mode_is_clean(tmp_path, ansible_ready):
    """Without a render root, in --check: systemd-analyze judges the calendar and time spans, the
    files the timer needs must exist, and a good configuration reports changes and writes nothing."""
    unit_dir = Path("/") / UNIT_DIR
    if (unit_dir / "numafleet-drift.timer").exists():
        pytest.skip(
            "this machine has a numafleet-drift.timer installed; check mode would ask systemd"
        )
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: install systemd"
    target_inventory = tmp_path / "production.yml"
    target_inventory.write_text("all: {}\n", encoding="utf-8")
    reports = tmp_path / "reports"
    base = {
        "drift_timer_inventory": str(target_inventory),
        "drift_timer_ansible_playbook": VENV_ANSIBLE_PLAYBOOK,
        "drift_timer_report_dir": str(reports / "drift"),
        "drift_timer_textfile_dir": str(tmp_path / "textfile"),
    }
    cases = {
        "bad-calendar": (
            {"drift_timer_on_calendar": "dayly"},
            [
                'host bad-calendar: drift_timer_on_calendar is "dayly"',
                "systemd-analyze calendar",
                "Failed to parse calendar specification",
                "man systemd.time",
            ],
            "Check systemd accepts the calendar and time spans",
        ),
        "bad-delay": (
            {"drift_timer_randomized_delay": "15 minuts"},
            ['drift_timer_randomized_delay is "15 minuts"', "systemd-analyze timespan"],
            "Check systemd accepts the calendar and time spans",
        ),
        "missing-inventory": (
            {"drift_timer_inventory": str(tmp_path / "nowhere.yml")},
            [
                f"host missing-inventory: drift_timer_inventory is {tmp_path / 'nowhere.yml'}",
                "does not exist on this host",
            ],
            "Check the inventory, the playbook and ansible-playbook exist",
        ),
        "good": ({}, [], None),
    }
    hosts = {host: {**base, **case[0]} for host, case in cases.items()}
    inventory, playbook = _write(tmp_path, hosts, "host")
    before = {path: tree_digest(path) for path in (tmp_path, unit_dir / "numafleet-drift.service")}
    run = ansible_playbook(playbook, inventory, "--check", "--diff")
    assert run.doc, run.explain()
    for host, (dummy, fragments, task) in cases.items():
        if task is None:
            continue
        result = run.results(host)[-1]
        assert result["status"] == "failed" and result["task"] == ROLE + task, (host, result)
        for fragment in fragments:
            assert fragment in _message(result), (host, fragment, _message(result))
    assert run.stats["good"]["failures"] == 0, run.explain()
    assert run.stats["good"]["changed"] > 0, run.stats
    service = run.one("good", ROLE + "Write the drift check service")
    assert service["changed"] and service["diff"], service
    assert {path: tree_digest(path) for path in before} == before
    assert not reports.exists()
