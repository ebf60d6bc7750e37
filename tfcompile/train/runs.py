"""A run folder read back: its spec, its tokenizer, its trained model, its body's weights as the
start of another run (``train.init_from``), and what of its spec a resume may change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from tfcompile.errors import UserError, first_line
from tfcompile.files import TOKENIZER_FILE
from tfcompile.runtime.session import id_span
from tfcompile.spec import Spec, parse_spec
from tfcompile.tasks.task import build_model
from tfcompile.train.checkpoint import (
    FOLDER_NAME,
    SPEC_FILE,
    CheckpointError,
    checkpoint_dir,
    checkpoint_folders,
    load_latest,
    load_pointed,
    load_weights,
)


class TrainError(UserError, RuntimeError):
    """A problem with a run that the user can fix; the message says how."""


class TrainingFailed(TrainError):
    """Training itself failed, for what the spec asks of it: its loss or gradients stopped being
    finite, or its model ran out of memory (a study's trial records this as its result; a full
    disk or a locked folder is no result of the trial)."""


def load_run_spec(run_dir: Path, overrides: Sequence[str] = ()) -> Spec:
    """A run's resolved spec, with ``overrides`` (``dotted.path=value``) applied."""
    path = run_dir / SPEC_FILE
    if not path.exists():
        raise TrainError(f"{run_dir} is not a run: it has no {SPEC_FILE}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TrainError(f"{path} cannot be read: {_reason(e)}; {_RESTORE}") from None
    return parse_spec(text, source=str(path), overrides=overrides)


def runs_folder(run_dir: Path, spec: Spec) -> Path:
    """The runs folder of an existing run, where its token cache lives: train.runs_dir, or the
    folder that holds the run when that is another one (the run was moved, or its runs_dir is
    relative to another working directory); never where the run was trained, if not there now."""
    if run_dir.parent.resolve() != spec.train.runs_dir.resolve():
        return run_dir.parent
    return spec.train.runs_dir


def load_run_tokenizer(run_dir: Path, spec: Spec) -> Tokenizer | None:
    """The run's tokenizer (None: the run has none, as an image model's), checked to fit the model
    of ``spec``, the run's."""
    path = run_dir / TOKENIZER_FILE
    tokenizer = read_run_tokenizer(run_dir)
    if tokenizer is None:
        return None
    tokens, rows = id_span(tokenizer), getattr(spec.model, "vocab_size", None)
    if rows is not None and tokens > rows:
        raise TrainError(
            f"{path} has token ids up to {tokens - 1}, past the {rows} of model.vocab_size in "
            f"{run_dir / SPEC_FILE}: is it another run's? {_RESTORE}"
        )
    return tokenizer


def read_run_tokenizer(run_dir: Path) -> Tokenizer | None:
    """The run's tokenizer (None: the run has none) without a truncation or padding its file saved
    (a run imported before the import dropped them): a task cuts and pads as its own rules say, and
    either would otherwise cut a corpus's pieces or pad them into its stream. A damaged file is a
    TrainError."""
    path = run_dir / TOKENIZER_FILE
    if not path.exists():
        return None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises a bare Exception
        raise TrainError(f"{path} cannot be read: {_reason(e)}; {_RESTORE}") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


# What to do about a damaged file of a run folder.
_RESTORE = "restore the run's file from a copy (the checkpoints were trained with it), or train a new run"


def _reason(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return f"it is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return first_line(error, 160)


def load_trained_model(run_dir: Path, which: str = "last") -> tuple[Spec, nn.Module]:
    """The run's spec and its model with the weights of the ``last`` or ``best`` checkpoint, or of
    the checkpoint folder named (``step-000600``), on the CPU; the run's tokenizer is checked too,
    before any command reads it."""
    spec, model, _ = load_trained_checkpoint(run_dir, which)
    return spec, model


def load_trained_checkpoint(run_dir: Path, which: str = "last") -> tuple[Spec, nn.Module, Path]:
    """load_trained_model, and the checkpoint folder its weights came from."""
    spec = load_run_spec(run_dir)
    load_run_tokenizer(run_dir, spec)
    model = build_model(spec)
    folder = load_run_weights(model, run_dir, which)
    return spec, model.eval(), folder


def load_run_weights(model: nn.Module, run_dir: Path, which: str) -> Path:
    """The weights of the run's ``last`` checkpoint (when it is damaged, the newest that loads, with a
    RunWarning), its ``best`` one, or the checkpoint folder named, into ``model`` -> the
    checkpoint's folder."""

    def load(path: Path) -> None:
        load_weights(model, path)

    if which == "last":
        return load_latest(run_dir, load, repair=False, resuming=False)[0]
    if FOLDER_NAME.fullmatch(which):
        folder = checkpoint_dir(run_dir) / which
        if not folder.is_dir():
            raise CheckpointError(f"{run_dir} no longer holds its checkpoint {which} (pruned or removed)")
        load(folder)
        return folder
    loaded = load_pointed(run_dir, which, load)
    if loaded is None:
        raise CheckpointError(f"{run_dir} has no {which} checkpoint")
    return loaded[0]


# Fields that may change between pretraining and fine-tuning without changing the weights' meaning.
FINE_TUNING_FIELDS = {"dropout", "init_std"}
# BERT's pooler: a part of the body that a masked LM may have none of (one imported from
# RobertaForMaskedLM or DistilBertForMaskedLM, or from a BertForMaskedLM saved without it) and a
# classifier reads. Fine-tuning starts it new where the parent has none, as it starts its heads, and
# leaves the parent's behind where this model has none; model.pooler may differ, and so may its
# activation where one of the two has no pooler (a pooler carried over keeps what it was trained with).
POOLER = "pooler"
POOLER_ACTIVATION = "pooler_activation"
# The segment embeddings: a parent with one row (an imported RoBERTa-family masked LM, whose
# tokenizer gives every token segment 0) starts each row of a model with more as a copy of it, so
# that any segment is read as the parent read segment 0 (the import of a RoBERTa classifier copies
# its one row so too); model.type_vocab_size may differ so.
SEGMENTS = "segment_embed.weight"
# The LM head's own fields, which may differ where this model's body holds no LM head (an
# encoder's is one of its heads: left behind, or started new).
LM_HEAD_FIELDS = {"model.tie_embeddings", "model.bias.lm_head"}


def body_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``model`` below its task heads (the assembly's ``heads`` submodules)."""
    heads = tuple(f"{name}." for name in getattr(model, "heads", ()))
    return {name: t for name, t in model.state_dict().items() if not name.startswith(heads)}


@dataclass(frozen=True)
class Initialised:
    """What fine-tuning took from its parent run: the checkpoint, how many tensors of its body, the
    parts this model starts new (its heads, a pooler the parent lacks) and the parts of the parent
    it leaves behind (its heads, a pooler this model lacks)."""

    checkpoint: Path
    tensors: int
    new_parts: list[str]
    unused_parts: list[str]
    copied_segments: int = 0  # the rows a parent's one segment row was copied to, if it was

    def __str__(self) -> str:
        parts = [f"initialised from {self.checkpoint}: {self.tensors} tensors of its body"]
        if self.copied_segments:
            parts.append(f"its one segment row copied to each of {self.copied_segments}")
        parts += [f"new: {', '.join(self.new_parts)}"] if self.new_parts else []
        parts += [f"its {', '.join(self.unused_parts)} not used"] if self.unused_parts else []
        return "; ".join(parts)


def _parts(model: nn.Module, names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` (submodules) that hold tensors in ``model`` (a masked LM's nsp_head only
    with next_sentence; a pooler only with model.pooler)."""
    held = model.state_dict()
    return [part for part in names if any(name.startswith(f"{part}.") for name in held)]


def init_from_run(model: nn.Module, spec: Spec, run_dir: Path) -> Initialised:
    """Load the body (everything but the task heads) of ``run_dir``'s best (else last) checkpoint
    into ``model``: a pretraining run's encoder under a classifier, say. A pooler the run lacks
    starts new (one this model lacks stays behind), and a run's one segment row is copied to each
    of this model's (SEGMENTS). Any other difference in architecture or in a tensor's shape is a
    TrainError that lists the offending fields or tensors."""
    source_spec = load_run_spec(run_dir)
    if not checkpoint_folders(run_dir):
        raise TrainError(f"train.init_from: {run_dir} has no checkpoint yet")
    source_model = build_model(source_spec)
    best = (checkpoint_dir(run_dir) / "best").exists()
    checkpoint = load_run_weights(source_model, run_dir, "best" if best else "last")
    source = source_model.state_dict()
    body = body_state(model)
    has, had = bool(_parts(model, (POOLER,))), bool(_parts(source_model, (POOLER,)))
    fresh = [POOLER] if has and not had else []  # started new, as the heads are
    left = [POOLER] if had and not has else []  # left behind, as the parent's heads are
    loaded = {name: t for name, t in body.items() if not (fresh and name.startswith(f"{POOLER}."))}
    copied = _copy_segments(source, loaded)
    missing = [name for name in loaded if name not in source]
    mismatched = [
        f"{name} (run: {tuple(source[name].shape)}, spec: {tuple(loaded[name].shape)})"
        for name in loaded
        if name in source and source[name].shape != loaded[name].shape
    ]
    free = {"vocab_size", POOLER, *FINE_TUNING_FIELDS, *(["type_vocab_size"] if copied else [])}
    if not (has and had):
        free.add(POOLER_ACTIVATION)
    if not any(name.startswith("lm_head.") for name in body):
        free |= LM_HEAD_FIELDS
    differences = model_differences(source_spec.model.model_dump(), spec.model.model_dump(), "model", free)
    if missing or mismatched or differences:
        found = [
            f"fields that differ: {', '.join(differences)}" if differences else "",
            f"tensors of other shapes: {', '.join(mismatched)}" if mismatched else "",
            f"tensors the run lacks: {', '.join(missing)}" if missing else "",
        ]
        raise TrainError(
            f"train.init_from: the model of {run_dir} does not fit this spec's model; "
            f"{'; '.join(f for f in found if f)}. Copy the run's model section (dropout and the "
            f"pooler may differ)"
        )
    model.load_state_dict({name: source[name] for name in loaded}, strict=False)
    new = fresh + _parts(model, getattr(model, "heads", ()))
    return Initialised(checkpoint, len(loaded), new, left + _parts(source_model, source_model.heads), copied)


def _copy_segments(source: dict[str, torch.Tensor], body: dict[str, torch.Tensor]) -> int:
    """Where the run has one segment row and ``body`` more, put the row as each of them into
    ``source`` -> how many (0: nothing copied)."""
    if SEGMENTS not in source or SEGMENTS not in body:
        return 0
    rows = len(body[SEGMENTS])
    if len(source[SEGMENTS]) != 1 or rows < 2 or source[SEGMENTS].shape[1:] != body[SEGMENTS].shape[1:]:
        return 0  # a row of another width is named as the run holds it, by the shape check
    source[SEGMENTS] = source[SEGMENTS].expand(rows, -1)
    return rows


# What a resume may change of a run that has trained: how long it trains, how often it reports, and
# where and how it runs, none of which changes what a step computes (precision, a little).
RESUMABLE_FIELDS = {
    "preset",
    "export",
    "train.steps",
    "train.eval_interval",
    "train.eval_batches",
    "train.checkpoint_interval",
    "train.log_interval",
    "train.threads",
    "train.device",
    "train.compile",
    "train.precision",
    "train.parallel",
    "train.activation_checkpointing",
    "train.cpu_offload",
    "train.loss_chunk_tokens",
    "train.runs_dir",
    "train.name",
}


def resume_differences(recorded: Spec, spec: Spec, trained: bool) -> list[str]:
    """The settings in which ``spec`` differs from the run's ``recorded`` one that a resume may not
    change: the model's and, once the run has ``trained`` a step, all but RESUMABLE_FIELDS. The
    sizes ``spec`` leaves to the data are not compared (the trainer checks them against the data)."""
    ignore = set(spec.sizes_from_data())
    if not trained:
        return model_differences(recorded.model.model_dump(), spec.model.model_dump(), "model", ignore)
    return model_differences(recorded.model_dump(), spec.model_dump(), "", ignore | RESUMABLE_FIELDS)


def _shown(value: Any) -> str:
    return repr(str(value)) if isinstance(value, Path) else repr(value)  # '/data/a.txt', not PosixPath(...)


def model_differences(a: dict[str, Any], b: dict[str, Any], prefix: str, ignore: set[str]) -> list[str]:
    """Dotted paths where two model (or spec) dumps differ, with both values; keys in ``ignore``, by
    name or by dotted path, are skipped."""
    diffs = []
    for key in sorted(set(a) | set(b)):
        path = f"{prefix}.{key}" if prefix else key
        if key in ignore or path in ignore:
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += model_differences(va, vb, path, ignore)
        elif va != vb:
            diffs.append(f"{path} (run: {_shown(va)}, spec: {_shown(vb)})")
    return diffs
