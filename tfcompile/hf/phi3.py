"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): Mistral's computation (no biases, every layer sliding
when ``sliding_window`` is set) with q, k and v in one ``qkv_proj`` and the gate and up projections
in one ``gate_up_proj``, which are split into the LLaMA layout, and dropout on each sublayer's
output (``resid_pdrop``). Phi-3 computes default RoPE or LongRoPE (Phi-3 128k, Phi-3.5; it
reads ``su`` and ``yarn`` as ``longrope``), on the first ``partial_rotary_factor`` of each head
(Phi-4-mini's 0.75). export-hf writes a Phi-3 spec of whole-head RoPE as Llama, the same
computation, which every transformers version reads, and a LLaMA-like decoder that turns part of
each head as Phi-3 (no biases, default RoPE or LongRoPE, a window over every layer or none)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from tfcompile.hf.architecture import Config, Imported, Needs, Tensors, Windows, dropout, register
from tfcompile.hf.errors import Problem
from tfcompile.hf.llama import (
    EXPORTED_ACTIVATIONS,
    FusedFeedForward,
    deepseek_routed,
    glm_features,
    llama_blocks,
    partial_rotary,
    rope_and_norms,
    rope_decoder_lm,
    rope_section,
    rotary_fraction,
    whole_heads,
)
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec, LongRopeScaling, RopePositional, longrope_attention_factor

ORIGINAL = "original_max_position_embeddings"


@register("phi3")
class Phi3(FusedFeedForward):
    sources: ClassVar[dict[str, str]] = FusedFeedForward.sources | {"model.dropout.residual": "resid_pdrop"}
    windows: ClassVar[Windows] = "every"

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        """Llama's, with Phi3Config's defaults (llama.MODEL_TYPES') and RoPE, and dropout on each
        sublayer's output."""
        imported = super().read(config, architecture, tensors)
        config.require(
            config.data.get("sliding_window") != 0,
            "sliding_window",
            "is 0: a window of no tokens attends to nothing",
            "leave it null (no window), or set a positive number",
        )
        imported.model["dropout"]["residual"] = dropout(config.get("resid_pdrop", 0.0))
        return imported

    def rope(self, config: Config, head_dim: int) -> dict[str, Any]:
        """Phi3Config's RoPE: default or LongRoPE, which it reads su and yarn as (su's original
        length from the dict alone in transformers 5, which fails without one), on the first
        partial_rotary_factor of each head; any other kind is refused, as Phi3Config refuses it."""
        name = "rope_scaling" if config.data.get("rope_scaling") else "rope_parameters"
        params = config.get(name, {})
        kind = params.get("rope_type", params.get("type", "default"))
        if kind in ("su", "yarn"):
            if kind == "su":
                inside, top = params.get("original_max_position_embeddings"), config.get(ORIGINAL)
                config.require(
                    inside is not None and inside == top,
                    f"{name}.{ORIGINAL}",
                    f"is {inside!r} and the top-level {ORIGINAL} {top!r}: transformers 5 reads a su RoPE's "
                    "original length from the dict alone (and fails without one), transformers 4 from the "
                    "top level alone",
                    "give the same length in both, or name the type longrope",
                )
            params = {k: v for k, v in params.items() if k != "type"} | {"rope_type": "longrope"}
            config = config.over(config.data | {name: params})
        section = rope_section(config, head_dim, partial=1.0)
        kind = section.get("scaling", {}).get("type", "default")
        config.require(
            kind in ("default", "longrope"),
            f"{name}.rope_type",
            f"{kind!r}: Phi-3 computes default RoPE, or longrope (as it reads su and yarn)",
            "import a model with default RoPE or LongRoPE",
        )
        return section

    def fused(self, model: DecoderSpec) -> dict[str, list[tuple[str, int]]]:
        """q, k and v in one qkv_proj, gate and up in one gate_up_proj."""
        assert model.head_dim is not None and model.n_kv_heads is not None
        q, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
        qkv = [("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)]
        return {"self_attn.qkv_proj": qkv} | super().fused(model)

    def candidate(self, spec: Spec) -> bool:
        """A LLaMA-like decoder that turns part of each head, without GLM's features (GLM writes
        those) or sigmoid-scored experts (GLM-4.5's): Llama writes every other spec Phi-3 could, as
        the same computation."""
        model = rope_decoder_lm(spec)
        return (
            llama_blocks(model)
            and partial_rotary(model)
            and not glm_features(model)
            and not deepseek_routed(model)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        """Llama's needs of the model with whole-head RoPE, and what Phi-3 lacks besides: biases,
        q/k norms, experts, RoPE scalings but LongRoPE."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs("Phi-3")
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "swiglu")
        rope_and_norms(need, whole_heads(model))
        need.plain_scales(model)
        for name in ("qkv", "attn_out", "ffn"):
            need(not getattr(model.bias, name), f"model.bias.{name}", True, "false (Phi-3 has no biases)")
        scaling = model.positional.scaling
        need(
            scaling is None or scaling.type == "longrope",
            "model.positional.scaling.type",
            None if scaling is None else scaling.type,
            "longrope, or none (Phi-3 computes no other scaling)",
        )
        if isinstance(scaling, LongRopeScaling):
            # Phi3Config reads a LongRoPE of its three fields alone (transformers 4 refuses more)
            # and checks their counts against hidden_size / heads.
            assert model.max_seq_len is not None and model.head_dim is not None
            original = scaling.original_max_position_embeddings
            computable = original > 1 or model.max_seq_len <= original  # the formula divides by ln(original)
            need(
                computable,
                "model.positional.scaling.original_max_position_embeddings",
                original,
                "more than 1 (Phi-3 computes the attention factor from its logarithm)",
            )
            if computable:
                expected = longrope_attention_factor(model.max_seq_len / original, original)
                need(
                    scaling.attention_factor is not None and math.isclose(scaling.attention_factor, expected),
                    "model.positional.scaling.attention_factor",
                    scaling.attention_factor,
                    f"{expected} (Phi-3 computes it from max_seq_len over the original length)",
                )
            need(
                model.head_dim * model.n_heads == model.d_model,
                "model.head_dim",
                model.head_dim,
                f"d_model / n_heads (Phi-3 counts LongRoPE's factors by {model.d_model // model.n_heads})",
            )
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        """Llama's (or Mistral's) fields as Phi3Config names them, the window over every layer, the
        rotated fraction of each head at the top level (transformers 4) and in rope_parameters (5)."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        assert model.head_dim is not None
        config = {k: v for k, v in super().to_config(spec).items() if k not in ("attention_bias", "mlp_bias")}
        fraction = rotary_fraction(model.positional.width(model.head_dim), model.head_dim)
        rope: dict[str, Any] = {"rope_type": "default"}
        scaling = model.positional.scaling
        if scaling is not None:  # LongRoPE (exportable): its three fields, as transformers 4 takes them
            assert isinstance(scaling, LongRopeScaling)
            rope = {
                "type": "longrope",
                "short_factor": scaling.short_factor,
                "long_factor": scaling.long_factor,
            }
        return config | {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "partial_rotary_factor": fraction,
            "rope_scaling": rope if scaling is not None else None,
            "rope_parameters": {
                **rope,
                "rope_theta": model.positional.theta,
                "partial_rotary_factor": fraction,
            },
            "sliding_window": None if model.window is None else model.window.size,
            "resid_pdrop": model.dropout.residual,
            "embd_pdrop": 0.0,
        }
