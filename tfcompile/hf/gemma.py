"""Gemma (``GemmaForCausalLM``, Gemma 1): LLaMA's layout with embeddings multiplied by
sqrt(hidden_size), a gated GELU (tanh), RMSNorms that scale by (1 + weight), heads of their own
``head_dim`` and one ``attention_bias`` for q, k, v and o. The (1 + weight) is folded into the
spec's RMSNorm weight at import (transformers computes it in float32, as tfcompile does) and
unfolded at export. Gemma 2 and 3 (softcapping, sandwich norms, q/k norms) are other model types."""

from __future__ import annotations

from typing import Any

from tfcompile.hf.architecture import (
    Config,
    Imported,
    Needs,
    State,
    Tensors,
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


@register("gemma")
class Gemma(Llama):
    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        gemma = as_gemma_reads(config)
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
        """A decoder LM with RoPE whose embeddings are scaled (without, it is Llama's)."""
        model = rope_decoder_lm(spec)
        return model is not None and model.scale_embeddings

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs("Gemma")
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
