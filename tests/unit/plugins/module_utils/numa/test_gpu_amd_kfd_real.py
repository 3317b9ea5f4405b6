"""The facts reader's KFD grouping on a real MI300X CPX topology (8 GPUs, 63 logical GPUs).

tests/unit/fixtures/amd/kfd-topology-8x-mi300x-cpx/ is the KFD topology of a real host
(PROVENANCE.md there). The capture has no ``gpu_id`` files; the test writes one (non-zero) for
every node with SIMDs, as the driver does for GPU nodes, and 0 for the CPU nodes. Everything
else is read as captured.
"""

from __future__ import annotations

import shutil

from amd_fixtures import AMD_FIXTURES

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu_amd
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

TOPOLOGY = AMD_FIXTURES / "kfd-topology-8x-mi300x-cpx"


def kfd_tree(tmp_path):
    """A sysfs root whose class/kfd/kfd/topology is the captured one, gpu_id files added."""
    top = tmp_path / "sys" / "class" / "kfd" / "kfd" / "topology"
    shutil.copytree(TOPOLOGY, top, ignore=shutil.ignore_patterns("LICENSE"))
    for node in (top / "nodes").iterdir():
        props = dict(line.split() for line in (node / "properties").read_text().splitlines())
        gpu = int(props["simd_count"]) > 0
        (node / "gpu_id").write_text(f"{1000 + int(node.name)}\n" if gpu else "0\n")
    return tmp_path / "sys"


def test_every_xcp_is_a_kfd_node_grouped_under_its_pci_gpu(tmp_path):
    kfd = gpu_amd.read_kfd_nodes(Reader(str(kfd_tree(tmp_path))))
    buses = sorted(bus_dev >> 5 for _domain, bus_dev in kfd)
    assert buses == [0x05, 0x27, 0x47, 0x65, 0x85, 0xA7, 0xC7, 0xE5]
    sizes = [len(kfd[key]) for key in sorted(kfd)]
    assert sizes == [8, 8, 8, 8, 8, 8, 8, 7]  # the capture shows 63 of the 64 XCPs
    first = kfd[(0, 0x05 << 5)]
    assert [n["kfd_node"] for n in first] == list(range(2, 10))
    # the partition id is in the function bits of location_id (0 reads as None)
    assert [n["partition_id"] for n in first] == [None, 1, 2, 3, 4, 5, 6, 7]
    assert [n["render_minor"] for n in first] == list(range(128, 136))
    assert {n["num_xcc"] for nodes in kfd.values() for n in nodes} == {1}


def test_this_driver_gives_all_partitions_of_a_gpu_one_unique_id(tmp_path):
    """Real behaviour worth knowing: one KFD unique_id (so one ROCr UUID) per physical GPU.

    ROCr's ROCR_VISIBLE_DEVICES treats a UUID that matches two or more agents as the end of
    the list, so on such a driver a partition cannot be selected by UUID; the reader reports
    the ids as the driver gives them and does not invent distinct ones.
    """
    kfd = gpu_amd.read_kfd_nodes(Reader(str(kfd_tree(tmp_path))))
    for nodes in kfd.values():
        assert len({n["unique_id"] for n in nodes}) == 1
    uuids = {gpu_amd.gpu_uuid(nodes[0]["unique_id"]) for nodes in kfd.values()}
    assert len(uuids) == 8
    # unique_id 16404946649897475633 as ROCr prints it
    assert gpu_amd.gpu_uuid(kfd[(0, 0x05 << 5)][0]["unique_id"]) == "GPU-e3aa140f9a5f9e31"


def test_the_eight_gpus_are_one_xgmi_hive(tmp_path):
    """Every GPU node carries the hive's KFD hive_id: one memory partition for all eight."""
    kfd = gpu_amd.read_kfd_nodes(Reader(str(kfd_tree(tmp_path))))
    hives = {n["hive_id"] for nodes in kfd.values() for n in nodes}
    assert hives == {15188982192727901047}
