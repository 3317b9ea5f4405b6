"""The nvidia_mig module's logic (mig_nvml.run) end to end over nvidia-smi, on a simulated A100.

``SimSmi`` is a runner ``argv -> (rc, out, err)`` for one A100-SXM4-40GB. Its read commands
answer with the recorded nvidia-smi output (tests/unit/fixtures/cmd/nvidia-smi/): ``-lgip`` of the
580 driver, ``-lgipp`` of the A100 40GB, and ``-lgi``/``-lci``/``-L``/``-q -x`` rendered in the
recorded table formats from its current state (the first test checks that the rendering of the
recorded state parses exactly like the recorded text). Its write commands change that state and
print the success lines recorded in a100-mig-enable-cgi-cci.txt, so the module's re-read sees the
new layout. Any other argv fails the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mig, mig_nvml, mig_smi
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    MigError,
    NumaTuneError,
)

SMI_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "cmd" / "nvidia-smi"
SEPARATOR = "# ---- command output below this line"
ADDR = "0000:10:1c.0"
GPU_UUID = "GPU-9e4aeb94-01c0-5173-4811-4ca60f77b3a9"
SMI = "nvidia-smi"


def sections(name: str) -> dict:
    """{command line after the prompt: its output} of a recording holding several commands."""
    text = (SMI_DIR / name).read_text()
    text = text.split("\n", text[: text.index(SEPARATOR)].count("\n") + 1)[-1]
    found, current = {}, None
    for line in text.splitlines():
        prompt = re.match(r"^(?:\S*\$|#) (.*)$", line)
        if prompt and "nvidia-smi" in prompt[1]:
            current = prompt[1].replace("sudo ", "").strip()
            found[current] = ""
        elif current is not None:
            found[current] += line + "\n"
    return found


A100 = sections("a100-40gb-580-mig-lgip-lgi-lci-L.txt")
OLD = sections("a100-40gb-450-mig-lgipp-old-lci.txt")
CREATE = sections("a100-mig-enable-cgi-cci.txt")
XML = (SMI_DIR / "synthetic-a100-40gb-mig-q-x.xml").read_text()
LGIP = A100["nvidia-smi mig -i 0 -lgip"]
LGIPP = OLD["nvidia-smi mig -lgipp"]
# The recorded success lines, as templates (ids padded to two columns like the driver does).
GI_LINE = CREATE["nvidia-smi mig -cgi 19,19,19,19,19,19,19 -i 0"].splitlines()[0]
CI_LINE = CREATE["nvidia-smi mig -i 0 -cci -gi 7,8,9,11,12,13,14"].splitlines()[0]
# The profiles of the A100 40GB as the backend reads them: {id: (name, slices, placements)}.
PROFILES = {
    p.id: p
    for p in mig_smi.build_mig_gpu(
        ADDR, {}, {}, None, mig_smi.parse_lgip(LGIP), mig_smi.parse_lgipp(LGIPP), [], []
    ).profiles
}
CI_SLICES = {value: key for key, value in mig.CI_PROFILE_IDS.items()}

# The recorded layout: GI 2 4g.20gb@0 (CI 0 full), GI 3 2g.10gb@4 (CI 0, 1: 1c), GI 9 1g.5gb@6.
RECORDED = {
    2: (5, 0, [(0, 3, "MIG-c42101f0-a1fa-5b68-8908-7c5c887f28bd")]),
    3: (
        14,
        4,
        [
            (0, 0, "MIG-8970491e-16e0-5140-9f8f-d561baa3c186"),
            (1, 0, "MIG-239565ce-30e3-52d7-8197-5630d3ce21fa"),
        ],
    ),
    9: (19, 6, [(0, 0, "MIG-20301a31-77fa-59ec-b0b8-7ef543821f29")]),
}


class SimSmi:
    """nvidia-smi (and systemctl) of one simulated A100 40GB; records every argv in ``calls``.

    ``gis``: {gi id: (profile id, start, [(ci id, ci profile id, MIG uuid)])}. ``processes``:
    [(pid, gi id or None)]; ``units``: {pid: unit} (``systemctl stop`` ends that unit's pids).
    ``lose_ci``: the driver prints success for -cci but no compute instance appears.
    """

    def __init__(self, gis=None, processes=(), units=None, lose_ci=False) -> None:
        source = RECORDED if gis is None else gis
        self.gis = {g: (p, s, list(cis)) for g, (p, s, cis) in source.items()}
        self.processes = list(processes)
        self.units = dict(units or {})
        self.lose_ci = lose_ci
        self.calls: list = []
        self.next_uuid = 1

    # -- rendering in the recorded formats ------------------------------------------------------

    def _ci_name(self, gi_profile: int, ci_profile: int) -> str:
        profile = PROFILES[gi_profile]
        return mig.ci_name(profile.name, profile.slices, CI_SLICES[ci_profile])

    def _devices(self) -> list:
        """[(gi, ci, ci name, uuid)] in nvidia-smi's MIG device order."""
        return [
            (gi, ci, self._ci_name(self.gis[gi][0], cp), uuid)
            for gi in sorted(self.gis)
            for ci, cp, uuid in sorted(self.gis[gi][2])
        ]

    def lgi(self) -> str:
        rule = "+" + "-" * 57 + "+"
        lines = [
            rule,
            "| GPU instances:" + " " * 42 + "|",
            "| GPU   Name               Profile  Instance   Placement  |",
            "|                            ID       ID       Start:Size |",
            "|" + "=" * 57 + "|",
        ]
        for gi, (profile, start, dummy) in sorted(self.gis.items(), key=lambda i: -i[1][0]):
            place = f"{start}:{PROFILES[profile].placements[0][1]}"
            name = f"MIG {PROFILES[profile].name}"
            lines += [f"|   0  {name:<19}{profile:>5}{gi:>9}{place:>13}     |", rule]
        return "\n".join(lines) + "\n"

    def lci(self) -> str:
        rule = "+" + "-" * 68 + "+"
        lines = [
            rule,
            "| Compute instances:" + " " * 49 + "|",
            "| GPU     GPU       Name             Profile   Instance   Placement  |",
            "|       Instance                       ID        ID       Start:Size |",
            "|         ID" + " " * 57 + "|",
            "|" + "=" * 68 + "|",
        ]
        rows = [
            (gi, ci, cp, profile)
            for gi, (profile, dummy, cis) in sorted(self.gis.items(), key=lambda i: -i[1][0])
            for ci, cp, dummy2 in cis
        ]
        for gi, ci, cp, profile in rows:
            slices = CI_SLICES[cp]
            name = "MIG " + self._ci_name(profile, cp)
            place = f"{ci * slices}:{slices}"
            lines += [f"|   0   {gi:>4}       {name:<19}{cp:>3}{ci:>10}{place:>13}     |", rule]
        return "\n".join(lines) + "\n"

    def listing(self) -> str:
        lines = [f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {GPU_UUID})"]
        for number, device in enumerate(self._devices()):
            lines.append(f"  MIG {device[2]:<11} Device {number:>2}: (UUID: {device[3]})")
        return "\n".join(lines) + "\n"

    def xml(self) -> str:
        devices = "".join(
            f"\t\t\t<mig_device>\n\t\t\t\t<index>{n}</index>\n"
            f"\t\t\t\t<gpu_instance_id>{gi}</gpu_instance_id>\n"
            f"\t\t\t\t<compute_instance_id>{ci}</compute_instance_id>\n\t\t\t</mig_device>\n"
            for n, (gi, ci, dummy, dummy2) in enumerate(self._devices())
        )
        procs = "".join(
            "\t\t\t<process_info>\n"
            f"\t\t\t\t<gpu_instance_id>{'N/A' if gi is None else gi}</gpu_instance_id>\n"
            f"\t\t\t\t<compute_instance_id>{'N/A' if gi is None else 0}</compute_instance_id>\n"
            f"\t\t\t\t<pid>{pid}</pid>\n\t\t\t\t<type>C</type>\n"
            "\t\t\t\t<process_name>python3</process_name>\n\t\t\t</process_info>\n"
            for pid, gi in self.processes
        )
        text = re.sub(
            r"<mig_devices>.*</mig_devices>",
            lambda m: f"<mig_devices>\n{devices}\t\t</mig_devices>",
            XML,
            flags=re.S,
        )
        return re.sub(
            r"<processes>.*</processes>",
            lambda m: f"<processes>\n{procs}\t\t</processes>",
            text,
            flags=re.S,
        )

    # -- commands -------------------------------------------------------------------------------

    def __call__(self, argv):
        self.calls.append(list(argv))
        argv = list(argv)
        if argv[0] == "systemctl":
            if argv[1] == "stop":
                self.processes = [p for p in self.processes if self.units.get(p[0]) != argv[2]]
            return 0, "", ""
        if argv == [SMI, "-q", "-x"]:
            return 0, self.xml(), ""
        if argv == [SMI, "-L"]:
            return 0, self.listing(), ""
        assert argv[:4] == [SMI, "mig", "-i", ADDR], f"unexpected command {argv}"
        rest = argv[4:]
        reads = {
            ("-lgip",): lambda: LGIP,
            ("-lgipp",): lambda: LGIPP,
            ("-lgi",): lambda: self.lgi() if self.gis else None,
            ("-lci",): lambda: self.lci() if any(c[2] for c in self.gis.values()) else None,
        }
        if tuple(rest) in reads:
            out = reads[tuple(rest)]()
            if out is None:
                what = "GPU" if rest == ["-lgi"] else "compute"
                return 6, f"No {what} instances found\n", ""
            return 0, out, ""
        if rest[0] == "-cgi":
            return self._create_gi(*map(int, rest[1].split(":")))
        if rest[0] == "-cci" and rest[2] == "-gi":
            return self._create_ci(int(rest[3]), int(rest[1]))
        if rest[:2] == ["-dci", "-gi"] and rest[3] == "-ci":
            gi, ci = int(rest[2]), int(rest[4])
            self.gis[gi][2][:] = [c for c in self.gis[gi][2] if c[0] != ci]
            line = f"Successfully destroyed compute instance ID {ci:2d} from GPU  0 GPU instance ID"
            return 0, f"{line} {gi:2d}\n", ""
        if rest[:2] == ["-dgi", "-gi"]:
            gi = int(rest[2])
            if self.gis[gi][2]:
                said = f"Unable to destroy GPU instance ID {gi:2d} from GPU  0"
                return 19, said + ": In use by another client\n", ""
            del self.gis[gi]
            return 0, f"Successfully destroyed GPU instance ID {gi:2d} from GPU  0\n", ""
        raise AssertionError(f"unexpected command {argv}")

    def _create_gi(self, profile_id: int, start: int):
        profile = PROFILES[profile_id]
        size = dict(profile.placements).get(start)
        taken = [(s, PROFILES[p].placements[0][1]) for p, s, dummy in self.gis.values()]
        if size is None or any(start < s + z and s < start + size for s, z in taken):
            said = f"Unable to create a GPU instance on GPU  0 using profile {profile_id}"
            return 2, said + ": Insufficient Resources\n", ""
        gi = min(set(range(1, 15)) - set(self.gis))
        self.gis[gi] = (profile_id, start, [])
        line = GI_LINE.replace("ID  9", f"ID {gi:2d}").replace(
            "MIG 1g.5gb (ID 19)", f"MIG {profile.name} (ID {profile_id:2d})"
        )
        return 0, line + "\n", ""

    def _create_ci(self, gi: int, ci_profile: int):
        cis = self.gis[gi][2]
        ci = len(cis)
        uuid = f"MIG-00000000-0000-5000-8000-{self.next_uuid:012d}"
        self.next_uuid += 1
        if not self.lose_ci:
            cis.append((ci, ci_profile, uuid))
        name = self._ci_name(self.gis[gi][0], ci_profile)
        line = (
            CI_LINE.replace("instance ID  0", f"instance ID {ci:2d}", 1)
            .replace("GPU instance ID  7", f"GPU instance ID {gi:2d}")
            .replace("MIG 1g.5gb (ID  0)", f"MIG {name} (ID {ci_profile:2d})")
        )
        return 0, line + "\n", ""

    def writes(self) -> list:
        """The write commands run, as text (reads left out)."""
        skip = {"-lgip", "-lgipp", "-lgi", "-lci", "-x", "-L"}
        return [" ".join(c) for c in self.calls if c[-1] not in skip]


def params(tmp_path, gpus, **extra) -> dict:
    base = {
        "gpus": gpus,
        "reset_ok": False,
        "owned_units": [],
        "backend": "nvidia-smi",
        "snapshot": None,
        "root": str(tmp_path / "root"),
        "state_path": mig.DEFAULT_STATE_PATH,
        "boot_program_path": mig.DEFAULT_BOOT_PROGRAM_PATH,
        "unit_dir": "/etc/systemd/system",
        "mig_parted_config": mig.DEFAULT_MIG_PARTED_PATH,
        "service_manager": "none",
        "procfs_root": str(tmp_path / "proc"),
        "sysfs_root": str(tmp_path / "sys"),
    }
    base.update(extra)
    return base


def which(name: str):
    return name if name in ("nvidia-smi", "systemctl") else None


def no_nvml():
    raise AssertionError("backend=nvidia-smi must not load pynvml")


def run(sim: SimSmi, args: dict, check_mode: bool = False) -> dict:
    return mig_nvml.run(args, check_mode, sim, which, no_nvml)


REPLACE_GI_3 = [
    {"gpu": ADDR, "layout": [
        {"profile": "4g.20gb", "start": 0},
        {"profile": "2g.10gb", "start": 4},
        {"profile": "1g.5gb", "compute_profile": None},
    ]},
]  # fmt: skip
# GI 3 holds two 1c CIs, the layout wants one full 2g.10gb CI there: destroy and re-create.
REPLACE_GI_3_COMMANDS = [
    f"nvidia-smi mig -i {ADDR} -dci -gi 3 -ci 0",
    f"nvidia-smi mig -i {ADDR} -dci -gi 3 -ci 1",
    f"nvidia-smi mig -i {ADDR} -dgi -gi 3",
    f"nvidia-smi mig -i {ADDR} -cgi 14:4",
    f"nvidia-smi mig -i {ADDR} -cci 1 -gi 1",
]


def test_the_simulation_renders_the_recorded_state_as_recorded():
    sim = SimSmi()
    assert mig_smi.parse_lgi(sim.lgi()) == mig_smi.parse_lgi(A100["nvidia-smi mig -i 0 -lgi"])
    assert mig_smi.parse_lci(sim.lci()) == mig_smi.parse_lci(A100["nvidia-smi mig -i 0 -lci"])
    assert sim.lgi() == A100["nvidia-smi mig -i 0 -lgi"]
    assert sim.lci() == A100["nvidia-smi mig -i 0 -lci"]
    assert mig_smi.parse_list_gpus(sim.listing()) == mig_smi.parse_list_gpus(
        A100["nvidia-smi -i 0 -L"]
    )
    recorded = mig_smi.parse_xml_mig_extras(XML)
    assert mig_smi.parse_xml_mig_extras(SimSmi(processes=[(4242, 3)]).xml()) == recorded


def test_check_mode_runs_no_write_and_writes_no_file(tmp_path):
    sim = SimSmi()
    result = run(sim, params(tmp_path, REPLACE_GI_3), check_mode=True)
    assert result["changed"] and result["ran"] == []
    # No service manager here: the boot unit's systemctl lines are reported too.
    assert result["would_run"] == REPLACE_GI_3_COMMANDS[:4] + [
        f"nvidia-smi mig -i {ADDR} -cci 1 -gi <new>",
        "systemctl daemon-reload",
        "systemctl enable numafleet-mig.service",
    ]
    assert sim.writes() == []
    assert not (tmp_path / "root").exists()
    assert {f["state"] for f in result["files"]} == {"create"}
    (gpu,) = result["gpus"]
    assert [(e["profile"], e["start"], e["gpu_instance_id"]) for e in gpu["layout"]] == [
        ("4g.20gb", 0, 2),
        ("2g.10gb", 4, None),
        ("1g.5gb", 6, 9),
    ]


def test_apply_destroys_cis_before_their_gi_then_creates_gi_before_its_ci(tmp_path):
    sim = SimSmi()
    result = run(sim, params(tmp_path, REPLACE_GI_3))
    assert sim.writes() == REPLACE_GI_3_COMMANDS
    assert result["ran"] == REPLACE_GI_3_COMMANDS
    assert result["changed"] and not result["reset_required"]
    (gpu,) = result["gpus"]
    assert gpu["actions"] == REPLACE_GI_3_COMMANDS
    got = [
        (e["profile"], e["start"], e["gpu_instance_id"], e["device_uuid"]) for e in gpu["layout"]
    ]
    assert got == [
        ("4g.20gb", 0, 2, "MIG-c42101f0-a1fa-5b68-8908-7c5c887f28bd"),
        ("2g.10gb", 4, 1, "MIG-00000000-0000-5000-8000-000000000001"),
        ("1g.5gb", 6, 9, "MIG-20301a31-77fa-59ec-b0b8-7ef543821f29"),
    ]
    assert [d["device_uuid"] for d in result["mig_devices"]] == [
        e["device_uuid"] for e in gpu["layout"]
    ]
    state = json.loads((tmp_path / "root/etc/numafleet/mig.json").read_text())
    assert state["gpus"] == [
        {
            "address": ADDR,
            "uuid": GPU_UUID,
            "mode": "enabled",
            "layout": [
                {"profile": "4g.20gb", "start": 0, "compute_profile": None},
                {"profile": "2g.10gb", "start": 4, "compute_profile": None},
                {"profile": "1g.5gb", "start": 6, "compute_profile": None},
            ],
        }
    ]
    sim.calls.clear()
    again = run(sim, params(tmp_path, REPLACE_GI_3))
    assert not again["changed"] and again["ran"] == [] and sim.writes() == []


def test_apply_on_an_empty_gpu_creates_each_gi_then_its_ci(tmp_path):
    sim = SimSmi(gis={})
    layout = [{"profile": "3g.20gb"}, {"profile": "3g.20gb", "compute_profile": "1c.3g.20gb"}]
    result = run(sim, params(tmp_path, [{"gpu": GPU_UUID, "layout": layout}]))
    prefix = f"nvidia-smi mig -i {ADDR}"
    assert sim.writes() == [
        f"{prefix} -cgi 9:0",
        f"{prefix} -cci 2 -gi 1",
        f"{prefix} -cgi 9:4",
        f"{prefix} -cci 0 -gi 2",
    ]
    assert [(e["start"], e["compute_profile"]) for e in result["gpus"][0]["layout"]] == [
        (0, None),
        (4, "1c.3g.20gb"),
    ]


def test_a_reread_that_differs_fails_naming_what_differs(tmp_path):
    sim = SimSmi(lose_ci=True)
    with pytest.raises(MigError) as err:
        run(sim, params(tmp_path, REPLACE_GI_3))
    text = str(err.value)
    assert f"GPU {ADDR}: after the change the layout differs from" in text
    assert "2g.10gb@4 with CI 2g.10gb is missing" in text
    assert "GI 1 (2g.10gb@4, 0 CI) is not in the layout" in text
    assert sim.writes() == REPLACE_GI_3_COMMANDS
    assert not (tmp_path / "root").exists()


def test_a_gpu_listed_by_address_and_by_uuid_is_refused_before_any_write(tmp_path):
    sim = SimSmi()
    gpus = [{"gpu": "10:1c.0", "layout": []}, {"gpu": GPU_UUID.lower(), "mode": "enabled"}]
    with pytest.raises(MigError) as err:
        run(sim, params(tmp_path, gpus))
    assert str(err.value) == (
        f"gpus[1].gpu: GPU {ADDR} is already listed as gpus[0]; list each GPU once"
    )
    assert sim.writes() == []


def write_cgroup(tmp_path, pid: int, unit: str) -> None:
    proc = tmp_path / "proc" / str(pid)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::/system.slice/{unit}\n")


TWO_GIS = {
    2: (5, 0, [(0, 3, "MIG-c42101f0-a1fa-5b68-8908-7c5c887f28bd")]),
    9: (19, 6, [(0, 0, "MIG-20301a31-77fa-59ec-b0b8-7ef543821f29")]),
}
KEEP_2_DROP_9 = [{"gpu": ADDR, "layout": [{"profile": "4g.20gb", "start": 0}]}]
KEEP_BOTH_ADD = [{"gpu": ADDR, "layout": [
    {"profile": "4g.20gb", "start": 0}, {"profile": "1g.5gb", "start": 6},
    {"profile": "2g.10gb", "start": 4},
]}]  # fmt: skip


def test_an_unattributed_process_blocks_destroying_any_gi(tmp_path):
    write_cgroup(tmp_path, 777, "batch.service")
    sim = SimSmi(gis=TWO_GIS, processes=[(777, None)])
    with pytest.raises(MigError) as err:
        run(sim, params(tmp_path, KEEP_2_DROP_9))
    assert str(err.value) == (
        f"processes use the GPUs this change would disrupt: GPU {ADDR} (destroying GPU "
        "instance(s) 9): pid 777 (batch.service). Stop them and run again, or list their units "
        "in owned_units so that the module stops and restarts them around the change"
    )
    assert sim.writes() == []


def test_a_process_on_a_kept_gi_does_not_block_destroying_another(tmp_path):
    sim = SimSmi(gis=TWO_GIS, processes=[(778, 2)])
    result = run(sim, params(tmp_path, KEEP_2_DROP_9))
    assert sim.writes() == [
        f"nvidia-smi mig -i {ADDR} -dci -gi 9 -ci 0",
        f"nvidia-smi mig -i {ADDR} -dgi -gi 9",
    ]
    assert result["busy"] == []


def test_an_unattributed_process_does_not_block_creating_in_free_slices(tmp_path):
    sim = SimSmi(gis=TWO_GIS, processes=[(777, None)])
    result = run(sim, params(tmp_path, KEEP_BOTH_ADD))
    assert sim.writes() == [
        f"nvidia-smi mig -i {ADDR} -cgi 14:4",
        f"nvidia-smi mig -i {ADDR} -cci 1 -gi 1",
    ]
    assert result["changed"] and result["busy"] == []


def test_owned_units_are_stopped_around_the_change_and_started_again(tmp_path):
    write_cgroup(tmp_path, 4242, "numafleet-llm.service")
    sim = SimSmi(processes=[(4242, 3)], units={4242: "numafleet-llm.service"})
    args = params(
        tmp_path, REPLACE_GI_3, service_manager="systemd", owned_units=["numafleet-llm.service"]
    )
    check = run(sim, dict(args), check_mode=True)
    assert check["would_run"][0] == "systemctl stop numafleet-llm.service"
    assert check["would_run"][-1] == "systemctl start numafleet-llm.service"
    assert sim.writes() == []
    result = run(sim, args)
    assert sim.writes() == (
        ["systemctl stop numafleet-llm.service"]
        + REPLACE_GI_3_COMMANDS
        + ["systemctl start numafleet-llm.service"]
    )
    assert result["stopped_units"] == ["numafleet-llm.service"]
    assert result["busy"] == [{"address": ADDR, "pid": 4242, "unit": "numafleet-llm.service"}]


@pytest.mark.parametrize(
    ("gpu", "uuid"),
    [(ADDR, "GPU-00000000-1111-2222-3333-444444444444"), ("10:1c.0", "GPU-other")],
)
def test_a_gpu_with_another_uuid_than_planned_is_refused_before_any_write(tmp_path, gpu, uuid):
    sim = SimSmi()
    with pytest.raises(MigError) as err:
        run(sim, params(tmp_path, [{"gpu": gpu, "uuid": uuid, "layout": []}]))
    named = ADDR if gpu == ADDR else f"{gpu} ({ADDR})"
    assert str(err.value) == (
        f"gpus[0].uuid: GPU {named} has UUID {GPU_UUID}, not {uuid} as planned: the GPU "
        "was replaced or the plan is stale. Nothing was changed; re-gather facts and re-plan"
    )
    assert sim.writes() == [] and not (tmp_path / "root").exists()


def test_the_planned_uuid_matches_in_any_case(tmp_path):
    sim = SimSmi()
    gpus = [dict(REPLACE_GI_3[0], uuid=GPU_UUID.upper())]
    result = run(sim, params(tmp_path, gpus), check_mode=True)
    assert result["changed"] and result["gpus"][0]["uuid"] == GPU_UUID


@pytest.mark.parametrize("uuid", ["", "  ", 7])
def test_a_malformed_uuid_is_refused(uuid):
    with pytest.raises(MigError, match=r"gpus\[0\]\.uuid: .* is not a GPU UUID"):
        mig.parse_request([{"gpu": ADDR, "uuid": uuid}])


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("state_path", "/etc/numafleet/mig.json ", "ends with a space"),
        ("state_path", "/etc/numafleet/mig\\", "ends in a backslash"),
        ("boot_program_path", "/usr/local/libexec/" + "m" * 256, "component of 256"),
        ("boot_program_path", "/usr/local/libexec/mig\u2028", "U+2028"),
    ],
)
def test_paths_the_boot_unit_cannot_carry_are_refused_before_any_write(
    tmp_path, option, value, fragment
):
    sim = SimSmi()
    with pytest.raises(NumaTuneError, match=re.escape(fragment)):
        run(sim, params(tmp_path, REPLACE_GI_3, **{option: value}))
    assert sim.writes() == []
    assert not (tmp_path / "root").exists()
