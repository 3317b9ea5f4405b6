"""GPU baseline settings: input, planning, busy-GPU rules, the three backends, read-back."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

UNIT = Path(__file__).parents[3]
if str(UNIT) not in sys.path:
    sys.path.insert(0, str(UNIT))
import fake_nvml as fake  # noqa: E402

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (  # noqa: E402
    gpu_settings as gs,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (  # noqa: E402
    GpuSettingsError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.mig_holders import (  # noqa: E402
    read_gpu_minors,
    read_holders,
)

FIXTURES = UNIT / "fixtures"
H100_XML = FIXTURES / "cmd" / "nvidia-smi" / "h100-sxm-q-x.xml"
SNAPSHOT = FIXTURES / "gpu_snapshots" / "synthetic-8xh100-2s.json"
A = "0000:17:00.0"
B = "0000:31:00.0"
# H100 SXM values of the recorded nvidia-smi -q (h100-sxm-q.txt): 200-700 W, 2619/1980 MHz.
H100_CLOCKS = {2619: (1980, 1755, 1410, 1050)}


def h100(bus_id: str, **kw) -> fake.FakeGpu:
    values = dict(
        application_clocks=(2619, 1980),
        supported_clocks=H100_CLOCKS,
        power_limit_mw=700000,
        power_constraints_mw=(200000, 700000),
        persistence=pynvml.NVML_FEATURE_DISABLED,
    )
    values.update(kw)
    return fake.FakeGpu(bus_id, "NVIDIA H100 80GB HBM3", 81559, **values)


def nvml_of(*gpus):
    return fake.FakeNvml(list(gpus) or [h100("00000000:17:00.0"), h100("00000000:31:00.0")])


class Host:
    """The host protocol of gpu_settings.run: commands recorded, holders from a procfs tree."""

    def __init__(self, nvml=None, procfs=None, outputs=None, which=("nvidia-smi", "systemctl")):
        self.nvml = nvml
        self.procfs = str(procfs) if procfs else "/nonexistent"
        self.outputs = outputs or {}
        self.argvs: list = []
        self.found = which
        self.on_run = None

    def runner(self, argv):
        self.argvs.append(list(argv))
        if self.on_run:
            self.on_run(argv)
        for key, answer in self.outputs.items():
            if " ".join(argv[1:]).startswith(key):
                return answer() if callable(answer) else answer
        return (0, "", "")

    def which(self, name):
        return f"/usr/bin/{name}" if name in self.found else None

    def load_nvml(self):
        return self.nvml

    def holders(self):
        return read_holders(self.procfs, "/nonexistent", exclude_pids=(os.getpid(),))

    def minors(self):
        return read_gpu_minors(self.procfs)


def procfs_with(tmp_path, pid: int, device: str, unit: str = "team-a.service"):
    """A procfs tree: GPU A is minor 0, B minor 1; ``pid`` in ``unit`` has ``device`` open."""
    root = tmp_path / "proc"
    for address, minor in ((A, 0), (B, 1)):
        info = root / "driver" / "nvidia" / "gpus" / address
        info.mkdir(parents=True)
        (info / "information").write_text(f"Model: H100\nDevice Minor: {minor}\n")
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    os.symlink(device, fd / "3")
    os.symlink("/dev/nvidiactl", fd / "4")
    (root / str(pid) / "comm").write_text("python3\n")
    (root / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    return root


def params(gpus, **kw):
    out = dict(gpus=gpus, mps_gpus=[], backend="auto", snapshot=None, root="/")
    out.update(service_manager="none", procfs_root="/proc", sysfs_root="/sys")
    out.update(kw)
    return out


# --- input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"gpu": A}, "gpus: give a list"),
        (["0000:17:00.0"], "gpus[0]: '0000:17:00.0' is not a dictionary"),
        ([{"gpu": ""}], "gpus[0].gpu: give the GPU's PCI address"),
        ([{"gpu": A, "clocks": 1}], "gpus[0]: unknown key(s) clocks"),
        ([{"gpu": A}, {"gpu": A.upper()}], "gpus[1].gpu: GPU 0000:17:00.0 is declared twice"),
        ([{"gpu": A, "persistence": "yes"}], "gpus[0].persistence: give true or false"),
        (
            [{"gpu": A, "compute_mode": "EXCLUSIVE_THREAD"}],
            "is not one of DEFAULT, EXCLUSIVE_PROCESS",
        ),
        (
            [{"gpu": A, "application_clocks": {"memory_mhz": 2619}}],
            "give {memory_mhz, graphics_mhz}",
        ),
        (
            [{"gpu": A, "application_clocks": {"memory_mhz": 2619, "graphics_mhz": 0}}],
            "application_clocks.graphics_mhz: 0 is not a positive whole number of MHz",
        ),
        ([{"gpu": A, "power_limit_w": True}], "power_limit_w: True is not a positive whole number"),
    ],
)
def test_bad_input_is_refused_naming_the_entry(entries, message):
    with pytest.raises(GpuSettingsError) as err:
        gs.parse_settings(entries)
    assert message in str(err.value)


def test_input_is_normalised():
    (got,) = gs.parse_settings(
        [
            {
                "gpu": " 17:00.0 ",
                "compute_mode": "exclusive_process",
                "application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1755},
                "power_limit_w": 600,
                "persistence": None,
            }
        ]
    )
    assert got == gs.Desired("17:00.0", None, "EXCLUSIVE_PROCESS", (2619, 1755), 600)


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("17:00.0", A),
        ("0000:17:00.0", A),
        ("00000000:DB:00.0", "0000:db:00.0"),
        ("GPU-1234", None),
        ("17:00", None),
    ],
)
def test_normalise_address(text, address):
    assert gs.normalise_address(text) == address


def test_unknown_gpu_names_the_known_ones():
    gpus = [gs.GpuNow(A, uuid="GPU-a")]
    with pytest.raises(GpuSettingsError) as err:
        gs.resolve(gs.parse_settings([{"gpu": "GPU-b"}]), gpus)
    assert "gpus[0].gpu: GPU GPU-b is not on this host (NVIDIA GPUs: 0000:17:00.0)" in str(
        err.value
    )
    with pytest.raises(GpuSettingsError) as err:
        gs.resolve(gs.parse_settings([{"gpu": A}, {"gpu": "gpu-A"}]), gpus)
    assert "gpus[1].gpu: GPU gpu-A is 0000:17:00.0, which gpus[0] declares already" in str(
        err.value
    )


# --- planning and busy rules -------------------------------------------------------------------

NOW = gs.GpuNow(
    A,
    uuid="GPU-a",
    persistence=False,
    compute_mode="DEFAULT",
    application_clocks=(2619, 1980),
    supported_clocks=H100_CLOCKS,
    power_limit_w=700,
    power_min_w=200,
    power_max_w=700,
)


NO_DAEMON = gs.Daemon(False)


def plan_of(entry, now=NOW, held=(), daemon=NO_DAEMON, mps=()):
    return gs.plan(gs.parse_settings([dict(gpu=A, **entry)]), [now], daemon, lambda a: held, mps)


@pytest.mark.parametrize(
    ("entry", "before", "after", "line"),
    [
        ({"persistence": True}, "disabled", "enabled", f"nvidia-smi -i {A} -pm 1"),
        (
            {"compute_mode": "EXCLUSIVE_PROCESS"},
            "DEFAULT",
            "EXCLUSIVE_PROCESS",
            f"nvidia-smi -i {A} -c EXCLUSIVE_PROCESS",
        ),
        (
            {"application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1410}},
            "memory 2619 MHz, graphics 1980 MHz",
            "memory 2619 MHz, graphics 1410 MHz",
            f"nvidia-smi -i {A} -ac 2619,1410",
        ),
        ({"power_limit_w": 450}, "700 W", "450 W", f"nvidia-smi -i {A} -pl 450"),
    ],
)
def test_each_setting_plans_one_change(entry, before, after, line):
    got = plan_of(entry)
    ((change),) = got.changes
    assert (change.before, change.after, change.line) == (before, after, line)
    assert gs.would_run(got) == [line]
    assert plan_of(entry, now=gs._predicted(NOW, got)).changes == ()


HELD = ["pid 4242 (python3, team-a.service: /dev/nvidia0)"]


@pytest.mark.parametrize(
    ("entry", "refused"),
    [
        ({"compute_mode": "EXCLUSIVE_PROCESS"}, True),
        ({"persistence": True}, False),
        ({"application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1050}}, False),
        ({"power_limit_w": 300}, False),
    ],
)
def test_only_exclusive_process_is_refused_on_a_busy_gpu(entry, refused):
    got = plan_of(entry, held=HELD)
    assert bool(got.busy) == refused
    if refused:
        with pytest.raises(GpuSettingsError) as err:
            gs.refuse(got.busy)
        assert "GPU 0000:17:00.0 (compute mode to EXCLUSIVE_PROCESS) is in use by pid 4242" in str(
            err.value
        )
        assert "nothing was changed" in str(err.value)


def test_default_compute_mode_is_harmless_on_a_busy_gpu():
    now = gs.GpuNow(A, compute_mode="EXCLUSIVE_PROCESS")
    got = plan_of({"compute_mode": "DEFAULT"}, now=now, held=HELD)
    assert got.busy == {} and [c.after for c in got.changes] == ["DEFAULT"]


@pytest.mark.parametrize(
    ("entry", "now", "mps", "message"),
    [
        ({"compute_mode": "DEFAULT"}, NOW, (A,), "an MPS daemon of the plan shares this GPU"),
        (
            {"compute_mode": "DEFAULT"},
            gs.GpuNow(A, mig_enabled=True),
            (),
            "the GPU is in MIG mode",
        ),
        ({"power_limit_w": 800}, NOW, (), "power_limit_w 800 is outside the GPU's 200-700 W"),
        (
            {"application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1000}},
            NOW,
            (),
            "not a pair the GPU supports (memory 2619 MHz: graphics 1050-1980 MHz)",
        ),
    ],
)
def test_values_the_gpu_cannot_take_are_refused(entry, now, mps, message):
    with pytest.raises(GpuSettingsError) as err:
        plan_of(entry, now=now, mps=mps)
    assert message in str(err.value)
    assert str(err.value).startswith("GPU 0000:17:00.0 (gpus[0])")


def test_limits_not_known_are_not_checked():
    got = plan_of({"power_limit_w": 9999}, now=gs.GpuNow(A))
    assert [c.before for c in got.changes] == ["unknown"]


@pytest.mark.parametrize(
    ("daemon", "wanted", "action"),
    [
        (gs.Daemon(True, enabled=False, active=False), True, "enable"),
        (gs.Daemon(True, enabled=True, active=False), True, "enable"),
        (gs.Daemon(True, enabled=True, active=True), True, None),
        (gs.Daemon(True, enabled=True, active=True), False, "disable"),
        (gs.Daemon(True, enabled=False, active=False), False, None),
        (gs.Daemon(False), True, None),
    ],
)
def test_the_persistence_daemon_when_installed(daemon, wanted, action):
    got = plan_of({"persistence": wanted}, daemon=daemon)
    assert got.daemon_action == action
    lines = gs.would_run(got)
    if action:
        assert lines[0] == f"systemctl {action} --now nvidia-persistenced.service"
        assert not any("-pm" in line for line in lines)  # the daemon sets it


def test_without_the_daemon_persistence_warns_of_the_legacy_call():
    got = plan_of({"persistence": True})
    (warning,) = got.warnings
    assert "nvidia-persistenced.service is not installed" in warning
    assert "legacy" in warning


def test_mixed_persistence_is_refused_where_the_daemon_decides():
    gpus = [NOW, gs.GpuNow(B, persistence=False)]
    desired = gs.parse_settings([{"gpu": A, "persistence": True}, {"gpu": B, "persistence": False}])
    with pytest.raises(GpuSettingsError) as err:
        gs.plan(desired, gpus, gs.Daemon(True), lambda a: [])
    assert "declare the same persistence for every GPU" in str(err.value)
    # Without the daemon each GPU keeps its own.
    assert len(gs.plan(desired, gpus, gs.Daemon(False), lambda a: []).changes) == 1


@pytest.mark.parametrize(
    ("text", "daemon"),
    [
        (
            "LoadState=loaded\nUnitFileState=enabled\nActiveState=active\n",
            gs.Daemon(True, True, True),
        ),
        ("LoadState=loaded\nUnitFileState=disabled\nActiveState=inactive\n", gs.Daemon(True)),
        ("LoadState=not-found\nUnitFileState=\nActiveState=inactive\n", gs.Daemon(False)),
    ],
)
def test_parse_daemon(text, daemon):
    assert gs.parse_daemon(text) == daemon


# --- holders: the real /proc reader on a tree --------------------------------------------------


def test_context_holders_count_the_gpus_own_device_file(tmp_path):
    root = procfs_with(tmp_path, 4242, "/dev/nvidia1")
    holders, minors = read_holders(str(root), "/nonexistent"), read_gpu_minors(str(root))
    assert gs.context_holders(holders, minors, A) == []
    (text,) = gs.context_holders(holders, minors, B)
    assert text.startswith("pid 4242 (python3, team-a.service")


# --- NVML backend through the fake -------------------------------------------------------------

DECLARED = [
    {
        "gpu": A,
        "persistence": True,
        "compute_mode": "EXCLUSIVE_PROCESS",
        "application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1410},
        "power_limit_w": 500,
    }
]


def test_nvml_check_apply_again():
    nvml = nvml_of()
    host = Host(nvml)
    check = gs.run(params(DECLARED), True, host)
    assert check["changed"] and check["backend"] == "nvml"
    assert [c["setting"] for c in check["changes"]] == list(gs.SETTINGS)
    assert check["gpus"][0]["settings"]["power_limit_w"] == {
        "declared": "500 W",
        "before": "700 W",
        "after": "500 W",
    }
    assert nvml.gpus[0].power_limit_mw == 700000  # check mode set nothing
    assert not [c for c in nvml.calls if c.startswith("nvmlDeviceSet")]
    assert {d["setting"] for d in check["drift"]} == {f"GPU {A} {s}" for s in gs.SETTINGS}
    applied = gs.run(params(DECLARED), False, host)
    assert applied["changed"] and len(applied["ran"]) == 4
    assert "nvmlDeviceSetPowerManagementLimit(500000)" in applied["ran"][-1]
    gpu = nvml.gpus[0]
    assert gpu.persistence == pynvml.NVML_FEATURE_ENABLED
    assert gpu.compute_mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert (gpu.application_clocks, gpu.power_limit_mw) == ((2619, 1410), 500000)
    assert nvml.gpus[1].power_limit_mw == 700000  # not declared: untouched
    again = gs.run(params(DECLARED), False, host)
    assert not again["changed"] and again["ran"] == [] and again["drift"] == []
    assert nvml.initialised == 0  # every run shut NVML down


def test_nvml_refusal_stops_before_any_set(tmp_path):
    nvml = nvml_of()
    host = Host(nvml, procfs=procfs_with(tmp_path, 4242, "/dev/nvidia0"))
    with pytest.raises(GpuSettingsError) as err:
        gs.run(params(DECLARED, procfs_root=host.procfs), False, host)
    assert "pid 4242 (python3, team-a.service" in str(err.value)
    assert not [c for c in nvml.calls if c.startswith("nvmlDeviceSet")]


def test_a_process_nvml_lists_but_proc_does_not_show_refuses_too():
    nvml = nvml_of(h100("00000000:17:00.0", compute_pids=(4242,)))  # another PID namespace
    with pytest.raises(GpuSettingsError) as err:
        gs.run(params([{"gpu": A, "compute_mode": "EXCLUSIVE_PROCESS"}]), True, Host(nvml))
    assert "is in use by pid 4242 (listed by nvml)" in str(err.value)


def test_a_process_both_show_is_named_once(tmp_path):
    root = procfs_with(tmp_path, 4242, "/dev/nvidia0")
    holders, minors = read_holders(str(root), "/nonexistent"), read_gpu_minors(str(root))
    (text,) = gs.context_holders(holders, minors, A, (4242,), "nvml")
    assert text.startswith("pid 4242 (python3, team-a.service")


def test_nvml_error_names_the_call_and_the_fix():
    nvml = nvml_of(
        h100(
            "00000000:17:00.0",
            failures={"nvmlDeviceSetPowerManagementLimit": pynvml.NVML_ERROR_NO_PERMISSION},
        )
    )
    ran: list = []
    with pytest.raises(GpuSettingsError) as err:
        gs.run(params([{"gpu": A, "power_limit_w": 400}]), False, Host(nvml), ran)
    assert "nvmlDeviceSetPowerManagementLimit(400000) failed" in str(err.value)
    assert "run the module as root" in str(err.value)
    assert ran == []


def test_nvml_without_clocks_or_power_reports_unknown_and_refuses_nothing_it_cannot_check():
    nvml = nvml_of(fake.FakeGpu("00000000:17:00.0", "GeForce", 8192))
    got = gs.run(params([{"gpu": A, "compute_mode": "DEFAULT"}]), True, Host(nvml))
    assert not got["changed"]  # the fake's default compute mode is DEFAULT
    with pytest.raises(GpuSettingsError) as err:
        gs.run(params([{"gpu": A, "power_limit_w": 100}]), False, Host(nvml))
    assert "nvmlDeviceGetPowerManagementLimit" not in str(err.value)
    assert "NVML_ERROR_NOT_SUPPORTED" in str(err.value) or "Not Supported" in str(err.value)


def test_persistence_through_the_daemon():
    nvml = nvml_of()
    shown = {"show": (0, "LoadState=loaded\nUnitFileState=disabled\nActiveState=inactive\n", "")}
    host = Host(nvml, outputs=shown)

    def daemon_started(argv):
        if argv[1:3] == ["enable", "--now"]:
            for gpu in nvml.gpus:  # what nvidia-persistenced does to every GPU
                gpu.persistence = pynvml.NVML_FEATURE_ENABLED
            shown["show"] = (0, "LoadState=loaded\nUnitFileState=enabled\nActiveState=active\n", "")

    host.on_run = daemon_started
    declared = [{"gpu": A, "persistence": True}]
    applied = gs.run(params(declared, service_manager="systemd"), False, host)
    assert applied["ran"] == ["systemctl enable --now nvidia-persistenced.service"]
    assert "nvmlDeviceSetPersistenceMode" not in nvml.calls
    again = gs.run(params(declared, service_manager="systemd"), False, host)
    assert not again["changed"]


# --- nvidia-smi backend against the recorded output --------------------------------------------


def test_parse_the_recorded_h100_xml():
    (gpu,) = gs.parse_smi_xml(H100_XML.read_text())
    assert gpu.address == "0000:db:00.0"
    assert (gpu.persistence, gpu.compute_mode) == (True, "DEFAULT")
    assert (gpu.application_clocks, gpu.default_application_clocks) == ((2619, 1980), (2619, 1980))
    assert (gpu.power_limit_w, gpu.power_default_w, gpu.power_min_w, gpu.power_max_w) == (
        700,
        700,
        200,
        700,
    )
    assert gpu.supported_clocks is None and not gpu.mig_enabled


def test_nvidia_smi_sets_and_reads_back():
    xml = {"text": H100_XML.read_text()}
    host = Host(None, outputs={"-q -x": lambda: (0, xml["text"], "")})

    def applied_by_the_driver(argv):
        if "-pl" in argv:
            xml["text"] = xml["text"].replace(
                "<current_power_limit>700.00 W", f"<current_power_limit>{argv[-1]}.00 W", 1
            )

    host.on_run = applied_by_the_driver
    declared = [{"gpu": "db:00.0", "power_limit_w": 450}]
    got = gs.run(params(declared, backend="nvidia-smi"), False, host)
    assert got["ran"] == ["nvidia-smi -i 0000:db:00.0 -pl 450"]
    assert ["/usr/bin/nvidia-smi", "-i", "0000:db:00.0", "-pl", "450"] in host.argvs
    assert not gs.run(params(declared, backend="nvidia-smi"), False, host)["changed"]


def test_a_read_back_that_differs_fails():
    host = Host(None, outputs={"-q -x": (0, H100_XML.read_text(), "")})  # the driver ignores it
    with pytest.raises(GpuSettingsError) as err:
        gs.run(
            params([{"gpu": "db:00.0", "power_limit_w": 450}], backend="nvidia-smi"), False, host
        )
    assert "power_limit_w: asked 450 W, it reports 700 W" in str(err.value)


def test_a_failing_nvidia_smi_names_the_command():
    host = Host(
        None,
        outputs={"-q -x": (0, H100_XML.read_text(), ""), "-i": (3, "", "Insufficient Permissions")},
    )
    with pytest.raises(GpuSettingsError) as err:
        gs.run(
            params([{"gpu": "db:00.0", "power_limit_w": 450}], backend="nvidia-smi"), False, host
        )
    assert "nvidia-smi -i 0000:db:00.0 -pl 450 failed (rc 3): Insufficient Permissions" in str(
        err.value
    )


def test_no_backend_says_what_is_missing():
    with pytest.raises(GpuSettingsError) as err:
        gs.run(params([{"gpu": A}]), False, Host(None, which=()))
    assert "nvidia-ml-py (import pynvml) is not installed" in str(err.value)
    assert "nvidia-smi is not on the PATH" in str(err.value)


# --- snapshot backend (render mode) ------------------------------------------------------------


def snapshot_copy(tmp_path, processes=None):
    doc = json.loads(SNAPSHOT.read_text())
    if processes:
        doc["gpus"][0]["processes"] = processes
    path = tmp_path / "gpu-snapshot.json"
    path.write_text(json.dumps(doc))
    return path


def test_render_check_apply_again(tmp_path):
    path = snapshot_copy(tmp_path)
    before = path.read_text()
    declared = [{"gpu": "18:00.0", "compute_mode": "EXCLUSIVE_PROCESS", "power_limit_w": 600}]
    check = gs.run(params(declared, snapshot=str(path)), True, Host(None))
    assert check["changed"] and path.read_text() == before
    assert check["diff"] == [
        {
            "before_header": "NVIDIA GPU 0000:18:00.0 settings",
            "after_header": "NVIDIA GPU 0000:18:00.0 settings",
            "before": "compute_mode: DEFAULT\npower_limit_w: unknown\n",
            "after": "compute_mode: EXCLUSIVE_PROCESS\npower_limit_w: 600 W\n",
        }
    ]
    applied = gs.run(params(declared, snapshot=str(path)), False, Host(None))
    assert applied["snapshot_written"] and applied["ran"] == []
    assert applied["would_run"] == [
        "nvidia-smi -i 0000:18:00.0 -c EXCLUSIVE_PROCESS",
        "nvidia-smi -i 0000:18:00.0 -pl 600",
    ]
    record = json.loads(path.read_text())["gpus"][0]
    assert record["compute_mode"] == "exclusive_process"
    assert record["power_limit"] == {"current_w": 600}
    again = gs.run(params(declared, snapshot=str(path)), False, Host(None))
    assert not again["changed"] and not again["snapshot_written"]


def test_render_busy_gpu_is_refused(tmp_path):
    path = snapshot_copy(tmp_path, processes=[4242])
    declared = [{"gpu": "18:00.0", "compute_mode": "EXCLUSIVE_PROCESS"}]
    with pytest.raises(GpuSettingsError) as err:
        gs.run(params(declared, snapshot=str(path)), True, Host(None))
    assert "in use by pid 4242 (recorded in the snapshot)" in str(err.value)
    ok = gs.run(
        params([{"gpu": "18:00.0", "power_limit_w": 400}], snapshot=str(path)), True, Host(None)
    )
    assert ok["changed"]


def test_nothing_declared_reads_nothing():
    got = gs.run(params([]), False, Host(None, which=()))
    assert got["changed"] is False and got["backend"] is None


# --- never a traceback -------------------------------------------------------------------------

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.text(max_size=8),
    st.dictionaries(st.sampled_from(["memory_mhz", "graphics_mhz", "x"]), st.integers(-1, 3000)),
)
_ENTRY = st.dictionaries(
    st.sampled_from(
        ["gpu", "persistence", "compute_mode", "application_clocks", "power_limit_w", "y"]
    ),
    _VALUES,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_ENTRY, max_size=4), _VALUES))
def test_any_input_is_a_result_or_a_named_refusal(entries):
    message = ""
    try:
        desired = gs.parse_settings(entries)
        got = gs.plan(desired, [NOW, gs.GpuNow(B, uuid="GPU-b")], gs.Daemon(True), lambda a: HELD)
        gs.refuse(got.busy)
    except GpuSettingsError as exc:
        message = str(exc)
        assert message  # a refusal says what is wrong
