"""verify.layer_checks: host_apply's check-mode layer results -> one named check per layer."""

from __future__ import annotations

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import layers, verify
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import VerifyError

M2 = 2048


def by_check(checks):
    out = {}
    for check in checks:
        out.setdefault(check.check, []).append(check)
    return out


def pool(node, before, desired, in_use=0):
    return {"node": node, "size_kb": M2, "before": before, "after": max(desired, in_use),
            "desired": desired, "in_use": in_use, "boot": False}  # fmt: skip


def setting(name, before, after, source="/proc/sys/kernel/numa_balancing"):
    return {"name": name, "before": before, "after": after, "source": source, "file": None,
            "changed": before != after}  # fmt: skip


CLEAN = {
    "hugepages": {"pools": [pool(0, 4096, 4096), pool(1, 0, 0)], "drift": []},
    "kernel": {
        "settings": [
            setting("numa_balancing", 0, 0),
            setting("irq_affinity[42]", "0-3", "0-3", "/proc/irq/42/smp_affinity_list"),
        ]
    },
    "mig": {
        "gpus": [{"address": "0000:17:00.0", "layout": [{"profile": "3g.40gb", "start": 4}]}],
        "drift": [],
    },  # fmt: skip
    "mps": {
        "daemons": [{"unit": "nvidia-mps@a.service"}],
        "settings": [
            {
                "unit": "nvidia-mps@a.service",
                "active_thread_percentage": {"planned": 50, "running": 50},
                "pinned_memory_limit_mib": {"planned": 8192, "running": 8192},
            }
        ],
    },
}


def test_a_clean_host_passes_every_layer_check():
    checks = by_check(verify.layer_checks("h", CLEAN))
    assert sorted(checks) == sorted(verify.LAYER_CHECKS)
    assert {c.status for group in checks.values() for c in group} == {"pass"}
    assert [c.subject for c in checks["hugepage_pools"]] == ["node0 2048kB", "node1 2048kB"]
    assert [c.subject for c in checks["irq_affinity"]] == ["irq 42"]
    assert [c.subject for c in checks["kernel_settings"]] == ["numa_balancing"]


def test_each_difference_fails_its_check_naming_the_setting():
    held = "8192 pages in use (nr_hugepages - free_hugepages): a shrink stops at 8192"
    states = {
        "hugepages": {
            "pools": [pool(0, 8192, 4096, in_use=8192)],
            "drift": [
                {
                    "setting": "node0 2048kB pages",
                    "planned": 4096,
                    "actual": 8192,
                    "reason": held,
                    "pending": False,
                }
            ],  # fmt: skip
        },
        "kernel": {
            "settings": [
                setting("numa_balancing", 1, 0),
                setting("irq_affinity[42]", "0-63", "0-3", "/proc/irq/42/smp_affinity_list"),
            ]
        },
        "mig": {
            "gpus": CLEAN["mig"]["gpus"],
            "drift": [
                {
                    "setting": "GPU 0000:17:00.0 MIG layout",
                    "planned": "mode enabled; 3g.40gb@4",
                    "actual": "mode enabled; 7g.80gb@0",
                    "reason": "",
                    "pending": False,
                }
            ],  # fmt: skip
        },
        "mps": {
            "daemons": CLEAN["mps"]["daemons"],
            "settings": [
                {
                    "unit": "nvidia-mps@a.service",
                    "active_thread_percentage": {"planned": 50, "running": 100},
                    "pinned_memory_limit_mib": {"planned": 8192, "running": 8192},
                }
            ],
        },
    }
    checks = by_check(verify.layer_checks("h", states))
    assert {name: [c.status for c in group] for name, group in checks.items()} == {
        "hugepage_pools": ["fail"],
        "kernel_settings": ["fail"],
        "mig_layout": ["fail"],
        "mps_settings": ["fail"],
        "irq_affinity": ["fail"],
    }
    pools = checks["hugepage_pools"][0]
    assert (pools.measured, pools.target) == (8192, 4096) and held in pools.message
    assert "numa_balancing is 1" in checks["kernel_settings"][0].message
    assert "/proc/sys/kernel/numa_balancing" in checks["kernel_settings"][0].message
    assert "7g.80gb@0" in checks["mig_layout"][0].message
    assert "active_thread_percentage 100 (planned 50)" in checks["mps_settings"][0].message
    assert "'0-63'" in checks["irq_affinity"][0].message


def test_layers_that_do_not_apply_are_skipped_with_the_reason():
    states = {
        "hugepages": {"pools": []},
        "kernel": {"settings": [setting("numa_balancing", 0, 0)]},
        "mig": {"gpus": []},
        "mps": {"daemons": []},
    }
    checks = by_check(verify.layer_checks("h", states))
    assert checks["irq_affinity"][0].status == "skipped"
    assert "IRQ pinning is off" in checks["irq_affinity"][0].message
    assert "no MIG GPU" in checks["mig_layout"][0].message
    assert "no MPS daemon" in checks["mps_settings"][0].message
    assert checks["hugepage_pools"][0].status == "skipped"
    # a layer host_apply did not run is skipped, never passed
    alone = by_check(verify.layer_checks("h", {"units": {}}))
    assert {c.status for group in alone.values() for c in group} == {"skipped"}


def test_render_mode_mig_layout_the_snapshot_cannot_show_is_skipped_not_passed():
    states = {
        "mig": {
            "gpus": CLEAN["mig"]["gpus"],
            "drift": [
                {
                    "setting": "GPU 0000:17:00.0 MIG layout",
                    "planned": "mode enabled; 3g.40gb@4",
                    "actual": "mode enabled; 2g.20gb@0",
                    "reason": "render mode: read-only",
                    "pending": True,
                }
            ],  # fmt: skip
        },
        "mps": {"daemons": CLEAN["mps"]["daemons"], "settings": []},
    }
    checks = by_check(verify.layer_checks("h", states, render_mode=True))
    assert checks["mig_layout"][0].status == "skipped"
    assert "2g.20gb@0" in checks["mig_layout"][0].message
    assert checks["mps_settings"][0].status == "skipped"
    assert "render mode" in checks["mps_settings"][0].message


def test_layer_states_must_be_a_mapping():
    with pytest.raises(VerifyError, match="layer_states is list"):
        verify.layer_checks("h", [])


# --- the layers' drift lists -------------------------------------------------------------------


def test_mig_drift_compares_mode_and_instances_by_profile_and_start():
    result = {
        "diff": [
            {
                "before_header": "GPU 0000:17:00.0",
                "before": "mode enabled\n3g.40gb@4 (GI 1, CI 0 3g.40gb)\n2g.20gb@0 (GI 3, CI 0 "
                "2g.20gb)\n2g.20gb@2 (GI 5, CI 0 2g.20gb)\n",
                "after": "mode enabled\n3g.40gb@4 (GI 1, CI 0 3g.40gb)\n2g.20gb@0 (GI 3, CI 0 "
                "2g.20gb)\n1g.10gb@2 (GI ?, CI 0 1g.10gb)\n1g.10gb@3 (GI ?, CI 0 1g.10gb)\n",
            },
            {"before_header": "/etc/numafleet/mig.json", "before": "", "after": "{}"},
        ]
    }
    assert layers.mig_drift(result, render=False) == [
        {
            "setting": "GPU 0000:17:00.0 MIG layout",
            "planned": "mode enabled; 1g.10gb@2, 1g.10gb@3, 2g.20gb@0, 3g.40gb@4",
            "actual": "mode enabled; 2g.20gb@0, 2g.20gb@2, 3g.40gb@4",
            "reason": "",
            "pending": False,
        }
    ]
    # Render mode writes its changes into the snapshot, so a difference is drift there too;
    # only a mode change waiting for a GPU reset is pending.
    assert layers.mig_drift(result, render=True)[0]["pending"] is False
    waiting = dict(result, gpus=[{"address": "0000:17:00.0", "reset_required": True}])
    (entry,) = layers.mig_drift(waiting, render=True)
    assert entry["pending"] is True
    assert entry["reason"].startswith("the MIG mode change is pending until the GPU is reset")


def test_mps_drift_names_the_daemon_and_the_setting():
    entries = [
        {
            "unit": "nvidia-mps@a.service",
            "active_thread_percentage": {"planned": 50, "running": 30},
            "pinned_memory_limit_mib": {"planned": 8192, "running": None},
        }
    ]
    assert layers.mps_drift(entries) == [
        {
            "setting": "nvidia-mps@a.service active_thread_percentage",
            "planned": 50,
            "actual": 30,
            "reason": "",
            "pending": False,
        }
    ]


def test_mig_drift_fails_the_mig_layout_check():
    drift = {"setting": "GPU 0000:17:00.0 MIG layout", "planned": "mode enabled; 3g.40gb@4",
             "actual": "mode enabled; no instances", "reason": "", "pending": False}  # fmt: skip
    check = verify.layer_checks("h", {"mig": {"gpus": [{"address": "0000:17:00.0"}],
                                              "drift": [drift]}})  # fmt: skip
    assert [(c.check, c.status) for c in check if c.check == "mig_layout"] == [
        ("mig_layout", "fail")
    ]
