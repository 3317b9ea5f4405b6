"""Mutation testing of the core with the standard library only (tests/mutation/README.md).

    python tests/mutation/run.py plugins/module_utils/numa/cpulist.py [--sample N] [--seed S]

For one source file: list every mutant of a fixed operator set (``OPERATORS``), run the file's
test selection (``SELECTION``) once unmutated with line tracing, then for each mutant (or a seeded
sample of them) write the mutated source in place, run the selection in a forked child with a
timeout, and put the original bytes back. A mutant is *killed* when the tests fail, *timeout*
when they run past the limit, *survived* when they pass, *uncovered* (a survivor, not run) when
no selected test executes its lines. Mutants listed in ``equivalent.json`` are *equivalent* and
left out of the score. Results: reports/mutation/<file name>.json and one summary line.

The file is restored in ``finally`` (also on Ctrl-C and SIGTERM), its SHA-256 and mtime are
checked against the original, and a backup copy under the report folder survives a hard kill:
the next run restores from it before doing anything else.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
UNIT = "tests/unit/plugins/module_utils/numa"

# Each core file and the smallest set of test files that exercises it. The selection runs with
# -x: the first failing test kills the mutant. Keep it small: it runs once per mutant.
SELECTION: dict[str, list[str]] = {
    "plugins/module_utils/numa/cpulist.py": [
        f"{UNIT}/test_cpulist.py",
    ],
    "plugins/module_utils/numa/placements.py": [
        f"{UNIT}/test_placements.py",
    ],
    "plugins/module_utils/numa/hugepages.py": [
        f"{UNIT}/test_hugepages.py",
    ],
    "plugins/module_utils/numa/units.py": [f"{UNIT}/test_units.py", f"{UNIT}/test_units_edges.py"],
    "plugins/module_utils/numa/files.py": [f"{UNIT}/test_files.py"],
    "plugins/module_utils/numa/mps.py": [f"{UNIT}/test_mps.py"],
}

OPERATORS = {
    "cmp": "comparison swapped: < <=, > >=, == !=, in / not in, is / is not",
    "bool": "boolean operator swapped: and <-> or",
    "not": "`not x` -> `x`",
    "arith": "arithmetic / set operator swapped: + -, * //, % //, | &",
    "num": "integer constant: 0 -> 1, 1 -> 0, n -> n + 1",
    "true": "True <-> False",
    "str": 'non-empty string constant -> "" (docstrings, f-string parts, annotations skipped)',
    "return": "`return x` -> `return None`",
    "raise": "`raise ...` statement -> `pass`",
    "if": "condition of an if statement -> True, and -> False",
    "slice": "slice bound or subscript index that is an expression e -> (e) + 1",
}

_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_ARITH = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
}


@dataclass(frozen=True)
class Mutant:
    """One mutation: replace bytes [start, end) of the file with ``after``."""

    line: int
    end_line: int
    start: int
    end: int
    operator: str
    function: str
    before: str
    after: str
    occurrence: int = 0
    stmt_line: int = 0  # first line of the innermost statement: continuation lines never "run"

    @property
    def key(self) -> str:
        """Stable identity: no line numbers, so edits elsewhere in the file do not move it."""
        return f"{self.function}|{self.operator}|{self.before}|{self.after}|{self.occurrence}"


def _line_offsets(data: bytes) -> list[int]:
    offsets, total = [0], 0
    for line in data.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, f-string parts and their children."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(sub) for sub in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    mark(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if arg is not None:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant):
                    mark(part)
                elif isinstance(part, ast.FormattedValue):
                    mark(part.format_spec)
    return skip


def _replacements(node: ast.AST) -> list[tuple[str, ast.AST | str]]:
    """(operator, replacement node or source text) for one node."""
    out: list[tuple[str, ast.AST | str]] = []
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            new = _CMP.get(type(op))
            if new is not None:
                ops = list(node.ops)
                ops[index] = new()
                out.append(("cmp", ast.Compare(node.left, ops, node.comparators)))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("bool", ast.BoolOp(other, node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", node.operand))
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        out.append(("arith", ast.BinOp(node.left, _ARITH[type(node.op)](), node.right)))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH:
        new = ast.AugAssign(node.target, _ARITH[type(node.op)](), node.value)
        out.append(("arith", new))
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            out.append(("true", ast.Constant(not value)))
        elif isinstance(value, int):
            new_value = {0: 1, 1: 0}.get(value, value + 1)
            out.append(("num", ast.Constant(new_value)))
        elif isinstance(value, str) and value:
            out.append(("str", ast.Constant("")))
    elif isinstance(node, ast.Return):
        if node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None
        ):
            out.append(("return", "return None"))
    elif isinstance(node, ast.Raise):
        out.append(("raise", "pass"))
    elif isinstance(node, ast.If):
        out.append(("if", node.test))  # handled by the caller: test -> True / False
    return out


def _is_literal(expr: ast.AST | None) -> bool:
    """A constant or a negated constant: the num operator mutates those already."""
    if isinstance(expr, ast.UnaryOp):
        expr = expr.operand
    return expr is None or isinstance(expr, ast.Constant)


def _bumped(expr: ast.AST) -> ast.AST:
    return ast.BinOp(expr, ast.Add(), ast.Constant(1))


def find_mutants(source: bytes) -> list[Mutant]:
    """Every mutant of ``source`` in file order; raises SyntaxError for a file that is not Python."""
    tree = ast.parse(source)
    skip = _skipped_nodes(tree)
    offsets = _line_offsets(source)

    def span(node: ast.AST) -> tuple[int, int]:
        return (
            offsets[node.lineno - 1] + node.col_offset,
            offsets[node.end_lineno - 1] + node.end_col_offset,
        )

    found: list[Mutant] = []

    statement = [0]

    def add(node: ast.AST, operator: str, after: str, function: str, expr: bool) -> None:
        start, end = span(node)
        before = source[start:end].decode()
        if expr:
            after = f"({after})"
        first = min(statement[0] or node.lineno, node.lineno)
        found.append(
            Mutant(
                node.lineno,
                node.end_lineno,
                start,
                end,
                operator,
                function,
                before,
                after,
                0,
                first,
            )
        )

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.stmt):
            statement[0] = node.lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            function = f"{function}.{node.name}" if function else node.name
        if id(node) not in skip:
            for operator, repl in _replacements(node):
                if operator == "if":
                    for value in ("True", "False"):
                        add(node.test, "if", value, function, expr=False)
                elif isinstance(repl, str):
                    add(node, operator, repl, function, expr=False)
                else:
                    is_expr = isinstance(node, ast.expr)
                    add(node, operator, ast.unparse(repl), function, expr=is_expr)
            if isinstance(node, ast.Slice):
                for bound in (node.lower, node.upper):
                    if not _is_literal(bound):
                        add(bound, "slice", ast.unparse(_bumped(bound)), function, expr=True)
            elif isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
                index = node.slice
                if isinstance(index, (ast.Name, ast.BinOp, ast.UnaryOp)) and not _is_literal(index):
                    # A Name index into a dict is a key, not a bound: `d[k]` -> `d[(k) + 1]`
                    # raises for a str key, which the tests see as a kill; cheap and honest.
                    add(index, "slice", ast.unparse(_bumped(index)), function, expr=True)
        outer = statement[0]
        for child in ast.iter_child_nodes(node):
            visit(child, function)
            statement[0] = outer

    visit(tree, "")
    found.sort(key=lambda m: (m.start, m.end, m.operator, m.after))
    seen: dict[str, int] = {}
    numbered = []
    for mutant in found:
        base = f"{mutant.function}|{mutant.operator}|{mutant.before}|{mutant.after}"
        count = seen.get(base, 0)
        seen[base] = count + 1
        numbered.append(Mutant(**{**asdict(mutant), "occurrence": count}))
    return numbered


def apply(source: bytes, mutant: Mutant) -> bytes:
    """``source`` with the mutant's span replaced."""
    return source[: mutant.start] + mutant.after.encode() + source[mutant.end :]


def load_equivalents(path: Path, relpath: str) -> list[dict]:
    """Entries of ``equivalent.json`` for one file (each: function, operator, before, after, reason)."""
    if not path.is_file():
        return []
    entries = json.loads(path.read_text())
    for entry in entries:
        for field in ("file", "function", "operator", "before", "after", "reason"):
            if not entry.get(field) and field != "function":
                raise SystemExit(f"{path}: entry {entry!r} lacks {field!r}")
    return [e for e in entries if e["file"] == relpath]


def is_equivalent(mutant: Mutant, entries: list[dict]) -> dict | None:
    """The equivalent.json entry that names this mutant, or None."""
    for entry in entries:
        if (
            entry["function"] == mutant.function
            and entry["operator"] == mutant.operator
            and entry["before"] == mutant.before
            and entry["after"] == mutant.after
            and entry.get("occurrence", mutant.occurrence) == mutant.occurrence
        ):
            return entry
    return None


class Restorer:
    """Owns one file while it is mutated: the original bytes, mode times and a backup on disk."""

    def __init__(self, path: Path, backup: Path):
        self.path, self.backup = path, backup
        if backup.is_file():  # a previous run was killed before it could restore
            path.write_bytes(backup.read_bytes())
            print(f"mutation: restored {path} from {backup} (left by an interrupted run)")
        self.original = path.read_bytes()
        self.digest = hashlib.sha256(self.original).hexdigest()
        self.stat = path.stat()
        backup.parent.mkdir(parents=True, exist_ok=True)
        backup.write_bytes(self.original)

    def write(self, data: bytes) -> None:
        self.path.write_bytes(data)

    def restore(self) -> None:
        """Put the original bytes and times back and check them; raises SystemExit if they differ."""
        self.path.write_bytes(self.original)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))
        if hashlib.sha256(self.path.read_bytes()).hexdigest() != self.digest:
            raise SystemExit(f"mutation: {self.path} differs from the original after restore")

    def finish(self) -> None:
        self.restore()
        self.backup.unlink(missing_ok=True)


def _child_pytest(tests: list[str], trace: tuple[str, str] | None, out: str | None) -> int:
    """Run pytest in this (forked) process; returns its exit code."""
    import pytest

    sys.dont_write_bytecode = True  # a mutant must never leave a .pyc behind
    if out is not None:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    else:
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    if trace is None:
        return int(pytest.main(args))
    target, lines_out = os.path.realpath(trace[0]), trace[1]
    lines: set[int] = set()
    real: dict[str, bool] = {}

    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        hit = real.get(name)
        if hit is None:
            hit = real[name] = os.path.realpath(name) == target
        if hit:
            lines.add(frame.f_lineno)
            return local
        return None

    sys.settrace(tracer)
    import threading

    threading.settrace(tracer)
    rc = int(pytest.main(args))
    sys.settrace(None)
    Path(lines_out).write_text(json.dumps(sorted(lines)))
    return rc


def run_tests(tests, timeout, trace=None, log=None):
    """("passed" | "failed" | "timeout", seconds) of one run of ``tests`` in a forked child.

    ``trace``: (source file, output file): write the lines of the source file that ran as JSON.
    """
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: own process group, so a timeout kills whatever it started too
        rc = 70
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            rc = _child_pytest(tests, trace, log)
        finally:
            os._exit(rc)
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return ("passed" if code == 0 else "failed"), time.monotonic() - start
        if time.monotonic() > deadline:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.02)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("file", help="source file, relative to the repository root")
    parser.add_argument("--tests", nargs="+", help="test files (default: SELECTION[file])")
    parser.add_argument("--sample", type=int, default=0, help="run N mutants drawn with --seed")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="seconds per mutant (default: 4 x the unmutated run, at least 10)",
    )
    parser.add_argument("--out", default="reports/mutation", help="report folder")
    parser.add_argument("--equivalent", default=str(HERE / "equivalent.json"))
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--operators", nargs="+", choices=sorted(OPERATORS))
    args = parser.parse_args(argv)

    path = Path(args.file).resolve()
    try:
        relpath = str(path.relative_to(REPO))
    except ValueError:
        relpath = str(path)
    tests = args.tests or SELECTION.get(relpath)
    if not tests:
        parser.error(f"no test selection for {relpath}: add it to SELECTION or pass --tests")

    source = path.read_bytes()
    mutants = find_mutants(source)
    if args.operators:
        mutants = [m for m in mutants if m.operator in args.operators]
    if args.list:
        for m in mutants:
            print(f"{m.line}: {m.operator}: {m.before!r} -> {m.after!r}  [{m.function}]")
        print(f"{len(mutants)} mutants")
        return 0

    equivalents = load_equivalents(Path(args.equivalent), relpath)
    chosen = mutants
    if args.sample and args.sample < len(mutants):
        chosen = sorted(
            random.Random(args.seed).sample(mutants, args.sample), key=lambda m: m.start
        )
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / f"{path.name}.json"
    restorer = Restorer(path, out_dir / f".{path.name}.orig")
    old_int = signal.signal(signal.SIGINT, _interrupt)
    old_term = signal.signal(signal.SIGTERM, _interrupt)
    results: list[dict] = []
    begin = time.monotonic()
    try:
        lines_file = out_dir / f".{path.name}.lines"
        state, base_seconds = run_tests(
            tests,
            3600,
            trace=(str(path), str(lines_file)),
            log=str(out_dir / f"{path.name}.baseline.log"),
        )
        covered = set(json.loads(lines_file.read_text())) if lines_file.is_file() else set()
        lines_file.unlink(missing_ok=True)
        if state != "passed":
            print(f"mutation: the tests fail on the unmutated {relpath}: see the baseline log")
            return 2
        timeout = args.timeout or max(10.0, 4 * base_seconds)
        print(
            f"mutation: {relpath}: {len(mutants)} mutants, running {len(chosen)}; "
            f"baseline {base_seconds:.1f} s, timeout {timeout:.0f} s"
        )
        for number, mutant in enumerate(chosen, 1):
            entry = is_equivalent(mutant, equivalents)
            record = {**asdict(mutant), "key": mutant.key}
            del record["start"], record["end"]
            if entry is not None:
                record.update(status="equivalent", reason=entry["reason"], seconds=0.0)
            elif not covered.intersection(range(mutant.stmt_line, mutant.end_line + 1)):
                record.update(status="uncovered", seconds=0.0)
            else:
                restorer.write(apply(source, mutant))
                try:
                    state, seconds = run_tests(tests, timeout)
                finally:
                    restorer.restore()
                status = {"failed": "killed", "passed": "survived", "timeout": "timeout"}[state]
                record.update(status=status, seconds=round(seconds, 2))
            results.append(record)
            if record["status"] in ("survived", "uncovered"):
                print(
                    f"  [{number}/{len(chosen)}] {record['status']}: line {mutant.line} "
                    f"{mutant.operator}: {mutant.before!r} -> {mutant.after!r}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("mutation: interrupted; restoring the file", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        restorer.finish()

    summary = summarize(results)
    summary.update(
        file=relpath,
        mutants=len(mutants),
        sampled=len(chosen) if len(chosen) < len(mutants) else None,
        seed=args.seed,
        tests=tests,
        seconds=round(time.monotonic() - begin, 1),
    )
    report = {
        "summary": summary,
        "survivors": [r for r in results if r["status"] in ("survived", "uncovered")],
        "timeouts": [r for r in results if r["status"] == "timeout"],
        "equivalent": [r for r in results if r["status"] == "equivalent"],
        "operators": OPERATORS,
        "all": results,
    }
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    print(summary_line(summary))
    return 0


def summarize(results: list[dict]) -> dict:
    """Counts by status and the score: (killed + timeout) / (total - equivalent)."""
    count = dict.fromkeys(("killed", "survived", "uncovered", "timeout", "equivalent"), 0)
    for record in results:
        count[record["status"]] += 1
    total = len(results)
    scored = total - count["equivalent"]
    score = (count["killed"] + count["timeout"]) / scored if scored else 1.0
    return {"total": total, **count, "score": round(100 * score, 1)}


def summary_line(summary: dict) -> str:
    """One line: file, total, killed, survived (uncovered), timeout, equivalent, score, time."""
    sampled = f" (sample of {summary['mutants']})" if summary.get("sampled") else ""
    return (
        f"{summary['file']}: total {summary['total']}{sampled}, killed {summary['killed']}, "
        f"survived {summary['survived'] + summary['uncovered']} "
        f"({summary['uncovered']} uncovered), timeout {summary['timeout']}, "
        f"equivalent {summary['equivalent']}, score {summary['score']}%, "
        f"{summary['seconds']} s"
    )


if __name__ == "__main__":
    sys.exit(main())
