"""The deprecated drift_report callback: still loadable by name, writes nothing, says so once."""

from __future__ import annotations

from types import SimpleNamespace

import yaml

from ansible_collections.numafleet.tuning.plugins.callback import drift_report
from ansible_collections.numafleet.tuning.plugins.callback.drift_report import CallbackModule


def test_the_shim_warns_once_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    callback = CallbackModule()
    warned = []
    monkeypatch.setattr(callback._display, "warning", lambda msg, *a, **k: warned.append(msg))
    start = SimpleNamespace(_file_name="playbooks/drift_check.yml")
    callback.v2_playbook_on_start(start)
    callback.v2_playbook_on_start(start)
    assert warned == [drift_report.NOTICE]
    assert "writes the drift report itself" in warned[0]
    assert list(tmp_path.iterdir()) == []
    # The result hooks of the old callback are gone: nothing is collected any more.
    assert not hasattr(callback, "v2_runner_on_ok") or (
        CallbackModule.v2_runner_on_ok is drift_report.CallbackBase.v2_runner_on_ok
    )


def test_documented_as_deprecated():
    doc = yaml.safe_load(drift_report.DOCUMENTATION)
    assert doc["name"] == "drift_report" and doc["type"] == "aggregate"
    assert doc["deprecated"]["removed_in"] == "1.0.0"
    assert "options" not in doc
    assert CallbackModule.CALLBACK_NEEDS_ENABLED is True
    # One message per run, from the shim itself (no plugin_routing deprecation on top of it).
    assert "removed in 1.0.0" in drift_report.NOTICE
