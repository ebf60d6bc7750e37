"""The command line as a careless user meets it: words where numbers go, typos, flags that a
command would ignore, --help's defaults."""

from __future__ import annotations

import argparse
import errno
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MODEL_YAML, ROOT

from tfcompile.cli import _HelpFormatter, build_parser, main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["generate", "b", "--top-k", "abc"], "argument --top-k: expected a positive integer, found abc"),
        (["generate", "b", "--seed", "x"], "argument --seed: expected a seed from 0 to 2^63 - 1, found x"),
        (["generate", "b", "--top-p", "most"], "argument --top-p: expected a number in (0, 1], found most"),
        (
            ["generate", "b", "--repetition-penalty", "0"],
            "argument --repetition-penalty: expected a number in [0.01, 100], found 0",
        ),
        (
            ["serve", "b", "--port", "http"],
            "--port: expected a TCP port from 0 to 65535, found http",
        ),
        (
            ["serve", "b", "--threads", "all"],
            "--threads: expected threads from 1 to 1,024, found all",
        ),
        (
            ["serve", "b", "--max-wait-ms", "5ms"],
            "--max-wait-ms: expected milliseconds from 0 to 60,000, found 5ms",
        ),
        (
            ["export-triton", "b", "--out", "r", "--instances", "two"],
            "expected a positive integer, found two",
        ),
    ],
)
def test_a_word_where_a_number_goes_says_what_number(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "invalid" not in err and "_int" not in err, err


@pytest.mark.parametrize(
    ("target", "flags", "expected"),
    [
        ("run", ["--seed", "3"], "--seed applies to exporting a spec (random weights); {run} is a run"),
        (
            "run",
            ["--set", "model.n_layers=1", "--seed", "0"],
            "--set and --seed apply to exporting a spec (random weights); {run} is a run, exported with "
            "its own spec and checkpoint: leave them out",
        ),
        ("spec", ["--checkpoint", "best"], "--checkpoint applies to exporting a run; {spec} is a spec"),
    ],
)
def test_export_refuses_a_flag_that_its_target_would_ignore(
    target: str, flags: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--seed and --set make a spec's model, --checkpoint picks a run's: given the other kind, they
    did nothing, silently (the bundle was not the one asked for)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(MODEL_YAML)
    (run / "metrics.jsonl").write_text("")
    paths = {"run": run, "spec": ROOT / "specs" / "llama.yaml"}
    out = tmp_path / "never-written"
    assert main(["export", str(paths[target]), *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tfcompile export: error: {expected.format(**paths)}"), err
    assert err.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize(
    ("argv", "usage", "expected"),
    [
        (["validat", "s.yaml"], "usage: tfcompile [", "invalid choice: 'validat': did you mean 'validate'?"),
        (["export-trition", "b"], "usage: tfcompile [", "did you mean 'export-triton'?"),
        (["validate", "s.yaml", "--shwo"], "usage: tfcompile validate", "--shwo (did you mean --show?)"),
        (["summary", "s.yaml", "--sett", "x"], "usage: tfcompile summary", "--sett (did you mean --set?) x"),
        (["validate", "s.yaml", "extra"], "usage: tfcompile validate", "unrecognized arguments: extra"),
        (["sample", "r", "--checkpoint", "bst"], "usage: tfcompile sample", "did you mean 'best'?"),
    ],
)
def test_a_typo_names_what_was_meant_with_the_usage_of_its_command(
    argv: list[str], usage: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and expected in err, err


def test_output_piped_to_a_reader_that_leaves_is_no_error() -> None:
    """`tfcompile schema manifest | head -1`: the reader closes the pipe; tfcompile stops as a
    writer to a closed pipe does (141), without 'error: Broken pipe' or a traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tfcompile", "schema", "manifest"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before a byte is written: every write fails
    assert process.wait(timeout=60) == 141
    assert process.stderr.read() == ""


def _commands() -> dict[str, argparse.ArgumentParser]:
    [commands] = [action.choices for action in build_parser()._actions if isinstance(action.choices, dict)]
    return commands


def test_every_flag_has_help_that_states_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """--help is the manual at hand: each flag says what it does and, where it has one, its default
    (--max-new-tokens, --port, --max-queue ... said neither), and never the API key of the
    environment that is --api-key's default."""
    monkeypatch.setenv("TFCOMPILE_API_KEY", "sekrit-key")
    for name, command in _commands().items():
        for action in command._actions:
            assert action.help, (name, action.option_strings or action.dest)  # translate's TEXT had none
            if not action.option_strings or action.default is argparse.SUPPRESS:  # --help
                continue
            default = action.default
            if default is not None and default is not False and default != []:
                assert "default" in _HelpFormatter(name)._get_help_string(action), (name, action.help)
        assert "sekrit-key" not in command.format_help()
    text = " ".join(_commands()["serve"].format_help().split())
    assert "--port PORT 0 to 65535 (0: any free port) (default: 8000)" in text


def test_a_broken_pipe_that_is_not_stdouts_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every BrokenPipeError stopped the command quietly with 141 as if `| head` had left, a
    socket's or a worker's too."""
    import tfcompile.manifest

    def broken() -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(tfcompile.manifest, "manifest_schema", broken)
    assert main(["schema", "manifest"]) == 1
    assert "tfcompile schema: error: Broken pipe" in capsys.readouterr().err
