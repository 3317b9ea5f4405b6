"""The mutation runner of `make mutation` (tests/mutation/run.py): mutants, restore, counts."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "tests" / "mutation" / "run.py"
_spec = importlib.util.spec_from_file_location("mutation_run", RUN)
run = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = run  # dataclasses look their module up there
_spec.loader.exec_module(run)

SAMPLE = b'''"""Module docstring."""
from __future__ import annotations

LIMIT: int = 3


def add(a: int, b: int) -> int:
    """Docstring, not mutated."""
    return a + b


def count_to(n):
    i = 0
    while i < n:
        i += 1
    return i


def label(x):
    if x is None or not x:
        raise ValueError(f"bad {x}")
    return "ok" if x[:LIMIT] else "no"


def unused():
    return 7
'''

MODULE_TESTS = b"""
from mod import add, count_to, label


def test_add():
    assert add(2, 3) == 5


def test_count_to():
    assert count_to(3) == 3
"""


def mutants_of(source: bytes) -> list:
    return run.find_mutants(source)


def test_mutants_of_every_operator_and_none_in_docstrings_or_annotations():
    found = mutants_of(SAMPLE)
    ops = {m.operator for m in found}
    assert ops == {"arith", "cmp", "num", "str", "return", "raise", "if", "bool", "not", "slice"}
    befores = {m.before for m in found}
    assert not any("Docstring" in b or "docstring" in b for b in befores)
    assert "int" not in befores and "'bad '" not in befores  # annotations, f-string parts
    assert {(m.before, m.after) for m in found if m.function == "count_to"} >= {
        ("i < n", "(i <= n)"),
        ("i += 1", "i -= 1"),
        ("0", "(1)"),
        ("return i", "return None"),
    }
    assert ("LIMIT", "(LIMIT + 1)") in {(m.before, m.after) for m in found}
    assert sorted(m.after for m in found if m.operator == "if") == ["False", "True"]


def test_every_mutant_compiles_and_changes_the_tree():
    source = (REPO / "plugins/module_utils/numa/cpulist.py").read_bytes()
    original = ast.dump(ast.parse(source))
    for mutant in mutants_of(source):
        mutated = run.apply(source, mutant)
        assert ast.dump(ast.parse(mutated)) != original, mutant


def test_keys_do_not_depend_on_line_numbers():
    keys = [m.key for m in mutants_of(SAMPLE)]
    shifted = [m.key for m in mutants_of(b"\n\n# moved\n" + SAMPLE)]
    assert keys == shifted
    assert len(set(keys)) == len(keys)  # identical snippets in one function are numbered


def test_summary_score_leaves_equivalent_out():
    results = [{"status": s} for s in ["killed"] * 6 + ["timeout", "survived", "equivalent"]]
    summary = run.summarize(results)
    assert summary["total"] == 9
    assert summary["score"] == 87.5  # (6 + 1) / (9 - 1)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "mod.py").write_bytes(SAMPLE)
    (tmp_path / "test_mod.py").write_bytes(MODULE_TESTS)
    (tmp_path / "equivalent.json").write_text(
        json.dumps(
            [
                {
                    "file": str(tmp_path / "mod.py"),
                    "function": "count_to",
                    "operator": "cmp",
                    "before": "i < n",
                    "after": "(i <= n)",
                    "reason": "test of the runner",
                }
            ]
        )
    )
    return tmp_path


def runner(project: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(RUN), str(project / "mod.py"), "--tests", "test_mod.py"]
    argv += ["--out", str(project / "out"), "--equivalent", str(project / "equivalent.json")]
    return subprocess.run(
        [*argv, *extra], cwd=project, capture_output=True, text=True, timeout=300, check=False
    )


def test_runner_counts_and_restores(project):
    before = (project / "mod.py").stat()
    done = runner(project, "--timeout", "5", "--operators", "arith", "cmp", "return")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "mod.py").read_bytes() == SAMPLE
    assert (project / "mod.py").stat().st_mtime_ns == before.st_mtime_ns
    report = json.loads((project / "out" / "mod.py.json").read_text())
    status = {(r["function"], r["before"], r["after"]): r["status"] for r in report["all"]}
    assert status[("add", "a + b", "(a - b)")] == "killed"
    assert status[("count_to", "i += 1", "i -= 1")] == "timeout"  # loops for ever
    assert status[("count_to", "i < n", "(i <= n)")] == "equivalent"
    assert status[("unused", "return 7", "return None")] == "uncovered"
    assert status[("label", 'return "ok" if x[:LIMIT] else "no"', "return None")] == "uncovered"
    summary = report["summary"]
    assert summary["total"] == len(report["all"])
    assert (
        summary["killed"]
        + summary["timeout"]
        + summary["survived"]
        + summary["uncovered"]
        + summary["equivalent"]
        == summary["total"]
    )
    assert f"score {summary['score']}%" in done.stdout
    assert all(r["status"] in ("survived", "uncovered") for r in report["survivors"])
    assert not (project / "out" / ".mod.py.orig").exists()


def test_runner_restores_what_an_interrupted_run_left(project):
    (project / "out").mkdir()
    (project / "out" / ".mod.py.orig").write_bytes(SAMPLE)
    (project / "mod.py").write_bytes(SAMPLE.replace(b"a + b", b"a - b"))
    done = runner(project, "--operators", "return", "--sample", "1")
    assert "restored" in done.stdout
    assert (project / "mod.py").read_bytes() == SAMPLE


def test_runner_refuses_when_the_tests_fail_unmutated(project):
    (project / "test_mod.py").write_bytes(MODULE_TESTS + b"\n\ndef test_no():\n    assert 0\n")
    done = runner(project, "--operators", "return")
    assert done.returncode == 2
    assert "fail on the unmutated" in done.stdout
    assert (project / "mod.py").read_bytes() == SAMPLE


def test_every_selected_test_file_exists():
    for source, tests in run.SELECTION.items():
        assert (REPO / source).is_file(), source
        for test in tests:
            assert (REPO / test).is_file(), test
