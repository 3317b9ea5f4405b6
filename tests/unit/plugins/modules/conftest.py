"""Run a module's main() in-process (test layer 2, see CONTRIBUTING.md).

    def test_facts(run_module, tmp_path):
        result = run_module("numa_facts", {"sysfs_root": str(tmp_path)}, check_mode=True)
        assert result["changed"] is False

The module is given its arguments the way ansible-core does (``patch_module_args``), runs until
``exit_json``/``fail_json``, and the JSON it printed is returned as a dict: ``failed``/``msg`` on
failure, ``changed``, ``diff``, ``ansible_facts``... on success. Nothing of AnsibleModule is
patched: the result is what the controller would have received.
"""

from __future__ import annotations

import importlib
import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
from ansible.module_utils import basic

try:  # ansible-core >= 2.19
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core 2.17/2.18: the documented way, through basic._ANSIBLE_ARGS

    @contextmanager
    def patch_module_args(args=None):
        saved = basic._ANSIBLE_ARGS
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()
        try:
            yield
        finally:
            basic._ANSIBLE_ARGS = saved


PACKAGE = "ansible_collections.numafleet.tuning.plugins.modules"


def _load(module: str | ModuleType) -> ModuleType:
    if isinstance(module, ModuleType):
        return module
    return importlib.import_module(f"{PACKAGE}.{module}")


@pytest.fixture
def run_module(capsys):
    """Callable ``(module, args=None, check_mode=False, diff=False) -> result dict``.

    ``module`` is a module name in this collection (``"numa_facts"``) or an imported module.
    """

    def run(module, args=None, check_mode=False, diff=False):
        module_args = dict(args or {})
        module_args["_ansible_check_mode"] = check_mode
        module_args["_ansible_diff"] = diff
        main = _load(module).main
        capsys.readouterr()  # drop anything printed before the run
        with patch_module_args(module_args), pytest.raises(SystemExit) as exited:
            main()
        out = capsys.readouterr().out
        try:
            result = json.loads(out)
        except ValueError:
            pytest.fail(f"{module}: main() printed something other than one JSON result: {out!r}")
        failed = bool(result.get("failed"))
        if failed != (exited.value.code not in (0, None)):
            pytest.fail(f"{module}: exit code {exited.value.code!r} contradicts failed={failed}")
        result.setdefault("failed", False)
        return result

    return run


# The recorded `nvidia-smi -q -x` of an 8x H100 SXM host (tests/unit/fixtures/cmd/nvidia-smi).
H100_XML = (
    Path(__file__).resolve().parents[2] / "fixtures" / "cmd" / "nvidia-smi" / "h100-sxm-q-x.xml"
)


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi first on PATH that prints the recorded H100 XML for exactly `-q -x` under LC_ALL=C."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = -q ] && [ "$2" = -x ] && [ $# -eq 2 ] || { echo "bad argv: $*" >&2; exit 2; }\n'
        '[ "$LC_ALL" = C ] || { echo "LC_ALL is not C" >&2; exit 3; }\n'
        f'cat "{H100_XML}"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '')}")
    return script


@pytest.fixture
def fake_systemctl(tmp_path, monkeypatch):
    """install(script) puts a fake ``systemctl`` (``script``, ``{log}`` standing for its call log)
    first in PATH and returns the log file of its calls (absent: never run). The FAKE_* variables
    the scripts read start unset."""

    def install(script: str) -> Path:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        log = tmp_path / "systemctl.log"
        fake = bin_dir / "systemctl"
        fake.write_text(script.format(log=log))
        fake.chmod(0o755)
        path = os.environ.get("PATH", "/usr/bin:/bin")
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{path}")
        for name in ("FAKE_SYSTEMCTL_FAIL", "FAKE_ENABLED", "FAKE_ACTIVE"):
            monkeypatch.delenv(name, raising=False)
        return log

    return install
