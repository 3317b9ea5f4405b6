# Private to this collection: may change in any release.
"""Per-node hugepage pools: desired totals, runtime writes with read-back, boot persistence.

``plan_hugepages`` reads the pools of the managed sizes under ``sysfs_root``, the state file of
the last run under ``root`` and (for boot reservations) the kernel release under
``procfs_root``, and returns the whole change: per-pool totals, warnings, the files to write and
the kernel command line. ``apply_hugepages`` then writes the pools (read back; a short grant
restores every pool written in the run and raises) and the files. Nothing is written before the
plan is complete, so check mode is ``plan_hugepages`` alone.

Pools are addressed as ``(node, size_kb)``; counts are pages, not kB.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Callable, Optional

from . import cmdline, files
from .errors import NumaTuneError, UnitRenderError
from .osrelease import read_osrelease, release_tuple
from .sysfs import Reader
from .units import FileChange, under_root
from .units import escape_path as unit_path_value

STATE_PATH = "/etc/numafleet/hugepages.json"
PROGRAM_PATH = "/usr/local/libexec/numafleet-hugepages"
UNIT_NAME = "numafleet-hugepages.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
GRUB_PATH = "/etc/default/grub.d/60-numafleet-hugepages.cfg"
PYTHON = "/usr/bin/python3"
HEADER = "# Managed by numafleet.tuning (numafleet.tuning.numa_hugepages): do not edit."
STATE_VERSION = 1
# First kernel that takes hugepages=<node>:<count>,... on the command line.
PER_NODE_CMDLINE_KERNEL = (5, 16)
BOOTLOADERS = ("grub_d", "grubby", "none")
FILE_MODE = 0o644
PROGRAM_MODE = 0o755
DIR_MODE = 0o755
# Where ``bootloader: auto`` looks (below root): grubby wins, as RHEL also has /etc/default/grub.
GRUBBY_PATHS = ("/usr/sbin/grubby", "/sbin/grubby", "/usr/bin/grubby")
GRUB_MARKERS = ("/etc/default/grub", "/usr/sbin/update-grub")

NODE_DIR = ("devices", "system", "node")
_NODE_RE = re.compile(r"^node([0-9]+)\Z")
_POOL_RE = re.compile(r"^hugepages-([0-9]+)kB\Z")
_STOP_THEN_RUN = "stop the services holding them, then run again"


class HugepageError(NumaTuneError):
    """Input, a pool, the state file or a persistence file cannot be used; str(exc) says the fix."""


class HugepageGrantError(HugepageError):
    """The kernel granted a pool other than the total written; every pool written was restored.

    ``short`` lists ``(node, size_kb, requested, granted)``; ``unrestored`` the pools that could
    not be put back, as ``(node, size_kb, previous, now)``.
    """

    def __init__(self, message: str, short: list, unrestored: list) -> None:
        self.short = short
        self.unrestored = unrestored
        super().__init__(message)


# --- input -------------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_pools(pools) -> dict:
    """{(node, size_kb): total} of the ``pools`` option, same pool summed; raises HugepageError."""
    if not isinstance(pools, list):
        raise HugepageError(
            f"pools: {pools!r} is not a list; give [{{node: 0, size_kb: 2048, count: 512}}, ...]"
        )
    totals: dict = {}
    for index, entry in enumerate(pools):
        where = f"pools[{index}]"
        if not isinstance(entry, dict):
            raise HugepageError(f"{where}: {entry!r} is not a mapping of node, size_kb and count")
        for key, minimum in (("node", 0), ("size_kb", 1), ("count", 0)):
            value = entry.get(key)
            if not _is_int(value) or value < minimum:
                raise HugepageError(
                    f"{where}.{key} is {value!r}; it must be a whole number of at least {minimum}"
                    + (
                        " (page size in kB: 2048 for 2 MiB, 1048576 for 1 GiB)"
                        if key == "size_kb"
                        else ""
                    )
                )
        key = (entry["node"], entry["size_kb"])
        totals[key] = totals.get(key, 0) + entry["count"]
    return dict(sorted(totals.items()))


def parse_sizes(values, option: str) -> tuple:
    """Sorted distinct page sizes (kB) of a list option; raises HugepageError naming ``option``."""
    if not isinstance(values, list):
        raise HugepageError(f"{option}: {values!r} is not a list of page sizes in kB")
    for value in values:
        if not _is_int(value) or value <= 0:
            raise HugepageError(
                f"{option}: {value!r} is not a page size in kB; use e.g. 1048576 for 1 GiB pages"
            )
    return tuple(sorted(set(values)))


def format_size(size_kb: int) -> str:
    """The kernel command line's size text: 2048 -> '2M', 1048576 -> '1G', 64 -> '64K'."""
    if size_kb % (1 << 20) == 0:
        return f"{size_kb >> 20}G"
    if size_kb % (1 << 10) == 0:
        return f"{size_kb >> 10}M"
    return f"{size_kb}K"


# --- hugetlbfs mounts --------------------------------------------------------------------------

MOUNT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_MOUNT_MODE = "1770"
_UNIT_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_.")
_MODE_RE = re.compile(r"^[0-7]{3,4}\Z")
_GROUP_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]{0,31}\$?|[0-9]+)\Z")
_UNIT_NAME_MAX = 255


@dataclass(frozen=True)
class Mount:
    """One hugetlbfs mount asked for: normalized absolute path, page size, mode, group."""

    path: str
    size_kb: int
    mode: str = DEFAULT_MOUNT_MODE
    group: Optional[str] = None

    @property
    def unit(self) -> str:
        """The mount unit's name, ``<systemd-escape --path>.mount``."""
        return f"{escape_path(self.path)}.mount"

    @property
    def unit_path(self) -> str:
        """The unit file's path as on the host."""
        return f"{MOUNT_UNIT_DIR}/{self.unit}"


def _simplify(path: str) -> str:
    """``path`` with repeated and trailing slashes dropped (systemd's path_simplify, less '.')."""
    return "/" + "/".join(part for part in path.split("/") if part)


def escape_path(path: str) -> str:
    """``systemd-escape --path PATH``: '/x/y-z' -> 'x-y\\x2dz'; '/' -> '-'.

    Slashes are simplified and stripped at both ends, inner ones become '-'; every byte outside
    ``[A-Za-z0-9:_.]``, and a leading '.', becomes ``\\xNN`` (lower-case hex, per UTF-8 byte).
    """
    text = _simplify(path).strip("/")
    if not text:
        return "-"
    out = []
    for index, char in enumerate(text):
        if char == "/":
            out.append("-")
        elif char in _UNIT_PLAIN and not (index == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(out)


def _has_control(text: str) -> bool:
    return any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in text)


# Mount points refused: a hugetlbfs mount hides what is below it, so not on the directories the
# system lives in (FHS top level and their main subdirectories) nor anywhere under the trees
# that hold the OS, its configuration, kernel interfaces or users' homes.
_SYSTEM_DIRS = frozenset(
    "/bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /proc /root /run "
    "/sbin /srv /sys /tmp /usr /var /dev/shm /dev/pts /dev/mqueue /run/lock /run/user "
    "/run/systemd /var/lib /var/log /var/tmp /var/cache /var/spool /var/run /var/lock".split()
)
_SYSTEM_TREES = tuple(
    f"{top}/"
    for top in "/proc /sys /etc /boot /usr /bin /sbin /lib /lib32 /lib64 /libx32 "
    "/root /home".split()
)


def parse_mounts(mounts, offered_sizes) -> tuple:
    """Mounts of the ``mounts`` option, sorted by path; raises HugepageError naming the entry.

    ``offered_sizes``: the page sizes (kB) the kernel has pools of, on any node.
    """
    example = "[{path: /dev/hugepages1G, size_kb: 1048576}]"
    if not isinstance(mounts, list):
        raise HugepageError(f"mounts: {mounts!r} is not a list; give e.g. {example}")
    out, seen = [], {}
    offered = sorted(set(offered_sizes))
    offered_text = ", ".join(str(size) for size in offered) or "none"
    for index, entry in enumerate(mounts):
        where = f"mounts[{index}]"
        if not isinstance(entry, dict):
            raise HugepageError(
                f"{where}: {entry!r} is not a mapping of path, size_kb, mode and group; "
                f"give e.g. {example}"
            )
        path = entry.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise HugepageError(
                f"{where}.path is {path!r}; it must be an absolute path, e.g. /dev/hugepages1G"
            )
        if _has_control(path):
            raise HugepageError(
                f"{where}.path is {path!r}; it holds a control character, which a unit file "
                "cannot carry: remove it (newlines and tabs included)"
            )
        parts = [part for part in path.split("/") if part]
        if not parts:
            raise HugepageError(
                f"{where}.path is {path!r}; hugetlbfs cannot be mounted on /: give a directory "
                "such as /dev/hugepages1G"
            )
        if any(part in (".", "..") for part in parts):
            raise HugepageError(
                f"{where}.path is {path!r}; it holds a '.' or '..' component, which systemd "
                "refuses in a mount point: give the path without them"
            )
        normal = _simplify(path)
        if normal in _SYSTEM_DIRS or normal.startswith(_SYSTEM_TREES):
            raise HugepageError(
                f"{where}.path is {path!r}; a hugetlbfs mount there would hide the system's own "
                "files under it (or a kernel interface): give a directory of its own, such as "
                "/dev/hugepages1G or /mnt/huge"
            )
        try:
            # Where= and the Description= carry the path: it must read back exactly.
            unit_path_value(normal, f"{where}.path")
        except UnitRenderError as exc:
            raise HugepageError(str(exc)) from None
        if normal in seen:
            raise HugepageError(
                f"{where}.path {normal} is also mounts[{seen[normal]}].path; give each mount "
                "point once (one hugetlbfs mount per path)"
            )
        seen[normal] = index
        size = entry.get("size_kb")
        if not _is_int(size) or size <= 0:
            raise HugepageError(
                f"{where}.size_kb is {size!r}; it must be a page size in kB "
                f"(offered by this kernel: {offered_text})"
            )
        if size not in offered:
            raise HugepageError(
                f"{where}.size_kb is {size}; this kernel has no {size} kB hugepages (offered: "
                f"{offered_text}). Use a page size the kernel offers (2048 or 1048576 on x86_64)"
            )
        mode = entry.get("mode")
        mode = DEFAULT_MOUNT_MODE if mode is None else mode
        if not isinstance(mode, str) or not _MODE_RE.match(mode):
            raise HugepageError(
                f"{where}.mode is {mode!r}; give the mount's mode as an octal string of 3 or 4 "
                f'digits, e.g. "{DEFAULT_MOUNT_MODE}"'
            )
        group = entry.get("group")
        if group is not None and (not isinstance(group, str) or not _GROUP_RE.match(group)):
            raise HugepageError(
                f"{where}.group is {group!r}; give a group name (letters, digits, '_', '.', '-', "
                "starting with a letter or '_') or a numeric gid, or leave it out"
            )
        mount = Mount(normal, size, mode, group)
        if len(mount.unit) > _UNIT_NAME_MAX:
            raise HugepageError(
                f"{where}.path {normal}: its mount unit name {mount.unit} is longer than "
                f"{_UNIT_NAME_MAX} characters; use a shorter path"
            )
        out.append(mount)
    return tuple(sorted(out, key=lambda m: m.path))


def mount_pagesize(size_kb: int) -> str:
    """hugetlbfs' pagesize= text: 1048576 -> '1G', 2048 -> '2M', 64 -> '64kB'."""
    if size_kb % (1 << 20) == 0:
        return f"{size_kb >> 20}G"
    if size_kb % (1 << 10) == 0:
        return f"{size_kb >> 10}M"
    return f"{size_kb}kB"


def render_mount(mount: Mount) -> str:
    """The text of the mount unit of ``mount`` (a hugetlbfs of its page size, early at boot)."""
    options = f"pagesize={mount_pagesize(mount.size_kb)},mode={mount.mode}"
    if mount.group is not None:
        options += f",gid={mount.group}"
    where = unit_path_value(mount.path, "mounts path")
    return "\n".join(
        [
            HEADER,
            "[Unit]",
            f"Description=numafleet hugetlbfs, {mount_pagesize(mount.size_kb)} pages, at {where}",
            "DefaultDependencies=no",
            "Before=sysinit.target",
            "",
            "[Mount]",
            "What=hugetlbfs",
            f"Where={where}",
            "Type=hugetlbfs",
            f"Options={options}",
            "",
            "[Install]",
            "WantedBy=sysinit.target",
            "",
        ]
    )


def offered_sizes(offered: dict) -> list:
    """Sorted page sizes (kB) the kernel has a pool of on any node ({node: sizes})."""
    return sorted({size for sizes in offered.values() for size in sizes})


# --- state file --------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """The state file of an earlier run (``/etc/numafleet/hugepages.json``)."""

    managed_sizes_kb: tuple = ()
    pools: tuple = ()  # ((node, size_kb, count), ...) applied at boot by the program
    boot_reserved_sizes_kb: tuple = ()
    boot_pools: tuple = ()  # ((node, size_kb, count), ...) reserved on the kernel command line
    kernel_args: tuple = ()
    bootloader: str = "none"
    mounts: tuple = ()  # names of the hugetlbfs mount units written (below /etc/systemd/system)


def _pool_triples(entries, where: str, fix: str, path: str) -> tuple:
    if not isinstance(entries, list):
        raise HugepageError(f"{path}: {where} is not a list. {fix}")
    out = []
    for entry in entries:
        values = [
            entry.get(key) if isinstance(entry, dict) else None
            for key in ("node", "size_kb", "count")
        ]
        if not all(_is_int(value) and value >= 0 for value in values):
            raise HugepageError(
                f"{path}: {where} holds {entry!r}, not a node, size_kb and count. {fix}"
            )
        out.append(tuple(values))
    return tuple(sorted(out))


def parse_state(text: str, path: str) -> State:
    """The State in a state file's text; raises HugepageError when it is malformed."""
    fix = (
        "Restore it from the last run, or remove it (the sizes it managed are then no longer "
        "released when they leave pools)"
    )
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HugepageError(f"{path}: is not JSON ({exc}). {fix}") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise HugepageError(
            f"{path}: is not a version {STATE_VERSION} numafleet hugepages state. {fix}"
        )
    sizes = data.get("managed_sizes_kb", [])
    boot_sizes = data.get("boot_reserved_sizes_kb", [])
    args = data.get("kernel_args", [])
    for name, values in (("managed_sizes_kb", sizes), ("boot_reserved_sizes_kb", boot_sizes)):
        if not isinstance(values, list) or not all(_is_int(v) and v > 0 for v in values):
            raise HugepageError(f"{path}: {name} is not a list of page sizes. {fix}")
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise HugepageError(f"{path}: kernel_args is not a list of strings. {fix}")
    bootloader = data.get("bootloader", "none")
    if bootloader not in BOOTLOADERS:
        raise HugepageError(
            f"{path}: bootloader {bootloader!r} is not one of {', '.join(BOOTLOADERS)}. {fix}"
        )
    mounts = data.get("mounts", [])
    if not isinstance(mounts, list) or not all(
        isinstance(name, str)
        and name.endswith(".mount")
        and "/" not in name
        and name not in (".mount", "..mount")
        for name in mounts
    ):
        raise HugepageError(f"{path}: mounts is not a list of mount unit names. {fix}")
    return State(
        managed_sizes_kb=tuple(sorted(set(sizes))),
        pools=_pool_triples(data.get("pools", []), "pools", fix, path),
        boot_reserved_sizes_kb=tuple(sorted(set(boot_sizes))),
        boot_pools=_pool_triples(data.get("boot_pools", []), "boot_pools", fix, path),
        kernel_args=tuple(args),
        bootloader=bootloader,
        mounts=tuple(sorted(set(mounts))),
    )


def render_state(state: State) -> str:
    """The state file's JSON text (sorted, stable)."""
    data = {
        "version": STATE_VERSION,
        "managed_sizes_kb": list(state.managed_sizes_kb),
        "pools": [{"node": n, "size_kb": s, "count": c} for n, s, c in state.pools],
        "boot_reserved_sizes_kb": list(state.boot_reserved_sizes_kb),
        "boot_pools": [{"node": n, "size_kb": s, "count": c} for n, s, c in state.boot_pools],
        "kernel_args": list(state.kernel_args),
        "bootloader": state.bootloader,
    }
    if state.mounts:  # only when there are any: a state without mounts stays as it was
        data["mounts"] = list(state.mounts)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


# --- runtime pools -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """One node's pool as sysfs shows it (pages)."""

    node: int
    size_kb: int
    total: int
    free: int
    surplus: int

    @property
    def in_use(self) -> int:
        """Pages handed out (nr_hugepages - free_hugepages), never below 0."""
        return max(0, self.total - self.free)


def pool_dir(sysfs_root: str, node: int, size_kb: int) -> str:
    """<sysfs_root>/devices/system/node/node<N>/hugepages/hugepages-<size>kB."""
    return os.path.join(sysfs_root, *NODE_DIR, f"node{node}", "hugepages", f"hugepages-{size_kb}kB")


def _reader_problem(reader: Reader) -> str:
    return "; ".join(f"{w['path']}: {w['reason']}" for w in reader.warnings)


def read_node_ids(reader: Reader) -> list:
    """Sorted node ids under <sysfs_root>/devices/system/node ([] without NUMA)."""
    ids = []
    for name in reader.listdir(reader.sys(*NODE_DIR), optional=True):
        match = _NODE_RE.match(name)
        if match:
            ids.append(int(match.group(1)))
    return sorted(ids)


def read_pool(reader: Reader, node: int, size_kb: int) -> Optional[Pool]:
    """The pool of ``node`` and ``size_kb``, None when the kernel has none; raises HugepageError."""
    base = pool_dir(reader.sysfs_root, node, size_kb)
    if not reader.isdir(base):
        return None
    before = len(reader.warnings)
    total = reader.integer(os.path.join(base, "nr_hugepages"))
    free = reader.integer(os.path.join(base, "free_hugepages"))
    surplus = reader.integer(os.path.join(base, "surplus_hugepages"), optional=True)
    if total is None or free is None or len(reader.warnings) > before:
        problems = "; ".join(f"{w['path']}: {w['reason']}" for w in reader.warnings[before:])
        raise HugepageError(
            f"node {node}, {size_kb} kB pages: the pool cannot be read ({problems}). Check that "
            "sysfs_root is the host's sysfs and that the module runs as root"
        )
    return Pool(node, size_kb, total, free, surplus or 0)


def read_offered(reader: Reader, node: int) -> list:
    """Sorted page sizes (kB) the kernel has a pool of on ``node``."""
    base = reader.sys(*NODE_DIR, f"node{node}", "hugepages")
    sizes = []
    for name in reader.listdir(base, optional=True):
        match = _POOL_RE.match(name)
        if match:
            sizes.append(int(match.group(1)))
    return sorted(sizes)


def read_pools(sysfs_root: str, procfs_root: str, sizes) -> tuple:
    """(node ids, {(node, size_kb): Pool} of sizes, {node: sizes offered}); raises HugepageError."""
    reader = Reader(sysfs_root, procfs_root)
    try:
        reader.check_roots()
    except NumaTuneError as exc:
        raise HugepageError(str(exc)) from None
    nodes = read_node_ids(reader)
    pools = {}
    offered = {node: read_offered(reader, node) for node in nodes}
    for node in nodes:
        for size in sorted(sizes):
            pool = read_pool(reader, node, size)
            if pool is not None:
                pools[(node, size)] = pool
    return nodes, pools, offered


@dataclass(frozen=True)
class PoolChange:
    """One managed pool: total now, total to write (or to reserve at boot), pages in use."""

    node: int
    size_kb: int
    before: int
    after: int
    desired: int
    in_use: int
    boot: bool

    @property
    def changes_now(self) -> bool:
        """Whether the runtime pool is to be written in this run."""
        return not self.boot and self.before != self.after

    def as_dict(self) -> dict:
        """The module's pools entry."""
        return {
            "node": self.node,
            "size_kb": self.size_kb,
            "before": self.before,
            "after": self.after,
            "desired": self.desired,
            "in_use": self.in_use,
            "boot": self.boot,
        }


def _node_text(nodes: list) -> str:
    return ", ".join(str(node) for node in nodes) if nodes else "none"


def plan_pools(
    nodes: list, current: dict, desired: dict, managed_sizes, boot_sizes, offered=None
) -> tuple:
    """(PoolChanges sorted by node and size, warnings) for the managed sizes; no I/O.

    Every node without an entry in ``desired`` wants 0 of a managed size. A runtime pool is never
    shrunk below its pages in use: it gets max(desired, in use) and a warning. Raises
    HugepageError for a node that does not exist or a size the kernel does not offer on it
    (``offered``: {node: sizes}, for the message; default: the sizes in ``current``).
    """
    for (node, size), count in desired.items():
        if node not in nodes:
            raise HugepageError(
                f"pools: node {node} does not exist on this host (NUMA nodes: "
                f"{_node_text(nodes)}); plan the pages on one of those nodes"
            )
        if (node, size) not in current and count > 0:
            sizes = (offered or {}).get(node, sorted(s for (n, s) in current if n == node))
            raise HugepageError(
                f"pools: node {node} has no {size} kB hugepage pool "
                f"({pool_dir('<sysfs_root>', node, size)} is missing; pools of that node: "
                f"{', '.join(f'{s} kB' for s in sizes) or 'none'}). Use a page "
                "size the kernel offers (2048 or 1048576 on x86_64); a node without memory has no "
                "pools"
            )
    changes, warnings = [], []
    for node in nodes:
        for size in sorted(managed_sizes):
            pool = current.get((node, size))
            if pool is None:
                continue
            want = desired.get((node, size), 0)
            boot = size in boot_sizes
            after = want if boot else max(want, pool.in_use)
            if not boot and want < pool.in_use:
                warnings.append(
                    f"node {node}, {size} kB pages: {pool.in_use} in use, {want} desired; the pool "
                    f"is kept at {after} instead of shrinking below the pages in use: "
                    f"{_STOP_THEN_RUN}"
                )
            changes.append(PoolChange(node, size, pool.total, after, want, pool.in_use, boot))
    return changes, warnings


def _default_writer(path: str, value: int) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(f"{value}\n")


def _plain_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def global_pool_dir(sysfs_root: str, size_kb: int) -> str:
    """<sysfs_root>/kernel/mm/hugepages/hugepages-<size>kB: the system-wide pool of a size."""
    return os.path.join(sysfs_root, "kernel", "mm", "hugepages", f"hugepages-{size_kb}kB")


def _recording_writer(sysfs_root: str) -> Callable[[str, int], None]:
    """The default writer, which also keeps a recorded tree (render mode) a consistent kernel.

    A kernel that takes a new ``nr_hugepages`` moves ``free_hugepages`` with it at once: pages
    added are free until something maps them, and a shrink (never below the pages in use, see
    plan_pools) releases free pages only. A recorded sysfs is plain files, so after the write
    ``free_hugepages`` still reads what it read before: then the same delta is written into
    the node's ``free_hugepages`` and into ``nr_hugepages`` and ``free_hugepages`` of the
    system-wide pool (``global_pool_dir``; /proc/meminfo is not read by this collection and is
    left as recorded). On a live kernel ``free_hugepages`` has moved and nothing more is written.
    """

    def write(path: str, value: int) -> None:
        base = os.path.dirname(path)
        free_path = os.path.join(base, "free_hugepages")
        total, free = _plain_int(path), _plain_int(free_path)
        _default_writer(path, value)
        if total is None or free is None or value == total or _plain_int(path) != value:
            return  # nothing to emulate, or the kernel did not take the value (write_pools says)
        if _plain_int(free_path) != free:
            return  # a live kernel moved free_hugepages itself
        delta = value - total
        _default_writer(free_path, max(0, free + delta))
        size = _POOL_RE.match(os.path.basename(base))
        if size is None:
            return
        whole = global_pool_dir(sysfs_root, int(size.group(1)))
        for name in ("nr_hugepages", "free_hugepages"):
            count = _plain_int(os.path.join(whole, name))
            if count is not None:
                _default_writer(os.path.join(whole, name), max(0, count + delta))

    return write


def _read_back(sysfs_root: str, path: str) -> Optional[int]:
    return Reader(sysfs_root, "").integer(path)


def _grant_message(short: list, restored: list, unrestored: list, boot_hint: str) -> str:
    parts = [
        f"node {node}, {size} kB pages: requested {requested}, granted "
        f"{'unknown' if granted is None else granted}"
        for node, size, requested, granted, dummy in short
    ]
    reasons = sorted({reason for *dummy, reason in short if reason})
    text = (
        "hugepages: the kernel did not grant the pools asked for ("
        + "; ".join(parts)
        + ")"
        + (f" [{'; '.join(reasons)}]" if reasons else "")
        + ". Runtime reservations come up short when the node's free memory is too small or "
        "too fragmented. "
    )
    if unrestored:
        text += (
            "These pools could NOT be restored to their previous totals: "
            + "; ".join(
                f"node {node}, {size} kB pages: was {was}, now {now}"
                for node, size, was, now in unrestored
            )
            + ". "
        )
    elif restored:
        text += (
            "Every pool written in this run was restored to its previous total ("
            + "; ".join(f"node {node}, {size} kB pages: {was}" for node, size, was in restored)
            + "), so nothing changed. "
        )
    else:
        text += "Nothing changed. "
    text += (
        "Reserve these pages at boot instead: add the size to boot_reserve_sizes_kb "
        f"(hugepages_boot_reserve in the hugepages role) for {boot_hint} on the kernel command "
        "line, or free memory on the node and run again"
    )
    return text


def write_pools(
    sysfs_root: str,
    changes: list,
    writer: Optional[Callable[[str, int], None]] = None,
) -> list:
    """Write every runtime pool that changes (shrinks first), read each back; the pools written.

    ``writer(path, pages)`` does the write (default: the text to the file, and on a recorded
    tree the free pages and system-wide totals a kernel would show, ``_recording_writer``);
    tests inject one that makes the kernel "grant" less. When a read-back differs from what was written, or a write
    fails, every pool written in this run is restored to its previous total and
    HugepageGrantError is raised with requested vs granted per node.
    """
    write = writer or _recording_writer(sysfs_root)
    todo = [c for c in changes if c.changes_now]
    todo.sort(key=lambda c: (c.after > c.before, c.node, c.size_kb))
    written, short = [], []
    for change in todo:
        path = os.path.join(pool_dir(sysfs_root, change.node, change.size_kb), "nr_hugepages")
        reason = ""
        try:
            write(path, change.after)
            written.append(change)
            granted = _read_back(sysfs_root, path)
        except OSError as exc:
            written.append(change)  # a partial write may have moved the pool: restore it too
            granted, reason = None, f"{path}: {exc.strerror or exc}"
        if granted != change.after:
            short.append((change.node, change.size_kb, change.after, granted, reason))
            break
    if not short:
        return written
    restored, unrestored = [], []
    for change in reversed(written):
        path = os.path.join(pool_dir(sysfs_root, change.node, change.size_kb), "nr_hugepages")
        try:
            write(path, change.before)
            now = _read_back(sysfs_root, path)
        except OSError:
            now = None
        if now == change.before:
            restored.append((change.node, change.size_kb, change.before))
        else:
            unrestored.append((change.node, change.size_kb, change.before, now))
    size = short[0][1]
    hint = kernel_args(
        {(c.node, c.size_kb): c.desired for c in changes if c.size_kb == size and not c.boot},
        [size],
    )
    raise HugepageGrantError(
        _grant_message(short, sorted(restored), sorted(unrestored), " ".join(hint) or "the pages"),
        [entry[:4] for entry in short],
        sorted(unrestored),
    )


# --- kernel command line -----------------------------------------------------------------------


def kernel_args(desired: dict, boot_sizes) -> list:
    """['hugepagesz=1G', 'hugepages=0:4,1:4', ...] of the boot-reserved sizes, nodes with pages."""
    args = []
    for size in sorted(boot_sizes):
        counts = sorted(
            (node, count) for (node, s), count in desired.items() if s == size and count
        )
        if counts:
            args.append(f"hugepagesz={format_size(size)}")
            args.append("hugepages=" + ",".join(f"{node}:{count}" for node, count in counts))
    return args


def parse_kernel_release(text: str) -> tuple:
    """(major, minor) of a kernel release such as '6.1.0-18-amd64'; raises ValueError."""
    release = release_tuple(text.strip())
    if release is None:
        raise ValueError(f"{text.strip()!r} is not a kernel release")
    return release


def read_kernel_release(procfs_root: str) -> tuple:
    """(major, minor) from <procfs_root>/sys/kernel/osrelease, else <procfs_root>/version (as
    numa_facts reads kernel.osrelease, see osrelease.read_osrelease); raises HugepageError."""
    path = os.path.join(procfs_root, "sys", "kernel", "osrelease")
    reader = Reader("", procfs_root)
    text, dummy = read_osrelease(reader)
    release = None
    if text is not None:
        try:
            release = parse_kernel_release(text)
        except ValueError as exc:
            reader.warn(path, f"malformed: {exc}")
    if release is None:
        if not reader.warnings:
            reader.warn(path, f"missing (and so is {os.path.join(procfs_root, 'version')})")
        raise HugepageError(
            f"{_reader_problem(reader)}: the kernel release is needed to reserve hugepages at boot "
            "(boot_reserve_sizes_kb). Point procfs_root at the host's /proc, or at the proc/ "
            "directory of a recording made by playbooks/capture_topology.yml (it keeps "
            "sys/kernel/osrelease)"
        )
    return release


def check_kernel(release: tuple, args: list, name: str = "boot_reserve_sizes_kb") -> None:
    """None when the kernel takes per-node hugepages= (>= 5.16) or no args; raises HugepageError
    naming ``name`` (the option or variable that lists the boot-reserved sizes)."""
    if args and tuple(release) < PER_NODE_CMDLINE_KERNEL:
        raise HugepageError(
            f"{name}: the kernel is {release[0]}.{release[1]}, and per-node boot "
            f"reservations ({' '.join(args)}) need Linux 5.16 or newer. Upgrade the kernel, or "
            f"remove the size from {name} to reserve it at runtime"
        )


def _release_problem(numa_facts) -> str:
    """Why ansible_facts.numa has no kernel.osrelease: the facts' warning about the osrelease or
    version file (malformed, unreadable), else that neither file was there."""
    warnings = numa_facts.get("warnings") if isinstance(numa_facts, dict) else None
    for entry in warnings if isinstance(warnings, list) else ():
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and path.endswith(("/sys/kernel/osrelease", "/version")):
            reason = str(entry.get("reason") or "unusable")
            if reason.startswith("malformed"):
                return f"{path} is {reason}"
            return f"{path} could not be used: {reason}"
    return "neither <procfs_root>/sys/kernel/osrelease nor <procfs_root>/version was there"


def check_boot_release(pools, boot_sizes, numa_facts, name: str = "boot_reserve_sizes_kb") -> None:
    """None when ``pools`` put no pages of a ``boot_sizes`` size on the kernel command line, or
    when the kernel release of ``numa_facts`` (ansible_facts.numa: kernel.osrelease, read from
    /proc/sys/kernel/osrelease or /proc/version) takes per-node hugepages= (>= 5.16). Facts
    without the key (gathered by an older release) are left to the module. Raises HugepageError
    naming ``name`` (what the user set the sizes with): the release is null (the facts' warning
    says whether its file was malformed or missing), or older than 5.16; the same refusal
    plan_hugepages makes on the host, made before anything changes.
    """
    try:
        desired = parse_pools(pools)
        sizes = parse_sizes(list(boot_sizes), "boot_reserve_sizes_kb")
    except (HugepageError, TypeError):  # refused by the checks of those options themselves
        return
    args = kernel_args(desired, sizes)
    kernel = numa_facts.get("kernel") if isinstance(numa_facts, dict) else None
    if not args or not isinstance(kernel, dict) or "osrelease" not in kernel:
        return
    given = kernel["osrelease"]
    release = release_tuple(given if isinstance(given, str) else None)
    if release is None:
        shown = "null" if given is None else repr(given)
        raise HugepageError(
            f"{name}: the kernel release is unknown (ansible_facts.numa.kernel."
            f"osrelease is {shown}: {_release_problem(numa_facts)}), and per-node boot "
            f"reservations ({' '.join(args)}) need Linux 5.16 or newer. Gather the facts from the "
            "host's /proc or a recording made by playbooks/capture_topology.yml, or remove the "
            f"size from {name} to reserve it at runtime"
        )
    check_kernel(release, args, name)


def check_render_bootloader(
    pools,
    boot_sizes,
    choice,
    root: str,
    name: str = "bootloader",
    sizes_name: str = "boot_reserve_sizes_kb",
    extra_args=(),
) -> None:
    """None unless ``pools`` put pages of a ``boot_sizes`` size on the kernel command line,
    ``choice`` is ``auto`` and ``root`` is a render root (not ``/``) below which
    resolve_bootloader finds neither grubby nor GRUB. Raises HugepageError naming ``name`` and
    ``sizes_name`` (the options or variables the user set): a recording (playbooks/capture_topology.yml) keeps no bootloader files, so
    render mode needs the bootloader said, and the module would refuse it only after the gate.
    Reads only whether GRUBBY_PATHS / GRUB_MARKERS exist below ``root`` (on the controller).
    ``extra_args``: the other kernel arguments written with the pages' (kernel CPU isolation).
    """
    try:
        args = kernel_args(parse_pools(pools), parse_sizes(list(boot_sizes), "boot"))
    except (HugepageError, TypeError):  # refused by the checks of those options themselves
        args = []
    args = args + [arg for arg in extra_args if isinstance(arg, str)]
    if not args or choice != "auto" or not isinstance(root, str) or root.rstrip("/") == "":
        return
    try:
        resolve_bootloader(choice, root)
    except HugepageError:
        raise HugepageError(
            f"{name}: auto found neither grubby ({', '.join(GRUBBY_PATHS)}) nor GRUB "
            f"({', '.join(GRUB_MARKERS)}) below the render root {root!r} (a recording from "
            "playbooks/capture_topology.yml keeps none), and the plan puts "
            f"{' '.join(args)} on the kernel command line. Set {name} to grub_d (Debian, "
            "Ubuntu: /etc/default/grub.d/ and update-grub), grubby (RHEL) or none (only report "
            f"the arguments), or remove the size from {sizes_name} to reserve the pages "
            f"at runtime{' (and turn the kernel CPU isolation off)' if extra_args else ''}"
        ) from None


def resolve_bootloader(choice: str, root: str) -> str:
    """grub_d, grubby or none; ``auto`` looks for grubby, then GRUB, below ``root``.

    Raises HugepageError when ``auto`` finds neither or ``choice`` is unknown.
    """
    if choice in BOOTLOADERS:
        return choice
    if choice != "auto":
        raise HugepageError(f"bootloader: {choice!r} is not one of auto, {', '.join(BOOTLOADERS)}")
    if any(os.path.exists(under_root(root, path)) for path in GRUBBY_PATHS):
        return "grubby"
    if any(os.path.exists(under_root(root, path)) for path in GRUB_MARKERS):
        return "grub_d"
    raise HugepageError(
        f"bootloader: auto found neither grubby ({', '.join(GRUBBY_PATHS)}) nor GRUB "
        f"({', '.join(GRUB_MARKERS)}) below root {root!r}; set bootloader to grub_d (Debian, "
        "Ubuntu), grubby (RHEL) or none (edit the kernel command line yourself: see kernel_args)"
    )


# --- persistence files -------------------------------------------------------------------------

# The boot program: stdlib only, Python >= 3.6 (RHEL 8's /usr/bin/python3). It is shipped as text
# and run by numafleet-hugepages.service; tests run it against scratch trees (--sysfs-root).
BOOT_PROGRAM = r'''#!/usr/bin/python3
# Managed by numafleet.tuning (numafleet.tuning.numa_hugepages): do not edit.
"""Apply the per-node hugepage pools of the numafleet state file, read each back.

Run at boot by numafleet-hugepages.service. Pools that shrink are written first. Exits 0 when
every pool was granted, 1 when one came up short or could not be written (the pools granted are
kept: reserve the pages on the kernel command line instead), 2 when the state file is unusable.
"""
import argparse
import json
import os
import sys


def log(level, text):
    # <N> is the syslog priority journald reads from the line's start.
    sys.stdout.write("<%d>numafleet-hugepages: %s\n" % (level, text))
    sys.stdout.flush()


def load(path):
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ValueError("not a version 1 numafleet hugepages state")
    pools = data.get("pools")
    if not isinstance(pools, list):
        raise ValueError("no list of pools")
    out = []
    for entry in pools:
        if not isinstance(entry, dict):
            raise ValueError("pool entry %r is not a mapping" % (entry,))
        values = [entry.get(key) for key in ("node", "size_kb", "count")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError("pool entry %r is not a node, size_kb and count" % (entry,))
        out.append(tuple(values))
    return out


def read_int(path):
    with open(path, encoding="ascii") as handle:
        return int(handle.read().replace("\0", "").strip())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="/etc/numafleet/hugepages.json")
    parser.add_argument("--sysfs-root", default="/sys")
    args = parser.parse_args(argv)
    try:
        pools = load(args.config)
    except (OSError, ValueError) as exc:
        log(3, "%s: %s; no pool changed" % (args.config, exc))
        return 2
    base = os.path.join(args.sysfs_root, "devices", "system", "node")
    todo = []
    failed = False
    for node, size_kb, count in pools:
        pool = "hugepages-%dkB" % size_kb
        path = os.path.join(base, "node%d" % node, "hugepages", pool, "nr_hugepages")
        try:
            before = read_int(path)
        except (OSError, ValueError) as exc:
            log(3, "node %d, %d kB pages: cannot read %s (%s)" % (node, size_kb, path, exc))
            failed = True
            continue
        todo.append((count > before, node, size_kb, count, before, path))
    for grows, node, size_kb, count, before, path in sorted(todo):
        try:
            if count != before:
                with open(path, "w", encoding="ascii") as handle:
                    handle.write("%d\n" % count)
            granted = read_int(path)
        except (OSError, ValueError) as exc:
            log(3, "node %d, %d kB pages: cannot write %s (%s)" % (node, size_kb, path, exc))
            failed = True
            continue
        if granted < count:
            log(3, "node %d, %d kB pages: requested %d, granted %d; short grant: reserve "
                "them on the kernel command line instead" % (node, size_kb, count, granted))
            failed = True
        else:
            log(6, "node %d, %d kB pages: %d -> %d" % (node, size_kb, before, granted))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def render_unit() -> str:
    """The text of numafleet-hugepages.service (oneshot, early at boot)."""
    return "\n".join(
        [
            HEADER,
            "[Unit]",
            "Description=numafleet per-node hugepage pools",
            "DefaultDependencies=no",
            "After=local-fs.target",
            "Before=sysinit.target shutdown.target",
            "Conflicts=shutdown.target",
            f"ConditionPathExists={STATE_PATH}",
            "",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            f"ExecStart={PYTHON} {PROGRAM_PATH} --config {STATE_PATH}",
            "",
            "[Install]",
            "WantedBy=sysinit.target",
            "",
        ]
    )


def render_grub(args: list, extra: bool = False) -> str:
    """The /etc/default/grub.d drop-in that appends ``args`` to GRUB_CMDLINE_LINUX; ``extra``:
    the args hold more than hugepages (kernel CPU isolation), said in the comment."""
    what = (
        "numafleet's kernel command line (hugepages, CPU isolation)"
        if extra
        else "Per-node hugepages reserved at boot"
    )
    return (
        f"{HEADER}\n"
        f"# {what}: update-grub applies it, the next boot uses it.\n"
        f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {" ".join(args)}"\n'
    )


def _fail_read(path: str, reason: str) -> HugepageError:
    if "symbolic link" in reason:
        return HugepageError(f"{path}: {reason}")
    if "regular file" in reason:
        return HugepageError(
            f"{path}: is not a regular file. Move it away; numafleet writes a file here"
        )
    return HugepageError(f"{path}: {reason}. Check its permissions")


def _read_file(root: str, path: str, link_as_absent: bool = True) -> tuple:
    """(text or None when absent, permission bits or None) of ``path`` below ``root``.

    Nothing is read through a link (files.read_file): a link at a managed file reads as absent
    and is replaced by the write; a linked parent directory is refused.
    """
    data = files.read_file(root, path, _fail_read, link_as_absent)
    if data is None:
        return None, None
    info = files.lstat_file(root, path, _fail_read)
    return data.decode("utf-8", errors="replace"), stat.S_IMODE(info.st_mode) if info else None


def read_state(root: str) -> tuple:
    """(State, text) of the state file under root, (None, None) if absent; raises HugepageError."""
    text, dummy = _read_file(root, STATE_PATH, link_as_absent=False)
    if text is None:
        return None, None
    return parse_state(text, under_root(root, STATE_PATH)), text


def _file_change(root: str, path: str, after: Optional[str], mode: int) -> Optional[FileChange]:
    before, before_mode = _read_file(root, path)
    if after is None:
        return FileChange(path, "remove", before, None) if before is not None else None
    if before is None:
        return FileChange(path, "create", None, after)
    same = before == after and before_mode == mode
    return FileChange(path, "unchanged" if same else "update", before, after)


def file_mode(path: str) -> int:
    """Mode a managed file is written with."""
    return PROGRAM_MODE if path == PROGRAM_PATH else FILE_MODE


def _fail_write(path: str, reason: str) -> HugepageError:
    return HugepageError(
        f"{path}: {reason}. Check that the directory is writable, or set root to one that is"
    )


def write_files(root: str, changes: list) -> None:
    """Apply file changes below ``root``: atomic writes with their modes, removals.

    Nothing is written or removed through a link, and directories made get mode 0755 whatever
    the umask (files.py). Raises HugepageError.
    """
    for change in changes:
        if change.state in ("create", "update"):
            files.write_file(
                root, change.path, change.after or "", file_mode(change.path), _fail_write, DIR_MODE
            )
        elif change.state == "remove":
            files.remove_file(root, change.path, _fail_write)


# --- the whole change --------------------------------------------------------------------------


@dataclass(frozen=True)
class HugepagePlan:
    """Everything one run changes; ``as_result`` is the module's result."""

    sysfs_root: str
    root: str
    pools: tuple
    warnings: tuple
    files: tuple
    kernel_args: tuple
    kernel_args_removed: tuple
    cmdline_changed: bool
    bootloader: str
    service_manager: str
    mounts: tuple = ()  # Mount, sorted by path
    mount_units: tuple = ()  # (unit name, create|update|remove|unchanged), sorted by name
    # Arguments of kernel_args not on the running command line (<procfs_root>/cmdline); None
    # when that file is absent (a recording): the reboot is then owed only in the run that
    # changes the command line.
    args_missing: Optional[tuple] = None
    # With kernel isolation arguments: the running kernel's isolation, for verify (cmdline.py
    # read_running_isolation); None without them.
    cpu_isolation: Optional[dict] = None

    @property
    def reboot_pending(self) -> bool:
        """Whether the written arguments are not all on the running kernel's command line."""
        return bool(self.args_missing)

    @property
    def reboot_required(self) -> bool:
        """This run changes the command line, or an earlier run's change awaits a reboot."""
        return self.cmdline_changed or self.reboot_pending

    def _mount_units(self, state: str) -> list:
        return [unit for unit, how in self.mount_units if how == state]

    @property
    def mount_start(self) -> list:
        """Mount units created in this run: to enable and start."""
        return self._mount_units("create")

    @property
    def mount_restart(self) -> list:
        """Mount units changed in this run: to remount (restart)."""
        return self._mount_units("update")

    @property
    def mount_stop(self) -> list:
        """Mount units removed in this run: to disable and stop (before systemd reloads)."""
        return self._mount_units("remove")

    @property
    def reload_needed(self) -> bool:
        """Whether the unit file is created or changed (systemd must reload and enable it)."""
        return any(c.path == UNIT_PATH and c.state in ("create", "update") for c in self.files)

    @property
    def changed(self) -> bool:
        """Whether a runtime pool or a file changes."""
        return any(p.changes_now for p in self.pools) or any(
            c.state != "unchanged" for c in self.files
        )

    def would_run(self) -> list:
        """The commands the caller's handlers run after this change, in order."""
        lines = [f"systemctl disable --now {unit}" for unit in self.mount_stop]
        mounts_changed = any(how != "unchanged" for dummy, how in self.mount_units)
        if self.reload_needed or mounts_changed:
            lines.append("systemctl daemon-reload")
        if self.reload_needed:
            lines.append(f"systemctl enable {UNIT_NAME}")
        lines.extend(f"systemctl restart {unit}" for unit in self.mount_restart)
        lines.extend(f"systemctl enable --now {unit}" for unit in self.mount_start)
        if self.cmdline_changed:
            if self.bootloader == "grub_d":
                lines.append("update-grub")
            elif self.bootloader == "grubby":
                lines.extend(" ".join(argv) for argv in self.grubby_argvs())
        return lines

    def grubby_argvs(self) -> list:
        """argv lists for grubby: remove the arguments of the last run, add the new ones."""
        if not self.cmdline_changed or self.bootloader != "grubby":
            return []
        argvs = []
        if self.kernel_args_removed:
            argvs.append(
                [
                    "grubby",
                    "--update-kernel=ALL",
                    "--remove-args=" + " ".join(self.kernel_args_removed),
                ]
            )
        if self.kernel_args:
            argvs.append(["grubby", "--update-kernel=ALL", "--args=" + " ".join(self.kernel_args)])
        return argvs

    def diff(self) -> list:
        """Ansible's diff list: per-node totals that change, then every changed file."""
        before, after = [], []
        for pool in self.pools:
            if pool.changes_now or (
                pool.boot and self.cmdline_changed and pool.before != pool.after
            ):
                label = f"node{pool.node} {pool.size_kb}kB"
                before.append(f"{label}: {pool.before}\n")
                after.append(f"{label}: {pool.after}{' (at next boot)' if pool.boot else ''}\n")
        out = []
        if before:
            out.append(
                {
                    "before_header": "hugepage pools (pages per node)",
                    "after_header": "hugepage pools (pages per node)",
                    "before": "".join(before),
                    "after": "".join(after),
                }
            )
        for change in self.files:
            if change.state != "unchanged":
                out.append(change_diff(change))
        return out

    def drift(self) -> list:
        """Every managed pool whose total differs from the plan, before this run's writes.

        [{"setting": "node<N> <size>kB pages", "planned", "actual", "reason", "pending"}]
        (pages; actual
        is ``nr_hugepages`` as read). ``reason`` says why a run does not simply fix it: pages in
        use hold the pool above the plan, or the size is reserved at boot (next reboot); empty
        when this run writes the planned total.
        """
        out = []
        for pool in self.pools:
            if pool.before == pool.desired:
                continue
            pending = pool.boot and not self.cmdline_changed and self.reboot_pending
            if pending:
                reason = (
                    "reboot pending: the kernel command line written has it, the running kernel "
                    "was booted without it (/proc/cmdline); the pool takes the planned total at "
                    "the next reboot"
                )
            elif pool.boot:
                reason = (
                    "reserved at boot: the kernel command line "
                    f"{'is updated by this run' if self.cmdline_changed else 'has it'}; the pool "
                    "takes the planned total at the next reboot"
                )
            elif pool.after != pool.desired:
                reason = (
                    f"{pool.in_use} pages in use (nr_hugepages - free_hugepages): a shrink "
                    f"stops at {pool.after}; {_STOP_THEN_RUN}"
                )
            else:
                reason = ""
            out.append(
                {
                    "setting": f"node{pool.node} {pool.size_kb}kB pages",
                    "planned": pool.desired,
                    "actual": pool.before,
                    "reason": reason,
                    "pending": pending,
                }
            )
        return out

    def _drift_diff(self) -> list:
        """A diff entry for the pools that differ from the plan and that no write fixes now."""
        held = [
            pool
            for pool in self.pools
            if pool.before != pool.desired
            and not pool.changes_now
            and not (pool.boot and self.cmdline_changed)
        ]
        if not held:
            return []
        header = "hugepage pools not as planned (pages per node)"
        return [
            {
                "before_header": header,
                "after_header": header,
                "before": "".join(f"node{p.node} {p.size_kb}kB: {p.before}\n" for p in held),
                "after": "".join(f"node{p.node} {p.size_kb}kB: {p.desired}\n" for p in held),
            }
        ]

    def as_result(self, check_mode: bool, diff: bool) -> dict:
        """The module's result (``diff`` only when asked for)."""
        handlers = not check_mode and self.service_manager == "systemd"
        states = dict(self.mount_units)
        result = dict(
            changed=self.changed,
            pools=[pool.as_dict() for pool in self.pools],
            warnings=list(self.warnings),
            files=[{"path": c.path, "state": c.state} for c in self.files],
            reload_needed=self.reload_needed,
            reboot_required=self.reboot_required,
            kernel_args=list(self.kernel_args),
            kernel_args_removed=list(self.kernel_args_removed) if self.cmdline_changed else [],
            bootloader=self.bootloader,
            would_run=self.would_run(),
            grubby_argvs=self.grubby_argvs(),
            handler_enable=self.reload_needed
            and not check_mode
            and self.service_manager == "systemd",
            mounts=[
                {
                    "path": mount.path,
                    "unit": mount.unit,
                    "size_kb": mount.size_kb,
                    "mode": mount.mode,
                    "group": mount.group,
                    "state": states.get(mount.unit, "unchanged"),
                }
                for mount in self.mounts
            ],
            handler_mount_start=self.mount_start if handlers else [],
            handler_mount_restart=self.mount_restart if handlers else [],
            handler_mount_stop=self.mount_stop if handlers else [],
            drift=self.drift(),
            cmdline_changed=self.cmdline_changed,
            reboot_pending=self.reboot_pending,
            kernel_args_missing=list(self.args_missing or ()),
        )
        if self.cpu_isolation is not None:
            result["cpu_isolation"] = dict(self.cpu_isolation)
        if diff:
            result["diff"] = self.diff() + self._drift_diff()
        return result


def change_diff(change: FileChange) -> dict:
    """One entry of Ansible's diff list for a file change."""
    return {
        "before_header": change.path,
        "after_header": change.path,
        "before": change.before or "",
        "after": change.after or "",
    }


def _check_root(root: str) -> str:
    if not isinstance(root, str) or not root.startswith("/"):
        raise HugepageError(f"root: {root!r} is not an absolute path; use / or a render directory")
    return root


def plan_hugepages(
    pools,
    sysfs_root: str = "/sys",
    procfs_root: str = "/proc",
    root: str = "/",
    service_manager: str = "systemd",
    boot_reserve_sizes_kb=(),
    bootloader: str = "auto",
    mounts=(),
    extra_kernel_args=(),
) -> HugepagePlan:
    """The whole change of one run, computed before anything is written; raises HugepageError.

    ``extra_kernel_args``: more kernel arguments (kernel CPU isolation, cmdline.py) written with
    the boot-reserved pages' ones, after them, through the same bootloader file or call."""
    desired = parse_pools(pools)
    try:
        extra = cmdline.check_args(extra_kernel_args)
    except cmdline.CmdlineError as exc:
        raise HugepageError(str(exc)) from None
    boot_sizes = parse_sizes(list(boot_reserve_sizes_kb), "boot_reserve_sizes_kb")
    if service_manager not in ("systemd", "none"):
        raise HugepageError(f"service_manager: {service_manager!r} is not systemd or none")
    root = _check_root(root)
    state, dummy = read_state(root)
    previous = state or State()
    wanted_sizes = {size for (dummy_node, size) in desired}
    managed = sorted(wanted_sizes | set(previous.managed_sizes_kb))
    nodes, current, offered = read_pools(sysfs_root, procfs_root, managed)
    changes, warnings = plan_pools(nodes, current, desired, managed, boot_sizes, offered)
    wanted_mounts = parse_mounts(list(mounts), offered_sizes(offered))

    args = kernel_args({(c.node, c.size_kb): c.desired for c in changes if c.boot}, boot_sizes)
    if args:
        check_kernel(read_kernel_release(procfs_root), args)
    page_args, args = args, args + extra
    if args:
        loader = resolve_bootloader(bootloader, root)
    elif previous.kernel_args:  # the arguments of the last run are to be removed
        loader = (
            previous.bootloader if bootloader == "auto" else resolve_bootloader(bootloader, root)
        )
    else:
        loader = bootloader if bootloader in BOOTLOADERS else "none"
    if loader == "grubby" and len([a for a in page_args if a.startswith("hugepagesz=")]) > 1:
        raise HugepageError(
            "boot_reserve_sizes_kb: grubby keeps one value per kernel argument name, so only one "
            f"page size can be reserved at boot through it ({' '.join(args)}); reserve one size "
            "at boot and the others at runtime, or use bootloader grub_d or none"
        )

    # Sizes stay managed while wanted, or while a pool is still above 0 (kept for pages in use).
    still = {c.size_kb for c in changes if c.after > 0}
    next_managed = tuple(sorted(wanted_sizes | (set(previous.managed_sizes_kb) & still)))
    runtime_pools = tuple(
        (c.node, c.size_kb, c.desired) for c in changes if not c.boot and c.size_kb in next_managed
    )
    boot_pools = tuple((c.node, c.size_kb, c.desired) for c in changes if c.boot and c.desired)
    new_state = State(
        managed_sizes_kb=next_managed,
        pools=runtime_pools,
        boot_reserved_sizes_kb=tuple(s for s in boot_sizes if s in next_managed),
        boot_pools=boot_pools,
        kernel_args=tuple(args),
        bootloader=loader if args else "none",
        mounts=tuple(sorted(mount.unit for mount in wanted_mounts)),
    )

    files: list = []
    mount_units = _mount_changes(root, wanted_mounts, previous.mounts, warnings)
    files.extend(change for dummy, change in mount_units)
    persist = state is not None or bool(next_managed) or bool(args) or bool(wanted_mounts)
    if persist:
        for path, text in (
            (STATE_PATH, render_state(new_state)),
            (PROGRAM_PATH, BOOT_PROGRAM),
            (UNIT_PATH, render_unit()),
        ):
            change = _file_change(root, path, text, file_mode(path))
            files.append(change)
    grub_text = render_grub(args, bool(extra)) if args and loader == "grub_d" else None
    grub_change = _file_change(root, GRUB_PATH, grub_text, FILE_MODE)
    if grub_change is not None:
        files.append(grub_change)
    cmdline_changed = tuple(args) != previous.kernel_args or (
        grub_change is not None and grub_change.state != "unchanged"
    )
    return HugepagePlan(
        sysfs_root=sysfs_root,
        root=root,
        pools=tuple(changes),
        warnings=tuple(warnings),
        files=tuple(sorted(files, key=lambda c: c.path)),
        kernel_args=tuple(args),
        kernel_args_removed=tuple(previous.kernel_args),
        cmdline_changed=cmdline_changed,
        bootloader=loader,
        service_manager=service_manager,
        mounts=wanted_mounts,
        mount_units=tuple(sorted((unit, change.state) for unit, change in mount_units)),
        args_missing=_args_missing(procfs_root, args),
        cpu_isolation=cmdline.read_running_isolation(sysfs_root, procfs_root) if extra else None,
    )


def _args_missing(procfs_root: str, args: list) -> Optional[tuple]:
    """The ``args`` not on <procfs_root>/cmdline, or None when that file is absent/unreadable."""
    if not args:
        return ()
    try:
        with open(os.path.join(procfs_root, "cmdline"), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    missing = cmdline.missing_args(args, text.replace("\x00", " "))
    return None if missing is None else tuple(missing)


def _mount_changes(root: str, wanted: tuple, previous: tuple, warnings: list) -> list:
    """[(unit, FileChange)]: the wanted mount units, and the earlier run's ones no longer wanted.

    A unit file that is there, was not written by an earlier run and lacks the numafleet header
    is somebody else's: raises HugepageError rather than overwrite it. A unit the state file
    lists as ours that lacks the header is kept (not stopped, not removed) with a warning
    appended to ``warnings``: the state file may have been edited.
    """
    out = []
    for mount in wanted:
        change = _file_change(root, mount.unit_path, render_mount(mount), FILE_MODE)
        if (
            change.before is not None
            and mount.unit not in previous
            and not change.before.startswith(HEADER)
        ):
            raise HugepageError(
                f"{under_root(root, mount.unit_path)}: a mount unit for {mount.path} is there and "
                "was not written by numafleet.tuning; remove it (or choose another mounts path) "
                "and run again"
            )
        out.append((mount.unit, change))
    wanted_units = {mount.unit for mount in wanted}
    for unit in previous:
        if unit not in wanted_units:
            change = _file_change(root, f"{MOUNT_UNIT_DIR}/{unit}", None, FILE_MODE)
            if change is not None and not (change.before or "").startswith(HEADER):
                warnings.append(
                    f"{under_root(root, change.path)}: listed in {STATE_PATH} as a mount unit "
                    "numafleet wrote, but it lacks the numafleet header; it is kept (not stopped, "
                    "not removed). Remove it by hand if it is no longer wanted"
                )
            elif change is not None:
                out.append((unit, change))
    return out


def apply_hugepages(
    plan: HugepagePlan, writer: Optional[Callable[[str, int], None]] = None
) -> None:
    """Write the runtime pools (read back, all-or-nothing), then the files; raises HugepageError."""
    write_pools(plan.sysfs_root, list(plan.pools), writer)
    write_files(plan.root, list(plan.files))
