"""Causal language modelling: next-token cross-entropy over windows of a token stream, and
sampling from the next-token distribution."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from tfcompile.data import check_fits_context, lm_batch, prepare_corpus
from tfcompile.spec.schema import CausalLMTask, DataSpec
from tfcompile.tasks.objective import Batch, ModelFn, Objective

IGNORE_INDEX = -100  # targets at padded positions carry this and add nothing to the loss


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) with IGNORE_INDEX at padding -> mean loss over real tokens."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )


class CausalLMObjective(Objective):
    """Random windows of ``context`` tokens; each position predicts the next token."""

    def __init__(
        self, task: CausalLMTask, data: DataSpec, context: int, cache_dir: Path, tokenizer: Tokenizer | None
    ) -> None:
        self.task = task
        self.context = context
        self.corpus = prepare_corpus(data, cache_dir, tokenizer)
        self.tokenizer = self.corpus.tokenizer
        check_fits_context(self.corpus, context, data)

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        ids = self.corpus.train if split == "train" else self.corpus.val
        x, y = lm_batch(ids, size, self.context, generator)
        return {"input_ids": x, "targets": y}

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        return causal_lm_loss(model(batch["input_ids"]), batch["targets"], self.task.label_smoothing)

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        losses = [causal_lm_loss(model(b["input_ids"]), b["targets"]).item() for b in batches]
        return {"val_loss": sum(losses) / len(losses)}


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits (B, V) -> next token ids (B,). Temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: nn.Module,
    ids: torch.Tensor,
    max_new_tokens: int,
    max_seq_len: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """ids (B, T) -> (B, T + max_new_tokens), re-reading at most the last max_seq_len tokens."""
    model.eval()
    for _ in range(max_new_tokens):
        logits = model(ids[:, -max_seq_len:])[:, -1]  # (B, V)
        next_ids = sample_next(logits, temperature, top_k, top_p, generator)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
    return ids
