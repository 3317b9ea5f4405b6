"""Replay every GPU proof kit run kept in tests/unit/fixtures/gpu_proof/ (save_fixtures.py).

Each recorded run's raw outputs go through the collection's parsers again: the nvidia-smi XML and
the NVML snapshot must agree field by field (the kit's own comparison), and every profile row of
a successful ``nvidia-smi mig`` listing must parse. A parser change that breaks a real driver's
output fails here. Until a run is recorded the parametrised tests have nothing to replay.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "gpu_snapshots"))

import fake_nvml
import gpu_proof
import make_snapshots
import proof_facts
import pytest
import save_fixtures
from test_kit_facts import H100, FakeSmi, section, smi_xml, which

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    facts as numa_facts,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    gpu,
    gpu_smi,
    gpu_snapshot,
    mig_smi,
    planner,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

RECORDED = sorted(path for path in save_fixtures.FIXTURES.glob("*") if path.is_dir())
LISTING = re.compile(r"^\$ (?P<argv>.*)\n# exit status (?P<rc>\d+)\n", re.MULTILINE)


def replay_xml(run: Path) -> None:
    """The recorded XML, parsed again, agrees with the recorded NVML snapshot in every field."""
    smi = gpu_smi.parse_nvidia_smi_xml((run / "nvidia-smi-q-x.xml").read_text())
    nvml = gpu_snapshot.read_snapshot(str(run / "nvml-snapshot.json"))
    differences = [(name, seen) for name, ok, seen in proof_facts.agreement(nvml, smi) if not ok]
    assert differences == []
    for address, record in smi.gpus.items():
        missing = sorted(set(proof_facts.REQUIRED) & set(record["unavailable"]))
        assert missing == [], address


def replay_listings(run: Path) -> int:
    """Every successful recorded -lgip/-lgipp listing parses row for row; how many there were."""
    text = (run / "nvidia-smi-mig.txt").read_text()
    marks = list(LISTING.finditer(text))
    replayed = 0
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
        output = text[mark.end() : end].split("# stderr:\n", 1)[0]
        if mark["rc"] != "0":
            continue
        if mark["argv"].endswith("-lgip"):
            rows, like = mig_smi.parse_lgip(output), proof_facts.LGIP_LIKE
        else:
            rows, like = list(mig_smi.parse_lgipp(output)), proof_facts.LGIPP_LIKE
        seen = [line for line in output.splitlines() if like.match(line.strip())]
        assert len(rows) == len(seen), mark["argv"]
        replayed += 1
    return replayed


@pytest.mark.parametrize("run", RECORDED, ids=[path.name for path in RECORDED])
def test_recorded_xml_agrees_with_the_recorded_nvml_snapshot(run: Path):
    replay_xml(run)


@pytest.mark.parametrize("run", RECORDED, ids=[path.name for path in RECORDED])
def test_recorded_mig_listings_parse(run: Path):
    replay_listings(run)


def test_a_kit_run_is_kept_and_replayed(fixture_root, kit_context, tmp_path, monkeypatch):
    """A run over the fake NVML and the recorded A30 listing, kept and replayed end to end."""
    root = Path(fixture_root(H100))
    gpus = make_snapshots.fleet()[H100]
    listing = "a30-mig-lgip-lgipp-lgi.txt"
    runner = FakeSmi(
        smi_xml(gpus),
        (0, section(listing, "nvidia-smi mig -lgip"), ""),
        (0, section(listing, "nvidia-smi mig -lgipp"), ""),
    )
    ctx = kit_context(
        nvml=fake_nvml.FakeNvml(gpus),
        sysfs_root=str(root / "sys"),
        procfs_root=str(root / "proc"),
        runner=runner,
        which=which,
    )
    evidence = tmp_path / "evidence"
    assert gpu_proof.main(["--out", str(evidence)], ctx=ctx, checks=gpu_proof.all_checks()[:3]) == 0
    monkeypatch.setattr(save_fixtures, "FIXTURES", tmp_path / "fixtures")
    assert save_fixtures.main(["save_fixtures.py", str(evidence)]) == 0
    kept = tmp_path / "fixtures" / "h100-80gb-hbm3-560.35.03"
    assert sorted(path.name for path in kept.iterdir()) == [
        "gpu-proof.json",
        "gpu-proof.md",
        "nvidia-smi-mig.txt",
        "nvidia-smi-q-x.xml",
        "nvml-snapshot.json",
    ]
    replay_xml(kept)
    assert replay_listings(kept) == 2 * len(gpus)


def test_save_fixtures_keeps_a_run_once(tmp_path, monkeypatch):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    document = {
        "gpus": ["0000:1b:00.0 NVIDIA H200"],
        "driver_version": "580.159.04",
        "started": "2026-12-04T10:00:00+00:00",
        "kit_version": gpu_proof.KIT_VERSION,
        "status": "pass",
        "counts": "5 pass",
        "host": {"kernel": "6.1", "python": "3.12", "numa_nodes": ["node0"]},
    }
    (evidence / "gpu-proof.json").write_text(json.dumps(document))
    (evidence / "nvidia-smi-q-x.xml").write_text("<nvidia_smi_log/>")
    (evidence / "unrelated.log").write_text("not kept")
    monkeypatch.setattr(save_fixtures, "FIXTURES", tmp_path / "fixtures")
    assert save_fixtures.main(["save_fixtures.py", str(evidence)]) == 0
    kept = tmp_path / "fixtures" / "h200-580.159.04"
    assert sorted(path.name for path in kept.iterdir()) == ["gpu-proof.json", "nvidia-smi-q-x.xml"]
    provenance = (tmp_path / "fixtures" / "PROVENANCE.md").read_text()
    assert (
        "| `h200-580.159.04/` | 2026-12-04T10:00:00+00:00 | 0000:1b:00.0 NVIDIA H200 |"
        in provenance
    )
    assert save_fixtures.main(["save_fixtures.py", str(evidence)]) == 1


def test_save_fixtures_refuses_a_run_without_a_driver(tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (evidence / "gpu-proof.json").write_text(json.dumps({"driver_version": None}))
    assert save_fixtures.main(["save_fixtures.py", str(evidence)]) == 1


@pytest.mark.parametrize("run", RECORDED, ids=[path.name for path in RECORDED])
def test_planner_plans_a_mig_layout_from_the_recorded_profiles(run: Path):
    """The GPU instance profiles a real driver listed (while MIG was disabled, on the H200 run)
    are enough for the planner to check and place a declared layout in the same run."""
    state = gpu_snapshot.read_snapshot(str(run / "nvml-snapshot.json"))
    address, record = next(iter(state.gpus.items()))
    profiles = record["mig"]["supported_profiles"]
    if profiles is None:
        pytest.skip(f"{run.name}: the driver listed no profile ({record['mig']['mode_current']})")
    seen = gpu.SysfsGpu(address, "nvidia", "0x10de", None, None, None, None, None, None, None, None)
    entries, dummy = gpu.merge([seen], state)
    facts = {"gpus": entries, "warnings": []}
    three = next(p for p in profiles if p["slice_count"] == 3 and p["max_count"] >= 2)
    layout = [three["name"], three["name"]]
    numa = numa_facts.read_numa_facts(Reader("/sys", "/proc"))
    plan = planner.plan_host(
        "recorded",
        numa,
        facts,
        [],
        [],
        {},
        mig_gpus=[{"gpu": address, "mode": "enabled", "layout": layout}],
    )
    (planned,) = plan["mig_gpus"]
    assert [slot["profile"] for slot in planned["layout"]] == layout
    starts = {spot["start"] for spot in three["placements"]}
    assert {slot["start"] for slot in planned["layout"]} <= starts
    assert len({slot["start"] for slot in planned["layout"]}) == 2
