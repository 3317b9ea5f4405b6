"""The kernel's own view of what site.yml applied on the 2-node guest."""

import pytest
from vm_helpers import (
    EXPECTED,
    HUGEPAGE_POOLS,
    NVME,
    main_pid,
    pages_by_node,
    record,
    status_field,
    unit,
    wait_until_touched,
)

testinfra_hosts = ["numa-vm"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unit_enabled_and_running(host, name):
    service = host.service(unit(name))
    assert service.is_enabled
    assert service.is_running


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_process_allowed_cpus_and_mems(host, name):
    pid = wait_until_touched(host, name)
    assert status_field(host, pid, "Cpus_allowed_list") == EXPECTED[name]["cpus"]
    assert status_field(host, pid, "Mems_allowed_list") == EXPECTED[name]["mems"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cgroup_cpuset_is_the_plans(host, name):
    cgroup = host.check_output(f"systemctl show -p ControlGroup --value {unit(name)}")
    base = f"/sys/fs/cgroup{cgroup}"
    assert (
        host.file(f"{base}/cpuset.cpus.effective").content_string.strip() == EXPECTED[name]["cpus"]
    )
    assert (
        host.file(f"{base}/cpuset.mems.effective").content_string.strip() == EXPECTED[name]["mems"]
    )
    policy = host.check_output(f"systemctl show -p NUMAPolicy --value {unit(name)}")
    mask = host.check_output(f"systemctl show -p NUMAMask --value {unit(name)}")
    assert (policy, mask) == ("bind", EXPECTED[name]["mems"])


def test_nvme_anchor_is_on_node_1(host):
    device = f"/sys/bus/pci/devices/{NVME}"
    assert host.file(f"{device}/numa_node").content_string.strip() == "1"
    assert host.file(f"{device}/class").content_string.strip() == "0x010802"
    assert EXPECTED["numa-bound"]["node"] == 1  # placed by near: 0000:81:00.0 in molecule.yml


def test_hugepage_pools_per_node(host):
    pools = {}
    for node, total in HUGEPAGE_POOLS.items():
        base = f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB"
        nr = int(host.file(f"{base}/nr_hugepages").content_string)
        free = int(host.file(f"{base}/free_hugepages").content_string)
        in_use = sum(v["hugepages"] for v in EXPECTED.values() if v["node"] == node)
        assert (nr, free) == (total, total - in_use)
        pools[f"node{node}"] = {"nr_hugepages": nr, "free_hugepages": free}
    record("hugepages_2m_per_node", pools)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_pages_stay_on_the_planned_node(host, name):
    pid = main_pid(host, name)
    pages = pages_by_node(host.file(f"/proc/{pid}/numa_maps").content_string)
    node = EXPECTED[name]["node"]
    anon_total = sum(pages["anon"].values())
    off_node = sum(n for nid, n in pages["anon"].items() if nid != node)
    assert anon_total * 4 >= 64 * 1024  # at least the 64 MiB the smaller workload touches, in KiB
    assert off_node / anon_total < 0.02
    assert pages["huge"] == (
        {node: EXPECTED[name]["hugepages"]} if EXPECTED[name]["hugepages"] else {}
    )
    record(
        f"numa_maps_{name}",
        {"anon_pages_by_node": pages["anon"], "huge_pages_by_node": pages["huge"]},
    )
