"""GPT-BigCode (``GPTBigCodeForCausalLM``: SantaCoder, StarCoder): GPT-2's blocks and config
fields with multi-query attention (``multi_query``: one K/V head) and ``nn.Linear`` layers (no
Conv1D transposes). Its fused ``c_attn`` is q (d rows), k and v (head_dim rows each) under MQA,
tfcompile's packed layout; without MQA it is [q, k, v] of each head in turn, reordered to it.

``attention_softmax_in_fp32`` and ``scale_attention_softmax_in_fp32`` only change the numerics
of a half-precision softmax (transformers 4 upcasts it with them; 5 uses neither): the import
computes in float32, where they change nothing."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tfcompile.hf.architecture import (
    EXPORTED_ACTIVATIONS,
    Config,
    Needs,
    register,
)
from tfcompile.hf.errors import Problem
from tfcompile.hf.gpt2 import GPT2, learned_decoder_lm, multi_query
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

# GPT-2's names of the spec's activations, but GPT-BigCode's own for the tanh GELU (the same formula).
ACTIVATION_NAMES = EXPORTED_ACTIVATIONS | {"gelu_tanh": "gelu_pytorch_tanh"}


@register("gpt_bigcode")
class GPTBigCode(GPT2):
    """GPT-2's prefix, config field names (``sources``) and tensor names; its own heads, attention
    and layers."""

    name: ClassVar[str] = "GPT-BigCode"
    head: ClassVar[str] = "GPTBigCodeForCausalLM"
    body: ClassVar[str] = "GPTBigCodeModel"
    default_activation: ClassVar[str] = "gelu_pytorch_tanh"
    activation_names: ClassVar[dict[str, str]] = ACTIVATION_NAMES
    fixed: ClassVar[dict[str, Any]] = {"multi_query": True}  # MQA: the candidate's

    def kv_heads(self, config: Config, heads: int) -> int:
        """One under ``multi_query`` (num_key_value_heads, where a config.json holds it, is unread:
        transformers derives it), else as many as the query heads."""
        return 1 if config.get("multi_query", True) else heads

    def read_layer(self, hf: str, kind: str, t: torch.Tensor, model: DecoderSpec) -> torch.Tensor:
        """A block's tensor as tfcompile holds it: ``nn.Linear`` layers as they are, c_attn packed."""
        return packed(t, model) if hf == "attn.c_attn" else t

    def written_layer(self, hf: str, kind: str, t: torch.Tensor, model: DecoderSpec) -> torch.Tensor:
        """A block's tensor as transformers holds it: as it is (under MQA, the candidate's, c_attn is
        tfcompile's packed q, k, v)."""
        return t

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with learned positions and MQA, whatever its norms."""
        model = learned_decoder_lm(spec)
        return model is not None and multi_query(model)

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        need = Needs(self.name)
        need(
            model.activation in self.activation_names,
            "model.activation",
            model.activation,
            "gelu_tanh (gelu_pytorch_tanh)",
        )
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.bias), "model.norm.bias", False, "true")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        need.plain_attention(model, unscaled=True)  # scale_attn_weights false
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        """GPT-2's fields (GPT-2's warning of how transformers 4 reads scale_attn_weights is GPT-2's own)."""
        model = spec.model
        assert isinstance(model, DecoderSpec)
        return self.written_config(model)


def packed(c_attn: torch.Tensor, model: DecoderSpec) -> torch.Tensor:
    """``c_attn``'s weight or bias with its rows as tfcompile packs them: all q, then k, then v.
    Under MQA they are already; without it, transformers views the output as (heads, 3 x
    head_dim), [q, k, v] of one head after another."""
    if model.n_kv_heads != model.n_heads:
        return c_attn
    assert model.head_dim is not None
    rows = c_attn.reshape(model.n_heads, 3, model.head_dim, *c_attn.shape[1:])
    return rows.transpose(0, 1).reshape(c_attn.shape)
