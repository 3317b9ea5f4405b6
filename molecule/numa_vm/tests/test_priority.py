"""Placement priority on the real 2-node guest: numa-bound is priority: high with a 512M budget,
cpu-only is normal. The kernel holds numa-bound's memory.low at its budget (hugepages not
included), numafleet.slice above it grants the same (without it the kernel caps the unit's
protection at 0), and cpu-only has no protection. Written for `make vm` (not run by units)."""

from vm_helpers import record, unit, wait_until_touched

testinfra_hosts = ["numa-vm"]
MIB = 1 << 20


def show(host, name: str, prop: str) -> str:
    return host.check_output(f"systemctl show -p {prop} --value {name}")


def cgroup(host, name: str) -> str:
    path = show(host, unit(name), "ControlGroup")
    assert path.startswith("/"), f"{unit(name)} has no control group: {path!r}"
    return f"/sys/fs/cgroup{path}"


def test_a_high_placement_and_its_slice_hold_memory_low_of_its_budget(host):
    wait_until_touched(host, "numa-bound")
    bound, cpu_only = cgroup(host, "numa-bound"), cgroup(host, "cpu-only")
    parent = bound.rsplit("/", 1)[0]
    measured = {
        "numa-bound MemoryLow": show(host, unit("numa-bound"), "MemoryLow"),
        "numa-bound memory.low": host.check_output(f"cat {bound}/memory.low"),
        "slice": parent,
        "numafleet.slice MemoryLow": show(host, "numafleet.slice", "MemoryLow"),
        "numafleet.slice memory.low": host.check_output(f"cat {parent}/memory.low"),
        "cpu-only memory.low": host.check_output(f"cat {cpu_only}/memory.low"),
        "cgroup2 mount options": host.check_output("findmnt -no OPTIONS /sys/fs/cgroup"),
    }
    record("priority_memory_low", measured)
    assert parent == "/sys/fs/cgroup/numafleet.slice"
    assert measured["numa-bound MemoryLow"] == str(512 * MIB)
    assert measured["numa-bound memory.low"] == str(512 * MIB)
    assert measured["numafleet.slice MemoryLow"] == str(512 * MIB)
    assert measured["numafleet.slice memory.low"] == str(512 * MIB)
    assert measured["cpu-only memory.low"] == "0"
