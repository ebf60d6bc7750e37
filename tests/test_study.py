"""Studies end to end on tiny shakespeare: a sweep of 2 variants x 2 seeds, its resumption, the
report, CSV and plots compare writes, run listings, and study files' located errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from PIL import Image

from tfcompile.cli import main
from tfcompile.study.plan import plan_study
from tfcompile.study.plots import PlotError, plot_runs
from tfcompile.study.report import CSV_FILE, PLOTS, REPORT_FILE, read_csv
from tfcompile.study.runs import read_run
from tfcompile.study.schema import load_study
from tfcompile.study.sweep import LAUNCHERS, Sweep
from tfcompile.train import read_metrics
from tfcompile.train.checkpoint import checkpoint_dir
from tfcompile.train.lock import RunLock

SPEC = ROOT / "specs" / "shakespeare-char.yaml"
TRIALS = ["post-seed1", "pre-seed1", "post-seed2", "pre-seed2"]  # seed by seed


POST_PRE = "  post: {model.norm.position: post}\n  pre: {model.norm.position: pre}"


def write_study(
    folder: Path, body: str = "", steps: int = 4, variants: str = POST_PRE, seeds: str = "[1, 2]"
) -> Path:
    """A study of the tiny char decoder: post- versus pre-norm, seeds 1 and 2, unless told."""
    path = folder / "study.yaml"
    path.write_text(
        f"""\
base: {SPEC}
overrides:
  model.d_model: 16
  model.n_layers: 1
  model.n_heads: 2
  model.max_seq_len: 16
  train.batch_size: 4
  train.eval_interval: 2
  train.eval_batches: 1
  train.log_interval: 2
  train.checkpoint_interval: 2
variants:
{variants}
seeds: {seeds}
budget: {{steps: {steps}}}
runs_dir: {folder / "runs"}
{body}"""
    )
    return path


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study file, swept once."""
    path = write_study(tmp_path_factory.mktemp("study"))
    assert main(["sweep", str(path)]) == 0
    return path


def folder_of(study: Path) -> Path:
    return study.parent / "runs" / "study"


def test_a_sweep_trains_every_variant_at_every_seed_as_ordinary_runs(study: Path) -> None:
    folder = folder_of(study)
    record = json.loads((folder / "study.json").read_text())
    assert [t["name"] for t in record["trials"]] == TRIALS
    assert record["baseline"] == "post" and record["sweeps"][0]["seconds"] is not None
    for name in TRIALS:
        run = read_run(folder / name)
        assert run.state == "finished" and run.step == 4
        assert run.spec.train.seed == int(name[-1])
        assert run.spec.train.eval_seed == 1  # every trial evaluates on the same batches
        assert run.trial()["peak_memory_bytes"] > 0


def test_compare_writes_report_csv_and_plots_and_rebuilds_the_report_from_the_csv(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert main(["compare", str(study), "--out", str(out)]) == 0
    rows = read_csv(out / CSV_FILE)
    assert [(r.variant, r.seed) for r in rows] == [("post", 1), ("post", 2), ("pre", 1), ("pre", 2)]
    assert all(r.steps == 4 and r.wall_s > 0 and r.train_flops_per_token > 0 for r in rows)
    report = (out / REPORT_FILE).read_text()
    assert "| post |" in report and "| baseline |" in report and "noise)" in report
    assert "tfcompile sweep" in report  # how it was made
    for name in PLOTS.values():
        with Image.open(out / name) as image:
            assert image.format == "PNG"
            assert image.size[0] >= 600 and image.size[1] >= 400
            assert len(image.getcolors(1 << 16) or range(100)) > 10  # drawn, not blank
    # The committed CSV (and study.json, and the plots it links) rebuild the report exactly.
    committed = tmp_path / "committed"
    committed.mkdir()
    for name in (CSV_FILE, "study.json", *PLOTS.values()):
        shutil.copyfile(out / name, committed / name)
    rebuilt = tmp_path / "rebuilt"
    assert main(["compare", "--from-csv", str(committed / CSV_FILE), "--out", str(rebuilt)]) == 0
    assert (rebuilt / REPORT_FILE).read_text() == report


def test_compare_groups_plain_runs_by_name_without_their_seed(study: Path, tmp_path: Path) -> None:
    folder = folder_of(study)
    runs = [str(folder / name) for name in ("pre-seed1", "pre-seed2", "post-seed1")]
    assert main(["compare", *runs, "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / CSV_FILE)
    assert [(r.variant, r.baseline) for r in rows] == [("pre", True), ("pre", True), ("post", False)]
    assert "one seed: no spread" in (tmp_path / REPORT_FILE).read_text()


def test_a_resumed_sweep_skips_finished_trials_and_continues_the_others(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(study.parent, tmp_path, dirs_exist_ok=True)  # the swept study, to change
    path = tmp_path / "study.yaml"
    path.write_text(study.read_text().replace(str(study.parent), str(tmp_path)))
    folder = folder_of(path)
    # post-seed2 interrupted after step 2 (its last checkpoint); pre-seed2 killed before its first.
    checkpoints = checkpoint_dir(folder / "post-seed2")
    shutil.rmtree(checkpoints / "step-000004")
    for pointer in ("last", "best"):
        (checkpoints / pointer).write_text("step-000002\n")
    shutil.rmtree(checkpoint_dir(folder / "pre-seed2"))
    finished = {n: (folder / n / "metrics.jsonl").stat().st_mtime_ns for n in TRIALS[:2]}
    capsys.readouterr()
    assert main(["runs", str(folder)]) == 0
    listing = capsys.readouterr().out
    assert listing.count("finished") == 2 and listing.count("interrupted") == 2

    assert main(["sweep", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.count("finished already, skipped") == 2
    assert "trial 3 of 4: post-seed2 finished" in err and "trial 4 of 4: pre-seed2 finished" in err
    assert {n: (folder / n / "metrics.jsonl").stat().st_mtime_ns for n in TRIALS[:2]} == finished
    assert all(read_run(folder / n).state == "finished" for n in TRIALS)
    assert [r["step"] for r in read_metrics(folder / "post-seed2")] == [
        2,
        4,
    ]  # resumed at 2: the records past it written once


def test_plot_draws_runs_to_a_png(study: Path, tmp_path: Path) -> None:
    folder = folder_of(study)
    out = tmp_path / "curves.png"
    assert (
        main(
            ["plot", str(folder / "post-seed1"), str(folder / "pre-seed1"), "--out", str(out), "--x", "time"]
        )
        == 0
    )
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (800, 500)
    before = out.read_bytes()  # a file there may be the user's: replaced only with --force
    assert main(["plot", str(folder / "pre-seed1"), "--out", str(out)]) == 1
    assert out.read_bytes() == before
    assert main(["plot", str(folder / "pre-seed1"), "--out", str(out), "--force"]) == 0
    assert out.read_bytes() != before
    folder_named_png = tmp_path / "x.png"  # the error named the write's temporary file
    folder_named_png.mkdir()
    with pytest.raises(PlotError, match=r"--out .*x\.png is a folder: name a file in it"):
        plot_runs([folder / "pre-seed1"], folder_named_png)


def test_matching_parameters_sets_each_variants_width_within_the_tolerance(tmp_path: Path) -> None:
    body = "match_parameters: {field: model.d_ff}\n"
    path = (
        write_study(tmp_path, body)
        .read_text()
        .replace("model.norm.position: pre", "model.activation: swiglu")
    )
    (tmp_path / "study.yaml").write_text(path)
    plan = plan_study(load_study(tmp_path / "study.yaml"))
    counts = {v.label: v.spec.parameter_count() or 0 for v in plan.variants}
    assert abs(counts["pre"] - counts["post"]) <= 0.02 * counts["post"]
    widths = {v.label: v.spec.model.d_ff for v in plan.variants}
    assert widths["pre"] < widths["post"]  # SwiGLU's three matrices: a narrower hidden layer


def test_a_token_budget_sets_the_steps(tmp_path: Path) -> None:
    text = write_study(tmp_path).read_text().replace("budget: {steps: 4}", "budget: {tokens: 1000}")
    (tmp_path / "study.yaml").write_text(text)
    plan = plan_study(load_study(tmp_path / "study.yaml"))
    assert {v.spec.train.steps for v in plan.variants} == {16}  # ceil(1000 / (4 x 16))


def test_a_wall_time_budget_probes_each_variant_once_and_keeps_its_steps(tmp_path: Path) -> None:
    text = write_study(tmp_path).read_text().replace("budget: {steps: 4}", "budget: {seconds: 2}")
    (tmp_path / "study.yaml").write_text(text)
    sweep = Sweep(plan_study(load_study(tmp_path / "study.yaml")))
    steps = {t.variant: t.spec.train.steps for t in sweep.trials()}
    assert set(steps) == {"post", "pre"} and all(s >= 1 for s in steps.values())
    recorded = json.loads((folder_of(tmp_path / "study.yaml") / "study.json").read_text())["steps"]
    assert recorded == steps
    again = Sweep(plan_study(load_study(tmp_path / "study.yaml")))
    assert {t.variant: t.spec.train.steps for t in again.trials()} == steps  # no second probe


BAD = [
    ("budget: {steps: 4}", "budget: {steps: 4, seconds: 5}", "give exactly one of steps, tokens and seconds"),
    ("pre: {model.norm.position: pre}", "pre: {model.activaton: gelu}", "unknown field 'activaton'"),
    ("pre: {model.norm.position: pre}", "pre: {model.n_heads: 3}", "must be divisible by n_heads"),
    ("seeds: [1, 2]", "seeds: [1, 1]", "each seed once"),
    ("seeds: [1, 2]", "seeds: [1, 2]\nbaseline: llama", "the baseline must be one of the variants"),
    ("model.d_model: 16", "train.seed: 3", "train.seed is set by the study"),
    ("variants:", "variantz:", "unknown field 'variantz'"),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD, ids=[m for _, _, m in BAD])
def test_a_study_file_with_a_mistake_is_reported_at_its_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, message: str
) -> None:
    path = write_study(tmp_path)
    text = path.read_text().replace(old, new)
    path.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if new.splitlines()[-1] in row)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}:" in err and message in err
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written


def test_a_missing_base_spec_is_reported_at_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace(str(SPEC), "nowhere.yaml"))
    assert main(["sweep", str(path)]) == 2
    assert f"{path}:1:" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sweep_runs_its_trials_as_tasks_on_a_local_ray_instance(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    path = write_study(tmp_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert Sweep(plan_study(load_study(path))).run(LAUNCHERS["ray"](None))
    finally:
        ray.shutdown()
    folder = folder_of(path)
    for name in TRIALS:
        run = read_run(folder / name)
        assert run.state == "finished" and run.trial()["peak_memory_bytes"] > 0
    assert "ray" in json.loads((folder / "study.json").read_text())["sweeps"][0]["launcher"]


def test_a_run_whose_lock_a_process_holds_is_listed_as_running(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = folder_of(study)
    lock = RunLock(folder / "pre-seed1", "wait")
    try:
        assert read_run(folder / "pre-seed1").state == "running"
        assert main(["runs", str(folder)]) == 0
        assert capsys.readouterr().out.count("running") == 1
    finally:
        lock.release()
    assert read_run(folder / "pre-seed1").state == "finished"


@pytest.mark.parametrize(
    ("module", "command", "extra"),
    [
        ("matplotlib.figure", ["plot", "{run}", "--out", "{tmp}/x.png"], "tfcompile[study]"),
        ("ray", ["sweep", "{study}", "--launcher", "ray"], "tfcompile[ray]"),
    ],
)
def test_without_an_optional_extra_the_command_names_it(
    study: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    command: list[str],
    extra: str,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import` then fails, as when it is not installed
    shutil.copytree(study.parent, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "study.yaml"
    path.write_text(study.read_text().replace(str(study.parent), str(tmp_path)))
    shutil.rmtree(folder_of(path) / "pre-seed2")  # a trial left to train
    names = {"run": str(folder_of(path) / "pre-seed1"), "tmp": str(tmp_path), "study": str(path)}
    assert main([part.format(**names) for part in command]) == 1
    err = capsys.readouterr().err
    assert extra in err and "Traceback" not in err


def test_a_sweep_of_a_study_changed_since_its_trials_ran_is_refused(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(study.parent, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "study.yaml"
    path.write_text(
        study.read_text().replace(str(study.parent), str(tmp_path)).replace("d_model: 16", "d_model: 24")
    )
    assert main(["sweep", str(path)]) == 1
    err = capsys.readouterr().err
    assert "model.d_model (run: 16, spec: 24)" in err and "another `name:`" in err


def test_trials_of_different_seeds_evaluate_on_the_same_batches(tmp_path: Path) -> None:
    from tfcompile.spec import load_spec
    from tfcompile.train import Trainer

    def validation(seed: int, eval_seed: int) -> list[torch.Tensor]:
        sets = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=16"]
        sets += [f"train.seed={seed}", f"train.eval_seed={eval_seed}", f"train.runs_dir={tmp_path}"]
        trainer = Trainer(load_spec(SPEC, sets), tmp_path / f"run-{seed}-{eval_seed}", show_progress=False)
        try:
            return [b["input_ids"] for b in trainer.batches.validation()]
        finally:
            trainer.batches.close()
            trainer.lock.release()

    same = validation(1, 1)
    assert all(torch.equal(a, b) for a, b in zip(same, validation(2, 1), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(same, validation(2, 2), strict=True))


@pytest.mark.parametrize("name", ["vaswani-to-llama", "positions"])
def test_the_committed_report_is_its_committed_csv(tmp_path: Path, name: str) -> None:
    report = ROOT / "reports" / name
    assert main(["compare", "--from-csv", str(report / CSV_FILE), "--out", str(tmp_path)]) == 0
    assert (tmp_path / REPORT_FILE).read_text() == (report / REPORT_FILE).read_text()
