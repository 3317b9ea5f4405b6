"""Fixtures of the security layer (tests/security, run by `make security`, part of `make test`).

``matrix_env``: the host the injection matrix runs against, a scratch copy of the recorded
synthetic 2-socket A100 machine (4 GPUs, one in MIG mode) with its NUMA and GPU facts.
``matrix``: the outcome of every case (injection.run_matrix), computed once per session; its
counts are written to tests/output/security/injection-matrix.json and printed at the end of the
run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UNIT = HERE.parent / "unit"
for _extra in (HERE, UNIT, UNIT / "fixtures"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

MACHINE = "synthetic-2x6338-4xa100"
COUNTS_FILE = HERE.parent / "output" / "security" / "injection-matrix.json"
_COUNTS: dict = {}


@pytest.fixture(scope="session")
def matrix_env(tmp_path_factory):
    import injection
    import trees

    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, gpu_snapshot
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

    base = tmp_path_factory.mktemp("matrix")
    root = trees.materialize(MACHINE, base / MACHINE)
    snapshot = str(trees.GPU_SNAPSHOT_DIR / f"{MACHINE}.json")
    numa = json.loads((UNIT / "fixtures" / "sysfs" / f"{MACHINE}.numa.json").read_text())
    state = gpu_snapshot.read_snapshot(snapshot)
    topology = json.loads(
        json.dumps(gpu.read_gpu_topology(Reader(f"{root}/sys", f"{root}/proc"), state))
    )
    render = base / "render"
    render.mkdir()
    return injection.Env({"numa": numa, "gpu_topology": topology}, str(root), snapshot, str(render))


@pytest.fixture(scope="session")
def matrix(matrix_env):
    import injection

    outcomes = injection.run_matrix(matrix_env)
    counts = injection.counts(outcomes)
    COUNTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    COUNTS_FILE.write_text(
        json.dumps(
            {
                "counts": counts,
                "not_rejected": [
                    vars(o) for o in outcomes if o.kind not in ("rejected", "round_trip")
                ],
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    _COUNTS.update(counts)
    return outcomes


def pytest_terminal_summary(terminalreporter):
    if _COUNTS:
        text = ", ".join(f"{key} {value}" for key, value in _COUNTS.items())
        terminalreporter.write_line(f"injection matrix: {text} ({COUNTS_FILE})")
