"""GPT-NeoX (``GPTNeoXForCausalLM``: Pythia, GPT-NeoX-20B): RoPE on the first ``rotary_pct`` of
each head (``layout: halves``), LayerNorms with biases before each sublayer, and the two sublayers
side by side (``use_parallel_residual``: x + attn(ln1(x)) + mlp(ln2(x)), a parallel block of two
norms) or in turn. One fused ``query_key_value`` holds [q, k, v] of each head in turn, reordered
to tfcompile's packed q, k, v; ``attention_bias`` is on it and on the output projection, the
feed-forward always has biases. The LM head (``embed_out``, ``lm_head`` in transformers 5's
names) is untied unless the config says otherwise.

transformers 5 reads theta and the rotated fraction from ``rope_parameters`` (or a legacy
``rope_scaling``), else from ``rotary_emb_base`` and ``rotary_pct``, never from the top-level
``rope_theta`` or ``partial_rotary_factor`` (which transformers 4 overwrites with them): both
are written by export-hf. ``hidden_dropout`` drops out the embeddings and each sublayer's output;
tfcompile drops a parallel block's sum once (see ``parallel_dropout``)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    EXPORTED_ACTIVATIONS,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Writable,
    contiguous,
    dropout,
    init_std,
    lm_head,
    output_scale,
    register,
    zeros_if_none,
)
from tfcompile.hf.errors import HFError, HFWarning, Problem
from tfcompile.hf.llama import (
    dynamic_from_max_seq_len,
    halves_order,
    neox_blocks,
    one_rope,
    rope_decoder_lm,
    rope_dict,
    rope_section,
    rope_top_level,
    rotary_fraction,
)
from tfcompile.hf.starcoder2 import starcoder2_blocks
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec, ParallelBlock, RopePositional, SequentialBlock

# GPT-NeoX's names within a block -> tfcompile's (the fused q, k, v apart).
LAYER = (
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("attention.dense", "attn.out"),
    ("mlp.dense_h_to_4h", "ffn.w_in"),
    ("mlp.dense_4h_to_h", "ffn.w_out"),
)
ATTENTION = {"attention.dense"}  # the layers attention_bias gives biases (with query_key_value)
QKV = "attention.query_key_value"
HEADS = ("embed_out.weight", "lm_head.weight")  # transformers 4's name of the LM head, and 5's


def rope_sources(config: Config, fallbacks: tuple[str, str]) -> dict[str, str]:
    """The config fields the spec's RoPE fields were read from: the RoPE dict's, else the
    ``fallbacks`` (theta's, the rotated fraction's)."""
    name = "rope_scaling" if config.data.get("rope_scaling") else "rope_parameters"
    params = config.data.get(name)
    inside = params if isinstance(params, dict) else {}
    theta, partial = (
        f"{name}.{key}" if key in inside else fallback
        for key, fallback in zip(("rope_theta", "partial_rotary_factor"), fallbacks, strict=True)
    )
    return {
        "model.positional.scaling": name,
        "model.positional.theta": theta,
        "model.positional.rotary_dims": partial,
    }


def parallel_dropout(block: str, rate: float, field: str) -> None:
    """Say that a parallel block's residual dropout is drawn once over the sum, where transformers
    draws it on each sublayer's output: the same outputs, other masks in a fine-tune."""
    if block == "parallel" and rate:
        warnings.warn(
            HFWarning(
                f"{field} {rate}: tfcompile drops out a parallel block's attention and feed-forward "
                f"sum once, transformers each of them; the outputs are the same, a fine-tune's "
                f"dropout masks differ"
            ),
            stacklevel=3,
        )


def grouped(tensors: Tensors, name: str, model: DecoderSpec) -> torch.Tensor:
    """The fused q, k, v weight or bias (transformers views its rows as (kv_heads, heads / kv_heads
    + 2, head_dim): each group's queries, then its key and value; GPT-NeoX's and BLOOM's [q, k, v]
    of one head after another where every head has its own K/V head) with its rows as tfcompile
    packs them: all q, then k, then v."""
    assert model.head_dim is not None and model.n_kv_heads is not None
    kv, hd = model.n_kv_heads, model.head_dim
    fused = tensors.take(name)
    rows = (model.n_heads + 2 * kv) * hd
    if fused.ndim == 0 or fused.shape[0] != rows:
        raise HFError(
            f"{tensors.where}: the tensor {name} has shape {tuple(fused.shape)}, not {rows} rows; "
            f"is config.json the checkpoint's own?"
        )
    rest = fused.shape[1:]
    split = fused.reshape(kv, model.n_heads // kv + 2, hd, *rest)
    q, k, v = split[:, :-2], split[:, -2], split[:, -1]
    return torch.cat([q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)])


def fused(packed: torch.Tensor, model: DecoderSpec) -> torch.Tensor:
    """``grouped`` undone for a K/V head per head: tfcompile's packed q, k, v rows as [q, k, v] of
    each head in turn."""
    assert model.head_dim is not None
    split = packed.reshape(3, model.n_heads, model.head_dim, *packed.shape[1:])
    return split.transpose(0, 1).reshape(packed.shape)


@register("gpt_neox")
class GPTNeoX(Writable):
    prefixes = ("gpt_neox.",)
    # the causal mask and RoPE's frequencies: buffers in checkpoints saved by older transformers
    ignored = (".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq")
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.norm.eps": "layer_norm_eps",
        "model.dropout.embedding": "hidden_dropout",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "hidden_dropout",
        "model.init_std": "initializer_range",
    }
    fallbacks = ("rotary_emb_base", "rotary_pct")

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("GPTNeoXForCausalLM", "GPTNeoXModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a GPTNeoXForCausalLM",
        )
        head = next((name for name in HEADS if name in tensors), HEADS[0])
        tie = lm_head(config, tensors, architecture, (head, "embed_in.weight"), False, "GPTNeoXForCausalLM")
        d, heads = config.get("hidden_size", 6144), config.get("num_attention_heads", 64)
        # RoPE's width is head_dim's where the config names one (the attention's is d / heads)
        rotated = config.get("head_dim", 0) or d // max(heads, 1)  # 0 heads: refused by the spec
        block = "parallel" if config.get("use_parallel_residual", True) else "sequential"
        biased = config.get("attention_bias", True)
        residual = dropout(config.get("hidden_dropout", 0.0))
        parallel_dropout(block, residual, "hidden_dropout")
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 50432),
            "max_seq_len": config.get("max_position_embeddings", 2048),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 44),
            "n_heads": heads,
            "d_ff": config.get("intermediate_size", 24576),
            "activation": config.choice("hidden_act", "gelu", ACTIVATIONS, "GPT-NeoX activation"),
            "positional": rope_section(config, rotated, 0.25, self.fallbacks),
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_eps", 1e-5)},
            "block": block,
            "bias": {"qkv": biased, "attn_out": biased, "ffn": True, "lm_head": False},
            "tie_embeddings": tie,
            "dropout": {
                "embedding": residual,
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": residual,
            },
            "init_std": init_std(config),
        }
        sources = rope_sources(config, self.fallbacks)
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("embed_in.weight")
        head = next((name for name in HEADS if name in tensors), HEADS[0])
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("final_layer_norm.weight"),
            "final_norm.bias": tensors.take("final_layer_norm.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take(head),
        }
        tensors.maybe(head)  # a tie saved under both names
        biased = model.bias.qkv
        for i in range(model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias") if biased else ("weight",):
                state[f"{b}attn.qkv.{kind}"] = grouped(tensors, f"{h}{QKV}.{kind}", model)
            for hf, tfc in LAYER:
                state[f"{b}{tfc}.weight"] = tensors.take(f"{h}{hf}.weight")
                if hf not in ATTENTION or biased:
                    state[f"{b}{tfc}.bias"] = tensors.take(f"{h}{hf}.bias")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE whose embeddings are not scaled (Gemma's are, whatever its
        blocks) and whose norms are LayerNorms or blocks parallel (else it is Llama's or Qwen3's),
        but for LayerNorm blocks in turn with grouped K/V heads (Starcoder2's)."""
        model = rope_decoder_lm(spec)
        return (
            model is not None
            and not model.scale_embeddings
            and neox_blocks(model)
            and not starcoder2_blocks(model)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        need = Needs("GPT-NeoX")
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "gelu")
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        shared = isinstance(model.block, ParallelBlock) and model.block.shared_norm
        need(not shared, "model.block.shared_norm", True, "false (GPT-NeoX normalises each sublayer's input)")
        dynamic_from_max_seq_len(need, model)
        one_rope(need, model)
        # The block is GPT-NeoX's either way: the other scales and extras are checked as GPT-2's.
        need.plain_attention(model.model_copy(update={"block": SequentialBlock()}))
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        positional = model.positional
        assert model.head_dim is not None and positional.rotary_dims is not None
        fraction = rotary_fraction(positional.rotary_dims, model.head_dim)
        rope = rope_dict(positional)
        return {
            "architectures": ["GPTNeoXForCausalLM"],
            "model_type": "gpt_neox",
            "vocab_size": model.vocab_size,
            "hidden_size": model.d_model,
            "intermediate_size": model.d_ff,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "hidden_act": EXPORTED_ACTIVATIONS[model.activation],
            "max_position_embeddings": model.max_seq_len,
            "layer_norm_eps": model.norm.eps,
            "use_parallel_residual": model.block.type == "parallel",
            "attention_bias": model.bias.qkv or model.bias.attn_out,
            # transformers 4 reads these three; 5 reads rope_parameters (and rope_scaling, first)
            "rotary_pct": fraction,
            "rotary_emb_base": positional.theta,
            "rope_scaling": rope if positional.scaling is not None else None,
            "rope_parameters": {"rope_theta": positional.theta, "partial_rotary_factor": fraction, **rope},
            **rope_top_level(positional),
            "tie_word_embeddings": model.tie_embeddings,
            "hidden_dropout": model.dropout.residual,
            "attention_dropout": model.dropout.attention,
            "initializer_range": model.init_std,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        assert model.head_dim is not None
        p, d, hd = "gpt_neox.", model.d_model, model.head_dim
        scale = output_scale(model)
        final_bias = zeros_if_none(state.get("final_norm.bias"), d)
        out = {
            f"{p}embed_in.weight": state["embed.weight"],
            f"{p}final_layer_norm.weight": state["final_norm.weight"] * scale,
            f"{p}final_layer_norm.bias": final_bias * scale,
        }
        if not model.tie_embeddings:
            out["embed_out.weight"] = state["lm_head.weight"]
        # Interleaved pairs rotate as transformers' halves once each head's q and k rows are reordered.
        order = None
        if model.positional.layout == "interleaved":
            order = halves_order(model.n_heads, hd, model.positional.rotary_dims)
        biased = model.bias.qkv or model.bias.attn_out
        for i in range(model.n_layers):
            h, b = f"{p}layers.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias") if biased else ("weight",):
                packed = zeros_if_none(state.get(f"{b}attn.qkv.{kind}"), 3 * d)
                if order is not None:
                    q, k, v = packed.chunk(3)
                    packed = torch.cat([q[order], k[order], v])
                out[f"{h}{QKV}.{kind}"] = fused(packed, model)
            for hf, tfc in LAYER:
                weight = state[f"{b}{tfc}.weight"]
                out[f"{h}{hf}.weight"] = weight
                if hf not in ATTENTION or biased:  # the norms' and feed-forward's: zeros where none
                    out[f"{h}{hf}.bias"] = zeros_if_none(state.get(f"{b}{tfc}.bias"), weight.shape[0])
        return contiguous(out)
