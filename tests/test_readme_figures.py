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


MADE = "command: `python benchmarks/{}`\ncommit: abc1234\ndevice: {}\ndate: 2026-11-23 12:00 UTC\n\n"


def test_each_compared_variant_is_a_row_against_its_baseline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    (tmp_path / "train_throughput-gpt2-b32-torchcompile-bf16-gpu.md").write_text(
        MADE.format("train_throughput.py --compare train.loss_chunk_tokens=null,8192", "GPU X")
        + "GPU X; torch.compile; bf16; batch 32 x 1024 tokens; 124 parameters\n\n"
        + "| model | tokens/s | MFU | vs baseline |\n| --- | ---: | ---: | ---: |\n"
        + "| tfcompile, loss_chunk_tokens=null | 100 | 30% | 1.000x |\n"
        + "| tfcompile, loss_chunk_tokens=8192 | 110 | 33% | 1.100x |\n"
        + "| nanoGPT-style baseline | 100 | 30% | 1.000x |\n"
    )
    rows = figures.train_throughput("train_throughput").splitlines()[2:4]
    mode = "| gpt2 | GPU X | torch.compile, bf16, loss_chunk_tokens="
    assert rows == [
        mode + "null | 32 x 1024 | 100 (MFU 30%) | 100 (30%) | 1.000x |",
        mode + "8192 | 32 x 1024 | 110 (MFU 33%) | 100 (30%) | 1.100x |",
    ]


def test_runs_matching_a_pattern_show_their_best_evaluation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    for tag, losses in [("a", "1.9 | 1.5 | 1.7"), ("b", "1.8 | 1.6 | 1.4")]:
        (tmp_path / f"train_run-tiny-{tag}-gpu.md").write_text(
            MADE.format(f"train_run.py specs/tiny.yaml --set x=1 --tag {tag}", "GPU X")
            + "| measure | value |\n| --- | ---: |\n| wall time (the whole `Trainer.train()`) | 9 s |\n"
            + f"| best validation loss | {min(losses.split(' | '))} |\n\n"
            + f"| step | 10 | 20 | 30 |\n| --- | ---: | ---: | ---: |\n| validation loss | {losses} |\n"
        )
    rows = figures.render("train_run-tiny-*-gpu").splitlines()[2:4]
    assert rows == ["| tiny | a | 1.5 | 20 | 9 s |", "| tiny | b | 1.4 | 30 | 9 s |"]
