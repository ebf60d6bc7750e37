"""Run folders read back for studies and listings: what a run is, how far it got, and whether it
is running (a process holds its lock), finished (a checkpoint at its planned step), failed (a
study's trial whose training stopped with an error, RUN/trial.json says which) or interrupted."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfcompile.data.digest import changed_data, recorded_digests
from tfcompile.files import read_small_text
from tfcompile.manifest import MANIFEST
from tfcompile.spec import Spec
from tfcompile.tasks.task import task_of
from tfcompile.train.checkpoint import CheckpointError, checkpoint_folders, folder_step, resolve
from tfcompile.train.lock import is_locked
from tfcompile.train.metrics import read_metrics, test_owed
from tfcompile.train.runs import RESUMABLE_FIELDS, SPEC_FILE, load_run_spec, model_differences
from tfcompile.train.schedule import learning_rate

TRIAL_FILE = "trial.json"  # what a study's trial measured besides metrics.jsonl: its peak memory
MEMORY_KINDS = ("process RSS", "CUDA allocated")  # what a trial's peak memory is of
RECORD_AXES = {"step", "elapsed_s"}  # what a metrics record holds besides metrics
# What a study's trial may have been trained with otherwise than its study gives it now: where and
# how fast it ran, none of which moves a figure a report compares (train.steps is the budget's).
UNMEASURED = RESUMABLE_FIELDS - {
    "train.steps",
    "train.eval_interval",
    "train.eval_batches",
    "train.log_interval",
    "train.precision",
}


@dataclass(frozen=True)
class Run:
    path: Path
    spec: Spec
    records: list[dict[str, Any]]  # metrics.jsonl
    saved_step: int  # of its newest checkpoint; 0 before the first
    running: bool

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def planned(self) -> int:
        return self.spec.train.steps

    @property
    def step(self) -> int:
        """The last step it logged or saved."""
        return max([self.saved_step, *(r["step"] for r in self.records)])

    @property
    def state(self) -> str:
        if self.running:
            return "running"
        if self.saved_step >= self.planned and not test_owed(self.records, self.saved_step):
            return "finished"
        return "failed" if self.failure() else "interrupted"

    @property
    def best_metric(self) -> str:
        """The validation metric the run's task keeps its best checkpoint by (val_loss for most)."""
        return task_of(self.spec).best_metric

    def best(self, key: str | None = None) -> float | None:
        """The best value of ``key`` (default: the best metric) it logged, NaN where it logged
        nothing else (a NaN among numbers is no value: min and max would keep it or not by where it
        stands)."""
        key = key or self.best_metric
        logged = [r[key] for r in self.records if is_number(r.get(key))]
        values = [v for v in logged if not math.isnan(v)]
        if not values:
            return math.nan if logged else None
        higher = key == self.best_metric and task_of(self.spec).higher_is_better
        return max(values) if higher else min(values)

    def curve(self, key: str = "val_loss") -> list[tuple[int, float, float]]:
        """(step, elapsed seconds, value) of every record that holds ``key``."""
        return [
            (r["step"], r.get("elapsed_s", math.nan), r[key]) for r in self.records if is_number(r.get(key))
        ]

    def logged(self) -> list[str]:
        """The names of the metrics it logged a number of, in order (not its step or time)."""
        return sorted({k for r in self.records for k, v in r.items() if is_number(v)} - RECORD_AXES)

    def wall_s(self) -> float:
        """The seconds its records span, NaN where none says."""
        return max((r["elapsed_s"] for r in self.records if is_number(r.get("elapsed_s"))), default=math.nan)

    def trial(self) -> dict[str, Any]:
        """What the study measured of this run (empty for a run trained outside a study)."""
        return read_trial(self.path)

    @property
    def data(self) -> dict[str, str]:
        """RUN/data.json's digests of the data it read, read where they are compared alone (a
        damaged file is a DataError there, not in a listing or a plot)."""
        return recorded_digests(self.path)

    def failure(self) -> str | None:
        """Why its training stopped with an error, when its study's sweep recorded that it did."""
        return recorded_failure(self.path)


def is_number(value: Any) -> bool:
    """Whether a record's value is a measurement (a flag such as ``untested: true`` is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_trial(folder: Path) -> dict[str, Any]:
    """RUN/trial.json, what a study measured of a trial (empty when there is none)."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(read_small_text(folder / TRIAL_FILE))
        if isinstance(found, dict):
            return found
    return {}


def recorded_failure(folder: Path) -> str | None:
    """Why a trial's training failed, as its sweep recorded: also of one that failed as it was set
    up (its model does not fit), before it wrote its spec."""
    failed = read_trial(folder).get("failed")
    return failed if isinstance(failed, str) else None


def trained_otherwise(run: Run, spec: Spec) -> list[str]:
    """How ``run`` was trained otherwise than ``spec``, a study's trial, trains it, as far as it
    got: the settings a report's figures depend on, and a changed train.steps where that moves the
    learning rate of the steps it took (a cosine schedule's decay), and its data files edited since
    (their names unchanged). Empty: ``run`` is that trial, or trains on to it."""
    ignore = UNMEASURED | {"train.steps"} | set(spec.sizes_from_data())
    changed = model_differences(_by_name(run.spec.model_dump()), _by_name(spec.model_dump()), "", ignore)
    changed += [f"{file}: edited since" for file in changed_data(run.data, spec)]
    ours, theirs, step = spec.train, run.spec.train, run.saved_step
    if 0 < step <= ours.steps != theirs.steps:
        d_model = spec.model.d_model
        before = learning_rate(step, theirs.schedule, theirs.optimizer, theirs.steps, d_model)
        after = learning_rate(step, ours.schedule, ours.optimizer, ours.steps, d_model)
        if not math.isclose(before, after, rel_tol=1e-6):
            changed.append(
                f"train.steps (run: {theirs.steps}, spec: {ours.steps}: the {ours.schedule.type} "
                f"schedule's learning rate at step {step}, the last it trained, would be {after:.3g}, "
                f"not {before:.3g})"
            )
    return changed


def _by_name(value: Any) -> Any:
    """A spec's dump with each path (its data, a parent run) as its file name: which data a trial
    read, not where it lay, so that a study moved or copied elsewhere keeps its finished trials."""
    if isinstance(value, dict):
        return {key: _by_name(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_by_name(v) for v in value]
    return value.name if isinstance(value, Path) else value


def is_run(folder: Path) -> bool:
    """A folder of a spec.yaml that is not a bundle's (an exported bundle holds one too)."""
    return (folder / SPEC_FILE).is_file() and not (folder / MANIFEST).is_file()


def read_run(folder: Path) -> Run:
    return Run(folder, load_run_spec(folder), read_metrics(folder), saved_step(folder), is_locked(folder))


def saved_step(folder: Path) -> int:
    """The step a resume starts from: of the checkpoint ``last`` names (a folder a killed process
    renamed into place before it moved ``last`` is not committed), else of the newest; 0 before
    the first."""
    with contextlib.suppress(CheckpointError):
        last = resolve(folder)
        if last is not None:
            return folder_step(last)
    return max((folder_step(p) for p in checkpoint_folders(folder)), default=0)


def find_runs(folder: Path) -> list[Path]:
    """``folder`` itself when it is a run, else the runs below it (a study's trials included),
    sorted by path; folders whose names start with '.' (caches) are skipped."""
    if is_run(folder):
        return [folder]
    found = []
    for root, dirs, _ in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "checkpoints")
        if is_run(Path(root)):
            found.append(Path(root))
            dirs.clear()
    return sorted(found)
