"""effective.py: the files systemd reads for a unit, merged as systemd merges them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import effective

UNIT = "numafleet-embed.service"
ETC = "/etc/systemd/system"
OURS = f"{ETC}/{UNIT}"
SERVICE = """# Managed by numafleet.tuning
[Unit]
Description=embed

[Service]
ExecStart="/bin/sleep" "1000"
Slice=numafleet-ml.slice
CPUAffinity=2-9
NUMAPolicy=bind
NUMAMask=0
AllowedCPUs=2-9
AllowedMemoryNodes=0
Environment="OMP_NUM_THREADS=8"
Environment="CUDA_VISIBLE_DEVICES=GPU-1"
"""
OWN = {OURS: SERVICE}


def put(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def props(root: Path, own=None):
    entry, foreign = effective.evaluate_unit(str(root), UNIT, own or OWN)
    return entry, {item.property: item for item in foreign}


def test_clean_unit_matches_the_plan(tmp_path):
    put(tmp_path, OURS, SERVICE)
    entry, foreign = props(tmp_path)
    assert foreign == {}
    assert entry["fragment"] == OURS and entry["dropins"] == []
    assert entry["properties"]["CPUAffinity"] == {
        "planned": "2-9",
        "effective": "2-9",
        "source": OURS,
        "ok": True,
    }
    assert entry["properties"]["Environment.CUDA_VISIBLE_DEVICES"]["effective"] == "GPU-1"
    assert set(entry["properties"]) == {
        "AllowedCPUs",
        "AllowedMemoryNodes",
        "CPUAffinity",
        "NUMAMask",
        "NUMAPolicy",
        "Slice",
        "Environment.CUDA_VISIBLE_DEVICES",
        "Environment.OMP_NUM_THREADS",
    }


def test_systemctl_edit_override_resets_affinity_and_policy(tmp_path):
    put(tmp_path, OURS, SERVICE)
    override = f"{ETC}/{UNIT}.d/override.conf"
    put(tmp_path, override, "[Service]\nCPUAffinity=\nNUMAPolicy=default\n")
    entry, foreign = props(tmp_path)
    assert set(foreign) == {"CPUAffinity", "NUMAPolicy"}
    assert foreign["CPUAffinity"].effective is None
    assert foreign["CPUAffinity"].source == override
    assert foreign["NUMAPolicy"].effective == "default" and foreign["NUMAPolicy"].planned == "bind"
    assert entry["dropins"] == [override]
    message = foreign["NUMAPolicy"].message("gpu-a100-01")
    assert message.startswith("host gpu-a100-01: numafleet-embed.service: NUMAPolicy is default")
    assert override in message and "systemctl revert numafleet-embed.service" in message


def test_dropins_of_any_name_apply_in_filename_order_across_directories(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(
        tmp_path,
        f"/usr/lib/systemd/system/{UNIT}.d/zz-vendor.conf",
        "[Service]\nAllowedCPUs=\nAllowedCPUs=0-1\n",
    )
    put(
        tmp_path,
        f"/run/systemd/system/{UNIT}.d/10-early.conf",
        "[Service]\nAllowedCPUs=\nAllowedCPUs=5\n",
    )
    entry, foreign = props(tmp_path)
    # zz-vendor.conf sorts last, so it wins although /usr/lib has the lowest priority.
    assert foreign["AllowedCPUs"].effective == "0-1"
    assert foreign["AllowedCPUs"].source.endswith("zz-vendor.conf")
    assert [Path(p).name for p in entry["dropins"]] == ["10-early.conf", "zz-vendor.conf"]


def test_same_named_dropin_in_a_higher_directory_masks_the_lower_one(tmp_path):
    put(tmp_path, OURS, SERVICE)
    low = f"/usr/lib/systemd/system/{UNIT}.d/60-site.conf"
    high = f"{ETC}/{UNIT}.d/60-site.conf"
    put(tmp_path, low, "[Service]\nNUMAPolicy=interleave\n")
    put(tmp_path, high, "[Service]\nNUMAPolicy=bind\n")
    entry, foreign = props(tmp_path)
    assert foreign == {}
    assert entry["masked_dropins"] == [low]
    # and /run masks /usr/lib, but /etc masks /run
    put(tmp_path, f"/run/systemd/system/{UNIT}.d/60-site.conf", "[Service]\nNUMAPolicy=local\n")
    entry, foreign = props(tmp_path)
    assert foreign == {}
    os.unlink(tmp_path / high.lstrip("/"))
    entry, foreign = props(tmp_path)
    assert foreign["NUMAPolicy"].effective == "local"
    assert foreign["NUMAPolicy"].source == f"/run/systemd/system/{UNIT}.d/60-site.conf"


def test_dropin_linked_to_dev_null_masks_and_sets_nothing(tmp_path):
    put(tmp_path, OURS, SERVICE)
    low = f"/usr/lib/systemd/system/{UNIT}.d/60-site.conf"
    put(tmp_path, low, "[Service]\nNUMAPolicy=interleave\n")
    (tmp_path / f"etc/systemd/system/{UNIT}.d").mkdir(parents=True)
    os.symlink("/dev/null", tmp_path / f"etc/systemd/system/{UNIT}.d/60-site.conf")
    entry, foreign = props(tmp_path)
    assert foreign == {} and entry["unread"] == []


def test_set_property_file_in_system_control_wins(tmp_path):
    put(tmp_path, OURS, SERVICE)
    control = f"/etc/systemd/system.control/{UNIT}.d/50-AllowedCPUs.conf"
    put(
        tmp_path,
        control,
        '# This is a drop-in unit file extension, created via "systemctl set-property"\n'
        "# or an equivalent operation. Do not edit.\n[Service]\nAllowedCPUs=0-1\n",
    )
    entry, foreign = props(tmp_path)
    # AllowedCPUs= assignments merge: 2-9 from the unit plus 0-1 from set-property.
    assert foreign["AllowedCPUs"].effective == "0-9"
    assert foreign["AllowedCPUs"].source == control


def test_runtime_override_in_run(tmp_path):
    put(tmp_path, OURS, SERVICE)
    run = f"/run/systemd/system/{UNIT}.d/99-unpinned.conf"
    put(tmp_path, run, "[Service]\nNUMAMask=\nAllowedMemoryNodes=\nAllowedMemoryNodes=0-1\n")
    entry, foreign = props(tmp_path)
    assert foreign["NUMAMask"].effective is None and foreign["NUMAMask"].source == run
    assert foreign["AllowedMemoryNodes"].effective == "0-1"


def test_prefix_and_type_dropins_are_read(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, f"{ETC}/numafleet-.service.d/70-all.conf", "[Service]\nSlice=system.slice\n")
    put(
        tmp_path,
        "/usr/lib/systemd/system/service.d/80-env.conf",
        '[Service]\nEnvironment="OMP_NUM_THREADS=1" OTHER=x\n',
    )
    entry, foreign = props(tmp_path)
    assert foreign["Slice"].effective == "system.slice"
    assert foreign["Environment.OMP_NUM_THREADS"].effective == "1"
    assert "Environment.OTHER" not in entry["properties"]  # not planned: not compared


def test_environment_accumulates_and_empty_resets(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, f"{ETC}/{UNIT}.d/60-a.conf", "[Service]\nEnvironment=EXTRA=1\n")
    entry, foreign = props(tmp_path)
    assert foreign == {}  # EXTRA added, ours kept
    put(
        tmp_path,
        f"{ETC}/{UNIT}.d/70-b.conf",
        "[Service]\nEnvironment=\nEnvironment=OMP_NUM_THREADS=8\n",
    )
    entry, foreign = props(tmp_path)
    assert set(foreign) == {"Environment.CUDA_VISIBLE_DEVICES"}
    assert foreign["Environment.CUDA_VISIBLE_DEVICES"].effective is None


def test_cpulists_compare_normalised(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(
        tmp_path,
        f"{ETC}/{UNIT}.d/60-same.conf",
        "[Service]\nCPUAffinity=\nCPUAffinity=2 3 4-6,7 8-9\n",
    )
    entry, foreign = props(tmp_path)
    assert foreign == {}
    assert entry["properties"]["CPUAffinity"]["source"].endswith("60-same.conf")


def test_empty_assignment_without_a_new_value_unsets(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, f"{ETC}/{UNIT}.d/60-x.conf", "[Service]\nNUMAPolicy=\n")
    dummy, foreign = props(tmp_path)
    assert foreign["NUMAPolicy"].effective is None


def test_link_in_a_dropin_dir_is_not_followed_and_is_reported(tmp_path):
    put(tmp_path, OURS, SERVICE)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.conf"
    outside.write_text("[Service]\nNUMAPolicy=default\n")
    (tmp_path / f"etc/systemd/system/{UNIT}.d").mkdir(parents=True)
    os.symlink(outside, tmp_path / f"etc/systemd/system/{UNIT}.d/90-link.conf")
    entry, foreign = props(tmp_path)
    assert foreign == {}
    assert entry["unread"][0]["path"].endswith("90-link.conf")
    assert "symbolic link" in entry["unread"][0]["reason"]


def test_linked_dropin_directory_is_reported_not_followed(tmp_path):
    put(tmp_path, OURS, SERVICE)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-dir"
    elsewhere.mkdir()
    (elsewhere / "90.conf").write_text("[Service]\nNUMAPolicy=default\n")
    os.symlink(elsewhere, tmp_path / f"etc/systemd/system/{UNIT}.d")
    entry, foreign = props(tmp_path)
    assert foreign == {}
    assert [item["path"] for item in entry["unread"]] == [f"{ETC}/{UNIT}.d"]


def test_unreadable_file_is_reported_not_raised(tmp_path):
    put(tmp_path, OURS, SERVICE)
    (tmp_path / f"etc/systemd/system/{UNIT}.d/60-fifo.conf").parent.mkdir(parents=True)
    os.mkfifo(tmp_path / f"etc/systemd/system/{UNIT}.d/60-fifo.conf")
    entry, foreign = props(tmp_path)
    assert foreign == {}
    assert entry["unread"] and entry["unread"][0]["path"].endswith("60-fifo.conf")


def test_masked_unit_is_a_foreign_override(tmp_path):
    put(tmp_path, OURS, SERVICE)
    (tmp_path / "etc/systemd/system.control").mkdir(parents=True)
    os.symlink("/dev/null", tmp_path / f"etc/systemd/system.control/{UNIT}")
    entry, foreign = props(tmp_path)
    assert foreign["LoadState"].effective == "masked"


def test_check_mode_judges_the_files_as_the_apply_leaves_them(tmp_path):
    # Our file is stale on disk: the overlay (the planned text) decides, so a stale file of
    # our own is not a foreign override (rendered_units reports it).
    put(tmp_path, OURS, SERVICE.replace("CPUAffinity=2-9", "CPUAffinity=0"))
    entry, foreign = props(tmp_path)
    assert foreign == {} and entry["properties"]["CPUAffinity"]["effective"] == "2-9"


def test_vendor_unit_with_our_dropin(tmp_path):
    unit = "vllm.service"
    ours = f"{ETC}/{unit}.d/50-numafleet.conf"
    dropin = "[Service]\nSlice=numafleet.slice\nCPUAffinity=\nCPUAffinity=4-7\nNUMAPolicy=bind\n"
    put(
        tmp_path,
        f"/usr/lib/systemd/system/{unit}",
        "[Service]\nCPUAffinity=0-63\nNUMAPolicy=interleave\n",
    )
    put(tmp_path, ours, dropin)
    entry, foreign = effective.evaluate_unit(str(tmp_path), unit, {ours: dropin})
    assert foreign == [] and entry["fragment"] == f"/usr/lib/systemd/system/{unit}"
    put(tmp_path, f"{ETC}/{unit}.d/60-local.conf", "[Service]\nCPUAffinity=0-63\n")
    entry, foreign = effective.evaluate_unit(str(tmp_path), unit, {ours: dropin})
    assert [(o.property, o.effective) for o in foreign] == [("CPUAffinity", "0-63")]


def test_slice_properties(tmp_path):
    unit = "numafleet-ml.slice"
    text = "[Slice]\nAllowedCPUs=2-9\nAllowedMemoryNodes=0\n"
    put(tmp_path, f"{ETC}/{unit}", text)
    put(tmp_path, f"{ETC}/slice.d/10-all.conf", "[Slice]\nAllowedMemoryNodes=\n")
    dummy, foreign = effective.evaluate_unit(str(tmp_path), unit, {f"{ETC}/{unit}": text})
    # the type drop-in slice.d/ applies after the fragment: its empty assignment resets
    assert [(o.property, o.effective, o.source) for o in foreign] == [
        ("AllowedMemoryNodes", None, f"{ETC}/slice.d/10-all.conf")
    ]


def test_dropin_dir_names():
    assert effective.dropin_dir_names("numafleet-a-b.service") == [
        "numafleet-a-b.service.d",
        "numafleet-a-.service.d",
        "numafleet-.service.d",
        "service.d",
    ]
    assert effective.dropin_dir_names("vllm@0.service") == [
        "vllm@0.service.d",
        "vllm@.service.d",
        "service.d",
    ]


def test_parse_assignments_continuation_and_comments():
    text = (
        "[Service]\n# c\nEnvironment=A=1 \\\n# inside\n  B=2\n; x\nNUMAPolicy = bind \nnoequals\n"
    )
    assert effective.parse_assignments(text) == [
        ("Service", "Environment", "A=1 B=2"),
        ("Service", "NUMAPolicy", "bind"),
    ]


SHOW = Path(__file__).parents[4] / "unit" / "fixtures" / "cmd" / "systemctl" / "show_effective.txt"


def test_live_values_from_systemctl_show(tmp_path):
    put(tmp_path, OURS, SERVICE)
    entries, foreign = effective.evaluate(str(tmp_path), OWN)
    assert foreign == []
    shown_units = effective.parse_show(SHOW.read_text())
    assert shown_units[UNIT]["NUMAPolicy"] == "default"
    live = effective.compare_live(entries, shown_units, set(OWN))
    assert {(o.property, o.effective) for o in live} == {
        ("CPUAffinity", None),
        ("NUMAPolicy", "default"),
    }
    assert all(o.source == "systemctl show" for o in live)
    assert live[0].dropins == (f"{ETC}/{UNIT}.d/override.conf",)
    assert entries[0]["live"]["AllowedCPUs"] == "2-9"
    # a unit whose files this run changes is not compared live
    assert effective.compare_live(entries, shown_units, set(OWN), {UNIT}) == []


def test_show_argv_is_one_call():
    argv = effective.show_argv("/usr/bin/systemctl", ["a.service", "b.slice"])
    assert argv[:3] == ["/usr/bin/systemctl", "show", "--no-pager"]
    assert argv[-2:] == ["a.service", "b.slice"]
    assert "CPUAffinity" in argv[4] and "DropInPaths" in argv[4]


@pytest.mark.parametrize(
    ("raw", "want"),
    [("0-3 8", "0-3,8"), ("0 1 2 3", "0-3"), ("", ""), ("numa", "numa"), ("3,1", "1,3")],
)
def test_normalise_sets(raw, want):
    assert effective.normalise("CPUAffinity", raw) == want


def test_live_properties_an_older_systemd_does_not_show_are_not_compared(tmp_path):
    put(tmp_path, OURS, SERVICE)
    entries, dummy = effective.evaluate(str(tmp_path), OWN)
    text = f"Id={UNIT}\nLoadState=loaded\nCPUAffinity=2 3 4 5 6 7 8 9\nSlice=numafleet-ml.slice\n"
    assert effective.compare_live(entries, effective.parse_show(text), set(OWN)) == []
    assert "NUMAPolicy" not in entries[0]["live"] and entries[0]["live"]["CPUAffinity"] == "2-9"


def test_live_environment_values_with_spaces(tmp_path):
    text = SERVICE.replace('"OMP_NUM_THREADS=8"', '"OMP_NUM_THREADS=8 9"')
    own = {OURS: text}
    put(tmp_path, OURS, text)
    entries, dummy = effective.evaluate(str(tmp_path), own)
    shown_text = (
        f"Id={UNIT}\nLoadState=loaded\nEnvironment=OMP_NUM_THREADS=8 9 CUDA_VISIBLE_DEVICES=GPU-1\n"
    )
    assert effective.compare_live(entries, effective.parse_show(shown_text), set(own)) == []


def test_not_loaded_units_are_not_compared_live(tmp_path):
    put(tmp_path, OURS, SERVICE)
    entries, dummy = effective.evaluate(str(tmp_path), OWN)
    text = f"Id={UNIT}\nLoadState=not-found\nCPUAffinity=\nNUMAPolicy=n/a\n"
    assert effective.compare_live(entries, effective.parse_show(text), set(OWN)) == []


GUEST_SHOW = SHOW.parent / "show_effective_guest.txt"


def test_recorded_guest_output_of_systemctl_show(tmp_path):
    """The real output (make vm): Id after the other properties, empty CPUAffinity= when reset."""
    unit = "numafleet-cpu-only.service"
    path = f"{ETC}/{unit}"
    text = (
        "[Service]\nSlice=numafleet.slice\nCPUAffinity=1\nNUMAPolicy=bind\nNUMAMask=0\n"
        "AllowedCPUs=1\nAllowedMemoryNodes=0\n"
    )
    put(tmp_path, path, text)
    entries, dummy = effective.evaluate(str(tmp_path), {path: text})
    shown_units = effective.parse_show(GUEST_SHOW.read_text())
    assert list(shown_units) == [unit]
    live = effective.compare_live(entries, shown_units, {path})
    assert {(o.property, o.effective) for o in live} == {
        ("CPUAffinity", None),
        ("NUMAPolicy", "default"),
        ("AllowedMemoryNodes", "0-1"),
    }
    assert live[0].dropins == (
        f"/etc/systemd/system.control/{unit}.d/50-AllowedMemoryNodes.conf",
        f"{ETC}/{unit}.d/override.conf",
    )
    assert (
        entries[0]["live"]["NUMAMask"] == "0" and entries[0]["live"]["Slice"] == "numafleet.slice"
    )
