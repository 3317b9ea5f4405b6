"""The run_module helper itself (conftest.py), proven on numafleet.tuning.numa_facts."""

from __future__ import annotations

import pytest

ONE_NODE = {
    "sys/devices/system/node/online": "0\n",
    "sys/devices/system/node/node0/cpulist": "0-1\n",
    "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal: 1024 kB\nNode 0 MemFree: 512 kB\n",
    "sys/devices/system/node/node0/distance": "10\n",
    "sys/devices/system/cpu/online": "0-1\n",
    "sys/devices/system/cpu/possible": "0-1\n",
    "sys/devices/system/cpu/present": "0-1\n",
    "proc/meminfo": "MemTotal: 1024 kB\nHugepagesize: 2048 kB\n",
}


@pytest.fixture
def one_node(tmp_path):
    for relative, text in ONE_NODE.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"sysfs_root": str(tmp_path / "sys"), "procfs_root": str(tmp_path / "proc")}


@pytest.mark.parametrize(("check_mode", "diff"), [(False, False), (True, True)])
def test_result_is_the_exit_json_dict(run_module, one_node, check_mode, diff):
    result = run_module("numa_facts", one_node, check_mode=check_mode, diff=diff)
    assert result["failed"] is False
    assert result["changed"] is False
    numa = result["ansible_facts"]["numa"]
    assert numa["node_ids"] == [0]
    assert numa["nodes"][0]["cpus"] == [0, 1]
    assert numa["sysfs_root"] == one_node["sysfs_root"]


def test_module_object_is_accepted(run_module, one_node):
    from ansible_collections.numafleet.tuning.plugins.modules import numa_facts

    assert run_module(numa_facts, one_node)["ansible_facts"]["numa"]["node_ids"] == [0]


def test_fail_json_becomes_failed_with_msg(run_module):
    result = run_module("numa_facts", {"no_such_option": 1})
    assert result["failed"] is True
    assert "Unsupported parameters" in result["msg"]
    assert "no_such_option" in result["msg"]
