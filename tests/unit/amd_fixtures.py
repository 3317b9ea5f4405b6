"""The recorded AMD outputs of tests/unit/fixtures/amd/ (PROVENANCE.md there), as the tools printed them."""

from __future__ import annotations

from pathlib import Path

AMD_FIXTURES = Path(__file__).parent / "fixtures" / "amd"
OUTPUT_LINE = "# ---- command output below this line"


def amd_output(name: str) -> str:
    """The command output of fixture ``name``: the part below its header line (JSON: all)."""
    text = (AMD_FIXTURES / name).read_text(encoding="utf-8")
    if not text.startswith("# SOURCE:"):
        return text
    head, sep, body = text.partition("\n" + OUTPUT_LINE)
    assert sep, f"{name}: no '{OUTPUT_LINE}' line"
    return body.split("\n", 1)[1]
