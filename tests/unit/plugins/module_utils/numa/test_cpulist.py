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
    # The last group of a stride is cut at the end of the range, not dropped.
    ("0-4:2/4", [0, 1, 4]),
    ("0-8:1/4", [0, 4, 8]),
    ("0-3:1/1", [0, 1, 2, 3]),  # a group of one: every CPU
    # Plain lists out of order, repeated or overlapping come back sorted and unique.
    ("3,1,3", [1, 3]),
    ("2,2", [2]),
    ("0-3,3-5", [0, 1, 2, 3, 4, 5]),
    ("1048575", [1048575]),  # MAX_CPUS - 1, the highest CPU number taken
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


@pytest.mark.parametrize("text", ["1048576", "0,1048576", "0-1048576", "1048576-1048577"])
def test_parse_cpulist_refuses_cpu_numbers_from_max_cpus(text):
    """CPU numbers stop at MAX_CPUS - 1 (2**20 - 1), on the plain-list path too."""
    with pytest.raises(CpulistError, match="CPU 1048576 is beyond 1048575"):
        parse_cpulist(text)


@pytest.mark.parametrize("text", ["", "\n", "\x00"])
def test_parse_cpumask_empty_is_no_cpus(text):
    assert parse_cpumask(text) == []


def test_parse_cpumask_width_limit():
    """A mask of 2**20 bits (32768 words) is taken; one word more is refused, naming the limit."""
    widest = ",".join(["1"] + ["0"] * 32767)
    assert parse_cpumask(widest) == [1048544]
    with pytest.raises(CpulistError, match="mask wider than 1048576 CPUs"):
        parse_cpumask("0," + widest)


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
