"""Persimmon (``PersimmonForCausalLM``: Persimmon-8B, and Fuyu-8B's language model): GPT-NeoX's
blocks in turn (a LayerNorm with a bias before attention and before the feed-forward), its fused
``query_key_value`` of [q, k, v] of one head after another (with biases, as the output projection
``dense`` and the feed-forward), RoPE on the first ``partial_rotary_factor`` of each head as its
two halves (PersimmonConfig's 0.5 where none is named), each head's q and k normalised by a
LayerNorm of head_dim with a bias shared by the heads (``qk_layernorm``: ``qk_norm`` of the blocks'
LayerNorm), PersimmonConfig's squared ReLU by default, an untied LM head without a bias.

``hidden_dropout`` drops out the feed-forward's output only in transformers, each sublayer's in
tfcompile (``dropout.residual``, with a warning: the outputs are the same, a fine-tune's dropout
differs). Import only: export-hf writes such a model as GPT-NeoX, which refuses q/k norms by field."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    Architecture,
    Config,
    Imported,
    State,
    Tensors,
    dropout,
    init_std,
    lm_head,
    pad_within,
    register,
)
from tfcompile.hf.errors import HFWarning
from tfcompile.hf.gpt_neox import grouped, rope_sources
from tfcompile.hf.llama import FALLBACKS, rope_section
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

# Persimmon's names within a block -> tfcompile's (the fused q, k, v apart), each with a bias.
LAYER = (
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.dense", "attn.out"),
    ("mlp.dense_h_to_4h", "ffn.w_in"),
    ("mlp.dense_4h_to_h", "ffn.w_out"),
)
QK_NORMS = (("self_attn.q_layernorm", "attn.q_norm"), ("self_attn.k_layernorm", "attn.k_norm"))
PARTIAL = 0.5  # PersimmonConfig's partial_rotary_factor where the config names none


@register("persimmon")
class Persimmon(Architecture):
    prefixes = ("model.",)
    ignored = ("rotary_emb.inv_freq",)  # a buffer in older checkpoints
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.norm.eps": "layer_norm_eps",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "hidden_dropout",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("PersimmonForCausalLM", "PersimmonModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a PersimmonForCausalLM",
        )
        names = ("lm_head.weight", "embed_tokens.weight")
        tie = lm_head(config, tensors, architecture, names, False, "PersimmonForCausalLM")
        d, heads = config.get("hidden_size", 4096), config.get("num_attention_heads", 64)
        vocab = config.get("vocab_size", 262144)
        pad_within(config, vocab)
        residual = dropout(config.get("hidden_dropout", 0.0))
        if residual:
            warnings.warn(
                HFWarning(
                    f"hidden_dropout {residual}: Persimmon drops out its feed-forward's output only, "
                    "tfcompile each sublayer's; the outputs are the same, a fine-tune's dropout differs"
                ),
                stacklevel=2,
            )
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 16384),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 36),
            "n_heads": heads,
            "d_ff": config.get("intermediate_size", 16384),
            "activation": config.choice("hidden_act", "relu2", ACTIVATIONS, "activation"),
            "positional": rope_section(config, d // max(heads, 1), PARTIAL),  # 0 heads: refused by the spec
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_eps", 1e-5)},
            "qk_norm": config.get("qk_layernorm", True),
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "tie_embeddings": tie,
            "dropout": {"attention": dropout(config.get("attention_dropout", 0.0)), "residual": residual},
            "init_std": init_std(config),
        }
        sources = rope_sources(config, FALLBACKS) | {"model.qk_norm": "qk_layernorm"}
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("embed_tokens.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("final_layernorm.weight"),
            "final_norm.bias": tensors.take("final_layernorm.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias"):
                state[f"{b}attn.qkv.{kind}"] = grouped(tensors, f"{h}self_attn.query_key_value.{kind}", model)
                for hf, tfc in LAYER + (QK_NORMS if model.qk_norm else ()):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state
