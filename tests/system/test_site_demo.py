"""site.yml on a fresh scratch copy of the demo fleet: succeeds, is idempotent, check mode is clean.

The demo inventory is copied to <tmp>/inventories/demo and the trees are materialised to
<tmp>/.demo, so the inventory's own `demo_root` ({{ inventory_dir }}/../../.demo/<host>)
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
APPLY_TASK = "Apply the placements"
SUMMARY_TASK = "Print the plan summary"
WOULD_RUN_TASK = "Report what would run (render mode)"
LAYERS = ["hugepages", "kernel", "mig", "mps", "units"]
MIG_GPU = "0000:17:00.0"
MIG_DEVICE_2G = "MIG-4d5fc52b-3870-57b6-a399-78174c05bf0a"  # the kept 2g.20gb at slice 0
MPS_GPU = "GPU-fdb5df64-11ce-5c72-a560-9702875cecd6"  # 0000:31:00.0, shared by two rerankers


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
    # Besides the memory guard's files (its role), one changed task, the apply, whose five layers
    # all changed something: pools, kernel knobs, MIG files, MPS units, pinned units.
    changed = [r for r in run.results("gpu-a100-01") if r.get("changed")]
    applied = [r["action"] for r in changed if not r["task"].startswith(GUARD_ROLE)]
    assert applied == ["numafleet.tuning.host_apply"], applied
    guard = {r["task"][len(GUARD_ROLE) :] for r in changed if r["task"].startswith(GUARD_ROLE)}
    assert {"Write the guard configuration", "Write the guard service"} <= guard, guard
    assert guard <= GUARD_WRITES, guard
    layers = run.one("gpu-a100-01", APPLY_TASK)["layers"]
    assert [name for name in LAYERS if layers[name]["changed"]] == LAYERS, layers


def test_second_run_changes_nothing(fleet):
    run = fleet.second
    assert run.rc == 0, run.explain()
    changed = {host: stats["changed"] for host, stats in run.stats.items()}
    assert changed == dict.fromkeys(fleet.hosts, 0), changed
    # Only the recorded MIG GPU's actions are still named (render mode never changes it).
    for result in run.results(task=WOULD_RUN_TASK):
        lines = result.get("msg") or []
        assert not [line for line in lines if "systemctl" in line], (result["host"], lines)


GUARD_ROLE = "numafleet.tuning.memory_guard : "
GUARD_WRITES = {
    "Create the program, configuration and unit directories",
    "Copy the program modules",
    "Write the package's __init__.py",
    "Copy the launcher",
    "Write the guard configuration",
    "Write the guard configuration for the plan made again",
    "Create the textfile collector directory",
    "Write the guard service",
}
GUARD_MODULES = {
    "ansible.builtin.file",
    "ansible.builtin.copy",
    "ansible.builtin.template",
    "ansible.builtin.stat",
    "ansible.builtin.validate_argument_spec",
}


# Actions that run on the controller only (cheap); everything else is a module sent to the host.
CONTROLLER_SIDE = {
    "numafleet.tuning.numa_plan",
    "numafleet.tuning.host_vars_check",
    "ansible.builtin.include_tasks",
    "ansible.builtin.include_role",
    "ansible.builtin.assert",
    "ansible.builtin.debug",
    "ansible.builtin.fail",
    "ansible.builtin.set_fact",
}


def test_modules_run_once_per_role_per_host(fleet):
    """Fleet cost: one facts module and one apply module; the rest stays on the controller.

    The GPU layers run only on hosts with something to do: gpu where GPU settings are declared,
    MIG where a GPU is in MIG mode or a
    layout is declared (or an earlier run recorded one), MPS where MPS daemons are planned (or an
    earlier run installed some). This fresh fleet has no earlier state.
    """
    with_gpu_roles = {}
    for host in fleet.hosts:
        # The recorded NVIDIA GPU state of the host (none: no NVIDIA GPU) and its host_vars.
        snapshot = fleet.base / ".demo" / host / "gpu-snapshot.json"
        gpus = json.loads(snapshot.read_text())["gpus"] if snapshot.is_file() else []
        host_vars = fleet.base / "inventories" / "demo" / "host_vars" / f"{host}.yml"
        declared = yaml.safe_load(host_vars.read_text()) if host_vars.is_file() else {}
        in_mig = any(
            "enabled"
            in ((g.get("mig") or {}).get("mode_current"), (g.get("mig") or {}).get("mode_pending"))
            for g in gpus
        )
        gpu_layers = ["gpu"] if declared.get("numafleet_gpu_settings") else []
        nvidia = [
            entry
            for entry in declared.get("numafleet_gpu_partitions") or []
            if not {"compute_partition", "memory_partition"} & set(entry)
        ]
        if in_mig or declared.get("numafleet_mig_gpus") or nvidia:
            gpu_layers.append("mig")
        if any("mps" in p for p in declared.get("numafleet_placements", [])):
            gpu_layers.append("mps")
        # The amd layer runs where the plan has AMD GPUs (plan key amd_partitions).
        if any(
            {"compute_partition", "memory_partition"} & set(entry)
            for entry in declared.get("numafleet_gpu_partitions") or []
        ):
            gpu_layers.append("amd")
        with_gpu_roles[host] = gpu_layers
        ran = [
            r["action"]
            for r in fleet.first.results(host)
            if r["status"] != "skipped" and not r["task"].startswith(GUARD_ROLE)
        ]
        remote = sorted(a for a in ran if a not in CONTROLLER_SIDE)
        # The memory guard's role (before the apply) only writes files in render mode.
        guard = {
            r["action"]
            for r in fleet.first.results(host)
            if r["status"] != "skipped" and r["task"].startswith(GUARD_ROLE)
        }
        assert guard - CONTROLLER_SIDE <= GUARD_MODULES, (host, sorted(guard))
        assert remote == ["numafleet.tuning.host_apply", "numafleet.tuning.numa_facts"], (
            host,
            ran,
        )
        layers = fleet.first.one(host, APPLY_TASK)["layers"]
        every = ["hugepages", "kernel", "gpu", "amd", "mig", "mps", "units"]
        # The results come back as JSON with sorted keys: compare the sets of layers.
        assert sorted(layers) == sorted(
            name for name in every if name not in ("gpu", "amd", "mig", "mps") or name in gpu_layers
        ), (host, list(layers))
    # The demo fleet has both kinds: the MIG and MPS server gets the GPU modules, the others not
    # (gpu-h100-01 has MIG-capable GPUs, none in MIG mode and no layout declared; it declares
    # GPU settings).
    assert with_gpu_roles["gpu-a100-01"] == ["mig", "mps"]
    assert with_gpu_roles["gpu-h100-01"] == ["gpu"] and with_gpu_roles["qemu-2node-01"] == []
    assert with_gpu_roles["mi300x-01"] == ["amd"]


def test_one_summary_line_per_host(fleet):
    for host in fleet.hosts:
        line = fleet.first.one(host, SUMMARY_TASK)["msg"]
        assert isinstance(line, str) and "\n" not in line
        assert line.startswith(f"{host}: "), line
    # The plan before the gate: classify waits for the 1g.10gb the run creates.
    planned = fleet.first.one("gpu-a100-01", "Plan placements")["summary"]
    assert (
        "classify node0 cpus 9,73 gpus 17:00.0 mig 1g.10gb@2 (waits for MIG instance 1g.10gb "
        "at slice 2 of GPU 0000:17:00.0: created in this run);"
    ) in planned
    assert planned.endswith(
        "rerank-mini-a node0 cpus 10,74 gpus 17:00.0 mig 2g.20gb@0 mps; 1 warning; "
        "changes: 6 added; 7 started, 1 waiting for a MIG instance, 2 slices written, "
        "1 MIG layout to change"
    )
    # The line after the apply: the plan made again once the instance exists (in the recording).
    a100 = fleet.first.one("gpu-a100-01", SUMMARY_TASK)["msg"]
    assert a100.startswith("gpu-a100-01: 6 placements: llm-70b node1 ")
    assert "classify node0 cpus 9,73 gpus 17:00.0 mig 1g.10gb@2;" in a100
    assert a100.endswith(
        "rerank-mini-a node0 cpus 10,74 gpus 17:00.0 mig 2g.20gb@0 mps; re-planned after the MIG "
        "layout changed; 1 started once its MIG instance existed (classify)"
    )
    vm = fleet.first.one("vm-gpu-01", SUMMARY_TASK)["msg"]
    assert vm.endswith("; 1 warning; changes: 2 added; 2 started"), vm
    # the second run: nothing changes (the MIG GPU is a recording: render mode never changes it)
    again = fleet.second.one("vm-gpu-01", SUMMARY_TASK)["msg"]
    assert again.endswith("; 1 warning; no change"), again


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


NO_PLACEMENTS = ("power9-v100-01",)
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
        others = (
            HUGEPAGE_FILES
            | KERNEL_FILES
            | {
                "etc/numafleet/manifest.json",
                "etc/numafleet/plan.json",  # the recorded plan: never removed, so not listed
            }
        )
        # The GPU roles own their files themselves (MPS: its own manifest; MIG and AMD
        # partitions: fixed paths).
        gpu_files = {
            p
            for p in files
            if "nvidia-mps@" in p
            or "mig" in p.rsplit("/", 1)[-1]
            or "amd-partition" in p.rsplit("/", 1)[-1]
            or p.endswith("mps-units.json")
        }
        # Render mode's recordings of the MPS daemons and MIG layouts (docs/architecture.md,
        # "Render mode and the demo fleet"): the running state of the rendered host, not files
        # site.yml installs.
        gpu_files |= {p for p in files if p.startswith("var/lib/numafleet/render/")}
        # The memory guard's role owns its files at fixed paths (roles/memory_guard).
        guard_files = {
            p
            for p in files
            if p.startswith(("usr/local/lib/numafleet-guard/", "usr/local/sbin/numafleet-guard"))
            or p in ("etc/numafleet/guard.json", f"{UNITS}/numafleet-guard.service")
        }
        assert "etc/numafleet/guard.json" in guard_files, host
        assert owned == sorted(p for p in files if p not in others | gpu_files | guard_files), host
        if gpu_files:
            mps = json.loads(files.get("etc/numafleet/mps-units.json", '{"files": []}'))
            mps_owned = {path.lstrip("/") for path in mps["files"]}
            assert {p for p in gpu_files if "nvidia-mps@" in p} == mps_owned, host


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

    a100 = json.dumps(run.one("gpu-a100-01", APPLY_TASK)["layers"]["units"]["diff"])
    assert "CPUAffinity=32-39,96-103" in a100 and re.search(r"CPUAffinity=32-4\d,96-10\d", a100)
    assert "numafleet-llm-70b.service" in a100
    gh200 = json.dumps(run.one("gh200-01", APPLY_TASK)["layers"]["units"]["diff"])
    assert "tritonserver.service.d/50-numafleet.conf" in gh200 and "CPUAffinity=2-33" in gh200
    # The first apply made the planned MIG layout in the recorded GPU snapshot: no GI/CI diff.
    mig = run.one("gpu-a100-01", APPLY_TASK)["layers"]["mig"]
    assert not [d for d in mig["diff"] if d["before_header"] == f"GPU {MIG_GPU}"], mig["diff"]


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


# ---------------------------------------------------------------------------------------------
# GPU roles: MIG layouts and MPS daemons (render mode: nothing runs on a GPU or systemd)


def test_mig_layout_is_recorded_for_boot_and_mig_parted(fleet):
    files = fleet.rendered["gpu-a100-01"]
    state = json.loads(files["etc/numafleet/mig.json"])
    (gpu,) = state["gpus"]
    assert gpu["address"] == MIG_GPU and gpu["mode"] == "enabled"
    assert [(e["profile"], e["start"]) for e in gpu["layout"]] == [
        ("2g.20gb", 0),
        ("1g.10gb", 2),
        ("1g.10gb", 3),
        ("3g.40gb", 4),
    ]
    parted = yaml.safe_load(files["etc/numafleet/mig-parted.yaml"])
    (config,) = parted["mig-configs"]["numafleet"]
    assert config["mig-enabled"] is True
    assert config["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    unit = files[f"{UNITS}/numafleet-mig.service"]
    assert "Type=oneshot" in unit and "etc/numafleet/mig.json" in unit
    assert "usr/local/libexec/numafleet-mig" in files
    # Hosts whose MIG-capable GPUs nobody declared get no MIG files at all.
    for host in ("gpu-h100-01", "gh200-01", "qemu-2node-01"):
        mig_files = [
            path
            for path in fleet.rendered[host]
            if "mig" in path and not path.startswith("usr/local/lib/numafleet-guard/")
        ]  # the memory guard's guard_migrate.py is about pages, not MIG
        assert not mig_files, host


def _mig_lines(lines: list) -> list:
    """The MIG layer's part of the apply's would-run lines."""
    return [line for line in lines if "nvidia-smi mig" in line or "numafleet-mig" in line]


def test_mig_changes_are_reported_not_run_in_render_mode(fleet):
    msg = _mig_lines(fleet.first.one("gpu-a100-01", WOULD_RUN_TASK)["msg"])
    # GI 4 (the 2g.20gb at slice 2) goes, CIs first; two 1g.10gb (profile 19 on A100 80GB) come.
    assert msg[:6] == [
        f"would run: nvidia-smi mig -i {MIG_GPU} -dci -gi 4 -ci 0",
        f"would run: nvidia-smi mig -i {MIG_GPU} -dgi -gi 4",
        f"would run: nvidia-smi mig -i {MIG_GPU} -cgi 19:2",
        f"would run: nvidia-smi mig -i {MIG_GPU} -cci 0 -gi <new>",
        f"would run: nvidia-smi mig -i {MIG_GPU} -cgi 19:3",
        f"would run: nvidia-smi mig -i {MIG_GPU} -cci 0 -gi <new>",
    ]
    assert "would run: systemctl enable numafleet-mig.service" in msg
    # The first run wrote the change into the recorded GPU snapshot (render mode keeps the
    # recording a consistent kernel), so the second run has no GPU action left.
    second = _mig_lines(fleet.second.one("gpu-a100-01", WOULD_RUN_TASK).get("msg") or [])
    assert second == []


def test_mps_daemons_are_rendered_with_their_clients(fleet):
    files = fleet.rendered["gpu-a100-01"]
    template = files[f"{UNITS}/nvidia-mps@.service"]
    assert 'Environment="CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/%i"' in template
    assert "RuntimeDirectoryMode=0700" in template
    whole = files[f"{UNITS}/nvidia-mps@{MPS_GPU}.service.d/50-numafleet.conf"].splitlines()
    for line in (
        "User=tei",
        "NUMAPolicy=bind",
        "NUMAMask=0",
        "AllowedMemoryNodes=0",
        "ExecStartPre=+/usr/bin/nvidia-smi -i 0000:31:00.0 -c EXCLUSIVE_PROCESS",
    ):
        assert line in whole, (line, whole)
    assert any("set_default_active_thread_percentage 50" in line for line in whole)
    assert any("set_default_device_pinned_mem_limit 0 16384M" in line for line in whole)
    mig = files[f"{UNITS}/nvidia-mps@{MIG_DEVICE_2G}.service.d/50-numafleet.conf"]
    # pinned to the node of its GPU (node 0's online CPUs), not to its one client's CPUs
    assert "EXCLUSIVE_PROCESS" not in mig and "CPUAffinity=0-31,64-95" in mig
    assert "CPUAffinity=0-31,64-95" in "\n".join(whole)
    client = _unit(fleet, "gpu-a100-01", "numafleet-rerank-mini-a.service")
    assert f"Requires=nvidia-mps@{MIG_DEVICE_2G}.service" in client
    assert f"After=nvidia-mps@{MIG_DEVICE_2G}.service" in client
    assert "After=numafleet-mig.service" in client
    assert f'Environment="CUDA_VISIBLE_DEVICES={MIG_DEVICE_2G}"' in client
    msg = fleet.first.one("gpu-a100-01", WOULD_RUN_TASK)["msg"]
    assert f"would run: systemctl enable --now nvidia-mps@{MPS_GPU}.service" in msg


CLASSIFY_WAITS = (
    "numafleet-classify.service: not started, waits for MIG instance 1g.10gb at slice 2 of GPU "
    "0000:17:00.0: created in this run; enabled and started once it exists"
)


def test_client_of_a_mig_instance_made_in_the_run_is_started_after_the_replan(fleet):
    """classify's 1g.10gb does not exist on the recorded GPU: the plan before the gate says it
    waits; the MIG layer creates it in the recording (render mode), host_apply re-plans and
    starts classify with the new instance in the same run; the second run has nothing waiting."""
    plan = fleet.first.one("gpu-a100-01", "Plan placements")
    assert any("classify" in w and "does not exist yet" in w for w in plan["warnings"])
    # The change plan (before the gate) says it waits, and does not count it as started.
    (shown,) = fleet.first.results("gpu-a100-01", "Show the change plan")
    assert (
        "  + add     classify: node0 cpus 9,73 gpus 17:00.0 mig 1g.10gb@2 (waits for MIG "
        "instance 1g.10gb at slice 2 of GPU 0000:17:00.0: created in this run)"
    ) in shown["msg"]
    assert f"  {CLASSIFY_WAITS}" in shown["msg"]
    # The recording has the instance now, marked rendered, with a synthetic MIG-device UUID ...
    snapshot = json.loads((fleet.base / ".demo/gpu-a100-01/gpu-snapshot.json").read_text())
    (gpu,) = [g for g in snapshot["gpus"] if g["address"] == "0000:17:00.0"]
    (made,) = [gi for gi in gpu["mig"]["gpu_instances"] if gi["placement_start"] == 2]
    assert (made["profile_name"], made["rendered"]) == ("1g.10gb", True)
    device = made["mig_device_uuid"]
    # ... which the unit gets, and classify is started in the same run.
    unit = _unit(fleet, "gpu-a100-01", "numafleet-classify.service")
    assert "After=numafleet-mig.service" in unit
    assert [line for line in unit if "CUDA_VISIBLE_DEVICES" in line] == [
        f'Environment="CUDA_VISIBLE_DEVICES={device}"'
    ]
    msg = fleet.first.one("gpu-a100-01", WOULD_RUN_TASK)["msg"]
    assert "would run: systemctl enable --now numafleet-classify.service" in msg
    assert not [line for line in msg if "waits for MIG instance" in line], msg
    applied = fleet.first.one("gpu-a100-01", APPLY_TASK)
    assert applied["layers"]["units"]["waiting"] == []
    units = fleet.second.one("gpu-a100-01", APPLY_TASK)["layers"]["units"]
    assert units["changed"] is False and units["waiting"] == []
    # the recorded plan says so too (the next run's change plan compares with it)
    recorded = json.loads((fleet.root("gpu-a100-01") / "etc/numafleet/plan.json").read_text())
    (entry,) = [p for p in recorded["placements"] if p["name"] == "classify"]
    assert entry["waits_for"] is None
