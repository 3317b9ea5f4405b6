"""Sysfs that lies (issue 19, section 4): files the kernel never writes are warnings naming the
file, never empty sets or foreign nodes, and the planner does not build on them.

Every case edits one or two files of a scratch copy of a tree from ``tests/unit/fixtures/sysfs``
(provenance in ``tests/unit/fixtures/PROVENANCE.md``, section "Edited copies in tests"):

* ``nvidiagpunumanodes``: hwloc's dump of an IBM POWER9 8335-GTW (BSD-3-Clause, COPYING in
  ``sysfs/hwloc/``): CPU nodes 0 and 8 with SMT4, V100 memory as CPU-less nodes 250-255 whose
  ``cpulist`` is a bare newline, as the kernel writes it.
* ``qemu-2node-pxb``: a real QEMU q35 guest with 2 nodes (CPUs 0-1, 2-3), a NIC at 0000:00:02.0.
* ``synthetic-2x6338-4xa100``: the synthetic 2-socket A100 host (GPUs 17:00.0 and 31:00.0 on
  node 0, b1:00.0 and ca:00.0 on node 1).

Each edit is in the table of its test: (file under the tree, new bytes, what it models).
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, topology
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import (
    parse_recorded,
    plan_host,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.units import plan_record_text

POWER9, QEMU, A100 = "nvidiagpunumanodes", "qemu-2node-pxb", "synthetic-2x6338-4xa100"
NODE = "sys/devices/system/node"
CPU = "sys/devices/system/cpu"
PCI = "sys/bus/pci/devices"
NULS = b"\0" * 4096  # what an emulated or broken sysfs gives: a page of NUL bytes
POLICY = {"reserved_cpus": "", "memory_headroom_pct": 15}
RECORD = "/etc/numafleet/plan.json"


def edited(fixture_root, machine: str, edits: dict) -> str:
    """A writable copy of ``machine`` with ``edits`` ({path: bytes, or None to delete})."""
    root = fixture_root(machine, writable=True)
    for rel, content in edits.items():
        path = os.path.join(root, rel)
        if content is None:
            os.unlink(path)
            continue
        with open(path, "wb") as handle:
            handle.write(content)
    return root


def facts_of(root: str) -> dict:
    return json.loads(json.dumps(read_numa_facts(Reader(f"{root}/sys", f"{root}/proc"))))


def gpu_facts_of(root: str) -> dict:
    state = gpu.nvml_unavailable("no NVML in the tests")
    return gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state)


def node(facts: dict, nid: int) -> dict:
    return next(entry for entry in facts["nodes"] if entry["id"] == nid)


def warned(facts: dict, root: str, rel: str) -> str:
    """The reason of the one warning about ``rel``; fails when there is none."""
    reasons = [w["reason"] for w in facts["warnings"] if w["path"] == os.path.join(root, rel)]
    assert reasons, f"no warning names {rel}: {facts['warnings']}"
    return reasons[0]


def new_warnings(facts: dict, fixture_root, machine: str) -> list:
    """The warnings of ``facts`` that the unedited tree does not give."""
    recorded = facts_of(fixture_root(machine))["warnings"]
    root = fixture_root(machine)
    known = {(w["path"].replace(root, ""), w["reason"]) for w in recorded}
    return [
        w
        for w in facts["warnings"]
        if (w["path"][w["path"].index("/sys/") :], w["reason"]) not in known
    ]


def finding(facts: dict, kind: str) -> dict:
    found = [entry for entry in facts["consistency"] if entry["kind"] == kind]
    assert len(found) == 1, facts["consistency"]
    return found[0]


# ---------------------------------------------------------------------------------------------
# Node CPU lists: NUL bytes and garbage are unknown, empty text is a memory-only node


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (NULS, "only NUL bytes"),  # a page of NULs: read as empty before, node 8 lost its CPUs
        (b"88-103\0\0garbage\n", "NUL bytes inside"),  # NULs inside the text
        (b"88-\x0095\n", "NUL bytes inside"),  # read as 88-95 before (half the node)
        (b"\0\0\0\0\n\0", "only NUL bytes"),  # NULs before the newline: not an empty list
    ],
)
def test_a_node_cpulist_of_nul_bytes_is_unknown_not_empty(fixture_root, content, reason):
    root = edited(fixture_root, POWER9, {f"{NODE}/node8/cpulist": content})
    facts = facts_of(root)
    assert reason in warned(facts, root, f"{NODE}/node8/cpulist")
    assert node(facts, 8)["kind"] == "unknown" and node(facts, 8)["cpus"] == []
    homeless = finding(facts, "cpus_without_node")
    assert homeless["cpus"] == list(range(88, 104)) and homeless["nodes"] == [8]
    assert node(facts, 0)["kind"] == "cpu+memory"  # the other nodes are untouched


def test_an_empty_cpulist_is_a_memory_only_node_without_warning(fixture_root):
    # Recorded as is: the V100 memory nodes' cpulist is "\n"; also "\n\0" (a dump's padding).
    root = edited(fixture_root, POWER9, {f"{NODE}/node253/cpulist": b"\n\0"})
    facts = facts_of(root)
    assert [node(facts, nid)["kind"] for nid in (250, 252, 253)] == ["memory-only"] * 3
    assert new_warnings(facts, fixture_root, POWER9) == [] and facts["consistency"] == []


def test_a_cpulist_that_lies_is_not_replaced_by_cpumap(fixture_root):
    # cpumap is a view of the same kernel mask: when cpulist is there and lies, neither is used.
    root = edited(fixture_root, QEMU, {f"{NODE}/node1/cpulist": NULS})
    facts = facts_of(root)
    assert "only NUL bytes" in warned(facts, root, f"{NODE}/node1/cpulist")
    assert node(facts, 1)["kind"] == "unknown"
    assert finding(facts, "cpus_without_node")["cpus"] == [2, 3]


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"\n", "is empty; the kernel writes a cpumask"), (NULS, "only NUL bytes")],
)
def test_an_old_kernels_cpumap_without_words_is_unknown(fixture_root, content, reason):
    # Old kernels have cpumap only; an empty mask file is "00000000" words, never no text.
    root = edited(
        fixture_root, QEMU, {f"{NODE}/node1/cpulist": None, f"{NODE}/node1/cpumap": content}
    )
    facts = facts_of(root)
    assert reason in warned(facts, root, f"{NODE}/node1/cpumap")
    assert node(facts, 1)["kind"] == "unknown"


def test_a_node_directory_without_cpulist_or_cpumap_is_unknown(fixture_root):
    root = edited(fixture_root, QEMU, {f"{NODE}/node1/cpulist": None, f"{NODE}/node1/cpumap": None})
    facts = facts_of(root)
    assert warned(facts, root, f"{NODE}/node1/cpumap") == "missing"
    assert node(facts, 1)["kind"] == "unknown"


# ---------------------------------------------------------------------------------------------
# SMT siblings: an online CPU is always its own sibling


@pytest.mark.parametrize(
    ("edits", "siblings", "paths"),
    [
        # Both files NULs: unknown (before: an empty list, so CPU 1 was a core of its own).
        (
            {"thread_siblings_list": NULS, "thread_siblings": NULS},
            None,
            ["thread_siblings_list", "thread_siblings"],
        ),
        # The list is empty, the mask is right: the mask is used, the list is warned about.
        ({"thread_siblings_list": b"\n"}, [0, 1, 2, 3], ["thread_siblings_list"]),
        # The list names another core only: not CPU 1's siblings.
        ({"thread_siblings_list": b"4-7\n"}, [0, 1, 2, 3], ["thread_siblings_list"]),
        # Both empty (mask "0" words) and the list empty: unknown.
        (
            {"thread_siblings_list": b"\n", "thread_siblings": b"00000000\n"},
            None,
            ["thread_siblings_list", "thread_siblings"],
        ),
    ],
)
def test_thread_siblings_without_the_cpu_itself_are_unknown(fixture_root, edits, siblings, paths):
    topo = f"{CPU}/cpu1/topology"
    root = edited(fixture_root, POWER9, {f"{topo}/{name}": data for name, data in edits.items()})
    facts = facts_of(root)
    for name in paths:
        assert warned(facts, root, f"{topo}/{name}")
    assert facts["per_cpu"][1]["siblings"] == siblings
    if siblings is None:
        unsure = finding(facts, "siblings_unknown")
        assert unsure["cpus"] == [1] and unsure["nodes"] == [0]
        assert "0-1" not in unsure["message"]


def test_recorded_sibling_lists_are_unchanged(fixture_root):
    facts = facts_of(fixture_root(POWER9))
    assert facts["per_cpu"][1]["siblings"] == [0, 1, 2, 3]
    assert not [w for w in facts["warnings"] if "/devices/system/" in w["path"]]


# ---------------------------------------------------------------------------------------------
# Kernel CPU and node sets the kernel never writes empty


@pytest.mark.parametrize(
    ("rel", "key"),
    [
        (f"{CPU}/online", "online"),  # before: every CPU offline, so no CPU for placements
        (f"{CPU}/possible", "possible"),
        (f"{CPU}/present", "present"),
    ],
)
@pytest.mark.parametrize("content", [b"\n", NULS])
def test_empty_cpu_sets_fall_back_as_if_missing(fixture_root, rel, key, content):
    root = edited(fixture_root, QEMU, {rel: content})
    facts = facts_of(root)
    assert warned(facts, root, rel)
    assert facts["cpus"][key] == [0, 1, 2, 3]
    assert facts["cpus"]["online"] == [0, 1, 2, 3]


@pytest.mark.parametrize("content", [b"\n", NULS])
def test_an_empty_node_online_list_falls_back_to_the_node_directories(fixture_root, content):
    root = edited(fixture_root, QEMU, {f"{NODE}/online": content})
    facts = facts_of(root)
    assert warned(facts, root, f"{NODE}/online")
    assert facts["node_ids"] == [0, 1]  # before: [] and no node at all


def test_an_empty_isolated_list_is_no_warning(fixture_root):
    root = edited(fixture_root, QEMU, {f"{CPU}/isolated": b"\n", f"{CPU}/offline": b"\n"})
    assert facts_of(root)["warnings"] == []


# ---------------------------------------------------------------------------------------------
# Distance rows and hugepage counters


@pytest.mark.parametrize(
    ("rel", "content", "reason"),
    [
        (f"{NODE}/node0/distance", b"10 20 20\n", "has 3 entries for 2 online nodes"),
        (f"{NODE}/node0/distance", b"10\n", "has 1 entries for 2 online nodes"),
        (f"{NODE}/node1/distance", b"10 20\n", "distance 10 to node 0 (want 11-255)"),
        (f"{NODE}/node1/distance", b"20 20\n", "distance 20 to node 1 (want 10-10)"),
        (f"{NODE}/node0/distance", b"10 256\n", "distance 256 to node 1"),
        (f"{NODE}/node0/distance", b"ten twenty\n", "malformed"),  # a warning before too
        (f"{NODE}/node0/distance", NULS, "only NUL bytes"),
    ],
)
def test_a_distance_row_that_cannot_be_lined_up_is_not_used(fixture_root, rel, content, reason):
    root = edited(fixture_root, QEMU, {rel: content})
    facts = facts_of(root)
    assert reason in warned(facts, root, rel)
    nid = int(rel.split("/node")[-1].split("/")[0])
    assert node(facts, nid)["distances"] == []
    assert node(facts, 1 - nid)["distances"] in ([10, 20], [20, 10])


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("nr_hugepages", b"-4\n", "is -4; a page count is never negative"),
        ("free_hugepages", b"-1\n", "is -1"),
        ("nr_hugepages", NULS, "only NUL bytes"),
        ("free_hugepages", b"4\0 2\n", "NUL bytes inside"),  # before: read as 42
    ],
)
def test_hugepage_counters_that_lie_are_unknown(fixture_root, name, content, reason):
    rel = f"{NODE}/node0/hugepages/hugepages-2048kB/{name}"
    root = edited(fixture_root, QEMU, {rel: content})
    facts = facts_of(root)
    assert reason in warned(facts, root, rel)
    (pool,) = [h for h in node(facts, 0)["hugepages"] if h["size_kb"] == 2048]
    assert pool["total" if name == "nr_hugepages" else "free"] is None


# ---------------------------------------------------------------------------------------------
# PCI numa_node naming a node that does not exist


@pytest.mark.parametrize(
    ("local", "want_node", "want_source"),
    [
        (None, None, None),  # recorded local_cpulist 0-3 spans both nodes: stays unknown
        (b"2-3\n", 1, "local_cpulist"),  # as for -1: local CPUs equal exactly node 1's
    ],
)
def test_a_device_on_a_missing_node_has_unknown_locality(
    fixture_root, local, want_node, want_source
):
    nic = f"{PCI}/0000:00:02.0"
    edits = {f"{nic}/numa_node": b"5\n"}
    if local is not None:
        edits[f"{nic}/local_cpulist"] = local
    root = edited(fixture_root, QEMU, edits)
    facts = facts_of(root)
    (device,) = [d for d in facts["pci_devices"] if d["address"] == "0000:00:02.0"]
    assert device["numa_node"] is None  # before: 5, and node 5
    assert (device["node"], device["node_source"]) == (want_node, want_source)
    assert "names node 5, which does not exist (nodes: 0, 1)" in warned(
        facts, root, f"{nic}/numa_node"
    )
    missing = finding(facts, "device_on_missing_node")
    assert missing["nodes"] == [5] and "0000:00:02.0" in missing["message"]
    assert f"{nic}/numa_node" in missing["message"]


def test_gpu_topology_gives_a_gpu_on_a_missing_node_no_node(fixture_root):
    gpu_dir = f"{PCI}/0000:b1:00.0"
    root = edited(
        fixture_root,
        A100,
        {f"{gpu_dir}/numa_node": b"3\n", f"{gpu_dir}/local_cpulist": b"0-127\n"},
    )
    facts = gpu_facts_of(root)
    (entry,) = [g for g in facts["gpus"] if g["address"] == "0000:b1:00.0"]
    assert entry["numa_node"] is None and entry["node"] is None
    assert "names node 3, which does not exist" in warned(facts, root, f"{gpu_dir}/numa_node")


def test_gpu_topology_counts_only_online_nodes(fixture_root):
    # node1 offline: a device claiming node 1 names no node of the online ones.
    root = edited(fixture_root, QEMU, {f"{NODE}/online": b"0\n"})
    assert sorted(topology.read_node_cpus(Reader(f"{root}/sys", f"{root}/proc"))) == [0]


# ---------------------------------------------------------------------------------------------
# The planner: what it does with what the facts mark untrusted


def plan_of(root: str, placements: list, gpus=None, recorded=None) -> dict:
    numa = facts_of(root)
    topo = gpus if gpus is not None else {"gpus": []}
    return plan_host("h", numa, topo, placements, [], POLICY, recorded=recorded)


def p(name: str, **changes) -> dict:
    entry = {"name": name, "exec": "/bin/app", "cpus": 4, "memory": "1G"}
    entry.update(changes)
    return entry


def test_the_plan_leaves_out_a_node_whose_cpulist_lies_and_says_why(fixture_root):
    root = edited(fixture_root, POWER9, {f"{NODE}/node8/cpulist": NULS})
    plan = plan_of(root, [p("a", cpus=4, node=0), p("b", cpus=8)])
    assert [entry["nodes"] for entry in plan["placements"]] == [[0], [0]]
    (warning,) = [w for w in plan["warnings"] if w.startswith("facts: node 8")]
    assert f"{root}/{NODE}/node8/cpulist (holds only NUL bytes" in warning
    assert "gets no placement" in warning
    assert node(plan, 8)["cpus_usable"] == [] and node(plan, 8)["budget_kb"] == 0


def test_a_placement_pinned_to_a_node_whose_cpulist_lies_names_the_file(fixture_root):
    root = edited(fixture_root, POWER9, {f"{NODE}/node8/cpulist": NULS})
    with pytest.raises(PlacementError) as err:
        plan_of(root, [p("a", node=8)])
    text = str(err.value)
    assert "node 8 has no CPUs a placement can use (kind unknown" in text
    assert f"{NODE}/node8/cpulist" in text and "only NUL bytes" in text


def test_a_kept_placement_is_not_moved_off_a_node_whose_cpulist_lies(fixture_root):
    root = fixture_root(POWER9, writable=True)
    # "x" fills node 0's 16 online CPUs, so "a" went to node 8; "x" is removed since.
    before = plan_of(root, [p("x", cpus=16, node=0), p("a", cpus=4)])
    assert before["placements"][1]["nodes"] == [8]
    recorded = parse_recorded(
        "h",
        {"state": "present", "plan": json.loads(plan_record_text(before)), "error": None},
        RECORD,
    )
    with open(os.path.join(root, NODE, "node8", "cpulist"), "wb") as handle:
        handle.write(NULS)
    with pytest.raises(PlanError) as err:  # before: "a" moved to node 0 without a word
        plan_of(root, [p("a", cpus=4)], recorded=recorded)
    text = str(err.value)
    assert "runs on node 8 (the plan applied last)" in text
    assert "would move a running service" in text and "numafleet_repack" in text
    assert f"{NODE}/node8/cpulist" in text


def test_cpus_with_unknown_siblings_are_planned_one_per_core_with_a_warning(fixture_root):
    topo = f"{CPU}/cpu{{}}/topology"
    edits = {}
    for cpu in (0, 1, 2, 3):  # the first core's four threads all lie
        edits[f"{topo.format(cpu)}/thread_siblings_list"] = NULS
        edits[f"{topo.format(cpu)}/thread_siblings"] = NULS
    root = edited(fixture_root, POWER9, edits)
    plan = plan_of(root, [p("a", cpus=2, node=0)])
    (warning,) = [w for w in plan["warnings"] if w.startswith("facts: CPUs")]
    assert warning.startswith("facts: CPUs 0-3 have unknown SMT siblings")
    assert plan["placements"][0]["cpus"] == [0, 1]


def test_a_gpu_on_a_missing_node_is_placed_as_unknown_with_a_warning(fixture_root):
    gpu_dir = f"{PCI}/0000:b1:00.0"
    root = edited(
        fixture_root,
        A100,
        {f"{gpu_dir}/numa_node": b"3\n", f"{gpu_dir}/local_cpulist": b"0-127\n"},
    )
    gpus = json.loads(json.dumps(gpu_facts_of(root)))
    plan = plan_of(root, [p("a", cpus=4, node=0, gpus=3)], gpus=gpus)
    (entry,) = plan["placements"]
    assert "0000:b1:00.0" in [g["address"] for g in entry["gpus"]]
    assert any(
        "GPU 0000:b1:00.0 has unknown NUMA locality" in w for w in entry["warnings"]
    )  # before: given to node 0's placement as if on "node 3", without a word


def test_the_planner_takes_a_gpu_on_a_node_it_does_not_know_as_unknown(fixture_root):
    # Facts gathered before this check (or edited) still say node 3: the planner does not trust it.
    root = fixture_root(A100)
    gpus = json.loads(json.dumps(gpu_facts_of(root)))
    for entry in gpus["gpus"]:
        if entry["address"] == "0000:b1:00.0":
            entry["node"] = entry["numa_node"] = 3
    plan = plan_of(root, [p("a", cpus=4, node=0, gpus=3)], gpus=gpus)
    (entry,) = plan["placements"]
    assert any("GPU 0000:b1:00.0 has unknown NUMA locality" in w for w in entry["warnings"])


# ---------------------------------------------------------------------------------------------
# The whole class: every file the readers use, replaced by NUL bytes, is a warning naming it


@pytest.mark.parametrize("machine", [QEMU, POWER9])
def test_every_file_read_as_nul_bytes_is_a_warning_naming_it(fixture_root, machine):
    root = fixture_root(machine, writable=True)
    reader = Reader(f"{root}/sys", f"{root}/proc")
    read_numa_facts(reader)
    gpu.read_gpus(reader, topology.read_node_cpus(reader))
    files = sorted(p for p in reader.accessed if os.path.isfile(p) and not os.path.islink(p))
    assert len(files) > 20
    silent = []
    for path in files:
        with open(path, "rb") as handle:
            saved = handle.read()
        try:
            with open(path, "wb") as handle:
                handle.write(NULS)
            facts = read_numa_facts(Reader(f"{root}/sys", f"{root}/proc"))
            if not any(w["path"] == path for w in facts["warnings"]):
                silent.append(os.path.relpath(path, root))
        finally:
            with open(path, "wb") as handle:
                handle.write(saved)
    assert silent == []


# ---------------------------------------------------------------------------------------------
# Verify: a GPU's numa_node read on the host is held to the same rule


@pytest.mark.parametrize(("claimed", "want"), [(b"1\n", 1), (b"6\n", None), (NULS, None)])
def test_verify_takes_a_gpu_on_a_missing_node_as_unknown(fixture_root, claimed, want):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import locality

    # 0000:81:00.0 is on node 1 in the recorded guest; node 6 does not exist there.
    root = edited(fixture_root, QEMU, {f"{PCI}/0000:81:00.0/numa_node": claimed})
    reader = Reader(f"{root}/sys", "")
    # before: node 6, judged "not next to the placement's memory" (ok False)
    assert locality._gpu_node(reader, {"address": "0000:81:00.0", "node": 1}) == want


@pytest.mark.parametrize(
    ("rel", "content"),
    [
        (f"{NODE}/node1/cpulist", b"2-3,200\n"),  # CPU 200 of a guest with possible 0-3
        (f"{NODE}/node1/cpulist", b"2-9\n"),
    ],
)
def test_a_node_cpulist_beyond_the_possible_cpus_is_unknown(fixture_root, rel, content):
    root = edited(fixture_root, QEMU, {rel: content})
    facts = facts_of(root)
    assert "beyond the possible CPUs 0-3" in warned(facts, root, rel)
    assert node(facts, 1)["kind"] == "unknown" and node(facts, 1)["cpus"] == []
    assert finding(facts, "cpus_without_node")["cpus"] == [2, 3]


def test_a_device_on_a_missing_node_is_named_in_the_plan_warnings(fixture_root):
    """Before: only the facts said so; site.yml printed nothing."""
    nic = f"{PCI}/0000:00:02.0"
    root = edited(
        fixture_root, QEMU, {f"{nic}/numa_node": b"5\n", f"{nic}/local_cpulist": b"2-3\n"}
    )
    plan = plan_of(root, [p("a", cpus=1, memory="64M")])
    (warning,) = [w for w in plan["warnings"] if "0000:00:02.0" in w]
    assert warning.startswith("facts: PCI device 0000:00:02.0")
    assert f"{nic}/numa_node" in warning and "which does not exist" in warning
