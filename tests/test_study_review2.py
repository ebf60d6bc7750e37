"""Studies under a second adversarial review: a trial whose training diverges is a result, not the
end of the sweep; a finished trial trained otherwise than the study now gives it (another learning
rate, a cosine schedule stretched by a raised budget) is neither reused nor reported; a study file
is compared as its own plan even where another study swept into its folder last; and a grid of
axes too large to train is refused before it is planned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import SHARED_DATA
from test_study import SPEC
from test_study import write_study as study_file
from test_study_robustness import copy_study, run_cli

from tfcompile.cli import main
from tfcompile.spec import SpecError, load_spec
from tfcompile.study.plan import plan_study
from tfcompile.study.report import CSV_FILE, REPORT_FILE, read_csv
from tfcompile.study.runs import Run, read_run, trained_otherwise
from tfcompile.study.schema import MAX_TRIALS, load_study
from tfcompile.study.sweep import Sweep
from tfcompile.train import Trainer, TrainError

SOUND_AND_DIVERGES = "  sound: {}\n  diverges: {train.optimizer.lr: 1.0e+30, train.grad_clip: null}"


def write_study(folder: Path, variants: str = SOUND_AND_DIVERGES, body: str = "") -> Path:
    """One seed of the tiny char decoder for 2 steps: a sound variant and one that diverges."""
    return study_file(folder, body, steps=2, variants=variants, seeds="[1]")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study swept once: sound-seed1 finished, diverges-seed1 failed."""
    path = write_study(tmp_path_factory.mktemp("study"))
    assert main(["sweep", str(path)]) == 0
    return path


def test_a_trial_that_diverges_is_recorded_as_failed_and_the_sweep_trains_the_others(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trainer's error ended the sweep at the diverging trial, every time it was run again:
    the trials after it were never trained and the study could not be compared."""
    folder = study.parent / "runs" / "study"
    assert read_run(folder / "sound-seed1").state == "finished"
    failed = read_run(folder / "diverges-seed1")
    assert failed.state == "failed" and "the training loss became nan" in (failed.failure() or "")
    out = tmp_path / "out"
    status, err = run_cli(["compare", str(study), "--out", str(out)], capsys)
    assert status == 0 and f"{folder / 'diverges-seed1'} failed: the training loss became nan" in err
    report = (out / REPORT_FILE).read_text()
    assert "1 trial is left out (below)." in report
    assert f"## Left out\n\n- {folder / 'diverges-seed1'} failed: the training loss became nan" in report
    assert [r.run for r in read_csv(out / CSV_FILE)] == ["sound-seed1"]
    assert main(["compare", "--from-csv", str(out / CSV_FILE)]) == 0
    assert (out / REPORT_FILE).read_text() == report  # the left-out trials are rebuilt too


def test_a_finished_trial_trained_with_another_learning_rate_is_refused_not_reused(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the model was compared: a study whose learning rate (or batch size, or data) changed
    skipped its finished trials as finished, and compare reported them as the new study's."""
    path = copy_study(study, tmp_path)
    record = (tmp_path / "runs" / "study" / "study.json").read_text()
    path.write_text(path.read_text().replace("  sound: {}", "  sound: {train.optimizer.lr: 0.01}"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "sound-seed1 was trained otherwise than the study now gives it" in err
    assert "train.optimizer.lr (run: 0.001, spec: 0.01)" in err and "another `name:`" in err
    assert (tmp_path / "runs" / "study" / "study.json").read_text() == record  # still the trained plan
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "sound-seed1 was trained otherwise than the study gives it" in err


def test_a_study_file_is_compared_as_it_plans_not_as_another_study_in_its_folder_swept(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two study files of one name and runs_dir share a folder; compare of the first reported the
    variants the second's sweep had written into study.json."""
    path = copy_study(study, tmp_path)
    other = tmp_path / "other" / "study.yaml"
    other.parent.mkdir()
    other.write_text(path.read_text().replace("  diverges:", "  other:"))
    Sweep(plan_study(load_study(other))).trials()  # what its sweep records before training
    assert "other" in json.loads((tmp_path / "runs" / "study" / "study.json").read_text())["variants"]
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 0 and "other-seed1" not in err and "diverges-seed1 failed" in err


@pytest.mark.parametrize(
    ("schedule", "saved", "moved"),
    [
        ("{type: cosine, warmup_steps: 10}", 100, True),  # decayed: stretching it moves the rate
        ("{type: cosine, warmup_steps: 10}", 5, False),  # still warming up: the same rate
        ("{type: constant}", 100, False),  # no decay: training on is the longer trial
    ],
)
def test_a_raised_budget_trains_a_trial_on_only_where_that_is_the_longer_trial(
    schedule: str, saved: int, moved: bool
) -> None:
    """A finished trial of a cosine schedule was trained on from 100 to 200 steps with the rate
    jumping up at step 101, and reported beside trials that decayed over all 200."""
    common = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", f"train.schedule={schedule}"]
    trained = load_spec(SPEC, [*common, "train.steps=100"])
    planned = load_spec(SPEC, [*common, "train.steps=200"])
    changed = trained_otherwise(Run(Path("run"), trained, [], saved, False), planned)
    assert bool(changed) is moved
    if moved:
        assert changed[0].startswith("train.steps (run: 100, spec: 200: the cosine schedule's learning rate")


def test_a_grid_of_more_trials_than_the_limit_is_refused_at_its_axes(tmp_path: Path) -> None:
    """A grid of 4 axes of 10 values planned 20,000 variants for a minute before any error."""
    values = ", ".join(str(v) for v in range(10))
    axes = ", ".join(f"{field}: [{values}]" for field in ("a.b", "c.d", "e.f"))
    path = write_study(tmp_path, body=f"axes: {{{axes}}}")
    with pytest.raises(SpecError) as e:
        load_study(path)
    assert (
        "axes: 2,000 trials (2 variants x 10 values of a.b x 10 values of c.d x 10 values of e.f x "
        f"1 seed), over the limit of {MAX_TRIALS:,}"
    ) in str(e.value)


def test_a_failure_that_is_no_result_of_the_trial_stops_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only training's own failures (a loss or gradients not finite, out of memory) are trials'
    results; a full disk would otherwise fail every trial after it, each recorded as failed."""

    def disk_full(self: Trainer) -> None:
        raise TrainError("cannot write metrics.jsonl: No space left on device")

    monkeypatch.setattr(Trainer, "train", disk_full)
    path = write_study(tmp_path)
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "No space left on device" in err
    assert "trial 2" not in err  # the sweep stopped at the first trial
    trial = tmp_path / "runs" / "study" / "sound-seed1"
    assert read_run(trial).state != "failed"


def test_a_trial_started_again_keeps_the_files_that_are_no_run_s(tmp_path: Path) -> None:
    """A trial killed before its first checkpoint starts again: its run files go, but the whole
    folder went, a user's notes beside them too."""
    path = write_study(tmp_path, variants="  sound: {}")
    trial = tmp_path / "runs" / "study" / "sound-seed1"
    trial.mkdir(parents=True)
    (trial / "notes.txt").write_text("mine")
    (trial / "metrics.jsonl").write_text("")  # left by a start killed before its first step
    (trial / "checkpoints").mkdir()
    assert main(["sweep", str(path)]) == 0
    assert (trial / "notes.txt").read_text() == "mine"
    assert read_run(trial).state == "finished"


def test_a_baseline_with_no_finished_trial_is_named_beside_its_stand_in(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the baseline's every seed failed, the first other variant became the baseline and the
    headline did not say so."""
    path = copy_study(study, tmp_path / "copy")
    path.write_text(path.read_text() + "baseline: diverges\n")
    status, _ = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 0
    report = (tmp_path / "out" / REPORT_FILE).read_text()
    assert (
        "baseline: sound (standing in for the study's baseline, diverges, which has no finished trial)."
        in report
    )


def test_a_study_moved_elsewhere_keeps_its_finished_trials(tmp_path: Path) -> None:
    """The reuse check compared the data's absolute path, so a study copied or moved (another
    machine, another mount point) retrained every trial; which data a trial read is its file name."""
    (tmp_path / "a").mkdir()
    corpus = tmp_path / "a" / "corpus.txt"
    corpus.write_text((SHARED_DATA / "tinyshakespeare.txt").read_text()[:20_000])
    path = write_study(tmp_path / "a", variants="  sound: {}")
    path.write_text(path.read_text().replace("overrides:\n", f"overrides:\n  data.path: {corpus}\n"))
    assert main(["sweep", str(path)]) == 0
    moved = tmp_path / "b"
    (tmp_path / "a").rename(moved)
    study = moved / "study.yaml"
    study.write_text(study.read_text().replace(str(tmp_path / "a"), str(moved)))
    sweep = Sweep(plan_study(load_study(study)))
    assert all(sweep.finished(trial) for trial in sweep.trials())


def test_a_trial_whose_model_does_not_fit_is_a_result_not_the_end_of_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The memory check runs as the Trainer is made, outside run_trial's try: it stopped the sweep,
    though the README counts a model that does not fit among a trial's results."""
    from tfcompile.train import TrainingFailed
    from tfcompile.train.device import Placement

    check_fits = Placement.check_fits

    def too_big(self: Placement, spec: Any) -> None:
        if spec.model.d_model == 32:
            raise TrainingFailed("training needs at least 9 GB, more than the 8 GB free")
        check_fits(self, spec)

    monkeypatch.setattr(Placement, "check_fits", too_big)
    path = write_study(tmp_path, variants="  sound: {}\n  big: {model.d_model: 32}")
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 0 and "big-seed1 failed: training needs at least 9 GB" in err
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 0 and "big-seed1 failed: training needs at least 9 GB" in err
