"""Checkpoints that survive crashes and full disks.

    RUN/checkpoints/step-000500/model.safetensors   weights (safetensors; tied tensors stored once)
    RUN/checkpoints/step-000500/state.pt            optimizer, scaler, RNG states, step, best val loss
    RUN/checkpoints/last, RUN/checkpoints/best      one line each: the folder they point to

Each save writes a new folder (``step-000500``, or ``step-000500-2`` when the step is saved again)
under a temporary name, flushes it and renames it into place; only then are the pointers replaced
(write then rename: the commit point), and only after that are the folders no longer needed
removed. So ``last`` and ``best`` name a complete checkpoint at every instant, whatever fails or
crashes. The folder ``last`` named before is kept too: a resume that finds ``last`` damaged falls
back to the newest checkpoint that loads, with a warning.
"""

from __future__ import annotations

import errno
import itertools
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from tfcompile.errors import UserError
from tfcompile.files import atomic_write_text, fsync_dir, fsync_file
from tfcompile.spec.schema import OptimizerSpec
from tfcompile.train.optim import build_optimizer

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
POINTERS = ("last", "best")
FOLDER_NAME = re.compile(r"step-(\d{6,})(?:-(\d+))?")
T = TypeVar("T")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or does not fit the model."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint or pointer that cannot be read: truncated, garbage, or naming a missing folder."""


class RunWarning(UserWarning):
    """A damaged part of a run folder (a checkpoint, a metrics line) that was skipped."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(
    run_dir: Path, step: int, model: nn.Module, state: dict[str, Any], best: bool = False
) -> Path:
    """Write the checkpoint of ``step`` and move ``last`` (and ``best``) to it. Whatever fails,
    the temporaries go, and so does the new folder unless a pointer names it already (the commit
    point); a failed write is a CheckpointError naming the intact checkpoint."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    previous = _pointed(root / "last")
    final = _new_folder(root, step)
    tmp = root / f".{final.name}.tmp"
    remove_temporaries(root)  # a killed process's
    try:
        tmp.mkdir()
        save_model(model, str(tmp / MODEL_FILE))
        with open(tmp / STATE_FILE, "wb") as f:  # a file object: torch then chains the OSError
            torch.save(state, f)
        for file in tmp.iterdir():
            fsync_file(file)
        tmp.rename(final)
        fsync_dir(root)  # the folder's name is on disk before any pointer names it
        atomic_write_text(root / "last", final.name + "\n")
        if best:
            atomic_write_text(root / "best", final.name + "\n")
    except Exception as e:
        cause = os_error(e)
        if cause is None:
            raise
        raise CheckpointError(write_failure(cause, f"writing the checkpoint of step {step}", run_dir)) from e
    finally:
        remove_temporaries(root)
        if final.name in _named(root):  # committed: the folders no longer needed go
            _prune(root, previous)
        else:
            shutil.rmtree(final, ignore_errors=True)
    return final


def training_state(
    step: int,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    best: float | None,
    window: tuple[float, int] = (0.0, 0),
    elapsed_s: float = 0.0,
    cuda: bool = False,
) -> dict[str, Any]:
    """What a checkpoint's state.pt keeps besides the weights, the keys ``train --resume`` reads:
    the step, the optimizer's and scaler's states, the best validation score, the loss window
    (summed loss, steps) not yet logged, the training time so far, and the RNG states."""
    return {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "best": best,
        "window_loss": window[0],
        "window_steps": window[1],
        "elapsed_s": elapsed_s,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state() if cuda else None,
    }


def save_initial_checkpoint(run_dir: Path, model: nn.Module, optimizer: OptimizerSpec) -> Path:
    """The checkpoint of step 0 (``last`` and ``best``): ``model``'s weights and the state training
    has before its first step (a fresh optimizer), so that ``train --resume`` continues from them."""
    state = training_state(
        0,
        build_optimizer(model, optimizer, torch.device("cpu")),
        torch.amp.GradScaler("cpu", enabled=False),
        best=None,
    )
    return save_checkpoint(run_dir, 0, model, state, best=True)


def resolve(run_dir: Path, which: str = "last") -> Path | None:
    """The checkpoint folder that ``last`` or ``best`` points to, or None before the first save.
    A pointer that does not name an existing checkpoint folder is a DamagedCheckpoint."""
    pointer = checkpoint_dir(run_dir) / which
    if not pointer.exists():
        return None
    name = _pointed(pointer)
    if name is None:
        raise DamagedCheckpoint(f"the pointer {pointer} is damaged: it does not hold a checkpoint's name")
    path = checkpoint_dir(run_dir) / name
    if not path.is_dir():
        raise DamagedCheckpoint(f"the pointer {pointer} names {name}, which is missing")
    return path


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders, oldest first (by step, then by save)."""
    root = checkpoint_dir(run_dir)
    folders = [p for p in root.glob("step-*") if FOLDER_NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(folders, key=lambda p: _order(p.name))


def load_latest(run_dir: Path, load: Callable[[Path], T], repair: bool) -> tuple[Path, T]:
    """``load`` the checkpoint that ``last`` names or, when it (or the pointer) is damaged, the newest
    one that loads, with a RunWarning that says what was skipped and why; with ``repair`` (the
    caller holds the run's lock), ``last`` then names it, so that the next save keeps it as the
    previous checkpoint. A CheckpointError when none loads."""
    skipped: list[str] = []
    try:
        last = resolve(run_dir)
    except DamagedCheckpoint as e:
        last, skipped = None, [str(e)]
    newest_first = [p for p in reversed(checkpoint_folders(run_dir)) if p != last]
    for path in [last, *newest_first] if last is not None else newest_first:
        try:
            loaded = load(path)
        except DamagedCheckpoint as e:
            skipped.append(str(e))
            continue
        if skipped:
            warnings.warn(f"{'; '.join(skipped)}; resuming from {path}", RunWarning, stacklevel=2)
            if repair:
                _repoint(run_dir, path)
        return path, loaded
    raise CheckpointError(f"cannot resume {run_dir}: {'; '.join(skipped) or 'it has no checkpoint yet'}")


def load_weights(model: nn.Module, path: Path) -> None:
    try:
        missing, unexpected = load_model(model, str(path / MODEL_FILE), strict=False)
    except (SafetensorError, OSError) as e:
        raise DamagedCheckpoint(f"the checkpoint {path} is damaged: {MODEL_FILE}: {_first_line(e)}") from e
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint {path} does not fit the model: "
            f"missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def load_state(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
        raise DamagedCheckpoint(f"the checkpoint {path} is damaged: {STATE_FILE}: {_first_line(e)}") from e


def intact(run_dir: Path) -> str:
    """Which checkpoint a failure left intact, for its message."""
    name = _pointed(checkpoint_dir(run_dir) / "last")
    if name is None or not (checkpoint_dir(run_dir) / name).is_dir():
        return "no earlier checkpoint exists"
    return f"the checkpoint of step {_order(name)[0]} ({checkpoint_dir(run_dir) / name}) is intact"


def write_failure(error: OSError, what: str, run_dir: Path) -> str:
    """'no space left on device while writing X; the checkpoint of step M (path) is intact'."""
    reason = "no space left on device" if error.errno == errno.ENOSPC else error.strerror or str(error)
    return f"{reason} while {what}; {intact(run_dir)}"


def os_error(error: BaseException) -> OSError | None:
    """The operating system's error behind a failed write, or None for any other failure. torch
    chains it under a RuntimeError; safetensors quotes it as '(os error N)'."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        code = re.search(r"\(os error (\d+)\)", str(seen))
        if code:
            return OSError(int(code[1]), os.strerror(int(code[1])))
        seen = seen.__cause__ or seen.__context__
    return None


def remove_temporaries(folder: Path) -> None:
    """Remove the hidden ``.NAME.tmp`` files and folders that writes in ``folder`` leave while they
    run (the caller holds the run's lock, so none is another process's)."""
    for path in folder.glob(".*.tmp"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _new_folder(root: Path, step: int) -> Path:
    """``step-000500``, or ``step-000500-2`` and so on when the step was saved before: a re-save never
    replaces a folder that a pointer may name."""
    name = f"step-{step:06d}"
    names = itertools.chain([name], (f"{name}-{n}" for n in itertools.count(2)))
    return next(root / n for n in names if not (root / n).exists())


def _repoint(run_dir: Path, folder: Path) -> None:
    """Point ``last`` at ``folder``; best effort, as the next save moves it anyway."""
    try:
        atomic_write_text(checkpoint_dir(run_dir) / "last", folder.name + "\n")
    except OSError:
        remove_temporaries(checkpoint_dir(run_dir))


def _pointed(pointer: Path) -> str | None:
    """The folder name a pointer file holds, or None when it holds anything else."""
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if FOLDER_NAME.fullmatch(name) else None


def _order(name: str) -> tuple[int, int]:
    match = FOLDER_NAME.fullmatch(name)
    assert match is not None
    return int(match[1]), int(match[2] or 1)


def _named(root: Path) -> set[str]:
    """The folders that ``last`` and ``best`` name."""
    return {name for which in POINTERS if (name := _pointed(root / which))}


def _prune(root: Path, previous: str | None) -> None:
    """Keep the checkpoints that ``last`` and ``best`` name and the one ``last`` named before this
    save (resume's fallback); remove the rest."""
    keep = _named(root) | {previous}
    for folder in checkpoint_folders(root.parent):
        if folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else type(error).__name__
