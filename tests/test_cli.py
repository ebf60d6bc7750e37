"""The command line: exit codes, error output without tracebacks, the summary table, --help."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT

from tfcompile.cli import main

SPECS = ROOT / "specs"


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SPECS / "shakespeare-char.yaml")]) == 0
    assert "ok (decoder, causal_lm, 6 layers, d_model 384, 10,788,929 parameters)" in capsys.readouterr().out


def test_validate_show_prints_resolved_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SPECS / "llama.yaml"), "--show"]) == 0
    assert "d_ff: 1536" in capsys.readouterr().out


def test_validate_reports_errors_and_exits_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: 64\n  n_layer: 2\n  n_heads: 4\n  max_seq_len: 8\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3:3: error: model.n_layer: unknown field 'n_layer'" in err
    assert "did you mean 'n_layers'?" in err
    assert "Traceback" not in err


def test_summary_table_has_modules_total_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SPECS / "gpt2.yaml")]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out
    assert "blocks.11.ffn" in out and "(1, 1024, 50257)" in out
    assert "weight tied to embed" in out
    assert "FLOPs per token" in out


def test_summary_with_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SPECS / "shakespeare-char.yaml"), "--set", "model.n_layers=1"]) == 0
    assert "blocks.1" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [[], ["validate"], ["summary"], ["train"], ["sample"], ["serve"], ["export-triton"], ["export-genai"]],
)
def test_help_on_every_command(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tfcompile", *command, "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "usage: tfcompile" in result.stdout


def test_console_script_is_installed() -> None:
    result = subprocess.run(["tfcompile", "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "tfcompile" in result.stdout


def test_train_then_sample_from_the_command_line(tmp_path) -> None:
    runs = tmp_path / "runs"
    sets = [
        "model.n_layers=1",
        "model.d_model=32",
        "model.n_heads=2",
        "model.max_seq_len=32",
        "train.steps=4",
        "train.batch_size=4",
        "train.eval_interval=2",
        "train.eval_batches=1",
        f"train.runs_dir={runs}",
    ]
    args = [sys.executable, "-m", "tfcompile", "train", str(SPECS / "shakespeare-char.yaml")]
    for s in sets:
        args += ["--set", s]
    trained = subprocess.run(args, capture_output=True, text=True, check=False)
    assert trained.returncode == 0, trained.stderr
    assert "finished at step 4, best val loss" in trained.stdout
    run_dir = runs / "shakespeare-char"
    assert {"spec.yaml", "tokenizer.json", "metrics.jsonl", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()
    }

    again = subprocess.run(args, capture_output=True, text=True, check=False)
    assert again.returncode == 1 and "already holds a run" in again.stderr and "Traceback" not in again.stderr

    resumed = subprocess.run(
        [sys.executable, "-m", "tfcompile", "train", "--resume", str(run_dir), "--set", "train.steps=6"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert resumed.returncode == 0 and "finished at step 6" in resumed.stdout, resumed.stderr

    sample = [sys.executable, "-m", "tfcompile", "sample", str(run_dir), "--prompt", "ROMEO:"]
    out = subprocess.run([*sample, "--max-new-tokens", "20", "--seed", "3"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ROMEO:") and len(out.stdout) >= 26
    same = subprocess.run([*sample, "--max-new-tokens", "20", "--seed", "3"], capture_output=True, text=True)
    assert same.stdout == out.stdout

    bad = subprocess.run([*sample[:-1], "Ωmega"], capture_output=True, text=True)
    assert bad.returncode == 2 and "outside the tokenizer's vocabulary: ['Ω']" in bad.stderr
