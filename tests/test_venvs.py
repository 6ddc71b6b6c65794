"""attune/core/venvs.py: the one data-directory and environment protocol, used by the plugin's launcher
(mcp_servers/launch.py) and the workload's environment (attune/control/workenv.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from attune.control import workenv
from attune.core import venvs
from mcp_servers import launch


def test_the_data_directory_is_one_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDE_PLUGIN_DATA", str(tmp_path / "plugin"))
    assert venvs.data_root() == launch.data_dir() == tmp_path / "plugin"
    assert workenv.build_dir(["torch"]).parent == tmp_path / "plugin"
    monkeypatch.delenv("CLAUDE_PLUGIN_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert launch.data_dir() == workenv.build_dir([]).parent == tmp_path / "cache" / "attune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert venvs.data_root() == tmp_path / "home" / ".cache" / "attune"


def test_ready_means_marker_and_interpreter(tmp_path: Path) -> None:
    venv = tmp_path / "venv-x"
    assert launch.is_ready is venvs.is_ready and workenv.is_ready is venvs.is_ready
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    assert not venvs.is_ready(venv)  # built, not marked: never used
    venvs.write_marker(venv, {"packages": []})
    assert venvs.is_ready(venv) and not list(venv.glob("*.tmp"))
    (venv / "bin" / "python").unlink()
    assert not venvs.is_ready(venv)


def test_failure_record_and_lock(tmp_path: Path) -> None:
    venv = tmp_path / "venv-y"
    assert venvs.read_failure(venv) is None and not venvs.is_locked(venv)
    venvs.write_failure(venv, {"step": "pip install", "detail": "exit status 1"})
    rec = venvs.read_failure(venv)
    assert rec is not None and rec["step"] == "pip install" and time.time() - rec["at"] < 60
    assert venvs.failure_path(venv) == tmp_path / "venv-y.failed.json"
    with venvs.locked(venv):
        assert venvs.is_locked(venv)
    assert not venvs.is_locked(venv)


def test_a_failed_step_is_named_and_nothing_is_marked_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv-z"
    with pytest.raises(venvs.VenvBuildError) as exc:
        venvs.create(venv, ["x"], str(tmp_path / "no-python"), time.monotonic() + 60)
    assert exc.value.step == "python3 -m venv" and exc.value.log == venvs.log_path(venv)
    assert "no-python" in venvs.log_path(venv).read_text() and not venvs.is_ready(venv)
    monkeypatch.setenv("ATTUNE_NO_UV", "1")
    monkeypatch.setattr(launch, "base_python", lambda: str(tmp_path / "no-python"))
    with pytest.raises(launch.ProvisionError, match="python3 -m venv"):  # the launcher names the same step
        launch.build(venv, ["x"], venvs.log_path(venv))
