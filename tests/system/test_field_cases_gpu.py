"""GPU field cases, on a scratch copy of demo host gpu-a100-01 (render mode).

(a) GPU 0000:17:00.0 recorded with a MIG mode change pending a reset (field_cases.
    gpu_snapshot_mig_pending: "pending enable state", NVIDIA/gpu-operator#1845): site.yml plans
    no instance on it; the placements that need one are refused before the gate, naming the GPU,
    both modes and the fix, and nothing is written.
(b) The demo's MIG change destroys the 2g.20gb at slice 2 of that GPU; with holders of the GPU in
    the host's procfs (field_cases.gpu_holders_procfs: nvidia-persistenced, DCGM, a container
    with /dev/nvidia* open that NVML does not list), site.yml --check refuses the change and
    lists every holder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import field_cases  # tests/unit/fixtures (on sys.path through system_helpers)
from system_helpers import REPO, ansible_playbook

HOST = "gpu-a100-01"
GPU = "0000:17:00.0"
PLAN_TASK = "Plan placements"
APPLY_TASK = "Apply the placements"
# The demo A100 host's GPUs with made-up UUIDs and the device minors the driver would give.
GPUS = {
    "0000:17:00.0": ("NVIDIA A100 80GB PCIe", "GPU-00000000-0000-4000-8000-000000000017", 0),
    "0000:31:00.0": ("NVIDIA A100 80GB PCIe", "GPU-00000000-0000-4000-8000-000000000031", 1),
    "0000:b1:00.0": ("NVIDIA A100 80GB PCIe", "GPU-00000000-0000-4000-8000-0000000000b1", 2),
    "0000:ca:00.0": ("NVIDIA A100 80GB PCIe", "GPU-00000000-0000-4000-8000-0000000000ca", 3),
}


class Demo:
    """A scratch copy of the demo fleet; runs limited to HOST."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        self.fsroot = base / ".demo" / HOST
        self.snapshot = self.fsroot / "gpu-snapshot.json"

    def site(self, *args):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", HOST, *args)


def _failed(run, task: str) -> dict:
    (result,) = [r for r in run.results(HOST, task) if r["status"] == "failed"]
    return result


def test_pending_mig_mode_gets_no_instance_and_the_refusal_names_gpu_and_fix(
    tmp_path, ansible_ready
):
    demo = Demo(tmp_path)
    before = field_cases.gpu_snapshot_mig_pending(str(demo.snapshot), GPU, "disabled", "enabled")
    assert before["mig"]["gpu_instances"] == []
    recorded = demo.snapshot.read_text()
    run = demo.site()
    assert run.rc != 0, run.explain()
    msg = _failed(run, PLAN_TASK)["msg"]
    text = msg if isinstance(msg, str) else " ".join(msg)
    assert "mig_profile: 3g.40gb needs a new MIG instance" in text, text
    assert f"GPU {GPU} has MIG mode disabled with enabled pending until a GPU reset" in text
    assert "no MIG instance is planned on it until the mode applies" in text
    assert f"nvidia-smi --gpu-reset -i {GPU}" in text and "run site.yml again" in text
    assert "reboot the host" in text
    # Refused before the gate: nothing applied, the recording keeps no new instance.
    assert not run.results(HOST, APPLY_TASK) or all(
        r["status"] == "skipped" for r in run.results(HOST, APPLY_TASK)
    )
    assert demo.snapshot.read_text() == recorded
    assert not (demo.fsroot / "root" / "etc" / "systemd" / "system").exists()


def test_mig_change_in_check_mode_lists_every_foreign_holder_and_refuses(tmp_path, ansible_ready):
    demo = Demo(tmp_path)
    field_cases.gpu_holders_procfs(str(demo.fsroot / "proc"), GPUS)
    recorded = demo.snapshot.read_text()
    run = demo.site("--check", "--diff")
    assert run.rc != 0, run.explain()
    msg = _failed(run, APPLY_TASK)["msg"]
    assert "the MIG change is refused: GPU 0000:17:00.0 (destroying GPU instance(s)" in msg, msg
    assert "pid 1207 (nvidia-persistenced, nvidia-persistenced.service)" in msg
    assert "pid 2290 (nv-hostengine (DCGM), nvidia-dcgm.service: /dev/nvidia0, " in msg
    assert "pid 3311 (dcgm-exporter, not in a systemd service: /dev/nvidia-caps/nvidia-cap1" in msg
    assert "pid 5120" not in msg  # a shell on a terminal holds no GPU
    assert "Stop them" in msg and "reboot the host" in msg
    assert demo.snapshot.read_text() == recorded  # check mode wrote nothing


# (c) A KVM guest's GPU 0000:06:00.0 has numa_node -1 and local CPUs over both nodes (demo host
#     vm-gpu-01), so sysfs cannot place it. Recorded with NVML's CPU affinity at NODE scope on
#     node 0's CPUs (nvmlDeviceGetCpuAffinityWithinScope, as a guest with vNUMA reports it), the
#     GPU takes node 0 from NVML (node_source nvml_cpu_affinity): whisper, pinned to that GPU,
#     is planned on node 0 without the unknown-locality warning it has as shipped.
VM_HOST = "vm-gpu-01"
VM_GPU = "0000:06:00.0"
SUMMARY_TASK = "Print the plan summary"


def _cpulist(text: str) -> list:
    ids = []
    for part in text.strip().split(","):
        first, dummy, last = part.partition("-")
        ids.extend(range(int(first), int(last or first) + 1))
    return ids


def test_nvml_cpu_affinity_places_a_gpu_that_sysfs_leaves_unknown(tmp_path, ansible_ready):
    demo = Demo(tmp_path)
    fsroot = tmp_path / ".demo" / VM_HOST
    node0 = _cpulist((fsroot / "sys/devices/system/node/node0/cpulist").read_text())
    run = ansible_playbook(REPO / "site.yml", demo.inventory, "--limit", VM_HOST)
    assert run.rc == 0, run.explain()
    shipped = run.one(VM_HOST, SUMMARY_TASK)["msg"]
    assert "whisper node" in shipped and "1 warning" in shipped, shipped

    snapshot = fsroot / "gpu-snapshot.json"
    data = json.loads(snapshot.read_text())
    (gpu,) = [g for g in data["gpus"] if g["address"] == VM_GPU]
    gpu["nvml_cpu_affinity"] = node0
    gpu["unavailable"].pop("nvml_cpu_affinity", None)
    snapshot.write_text(json.dumps(data))
    run = ansible_playbook(REPO / "site.yml", demo.inventory, "--limit", VM_HOST, "--check")
    assert run.rc == 0, run.explain()
    line = run.one(VM_HOST, SUMMARY_TASK)["msg"]
    assert "whisper node0 " in line, line
    assert "warning" not in line, line
