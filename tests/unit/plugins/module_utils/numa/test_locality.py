"""locality.py: numa_maps/status/perf parsing, cgroup PID discovery and service measurement."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import locality
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import LocalityError

FIXTURES = Path(__file__).parents[3] / "fixtures"
PROCFS = FIXTURES / "procfs"
RECORDED = PROCFS / "recorded"
PERF = FIXTURES / "cmd" / "perf"
SLICE = "numafleet-team\\x2da.slice"


def recording(path: Path) -> str:
    """A cmd/ recording below its '# ----' header line."""
    return path.read_text(encoding="utf-8").partition("# ----\n")[2]


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    dest = tmp_path_factory.mktemp("procfs")
    for case in ("v2-fleet", "v1-legacy"):
        with tarfile.open(PROCFS / f"{case}.tar.gz") as tar:
            tar.extractall(dest, filter="data")
    return dest


# ---- parse_numa_maps -------------------------------------------------------------------------

NUMA_MAPS_CASES = [
    # (id, text, anon, huge, file)
    ("empty", "", {}, {}, {}),
    ("no pages", "7fbc58c8d000 default\n", {}, {}, {}),
    ("heap", "5600ac5be000 default heap anon=4 dirty=4 N0=4 kernelpagesize_kB=4", {0: 16}, {}, {}),
    (
        "file only",
        "5600a3b2d000 default file=/usr/bin/cat mapped=2 N0=2 kernelpagesize_kB=4",
        {},
        {},
        {0: 8},
    ),
    (
        "file mapping written all over (COW) counts as anon",
        "7f00 default file=/lib/libc.so.6 anon=2 dirty=2 N0=2 kernelpagesize_kB=4",
        {0: 8},
        {},
        {},
    ),
    (
        # The interpreter's .data seen in the 2-node QEMU guest: 284 pages copied on write under
        # bind:0, 34 pages of page cache left on node 1 by whoever read the file first.
        "COW pages of a file mapping go to its policy's nodes",
        "00947000 bind:0 file=/usr/bin/python3.11 anon=284 dirty=284 N0=284 N1=34 "
        "kernelpagesize_kB=4",
        {0: 1136},
        {},
        {1: 136},
    ),
    (
        "COW pages beyond the policy's nodes, then where most pages are",
        "7f00 bind:1 file=/x anon=5 N0=9 N1=2 N2=1 kernelpagesize_kB=4",
        {1: 8, 0: 12},
        {},
        {0: 24, 2: 4},
    ),
    (
        "default policy: COW pages where most pages are",
        "7f00 default file=/x anon=2 N0=1 N1=3 kernelpagesize_kB=4",
        {1: 8},
        {},
        {0: 4, 1: 4},
    ),
    (
        "hugetlb is huge even with file=",
        "7f1e default file=/anon_hugepage\\040(deleted) huge anon=1 dirty=1 N1=3 kernelpagesize_kB=2048",
        {},
        {1: 6144},
        {},
    ),
    (
        "split across nodes",
        "7f00 bind:0-1 anon=10 dirty=10 N0=9 N1=1 kernelpagesize_kB=4",
        {0: 36, 1: 4},
        {},
        {},
    ),
    ("anon without anon= and no file=", "7f00 default N2=5 kernelpagesize_kB=4", {2: 20}, {}, {}),
    (
        "zero counts are left out",
        "7f00 default anon=1 N0=0 N1=1 kernelpagesize_kB=4",
        {1: 4},
        {},
        {},
    ),
    (
        "sums over mappings",
        "7f00 default anon=1 N0=1 kernelpagesize_kB=4\n7f10 default stack anon=2 N0=2 kernelpagesize_kB=4",
        {0: 12},
        {},
        {},
    ),
]


@pytest.mark.parametrize(
    ("text", "anon", "huge", "files"),
    [case[1:] for case in NUMA_MAPS_CASES],
    ids=[case[0] for case in NUMA_MAPS_CASES],
)
def test_parse_numa_maps(text, anon, huge, files):
    maps = locality.parse_numa_maps(text)
    assert (maps.anon_kb_by_node, maps.huge_kb_by_node, maps.file_kb_by_node) == (anon, huge, files)


def test_parse_numa_maps_of_the_recordings():
    cat = locality.parse_numa_maps((RECORDED / "numa_maps-cat.txt").read_text())
    assert cat.anon_kb_by_node == {0: 112}
    assert cat.huge_kb_by_node == {}
    assert cat.file_kb_by_node == {0: 1584}
    python = locality.parse_numa_maps((RECORDED / "numa_maps-python-hugetlb.txt").read_text())
    assert python.huge_kb_by_node == {0: 2048}
    assert set(python.anon_kb_by_node) == {0}


NUMA_MAPS_ERRORS = [
    ("not an address", "zz default N0=1 kernelpagesize_kB=4", "does not start with"),
    ("address only", "7f00", "does not start with"),
    ("no page size", "7f00 default anon=1 N0=1", "no kernelpagesize_kB"),
    ("page size 0", "7f00 default N0=1 kernelpagesize_kB=0", "bad page size"),
    ("bad node count", "7f00 default N0=x kernelpagesize_kB=4", "bad node count 'N0=x'"),
]


@pytest.mark.parametrize(
    ("text", "message"),
    [case[1:] for case in NUMA_MAPS_ERRORS],
    ids=[case[0] for case in NUMA_MAPS_ERRORS],
)
def test_parse_numa_maps_errors(text, message):
    with pytest.raises(LocalityError, match=message) as caught:
        locality.parse_numa_maps("7f10 default\n" + text, source="/proc/7/numa_maps")
    assert str(caught.value).startswith("/proc/7/numa_maps: line 2")


# ---- parse_status ----------------------------------------------------------------------------


def test_parse_status_of_the_recording():
    status = locality.parse_status((RECORDED / "status-cat.txt").read_text())
    assert status == locality.ProcStatus(cpus_allowed=(0, 1), mems_allowed=(0,))


@pytest.mark.parametrize(
    ("text", "cpus", "mems"),
    [
        ("Cpus_allowed_list:\t0-3,8\nMems_allowed_list:\t0-1\n", (0, 1, 2, 3, 8), (0, 1)),
        ("Cpus_allowed_list:  5\nMems_allowed_list: 3\n", (5,), (3,)),
    ],
)
def test_parse_status(text, cpus, mems):
    assert locality.parse_status(text) == locality.ProcStatus(cpus, mems)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Mems_allowed_list:\t0\n", "s: no Cpus_allowed_list line"),
        ("Cpus_allowed_list:\t0\n", "s: no Mems_allowed_list line"),
        ("Cpus_allowed_list:\t3-1\nMems_allowed_list:\t0\n", "Cpus_allowed_list: invalid CPU set"),
    ],
)
def test_parse_status_errors(text, message):
    with pytest.raises(LocalityError, match=message):
        locality.parse_status(text, source="s")


# ---- cgroups ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "unit", "slice_name", "pids"),
    [
        ("v2-fleet", "embed.service", None, [1101]),
        ("v2-fleet", "embed.service", SLICE, [1101]),
        ("v2-fleet", "embed.service", "system.slice", []),
        ("v2-fleet", "multi.service", None, [1501, 1502, 1503, 1504]),  # sub-cgroups included
        ("v2-fleet", "stopped.service", None, []),
        ("v2-fleet", "numafleet.slice", None, []),  # a slice has no processes of its own here
        ("v1-legacy", "legacy.service", None, [2001]),
        ("v1-legacy", "embed.service", None, []),
    ],
)
def test_read_unit_pids(trees, case, unit, slice_name, pids):
    assert locality.read_unit_pids(str(trees / case / "cgroup"), unit, slice_name) == pids


def test_find_unit_cgroup_versions(trees):
    v2 = locality.find_unit_cgroup(str(trees / "v2-fleet" / "cgroup"), "embed.service")
    assert (v2.version, v2.relpath) == (2, f"numafleet.slice/{SLICE}/embed.service")
    v1 = locality.find_unit_cgroup(str(trees / "v1-legacy" / "cgroup"), "legacy.service")
    assert (v1.version, v1.relpath) == (1, "system.slice/legacy.service")


def test_hybrid_tree_prefers_unified(tmp_path):
    for top in ("unified", "systemd"):
        unit = tmp_path / top / "system.slice" / "a.service"
        unit.mkdir(parents=True)
        (unit / "cgroup.procs").write_text("9\n" if top == "unified" else "8\n")
    found = locality.find_unit_cgroup(str(tmp_path), "a.service")
    assert found.version == 2
    assert locality.cgroup_pids(found) == [9]


def test_bad_cgroup_procs(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("")
    unit = tmp_path / "a.service"
    unit.mkdir()
    (unit / "cgroup.procs").write_text("12\nabc\n")
    with pytest.raises(LocalityError, match=r"a.service/cgroup.procs: 'abc' is not a PID"):
        locality.read_unit_pids(str(tmp_path), "a.service")


# ---- numastat --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local", "other", "ratio"),
    [
        (0, 0, None),
        (None, 5, None),
        (90, 10, 0.1),
        (0, 7, 1.0),
        (7, 0, 0.0),
    ],
)
def test_miss_ratio(local, other, ratio):
    assert locality.miss_ratio(local, other) == ratio


def test_numastat_delta():
    before = {0: {"local_node": 100, "other_node": 10}, 1: {"local_node": 5, "other_node": 5}}
    after = {0: {"local_node": 190, "other_node": 20}, 1: {"local_node": 5, "other_node": 5}, 2: {}}
    assert locality.numastat_delta(before, after) == {
        0: {"local_node": 90, "other_node": 10, "miss_ratio": 0.1},
        1: {"local_node": 0, "other_node": 0, "miss_ratio": None},
    }


def test_numastat_delta_counter_went_down():
    with pytest.raises(LocalityError) as caught:
        locality.numastat_delta({3: {"local_node": 9, "other_node": 0}}, {3: {"local_node": 8}})
    assert str(caught.value) == (
        "node3/numastat: local_node went down from 9 to 8 during the window. "
        "Take both samples on the same host without a reboot in between"
    )


def test_read_numastat_of_the_recorded_tree(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    stats = locality.read_numastat(f"{root}/sys")
    assert sorted(stats) == [0, 1]
    assert stats[1]["local_node"] == 56147
    assert stats[1]["other_node"] == 4263


def test_read_numastat_without_numa(tmp_path):
    assert locality.read_numastat(str(tmp_path)) == {}


# ---- perf ------------------------------------------------------------------------------------


def test_parse_perf_stat_recorded_not_supported():
    stat = locality.parse_perf_stat(recording(PERF / "vm-not-supported.txt"))
    assert stat.counts == {"cpu-clock": 402.61}
    assert stat.unavailable == {
        "node-loads": "<not supported>",
        "node-load-misses": "<not supported>",
    }
    assert locality.remote_access(stat) == {
        "available": False,
        "ratio": None,
        "reason": "perf reports node-loads <not supported>",
    }


def test_parse_perf_stat_recorded_cgroup_not_counted():
    stat = locality.parse_perf_stat(recording(PERF / "vm-cgroup-not-counted.txt"))
    assert stat.unavailable == {"cpu-clock": "<not counted>"}


# Documented CSV (perf-stat(1), -x): value,unit,event[,cgroup],run-time,percent,metric,unit.
# No host here counts node-loads, so the counted case follows that documented layout.
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "1000,,node-loads,a.slice/x.service,2000000,100.00,,\n"
            "25,,node-load-misses,a.slice/x.service,2000000,100.00,,\n",
            {"available": True, "ratio": 0.025, "reason": None},
        ),
        (
            "0,,node-loads,x,1,100.00,,\n0,,node-load-misses,x,1,100.00,,\n",
            {
                "available": False,
                "ratio": None,
                "reason": "no node-loads were counted in the window",
            },
        ),
        (
            "10,,node-loads,x,1,100.00,,\n",
            {"available": False, "ratio": None, "reason": "perf printed no node-load-misses count"},
        ),
        (
            "# started on Mon\n\n10,,node-loads,x,1,100.00,,\n<not counted>,,node-load-misses,x,0,0,,\n",
            {
                "available": False,
                "ratio": None,
                "reason": "perf reports node-load-misses <not counted>",
            },
        ),
    ],
)
def test_remote_access(text, expected):
    assert locality.remote_access(locality.parse_perf_stat(text)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc,,node-loads,x,1,100.00,,", "'abc' is not a count"),
        ("12,,", "has no event name in field 3"),
    ],
)
def test_parse_perf_stat_errors(text, message):
    with pytest.raises(LocalityError, match=message) as caught:
        locality.parse_perf_stat(text, source="perf stat -G x")
    assert str(caught.value).startswith("perf stat -G x: line ")


# ---- services --------------------------------------------------------------------------------

PLAN = [
    {
        "name": "embed",
        "unit": "embed.service",
        "cpus": [2, 3],
        "mems": [1],
        "gpus": [{"address": "0000:81:00.0", "node": None}, {"address": "0000:99:00.0", "node": 0}],
    },
    {"name": "offnode", "unit": "offnode.service", "cpus": [2, 3], "mems": [1]},
    {"name": "huge", "unit": "huge.service", "cpus": [2], "mems": [1]},
    {"name": "idle", "unit": "idle.service", "cpus": [2, 3], "mems": [1]},
    {"name": "multi", "unit": "multi.service", "slice": SLICE, "cpus": [2, 3], "mems": [1]},
    {"name": "stopped", "cpus": [2, 3], "mems": [1]},
]


@pytest.fixture(scope="module")
def measured(trees, fixture_root):
    sysfs = f"{fixture_root('qemu-2node-pxb')}/sys"
    fleet = trees / "v2-fleet"
    services = locality.parse_services(PLAN)
    found = locality.measure_services(services, str(fleet / "proc"), sysfs, str(fleet / "cgroup"))
    return {entry["name"]: entry for entry in found}


def test_fully_local_service(measured):
    embed = measured["embed"]
    assert embed["running"] is True
    assert embed["pids"] == [1101]
    assert embed["binding"] == {
        "cpus_allowed": [2, 3],
        "mems_allowed": [1],
        "cpus_ok": True,
        "mems_ok": True,
    }
    assert embed["pages_kb"] == {"anon_huge_by_node": {"1": 15088}, "file_by_node": {"1": 6788}}
    assert embed["offnode_share"] == 0.0
    # sysfs says 0000:81:00.0 is on node 1; 0000:99:00.0 is not in the tree: the plan's node 0.
    assert embed["gpu_locality"] == [
        {"address": "0000:81:00.0", "node": 1, "ok": True},
        {"address": "0000:99:00.0", "node": 0, "ok": False},
    ]


def test_ten_percent_off_node(measured):
    offnode = measured["offnode"]
    assert offnode["offnode_share"] == pytest.approx(0.1, abs=0.001)
    assert offnode["binding"]["mems_allowed"] == [0, 1]
    assert offnode["binding"]["mems_ok"] is False  # NUMAPolicy=bind alone leaves Mems_allowed
    assert offnode["binding"]["cpus_ok"] is True


def test_hugepage_backed_service(measured):
    huge = measured["huge"]
    assert huge["pages_kb"]["anon_huge_by_node"] == {"1": 15088 + 4 * 2048}
    assert huge["offnode_share"] == 0.0
    assert huge["binding"]["cpus_ok"] is False  # allowed 2-3, plan only 2


def test_process_without_resident_pages(measured):
    idle = measured["idle"]
    assert idle["running"] is True
    assert idle["pages_kb"] == {"anon_huge_by_node": {}, "file_by_node": {}}
    assert idle["offnode_share"] is None


def test_several_pids_and_one_that_vanished(measured):
    multi = measured["multi"]
    assert multi["pids"] == [1501, 1502, 1503]  # 1504 is listed but gone: skipped
    assert multi["pages_kb"]["anon_huge_by_node"] == {"1": 3 * 15088}


def test_unit_not_running(measured):
    stopped = measured["stopped"]
    assert stopped["unit"] == "stopped.service"
    assert stopped["running"] is False
    assert stopped["cgroup"] is None
    assert stopped["binding"]["cpus_ok"] is None
    assert stopped["offnode_share"] is None


@pytest.mark.parametrize(
    ("mems", "share"),
    [([0], 2048 / 2060), ([1], 12 / 2060), ([0, 1], 0.0), ([], 1.0)],
)
def test_offnode_share_boundaries(tmp_path, mems, share):
    """12 kB anonymous on node 0, 2048 kB hugetlb on node 1; file pages never count."""
    (tmp_path / "cgroup" / "a.service").mkdir(parents=True)
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("")
    (tmp_path / "cgroup" / "a.service" / "cgroup.procs").write_text("5\n")
    (tmp_path / "proc" / "5").mkdir(parents=True)
    (tmp_path / "proc" / "5" / "status").write_text(
        "Cpus_allowed_list:\t0\nMems_allowed_list:\t0-1\n"
    )
    (tmp_path / "proc" / "5" / "numa_maps").write_text(
        "7f00 default anon=3 N0=3 kernelpagesize_kB=4\n"
        "7f10 default file=/x huge anon=1 N1=1 kernelpagesize_kB=2048\n"
        "7f20 default file=/lib/a.so mapped=9 N1=9 kernelpagesize_kB=4\n"
    )
    [entry] = locality.measure_services(
        locality.parse_services([{"name": "a", "cpus": [0], "mems": mems}]),
        str(tmp_path / "proc"),
        str(tmp_path),
        str(tmp_path / "cgroup"),
    )
    assert entry["offnode_share"] == pytest.approx(share)
    assert entry["pages_kb"]["file_by_node"] == {"1": 36}


@pytest.mark.parametrize(
    ("services", "message"),
    [
        ({"name": "a"}, "services: must be a list"),
        ([{"unit": "a.service"}], r"services\[0\]: needs a name"),
        ([{"name": "a", "cpus": "0-3"}], r"services\[0\].cpus: '0-3' is not a list"),
        ([{"name": "a", "mems": [-1]}], r"services\[0\].mems: \[-1\] is not a list"),
        ([{"name": "a", "gpus": ["0000:01:00.0"]}], r"services\[0\].gpus: must be a list"),
    ],
)
def test_parse_services_errors(services, message):
    with pytest.raises(LocalityError, match=message):
        locality.parse_services(services)


def test_parse_services_takes_plan_placements():
    placement = {
        "name": "embed",
        "unit": "numafleet-embed.service",
        "unit_kind": "service",
        "slice": SLICE,
        "cpus": [3, 2],
        "mems": [1],
        "gpus": [{"address": "0000:81:00.0", "uuid": "GPU-0", "node": 1}],
        "hugepages": None,
    }
    assert locality.parse_services([placement]) == [
        {
            "name": "embed",
            "unit": "numafleet-embed.service",
            "slice": SLICE,
            "cpus": [2, 3],
            "mems": [1],
            "gpus": [{"address": "0000:81:00.0", "node": 1}],
        }
    ]


# ---- measure ---------------------------------------------------------------------------------


def test_measure_window_and_perf(trees, fixture_root):
    sysfs = f"{fixture_root('qemu-2node-pxb')}/sys"
    fleet = trees / "v2-fleet"
    calls = []

    def run_perf(cgroup, window_s):
        calls.append((cgroup, window_s))
        return "400,,node-loads,x,1,100.00,,\n4,,node-load-misses,x,1,100.00,,\n"

    result = locality.measure(
        PLAN[:1] + PLAN[-1:],
        str(fleet / "proc"),
        sysfs,
        str(fleet / "cgroup"),
        2.5,
        run_perf=run_perf,
        sleep=lambda seconds: pytest.fail("perf takes the window itself"),
    )
    assert calls == [(f"numafleet.slice/{SLICE}/embed.service", 2.5)]
    embed, stopped = result["services"]
    assert embed["remote_access"] == {"available": True, "ratio": 0.01, "reason": None}
    assert stopped["remote_access"]["reason"] == "the unit is not running"
    # Static files: nothing allocated in the window.
    node1 = result["nodes"][1]
    assert node1["numastat"] == {"local_node": 0, "other_node": 0, "miss_ratio": None}
    # The guard's used: MemTotal - MemFree - (Active(file) 15824 + Inactive(file) 11752).
    assert node1["memory_file_kb"] == 15824 + 11752
    assert node1["memory_used_kb"] == 2015616 - 1815904 - 27576
    assert node1["memory_used_pct"] == 8.54
    assert node1["hugepages"] == [{"size_kb": 2048, "total": 48}, {"size_kb": 1048576, "total": 0}]


def test_measure_single_sample_sleeps_not(trees, fixture_root):
    root = fixture_root("qemu-2node-pxb")
    fleet = trees / "v1-legacy"
    result = locality.measure(
        [{"name": "legacy", "cpus": [0, 1], "mems": [0]}],
        str(fleet / "proc"),
        f"{root}/sys",
        str(fleet / "cgroup"),
        0,
        run_perf=lambda cgroup, window_s: pytest.fail("no perf on cgroup v1"),
        sleep=lambda seconds: pytest.fail("window 0 does not sleep"),
    )
    [legacy] = result["services"]
    assert legacy["cgroup"] == {"version": 1, "path": "system.slice/legacy.service"}
    assert legacy["remote_access"]["reason"] == (
        "the unit's cgroup is on cgroup v1; perf -G is used with cgroup v2 only"
    )
    assert result["nodes"][1]["numastat"] == {
        "local_node": 56147,
        "other_node": 4263,
        "miss_ratio": None,
    }


def test_measure_sleeps_without_perf(trees, fixture_root):
    slept = []
    fleet = trees / "v2-fleet"
    locality.measure(
        PLAN[:1],
        str(fleet / "proc"),
        f"{fixture_root('qemu-2node-pxb')}/sys",
        str(fleet / "cgroup"),
        1.5,
        sleep=slept.append,
    )
    assert slept == [1.5]


def test_measure_bad_cgroup_root(trees, fixture_root, tmp_path):
    fleet = trees / "v2-fleet"
    with pytest.raises(LocalityError) as caught:
        locality.measure(
            PLAN,
            str(fleet / "proc"),
            f"{fixture_root('qemu-2node-pxb')}/sys",
            str(tmp_path / "no"),
            0,
        )
    assert str(caught.value) == (
        f"{tmp_path}/no: no such directory, so cgroup_root='{tmp_path}/no' is not a cgroup tree. "
        "Point cgroup_root at the host's /sys/fs/cgroup"
    )


def test_unreadable_numa_maps_says_run_as_root(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    proc = tmp_path / "7"
    proc.mkdir()
    (proc / "status").write_text("Cpus_allowed_list:\t0\nMems_allowed_list:\t0\n")
    (proc / "numa_maps").write_text("")
    (proc / "numa_maps").chmod(0)
    with pytest.raises(LocalityError, match="Run the module as root"):
        locality.read_process(str(tmp_path), 7)


def test_fixture_tarballs_are_up_to_date():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(PROCFS / "make_procfs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# ---- the memory guard's files (verify's spilled warning and guard checks) --------------------


def _guard_files(tmp_path, config=None, state=None):
    """numafleet-guard's config and state files as the role and the program write them."""
    config_path, state_path = tmp_path / "guard.json", tmp_path / "state.json"
    if config is not None:
        config_path.write_text(config if isinstance(config, str) else json.dumps(config))
    if state is not None:
        state_path.write_text(state if isinstance(state, str) else json.dumps(state))
    return str(state_path), str(config_path)


GUARD_CONFIG = {
    "version": 1,
    "host": "gpu-a100-01",
    "settings": {
        "warn_pct": 80,
        "act_pct": 90,
        "act": "migrate",
        "interval_s": 15,
        "preflight": "warn",
        "textfile": None,
        "state_file": "/run/numafleet-guard/state.json",
    },
    "placements": [],
}
GUARD_STATE = {
    "over_rounds": {"0": 0, "1": 0},
    "levels": {"0": "ok", "1": "warn"},
    "throttled": {},
    "actions_total": [{"node": 1, "action": "migrate", "placement": "kv-low", "count": 1}],
    "spilled": {"kv-low": {"from": [1], "to": [0], "since": 1738324800.5, "bytes": 943718400}},
    "last_run": 1738324815.25,
    "failures_total": 0,
}


def test_read_guard_reads_settings_last_run_and_spilled(tmp_path):
    state, config = _guard_files(tmp_path, GUARD_CONFIG, GUARD_STATE)
    got = locality.read_guard(state, config, now=1738324820.0, active="active")
    assert got == {
        "service": "numafleet-guard.service",
        "active": "active",
        "active_reason": None,
        "config_file": config,
        "settings": {"warn_pct": 80, "act_pct": 90, "act": "migrate", "interval_s": 15},
        "config_reason": None,
        "state_file": state,
        "last_run": 1738324815.25,
        "spilled": {"kv-low": {"from": [1], "to": [0], "since": 1738324800.5, "bytes": 943718400}},
        "state_reason": None,
        "read_at": 1738324820.0,
    }


@pytest.mark.parametrize(
    ("config", "state", "config_reason", "state_reason"),
    [
        (None, None, "absent", "absent"),
        ("{", "[]", "not JSON (", "not a JSON object but list"),
        ({"version": 1}, dict(GUARD_STATE, last_run="soon"), "has no settings mapping", "last_run"),
        (
            GUARD_CONFIG,
            dict(GUARD_STATE, spilled={"kv-low": {"from": [1]}}),
            None,
            "spilled placements do not parse",
        ),
    ],
)
def test_read_guard_names_what_it_could_not_use(
    tmp_path, config, state, config_reason, state_reason
):
    state_path, config_path = _guard_files(tmp_path, config, state)
    got = locality.read_guard(state_path, config_path, now=1.0)
    # A bad last_run leaves the spilled map usable, and a bad spilled map the last run.
    assert got["spilled"] == (GUARD_STATE["spilled"] if state_reason == "last_run" else {})
    assert got["active"] is None
    assert (got["config_reason"] or "").startswith(config_reason or "")
    assert (got["config_reason"] is None) == (config_reason is None)
    assert state_reason in got["state_reason"]


@pytest.mark.parametrize(
    ("service", "systemctl", "out", "active", "reason"),
    [
        (True, "/usr/bin/systemctl", "inactive\n", "inactive", None),
        (True, "/usr/bin/systemctl", "", None, "systemctl is-active: rc 4"),
        (True, None, "", None, "systemctl is not installed"),
        (False, "/usr/bin/systemctl", "active\n", None, "not asked"),
    ],
)
def test_measure_on_host_reads_the_guard_when_asked(
    trees, fixture_root, tmp_path, service, systemctl, out, active, reason
):
    state, config = _guard_files(tmp_path, GUARD_CONFIG, GUARD_STATE)
    calls = []

    def run_command(argv, environ_update=None):
        calls.append(argv)
        return (0 if out.strip() == "active" else 4), out, ""

    def get_bin_path(name):
        return systemctl if name == "systemctl" else None

    settings = {
        "sysfs_root": f"{fixture_root('qemu-2node-pxb')}/sys",
        "procfs_root": str(trees / "v1-legacy" / "proc"),
        "cgroup_root": str(trees / "v1-legacy" / "cgroup"),
        "window_s": 0,
        "perf": "never",
        "guard": {"state_file": state, "config_file": config, "service": service},
    }
    result = locality.measure_on_host([], settings, run_command, get_bin_path, lambda s: None)
    guard = result["guard"]
    assert (guard["active"], guard["spilled"]["kv-low"]["to"]) == (active, [0])
    assert reason is None and guard["active_reason"] is None or reason in guard["active_reason"]
    expected = [["/usr/bin/systemctl", "is-active", "numafleet-guard.service"]]
    assert calls == (expected if service and systemctl else [])
    del settings["guard"]
    assert "guard" not in locality.measure_on_host([], settings, run_command, get_bin_path, None)
