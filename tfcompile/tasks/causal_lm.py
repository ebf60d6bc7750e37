"""Causal language modelling: next-token cross-entropy, and sampling from the next-token distribution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # targets at padded positions carry this and add nothing to the loss


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) with IGNORE_INDEX at padding -> mean loss over real tokens."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )


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
