"""numa_facts through main(): facts, check mode, and bad input."""

from __future__ import annotations

import json
import os

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
