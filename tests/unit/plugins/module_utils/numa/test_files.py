"""write_atomic: the one atomic file write of the modules that write below a root."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.files import write_atomic


class Failed(NumaTuneError):
    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def test_writes_text_with_mode_and_makes_parents(tmp_path):
    target = tmp_path / "etc" / "numafleet" / "x.json"
    write_atomic(str(target), "one\n", 0o600, Failed, 0o750)
    assert target.read_text() == "one\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) & 0o777 == 0o750 & ~_umask()
    write_atomic(str(target), "two\n", 0o644, Failed)
    assert target.read_text() == "two\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(os.listdir(target.parent)) == ["x.json"]  # no temporary file left


def test_replaces_a_file_in_one_rename(tmp_path):
    """A reader holding the old file keeps the old text: the name now points at a new inode."""
    target = tmp_path / "unit.service"
    target.write_text("old\n")
    before = target.stat().st_ino
    with open(target, encoding="utf-8") as held:
        write_atomic(str(target), "new\n", 0o644, Failed)
        assert held.read() == "old\n"
    assert target.read_text() == "new\n" and target.stat().st_ino != before


def test_parent_that_is_a_file_fails_with_the_path(tmp_path):
    (tmp_path / "etc").write_text("not a directory")
    with pytest.raises(Failed) as err:
        write_atomic(str(tmp_path / "etc" / "x.conf"), "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "etc") and err.value.reason


def test_target_that_is_a_directory_fails_and_leaves_no_temporary_file(tmp_path):
    (tmp_path / "x.conf").mkdir()
    with pytest.raises(Failed) as err:
        write_atomic(str(tmp_path / "x.conf"), "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "x.conf")
    assert sorted(os.listdir(tmp_path)) == ["x.conf"]


def test_a_linked_parent_directory_is_refused_and_its_target_untouched(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "50-numafleet.conf").write_text("theirs\n")
    (tmp_path / "x.service.d").symlink_to(outside)
    with pytest.raises(Failed) as err:
        write_atomic(str(tmp_path / "x.service.d" / "50-numafleet.conf"), "ours\n", 0o644, Failed)
    assert err.value.path == str(tmp_path / "x.service.d")
    assert "symbolic link" in err.value.reason
    assert (outside / "50-numafleet.conf").read_text() == "theirs\n"
    assert sorted(os.listdir(outside)) == ["50-numafleet.conf"]


def test_a_link_at_the_file_itself_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("theirs\n")
    (tmp_path / "plan.json").symlink_to(outside)
    write_atomic(str(tmp_path / "plan.json"), "ours\n", 0o644, Failed)
    assert not (tmp_path / "plan.json").is_symlink()
    assert (tmp_path / "plan.json").read_text() == "ours\n" and outside.read_text() == "theirs\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- issue 19: never through a link, modes independent of the umask, the per-host lock -----------

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import files  # noqa: E402

LEVELS = ["etc", "etc/numafleet"]


@pytest.mark.parametrize("level", LEVELS)
def test_a_linked_parent_at_any_level_below_the_root_is_refused(tmp_path, level):
    """<root>/etc or <root>/etc/numafleet linked elsewhere: nothing lands there (failed before:
    only the immediate parent was checked)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (root / level).parent.mkdir(parents=True, exist_ok=True)
    (root / level).symlink_to(outside)
    if level == "etc":
        (outside / "numafleet").mkdir()
    with pytest.raises(Failed) as err:
        files.write_file(str(root), "/etc/numafleet/x.json", "ours\n", 0o644, Failed)
    assert err.value.path == str(root / level) and "symbolic link" in err.value.reason
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == (
        ["numafleet"] if level == "etc" else []
    )
    with pytest.raises(Failed, match="symbolic link"):
        files.read_file(str(root), "/etc/numafleet/x.json", Failed)
    with pytest.raises(Failed, match="symbolic link"):
        files.remove_file(str(root), "/etc/numafleet/x.json", Failed)


def test_the_root_itself_may_be_a_link(tmp_path):
    """The root is the user's choice and is resolved once."""
    (tmp_path / "real").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "real")
    files.write_file(str(tmp_path / "root"), "/etc/x.conf", "x\n", 0o644, Failed)
    assert (tmp_path / "real/etc/x.conf").read_text() == "x\n"


def test_a_linked_file_is_refused_on_read_or_read_as_absent(tmp_path):
    (tmp_path / "theirs").write_text("theirs\n")
    (tmp_path / "x.json").symlink_to(tmp_path / "theirs")
    with pytest.raises(Failed) as err:
        files.read_file(str(tmp_path), "/x.json", Failed)
    assert "never writes, reads or removes through a link: replace the link" in err.value.reason
    assert files.read_file(str(tmp_path), "/x.json", Failed, link_as_absent=True) is None
    files.remove_file(str(tmp_path), "/x.json", Failed)  # the link goes, never its target
    assert (
        not (tmp_path / "x.json").is_symlink() and (tmp_path / "theirs").read_text() == "theirs\n"
    )


def test_remove_prunes_an_empty_parent_only(tmp_path):
    (tmp_path / "a.service.d").mkdir()
    (tmp_path / "a.service.d/50-numafleet.conf").write_text("x")
    (tmp_path / "a.service.d/10-user.conf").write_text("y")
    files.remove_file(str(tmp_path), "/a.service.d/50-numafleet.conf", Failed, prune_parent=True)
    assert sorted(os.listdir(tmp_path / "a.service.d")) == ["10-user.conf"]
    files.remove_file(str(tmp_path), "/a.service.d/10-user.conf", Failed, prune_parent=True)
    assert not (tmp_path / "a.service.d").exists()


@pytest.mark.parametrize("mask", [0o000, 0o077, 0o022])
def test_modes_do_not_depend_on_the_umask(tmp_path, mask):
    """With umask 000 the directories made were 0777 (failed before); with 077 they were 0700."""
    old = os.umask(mask)
    try:
        files.write_file(str(tmp_path), "/etc/numafleet/deep/x.json", "x\n", 0o644, Failed, 0o755)
        files.write_file(str(tmp_path), "/usr/local/libexec/prog", "#!\n", 0o755, Failed, 0o755)
    finally:
        os.umask(old)
    for rel in ("etc", "etc/numafleet", "etc/numafleet/deep", "usr/local/libexec"):
        assert stat.S_IMODE((tmp_path / rel).stat().st_mode) == 0o755, rel
    assert stat.S_IMODE((tmp_path / "etc/numafleet/deep/x.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "usr/local/libexec/prog").stat().st_mode) == 0o755


def test_existing_directories_keep_their_mode(tmp_path):
    (tmp_path / "etc").mkdir(mode=0o750)
    os.chmod(tmp_path / "etc", 0o750)
    files.write_file(str(tmp_path), "/etc/x.conf", "x", 0o644, Failed)
    assert stat.S_IMODE((tmp_path / "etc").stat().st_mode) == 0o750


def test_dotdot_is_refused(tmp_path):
    with pytest.raises(Failed, match=r"'\.\.'"):
        files.write_file(str(tmp_path / "r"), "/etc/../../x", "x", 0o644, Failed)
    assert not (tmp_path / "x").exists()


_HOLD = """
import sys, time
sys.path[:0] = {path!r}
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import files
with files.host_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(root, seconds):
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD.format(path=sys.path), str(root), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_waits_for_the_lock_then_fails_naming_the_holder(tmp_path):
    """Two processes: the second waits its timeout and fails with the lock path and the PID."""
    holder = _holder(tmp_path, 30)
    try:
        lock = tmp_path / "run/numafleet/apply.lock"
        assert lock.read_text().strip() == str(holder.pid)
        assert stat.S_IMODE(lock.stat().st_mode) == 0o644
        with pytest.raises(files.LockError) as err:
            with files.host_lock(str(tmp_path), timeout_s=0.5, poll_s=0.05):
                raise AssertionError("the lock was taken twice")
        assert str(lock) in str(err.value) and f"PID {holder.pid}" in str(err.value)
        assert "0.5 s" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: flock went with it, and the lock is free at once
    with files.host_lock(str(tmp_path), timeout_s=0) as path:
        assert path == str(tmp_path / "run/numafleet/apply.lock")
        assert (tmp_path / "run/numafleet/apply.lock").read_text() == f"{os.getpid()}\n"


def test_a_second_run_gets_the_lock_when_the_first_finishes(tmp_path):
    holder = _holder(tmp_path, 0.5)
    try:
        with files.host_lock(str(tmp_path), timeout_s=20, poll_s=0.05):
            assert holder.poll() is not None or holder.wait(timeout=5) == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_linked_lock_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(files.LockError, match="symbolic link"):
        with files.host_lock(str(tmp_path)):
            pass
    assert os.listdir(tmp_path / "elsewhere") == []


# --- behaviours the mutation run found unguarded (issue 19, section 5) ---------------------------


def test_dot_components_are_dropped_from_the_path_and_its_messages(tmp_path):
    (tmp_path / "etc").write_text("a file")
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path), "/./etc/./x.conf", "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "etc")
    files.write_file(str(tmp_path), "./usr/./x.conf", "x", 0o644, Failed)
    assert (tmp_path / "usr/x.conf").read_text() == "x"


def test_the_root_itself_is_never_a_file_to_write_read_or_remove(tmp_path):
    for call in (
        lambda: files.write_file(str(tmp_path), "/", "x", 0o644, Failed),
        lambda: files.read_file(str(tmp_path), "/./", Failed),
        lambda: files.remove_file(str(tmp_path), "/", Failed),
    ):
        with pytest.raises(Failed) as err:
            call()
        assert err.value.path == str(tmp_path) and err.value.reason
    assert tmp_path.is_dir() and os.listdir(tmp_path) == []


def test_a_missing_root_is_made_with_the_directory_mode_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        files.write_file(str(tmp_path / "r" / "s"), "/x.conf", "x", 0o644, Failed, 0o751)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r" / "s").stat().st_mode) == 0o751
    assert (tmp_path / "r/s/x.conf").read_text() == "x"


def test_reading_below_a_missing_root_or_parent_is_absent_and_makes_nothing(tmp_path):
    assert files.read_file(str(tmp_path / "none"), "/etc/x.conf", Failed) is None
    assert files.read_file(str(tmp_path), "/etc/numafleet/x.conf", Failed) is None
    assert files.read_text(str(tmp_path), "/etc/x.conf", Failed) is None
    assert files.lstat_file(str(tmp_path), "/etc/numafleet/x.conf", Failed) is None
    assert files.lstat_file(str(tmp_path), "/x.conf", Failed) is None
    files.remove_file(str(tmp_path), "/etc/numafleet/x.conf", Failed, prune_parent=True)
    assert files.open_dir(str(tmp_path), "/etc/numafleet", Failed) is None
    assert os.listdir(tmp_path) == [] and not (tmp_path / "none").exists()


def test_a_root_that_is_a_file_fails_naming_the_root(tmp_path):
    (tmp_path / "r").write_text("x")
    with pytest.raises(Failed) as err:
        files.read_file(str(tmp_path / "r"), "/x.conf", Failed)
    assert err.value.path == str(tmp_path / "r") and err.value.reason


def test_open_dir_makes_missing_levels_and_returns_the_deepest(tmp_path):
    fd = files.open_dir(str(tmp_path), "/a/b", Failed, create=True, dir_mode=0o700)
    try:
        assert os.fstat(fd).st_ino == (tmp_path / "a/b").stat().st_ino
    finally:
        os.close(fd)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700


def test_a_directory_that_cannot_be_made_fails_naming_it(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "mkdir", refuse)
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path), "/etc/numafleet/x.conf", "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "etc") and "No space" in err.value.reason


def test_the_temporary_file_is_private_while_it_is_written(tmp_path, monkeypatch):
    """The text is on disk before its final mode is set: nobody else may read it meanwhile."""
    seen = []
    real_fsync = os.fsync

    def spy(fd):
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            seen.append(stat.S_IMODE(info.st_mode))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", spy)
    old = os.umask(0)
    try:
        files.write_file(str(tmp_path), "/secret.conf", "x", 0o644, Failed)
    finally:
        os.umask(old)
    assert seen == [0o600]
    assert stat.S_IMODE((tmp_path / "secret.conf").stat().st_mode) == 0o644


def test_undecodable_bytes_read_as_text_are_written_back_unchanged(tmp_path):
    files.write_file(str(tmp_path), "/x.conf", "a\udcffb", 0o644, Failed)
    assert (tmp_path / "x.conf").read_bytes() == b"a\xffb"
    assert files.read_file(str(tmp_path), "/x.conf", Failed) == b"a\xffb"
    assert files.read_text(str(tmp_path), "/x.conf", Failed) == "a\ufffdb"


def test_a_temporary_file_that_cannot_be_made_fails_naming_the_directory(tmp_path):
    name = "n" * 240  # a valid name; its temporary one is too long for the file system
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path), f"/etc/{name}", "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "etc") and err.value.reason
    assert os.listdir(tmp_path / "etc") == []


def test_write_link_replaces_a_file_and_refuses_a_linked_parent(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/l").write_text("a file")
    files.write_link(str(tmp_path), "/d/l", "/somewhere", Failed)
    assert os.readlink(tmp_path / "d/l") == "/somewhere" and os.listdir(tmp_path / "d") == ["l"]
    files.write_link(str(tmp_path), "/new/m", "x", Failed, 0o750)
    assert os.readlink(tmp_path / "new/m") == "x"
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o750
    (tmp_path / "linked").symlink_to(tmp_path / "d")
    with pytest.raises(Failed, match="symbolic link"):
        files.write_link(str(tmp_path), "/linked/n", "x", Failed)
    (tmp_path / "d/dir").mkdir()
    (tmp_path / "d/dir/keep").write_text("x")
    with pytest.raises(Failed) as err:
        files.write_link(str(tmp_path), "/d/dir", "x", Failed)
    assert err.value.path == str(tmp_path / "d/dir") and err.value.reason
    assert sorted(os.listdir(tmp_path / "d")) == ["dir", "l"]


def test_lstat_describes_a_link_not_its_target(tmp_path):
    (tmp_path / "target").write_text("x")
    (tmp_path / "l").symlink_to(tmp_path / "target")
    assert stat.S_ISLNK(files.lstat_file(str(tmp_path), "/l", Failed).st_mode)
    assert stat.S_ISREG(files.lstat_file(str(tmp_path), "/target", Failed).st_mode)
    with pytest.raises(Failed) as err:
        files.lstat_file(str(tmp_path), "/" + "n" * 300, Failed)
    assert err.value.path == str(tmp_path / ("n" * 300)) and err.value.reason


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_anything_but_a_regular_file_is_refused_on_read(tmp_path, kind):
    if kind == "directory":
        (tmp_path / "x.conf").mkdir()
    else:
        os.mkfifo(tmp_path / "x.conf")
    with pytest.raises(Failed) as err:
        files.read_file(str(tmp_path), "/x.conf", Failed, link_as_absent=True)
    assert err.value.path == str(tmp_path / "x.conf") and "not a regular file" in err.value.reason


def test_a_file_that_cannot_be_opened_fails_naming_it(tmp_path):
    with pytest.raises(Failed) as err:
        files.read_file(str(tmp_path), "/" + "n" * 300, Failed, link_as_absent=True)
    assert err.value.path == str(tmp_path / ("n" * 300)) and err.value.reason
    assert "symbolic link" not in err.value.reason


def test_removing_what_is_not_a_file_fails_and_a_top_level_file_prunes_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(Failed) as err:
        files.remove_file(str(tmp_path), "/d", Failed)
    assert err.value.path == str(tmp_path / "d") and err.value.reason
    assert (tmp_path / "d").is_dir()
    (tmp_path / "x").write_text("x")
    files.remove_file(str(tmp_path), "/x", Failed, prune_parent=True)
    assert os.listdir(tmp_path) == ["d"]
    (tmp_path / "d/x").write_text("x")
    files.remove_file(str(tmp_path), "/d/x", Failed)  # without prune_parent the directory stays
    assert (tmp_path / "d").is_dir()


def _held(tmp_path, content: bytes):
    """This process holds the lock on another open file description, with ``content`` in it."""
    lock = tmp_path / "run/numafleet/apply.lock"
    lock.parent.mkdir(parents=True)
    lock.write_bytes(content)
    os.chmod(lock, 0o600)
    fd = os.open(lock, os.O_RDWR)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


class _Clock:
    def __init__(self):
        self.now, self.slept = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("content", "holder"), [(b"4242\n", "PID 4242"), (b"junk\n", "PID unknown"), (b"", "unknown")]
)
def test_a_held_lock_waits_its_timeout_polling_then_names_the_holder(tmp_path, content, holder):
    fd = _held(tmp_path, content)
    clock = _Clock()
    try:
        with pytest.raises(files.LockError) as err:
            with files.host_lock(
                str(tmp_path), timeout_s=1, poll_s=0.25, clock=clock, sleep=clock.sleep
            ):
                raise AssertionError("the lock was taken twice")
    finally:
        os.close(fd)
    assert clock.slept == [0.25] * 4  # waited exactly its timeout
    assert holder in str(err.value) and "over 1 s" in str(err.value)
    assert str(tmp_path / "run/numafleet/apply.lock") in str(err.value)
    assert stat.S_IMODE((tmp_path / "run/numafleet/apply.lock").stat().st_mode) == 0o644


def test_the_default_lock_timeout_is_two_minutes(tmp_path):
    fd = _held(tmp_path, b"1\n")
    clock = _Clock()
    try:
        with pytest.raises(files.LockError, match="over 120 s"):
            with files.host_lock(str(tmp_path), poll_s=30, clock=clock, sleep=clock.sleep):
                pass
    finally:
        os.close(fd)
    assert sum(clock.slept) == 120


def test_a_free_lock_is_taken_at_once_and_holds_our_pid_only(tmp_path):
    lock = tmp_path / "run/numafleet/apply.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("123456789012\n")
    clock = _Clock()
    with files.host_lock(str(tmp_path), timeout_s=0, clock=clock, sleep=clock.sleep) as path:
        assert path == str(lock) and lock.read_text() == f"{os.getpid()}\n"
    assert clock.slept == []


def test_no_lock_below_a_root_that_does_not_exist(tmp_path):
    with files.host_lock(str(tmp_path / "render")) as path:
        assert path is None
    assert not (tmp_path / "render").exists()


def test_a_lock_file_that_is_a_link_or_not_a_file_is_refused(tmp_path):
    (tmp_path / "run/numafleet").mkdir(parents=True)
    (tmp_path / "theirs").write_text("keep\n")
    lock = tmp_path / "run/numafleet/apply.lock"
    lock.symlink_to(tmp_path / "theirs")
    with pytest.raises(files.LockError, match="symbolic link"):
        with files.host_lock(str(tmp_path)):
            pass
    assert (tmp_path / "theirs").read_text() == "keep\n"
    lock.unlink()
    os.mkfifo(lock)
    with pytest.raises(files.LockError, match="not a regular file") as err:
        with files.host_lock(str(tmp_path)):
            pass
    assert str(lock) in str(err.value)
    lock.unlink()
    lock.mkdir()
    with pytest.raises(files.LockError) as err:
        with files.host_lock(str(tmp_path)):
            pass
    assert str(lock) in str(err.value) and "symbolic link" not in str(err.value)


def test_a_root_that_cannot_be_made_fails_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "makedirs", lambda *args, **kwargs: None)  # made, then gone
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path / "r"), "/x.conf", "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "r") and err.value.reason == "cannot be made"


def test_reasons_carry_what_the_system_said(tmp_path):
    """The OS's own words (strerror) reach the message, not a generic text."""
    too_long = os.strerror(errno.ENAMETOOLONG)
    long_name = "/" + "n" * 300
    for call in (
        lambda: files.lstat_file(str(tmp_path), long_name, Failed),
        lambda: files.read_file(str(tmp_path), long_name, Failed),
        lambda: files.write_file(str(tmp_path), "/" + "n" * 250, "x", 0o644, Failed),
        lambda: files.write_link(str(tmp_path), long_name, "x", Failed),
        lambda: files.open_dir(str(tmp_path), long_name, Failed, create=True),
    ):
        with pytest.raises(Failed) as err:
            call()
        assert err.value.reason == too_long
    (tmp_path / "d").mkdir()
    with pytest.raises(Failed) as err:
        files.remove_file(str(tmp_path), "/d", Failed)
    assert err.value.reason == os.strerror(errno.EISDIR)
    (tmp_path / "f").write_text("x")
    with pytest.raises(Failed) as err:
        files.read_file(str(tmp_path / "f"), "/x", Failed)
    assert err.value.reason == os.strerror(errno.ENOTDIR)
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path), "/f/x.conf", "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "f") and err.value.reason == "is not a directory"
    lock = tmp_path / "run/numafleet/apply.lock"
    lock.mkdir(parents=True)
    with pytest.raises(files.LockError) as err:
        with files.host_lock(str(tmp_path)):
            pass
    assert os.strerror(errno.EISDIR) in str(err.value)


def test_a_deeper_directory_that_cannot_be_made_is_named(tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "mkdir", refuse)
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path), "/etc/numafleet/deep/x.conf", "x", 0o644, Failed)
    assert err.value.path == str(tmp_path / "etc/numafleet")
    assert err.value.reason == os.strerror(errno.ENOSPC)


def test_a_link_raced_in_where_a_directory_was_being_made_is_refused(tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()
    (tmp_path / "elsewhere").mkdir()
    real_mkdir = os.mkdir

    def race(name, mode=0o777, *, dir_fd=None):
        os.symlink(str(tmp_path / "elsewhere"), name, dir_fd=dir_fd)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))

    monkeypatch.setattr(files.os, "mkdir", race)
    with pytest.raises(Failed) as err:
        files.write_file(str(tmp_path), "/etc/numafleet/deep/x.conf", "x", 0o644, Failed)
    monkeypatch.setattr(files.os, "mkdir", real_mkdir)
    assert err.value.path == str(tmp_path / "etc/numafleet") and "symbolic link" in err.value.reason
    assert os.listdir(tmp_path / "elsewhere") == []


def test_deeper_links_stats_and_prunes_act_where_they_are_told(tmp_path):
    files.write_link(str(tmp_path), "/a/b/l", "target", Failed)
    assert os.readlink(tmp_path / "a/b/l") == "target" and os.listdir(tmp_path / "a") == ["b"]
    first = "n" * 250
    files.write_link(str(tmp_path), f"/{first}/l", "target", Failed)
    assert os.readlink(tmp_path / first / "l") == "target"
    assert stat.S_ISLNK(files.lstat_file(str(tmp_path), "/a/b/l", Failed).st_mode)
    assert files.lstat_file(str(tmp_path), "/a/l", Failed) is None
    (tmp_path / "a/b.d").mkdir()
    (tmp_path / "a/b.d/x.conf").write_text("x")
    files.remove_file(str(tmp_path), "/a/b.d/x.conf", Failed, prune_parent=True)
    assert sorted(os.listdir(tmp_path / "a")) == ["b"]
    (tmp_path / "a/b/c.d").mkdir()
    (tmp_path / "a/b/c.d/x.conf").write_text("x")
    files.remove_file(str(tmp_path), "/a/b/c.d/x.conf", Failed, prune_parent=True)
    assert sorted(os.listdir(tmp_path / "a/b")) == ["l"]


def test_a_holder_pid_that_is_not_ascii_is_unknown(tmp_path):
    fd = _held(tmp_path, b"\xff\xfe12\n")
    clock = _Clock()
    try:
        with pytest.raises(files.LockError, match=r"PID unknown"):
            with files.host_lock(str(tmp_path), timeout_s=0, clock=clock, sleep=clock.sleep):
                pass
    finally:
        os.close(fd)
