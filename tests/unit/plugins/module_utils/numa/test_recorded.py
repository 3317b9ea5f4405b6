"""recorded.read_recorded: the recorded plan (never trusted blindly) and the digests of the files
the manifests list, as numa_facts publishes them (ansible_facts.numafleet_recorded)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import facts, units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
    digest,
    read_recorded,
    state_digest,
)

UNIT = "/etc/systemd/system/numafleet-a.service"


def put(root, path: str, text: str) -> str:
    real = units.under_root(str(root), path)
    os.makedirs(os.path.dirname(real), exist_ok=True)
    with open(real, "w", encoding="utf-8") as out:
        out.write(text)
    return real


def test_nothing_recorded(tmp_path):
    got = read_recorded(str(tmp_path))
    assert got == {
        "root": str(tmp_path),
        "plan_path": "/etc/numafleet/plan.json",
        "state": "absent",
        "kind": "absent",
        "error": None,
        "plan": None,
        "plan_sha256": None,
        "files": {},
        "manifest_errors": [],
        "kept": [],
        "kernel_args": [],
    }


def test_the_kernel_args_the_hugepages_layer_wrote_last(tmp_path):
    put(
        tmp_path,
        "/etc/numafleet/hugepages.json",
        json.dumps({"version": 1, "kernel_args": ["nohz_full=2-7"]}),
    )
    assert read_recorded(str(tmp_path))["kernel_args"] == ["nohz_full=2-7"]
    put(tmp_path, "/etc/numafleet/hugepages.json", "{not json")
    assert read_recorded(str(tmp_path))["kernel_args"] is None


def test_plan_and_manifest_digests(tmp_path):
    plan = {"version": 1, "host": "h", "placements": []}
    put(tmp_path, "/etc/numafleet/plan.json", units.plan_record_text(plan))
    put(tmp_path, UNIT, "[Service]\n")
    put(
        tmp_path,
        "/etc/numafleet/manifest.json",
        units.manifest_text({UNIT: "[Service]\n", "/etc/systemd/system/numafleet-t.slice": ""}),
    )
    got = read_recorded(str(tmp_path))
    assert (got["state"], got["plan"], got["error"]) == ("present", plan, None)
    assert got["files"][UNIT] == hashlib.sha256(b"[Service]\n").hexdigest() == digest("[Service]\n")
    assert got["files"]["/etc/systemd/system/numafleet-t.slice"] is None  # listed, gone
    assert "/etc/numafleet/manifest.json" in got["files"]


@pytest.mark.parametrize(
    ("make", "error", "kind"),
    [
        (lambda real: open(real, "w").write("{not json"), "is not JSON", "file"),
        (lambda real: open(real, "w").write("[1, 2]"), "is not a JSON object", "file"),
        (lambda real: os.symlink("/etc/hostname", real), "is a symbolic link", "link"),
        (os.mkdir, "is a directory", "directory"),
    ],
)
def test_a_bad_plan_file_is_invalid_with_the_reason(tmp_path, make, error, kind):
    real = units.under_root(str(tmp_path), "/etc/numafleet/plan.json")
    os.makedirs(os.path.dirname(real))
    make(real)
    got = read_recorded(str(tmp_path))
    assert got["state"] == "invalid" and got["plan"] is None and error in got["error"]
    assert got["kind"] == kind


def test_a_malformed_manifest_is_named_not_raised(tmp_path):
    put(tmp_path, "/etc/numafleet/mps-units.json", json.dumps({"version": 7}))
    got = read_recorded(str(tmp_path))
    (message,) = got["manifest_errors"]
    assert "mps-units.json" in message and "manifest" in message


def test_gather_facts_publishes_it_and_refuses_a_relative_root(fixture_root, tmp_path):
    root = fixture_root("synthetic-gh200")
    base = dict(
        sysfs_root=f"{root}/sys",
        procfs_root=f"{root}/proc",
        gpu=False,
        state_paths=[],
    )
    got, dummy = facts.gather_facts(
        {**base, "recorded_root": str(tmp_path)}, False, None, None, None
    )
    assert got["numafleet_recorded"] == read_recorded(str(tmp_path))
    with pytest.raises(NumaTuneError, match="recorded_root: 'etc' is not an absolute path"):
        facts.gather_facts({**base, "recorded_root": "etc"}, False, None, None, None)


def test_linked_manifests_and_units_are_never_followed_as_the_modules_do(tmp_path):
    """A linked manifest is an error, a linked unit is 'other' (issue 19: never through a link)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_text(units.manifest_text({UNIT: "[Service]\n"}))
    (outside / "unit").write_text("[Service]\n")
    root = tmp_path / "root"
    put(root, "/etc/numafleet/keep", "")
    os.symlink(
        outside / "manifest.json", units.under_root(str(root), "/etc/numafleet/manifest.json")
    )
    got = read_recorded(str(root))
    assert len(got["manifest_errors"]) == 1 and "symbolic link" in got["manifest_errors"][0]
    os.unlink(units.under_root(str(root), "/etc/numafleet/manifest.json"))
    put(root, "/etc/numafleet/manifest.json", units.manifest_text({UNIT: "[Service]\n"}))
    real_unit = units.under_root(str(root), UNIT)
    os.makedirs(os.path.dirname(real_unit))
    os.symlink(outside / "unit", real_unit)
    got = read_recorded(str(root))
    assert got["manifest_errors"] == []
    assert got["files"][UNIT] == "kept" and "symbolic link" in got["kept"][0]


def test_a_linked_plan_file_is_replaced_even_with_the_same_text(tmp_path):
    plan = {"version": 1, "host": "h", "placements": []}
    outside = tmp_path / "outside.json"
    outside.write_text(units.plan_record_text(plan))
    real = units.under_root(str(tmp_path / "root"), "/etc/numafleet/plan.json")
    os.makedirs(os.path.dirname(real))
    os.symlink(outside, real)
    change = units.plan_record_change(str(tmp_path / "root"), "/etc/numafleet/plan.json", plan)
    assert change.state == "update"
    units.write_files(str(tmp_path / "root"), [change])
    assert not os.path.islink(real) and read_recorded(str(tmp_path / "root"))["state"] == "present"
    assert outside.read_text() == units.plan_record_text(plan)


def test_an_edited_or_foreign_listed_file_is_kept_and_never_stopped_by_the_change_plan(tmp_path):
    """Issue 19: the change plan said `stop` for whatever a manifest listed."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import change_plan

    edited, custom = UNIT, "/srv/units/numafleet-c.service"
    put(tmp_path, edited, "[Service]\nExecStart=/bin/edited\n")
    put(tmp_path, custom, "# Managed by numafleet.tuning\n[Service]\n")
    put(
        tmp_path,
        "/etc/numafleet/manifest.json",
        units.manifest_text(
            {edited: "[Service]\n", custom: "# Managed by numafleet.tuning\n[Service]\n"}
        ),
    )
    got = read_recorded(str(tmp_path))
    assert got["files"][edited] == "kept" and "content changed" in got["kept"][0]
    assert got["files"][custom] == digest("# Managed by numafleet.tuning\n[Service]\n")
    plan = {"version": 1, "host": "h", "placements": [], "mps_daemons": []}
    result = change_plan("h", plan, plan, {}, {}, got["files"], allow_removals=True)
    assert result["units"]["stop"] == ["numafleet-c.service"]  # a custom unit_dir still counts


def test_state_digest_follows_the_plan_file_and_every_owned_file(tmp_path):
    empty = state_digest(read_recorded(str(tmp_path)))
    plan = put(tmp_path, "/etc/numafleet/plan.json", '{"version": 1, "host": "h"}\n')
    with_plan = read_recorded(str(tmp_path))
    assert with_plan["plan_sha256"] == hashlib.sha256(open(plan, "rb").read()).hexdigest()
    assert state_digest(with_plan) != empty
    put(tmp_path, UNIT, "[Service]\n")
    put(tmp_path, "/etc/numafleet/manifest.json", units.manifest_text({UNIT: "[Service]\n"}))
    with_unit = read_recorded(str(tmp_path))
    assert with_unit["files"][UNIT] == digest("[Service]\n")
    assert state_digest(with_unit) != state_digest(with_plan)
    # The same bytes read again, or the facts after a JSON round trip: the same digest.
    again = json.loads(json.dumps(read_recorded(str(tmp_path))))
    assert state_digest(again) == state_digest(with_unit)
    # One byte of an owned file, or of the plan, changes it.
    put(tmp_path, UNIT, "[Service]\n#\n")
    assert state_digest(read_recorded(str(tmp_path))) != state_digest(with_unit)
    put(tmp_path, UNIT, "[Service]\n")
    put(tmp_path, "/etc/numafleet/plan.json", '{"version": 1, "host": "h" }\n')
    assert state_digest(read_recorded(str(tmp_path))) != state_digest(with_unit)


def test_state_digest_of_no_recording_is_stable():
    assert state_digest(None) == state_digest({}) == state_digest({"files": "not a dict"})
