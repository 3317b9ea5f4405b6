"""The placement key partition and numafleet_gpu_partitions (issue 24): shape checks only; the
GPUs' modes and vendors are the planner's, against the facts."""

from __future__ import annotations

import re

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import PlacementError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.placements import (
    MIG_GPUS_DEPRECATED,
    AmdPartitionDecl,
    MigGpu,
    MigInstance,
    gpu_partitions_input,
    parse_gpu_partitions,
    parse_mig_gpus,
    parse_placements,
    parse_tenants,
)

HOST = "mi300x-01"


def placement(**changes) -> dict:
    entry = {"name": "small-0", "exec": "/opt/vllm/bin/serve --port 8000", "cpus": 4}
    entry.update(changes)
    return entry


def parse(entry):
    return parse_placements(HOST, [entry], parse_tenants(HOST, []))[0]


# -- placement key partition --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"), [("cpx", "CPX"), ("CPX", "CPX"), (" qpx ", "QPX"), ("Dpx", "DPX")]
)
def test_partition_is_stored_upper_case(given, stored):
    assert parse(placement(partition=given)).partition == stored


def test_no_partition_is_none():
    assert parse(placement(gpus=1)).partition is None


def test_partition_with_one_listed_gpu_selects_it():
    got = parse(placement(partition="cpx", gpus=["0000:43:00.0"]))
    assert (got.partition, got.gpu_ids) == ("CPX", ("0000:43:00.0",))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("spx", r"spx is the whole GPU: write gpus: 1 instead"),
        ("xpx", r"'xpx' is not an AMD compute partition mode"),
        (8, r"8 is not an AMD compute partition mode"),
        ("", r"write one of dpx, tpx, qpx, cpx"),
    ],
)
def test_partition_refuses_other_values(value, text):
    with pytest.raises(PlacementError, match=text) as err:
        parse(placement(partition=value))
    assert r"numafleet_placements[0] (small-0).partition" in str(err.value)
    assert str(err.value).startswith(f"host {HOST}: ")


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"mig_profile": "1g.10gb"}, "partition (AMD) and mig_profile (NVIDIA)"),
        ({"mps": {}}, "MPS is NVIDIA only; remove mps:"),
        ({"gpus": 2}, "partition asks for one logical GPU; drop gpus: 2"),
        ({"gpus": ["0000:43:00.0", "0000:63:00.0"]}, "list exactly one GPU in gpus"),
    ],
)
def test_partition_excludes_mig_mps_and_several_gpus(changes, text):
    with pytest.raises(PlacementError, match=re.escape(text)):
        parse(placement(partition="cpx", **changes))


# -- numafleet_gpu_partitions --------------------------------------------------------------------


def test_both_vendors_in_one_list():
    nvidia, amd = parse_gpu_partitions(
        HOST,
        [
            {"gpu": "0000:17:00.0", "mode": "enabled", "layout": ["3g.40gb"]},
            {"gpu": "0000:E3:00.0", "compute_partition": "spx", "memory_partition": "nps1"},
            {"gpu": "0000:43:00.0", "compute_partition": "CPX"},
        ],
    )
    assert nvidia == [
        MigGpu(
            0,
            "0000:17:00.0",
            "enabled",
            (MigInstance("3g.40gb", None, None),),
            "numafleet_gpu_partitions",
        )
    ]
    assert amd == [
        AmdPartitionDecl(1, "0000:e3:00.0", "SPX", "NPS1"),
        AmdPartitionDecl(2, "0000:43:00.0", "CPX", None),
    ]
    assert amd[0].where == "numafleet_gpu_partitions[1]"


def test_an_entry_of_both_vendors_is_refused():
    with pytest.raises(PlacementError, match=r"numafleet_gpu_partitions\[0\]: mode \(NVIDIA MIG\)"):
        parse_gpu_partitions(
            HOST, [{"gpu": "0000:43:00.0", "mode": "enabled", "compute_partition": "CPX"}]
        )


@pytest.mark.parametrize(
    ("entry", "text"),
    [
        (
            {"gpu": "0000:43:00.0", "compute_partition": "XPX"},
            r"compute_partition: 'XPX' is not one of SPX",
        ),
        ({"gpu": "0000:43:00.0", "memory_partition": 4}, r"memory_partition: 4 is not one of NPS1"),
        ({"compute_partition": "CPX"}, r"\.gpu: None is not a GPU"),
        ({"gpu": "0000:43:00.0", "nps": "NPS4"}, r"unknown key 'nps'"),
    ],
)
def test_amd_entries_are_checked(entry, text):
    with pytest.raises(PlacementError, match=text):
        parse_gpu_partitions(HOST, [entry])


def test_a_gpu_declared_twice_is_refused():
    with pytest.raises(
        PlacementError, match=r"\[1\]\.gpu: 0000:43:00.0 is also numafleet_gpu_partitions\[0\]"
    ):
        parse_gpu_partitions(
            HOST,
            [
                {"gpu": "0000:43:00.0", "compute_partition": "CPX"},
                {"gpu": "0000:43:00.0", "mode": "enabled"},
            ],
        )


def test_the_old_variable_takes_no_amd_keys():
    with pytest.raises(
        PlacementError, match=r"numafleet_mig_gpus\[0\]: unknown key 'compute_partition'"
    ):
        parse_mig_gpus(HOST, [{"gpu": "0000:43:00.0", "compute_partition": "CPX"}])


# -- numafleet_mig_gpus, deprecated --------------------------------------------------------------

MIG = [{"gpu": "0000:17:00.0", "mode": "enabled"}]


def test_the_old_variable_alone_works_with_a_warning():
    assert gpu_partitions_input(HOST, [], MIG) == (MIG, [MIG_GPUS_DEPRECATED])
    assert MIG_GPUS_DEPRECATED == (
        "numafleet_mig_gpus is deprecated: rename it numafleet_gpu_partitions (same keys)"
    )


@pytest.mark.parametrize("unset", [None, []])
def test_the_new_variable_alone_has_no_warning(unset):
    assert gpu_partitions_input(HOST, MIG, unset) == (MIG, [])
    assert gpu_partitions_input(HOST, unset, unset) == ([], [])


def test_both_variables_are_refused_naming_host_both_and_the_fix():
    with pytest.raises(PlacementError) as err:
        gpu_partitions_input(HOST, MIG, MIG)
    text = str(err.value)
    assert text.startswith(
        f"host {HOST}: numafleet_gpu_partitions and numafleet_mig_gpus are both set"
    )
    assert "move its entries into numafleet_gpu_partitions and remove numafleet_mig_gpus" in text
