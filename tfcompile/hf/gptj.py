"""GPT-J (``GPTJForCausalLM``): one LayerNorm (``ln_1``) feeding attention and the feed-forward
side by side (a parallel block with a shared norm, x + attn(ln(x)) + mlp(ln(x))), RoPE of theta
10,000 on the first ``rotary_dim`` dimensions of each head as interleaved pairs (GPT-J's
rotate_every_two: ``layout: interleaved``), q, k, v and out projections without biases, a
feed-forward with them and an LM head with a bias (untied unless the config ties it).

CodeGen (``CodeGenForCausalLM``: CodeGen-350M to 16B, mono, multi and nl) is GPT-J with q, k and
v in one ``qkv_proj`` laid out for the four model-parallel shards it was trained on: each quarter
of its rows holds a quarter of the queries, then of the values, then of the keys (``n_embd`` not
a multiple of 4 is refused: transformers cannot split it).

``resid_pdrop`` drops out each sublayer's output in transformers, the block's sum once in
tfcompile (``gpt_neox.parallel_dropout`` says so). export-hf writes neither: a spec of their
blocks is GPT-NeoX's candidate, which refuses the shared norm."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

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
from tfcompile.hf.gpt_neox import parallel_dropout
from tfcompile.hf.llama import split
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

THETA = 10000.0  # create_sinusoidal_positions' base; the config has no field for it
# GPT-J's names within a block -> tfcompile's (q, k and v apart), and whether each has a bias.
LAYER = (
    ("ln_1", "attn_norm", True),
    ("attn.out_proj", "attn.out", False),
    ("mlp.fc_in", "ffn.w_in", True),
    ("mlp.fc_out", "ffn.w_out", True),
)


@register("gptj")
class GPTJ(Architecture):
    prefixes = ("transformer.",)
    # GPTJConfig's attribute_map: the names it reads its sizes under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "hidden_size": "n_embd",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }
    ignored = (".attn.bias", ".attn.masked_bias")  # the causal mask, buffers in older checkpoints
    architectures: ClassVar[tuple[str, ...]] = ("GPTJForCausalLM", "GPTJModel")
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "n_positions",
        "model.d_model": "n_embd",
        "model.n_layers": "n_layer",
        "model.n_heads": "n_head",
        "model.d_ff": "n_inner",
        "model.activation": "activation_function",
        "model.positional.rotary_dims": "rotary_dim",
        "model.norm.eps": "layer_norm_epsilon",
        "model.dropout.embedding": "embd_pdrop",
        "model.dropout.attention": "attn_pdrop",
        "model.dropout.residual": "resid_pdrop",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        head = self.architectures[0]
        config.require(
            architecture in self.architectures,
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            f"import a {head}",
        )
        tie = lm_head(
            config, tensors, architecture, ("lm_head.weight", "wte.weight"), False, head, bias="lm_head.bias"
        )
        d = config.get("n_embd", 4096)
        self.requires(config)
        config.require(
            "rotary_dim" not in config.data or config.data["rotary_dim"] is not None,
            "rotary_dim",
            "is null: transformers 5 refuses it, and 4 rotates n_embd dimensions of each head, "
            "which fails unless there is one head",
            "set it to the dimensions of a head that rotate",
        )
        rotary = config.get("rotary_dim", 64)  # odd, or more than a head: refused by the spec
        residual = dropout(config.get("resid_pdrop", 0.0))
        parallel_dropout("parallel", residual, "resid_pdrop")
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 50400),
            "max_seq_len": config.get("n_positions", 2048),
            "d_model": d,
            "n_layers": config.get("n_layer", 28),
            "n_heads": config.get("n_head", 16),
            "d_ff": config.get("n_inner", 4 * d),
            "activation": config.choice("activation_function", "gelu_new", ACTIVATIONS, "GPT-J activation"),
            "positional": {"type": "rope", "theta": THETA, "layout": "interleaved", "rotary_dims": rotary},
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_epsilon", 1e-5)},
            "block": {"type": "parallel", "shared_norm": True},
            "bias": {"qkv": False, "attn_out": False, "ffn": True, "lm_head": True},
            "tie_embeddings": tie,
            "dropout": {
                "embedding": dropout(config.get("embd_pdrop", 0.0)),
                "attention": dropout(config.get("attn_pdrop", 0.0)),
                "residual": residual,
            },
            "init_std": init_std(config),
        }
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def requires(self, config: Config) -> None:
        """What this model type's config must say that GPT-J's need not (transformers fails otherwise)."""

    def qkv(self, tensors: Tensors, attention: str, model: DecoderSpec) -> torch.Tensor:
        """A block's q, k and v rows one after another (``attention``: its tensors' prefix)."""
        return tensors.cat(*(f"{attention}{x}_proj.weight" for x in "qkv"))

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("wte.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("ln_f.weight"),
            "final_norm.bias": tensors.take("ln_f.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
            "lm_head.bias": tensors.take("lm_head.bias"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            h, b = f"h.{i}.", f"blocks.{i}."
            state[f"{b}attn.qkv.weight"] = self.qkv(tensors, f"{h}attn.", model)
            for hf, tfc, biased in LAYER:
                state[f"{b}{tfc}.weight"] = tensors.take(f"{h}{hf}.weight")
                if biased:
                    state[f"{b}{tfc}.bias"] = tensors.take(f"{h}{hf}.bias")
        return state


SHARDS = 4  # CodeGen's model-parallel shards, fixed in its attention (mp_num)


@register("codegen")
class CodeGen(GPTJ):
    """GPT-J's reading of CodeGen: its fused qkv_proj, four shards of (queries, values, keys)."""

    ignored = (".attn.causal_mask", ".attn.masked_bias")  # buffers in the published checkpoints
    architectures = ("CodeGenForCausalLM", "CodeGenModel")

    def requires(self, config: Config) -> None:
        d = config.get("n_embd", 4096)
        config.require(
            d % SHARDS == 0,
            "n_embd",
            f"is {d}: CodeGen splits its fused q, k and v into {SHARDS} shards of n_embd / {SHARDS} "
            "each, and transformers fails on another width",
            f"a multiple of {SHARDS}",
        )

    def qkv(self, tensors: Tensors, attention: str, model: DecoderSpec) -> torch.Tensor:
        """The rows of each shard's queries, then each one's keys, then values: CodeGen's qkv_proj
        holds, shard after shard, a quarter of the queries, of the values and of the keys."""
        local = model.d_model // SHARDS
        parts = split(tensors, f"{attention}qkv_proj.weight", [local] * 3 * SHARDS)
        queries, values, keys = parts[0::3], parts[1::3], parts[2::3]
        return torch.cat([*queries, *keys, *values])
