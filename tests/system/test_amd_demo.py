"""AMD Instinct on the demo host mi300x-01: placements, device selection, partitions.

mi300x-01 has 8 MI300X, one XGMI hive in memory partition NPS1: 0000:03:00.0 and 0000:23:00.0
(node 0) whole (SPX), the other six in CPX (8 logical GPUs each, all carrying their GPU's UUID,
as the driver gives them). Its host_vars place a 70B model on the two whole GPUs of node 0 and
16 small models with ``partition: cpx`` (8 on 0000:43:00.0, node 0; 8 on 0000:83:00.0, node 1),
and declare one partition change: 0000:e3:00.0 CPX -> SPX (no driver reload).

- check mode shows the change and writes nothing;
- render mode writes the scratch tree's partition files; the whole GPUs' unit carries
  ROCR_VISIBLE_DEVICES by UUID, each CPX unit its logical GPU's render node (DevicePolicy=closed,
  DeviceAllow=) as the shared UUID selects none, never an index; all carry the pinning of their
  GPU's node, and the summary line shows the placements; a second run changes nothing; verify's
  gpu_partitions checks pass.
"""

from __future__ import annotations

import json
import re

from system_helpers import tree_digest

HOST = "mi300x-01"
CHANGED_GPU = "0000:e3:00.0"
PLAN_TASK = "Plan placements"
APPLY_TASK = "Apply the placements"
SMALL = [f"small-{i:02d}" for i in range(16)]
NODE_CPUS = {
    0: set(range(48)) | set(range(96, 144)),
    1: set(range(48, 96)) | set(range(144, 192)),
}


def _partition_file(root, address: str, name: str):
    (path,) = list((root / "sys" / "devices").rglob(f"{address}/{name}"))
    return path


def _modes(root, address: str) -> tuple:
    return tuple(
        _partition_file(root, address, f"current_{kind}_partition").read_text().strip()
        for kind in ("compute", "memory")
    )


def _cpus(text: str) -> set:
    out = set()
    for part in text.replace(" ", ",").split(","):
        if "-" in part:
            low, high = part.split("-")
            out |= set(range(int(low), int(high) + 1))
        elif part:
            out.add(int(part))
    return out


def _amd_layer(run) -> dict:
    return run.one(HOST, APPLY_TASK)["layers"]["amd"]


def test_check_mode_shows_the_partition_change_and_writes_nothing(scratch_demo):
    demo = scratch_demo(HOST)
    before = tree_digest(demo.root)
    run = demo.site("--check", "--diff")
    assert run.rc == 0, run.explain()
    assert tree_digest(demo.root) == before
    assert _modes(demo.root, CHANGED_GPU) == ("CPX", "NPS1")
    summary = run.one(HOST, PLAN_TASK)["summary"]
    assert "llm-70b node0 cpus " in summary and " gpus 03:00.0,23:00.0;" in summary, summary
    assert summary.count("/cpx") == 16, summary
    layer = _amd_layer(run)
    assert layer["changed"] is True
    (gpu,) = [g for g in layer["gpus"] if g["address"] == CHANGED_GPU]
    assert gpu["compute"] == {"before": "CPX", "after": "SPX"}
    assert gpu["memory"]["before"] == gpu["memory"]["after"] == "NPS1", gpu


def test_render_mode_applies_the_partitions_and_selects_each_gpu(scratch_demo):
    demo = scratch_demo(HOST)
    first = demo.site()
    assert first.rc == 0, first.explain()
    # The change reached the scratch tree's sysfs files; the other GPUs kept their modes.
    assert _modes(demo.root, CHANGED_GPU) == ("SPX", "NPS1")
    assert _modes(demo.root, "0000:43:00.0") == ("CPX", "NPS1")
    assert _modes(demo.root, "0000:03:00.0") == ("SPX", "NPS1")

    plan_result = first.one(HOST, PLAN_TASK)
    summary = plan_result["summary"]
    assert summary.startswith(f"{HOST}: 17 placements: llm-70b node0 "), summary
    assert re.search(r"llm-70b node0 cpus \S+ gpus 03:00\.0,23:00\.0", summary), summary
    for name in SMALL:
        assert f"{name} node{0 if name < 'small-08' else 1} " in summary, (name, summary)

    plan = json.loads((demo.root / "root" / "etc/numafleet/plan.json").read_text())
    plan = plan.get("plan", plan)
    placements = {p["name"]: p for p in plan["placements"]}
    llm = placements["llm-70b"]
    uuids = [g["uuid"] for g in llm["gpus"]]
    assert all(uuid and uuid.startswith("GPU-") for uuid in uuids), llm["gpus"]
    unit = demo.unit("numafleet-llm-70b.service")
    assert f'Environment="ROCR_VISIBLE_DEVICES={",".join(uuids)}"' in unit, unit
    assert "CUDA_VISIBLE_DEVICES" not in unit
    seen = set()
    for name in SMALL:
        placement = placements[name]
        (gpu,) = placement["gpus"]
        node = 0 if name < "small-08" else 1
        assert gpu["address"] == ("0000:43:00.0" if node == 0 else "0000:83:00.0")
        assert gpu["partition"]["mode"] == "CPX" and gpu["partition"]["uuid"], gpu
        minor = gpu["partition"]["render_minor"]
        assert minor not in seen and isinstance(minor, int), gpu
        seen.add(minor)
        render = f"/dev/dri/renderD{minor}"
        assert placement["device_allow"] == ["/dev/kfd", render], placement
        assert placement["node"] == node and placement["mems"] == [node]
        text = demo.unit(f"numafleet-{name}.service")
        assert "ROCR_VISIBLE_DEVICES" not in text, text
        assert f"DevicePolicy=closed\nDeviceAllow=/dev/kfd rw\nDeviceAllow={render} rw\n" in text
        affinity = re.search(r"^CPUAffinity=(.+)$", text, re.M).group(1)
        assert _cpus(affinity) <= NODE_CPUS[node], (name, affinity)
        assert re.search(rf"^NUMAMask={node}$", text, re.M), text

    second = demo.site()
    assert second.rc == 0 and second.stats[HOST]["changed"] == 0, second.explain()
    assert _amd_layer(second)["changed"] is False

    run, entry = demo.verify("verify")
    assert run.rc == 0, run.explain()
    checks = [c for c in entry["checks"] if c["check"] == "gpu_partitions"]
    subjects = {c["subject"]: c["status"] for c in checks}
    assert subjects[f"GPU {CHANGED_GPU}"] == "pass", checks
    assert all(subjects[name] == "pass" for name in ["llm-70b", *SMALL]), checks
    assert {c["status"] for c in checks} == {"pass"}, json.dumps(checks, indent=1)
