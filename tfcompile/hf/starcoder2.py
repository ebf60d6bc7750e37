"""Starcoder2 (``Starcoder2ForCausalLM``: StarCoder2-3B, 7B, 15B): Mistral's attention (RoPE on the
two halves of whole heads, ``layout: halves``; grouped K/V heads; every layer sliding over
``sliding_window``, so the context is capped at the window where it is shorter) in blocks of
GPT-NeoX's kind: LayerNorms with biases before each sublayer in turn, a final LayerNorm, and a
plain feed-forward c_fc -> ``hidden_act`` -> c_proj. ``use_bias`` puts biases on every projection
(q, k, v, o, c_fc, c_proj) or on none. ``embedding_dropout`` drops out the embeddings,
``residual_dropout`` each sublayer's output. The head is tied unless the config unties it. RoPE
(theta, scaling) is read as Llama's, from transformers 5's ``rope_parameters`` or 4's
``rope_theta`` and ``rope_scaling``; a ``head_dim`` in config.json sets the heads' width
(transformers reads it though Starcoder2Config names none).

export-hf writes the RoPE decoders with LayerNorms, blocks in turn and fewer K/V heads than heads
(``starcoder2_blocks``), the biases and LayerNorm shifts a run lacks as zeros (exact) under one
``use_bias``; GPT-NeoX, which has a K/V head per head, writes the others of LayerNorm or parallel
blocks."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Windows,
    Writable,
    contiguous,
    dropout,
    init_std,
    lm_head,
    output_scale,
    pad_within,
    register,
    zeros_if_none,
)
from tfcompile.hf.architecture import EXPORTED_ACTIVATIONS as PLAIN
from tfcompile.hf.errors import Problem
from tfcompile.hf.llama import (
    ModelType,
    context,
    halves_order,
    rope_decoder_lm,
    rope_dict,
    rope_section,
    rope_top_level,
    scaling_sources,
    whole_head_rope,
    window,
    window_sources,
)
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec, RopePositional

# As Starcoder2Config and Starcoder2Model read a config: every layer slides where a window is set,
# none where it is null or left out; the class's defaults where LlamaConfig's (which llama.py's
# helpers read) differ.
MODEL_TYPE = ModelType(
    every_layer_slides=True, defaults={"max_position_embeddings": 4096, "initializer_range": 0.018042}
)
# The spec's activations -> hidden_act: GELU's tanh form under Starcoder2's own name for it
# (torch's tanh GELU, which tfcompile's gelu_tanh is).
EXPORTED_ACTIVATIONS = PLAIN | {"gelu_tanh": "gelu_pytorch_tanh"}
# Starcoder2's names within a block -> tfcompile's (q, k and v apart), each with a bias where
# use_bias is true.
LAYER = (
    ("self_attn.o_proj", "attn.out"),
    ("mlp.c_fc", "ffn.w_in"),
    ("mlp.c_proj", "ffn.w_out"),
)
NORMS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"))


def starcoder2_blocks(model: DecoderSpec) -> bool:
    """LayerNorms, sublayers in turn and fewer K/V heads than heads: a RoPE decoder's blocks as
    Starcoder2 has them (GPT-NeoX, which writes the other LayerNorm or parallel blocks, has a K/V
    head per head)."""
    grouped = (model.n_kv_heads or model.n_heads) < model.n_heads
    return model.norm.type == "layernorm" and model.block.type == "sequential" and grouped


@register("starcoder2")
class Starcoder2(Writable):
    reads_window = True  # its sliding_window on every layer
    windows: ClassVar[Windows] = "every"
    prefixes = ("model.",)
    ignored = ("rotary_emb.inv_freq",)  # a buffer in old checkpoints
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.n_kv_heads": "num_key_value_heads",
        "model.head_dim": "head_dim",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.positional.theta": "rope_theta",
        "model.norm.eps": "norm_epsilon",
        "model.dropout.embedding": "embedding_dropout",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "residual_dropout",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("Starcoder2ForCausalLM", "Starcoder2Model"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a Starcoder2ForCausalLM",
        )
        config = MODEL_TYPE.reads(config)
        names = ("lm_head.weight", "embed_tokens.weight")
        tie = lm_head(config, tensors, architecture, names, True, "Starcoder2ForCausalLM")
        d, heads = config.get("hidden_size", 3072), config.get("num_attention_heads", 24)
        head_dim = config.get("head_dim", 0) or d // max(heads, 1)  # 0 heads: refused by the spec
        biased = config.get("use_bias", True)
        config.require(
            config.data.get("sliding_window") != 0,
            "sliding_window",
            "is 0: transformers' Starcoder2 fails on it (a window of no key)",
            "set it null (no window) or to a positive length",
        )
        vocab = config.get("vocab_size", 49152)
        pad_within(config, vocab)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": context(config),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 30),
            "n_heads": heads,
            "n_kv_heads": config.get("num_key_value_heads", 2),
            "d_ff": config.get("intermediate_size", 12288),
            "activation": config.choice("hidden_act", "gelu_pytorch_tanh", ACTIVATIONS, "plain activation"),
            "positional": rope_section(config, head_dim),
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("norm_epsilon", 1e-5)},
            "bias": {"qkv": biased, "attn_out": biased, "ffn": biased, "lm_head": False},
            "tie_embeddings": tie,
            "dropout": {
                "embedding": dropout(config.get("embedding_dropout", 0.0)),
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": dropout(config.get("residual_dropout", 0.0)),
            },
            "init_std": init_std(config),
        }
        if head_dim * heads != d:
            model["head_dim"] = head_dim
        if (slides := window(config, MODEL_TYPE)) is not None:
            model["window"] = slides
        sources = scaling_sources(config) | window_sources(config, MODEL_TYPE)
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
        kinds = ("weight", "bias") if model.bias.qkv else ("weight",)
        for i in range(model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for hf, tfc in NORMS:
                for kind in ("weight", "bias"):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
            for kind in kinds:
                names = (f"{h}self_attn.{x}_proj.{kind}" for x in "qkv")
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names, rows=qkv_rows)
                for hf, tfc in LAYER:
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE whose embeddings are not scaled (Gemma's are) and whose blocks are
        Starcoder2's (``starcoder2_blocks``)."""
        model = rope_decoder_lm(spec)
        return model is not None and not model.scale_embeddings and starcoder2_blocks(model)

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs("Starcoder2")
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "gelu_tanh")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        whole_head_rope(need, model)
        need.plain_scales(model)  # head_dim is free: written as config.json's, which transformers reads
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        bias = model.bias
        rope = rope_dict(model.positional)
        return {
            "architectures": ["Starcoder2ForCausalLM"],
            "model_type": "starcoder2",
            "vocab_size": model.vocab_size,
            "hidden_size": model.d_model,
            "intermediate_size": model.d_ff,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "num_key_value_heads": model.n_kv_heads,
            "head_dim": model.head_dim,
            "hidden_act": EXPORTED_ACTIVATIONS[model.activation],
            "max_position_embeddings": model.max_seq_len,
            # Without a window, one of the whole context: no layer slides within max_seq_len.
            "sliding_window": model.max_seq_len if model.window is None else model.window.size,
            "norm_epsilon": model.norm.eps,
            # transformers 4 reads these two; 5 reads rope_parameters (and these, first).
            "rope_theta": model.positional.theta,
            "rope_scaling": rope if model.positional.scaling is not None else None,
            "rope_parameters": {"rope_theta": model.positional.theta, **rope},
            **rope_top_level(model.positional),
            "use_bias": bias.qkv or bias.attn_out or bias.ffn,  # on every projection: zeros where none
            "tie_word_embeddings": model.tie_embeddings,
            "embedding_dropout": model.dropout.embedding,
            "attention_dropout": model.dropout.attention,
            "residual_dropout": model.dropout.residual,
            "initializer_range": model.init_std,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        assert model.head_dim is not None and model.n_kv_heads is not None
        hd, d = model.head_dim, model.d_model
        q_rows, kv_rows = model.n_heads * hd, model.n_kv_heads * hd
        # Interleaved pairs rotate as transformers' halves once each head's q and k rows are reordered.
        order_q, order_k = (
            (halves_order(model.n_heads, hd), halves_order(model.n_kv_heads, hd))
            if model.positional.layout == "interleaved"
            else (None, None)
        )
        scale = output_scale(model)
        out = {
            "model.embed_tokens.weight": state["embed.weight"],
            "model.norm.weight": state["final_norm.weight"] * scale,
            "model.norm.bias": zeros_if_none(state.get("final_norm.bias"), d) * scale,
        }
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        bias = model.bias
        kinds = ("weight", "bias") if bias.qkv or bias.attn_out or bias.ffn else ("weight",)
        for i in range(model.n_layers):
            h, b = f"model.layers.{i}.", f"blocks.{i}."
            for hf, tfc in NORMS:
                out[f"{h}{hf}.weight"] = state[f"{b}{tfc}.weight"]
                out[f"{h}{hf}.bias"] = zeros_if_none(state.get(f"{b}{tfc}.bias"), d)
            for kind in kinds:  # the biases the model has, and zeros for those it has not
                packed = zeros_if_none(state.get(f"{b}attn.qkv.{kind}"), q_rows + 2 * kv_rows)
                q, k, v = packed.split([q_rows, kv_rows, kv_rows])
                if order_q is not None and order_k is not None:
                    q, k = q[order_q], k[order_k]
                a = f"{h}self_attn."
                out |= {f"{a}q_proj.{kind}": q, f"{a}k_proj.{kind}": k, f"{a}v_proj.{kind}": v}
                for hf, tfc in LAYER:
                    rows = state[f"{b}{tfc}.weight"].shape[0]
                    out[f"{h}{hf}.{kind}"] = zeros_if_none(state.get(f"{b}{tfc}.{kind}"), rows)
        return contiguous(out)
