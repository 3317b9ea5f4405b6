"""Topology field cases: contradictory vNUMA, locality from a local_cpulist subset,
the sub-NUMA clustering hint and the kernel release, on real dumps edited to each case
(tests/unit/fixtures/field_cases.py) and on the golden facts of the unedited dumps."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import field_cases
import pytest
import trees
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    gpu,
    gpu_snapshot,
    hugepages,
    osrelease,
    packages,
    pci,
    topology,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.capture import (
    plan_capture,
    write_capture,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import PlanError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import plan_host
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.summary import (
    summarize_topology,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

SYSFS = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs"
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}
G1 = 1048576


def golden(machine: str) -> dict:
    return json.loads((SYSFS / f"{machine}.numa.json").read_text(encoding="utf-8"))


def facts_of(root: str) -> dict:
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    return json.loads(json.dumps(read_numa_facts(reader)))


def gpus_of(root: str, machine: str) -> dict:
    snapshot = trees.GPU_SNAPSHOT_DIR / f"{machine}.json"
    state = (
        gpu_snapshot.read_snapshot(str(snapshot))
        if snapshot.is_file()
        else gpu.nvml_unavailable("no snapshot in the fixtures")
    )
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    return json.loads(json.dumps(gpu.read_gpu_topology(reader, state)))


def crossed(facts: dict) -> list:
    return [f for f in facts["consistency"] if f["kind"] == "nodes_cross_packages"]


def place(numa, gpus, placements) -> dict:
    return plan_host("h", numa, gpus, placements, [], POLICY)


# ---------------------------------------------------------------------------------------------
# 1. Contradictory virtual NUMA


def test_qemu_guest_with_sockets_across_nodes_is_a_finding(fixture_root):
    root = fixture_root("qemu-2node-pxb", writable=True)
    field_cases.qemu_vnuma_crossed(root)
    facts = facts_of(root)
    (finding,) = crossed(facts)
    assert (finding["nodes"], finding["packages"], finding["cpus"]) == (
        [0, 1],
        [0, 1],
        [0, 1, 2, 3],
    )
    assert finding["message"].startswith(
        "NUMA nodes 0, 1 and packages 0, 1 cut across each other (package 0 holds nodes 0, 1; "
        "package 1 holds nodes 0, 1; node 0 holds CPUs of packages 0, 1; node 1 holds CPUs of "
        "packages 0, 1)"
    )
    assert "the SMT siblings of CPUs 0-3 are not trusted" in finding["message"]
    # a crossed layout is not sub-NUMA clustering, although each package holds two nodes
    assert (facts["nodes_per_package"], facts["snc_like"]) == (2, False)


@pytest.mark.parametrize(
    "machine",
    [
        "qemu-2node-pxb",  # one package per node
        "16em64t-4s2c2t-offlines",  # one node over four sockets (no NUMA): one direction only
        "48amd64-4pa2n6c-sparse",  # two nodes in each package (Magny-Cours): one direction only
        "128arm-2pa2n8cluster4co",
        "synthetic-epyc-nps4",
    ],
)
def test_aligned_or_one_way_layouts_are_no_finding(machine):
    assert crossed(golden(machine)) == []


def test_power9_striped_packages_plan_one_cpu_per_core(fixture_root):
    machine = "nvidiagpunumanodes"
    plain = golden(machine)
    gpus = None
    # the dump as recorded: SMT4 siblings make whole cores, a 1-CPU placement gets a core
    before = place(plain, gpus, [{"name": "a", "exec": "/bin/a", "cpus": 1}])
    assert before["placements"][0]["cpus"] == [0, 1, 2, 3]
    assert not any("cut across" in w for w in before["warnings"])

    root = fixture_root(machine, writable=True)
    field_cases.power9_vnuma_crossed(root)
    numa = facts_of(root)
    (finding,) = crossed(numa)
    assert (finding["nodes"], finding["packages"]) == ([0, 8], [0, 8])
    assert [p["cpus"] for p in numa["packages"]] == [
        [*range(8), *range(88, 96)],
        [*range(8, 16), *range(96, 104)],
    ]
    placements = [
        {"name": "a", "exec": "/bin/a", "cpus": 1},
        {"name": "b", "exec": "/bin/b", "cpus": 2},
        {"name": "c", "exec": "/bin/c", "cpus": 3, "node": 8},
    ]
    result = place(numa, gpus, placements)
    got = {entry["name"]: entry["cpus"] for entry in result["placements"]}
    # each CPU is a core of its own: exactly the CPUs asked for, lowest first, SMT siblings
    # 0-3 shared between a and b
    assert got == {"a": [0], "b": [1, 2], "c": [88, 89, 90]}
    assert result["warnings"][0] == (
        "facts: NUMA nodes 0, 8 and packages 0, 8 cut across each other (finding "
        "nodes_cross_packages): the SMT sibling lists of their CPUs are not trusted, each CPU of "
        "nodes 0, 8 is planned as a core of its own, so a placement there may share a physical "
        "core with another"
    )


def test_planner_keeps_whole_cores_on_nodes_outside_the_finding(fixture_root):
    numa = golden("nvidiagpunumanodes")
    # a finding naming node 0 only: node 8 keeps its SMT4 cores
    numa["consistency"].append(
        {"kind": "nodes_cross_packages", "cpus": [], "nodes": [0], "packages": [0], "message": "x"}
    )
    placements = [
        {"name": "a", "exec": "/bin/a", "cpus": 1, "node": 0},
        {"name": "b", "exec": "/bin/b", "cpus": 1, "node": 8},
    ]
    result = place(numa, None, placements)
    got = {entry["name"]: entry["cpus"] for entry in result["placements"]}
    assert got == {"a": [0], "b": [88, 89, 90, 91]}


@pytest.mark.parametrize(
    ("layout", "want"),
    [
        ({0: [0], 1: [1]}, []),  # one node per package
        ({0: [0, 1]}, []),  # SNC: one package, two nodes
        ({0: [0], 1: [0]}, []),  # one node over two sockets
        ({0: [0, 1], 1: [1]}, [([0, 1], [0, 1])]),  # package 0 spans, node 1 spans
        ({0: [0, 1], 1: [1, 2], 2: [3]}, [([0, 1, 2], [0, 1])]),  # a chain; node 3 stays out
        ({0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}, [([0, 1], [0, 1]), ([2, 3], [2, 3])]),
    ],
)
def test_cross_findings_name_the_tangled_nodes_and_packages(layout, want):
    pkgs = [{"id": pid, "cpus": [pid], "nodes": nodes} for pid, nodes in layout.items()]
    got = [(f["nodes"], f["packages"]) for f in packages.cross_findings(pkgs)]
    assert got == want


# ---------------------------------------------------------------------------------------------
# 2. Locality from a local_cpulist that is a proper subset of one node's CPUs


def test_real_nvme_with_local_cpus_inside_node0_is_inferred():
    # hwloc's 32em64t dump as recorded: NVMe 00:02.0 has numa_node -1, local_cpulist 0-3 of
    # node 0's 0-7
    (nvme,) = [
        d
        for d in golden("32em64t-2n8c+dax+nvme+mic+dimms")["pci_devices"]
        if d["address"] == "0000:00:02.0"
    ]
    assert (nvme["numa_node_raw"], nvme["numa_node"], nvme["local_cpus"]) == (
        -1,
        None,
        [0, 1, 2, 3],
    )
    assert (nvme["node"], nvme["node_source"]) == (0, "local_cpulist_subset")


def test_qemu_device_keeps_raw_numa_node_and_infers_from_a_subset(fixture_root):
    root = fixture_root("qemu-2node-pxb", writable=True)
    old = field_cases.pci_local_subset(root, "0000:81:00.0", "3", "8")
    assert old == {"numa_node": "1", "local_cpulist": "2-3", "local_cpus": "c"}
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    devices = {d.address: d for d in pci.read_pci_devices(reader, {0: (0, 1), 1: (2, 3)})}
    display = devices["0000:81:00.0"]
    assert (display.numa_node_raw, display.numa_node) == (-1, None)
    assert (display.node, display.node_source) == (1, "local_cpulist_subset")
    # the root-bus devices list all CPUs: in no one node, still unknown
    blk = devices["0000:00:01.0"]
    assert (blk.numa_node_raw, blk.node, blk.node_source) == (-1, None, None)
    # the root port above it still says node 1 itself
    port = devices["0000:80:00.0"]
    assert (port.numa_node_raw, port.node_source) == (1, "numa_node")


def test_raw_numa_node_is_none_without_the_file_and_kept_for_a_missing_node(fixture_root):
    root = fixture_root("qemu-2node-pxb", writable=True)
    base = Path(root) / "sys" / "bus" / "pci" / "devices"
    (base / "0000:00:01.0" / "numa_node").resolve().unlink()
    (base / "0000:81:00.0" / "numa_node").resolve().write_text("5\n")
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    devices = {d.address: d for d in pci.read_pci_devices(reader, {0: (0, 1), 1: (2, 3)})}
    assert devices["0000:00:01.0"].numa_node_raw is None
    gone = devices["0000:81:00.0"]
    assert (gone.numa_node_raw, gone.numa_node, gone.node, gone.node_source) == (
        5,
        None,
        1,
        "local_cpulist",
    )


@pytest.mark.parametrize(
    ("local", "want"),
    [
        ((2,), (1, "local_cpulist_subset")),
        ((2, 3), (1, "local_cpulist")),
        ((0, 1, 2, 3), (None, None)),
        ((1, 2), (None, None)),
        ((), (None, None)),
        ((9,), (None, None)),
    ],
)
def test_infer_node(local, want):
    assert pci.infer_node(None, local, {0: (0, 1), 1: (2, 3), 2: ()}) == want


def test_overlapping_node_lists_infer_nothing():
    # garbage facts where two nodes claim CPU 2: a subset of both is no single node
    assert pci.infer_node(None, (2,), {0: (1, 2), 1: (2, 3)}) == (None, None)


def test_gpu_with_local_subset_is_placed_on_its_node(fixture_root):
    machine = "synthetic-vm-gpu-numa-unknown"
    root = fixture_root(machine, writable=True)
    field_cases.pci_local_subset(root, "0000:06:00.0", "0-1", "03")
    numa, gpus = facts_of(root), gpus_of(root, machine)
    (a10,) = [g for g in gpus["gpus"] if g["address"] == "0000:06:00.0"]
    assert (a10["node"], a10["node_source"]) == (0, "local_cpulist_subset")
    result = place(
        numa, gpus, [{"name": "g", "exec": "/bin/g", "user": "g", "cpus": 2, "gpus": ["06:00.0"]}]
    )
    (entry,) = result["placements"]
    assert (entry["node"], entry["gpus"][0]["node"]) == (0, 0)
    assert result["warnings"] == []  # recorded: "unknown NUMA locality ... by CPU/memory fit"
    near = place(numa, gpus, [{"name": "d", "exec": "/bin/d", "cpus": 2, "near": "06:00.0"}])
    assert near["placements"][0]["near"] == {"address": "0000:06:00.0", "kind": "gpu", "node": 0}


def test_gpu_with_all_cpus_local_stays_unknown_for_near():
    numa = golden("synthetic-vm-gpu-numa-unknown")
    with pytest.raises(PlanError, match="06:00.0 has unknown NUMA locality"):
        place(numa, None, [{"name": "d", "exec": "/bin/d", "cpus": 2, "near": "06:00.0"}])


# ---------------------------------------------------------------------------------------------
# 3. Sub-NUMA clustering hint


@pytest.mark.parametrize(
    ("machine", "per_package", "snc"),
    [
        ("synthetic-epyc-nps4", 4, True),  # NPS4: four nodes in one package
        ("128arm-2pa2n8cluster4co", 2, True),  # Kunpeng 920: two dies (nodes) per package
        ("48amd64-4pa2n6c-sparse", 2, True),  # Magny-Cours: two dies per package
        ("qemu-2node-pxb", 1, False),
        ("16em64t-4s2c2t-offlines", 1, False),  # four packages, one node
        ("synthetic-gh200", 1, False),  # CPU-less HBM nodes are in no package
    ],
)
def test_nodes_per_package_and_snc_like(machine, per_package, snc):
    facts = golden(machine)
    assert (facts["nodes_per_package"], facts["snc_like"]) == (per_package, snc)


def test_packages_that_disagree_give_a_map():
    pkgs = [
        {"id": 0, "cpus": [0, 1], "nodes": [0, 1]},
        {"id": 1, "cpus": [2], "nodes": [2]},
    ]
    assert packages.package_layout(pkgs) == {
        "nodes_per_package": {"0": 2, "1": 1},
        "snc_like": True,
    }
    assert packages.package_layout([]) == {"nodes_per_package": None, "snc_like": False}


def test_summary_shows_the_snc_hint_and_the_kernel():
    line = summarize_topology(golden("128arm-2pa2n8cluster4co"))
    assert " | snc-like 2 nodes/package | " in line
    assert " | kernel 5.15.0-rc1-00005-g4c1b4a4d90b6-dirty | " in line
    assert "snc-like" not in summarize_topology(golden("qemu-2node-pxb"))
    assert "kernel" not in summarize_topology(golden("qemu-2node-pxb"))
    odd = dict(golden("48amd64-4pa2n6c-sparse"), nodes_per_package={"0": 2, "3": 1})
    assert " | snc-like nodes/package p0:2,p3:1 | " in summarize_topology(odd)


# ---------------------------------------------------------------------------------------------
# 4. Kernel release, and boot-time hugepages rendered from a capture


@pytest.mark.parametrize(
    ("machine", "release", "source"),
    [
        ("128arm-2pa2n8cluster4co", "5.15.0-rc1-00005-g4c1b4a4d90b6-dirty", "/proc/version"),
        ("nvidiagpunumanodes", "4.14.0-49.el7a.bz1553205.page_fault_hang.ppc64le", "/proc/version"),
        ("fakeheteromemtiers", "5.18.0-rc4", "/proc/version"),
        ("qemu-2node-pxb", None, None),  # the capture script did not copy it
        ("synthetic-epyc-nps4", None, None),
    ],
)
def test_osrelease_of_the_recorded_dumps(machine, release, source):
    kernel = golden(machine)["kernel"]
    assert (kernel["osrelease"], kernel["osrelease_source"]) == (release, source)


def test_osrelease_file_wins_over_proc_version(fixture_root):
    root = fixture_root("128arm-2pa2n8cluster4co", writable=True)
    field_cases.add_osrelease(root, "6.8.0-31-generic")
    kernel = facts_of(root)["kernel"]
    assert (kernel["osrelease"], kernel["osrelease_source"]) == (
        "6.8.0-31-generic",
        "/proc/sys/kernel/osrelease",
    )


@pytest.mark.parametrize("text", ["\x00\x00", "", "not a release", "6.1 garbage"])
def test_malformed_osrelease_is_a_warning(fixture_root, text):
    root = fixture_root("qemu-2node-pxb", writable=True)
    path = field_cases.add_osrelease(root, "x")
    Path(path).write_text(text)
    facts = facts_of(root)
    assert facts["kernel"]["osrelease"] is None
    assert [w["path"] for w in facts["warnings"]] == [path]


def _capture(root: str, dest_dir: Path) -> str:
    """Capture ``root`` as topology_capture does, unpack it; the unpacked fsroot."""
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    read_numa_facts(reader)
    gpu.read_gpus(reader, topology.read_node_cpus(reader))
    tarball = str(dest_dir / "capture.tar.gz")
    write_capture(plan_capture(reader), tarball, "host")
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
        archive.extractall(dest_dir, filter="data")
    return str(dest_dir / "host"), names


@pytest.mark.parametrize(
    ("machine", "release", "recorded", "size_kb", "size"),
    [
        # the guest's release from its README, written where the kernel keeps it
        ("qemu-2node-pxb", "6.1.0-50-amd64", "host/proc/sys/kernel/osrelease", G1, "1G"),
        # hwloc's dump as recorded: only /proc/version names the release (2 MiB pools only)
        ("fakeheteromemtiers", None, "host/proc/version", 2048, "2M"),
    ],
)
def test_boot_reservation_renders_from_a_capture(
    fixture_root, tmp_path, machine, release, recorded, size_kb, size
):
    root = fixture_root(machine, writable=True)
    if release:
        field_cases.add_osrelease(root, release)
    captured, names = _capture(root, tmp_path)
    assert recorded in names
    render = tmp_path / "render"
    render.mkdir()
    node = facts_of(captured)["nodes"][0]["id"]
    result = hugepages.plan_hugepages(
        [{"node": node, "size_kb": size_kb, "count": 1}],
        sysfs_root=os.path.join(captured, "sys"),
        procfs_root=os.path.join(captured, "proc"),
        root=str(render),
        boot_reserve_sizes_kb=[size_kb],
        bootloader="grub_d",
    )
    assert result.kernel_args == (f"hugepagesz={size}", f"hugepages={node}:1")
    (grub,) = [c for c in result.files if c.path == hugepages.GRUB_PATH]
    assert grub.state == "create" and f"hugepagesz={size} hugepages={node}:1" in grub.after


@pytest.mark.parametrize(
    ("machine", "fragment"),
    [
        # Kunpeng dump: 5.15 from /proc/version, too old for per-node boot reservations
        ("128arm-2pa2n8cluster4co", "the kernel is 5.15, and per-node boot reservations"),
        # synthetic demo trees record no release: a message naming both files, no traceback
        ("synthetic-epyc-nps4", "sys/kernel/osrelease: missing (and so is"),
    ],
)
def test_boot_reservation_from_a_tree_without_a_usable_release(
    fixture_root, tmp_path, machine, fragment
):
    root = fixture_root(machine)
    node = golden(machine)["nodes"][0]["id"]
    with pytest.raises(hugepages.HugepageError) as err:
        hugepages.plan_hugepages(
            [{"node": node, "size_kb": G1, "count": 1}],
            sysfs_root=os.path.join(root, "sys"),
            procfs_root=os.path.join(root, "proc"),
            root=str(tmp_path),
            boot_reserve_sizes_kb=[G1],
            bootloader="grub_d",
        )
    assert fragment in str(err.value)
    assert "boot_reserve_sizes_kb" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Garbage in: the new fields never raise


_ints = st.one_of(st.integers(-3, 9), st.booleans(), st.none(), st.text(max_size=2))
_entry = st.one_of(
    st.fixed_dictionaries(
        {
            "id": _ints,
            "cpus": st.one_of(st.lists(_ints, max_size=4), st.none(), st.text(max_size=2)),
            "nodes": st.one_of(st.lists(_ints, max_size=4), st.none(), st.integers()),
        }
    ),
    st.none(),
    st.integers(),
    st.text(max_size=3),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(pkgs=st.one_of(st.lists(_entry, max_size=6), st.none(), st.text(max_size=3)))
def test_package_functions_take_any_input(pkgs):
    layout = packages.package_layout(pkgs)
    assert set(layout) == {"nodes_per_package", "snc_like"}
    findings = packages.cross_findings(pkgs)
    nodes, pkg_ids = packages.crossed_nodes(findings)
    assert all(isinstance(f["message"], str) for f in findings)
    assert nodes == frozenset(n for f in findings for n in f["nodes"])
    assert packages.crossed_nodes(pkgs)[0] == frozenset()
    packages.layout_text({"snc_like": True, "nodes_per_package": pkgs})


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(max_size=80))
def test_release_parsers_raise_only_value_error(text):
    for parse in (osrelease.parse_osrelease, osrelease.parse_proc_version):
        try:
            release = parse(text)
        except ValueError:
            continue
        assert release and osrelease.release_tuple(release) is not None


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    local=st.lists(st.integers(0, 8), max_size=6),
    nodes=st.dictionaries(st.integers(0, 3), st.lists(st.integers(0, 8), max_size=5), max_size=4),
)
def test_infer_node_never_raises_and_names_a_holder(local, nodes):
    node, source = pci.infer_node(None, tuple(local), {k: tuple(v) for k, v in nodes.items()})
    if node is None:
        assert source is None
    else:
        assert set(local) and set(local) <= set(nodes[node])
        assert source in ("local_cpulist", "local_cpulist_subset")


BOOT_ARGS = {
    "pools": [{"node": 1, "size_kb": 2048, "count": 4}],
    "boot_reserve_sizes_kb": [2048],
    "bootloader": "grub_d",
    "mounts": [],
    "root": "/",
}


@pytest.mark.parametrize(
    ("machine", "release", "want"),
    [
        ("128arm-2pa2n8cluster4co", "keep", "the kernel is 5.15, and per-node boot reservations"),
        (
            "synthetic-epyc-nps4",
            "keep",
            "the kernel release is unknown (ansible_facts.numa.kernel.osrelease is null",
        ),
        ("synthetic-epyc-nps4", "6.1.0-50-amd64", None),
        ("synthetic-epyc-nps4", "drop", None),  # facts of an older release: left to the module
    ],
)
def test_boot_reservation_is_checked_against_the_facts_before_the_gate(machine, release, want):
    from ansible_collections.numafleet.tuning.plugins.plugin_utils import _module_inputs

    numa = golden(machine)
    if release == "drop":
        del numa["kernel"]["osrelease"]
    elif release != "keep":
        numa["kernel"]["osrelease"] = release
    got = _module_inputs.problems("numa_hugepages", dict(BOOT_ARGS), "h", numa)
    if want is None:
        assert got == []
    else:
        (message,) = got
        assert message.startswith(
            "host h: hugepages_boot_reserve (set from numafleet_hugepages_boot_reserve by site.yml"
        )
        assert want in message and "(hugepagesz=2M hugepages=1:4)" in message
    # no pages of a boot size: nothing on the command line, nothing to check
    runtime = dict(BOOT_ARGS, boot_reserve_sizes_kb=[G1])
    assert _module_inputs.problems("numa_hugepages", runtime, "h", numa) == []


@pytest.fixture(scope="module")
def release_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    trees.materialize("qemu-2node-pxb", root / "tree")
    return str(root / "tree")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    osrelease_bytes=st.one_of(st.none(), st.binary(max_size=40)),
    version_bytes=st.one_of(st.none(), st.binary(max_size=60)),
)
def test_garbage_release_files_are_warnings_never_tracebacks(
    release_root, osrelease_bytes, version_bytes
):
    paths = {
        Path(release_root, "proc", "sys", "kernel", "osrelease"): osrelease_bytes,
        Path(release_root, "proc", "version"): version_bytes,
    }
    for path, data in paths.items():
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    kernel = facts_of(release_root)["kernel"]
    assert kernel["osrelease"] is None or osrelease.release_tuple(kernel["osrelease"])
    assert (kernel["osrelease"] is None) == (kernel["osrelease_source"] is None)
    if kernel["osrelease"] is None:
        with pytest.raises(
            hugepages.HugepageError, match="the kernel release is needed to reserve"
        ):
            hugepages.read_kernel_release(os.path.join(release_root, "proc"))
    else:
        assert hugepages.read_kernel_release(os.path.join(release_root, "proc")) == (
            osrelease.release_tuple(kernel["osrelease"])
        )


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    package_of=st.lists(st.sampled_from([0, 8, 3]), min_size=32, max_size=32),
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=4),
)
def test_planner_on_any_package_layout_gives_count_cpus_on_crossed_nodes(package_of, counts):
    numa = golden("nvidiagpunumanodes")
    online = [*range(16), *range(88, 104)]
    node_of = {cpu: (0 if cpu < 88 else 8) for cpu in online}
    layout: dict = {}
    for cpu, pid in zip(online, package_of, strict=True):
        entry = layout.setdefault(pid, {"id": pid, "cpus": [], "nodes": set()})
        entry["cpus"].append(cpu)
        entry["nodes"].add(node_of[cpu])
    pkgs = [dict(e, nodes=sorted(e["nodes"])) for dummy, e in sorted(layout.items())]
    numa["packages"] = pkgs
    numa["consistency"] = packages.cross_findings(pkgs)
    numa.update(packages.package_layout(pkgs))
    crossed_set, dummy = packages.crossed_nodes(numa["consistency"])
    placements = [
        {"name": f"p{i}", "exec": "/bin/x", "cpus": count} for i, count in enumerate(counts)
    ]
    try:
        result = place(numa, None, placements)
    except PlanError:
        return
    for entry in result["placements"]:
        if entry["node"] in crossed_set:
            assert len(entry["cpus"]) == entry["cpus_requested"]
        else:
            assert len(entry["cpus"]) % 4 == 0  # whole SMT4 cores
