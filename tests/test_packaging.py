"""onnxruntime comes from exactly one of the `cpu` and `gpu` extras, and its absence is explained."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT

tomllib = pytest.importorskip("tomllib")


def test_extras_pick_one_onnxruntime_build_and_the_base_names_neither() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("onnxruntime")]
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["cpu"]] == ["onnxruntime"]
    assert [d.split(">")[0] for d in extras["gpu"]] == ["onnxruntime-gpu"]


def _run_without_onnxruntime(code: str) -> subprocess.CompletedProcess[str]:
    # None in sys.modules makes `import onnxruntime` raise ImportError, as when it is not installed.
    prelude = "import sys; sys.modules['onnxruntime'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, cwd=ROOT, check=False
    )


def test_without_onnxruntime_the_commands_that_need_it_name_the_extras() -> None:
    spec = ROOT / "specs" / "shakespeare-char.yaml"
    result = _run_without_onnxruntime(
        "from tfcompile.cli import main\n"
        f"assert main(['summary', {str(spec)!r}]) == 0\n"
        f"sys.exit(main(['export', {str(spec)!r}, '--out', 'unused']))"
    )
    assert result.returncode == 1, result.stderr
    assert "onnxruntime is not installed" in result.stderr
    assert "tfcompile[cpu]" in result.stderr and "tfcompile[gpu]" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_onnxruntime_importing_the_runtime_raises_an_import_error_that_says_why() -> None:
    result = _run_without_onnxruntime(
        "try:\n"
        "    import tfcompile.runtime\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OnnxRuntimeMissing onnxruntime is not installed")
