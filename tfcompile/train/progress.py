"""Progress: for training, a rich progress bar on a terminal (loss, tokens/s, ETA), plain lines
elsewhere (a CI log: each logged step of how many, its stats and the time left); the bar moves
every step, and once a few steps after the first (which compiles and warms up) have taken a couple
of seconds, one line says how long the whole run will take."""

from __future__ import annotations

from time import perf_counter
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.table import Column

from tfcompile.console import duration

# The estimate waits for this many steps after the first and this many seconds of them (or, for
# very fast steps, ESTIMATE_MOST_STEPS), so that it is neither noise nor late.
ESTIMATE_STEPS = 3
ESTIMATE_SECONDS = 2.0
ESTIMATE_MOST_STEPS = 50


class Progress:
    def __init__(self, total: int, start: int, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        # A bar redraws its line: a dumb terminal (TERM=dumb) gets the lines a pipe gets instead.
        self.bar = self.enabled and self.console.is_terminal and not self.console.is_dumb_terminal
        self.total = total
        self._first: tuple[int, float] | None = None  # the first step's number and end time
        self._estimated = False
        self._pace: float | None = None  # seconds a step, once estimated
        # On a narrow terminal the stats give way (cut with an ellipsis), never the step count or the
        # time left, which rich's table cut first.
        steps = len(f"{total:,}/{total:,}")
        self._rich = RichProgress(
            TextColumn("[bold]train", table_column=Column(no_wrap=True, min_width=5)),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=1)),
            MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=steps)),
            TextColumn(
                "{task.fields[stats]}", table_column=Column(ratio=3, no_wrap=True, overflow="ellipsis")
            ),
            TimeRemainingColumn(table_column=Column(no_wrap=True, min_width=7)),
            console=self.console,
            disable=not self.bar,
            expand=True,
        )
        self._task = self._rich.add_task("train", total=total, completed=start, stats="")

    def __enter__(self) -> Progress:
        self._rich.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._rich.__exit__(kind, error, traceback)

    def advance(self, step: int) -> None:
        """A step is done: move the bar, and estimate the run's time once enough steps are timed."""
        self._rich.update(self._task, completed=step)
        now = perf_counter()
        if self._first is None:
            self._first = (step, now)
            return
        steps, seconds = step - self._first[0], now - self._first[1]
        ready = (steps >= ESTIMATE_STEPS and seconds >= ESTIMATE_SECONDS) or steps >= ESTIMATE_MOST_STEPS
        if not ready:
            return
        self._pace = seconds / steps
        if not self._estimated and step < self.total:
            self._estimated = True
            left = self.total - step
            self.log(
                f"estimated time: {duration(self._pace * left)} for the {left:,} steps left "
                f"({self._pace:.3g} s a step; evaluations add to it)"
            )

    def update(self, step: int, record: dict[str, Any]) -> None:
        stats = "  ".join(
            f"{name} {record[key]:{fmt}}"
            for key, name, fmt in (
                ("train_loss", "loss", ".4f"),
                ("val_loss", "val", ".4f"),
                ("tokens_per_s", "tok/s", ",.0f"),
                ("mfu", "MFU", ".1%"),
                ("lr", "lr", ".2e"),
            )
            if key in record
        )
        self._rich.update(self._task, completed=step, stats=stats)
        if self.enabled and not self.bar and "train_loss" in record:
            left = ""
            if self._pace is not None and step < self.total:
                left = f"  {duration(self._pace * (self.total - step))} left"
            self.console.print(f"step {step:,}/{self.total:,}: {stats}{left}", highlight=False)

    def log(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, highlight=False, soft_wrap=True)
