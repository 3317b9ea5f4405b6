"""MIG core (mig.py) and NVML/snapshot backends (mig_nvml.py) against the fake NVML."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import mig, mig_nvml
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import MigError

UNIT = Path(__file__).parents[3]
if str(UNIT) not in sys.path:
    sys.path.insert(0, str(UNIT))
import fake_nvml as fake  # noqa: E402

SNAPSHOTS = UNIT / "fixtures" / "gpu_snapshots"
BUS = "00000000:17:00.0"
ADDR = "0000:17:00.0"
ON = pynvml.NVML_DEVICE_MIG_ENABLE
OFF = pynvml.NVML_DEVICE_MIG_DISABLE
P = fake.A100_80GB_PROFILES


def a100(instances=(), mig=(ON, ON), **kw):
    return fake.FakeGpu(BUS, "NVIDIA A100 80GB PCIe", 81920, mig=mig, profiles=P,
                        gpu_instances=tuple(instances), **kw)  # fmt: skip


def gi(gi_id, name, start):
    profile = fake.profile_named(P, name)
    size = next(z for s, z in profile.placements if s == start)
    return fake.gpu_instance(BUS, gi_id, profile, start, size)


class Recorder:
    def __init__(self, nvml=None):
        self.argv = []
        self.nvml = nvml

    def __call__(self, argv):
        self.argv.append(list(argv))
        if "--gpu-reset" in argv and self.nvml is not None:
            self.nvml.reset(argv[-1])
        return 0, "", ""


def converge(nvml, layout, tmp_path, mode="enabled", **kw):
    backend = mig_nvml.NvmlBackend(nvml)
    host = mig.Host(runner=kw.pop("runner", Recorder(nvml)), procfs_root=str(tmp_path / "proc"),
                    sysfs_root=str(tmp_path / "sys"))  # fmt: skip
    requests = mig.parse_request([{"gpu": ADDR, "mode": mode, "layout": layout}])
    try:
        return mig.converge(backend, requests, host, **kw)
    finally:
        backend.close()


def shape(nvml):
    return sorted((g.profile_id, g.start, tuple(c.slices for c in g.compute_instances))
                  for g in nvml.gpus[0].gpu_instances)  # fmt: skip


def test_create_on_an_empty_gpu_and_second_run_changes_nothing(tmp_path):
    nvml = fake.FakeNvml([a100()])
    out = converge(
        nvml,
        [{"profile": "3g.40gb"}, {"profile": "3g.40gb", "compute_profile": "1c.3g.40gb"}],
        tmp_path,
    )
    assert shape(nvml) == [(9, 0, (3,)), (9, 4, (1,))]
    assert out.changed and [e["start"] for e in out.gpus[0].layout] == [0, 4]
    assert all(e["device_uuid"].startswith("MIG-") for e in out.gpus[0].layout)
    again = converge(
        nvml,
        [{"profile": "3g.40gb"}, {"profile": "3g.40gb", "compute_profile": "1c.3g.40gb"}],
        tmp_path,
    )
    assert not again.changed and again.ran == ()


def test_change_layout_destroys_then_creates_and_keeps_matching(tmp_path):
    nvml = fake.FakeNvml([a100([gi(1, "3g.40gb", 0), gi(2, "3g.40gb", 4)])])
    out = converge(nvml, [{"profile": "3g.40gb", "start": 4}, {"profile": "2g.20gb"}], tmp_path)
    assert shape(nvml) == [(9, 4, (3,)), (14, 0, (2,))]
    assert out.ran[:2] == (
        "nvmlComputeInstanceDestroy(0000:17:00.0, GI 1, CI 0)",
        "nvmlGpuInstanceDestroy(0000:17:00.0, GI 1)",
    )
    assert 2 in {e["gpu_instance_id"] for e in out.gpus[0].layout}


def test_check_mode_calls_no_write_function_and_predicts(tmp_path):
    nvml = fake.FakeNvml([a100([gi(1, "7g.80gb", 0)])])
    out = converge(nvml, [{"profile": "1g.10gb", "start": 6}], tmp_path, check_mode=True)
    assert not set(nvml.calls) & set(fake.WRITE_FUNCTIONS)
    assert out.changed and out.gpus[0].layout[0]["gpu_instance_id"] is None
    assert (
        "nvmlDeviceCreateGpuInstanceWithPlacement(0000:17:00.0, profile 19 (1g.10gb), start 6)"
        in out.gpus[0].actions
    )


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        (
            [{"profile": "3g.40gb"}] * 3,
            ["does not fit GPU 0000:17:00.0", "[3g.40gb, 3g.40gb, 3g.40gb]"],
        ),
        ([{"profile": "4g.40gb"}, {"profile": "4g.40gb"}], ["does not fit"]),
        (
            [{"profile": "5g.50gb"}],
            ["offers no GPU instance profile '5g.50gb'", "1g.10gb", "7g.80gb"],
        ),
        (
            [{"profile": "3g.40gb", "start": 2}],
            ["2 is not a placement of 3g.40gb", "start at 0, 4"],
        ),
        (
            [{"profile": "3g.40gb", "compute_profile": "1c.2g.20gb"}],
            ["not a compute profile of 3g.40gb"],
        ),
    ],
)
def test_invalid_layouts_fail_before_any_write(tmp_path, layout, words):
    nvml = fake.FakeNvml([a100([gi(1, "1g.10gb", 0)])])
    with pytest.raises(MigError) as err:
        converge(nvml, layout, tmp_path)
    for word in words:
        assert word in str(err.value)
    assert not set(nvml.calls) & set(fake.WRITE_FUNCTIONS)


def test_unknown_gpu_lists_the_gpus_found(tmp_path):
    nvml = fake.FakeNvml([a100()])
    backend = mig_nvml.NvmlBackend(nvml)
    with pytest.raises(MigError, match=r"no NVIDIA GPU '99:00.0'.*0000:17:00.0"):
        mig.converge(backend, mig.parse_request([{"gpu": "99:00.0"}]), mig.Host(runner=Recorder()))


def procfs(tmp_path, pids):
    for pid, unit in pids.items():
        d = tmp_path / "proc" / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(f"0::/system.slice/{unit}\n" if unit else "0::/user.slice\n")
        (d / "comm").write_text("python3\n")


def test_busy_gpu_refused_listing_pids_and_units(tmp_path):
    procfs(tmp_path, {4242: "vllm.service", 77: None})
    nvml = fake.FakeNvml(
        [a100([gi(1, "3g.40gb", 0)], compute_pids=(4242, 77), process_instances={4242: 1, 77: 1})]
    )
    with pytest.raises(MigError) as err:
        converge(nvml, [{"profile": "7g.80gb"}], tmp_path)
    text = str(err.value)
    assert "pid 77 (not in a systemd service)" in text and "pid 4242 (vllm.service)" in text
    assert "owned_units" in text and not set(nvml.calls) & set(fake.WRITE_FUNCTIONS)


def test_create_in_free_slices_of_a_busy_gpu_is_allowed(tmp_path):
    procfs(tmp_path, {4242: "vllm.service"})
    nvml = fake.FakeNvml(
        [a100([gi(1, "3g.40gb", 0)], compute_pids=(4242,), process_instances={4242: 1})]
    )
    converge(nvml, [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb"}], tmp_path)
    assert shape(nvml) == [(9, 0, (3,)), (9, 4, (3,))]


def test_busy_owned_units_are_stopped_and_started_again(tmp_path):
    procfs(tmp_path, {4242: "numafleet-llm.service"})
    gpu = a100([gi(1, "3g.40gb", 0)], compute_pids=(4242,), process_instances={4242: 1})
    nvml = fake.FakeNvml([gpu])

    class Stopper(Recorder):
        def __call__(self, argv):
            if argv[1:2] == ["stop"]:
                gpu.compute_pids, gpu.process_instances = (), {}
            return super().__call__(argv)

    runner = Stopper(nvml)
    out = converge(
        nvml,
        [{"profile": "7g.80gb"}],
        tmp_path,
        runner=runner,
        owned_units=("numafleet-llm.service",),
    )
    assert runner.argv[0] == ["systemctl", "stop", "numafleet-llm.service"]
    assert runner.argv[-1] == ["systemctl", "start", "numafleet-llm.service"]
    assert out.stopped_units == ("numafleet-llm.service",) and shape(nvml) == [(0, 0, (7,))]


def test_owned_units_started_again_when_the_change_fails(tmp_path):
    procfs(tmp_path, {4242: "numafleet-llm.service"})
    gpu = a100([gi(1, "3g.40gb", 0)], compute_pids=(4242,), process_instances={4242: 1})
    nvml = fake.FakeNvml([gpu])  # the process stays: the re-check after stopping refuses
    runner = Recorder(nvml)
    with pytest.raises(MigError, match="still use it after the owned units were stopped"):
        converge(
            nvml,
            [{"profile": "7g.80gb"}],
            tmp_path,
            runner=runner,
            owned_units=("numafleet-llm.service",),
        )
    assert runner.argv == [
        ["systemctl", "stop", "numafleet-llm.service"],
        ["systemctl", "start", "numafleet-llm.service"],
    ]


def test_ampere_mode_change_needs_reset(tmp_path):
    nvml = fake.FakeNvml([a100(mig=(OFF, OFF), reset_needed=True)])
    check = converge(nvml, [{"profile": "7g.80gb"}], tmp_path, check_mode=True)
    assert check.gpus[0].reset_required
    out = converge(nvml, [{"profile": "7g.80gb"}], tmp_path)
    assert out.gpus[0].reset_required and nvml.gpus[0].mig == (OFF, ON) and shape(nvml) == []
    # pending mode blocks the layout until reset_ok
    again = converge(nvml, [{"profile": "7g.80gb"}], tmp_path)
    assert again.gpus[0].reset_required and shape(nvml) == []
    runner = Recorder(nvml)
    done = converge(nvml, [{"profile": "7g.80gb"}], tmp_path, reset_ok=True, runner=runner)
    assert ["nvidia-smi", "--gpu-reset", "-i", ADDR] in runner.argv
    assert not done.gpus[0].reset_required and shape(nvml) == [(0, 0, (7,))]


def test_reset_ok_with_blockers_is_refused(tmp_path):
    (tmp_path / "sys" / "module" / "nvidia_drm").mkdir(parents=True)
    d = tmp_path / "proc" / "900"
    d.mkdir(parents=True)
    (d / "comm").write_text("nvidia-persiste\n")
    nvml = fake.FakeNvml([a100(mig=(OFF, OFF), reset_needed=True)])
    runner = Recorder(nvml)
    # The holders block the mode change itself (not only the reset), with the list.
    with pytest.raises(MigError) as caught:
        converge(nvml, [{"profile": "7g.80gb"}], tmp_path, reset_ok=True, runner=runner)
    assert "(a MIG mode change) is held by pid 900 (nvidia-persistenced" in str(caught.value)
    assert "the nvidia_drm kernel module" in str(caught.value)
    assert runner.argv == [] and nvml.gpus[0].mig == (OFF, OFF)
    blockers = mig.read_reset_blockers(str(tmp_path / "proc"), str(tmp_path / "sys"))
    assert any("nvidia_drm" in b for b in blockers)
    assert any("nvidia-persistenced (pid 900)" in b for b in blockers)


def test_hopper_mode_change_applies_without_reset(tmp_path):
    nvml = fake.FakeNvml([a100(mig=(OFF, OFF), architecture=pynvml.NVML_DEVICE_ARCH_HOPPER)])
    check = converge(nvml, [{"profile": "3g.40gb"}], tmp_path, check_mode=True)
    assert not check.gpus[0].reset_required
    out = converge(nvml, [{"profile": "3g.40gb"}], tmp_path)
    assert not out.gpus[0].reset_required and shape(nvml) == [(9, 0, (3,))]


def test_disable_destroys_instances_first(tmp_path):
    nvml = fake.FakeNvml([a100([gi(1, "3g.40gb", 0)], architecture=pynvml.NVML_DEVICE_ARCH_HOPPER)])
    out = converge(nvml, [], tmp_path, mode="disabled")
    assert nvml.gpus[0].mig == (OFF, OFF) and out.gpus[0].layout == ()


def test_re_read_mismatch_fails(tmp_path):
    nvml = fake.FakeNvml([a100()])
    original = nvml.nvmlGpuInstanceCreateComputeInstance

    def sloppy(gpuInstance, profileId):  # the driver makes a 1-slice CI whatever was asked
        return original(gpuInstance, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)

    nvml.nvmlGpuInstanceCreateComputeInstance = sloppy
    with pytest.raises(MigError, match="layout differs.*3g.40gb@0 with CI 3g.40gb is missing"):
        converge(nvml, [{"profile": "3g.40gb"}], tmp_path)


def test_render_mode_from_snapshot(tmp_path):
    backend = mig_nvml.SnapshotBackend(str(SNAPSHOTS / "synthetic-2x6338-4xa100.json"))
    requests = mig.parse_request([
        {"gpu": "0000:17:00.0", "layout": [{"profile": "7g.80gb"}]},
        {"gpu": "0000:31:00.0", "layout": [{"profile": "3g.40gb"}]},
    ])  # fmt: skip
    out = mig.converge(backend, requests, mig.Host(), render=True)
    assert "nvidia-smi mig -i 0000:17:00.0 -dgi -gi 2" in out.would_run
    assert "nvidia-smi mig -i 0000:17:00.0 -cgi 0:0" in out.would_run
    assert "nvidia-smi -i 0000:31:00.0 -mig 1" in out.would_run
    assert out.gpus[1].reset_required  # A100 (ampere, from its name)
    with pytest.raises(MigError, match="render mode"):
        backend.set_mode("0000:17:00.0", True)


def test_boot_program_compiles_and_runs_the_recorded_layout(tmp_path, monkeypatch):
    nvml = fake.FakeNvml([a100()])
    out = converge(
        nvml,
        [
            {"profile": "3g.40gb", "start": 4, "compute_profile": "1c.3g.40gb"},
            {"profile": "2g.20gb"},
        ],
        tmp_path,
        check_mode=True,
    )
    state = tmp_path / "mig.json"
    state.write_text(mig.state_text(out))
    code = mig.boot_program_text()
    compile(code, "numafleet-mig", "exec")
    namespace = {"__name__": "boot"}
    exec(compile(code, "numafleet-mig", "exec"), namespace)
    calls = []
    recorded_uuid = json.loads(state.read_text())["gpus"][0]["uuid"]
    answers = {"uuid": recorded_uuid}

    def fake_run(argv):
        calls.append(argv)
        if "--query-gpu=uuid" in argv:
            return 0, answers["uuid"] + "\n"
        if "--query-gpu=mig.mode.current" in argv:
            return 0, "Enabled\n"
        if "-lgi" in argv:
            return 6, "No GPU instances found: Not Found\n"
        if "-cgi" in argv:
            return (
                0,
                "Successfully created GPU instance ID  5 on GPU  0 using profile MIG 3g.40gb (ID  9)\n",
            )
        return 0, "ok\n"

    namespace["run"] = fake_run
    assert namespace["main"](["numafleet-mig", str(state)]) == 0
    creates = [c[4:] for c in calls if "-cgi" in c or "-cci" in c]
    assert creates == [
        ["-cgi", "2g.20gb:0", "-C"],
        ["-cgi", "3g.40gb:4"],
        ["-cci", "0", "-gi", "5"],
    ]
    # Another GPU at the recorded address (replaced): nothing is created, the boot unit fails.
    calls.clear()
    answers["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
    assert namespace["main"](["numafleet-mig", str(state)]) == 1
    assert not [c for c in calls if "-cgi" in c]
    # An unreadable or broken state file: a message, exit 1, no traceback.
    state.write_text("{not json")
    assert namespace["main"](["numafleet-mig", str(state)]) == 1
    assert namespace["main"](["numafleet-mig", str(tmp_path / "missing.json")]) == 1


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    program = tmp_path / "numafleet-mig"
    program.write_text(mig.boot_program_text())
    unit = tmp_path / mig.UNIT_NAME
    unit.write_text(mig.unit_text(str(program), str(tmp_path / "mig.json"), "# test"))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout + proc.stderr == ""
