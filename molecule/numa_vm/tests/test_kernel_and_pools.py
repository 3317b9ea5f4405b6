"""What the hugepages and numa_kernel roles did to the guest's real kernel, and a grant it cannot make."""

import json

from vm_helpers import HUGEPAGE_POOLS, ad_hoc_message, record, run_ansible

testinfra_hosts = ["numa-vm"]
POOL = "/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages"


def _pools(host) -> dict:
    return {node: int(host.file(POOL.format(node=node)).content_string) for node in HUGEPAGE_POOLS}


def test_pools_are_persisted_for_the_next_boot(host):
    state = json.loads(host.file("/etc/numafleet/hugepages.json").content_string)
    wanted = {(p["node"], p["size_kb"], p["count"]) for p in state["pools"]}
    assert wanted == {(node, 2048, count) for node, count in HUGEPAGE_POOLS.items()}
    assert host.service("numafleet-hugepages.service").is_enabled
    # What the unit runs at boot, run now: the live pools already match, so it writes nothing.
    before = _pools(host)
    boot = host.run("/usr/bin/python3 /usr/local/libexec/numafleet-hugepages")
    assert boot.rc == 0, boot.stdout + boot.stderr
    assert "node 1, 2048 kB pages: 32 -> 32" in boot.stdout
    assert _pools(host) == before


def test_kernel_numa_knobs_are_set_and_persisted(host):
    assert host.file("/proc/sys/kernel/numa_balancing").content_string.strip() == "0"
    assert host.file("/proc/sys/vm/zone_reclaim_mode").content_string.strip() == "0"
    thp = "/sys/kernel/mm/transparent_hugepage"
    assert "[madvise]" in host.file(f"{thp}/enabled").content_string
    assert "[madvise]" in host.file(f"{thp}/defrag").content_string
    sysctl = host.file("/etc/sysctl.d/60-numafleet-numa.conf").content_string
    assert "kernel.numa_balancing = 0" in sysctl
    assert "vm.zone_reclaim_mode = 0" in sysctl
    tmpfiles = host.file("/etc/tmpfiles.d/numafleet-thp.conf").content_string
    assert f"w {thp}/enabled" in tmpfiles
    # systemd-sysctl reads the file the same way at boot.
    assert host.run("sysctl --load=/etc/sysctl.d/60-numafleet-numa.conf").rc == 0


def test_an_impossible_grant_fails_and_changes_no_pool(host):
    before = _pools(host)
    state_before = host.file("/etc/numafleet/hugepages.json").content_string
    pools = [
        {"node": 0, "size_kb": 2048, "count": 16},  # grantable: 8 more than now
        {"node": 1, "size_kb": 2048, "count": 1536},  # 3 GiB on a 2 GiB node
    ]
    result = run_ansible(
        "-m", "numafleet.tuning.numa_hugepages", "-a", json.dumps({"pools": pools})
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    message = ad_hoc_message(result.stdout)
    assert "granted" in message and "node 1" in message, output
    assert "hugepagesz=2M" in message, output  # the boot-time reservation it suggests
    assert _pools(host) == before  # node 0 was granted its 16 pages, then set back to 8
    assert host.file("/etc/numafleet/hugepages.json").content_string == state_before
    record("impossible_grant_message", message)
    record("hugepages_2m_after_refused_grant", before)
