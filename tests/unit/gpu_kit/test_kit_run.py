"""The GPU proof kit as a whole: its dry mode on this GPU-less machine (tests/gpu/run.sh, the
real entry point), the evidence it writes and its exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_proof
import pytest
from test_kit_facts import H100, FakeSmi, smi_xml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit" / "fixtures" / "gpu_snapshots"))

import fake_nvml  # noqa: E402
import make_snapshots  # noqa: E402


def test_dry_run_skips_every_check_and_exits_0(tmp_path):
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver: the dry mode does not apply")
    out = tmp_path / "evidence"
    env = {**os.environ, "PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", str(REPO / "tests/gpu/run.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "gpu-proof.json").read_text())
    assert document["status"] == "skipped"
    assert [check["id"] for check in document["checks"]] == [
        "nvml_facts",
        "nvidia_smi_xml",
        "mig_listings",
        "cuda_visibility",
        "mps",
    ]
    for check in document["checks"]:
        assert check["status"] == "skipped"
        assert check["skipped"].startswith("no NVIDIA driver (nvmlInit: NVML Shared Library")
    summary = (out / "gpu-proof.md").read_text()
    assert "result: **skipped** (5 skipped)" in summary
    assert summary in done.stdout
    assert sorted(path.name for path in out.iterdir()) == ["gpu-proof.json", "gpu-proof.md"]


@pytest.fixture
def fleet_context(fixture_root, kit_context):
    root = Path(fixture_root(H100))
    gpus = make_snapshots.fleet()[H100]
    return kit_context(
        nvml=fake_nvml.FakeNvml(gpus),
        sysfs_root=str(root / "sys"),
        procfs_root=str(root / "proc"),
        runner=FakeSmi(smi_xml(gpus)),
        which=lambda name: f"/usr/bin/{name}" if name == "nvidia-smi" else None,
    )


def test_main_writes_the_evidence_and_exits_0(fleet_context, tmp_path, capsys):
    out = tmp_path / "evidence"
    status = gpu_proof.main(
        ["--out", str(out)], ctx=fleet_context, checks=gpu_proof.all_checks()[:2]
    )
    assert status == 0
    document = json.loads((out / "gpu-proof.json").read_text())
    assert document["status"] == "pass" and document["driver"] is None
    assert document["driver_version"] == "560.35.03"
    assert len(document["gpus"]) == 8
    assert sorted(document["files"]) == ["nvidia-smi-q-x.xml", "nvml-snapshot.json"]
    summary = (out / "gpu-proof.md").read_text()
    assert "| nvml_facts | pass |" in summary and "| nvidia_smi_xml | pass |" in summary
    assert "evidence: " + str(out) in capsys.readouterr().out


def test_a_failed_item_exits_1_and_is_listed(fleet_context, tmp_path):
    def failing(ctx, check):
        check.add("made_up", False, {"seen": 1}, expected={"seen": 2})

    out = tmp_path / "evidence"
    status = gpu_proof.main(
        ["--out", str(out)], ctx=fleet_context, checks=[("one", "a failing check", failing)]
    )
    assert status == 1
    summary = (out / "gpu-proof.md").read_text()
    assert '- one/made_up: observed {"seen": 1}; expected {"seen": 2}' in summary


def test_a_broken_check_exits_2_and_the_others_still_run(fleet_context, tmp_path):
    def broken(ctx, check):
        raise ZeroDivisionError("made up")

    out = tmp_path / "evidence"
    checks = [("broken", "breaks", broken), *gpu_proof.all_checks()[:1]]
    status = gpu_proof.main(["--out", str(out)], ctx=fleet_context, checks=checks)
    assert status == 2
    document = json.loads((out / "gpu-proof.json").read_text())
    assert "ZeroDivisionError: made up" in document["checks"][0]["error"]
    assert document["checks"][1]["status"] == "pass"


def test_checks_after_the_budget_are_skipped(fleet_context, tmp_path):
    def slow(ctx, check):
        ctx.deadline = 1.0  # long past
        check.add("slow", True)

    out = tmp_path / "evidence"
    checks = [("slow", "spends the budget", slow), *gpu_proof.all_checks()[:1]]
    assert gpu_proof.main(["--out", str(out)], ctx=fleet_context, checks=checks) == 0
    document = json.loads((out / "gpu-proof.json").read_text())
    assert document["checks"][1]["skipped"] == "the kit's time budget was spent before this check"
