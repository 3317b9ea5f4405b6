"""Every holder of a GPU blocks destroying its MIG instances and changing its mode.

The procfs is a scratch copy of the synthetic-2x6338-4xa100 tree with the holders of
field_cases.gpu_holders_procfs added (NVIDIA/gpu-operator#118, NVIDIA/DCGM#95): fd links to
/dev/nvidia* that exist only as link targets, as the kernel's fd links are read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pynvml
import pytest

UNIT = Path(__file__).resolve().parents[3]
for _extra in (UNIT, UNIT / "fixtures"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

import fake_nvml as fake  # noqa: E402
import field_cases  # noqa: E402
import trees  # noqa: E402

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (  # noqa: E402
    mig,
    mig_holders,
    mig_nvml,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (  # noqa: E402
    MigError,
)

A100 = "synthetic-2x6338-4xa100"
BUS, ADDR = "00000000:17:00.0", "0000:17:00.0"
OTHER = "0000:31:00.0"
ON, OFF = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE
P = fake.A100_80GB_PROFILES
GPUS = {
    ADDR: ("NVIDIA A100 80GB PCIe", "GPU-0f6c4b1e-8c1d-4a55-9a0e-1b2c3d4e5f60", 0),
    OTHER: ("NVIDIA A100 80GB PCIe", "GPU-2a6c4b1e-8c1d-4a55-9a0e-1b2c3d4e5f61", 1),
}
EMBED = "numafleet-embed.service"


def _tree(tmp_path, holders=None) -> str:
    root = trees.materialize(A100, tmp_path / A100)
    field_cases.gpu_holders_procfs(f"{root}/proc", GPUS, holders)
    return root


def _gi(gi_id: int, name: str, start: int):
    profile = fake.profile_named(P, name)
    size = next(z for s, z in profile.placements if s == start)
    return fake.gpu_instance(BUS, gi_id, profile, start, size)


def _converge(nvml, root: str, layout, **kw):
    backend = mig_nvml.NvmlBackend(nvml)
    calls = []

    def runner(argv):
        calls.append(list(argv))
        return 0, "", ""

    host = mig.Host(runner=runner, procfs_root=f"{root}/proc", sysfs_root=f"{root}/sys",
                    exclude_pids=kw.pop("exclude_pids", ()))  # fmt: skip
    requests = mig.parse_request([{"gpu": ADDR, "mode": kw.pop("mode", "enabled"),
                                   "layout": layout}])  # fmt: skip
    try:
        return mig.converge(backend, requests, host, **kw), calls
    finally:
        backend.close()


# ---------------------------------------------------------------------------------------------
# Reading the holders


def test_fd_links_are_read_without_their_targets(tmp_path):
    root = _tree(tmp_path)
    link = Path(root) / "proc" / "4711" / "fd" / "5"
    assert os.readlink(link) == "/dev/nvidia0" and not link.exists()


def test_read_holders_maps_minors_units_and_daemons(tmp_path):
    root = _tree(tmp_path)
    assert mig_holders.read_gpu_minors(f"{root}/proc") == {ADDR: 0, OTHER: 1}
    found = {h.pid: h for h in mig_holders.read_holders(f"{root}/proc", f"{root}/sys")}
    assert sorted(found) == [1207, 2290, 3311, 4711]  # the shell on /dev/pts/0 holds nothing
    persistenced = found[1207]
    assert (persistenced.kind, persistenced.unit, persistenced.devices, persistenced.gpus) == (
        "daemon", "nvidia-persistenced.service", (), ())  # fmt: skip
    assert persistenced.holds(ADDR) and persistenced.holds(OTHER)
    exporter = found[3311]  # a container, not NVML-listed: nvidia-caps counts for every GPU
    assert exporter.kind == "process" and exporter.unit is None and exporter.gpus == ()
    embed = found[4711]
    assert embed.unit == EMBED and embed.gpus == ()  # /dev/nvidiactl and nvidia-uvm: every GPU
    assert embed.devices == ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl")
    assert embed.text() == (
        f"pid 4711 (text-embedding, {EMBED}: /dev/nvidia-uvm, /dev/nvidia0, /dev/nvidiactl)"
    )


def test_a_device_node_alone_holds_only_its_gpu(tmp_path):
    root = _tree(tmp_path, {900: ("python3", "/system.slice/a.service", ("/dev/nvidia1",))})
    (holder,) = mig_holders.read_holders(f"{root}/proc", f"{root}/sys")
    assert holder.gpus == (OTHER,) and not holder.holds(ADDR)
    # Without the driver's information files the minor is unknown: every GPU, to be safe.
    unknown = mig_holders.read_holders(f"{root}/proc", f"{root}/sys", minors={})
    assert unknown[0].gpus == ()


def test_own_process_and_nvidia_drm(tmp_path):
    root = _tree(tmp_path)
    (Path(root) / "sys" / "module" / "nvidia_drm").mkdir(parents=True)
    found = mig_holders.read_holders(f"{root}/proc", f"{root}/sys", exclude_pids=(4711,))
    assert 4711 not in [h.pid for h in found]
    assert found[-1].kind == "module" and found[-1].holds(ADDR)


def test_parse_device_minor():
    text = field_cases._NVIDIA_GPU_INFORMATION.format(
        model="A100", irq=1, uuid="GPU-1", address=ADDR, minor=3
    )
    assert mig_holders.parse_device_minor(text) == 3
    assert mig_holders.parse_device_minor("Device Minor: \t ?\n") is None


# ---------------------------------------------------------------------------------------------
# The MIG change


@pytest.mark.parametrize("check_mode", [True, False])
def test_destroying_an_instance_is_refused_while_foreign_holders_have_the_gpu(tmp_path, check_mode):
    """NVML lists no process; the fd scan and the daemons still block the destroy, also in
    check mode, and the message lists every foreign holder."""
    root = _tree(tmp_path)
    nvml = fake.FakeNvml([fake.FakeGpu(BUS, "NVIDIA A100 80GB PCIe", 81920, mig=(ON, ON),
                                       profiles=P, gpu_instances=(_gi(1, "3g.40gb", 0),))])  # fmt: skip
    with pytest.raises(MigError) as caught:
        _converge(nvml, root, [{"profile": "3g.40gb", "start": 4}], check_mode=check_mode,
                  owned_units=(EMBED,))  # fmt: skip
    text = str(caught.value)
    assert text.startswith(
        f"the MIG change is refused: GPU {ADDR} (destroying GPU instance(s) 1) is held by "
    )
    assert "pid 1207 (nvidia-persistenced, nvidia-persistenced.service)" in text
    assert "pid 2290 (nv-hostengine (DCGM), nvidia-dcgm.service: /dev/nvidia0" in text
    assert "pid 3311 (dcgm-exporter, not in a systemd service: /dev/nvidia-caps/nvidia-cap1" in text
    assert "4711" not in text  # an owned unit: stopped and started by the change, not a blocker
    assert len(nvml.gpus[0].gpu_instances) == 1  # nothing destroyed


def test_mode_change_is_refused_with_the_module_among_the_holders(tmp_path):
    root = _tree(tmp_path, {})
    (Path(root) / "sys" / "module" / "nvidia_drm").mkdir(parents=True)
    nvml = fake.FakeNvml([fake.FakeGpu(BUS, "NVIDIA A100 80GB PCIe", 81920, mig=(OFF, OFF),
                                       profiles=P, reset_needed=True)])  # fmt: skip
    with pytest.raises(MigError, match=r"\(a MIG mode change\) is held by the nvidia_drm"):
        _converge(nvml, root, [{"profile": "7g.80gb"}], check_mode=True)
    assert nvml.gpus[0].mig == (OFF, OFF)


def test_only_owned_holders_are_stopped_and_started_around_the_destroy(tmp_path):
    root = _tree(tmp_path, {4711: field_cases.GPU_HOLDERS[4711]})
    nvml = fake.FakeNvml([fake.FakeGpu(BUS, "NVIDIA A100 80GB PCIe", 81920, mig=(ON, ON),
                                       profiles=P, gpu_instances=(_gi(1, "3g.40gb", 0),))])  # fmt: skip
    check, dummy = _converge(nvml, root, [{"profile": "3g.40gb", "start": 4}], check_mode=True,
                             owned_units=(EMBED,))  # fmt: skip
    assert check.would_run[0] == f"systemctl stop {EMBED}"
    assert check.would_run[-1] == f"systemctl start {EMBED}"
    assert [h.pid for h in check.holders] == [4711]
    assert check.gpus[0].actions[-1] == (
        f"note: GPU {ADDR} is held by pid 4711 (text-embedding, {EMBED}: /dev/nvidia-uvm, "
        "/dev/nvidia0, /dev/nvidiactl); its unit is stopped and started around destroying GPU "
        "instance(s) 1"
    )
    assert not any(line.startswith("note:") for line in check.would_run)
    out, calls = _converge(nvml, root, [{"profile": "3g.40gb", "start": 4}], owned_units=(EMBED,))
    assert calls[0] == ["systemctl", "stop", EMBED] and calls[-1] == ["systemctl", "start", EMBED]
    assert [(g.profile_id, g.start) for g in nvml.gpus[0].gpu_instances] == [(9, 4)]


def test_creating_in_free_slices_is_not_blocked_and_holders_are_reported(tmp_path):
    root = _tree(tmp_path)
    nvml = fake.FakeNvml([fake.FakeGpu(BUS, "NVIDIA A100 80GB PCIe", 81920, mig=(ON, ON),
                                       profiles=P, gpu_instances=(_gi(1, "3g.40gb", 0),))])  # fmt: skip
    out, dummy = _converge(nvml, root, [{"profile": "3g.40gb", "start": 0},
                                        {"profile": "3g.40gb", "start": 4}])  # fmt: skip
    assert len(nvml.gpus[0].gpu_instances) == 2
    assert [h.pid for h in out.holders] == [1207, 2290, 3311, 4711]
    notes = [line for line in out.gpus[0].actions if line.startswith("note:")]
    assert len(notes) == 4 and all("does not disturb it" in line for line in notes)


def test_module_result_reports_holders_in_check_mode(tmp_path):
    root = _tree(tmp_path, {4711: field_cases.GPU_HOLDERS[4711]})
    nvml = fake.FakeNvml([fake.FakeGpu(BUS, "NVIDIA A100 80GB PCIe", 81920, mig=(ON, ON),
                                       profiles=P, gpu_instances=(_gi(1, "3g.40gb", 0),))])  # fmt: skip
    params = {
        "gpus": [{"gpu": ADDR, "layout": [{"profile": "3g.40gb", "start": 4}]}],
        "reset_ok": False,
        "owned_units": [EMBED],
        "backend": "nvml",
        "snapshot": None,
        "root": str(tmp_path / "root"),
        "state_path": mig.DEFAULT_STATE_PATH,
        "boot_program_path": mig.DEFAULT_BOOT_PROGRAM_PATH,
        "unit_dir": "/etc/systemd/system",
        "mig_parted_config": "",
        "service_manager": "systemd",
        "procfs_root": f"{root}/proc",
        "sysfs_root": f"{root}/sys",
    }
    result = mig_nvml.run(params, True, lambda argv: (0, "", ""), lambda name: name,
                          lambda: nvml)  # fmt: skip
    assert result["holders"] == [
        {
            "kind": "process",
            "pid": 4711,
            "comm": "text-embedding",
            "unit": EMBED,
            "devices": ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"],
            "gpus": [],
        }
    ]
    assert f"systemctl stop {EMBED}" in result["would_run"]
    assert len(nvml.gpus[0].gpu_instances) == 1  # check mode changed nothing
