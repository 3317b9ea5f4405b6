"""The core (plugins/module_utils/numa) stays pure: stdlib and its siblings only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "numa"
CORE_FILES = sorted(CORE.glob("*.py"))
# An empty __init__.py has nothing to mark private.
CODE_FILES = [path for path in CORE_FILES if path.read_text(encoding="utf-8").strip()]
HEADER = "# Private to this collection: may change in any release."
SIBLINGS = {path.stem for path in CORE_FILES} - {"__init__"}
# Standard library, minus what the core must not use, minus modules newer than Python 3.9
# (the core runs on managed hosts with Python >= 3.9).
FORBIDDEN_STDLIB = {"subprocess", "tomllib"}
ALLOWED_STDLIB = set(sys.stdlib_module_names) - FORBIDDEN_STDLIB
# A `X | Y` of these outside annotations is evaluated at run time and fails on Python 3.9.
TYPE_NAMES = {"bool", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str", "tuple"}


def _ids(paths):
    return [path.name for path in paths]


def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _bad_imports(tree: ast.Module) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in ALLOWED_STDLIB:
                    bad.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0:
                top = module.split(".")[0]
                if module != "__future__" and top not in ALLOWED_STDLIB:
                    bad.append(f"line {node.lineno}: from {module} import ...")
            elif node.level > 1:
                bad.append(f"line {node.lineno}: from {'.' * node.level}{module} leaves the core")
            elif module and module.split(".")[0] not in SIBLINGS:
                bad.append(f"line {node.lineno}: from .{module}: no such sibling")
            elif not module:
                bad.extend(
                    f"line {node.lineno}: from . import {alias.name}: no such sibling"
                    for alias in node.names
                    if alias.name not in SIBLINGS
                )
    return bad


def _annotation_nodes(tree: ast.Module) -> set[int]:
    """ids of every node inside an annotation (where `X | Y` is fine thanks to the future import)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            roots.append(node.returns)
    return {id(sub) for root in roots for sub in ast.walk(root)}


def _is_type_operand(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    return isinstance(node, ast.Name) and node.id in TYPE_NAMES


def test_the_core_exists():
    assert SIBLINGS, f"no Python files under {CORE}"


@pytest.mark.parametrize("path", CORE_FILES, ids=_ids(CORE_FILES))
def test_core_imports_only_stdlib_and_siblings(path):
    bad = _bad_imports(ast.parse(_source(path), filename=str(path)))
    assert not bad, f"{path.name} imports outside stdlib + siblings: {bad}"


@pytest.mark.parametrize("path", CODE_FILES, ids=_ids(CODE_FILES))
def test_core_file_has_header_and_future_import(path):
    source = _source(path)
    assert source.splitlines()[0] == HEADER, f"{path.name}: first line must be {HEADER!r}"
    tree = ast.parse(source, filename=str(path))
    futures = [
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "__future__"
        for alias in node.names
    ]
    assert "annotations" in futures, f"{path.name}: needs `from __future__ import annotations`"


@pytest.mark.parametrize("path", CORE_FILES, ids=_ids(CORE_FILES))
def test_core_parses_as_python_3_9(path):
    ast.parse(_source(path), filename=str(path), feature_version=(3, 9))


@pytest.mark.parametrize("path", CORE_FILES, ids=_ids(CORE_FILES))
def test_core_has_no_runtime_union_types(path):
    tree = ast.parse(_source(path), filename=str(path))
    in_annotation = _annotation_nodes(tree)
    bad = [
        f"line {node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.BitOr)
        and id(node) not in in_annotation
        and (_is_type_operand(node.left) or _is_type_operand(node.right))
    ]
    assert not bad, f"{path.name}: `X | Y` of types outside annotations fails on 3.9: {bad}"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import os\nfrom . import errors\nfrom .cpulist import parse_cpulist\n", []),
        ("import subprocess\n", ["line 1: import subprocess"]),
        ("from ansible.module_utils.basic import AnsibleModule\n", ["line 1: from ansible"]),
        ("from ..modules import x\n", ["line 1: from ..modules leaves the core"]),
        ("from .nonexistent import x\n", ["line 1: from .nonexistent: no such sibling"]),
        ("import ansible_collections.numafleet\n", ["line 1: import ansible_collections"]),
    ],
)
def test_import_checker_itself(source, found):
    bad = _bad_imports(ast.parse(source))
    assert len(bad) == len(found), bad
    assert [b[: len(f)] for b, f in zip(bad, found, strict=True)] == found
