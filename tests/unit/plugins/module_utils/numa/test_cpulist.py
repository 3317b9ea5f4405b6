"""cpulist / cpumask parsing and formatting (lib/bitmap.c formats)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import (
    format_cpulist,
    format_cpumask,
    parse_cpulist,
    parse_cpumask,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import CpulistError

LISTS = [
    ("", []),
    ("\n", []),
    ("(null)\n", []),  # nohz_full on 6.1 kernels when unset
    ("0", [0]),
    ("0-3", [0, 1, 2, 3]),
    ("0-3,8", [0, 1, 2, 3, 8]),
    ("8,0-3", [0, 1, 2, 3, 8]),
    ("0-3\n\x00", [0, 1, 2, 3]),  # ARM sysfs files end in "\n\0"
    ("\x000-1", [0, 1]),
    ("0-7:2/4", [0, 1, 4, 5]),  # first 2 CPUs of every group of 4
    ("0-15:1/8", [0, 8]),
    ("4-9:3/3", [4, 5, 6, 7, 8, 9]),
    ("0-6:2/4", [0, 1, 4, 5]),
    ("1023", [1023]),
    ("0, 2", [0, 2]),
]


@pytest.mark.parametrize(("text", "cpus"), LISTS)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


BAD_LISTS = [
    ("3-1", "runs backwards"),
    ("a", "not a CPU number"),
    ("0,,2", "empty item"),
    ("0-3:2", "must be used/group"),
    ("0-7:5/4", "0 < used <= group"),
    ("0-7:0/4", "0 < used <= group"),
    ("-1", "not a CPU number"),
    ("99999999", "beyond"),
]


@pytest.mark.parametrize(("text", "reason"), BAD_LISTS)
def test_parse_cpulist_rejects_with_reason(text, reason):
    with pytest.raises(CpulistError) as err:
        parse_cpulist(text)
    assert reason in str(err.value)
    assert repr(text) in str(err.value)


MASKS = [
    ("0", []),
    ("f", [0, 1, 2, 3]),
    ("3", [0, 1]),
    ("c\n", [2, 3]),
    ("00000000,0000ffff", list(range(16))),
    ("ff,00000000", list(range(32, 40))),  # short first word
    ("1,,00000001", [0, 64]),  # an empty field is a zero word
    ("00000000,00000000,00000000,0000000f\n\x00", [0, 1, 2, 3]),
    # 1024-CPU mask (kernel NR_CPUS > 512): 32 words, highest CPU set
    ("80000000" + ",00000000" * 31, [1023]),
]


@pytest.mark.parametrize(("text", "cpus"), MASKS)
def test_parse_cpumask(text, cpus):
    assert parse_cpumask(text) == cpus


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("xyz", "not hexadecimal"),
        ("123456789", "longer than 32 bits"),
        ("-1", "not hexadecimal"),  # int("-1", 16) is -1: shifting it right never ends
        ("+f", "not hexadecimal"),
        ("f_f", "not hexadecimal"),
    ],
)
def test_parse_cpumask_rejects(text, reason):
    with pytest.raises(CpulistError) as err:
        parse_cpumask(text)
    assert reason in str(err.value)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([], ""), ([0], "0"), ([0, 1, 2, 3, 8], "0-3,8"), ([5, 3, 4, 4], "3-5"), ([1, 3], "1,3")],
)
def test_format_cpulist(cpus, text):
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([], "0"), ([0, 1], "3"), ([32], "1,00000000"), ([0, 63], "80000000,00000001")],
)
def test_format_cpumask(cpus, text):
    assert format_cpumask(cpus) == text


CPU_SETS = st.lists(st.integers(min_value=0, max_value=4095), max_size=200)


@given(CPU_SETS)
def test_cpulist_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == sorted(set(cpus))


@given(CPU_SETS)
def test_cpumask_round_trip(cpus):
    assert parse_cpumask(format_cpumask(cpus)) == sorted(set(cpus))


@given(st.text(max_size=40))
def test_garbage_raises_only_cpulist_error(text):
    for parse in (parse_cpulist, parse_cpumask):
        try:
            parse(text)
        except CpulistError:
            pass
