"""``tfcompile compare``: trials (a study's, or any runs) -> results.csv (one row per trial),
report.md (one row per variant: means and standard deviations over seeds) and the plots.

The report's table is computed from results.csv as written (floats keep every digit), so that
``compare --from-csv results.csv`` rebuilds report.md exactly: the CSV is what a report commits.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import shutil
import stat
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfcompile.errors import UserError
from tfcompile.spec.schema import RUN_NAME
from tfcompile.study.runs import MEMORY_KINDS, Run, find_runs, read_run
from tfcompile.study.sweep import STUDY_RECORD

CSV_FILE = "results.csv"
REPORT_FILE = "report.md"
PLOTS = {"step": "val_loss_steps.png", "time": "val_loss_time.png"}
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
class Trials:
    """Runs grouped by variant, in the order the report shows them; the first is the baseline
    unless a study names another."""

    runs: dict[str, list[Run]]
    baseline: str
    record: dict[str, Any]  # the study's study.json (its sweeps' commands and machines), or {}
    missing: list[str]  # trials of a study not finished, left out


# ---------------------------------------------------------------------- collecting


def collect(sources: Sequence[Path]) -> Trials:
    """The finished runs of studies (their folders or study files) and of run folders."""
    groups: dict[str, list[Run]] = {}
    baseline: str | None = None
    record: dict[str, Any] = {}
    missing: list[str] = []
    studies = [s for s in sources if _study_folder(s) is not None]
    for source in sources:
        folder = _study_folder(source)
        if folder is not None:
            found = json.loads((folder / STUDY_RECORD).read_text())
            prefix = f"{found['name']}/" if len(studies) > 1 else ""
            labels = [prefix + v for v in found["variants"]]
            baseline = baseline or prefix + found["baseline"]
            record = found if len(studies) == 1 else {}
            for label in labels:
                groups.setdefault(label, [])
            for trial in found["trials"]:
                path = folder / trial["name"]
                run = read_run(path) if (path / "spec.yaml").exists() else None
                if run is None or run.state != "finished":
                    missing.append(str(path))
                else:
                    groups[prefix + trial["variant"]].append(run)
        else:
            paths = find_runs(source) if source.is_dir() else []
            if not paths:
                raise CompareError(f"{source} is not a run, a folder of runs, a study folder or a study file")
            for path in paths:
                groups.setdefault(SEED_SUFFIX.sub("", path.name), []).append(read_run(path))
    groups = {label: runs for label, runs in groups.items() if runs}
    if not groups:
        raise CompareError("no finished runs to compare: finish the sweep first (run it again to resume)")
    if baseline not in groups:
        baseline = next(iter(groups))
    return Trials(groups, baseline, record, missing)


def _study_folder(source: Path) -> Path | None:
    """The folder of a study given as its folder or its file; None for anything else."""
    if source.is_dir():
        return source if (source / STUDY_RECORD).exists() else None
    if source.suffix not in (".yaml", ".yml"):
        return None
    from tfcompile.study.plan import plan_study
    from tfcompile.study.schema import load_study

    folder = plan_study(load_study(source)).folder
    if not (folder / STUDY_RECORD).exists():
        raise CompareError(f"{source} has no trials yet in {folder}: run `tfcompile sweep {source}` first")
    return folder


def trial_rows(trials: Trials) -> list[TrialRow]:
    from tfcompile.summary import forward_flops_per_token
    from tfcompile.tasks.task import build_model

    rows = []
    for variant, runs in trials.runs.items():
        for run in runs:
            spec = run.spec
            flops = 3 * forward_flops_per_token(build_model(spec), spec.model, spec.context_length)
            losses = [value for _, _, value in run.curve("val_loss")]
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
                    best_val_loss=min(losses, default=math.nan),
                    tokens_per_s=statistics.median(rates) if rates else math.nan,
                    peak_memory_mb=peak / 2**20 if isinstance(peak, int) else math.nan,
                    memory=str(trial.get("memory", "")),
                    wall_s=max((r["elapsed_s"] for r in run.records if "elapsed_s" in r), default=math.nan),
                )
            )
    return rows


# ---------------------------------------------------------------------- results.csv


def write_csv(rows: list[TrialRow], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(TrialRow.columns())
        for row in rows:
            writer.writerow([_cell(getattr(row, name)) for name in TrialRow.columns()])


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
    "str": (VARIANT, "a variant's name: [study/]name of letters, digits, '.', '_' and '-'"),
    "bool": (re.compile("yes|no"), "yes or no"),
    "int": (re.compile(r"\d{1,20}"), "a whole number from 0"),
    "float": (re.compile(r"nan|\d+(\.\d*)?(e[-+]?\d+)?"), "a number from 0 that is finite, or nan"),
}
LOSS = (re.compile(r"nan|inf|-?\d+(\.\d*)?(e[-+]?\d+)?"), "a number, inf or nan")
RUN_CELL = (RUN_NAME, "a run's folder name: letters, digits, '.', '_' and '-'")


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
    return {"int": int, "float": float}.get(kind, str)(text)


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
        if not stat.S_ISREG(path.stat().st_mode):
            raise CompareError(f"{path} is not a file: give the {what} that compare wrote")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > limit:
        raise CompareError(f"{path} is larger than {limit >> 20} MiB: it is not a {what} that compare wrote")
    try:
        return data.decode("utf-8-sig")
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


def render(rows: list[TrialRow], record: dict[str, Any]) -> str:
    """report.md from the trials' rows and the study's record (its sweeps)."""
    variants = list(dict.fromkeys(r.variant for r in rows))
    by_variant = {v: [r for r in rows if r.variant == v] for v in variants}
    baseline = next((r.variant for r in rows if r.baseline), variants[0])
    final = {v: Spread.of([r.final_val_loss for r in rs]) for v, rs in by_variant.items()}
    seeds = sorted({len(rs) for rs in by_variant.values()})
    title = record.get("name", "comparison")
    lines = [
        f"# {title}",
        "",
        f"{len(rows)} trials: {len(variants)} variants, {'/'.join(map(str, seeds))} seeds each; "
        f"baseline: {baseline}. Losses are mean ± standard deviation over seeds (sample, n-1).",
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
        f"![validation loss against steps]({PLOTS['step']})",
        f"![validation loss against wall time]({PLOTS['time']})",
        "",
        "Each line is a variant's mean over seeds, its band the seeds' range.",
    ]
    sweeps = record.get("sweeps", [])
    if sweeps:
        lines += ["", "## How it was made", ""]
        for sweep in sweeps:
            spent = "unfinished" if sweep.get("seconds") is None else _duration(sweep["seconds"])
            lines += [
                f"- `{sweep['command']}`, started {sweep['started']}, took {spent}",
                f"  - commit {sweep['commit'] or 'unknown'}; launcher {sweep['launcher']}; {sweep['device']}",
            ]
        lines += [f"- then `tfcompile compare` on the study's folder; `--from-csv {CSV_FILE}` rebuilds this"]
    return "\n".join(lines) + "\n"


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
    """The mean of the values measured (not nan: a run outside a study has no peak memory), or "-"."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "-"
    mean = statistics.fmean(known)
    return shown.format(mean) if isinstance(shown, str) else shown(mean)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m{s:02d}s"


# ---------------------------------------------------------------------- the commands


def compare(sources: Sequence[Path], out: Path) -> tuple[Path, list[str]]:
    """Write results.csv, the plots, study.json (when one study is compared) and report.md to
    ``out`` -> (out, the trials left out as unfinished)."""
    from tfcompile.study.plots import plot_variants

    trials = collect(sources)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(trial_rows(trials), out / CSV_FILE)
    if trials.record:
        (out / STUDY_RECORD).write_text(json.dumps(trials.record, indent=2) + "\n")
    for x, name in PLOTS.items():
        plot_variants(trials.runs, out / name, x)
    _write_report(out / CSV_FILE, out)
    return out, trials.missing


def from_csv(path: Path, out: Path | None) -> Path:
    """Rebuild report.md from a results.csv (and the study.json beside it) into ``out`` (default:
    the CSV's folder), with the plots beside the CSV copied along."""
    out = out or path.parent
    out.mkdir(parents=True, exist_ok=True)
    for name in [*PLOTS.values(), STUDY_RECORD]:
        if (path.parent / name).exists() and path.parent.resolve() != out.resolve():
            shutil.copyfile(path.parent / name, out / name)
    _write_report(path, out)
    return out


def _write_report(csv_path: Path, out: Path) -> None:
    record_path = csv_path.parent / STUDY_RECORD
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    (out / REPORT_FILE).write_text(render(read_csv(csv_path), record))
