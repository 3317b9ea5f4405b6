"""The amd layer's core: partition modes of AMD Instinct GPUs applied like MIG.

A scratch sysfs tree (two MI300X: PCI attributes current_/available_*_partition, drm card and
render nodes, KFD topology nodes with location_id/domain/drm_render_minor as the amdgpu driver
writes them), a scratch procfs (fd links to /dev/kfd and /dev/dri/*, cgroup lines naming the
unit), an amdsmi-like module following the library's API (amdsmi_init, handles by BDF, the
AmdSmiComputePartitionType / AmdSmiMemoryPartitionType enums, AmdSmiLibraryException) and a
runner standing in for amd-smi and systemctl, all injected.
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import amd_partition as amd
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mig_holders
from tests.unit import fake_amdsmi as fake

A, B = "0000:43:00.0", "0000:c3:00.0"
MINORS = {A: (128, 129, 130, 131, 132, 133, 134, 135), B: (136,)}


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def make_tree(tmp_path, modes=None):
    """sys/ and proc/ under tmp_path: GPU A in CPX/NPS4 (8 KFD nodes), B in SPX/NPS1."""
    modes = modes or {A: ("CPX", "NPS4"), B: ("SPX", "NPS1")}
    sys_root = str(tmp_path / "sys")
    node = 1
    for number, address in enumerate((A, B)):
        dev = os.path.join(sys_root, "bus/pci/devices", address)
        compute, memory = modes[address]
        _write(f"{dev}/current_compute_partition", compute + "\n")
        _write(f"{dev}/available_compute_partition", "SPX, DPX, QPX, CPX\n")
        _write(f"{dev}/current_memory_partition", memory + "\n")
        _write(f"{dev}/available_memory_partition", "NPS1, NPS4\n")
        os.makedirs(f"{dev}/drm/card{number + 1}", exist_ok=True)
        os.makedirs(f"{dev}/drm/renderD{MINORS[address][0]}", exist_ok=True)
        bus = int(address[5:7], 16)
        for minor in MINORS[address]:
            _write(
                f"{sys_root}/class/kfd/kfd/topology/nodes/{node}/properties",
                f"cpu_cores_count 0\nsimd_count 304\ndrm_render_minor {minor}\n"
                f"location_id {bus << 8}\ndomain 0\n",
            )
            node += 1
    os.makedirs(tmp_path / "proc", exist_ok=True)
    return sys_root, str(tmp_path / "proc")


def add_process(proc_root, pid, comm, devices, unit=None):
    base = os.path.join(proc_root, str(pid))
    os.makedirs(f"{base}/fd", exist_ok=True)
    for number, device in enumerate(devices):
        os.symlink(device, f"{base}/fd/{number + 3}")
    _write(f"{base}/comm", comm + "\n")
    slice_path = f"/system.slice/{unit}" if unit else "/user.slice/session-1.scope"
    _write(f"{base}/cgroup", f"0::{slice_path}\n")


class Runner:
    """Records argv; answers 0 (or ``fail`` rc for argv containing a word); amd-smi set writes
    the sysfs file as the tool would."""

    def __init__(self, sys_root=None, fail=None):
        self.argvs, self.sys_root, self.fail = [], sys_root, fail or {}

    def __call__(self, argv):
        self.argvs.append(list(argv))
        for word, rc in self.fail.items():
            if word in argv:
                return rc, "", f"{word} failed"
        if self.sys_root and argv[1:2] == ["set"]:
            kind = "compute" if "--compute-partition" in argv else "memory"
            _write(
                os.path.join(
                    self.sys_root, "bus/pci/devices", argv[3], f"current_{kind}_partition"
                ),
                argv[-1] + "\n",
            )
        return 0, "", ""


def which(name):
    return f"/usr/bin/{name}"


def amdsmi_module(sys_root):
    """fake_amdsmi over GPUs A and B, in the modes the sysfs tree under ``sys_root`` shows."""
    gpus = [g for g in fake.mi300x_gpus() if g.bdf in (A, B)]
    for gpu in gpus:
        gpu.compute_partition = current(sys_root, gpu.bdf, "compute")
        gpu.memory_partition = current(sys_root, gpu.bdf, "memory")
    return fake.make_module(gpus)


def entry(address, compute=None, memory=None, now=("SPX", "NPS1"), units=()):
    return {
        "address": address,
        "uuid": f"GPU-{address[5:7]}",
        "node": 0,
        "compute_partition": {"current": now[0], "planned": compute or now[0]},
        "memory_partition": {"current": now[1], "planned": memory or now[1]},
        "declared": True,
        "owned_units": list(units),
    }


def params(tmp_path, sys_root, proc_root, gpus, **kw):
    out = dict(
        root=str(tmp_path / "root"),
        sysfs_root=sys_root,
        procfs_root=proc_root,
        service_manager="systemd",
        gpus=gpus,
        owned_units=[],
        reset_ok=False,
        backend="sysfs",
    )
    out.update(kw)
    return out


def current(sys_root, address, kind):
    with open(os.path.join(sys_root, "bus/pci/devices", address, f"current_{kind}_partition")) as f:
        return f.read().strip()


# --- reading ------------------------------------------------------------------------------


def test_dri_nodes_come_from_kfd_topology_and_the_pci_drm_directory(tmp_path):
    sys_root, dummy = make_tree(tmp_path)
    nodes = amd.read_dri_nodes(sys_root)
    assert nodes[A] == sorted(["/dev/dri/card1"] + [f"/dev/dri/renderD{m}" for m in MINORS[A]])
    assert nodes[B] == ["/dev/dri/card2", "/dev/dri/renderD136"]


def test_holders_kfd_holds_every_gpu_render_node_its_own(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    add_process(proc_root, 100, "python3", ["/dev/kfd", "/dev/dri/renderD131"], "team-a.service")
    add_process(proc_root, 200, "vainfo", ["/dev/dri/renderD136"])
    add_process(proc_root, 300, "Xorg", ["/dev/dri/renderD200"])  # not an AMD GPU's node
    holders = amd.read_amd_holders(proc_root, sys_root)
    assert [(h.pid, h.unit, h.gpus) for h in holders] == [
        (100, "team-a.service", ()),
        (200, None, (B,)),
    ]
    assert holders[0].holds(B) and not holders[1].holds(A)
    assert "pid 100 (python3, team-a.service: /dev/dri/renderD131, /dev/kfd)" == holders[0].text()


def test_open_devices_is_shared_with_the_mig_holders(tmp_path):
    dummy, proc_root = make_tree(tmp_path)
    add_process(proc_root, 7, "x", ["/dev/nvidia0", "/dev/kfd"])
    fd = os.path.join(proc_root, "7", "fd")
    assert mig_holders.open_devices(fd) == ["/dev/nvidia0"]
    assert mig_holders.open_devices(fd, ("/dev/kfd",)) == ["/dev/kfd"]


# --- the layout is validated first --------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ([entry(B, compute="TPX")], "compute partition TPX is not available"),
        (
            [entry(B, memory="NPS4")],
            "memory partition NPS4 is not allowed with compute partition SPX",
        ),
        ([entry(B, compute="XPX")], "compute_partition.planned: 'XPX' is not one of"),
        ([entry("0000:99:00.0")], "no current_compute_partition"),
        ([{"uuid": "x"}], "gpus[1]: needs an address"),
    ],
)
def test_bad_layouts_are_refused_before_any_change(tmp_path, gpus, message):
    sys_root, proc_root = make_tree(tmp_path)
    gpus = [entry(A, now=("CPX", "NPS4"), compute="QPX")] + gpus  # A would change: it must not
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.run(params(tmp_path, sys_root, proc_root, gpus), False, Runner(), which, None)
    assert message in str(err.value)
    assert "nothing was changed" in str(err.value) or "needs an address" in str(err.value)
    assert current(sys_root, A, "compute") == "CPX"


# --- compute partition changes ------------------------------------------------------------


def test_check_mode_writes_nothing_and_shows_the_diff(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    runner = Runner()
    got = amd.run(
        params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")]), True, runner, which, None
    )
    assert got["changed"] and not got["gpu_changed"] and runner.argvs == []
    assert current(sys_root, B, "compute") == "SPX" and not (tmp_path / "root").exists()
    (diff,) = [d for d in got["diff"] if d["before_header"] == "AMD GPU partitions"]
    assert diff["before"] == f"GPU {B}: compute SPX, memory NPS1\n"
    assert diff["after"] == f"GPU {B}: compute CPX, memory NPS1\n"
    assert got["gpus"] == [
        {
            "address": B,
            "uuid": "GPU-c3",
            "compute": {"before": "SPX", "after": "CPX"},
            "memory": {"before": "NPS1", "after": "NPS1"},
            "reset_required": False,
        }
    ]
    assert f"set compute partition of {B} to CPX" in got["would_run"]
    assert got["drift"][0]["planned"] == "compute CPX, memory NPS1"


def test_sysfs_apply_then_second_run_changes_nothing(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    p = params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")])
    got = amd.run(p, False, Runner(), which, None)
    assert got["changed"] and got["gpu_changed"]
    assert current(sys_root, B, "compute") == "CPX"
    assert got["ran"] == [f"echo CPX > {sys_root}/bus/pci/devices/{B}/current_compute_partition"]
    state = json.loads((tmp_path / "root/etc/numafleet/amd-partition.json").read_text())
    assert state["gpus"] == [{"address": B, "uuid": "GPU-c3", "compute": "CPX", "memory": "NPS1"}]
    unit = (tmp_path / "root/etc/systemd/system" / amd.UNIT_NAME).read_text()
    assert '/usr/local/libexec/numafleet-amd-partition" "/etc/numafleet/amd-partition.json"' in unit
    assert got["reload_needed"]
    again = amd.run(
        dict(p, gpus=[entry(B, compute="CPX", now=("CPX", "NPS1"))]), False, Runner(), which, None
    )
    assert not again["changed"] and again["ran"] == [] and again["drift"] == []


def test_a_busy_gpu_is_refused_naming_pids_and_units(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    add_process(proc_root, 4242, "python3", ["/dev/dri/renderD136"], "team-a.service")
    add_process(proc_root, 77, "rocm-smi", ["/dev/kfd"])
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.run(
            params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")]),
            False,
            Runner(),
            which,
            None,
        )
    msg = str(err.value)
    assert f"GPU {B} (a compute partition change) is used by" in msg
    assert "pid 77 (rocm-smi, not in a systemd service: /dev/kfd)" in msg
    assert "pid 4242 (python3, team-a.service: /dev/dri/renderD136)" in msg
    assert "/dev/kfd is one device for every AMD GPU" in msg
    assert current(sys_root, B, "compute") == "SPX"


def test_a_process_on_another_gpu_render_node_does_not_block(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    add_process(proc_root, 4242, "python3", ["/dev/dri/renderD131"], "team-a.service")
    got = amd.run(
        params(tmp_path, sys_root, proc_root, [entry(B, compute="DPX")]),
        False,
        Runner(),
        which,
        None,
    )
    assert current(sys_root, B, "compute") == "DPX" and got["busy"] == []


def test_owned_units_are_stopped_and_started_around_the_change(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    add_process(
        proc_root, 4242, "python3", ["/dev/kfd", "/dev/dri/renderD136"], "numafleet-small-0.service"
    )
    runner = Runner()
    gpus = [entry(B, compute="CPX", units=["numafleet-small-0.service"])]
    got = amd.run(params(tmp_path, sys_root, proc_root, gpus), False, runner, which, None)
    assert runner.argvs == [
        ["/usr/bin/systemctl", "stop", "numafleet-small-0.service"],
        ["/usr/bin/systemctl", "start", "numafleet-small-0.service"],
    ]
    assert got["stopped_units"] == ["numafleet-small-0.service"]
    assert got["ran"][0] == "systemctl stop numafleet-small-0.service"
    assert got["ran"][-1] == "systemctl start numafleet-small-0.service"
    assert (
        "Before=multi-user.target numafleet-small-0.service"
        in (tmp_path / "root/etc/systemd/system" / amd.UNIT_NAME).read_text()
    )


def test_read_back_mismatch_is_reported(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)

    class Stubborn(amd.SysfsBackend):
        def set_compute(self, address, mode):  # the driver takes the write, keeps the mode
            return f"echo {mode}"

    backend_params = params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")])
    changes = amd.plan_changes(backend_params["gpus"], Stubborn(sys_root))
    with pytest.raises(amd.AmdPartitionError) as err:
        amd._converge(
            changes,
            Stubborn(sys_root),
            amd.RunContext(
                backend_params, False, False, False, Runner(), which, proc_root, sys_root, (), []
            ),
        )
    assert (
        f"GPU {B}: after the change the GPU shows compute SPX, memory NPS1, not CPX, NPS1"
        in str(err.value)
    )


# --- memory partition changes: reset_ok -----------------------------------------------------


def test_memory_change_without_reset_ok_changes_nothing_and_says_so(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    p = params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX", memory="NPS4")])
    got = amd.run(p, False, Runner(), which, None)
    assert got["reset_required"] and not got["gpu_changed"]
    assert got["gpus"][0]["reset_required"]
    assert current(sys_root, B, "memory") == "NPS1" and current(sys_root, B, "compute") == "SPX"
    assert "needs a reload of the amdgpu driver" in got["warnings"][0]
    assert got["drift"][0]["pending"]


def test_memory_change_with_reset_ok_reloads_once_and_needs_every_gpu_idle(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    add_process(proc_root, 9, "python3", ["/dev/dri/renderD131"], "team-b.service")  # on GPU A
    p = params(
        tmp_path, sys_root, proc_root, [entry(B, compute="CPX", memory="NPS4")], reset_ok=True
    )
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.run(p, False, Runner(), which, None)
    assert "a memory partition change (amdgpu reload)" in str(err.value) and "pid 9" in str(
        err.value
    )
    os.unlink(os.path.join(proc_root, "9", "fd", "3"))
    runner = Runner()
    got = amd.run(p, False, runner, which, None)
    assert runner.argvs == [["/usr/bin/modprobe", "-r", "amdgpu"], ["/usr/bin/modprobe", "amdgpu"]]
    assert (current(sys_root, B, "memory"), current(sys_root, B, "compute")) == ("NPS4", "CPX")
    assert not got["reset_required"]


# --- backends ------------------------------------------------------------------------------


def test_amdsmi_backend_sets_and_reloads_through_the_library(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    lib = amdsmi_module(sys_root)
    p = params(
        tmp_path,
        sys_root,
        proc_root,
        # CPX/NPS4 -> SPX/NPS1: memory first is allowed with CPX (fake_amdsmi refuses NPS4
        # while SPX, so the opposite direction through amdsmi is not shown here)
        [entry(A, compute="SPX", memory="NPS1", now=("CPX", "NPS4"))],
        reset_ok=True,
        backend="auto",
    )
    got = amd.run(p, False, Runner(), which, lambda: lib)
    assert [c for c in lib.calls if c.startswith(("amdsmi_set", "amdsmi_gpu_driver"))] == [
        "amdsmi_set_gpu_memory_partition",
        "amdsmi_gpu_driver_reload",
        "amdsmi_set_gpu_compute_partition",
    ]
    assert lib.calls[0] == "amdsmi_init" and lib.calls[-1] == "amdsmi_shut_down"
    (gpu,) = [g for g in lib.gpus if g.bdf == A]
    assert (gpu.compute_partition, gpu.memory_partition) == ("SPX", "NPS1")
    assert got["ran"] == [
        f"amdsmi_set_gpu_memory_partition({A}, NPS1)",
        "amdsmi_gpu_driver_reload()",
        f"amdsmi_set_gpu_compute_partition({A}, SPX)",
    ]


def test_amdsmi_refusal_is_reported(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    lib = amdsmi_module(sys_root)
    # a process the driver counts but procfs does not show: the library answers BUSY
    for gpu in lib.gpus:
        if gpu.bdf == B:
            gpu.processes.append({"name": "python3", "pid": 4242})
    p = params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")], backend="amdsmi")
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.run(p, False, Runner(), which, lambda: lib)
    assert "amdsmi_set_gpu_compute_partition(CPX) failed" in str(err.value)
    assert "AMDSMI_STATUS_BUSY" in str(err.value)


def test_amd_smi_cli_backend(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    runner = Runner(sys_root)
    p = params(tmp_path, sys_root, proc_root, [entry(B, compute="QPX")], backend="amd-smi")
    got = amd.run(p, False, runner, which, None)
    assert runner.argvs == [["/usr/bin/amd-smi", "set", "-g", B, "--compute-partition", "QPX"]]
    assert got["ran"] == [f"amd-smi set -g {B} --compute-partition QPX"]
    failing = Runner(sys_root, fail={"set": 1})
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.run(
            dict(p, gpus=[entry(B, compute="DPX", now=("QPX", "NPS1"))]),
            False,
            failing,
            which,
            None,
        )
    assert f"GPU {B}: amd-smi set -g {B} --compute-partition DPX failed (rc 1)" in str(err.value)


def test_auto_falls_back_and_named_backend_without_tools_is_refused(tmp_path):
    sys_root, dummy = make_tree(tmp_path)
    assert (
        amd.choose_backend("auto", False, sys_root, Runner(), lambda n: None, lambda: None).name
        == "sysfs"
    )
    assert (
        amd.choose_backend("auto", False, sys_root, Runner(), which, lambda: None).name == "amd-smi"
    )
    assert amd.choose_backend("amd-smi", True, sys_root, Runner(), which, None).name == "sysfs"
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.choose_backend("amdsmi", False, sys_root, Runner(), which, lambda: None)
    assert "backend=amdsmi: no way to reach the GPUs" in str(err.value)


# --- render mode --------------------------------------------------------------------------


def test_render_mode_writes_the_scratch_tree_without_reload_or_systemctl(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    add_process(proc_root, 5, "python3", ["/dev/kfd"], "someone.service")  # recorded, not refused
    runner = Runner()
    p = params(
        tmp_path,
        sys_root,
        proc_root,
        [entry(B, compute="CPX", memory="NPS4")],
        service_manager="none",
        reset_ok=True,
        backend="amdsmi",
    )
    got = amd.run(p, False, runner, which, None)
    assert runner.argvs == []
    assert (current(sys_root, B, "memory"), current(sys_root, B, "compute")) == ("NPS4", "CPX")
    assert "systemctl enable numafleet-amd-partition.service" in got["would_run"]
    assert amd.run(p, False, runner, which, None)["changed"] is False


def test_no_gpus_removes_what_an_earlier_run_wrote(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    p = params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")], service_manager="none")
    amd.run(p, False, Runner(), which, None)
    got = amd.run(dict(p, gpus=[]), False, Runner(), which, None)
    assert got["changed"] and not (tmp_path / "root/etc/numafleet/amd-partition.json").exists()


def test_a_foreign_boot_program_is_refused_before_the_gpu_changes(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    _write(str(tmp_path / "root/usr/local/libexec/numafleet-amd-partition"), "#!/bin/sh\nexit 0\n")
    p = params(tmp_path, sys_root, proc_root, [entry(B, compute="CPX")])
    with pytest.raises(amd.AmdPartitionError) as err:
        amd.run(p, False, Runner(), which, None)
    assert "holds a file numafleet did not write" in str(err.value)
    assert current(sys_root, B, "compute") == "SPX"


# --- boot persistence ----------------------------------------------------------------------


def test_boot_unit_parses_and_runs_the_boot_program_with_the_state_file():
    import systemd_syntax

    text = amd.unit_text(
        amd.DEFAULT_BOOT_PROGRAM_PATH, amd.DEFAULT_STATE_PATH, "# x", ("a.service",)
    )
    entries = systemd_syntax.parse_unit(text)
    (start,) = systemd_syntax.lookup(entries, "Service", "ExecStart")
    assert systemd_syntax.exec_commands(start) == [
        ("", [amd.PYTHON, amd.DEFAULT_BOOT_PROGRAM_PATH, amd.DEFAULT_STATE_PATH])
    ]
    assert systemd_syntax.lookup(entries, "Unit", "Before") == ["multi-user.target a.service"]


def test_boot_program_sets_the_recorded_compute_mode_again(tmp_path):
    sys_root, dummy = make_tree(tmp_path)
    change = amd.Change(B, "GPU-c3", ("SPX", "CPX"), ("NPS1", "NPS1"), ())
    state = tmp_path / "amd-partition.json"
    state.write_text(amd.state_text([change]))
    program: dict = {"__name__": "numafleet_amd_partition"}
    exec(compile(amd.BOOT_PROGRAM, "numafleet-amd-partition", "exec"), program)
    program["SYS"] = f"{sys_root}/bus/pci/devices/"
    assert program["main"](["numafleet-amd-partition", str(state)]) == 0
    assert current(sys_root, B, "compute") == "CPX"
    assert program["main"](["numafleet-amd-partition", str(tmp_path / "missing.json")]) == 1


def test_undeclared_unchanged_gpus_write_no_boot_unit(tmp_path):
    sys_root, proc_root = make_tree(tmp_path)
    gpus = [dict(entry(B), declared=False)]
    got = amd.run(params(tmp_path, sys_root, proc_root, gpus), False, Runner(), which, None)
    assert not got["changed"] and not (tmp_path / "root").exists()
