"""mps.py: MPS daemons of a plan, their template and drop-ins, actions and live settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mps, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    UnitRenderError,
)

UNIT_DIR = "/etc/systemd/system"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
GPU = "GPU-fdb5df64-11ce-5c72-a560-9702875cecd6"
MIG = "MIG-1a2b3c4d-0000-1111-2222-333344445555"


def daemon_entry(instance=GPU, **overrides) -> dict:
    """An entry of plan["mps_daemons"] with the fields the lead's planner adds (issue 7)."""
    base = {
        "device_uuid": instance,
        "gpu_address": "0000:31:00.0",
        "pipe_dir": f"/run/nvidia-mps/{instance}",
        "log_dir": f"/var/log/nvidia-mps/{instance}",
        "clients": ["rerank-a", "rerank-b"],
        "active_thread_percentage": 50,
        "unit": f"nvidia-mps@{instance}.service" if instance else None,
        "instance": instance,
        "gpu_uuid": GPU,
        "mig": False,
        "node": 0,
        "cpus": [7, 4, 5, 6],
        "mems": [0],
        "user": "tei",
        "group": None,
        "pinned_memory_limit_kb": 16 << 20,
    }
    base.update(overrides)
    return base


def mig_entry(instance=MIG, **overrides) -> dict:
    fields = {
        "gpu_address": "0000:17:00.0",
        "gpu_uuid": "GPU-5a7c0b8e-1111-2222-3333-444455556666",
        "mig": True,
        "clients": ["embed"],
        "active_thread_percentage": None,
        "pinned_memory_limit_kb": None,
        "user": None,
        "cpus": [8, 9],
    }
    fields.update(overrides)
    return daemon_entry(instance, **fields)


def make_plan(*entries) -> dict:
    return {"version": 1, "host": "gpu-a100-01", "placements": [], "mps_daemons": list(entries)}


def render(*entries, **kwargs) -> dict:
    daemons, dummy = mps.plan_daemons(make_plan(*entries))
    return mps.render_files(daemons, kwargs.pop("header", units.DEFAULT_HEADER), UNIT_DIR, **kwargs)


DROPIN = f"{UNIT_DIR}/nvidia-mps@{GPU}.service.d/50-numafleet.conf"
TEMPLATE = f"{UNIT_DIR}/nvidia-mps@.service"

GOLDEN_TEMPLATE = """\
# Managed by numafleet.tuning

[Unit]
Description=NVIDIA CUDA MPS control daemon for %i
After=numafleet-mig.service nvidia-persistenced.service

[Service]
Type=forking
Environment="CUDA_VISIBLE_DEVICES=%i"
Environment="CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/%i"
Environment="CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps/%i"
RuntimeDirectory=nvidia-mps/%i
RuntimeDirectoryMode=0700
LogsDirectory=nvidia-mps/%i
LogsDirectoryMode=0750
ExecStart=/usr/bin/nvidia-cuda-mps-control -d
ExecStop=/bin/sh -c 'echo quit | /usr/bin/nvidia-cuda-mps-control'
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""

GOLDEN_DROPIN = f"""\
# Managed by numafleet.tuning

[Unit]
Description=NVIDIA CUDA MPS control daemon, GPU {GPU}

[Service]
User=tei
CPUAffinity=4-7
NUMAPolicy=bind
NUMAMask=0
AllowedCPUs=4-7
AllowedMemoryNodes=0
ExecStartPre=+/usr/bin/nvidia-smi -i 0000:31:00.0 -c EXCLUSIVE_PROCESS
ExecStartPost=/bin/sh -c 'echo set_default_active_thread_percentage 50 | /usr/bin/nvidia-cuda-mps-control'
ExecStartPost=/bin/sh -c 'echo set_default_device_pinned_mem_limit 0 16384M | /usr/bin/nvidia-cuda-mps-control'
ExecStopPost=+/usr/bin/nvidia-smi -i 0000:31:00.0 -c DEFAULT
"""


def test_template_and_dropin_text():
    files = render(daemon_entry())
    assert list(files) == [TEMPLATE, DROPIN]
    assert files[TEMPLATE] == GOLDEN_TEMPLATE
    assert files[DROPIN] == GOLDEN_DROPIN


def test_mig_device_gets_no_compute_mode_and_no_unset_settings():
    files = render(mig_entry(group="video"))
    text = files[f"{UNIT_DIR}/nvidia-mps@{MIG}.service.d/50-numafleet.conf"]
    assert "nvidia-smi" not in text and "EXCLUSIVE_PROCESS" not in text
    assert "ExecStartPost" not in text and "User=" not in text
    assert "Group=video\nCPUAffinity=8-9\n" in text
    assert f"Description=NVIDIA CUDA MPS control daemon, MIG device {MIG}\n" in text
    assert "embed" not in text  # no client names: a new client must not change the daemon


def test_no_daemons_no_files():
    assert render() == {}
    assert mps.plan_daemons({"version": 1, "placements": [], "mps_daemons": []}) == ([], [])


def test_pending_mig_daemon_is_skipped_with_a_warning():
    pending = mig_entry(instance=None, device_uuid=None, unit=None, pipe_dir="/run/x-mig4")
    daemons, warnings = mps.plan_daemons(make_plan(pending, daemon_entry()))
    assert [d.unit for d in daemons] == [f"nvidia-mps@{GPU}.service"]
    assert warnings == [
        "host gpu-a100-01: MPS daemon for embed on GPU 0000:17:00.0 skipped: its MIG instance "
        "does not exist yet; create it (numafleet.tuning.nvidia_mig) and plan again"
    ]


def test_pending_mig_daemon_says_what_it_waits_for():
    waits = {
        "mig_instance": "2g.20gb at slice 2 of GPU 0000:17:00.0",
        "reason": "mode change pending a reset",
    }
    pending = mig_entry(
        instance=None, device_uuid=None, unit=None, pipe_dir="/run/x-mig4", waits_for=waits
    )
    daemons, warnings = mps.plan_daemons(make_plan(pending))
    assert daemons == []
    assert warnings[0].endswith(
        "plan again (waits for MIG instance 2g.20gb at slice 2 of GPU 0000:17:00.0: mode change "
        "pending a reset; not started until it exists)"
    )
    files = mps.render_files(daemons, units.DEFAULT_HEADER, UNIT_DIR)
    assert not [path for path in files if "@." not in path]  # no daemon unit, only the template


def test_daemons_are_sorted_by_unit():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry(), mig_entry()))
    assert [d.instance for d in daemons] == [GPU, MIG]
    assert daemons[0].as_dict()["pinned_memory_limit_mib"] == 16384
    assert daemons[0].as_dict()["cpus"] == [4, 5, 6, 7]


def test_small_pinned_limit_rounds_up_to_one_mib():
    text = render(daemon_entry(pinned_memory_limit_kb=100))[DROPIN]
    assert "set_default_device_pinned_mem_limit 0 1M" in text


def test_header_and_programs_reach_the_files():
    files = render(
        daemon_entry(),
        header="# one\n# two",
        control="/opt/cuda/bin/nvidia-cuda-mps-control",
        nvidia_smi="/opt/nv/nvidia-smi",
    )
    assert files[TEMPLATE].startswith("# one\n# two\n\n[Unit]\n")
    assert "ExecStart=/opt/cuda/bin/nvidia-cuda-mps-control -d\n" in files[TEMPLATE]
    assert "+/opt/nv/nvidia-smi -i 0000:31:00.0 -c EXCLUSIVE_PROCESS" in files[DROPIN]
    assert render(daemon_entry(), header="")[TEMPLATE].startswith("[Unit]\n")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"instance": "GPU-1 2"}, "instance: 'GPU-1 2' is not a GPU-... or MIG-... device UUID"),
        ({"instance": "../x"}, "not a GPU-... or MIG-... device UUID"),
        ({"unit": "nvidia-mps@other.service"}, "unit is 'nvidia-mps@other.service', expected"),
        ({"gpu_address": "31:00.0"}, "gpu_address: '31:00.0' is not a PCI address"),
        ({"gpu_address": "0000:31:00.0; rm"}, "is not a PCI address"),
        ({"pipe_dir": "/tmp/mps"}, "pipe_dir is '/tmp/mps'; the nvidia-mps@ template uses"),
        ({"log_dir": "/var/log/x"}, "log_dir is '/var/log/x'"),
        ({"active_thread_percentage": 0}, "active_thread_percentage is 0, not 1-100"),
        ({"active_thread_percentage": 101}, "not 1-100"),
        ({"active_thread_percentage": "50"}, "active_thread_percentage is '50', not a int"),
        ({"active_thread_percentage": True}, "not a int"),
        ({"pinned_memory_limit_kb": 0}, "pinned_memory_limit_kb is 0, not above 0"),
        ({"cpus": []}, "cpus is [], not a non-empty list"),
        ({"mems": [-1]}, "mems is [-1]"),
        ({"user": "a b"}, "user: 'a b' is not a user or group name"),
        ({"group": "x\n[Service]"}, "group: 'x\\n[Service]' is not a user or group name"),
        ({"mig": None}, "mig is None, not a bool"),
        ({"cpus": None}, "cpus is None, not a list"),
    ],
)
def test_bad_daemon_entries_are_refused_with_the_entry_named(overrides, fragment):
    with pytest.raises(UnitRenderError) as err:
        mps.plan_daemons(make_plan(daemon_entry(**overrides)))
    message = str(err.value)
    assert message.startswith("host gpu-a100-01: plan mps_daemons[0]")
    assert fragment in message


def test_missing_instance_key_is_refused():
    entry = daemon_entry()
    del entry["instance"]
    with pytest.raises(UnitRenderError, match="has no 'instance'; pass the numafleet_plan"):
        mps.plan_daemons(make_plan(entry))


def test_a_daemon_planned_twice_is_refused():
    with pytest.raises(UnitRenderError, match="is planned twice"):
        mps.plan_daemons(make_plan(daemon_entry(), daemon_entry()))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"control": "nvidia-cuda-mps-control"}, "nvidia_cuda_mps_control: 'nvidia-cuda-mps"),
        ({"control": "/opt/my dir/ctl"}, "holds characters other than"),
        ({"nvidia_smi": "/usr/bin/nvidia-smi'"}, "nvidia_smi:"),
        ({"header": "not a comment"}, "is not a comment"),
        ({"control": "/usr/bin/nvidia-cuda-mps-control/"}, "is not normalised"),
        ({"nvidia_smi": "/usr//bin/nvidia-smi"}, "is not normalised"),
        ({"nvidia_smi": "/opt/" + "n" * 256}, "component of 256"),
    ],
)
def test_bad_options_are_refused(kwargs, fragment):
    with pytest.raises(UnitRenderError, match=fragment.replace("(", r"\(")):
        render(daemon_entry(), **kwargs)


def test_plan_must_be_a_mapping():
    with pytest.raises(NumaTuneError, match="plan is list, not a mapping"):
        mps.plan_daemons([])
    with pytest.raises(NumaTuneError, match="mps_daemons is 'x', not a list"):
        mps.plan_daemons({"mps_daemons": "x"})


# --- actions -----------------------------------------------------------------------------------


def changes_for(desired: dict, current: dict, owned=()) -> list:
    return units.plan_changes(current, desired, list(owned))


def test_first_run_starts_every_daemon():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry(), mig_entry()))
    files = mps.render_files(daemons, "", UNIT_DIR)
    actions = mps.plan_actions(changes_for(files, {}), daemons)
    assert actions.start == (f"nvidia-mps@{GPU}.service", f"nvidia-mps@{MIG}.service")
    assert actions.restart == () and actions.disable == ()
    assert actions.would_run() == [
        "systemctl daemon-reload",
        f"systemctl enable --now nvidia-mps@{GPU}.service",
        f"systemctl enable --now nvidia-mps@{MIG}.service",
    ]


def test_changed_template_restarts_every_existing_daemon():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry(), mig_entry()))
    files = mps.render_files(daemons, "", UNIT_DIR)
    mig_dropin = f"{UNIT_DIR}/nvidia-mps@{MIG}.service.d/50-numafleet.conf"
    current = {TEMPLATE: "old", DROPIN: files[DROPIN]}
    actions = mps.plan_actions(changes_for(files, current), daemons)
    assert actions.start == (f"nvidia-mps@{MIG}.service",)
    assert actions.restart == (f"nvidia-mps@{GPU}.service",)
    assert actions.units["changed"] == [f"nvidia-mps@{GPU}.service"]
    assert actions.units["unchanged"] == []
    assert mig_dropin in files


def test_removed_daemon_is_disabled_and_unchanged_ones_left_alone():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry()))
    files = mps.render_files(daemons, "", UNIT_DIR)
    gone = f"{UNIT_DIR}/nvidia-mps@{MIG}.service.d/50-numafleet.conf"
    current = dict(files, **{gone: "x"})
    actions = mps.plan_actions(changes_for(files, current, owned=[gone]), daemons)
    assert actions.disable == (f"nvidia-mps@{MIG}.service",)
    assert actions.restart == () and actions.start == ()
    assert actions.units["unchanged"] == [f"nvidia-mps@{GPU}.service"]
    assert actions.would_run()[0] == f"systemctl disable --now nvidia-mps@{MIG}.service"


def test_nothing_to_do_when_all_unchanged():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry()))
    files = mps.render_files(daemons, "", UNIT_DIR)
    actions = mps.plan_actions(changes_for(files, dict(files)), daemons)
    assert actions.would_run() == [] and not actions.reload_needed


# --- live settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [("25.0\n", 25), ("100.0", 100), ("50", 50), ("", None), ("error", None), ("33.3", None)],
)
def test_parse_thread_percentage(text, want):
    assert mps.parse_thread_percentage(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("3G\n", 3072),
        ("1024M", 1024),
        ("16384M\n", 16384),
        ("Device 0 default pinned memory limit: 8 GiB", 8192),
        ("0", 0),
        ("", None),
        ("garbage", None),
    ],
)
def test_parse_pinned_mem_limit(text, want):
    assert mps.parse_pinned_mem_limit(text) == want


class RecordedRunner:
    """runner(argv, stdin, env) answering from a table of stdin -> (rc, out, err); records calls."""

    def __init__(self, answers: dict, active=True):
        self.answers = answers
        self.active = active
        self.calls = []

    def __call__(self, argv, stdin, env):
        self.calls.append((list(argv), stdin, dict(env)))
        if argv[1:2] == ["is-active"]:
            return (0 if self.active else 3, "", "")
        return self.answers.get(stdin.strip(), (0, "", ""))


def planned_daemon():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry()))
    return daemons


def no_actions():
    return mps.plan_actions([], [])


def test_read_back_sends_commands_with_the_pipe_directory():
    runner = RecordedRunner(
        {
            "get_default_active_thread_percentage": (0, "100.0\n", ""),
            "get_default_device_pinned_mem_limit 0": (0, "16G\n", ""),
        }
    )
    entries, ran, drift = mps.sync_settings(
        runner, "/bin/systemctl", mps.DEFAULT_CONTROL, planned_daemon(), no_actions(), True
    )
    assert entries == [
        {
            "unit": f"nvidia-mps@{GPU}.service",
            "active_thread_percentage": {"planned": 50, "running": 100},
            "pinned_memory_limit_mib": {"planned": 16384, "running": 16384},
        }
    ]
    assert drift is True
    assert ran == [
        f"CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/{GPU} /usr/bin/nvidia-cuda-mps-control <<< "
        "'set_default_active_thread_percentage 50'"
    ]
    control_calls = [call for call in runner.calls if call[0] == [mps.DEFAULT_CONTROL]]
    assert [call[1] for call in control_calls] == [
        "get_default_active_thread_percentage\n",
        "get_default_device_pinned_mem_limit 0\n",
        "set_default_active_thread_percentage 50\n",
    ]
    assert all(
        call[2]["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/nvidia-mps/{GPU}" for call in control_calls
    )
    assert runner.calls[0][0] == [
        "/bin/systemctl",
        "is-active",
        "--quiet",
        f"nvidia-mps@{GPU}.service",
    ]


def test_read_back_without_apply_sets_nothing():
    runner = RecordedRunner({"get_default_active_thread_percentage": (0, "30.0", "")})
    entries, ran, drift = mps.sync_settings(
        runner, "systemctl", mps.DEFAULT_CONTROL, planned_daemon(), no_actions(), False
    )
    assert drift and ran == []
    assert all("set_default" not in (call[1] or "") for call in runner.calls)
    # an unreadable answer is "unknown", never a drift
    assert entries[0]["pinned_memory_limit_mib"] == {"planned": 16384, "running": None}


def test_inactive_daemons_are_not_asked():
    runner = RecordedRunner({}, active=False)
    assert mps.sync_settings(
        runner, "systemctl", mps.DEFAULT_CONTROL, planned_daemon(), no_actions(), True
    ) == ([], [], False)
    assert len(runner.calls) == 1


def test_failed_set_names_the_unit_and_the_log():
    runner = RecordedRunner(
        {
            "get_default_active_thread_percentage": (0, "100.0", ""),
            "set_default_active_thread_percentage 50": (1, "", "Cannot find MPS control daemon\n"),
        }
    )
    with pytest.raises(mps.MpsControlError) as err:
        mps.sync_settings(
            runner, "systemctl", mps.DEFAULT_CONTROL, planned_daemon(), no_actions(), True
        )
    assert str(err.value) == (
        f"nvidia-mps@{GPU}.service: 'set_default_active_thread_percentage 50' sent to "
        "/usr/bin/nvidia-cuda-mps-control failed (rc 1): Cannot find MPS control daemon; check "
        f"the daemon's log in /var/log/nvidia-mps/{GPU}/control.log, or restart it "
        f"(systemctl restart nvidia-mps@{GPU}.service)"
    )


def test_a_daemon_restarted_anyway_is_reported_not_set():
    daemons = planned_daemon()
    files = mps.render_files(daemons, "", UNIT_DIR)
    actions = mps.plan_actions(changes_for(files, dict(files, **{DROPIN: "old"})), daemons)
    runner = RecordedRunner({"get_default_active_thread_percentage": (0, "100.0", "")})
    entries, ran, drift = mps.sync_settings(
        runner, "systemctl", mps.DEFAULT_CONTROL, daemons, actions, True
    )
    assert entries and ran == [] and drift is False


# --- systemd-analyze verify --------------------------------------------------------------------


def _verify_findings(unit_dir, names) -> list:
    argv = [SYSTEMD_ANALYZE, "verify", "--man=no"] + [str(unit_dir / name) for name in names]
    env = dict(os.environ, LC_ALL="C", SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    lines = (proc.stdout + proc.stderr).splitlines()
    if proc.returncode != 0:
        lines.append(f"rc={proc.returncode}")
    return lines


def _fake_programs(tmp_path) -> dict:
    """Executables standing in for nvidia-cuda-mps-control and nvidia-smi (verify checks them)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    paths = {}
    for name in ("nvidia-cuda-mps-control", "nvidia-smi"):
        path = bin_dir / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
        paths[name] = str(path)
    return {"control": paths["nvidia-cuda-mps-control"], "nvidia_smi": paths["nvidia-smi"]}


def _write(tmp_path, files) -> object:
    root = str(tmp_path / "root")
    units.write_files(root, [units.FileChange(p, "create", None, t) for p, t in files.items()])
    return tmp_path / "root" / UNIT_DIR.lstrip("/")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_rendered_units_pass_systemd_analyze_verify(tmp_path):
    """Any line systemd-analyze prints is a finding (it exits 0 on Unknown key)."""
    files = render(daemon_entry(user="root", group="root"), mig_entry(), **_fake_programs(tmp_path))
    unit_dir = _write(tmp_path, files)
    names = [f"nvidia-mps@{GPU}.service", f"nvidia-mps@{MIG}.service"]
    assert _verify_findings(unit_dir, names) == []


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("target", ["template", "dropin"])
def test_verify_check_catches_a_bad_file(tmp_path, target):
    files = render(daemon_entry(user="root"), **_fake_programs(tmp_path))
    unit_dir = _write(tmp_path, files)
    path = (
        unit_dir / "nvidia-mps@.service"
        if target == "template"
        else unit_dir / (f"nvidia-mps@{GPU}.service.d/50-numafleet.conf")
    )
    path.write_text(path.read_text() + "BogusKey=1\n")
    assert _verify_findings(unit_dir, [f"nvidia-mps@{GPU}.service"]) != []


@pytest.mark.parametrize(
    ("user", "fragment"),
    [
        ("65535", "not a user or group name"),
        ("a" * 32, "at most 31 characters"),
        ("tei\n", "not a user or group name"),
    ],
)
def test_accounts_systemd_refuses_are_refused(user, fragment):
    with pytest.raises(UnitRenderError, match=fragment):
        mps.plan_daemons(make_plan(daemon_entry(user=user)))


# --- behaviours the mutation run found unguarded (issue 19, section 5) ---------------------------


def test_as_dict_gives_every_field_of_the_daemon():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry(group="video", node=None)))
    assert daemons[0].as_dict() == {
        "unit": f"nvidia-mps@{GPU}.service",
        "instance": GPU,
        "gpu_address": "0000:31:00.0",
        "gpu_uuid": GPU,
        "mig": False,
        "node": None,
        "cpus": [4, 5, 6, 7],
        "mems": [0],
        "user": "tei",
        "group": "video",
        "active_thread_percentage": 50,
        "pinned_memory_limit_mib": 16384,
        "pipe_dir": f"/run/nvidia-mps/{GPU}",
        "log_dir": f"/var/log/nvidia-mps/{GPU}",
        "clients": ["rerank-a", "rerank-b"],
    }


def test_optional_fields_may_be_absent_or_none():
    entry = daemon_entry(cpus=[3, 1, 3, 2], mems=[1, 0, 1])
    for key in ("clients", "node", "gpu_uuid", "user", "group"):
        del entry[key]
    entry["active_thread_percentage"] = None
    entry["pinned_memory_limit_kb"] = None
    daemons, warnings = mps.plan_daemons(make_plan(entry))
    got = daemons[0].as_dict()
    assert warnings == []
    assert (got["clients"], got["node"], got["gpu_uuid"], got["user"], got["group"]) == (
        [],
        None,
        None,
        None,
        None,
    )
    assert got["cpus"] == [1, 2, 3] and got["mems"] == [0, 1]
    assert got["pinned_memory_limit_mib"] is None and got["active_thread_percentage"] is None
    text = mps.render_files(daemons, "", UNIT_DIR)[DROPIN]
    assert "User=" not in text and "Group=" not in text and "ExecStartPost=" not in text


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"pinned_memory_limit_kb": -5}, "pinned_memory_limit_kb is -5, not above 0"),
        ({"cpus": [1, True]}, "cpus is [1, True], not a non-empty list"),
        ({"mems": ["0"]}, "mems is ['0']"),
        ({"cpus": "0-3"}, "cpus is '0-3', not a list"),
        ({"node": "0"}, "node is '0', not a int"),
        ({"clients": "a"}, "clients is 'a', not a list"),
        ({"gpu_uuid": 5}, "gpu_uuid is 5, not a str"),
        ({"instance": 7}, "instance is 7, not a str"),
        ({"mig": "yes"}, "mig is 'yes', not a bool"),
    ],
)
def test_more_bad_daemon_entries_are_refused(overrides, fragment):
    with pytest.raises(UnitRenderError) as err:
        mps.plan_daemons(make_plan(daemon_entry(**overrides)))
    assert str(err.value).startswith("host gpu-a100-01: plan mps_daemons[0]")
    assert fragment in str(err.value)


@pytest.mark.parametrize("key", ["unit", "gpu_address", "pipe_dir", "log_dir", "mig", "cpus"])
def test_a_missing_required_field_is_refused_by_name(key):
    entry = daemon_entry()
    del entry[key]
    with pytest.raises(UnitRenderError, match=f"mps_daemons\\[0\\] has no '{key}'"):
        mps.plan_daemons(make_plan(entry))


@pytest.mark.parametrize(
    ("percentage", "kb", "mib"), [(1, 1, 1), (100, 2048, 2), (7, 1 << 30, 1 << 20)]
)
def test_limits_at_their_bounds_are_accepted(percentage, kb, mib):
    text = render(daemon_entry(active_thread_percentage=percentage, pinned_memory_limit_kb=kb))[
        DROPIN
    ]
    assert f"echo set_default_active_thread_percentage {percentage} |" in text
    assert f"echo set_default_device_pinned_mem_limit 0 {mib}M |" in text


def test_the_dropin_names_the_device_kind_and_the_group():
    gpu = render(daemon_entry(group="video"))[DROPIN]
    assert f"Description=NVIDIA CUDA MPS control daemon, GPU {GPU}\n" in gpu
    assert "User=tei\nGroup=video\n" in gpu
    mig_dropin = f"{UNIT_DIR}/nvidia-mps@{MIG}.service.d/50-numafleet.conf"
    mig = render(mig_entry(group="video"))[mig_dropin]
    assert f"Description=NVIDIA CUDA MPS control daemon, MIG device {MIG}\n" in mig
    assert "Group=video\n" in mig and "User=" not in mig


def test_plan_errors_name_the_host_only_when_it_is_known():
    with pytest.raises(UnitRenderError) as err:
        mps.plan_daemons({"host": 5, "mps_daemons": [daemon_entry(cpus=[])]})
    assert str(err.value).startswith("plan mps_daemons[0].cpus")
    with pytest.raises(UnitRenderError) as err:
        mps.plan_daemons({"host": "", "mps_daemons": [daemon_entry(cpus=[])]})
    assert str(err.value).startswith("plan mps_daemons[0].cpus")
    with pytest.raises(UnitRenderError) as err:
        mps.plan_daemons({"host": "gpu-a100-01"})
    assert str(err.value).startswith("host gpu-a100-01: plan has no mps_daemons")
    with pytest.raises(UnitRenderError) as err:
        mps.plan_daemons(make_plan(daemon_entry(), "x"))
    assert str(err.value).startswith("host gpu-a100-01: plan mps_daemons[1] is not a mapping")
    assert mps.plan_daemons({"mps_daemons": []}) == ([], [])


def test_pending_mig_daemons_warn_with_their_clients_and_gpu():
    daemons, warnings = mps.plan_daemons(
        make_plan(
            mig_entry(instance=None, clients=["a", "b"]),
            mig_entry(instance=None, clients=[]),
            mig_entry(instance=None, clients=None),
        )
    )
    assert daemons == []
    assert warnings[0].startswith(
        "host gpu-a100-01: MPS daemon for a, b on GPU 0000:17:00.0 skipped: its MIG instance "
        "does not exist yet; create it (numafleet.tuning.nvidia_mig) and plan again"
    )
    assert warnings[1].startswith("host gpu-a100-01: MPS daemon for no client on GPU 0000:17:00.0")
    assert warnings[2] == warnings[1]


def test_a_changed_dropin_restarts_only_its_daemon():
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry(), mig_entry()))
    files = mps.render_files(daemons, "", UNIT_DIR)
    mig_unit = f"nvidia-mps@{MIG}.service"
    actions = mps.plan_actions(changes_for(files, dict(files, **{DROPIN: "old"})), daemons)
    assert actions.restart == (f"nvidia-mps@{GPU}.service",) and actions.start == ()
    assert actions.units == {
        "new": [],
        "changed": [f"nvidia-mps@{GPU}.service"],
        "removed": [],
        "unchanged": [mig_unit],
    }
    assert actions.slices == {"new": [], "changed": [], "removed": [], "unchanged": []}
    assert actions.reload_needed
    # a file that is neither the template nor a drop-in restarts nothing
    other = f"{UNIT_DIR}/other.service"
    actions = mps.plan_actions(
        changes_for(dict(files, **{other: "x"}), dict(files, **{other: "y"})), daemons
    )
    assert actions.restart == () and actions.units["unchanged"] == sorted(
        [f"nvidia-mps@{GPU}.service", mig_unit]
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1T", 1 << 20),
        ("2048K", 2),
        ("2048KiB", 2),
        ("1536K", None),
        ("1.5G", 1536),
        ("2 GB", 2048),
        ("none", 0),
        ("Unlimited\n", 0),
        ("not set", 0),
        ("N/A", 0),
        (None, None),
        ("  \n", None),
    ],
)
def test_parse_pinned_mem_limit_units(text, want):
    assert mps.parse_pinned_mem_limit(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("MPS: ready\n25.0\n\n", 25), (None, None), ("  \n", None), ("40.0\nready", None)],
)
def test_parse_thread_percentage_reads_the_last_line(text, want):
    assert mps.parse_thread_percentage(text) == want


def test_a_failed_set_without_stderr_names_stdout_or_no_output():
    for answer, detail in (((2, "busy\nmore", ""), "busy"), ((3, "", ""), "no output")):
        runner = RecordedRunner(
            {
                "get_default_active_thread_percentage": (0, "100.0", ""),
                "set_default_active_thread_percentage 50": answer,
            }
        )
        with pytest.raises(mps.MpsControlError) as err:
            mps.sync_settings(
                runner, "systemctl", mps.DEFAULT_CONTROL, planned_daemon(), no_actions(), True
            )
        assert f"failed (rc {answer[0]}): {detail}; check" in str(err.value)


def test_a_failed_read_is_unknown_and_a_pinned_limit_drift_is_set():
    runner = RecordedRunner(
        {
            "get_default_active_thread_percentage": (1, "50.0", ""),
            "get_default_device_pinned_mem_limit 0": (0, "8G", ""),
        }
    )
    entries, ran, drift = mps.sync_settings(
        runner, "systemctl", mps.DEFAULT_CONTROL, planned_daemon(), no_actions(), True
    )
    assert entries[0]["active_thread_percentage"] == {"planned": 50, "running": None}
    assert entries[0]["pinned_memory_limit_mib"] == {"planned": 16384, "running": 8192}
    assert drift and ran == [
        f"CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/{GPU} /usr/bin/nvidia-cuda-mps-control <<< "
        "'set_default_device_pinned_mem_limit 0 16384M'"
    ]
    env = runner.calls[1][2]
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": f"/run/nvidia-mps/{GPU}", "LC_ALL": "C", "LANG": "C"}


def test_a_daemon_started_in_this_run_is_not_asked():
    daemons = planned_daemon()
    files = mps.render_files(daemons, "", UNIT_DIR)
    actions = mps.plan_actions(changes_for(files, {}), daemons)
    runner = RecordedRunner({})
    assert mps.sync_settings(runner, "systemctl", mps.DEFAULT_CONTROL, daemons, actions, True) == (
        [],
        [],
        False,
    )
    assert runner.calls == []


def test_a_foreign_manifest_is_refused_naming_the_default():
    mps.check_manifest_owner("/etc/numafleet/mps-units.json", [DROPIN, TEMPLATE])
    foreign = [f"/etc/systemd/system/{name}.service" for name in "abcd"]
    with pytest.raises(UnitRenderError) as err:
        mps.check_manifest_owner("/etc/numafleet/manifest.json", [DROPIN, *foreign])
    message = str(err.value)
    assert message.startswith("manifest_path: /etc/numafleet/manifest.json lists files that")
    assert "(/etc/systemd/system/a.service, /etc/systemd/system/b.service, " in message
    assert "/etc/systemd/system/c.service, ...)" in message
    assert message.endswith("own manifest, e.g. /etc/numafleet/mps-units.json")
    with pytest.raises(UnitRenderError) as err:
        mps.check_manifest_owner("m.json", foreign[:3])
    assert "/etc/systemd/system/c.service): it belongs" in str(err.value)  # all three, no "..."
    with pytest.raises(UnitRenderError) as err:
        mps.check_manifest_owner("m.json", foreign[:1])
    assert "(/etc/systemd/system/a.service): it belongs" in str(err.value)


def test_a_planned_daemon_cannot_be_changed_afterwards():
    import dataclasses

    daemon = planned_daemon()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        daemon.user = "root"


# --- render mode: the recorded daemons ---------------------------------------------------------


def _none_started():
    return units.Actions({}, {}, False, (), (), ())


def test_render_apply_records_the_planned_defaults_and_check_mode_reads_them_back(tmp_path):
    root = str(tmp_path)
    daemons, dummy = mps.plan_daemons(make_plan(daemon_entry(), mig_entry()))
    assert mps.read_recording(root) is None and mps.recording_stale(root, daemons)
    assert mps.recorded_settings(None, daemons, _none_started()) == []  # nothing recorded: skip
    mps.write_recording(root, daemons)
    assert not mps.recording_stale(root, daemons)  # a second run changes nothing
    recording = mps.read_recording(root)
    settings = mps.recorded_settings(recording, daemons, _none_started())
    gpu = next(s for s in settings if s["unit"] == f"nvidia-mps@{GPU}.service")
    assert gpu["active_thread_percentage"] == {"planned": 50, "running": 50}
    assert gpu["pinned_memory_limit_mib"] == {"planned": 16384, "running": 16384}

    # somebody changed a daemon's default in the recording: read back as drift, named
    path = tmp_path / mps.RECORDING_PATH.lstrip("/")
    data = json.loads(path.read_text())
    data["daemons"][f"nvidia-mps@{GPU}.service"]["active_thread_percentage"] = 100
    path.write_text(json.dumps(data))
    settings = mps.recorded_settings(mps.read_recording(root), daemons, _none_started())
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.layers import mps_drift

    assert mps_drift(settings) == [
        {
            "setting": f"nvidia-mps@{GPU}.service active_thread_percentage",
            "planned": 50,
            "actual": 100,
            "reason": "",
            "pending": False,
        }
    ]
    assert mps.recording_stale(root, daemons)
    mps.write_recording(root, [])  # no daemon planned any more: the recording goes
    assert not path.exists()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not JSON"),
        (
            '{"format": "other", "version": 1, "daemons": {}}',
            "not a numafleet.tuning/mps-recording",
        ),
        (
            '{"format": "numafleet.tuning/mps-recording", "version": 1, "daemons": '
            '{"u": {"active_thread_percentage": "50"}}}',
            "integers or null",
        ),
    ],
)
def test_a_bad_recording_is_refused_with_the_fix(tmp_path, text, fragment):
    path = tmp_path / mps.RECORDING_PATH.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(mps.MpsControlError, match=fragment) as err:
        mps.read_recording(str(tmp_path))
    assert "remove it and run site.yml again" in str(err.value)


def test_a_daemon_not_restarted_keeps_its_recorded_defaults(tmp_path):
    """restart never: the drop-in changed but the daemon runs on with the old defaults."""
    root = str(tmp_path)
    unit = f"nvidia-mps@{GPU}.service"
    old, dummy = mps.plan_daemons(make_plan(daemon_entry()))
    mps.write_recording(root, old)
    new, dummy = mps.plan_daemons(make_plan(daemon_entry(active_thread_percentage=60)))
    recording = mps.read_recording(root)
    assert not mps.recording_stale(root, new, recording, keep={unit})
    mps.write_recording(root, new, recording, keep={unit})
    assert mps.read_recording(root)[unit]["active_thread_percentage"] == 50
    mps.write_recording(root, new, mps.read_recording(root))  # restarted: the planned defaults
    assert mps.read_recording(root)[unit]["active_thread_percentage"] == 60
