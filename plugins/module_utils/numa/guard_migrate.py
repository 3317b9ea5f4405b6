# Private to this collection: may change in any release.
"""Move a cgroup's pages between NUMA nodes with migrate_pages(2), for the memory guard.

The guard's core (``guard.decide``, mode ``migrate``) picks the placement and the target node;
the program calls ``migrate_cgroup`` with the placement's cgroup directory. For every process
listed in ``cgroup.procs`` of that directory and of every cgroup below it, the kernel moves the
process's pages on ``from_nodes`` to ``to_nodes`` (Linux mm/mempolicy.c, migrate_pages(2)):

    long migrate_pages(int pid, unsigned long maxnode,
                       const unsigned long *old_nodes, const unsigned long *new_nodes);

It returns the number of pages it could not move (>= 0) or -1 with errno: ESRCH (the process
exited: not an error here), EPERM (a target node outside the process's cpuset needs
CAP_SYS_NICE; the guard runs as root), EINVAL (bad node mask). Threads share their process's
address space, so one call per process (cgroup.procs, not cgroup.threads) is enough. The
process's cpuset and memory policy stay as they were: new allocations go to its planned nodes
again (the guard keeps the placement "spilled" until its off-node share drops).

Called through libc's ``syscall(3)`` with ctypes (no ``migratepages`` binary, no libnuma);
the system call number depends on the architecture (x86_64 256, aarch64 238; others are
refused). Imports only ``.errors`` and the standard library: the module is copied into the
guard's package on managed hosts.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import GuardError

# System call numbers of migrate_pages (arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h for arm64).
SYS_MIGRATE_PAGES = {"x86_64": 256, "amd64": 256, "aarch64": 238, "arm64": 238}
_WORD_BITS = 64  # unsigned long on the 64-bit architectures above

# syscall(pid, maxnode, old_mask_words, new_mask_words) -> pages not moved; raises OSError.
Syscall = Callable[[int, int, tuple, tuple], int]


@dataclass(frozen=True)
class MigrateResult:
    """migrate_cgroup's result.

    pids: the processes asked to move (sorted), exited ones included.
    not_moved_pages: sum of the pages the kernel could not move (busy, pinned, no room).
    errors: ((pid, message), ...) of the calls that failed (an exited process is not one).
    """

    pids: tuple
    not_moved_pages: int
    errors: tuple

    @property
    def ok(self) -> bool:
        """True when no call failed (some pages may still have stayed; see not_moved_pages)."""
        return not self.errors


def node_mask(nodes) -> tuple:
    """(maxnode, mask words) of a set of node ids for migrate_pages(2); raises GuardError.

    maxnode is the mask's bit count plus one, as libnuma passes it (the kernel reads
    maxnode - 1 bits).
    """
    ids = sorted(set(nodes))
    if not ids or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in ids):
        raise GuardError(f"migrate: node set {list(nodes)!r} is not a list of node ids")
    if ids[-1] >= 4096:
        raise GuardError(f"migrate: node {ids[-1]} is beyond the kernel's limit of 4096 nodes")
    words = [0] * (ids[-1] // _WORD_BITS + 1)
    for node in ids:
        words[node // _WORD_BITS] |= 1 << (node % _WORD_BITS)
    return len(words) * _WORD_BITS + 1, tuple(words)


def syscall_number(machine: Optional[str] = None) -> int:
    """migrate_pages' system call number on ``machine`` (default: this one); raises GuardError."""
    machine = machine if machine is not None else platform.machine()
    number = SYS_MIGRATE_PAGES.get(machine.lower())
    if number is None:
        raise GuardError(
            f"migrate: this host's architecture {machine!r} has no known migrate_pages system "
            f"call number (known: x86_64, aarch64); set numafleet_memory_act to reclaim or throttle"
        )
    return number


def libc_syscall(machine: Optional[str] = None) -> Syscall:
    """A Syscall calling migrate_pages through libc's syscall(3); raises GuardError when the
    architecture is unknown or libc cannot be loaded."""
    number = syscall_number(machine)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syscall
    except (OSError, AttributeError) as exc:
        raise GuardError(f"migrate: libc's syscall(3) cannot be loaded ({exc})") from None
    function.restype = ctypes.c_long

    def call(pid: int, maxnode: int, old: tuple, new: tuple) -> int:
        array = ctypes.c_ulong * max(len(old), len(new))
        old_words = array(*old)
        new_words = array(*new)
        result = function(
            ctypes.c_long(number),
            ctypes.c_long(pid),
            ctypes.c_ulong(maxnode),
            old_words,
            new_words,
        )
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return int(result)

    return call


def migrate_pid(pid: int, from_nodes, to_nodes, syscall: Optional[Syscall] = None) -> int:
    """Pages of process ``pid`` not moved from ``from_nodes`` to ``to_nodes`` (>= 0).

    Raises OSError from the kernel (ESRCH: no such process) and GuardError for bad node sets
    or an unknown architecture.
    """
    from_max, old = node_mask(from_nodes)
    to_max, new = node_mask(to_nodes)
    width = max(len(old), len(new))
    old = old + (0,) * (width - len(old))
    new = new + (0,) * (width - len(new))
    call = syscall if syscall is not None else libc_syscall()
    return call(pid, max(from_max, to_max), old, new)


def read_procs(cgroup_dir: str) -> tuple:
    """Sorted pids in ``cgroup.procs`` of ``cgroup_dir`` and every cgroup below it.

    Raises GuardError when the directory has no cgroup.procs (not a cgroup, or gone) or a line
    is not a pid.
    """
    pids = set()
    top = os.path.join(cgroup_dir, "cgroup.procs")
    if not os.path.isfile(top):
        raise GuardError(f"migrate: {top} does not exist: the unit is not running")
    for directory, dummy, files in os.walk(cgroup_dir):
        if "cgroup.procs" not in files:
            continue
        path = os.path.join(directory, "cgroup.procs")
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                continue  # a child cgroup removed while walking
            raise GuardError(f"migrate: {path}: {exc.strerror or 'cannot be read'}") from None
        for line in text.split():
            if not line.isdigit():
                raise GuardError(f"migrate: {path} has {line[:40]!r}, not a pid")
            pids.add(int(line))
    return tuple(sorted(pids))


def migrate_cgroup(
    cgroup_dir: str, from_nodes, to_nodes, syscall: Optional[Syscall] = None
) -> MigrateResult:
    """Move the pages of every process of ``cgroup_dir`` (and below) from ``from_nodes`` to
    ``to_nodes``; returns MigrateResult.

    A process that exits meanwhile is skipped; other failures are collected per pid, never
    raised. Raises GuardError (before any move) when the cgroup has no cgroup.procs, a node set
    is bad or the architecture is unknown.
    """
    node_mask(from_nodes)
    node_mask(to_nodes)
    pids = read_procs(cgroup_dir)
    call = syscall if syscall is not None else libc_syscall()
    not_moved, errors = 0, []
    for pid in pids:
        try:
            not_moved += migrate_pid(pid, from_nodes, to_nodes, call)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                continue
            errors.append((pid, f"migrate_pages: {exc.strerror or exc}"))
    return MigrateResult(pids, not_moved, tuple(errors))
