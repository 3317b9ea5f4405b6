"""The fixture machinery: scratch copies, the demo fleet, and the synthetic trees' generator."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import make_synthetic
import pytest
import trees

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import pci
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

REPO = Path(__file__).resolve().parents[2]


def test_machines_are_the_dumps_qemu_and_synthetic_cases():
    hwloc = sorted(p.name[: -len(".tar.bz2")] for p in trees.HWLOC_DIR.glob("*.tar.bz2"))
    assert len(hwloc) == 8
    assert trees.MACHINES == sorted([*hwloc, "qemu-2node-pxb", *make_synthetic.CASES])


def test_materialize_unpacks_a_tarball_whose_directory_has_another_name(fixture_root):
    # 48amd64-4pa2n6c-sparse.tar.bz2 holds 48amd64-4d2n6c-sparse/
    root = Path(fixture_root("48amd64-4pa2n6c-sparse"))
    assert root.name == "48amd64-4pa2n6c-sparse"
    assert (root / "sys" / "devices" / "system" / "node" / "node73").is_dir()
    assert (root / "proc" / "meminfo").is_file()
    assert (root / trees.MARKER).read_text() == "48amd64-4pa2n6c-sparse\n"


def test_materialize_keeps_pci_symlinks_relative(tmp_path):
    root = Path(trees.materialize("synthetic-8xh100-2s", tmp_path / "h100"))
    link = root / "sys" / "bus" / "pci" / "devices" / "0000:2a:00.0"
    assert link.is_symlink()
    assert os.readlink(link) == (
        "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0/0000:2a:00.0"
    )
    assert (link / "class").read_text() == "0x030200\n"


def test_materialize_again_resets_the_copy(tmp_path):
    dest = tmp_path / "qemu"
    trees.materialize("qemu-2node-pxb", dest)
    (dest / "sys" / "stray").write_text("left by a test\n")
    (dest / "proc" / "meminfo").unlink()
    trees.materialize("qemu-2node-pxb", dest)
    assert not (dest / "sys" / "stray").exists()
    assert (dest / "proc" / "meminfo").is_file()


def test_materialize_refuses_a_directory_it_did_not_make(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me\n")
    with pytest.raises(trees.FixtureError, match="not made by trees.materialize"):
        trees.materialize("2arm-2c", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me\n"


def test_materialize_names_the_known_machines_for_an_unknown_one(tmp_path):
    with pytest.raises(trees.FixtureError, match="unknown machine 'nope'; known: .*qemu-2node-pxb"):
        trees.materialize("nope", tmp_path / "x")


def test_writable_copies_are_private(fixture_root):
    first = fixture_root("synthetic-vm-gpu-numa-unknown", writable=True)
    second = fixture_root("synthetic-vm-gpu-numa-unknown", writable=True)
    shared = fixture_root("synthetic-vm-gpu-numa-unknown")
    assert len({first, second, shared}) == 3
    Path(first, "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages").write_text(
        "8\n"
    )
    assert (
        Path(
            second, "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
        ).read_text()
        == "0\n"
    )


def test_demo_hosts_match_the_demo_inventory():
    inventory = (REPO / "inventories" / "demo" / "hosts.yml").read_text()
    hosts = re.findall(r"^    ([a-z0-9][a-z0-9-]*):", inventory, re.M)
    assert sorted(hosts) == sorted(trees.DEMO_HOSTS)
    assert set(trees.DEMO_HOSTS.values()) <= set(trees.MACHINES)


def test_demo_cli_materialises_every_host_and_is_idempotent(tmp_path, capsys, monkeypatch):
    # Two small hosts stand in for the fleet: extracting every dump takes tens of seconds.
    hosts = {"vm-gpu-01": "synthetic-vm-gpu-numa-unknown", "qemu-2node-01": "qemu-2node-pxb"}
    monkeypatch.setattr(trees, "DEMO_HOSTS", hosts)
    assert trees.main(["--demo", str(tmp_path / "demo")]) == 0
    (tmp_path / "demo" / "vm-gpu-01" / "sys" / "stray").write_text("x\n")
    assert trees.main(["--demo", str(tmp_path / "demo")]) == 0
    for host in hosts:
        assert (tmp_path / "demo" / host / "sys" / "devices" / "system" / "cpu").is_dir()
        assert (tmp_path / "demo" / host / "proc").is_dir()
    assert not (tmp_path / "demo" / "vm-gpu-01" / "sys" / "stray").exists()
    assert "qemu-2node-01: " in capsys.readouterr().out


@pytest.mark.parametrize("case", sorted(make_synthetic.CASES))
def test_synthetic_tarballs_are_what_the_generator_writes(case):
    assert make_synthetic.is_current(case), f"run make_synthetic.py {case}"


def test_generator_is_deterministic_and_check_sees_changes(tmp_path):
    case = "synthetic-vm-gpu-numa-unknown"
    first = make_synthetic.write_case(case, tmp_path).read_bytes()
    (tmp_path / f"{case}.tar.gz").unlink()
    assert make_synthetic.write_case(case, tmp_path).read_bytes() == first
    assert make_synthetic.main(["--check", "--out", str(tmp_path), case]) == 0
    (tmp_path / f"{case}.tar.gz").write_bytes(gzip.compress(b"not the tree"))
    assert make_synthetic.main(["--check", "--out", str(tmp_path), case]) == 1


def test_plain_tree_has_the_tarballs_content(tmp_path):
    tree = make_synthetic.write_tree("synthetic-vm-gpu-numa-unknown", tmp_path)
    link = tree / "sys" / "bus" / "pci" / "devices" / "0000:07:00.0"
    assert os.readlink(link) == "../../../devices/pci0000:00/0000:00:02.6/0000:07:00.0"
    assert (link / "local_cpulist").read_text() == "4-7\n"
    assert (link / "numa_node").read_text() == "-1\n"


@pytest.mark.parametrize("machine", sorted(trees.GPU_ADDRESSES))
def test_gpu_addresses_are_the_gpus_the_reader_finds(machine, fixture_root):
    root = fixture_root(machine)
    facts = read_numa_facts(Reader(f"{root}/sys", f"{root}/proc"))
    gpus = [dev["address"] for dev in facts["pci_devices"] if dev["kind"] == "gpu"]
    assert gpus == sorted(trees.GPU_ADDRESSES[machine], key=pci.parse_address)
    assert facts["warnings"] == []


@pytest.mark.parametrize(
    ("words", "nbits", "cpus"),
    [
        ("3", 4, [0, 1]),
        ("ff,ffffffff,ffffffff", 72, range(72)),
        ("00000000,0000ffff", 64, range(16)),
        ("f0", 8, [4, 5, 6, 7]),
    ],
)
def test_cpumask_is_the_kernel_format(words, nbits, cpus):
    assert make_synthetic.cpumask(cpus, nbits) == words


def test_materialize_without_the_data_filter(tmp_path, monkeypatch):
    # Python < 3.11.4 has no tarfile.data_filter: trees.py checks members itself.
    monkeypatch.delattr(trees.tarfile, "data_filter")
    root = Path(trees.materialize("qemu-2node-pxb", tmp_path / "old-python"))
    assert (root / "sys" / "bus" / "pci" / "devices" / "0000:81:00.0").is_symlink()


INTEGRATION_FILES = (
    Path(__file__).resolve().parents[1]
    / "integration"
    / "targets"
    / "setup_recorded_tree"
    / "files"
)


@pytest.mark.parametrize(
    ("copy", "original"),
    [
        ("qemu-2node-pxb.tar.gz", "sysfs/qemu/qemu-2node-pxb.tar.gz"),
        ("synthetic-vm-gpu-numa-unknown.tar.gz", "sysfs/synthetic-vm-gpu-numa-unknown.tar.gz"),
        (
            "synthetic-vm-gpu-numa-unknown.snapshot.json",
            "gpu_snapshots/synthetic-vm-gpu-numa-unknown.json",
        ),
    ],
)
def test_integration_copies_equal_the_unit_fixtures(copy, original):
    """ansible-test copies each target alone, so the integration targets carry their own copies."""
    here = Path(__file__).resolve().parent / "fixtures"
    assert (INTEGRATION_FILES / copy).read_bytes() == (here / original).read_bytes()
