"""OPT (``OPTForCausalLM``): learned positions read from row 2 of their table, LayerNorm before
each sublayer (``do_layer_norm_before``, OPT-125m and most sizes) or after it (OPT-350m, which has
no final norm), separate q, k and v projections, a tied LM head.

OPT's position table has ``max_position_embeddings + 2`` rows: a token at position p reads row
p + 2, and transformers counts p from the attention mask (the real tokens before it), as
tfcompile's decoder does. Rows 0 and 1 are read only at padding (row 1, position -1), whose outputs
nothing uses, so the import leaves them out and export-hf writes them as zeros."""

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
    pad_within,
    register,
    zeros_if_none,
)
from tfcompile.hf.errors import HFWarning, Problem
from tfcompile.hf.gpt2 import gpt2_norms, learned_decoder_lm, multi_query
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

OFFSET = 2  # the rows of the position table before position 0's (OPTLearnedPositionalEmbedding)
EPS = 1e-5  # OPT's LayerNorms are nn.LayerNorm's default; the config has no field for it
# OPT's names within a block -> tfcompile's (post-norm: each norm follows its sublayer).
LAYER = (
    ("self_attn_layer_norm", "attn_norm"),
    ("self_attn.out_proj", "attn.out"),
    ("final_layer_norm", "ffn_norm"),
    ("fc1", "ffn.w_in"),
    ("fc2", "ffn.w_out"),
)
NORMS = {"self_attn_layer_norm", "final_layer_norm"}


@register("opt")
class OPT(Writable):
    # OPTForCausalLM saves model.decoder.*; checkpoints saved from OPTModel (the hub's originals), decoder.*
    prefixes = ("model.decoder.", "decoder.")
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.d_ff": "ffn_dim",
        "model.activation": "activation_function",
        "model.dropout.residual": "dropout",
        "model.dropout.attention": "attention_dropout",
        "model.init_std": "init_std",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("OPTForCausalLM", "OPTModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import an OPTForCausalLM",
        )
        d = config.get("hidden_size", 768)
        projected = config.get("word_embed_proj_dim", d)
        config.require(
            projected == d,
            "word_embed_proj_dim",
            f"is {projected}, not hidden_size {d}: the embeddings are projected in and out "
            f"(project_in, project_out, as in OPT-350m), which tfcompile's decoder does not do",
            "import an OPT whose word_embed_proj_dim is its hidden_size",
        )
        config.require(
            config.get("layer_norm_elementwise_affine", True),
            "layer_norm_elementwise_affine",
            "is false: the LayerNorms have no weight or bias, and tfcompile's always learn both",
            "import a model with learned LayerNorms",
        )
        warn_of_layerdrop(config)
        tie = lm_head(
            config, tensors, architecture, ("lm_head.weight", "embed_tokens.weight"), True, "OPTForCausalLM"
        )
        pre = config.get("do_layer_norm_before", True)
        bias = config.get("enable_bias", True)
        vocab = config.get("vocab_size", 50272)
        pad_within(config, vocab)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 2048),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 12),
            "n_heads": config.get("num_attention_heads", 12),
            "d_ff": config.get("ffn_dim", 3072),
            "activation": config.choice("activation_function", "relu", ACTIVATIONS, "OPT activation"),
            "positional": "learned",
            "norm": {
                "position": "pre" if pre else "post",
                "type": "layernorm",
                "eps": EPS,
                # post-norm OPT has no final norm; _remove_final_layer_norm drops a pre-norm one
                # (checkpoints fine-tuned before transformers 4.20.1)
                "final": pre and not config.get("_remove_final_layer_norm", False),
            },
            "bias": {"qkv": bias, "attn_out": bias, "ffn": bias, "lm_head": False},
            "tie_embeddings": tie,
            # transformers' OPT drops out each sublayer's output, never the embeddings
            "dropout": {
                "embedding": 0.0,
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": dropout(config.get("dropout", 0.1)),
            },
            # OPT names initializer_range init_std
            "init_std": init_std(Config({"initializer_range": config.get("init_std", 0.02)})),
        }
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None
        embed = tensors.take("embed_tokens.weight")
        state = {
            "embed.weight": embed,
            "positional.table.weight": tensors.take("embed_positions.weight")[OFFSET:],
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        if model.norm.final:
            state["final_norm.weight"] = tensors.take("final_layer_norm.weight")
            state["final_norm.bias"] = tensors.take("final_layer_norm.bias")
        return state | read_blocks(tensors, model, enable_bias(model))  # as read, every bias or none

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with learned positions and no MQA whose norms are not GPT-2's: post-norm,
        or pre-norm without a final norm (a GPT-2-shaped model is written as GPT-2)."""
        model = learned_decoder_lm(spec)
        return model is not None and not multi_query(model) and not gpt2_norms(model)

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        need = Needs("OPT")
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "relu")
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.eps == EPS, "model.norm.eps", model.norm.eps, f"{EPS} (OPT's LayerNorms')")
        need(bool(model.norm.bias), "model.norm.bias", False, "true")
        need(
            model.norm.position == "pre" or not model.norm.final,
            "model.norm.final",
            True,
            "false (a post-norm OPT has no final norm)",
        )
        need(
            bool(model.norm.final) or not model.scale_output,
            "model.scale_output",
            True,
            "false, or a final norm to fold it into",
        )
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need.plain_attention(model)
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        pre = model.norm.position == "pre"
        return {
            "architectures": ["OPTForCausalLM"],
            "model_type": "opt",
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_seq_len,
            "hidden_size": model.d_model,
            "word_embed_proj_dim": model.d_model,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "ffn_dim": model.d_ff,
            "activation_function": EXPORTED_ACTIVATIONS[model.activation],
            "do_layer_norm_before": pre,
            "_remove_final_layer_norm": pre and not model.norm.final,
            "layer_norm_elementwise_affine": True,
            "enable_bias": enable_bias(model),
            "dropout": model.dropout.residual,
            "attention_dropout": model.dropout.attention,
            "layerdrop": 0.0,
            "init_std": model.init_std,
            "tie_word_embeddings": model.tie_embeddings,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        p, d = "model.decoder.", model.d_model
        table = state["positional.table.weight"]
        out = {
            f"{p}embed_tokens.weight": state["embed.weight"],
            f"{p}embed_positions.weight": torch.cat([table.new_zeros(OFFSET, d), table]),
        }
        if model.norm.final:
            scale = output_scale(model)
            out[f"{p}final_layer_norm.weight"] = state["final_norm.weight"] * scale
            out[f"{p}final_layer_norm.bias"] = state["final_norm.bias"] * scale
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        return contiguous(out | written_blocks(state, model, p, enable_bias(model)))


def enable_bias(model: DecoderSpec) -> bool:
    """OPT's one switch for every projection's bias: on where the model has any (zeros where it
    has none, which is exact)."""
    return model.bias.qkv or model.bias.attn_out or model.bias.ffn


def read_blocks(tensors: Tensors, model: DecoderSpec, biased: bool) -> State:
    """OPT's blocks (BioGPT's and XGLM's too: fairseq's decoder layers) -> tfcompile's: q, k and v
    packed, the norms' weights and biases, the projections' biases where ``biased``."""
    assert model.head_dim is not None
    rows = [model.n_heads * model.head_dim] * 3
    state: State = {}
    for i in range(model.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias") if biased else ("weight",):
            names = (f"{h}self_attn.{x}_proj.{kind}" for x in "qkv")
            state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names, rows=rows)
        for hf, tfc in LAYER:
            state[f"{b}{tfc}.weight"] = tensors.take(f"{h}{hf}.weight")
            if hf in NORMS or biased:
                state[f"{b}{tfc}.bias"] = tensors.take(f"{h}{hf}.bias")
    return state


def written_blocks(state: State, model: DecoderSpec, prefix: str, biased: bool) -> State:
    """``read_blocks`` back, under ``prefix``: every projection's bias where ``biased`` (zeros
    where the model has none, which is exact)."""
    d = model.d_model
    out: State = {}
    for i in range(model.n_layers):
        h, b = f"{prefix}layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias") if biased else ("weight",):
            packed = zeros_if_none(state.get(f"{b}attn.qkv.{kind}"), 3 * d)
            q, k, v = packed.chunk(3)
            out |= {f"{h}self_attn.q_proj.{kind}": q, f"{h}self_attn.k_proj.{kind}": k}
            out[f"{h}self_attn.v_proj.{kind}"] = v
        for hf, tfc in LAYER:
            weight = state[f"{b}{tfc}.weight"]
            out[f"{h}{hf}.weight"] = weight
            if hf in NORMS or biased:
                out[f"{h}{hf}.bias"] = zeros_if_none(state.get(f"{b}{tfc}.bias"), weight.shape[0])
    return out


def read_fairseq_lm(tensors: Tensors, model: DecoderSpec, head: str) -> State:
    """BioGPT's and XGLM's tensors but their positions -> tfcompile's: the token embeddings, the
    head (``head``, where untied), the final LayerNorm (``layer_norm``) and the blocks."""
    embed = tensors.take("embed_tokens.weight")
    state = {
        "embed.weight": embed,
        "lm_head.weight": embed if model.tie_embeddings else tensors.take(head),
        "final_norm.weight": tensors.take("layer_norm.weight"),
        "final_norm.bias": tensors.take("layer_norm.bias"),
    }
    tensors.maybe(head)  # a tie saved under both names
    return state | read_blocks(tensors, model, biased=True)


def written_fairseq_lm(state: State, model: DecoderSpec, prefix: str, head: str) -> State:
    """``read_fairseq_lm`` back, the body under ``prefix``: the output scale folded into the final
    norm, the head written where untied."""
    scale = output_scale(model)
    out = {
        f"{prefix}embed_tokens.weight": state["embed.weight"],
        f"{prefix}layer_norm.weight": state["final_norm.weight"] * scale,
        f"{prefix}layer_norm.bias": state["final_norm.bias"] * scale,
    }
    if not model.tie_embeddings:
        out[head] = state["lm_head.weight"]
    return out | written_blocks(state, model, prefix, biased=True)


def warn_of_layerdrop(config: Config) -> None:
    """LayerDrop (fairseq's decoders': OPT's, BioGPT's, XGLM's) acts in training only."""
    if config.get("layerdrop", 0.0):
        warnings.warn(
            HFWarning(
                "layerdrop (LayerDrop skips whole layers while training) is not in tfcompile: "
                "the outputs are the same; a fine-tune trains every layer every step"
            ),
            stacklevel=3,
        )


def fairseq_needs(need: Needs, model: DecoderSpec, dropout_name: str) -> None:
    """What BioGPT and XGLM require alike: OPT's LayerNorms (epsilon 1e-5, with biases), heads
    of whole width and no GQA, one dropout (``dropout_name``) for the embeddings and the
    residuals; their embeddings may be scaled."""
    need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "gelu")
    need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
    need(
        model.norm.eps == EPS, "model.norm.eps", model.norm.eps, f"{EPS} ({need.architecture}'s LayerNorms')"
    )
    need(bool(model.norm.bias), "model.norm.bias", False, "true")
    need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
    need(
        model.dropout.embedding == model.dropout.residual,
        "model.dropout.embedding",
        model.dropout.embedding,
        f"{model.dropout.residual}, model.dropout.residual (one {dropout_name})",
    )
    need.plain_attention(model.model_copy(update={"scale_embeddings": False}))
