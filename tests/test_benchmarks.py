"""The benchmark scripts start: each one's --help runs its imports and its argument parser (the
scripts themselves run for minutes, by hand, and write benchmarks/results/)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "common.py")

# One interpreter for every script: each --help exits 0 after printing its usage.
RUN = """
import contextlib, io, runpy, sys
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            assert e.code in (0, None), (script, e.code)
    assert "usage:" in out.getvalue(), (script, out.getvalue()[:200])
"""


def test_every_benchmark_script_starts() -> None:
    assert len(SCRIPTS) >= 8
    # A script without a parser would run whole on --help, and write over its results file.
    assert [p.name for p in SCRIPTS if "ArgumentParser(" not in p.read_text()] == []
    result = subprocess.run(
        [sys.executable, "-c", RUN, *map(str, SCRIPTS)],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
