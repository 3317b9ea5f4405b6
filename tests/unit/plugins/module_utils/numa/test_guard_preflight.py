"""guard_preflight.py: the unit's preflight checks on recorded and synthetic trees, and the
command's lines and exit status (enforce, warn, usage and config errors)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import field_cases
import guard_trees
import pytest
import trees

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    gpu,
    gpu_snapshot,
    guard,
    guard_preflight,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import GuardError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import plan_host
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

FIXTURES = Path(__file__).parents[3] / "fixtures"
L4_INFORMATION = FIXTURES / "nvidia_proc" / "information-l4.txt"
L4_UUID = "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689"
A100 = "synthetic-2x6338-4xa100"
# The A100 tree's GPUs (make_synthetic.py): 17 and 31 on node 0, b1 and ca on node 1.
A100_GPUS = {
    "0000:17:00.0": ("NVIDIA A100 80GB PCIe", "GPU-0f6c4b1e-8c1d-4a55-9a0e-1b2c3d4e5f60", 0),
    "0000:b1:00.0": ("NVIDIA A100 80GB PCIe", "GPU-2a6c4b1e-8c1d-4a55-9a0e-1b2c3d4e5f61", 1),
}


def _config(*entries, **settings) -> dict:
    base = {
        "warn_pct": 80,
        "act_pct": 90,
        "act": "reclaim",
        "interval_s": 15,
        "preflight": "warn",
        "textfile": None,
        "state_file": "/run/numafleet-guard/state.json",
    }
    base.update(settings)
    return {"version": 1, "host": "gpu-a100-01", "settings": base, "placements": list(entries)}


def _entry(name="train", **keys) -> dict:
    entry = {"name": name, "unit": f"numafleet-{name}.service", "slice": "numafleet.slice"}
    entry.update(keys)
    return entry


def _check(root: str, entry: dict, affinity=None, settings=None) -> list:
    return guard_preflight.check(
        entry,
        settings or {"act_pct": 90},
        guard.read_path,
        affinity,
        sysfs_root=f"{root}/sys",
        procfs_root=f"{root}/proc",
    )


def _run(root: str, argv: list, config, affinity=frozenset(range(256)), read=None):
    lines: list = []
    status = guard_preflight.main(
        argv,
        config,
        read=read,
        affinity=set(affinity),
        out=lines.append,
        sysfs_root=f"{root}/sys",
        procfs_root=f"{root}/proc",
    )
    return status, lines


def _pairs(results) -> list:
    return [(r.name, r.status) for r in results]


# --- gpu ----------------------------------------------------------------------------------------


def test_gpu_on_its_planned_node_in_the_real_guest(fixture_root):
    """qemu-2node-pxb (a real 6.1 kernel): the display device 0000:81:00.0 is on node 1."""
    root = fixture_root("qemu-2node-pxb")
    results = _check(root, _entry(gpus=[{"address": "0000:81:00.0", "uuid": None, "node": 1}]))
    assert results[0] == guard_preflight.CheckResult(
        "gpu", "ok", "0000:81:00.0 is on NUMA node 1 as planned"
    )


def test_gpu_on_another_node_fails_with_the_contract_line(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    status, lines = _run(
        root,
        ["--mode", "enforce", "train"],
        _config(_entry(gpus=[{"address": "0000:81:00.0", "uuid": None, "node": 0}])),
    )
    assert status == 1
    assert lines[0] == (
        "numafleet-guard preflight train: FAIL gpu 0000:81:00.0 is on NUMA node 1, planned "
        "node 0; gather facts again and run site.yml (the plan is older than this hardware state)"
    )
    assert lines[-1].startswith("numafleet-guard preflight train: 1 failed (")
    assert "enforce mode: the unit does not start" in lines[-1]


def test_a_gpu_gone_from_the_bus_fails_naming_the_path(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    results = _check(root, _entry(gpus=[{"address": "0000:82:00.0", "uuid": None, "node": 1}]))
    assert _pairs(results) == [("gpu", "fail")]
    assert f"0000:82:00.0 is not on this host ({root}/sys/bus/pci/devices/0000:82:00.0" in (
        results[0].message
    )


def test_numa_node_minus_one_is_a_skip_not_a_failure(fixture_root):
    """40intel64 (hwloc dump of a real host): its PCI devices show numa_node -1, except one on 2."""
    root = fixture_root("40intel64-2g2n4c+pcilocality")
    results = _check(
        root,
        _entry(
            gpus=[
                {"address": "0000:00:03.0", "uuid": None, "node": 0},
                {"address": "0000:43:00.0", "uuid": None, "node": 2},
            ]
        ),
    )
    assert _pairs(results) == [("gpu", "skip"), ("gpu", "ok")]
    assert "shows no NUMA node (numa_node -1" in results[0].message


def test_a_gpu_planned_without_a_node_is_a_skip(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    results = _check(root, _entry(gpus=[{"address": "0000:81:00.0", "node": None}]))
    assert results == [
        guard_preflight.CheckResult(
            "gpu", "skip", "0000:81:00.0 is on NUMA node 1; no planned node"
        )
    ]


def _a100_with_driver(root: str, version: bool = True) -> str:
    field_cases.gpu_holders_procfs(f"{root}/proc", A100_GPUS, holders={})
    if version:
        Path(f"{root}/proc/driver/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.05\n"
        )
    return root


@pytest.mark.parametrize(
    ("uuid", "status", "message"),
    [
        (A100_GPUS["0000:b1:00.0"][1], "ok", f"0000:b1:00.0 is {A100_GPUS['0000:b1:00.0'][1]} as planned"),
        (
            "GPU-ffffffff-8c1d-4a55-9a0e-1b2c3d4e5f61",
            "fail",
            f"0000:b1:00.0 is {A100_GPUS['0000:b1:00.0'][1]}, planned "
            "GPU-ffffffff-8c1d-4a55-9a0e-1b2c3d4e5f61: the GPU was replaced; gather facts again",
        ),
    ],
)  # fmt: skip
def test_nvidia_uuid_is_matched_against_the_driver(fixture_root, uuid, status, message):
    root = _a100_with_driver(fixture_root(A100, writable=True))
    results = _check(root, _entry(gpus=[{"address": "0000:b1:00.0", "uuid": uuid, "node": 1}]))
    assert _pairs(results) == [("gpu", "ok"), ("gpu", status)]
    assert results[1].message.startswith(message)


def test_no_nvidia_driver_is_a_skip_and_an_unbound_gpu_a_failure(fixture_root):
    root = fixture_root(A100, writable=True)
    gpu = {"address": "0000:ca:00.0", "uuid": "GPU-0000", "node": 1}
    assert _pairs(_check(root, _entry(gpus=[gpu]))) == [("gpu", "ok"), ("gpu", "skip")]
    _a100_with_driver(root)  # the driver runs, but 0000:ca:00.0 has no procfs directory
    results = _check(root, _entry(gpus=[gpu]))
    assert _pairs(results) == [("gpu", "ok"), ("gpu", "fail")]
    assert "0000:ca:00.0 is not driven by the NVIDIA driver (no " in results[1].message


def test_the_real_l4_information_file(tmp_path):
    """The L4's file as posted in canonical/snapd#14893: UUID read, address upper case in the plan."""
    text = L4_INFORMATION.read_text()
    assert guard_preflight.parse_nvidia_uuid(text) == L4_UUID
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:70:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("0\n")
    (device / "vendor").write_text("0x10de\n")
    info = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:70:00.0"
    info.mkdir(parents=True)
    shutil.copy(L4_INFORMATION, info / "information")
    results = _check(str(tmp_path), _entry(gpus=[{"address": "0000:70:00.0", "uuid": L4_UUID.upper(), "node": 0}]))  # fmt: skip
    assert _pairs(results) == [("gpu", "ok"), ("gpu", "ok")]


@pytest.mark.parametrize(
    ("text", "uuid"),
    [
        ("Model: \t\t NVIDIA L4\nIRQ:   \t\t 16\nVideo BIOS: \t ??.??.??.??.??\n", None),
        ("GPU UUID: \t \n", None),
        ("GPU UUID:\tGPU-1\n", "GPU-1"),
    ],
)
def test_parse_nvidia_uuid_without_or_with_odd_spacing(text, uuid):
    """The driver leaves the line out when it cannot read the UUID (nv_procfs_read_gpu_info)."""
    assert guard_preflight.parse_nvidia_uuid(text) == uuid


# --- AMD render nodes --------------------------------------------------------------------------


def test_render_nodes_of_device_allow(fixture_root):
    """synthetic-mi300x-cpx: renderD128 is GPU 0000:03:00.0's (node 0); renderD131 a logical
    GPU's (platform device amdgpu_xcp.0, no numa_node); renderD999 does not exist."""
    root = fixture_root("synthetic-mi300x-cpx")
    node = Path(f"{root}/sys/bus/pci/devices/0000:03:00.0/numa_node").read_text().strip()
    entry = _entry(
        node=0,
        nodes=[0],
        mems=[0],
        device_allow=["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD131", "/dev/dri/renderD999"],
    )  # fmt: skip
    results = _check(root, entry)
    assert _pairs(results)[:3] == [("gpu", "ok"), ("gpu", "skip"), ("gpu", "fail")]
    assert (
        results[0].message
        == f"/dev/dri/renderD128 (0000:03:00.0) is on NUMA node {node} as planned"
    )
    assert results[1].message.startswith("/dev/dri/renderD131 (amdgpu_xcp.0) shows no NUMA node")
    assert results[2].message.startswith("/dev/dri/renderD999 does not exist")


def test_a_render_node_of_a_planned_gpu_is_held_to_that_gpus_node(fixture_root):
    root = fixture_root("synthetic-mi300x-cpx")
    entry = _entry(
        node=1,
        nodes=[1],
        mems=[1],
        gpus=[{"address": "0000:03:00.0", "uuid": None, "node": 1}],
        device_allow=["/dev/kfd", "/dev/dri/renderD128"],
    )
    results = _check(root, entry)
    assert [r.status for r in results if r.name == "gpu"] == ["fail", "fail"]
    assert (
        "/dev/dri/renderD128 (0000:03:00.0) is on NUMA node 0, planned node 1" in results[1].message
    )


# --- cpus ---------------------------------------------------------------------------------------


def test_offline_cpus_fail_naming_them(fixture_root):
    """nvidiagpunumanodes (hwloc dump of a POWER9): online is 0-15,88-103."""
    root = fixture_root("nvidiagpunumanodes")
    results = _check(root, _entry(cpus=[14, 15, 16, 17]))
    assert results == [
        guard_preflight.CheckResult(
            "cpus",
            "fail",
            "14-17: CPUs 16-17 are offline (online: 0-15,88-103); bring them online or gather "
            "facts again and run site.yml (the plan is older than this hardware state)",
        )
    ]


def test_offline_cpus_by_their_own_online_files_on_an_old_kernel(fixture_root):
    """16em64t (hwloc dump, 2.6-era): no cpu/online summary; CPUs 2, 5, 13, 14 read 0."""
    root = fixture_root("16em64t-4s2c2t-offlines")
    assert _pairs(_check(root, _entry(cpus=[0, 1]))) == [("cpus", "ok")]
    results = _check(root, _entry(cpus=[1, 2, 3]))
    assert results[0].status == "fail"
    assert results[0].message.startswith("1-3: CPUs 2 are offline (their cpu<N>/online reads 0)")


def test_cpus_outside_the_affinity_fail(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    assert _check(root, _entry(cpus=[2, 3]), affinity={2, 3}) == [
        guard_preflight.CheckResult("cpus", "ok", "2-3 online and in this process's affinity")
    ]
    results = _check(root, _entry(cpus=[2, 3]), affinity={0, 1, 2})
    assert results[0].status == "fail"
    assert "CPUs 3 are outside this process's CPU affinity 0-2" in results[0].message


def test_the_process_affinity_is_read_when_none_is_given(tmp_path):
    """main without an affinity reads os.sched_getaffinity(0): this process's CPUs pass."""
    mine = sorted(os.sched_getaffinity(0))
    cpu = tmp_path / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(f"0-{max(mine)}\n")
    lines: list = []
    status = guard_preflight.main(
        ["--mode", "enforce", "train"],
        _config(_entry(cpus=mine)),
        out=lines.append,
        sysfs_root=f"{tmp_path}/sys",
        procfs_root=f"{tmp_path}/proc",
    )
    assert status == 0, lines
    assert "ok cpus" in lines[0]


# --- memory and hugepages ----------------------------------------------------------------------


def _guard_tree(tmp_path, node1_pct: float, pools=None, total_kb=guard_trees.GUEST_NODE_KB) -> str:
    nodes = [guard_trees.node(0, 30.0), guard_trees.node(1, node1_pct, total_kb=total_kb)]
    if pools is not None:
        nodes[1]["hugepages"] = pools
    return guard_trees.write_tree(tmp_path / "tree", nodes, [])


def test_memory_below_act_is_ok_on_the_real_guest(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    results = _check(root, _entry(mems=[0, 1], memory_kb=512 * 1024))
    assert _pairs(results) == [("memory", "ok"), ("memory", "ok")]
    assert results[1].message.startswith("node 1 is ") and "% used (act 90%)" in results[1].message


@pytest.mark.parametrize(
    ("memory_mib", "status", "words"),
    [
        (512, "ok", ", but its 819 MiB free or page cache hold the 512 MiB planned here"),
        (1024, "fail", " and has 819 MiB free or page cache, less than the 1024 MiB planned here"),
        (0, "ok", ", but its 819 MiB free or page cache hold no memory budget planned here"),
    ],
)
def test_memory_over_act_passes_only_with_room_for_the_budget(tmp_path, memory_mib, status, words):
    """A 16 GiB node 1 at 95% used: 5% (819 MiB) free or page cache."""
    root = _guard_tree(tmp_path, 95.0, total_kb=16 * 1024 * 1024)
    results = _check(root, _entry(mems=[1], memory_node=1, memory_kb=memory_mib * 1024))
    assert _pairs(results) == [("memory", status)]
    assert results[0].message.startswith(f"node 1 is 95.0% used (act 90%){words}")


def test_memory_charged_evenly_over_mems_without_a_memory_node(tmp_path):
    root = _guard_tree(tmp_path, 95.0, total_kb=16 * 1024 * 1024)
    entry = _entry(mems=[0, 1], memory_kb=1600 * 1024)  # 800 MiB on each node
    assert _pairs(_check(root, entry)) == [("memory", "ok"), ("memory", "ok")]
    entry["memory_kb"] = 1700 * 1024
    assert _pairs(_check(root, entry)) == [("memory", "ok"), ("memory", "fail")]


def test_memory_act_threshold_comes_from_the_settings(tmp_path):
    root = _guard_tree(tmp_path, 85.0)
    entry = _entry(mems=[1], memory_kb=1024 * 1024)
    assert _pairs(_check(root, entry)) == [("memory", "ok")]
    assert _pairs(_check(root, entry, settings={"warn_pct": 70, "act_pct": 80})) == [
        ("memory", "fail")
    ]


def test_a_memory_node_without_meminfo_is_a_skip(tmp_path):
    root = _guard_tree(tmp_path, 40.0)
    results = _check(root, _entry(mems=[3]))
    assert _pairs(results) == [("memory", "skip")]


@pytest.mark.parametrize(
    ("pools", "count", "status", "words"),
    [
        ({2048: (48, 16)}, 16, "ok", "node 1 has 16 free 2048 kB pages of 48, 16 needed"),
        ({2048: (48, 16)}, 17, "fail", "node 1 has 16 free 2048 kB pages of 48, the placement needs 17"),
        ({2048: (48, 16)}, 0, None, None),
        ({1048576: (0, 0)}, 4, "fail", "node 1 has no 2048 kB pool ("),
    ],
)  # fmt: skip
def test_hugepages_free_on_the_planned_node(tmp_path, pools, count, status, words):
    root = _guard_tree(tmp_path, 40.0, pools=pools)
    entry = _entry(mems=[1], hugepages={"size_kb": 2048, "count": count, "node": 1})
    results = [r for r in _check(root, entry) if r.name == "hugepages"]
    if status is None:
        assert results == []
        return
    assert _pairs(results) == [("hugepages", status)]
    assert results[0].message.startswith(words)


def test_hugepages_on_the_real_guest(fixture_root):
    """qemu-2node-pxb: node 1 holds 48 pages of 2 MiB, 16 of them free."""
    root = fixture_root("qemu-2node-pxb")
    entry = _entry(mems=[1], memory_node=1, hugepages={"size_kb": 2048, "count": 8, "node": None})
    results = [r for r in _check(root, entry) if r.name == "hugepages"]
    assert results == [
        guard_preflight.CheckResult(
            "hugepages", "ok", "node 1 has 16 free 2048 kB pages of 48, 8 needed"
        )
    ]


# --- the command ---------------------------------------------------------------------------------


def _failing(root: str) -> dict:
    return _config(_entry(cpus=[2, 3], mems=[1]), preflight="enforce")


@pytest.mark.parametrize(
    ("argv", "status", "word"),
    [
        (["train"], 1, "enforce mode"),  # settings.preflight: enforce
        (["--mode", "warn", "train"], 0, "warn mode: the unit starts anyway"),
        (["--mode", "enforce", "numafleet-train.service"], 1, "enforce mode"),
    ],
)
def test_exit_status_by_mode(fixture_root, argv, status, word):
    root = fixture_root("qemu-2node-pxb")
    got, lines = _run(root, argv, _failing(root), affinity={0, 1})
    assert got == status
    assert lines[0].startswith(
        "numafleet-guard preflight train: FAIL cpus 2-3: CPUs 2-3 are outside"
    )
    assert lines[1].startswith("numafleet-guard preflight train: ok memory node 1 is ")
    assert lines[-1].startswith("numafleet-guard preflight train: 1 failed (1 ok, 1 fail, 0 skip)")
    assert word in lines[-1]


def test_all_passed_and_the_off_setting(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    config = _config(_entry(cpus=[2, 3], mems=[1]))
    assert _run(root, ["--mode", "enforce", "train"], config)[1][-1] == (
        "numafleet-guard preflight train: passed (2 ok, 0 fail, 0 skip)"
    )
    status, lines = _run(root, ["train"], _config(_entry(cpus=[9]), preflight="off"))
    assert (status, lines) == (
        0,
        ["numafleet-guard preflight train: skip all (numafleet_preflight is off)"],
    )


def test_an_unknown_placement_is_exit_2_naming_the_placements(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    status, lines = _run(root, ["infer"], _config(_entry("train"), _entry("etl")))
    assert status == 2
    assert lines == [
        "numafleet-guard preflight: error (host gpu-a100-01): no placement named 'infer' in "
        "/etc/numafleet/guard.json (its placements: etl, train); use one of them, or run "
        "site.yml to write the plan and the guard's config again when the placement is new"
    ]


@pytest.mark.parametrize(
    "argv",
    [[], ["--mode", "always", "train"], ["train", "extra"], ["--bogus", "train"]],
)
def test_usage_errors_are_exit_2_without_a_traceback(fixture_root, argv):
    status, lines = _run(fixture_root("qemu-2node-pxb"), argv, _config(_entry()))
    assert status == 2
    assert lines[-1].startswith("numafleet-guard preflight: error: ")


def test_help_is_exit_0(fixture_root, capsys):
    status, dummy = _run(fixture_root("qemu-2node-pxb"), ["--help"], _config(_entry()))
    assert status == 0
    assert "usage: numafleet-guard preflight" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cpus": "2-3"}, "placement 'train'.cpus is '2-3', not a list of ids"),
        ({"gpus": [{"address": "../../../etc"}]}, "placement 'train'.gpus[0].address is '../../../etc', not a PCI address"),
        ({"device_allow": ["/dev/sda"]}, "placement 'train'.device_allow has '/dev/sda', not /dev/kfd or /dev/dri/renderD<N>"),
        ({"hugepages": {"count": 4}}, "placement 'train'.hugepages has a count but no size_kb"),
        ({"memory_kb": -1}, "placement 'train'.memory_kb is -1, not an integer >= 0"),
    ],
)  # fmt: skip
def test_a_bad_config_entry_is_refused_naming_the_placement(fixture_root, change, message):
    status, lines = _run(fixture_root("qemu-2node-pxb"), ["train"], _config(_entry(**change)))
    assert status == 2
    assert lines == [f"numafleet-guard preflight: error (host gpu-a100-01): {message}; run site.yml "
                     "to write the plan and the guard's config again"]  # fmt: skip


def test_bad_settings_are_refused_naming_the_host_variable(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    status, lines = _run(root, ["train"], _config(_entry(), act_pct=120))
    assert status == 2
    assert "numafleet_memory_act_pct is 120" in lines[0]
    status, lines = _run(root, ["train"], _config(_entry(), preflight="sometimes"))
    assert status == 2
    assert "settings.preflight is 'sometimes'; set numafleet_preflight to one of" in lines[0]


def test_the_config_is_loaded_from_config_when_none_is_passed(fixture_root, tmp_path):
    root = fixture_root("qemu-2node-pxb")
    path = tmp_path / "guard.json"
    path.write_text(json.dumps(_config(_entry(cpus=[0, 1]))))
    assert _run(root, ["--config", str(path), "train"], None)[0] == 0
    path.write_text("{not json")
    status, lines = _run(root, ["--config", str(path), "train"], None)
    assert status == 2
    assert lines[0].startswith(f"numafleet-guard preflight: error: {path} is not JSON (")
    status, lines = _run(root, ["--config", str(tmp_path / "absent.json"), "train"], None)
    assert status == 2
    assert "absent.json: No such file or directory; run site.yml" in lines[0]


def test_an_unreadable_file_fails_its_check_not_the_program(fixture_root):
    root = fixture_root("qemu-2node-pxb")

    def read(path):
        if path.endswith("/cpu/online"):
            raise GuardError(f"{path}: Permission denied")
        return guard.read_path(path)

    status, lines = _run(root, ["--mode", "enforce", "train"], _config(_entry(cpus=[0])), read=read)
    assert status == 1
    assert lines[0].startswith("numafleet-guard preflight train: FAIL cpus cannot read: ")
    assert lines[0].endswith("/sys/devices/system/cpu/online: Permission denied")


# --- anchor (near:) -----------------------------------------------------------------------------


def test_the_anchor_device_on_its_planned_node_in_the_real_guest(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    near = {"address": "0000:81:00.0", "kind": "display", "node": 1}
    assert _check(root, _entry(near=near))[0] == guard_preflight.CheckResult(
        "anchor", "ok", "0000:81:00.0 is on NUMA node 1 as planned"
    )


def test_an_anchor_on_another_node_refuses_the_start_in_enforce_mode(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    near = {"address": "0000:81:00.0", "kind": "nvme", "node": 0}
    status, lines = _run(root, ["--mode", "enforce", "train"], _config(_entry(near=near)))
    assert status == 1
    assert lines[0] == (
        "numafleet-guard preflight train: FAIL anchor 0000:81:00.0 is on NUMA node 1, planned "
        "node 0; gather facts again and run site.yml (the plan is older than this hardware state)"
    )


def test_an_anchor_gone_from_the_bus_fails_naming_its_kind(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    results = _check(root, _entry(near={"address": "0000:82:00.0", "kind": "nvme", "node": 1}))
    assert _pairs(results)[0] == ("anchor", "fail")
    assert "the anchor device (nvme) fell off the bus" in results[0].message


@pytest.mark.parametrize(
    "near",
    [{"address": "81:00.0", "node": 1}, {"address": "0000:81:00.0", "node": "1"}, "0000:81:00.0"],
)
def test_a_malformed_anchor_is_refused_naming_the_placement(fixture_root, near):
    status, lines = _run(fixture_root("qemu-2node-pxb"), ["train"], _config(_entry(near=near)))
    assert status == 2
    assert "placement 'train'.near" in lines[0] and "run site.yml" in lines[0]


# --- the plan's own placements, and the installed package ------------------------------------------

GUARD_KEYS = (
    "name unit unit_kind slice node nodes mems memory_node memory_kb cpus hugepages gpus "
    "device_allow near priority"
).split()


def _guard_entry(placement: dict) -> dict:
    """A plan placement reduced the way the role writes it into guard.json (decision 2)."""
    entry = {key: placement[key] for key in GUARD_KEYS if placement.get(key) is not None}
    if "gpus" in entry:
        entry["gpus"] = [
            {key: gpu.get(key) for key in ("address", "uuid", "node", "mig")}
            for gpu in entry["gpus"]
        ]
    return entry


def _plan_entry(machine: str, root: str, request: dict) -> dict:
    numa = json.loads((FIXTURES / "sysfs" / f"{machine}.numa.json").read_text(encoding="utf-8"))
    snapshot = trees.GPU_SNAPSHOT_DIR / f"{machine}.json"
    state = (
        gpu_snapshot.read_snapshot(str(snapshot))
        if snapshot.is_file()
        else gpu.nvml_unavailable("no snapshot in the fixtures")
    )
    topology = gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)
    policy = {"reserved_cpus": "", "memory_headroom_pct": 15}
    plan = plan_host("h", numa, json.loads(json.dumps(topology)), [request], [], policy)
    return plan["placements"][0]


def test_a_fresh_plan_of_the_a100_host_passes_its_preflight(fixture_root):
    """The planner's own entry (1 A100, 8 GiB, 16 x 2 MiB pages) on the tree it was planned from,
    once the hugepages layer reserved the pages: nothing fails."""
    root = _a100_with_driver(fixture_root(A100, writable=True))
    request = {"name": "train", "exec": "/bin/app", "cpus": 4, "user": "app", "gpus": 1,
               "memory": "8G", "hugepages": {"size": "2M", "count": 16}}  # fmt: skip
    placement = _plan_entry(A100, root, request)
    node = placement["hugepages"]["node"]
    pool = Path(f"{root}/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB")
    (pool / "nr_hugepages").write_text("16\n")
    (pool / "free_hugepages").write_text("16\n")
    gpu_address = placement["gpus"][0]["address"]
    uuid = placement["gpus"][0]["uuid"]
    gpus_here = {gpu_address: ("NVIDIA A100 80GB PCIe", uuid, 2)}
    field_cases.gpu_holders_procfs(f"{root}/proc", gpus_here, holders={})
    status, lines = _run(
        root, ["--mode", "enforce", "train"], _config(_guard_entry(placement)),
        affinity=placement["cpus"],
    )  # fmt: skip
    assert status == 0, lines
    assert [line.split()[3:5] for line in lines[:-1]] == [
        ["ok", "gpu"], ["ok", "gpu"], ["ok", "cpus"], ["ok", "memory"], ["ok", "hugepages"]
    ]  # fmt: skip
    assert lines[-1] == "numafleet-guard preflight train: passed (5 ok, 0 fail, 0 skip)"


def test_a_fresh_plan_of_an_mi300x_logical_gpu_passes_its_preflight(fixture_root):
    """A CPX logical GPU selected by render node (its GPU's UUID is shared, so device_allow):
    logical GPU 0's render node is the PCI device's own, held to the GPU's planned node; an AMD
    UUID (GPU-<16 hex>) gets no NVIDIA check."""
    root = fixture_root("synthetic-mi300x-cpx")
    request = {"name": "infer", "exec": "/bin/app", "cpus": 4, "user": "app", "gpus": 1,
               "partition": "CPX"}  # fmt: skip
    placement = _plan_entry("synthetic-mi300x-cpx", root, request)
    assert placement["device_allow"]
    status, lines = _run(
        root, ["--mode", "enforce", "infer"], _config(_guard_entry(placement)),
        affinity=placement["cpus"],
    )  # fmt: skip
    assert status == 0, lines
    address = placement["gpus"][0]["address"]
    render = placement["device_allow"][1]
    assert [line.split(": ", 1)[1] for line in lines[:2]] == [
        f"ok gpu {address} is on NUMA node 1 as planned",
        f"ok gpu {render} ({address}) is on NUMA node 1 as planned",
    ]
    assert "nvidia" not in " ".join(lines)


def test_the_installed_package_layout_runs_it(tmp_path, fixture_root):
    """guard_preflight imports only .guard, .cpulist, .errors and the standard library: copied
    into a numafleet_guard package (as the role installs it), it runs under plain python3."""
    package = tmp_path / "lib" / "numafleet_guard"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    core = Path(guard_preflight.__file__).parent
    for name in ("guard.py", "guard_preflight.py", "cpulist.py", "errors.py"):
        shutil.copy(core / name, package / name)
    root = fixture_root("qemu-2node-pxb")
    config = tmp_path / "guard.json"
    config.write_text(json.dumps(_config(_entry(cpus=[0], mems=[1]))))
    code = (
        "import sys; from numafleet_guard import guard_preflight as p; "
        f"sys.exit(p.main(sys.argv[1:], None, affinity={{0}}, sysfs_root={root + '/sys'!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(package.parent)!r}); {code}",
         "--mode", "enforce", "--config", str(config), "train"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        "numafleet-guard preflight train: passed (2 ok, 0 fail, 0 skip)"
    )


def test_a_control_character_never_splits_a_line():
    result = guard_preflight.CheckResult("gpu", "ok", "a\nFAIL forged")
    assert result.line("x") == "numafleet-guard preflight x: ok gpu a\\nFAIL forged"


@pytest.mark.parametrize(
    ("text", "status", "words"),
    [
        ("1\n", "ok", "0000:81:00.0 is on NUMA node 1 as planned"),
        ("-1\n", "skip", "0000:81:00.0 shows no NUMA node (numa_node -1"),
        ("\0\0\0\0", "skip", "0000:81:00.0: "),  # a lying sysfs: NUL bytes where a number belongs
        ("", "skip", "0000:81:00.0: "),
        ("node1\n", "skip", "0000:81:00.0: "),
    ],
)
def test_numa_node_texts_a_sysfs_can_show(fixture_root, text, status, words):
    """Edited copy of qemu-2node-pxb (PROVENANCE.md, "Edited copies in tests"): numa_node of
    0000:81:00.0 replaced; only a number is a node, anything else is unknown, never a failure."""
    root = fixture_root("qemu-2node-pxb", writable=True)
    Path(f"{root}/sys/bus/pci/devices/0000:81:00.0/numa_node").write_text(text)
    results = _check(root, _entry(gpus=[{"address": "0000:81:00.0", "node": 1}]))
    assert _pairs(results) == [("gpu", status)]
    assert results[0].message.startswith(words)


def test_hugepages_without_a_node_to_hold_them_to_is_a_skip(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    entry = _entry(mems=[0, 1], hugepages={"size_kb": 2048, "count": 4, "node": None})
    results = [r for r in _check(root, entry) if r.name == "hugepages"]
    assert results == [
        guard_preflight.CheckResult("hugepages", "skip", "4 x 2048 kB: no planned node")
    ]


def test_a_placement_name_with_a_newline_stays_on_its_lines(fixture_root):
    status, lines = _run(
        fixture_root("qemu-2node-pxb"), ["a\nb"], _config(_entry("a\nb", cpus=[0]))
    )
    assert status == 0
    assert lines == [
        "numafleet-guard preflight a\\nb: ok cpus 0 online and in this process's affinity",
        "numafleet-guard preflight a\\nb: passed (1 ok, 0 fail, 0 skip)",
    ]


def test_the_real_h100_vm_numa_unknown_and_uuid_matched(tmp_path):
    """Captured on an H100 virtual machine (PROVENANCE.md, nvidia_proc/): sysfs gives the GPU no
    node (numa_node -1): skip; the driver's information file carries the planned UUID: ok."""
    captured = FIXTURES / "nvidia_proc"
    address = "0000:00:06.0"
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    for line in (captured / "pci-h100-vm.txt").read_text().splitlines():
        name, dummy, value = line.partition("=")
        (device / name).write_text(value + "\n")
    driver = tmp_path / "proc" / "driver" / "nvidia"
    (driver / "gpus" / address).mkdir(parents=True)
    shutil.copy(captured / "information-h100-vm.txt", driver / "gpus" / address / "information")
    shutil.copy(captured / "version-h100-vm.txt", driver / "version")
    uuid = "GPU-f0bf7920-a818-3167-1f60-8158b07e6b2e"
    results = _check(str(tmp_path), _entry(gpus=[{"address": address, "uuid": uuid, "node": 0}]))
    assert results == [
        guard_preflight.CheckResult(
            "gpu",
            "skip",
            f"{address} shows no NUMA node (numa_node -1: the firmware gives no locality); "
            "planned node 0",
        ),
        guard_preflight.CheckResult("gpu", "ok", f"{address} is {uuid} as planned"),
    ]
    other = _check(str(tmp_path), _entry(gpus=[{"address": address, "uuid": L4_UUID, "node": 0}]))
    assert other[1].status == "fail"
    assert other[1].message.startswith(
        f"{address} is {uuid}, planned {L4_UUID}: the GPU was replaced"
    )
