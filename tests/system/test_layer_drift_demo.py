"""Every apply layer against the plan on a scratch demo fleet (render mode): drift and verify.

site.yml renders four hosts; drift_check.yml and verify.yml then find them clean, every layer
check passing or skipped with its reason. Four changes are then made to the recordings, one per
layer, and both playbooks run again:

* qemu-2node-01: node1's 2 MiB pool in the recorded sysfs raised above the plan with no free
  page (pages "in use": a shrink cannot take it back, the case that used to be called clean);
* epyc-nps4-01: /proc/sys/vm/zone_reclaim_mode in the recorded procfs changed;
* gpu-a100-01: one GPU instance (made by site.yml in the recording) removed from the GPU
  snapshot of its MIG GPU, and the recorded active thread percentage of one MPS daemon changed;
* gh200-01: untouched (control).

Each change must be drift on its host and layer in drift.json with the setting named, and fail
the named verify check (hugepage_pools, kernel_settings, mig_layout, mps_settings).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from system_helpers import REPO, Run, ansible_playbook, tree_digest

DRIFT = REPO / "playbooks" / "drift_check.yml"
VERIFY = REPO / "playbooks" / "verify.yml"
HOSTS = ("epyc-nps4-01", "gh200-01", "gpu-a100-01", "qemu-2node-01")
CONTROL = "gh200-01"
POOL = "sys/devices/system/node/node1/hugepages/hugepages-2048kB"
KNOB = "proc/sys/vm/zone_reclaim_mode"
MPS_RECORDING = "root/var/lib/numafleet/render/mps-daemons.json"
MIG_GPU = "0000:17:00.0"
LAYER_CHECKS = ("hugepage_pools", "kernel_settings", "mig_layout", "mps_settings", "irq_affinity")
VERIFY_FAIL_TASK = "Fail the host when a verify check failed"


@dataclass
class Fleet:
    base: Path
    site: Run
    clean_drift: Run
    clean_verify: Run
    drift: Run
    verify: Run
    digests: dict  # "edited", "after" -> {host: digest of .demo/<host>}
    mps_unit: str

    def report(self, name: str) -> dict:
        return json.loads((self.base / name / "latest" / "drift.json").read_text())

    def verify_report(self, name: str) -> dict:
        return json.loads((self.base / name / "verify.json").read_text())


def _drift(base: Path, inventory: Path, name: str) -> Run:
    env = {"NUMAFLEET_DRIFT_REPORT_DIR": str(base / name)}
    return ansible_playbook(DRIFT, inventory, "--limit", ",".join(HOSTS), env=env)


def _verify(base: Path, inventory: Path, name: str) -> Run:
    return ansible_playbook(
        VERIFY, inventory, "--limit", ",".join(HOSTS), "-e", f"numafleet_report_dir={base / name}"
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ansible_ready):
    import trees

    base = tmp_path_factory.mktemp("layers")
    inventory = base / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    trees.materialize_demo(base / ".demo")
    demo = base / ".demo"
    site = ansible_playbook(REPO / "site.yml", inventory, "--limit", ",".join(HOSTS))
    clean_drift = _drift(base, inventory, "drift-clean")
    clean_verify = _verify(base, inventory, "verify-clean")

    pool = demo / "qemu-2node-01" / POOL
    total = int((pool / "nr_hugepages").read_text())
    (pool / "nr_hugepages").write_text(f"{total * 2}\n")
    (pool / "free_hugepages").write_text("0\n")
    knob = demo / "epyc-nps4-01" / KNOB
    knob.write_text("1\n" if knob.read_text().strip() == "0" else "0\n")
    recording = demo / "gpu-a100-01" / MPS_RECORDING
    data = json.loads(recording.read_text())
    mps_unit = sorted(data["daemons"])[0]
    data["daemons"][mps_unit]["active_thread_percentage"] = 100
    recording.write_text(json.dumps(data))
    snapshot = demo / "gpu-a100-01" / "gpu-snapshot.json"
    data = json.loads(snapshot.read_text())
    (gpu,) = [g for g in data["gpus"] if g["address"] == MIG_GPU]
    # the 1g.10gb at slice 3 that site.yml created in the recording (render mode writes the
    # instances it makes into the snapshot) and no placement uses: no placement moves
    (made,) = [gi for gi in gpu["mig"]["gpu_instances"] if gi["placement_start"] == 3]
    assert made["rendered"] and made["profile_name"] == "1g.10gb", made
    gpu["mig"]["gpu_instances"] = [
        gi for gi in gpu["mig"]["gpu_instances"] if gi["placement_start"] != 3
    ]
    snapshot.write_text(json.dumps(data))

    edited = {host: tree_digest(demo / host) for host in HOSTS}
    drift = _drift(base, inventory, "drift-edited")
    verify = _verify(base, inventory, "verify-edited")
    after = {host: tree_digest(demo / host) for host in HOSTS}
    print(
        f"\nlayer checks: site.yml {site.seconds:.1f} s, drift {clean_drift.seconds:.1f} + "
        f"{drift.seconds:.1f} s, verify {clean_verify.seconds:.1f} + {verify.seconds:.1f} s"
    )
    return Fleet(
        base, site, clean_drift, clean_verify, drift, verify, {"edited": edited, "after": after},
        mps_unit,
    )  # fmt: skip


def test_site_then_a_clean_fleet_has_zero_drift_and_no_failed_layer_check(fleet):
    assert fleet.site.rc == 0, fleet.site.explain()
    assert fleet.clean_drift.rc == 0, fleet.clean_drift.explain()
    report = fleet.report("drift-clean")
    assert {h: e["status"] for h, e in report["hosts"].items()} == dict.fromkeys(HOSTS, "clean")
    assert report["totals"]["drift"] == 0 and report["totals"]["changes"] == 0
    assert fleet.clean_verify.rc == 0, fleet.clean_verify.explain()
    for host, entry in fleet.verify_report("verify-clean")["hosts"].items():
        layer = [c for c in entry["checks"] if c["check"] in LAYER_CHECKS]
        assert {c["check"] for c in layer} == set(LAYER_CHECKS), host
        assert all(c["status"] in ("pass", "skipped") for c in layer), (host, layer)
    a100 = fleet.verify_report("verify-clean")["hosts"]["gpu-a100-01"]["checks"]
    mps = [c for c in a100 if c["check"] == "mps_settings"]
    assert mps and all(c["status"] == "pass" for c in mps), mps  # read from the recording
    (mig,) = [c for c in a100 if c["check"] == "mig_layout"]
    # site.yml wrote the planned instances into the recording: the layout is as planned
    assert mig["status"] == "pass", mig


def test_checks_write_nothing(fleet):
    assert fleet.digests["after"] == fleet.digests["edited"]


def _drift_of(report: dict, host: str) -> dict:
    out: dict = {}
    for entry in report["hosts"][host]["drift"]:
        for change in entry["changes"]:
            out.setdefault(entry["role"], []).append(change)
    return out


def test_each_change_is_drift_on_its_host_and_layer_with_the_setting_named(fleet):
    assert fleet.drift.rc == 2, fleet.drift.explain()
    report = fleet.report("drift-edited")
    assert report["hosts"][CONTROL]["status"] == "clean"
    pools = _drift_of(report, "qemu-2node-01")
    assert list(pools) == ["hugepages"], pools
    assert "node1 2048kB" in pools["hugepages"][0]["settings"]
    knob = _drift_of(report, "epyc-nps4-01")
    assert list(knob) == ["numa_kernel"], knob
    assert knob["numa_kernel"][0]["settings"] == ["zone_reclaim_mode"]
    a100 = _drift_of(report, "gpu-a100-01")
    # The plan records every MIG device of the planned layout (plan.json, its device UUIDs), so
    # the missing instance shows there too, and nowhere else among the unit files.
    assert sorted(a100) == ["nvidia_mig", "nvidia_mps", "pinned_services"], a100
    assert [c["path_or_header"] for c in a100["pinned_services"]] == ["/etc/numafleet/plan.json"]
    assert a100["nvidia_mps"][0]["settings"] == ["active_thread_percentage"]
    assert a100["nvidia_mig"][0]["path_or_header"] == f"GPU {MIG_GPU}"
    assert a100["nvidia_mig"][0]["settings"] == [f"GPU {MIG_GPU} 1g.10gb@3"]
    for host in ("qemu-2node-01", "epyc-nps4-01", "gpu-a100-01"):
        # drift, not fail: the failed layer checks repeat the layer's drift
        assert report["hosts"][host]["status"] == "drift", report["hosts"][host]["summary"]
    assert report["totals"]["drift"] == 3 and report["totals"]["clean"] == 1


@pytest.mark.parametrize(
    ("host", "check", "words"),
    [
        ("qemu-2node-01", "hugepage_pools", ("node1 2048kB", "pages in use")),
        ("epyc-nps4-01", "kernel_settings", ("zone_reclaim_mode", "proc/sys/vm/zone_reclaim_mode")),
        ("gpu-a100-01", "mps_settings", ("active_thread_percentage 100 (planned 50)",)),
        ("gpu-a100-01", "mig_layout", (f"GPU {MIG_GPU}", "1g.10gb@3", "run site.yml")),
    ],
)
def test_verify_fails_the_named_check_on_that_host(fleet, host, check, words):
    assert fleet.verify.rc == 2, fleet.verify.explain()
    entry = fleet.verify_report("verify-edited")["hosts"][host]
    failed = [c for c in entry["checks"] if c["status"] == "fail"]
    named = [c for c in failed if c["check"] == check]
    assert named, failed
    text = " ".join(f"{c['subject']} {c['message']}" for c in named)
    for word in words:
        assert word in text, text
    fail = fleet.verify.one(host, VERIFY_FAIL_TASK)
    assert fail["status"] == "failed" and check in fail["msg"]
    assert fleet.verify.one(CONTROL, VERIFY_FAIL_TASK)["status"] == "skipped"
