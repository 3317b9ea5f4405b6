"""nvidia-smi MIG backend: parsers on recorded nvidia-smi output, read() and writes over a runner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mig, mig_smi
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.mig import (
    CI_PROFILE_IDS,
    ComputeInstance,
    GpuInstance,
    MigBackendError,
    Profile,
)

SMI_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "cmd" / "nvidia-smi"
SEPARATOR = "# ---- command output below this line"
ADDR = "0000:10:1c.0"


def recorded(name: str) -> str:
    """The command output of a recording: the text below the ``# ----`` header line."""
    text = (SMI_DIR / name).read_text()
    return text.split("\n", text[: text.index(SEPARATOR)].count("\n") + 1)[-1]


def sections(name: str) -> dict:
    """{command line after '$ ': its output} of a recording holding several commands."""
    found, current = {}, None
    for line in recorded(name).splitlines():
        prompt = re.match(r"^(?:\S*\$|#) (.*)$", line)
        if prompt and ("nvidia-smi" in prompt[1]):
            current = prompt[1].replace("sudo ", "").strip()
            found[current] = ""
        elif line.startswith("## "):
            current = line[3:].strip()
            found[current] = ""
        elif current is not None:
            found[current] += line + "\n"
    return found


A100 = sections("a100-40gb-580-mig-lgip-lgi-lci-L.txt")
A30 = sections("a30-mig-lgip-lgipp-lgi.txt")
OLD = sections("a100-40gb-450-mig-lgipp-old-lci.txt")
CREATE = sections("a100-mig-enable-cgi-cci.txt")
EMPTY = sections("mig-list-empty-and-denied.txt")
XML = (SMI_DIR / "synthetic-a100-40gb-mig-q-x.xml").read_text()


# -- parsers on recorded output ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            A100["nvidia-smi mig -i 0 -lgip"],
            [
                ("1g.5gb", 19, 7, 4864),
                ("1g.5gb+me", 20, 1, 4864),
                ("1g.10gb", 15, 4, 9984),
                ("2g.10gb", 14, 3, 9984),
                ("3g.20gb", 9, 2, 20091),
                ("4g.20gb", 5, 1, 20091),
                ("7g.40gb", 0, 1, 40325),
            ],
        ),
        (
            A30["nvidia-smi mig -lgip"],
            [
                ("1g.6gb", 14, 4, 5949),
                ("1g.6gb+me", 21, 1, 5949),
                ("2g.12gb", 5, 2, 11971),
                ("4g.24gb", 0, 1, 24064),
            ],
        ),
    ],
    ids=["a100-40gb-580", "a30"],
)
def test_parse_lgip_reads_one_row_per_wrapped_profile(text, want):
    rows = mig_smi.parse_lgip(text)
    assert [(r["name"], r["id"], r["total"], r["memory_mib"]) for r in rows] == want
    assert {r["gpu"] for r in rows} == {0}
    assert all(r["free"] == 0 for r in rows)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            A30["nvidia-smi mig -lgipp"],
            {
                (0, 14): ((0, 1), (1, 1), (2, 1), (3, 1)),
                (0, 21): ((0, 1), (1, 1), (2, 1), (3, 1)),
                (0, 5): ((0, 2), (2, 2)),
                (0, 0): ((0, 4),),
            },
        ),
        (
            OLD["nvidia-smi mig -lgipp"],
            {
                (0, 19): tuple((s, 1) for s in range(7)),
                (0, 20): tuple((s, 1) for s in range(7)),
                (0, 15): ((0, 2), (2, 2), (4, 2), (6, 2)),
                (0, 14): ((0, 2), (2, 2), (4, 2)),
                (0, 9): ((0, 4), (4, 4)),
                (0, 5): ((0, 4),),
                (0, 0): ((0, 8),),
            },
        ),
    ],
    ids=["a30-placement-singular", "a100-40gb"],
)
def test_parse_lgipp_reads_plural_and_singular_rows(text, want):
    assert mig_smi.parse_lgipp(text) == want


def test_parse_lgi_single_gpu_with_mixed_profiles():
    rows = mig_smi.parse_lgi(A100["nvidia-smi mig -i 0 -lgi"])
    assert [(r["name"], r["profile_id"], r["id"], r["start"], r["size"]) for r in rows] == [
        ("1g.5gb", 19, 9, 6, 1),
        ("2g.10gb", 14, 3, 4, 2),
        ("4g.20gb", 5, 2, 0, 4),
    ]


def test_parse_lgi_a30_and_multi_gpu_table():
    a30 = mig_smi.parse_lgi(A30["nvidia-smi mig -lgi"])
    assert [(r["id"], r["start"]) for r in a30] == [(3, 0), (4, 1), (5, 2), (6, 3)]
    rows = mig_smi.parse_lgi(recorded("a100-80gb-mig-lgi-2gpus.txt"))
    assert [(r["gpu"], r["id"], r["start"], r["size"]) for r in rows] == [
        (0, 9, 2, 1),
        (0, 10, 3, 1),
        (0, 3, 0, 2),
        (0, 2, 4, 4),
        (1, 13, 2, 1),
        (1, 14, 3, 1),
        (1, 5, 0, 2),
        (1, 1, 4, 4),
    ]


def test_parse_lci_with_placement_column():
    rows = mig_smi.parse_lci(A100["nvidia-smi mig -i 0 -lci"])
    assert [
        (r["gpu_instance_id"], r["name"], r["profile_id"], r["id"], r["start"], r["size"])
        for r in rows
    ] == [
        (9, "1g.5gb", 0, 0, 0, 1),
        (3, "1c.2g.10gb", 0, 0, 0, 1),
        (3, "1c.2g.10gb", 0, 1, 1, 1),
        (2, "4g.20gb", CI_PROFILE_IDS[4], 0, 0, 4),
    ]


def test_parse_lci_without_placement_column_old_driver():
    rows = mig_smi.parse_lci(OLD["nvidia-smi mig -lci -gi 1"])
    assert [(r["gpu_instance_id"], r["id"], r["start"], r["size"]) for r in rows] == [
        (1, 0, None, None),
        (1, 1, None, None),
        (1, 2, None, None),
    ]


@pytest.mark.parametrize("message", ["No compute instances found", "No GPU instances found"])
def test_list_parsers_give_nothing_for_nothing_found(message):
    assert message in EMPTY["(a) container-engine-accelerators#444"]
    assert mig_smi.parse_lgi(message) == []
    assert mig_smi.parse_lci(message) == []


def test_parse_list_gpus_maps_mig_lines_to_their_gpu():
    gpus = mig_smi.parse_list_gpus(recorded("a100-80gb-L-4gpus-one-mig.txt"))
    assert [(g["index"], g["name"], len(g["mig_devices"])) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 4),
        (1, "NVIDIA A100-SXM4-80GB", 0),
        (2, "NVIDIA A100-SXM4-80GB", 0),
        (3, "NVIDIA A100-SXM4-80GB", 0),
    ]
    assert gpus[0]["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpus[0]["mig_devices"][3] == (
        3,
        "1g.20gb",
        "MIG-930574a9-d43a-5d2b-95da-3e68384c8d6b",
    )


def test_parse_list_gpus_keeps_compute_profile_names():
    (entry,) = mig_smi.parse_list_gpus(A100["nvidia-smi -i 0 -L"])
    assert [(dev, name) for dev, name, dummy in entry["mig_devices"]] == [
        (0, "4g.20gb"),
        (1, "1c.2g.10gb"),
        (2, "1c.2g.10gb"),
        (3, "1g.5gb"),
    ]


def test_parse_created_gpu_instance_on_recorded_lines():
    lines = CREATE["nvidia-smi mig -cgi 19,19,19,19,19,19,19 -i 0"].splitlines()
    assert [mig_smi.parse_created_gpu_instance(line) for line in lines] == [
        9, 7, 8, 11, 12, 13, 14
    ]  # fmt: skip
    assert mig_smi.parse_created_gpu_instance(A100["nvidia-smi mig -i 0 -cgi 2g.10gb"]) == 3
    assert mig_smi.parse_created_gpu_instance("Enabled MIG Mode for GPU 00000000:10:1C.0") is None


def test_parse_created_compute_instance_with_and_without_id():
    lines = CREATE["nvidia-smi mig -i 0 -cci -gi 7,8,9,11,12,13,14"].splitlines()
    assert {mig_smi.parse_created_compute_instance(line) for line in lines} == {(True, 0)}
    assert mig_smi.parse_created_compute_instance(
        A100["nvidia-smi mig -i 0 -gi 3 -cci 1c.2g.10gb"]
    ) == (True, 0)
    old = OLD["nvidia-smi mig -cci 0,0,0 -gi 1"].splitlines()[0]
    assert mig_smi.parse_created_compute_instance(old) == (True, None)
    assert mig_smi.parse_created_compute_instance("All done.") == (False, None)


def test_parse_xml_mig_extras_reads_index_architecture_and_process_gi():
    extras = mig_smi.parse_xml_mig_extras(XML)
    assert extras == {
        ADDR: {
            "architecture": "ampere",
            "mig_devices": {0: (2, 0, None), 1: (3, 0, None), 2: (3, 1, None), 3: (9, 0, None)},
            "processes": ((4242, 3),),
        }
    }


def test_parse_xml_mig_extras_on_recorded_non_mig_gpu():
    extras = mig_smi.parse_xml_mig_extras((SMI_DIR / "h100-sxm-q-x.xml").read_text())
    assert list(extras) == ["0000:db:00.0"]
    entry = extras["0000:db:00.0"]
    assert entry["mig_devices"] == {} and entry["processes"] == ()


# -- read() over a recorded runner -------------------------------------------------------------


class Runner:
    """Answers argv tuples from a table; records every call; unknown argv fails the test."""

    def __init__(self, table: dict) -> None:
        self.table = table
        self.calls: list = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        key = tuple(argv)
        assert key in self.table, f"unexpected command {argv}"
        return self.table[key]


def a100_table(xml: str = XML, listing: str = A100["nvidia-smi -i 0 -L"]) -> dict:
    mig = ("nvidia-smi", "mig", "-i", ADDR)
    return {
        ("nvidia-smi", "-q", "-x"): (0, xml, ""),
        ("nvidia-smi", "-L"): (0, listing, ""),
        mig + ("-lgip",): (0, A100["nvidia-smi mig -i 0 -lgip"], ""),
        mig + ("-lgipp",): (0, OLD["nvidia-smi mig -lgipp"], ""),
        mig + ("-lgi",): (0, A100["nvidia-smi mig -i 0 -lgi"], ""),
        mig + ("-lci",): (0, A100["nvidia-smi mig -i 0 -lci"], ""),
    }


def test_read_builds_the_recorded_a100_layout():
    runner = Runner(a100_table())
    (got,) = mig_smi.SmiBackend(runner).read()
    assert (got.address, got.index, got.uuid, got.name, got.architecture) == (
        ADDR,
        0,
        "GPU-9e4aeb94-01c0-5173-4811-4ca60f77b3a9",
        "NVIDIA A100-SXM4-40GB",
        "ampere",
    )
    assert (got.mode_current, got.mode_pending) == ("enabled", "enabled")
    assert got.profiles[0] == Profile(
        name="7g.40gb", id=0, slices=7, memory_mib=40325, max_count=1, placements=((0, 8),)
    )
    assert [p.id for p in got.profiles] == [0, 5, 9, 14, 15, 19, 20]
    assert got.gpu_instances == (
        GpuInstance(
            id=2,
            profile_id=5,
            start=0,
            size=4,
            compute_instances=(
                ComputeInstance(
                    id=0,
                    slices=4,
                    profile_id=3,
                    device_uuid="MIG-c42101f0-a1fa-5b68-8908-7c5c887f28bd",
                ),
            ),
        ),
        GpuInstance(
            id=3,
            profile_id=14,
            start=4,
            size=2,
            compute_instances=(
                ComputeInstance(0, 1, 0, "MIG-8970491e-16e0-5140-9f8f-d561baa3c186"),
                ComputeInstance(1, 1, 0, "MIG-239565ce-30e3-52d7-8197-5630d3ce21fa"),
            ),
        ),
        GpuInstance(
            id=9,
            profile_id=19,
            start=6,
            size=1,
            compute_instances=(
                ComputeInstance(0, 1, 0, "MIG-20301a31-77fa-59ec-b0b8-7ef543821f29"),
            ),
        ),
    )
    assert got.processes == ((4242, 3),)
    assert [c[-1] for c in runner.calls] == ["-x", "-L", "-lgip", "-lgipp", "-lgi", "-lci"]


def test_read_pairs_uuids_by_order_when_the_xml_has_no_device_index():
    xml = re.sub(
        r"<mig_devices>.*</mig_devices>", "<mig_devices>None</mig_devices>", XML, flags=re.S
    )
    (got,) = mig_smi.SmiBackend(Runner(a100_table(xml=xml))).read()
    uuids = {
        (gi.id, ci.id): ci.device_uuid for gi in got.gpu_instances for ci in gi.compute_instances
    }
    assert uuids[(3, 1)] == "MIG-239565ce-30e3-52d7-8197-5630d3ce21fa"
    assert uuids[(9, 0)] == "MIG-20301a31-77fa-59ec-b0b8-7ef543821f29"


def test_read_leaves_uuids_unknown_when_the_listing_does_not_match():
    xml = re.sub(
        r"<mig_devices>.*</mig_devices>", "<mig_devices>None</mig_devices>", XML, flags=re.S
    )
    listing = "\n".join(A100["nvidia-smi -i 0 -L"].splitlines()[:3])
    (got,) = mig_smi.SmiBackend(Runner(a100_table(xml=xml, listing=listing))).read()
    assert {ci.device_uuid for gi in got.gpu_instances for ci in gi.compute_instances} == {None}


def test_read_treats_nothing_found_as_empty_lists():
    table = a100_table()
    mig = ("nvidia-smi", "mig", "-i", ADDR)
    table[mig + ("-lgi",)] = (6, "No GPU instances found\n", "")
    table[mig + ("-lci",)] = (6, "No compute instances found\n", "")
    (got,) = mig_smi.SmiBackend(Runner(table)).read()
    assert got.gpu_instances == () and len(got.profiles) == 7


def test_read_does_not_list_instances_of_a_gpu_without_mig():
    xml = (SMI_DIR / "h100-sxm-q-x.xml").read_text()
    runner = Runner(
        {
            ("/usr/bin/nvidia-smi", "-q", "-x"): (0, xml, ""),
            ("/usr/bin/nvidia-smi", "-L"): (0, "", ""),
        }
    )
    (got,) = mig_smi.SmiBackend(runner, "/usr/bin/nvidia-smi").read()
    assert (got.address, got.mode_current, got.profiles, got.gpu_instances) == (
        "0000:db:00.0",
        "disabled",
        (),
        (),
    )
    assert got.index is None and got.architecture == "hopper"
    assert len(runner.calls) == 2


def test_read_failure_names_the_command_and_the_fix():
    table = a100_table()
    table[("nvidia-smi", "mig", "-i", ADDR, "-lci")] = (
        4,
        EMPTY["(b) HAMi#1044"],
        "",
    )
    with pytest.raises(MigBackendError) as err:
        mig_smi.SmiBackend(Runner(table)).read()
    text = str(err.value)
    assert f"GPU {ADDR}: nvidia-smi mig -i {ADDR} -lci failed" in text
    assert "Failed to display compute instances: Insufficient Permissions" in text
    assert "become: true" in text


# -- writes ------------------------------------------------------------------------------------


A = mig.Action
SMI_ACTIONS = [
    (A(mig.SET_MODE, ADDR, enabled=True), ("set_mode", True), f"nvidia-smi -i {ADDR} -mig 1"),
    (A(mig.SET_MODE, ADDR, enabled=False), ("set_mode", False), f"nvidia-smi -i {ADDR} -mig 0"),
    (
        A(mig.CREATE_GI, ADDR, profile_id=19, start=6),
        ("create_gpu_instance", 19, 6),
        f"nvidia-smi mig -i {ADDR} -cgi 19:6",
    ),
    (
        A(mig.CREATE_CI, ADDR, gpu_instance_id=3, profile_id=0),
        ("create_compute_instance", 3, 0),
        f"nvidia-smi mig -i {ADDR} -cci 0 -gi 3",
    ),
    (
        A(mig.DESTROY_CI, ADDR, gpu_instance_id=3, compute_instance_id=1),
        ("destroy_compute_instance", 3, 1),
        f"nvidia-smi mig -i {ADDR} -dci -gi 3 -ci 1",
    ),
    (
        A(mig.DESTROY_GI, ADDR, gpu_instance_id=9),
        ("destroy_gpu_instance", 9),
        f"nvidia-smi mig -i {ADDR} -dgi -gi 9",
    ),
]


@pytest.mark.parametrize(("action", "call", "want"), SMI_ACTIONS)
def test_describe_is_the_argv_the_backend_runs(action, call, want):
    backend = mig_smi.SmiBackend(Runner({}))
    assert backend.describe(action) == want
    assert " ".join(backend.argv(call[0], ADDR, *call[1:])) == want


def test_argv_refuses_unknown_actions():
    with pytest.raises(MigBackendError, match="no such action"):
        mig_smi.SmiBackend(Runner({})).argv("reset", ADDR)


def test_writes_run_the_described_argv_and_return_new_ids():
    prefix = ("nvidia-smi", "mig", "-i", ADDR)
    gi_line = CREATE["nvidia-smi mig -cgi 19,19,19,19,19,19,19 -i 0"].splitlines()[0]
    ci_line = A100["nvidia-smi mig -i 0 -gi 3 -cci 1c.2g.10gb"]
    runner = Runner(
        {
            ("nvidia-smi", "-i", ADDR, "-mig", "1"): (0, CREATE["nvidia-smi -mig 1 -i 0"], ""),
            prefix + ("-cgi", "19:6"): (0, gi_line + "\n", ""),
            prefix + ("-cci", "0", "-gi", "9"): (0, ci_line, ""),
            prefix + ("-dci", "-gi", "9", "-ci", "0"): (0, "", ""),
            prefix + ("-dgi", "-gi", "9"): (0, "", ""),
        }
    )
    backend = mig_smi.SmiBackend(runner)
    backend.set_mode(ADDR, True)
    assert backend.create_gpu_instance(ADDR, 19, 6) == 9
    assert backend.create_compute_instance(ADDR, 9, 0) == 0
    backend.destroy_compute_instance(ADDR, 9, 0)
    backend.destroy_gpu_instance(ADDR, 9)
    backend.close()
    assert [" ".join(c) for c in runner.calls] == [
        backend.describe(a)
        for a in (
            A(mig.SET_MODE, ADDR, enabled=True),
            A(mig.CREATE_GI, ADDR, profile_id=19, start=6),
            A(mig.CREATE_CI, ADDR, gpu_instance_id=9, profile_id=0),
            A(mig.DESTROY_CI, ADDR, gpu_instance_id=9, compute_instance_id=0),
            A(mig.DESTROY_GI, ADDR, gpu_instance_id=9),
        )
    ]


def test_create_compute_instance_reads_the_id_back_on_old_drivers():
    mig = ("nvidia-smi", "mig", "-i", ADDR)
    old_line = OLD["nvidia-smi mig -cci 0,0,0 -gi 1"].splitlines()[0]
    lci = OLD["nvidia-smi mig -lci -gi 1"]
    # the same table with only CI 0 left: drop the rows of CI 1 and CI 2
    one = "\n".join(line for line in lci.splitlines() if not re.search(r"\s[12]\s+\|$", line))
    runner = Runner(
        {
            mig + ("-cci", "0", "-gi", "1"): (0, old_line, ""),
            mig + ("-lci", "-gi", "1"): (0, one, ""),
        }
    )
    assert mig_smi.SmiBackend(runner).create_compute_instance(ADDR, 1, 0) == 0
    runner.table[mig + ("-lci", "-gi", "1")] = (0, lci, "")
    with pytest.raises(MigBackendError, match="holds 3 compute instances"):
        mig_smi.SmiBackend(runner).create_compute_instance(ADDR, 1, 0)


def test_create_without_success_line_fails():
    runner = Runner({("nvidia-smi", "mig", "-i", ADDR, "-cgi", "9:0"): (0, "All done.\n", "")})
    with pytest.raises(MigBackendError, match="no 'Successfully created GPU instance' line"):
        mig_smi.SmiBackend(runner).create_gpu_instance(ADDR, 9, 0)


def blocked() -> dict:
    """The recorded refusal texts (copied from the project's shared recordings), by case letter."""
    text = (SMI_DIR / "mig-mode-pending-and-reset-blocked-messages.txt").read_text()
    body = text.split("\n", text[: text.index(SEPARATOR)].count("\n") + 1)[-1]
    found, current = {}, None
    for line in body.splitlines():
        if line.startswith("## ("):
            current = line[4]
            found[current] = ""
        elif current and not line.startswith("$ ") and not line.startswith("# nvidia-smi"):
            found[current] += line + "\n"
    return found


@pytest.mark.parametrize(
    ("case", "argv_tail", "quoted"),
    [
        (
            "b",
            ("-mig", "1"),
            "Warning: MIG mode is in pending enable state for GPU 00000001:00:00.0",
        ),
        ("d", ("-dci", "-gi", "3", "-ci", "0"), "unable to destroy compute instance id  0"),
    ],
)
def test_refusals_quote_the_driver_and_say_to_stop_the_processes(case, argv_tail, quoted):
    text = blocked()[case]
    mig = (
        ("nvidia-smi", "-i", ADDR) if argv_tail[0] == "-mig" else ("nvidia-smi", "mig", "-i", ADDR)
    )
    runner = Runner({mig + argv_tail: (255, text, "")})
    backend = mig_smi.SmiBackend(runner)
    write = (
        (lambda: backend.set_mode(ADDR, True))
        if argv_tail[0] == "-mig"
        else (lambda: backend.destroy_compute_instance(ADDR, 3, 0))
    )
    with pytest.raises(MigBackendError) as err:
        write()
    message = str(err.value)
    assert message.startswith(
        f"GPU {ADDR}: {' '.join(mig + argv_tail)} failed: exited with status 255"
    )
    assert quoted in message
    assert "Stop the processes that use this GPU" in message
    assert err.value.gpu == ADDR
