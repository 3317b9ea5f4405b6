"""units.py: rendering the plan into systemd files, escaping, changes, manifest and writes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import plan_shapes  # tests/unit/plan_shapes.py (on sys.path through tests/unit/conftest.py)
import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    UnitFileError,
    UnitRenderError,
)

UNIT_DIR = "/etc/systemd/system"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
SYSTEMD_ESCAPE = shutil.which("systemd-escape")


def placement(name="llm", **overrides) -> dict:
    """A service placement in the plan's shape, with overrides."""
    return plan_shapes.placement(name, **overrides)


def dropin(name="vllm", unit="vllm.service", **overrides) -> dict:
    fields = {"unit": unit, "unit_kind": "dropin", "exec": None, "argv": []}
    fields.update(overrides)
    return placement(name, **fields)


def tenant(name="team-a", placements=("llm",), **overrides) -> dict:
    base = {
        "name": name,
        "slice": units.slice_name(name),
        "memory_max_kb": None,
        "description": None,
        "cpus": [2, 3, 4, 5],
        "mems": [0],
        "placements": list(placements),
    }
    base.update(overrides)
    return base


def make_plan(*placements, tenants=()) -> dict:
    return {
        "version": 1,
        "host": "gpu-a100-01",
        "reserved_cpus": [0, 1],
        "memory_headroom_pct": 15,
        "placements": list(placements),
        "tenants": list(tenants),
        "nodes": [],
        "gpus": [],
        "mps_daemons": [],
        "warnings": [],
    }


def render(*placements, tenants=(), **kwargs) -> dict:
    return units.render_files(make_plan(*placements, tenants=tenants), **kwargs)


def service_text(**overrides) -> str:
    return render(placement(**overrides))[f"{UNIT_DIR}/numafleet-llm.service"]


# --- escaping ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "want"),
    [
        ("plain", '"plain"'),
        ("", '""'),
        ("two words", '"two words"'),
        ("100%", '"100%%"'),
        ("%n%i", '"%%n%%i"'),
        ("$HOME", '"$$HOME"'),
        ("${X}", '"$${X}"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ('\\"', '"\\\\\\""'),
        ("it's", '"it\'s"'),
        (";", '";"'),
        ("tab\u00a0nbsp", '"tab\u00a0nbsp"'),
        ("ü", '"ü"'),
    ],
)
def test_exec_words_are_quoted_and_escaped(arg, want):
    assert units.quote_exec_arg(arg, "x") == want


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("HF_HOME", "/srv/hf", '"HF_HOME=/srv/hf"'),
        ("A", "", '"A="'),
        ("A", "50%", '"A=50%%"'),
        ("A", "$HOME", '"A=$HOME"'),  # Environment= expands no variables
        ("A", 'q"uote', '"A=q\\"uote"'),
        ("A", "back\\slash", '"A=back\\\\slash"'),
        ("A", "two words", '"A=two words"'),
        ("_x9", "a=b", '"_x9=a=b"'),
    ],
)
def test_environment_assignments_are_quoted(key, value, want):
    assert units.quote_environment(key, value, "x") == want


@pytest.mark.parametrize("key", ["9A", "A-B", "A B", "", "A=B", "Ä"])
def test_environment_keys_must_be_names(key):
    with pytest.raises(UnitRenderError, match="not an environment variable name"):
        units.quote_environment(key, "v", "plan placements[0] (llm).environment")


@pytest.mark.parametrize(
    ("text", "want"),
    [("100%", "100%%"), ("a%%b", "a%%%%b"), ('$x \\ "y"', '$x \\ "y"'), ("", "")],
)
def test_specifiers_are_doubled(text, want):
    assert units.escape_specifiers(text, "x") == want


CONTROL = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85"]


@pytest.mark.parametrize("char", CONTROL, ids=[f"U+{ord(c):04X}" for c in CONTROL])
@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"argv": ["/usr/bin/sleep", "1{c}"]}, "(llm).exec"),
        ({"argv": ["/usr/bin/sl{c}eep", "1"]}, "(llm).exec"),
        ({"environment": {"A": "x{c}y"}}, "(llm).environment.A"),
        ({"description": "d{c}"}, "(llm).description"),
        ({"user": "u{c}"}, "(llm).user"),
        ({"group": "g{c}"}, "(llm).group"),
    ],
)
def test_control_characters_are_refused(char, overrides, where):
    fields = json.loads(json.dumps(overrides).replace("{c}", json.dumps(char)[1:-1]))
    with pytest.raises(UnitRenderError) as err:
        render(placement(**fields))
    message = str(err.value)
    assert message.startswith("host gpu-a100-01: plan placements[0] (llm)")
    assert where in message and f"U+{ord(char):04X}" in message


@pytest.mark.parametrize("char", CONTROL, ids=[f"U+{ord(c):04X}" for c in CONTROL])
def test_control_characters_in_tenant_description_are_refused(char):
    with pytest.raises(UnitRenderError, match=r"tenants\[0\] \(team-a\)\.description"):
        render(placement(), tenants=[tenant(description=f"a{char}b")])


def test_control_characters_in_header_are_refused():
    with pytest.raises(UnitRenderError, match="header"):
        render(placement(), header="# a\x1b[31m")


# --- unit names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("team-a", "numafleet-team\\x2da.slice"),
        ("a_b", "numafleet-a_b.slice"),
        ("a.b", "numafleet-a.b.slice"),
        ("x", "numafleet-x.slice"),
        ("0-1-2", "numafleet-0\\x2d1\\x2d2.slice"),
        (".dot", "numafleet-\\x2edot.slice"),
        ("ü", "numafleet-\\xc3\\xbc.slice"),
        ("a b", "numafleet-a\\x20b.slice"),
        ("a/b", "numafleet-a\\x2fb.slice"),
        ("a\\b", "numafleet-a\\x5cb.slice"),
    ],
)
def test_slice_name_escapes_like_systemd(name, want):
    assert units.slice_name(name) == want


@pytest.mark.skipif(SYSTEMD_ESCAPE is None, reason="systemd-escape is not installed")
@pytest.mark.parametrize(
    "name", ["team-a", "a_b", "a.b", "0-1-2", ".dot", "ü", "a b", "x:y", "a\\b"]
)
def test_slice_name_matches_systemd_escape(name):
    escaped = subprocess.run(
        [SYSTEMD_ESCAPE, "--", name], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert units.slice_name(name) == f"numafleet-{escaped}.slice"


def test_slice_name_of_nothing_is_refused():
    with pytest.raises(UnitRenderError, match="non-empty"):
        units.slice_name("")


@pytest.mark.parametrize(
    "unit",
    ["../evil.service", "a/b.service", "vllm", "vllm.socket", ".service", "a b.service", ""],
)
def test_bad_dropin_unit_names_are_refused(unit):
    with pytest.raises(UnitRenderError, match="is not a systemd .service unit name"):
        render(dropin(unit=unit))


@pytest.mark.parametrize("name", ["numafleet-.slice", "-a.slice", "a--b.slice", "a@b.slice"])
def test_bad_slice_names_are_refused(name):
    with pytest.raises(UnitRenderError, match="slice"):
        render(placement(slice=name))


# --- services, drop-ins, slices ----------------------------------------------------------------

GOLDEN_SERVICE = """\
# Managed by numafleet.tuning

[Unit]
Description=LLM at 100%% load
Requires=nvidia-mps@GPU-8e9f.service
After=nvidia-mps@GPU-8e9f.service

[Service]
Type=simple
ExecStart="/opt/llm/bin/serve" "--port" "8000" "--name" "a b" "--fmt" "%%s $$HOME \\"q\\" \\\\"
User=llm
Group=gpu
Slice=numafleet-team\\x2da.slice
CPUAffinity=2-5,32-35
NUMAPolicy=bind
NUMAMask=0
AllowedCPUs=2-5,32-35
AllowedMemoryNodes=0
Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"
Environment="CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/GPU-8e9f"
Environment="CUDA_VISIBLE_DEVICES=GPU-8e9f"
Environment="HF_HOME=/srv/hf 50%%"
LimitMEMLOCK=infinity
Restart=on-failure
NoNewPrivileges=yes
ProtectSystem=full
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictRealtime=yes

[Install]
WantedBy=multi-user.target
"""


def golden_placement() -> dict:
    return placement(
        argv=["/opt/llm/bin/serve", "--port", "8000", "--name", "a b", "--fmt", '%s $HOME "q" \\'],
        description="LLM at 100% load",
        user="llm",
        group="gpu",
        tenant="team-a",
        slice="numafleet-team\\x2da.slice",
        cpus=[35, 2, 3, 4, 5, 32, 33, 34],
        mps={
            "pipe_dir": "/run/nvidia-mps/GPU-8e9f",
            "log_dir": "/var/log/nvidia-mps/GPU-8e9f",
            "active_thread_percentage": None,
            "pinned_memory_limit_kb": None,
        },
        environment={
            "HF_HOME": "/srv/hf 50%",
            "CUDA_VISIBLE_DEVICES": "GPU-8e9f",
            "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps/GPU-8e9f",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        },
    )


def test_service_unit_text():
    files = render(golden_placement())
    assert list(files) == [f"{UNIT_DIR}/numafleet-llm.service"]
    assert files[f"{UNIT_DIR}/numafleet-llm.service"] == GOLDEN_SERVICE


def test_dropin_pins_an_existing_unit_without_owning_it():
    files = render(dropin(cpus=[8, 9], mems=[1], environment={"X": "1"}))
    path = f"{UNIT_DIR}/vllm.service.d/50-numafleet.conf"
    assert list(files) == [path]
    assert files[path] == (
        "# Managed by numafleet.tuning\n\n"
        "[Service]\nSlice=numafleet.slice\nCPUAffinity=\nCPUAffinity=8-9\nNUMAPolicy=bind\n"
        "NUMAMask=\nNUMAMask=1\nAllowedCPUs=\nAllowedCPUs=8-9\nAllowedMemoryNodes=\n"
        'AllowedMemoryNodes=1\nEnvironment="X=1"\nLimitMEMLOCK=infinity\n'
    )
    for absent in ("ExecStart", "[Install]", "Restart=", "NoNewPrivileges", "[Unit]"):
        assert absent not in files[path]


def test_dropin_with_mps_orders_after_the_daemon():
    text = render(dropin(mps={"pipe_dir": "/run/nvidia-mps/MIG-1a2b"}))[
        f"{UNIT_DIR}/vllm.service.d/50-numafleet.conf"
    ]
    assert (
        "[Unit]\nRequires=nvidia-mps@MIG-1a2b.service\nAfter=nvidia-mps@MIG-1a2b.service\n" in text
    )


def mps_daemon(pipe_dir: str, instance, unit=None) -> dict:
    """An entry of plan["mps_daemons"] (only the keys the client wiring reads, plus clients)."""
    return {
        "pipe_dir": pipe_dir,
        "instance": instance,
        "device_uuid": instance,
        "unit": unit or (f"nvidia-mps@{instance}.service" if instance else None),
        "clients": ["llm"],
    }


def test_client_requires_the_daemon_unit_the_plan_names():
    plan = make_plan(placement(mps={"pipe_dir": "/run/nvidia-mps/GPU-8e9f"}))
    plan["mps_daemons"] = [mps_daemon("/run/nvidia-mps/GPU-8e9f", "GPU-8e9f")]
    text = units.render_files(plan)[f"{UNIT_DIR}/numafleet-llm.service"]
    assert "Requires=nvidia-mps@GPU-8e9f.service\nAfter=nvidia-mps@GPU-8e9f.service\n" in text
    assert "Wants=" not in text


def test_client_of_a_pending_mig_daemon_gets_no_dependency():
    """The MIG instance is not created yet: Requires= on a unit without drop-in would fail it."""
    pipe = "/run/nvidia-mps/GPU-8e9f-mig4"
    plan = make_plan(
        placement(
            mps={"pipe_dir": pipe},
            environment={"CUDA_MPS_PIPE_DIRECTORY": pipe},
        )
    )
    plan["mps_daemons"] = [mps_daemon(pipe, None)]
    text = units.render_files(plan)[f"{UNIT_DIR}/numafleet-llm.service"]
    assert "nvidia-mps@" not in text
    assert f'Environment="CUDA_MPS_PIPE_DIRECTORY={pipe}"' in text


def test_hardening_leaves_the_pipe_directory_writable():
    """ProtectSystem=full keeps /run writable (only strict would need ReadWritePaths=)."""
    text = service_text(mps={"pipe_dir": "/run/nvidia-mps/GPU-8e9f"}, hardening=True)
    assert "ProtectSystem=full" in text and "ProtectSystem=strict" not in text
    assert "ReadWritePaths" not in text and "InaccessiblePaths" not in text


def test_dropin_for_a_template_unit():
    files = render(dropin(unit="worker@.service"))
    assert list(files) == [f"{UNIT_DIR}/worker@.service.d/50-numafleet.conf"]


@pytest.mark.parametrize(
    ("memory_max_kb", "line"),
    [(None, None), (209715200, "MemoryMax=214748364800"), (0, "MemoryMax=0")],
)
def test_tenant_slice(memory_max_kb, line):
    files = render(
        placement(cpus=[2, 3], mems=[0], slice="numafleet-team\\x2da.slice"),
        placement("b", cpus=[40, 41], mems=[1], slice="numafleet-team\\x2da.slice"),
        tenants=[tenant(cpus=[2, 3, 40, 41], mems=[0, 1], memory_max_kb=memory_max_kb)],
    )
    text = files[f"{UNIT_DIR}/numafleet-team\\x2da.slice"]
    assert "[Unit]\nDescription=numafleet tenant team-a\n" in text
    assert "[Slice]\nAllowedCPUs=2-3,40-41\nAllowedMemoryNodes=0-1\n" in text
    if line is None:
        assert "MemoryMax" not in text
    else:
        assert text.endswith(f"{line}\n")


def test_tenants_without_placements_and_the_default_slice_are_not_written():
    files = render(placement(), tenants=[tenant("idle", placements=())])
    assert list(files) == [f"{UNIT_DIR}/numafleet-llm.service"]
    assert not any(path.endswith(".slice") for path in files)


def test_tenant_description_is_escaped():
    files = render(placement(), tenants=[tenant(description="GPU 100%")])
    assert "Description=GPU 100%%\n" in files[f"{UNIT_DIR}/numafleet-team\\x2da.slice"]


@pytest.mark.parametrize(
    ("default", "own", "hardened"),
    [
        (True, None, True),
        (False, None, False),
        (True, False, False),
        (False, True, True),
        (True, True, True),
    ],
)
def test_hardening(default, own, hardened):
    text = render(placement(hardening=own), hardening_default=default)[
        f"{UNIT_DIR}/numafleet-llm.service"
    ]
    for key, value in units.HARDENING:
        assert (f"\n{key}={value}\n" in text) is hardened
    assert "PrivateDevices" not in text
    assert "\nLimitMEMLOCK=infinity\n" in text and "\nRestart=on-failure\n" in text


@pytest.mark.parametrize(
    ("header", "first"),
    [
        ("# Managed by numafleet.tuning", "# Managed by numafleet.tuning\n\n[Unit]"),
        ("#\n# Ansible managed\n#\n", "#\n# Ansible managed\n#\n\n[Unit]"),
        ("; semicolon comment", "; semicolon comment\n\n[Unit]"),
        ("", "[Unit]"),
    ],
)
def test_header_comes_first(header, first):
    text = render(placement(), header=header)[f"{UNIT_DIR}/numafleet-llm.service"]
    assert text.startswith(first)


def test_header_must_be_comments():
    with pytest.raises(UnitRenderError, match="is not a comment; start every line with #"):
        render(placement(), header="# ok\nnot a comment")


def test_user_and_group_only_when_set():
    text = service_text()
    assert "\nUser=" not in text and "\nGroup=" not in text
    assert "\nUser=llm\n" in service_text(user="llm")


def test_default_description():
    assert "Description=numafleet placement llm\n" in service_text(description=None)


def test_rendering_is_deterministic():
    one = golden_placement()
    two = golden_placement()
    two["environment"] = dict(reversed(list(two["environment"].items())))
    t1, t2 = tenant(), tenant()
    t2["cpus"] = list(reversed(t2["cpus"]))
    first = render(one, dropin(), tenants=[t1])
    second = render(dropin(), two, tenants=[t2])
    assert first == second
    assert list(first) == sorted(first)
    assert json.dumps(first) == json.dumps(render(one, dropin(), tenants=[t1]))


# --- refused plans -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda p: p.update(version=2), "plan version is 2"),
        (lambda p: p.pop("placements"), "plan has no 'placements'"),
        (lambda p: p["placements"][0].pop("cpus"), "(llm) has no 'cpus'"),
        (lambda p: p["placements"][0].update(cpus=[]), "(llm).cpus is [], not a non-empty list"),
        (lambda p: p["placements"][0].update(mems=["0"]), "(llm).mems holds '0'"),
        (lambda p: p["placements"][0].update(cpus="0-3"), "(llm).cpus is '0-3', not a list"),
        (lambda p: p["placements"][0].update(unit_kind="timer"), "unit_kind is 'timer'"),
        (lambda p: p["placements"][0].update(argv=[]), "(llm).argv is []"),
        (lambda p: p["placements"][0].update(hardening="yes"), "(llm).hardening is 'yes'"),
        (lambda p: p["placements"][0].update(unit="x/../y.service"), "not a systemd .service"),
        (lambda p: p["placements"].append(placement()), "already written for another entry"),
        (lambda p: p["placements"][0].update(environment={"A": 1}), "environment.A: 1"),
        (
            lambda p: p["placements"][0].update(mps={"pipe_dir": "/run/nvidia-mps/a b"}),
            "usable as the nvidia-mps@ instance",
        ),
        (lambda p: p["tenants"].append({"name": "t", "placements": ["x"]}), "has no 'slice'"),
        (
            lambda p: p["tenants"].append(tenant(memory_max_kb=-1)),
            "memory_max_kb is -1, below 0",
        ),
    ],
)
def test_bad_plans_are_refused_with_the_key(mutate, fragment):
    plan = make_plan(placement())
    mutate(plan)
    with pytest.raises(UnitRenderError) as err:
        units.render_files(plan)
    assert fragment in str(err.value)
    assert str(err.value).startswith("host gpu-a100-01: ")


def test_a_plan_that_is_no_mapping_is_refused():
    with pytest.raises(UnitRenderError, match="plan is list, not a mapping"):
        units.render_files([])


@pytest.mark.parametrize(
    ("program", "fragment"),
    [
        ("-/usr/bin/x", "must be an absolute path or a plain program name"),
        ("@/usr/bin/x", "must be an absolute path or a plain program name"),
        ("bin/x", "must be an absolute path or a plain program name"),
        ("/opt/a\\b", "wrapper script"),
        ('/opt/a"b', "wrapper script"),
        ("/opt/it's", "wrapper script"),
        ("/opt/$X/bin", "wrapper script"),
    ],
)
def test_programs_systemd_cannot_run_are_refused(program, fragment):
    with pytest.raises(UnitRenderError, match="exec: the program") as err:
        render(placement(argv=[program, "x"]))
    assert fragment in str(err.value)


def test_render_errors_are_numatune_errors():
    assert issubclass(UnitRenderError, NumaTuneError)
    assert issubclass(UnitFileError, NumaTuneError)


@pytest.mark.parametrize("unit_dir", ["etc/systemd/system", "", "./x"])
def test_unit_dir_must_be_absolute(unit_dir):
    with pytest.raises(UnitRenderError, match="unit_dir: .* is not an absolute path"):
        render(placement(), unit_dir=unit_dir)


def test_unit_dir_is_used_and_normalised():
    files = render(placement(), dropin(), unit_dir="/run/systemd//system/")
    assert sorted(files) == [
        "/run/systemd/system/numafleet-llm.service",
        "/run/systemd/system/vllm.service.d/50-numafleet.conf",
    ]


# --- changes, actions --------------------------------------------------------------------------

A, B, C = (f"{UNIT_DIR}/numafleet-{n}.service" for n in "abc")
D = f"{UNIT_DIR}/vllm.service.d/50-numafleet.conf"
S = f"{UNIT_DIR}/numafleet-t.slice"


@pytest.mark.parametrize(
    ("current", "desired", "owned", "want"),
    [
        ({}, {}, [], []),
        ({A: None}, {A: "x"}, [], [(A, "create")]),
        ({A: "x"}, {A: "x"}, [A], [(A, "unchanged")]),
        ({A: "old"}, {A: "x"}, [A], [(A, "update")]),
        ({A: "foreign"}, {A: "x"}, [], [(A, "update")]),
        ({A: "x", B: "y"}, {A: "x"}, [A, B], [(A, "unchanged"), (B, "remove")]),
        ({B: None}, {}, [B], []),  # owned but already gone: nothing to do
        ({C: "z"}, {}, [], []),  # not owned: never removed
        ({D: "d", S: "s"}, {}, [S, D], [(S, "remove"), (D, "remove")]),
    ],
)
def test_plan_changes(current, desired, owned, want):
    changes = units.plan_changes(current, desired, owned)
    assert [(c.path, c.state) for c in changes] == want
    for change in changes:
        assert change.before == current.get(change.path)
        assert change.after == desired.get(change.path)


def test_plan_actions_and_would_run():
    changes = [
        units.FileChange(A, "create", None, "a"),
        units.FileChange(B, "update", "o", "b"),
        units.FileChange(C, "remove", "c", None),
        units.FileChange(D, "create", None, "d"),
        units.FileChange(f"{UNIT_DIR}/old.service.d/50-numafleet.conf", "remove", "o", None),
        units.FileChange(S, "unchanged", "s", "s"),
        units.FileChange(f"{UNIT_DIR}/numafleet-u.slice", "create", None, "u"),
    ]
    actions = units.plan_actions(changes)
    assert actions.units == {
        "new": ["numafleet-a.service", "vllm.service"],
        "changed": ["numafleet-b.service"],
        "removed": ["numafleet-c.service", "old.service"],
        "unchanged": [],
    }
    assert actions.slices == {
        "new": ["numafleet-u.slice"],
        "changed": [],
        "removed": [],
        "unchanged": ["numafleet-t.slice"],
    }
    assert actions.reload_needed is True
    assert actions.would_run() == [
        "systemctl disable --now numafleet-c.service",
        "systemctl daemon-reload",
        "systemctl restart numafleet-b.service",
        "systemctl try-restart old.service",
        "systemctl try-restart vllm.service",
        "systemctl enable --now numafleet-a.service",
    ]
    # restart (which starts a stopped unit) only for the services this collection writes
    assert actions.restart == ("numafleet-b.service",)
    assert actions.try_restart == ("old.service", "vllm.service")


WAITS = {
    "mig_instance": "1g.10gb at slice 2 of GPU 0000:17:00.0",
    "gpu": "0000:17:00.0",
    "profile": "1g.10gb",
    "start": 2,
    "reason": "created in this run",
}


def test_a_unit_waiting_for_its_mig_instance_is_written_but_never_started():
    changes = [
        units.FileChange(A, "create", None, "a"),
        units.FileChange(B, "update", "o", "b"),
        units.FileChange(D, "create", None, "d"),
    ]
    waiting = {"numafleet-a.service": WAITS, "numafleet-b.service": WAITS}
    actions = units.plan_actions(changes, waiting)
    assert actions.start == () and actions.restart == ()
    assert actions.try_restart == ("vllm.service",)  # not waiting
    assert actions.units["new"] == ["numafleet-a.service", "vllm.service"]
    assert actions.would_run() == [
        "systemctl daemon-reload",
        "systemctl try-restart vllm.service",
        "numafleet-a.service: not started, waits for MIG instance 1g.10gb at slice 2 of GPU "
        "0000:17:00.0: created in this run; enabled and started once it exists",
        "numafleet-b.service: not started, waits for MIG instance 1g.10gb at slice 2 of GPU "
        "0000:17:00.0: created in this run; enabled and started once it exists",
    ]
    assert actions.waiting_dicts()[0] == dict(WAITS, unit="numafleet-a.service")
    reset = units.waiting_line("x.service", dict(WAITS, reason="mode change pending a reset"))
    assert reset.endswith(
        ": mode change pending a reset; enabled and started by the first run after the GPU reset"
    )


@pytest.mark.parametrize("state", ["update", "unchanged"])
def test_a_unit_that_waited_last_time_is_started_not_restarted(state):
    changes = [units.FileChange(A, state, "a", "a" if state == "unchanged" else "b")]
    actions = units.plan_actions(changes, {}, {"numafleet-a.service"})
    assert actions.start == ("numafleet-a.service",) and actions.restart == ()
    # it still waits: nothing
    assert (
        units.plan_actions(changes, {"numafleet-a.service": WAITS}, {"numafleet-a.service"}).start
        == ()
    )


def test_waiting_units_of_a_plan_and_of_its_record():
    plan = {"placements": [{"unit": "a.service", "waits_for": WAITS}, {"unit": "b.service"}]}
    assert units.waiting_units(plan) == {"a.service": WAITS}
    assert units.waiting_units({"placements": "bad"}) == {} and units.waiting_units(None) == {}
    assert units.recorded_waiting(json.dumps(plan)) == {"a.service"}
    assert units.recorded_waiting(None) == set() and units.recorded_waiting("{not json") == set()


def test_nothing_changed_needs_no_reload():
    actions = units.plan_actions([units.FileChange(A, "unchanged", "a", "a")])
    assert actions.reload_needed is False and actions.would_run() == []
    assert actions.units["unchanged"] == ["numafleet-a.service"]


@pytest.mark.parametrize(
    ("timeout", "want"),
    [
        (None, ["/bin/systemctl", "disable", "--now", "x.service"]),
        (
            "/usr/bin/timeout",
            [
                "/usr/bin/timeout",
                "--kill-after=10",
                "300",
                "/bin/systemctl",
                "disable",
                "--now",
                "x.service",
            ],
        ),
    ],
)
def test_disable_argv(timeout, want):
    assert units.disable_argv("/bin/systemctl", timeout, "x.service") == want


# --- manifest and writes -----------------------------------------------------------------------


def test_manifest_text_is_sorted_json():
    text = units.manifest_text({D: "d", A: "a", S: "s"})
    assert json.loads(text) == {
        "version": 2,
        "files": {path: units.digest_text(body) for path, body in ((A, "a"), (D, "d"), (S, "s"))},
        "units": ["numafleet-a.service", "numafleet-t.slice", "vllm.service"],
    }
    assert text.endswith("\n") and text == units.manifest_text({S: "s", A: "a", D: "d"})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "is not JSON"),
        ("[]", "is not a version 2 (or 1) numafleet manifest"),
        ('{"version": 3, "files": []}', "is not a version 2 (or 1)"),
        ('{"version": 2, "files": []}', "has no mapping of files"),
        ('{"version": 2, "files": {"/etc/systemd/system/a.service": "x"}}', "not a sha256"),
        ('{"version": 1}', "has no list of files"),
        ('{"version": 1, "files": ["/etc/passwd"]}', "lists '/etc/passwd'"),
        ('{"version": 1, "files": ["relative.service"]}', "lists 'relative.service'"),
        ('{"version": 1, "files": ["/etc/../x.service"]}', "lists '/etc/../x.service'"),
        ('{"version": 1, "files": ["/etc/.service"]}', "lists '/etc/.service'"),
        ('{"version": 1, "files": [3]}', "lists 3"),
    ],
)
def test_bad_manifests_are_refused(tmp_path, text, fragment):
    path = tmp_path / "etc" / "numafleet" / "manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(UnitFileError) as err:
        units.read_manifest(str(tmp_path), "/etc/numafleet/manifest.json")
    assert fragment in str(err.value) and str(path) in str(err.value)
    assert "remove it" in str(err.value)


def test_missing_manifest_owns_nothing(tmp_path):
    manifest = units.read_manifest(str(tmp_path))
    assert manifest.text is None and manifest.files == ()
    assert units.plan_manifest(manifest, {}) is None
    assert units.plan_manifest(manifest, {A: "a"}).state == "create"


def _tree(root) -> dict:
    found = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            found[os.path.relpath(path, root)] = (
                None if os.path.isdir(path) else open(path, encoding="utf-8").read()
            )
    return found


def test_write_read_remove_round_trip(tmp_path):
    root = str(tmp_path)
    foreign = tmp_path / "etc/systemd/system/vllm.service.d/10-user.conf"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("[Service]\n")
    desired = render(placement(), dropin(), placement("b"), tenants=[tenant()])
    manifest = units.read_manifest(root)
    changes = units.plan_changes(units.read_files(root, desired), desired, list(manifest.files))
    assert {c.state for c in changes} == {"create"}
    units.write_files(root, changes)
    units.write_manifest(root, units.plan_manifest(manifest, desired))
    for path, text in desired.items():
        real = units.under_root(root, path)
        assert open(real, encoding="utf-8").read() == text
        assert stat.S_IMODE(os.stat(real).st_mode) == 0o644
    assert not [p for p in _tree(root) if p.endswith(".tmp")]
    manifest = units.read_manifest(root)
    assert list(manifest.files) == sorted(desired)

    # second run: nothing to do
    again = units.plan_changes(units.read_files(root, desired), desired, list(manifest.files))
    assert {c.state for c in again} == {"unchanged"}
    assert units.plan_manifest(manifest, desired).state == "unchanged"

    # drop the drop-in and "b": their files go, the foreign drop-in and its directory stay
    smaller = render(placement(), tenants=[tenant()])
    current = units.read_files(root, set(smaller) | set(manifest.files))
    changes = units.plan_changes(current, smaller, list(manifest.files))
    removed = sorted(c.path for c in changes if c.state == "remove")
    assert removed == [f"{UNIT_DIR}/numafleet-b.service", D]
    units.write_files(root, changes)
    units.write_manifest(root, units.plan_manifest(manifest, smaller))
    assert foreign.read_text() == "[Service]\n"
    assert not (tmp_path / "etc/systemd/system/vllm.service.d/50-numafleet.conf").exists()
    assert not (tmp_path / "etc/systemd/system/numafleet-b.service").exists()
    assert list(units.read_manifest(root).files) == sorted(smaller)

    # and without the foreign file the empty .d directory goes too
    desired = render(placement(), dropin())
    manifest = units.read_manifest(root)
    current = units.read_files(root, set(desired) | set(manifest.files))
    units.write_files(root, units.plan_changes(current, desired, list(manifest.files)))
    units.write_manifest(root, units.plan_manifest(manifest, desired))
    foreign.unlink()
    manifest = units.read_manifest(root)
    current = units.read_files(root, set(manifest.files))
    units.write_files(root, units.plan_changes(current, {}, list(manifest.files)))
    units.write_manifest(root, units.plan_manifest(manifest, {}))
    assert not (tmp_path / "etc/systemd/system/vllm.service.d").exists()
    assert json.loads((tmp_path / "etc/numafleet/manifest.json").read_text())["files"] == {}


def test_a_directory_where_a_unit_goes_is_an_error(tmp_path):
    (tmp_path / "etc/systemd/system/numafleet-llm.service").mkdir(parents=True)
    with pytest.raises(UnitFileError, match="is not a regular file; Move it away|is not a regular"):
        units.read_files(str(tmp_path), [f"{UNIT_DIR}/numafleet-llm.service"])


def test_unwritable_unit_dir_is_an_error(tmp_path):
    (tmp_path / "etc").write_text("a file, not a directory")
    change = units.FileChange(A, "create", None, "x")
    with pytest.raises(UnitFileError) as err:
        units.write_files(str(tmp_path), [change])
    assert str(tmp_path / "etc") in str(err.value) and "writable" in str(err.value)


def test_unit_of():
    assert units.unit_of(D) == "vllm.service"
    assert units.unit_of(A) == "numafleet-a.service"
    assert units.unit_of(S) == "numafleet-t.slice"
    assert units.is_dropin(D) and not units.is_dropin(A)


# --- systemd-analyze verify --------------------------------------------------------------------

MPS_TEMPLATE = "[Unit]\nDescription=MPS stub\n\n[Service]\nExecStart=/usr/bin/sleep infinity\n"
USER_UNIT = "[Unit]\nDescription=user unit\n\n[Service]\nExecStart=/usr/bin/sleep infinity\n"


def verify_plan() -> dict:
    """Every kind of file: plain, tenant, MPS, awkward arguments, no hardening, drop-ins, slices."""
    return make_plan(
        placement("plain"),
        placement(
            "tenant-a",
            argv=["/usr/bin/sleep", "100%", "$HOME", 'q"uote', "back\\slash", "two words", ";"],
            description='tenant A at 50% "quoted"',
            slice="numafleet-team\\x2da.slice",
            tenant="team-a",
            user="llm",
            group="llm",
            environment={"HF_HOME": "/srv/hf", "PCT": "50%", "Q": 'a "b" \\c $d'},
        ),
        placement(
            "mps",
            argv=["sleep", "infinity"],
            slice="numafleet-team_b.slice",
            tenant="team_b",
            mps={"pipe_dir": "/run/nvidia-mps/GPU-8e9f0a1b-2c3d-4e5f-6a7b-8c9d0e1f2a3b"},
            hardening=False,
        ),
        dropin("vllm", unit="vllm.service", cpus=[6, 7], mems=[1]),
        dropin(
            "mig",
            unit="worker.service",
            mps={"pipe_dir": "/run/nvidia-mps/MIG-1a2b3c4d-0000-1111-2222-333344445555"},
        ),
        tenants=[
            tenant(placements=["tenant-a"], memory_max_kb=1048576, description="Team A 100%"),
            tenant("team_b", placements=["mps"], cpus=[8, 9, 10], mems=[0, 1]),
        ],
    )


def _verify_findings(unit_dir, names) -> list[str]:
    """Lines systemd-analyze verify prints about our files (it exits 0 even on Unknown key)."""
    argv = [SYSTEMD_ANALYZE, "verify", "--man=no"] + [str(unit_dir / name) for name in names]
    env = dict(os.environ, LC_ALL="C", SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    ours = [str(unit_dir)] + list(names)
    lines = (proc.stdout + proc.stderr).splitlines()
    findings = [line for line in lines if any(mark in line for mark in ours)]
    if proc.returncode != 0:
        findings.append(f"rc={proc.returncode}: {lines}")
    return findings


def _write_for_verify(tmp_path, files: dict) -> tuple:
    root = str(tmp_path / "root")
    units.write_files(root, [units.FileChange(p, "create", None, t) for p, t in files.items()])
    unit_dir = tmp_path / "root" / UNIT_DIR.lstrip("/")
    (unit_dir / "nvidia-mps@.service").write_text(MPS_TEMPLATE)
    for user_unit in ("vllm.service", "worker.service"):
        (unit_dir / user_unit).write_text(USER_UNIT)
    names = sorted({units.unit_of(path) for path in files})
    return unit_dir, names


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("hardening", [True, False])
def test_rendered_units_pass_systemd_analyze_verify(tmp_path, hardening):
    files = units.render_files(verify_plan(), hardening_default=hardening)
    assert len(files) == 7
    unit_dir, names = _write_for_verify(tmp_path, files)
    assert _verify_findings(unit_dir, names) == []


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(
    "damage",
    [
        ("numafleet-plain.service", "\nBogusKey=1\n"),
        ("vllm.service", None),  # the drop-in's file
        ("numafleet-team\\x2da.slice", "\n[Slice]\nCPUQuotaa=5%\n"),
    ],
)
def test_verify_check_catches_a_bad_file(tmp_path, damage):
    """The filter above is no blind spot: a wrong key in any of our files is reported."""
    files = units.render_files(verify_plan())
    unit_dir, names = _write_for_verify(tmp_path, files)
    name, extra = damage
    target = unit_dir / "vllm.service.d" / "50-numafleet.conf" if extra is None else unit_dir / name
    target.write_text(target.read_text() + (extra or "Unknownish=1\n"))
    assert _verify_findings(unit_dir, names) != []


def test_mig_placements_start_after_the_mig_boot_unit():
    mig = {"profile": "3g.40gb", "placement_start": 4, "device_uuid": "MIG-1a2b"}
    on_mig = placement(gpus=[{"address": "0000:17:00.0", "uuid": "GPU-8e9f", "mig": mig}])
    whole = placement(gpus=[{"address": "0000:31:00.0", "uuid": "GPU-77aa", "mig": None}])
    text = units.render_files(make_plan(on_mig))[f"{UNIT_DIR}/numafleet-llm.service"]
    assert "[Unit]\n" in text and "After=numafleet-mig.service\n" in text
    text = units.render_files(make_plan(whole))[f"{UNIT_DIR}/numafleet-llm.service"]
    assert "numafleet-mig.service" not in text


# The boot units of the mig and amd layers share units.boot_unit_text; these texts are the ones
# each layer rendered before (byte for byte), so the shared renderer changed nothing.
BOOT_UNIT_TAIL = (
    "ConditionPathExists=/etc/numafleet/s.json\n"
    "\n"
    "[Service]\n"
    "Type=oneshot\n"
    "RemainAfterExit=yes\n"
    'ExecStart="/usr/bin/python3" "/usr/local/libexec/x 100%%" "/etc/numafleet/s.json"\n'
    "\n"
    "[Install]\n"
    "WantedBy=multi-user.target\n"
)


@pytest.mark.parametrize(
    ("layer", "unit_lines"),
    [
        (
            "mig",
            "Description=Re-create the MIG layout recorded by numafleet.tuning\n"
            "After=nvidia-persistenced.service\n"
            "Before=multi-user.target\n",
        ),
        (
            "amd",
            "Description=Set the AMD GPU partition modes recorded by numafleet.tuning\n"
            "After=systemd-modules-load.service\n"
            "Before=multi-user.target a@1.service b.service\n",
        ),
    ],
)
def test_boot_units_render_byte_for_byte_as_before(layer, unit_lines):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import amd_partition, mig

    args = ("/usr/local/libexec/x 100%", "/etc/numafleet/s.json", "# Managed\n# two")
    if layer == "mig":
        text = mig.unit_text(*args)
    else:
        text = amd_partition.unit_text(*args, ("b.service", "a@1.service"))
    assert text == "# Managed\n# two\n\n[Unit]\n" + unit_lines + BOOT_UNIT_TAIL
