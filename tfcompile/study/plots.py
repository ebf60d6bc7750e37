"""Curves of runs as PNG files, with matplotlib (the `study` extra): a variant's mean over its
seeds with a band over their range, or one line per run. Losses are drawn on a log scale when
they span more than a factor of LOG_SPAN, where a linear one would flatten the end of training."""

from __future__ import annotations

import difflib
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tfcompile.errors import UserError
from tfcompile.files import atomic_write_bytes
from tfcompile.study.runs import Run, read_run

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LOG_SPAN = 2.0
X_LABELS = {"step": "step", "time": "wall time (s)"}


class PlotError(UserError, RuntimeError):
    """A plot that cannot be drawn; the message says what to install or give."""


def plot_variants(variants: dict[str, list[Run]], path: Path, x: str, metric: str = "val_loss") -> None:
    """One line per variant: the mean of ``metric`` over its runs at each evaluated step (against
    steps, or the runs' mean wall time), and a band from the lowest to the highest run."""
    figure, axes = _figure()
    values: list[float] = []
    for label, runs in variants.items():
        curves = [run.curve(metric) for run in runs]
        steps = sorted(set.intersection(*({step for step, _, _ in c} for c in curves)))
        if not steps:
            continue
        at = [{step: (seconds, value) for step, seconds, value in c} for c in curves]
        xs = [step if x == "step" else _mean([a[step][0] for a in at]) for step in steps]
        ys = [[a[step][1] for a in at] for step in steps]
        line = axes.plot(
            xs, [_mean(v) for v in ys], label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        )[0]
        if len(runs) > 1:
            axes.fill_between(
                xs, [min(v) for v in ys], [max(v) for v in ys], color=line.get_color(), alpha=0.2
            )
        values += [v for vs in ys for v in vs]
    _finish(figure, axes, path, x, metric, values)


def plot_runs(
    paths: Sequence[Path], out: Path, metric: str = "val_loss", x: str = "step", force: bool = False
) -> None:
    """One line per run of ``metric`` against steps or wall time, written to ``out``; a file
    already there is replaced only with ``force`` (it may be the user's)."""
    if os.path.lexists(out) and not out.is_dir() and not force:
        raise PlotError(f"{out} exists: pass --force to replace it, or choose another --out")
    figure, axes = _figure()
    values: list[float] = []
    for path in paths:
        run = read_run(path)
        curve = run.curve(metric)
        if not curve:
            raise PlotError(f"{path} logged no {metric}{_logged(run, metric)}")
        if not any(math.isfinite(value) for _, _, value in curve):
            raise PlotError(
                f"{path}'s {metric} is not finite at any step it logged (nan or inf): no line to draw"
            )
        axes.plot(
            [step if x == "step" else seconds for step, seconds, _ in curve],
            [value for _, _, value in curve],
            label=path.name,
        )
        values += [value for _, _, value in curve]
    _finish(figure, axes, out, x, metric, values)


def _logged(run: Run, metric: str) -> str:
    """What a run logged instead of ``metric``, the nearest name first: ": did you mean 'val_loss'?
    (it logged lr, train_loss, val_loss)"; " yet" when it logged none of it so far."""
    logged = run.logged()
    if not logged:
        return " yet"
    near = difflib.get_close_matches(metric, logged, 1)
    return (f": did you mean {near[0]!r}?" if near else ":") + f" (it logged {', '.join(logged)})"


def _figure() -> tuple[Figure, Axes]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("plots need matplotlib: pip install 'tfcompile[study]'") from None
    figure = Figure(figsize=(8, 5), dpi=100, layout="constrained")
    return figure, figure.add_subplot()


def _finish(figure: Figure, axes: Axes, path: Path, x: str, metric: str, values: list[float]) -> None:
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > LOG_SPAN:
        axes.set_yscale("log")
    axes.set_xlabel(X_LABELS[x])
    axes.set_ylabel(metric.replace("_", " "))
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    if path.is_dir():  # the write would fail naming its temporary file
        raise PlotError(
            f"--out {path} is a folder: name a file in it, e.g. {path / ('plot' + (path.suffix or '.png'))}"
        )
    kind = path.suffix.removeprefix(".").lower()
    kinds = figure.canvas.get_supported_filetypes()
    if kind not in kinds:
        raise PlotError(f"{path}: a plot is written as one of .{', .'.join(kinds)}, named by its suffix")
    data = io.BytesIO()
    figure.savefig(data, format=kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data.getvalue())  # over a link, not through it


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
