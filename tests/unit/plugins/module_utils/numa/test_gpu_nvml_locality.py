"""A GPU whose sysfs numa_node is -1 takes its node from NVML's CPU affinity.

The machine is synthetic-vm-gpu-numa-unknown (a 2-node VM whose firmware gives no _PXM: both
GPUs say numa_node -1; 0000:06:00.0's local_cpulist is every CPU, so sysfs cannot place it).
NVML's nvmlDeviceGetCpuAffinityWithinScope(NODE) is given through the fake NVML (the real
pynvml ctypes return type: c_ulonglong words, bit b of word w = CPU 64*w+b).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import (  # noqa: E402
    Reader,
)

VM = "synthetic-vm-gpu-numa-unknown"
UNKNOWN, KNOWN = "0000:06:00.0", "0000:07:00.0"  # nodes: 0 = CPUs 0-3, 1 = CPUs 4-7


def _fleet(affinity) -> list:
    gpus = make_snapshots.fleet()[VM]
    for item in gpus:
        item.cpu_affinity = affinity
    return gpus


def _facts(tmp_path, state) -> dict:
    root = trees.materialize(VM, tmp_path / VM)
    facts = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
    return facts


def _by_address(facts: dict) -> dict:
    return {entry["address"]: entry for entry in facts["gpus"]}


def test_nvml_affinity_reads_the_bitmask_words():
    nvml = fake.FakeNvml(_fleet((4, 5, 70)))
    record = gpu_nvml.read_nvml(nvml).gpus[UNKNOWN]
    assert record["nvml_cpu_affinity"] == [4, 5, 70]
    assert "nvmlDeviceGetCpuAffinityWithinScope" in nvml.calls


def test_affinity_within_one_node_gives_the_node(tmp_path):
    facts = _facts(tmp_path, gpu_nvml.read_nvml(fake.FakeNvml(_fleet((4, 5, 6, 7)))))
    entry = _by_address(facts)[UNKNOWN]
    assert (entry["numa_node"], entry["node"], entry["node_source"]) == (
        None, 1, "nvml_cpu_affinity")  # fmt: skip
    assert entry["numa_node_raw"] == -1  # what sysfs says, kept
    assert entry["sources"]["node"] == "nvml" and entry["nvml_cpu_affinity"] == [4, 5, 6, 7]
    known = _by_address(facts)[KNOWN]  # sysfs (local_cpulist) already knows: sysfs stays
    assert (known["node"], known["node_source"]) == (1, "local_cpulist")
    assert known["sources"]["node"] == "sysfs"


@pytest.mark.parametrize(
    ("affinity", "why"),
    [
        ((2, 3, 4), "spans nodes 0 and 1"),
        ((9,), "a CPU no node has"),
        (None, "NVML does not answer (NOT_SUPPORTED)"),
    ],
)
def test_affinity_that_fits_no_single_node_leaves_it_unknown(tmp_path, affinity, why):
    facts = _facts(tmp_path, gpu_nvml.read_nvml(fake.FakeNvml(_fleet(affinity))))
    entry = _by_address(facts)[UNKNOWN]
    assert (entry["node"], entry["node_source"]) == (None, None), why
    if affinity is None:
        assert entry["unavailable"]["nvml_cpu_affinity"].startswith(
            "nvmlDeviceGetCpuAffinityWithinScope: "
        )


def test_snapshot_records_the_affinity_and_replays_the_node(tmp_path):
    state = gpu_nvml.read_nvml(fake.FakeNvml(_fleet((4, 5))))
    path = tmp_path / "snapshot.json"
    gpu_snapshot.write_snapshot(str(path), state)
    assert json.loads(path.read_text())["gpus"][0]["nvml_cpu_affinity"] == [4, 5]
    replayed = _by_address(_facts(tmp_path, gpu_snapshot.read_snapshot(str(path))))[UNKNOWN]
    assert (replayed["node"], replayed["node_source"]) == (1, "nvml_cpu_affinity")
    assert replayed["sources"]["node"] == "snapshot"


def test_snapshot_without_the_affinity_key_still_reads(tmp_path):
    data = json.loads((trees.GPU_SNAPSHOT_DIR / f"{VM}.json").read_text())
    for record in data["gpus"]:
        record.pop("nvml_cpu_affinity")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    entry = _by_address(_facts(tmp_path, gpu_snapshot.read_snapshot(str(path))))[UNKNOWN]
    assert entry["nvml_cpu_affinity"] is None and entry["node"] is None


def test_nvidia_smi_says_it_cannot_give_the_affinity():
    xml = (UNIT / "fixtures" / "cmd" / "nvidia-smi" / "h100-sxm-q-x.xml").read_text()
    (record,) = gpu_smi.parse_nvidia_smi_xml(xml).gpus.values()
    assert record["nvml_cpu_affinity"] is None
    assert record["unavailable"]["nvml_cpu_affinity"] == "not reported by nvidia-smi -q"


def test_planner_places_next_to_the_gpu_nvml_located(tmp_path):
    numa = json.loads((trees.SYSFS / f"{VM}.numa.json").read_text())
    facts = json.loads(
        json.dumps(_facts(tmp_path, gpu_nvml.read_nvml(fake.FakeNvml(_fleet((4, 5))))))
    )
    policy = {"reserved_cpus": "", "memory_headroom_pct": 15}
    placements = [
        {"name": "a", "exec": "/bin/a", "cpus": 2, "gpus": [UNKNOWN]},
        {"name": "b", "exec": "/bin/b", "cpus": 1, "near": UNKNOWN},
    ]
    result = plan_host("vm", numa, facts, placements, [], policy)
    a, b = result["placements"]
    assert a["node"] == 1 and set(a["cpus"]) <= {4, 5, 6, 7}
    assert not [w for w in a["warnings"] if "unknown NUMA locality" in w]
    # The PCI facts say unknown for near:; the GPU facts' node anchors it.
    assert b["node"] == 1 and b["near"]["node"] == 1
    # Without NVML's answer the same request has no node to anchor on.
    unknown = json.loads(
        json.dumps(_facts(tmp_path / "x", gpu_nvml.read_nvml(fake.FakeNvml(_fleet(None)))))
    )
    with pytest.raises(PlacementError, match="unknown NUMA locality"):
        plan_host("vm", numa, unknown, placements[1:], [], policy)
