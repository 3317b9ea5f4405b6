"""Topology and PCI readers on small hand-made trees: one behaviour per case."""

from __future__ import annotations

import os

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_host(root, nodes, cpus_online="0-3", smt=None, extra=None):
    """A tiny sysfs/procfs tree. nodes: {id: (cpulist, memtotal_kb)}; smt: {cpu: siblings}."""
    ids = sorted(nodes)
    write(root, "sys/devices/system/node/online", ",".join(str(i) for i in ids) + "\n")
    for nid, (cpulist, mem_kb) in nodes.items():
        base = f"sys/devices/system/node/node{nid}"
        write(root, f"{base}/cpulist", cpulist + "\n")
        write(
            root,
            f"{base}/meminfo",
            f"Node {nid} MemTotal: {mem_kb} kB\nNode {nid} MemFree: 10 kB\n",
        )
        row = " ".join("10" if other == nid else "20" for other in ids)
        write(root, f"{base}/distance", row + "\n")
        write(root, f"{base}/numastat", "numa_hit 5\nother_node 1\n")
    write(root, "sys/devices/system/cpu/online", cpus_online + "\n")
    for cpu in range(4):
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        write(root, f"{topo}/physical_package_id", "0\n")
        write(root, f"{topo}/core_id", f"{cpu // 2 if smt else cpu}\n")
        write(root, f"{topo}/die_id", "-1\n")
        write(root, f"{topo}/thread_siblings_list", (smt or {}).get(cpu, str(cpu)) + "\n")
    write(root, "proc/meminfo", "MemTotal: 4000 kB\nMemFree: 100 kB\nHugepagesize: 2048 kB\n")
    for rel, text in (extra or {}).items():
        write(root, rel, text)
    return Reader(str(root / "sys"), str(root / "proc"))


def add_pci(root, chain, address, cls, vendor, numa_node, local_cpulist):
    """A PCI device at devices/pci0000:00/<chain...>/<address> with a bus/pci/devices link."""
    domain, bus = address.split(":")[:2]
    parent = (
        root / "sys" / "devices" / f"pci{domain}:{bus if not chain else chain[0].split(':')[1]}"
    )
    for hop in chain:
        parent = parent / hop
        write(root, os.path.relpath(parent / "class", root), "0x060400\n")
    device = parent / address
    for name, value in (
        ("class", cls),
        ("vendor", vendor),
        ("device", "0x1234"),
        ("numa_node", str(numa_node)),
        ("local_cpulist", local_cpulist),
    ):
        write(root, os.path.relpath(device / name, root), value + "\n")
    links = root / "sys" / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device, links), links / address)


def node(facts, nid):
    return next(n for n in facts["nodes"] if n["id"] == nid)


def test_nodes_kinds_and_distances(tmp_path):
    reader = make_host(tmp_path, {0: ("0-1", 1000), 1: ("2-3", 0), 4: ("", 500)})
    facts = read_numa_facts(reader)
    assert facts["node_ids"] == [0, 1, 4]
    assert [node(facts, i)["kind"] for i in (0, 1, 4)] == ["cpu+memory", "cpu-only", "memory-only"]
    assert node(facts, 4)["distances"] == [20, 20, 10]
    assert node(facts, 0)["numastat"] == {"numa_hit": 5, "other_node": 1}
    assert facts["warnings"] == []


def test_null_nohz_full_and_empty_isolated_read_as_empty(tmp_path):
    reader = make_host(
        tmp_path,
        {0: ("0-3", 1000)},
        extra={
            "sys/devices/system/cpu/nohz_full": "(null)\n",
            "sys/devices/system/cpu/isolated": "\n",
        },
    )
    cpus = read_numa_facts(reader)["cpus"]
    assert cpus["nohz_full"] == [] and cpus["isolated"] == []


def test_isolated_and_offline_cpus(tmp_path):
    reader = make_host(
        tmp_path,
        {0: ("0-3", 1000)},
        cpus_online="0-2",
        extra={
            "sys/devices/system/cpu/isolated": "1-2\n",
            "sys/devices/system/cpu/offline": "3\n",
        },
    )
    facts = read_numa_facts(reader)
    assert facts["cpus"]["isolated"] == [1, 2]
    assert facts["cpus"]["offline"] == [3]
    cpu3 = facts["per_cpu"][3]
    assert cpu3["online"] is False and cpu3["package"] is None and cpu3["node"] == 0
    assert facts["per_cpu"][0]["die"] is None  # die_id -1 is unknown, not die -1


def test_split_core_is_a_consistency_finding(tmp_path):
    smt = {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}
    reader = make_host(tmp_path, {0: ("0,2", 1000), 1: ("1,3", 1000)}, smt=smt)
    findings = read_numa_facts(reader)["consistency"]
    assert [f["kind"] for f in findings] == ["split_core", "split_core"]
    assert findings[0]["cpus"] == [0, 1] and findings[0]["nodes"] == [0, 1]
    assert "0-1" in findings[0]["message"]


def test_no_numa_sysfs_gives_one_node_from_proc(tmp_path):
    write(tmp_path, "sys/devices/system/cpu/online", "0-1\n")
    write(tmp_path, "proc/meminfo", "MemTotal: 2048 kB\nMemFree: 1024 kB\n")
    facts = read_numa_facts(Reader(str(tmp_path / "sys"), str(tmp_path / "proc")))
    assert facts["numa_enabled"] is False
    assert facts["nodes"] == [
        {
            "id": 0,
            "cpus": [0, 1],
            "memory_kb": 2048,
            "memfree_kb": 1024,
            "kind": "cpu+memory",
            "distances": [10],
            "hugepages": [],
            "numastat": {},
            "normal_memory": None,
            "gpu_owner": None,
            "memory_tier": None,
            "memory_backing": None,
        }
    ]


@pytest.mark.parametrize(
    ("rel", "text", "reason"),
    [
        ("sys/devices/system/node/node0/cpulist", "zz\n", "not a CPU number"),
        ("sys/devices/system/node/node0/meminfo", "garbage\n", "malformed"),
        ("sys/devices/system/node/node0/distance", "ten\n", "malformed"),
        ("sys/devices/system/node/node0/numastat", "numa_hit x\n", "malformed"),
        ("sys/devices/system/cpu/cpu1/topology/core_id", "\x00\x00", "only NUL bytes"),
    ],
)
def test_malformed_file_is_a_warning_naming_path_and_reason(tmp_path, rel, text, reason):
    reader = make_host(tmp_path, {0: ("0-3", 1000)}, extra={rel: text})
    facts = read_numa_facts(reader)
    assert [w["path"] for w in facts["warnings"]] == [str(tmp_path / rel)]
    assert reason in facts["warnings"][0]["reason"]


def test_unreadable_file_is_a_warning(tmp_path):
    reader = make_host(tmp_path, {0: ("0-3", 1000)})
    target = tmp_path / "sys/devices/system/node/node0/meminfo"
    target.unlink()
    target.mkdir()  # reading a directory fails with EISDIR, as unreadable sysfs files do
    facts = read_numa_facts(reader)
    assert facts["warnings"][0]["path"] == str(target)
    assert node(facts, 0)["memory_kb"] is None


PCI_CASES = [
    # (numa_node, local_cpulist, node, source)
    (1, "2-3", 1, "numa_node"),
    (-1, "2-3", 1, "local_cpulist"),  # unknown, but local CPUs equal exactly node 1
    (-1, "0-3", None, None),  # unknown, local CPUs span both nodes: stays unknown
    (-1, "2", 1, "local_cpulist_subset"),  # unknown, local CPUs inside node 1 only (#22)
    (-1, "1-2", None, None),  # unknown, local CPUs inside no one node: stays unknown
    (0, "0-3", 0, "numa_node"),  # sysfs wins over local CPUs
]


@pytest.mark.parametrize(("numa_node", "local", "want_node", "want_source"), PCI_CASES)
def test_gpu_locality(tmp_path, numa_node, local, want_node, want_source):
    reader = make_host(tmp_path, {0: ("0-1", 1000), 1: ("2-3", 1000)})
    add_pci(tmp_path, ["0000:00:01.0"], "0000:01:00.0", "0x030200", "0x10de", numa_node, local)
    (gpu,) = read_numa_facts(reader)["pci_devices"]
    assert gpu["kind"] == "gpu"
    assert gpu["numa_node"] == (None if numa_node < 0 else numa_node)
    assert (gpu["node"], gpu["node_source"]) == (want_node, want_source)


@pytest.mark.parametrize(
    ("cls", "vendor", "kind"),
    [
        ("0x030000", "0x10de", "gpu"),
        ("0x030200", "0x1002", "gpu"),
        ("0x120000", "0x1002", "gpu"),  # AMD Instinct: processing accelerator class
        ("0x038000", "0x1234", None),  # display device of another vendor is not a GPU
        ("0x040300", "0x10de", None),  # the GPU's HDMI audio function
        ("0x068000", "0x10de", None),  # NVSwitch
        ("0x020000", "0x8086", "nic"),
        ("0x020700", "0x15b3", "nic"),
        ("0x010802", "0x144d", "nvme"),
        ("0x050210", "0x8086", "cxl_memory"),
    ],
)
def test_pci_classification(tmp_path, cls, vendor, kind):
    reader = make_host(tmp_path, {0: ("0-3", 1000)})
    add_pci(tmp_path, ["0000:00:01.0"], "0000:01:00.0", cls, vendor, 0, "0-3")
    devices = read_numa_facts(reader)["pci_devices"]
    assert [d["kind"] for d in devices] == ([kind] if kind else [])


def test_switch_and_upstream_path_pair_devices(tmp_path):
    reader = make_host(tmp_path, {0: ("0-3", 1000)})
    chain = ["0000:00:01.0", "0000:01:00.0"]  # root port -> switch upstream port
    add_pci(tmp_path, chain + ["0000:02:00.0"], "0000:03:00.0", "0x030200", "0x10de", 0, "0-3")
    add_pci(tmp_path, chain + ["0000:02:01.0"], "0000:04:00.0", "0x020700", "0x15b3", 0, "0-3")
    gpu, nic = read_numa_facts(reader)["pci_devices"]
    assert gpu["upstream"] == ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]
    assert gpu["root_port"] == "0000:00:01.0" and gpu["host_bridge"] == "pci0000:00"
    assert gpu["switch"] == nic["switch"] == "0000:01:00.0"


def test_32bit_pci_domain(tmp_path):
    reader = make_host(tmp_path, {0: ("0-3", 1000)})
    add_pci(tmp_path, [], "10000:e1:00.0", "0x010802", "0x144d", -1, "0-3")
    (nvme,) = read_numa_facts(reader)["pci_devices"]
    assert nvme["address"] == "10000:e1:00.0" and nvme["domain"] == 0x10000
    assert nvme["numa_node"] is None and nvme["node"] == 0  # one node holds every CPU


def test_a_fifo_is_a_warning_not_a_hang(tmp_path):
    reader = make_host(tmp_path, {0: ("0-3", 1000)})
    online = tmp_path / "sys/devices/system/cpu/online"
    online.unlink()
    os.mkfifo(online)  # opening a FIFO for reading would block forever
    facts = read_numa_facts(reader)
    assert {"path": str(online), "reason": "not a regular file"} in facts["warnings"]


@pytest.mark.parametrize(
    ("broken", "kind"),
    [
        ("sys/devices/system/node/node0/meminfo", "unknown"),  # memory unknown
        ("sys/devices/system/node/node0/cpulist", "unknown"),  # CPUs unknown (no cpumap either)
    ],
)
def test_an_unreadable_node_has_an_unknown_kind_never_a_guess(tmp_path, broken, kind):
    reader = make_host(tmp_path, {0: ("0-3", 1000), 1: ("", 500)})
    (tmp_path / broken).unlink()
    facts = read_numa_facts(reader)
    assert node(facts, 0)["kind"] == kind
    assert node(facts, 1)["kind"] == "memory-only"


def test_node_dir_that_is_a_file_means_no_numa(tmp_path):
    write(tmp_path, "sys/devices/system/node", "not a directory\n")
    write(tmp_path, "sys/devices/system/cpu/online", "0-1\n")
    write(tmp_path, "proc/meminfo", "MemTotal: 2048 kB\nMemFree: 1024 kB\n")
    facts = read_numa_facts(Reader(str(tmp_path / "sys"), str(tmp_path / "proc")))
    assert facts["numa_enabled"] is False and [n["id"] for n in facts["nodes"]] == [0]


def test_long_garbage_is_quoted_short_in_the_warning(tmp_path):
    reader = make_host(
        tmp_path, {0: ("0-3", 1000)}, extra={"sys/devices/system/node/node0/distance": "x" * 5000}
    )
    (warning,) = read_numa_facts(reader)["warnings"]
    assert len(warning["reason"]) <= 200 and warning["reason"].endswith("...")


def test_roots_are_normalised(tmp_path):
    make_host(tmp_path, {0: ("0-3", 1000)})
    (tmp_path / "x").mkdir()
    reader = Reader(f"{tmp_path}/x/../sys/", f"{tmp_path}/x/../proc")
    facts = read_numa_facts(reader)
    assert facts["sysfs_root"] == str(tmp_path / "sys")
    assert facts["procfs_root"] == str(tmp_path / "proc")
