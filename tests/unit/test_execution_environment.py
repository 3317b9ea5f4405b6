"""The execution environment files: a built collection carries them, ansible-builder reads them.

- ``ansible-galaxy collection build`` keeps meta/execution-environment.yml, requirements.txt and
  bindep.txt in the tarball (galaxy.yml's build_ignore must not drop them).
- ``ansible-builder introspect`` on that tarball, unpacked as an installed collection, finds
  exactly the dependencies bindep.txt and requirements.txt list (what an EE build installs).
- ``ansible-builder create`` (no network, no container runtime) on the example
  docs/execution-environment.yml, with the tarball it names, writes a build context that
  installs the tarball, the tested ansible-core pin and docs/ansible-large-fleet.cfg.

ansible-builder comes from requirements-dev.txt (``make setup``); the venv's own copy is used.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EE_FILES = ("meta/execution-environment.yml", "requirements.txt", "bindep.txt")


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} is not installed (requirements-dev.txt: run make setup)")
        return found
    return str(path)


def _run(argv: list, cwd: Path) -> str:
    proc = subprocess.run(argv, cwd=str(cwd), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _requirement_lines(path: Path) -> list[str]:
    """The non-comment, non-blank lines of a requirements or bindep file, comments stripped."""
    lines = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    """The collection built from this checkout with ansible-galaxy (build_ignore applied)."""
    out = tmp_path_factory.mktemp("build")
    _run(
        [_tool("ansible-galaxy"), "collection", "build", "--output-path", str(out), str(ROOT)], ROOT
    )
    (built,) = out.glob("numafleet-tuning-*.tar.gz")
    return built


def test_meta_points_at_the_dependency_files():
    meta = yaml.safe_load((ROOT / "meta" / "execution-environment.yml").read_text())
    assert meta == {
        "version": 1,
        "dependencies": {"python": "requirements.txt", "system": "bindep.txt"},
    }
    for name in meta["dependencies"].values():
        assert (ROOT / name).is_file(), name


def test_built_collection_keeps_the_ee_files(tarball):
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    missing = [name for name in EE_FILES if name not in names]
    assert not missing, (
        f"ansible-galaxy collection build dropped {missing} (galaxy.yml build_ignore)"
    )


def test_builder_introspection_finds_our_dependencies(tarball, tmp_path):
    target = tmp_path / "ansible_collections" / "numafleet" / "tuning"
    target.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(target, filter="data")
    out = yaml.safe_load(_run([_tool("ansible-builder"), "introspect", str(tmp_path)], tmp_path))
    system = [re.sub(r"\s*#.*$", "", line).strip() for line in out["system"]]
    python = [re.sub(r"\s*#.*$", "", line).strip() for line in out["python"]]
    assert system == _requirement_lines(ROOT / "bindep.txt")
    assert python == _requirement_lines(ROOT / "requirements.txt")
    # The EE reaches hosts over ssh; nothing of the managed hosts' tools goes into the EE.
    assert any(line.startswith("openssh-client") for line in system)
    assert not any(re.match(r"numactl|util-linux|hwloc|nvidia", line) for line in system)
    # nvidia-ml-py is a target-side option, never an EE dependency.
    assert not any(line.lower().startswith("nvidia-ml-py") for line in python)


def test_builder_create_on_the_example(tarball, tmp_path):
    example = ROOT / "docs" / "execution-environment.yml"
    definition = yaml.safe_load(example.read_text())
    assert definition["version"] == 3
    # The example names the tarball of the collection's current version.
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    assert tarball.name == f"numafleet-tuning-{version}.tar.gz"
    sources = [entry["src"] for entry in definition["additional_build_files"]]
    assert tarball.name in sources
    assert definition["dependencies"]["galaxy"]["collections"] == [
        {"name": f"/build/collections/{tarball.name}", "type": "file"}
    ]
    # The tested ansible-core pin (requirements-dev.txt).
    pin = next(
        line.strip()
        for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("ansible-core==")
    )
    assert definition["dependencies"]["ansible_core"]["package_pip"] == pin

    work = tmp_path / "ee"
    work.mkdir()
    shutil.copy(example, work / example.name)
    shutil.copy(ROOT / "docs" / "ansible-large-fleet.cfg", work)
    shutil.copy(tarball, work)
    context = work / "context"
    _run(
        [
            _tool("ansible-builder"),
            "create",
            "-f",
            example.name,
            "-c",
            str(context),
            "--output-filename",
            "Containerfile",
        ],
        work,
    )
    containerfile = (context / "Containerfile").read_text()
    build = context / "_build"
    assert (build / "collections" / tarball.name).read_bytes() == tarball.read_bytes()
    assert yaml.safe_load((build / "requirements.yml").read_text()) == {
        "collections": [{"name": f"/build/collections/{tarball.name}", "type": "file"}]
    }
    assert f'ANSIBLE_INSTALL_REFS="{pin} ansible-runner"' in containerfile
    assert "ansible-galaxy collection install" in containerfile
    # The build introspects the installed collections (meta/execution-environment.yml) and
    # installs what it finds: bindep.txt's packages and requirements.txt's Python packages.
    assert "introspect.py introspect" in containerfile
    assert "install-from-bindep" in containerfile
    assert (build / "configs" / "ansible-large-fleet.cfg").is_file()
    assert "COPY _build/configs/ansible-large-fleet.cfg /etc/ansible/ansible.cfg" in containerfile


def test_readme_quotes_the_large_fleet_config_whole():
    readme = (ROOT / "README.md").read_text()
    marker = "<!-- docs/ansible-large-fleet.cfg, quoted whole"
    assert marker in readme
    quoted = readme.split(marker, 1)[1].split("```ini\n", 1)[1].split("```", 1)[0]
    assert quoted == (ROOT / "docs" / "ansible-large-fleet.cfg").read_text()


def test_large_fleet_config_parses(tmp_path):
    """ansible-config reads every setting of docs/ansible-large-fleet.cfg from that file."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "docs" / "ansible-large-fleet.cfg"))
    env.pop("ANSIBLE_FORKS", None)
    proc = subprocess.run(
        [_tool("ansible-config"), "dump", "--only-changed", "-t", "all"],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[WARNING]" not in proc.stderr, proc.stderr
    source = f"({ROOT / 'docs' / 'ansible-large-fleet.cfg'})"
    changed = {
        line.split("(", 1)[0]: line.split(" = ", 1)[1]
        for line in proc.stdout.splitlines()
        if source in line and " = " in line
    }
    assert changed["DEFAULT_FORKS"] == "50"
    assert changed["INJECT_FACTS_AS_VARS"] == "False"
    assert changed["DEFAULT_STRATEGY"] == "linear"
    # drift_check.yml writes its report itself: no callback to enable (issue 21).
    assert "CALLBACKS_ENABLED" not in changed
    assert changed["CACHE_PLUGIN"] == "ansible.builtin.jsonfile"
    assert changed["pipelining"] == "True"
    assert "ControlPersist=" in changed["ssh_args"]
