"""sysfs.Reader: link resolution, shared reads between sibling readers, CPU-set parsing, reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import sysfs
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader


def _entries(top: Path) -> list:
    """Every file, directory and link under ``top`` (links not followed)."""
    found = []
    for dirpath, dirs, files in os.walk(top):
        found.extend(os.path.join(dirpath, name) for name in dirs + files)
    return found


@pytest.fixture
def links(tmp_path):
    """A tree with the link shapes realpath must handle: relative, absolute, chained, dangling,
    '..' after a linked directory, loops, and links to files."""
    real = tmp_path / "real" / "devices" / "pci0000:00" / "0000:00:01.0"
    (real / "0000:01:00.0").mkdir(parents=True)
    (real / "0000:01:00.0" / "class").write_text("0x030200\n")
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (bus / "0000:01:00.0").symlink_to(
        "../../../../real/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    )
    (bus / "abs").symlink_to(real)
    (bus / "chain").symlink_to("abs/0000:01:00.0")
    (bus / "dangling").symlink_to("../nowhere/at/all")
    (bus / "up").symlink_to("abs/../0000:00:01.0/0000:01:00.0/class")
    (bus / "loop-a").symlink_to("loop-b")
    (bus / "loop-b").symlink_to("loop-a")
    (bus / "self").symlink_to("self")
    (bus / "into-loop").symlink_to("loop-a/x")
    (bus / "file").symlink_to("0000:01:00.0/class")
    (tmp_path / "sys" / "linked-dir").symlink_to(tmp_path / "real")
    return tmp_path


def test_realpath_is_os_path_realpath_for_every_shape_of_link(links):
    reader = Reader(str(links / "sys"), "")
    paths = _entries(links) + [
        str(links / "sys" / "bus" / "pci" / "devices" / "chain" / "class"),
        str(links / "sys" / "bus" / "pci" / "devices" / "missing" / "deeper"),
        str(links / "sys" / "linked-dir" / "devices" / ".." / "devices"),
        str(links / "sys" / "linked-dir" / "devices" / "pci0000:00"),
        str(links / "sys" / "bus" / "pci" / "devices" / "self" / "x"),
        "/",
        "relative/path",
        str(links) + "//sys/./bus/",
    ]
    for path in paths * 2:  # the second round answers from what the first one resolved
        assert reader.realpath(path) == os.path.realpath(path), path
    assert str(links / "sys" / "bus" / "pci" / "devices" / "chain") in reader.accessed


@pytest.mark.parametrize("machine", ["synthetic-8xh100-2s", "32em64t-2n8c+dax+nvme+mic+dimms"])
def test_realpath_is_os_path_realpath_on_recorded_trees(fixture_root, machine):
    root = fixture_root(machine)
    reader = Reader(f"{root}/sys", f"{root}/proc")
    for path in _entries(Path(root) / "sys"):
        assert reader.realpath(path) == os.path.realpath(path), path


def test_a_sibling_reads_nothing_again_and_reports_its_own_warnings(tmp_path):
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "value").write_text("7\n")
    (tmp_path / "sys" / "d").mkdir()
    (tmp_path / "sys" / "d" / "b").write_text("")
    (tmp_path / "sys" / "d" / "a").write_text("")
    os.mkfifo(tmp_path / "sys" / "fifo")
    first = Reader(str(tmp_path / "sys"), "", remember=True)
    value, missing, fifo = (first.sys(name) for name in ("value", "missing", "fifo"))
    assert first.integer(value) == 7
    assert first.text(missing, optional=True) is None and first.text(fifo) is None
    assert first.listdir(first.sys("d")) == ["a", "b"]
    (tmp_path / "sys" / "value").write_text("8\n")  # changed after the first pass read it
    (tmp_path / "sys" / "d" / "c").write_text("")
    second = first.sibling()
    assert second.warnings == [] and second.accessed == set()
    assert second.integer(value) == 7  # what the first pass read, not read again
    assert second.listdir(second.sys("d")) == ["a", "b"]
    assert second.text(missing) is None  # not optional here: a warning on this reader
    assert second.text(fifo) is None
    assert second.warnings == [
        {"path": missing, "reason": "missing"},
        {"path": fifo, "reason": "not a regular file"},
    ]
    assert first.warnings == [{"path": fifo, "reason": "not a regular file"}]
    assert {value, missing, fifo, second.sys("d")} <= second.accessed
    # A reader made without remember=True shares nothing: its sibling reads the files.
    assert Reader(str(tmp_path / "sys"), "").sibling().integer(value) == 8


def test_cpu_sets_are_parsed_once_per_text_and_each_caller_gets_its_own_list(tmp_path):
    for name, text in (("a", "0-3,8\n"), ("b", "0-3,8\n"), ("bad", "3-1\n"), ("mask", "f\n")):
        (tmp_path / name).write_text(text)
    reader = Reader(str(tmp_path), "")
    first, second = reader.cpulist(str(tmp_path / "a")), reader.cpulist(str(tmp_path / "b"))
    assert first == second == [0, 1, 2, 3, 8] and first is not second
    first.append(99)
    assert reader.cpulist(str(tmp_path / "b")) == [0, 1, 2, 3, 8]
    assert reader.cpumask(str(tmp_path / "mask")) == [0, 1, 2, 3]
    assert reader.cpulist(str(tmp_path / "bad")) is None
    assert reader.cpulist(str(tmp_path / "bad")) is None
    assert reader.warnings == [
        {
            "path": str(tmp_path / "bad"),
            "reason": "invalid CPU set '3-1': range '3-1' runs backwards",
        }
    ]


@pytest.mark.parametrize(
    "size", [0, 5, sysfs.READ_LIMIT - 1, sysfs.READ_LIMIT, sysfs.READ_LIMIT + 7]
)
def test_text_reads_up_to_the_read_limit(tmp_path, size):
    body = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    # Small files end as some dumps pad them ("\n\0"); NULs before the newline would be a lie.
    (tmp_path / "f").write_bytes(body + b"\n\0" if size < 10 else body)
    assert Reader(str(tmp_path), "").text(str(tmp_path / "f")) == body[: sysfs.READ_LIMIT].decode()


def test_listdir_gives_each_caller_its_own_list(tmp_path):
    (tmp_path / "x").write_text("")
    reader = Reader(str(tmp_path), "", remember=True)
    names = reader.listdir(str(tmp_path))
    names.append("y")
    assert reader.listdir(str(tmp_path)) == ["x"] == reader.sibling().listdir(str(tmp_path))
