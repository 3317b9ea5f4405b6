"""GPU-memory and tiered nodes as a user sees them on the demo fleet (render mode).

The facts themselves (gpu_owner, normal_memory, memory_tier, memory_backing) are tested on the
same trees in tests/unit/plugins/module_utils/numa/test_memnodes.py.

* gh200-01 (synthetic Grace Hopper; the driver's numa_status names node 1 as the H100's HBM):
  triton's unit binds memory to node 0 only and its
  summary shows no other memory node. With a second placement that only the HBM node could
  hold, the plan is refused before anything is written, naming node 1 as the GPU's memory.
* power9-v100-01 (real POWER9 dump, V100 memory as nodes 250-255): with placements of a scratch
  host_vars, the one whose CPU node is full gets memory from node 8 (distance 40) - never from
  a V100 node - and the summary line shows ``mems 0+8`` and the plan's warning says why.
* epyc-nps4-01 (memory-less CPU node 1, the demo as shipped): ingest's summary shows ``mems 0``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, read_tree

PLAN_TASK = "Plan placements"
SUMMARY_TASK = "Print the plan summary"
UNITS = "etc/systemd/system"
V100_NODES = set(range(250, 256))
POWER9_VARS = {
    "numafleet_reserved_cpus": "0-3",
    "numafleet_placements": [
        {
            "name": "solver",
            "description": "CFD solver, fills most of node 0's memory",
            "exec": "/opt/cfd/bin/solver --threads 8",
            "user": "cfd",
            "node": 0,
            "cpus": 8,
            "memory": "100G",
        },
        {
            "name": "postproc",
            "description": "Post-processing next to the solver; node 0's memory is full",
            "exec": "/opt/cfd/bin/postproc",
            "user": "cfd",
            "node": 0,
            "cpus": 4,
            "memory": "8G",
            "allow_span": True,
        },
    ],
}
GH200_EXTRA = {
    "name": "cache",
    "description": "KV cache spill: would only fit on the GPU's HBM node",
    "exec": "/opt/cache/bin/cache",
    "user": "cache",
    "cpus": 4,
    "memory": "60G",
    "allow_span": True,
}


class Demo:
    """A scratch copy of the demo fleet with its own host_vars."""

    def __init__(self, base: Path) -> None:
        import trees

        self.base = base
        self.inventory = base / "inventories" / "demo"
        shutil.copytree(REPO / "inventories" / "demo", self.inventory)
        trees.materialize_demo(base / ".demo")
        (self.inventory / "host_vars" / "power9-v100-01.yml").write_text(
            yaml.safe_dump(POWER9_VARS, sort_keys=False)
        )

    def site(self, *hosts: str):
        return ansible_playbook(REPO / "site.yml", self.inventory, "--limit", ",".join(hosts))

    def units(self, host: str) -> dict:
        tree = read_tree(self.base / ".demo" / host / "root")
        return {path: text for path, text in tree.items() if path.startswith(UNITS)}


def _settings(text: str, key: str) -> list:
    """The values of key= in a unit file, empty resets left out."""
    return [
        line.split("=", 1)[1]
        for line in text.splitlines()
        if line.startswith(f"{key}=") and line != f"{key}="
    ]


def _nodes(values: list) -> set:
    """Node ids of node lists such as '0,8' or '250-255'."""
    found = set()
    for value in values:
        for part in value.replace(" ", ",").split(","):
            if "-" in part:
                low, high = part.split("-")
                found.update(range(int(low), int(high) + 1))
            elif part:
                found.add(int(part))
    return found


@pytest.fixture(scope="module")
def demo(tmp_path_factory, ansible_ready):
    demo = Demo(tmp_path_factory.mktemp("mem"))
    demo.run = demo.site("gh200-01", "power9-v100-01", "epyc-nps4-01")
    return demo


def test_site_succeeds_on_the_three_hosts(demo):
    assert demo.run.rc == 0, demo.run.explain()
    assert sorted(demo.run.stats) == ["epyc-nps4-01", "gh200-01", "power9-v100-01"]


def test_gh200_binds_memory_to_the_grace_node_only(demo):
    line = demo.run.one("gh200-01", SUMMARY_TASK)["msg"]
    assert line.startswith("gh200-01: 1 placement: triton node0 cpus "), line
    assert " mems " not in line, line
    units = demo.units("gh200-01")
    dropin = units[f"{UNITS}/tritonserver.service.d/50-numafleet.conf"]
    assert _nodes(_settings(dropin, "NUMAMask")) == {0}, dropin


def test_power9_memory_falls_back_to_node_8_never_to_v100_memory(demo):
    line = demo.run.one("power9-v100-01", SUMMARY_TASK)["msg"]
    assert "solver node0 cpus " in line and "postproc node0 cpus " in line, line
    solver, postproc = line.split(": ", 2)[2].split("; ")[:2]
    assert " mems " not in solver, line
    assert postproc.endswith(" mems 0+8"), line
    plan = demo.run.one("power9-v100-01", PLAN_TASK)
    assert (
        "host power9-v100-01: placement postproc: memory on node 8, not on its CPU node 0 "
        "(distance 40 from node 0): the memory budget of node 0 is full"
    ) in plan["warnings"]
    units = demo.units("power9-v100-01")
    masks = {
        path: _settings(text, "NUMAMask") + _settings(text, "AllowedMemoryNodes")
        for path, text in units.items()
    }
    bound = _nodes([value for values in masks.values() for value in values])
    assert bound == {0, 8}, masks
    assert not bound & V100_NODES
    postproc_unit = units[f"{UNITS}/numafleet-postproc.service"]
    assert _nodes(_settings(postproc_unit, "NUMAMask")) == {0, 8}, postproc_unit


def test_memory_less_cpu_node_shows_its_memory_node(demo):
    line = demo.run.one("epyc-nps4-01", SUMMARY_TASK)["msg"]
    assert "ingest node1 cpus " in line and " mems 0;" in line, line


def test_gh200_placement_that_only_fits_on_hbm_is_refused(tmp_path, ansible_ready):
    demo = Demo(tmp_path)
    vars_file = demo.inventory / "host_vars" / "gh200-01.yml"
    host_vars = yaml.safe_load(vars_file.read_text())
    host_vars["numafleet_placements"][0]["memory"] = "380G"
    host_vars["numafleet_placements"].append(GH200_EXTRA)
    vars_file.write_text(yaml.safe_dump(host_vars, sort_keys=False))
    run = demo.site("gh200-01")
    assert run.rc != 0, run.explain()
    msg = run.one("gh200-01", PLAN_TASK)["msg"]
    assert msg.startswith("host gh200-01: numafleet_placements[1] (cache) needs 60 GiB memory"), msg
    assert "node1 0 GPUs, 0 CPUs, memory of GPU 0009:01:00.0 (never planned)" in msg, msg
    assert demo.units("gh200-01") == {}  # refused before the gate: nothing written
