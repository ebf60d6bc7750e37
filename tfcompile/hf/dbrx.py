"""DBRX (``DbrxForCausalLM``: Databricks' DBRX Base and Instruct): LLaMA's blocks, grouped K/V heads
and RoPE on the two halves of each head, with LayerNorms that learn no shift (``norm: {type:
layernorm, bias: false}``, epsilon 1e-5), q, k and v clamped to ``clip_qkv`` (``qkv_clip``), and
every layer routed among SwiGLU experts (``model.moe``): a softmax over every expert, the top
``moe_top_k``, rescaled by their 1-norm (``moe.normalize``; none where
``moe_normalize_expert_weights`` is null).

DbrxConfig nests what other configs hold at the top: the attention's fields in ``attn_config``, the
experts' in ``ffn_config``; ``dbrx_fields`` reads them under LLaMA's names, so that Llama's reading
applies, and each problem names the field as the file has it (``attn_config.kv_n_heads``). The
checkpoint holds q, k and v in one ``Wqkv``, and each layer's experts stacked: ``w1`` (gate) and
``v1`` (up) as (experts x d_ff) x d, ``w2`` (down) the same shape, read as x @ W.

transformers 4 turns DBRX's RoPE at ``attn_config.rope_theta`` (DBRX's own, 500000 for the
published models) and scales it by nothing; transformers 5 reads neither and turns it at the
top-level ``rope_parameters`` (10000 where a config has none, as the Hub's have not). The import
reads the theta the model was trained with, ``attn_config.rope_theta`` where it is set, and warns
where transformers 5 computes another. transformers 5 fails on a DBRX without ``clip_qkv``; the
import reads none as transformers 4 does (no clamp). export-hf writes no DBRX: Starcoder2, which
writes RoPE decoders of LayerNorms, refuses its experts by field."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, ClassVar

import torch

from tfcompile.hf.architecture import (
    Config,
    Imported,
    State,
    Tensors,
    contiguous,
    dropout,
    json_type,
    register,
)
from tfcompile.hf.errors import HFWarning
from tfcompile.hf.llama import MODEL_TYPES, Llama, ModelType, MoEType, shaped
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

# LLaMA's name of each field Llama reads -> where DbrxConfig has it
FIELDS = {
    "hidden_size": "d_model",
    "num_attention_heads": "n_heads",
    "num_hidden_layers": "n_layers",
    "max_position_embeddings": "max_seq_len",
    "num_key_value_heads": "attn_config.kv_n_heads",
    "clip_qkv": "attn_config.clip_qkv",
    "attention_dropout": "attn_config.attn_pdrop",
    "intermediate_size": "ffn_config.ffn_hidden_size",
    "hidden_act": "ffn_config.ffn_act_fn.name",
    "num_local_experts": "ffn_config.moe_num_experts",
    "num_experts_per_tok": "ffn_config.moe_top_k",
    "router_aux_loss_coef": "ffn_config.moe_loss_weight",
}
# The top-level fields Llama reads under their own names, which DbrxConfig has too.
SHARED = (
    "model_type",
    "vocab_size",
    "pad_token_id",
    "tie_word_embeddings",
    "initializer_range",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "partial_rotary_factor",
)
NORMALIZE = "ffn_config.moe_normalize_expert_weights"
THETA = "attn_config.rope_theta"


def dbrx_fields(config: Config) -> Config:
    """``config`` with DBRX's nested fields under LLaMA's names (FIELDS), problems naming each as
    the file has it; ``norm_topk_prob`` whether the top k are rescaled (a null
    ``moe_normalize_expert_weights``: not), and the fields Llama does not read kept under their
    dotted names for ``dbrx_requires`` and the RoPE."""
    attn, ffn = config.within("attn_config"), config.within("ffn_config")
    act = ffn.data.get("ffn_act_fn")
    act = {"name": "silu"} if act is None else act  # DbrxFFNConfig's
    if not isinstance(act, dict):
        config.refuse("ffn_config.ffn_act_fn", f"{act!r} is not a JSON object", 'write {"name": "silu"}')
        act = {}
    nested = {"attn_config": attn.data, "ffn_config": ffn.data | {"ffn_act_fn": act}}
    data: dict[str, Any] = {name: config.data[name] for name in SHARED if name in config.data}
    renamed: dict[str, str] = {}
    for llama, dbrx in FIELDS.items():
        head, dot, rest = dbrx.partition(".")
        value = config.data.get(dbrx) if not dot else dotted(nested[head], rest)
        if value is not None:
            data[llama] = value
            renamed[llama] = config.renamed.get(dbrx, dbrx)
    data[NORMALIZE] = ffn.data.get("moe_normalize_expert_weights", 1.0)
    data["norm_topk_prob"] = data[NORMALIZE] is not None
    data[THETA] = attn.data.get("rope_theta")
    data["resid_pdrop"] = config.data.get("resid_pdrop")
    return replace(config, data=data, renamed=renamed)


def dotted(data: Any, path: str) -> Any:
    """The value at ``path`` (dotted) in nested JSON objects; None where any part is missing."""
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def dbrx_requires(config: Config) -> None:
    """What DBRX computes that the spec cannot hold, or transformers refuses: top k weights rescaled
    by another norm than their sum, no RoPE theta in attn_config, and a tied head."""
    p, top_k = config.data[NORMALIZE], config.get("num_experts_per_tok", 1)
    config.require(
        p is None or (json_type(p) == "a number" and (p == 1 or top_k == 1)),
        NORMALIZE,
        f"is {p!r}: DBRX divides the top {top_k} experts' weights by their {p!r}-norm, and tfcompile's "
        "mixture of experts by their sum (a 1-norm)",
        "import a model of 1.0 (DBRX's), or null (the weights as the softmax gave them)",
    )
    config.require(
        config.data[THETA] is not None,
        THETA,
        "is missing: transformers 5's DBRX attention fails without it (transformers 4 turns RoPE at it)",
        "set it to the theta the model was trained with (the published DBRX's 500000)",
    )
    config.require(
        config.get("tie_word_embeddings", False) is not True,
        "tie_word_embeddings",
        "is true: DbrxConfig refuses a tied head",
        "set it to false",
    )


MODEL_TYPES["dbrx"] = ModelType(
    norm={"type": "layernorm", "eps": 1e-5, "bias": False},  # nn.LayerNorm(d_model, bias=False)
    clip_qkv=True,
    defaults={  # DbrxConfig's, DbrxAttentionConfig's and DbrxFFNConfig's
        "vocab_size": 32000,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "max_position_embeddings": 2048,
        "num_key_value_heads": 1,
        "intermediate_size": 3584,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "router_aux_loss_coef": 0.01,
    },
    # DbrxConfig's attribute_map: these names set its fields
    aliases={
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "max_position_embeddings": "max_seq_len",
    },
    requires=dbrx_requires,
    moe=MoEType(experts="num_local_experts", normalize="norm_topk_prob"),
    title="DBRX",
    head="DbrxForCausalLM",
)


@register("dbrx")
class Dbrx(Llama):
    prefixes = ("transformer.",)
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_seq_len",
        "model.d_model": "d_model",
        "model.n_layers": "n_layers",
        "model.n_heads": "n_heads",
        "model.n_kv_heads": "attn_config.kv_n_heads",
        "model.d_ff": "ffn_config.ffn_hidden_size",
        "model.activation": "ffn_config.ffn_act_fn.name",
        "model.positional.theta": "rope_theta",
        "model.dropout.attention": "attn_config.attn_pdrop",
        "model.dropout.residual": "resid_pdrop",
        "model.qkv_clip": "attn_config.clip_qkv",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        """Llama's reading of DBRX's fields (``dbrx_fields``), the residual branches' dropout
        (``resid_pdrop``) added."""
        fields = dbrx_fields(config)
        imported = super().read(fields, architecture, tensors)
        imported.model["dropout"]["residual"] = dropout(fields.get("resid_pdrop", 0.0))
        sources = {spec: fields.name(name) for spec, name in imported.sources.items()}
        if fields.data[THETA] is not None:
            sources["model.positional.theta"] = THETA
        return replace(imported, sources=sources)

    def rope(self, config: Config, head_dim: int) -> dict[str, Any]:
        """Llama's RoPE as transformers 5 reads it, turned at ``attn_config.rope_theta`` where it is
        set (the theta transformers 4 turns it at, and the model was trained with); warned: where
        the two versions differ."""
        section = super().rope(config, head_dim)
        theta, five = config.data[THETA], section["theta"]
        if theta is not None:  # else refused (dbrx_requires)
            section["theta"] = float(theta) if json_type(theta) == "a number" else theta
        four = section["theta"]
        differs = [f"transformers 4 turns it at theta {four} ({THETA}), 5 at {five}"] if four != five else []
        if "scaling" in section:
            differs.append("transformers 4 scales it by nothing, 5 as rope_parameters say")
        if differs:
            warnings.warn(
                HFWarning(
                    f"DBRX's RoPE: {'; '.join(differs)}; the import turns it at {section['theta']}"
                    + (" and scales it as 5 does" if "scaling" in section else "")
                ),
                stacklevel=3,
            )
        return section

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.n_kv_heads is not None
        assert model.moe is not None and model.d_ff is not None
        d, ff, experts = model.d_model, model.d_ff, model.moe.experts
        qkv_rows = (model.n_heads + 2 * model.n_kv_heads) * model.head_dim
        state = {
            "embed.weight": tensors.take("wte.weight"),
            "lm_head.weight": tensors.take("lm_head.weight"),
            "final_norm.weight": tensors.take("norm_f.weight"),
        }
        for i in range(model.n_layers):
            b = f"blocks.{i}."  # the checkpoint's name of the layer, and tfcompile's
            a, m = f"{b}norm_attn_norm.", f"{b}ffn."
            state[f"{b}attn_norm.weight"] = tensors.take(f"{a}norm_1.weight")
            state[f"{b}ffn_norm.weight"] = tensors.take(f"{a}norm_2.weight")
            state[f"{b}attn.qkv.weight"] = shaped(tensors, f"{a}attn.Wqkv.weight", (qkv_rows, d))
            state[f"{b}attn.out.weight"] = tensors.take(f"{a}attn.out_proj.weight")
            state[f"{b}ffn.router.weight"] = tensors.take(f"{m}router.layer.weight")
            gate, up, down = (
                shaped(tensors, f"{m}experts.mlp.{w}", (experts * ff, d)).view(experts, ff, d)
                for w in ("w1", "v1", "w2")
            )
            for e in range(experts):
                state[f"{b}ffn.experts.{e}.w_in.weight"] = torch.cat([gate[e], up[e]])  # gate first
                state[f"{b}ffn.experts.{e}.w_out.weight"] = down[e].T
        return contiguous(state)

    def candidate(self, spec: Spec) -> bool:
        """Never: export-hf writes no DBRX (a RoPE decoder of LayerNorms is Starcoder2's to write)."""
        return False
