"""numa_locality_info through run_module: arguments, check mode, results and errors."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

PROCFS = Path(__file__).parents[2] / "fixtures" / "procfs"
SERVICES = [
    {"name": "embed", "unit": "embed.service", "cpus": [2, 3], "mems": [1], "extra": "ignored"},
    {"name": "stopped", "cpus": [2, 3], "mems": [1]},
]


@pytest.fixture(scope="module")
def roots(tmp_path_factory, fixture_root):
    dest = tmp_path_factory.mktemp("fleet")
    with tarfile.open(PROCFS / "v2-fleet.tar.gz") as tar:
        tar.extractall(dest, filter="data")
    return {
        "procfs_root": str(dest / "v2-fleet" / "proc"),
        "cgroup_root": str(dest / "v2-fleet" / "cgroup"),
        "sysfs_root": f"{fixture_root('qemu-2node-pxb')}/sys",
    }


@pytest.mark.parametrize("check_mode", [False, True])
def test_measures_without_changing(run_module, roots, check_mode):
    args = dict(roots, services=SERVICES, window_s=0, perf="never")
    result = run_module("numa_locality_info", args, check_mode=check_mode)
    assert result["failed"] is False
    assert result["changed"] is False
    embed, stopped = result["services"]
    assert embed["pids"] == [1101]
    assert embed["offnode_share"] == 0.0
    assert embed["pages_kb"]["anon_huge_by_node"] == {"1": 15088}
    assert embed["remote_access"] == {"available": False, "ratio": None, "reason": "perf=never"}
    assert stopped["running"] is False
    assert [node["id"] for node in result["nodes"]] == [0, 1]
    assert result["nodes"][1]["numastat"]["miss_ratio"] is None


def test_perf_auto_without_perf_on_path(run_module, roots, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    args = dict(roots, services=SERVICES[:1], window_s=0)
    result = run_module("numa_locality_info", args)
    assert result["services"][0]["remote_access"]["reason"] == "perf is not installed"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"window_s": -1}, "window_s=-1.0 must be 0 or more seconds"),
        ({"services": [{"unit": "x.service"}]}, r"services[0]: needs a name"),
        (
            {"cgroup_root": "/nonexistent/cgroup"},
            "cgroup_root='/nonexistent/cgroup' is not a cgroup",
        ),
        ({"sysfs_root": "/nonexistent/sys"}, "Point sysfs_root at the host's /sys"),
        ({"perf": "always"}, "value of perf must be one of: auto, never"),
    ],
)
def test_errors_become_failed_with_the_message(run_module, roots, override, message):
    args = dict(roots, services=SERVICES, window_s=0, perf="never")
    args.update(override)
    result = run_module("numa_locality_info", args)
    assert result["failed"] is True
    assert message in result["msg"]
    assert "exception" not in result
