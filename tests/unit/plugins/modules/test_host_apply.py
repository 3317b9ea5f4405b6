"""host_apply through main(): the five layers in one run on the demo GPU host, the handler pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import facts, planner

REPO = Path(__file__).resolve().parents[4]
MACHINE = "synthetic-2x6338-4xa100"  # the demo host gpu-a100-01
HOST_VARS = REPO / "inventories" / "demo" / "host_vars" / "gpu-a100-01.yml"
MODULES = {
    "hugepages": "numa_hugepages",
    "kernel": "numa_kernel",
    "gpu": "nvidia_gpu_settings",
    "amd": "amd_partition",
    "mig": "nvidia_mig",
    "mps": "nvidia_mps",
    "units": "pinned_units",
}
GPU_SETTING = {"gpu": "0000:31:00.0", "power_limit_w": 300}
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
if [ -n "$FAKE_SYSTEMCTL_FAIL" ] && [ "$1" = "$FAKE_SYSTEMCTL_FAIL" ]; then
  echo "Failed to $1" >&2; exit 1
fi
"""


def _snapshot(fsroot: str) -> str:
    import trees

    path = Path(fsroot) / "gpu-snapshot.json"
    if not path.exists():
        shutil.copyfile(trees.GPU_SNAPSHOT_DIR / f"{MACHINE}.json", path)
    return str(path)


@pytest.fixture(scope="module")
def demo_plan(fixture_root):
    """The plan of the demo host gpu-a100-01 (its host_vars, its recorded topology), made fresh."""
    fsroot = fixture_root(MACHINE)
    host_vars = yaml.safe_load(HOST_VARS.read_text())
    gathered, dummy = facts.gather_facts(
        {
            "sysfs_root": f"{fsroot}/sys",
            "procfs_root": f"{fsroot}/proc",
            "gpu": True,
            "gpu_snapshot": _snapshot(fixture_root(MACHINE, writable=True)),
            "nvidia_smi": "never",
            "nvidia_smi_timeout": 30,
        },
        True,
        None,
        lambda name: None,
        lambda: (None, "not used"),
    )
    plan = planner.plan_host(
        "gpu-a100-01",
        gathered["numa"],
        gathered["gpu_topology"],
        host_vars["numafleet_placements"],
        host_vars["numafleet_tenants"],
        {
            "reserved_cpus": host_vars["numafleet_reserved_cpus"],
            "memory_headroom_pct": host_vars["numafleet_memory_headroom_pct"],
        },
        hugepages_extra=host_vars.get("numafleet_hugepages_extra") or [],
        mig_gpus=host_vars["numafleet_gpu_partitions"],
    )
    plan["awaiting_restart"] = []
    return plan


@pytest.fixture
def demo(fixture_root, tmp_path):
    """A writable copy of the demo host's tree: {fsroot, root (render root, absent)}."""
    fsroot = fixture_root(MACHINE, writable=True)
    _snapshot(fsroot)
    return {"fsroot": fsroot, "root": str(Path(fsroot) / "root")}


def layer_options(demo) -> dict:
    """The layers' own options (what host_apply does not derive) for render mode on ``demo``."""
    fsroot = demo["fsroot"]
    roots = {"sysfs_root": f"{fsroot}/sys", "procfs_root": f"{fsroot}/proc"}
    return {
        "hugepages": dict(roots, bootloader="none"),
        "kernel": dict(roots, numa_balancing=0, zone_reclaim_mode=0),
        # The gpu layer writes into the snapshot the mig layer reads next.
        "gpu": {"snapshot": f"{fsroot}/gpu-snapshot.json", "gpus": [GPU_SETTING]},
        "amd": dict(roots),
        "mig": dict(roots, snapshot=f"{fsroot}/gpu-snapshot.json"),
        "mps": {},
        "units": {"hardening": True},
    }


def apply_args(demo, plan, **extra) -> dict:
    args = dict(
        plan=plan,
        host="gpu-a100-01",
        root=demo["root"],
        service_manager="none",
        **layer_options(demo),
    )
    args.update(extra)
    return args


def old_module_args(layer, demo, plan) -> dict:
    """What the roles passed to the old module of ``layer``."""
    args = dict(layer_options(demo)[layer], root=demo["root"], service_manager="none")
    if layer == "hugepages":
        args["pools"] = [
            {"node": node["id"], "size_kb": pool["size_kb"], "count": pool["count"]}
            for node in plan["nodes"]
            for pool in node.get("hugepages") or []
        ]
    elif layer == "amd":
        args["gpus"] = plan.get("amd_partitions") or []
        args["owned_units"] = []
    elif layer == "mig":
        args["gpus"] = plan["mig_gpus"]
        args["owned_units"] = [p["unit"] for p in plan["placements"]] + [
            d["unit"] for d in plan["mps_daemons"] if d.get("unit")
        ]
    elif layer == "gpu":
        args["mps_gpus"] = sorted({d["gpu_address"] for d in plan["mps_daemons"]})
    elif layer in ("mps", "units"):
        args["plan"] = plan
    return args


def tree(root) -> dict:
    """relative path -> bytes of every file below root, the lock file left out."""
    out = {}
    for top, dummy, names in os.walk(root):
        for name in names:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            if rel != "run/numafleet/apply.lock" and not path.is_symlink():
                out[rel] = path.read_bytes()
    return out


def test_render_run_equals_the_five_modules_one_after_another(
    run_module, fixture_root, demo_plan, demo
):
    applied = run_module("host_apply", apply_args(demo, demo_plan), diff=True)
    assert not applied["failed"], applied["msg"]
    other = {"fsroot": fixture_root(MACHINE, writable=True)}
    _snapshot(other["fsroot"])
    other["root"] = str(Path(other["fsroot"]) / "root")
    expected, diff = {}, []
    for layer, module in MODULES.items():
        result = run_module(module, old_module_args(layer, other, demo_plan), diff=True)
        assert not result["failed"], result["msg"]
        for key in ("failed", "warnings", "invocation", "deprecations"):
            result.pop(key, None)
        entry = result.get("diff") or []
        diff += entry if isinstance(entry, list) else [entry]
        expected[layer] = result
    text = json.dumps(applied["layers"], sort_keys=True).replace(demo["fsroot"], "FSROOT")
    assert json.loads(text) == json.loads(
        json.dumps(expected, sort_keys=True).replace(other["fsroot"], "FSROOT")
    )
    assert applied["changed"] is True
    assert tree(demo["root"]) == tree(other["root"])
    assert len(applied["diff"]) == len(diff)
    # Render mode: nothing ran, would_run reloads once.
    assert applied["ran"] == []
    assert applied["would_run"].count("systemctl daemon-reload") == 1
    assert "systemctl enable --now numafleet-llm-70b.service" in applied["would_run"]
    assert applied["reboot_required"] is False and applied["reset_required"] is False


def test_check_mode_writes_nothing_and_a_second_run_changes_nothing(run_module, demo_plan, demo):
    before = tree(demo["fsroot"])
    checked = run_module("host_apply", apply_args(demo, demo_plan), check_mode=True)
    assert not checked["failed"], checked["msg"]
    assert checked["changed"] is True
    assert tree(demo["fsroot"]) == before
    first = run_module("host_apply", apply_args(demo, demo_plan))
    assert first["changed"] is True
    assert first["would_run"] == checked["would_run"]
    second = run_module("host_apply", apply_args(demo, demo_plan))
    assert not second["failed"], second["msg"]
    assert second["changed"] is False
    assert all(not result["changed"] for result in second["layers"].values())
    # The first run wrote the MIG instances into the snapshot (render mode keeps the recording
    # consistent), so no MIG command is left; without replan the units layer used the given
    # plan, so the unit waiting for an instance still waits; nothing else.
    assert second["layers"]["mig"]["would_run"] == []
    assert second["would_run"] == second["layers"]["mig"]["would_run"] + [
        "numafleet-classify.service: not started, waits for MIG instance 1g.10gb at slice 2 of "
        "GPU 0000:17:00.0: created in this run; enabled and started once it exists"
    ]
    assert not [line for line in second["would_run"] if line.startswith("systemctl")]


def test_layers_run_in_order_and_only_those_listed(run_module, demo_plan, demo):
    result = run_module("host_apply", apply_args(demo, demo_plan, layers=["units", "hugepages"]))
    assert list(result["layers"]) == ["hugepages", "units"]


@pytest.fixture
def systemctl(fake_systemctl):
    """A fake systemctl first in PATH; returns the log of its calls."""
    return fake_systemctl(FAKE_SYSTEMCTL)


def calls(log) -> list:
    return log.read_text().splitlines() if log.exists() else []


def systemd_args(demo, plan, **extra) -> dict:
    return apply_args(demo, plan, service_manager="systemd", layers=["hugepages", "units"], **extra)


def test_handler_pass_reloads_once_then_starts_and_restarts_in_order(
    run_module, demo_plan, demo, systemctl
):
    first = run_module(
        "host_apply", systemd_args(demo, demo_plan, restart_awaited=["late.service"])
    )
    assert not first["failed"], first["msg"]
    lines = calls(systemctl)
    assert lines.count("daemon-reload") == 1
    assert lines[0] == "daemon-reload"
    starts = [f"enable --now {unit}" for unit in first["layers"]["units"]["handler_start"]]
    assert starts and lines[1:] == ["enable numafleet-hugepages.service"] + starts + [
        "try-restart late.service"
    ]
    assert first["ran"] == [f"systemctl {line}" for line in lines]
    assert first["would_run"] == []

    # A changed unit file: restarted after the one reload, before the awaited try-restart.
    systemctl.unlink()
    unit = Path(demo["root"]) / "etc/systemd/system/numafleet-embed.service"
    unit.write_text(unit.read_text() + "# edited\n")
    again = run_module(
        "host_apply", systemd_args(demo, demo_plan, restart_awaited=["late.service"])
    )
    assert calls(systemctl) == [
        "daemon-reload",
        "restart numafleet-embed.service",
        "try-restart late.service",
    ]
    assert again["changed"] is True


def test_restart_never_drops_the_restarts(run_module, demo_plan, demo, systemctl):
    run_module("host_apply", systemd_args(demo, demo_plan))
    systemctl.unlink()
    unit = Path(demo["root"]) / "etc/systemd/system/numafleet-embed.service"
    unit.write_text(unit.read_text() + "# edited\n")
    result = run_module(
        "host_apply",
        systemd_args(demo, demo_plan, restart="never", restart_awaited=["late.service"]),
    )
    assert not result["failed"], result["msg"]
    assert calls(systemctl) == ["daemon-reload"]
    checked = run_module(
        "host_apply",
        apply_args(demo, demo_plan, restart="never", restart_awaited=["late.service"]),
        check_mode=True,
    )
    assert not [line for line in checked["would_run"] if "restart" in line]


def test_a_failing_handler_command_fails_naming_it(
    run_module, demo_plan, demo, systemctl, monkeypatch
):
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "enable")
    result = run_module("host_apply", systemd_args(demo, demo_plan))
    assert result["failed"]
    assert "systemctl enable numafleet-hugepages.service failed" in result["msg"]
    assert result["ran"] == ["systemctl daemon-reload"]


def test_a_failing_layer_names_the_layer_and_keeps_the_results_before(run_module, demo_plan, demo):
    args = apply_args(demo, demo_plan)
    args["units"] = {"unit_dir": "relative/dir"}
    result = run_module("host_apply", args)
    assert result["failed"]
    assert result["msg"].startswith("host gpu-a100-01: layer units: ")
    assert "unit_dir" in result["msg"]
    assert list(result["layers"]) == ["hugepages", "kernel", "gpu", "amd", "mig", "mps"]


@pytest.mark.parametrize(
    ("layer", "options", "fragment"),
    [
        ("kernel", {"numa_balance": 1}, "kernel: "),
        ("mig", {"reset_ok": "maybe"}, "mig: "),
        ("hugepages", {"pools": []}, "hugepages: pools cannot be set here"),
        ("units", {"root": "/"}, "units: root cannot be set here"),
    ],
)
def test_a_bad_layer_option_names_the_layer(run_module, demo_plan, demo, layer, options, fragment):
    args = apply_args(demo, demo_plan)
    args[layer] = options
    result = run_module("host_apply", args)
    assert result["failed"]
    assert result["msg"].startswith(f"host gpu-a100-01: {fragment}"), result["msg"]
    assert not Path(demo["root"]).exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda plan: plan.update(version=2), "plan: version 2 is not 1"),
        (lambda plan: plan.update(host="other"), "made for host 'other', not gpu-a100-01"),
        (lambda plan: plan.pop("placements"), "plan: placements is not a list"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_fix(run_module, demo_plan, demo, mutate, fragment):
    plan = json.loads(json.dumps(demo_plan))
    mutate(plan)
    result = run_module("host_apply", apply_args(demo, plan))
    assert result["failed"]
    assert fragment in result["msg"]
    assert "ansible_facts.numafleet_plan" in result["msg"]


def test_only_units_imports_no_mig_nvml_or_hugepages_code(demo_plan, demo, tmp_path):
    args = apply_args(demo, demo_plan, layers=["units"])
    (tmp_path / "args.json").write_text(json.dumps(args))
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, sys\n"
        "from ansible.module_utils.testing import patch_module_args\n"
        f"args = json.load(open({str(tmp_path / 'args.json')!r}))\n"
        "from ansible_collections.numafleet.tuning.plugins.modules import host_apply\n"
        "try:\n"
        "    with patch_module_args(args):\n"
        "        host_apply.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "core = 'ansible_collections.numafleet.tuning.plugins.module_utils.numa.'\n"
        "loaded = sorted(n[len(core):] for n in sys.modules if n.startswith(core))\n"
        "sys.stderr.write('LOADED ' + json.dumps(loaded))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, check=False
    )
    assert "LOADED " in done.stderr, done.stderr
    loaded = json.loads(done.stderr.rsplit("LOADED ", 1)[1])
    assert '"changed": true' in done.stdout
    assert "units" in loaded
    for name in ("mig", "mig_nvml", "mig_smi", "gpu", "gpu_nvml", "hugepages", "kernel", "mps"):
        assert name not in loaded


class _Host:
    """The layers host protocol without a module: nothing to run, no NVML."""

    check_mode, diff = True, False

    def run_command(self, argv, **kw):
        raise AssertionError(f"nothing should run: {argv}")

    def get_bin_path(self, name, required=False):
        return None

    def warn(self, text):
        raise AssertionError(text)


def test_replan_reads_the_gpus_again_and_keeps_the_placements(demo_plan, demo):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    host_vars = yaml.safe_load(HOST_VARS.read_text())
    plan = json.loads(json.dumps(demo_plan))
    plan["awaiting_restart"] = ["numafleet-embed.service"]
    settings = {
        "sysfs_root": f"{demo['fsroot']}/sys",
        "procfs_root": f"{demo['fsroot']}/proc",
        "gpu_snapshot": f"{demo['fsroot']}/gpu-snapshot.json",
        "placements": host_vars["numafleet_placements"],
        "tenants": host_vars["numafleet_tenants"],
        "policy": {
            "reserved_cpus": host_vars["numafleet_reserved_cpus"],
            "memory_headroom_pct": host_vars["numafleet_memory_headroom_pct"],
        },
        "mig_gpus": host_vars["numafleet_gpu_partitions"],
    }
    new = layers.replan(plan, settings, _Host())
    assert set(new["stability"].values()) == {"kept"}
    assert new["placements"] == demo_plan["placements"]
    assert new["awaiting_restart"] == ["numafleet-embed.service"]
    assert layers.summary(new).startswith("gpu-a100-01: 6 placements")


def test_render_creates_the_instance_and_starts_the_waiting_unit_in_the_same_run(
    run_module, demo_plan, demo
):
    # The plan waits for classify's 1g.10gb instance. The render apply writes the instances the
    # MIG layer creates into the snapshot, re-plans from it and starts classify in this run with
    # the rendered MIG-device UUID; the second run changes nothing.
    host_vars = yaml.safe_load(HOST_VARS.read_text())
    (classify,) = [p for p in demo_plan["placements"] if p["name"] == "classify"]
    assert classify["waits_for"]
    replan = {
        "sysfs_root": f"{demo['fsroot']}/sys",
        "procfs_root": f"{demo['fsroot']}/proc",
        "gpu_snapshot": f"{demo['fsroot']}/gpu-snapshot.json",
        "placements": host_vars["numafleet_placements"],
        "tenants": host_vars["numafleet_tenants"],
        "policy": {
            "reserved_cpus": host_vars["numafleet_reserved_cpus"],
            "memory_headroom_pct": host_vars["numafleet_memory_headroom_pct"],
        },
        "mig_gpus": host_vars["numafleet_gpu_partitions"],
    }
    first = run_module("host_apply", apply_args(demo, demo_plan, replan=replan))
    assert not first["failed"], first["msg"]
    assert first["layers"]["mig"]["snapshot_written"]
    (again,) = [p for p in first["plan"]["placements"] if p["name"] == "classify"]
    assert again["waits_for"] is None
    device = next(
        d["device_uuid"]
        for d in first["mig_devices"]
        if d["profile"] == "1g.10gb" and d["placement_start"] == 2
    )
    assert device.startswith("MIG-")
    unit = Path(demo["root"], "etc/systemd/system/numafleet-classify.service").read_text()
    assert f'Environment="CUDA_VISIBLE_DEVICES={device}"' in unit
    assert "systemctl enable --now numafleet-classify.service" in first["would_run"]
    assert not [line for line in first["would_run"] if "waits for MIG instance" in line]
    assert first["summary"].endswith(
        "; re-planned after the MIG layout changed; 1 started once its MIG instance existed "
        "(classify)"
    )
    second = run_module("host_apply", apply_args(demo, first["plan"], replan=replan))
    assert not second["failed"], second["msg"]
    assert second["changed"] is False


def test_replan_failure_names_the_host_and_the_fix(demo_plan, demo):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    settings = {"gpu_snapshot": f"{demo['fsroot']}/missing.json", "sysfs_root": "/nonexistent"}
    with pytest.raises(layers.LayerError) as failed:
        layers.replan(demo_plan, settings, _Host())
    assert failed.value.msg.startswith("host gpu-a100-01: re-planning after the MIG change failed")


def _mig_changed(params, host, ran):
    """A mig layer that created MIG devices (as on a host with NVML)."""
    return {"changed": True, "gpu_changed": True, "files": [], "would_run": [], "ran": [],
            "mig_devices": [{"device_uuid": "MIG-new"}], "reset_required": False}  # fmt: skip


def test_a_mig_change_replans_and_mps_units_use_the_new_plan(
    run_module, demo_plan, demo, monkeypatch
):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    new_plan = json.loads(json.dumps(demo_plan))
    new_plan["placements"] = [p for p in new_plan["placements"] if p["name"] == "llm-70b"]
    new_plan["mps_daemons"] = []
    seen = {}

    def replan(plan, settings, host, layer="mig"):
        seen["args"] = (plan["host"], settings["gpu_snapshot"])
        return new_plan

    monkeypatch.setitem(layers._RUNNERS, "mig", _mig_changed)
    monkeypatch.setattr(layers, "replan", replan)
    args = apply_args(demo, demo_plan, replan={"gpu_snapshot": "/x.json"})
    result = run_module("host_apply", args)
    assert not result["failed"], result["msg"]
    assert seen["args"] == ("gpu-a100-01", "/x.json")
    assert result["plan"] == new_plan
    assert result["summary"].startswith("gpu-a100-01: 1 placement")
    assert result["mig_devices"] == [{"device_uuid": "MIG-new"}]
    assert result["layers"]["units"]["units"]["new"] == ["numafleet-llm-70b.service"]
    assert result["layers"]["mps"]["daemons"] == []


def test_a_mig_change_without_replan_warns_and_keeps_the_plan(
    run_module, demo_plan, demo, monkeypatch
):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    monkeypatch.setitem(layers._RUNNERS, "mig", _mig_changed)
    # module.warn() lands in the result as on a host, not on the display of controller code
    # that earlier tests of this process imported.
    monkeypatch.setattr(ansible_internal, "is_controller", False)
    ansible_warnings._global_warnings.clear()
    result = run_module("host_apply", apply_args(demo, demo_plan))
    ansible_warnings._global_warnings.clear()
    assert not result["failed"], result["msg"]
    assert "plan" not in result
    assert "replan is not given" in json.dumps(result["warnings"])
    assert len(result["layers"]["units"]["units"]["new"]) == len(demo_plan["placements"])


# --- recorded_digest: the state the controller planned from ------------------------------------


def _digest(root: str) -> str:
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
        read_recorded,
        state_digest,
    )

    return state_digest(read_recorded(root))


def test_a_changed_recording_is_refused_before_anything_changes(run_module, demo_plan, demo):
    first = run_module("host_apply", apply_args(demo, demo_plan))
    assert not first["failed"], first["msg"]
    digest = _digest(demo["root"])
    # Another run (or a hand) changes the recorded plan after the controller read it.
    plan_file = Path(demo["root"]) / "etc" / "numafleet" / "plan.json"
    plan_file.write_text(plan_file.read_text() + " \n")
    before = tree(demo["root"])
    refused = run_module("host_apply", apply_args(demo, demo_plan, recorded_digest=digest))
    assert refused["failed"]
    assert refused["msg"].startswith("host gpu-a100-01: the host's recorded state")
    assert "--flush-cache" in refused["msg"] and refused["ran"] == []
    assert tree(demo["root"]) == before
    # Check mode compares nothing (it changes nothing either).
    checked = run_module(
        "host_apply", apply_args(demo, demo_plan, recorded_digest=digest), check_mode=True
    )
    assert not checked["failed"], checked["msg"]
    assert "ansible_facts" not in checked


def test_the_same_recording_is_applied_and_returned_afresh(run_module, demo_plan, demo):
    digest = _digest(demo["root"])  # nothing recorded yet
    applied = run_module("host_apply", apply_args(demo, demo_plan, recorded_digest=digest))
    assert not applied["failed"], applied["msg"]
    recorded = applied["ansible_facts"]["numafleet_recorded"]
    assert recorded["state"] == "present" and recorded["plan"]["host"] == "gpu-a100-01"
    # The facts it returns are what the next run plans from: the next apply accepts them.
    again = run_module(
        "host_apply", apply_args(demo, demo_plan, recorded_digest=_digest(demo["root"]))
    )
    assert not again["failed"] and again["changed"] is False
    assert again["ansible_facts"]["numafleet_recorded"]["plan_sha256"] == recorded["plan_sha256"]
    mig_state = demo["root"] + "/etc/numafleet/mig.json"
    assert again["ansible_facts"]["numafleet_state_paths"][0] == mig_state


# --- measure: the plan's services, read-only ----------------------------------------------------


def test_measure_reports_each_planned_service(run_module, demo_plan, demo, tmp_path):
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpuset cpu memory\n")
    measure = {
        "sysfs_root": f"{demo['fsroot']}/sys",
        "procfs_root": f"{demo['fsroot']}/proc",
        "cgroup_root": str(cgroup),
        "window_s": 0,
        "perf": "never",
    }
    result = run_module(
        "host_apply", apply_args(demo, demo_plan, layers=["units"], measure=measure),
        check_mode=True,
    )  # fmt: skip
    assert not result["failed"], result["msg"]
    services = result["locality"]["services"]
    assert [s["name"] for s in services] == [p["name"] for p in demo_plan["placements"]]
    assert not any(s["running"] for s in services)  # nothing runs in a recorded tree
    assert result["locality"]["nodes"]


def test_a_bad_measurement_root_fails_naming_measure(run_module, demo_plan, demo, tmp_path):
    measure = {"sysfs_root": f"{demo['fsroot']}/sys", "procfs_root": f"{demo['fsroot']}/proc",
               "cgroup_root": str(tmp_path / "absent"), "window_s": 0, "perf": "never"}  # fmt: skip
    result = run_module(
        "host_apply", apply_args(demo, demo_plan, layers=["units"], measure=measure),
        check_mode=True,
    )  # fmt: skip
    assert result["failed"] and result["msg"].startswith("host gpu-a100-01: measure: ")
    assert "cgroup_root" in result["msg"]


# --- placements waiting for their MIG instance -------------------------------------------------

CLASSIFY = "numafleet-classify.service"  # the demo's 1g.10gb at slice 2: created by the run
NEW_1G = "MIG-11111111-2222-3333-4444-555555555555"


def _create_1g(snapshot: str) -> None:
    """What the MIG layer does to the recorded GPU 17:00.0: the 2g.20gb at slice 2 becomes two
    1g.10gb instances (slices 2 and 3)."""
    data = json.loads(Path(snapshot).read_text())
    gpu = next(g for g in data["gpus"] if g["address"] == "0000:17:00.0")
    mig = gpu["mig"]
    instances = [gi for gi in mig["gpu_instances"] if gi["placement_start"] != 2]
    for gi_id, (start, uuid) in enumerate(
        ((2, NEW_1G), (3, "MIG-66666666-7777-8888-9999-000000000000")), start=7
    ):
        ci = {"id": 0, "mig_device_uuid": uuid, "profile_id": 0, "profile_name": "1g.10gb"}
        instances.append(
            {
                "compute_instances": [ci],
                "id": gi_id,
                "mig_device_uuid": uuid,
                "placement_size": 1,
                "placement_start": start,
                "profile_id": 19,
                "profile_name": "1g.10gb",
            }  # fmt: skip
        )
    mig["gpu_instances"] = instances
    Path(snapshot).write_text(json.dumps(data))


def _replan_settings(demo) -> dict:
    host_vars = yaml.safe_load(HOST_VARS.read_text())
    return {
        "sysfs_root": f"{demo['fsroot']}/sys",
        "procfs_root": f"{demo['fsroot']}/proc",
        "gpu_snapshot": f"{demo['fsroot']}/gpu-snapshot.json",
        "placements": host_vars["numafleet_placements"],
        "tenants": host_vars["numafleet_tenants"],
        "policy": {
            "reserved_cpus": host_vars["numafleet_reserved_cpus"],
            "memory_headroom_pct": host_vars["numafleet_memory_headroom_pct"],
        },
        "mig_gpus": host_vars["numafleet_gpu_partitions"],
    }


def _visible(demo) -> list:
    text = (Path(demo["root"]) / "etc/systemd/system" / CLASSIFY).read_text()
    return [line for line in text.splitlines() if "CUDA_VISIBLE_DEVICES" in line]


def test_a_waiting_placement_is_written_but_never_enabled_or_started(
    run_module, demo_plan, demo, systemctl, monkeypatch
):
    (waits,) = [p["waits_for"] for p in demo_plan["placements"] if p["unit"] == CLASSIFY]
    assert waits["reason"] == "created in this run"
    result = run_module("host_apply", systemd_args(demo, demo_plan))
    assert not result["failed"], result["msg"]
    lines = calls(systemctl)
    assert "enable --now numafleet-embed.service" in lines  # the others start
    assert not [line for line in lines if CLASSIFY in line], lines
    assert _visible(demo) == ['Environment="CUDA_VISIBLE_DEVICES="']
    units = result["layers"]["units"]
    assert CLASSIFY in units["units"]["new"] and CLASSIFY not in units["handler_start"]
    assert units["waiting"] == [dict(waits, unit=CLASSIFY)]
    # Its file changes while it still waits: not restarted either (it would run without a GPU).
    systemctl.unlink()
    unit = Path(demo["root"]) / "etc/systemd/system" / CLASSIFY
    unit.write_text(unit.read_text() + "# edited\n")
    monkeypatch.setattr(ansible_internal, "is_controller", False)  # warnings land in the result
    ansible_warnings._global_warnings.clear()
    again = run_module("host_apply", systemd_args(demo, demo_plan))
    ansible_warnings._global_warnings.clear()
    assert calls(systemctl) == ["daemon-reload"]
    assert (
        f"{CLASSIFY}: its unit file changed, but it is not restarted: it waits for MIG instance "
        "1g.10gb at slice 2 of GPU 0000:17:00.0 (created in this run)"
    ) in json.dumps(again["warnings"])
    # check mode says what happens to it, and runs nothing
    checked = run_module("host_apply", apply_args(demo, demo_plan), check_mode=True)
    assert (
        f"{CLASSIFY}: not started, waits for MIG instance 1g.10gb at slice 2 of GPU "
        "0000:17:00.0: created in this run; enabled and started once it exists"
    ) in checked["would_run"]
    assert f"systemctl enable --now {CLASSIFY}" not in checked["would_run"]


def test_the_replan_after_the_mig_layer_starts_the_waiting_unit_in_the_same_run(
    run_module, demo_plan, demo, systemctl, monkeypatch
):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    def mig_creates(params, host, ran):
        _create_1g(f"{demo['fsroot']}/gpu-snapshot.json")
        return _mig_changed(params, host, ran)

    monkeypatch.setitem(layers._RUNNERS, "mig", mig_creates)
    args = systemd_args(demo, demo_plan, replan=_replan_settings(demo))
    args["layers"] = ["hugepages", "mig", "units"]
    result = run_module("host_apply", args)
    assert not result["failed"], result["msg"]
    (entry,) = [p for p in result["plan"]["placements"] if p["unit"] == CLASSIFY]
    assert entry["waits_for"] is None
    assert result["layers"]["units"]["waiting"] == []
    assert f"enable --now {CLASSIFY}" in calls(systemctl)
    assert _visible(demo) == [f'Environment="CUDA_VISIBLE_DEVICES={NEW_1G}"']
    # The next run (numa_plan made the same plan from the new devices): nothing changes.
    systemctl.unlink()
    monkeypatch.setitem(layers._RUNNERS, "mig", lambda params, host, ran: dict(
        _mig_changed(params, host, ran), changed=False, gpu_changed=False))  # fmt: skip
    args = systemd_args(demo, result["plan"])
    args["layers"] = ["hugepages", "mig", "units"]
    again = run_module("host_apply", args)
    assert not again["failed"], again["msg"]
    assert calls(systemctl) == []
    assert again["layers"]["units"]["changed"] is False


def test_a_unit_that_waited_for_a_reset_is_started_by_the_run_after_it(
    run_module, demo_plan, demo, systemctl
):
    """The plan applied last waited (mode pending a reset); after the reset the instance exists
    and the next run enables and starts the unit instead of restarting a unit never started."""
    waiting = json.loads(json.dumps(demo_plan))
    for entry in waiting["placements"]:
        if entry["unit"] == CLASSIFY:
            entry["waits_for"]["reason"] = "mode change pending a reset"
    first = run_module("host_apply", systemd_args(demo, waiting))
    assert not first["failed"], first["msg"]
    assert not [line for line in calls(systemctl) if CLASSIFY in line]
    # The reset happened, the boot unit re-created the layout: the next plan names the device.
    _create_1g(f"{demo['fsroot']}/gpu-snapshot.json")
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    later = layers.replan(waiting, _replan_settings(demo), _Host())
    systemctl.unlink()
    second = run_module("host_apply", systemd_args(demo, later))
    assert not second["failed"], second["msg"]
    assert second["layers"]["units"]["units"]["changed"] == [CLASSIFY]
    assert calls(systemctl) == ["daemon-reload", f"enable --now {CLASSIFY}"]
    systemctl.unlink()
    third = run_module("host_apply", systemd_args(demo, later))
    assert calls(systemctl) == [] and third["changed"] is False


def _pending_reset(snapshot: str, pending: str = "enabled") -> None:
    """GPU 17:00.0 with MIG mode off and ``pending`` pending a reset (Ampere): no instance."""
    data = json.loads(Path(snapshot).read_text())
    gpu = next(g for g in data["gpus"] if g["address"] == "0000:17:00.0")
    gpu["mig"].update(mode_current="disabled", mode_pending=pending, gpu_instances=[])
    Path(snapshot).write_text(json.dumps(data))


def test_while_a_reset_is_pending_the_waiting_units_are_no_drift(run_module, demo):
    """The drift check (host_apply in check mode) after the apply: the MIG layer owes the reset,
    the units layer has nothing to do although three placements wait for their instances.

    They were planned while MIG was off (created once MIG mode is on); the run enabled MIG and
    the change stays pending: the plan made now keeps them waiting (a pending GPU gets no new
    instance, but what was planned is not moved or removed)."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    snapshot = f"{demo['fsroot']}/gpu-snapshot.json"
    _pending_reset(snapshot, "disabled")
    empty = {"version": 1, "host": "gpu-a100-01", "placements": []}
    before = layers.replan(empty, _replan_settings(demo), _Host())
    _pending_reset(snapshot)
    plan = layers.replan(before, _replan_settings(demo), _Host())
    assert set(plan["stability"].values()) == {"kept"}
    assert plan["mig_gpus"] == before["mig_gpus"]
    waiting = {p["name"]: p["waits_for"] for p in plan["placements"] if p["waits_for"]}
    assert sorted(waiting) == ["classify", "embed", "rerank-mini-a"]
    assert {w["reason"] for w in waiting.values()} == {"mode change pending a reset"}
    assert [d for d in plan["mps_daemons"] if d["mig"]] == [
        d for d in plan["mps_daemons"] if d["waits_for"]
    ]
    first = run_module("host_apply", apply_args(demo, plan))
    assert not first["failed"], first["msg"]
    assert first["reset_required"] is True
    assert sorted(w["unit"] for w in first["layers"]["units"]["waiting"]) == [
        "numafleet-classify.service",
        "numafleet-embed.service",
        "numafleet-rerank-mini-a.service",
    ]
    assert not [line for line in first["would_run"] if "enable --now numafleet-embed" in line]
    drift = run_module("host_apply", apply_args(demo, plan), check_mode=True, diff=True)
    assert drift["layers"]["units"]["changed"] is False
    assert drift["layers"]["mps"]["changed"] is False
    assert drift["reset_required"] is True  # the drift is the pending reset, in the MIG layer


def test_an_amd_partition_change_replans_with_the_amd_layer(
    run_module, demo_plan, demo, monkeypatch, tmp_path
):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers

    numa_tests = str(Path(__file__).parents[1] / "module_utils" / "numa")
    if numa_tests not in sys.path:
        sys.path.insert(0, numa_tests)
    from test_amd_partition import B, current, entry, make_tree

    sys_root, proc_root = make_tree(tmp_path / "amd")
    plan = json.loads(json.dumps(demo_plan))
    plan["amd_partitions"] = [entry(B, compute="CPX")]
    seen = {}

    def replan(given, settings, host, layer="mig"):
        seen["layer"] = layer
        return given

    monkeypatch.setattr(layers, "replan", replan)
    args = apply_args(demo, plan, replan={}, layers=["amd", "units"])
    args["amd"] = {"sysfs_root": sys_root, "procfs_root": proc_root, "backend": "sysfs"}
    result = run_module("host_apply", args, diff=True)
    assert not result["failed"], result["msg"]
    assert current(sys_root, B, "compute") == "CPX"
    assert seen["layer"] == "amd"
    assert "; re-planned after the AMD partition modes changed" in result["summary"]
    assert "systemctl enable numafleet-amd-partition.service" in result["would_run"]
    assert result["would_run"].count("systemctl daemon-reload") == 1
    assert any(d.get("before_header") == "AMD GPU partitions" for d in result["diff"])
