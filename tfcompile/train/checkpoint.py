"""Checkpoints that survive crashes and full disks.

    RUN/checkpoints/step-000500/model.safetensors   weights (safetensors; tied tensors stored once)
    RUN/checkpoints/step-000500/state.pt            optimizer, scaler, RNG states, step, best val loss
    RUN/checkpoints/last, RUN/checkpoints/best      one line each: the folder they point to

A checkpoint is written into a temporary folder, flushed, and renamed into place; only then is the
``last`` pointer replaced (write then rename). A crash or a full disk at any moment leaves the
previous pointer and the folder it names untouched.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from tfcompile.errors import UserError
from tfcompile.files import atomic_write_text, fsync_file

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or does not fit the model."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(
    run_dir: Path, step: int, model: nn.Module, state: dict[str, Any], best: bool = False
) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        save_model(model, str(tmp / MODEL_FILE))
        torch.save(state, tmp / STATE_FILE)
        for f in tmp.iterdir():
            fsync_file(f)
        if final.exists():  # re-saving a step (e.g. the same step becomes best)
            shutil.rmtree(final)
        tmp.rename(final)
        atomic_write_text(root / "last", final.name + "\n")
        if best:
            atomic_write_text(root / "best", final.name + "\n")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = resolve(run_dir, "last")
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"could not write the checkpoint for step {step} in {root}: {e.strerror or e}; {kept}"
        ) from e
    _prune(root)
    return final


def resolve(run_dir: Path, which: str = "last") -> Path | None:
    """The checkpoint folder that ``last`` or ``best`` points to, or None before the first save."""
    pointer = checkpoint_dir(run_dir) / which
    if not pointer.exists():
        return None
    return checkpoint_dir(run_dir) / pointer.read_text().strip()


def load_weights(model: nn.Module, path: Path) -> None:
    missing, unexpected = load_model(model, str(path / MODEL_FILE), strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint {path} does not fit the model: "
            f"missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)


def _prune(root: Path) -> None:
    """Keep only the checkpoints that ``last`` and ``best`` point to."""
    keep = {p.read_text().strip() for p in (root / "last", root / "best") if p.exists()}
    for folder in root.glob("step-*"):
        if folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)
