# Private to this collection: may change in any release.
"""Files below a root, never through a link: writes, reads, removals and the per-host lock.

Every module that writes on a host goes through here. The root (``/`` or a render directory)
is the user's choice and is resolved once; below it, each path is walked one component at a
time with ``O_NOFOLLOW | O_DIRECTORY`` from the directory above (``openat``), so a component
that is a symbolic link is refused with its path, whatever it points at. Missing directories
are made with ``mkdir(dir_fd=)`` and get their mode with ``fchmod``; files are written to a
temporary file in the same directory, fsynced, given their mode with ``fchmod`` and renamed
over the target with both directory descriptors (``renameat``); the directory is fsynced too.
Modes never depend on the umask. A link at the target itself is replaced by the new file,
never followed.

The lock (``host_lock``) is ``/run/numafleet/apply.lock`` below the root, taken with ``flock``;
the holder writes its PID into it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, Optional

from .errors import NumaTuneError

DIR_MODE = 0o755
LOCK_PATH = "/run/numafleet/apply.lock"
LOCK_MODE = 0o644
# How long a second run on one host waits for the first one's lock: a full apply of a large
# host (MIG reconfiguration, hugepage compaction, service restarts) takes well under this.
LOCK_TIMEOUT_S = 120.0
_LOCK_POLL_S = 0.2
_LINK_REASON = (
    "is a symbolic link; numafleet never writes, reads or removes through a link: replace the "
    "link with a real directory (or file), or point root at a tree without links"
)

Fail = Callable[[str, str], NumaTuneError]


class LockError(NumaTuneError):
    """The per-host lock is held by another run, or cannot be taken."""


def _real(root: str, parts: list) -> str:
    """The path of ``parts`` below ``root``, for messages (as the user gave the root)."""
    return os.path.join(root, *parts) if parts else root


def _parts(path: str, fail: Fail, root: str) -> list:
    """Components of the host path ``path`` ("/" for the root itself); '..' is refused."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise fail(_real(root, parts), "has a '..' component; give the path without it")
    return parts


def _open_root(root: str, fail: Fail, create: bool, dir_mode: int) -> Optional[int]:
    """The root, resolved once (it is the user's choice); made with ``dir_mode`` when missing."""
    real = os.path.realpath(root)
    try:
        if create and not os.path.exists(real):
            os.makedirs(real, mode=dir_mode)
            os.chmod(real, dir_mode)
        return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        raise fail(root, "cannot be made") from None
    except OSError as exc:
        raise fail(root, exc.strerror or "cannot be opened") from None


def _refusal(dir_fd: int, name: str, exc: OSError) -> str:
    """Why ``name`` in ``dir_fd`` cannot be opened as a directory: a link, a file, or errno."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return exc.strerror or "cannot be opened"
    if stat.S_ISLNK(info.st_mode):
        return _LINK_REASON
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    return exc.strerror or "cannot be opened"


def open_dir(
    root: str, path: str, fail: Fail, create: bool = False, dir_mode: int = DIR_MODE
) -> Optional[int]:
    """A descriptor of the directory ``path`` below ``root``, walked without following links.

    None when a component is missing and ``create`` is false; with ``create`` missing
    directories are made with exactly ``dir_mode`` (existing ones keep theirs). The caller
    closes the descriptor. Raises ``fail(path, reason)`` naming the link, file or error.
    """
    parts = _parts(path, fail, root)
    fd = _open_root(root, fail, create, dir_mode)
    if fd is None:
        return None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        for index, name in enumerate(parts):
            made = False
            try:
                child = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise fail(
                        _real(root, parts[: index + 1]), exc.strerror or "cannot be made"
                    ) from None
                try:
                    child = os.open(name, flags, dir_fd=fd)
                except OSError as exc:
                    raise fail(_real(root, parts[: index + 1]), _refusal(fd, name, exc)) from None
            except OSError as exc:
                raise fail(_real(root, parts[: index + 1]), _refusal(fd, name, exc)) from None
            os.close(fd)
            fd = child
            if made:
                os.fchmod(fd, dir_mode)  # the umask never decides a directory's mode
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(
    root: str, path: str, text: str, mode: int, fail: Fail, dir_mode: int = DIR_MODE
) -> None:
    """Write ``text`` to the host path ``path`` below ``root`` atomically with ``mode``.

    Parents are walked and made as ``open_dir`` does (links refused); the text goes to a
    temporary file in the same directory, is fsynced, gets ``mode`` and replaces the target in
    one rename, so a reader sees the old or the new file, never a part. A link at the target is
    replaced, never followed. Raises ``fail(path, reason)``; no temporary file is left.
    """
    parts = _parts(path, fail, root)
    if not parts:
        raise fail(root, "is a directory, not a file")
    real = _real(root, parts)
    dir_fd = open_dir(root, "/".join(parts[:-1]), fail, create=True, dir_mode=dir_mode)
    name = parts[-1]
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        try:
            handle = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
        except OSError as exc:
            raise fail(os.path.dirname(real), exc.strerror or "cannot be written") from None
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(text.encode("utf-8", "surrogateescape"))
                out.flush()
                os.fsync(out.fileno())
                os.fchmod(out.fileno(), mode)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        except OSError as exc:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise fail(real, exc.strerror or "cannot be written") from None
    finally:
        os.close(dir_fd)


def write_atomic(
    real: str,
    text: str,
    mode: int,
    fail: Fail,
    dir_mode: int = DIR_MODE,
) -> None:
    """``write_file("/", real, ...)``: every component of the absolute path ``real`` is checked."""
    write_file("/", real, text, mode, fail, dir_mode)


def write_link(root: str, path: str, target: str, fail: Fail, dir_mode: int = DIR_MODE) -> None:
    """Make ``path`` below ``root`` a symbolic link to ``target`` (parents walked as in write_file).

    An existing file or link there is replaced atomically. Raises ``fail(path, reason)``.
    """
    parts = _parts(path, fail, root)
    real = _real(root, parts)
    dir_fd = open_dir(root, "/".join(parts[:-1]), fail, create=True, dir_mode=dir_mode)
    tmp = f".{parts[-1]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        os.symlink(target, tmp, dir_fd=dir_fd)
        os.replace(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise fail(real, exc.strerror or "cannot be linked") from None
    finally:
        os.close(dir_fd)


def lstat_file(root: str, path: str, fail: Fail) -> Optional[os.stat_result]:
    """``lstat`` of ``path`` below ``root`` (parents walked without links); None when absent."""
    parts = _parts(path, fail, root)
    dir_fd = open_dir(root, "/".join(parts[:-1]), fail)
    if dir_fd is None:
        return None
    try:
        return os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise fail(_real(root, parts), exc.strerror or "cannot be read") from None
    finally:
        os.close(dir_fd)


def read_file(
    root: str, path: str, fail: Fail, link_as_absent: bool = False, limit: int = 64 << 20
) -> Optional[bytes]:
    """The bytes of the regular file ``path`` below ``root``; None when it (or a parent) is absent.

    No component is followed through a link: a linked parent is refused; a link at the file
    itself is refused too, or read as absent with ``link_as_absent`` (for a file that is
    replaced by a write anyway). Anything but a regular file (a directory, a FIFO) is refused.
    Raises ``fail(path, reason)``.
    """
    parts = _parts(path, fail, root)
    if not parts:
        raise fail(root, "is a directory, not a file")
    real = _real(root, parts)
    dir_fd = open_dir(root, "/".join(parts[:-1]), fail)
    if dir_fd is None:
        return None
    try:
        try:
            handle = os.open(
                parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                if link_as_absent:
                    return None
                raise fail(real, _LINK_REASON) from None
            raise fail(real, exc.strerror or "cannot be read") from None
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            os.close(handle)
            raise fail(real, "is not a regular file; move it away, numafleet writes a file here")
        with os.fdopen(handle, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise fail(
                    real, "is not a regular file; move it away, numafleet writes a file here"
                )
            try:
                return source.read(limit)
            except OSError as exc:
                raise fail(real, exc.strerror or "cannot be read") from None
    finally:
        os.close(dir_fd)


def read_text(root: str, path: str, fail: Fail, link_as_absent: bool = False) -> Optional[str]:
    """``read_file`` decoded as UTF-8 (bad bytes replaced); None when absent."""
    data = read_file(root, path, fail, link_as_absent)
    return None if data is None else data.decode("utf-8", errors="replace")


def remove_file(root: str, path: str, fail: Fail, prune_parent: bool = False) -> None:
    """Remove ``path`` below ``root`` (a link there is removed, never followed); absent is fine.

    Parents are walked without links (a linked parent is refused). With ``prune_parent`` the
    directory holding the file is removed too when it is left empty. Raises ``fail``.
    """
    parts = _parts(path, fail, root)
    if not parts:
        raise fail(root, "is the root; it is never removed")
    dir_fd = open_dir(root, "/".join(parts[:-1]), fail)
    if dir_fd is None:
        return
    try:
        os.unlink(parts[-1], dir_fd=dir_fd)
        os.fsync(dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise fail(_real(root, parts), exc.strerror or "cannot be removed") from None
    finally:
        os.close(dir_fd)
    if prune_parent and len(parts) > 1:
        parent_fd = open_dir(root, "/".join(parts[:-2]), fail)
        if parent_fd is None:
            return
        try:
            os.rmdir(parts[-2], dir_fd=parent_fd)
        except OSError:
            pass  # not empty, or gone: the directory stays
        finally:
            os.close(parent_fd)


def _lock_fail(path: str, reason: str) -> LockError:
    return LockError(
        f"{path}: {reason}; the per-host lock of numafleet cannot be taken. Fix the path "
        "(a real directory, writable by root) and run again"
    )


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


@contextmanager
def host_lock(
    root: str,
    timeout_s: Optional[float] = None,
    poll_s: float = _LOCK_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Optional[str]]:
    """Hold the exclusive per-host lock ``/run/numafleet/apply.lock`` below ``root``; yields its path.

    A ``root`` that does not exist (a render directory not made yet) is not locked: None.

    Waits up to ``timeout_s`` seconds (None: LOCK_TIMEOUT_S, 120) for another run to release it, then raises LockError
    naming the lock file and the PID written in it by the holder. The lock goes with the
    process (``flock``): a killed run never leaves it held. The file stays (mode 0644).
    """
    real = _real(root, _parts(LOCK_PATH, _lock_fail, root))
    if not os.path.isdir(os.path.realpath(root)):
        # A render root that does not exist yet holds nothing to protect; the first write
        # makes it. ("/" always exists, so a host is always locked.)
        yield None
        return
    dir_fd = open_dir(root, os.path.dirname(LOCK_PATH), _lock_fail, create=True)
    try:
        fd = os.open(
            os.path.basename(LOCK_PATH),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
    except OSError as exc:
        reason = _LINK_REASON if exc.errno == errno.ELOOP else exc.strerror or "cannot be opened"
        raise _lock_fail(real, reason) from None
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _lock_fail(real, "is not a regular file")
        os.fchmod(fd, LOCK_MODE)
        timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = clock() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _lock_fail(real, exc.strerror or "cannot be locked") from None
            if clock() >= deadline:
                raise LockError(
                    f"{real}: another numafleet run on this host (PID {_holder(fd)}) has held "
                    f"the lock for over {timeout_s:g} s; wait for it to finish and run again "
                    "(if that process is gone, nothing holds the lock any more: run again)"
                )
            sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield real
    finally:
        os.close(fd)
