"""The readers' shortcuts give what the plain way gives: link resolution from a resolved
directory, exists_given, Reader.once (the PCI devices read once per gathering), cpuset,
frozen_builder, the ordered-cpulist path of parse_cpulist and parse_int's decimal path."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    pci,
    placements,
    topology,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import (
    parse_cpulist,
    parse_cpumask,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import CpulistError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import (
    Reader,
    parse_int,
)


def _tree(top: Path, files: dict) -> None:
    for rel, content in files.items():
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


@pytest.fixture
def devices(tmp_path):
    """Two PCI functions behind one bridge, one with numa_node -1, plus a name that is no address."""
    real = tmp_path / "sys" / "devices" / "pci0000:00"
    _tree(
        real,
        {
            "0000:00:01.0/class": "0x060400\n",
            "0000:00:01.0/vendor": "0x8086\n",
            "0000:00:01.0/numa_node": "0\n",
            "0000:00:01.0/local_cpulist": "0-3\n",
            "0000:00:01.0/0000:01:00.0/class": "0x030200\n",
            "0000:00:01.0/0000:01:00.0/vendor": "0x10de\n",
            "0000:00:01.0/0000:01:00.0/device": "0x2330\n",
            "0000:00:01.0/0000:01:00.0/numa_node": "-1\n",
            "0000:00:01.0/0000:01:00.0/local_cpulist": "4-7\n",
            "0000:00:01.0/0000:01:00.1/class": "0x020000\n",
            "0000:00:01.0/0000:01:00.1/numa_node": "zero\n",  # malformed: a warning
        },
    )
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for address in ("0000:00:01.0", "0000:01:00.0", "0000:01:00.1"):
        parent = "" if address == "0000:00:01.0" else "0000:00:01.0/"
        (bus / address).symlink_to(f"../../../devices/pci0000:00/{parent}{address}")
    (bus / "junk").mkdir()
    (tmp_path / "sys" / "devices" / "system" / "cpu").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    return tmp_path


def _plain(root: Path, node_cpus: dict) -> tuple:
    reader = Reader(str(root / "sys"), str(root / "proc"))
    found = pci.read_pci_devices(reader, node_cpus)
    return found, reader.warnings, reader.accessed


def test_pci_devices_are_read_once_per_gathering_with_the_same_paths_and_warnings(devices):
    nodes = {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    first = Reader(str(devices / "sys"), str(devices / "proc"), remember=True)
    found = pci.read_pci_devices(first, nodes)
    assert (found, first.warnings, first.accessed) == _plain(devices, nodes)
    assert found[1].node == 1 and found[1].node_source == "local_cpulist"
    assert any(w["path"].endswith("0000:01:00.1/numa_node") for w in first.warnings)
    assert any(w["path"].endswith("/junk") for w in first.warnings)

    # Files changed after the first pass are not read again by a sibling...
    (devices / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/class").write_text("0x010802\n")
    twin = first.sibling()
    again = pci.read_pci_devices(twin, nodes)
    assert again == found and again is not found
    assert twin.warnings == first.warnings and twin.accessed == first.accessed
    # ...but the node is inferred from each caller's node CPUs.
    other = pci.read_pci_devices(first.sibling(), {0: (0, 1, 2, 3), 2: (4, 5, 6, 7)})
    assert (other[1].node, other[1].node_source) == (2, "local_cpulist")
    assert pci.read_pci_devices(first.sibling(), {})[1].node is None
    # A reader without remember reads again.
    assert pci.read_pci_devices(Reader(str(devices / "sys"), ""), nodes)[1].kind == "nvme"


def test_once_keeps_earlier_warnings_and_paths_and_records_a_failed_run(tmp_path):
    reader = Reader(str(tmp_path), "", remember=True)
    reader.warn("/a", "first")
    reader.accessed.add("/before")

    def compute():
        reader.warn("/a", "first")  # already there: not twice
        reader.warn("/b", "second")
        reader.accessed.add("/during")
        return [1]

    assert reader.once("k", compute) == [1]
    assert reader.warnings == [
        {"path": "/a", "reason": "first"},
        {"path": "/b", "reason": "second"},
    ]
    assert reader.accessed == {"/before", "/during"}
    twin = reader.sibling()
    assert twin.once("k", lambda: pytest.fail("computed twice")) == [1]
    assert twin.warnings == [{"path": "/a", "reason": "first"}, {"path": "/b", "reason": "second"}]
    assert twin.accessed == {"/during"}

    def broken():
        reader.warn("/c", "third")
        reader.accessed.add("/broken")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        reader.once("bad", broken)
    assert reader.warnings[-1] == {"path": "/c", "reason": "third"}
    assert "/broken" in reader.accessed
    with pytest.raises(RuntimeError):
        reader.once("bad", broken)  # nothing remembered from a failed run


@pytest.mark.parametrize("remember", [True, False])
def test_exists_given_answers_as_exists_and_the_witness_as_text(tmp_path, remember):
    _tree(tmp_path, {"cpu0/topology/physical_package_id": "1\n", "cpu2/topology": "a file\n"})
    (tmp_path / "cpu1").mkdir()
    (tmp_path / "cpu3" / "topology").mkdir(parents=True)  # no witness in it
    for cpu in range(4):
        topo = str(tmp_path / f"cpu{cpu}" / "topology")
        witness = f"{topo}/physical_package_id"
        reader = Reader(str(tmp_path), "", remember=remember)
        plain = Reader(str(tmp_path), "")
        assert reader.exists_given(topo, witness) == plain.exists(topo), cpu
        assert reader.accessed == plain.accessed
        assert reader.integer(witness) == plain.integer(witness)
        assert (reader.warnings, reader.accessed) == (plain.warnings, plain.accessed)
    # Without remember, a later text() reads again.
    reader = Reader(str(tmp_path), "")
    witness = str(tmp_path / "cpu0/topology/physical_package_id")
    assert reader.exists_given(str(tmp_path / "cpu0/topology"), witness)
    assert reader.text(witness) == "1"
    Path(witness).write_text("2\n")
    assert reader.text(witness) == "2"


def test_empty_file_read_ahead_is_empty_text(tmp_path):
    _tree(tmp_path, {"d/empty": ""})
    reader = Reader(str(tmp_path), "")
    assert reader.exists_given(str(tmp_path / "d"), str(tmp_path / "d/empty"))
    assert reader.text(str(tmp_path / "d/empty")) == ""


def test_cpuset_is_cpulist_and_cpumask_as_a_shared_tuple(tmp_path):
    _tree(tmp_path, {"list": "0-3,8\n", "mask": "ff\n", "bad": "3-1\n"})
    reader = Reader(str(tmp_path), "")
    listed = reader.cpuset(str(tmp_path / "list"), parse_cpulist)
    assert listed == (0, 1, 2, 3, 8) and reader.cpulist(str(tmp_path / "list")) == list(listed)
    assert reader.cpuset(str(tmp_path / "list"), parse_cpulist) is listed
    assert reader.cpuset(str(tmp_path / "mask"), parse_cpumask) == tuple(range(8))
    assert reader.cpuset(str(tmp_path / "bad"), parse_cpulist) is None
    assert reader.cpuset(str(tmp_path / "gone"), parse_cpulist, optional=True) is None
    plain = Reader(str(tmp_path), "")
    plain.cpulist(str(tmp_path / "bad"))
    plain.cpulist(str(tmp_path / "gone"), optional=True)
    assert reader.warnings == plain.warnings != []


def test_realpath_from_resolved_directories_is_os_path_realpath(tmp_path):
    real = tmp_path / "real" / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    real.mkdir(parents=True)
    (real / "class").write_text("0x030200\n")
    bus = tmp_path / "sys" / "bus"
    bus.mkdir(parents=True)
    (tmp_path / "sys" / "devices").symlink_to("../real/devices")  # a link on the way
    targets = {
        "rel": "../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
        "abs": str(real),
        "dot": "./../devices//pci0000:00/./0000:00:01.0",
        "to-link": "rel",
        "to-file": "rel/class",
        "dangling": "../devices/none/at/all",
        "loop": "loop",
        "up-root": "../../../../../../../../../../..",
        "via-loop": "loop/x",
    }
    for name, target in targets.items():
        (bus / name).symlink_to(target)
    (bus / "plain-dir").mkdir()
    names = [*targets, "plain-dir", "missing"]
    for order in (names, names[::-1]):
        reader = Reader(str(tmp_path / "sys"), "")
        reader.realpath(str(bus))  # the directory first: every entry takes the short way
        for name in order * 2:
            path = str(bus / name)
            assert reader.realpath(path) == os.path.realpath(path), name
            assert reader.realpath(f"{path}/x") == os.path.realpath(f"{path}/x"), name


def _old_parse_cpulist(text: str) -> list:
    """parse_cpulist as it was before the ordered-list path (the reference)."""
    body = text.replace("\0", "").strip()
    if body in ("", "(null)"):
        return []
    cpus: set = set()
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise CpulistError(text, "empty item between commas")
        span, sep, stride = item.partition(":")
        first_s, dash, last_s = span.partition("-")
        first = _old_int(first_s.strip(), text)
        last = _old_int(last_s.strip(), text) if dash else first
        if last < first:
            raise CpulistError(text, f"range {span!r} runs backwards")
        used, group = 1, 1
        if sep:
            used_s, slash, group_s = stride.partition("/")
            if not slash:
                raise CpulistError(text, f"stride {stride!r} must be used/group, as in 0-15:2/4")
            used, group = _old_int(used_s, text), _old_int(group_s, text)
            if used == 0 or group == 0 or used > group:
                raise CpulistError(text, f"stride {stride!r} needs 0 < used <= group")
        for base in range(first, last + 1, group):
            cpus.update(range(base, min(base + used, last + 1)))
    return sorted(cpus)


def _old_int(token: str, text: str) -> int:
    if not (token.isascii() and token.isdigit()):
        raise CpulistError(text, f"{token!r} is not a CPU number")
    value = int(token)
    if value >= 1 << 20:
        raise CpulistError(text, f"CPU {value} is beyond {(1 << 20) - 1}")
    return value


def _outcome(parse, text):
    try:
        return parse(text)
    except CpulistError as exc:
        return str(exc)


@pytest.mark.parametrize(
    "text",
    [
        *("0-3,8", "8,0-3", "0-7,4-11", "3,3", "0-15:2/4,16", "16,0-15:2/4", "0-3:1/2,1"),
        *("0,112", "112,0", "0,,1", ",1", "1,", "0001,2", "1048575", "1,1048576", "\u0663,4"),
    ],
)
def test_parse_cpulist_sorts_and_merges_lists_out_of_order(text):
    assert _outcome(parse_cpulist, text) == _outcome(_old_parse_cpulist, text)


def test_parse_cpulist_matches_the_set_based_reference_on_random_text():
    pieces = [*"0137-,,:/24 x", "12", "15", "1048576"]
    chooser = random.Random(7)
    for dummy in range(3000):
        text = "".join(chooser.choice(pieces) for dummy2 in range(chooser.randint(0, 12)))
        assert _outcome(parse_cpulist, text) == _outcome(_old_parse_cpulist, text), text


@given(st.lists(st.sampled_from([*"0137-,,:/24 x", "12", "15", "1048576"]), max_size=14))
def test_parse_cpulist_matches_the_set_based_reference_on_generated_text(pieces):
    """The same oracle, hypothesis generating (and shrinking) the text."""
    text = "".join(pieces)
    assert _outcome(parse_cpulist, text) == _outcome(_old_parse_cpulist, text)


@pytest.mark.parametrize(
    "text", ["0", "08", "12", "-1", " 7 ", "0x1F", "1_0", "\u0663", "\u00b2", ""]
)
def test_parse_int_decimal_path_is_int(text):
    def reference(body):
        body = body.strip()
        if body.lower().startswith("0x"):
            return int(body[2:], 16)
        return int(body, 10)

    def outcome(parse):
        try:
            return parse(text)
        except ValueError as exc:
            return str(exc)

    assert outcome(parse_int) == outcome(reference)


@pytest.mark.parametrize(
    ("cls", "values"),
    [
        (topology.Cpu, dict(id=3, online=True, node=0, package=0, die=None, core=1, siblings=(3,))),
        (
            topology.HugepagePool,
            dict(size_kb=2048, total=4, free=4, surplus=None, reserved=0),
        ),
        (
            pci.PciDevice,
            dict(
                address="0000:01:00.0",
                domain=0,
                bus=1,
                kind="gpu",
                class_code="0x030200",
                vendor_id="0x10de",
                device_id=None,
                numa_node=None,
                local_cpus=(0, 1),
                node=0,
                node_source="local_cpulist",
                host_bridge="pci0000:00",
                upstream=("0000:00:01.0",),
                root_port="0000:00:01.0",
                switch=None,
            ),
        ),
    ],
)
def test_frozen_builder_makes_what_the_class_makes(cls, values):
    build = topology.frozen_builder(cls)
    made, plain = build(**values), cls(**values)
    assert made.__class__ is cls
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert vars(made) == vars(plain) and list(vars(made)) == list(vars(plain))
    assert dataclasses.asdict(made) == dataclasses.asdict(plain)
    assert dataclasses.replace(made, **values) == plain
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.id = 1  # type: ignore[misc]
    fewer = dict(values)
    fewer.popitem()
    with pytest.raises(TypeError) as mine:
        build(**fewer)
    with pytest.raises(TypeError) as theirs:
        cls(**fewer)
    assert str(mine.value) == str(theirs.value)
    with pytest.raises(TypeError):
        build(**values, extra=1)


@given(
    name=st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True),
    cpus=st.one_of(
        st.integers(min_value=1, max_value=512), st.sampled_from(["0-3", "4,6", "8-15"])
    ),
    gpus=st.integers(min_value=0, max_value=8),
    memory=st.sampled_from([None, "1G", "512M", 4096 << 20]),
    node=st.one_of(st.none(), st.integers(min_value=0, max_value=7)),
)
def test_placements_are_the_placements_the_class_makes(name, cpus, gpus, memory, node):
    """parse_placements builds Placement with frozen_builder: the same object as Placement(...)."""
    entry = {"name": name, "exec": "/opt/app/bin/serve --port 8000", "cpus": cpus, "gpus": gpus}
    if memory is not None:
        entry["memory"] = memory
    if node is not None:
        entry["node"] = node
    (made,) = placements.parse_placements("h", [entry], [])
    plain = placements.Placement(**vars(made))
    assert made.__class__ is placements.Placement
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert list(vars(made)) == list(vars(plain))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "other"  # type: ignore[misc]


def test_frozen_builder_leaves_classes_with_post_init_or_non_init_fields_to_the_class():
    @dataclasses.dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self):
            if self.value < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(frozen=True)
    class Derived:
        value: int
        twice: int = dataclasses.field(init=False, default=0)

    assert topology.frozen_builder(Checked) is Checked
    assert topology.frozen_builder(Derived) is Derived
