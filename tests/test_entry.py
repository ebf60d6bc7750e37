"""The command's entry point: what a user sees when Ctrl-C lands while the CLI's modules load."""

from __future__ import annotations

import importlib.abc
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

from tfcompile.__main__ import run


class InterruptedImport(importlib.abc.MetaPathFinder):
    """Ctrl-C at the moment ``tfcompile.cli`` is imported."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "tfcompile.cli":
            raise KeyboardInterrupt


def test_ctrl_c_while_loading_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "tfcompile.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    assert run() == 130
    assert capsys.readouterr().err == "tfcompile: interrupted\n"


def test_the_installed_command_enters_through_run() -> None:
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"tfcompile": "tfcompile.__main__:run"}


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tfcompile", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("0.1.0")


def test_the_wheel_ships_the_type_hints_and_the_command(tmp_path: Path) -> None:
    """An application's type checker reads tfcompile's hints only when py.typed is installed."""
    source = tmp_path / "source"  # a copy: a build writes its build/ and egg-info beside pyproject
    shutil.copytree(ROOT / "tfcompile", source / "tfcompile", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("tfcompile-*.whl")
    with zipfile.ZipFile(wheel) as files:
        names = set(files.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "tfcompile = tfcompile.__main__:run" in files.read(entry_points).decode()
    assert "tfcompile/py.typed" in names
