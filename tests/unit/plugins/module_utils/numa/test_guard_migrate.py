"""guard_migrate.py: node masks, the cgroup walk, errors per pid, and a real migrate_pages call."""

from __future__ import annotations

import ast
import errno
import os
import platform
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import guard_migrate
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import GuardError

SOURCE = Path(guard_migrate.__file__)


class FakeSyscall:
    """Records each migrate_pages call; answers per pid (an int, or an errno to raise)."""

    def __init__(self, answers=None):
        self.answers = answers or {}
        self.calls = []

    def __call__(self, pid, maxnode, old, new):
        self.calls.append((pid, maxnode, old, new))
        answer = self.answers.get(pid, 0)
        if isinstance(answer, OSError):
            raise answer
        return answer


def _cgroup(root: Path, procs: dict) -> str:
    """A cgroup tree: {relative dir: [pids]}; '' is the placement's own cgroup."""
    for rel, pids in procs.items():
        directory = root / rel if rel else root
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return str(root)


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([0], (65, (1,))),
        ([1], (65, (2,))),
        ([0, 1, 3], (65, (0b1011,))),
        ([1, 65], (129, (2, 2))),
    ],
)
def test_node_mask_is_libnumas_layout(nodes, expected):
    assert guard_migrate.node_mask(nodes) == expected


@pytest.mark.parametrize("nodes", [[], [-1], [True], ["0"], [4096]])
def test_node_mask_refuses_bad_node_sets(nodes):
    with pytest.raises(GuardError, match="migrate: node"):
        guard_migrate.node_mask(nodes)


@pytest.mark.parametrize(
    ("machine", "number"), [("x86_64", 256), ("aarch64", 238), ("arm64", 238), ("AMD64", 256)]
)
def test_syscall_numbers_per_architecture(machine, number):
    assert guard_migrate.syscall_number(machine) == number


def test_an_unknown_architecture_is_refused_with_the_fix():
    with pytest.raises(GuardError) as err:
        guard_migrate.libc_syscall("riscv64")
    assert str(err.value) == (
        "migrate: this host's architecture 'riscv64' has no known migrate_pages system call "
        "number (known: x86_64, aarch64); set numafleet_memory_act to reclaim or throttle"
    )


def test_migrate_cgroup_moves_every_process_of_the_cgroup_and_below(tmp_path):
    cgroup = _cgroup(tmp_path / "numafleet-kv.service", {"": [300, 12], "worker": [77]})
    fake = FakeSyscall({300: 5, 77: 2})
    result = guard_migrate.migrate_cgroup(cgroup, [1], [0], syscall=fake)
    assert result == guard_migrate.MigrateResult((12, 77, 300), 7, ())
    assert result.ok
    assert fake.calls == [(12, 65, (2,), (1,)), (77, 65, (2,), (1,)), (300, 65, (2,), (1,))]


def test_an_exited_process_is_skipped_and_other_failures_are_collected(tmp_path):
    cgroup = _cgroup(tmp_path / "u.service", {"": [10, 11, 12]})
    fake = FakeSyscall(
        {
            10: OSError(errno.ESRCH, "No such process"),
            11: OSError(errno.EPERM, "Operation not permitted"),
            12: 3,
        }
    )
    result = guard_migrate.migrate_cgroup(cgroup, [0], [1], syscall=fake)
    assert result.pids == (10, 11, 12)
    assert result.not_moved_pages == 3
    assert result.errors == ((11, "migrate_pages: Operation not permitted"),)
    assert not result.ok


def test_wide_masks_are_padded_to_the_same_length(tmp_path):
    cgroup = _cgroup(tmp_path / "u.service", {"": [5]})
    fake = FakeSyscall()
    guard_migrate.migrate_cgroup(cgroup, [70], [0], syscall=fake)
    assert fake.calls == [(5, 129, (0, 1 << 6), (1, 0))]


def test_a_stopped_unit_is_refused_before_any_call(tmp_path):
    fake = FakeSyscall()
    with pytest.raises(GuardError, match="cgroup.procs does not exist: the unit is not running"):
        guard_migrate.migrate_cgroup(str(tmp_path / "gone.service"), [1], [0], syscall=fake)
    assert fake.calls == []


def test_a_malformed_procs_file_is_refused(tmp_path):
    cgroup = tmp_path / "u.service"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("12\nabc\n")
    with pytest.raises(GuardError, match="has 'abc', not a pid"):
        guard_migrate.migrate_cgroup(str(cgroup), [1], [0], syscall=FakeSyscall())


def test_bad_nodes_are_refused_before_reading_the_cgroup(tmp_path):
    with pytest.raises(GuardError, match=r"node set \[\] is not a list of node ids"):
        guard_migrate.migrate_cgroup(str(tmp_path / "absent"), [], [0], syscall=FakeSyscall())


def test_imports_only_errors_and_the_standard_library():
    """The module is copied into the guard's package: siblings other than errors are absent."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    relative = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
    assert relative == {"errors"}


REAL = pytest.mark.skipif(
    platform.system() != "Linux"
    or platform.machine().lower() not in guard_migrate.SYS_MIGRATE_PAGES
    or not os.path.exists("/sys/devices/system/node/node0"),
    reason="needs Linux on x86_64/aarch64 with NUMA node 0",
)


@REAL
def test_real_migrate_pages_on_this_process_from_node_0_to_node_0():
    """The real system call through ctypes: moving our own pages 0 -> 0 succeeds (>= 0)."""
    assert guard_migrate.migrate_pid(os.getpid(), [0], [0]) >= 0


@REAL
def test_real_migrate_cgroup_with_this_process(tmp_path):
    cgroup = _cgroup(tmp_path / "self.service", {"": [os.getpid()]})
    result = guard_migrate.migrate_cgroup(cgroup, [0], [0])
    assert result.pids == (os.getpid(),)
    assert result.errors == () and result.not_moved_pages >= 0


@REAL
def test_real_migrate_of_an_exited_process_is_skipped(tmp_path):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # reaped: the pid no longer exists
    cgroup = _cgroup(tmp_path / "gone.service", {"": [pid]})
    result = guard_migrate.migrate_cgroup(cgroup, [0], [0])
    assert result == guard_migrate.MigrateResult((pid,), 0, ())
