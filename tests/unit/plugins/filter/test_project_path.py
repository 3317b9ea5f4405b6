"""numafleet.tuning.project_path: controller paths from the directory ansible-playbook runs in."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.filter import project_path as module
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _reports as module_reports


def test_relative_paths_are_taken_from_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert module.project_path("captures") == str(tmp_path / "captures")
    assert module.project_path("a/../b/") == str(tmp_path / "b")
    assert module.project_path("/srv/x") == "/srv/x"


def test_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert module.project_path("~/caps") == str(tmp_path / "caps")


@pytest.mark.parametrize("value", ["", "  ", None, 3, ["x"]])
def test_a_value_that_is_no_path_is_refused_naming_the_variable(value):
    with pytest.raises(AnsibleFilterError, match="numafleet_capture_dir is"):
        module.project_path(value, "numafleet_capture_dir")


def test_a_path_inside_an_installed_collection_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "ansible_collections" / "numafleet" / "tuning"
    (root / "playbooks").mkdir(parents=True)
    (root / "MANIFEST.json").write_text("{}")
    monkeypatch.setattr(module_reports, "COLLECTION_ROOT", str(root))
    monkeypatch.chdir(root / "playbooks")
    with pytest.raises(AnsibleFilterError, match="inside the installed collection"):
        module.project_path("captures", "numafleet_capture_dir")
    monkeypatch.chdir(tmp_path)
    assert module.project_path("captures") == str(tmp_path / "captures")


def test_the_filter_is_registered():
    assert module.FilterModule().filters()["project_path"] is module.project_path
