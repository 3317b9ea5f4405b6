"""The plan corpus: every planner input of the unit tests and of the demo fleet, and its plan.

A refactor of the planner must not change any plan. This tool records the corpus once:

    .venv/bin/python tests/unit/plan_corpus.py capture   # inputs + digests (after a wanted change)
    .venv/bin/python tests/unit/plan_corpus.py digests   # digests only, from the stored inputs
    .venv/bin/python tests/unit/plan_corpus.py check     # compare, print what differs

``capture`` runs the unit tests that plan (CAPTURE_TESTS) with plan_host wrapped, keeps every
distinct input (arguments as JSON), adds the demo fleet (each host of inventories/demo with its
host_vars and its fixture tree, fixtures/trees.py) and the bad-input cases (tests/bad_inputs/,
each on its demo host's tree), and writes
``fixtures/plan_corpus/inputs.json.gz``. ``digests`` replays each input and writes
``fixtures/plan_corpus/digests.json``: per input the sha256 of the plan as JSON with sorted
keys, or for a refusal the exception's type and message verbatim. test_plan_corpus.py replays
the inputs and compares with the stored digests. A wanted change of plans: run ``digests`` and
commit the new file with the change that explains it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]
CORPUS = UNIT / "fixtures" / "plan_corpus"
INPUTS = CORPUS / "inputs.json.gz"
DIGESTS = CORPUS / "digests.json"
for _extra in (UNIT, UNIT / "fixtures", REPO / ".collections"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

# The unit tests whose planner calls make the corpus (relative to tests/unit).
CAPTURE_TESTS = (
    "plugins/module_utils/numa/test_planner.py",
    "plugins/module_utils/numa/test_planner_fast_paths.py",  # before issue 24
    "plugins/module_utils/numa/test_planner_groups.py",
    "plugins/module_utils/numa/test_planner_memnodes.py",
    "plugins/module_utils/numa/test_planner_properties.py",
    "plugins/module_utils/numa/test_planner_stable.py",
    "plugins/module_utils/numa/test_sysfs_lies.py",
    "plugins/module_utils/numa/test_allowed.py",
    "plugins/module_utils/numa/test_allowed_refusals.py",
    "plugins/module_utils/numa/test_field_cases_topo.py",
    "plugins/module_utils/numa/test_partition.py",
    "plugins/module_utils/numa/test_mig_pending.py",
    "plugins/module_utils/numa/test_gpu_nvml_locality.py",
    "plugins/module_utils/numa/test_limits.py",
    "plugins/module_utils/numa/test_changes.py",
    "plugins/module_utils/numa/test_mps.py",
    "plugins/module_utils/numa/test_plan_amd.py",  # AMD Instinct partitions (issue 24)
    "plugins/module_utils/numa/test_verify_layers.py",
    "plugins/action/test_numa_plan.py",
    "plugins/action/test_host_apply.py",
    "plugins/modules/test_host_apply.py",
    "gpu_kit/test_recorded_runs.py",
)
ARGS = (
    "host",
    "numa",
    "gpu_topology",
    "placements",
    "tenants",
    "policy",
    "hugepages_extra",
    "mig_gpus",
    "recorded",
    "recorded_daemons",
)


def _planner():
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import planner

    return planner


def _key(call: dict) -> str:
    return hashlib.sha256(json.dumps(call, sort_keys=True).encode()).hexdigest()


def outcome(call: dict) -> dict:
    """{"plan": sha256} of the plan of ``call``, or {"refused": type, "message": text}."""
    planner = _planner()
    args = json.loads(json.dumps(call))  # a fresh copy: the planner must not see another's
    try:
        plan = planner.plan_host(**args)
    except Exception as exc:
        return {"refused": type(exc).__name__, "message": str(exc)}
    text = json.dumps(plan, sort_keys=True)
    return {"plan": hashlib.sha256(text.encode()).hexdigest()}


class _Recorder:
    """pytest plugin: plan_host wrapped before the tests import it; each call's arguments kept."""

    def __init__(self) -> None:
        self.calls: dict = {}
        self.skipped = 0

    def pytest_configure(self, config) -> None:
        planner = _planner()
        real = planner.plan_host
        recorder = self

        def plan_host(*args, **kwargs):
            call = dict(zip(ARGS, args, strict=False))
            call.update(kwargs)
            try:
                text = json.dumps(call, sort_keys=True)
            except (TypeError, ValueError):
                recorder.skipped += 1
            else:
                recorder.calls.setdefault(_key(call), json.loads(text))
            return real(*args, **kwargs)

        planner.plan_host = plan_host


def _facts(fsroot: str) -> dict:
    """numa_facts' facts (numa, gpu_topology) of a fixture tree, its GPU snapshot replayed."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import facts

    snapshot = Path(fsroot) / "gpu-snapshot.json"
    gathered, dummy = facts.gather_facts(
        {
            "sysfs_root": f"{fsroot}/sys",
            "procfs_root": f"{fsroot}/proc",
            "gpu": True,
            "gpu_snapshot": str(snapshot) if snapshot.is_file() else None,
            "nvidia_smi": "never",
            "nvidia_smi_timeout": 30,
        },
        True,
        None,
        lambda name: None,
        lambda: (None, "not used"),
    )
    return gathered


def _call(host: str, gathered: dict, variables: dict, fsroot: str):
    """The plan_host call numa_plan makes for ``variables`` (host_vars) on facts ``gathered``;
    None when the variables are not even the right shape for the planner's inputs."""
    from ansible_collections.numafleet.tuning.plugins.plugin_utils._plan_inputs import (
        replan_inputs,
    )

    try:
        inputs = replan_inputs(variables, gathered)
    except Exception:  # refused before the planner (host_vars_check's part)
        return None
    call = {
        "host": host,
        "numa": inputs["numa"],
        "gpu_topology": gathered.get("gpu_topology") or {},
        "placements": inputs["placements"],
        "tenants": inputs["tenants"],
        "policy": inputs["policy"],
        "hugepages_extra": inputs["hugepages_extra"],
        "mig_gpus": inputs["mig_gpus"],
    }
    try:
        text = json.dumps(call, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return json.loads(text.replace(fsroot, "FSROOT"))


def _demo_calls() -> list:
    """plan_host calls of the demo fleet (each host: its fixture tree's facts, its host_vars)
    and of the bad-input cases (tests/bad_inputs/*.yml: a demo host's facts, the case's
    host_vars), as numa_plan makes them."""
    import trees
    import yaml

    calls = []
    with tempfile.TemporaryDirectory() as scratch:
        roots = trees.materialize_demo(scratch)
        gathered = {host: _facts(fsroot) for host, fsroot in roots.items()}
        for host, fsroot in sorted(roots.items()):
            path = REPO / "inventories" / "demo" / "host_vars" / f"{host}.yml"
            variables = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}
            call = _call(host, gathered[host], variables, fsroot)
            if call is not None:
                calls.append(call)
        for path in sorted((REPO / "tests" / "bad_inputs").glob("*.yml")):
            case = yaml.safe_load(path.read_text())
            machine = case["machine"]
            host = "bad-" + path.stem.replace("_", "-")
            call = _call(host, gathered[machine], case.get("host_vars") or {}, roots[machine])
            if call is not None:
                calls.append(call)
    return calls


def capture() -> list:
    import pytest

    recorder = _Recorder()
    # A test file missing here (renamed since) is left out: the corpus is what the tests plan.
    paths = [str(UNIT / test) for test in CAPTURE_TESTS if (UNIT / test).is_file()]
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", *paths], plugins=[recorder])
    if code != 0:
        raise SystemExit(f"the capture run failed (pytest exit {code})")
    calls = dict(recorder.calls)
    for call in _demo_calls():
        calls.setdefault(_key(call), call)
    ordered = [calls[key] for key in sorted(calls)]
    CORPUS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(ordered, sort_keys=True, separators=(",", ":"))
    INPUTS.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"{len(ordered)} inputs ({recorder.skipped} calls not JSON, left out)", file=sys.stderr)
    return ordered


def load_inputs() -> list:
    return json.loads(gzip.decompress(INPUTS.read_bytes()))


def digests(calls: list) -> dict:
    return {_key(call): outcome(call) for call in calls}


def write_digests(calls: list) -> dict:
    found = digests(calls)
    DIGESTS.write_text(json.dumps(found, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return found


def differences(calls: list, stored: dict) -> list:
    """[(key, host, stored outcome, outcome now)] of every input whose outcome changed."""
    out = []
    for call in calls:
        key = _key(call)
        now = outcome(call)
        if stored.get(key) != now:
            out.append((key, call["host"], stored.get(key), now))
    return out


def figures(found: dict) -> str:
    refused = sum(1 for value in found.values() if "refused" in value)
    return f"{len(found)} inputs: {len(found) - refused} plans, {refused} refusals"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", choices=("capture", "digests", "check"))
    args = parser.parse_args(argv)
    if args.what == "capture":
        print(figures(write_digests(capture())))
        return 0
    calls = load_inputs()
    if args.what == "digests":
        print(figures(write_digests(calls)))
        return 0
    stored = json.loads(DIGESTS.read_text(encoding="utf-8"))
    changed = differences(calls, stored)
    for key, host, was, now in changed:
        print(f"{key[:12]} host {host}: was {was}, now {now}")
    print(f"{figures(stored)}; {len(changed)} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
