"""The QEMU test bed's own logic (tests/vm): guest shape, image key, stopping only its own PID,
and the test workload. Booting the guest is layer 4 (`make vm`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

VM = Path(__file__).resolve().parents[1] / "vm"
sys.path.insert(0, str(VM))

import numa_vm  # noqa: E402


def _option(argv: list, flag: str) -> list:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


@pytest.fixture
def argv(tmp_path):
    return numa_vm.qemu_argv(tmp_path / "image", tmp_path / "state", 40022, "tcg", "hugepages=1:32")


def test_guest_has_two_numa_nodes_of_two_cpus(argv):
    assert _option(argv, "-smp") == ["4,sockets=2,cores=2,threads=1"]
    assert "node,nodeid=0,cpus=0-1,memdev=m0" in _option(argv, "-numa")
    assert "node,nodeid=1,cpus=2-3,memdev=m1" in _option(argv, "-numa")
    assert set(_option(argv, "-object")) == {
        "memory-backend-ram,id=m0,size=2G",
        "memory-backend-ram,id=m1,size=2G",
    }


def test_nvme_sits_behind_the_node_1_expander_bridge(argv):
    devices = _option(argv, "-device")
    assert "pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0" in devices
    assert "pcie-root-port,id=rp1,bus=pxb1,chassis=1,slot=1" in devices
    assert any(d.startswith("nvme,") and d.endswith(",bus=rp1") for d in devices)
    assert (
        numa_vm.NVME_ADDRESS == "0000:81:00.0"
    )  # bus_nr 128 = 0x80: root port 80:00.0, NVMe 81:00.0


def test_ssh_is_forwarded_from_loopback_only_and_the_disk_is_a_snapshot(argv):
    (netdev,) = _option(argv, "-netdev")
    assert "hostfwd=tcp:127.0.0.1:40022-:22" in netdev
    (drive,) = _option(argv, "-drive")
    assert "snapshot=on" in drive
    assert _option(argv, "-accel") == ["tcg"]
    assert _option(argv, "-cpu") == ["max"]
    (append,) = _option(argv, "-append")
    assert append.endswith(" hugepages=1:32")


def test_kvm_uses_the_host_cpu(tmp_path):
    argv = numa_vm.qemu_argv(tmp_path, tmp_path, 1, "kvm", "")
    assert _option(argv, "-accel") == ["kvm"]
    assert _option(argv, "-cpu") == ["host"]


def test_image_key_follows_the_recipe_only(monkeypatch):
    before = numa_vm.recipe_hash()
    monkeypatch.setattr(numa_vm, "BOOT_TIMEOUT_S", 1)  # boot settings do not rebuild
    assert numa_vm.recipe_hash() == before
    monkeypatch.setattr(numa_vm, "GUEST_PACKAGES", (*numa_vm.GUEST_PACKAGES, "hwloc"))
    assert numa_vm.recipe_hash() != before


def test_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMAFLEET_VM_CACHE", str(tmp_path))
    assert numa_vm.image_dir().parent == tmp_path
    monkeypatch.delenv("NUMAFLEET_VM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert numa_vm.image_dir().parent == tmp_path / "xdg" / "numafleet" / "vm"


def test_a_bad_accel_choice_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMAFLEET_VM_ACCEL", "hvf")
    with pytest.raises(numa_vm.VmError, match="NUMAFLEET_VM_ACCEL is 'hvf'; use tcg or kvm"):
        numa_vm.choose_accel(tmp_path)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_stop_leaves_a_process_whose_start_time_differs(sleeper):
    vm = {"pid": sleeper.pid, "start_ticks": "1"}  # same PID, another process's start time
    assert numa_vm._stop(vm) is False
    assert sleeper.poll() is None


def test_stop_ends_the_recorded_process(sleeper):
    vm = {"pid": sleeper.pid, "start_ticks": numa_vm._start_ticks(sleeper.pid)}
    assert numa_vm._stop(vm) is True
    assert sleeper.wait(timeout=10) == -15


def test_down_without_a_guest_changes_nothing(tmp_path, capsys):
    assert numa_vm.main(["down", "--state", str(tmp_path)]) == 0
    assert "nothing to stop" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_ssh_without_a_guest_says_run_up_first(tmp_path, capsys):
    assert numa_vm.main(["ssh", "--state", str(tmp_path), "--", "true"]) == 1
    assert "no guest recorded" in capsys.readouterr().err


def _workload(*args):
    return subprocess.Popen(
        [sys.executable, str(VM / "workload" / "numafleet_touch.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_workload_touches_its_memory_then_idles():
    proc = _workload("--anon-mib", "8")
    try:
        line = proc.stdout.readline()
        assert line == "touched: anon_kb=8192 hugetlb_kb=0\n"
        time.sleep(0.2)
        assert proc.poll() is None  # idles until stopped
        with open(f"/proc/{proc.pid}/status") as status:
            rss_kb = next(int(x.split()[1]) for x in status if x.startswith("RssAnon:"))
        assert rss_kb >= 8192
    finally:
        proc.terminate()
        proc.wait()


def test_workload_without_free_hugepages_exits_2():
    free = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
    if free.exists() and int(free.read_text()) >= 4096:
        pytest.skip("this host has free 2 MiB hugepages")
    proc = _workload("--anon-mib", "0", "--hugepages", "4096")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "cannot map 4096 hugepages" in err
    assert out == ""


@pytest.mark.parametrize(
    ("line", "action"),
    [
        (
            "INFO     \x1b[32mnuma_vm\x1b[0m ➜ \x1b[33mconverge\x1b[0m: \x1b[36mExecuting\x1b[0m\n",
            "converge",
        ),
        ("INFO     [numa_vm > idempotence] Executing\n", "idempotence"),
        ("INFO     [numa_vm > verify] Executing Testinfra tests found in /x/tests/...\n", None),
        ("numa_vm ➜ create: Executed: Successful\n", None),
    ],
)
def test_scenario_timer_sees_molecule_actions(line, action):
    import run_scenario

    match = run_scenario._ACTION.search(run_scenario._ANSI.sub("", line))
    assert (match.group(1) or match.group(2) if match else None) == action


def test_workload_grows_and_shrinks_to_the_grow_file(tmp_path):
    target = tmp_path / "target.mib"
    proc = _workload("--anon-mib", "8", "--grow-file", str(target))
    try:
        assert proc.stdout.readline() == "touched: anon_kb=8192 hugetlb_kb=0\n"
        target.write_text("56\n")  # 8 MiB at start + three 16 MiB chunks
        assert proc.stdout.readline() == "grown: anon_kb=57344\n"
        with open(f"/proc/{proc.pid}/status") as status:
            rss_kb = next(int(x.split()[1]) for x in status if x.startswith("RssAnon:"))
        assert rss_kb >= 57344
        target.write_text("24\n")
        assert proc.stdout.readline() == "grown: anon_kb=24576\n"
    finally:
        proc.terminate()
        proc.wait()


def test_workload_takes_a_lower_target_at_once_on_sigusr1(tmp_path):
    target = tmp_path / "target.mib"
    proc = _workload("--anon-mib", "8", "--grow-file", str(target))
    try:
        assert proc.stdout.readline() == "touched: anon_kb=8192 hugetlb_kb=0\n"
        target.write_text("40\n")
        assert proc.stdout.readline() == "grown: anon_kb=40960\n"
        target.write_text("8\n")
        proc.send_signal(signal.SIGUSR1)
        assert proc.stdout.readline() == "grown: anon_kb=8192\n"
        assert proc.poll() is None  # the signal only makes it look again
    finally:
        proc.terminate()
        proc.wait()
