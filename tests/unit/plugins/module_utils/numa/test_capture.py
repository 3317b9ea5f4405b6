"""A capture holds exactly what the readers need: facts from the unpacked capture are the same."""

from __future__ import annotations

import os
import tarfile

import pytest
import trees

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, topology
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.capture import (
    plan_capture,
    write_capture,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import TopologyError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

ROOT_KEYS = ("sysfs_root", "procfs_root", "warnings")


def read_all(root):
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    facts = read_numa_facts(reader)
    gpus = gpu.read_gpus(reader, topology.read_node_cpus(reader))
    return reader, facts, gpus


def _relative(value, root):
    """value with every string path under root made relative to it (facts name files read)."""
    if isinstance(value, str):
        return os.path.relpath(value, root) if value.startswith(root + os.sep) else value
    if isinstance(value, dict):
        return {key: _relative(item, root) for key, item in value.items()}
    if isinstance(value, list):
        return [_relative(item, root) for item in value]
    return value


def strip_roots(facts, root):
    out = {key: value for key, value in facts.items() if key not in ROOT_KEYS}
    out["warnings"] = [
        {"path": os.path.relpath(w["path"], root), "reason": w["reason"]} for w in facts["warnings"]
    ]
    return _relative(out, root)


@pytest.mark.parametrize("machine", trees.MACHINES)
def test_capture_round_trip_gives_the_same_facts(machine, fixture_root, tmp_path):
    root = fixture_root(machine)
    reader, facts, gpus = read_all(root)
    entries = plan_capture(reader)
    dest = str(tmp_path / "capture.tar.gz")
    stored = write_capture(entries, dest, "host")
    assert stored == sum(1 for kind, dummy, dummy2 in entries if kind == "file")
    with tarfile.open(dest) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path, filter="fully_trusted")
    assert all(name.startswith(("host/sys", "host/proc")) for name in names)
    dummy, facts_again, gpus_again = read_all(str(tmp_path / "host"))
    assert strip_roots(facts_again, str(tmp_path / "host")) == strip_roots(facts, root)
    assert gpus_again == gpus


def test_capture_keeps_pci_links_relative_and_skips_unrelated_files(fixture_root, tmp_path):
    reader, dummy, dummy2 = read_all(fixture_root("qemu-2node-pxb"))
    entries = plan_capture(reader)
    links = {name: target for kind, name, target in entries if kind == "link"}
    assert links["sys/bus/pci/devices/0000:81:00.0"] == (
        "../../../devices/pci0000:80/0000:80:00.0/0000:81:00.0"
    )
    names = {name for dummy, name, dummy2 in entries}
    assert "sys/devices/pci0000:80/0000:80:00.0/0000:81:00.0/numa_node" in names
    assert not any("/vmstat" in name for name in names)  # never read, never captured


def test_capture_to_an_unwritable_place_names_the_path(fixture_root, tmp_path):
    reader, dummy, dummy2 = read_all(fixture_root("2arm-2c"))
    dest = str(tmp_path / "missing-dir" / "capture.tar.gz")
    with pytest.raises(TopologyError) as err:
        write_capture(plan_capture(reader), dest, "host")
    assert dest in str(err.value) and "cannot write the capture" in str(err.value)


def test_capture_through_a_root_with_dotdot_and_a_symlink_keeps_amd_partitions(
    fixture_root, tmp_path
):
    real = fixture_root("synthetic-mi300x-cpx")
    (tmp_path / "a").mkdir()
    os.symlink(real, tmp_path / "link")
    root = str(tmp_path / "a" / ".." / "link")
    reader, facts, gpus = read_all(root)
    modes = {g.address: g.partition["compute"]["current"] for g in gpus}
    assert (
        modes
        == {
            address: "SPX" if address in ("0000:03:00.0", "0000:23:00.0") else "CPX"
            for address in modes
        }
        and len(modes) == 8
    )
    write_capture(plan_capture(reader), str(tmp_path / "c.tar.gz"), "mi300x-01")
    with tarfile.open(tmp_path / "c.tar.gz") as archive:
        archive.extractall(tmp_path / "out", filter="fully_trusted")
    dummy, dummy2, gpus_again = read_all(str(tmp_path / "out" / "mi300x-01"))
    assert gpus_again == gpus


@pytest.mark.parametrize("name", ["", "..", "../evil", "a/b", "/abs", ".hidden"])
def test_capture_names_that_could_escape_are_refused(fixture_root, tmp_path, name):
    reader, dummy, dummy2 = read_all(fixture_root("2arm-2c"))
    with pytest.raises(TopologyError) as err:
        write_capture(plan_capture(reader), str(tmp_path / "c.tar.gz"), name)
    assert "name=" in str(err.value) and "inventory hostname" in str(err.value)
    assert not (tmp_path / "c.tar.gz").exists()


def test_a_link_at_dest_is_refused_and_its_target_untouched(tmp_path):
    """Failed before: tarfile.open followed a link at dest (issue 19)."""
    theirs = tmp_path / "theirs"
    theirs.write_text("theirs\n")
    (tmp_path / "cap.tar.gz").symlink_to(theirs)
    with pytest.raises(TopologyError, match="cannot write the capture"):
        write_capture([], str(tmp_path / "cap.tar.gz"), "cap")
    assert theirs.read_text() == "theirs\n"
