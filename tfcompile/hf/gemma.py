"""Gemma (``GemmaForCausalLM``, Gemma 1): LLaMA's layout with embeddings multiplied by
sqrt(hidden_size), a gated GELU (tanh), RMSNorms that scale by (1 + weight), heads of their own
``head_dim`` and one ``attention_bias`` for q, k, v and o. The (1 + weight) is folded into the
spec's RMSNorm weight at import (transformers computes it in float32, as tfcompile does) and
unfolded at export.

Gemma 2 (``Gemma2ForCausalLM``) adds a norm on each sublayer's output (``norm.position:
sandwich``), attention scores and logits capped by c * tanh(x / c) (``attention_softcap``,
``logit_softcap``), q.k scaled by query_pre_attn_scalar^-0.5 (``attention_scale``) and a sliding
window on every other layer (the context is the window where it is shorter). Gemma 3, with a RoPE
per layer type, is another model type."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    json_type,
    register,
)
from tfcompile.hf.errors import Problem
from tfcompile.hf.llama import Llama, rope_and_norms, rope_decoder_lm
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec, RopePositional

# GemmaConfig's defaults where LlamaConfig's differ: a config.json that leaves a field out (or
# null) is read as transformers reads it. Its head_dim's is llama.MODEL_TYPES'.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
# GemmaConfig reads the erf GELU's name as the tanh GELU that Gemma was trained with: the erf GELU
# is written as gelu_python, which it leaves alone. Older transformers 4 releases read
# hidden_activation instead of hidden_act: both are written, the same.
EXPORTED_ACTIVATIONS = {"geglu_tanh": "gelu_pytorch_tanh", "geglu": "gelu_python", "swiglu": "silu"}


# Gemma2Config's defaults where GemmaConfig's differ. A null cap is none, not the default:
# Gemma2Config keeps the null (a null window, which transformers fails on, is refused in read).
GEMMA2_DEFAULTS: dict[str, Any] = {
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256,
}
GEMMA2_NULLABLE: dict[str, Any] = {
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "sliding_window": 4096,
}


def as_gemma_reads(config: Config) -> Config:
    """``config`` with GemmaConfig's defaults where a field is missing or null, and hidden_act
    "gelu" as the tanh GELU, as GemmaConfig reads it; its problems are ``config``'s."""
    data = dict(config.data)
    for name, value in DEFAULTS.items():
        if data.get(name) is None:
            data[name] = value
    if data["hidden_act"] == "gelu":
        data["hidden_act"] = "gelu_pytorch_tanh"
    return Config(data, config.problems)


def as_gemma2_reads(config: Config) -> Config:
    """``config`` with Gemma2Config's defaults where a field is missing or null (a cap or the
    window: missing only), as Gemma2Config reads it; its problems are ``config``'s. Its activation
    is hidden_activation's (hidden_act is unread), with no legacy renaming."""
    data = dict(config.data)
    for name, value in (DEFAULTS | GEMMA2_DEFAULTS).items():
        if data.get(name) is None:
            data[name] = value
    for name, value in GEMMA2_NULLABLE.items():
        data.setdefault(name, value)
    return Config(data, config.problems)


@register("gemma")
class Gemma(Llama):
    title = "Gemma"

    def reads(self, config: Config) -> Config:
        """The config as this model type's config class reads it."""
        return as_gemma_reads(config)

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        gemma = self.reads(config)
        imported = super().read(gemma, architecture, tensors)
        gemma.refuse_true(
            "use_bidirectional_attention", why="attention over every token is not a causal LM's"
        )
        return imported

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        state = super().to_state(tensors, spec)
        norms = [f"blocks.{i}.{n}_norm.weight" for i in range(spec.model.n_layers) for n in ("attn", "ffn")]
        for name in [*norms, "final_norm.weight"]:
            state[name] = 1.0 + state[name]  # as GemmaRMSNorm computes it, in float32
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE whose embeddings are scaled (without, it is Llama's), without
        sandwich norms (Gemma 2's)."""
        model = rope_decoder_lm(spec)
        return model is not None and model.scale_embeddings and model.norm.position != "sandwich"

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs(self.title)
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "geglu_tanh")
        rope_and_norms(need, model)
        need(not model.bias.ffn, "model.bias.ffn", True, "false")
        # Gemma scales its embeddings always (the candidate's): the other scales, and no q/k norms,
        # as Llama's.
        need.plain_scales(model.model_copy(update={"scale_embeddings": False}))
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        config = super().to_config(spec)
        config.pop("mlp_bias")  # Llama's alone
        activation = EXPORTED_ACTIVATIONS[model.activation]
        return config | {
            "architectures": ["GemmaForCausalLM"],
            "model_type": "gemma",
            "hidden_act": activation,
            "hidden_activation": activation,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.n_kv_heads is not None
        out = super().from_state(state, spec)
        norms = [
            f"model.layers.{i}.{n}_layernorm.weight"
            for i in range(model.n_layers)
            for n in ("input", "post_attention")
        ]
        for name in [*norms, "model.norm.weight"]:
            out[name] = out[name] - 1.0
        return out


@register("gemma2")
class Gemma2(Gemma):
    title = "Gemma 2"
    sources: ClassVar[dict[str, str]] = Gemma.sources | {
        "model.activation": "hidden_activation",
        "model.attention_scale": "query_pre_attn_scalar",
        "model.attention_softcap": "attn_logit_softcapping",
        "model.logit_softcap": "final_logit_softcapping",
    }

    def reads(self, config: Config) -> Config:
        return as_gemma2_reads(config)

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        gemma2 = self.reads(config)
        imported = super().read(config, architecture, tensors)
        model = imported.model
        scalar = gemma2.data["query_pre_attn_scalar"]
        if json_type(scalar) == "a number" and scalar > 0:
            model["attention_scale"] = float(scalar) ** -0.5
        else:
            gemma2.refuse("query_pre_attn_scalar", f"{scalar!r} is not a positive number", "fix the file")
        model["attention_softcap"] = gemma2.data["attn_logit_softcapping"]  # a bad cap: the spec refuses it
        model["logit_softcap"] = gemma2.data["final_logit_softcapping"]
        model["norm"]["position"] = "sandwich"
        gemma2.require(
            gemma2.data["sliding_window"] is not None,
            "sliding_window",
            "is null: transformers' Gemma 2 builds its sliding layers' mask from a window, even where "
            "no layer slides, and fails without one",
            "give a window (at least max_position_embeddings where no layer should slide)",
        )
        return imported

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """Gemma's, whose ffn_norm took post_attention_layernorm: that is the attention's output
        norm here, and the feed-forward has a norm before and after it."""
        state = super().to_state(tensors, spec)
        for i in range(spec.model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            state[f"{b}attn_out_norm.weight"] = state.pop(f"{b}ffn_norm.weight")
            state[f"{b}ffn_norm.weight"] = 1.0 + tensors.take(f"{h}pre_feedforward_layernorm.weight")
            state[f"{b}ffn_out_norm.weight"] = 1.0 + tensors.take(f"{h}post_feedforward_layernorm.weight")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE, scaled embeddings and sandwich norms."""
        model = rope_decoder_lm(spec)
        return model is not None and model.scale_embeddings and model.norm.position == "sandwich"

    def exportable(self, spec: Spec) -> list[Problem]:
        """Gemma's needs of the model with Gemma 2's own four taken out: sandwich norms (the
        candidate's), the two caps, and an attention scale of 1/sqrt(n) for a whole n
        (query_pre_attn_scalar, an integer in Gemma2Config)."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.attention_scale
        need = Needs(self.title)
        scalar = query_pre_attn_scalar(model.attention_scale)
        need(
            scalar >= 1 and math.isclose(scalar**-0.5, model.attention_scale, rel_tol=1e-12),
            "model.attention_scale",
            model.attention_scale,
            "1/sqrt(n) for a whole number n (Gemma 2's query_pre_attn_scalar)",
        )
        as_gemma = model.model_copy(
            update={
                "norm": model.norm.model_copy(update={"position": "pre"}),
                "attention_scale": model.head_dim**-0.5,
                "attention_softcap": None,
                "logit_softcap": None,
            }
        )
        return need.problems + super().exportable(spec.model_copy(update={"model": as_gemma}))

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.n_layers and model.attention_scale
        return super().to_config(spec) | {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "query_pre_attn_scalar": query_pre_attn_scalar(model.attention_scale),
            "attn_logit_softcapping": model.attention_softcap,  # null: none (missing: 50)
            "final_logit_softcapping": model.logit_softcap,
            # no layer slides (transformers wants a window all the same: one of the whole context)
            "sliding_window": model.max_seq_len,
            "layer_types": ["full_attention"] * model.n_layers,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        out = super().from_state(state, spec)
        for i in range(spec.model.n_layers):
            h, b = f"model.layers.{i}.", f"blocks.{i}."
            out[f"{h}post_attention_layernorm.weight"] = state[f"{b}attn_out_norm.weight"] - 1.0
            out[f"{h}pre_feedforward_layernorm.weight"] = state[f"{b}ffn_norm.weight"] - 1.0
            out[f"{h}post_feedforward_layernorm.weight"] = state[f"{b}ffn_out_norm.weight"] - 1.0
        return out


def query_pre_attn_scalar(scale: float) -> int:
    """The whole n nearest to the one whose n^-0.5 is ``scale``."""
    return round(scale**-2)
