"""Garbage in: snapshot and nvidia-smi parsers raise only their NumaTuneError, never a traceback.

Whatever the nvidia-smi parser accepts must also survive a snapshot round trip.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

UNIT = Path(__file__).resolve().parents[3]
if str(UNIT / "fixtures" / "gpu_snapshots") not in sys.path:
    sys.path.insert(0, str(UNIT / "fixtures" / "gpu_snapshots"))

import make_snapshots  # noqa: E402

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (  # noqa: E402
    gpu,
    gpu_smi,
    gpu_snapshot,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (  # noqa: E402
    CommandOutputError,
    NumaTuneError,
    SnapshotError,
)

GOOD = json.loads(make_snapshots.render("synthetic-2x6338-4xa100"))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Structured strategies cost more per example; fewer of them still reach every branch.
FUZZ_STRUCTURED = settings(FUZZ, max_examples=80)


def _paths(value, prefix=()):
    """Every path (tuple of keys/indexes) into a parsed JSON value."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


PATHS = [path for path in _paths(GOOD) if path]


def _parse_snapshot(text):
    try:
        gpu_snapshot.parse_snapshot(text, "fuzz.json")
    except SnapshotError as exc:
        message = str(exc)
    else:
        return
    assert message.startswith("GPU snapshot fuzz.json: ")


@FUZZ
@given(st.text())
def test_any_text_is_a_snapshot_or_a_snapshot_error(text):
    _parse_snapshot(text)


@FUZZ
@given(JSON)
def test_any_json_is_a_snapshot_or_a_snapshot_error(value):
    _parse_snapshot(json.dumps(value))


@FUZZ_STRUCTURED
@given(st.lists(st.tuples(st.sampled_from(PATHS), JSON), min_size=1, max_size=3))
def test_a_good_snapshot_with_parts_replaced_is_a_snapshot_or_a_snapshot_error(changes):
    doc = copy.deepcopy(GOOD)
    for path, value in changes:
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed this path
    _parse_snapshot(json.dumps(doc))


TAGS = [
    "nvidia_smi_log", "gpu", "driver_version", "product_name", "uuid", "pci", "pci_bus_id",
    "fb_memory_usage", "total", "compute_mode", "persistence_mode", "mig_mode", "current_mig",
    "pending_mig", "mig_devices", "mig_device", "gpu_instance_id", "compute_instance_id",
    "processes", "process_info", "pid",
]  # fmt: skip
SAMPLES = ["", "N/A", "Enabled", "Disabled", "7", "81559 MiB", "00000000:DB:00.0", "[N/A]"]
TEXTS = st.sampled_from(SAMPLES) | st.text(max_size=10)


@st.composite
def elements(draw, depth=0):
    tag = draw(st.sampled_from(TAGS))
    attrs = ""
    if tag == "gpu" and draw(st.booleans()):
        attrs = f' id="{escape(draw(TEXTS), {chr(34): "&quot;"})}"'
    children = []
    if depth < 3:
        children = draw(st.lists(elements(depth + 1), max_size=3))
    body = "".join(children) if children else escape(draw(TEXTS))
    return f"<{tag}{attrs}>{body}</{tag}>"


def _parse_xml(text):
    try:
        state = gpu_smi.parse_nvidia_smi_xml(text)
    except CommandOutputError as exc:
        message = str(exc)
    else:
        message = None
    if message is not None:
        assert message.startswith("nvidia-smi -q -x: ")
        return
    for address, record in state.gpus.items():
        assert gpu.normalise_bus_id(address) == address
        assert set(record) == {*gpu.ENRICHED_FIELDS, "unavailable"}
    # Whatever nvidia-smi printed, snapshot_out must write a snapshot that reads back.
    again = gpu_snapshot.parse_snapshot(json.dumps(gpu_snapshot.as_snapshot(state)), "fuzz.json")
    assert again.gpus == state.gpus


@FUZZ
@given(st.text())
def test_any_text_is_nvidia_smi_xml_or_a_command_output_error(text):
    _parse_xml(text)


@FUZZ_STRUCTURED
@given(st.lists(elements(), max_size=3))
def test_nvidia_smi_shaped_xml_never_crashes_the_parser(children):
    _parse_xml(f"<nvidia_smi_log>{''.join(children)}</nvidia_smi_log>")


MODE_TEXTS = TEXTS | st.sampled_from(["Default", "Exclusive_Process", "maybe", "ENABLED"])


@FUZZ
@given(MODE_TEXTS, MODE_TEXTS, MODE_TEXTS, MODE_TEXTS)
def test_any_mode_nvidia_smi_prints_survives_a_snapshot(persistence, compute, current, pending):
    values = [escape(value) for value in (persistence, compute, current, pending)]
    _parse_xml(
        '<nvidia_smi_log><gpu id="00000000:17:00.0">'
        f"<persistence_mode>{values[0]}</persistence_mode>"
        f"<compute_mode>{values[1]}</compute_mode>"
        f"<mig_mode><current_mig>{values[2]}</current_mig>"
        f"<pending_mig>{values[3]}</pending_mig></mig_mode>"
        "</gpu></nvidia_smi_log>"
    )


@FUZZ
@given(st.binary(max_size=64))
def test_bytes_that_are_not_utf8_snapshots_raise_snapshot_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("snap") / "snapshot.json"
    path.write_bytes(blob)
    try:
        gpu_snapshot.read_snapshot(str(path))
    except NumaTuneError as exc:
        error = exc
    else:
        error = None
    assert error is None or isinstance(error, SnapshotError)
