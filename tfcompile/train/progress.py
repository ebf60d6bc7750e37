"""Training progress: a rich progress bar on a terminal (loss, tokens/s, ETA), plain lines elsewhere."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, total: int, start: int, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.bar = self.enabled and self.console.is_terminal
        self._rich = RichProgress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.bar,
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
            self.console.print(f"step {step}: {stats}", highlight=False)

    def log(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, highlight=False)
