"""Phi (``PhiForCausalLM``: Phi-1, Phi-1.5, Phi-2): one LayerNorm feeding attention and the
feed-forward side by side (a parallel block with a shared norm, x + attn(ln(x)) + mlp(ln(x))),
RoPE on the first ``partial_rotary_factor`` of each head (``layout: halves``; 0.5 where the
config names none), grouped K/V heads, biases on every projection and on the LM head, and, with
``qk_layernorm``, one LayerNorm over each head's q and one over its k, shared by the heads and of
the blocks' epsilon: tfcompile's ``qk_norm`` of a LayerNorm. Phi-3 is another model type.

``resid_pdrop`` drops out each sublayer's output in transformers, the block's sum once in
tfcompile (``gpt_neox.parallel_dropout`` says so). export-hf does not write Phi: a spec of its
blocks is GPT-NeoX's candidate, which refuses the shared norm."""

from __future__ import annotations

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
from tfcompile.hf.gpt_neox import parallel_dropout, rope_sources
from tfcompile.hf.llama import FALLBACKS, rope_section
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

# Phi's names within a block -> tfcompile's (q, k and v apart).
LAYER = (
    ("input_layernorm", "attn_norm"),
    ("self_attn.dense", "attn.out"),
    ("mlp.fc1", "ffn.w_in"),
    ("mlp.fc2", "ffn.w_out"),
)
QK_NORMS = (("self_attn.q_layernorm", "attn.q_norm"), ("self_attn.k_layernorm", "attn.k_norm"))


@register("phi")
class Phi(Architecture):
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
        "model.norm.eps": "layer_norm_eps",
        "model.dropout.embedding": "embd_pdrop",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "resid_pdrop",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("PhiForCausalLM", "PhiModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a PhiForCausalLM",
        )
        tie = lm_head(
            config,
            tensors,
            architecture,
            ("lm_head.weight", "embed_tokens.weight"),
            False,
            "PhiForCausalLM",
            bias="lm_head.bias",
        )
        d, heads = config.get("hidden_size", 2048), config.get("num_attention_heads", 32)
        head_dim = config.get("head_dim", d // max(heads, 1))  # 0 heads: refused by the spec
        qk_norm = config.get("qk_layernorm", False)
        config.require(
            not qk_norm or head_dim * heads == d,
            "qk_layernorm",
            f"is true with head_dim {head_dim}: transformers' q and k LayerNorms are hidden_size / "
            f"num_attention_heads wide, not a head",
            "import a model whose heads are hidden_size / num_attention_heads wide",
        )
        residual = dropout(config.get("resid_pdrop", 0.0))
        parallel_dropout("parallel", residual, "resid_pdrop")
        vocab = config.get("vocab_size", 51200)
        pad_within(config, vocab)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 2048),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 24),
            "n_heads": heads,
            "n_kv_heads": config.get("num_key_value_heads", heads),
            "d_ff": config.get("intermediate_size", 8192),
            "activation": config.choice("hidden_act", "gelu_new", ACTIVATIONS, "Phi activation"),
            "positional": rope_section(config, head_dim, 0.5),
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_eps", 1e-5)},
            "block": {"type": "parallel", "shared_norm": True},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": True},
            "tie_embeddings": tie,
            "dropout": {
                "embedding": dropout(config.get("embd_pdrop", 0.0)),
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": residual,
            },
            "init_std": init_std(config),
        }
        if head_dim * heads != d:
            model["head_dim"] = head_dim
        if qk_norm:
            model["qk_norm"] = True
        sources = rope_sources(config, FALLBACKS)
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.n_kv_heads is not None
        qkv_rows = [model.n_heads * model.head_dim] + [model.n_kv_heads * model.head_dim] * 2
        embed = tensors.take("embed_tokens.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("final_layernorm.weight"),
            "final_norm.bias": tensors.take("final_layernorm.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
            "lm_head.bias": tensors.take("lm_head.bias"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            for kind in ("weight", "bias"):
                names = (f"{h}self_attn.{x}_proj.{kind}" for x in "qkv")
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names, rows=qkv_rows)
                for hf, tfc in LAYER + (QK_NORMS if model.qk_norm else ()):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state
