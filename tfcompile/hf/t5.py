"""T5 (``T5ForConditionalGeneration``), v1.0 and v1.1 / flan, and mT5: relative position buckets shared by
the layers of each stack, RMSNorm without bias, no biases anywhere, no 1/sqrt(d_kv) in attention
(``attention_scale: 1``), heads of ``d_kv`` whatever d_model / heads is, a feed-forward of any
activation, gated or not (v1.0 ReLU, v1.1 gated GELU tanh). v1.0 ties its head to the embeddings
and scales the last hidden state by d_model^-0.5 (``scale_output``); v1.1 unties it and does not.
mT5 (``MT5ForConditionalGeneration``) is v1.1 with a larger vocabulary; transformers 5 never
scales its output."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    EXPORTED_ACTIVATIONS,
    GATED_ACTIVATIONS,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Writable,
    contiguous,
    dropout,
    output_scale,
    register,
    tied,
)
from tfcompile.hf.errors import HFWarning, Problem
from tfcompile.spec import Spec
from tfcompile.spec.schema import (
    EncoderDecoderSpec,
    LearnedPositional,
    RelativePositional,
    Seq2SeqTask,
    SinusoidalPositional,
)

# The spec's activation -> feed_forward_proj: ACT or gated-ACT, ACT as the other families write
# it; but transformers reads gated-gelu as gelu_new's (T5 v1.1's), so the gated erf GELU is gelu_python.
FEED_FORWARD = EXPORTED_ACTIVATIONS | {
    "swiglu": "gated-silu",
    "geglu": "gated-gelu_python",
    "geglu_tanh": "gated-gelu",
}
BIAS = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
DECODER_BIAS = "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"


# The classes of a T5 checkpoint by model_type (T5WithLMHeadModel: old configs).
HEADS = {
    "t5": ("T5ForConditionalGeneration", "T5WithLMHeadModel"),
    "mt5": ("MT5ForConditionalGeneration",),
}
# MT5Config's defaults where T5Config's (read below) differ: a config.json that leaves the
# feed-forward out is mT5's gated GELU, not T5's ReLU.
MT5_DEFAULTS = {
    "vocab_size": 250112,
    "d_ff": 1024,
    "num_layers": 8,
    "num_heads": 6,
    "feed_forward_proj": "gated-gelu",
}


@register("t5", "mt5")
class T5(Writable):
    ignored = ("EncDecAttention.relative_attention_bias",)  # old checkpoints; cross-attention has none
    # T5Config's attribute_map: the names it reads its sizes under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "hidden_size": "d_model",
        "num_attention_heads": "num_heads",
        "num_hidden_layers": "num_layers",
        "head_dim": "d_kv",
    }
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "n_positions",
        "model.d_model": "d_model",
        "model.n_layers": "num_layers",
        "model.n_decoder_layers": "num_decoder_layers",
        "model.n_heads": "num_heads",
        "model.head_dim": "d_kv",
        "model.d_ff": "d_ff",
        "model.activation": "feed_forward_proj",
        "model.positional.num_buckets": "relative_attention_num_buckets",
        "model.positional.max_distance": "relative_attention_max_distance",
        "model.norm.eps": "layer_norm_epsilon",
        "model.dropout": "dropout_rate",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        model_type = config.data["model_type"]
        classes = HEADS[model_type]
        config.require(
            architecture in classes,
            "architectures",
            f"{architecture} is not a sequence-to-sequence model tfcompile has",
            f"import a {classes[0]}",
        )
        config.refuse_true("is_decoder", why="a T5 decoder alone is not a sequence-to-sequence model")
        config.require(
            config.get("is_encoder_decoder", True),
            "is_encoder_decoder",
            "is false: transformers then masks the decoder's attention as a decoder-only model's, "
            "which fails on sources and targets of different lengths",
            "set it true",
        )
        # transformers 5 writes scale_decoder_outputs; 4 derives the scale from tie_word_embeddings.
        scale = config.get("scale_decoder_outputs", config.get("tie_word_embeddings", True))
        if model_type == "mt5":
            config = config.filled(MT5_DEFAULTS)
            scale = False
            if config.get("tie_word_embeddings", False):
                warnings.warn(
                    HFWarning(
                        "tie_word_embeddings is true: transformers 5 computes this mT5 without an output "
                        "scale, as the import does; transformers 4 multiplies the last hidden state by "
                        "d_model^-0.5"
                    ),
                    stacklevel=2,
                )
        layers = config.get("num_layers", 6)
        d, heads, d_kv = config.get("d_model", 512), config.get("num_heads", 8), config.get("d_kv", 64)
        model: dict[str, Any] = {
            "family": "encoder_decoder",
            "vocab_size": config.get("vocab_size", 32128),
            "max_seq_len": config.get("n_positions", 512),
            "d_model": d,
            "n_layers": layers,
            "n_decoder_layers": config.get("num_decoder_layers", layers),
            "n_heads": heads,
            "head_dim": d_kv,
            "attention_scale": 1.0,
            "d_ff": config.get("d_ff", 2048),
            "activation": feed_forward(config),
            "positional": {
                "type": "relative",
                "num_buckets": config.get("relative_attention_num_buckets", 32),
                "max_distance": config.get("relative_attention_max_distance", 128),
            },
            "norm": {
                "position": "pre",
                "type": "rmsnorm",
                "eps": config.get("layer_norm_epsilon", 1e-6),
                "bias": False,
            },
            "bias": {"qkv": False, "attn_out": False, "ffn": False, "lm_head": False},
            "share_embeddings": True,
            "tie_embeddings": tied(config, tensors, "lm_head.weight", "shared.weight", True),
            "scale_output": scale,
            "dropout": {
                "embedding": dropout(config.get("dropout_rate", 0.1)),
                "residual": dropout(config.get("dropout_rate", 0.1)),
                "attention": dropout(config.get("dropout_rate", 0.1)),
            },
            "init_std": d**-0.5 if d > 0 else 1.0,  # a width of 0 or less: the spec refuses d_model
        }
        # transformers' T5 tokenizer ends every source with </s>
        return Imported(model, {"type": "seq2seq", "source_suffix": ["eos"]}, decoder_start=True)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        shared = tensors.take("shared.weight")
        for copy in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
            tensors.maybe(copy)  # some files repeat the shared table (a tied head)
        state = {
            "embed.weight": shared,
            "target_embed.weight": shared,
            "lm_head.weight": shared if model.tie_embeddings else tensors.take("lm_head.weight"),
            "encoder_positional.bias.weight": tensors.take(BIAS),
            "decoder_positional.bias.weight": tensors.take(DECODER_BIAS),
            "encoder_norm.weight": tensors.take("encoder.final_layer_norm.weight"),
            "decoder_norm.weight": tensors.take("decoder.final_layer_norm.weight"),
        }
        for h, b, ffn in _layers(model):
            a = f"{h}0.SelfAttention."
            state[f"{b}attn_norm.weight"] = tensors.take(f"{h}0.layer_norm.weight")
            state[f"{b}attn.qkv.weight"] = tensors.cat(f"{a}q.weight", f"{a}k.weight", f"{a}v.weight")
            state[f"{b}attn.out.weight"] = tensors.take(f"{a}o.weight")
            if ffn == 2:  # the decoder's layer 1 is cross-attention
                c = f"{h}1.EncDecAttention."
                state[f"{b}cross_norm.weight"] = tensors.take(f"{h}1.layer_norm.weight")
                state[f"{b}cross.q.weight"] = tensors.take(f"{c}q.weight")
                state[f"{b}cross.kv.weight"] = tensors.cat(f"{c}k.weight", f"{c}v.weight")
                state[f"{b}cross.out.weight"] = tensors.take(f"{c}o.weight")
            f = f"{h}{ffn}."
            state[f"{b}ffn_norm.weight"] = tensors.take(f"{f}layer_norm.weight")
            gated = f"{f}DenseReluDense.wi_0.weight" in tensors
            wi = ("wi_0", "wi_1") if gated else ("wi",)  # wi_0 is the activated gate
            state[f"{b}ffn.w_in.weight"] = tensors.cat(*(f"{f}DenseReluDense.{w}.weight" for w in wi))
            state[f"{b}ffn.w_out.weight"] = tensors.take(f"{f}DenseReluDense.wo.weight")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A translator of any positions but sinusoidal or learned ones (bart.py writes those)."""
        return (
            isinstance(spec.model, EncoderDecoderSpec)
            and isinstance(spec.task, Seq2SeqTask)
            and not isinstance(spec.model.positional, SinusoidalPositional | LearnedPositional)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        need = Needs("T5")
        need(model.norm.type == "rmsnorm", "model.norm.type", model.norm.type, "rmsnorm")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(not model.norm.bias, "model.norm.bias", True, "false")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        need(
            isinstance(model.positional, RelativePositional),
            "model.positional",
            model.positional.type,
            "relative",
        )
        need(model.share_embeddings, "model.share_embeddings", False, "true")
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need(model.attention_scale == 1.0, "model.attention_scale", model.attention_scale, "1")
        need(
            model.activation in FEED_FORWARD,
            "model.activation",
            model.activation,
            f"one of {sorted(FEED_FORWARD)}",
        )
        need.no_extras(model)
        for name in ("qkv", "attn_out", "ffn"):
            need(not getattr(model.bias, name), f"model.bias.{name}", True, "false (T5 has no biases)")
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec) and isinstance(model.positional, RelativePositional)
        feed_forward_proj = FEED_FORWARD[model.activation]
        dense_act_fn, is_gated_act = derived(feed_forward_proj)
        return {
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "vocab_size": model.vocab_size,
            "d_model": model.d_model,
            "d_kv": model.head_dim,
            "d_ff": model.d_ff,
            "num_layers": model.n_layers,
            "num_decoder_layers": model.n_decoder_layers,
            "num_heads": model.n_heads,
            "relative_attention_num_buckets": model.positional.num_buckets,
            "relative_attention_max_distance": model.positional.max_distance,
            # transformers writes the two it derives beside feed_forward_proj, and reads them over it
            "feed_forward_proj": feed_forward_proj,
            "dense_act_fn": dense_act_fn,
            "is_gated_act": is_gated_act,
            "layer_norm_epsilon": model.norm.eps,
            "dropout_rate": model.dropout.residual,
            "n_positions": model.max_seq_len,
            # Not scale_decoder_outputs: transformers 4 ignores it, and both derive it from this.
            "tie_word_embeddings": hf_tied(model),
            "is_encoder_decoder": True,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec) and model.head_dim is not None
        inner = model.n_heads * model.head_dim
        gated = model.gated
        out = {
            "shared.weight": state["embed.weight"],
            BIAS: state["encoder_positional.bias.weight"],
            DECODER_BIAS: state["decoder_positional.bias.weight"],
            "encoder.final_layer_norm.weight": state["encoder_norm.weight"],
            "decoder.final_layer_norm.weight": state["decoder_norm.weight"],
        }
        if not hf_tied(model):  # an untied head scaled: the scale folds into the norm before it
            out["lm_head.weight"] = state["lm_head.weight"].clone()
            out["decoder.final_layer_norm.weight"] = state["decoder_norm.weight"] * output_scale(model)
        for h, b, ffn in _layers(model):
            a = f"{h}0.SelfAttention."
            out[f"{h}0.layer_norm.weight"] = state[f"{b}attn_norm.weight"]
            q, k, v = state[f"{b}attn.qkv.weight"].split([inner, inner, inner])
            out |= {f"{a}q.weight": q, f"{a}k.weight": k, f"{a}v.weight": v}
            out[f"{a}o.weight"] = state[f"{b}attn.out.weight"]
            if ffn == 2:
                c = f"{h}1.EncDecAttention."
                out[f"{h}1.layer_norm.weight"] = state[f"{b}cross_norm.weight"]
                out[f"{c}q.weight"] = state[f"{b}cross.q.weight"]
                k, v = state[f"{b}cross.kv.weight"].chunk(2)
                out |= {
                    f"{c}k.weight": k,
                    f"{c}v.weight": v,
                    f"{c}o.weight": state[f"{b}cross.out.weight"],
                }
            f = f"{h}{ffn}."
            out[f"{f}layer_norm.weight"] = state[f"{b}ffn_norm.weight"]
            w_in = state[f"{b}ffn.w_in.weight"]
            parts = dict(zip(("wi_0", "wi_1"), w_in.chunk(2), strict=True)) if gated else {"wi": w_in}
            out |= {f"{f}DenseReluDense.{w}.weight": t for w, t in parts.items()}
            out[f"{f}DenseReluDense.wo.weight"] = state[f"{b}ffn.w_out.weight"]
        return contiguous(out)


def feed_forward(config: Config) -> str:
    """The spec's activation for the feed-forward, as transformers reads it: ``dense_act_fn`` and
    ``is_gated_act`` where the config holds them (transformers writes them beside
    ``feed_forward_proj``, and reads them over it), else what it derives from
    ``feed_forward_proj``."""
    value = str(config.get("feed_forward_proj", "relu"))
    parts = value.split("-")
    act, gated = derived(value)
    gated = bool(config.get("is_gated_act", gated))
    act = config.get("dense_act_fn", act)
    table = GATED_ACTIVATIONS if gated else ACTIVATIONS
    if len(parts) > 1 + (parts[0] == "gated") or act not in table:
        config.refuse(
            "dense_act_fn" if "dense_act_fn" in config.data else "feed_forward_proj",
            f"{'gated ' if gated else ''}{act!r} (feed_forward_proj {value!r}) is not a T5 feed-forward "
            f"tfcompile has",
            f"one of {sorted(ACTIVATIONS)}, or gated one of {sorted(GATED_ACTIVATIONS)}, imports",
        )
        return "relu"
    return str(table[act])


def derived(feed_forward_proj: str) -> tuple[str, bool]:
    """The ``dense_act_fn`` and ``is_gated_act`` transformers derives from ``feed_forward_proj``,
    ``ACT`` or ``gated-ACT`` with ACT any activation name (``gated-gelu`` is gelu_new's, T5 v1.1's)."""
    parts = feed_forward_proj.split("-")
    return ("gelu_new" if feed_forward_proj == "gated-gelu" else parts[-1]), parts[0] == "gated"


def _layers(model: EncoderDecoderSpec) -> Iterator[tuple[str, str, int]]:
    """Each block's prefix in transformers' names and in tfcompile's, and the index of its
    feed-forward layer (1 in the encoder; 2 in the decoder, whose layer 1 is cross-attention)."""
    for stack, count, ffn in (("encoder", model.n_layers, 1), ("decoder", model.n_decoder_layers or 0, 2)):
        for i in range(count):
            yield f"{stack}.block.{i}.layer.", f"{stack}_blocks.{i}.", ffn


def hf_tied(model: EncoderDecoderSpec) -> bool:
    """transformers ties T5's head exactly when it scales the output (a head tied without the scale
    is written untied, as a copy of the embeddings)."""
    return model.tie_embeddings and model.scale_output
