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


# -- the import graph of the core -------------------------------------------------------------


def _sibling_imports(tree: ast.Module) -> list:
    """[(sibling, name or None, line)] of every import of a sibling, at any depth (function-level
    imports too): ``from .x import a`` gives ("x", "a", line), ``from . import x`` ("x", None, line)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        if node.module:
            sibling = node.module.split(".")[0]
            found.extend((sibling, alias.name, node.lineno) for alias in node.names)
        else:
            found.extend((alias.name, None, node.lineno) for alias in node.names)
    return found


def _import_graph(sources: dict) -> dict:
    """{module: set of the siblings it imports} of {module: source}."""
    return {
        name: {sibling for sibling, dummy, dummy_line in _sibling_imports(ast.parse(text))}
        & set(sources)
        for name, text in sources.items()
    }


def _cycles(graph: dict) -> list:
    """The import cycles of ``graph``: each strongly connected part of two or more modules (or
    one that imports itself), sorted; iterative Tarjan (no recursion limit)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1 or node in graph[node]:
                    found.append(sorted(part))
    return sorted(found)


def test_core_imports_have_no_cycle():
    """No module of the core imports itself back through its siblings, not even through a
    function-level import: shared records live in a module the others import (gpu_records.py,
    plan_common.py), never in one that imports them."""
    graph = _import_graph({path.stem: _source(path) for path in CORE_FILES})
    assert not _cycles(graph), f"import cycles in the core: {_cycles(graph)}"


@pytest.mark.parametrize("path", CORE_FILES, ids=_ids(CORE_FILES))
def test_core_imports_no_private_name_of_a_sibling(path):
    """A leading-underscore name is private to its module: a sibling that needs it needs it
    public (or in a shared module)."""
    private = [
        f"line {line}: from .{sibling} import {name}"
        for sibling, name, line in _sibling_imports(ast.parse(_source(path)))
        if name is not None and name.startswith("_")
    ]
    assert not private, f"{path.name} imports private names of siblings: {private}"


@pytest.mark.parametrize(
    ("sources", "cycles"),
    [
        ({"a": "from .b import x\n", "b": "import os\n"}, []),
        ({"a": "from .b import x\n", "b": "def f():\n    from .a import y\n"}, [["a", "b"]]),
        (
            {"a": "from . import b\n", "b": "from .c import z\n", "c": "from . import a\n"},
            [["a", "b", "c"]],
        ),
        ({"a": "from . import a\n"}, [["a"]]),
        ({"a": "from .b import x\nfrom .c import y\n", "b": "from .c import y\n", "c": ""}, []),
    ],
)
def test_cycle_checker_itself(sources, cycles):
    assert _cycles(_import_graph(sources)) == cycles


def test_private_import_checker_itself():
    tree = ast.parse("from .gpu import _clip, GpuState\nfrom . import gpu\n")
    assert [
        name for dummy, name, dummy_line in _sibling_imports(tree) if name and name[0] == "_"
    ] == ["_clip"]
