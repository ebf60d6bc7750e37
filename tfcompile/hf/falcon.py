"""Falcon (``FalconForCausalLM``: Falcon-7B, 40B, 180B, 11B): RoPE on the two halves of whole
heads, LayerNorms with biases, one fused ``query_key_value`` and ``bias`` on every projection or
none, an LM head tied to the embeddings unless the config says otherwise. Its three attention
layouts are one: per K/V head, that group's queries, then its key and value (multi_query: one
K/V head; the new decoder architecture: ``num_kv_heads``; otherwise one per head), reordered to
tfcompile's packed q, k, v. Its blocks:

- the new decoder architecture (Falcon-40B): parallel, two norms (``ln_attn``, ``ln_mlp``) or,
  with ``num_ln_in_parallel_attn`` 1, one shared (``input_layernorm``);
- ``parallel_attn`` (Falcon-7B): parallel, one shared norm (``input_layernorm``);
- otherwise sequential (``input_layernorm``, ``post_attention_layernorm``).

transformers drops out a parallel block's sum once (``hidden_dropout``), as tfcompile does; a
sequential block's attention output with ``attention_dropout`` and its feed-forward's with
``hidden_dropout``, where tfcompile has one rate for both (said where they differ). ALiBi
(``alibi``: Falcon-RW) is refused: transformers divides its biases by sqrt(head_dim) and rounds
slope x position to bfloat16, which ``positional: alibi`` does not. export-hf does not write
Falcon: a spec of its blocks is GPT-NeoX's candidate (which writes those without a shared norm or
grouped K/V heads)."""

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
    register,
)
from tfcompile.hf.errors import HFWarning
from tfcompile.hf.gpt_neox import grouped, rope_sources
from tfcompile.hf.llama import FALLBACKS, rope_section
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec, ParallelBlock

# Falcon's names within a block -> tfcompile's (the fused q, k, v and the norms apart).
LAYER = (
    ("self_attention.dense", "attn.out"),
    ("mlp.dense_h_to_4h", "ffn.w_in"),
    ("mlp.dense_4h_to_h", "ffn.w_out"),
)
QKV = "self_attention.query_key_value"
# The norms' names by block: sequential, parallel with one shared norm, parallel with two.
NORMS = {
    "sequential": (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")),
    "shared": (("input_layernorm", "attn_norm"),),
    "parallel": (("ln_attn", "attn_norm"), ("ln_mlp", "ffn_norm")),
}


def whole_heads(config: Config) -> Config:
    """The config with no rotated fraction where RoPE is not scaled: Falcon's own default RoPE
    turns whole heads, whatever ``partial_rotary_factor`` says (a scaled RoPE reads it, and
    transformers fails on part of a head); its problems are ``config``'s."""
    name = "rope_scaling" if config.data.get("rope_scaling") else "rope_parameters"
    params = config.data.get(name)
    inside = params if isinstance(params, dict) else {}
    if inside.get("rope_type", inside.get("type", "default")) != "default":
        return config
    data = {k: v for k, v in config.data.items() if k != "partial_rotary_factor"}
    if inside:
        data[name] = {k: v for k, v in inside.items() if k != "partial_rotary_factor"}
    return Config(data, config.problems)


def kv_heads(config: Config, heads: int) -> Any:
    """The K/V heads as FalconAttention has them: num_kv_heads in the new decoder architecture,
    one with multi_query, else one per head (num_kv_heads otherwise fails in transformers)."""
    given = config.get("num_kv_heads", heads)
    if config.get("new_decoder_architecture", False):
        return given  # one that does not divide the heads: refused by the spec
    if config.get("multi_query", True):
        return 1
    config.require(
        given == heads,
        "num_kv_heads",
        f"is {given!r} with multi_query and new_decoder_architecture false: transformers' Falcon "
        f"fails unless it is num_attention_heads ({heads})",
        "leave it out",
    )
    return heads


def block(config: Config) -> dict[str, Any]:
    """``block:`` as FalconDecoderLayer builds and runs it; each pairing of fields on which its
    forward fails (a norm it reads and did not build) refused by name."""
    parallel = config.get("parallel_attn", True)
    norms = config.get("num_ln_in_parallel_attn", 0)  # null: 2 in the new architecture, else unread
    if config.get("new_decoder_architecture", False):
        config.require(
            parallel,
            "parallel_attn",
            "is false in the new decoder architecture: transformers' FalconDecoderLayer fails on it",
            "set it true",
        )
        config.require(
            norms in (0, 1, 2),
            "num_ln_in_parallel_attn",
            f"is {norms!r}: transformers' FalconDecoderLayer fails unless it is 1 or 2",
            "set it to 1 (one norm) or 2",
        )
        return {"type": "parallel", "shared_norm": norms == 1}
    config.require(
        not (parallel and norms == 2),
        "num_ln_in_parallel_attn",
        "is 2 outside the new decoder architecture: transformers' FalconDecoderLayer builds two "
        "norms and reads a third it lacks",
        "leave it out",
    )
    return {"type": "parallel", "shared_norm": True} if parallel else {"type": "sequential"}


def sequential_dropout(config: Config, residual: float) -> None:
    """Say that a sequential block's attention output is dropped out at hidden_dropout, where
    transformers drops it at attention_dropout: the same outputs, other masks in a fine-tune."""
    attention = dropout(config.get("attention_dropout", 0.0))
    if attention != residual:
        warnings.warn(
            HFWarning(
                f"attention_dropout {attention}: Falcon drops out a sequential block's attention output "
                f"with it, tfcompile with hidden_dropout {residual} as the feed-forward's; the outputs "
                f"are the same, a fine-tune's dropout differs"
            ),
            stacklevel=3,
        )


@register("falcon")
class Falcon(Architecture):
    prefixes = ("transformer.",)
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.n_kv_heads": "num_kv_heads",
        "model.d_ff": "ffn_hidden_size",
        "model.activation": "activation",
        "model.norm.eps": "layer_norm_epsilon",
        "model.dropout.residual": "hidden_dropout",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("FalconForCausalLM", "FalconModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a FalconForCausalLM",
        )
        tie = lm_head(
            config,
            tensors,
            architecture,
            ("lm_head.weight", "word_embeddings.weight"),
            True,
            "FalconForCausalLM",
        )
        config.refuse_true(
            "alibi",
            why="transformers' Falcon divides its ALiBi biases by sqrt(head_dim) and rounds slope x "
            "position to bfloat16, where tfcompile's ALiBi adds BLOOM's slopes exactly",
        )
        config.refuse_true(
            "apply_residual_connection_post_layernorm",
            why="the RefinedWeb code the checkpoint was trained with adds the normalised input, "
            "transformers' Falcon the input itself",
        )
        # FalconConfig reads a legacy n_embed over hidden_size
        width = "n_embed" if config.data.get("n_embed") is not None else "hidden_size"
        d, heads = config.get(width, 4544), config.get("num_attention_heads", 71)
        head_dim = d // max(heads, 1)  # 0 heads, or a width they do not divide: refused by the spec
        layout = block(config)
        residual = dropout(config.get("hidden_dropout", 0.0))
        if layout["type"] == "sequential":
            sequential_dropout(config, residual)
        positional = rope_section(whole_heads(config), head_dim, 1.0)
        rotary = positional.pop("rotary_dims", head_dim)
        config.require(
            rotary == head_dim,
            "partial_rotary_factor",
            f"turns {rotary} of {head_dim} dimensions of each head with a scaled RoPE: transformers' "
            f"Falcon fails on part of a head",
            "set it to 1",
        )
        biased = config.get("bias", False)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 65024),
            "max_seq_len": config.get("max_position_embeddings", 2048),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 32),
            "n_heads": heads,
            "n_kv_heads": kv_heads(config, heads),
            "d_ff": config.get("ffn_hidden_size", 4 * d),
            "activation": config.choice("activation", "gelu", ACTIVATIONS, "Falcon activation"),
            "positional": positional,
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_epsilon", 1e-5)},
            "block": layout,
            "bias": {"qkv": biased, "attn_out": biased, "ffn": biased, "lm_head": False},
            "tie_embeddings": tie,
            # transformers drops out no rotary model's attention weights
            "dropout": {"residual": residual},
            "init_std": init_std(config),
        }
        sources = rope_sources(config, FALLBACKS) | {"model.d_model": width}
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("word_embeddings.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("ln_f.weight"),
            "final_norm.bias": tensors.take("ln_f.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        shared = isinstance(model.block, ParallelBlock) and model.block.shared_norm
        norms = NORMS["shared" if shared else model.block.type]
        kinds = ("weight", "bias") if model.bias.qkv else ("weight",)
        for i in range(model.n_layers):
            h, b = f"h.{i}.", f"blocks.{i}."
            for kind in kinds:
                state[f"{b}attn.qkv.{kind}"] = grouped(tensors, f"{h}{QKV}.{kind}", model)
                for hf, tfc in LAYER:
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
            for hf, tfc in norms:
                for kind in ("weight", "bias"):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state
