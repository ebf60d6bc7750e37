"""``tfcompile compare``: trials (a study's, or any runs) -> results.csv (one row per trial),
report.md (one row per variant: means and standard deviations over seeds) and the plots.

The report's table is computed from results.csv as written (floats keep every digit), so that
``compare --from-csv results.csv`` rebuilds report.md exactly: the CSV is what a report commits.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfcompile.errors import UserError
from tfcompile.study.runs import Run, find_runs, read_run
from tfcompile.study.sweep import STUDY_RECORD

CSV_FILE = "results.csv"
REPORT_FILE = "report.md"
PLOTS = {"step": "val_loss_steps.png", "time": "val_loss_time.png"}
SEED_SUFFIX = re.compile(r"-seed(-?\d+)$")


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
    try:
        with open(path, newline="") as f:
            lines = list(csv.reader(f))
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror}") from None
    if not lines or lines[0] != TrialRow.columns():
        raise CompareError(f"{path} is not a results.csv written by compare: its columns differ")
    kinds = {f.name: f.type for f in dataclasses.fields(TrialRow)}
    rows = []
    for number, line in enumerate(lines[1:], 2):
        try:
            values = {
                name: _parse(text, kinds[name]) for name, text in zip(TrialRow.columns(), line, strict=True)
            }
        except ValueError as e:
            raise CompareError(f"{path}, line {number}: {e}") from None
        rows.append(TrialRow(**values))
    if not rows:
        raise CompareError(f"{path} holds no trials")
    return rows


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return repr(value) if isinstance(value, float) else str(value)


def _parse(text: str, kind: Any) -> Any:
    if kind == "bool":
        if text not in ("yes", "no"):
            raise ValueError(f"expected yes or no, found {text!r}")
        return text == "yes"
    return {"int": int, "float": float}.get(kind, str)(text)


# ---------------------------------------------------------------------- report.md


@dataclass(frozen=True)
class Spread:
    mean: float
    std: float  # sample standard deviation; nan for one seed

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan)

    def __str__(self) -> str:
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
                    f"{statistics.fmean(r.tokens_per_s for r in rs):,.0f}",
                    _memory([r.peak_memory_mb for r in rs]),
                    _duration(statistics.fmean(r.wall_s for r in rs)),
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


def _memory(values: list[float]) -> str:
    known = [v for v in values if not math.isnan(v)]
    return f"{statistics.fmean(known):,.0f} MB" if known else "-"


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
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
