"""numa_facts' controller side: which cached facts answer a task, so that no module is sent."""

from __future__ import annotations

import pytest

from ansible_collections.numafleet.tuning.plugins.action.numa_facts import cached_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import FACTS_VERSION

NUMA = {
    "sysfs_root": "/srv/rec/sys",
    "procfs_root": "/srv/rec/proc",
    "nodes": [],
    "facts_version": FACTS_VERSION,
}
RECORDED = {"root": "/srv/render/h", "kind": "absent", "files": {}}
FACTS = {
    "numa": NUMA,
    "gpu_topology": {"gpus": []},
    "numafleet_recorded": RECORDED,
    "numafleet_state_paths": [],
}
SITE = {
    "sysfs_root": "/srv/rec/sys",
    "procfs_root": "/srv/rec/proc",
    "gpu": True,
    "state_root": "/srv/render/h/",
}


def test_the_facts_site_yml_asks_for_come_from_the_cache():
    assert cached_facts(SITE, FACTS) == FACTS


@pytest.mark.parametrize(
    ("change", "facts"),
    [
        ({"sysfs_root": "/sys"}, FACTS),
        ({"procfs_root": "/proc"}, FACTS),
        ({"state_root": "/srv/render/other"}, FACTS),
        ({"state_root": "relative"}, FACTS),
        ({"state_paths": ["/etc/numafleet/mig.json"]}, FACTS),
        ({"gpu_snapshot_out": "/tmp/snap.json"}, FACTS),
        ({}, {k: v for k, v in FACTS.items() if k != "gpu_topology"}),
        ({}, {k: v for k, v in FACTS.items() if k != "numafleet_recorded"}),
        ({}, {k: v for k, v in FACTS.items() if k != "numafleet_state_paths"}),
        ({}, {}),
    ],
    ids=[
        "other-sysfs", "other-procfs", "other-root", "relative-root", "state-paths",
        "snapshot-out", "no-gpu-facts", "no-recorded", "no-state-paths", "nothing",
    ],
)  # fmt: skip
def test_anything_missing_or_read_elsewhere_runs_the_module(change, facts):
    assert cached_facts(dict(SITE, **change), facts) is None


def test_without_gpu_or_state_only_the_numa_facts_are_needed():
    args = {"sysfs_root": "/srv/rec/sys", "procfs_root": "/srv/rec/proc"}
    assert cached_facts(args, {"numa": NUMA}) == {"numa": NUMA}


@pytest.mark.parametrize("version", [None, 1, FACTS_VERSION + 1, "2"])
def test_cached_facts_of_another_format_are_gathered_again(version):
    # facts a fact cache kept from an older release lack allowed, pid1
    # and kernel.osrelease; answering with them skipped the allowed cpuset and the kernel check.
    numa = {k: v for k, v in NUMA.items() if k != "facts_version"}
    if version is not None:
        numa["facts_version"] = version
    assert cached_facts(SITE, dict(FACTS, numa=numa)) is None
    assert cached_facts(SITE, dict(FACTS, numa=dict(numa, facts_version=FACTS_VERSION))) == dict(
        FACTS, numa=dict(numa, facts_version=FACTS_VERSION)
    )
