"""GPU proof kit AMD section (proof_amd) over the synthetic MI300X tree and a non-AMD tree.

The check and the facts reader run unchanged; ``rocminfo`` is a runner answering with agents
whose UUIDs are taken straight from the tree's KFD unique_id files (not from our reader), so a
reader that lost, merged or misnamed a logical GPU fails the comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

import gpu_proof
import proof_amd
from kit_helpers import items

MI300X = "synthetic-mi300x-cpx"
A100 = "synthetic-2x6338-4xa100"


def kfd_uuids(root: Path) -> list:
    """GPU-<16 hex> of every KFD node's unique_id with a gpu_id, node order."""
    nodes = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    found = []
    for node in sorted(nodes.iterdir(), key=lambda path: int(path.name)):
        if (node / "gpu_id").read_text().strip() == "0":
            continue
        props = dict(line.split() for line in (node / "properties").read_text().splitlines())
        found.append(f"GPU-{int(props['unique_id']):016x}")
    return found


def rocminfo_text(uuids: list) -> str:
    agents = ["  Name:                    AMD EPYC 9474F\n  Uuid:                    CPU-XX\n"]
    agents += [
        f"  Name:                    gfx942\n  Uuid:                    {u}\n" for u in uuids
    ]
    return "".join(f"Agent {i + 1}\n{text}" for i, text in enumerate(agents))


def context(kit_context, root: Path, uuids=None):
    def which(name):
        return f"/usr/bin/{name}" if name == "rocminfo" and uuids is not None else None

    def runner(argv, stdin, env, timeout):
        assert argv == ["/usr/bin/rocminfo"]
        return 0, rocminfo_text(uuids), ""

    return kit_context(
        sysfs_root=str(root / "sys"), procfs_root=str(root / "proc"), which=which, runner=runner
    )


def test_mi300x_facts_match_rocminfo(fixture_root, kit_context):
    root = Path(fixture_root(MI300X))
    uuids = kfd_uuids(root)
    assert len(uuids) == 2 * 1 + 6 * 8
    ctx = context(kit_context, root, uuids)
    check = gpu_proof.Check("amd_facts", "AMD")
    proof_amd.check_amd_facts(ctx, check)
    found = items(check)
    assert found["rocminfo lists the same GPU UUIDs"].status == gpu_proof.PASS
    assert found["GPU UUIDs are distinct"].status == gpu_proof.PASS
    assert found["GPU UUIDs are distinct"].observed == 8
    assert found["every logical GPU has a render node"].status == gpu_proof.PASS
    assert len(set(uuids)) == 8  # the driver's: each GPU's logical GPUs share its unique_id
    assert found["0000:43:00.0: logical GPUs of CPX"].status == gpu_proof.PASS
    assert found["0000:03:00.0: logical GPUs of SPX"].observed == 1
    assert check.status == gpu_proof.PASS  # amdsmi missing here: that item is skipped
    facts = json.loads((ctx.out / "amd-facts.json").read_text())
    assert [g["vendor"] for g in facts["gpus"]] == ["amd"] * 8


def test_a_logical_gpu_rocminfo_does_not_list_fails(fixture_root, kit_context):
    root = Path(fixture_root(MI300X))
    uuids = kfd_uuids(root)
    ctx = context(kit_context, root, uuids[:-1] + ["GPU-00000000deadbeef"])
    check = gpu_proof.Check("amd_facts", "AMD")
    proof_amd.check_amd_facts(ctx, check)
    assert items(check)["rocminfo lists the same GPU UUIDs"].status == gpu_proof.FAIL
    assert check.status == gpu_proof.FAIL


def test_compare_flags_a_wrong_logical_gpu_count_a_repeated_gpu_uuid_and_no_render_node():
    def entry(bus, logical):
        return {
            "address": f"0000:{bus}:00.0",
            "vendor": "amd",
            "node": 0,
            "amd": {
                "uuid": "GPU-1",
                "compute_partition": {"current": "QPX"},
                "xcd_count": 8,
                "logical_gpus": logical,
            },
        }

    shared = [{"index": 0, "uuid": "GPU-1", "render_minor": 128}, {"index": 1, "uuid": "GPU-1"}]
    gpus = [entry("43", shared), entry("63", shared[:1])]
    found = {name: ok for name, ok, *rest in proof_amd.compare({"gpus": gpus}, None)}
    assert found["0000:43:00.0: logical GPUs of QPX"] is False
    assert found["GPU UUIDs are distinct"] is False
    assert found["every logical GPU has a render node"] is False
    # logical GPUs of one GPU sharing its UUID is what the driver does: no item fails for it
    gpus[1]["amd"]["uuid"] = "GPU-2"
    shared[1]["render_minor"] = 129
    found = {name: ok for name, ok, *rest in proof_amd.compare({"gpus": gpus[:1]}, None)}
    assert found["GPU UUIDs are distinct"] is True
    assert found["every logical GPU has a render node"] is True
    assert "rocminfo lists the same GPU UUIDs" not in found


def test_skipped_without_an_amd_gpu_even_without_an_nvidia_driver(fixture_root, kit_context):
    root = Path(fixture_root(A100))
    ctx = context(kit_context, root)
    ctx.driver = "no NVIDIA driver"
    ran = []
    checks = [("amd_facts", "AMD", proof_amd.check_amd_facts)]
    checks.append(("nvml_facts", "NVIDIA", lambda c, k: ran.append(k)))
    (amd, nvidia) = gpu_proof.run_checks(ctx, checks, lambda results: None)
    assert amd.status == gpu_proof.SKIPPED and "no AMD GPU" in amd.skipped
    assert nvidia.skipped == "no NVIDIA driver" and ran == []
