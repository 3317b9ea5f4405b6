"""The roles' own checks fail with a message naming host, variable and fix, before any file."""

from __future__ import annotations

import yaml
from system_helpers import ansible_playbook, tree_digest

ROLE = "numafleet.tuning.pinned_services : "
# The role's one task checks every input on the controller before the module is sent; the
# message is that of the checks that failed.
CHECK_TASK = "Apply the pinned units and tenant slices"


def _plan(host):
    return {"version": 1, "host": host, "placements": [], "tenants": [], "nodes": [], "gpus": []}


CASES = {
    # host: (role vars, fragments of the message, failing task)
    "other-host-plan": (
        {"pinned_services_plan": _plan("gpu-a100-01")},
        ["host other-host-plan: pinned_services_plan is not this host's plan", "host gpu-a100-01"],
        CHECK_TASK,
    ),
    "not-a-plan": (
        {"pinned_services_plan": {"placements": "llm"}},
        ["host not-a-plan: pinned_services_plan is not this host's plan", "numafleet_plan"],
        CHECK_TASK,
    ),
    "relative-root": (
        {"pinned_services_plan": _plan("relative-root"), "pinned_services_render_root": "render"},
        [
            "host relative-root: pinned_services_render_root (numafleet_render_root in site.yml) "
            "is 'render'",
            "absolute directory",
        ],
        CHECK_TASK,
    ),
    "slash-root": (
        {"pinned_services_plan": _plan("slash-root"), "pinned_services_render_root": "//"},
        [
            "render mode needs an absolute directory other than /",
            "leave it unset (null)",
        ],
        CHECK_TASK,
    ),
    # A template that came out empty must not switch a review run to applying on the host.
    "empty-root": (
        {"pinned_services_plan": _plan("empty-root"), "pinned_services_render_root": ""},
        ["host empty-root: pinned_services_render_root", "is ''", "an empty string is refused"],
        CHECK_TASK,
    ),
    # Every check that fails is reported, each with its own message.
    "plan-and-root": (
        {"pinned_services_plan": _plan("gpu-a100-01"), "pinned_services_render_root": "render"},
        [
            "host plan-and-root: pinned_services_plan is not this host's plan",
            "host plan-and-root: pinned_services_render_root (numafleet_render_root in site.yml) "
            "is 'render'",
        ],
        CHECK_TASK,
    ),
}


def _write_local_inventory(path, hosts: dict) -> None:
    """An inventory of local-connection ``hosts`` ({name: host vars}) at ``path``."""
    path.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    },
                    "hosts": hosts,
                }
            }
        )
    )


def test_role_checks(tmp_path, ansible_ready):
    inventory = tmp_path / "inventory.yml"
    hosts = {}
    for host, case in CASES.items():
        hosts[host] = {f"case_{key}": value for key, value in case[0].items()}
    _write_local_inventory(inventory, hosts)
    playbook = tmp_path / "role.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Run the role with bad inputs",
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Apply pinned services",
                            "ansible.builtin.include_role": {
                                "name": "numafleet.tuning.pinned_services"
                            },
                            "vars": {
                                "pinned_services_plan": "{{ case_pinned_services_plan }}",
                                "pinned_services_render_root": (
                                    "{{ case_pinned_services_render_root | default(none) }}"
                                ),
                            },
                        }
                    ],
                }
            ],
            sort_keys=False,
        )
    )
    before = tree_digest(tmp_path)
    run = ansible_playbook(playbook, inventory)
    assert run.doc, run.explain()
    for host, (dummy, fragments, task) in CASES.items():
        result = run.results(host)[-1]
        assert result["task"] == ROLE + task and result["status"] == "failed", (host, result)
        for fragment in fragments:
            assert fragment in result["msg"], (host, fragment, result["msg"])
    assert tree_digest(tmp_path) == before


# hugepages: each bad list entry gets its own message, with its index (host: (role vars, fragments)).
HUGEPAGES_CASES = {
    "bad-boot-size": (
        {"hugepages_boot_reserve": ["1G", "3M"]},
        [
            'host bad-boot-size: hugepages_boot_reserve[1] is "3M"; give page sizes as 2M, 1G or a '
            "size in kB (e.g. [1G]).",
        ],
    ),
    "bad-mounts": (
        {
            "hugepages_mounts": [
                {"path": "/dev/hugepages1G", "size": "1G"},
                {"path": "/x", "size": "5G"},
            ]
        },
        [
            'host bad-mounts: hugepages_mounts[1] is {"path": "/x", "size": "5G"}; each entry needs '
            "path (an absolute mount point) and size",
            "e.g. {path: /dev/hugepages1G, size: 1G}.",
        ],
    ),
}


HUGEPAGES_VARS = (
    "hugepages_plan",
    "hugepages_render_root",
    "hugepages_sysfs_root",
    "hugepages_boot_reserve",
    "hugepages_mounts",
)


def test_hugepages_entry_checks(tmp_path, ansible_ready):
    hosts = {}
    for host, (role_vars, dummy) in HUGEPAGES_CASES.items():
        # Render mode on paths that do not exist: the checks fail before anything is read.
        case_vars = {
            "hugepages_plan": {"version": 1, "host": host, "nodes": []},
            "hugepages_render_root": str(tmp_path / host / "root"),
            "hugepages_sysfs_root": str(tmp_path / host / "sys"),
            "hugepages_boot_reserve": [],
            "hugepages_mounts": [],
            **role_vars,
        }
        hosts[host] = {"case_vars": case_vars}
    inventory = tmp_path / "inventory.yml"
    _write_local_inventory(inventory, hosts)
    playbook = tmp_path / "role.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Run the role with bad list entries",
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Apply hugepages",
                            "ansible.builtin.include_role": {"name": "numafleet.tuning.hugepages"},
                            "vars": {key: "{{ case_vars." + key + " }}" for key in HUGEPAGES_VARS},
                        }
                    ],
                }
            ],
            sort_keys=False,
        )
    )
    before = tree_digest(tmp_path)
    run = ansible_playbook(playbook, inventory)
    assert run.doc, run.explain()
    for host, (dummy, fragments) in HUGEPAGES_CASES.items():
        result = run.results(host)[-1]
        task = "numafleet.tuning.hugepages : Apply the hugepage pools"
        assert result["task"] == task and result["status"] == "failed", (host, result)
        for fragment in fragments:
            assert fragment in result["msg"], (host, fragment, result["msg"])
    assert tree_digest(tmp_path) == before
