"""hugepages.py: desired totals, delta, in-use refusal, read-back and rollback, boot persistence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import hugepages as hp
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
M2, G1 = 2048, 1048576
QEMU = "qemu-2node-pxb"  # real 2-node guest: 2 MiB pools node0 16/16 free, node1 48/16 free


# --- helpers -----------------------------------------------------------------------------------


def pool_path(sysfs, node, size, name="nr_hugepages"):
    return os.path.join(hp.pool_dir(str(sysfs), node, size), name)


def read_int(path) -> int:
    with open(path, encoding="ascii") as handle:
        return int(handle.read().strip())


def write_int(path, value) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(f"{value}\n")


def kernel(grant=None, fail=None):
    """A writer that behaves like the kernel on a scratch tree: pages in use stay in use.

    ``grant(node_dir, requested, before) -> granted`` makes the kernel give less; ``fail(path)``
    returning True raises OSError like a refused write. free_hugepages follows nr_hugepages.
    """
    calls = []

    def write(path, value):
        calls.append((path, value))
        if fail and fail(path, value):
            raise OSError(12, "Cannot allocate memory")
        base = os.path.dirname(path)
        before = read_int(path)
        in_use = before - read_int(os.path.join(base, "free_hugepages"))
        granted = value if grant is None else grant(base, value, before)
        granted = max(granted, in_use)
        write_int(path, granted)
        write_int(os.path.join(base, "free_hugepages"), granted - in_use)

    write.calls = calls
    return write


def make_tree(tmp_path, pools, release=None, nodes=(0, 1)):
    """A minimal sysfs/procfs tree: pools {(node, size): (total, free)}; nodes without pools too."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    (sysfs / "devices" / "system" / "cpu").mkdir(parents=True)
    procfs.mkdir()
    for node in nodes:
        (sysfs / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True)
    for (node, size), (total, free) in pools.items():
        base = tmp_path / hp.pool_dir("sys", node, size)
        base.mkdir(parents=True, exist_ok=True)
        (base / "nr_hugepages").write_text(f"{total}\n")
        (base / "free_hugepages").write_text(f"{free}\n")
        (base / "surplus_hugepages").write_text("0\n")
    if release:
        (procfs / "sys" / "kernel").mkdir(parents=True)
        (procfs / "sys" / "kernel" / "osrelease").write_text(release + "\n")
    return str(sysfs), str(procfs)


def qemu(fixture_root, release=None):
    fsroot = fixture_root(QEMU, writable=True)
    if release:
        os.makedirs(f"{fsroot}/proc/sys/kernel", exist_ok=True)
        with open(f"{fsroot}/proc/sys/kernel/osrelease", "w", encoding="ascii") as handle:
            handle.write(release + "\n")
    return f"{fsroot}/sys", f"{fsroot}/proc"


def snapshot(*dirs) -> dict:
    """{path: (bytes, mode)} of every file below dirs, to prove nothing was written."""
    out = {}
    for top in dirs:
        for base, dummy, files in os.walk(top):
            for name in files:
                path = os.path.join(base, name)
                if os.path.islink(path):  # recorded trees keep sysfs links, some dangling
                    out[path] = (os.readlink(path), None)
                    continue
                with open(path, "rb") as handle:
                    out[path] = (handle.read(), os.stat(path).st_mode)
    return out


def plan(sysfs, procfs, root, pools, **kwargs):
    return hp.plan_hugepages(pools, sysfs, procfs, str(root), **kwargs)


def pools_of(*entries):
    return [{"node": n, "size_kb": s, "count": c} for n, s, c in entries]


# --- input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pools", "want"),
    [
        ([], {}),
        (pools_of((1, M2, 8), (0, M2, 4)), {(0, M2): 4, (1, M2): 8}),
        (pools_of((0, M2, 4), (0, M2, 6), (0, G1, 1)), {(0, M2): 10, (0, G1): 1}),
        (pools_of((0, M2, 0)), {(0, M2): 0}),
    ],
)
def test_parse_pools_sums_the_same_pool(pools, want):
    assert hp.parse_pools(pools) == want


@pytest.mark.parametrize(
    ("pools", "fragment"),
    [
        ({"node": 0}, "pools: {'node': 0} is not a list"),
        (["2M"], "pools[0]: '2M' is not a mapping"),
        (pools_of((-1, M2, 4)), "pools[0].node is -1; it must be a whole number of at least 0"),
        (pools_of((0, 0, 4)), "pools[0].size_kb is 0"),
        (pools_of((0, M2, 1), (0, M2, -4)), "pools[1].count is -4"),
        ([{"node": True, "size_kb": M2, "count": 1}], "pools[0].node is True"),
        ([{"node": 0, "size_kb": "2M", "count": 1}], "2048 for 2 MiB, 1048576 for 1 GiB"),
    ],
)
def test_parse_pools_refuses_bad_entries(pools, fragment):
    with pytest.raises(hp.HugepageError) as err:
        hp.parse_pools(pools)
    assert fragment in str(err.value)


@pytest.mark.parametrize("size_kb", [0, -M2, -1])
def test_zero_and_negative_page_sizes_are_refused(size_kb):
    with pytest.raises(hp.HugepageError, match=r"pools\[0\]\.size_kb is -?[0-9]+; it must be"):
        hp.parse_pools(pools_of((0, size_kb, 1)))
    with pytest.raises(hp.HugepageError) as err:
        hp.parse_sizes([G1, size_kb], "boot_reserve_sizes_kb")
    assert f"boot_reserve_sizes_kb: {size_kb} is not a page size in kB" in str(err.value)


@pytest.mark.parametrize(("values", "want"), [([], ()), ([G1, M2, G1], (M2, G1)), ([1], (1,))])
def test_parse_sizes_sorted_and_distinct(values, want):
    assert hp.parse_sizes(values, "boot_reserve_sizes_kb") == want


@pytest.mark.parametrize("values", [G1, "1048576", [True], ["2M"], [1.0]])
def test_parse_sizes_refuses_what_is_not_a_list_of_sizes(values):
    with pytest.raises(hp.HugepageError, match="^boot_reserve_sizes_kb: .* is not a"):
        hp.parse_sizes(values, "boot_reserve_sizes_kb")


def test_smallest_sizes_and_counts_are_taken():
    assert hp.parse_pools(pools_of((0, 1, 0))) == {(0, 1): 0}


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (M2, "2M"),
        (G1, "1G"),
        (64, "64K"),
        (16384, "16M"),
        (16 * G1, "16G"),
        (1024, "1M"),
        (3072, "3M"),
        (3 * G1, "3G"),
        (G1 // 2, "512M"),
        (1536, "1536K"),
    ],
)
def test_format_size(size, text):
    assert hp.format_size(size) == text


@pytest.mark.parametrize(
    ("desired", "sizes", "args"),
    [
        ({(0, G1): 4, (1, G1): 4}, [G1], ["hugepagesz=1G", "hugepages=0:4,1:4"]),
        ({(1, G1): 2, (0, G1): 0}, [G1], ["hugepagesz=1G", "hugepages=1:2"]),
        ({(0, G1): 0, (1, G1): 0}, [G1], []),
        ({(0, M2): 512, (0, G1): 1}, [G1], ["hugepagesz=1G", "hugepages=0:1"]),
        (
            {(0, M2): 512, (0, G1): 1},
            [M2, G1],
            ["hugepagesz=2M", "hugepages=0:512", "hugepagesz=1G", "hugepages=0:1"],
        ),
    ],
)
def test_kernel_args_per_node_syntax(desired, sizes, args):
    assert hp.kernel_args(desired, sizes) == args


@pytest.mark.parametrize(
    ("text", "release"),
    [("6.1.0-18-amd64\n", (6, 1)), ("5.16.0", (5, 16)), ("4.18.0-513.el8.x86_64", (4, 18))],
)
def test_parse_kernel_release(text, release):
    assert hp.parse_kernel_release(text) == release


@pytest.mark.parametrize(
    ("release", "ok"), [((5, 15), False), ((4, 18), False), ((5, 16), True), ((6, 1), True)]
)
def test_kernel_version_gate(release, ok):
    args = ["hugepagesz=1G", "hugepages=0:4"]
    if ok:
        hp.check_kernel(release, args)
    else:
        with pytest.raises(hp.HugepageError) as err:
            hp.check_kernel(release, args)
        assert f"the kernel is {release[0]}.{release[1]}" in str(err.value)
        assert "need Linux 5.16 or newer" in str(err.value)
    hp.check_kernel((3, 10), [])  # nothing reserved at boot: any kernel


# --- delta -------------------------------------------------------------------------------------


def cur(**pools):
    """{(node, size): Pool} from n0_2048=(total, free) keywords."""
    out = {}
    for key, (total, free) in pools.items():
        node, size = key[1:].split("_")
        out[(int(node), int(size))] = hp.Pool(int(node), int(size), total, free, 0)
    return out


@pytest.mark.parametrize(
    ("current", "desired", "boot", "want", "warned"),
    [
        # grow one node; the unlisted node of the managed size goes to 0
        (
            cur(n0_2048=(16, 16), n1_2048=(4, 4)),
            {(0, M2): 32},
            (),
            [(0, M2, 16, 32, 0), (1, M2, 4, 0, 0)],
            [],
        ),
        # already as wanted: no change
        (cur(n0_2048=(32, 10), n1_2048=(0, 0)), {(0, M2): 32}, (), [(0, M2, 32, 32, 22)], []),
        # shrink below in use: kept at in use, warned
        (
            cur(n0_2048=(16, 16), n1_2048=(48, 16)),
            {(0, M2): 16, (1, M2): 8},
            (),
            [(0, M2, 16, 16, 0), (1, M2, 48, 32, 32)],
            [1],
        ),
        # shrink to exactly the pages in use: no warning
        (cur(n0_2048=(48, 16)), {(0, M2): 32}, (), [(0, M2, 48, 32, 32)], []),
        # a boot-reserved size is planned as desired, never kept for pages in use
        (cur(n0_1048576=(2, 0)), {(0, G1): 1}, (G1,), [(0, G1, 2, 1, 2)], []),
    ],
)
def test_plan_pools_delta(current, desired, boot, want, warned):
    sizes = sorted({size for (dummy, size) in current} | {size for (dummy, size) in desired})
    changes, warnings = hp.plan_pools([0, 1], current, desired, sizes, boot)
    got = [(c.node, c.size_kb, c.before, c.after, c.in_use) for c in changes if c.before or c.after]
    assert got == [entry for entry in want if entry[2] or entry[3]]
    assert [int(w.split(",")[0].split()[1]) for w in warnings] == warned
    for warning in warnings:
        assert "stop the services holding them, then run again" in warning


def test_in_use_warning_names_node_size_in_use_and_desired():
    dummy, warnings = hp.plan_pools([1], cur(n1_2048=(48, 16)), {(1, M2): 8}, [M2], ())
    assert warnings == [
        "node 1, 2048 kB pages: 32 in use, 8 desired; the pool is kept at 32 instead of "
        "shrinking below the pages in use: stop the services holding them, then run again"
    ]


@pytest.mark.parametrize(
    ("desired", "fragment"),
    [
        ({(7, M2): 4}, "pools: node 7 does not exist on this host (NUMA nodes: 0, 1)"),
        ({(1, G1): 4}, "pools: node 1 has no 1048576 kB hugepage pool"),
        ({(0, 64): 1}, "(<sysfs_root>/devices/system/node/node0/hugepages/hugepages-64kB is "),
    ],
)
def test_unknown_node_or_size_is_an_error(desired, fragment):
    with pytest.raises(hp.HugepageError) as err:
        hp.plan_pools([0, 1], cur(n0_2048=(0, 0), n1_2048=(0, 0)), desired, [M2, G1, 64], ())
    assert fragment in str(err.value)


def test_unknown_size_message_lists_the_pools_the_kernel_has(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    with pytest.raises(hp.HugepageError) as err:
        plan(sysfs, procfs, tmp_path, pools_of((1, 16384, 2)))
    assert "node 1 has no 16384 kB hugepage pool" in str(err.value)
    assert "pools of that node: 2048 kB, 1048576 kB" in str(err.value)


def test_a_node_without_the_pool_is_skipped_when_it_wants_none():
    """A memory-less node has no pools: not an error unless pages are asked of it."""
    changes, dummy = hp.plan_pools([0, 1], cur(n0_2048=(0, 0)), {(0, M2): 4, (1, M2): 0}, [M2], ())
    assert [(c.node, c.after) for c in changes] == [(0, 4)]


# --- runtime writes: read-back, short grant, rollback ------------------------------------------


def test_write_pools_shrinks_first_and_reads_back(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (16, 16), (1, M2): (48, 48)})
    nodes, current, dummy = hp.read_pools(sysfs, procfs, [M2])
    changes, dummy = hp.plan_pools(nodes, current, {(0, M2): 64, (1, M2): 8}, [M2], ())
    writer = kernel()
    written = hp.write_pools(sysfs, changes, writer)
    assert [(c.node, c.after) for c in written] == [(1, 8), (0, 64)]
    assert [value for dummy, value in writer.calls] == [8, 64]
    assert read_int(pool_path(sysfs, 0, M2)) == 64
    assert read_int(pool_path(sysfs, 1, M2)) == 8


def test_short_grant_restores_every_pool_written_and_fails(tmp_path):
    sysfs, procfs = make_tree(
        tmp_path, {(0, M2): (16, 16), (1, M2): (48, 16), (0, G1): (0, 0), (1, G1): (0, 0)}
    )
    before = snapshot(sysfs)
    nodes, current, dummy = hp.read_pools(sysfs, procfs, [M2])
    desired = {(0, M2): 64, (1, M2): 100}
    changes, dummy = hp.plan_pools(nodes, current, desired, [M2], ())

    def grant(base, requested, was):  # node 1 only finds 60 pages
        return min(requested, 60) if "node1" in base else requested

    writer = kernel(grant=grant)
    with pytest.raises(hp.HugepageGrantError) as err:
        hp.write_pools(sysfs, changes, writer)
    message = str(err.value)
    assert err.value.short == [(1, M2, 100, 60)]
    assert err.value.unrestored == []
    assert "node 1, 2048 kB pages: requested 100, granted 60" in message
    assert (
        "restored to its previous total (node 0, 2048 kB pages: 16; node 1, 2048 kB pages: 48)"
        in message
    )
    assert "nothing changed" in message
    assert "hugepagesz=2M hugepages=0:64,1:100" in message
    assert "boot_reserve_sizes_kb" in message and "hugepages_boot_reserve" in message
    # node 0 was grown first (both grow: node order), then node 1 came up short: both restored
    assert [value for dummy, value in writer.calls] == [64, 100, 48, 16]
    assert snapshot(sysfs) == before


def test_a_refused_write_is_a_short_grant_too(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (16, 16), (1, M2): (0, 0)})
    before = snapshot(sysfs)
    nodes, current, dummy = hp.read_pools(sysfs, procfs, [M2])
    changes, dummy = hp.plan_pools(nodes, current, {(0, M2): 8, (1, M2): 4}, [M2], ())
    writer = kernel(fail=lambda path, value: "node1" in path and value == 4)
    with pytest.raises(hp.HugepageGrantError) as err:
        hp.write_pools(sysfs, changes, writer)
    assert "node 1, 2048 kB pages: requested 4, granted unknown" in str(err.value)
    assert "Cannot allocate memory" in str(err.value)
    assert snapshot(sysfs) == before


def test_a_pool_that_cannot_be_restored_is_named(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (0, 0), (1, M2): (0, 0)})
    nodes, current, dummy = hp.read_pools(sysfs, procfs, [M2])
    changes, dummy = hp.plan_pools(nodes, current, {(0, M2): 8, (1, M2): 8}, [M2], ())

    def grant(base, requested, was):
        if "node1" in base:
            return min(requested, 2)
        return 5 if requested == 0 else requested  # node 0 keeps 5 when asked to go back to 0

    with pytest.raises(hp.HugepageGrantError) as err:
        hp.write_pools(sysfs, changes, kernel(grant=grant))
    assert err.value.unrestored == [(0, M2, 0, 5)]
    assert "could NOT be restored" in str(err.value)
    assert "node 0, 2048 kB pages: was 0, now 5" in str(err.value)


# --- the whole plan on the recorded 2-node kernel ----------------------------------------------


def test_plan_writes_nothing_apply_then_nothing_left_to_do(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    root.mkdir()
    wanted = pools_of((0, M2, 32), (1, M2, 48))
    before = snapshot(sysfs, root)
    first = plan(sysfs, procfs, root, wanted, service_manager="none")
    assert snapshot(sysfs, root) == before  # planning (check mode) writes nothing
    assert first.changed and first.reload_needed and not first.cmdline_changed
    assert [p.as_dict() for p in first.pools] == [
        {
            "node": 0,
            "size_kb": M2,
            "before": 16,
            "after": 32,
            "desired": 32,
            "in_use": 0,
            "boot": False,
        },
        {
            "node": 1,
            "size_kb": M2,
            "before": 48,
            "after": 48,
            "desired": 48,
            "in_use": 32,
            "boot": False,
        },
    ]
    assert [(c.path, c.state) for c in first.files] == [
        (hp.STATE_PATH, "create"),
        (hp.UNIT_PATH, "create"),
        (hp.PROGRAM_PATH, "create"),
    ]
    assert first.would_run() == [
        "systemctl daemon-reload",
        "systemctl enable numafleet-hugepages.service",
    ]
    diff = first.diff()
    assert diff[0]["before"] == "node0 2048kB: 16\n" and diff[0]["after"] == "node0 2048kB: 32\n"
    assert [entry["after_header"] for entry in diff[1:]] == [
        hp.STATE_PATH,
        hp.UNIT_PATH,
        hp.PROGRAM_PATH,
    ]

    hp.apply_hugepages(first, kernel())
    assert read_int(pool_path(sysfs, 0, M2)) == 32
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert state["managed_sizes_kb"] == [M2]
    assert state["pools"] == [
        {"node": 0, "size_kb": M2, "count": 32},
        {"node": 1, "size_kb": M2, "count": 48},
    ]
    assert oct(os.stat(root / hp.PROGRAM_PATH.lstrip("/")).st_mode & 0o777) == "0o755"
    assert oct(os.stat(root / hp.UNIT_PATH.lstrip("/")).st_mode & 0o777) == "0o644"

    again = plan(sysfs, procfs, root, wanted, service_manager="none")
    assert not again.changed and again.would_run() == [] and again.diff() == []


def test_shrink_below_in_use_keeps_the_pages_and_settles(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    wanted = pools_of((0, M2, 16), (1, M2, 8))
    first = plan(sysfs, procfs, root, wanted)
    assert [(p.node, p.after) for p in first.pools] == [(0, 16), (1, 32)]
    assert len(first.warnings) == 1 and "32 in use, 8 desired" in first.warnings[0]
    hp.apply_hugepages(first, kernel())
    assert read_int(pool_path(sysfs, 1, M2)) == 32
    # The state records what the next boot applies: the desired total, not the pages in use.
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert {"node": 1, "size_kb": M2, "count": 8} in state["pools"]
    again = plan(sysfs, procfs, root, wanted)
    assert not again.changed and len(again.warnings) == 1


def test_a_size_that_leaves_pools_goes_back_to_zero(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    hp.apply_hugepages(plan(sysfs, procfs, root, pools_of((0, G1, 0), (0, M2, 16))), kernel())
    hp.apply_hugepages(plan(sysfs, procfs, root, pools_of((0, M2, 16), (1, M2, 32))), kernel())
    release = plan(sysfs, procfs, root, [])
    # node 0 goes to 0; node 1 keeps its 32 pages in use, so 2 MiB stays managed for the next run
    assert [(p.node, p.size_kb, p.after) for p in release.pools] == [(0, M2, 0), (1, M2, 32)]
    hp.apply_hugepages(release, kernel())
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert state["managed_sizes_kb"] == [M2]
    assert state["pools"] == [
        {"node": 0, "size_kb": M2, "count": 0},
        {"node": 1, "size_kb": M2, "count": 0},
    ]
    # once the pages are no longer used, the size is released for good
    write_int(pool_path(sysfs, 1, M2, "free_hugepages"), 32)
    hp.apply_hugepages(plan(sysfs, procfs, root, []), kernel())
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert state["managed_sizes_kb"] == [] and state["pools"] == []
    assert read_int(pool_path(sysfs, 1, M2)) == 0
    assert not plan(sysfs, procfs, root, []).changed


def test_nothing_managed_and_no_state_writes_nothing(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    result = plan(sysfs, procfs, tmp_path / "root", [])
    assert not result.changed and result.files == () and result.pools == ()
    assert not (tmp_path / "root").exists()


def test_short_grant_through_the_plan_changes_nothing(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    before = snapshot(sysfs)
    first = plan(sysfs, procfs, root, pools_of((0, M2, 64), (1, M2, 4000)))
    with pytest.raises(hp.HugepageGrantError) as err:
        hp.apply_hugepages(first, kernel(grant=lambda base, req, was: min(req, 700)))
    assert "node 1, 2048 kB pages: requested 4000, granted 700" in str(err.value)
    assert snapshot(sysfs) == before
    assert not root.exists()  # files are written only after every pool was granted


@pytest.mark.parametrize(
    ("sysfs_rel", "procfs_rel", "fragment"),
    [
        ("missing/sys", "proc", "sysfs_root="),
        ("sys", "missing/proc", "procfs_root="),
    ],
)
def test_roots_that_are_no_trees_fail_naming_the_option(
    fixture_root, tmp_path, sysfs_rel, procfs_rel, fragment
):
    fsroot = fixture_root(QEMU)
    sysfs = f"{fsroot}/{sysfs_rel}" if sysfs_rel == "sys" else str(tmp_path / sysfs_rel)
    procfs = f"{fsroot}/{procfs_rel}" if procfs_rel == "proc" else str(tmp_path / procfs_rel)
    with pytest.raises(hp.HugepageError) as err:
        plan(sysfs, procfs, tmp_path / "root", pools_of((0, M2, 1)))
    assert fragment in str(err.value)


def test_an_unreadable_pool_is_an_error_naming_the_file(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (16, 16)})
    write_int(pool_path(sysfs, 0, M2), "many")
    with pytest.raises(hp.HugepageError) as err:
        plan(sysfs, procfs, tmp_path / "root", pools_of((0, M2, 1)))
    assert "node 0, 2048 kB pages: the pool cannot be read" in str(err.value)
    assert "nr_hugepages" in str(err.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "is not JSON"),
        ('{"version": 2}', "is not a version 1 numafleet hugepages state"),
        ('{"version": 1, "managed_sizes_kb": ["2M"]}', "managed_sizes_kb is not a list"),
        ('{"version": 1, "pools": [{"node": 0}]}', "pools holds {'node': 0}"),
        ('{"version": 1, "kernel_args": "hugepages=1"}', "kernel_args is not a list"),
        ('{"version": 1, "bootloader": "lilo"}', "bootloader 'lilo'"),
    ],
)
def test_a_malformed_state_file_fails_with_the_fix(fixture_root, tmp_path, text, fragment):
    sysfs, procfs = qemu(fixture_root)
    state = tmp_path / "root" / hp.STATE_PATH.lstrip("/")
    state.parent.mkdir(parents=True)
    state.write_text(text)
    with pytest.raises(hp.HugepageError) as err:
        plan(sysfs, procfs, tmp_path / "root", [])
    assert str(state) in str(err.value) and fragment in str(err.value)
    assert "Restore it from the last run, or remove it" in str(err.value)


def test_errors_are_numa_tune_errors():
    assert issubclass(hp.HugepageGrantError, hp.HugepageError)
    assert issubclass(hp.HugepageError, NumaTuneError)


# --- boot reservations -------------------------------------------------------------------------


def grub_absent(result) -> bool:
    return hp.GRUB_PATH not in [c.path for c in result.files]


BOOT = pools_of((0, G1, 2), (1, G1, 1), (0, M2, 16), (1, M2, 48))  # 2 MiB pools as recorded


def test_boot_reserved_size_goes_to_grub_and_is_not_written(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, "6.1.0-18-amd64")
    root = tmp_path / "root"
    first = plan(sysfs, procfs, root, BOOT, boot_reserve_sizes_kb=[G1], bootloader="grub_d")
    assert first.kernel_args == ("hugepagesz=1G", "hugepages=0:2,1:1")
    assert first.cmdline_changed and first.would_run()[-1] == "update-grub"
    boot = [p for p in first.pools if p.boot]
    assert [(p.node, p.before, p.after) for p in boot] == [(0, 0, 2), (1, 0, 1)]
    writer = kernel()
    hp.apply_hugepages(first, writer)
    assert writer.calls == []  # 1G is reserved at boot only; 2 MiB pools are already as wanted
    grub = (root / hp.GRUB_PATH.lstrip("/")).read_text()
    assert grub.endswith(
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX hugepagesz=1G hugepages=0:2,1:1"\n'
    )
    assert grub.startswith("# Managed by numafleet.tuning")
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert state["boot_pools"] == [
        {"node": 0, "size_kb": G1, "count": 2},
        {"node": 1, "size_kb": G1, "count": 1},
    ]
    assert all(entry["size_kb"] == M2 for entry in state["pools"])  # the program skips 1G
    again = plan(sysfs, procfs, root, BOOT, boot_reserve_sizes_kb=[G1], bootloader="grub_d")
    assert not again.changed and not again.cmdline_changed and again.would_run() == []
    # the 1G pools are dropped: the drop-in goes, the command line changes again
    runtime_only = pools_of((0, M2, 16), (1, M2, 48))
    dropped = plan(
        sysfs, procfs, root, runtime_only, boot_reserve_sizes_kb=[G1], bootloader="grub_d"
    )
    assert dropped.cmdline_changed and dropped.kernel_args == ()
    assert (hp.GRUB_PATH, "remove") in [(c.path, c.state) for c in dropped.files]


def test_grubby_gets_argv_lists_that_replace_the_last_run(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, "5.16.0")
    root = tmp_path / "root"
    first = plan(sysfs, procfs, root, BOOT, boot_reserve_sizes_kb=[G1], bootloader="grubby")
    assert first.grubby_argvs() == [
        ["grubby", "--update-kernel=ALL", "--args=hugepagesz=1G hugepages=0:2,1:1"]
    ]
    assert grub_absent(first)
    hp.apply_hugepages(first, kernel())
    more = pools_of((0, G1, 4), (1, G1, 1), (0, M2, 16), (1, M2, 48))
    second = plan(sysfs, procfs, root, more, boot_reserve_sizes_kb=[G1], bootloader="grubby")
    assert second.cmdline_changed
    assert second.grubby_argvs() == [
        ["grubby", "--update-kernel=ALL", "--remove-args=hugepagesz=1G hugepages=0:2,1:1"],
        ["grubby", "--update-kernel=ALL", "--args=hugepagesz=1G hugepages=0:4,1:1"],
    ]
    assert second.as_result(False, False)["kernel_args_removed"] == [
        "hugepagesz=1G",
        "hugepages=0:2,1:1",
    ]


def test_grubby_takes_one_boot_size_only(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, "6.1.0")
    with pytest.raises(hp.HugepageError) as err:
        plan(sysfs, procfs, tmp_path, BOOT, boot_reserve_sizes_kb=[M2, G1], bootloader="grubby")
    assert "only one page size can be reserved at boot" in str(err.value)


def test_bootloader_none_returns_the_args_only(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, "6.1.0")
    result = plan(sysfs, procfs, tmp_path, BOOT, boot_reserve_sizes_kb=[G1], bootloader="none")
    assert result.cmdline_changed and result.would_run()[-1:] != ["update-grub"]
    assert result.kernel_args == ("hugepagesz=1G", "hugepages=0:2,1:1")
    assert grub_absent(result)


@pytest.mark.parametrize(
    ("release", "fragment"),
    [
        ("5.15.0-91-generic", "the kernel is 5.15, and per-node boot reservations"),
        (None, "sys/kernel/osrelease: missing (and so is"),
        ("garbage", "is not a kernel release"),
    ],
)
def test_boot_reservation_needs_a_known_new_kernel(fixture_root, tmp_path, release, fragment):
    sysfs, procfs = qemu(fixture_root)
    if release:
        os.makedirs(f"{procfs}/sys/kernel", exist_ok=True)
        with open(f"{procfs}/sys/kernel/osrelease", "w", encoding="ascii") as handle:
            handle.write(release)
    with pytest.raises(hp.HugepageError) as err:
        plan(sysfs, procfs, tmp_path, BOOT, boot_reserve_sizes_kb=[G1], bootloader="grub_d")
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("present", "choice", "want"),
    [
        (["usr/sbin/grubby", "etc/default/grub"], "auto", "grubby"),
        (["etc/default/grub"], "auto", "grub_d"),
        (["usr/sbin/update-grub"], "auto", "grub_d"),
        ([], "grub_d", "grub_d"),
        ([], "none", "none"),
        ([], "auto", None),
    ],
)
def test_resolve_bootloader(tmp_path, present, choice, want):
    for rel in present:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    if want:
        assert hp.resolve_bootloader(choice, str(tmp_path)) == want
    else:
        with pytest.raises(hp.HugepageError) as err:
            hp.resolve_bootloader(choice, str(tmp_path))
        assert "set bootloader to grub_d (Debian, Ubuntu), grubby (RHEL) or none" in str(err.value)


# --- the boot program and the unit -------------------------------------------------------------


def run_program(root, sysfs, config=None):
    program = root / hp.PROGRAM_PATH.lstrip("/")
    config = config or root / hp.STATE_PATH.lstrip("/")
    argv = [sys.executable, str(program), "--config", str(config), "--sysfs-root", str(sysfs)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_boot_program_applies_the_state_to_a_scratch_sysfs(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    hp.apply_hugepages(plan(sysfs, procfs, root, pools_of((0, M2, 8), (1, M2, 40))), kernel())
    # a "reboot": every pool back to 0, nothing in use
    for node in (0, 1):
        write_int(pool_path(sysfs, node, M2), 0)
        write_int(pool_path(sysfs, node, M2, "free_hugepages"), 0)
    proc = run_program(root, sysfs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_int(pool_path(sysfs, 0, M2)) == 8 and read_int(pool_path(sysfs, 1, M2)) == 40
    assert "<6>numafleet-hugepages: node 1, 2048 kB pages: 0 -> 40" in proc.stdout
    assert read_int(pool_path(sysfs, 0, G1)) == 0  # sizes not in the state are left alone


def test_boot_program_exits_1_when_a_pool_cannot_be_written(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    hp.apply_hugepages(plan(sysfs, procfs, root, pools_of((0, M2, 8), (1, M2, 40))), kernel())
    target = pool_path(sysfs, 1, M2)
    os.unlink(target)
    os.mkdir(target)  # a write there fails like a refused one
    proc = run_program(root, sysfs)
    assert proc.returncode == 1
    assert "<3>numafleet-hugepages: node 1, 2048 kB pages: cannot read" in proc.stdout
    assert read_int(pool_path(sysfs, 0, M2)) == 8  # the other node is still applied


@pytest.mark.parametrize(
    "text", ["{", '{"version": 9, "pools": []}', '{"version": 1, "pools": [{"node": -1}]}']
)
def test_boot_program_exits_2_on_an_unusable_state(fixture_root, tmp_path, text):
    sysfs, dummy = qemu(fixture_root)
    before = snapshot(sysfs)
    (tmp_path / "bad.json").write_text(text)
    root = tmp_path / "root"
    program = root / hp.PROGRAM_PATH.lstrip("/")
    program.parent.mkdir(parents=True)
    program.write_text(hp.BOOT_PROGRAM)
    proc = run_program(root, sysfs, tmp_path / "bad.json")
    assert proc.returncode == 2 and "no pool changed" in proc.stdout
    assert snapshot(sysfs) == before


def _verify(unit_file) -> list:
    argv = [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit_file)]
    env = dict(os.environ, LC_ALL="C", SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return lines + ([f"rc={proc.returncode}"] if proc.returncode else [])


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify_silently(tmp_path):
    unit = tmp_path / hp.UNIT_NAME
    unit.write_text(hp.render_unit())
    assert _verify(unit) == []


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_verify_check_catches_a_bad_key(tmp_path):
    unit = tmp_path / hp.UNIT_NAME
    unit.write_text(hp.render_unit().replace("RemainAfterExit=yes", "RemainAfterExitt=yes"))
    assert any("RemainAfterExitt" in line for line in _verify(unit))


def test_unit_orders_itself_early_and_waits_for_the_state():
    text = hp.render_unit()
    for line in (
        "Type=oneshot",
        "RemainAfterExit=yes",
        "DefaultDependencies=no",
        "After=local-fs.target",
        "Before=sysinit.target shutdown.target",
        "Conflicts=shutdown.target",
        "WantedBy=sysinit.target",
        f"ConditionPathExists={hp.STATE_PATH}",
        f"ExecStart=/usr/bin/python3 {hp.PROGRAM_PATH} --config {hp.STATE_PATH}",
    ):
        assert line in text.splitlines()


def test_boot_program_is_valid_python():
    compile(hp.BOOT_PROGRAM, hp.PROGRAM_PATH, "exec")
    assert hp.BOOT_PROGRAM.startswith("#!/usr/bin/python3\n")


# --- hugetlbfs mounts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "escaped"),
    [
        ("/dev/hugepages1G", "dev-hugepages1G"),
        ("/mnt/huge-1g", "mnt-huge\\x2d1g"),
        ("/dev/hugepages", "dev-hugepages"),
        ("/", "-"),
        ("/a//b/", "a-b"),
        ("/.hidden/x.y", "\\x2ehidden-x.y"),
        ("/srv/a.b/.c", "srv-a.b-.c"),
        ("/mnt/a b", "mnt-a\\x20b"),
        ("/mnt/100%", "mnt-100\\x25"),
        ("/mnt/back\\slash", "mnt-back\\x5cslash"),
        ("/mnt/a:b_c", "mnt-a:b_c"),
        ("/mnt/\u00e4", "mnt-\\xc3\\xa4"),
    ],
)
def test_escape_path_is_systemd_escape_path(path, escaped):
    assert hp.escape_path(path) == escaped


@pytest.mark.skipif(shutil.which("systemd-escape") is None, reason="systemd-escape is missing")
@pytest.mark.parametrize("path", ["/dev/hugepages1G", "/mnt/huge-1g", "/.x/a-b", "/a b/%\u00e4"])
def test_escape_path_matches_the_real_tool(path):
    proc = subprocess.run(
        ["systemd-escape", "--path", path],
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C"),
        timeout=30,
        check=True,
    )
    assert hp.escape_path(path) == proc.stdout.strip()


def test_parse_mounts_normalizes_defaults_and_sorts():
    got = hp.parse_mounts(
        [
            {"path": "/mnt/huge-1g/", "size_kb": G1, "group": "llm"},
            {"path": "/dev//hugepages2M", "size_kb": M2, "mode": "0755"},
        ],
        [M2, G1],
    )
    assert got == (
        hp.Mount("/dev/hugepages2M", M2, "0755", None),
        hp.Mount("/mnt/huge-1g", G1, "1770", "llm"),
    )
    assert [m.unit for m in got] == ["dev-hugepages2M.mount", "mnt-huge\\x2d1g.mount"]
    assert got[1].unit_path == "/etc/systemd/system/mnt-huge\\x2d1g.mount"


@pytest.mark.parametrize(
    ("mounts", "fragment"),
    [
        ("x", "mounts: 'x' is not a list"),
        (["x"], "mounts[0]: 'x' is not a mapping"),
        ([{"path": "dev/hp", "size_kb": M2}], "mounts[0].path is 'dev/hp'; it must be an absolute"),
        ([{"path": None, "size_kb": M2}], "mounts[0].path is None; it must be an absolute path"),
        ([{"path": "/", "size_kb": M2}], "mounts[0].path is '/'; hugetlbfs cannot be mounted on /"),
        ([{"path": "//", "size_kb": M2}], "hugetlbfs cannot be mounted on /"),
        (
            [{"path": "/mnt/a\nb", "size_kb": M2}],
            "mounts[0].path is '/mnt/a\\nb'; it holds a control",
        ),
        ([{"path": "/mnt/a\tb", "size_kb": M2}], "control character"),
        ([{"path": "/mnt/../etc", "size_kb": M2}], "'.' or '..' component"),
        ([{"path": "/mnt/./huge", "size_kb": M2}], "'.' or '..' component"),
        (
            [{"path": "/dev/hp", "size_kb": M2}, {"path": "/dev//hp/", "size_kb": G1}],
            "mounts[1].path /dev/hp is also mounts[0].path; give each mount point once",
        ),
        (
            [{"path": "/dev/hp", "size_kb": 4096}],
            "mounts[0].size_kb is 4096; this kernel has no 4096 kB hugepages (offered: 2048, "
            "1048576). Use a page size the kernel offers",
        ),
        ([{"path": "/dev/hp", "size_kb": "2M"}], "mounts[0].size_kb is '2M'; it must be a page"),
        ([{"path": "/dev/hp", "size_kb": M2, "mode": "777x"}], "mounts[0].mode is '777x'; give"),
        ([{"path": "/dev/hp", "size_kb": M2, "mode": 1770}], "mounts[0].mode is 1770; give the"),
        ([{"path": "/dev/hp", "size_kb": M2, "group": "a,b"}], "mounts[0].group is 'a,b'; give a"),
        ([{"path": "/x" + "/x" * 130, "size_kb": M2}], "is longer than 255 characters"),
        ([{"path": "/" + "x" * 300, "size_kb": M2}], "with a component of 300"),
        ([{"path": "/dev/hp\\", "size_kb": M2}], "ends in a backslash"),
        ([{"path": "/dev/hp ", "size_kb": M2}], "ends with a space"),
        ([{"path": "/dev/hp\u2028x", "size_kb": M2}], "U+2028"),
        # A mount hides what is below it: never on the system's own directories.
        ([{"path": "/etc", "size_kb": M2}], "mounts[0].path is '/etc'; a hugetlbfs mount there"),
        ([{"path": "/usr/", "size_kb": M2}], "would hide the system's own files"),
        ([{"path": "/var/lib", "size_kb": M2}], "would hide the system's own files"),
        ([{"path": "/dev", "size_kb": M2}], "would hide the system's own files"),
        ([{"path": "/etc/ssh", "size_kb": M2}], "would hide the system's own files"),
        ([{"path": "/sys/fs/x", "size_kb": M2}], "would hide the system's own files"),
        ([{"path": "/home/alice", "size_kb": M2}], "would hide the system's own files"),
    ],
)
def test_parse_mounts_refuses_bad_entries(mounts, fragment):
    with pytest.raises(hp.HugepageError) as exc:
        hp.parse_mounts(mounts, [M2, G1])
    assert fragment in str(exc.value)


@pytest.mark.parametrize(
    ("size", "text"), [(G1, "1G"), (M2, "2M"), (64, "64kB"), (16 << 20, "16G"), (512, "512kB")]
)
def test_mount_pagesize(size, text):
    assert hp.mount_pagesize(size) == text


def test_render_mount_unit():
    text = hp.render_mount(hp.Mount("/mnt/huge-1g", G1, "1770", "llm"))
    assert text.splitlines() == [
        hp.HEADER,
        "[Unit]",
        "Description=numafleet hugetlbfs, 1G pages, at /mnt/huge-1g",
        "DefaultDependencies=no",
        "Before=sysinit.target",
        "",
        "[Mount]",
        "What=hugetlbfs",
        "Where=/mnt/huge-1g",
        "Type=hugetlbfs",
        "Options=pagesize=1G,mode=1770,gid=llm",
        "",
        "[Install]",
        "WantedBy=sysinit.target",
    ]
    plain = hp.render_mount(hp.Mount("/dev/hugepages2M", M2))
    assert "Options=pagesize=2M,mode=1770" in plain.splitlines()
    assert "Where=/mnt/100%%" in hp.render_mount(hp.Mount("/mnt/100%", M2)).splitlines()


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(
    "mount",
    [
        hp.Mount("/dev/hugepages1G", G1),
        hp.Mount("/mnt/huge-1g", G1, "0770", "llm"),
        hp.Mount("/mnt/a b%", M2, "1777"),
    ],
)
def test_mount_unit_passes_systemd_analyze_verify_silently(tmp_path, mount):
    unit = tmp_path / mount.unit  # names with \x2d only ever exist below tmp_path
    unit.write_text(hp.render_mount(mount))
    assert _verify(unit) == []


MOUNT_1G = {"path": "/dev/hugepages1G", "size_kb": G1}
MOUNT_2M = {"path": "/mnt/huge-2m", "size_kb": M2, "mode": "0770", "group": "llm"}
UNIT_1G = "/etc/systemd/system/dev-hugepages1G.mount"
UNIT_2M = "/etc/systemd/system/mnt-huge\\x2d2m.mount"


def test_mounts_render_then_settle_then_are_removed(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    root.mkdir()
    wanted = pools_of((0, M2, 16), (1, M2, 48))
    before = snapshot(sysfs, root)
    first = plan(sysfs, procfs, root, wanted, mounts=[MOUNT_2M, MOUNT_1G])
    assert snapshot(sysfs, root) == before  # planning (check mode) writes nothing
    assert first.changed
    assert first.mount_start == ["dev-hugepages1G.mount", "mnt-huge\\x2d2m.mount"]
    assert first.mount_restart == [] and first.mount_stop == []
    assert (UNIT_1G, "create") in [(c.path, c.state) for c in first.files]
    assert first.would_run() == [
        "systemctl daemon-reload",
        "systemctl enable numafleet-hugepages.service",
        "systemctl enable --now dev-hugepages1G.mount",
        "systemctl enable --now mnt-huge\\x2d2m.mount",
    ]
    result = first.as_result(check_mode=False, diff=True)
    assert result["handler_mount_start"] == first.mount_start
    assert result["mounts"][0] == {
        "path": "/dev/hugepages1G",
        "unit": "dev-hugepages1G.mount",
        "size_kb": G1,
        "mode": "1770",
        "group": None,
        "state": "create",
    }
    assert UNIT_2M in [entry["after_header"] for entry in result["diff"]]
    assert first.as_result(check_mode=True, diff=False)["handler_mount_start"] == []

    hp.apply_hugepages(first, kernel())
    unit_file = root / UNIT_2M.lstrip("/")
    assert "Options=pagesize=2M,mode=0770,gid=llm" in unit_file.read_text().splitlines()
    assert oct(os.stat(unit_file).st_mode & 0o777) == "0o644"
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert state["mounts"] == ["dev-hugepages1G.mount", "mnt-huge\\x2d2m.mount"]

    again = plan(sysfs, procfs, root, wanted, mounts=[MOUNT_1G, MOUNT_2M])
    assert not again.changed and again.would_run() == [] and again.diff() == []
    assert {state for dummy, state in again.mount_units} == {"unchanged"}

    changed = plan(sysfs, procfs, root, wanted, mounts=[dict(MOUNT_1G, mode="0700")])
    assert changed.mount_restart == ["dev-hugepages1G.mount"]
    assert changed.mount_stop == ["mnt-huge\\x2d2m.mount"]
    assert changed.would_run() == [
        "systemctl disable --now mnt-huge\\x2d2m.mount",
        "systemctl daemon-reload",
        "systemctl restart dev-hugepages1G.mount",
    ]
    assert (UNIT_2M, "remove") in [(c.path, c.state) for c in changed.files]
    hp.apply_hugepages(changed, kernel())
    assert not unit_file.exists()
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert state["mounts"] == ["dev-hugepages1G.mount"]

    none = plan(sysfs, procfs, root, wanted)
    assert none.mount_stop == ["dev-hugepages1G.mount"]
    hp.apply_hugepages(none, kernel())
    assert not (root / UNIT_1G.lstrip("/")).exists()
    state = json.loads((root / hp.STATE_PATH.lstrip("/")).read_text())
    assert "mounts" not in state  # a state without mounts reads as before mounts existed
    last = plan(sysfs, procfs, root, wanted)
    assert not last.changed and last.mount_units == ()


def test_mounts_alone_persist_the_state_for_their_removal(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    first = plan(sysfs, procfs, root, [], mounts=[MOUNT_1G])
    assert (hp.STATE_PATH, "create") in [(c.path, c.state) for c in first.files]
    hp.apply_hugepages(first, kernel())
    gone = plan(sysfs, procfs, root, [])
    assert gone.mount_stop == ["dev-hugepages1G.mount"]


def test_a_bad_mount_fails_before_anything_is_written(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    root.mkdir()
    before = snapshot(sysfs, root)
    with pytest.raises(hp.HugepageError, match=r"mounts\[1\]\.size_kb is 64; this kernel has no"):
        plan(
            sysfs,
            procfs,
            root,
            pools_of((0, M2, 32)),
            mounts=[MOUNT_1G, {"path": "/x", "size_kb": 64}],
        )
    assert snapshot(sysfs, root) == before


def test_a_foreign_mount_unit_is_never_overwritten(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    foreign = root / UNIT_1G.lstrip("/")
    foreign.parent.mkdir(parents=True)
    foreign.write_text("[Mount]\nWhat=hugetlbfs\n")
    with pytest.raises(hp.HugepageError, match="was not written by numafleet.tuning; remove it"):
        plan(sysfs, procfs, root, [], mounts=[MOUNT_1G])


@pytest.mark.parametrize(
    "mounts", [{"a": 1}, ["x/y.mount"], [".mount"], ["..mount"], ["a.service"], [1]]
)
def test_a_state_with_bad_mounts_fails_with_the_fix(mounts):
    text = json.dumps({"version": 1, "mounts": mounts})
    with pytest.raises(hp.HugepageError, match="mounts is not a list of mount unit names"):
        hp.parse_state(text, "/x.json")


# --- found unguarded by mutation testing (tests/mutation/README.md) ------------------------------


def test_state_file_round_trips_every_field():
    state = hp.State(
        managed_sizes_kb=(M2, G1),
        pools=((0, M2, 512), (1, M2, 256)),
        boot_reserved_sizes_kb=(G1,),
        boot_pools=((0, G1, 2), (1, G1, 1)),
        kernel_args=("hugepagesz=1G", "hugepages=0:2,1:1"),
        bootloader="grub_d",
        mounts=("dev-hugepages1G.mount",),
    )
    assert hp.parse_state(hp.render_state(state), "/x/hugepages.json") == state


@pytest.mark.parametrize(("length", "ok"), [(249, True), (250, False)])
def test_mount_unit_names_stop_at_255_characters(length, ok):
    """systemd's unit name limit: 'a' * 249 + '.mount' is 255 characters and still taken."""
    mounts = [{"path": "/" + "a" * length, "size_kb": M2}]
    if ok:
        assert len(hp.parse_mounts(mounts, [M2])[0].unit) == 255
    else:
        with pytest.raises(hp.HugepageError, match="is longer than 255 characters"):
            hp.parse_mounts(mounts, [M2])


def test_bootloader_messages_list_the_choices_and_paths(tmp_path):
    with pytest.raises(hp.HugepageError) as err:
        hp.resolve_bootloader("lilo", str(tmp_path))
    assert "bootloader: 'lilo' is not one of auto, grub_d, grubby, none" in str(err.value)
    with pytest.raises(hp.HugepageError) as err:
        hp.resolve_bootloader("auto", str(tmp_path))
    assert "grubby (/usr/sbin/grubby, /sbin/grubby, /usr/bin/grubby)" in str(err.value)
    assert "GRUB (/etc/default/grub, /usr/sbin/update-grub)" in str(err.value)


@pytest.mark.parametrize("key", ["pools", "boot_pools"])
def test_a_bad_pool_list_in_the_state_is_named(key):
    text = json.dumps({"version": 1, key: [{"node": 0, "size_kb": M2, "count": -1}]})
    with pytest.raises(hp.HugepageError) as err:
        hp.parse_state(text, "/x/hugepages.json")
    assert str(err.value).startswith(f"/x/hugepages.json: {key}")


@pytest.mark.parametrize("path", ["/dev/hugepages1G", "/mnt/huge", "/run/hugepages", "/srv/hp"])
def test_mount_points_of_their_own_are_accepted(path):
    (mount,) = hp.parse_mounts([{"path": path, "size_kb": M2}], [M2, G1])
    assert mount.path == path


# --- file I/O: the writers and readers the plan and apply use ----------------------------------


def _at(root, path):
    return root / path.lstrip("/")


def test_write_files_creates_updates_removes_and_leaves_unchanged(tmp_path):
    root = tmp_path / "root"
    kept, gone, edited = "/etc/numafleet/kept", "/etc/numafleet/gone", "/etc/numafleet/edited"
    for path, text in ((kept, "kept\n"), (gone, "gone\n"), (edited, "old\n")):
        _at(root, path).parent.mkdir(parents=True, exist_ok=True)
        _at(root, path).write_text(text)
    os.chmod(_at(root, edited), 0o600)
    hp.write_files(
        str(root),
        [
            hp.FileChange(hp.PROGRAM_PATH, "create", None, "#!/bin/true\n"),
            hp.FileChange(hp.UNIT_PATH, "create", None, ""),
            hp.FileChange(edited, "update", "old\n", "new\n"),
            hp.FileChange(gone, "remove", "gone\n", None),
            hp.FileChange(kept, "unchanged", "other\n", "other\n"),
        ],
    )
    assert _at(root, hp.PROGRAM_PATH).read_text() == "#!/bin/true\n"
    assert os.stat(_at(root, hp.PROGRAM_PATH)).st_mode & 0o7777 == 0o755
    assert _at(root, hp.UNIT_PATH).read_text() == ""
    assert os.stat(_at(root, hp.UNIT_PATH)).st_mode & 0o7777 == 0o644
    assert _at(root, edited).read_text() == "new\n"
    assert os.stat(_at(root, edited)).st_mode & 0o7777 == 0o644
    assert not _at(root, gone).exists()
    assert _at(root, kept).read_text() == "kept\n"  # unchanged is never written
    for parent in ("usr/local/libexec", "usr/local", "etc/systemd/system", "etc/systemd"):
        assert os.stat(root / parent).st_mode & 0o7777 == 0o755


def test_file_mode():
    assert hp.file_mode(hp.PROGRAM_PATH) == 0o755
    assert hp.file_mode(hp.UNIT_PATH) == hp.file_mode(hp.STATE_PATH) == 0o644


def test_write_files_error_names_the_path_and_the_fix(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "numafleet").write_text("a file where a directory belongs\n")
    with pytest.raises(hp.HugepageError) as err:
        hp.write_files(str(root), [hp.FileChange(hp.STATE_PATH, "create", None, "{}\n")])
    assert str(err.value).startswith(f"{root}/etc/numafleet: ")
    assert str(err.value).endswith(
        ". Check that the directory is writable, or set root to one that is"
    )


def test_a_linked_state_file_is_refused_not_read(tmp_path):
    root = tmp_path / "root"
    target = tmp_path / "elsewhere.json"
    target.write_text(hp.render_state(hp.State()))
    _at(root, hp.STATE_PATH).parent.mkdir(parents=True)
    os.symlink(target, _at(root, hp.STATE_PATH))
    with pytest.raises(hp.HugepageError) as err:
        hp.read_state(str(root))
    text = str(err.value)
    assert text.startswith(f"{_at(root, hp.STATE_PATH)}: is a symbolic link; ")
    assert "Check its permissions" not in text


def test_a_state_path_that_is_no_file_says_move_it_away(tmp_path):
    root = tmp_path / "root"
    _at(root, hp.STATE_PATH).mkdir(parents=True)
    with pytest.raises(hp.HugepageError) as err:
        hp.read_state(str(root))
    assert str(err.value) == (
        f"{_at(root, hp.STATE_PATH)}: is not a regular file. Move it away; numafleet writes a "
        "file here"
    )


def test_an_unreadable_state_path_says_check_its_permissions(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "numafleet").write_text("not a directory\n")
    with pytest.raises(hp.HugepageError) as err:
        hp.read_state(str(root))
    assert str(err.value).startswith(f"{root}/etc/numafleet: ")
    assert str(err.value).endswith(". Check its permissions")


def test_read_state_absent_and_present(tmp_path):
    root = tmp_path / "root"
    assert hp.read_state(str(root)) == (None, None)
    state = hp.State(managed_sizes_kb=(M2,), pools=((0, M2, 4),))
    text = hp.render_state(state)
    assert text.endswith("}\n") and json.loads(text)["version"] == 1
    _at(root, hp.STATE_PATH).parent.mkdir(parents=True)
    _at(root, hp.STATE_PATH).write_text(text)
    assert hp.read_state(str(root)) == (state, text)


def test_a_linked_unit_reads_as_absent_and_the_write_replaces_the_link(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    target = tmp_path / "victim.service"
    target.write_text("somebody else's\n")
    _at(root, hp.UNIT_PATH).parent.mkdir(parents=True)
    os.symlink(target, _at(root, hp.UNIT_PATH))
    first = plan(sysfs, procfs, root, pools_of((0, M2, 16)))
    assert (hp.UNIT_PATH, "create") in [(c.path, c.state) for c in first.files]
    hp.apply_hugepages(first, kernel())
    assert not os.path.islink(_at(root, hp.UNIT_PATH))
    assert _at(root, hp.UNIT_PATH).read_text() == hp.render_unit()
    assert target.read_text() == "somebody else's\n"


def test_a_file_with_the_wrong_mode_is_updated_to_its_mode(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    wanted = pools_of((0, M2, 16))
    hp.apply_hugepages(plan(sysfs, procfs, root, wanted), kernel())
    os.chmod(_at(root, hp.PROGRAM_PATH), 0o700)
    again = plan(sysfs, procfs, root, wanted)
    assert [(c.path, c.state) for c in again.files if c.state != "unchanged"] == [
        (hp.PROGRAM_PATH, "update")
    ]
    assert again.changed and not again.reload_needed
    hp.apply_hugepages(again, kernel())
    assert os.stat(_at(root, hp.PROGRAM_PATH)).st_mode & 0o7777 == 0o755
    assert not plan(sysfs, procfs, root, wanted).changed


def test_change_diff_shows_absent_text_as_empty():
    assert hp.change_diff(hp.FileChange("/x", "create", None, "new\n")) == {
        "before_header": "/x",
        "after_header": "/x",
        "before": "",
        "after": "new\n",
    }
    assert hp.change_diff(hp.FileChange("/x", "remove", "old\n", None))["after"] == ""
    assert hp.change_diff(hp.FileChange("/x", "update", "old\n", "new\n"))["after"] == "new\n"


def _bare_plan(**kwargs):
    fields = dict(
        sysfs_root="/sys",
        root="/",
        pools=(),
        warnings=(),
        files=(),
        kernel_args=(),
        kernel_args_removed=(),
        cmdline_changed=False,
        bootloader="none",
        service_manager="systemd",
    )
    fields.update(kwargs)
    return hp.HugepagePlan(**fields)


def test_would_run_orders_the_handlers():
    unit = hp.FileChange(hp.UNIT_PATH, "update", "a", "b")
    plan_ = _bare_plan(
        files=(unit,),
        mount_units=(("a.mount", "remove"), ("b.mount", "update"), ("c.mount", "create")),
        cmdline_changed=True,
        bootloader="grubby",
        kernel_args=("hugepagesz=2M",),
        kernel_args_removed=("hugepages=1",),
    )
    assert plan_.would_run() == [
        "systemctl disable --now a.mount",
        "systemctl daemon-reload",
        "systemctl enable numafleet-hugepages.service",
        "systemctl restart b.mount",
        "systemctl enable --now c.mount",
        "grubby --update-kernel=ALL --remove-args=hugepages=1",
        "grubby --update-kernel=ALL --args=hugepagesz=2M",
    ]
    # a mount unit that changes needs a reload even when the service unit does not
    only_mounts = _bare_plan(mount_units=(("a.mount", "unchanged"), ("b.mount", "update")))
    assert only_mounts.would_run() == ["systemctl daemon-reload", "systemctl restart b.mount"]
    assert _bare_plan(mount_units=(("a.mount", "unchanged"),)).would_run() == []
    assert _bare_plan(cmdline_changed=True, bootloader="none").would_run() == []
    assert _bare_plan(cmdline_changed=True, bootloader="grub_d").would_run() == ["update-grub"]
    assert _bare_plan(cmdline_changed=False, bootloader="grub_d").would_run() == []


def test_grubby_argvs_only_when_grubby_and_changed():
    removed_only = _bare_plan(
        cmdline_changed=True, bootloader="grubby", kernel_args_removed=("hugepages=1",)
    )
    assert removed_only.grubby_argvs() == [
        ["grubby", "--update-kernel=ALL", "--remove-args=hugepages=1"]
    ]
    kw = dict(kernel_args=("a=1", "b=2"), kernel_args_removed=("c=3",))
    assert _bare_plan(cmdline_changed=False, bootloader="grubby", **kw).grubby_argvs() == []
    assert _bare_plan(cmdline_changed=True, bootloader="grub_d", **kw).grubby_argvs() == []
    assert _bare_plan(cmdline_changed=True, bootloader="grubby", **kw).grubby_argvs() == [
        ["grubby", "--update-kernel=ALL", "--remove-args=c=3"],
        ["grubby", "--update-kernel=ALL", "--args=a=1 b=2"],
    ]


def test_as_result_handlers_follow_check_mode_and_service_manager():
    unit = hp.FileChange(hp.UNIT_PATH, "create", None, "x")
    units = (("a.mount", "remove"), ("b.mount", "update"), ("c.mount", "create"))
    live = _bare_plan(files=(unit,), mount_units=units).as_result(False, False)
    assert live["handler_enable"] and live["reload_needed"] and live["changed"]
    assert live["handler_mount_stop"] == ["a.mount"]
    assert live["handler_mount_restart"] == ["b.mount"]
    assert live["handler_mount_start"] == ["c.mount"]
    assert "diff" not in live
    for check_mode, manager in ((True, "systemd"), (False, "none")):
        quiet = _bare_plan(files=(unit,), mount_units=units, service_manager=manager)
        result = quiet.as_result(check_mode, True)
        assert not result["handler_enable"]
        assert result["handler_mount_start"] == result["handler_mount_stop"] == []
        assert result["handler_mount_restart"] == []
        assert result["diff"] == [hp.change_diff(unit)]
        assert result["would_run"][:2] == [
            "systemctl disable --now a.mount",
            "systemctl daemon-reload",
        ]
    unchanged = _bare_plan(files=(hp.FileChange(hp.UNIT_PATH, "unchanged", "x", "x"),))
    result = unchanged.as_result(False, True)
    assert not result["changed"] and not result["reload_needed"] and result["diff"] == []
    assert result["kernel_args_removed"] == [] and result["reboot_required"] is False


def test_diff_marks_boot_pools_and_skips_unchanged_files():
    boot = hp.PoolChange(node=1, size_kb=G1, before=0, after=2, desired=2, in_use=0, boot=True)
    same = hp.PoolChange(node=0, size_kb=M2, before=4, after=4, desired=4, in_use=0, boot=False)
    grown = hp.PoolChange(node=0, size_kb=M2, before=4, after=8, desired=8, in_use=0, boot=False)
    files_ = (
        hp.FileChange(hp.STATE_PATH, "unchanged", "s", "s"),
        hp.FileChange(hp.UNIT_PATH, "update", "a", "b"),
    )
    result = _bare_plan(pools=(grown, same, boot), files=files_, cmdline_changed=True).diff()
    assert result[0]["before"] == "node0 2048kB: 4\nnode1 1048576kB: 0\n"
    assert result[0]["after"] == "node0 2048kB: 8\nnode1 1048576kB: 2 (at next boot)\n"
    header = "hugepage pools (pages per node)"
    assert result[0]["before_header"] == result[0]["after_header"] == header
    assert result[1:] == [hp.change_diff(files_[1])]
    # a boot pool shows only while the command line changes
    assert _bare_plan(pools=(boot,), cmdline_changed=False).diff() == []


def test_a_mounts_value_that_is_no_list_gets_an_example():
    with pytest.raises(hp.HugepageError) as err:
        hp.parse_mounts("x", [G1])
    assert str(err.value) == (
        "mounts: 'x' is not a list; give e.g. [{path: /dev/hugepages1G, size_kb: 1048576}]"
    )


def test_grant_message_texts():
    head = (
        "hugepages: the kernel did not grant the pools asked for (node 1, 2048 kB pages: "
        "requested 8, granted unknown; node 0, 2048 kB pages: requested 4, granted 2) [a; b]. "
        "Runtime reservations come up short when the node's free memory is too small or too "
        "fragmented. "
    )
    tail = (
        "Reserve these pages at boot instead: add the size to boot_reserve_sizes_kb "
        "(hugepages_boot_reserve in the hugepages role) for HINT on the kernel command line, "
        "or free memory on the node and run again"
    )
    short = [(1, M2, 8, None, "b"), (0, M2, 4, 2, "a")]
    assert hp._grant_message(short, [], [], "HINT") == head + "Nothing changed. " + tail
    assert hp._grant_message(short, [(0, M2, 1), (1, M2, 2)], [], "HINT") == (
        head + "Every pool written in this run was restored to its previous total (node 0, "
        "2048 kB pages: 1; node 1, 2048 kB pages: 2), so nothing changed. " + tail
    )
    assert hp._grant_message(short, [(0, M2, 1)], [(1, M2, 2, None), (0, G1, 3, 5)], "HINT") == (
        head + "These pools could NOT be restored to their previous totals: node 1, 2048 kB "
        "pages: was 2, now None; node 0, 1048576 kB pages: was 3, now 5. " + tail
    )
    plain = hp._grant_message([(0, M2, 4, 2, "")], [], [], "HINT")
    assert "granted 2). Runtime" in plain


def test_a_short_shrink_to_nothing_hints_at_the_pages(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (16, 16)}, nodes=(0,))
    nodes, current, dummy = hp.read_pools(sysfs, procfs, [M2])
    changes, dummy = hp.plan_pools(nodes, current, {(0, M2): 0}, [M2], ())
    with pytest.raises(hp.HugepageGrantError) as err:
        hp.write_pools(sysfs, changes, kernel(grant=lambda base, requested, was: requested or 3))
    assert err.value.short == [(0, M2, 0, 3)]
    assert "for the pages on the kernel command line" in str(err.value)
    assert "restored to its previous total (node 0, 2048 kB pages: 16)" in str(err.value)


def test_the_hint_names_the_size_that_came_up_short(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (0, 0), (0, G1): (0, 0)}, nodes=(0,))
    nodes, current, dummy = hp.read_pools(sysfs, procfs, [M2, G1])
    changes, dummy = hp.plan_pools(nodes, current, {(0, M2): 4, (0, G1): 2}, [M2, G1], ())
    short_1g = kernel(grant=lambda base, requested, was: 1 if "1048576" in base else requested)
    with pytest.raises(hp.HugepageGrantError) as err:
        hp.write_pools(sysfs, changes, short_1g)
    assert "for hugepagesz=1G hugepages=0:2 on the kernel command line" in str(err.value)


def test_render_state_writes_mounts_only_when_there_are_some():
    assert "mounts" not in json.loads(hp.render_state(hp.State()))
    with_mounts = hp.State(mounts=("dev-hugepages1G.mount",))
    assert json.loads(hp.render_state(with_mounts))["mounts"] == ["dev-hugepages1G.mount"]
    text = hp.render_state(hp.State(managed_sizes_kb=(M2,)))
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_auto_removes_the_last_args_with_the_bootloader_that_wrote_them(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, "6.1.0")
    root = tmp_path / "root"  # no grubby and no GRUB below it: auto alone would find none
    first = plan(sysfs, procfs, root, BOOT, boot_reserve_sizes_kb=[G1], bootloader="grubby")
    hp.apply_hugepages(first, kernel())
    runtime_only = pools_of((0, M2, 16), (1, M2, 48))
    dropped = plan(sysfs, procfs, root, runtime_only, boot_reserve_sizes_kb=[G1])
    assert dropped.bootloader == "grubby" and dropped.cmdline_changed
    assert dropped.grubby_argvs() == [
        ["grubby", "--update-kernel=ALL", "--remove-args=hugepagesz=1G hugepages=0:2,1:1"]
    ]
    hp.apply_hugepages(dropped, kernel())
    state, dummy = hp.read_state(str(root))
    assert state.kernel_args == () and state.bootloader == "none"
    settled = plan(sysfs, procfs, root, runtime_only, boot_reserve_sizes_kb=[G1])
    assert settled.bootloader == "none" and not settled.cmdline_changed
    # an explicit choice still wins over the recorded one
    again = plan(sysfs, procfs, root, BOOT, boot_reserve_sizes_kb=[G1], bootloader="grubby")
    hp.apply_hugepages(again, kernel())
    explicit = plan(sysfs, procfs, root, runtime_only, bootloader="none")
    assert explicit.bootloader == "none" and explicit.cmdline_changed


def test_an_edited_mount_unit_of_ours_is_kept_with_a_warning(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    wanted = pools_of((0, M2, 16), (1, M2, 48))
    hp.apply_hugepages(plan(sysfs, procfs, root, wanted, mounts=[MOUNT_1G, MOUNT_2M]), kernel())
    edited = root / UNIT_1G.lstrip("/")
    edited.write_text("[Mount]\nWhat=hugetlbfs\n")  # the header is gone
    # still wanted: ours by the state file, so it is rewritten rather than refused
    kept = plan(sysfs, procfs, root, wanted, mounts=[MOUNT_1G, MOUNT_2M])
    assert kept.mount_restart == ["dev-hugepages1G.mount"] and kept.warnings == ()
    # no longer wanted: not stopped, not removed, and the run says why
    gone = plan(sysfs, procfs, root, wanted, mounts=[MOUNT_2M])
    assert gone.mount_stop == [] and gone.mount_units == (("mnt-huge\\x2d2m.mount", "unchanged"),)
    assert UNIT_1G not in [c.path for c in gone.files]
    assert gone.warnings == (
        f"{edited}: listed in {hp.STATE_PATH} as a mount unit numafleet wrote, but it lacks the "
        "numafleet header; it is kept (not stopped, not removed). Remove it by hand if it is no "
        "longer wanted",
    )
    # a unit of ours that is already gone needs nothing
    edited.unlink()
    absent = plan(sysfs, procfs, root, wanted, mounts=[MOUNT_2M])
    assert absent.mount_stop == [] and absent.warnings == ()


def test_a_host_without_nodes_says_none():
    with pytest.raises(hp.HugepageError) as err:
        hp.plan_pools([], {}, {(0, M2): 4}, [M2], ())
    assert "pools: node 0 does not exist on this host (NUMA nodes: none)" in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"root": "relative/root"},
            "root: 'relative/root' is not an absolute path; use / or a render directory",
        ),
        ({"root": None}, "root: None is not an absolute path; use / or a render directory"),
        ({"service_manager": "openrc"}, "service_manager: 'openrc' is not systemd or none"),
    ],
)
def test_bad_root_or_service_manager_is_refused_before_any_read(tmp_path, kwargs, message):
    with pytest.raises(hp.HugepageError) as err:
        hp.plan_hugepages([], str(tmp_path / "no-sys"), str(tmp_path / "no-proc"), **kwargs)
    assert str(err.value) == message


def test_without_offered_sizes_the_message_lists_that_nodes_pools():
    current = cur(n0_2048=(0, 0), n1_1048576=(0, 0))
    with pytest.raises(hp.HugepageError) as err:
        hp.plan_pools([0, 1], current, {(1, 64): 1}, [M2, G1, 64], ())
    assert "pools of that node: 1048576 kB)" in str(err.value)


def test_a_mount_without_a_unit_change_reads_as_unchanged():
    mount = hp.Mount("/dev/hugepages1G", G1)
    result = _bare_plan(mounts=(mount,)).as_result(False, False)
    assert result["mounts"][0]["state"] == "unchanged"


# --- render mode: the recorded tree stays a consistent kernel ----------------------------------


def with_global(sysfs, size, total, free):
    base = hp.global_pool_dir(sysfs, size)
    os.makedirs(base, exist_ok=True)
    write_int(os.path.join(base, "nr_hugepages"), total)
    write_int(os.path.join(base, "free_hugepages"), free)
    return base


def pool_counts(sysfs, node, size):
    return (
        read_int(pool_path(sysfs, node, size)),
        read_int(pool_path(sysfs, node, size, "free_hugepages")),
    )


def test_render_apply_adds_free_pages_and_a_shrink_releases_free_ones(tmp_path):
    """The default writer on a recorded tree: what a kernel shows after each write."""
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (0, 0), (1, M2): (0, 0)})
    whole = with_global(sysfs, M2, 0, 0)
    root = tmp_path / "root"
    wanted = pools_of((0, M2, 4096), (1, M2, 4096))
    hp.apply_hugepages(plan(sysfs, procfs, root, wanted, service_manager="none"))
    assert pool_counts(sysfs, 0, M2) == (4096, 4096)  # new pages are free
    assert pool_counts(sysfs, 1, M2) == (4096, 4096)
    assert read_int(f"{whole}/nr_hugepages") == 8192 and read_int(f"{whole}/free_hugepages") == 8192
    again = plan(sysfs, procfs, root, wanted, service_manager="none")
    assert not again.changed and again.drift() == [] and again.warnings == ()

    # a shrink releases free pages only, with no warning about pages "in use"
    smaller = pools_of((0, M2, 1024), (1, M2, 4096))
    shrink = plan(sysfs, procfs, root, smaller, service_manager="none")
    assert shrink.warnings == () and [(p.node, p.after) for p in shrink.pools] == [
        (0, 1024),
        (1, 4096),
    ]
    hp.apply_hugepages(shrink)
    assert pool_counts(sysfs, 0, M2) == (1024, 1024)
    assert read_int(f"{whole}/nr_hugepages") == 5120 and read_int(f"{whole}/free_hugepages") == 5120
    assert not plan(sysfs, procfs, root, smaller, service_manager="none").changed


def test_render_shrink_keeps_the_pages_a_recording_says_are_in_use(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (64, 16), (1, M2): (0, 0)})
    whole = with_global(sysfs, M2, 64, 16)
    root = tmp_path / "root"
    first = plan(sysfs, procfs, root, pools_of((0, M2, 8)), service_manager="none")
    assert [(p.node, p.after, p.in_use) for p in first.pools] == [(0, 48, 48), (1, 0, 0)]
    assert "48 in use, 8 desired" in first.warnings[0]
    hp.apply_hugepages(first)
    assert pool_counts(sysfs, 0, M2) == (48, 0)  # the 16 free pages went, the 48 used stay
    assert read_int(f"{whole}/nr_hugepages") == 48 and read_int(f"{whole}/free_hugepages") == 0


def test_a_pool_held_above_the_plan_is_drift_with_the_reason(tmp_path):
    """nr_hugepages 8192 with nothing free (pages in use) against a plan of 4096: the run cannot
    shrink it, so nothing changes, but the pool is still reported as differing from the plan."""
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (8192, 0), (1, M2): (4096, 4096)})
    root = tmp_path / "root"
    result = plan(sysfs, procfs, root, pools_of((0, M2, 4096), (1, M2, 4096))).as_result(
        check_mode=True, diff=True
    )
    assert [p["after"] for p in result["pools"]] == [8192, 4096]
    assert result["drift"] == [
        {
            "setting": "node0 2048kB pages",
            "planned": 4096,
            "actual": 8192,
            "reason": "8192 pages in use (nr_hugepages - free_hugepages): a shrink stops at "
            "8192; stop the services holding them, then run again",
            "pending": False,
        }
    ]
    held = [d for d in result["diff"] if d["before_header"].startswith("hugepage pools not")]
    assert held == [
        {
            "before_header": "hugepage pools not as planned (pages per node)",
            "after_header": "hugepage pools not as planned (pages per node)",
            "before": "node0 2048kB: 8192\n",
            "after": "node0 2048kB: 4096\n",
        }
    ]


def test_a_pool_the_run_writes_is_drift_without_a_reason(tmp_path):
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (8192, 8192), (1, M2): (4096, 4096)})
    result = plan(sysfs, procfs, tmp_path / "root", pools_of((0, M2, 4096), (1, M2, 4096)))
    assert result.changed
    assert result.drift() == [
        {
            "setting": "node0 2048kB pages",
            "planned": 4096,
            "actual": 8192,
            "reason": "",
            "pending": False,
        }
    ]
    assert result._drift_diff() == []  # the pool change is in the diff already


def test_on_a_live_kernel_the_default_writer_writes_nr_hugepages_only(tmp_path, monkeypatch):
    """free_hugepages moved by itself (a kernel did it): nothing else is written."""
    sysfs, procfs = make_tree(tmp_path, {(0, M2): (16, 16), (1, M2): (0, 0)})
    whole = with_global(sysfs, M2, 16, 16)
    writes = []

    def kernel_file(path, value):
        writes.append((os.path.basename(path), value))
        write_int(path, value)
        if path.endswith("nr_hugepages") and "node0" in path:
            write_int(os.path.join(os.path.dirname(path), "free_hugepages"), value)

    monkeypatch.setattr(hp, "_default_writer", kernel_file)
    hp.apply_hugepages(plan(sysfs, procfs, tmp_path / "root", pools_of((0, M2, 64))))
    assert [w for w in writes if w[0] != "free_hugepages"][:1] == [("nr_hugepages", 64)]
    assert ("free_hugepages", 64) not in writes  # never written by the collection here
    assert read_int(f"{whole}/nr_hugepages") == 16  # the kernel keeps its own totals
