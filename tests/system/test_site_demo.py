"""site.yml on a fresh scratch copy of the demo fleet: succeeds, is idempotent, check mode is clean.

The demo inventory is copied to <tmp>/inventories/demo and the trees are materialised to
<tmp>/.demo, so the inventory's own `numafleet_demo_root` ({{ inventory_dir }}/../../.demo/<host>)
points at the scratch copy; the checkout's .demo/ is never touched.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from system_helpers import REPO, Run, ansible_playbook, read_tree, tree_digest

UNITS = "etc/systemd/system"
ROLE = "numafleet.tuning.pinned_services : "
APPLY_TASK = ROLE + "Write pinned units, drop-ins and tenant slices"
SUMMARY_TASK = "Print the plan summary"
WOULD_RUN_TASK = ROLE + "Report what the service manager would run (render mode)"


@dataclass
class Fleet:
    base: Path
    inventory: Path
    hosts: list
    first: Run
    second: Run
    rendered: dict  # host -> {relative path: text} after the second run

    def root(self, host: str) -> Path:
        return self.base / ".demo" / host / "root"

    def digests(self) -> dict:
        return {host: tree_digest(self.root(host)) for host in self.hosts}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    import trees

    base = tmp_path_factory.mktemp("site")
    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    trees.materialize_demo(base / ".demo")
    hosts = sorted(trees.DEMO_HOSTS)
    first = ansible_playbook(REPO / "site.yml", inventory)
    second = ansible_playbook(REPO / "site.yml", inventory)
    rendered = {host: read_tree(base / ".demo" / host / "root") for host in hosts}
    print(
        f"\nsite.yml on the demo fleet: first run {first.seconds:.1f} s, second {second.seconds:.1f} s"
    )
    return Fleet(base, inventory, hosts, first, second, rendered)


def test_first_run_succeeds_on_every_host(fleet):
    run = fleet.first
    assert run.rc == 0, run.explain()
    assert sorted(run.stats) == fleet.hosts, run.explain()
    for host, stats in run.stats.items():
        assert stats["failures"] == 0 and stats["unreachable"] == 0, (host, stats)
    # One changed task per apply role: pools, kernel knobs, units (handlers only print in render mode).
    assert run.stats["gpu-a100-01"]["changed"] == 3, run.explain()
    applied = [r["action"] for r in run.results("gpu-a100-01") if r.get("changed")]
    assert sorted(applied) == [
        "numafleet.tuning.numa_hugepages",
        "numafleet.tuning.numa_kernel",
        "numafleet.tuning.pinned_units",
    ], applied


def test_second_run_changes_nothing(fleet):
    run = fleet.second
    assert run.rc == 0, run.explain()
    changed = {host: stats["changed"] for host, stats in run.stats.items()}
    assert changed == dict.fromkeys(fleet.hosts, 0), changed
    assert run.results(task=WOULD_RUN_TASK) == [] or all(
        r["status"] == "skipped" for r in run.results(task=WOULD_RUN_TASK)
    )


# Actions that run on the controller only (cheap); everything else is a module sent to the host.
CONTROLLER_SIDE = {
    "numafleet.tuning.numa_plan",
    "ansible.builtin.assert",
    "ansible.builtin.debug",
    "ansible.builtin.fail",
    "ansible.builtin.set_fact",
    "ansible.builtin.validate_argument_spec",
    "validate_argument_spec",
}


def test_modules_run_once_per_role_per_host(fleet):
    """Fleet cost: two facts modules and one module per apply role; the rest stays on the controller."""
    for host in fleet.hosts:
        ran = [r["action"] for r in fleet.first.results(host) if r["status"] != "skipped"]
        remote = sorted(a for a in ran if a not in CONTROLLER_SIDE)
        assert remote == [
            "numafleet.tuning.gpu_topology_facts",
            "numafleet.tuning.numa_facts",
            "numafleet.tuning.numa_hugepages",
            "numafleet.tuning.numa_kernel",
            "numafleet.tuning.pinned_units",
        ], (host, ran)


def test_one_summary_line_per_host(fleet):
    for host in fleet.hosts:
        line = fleet.first.one(host, SUMMARY_TASK)["msg"]
        assert isinstance(line, str) and "\n" not in line
        assert line.startswith(f"{host}: "), line
    a100 = fleet.first.one("gpu-a100-01", SUMMARY_TASK)["msg"]
    assert a100.startswith("gpu-a100-01: 4 placements: llm-70b node1 ")
    vm = fleet.first.one("vm-gpu-01", SUMMARY_TASK)["msg"]
    assert vm.endswith("; 1 warning"), vm


def test_unknown_locality_gpu_is_a_warning(fleet):
    plan = fleet.first.one("vm-gpu-01", "Plan placements")
    assert any("0000:06:00.0" in w and "unknown NUMA locality" in w for w in plan["warnings"])
    assert all(w.startswith("host vm-gpu-01: ") for w in plan["warnings"])


def test_render_mode_reports_what_it_would_run(fleet):
    msg = fleet.first.one("gpu-a100-01", WOULD_RUN_TASK)["msg"]
    assert "would run: systemctl daemon-reload" in msg
    assert "would run: systemctl enable --now numafleet-llm-70b.service" in msg


def _unit(fleet, host, name):
    files = fleet.rendered[host]
    assert f"{UNITS}/{name}" in files, sorted(files)
    return files[f"{UNITS}/{name}"].splitlines()


# (host, unit file, lines it must contain)
EXPECTED_LINES = [
    (
        "gpu-a100-01",
        "numafleet-llm-70b.service",
        [
            # Node 0's second GPU is in MIG mode, so the 2-GPU model lands on node 1.
            "CPUAffinity=32-39,96-103",
            "NUMAPolicy=bind",
            "NUMAMask=1",
            "AllowedMemoryNodes=1",
            'Environment="CUDA_VISIBLE_DEVICES=GPU-27a1a97b-100a-5f4e-9236-eb21e9fcfce0,'
            'GPU-0b8a1534-9990-5148-926f-bdb423a4517b"',
            "Slice=numafleet-team\\x2da.slice",
            "User=vllm",
            "LimitMEMLOCK=infinity",
            "NoNewPrivileges=yes",
        ],
    ),
    (
        "gpu-a100-01",
        "numafleet-embed.service",
        [
            # The existing 3g.40gb instance on 0000:17:00.0 is reused.
            'Environment="CUDA_VISIBLE_DEVICES=MIG-d2370484-ec09-58f3-9dd0-11e29c0f61ab"',
            "NUMAMask=0",
            "Slice=numafleet-team\\x2db.slice",
        ],
    ),
    (
        "gpu-a100-01",
        "numafleet-rerank-b.service",
        [
            # Both rerankers share 0000:31:00.0 through one MPS daemon.
            'Environment="CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/GPU-fdb5df64-11ce-5c72-a560-9702875cecd6"',
            'Environment="CUDA_VISIBLE_DEVICES=GPU-fdb5df64-11ce-5c72-a560-9702875cecd6"',
        ],
    ),
    (
        "gpu-a100-01",
        "numafleet-team\\x2da.slice",
        ["AllowedCPUs=32-39,96-103", "AllowedMemoryNodes=1", "MemoryMax=214748364800"],
    ),
    (
        "gpu-h100-01",
        "numafleet-chat-70b.service",
        [
            # ba:00.0 + db:00.0 share PCIe switch b8:00.0.
            'Environment="CUDA_VISIBLE_DEVICES=GPU-3896c892-a66e-5d0a-8770-af0f217b9283,'
            'GPU-f0115832-058e-5394-8c25-85641c9c5003"',
            "NUMAMask=1",
            # % is escaped for systemd.
            'Environment="VLLM_LOGGING_FORMAT=%%(asctime)s %%(levelname)s %%(message)s"',
        ],
    ),
    (
        "epyc-nps4-01",
        "numafleet-ingest.service",
        [
            # Node 1 has no memory: CPUs there, memory from node 0 (nearest, lowest id).
            "CPUAffinity=24-35,120-131",
            "NUMAMask=0",
        ],
    ),
    (
        "gh200-01",
        "tritonserver.service.d/50-numafleet.conf",
        [
            "[Service]",
            "CPUAffinity=2-33",
            "NUMAMask=0",
            'Environment="CUDA_VISIBLE_DEVICES=GPU-3616e486-a6af-5b58-85d1-2d20eef367e2"',
            "Slice=numafleet.slice",
        ],
    ),
]


@pytest.mark.parametrize(
    ("host", "name", "lines"), EXPECTED_LINES, ids=[f"{h}:{n}" for h, n, dummy in EXPECTED_LINES]
)
def test_rendered_unit_lines(fleet, host, name, lines):
    text = _unit(fleet, host, name)
    for line in lines:
        assert line in text, f"{host} {name}: {line!r} missing from\n" + "\n".join(text)


NO_PLACEMENTS = ("mi300x-01", "power9-v100-01")
# Files of the hugepages and numa_kernel roles; everything else under a render root is pinned_units'.
HUGEPAGE_FILES = {
    "etc/numafleet/hugepages.json",
    f"{UNITS}/numafleet-hugepages.service",
    "usr/local/libexec/numafleet-hugepages",
}
KERNEL_FILES = {"etc/sysctl.d/60-numafleet-numa.conf", "etc/tmpfiles.d/numafleet-thp.conf"}


def test_every_host_has_a_manifest_of_what_it_owns(fleet):
    for host in fleet.hosts:
        if host in NO_PLACEMENTS:
            continue
        files = fleet.rendered[host]
        manifest = json.loads(files["etc/numafleet/manifest.json"])
        owned = sorted(path.lstrip("/") for path in manifest["files"])
        others = HUGEPAGE_FILES | KERNEL_FILES | {"etc/numafleet/manifest.json"}
        assert owned == sorted(p for p in files if p not in others), host


def test_hosts_without_placements_get_kernel_settings_only(fleet):
    for host in NO_PLACEMENTS:
        assert set(fleet.rendered[host]) <= KERNEL_FILES, host


def _pool(fleet, host: str, node: int, size_kb: int = 2048) -> int:
    path = (
        fleet.base
        / ".demo"
        / host
        / "sys"
        / "devices"
        / "system"
        / "node"
        / f"node{node}"
        / "hugepages"
        / f"hugepages-{size_kb}kB"
        / "nr_hugepages"
    )
    return int(path.read_text())


def test_hugepage_pools_are_the_plans_totals(fleet):
    """qemu-2node-01 plans 64 x 2 MiB pages on node 1 and none on node 0 (the tree had 16/48)."""
    assert (_pool(fleet, "qemu-2node-01", 0), _pool(fleet, "qemu-2node-01", 1)) == (0, 64)
    state = json.loads(fleet.rendered["qemu-2node-01"]["etc/numafleet/hugepages.json"])
    assert {(p["node"], p["size_kb"], p["count"]) for p in state["pools"]} == {
        (0, 2048, 0),
        (1, 2048, 64),
    }
    unit = fleet.rendered["qemu-2node-01"][f"{UNITS}/numafleet-hugepages.service"]
    assert "Before=sysinit.target" in unit and "WantedBy=sysinit.target" in unit


def test_kernel_knobs_are_set_and_persisted(fleet):
    proc = fleet.base / ".demo" / "qemu-2node-01" / "proc" / "sys"
    assert (proc / "kernel" / "numa_balancing").read_text().strip() == "0"  # bound placements
    assert (proc / "vm" / "zone_reclaim_mode").read_text().strip() == "0"
    sysctl = fleet.rendered["qemu-2node-01"]["etc/sysctl.d/60-numafleet-numa.conf"]
    assert "kernel.numa_balancing = 0" in sysctl and "vm.zone_reclaim_mode = 0" in sysctl
    thp = fleet.base / ".demo" / "qemu-2node-01" / "sys" / "kernel" / "mm" / "transparent_hugepage"
    assert "[madvise]" in (thp / "enabled").read_text()


def _edit_placement(inventory: Path, host: str, name: str, **changes) -> None:
    path = inventory / "host_vars" / f"{host}.yml"
    data = yaml.safe_load(path.read_text())
    for entry in data["numafleet_placements"]:
        if entry["name"] == name:
            entry.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_check_diff_shows_unit_diffs_and_writes_nothing(fleet):
    _edit_placement(fleet.inventory, "gpu-a100-01", "llm-70b", cpus=24)
    (fleet.root("gh200-01") / UNITS / "tritonserver.service.d" / "50-numafleet.conf").unlink()
    before = fleet.digests()
    run = ansible_playbook(REPO / "site.yml", fleet.inventory, "--check", "--diff")
    assert run.rc == 0, run.explain()
    assert fleet.digests() == before
    changed = sorted(host for host, stats in run.stats.items() if stats["changed"])
    assert changed == ["gh200-01", "gpu-a100-01"], run.stats

    a100 = json.dumps(run.one("gpu-a100-01", APPLY_TASK)["diff"])
    assert "CPUAffinity=32-39,96-103" in a100 and re.search(r"CPUAffinity=32-4\d,96-10\d", a100)
    assert "numafleet-llm-70b.service" in a100
    gh200 = json.dumps(run.one("gh200-01", APPLY_TASK)["diff"])
    assert "tritonserver.service.d/50-numafleet.conf" in gh200 and "CPUAffinity=2-33" in gh200


def test_removed_placement_is_stopped_and_removed(fleet):
    """After the check above: apply the edit, drop a placement; its unit leaves, the rest stays."""
    path = fleet.inventory / "host_vars" / "gpu-a100-01.yml"
    data = yaml.safe_load(path.read_text())
    data["numafleet_placements"] = [
        p for p in data["numafleet_placements"] if p["name"] != "rerank-b"
    ]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run = ansible_playbook(REPO / "site.yml", fleet.inventory, "--limit", "gpu-a100-01")
    assert run.rc == 0, run.explain()
    files = read_tree(fleet.root("gpu-a100-01"))
    assert f"{UNITS}/numafleet-rerank-b.service" not in files
    assert f"{UNITS}/numafleet-rerank-a.service" in files
    would_run = run.one("gpu-a100-01", WOULD_RUN_TASK)["msg"]
    assert "would run: systemctl disable --now numafleet-rerank-b.service" in would_run
    assert "would run: systemctl restart numafleet-llm-70b.service" in would_run
    manifest = json.loads(files["etc/numafleet/manifest.json"])
    assert "/etc/systemd/system/numafleet-rerank-b.service" not in manifest["files"]
