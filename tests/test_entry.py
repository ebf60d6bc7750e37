"""The command's entry point: what a user sees when Ctrl-C lands while the CLI's modules load."""

from __future__ import annotations

import importlib.abc
import os
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


# A process that joined a process group: its command prints without a newline (held in stdout's
# buffer, a pipe's) and returns 3; the entry point's status is printed on a normal exit.
GROUPED = """
import sys
import tfcompile.cli
from tfcompile.__main__ import run
from tfcompile.train import distributed

distributed._grouped = {grouped}
tfcompile.cli.main = lambda: print("finished at step 4", end="") or 3
status = run()
print(" and returned", status)
"""


@pytest.mark.parametrize(
    ("grouped", "out"), [(False, "finished at step 4 and returned 3\n"), (True, "finished at step 4")]
)
def test_a_process_that_joined_a_process_group_ends_without_finalizing(grouped: bool, out: str) -> None:
    """A gloo worker thread could drop a collective's tensor while the interpreter finalized, and
    take the GIL: std::terminate, SIGABRT after a run that had finished (end_process says how). A
    process that created a process group now ends in run() with os._exit, its output flushed."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered
    command = [sys.executable, "-c", GROUPED.format(grouped=grouped)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (3 if grouped else 0, out, "")


def test_every_way_of_joining_a_process_group_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfcompile.train import distributed

    monkeypatch.setattr(distributed, "_grouped", False)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: None)
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    distributed.join_world("cpu")  # a world of one without a group
    assert not distributed._grouped
    distributed.join_world("cpu", group_of_one=True)  # FSDP's group of one
    assert distributed._grouped
    monkeypatch.setattr(distributed, "_grouped", False)
    environment = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    distributed.join_world("cpu")  # torchrun's world
    assert distributed._grouped


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
