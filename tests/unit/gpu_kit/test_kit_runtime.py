"""GPU proof kit checks 4 (cuda_visibility) and 5 (mps) on this machine's real kernel.

The planner, the unit renderer, the pinning (sched_setaffinity + set_mempolicy) and the
numa_maps reading are the kit's real code; the CUDA client is stub_client.py and the MPS control
program the fake in fakes/, as this machine has no GPU.
"""

from __future__ import annotations

import os
import subprocess
import time

import gpu_proof
import proof_runtime
import pytest
from kit_helpers import STUB_UUID, items, stub_gpu_entry

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import facts as numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader


def facts_with(entry: dict) -> dict:
    return {"gpus": [entry], "nvml": {}, "nvidia_smi": {}, "snapshot": {}, "warnings": []}


def run_check(ctx, function) -> gpu_proof.Check:
    check = gpu_proof.Check("x", "x")
    function(ctx, check)
    return check


def test_cuda_visibility_passes_with_the_planned_unit(kit_context):
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_cuda_visibility)
    found = items(check)
    assert check.status == "pass", [i.as_dict() for i in check.items if i.status != "pass"]
    cpus = sorted(os.sched_getaffinity(0))[:4]
    assert found["cpu_affinity"].observed["Cpus_allowed_list"] == cpus
    env = found["unit_environment"].observed["Environment"]
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": STUB_UUID}
    # set_mempolicy(MPOL_BIND) reached the process, as NUMAPolicy=bind does.
    assert "bind:0" in found["memory_policy"].observed
    assert found["pinned_buffer_node"].observed["kb_by_node"] == {"0": 256 * 1024}
    assert found["uuid_selects"].observed["devices"]["count"] == 0
    text = (ctx.out / "cuda-client.txt").read_text()
    assert 'Environment="CUDA_VISIBLE_DEVICES=' + STUB_UUID in text


def test_cuda_visibility_fails_when_the_process_sees_another_gpu(kit_context, monkeypatch):
    monkeypatch.setenv("STUB_GPU_UUID", "GPU-99999999-2222-3333-4444-555555555555")
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_cuda_visibility)
    found = items(check)
    assert check.status == "fail"
    assert found["visible_device"].status == "fail"
    assert found["visible_device"].observed["count"] == 0


def test_unpinned_process_fails_the_affinity_item(kit_context, monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to plan fewer than all of them")
    monkeypatch.setattr(proof_runtime, "pinning", lambda cpus, mems: None)
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    plan = proof_runtime.plan_placement
    monkeypatch.setattr(
        proof_runtime,
        "plan_placement",
        lambda numa, facts, entry, name, extra: plan(numa, facts, entry, name, {"cpus": 1}),
    )
    check = run_check(ctx, proof_runtime.check_cuda_visibility)
    assert items(check)["cpu_affinity"].status == "fail"


def test_mig_mode_gpu_is_left_alone(kit_context):
    ctx = kit_context()
    mig = {
        "mode_current": "enabled",
        "mode_pending": "enabled",
        "gpu_instances": [],
        "supported_profiles": None,
    }
    ctx.gpu_facts = facts_with(stub_gpu_entry(mig=mig))
    with pytest.raises(gpu_proof.Skip, match="never changes MIG mode"):
        run_check(ctx, proof_runtime.check_cuda_visibility)


def test_mps_cycle_sets_reads_back_and_quits(kit_context):
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_mps)
    found = items(check)
    assert check.status == "pass", [i.as_dict() for i in check.items if i.status != "pass"]
    read_back = [cycle["read_back"] for cycle in found["settings_right_after_start"].observed]
    assert read_back == [{"active_thread_percentage": 25, "pinned_memory_limit_mib": 2048}] * 3
    assert found["compute_mode_untouched"].status == "skipped"
    assert found["pinned_limit_seen_by_client"].observed["memory_free_bytes"] == 2046 << 20
    assert proof_runtime.mps_processes("/proc") == {}
    transcript = (ctx.out / "mps-transcript.txt").read_text()
    assert "ExecStartPost=/bin/sh -c 'echo set_default_active_thread_percentage 25" in transcript


def test_mps_settings_sent_too_early_fail(kit_context, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_LATE", "1")
    monkeypatch.setattr(proof_runtime, "MPS_EXIT_WAIT_S", 2)
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_mps)
    item = items(check)["settings_right_after_start"]
    assert item.status == "fail"
    assert item.observed[0]["post"][0]["rc"] != 0


def test_mps_server_left_running_fails_and_is_killed(kit_context, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_STICKY", "1")
    monkeypatch.setattr(proof_runtime, "MPS_EXIT_WAIT_S", 2)
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_mps)
    item = items(check)["nothing_left_running"]
    assert item.status == "fail"
    assert set(item.observed.values()) == {"nvidia-cuda-mps-server"}
    assert proof_runtime.mps_processes("/proc") == {}


def test_mps_without_the_control_program_is_skipped(kit_context):
    ctx = kit_context(which=lambda name: None)
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    with pytest.raises(gpu_proof.Skip, match="nvidia-cuda-mps-control is not in PATH"):
        run_check(ctx, proof_runtime.check_mps)


def test_kernel_without_numa_maps_skips_the_memory_items(kit_context, monkeypatch, tmp_path):
    """A kernel without CONFIG_NUMA (or a sandbox) has no /proc/<pid>/numa_maps: the memory
    items say so instead of failing, the CPU items still judge."""
    proc = tmp_path / "proc"
    start = proof_runtime.start_client

    def mirrored(*args, **kwargs):
        client = start(*args, **kwargs)
        ready = client.event("ready")
        if ready:
            (proc / str(ready["pid"])).mkdir(parents=True)
            status = f"/proc/{ready['pid']}/status"
            (proc / str(ready["pid"]) / "status").write_text(open(status).read())
        return client

    monkeypatch.setattr(proof_runtime, "start_client", mirrored)
    ctx = kit_context(procfs_root=str(proc))
    ctx.numa_facts = numa_facts.read_numa_facts(Reader("/sys", "/proc"))
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_cuda_visibility)
    found = items(check)
    assert found["cpu_affinity"].status == "pass"
    for name in ("pinned_buffer_node", "process_memory", "memory_policy"):
        assert found[name].status == "skipped", name
    assert "no /proc/<pid>/numa_maps" in found["process_memory"].note
    assert check.status == "pass"


def test_busy_gpu_is_left_alone(kit_context):
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry(processes=[4242]))
    with pytest.raises(gpu_proof.Skip, match=r"every usable GPU runs processes: 0000:00:04.0"):
        run_check(ctx, proof_runtime.check_cuda_visibility)


def test_a_kit_confined_to_fewer_cpus_plans_inside_them(monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    first = min(os.sched_getaffinity(0))
    monkeypatch.setattr(proof_runtime.os, "sched_getaffinity", lambda pid: {first})
    numa = numa_facts.read_numa_facts(Reader("/sys", "/proc"))
    plan, placement = proof_runtime.plan_placement(
        numa, facts_with(stub_gpu_entry()), stub_gpu_entry(), "x", {}
    )
    assert placement["cpus"] == [first]
    assert first not in plan["reserved_cpus"]


def test_a_chatty_client_neither_stalls_nor_floods_the_evidence(kit_context, monkeypatch):
    monkeypatch.setenv("STUB_STDERR_KB", "256")  # four times a pipe's buffer
    ctx = kit_context()
    ctx.gpu_facts = facts_with(stub_gpu_entry())
    check = run_check(ctx, proof_runtime.check_cuda_visibility)
    assert check.status == "pass", [i.as_dict() for i in check.items if i.status != "pass"]
    assert len((ctx.out / "cuda-client.txt").read_text()) < 20000


def test_only_the_kits_own_mps_processes_are_counted(tmp_path):
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "theirs")}
    other = subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-server sleep 30"], env=env)
    try:
        deadline = time.monotonic() + 5
        while other.pid not in proof_runtime.mps_processes("/proc") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proof_runtime.mps_processes("/proc")[other.pid] == "nvidia-cuda-mps-server"
        assert other.pid in proof_runtime.mps_processes("/proc", str(tmp_path / "theirs"))
        assert proof_runtime.mps_processes("/proc", str(tmp_path / "ours")) == {}
    finally:
        other.kill()
        other.wait()


CONTROL = "/usr/bin/nvidia-cuda-mps-control"


@pytest.mark.parametrize(
    ("kind", "value", "allowed"),
    [
        ("ExecStart", f"{CONTROL} -d", True),
        ("ExecStop", f"/bin/sh -c 'echo quit | {CONTROL}'", True),
        (
            "ExecStartPost",
            f"/bin/sh -c 'echo set_default_active_thread_percentage 25 | {CONTROL}'",
            True,
        ),
        (
            "ExecStartPost",
            f"/bin/sh -c 'echo set_default_device_pinned_mem_limit 0 2048M | {CONTROL}'",
            True,
        ),
        ("ExecStartPost", "+/usr/bin/nvidia-smi -i 0000:00:04.0 -c EXCLUSIVE_PROCESS", False),
        ("ExecStartPost", f"/bin/sh -c 'echo quit | {CONTROL}; nvidia-smi -r'", False),
        (
            "ExecStartPost",
            "/bin/sh -c 'echo set_default_active_thread_percentage 25 | /tmp/x'",
            False,
        ),
        ("ExecStart", f"{CONTROL} -d -f", False),
    ],
)
def test_only_the_daemons_own_commands_are_run(kind, value, allowed):
    assert (proof_runtime.allowed_exec(value, CONTROL, kind) is not None) is allowed


def test_a_client_interrupted_while_starting_does_not_outlive_the_kit(kit_context, monkeypatch):
    def stopped(client, wait_s, wait_for):
        raise gpu_proof.Stopped("stopped by signal 15")

    monkeypatch.setattr(proof_runtime, "_read_events", stopped)
    launched = []
    popen = proof_runtime.subprocess.Popen

    def recording(*args, **kwargs):
        launched.append(popen(*args, **kwargs))
        return launched[-1]

    monkeypatch.setattr(proof_runtime.subprocess, "Popen", recording)
    ctx = kit_context()
    with pytest.raises(gpu_proof.Stopped):
        proof_runtime.start_client(ctx, "hold", dict(os.environ))
    assert launched[0].wait(timeout=10) == -9
