"""A pending MIG mode (current != pending): facts say reset_required, the planner builds nothing.

The GPU is the A100 of the synthetic-2x6338-4xa100 fixture (its recorded-style
snapshot tests/unit/fixtures/gpu_snapshots/synthetic-2x6338-4xa100.json), edited to the field
case of NVIDIA/gpu-operator#118 and #1845 (tests/unit/fixtures/cmd/nvidia-smi/
mig-mode-pending-and-reset-blocked-messages.txt): ``nvidia-smi -mig 1`` (or ``-mig 0``) left
"pending enable/disable" because a client held the GPU.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pynvml
import pytest

UNIT = Path(__file__).resolve().parents[3]
for _extra in (UNIT, UNIT / "fixtures", UNIT / "fixtures" / "gpu_snapshots"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import fake_nvml as fake  # noqa: E402
import make_snapshots  # noqa: E402
import trees  # noqa: E402

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (  # noqa: E402
    gpu,
    gpu_nvml,
    gpu_smi,
    gpu_snapshot,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (  # noqa: E402
    PlacementError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (  # noqa: E402
    plan_host,
    plan_summary,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import (  # noqa: E402
    Reader,
)

A100 = "synthetic-2x6338-4xa100"
MIG_GPU = "0000:17:00.0"  # MIG enabled in the fixture: 2g.20gb@0, 2g.20gb@2, 3g.40gb@4
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}
ENABLE, DISABLE = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


def _facts(tmp_path, state) -> dict:
    root = trees.materialize(A100, tmp_path / A100)
    facts = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
    return {entry["address"]: entry for entry in facts["gpus"]}


# ---------------------------------------------------------------------------------------------
# Facts: reset_required from every source


@pytest.mark.parametrize(
    ("modes", "required"),
    [((ENABLE, ENABLE), False), ((DISABLE, ENABLE), True), ((ENABLE, DISABLE), True)],
)
def test_nvml_mig_modes_give_reset_required(tmp_path, modes, required):
    gpus = make_snapshots.fleet()[A100]
    gpus[0].mig = modes
    facts = _facts(tmp_path, gpu_nvml.read_nvml(fake.FakeNvml(gpus)))
    assert facts[MIG_GPU]["mig"]["reset_required"] is required
    assert facts[MIG_GPU]["sources"]["mig"] == "nvml"


def test_nvidia_smi_pending_mig_gives_reset_required(tmp_path):
    xml = (UNIT / "fixtures" / "cmd" / "nvidia-smi" / "synthetic-a100-40gb-mig-q-x.xml").read_text()
    pending = xml.replace(
        "<pending_mig>Enabled</pending_mig>", "<pending_mig>Disabled</pending_mig>", 1
    )
    assert pending != xml
    for text, required in ((xml, False), (pending, True)):
        state = gpu_smi.parse_nvidia_smi_xml(text)
        (record,) = [r for r in state.gpus.values() if r["mig"] is not None][:1]
        merged, dummy = gpu.merge(
            [
                gpu.SysfsGpu(
                    address, "nvidia", "0x10de", None, 0, 0, "numa_node", None, None, None, None
                )
                for address in state.gpus
            ],
            state,
        )
        first = next(entry for entry in merged if entry["mig"] is not None)
        assert first["mig"]["reset_required"] is required
        assert first["sources"]["mig"] == "nvidia-smi"


def test_snapshot_pending_mode_gives_reset_required_and_old_key_is_accepted(tmp_path):
    data = json.loads((trees.GPU_SNAPSHOT_DIR / f"{A100}.json").read_text())
    record = next(g for g in data["gpus"] if g["address"] == MIG_GPU)
    record["mig"].update(mode_current="disabled", mode_pending="enabled", gpu_instances=[])
    record["mig"]["reset_required"] = False  # a stale recorded value: recomputed on read
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(data))
    facts = _facts(tmp_path, gpu_snapshot.read_snapshot(str(path)))
    assert facts[MIG_GPU]["mig"]["reset_required"] is True
    assert facts[MIG_GPU]["sources"]["mig"] == "snapshot"
    assert facts["0000:31:00.0"]["mig"]["reset_required"] is False


def test_mig_reset_required_with_unknown_pending_mode_is_false():
    assert gpu.mig_reset_required({"mode_current": "enabled", "mode_pending": None}) is False
    assert gpu.mig_reset_required({"mode_current": "disabled", "mode_pending": "enabled"}) is True


# ---------------------------------------------------------------------------------------------
# Planner


@pytest.fixture
def a100(fixture_root):
    """(numa facts, gpu_topology facts) of the A100 fixture, fresh copies."""
    numa = json.loads((trees.SYSFS / f"{A100}.numa.json").read_text(encoding="utf-8"))
    root = fixture_root(A100)
    state = gpu_snapshot.read_snapshot(str(trees.GPU_SNAPSHOT_DIR / f"{A100}.json"))
    topology = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
    return numa, json.loads(json.dumps(topology))


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 4}
    entry.update(changes)
    return entry


def _set_modes(gpus: dict, current: str, pending: str, instances: bool = True) -> dict:
    gpus = copy.deepcopy(gpus)
    entry = next(g for g in gpus["gpus"] if g["address"] == MIG_GPU)
    entry["mig"].update(mode_current=current, mode_pending=pending)
    if not instances:
        entry["mig"]["gpu_instances"] = []
    else:  # only the two 2g.20gb (slices 0-3): slices 4-6 are free for new instances
        entry["mig"]["gpu_instances"] = [
            gi for gi in entry["mig"]["gpu_instances"] if gi["profile_name"] == "2g.20gb"
        ]
    entry["mig"]["reset_required"] = current != pending
    return gpus


def _by_name(result: dict) -> dict:
    return {entry["name"]: entry for entry in result["placements"]}


def _recorded(result: dict) -> dict:
    return {entry["name"]: entry for entry in result["placements"]}


def test_pending_enable_refuses_a_new_instance_naming_gpu_modes_and_fix(a100):
    numa, gpus = a100
    gpus = _set_modes(gpus, "disabled", "enabled", instances=False)
    declared = [{"gpu": MIG_GPU, "mode": "enabled"}]
    with pytest.raises(PlacementError) as caught:
        plan_host("h", numa, gpus, [p("small", mig_profile="1g.10gb")], [], POLICY,
                  mig_gpus=declared)  # fmt: skip
    text = str(caught.value)
    assert "numafleet_placements[0] (small).mig_profile: 1g.10gb needs a new MIG instance" in text
    assert f"GPU {MIG_GPU} has MIG mode disabled with enabled pending until a GPU reset" in text
    assert "no MIG instance is planned on it until the mode applies" in text
    assert f"nvidia-smi --gpu-reset -i {MIG_GPU}" in text
    assert "reboot the host" in text and "run site.yml again" in text


def test_pending_enable_without_declaration_is_refused_with_the_pending_message(a100):
    """Not declared, MIG on only after a reset: not the 'enable MIG' advice the user followed."""
    numa, gpus = a100
    gpus = _set_modes(gpus, "disabled", "enabled", instances=False)
    for placement in (p("small", mig_profile="1g.10gb"),
                      p("small", mig_profile="1g.10gb", gpus=[MIG_GPU])):  # fmt: skip
        with pytest.raises(PlacementError, match="enabled pending until a GPU reset"):
            plan_host("h", numa, gpus, [placement], [], POLICY)


def test_pending_disable_keeps_existing_instances_and_refuses_new_ones(a100):
    numa, gpus = a100
    first = plan_host("h", numa, gpus, [p("small", mig_profile="2g.20gb")], [], POLICY, mig_gpus=[])
    kept = _by_name(first)["small"]["gpus"][0]["mig"]
    assert kept["existing"] is True
    pending = _set_modes(gpus, "enabled", "disabled")
    again = plan_host(
        "h", numa, pending, [p("small", mig_profile="2g.20gb")], [], POLICY,
        recorded=_recorded(first),
    )  # fmt: skip
    small = _by_name(again)["small"]
    assert again["stability"]["small"] == "kept"
    assert small["gpus"][0]["mig"] == kept and small["waits_for"] is None
    (warning,) = [w for w in small["warnings"] if "pending until a GPU reset" in w]
    assert f"GPU {MIG_GPU} has MIG mode enabled with disabled pending" in warning
    assert "is kept (no move, no removal)" in warning
    mig_gpu = next(g for g in again["mig_gpus"] if g["gpu"] == MIG_GPU)
    assert [s["profile"] for s in mig_gpu["layout"]] == ["2g.20gb", "2g.20gb"]
    # A new placement needing a 1g.10gb (no such instance exists) is refused, not planned.
    with pytest.raises(PlacementError) as caught:
        plan_host(
            "h", numa, pending,
            [p("small", mig_profile="2g.20gb"), p("tiny", mig_profile="1g.10gb", gpus=[MIG_GPU])],
            [], POLICY, recorded=_recorded(first),
        )  # fmt: skip
    assert "(tiny).mig_profile: 1g.10gb needs a new MIG instance" in str(caught.value)
    assert "enabled with disabled pending" in str(caught.value)


def test_placement_that_waited_for_its_instance_keeps_waiting_on_its_slot(a100):
    """Day 2 of the mode-off flow: planned with MIG off (created once MIG mode is on), the run
    enabled MIG but the change stays pending (Ampere, no reset): the placement keeps its slot
    and waits (the MIG layer creates it only once the mode applies)."""
    numa, gpus = a100
    off = _set_modes(gpus, "disabled", "disabled", instances=False)
    declared = [{"gpu": MIG_GPU, "mode": "enabled"}]
    placements = [p("small", mig_profile="1g.10gb")]
    first = plan_host("h", numa, off, placements, [], POLICY, mig_gpus=declared)
    waits = _by_name(first)["small"]["waits_for"]
    assert waits["reason"] == "created in this run once MIG mode is on"
    assert [s["profile"] for s in first["mig_gpus"][0]["layout"]] == ["1g.10gb"]
    pending = _set_modes(gpus, "disabled", "enabled", instances=False)
    again = plan_host("h", numa, pending, placements, [], POLICY, mig_gpus=declared,
                      recorded=_recorded(first))  # fmt: skip
    small = _by_name(again)["small"]
    assert again["stability"]["small"] == "kept"
    assert small["cpus"] == _by_name(first)["small"]["cpus"]
    assert small["waits_for"] == dict(waits, reason="mode change pending a reset")
    assert small["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    assert any("is kept (no move, no removal)" in w for w in small["warnings"])
    gpu_out = next(g for g in again["gpus"] if g["address"] == MIG_GPU)
    assert gpu_out["mig"]["reset_required"] is True
    assert again["mig_gpus"] == first["mig_gpus"]  # unchanged: no second run rewrites it
    assert "(waits for MIG instance 1g.10gb" in plan_summary(again)
    # A second placement, new in this plan, is refused: nothing new on a pending GPU.
    with pytest.raises(PlacementError, match="needs a new MIG instance"):
        plan_host("h", numa, pending, placements + [p("more", mig_profile="1g.10gb")], [],
                  POLICY, mig_gpus=declared, recorded=_recorded(first))  # fmt: skip


def test_declared_layout_on_a_pending_gpu_warns(a100):
    numa, gpus = a100
    pending = _set_modes(gpus, "disabled", "enabled", instances=False)
    declared = [{"gpu": MIG_GPU, "layout": ["3g.40gb", "1g.10gb"]}]
    result = plan_host("h", numa, pending, [], [], POLICY, mig_gpus=declared)
    (warning,) = [w for w in result["warnings"] if "pending until a GPU reset" in w]
    assert warning.startswith(f"facts: GPU {MIG_GPU} has MIG mode disabled with enabled")
    assert "numafleet_mig_gpus[0].layout lacks 3g.40gb@" in warning
    gpu_out = next(g for g in result["gpus"] if g["address"] == MIG_GPU)
    assert gpu_out["mig"]["reset_required"] is True


def test_gpu_without_pending_mode_plans_new_instances_as_before(a100):
    numa, gpus = a100
    gpus = _set_modes(gpus, "enabled", "enabled")
    result = plan_host("h", numa, gpus, [p("tiny", mig_profile="1g.10gb")], [], POLICY)
    tiny = _by_name(result)["tiny"]
    assert tiny["waits_for"]["reason"] == "created in this run"
    assert not [w for w in result["warnings"] if "pending" in w]
