"""Encoder-decoder Transformer (Vaswani et al. 2017, T5): an encoder over the source, a causal
decoder over the target whose blocks cross-attend to the encoder's output, an LM head."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from tfcompile.models.common import Assembly, check_token_ids, init_weights, require_vocab_size
from tfcompile.nn.attention import KVCache, may_attend
from tfcompile.nn.block import TransformerBlock, build_blocks, build_final_norm, build_norm
from tfcompile.nn.positional import build_positional, positions_from_mask
from tfcompile.spec.schema import EncoderDecoderSpec


class Seq2Seq(Assembly):
    """source_ids (B, S) [+ source_mask (B, S)], target_ids (B, T) [+ target_mask (B, T)]
    -> logits (B, T, vocab_size) for the token after each target position."""

    def __init__(self, spec: EncoderDecoderSpec) -> None:
        super().__init__()
        vocab_size = require_vocab_size(spec)
        assert spec.n_decoder_layers is not None  # resolved by the schema
        self.spec = spec
        self.embed = nn.Embedding(vocab_size, spec.d_model)  # the source's, and the target's if shared
        self.target_embed = self.embed if spec.share_embeddings else nn.Embedding(vocab_size, spec.d_model)
        self.embed_scale = spec.d_model**0.5 if spec.scale_embeddings else 1.0
        # Separate position modules: T5's relative buckets look both ways in the encoder, back only
        # in the decoder; a learned table is learned per side.
        self.encoder_positional = build_positional(spec, bidirectional=True)
        self.decoder_positional = build_positional(spec, bidirectional=False)
        # BART's norm after the summed embeddings, one per stack
        self.encoder_embed_norm, self.decoder_embed_norm = (
            build_norm(spec.norm, spec.d_model) if spec.embedding_norm else nn.Identity() for _ in range(2)
        )
        self.drop = nn.Dropout(spec.dropout.embedding)
        self.encoder_blocks = build_blocks(spec, spec.n_layers)
        self.encoder_norm = build_final_norm(spec)
        self.decoder_blocks: list[TransformerBlock] = build_blocks(  # type: ignore[assignment]
            spec, spec.n_decoder_layers, cross_attention=True
        )
        self.decoder_norm = build_final_norm(spec)
        self.output_scale = spec.d_model**-0.5 if spec.scale_output else 1.0
        self.lm_head = nn.Linear(spec.d_model, vocab_size, bias=spec.bias.lm_head)
        self.apply(partial(init_weights, std=spec.init_std))
        if spec.tie_embeddings:
            self.lm_head.weight = self.target_embed.weight

    def forward(
        self,
        source_ids: torch.Tensor,
        source_mask: torch.Tensor | None,
        target_ids: torch.Tensor,
        target_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        memory = self.encode(source_ids, source_mask)
        return self.decode(target_ids, self.project_memory(memory), source_mask, target_mask)

    def encode(self, source_ids: torch.Tensor, source_mask: torch.Tensor | None = None) -> torch.Tensor:
        """-> the encoder's output (B, S, d_model)."""
        check_token_ids(source_ids, "source_ids", self.spec.max_seq_len)
        index = torch.arange(source_ids.shape[1], device=source_ids.device)
        positions = index if source_mask is None else positions_from_mask(source_mask)  # (B?, S)
        x = self.encoder_positional.embed(self.embed(source_ids) * self.embed_scale, positions)
        x = self.drop(self.encoder_embed_norm(x))
        rotaries = self.encoder_positional.layer_rotaries(positions, len(self.encoder_blocks))
        bias = self.encoder_positional.attention_bias(positions, positions)
        padding = source_mask.bool() if source_mask is not None else None
        mask = may_attend(index, index, False, padding)
        for block, rotary in zip(self.encoder_blocks, rotaries, strict=True):
            x = block(x, mask, False, rotary, bias)
        return self.encoder_norm(x)

    def project_memory(self, memory: torch.Tensor) -> list[KVCache]:
        """The encoder output's keys and values for each decoder block's cross-attention."""
        return [
            block.cross.project_memory(memory) for block in self.decoder_blocks if block.cross is not None
        ]

    def decode(
        self,
        target_ids: torch.Tensor,
        memory: list[KVCache],
        source_mask: torch.Tensor | None,
        target_mask: torch.Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """target_ids (B, T): the next T target tokens after the P in ``cache`` (self-attention keys
        and values, extended in place); target_mask covers all P + T. -> logits (B, T, vocab)."""
        past = cache[0].length if cache else 0
        check_token_ids(target_ids, "target_ids", self.spec.max_seq_len, past)
        index = torch.arange(past + target_ids.shape[1], device=target_ids.device)
        k_positions = index if target_mask is None else positions_from_mask(target_mask)  # (B?, P + T)
        positions = k_positions[..., past:]
        x = self.target_embed(target_ids) * self.embed_scale
        x = self.drop(self.decoder_embed_norm(self.decoder_positional.embed(x, positions)))
        rotaries = self.decoder_positional.layer_rotaries(positions, len(self.decoder_blocks))
        bias = self.decoder_positional.attention_bias(positions, k_positions)
        padding = target_mask.bool() if target_mask is not None else None
        mask = may_attend(index[past:], index, True, padding)
        source = source_mask.bool()[:, None, None, :] if source_mask is not None else None  # (B, 1, 1, S)
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, mask, False, rotaries[i], bias, cache[i] if cache else None, memory[i], source)
        return self.lm_head(self.decoder_norm(x) * self.output_scale)  # (B, T, vocab)

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor | None, ...]:
        """Source and target of the full context's length, on the model's device."""
        ids = torch.zeros(batch, self.spec.max_seq_len, dtype=torch.long, device=self.embed.weight.device)
        return ids, None, ids

    def empty_cache(self, batch: int, device: torch.device | None = None) -> list[KVCache]:
        """Decoder self-attention caches holding no tokens: (batch, n_kv_heads, 0, head_dim)."""
        spec, dtype = self.spec, self.embed.weight.dtype
        assert spec.n_kv_heads is not None  # resolved by the schema
        return [
            KVCache.empty(batch, spec.n_kv_heads, spec.head_dim, dtype, device) for _ in self.decoder_blocks
        ]
