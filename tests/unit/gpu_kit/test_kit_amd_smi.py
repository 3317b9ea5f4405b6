"""GPU proof kit AMD section: amd-smi's view against the facts, on recorded amd-smi outputs.

The amd-smi side is always a published output (tests/unit/fixtures/amd/PROVENANCE.md): the
`amd-smi static` of a 4x MI300A host in SPX/NPS1 and the recorded process listing. The facts
side is what our reader would report for that host (addresses, modes and nodes as amd-smi
printed them), changed where a test needs a disagreement.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gpu_proof
import proof_amd
from amd_fixtures import amd_output
from kit_helpers import items

STATIC = amd_output("amd-smi-static-4x-mi300a-spx-nps1.txt")
PROCESS = amd_output("amd-smi-process-rocm6.2.json")
ADDRESSES = ["0000:01:00.0", "0001:01:00.0", "0002:01:00.0", "0003:01:00.0"]
MI300X = "synthetic-mi300x-cpx"


def mi300a_facts() -> dict:
    """gpu_topology facts of the 4x MI300A host amd-smi describes (one SPX/NPS1 GPU per node)."""
    gpus = []
    for node, address in enumerate(ADDRESSES):
        gpus.append(
            {
                "address": address,
                "vendor": "amd",
                "node": node,
                "amd": {
                    "compute_partition": {"current": "SPX", "available": ["SPX", "TPX", "CPX"]},
                    "memory_partition": {"current": "NPS1", "available": ["NPS1"]},
                    "xcd_count": 6,
                    "logical_gpus": [
                        {"index": 0, "uuid": f"GPU-{node + 1:016x}", "kfd_node": 2 + node}
                    ],
                },
            }
        )
    return {"gpus": gpus}


def findings(facts, outputs) -> dict:
    return {
        name: (ok, observed, expected)
        for name, ok, observed, expected in proof_amd.compare_amd_smi(facts, outputs)
    }


def test_the_facts_of_the_host_agree_with_its_amd_smi_static():
    found = findings(mi300a_facts(), {"static": STATIC, "process": PROCESS})
    assert found["amd-smi output parses"][0] is True
    for address, node in zip(ADDRESSES, range(4), strict=True):
        assert found[f"{address}: amd-smi lists it"][0] is True
        assert found[f"{address}: compute_partition (amd-smi)"] == (True, "SPX", "SPX")
        assert found[f"{address}: memory_partition (amd-smi)"] == (True, "NPS1", "NPS1")
        assert found[f"{address}: logical GPUs (amd-smi)"] == (True, 1, 1)
        assert found[f"{address}: NUMA node (amd-smi)"] == (True, node, node)
        # amd-smi static gives no UUID or KFD node: those comparisons are skipped, not passed
        assert found[f"{address}: logical GPU uuids (amd-smi)"][0] is None
        assert found[f"{address}: logical GPU kfd_nodes (amd-smi)"][0] is None
    assert found["amd-smi shows no GPU the facts lack"] == (True, [], [])


def test_disagreements_fail_with_both_values():
    facts = mi300a_facts()
    facts["gpus"][1]["node"] = 0  # our reader put GPU 1 on the wrong node
    facts["gpus"][2]["amd"]["memory_partition"]["current"] = "NPS4"
    facts["gpus"][3]["amd"]["logical_gpus"].append({"index": 1, "uuid": "GPU-2"})
    del facts["gpus"][0]
    found = findings(facts, {"static": STATIC})
    assert found["0001:01:00.0: NUMA node (amd-smi)"] == (False, 0, 1)
    assert found["0002:01:00.0: memory_partition (amd-smi)"] == (False, "NPS4", "NPS1")
    assert found["0003:01:00.0: logical GPUs (amd-smi)"] == (False, 2, 1)
    assert found["amd-smi shows no GPU the facts lack"] == (False, ["0000:01:00.0"], [])


def test_a_gpu_amd_smi_does_not_list_fails():
    facts = mi300a_facts()
    extra = copy.deepcopy(facts["gpus"][0])
    extra["address"] = "0000:c1:00.0"
    facts["gpus"].append(extra)
    found = findings(facts, {"static": STATIC})
    assert found["0000:c1:00.0: amd-smi lists it"][0] is False
    assert "0000:c1:00.0: compute_partition (amd-smi)" not in found


def test_unusable_or_missing_amd_smi_output():
    assert proof_amd.compare_amd_smi(mi300a_facts(), None) == []
    found = findings(mi300a_facts(), {"partition": "{}"})
    assert found["amd-smi static ran"] == (False, ["partition"], "amd-smi static --json output")
    found = findings(mi300a_facts(), {"static": "Traceback (most recent call last):"})
    ok, observed, expected = found["amd-smi output parses"]
    assert ok is False and observed.startswith("amd-smi static --json: output shows no")


def test_check_runs_every_amd_smi_query_and_keeps_the_answers(fixture_root, kit_context):
    """On the synthetic MI300X tree with an amd-smi that answers with the MI300A recording: the
    check runs, keeps every answer as evidence, falls back from ``list -e`` and fails because
    amd-smi describes other GPUs than the tree."""
    root = Path(fixture_root(MI300X))
    calls = []

    def which(name):
        return "/opt/rocm/bin/amd-smi" if name == "amd-smi" else None

    def runner(argv, stdin, env, timeout):
        calls.append(argv[1:])
        if argv[1:] == ["static", "--json"]:
            return 0, STATIC, ""
        if argv[1:] == ["process", "--json"]:
            return 0, PROCESS, ""
        if argv[1:] == ["list", "-e", "--json"]:
            return 2, "", "amd-smi list: error: unrecognized arguments: -e\n"
        return 2, "", f"amd-smi: error: invalid choice: {argv[1]!r}\n"

    ctx = kit_context(
        sysfs_root=str(root / "sys"), procfs_root=str(root / "proc"), which=which, runner=runner
    )
    check = gpu_proof.Check("amd_facts", "AMD")
    proof_amd.check_amd_facts(ctx, check)
    assert calls == [
        ["static", "--json"],
        ["partition", "--json"],
        ["list", "-e", "--json"],
        ["list", "--json"],
        ["process", "--json"],
    ]
    for name in ("static", "partition", "list", "list-e", "process"):
        assert (ctx.out / f"amd-smi-{name}.json").exists()
    assert (ctx.out / "amd-smi-static.json").read_text() == STATIC
    assert (ctx.out / "amd-smi-partition.json").read_text().startswith("rc=2\n")
    found = items(check)
    assert found["amd-smi output parses"].status == gpu_proof.PASS
    assert found["0000:43:00.0: amd-smi lists it"].status == gpu_proof.FAIL
    assert found["amd-smi shows no GPU the facts lack"].status == gpu_proof.FAIL
    assert check.status == gpu_proof.FAIL
    facts = json.loads((ctx.out / "amd-facts.json").read_text())
    assert len([g for g in facts["gpus"] if g["vendor"] == "amd"]) == 8
