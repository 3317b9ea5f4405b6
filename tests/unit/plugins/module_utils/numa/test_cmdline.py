"""cmdline.py and its use by the hugepages layer: kernel CPU isolation on the kernel command line,
the refusals before the gate, and the /proc/cmdline reboot contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import cmdline
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import hugepages as hp
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import (
    add_kernel_cmdline,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _apply_args

GOLDEN = Path(__file__).parents[3] / "fixtures" / "sysfs"
QEMU = "qemu-2node-pxb"  # real 2-node guest, CPUs 0-3, a kernel with CONFIG_NO_HZ_FULL
M2 = 2048
NOHZ = ["nohz_full=2-7", "rcu_nocbs=2-7", "irqaffinity=0-1"]


def numa_facts(online=range(8), allowed=None, isolated=(), release="6.1.0-18-amd64", nohz=True):
    """A trimmed ansible_facts.numa with the keys cmdline.py reads."""
    return {
        "cpus": {"online": list(online), "isolated": list(isolated), "nohz_full": []},
        "allowed": {"cpus": list(online if allowed is None else allowed)},
        "kernel": {"osrelease": release, "nohz_full_supported": nohz, "cmdline": None},
    }


# --- the isolated set and its arguments ---------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("nohz_full", NOHZ),
        ("isolcpus", ["isolcpus=managed_irq,domain,2-7", "irqaffinity=0-1"]),
        ("none", []),
    ],
)
def test_arguments_of_each_mode(mode, want):
    got = cmdline.plan_isolation(mode, numa_facts(), [0, 1])
    assert got["kernel_args"] == want
    if want:
        assert (got["isolated_cpus"], got["housekeeping_cpus"]) == ([2, 3, 4, 5, 6, 7], [0, 1])


def test_the_recorded_guest_gets_every_cpu_but_housekeeping():
    numa = json.loads((GOLDEN / f"{QEMU}.numa.json").read_text(encoding="utf-8"))
    assert numa["kernel"]["nohz_full_supported"] is True
    got = cmdline.plan_isolation("nohz_full", numa, [0])
    assert got["kernel_args"] == ["nohz_full=1-3", "rcu_nocbs=1-3", "irqaffinity=0"]


def test_cpus_outside_the_allowed_cpuset_are_not_isolated():
    # a container cpuset of 0-5: 6-7 are no CPUs of ours
    got = cmdline.plan_isolation("nohz_full", numa_facts(allowed=range(6)), [0, 1])
    assert got["isolated_cpus"] == [2, 3, 4, 5]


def test_the_set_stays_the_same_after_the_reboot_that_isolates_it():
    # isolcpus took 2-7 out of PID 1's affinity; allowed (a pid1 source) may lack them
    after = numa_facts(allowed=[0, 1], isolated=range(2, 8))
    before = numa_facts()
    assert cmdline.plan_isolation("isolcpus", after, [0, 1]) == cmdline.plan_isolation(
        "isolcpus", before, [0, 1]
    )


# --- refusals (before the gate) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "facts", "reserved", "fragments"),
    [
        ("nohz_full", numa_facts(), [], ["numafleet_reserved_cpus names no online CPU"]),
        ("nohz_full", numa_facts(), [9], ["numafleet_reserved_cpus names no online CPU"]),
        ("isolcpus", numa_facts(), list(range(8)), ["no CPU is left to isolate"]),
        ("isolcpus", numa_facts(release="5.4.0-150-generic"), [0], ["Linux 5.6", "is 5.4"]),
        ("isolcpus", numa_facts(release=None), [0], ["Linux 5.6", "is unknown"]),
        ("nohz_full", numa_facts(nohz=False), [0], ["CONFIG_NO_HZ_FULL", "nohz_full is absent"]),
        ("nohz", numa_facts(), [0], ["'nohz' is not one of none, nohz_full, isolcpus"]),
        ("nohz_full", {}, [0], ["Gather the facts"]),
    ],
)
def test_refusals_name_the_variable_and_the_fix(mode, facts, reserved, fragments):
    with pytest.raises(cmdline.CmdlineError) as err:
        cmdline.plan_isolation(mode, facts, reserved)
    text = str(err.value)
    assert text.startswith("numafleet_kernel_isolation: ")
    for fragment in fragments:
        assert fragment in text


def test_facts_of_an_older_release_skip_the_kernel_checks():
    facts = numa_facts()
    facts["kernel"] = {}
    assert cmdline.plan_isolation("isolcpus", facts, [0])["kernel_args"]
    assert cmdline.plan_isolation("nohz_full", facts, [0])["kernel_args"]


def test_isolcpus_warns_for_each_placement_of_more_than_one_cpu():
    placements = [{"name": "llm", "cpus": [2, 3]}, {"name": "kv", "cpus": [4]}]
    warnings = cmdline.placement_warnings("isolcpus", placements)
    assert len(warnings) == 1 and warnings[0].startswith("placement llm: ")
    assert "pin" in warnings[0]
    assert cmdline.placement_warnings("nohz_full", placements) == []


@pytest.mark.parametrize("damaged", [True, 7, "0-3", {"0": 1}])
def test_damaged_cpu_lists_in_the_facts_are_refused_not_a_traceback(damaged):
    facts = {"cpus": {"online": damaged, "isolated": damaged, "nohz_full": damaged}}
    with pytest.raises(cmdline.CmdlineError, match="^numafleet_kernel_isolation: "):
        cmdline.plan_isolation("isolcpus", facts, [0])


@settings(max_examples=300, deadline=None)
@given(
    mode=st.one_of(st.sampled_from(cmdline.MODES), st.text(max_size=8), st.none(), st.integers()),
    facts=st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-2, 64), st.text(max_size=6)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=6),
            st.dictionaries(
                st.sampled_from(
                    ["cpus", "allowed", "kernel", "online", "isolated", "osrelease", "nohz_full"]
                ),
                inner,
                max_size=4,
            ),
        ),
        max_leaves=20,
    ),
    reserved=st.one_of(st.none(), st.lists(st.integers(-1, 70), max_size=5), st.text(max_size=4)),
)
def test_any_input_gives_arguments_or_a_refusal_never_a_traceback(mode, facts, reserved):
    message = ""
    try:
        got = cmdline.plan_isolation(mode, facts, reserved)
    except cmdline.CmdlineError as exc:
        message = str(exc)
        got = None
    if got is None:
        assert message.startswith("numafleet_kernel_isolation: ")
        return
    assert all(isinstance(arg, str) and " " not in arg for arg in got["kernel_args"])
    assert not set(got["isolated_cpus"]) & set(got["housekeeping_cpus"])


# --- facts --------------------------------------------------------------------------------------


def tree(tmp_path, cmdline_text=None, nohz=True, cpu_dir=True):
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    procfs.mkdir(parents=True)
    cpu = sysfs / "devices" / "system" / "cpu"
    if cpu_dir:
        cpu.mkdir(parents=True)
        if nohz:
            (cpu / "nohz_full").write_text(" (null)\n")
    if cmdline_text is not None:
        (procfs / "cmdline").write_text(cmdline_text)
    return Reader(str(sysfs), str(procfs))


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        (
            {"cmdline_text": "root=/dev/vda1 ro nohz_full=2-7\n"},
            {"cmdline": "root=/dev/vda1 ro nohz_full=2-7", "nohz_full_supported": True},
        ),
        ({"nohz": False}, {"cmdline": None, "nohz_full_supported": False}),
        ({"cpu_dir": False}, {"cmdline": None, "nohz_full_supported": None}),
    ],
)
def test_facts_read_the_running_cmdline_and_nohz_full_support(tmp_path, kwargs, want):
    assert cmdline.read_cmdline_facts(tree(tmp_path, **kwargs)) == want


# --- the change plan ----------------------------------------------------------------------------


def test_change_plan_shows_added_and_removed_arguments():
    change = cmdline.cmdline_change(["hugepagesz=1G", "hugepages=0:2"], NOHZ, "ro")
    assert change["added"] == NOHZ and change["removed"] == ["hugepagesz=1G", "hugepages=0:2"]
    assert change["reboot_required"]
    changes = {"lines": ["h: change plan"], "summary": "no change", "changed": False}
    add_kernel_cmdline(changes, change)
    assert (
        changes["changed"]
        and changes["summary"] == "changes: kernel command line to change (reboot)"
    )
    assert changes["lines"][1].startswith("  kernel command line: + nohz_full=2-7")
    assert changes["lines"][1].endswith("- hugepages=0:2 (reboot required)")


def test_change_plan_keeps_a_reboot_pending_until_cmdline_has_every_argument():
    pending = cmdline.cmdline_change(NOHZ, NOHZ, "ro nohz_full=2-7")
    assert not pending["changed"] and pending["missing"] == NOHZ[1:]
    assert cmdline.change_lines(pending) == [
        "  kernel command line: reboot pending (/proc/cmdline lacks rcu_nocbs=2-7 "
        "irqaffinity=0-1, written by an earlier run)"
    ]
    changes = {"lines": [], "summary": "no change", "changed": False}
    assert add_kernel_cmdline(changes, pending)["summary"] == "no change; reboot pending"
    booted = cmdline.cmdline_change(NOHZ, NOHZ, "ro " + " ".join(NOHZ))
    assert not booted["reboot_required"] and cmdline.change_lines(booted) == []
    # nothing known about what was written (older facts): no change is claimed
    assert not cmdline.cmdline_change(None, NOHZ, None)["reboot_required"]


# --- the controller side: inputs, day-2 stability ----------------------------------------------


def plan_of(placements, reserved=(0, 1), host="h1"):
    return {
        "version": 1,
        "host": host,
        "nodes": [{"id": 0, "hugepages": []}],
        "reserved_cpus": list(reserved),
        "placements": placements,
    }


def test_placement_edits_never_change_the_command_line():
    facts = {"numa": numa_facts()}
    inputs = {"hugepages_kernel_isolation": "nohz_full"}
    one = plan_of([{"name": "a", "cpus": [2]}])
    two = plan_of([{"name": "a", "cpus": [3, 4]}, {"name": "b", "cpus": [5, 6, 7]}])
    first = _apply_args.kernel_cmdline_args("h1", inputs, one, facts)
    assert first == NOHZ
    assert _apply_args.kernel_cmdline_args("h1", inputs, two, facts) == first
    assert (
        _apply_args.build("h1", inputs, two, facts, ["hugepages"]).module_args["hugepages"][
            "kernel_args"
        ]
        == NOHZ
    )


def test_isolation_none_leaves_the_hugepages_arguments_as_they_were():
    built = _apply_args.build("h1", {}, plan_of([]), {"numa": numa_facts()}, ["hugepages"])
    assert "kernel_args" not in built.module_args["hugepages"] and built.problems == []


def test_an_empty_housekeeping_set_is_a_problem_naming_host_and_variable():
    built = _apply_args.build(
        "h1",
        {"hugepages_kernel_isolation": "isolcpus"},
        plan_of([], reserved=()),
        {"numa": numa_facts()},
        ["hugepages"],
    )
    named = _apply_args.name_host_variables(built.problems)
    assert len(named) == 1
    assert named[0].startswith("host h1: hugepages_kernel_isolation: isolcpus isolates")
    assert "numafleet_reserved_cpus" in named[0] and "numafleet_kernel_isolation" in named[0]


def test_render_mode_without_a_bootloader_is_refused_for_isolation_alone(tmp_path):
    built = _apply_args.build(
        "h1",
        {
            "hugepages_kernel_isolation": "nohz_full",
            "hugepages_render_root": str(tmp_path),
            "hugepages_sysfs_root": str(tmp_path / "sys"),
        },
        plan_of([]),
        {"numa": numa_facts()},
        ["hugepages"],
    )
    assert any("auto found neither grubby" in text for text in built.problems)
    assert any("turn the kernel CPU isolation off" in text for text in built.problems)


# --- the hugepages layer writes them ------------------------------------------------------------


def qemu(fixture_root, running=None):
    fsroot = fixture_root(QEMU, writable=True)
    Path(fsroot, "proc", "sys", "kernel").mkdir(parents=True, exist_ok=True)
    Path(fsroot, "proc", "sys", "kernel", "osrelease").write_text("6.1.0-18-amd64\n")
    if running is not None:
        Path(fsroot, "proc", "cmdline").write_text(running + "\n")
    return f"{fsroot}/sys", f"{fsroot}/proc"


RUNTIME = [{"node": 0, "size_kb": M2, "count": 16}, {"node": 1, "size_kb": M2, "count": 48}]


def layer(sysfs, procfs, root, extra, bootloader="grub_d", boot=(), pools=None):
    return hp.plan_hugepages(
        RUNTIME if pools is None else pools,
        sysfs,
        procfs,
        str(root),
        boot_reserve_sizes_kb=list(boot),
        bootloader=bootloader,
        extra_kernel_args=extra,
    )


def test_grub_file_holds_the_isolation_and_check_mode_writes_nothing(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    first = layer(sysfs, procfs, root, NOHZ)
    grub = [c for c in first.files if c.path == hp.GRUB_PATH]
    assert [c.state for c in grub] == ["create"]
    assert grub[0].after.endswith(
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX nohz_full=2-7 rcu_nocbs=2-7 irqaffinity=0-1"\n'
    )
    diff = first.as_result(True, True)["diff"]
    assert any(entry["before_header"] == hp.GRUB_PATH for entry in diff)
    assert not root.exists()  # planned only: nothing written
    hp.apply_hugepages(first)
    again = layer(sysfs, procfs, root, NOHZ)
    assert not again.changed and not again.cmdline_changed
    # no /proc/cmdline in the recording: only the run that changed it owes the reboot
    assert first.as_result(False, False)["reboot_required"]
    assert not again.as_result(False, False)["reboot_required"]
    off = layer(sysfs, procfs, root, [])
    assert off.cmdline_changed and (hp.GRUB_PATH, "remove") in [
        (c.path, c.state) for c in off.files
    ]


def test_grubby_removes_exactly_the_arguments_it_added(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root)
    root = tmp_path / "root"
    first = layer(sysfs, procfs, root, NOHZ, bootloader="grubby")
    assert first.grubby_argvs() == [["grubby", "--update-kernel=ALL", "--args=" + " ".join(NOHZ)]]
    hp.apply_hugepages(first)
    off = layer(sysfs, procfs, root, [], bootloader="auto")
    assert off.grubby_argvs() == [
        ["grubby", "--update-kernel=ALL", "--remove-args=" + " ".join(NOHZ)]
    ]


def test_reboot_required_stays_true_until_proc_cmdline_has_the_arguments(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, running="BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro")
    root = tmp_path / "root"
    hp.apply_hugepages(layer(sysfs, procfs, root, NOHZ))
    second = layer(sysfs, procfs, root, NOHZ).as_result(False, False)
    assert not second["changed"] and not second["cmdline_changed"]
    assert second["reboot_required"] and second["reboot_pending"]
    assert second["kernel_args_missing"] == NOHZ
    Path(procfs, "cmdline").write_text("BOOT_IMAGE=/vmlinuz ro " + " ".join(NOHZ) + "\n")
    booted = layer(sysfs, procfs, root, NOHZ).as_result(False, False)
    assert not booted["changed"] and not booted["reboot_required"]
    assert booted["kernel_args_missing"] == []


def test_boot_pages_awaiting_the_reboot_are_pending_not_drift(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, running="root=/dev/vda1 ro")
    root = tmp_path / "root"
    pools = RUNTIME + [{"node": 0, "size_kb": 1048576, "count": 2}]
    hp.apply_hugepages(layer(sysfs, procfs, root, NOHZ, boot=[1048576], pools=pools))
    again = layer(sysfs, procfs, root, NOHZ, boot=[1048576], pools=pools)
    drift = again.as_result(True, False)["drift"]
    assert [entry["setting"] for entry in drift] == ["node0 1048576kB pages"]
    assert drift[0]["pending"] and drift[0]["reason"].startswith("reboot pending")
    assert again.kernel_args[:2] == ("hugepagesz=1G", "hugepages=0:2")


@pytest.mark.parametrize("bad", [["a b"], ["x='1'"], [""], [3], "nohz_full=1"])
def test_kernel_args_option_refuses_what_is_not_one_argument(fixture_root, tmp_path, bad):
    sysfs, procfs = qemu(fixture_root)
    with pytest.raises(hp.HugepageError) as err:
        layer(sysfs, procfs, tmp_path, bad)
    assert str(err.value).startswith("kernel_args")


# --- verify -------------------------------------------------------------------------------------


def test_planned_sets_are_read_back_from_the_arguments():
    assert cmdline.planned_isolation(NOHZ) == {"nohz_full": [2, 3, 4, 5, 6, 7]}
    assert cmdline.planned_isolation(["isolcpus=managed_irq,domain,2-3,8", "irqaffinity=0"]) == {
        "isolated": [2, 3, 8]
    }
    assert cmdline.planned_isolation(["hugepagesz=1G", "nohz_full=x-"]) == {}


def hugepages_result(missing, running, args=None):
    return {
        "pools": [],
        "drift": [],
        "kernel_args": list(NOHZ if args is None else args),
        "kernel_args_missing": list(missing),
        "cpu_isolation": running,
    }


@pytest.mark.parametrize(
    ("missing", "running", "status", "fragment"),
    [
        ([], {"nohz_full": [2, 3, 4, 5, 6, 7], "isolated": [], "cmdline_known": True}, "pass",
         "/sys/devices/system/cpu/nohz_full matches the plan"),
        ([], {"nohz_full": [2, 3], "isolated": [], "cmdline_known": True}, "fail",
         "/sys/devices/system/cpu/nohz_full is '2-3', the plan has '2-7'"),
        (NOHZ, {"nohz_full": [], "isolated": [], "cmdline_known": True}, "warn",
         "pending reboot: /proc/cmdline lacks nohz_full=2-7"),
        ([], {"nohz_full": [], "isolated": [], "cmdline_known": False}, "skipped",
         "no /proc/cmdline"),
    ],
)  # fmt: skip
def test_verify_compares_the_running_isolation_with_the_plan(missing, running, status, fragment):
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import verify

    checks = [
        c
        for c in verify.layer_checks("h1", {"hugepages": hugepages_result(missing, running)})
        if c.check == "kernel_isolation"
    ]
    assert [(c.subject, c.status) for c in checks] == [("nohz_full", status)]
    assert fragment in checks[0].message


def test_verify_has_no_isolation_check_when_isolation_is_off():
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import verify

    result = hugepages_result([], None, args=[])
    checks = verify.layer_checks("h1", {"hugepages": result})
    assert "kernel_isolation" not in {c.check for c in checks}


def test_the_layer_reports_the_running_isolation_only_with_isolation(fixture_root, tmp_path):
    sysfs, procfs = qemu(fixture_root, running="ro " + " ".join(NOHZ))
    Path(sysfs, "devices", "system", "cpu", "nohz_full").write_text("2-7\n")
    with_isolation = layer(sysfs, procfs, tmp_path / "a", NOHZ).as_result(True, False)
    assert with_isolation["cpu_isolation"]["nohz_full"] == [2, 3, 4, 5, 6, 7]
    assert with_isolation["cpu_isolation"]["cmdline_known"] is True
    assert "cpu_isolation" not in layer(sysfs, procfs, tmp_path / "b", []).as_result(True, False)


def test_a_boot_reserve_change_is_a_command_line_change():
    plan = plan_of([])
    plan["nodes"] = [{"id": 0, "hugepages": [{"size_kb": 1048576, "count": 2}]}]
    facts = {"numa": numa_facts()}
    runtime = _apply_args.kernel_cmdline_args("h1", {}, plan, facts)
    boot = _apply_args.kernel_cmdline_args("h1", {"hugepages_boot_reserve": ["1G"]}, plan, facts)
    assert runtime == [] and boot == ["hugepagesz=1G", "hugepages=0:2"]
    both = _apply_args.kernel_cmdline_args(
        "h1",
        {"hugepages_boot_reserve": ["1G"], "hugepages_kernel_isolation": "nohz_full"},
        plan,
        facts,
    )
    assert both == boot + NOHZ
    change = cmdline.cmdline_change(runtime, boot, None)
    assert change["changed"] and cmdline.change_lines(change) == [
        "  kernel command line: + hugepagesz=1G, + hugepages=0:2 (reboot required)"
    ]
