"""A run's metrics.jsonl (one JSON record per logged step) and the running window that the
logged training loss and tokens/s are averaged over."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tfcompile.files import atomic_write_text

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class MetricsLog:
    """Appends records to RUN/metrics.jsonl (rank 0 only: ``enabled``)."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.path = run_dir / METRICS_FILE
        self.enabled = enabled

    def append(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def truncate(self, step: int) -> None:
        """Drop records past the checkpoint a run resumes from; they will be written again."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))


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
