"""The README's measured figures are the results files' (benchmarks/readme_figures.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import ROOT

spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
assert spec is not None and spec.loader is not None
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)


def test_the_readme_tables_are_the_results_files() -> None:
    readme = (ROOT / "README.md").read_text()
    assert figures.REGION.search(readme), "the README has no generated figures"
    assert figures.stale(readme) == [], "run `python benchmarks/readme_figures.py` and commit the README"


def test_a_figure_typed_over_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    made = "command: `python benchmarks/x.py`\ncommit: abc1234\ndevice: cpu\ndate: 2026-11-23 12:00 UTC\n\n"
    (results / "x.md").write_text(made + "| a | b |\n| --- | ---: |\n| speed | 1.5x |\n")
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    readme = figures.regenerate("text\n<!-- figures: benchmarks/results/x.md -->\n<!-- /figures -->\nmore\n")
    assert "| speed | 1.5x |" in readme and "commit abc1234, date 2026-11-23 12:00 UTC" in readme
    assert figures.stale(readme) == []
    assert figures.stale(readme.replace("1.5x", "1.7x")) == ["benchmarks/results/x.md"]


def test_every_results_file_says_how_it_was_made() -> None:
    for path in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert {"command", "commit", "device", "date"} <= set(figures.header(path.read_text())), path.name
