"""nvidia_mig through main(): render mode, NVML through an injected fake pynvml, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml
import pytest

UNIT = Path(__file__).parents[2]
if str(UNIT) not in sys.path:
    sys.path.insert(0, str(UNIT))
import fake_nvml as fake  # noqa: E402

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mig_nvml  # noqa: E402

SNAPSHOT = UNIT / "fixtures" / "gpu_snapshots" / "synthetic-2x6338-4xa100.json"


def render_args(tmp_path):
    """Render mode writes into the snapshot (the recording): a scratch copy of the fixture."""
    snapshot = tmp_path / "gpu-snapshot.json"
    if not snapshot.exists():
        snapshot.write_text(SNAPSHOT.read_text())
    return {
        "gpus": [
            {"gpu": "0000:17:00.0", "layout": [{"profile": "7g.80gb"}]},
            {"gpu": "31:00.0", "mode": "disabled"},
        ],  # fmt: skip
        "snapshot": str(snapshot),
        "root": str(tmp_path / "root"),
        "service_manager": "none",
    }


def test_render_mode_check_apply_again(run_module, tmp_path):
    args = render_args(tmp_path)
    check = run_module("nvidia_mig", args, check_mode=True, diff=True)
    assert check["changed"] and not (tmp_path / "root").exists()
    assert "nvidia-smi mig -i 0000:17:00.0 -cgi 0:0" in check["would_run"]
    assert any(d["before_header"] == "GPU 0000:17:00.0" for d in check["diff"])
    applied = run_module("nvidia_mig", args)
    assert applied["changed"] and applied["ran"] == []
    state = json.loads((tmp_path / "root/etc/numafleet/mig.json").read_text())
    assert state["gpus"][0]["layout"] == [
        {"profile": "7g.80gb", "start": 0, "compute_profile": None}
    ]
    assert (tmp_path / "root/etc/systemd/system/numafleet-mig.service").is_file()
    assert '"7g.80gb": 1' in (tmp_path / "root/etc/numafleet/mig-parted.yaml").read_text()
    assert applied["would_run"][-2:] == [
        "systemctl daemon-reload",
        "systemctl enable numafleet-mig.service",
    ]
    # Render mode wrote what it did into the snapshot (the recording): the new instance is
    # there, marked rendered, with a synthetic MIG-device UUID that the result reports too.
    assert applied["snapshot_written"] and applied["gpu_changed"]
    recorded = json.loads((tmp_path / "gpu-snapshot.json").read_text())
    (gpu,) = [g for g in recorded["gpus"] if g["address"] == "0000:17:00.0"]
    (gi,) = gpu["mig"]["gpu_instances"]
    assert (gi["profile_name"], gi["placement_start"], gi["rendered"]) == ("7g.80gb", 0, True)
    assert gi["mig_device_uuid"] == gi["compute_instances"][0]["mig_device_uuid"]
    assert gi["mig_device_uuid"] == mig_nvml.rendered_device_uuid(gpu["uuid"], "", gi["id"], 0)
    device = next(d for d in applied["mig_devices"] if d["gpu_address"] == "0000:17:00.0")
    assert device["device_uuid"] == gi["mig_device_uuid"]
    # The second run reads the rendered instance: nothing to do, nothing written.
    before = (tmp_path / "gpu-snapshot.json").read_bytes()
    again = run_module("nvidia_mig", args, diff=True)
    assert not again["changed"] and not again["snapshot_written"]
    assert not [line for line in again["would_run"] if "0000:17:00.0" in line]
    assert not [d for d in again["diff"] if d["before_header"] == "GPU 0000:17:00.0"]
    assert (tmp_path / "gpu-snapshot.json").read_bytes() == before


def test_render_mode_keeps_a_mode_change_pending_until_a_reset(run_module, tmp_path):
    # An A100 (Ampere) applies a MIG mode change only after a GPU reset: without reset_ok the
    # snapshot gets mode_pending enabled and no instance, as the driver shows it; the layer's
    # drift says it is pending, and the second run changes nothing.
    args = dict(
        render_args(tmp_path), gpus=[{"gpu": "0000:31:00.0", "layout": [{"profile": "3g.40gb"}]}]
    )
    applied = run_module("nvidia_mig", args)
    assert not applied.get("failed"), applied.get("msg")
    assert applied["snapshot_written"] and applied["reset_required"]
    recorded = json.loads((tmp_path / "gpu-snapshot.json").read_text())
    (gpu,) = [g for g in recorded["gpus"] if g["address"] == "0000:31:00.0"]
    assert gpu["mig"]["mode_current"] == "disabled"
    assert gpu["mig"]["mode_pending"] == "enabled"
    assert not gpu["mig"]["gpu_instances"]
    assert applied["mig_devices"] == []
    again = run_module("nvidia_mig", args)
    assert not again["changed"] and not again["snapshot_written"] and again["reset_required"]


def test_render_mode_never_writes_through_a_link(run_module, tmp_path):
    args = render_args(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "gpu-snapshot.json")
    before = (tmp_path / "gpu-snapshot.json").read_bytes()
    result = run_module("nvidia_mig", dict(args, snapshot=str(link)))
    assert result["failed"] and "is a symbolic link; it is never written through" in result["msg"]
    assert (tmp_path / "gpu-snapshot.json").read_bytes() == before
    assert link.is_symlink()


def test_nvml_backend_apply_and_rerun(run_module, tmp_path, monkeypatch):
    gpu = fake.FakeGpu("00000000:17:00.0", "NVIDIA H100 80GB HBM3", 81920,
                       mig=(pynvml.NVML_DEVICE_MIG_ENABLE,) * 2, profiles=fake.A100_80GB_PROFILES,
                       architecture=pynvml.NVML_DEVICE_ARCH_HOPPER)  # fmt: skip
    nvml = fake.FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    args = {
        "gpus": [
            {"gpu": "0000:17:00.0", "layout": [{"profile": "3g.40gb"}, {"profile": "4g.40gb"}]}
        ],
        "root": str(tmp_path / "root"),
        "procfs_root": str(tmp_path / "proc"),
        "sysfs_root": str(tmp_path / "sys"),
        "service_manager": "none",
        "mig_parted_config": "",
    }
    check = run_module("nvidia_mig", args, check_mode=True)
    assert check["changed"] and not set(nvml.calls) & set(fake.WRITE_FUNCTIONS)
    done = run_module("nvidia_mig", args)
    assert done["changed"] and len(done["mig_devices"]) == 2
    assert all(d["device_uuid"].startswith("MIG-") for d in done["mig_devices"])
    assert not (tmp_path / "root/etc/numafleet/mig-parted.yaml").exists()
    again = run_module("nvidia_mig", args)
    assert not again["changed"] and again["ran"] == []


def test_unfit_layout_fails_with_the_message(run_module, tmp_path):
    args = render_args(tmp_path)
    args["gpus"][0]["layout"] = [{"profile": "7g.80gb"}, {"profile": "1g.10gb"}]
    result = run_module("nvidia_mig", args)
    assert result["failed"] and "does not fit GPU 0000:17:00.0" in result["msg"]
    assert not (tmp_path / "root").exists()


def test_planned_uuid_is_accepted_and_checked(run_module, tmp_path):
    args = render_args(tmp_path)
    args["gpus"][0]["uuid"] = "GPU-59365d41-8075-51ae-aac5-77cbe78ed5ad"
    assert run_module("nvidia_mig", args, check_mode=True)["changed"]
    args["gpus"][1]["uuid"] = "GPU-27a1a97b-100a-5f4e-9236-eb21e9fcfce0"  # the GPU at b1:00.0
    result = run_module("nvidia_mig", args)
    assert result["failed"] and result["msg"] == (
        "gpus[1].uuid: GPU 31:00.0 (0000:31:00.0) has UUID GPU-fdb5df64-11ce-5c72-a560-"
        "9702875cecd6, not GPU-27a1a97b-100a-5f4e-9236-eb21e9fcfce0 as planned: the GPU was "
        "replaced or the plan is stale. Nothing was changed; re-gather facts and re-plan"
    )
    assert not (tmp_path / "root").exists()


def test_a_gpu_listed_twice_is_refused(run_module, tmp_path):
    args = render_args(tmp_path)
    args["gpus"][1] = {"gpu": "GPU-59365D41-8075-51AE-AAC5-77CBE78ED5AD", "mode": "disabled"}
    result = run_module("nvidia_mig", args)
    assert result["failed"] and result["msg"] == (
        "gpus[1].gpu: GPU 0000:17:00.0 is already listed as gpus[0]; list each GPU once"
    )
    assert not (tmp_path / "root").exists()


def test_unknown_suboption_is_refused_by_the_argument_spec(run_module, tmp_path):
    args = render_args(tmp_path)
    args["gpus"][0]["uuids"] = ["GPU-x"]
    result = run_module("nvidia_mig", args)
    assert result["failed"] and "uuids" in result["msg"]


def test_files_of_a_layout_no_longer_declared_are_removed(run_module, tmp_path):
    args = render_args(tmp_path)
    run_module("nvidia_mig", args)
    written = sorted(
        p.name for p in (tmp_path / "root").rglob("*") if p.is_file() and p.name != "apply.lock"
    )
    assert written == [
        "mig-parted.yaml",
        "mig.json",
        "numafleet-mig",
        "numafleet-mig.service",
    ]
    gone = run_module("nvidia_mig", dict(args, gpus=[]), check_mode=True)
    assert gone["changed"] and {f["state"] for f in gone["files"]} == {"remove"}
    assert gone["would_run"] == [
        "systemctl disable --now numafleet-mig.service",
        "systemctl daemon-reload",
    ]
    assert (
        sorted(
            p.name for p in (tmp_path / "root").rglob("*") if p.is_file() and p.name != "apply.lock"
        )
        == written
    )
    removed = run_module("nvidia_mig", dict(args, gpus=[]))
    assert removed["changed"] and not [
        p for p in (tmp_path / "root").rglob("*") if p.is_file() and p.name != "apply.lock"
    ]
    again = run_module("nvidia_mig", dict(args, gpus=[]))
    assert not again["changed"] and again["files"] == []


def test_mig_parted_config_turned_off_or_moved_is_removed(run_module, tmp_path):
    args = render_args(tmp_path)
    run_module("nvidia_mig", args)
    old = tmp_path / "root/etc/numafleet/mig-parted.yaml"
    assert old.is_file()
    moved = run_module("nvidia_mig", dict(args, mig_parted_config="/etc/mig-parted/config.yaml"))
    assert moved["changed"] and not old.exists()
    assert (tmp_path / "root/etc/mig-parted/config.yaml").is_file()
    off = run_module("nvidia_mig", dict(args, mig_parted_config=""))
    assert off["changed"] and not (tmp_path / "root/etc/mig-parted/config.yaml").exists()
    assert (tmp_path / "root/etc/numafleet/mig.json").is_file()
    assert not run_module("nvidia_mig", dict(args, mig_parted_config=""))["changed"]


def test_relative_root_is_refused(run_module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_module("nvidia_mig", dict(render_args(tmp_path), root="relative/dir"))
    assert result["failed"] and result["msg"].startswith("root: 'relative/dir' is not an absolute")
    assert not (tmp_path / "relative").exists()


# --- issue 19: state files fail loudly, foreign files are kept, no links, the lock --------------


def test_a_corrupt_state_file_fails_naming_it_and_is_not_rewritten(run_module, tmp_path):
    """Failed before: the corrupt mig.json was silently replaced."""
    args = render_args(tmp_path)
    state = tmp_path / "root/etc/numafleet/mig.json"
    state.parent.mkdir(parents=True)
    for text in ("{not json", '{"format": "other", "version": 1, "gpus": []}', "[]"):
        state.write_text(text)
        for check_mode in (True, False):
            result = run_module("nvidia_mig", args, check_mode=check_mode)
            assert result["failed"] is True, text
            assert result["msg"].startswith(f"{state}: ")
            assert "Restore it from the last run, or remove it" in result["msg"]
            assert state.read_text() == text
    assert not (tmp_path / "root/etc/systemd/system/numafleet-mig.service").exists()


def test_a_recorded_mig_parted_path_that_is_not_ours_is_kept(run_module, tmp_path):
    """Failed before: the path named in mig.json was removed whatever it held."""
    args = render_args(tmp_path)
    run_module("nvidia_mig", dict(args, mig_parted_config="/etc/numafleet/old.yaml"))
    old = tmp_path / "root/etc/numafleet/old.yaml"
    state = tmp_path / "root/etc/numafleet/mig.json"
    data = json.loads(state.read_text())
    data["mig_parted_config"] = "/etc/fstab"
    state.write_text(json.dumps(data))
    fstab = tmp_path / "root/etc/fstab"
    fstab.write_text("UUID=x / ext4 defaults 0 1\n")
    result = run_module("nvidia_mig", args)
    assert result["failed"] is False
    assert [item["path"] for item in result["kept"]] == ["/etc/fstab"]
    assert fstab.read_text() == "UUID=x / ext4 defaults 0 1\n" and old.exists()
    # the config this module wrote, recorded as such, is still removed
    data = json.loads(state.read_text())
    data["mig_parted_config"] = "/etc/numafleet/old.yaml"
    state.write_text(json.dumps(data))
    result = run_module("nvidia_mig", args)
    assert result["failed"] is False and result["kept"] == [] and not old.exists()


def test_a_linked_state_file_is_refused(run_module, tmp_path):
    args = render_args(tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    state = tmp_path / "root/etc/numafleet/mig.json"
    state.parent.mkdir(parents=True)
    state.symlink_to(outside)
    result = run_module("nvidia_mig", args)
    assert result["failed"] is True and "symbolic link" in result["msg"]
    assert outside.read_text() == "{}"


@pytest.mark.parametrize(
    ("option", "path"),
    [("mig_parted_config", "/etc/ssh/sshd_config"), ("boot_program_path", "/usr/bin/python3")],
)
def test_a_file_numafleet_did_not_write_is_never_overwritten(run_module, tmp_path, option, path):
    """Failed before: the admin's file was replaced by numafleet's, and removed by a later run."""
    args = dict(render_args(tmp_path), **{option: path})
    foreign = tmp_path / "root" / path.lstrip("/")
    foreign.parent.mkdir(parents=True)
    foreign.write_text("PermitRootLogin no\n")
    for check_mode in (True, False):
        result = run_module("nvidia_mig", args, check_mode=check_mode)
        assert result["failed"] is True
        assert result["msg"].startswith(f"{option}: {path} holds a file numafleet did not write")
        assert "no GPU was changed" in result["msg"]
        assert foreign.read_text() == "PermitRootLogin no\n"
    assert not (tmp_path / "root/etc/numafleet/mig.json").exists()
    # Its own file at that path is rewritten as usual.
    foreign.unlink()
    assert run_module("nvidia_mig", args)["failed"] is False
    assert run_module("nvidia_mig", args)["changed"] is False
