"""Saying what a command is doing: a spinner for work of unknown length, and durations as people
read them. No torch here: the server and the runtime's commands use it too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def duration(seconds: float) -> str:
    """About how long ``seconds`` is, to the unit that matters: 40 s, 2 min 10 s, 18 h 5 min."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"about {hours:,} h {minutes} min"
    if minutes:
        return f"about {minutes} min {secs} s"
    return f"about {secs} s"


@contextlib.contextmanager
def working(message: str) -> Iterator[None]:
    """Say what a long command of unknown length is doing from its first moment: a spinner with the
    elapsed time on a terminal (gone when it ends), one line elsewhere (a dumb terminal too)."""
    console = Console(stderr=True)
    if not console.is_terminal or console.is_dumb_terminal:  # a spinner redraws its line
        console.print(f"{message} ...", highlight=False, soft_wrap=True)
        yield
        return
    columns = (SpinnerColumn(), TextColumn(message), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as spinner:
        spinner.add_task(message, total=None)
        yield
