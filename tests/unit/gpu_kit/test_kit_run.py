"""The GPU proof kit as a whole: its dry mode on this GPU-less machine (tests/gpu/run.sh, the
real entry point), the evidence it writes and its exit status."""

from __future__ import annotations

import json
import os
import signal
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
    done = _run_sh(out, {**os.environ, "PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "gpu-proof.json").read_text())
    assert document["status"] == "skipped"
    assert [check["id"] for check in document["checks"]] == [
        "nvml_facts",
        "nvidia_smi_xml",
        "mig_listings",
        "cuda_visibility",
        "mps",
        "amd_facts",
    ]
    *nvidia, amd = document["checks"]
    for check in nvidia:
        assert check["status"] == "skipped"
        assert check["skipped"] == (
            "no NVIDIA driver (nvidia-smi is not in PATH; nvmlInit: NVML Shared Library Not Found)"
        )
    # The AMD section looks for AMD GPUs itself: none on this machine.
    assert amd["status"] == "skipped" and amd["skipped"].startswith("no AMD GPU here")
    summary = (out / "gpu-proof.md").read_text()
    assert "result: **skipped** (6 skipped)" in summary
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


def _run_sh(out: Path, env: dict) -> subprocess.CompletedProcess:
    """tests/gpu/run.sh OUT in the environment ``env``."""
    return subprocess.run(
        ["bash", str(REPO / "tests/gpu/run.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _with_fakes(**env) -> dict:
    """The fakes (nvidia-smi, MPS control) first in PATH and the system python3 (no
    nvidia-ml-py), as a host with a driver but no NVML bindings."""
    fakes = Path(__file__).resolve().parent / "fakes"
    return {"PATH": f"{fakes}:/usr/bin:/bin", "PYTHON": "/usr/bin/python3", **env}


def test_checks_that_skip_through_run_sh_are_skips_not_breaks(tmp_path):
    if (
        subprocess.run(
            ["/usr/bin/python3", "-c", "import pynvml"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        pytest.skip("the system python3 has nvidia-ml-py here")
    done = _run_sh(tmp_path / "evidence", _with_fakes())
    document = json.loads((tmp_path / "evidence" / "gpu-proof.json").read_text())
    checks = {check["id"]: check for check in document["checks"]}
    assert done.returncode == 0, done.stdout + done.stderr
    assert checks["nvml_facts"]["skipped"].startswith("nvidia-ml-py is not installed")
    assert checks["nvidia_smi_xml"]["status"] == "pass"  # the recorded H100 XML, parsed
    # The XML's GPU is not under this machine's /sys: the later checks have no GPU to use.
    for name in ("mig_listings", "cuda_visibility", "mps"):
        assert checks[name]["status"] == "skipped" and checks[name]["error"] is None, name
    assert document["host"]["nvidia_smi_L"]["rc"] == 0


def test_a_driver_that_does_not_answer_fails(tmp_path):
    done = _run_sh(tmp_path / "evidence", _with_fakes(FAKE_SMI_BROKEN="1"))
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads((tmp_path / "evidence" / "gpu-proof.json").read_text())
    driver = document["checks"][0]
    assert driver["id"] == "driver" and driver["status"] == "fail"
    assert "couldn't communicate" in driver["items"][0]["observed"]["nvidia_smi_L"]["stderr"]
    assert document["driver"] is None


def test_an_unwritable_out_exits_2_with_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert gpu_proof.main(["--out", str(blocker / "evidence")]) == 2
    assert capsys.readouterr().err.startswith(f"gpu-proof: cannot write the evidence to {blocker}")


def test_a_new_run_drops_the_old_evidence(fleet_context, tmp_path):
    out = tmp_path / "evidence"
    out.mkdir()
    (out / "nvidia-smi-mig.txt").write_text("from an earlier run\n")
    (out / "notes.txt").write_text("the operator's own file\n")
    assert (
        gpu_proof.main(["--out", str(out)], ctx=fleet_context, checks=gpu_proof.all_checks()[:1])
        == 0
    )
    assert not (out / "nvidia-smi-mig.txt").exists()
    assert (out / "notes.txt").read_text() == "the operator's own file\n"


def test_sigterm_stops_the_run_with_what_it_had(fleet_context, tmp_path):
    def killed(ctx, check):
        check.add("before", True)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:  # the cleanup a second SIGTERM (timeout's to the group) must not break into
            os.kill(os.getpid(), signal.SIGTERM)
            check.add("cleaned up", True)
        check.add("after", True)  # never reached

    out = tmp_path / "evidence"
    checks = [
        *gpu_proof.all_checks()[:1],
        ("killed", "gets SIGTERM", killed),
        *gpu_proof.all_checks()[1:2],
    ]
    assert gpu_proof.main(["--out", str(out)], ctx=fleet_context, checks=checks) == 2
    document = json.loads((out / "gpu-proof.json").read_text())
    states = [(c["id"], c["status"]) for c in document["checks"]]
    assert states == [("nvml_facts", "pass"), ("killed", "fail"), ("nvidia_smi_xml", "skipped")]
    assert document["checks"][1]["error"].startswith("stopped by signal 15")
    assert [i["name"] for i in document["checks"][1]["items"]] == ["before", "cleaned up"]
    assert document["checks"][2]["skipped"] == "the run was stopped before this check"
    assert signal.getsignal(signal.SIGTERM) is not gpu_proof._stop


def test_sigterm_before_the_first_check_exits_2_with_evidence(fleet_context, tmp_path):
    def which(name):
        os.kill(os.getpid(), signal.SIGTERM)

    fleet_context.which = which
    out = tmp_path / "evidence"
    assert gpu_proof.main(["--out", str(out)], ctx=fleet_context) == 2
    document = json.loads((out / "gpu-proof.json").read_text())
    assert [c["id"] for c in document["checks"]] == ["setup"]
    assert document["checks"][0]["error"].startswith("stopped by signal 15")
