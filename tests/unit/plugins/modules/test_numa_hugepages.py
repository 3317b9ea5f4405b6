"""numa_hugepages through main(): check mode, apply, repeat, boot reservations, errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

STATE = "etc/numafleet/hugepages.json"
UNIT = "etc/systemd/system/numafleet-hugepages.service"
PROGRAM = "usr/local/libexec/numafleet-hugepages"
GRUB = "etc/default/grub.d/60-numafleet-hugepages.cfg"
MODULES = "ansible_collections.numafleet.tuning.plugins.modules"
POOL = "sys/devices/system/node/node{node}/hugepages/hugepages-{size}kB/nr_hugepages"


def tree_hash(*tops) -> str:
    digest = hashlib.sha256()
    for top in tops:
        for base, dirs, files in sorted(os.walk(top)):
            dirs.sort()
            for name in sorted(dirs + files):
                path = os.path.join(base, name)
                if path.endswith(("/run", "/run/numafleet", "/run/numafleet/apply.lock")):
                    continue  # the per-host lock file: made by every run that may write
                digest.update(os.path.relpath(path, top).encode())
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as handle:
                        digest.update(handle.read())
    return digest.hexdigest()


@pytest.fixture
def host(fixture_root, tmp_path):
    """A scratch copy of the recorded 2-node kernel (2 MiB pools 16/16 free and 48/16 free)."""
    fsroot = fixture_root("qemu-2node-pxb", writable=True)
    return {"fsroot": fsroot, "root": str(tmp_path / "root")}


def args(host, pools, **extra) -> dict:
    base = {
        "pools": pools,
        "sysfs_root": f"{host['fsroot']}/sys",
        "procfs_root": f"{host['fsroot']}/proc",
        "root": host["root"],
        "service_manager": "none",
    }
    base.update(extra)
    return base


def pool(host, node, size=2048) -> int:
    with open(
        os.path.join(host["fsroot"], POOL.format(node=node, size=size)), encoding="ascii"
    ) as f:
        return int(f.read())


def set_release(host, release):
    path = os.path.join(host["fsroot"], "proc", "sys", "kernel")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "osrelease"), "w", encoding="ascii") as handle:
        handle.write(release + "\n")


def warning_texts(result) -> list:
    """The module's warnings as text (ansible-core 2.19 sends them as WarningSummary objects)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


GROW = [{"node": 0, "size_kb": 2048, "count": 32}, {"node": 1, "size_kb": 2048, "count": 48}]


def test_check_mode_writes_nothing_and_predicts_the_change(run_module, host):
    before = tree_hash(host["fsroot"])
    result = run_module("numa_hugepages", args(host, GROW), check_mode=True, diff=True)
    assert result["failed"] is False and result["changed"] is True
    assert tree_hash(host["fsroot"]) == before and not os.path.exists(host["root"])
    assert result["diff"][0] == {
        "before_header": "hugepage pools (pages per node)",
        "after_header": "hugepage pools (pages per node)",
        "before": "node0 2048kB: 16\n",
        "after": "node0 2048kB: 32\n",
    }
    assert [entry["after_header"] for entry in result["diff"][1:]] == [
        "/" + STATE,
        "/" + UNIT,
        "/" + PROGRAM,
    ]
    assert [p["after"] for p in result["pools"]] == [32, 48]
    assert result["reload_needed"] is True and result["reboot_required"] is False
    assert result["would_run"] == [
        "systemctl daemon-reload",
        "systemctl enable numafleet-hugepages.service",
    ]


def test_apply_then_second_run_changes_nothing(run_module, host):
    check = run_module("numa_hugepages", args(host, GROW), check_mode=True)
    first = run_module("numa_hugepages", args(host, GROW))
    assert first["changed"] is True and first["files"] == check["files"]
    assert first["pools"] == check["pools"]
    assert pool(host, 0) == 32 and pool(host, 1) == 48
    for rel in (STATE, UNIT, PROGRAM):
        assert os.path.isfile(os.path.join(host["root"], rel))
    after_first = tree_hash(host["fsroot"], host["root"])
    second = run_module("numa_hugepages", args(host, GROW), diff=True)
    assert second["changed"] is False
    assert second["diff"] == [] and second["would_run"] == []
    assert {entry["state"] for entry in second["files"]} == {"unchanged"}
    assert tree_hash(host["fsroot"], host["root"]) == after_first


def run_fresh(tmp_path, module_args) -> dict:
    """main() in a new Python process, the way ansible-core runs a module on a host.

    In the pytest process, once a test has imported controller code (the action plugin tests),
    ansible-core sends module warnings to the controller's display instead of the result; a fresh
    process returns them in the result as a host would.
    """
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": module_args}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LC_ALL="C")
    proc = subprocess.run(
        [sys.executable, "-m", f"{MODULES}.numa_hugepages", str(args_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return json.loads(proc.stdout)


SHRINK = [{"node": 0, "size_kb": 2048, "count": 16}, {"node": 1, "size_kb": 2048, "count": 8}]


def test_shrink_below_in_use_keeps_the_pages(run_module, host):
    result = run_module("numa_hugepages", args(host, SHRINK))
    assert result["changed"] is True
    assert pool(host, 1) == 32
    node1 = result["pools"][1]
    assert (node1["before"], node1["after"], node1["desired"], node1["in_use"]) == (48, 32, 8, 32)


def test_shrink_below_in_use_warns(host, tmp_path):
    result = run_fresh(tmp_path, args(host, SHRINK))
    assert result["changed"] is True and pool(host, 1) == 32
    assert warning_texts(result) == [
        "node 1, 2048 kB pages: 32 in use, 8 desired; the pool is kept at 32 instead of "
        "shrinking below the pages in use: stop the services holding them, then run again"
    ]


def test_boot_reservation_writes_the_grub_drop_in_once(run_module, host):
    set_release(host, "6.1.0-18-amd64")
    pools = GROW[:1] + [{"node": 1, "size_kb": 1048576, "count": 2}] + GROW[1:]
    extra = {"boot_reserve_sizes_kb": [1048576], "bootloader": "grub_d"}
    first = run_module("numa_hugepages", args(host, pools, **extra))
    assert first["reboot_required"] is True
    assert first["kernel_args"] == ["hugepagesz=1G", "hugepages=1:2"]
    assert first["would_run"][-1] == "update-grub"
    assert pool(host, 1, 1048576) == 0  # never written at runtime
    with open(os.path.join(host["root"], GRUB), encoding="utf-8") as handle:
        assert (
            'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX hugepagesz=1G hugepages=1:2"' in handle.read()
        )
    second = run_module("numa_hugepages", args(host, pools, **extra))
    assert second["changed"] is False and second["reboot_required"] is False


def test_state_file_releases_a_size_no_longer_wanted(run_module, host):
    run_module("numa_hugepages", args(host, [{"node": 0, "size_kb": 1048576, "count": 1}]))
    assert pool(host, 0, 1048576) == 1
    free = os.path.join(host["fsroot"], POOL.format(node=0, size=1048576))
    with open(free.replace("nr_hugepages", "free_hugepages"), "w", encoding="ascii") as handle:
        handle.write("1\n")  # as the kernel shows it: the new page is free, not in use
    result = run_module("numa_hugepages", args(host, []))
    assert result["changed"] is True and pool(host, 0, 1048576) == 0
    with open(os.path.join(host["root"], STATE), encoding="utf-8") as handle:
        assert json.load(handle)["managed_sizes_kb"] == []


@pytest.mark.parametrize(
    ("pools", "extra", "fragment"),
    [
        ([{"node": 5, "size_kb": 2048, "count": 1}], {}, "pools: node 5 does not exist"),
        ([{"node": 0, "size_kb": 4096, "count": 1}], {}, "node 0 has no 4096 kB hugepage pool"),
        ([{"node": 0, "size_kb": 2048, "count": -1}], {}, "pools[0].count is -1"),
        (
            [{"node": 0, "size_kb": 1048576, "count": 1}],
            {"boot_reserve_sizes_kb": [1048576], "bootloader": "grub_d"},
            "the kernel release is needed to reserve hugepages at boot",
        ),
        (
            [{"node": 0, "size_kb": 1048576, "count": 1}],
            {"boot_reserve_sizes_kb": [1048576], "release": "6.1.0"},
            "bootloader: auto found neither grubby",
        ),
        (
            GROW,
            {"sysfs_root": "/nonexistent/sys"},
            "sysfs_root='/nonexistent/sys' is not a sys tree",
        ),
        (GROW, {"boot_reserve_sizes_kb": [0]}, "boot_reserve_sizes_kb: 0 is not a page size"),
    ],
)
def test_errors_fail_with_the_message_and_change_nothing(run_module, host, pools, extra, fragment):
    extra = dict(extra)
    if "release" in extra:
        set_release(host, extra.pop("release"))
    before = tree_hash(host["fsroot"])
    result = run_module("numa_hugepages", args(host, pools, **extra))
    assert result["failed"] is True
    assert fragment in result["msg"]
    assert "Traceback" not in json.dumps(result) and "exception" not in result
    assert tree_hash(host["fsroot"]) == before and not os.path.exists(host["root"])


def test_old_kernel_is_refused_for_boot_reservations(run_module, host):
    set_release(host, "5.15.0-91-generic")
    extra = {"boot_reserve_sizes_kb": [1048576], "bootloader": "grub_d"}
    result = run_module(
        "numa_hugepages", args(host, [{"node": 1, "size_kb": 1048576, "count": 1}], **extra)
    )
    assert result["failed"] is True
    assert "the kernel is 5.15" in result["msg"] and "Linux 5.16 or newer" in result["msg"]


def test_a_malformed_state_file_fails_with_its_path(run_module, host):
    os.makedirs(os.path.join(host["root"], "etc", "numafleet"))
    with open(os.path.join(host["root"], STATE), "w", encoding="utf-8") as handle:
        handle.write("not json")
    result = run_module("numa_hugepages", args(host, GROW))
    assert result["failed"] is True
    assert result["msg"].startswith(os.path.join(host["root"], STATE) + ": is not JSON")


MOUNTS = [
    {"path": "/dev/hugepages1G", "size_kb": 1048576},
    {"path": "/mnt/huge-2m", "size_kb": 2048, "mode": "0770", "group": "llm"},
]
MOUNT_UNITS = ["dev-hugepages1G.mount", "mnt-huge\\x2d2m.mount"]


def test_mounts_check_mode_writes_nothing_then_apply_then_unchanged(run_module, host):
    before = tree_hash(host["fsroot"])
    check = run_module(
        "numa_hugepages", args(host, GROW, mounts=MOUNTS), check_mode=True, diff=True
    )
    assert check["failed"] is False and check["changed"] is True
    assert tree_hash(host["fsroot"]) == before and not os.path.exists(host["root"])
    headers = [entry["after_header"] for entry in check["diff"][1:]]
    assert "/etc/systemd/system/dev-hugepages1G.mount" in headers
    assert "/etc/systemd/system/mnt-huge\\x2d2m.mount" in headers
    assert [m["state"] for m in check["mounts"]] == ["create", "create"]
    assert check["handler_mount_start"] == []  # check mode: nothing for the handlers
    assert check["would_run"][-2:] == [f"systemctl enable --now {unit}" for unit in MOUNT_UNITS]

    first = run_module("numa_hugepages", args(host, GROW, mounts=MOUNTS))
    assert first["changed"] is True and first["files"] == check["files"]
    assert first["handler_mount_start"] == []  # service_manager none (render mode)
    assert first["would_run"] == check["would_run"]
    unit = os.path.join(host["root"], "etc/systemd/system", MOUNT_UNITS[1])
    with open(unit, encoding="utf-8") as handle:
        assert "Options=pagesize=2M,mode=0770,gid=llm" in handle.read().splitlines()
    with open(os.path.join(host["root"], STATE), encoding="utf-8") as handle:
        assert json.load(handle)["mounts"] == MOUNT_UNITS

    after_first = tree_hash(host["fsroot"], host["root"])
    second = run_module("numa_hugepages", args(host, GROW, mounts=MOUNTS), diff=True)
    assert second["changed"] is False and second["diff"] == [] and second["would_run"] == []
    assert [m["state"] for m in second["mounts"]] == ["unchanged", "unchanged"]
    assert tree_hash(host["fsroot"], host["root"]) == after_first


def test_mounts_handlers_with_systemd_and_removal(run_module, host):
    first = run_module("numa_hugepages", args(host, GROW, mounts=MOUNTS, service_manager="systemd"))
    assert first["handler_mount_start"] == MOUNT_UNITS
    assert first["handler_mount_restart"] == [] and first["handler_mount_stop"] == []
    changed = [dict(MOUNTS[0], mode="0700")]
    second = run_module(
        "numa_hugepages", args(host, GROW, mounts=changed, service_manager="systemd")
    )
    assert second["changed"] is True
    assert second["handler_mount_start"] == []
    assert second["handler_mount_restart"] == [MOUNT_UNITS[0]]
    assert second["handler_mount_stop"] == [MOUNT_UNITS[1]]
    assert second["would_run"] == [
        f"systemctl disable --now {MOUNT_UNITS[1]}",
        "systemctl daemon-reload",
        f"systemctl restart {MOUNT_UNITS[0]}",
    ]
    assert not os.path.exists(os.path.join(host["root"], "etc/systemd/system", MOUNT_UNITS[1]))
    third = run_module(
        "numa_hugepages", args(host, GROW, mounts=changed, service_manager="systemd")
    )
    assert third["changed"] is False and third["handler_mount_restart"] == []


@pytest.mark.parametrize(
    ("mounts", "fragment"),
    [
        ([{"path": "relative", "size_kb": 2048}], "mounts[0].path is 'relative'; it must be"),
        ([{"path": "/", "size_kb": 2048}], "mounts[0].path is '/'; hugetlbfs cannot be mounted"),
        (
            [{"path": "/a", "size_kb": 2048}, {"path": "/a/", "size_kb": 2048}],
            "mounts[1].path /a is also mounts[0].path",
        ),
        ([{"path": "/a", "size_kb": 64}], "mounts[0].size_kb is 64; this kernel has no 64 kB"),
        ([{"path": "/a", "size_kb": 2048, "mode": "rwx"}], "mounts[0].mode is 'rwx'"),
    ],
)
def test_bad_mounts_fail_and_write_nothing(run_module, host, mounts, fragment):
    before = tree_hash(host["fsroot"])
    result = run_module("numa_hugepages", args(host, GROW, mounts=mounts))
    assert result["failed"] is True and fragment in result["msg"]
    assert "exception" not in result
    assert tree_hash(host["fsroot"]) == before and not os.path.exists(host["root"])


# --- issue 19: no links, modes independent of the umask, the per-host lock ------------------------


@pytest.mark.parametrize("level", ["etc", "etc/numafleet", "usr/local", "etc/systemd/system"])
def test_a_linked_directory_is_refused_and_nothing_lands_there(run_module, host, tmp_path, level):
    """Failed before for every level but the immediate parent of a file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    link = os.path.join(host["root"], level)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(outside, link)
    result = run_module("numa_hugepages", args(host, GROW))
    assert result["failed"] is True
    assert link in result["msg"] and "symbolic link" in result["msg"]
    assert list(outside.rglob("*")) == []


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_directories_and_files_get_their_modes_under_any_umask(run_module, host, mask):
    """With umask 000 the directories were 0777 (failed before), with 077 0700."""
    old = os.umask(mask)
    try:
        result = run_module("numa_hugepages", args(host, GROW))
    finally:
        os.umask(old)
    assert result["failed"] is False, result.get("msg")
    root = host["root"]
    for rel in ("etc", "etc/numafleet", "etc/systemd/system", "usr/local/libexec"):
        assert os.stat(os.path.join(root, rel)).st_mode & 0o777 == 0o755, rel
    assert os.stat(os.path.join(root, STATE)).st_mode & 0o777 == 0o644
    assert os.stat(os.path.join(root, UNIT)).st_mode & 0o777 == 0o644
    assert os.stat(os.path.join(root, PROGRAM)).st_mode & 0o777 == 0o755


def test_a_second_run_fails_while_the_lock_is_held(run_module, host, monkeypatch):
    import fcntl

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import files

    monkeypatch.setattr(files, "LOCK_TIMEOUT_S", 0.2)
    lock = os.path.join(host["root"], "run/numafleet/apply.lock")
    os.makedirs(os.path.dirname(lock))
    with open(lock, "w") as held:
        held.write("777\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        result = run_module("numa_hugepages", args(host, GROW))
    assert result["failed"] is True and lock in result["msg"] and "PID 777" in result["msg"]
    assert pool(host, 0) != 32 and not os.path.exists(os.path.join(host["root"], STATE))


def test_a_mount_unit_the_state_file_lists_but_we_did_not_write_is_kept(run_module, host, tmp_path):
    """Failed before: an admin's home.mount named in hugepages.json was stopped and removed."""
    run_module("numa_hugepages", args(host, GROW, mounts=MOUNTS))
    admin = os.path.join(host["root"], "etc/systemd/system/home.mount")
    with open(admin, "w") as out:
        out.write("[Mount]\nWhat=/dev/sdb1\nWhere=/home\n")
    state = os.path.join(host["root"], STATE)
    with open(state) as handle:
        data = json.load(handle)
    data["mounts"] = sorted([*data["mounts"], "home.mount"])
    with open(state, "w") as out:
        json.dump(data, out)
    result = run_fresh(tmp_path, args(host, GROW, mounts=MOUNTS, service_manager="systemd"))
    assert not result.get("failed"), result.get("msg")
    assert "home.mount" not in " ".join(result["would_run"]) and result["handler_mount_stop"] == []
    assert os.path.isfile(admin)
    assert any("home.mount" in text and "kept" in text for text in warning_texts(result))
