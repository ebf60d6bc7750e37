"""Decoder-only language model (GPT, LLaMA): embeddings, N causal blocks, final norm, LM head."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from tfcompile.models.common import Assembly, check_token_ids, init_weights, require_vocab_size
from tfcompile.nn.attention import KVCache, may_attend
from tfcompile.nn.block import build_blocks, build_final_norm, build_norm
from tfcompile.nn.positional import build_positional, positions_from_mask
from tfcompile.spec.schema import DecoderSpec

# What a training loss may ask of forward instead of the logits: the final hidden states
# (batch, seq, d_model) and the head that turns rows of them into logits; it returns the loss.
HeadLoss = Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]


class DecoderLM(Assembly):
    """input_ids (batch, seq) int64 [+ attention_mask (batch, seq), True/1 for real tokens]
    -> logits (batch, seq, vocab_size).

    The embedding and the LM head have ``spec.vocab_rows`` rows, the vocabulary padded to a
    multiple of ``spec.vocab_multiple_of`` for the GPU's matmuls; the logits keep the first
    vocab_size columns only, so the padded rows are never a prediction, a target or an output."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.vocab_size = require_vocab_size(spec)
        self.padded = spec.vocab_rows > self.vocab_size
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_rows, spec.d_model)
        root = math.sqrt(spec.d_model) if spec.scale_embeddings else 1.0
        self.embed_scale = root * spec.embedding_multiplier
        self.positional = build_positional(spec, bidirectional=False)
        self.embed_norm = build_norm(spec.norm, spec.d_model) if spec.embedding_norm else nn.Identity()
        self.drop = nn.Dropout(spec.dropout.embedding)
        self.blocks = build_blocks(spec, spec.n_layers)
        self.sliding = spec.sliding_layers  # the blocks whose attention reads spec.window only
        self.final_norm = build_final_norm(spec)
        self.output_scale = spec.d_model**-0.5 if spec.scale_output else 1.0
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_rows, bias=spec.bias.lm_head)
        self.apply(partial(init_weights, std=spec.init_std))
        if spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: list[KVCache] | None = None,
        loss: HeadLoss | None = None,
    ) -> torch.Tensor:
        """The logits (B, T, vocab_size), or with ``loss`` what it makes of the final hidden states
        and the head (a training loss that never holds every position's logits at once). Called
        through forward, the loss runs inside whatever wraps the model (DDP, FSDP, torch.compile)."""
        x = self.hidden(input_ids, attention_mask, cache)
        return self.head(x) if loss is None else loss(x, self.head)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (..., d_model) -> logits (..., vocab_size), padded rows left out,
        times ``logit_multiplier``, capped to c * tanh(logits / c) where the spec has a
        ``logit_softcap`` c."""
        logits = self.lm_head(x)
        logits = logits[..., : self.vocab_size] if self.padded else logits
        if self.spec.logit_multiplier != 1.0:
            logits = logits * self.spec.logit_multiplier
        cap = self.spec.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """The final hidden states (B, T, d_model), what the LM head reads. With ``cache`` (one
        KVCache per layer, P tokens so far), input_ids are the next T tokens, attention_mask covers
        all P + T, and each layer's cache is extended by the T new tokens. Positions count the real
        tokens of the mask (a left-padded row is encoded as it would be alone); without a mask they
        are the column indices."""
        past = cache[0].length if cache else 0
        self._check_inputs(input_ids, attention_mask, past)
        T = input_ids.shape[1]
        index = torch.arange(past + T, device=input_ids.device)  # columns: past tokens, then new
        k_positions = index if attention_mask is None else positions_from_mask(attention_mask)  # (B?, P + T)
        positions = k_positions[..., past:]  # of the new tokens
        x = self.embed(input_ids)  # (B, T, d)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        x = self.drop(self.embed_norm(self.positional.embed(x, positions)))
        rotaries = self.positional.layer_rotaries(positions, len(self.blocks))
        bias = self.positional.attention_bias(positions, k_positions)  # (1 or B, H, T, P + T) or None
        padding = attention_mask.bool() if attention_mask is not None else None
        # Without padding, a score bias, a cache or a window, the fused causal kernel needs no T x T mask.
        window = self.spec.window
        use_kernel_causal = padding is None and bias is None and cache is None and window is None
        mask = None if use_kernel_causal else may_attend(index[past:], index, True, padding)
        local = None if window is None else may_attend(index[past:], index, True, padding, window.size)
        for i, block in enumerate(self.blocks):
            layer_mask = local if i in self.sliding else mask
            x = block(x, layer_mask, use_kernel_causal, rotaries[i], bias, cache[i] if cache else None)
        return self.final_norm(x) * self.output_scale  # (B, T, d)

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Inputs of the full context's length, on the model's device (summaries, tracing)."""
        return (torch.zeros(batch, self.spec.max_seq_len, dtype=torch.long, device=self.embed.weight.device),)

    def empty_cache(self, batch: int, device: torch.device | None = None) -> list[KVCache]:
        """A cache holding no tokens: (batch, n_kv_heads, 0, head_dim) per layer."""
        spec, dtype = self.spec, self.embed.weight.dtype
        assert spec.n_kv_heads is not None  # resolved by the schema
        return [KVCache.empty(batch, spec.n_kv_heads, spec.head_dim, dtype, device) for _ in self.blocks]

    def _check_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, past: int) -> None:
        check_token_ids(input_ids, "input_ids", self.spec.max_seq_len, past)
        B, T = input_ids.shape
        if attention_mask is not None and attention_mask.shape != (B, past + T):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must be (batch, cached + new tokens) "
                f"= {(B, past + T)}"
            )
