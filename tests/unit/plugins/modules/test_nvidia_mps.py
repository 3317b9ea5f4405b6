"""nvidia_mps through main(): check mode, apply, repeat, removal, live settings, errors."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

UNIT_DIR = "etc/systemd/system"
GPU = "GPU-fdb5df64-11ce-5c72-a560-9702875cecd6"
MIG = "MIG-1a2b3c4d-0000-1111-2222-333344445555"
MANIFEST = "etc/numafleet/mps-units.json"
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
if [ "$1" = is-active ]; then exit "${{FAKE_ACTIVE_RC:-0}}"; fi
if [ -n "$FAKE_SYSTEMCTL_FAIL" ]; then echo "Failed: $FAKE_SYSTEMCTL_FAIL" >&2; exit 1; fi
"""
# Answers like nvidia-cuda-mps-control reading one command from stdin (values from FAKE_* env).
FAKE_CONTROL = """#!/bin/sh
read -r command
echo "$CUDA_MPS_PIPE_DIRECTORY $command" >> "{log}"
case "$command" in
  get_default_active_thread_percentage) echo "${{FAKE_PCT:-100.0}}" ;;
  get_default_device_pinned_mem_limit*) echo "${{FAKE_MEM:-16G}}" ;;
esac
"""


def entry(instance=GPU, **overrides) -> dict:
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
        "mig": instance is not None and instance.startswith("MIG-"),
        "node": 0,
        "cpus": [4, 5, 6, 7],
        "mems": [0],
        "user": "tei",
        "group": None,
        "pinned_memory_limit_kb": 16 << 20,
    }
    base.update(overrides)
    return base


def make_plan(*entries) -> dict:
    return {"version": 1, "host": "h1", "placements": [], "mps_daemons": list(entries)}


def tree_hash(root) -> str:
    """sha256 of the tree below root, the per-host lock file left out."""
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            if os.path.relpath(path, root) in ("run", "run/numafleet", "run/numafleet/apply.lock"):
                continue
            digest.update(os.path.relpath(path, root).encode())
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


@pytest.fixture
def scratch(tmp_path):
    root = tmp_path / "root"
    (root / UNIT_DIR).mkdir(parents=True)
    (root / UNIT_DIR / "foreign.service").write_text("[Service]\nExecStart=/usr/bin/true\n")
    return root


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """Fake systemctl (in PATH) and nvidia-cuda-mps-control; their call logs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    logs = {"systemctl": tmp_path / "systemctl.log", "control": tmp_path / "control.log"}
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("nvidia-cuda-mps-control", FAKE_CONTROL)):
        path = bin_dir / name
        log = logs["systemctl" if name == "systemctl" else "control"]
        path.write_text(text.format(log=log))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}")
    for name in ("FAKE_SYSTEMCTL_FAIL", "FAKE_ACTIVE_RC", "FAKE_PCT", "FAKE_MEM"):
        monkeypatch.delenv(name, raising=False)
    logs["control_path"] = str(bin_dir / "nvidia-cuda-mps-control")
    return logs


def args(root, plan, **extra) -> dict:
    base = {"plan": plan, "root": str(root), "service_manager": "none"}
    base.update(extra)
    return base


def test_check_mode_writes_nothing(run_module, scratch, fakes):
    before = tree_hash(scratch)
    result = run_module("nvidia_mps", args(scratch, make_plan(entry())), check_mode=True, diff=True)
    assert result["changed"] and not result["failed"]
    assert tree_hash(scratch) == before
    assert not fakes["systemctl"].exists() and not fakes["control"].exists()
    assert [f["path"] for f in result["files"]] == [
        "/etc/systemd/system/nvidia-mps@.service",
        f"/etc/systemd/system/nvidia-mps@{GPU}.service.d/50-numafleet.conf",
        "/etc/numafleet/mps-units.json",
    ]
    assert result["would_run"] == [
        "systemctl daemon-reload",
        f"systemctl enable --now nvidia-mps@{GPU}.service",
    ]
    assert len(result["diff"]) == 3 and result["handler_start"] == []
    assert result["daemons"][0]["unit"] == f"nvidia-mps@{GPU}.service"


def test_apply_then_again_is_unchanged(run_module, scratch):
    plan = make_plan(entry(), entry(MIG, gpu_address="0000:17:00.0"))
    first = run_module("nvidia_mps", args(scratch, plan))
    assert first["changed"] and [f["state"] for f in first["files"]] == ["create"] * 4
    dropin = scratch / UNIT_DIR / f"nvidia-mps@{MIG}.service.d" / "50-numafleet.conf"
    assert "EXCLUSIVE_PROCESS" not in dropin.read_text()
    manifest = json.loads((scratch / MANIFEST).read_text())
    assert manifest["units"] == [
        "nvidia-mps@.service",
        f"nvidia-mps@{GPU}.service",
        f"nvidia-mps@{MIG}.service",
    ]
    again = run_module("nvidia_mps", args(scratch, plan))
    assert not again["changed"] and again["would_run"] == []
    assert {f["state"] for f in again["files"]} == {"unchanged"}
    assert (scratch / UNIT_DIR / "foreign.service").exists()


def test_removed_daemon_is_disabled_and_its_dropin_removed(run_module, scratch, fakes, monkeypatch):
    monkeypatch.setenv("FAKE_ACTIVE_RC", "3")  # no read-back here
    plan = make_plan(entry(), entry(MIG, gpu_address="0000:17:00.0"))
    assert run_module("nvidia_mps", args(scratch, plan))["changed"]
    result = run_module("nvidia_mps", args(scratch, make_plan(entry()), service_manager="systemd"))
    assert result["ran"][0] == f"systemctl disable --now nvidia-mps@{MIG}.service"
    assert f"disable --now nvidia-mps@{MIG}.service" in fakes["systemctl"].read_text()
    assert not (scratch / UNIT_DIR / f"nvidia-mps@{MIG}.service.d").exists()
    assert (scratch / UNIT_DIR / f"nvidia-mps@{GPU}.service.d" / "50-numafleet.conf").exists()
    assert result["units"]["removed"] == [f"nvidia-mps@{MIG}.service"]
    # the last daemon takes the template and the manifest's files with it
    last = run_module("nvidia_mps", args(scratch, make_plan()))
    assert not (scratch / UNIT_DIR / "nvidia-mps@.service").exists()
    assert json.loads((scratch / MANIFEST).read_text())["files"] == {}
    assert last["would_run"][0] == f"systemctl disable --now nvidia-mps@{GPU}.service"


def test_settings_are_read_back_and_fixed_live(run_module, scratch, fakes, monkeypatch):
    plan = make_plan(entry())
    control = fakes["control_path"]
    assert run_module("nvidia_mps", args(scratch, plan, nvidia_cuda_mps_control=control))["changed"]
    systemd = dict(service_manager="systemd", nvidia_cuda_mps_control=control)

    monkeypatch.setenv("FAKE_PCT", "50.0")
    same = run_module("nvidia_mps", args(scratch, plan, **systemd))
    assert not same["changed"] and same["ran"] == []
    assert same["settings"] == [
        {
            "unit": f"nvidia-mps@{GPU}.service",
            "active_thread_percentage": {"planned": 50, "running": 50},
            "pinned_memory_limit_mib": {"planned": 16384, "running": 16384},
        }
    ]

    monkeypatch.setenv("FAKE_PCT", "100.0")
    monkeypatch.setenv("FAKE_MEM", "8G")
    checked = run_module("nvidia_mps", args(scratch, plan, **systemd), check_mode=True)
    assert checked["changed"] and checked["ran"] == []
    assert "set_default" not in fakes["control"].read_text()

    fixed = run_module("nvidia_mps", args(scratch, plan, **systemd))
    assert fixed["changed"]
    pipe = f"/run/nvidia-mps/{GPU}"
    sent = fakes["control"].read_text().splitlines()[-4:]
    assert sent == [
        f"{pipe} get_default_active_thread_percentage",
        f"{pipe} get_default_device_pinned_mem_limit 0",
        f"{pipe} set_default_active_thread_percentage 50",
        f"{pipe} set_default_device_pinned_mem_limit 0 16384M",
    ]
    assert len(fixed["ran"]) == 2 and fixed["handler_restart"] == []


def test_inactive_daemon_is_not_asked(run_module, scratch, fakes, monkeypatch):
    control = fakes["control_path"]
    plan = make_plan(entry())
    run_module("nvidia_mps", args(scratch, plan, nvidia_cuda_mps_control=control))
    monkeypatch.setenv("FAKE_ACTIVE_RC", "3")
    result = run_module(
        "nvidia_mps",
        args(scratch, plan, service_manager="systemd", nvidia_cuda_mps_control=control),
    )
    assert result["settings"] == [] and not result["changed"]
    assert not fakes["control"].exists()


def test_new_daemon_goes_to_the_start_handler(run_module, scratch, fakes):
    result = run_module(
        "nvidia_mps",
        args(
            scratch,
            make_plan(entry()),
            service_manager="systemd",
            nvidia_cuda_mps_control=fakes["control_path"],
        ),
    )
    assert result["handler_start"] == [f"nvidia-mps@{GPU}.service"]
    assert result["settings"] == [] and not fakes["control"].exists()


def test_pending_mig_daemon_warns_and_writes_nothing(run_module, scratch):
    pending = entry(None, pipe_dir="/run/nvidia-mps/x-mig4", clients=["embed"])
    result = run_module("nvidia_mps", args(scratch, make_plan(pending)))
    assert not result["changed"] and result["files"] == []
    assert "skipped: its MIG instance does not exist yet" in result["skipped"][0]


def test_failed_disable_fails_and_keeps_the_file(run_module, scratch, fakes, monkeypatch):
    run_module("nvidia_mps", args(scratch, make_plan(entry())))
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "boom")
    monkeypatch.setenv("FAKE_ACTIVE_RC", "3")
    result = run_module("nvidia_mps", args(scratch, make_plan(), service_manager="systemd"))
    assert result["failed"]
    assert f"systemctl disable --now nvidia-mps@{GPU}.service failed (rc 1)" in result["msg"]
    assert (scratch / UNIT_DIR / f"nvidia-mps@{GPU}.service.d" / "50-numafleet.conf").exists()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"unit_dir": "etc/systemd"}, "unit_dir: 'etc/systemd' is not an absolute path"),
        ({"manifest_path": "x.json"}, "manifest_path: 'x.json' is not an absolute path"),
        ({"nvidia_cuda_mps_control": "/opt/a b"}, "holds characters other than"),
        ({"header": "oops"}, "is not a comment"),
    ],
)
def test_bad_options_fail_with_message(run_module, scratch, extra, fragment):
    result = run_module("nvidia_mps", args(scratch, make_plan(entry()), **extra))
    assert result["failed"] and fragment in result["msg"]


def test_bad_plan_fails_naming_the_entry(run_module, scratch):
    result = run_module("nvidia_mps", args(scratch, make_plan(entry(pipe_dir="/tmp/mps"))))
    assert result["failed"]
    assert result["msg"].startswith("host h1: plan mps_daemons[0].pipe_dir is '/tmp/mps'")


def test_another_modules_manifest_is_refused_and_nothing_is_removed(run_module, scratch):
    """pinned_units' manifest as manifest_path would remove (and stop) every pinned service."""
    manifest = scratch / "etc/numafleet/manifest.json"
    manifest.parent.mkdir(parents=True)
    owned = ["/etc/systemd/system/numafleet-llm.service", "/etc/systemd/system/numafleet.slice"]
    manifest.write_text(json.dumps({"version": 1, "files": owned, "units": []}))
    (scratch / UNIT_DIR / "numafleet-llm.service").write_text("[Service]\n")
    before = tree_hash(scratch)
    result = run_module(
        "nvidia_mps",
        args(scratch, make_plan(entry()), manifest_path="/etc/numafleet/manifest.json"),
    )
    assert result["failed"]
    assert result["msg"].startswith(
        "manifest_path: /etc/numafleet/manifest.json lists files that are not MPS daemon units "
        "(/etc/systemd/system/numafleet-llm.service, /etc/systemd/system/numafleet.slice): it "
        "belongs to another module"
    )
    assert tree_hash(scratch) == before


def test_a_plan_without_mps_daemons_is_refused(run_module, scratch):
    run_module("nvidia_mps", args(scratch, make_plan(entry())))
    before = tree_hash(scratch)
    plan = make_plan()
    del plan["mps_daemons"]
    result = run_module("nvidia_mps", args(scratch, plan))
    assert result["failed"] and "host h1: plan has no mps_daemons" in result["msg"]
    assert tree_hash(scratch) == before


def test_foreign_entries_of_the_mps_manifest_are_kept_never_disabled(
    run_module, scratch, fakes, monkeypatch
):
    """A vendor nvidia-mps@ unit, an edited drop-in of ours: kept (failed before: disabled and
    deleted, since only '/nvidia-mps@' in the path was checked)."""
    monkeypatch.setenv("FAKE_ACTIVE_RC", "3")
    plan = make_plan(entry(), entry(MIG, gpu_address="0000:17:00.0"))
    run_module("nvidia_mps", args(scratch, plan))
    vendor = scratch / "usr/lib/systemd/system/nvidia-mps@vendor.service"
    vendor.parent.mkdir(parents=True)
    vendor.write_text("[Service]\nExecStart=/usr/bin/nvidia-cuda-mps-control -f\n")
    ours = scratch / UNIT_DIR / f"nvidia-mps@{MIG}.service.d" / "50-numafleet.conf"
    ours.write_text(ours.read_text() + "# tuned by hand\n")
    manifest = scratch / MANIFEST
    data = json.loads(manifest.read_text())
    data["files"]["/usr/lib/systemd/system/nvidia-mps@vendor.service"] = hashlib.sha256(
        vendor.read_bytes()
    ).hexdigest()
    manifest.write_text(json.dumps(data))
    result = run_module("nvidia_mps", args(scratch, make_plan(entry()), service_manager="systemd"))
    assert result["failed"] is False, result.get("msg")
    assert sorted(item["path"] for item in result["kept"]) == [
        f"/etc/systemd/system/nvidia-mps@{MIG}.service.d/50-numafleet.conf",
        "/usr/lib/systemd/system/nvidia-mps@vendor.service",
    ]
    assert result["ran"] == [] and not any("disable" in line for line in result["would_run"])
    assert vendor.exists() and ours.read_text().endswith("# tuned by hand\n")
