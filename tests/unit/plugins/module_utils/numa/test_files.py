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
