"""docs/host_variables.md is what docs/gen_host_variables.py generates from the schema (make docs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "gen_host_variables.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_host_variables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_the_committed_doc_is_the_generated_one():
    committed = (ROOT / "docs" / "host_variables.md").read_text(encoding="utf-8")
    assert committed == GEN.render(), (
        "docs/host_variables.md differs from what docs/gen_host_variables.py generates from "
        "plugins/plugin_utils/_host_vars.py: run `make docs` and commit the result"
    )


def test_the_doc_lists_every_variable_and_key():
    text = GEN.render()
    for var in GEN.schema.HOST_VARS:
        assert f"| `{var.name}` |" in text, var.name
        assert f"## {var.name}" in text or not var.keys, var.name
        for key in var.keys:
            assert f"| `{key.name}` |" in text, (var.name, key.name)
            for sub in key.keys:
                assert f"| `{key.name}.{sub.name}` |" in text, (var.name, key.name, sub.name)
    for role_input in GEN.schema.role_input_sources():
        assert f"| `{role_input}` |" in text, role_input


def test_the_doc_says_what_cpus_counts_and_who_runs_a_service_without_user():
    text = GEN.render()
    assert "`cpus: 16` asks for 16 logical CPUs: hardware threads" in text
    assert "SMT siblings together" in text
    assert "`cpus: 15` gets 16 CPUs" in text
    assert (
        "Without `user:`, the unit has no `User=` line, so systemd runs the service as **root**"
        in text
    )


def test_check_mode_of_the_script_compares_only(tmp_path, monkeypatch):
    out = tmp_path / "host_variables.md"
    monkeypatch.setattr(GEN, "OUTPUT", out)
    monkeypatch.setattr(GEN, "ROOT", tmp_path)
    monkeypatch.setattr("sys.argv", ["gen_host_variables.py", "--check"])
    assert GEN.main() == 1 and not out.exists()
    monkeypatch.setattr("sys.argv", ["gen_host_variables.py"])
    assert GEN.main() == 0 and out.read_text(encoding="utf-8") == GEN.render()
    monkeypatch.setattr("sys.argv", ["gen_host_variables.py", "--check"])
    assert GEN.main() == 0
