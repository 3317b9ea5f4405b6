"""Mutated sysfs/procfs files (empty, garbage, NULs, truncated, binary) never raise.

Every file the readers use in a real tree is a candidate; each example mutates one or a few,
reads the facts, and restores them. The only acceptable outcome is facts plus warnings.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, topology
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

MACHINES = ["qemu-2node-pxb", "synthetic-mi300x-cpx", "16em64t-4s2c2t-offlines"]


def mutations(original: bytes):
    return st.one_of(
        st.just(b""),
        st.just(b"\x00" * 8),
        st.just(original + b"\n\x00"),
        st.integers(min_value=0, max_value=max(len(original) - 1, 0)).map(lambda n: original[:n]),
        st.binary(max_size=64),
        st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.sampled_from([b"-1\n", b"4294967296\n", b"0x\n", b"(null)\n", b"1-\n", b"[x]\n"]),
    )


def read_everything(root):
    reader = Reader(os.path.join(root, "sys"), os.path.join(root, "proc"))
    facts = read_numa_facts(reader)
    gpu.read_gpus(reader, topology.read_node_cpus(reader))
    return reader, facts


@pytest.mark.parametrize("machine", MACHINES)
def test_mutated_files_become_warnings_never_tracebacks(machine, fixture_root):
    root = fixture_root(machine, writable=True)
    reader, dummy = read_everything(root)
    files = sorted(p for p in reader.accessed if os.path.isfile(p) and not os.path.islink(p))
    assert len(files) > 10

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        chosen = data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=3, unique=True))
        saved = {}
        try:
            for path in chosen:
                with open(path, "rb") as handle:
                    saved[path] = handle.read()
                with open(path, "wb") as handle:
                    handle.write(data.draw(mutations(saved[path])))
            dummy_reader, facts = read_everything(root)
            assert isinstance(facts["nodes"], list) and isinstance(facts["warnings"], list)
            for warning in facts["warnings"]:
                assert warning["path"].startswith(root) and warning["reason"]
        finally:
            for path, content in saved.items():
                with open(path, "wb") as handle:
                    handle.write(content)

    check()


@pytest.mark.parametrize("machine", MACHINES)
def test_a_removed_file_is_a_warning_with_its_path(machine, fixture_root):
    root = fixture_root(machine, writable=True)
    meminfo = os.path.join(root, "sys", "devices", "system", "node", "node0", "meminfo")
    os.unlink(meminfo)
    dummy, facts = read_everything(root)
    assert {"path": meminfo, "reason": "missing"} in facts["warnings"]
    assert facts["nodes"][0]["memory_kb"] is None
