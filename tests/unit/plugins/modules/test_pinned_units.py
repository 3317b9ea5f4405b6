"""pinned_units through main(): check mode, apply, repeat, removal, systemctl use, errors."""

from __future__ import annotations

import hashlib
import json
import os

import plan_shapes  # tests/unit/plan_shapes.py (on sys.path through tests/unit/conftest.py)
import pytest

UNIT_DIR = "etc/systemd/system"
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
if [ -n "$FAKE_SYSTEMCTL_FAIL" ]; then
    echo "Failed to stop $3: $FAKE_SYSTEMCTL_FAIL" >&2
    exit 1
fi
"""


def placement(name, **overrides) -> dict:
    return plan_shapes.placement(name, **{"cpus": [2, 3], "cpus_requested": 2, **overrides})


def make_plan(*names, dropin=False) -> dict:
    placements = [
        placement(name, tenant="team-a", slice="numafleet-team\\x2da.slice") for name in names
    ]
    if dropin:
        placements.append(
            placement("vllm", unit="vllm.service", unit_kind="dropin", exec=None, argv=[])
        )
    tenants = [
        {
            "name": "team-a",
            "slice": "numafleet-team\\x2da.slice",
            "memory_max_kb": None,
            "description": None,
            "cpus": [2, 3],
            "mems": [0],
            "placements": list(names),
        }
    ]
    return {"version": 1, "host": "h1", "placements": placements, "tenants": tenants}


def tree_hash(root) -> str:
    """sha256 of the tree below root, the per-host lock file left out."""
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            if os.path.relpath(path, root) in ("run", "run/numafleet", "run/numafleet/apply.lock"):
                continue
            digest.update(os.path.relpath(path, root).encode())
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


@pytest.fixture
def scratch(tmp_path):
    """A render root holding a foreign unit, which the module must never touch."""
    root = tmp_path / "root"
    (root / UNIT_DIR).mkdir(parents=True)
    (root / UNIT_DIR / "foreign.service").write_text("[Service]\nExecStart=/usr/bin/true\n")
    return root


@pytest.fixture
def systemctl(fake_systemctl):
    """A fake systemctl first in PATH; returns the log file of its calls (absent: never run)."""
    return fake_systemctl(FAKE_SYSTEMCTL)


def args(root, plan, **extra) -> dict:
    base = {"plan": plan, "root": str(root), "service_manager": "none"}
    base.update(extra)
    return base


def test_check_mode_writes_nothing(run_module, scratch, systemctl):
    before = tree_hash(scratch)
    result = run_module(
        "pinned_units",
        args(scratch, make_plan("a", "b", dropin=True), service_manager="systemd"),
        check_mode=True,
        diff=True,
    )
    assert result["failed"] is False and result["changed"] is True
    assert tree_hash(scratch) == before
    assert not systemctl.exists()
    assert result["units"]["new"] == ["numafleet-a.service", "numafleet-b.service", "vllm.service"]
    assert result["slices"]["new"] == ["numafleet-team\\x2da.slice"]
    assert result["reload_needed"] is True
    assert result["would_run"] == [
        "systemctl daemon-reload",
        "systemctl try-restart vllm.service",
        "systemctl enable --now numafleet-a.service",
        "systemctl enable --now numafleet-b.service",
    ]
    assert result["ran"] == [] and result["handler_restart"] == [] and result["handler_start"] == []
    assert result["handler_try_restart"] == []
    # four units, the manifest and the recorded plan
    assert [f["state"] for f in result["files"]] == ["create"] * 6
    assert result["files"][-1]["path"] == "/etc/numafleet/plan.json"
    assert result["files"][-2]["path"] == "/etc/numafleet/manifest.json"
    diff = result["diff"]
    assert [d["after_header"] for d in diff] == [f["path"] for f in result["files"]]
    assert all(set(d) == {"before_header", "after_header", "before", "after"} for d in diff)
    assert all(d["before"] == "" and d["after"] for d in diff)
    assert "ExecStart=" in diff[0]["after"]


def test_apply_then_again_is_unchanged(run_module, scratch, systemctl):
    module_args = args(scratch, make_plan("a", dropin=True), service_manager="systemd")
    first = run_module("pinned_units", module_args)
    assert first["failed"] is False and first["changed"] is True
    service = scratch / UNIT_DIR / "numafleet-a.service"
    assert service.read_text().startswith("# Managed by numafleet.tuning\n")
    assert "Slice=numafleet-team\\x2da.slice\n" in service.read_text()
    assert (scratch / UNIT_DIR / "numafleet-team\\x2da.slice").is_file()
    assert (scratch / UNIT_DIR / "vllm.service.d" / "50-numafleet.conf").is_file()
    assert first["handler_start"] == ["numafleet-a.service"]
    assert first["handler_restart"] == [] and first["handler_try_restart"] == ["vllm.service"]
    assert first["ran"] == [] and not systemctl.exists()  # nothing to disable
    manifest = json.loads((scratch / "etc/numafleet/manifest.json").read_text())
    assert sorted(manifest["files"]) == [
        "/etc/systemd/system/numafleet-a.service",
        "/etc/systemd/system/numafleet-team\\x2da.slice",
        "/etc/systemd/system/vllm.service.d/50-numafleet.conf",
    ]
    assert manifest["units"] == [
        "numafleet-a.service",
        "numafleet-team\\x2da.slice",
        "vllm.service",
    ]

    before = tree_hash(scratch)
    again = run_module("pinned_units", module_args, diff=True)
    assert again["failed"] is False and again["changed"] is False
    assert again["diff"] == [] and again["reload_needed"] is False and again["would_run"] == []
    assert again["handler_start"] == [] and again["handler_restart"] == []
    assert again["handler_try_restart"] == []
    assert {f["state"] for f in again["files"]} == {"unchanged"}
    assert again["units"]["unchanged"] == ["numafleet-a.service", "vllm.service"]
    assert tree_hash(scratch) == before


def test_a_change_is_an_update_and_a_restart(run_module, scratch, systemctl):
    run_module("pinned_units", args(scratch, make_plan("a"), service_manager="systemd"))
    plan = make_plan("a")
    plan["placements"][0]["cpus"] = [4, 5]
    result = run_module(
        "pinned_units", args(scratch, plan, service_manager="systemd"), check_mode=True, diff=True
    )
    assert result["units"]["changed"] == ["numafleet-a.service"]
    assert result["would_run"] == [
        "systemctl daemon-reload",
        "systemctl restart numafleet-a.service",
    ]
    changed = [d for d in result["diff"] if d["after_header"].endswith("numafleet-a.service")]
    assert "CPUAffinity=2-3" in changed[0]["before"] and "CPUAffinity=4-5" in changed[0]["after"]
    applied = run_module("pinned_units", args(scratch, plan, service_manager="systemd"))
    assert applied["handler_restart"] == ["numafleet-a.service"] and applied["handler_start"] == []
    assert applied["handler_try_restart"] == []
    assert "CPUAffinity=4-5" in (scratch / UNIT_DIR / "numafleet-a.service").read_text()


def test_removal_disables_and_removes_only_owned_files(run_module, scratch, systemctl):
    run_module("pinned_units", args(scratch, make_plan("a", "b", dropin=True)))
    foreign_dropin = scratch / UNIT_DIR / "vllm.service.d" / "10-user.conf"
    foreign_dropin.write_text("[Service]\nNice=5\n")
    foreign = tree_hash(scratch / UNIT_DIR / "foreign.service")

    result = run_module("pinned_units", args(scratch, make_plan("a"), service_manager="systemd"))
    assert result["failed"] is False and result["changed"] is True
    assert result["units"]["removed"] == ["numafleet-b.service", "vllm.service"]
    assert result["ran"] == ["systemctl disable --now numafleet-b.service"]
    assert systemctl.read_text().splitlines() == ["disable --now numafleet-b.service"]
    # the vendor unit whose drop-in went is only restarted if it runs: never started
    assert result["handler_restart"] == [] and result["handler_try_restart"] == ["vllm.service"]
    assert result["would_run"] == [
        "systemctl disable --now numafleet-b.service",
        "systemctl daemon-reload",
        "systemctl try-restart vllm.service",
    ]
    assert not (scratch / UNIT_DIR / "numafleet-b.service").exists()
    assert not (scratch / UNIT_DIR / "vllm.service.d" / "50-numafleet.conf").exists()
    assert foreign_dropin.read_text() == "[Service]\nNice=5\n"
    assert tree_hash(scratch / UNIT_DIR / "foreign.service") == foreign
    manifest = json.loads((scratch / "etc/numafleet/manifest.json").read_text())
    assert sorted(manifest["files"]) == [
        "/etc/systemd/system/numafleet-a.service",
        "/etc/systemd/system/numafleet-team\\x2da.slice",
    ]
    states = {f["path"]: f["state"] for f in result["files"]}
    assert states["/etc/systemd/system/numafleet-b.service"] == "remove"
    assert states["/etc/numafleet/manifest.json"] == "update"


def test_service_manager_none_never_runs_systemctl(run_module, scratch, systemctl):
    run_module("pinned_units", args(scratch, make_plan("a", "b")))
    result = run_module("pinned_units", args(scratch, make_plan()))
    assert result["failed"] is False and result["changed"] is True
    assert not systemctl.exists()
    assert result["ran"] == [] and result["handler_restart"] == [] and result["handler_start"] == []
    assert "systemctl disable --now numafleet-a.service" in result["would_run"]
    assert not list((scratch / UNIT_DIR).glob("numafleet-*"))
    assert (scratch / UNIT_DIR / "foreign.service").is_file()


def test_failed_disable_fails_and_keeps_the_file(run_module, scratch, systemctl, monkeypatch):
    run_module("pinned_units", args(scratch, make_plan("a", "b")))
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "Access denied")
    result = run_module("pinned_units", args(scratch, make_plan("a"), service_manager="systemd"))
    assert result["failed"] is True
    assert "systemctl disable --now numafleet-b.service failed (rc 1)" in result["msg"]
    assert "Access denied" in result["msg"]
    assert (scratch / UNIT_DIR / "numafleet-b.service").is_file()


def test_first_run_with_nothing_planned_writes_nothing(run_module, scratch):
    before = tree_hash(scratch)
    result = run_module("pinned_units", args(scratch, make_plan()))
    assert result["changed"] is False and result["files"] == []
    assert tree_hash(scratch) == before


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda p: p.update(version=7), "host h1: plan version is 7"),
        (
            lambda p: p["placements"][0].update(argv=["/usr/bin/sleep", "1\n2"]),
            "host h1: plan placements[0] (a).exec: '1\\n2' holds the control character U+000A",
        ),
        (
            lambda p: p["placements"][0]["environment"].update({"BAD-KEY": "x"}),
            "'BAD-KEY' is not an environment variable name",
        ),
        (lambda p: p["placements"][0].pop("cpus"), "plan placements[0] (a) has no 'cpus'"),
    ],
)
def test_bad_plan_fails_with_message(run_module, scratch, mutate, fragment):
    plan = make_plan("a")
    mutate(plan)
    before = tree_hash(scratch)
    result = run_module("pinned_units", args(scratch, plan))
    assert result["failed"] is True
    assert fragment in result["msg"]
    assert tree_hash(scratch) == before


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"unit_dir": "etc/systemd/system"}, "unit_dir: 'etc/systemd/system' is not an absolute"),
        ({"manifest_path": "manifest.json"}, "manifest_path: 'manifest.json' is not an absolute"),
        ({"header": "Managed"}, "header: line 'Managed' is not a comment"),
        ({"service_manager": "openrc"}, "service_manager"),
    ],
)
def test_bad_options_fail_with_message(run_module, scratch, extra, fragment):
    result = run_module("pinned_units", args(scratch, make_plan("a"), **extra))
    assert result["failed"] is True and fragment in result["msg"]


def test_bad_manifest_fails_with_its_path(run_module, scratch):
    manifest = scratch / "etc/numafleet/manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{not json")
    result = run_module("pinned_units", args(scratch, make_plan("a")))
    assert result["failed"] is True
    assert str(manifest) in result["msg"] and "is not JSON" in result["msg"]


def test_options_reach_the_files(run_module, scratch):
    result = run_module(
        "pinned_units",
        args(
            scratch,
            make_plan("a"),
            unit_dir="/run/systemd/system",
            manifest_path="/var/lib/numafleet/m.json",
            header="#\n# Ansible managed\n#",
            hardening=False,
        ),
    )
    assert result["failed"] is False
    text = (scratch / "run/systemd/system/numafleet-a.service").read_text()
    assert text.startswith("#\n# Ansible managed\n#\n\n[Unit]\n")
    assert "NoNewPrivileges" not in text
    assert (scratch / "var/lib/numafleet/m.json").is_file()


# --- issue 19: only files numafleet wrote are ever disabled and removed --------------------------

VENDOR = "/usr/lib/systemd/system/sshd.service"
ADMIN = "/etc/systemd/system/foreign.service"
OUTSIDE = "/opt/app/app.service"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tamper(scratch, version) -> None:
    """A manifest that lists a vendor unit, an admin unit and a path outside the unit dirs."""
    for path in (VENDOR, ADMIN, OUTSIDE):
        real = scratch / path.lstrip("/")
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text("[Service]\nExecStart=/usr/sbin/sshd -D\n")
    manifest = scratch / "etc/numafleet/manifest.json"
    data = json.loads(manifest.read_text())
    if version == 1:
        data = {"version": 1, "files": sorted([*data["files"], VENDOR, ADMIN, OUTSIDE])}
    else:  # even with each file's real sha256 recorded: only numafleet's own names count
        for path in (VENDOR, ADMIN, OUTSIDE):
            data["files"][path] = _sha(scratch / path.lstrip("/"))
    manifest.write_text(json.dumps(data))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("check_mode", [False, True])
def test_foreign_manifest_entries_are_kept_never_disabled(
    run_module, scratch, systemctl, version, check_mode
):
    """Failed before: the next run ran `systemctl disable --now` on each and deleted it."""
    run_module("pinned_units", args(scratch, make_plan("a", "b", "c")))
    (scratch / UNIT_DIR / "numafleet-b.service").write_text("[Service]\nExecStart=/bin/edited\n")
    _tamper(scratch, version)
    before = {p: (scratch / p.lstrip("/")).read_text() for p in (VENDOR, ADMIN, OUTSIDE)}
    result = run_module(
        "pinned_units",
        args(scratch, make_plan("a"), service_manager="systemd"),
        check_mode=check_mode,
    )
    assert result["failed"] is False, result.get("msg")
    kept = {item["path"]: item["reason"] for item in result["kept"]}
    assert sorted(kept) == sorted(
        [ADMIN, OUTSIDE, VENDOR, "/etc/systemd/system/numafleet-b.service"]
    )
    for path in (VENDOR, ADMIN, OUTSIDE):
        assert "is not named as numafleet names its files" in kept[path]
    edited = kept["/etc/systemd/system/numafleet-b.service"]
    if version == 2:
        assert "content changed since numafleet wrote it" in edited
    else:
        assert "does not start with the header" in edited
    # only the unedited file numafleet wrote goes
    assert result["would_run"][0] == "systemctl disable --now numafleet-c.service"
    assert not [line for line in result["would_run"] if "sshd" in line or "foreign" in line]
    assert result["units"]["removed"] == ["numafleet-c.service"]
    if check_mode:
        assert not systemctl.exists()
    else:
        assert systemctl.read_text().splitlines() == ["disable --now numafleet-c.service"]
        assert not (scratch / UNIT_DIR / "numafleet-c.service").exists()
        manifest = json.loads((scratch / "etc/numafleet/manifest.json").read_text())
        assert manifest["version"] == 2 and sorted(manifest["files"]) == [
            "/etc/systemd/system/numafleet-a.service",
            "/etc/systemd/system/numafleet-team\\x2da.slice",
        ]
    for path, text in before.items():
        assert (scratch / path.lstrip("/")).read_text() == text
    assert (scratch / UNIT_DIR / "numafleet-b.service").read_text().endswith("/bin/edited\n")


def test_a_version_1_manifest_still_removes_files_with_our_header(run_module, scratch, systemctl):
    run_module("pinned_units", args(scratch, make_plan("a", "b")))
    manifest = scratch / "etc/numafleet/manifest.json"
    manifest.write_text(
        json.dumps({"version": 1, "files": sorted(json.loads(manifest.read_text())["files"])})
    )
    result = run_module("pinned_units", args(scratch, make_plan("a"), service_manager="systemd"))
    assert result["failed"] is False and result["kept"] == []
    assert systemctl.read_text().splitlines() == ["disable --now numafleet-b.service"]
    assert json.loads(manifest.read_text())["version"] == 2


def test_a_listed_unit_that_became_a_link_is_kept(run_module, scratch, systemctl):
    run_module("pinned_units", args(scratch, make_plan("a", "b")))
    unit = scratch / UNIT_DIR / "numafleet-b.service"
    unit.unlink()
    unit.symlink_to("/dev/null")
    result = run_module("pinned_units", args(scratch, make_plan("a"), service_manager="systemd"))
    assert result["failed"] is False
    assert [item["path"] for item in result["kept"]] == ["/etc/systemd/system/numafleet-b.service"]
    assert "symbolic link" in result["kept"][0]["reason"]
    assert unit.is_symlink() and not systemctl.exists()


@pytest.mark.parametrize(
    "level", ["etc", "etc/systemd", "etc/systemd/system", "etc/numafleet", "run"]
)
def test_a_linked_directory_at_any_level_is_refused_and_nothing_lands_there(
    run_module, tmp_path, level
):
    """Failed before for every level but the immediate parent of a file."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / level).parent.mkdir(parents=True, exist_ok=True)
    outside.mkdir()
    (root / level).symlink_to(outside)
    result = run_module("pinned_units", args(root, make_plan("a")))
    assert result["failed"] is True
    assert str(root / level) in result["msg"] and "symbolic link" in result["msg"]
    assert list(outside.rglob("*")) == []


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_modes_are_the_same_under_any_umask(run_module, tmp_path, mask):
    (tmp_path / "root").mkdir()  # an existing root is locked: the lock file is checked too
    old = os.umask(mask)
    try:
        result = run_module("pinned_units", args(tmp_path / "root", make_plan("a", dropin=True)))
    finally:
        os.umask(old)
    assert result["failed"] is False
    modes = {}
    for base, dirs, names in os.walk(tmp_path / "root"):
        for name in dirs + names:
            path = os.path.join(base, name)
            modes[os.path.relpath(path, tmp_path / "root")] = os.stat(path).st_mode & 0o777
    assert modes.pop("run/numafleet/apply.lock") == 0o644
    assert modes == {
        path: (0o644 if path.endswith((".service", ".slice", ".conf", ".json")) else 0o755)
        for path in modes
    }
    assert modes["etc/systemd/system"] == 0o755 and modes["etc/numafleet/manifest.json"] == 0o644


def test_the_module_fails_when_another_run_holds_the_lock(run_module, scratch, monkeypatch):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import files

    monkeypatch.setattr(files, "LOCK_TIMEOUT_S", 0.2)
    lock = scratch / "run/numafleet/apply.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("4242\n")
    import fcntl

    with open(lock, "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = run_module("pinned_units", args(scratch, make_plan("a")))
        checked = run_module("pinned_units", args(scratch, make_plan("a")), check_mode=True)
    assert result["failed"] is True
    assert str(lock) in result["msg"] and "PID 4242" in result["msg"]
    assert not (scratch / UNIT_DIR / "numafleet-a.service").exists()
    assert checked["failed"] is False and checked["changed"] is True  # check mode takes no lock


def test_a_preflight_only_change_rewrites_and_restarts_nothing(run_module, scratch, systemctl):
    """The first run of a release with the memory guard's preflight (or a new mode): the unit
    files get the ExecStartPre= line, a service and a drop-in alike, and nothing restarts."""
    plan = make_plan("a", dropin=True)
    run_module("pinned_units", args(scratch, plan, service_manager="systemd", preflight="off"))
    service = scratch / UNIT_DIR / "numafleet-a.service"
    assert "ExecStartPre=" not in service.read_text()
    check = run_module(
        "pinned_units", args(scratch, plan, service_manager="systemd"), check_mode=True
    )
    assert sorted(check["units"]["changed"]) == ["numafleet-a.service", "vllm.service"]
    assert check["rewritten"] == ["numafleet-a.service", "vllm.service"]
    assert check["would_run"] == ["systemctl daemon-reload"]
    applied = run_module("pinned_units", args(scratch, plan, service_manager="systemd"))
    assert applied["handler_restart"] == [] and applied["handler_try_restart"] == []
    assert applied["handler_start"] == []
    assert (
        "ExecStartPre=-/usr/local/sbin/numafleet-guard preflight --mode warn a"
        in service.read_text().splitlines()
    )
    enforce = run_module(
        "pinned_units", args(scratch, plan, service_manager="systemd", preflight="enforce")
    )
    assert enforce["rewritten"] == ["numafleet-a.service", "vllm.service"]
    assert enforce["handler_restart"] == [] and enforce["handler_try_restart"] == []
