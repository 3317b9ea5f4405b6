"""kernel.py: option checks, reading knobs/files/IRQs, planning the change, and the writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import kernel
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    TopologyError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.kernel import (
    KernelSettingError,
)

QEMU = "qemu-2node-pxb"  # numa_balancing 1, zone_reclaim_mode 0, THP [always] / [madvise], CPUs 0-3
ALL_ON = {
    "numa_balancing": 0,
    "zone_reclaim_mode": 0,
    "thp_enabled": "madvise",
    "thp_defrag": "madvise",
}


@pytest.fixture
def tree(fixture_root):
    """A writable copy of the real 2-node guest's tree (fsroot with sys/ and proc/) and a root."""
    base = Path(fixture_root(QEMU, writable=True))
    (base / "root").mkdir()
    return base


def plan(tree: Path, **options):
    """(Change, State) of ``options`` against ``tree``; services from ``_services``."""
    services = options.pop("_services", {})
    desired = kernel.parse_options({"root": str(tree / "root"), **options})
    state = kernel.read_state(desired, str(tree / "sys"), str(tree / "proc"), str(tree / "root"))
    return kernel.plan_change(desired, state, services), state


def settings(change) -> dict:
    return {s.name: (s.before, s.after) for s in change.settings}


def files(change) -> dict:
    return {f.path: f.state for f in change.files}


def add_irq(tree: Path, irq: int, cpus: str = "0-3") -> Path:
    path = tree / "proc" / "irq" / str(irq) / "smp_affinity_list"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cpus + "\n")
    return path


def add_msi(tree: Path, address: str, irqs) -> None:
    device = tree / "sys" / "bus" / "pci" / "devices" / address
    msi = Path(os.path.realpath(device)) / "msi_irqs"
    msi.mkdir(parents=True, exist_ok=True)
    for irq in irqs:
        (msi / str(irq)).write_text("msix\n")


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"numa_balancing": 2}, "numa_balancing is 2, outside 0-1"),
        ({"numa_balancing": True}, "numa_balancing is True, not an integer"),
        ({"numa_balancing": "off"}, "numa_balancing is 'off', not an integer"),
        ({"zone_reclaim_mode": 8}, "zone_reclaim_mode is 8, outside 0-7; it is a bitmask"),
        ({"zone_reclaim_mode": -1}, "outside 0-7"),
        ({"thp_enabled": "defer"}, "thp_enabled is 'defer'; use one of always, madvise, never"),
        ({"thp_defrag": "sometimes"}, "thp_defrag is 'sometimes'; use one of always, defer"),
        ({"numad": "stopped"}, "numad is 'stopped'; use one of masked, leave"),
        ({"irqbalance_banned_cpus": ""}, "irqbalance_banned_cpus is empty"),
        ({"irqbalance_banned_cpus": "0-"}, "irqbalance_banned_cpus: invalid CPU set '0-'"),
        ({"irqbalance_banned_cpus": [0, 1]}, "give a cpulist string such as '0-1,8'"),
        ({"irq_affinity": {"irq": 1}}, "irq_affinity is dict; give a list"),
        ({"irq_affinity": ["x"]}, "irq_affinity[0] is 'x'"),
        ({"irq_affinity": [{"cpus": "0"}]}, "irq_affinity[0] needs exactly one of irq"),
        (
            {"irq_affinity": [{"irq": 1, "address": "0000:00:02.0", "cpus": "0"}]},
            "needs exactly one of irq",
        ),
        ({"irq_affinity": [{"irq": -1, "cpus": "0"}]}, "irq_affinity[0].irq is -1"),
        ({"irq_affinity": [{"address": "00:02.0", "cpus": "0"}]}, "not a PCI address"),
        ({"irq_affinity": [{"irq": 3, "cpus": ""}]}, "irq_affinity[0].cpus is empty"),
        ({"irq_affinity": [{"irq": 3}]}, "irq_affinity[0].cpus is None"),
        ({"service_manager": "sysv"}, "service_manager is 'sysv'"),
        ({"root": "relative/dir"}, "root is 'relative/dir'; give an absolute directory"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options, fragment):
    with pytest.raises(KernelSettingError) as err:
        kernel.parse_options(options)
    assert fragment in str(err.value)
    assert isinstance(err.value, NumaTuneError)


def test_options_are_normalised():
    desired = kernel.parse_options(
        {
            "numa_balancing": "0",
            "zone_reclaim_mode": 3,
            "thp_enabled": None,
            "irqbalance_banned_cpus": "1,0,2",
            "irq_affinity": [
                {"irq": 40, "cpus": "2-3"},
                {"address": "0000:81:00.0", "cpus": "3,2"},
            ],
        }
    )
    assert desired.knobs == {"numa_balancing": 0, "zone_reclaim_mode": 3}
    assert desired.numad == "leave" and desired.service_manager == "systemd"
    assert desired.banned_cpus == (0, 1, 2)
    assert [(r.irq, r.address, r.cpus) for r in desired.irqs] == [
        (40, None, (2, 3)),
        (None, "0000:81:00.0", (2, 3)),
    ]


# --- text formats ------------------------------------------------------------------------------

IRQBALANCE_DEBIAN = """\
#IRQBALANCE_ONESHOT=
#IRQBALANCE_BANNED_CPULIST=
IRQBALANCE_ARGS="--policyscript=/etc/irq.sh"
"""


@pytest.mark.parametrize(
    ("text", "cpus", "before", "after"),
    [
        # absent file: created with a header and the line
        (None, (0, 1), None, f"{kernel.IRQBALANCE_HEADER}\nIRQBALANCE_BANNED_CPULIST=0-1\n"),
        # only a commented line: the comment stays, the line is appended, the rest is kept
        (IRQBALANCE_DEBIAN, (0, 1), None, IRQBALANCE_DEBIAN + "IRQBALANCE_BANNED_CPULIST=0-1\n"),
        # no newline at the end of the file
        ("A=1", (4,), None, "A=1\nIRQBALANCE_BANNED_CPULIST=4\n"),
        # already right, quoted and unsorted: nothing to write
        ('A=1\nIRQBALANCE_BANNED_CPULIST="1,0"\nB=2\n', (0, 1), "0-1", None),
        # a different list: only that line changes, in place
        (
            "A=1\nIRQBALANCE_BANNED_CPULIST=0\nB=2\n",
            (0, 1),
            "0",
            "A=1\nIRQBALANCE_BANNED_CPULIST=0-1\nB=2\n",
        ),
        # export prefix and a later duplicate (which would win): one line left
        (
            "export IRQBALANCE_BANNED_CPULIST=0-1\nX=1\nIRQBALANCE_BANNED_CPULIST=5\n",
            (0, 1),
            "5",
            "IRQBALANCE_BANNED_CPULIST=0-1\nX=1\n",
        ),
        # an unparseable value is reported as it is and replaced
        ("IRQBALANCE_BANNED_CPULIST=zero\n", (0,), "zero", "IRQBALANCE_BANNED_CPULIST=0\n"),
        # an empty deprecated mask is harmless (irqbalance skips empty values)
        (
            "IRQBALANCE_BANNED_CPUS=\n",
            (0,),
            None,
            "IRQBALANCE_BANNED_CPUS=\nIRQBALANCE_BANNED_CPULIST=0\n",
        ),
    ],
)
def test_irqbalance_line_edits_only_its_own_line(text, cpus, before, after):
    assert kernel.plan_banned_line(text, cpus, "/etc/default/irqbalance") == (before, after)


@pytest.mark.parametrize(
    "text",
    ["IRQBALANCE_BANNED_CPUS=0000000f\n", 'A=1\nIRQBALANCE_BANNED_CPUS="3"\n'],
)
def test_an_active_deprecated_mask_is_refused(text):
    with pytest.raises(KernelSettingError) as err:
        kernel.plan_banned_line(text, (0,), "/etc/sysconfig/irqbalance")
    message = str(err.value)
    assert "/etc/sysconfig/irqbalance line" in message
    assert "IRQBALANCE_BANNED_CPUS" in message and "delete or comment out" in message


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, {}),
        (
            "# c\n; c\nkernel.numa_balancing = 0\n-vm.zone_reclaim_mode=1\nbad line\n",
            {
                "kernel.numa_balancing": "0",
                "vm.zone_reclaim_mode": "1",
            },
        ),
    ],
)
def test_parse_sysctl(text, want):
    assert kernel.parse_sysctl(text) == want


def test_parse_tmpfiles_keeps_w_lines_only():
    text = (
        "# c\nw /sys/kernel/mm/transparent_hugepage/enabled - - - - never\n"
        "d /run/x 0755 root root -\nw+ /sys/a - - - - defer+madvise\n"
    )
    assert kernel.parse_tmpfiles_writes(text) == {
        "/sys/kernel/mm/transparent_hugepage/enabled": "never",
        "/sys/a": "defer+madvise",
    }


def test_render_persist_files_in_knob_order():
    assert kernel.render_sysctl({}) is None and kernel.render_tmpfiles({}) is None
    text = kernel.render_sysctl({"vm.zone_reclaim_mode": "1", "kernel.numa_balancing": "0"})
    assert text.splitlines()[1:] == ["kernel.numa_balancing = 0", "vm.zone_reclaim_mode = 1"]
    assert text.startswith("# Managed by numafleet.tuning")
    text = kernel.render_tmpfiles({"/sys/kernel/mm/transparent_hugepage/defrag": "defer"})
    assert text.splitlines()[1:] == ["w /sys/kernel/mm/transparent_hugepage/defrag - - - - defer"]


@pytest.mark.parametrize(
    ("text", "choices"),
    [
        ("always [madvise] never", ("always", "madvise", "never")),
        ("[always] defer defer+madvise madvise never", kernel.THP_DEFRAG),
    ],
)
def test_selector_choices(text, choices):
    assert kernel.selector_choices(text) == choices


# --- reading and planning ----------------------------------------------------------------------


def test_recorded_guest_plan(tree):
    change, state = plan(tree, **ALL_ON)
    assert settings(change) == {
        "numa_balancing": (1, 0),
        "zone_reclaim_mode": (0, 0),
        "thp_enabled": ("always", "madvise"),
        "thp_defrag": ("madvise", "madvise"),
    }
    assert [(w.name, w.text) for w in change.runtime] == [
        ("numa_balancing", "0"),
        ("thp_enabled", "madvise"),
    ]
    assert files(change) == {kernel.SYSCTL_FILE: "create", kernel.TMPFILES_FILE: "create"}
    assert change.commands == () and change.would_run() == [] and change.changed
    assert state.online == (0, 1, 2, 3)
    diff = change.as_diff()
    assert diff[0]["before"] == "numa_balancing: 1\nthp_enabled: always\n"
    assert diff[0]["after"] == "numa_balancing: 0\nthp_enabled: madvise\n"
    assert [d["after_header"] for d in diff[1:]] == [kernel.SYSCTL_FILE, kernel.TMPFILES_FILE]
    assert "kernel.numa_balancing = 0\nvm.zone_reclaim_mode = 0\n" in diff[1]["after"]


def test_nothing_asked_plans_nothing(tree):
    change, dummy = plan(tree)
    assert change.settings == () and change.files == () and not change.changed


def test_null_settings_keep_their_persisted_lines(tree):
    sysctl = tree / "root" / kernel.SYSCTL_FILE.lstrip("/")
    sysctl.parent.mkdir(parents=True)
    sysctl.write_text("# old\nvm.zone_reclaim_mode = 1\nnet.core.somaxconn = 1\n")
    change, dummy = plan(tree, numa_balancing=0)
    after = change.files[0].after
    assert after.splitlines()[1:] == ["kernel.numa_balancing = 0", "vm.zone_reclaim_mode = 1"]
    assert change.files[0].state == "update"


@pytest.mark.parametrize(
    ("name", "relpath", "want", "outcome"),
    [
        ("numa_balancing", "proc/sys/kernel/numa_balancing", 0, "warning"),
        ("numa_balancing", "proc/sys/kernel/numa_balancing", 1, "CONFIG_NUMA_BALANCING"),
        ("zone_reclaim_mode", "proc/sys/vm/zone_reclaim_mode", 0, "warning"),
        ("zone_reclaim_mode", "proc/sys/vm/zone_reclaim_mode", 4, "zone reclaim (CONFIG_NUMA)"),
        ("thp_enabled", "sys/kernel/mm/transparent_hugepage/enabled", "never", "warning"),
        (
            "thp_enabled",
            "sys/kernel/mm/transparent_hugepage/enabled",
            "madvise",
            "CONFIG_TRANSPARENT_HUGEPAGE",
        ),
        ("thp_defrag", "sys/kernel/mm/transparent_hugepage/defrag", "never", "warning"),
        (
            "thp_defrag",
            "sys/kernel/mm/transparent_hugepage/defrag",
            "defer",
            "Set thp_defrag to never",
        ),
    ],
)
def test_absent_knob_is_a_warning_only_when_off_is_asked(tree, name, relpath, want, outcome):
    (tree / relpath).unlink()
    if outcome != "warning":
        with pytest.raises(KernelSettingError) as err:
            plan(tree, **{name: want})
        message = str(err.value)
        assert f"{name}={want}" in message and "is absent" in message and outcome in message
        assert "or null (leave)" in message
        return
    change, dummy = plan(tree, **{name: want})
    assert settings(change) == {name: (None, None)}
    assert change.runtime == () and change.files == () and not change.changed
    assert len(change.warnings) == 1 and "nothing written or persisted" in change.warnings[0]
    assert str(tree / relpath) in change.warnings[0]


def test_thp_value_the_kernel_does_not_offer_is_refused(tree):
    (tree / "sys/kernel/mm/transparent_hugepage/defrag").write_text("always madvise [never]\n")
    with pytest.raises(KernelSettingError) as err:
        plan(tree, thp_defrag="defer+madvise")
    assert "this kernel offers always, madvise, never" in str(err.value)


@pytest.mark.parametrize(
    ("relpath", "text", "fragment"),
    [
        ("proc/sys/kernel/numa_balancing", "on\n", "reads 'on', which is not a numa_balancing"),
        ("sys/kernel/mm/transparent_hugepage/enabled", "always\n", "not a thp_enabled value"),
    ],
)
def test_malformed_knob_file_fails(tree, relpath, text, fragment):
    (tree / relpath).write_text(text)
    name = "numa_balancing" if "numa" in relpath else "thp_enabled"
    with pytest.raises(KernelSettingError) as err:
        plan(tree, **{name: ALL_ON[name]})
    assert fragment in str(err.value)


def test_mistyped_root_fails_naming_the_option(tmp_path):
    desired = kernel.parse_options({"numa_balancing": 0})
    with pytest.raises(TopologyError) as err:
        kernel.read_state(desired, str(tmp_path / "sys"), str(tmp_path / "proc"), str(tmp_path))
    assert "sysfs_root=" in str(err.value) and "Point sysfs_root" in str(err.value)


# --- irqbalance --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("existing", "path"),
    [
        ((), "/etc/default/irqbalance"),
        (("/etc/sysconfig/irqbalance",), "/etc/sysconfig/irqbalance"),
        (("/etc/default/irqbalance", "/etc/sysconfig/irqbalance"), "/etc/default/irqbalance"),
    ],
)
def test_irqbalance_file_is_debian_rhel_or_new_debian(tree, existing, path):
    for host_path in existing:
        real = tree / "root" / host_path.lstrip("/")
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text("IRQBALANCE_ARGS=-j\n")
    change, dummy = plan(tree, irqbalance_banned_cpus="0")
    assert files(change) == {path: "update" if existing else "create"}
    assert change.would_run() == ["systemctl try-restart irqbalance.service"]
    assert settings(change) == {"irqbalance_banned_cpus": (None, "0")}


@pytest.mark.parametrize(
    ("active", "restart"),
    [(None, True), ("active", True), ("activating", True), ("inactive", False), ("failed", False)],
)
def test_irqbalance_is_restarted_only_when_running(tree, active, restart):
    services = {} if active is None else {"irqbalance.service": kernel.ServiceState("x", active)}
    change, dummy = plan(tree, irqbalance_banned_cpus="0", _services=services)
    assert change.would_run() == (["systemctl try-restart irqbalance.service"] if restart else [])
    assert change.changed  # the file is written either way


def test_irqbalance_unchanged_needs_no_restart(tree):
    real = tree / "root/etc/default/irqbalance"
    real.parent.mkdir(parents=True)
    real.write_text("IRQBALANCE_BANNED_CPULIST=0,1\n")
    change, dummy = plan(tree, irqbalance_banned_cpus="0-1")
    assert files(change) == {"/etc/default/irqbalance": "unchanged"}
    assert change.commands == () and not change.changed


@pytest.mark.parametrize(
    ("cpus", "fragment"),
    [
        ("0-3", "bans every online CPU"),
        ("2,9", "names CPUs 9, which are not present on this host (it has 0-3)"),
    ],
)
def test_irqbalance_cpus_are_checked_against_the_host(tree, cpus, fragment):
    with pytest.raises(KernelSettingError) as err:
        plan(tree, irqbalance_banned_cpus=cpus)
    assert fragment in str(err.value)


# --- numad -------------------------------------------------------------------------------------

ACTIVE = kernel.ServiceState("enabled", "active")


def place_numad(tree: Path, where: str) -> None:
    """Put numad's unit (or its /etc entry) where the case says."""
    etc = tree / "root/etc/systemd/system/numad.service"
    vendor = tree / "root/usr/lib/systemd/system/numad.service"
    if where in ("vendor", "masked", "masked-empty", "etc-file"):
        vendor.parent.mkdir(parents=True, exist_ok=True)
        vendor.write_text("[Service]\nExecStart=/usr/bin/numad -i 15\n")
    etc.parent.mkdir(parents=True, exist_ok=True)
    if where == "masked":
        etc.symlink_to("/dev/null")
    elif where == "masked-empty":
        etc.write_text("")
    elif where == "etc-file":
        etc.write_text("[Service]\nExecStart=/opt/numad\n")
    elif where == "lib":
        lib = tree / "root/lib/systemd/system/numad.service"
        lib.parent.mkdir(parents=True)
        lib.write_text("[Service]\n")


@pytest.mark.parametrize(
    ("where", "manager", "services", "before", "commands", "link"),
    [
        ("none", "systemd", {}, "absent", [], False),
        (
            "vendor",
            "none",
            {},
            "present",
            ["disable --now numad.service", "mask numad.service"],
            True,
        ),
        ("lib", "none", {}, "present", ["disable --now numad.service", "mask numad.service"], True),
        (
            "vendor",
            "systemd",
            {"numad.service": ACTIVE},
            "enabled, active",
            ["disable --now numad.service", "mask numad.service"],
            False,
        ),
        ("masked", "none", {}, "masked", [], False),
        (
            "masked-empty",
            "systemd",
            {"numad.service": kernel.ServiceState("masked", "inactive")},
            "masked",
            [],
            False,
        ),
        (
            "masked",
            "systemd",
            {"numad.service": kernel.ServiceState("masked", "active")},
            "masked, active",
            ["stop numad.service"],
            False,
        ),
    ],
)
def test_numad(tree, where, manager, services, before, commands, link):
    place_numad(tree, where)
    change, state = plan(tree, numad="masked", service_manager=manager, _services=services)
    assert settings(change)["numad"][0] == before
    assert [line.removeprefix("systemctl ") for line in change.would_run()] == commands
    links = [f for f in change.files if f.link]
    assert bool(links) == link
    if link:
        assert links[0].path == "/etc/systemd/system/numad.service"
        assert links[0].after == "/dev/null" and links[0].state == "create"
    units = kernel.units_to_query(kernel.parse_options({"numad": "masked"}), state)
    assert units == ([] if where == "none" else ["numad.service"])


def test_numad_leave_does_not_look(tree):
    place_numad(tree, "etc-file")
    change, state = plan(tree, numad="leave")
    assert change.settings == () and state.numad_unit is None


def test_numad_unit_of_its_own_in_etc_is_refused(tree):
    place_numad(tree, "etc-file")
    with pytest.raises(KernelSettingError) as err:
        plan(tree, numad="masked")
    assert "a unit file of its own" in str(err.value) and "numad to leave" in str(err.value)


# --- IRQ affinity ------------------------------------------------------------------------------


def test_irq_affinity_by_number_and_by_device(tree):
    add_irq(tree, 24, "0-3")
    add_irq(tree, 25, "2-3")
    add_irq(tree, 26, "0-3")
    add_msi(tree, "0000:81:00.0", [25, 26])
    change, state = plan(
        tree,
        irq_affinity=[
            {"irq": 24, "cpus": "0-1"},
            {"address": "0000:81:00.0", "cpus": "2-3"},
        ],
        _services={"irqbalance.service": kernel.ServiceState("enabled", "active")},
    )
    assert settings(change) == {
        "irq_affinity[24]": ("0-3", "0-1"),
        "irq_affinity[25]": ("2-3", "2-3"),
        "irq_affinity[26]": ("0-3", "2-3"),
    }
    assert [(w.name, w.text) for w in change.runtime] == [
        ("irq_affinity[24]", "0-1"),
        ("irq_affinity[26]", "2-3"),
    ]
    assert all(s.file is None for s in change.settings)  # never persisted
    assert any("irqbalance is running" in w for w in change.warnings)
    desired = kernel.parse_options({"irq_affinity": [{"irq": 24, "cpus": "0"}]})
    assert kernel.units_to_query(desired, state) == ["irqbalance.service"]


def test_device_without_msi_irqs_is_one_warning(tree):
    change, dummy = plan(
        tree,
        irq_affinity=[
            {"address": "0000:81:00.0", "cpus": "2-3"},
            {"address": "0000:00:02.0", "cpus": "0-1"},
        ],
    )
    assert change.settings == () and not change.changed
    assert len(change.warnings) == 1
    assert "PCI devices 0000:81:00.0, 0000:00:02.0 list no MSI/MSI-X IRQs" in change.warnings[0]


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([{"irq": 99, "cpus": "0"}], "IRQ 99 has no"),
        ([{"address": "0000:42:00.0", "cpus": "0"}], "no PCI device 0000:42:00.0 under"),
        ([{"irq": 24, "cpus": "0-7"}], "names CPUs 4-7, which are not online"),
        (
            [{"irq": 25, "cpus": "0"}, {"address": "0000:81:00.0", "cpus": "2-3"}],
            "(0000:81:00.0 IRQ 25) pins IRQ 25 to CPUs 2-3 but irq_affinity[0] pins it to 0",
        ),
    ],
)
def test_bad_irq_affinity_is_refused(tree, entries, fragment):
    add_irq(tree, 24)
    add_irq(tree, 25)
    add_msi(tree, "0000:81:00.0", [25])
    with pytest.raises(KernelSettingError) as err:
        plan(tree, irq_affinity=entries)
    assert fragment in str(err.value)


def test_same_irq_twice_with_the_same_cpus_is_one_setting(tree):
    add_irq(tree, 25, "0")
    add_msi(tree, "0000:81:00.0", [25])
    change, dummy = plan(
        tree,
        irq_affinity=[{"irq": 25, "cpus": "2-3"}, {"address": "0000:81:00.0", "cpus": "3,2"}],
    )
    assert settings(change) == {"irq_affinity[25]": ("0", "2-3")}


def test_msi_irq_without_proc_entry_is_a_warning(tree):
    add_msi(tree, "0000:81:00.0", [77])
    change, dummy = plan(tree, irq_affinity=[{"address": "0000:81:00.0", "cpus": "2"}])
    assert change.settings == ()
    assert change.warnings == (
        f"irq_affinity[0] (0000:81:00.0 IRQ 77): {tree}/proc/irq/77/smp_affinity_list is "
        "absent; IRQ 77 left alone",
    )


# --- writes ------------------------------------------------------------------------------------


def test_writes_apply_and_read_back_then_nothing_is_left(tree):
    add_irq(tree, 30, "0-3")
    options = {**ALL_ON, "irq_affinity": [{"irq": 30, "cpus": "1"}], "numad": "masked"}
    place_numad(tree, "vendor")
    change, dummy = plan(tree, service_manager="none", **options)
    assert kernel.write_runtime(change.runtime) == []
    kernel.write_files(str(tree / "root"), change.files)
    assert (tree / "proc/sys/kernel/numa_balancing").read_text() == "0\n"
    # A plain file keeps the kernel's own selector format after the write.
    enabled = (tree / "sys/kernel/mm/transparent_hugepage/enabled").read_text()
    assert enabled == "always [madvise] never\n"
    assert (tree / "proc/irq/30/smp_affinity_list").read_text() == "1\n"
    link = tree / "root/etc/systemd/system/numad.service"
    assert os.readlink(link) == "/dev/null"
    sysctl = tree / "root/etc/sysctl.d/60-numafleet-numa.conf"
    assert stat.S_IMODE(sysctl.stat().st_mode) == 0o644
    again, dummy = plan(tree, service_manager="none", **options)
    assert not again.changed and again.would_run() == []
    assert {f.state for f in again.files} == {"unchanged"}


def test_read_back_other_than_asked_fails(tree):
    path = str(tree / "proc/sys/kernel/numa_balancing")
    write = kernel.RuntimeWrite("numa_balancing", path, "0", 1, "int")
    with pytest.raises(KernelSettingError) as err:
        kernel.write_runtime([write])
    assert "wrote '0'" in str(err.value) and "reads back '0'" in str(err.value)


def test_failed_runtime_write_names_the_file(tree):
    path = str(tree / "proc/sys/kernel/nope/numa_balancing")
    write = kernel.RuntimeWrite("numa_balancing", path, "0", 0, "int")
    with pytest.raises(KernelSettingError) as err:
        kernel.write_runtime([write])
    assert f"writing '0' to {path} failed" in str(err.value) and "run as root" in str(err.value)


def test_a_directory_where_a_file_goes_is_refused(tree):
    (tree / "root/etc/sysctl.d/60-numafleet-numa.conf").mkdir(parents=True)
    with pytest.raises(KernelSettingError) as err:
        plan(tree, numa_balancing=0)
    assert "is not a regular file" in str(err.value)


@pytest.mark.parametrize(
    ("timeout", "args", "want"),
    [
        (None, ("mask", "numad.service"), ["/bin/systemctl", "mask", "numad.service"]),
        (
            "/usr/bin/timeout",
            ("disable", "--now", "numad.service"),
            [
                "/usr/bin/timeout",
                "--kill-after=10",
                "300",
                "/bin/systemctl",
                "disable",
                "--now",
                "numad.service",
            ],
        ),
    ],
)
def test_command_argv(timeout, args, want):
    assert kernel.command_argv("/bin/systemctl", timeout, args) == want


def test_query_argvs_and_service_state():
    argvs = kernel.query_argvs("/bin/systemctl", None, "numad.service")
    assert argvs == [
        ["/bin/systemctl", "is-enabled", "numad.service"],
        ["/bin/systemctl", "is-active", "numad.service"],
    ]
    assert kernel.parse_service_state("masked\n", "inactive\n") == kernel.ServiceState(
        "masked", "inactive"
    )
    assert kernel.parse_service_state("", "") == kernel.ServiceState("unknown", "unknown")


def test_drift_names_each_knob_and_irq_that_differs_and_the_checks_judge_it(tree):
    """kernel result -> layers.kernel_drift -> verify's kernel_settings and irq_affinity."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers, verify

    add_irq(tree, 24, "0-3")
    add_irq(tree, 25, "0-1")
    (tree / "proc" / "sys" / "kernel" / "numa_balancing").write_text("1\n")
    change, dummy = plan(
        tree,
        numa_balancing=0,
        irq_affinity=[{"irq": 24, "cpus": "0-1"}, {"irq": 25, "cpus": "0-1"}],
        _services={"irqbalance.service": kernel.ServiceState("disabled", "inactive")},
    )
    drift = layers.kernel_drift(change.settings)
    assert [(d["setting"], d["planned"], d["actual"]) for d in drift] == [
        ("numa_balancing", 0, 1),
        ("irq_affinity[24]", "0-1", "0-3"),
    ]
    result = {"settings": [s.as_dict() for s in change.settings], "drift": drift}
    checks = verify.layer_checks("h", {"kernel": result})
    judged = {(c.check, c.subject): c.status for c in checks if c.check != "hugepage_pools"}
    assert judged[("kernel_settings", "numa_balancing")] == "fail"
    assert judged[("irq_affinity", "irq 24")] == "fail"
    assert judged[("irq_affinity", "irq 25")] == "pass"
