"""``tfcompile compare``: trials (a study's, or any runs) -> results.csv (one row per trial),
report.md (one row per variant: means and standard deviations over seeds) and the plots.

The report's table is computed from results.csv as written (floats keep every digit), so that
``compare --from-csv results.csv`` rebuilds report.md exactly: the CSV is what a report commits.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import re
import shlex
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcompile.data import DataError
from tfcompile.errors import UserError
from tfcompile.files import NotWhatWeWrote, atomic_write_bytes, atomic_write_text, read_small_text
from tfcompile.paths import YAML_SUFFIXES, Kind, kind_of
from tfcompile.spec.schema import RUN_NAME, is_run_name
from tfcompile.study.runs import (
    MEMORY_KINDS,
    Run,
    find_runs,
    is_number,
    read_run,
    recorded_failure,
    trained_otherwise,
)
from tfcompile.study.sweep import STUDY_RECORD, is_steps, plan_record
from tfcompile.train.metrics import METRICS_FILE
from tfcompile.train.runs import model_differences

if TYPE_CHECKING:
    from tfcompile.spec import Spec
    from tfcompile.study.plan import Plan, Trial

CSV_FILE = "results.csv"
REPORT_FILE = "report.md"
PLOTS = {"step": "val_loss_steps.png", "time": "val_loss_time.png"}
OUTPUTS = (CSV_FILE, REPORT_FILE, *PLOTS.values(), STUDY_RECORD)  # what compare writes to --out
SEED_SUFFIX = re.compile(r"-seed(-?\d+)$")
# A variant's name in a report: a study's variant, or a run's name less -seedN, after the study's
# name when several studies are compared.
VARIANT = re.compile(rf"(?:{RUN_NAME.pattern}/)?{RUN_NAME.pattern}")


class CompareError(UserError, ValueError):
    """Nothing to compare, or a results.csv compare did not write; the message says what to give."""


@dataclass(frozen=True)
class TrialRow:
    """One trial in results.csv."""

    variant: str
    baseline: bool  # of the variant the others are compared with
    seed: int
    run: str
    parameters: int
    train_flops_per_token: int  # forward and backward, at the run's context length
    steps: int
    final_val_loss: float
    best_val_loss: float
    tokens_per_s: float  # the median of the logged windows
    peak_memory_mb: float  # nan where the run did not record it (outside a study)
    memory: str  # of what: "process RSS" or "CUDA allocated"
    wall_s: float  # training loop seconds over every process that trained it

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


@dataclass(frozen=True)
class LeftOut:
    """A run compare leaves out of the report, why, and what would bring it in."""

    path: Path
    why: str  # "is not finished", "was trained for 4 steps, but the study plans 8"
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.path} {self.why}: left out" + (f"; {self.fix}" if self.fix else "")

    def report(self) -> str:
        """As report.md lists it: the run and why, the fix being the command's to tell."""
        return f"{self.path} {self.why}"


@dataclass(frozen=True)
class Trials:
    """Runs grouped by variant, in the order the report shows them; the first is the baseline
    unless a study names another."""

    runs: dict[str, list[Run]]
    baseline: str
    record: dict[str, Any]  # the study's study.json (its sweeps' commands and machines), or {}
    missing: list[LeftOut]  # runs not finished, or trained for other steps than their study plans


# ---------------------------------------------------------------------- collecting


def collect(sources: Sequence[Path]) -> Trials:
    """The finished runs of studies (their folders or study files) and of run folders."""
    groups: dict[str, list[Run]] = {}
    baseline: str | None = None
    record: dict[str, Any] = {}
    missing: list[LeftOut] = []
    studies = {source: _study_folder(source) for source in sources}
    count = sum(found is not None for found in studies.values())
    for source, study in studies.items():
        if study is not None:
            folder, planned, specs = study
            # A study file's own plan, whatever study swept into its folder last.
            found = _read_record(folder / STUDY_RECORD, study=True) | planned
            prefix = f"{found['name']}/" if count > 1 else ""
            labels = [prefix + v for v in found["variants"]]
            baseline = baseline or prefix + found["baseline"]
            record = found if count == 1 else {}
            for label in labels:
                groups.setdefault(label, [])
            sweep = f"`tfcompile sweep {_study_argument(source, found)}`"
            for trial in found["trials"]:
                path = folder / trial["name"]
                run = read_run(path) if (path / "spec.yaml").exists() else None
                steps, spec = trial.get("steps"), specs.get(trial["name"])
                try:
                    changed = trained_otherwise(run, spec) if run is not None and spec is not None else []
                except DataError as e:  # its data.json: what it read cannot be told
                    changed = [str(e)]
                if run is not None and run.running:
                    missing.append(
                        LeftOut(path, "is running", "compare again when its sweep has finished it")
                    )
                elif changed:
                    missing.append(
                        LeftOut(
                            path,
                            f"was trained otherwise than the study gives it ({', '.join(changed)})",
                            "give the changed study another `name:` (or remove the run) and sweep it",
                        )
                    )
                elif (run is None or run.state == "failed") and (failure := recorded_failure(path)):
                    # (a trial that failed as it was set up wrote no spec: no run to read)
                    missing.append(LeftOut(path, f"failed: {failure}", f"run {sweep} again to try it again"))
                elif run is None or run.state != "finished":
                    missing.append(LeftOut(path, "is not finished", f"run {sweep} again to finish it"))
                elif steps is not None and run.planned != steps:
                    missing.append(_planned_otherwise(run, steps, sweep))
                else:
                    groups[prefix + trial["variant"]].append(run)
        else:
            paths = find_runs(source) if source.is_dir() else []
            if not paths:
                raise CompareError(f"{source} is not a run, a folder of runs, a study folder or a study file")
            for path in paths:
                if not is_run_name(path.name):
                    raise CompareError(
                        f"{path}: a run's folder name names its variant in the report: ASCII letters, "
                        f"digits, '.', '_' and '-', from a letter or digit: rename the folder"
                    )
                run = read_run(path)
                if run.state != "finished":
                    missing.append(LeftOut(path, f"is {'running' if run.running else 'not finished'}"))
                else:
                    groups.setdefault(SEED_SUFFIX.sub("", path.name), []).append(run)
    groups = {label: runs for label, runs in groups.items() if runs}
    for label, runs in groups.items():
        _check_group(label, runs)
    if not groups:
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CompareError(f"no finished runs to compare: {missing[0]}{more}")
        raise CompareError("no finished runs to compare: finish the sweep first (run it again to resume)")
    _check_comparable(groups)
    if baseline not in groups:
        baseline = next(iter(groups))
    return Trials(groups, baseline, record, missing)


def _study_argument(source: Path, record: dict[str, Any]) -> str:
    """The study file as `tfcompile sweep` takes it: as given to compare, or as its sweep was."""
    study = str(source) if source.suffix in YAML_SUFFIXES else record.get("study")
    return shlex.quote(_line(study)) if isinstance(study, str) else "STUDY"


def _planned_otherwise(run: Run, steps: int, sweep: str) -> LeftOut:
    """A finished trial whose spec planned other steps than its study does: the study's budget
    changed, and the sweep that would train it to the new one was not run (to the end)."""
    why = f"was trained for {run.planned} steps, but the study plans {steps}"
    if run.planned < steps:
        return LeftOut(run.path, why, f"run {sweep} again to train it on to step {steps}")
    return LeftOut(
        run.path,
        why,
        "the study's budget was lowered since it trained: give the changed study another `name:` "
        "(or remove the run) and sweep it",
    )


def _check_comparable(groups: dict[str, list[Run]]) -> None:
    """Every run learns one task: a classifier's loss beside a language model's compares nothing
    (a study may vary its data, and runs may be compared across data sets on purpose)."""
    runs = [run for group in groups.values() for run in group]
    first = runs[0]
    for run in runs[1:]:
        if run.spec.task.type != first.spec.task.type:
            raise CompareError(
                f"{first.path} learns the task {first.spec.task.type} and {run.path} the task "
                f"{run.spec.task.type}: a report compares runs of one task; compare them apart"
            )


def _check_group(label: str, runs: list[Run]) -> None:
    """The runs of one variant are seeds of one model, each finished with its final validation."""
    seeds: dict[int, Run] = {}
    for run in runs:
        twin = seeds.setdefault(run.spec.train.seed, run)
        if twin is not run:
            raise CompareError(
                f"{label} has seed {run.spec.train.seed} twice: {twin.path} and {run.path}; give one "
                f"of them another name, or compare them apart"
            )
        changed = model_differences(
            runs[0].spec.model.model_dump(), run.spec.model.model_dump(), "model", set()
        )
        if changed:
            raise CompareError(
                f"{runs[0].path} and {run.path} are both {label}, but their models differ "
                f"({', '.join(changed)}): rename one, so that their names without -seedN differ"
            )
        if run.step != runs[0].step:
            raise CompareError(
                f"{runs[0].path} and {run.path} are both {label}, but were trained to steps {runs[0].step:,} "
                f"and {run.step:,}: seeds of one variant are compared at one length; train them to one "
                f"(train --resume RUN --set train.steps=N), or compare them apart"
            )
        curve = run.curve("val_loss")
        if not curve or curve[-1][0] != run.step:
            raise CompareError(
                f"{run.path / METRICS_FILE} has no validation loss at step {run.step}, where the run "
                f"finished: its records were lost; remove the run and train it again"
            )


def _study_folder(source: Path) -> tuple[Path, dict[str, Any], dict[str, Spec]] | None:
    """(the folder, what the study file plans as study.json records it, its trials' specs by name)
    of a study given as its folder (its study.json says what it plans: {} and {}) or its file; None
    for anything else. A YAML file that is not a study (a spec) is a CompareError that says what
    compare takes."""
    if source.is_dir():
        return (source, {}, {}) if (source / STUDY_RECORD).exists() else None
    if source.suffix not in YAML_SUFFIXES:
        return None
    from tfcompile.study.plan import plan_study
    from tfcompile.study.schema import load_study

    kind = kind_of(source)
    if kind is not Kind.STUDY:
        raise CompareError(
            f"{source} is {kind.value}, not a study file: compare takes the runs trained from it, or a "
            f"study with `base: {source}` after `tfcompile sweep STUDY`"
        )
    plan = plan_study(load_study(source))
    if not (plan.folder / STUDY_RECORD).exists():
        raise CompareError(
            f"{source} has no trials yet in {plan.folder}: run `tfcompile sweep {source}` first"
        )
    trials = _planned_trials(plan, plan.folder / STUDY_RECORD)
    if trials is None:
        return plan.folder, {}, {}
    return plan.folder, plan_record(plan, trials, None), {t.name: t.spec for t in trials}


def _planned_trials(plan: Plan, record: Path) -> list[Trial] | None:
    """The trials the study file plans now; a wall-time budget's steps come from its sweep's
    probe (study.json), and without them nothing is planned here (None)."""
    steps = None
    if plan.study.study.budget.seconds is not None:
        with contextlib.suppress(OSError, ValueError):
            steps = json.loads(read_small_text(record)).get("steps")
        labels = {v.label for v in plan.variants}
        if not isinstance(steps, dict) or not labels <= steps.keys():
            return None
        if not all(is_steps(steps[label]) for label in labels):
            return None
    return plan.trials(steps)


def trial_rows(trials: Trials) -> list[TrialRow]:
    from tfcompile.summary import forward_flops_per_token
    from tfcompile.tasks.task import build_model

    rows = []
    for variant, runs in trials.runs.items():
        for run in runs:
            spec = run.spec
            flops = 3 * forward_flops_per_token(build_model(spec), spec.model, spec.context_length)
            losses = [value for _, _, value in run.curve("val_loss")]
            best = run.best("val_loss")
            rates = [value for _, _, value in run.curve("tokens_per_s")]
            trial = run.trial()
            peak = trial.get("peak_memory_bytes")
            rows.append(
                TrialRow(
                    variant=variant,
                    baseline=variant == trials.baseline,
                    seed=spec.train.seed,
                    run=run.name,
                    parameters=spec.parameter_count() or 0,
                    train_flops_per_token=flops,
                    steps=run.step,
                    final_val_loss=losses[-1] if losses else math.nan,
                    best_val_loss=math.nan if best is None else best,
                    tokens_per_s=statistics.median(rates) if rates else math.nan,
                    peak_memory_mb=peak / 2**20 if isinstance(peak, int) else math.nan,
                    memory=str(trial.get("memory", "")),
                    wall_s=run.wall_s(),
                )
            )
    return rows


# ---------------------------------------------------------------------- results.csv


def csv_text(rows: list[TrialRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TrialRow.columns())
    for row in rows:
        writer.writerow([_cell(getattr(row, name)) for name in TrialRow.columns()])
    return out.getvalue()


def read_csv(path: Path) -> list[TrialRow]:
    """The rows of a results.csv that compare wrote; a CompareError names the line and column of
    anything else (a cell edited, or a row that contradicts another)."""
    text = _read_text(path, MAX_CSV_BYTES, "results.csv")
    columns = TrialRow.columns()
    reader = csv.reader(io.StringIO(text))
    rows: list[TrialRow] = []
    numbers: list[int] = []
    try:
        if next(reader, None) != columns:
            raise _csv_error(path, None, f"its first line is not compare's header ({','.join(columns)})")
        start = reader.line_num + 1  # a row's first line (a quoted cell may hold line breaks)
        for line in reader:
            if len(line) != len(columns):
                raise _csv_error(path, start, f"{len(line)} cells, where the header has {len(columns)}")
            cells = {
                name: _cell_value(path, start, name, text) for name, text in zip(columns, line, strict=True)
            }
            rows.append(TrialRow(**cells))
            numbers.append(start)
            start = reader.line_num + 1
    except csv.Error as e:
        raise _csv_error(path, reader.line_num, str(e)) from None
    if not rows:
        raise _csv_error(path, None, "it holds no trials")
    _check_rows(path, rows, numbers)
    return rows


MAX_CSV_BYTES = 16 << 20  # a trial's row is about 200 bytes: far more trials than any study
FIX_CSV = "results.csv is what compare writes: write it again with `tfcompile compare RUNS --out DIR`"
MEMORY_CELLS = ("", *MEMORY_KINDS)
# What each column holds, as a pattern its cells match and what the error says is expected.
CELLS: dict[str, tuple[re.Pattern[str], str]] = {
    "str": (VARIANT, "a variant's name: [study/]name of ASCII letters, digits, '.', '_' and '-'"),
    "bool": (re.compile("yes|no"), "yes or no"),
    "int": (re.compile(r"\d{1,20}"), "a whole number from 0"),
    "float": (re.compile(r"nan|\d+(\.\d*)?(e[-+]?\d+)?"), "a number from 0 that is finite, or nan"),
}
LOSS = (re.compile(r"nan|-?inf|-?\d+(\.\d*)?(e[-+]?\d+)?"), "a number, inf, -inf or nan")
RUN_CELL = (RUN_NAME, "a run's folder name: ASCII letters, digits, '.', '_' and '-'")


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'s' * (n != 1)}"


def _cell_value(path: Path, line: int, name: str, text: str) -> Any:
    """The value of the cell ``text`` of column ``name``; a CompareError says what it should be."""
    if name == "memory":
        if text not in MEMORY_CELLS:
            raise _csv_error(path, line, f"expected one of {MEMORY_CELLS}, found {_shown(text)}", name)
        return text
    kind = str(next(f.type for f in dataclasses.fields(TrialRow) if f.name == name))
    pattern, expected = {"final_val_loss": LOSS, "best_val_loss": LOSS, "run": RUN_CELL}.get(
        name, CELLS[kind]
    )
    if not pattern.fullmatch(text) or (name == "run" and ".." in text):
        raise _csv_error(path, line, f"expected {expected}, found {_shown(text)}", name)
    if kind == "bool":
        return text == "yes"
    value = {"int": int, "float": float}.get(kind, str)(text)
    finite = pattern is CELLS["float"][0]  # a loss may be inf
    if (finite and math.isinf(value)) or (kind == "int" and value >= 2**63):  # 1e400 matches the pattern
        raise _csv_error(path, line, f"expected {expected}, found {_shown(text)}", name)
    return value


def _check_rows(path: Path, rows: list[TrialRow], numbers: list[int]) -> None:
    """A variant's rows agree on the baseline and the model, its seeds differ, and one variant is
    the baseline, as compare writes them."""
    first: dict[str, tuple[TrialRow, int]] = {}
    seeds: dict[tuple[str, int], int] = {}
    for row, number in zip(rows, numbers, strict=True):
        if (row.variant, row.seed) in seeds:
            message = (
                f"{row.variant} has seed {row.seed} on lines {seeds[row.variant, row.seed]} and {number}"
            )
            raise _csv_error(path, None, message)
        seeds[row.variant, row.seed] = number
        before, line = first.setdefault(row.variant, (row, number))
        for name in ("baseline", "parameters", "train_flops_per_token"):
            if getattr(row, name) != getattr(before, name):
                message = f"{row.variant}'s {name} differs from line {line}'s: a variant's seeds share it"
                raise _csv_error(path, number, message, name)
    baselines = [variant for variant, (row, _) in first.items() if row.baseline]
    if len(baselines) != 1:
        found = f"{' and '.join(baselines)} are all marked" if baselines else "none is marked"
        raise _csv_error(path, None, f"one variant is the baseline: {found}")


def _csv_error(path: Path, line: int | None, message: str, column: str | None = None) -> CompareError:
    where = f", line {line}" if line is not None else ""
    where += f", {column}" if column is not None else ""
    return CompareError(f"{path}{where}: {message}; {FIX_CSV}")


def _read_text(path: Path, limit: int, what: str) -> str:
    """A regular file of at most ``limit`` bytes, as UTF-8 text (a spreadsheet's byte order mark and
    CRLF line ends read too); a CompareError says what else it is."""
    try:
        return read_small_text(path, limit, "utf-8-sig")
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror}") from None
    except NotWhatWeWrote as e:
        raise CompareError(f"{e}: it is not a {what} that compare wrote") from None
    except UnicodeDecodeError:
        raise CompareError(f"{path} is not UTF-8 text: it is not a {what} that compare wrote") from None


def _shown(text: str) -> str:
    """A cell as an error quotes it: repr, cut at 40 characters."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return repr(value) if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------- report.md


@dataclass(frozen=True)
class Spread:
    mean: float
    std: float  # sample standard deviation; nan for one seed
    seeds: int
    not_finite: int  # seeds whose value is nan (never evaluated) or infinite (diverged): no mean

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        bad = sum(not math.isfinite(v) for v in values)
        if bad:
            return cls(math.nan, math.nan, len(values), bad)
        std = statistics.stdev(values) if len(values) > 1 else math.nan
        return cls(statistics.fmean(values), std, len(values), 0)

    def __str__(self) -> str:
        if self.not_finite:
            return f"not finite in {self.not_finite} of {self.seeds} seed{'s' if self.seeds > 1 else ''}"
        return f"{self.mean:.4f}" if math.isnan(self.std) else f"{self.mean:.4f} ± {self.std:.4f}"


def render(rows: list[TrialRow], record: dict[str, Any], plots: Sequence[str] = tuple(PLOTS.values())) -> str:
    """report.md from the trials' rows, the study's record (its sweeps) and the names of the plots
    beside it (a report rebuilt from its CSV alone has none)."""
    variants = list(dict.fromkeys(r.variant for r in rows))
    by_variant = {v: [r for r in rows if r.variant == v] for v in variants}
    baseline = next((r.variant for r in rows if r.baseline), variants[0])
    final = {v: Spread.of([r.final_val_loss for r in rs]) for v, rs in by_variant.items()}
    seeds = sorted({len(rs) for rs in by_variant.values()})
    title = record.get("name", "comparison")
    left_out = record.get(LEFT_OUT, [])
    lines = [
        f"# {title}",
        "",
        f"{_count(len(rows), 'trial')}: {_count(len(variants), 'variant')}, "
        f"{'/'.join(map(str, seeds))} seed{'s' * (seeds != [1])} each; "
        f"baseline: {baseline}{_stand_in(baseline, record.get('baseline'))}. "
        "Losses are mean ± standard deviation over seeds (sample, n-1)."
        + (
            f" {len(left_out)} {'trial is' if len(left_out) == 1 else 'trials are'} left out (below)."
            if left_out
            else ""
        ),
        "",
        "| variant | parameters | train FLOPs/token | final val loss | best val loss "
        "| final vs baseline | tokens/s | peak memory | wall time |",
        "|---|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for variant, rs in by_variant.items():
        lines.append(
            "| "
            + " | ".join(
                [
                    variant,
                    f"{round(statistics.fmean(r.parameters for r in rs)):,}",
                    _flops(statistics.fmean(r.train_flops_per_token for r in rs)),
                    str(final[variant]),
                    str(Spread.of([r.best_val_loss for r in rs])),
                    _versus(final[variant], final[baseline]) if variant != baseline else "baseline",
                    _known([r.tokens_per_s for r in rs], "{:,.0f}"),
                    _known([r.peak_memory_mb for r in rs], "{:,.0f} MB"),
                    _known([r.wall_s for r in rs], _duration),
                ]
            )
            + " |"
        )
    memory = sorted({r.memory for r in rows if r.memory})
    lines += [
        "",
        "*final vs baseline*: the difference of mean final validation losses, *beyond noise* when it "
        "exceeds the two variants' seed standard deviations added together, else *within noise*. "
        "tokens/s: the median of a trial's logged windows, averaged over seeds; peak memory: "
        f"{', '.join(memory) or 'not recorded'}; wall time: the training loop's, evaluations included.",
        "",
        "## Validation loss",
        "",
        *_plot_lines(plots),
    ]
    if left_out:
        lines += ["", "## Left out", "", *(f"- {_line(why)}" for why in left_out)]
    sweeps = record.get("sweeps", [])
    if sweeps:
        lines += ["", "## How it was made", ""]
        for sweep in sweeps:
            spent = "unfinished" if sweep.get("seconds") is None else _duration(sweep["seconds"])
            lines += [
                f"- {_code(sweep['command'])}, started {_line(sweep['started'])}, took {spent}",
                f"  - commit {_line(sweep.get('commit') or 'unknown')}; launcher {_line(sweep['launcher'])}; "
                f"{_line(sweep['device'])}",
            ]
        lines += [f"- then `tfcompile compare` on the study's folder; `--from-csv {CSV_FILE}` rebuilds this"]
    return "\n".join(lines) + "\n"


PLOT_TITLES = {"step": "validation loss against steps", "time": "validation loss against wall time"}


def _plot_lines(plots: Sequence[str]) -> list[str]:
    """The links to the plots drawn beside the report, or why there are none to see."""
    drawn = [f"![{PLOT_TITLES[x]}]({name})" for x, name in PLOTS.items() if name in plots]
    if not drawn:
        return [
            "The plots were not drawn here: this report was rebuilt from its results.csv alone; "
            "`tfcompile compare` on the runs draws them."
        ]
    missing = [PLOT_TITLES[x] for x, name in PLOTS.items() if name not in plots]
    note = f" ({' and '.join(missing)}: not drawn here)" if missing else ""
    return [*drawn, "", f"Each line is a variant's mean over seeds, its band the seeds' range.{note}"]


def _line(text: str) -> str:
    """Text of a record kept on its Markdown line: control characters (line breaks) escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m[0])[1:-1], text)


def _code(text: str) -> str:
    """Text as one Markdown code span, fenced with more backticks than it holds in a row."""
    text = _line(text)
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if "`" in text else f"{fence}{text}{fence}"


def _stand_in(baseline: str, planned: str | None) -> str:
    """What the headline adds when the study's own baseline has no trial to compare (its every
    seed failed or is unfinished), and another variant stands in for it."""
    if planned is None or planned == baseline:
        return ""
    return f" (standing in for the study's baseline, {planned}, which has no finished trial)"


def _versus(variant: Spread, baseline: Spread) -> str:
    if variant.not_finite or baseline.not_finite:
        return "-"
    difference = variant.mean - baseline.mean
    if math.isnan(variant.std) or math.isnan(baseline.std):
        return f"{difference:+.4f} (one seed: no spread)"
    beyond = abs(difference) > variant.std + baseline.std
    return f"{difference:+.4f} ({'beyond' if beyond else 'within'} noise)"


def _flops(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def _known(values: list[float], shown: str | Callable[[float], str]) -> str:
    """The mean of the values measured (not nan: a run outside a study has no peak memory, a trial
    killed before it was written neither), with how many seeds it is of when some were not
    measured; "-" when none was."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "-"
    mean = statistics.fmean(known)
    text = shown.format(mean) if isinstance(shown, str) else shown(mean)
    return text if len(known) == len(values) else f"{text} ({len(known)} of {len(values)} seeds)"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m{s:02d}s"


# ---------------------------------------------------------------------- the commands


def compare(sources: Sequence[Path], out: Path) -> tuple[Path, list[LeftOut]]:
    """Write results.csv, the plots, study.json (when one study is compared) and report.md to
    ``out`` -> (out, the runs left out: not finished, or trained for other steps than planned)."""
    from tfcompile.study.plots import plot_variants

    trials = collect(sources)
    rows = trial_rows(trials)
    _claim(out)
    atomic_write_text(out / CSV_FILE, csv_text(rows))
    _write_record(
        out, trials.record | ({LEFT_OUT: [m.report() for m in trials.missing]} if trials.missing else {})
    )
    for x, name in PLOTS.items():
        plot_variants(trials.runs, out / name, x)
    _write_report(out / CSV_FILE, out)
    return out, trials.missing


def from_csv(path: Path, out: Path | None) -> Path:
    """Rebuild report.md from a results.csv (and the study.json beside it) into ``out`` (default:
    the CSV's folder), with the CSV and the plots beside it copied along."""
    out = out or path.parent
    read_csv(path)
    record = _read_record(path.parent / STUDY_RECORD)
    if path.parent.resolve() != out.resolve():
        _claim(out)
        atomic_write_bytes(out / CSV_FILE, path.read_bytes())
        _write_record(out, record)
        for name in PLOTS.values():
            if (path.parent / name).is_file():
                atomic_write_bytes(out / name, (path.parent / name).read_bytes())
            else:
                (out / name).unlink(missing_ok=True)  # an earlier report's: it would show other runs
    _write_report(path, out)
    return out


def _claim(out: Path) -> None:
    """Make ``out``, or check that compare may write there: a file of one of its outputs' names
    there is an earlier report's (beside compare's own results.csv), never the user's."""
    if out.exists() and not out.is_dir():
        raise CompareError(f"{out} is a file: give --out a folder (it is made when missing)")
    taken = [name for name in OUTPUTS if os.path.lexists(out / name)]
    if taken and not _is_compares(out / CSV_FILE):
        raise CompareError(
            f"{out} holds {', '.join(taken)}, which compare did not write (its own are beside a "
            f"results.csv of compare's): give --out a new folder, or move them"
        )
    out.mkdir(parents=True, exist_ok=True)


def _is_compares(path: Path) -> bool:
    """Whether ``path`` is a file (not a link) that starts with compare's header."""
    if path.is_symlink() or not path.is_file():
        return False
    with contextlib.suppress(OSError, UnicodeDecodeError), open(path, encoding="utf-8-sig") as f:
        return f.readline(1000).rstrip("\r\n") == ",".join(TrialRow.columns())
    return False


def _write_record(out: Path, record: dict[str, Any]) -> None:
    """study.json beside the report, or none: an earlier report's would name another study."""
    if record:
        atomic_write_text(out / STUDY_RECORD, json.dumps(record, indent=2) + "\n")
    else:
        (out / STUDY_RECORD).unlink(missing_ok=True)


def _write_report(csv_path: Path, out: Path) -> None:
    record = _read_record(csv_path.parent / STUDY_RECORD)
    plots = [name for name in PLOTS.values() if (out / name).is_file()]
    atomic_write_text(out / REPORT_FILE, render(read_csv(csv_path), record, plots))


# ---------------------------------------------------------------------- study.json

MAX_RECORD_BYTES = 16 << 20
LEFT_OUT = "left_out"  # in the study.json beside a report: the runs compare left out, and why
SWEEP_TEXTS = ("command", "started", "launcher", "device")  # what a report shows of a sweep


def _read_record(path: Path, study: bool = False) -> dict[str, Any]:
    """study.json as a report reads it (its name and sweeps: {} when there is none) or, of a
    study's folder (``study``), compare (its variants, baseline and trials too); a CompareError
    names what is damaged."""
    if not study and not os.path.lexists(path):
        return {}
    fix = (
        "remove it and run `tfcompile sweep` on the study again to write it (finished trials are kept)"
        if study
        else "remove it (the report then has no title or provenance), or put the study's own there"
    )

    def damaged(what: str) -> CompareError:
        return CompareError(f"{path} is damaged: {what}; {fix}")

    try:
        record = json.loads(_read_text(path, MAX_RECORD_BYTES, STUDY_RECORD))
    except ValueError:
        raise damaged("it is not JSON") from None
    if not isinstance(record, dict):
        raise damaged("it is not a JSON object")
    if (study or "name" in record) and not is_run_name(record.get("name")):
        raise damaged(f"name is {record.get('name')!r}, not a study's name")
    left_out = record.get(LEFT_OUT, [])
    if not isinstance(left_out, list) or not all(isinstance(why, str) for why in left_out):
        raise damaged(f"{LEFT_OUT} is not a list of the runs left out of the report, and why")
    sweeps = record.get("sweeps", [])
    if not isinstance(sweeps, list) or not all(_is_sweep(s) for s in sweeps):
        raise damaged(
            f"sweeps is not a list of sweeps with their {', '.join(SWEEP_TEXTS)}, commit and seconds"
        )
    if study:
        variants = record.get("variants")
        if not isinstance(variants, list) or not variants or not all(is_run_name(v) for v in variants):
            raise damaged(f"variants is {_shown(repr(variants))}, not a list of variants' names")
        if record.get("baseline") not in variants:
            raise damaged(f"baseline is {_shown(repr(record.get('baseline')))}, not one of the variants")
        trials = record.get("trials")
        if not isinstance(trials, list) or not all(_is_trial(t, variants) for t in trials):
            raise damaged(
                "trials is not a list of trials, each a run name, one of the variants, a seed and its steps"
            )
    return record


def _is_sweep(sweep: Any) -> bool:
    return (
        isinstance(sweep, dict)
        and all(isinstance(sweep.get(key), str) for key in SWEEP_TEXTS)
        and (sweep.get("commit") is None or isinstance(sweep["commit"], str))
        and (sweep.get("seconds") is None or _is_seconds(sweep["seconds"]))
    )


def _is_seconds(value: Any) -> bool:
    return is_number(value) and 0 <= value < math.inf


def _is_trial(trial: Any, variants: list[str]) -> bool:
    return (
        isinstance(trial, dict)
        and is_run_name(trial.get("name"))
        and trial.get("variant") in variants
        and type(trial.get("seed")) is int
        # Its steps as planned: an older tfcompile's study.json has none (its trials go unchecked).
        and (trial.get("steps") is None or is_steps(trial["steps"]))
    )
