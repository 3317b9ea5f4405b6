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
    # every setting our file assigns in [Unit] and [Service] is compared
    assert set(entry["properties"]) == {
        "Description",
        "ExecStart",
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


def test_linked_dropin_directory_is_followed_below_the_root(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, "/srv/dropins/90.conf", "[Service]\nNUMAPolicy=default\n")
    os.symlink("/srv/dropins", tmp_path / f"etc/systemd/system/{UNIT}.d")
    entry, foreign = props(tmp_path)
    item = foreign["NUMAPolicy"]
    assert item.source == f"{ETC}/{UNIT}.d/90.conf"
    assert item.detail == "link to /srv/dropins/90.conf"


def test_linked_dropin_directory_out_of_the_root_is_unreadable_drift(tmp_path):
    root = tmp_path / "root"
    put(root, OURS, SERVICE)
    elsewhere = tmp_path / "dir"
    elsewhere.mkdir()
    (elsewhere / "90.conf").write_text("[Service]\nNUMAPolicy=default\n")
    os.symlink("../../../../dir", root / f"etc/systemd/system/{UNIT}.d")
    entry, foreign = props(root)
    # not read, so not known to be harmless: drift of the unit, with the directory named
    assert [(o.property, o.source) for o in foreign.values()] == [
        (effective.UNREADABLE, f"{ETC}/{UNIT}.d")
    ]
    assert "out of the root" in foreign[effective.UNREADABLE].detail


def test_unreadable_file_is_reported_not_raised(tmp_path):
    put(tmp_path, OURS, SERVICE)
    (tmp_path / f"etc/systemd/system/{UNIT}.d/60-fifo.conf").parent.mkdir(parents=True)
    os.mkfifo(tmp_path / f"etc/systemd/system/{UNIT}.d/60-fifo.conf")
    entry, foreign = props(tmp_path)
    assert entry["unread"] and entry["unread"][0]["path"].endswith("60-fifo.conf")
    # a file systemd reads but numafleet cannot is drift, never "clean"
    unreadable = foreign[effective.UNREADABLE]
    assert unreadable.source.endswith("60-fifo.conf")
    assert "is not a regular file" in unreadable.detail
    message = unreadable.message("h")
    assert message.startswith(f"host h: {UNIT}: systemd reads {ETC}/{UNIT}.d/60-fifo.conf")
    assert "make it readable or remove that file" in message


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


# --- EnvironmentFile=, UnsetEnvironment= (systemd.exec(5)) ------------------------------------


def test_environment_file_overrides_a_planned_variable(tmp_path):
    put(tmp_path, OURS, SERVICE)
    dropin = f"{ETC}/{UNIT}.d/env.conf"
    put(tmp_path, dropin, "[Service]\nEnvironmentFile=/etc/default/embed\n")
    put(tmp_path, "/etc/default/embed", "# site\nCUDA_VISIBLE_DEVICES=0\nOTHER=1\n")
    entry, foreign = props(tmp_path)
    assert set(foreign) == {"Environment.CUDA_VISIBLE_DEVICES"}
    item = foreign["Environment.CUDA_VISIBLE_DEVICES"]
    assert (item.planned, item.effective, item.source) == ("GPU-1", "0", dropin)
    assert item.detail == "EnvironmentFile=/etc/default/embed"
    message = item.message("gpu-a100-01")
    assert dropin in message and "EnvironmentFile=/etc/default/embed" in message
    assert item.as_dict()["detail"] == "EnvironmentFile=/etc/default/embed"
    # the same value in the file is harmless
    put(tmp_path, "/etc/default/embed", "CUDA_VISIBLE_DEVICES=GPU-1\n")
    assert props(tmp_path)[1] == {}


def test_environment_file_values_win_over_later_environment_lines(tmp_path):
    put(tmp_path, OURS, SERVICE)
    # 10-env.conf sorts before our settings would be re-applied, yet the file wins: systemd
    # applies EnvironmentFile= variables after all Environment= lines.
    put(tmp_path, f"/run/systemd/system/{UNIT}.d/10-env.conf", "[Service]\nEnvironmentFile=/e\n")
    put(tmp_path, "/e", 'OMP_NUM_THREADS="2"\n')
    dummy, foreign = props(tmp_path)
    assert foreign["Environment.OMP_NUM_THREADS"].effective == "2"


def test_optional_missing_environment_file_is_ignored_and_a_required_one_is_drift(tmp_path):
    put(tmp_path, OURS, SERVICE)
    dropin = f"{ETC}/{UNIT}.d/env.conf"
    put(tmp_path, dropin, "[Service]\nEnvironmentFile=-/etc/default/none\n")
    entry, foreign = props(tmp_path)
    assert foreign == {} and entry["unread"] == []
    put(tmp_path, dropin, "[Service]\nEnvironmentFile=/etc/default/none\n")
    entry, foreign = props(tmp_path)
    item = foreign[effective.UNREADABLE]
    assert item.source == "/etc/default/none" and dropin in item.detail
    assert "refuse to start" in item.detail


def test_empty_environment_file_assignment_resets_the_list(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, "/e", "CUDA_VISIBLE_DEVICES=0\n")
    put(tmp_path, f"{ETC}/{UNIT}.d/a.conf", "[Service]\nEnvironmentFile=/e\n")
    put(tmp_path, f"{ETC}/{UNIT}.d/b.conf", "[Service]\nEnvironmentFile=\n")
    assert props(tmp_path)[1] == {}


def test_unreadable_environment_file_is_drift(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, f"{ETC}/{UNIT}.d/a.conf", "[Service]\nEnvironmentFile=/etc/default\n")
    (tmp_path / "etc/default").mkdir()
    dummy, foreign = props(tmp_path)
    assert foreign[effective.UNREADABLE].source == "/etc/default"


@pytest.mark.parametrize(
    ("unset", "gone"),
    [
        ("CUDA_VISIBLE_DEVICES", True),
        ("CUDA_VISIBLE_DEVICES=GPU-1", True),
        ("CUDA_VISIBLE_DEVICES=GPU-2", False),  # only an exact VAR=VALUE is removed
        ("OTHER", False),
    ],
)
def test_unset_environment(tmp_path, unset, gone):
    put(tmp_path, OURS, SERVICE)
    dropin = f"{ETC}/{UNIT}.d/unset.conf"
    put(tmp_path, dropin, f"[Service]\nUnsetEnvironment={unset}\n")
    dummy, foreign = props(tmp_path)
    if gone:
        item = foreign["Environment.CUDA_VISIBLE_DEVICES"]
        assert item.effective is None and item.source == dropin
        assert item.detail == f"UnsetEnvironment={unset}"
        assert "remove the UnsetEnvironment= line from" in item.message()
    else:
        assert foreign == {}


def test_unset_environment_applies_after_environment_files(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, "/e", "CUDA_VISIBLE_DEVICES=GPU-1\n")
    put(tmp_path, f"{ETC}/{UNIT}.d/a.conf", "[Service]\nUnsetEnvironment=CUDA_VISIBLE_DEVICES\n")
    put(tmp_path, f"{ETC}/{UNIT}.d/b.conf", "[Service]\nEnvironmentFile=/e\n")
    assert props(tmp_path)[1]["Environment.CUDA_VISIBLE_DEVICES"].effective is None


def test_parse_env_file_quotes_comments_and_continuations():
    text = (
        '# comment\n; also\n\n  A = 1  \nB=\'x y # z\'\nC="q \\"w\\" \\$x \\n"\n'
        'D=one\\\ntwo\nE=a\\ b  \nnot a line\n1BAD=x\nF="multi\nline"\n'
    )
    assert effective.parse_env_file(text) == [
        ("A", "1"),
        ("B", "x y # z"),
        ("C", 'q "w" $x \\n'),
        ("D", "onetwo"),
        ("E", "a b"),
        ("F", "multi\nline"),
    ]


def test_environment_file_link_is_followed_below_the_root(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, f"{ETC}/{UNIT}.d/env.conf", "[Service]\nEnvironmentFile=/etc/default/embed\n")
    put(tmp_path, "/srv/env", "CUDA_VISIBLE_DEVICES=0\n")
    (tmp_path / "etc/default").mkdir(parents=True)
    os.symlink("/srv/env", tmp_path / "etc/default/embed")  # absolute: taken below the root
    dummy, foreign = props(tmp_path)
    item = foreign["Environment.CUDA_VISIBLE_DEVICES"]
    assert item.detail == "EnvironmentFile=/etc/default/embed (link to /srv/env)"


# --- links --------------------------------------------------------------------------------------


def test_linked_dropin_is_followed_and_named_with_its_target(tmp_path):
    put(tmp_path, OURS, SERVICE)
    put(tmp_path, "/elsewhere/x.conf", "[Service]\nCPUAffinity=0\n")
    (tmp_path / f"etc/systemd/system/{UNIT}.d").mkdir(parents=True)
    link = f"{ETC}/{UNIT}.d/link.conf"
    os.symlink("../../../../elsewhere/x.conf", tmp_path / link.lstrip("/"))
    entry, foreign = props(tmp_path)
    item = foreign["CPUAffinity"]
    assert (item.effective, item.source, item.detail) == (
        "0,2-9",
        link,
        "link to /elsewhere/x.conf",
    )
    assert entry["links"] == {link: "/elsewhere/x.conf"} and link in entry["dropins"]
    assert "remove the link" in item.message()


@pytest.mark.parametrize("kind", ["outside", "loop"])
def test_linked_dropin_out_of_the_root_or_in_a_loop_is_unreadable_drift(tmp_path, kind):
    root = tmp_path / "root"
    put(root, OURS, SERVICE)
    (tmp_path / "x.conf").write_text("[Service]\nCPUAffinity=0\n")
    (root / f"etc/systemd/system/{UNIT}.d").mkdir(parents=True)
    link = root / f"etc/systemd/system/{UNIT}.d/link.conf"
    if kind == "outside":
        os.symlink("../../../../../x.conf", link)
    else:
        os.symlink("link.conf", link)
    entry, foreign = props(root)
    item = foreign[effective.UNREADABLE]
    assert item.source == f"{ETC}/{UNIT}.d/link.conf" and "symbolic link" in item.detail
    assert ("out of the root" if kind == "outside" else "loop") in item.detail


def test_dangling_dropin_link_is_ignored_as_systemd_ignores_it(tmp_path):
    put(tmp_path, OURS, SERVICE)
    (tmp_path / f"etc/systemd/system/{UNIT}.d").mkdir(parents=True)
    os.symlink("/nowhere.conf", tmp_path / f"etc/systemd/system/{UNIT}.d/x.conf")
    entry, foreign = props(tmp_path)
    assert foreign == {} and entry["unread"][0]["ignored"] is True


# --- every planned setting ------------------------------------------------------------------------


SLICE = "numafleet-team\\x2da.slice"
SLICE_TEXT = "[Unit]\nDescription=t\n\n[Slice]\nAllowedCPUs=2-9\nAllowedMemoryNodes=0\nMemoryMax=4294967296\n"


@pytest.mark.parametrize(
    ("override", "effective_value"),
    [("MemoryMax=infinity", "infinity"), ("MemoryMax=8G", "8589934592"), ("MemoryMax=", None)],
)
def test_slice_memory_max_override_is_drift(tmp_path, override, effective_value):
    path = f"{ETC}/{SLICE}"
    put(tmp_path, path, SLICE_TEXT)
    control = f"/etc/systemd/system.control/{SLICE}.d/50-MemoryMax.conf"
    put(tmp_path, control, f"[Slice]\n{override}\n")
    dummy, foreign = effective.evaluate_unit(str(tmp_path), SLICE, {path: SLICE_TEXT})
    assert [(o.property, o.effective, o.source) for o in foreign] == [
        ("MemoryMax", effective_value, control)
    ]


def test_slice_memory_max_in_other_units_is_the_same(tmp_path):
    path = f"{ETC}/{SLICE}"
    put(tmp_path, path, SLICE_TEXT)
    put(tmp_path, f"{ETC}/{SLICE}.d/x.conf", "[Slice]\nMemoryMax=4G\n")
    assert effective.evaluate_unit(str(tmp_path), SLICE, {path: SLICE_TEXT})[1] == []


def test_other_planned_service_settings_are_compared(tmp_path):
    text = SERVICE + "LimitMEMLOCK=infinity\nNoNewPrivileges=yes\nUser=svc\nRestart=on-failure\n"
    put(tmp_path, OURS, text)
    dropin = f"{ETC}/{UNIT}.d/x.conf"
    put(
        tmp_path,
        dropin,
        "[Unit]\nAfter=foo.service\n[Service]\nLimitMEMLOCK=infinity:infinity\n"
        "NoNewPrivileges=true\nUser=root\nExecStart=\nExecStart=/bin/other\n",
    )
    entry, foreign = effective.evaluate_unit(str(tmp_path), UNIT, {OURS: text})
    # a harmless extra dependency, the same limit and boolean written otherwise: in effect
    assert {o.property: o.effective for o in foreign} == {"User": "root", "ExecStart": "/bin/other"}


def test_dependencies_are_in_effect_while_every_planned_unit_is_listed(tmp_path):
    text = "[Unit]\nAfter=numafleet-mig.service\n[Service]\nExecStart=/bin/x\n"
    put(tmp_path, OURS, text)
    put(tmp_path, f"{ETC}/{UNIT}.d/x.conf", "[Unit]\nAfter=network.target\n")
    entry, foreign = effective.evaluate_unit(str(tmp_path), UNIT, {OURS: text})
    assert foreign == [] and entry["properties"]["After"]["effective"] == (
        "numafleet-mig.service network.target"
    )


# --- the fix per source ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "revert"),
    [
        (f"{ETC}/{UNIT}.d/override.conf", True),
        (f"/run/systemd/system.control/{UNIT}.d/50-CPUAffinity.conf", True),
        (f"{ETC}/numafleet-.service.d/10-x.conf", False),
        (f"{ETC}/service.d/10-all.conf", False),
        (f"/usr/lib/systemd/system/{UNIT}.d/x.conf", False),
    ],
)
def test_fix_offers_revert_only_where_it_removes_the_file(source, revert):
    message = effective.Override(UNIT, "NUMAPolicy", "bind", "default", source).message()
    assert ("systemctl revert numafleet-embed.service" in message) is revert
    if not revert:
        assert "systemctl revert does not remove it" in message
        name = source.rsplit("/", 1)[1]
        assert f"ln -s /dev/null {ETC}/{UNIT}.d/{name}" in message


def test_the_suggested_mask_hides_the_prefix_dropin_for_this_unit(tmp_path):
    put(tmp_path, OURS, SERVICE)
    prefix = f"{ETC}/numafleet-.service.d/10-x.conf"
    put(tmp_path, prefix, "[Service]\nNUMAPolicy=interleave\n")
    dummy, foreign = props(tmp_path)
    mask = foreign["NUMAPolicy"].message().rsplit("ln -s /dev/null ", 1)[1].split(",")[0]
    (tmp_path / mask.lstrip("/")).parent.mkdir(parents=True)
    os.symlink("/dev/null", tmp_path / mask.lstrip("/"))
    assert props(tmp_path)[1] == {}


def test_raw_bytes_of_a_foreign_dropin_are_shown_escaped(tmp_path):
    put(tmp_path, OURS, SERVICE)
    target = tmp_path / f"etc/systemd/system/{UNIT}.d/bad.conf"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"[Service]\nNUMAPolicy=\xff\xfe\x00default\n")
    dummy, foreign = props(tmp_path)
    item = foreign["NUMAPolicy"]
    assert item.effective == "\\xff\\xfe\\x00default"
    message = item.message("h")
    assert "\x00" not in message and "\ufffd" not in message
    assert "NUMAPolicy is \\xff\\xfe\\x00default" in message


RENDER_NODE_SERVICE = SERVICE + (
    "DevicePolicy=closed\nDeviceAllow=/dev/kfd rw\nDeviceAllow=/dev/dri/renderD160 rw\n"
)


def test_device_allow_is_compared_as_the_gpus_the_unit_may_open(tmp_path):
    own = {OURS: RENDER_NODE_SERVICE}
    put(tmp_path, OURS, RENDER_NODE_SERVICE)
    entry, foreign = props(tmp_path, own)
    assert foreign == {}
    assert entry["properties"]["DeviceAllow"]["effective"] == (
        "/dev/kfd rw ; /dev/dri/renderD160 rw"
    )
    assert entry["properties"]["DevicePolicy"]["ok"] is True
    # the user's own drop-in adding an RDMA adapter: not a GPU, in effect
    put(
        tmp_path,
        f"{ETC}/{UNIT}.d/zz-rdma.conf",
        "[Service]\nDeviceAllow=/dev/infiniband/uverbs0 rw\n",
    )
    entry, foreign = props(tmp_path, own)
    assert foreign == {} and entry["properties"]["DeviceAllow"]["ok"] is True


@pytest.mark.parametrize(
    "dropin",
    [
        "[Service]\nDeviceAllow=/dev/dri/renderD161 rw\n",  # another logical GPU
        "[Service]\nDeviceAllow=char-drm rw\n",  # every DRM device
        "[Service]\nDeviceAllow=\nDeviceAllow=/dev/kfd rw\n",  # its render node removed
    ],
)
def test_device_allow_widened_or_cut_is_a_foreign_override(tmp_path, dropin):
    own = {OURS: RENDER_NODE_SERVICE}
    put(tmp_path, OURS, RENDER_NODE_SERVICE)
    put(tmp_path, f"{ETC}/{UNIT}.d/zz-vendor.conf", dropin)
    dummy, foreign = props(tmp_path, own)
    assert set(foreign) == {"DeviceAllow"}
    assert foreign["DeviceAllow"].source.endswith("zz-vendor.conf")


def test_device_policy_reopened_is_a_foreign_override(tmp_path):
    own = {OURS: RENDER_NODE_SERVICE}
    put(tmp_path, OURS, RENDER_NODE_SERVICE)
    put(tmp_path, f"{ETC}/{UNIT}.d/zz-vendor.conf", "[Service]\nDevicePolicy=auto\n")
    dummy, foreign = props(tmp_path, own)
    assert set(foreign) == {"DevicePolicy"}
