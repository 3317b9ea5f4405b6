"""numa_facts through main(): facts, check mode, and bad input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pynvml
import pytest

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "sysfs")


def args(root):
    return {"sysfs_root": os.path.join(root, "sys"), "procfs_root": os.path.join(root, "proc")}


@pytest.mark.parametrize("check_mode", [False, True])
def test_facts_of_a_recorded_kernel(run_module, fixture_root, check_mode):
    root = fixture_root("qemu-2node-pxb")
    result = run_module("numa_facts", args(root), check_mode=check_mode)
    assert result["failed"] is False and result["changed"] is False
    numa = result["ansible_facts"]["numa"]
    assert [n["cpus"] for n in numa["nodes"]] == [[0, 1], [2, 3]]
    assert [n["hugepages"][0]["total"] for n in numa["nodes"]] == [16, 48]
    assert list(result["ansible_facts"]) == ["numa"]  # exactly one top-level fact


def test_module_output_equals_the_golden_facts(run_module, fixture_root):
    root = fixture_root("synthetic-8xh100-2s")
    numa = run_module("numa_facts", args(root))["ansible_facts"]["numa"]
    with open(os.path.join(GOLDEN, "synthetic-8xh100-2s.numa.json"), encoding="utf-8") as handle:
        golden = json.load(handle)
    text = json.dumps(numa).replace(root, "${root}")
    assert json.loads(text) == golden


def test_running_twice_gives_the_same_facts(run_module, fixture_root):
    root = fixture_root("synthetic-epyc-nps4")
    first = run_module("numa_facts", args(root))
    second = run_module("numa_facts", args(root))
    assert first["ansible_facts"] == second["ansible_facts"]


@pytest.mark.parametrize("where", ["nothing", "empty", "file"])
def test_a_root_that_is_not_sysfs_fails_naming_the_option_and_the_fix(run_module, tmp_path, where):
    (tmp_path / "empty" / "sys").mkdir(parents=True)
    (tmp_path / "file").mkdir()
    (tmp_path / "file" / "sys").write_text("not a directory")
    result = run_module("numa_facts", args(str(tmp_path / where)))
    assert result["failed"] is True
    assert f"sysfs_root='{tmp_path / where / 'sys'}'" in result["msg"]
    assert "Point sysfs_root at the host's /sys" in result["msg"]
    assert "Traceback" not in result["msg"]


def test_a_procfs_root_that_is_missing_fails(run_module, fixture_root, tmp_path):
    root = fixture_root("2arm-2c")
    result = run_module(
        "numa_facts", {"sysfs_root": f"{root}/sys", "procfs_root": str(tmp_path / "nope")}
    )
    assert result["failed"] is True
    assert "procfs_root=" in result["msg"] and "/proc" in result["msg"]


def test_unknown_option_is_rejected_by_name(run_module):
    result = run_module("numa_facts", {"sysfs": "/sys"})
    assert result["failed"] is True
    assert "sysfs" in result["msg"] and "Unsupported parameters" in result["msg"]


# ---------------------------------------------------------------------------------------------
# gpu: true publishes exactly what gpu_topology_facts publishes, in the same module execution

UNIT = Path(__file__).resolve().parents[2]
for _extra in (UNIT, UNIT / "fixtures", UNIT / "fixtures" / "gpu_snapshots"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import fake_nvml as fake  # noqa: E402
import make_snapshots  # noqa: E402
import trees  # noqa: E402

SNAPSHOTS = UNIT / "fixtures" / "gpu_snapshots"
# (machine, snapshot of trees.GPU_SNAPSHOT_DIR or None): NVIDIA, AMD, GPU-less and odd trees.
GPU_CASES = [
    ("synthetic-2x6338-4xa100", None),
    ("synthetic-2x6338-4xa100", "synthetic-2x6338-4xa100"),
    ("synthetic-8xh100-2s", "synthetic-8xh100-2s"),
    ("synthetic-gh200", "synthetic-gh200"),
    ("synthetic-vm-gpu-numa-unknown", None),
    ("synthetic-vm-gpu-numa-unknown", "synthetic-vm-gpu-numa-unknown"),
    ("synthetic-mi300x-cpx", None),
    ("synthetic-epyc-nps4", "synthetic-2x6338-4xa100"),  # a snapshot of other GPUs: warnings
    ("nvidiagpunumanodes", None),
    ("qemu-2node-pxb", None),
]


def both(run_module, root, extra=None, gpu_extra=None, check_mode=False):
    """(numa_facts with gpu: true, gpu_topology_facts) results for the same host and options."""
    gpu_extra = dict(gpu_extra or {})
    numa_args = dict(args(root), gpu=True, **(extra or {}))
    for key in ("snapshot", "snapshot_out"):
        if key in gpu_extra:
            numa_args[f"gpu_{key}"] = gpu_extra[key]
    for key in ("nvidia_smi", "nvidia_smi_timeout"):
        if key in gpu_extra:
            numa_args[key] = gpu_extra[key]
    ours = run_module("numa_facts", numa_args, check_mode=check_mode)
    theirs = run_module("gpu_topology_facts", dict(args(root), **gpu_extra), check_mode=check_mode)
    return ours, theirs


@pytest.mark.parametrize(("machine", "snapshot"), GPU_CASES)
def test_gpu_true_publishes_what_gpu_topology_facts_publishes(
    run_module, fixture_root, machine, snapshot
):
    root = fixture_root(machine)
    gpu_extra = {"snapshot": str(SNAPSHOTS / f"{snapshot}.json")} if snapshot else {}
    ours, theirs = both(run_module, root, gpu_extra=gpu_extra)
    assert ours["failed"] is False and ours["changed"] is False
    assert list(ours["ansible_facts"]) == ["numa", "gpu_topology"]
    assert ours["ansible_facts"]["gpu_topology"] == theirs["ansible_facts"]["gpu_topology"]
    # The NUMA facts do not change when the GPUs are gathered with them.
    alone = run_module("numa_facts", args(root))
    assert ours["ansible_facts"]["numa"] == alone["ansible_facts"]["numa"]
    assert ours["gpu_snapshot_written"] is False and theirs["snapshot_written"] is False


def test_gpu_true_equals_gpu_topology_facts_with_a_warning_in_each_pass(run_module, tmp_path):
    # A broken numa_node of a GPU and an unreadable node meminfo: each module reports only the
    # warnings of the files its own facts use, as gpu_topology_facts does.
    root = trees.materialize("synthetic-2x6338-4xa100", tmp_path / "host")
    numa_node = f"{root}/sys/bus/pci/devices/0000:17:00.0/numa_node"
    Path(os.path.realpath(numa_node)).write_text("zero\n")
    (Path(root) / "sys/devices/system/node/node1/meminfo").write_text("garbage\n")
    ours, theirs = both(run_module, root, gpu_extra={"nvidia_smi": "never"})
    gpu_facts = ours["ansible_facts"]["gpu_topology"]
    assert gpu_facts == theirs["ansible_facts"]["gpu_topology"]
    assert [w["path"] for w in gpu_facts["warnings"]] == [numa_node]
    numa_paths = [w["path"] for w in ours["ansible_facts"]["numa"]["warnings"]]
    assert numa_node in numa_paths
    assert f"{root}/sys/devices/system/node/node1/meminfo" in numa_paths


@pytest.mark.parametrize("machine", ["synthetic-2x6338-4xa100", "synthetic-8xh100-2s"])
def test_gpu_true_equals_gpu_topology_facts_through_nvml(
    run_module, fixture_root, monkeypatch, machine
):
    nvml = fake.FakeNvml(make_snapshots.fleet()[machine], driver_version=make_snapshots.DRIVER)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    ours, theirs = both(run_module, fixture_root(machine))
    facts = ours["ansible_facts"]["gpu_topology"]
    assert facts == theirs["ansible_facts"]["gpu_topology"]
    assert facts["nvml"]["available"] is True
    assert all(g["sources"]["uuid"] == "nvml" for g in facts["gpus"])


def test_gpu_true_without_nvml_library_reports_what_nvmlinit_says(
    run_module, fixture_root, monkeypatch
):
    expected = None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        expected = f"nvmlInit failed: {exc}"
    if expected is None:
        pynvml.nvmlShutdown()
        pytest.skip("NVML answers here: this is a GPU host")
    root = fixture_root("synthetic-gh200")
    theirs = run_module("gpu_topology_facts", dict(args(root), nvidia_smi="never"))
    # As on a managed host: pynvml not imported yet. Without libnvidia-ml it is not imported.
    monkeypatch.delitem(sys.modules, "pynvml")
    ours = run_module("numa_facts", dict(args(root), gpu=True, nvidia_smi="never"))
    assert "pynvml" not in sys.modules
    assert ours["ansible_facts"]["gpu_topology"]["nvml"]["reason"] == expected
    assert ours["ansible_facts"]["gpu_topology"] == theirs["ansible_facts"]["gpu_topology"]


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_gpu_true_equals_gpu_topology_facts_through_nvidia_smi(
    run_module, fixture_root, fake_nvidia_smi, mode
):
    ours, theirs = both(
        run_module, fixture_root("synthetic-8xh100-2s"), gpu_extra={"nvidia_smi": mode}
    )
    facts = ours["ansible_facts"]["gpu_topology"]
    assert facts == theirs["ansible_facts"]["gpu_topology"]
    if mode == "always" or not facts["nvml"]["available"]:
        assert facts["nvidia_smi"]["used"] is True


def test_gpu_snapshot_out_writes_what_snapshot_out_writes(run_module, fixture_root, tmp_path):
    snapshot = str(SNAPSHOTS / "synthetic-2x6338-4xa100.json")
    ours_out, theirs_out = tmp_path / "ours.json", tmp_path / "theirs.json"
    root = fixture_root("synthetic-2x6338-4xa100")
    ours = run_module(
        "numa_facts",
        dict(args(root), gpu=True, gpu_snapshot=snapshot, gpu_snapshot_out=str(ours_out)),
    )
    theirs = run_module(
        "gpu_topology_facts", dict(args(root), snapshot=snapshot, snapshot_out=str(theirs_out))
    )
    assert ours["gpu_snapshot_written"] is True and ours["changed"] is False
    assert theirs["snapshot_written"] is True
    assert ours_out.read_bytes() == theirs_out.read_bytes()
    assert ours["ansible_facts"]["gpu_topology"] == theirs["ansible_facts"]["gpu_topology"]


def test_check_mode_writes_no_gpu_snapshot(run_module, fixture_root, tmp_path):
    out = tmp_path / "out.json"
    snapshot = str(SNAPSHOTS / "synthetic-2x6338-4xa100.json")
    result = run_module(
        "numa_facts",
        dict(
            args(fixture_root("synthetic-2x6338-4xa100")),
            gpu=True,
            gpu_snapshot=snapshot,
            gpu_snapshot_out=str(out),
        ),  # fmt: skip
        check_mode=True,
    )
    assert result["failed"] is False and result["gpu_snapshot_written"] is False
    assert not out.exists()


def test_gpu_options_are_ignored_without_gpu(run_module, fixture_root, tmp_path):
    out = tmp_path / "out.json"
    result = run_module(
        "numa_facts",
        dict(
            args(fixture_root("qemu-2node-pxb")),
            gpu_snapshot=str(tmp_path / "missing.json"),
            gpu_snapshot_out=str(out),
            nvidia_smi_timeout=0,
        ),  # fmt: skip
    )
    assert result["failed"] is False and list(result["ansible_facts"]) == ["numa"]
    assert result["gpu_snapshot_written"] is False and not out.exists()


@pytest.mark.parametrize(
    "gpu_extra",
    [
        {"snapshot": "MISSING"},
        {"nvidia_smi_timeout": 0},
        {"snapshot": str(SNAPSHOTS / "synthetic-gh200.json"), "snapshot_out": "DIR/x.json"},
    ],
)
def test_gpu_errors_are_those_of_gpu_topology_facts(run_module, fixture_root, tmp_path, gpu_extra):
    gpu_extra = {
        key: value.replace("MISSING", str(tmp_path / "nope.json")).replace(
            "DIR", str(tmp_path / "no")
        )
        if isinstance(value, str)
        else value
        for key, value in gpu_extra.items()
    }
    ours, theirs = both(run_module, fixture_root("synthetic-gh200"), gpu_extra=gpu_extra)
    assert ours["failed"] is True and theirs["failed"] is True
    assert ours["msg"] == theirs["msg"]
    assert "Traceback" not in ours["msg"]


# ---------------------------------------------------------------------------------------------
# state_paths


def test_state_paths_lists_those_that_exist_in_the_given_order(run_module, fixture_root, tmp_path):
    (tmp_path / "mps-units.json").write_text("{}")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "adir").mkdir()
    wanted = [
        str(tmp_path / "mps-units.json"),
        str(tmp_path / "mig.json"),  # absent
        str(tmp_path / "dangling"),  # a link to nothing still counts: something is there
        str(tmp_path / "adir"),
        str(tmp_path / "a" / "b"),
    ]
    result = run_module("numa_facts", dict(args(fixture_root("2arm-2c")), state_paths=wanted))
    assert result["failed"] is False and result["changed"] is False
    assert list(result["ansible_facts"]) == ["numa", "numafleet_state_paths"]
    assert result["ansible_facts"]["numafleet_state_paths"] == [wanted[0], wanted[2], wanted[3]]


def test_state_paths_none_existing_is_an_empty_list(run_module, fixture_root, tmp_path):
    result = run_module(
        "numa_facts", dict(args(fixture_root("2arm-2c")), state_paths=[str(tmp_path / "x")])
    )
    assert result["ansible_facts"]["numafleet_state_paths"] == []


@pytest.mark.parametrize("bad", ["etc/numafleet/mig.json", "", "./mig.json"])
def test_a_relative_state_path_fails_naming_the_option(run_module, fixture_root, bad):
    result = run_module(
        "numa_facts", dict(args(fixture_root("2arm-2c")), state_paths=["/etc/passwd", bad])
    )
    assert result["failed"] is True
    assert result["msg"] == (
        f"state_paths[1]: {bad!r} is not an absolute path; list each state file from / on the "
        "host, for example /etc/numafleet/mig.json"
    )


def test_one_execution_gathers_numa_gpus_and_state_paths(run_module, fixture_root, tmp_path):
    (tmp_path / "mig.json").write_text("{}")
    root = fixture_root("synthetic-vm-gpu-numa-unknown")
    snapshot = str(SNAPSHOTS / "synthetic-vm-gpu-numa-unknown.json")
    state_paths = [str(tmp_path / "mig.json"), str(tmp_path / "mps-units.json")]
    result = run_module(
        "numa_facts",
        dict(args(root), gpu=True, gpu_snapshot=snapshot, state_paths=state_paths),
        check_mode=True,
    )
    facts = result["ansible_facts"]
    assert list(facts) == ["numa", "gpu_topology", "numafleet_state_paths"]
    assert [g["node"] for g in facts["gpu_topology"]["gpus"]] == [None, 1]
    assert facts["numafleet_state_paths"] == [str(tmp_path / "mig.json")]
