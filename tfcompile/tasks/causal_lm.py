"""Causal language modelling: next-token cross-entropy over windows of a token stream, and text
generation through the shared search (tfcompile.search)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch.utils.checkpoint import checkpoint

from tfcompile import search
from tfcompile.data import DataError, check_fits_context, lm_batch, prepare_corpus
from tfcompile.errors import ExportError
from tfcompile.graphs.export import Graph, export_decoder, export_decoder_fixed_step, export_decoder_step
from tfcompile.graphs.parity import check_decoder_parity, check_fixed_step_parity, check_step_parity
from tfcompile.manifest import GenerationInfo, TokenizerInfo
from tfcompile.models import DecoderLM
from tfcompile.nn.attention import KVCache
from tfcompile.spec.schema import GENERATION_OPTIONS, CausalLMTask, DecoderSpec, Spec

if TYPE_CHECKING:
    from tfcompile.runtime import Bundle

from tfcompile.tasks.task import (
    Batch,
    GateRule,
    ModelFn,
    Task,
    listed_sequences,
    listed_token_ids,
    register_task,
    served,
    token_strings,
)

IGNORE_INDEX = -100  # targets at padded positions carry this and add nothing to the loss


def causal_lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) with IGNORE_INDEX at padding -> the loss over real tokens,
    their mean (or, ``reduction="sum"``, their sum)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


@dataclass(frozen=True)
class ChunkedLoss:
    """causal_lm_loss from the final hidden states, ``chunk`` rows at a time: each chunk's logits
    are made, upcast, reduced to a summed loss and freed, then made again in backward
    (activation checkpointing per chunk), so that (tokens x vocabulary) logits never exist at
    once. Passed to DecoderLM.forward as its ``loss``; equal to the plain loss (mean over the
    real tokens, with label smoothing) up to float rounding."""

    targets: torch.Tensor  # (B, T), IGNORE_INDEX at padding
    chunk: int
    label_smoothing: float = 0.0

    def __call__(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        rows, targets = hidden.flatten(0, 1), self.targets.flatten()  # (B*T, d), (B*T,)

        def summed(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(
                head(h).float(),
                t,
                ignore_index=IGNORE_INDEX,
                label_smoothing=self.label_smoothing,
                reduction="sum",
            )

        chunks = zip(rows.split(self.chunk), targets.split(self.chunk), strict=True)
        total = torch.stack([checkpoint(summed, h, t, use_reentrant=False) for h, t in chunks]).sum()
        return total / (targets != IGNORE_INDEX).sum()


def training_loss(
    model: ModelFn,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    chunk: int | None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The loss a training step takes: from every position's logits at once, or (``chunk``: the
    spec's train.loss_chunk_tokens) from the final hidden states that many tokens at a time."""
    if chunk is None:
        return causal_lm_loss(model(input_ids), targets, label_smoothing)
    return model(input_ids, loss=ChunkedLoss(targets, chunk, label_smoothing))


@register_task
class LanguageModelling(Task):
    """Random windows of the context's length; each position predicts the next token."""

    section = CausalLMTask
    # The full forward, the incremental form with the KV cache that generation steps through, and
    # (export.cuda_graphs) that step at fixed shapes, for a GPU to replay as a CUDA graph.
    graphs: ClassVar[dict[str, Graph]] = {
        "model": Graph("forward", export_decoder, check_decoder_parity),
        "step": Graph("decode_step", export_decoder_step, check_step_parity),
        "fixed_step": Graph(
            "decode_step_fixed", export_decoder_fixed_step, check_fixed_step_parity, cuda_graphs=True
        ),
    }

    @staticmethod
    def build_model(spec: Spec) -> DecoderLM:
        assert isinstance(spec.model, DecoderSpec)
        return DecoderLM(spec.model)

    padding_side = "left"  # new tokens follow the prompt's last real token in every row
    gate = GateRule("loss", higher_is_better=False, tolerance={"int8": 0.01, "int4": 0.03}, relative=True)

    @classmethod
    def manifest(cls, spec: Spec, tokenizer: TokenizerInfo | None, run: Path | None) -> dict[str, Any]:
        """Generation stops at the eos (unless the task says not to) and the task's stop_tokens (ids
        of the run's tokenizer), with the task's generation defaults and bans."""
        assert isinstance(spec.task, CausalLMTask)
        eos = tokenizer.special_tokens.get("eos") if tokenizer is not None else None
        stops = [eos.id] if eos is not None and spec.task.stop_at_eos else []
        stops += [i for i in listed_token_ids(spec.task, "stop_tokens", run) if i not in stops]
        banned = bans(spec.task, run, stops, ExportError)
        generation = GenerationInfo(
            context_length=spec.model.max_seq_len,
            stop_token_ids=stops,
            **{name: getattr(spec.task, name) for name in GENERATION_OPTIONS},
            min_new_tokens=banned.min_len,
            min_length=banned.min_total,
            no_repeat_ngram_size=banned.no_repeat_ngram,
            suppressed_ids=list(banned.suppressed),
            banned_sequences=[list(sequence) for sequence in banned.sequences],
        )
        return {"generation": generation}

    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        assert isinstance(spec.task, CausalLMTask) and spec.data is not None
        self.task = spec.task
        self.loss_chunk = spec.train.loss_chunk_tokens
        self.context = spec.context_length
        # special_tokens: each document ends with the eos token, by role (tfcompile's [EOS], an
        # imported GPT-2's <|endoftext|>).
        end = token_strings(spec).get("eos") if spec.task.special_tokens else None
        if spec.task.special_tokens and end is None:
            raise DataError(
                "task.special_tokens ends each document with the eos token, which the spec's tokens: "
                "section does not name: name it (tokens.eos), or set task.special_tokens: false"
            )
        self.corpus = prepare_corpus(spec.data, cache_dir, tokenizer, spec.task.reserved_tokens(), end)
        self.tokenizer = self.corpus.tokenizer
        check_fits_context(self.corpus, self.context, spec.data)

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        ids = self.corpus.train if split == "train" else self.corpus.val
        x, y = lm_batch(ids, size, self.context, generator)
        return {"input_ids": x, "targets": y}

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return training_loss(
            model, batch["input_ids"], batch["targets"], self.loss_chunk, self.task.label_smoothing
        )

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        """The mean loss per real target token over all ``batches``, however they divide them."""
        total = count = 0.0
        for b in batches:
            total += causal_lm_loss(model(b["input_ids"]), b["targets"], reduction="sum").item()
            count += (b["targets"] != IGNORE_INDEX).sum().item()
        return {"val_loss": total / count}

    def held_out(self, bundle: Bundle, limit: int | None) -> tuple[float, str]:
        """The loss over ``limit`` (default 128) windows of the validation split, at most as many
        as it has starts, drawn as training's evaluation draws them, the same windows for every
        bundle."""
        from tfcompile.runtime import LanguageModel

        assert isinstance(bundle, LanguageModel)
        windows = min(limit or 128, len(self.corpus.val) - self.context)  # 10**30 ran for ever
        size = max(d for d in range(1, 9) if windows % d == 0)  # batches of up to 8, exactly `windows`
        batches = self.eval_batches(windows // size, size, lambda i: torch.Generator().manual_seed(i))
        loss = self.evaluate(served(bundle.logits), batches)["val_loss"]
        return loss, f"{windows} windows of {self.context} tokens of the validation split"


class TorchDecoder:
    """A DecoderLM as a search.Decoder: numpy tokens in, the last position's logits out, the
    key/value cache kept on the model's device. ``emitted``: the logits kept, the tokenizer's
    size, so that an embedding table padded past it never yields an id it cannot decode."""

    def __init__(self, model: DecoderLM, emitted: int | None = None) -> None:
        self.model = model.eval()
        self.emitted = emitted
        self.device = next(model.parameters()).device
        self.cache: list[KVCache] | None = None

    @torch.no_grad()
    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        ids = torch.from_numpy(tokens).to(self.device)
        if self.cache is None:
            self.cache = self.model.empty_cache(len(ids), self.device)
        attention = None if mask is None else torch.from_numpy(mask).to(self.device)
        return self.model(ids, attention, cache=self.cache)[:, -1, : self.emitted].float().cpu().numpy()

    def reorder(self, rows: np.ndarray) -> None:
        assert self.cache is not None
        index = torch.from_numpy(rows).to(self.device)
        for kv in self.cache:
            kv.key, kv.value = kv.key[index], kv.value[index]

    def reset(self) -> None:
        self.cache = None


def bans(
    task: CausalLMTask, tokenizer: Path | Tokenizer | None, stops: Sequence[int], error: type[Exception]
) -> search.Bans:
    """What the task bans its texts (the manifest's, export-hf's and ``tfcompile sample``'s): its
    suppressed tokens and banned sequences (ids of the run's ``tokenizer``), min_new_tokens,
    min_length and no_repeat_ngram_size;
    ``error`` names a suppressed token the tokenizer lacks, or a stop token (``stops``, the eos's
    and the task's ids) among them."""
    suppressed = listed_token_ids(task, "suppressed_tokens", tokenizer, error)
    if stopping := [i for i in suppressed if i in stops]:
        raise error(
            f"task.suppressed_tokens holds the stop token ids {stopping} (the eos, or task.stop_tokens), "
            f"which would then never end a text: leave them out (max_new_tokens limits a text's length)"
        )
    sequences = tuple(map(tuple, listed_sequences(task, "banned_sequences", tokenizer, error)))
    return search.Bans(
        tuple(suppressed), task.min_new_tokens, task.no_repeat_ngram_size, sequences, task.min_length
    )


def generate(
    model: DecoderLM,
    ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    emitted: int | None = None,
    repetition_penalty: float = 1.0,
    bans: search.Bans = search.NO_BANS,
    min_p: float | None = None,
) -> torch.Tensor:
    """ids (B, T) -> (B, T + max_new_tokens): the shared search over the PyTorch model, reading at
    most the model's max_seq_len last tokens (no stop token: every row gets all its tokens, but
    one that ``bans`` leave no token, which ends there), never an id of ``emitted`` (the
    tokenizer's size) or more, nor one ``bans`` bans."""
    sampling = search.Sampling(temperature, top_k, top_p, seed, repetition_penalty, bans, min_p)
    decoder, context = TorchDecoder(model, emitted), model.spec.max_seq_len
    new = search.generate(decoder, ids.cpu().numpy(), max_new_tokens, sampling, context=context)
    if len({len(row) for row in new}) > 1:
        raise ValueError(
            f"the bans ended rows at {[len(row) for row in new]} tokens: generate them one at a time"
        )
    generated = torch.tensor(new, dtype=ids.dtype, device=ids.device).reshape(len(ids), -1)
    return torch.cat([ids, generated], dim=1)
