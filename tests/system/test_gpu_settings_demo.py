"""GPU baseline settings in render mode on the demo host gpu-h100-01 (its recorded 8x H100).

The host declares, for GPU 0000:18:00.0, persistence on, compute mode EXCLUSIVE_PROCESS and a
600 W power limit (inventories/demo/host_vars/gpu-h100-01.yml). ``--check --diff`` shows the
change and writes nothing; site.yml writes it into the recording (the snapshot); the second run
changes nothing and the drift check is clean; a power limit changed in the recording is drift on
nvidia_gpu; a process recorded on the GPU (a foreign holder) refuses the compute mode change.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from system_helpers import REPO, ansible_playbook, tree_digest

HOST = "gpu-h100-01"
GPU = "0000:18:00.0"
DRIFT = REPO / "playbooks" / "drift_check.yml"
APPLY_TASK = "Apply the placements"


class Demo:
    """A scratch copy of the demo fleet; runs limited to HOST."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.host_dir = base / ".demo" / HOST
        self.snapshot = self.host_dir / "gpu-snapshot.json"

    def site(self, *args):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", HOST, *args)

    def drift(self, name: str):
        env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(self.base / name)}
        run = ansible_playbook(DRIFT, self.inventory, "--limit", HOST, env=env)
        report = json.loads((self.base / name / "latest" / "drift.json").read_text())
        return run, report["hosts"][HOST]

    def gpu(self) -> dict:
        data = json.loads(self.snapshot.read_text())
        return next(g for g in data["gpus"] if g["address"] == GPU)

    def edit_gpu(self, change) -> None:
        data = json.loads(self.snapshot.read_text())
        change(next(g for g in data["gpus"] if g["address"] == GPU))
        self.snapshot.write_text(json.dumps(data, indent=2))


def _gpu_layer(run) -> dict:
    return run.one(HOST, APPLY_TASK)["layers"]["gpu"]


def test_check_apply_again_and_drift(tmp_path, ansible_ready):
    demo = Demo(tmp_path)
    before = tree_digest(demo.host_dir)
    check = demo.site("--check", "--diff")
    assert check.rc == 0, check.explain()
    layer = _gpu_layer(check)
    assert layer["changed"] is True
    assert [(c["setting"], c["before"], c["after"]) for c in layer["changes"]] == [
        ("compute_mode", "DEFAULT", "EXCLUSIVE_PROCESS"),
        ("power_limit_w", "unknown", "600 W"),
    ]  # persistence is recorded enabled already
    assert layer["diff"] == [
        {
            "before_header": f"NVIDIA GPU {GPU} settings",
            "after_header": f"NVIDIA GPU {GPU} settings",
            "before": "compute_mode: DEFAULT\npower_limit_w: unknown\n",
            "after": "compute_mode: EXCLUSIVE_PROCESS\npower_limit_w: 600 W\n",
        }
    ]
    assert tree_digest(demo.host_dir) == before  # check mode wrote nothing

    first = demo.site()
    assert first.rc == 0, first.explain()
    layer = _gpu_layer(first)
    assert layer["changed"] and layer["snapshot_written"] and layer["ran"] == []
    assert layer["would_run"] == [
        f"nvidia-smi -i {GPU} -c EXCLUSIVE_PROCESS",
        f"nvidia-smi -i {GPU} -pl 600",
    ]
    gpu = demo.gpu()
    assert (gpu["compute_mode"], gpu["power_limit"]) == ("exclusive_process", {"current_w": 600})

    second = demo.site()
    assert second.rc == 0 and second.stats[HOST]["changed"] == 0, second.explain()
    assert _gpu_layer(second)["changed"] is False
    run, entry = demo.drift("drift-clean")
    assert run.rc == 0 and entry["status"] == "clean", entry

    # A reboot (or someone) put the power limit back: drift on nvidia_gpu, naming it.
    demo.edit_gpu(lambda g: g.update(power_limit={"current_w": 700}))
    run, entry = demo.drift("drift-power")
    assert run.rc == 2 and entry["status"] == "drift", entry
    changes = [c for d in entry["drift"] if d["role"] == "nvidia_gpu" for c in d["changes"]]
    assert changes and changes[0]["path_or_header"] == f"NVIDIA GPU {GPU} settings", changes
    assert changes[0]["settings"] == ["power_limit_w"], changes


def test_a_recorded_process_refuses_exclusive_process(tmp_path, ansible_ready):
    demo = Demo(tmp_path)
    demo.edit_gpu(lambda g: g.update(processes=[4242]))
    run = demo.site()
    assert run.rc != 0
    failed = run.one(HOST, APPLY_TASK)
    assert "in use by pid 4242 (recorded in the snapshot)" in failed["msg"], failed["msg"]
    assert "nothing was changed" in failed["msg"]
    assert demo.gpu()["compute_mode"] == "default"
