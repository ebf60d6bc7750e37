"""Every command recognises what it was given (a spec, a study, a run, a bundle, a Hugging Face
folder, nothing) and, given the wrong kind, says what it got and the command that would work."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from tfcompile.cli import main
from tfcompile.paths import TAKES, Kind, kind_of

# The files that make each kind, as tfcompile (or transformers) writes them.
MAKES = {
    Kind.SPEC: {"spec.yaml": "model: {d_model: 8, n_layers: 1, n_heads: 2, max_seq_len: 8}\n"},
    Kind.STUDY: {"study.yaml": "base: spec.yaml\nvariants: {a: {}}\nseeds: [1]\nbudget: {steps: 1}\n"},
    Kind.RUN: {"spec.yaml": "model: {}\n", "metrics.jsonl": "", "checkpoints/last": "step-000001\n"},
    Kind.BUNDLE: {"manifest.json": "{}", "spec.yaml": "model: {}\n"},
    Kind.HF: {"config.json": "{}"},
    Kind.FOLDER: {"notes.txt": "mine"},
    Kind.FILE: {"notes.txt": "mine"},
}
# What the command line needs besides the path, by command.
EXTRA = {
    "optimize": ["--out", "o", "--fuse"],
    "classify": ["text"],
    "translate": ["text"],
    "export-triton": ["--out", "o"],
    "export-genai": ["--out", "o"],
    "export-hf": ["--out", "o"],
    "import": ["--name", "n"],
    "plot": ["--out", "o.png"],
}


def make(tmp_path: Path, kind: Kind) -> Path:
    """A path of ``kind`` under ``tmp_path``."""
    folder = tmp_path / kind.name.lower()
    for name, text in MAKES.get(kind, {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    if kind in (Kind.SPEC, Kind.STUDY, Kind.FILE):
        return folder / next(iter(MAKES[kind]))
    return folder


@pytest.mark.parametrize("kind", list(Kind))
def test_each_kind_is_recognised(tmp_path: Path, kind: Kind) -> None:
    assert kind_of(make(tmp_path, kind)) is kind


def test_the_committed_specs_and_studies_are_recognised() -> None:
    assert {kind_of(p) for p in (ROOT / "specs").glob("*.yaml")} == {Kind.SPEC}
    assert {kind_of(p) for p in (ROOT / "studies").glob("*.yaml")} == {Kind.STUDY}


def test_a_spec_too_broken_to_parse_is_still_a_spec(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_bytes(b"model: [\x00\xff\n  :: {")
    assert kind_of(broken) is Kind.SPEC


@pytest.mark.parametrize(
    ("argv", "kind", "expected"),
    [
        (
            ["train", "{path}"],
            Kind.RUN,
            "a run folder, but `train` takes a spec: continue it with `tfcompile train --resume {path}`",
        ),
        (
            ["train", "--resume", "{path}"],
            Kind.SPEC,
            "--resume {path} is a spec, but `train` takes a run "
            "folder: start a new run with `tfcompile train {path}`",
        ),
        (
            ["generate", "{path}"],
            Kind.RUN,
            "a run folder, but `generate` takes a bundle: `tfcompile sample "
            "{path}` generates from a run; `tfcompile export {path}` makes the bundle",
        ),
        (
            ["sample", "{path}"],
            Kind.BUNDLE,
            "a bundle, but `sample` takes a run folder: generate from a "
            "bundle with `tfcompile generate {path}`",
        ),
        (["export", "{path}"], Kind.BUNDLE, "it is already exported: `tfcompile verify {path} --run RUN`"),
        (["serve", "name={path}"], Kind.RUN, "export it first with `tfcompile export {path}`"),
        (["summary", "{path}"], Kind.HF, "import it first: `tfcompile import {path} --name NAME`"),
        (["validate", "{path}"], Kind.STUDY, "train its trials with `tfcompile sweep {path}`"),
        (
            ["compare", "{path}"],
            Kind.SPEC,
            "a spec, but `compare` takes a run folder or a study file or a folder of runs (a study's): "
            "compare the runs trained from it (runs/NAME), or sweep a study with `base: {path}`",
        ),
        (
            ["sweep", "{path}"],
            Kind.SPEC,
            "a spec, but `sweep` takes a study file: a study names it as its `base:`",
        ),
        (["compare", "{path}", "--out", "o"], Kind.BUNDLE, "compare the runs it was exported from"),
        (["plot", "{path}", "--out", "o.png"], Kind.STUDY, "`plot` takes a run folder"),
        (
            ["verify", "{path}"],
            Kind.MISSING,
            "nothing (no such file or folder), but `verify` takes a bundle: "
            "`tfcompile export RUN` writes a bundle",
        ),
        # The general advice led to a bundle where the command takes none.
        (
            ["import", "{path}", "--name", "x"],
            Kind.RUN,
            "`import` takes a Hugging Face model folder: `tfcompile export-hf {path} --out DIR` writes it",
        ),
        (
            ["import", "{path}", "--name", "x"],
            Kind.SPEC,
            "`import` takes a Hugging Face model folder: transformers' save_pretrained writes a folder",
        ),
        (["plot", "{path}", "--out", "o.png"], Kind.SPEC, "then plot the run it writes (runs/NAME)"),
        (["export-hf", "{path}", "--out", "o"], Kind.SPEC, "then `tfcompile export-hf runs/NAME`"),
        (
            ["serve", "{path}/spec.yaml"],
            Kind.RUN,
            "it is the spec of the run {path}: export it first with `tfcompile export {path}`",
        ),
        (
            ["plot", "{path}/spec.yaml", "--out", "o.png"],
            Kind.RUN,
            "it is the spec of the run {path}: give the run itself, {path}",
        ),
    ],
)
def test_a_path_of_the_wrong_kind_names_the_command_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], kind: Kind, expected: str
) -> None:
    path = make(tmp_path, kind)
    assert main([arg.format(path=path) for arg in argv]) == 1
    err = capsys.readouterr().err
    assert expected.format(path=path) in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_every_command_refuses_every_kind_it_does_not_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {kind: make(tmp_path, kind) for kind in Kind}
    for command, arguments in TAKES.items():
        positional = [(name, kinds) for name, kinds in arguments.items() if not name.startswith("--")]
        [(_, accepted)] = positional
        for kind in set(Kind) - set(accepted):
            assert main([command, str(paths[kind]), *EXTRA.get(command, [])]) == 1, (command, kind)
            err = capsys.readouterr().err
            assert f"{paths[kind]} is {kind.value}, but `{command}` takes" in err, err


def test_export_of_a_spec_that_takes_sizes_from_its_data_says_to_train_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = ROOT / "specs" / "quickstart.yaml"
    runs = tmp_path / "runs"
    assert main(["export", str(spec), "--set", f"train.runs_dir={runs}"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{spec} takes model.vocab_size from its data, so it has no model until it is trained: train it "
        f"first (`tfcompile train {spec}`), then `tfcompile export {runs / 'quickstart'}`"
    ) in err
    make(runs, Kind.RUN).rename(runs / "quickstart")
    assert main(["export", str(spec), "--set", f"train.runs_dir={runs}"]) == 2
    assert (
        f"its run {runs / 'quickstart'} exists: `tfcompile export {runs / 'quickstart'}`"
        in capsys.readouterr().err
    )


def test_compare_given_a_results_csv_says_to_rebuild_its_report_with_from_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.csv"
    path.write_text("variant,baseline\n")
    assert main(["compare", str(path)]) == 1
    assert f"`tfcompile compare --from-csv {path}`" in capsys.readouterr().err


def test_runs_given_no_folder_exits_as_every_command_given_the_wrong_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runs nope` exited 2 (a usage error) where `validate nope.yaml` exits 1."""
    (tmp_path / "file").write_text("x")
    for path, kind in (
        (tmp_path / "nope", "nothing (no such file or folder)"),
        (tmp_path / "file", "a regular file"),
        (make(tmp_path, Kind.BUNDLE), "a bundle"),  # these two said "no runs in", exit 0
        (make(tmp_path, Kind.HF), "a Hugging Face model folder"),
        ("", "an empty path"),  # and this listed the current folder
    ):
        assert main(["runs", str(path)]) == 1
        assert f"{path or repr('')} is {kind}, but `runs` takes a folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["validate", ""], "the path is empty, but `validate` takes a spec"),
        (["train", "--resume", ""], "--resume: the path is empty, but `train` takes a run folder"),
        (["serve", "x="], "the path is empty, but `serve` takes a bundle"),
    ],
)
def test_an_empty_path_is_named_as_empty(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    """'' was read as the current folder: "error:  is a folder that is not a tfcompile bundle"."""
    assert main(argv) == 1
    assert said in capsys.readouterr().err
