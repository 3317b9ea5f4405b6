"""facts.gather_facts: one run for ansible_facts.numa, .gpu_topology and .numafleet_state_paths."""

from __future__ import annotations

import os

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import facts, gpu, gpu_snapshot
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

SNAPSHOT = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "fixtures", "gpu_snapshots", "synthetic-gh200.json"
)


def params(root, **changes):
    base = dict(
        sysfs_root=f"{root}/sys",
        procfs_root=f"{root}/proc",
        gpu=False,
        gpu_snapshot=None,
        gpu_snapshot_out=None,
        nvidia_smi="auto",
        nvidia_smi_timeout=30,
        state_paths=[],
    )
    base.update(changes)
    return base


def refuse(*args, **kwargs):
    pytest.fail(f"called with {args} {kwargs}")


def test_without_gpu_nothing_of_the_gpu_side_is_used(fixture_root):
    root = fixture_root("synthetic-gh200")
    got, written = facts.gather_facts(params(root), False, refuse, refuse, refuse)
    assert list(got) == ["numa"] and written is False
    assert got["numa"] == facts.read_numa_facts(Reader(f"{root}/sys", f"{root}/proc"))


def test_gpu_facts_are_those_of_a_fresh_reader(fixture_root):
    root = fixture_root("synthetic-gh200")
    got, written = facts.gather_facts(
        params(root, gpu=True, gpu_snapshot=SNAPSHOT), False, refuse, lambda name: None, refuse
    )
    alone = gpu.read_gpu_topology(
        Reader(f"{root}/sys", f"{root}/proc"), gpu_snapshot.read_snapshot(SNAPSHOT)
    )
    assert got["gpu_topology"] == alone and written is False


def test_state_paths(tmp_path, fixture_root):
    (tmp_path / "present").write_text("")
    wanted = [str(tmp_path / "absent"), str(tmp_path / "present"), str(tmp_path / "present")]
    assert facts.read_state_paths(wanted) == wanted[1:]
    got, dummy = facts.gather_facts(
        params(fixture_root("2arm-2c"), state_paths=wanted), False, refuse, refuse, refuse
    )
    assert got["numafleet_state_paths"] == wanted[1:]


@pytest.mark.parametrize("bad", ["relative/x", "", None, 5])
def test_a_state_path_that_is_not_absolute_is_refused_before_anything_is_read(bad):
    with pytest.raises(
        facts.StatePathError, match=r"^state_paths\[0\]: .* is not an absolute path"
    ):
        facts.gather_facts(
            params("/nonexistent", state_paths=[bad, "/etc"]), False, refuse, refuse, refuse
        )
