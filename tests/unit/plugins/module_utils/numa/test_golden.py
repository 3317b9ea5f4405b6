"""numa facts of every recorded and synthetic tree equal their reviewed golden JSON.

A failure here means the readers' output changed. If the change is intended, regenerate with
``python tests/unit/fixtures/regen_golden.py MACHINE`` and review the diff.
"""

from __future__ import annotations

import json

import pytest
import regen_golden
import trees


@pytest.mark.parametrize("machine", trees.MACHINES)
def test_facts_match_golden(machine, fixture_root):
    want = json.loads(regen_golden.golden_path(machine).read_text())
    got = regen_golden.golden_facts(fixture_root(machine))
    assert got == want


def test_every_golden_file_has_a_machine():
    goldens = sorted(p.name[: -len(".numa.json")] for p in trees.SYSFS.glob("*.numa.json"))
    assert goldens == trees.MACHINES


def test_golden_files_carry_no_scratch_path(fixture_root):
    root = fixture_root("qemu-2node-pxb")
    facts = regen_golden.golden_facts(root)
    assert facts["sysfs_root"] == "${root}/sys"
    assert facts["procfs_root"] == "${root}/proc"
    assert root not in json.dumps(facts)
