"""The memory guard's preflight in the pinned units (ExecStartPre=numafleet-guard preflight): the
line per mode, in services and drop-ins, read back by systemd's rules, and a change of that line
alone restarts nothing (units.plan_actions on texts, changes.change_plan on digests)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from synthetic_hosts import synthetic

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.changes import change_plan
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import UnitRenderError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.planner import plan_host
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.recorded import (
    MANIFEST_PATHS,
    digest,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import systemd_syntax as sd

NUMA = synthetic(cpus_per_node=(8, 8), mem_gb=(32, 32))
SERVICES = [
    {"name": "web", "exec": "/bin/app", "cpus": 2, "memory": "1G"},
    {"name": "batch", "exec": "/bin/app", "cpus": 2, "memory": "1G", "priority": "low"},
]
UNIT = "/etc/systemd/system/numafleet-web.service"


def plan(services=None) -> dict:
    services = SERVICES if services is None else services
    return plan_host(
        "h",
        copy.deepcopy(NUMA),
        {"gpus": []},
        copy.deepcopy(services),
        [],
        {"reserved_cpus": "", "memory_headroom_pct": 10},
    )


def render(the_plan: dict, preflight: str) -> dict:
    return units.render_files(
        the_plan, units.DEFAULT_HEADER, True, units.DEFAULT_UNIT_DIR, preflight
    )


def service_values(text: str, key: str) -> list:
    return sd.lookup(sd.parse_unit(text), "Service", key)


def test_each_mode_writes_its_line_before_exec_start():
    the_plan = plan()
    enforce = render(the_plan, "enforce")[UNIT]
    warn = render(the_plan, "warn")[UNIT]
    off = render(the_plan, "off")[UNIT]
    assert service_values(enforce, "ExecStartPre") == [
        "/usr/local/sbin/numafleet-guard preflight --mode enforce web"
    ]
    # "-": neither a failed check nor a missing program stops the start.
    assert service_values(warn, "ExecStartPre") == [
        "-/usr/local/sbin/numafleet-guard preflight --mode warn web"
    ]
    assert service_values(off, "ExecStartPre") == []
    lines = enforce.splitlines()
    assert lines.index("Type=simple") + 1 == next(
        i for i, line in enumerate(lines) if line.startswith("ExecStartPre=")
    )
    assert lines[lines.index("Type=simple") + 2].startswith("ExecStart=")
    prefixes, argv = sd.exec_command(service_values(warn, "ExecStartPre")[0])
    assert prefixes == "-"
    assert argv == ["/usr/local/sbin/numafleet-guard", "preflight", "--mode", "warn", "web"]
    # The function's own default is off (callers pass the option; the modules default to warn).
    assert units.render_files(the_plan) == render(the_plan, "off")


def test_a_drop_in_gets_the_line_without_resetting_the_vendor_ones():
    the_plan = plan()
    entry = the_plan["placements"][0]
    entry["unit_kind"], entry["unit"] = "dropin", "vendor.service"
    path = "/etc/systemd/system/vendor.service.d/" + units.DROPIN_NAME
    text = render(the_plan, "enforce")[path]
    # Appended to the vendor's ExecStartPre= list: no empty assignment resets it.
    assert service_values(text, "ExecStartPre") == [
        "/usr/local/sbin/numafleet-guard preflight --mode enforce web"
    ]


def test_a_name_with_unusual_characters_is_quoted():
    entry = {"name": "a b%", "unit_kind": "service"}
    ((key, value),) = units.preflight_entries(entry, "p", "enforce")
    assert key == "ExecStartPre"
    dummy, argv = sd.exec_command(value)
    assert argv[-1] == "a b%"


@pytest.mark.parametrize("mode", ["", "Warn", None, "always"])
def test_an_unknown_mode_is_refused(mode):
    with pytest.raises(UnitRenderError, match="preflight is .*; use one of enforce, warn, off"):
        render(plan(), mode)


def test_preflight_only_sees_nothing_but_the_line():
    the_plan = plan()
    warn, enforce, off = (render(the_plan, mode)[UNIT] for mode in ("warn", "enforce", "off"))
    assert units.preflight_only(off, warn) and units.preflight_only(warn, enforce)
    assert units.preflight_only(enforce, off)
    assert not units.preflight_only(warn, warn)
    assert not units.preflight_only(None, warn)
    other = warn.replace("CPUAffinity=", "CPUAffinity=7 ", 1)
    assert not units.preflight_only(off, other)


def _changes(before: dict, after: dict) -> list:
    return units.plan_changes(before, after, list(before))


def test_plan_actions_rewrites_without_restarting():
    the_plan = plan()
    before, after = render(the_plan, "off"), render(the_plan, "warn")
    actions = units.plan_actions(_changes(before, after))
    assert actions.restart == () and actions.try_restart == () and actions.start == ()
    assert actions.rewritten == ("numafleet-batch.service", "numafleet-web.service")
    assert actions.reload_needed
    assert actions.would_run() == ["systemctl daemon-reload"]
    # A change of anything else as well still restarts.
    edited = dict(after)
    edited[UNIT] = after[UNIT].replace("Restart=on-failure", "Restart=always")
    actions = units.plan_actions(_changes(before, edited))
    assert actions.restart == ("numafleet-web.service",)
    assert actions.rewritten == ("numafleet-batch.service",)


def _recorded(files: dict) -> dict:
    recorded = {path: digest(text) for path, text in files.items()}
    recorded.update(dict.fromkeys(MANIFEST_PATHS, "manifest"))
    return recorded


def test_the_change_plan_says_rewritten_and_restarts_nothing():
    the_plan = plan()
    before = render(the_plan, "off")  # an apply before the preflight existed
    after = render(the_plan, "warn")

    def variants():
        return [render(the_plan, mode) for mode in units.PREFLIGHT_MODES if mode != "warn"]

    result = change_plan(
        "h", the_plan, the_plan, after, {}, _recorded(before), preflight_variants=variants
    )
    assert result["units"]["restart"] == [] and result["units"]["start"] == []
    assert result["units"]["rewritten"] == ["numafleet-batch.service", "numafleet-web.service"]
    assert result["changed"]
    assert (
        "  rewritten; ExecStartPre= (preflight) takes effect at its next start: "
        "numafleet-batch.service, numafleet-web.service"
    ) in result["lines"]
    assert "2 rewritten for the preflight" in result["summary"]
    # Without the variants the digests cannot tell: the units would restart.
    blind = change_plan("h", the_plan, the_plan, after, {}, _recorded(before))
    assert blind["units"]["restart"] == ["numafleet-batch.service", "numafleet-web.service"]
    # Nothing changed: the variants are never rendered.
    calls = []
    same = change_plan(
        "h",
        the_plan,
        the_plan,
        after,
        {},
        _recorded(after),
        preflight_variants=lambda: calls.append(1) or [],
    )
    assert not same["changed"] and calls == []
