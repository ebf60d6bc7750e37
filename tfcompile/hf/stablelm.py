"""StableLM (``StableLmForCausalLM``: StableLM-3B-4E1T, StableLM 2, StableLM Zephyr): LLaMA's
attention and gated feed-forward with LayerNorms (with biases) before each sublayer and after the
last block, RoPE on the first ``partial_rotary_factor`` of each head (``layout: halves``; a quarter
where the config names none), grouped K/V heads, biases on q, k and v alone with
``use_qkv_bias``, and with ``use_parallel_residual`` one shared norm feeding both sublayers side by
side (x + attn(ln(x)) + mlp(ln(x))). The LM head is untied unless the config ties it.

``qk_layernorm`` (StableLM 2 12B) is refused: it normalises each head's q and k with a LayerNorm
of that head's own weights, where tfcompile's ``qk_norm`` shares one scale among the heads.
``hidden_dropout`` drops out the feed-forward's output alone in transformers, each sublayer's
output (a parallel block's sum) in tfcompile (said where it is set). export-hf does not write
StableLM: no architecture it writes has a gated feed-forward among LayerNorm blocks, so a spec of
them is refused by field."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    GATED_ACTIVATIONS,
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
from tfcompile.hf.gpt_neox import rope_sources
from tfcompile.hf.llama import FALLBACKS, rope_section
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

PARTIAL = 0.25  # the fraction of each head StableLmConfig rotates where the config names none
# StableLmConfig's context where config.json leaves it out: the spec's, and what a dynamic or YaRN
# RoPE scaling (rope_section) scales from.
DEFAULTS = {"max_position_embeddings": 4096}
# StableLM's names within a block -> tfcompile's (q, k and v, and the gate and up projections, apart).
LAYER = (("self_attn.o_proj", "attn.out"), ("mlp.down_proj", "ffn.w_out"))
NORMS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"))


def rope_width(config: Config, head_dim: int, rotary: Any) -> None:
    """Refuse a ``head_dim`` of the config's own that gives RoPE frequencies of another width
    than the ``rotary`` dimensions each head turns: transformers' StableLM computes its
    frequencies over int(head_dim x fraction) dimensions, where the config names head_dim, and
    turns int(hidden_size / num_attention_heads x fraction) of each head: where the two differ,
    it fails, or (an odd width one below the heads') turns other frequencies."""
    named = config.get("head_dim", 0)
    if not named or named == head_dim:
        return
    widths = rope_section(Config(config.data), named, PARTIAL).get("rotary_dims")
    config.require(
        widths == rotary,
        "head_dim",
        f"is {named!r}: transformers' StableLM computes RoPE over {widths} dimensions of it, and turns "
        f"{rotary} of each head of hidden_size / num_attention_heads ({head_dim})",
        "leave it out",
    )


def dropout_placement(rate: float) -> None:
    """Say that transformers drops out the feed-forward's output alone, tfcompile each sublayer's
    (a parallel block's sum): the same outputs, other masks in a fine-tune."""
    if rate:
        warnings.warn(
            HFWarning(
                f"hidden_dropout {rate}: StableLM drops out the feed-forward's output with it, tfcompile "
                f"also the attention's (a parallel block's sum); the outputs are the same, a fine-tune's "
                f"dropout differs"
            ),
            stacklevel=3,
        )


@register("stablelm")
class StableLm(Architecture):
    prefixes = ("model.",)
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.n_kv_heads": "num_key_value_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.norm.eps": "layer_norm_eps",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "hidden_dropout",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("StableLmForCausalLM", "StableLmModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a StableLmForCausalLM",
        )
        config = config.filled(DEFAULTS)
        tie = lm_head(
            config,
            tensors,
            architecture,
            ("lm_head.weight", "embed_tokens.weight"),
            False,
            "StableLmForCausalLM",
        )
        config.refuse_true(
            "qk_layernorm",
            why="transformers' StableLM normalises each head's q and k with a LayerNorm of that head's "
            "own weights, where tfcompile's qk_norm shares one scale among the heads",
        )
        config.require(
            config.data.get("num_key_value_heads", 0) is not None,
            "num_key_value_heads",
            "is null: transformers' StableLM fails on it",
            "set it to the number of K/V heads",
        )
        d, heads = config.get("hidden_size", 2560), config.get("num_attention_heads", 32)
        head_dim = d // max(heads, 1)  # 0 heads, or a width they do not divide: refused by the spec
        positional = rope_section(config, head_dim, PARTIAL)
        rope_width(config, head_dim, positional.get("rotary_dims"))
        parallel = config.get("use_parallel_residual", False)
        residual = dropout(config.get("hidden_dropout", 0.0))
        dropout_placement(residual)
        vocab = config.get("vocab_size", 50304)
        pad_within(config, vocab)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings"),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 32),
            "n_heads": heads,
            # StableLmConfig's default, whatever num_attention_heads is
            "n_kv_heads": config.get("num_key_value_heads", 32),
            "d_ff": config.get("intermediate_size", 6912),
            "activation": config.choice("hidden_act", "silu", GATED_ACTIVATIONS, "gated activation"),
            "positional": positional,
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_eps", 1e-5)},
            "block": {"type": "parallel", "shared_norm": True} if parallel else {"type": "sequential"},
            "bias": {
                "qkv": config.get("use_qkv_bias", False),
                "attn_out": False,
                "ffn": False,
                "lm_head": False,
            },
            "tie_embeddings": tie,
            "dropout": {"attention": dropout(config.get("attention_dropout", 0.0)), "residual": residual},
            "init_std": init_std(config),
        }
        sources = rope_sources(config, FALLBACKS)
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.n_kv_heads is not None
        qkv_rows = [model.n_heads * model.head_dim] + [model.n_kv_heads * model.head_dim] * 2
        embed = tensors.take("embed_tokens.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("norm.weight"),
            "final_norm.bias": tensors.take("norm.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        norms = NORMS[:1] if model.block.type == "parallel" else NORMS
        for i in range(model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias") if model.bias.qkv else ("weight",):
                names = (f"{h}self_attn.{x}_proj.{kind}" for x in "qkv")
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names, rows=qkv_rows)
            # gate first, as tfcompile's gated feed-forward reads its input projection
            state[f"{b}ffn.w_in.weight"] = tensors.cat(f"{h}mlp.gate_proj.weight", f"{h}mlp.up_proj.weight")
            for hf, tfc in LAYER:
                state[f"{b}{tfc}.weight"] = tensors.take(f"{h}{hf}.weight")
            for hf, tfc in norms:
                for kind in ("weight", "bias"):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state
