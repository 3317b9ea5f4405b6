"""The role's own checks fail with a message naming host, variable and fix, before any file."""

from __future__ import annotations

import yaml
from system_helpers import ansible_playbook, tree_digest

ROLE = "numafleet.tuning.pinned_services : "


def _plan(host):
    return {"version": 1, "host": host, "placements": [], "tenants": [], "nodes": [], "gpus": []}


CASES = {
    # host: (role vars, fragments of the message, failing task)
    "other-host-plan": (
        {"pinned_services_plan": _plan("gpu-a100-01")},
        ["host other-host-plan: pinned_services_plan is not this host's plan", "host gpu-a100-01"],
        "Check that pinned_services_plan is this host's plan",
    ),
    "not-a-plan": (
        {"pinned_services_plan": {"placements": "llm"}},
        ["host not-a-plan: pinned_services_plan is not this host's plan", "numafleet_plan"],
        "Check that pinned_services_plan is this host's plan",
    ),
    "relative-root": (
        {"pinned_services_plan": _plan("relative-root"), "pinned_services_render_root": "render"},
        [
            "host relative-root: pinned_services_render_root (numafleet_render_root in site.yml) "
            "is 'render'",
            "absolute directory",
        ],
        "Check the render root",
    ),
    "slash-root": (
        {"pinned_services_plan": _plan("slash-root"), "pinned_services_render_root": "//"},
        [
            "render mode needs an absolute directory other than /",
            "leave it unset (null)",
        ],
        "Check the render root",
    ),
    # A template that came out empty must not switch a review run to applying on the host.
    "empty-root": (
        {"pinned_services_plan": _plan("empty-root"), "pinned_services_render_root": ""},
        ["host empty-root: pinned_services_render_root", "is ''", "an empty string is refused"],
        "Check the render root",
    ),
}


def test_role_checks(tmp_path, ansible_ready):
    inventory = tmp_path / "inventory.yml"
    hosts = {}
    for host, case in CASES.items():
        hosts[host] = {f"case_{key}": value for key, value in case[0].items()}
    inventory.write_text(
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
