"""The product's documentation stands alone: nothing in the repository points outside it.

- No file git knows about (tracked, or new and not ignored) names an internal document that is
  not part of the repository, nor a sibling folder of the checkout.
- Every relative Markdown link in README.md, docs/*.md and roles/*/README.md resolves to a file
  (or folder) inside the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
# Documents and folders that live outside the repository: the product's files must not cite them.
OUTSIDE = ("DESIGN.md", "STYLE.md", "TOOLCHAIN.md", "../shared")
MARKDOWN = sorted(
    path
    for path in {ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("roles/*/README.md")}
    if path.is_file()
)
# [text](target) and ![alt](target), with an optional "title"; [label]: target definitions.
INLINE_LINK = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
LINK_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
# A URL scheme (https:, mailto:), a protocol-relative URL or an anchor in the same page.
NOT_A_PATH = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//|#)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+).*?\1")


def _known_files() -> list[str]:
    """Paths (relative, POSIX) of the files git tracks plus new files it does not ignore."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.decode(errors='replace').strip()}")
    names = sorted({name for name in proc.stdout.decode("utf-8").split("\0") if name})
    return [name for name in names if name != SELF and (ROOT / name).is_file()]


def test_no_file_cites_documents_outside_the_repository():
    files = _known_files()
    assert "README.md" in files
    found = []
    for name in files:
        data = (ROOT / name).read_bytes()
        for needle in OUTSIDE:
            raw = needle.encode()
            if raw not in data:
                continue
            lines = [
                str(number) for number, line in enumerate(data.splitlines(), start=1) if raw in line
            ]
            found.append(f"{name}:{','.join(lines)}: {needle}")
    assert not found, (
        "these files cite documents outside the repository; write the fact itself or point at "
        "docs/architecture.md (or another file in the repository) instead:\n" + "\n".join(found)
    )


def _link_targets(text: str):
    """(line number, target) of every inline link and link definition outside code."""
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        prose = CODE_SPAN.sub("", line)
        for match in INLINE_LINK.finditer(prose):
            yield number, match.group(1)
        definition = LINK_DEFINITION.match(prose)
        if definition:
            yield number, definition.group(1)


def _problem(markdown: Path, target: str):
    """Why target, a link of markdown, does not point into the repository; None when it does."""
    target = target[1:-1] if target.startswith("<") and target.endswith(">") else target
    if NOT_A_PATH.match(target):
        return None
    path = unquote(target.split("#", 1)[0].split("?", 1)[0])
    if not path:
        return None
    if path.startswith("/"):
        return "is an absolute path; link a path relative to this file"
    resolved = (markdown.parent / path).resolve()
    if not resolved.is_relative_to(ROOT):
        return "points outside the repository"
    if not resolved.exists():
        return "points to no file in the repository"
    return None


@pytest.mark.parametrize(
    "markdown", MARKDOWN, ids=[path.relative_to(ROOT).as_posix() for path in MARKDOWN]
)
def test_relative_markdown_links_resolve_in_the_repository(markdown: Path):
    problems = []
    for number, target in _link_targets(markdown.read_text(encoding="utf-8")):
        why = _problem(markdown, target)
        if why:
            problems.append(f"{markdown.relative_to(ROOT).as_posix()}:{number}: ({target}) {why}")
    assert not problems, "\n".join(problems)
