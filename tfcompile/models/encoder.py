"""Bidirectional encoders (BERT): embeddings, N blocks without a causal mask, and a task head.

``Encoder`` is the body that pretraining and fine-tuning share; ``MaskedLM`` and ``Classifier``
add their heads. The body's parameter names are the same in both, so a classifier starts from a
pretraining run by loading every tensor the body has (see ``train.init.init_from_run``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.models.common import Assembly, check_token_ids, init_weights, require_vocab_size
from tfcompile.nn.attention import may_attend
from tfcompile.nn.block import build_blocks, build_final_norm, build_norm
from tfcompile.nn.positional import build_positional, positions_from_mask
from tfcompile.nn.registry import ACTIVATIONS
from tfcompile.spec.schema import EncoderSpec

# model.pooler_activation -> what follows the pooler's dense layer: BERT's tanh, DistilBERT's ReLU,
# ELECTRA's (erf) GELU.
POOLER_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": F.gelu,
}


class Encoder(Assembly):
    """input_ids (B, T), attention_mask (B, T) 1 for real tokens, token_type_ids (B, T) segment
    -> hidden states (B, T, d_model). Position 0 holds [CLS]."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        width = spec.embedding_width  # d_model, or a narrower embedding_size (ALBERT, ELECTRA)
        self.embed = nn.Embedding(require_vocab_size(spec), width)
        self.segment_embed = nn.Embedding(spec.type_vocab_size, width) if spec.type_vocab_size else None
        self.positional = build_positional(spec, bidirectional=True)
        self.embed_norm = build_norm(spec.norm, width) if spec.embedding_norm else nn.Identity()
        self.drop = nn.Dropout(spec.dropout.embedding)
        self.embed_project = nn.Linear(width, spec.d_model) if spec.projects_embeddings else nn.Identity()
        self.blocks = build_blocks(spec, 1 if spec.share_layers else spec.n_layers)
        if spec.share_layers:  # ALBERT: one block's weights in every layer
            self.blocks = nn.ModuleList([self.blocks[0]] * spec.n_layers)
        self.final_norm = build_final_norm(spec)
        # BERT's pooler: the [CLS] state through a dense layer and tanh (DistilBERT's classifier:
        # ReLU), for the sentence-level heads.
        self.pooler = nn.Linear(spec.d_model, spec.d_model) if spec.pooler else None
        self.pooler_norm = build_norm(spec.norm, spec.d_model) if spec.pooler_norm else nn.Identity()
        self.sliding = spec.sliding_layers  # the blocks whose attention reads spec.window only

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check_inputs(input_ids, attention_mask, token_type_ids)
        index = torch.arange(input_ids.shape[1], device=input_ids.device)
        positions = index if attention_mask is None else positions_from_mask(attention_mask)  # (B?, T)
        x = self.embed(input_ids)  # (B, T, embedding width)
        if self.spec.scale_embeddings:
            x = x * self.spec.d_model**0.5
        if self.segment_embed is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.segment_embed(types)
        x = self.drop(self.embed_norm(self.positional.embed(x, positions)))  # (B, T, embedding width)
        x = self.embed_project(x)  # (B, T, d)
        rotaries = self.positional.layer_rotaries(positions, len(self.blocks))
        bias = self.positional.attention_bias(positions, positions)  # (1 or B, H, T, T) or None
        padding = attention_mask.bool() if attention_mask is not None else None
        mask = may_attend(index, index, False, padding)  # (B, 1, T, T) or None
        window = self.spec.window
        local = None if window is None else may_attend(index, index, False, padding, window.size)
        for i, (block, rotary) in enumerate(zip(self.blocks, rotaries, strict=True)):
            x = block(x, local if i in self.sliding else mask, False, rotary, bias)
        return self.final_norm(x)

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Inputs of the full context's length, on the model's device (summaries, tracing)."""
        return (torch.zeros(batch, self.spec.max_seq_len, dtype=torch.long, device=self.embed.weight.device),)

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d) -> (B, d): the [CLS] state (pooling: mean, the mean of the real tokens'
        states) through the pooler, its activation and, where the spec has one, its norm."""
        if self.pooler is None:
            raise ValueError("the model has no pooler (model.pooler: false) to pool the [CLS] state with")
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0]  # (B, d)
        elif attention_mask is None:
            pooled = hidden.mean(1)
        else:
            real = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (hidden * real).sum(1) / real.sum(1)
        return self.pooler_norm(POOLER_ACTIVATIONS[self.spec.pooler_activation](self.pooler(pooled)))

    def _check_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
    ) -> None:
        check_token_ids(input_ids, "input_ids", self.spec.max_seq_len)
        for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if tensor is not None and tensor.shape != input_ids.shape:
                raise ValueError(
                    f"{name} shape {tuple(tensor.shape)} must match input_ids {tuple(input_ids.shape)}"
                )


class MaskedLM(Encoder):
    """-> (token logits (B, T, vocab), next-sentence logits (B, 2) or None).

    BERT's heads: dense + the spec's activation + norm, then a projection to the vocabulary (tied to
    the token embeddings when the spec ties them); next-sentence prediction from the pooled [CLS]
    state.
    """

    heads = ("mlm_dense", "mlm_norm", "lm_head", "nsp_head")  # what fine-tuning leaves behind

    def __init__(self, spec: EncoderSpec, next_sentence: bool) -> None:
        super().__init__(spec)
        assert spec.vocab_size is not None
        width = spec.embedding_width  # the head maps back to the embeddings' width
        self.mlm_dense = nn.Linear(spec.d_model, width)
        self.mlm_activation = ACTIVATIONS[spec.activation]  # a gated name's nonlinearity, ungated
        self.mlm_norm = build_norm(spec.norm, width)
        self.lm_head = nn.Linear(width, spec.vocab_size, bias=spec.bias.lm_head)
        self.nsp_head = nn.Linear(spec.d_model, 2) if next_sentence else None
        self.apply(partial(init_weights, std=spec.init_std))
        if spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        logits = self.lm_head(self.mlm_norm(self.mlm_activation(self.mlm_dense(hidden))))  # (B, T, vocab)
        nsp = (
            self.nsp_head(self.pool(hidden, attention_mask)) if self.nsp_head is not None else None
        )  # (B, 2)
        return logits, nsp


class Classifier(Encoder):
    """-> logits (B, num_labels) from the pooled [CLS] state."""

    heads = ("classifier",)

    def __init__(self, spec: EncoderSpec, num_labels: int) -> None:
        super().__init__(spec)
        self.head_drop = nn.Dropout(spec.dropout.residual)
        self.classifier = nn.Linear(spec.d_model, num_labels)
        self.apply(partial(init_weights, std=spec.init_std))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.head_drop(self.pool(hidden, attention_mask)))  # (B, num_labels)
