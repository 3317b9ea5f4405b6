"""Host variables of the planner: parsing, sizes, exec splitting and every validation message."""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    PlacementError,
    PlanError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.placements import (
    PLACEMENT_KEYS,
    Hugepages,
    MigInstance,
    Mps,
    format_kb,
    parse_hugepages_extra,
    parse_mig_gpus,
    parse_placements,
    parse_policy,
    parse_size_kb,
    parse_tenants,
)

HOST = "gpu-a100-01"
TENANTS = [{"name": "team-a", "memory_max": "200G"}, {"name": "team_b"}]


def placement(**changes) -> dict:
    entry = {"name": "llm", "exec": "/opt/llm/bin/serve --port 8000", "cpus": 4}
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not None}


def parse(*entries, tenants=None):
    tenants = TENANTS if tenants is None else tenants
    return parse_placements(HOST, list(entries), parse_tenants(HOST, tenants))


# ---------------------------------------------------------------------------------------------
# Sizes


@pytest.mark.parametrize(
    ("text", "kb"),
    [
        (0, 0),
        ("0", 0),
        (1024, 1),
        (1025, 2),  # bytes round up to whole KiB
        ("512M", 512 * 1024),
        ("64G", 64 << 20),
        ("64g", 64 << 20),
        ("64GiB", 64 << 20),
        ("64gib", 64 << 20),
        ("64GB", 64 << 20),  # binary multipliers, like systemd MemoryMax=
        ("1.5G", 1572864),
        ("2048K", 2048),
        ("2048KiB", 2048),
        ("1T", 1 << 30),
        ("4096", 4),
        ("4096B", 4),
        (" 8G ", 8 << 20),
    ],
)
def test_sizes_become_kib(text, kb):
    assert parse_size_kb(text) == kb


@pytest.mark.parametrize(
    "text", ["64 gigs", "", "G", "-1G", -1, "1.2.3G", "5X", "10iB", True, None, 1.5, "0x10"]
)
def test_things_that_are_not_sizes(text):
    assert parse_size_kb(text) is None


# The size grammar alone, without the quick path parse_size_kb takes for "64G" and "512M".
_GRAMMAR = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(i?))?(b?)$", re.IGNORECASE)


def _size_by_grammar(text: str):
    match = _GRAMMAR.match(text.strip())
    if not match:
        return None
    number, prefix, binary, dummy = match.groups()
    if binary and not prefix:
        return None
    amount = (
        Fraction(number)
        * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[(prefix or "").lower()]
    )
    return -(-amount.numerator // (amount.denominator * 1024))


@pytest.mark.parametrize(
    ("text", "kb"),
    [
        ("2\u212a", 2),  # KELVIN SIGN: the grammar's [k] matches it ignoring case
        ("\uff12G", None),  # a fullwidth digit is a digit to str.isdigit, not to the grammar
        ("\u0663G", None),  # so is an Arabic-Indic one
        ("+2G", None),
        ("-2G", None),
        ("007M", 7 << 10),
        (" 2G\n", 2 << 20),
        ("2 G", 2 << 20),
        ("G", None),
        ("9" * 30 + "T", int("9" * 30) << 30),
    ],
)
def test_quick_sizes_agree_with_the_grammar(text, kb):
    assert parse_size_kb(text) == kb == _size_by_grammar(text)


@given(st.text(alphabet="0123456789.kKmMgGtTiIbB \t\u212a\uff12\u0663+-", max_size=8))
def test_every_size_text_reads_as_the_grammar_says(text):
    assert parse_size_kb(text) == _size_by_grammar(text)


@pytest.mark.parametrize(
    ("kb", "text"),
    [
        (0, "0 KiB"),
        (2048, "2 MiB"),
        (199337984, "190.1 GiB"),
        (1 << 30, "1 TiB"),
        (1536, "1.5 MiB"),
    ],
)
def test_format_kb(kb, text):
    assert format_kb(kb) == text


# ---------------------------------------------------------------------------------------------
# What a good placement turns into


def test_full_placement_parses_into_its_dataclass():
    (got,) = parse(
        placement(
            tenant="team-a",
            user="llm",
            group="llm",
            description="LLM server",
            gpus=["0000:17:00.0", "GPU-abc"],
            cpus="4-7,68-71",
            node=0,
            memory="64G",
            hugepages={"size": "2M", "count": 8192},
            environment={"HF_HOME": "/srv/hf", "PORT": 8000},
            allow_span=True,
            hardening=False,
        )
    )
    assert got.argv == ("/opt/llm/bin/serve", "--port", "8000")
    assert (got.gpu_count, got.gpu_ids) == (2, ("0000:17:00.0", "GPU-abc"))
    assert (got.cpu_count, got.cpu_list) == (8, (4, 5, 6, 7, 68, 69, 70, 71))
    assert got.memory_kb == 64 << 20
    assert got.hugepages == Hugepages(2048, 8192)
    assert got.environment == (("HF_HOME", "/srv/hf"), ("PORT", "8000"))
    assert (got.allow_span, got.hardening, got.node) == (True, False, 0)
    assert got.where == "numafleet_placements[0] (llm)"
    assert (got.tenant, got.user, got.group, got.description) == (
        "team-a",
        "llm",
        "llm",
        "LLM server",
    )
    # every field is set, so asdict (and the plan built from it) sees each one
    assert set(dataclasses.asdict(got)) == {f.name for f in dataclasses.fields(got)}


def test_defaults():
    (got,) = parse(placement())
    assert (got.gpu_count, got.gpu_ids, got.memory_kb, got.hugepages) == (0, None, 0, None)
    assert (got.node, got.near) == (None, None)
    assert got.description == "numafleet placement llm"
    assert (got.allow_span, got.hardening, got.mps, got.mig_profile) == (False, None, None, None)
    assert parse_placements(HOST, None, []) == []
    assert parse_tenants(HOST, None) == []


@pytest.mark.parametrize(
    ("given", "ids"),
    [
        (["B1:00.0"], ("b1:00.0",)),  # the short form the plan summary prints, any case
        (["0000:B1:00.0", "ca:00.0"], ("0000:b1:00.0", "ca:00.0")),
        (["GPU-ABC"], ("GPU-ABC",)),  # UUIDs are kept as written
    ],
)
def test_gpu_addresses_are_lower_cased_short_or_full(given, ids):
    (got,) = parse(placement(gpus=given))
    assert got.gpu_ids == ids


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("0000:4b:00.0", "0000:4b:00.0"),
        ("0000:4B:00.0", "0000:4b:00.0"),  # any case, like gpus:
        ("4b:00.0", "4b:00.0"),  # the short form; the planner matches it against the facts
        ("65:00.1", "65:00.1"),
        (" 4B:00.7 ", "4b:00.7"),
        ("10000:00:02.0", "10000:00:02.0"),  # a 32-bit domain (VMD, Hyper-V)
    ],
)
def test_near_takes_one_pci_address_full_or_short(given, address):
    (got,) = parse(placement(near=given))
    assert got.near == address
    assert got.node is None  # the node comes from the facts, in the planner


def test_near_and_node_may_both_be_written():
    (got,) = parse(placement(near="4b:00.0", node=0, gpus=1))
    assert (got.near, got.node, got.gpu_count) == ("4b:00.0", 0, 1)


def test_sizes_of_a_mebibyte_and_zero_are_accepted():
    got = parse(
        placement(name="a", memory=0),
        placement(name="b", memory=1 << 20),
        placement(name="c", memory="1M", gpus=1, mps={"pinned_memory_limit": "1024K"}),
    )
    assert [entry.memory_kb for entry in got] == [0, 1024, 1024]
    assert got[2].mps.pinned_memory_limit_kb == 1024


def test_unit_placements_have_no_argv():
    (got,) = parse(placement(exec=None, unit="vllm.service"))
    assert (got.unit, got.exec, got.argv) == ("vllm.service", None, ())


@pytest.mark.parametrize(
    ("text", "argv"),
    [
        ("/usr/bin/python3 -m app", ("/usr/bin/python3", "-m", "app")),
        ("python3 -c 'print(1)'", ("python3", "-c", "print(1)")),
        ('/bin/sh -c "echo $HOME; exit 0"', ("/bin/sh", "-c", "echo $HOME; exit 0")),
        ("/opt/app --rate 100%", ("/opt/app", "--rate", "100%")),  # % and $ escaped at render time
        ("/opt/app a\\ b", ("/opt/app", "a b")),
        ("/opt/app --x=';'", ("/opt/app", "--x=;")),
    ],
)
def test_exec_is_split_like_a_posix_shell(text, argv):
    (got,) = parse(placement(exec=text))
    assert got.argv == argv


def test_mps_and_mig_values():
    got = parse(
        placement(
            name="a", gpus=1, mps={"active_thread_percentage": 40, "pinned_memory_limit": "8G"}
        ),
        placement(name="b", mig_profile="1g.10gb", mps={}),
        placement(name="c", mig_profile="1g.10gb", gpus=["0000:17:00.0"]),
        placement(name="d", gpus=1, mps=True),
    )
    assert got[0].mps == Mps(40, 8 << 20)
    assert got[1].mps == Mps(None, None)
    assert got[2].mig_profile == "1g.10gb"
    assert got[3].mps == Mps(None, None)


def test_tenants():
    got = parse_tenants(
        HOST, [{"name": "a", "memory_max": "infinity"}, {"name": "b-2", "memory_max": "1G"}]
    )
    assert [(t.name, t.memory_max_kb, t.description) for t in got] == [
        ("a", None, "numafleet tenant a"),
        ("b-2", 1 << 20, "numafleet tenant b-2"),
    ]


@pytest.mark.parametrize(
    ("raw", "reserved", "headroom"),
    [
        (None, (), 15),
        ({}, (), 15),
        ({"reserved_cpus": "0-1", "memory_headroom_pct": 0}, (0, 1), 0),
        ({"reserved_cpus": [3, 1], "memory_headroom_pct": 90}, (1, 3), 90),
        ({"reserved_cpus": 2}, (2,), 15),
        ({"reserved_cpus": None, "memory_headroom_pct": None}, (), 15),
        ({"reserved_cpus": ["0", "64"]}, (0, 64), 15),  # digit strings in the list, too
        ({"reserved_cpus": [64, " 0", 0]}, (0, 64), 15),
        ({"reserved_cpus": []}, (), 15),
    ],
)
def test_policy(raw, reserved, headroom):
    got = parse_policy(HOST, raw)
    assert (got.reserved_cpus, got.memory_headroom_pct) == (reserved, headroom)


# ---------------------------------------------------------------------------------------------
# Every error has its own message: host, variable path, what is wrong and the fix

P0 = "host gpu-a100-01: numafleet_placements[0] (llm)"

BAD_PLACEMENTS = [
    ("unknown key", placement(gpu=2), f"{P0}: unknown key 'gpu'; allowed keys: name, tenant"),
    ("not a mapping", "llm", "numafleet_placements[0]: 'llm' is not a mapping"),
    ("missing name", placement(name=None), "numafleet_placements[0]: name is missing; add name:"),
    (
        "bad name",
        placement(name="LLM 70b"),
        "numafleet_placements[0].name: 'LLM 70b' is not a valid name",
    ),
    ("name too long", placement(name="a" * 64), "is not a valid name; use 1-63"),
    (
        "neither",
        placement(exec=None),
        f"{P0} needs exactly one of exec (a new service) or unit (an existing service to pin with a drop-in); it has neither",
    ),
    ("both", placement(unit="x.service"), "it has both"),
    (
        "user with unit",
        placement(exec=None, unit="x.service", user="llm"),
        f"{P0}: user only applies to exec placements (user/group with unit:); set User= in x.service",
    ),
    (
        "group with unit",
        placement(exec=None, unit="x.service", group="llm"),
        f"{P0}: group only applies to exec placements (user/group with unit:); set Group= in x.service itself",
    ),
    (
        "bad unit",
        placement(exec=None, unit="x.socket"),
        f"{P0}.unit: 'x.socket' is not a service unit name",
    ),
    (
        "generated unit",
        placement(exec=None, unit="numafleet-llm.service"),
        f"{P0}.unit: numafleet-llm.service is a unit this collection generates "
        "(numafleet-*.service, one per exec placement); pin your own service's unit, or give "
        "this placement exec: and let the collection write its unit",
    ),
    (
        "hardening with unit",
        placement(exec=None, unit="x.service", hardening=True),
        f"{P0}: hardening only applies to exec placements (hardening with unit:); a drop-in "
        "does not change the sandboxing settings of x.service: remove hardening, or change "
        "x.service itself",
    ),
    (
        "description with unit",
        placement(exec=None, unit="x.service", description="X"),
        f"{P0}: description only applies to exec placements (description with unit:); a "
        "drop-in does not change Description= of x.service: remove description, or change "
        "x.service itself",
    ),
    (
        "template unit",
        placement(exec=None, unit="vllm@.service"),
        f"{P0}.unit: vllm@.service is a template, not a unit that runs; pin an instance such "
        "as vllm@1.service",
    ),
    (
        "MPS daemon unit",
        placement(exec=None, unit="nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service"),
        f"{P0}.unit: nvidia-mps@GPU-fdb5df64-11ce-5c72-a560-9702875cecd6.service is an MPS "
        "control daemon, which this collection runs and pins itself",
    ),
    (
        "name is a number",
        placement(name=123),
        'numafleet_placements[0].name: 123 is a number, not a string; quote it in YAML (name: "123")',
    ),
    (
        "name is a boolean",
        placement(name=True),
        "numafleet_placements[0].name: True is not a string; write a name such as llm",
    ),
    ("bad user", placement(user="Root User"), f"{P0}.user: 'Root User' is not a valid user name"),
    ("bad group", placement(group="9x"), f"{P0}.group: '9x' is not a valid group name"),
    ("bad cpulist", placement(cpus="4-x"), f"{P0}.cpus: invalid CPU set '4-x'"),
    ("backwards cpulist", placement(cpus="7-4"), "runs backwards; write a count (8) or a cpulist"),
    ("empty cpulist", placement(cpus=""), f"{P0}.cpus: '' names no CPU"),
    ("cpus zero", placement(cpus=0), f"{P0}.cpus: 0 is below 1; ask for at least one CPU"),
    ("cpus missing", placement(cpus=None), f"{P0}: cpus is required"),
    ("cpus float", placement(cpus=2.5), f"{P0}.cpus: 2.5 is neither a count nor a cpulist"),
    (
        "cpus quoted number",
        placement(cpus="4"),
        f"{P0}.cpus: '4' is ambiguous (a quoted number: a count, or CPU 4 alone?); write cpus: 4 "
        'for a count of 4 CPUs, or a cpulist like "4,68" / "4-5" to pin CPUs ("4-4" pins CPU 4 '
        "alone)",
    ),
    (
        "cpus quoted zero",
        placement(cpus=" 0 "),
        f"{P0}.cpus: ' 0 ' is ambiguous (a quoted number: a count, or CPU 0 alone?); a count is "
        'at least 1; write a cpulist like "0,64" / "0-1" to pin CPUs ("0-0" pins CPU 0 alone)',
    ),
    (
        "bad size",
        placement(memory="64 gigs"),
        f"{P0}.memory: '64 gigs' is not a size; write e.g. 64G or 512M",
    ),
    (
        "memory in bytes",
        placement(memory=64),
        f"{P0}.memory: 64 is 64 bytes; write 64G or 64M (a number without a unit counts bytes, "
        "and sizes under 1 MiB are refused as a slip)",
    ),
    ("memory in bytes, quoted", placement(memory="1000"), f"{P0}.memory: 1000 is 1000 bytes;"),
    (
        "memory under a MiB",
        placement(memory="512K"),
        f"{P0}.memory: '512K' is under 1 MiB, too small to be meant; write the size in M or G, "
        "e.g. 512M",
    ),
    (
        "bad hugepage size",
        placement(hugepages={"size": "3M", "count": 1}),
        f"{P0}.hugepages.size: '3M' is not a hugepage size",
    ),
    (
        "hugepage size not a size",
        placement(hugepages={"size": "big", "count": 1}),
        "'big' is not a hugepage size",
    ),
    (
        "hugepage count zero",
        placement(hugepages={"size": "2M", "count": 0}),
        f"{P0}.hugepages.count: 0 is not a count >= 1",
    ),
    ("hugepage count missing", placement(hugepages={"size": "2M"}), "None is not a count >= 1"),
    (
        "hugepage key",
        placement(hugepages={"size": "2M", "count": 1, "node": 0}),
        f"{P0}.hugepages: unknown key 'node'; allowed keys: size, count",
    ),
    ("hugepages not a mapping", placement(hugepages="2M"), f"{P0}.hugepages: write a mapping"),
    (
        "unknown tenant",
        placement(tenant="team-c"),
        f"{P0}.tenant: 'team-c' is not in numafleet_tenants (team-a, team_b)",
    ),
    (
        "bad env key",
        placement(environment={"1X": "a"}),
        f"{P0}.environment: '1X' is not a variable name",
    ),
    ("env not a mapping", placement(environment=["A=1"]), f"{P0}.environment: write a mapping"),
    (
        "env sets CUDA_VISIBLE_DEVICES",
        placement(environment={"CUDA_VISIBLE_DEVICES": "0"}),
        f"{P0}.environment sets CUDA_VISIBLE_DEVICES, which the planner sets",
    ),
    (
        "env newline",
        placement(environment={"A": "x\ny"}),
        f"{P0}.environment.A contains a control character or newline",
    ),
    (
        "env value list",
        placement(environment={"A": ["x"]}),
        f"{P0}.environment.A: ['x'] is not a string",
    ),
    (
        "exec newline",
        placement(exec="/bin/a\n/bin/b"),
        f"{P0}.exec contains a control character or newline",
    ),
    (
        "exec tab",
        placement(exec="/bin/a\tb"),
        f"{P0}.exec contains a control character or newline (a tab at character 7 of "
        "'/bin/a\\tb'); write it on one line without control characters",
    ),
    (
        "exec tab in a late argument",
        placement(exec="/opt/llm/bin/serve --model /srv/models/llama-3-70b --port 8000 --sep '\t'"),
        '(a tab at character 71 of "/opt/llm/bin/serve --model /srv/models/llama-3-70b --port '
        "8000 --sep '\\t'\")",
    ),
    (
        "exec escape in a long line",
        placement(exec="/bin/a " + "x" * 200 + "\x1b[1m" + "y" * 200),
        "('\\x1b' at character 208 of ...'xxxxxxxxxx",
    ),
    (
        "description newline",
        placement(description="a\nb"),
        f"{P0}.description contains a control character or newline",
    ),
    (
        "description escape",
        placement(description="a\x1b[1m"),
        f"{P0}.description contains a control character",
    ),
    (
        "tenant not a string",
        placement(tenant=["team-a"]),
        f"{P0}.tenant: ['team-a'] is not a string; write a tenant's name",
    ),
    (
        "description NEL",
        placement(description="chat\x85model"),
        f"{P0}.description contains a control character or newline (a NEL (U+0085) at "
        "character 5 of 'chat\\x85model')",
    ),
    (
        "env value C1 control",
        placement(environment={"A": "x\x9by"}),
        f"{P0}.environment.A contains a control character or newline ('\\x9b' at character 2",
    ),
    ("exec NEL", placement(exec="/bin/a b\x85"), f"{P0}.exec contains a control character"),
    (
        "bare semicolon",
        placement(exec="/bin/a ; /bin/b"),
        f"{P0}.exec has a bare ';' word, which systemd treats as a command separator; use a wrapper script",
    ),
    (
        "relative exec",
        placement(exec="./serve"),
        f"{P0}.exec: the first word './serve' is neither an absolute path nor a plain program name",
    ),
    ("exec in a folder", placement(exec="bin/serve"), "'bin/serve' is neither an absolute path"),
    ("exec with prefix", placement(exec="-/bin/serve"), "'-/bin/serve' is neither"),
    (
        "unparsable quoting",
        placement(exec="/bin/a 'b"),
        f'{P0}.exec: cannot split "/bin/a \'b" into words (No closing quotation); close the quotes',
    ),
    ("empty exec", placement(exec="  "), f"{P0}.exec is empty"),
    ("exec not text", placement(exec=["/bin/a"]), f"{P0}.exec: ['/bin/a'] is not a string"),
    (
        "gpu listed twice",
        placement(gpus=["0000:17:00.0", "0000:17:00.0"]),
        f"{P0}.gpus lists 0000:17:00.0 twice; list each GPU once",
    ),
    (
        "gpu listed twice, case",
        placement(gpus=["0000:B1:00.0", "0000:b1:00.0"]),
        "lists 0000:b1:00.0 twice",
    ),
    ("gpus negative", placement(gpus=-1), f"{P0}.gpus: -1 is negative"),
    ("gpus garbage", placement(gpus="two"), f"{P0}.gpus: 'two' is neither a count nor a list"),
    ("gpus list item", placement(gpus=[3]), f"{P0}.gpus: 3 is not a GPU"),
    ("node negative", placement(node=-1), f"{P0}.node: -1 is not a NUMA node id"),
    (
        "near not an address",
        placement(near="eth0"),
        f"{P0}.near: 'eth0' is not a PCI address; write one address of "
        "ansible_facts.numa.pci_devices, full (0000:4b:00.0) or short (4b:00.0)",
    ),
    ("near bus only", placement(near="4b:00"), f"{P0}.near: '4b:00' is not a PCI address"),
    ("near function 8", placement(near="4b:00.8"), f"{P0}.near: '4b:00.8' is not a PCI address"),
    ("near empty", placement(near=""), f"{P0}.near: '' is not a PCI address"),
    ("near a number", placement(near=75), f"{P0}.near: 75 is not a PCI address"),
    ("near a boolean", placement(near=True), f"{P0}.near: True is not a PCI address"),
    (
        "near a list",
        placement(near=["4b:00.0", "65:00.0"]),
        f"{P0}.near: ['4b:00.0', '65:00.0'] is a list; near anchors the placement on one PCI "
        "device: write one address, e.g. near: 0000:4b:00.0",
    ),
    ("node bool", placement(node=True), f"{P0}.node: True is not a NUMA node id"),
    (
        "mig with a count",
        placement(mig_profile="1g.10gb", gpus=1),
        f"{P0}: mig_profile asks for one MIG instance; drop gpus: 1",
    ),
    (
        "mig with two GPUs",
        placement(mig_profile="1g.10gb", gpus=["0000:17:00.0", "0000:31:00.0"]),
        "list exactly one GPU in gpus",
    ),
    ("mig empty", placement(mig_profile=" "), f"{P0}.mig_profile: ' ' is not a MIG profile name"),
    (
        "mps unknown key",
        placement(gpus=1, mps={"threads": 4}),
        f"{P0}.mps: unknown MPS key 'threads'; allowed: active_thread_percentage, pinned_memory_limit",
    ),
    (
        "mps percentage 0",
        placement(gpus=1, mps={"active_thread_percentage": 0}),
        f"{P0}.mps.active_thread_percentage: 0 is not a percentage 1..100",
    ),
    (
        "mps percentage 101",
        placement(gpus=1, mps={"active_thread_percentage": 101}),
        "101 is not a percentage 1..100",
    ),
    (
        "mps bad limit",
        placement(gpus=1, mps={"pinned_memory_limit": "lots"}),
        f"{P0}.mps.pinned_memory_limit: 'lots' is not a size",
    ),
    (
        "mps limit in bytes",
        placement(gpus=1, mps={"pinned_memory_limit": 8}),
        f"{P0}.mps.pinned_memory_limit: 8 is 8 bytes; write 8G or 8M",
    ),
    (
        "mps pinned memory zero",
        placement(gpus=1, mps={"pinned_memory_limit": 0}),
        f"{P0}.mps.pinned_memory_limit: 0 pins no device memory at all; write a size such as "
        "8G, or omit pinned_memory_limit for no limit",
    ),
    (
        "mps pinned memory zero with a unit",
        placement(gpus=1, mps={"pinned_memory_limit": "0G"}),
        f"{P0}.mps.pinned_memory_limit: '0G' pins no device memory at all",
    ),
    ("mps not a mapping", placement(gpus=1, mps="yes"), f"{P0}.mps: write a mapping"),
    ("mps without a GPU", placement(mps={}), f"{P0}.mps: an MPS client uses one GPU here"),
    ("mps with two GPUs", placement(gpus=2, mps={}), "this placement asks for 2; set gpus: 1"),
    ("allow_span text", placement(allow_span="yes"), f"{P0}.allow_span: 'yes' is not a boolean"),
    ("hardening int", placement(hardening=1), f"{P0}.hardening: 1 is not a boolean"),
]


@pytest.mark.parametrize(
    ("case", "entry", "message"), BAD_PLACEMENTS, ids=[c[0] for c in BAD_PLACEMENTS]
)
def test_bad_placements_are_refused_with_their_own_message(case, entry, message):
    with pytest.raises(PlacementError) as err:
        parse(entry)
    text = str(err.value)
    assert text.startswith("host gpu-a100-01: numafleet_placements[0]"), text
    assert message in text, f"{case}: {text}"


def test_hardening_false_with_unit_is_refused_too():
    with pytest.raises(PlacementError, match=r"hardening only applies to exec placements"):
        parse(placement(exec=None, unit="x.service", hardening=False))
    assert parse(placement(exec=None, unit="x@1.service"))[0].unit == "x@1.service"


def test_messages_are_distinct():
    messages = []
    for case in BAD_PLACEMENTS:
        entry = case[1]
        with pytest.raises(PlacementError) as err:
            parse(entry)
        messages.append(str(err.value))
    assert len(set(messages)) == len(messages)


def test_unknown_key_lists_every_allowed_key():
    with pytest.raises(PlacementError) as err:
        parse(placement(cpu=4))
    assert ", ".join(PLACEMENT_KEYS) in str(err.value)


def test_duplicate_name_names_both_entries():
    with pytest.raises(PlacementError) as err:
        parse(placement(), placement())
    assert str(err.value) == (
        "host gpu-a100-01: numafleet_placements[1] (llm): the name is already used by "
        "numafleet_placements[0]; names must be unique (they name the units)"
    )


def test_a_unit_gets_one_placement():
    with pytest.raises(PlacementError) as err:
        parse(
            placement(name="a", exec=None, unit="vllm.service"),
            placement(name="b"),
            placement(name="c", exec=None, unit="vllm.service"),
        )
    assert str(err.value) == (
        "host gpu-a100-01: numafleet_placements[2] (c).unit: vllm.service is already pinned by "
        "numafleet_placements[0] (a); a unit gets one drop-in, so merge the two placements into "
        "one or pin another unit"
    )
    assert len(parse(placement(name="a", exec=None, unit="a.service"), placement(name="b"))) == 2


def test_errors_are_plan_errors_and_numatune_errors():
    assert issubclass(PlacementError, PlanError) and issubclass(PlanError, NumaTuneError)
    with pytest.raises(PlacementError) as err:
        parse(placement(name=None))
    assert err.value.host == HOST


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ("team-a", "host h: numafleet_tenants must be a list"),
        (
            [{"name": "a"}, {"name": "a"}],
            "host h: numafleet_tenants[1]: tenant 'a' is defined twice",
        ),
        ([{"name": "A"}], "host h: numafleet_tenants[0].name: 'A' is not a valid tenant name"),
        ([{"name": "a" * 33}], "numafleet_tenants[0].name: 'aaaa"),
        (
            [{"name": "a", "memory": "1G"}],
            "host h: numafleet_tenants[0]: unknown key 'memory'; allowed keys: name, memory_max, description",
        ),
        (
            [{"name": "a", "memory_max": "lots"}],
            "host h: numafleet_tenants[0] (a).memory_max: 'lots' is not a size",
        ),
        (
            [{"name": "a", "description": "x\ny"}],
            "host h: numafleet_tenants[0] (a).description contains a control character",
        ),
        (["a"], "host h: numafleet_tenants[0]: 'a' is not a mapping"),
        (
            [{"name": 7}],
            "host h: numafleet_tenants[0].name: 7 is a number, not a string; quote it in YAML "
            '(name: "7")',
        ),
        (
            [{"name": "a", "memory_max": 0}],
            "host h: numafleet_tenants[0] (a).memory_max: 0 would leave the tenant's slice no "
            "memory at all; write a size such as 64G, or infinity (or omit memory_max) for no "
            "limit",
        ),
        (
            [{"name": "a", "memory_max": "0G"}],
            "host h: numafleet_tenants[0] (a).memory_max: '0G' would leave the tenant's slice no",
        ),
        (
            [{"name": "a", "memory_max": 100}],
            "host h: numafleet_tenants[0] (a).memory_max: 100 is 100 bytes; write 100G or 100M",
        ),
    ],
)
def test_bad_tenants(tenants, message):
    with pytest.raises(PlacementError) as err:
        parse_tenants("h", tenants)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"reserved_cpus": "0-"}, "host h: numafleet_reserved_cpus: invalid CPU set '0-'"),
        ({"reserved_cpus": {"a": 1}}, "host h: numafleet_reserved_cpus: {'a': 1} is not a cpulist"),
        (
            {"memory_headroom_pct": 91},
            "host h: numafleet_memory_headroom_pct: 91 is not a percentage 0..90",
        ),
        ({"memory_headroom_pct": -1}, "numafleet_memory_headroom_pct: -1 is not a percentage"),
        ({"memory_headroom_pct": "15"}, "numafleet_memory_headroom_pct: '15' is not a percentage"),
        (
            {"memory_headroom_pct": 12.5},
            "host h: numafleet_memory_headroom_pct: 12.5 must be a whole number (a percentage "
            "0..90 without a decimal point); write e.g. 12",
        ),
        ({"memory_headroom_pct": 15.0}, "15.0 must be a whole number"),
        ({"memory_headroom_pct": float("inf")}, "inf must be a whole number"),
        (
            {"reserved_cpus": ["0", "6x"]},
            "host h: numafleet_reserved_cpus[1]: '6x' is not a CPU number; list CPU numbers "
            "([0, 64] or ['0', '64']) or write one cpulist string ('0-1,64-65')",
        ),
        ({"reserved_cpus": [0, -1]}, "numafleet_reserved_cpus[1]: -1 is not a CPU number"),
        ({"reserved_cpus": ["0-1"]}, "numafleet_reserved_cpus[0]: '0-1' is not a CPU number"),
    ],
)
def test_bad_policy(policy, message):
    with pytest.raises(PlacementError) as err:
        parse_policy("h", policy)
    assert message in str(err.value)


def test_placements_must_be_a_list():
    with pytest.raises(PlacementError, match="host h: numafleet_placements must be a list"):
        parse_placements("h", {"name": "x"}, [])


# ---------------------------------------------------------------------------------------------
# Behaviours found unguarded by mutation testing (make mutation, tests/mutation/README.md)


@pytest.mark.parametrize("prefix", ["+", "!", "@", "-", "!!", ":"])
@pytest.mark.parametrize("program", ["python3", "/usr/bin/serve"])
def test_exec_start_prefixes_are_refused(prefix, program):
    """systemd reads + ! @ - : before the program as flags: exec never carries them."""
    with pytest.raises(PlacementError, match="neither an absolute path nor a plain program name"):
        parse(placement(exec=f"{prefix}{program} --port 8000"))


@pytest.mark.parametrize(("text", "program"), [("python3 -m serve", "python3"), ("/a/b x", "/a/b")])
def test_exec_plain_program_names_and_paths_are_taken(text, program):
    assert parse(placement(exec=text))[0].argv[0] == program


@pytest.mark.parametrize(
    ("reserved", "cpus"),
    [(0, (0,)), ([0], (0,)), ("0", (0,)), (" 0 ", (0,)), (["0"], (0,)), ([0, "0"], (0,))],
)
def test_reserved_cpu_zero_is_a_cpu(reserved, cpus):
    assert parse_policy(HOST, {"reserved_cpus": reserved}).reserved_cpus == cpus


@pytest.mark.parametrize("reserved", [-1, [-1], ["-1"], "-1", True, [True], 1.0])
def test_reserved_cpu_minus_one_never_reaches_the_plan(reserved):
    with pytest.raises(PlacementError, match="numafleet_reserved_cpus"):
        parse_policy(HOST, {"reserved_cpus": reserved})


UUID = "GPU-5d5a9f7e-0c3b-4f1e-9d1c-6f0c2b7a1e11"


def test_mig_gpu_declared_by_uuid_or_address():
    got = parse_mig_gpus(
        HOST,
        [
            {"gpu": f" {UUID} ", "layout": ["3g.40gb", {"profile": "1g.10gb", "start": 6}]},
            {"gpu": "0000:17:00.0", "mode": "disabled"},
            {"gpu": "4B:00.0", "layout": []},
        ],
    )
    assert [(g.index, g.gpu, g.mode) for g in got] == [
        (0, UUID, "enabled"),  # a UUID keeps its case
        (1, "0000:17:00.0", "disabled"),
        (2, "4b:00.0", "enabled"),  # an address is lower-cased
    ]
    assert got[0].layout == (MigInstance("3g.40gb", None, None), MigInstance("1g.10gb", 6, None))
    assert got[1].layout is None
    assert got[2].layout == ()
    assert parse_mig_gpus(HOST, None) == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"gpu": UUID}, "numafleet_mig_gpus: {'gpu'"),
        ([UUID], f"numafleet_mig_gpus[0]: '{UUID}' is not a mapping"),
        ([{"gpu": " "}], "numafleet_mig_gpus[0].gpu: ' ' is not a GPU"),
        ([{"gpu": 0}], "numafleet_mig_gpus[0].gpu: 0 is not a GPU"),
        ([{"gpu": UUID, "mode": True}], "numafleet_mig_gpus[0].mode: True is not one of"),
        ([{"gpu": UUID, "layout": "3g.40gb"}], "numafleet_mig_gpus[0].layout: '3g.40gb' is not a"),
        (
            [{"gpu": UUID, "mode": "disabled", "layout": ["3g.40gb"]}],
            "numafleet_mig_gpus[0].layout: a GPU with mode: disabled has no MIG instances",
        ),
        (
            [{"gpu": UUID}, {"gpu": f"{UUID} "}],
            f"numafleet_mig_gpus[1].gpu: {UUID} is also numafleet_mig_gpus[0]",
        ),
        (
            [{"gpu": "0000:17:00.0"}, {"gpu": "0000:17:00.0".upper()}],
            "numafleet_mig_gpus[1].gpu: 0000:17:00.0 is also",
        ),
        ([{"gpu": UUID, "layout": [3]}], "layout[0]: 3 is neither a profile name nor a mapping"),
        ([{"gpu": UUID, "layout": [{"start": 0}]}], "layout[0]: profile is missing"),
        ([{"gpu": UUID, "layout": ["3g"]}], "layout[0].profile: '3g' is not a GPU-instance"),
        (
            [{"gpu": UUID, "layout": [{"profile": "1g.10gb", "start": -1}]}],
            "layout[0].start: -1 is not a placement start",
        ),
        (
            [{"gpu": UUID, "layout": [{"profile": "1g.10gb", "compute_profile": "x"}]}],
            "layout[0].compute_profile: 'x' is not a compute-instance profile name",
        ),
        (
            [{"gpu": UUID, "layout": [{"profile": "2g.20gb", "compute_profile": "1c.1g.10gb"}]}],
            "layout[0].compute_profile: '1c.1g.10gb' is not a compute-instance profile of 2g.20gb",
        ),
    ],
)
def test_bad_mig_gpus(raw, message):
    with pytest.raises(PlacementError) as err:
        parse_mig_gpus("h", raw)
    assert str(err.value).startswith("host h: ")
    assert message in str(err.value)


def test_mig_compute_profiles():
    got = parse_mig_gpus(
        HOST,
        [
            {
                "gpu": UUID,
                "layout": [
                    {"profile": "2g.20gb", "compute_profile": "1c.2g.20gb", "start": 0},
                    {"profile": "1g.10gb", "compute_profile": "1g.10gb"},  # the whole instance
                ],
            }
        ],
    )
    assert got[0].layout == (
        MigInstance("2g.20gb", 0, "1c.2g.20gb"),
        MigInstance("1g.10gb", None, None),
    )


@pytest.mark.parametrize(
    ("size", "kb"),
    [("2M", 2048), ("1G", 1048576), (2048, 2048), ("2048", 2048), (" 2048 ", 2048), ("64kB", 64)],
)
def test_hugepages_extra_sizes(size, kb):
    got = parse_hugepages_extra(HOST, [{"node": 0, "size": size, "count": 0}])
    assert [(e.index, e.node, e.size_kb, e.count) for e in got] == [(0, 0, kb, 0)]
    assert parse_hugepages_extra(HOST, None) == []


@pytest.mark.parametrize(
    "size", [0, -2048, "0", "-2M", "0M", "3M", "2K", 3072, True, None, "2 M x"]
)
def test_zero_negative_and_odd_page_sizes_are_refused(size):
    with pytest.raises(PlacementError, match=r"numafleet_hugepages_extra\[0\]\.size: .* is not a"):
        parse_hugepages_extra(HOST, [{"node": 0, "size": size, "count": 1}])
    with pytest.raises(PlacementError, match=r"\.hugepages\.size: .* is not a hugepage size"):
        parse(placement(hugepages={"size": size, "count": 1}))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"node": 0}, "numafleet_hugepages_extra: {'node': 0} is not a list"),
        ([5], "numafleet_hugepages_extra[0]: 5 is not a mapping"),
        ([{"node": -1, "size": "2M", "count": 1}], "[0].node: -1 is not a NUMA node id"),
        ([{"node": True, "size": "2M", "count": 1}], "[0].node: True is not a NUMA node id"),
        ([{"node": 0, "size": "2M", "count": -1}], "[0].count: -1 is not a count >= 0"),
        ([{"node": 0, "size": "2M", "count": "1"}], "[0].count: '1' is not a count >= 0"),
        ([{"node": 0, "size": "2M", "count": 1, "nodes": 1}], "nodes"),
    ],
)
def test_bad_hugepages_extra(raw, message):
    with pytest.raises(PlacementError) as err:
        parse_hugepages_extra("h", raw)
    assert str(err.value).startswith("host h: numafleet_hugepages_extra")
    assert message in str(err.value)


@pytest.mark.parametrize("count", [0, -1, "1", True, None])
def test_placement_hugepage_count_is_at_least_one(count):
    with pytest.raises(PlacementError, match=r"\.hugepages\.count: .* is not a count >= 1"):
        parse(placement(hugepages={"size": "2M", "count": count}))


@pytest.mark.parametrize(("pct", "ok"), [(1, True), (100, True), (0, False), (101, False)])
def test_mps_active_thread_percentage_is_1_to_100(pct, ok):
    entry = placement(gpus=1, mps={"active_thread_percentage": pct})
    if ok:
        assert parse(entry)[0].mps == Mps(pct, None)
    else:
        with pytest.raises(PlacementError, match=f"active_thread_percentage: {pct} is not a"):
            parse(entry)


def test_mig_messages_show_an_example_to_copy():
    with pytest.raises(PlacementError) as err:
        parse_mig_gpus("h", "x")
    assert "write a list of {gpu: 0000:17:00.0, mode: enabled, layout: [3g.40gb, 2g.20gb]}" in str(
        err.value
    )
    with pytest.raises(PlacementError) as err:
        parse_mig_gpus("h", [{"gpu": UUID, "layout": [{"start": 1}]}])
    assert "profile is missing; write {profile: 3g.40gb, start: 4}" in str(err.value)


@given(
    number=st.integers(min_value=0, max_value=10**9),
    unit=st.sampled_from("kmgtKMGT"),
    spaces=st.sampled_from(("", " ", "  ")),
)
def test_size_shortcut_gives_what_the_full_syntax_gives(number, unit, spaces):
    """parse_size_kb's shortcut for '<digits><K|M|G|T>' (64G, 512M) against the full syntax
    ('64 GiB', parsed by the regular expression): the plain way is the oracle."""
    short = f"{spaces}{number}{unit}{spaces}"
    assert parse_size_kb(short) == parse_size_kb(f"{number} {unit}iB")
