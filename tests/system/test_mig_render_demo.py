"""MIG in render mode keeps the recording a consistent kernel (demo host gpu-a100-01).

site.yml writes the MIG instances it creates into the host's GPU snapshot, so the placement
waiting for one is started in the same run, the second run changes nothing and the drift check
is clean. An instance then removed from the recording by hand is drift on nvidia_mig, naming
the instance; the next site.yml creates it again in the recording and the host is clean again.

A MIG mode change that needs a GPU reset (an A100 recorded with MIG disabled) stays pending in
the recording, as the driver keeps it: the placements on the GPU wait (written, not started),
verify warns for their running check and its summary says how many wait.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from system_helpers import REPO, ansible_playbook

HOST = "gpu-a100-01"
GPU = "0000:17:00.0"
DRIFT = REPO / "playbooks" / "drift_check.yml"
VERIFY = REPO / "playbooks" / "verify.yml"
APPLY_TASK = "Apply the placements"
WOULD_RUN_TASK = "Report what would run (render mode)"


class Demo:
    """A scratch copy of the demo fleet; runs limited to HOST."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.snapshot = base / ".demo" / HOST / "gpu-snapshot.json"

    def site(self):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", HOST)

    def drift(self, name: str):
        env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(self.base / name)}
        run = ansible_playbook(DRIFT, self.inventory, "--limit", HOST, env=env)
        report = json.loads((self.base / name / "latest" / "drift.json").read_text())
        return run, report["hosts"][HOST]

    def verify(self, name: str):
        run = ansible_playbook(
            VERIFY,
            self.inventory,
            "--limit",
            HOST,
            "-e",
            f"numafleet_report_dir={self.base / name}",
        )
        return run, json.loads((self.base / name / "verify.json").read_text())["hosts"][HOST]

    def gpu(self) -> dict:
        data = json.loads(self.snapshot.read_text())
        return next(g for g in data["gpus"] if g["address"] == GPU)

    def edit_gpu(self, change) -> None:
        data = json.loads(self.snapshot.read_text())
        change(next(g for g in data["gpus"] if g["address"] == GPU))
        self.snapshot.write_text(json.dumps(data, indent=2))


def _layout(gpu: dict) -> list:
    return sorted(
        f"{gi['profile_name']}@{gi['placement_start']}" for gi in gpu["mig"]["gpu_instances"]
    )


GUARD_ROLE = "numafleet.tuning.memory_guard : "


def _changed(run) -> int:
    """Changed tasks of the host but the memory guard's (its guard.json follows the plan's MIG
    devices: see _guard_changes)."""
    return run.stats[HOST]["changed"] - _guard_changes(run)


def _guard_changes(run) -> int:
    return sum(
        1
        for r in run.results(HOST)
        if r.get("changed") and r.get("task", "").startswith(GUARD_ROLE)
    )


def test_render_creates_the_instance_starts_the_waiting_unit_and_repairs_a_removed_one(
    tmp_path, ansible_ready
):
    demo = Demo(tmp_path)
    first = demo.site()
    assert first.rc == 0, first.explain()
    # The instances the layer created are in the recording, marked rendered ...
    gpu = demo.gpu()
    assert _layout(gpu) == ["1g.10gb@2", "1g.10gb@3", "2g.20gb@0", "3g.40gb@4"]
    made = {gi["placement_start"]: gi for gi in gpu["mig"]["gpu_instances"] if gi.get("rendered")}
    assert sorted(made) == [2, 3]
    # ... and classify, which waited for the 1g.10gb at slice 2, started in the same run.
    msg = first.one(HOST, WOULD_RUN_TASK)["msg"]
    assert "would run: systemctl enable --now numafleet-classify.service" in msg
    unit = tmp_path / ".demo" / HOST / "root/etc/systemd/system/numafleet-classify.service"
    assert f'Environment="CUDA_VISIBLE_DEVICES={made[2]["mig_device_uuid"]}"' in unit.read_text()

    second = demo.site()
    assert second.rc == 0 and second.stats[HOST]["changed"] == 0, second.explain()
    run, entry = demo.drift("drift-clean")
    assert run.rc == 0 and entry["status"] == "clean", entry

    # The embedding service's 3g.40gb goes from the recording: drift, naming the instance.
    demo.edit_gpu(
        lambda g: g["mig"].update(
            gpu_instances=[
                gi for gi in g["mig"]["gpu_instances"] if gi["profile_name"] != "3g.40gb"
            ]
        )
    )
    run, entry = demo.drift("drift-removed")
    assert run.rc == 2 and entry["status"] == "drift", entry
    mig = [c for d in entry["drift"] if d["role"] == "nvidia_mig" for c in d["changes"]]
    assert mig and mig[0]["settings"] == [f"GPU {GPU} 3g.40gb@4"], mig

    # site.yml creates it again in the recording (changed), embed gets the new instance.
    third = demo.site()
    assert third.rc == 0 and _changed(third) == 1, third.explain()
    # The guard's configuration follows the new MIG device (before the apply and after its
    # re-plan); the fourth run below changes nothing.
    assert _guard_changes(third) >= 1, third.explain()
    gpu = demo.gpu()
    assert "3g.40gb@4" in _layout(gpu)
    (again,) = [gi for gi in gpu["mig"]["gpu_instances"] if gi["profile_name"] == "3g.40gb"]
    assert again["rendered"] is True
    embed = tmp_path / ".demo" / HOST / "root/etc/systemd/system/numafleet-embed.service"
    assert f'Environment="CUDA_VISIBLE_DEVICES={again["mig_device_uuid"]}"' in embed.read_text()
    fourth = demo.site()
    assert fourth.rc == 0 and fourth.stats[HOST]["changed"] == 0, fourth.explain()
    run, entry = demo.drift("drift-repaired")
    assert run.rc == 0 and entry["status"] == "clean", entry


WAITING = ("classify", "embed", "rerank-mini-a")


def test_a_mode_change_pending_a_reset_stays_pending_and_its_placements_wait(
    tmp_path, ansible_ready
):
    demo = Demo(tmp_path)
    demo.edit_gpu(
        lambda g: g["mig"].update(
            mode_current="disabled", mode_pending="disabled", gpu_instances=[]
        )
    )
    first = demo.site()
    assert first.rc == 0, first.explain()
    mig = demo.gpu()["mig"]
    # An A100 applies the mode change at the next GPU reset: the recording keeps it pending.
    assert (mig["mode_current"], mig["mode_pending"], mig["gpu_instances"]) == (
        "disabled",
        "enabled",
        [],
    )
    msg = first.one(HOST, WOULD_RUN_TASK)["msg"]
    for name in WAITING:
        assert not [line for line in msg if "systemctl" in line and f"numafleet-{name}." in line]
        assert any(
            line.startswith(f"would run: numafleet-{name}.service: not started") for line in msg
        )
    units = first.one(HOST, APPLY_TASK)["layers"]["units"]
    assert sorted(w["unit"] for w in units["waiting"]) == [
        f"numafleet-{name}.service" for name in WAITING
    ]
    second = demo.site()
    assert second.rc == 0 and _changed(second) == 0, second.explain()
    # Verify: running warns with the reason (render mode too), the summary counts them.
    run, entry = demo.verify("verify")
    assert run.rc == 0, run.explain()
    running = {c["subject"]: c for c in entry["checks"] if c["check"] == "running"}
    for name in WAITING:
        assert running[name]["status"] == "warn", running[name]
        assert "mode change pending a reset" in running[name]["message"]
    assert f"3 waiting for a MIG instance ({', '.join(WAITING)})" in entry["summary"]
    # The drift check: the pending mode is no drift (it waits for the reset).
    run, entry = demo.drift("drift")
    assert run.rc == 0 and entry["status"] == "clean", entry
