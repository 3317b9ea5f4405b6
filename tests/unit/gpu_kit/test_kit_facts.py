"""GPU proof kit checks 1-3 (nvml_facts, nvidia_smi_xml, mig_listings) over recorded data.

NVML is the fake NVML (its GPUs those of the synthetic fixture machines, make_snapshots.fleet),
sysfs the machine's fixture tree, nvidia-smi's output the recorded texts in
tests/unit/fixtures/cmd/nvidia-smi; the kit's checks and the collection's readers and parsers
run unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import gpu_proof
import proof_facts
import pytest
from kit_helpers import items

UNIT = Path(__file__).resolve().parents[1]
SMI = UNIT / "fixtures" / "cmd" / "nvidia-smi"
sys.path.insert(0, str(UNIT / "fixtures" / "gpu_snapshots"))

import fake_nvml  # noqa: E402
import make_snapshots  # noqa: E402

H100 = "synthetic-8xh100-2s"
A100 = "synthetic-2x6338-4xa100"


def recorded(name: str) -> str:
    """A recorded output without our '# ' header lines."""
    text = (SMI / name).read_text()
    marker = "# ---- command output below this line"
    return (
        text.split("\n", text[: text.find(marker)].count("\n") + 1)[-1] if marker in text else text
    )


def section(name: str, command: str) -> str:
    """The output of one ``$ command`` of a recorded file holding several."""
    text = recorded(name)
    start = text.index(f"$ {command}\n") + len(command) + 3
    end = text.find("\n$ ", start)
    return text[start : end + 1 if end != -1 else len(text)]


def smi_xml(gpus, memory=None) -> str:
    """``nvidia-smi -q -x`` of ``gpus`` (FakeGpu): the recorded H100 <gpu> element, once per GPU
    with its bus id and UUID (``memory``: {bus id: MiB} to print another FB size)."""
    text = (SMI / "h100-sxm-q-x.xml").read_text()
    head, rest = text.split("\t<gpu id=", 1)
    body, tail = rest.split("\t</gpu>\n", 1)
    blocks = []
    for fake in gpus:
        block = body.replace('"00000000:DB:00.0"', f'"{fake.bus_id}"', 1)
        block = block.replace("GPU-00000000-0000-0000-0000-000000000000", fake.uuid)
        block = re.sub(
            r"<pci_bus_id>[^<]*</pci_bus_id>", f"<pci_bus_id>{fake.bus_id}</pci_bus_id>", block
        )
        if memory and fake.bus_id in memory:
            block = block.replace(
                "<total>81559 MiB</total>", f"<total>{memory[fake.bus_id]} MiB</total>", 1
            )
        blocks.append("\t<gpu id=" + block + "\t</gpu>\n")
    head = head.replace(
        "<attached_gpus>1</attached_gpus>", f"<attached_gpus>{len(gpus)}</attached_gpus>"
    )
    return head + "".join(blocks) + tail


class FakeSmi:
    """A kit runner answering nvidia-smi's commands from recorded texts."""

    def __init__(self, xml: str, lgip=(0, "", ""), lgipp=(0, "", "")) -> None:
        self.xml, self.lgip, self.lgipp, self.calls = xml, lgip, lgipp, []

    def __call__(self, argv, stdin=None, env=None, timeout_s=60):
        self.calls.append(list(argv))
        if argv[-2:] == ["-q", "-x"]:
            return 0, self.xml, ""
        if argv[-1] == "-lgip":
            return self.lgip
        if argv[-1] == "-lgipp":
            return self.lgipp
        return 9, "", f"not faked: {argv}"


def which(name):
    return f"/usr/bin/{name}" if name == "nvidia-smi" else None


@pytest.fixture
def machine(fixture_root, kit_context):
    """Factory: (Context, FakeGpu list) of a fixture machine with the fake NVML over its GPUs."""

    def make(name: str, gpus=None, runner=None, **nvml_options):
        root = Path(fixture_root(name))
        gpus = gpus if gpus is not None else make_snapshots.fleet()[name]
        nvml = fake_nvml.FakeNvml(gpus, **nvml_options)
        ctx = kit_context(
            nvml=nvml,
            sysfs_root=str(root / "sys"),
            procfs_root=str(root / "proc"),
            which=which,
            runner=runner or FakeSmi(smi_xml(gpus)),
        )
        return ctx, gpus

    return make


def run_check(ctx, function) -> gpu_proof.Check:
    check = gpu_proof.Check("x", "x")
    function(ctx, check)
    return check


def test_nvml_facts_pass_on_an_h100_fleet(machine):
    ctx, gpus = machine(H100)
    check = run_check(ctx, proof_facts.check_nvml)
    found = items(check)
    assert check.status == "pass", [i.as_dict() for i in check.items if i.status != "pass"]
    assert (
        found["pci_bus_id_to_sysfs"].observed["nvml_bus_ids"]["0000:db:00.0"] == "00000000:DB:00.0"
    )
    assert found["0000:db:00.0.uuid"].observed == gpus[-1].uuid
    profiles = found["0000:db:00.0.mig_profiles"].observed
    assert profiles["listed"] is False and profiles["reason"]
    snapshot = json.loads((ctx.out / "nvml-snapshot.json").read_text())
    assert [g["address"] for g in snapshot["gpus"]] == [g["address"] for g in ctx.gpu_facts["gpus"]]


def test_nvml_node_that_contradicts_sysfs_fails(machine):
    gpus = make_snapshots.fleet()[H100]
    gpus[0] = dataclasses.replace(gpus[0], numa_node_id=1)  # 0000:18:00.0 is on node 0
    ctx, dummy = machine(H100, gpus=gpus)
    check = run_check(ctx, proof_facts.check_nvml)
    item = items(check)["0000:18:00.0.numa_node"]
    assert item.status == "fail"
    assert item.observed["sysfs_numa_node"] == 0 and item.observed["nvml_numa_node"] == 1


def test_nvml_gpu_missing_from_sysfs_fails(machine):
    gpus = make_snapshots.fleet()[H100] + [
        fake_nvml.FakeGpu(
            bus_id="00000000:E1:00.0", name="NVIDIA H100 80GB HBM3", memory_total_mib=81559
        )
    ]
    ctx, dummy = machine(H100, gpus=gpus)
    check = run_check(ctx, proof_facts.check_nvml)
    assert items(check)["pci_bus_id_to_sysfs"].status == "fail"


@pytest.mark.parametrize("listed", [True, False])
def test_profiles_while_mig_is_disabled_are_recorded_either_way(machine, listed):
    ctx, dummy = machine(A100, profiles_need_mig=not listed)
    check = run_check(ctx, proof_facts.check_nvml)
    item = items(check)["0000:31:00.0.mig_profiles"]  # an A100 with MIG disabled
    assert item.status == "pass"
    assert item.observed["listed"] is listed
    names = [p["name"] for p in item.observed["profiles"]]
    assert ("1g.10gb" in names) is listed


def test_nvidia_smi_agrees_with_nvml(machine):
    ctx, dummy = machine(H100)
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_smi_xml)
    found = items(check)
    assert check.status == "pass", [i.as_dict() for i in check.items if i.status != "pass"]
    accepts = found["parser_accepts"].observed
    assert accepts["dtd"] == "nvsmi_device_v12.dtd" and accepts["driver_version"] == "560.35.03"
    assert found["0000:db:00.0.memory_total_mib"].observed == {"nvml": 81559, "nvidia_smi": 81559}
    assert (ctx.out / "nvidia-smi-q-x.xml").read_text().startswith("<?xml")


def test_nvidia_smi_that_disagrees_with_nvml_fails_on_that_field(machine):
    gpus = make_snapshots.fleet()[H100]
    ctx, dummy = machine(H100, runner=FakeSmi(smi_xml(gpus, memory={gpus[2].bus_id: 81920})))
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_smi_xml)
    failed = [item.name for item in check.items if item.status == "fail"]
    assert failed == ["0000:3a:00.0.memory_total_mib"]


def test_nvidia_smi_xml_the_parser_cannot_read_fails(machine):
    ctx, dummy = machine(H100, runner=FakeSmi("<nvidia_smi_log><gpu id="))
    check = run_check(ctx, proof_facts.check_smi_xml)
    item = items(check)["parser_accepts"]
    assert item.status == "fail" and "not XML" in item.observed["reason"]


def test_mig_listings_parse_the_recorded_a30_output(machine):
    name = "a30-mig-lgip-lgipp-lgi.txt"
    lgip = (0, section(name, "nvidia-smi mig -lgip"), "")
    lgipp = (0, section(name, "nvidia-smi mig -lgipp"), "")
    gpus = make_snapshots.fleet()[A100]
    ctx, dummy = machine(A100, runner=FakeSmi(smi_xml(gpus), lgip, lgipp))
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_mig_listings)
    found = items(check)
    assert found["0000:31:00.0.lgip"].observed["rows_parsed"] == 4
    assert found["0000:31:00.0.lgip"].status == "pass"
    assert found["0000:31:00.0.lgipp"].status == "pass"
    # An A100's NVML profiles are not the A30's: the comparison names the difference.
    assert found["0000:17:00.0.nvml_vs_lgip"].status == "fail"
    text = (ctx.out / "nvidia-smi-mig.txt").read_text()
    assert "$ /usr/bin/nvidia-smi mig -i 0000:31:00.0 -lgip\n# exit status 0\n" in text


def test_mig_listing_refused_by_the_driver_is_recorded(machine):
    refusal = (6, "No MIG-enabled devices found.\n", "")
    ctx, dummy = machine(
        H100, runner=FakeSmi(smi_xml(make_snapshots.fleet()[H100]), refusal, refusal)
    )
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_mig_listings)
    item = items(check)["0000:18:00.0.lgip"]
    assert item.status == "pass"
    assert (
        item.observed["rc"] == 6 and item.observed["first_line"] == "No MIG-enabled devices found."
    )


def test_mig_listing_rows_the_parser_misses_fail(machine):
    name = "a30-mig-lgip-lgipp-lgi.txt"
    garbled = section(name, "nvidia-smi mig -lgip").replace("5.81 ", "N/A  ")
    ctx, dummy = machine(
        A100, runner=FakeSmi(smi_xml(make_snapshots.fleet()[A100]), (0, garbled, ""))
    )
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_mig_listings)
    item = items(check)["0000:31:00.0.lgip"]
    assert item.status == "fail"
    assert item.observed["rows_seen"] == 4 and item.observed["rows_parsed"] == 2


@pytest.mark.parametrize("listed", [True, False])
def test_planner_takes_the_real_mig_inputs(machine, listed):
    ctx, dummy = machine(A100, profiles_need_mig=not listed)
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_mig_listings)
    item = items(check)["0000:31:00.0.planner_mig_inputs"]
    assert item.status == "pass"
    if listed:
        assert item.observed["planned"][0]["layout"][0]["profile"] == "1g.10gb"
    else:
        assert "lists MIG profiles only in MIG mode" in item.observed["error"]


@pytest.mark.parametrize(
    "answer",
    [
        (6, "", "Failed to display GPU instance profiles: Insufficient Permissions\n"),
        (124, "", "timed out after 60 s\n"),
    ],
    ids=["not root", "timed out"],
)
def test_mig_listing_that_proves_nothing_fails(machine, answer):
    ctx, dummy = machine(
        H100, runner=FakeSmi(smi_xml(make_snapshots.fleet()[H100]), answer, answer)
    )
    run_check(ctx, proof_facts.check_nvml)
    check = run_check(ctx, proof_facts.check_mig_listings)
    assert items(check)["0000:18:00.0.lgip"].status == "fail"
