"""The code base stays ruff clean: a lint failure fails the suite, as in CI."""

import shutil
import subprocess

from helpers import ROOT


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    assert ruff, "ruff is missing: install the dev extra (pip install -e '.[dev]')"
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
