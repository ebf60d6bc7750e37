"""GPT-2 (``GPT2LMHeadModel``): learned positions, pre-LayerNorm blocks, a tied LM head. Its
Conv1D layers store weights as (in, out), the transpose of ``nn.Linear``'s.

export-hf writes a decoder LM with learned positions as one of three architectures, by what
decides its blocks: GPT-BigCode where one K/V head serves several query heads (MQA); else GPT-2
where the norms are before each sublayer with a final norm; else OPT (post-norm, or no final
norm)."""

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
    output_scale,
    register,
    tied,
    zeros_if_none,
)
from tfcompile.hf.errors import HFWarning, Problem
from tfcompile.spec import Spec
from tfcompile.spec.schema import CausalLMTask, DecoderSpec, LearnedPositional


def learned_decoder_lm(spec: Spec) -> DecoderSpec | None:
    """The spec's model where it is a decoder LM with learned positions (which GPT-2, OPT or
    GPT-BigCode writes), else None."""
    model = spec.model
    if isinstance(model, DecoderSpec) and isinstance(spec.task, CausalLMTask):
        return model if isinstance(model.positional, LearnedPositional) else None
    return None


def multi_query(model: DecoderSpec) -> bool:
    """One K/V head serving several query heads (MQA): GPT-BigCode's."""
    return model.n_kv_heads == 1 < model.n_heads


def gpt2_norms(model: DecoderSpec) -> bool:
    """A norm before each sublayer and one after the last block: GPT-2's (else OPT's)."""
    return model.norm.position == "pre" and bool(model.norm.final)


@register("gpt2")
class GPT2(Writable):
    prefixes = ("transformer.",)
    # GPT2Config's attribute_map: the names it reads its sizes under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "hidden_size": "n_embd",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }
    ignored = (".attn.bias", ".attn.masked_bias")  # the causal mask, a buffer
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "n_positions",
        "model.d_model": "n_embd",
        "model.n_layers": "n_layer",
        "model.n_heads": "n_head",
        "model.d_ff": "n_inner",
        "model.activation": "activation_function",
        "model.norm.eps": "layer_norm_epsilon",
        "model.dropout.embedding": "embd_pdrop",
        "model.dropout.attention": "attn_pdrop",
        "model.dropout.residual": "resid_pdrop",
        "model.init_std": "initializer_range",
        "model.attention_scale": "scale_attn_weights",
    }
    # What import reads and export-hf writes: the name, the head class (and the body's, which
    # imports too), the activation a config leaves out, the names of the spec's activations, the
    # config fields the architecture always has.
    name: ClassVar[str] = "GPT-2"
    head: ClassVar[str] = "GPT2LMHeadModel"
    body: ClassVar[str] = "GPT2Model"
    default_activation: ClassVar[str] = "gelu_new"
    activation_names: ClassVar[dict[str, str]] = EXPORTED_ACTIVATIONS
    fixed: ClassVar[dict[str, Any]] = {}

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in (self.head, self.body),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            f"import a {self.head}",
        )
        config.refuse_true(
            "scale_attn_by_inverse_layer_idx", why="a scale per layer is not in tfcompile's blocks"
        )
        config.refuse_true(
            "add_cross_attention", why="a decoder with cross-attention is not a language model"
        )
        d, heads = config.get("n_embd", 768), config.get("n_head", 12)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 50257),
            "max_seq_len": config.get("n_positions", 1024),
            "d_model": d,
            "n_layers": config.get("n_layer", 12),
            "n_heads": heads,
            "d_ff": config.get("n_inner", 4 * d),
            "activation": config.choice(
                "activation_function", self.default_activation, ACTIVATIONS, f"{self.name} activation"
            ),
            "positional": "learned",
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_epsilon", 1e-5)},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "tie_embeddings": tied(config, tensors, "lm_head.weight", "wte.weight", True),
            "dropout": {
                "embedding": dropout(config.get("embd_pdrop", 0.1)),
                "attention": dropout(config.get("attn_pdrop", 0.1)),
                "residual": dropout(config.get("resid_pdrop", 0.1)),
            },
            "init_std": init_std(config),
        }
        if (kv_heads := self.kv_heads(config, heads)) != heads:
            model["n_kv_heads"] = kv_heads
        if not config.get("scale_attn_weights", True):  # q.k unscaled
            model["attention_scale"] = 1.0
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def kv_heads(self, config: Config, heads: int) -> int:
        """The K/V heads of a config of ``heads`` query heads: GPT-2's are as many."""
        return heads

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        embed = tensors.take("wte.weight")
        state = {
            "embed.weight": embed,
            "positional.table.weight": tensors.take("wpe.weight"),
            "final_norm.weight": tensors.take("ln_f.weight"),
            "final_norm.bias": tensors.take("ln_f.bias"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            h, b = f"h.{i}.", f"blocks.{i}."
            for hf, tfc in LAYER:
                for kind in ("weight", "bias"):
                    t = tensors.take(f"{h}{hf}.{kind}")
                    state[f"{b}{tfc}.{kind}"] = self.read_layer(hf, kind, t, model)
        return state

    def read_layer(self, hf: str, kind: str, t: torch.Tensor, model: DecoderSpec) -> torch.Tensor:
        """A block's tensor (``hf``'s weight or bias) as tfcompile holds it: Conv1D weights transposed."""
        return t.t() if kind == "weight" and hf in CONV1D else t

    def written_layer(self, hf: str, kind: str, t: torch.Tensor, model: DecoderSpec) -> torch.Tensor:
        """A block's tensor as transformers holds it (``read_layer`` undone)."""
        return self.read_layer(hf, kind, t, model)  # a transpose is its own inverse

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with learned positions, GPT-2's norms, no MQA, no window (GPT-Neo's) and
        no scale on the embeddings (BioGPT's)."""
        model = learned_decoder_lm(spec)
        return (
            model is not None
            and not multi_query(model)
            and gpt2_norms(model)
            and model.window is None
            and not model.scale_embeddings
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        need = Needs(self.name)
        need(
            model.activation in EXPORTED_ACTIVATIONS,
            "model.activation",
            model.activation,
            "gelu_tanh (gelu_new)",
        )
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(bool(model.norm.bias), "model.norm.bias", False, "true")
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need.plain_attention(model, unscaled=True)  # scale_attn_weights false
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        if model.attention_scale == 1:
            warnings.warn(
                HFWarning(
                    "scale_attn_weights is false (model.attention_scale 1): transformers 4's default "
                    "SDPA attention ignores it and scales q.k anyway (5 does not); load the folder there "
                    "with attn_implementation='eager'"
                ),
                stacklevel=2,
            )
        return self.written_config(model)

    def written_config(self, model: DecoderSpec) -> dict[str, Any]:
        """The config.json of GPT-2's fields (GPT-BigCode's too)."""
        return {
            "architectures": [self.head],
            "model_type": self.model_types[0],
            "vocab_size": model.vocab_size,
            "n_positions": model.max_seq_len,
            "n_embd": model.d_model,
            "n_layer": model.n_layers,
            "n_head": model.n_heads,
            **self.fixed,
            "scale_attn_weights": model.attention_scale != 1,
            "n_inner": model.d_ff,
            "activation_function": self.activation_names[model.activation],
            "layer_norm_epsilon": model.norm.eps,
            "embd_pdrop": model.dropout.embedding,
            "attn_pdrop": model.dropout.attention,
            "resid_pdrop": model.dropout.residual,
            "initializer_range": model.init_std,
            "tie_word_embeddings": model.tie_embeddings,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        p, scale = "transformer.", output_scale(model)
        out = {
            f"{p}wte.weight": state["embed.weight"],
            f"{p}wpe.weight": state["positional.table.weight"],
            f"{p}ln_f.weight": state["final_norm.weight"] * scale,
            f"{p}ln_f.bias": state["final_norm.bias"] * scale,
        }
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        for i in range(model.n_layers):
            h, b = f"{p}h.{i}.", f"blocks.{i}."
            for hf, tfc in LAYER:
                weight = state[f"{b}{tfc}.weight"]
                bias = zeros_if_none(state.get(f"{b}{tfc}.bias"), weight.shape[0])
                out[f"{h}{hf}.weight"] = self.written_layer(hf, "weight", weight, model)
                out[f"{h}{hf}.bias"] = self.written_layer(hf, "bias", bias, model)
        return contiguous(out)


# GPT-2's names within a block -> tfcompile's; the Conv1D ones are transposed.
LAYER = (
    ("ln_1", "attn_norm"),
    ("attn.c_attn", "attn.qkv"),
    ("attn.c_proj", "attn.out"),
    ("ln_2", "ffn_norm"),
    ("mlp.c_fc", "ffn.w_in"),
    ("mlp.c_proj", "ffn.w_out"),
)
CONV1D = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}
