"""The apply roles used alone, as their READMEs show: facts -> numa_plan -> one role or several.

Each role is one numafleet.tuning.host_apply task with only its layer: it writes its layer's files
(render mode on a scratch copy of the demo host gpu-a100-01), publishes its outputs as before
(pinned_services_result, hugepages_result, numa_kernel_result), and a second run changes nothing.
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from system_helpers import REPO, ansible_playbook, read_tree

HOST = "gpu-a100-01"
UNITS = "etc/systemd/system"


def _playbook(roles: list) -> list:
    plan = "{{ ansible_facts.numafleet_plan }}"
    return [
        {
            "name": "Apply some layers with their roles",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Gather NUMA and GPU topology",
                    "numafleet.tuning.numa_facts": {
                        "sysfs_root": "{{ numafleet_sysfs_root }}",
                        "procfs_root": "{{ numafleet_procfs_root }}",
                        "gpu": True,
                        "gpu_snapshot": "{{ numafleet_gpu_snapshot }}",
                    },
                },
                {
                    "name": "Plan placements",
                    "numafleet.tuning.numa_plan": {
                        "placements": "{{ numafleet_placements }}",
                        "tenants": "{{ numafleet_tenants | default([]) }}",
                        "reserved_cpus": "{{ numafleet_reserved_cpus | default('') }}",
                        "gpu_partitions": "{{ numafleet_gpu_partitions | default([]) }}",
                        "mig_gpus": "{{ numafleet_mig_gpus | default([]) }}",
                    },
                },
                *(
                    {
                        "name": f"Apply {role}",
                        "ansible.builtin.include_role": {"name": f"numafleet.tuning.{role}"},
                        "vars": {
                            f"{role}_plan": plan,
                            f"{role}_render_root": "{{ numafleet_render_root }}",
                            **(
                                {
                                    "hugepages_sysfs_root": "{{ numafleet_sysfs_root }}",
                                    "hugepages_procfs_root": "{{ numafleet_procfs_root }}",
                                    "hugepages_bootloader": "none",
                                }
                                if role == "hugepages"
                                else {}
                            ),
                        },
                    }
                    for role in roles
                ),
                {
                    "name": "Show the outputs",
                    "ansible.builtin.debug": {
                        "msg": {
                            "pinned": "{{ pinned_services_result | default(none) }}",
                            "hugepages": "{{ hugepages_result | default(none) }}",
                            "kernel": "{{ numa_kernel_result | default(none) }}",
                        }
                    },
                },
            ],
        }
    ]


@pytest.fixture
def demo(tmp_path, ansible_ready):
    import trees

    inventory = tmp_path / "inventories" / "demo"
    shutil.copytree(REPO / "inventories" / "demo", inventory)
    trees.materialize_demo(tmp_path / ".demo")
    return tmp_path, inventory


@pytest.mark.parametrize(
    "roles", [["pinned_services"], ["hugepages", "numa_kernel", "pinned_services"]]
)
def test_roles_alone_apply_their_layer_publish_their_outputs_and_are_idempotent(demo, roles):
    base, inventory = demo
    playbook = base / "roles.yml"
    playbook.write_text(yaml.safe_dump(_playbook(roles), sort_keys=False))
    first = ansible_playbook(playbook, inventory, "--limit", HOST)
    assert first.rc == 0, first.explain()
    applies = [r for r in first.results(HOST) if r["action"] == "numafleet.tuning.host_apply"]
    assert len(applies) == len(roles)
    layers = {"hugepages": "hugepages", "numa_kernel": "kernel", "pinned_services": "units"}
    assert [list(r["layers"]) for r in applies] == [[layers[role]] for role in roles]
    files = read_tree(base / ".demo" / HOST / "root")
    assert f"{UNITS}/numafleet-llm-70b.service" in files
    assert ("etc/systemd/system/numafleet-hugepages.service" in files) == ("hugepages" in roles)
    outputs = first.one(HOST, "Show the outputs")["msg"]
    assert outputs["pinned"]["changed"] is True
    assert any(f["path"].endswith("numafleet-llm-70b.service") for f in outputs["pinned"]["files"])
    assert (outputs["hugepages"] is not None) == ("hugepages" in roles)
    second = ansible_playbook(playbook, inventory, "--limit", HOST)
    assert second.rc == 0, second.explain()
    assert second.stats[HOST]["changed"] == 0, second.explain()
    assert read_tree(base / ".demo" / HOST / "root") == files
