"""Studies under hostile inputs and odd data: results.csv and study.json files that compare did not
write, report folders that hold the user's files, trials a killed sweep left half-written, run
folders whose names or metrics do not fit a report, plots of one seed or of losses that are not
finite, budgets changed between sweeps, and study files whose variants collide, whose base is no
spec or whose budget is absurd. Every problem is a named error that says what to
do; the report's numbers are checked against the run folders, computed here independently."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import signal
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import rich.console
from helpers import ONE_STEP, ROOT, TINY
from PIL import Image
from safetensors import safe_open
from test_study import SPEC, folder_of, write_study

from tfcompile.cli import main
from tfcompile.spec import load_spec
from tfcompile.study.plan import Trial, plan_study
from tfcompile.study.report import CSV_FILE, PLOTS, REPORT_FILE, read_csv
from tfcompile.study.runs import TRIAL_FILE, read_run
from tfcompile.study.schema import load_study
from tfcompile.study.sweep import LocalLauncher, Outcome, Say, Sweep
from tfcompile.train.checkpoint import checkpoint_dir
from tfcompile.train.lock import RunLock

TRIALS = ["post-seed1", "pre-seed1", "post-seed2", "pre-seed2"]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny study of test_study (2 variants x 2 seeds, 4 steps), swept once."""
    path = write_study(tmp_path_factory.mktemp("study"))
    assert main(["sweep", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def report(study: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """compare's folder for the swept study."""
    out = tmp_path_factory.mktemp("report") / "report"
    assert main(["compare", str(study), "--out", str(out)]) == 0
    return out


def copy_study(study: Path, to: Path) -> Path:
    """A copy of the swept study under ``to``, to change: its study file."""
    shutil.copytree(study.parent, to, dirs_exist_ok=True)
    path = to / "study.yaml"
    path.write_text(study.read_text().replace(str(study.parent), str(to)))
    return path


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit status, stderr) of a command, which never shows a traceback."""
    capsys.readouterr()
    status = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def table(report: str) -> dict[str, dict[str, str]]:
    """report.md's table: variant -> column -> cell."""
    lines = [line for line in report.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return {row[0]: dict(zip(cells[0], row, strict=True)) for row in cells[2:]}


# ---------------------------------------------------------------------- results.csv


def edited(text: str, line: int, column: str, value: str) -> str:
    """The CSV ``text`` with the cell of ``column`` on ``line`` (1: the header) set to ``value``."""
    rows = list(csv.reader(io.StringIO(text)))
    rows[line - 1][rows[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


# (what, how the good CSV is changed, what the error says)
BAD_CSV: list[tuple[str, Callable[[str], str], str]] = [
    ("a short row", lambda t: t + "post,yes,3\n", "line 6: 3 cells, where the header has 13"),
    ("an empty loss", lambda t: edited(t, 2, "final_val_loss", ""), "line 2, final_val_loss: expected"),
    ("float parameters", lambda t: edited(t, 2, "parameters", "5633.0"), "line 2, parameters: expected"),
    ("negative parameters", lambda t: edited(t, 3, "parameters", "-5"), "line 3, parameters: expected"),
    ("5,000 digits", lambda t: edited(t, 2, "train_flops_per_token", "9" * 5000), "train_flops_per_token"),
    ("infinite wall time", lambda t: edited(t, 2, "wall_s", "inf"), "line 2, wall_s: expected"),
    ("negative tokens/s", lambda t: edited(t, 2, "tokens_per_s", "-3.0"), "line 2, tokens_per_s"),
    ("a formula", lambda t: edited(t, 2, "variant", "=cmd|' /C calc'!A0"), "line 2, variant: expected"),
    ("a pipe", lambda t: edited(t, 2, "variant", "a|b"), "line 2, variant: expected"),
    ("a new line", lambda t: edited(t, 2, "variant", "a\n| x | y |"), "line 2, variant: expected"),
    ("an empty name", lambda t: edited(t, 2, "variant", ""), "line 2, variant: expected"),
    ("a run name", lambda t: edited(t, 2, "run", "../x"), "line 2, run: expected"),
    ("a memory kind", lambda t: edited(t, 2, "memory", "a|b"), "line 2, memory: expected"),
    ("a huge cell", lambda t: edited(t, 2, "variant", "x" * 200_000), "line 2"),
    (
        "two baselines",
        lambda t: edited(edited(t, 4, "baseline", "yes"), 5, "baseline", "yes"),
        "post and pre",
    ),
    ("no baseline", lambda t: edited(edited(t, 2, "baseline", "no"), 3, "baseline", "no"), "none is marked"),
    ("half a baseline", lambda t: edited(t, 2, "baseline", "no"), "line 3, baseline: post"),
    ("a seed twice", lambda t: edited(t, 3, "seed", "1"), "post has seed 1 on lines 2 and 3"),
    ("two models", lambda t: edited(t, 3, "parameters", "9999"), "line 3, parameters: post"),
]


@pytest.mark.parametrize(("what", "change", "message"), BAD_CSV, ids=[w for w, _, _ in BAD_CSV])
def test_a_csv_compare_did_not_write_is_refused_at_its_line_and_column(
    report: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    what: str,
    change: Callable[[str], str],
    message: str,
) -> None:
    path = tmp_path / CSV_FILE
    path.write_text(change((report / CSV_FILE).read_text()))
    status, err = run_cli(["compare", "--from-csv", str(path)], capsys)
    assert status == 1
    assert message in err and str(path) in err and "tfcompile compare" in err
    assert not (tmp_path / REPORT_FILE).exists()


@pytest.mark.parametrize(
    "data",
    [b"\xff\xfe\x00binary", b"variant,baseline\n", b""],
    ids=["not UTF-8", "other columns", "empty"],
)
def test_a_file_that_is_no_results_csv_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes
) -> None:
    path = tmp_path / CSV_FILE
    path.write_bytes(data)
    status, err = run_cli(["compare", "--from-csv", str(path)], capsys)
    assert status == 1 and str(path) in err


def test_a_csv_saved_by_a_spreadsheet_with_a_byte_order_mark_and_crlf_still_reads(
    report: Path, tmp_path: Path
) -> None:
    path = tmp_path / CSV_FILE
    path.write_bytes(b"\xef\xbb\xbf" + (report / CSV_FILE).read_bytes().replace(b"\n", b"\r\n"))
    assert read_csv(path) == read_csv(report / CSV_FILE)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_loss_that_is_not_finite_is_reported_as_such_not_averaged_or_crashed(
    report: Path, tmp_path: Path, value: str
) -> None:
    """compare writes nan where a run logged no validation, and a diverged evaluation logs inf (a
    logged -inf it wrote, then refused to read back)."""
    path = tmp_path / CSV_FILE
    path.write_text(edited((report / CSV_FILE).read_text(), 2, "final_val_loss", value))
    assert main(["compare", "--from-csv", str(path)]) == 0
    rows = table((tmp_path / REPORT_FILE).read_text())
    assert rows["post"]["final val loss"] == "not finite in 1 of 2 seeds"
    assert rows["pre"]["final vs baseline"] == "-"  # no difference from a baseline without a mean


def test_tokens_and_wall_time_compare_could_not_measure_show_as_unknown(report: Path, tmp_path: Path) -> None:
    text = (report / CSV_FILE).read_text()
    for line in (2, 3):
        text = edited(edited(text, line, "tokens_per_s", "nan"), line, "wall_s", "nan")
    (tmp_path / CSV_FILE).write_text(text)
    assert main(["compare", "--from-csv", str(tmp_path / CSV_FILE)]) == 0
    post = table((tmp_path / REPORT_FILE).read_text())["post"]
    assert post["tokens/s"] == "-" and post["wall time"] == "-"


# ---------------------------------------------------------------------- study.json


SWEEP = {"command": "tfcompile sweep s.yaml", "started": "today", "seconds": 1.0}
SWEEP |= {"commit": None, "launcher": "local", "device": "CPU"}
BAD_RECORDS = [
    ("not JSON", "{", "it is not JSON"),
    ("a list", "[]", "it is not a JSON object"),
    ("a name that breaks the title", json.dumps({"name": "a\n| b |"}), "name"),
    ("a sweep without its command", json.dumps({"sweeps": [{"started": "today"}]}), "sweeps"),
    ("sweeps that are text", json.dumps({"sweeps": "abc"}), "sweeps"),
]


@pytest.mark.parametrize(("what", "text", "message"), BAD_RECORDS, ids=[w for w, _, _ in BAD_RECORDS])
def test_a_damaged_study_json_beside_the_csv_is_named_with_the_fix(
    report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, text: str, message: str
) -> None:
    shutil.copyfile(report / CSV_FILE, tmp_path / CSV_FILE)
    (tmp_path / "study.json").write_text(text)
    status, err = run_cli(["compare", "--from-csv", str(tmp_path / CSV_FILE)], capsys)
    assert status == 1 and f"{tmp_path / 'study.json'} is damaged" in err and message in err
    assert "remove it" in err


def test_a_sweeps_command_with_line_breaks_and_backticks_stays_on_its_line(
    report: Path, tmp_path: Path
) -> None:
    shutil.copyfile(report / CSV_FILE, tmp_path / CSV_FILE)
    sweep = SWEEP | {"command": "tfcompile sweep 'a\nb`c.yaml'", "device": "CPU\n# heading"}
    (tmp_path / "study.json").write_text(json.dumps({"name": "s", "sweeps": [sweep]}))
    assert main(["compare", "--from-csv", str(tmp_path / CSV_FILE)]) == 0
    text = (tmp_path / REPORT_FILE).read_text()
    assert "- `` tfcompile sweep 'a\\nb`c.yaml' ``, started today" in text
    assert "CPU\\n# heading" in text and "\n# heading" not in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trials", [{"name": "../../elsewhere", "variant": "post", "seed": 1}]),
        ("trials", [{"name": "post-seed1", "variant": "llama", "seed": 1}]),
        ("trials", None),
        ("baseline", "llama"),
        ("variants", "post"),
        ("name", None),
    ],
)
def test_a_damaged_study_json_in_a_study_folder_is_named_not_a_traceback(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object
) -> None:
    folder = folder_of(copy_study(study, tmp_path / "copy"))
    record = json.loads((folder / "study.json").read_text()) | {field: value}
    (folder / "study.json").write_text(json.dumps(record))
    status, err = run_cli(["compare", str(folder), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and f"{folder / 'study.json'} is damaged: {field}" in err
    assert "tfcompile sweep" in err and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- compare --out


def test_compare_never_writes_over_a_file_of_the_users_in_its_out_folder(
    study: Path, report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "docs"
    out.mkdir()
    (out / "report.md").write_text("my notes\n")
    (out / "notes.txt").write_text("mine\n")
    status, err = run_cli(["compare", str(study), "--out", str(out)], capsys)
    assert status == 1 and "report.md" in err and "compare did not write" in err
    assert (out / "report.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.md"]
    # From a CSV, into another folder, likewise.
    status, err = run_cli(["compare", "--from-csv", str(report / CSV_FILE), "--out", str(out)], capsys)
    assert status == 1 and "compare did not write" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.md"]


def test_compare_writes_beside_other_files_and_over_its_own_earlier_report(
    study: Path, report: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert main(["compare", str(study), "--out", str(out)]) == 0
    assert main(["compare", str(study), "--out", str(out)]) == 0  # again: its own files, rewritten
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / REPORT_FILE).read_text() == (report / REPORT_FILE).read_text()


def test_a_report_rewritten_from_plain_runs_keeps_nothing_of_the_earlier_studys(
    study: Path, tmp_path: Path
) -> None:
    """A study's report rewritten with runs that are no study: its study.json (the title and how
    it was made) would have been read into the new report."""
    out = tmp_path / "out"
    assert main(["compare", str(study), "--out", str(out)]) == 0
    runs = [str(folder_of(study) / name) for name in TRIALS]
    assert main(["compare", *runs, "--out", str(out)]) == 0
    assert not (out / "study.json").exists()
    text = (out / REPORT_FILE).read_text()
    assert text.startswith("# comparison\n") and "How it was made" not in text


def csv_alone(report: Path, folder: Path) -> Path:
    """``folder`` holding a copy of the report's results.csv and nothing else."""
    folder.mkdir()
    shutil.copyfile(report / CSV_FILE, folder / CSV_FILE)
    return folder


def test_from_csv_into_another_folder_copies_the_csv_and_drops_what_it_does_not_have(
    report: Path, tmp_path: Path
) -> None:
    bare = csv_alone(report, tmp_path / "bare")
    out = tmp_path / "out"
    assert main(["compare", "--from-csv", str(report / CSV_FILE), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {p.name for p in report.iterdir()}
    assert main(["compare", "--from-csv", str(bare / CSV_FILE), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {CSV_FILE, REPORT_FILE}  # no stale plots or study


def test_a_report_rebuilt_where_its_plots_are_not_links_only_those_there(
    report: Path, tmp_path: Path
) -> None:
    """Rebuilt from its CSV alone, it linked two images that were not beside it."""
    bare = csv_alone(report, tmp_path / "bare")
    assert main(["compare", "--from-csv", str(bare / CSV_FILE)]) == 0
    text = (bare / REPORT_FILE).read_text()
    assert "![" not in text and "The plots were not drawn here" in text and "`tfcompile compare`" in text
    shutil.copyfile(report / PLOTS["step"], bare / PLOTS["step"])
    out = tmp_path / "out"
    assert main(["compare", "--from-csv", str(bare / CSV_FILE), "--out", str(out)]) == 0
    text = (out / REPORT_FILE).read_text()
    assert f"]({PLOTS['step']})" in text and PLOTS["time"] not in text
    assert "validation loss against wall time: not drawn here" in text


def test_a_report_file_that_is_a_link_is_replaced_not_written_through(
    study: Path, report: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(report, out)
    mine = tmp_path / "mine.md"
    mine.write_text("mine\n")
    (out / REPORT_FILE).unlink()
    (out / REPORT_FILE).symlink_to(mine)
    assert main(["compare", "--from-csv", str(out / CSV_FILE)]) == 0
    assert mine.read_text() == "mine\n" and not (out / REPORT_FILE).is_symlink()


def test_an_out_that_is_a_file_is_refused(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out").write_text("mine\n")
    status, err = run_cli(["compare", str(study), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "is a file" in err and (tmp_path / "out").read_text() == "mine\n"


@pytest.mark.parametrize("text", ["{", "[]", '{"sweeps": 3}'])
def test_a_sweep_of_a_study_whose_study_json_is_damaged_says_to_remove_it(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = copy_study(study, tmp_path)
    (folder_of(path) / "study.json").write_text(text)
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "study.json is damaged: remove it" in err


# ---------------------------------------------------------------------- trials a killed sweep left


def test_a_trial_whose_last_checkpoint_was_never_committed_is_resumed_not_reported(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed between renaming its final checkpoint into place and moving ``last`` to it: the
    checkpoint is not committed (a resume starts from the one ``last`` names), so the trial is
    not finished."""
    path = copy_study(study, tmp_path)
    run = folder_of(path) / "pre-seed2"
    (checkpoint_dir(run) / "last").write_text("step-000002\n")
    assert (checkpoint_dir(run) / "step-000004").is_dir()
    assert read_run(run).state == "interrupted"
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 0 and f"{run} is not finished: left out" in err
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 0 and err.count("finished already, skipped") == 3
    assert "trial 4 of 4: pre-seed2 finished" in err and read_run(run).state == "finished"


class StopsAfterOne:
    """Trains the first trial it is given, then stops as Ctrl-C would: a sweep cut short."""

    def describe(self) -> str:
        return "local"

    def run(self, folder: Path, trials: list[tuple[int, Trial]], say: Say) -> Iterator[Outcome]:
        yield from LocalLauncher().run(folder, trials[:1], say)
        for k, trial in trials[1:2]:
            yield k, trial, {"step": 0, "interrupted": True}


def test_a_budget_raised_and_swept_only_partly_is_not_reported_as_a_mix_of_budgets(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each trial's runs/STUDY/TRIAL/spec.yaml said it was finished at its own 4 steps, so the
    report mixed them with the trial trained to the new 6 (and a CSV of one steps column)."""
    path = copy_study(study, tmp_path / "copy")
    path.write_text(path.read_text().replace("budget: {steps: 4}", "budget: {steps: 6}"))
    assert not Sweep(plan_study(load_study(path))).run(StopsAfterOne())
    folder = folder_of(path)
    assert read_run(folder / "post-seed1").step == 6 and read_run(folder / "pre-seed1").state == "finished"
    for source in (path, folder):  # the study file, or the study's folder (its study.json)
        status, err = run_cli(["compare", str(source), "--out", str(tmp_path / "out")], capsys)
        assert status == 0
        assert [(r.run, r.steps) for r in read_csv(tmp_path / "out" / CSV_FILE)] == [("post-seed1", 6)]
        for name in TRIALS[1:]:
            assert (
                f"{folder / name} was trained for 4 steps, but the study plans 6: left out; "
                f"run `tfcompile sweep {path}` again to train it on to step 6"
            ) in err
    assert main(["sweep", str(path)]) == 0
    assert main(["compare", str(path), "--out", str(tmp_path / "out")]) == 0
    assert {r.steps for r in read_csv(tmp_path / "out" / CSV_FILE)} == {6}


def test_a_budget_raised_in_the_study_file_and_not_swept_is_not_reported_as_the_new_one(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_study(study, tmp_path / "copy")
    path.write_text(path.read_text().replace("budget: {steps: 4}", "budget: {steps: 6}"))
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "no finished runs to compare" in err
    assert "was trained for 4 steps, but the study plans 6" in err and "(and 3 more)" in err
    assert not (tmp_path / "out").exists()


def test_a_budget_lowered_below_the_steps_trials_trained_is_refused(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep skipped the 4-step trials as finished for a 2-step budget, and compare reported
    them as the study's."""
    path = copy_study(study, tmp_path / "copy")
    path.write_text(path.read_text().replace("budget: {steps: 4}", "budget: {steps: 2}"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "post-seed1 was trained to step 4, past the 2 steps the study now gives" in err
    assert "another `name:`" in err
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "was trained for 4 steps, but the study plans 2" in err and "lowered" in err


def test_a_trial_killed_before_its_peak_memory_was_written_is_averaged_over_the_seeds_that_have_it(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed after its last checkpoint, before trial.json: finished, without a peak memory. The
    report showed the other seed's as the variant's without saying so."""
    path = copy_study(study, tmp_path / "copy")
    folder = folder_of(path)
    (folder / "post-seed2" / TRIAL_FILE).unlink()
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 0 and err.count("finished already, skipped") == 4
    assert (
        f"post-seed2 finished already, skipped; its peak memory was not recorded (stopped before "
        f"{TRIAL_FILE} was written)"
    ) in err and f"remove {folder / 'post-seed2'} and sweep again" in err
    assert main(["compare", str(path), "--out", str(tmp_path / "out")]) == 0
    rows = {r.run: r for r in read_csv(tmp_path / "out" / CSV_FILE)}
    assert math.isnan(rows["post-seed2"].peak_memory_mb)
    shown = table((tmp_path / "out" / REPORT_FILE).read_text())
    assert shown["post"]["peak memory"] == f"{rows['post-seed1'].peak_memory_mb:,.0f} MB (1 of 2 seeds)"
    measured = statistics.fmean(rows[name].peak_memory_mb for name in ("pre-seed1", "pre-seed2"))
    assert shown["pre"]["peak memory"] == f"{measured:,.0f} MB"


def test_a_trial_its_sweep_is_training_is_named_as_running_not_as_unfinished(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy_study(study, tmp_path / "copy")
    run = folder_of(path) / "pre-seed2"
    lock = RunLock(run, "wait")
    try:
        status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    finally:
        lock.release()
    assert status == 0 and f"{run} is running: left out; compare again when its sweep has finished it" in err


# ---------------------------------------------------------------------- runs that do not fit a report


def test_runs_of_one_name_and_seed_from_two_folders_are_not_averaged_as_two_seeds(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = folder_of(copy_study(study, tmp_path / "copy"))
    runs = [str(folder_of(study) / "post-seed1"), str(other / "post-seed1")]
    status, err = run_cli(["compare", *runs, "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "post has seed 1 twice" in err and not (tmp_path / "out").exists()


def test_runs_of_one_name_with_different_models_are_not_averaged(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = folder_of(study)
    shutil.copytree(folder / "pre-seed2", tmp_path / "post-seed2")
    runs = [str(folder / "post-seed1"), str(tmp_path / "post-seed2")]
    status, err = run_cli(["compare", *runs, "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and "model.norm.position" in err and "post-seed2" in err


@pytest.mark.parametrize("name", ["a|b-seed1", "=cmd-seed1", "a b-seed1"])
def test_a_run_folder_whose_name_is_no_run_name_is_named_not_written_into_the_report(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    shutil.copytree(folder_of(study) / "post-seed1", tmp_path / name)
    status, err = run_cli(["compare", str(tmp_path / name), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and f"{tmp_path / name}" in err and "rename" in err


def test_a_plain_run_not_finished_is_left_out_with_a_warning(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = folder_of(copy_study(study, tmp_path / "copy"))
    shutil.rmtree(checkpoint_dir(folder / "pre-seed2") / "step-000004")
    (checkpoint_dir(folder / "pre-seed2") / "last").write_text("step-000002\n")
    runs = [str(folder / name) for name in TRIALS]
    status, err = run_cli(["compare", *runs, "--out", str(tmp_path / "out")], capsys)
    assert status == 0 and f"{folder / 'pre-seed2'} is not finished: left out" in err
    assert [r.run for r in read_csv(tmp_path / "out" / CSV_FILE) if r.variant == "pre"] == ["pre-seed1"]


def test_a_finished_run_whose_metrics_lost_the_last_validation_is_named(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its final validation loss would have been an earlier step's."""
    path = copy_study(study, tmp_path / "copy")
    metrics = folder_of(path) / "post-seed1" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and str(metrics) in err and "step 4" in err


# ---------------------------------------------------------------------- the report's numbers


def test_the_reports_numbers_are_the_run_folders_computed_independently(study: Path, report: Path) -> None:
    """Parameters from the checkpoint's tensors, FLOPs per token from the model's shapes by hand,
    final and best validation loss from metrics.jsonl, and their means and sample standard
    deviations over seeds, against the table report.md shows."""
    folder = folder_of(study)
    shown = table((report / REPORT_FILE).read_text())
    finals: dict[str, list[float]] = {}
    for variant in ("post", "pre"):
        finals[variant], bests, counts = [], [], set()
        for seed in (1, 2):
            run = folder / f"{variant}-seed{seed}"
            spec = load_spec(run / "spec.yaml")
            weights = checkpoint_dir(run) / (checkpoint_dir(run) / "last").read_text().strip()
            with safe_open(str(weights / "model.safetensors"), "pt") as f:
                counts.add(sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()))  # noqa: SIM118
            records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
            losses = [r["val_loss"] for r in records if "val_loss" in r]
            finals[variant].append(losses[-1])
            bests.append(min(losses))
        m = spec.model
        d, ff, ctx = m.d_model, m.d_ff, spec.context_length
        per_token = 2 * (m.n_layers * (4 * d * d + 2 * d * ff) + d * m.vocab_size) + 4 * m.n_layers * ctx * d
        row = shown[variant]
        assert counts == {int(row["parameters"].replace(",", ""))}
        assert row["train FLOPs/token"] == f"{3 * per_token / 1e3:.2f} k"
        for column, values in (("final val loss", finals[variant]), ("best val loss", bests)):
            assert row[column] == f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"
    difference = statistics.fmean(finals["pre"]) - statistics.fmean(finals["post"])
    assert shown["pre"]["final vs baseline"].startswith(f"{difference:+.4f} (")


# ---------------------------------------------------------------------- plots of odd data


def test_plots_of_one_variant_at_one_seed_are_drawn(study: Path, tmp_path: Path) -> None:
    assert main(["compare", str(folder_of(study) / "post-seed1"), "--out", str(tmp_path)]) == 0
    for name in PLOTS.values():
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and len(image.getcolors(1 << 16) or range(100)) > 10


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_plots_of_a_run_whose_losses_are_not_finite_are_drawn_and_its_row_says_so(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    path = copy_study(study, tmp_path / "copy")
    metrics = folder_of(path) / "post-seed1" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"val_loss": 4.', f'"val_loss": {value}, "x": 4.'))
    status, err = run_cli(["compare", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 0 and "warning" not in err.lower()
    assert table((tmp_path / "out" / REPORT_FILE).read_text())["post"]["final val loss"].startswith(
        "not finite"
    )
    for name in PLOTS.values():
        with Image.open(tmp_path / "out" / name) as image:
            assert image.format == "PNG"


def test_plot_to_a_file_type_matplotlib_cannot_write_names_the_types(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = run_cli(
        ["plot", str(folder_of(study) / "post-seed1"), "--out", str(tmp_path / "x.txt")], capsys
    )
    assert status == 1 and ".png" in err and not (tmp_path / "x.txt").exists()


def test_plot_of_a_metric_the_run_never_logged_names_the_ones_it_did(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said only "logged no val_los yet", as if the run might log it later."""
    run = folder_of(study) / "post-seed1"
    status, err = run_cli(["plot", str(run), "--metric", "val_los", "--out", str(tmp_path / "x.png")], capsys)
    assert status == 1 and f"{run} logged no val_los: did you mean 'val_loss'? (it logged " in err
    assert "train_loss" in err and not (tmp_path / "x.png").exists()


def test_a_flag_in_a_record_is_no_metric(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A test stopped before it was measured records ``untested: true``: plot offered it as a
    metric and drew it as 1.0; a hand-edited elapsed_s that is not a number ended compare."""
    run = shutil.copytree(folder_of(study) / "post-seed1", tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "untested": True, "elapsed_s": "soon"}) + "\n")
    read = read_run(run)
    assert "untested" not in read.logged() and "val_loss" in read.logged() and read.curve("untested") == []
    assert math.isfinite(read.wall_s())
    status, err = run_cli(
        ["plot", str(run), "--metric", "untested", "--out", str(tmp_path / "x.png")], capsys
    )
    assert status == 1 and "logged no untested: (it logged " in err and "untested," not in err


def test_a_plot_that_cannot_be_written_names_the_file_asked_for(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error named the temporary file beside it (/proc/.x.png.6sbj9pfk.tmp)."""
    status, err = run_cli(["plot", str(folder_of(study) / "post-seed1"), "--out", "/proc/x.png"], capsys)
    assert status == 1 and "/proc/x.png" in err and ".tmp" not in err


# ---------------------------------------------------------------------- study files whose variants collide

VARIANTS = "variants:\n  post: {model.norm.position: post}\n  pre: {model.norm.position: pre}\n"
COLLIDING = [
    (
        "axes: {model.positional: [{type: rope, theta: 500}, {theta: 500, type: rope}]}\n",
        "{theta: 500, type: rope}",
        "trains the same spec as variant 'positional-rope-500'",
    ),
    (
        "variants:\n  a: {}\n  b: {model.norm.position: pre}\n",
        "b: {model.norm.position: pre}",
        "the same spec",
    ),
    ("variants:\n  Pre: {}\n  pre: {model.norm.position: post}\n", "pre: {model.norm", "differ only in case"),
    (
        "axes: {train.optimizer: [{type: adamw, lr: 0.00123456789, betas: [0.9, 0.999], weight_decay: 0.1}],"
        " model.positional: [{type: rope, theta: 500.123456789}, {type: rope, theta: 10000.12345678}],"
        " model.dropout: [{embedding: 0.1, attention: 0.1, residual: 0.1, path: 0.0}]}\n",
        "axes",
        "over 100",
    ),
]


@pytest.mark.parametrize(("new", "at", "message"), COLLIDING, ids=["reordered", "twins", "case", "long"])
def test_variants_that_collide_are_reported_at_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], new: str, at: str, message: str
) -> None:
    path = write_study(tmp_path)
    text = path.read_text().replace(VARIANTS, new)
    path.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if at in row)
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 2 and f"{path}:{line}:" in err and message in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("field", ["train.batch_size", "model.vocab_size", "model.max_seq_len"])
def test_match_parameters_adjusts_only_a_width_of_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """A field outside the model changes no count (it was accepted, and the search ran to 2^30);
    vocab_size and max_seq_len are the data's, which a matched variant would no longer fit."""
    path = write_study(tmp_path, f"match_parameters: {{field: {field}}}\n")
    path.write_text(
        path.read_text().replace("pre: {model.norm.position: pre}", "pre: {model.activation: swiglu}")
    )
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 2 and "match_parameters.field" in err and field in err and "model.d_ff" in err


# ---------------------------------------------------------------------- study files' bases and budgets


def no_spec(folder: Path) -> dict[str, Path]:
    """Paths a study's `base:` may name that are no spec, by what they are."""
    (folder / "other").mkdir()
    study = write_study(folder / "other")
    workflow = folder / "ci.yaml"
    workflow.write_text("name: CI\non: push\njobs: {}\n")
    notes = folder / "spec.txt"
    notes.write_text("model: {}\n")
    run = folder / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "spec.yaml").write_text("model: {}\n")
    return {
        "a study file": study,
        "YAML without a spec's sections": workflow,
        "a file that": notes,
        "a run": run,
    }


@pytest.mark.parametrize(
    ("what", "hint"),
    [
        ("a study file", "name the spec that study starts from"),
        ("YAML without a spec's sections", "it has jobs, name, on"),
        ("a file that", "a spec is a YAML file named .yaml or .yml"),
        ("a run", "base: {base}/spec.yaml"),
    ],
)
def test_a_base_that_is_no_spec_is_reported_at_the_studys_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, hint: str
) -> None:
    """It was read as a spec: its every line an error in its own file ("unknown field 'budget'"),
    or a YAML 1.1 complaint about a workflow's `on:`."""
    base = no_spec(tmp_path)[what]
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace(f"base: {SPEC}", f"base: {base}"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 2 and err.startswith(f"{path}:1:7: error: base: {base} is {what}")
    assert hint.format(base=base) in err and f"1 error in {path}\n" in err
    assert str(base) + ":" not in err  # nothing reported inside it
    assert not (tmp_path / "runs").exists()


BUDGETS = [
    ("{steps: 99999999999999999999}", "budget.steps: expected less than or equal to 1000000000"),
    ("{tokens: 99999999999999999999}", "budget.tokens: expected less than or equal to 1000000000000000000"),
    (
        "{tokens: 100000000000000}",
        "1,562,500,000,000 steps of 64 tokens (batch_size x grad_accum x context_length) for variant "
        "'post' (and 1 other variant), over the limit of 1,000,000,000 steps",
    ),
    ("{seconds: 1.0e+12}", "budget.seconds: expected less than or equal to 31622400"),
]


@pytest.mark.parametrize(("budget", "message"), BUDGETS, ids=["steps", "tokens", "token steps", "seconds"])
def test_a_budget_of_absurd_steps_is_refused_at_the_budget_with_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], budget: str, message: str
) -> None:
    """`budget: {tokens: 99999999999999999999}` planned 1.5e18 steps, and the sweep began them."""
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace("budget: {steps: 4}", f"budget: {budget}"))
    line = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if row.startswith("budget:"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 2 and f"{path}:{line}:" in err and message in err
    assert not (tmp_path / "runs").exists()


def test_a_wall_time_budget_whose_probe_gives_absurd_steps_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast model and a long budget: an hour at a microsecond a step would be 3.6e9 steps."""
    monkeypatch.setattr("tfcompile.study.sweep.probe", lambda spec: (1e-6, 0.0))
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace("budget: {steps: 4}", "budget: {seconds: 3600}"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "3,600,000,000 steps, over the limit of 1,000,000,000" in err
    assert not folder_of(path).exists()  # nothing trained, nothing written


@pytest.mark.parametrize("terminal", [True, False])
def test_runs_in_a_narrow_terminal_or_a_pipe_keeps_every_cell_whole(
    study: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    """An 80-column terminal cut the cells to "decod…", "finish…"."""
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda self: terminal))
    capsys.readouterr()
    status = main(["runs", str(folder_of(study))])
    out = capsys.readouterr().out
    assert status == 0 and "…" not in out
    assert all(word in out for word in ("post-seed1", "decoder", "causal_lm", "finished"))


@pytest.mark.parametrize("budget", ["steps: 4", "seconds: 5"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_probe_or_trial_stopped_by_a_signal_stops_the_sweep_with_its_status(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    budget: str,
    stop: signal.Signals,
) -> None:
    """The probe read its step times after an interrupted run as after a whole one: IndexError.
    And a sweep stopped by SIGTERM exited 130, as after Ctrl-C, where train exits 143."""
    from tfcompile.train import Trainer

    train = Trainer.train

    def interrupted(self: Trainer) -> object:
        self.stop_requested, self.stop_signal = True, stop  # as the handler does, before the first step
        return train(self)

    monkeypatch.setattr(Trainer, "train", interrupted)
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace("budget: {steps: 4}", f"budget: {{{budget}}}"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 128 + stop and "stopped; run the same command again" in err
    assert budget == "steps: 4" or not any(folder_of(path).glob("*-seed*"))  # no trial began


def test_a_variant_whose_probe_diverges_is_named_with_advice_for_a_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = "  fine: {}\n  diverging: {train.optimizer.lr: 1.0e30, train.schedule: {type: constant}}"
    path = write_study(tmp_path, variants=variants, seeds="[1]")
    path.write_text(path.read_text().replace("budget: {steps: 4}", "budget: {seconds: 5}"))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and "probe: diverging failed in the steps timed" in err
    assert "change the variant or leave it out" in err and "train.name" not in err


@pytest.mark.parametrize("steps", [0, -3, 2.5, True, "abc", None, 10**30])
def test_study_json_of_steps_that_are_none_is_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], steps: object
) -> None:
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace("budget: {steps: 4}", "budget: {seconds: 5}"))
    record = folder_of(path) / "study.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"steps": {"post": 3, "pre": steps}}))
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and f"{record} is damaged: the steps of pre are no number of steps" in err


def test_compare_refuses_runs_of_another_task(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A digits classifier's loss beside a language model's came out as +1.7325 against the
    baseline; runs of two corpora (or a study's variants of data) are compared."""
    shutil.copytree(folder_of(study) / "post-seed1", tmp_path / "runs" / "a")
    shutil.copytree(folder_of(study) / "pre-seed1", tmp_path / "runs" / "b")
    spec = tmp_path / "runs" / "b" / "spec.yaml"
    spec.write_text(spec.read_text().replace("tinyshakespeare.txt", "another.txt"))
    vit = ["train", str(ROOT / "specs" / "vit-digits.yaml"), *(f"--set={o}" for o in [*TINY, *ONE_STEP])]
    assert main([*vit, f"--set=train.runs_dir={tmp_path / 'runs'}", "--set=train.name=c"]) == 0
    status, err = run_cli(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "report")], capsys)
    assert status == 1 and "the task causal_lm and" in err and "the task image_classification:" in err
    assert not (tmp_path / "report").exists()
    shutil.rmtree(tmp_path / "runs" / "c")
    status, _ = run_cli(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "report")], capsys)
    assert status == 0


def test_a_study_and_a_run_are_never_written_one_inside_the_other(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study named as a run swept its trials into the run's folder, and a run named as a study's
    folder was written over its trials: either way `tfcompile runs` no longer listed the trials."""
    path = write_study(tmp_path)
    shutil.copytree(folder_of(study) / "post-seed1", folder_of(path))  # a run where the study goes
    status, err = run_cli(["sweep", str(path)], capsys)
    assert status == 1 and f"the study's folder {folder_of(path)} is in the run {folder_of(path)}" in err
    assert not (folder_of(path) / "study.json").exists()
    trials = folder_of(study)
    args = [
        "train",
        str(SPEC),
        "--set",
        f"train.runs_dir={trials.parent}",
        "--set",
        f"train.name={trials.name}",
    ]
    status, err = run_cli([*args, "--set", "train.steps=1"], capsys)
    assert status == 1 and f"{trials} holds runs (post-seed1, post-seed2, pre-seed1, ...: a study's" in err
    assert sorted(p.parent.name for p in trials.glob("*/spec.yaml")) == sorted(TRIALS)


def test_runs_lists_the_others_beside_a_damaged_run(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run's damaged spec.yaml ended the listing with exit 2, the others unlisted."""
    shutil.copytree(folder_of(study), tmp_path / "runs")
    (tmp_path / "runs" / "pre-seed2" / "spec.yaml").write_text("model: [")
    capsys.readouterr()
    assert main(["runs", str(tmp_path / "runs")]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if "-seed" in line}
    assert sorted(rows) == sorted(TRIALS)
    assert "damaged: " in rows["pre-seed2"] and "pre-seed2/spec.yaml:1:" in rows["pre-seed2"]
    assert all("finished" in rows[name] for name in TRIALS if name != "pre-seed2")


def test_plot_of_a_run_whose_metric_is_never_finite_says_so(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It drew empty axes and said "wrote"."""
    path = copy_study(study, tmp_path / "copy")
    run = folder_of(path) / "post-seed1"
    metrics = run / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text(
        "".join(json.dumps(r | ({"val_loss": math.nan} if "val_loss" in r else {})) + "\n" for r in lines)
    )
    status, err = run_cli(["plot", str(run), "--out", str(tmp_path / "x.png")], capsys)
    assert status == 1 and f"{run}'s val_loss is not finite at any step it logged" in err
    assert not (tmp_path / "x.png").exists()


def test_seeds_of_one_variant_trained_to_other_lengths_are_not_averaged(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 12-step and a 40-step run came out as two seeds, their spread the training length's."""
    for name in ("post-seed1", "post-seed2"):
        shutil.copytree(folder_of(study) / name, tmp_path / "runs" / name)
    longer = tmp_path / "runs" / "post-seed2"
    assert main(["train", "--resume", str(longer), "--set", "train.steps=6"]) == 0
    status, err = run_cli(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "report")], capsys)
    assert status == 1 and f"{longer} are both post, but were trained to steps 4 and 6" in err
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(("column", "value"), [("tokens_per_s", "1e400"), ("seed", "9" * 20)])
def test_a_csv_cell_past_what_compare_writes_is_refused(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, value: str
) -> None:
    assert main(["compare", str(study), "--out", str(tmp_path / "out")]) == 0
    path = tmp_path / "out" / CSV_FILE
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    rows[0][column] = value
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue())
    status, err = run_cli(["compare", "--from-csv", str(path)], capsys)
    assert status == 1 and "expected a " in err and value[:10] in err


def test_a_nan_evaluation_is_no_best_wherever_it_stands(study: Path, tmp_path: Path) -> None:
    """best_val_loss was min() over the losses: a NaN at the first evaluation made it NaN (above
    the final loss), a NaN later was skipped."""
    path = copy_study(study, tmp_path / "copy")
    metrics = folder_of(path) / "post-seed1" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    evaluated = [k for k, r in enumerate(records) if "val_loss" in r]
    finite = [records[k]["val_loss"] for k in evaluated[1:]]
    records[evaluated[0]]["val_loss"] = math.nan
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_run(metrics.parent).best() == min(finite)
    assert main(["compare", str(path), "--out", str(tmp_path / "out")]) == 0
    rows = {r.run: r for r in read_csv(tmp_path / "out" / CSV_FILE)}
    assert rows["post-seed1"].best_val_loss == min(finite) <= rows["post-seed1"].final_val_loss
