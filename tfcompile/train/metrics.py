"""A run's metrics.jsonl (one JSON record per logged step), the running window that the logged
training loss and tokens/s are averaged over, and the clock of its elapsed_s."""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from tfcompile.files import atomic_write_text
from tfcompile.paths import REGULAR_FILE, file_type
from tfcompile.train.checkpoint import CheckpointError, RunWarning, remove_temporaries, write_failure
from tfcompile.train.runs import TrainError

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's records; a damaged line (a crash or a full disk mid-write) is skipped with a warning."""
    path = run_dir / METRICS_FILE
    return _records(path) if path.exists() else []


class MetricsLog:
    """Appends records to RUN/metrics.jsonl (rank 0 only: ``enabled``)."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.run_dir = run_dir
        self.path = run_dir / METRICS_FILE
        self.enabled = enabled

    def append(self, record: dict[str, Any]) -> None:
        """Append one line; when the disk is full, cut off what was half written and stop with a
        TrainError naming the intact checkpoint."""
        if not self.enabled:
            return
        size = self.path.stat().st_size if self.path.exists() else 0
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            with contextlib.suppress(OSError):
                os.truncate(self.path, size)
            what = f"appending step {record['step']} to {self.path}"
            raise TrainError(write_failure(e, what, self.run_dir)) from e

    def truncate(self, step: int) -> None:
        """Drop records past the checkpoint a run resumes from (they will be written again), and
        damaged lines."""
        if not self.enabled or not self.path.exists():
            return
        kept = [json.dumps(r) for r in _records(self.path) if r["step"] <= step]
        try:
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        except OSError as e:
            remove_temporaries(self.run_dir, [METRICS_FILE])
            raise TrainError(write_failure(e, f"rewriting {self.path}", self.run_dir)) from e


TEST_PREFIX = "test_"  # of the metrics a task measures on its test split after training (test_bleu)


UNTESTED = "untested"  # a record's key: the test at its step was stopped before it was measured


def tested_at(run_dir: Path, step: int) -> bool:
    """Whether the run recorded its test at ``step`` (a finished run resumed: not measured again)."""
    return _tested(read_metrics(run_dir), step)


def test_owed(records: list[dict[str, Any]], step: int) -> bool:
    """Whether the test at ``step`` was stopped before it was measured, and not measured since (a
    resume measures it)."""
    return any(r["step"] == step and r.get(UNTESTED) for r in records) and not _tested(records, step)


def _tested(records: list[dict[str, Any]], step: int) -> bool:
    return any(r["step"] == step and any(k.startswith(TEST_PREFIX) for k in r) for r in records)


def _records(path: Path) -> list[dict[str, Any]]:
    """The lines that are JSON records with an integer step; a RunWarning names the others."""
    if (found := file_type(path)) != REGULAR_FILE:  # a FIFO would block the read
        raise CheckpointError(f"{path} is {found}, not the run's file of metrics")
    records, damaged = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and type(record.get("step")) is int:
            records.append(record)
        elif line.strip():
            damaged.append(str(number))
    if damaged:
        warnings.warn(
            f"{path}: skipped damaged line{'s' if len(damaged) > 1 else ''} {', '.join(damaged)} "
            "(not a JSON record with an integer step)",
            RunWarning,
            stacklevel=3,
        )
    return records


class Window:
    """The training loss and throughput since the last log line. Its loss sum is checkpointed, so
    that a resumed run logs the same numbers as one that never stopped."""

    def __init__(self, loss: float = 0.0, steps: int = 0) -> None:
        self.loss, self.steps = loss, steps
        self.restart_clock()

    def restart_clock(self) -> None:
        self.tokens, self.start = 0, time.perf_counter()

    def add(self, loss: float, tokens: int) -> None:
        self.loss += loss
        self.steps += 1
        self.tokens += tokens

    def close(self) -> tuple[float, float]:
        """-> (mean loss, tokens/s) over the window, and start a new one."""
        mean, rate = self.loss / self.steps, self.tokens / max(time.perf_counter() - self.start, 1e-9)
        self.loss, self.steps = 0.0, 0
        self.restart_clock()
        return mean, rate


class TrainingClock:
    """Seconds spent in the training loop (evaluations and checkpoints included), carried across
    resumes by the checkpoints: a record's ``elapsed_s``, which studies plot losses against."""

    def __init__(self, before: float = 0.0) -> None:
        self.before = before  # seconds of the processes that trained this run before this one
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        now = 0.0 if self.started is None else time.perf_counter() - self.started
        return round(self.before + now, 3)
