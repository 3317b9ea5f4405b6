"""write_atomic: the one atomic file write of the modules that write below a root."""

from __future__ import annotations

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
    with pytest.raises(Failed, match="symbolic link"):
        files.read_file(str(tmp_path), "/x.json", Failed)
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
