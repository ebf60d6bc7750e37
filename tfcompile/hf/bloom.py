"""BLOOM (``BloomForCausalLM``): ALiBi (``positional: alibi``; transformers adds m_h times each key's
position among the real tokens to every score of a row, tfcompile -m_h times the query-to-key
distance: the same softmax, with the same slopes), a LayerNorm after the embeddings
(``word_embeddings_layernorm``: the decoder's ``embedding_norm``), pre-LayerNorm blocks in turn,
one fused ``query_key_value`` of [q, k, v] of each head in turn (GPT-NeoX's layout), biases on
every projection, a feed-forward 4 x hidden_size wide with the tanh GELU (``gelu_tanh``), and an
LM head tied to the embeddings unless the config says otherwise.

``pretraining_tp`` alone is not read. With ``slow_but_exact`` transformers sums the output
projections over ``pretraining_tp`` slices and adds none of their biases: refused, as is
``apply_residual_connection_post_layernorm`` (each sublayer's normalised input as its
residual). BLOOM has no position table: the context is 2048, its training sequence length, and
any other computes alike.

export-hf writes a decoder LM with ALiBi as BLOOM, which nothing else writes: pre-LayerNorm
blocks in turn with a final norm and one after the embeddings, a K/V head per head, the tanh GELU
4 x d_model wide. Biases the model lacks are written as zeros (exact); ``max_seq_len`` is not
(BLOOM has no limit), and tokenizer_config.json's ``model_max_length`` keeps it. transformers
computes the slopes as float32 powers of a float32 base: those of 1 to 10 heads are tfcompile's
float32 slopes exactly, more heads' up to 2.3e-6 of a slope apart."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
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
from tfcompile.hf.errors import Problem
from tfcompile.hf.gpt_neox import fused, grouped
from tfcompile.spec import Spec
from tfcompile.spec.schema import AlibiPositional, CausalLMTask, DecoderSpec

CONTEXT = 2048  # BLOOM's training sequence length; ALiBi holds no table of positions
# BLOOM's names within a block -> tfcompile's (the fused q, k, v apart); each has a bias.
LAYER = (
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attention.dense", "attn.out"),
    ("mlp.dense_h_to_4h", "ffn.w_in"),
    ("mlp.dense_4h_to_h", "ffn.w_out"),
)
QKV = "self_attention.query_key_value"


@register("bloom")
class Bloom(Writable):
    prefixes = ("transformer.",)
    # num_hidden_layers and num_attention_heads (its attribute_map's) and a legacy n_embed
    aliases: ClassVar[dict[str, str]] = {
        "n_embed": "hidden_size",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
    }
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.d_model": "hidden_size",
        "model.d_ff": "hidden_size",
        "model.n_layers": "n_layer",
        "model.n_heads": "n_head",
        "model.norm.eps": "layer_norm_epsilon",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "hidden_dropout",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("BloomForCausalLM", "BloomModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a BloomForCausalLM",
        )
        tie = lm_head(
            config,
            tensors,
            architecture,
            ("lm_head.weight", "word_embeddings.weight"),
            True,
            "BloomForCausalLM",
        )
        config.refuse_true(
            "apply_residual_connection_post_layernorm",
            why="each sublayer adds its normalised input to its output, which no norm position of "
            "tfcompile's does",
        )
        tp = config.get("pretraining_tp", 1)
        config.require(
            not (config.get("slow_but_exact", False) and tp > 1),
            "slow_but_exact",
            f"is true with pretraining_tp {tp}: transformers then sums the attention's and the "
            f"feed-forward's output projections in slices and adds neither one's bias",
            "set it false (the same sums, with the biases)",
        )
        d = config.get("hidden_size", 64)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 250880),
            "max_seq_len": CONTEXT,
            "d_model": d,
            "n_layers": config.get("n_layer", 2),
            "n_heads": config.get("n_head", 8),
            "d_ff": 4 * d,
            "activation": "gelu_tanh",  # bloom_gelu_forward's tanh formula
            "positional": {"type": "alibi"},
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_epsilon", 1e-5)},
            "embedding_norm": True,
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "tie_embeddings": tie,
            "dropout": {
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": dropout(config.get("hidden_dropout", 0.0)),
            },
            "init_std": init_std(config),
        }
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("word_embeddings.weight")
        state = {
            "embed.weight": embed,
            "embed_norm.weight": tensors.take("word_embeddings_layernorm.weight"),
            "embed_norm.bias": tensors.take("word_embeddings_layernorm.bias"),
            "final_norm.weight": tensors.take("ln_f.weight"),
            "final_norm.bias": tensors.take("ln_f.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            h, b = f"h.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias"):
                state[f"{b}attn.qkv.{kind}"] = grouped(tensors, f"{h}{QKV}.{kind}", model)
                for hf, tfc in LAYER:
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with ALiBi."""
        model = spec.model
        return (
            isinstance(model, DecoderSpec)
            and isinstance(spec.task, CausalLMTask)
            and isinstance(model.positional, AlibiPositional)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        need = Needs("BLOOM")
        need(model.activation == "gelu_tanh", "model.activation", model.activation, "gelu_tanh")
        need(model.d_ff == 4 * model.d_model, "model.d_ff", model.d_ff, f"{4 * model.d_model} (4 x d_model)")
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        need(model.embedding_norm, "model.embedding_norm", False, "true (BLOOM normalises its embeddings)")
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        # The embedding norm is checked above (BLOOM's, where no_extras refuses a decoder's): the
        # other scales and extras as GPT-2's.
        need.plain_attention(model.model_copy(update={"embedding_norm": False}))
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        return {
            "architectures": ["BloomForCausalLM"],
            "model_type": "bloom",
            "vocab_size": model.vocab_size,
            "hidden_size": model.d_model,
            "n_layer": model.n_layers,
            "n_head": model.n_heads,
            "layer_norm_epsilon": model.norm.eps,
            "apply_residual_connection_post_layernorm": False,
            "hidden_dropout": model.dropout.residual,
            "attention_dropout": model.dropout.attention,
            "pretraining_tp": 1,
            "slow_but_exact": False,
            "tie_word_embeddings": model.tie_embeddings,
            "initializer_range": model.init_std,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        p, d, scale = "transformer.", model.d_model, output_scale(model)
        out = {
            f"{p}word_embeddings.weight": state["embed.weight"],
            f"{p}word_embeddings_layernorm.weight": state["embed_norm.weight"],
            f"{p}word_embeddings_layernorm.bias": zeros_if_none(state.get("embed_norm.bias"), d),
            f"{p}ln_f.weight": state["final_norm.weight"] * scale,
            f"{p}ln_f.bias": zeros_if_none(state.get("final_norm.bias"), d) * scale,
        }
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        for i in range(model.n_layers):
            h, b = f"{p}h.{i}.", f"blocks.{i}."
            out[f"{h}{QKV}.weight"] = fused(state[f"{b}attn.qkv.weight"], model)
            out[f"{h}{QKV}.bias"] = fused(zeros_if_none(state.get(f"{b}attn.qkv.bias"), 3 * d), model)
            for hf, tfc in LAYER:
                weight = state[f"{b}{tfc}.weight"]
                out[f"{h}{hf}.weight"] = weight
                out[f"{h}{hf}.bias"] = zeros_if_none(state.get(f"{b}{tfc}.bias"), weight.shape[0])
        return contiguous(out)
