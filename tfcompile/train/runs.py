"""A run folder read back: its spec, its trained model, and its body's weights as the start of
another run (``train.init_from``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from tfcompile.errors import UserError
from tfcompile.spec import Spec, parse_spec
from tfcompile.tasks.task import build_model
from tfcompile.train.checkpoint import CheckpointError, load_weights, resolve

SPEC_FILE = "spec.yaml"


class TrainError(UserError, RuntimeError):
    """A problem with a run that the user can fix; the message says how."""


def load_run_spec(run_dir: Path, overrides: Sequence[str] = ()) -> Spec:
    """A run's resolved spec, with ``overrides`` (``dotted.path=value``) applied."""
    path = run_dir / SPEC_FILE
    if not path.exists():
        raise TrainError(f"{run_dir} is not a run: it has no {SPEC_FILE}")
    return parse_spec(path.read_text(), source=str(path), overrides=overrides)


def load_trained_model(run_dir: Path, which: str = "last") -> tuple[Spec, nn.Module]:
    """The run's spec and its model with the weights of the ``last`` or ``best`` checkpoint (CPU)."""
    spec = load_run_spec(run_dir)
    path = resolve(run_dir, which)
    if path is None:
        raise CheckpointError(f"{run_dir} has no {which} checkpoint")
    model = build_model(spec)
    load_weights(model, path)
    return spec, model.eval()


# Fields that may change between pretraining and fine-tuning without changing the weights' meaning.
FINE_TUNING_FIELDS = {"dropout", "init_std"}


def body_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``model`` below its task heads (the assembly's ``heads`` submodules)."""
    heads = tuple(f"{name}." for name in getattr(model, "heads", ()))
    return {name: t for name, t in model.state_dict().items() if not name.startswith(heads)}


def init_from_run(model: nn.Module, spec: Spec, run_dir: Path) -> Path:
    """Load the body (everything but the task heads) of ``run_dir``'s best (else last) checkpoint
    into ``model``: a pretraining run's encoder under a classifier, say. Returns the checkpoint
    used. Any difference in architecture or in a tensor's shape is a TrainError that lists the
    offending fields or tensors."""
    source_spec = load_run_spec(run_dir)
    checkpoint = resolve(run_dir, "best") or resolve(run_dir, "last")
    if checkpoint is None:
        raise TrainError(f"train.init_from: {run_dir} has no checkpoint yet")
    source_model = build_model(source_spec)
    load_weights(source_model, checkpoint)
    source = source_model.state_dict()
    body = body_state(model)
    missing = [name for name in body if name not in source]
    mismatched = [
        f"{name} (run: {tuple(source[name].shape)}, spec: {tuple(body[name].shape)})"
        for name in body
        if name in source and source[name].shape != body[name].shape
    ]
    differences = model_differences(
        source_spec.model.model_dump(), spec.model.model_dump(), "model", {"vocab_size", *FINE_TUNING_FIELDS}
    )
    if missing or mismatched or differences:
        found = [
            f"fields that differ: {', '.join(differences)}" if differences else "",
            f"tensors of other shapes: {', '.join(mismatched)}" if mismatched else "",
            f"tensors the run lacks: {', '.join(missing)}" if missing else "",
        ]
        raise TrainError(
            f"train.init_from: the model of {run_dir} does not fit this spec's model; "
            f"{'; '.join(f for f in found if f)}. Copy the run's model section (dropout may differ)"
        )
    model.load_state_dict({name: source[name] for name in body}, strict=False)
    return checkpoint


def model_differences(a: dict, b: dict, prefix: str, ignore: set[str]) -> list[str]:
    """Dotted paths where two model dumps differ, with both values; keys in ``ignore`` are skipped."""
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key in ignore:
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += model_differences(va, vb, f"{prefix}.{key}", ignore)
        elif va != vb:
            diffs.append(f"{prefix}.{key} (run: {va!r}, spec: {vb!r})")
    return diffs
