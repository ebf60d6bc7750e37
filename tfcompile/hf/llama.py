"""The LLaMA family (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, ``OlmoForCausalLM``, ``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``,
``SmolLM3ForCausalLM``, ``GraniteForCausalLM``, ``MinistralForCausalLM``, ``HeliumForCausalLM``,
``SeedOssForCausalLM``, ``Ernie4_5ForCausalLM``, ``ArceeForCausalLM``, ``NemotronForCausalLM``,
``GlmForCausalLM``, ``Glm4ForCausalLM``, ``Exaone4ForCausalLM``, and the mixtures of experts
``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``, ``OlmoeForCausalLM``,
``GraniteMoeForCausalLM``, ``GraniteMoeSharedForCausalLM``, ``FlexOlmoForCausalLM``,
``HunYuanMoEV1ForCausalLM``): RoPE on the two halves of each head (``layout: halves``, so no weight
is permuted), RMSNorm, a gated feed-forward, grouped K/V heads; what each model type computes that
its config does not say, in MODEL_TYPES. Qwen2's biases are on q, k and v only, whatever the config
says; the others' ``attention_bias`` is on q, k, v and o. Qwen3 normalises each head's q and k
(``qk_norm``), and its heads are 128 wide unless its config says otherwise. OLMo's norms are
LayerNorms of epsilon 1e-5 that learn nothing (``norm: {scale: false, bias: false}``), and its
``clip_qkv`` clamps q, k and v (``qkv_clip``): export-hf writes no OLMo (such norms are refused by
field). OLMo 2's norms are on each sublayer's output (``norm.position: output``), its q and k
normalised over all heads (``qk_norm_over: all_heads``). OLMo 3 is OLMo 2 sliding the layers its
``layer_types`` name (three of every four where it has none, as Olmo3Config derives them) with a
RoPE per layer type (``rope_parameters`` keyed by layer type): the sliding layers' is
``positional.local`` where it differs from the full layers'. export-hf writes an OLMo 3 as OLMo 2
only where OLMo 2 computes it (no window, one RoPE); else it refuses it by field (``model.window``,
``model.positional.local``). SmolLM3 turns no RoPE in some layers (``positional.nope_layers``);
Granite multiplies embeddings, residual branches and logits (the spec's multipliers) and scales q.k
by its own ``attention_multiplier``. Ministral is Mistral sliding only the layers its
``layer_types`` name (every layer where it has none). Helium and ERNIE 4.5 turn interleaved pairs
(``layout: interleaved``, the rows as saved); Helium's ``attention_bias`` is on q, k and v only,
ERNIE 4.5's ``use_bias`` on q, k, v, o and the feed-forward, and Seed-OSS reads its output
projection's bias apart (``attention_out_bias``). export-hf writes none of these four: their models
are written as Llama, Mistral or Qwen2, which compute the same. GLM turns interleaved pairs of half
of each head (``partial_rotary_factor``), has q, k and v biases and its gate and up projections in
one ``gate_up_proj`` (FusedFeedForward); GLM-4 adds a norm on each sublayer's output
(``norm.position: sandwich``); export-hf writes them back (a GLM without biases as Phi-3). Arcee's
feed-forward is plain (``up_proj`` alone, ModelType.gated), of the squared ReLU by default;
export-hf writes every RoPE decoder of a plain feed-forward as Arcee. Nemotron is Arcee's
feed-forward in blocks of LayerNorms with a shift (NemotronLayerNorm1P's weight + 1 folded in) on
half of each head; GPT-NeoX or Starcoder2 write it where they can. EXAONE 4 is OLMo 2's output norms
with each head's q and k normalised (Qwen3's), sliding the layers its ``layer_types`` name (where
none, all but every ``sliding_window_pattern``-th); where it has a window its full-attention layers
turn no RoPE (``positional.nope_layers``); export-hf writes it back. HunYuan normalises each head's
q and k after RoPE (``qk_norm_after_rope``, under its own names) and reads a dynamic RoPE with an
``alpha`` as a larger theta (NTK alpha); export-hf writes it back. RoPE scaling reads both
transformers 4's ``rope_scaling`` and 5's ``rope_parameters``.

The mixtures of experts are ``model.moe`` (MODEL_TYPES' ``moe``, MoEType): a router's softmax over
every expert in float32, the top ``num_experts_per_tok``. Mixtral is Mistral's attention, every
layer routed among experts of ``intermediate_size``, the top k renormalised; Qwen2-MoE is Qwen2's
attention (``qkv_bias``) with experts of ``moe_intermediate_size``, ``norm_topk_prob``, and a
shared expert gated by sigmoid(x . w), in the layers ``decoder_sparse_step`` and
``mlp_only_layers`` leave routed (the others keep a dense feed-forward of ``intermediate_size``:
``moe.dense_layers``; none routed is a dense model); Qwen3-MoE is Qwen3's attention (heads of
hidden_size / heads where no head_dim) with Qwen2-MoE's experts but the shared one; OLMoE is OLMo
2's q and k norms over all heads in pre-norm blocks, every layer routed, its ``clip_qkv`` refused
(it clamps q and k after their norms, the spec's qkv_clip before). ``router_aux_loss_coef`` is
``moe.balance_loss``. Their checkpoints name each expert's tensors (``w1``, ``w3``, ``w2`` under
Mixtral's ``block_sparse_moe``; ``gate_proj``, ``up_proj``, ``down_proj`` under the others'
``mlp``), or hold transformers 5's stacked ``experts.gate_up_proj`` and ``experts.down_proj``.
GraniteMoE is Granite's attention and multipliers with Mixtral's routing (the top k's softmax) over
experts stacked in one tensor per layer (read by the GraniteMoe converter), and GraniteMoeShared
adds an ungated shared expert of ``shared_intermediate_size`` (none where 0: ``moe.shared_gate:
false``). FlexOlmo is OLMo 2's blocks with OLMoE's experts and routing in every layer; HunYuan-MoE
is HunYuan's attention with every layer routed among experts of ``intermediate_size`` (the top
``moe_topk`` renormalised) beside an ungated shared expert as wide, a per-layer list of
``moe_topk`` read where every layer has the same. GLM-4.5 (``Glm4MoeForCausalLM``) and dots.llm1
(``Dots1ForCausalLM``) route as DeepSeek-V3 (MoEType.deepseek): each expert's sigmoid score, the
router's ``e_score_correction_bias`` added to choose (``moe.selection_bias``), the best
``topk_group`` of ``n_group`` groups chosen among (``moe.groups``), the weights times
``routed_scaling_factor`` (``moe.scale``), ``n_shared_experts`` shared experts in one, the first
``first_k_dense_replace`` layers dense; GLM-4.5's checkpoints' multi-token prediction layers are
left out (Glm4Moe); Solar Open is GLM-4.5's attention without q/k norms, every layer routed.
export-hf writes every decoder of experts scored by sigmoids as GLM-4.5. ERNIE 4.5 MoE is ERNIE
4.5's attention with a softmax's top k chosen with a selection bias and renormalised, beside shared
experts, in the layers its moe_layer_* fields route (import only).
export-hf writes a mixture of experts as Mixtral (no q/k norms, no shared expert, every layer routed,
the top k renormalised, no attention biases), Qwen3-MoE (each head's q and k normalised),
Qwen2-MoE (a sigmoid-gated shared expert), GraniteMoE (Granite's multipliers or attention scale),
GraniteMoeShared (an ungated shared expert), OLMoE (q and k normalised over all heads), FlexOlmo
(OLMo 2's output norms) or HunYuan-MoE (q and k normalised after RoPE), which
``written_as`` picks by the spec's features and each model type's ``own`` holds to what it
computes; every other writer refuses ``model.moe`` (``Needs.no_extras``)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar, TypeGuard

import torch

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    ARCHITECTURES,
    GATED_ACTIVATIONS,
    MULTIPLIERS,
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
    json_type,
    lm_head,
    output_scale,
    pad_within,
    register,
    unread_window,
    whole_number,
    zeros_if_none,
)
from tfcompile.hf.architecture import EXPORTED_ACTIVATIONS as PLAIN
from tfcompile.hf.errors import HFError, HFWarning, Problem
from tfcompile.spec import Spec
from tfcompile.spec.schema import MAX_LAYERS, CausalLMTask, DecoderSpec, DynamicRopeScaling, RopePositional

EXPORTED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh"}


@dataclass(frozen=True)
class ModelType:
    """What a LLaMA-like model_type computes that its config.json does not say, or says its own way."""

    attention_bias: tuple[str, ...] = ()  # the spec's biases (model.bias.*) that attention_bias sets
    fixed_bias: tuple[str, ...] = ()  # the spec's biases always there, whatever the config says
    mlp_bias: bool = False  # whether mlp_bias is read (the feed-forward's biases)
    qk_norm: bool = False  # each head's q and k normalised
    qk_norm_field: str | None = None  # the flag that sets them where the config says (GLM-4.5's use_qk_norm)
    scale_embeddings: bool = False  # embeddings multiplied by sqrt(hidden_size)
    every_layer_slides: bool = False  # every layer slides (layer_types unread), where a window is set
    # AutoModel reads a config with layer_types as another class, which follows them (a Mistral's:
    # Ministral), where the model type's own class slides every layer: they differ past the window.
    layer_types_elsewhere: bool = False
    layer_types: bool = False  # layer_types read: the sliding layers it names (where a window is set)
    alternating: bool = False  # where no layer_types: every other layer slides, the first among them
    window_layers: bool = False  # where no layer_types: the layers from max_window_layers on slide
    # no_rope_layers read (a 0 per layer that turns no RoPE; where none, every no_rope_layer_interval-th
    # layer), and where no layer_types those layers slide, with use_sliding_window and a sliding_window
    nope: bool = False
    # embedding_multiplier, residual_multiplier, logits_scaling (the logits divided by it) and
    # attention_multiplier (the attention scale) read
    multipliers: bool = False
    # The config class's defaults where LlamaConfig's differ: ``defaults`` read where config.json
    # leaves the field out or null (a head_dim left out: d_model / heads, as LlamaConfig has it),
    # ``nullable`` where it leaves it out (the class keeps a null: no window, no pad id).
    defaults: dict[str, Any] = field(default_factory=dict)
    nullable: dict[str, Any] = field(default_factory=dict)
    activation: str = "hidden_act"  # the field the feed-forward's activation is read from
    # The blocks' norm where it is not a pre-RMSNorm of rms_norm_eps (an eps here: that one unread).
    norm: dict[str, Any] = field(default_factory=dict)
    norm_eps: str = "rms_norm_eps"  # the field of the norms' epsilon (Nemotron's norm_eps)
    qk_norm_over: str = "head"  # what the q and k norms normalise over (model.qk_norm_over)
    qk_norm_after_rope: bool = False  # the q and k norms after RoPE (HunYuan's), not before
    clip_qkv: bool = False  # whether clip_qkv is read (q, k and v clamped to it)
    # where no layer_types: every layer slides (MinistralConfig derives them so), where a window is set
    slides_by_default: bool = False
    # where no layer_types: every full_every-th layer full, the others sliding (Olmo3Config derives them so)
    full_every: int | None = None
    # a RoPE per layer type, rope_parameters keyed by it (layer_type_rope): OLMo 3's
    rope_per_layer_type: bool = False
    layout: str = "halves"  # which dimensions RoPE turns together: interleaved pairs for Helium and ERNIE 4.5
    gated: bool = True  # a gated feed-forward (gate_proj and up_proj); False: up_proj alone (Arcee's)
    # the fraction of each head RoPE turns where the config names none (GLM's 0.5), read as rotary_dims;
    # None: whole heads (a config naming another fraction refused)
    partial_rotary: float | None = None
    bias_field: str = "attention_bias"  # the field attention_bias is read from (ERNIE 4.5's use_bias)
    mlp_bias_field: str = "mlp_bias"  # the field the feed-forward's biases are read from, where mlp_bias
    out_bias_field: str | None = None  # the field the output projection's bias is read from apart (Seed-OSS)
    # whether attention_dropout is read (ERNIE 4.5 drops none, whatever it says)
    attention_dropout: bool = True
    # What the model type's config must say that LlamaConfig's need not (transformers fails otherwise).
    requires: Callable[[Config], None] | None = None
    # What export-hf calls it and the head class it writes, and what writing a model as it needs of
    # the model type's own features: their problems, and the model without them (then held to
    # Llama's needs).
    title: str = "Llama"
    head: str = "LlamaForCausalLM"
    own: Callable[[Needs, DecoderSpec], DecoderSpec] | None = None
    # Other names of config fields the config class reads over them (a name that is no field of
    # the class, set after its fields: Mixtral's num_experts, OLMoE's and Qwen3-MoE's num_local_experts).
    aliases: dict[str, str] = field(default_factory=dict)
    # where no layer_types: the layer types the config class derives (Qwen2-MoE's), for a listable count
    derive_layer_types: Callable[[Config, int], list[str]] | None = None
    # sliding_window read only with use_sliding_window (the config class drops it otherwise)
    window_flag: bool = False
    # A mixture of experts in the feed-forwards (model.moe), as its config says it (its tensors'
    # names: Llama's and Mixtral's moe_prefixes and expert_names).
    moe: MoEType | None = None
    # where sliding_window is not null, the layers that do not slide turn no RoPE (EXAONE 4's global NoPE)
    nope_full: bool = False
    # a null attention_multiplier scales q.k by 1/sqrt(head_dim) (GraniteMoE's attention passes it to
    # SDPA, whose default that is); else it reads as left out (Granite's config class refuses it)
    null_attention_scale: bool = False
    # the feed-forward's activation whatever the config says (GPT-OSS's clamped SwiGLU: hidden_act
    # unread); None: read from ``activation``
    fixed_activation: str | None = None
    sinks: bool = False  # a learned logit per head in each attention's softmax (GPT-OSS's ``sinks``)
    # fields a list may give, one value per layer (HunYuan-MoE's moe_topk): read as that value where
    # it is the same in every layer (per_layer_value)
    per_layer: tuple[str, ...] = ()
    # each query scaled after RoPE by 1 + llama_4_scaling_beta ln(1 + floor(m / original length)),
    # both read from the RoPE dict (Ministral 3's): positional.query_scaling
    query_scaling: bool = False

    @property
    def reads_window(self) -> bool:
        """Whether the model type's attention reads sliding_window (on some layers, or all)."""
        return any(
            (
                self.every_layer_slides,
                self.layer_types,
                self.slides_by_default,
                self.alternating,
                self.window_layers,
                self.nope,
            )
        )

    def reads(self, config: Config) -> Config:
        """``config`` as this model type's config class reads it, ``layer_types`` derived where it
        has none and ``full_every`` or ``derive_layer_types`` says how; its problems are ``config``'s."""
        read = config.filled(self.defaults, self.nullable)
        n_layers: Any = read.data.get("num_hidden_layers")
        if self.full_every and read.data.get("layer_types") is None and listable(n_layers):
            every = self.full_every
            read.data["layer_types"] = [FULL if (i + 1) % every == 0 else SLIDING for i in range(n_layers)]
        if self.derive_layer_types and read.data.get("layer_types") is None and listable(n_layers):
            read.data["layer_types"] = self.derive_layer_types(read, n_layers)
        if self.window_flag and not read.get("use_sliding_window", False):
            read.data["sliding_window"] = None
        for name in self.per_layer:
            read.data[name] = per_layer_value(read, name, n_layers)
        return read


def per_layer_value(config: Config, name: str, n_layers: Any) -> Any:
    """The field's value where it is one for every layer, as a list of one per layer (transformers
    reads the i-th for layer i) or not a list; a list whose layers differ is a problem (the spec's
    experts are alike in every layer), as is one shorter than the layers (transformers fails)."""
    value = config.data.get(name)
    if not isinstance(value, list):
        return value
    layers = value[:n_layers] if listable(n_layers) else value
    config.require(
        bool(layers)
        and all(v == layers[0] for v in layers)
        and (not listable(n_layers) or len(value) >= n_layers),
        name,
        f"{value!r} is not one value for each of the {n_layers} layers: tfcompile's layers route alike",
        "import a model whose layers all have the same",
    )
    return layers[0] if layers else None


@dataclass(frozen=True)
class MoEType:
    """How a model type's config says its mixture of experts (model.moe): a softmax over every
    expert in float32, the top ``num_experts_per_tok``, as transformers' Mixtral, Qwen2-MoE,
    Qwen3-MoE and OLMoE route; the config class's defaults are the model type's ``defaults``."""

    experts: str  # the field of the expert count
    top_k: str = "num_experts_per_tok"  # the field of the experts each token goes through
    d_ff: str = "intermediate_size"  # the field of each expert's hidden width (model.d_ff where this)
    normalize: str | None = "norm_topk_prob"  # the field that renormalises the top k; None: always
    # the field of a shared expert's width (Qwen2-MoE's shared_expert_intermediate_size); None: none
    shared: str | None = None
    # the shared expert gated by sigmoid(x . w) (Qwen2-MoE's); else ungated, and none where 0 wide
    # (GraniteMoeShared's shared_intermediate_size, 0 by default)
    shared_gate: bool = False
    # decoder_sparse_step and mlp_only_layers read: which layers route (the others a dense feed-forward
    # of intermediate_size); else every layer routes
    sparse_layers: bool = False
    router_bias: bool = False  # the router's logits have a bias (GPT-OSS's)
    # the router's e_score_correction_bias added to its scores to choose (moe.selection_bias)
    selection_bias: bool = False
    # the field counting shared experts of d_ff, in one (none where 0): DeepSeek-V3's n_shared_experts
    shared_count: str | None = None
    # DeepSeek-V3's routing (GLM-4.5's): each expert's sigmoid score, the best topk_group of n_group
    # groups chosen among, routed_scaling_factor
    deepseek: bool = False
    # the field of the first layers that stay dense, of intermediate_size (first_k_dense_replace);
    # None: every layer routes
    first_dense: str | None = None
    # ERNIE 4.5's routed layers: every moe_layer_interval-th (counted from 1) from moe_layer_start_index
    # to moe_layer_end_index (-1: the last), the others dense
    interval_layers: bool = False


def qwen2_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Qwen2 has q, k and v biases (zeros where the model has none) and no output bias."""
    need(
        not model.bias.attn_out,
        "model.bias.attn_out",
        True,
        "false (a sliding window on some layers, or beside q/k/v biases, is written as Qwen2's, "
        "which has no output projection bias)",
    )
    return model


def olmo2_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """OLMo 2's norms are on each sublayer's output and its q and k normalised over all heads;
    it has no window."""
    need(model.qk_norm, "model.qk_norm", False, "true (OLMo 2 normalises q and k)")
    over = model.qk_norm_over
    need(not model.qk_norm or over == "all_heads", "model.qk_norm_over", over, "all_heads")
    need(model.window is None, "model.window", model.window, "leave it unset (OLMo 2 has none)")
    norm = model.norm.model_copy(update={"position": "pre"})
    return model.model_copy(update={"norm": norm, "qk_norm_over": "head"})


def flex_olmo_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """FlexOlmo: OLMo 2's blocks (olmo2_own) with every layer routed, no shared expert."""
    moe = model.moe
    assert moe is not None
    need(
        not moe.dense_layers,
        "model.moe.dense_layers",
        moe.dense_layers,
        "leave it unset (FlexOlmo routes every layer)",
    )
    need(
        moe.shared_d_ff is None,
        "model.moe.shared_d_ff",
        moe.shared_d_ff,
        "leave it unset (FlexOlmo has none)",
    )
    return olmo2_own(need, model)


def smollm3_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """SmolLM3 turns no RoPE in some layers and has no q/k norms."""
    need(not model.qk_norm, "model.qk_norm", True, "false (SmolLM3 has no q/k norms)")
    assert isinstance(model.positional, RopePositional)
    return model.model_copy(update={"positional": model.positional.model_copy(update={"nope_layers": None})})


def granite_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Granite has multipliers and an attention scale of its own; no window, no q/k norms."""
    need(not model.qk_norm, "model.qk_norm", True, "false (Granite has no q/k norms)")
    need(model.window is None, "model.window", model.window, "leave it unset (Granite has none)")
    assert model.head_dim is not None
    return model.model_copy(
        update=dict.fromkeys(MULTIPLIERS, 1.0) | {"attention_scale": model.head_dim**-0.5}
    )


def granitemoe_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """GraniteMoE: Granite's attention (granite_own) with a mixture of intermediate_size experts in
    every layer, the top k's softmax (renormalised), and GraniteMoeShared's ungated shared expert."""
    moe = model.moe
    assert moe is not None
    need(
        not moe.dense_layers,
        "model.moe.dense_layers",
        moe.dense_layers,
        "leave it unset (GraniteMoE routes every layer)",
    )
    need(bool(moe.normalize), "model.moe.normalize", False, "true (GraniteMoE takes the top k's softmax)")
    heads_of_hidden_size(need, model, "transformers 4's GraniteMoE reads hidden_size / heads, not head_dim")
    need(
        not moe.shared_gate,
        "model.moe.shared_gate",
        True,
        "false (GraniteMoeShared's shared expert is ungated; Qwen2-MoE's gated one has no multipliers)",
    )
    return granite_own(need, model)


def moe_window(need: Needs, model: DecoderSpec, title: str) -> None:
    """A window over every layer or none: Mixtral's and Qwen3-MoE's slide every layer alike."""
    every = model.sliding_layers == set(range(model.n_layers))
    layers = model.window.layers if model.window is not None else None
    need(
        model.window is None or every,
        "model.window.layers",
        layers,
        f"every layer ({title} slides all or none)",
    )


def mixtral_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Mixtral (a mixture of experts without q/k norms or a shared expert): Mistral's attention
    without biases, every layer routed, the top k renormalised, a window on every layer or none."""
    moe = model.moe
    assert moe is not None
    hint = "false (Mixtral's attention has no biases; Qwen2-MoE's, with a shared expert, has q, k and v's)"
    need(not model.bias.qkv, "model.bias.qkv", True, hint)
    need(not model.bias.attn_out, "model.bias.attn_out", True, hint)
    need(
        not moe.dense_layers,
        "model.moe.dense_layers",
        moe.dense_layers,
        "leave it unset (Mixtral routes every layer; Qwen3-MoE, with q/k norms, and Qwen2-MoE, with a "
        "shared expert, have dense layers)",
    )
    need(bool(moe.normalize), "model.moe.normalize", False, "true (Mixtral renormalises the top k)")
    moe_window(need, model, "Mixtral")
    return model


def gpt_oss_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """GPT-OSS: a sink per head in every attention, every layer routed among experts of its clamped
    SwiGLU, the top k renormalised, no shared expert; biases it lacks (q, k, v and o, the experts',
    the router's) written as zeros. -> the model without its own features, for Llama's needs."""
    moe = model.moe
    need(model.attention_sinks, "model.attention_sinks", False, "true (GPT-OSS's attention has sinks)")
    need(
        model.activation == "swiglu_clamped",
        "model.activation",
        model.activation,
        "swiglu_clamped (GPT-OSS's experts' SwiGLU)",
    )
    need(moe is not None, "model.moe", None, "a mixture of experts (GPT-OSS routes every layer)")
    if moe is None:
        return model.model_copy(update={"attention_sinks": False, "activation": "swiglu"})
    need(
        not moe.dense_layers,
        "model.moe.dense_layers",
        moe.dense_layers,
        "leave it unset (GPT-OSS routes every layer)",
    )
    need(bool(moe.normalize), "model.moe.normalize", False, "true (GPT-OSS's softmax over the top k)")
    need(
        moe.shared_d_ff is None, "model.moe.shared_d_ff", moe.shared_d_ff, "leave it unset (GPT-OSS has none)"
    )
    plain = moe.model_copy(update={"router_bias": False})
    return model.model_copy(update={"attention_sinks": False, "activation": "swiglu", "moe": plain})


def olmoe_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """OLMoE (a mixture of experts with q and k normalised over all heads): every layer routed, no
    window, heads of hidden_size in all (its q norm reads hidden_size features)."""
    moe = model.moe
    assert moe is not None and model.head_dim is not None
    need(
        not moe.dense_layers,
        "model.moe.dense_layers",
        moe.dense_layers,
        "leave it unset (OLMoE routes every layer)",
    )
    need(model.window is None, "model.window", model.window, "leave it unset (OLMoE has none)")
    heads_of_hidden_size(need, model, "OLMoE's q norm reads hidden_size features")
    return model.model_copy(update={"qk_norm_over": "head"})


def heads_of_hidden_size(need: Needs, model: DecoderSpec, why: str) -> None:
    """Heads of d_model features in all, where the writer's transformers class assumes them."""
    assert model.head_dim is not None
    need(
        model.n_heads * model.head_dim == model.d_model,
        "model.head_dim",
        model.head_dim,
        f"d_model / n_heads ({model.d_model // model.n_heads}): {why}",
    )


def qwen3_moe_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Qwen3-MoE (a mixture of experts with each head's q and k normalised, no shared expert):
    a window on every layer or none."""
    moe_window(need, model, "Qwen3-MoE")
    return model


def qwen2_moe_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Qwen2-MoE (a mixture of experts with a shared expert): Qwen2's attention (q, k and v biases,
    no output bias, no q/k norms), the shared expert gated by sigmoid(x . w)."""
    moe = model.moe
    assert moe is not None
    need(
        not model.qk_norm,
        "model.qk_norm",
        True,
        "false (Qwen2-MoE, written for a shared expert, has no q/k norms)",
    )
    need(
        not model.bias.attn_out,
        "model.bias.attn_out",
        True,
        "false (Qwen2-MoE, written for a shared expert, has no output projection bias)",
    )
    heads_of_hidden_size(need, model, "transformers 4's Qwen2-MoE reads hidden_size / heads, not head_dim")
    return model.model_copy(update={"qk_norm": False})


def ministral_requires(config: Config) -> None:
    """MinistralConfig derives no head_dim (MinistralAttention fails without one), and needs a
    window (window_required)."""
    config.require(
        config.get("head_dim") is not None,
        "head_dim",
        "is missing or null: MinistralConfig derives none, and MinistralAttention fails without it",
        "set it to hidden_size / num_attention_heads, or the heads' own width",
    )
    window_required(config, "MinistralModel")


MINISTRAL3_ROPE = {  # Ministral3Config's RoPE where config.json names none
    "rope_type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}
QUERY_SCALING = {"beta": "llama_4_scaling_beta", "length": "original_max_position_embeddings"}


def rope_params(config: Config, called: str = "rope_parameters") -> tuple[str, dict[str, Any]]:
    """The RoPE dict transformers reads (a copy), and its field as problems call it (``called``:
    rope_parameters, or one layer type's dict of it): a legacy ``rope_scaling`` over it."""
    legacy = config.get("rope_scaling", {})
    return ("rope_scaling", dict(legacy)) if legacy else (called, dict(config.get("rope_parameters", {})))


def query_scaling(config: Config) -> tuple[dict[str, Any], dict[str, str]]:
    """``positional.query_scaling`` from the RoPE dict's llama_4_scaling_beta and its original
    length (transformers' forward fails where either is missing), and the fields it was read from."""
    name, params = rope_params(config)
    section, sources = {}, {}
    for key, field_name in QUERY_SCALING.items():
        config.require(
            params.get(field_name) is not None,
            f"{name}.{field_name}",
            "is missing or null: Ministral 3 scales each query by it, and transformers fails without it",
            "set it (Ministral 3's llama_4_scaling_beta 0.1, original_max_position_embeddings 16384)",
        )
        section[key] = params.get(field_name)
        sources[f"model.positional.query_scaling.{key}"] = f"{name}.{field_name}"
    return section, sources


def window_required(config: Config, model: str) -> None:
    """``model`` (Ministral's, OLMo 3's) builds the sliding layers' mask from sliding_window for
    every model, failing on a null one, whatever its layer_types say."""
    config.require(
        config.data.get("sliding_window", 0) is not None,
        "sliding_window",
        f"is null: {model} builds a sliding mask from it for every model, and fails without one",
        "set it (to max_position_embeddings or more for no window)",
    )


def helium_requires(config: Config) -> None:
    """HeliumAttention's output projection reads hidden_size features: heads of another total width
    fail transformers' forward."""
    d, heads, head_dim = (config.get(n, 0) for n in ("hidden_size", "num_attention_heads", "head_dim"))
    config.require(
        heads * head_dim == d,
        "head_dim",
        f"x num_attention_heads is {heads * head_dim}, not hidden_size ({d}): HeliumAttention's output "
        "projection reads hidden_size features, and transformers' forward fails",
        "set it to hidden_size / num_attention_heads",
    )


def mixtral_requires(config: Config) -> None:
    """MixtralConfig derives no head_dim, and transformers' dynamic and YaRN RoPE read it without
    a fallback (its default RoPE falls back on hidden_size / heads): they fail without one."""
    legacy = config.data.get("rope_scaling")
    params = legacy if isinstance(legacy, dict) and legacy else config.data.get("rope_parameters")
    kind = params.get("rope_type", params.get("type")) if isinstance(params, dict) else None
    config.require(
        kind not in ("dynamic", "yarn") or config.data.get("head_dim") is not None,
        "head_dim",
        f"is missing or null: MixtralConfig derives none, and transformers' {kind} RoPE fails without it",
        "set it to hidden_size / num_attention_heads, or the heads' own width",
    )


def qwen2_moe_layer_types(config: Config, n_layers: int) -> list[str]:
    """Qwen2MoeConfig's layer types where it has none: with use_sliding_window, every other layer
    (the first, third, ...) below max_window_layers slides."""
    first = config.get("max_window_layers", 28)
    slides = config.get("use_sliding_window", False)
    return [SLIDING if slides and i % 2 == 0 and i < first else FULL for i in range(n_layers)]


def qwen2_moe_requires(config: Config) -> None:
    """Qwen2MoeConfig sets the window to 0 without use_sliding_window, and a sliding layer's mask of
    0 positions fails transformers' forward."""
    types = config.data.get("layer_types")
    config.require(
        not isinstance(types, list) or SLIDING not in types or bool(config.get("use_sliding_window", False)),
        "layer_types",
        f"names {SLIDING} layers while use_sliding_window is false: Qwen2MoeConfig sets their window "
        "to 0, and transformers' forward fails",
        "set use_sliding_window true, or list every layer as full_attention",
    )


# GptOssConfig's RoPE where config.json names none (transformers 4 and 5)
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
# GPT-OSS's clamped SwiGLU as transformers 4 computes it (5 reads them from the config)
GPT_OSS_SWIGLU = {"swiglu_limit": 7.0, "swiglu_alpha": 1.702}


def gpt_oss_requires(config: Config) -> None:
    """What transformers 4 and 5 read alike: 4's attention has biases whatever attention_bias
    says and its SwiGLU clamps at 7 and scales by 1.702 whatever swiglu_limit and swiglu_alpha say
    (5 reads all three); and a sliding_window to build the sliding mask from, which GptOssModel
    does for every model."""
    window_required(config, "GptOssModel")
    config.require(
        config.get("attention_bias", True) is True,
        "attention_bias",
        f"is {config.data.get('attention_bias')!r}: transformers 4 gives GPT-OSS's attention biases "
        "whatever it says, and 5 none",
        "import a model with its biases (attention_bias true)",
    )
    for name, value in GPT_OSS_SWIGLU.items():
        found = config.get(name, value)
        config.require(
            found == value,
            name,
            f"is {found!r}: transformers 4 computes GPT-OSS's SwiGLU with {value} whatever it says",
            f"import a model of {name} {value}",
        )


def olmoe_requires(config: Config) -> None:
    """OlmoeAttention normalises q over hidden_size features (heads of another total width fail
    transformers' forward), and clamps q, k and v after the q and k norms, where the spec's
    qkv_clip clamps them before."""
    d, heads = config.get("hidden_size", 2048), config.get("num_attention_heads", 16)
    head_dim = config.get("head_dim", d // max(heads, 1))
    config.require(
        heads * head_dim == d,
        "head_dim",
        f"x num_attention_heads is {heads * head_dim}, not hidden_size ({d}): OlmoeAttention's q norm "
        "reads hidden_size features, and transformers' forward fails",
        "set it to hidden_size / num_attention_heads, or leave it out",
    )
    clip = config.data.get("clip_qkv")
    config.require(
        clip is None,
        "clip_qkv",
        f"is {clip!r}: OLMoE clamps q and k after their norms, and tfcompile's qkv_clip clamps them "
        "before (OLMo's order)",
        "import a model without it (null)",
    )


def dots1_layer_types(config: Config, n_layers: int) -> list[str]:
    """Dots1Config's layer types where it has none: where a window is set, the layers from
    max_window_layers on slide."""
    first, size = config.get("max_window_layers", 62), config.get("sliding_window")
    return [SLIDING if size is not None and i >= first else FULL for i in range(n_layers)]


def ernie4_5_moe_requires(config: Config) -> None:
    """ERNIE 4.5 MoE's use_bias puts biases on its attention, dense and shared feed-forwards and LM
    head, not on its experts: tfcompile's feed-forwards have biases alike. It reads
    num_key_value_heads, its routed layers' bounds and moe_norm_min without a fallback for null, and
    a moe_norm_min above 1e-12 may floor the renormalisation (refused)."""
    for name in ("num_key_value_heads", "moe_layer_start_index", "moe_layer_end_index", "moe_norm_min"):
        config.require(
            name not in config.data or config.data[name] is not None,
            name,
            "is null: ERNIE 4.5 MoE reads it without a fallback, and fails",
            "set it as ERNIE-4.5-21B-A3B's config does, or leave it out",
        )
    # transformers divides the chosen experts' probabilities by the larger of their sum and this
    # floor, tfcompile by their sum: they agree while the sum stays above it, which the selection
    # bias can send anywhere in (0, 1]; the published models' 1e-12 needs logits 27 nats apart.
    floor = config.get("moe_norm_min", 1e-12)
    config.require(
        floor <= 1e-12,
        "moe_norm_min",
        f"is {floor!r}: transformers divides the chosen experts' probabilities by it where their sum is "
        "below it, and tfcompile renormalises by the sum",
        "leave it out (1e-12, the published models')",
    )
    config.require(
        not config.get("use_bias", False),
        "use_bias",
        "is true: ERNIE 4.5 MoE's experts have no biases where its other feed-forwards have them, and "
        "tfcompile's feed-forwards have biases alike",
        "import a model without it (false, as ERNIE-4.5-21B-A3B's)",
    )


DOTS1_REQUIRED = ("n_routed_experts", "num_experts_per_tok", "n_shared_experts")


def dots1_requires(config: Config) -> None:
    """Dots1Config's experts, top k and shared experts are null where left out, on which
    transformers' model fails."""
    for name in DOTS1_REQUIRED:
        config.require(
            config.data.get(name) is not None,
            name,
            "is missing: Dots1Config leaves it null, and transformers' model fails to build",
            "set it (dots.llm1's: 128 experts, the top 6, 2 shared experts)",
        )


def moe_section(config: Config, kind: MoEType, n_layers: Any) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """``model.moe`` as the model type's config class and decoder layers read it, and the config
    fields each of its fields was read from: none where no layer routes (a Qwen2-MoE or Qwen3-MoE
    of no experts, or whose every layer mlp_only_layers or decoder_sparse_step leaves dense, is a
    dense model). A layer routes where it is not in mlp_only_layers, num_experts is above 0 and
    decoder_sparse_step divides its number counted from 1, as Qwen2MoeDecoderLayer decides."""
    experts = config.get(kind.experts, 8)
    sources = {
        "model.moe.experts": config.name(kind.experts),
        "model.moe.top_k": config.name(kind.top_k),
        "model.moe.balance_loss": "router_aux_loss_coef",
    }
    moe: dict[str, Any] = {
        "experts": experts,
        "top_k": config.get(kind.top_k, 2),
        "normalize": True if kind.normalize is None else bool(config.get(kind.normalize, False)),
    }
    if kind.router_bias:
        moe["router_bias"] = True
    if kind.d_ff != "intermediate_size":  # else the experts are model.d_ff wide
        moe["d_ff"] = config.get(kind.d_ff, 1408)
        sources["model.moe.d_ff"] = kind.d_ff
    shared = config.get(kind.shared, 0) if kind.shared is not None else 0
    if kind.shared is not None and (kind.shared_gate or shared != 0):
        moe["shared_d_ff"] = shared
        moe["shared_gate"] = kind.shared_gate
        sources["model.moe.shared_d_ff"] = kind.shared
    moe["balance_loss"] = config.get("router_aux_loss_coef", 0.001)
    if kind.selection_bias:
        moe["selection_bias"] = True
    if kind.shared_count is not None:
        shared_experts(config, kind.shared_count, moe, sources)
    if kind.deepseek:
        return deepseek_moe(config, kind, moe, sources, n_layers)
    if kind.interval_layers:
        return interval_moe(config, moe, sources, n_layers)
    if not kind.sparse_layers:
        return moe, sources
    step = config.get("decoder_sparse_step", 1)
    config.require(
        isinstance(step, int) and step != 0,
        "decoder_sparse_step",
        f"{step!r} is not a whole number other than 0 (every step-th layer routes)",
        "set it to 1 for every layer, 2 for every other, ...",
    )
    dense = config.get("mlp_only_layers", [])
    config.require(
        isinstance(dense, list) and all(json_type(i) == "a number" for i in dense),
        "mlp_only_layers",
        f"{dense!r} is not a list of layer numbers",
        "list the layers, counted from 0, that keep the dense feed-forward",
    )
    if not (listable(n_layers) and isinstance(step, int) and step != 0 and isinstance(dense, list)):
        return moe, sources  # refused above, or a layer count the spec refuses by its field
    some = json_type(experts) == "a number" and experts > 0
    routed = [i for i in range(n_layers) if some and i not in dense and (i + 1) % step == 0]
    if not routed:
        return None, {}
    if len(routed) < n_layers:
        moe["dense_layers"] = [i for i in range(n_layers) if i not in routed]
        sources["model.moe.dense_layers"] = "mlp_only_layers" if dense else "decoder_sparse_step"
    return moe, sources


def deepseek_moe(
    config: Config, kind: MoEType, moe: dict[str, Any], sources: dict[str, str], n_layers: Any
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """``moe`` with DeepSeek-V3's routing as its config says it (MoEType.deepseek): none where
    the first dense layers (MoEType.first_dense) are every layer."""
    moe["scoring"] = "sigmoid"
    groups, top = config.get("n_group", 1), config.get("topk_group", 1)
    if groups != 1:  # one group: every expert chosen among
        moe["groups"] = {"count": groups, "top": top}
        sources |= {"model.moe.groups.count": "n_group", "model.moe.groups.top": "topk_group"}
    else:
        config.require(
            top == 1,
            "topk_group",
            f"is {top!r}, of the 1 group n_group makes (transformers' router fails)",
            "set it to 1, or n_group to the groups",
        )
    if (scale := config.get("routed_scaling_factor", 1.0)) != 1.0:
        moe["scale"] = scale
        sources["model.moe.scale"] = "routed_scaling_factor"
    if kind.first_dense is None:
        return moe, sources
    dense = config.get(kind.first_dense, 0)
    config.require(
        whole_number(dense) and dense >= 0,
        kind.first_dense,
        f"is {dense!r}, not a count of layers",
        "set it to the first layers that keep a dense feed-forward (0: none)",
    )
    if listable(n_layers) and whole_number(dense) and dense > 0:
        if dense >= n_layers:
            return None, {}
        moe["dense_layers"] = list(range(int(dense)))
        sources["model.moe.dense_layers"] = kind.first_dense
    return moe, sources


def shared_experts(config: Config, name: str, moe: dict[str, Any], sources: dict[str, str]) -> None:
    """``moe``'s shared expert: the config's count (field ``name``) of experts of d_ff in one."""
    shared = config.data.get(name, 1)  # null: transformers' model fails to build
    config.require(
        whole_number(shared) and shared >= 0,
        name,
        f"is {shared!r}: the shared experts' count (transformers' forward fails on another value)",
        "set it to the shared experts, 0 for none",
    )
    if whole_number(shared) and shared > 0 and json_type(moe.get("d_ff")) == "a number":
        moe["shared_d_ff"] = int(shared) * moe["d_ff"]
        sources["model.moe.shared_d_ff"] = name


def interval_moe(
    config: Config, moe: dict[str, Any], sources: dict[str, str], n_layers: Any
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """``moe`` routed in ERNIE 4.5's layers (MoEType.interval_layers): none where no layer routes."""
    names = ("moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval")
    start, end, interval = (
        config.get(name, default) for name, default in zip(names, (1, -1, 1), strict=True)
    )
    for name, value in zip(names, (start, end, interval), strict=True):
        config.require(
            whole_number(value) and (name != names[2] or value > 0),
            name,
            f"is {value!r}, not a layer number" if name != names[2] else f"is {value!r}, not a step above 0",
            "set it as ERNIE-4.5-21B-A3B's config does (1, -1, 1: every layer from the second routes)",
        )
    if not listable(n_layers) or not all(whole_number(v) for v in (start, end, interval)):
        return moe, sources  # refused above, or a layer count the spec refuses by its field
    last = n_layers - 1 if end == -1 else end
    routed = [i for i in range(n_layers) if interval > 0 and (i + 1) % interval == 0 and start <= i <= last]
    if not routed:
        return None, {}
    if len(routed) < n_layers:
        moe["dense_layers"] = [i for i in range(n_layers) if i not in routed]
        sources["model.moe.dense_layers"] = "moe_layer_start_index"
    return moe, sources


# As their config and model classes have them (transformers 4 and 5). Phi-3 computes as Mistral,
# but without a window where its config leaves it out. Qwen2's and Qwen3's window of 4096 slides
# only with use_sliding_window.
QKVO = ("qkv", "attn_out")
WINDOW = {"sliding_window": 4096}


def arcee_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Arcee's feed-forward is plain (it writes every plain activation); it has no q/k norms and no
    window."""
    need(not model.qk_norm, "model.qk_norm", True, "false (Arcee has no q/k norms)")
    need(model.window is None, "model.window", model.window, "leave it unset (Arcee has none)")
    return model


def hunyuan_requires(config: Config) -> None:
    """HunYuanDenseV1Config keeps a missing or null head_dim, on which its attention fails."""
    config.require(
        config.data.get("head_dim") is not None,
        "head_dim",
        "is missing or null: HunYuanDenseV1Config derives none, and its attention fails without one",
        "set it to hidden_size / num_attention_heads, or the heads' own width",
    )


def hunyuan_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """HunYuan: each head's q and k normalised after RoPE (written_as's pick), no window, and no
    dynamic RoPE (transformers 4 reads a dynamic one as HunYuan's NTK alpha, and fails without one)."""
    assert isinstance(model.positional, RopePositional)
    need(model.window is None, "model.window", model.window, "leave it unset (HunYuan has none)")
    scaling = model.positional.scaling
    need(
        not isinstance(scaling, DynamicRopeScaling),
        "model.positional.scaling",
        "dynamic",
        "another scaling, or none (transformers 4's HunYuan reads a dynamic RoPE as its NTK alpha)",
    )
    return model


def ministral3_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """Ministral 3: Mistral's attention (no biases, a window on every layer or none) scaling each
    query by its position; the scaling's length is the RoPE dict's original length, which a
    scaled RoPE shares."""
    assert isinstance(model.positional, RopePositional) and model.positional.query_scaling is not None
    hint = "false (Ministral 3's attention has no biases)"
    need(not model.bias.qkv, "model.bias.qkv", True, hint)
    need(not model.bias.attn_out, "model.bias.attn_out", True, hint)
    moe_window(need, model, "Ministral 3")
    length, scaling = model.positional.query_scaling.length, model.positional.scaling
    dynamic = isinstance(scaling, DynamicRopeScaling)
    need(
        not dynamic,
        "model.positional.scaling",
        "dynamic",
        "another scaling, or none (its original length would be the query scaling's length)",
    )
    original = getattr(scaling, "original_max_position_embeddings", length)
    need(
        dynamic or original == length,
        "model.positional.query_scaling.length",
        length,
        f"{original}, the RoPE scaling's original length (Ministral 3 reads one for both)",
    )
    return model


def hunyuan_moe_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """HunYuan-MoE: HunYuan's attention (hunyuan_own) with every layer routed among experts of
    intermediate_size, the top k renormalised, beside an ungated shared expert of intermediate_size."""
    moe = model.moe
    assert moe is not None and moe.d_ff is not None
    width = f"model.d_ff ({model.d_ff}): HunYuan-MoE's experts and shared expert are intermediate_size wide"
    need(moe.d_ff == model.d_ff, "model.moe.d_ff", moe.d_ff, width)
    need(moe.shared_d_ff == model.d_ff, "model.moe.shared_d_ff", moe.shared_d_ff, width)
    need(
        not moe.shared_gate,
        "model.moe.shared_gate",
        True,
        "false (HunYuan-MoE's shared expert is ungated)",
    )
    need(
        not moe.dense_layers,
        "model.moe.dense_layers",
        moe.dense_layers,
        "leave it unset (HunYuan-MoE routes every layer)",
    )
    need(bool(moe.normalize), "model.moe.normalize", False, "true (HunYuan-MoE renormalises the top k)")
    return hunyuan_own(need, model)


def glm4_moe_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """GLM-4.5's experts: sigmoid scores (DeepSeek-V3's routing, with or without a selection bias,
    groups or a scale), shared experts of the experts' width in one (ungated; none: 0 of them),
    the dense layers first; no output projection bias, no window. Returned: the model on whole
    heads with a softmax's plain routing, for the needs every LLaMA-like writer shares."""
    moe = model.moe
    assert moe is not None and moe.d_ff is not None
    need(not moe.shared_gate, "model.moe.shared_gate", True, "false (GLM-4.5's shared experts are ungated)")
    shared = moe.shared_d_ff
    need(
        shared is None or shared % moe.d_ff == 0,
        "model.moe.shared_d_ff",
        shared,
        f"a multiple of model.moe.d_ff ({moe.d_ff}): GLM-4.5's n_shared_experts experts of that width in one",
    )
    dense = sorted(moe.dense_layers or ())
    need(
        dense == list(range(len(dense))),
        "model.moe.dense_layers",
        moe.dense_layers,
        "the first layers (0, 1, ...): GLM-4.5 keeps the first first_k_dense_replace dense",
    )
    need(not model.bias.attn_out, "model.bias.attn_out", True, "false (GLM-4.5's output projection has none)")
    window = model.window.model_dump() if model.window is not None else None
    need(window is None, "model.window", window, "leave it unset (GLM-4.5 attends to every earlier position)")
    plain = moe.model_copy(
        update={"scoring": "softmax", "selection_bias": False, "groups": None, "scale": 1.0}
    )
    return whole_heads(model).model_copy(update={"moe": plain})


def exaone4_layer_types(config: Config, n_layers: int) -> list[str]:
    """Exaone4Config's layer types where it has none: every ``sliding_window_pattern``-th layer
    full, the others sliding; a null window, or a pattern that is no whole number other than 0,
    refused (Exaone4Config divides by the pattern, 0 for a null window, and fails)."""
    config.require(
        config.get("sliding_window") is not None,
        "sliding_window",
        "is null and layer_types is left out: Exaone4Config then derives the layer types by dividing "
        "by 0, and fails",
        "list layer_types (full_attention for each layer), or set sliding_window",
    )
    pattern = config.data.get("sliding_window_pattern", 4)  # a null one is divided by too
    whole = json_type(pattern) == "a number" and isinstance(pattern, int) and pattern != 0
    config.require(
        whole,
        "sliding_window_pattern",
        f"{pattern!r} is not a whole number other than 0: Exaone4Config derives the layer types by "
        "dividing by it, and fails",
        "set it to the interval between full-attention layers (4: LLLG), or list layer_types",
    )
    every = pattern if whole else 1
    return [SLIDING if (i + 1) % every else FULL for i in range(n_layers)]


def exaone4_requires(config: Config) -> None:
    """A sliding layer of EXAONE 4 attends over ``sliding_window`` positions: none (null, 0 or less)
    fails transformers' forward, as a null head_dim or num_key_value_heads (its attention reads
    them as given)."""
    if SLIDING in config.get("layer_types", []):
        size = config.get("sliding_window", 0)  # null: 0
        config.require(
            size >= 1,
            "sliding_window",
            f"is {config.data.get('sliding_window')!r}: a sliding layer attends over no position "
            "(transformers fails to build its mask)",
            "set it to 1 or more, or list every layer as full_attention in layer_types",
        )
    for name, hint in (
        ("head_dim", "leave it out (hidden_size / num_attention_heads), or set it"),
        ("num_key_value_heads", "set it (num_attention_heads for a K/V head per head)"),
    ):
        config.require(
            config.data.get(name, 0) is not None,
            name,
            "is null: EXAONE 4's attention reads it as given, and fails",
            hint,
        )


def exaone4_own(need: Needs, model: DecoderSpec) -> DecoderSpec:
    """EXAONE 4: OLMo 2's output norms with each head's q and k normalised, no biases; where it has a
    window, its sliding layers turn RoPE and its full layers none. A model whose layers all turn
    RoPE is written without a window or with one on every layer; one of NoPE layers as EXAONE's
    sliding layers over max_seq_len positions (no window) where it has none."""
    assert isinstance(model.positional, RopePositional)
    hint = "false (EXAONE 4's attention has no biases)"
    need(not model.bias.qkv, "model.bias.qkv", True, hint)
    need(not model.bias.attn_out, "model.bias.attn_out", True, hint)
    nope = model.positional.nope_layers or []
    if model.window is not None:
        full = sorted(set(range(model.n_layers)) - model.sliding_layers)
        need(
            sorted(nope) == full,
            "model.positional.nope_layers",
            nope or None,
            f"{full} (EXAONE 4's full-attention layers turn no RoPE where it has a window)"
            if full
            else "leave it unset (EXAONE 4's sliding layers turn RoPE)",
        )
    norm = model.norm.model_copy(update={"position": "pre"})
    positional = model.positional.model_copy(update={"nope_layers": None})
    return model.model_copy(update={"norm": norm, "positional": positional})


def nemotron_requires(config: Config) -> None:
    """NemotronConfig keeps a missing or null num_key_value_heads, on which its attention fails."""
    config.require(
        config.data.get("num_key_value_heads") is not None,
        "num_key_value_heads",
        "is missing or null: NemotronConfig derives none, and Nemotron's attention fails without it",
        "set it (num_attention_heads for a K/V head per head)",
    )


def glm_requires(config: Config) -> None:
    """GlmConfig keeps a null head_dim or num_key_value_heads, on which GLM's attention fails."""
    for name, default in (("head_dim", 128), ("num_key_value_heads", 2)):
        config.require(
            config.data.get(name, 0) is not None,
            name,
            "is null: GLM's attention reads it without a fallback, and fails",
            f"leave it out ({default}), or set it",
        )


# GlmConfig's and Glm4Config's defaults (the same) where LlamaConfig's differ.
GLM: dict[str, Any] = dict(
    attention_bias=("qkv",),
    layout="interleaved",
    partial_rotary=0.5,
    defaults={
        "vocab_size": 151552,
        "hidden_size": 4096,
        "intermediate_size": 13696,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1.5625e-07,
        "attention_bias": True,
    },
    nullable={"num_key_value_heads": 2, "head_dim": 128, "pad_token_id": 151329},
    requires=glm_requires,
)
# GraniteMoeConfig's (and GraniteMoeSharedConfig's) model: LlamaConfig's defaults.
GRANITE_MOE: dict[str, Any] = dict(
    attention_bias=QKVO,
    multipliers=True,
    null_attention_scale=True,
    moe=MoEType(experts="num_local_experts", normalize=None),
    title="GraniteMoE",
    head="GraniteMoeForCausalLM",
    own=granitemoe_own,
)
SLIDING, FULL = "sliding_attention", "full_attention"
OLMO3_THETA = 500000.0  # Olmo3Config's default_theta
QWEN = {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768}
# K/V heads: 32 where the config leaves them out, whatever num_attention_heads is; null: one per head.
QWEN_NULLABLE = {"num_key_value_heads": 32} | WINDOW
DEEPSEEK = MoEType(
    experts="n_routed_experts",
    d_ff="moe_intermediate_size",
    selection_bias=True,
    shared_count="n_shared_experts",
    deepseek=True,
    first_dense="first_k_dense_replace",
)

MODEL_TYPES = {
    "llama": ModelType(attention_bias=QKVO, mlp_bias=True),
    "mistral": ModelType(
        every_layer_slides=True,
        layer_types_elsewhere=True,
        defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072},
        nullable=WINDOW,
        title="Mistral",
        head="MistralForCausalLM",
    ),
    "qwen2": ModelType(
        fixed_bias=("qkv",),
        layer_types=True,
        window_layers=True,
        defaults=QWEN,
        nullable=QWEN_NULLABLE,
        title="Qwen2",
        head="Qwen2ForCausalLM",
        own=qwen2_own,
    ),
    "qwen3": ModelType(
        attention_bias=QKVO,
        layer_types=True,
        qk_norm=True,
        window_layers=True,
        defaults=QWEN | {"head_dim": 128},
        nullable=QWEN_NULLABLE,
        title="Qwen3",
        head="Qwen3ForCausalLM",
    ),
    "gemma": ModelType(attention_bias=QKVO, scale_embeddings=True, defaults={"head_dim": 256}),
    "olmo": ModelType(
        attention_bias=QKVO,
        norm={"type": "layernorm", "eps": 1e-5, "scale": False, "bias": False},  # OlmoLayerNorm's
        clip_qkv=True,
        defaults={"vocab_size": 50304},
        nullable={"pad_token_id": 1},
    ),
    "smollm3": ModelType(
        attention_bias=QKVO,
        mlp_bias=True,
        nope=True,
        layer_types=True,
        defaults={
            "vocab_size": 128256,
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "max_position_embeddings": 32768,
            "rope_theta": 2000000.0,
            "tie_word_embeddings": True,
        },
        # K/V heads: 4 where left out, as many as the heads where null
        nullable={"num_key_value_heads": 4, "pad_token_id": 128004},
        title="SmolLM3",
        head="SmolLM3ForCausalLM",
        own=smollm3_own,
    ),
    "granite": ModelType(
        attention_bias=QKVO,
        mlp_bias=True,
        multipliers=True,
        title="Granite",
        head="GraniteForCausalLM",
        own=granite_own,
    ),
    "olmo2": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        qk_norm_over="all_heads",
        norm={"position": "output"},
        defaults={"vocab_size": 50304, "rms_norm_eps": 1e-5},
        nullable={"pad_token_id": 1},
        title="OLMo 2",
        head="Olmo2ForCausalLM",
        own=olmo2_own,
    ),
    # OLMo 2 sliding the layers layer_types names (three of four where none), a RoPE per layer type;
    # a window must be set.
    "olmo3": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        qk_norm_over="all_heads",
        norm={"position": "output"},
        layer_types=True,
        full_every=4,
        rope_per_layer_type=True,
        defaults={"vocab_size": 50304, "num_hidden_layers": 32, "rms_norm_eps": 1e-5},
        nullable={"pad_token_id": 1} | WINDOW,
        requires=partial(window_required, model="Olmo3Model"),
    ),
    "phi3": ModelType(
        every_layer_slides=True,
        defaults={
            "vocab_size": 32064,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096,
        },
        nullable={"pad_token_id": 32000},
    ),
    "gemma2": ModelType(
        attention_bias=QKVO,
        layer_types=True,
        scale_embeddings=True,
        alternating=True,
        defaults={"head_dim": 256},
        nullable=WINDOW,
        activation="hidden_activation",
    ),
    # Its layer_types are always there as read: gemma.as_gemma3_reads derives them as Gemma3TextConfig does.
    "gemma3_text": ModelType(
        attention_bias=QKVO,
        layer_types=True,
        qk_norm=True,
        scale_embeddings=True,
        defaults={"head_dim": 256},
        nullable=WINDOW,
        activation="hidden_activation",
    ),
    # Qwen2's blocks without biases, sliding as layer_types say; a head_dim and a window must be set.
    "ministral": ModelType(
        layer_types=True,
        slides_by_default=True,
        defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072},
        nullable=WINDOW,
        requires=ministral_requires,
    ),
    # Mistral's blocks (a window on every layer where one is set) scaling each query by its position
    # (query_scaling), under YaRN by default.
    "ministral3": ModelType(
        every_layer_slides=True,
        defaults={
            "vocab_size": 131072,
            "intermediate_size": 14336,
            "num_hidden_layers": 34,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-5,
            "rope_parameters": MINISTRAL3_ROPE,
        },
        nullable={"pad_token_id": 11},
        query_scaling=True,
        title="Ministral 3",
        head="Ministral3ForCausalLM",
        own=ministral3_own,
    ),
    # Interleaved RoPE on half of each head, attention_bias (true where left out) on q, k and v (no
    # o bias); GLM-4 puts a norm on each sublayer's output too (sandwich: post_self_attn_layernorm,
    # post_mlp_layernorm).
    "glm": ModelType(**GLM),
    "glm4": ModelType(**GLM | {"norm": {"position": "sandwich"}}),
    # A plain feed-forward (up_proj, down_proj) of ArceeConfig's squared ReLU.
    "arcee": ModelType(
        attention_bias=QKVO,
        mlp_bias=True,
        gated=False,
        defaults={
            "hidden_size": 2560,
            "intermediate_size": 18432,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "hidden_act": "relu2",
        },
        title="Arcee",
        head="ArceeForCausalLM",
        own=arcee_own,
    ),
    # Arcee's plain feed-forward, half of each head turned, LayerNorms of weight + 1 with a bias
    # (NemotronLayerNorm1P: the 1 folded in on import) of norm_eps.
    "nemotron": ModelType(
        attention_bias=QKVO,
        mlp_bias=True,
        gated=False,
        partial_rotary=0.5,
        norm={"type": "layernorm", "bias": True},
        norm_eps="norm_eps",
        defaults={
            "vocab_size": 256000,
            "hidden_size": 6144,
            "intermediate_size": 24576,
            "num_attention_heads": 48,
            "max_position_embeddings": 4096,
            "norm_eps": 1e-5,
            "hidden_act": "relu2",
            "initializer_range": 0.0134,
        },
        requires=nemotron_requires,
    ),
    # Interleaved RoPE; attention_bias on q, k and v (HeliumAttention's o_proj has none).
    "helium": ModelType(
        attention_bias=("qkv",),
        mlp_bias=True,
        layout="interleaved",
        defaults={
            "vocab_size": 48000,
            "hidden_size": 2560,
            "intermediate_size": 7040,
            "num_hidden_layers": 24,
            "num_attention_heads": 20,
            "num_key_value_heads": 20,
            "head_dim": 128,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-8,
            "rope_theta": 100000.0,  # HeliumConfig's default_theta
        },
        nullable={"pad_token_id": 3},
        requires=helium_requires,
    ),
    # attention_bias on q, k and v (on by default), attention_out_bias on o. Its residual_dropout
    # (training only) is not read.
    "seed_oss": ModelType(
        attention_bias=("qkv",),
        out_bias_field="attention_out_bias",
        mlp_bias=True,
        defaults={
            "vocab_size": 155136,
            "hidden_size": 4096,
            "intermediate_size": 27648,
            "num_hidden_layers": 64,
            "num_attention_heads": 80,
            "max_position_embeddings": 524288,
            "attention_bias": True,
            "attention_dropout": 0.1,
        },
        # K/V heads: 8 where left out, as many as the heads where null; head_dim: d_model / heads where null
        nullable={"num_key_value_heads": 8, "head_dim": 128, "pad_token_id": 1},
    ),
    # Interleaved RoPE; use_bias on q, k, v, o and the feed-forward.
    "ernie4_5": ModelType(
        attention_bias=QKVO,
        mlp_bias=True,
        bias_field="use_bias",
        mlp_bias_field="use_bias",
        layout="interleaved",
        attention_dropout=False,
        defaults={
            "vocab_size": 103424,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 18,
            "num_attention_heads": 16,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,  # Ernie4_5Config's default_theta
            "tie_word_embeddings": True,
        },
        nullable={"num_key_value_heads": 2, "head_dim": 128, "pad_token_id": 0},
    ),
    # Mistral's attention (no biases; every layer slides, where sliding_window is set) with a
    # mixture of intermediate_size experts in every layer, the top k renormalised (MixtralTopKRouter).
    "mixtral": ModelType(
        every_layer_slides=True,
        defaults={
            "intermediate_size": 14336,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,  # MixtralConfig's default_theta
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
        },
        nullable={"num_key_value_heads": 8},  # null: as many as the heads
        aliases={"num_experts": "num_local_experts"},
        requires=mixtral_requires,
        moe=MoEType(experts="num_local_experts", normalize=None),
        title="Mixtral",
        head="MixtralForCausalLM",
        own=mixtral_own,
    ),
    # Qwen2's attention (q, k and v biases, with qkv_bias), sliding as layer_types say (or every other
    # layer below max_window_layers, with use_sliding_window); experts of moe_intermediate_size and a
    # sigmoid-gated shared expert in the layers decoder_sparse_step and mlp_only_layers leave routed.
    "qwen2_moe": ModelType(
        attention_bias=("qkv",),
        bias_field="qkv_bias",
        layer_types=True,
        derive_layer_types=qwen2_moe_layer_types,
        window_flag=True,
        defaults={
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "max_position_embeddings": 32768,
            "qkv_bias": True,
            "max_window_layers": 28,
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632,
        },
        nullable={"num_key_value_heads": 16} | WINDOW,
        requires=qwen2_moe_requires,
        moe=MoEType(
            experts="num_experts",
            d_ff="moe_intermediate_size",
            shared="shared_expert_intermediate_size",
            shared_gate=True,
            sparse_layers=True,
        ),
        title="Qwen2-MoE",
        head="Qwen2MoeForCausalLM",
        own=qwen2_moe_own,
    ),
    # Qwen3's attention (each head's q and k normalised, attention_bias on q, k, v and o; heads of
    # hidden_size / heads where no head_dim), every layer sliding with use_sliding_window; experts of
    # moe_intermediate_size in the layers decoder_sparse_step and mlp_only_layers leave routed.
    "qwen3_moe": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        every_layer_slides=True,
        window_flag=True,
        defaults={
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 24,
            "max_position_embeddings": 32768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
        },
        nullable={"num_key_value_heads": 4} | WINDOW,
        aliases={"num_local_experts": "num_experts"},
        moe=MoEType(experts="num_experts", d_ff="moe_intermediate_size", sparse_layers=True),
        title="Qwen3-MoE",
        head="Qwen3MoeForCausalLM",
        own=qwen3_moe_own,
    ),
    # Granite's multipliers and attention scale with a mixture of intermediate_size experts in every
    # layer, the top k's softmax (GraniteMoeTopKRouter: renormalised); GraniteMoeShared adds an
    # ungated shared expert of shared_intermediate_size (none where 0).
    "granitemoe": ModelType(**GRANITE_MOE),
    "granitemoeshared": ModelType(
        **GRANITE_MOE
        | {
            "moe": MoEType(
                experts="num_local_experts",
                normalize=None,
                shared="shared_intermediate_size",
                shared_gate=False,
            ),
            "title": "GraniteMoeShared",
            "head": "GraniteMoeSharedForCausalLM",
        }
    ),
    # Llama's blocks with each head's q and k normalised after RoPE (query_layernorm, key_layernorm),
    # attention_bias on q, k, v and o; a head_dim must be set; a dynamic RoPE with an alpha is
    # HunYuan's NTK alpha (a larger theta: HunYuan.rope).
    "hunyuan_v1_dense": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        qk_norm_after_rope=True,
        defaults={"vocab_size": 290943, "rms_norm_eps": 1e-5},
        nullable={"pad_token_id": 0},
        requires=hunyuan_requires,
        title="HunYuan",
        head="HunYuanDenseV1ForCausalLM",
        own=hunyuan_own,
    ),
    # OLMo 2's norms on each sublayer's output with each head's q and k normalised, no biases, sliding
    # the layers layer_types names (where none, all but every sliding_window_pattern-th); where a
    # window is set, the full-attention layers turn no RoPE.
    "exaone4": ModelType(
        qk_norm=True,
        norm={"position": "output"},
        layer_types=True,
        derive_layer_types=exaone4_layer_types,
        nope_full=True,
        defaults={
            "vocab_size": 102400,
            "intermediate_size": 16384,
            "rms_norm_eps": 1e-5,
        },
        nullable={"num_key_value_heads": 32} | WINDOW,
        requires=exaone4_requires,
        title="EXAONE 4",
        head="Exaone4ForCausalLM",
        own=exaone4_own,
    ),
    # OLMo 2's q and k norms over all heads in pre-norm blocks, attention_bias on q, k, v and o, a
    # mixture of intermediate_size experts in every layer.
    "olmoe": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        qk_norm_over="all_heads",
        defaults={
            "vocab_size": 50304,
            "hidden_size": 2048,
            "intermediate_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "router_aux_loss_coef": 0.01,
        },
        nullable={"pad_token_id": 1},
        aliases={"num_local_experts": "num_experts"},
        requires=olmoe_requires,
        moe=MoEType(experts="num_experts"),
        title="OLMoE",
        head="OlmoeForCausalLM",
        own=olmoe_own,
    ),
    # HunYuan's attention with every layer routed among experts of intermediate_size (the top moe_topk
    # renormalised; moe_topk may be a list, one per layer) and an ungated shared expert of
    # intermediate_size.
    "hunyuan_v1_moe": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        qk_norm_after_rope=True,
        defaults={"vocab_size": 290943, "rms_norm_eps": 1e-5, "num_experts": 1, "moe_topk": 1},
        nullable={"pad_token_id": 0},
        aliases={"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"},
        per_layer=("moe_topk",),
        requires=hunyuan_requires,
        moe=MoEType(experts="num_experts", top_k="moe_topk", normalize=None, shared="intermediate_size"),
        title="HunYuan-MoE",
        head="HunYuanMoEV1ForCausalLM",
        own=hunyuan_moe_own,
    ),
    # OLMo 2's blocks (norms on each sublayer's output, q and k normalised over all heads) with
    # OLMoE's routing in every layer (the top k renormalised with norm_topk_prob).
    "flex_olmo": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        qk_norm_over="all_heads",
        norm={"position": "output"},
        defaults={
            "vocab_size": 100352,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "max_position_embeddings": 4096,
            "rope_theta": 500000.0,  # FlexOlmoConfig's default_theta
            "num_experts": 7,
            "num_experts_per_tok": 5,
            "router_aux_loss_coef": 0.01,
        },
        nullable={"pad_token_id": 100277},
        aliases={"num_local_experts": "num_experts"},
        moe=MoEType(experts="num_experts"),
        title="FlexOlmo",
        head="FlexOlmoForCausalLM",
        own=flex_olmo_own,
    ),
    # Solar Open: GLM-4.5's attention without q/k norms, RoPE on whole heads of head_dim (its forward
    # fails on a partial_rotary_factor), and GLM-4.5's routing in every layer.
    "solar_open": ModelType(
        attention_bias=("qkv",),
        defaults={
            "vocab_size": 196608,
            "hidden_size": 4096,
            "num_hidden_layers": 48,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,  # SolarOpenConfig's default_theta
            "moe_intermediate_size": 1280,
            "num_experts_per_tok": 8,
            "n_routed_experts": 128,
            "norm_topk_prob": True,
        },
        aliases={"num_local_experts": "n_routed_experts"},
        moe=replace(DEEPSEEK, first_dense=None),
        title="Solar Open",
        head="SolarOpenForCausalLM",
    ),
    # ERNIE 4.5's attention (interleaved pairs, use_bias refused: its experts have no biases, its
    # other feed-forwards and LM head do) with the top moe_k of a softmax over moe_num_experts experts
    # of moe_intermediate_size, chosen with the router's selection bias and renormalised, beside
    # moe_num_shared_experts shared ones, in the layers moe_layer_start_index, _end_index and
    # _interval route.
    "ernie4_5_moe": ModelType(
        layout="interleaved",
        attention_dropout=False,
        defaults={
            "vocab_size": 103424,
            "hidden_size": 2560,
            "intermediate_size": 12288,
            "num_hidden_layers": 28,
            "num_attention_heads": 20,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,  # Ernie4_5_MoeConfig's default_theta
            "tie_word_embeddings": True,
            "moe_intermediate_size": 1536,
            "moe_k": 6,
            "moe_num_experts": 64,
            "moe_num_shared_experts": 2,
        },
        nullable={"num_key_value_heads": 4, "pad_token_id": 0},
        aliases={"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
        requires=ernie4_5_moe_requires,
        moe=MoEType(
            experts="moe_num_experts",
            top_k="moe_k",
            d_ff="moe_intermediate_size",
            normalize=None,
            selection_bias=True,
            shared_count="moe_num_shared_experts",
            interval_layers=True,
        ),
        title="ERNIE 4.5 MoE",
        head="Ernie4_5_MoeForCausalLM",
    ),
    # GLM-4.5 (GLM-4.6, 4.7): Llama's blocks with attention_bias on q, k and v, RoPE on half of each
    # head (partial_rotary_factor), each head's q and k normalised with use_qk_norm; DeepSeek-V3's
    # routing among n_routed_experts of moe_intermediate_size beside n_shared_experts shared ones,
    # the first first_k_dense_replace layers dense; the multi-token prediction layers left out.
    "glm4_moe": ModelType(
        attention_bias=("qkv",),
        qk_norm_field="use_qk_norm",
        partial_rotary=0.5,
        defaults={
            "vocab_size": 151552,
            "hidden_size": 4096,
            "intermediate_size": 10944,
            "num_hidden_layers": 46,
            "num_attention_heads": 96,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "moe_intermediate_size": 1408,
            "num_experts_per_tok": 8,
            "n_routed_experts": 128,
            "first_k_dense_replace": 1,
            "norm_topk_prob": True,
        },
        aliases={"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
        moe=DEEPSEEK,
        title="GLM-4.5",
        head="Glm4MoeForCausalLM",
        own=glm4_moe_own,
    ),
    # dots.llm1: Qwen3's attention (each head's q and k normalised before RoPE, attention_bias on q,
    # k, v and o) sliding the layers layer_types names (where none and a window is set, those from
    # max_window_layers on); GLM-4.5's routing (DeepSeek-V3's), the top k not renormalised by default.
    "dots1": ModelType(
        attention_bias=QKVO,
        qk_norm=True,
        layer_types=True,
        derive_layer_types=dots1_layer_types,
        defaults={
            "vocab_size": 152064,
            "hidden_size": 4608,
            "intermediate_size": 10944,
            "num_hidden_layers": 62,
            "max_position_embeddings": 2048,
            "moe_intermediate_size": 1408,
            "max_window_layers": 62,
        },
        nullable=WINDOW,
        aliases={"num_local_experts": "n_routed_experts"},
        requires=dots1_requires,
        moe=DEEPSEEK,
        title="dots.llm1",
        head="Dots1ForCausalLM",
    ),
    # GPT-OSS: q, k, v and o biases, a learned sink per head in every attention, every other layer
    # sliding (the first among them) where no layer_types, YaRN by default, and in every layer a
    # mixture of intermediate_size experts with biases, their clamped SwiGLU (hidden_act unread),
    # routed by the softmax of the top num_experts_per_tok of the router's biased logits.
    "gpt_oss": ModelType(
        attention_bias=QKVO,
        fixed_bias=("qkv", "attn_out", "ffn"),  # transformers 4's whatever attention_bias says
        layer_types=True,
        alternating=True,
        fixed_activation="swiglu_clamped",
        sinks=True,
        defaults={
            "vocab_size": 201088,
            "hidden_size": 2880,
            "intermediate_size": 2880,
            "num_hidden_layers": 36,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "attention_bias": True,
            "num_local_experts": 128,
            "num_experts_per_tok": 4,
            "router_aux_loss_coef": 0.001,
            "rope_parameters": {"rope_theta": 150000.0} | GPT_OSS_YARN,
        },
        nullable={"sliding_window": 128},
        aliases={"num_experts": "num_local_experts"},
        requires=gpt_oss_requires,
        moe=MoEType(experts="num_local_experts", normalize=None, router_bias=True),
        title="GPT-OSS",
        head="GptOssForCausalLM",
        own=gpt_oss_own,
    ),
}
# The fields of each scaling that tfcompile keeps (the rest are transformers' bookkeeping).
SCALING_FIELDS = {
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "attention_factor",
        "truncate",
    ),
    "longrope": (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
    ),
}


# The JSON type of each scaling field that is not a number (the spec would parse "2" as 2, where
# transformers fails on it).
SCALING_TYPES = {
    "type": "a string",
    "truncate": "true or false",
    "short_factor": "a list",
    "long_factor": "a list",
}


# The top-level config fields a RoPE dict's rope_theta and partial_rotary_factor fall back on:
# LLaMA's (and Phi's); GPT-NeoX's are its own.
FALLBACKS = ("rope_theta", "partial_rotary_factor")


def rope_section(
    config: Config,
    head_dim: int,
    partial: float | None = None,
    fallbacks: tuple[str, str] = FALLBACKS,
    called: str = "rope_parameters",
) -> dict[str, Any]:
    """``positional:`` from a config of either transformers version. As transformers reads it, a
    legacy ``rope_scaling`` wins over ``rope_parameters``, and a theta (and rotated fraction)
    inside the dict over the top-level ``fallbacks``. ``partial``: the fraction of each head that
    rotates where the config names none (Phi's 0.5, GPT-NeoX's 0.25), read as rotary_dims,
    int(head_dim x fraction) as transformers computes it; None: whole heads, and a config naming
    another fraction is refused (LLaMA's, whose RoPE is not applied to part of a head).
    ``called``: what problems call rope_parameters (one layer type's dict of it, say)."""
    name, params = rope_params(config, called)
    objects = [k for k, v in params.items() if isinstance(v, dict)]
    if objects:
        if name == called == "rope_parameters" and set(objects) <= {SLIDING, FULL}:
            config.refuse(name, "holds a RoPE per layer type", "import a model with one RoPE for all layers")
        else:
            key = objects[0]
            config.refuse(f"{name}.{key}", "is an object where a number or a name belongs", "fix the file")
        return {"type": "rope"}
    theta_field, partial_field = fallbacks
    theta = params.get("rope_theta", config.get(theta_field, 10000.0))
    kind = str(params.get("rope_type", params.get("type", "default")))
    fraction = params.get("partial_rotary_factor", config.get(partial_field, partial or 1.0))
    number = json_type(theta) == "a number"  # else left for the spec to refuse by its name
    section: dict[str, Any] = {"type": "rope", "theta": float(theta) if number else theta, "layout": "halves"}
    if partial is None:
        config.require(
            fraction == 1.0,
            "partial_rotary_factor",
            f"is {fraction}: this model type turns whole heads (transformers ignores the fraction for "
            f"default RoPE and fails with a scaled one)",
            "remove it, or set it to 1",
        )
    elif json_type(fraction) == "a number" and 0 < fraction <= 1:
        section["rotary_dims"] = int(head_dim * fraction)  # an odd or too small one: refused by the spec
    else:
        config.refuse(
            f"{name}.partial_rotary_factor" if "partial_rotary_factor" in params else partial_field,
            f"{fraction!r} is not a fraction of a head",
            "a number above 0, at most 1",
        )
    if kind == "default":
        return section
    if kind not in SCALING_FIELDS:
        config.refuse(
            f"{name}.rope_type",
            f"{kind!r} is not a RoPE scaling tfcompile has",
            f"one of {['default', *SCALING_FIELDS]} imports",
        )
        return section
    max_positions = config.get("max_position_embeddings", 2048)
    if kind == "dynamic":  # transformers scales from max_position_embeddings, whatever else is said
        params["original_max_position_embeddings"] = max_positions
    top = config.get("original_max_position_embeddings")
    if kind in ("llama3", "yarn", "longrope") and top is not None:  # Phi-3's place for it, read first
        params["original_max_position_embeddings"] = top
    params.setdefault("original_max_position_embeddings", max_positions)
    if kind == "yarn" and params.get("factor") is None:
        params["factor"] = max_positions / params["original_max_position_embeddings"]
    if kind == "longrope":
        longrope_factor(config, params, name, max_positions, top is not None)
    for key in (
        "mscale",
        "mscale_all_dim",
        "beta_fast",
        "beta_slow",
    ):  # 0 means unset, as transformers reads it
        if not params.get(key):
            params.pop(key, None)
    scaling = {"type": kind} | {k: params[k] for k in SCALING_FIELDS[kind] if params.get(k) is not None}
    for key, value in scaling.items():
        config.require(
            json_type(value) == SCALING_TYPES.get(key, "a number")
            and (json_type(value) != "a list" or all(json_type(v) == "a number" for v in value)),
            f"{name}.{key}",
            f"{value!r} is not {SCALING_TYPES.get(key, 'a number')}"
            + (" of numbers" if SCALING_TYPES.get(key) == "a list" else "")
            + ": transformers fails on it, or computes with it as it is",
            "fix the file",
        )
    return section | {"scaling": scaling}


def longrope_factor(
    config: Config, params: dict[str, Any], name: str, max_positions: Any, top_level: bool
) -> None:
    """LongRoPE's ``factor`` in ``params``, which sets its attention factor where the dict gives
    none, as transformers 5 reads it: the dict's, else max_position_embeddings over the original
    length; at least 1 (the attention factor is 1 at or below it). Refused: a dict without its
    factors (transformers fails). Warned: what transformers 4 reads otherwise (the original length
    from a top-level ``original_max_position_embeddings`` alone, and then the factor as the ratio)."""
    for key in ("short_factor", "long_factor"):
        config.require(
            params.get(key) is not None,
            f"{name}.{key}",
            "is missing or null: transformers' LongRoPE fails without it",
            "give one factor for each pair of rotated dimensions",
        )
    original, factor = params["original_max_position_embeddings"], params.get("factor")
    if not all(json_type(v) == "a number" and v > 0 for v in (original, max_positions)):
        return  # refused by the spec, by its name
    ratio = max_positions / original
    if factor is None:
        factor = ratio
    differs = not top_level and original != max_positions
    differs |= top_level and factor != ratio and params.get("attention_factor") is None
    if differs:
        warnings.warn(
            HFWarning(
                f"{name}: transformers 4 reads LongRoPE's original length from a top-level "
                f"original_max_position_embeddings alone (else max_position_embeddings), and then its "
                f"factor as max_position_embeddings over it, where transformers 5, as the import, reads "
                f"an original length of {original} and a factor of {factor}"
            ),
            stacklevel=3,
        )
    if json_type(factor) == "a number":
        params["factor"] = max(factor, 1.0)


def layer_type_dicts(config: Config, given: bool) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A RoPE per layer type as transformers 5 reads it (Gemma 3's, OLMo 3's): ``rope_parameters``
    keyed by layer type (each a dict, null or left out) and a legacy ``rope_scaling``, which updates
    the full layers' dict and so needs one where the config's rope_parameters is ``given``; None,
    with a problem, where it is another shape (transformers 5 reads no other, or fails)."""
    params = config.get("rope_parameters", {})
    if set(params) - {SLIDING, FULL} or not all(
        params.get(t) is None or isinstance(params[t], dict) for t in (SLIDING, FULL)
    ):
        config.refuse(
            "rope_parameters",
            f"is not a RoPE for each layer type ({SLIDING!r} and {FULL!r}, each one or neither): "
            "transformers 5 reads no other",
            "give them as transformers 5 saves them",
        )
        return None
    legacy = config.get("rope_scaling", {})
    if legacy and "rope_type" not in legacy and "type" in legacy:
        config.refuse(
            "rope_scaling.type",
            "is not read by transformers 5 here (it updates the full layers' RoPE, whose rope_type stays "
            "'default')",
            "name it rope_type",
        )
        return None
    if legacy and given and params.get(FULL) is None:
        config.refuse(
            "rope_scaling",
            f"updates rope_parameters.{FULL}, which is not there: transformers 5 fails on it",
            f"move it into rope_parameters.{FULL}",
        )
        return None
    return params, legacy


def layer_type_rope(config: Config, head_dim: int) -> dict[str, Any]:
    """``positional:`` of a RoPE per layer type, as Olmo3Config reads it: each type's dict in
    ``rope_parameters`` (transformers 5; one left out or null: unscaled), its theta where the dict
    names none the full layers' ``rope_theta`` and the sliding layers' 500,000; a legacy
    ``rope_scaling`` updates the full layers' dict. The full layers' RoPE is the model's, the
    sliding layers' ``local`` where it differs (the model's where every layer slides). Refused:
    what transformers 5 fails on or ignores, and a ``rope_theta`` other than 500,000 where the
    sliding layers' dict names none (transformers 4 turned them at rope_theta, 5 at 500,000)."""
    types = config.data.get("layer_types")
    if types is None:  # not derived: a layer count the spec refuses by its field
        return {"type": "rope"}
    n_layers = config.get("num_hidden_layers", 32)
    if not isinstance(types, list) or len(types) != n_layers or not all(t in (SLIDING, FULL) for t in types):
        config.refuse(
            "layer_types", f"is not {SLIDING!r} or {FULL!r} for each of the {n_layers} layers", "fix it"
        )
        return {"type": "rope"}
    dicts = layer_type_dicts(config, given=config.data.get("rope_parameters") is not None)
    if dicts is None:
        return {"type": "rope"}
    params, legacy = dicts
    top = config.data.get("rope_theta")
    config.require(
        top is None
        or json_type(top) != "a number"  # refused by the spec, by its name
        or top == OLMO3_THETA
        or "rope_theta" in (params.get(SLIDING) or {})
        or SLIDING not in types,
        "rope_theta",
        f"is {top!r}: transformers 5 turns the full layers at it and the sliding ones at {OLMO3_THETA:,} "
        "(Olmo3Config's default), transformers 4 every layer at it",
        f"name each layer type's rope_theta in rope_parameters ({SLIDING!r} and {FULL!r})",
    )
    section = {}
    for kind, theta in ((FULL, config.get("rope_theta", OLMO3_THETA)), (SLIDING, OLMO3_THETA)):
        own = params.get(kind) or {}
        if kind == FULL and legacy:
            own = {"rope_type": "default"} | own | legacy
        one = config.over(
            {"rope_parameters": own, "rope_theta": theta}
            | {
                k: config.data[k]
                for k in ("max_position_embeddings", "partial_rotary_factor")
                if k in config.data
            }
        )
        called = "rope_scaling" if kind == FULL and legacy else f"rope_parameters.{kind}"
        section[kind] = rope_section(one, head_dim, called=called)
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    if not sliding or section[SLIDING] == section[FULL]:
        return section[FULL]
    if len(sliding) == n_layers:
        return section[SLIDING]
    local = {"theta": section[SLIDING]["theta"], "layers": sliding}
    if "scaling" in section[SLIDING]:
        local["scaling"] = section[SLIDING]["scaling"]
    return section[FULL] | {"local": local}


def context(config: Config) -> int:
    """The context: ``max_position_embeddings``."""
    length = config.get("max_position_embeddings", 2048)
    if not math.isfinite(length):
        config.refuse("max_position_embeddings", f"{length!r} is not a finite number", "fix the file")
        return 2048
    return int(length)


def window(config: Config, kind: ModelType) -> dict[str, Any] | None:
    """The spec's ``window``: ``sliding_window`` over the layers that slide, or None where none
    does or the window holds the whole context. Which layers slide: every Mistral (and Phi-3)
    layer (``MistralForCausalLM`` reads no ``layer_types``, and one whose layer_types slide fewer
    is refused: AutoModel loads it as Ministral, which reads them); else ``layer_types``, or
    where a config has none, the Qwen2 and Qwen3 layers from ``max_window_layers`` on and every
    other Gemma 2 layer (the first, third, ...), as transformers derives them."""
    # A null window is none; a missing one is the config class's (ModelType.nullable).
    size = config.get("sliding_window", 0)
    if not math.isfinite(size):
        config.refuse("sliding_window", f"{size!r} is not a finite number", "fix the file")
        return None
    n_layers = config.get("num_hidden_layers", 32)
    if not listable(n_layers):
        return None
    layer_types = config.get("layer_types", [])
    layers: list[int] | None
    if kind.every_layer_slides:
        layers = None
    elif layer_types and kind.layer_types:
        layers = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
    elif kind.slides_by_default:
        layers = None
    elif kind.alternating:
        layers = list(range(0, n_layers, 2)) if isinstance(n_layers, int) else None
    elif kind.nope and config.get("use_sliding_window", False):
        layers = nope_layers(config)
    elif kind.window_layers and config.get("use_sliding_window", False):
        first = config.get("max_window_layers", 28)
        layers = (
            list(range(max(first, 0), n_layers))
            if isinstance(first, int) and isinstance(n_layers, int)
            else []
        )
    else:
        layers = []
    length = context(config)
    if kind.layer_types_elsewhere and layer_types and size and size < length:
        config.require(
            all(t == "sliding_attention" for t in layer_types),
            "layer_types",
            f"{layer_types!r}: AutoModel reads a config with layer_types as a model that follows them "
            f"(MinistralForCausalLM), {config.data.get('architectures')} slides every layer, and the "
            "two differ past the window",
            "leave layer_types out, or list every layer as sliding_attention",
        )
    raw = config.data.get("sliding_window")
    config.require(
        layers == [] or not isinstance(raw, int | float) or isinstance(raw, bool) or raw > 0,
        "sliding_window",
        f"is {raw!r}: a window of no tokens attends to nothing (transformers' forward fails on it)",
        "set it to the window's size, or null for none",
    )
    if not size or layers == [] or size >= length:
        return None
    every = layers is None or (isinstance(n_layers, int) and layers == list(range(n_layers)))
    return {"size": int(size)} if every else {"size": int(size), "layers": layers}


def multipliers(config: Config) -> dict[str, Any]:
    """Granite's multipliers as the spec's fields (one not above 0 refused by the spec, by the
    field it was read from); ``logits_scaling`` divides the logits: the spec multiplies them by
    its inverse."""
    scaling = config.get("logits_scaling", 1.0)
    config.require(
        scaling > 0 and math.isfinite(scaling),
        "logits_scaling",
        f"is {scaling!r}: the logits are divided by it, so it must be a positive number",
        "set it above 0 (1: the logits as the head computes them)",
    )
    return {
        "embedding_multiplier": config.get("embedding_multiplier", 1.0),
        "residual_multiplier": config.get("residual_multiplier", 1.0),
        "logit_multiplier": 1 / scaling if scaling > 0 and math.isfinite(scaling) else 1.0,
        "attention_scale": config.get("attention_multiplier", 1.0),
    }


def listable(n_layers: Any) -> bool:
    """A layer count the spec takes, whose layers may be listed: another (refused by the spec, by
    its field) may be too many to list."""
    return isinstance(n_layers, int) and not isinstance(n_layers, bool) and 1 <= n_layers <= MAX_LAYERS


def nope_layers(config: Config) -> list[int]:
    """The layers that turn no RoPE: the 0s of ``no_rope_layers`` (a 0 or 1 for each layer, those
    past the last layer unread, as transformers reads them), or where it is left out every
    ``no_rope_layer_interval``-th layer (4th), as SmolLM3Config derives them; none for a layer
    count that is not ``listable``."""
    n_layers = config.get("num_hidden_layers", 36)
    if not listable(n_layers):
        return []
    given = config.data.get("no_rope_layers")
    if given is None:
        interval = config.get("no_rope_layer_interval", 4)
        config.require(
            isinstance(interval, int) and interval >= 1,
            "no_rope_layer_interval",
            f"{interval!r} is not a positive whole number",
            "set it to the interval between layers that turn no RoPE, e.g. 4",
        )
        return [i for i in range(n_layers) if (i + 1) % max(int(interval), 1) == 0]
    read = given[:n_layers] if isinstance(given, list) else []
    config.require(
        len(read) == n_layers and all(json_type(v) == "a number" and v in (0, 1) for v in read),
        "no_rope_layers",
        f"{given!r} is not a 0 or 1 for each of the {n_layers} layers",
        "list 1 for a layer that turns RoPE, 0 for one that does not",
    )
    return [i for i, v in enumerate(read) if v == 0]


def valid_layer_types(config: Config) -> None:
    """``layer_types``, where config.json has them, name full_attention or sliding_attention for each
    layer: transformers 5 refuses a list of another length or of a kind it does not know, and a
    LLaMA-like model builds no mask for its other kinds (chunked attention, ...), so fails. (A model
    type without a window fails on a sliding layer beside no sliding_window: unread_window.)"""
    types, n_layers = config.data.get("layer_types"), config.get("num_hidden_layers", 32)
    if types is None or not listable(n_layers):
        return
    config.require(
        isinstance(types, list) and len(types) == n_layers and all(t in (SLIDING, FULL) for t in types),
        "layer_types",
        f"{types!r} is not {FULL} or {SLIDING} for each of the {n_layers} layers",
        "list full_attention or sliding_attention for each layer, or leave layer_types out",
    )


def window_sources(config: Config, kind: ModelType) -> dict[str, str]:
    """The config fields the spec's window was read from."""
    if kind.every_layer_slides:
        layers = "sliding_window"
    elif config.data.get("layer_types"):
        layers = "layer_types"
    elif kind.slides_by_default:
        layers = "sliding_window"
    else:
        layers = (
            "sliding_window_pattern"
            if kind.nope_full
            else "max_window_layers"
            if kind.window_layers
            else "no_rope_layers"
            if kind.nope
            else "num_hidden_layers"
        )
    return {"model.window.size": "sliding_window", "model.window.layers": layers}


def scaling_sources(config: Config) -> dict[str, str]:
    """The config field the spec's RoPE scaling was read from: the RoPE dict transformers reads."""
    return {
        "model.positional.scaling": "rope_scaling" if config.data.get("rope_scaling") else "rope_parameters"
    }


def rotary_source(config: Config) -> str:
    """The field a rotated fraction was read from: the RoPE dict's partial_rotary_factor where it
    has one (transformers reads that first), else the top level's."""
    name = scaling_sources(config)["model.positional.scaling"]
    inner = config.data.get(name)
    inside = isinstance(inner, dict) and "partial_rotary_factor" in inner
    return f"{name}.partial_rotary_factor" if inside else "partial_rotary_factor"


def rope_dict(positional: RopePositional) -> dict[str, Any]:
    """The spec's RoPE kind as transformers' rope_scaling (4) and rope_parameters (5) name it,
    without theta: ``{"rope_type": "default"}``, or the scaling's type and fields (a dynamic
    scaling's original length left out: transformers scales past max_position_embeddings); with
    a query scaling, its beta and length as Ministral 3 names them (ministral3_own holds a scaling's
    original length to it)."""
    scaled = positional.query_scaling
    queries = (
        {"llama_4_scaling_beta": scaled.beta, "original_max_position_embeddings": scaled.length}
        if scaled is not None
        else {}
    )
    if positional.scaling is None:
        return {"rope_type": "default"} | queries
    scaling = positional.scaling.model_dump(exclude_none=True)
    if scaling["type"] == "dynamic":
        del scaling["original_max_position_embeddings"]
    return {"rope_type": scaling.pop("type"), **scaling} | queries


def rope_top_level(positional: RopePositional) -> dict[str, Any]:
    """The top-level config fields a RoPE kind needs besides its dict: LongRoPE's original length,
    which transformers 4 reads there alone (and 5 there first)."""
    scaling = positional.scaling
    if scaling is None or scaling.type != "longrope":
        return {}
    return {"original_max_position_embeddings": scaling.original_max_position_embeddings}


@register(
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "olmo",
    "olmo2",
    "olmo3",
    "smollm3",
    "granite",
    "ministral",
    "ministral3",
    "helium",
    "seed_oss",
    "ernie4_5",
    "arcee",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "flex_olmo",
    "exaone4",
)
class Llama(Writable):
    reads_window = True  # each model type's window, or unread_window where its attention reads none
    layout: ClassVar[str] = "halves"  # which dimensions the written model's RoPE turns together
    windows: ClassVar[Windows] = "any"  # as Mistral, Qwen2 or Qwen3 (written_as says which)
    prefixes = ("model.",)
    ignored = ("rotary_emb.inv_freq",)  # a buffer in old checkpoints
    # Where a routed layer's router and experts lie (the first prefix holding a router), and each
    # expert's gate, up and down projections as save_pretrained and the Hub name them one expert at
    # a time (Qwen2-MoE's, Qwen3-MoE's, OLMoE's; transformers 5 stacks them in memory).
    moe_prefixes: ClassVar[tuple[str, ...]] = ("mlp.",)
    expert_names: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")
    qk_norm_names: ClassVar[tuple[str, str]] = ("q_norm", "k_norm")  # each attention's q and k norms
    router_name: ClassVar[str] = "gate"  # a routed layer's router, under its moe prefix
    shared_name: ClassVar[str] = "shared_expert"  # its shared expert (Qwen2-MoE's)
    selection_bias_name: ClassVar[str] = "gate.e_score_correction_bias"  # its selection bias (DeepSeek-V3's)
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
        "model.norm.eps": "rms_norm_eps",
        "model.dropout.attention": "attention_dropout",
        "model.qkv_clip": "clip_qkv",
        "model.positional.nope_layers": "no_rope_layers",
        "model.embedding_multiplier": "embedding_multiplier",
        "model.residual_multiplier": "residual_multiplier",
        "model.attention_scale": "attention_multiplier",
        "model.init_std": "initializer_range",
    }

    def aliases_for(self, model_type: str) -> dict[str, str]:
        return MODEL_TYPES[model_type].aliases

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture.endswith("ForCausalLM")
            or (architecture.endswith("Model") and "For" not in architecture),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a *ForCausalLM model",
        )
        kind = MODEL_TYPES[config.data["model_type"]]
        config = kind.reads(config)
        if kind.requires is not None:
            kind.requires(config)
        valid_layer_types(config)
        if not kind.reads_window:
            unread_window(config, context(config))
        d, heads = config.get("hidden_size", 4096), config.get("num_attention_heads", 32)
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim", d // max(heads, 1))  # 0 heads: refused by the spec
        # Only the fields the model type reads are read: another's value is ignored, as transformers does.
        biases = set(kind.fixed_bias)
        if kind.attention_bias and config.get(kind.bias_field, False):
            biases |= set(kind.attention_bias)
        if kind.out_bias_field is not None and config.get(kind.out_bias_field, False):
            biases.add("attn_out")
        tie = lm_head(
            config, tensors, architecture, ("lm_head.weight", "embed_tokens.weight"), False, "*ForCausalLM"
        )
        config.require(
            config.get("pretraining_tp", 1) >= 1,
            "pretraining_tp",
            "must be a positive integer",
            "set it to 1",
        )
        vocab = config.get("vocab_size", 32000)
        pad_within(config, vocab)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": context(config),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 32),
            "n_heads": heads,
            "n_kv_heads": kv_heads,
            "d_ff": config.get("intermediate_size", 11008),
            "activation": kind.fixed_activation
            or (
                config.choice(kind.activation, "silu", GATED_ACTIVATIONS, "gated activation")
                if kind.gated
                else config.choice(kind.activation, "relu2", ACTIVATIONS, "activation")
            ),
            "positional": layer_type_rope(config, head_dim)
            if kind.rope_per_layer_type
            else self.rope(config, head_dim),
            "norm": {"position": "pre", "type": "rmsnorm", "bias": False}
            | ({} if "eps" in kind.norm else {"eps": config.get(kind.norm_eps, 1e-6)})
            | kind.norm,
            "bias": {
                "qkv": "qkv" in biases,
                "attn_out": "attn_out" in biases,
                "ffn": "ffn" in biases or (kind.mlp_bias and config.get(kind.mlp_bias_field, False)),
                "lm_head": False,
            },
            "tie_embeddings": tie,
            "dropout": {
                "attention": dropout(config.get("attention_dropout", 0.0)) if kind.attention_dropout else 0.0
            },
            "init_std": init_std(config),
        }
        if head_dim * heads != d:
            model["head_dim"] = head_dim
        if kind.layout != "halves":  # the q and k rows as saved: no permutation
            model["positional"]["layout"] = kind.layout
        if kind.qk_norm or (kind.qk_norm_field is not None and config.get(kind.qk_norm_field, False)):
            model["qk_norm"] = True
            if kind.qk_norm_over != "head":
                model["qk_norm_over"] = kind.qk_norm_over
            if kind.qk_norm_after_rope:
                model["qk_norm_after_rope"] = True
        if kind.scale_embeddings:
            model["scale_embeddings"] = True
        if kind.sinks:
            model["attention_sinks"] = True
        if kind.multipliers:
            model |= multipliers(config)
            if kind.null_attention_scale and config.data.get("attention_multiplier", 1.0) is None:
                del model["attention_scale"]  # the spec's default: 1/sqrt(head_dim)
        if kind.nope and (nope := nope_layers(config)):
            model["positional"]["nope_layers"] = nope
        if kind.nope_full and config.get("sliding_window") is not None and listable(model["n_layers"]):
            full = [i for i, t in enumerate(config.get("layer_types", [])) if t == FULL]
            if full:
                model["positional"]["nope_layers"] = full
        if kind.clip_qkv and (clip := config.get("clip_qkv")) is not None:
            model["qkv_clip"] = clip  # not above 0: refused by the spec
        if (slides := window(config, kind)) is not None:
            model["window"] = slides
        sources = scaling_sources(config) | window_sources(config, kind)
        if "rotary_dims" in model["positional"]:  # read from a rotated fraction
            sources["model.positional.rotary_dims"] = rotary_source(config)
        if kind.query_scaling:
            model["positional"]["query_scaling"], scaling = query_scaling(config)
            sources |= scaling
        if kind.nope_full:
            sources["model.positional.nope_layers"] = sources["model.window.layers"]
        if kind.moe is not None:
            moe, moe_sources = moe_section(config, kind.moe, model["n_layers"])
            if moe is not None:
                model["moe"] = moe
                sources |= moe_sources
        if kind.rope_per_layer_type:
            sources |= {
                "model.positional.theta": f"rope_parameters.{FULL}",
                "model.positional.scaling": f"rope_parameters.{FULL}",
                "model.positional.local.theta": f"rope_parameters.{SLIDING}",
                "model.positional.local.scaling": f"rope_parameters.{SLIDING}",
                "model.positional.local.layers": "layer_types",
            }
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def experts_state(self, tensors: Tensors, layer: str, ffn: str, spec: Spec) -> State:
        """A routed layer's (``layer``: its tensors' prefix) router, experts and shared expert as
        the MoE at ``ffn`` names them: each expert's gate and up rows one after the other, gate
        first (the dense feed-forward's w_in), from the tensors of each expert (``expert_names``)
        or from transformers 5's stacked ``experts.gate_up_proj`` (experts x (gate; up) x d) and
        ``experts.down_proj``, as it holds them in memory and loads them too."""
        moe = spec.model.moe
        assert moe is not None
        router = f"{self.router_name}.weight"
        held = [f"{layer}{p}" for p in self.moe_prefixes if f"{layer}{p}{router}" in tensors]
        m = held[0] if held else f"{layer}{self.moe_prefixes[0]}"  # none: missing, said by take
        state = {f"{ffn}router.weight": tensors.take(f"{m}{router}")}
        if moe.selection_bias:
            state[f"{ffn}selection_bias"] = tensors.take(f"{m}{self.selection_bias_name}").reshape(-1)
        if f"{m}experts.gate_up_proj" in tensors:
            gate_up = stacked(tensors, f"{m}experts.gate_up_proj", moe.experts)
            down = stacked(tensors, f"{m}experts.down_proj", moe.experts)
            for e in range(moe.experts):
                state[f"{ffn}experts.{e}.w_in.weight"] = gate_up[e]
                state[f"{ffn}experts.{e}.w_out.weight"] = down[e]
        else:
            gate_name, up_name, down_name = self.expert_names
            for e in range(moe.experts):
                x = f"{m}experts.{e}."
                w_in = tensors.cat(f"{x}{gate_name}.weight", f"{x}{up_name}.weight")  # gate first
                state[f"{ffn}experts.{e}.w_in.weight"] = w_in
                state[f"{ffn}experts.{e}.w_out.weight"] = tensors.take(f"{x}{down_name}.weight")
        if moe.shared_d_ff is not None:
            x = f"{m}{self.shared_name}."
            state[f"{ffn}shared.w_in.weight"] = tensors.cat(f"{x}gate_proj.weight", f"{x}up_proj.weight")
            state[f"{ffn}shared.w_out.weight"] = tensors.take(f"{x}down_proj.weight")
        if moe.shared_gate:
            state[f"{ffn}shared_gate.weight"] = tensors.take(f"{m}shared_expert_gate.weight")
        return state

    def experts_tensors(self, state: State, ffn: str, layer: str, model: DecoderSpec) -> State:
        """A routed layer's router, experts and shared expert (the MoE at ``ffn``) as save_pretrained
        writes them for this converter's model types, one expert at a time, under the names it
        reads (``moe_prefixes``, ``expert_names``): Mixtral's ``block_sparse_moe.experts.{e}.w1``
        (gate), ``w3`` (up) and ``w2`` (down), the others' ``mlp.experts.{e}.gate_proj``,
        ``up_proj`` and ``down_proj``, Qwen2-MoE's ``mlp.shared_expert`` and ``mlp.shared_expert_gate``
        (the router and shared expert under this converter's ``router_name`` and ``shared_name``)."""
        moe = model.moe
        assert moe is not None
        m = f"{layer}{self.moe_prefixes[0]}"
        gate_name, up_name, down_name = self.expert_names
        out = {f"{m}{self.router_name}.weight": state[f"{ffn}router.weight"]}
        if moe.selection_bias:
            out[f"{m}{self.selection_bias_name}"] = state[f"{ffn}selection_bias"]
        for e in range(moe.experts):
            gate, up = state[f"{ffn}experts.{e}.w_in.weight"].chunk(2)
            x = f"{m}experts.{e}."
            out |= {f"{x}{gate_name}.weight": gate, f"{x}{up_name}.weight": up}
            out[f"{x}{down_name}.weight"] = state[f"{ffn}experts.{e}.w_out.weight"]
        if moe.shared_d_ff is not None:
            gate, up = state[f"{ffn}shared.w_in.weight"].chunk(2)
            x = f"{m}{self.shared_name}."
            out |= {f"{x}gate_proj.weight": gate, f"{x}up_proj.weight": up}
            out[f"{x}down_proj.weight"] = state[f"{ffn}shared.w_out.weight"]
        if moe.shared_gate:
            out[f"{m}shared_expert_gate.weight"] = state[f"{ffn}shared_gate.weight"]
        return out

    def layer_norms(self, model: DecoderSpec) -> tuple[tuple[str, str], ...]:
        """Each layer's norms, transformers' names -> tfcompile's (``layer_norms``')."""
        return layer_norms(model)

    def rope(self, config: Config, head_dim: int) -> dict[str, Any]:
        """``positional:``, one RoPE for every layer, on the part of each head the model type turns."""
        return rope_section(config, head_dim, MODEL_TYPES[config.data["model_type"]].partial_rotary)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.n_kv_heads is not None
        qkv_rows = [model.n_heads * model.head_dim] + [model.n_kv_heads * model.head_dim] * 2
        embed = tensors.take("embed_tokens.weight")
        state = {
            "embed.weight": embed,
            "lm_head.weight": embed if spec.model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        if model.norm.scale:  # OLMo's norms learn nothing
            state["final_norm.weight"] = tensors.take("norm.weight")
        routed = model.routed_layers(model.n_layers)
        for i in range(spec.model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            a, m = f"{h}self_attn.", f"{h}mlp."
            for hf, tfc in self.layer_norms(model):
                state[f"{b}{tfc}.weight"] = tensors.take(f"{h}{hf}.weight")
            state[f"{b}attn.out.weight"] = tensors.take(f"{a}o_proj.weight")
            if i in routed:
                state |= self.experts_state(tensors, h, f"{b}ffn.", spec)
            else:
                ins = [f"{m}{x}_proj.weight" for x in feed_forward_inputs(model)]
                state[f"{b}ffn.w_in.weight"] = tensors.cat(*ins)  # gate first
                state[f"{b}ffn.w_out.weight"] = tensors.take(f"{m}down_proj.weight")
                if spec.model.bias.ffn:
                    ins = [f"{m}{x}_proj.bias" for x in feed_forward_inputs(model)]
                    state[f"{b}ffn.w_in.bias"] = tensors.cat(*ins)
                    state[f"{b}ffn.w_out.bias"] = tensors.take(f"{m}down_proj.bias")
            if spec.model.attention_sinks:
                state[f"{b}attn.sinks"] = tensors.take(f"{a}sinks")
            for kind in ("weight", "bias") if spec.model.bias.qkv else ("weight",):
                names = (f"{a}{x}_proj.{kind}" for x in "qkv")
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names, rows=qkv_rows)
            if spec.model.bias.attn_out:
                state[f"{b}attn.out.bias"] = tensors.take(f"{a}o_proj.bias")
            if spec.model.qk_norm:
                q_norm, k_norm = self.qk_norm_names
                state[f"{b}attn.q_norm.weight"] = tensors.take(f"{a}{q_norm}.weight")
                state[f"{b}attn.k_norm.weight"] = tensors.take(f"{a}{k_norm}.weight")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE on whole heads (Phi-3 turns part of each), whose embeddings are not
        scaled (Gemma's are) and whose blocks are LLaMA's (not GPT-NeoX's)."""
        model = rope_decoder_lm(spec)
        return llama_blocks(model) and not partial_rotary(model) and not deepseek_routed(model)

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        kind = MODEL_TYPES[written_as(model)]
        need = Needs(kind.title)
        own_activation = kind.fixed_activation == model.activation  # GPT-OSS's, checked by its own
        need(hidden_act(model) is not None or own_activation, "model.activation", model.activation, "swiglu")
        if kind.own is not None:
            model = kind.own(need, model)
        rope_and_norms(need, model)
        # head_dim is free: Llama configs name it; q/k norms: Qwen3's; a mixture of experts: the MoE
        # types' (their ``own`` checked it)
        need.plain_scales(
            model,
            qk_norm=True,
            moe=kind.moe is not None,
            after_rope=kind.qk_norm_after_rope,
            query_scaling=kind.query_scaling,
        )
        if not kind.mlp_bias and "ffn" not in kind.fixed_bias:
            need(
                not model.bias.ffn,
                "model.bias.ffn",
                True,
                f"false ({kind.title}'s feed-forward has no biases)",
            )
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        bias = model.bias
        written = written_as(model)
        rope = rope_dict(model.positional)
        config: dict[str, Any] = {
            "architectures": [MODEL_TYPES[written].head],
            "model_type": written,
            "vocab_size": model.vocab_size,
            "hidden_size": model.d_model,
            "intermediate_size": model.d_ff,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "num_key_value_heads": model.n_kv_heads,
            "head_dim": model.head_dim,
            "hidden_act": hidden_act(model) or "silu",  # GPT-OSS's: unread
            "max_position_embeddings": model.max_seq_len,
            "rms_norm_eps": model.norm.eps,
            # transformers 4 reads these two; 5 reads rope_parameters (and these, first).
            "rope_theta": model.positional.theta,
            "rope_scaling": rope if model.positional.scaling is not None else None,
            "rope_parameters": {"rope_theta": model.positional.theta, **rope},
            **rope_top_level(model.positional),
            "tie_word_embeddings": model.tie_embeddings,
            "attention_dropout": model.dropout.attention,
            "initializer_range": model.init_std,
        }
        kind = MODEL_TYPES[written]
        if kind.attention_bias and kind.bias_field == "qkv_bias":  # Qwen2-MoE: q, k and v's, or none
            config["qkv_bias"] = bias.qkv
        elif kind.attention_bias:  # on q, k, v and o alike, in both; Mistral has none, Qwen2 q, k and v's
            config["attention_bias"] = bias.qkv or bias.attn_out or "attn_out" in kind.fixed_bias
        window = model.window
        if kind.every_layer_slides and kind.window_flag:  # Qwen3-MoE: every layer or none
            size = None if window is None else window.size
            config |= {"use_sliding_window": window is not None, "sliding_window": size}
        elif kind.every_layer_slides:  # Mistral (always a window), Mixtral (where one is set)
            config |= {"sliding_window": None if window is None else window.size}
        elif kind.nope:  # SmolLM3: the layers without RoPE, the sliding ones as layer_types
            nope, sliding = set(model.positional.nope_layers or ()), model.sliding_layers
            config |= {
                "no_rope_layers": [int(i not in nope) for i in range(model.n_layers)],
                "use_sliding_window": window is not None,
                "sliding_window": None if window is None else window.size,
                "layer_types": [
                    "sliding_attention" if i in sliding else "full_attention" for i in range(model.n_layers)
                ],
            }
        elif kind.nope_full:  # EXAONE 4: the layers that turn RoPE slide, over max_seq_len where no window
            nope = set(model.positional.nope_layers or ())
            slides = window is not None or bool(nope)
            config |= {
                "sliding_window": (window.size if window is not None else model.max_seq_len)
                if slides
                else None,
                "layer_types": [SLIDING if slides and i not in nope else FULL for i in range(model.n_layers)],
            }
        elif kind.alternating:  # GPT-OSS: the sliding layers as layer_types, a window however many
            sliding = model.sliding_layers
            config |= {
                "sliding_window": model.max_seq_len if window is None else window.size,
                "layer_types": [SLIDING if i in sliding else FULL for i in range(model.n_layers)],
            }
        elif (kind.window_layers or kind.window_flag) and window is None:
            config |= {"use_sliding_window": False, "sliding_window": None}
        elif (kind.window_layers or kind.window_flag) and window is not None:  # Qwen2, Qwen3, Qwen2-MoE
            sliding = model.sliding_layers
            types = ["sliding_attention" if i in sliding else "full_attention" for i in range(model.n_layers)]
            config |= {
                "use_sliding_window": True,
                "sliding_window": window.size,
                "layer_types": types,
            }
        if kind.mlp_bias:
            config["mlp_bias"] = bias.ffn
        if kind.moe is not None:
            config |= moe_config(model, written)
        if kind.fixed_activation == "swiglu_clamped":  # as transformers 4 computes it
            config |= GPT_OSS_SWIGLU
        if kind.multipliers:
            config |= {
                "embedding_multiplier": model.embedding_multiplier,
                "residual_multiplier": model.residual_multiplier,
                "logits_scaling": 1 / model.logit_multiplier,
                "attention_multiplier": model.attention_scale,
            }
        return config

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        assert model.head_dim is not None and model.n_kv_heads is not None
        hd = model.head_dim
        q_rows, kv_rows = model.n_heads * hd, model.n_kv_heads * hd
        order_q, order_k = layout_orders(model, self.layout)
        written = written_as(model)
        writer = ARCHITECTURES[written]  # the converter of its tensors' names
        assert isinstance(writer, Llama)
        bias = model.bias
        # the model type's biases written whatever the model has (Qwen2's q, k and v, GPT-OSS's): zeros
        always = bool({"qkv", "attn_out"} & set(MODEL_TYPES[written].fixed_bias))
        out_bias = "attn_out" in MODEL_TYPES[written].attention_bias + MODEL_TYPES[written].fixed_bias
        routed = model.routed_layers(model.n_layers)
        out = {
            "model.embed_tokens.weight": state["embed.weight"],
            "model.norm.weight": state["final_norm.weight"] * output_scale(model),
        }
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        for i in range(model.n_layers):
            h, b = f"model.layers.{i}.", f"blocks.{i}."
            a, m = f"{h}self_attn.", f"{h}mlp."
            for hf, tfc in self.layer_norms(model):
                out[f"{h}{hf}.weight"] = state[f"{b}{tfc}.weight"]
            out[f"{a}o_proj.weight"] = state[f"{b}attn.out.weight"]
            if i in routed:
                out |= writer.experts_tensors(state, f"{b}ffn.", h, model)
            else:
                ins = state[f"{b}ffn.w_in.weight"].chunk(len(feed_forward_inputs(model)))
                out |= {
                    f"{m}{x}_proj.weight": t for x, t in zip(feed_forward_inputs(model), ins, strict=True)
                }
                out[f"{m}down_proj.weight"] = state[f"{b}ffn.w_out.weight"]
            kinds = ("weight", "bias") if bias.qkv or bias.attn_out or always else ("weight",)
            for kind in kinds:
                packed = zeros_if_none(state.get(f"{b}attn.qkv.{kind}"), q_rows + 2 * kv_rows)
                q, k, v = packed.split([q_rows, kv_rows, kv_rows])
                if order_q is not None and order_k is not None:
                    q, k = q[order_q], k[order_k]
                out |= {f"{a}q_proj.{kind}": q, f"{a}k_proj.{kind}": k, f"{a}v_proj.{kind}": v}
            if (bias.qkv or bias.attn_out or always) and out_bias:  # none in Qwen2's and GLM-4.5's
                out[f"{a}o_proj.bias"] = zeros_if_none(state.get(f"{b}attn.out.bias"), model.d_model)
            if model.attention_sinks:
                out[f"{a}sinks"] = state[f"{b}attn.sinks"]
            if model.qk_norm:  # the scale's dimensions in the order of the q and k rows above
                q_norm, k_norm = state[f"{b}attn.q_norm.weight"], state[f"{b}attn.k_norm.weight"]
                if order_q is not None and order_k is not None and model.qk_norm_over == "all_heads":
                    q_norm, k_norm = q_norm[order_q], k_norm[order_k]
                elif order_q is not None:  # each head's
                    q_norm, k_norm = q_norm[order_q[:hd]], k_norm[order_q[:hd]]
                q_name, k_name = writer.qk_norm_names
                out |= {f"{a}{q_name}.weight": q_norm, f"{a}{k_name}.weight": k_norm}
            if bias.ffn and i not in routed:  # a routed layer's experts write their own
                ins = state[f"{b}ffn.w_in.bias"].chunk(len(feed_forward_inputs(model)))
                out |= {f"{m}{x}_proj.bias": t for x, t in zip(feed_forward_inputs(model), ins, strict=True)}
                out[f"{m}down_proj.bias"] = state[f"{b}ffn.w_out.bias"]
        return contiguous(out)


@register("mixtral")
class Mixtral(Llama):
    """Mixtral: Llama's reading (MODEL_TYPES["mixtral"]) of a checkpoint whose routed layers lie
    under ``block_sparse_moe`` (the Hub's and save_pretrained's; transformers 5 loads them as
    ``mlp``, and so may a checkpoint hold them), each expert's gate, up and down projections named
    ``w1``, ``w3`` and ``w2``."""

    moe_prefixes = ("block_sparse_moe.", "mlp.")
    expert_names = ("w1", "w3", "w2")

    def candidate(self, spec: Spec) -> bool:
        """Never: Llama writes every LLaMA-family model, Mixtral's too (``written_as``)."""
        return False


@register("gpt_oss")
class GptOss(Llama):
    """GPT-OSS: Llama's reading (MODEL_TYPES["gpt_oss"]) of a checkpoint whose layers hold a sink
    per head (``self_attn.sinks``), a router with a bias (``mlp.router``) and the experts stacked
    with their biases: ``mlp.experts.gate_up_proj`` (experts x d x 2 d_ff, each expert's gate and
    up columns interleaved, gate first), ``gate_up_proj_bias``, ``down_proj`` (experts x d_ff x d)
    and ``down_proj_bias``, as x @ W + b reads them."""

    def experts_state(self, tensors: Tensors, layer: str, ffn: str, spec: Spec) -> State:
        moe, d = spec.model.moe, spec.model.d_model
        assert moe is not None and moe.d_ff is not None
        m = f"{layer}mlp."
        state = {f"{ffn}router.weight": tensors.take(f"{m}router.weight")}
        state[f"{ffn}router.bias"] = tensors.take(f"{m}router.bias")
        e, ff = moe.experts, moe.d_ff
        gate_up = shaped(tensors, f"{m}experts.gate_up_proj", (e, d, 2 * ff))
        gate_up_bias = shaped(tensors, f"{m}experts.gate_up_proj_bias", (e, 2 * ff))
        down = shaped(tensors, f"{m}experts.down_proj", (e, ff, d))
        down_bias = shaped(tensors, f"{m}experts.down_proj_bias", (e, d))
        for i in range(e):
            x = f"{ffn}experts.{i}."
            w, bias = gate_up[i], gate_up_bias[i]  # (d, 2 ff) and (2 ff,): gate, up, gate, up, ...
            state[f"{x}w_in.weight"] = torch.cat([w[:, 0::2], w[:, 1::2]], dim=1).T  # gate rows first
            state[f"{x}w_in.bias"] = torch.cat([bias[0::2], bias[1::2]])
            state[f"{x}w_out.weight"] = down[i].T
            state[f"{x}w_out.bias"] = down_bias[i]
        return state

    def experts_tensors(self, state: State, ffn: str, layer: str, model: DecoderSpec) -> State:
        """The router (its bias zeros where the run has none) and the experts stacked as
        ``experts_state`` reads them, their biases zeros where the run has none."""
        moe = model.moe
        assert moe is not None and moe.d_ff is not None
        m, experts = f"{layer}mlp.", range(moe.experts)
        gate_up, gate_up_bias, down, down_bias = [], [], [], []
        for e in experts:
            x = f"{ffn}experts.{e}."
            w_in = state[f"{x}w_in.weight"]  # (2 ff, d): gate rows, then up rows
            b_in = zeros_if_none(state.get(f"{x}w_in.bias"), 2 * moe.d_ff)
            gate_up.append(torch.stack(w_in.T.chunk(2, dim=1), dim=2).flatten(1))  # (d, 2 ff) interleaved
            gate_up_bias.append(torch.stack(b_in.chunk(2), dim=1).flatten())
            down.append(state[f"{x}w_out.weight"].T)
            down_bias.append(zeros_if_none(state.get(f"{x}w_out.bias"), model.d_model))
        return {
            f"{m}router.weight": state[f"{ffn}router.weight"],
            f"{m}router.bias": zeros_if_none(state.get(f"{ffn}router.bias"), moe.experts),
            f"{m}experts.gate_up_proj": torch.stack(gate_up),
            f"{m}experts.gate_up_proj_bias": torch.stack(gate_up_bias),
            f"{m}experts.down_proj": torch.stack(down),
            f"{m}experts.down_proj_bias": torch.stack(down_bias),
        }

    def candidate(self, spec: Spec) -> bool:
        """Never: Llama writes every LLaMA-family model, GPT-OSS's too (``written_as``)."""
        return False


def shaped(tensors: Tensors, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor, which must have ``shape``; an HFError where it has another."""
    tensor = tensors.take(name)
    if tuple(tensor.shape) != shape:
        raise HFError(
            f"{tensors.where}: the tensor {name} has shape {tuple(tensor.shape)}, not {shape}; is "
            f"config.json the checkpoint's own?"
        )
    return tensor


@register("hunyuan_v1_dense", "hunyuan_v1_moe")
class HunYuan(Llama):
    """HunYuan (dense and MoE): Llama's reading (MODEL_TYPES) of q and k norms named
    ``query_layernorm`` and ``key_layernorm``, and of a dynamic RoPE with an ``alpha`` as HunYuan
    computes it (NTK alpha): no scaling, at theta x alpha^(head_dim / (head_dim - 2)); HunYuan-MoE's
    router is ``mlp.gate.wg``, its shared expert ``mlp.shared_mlp``."""

    qk_norm_names = ("query_layernorm", "key_layernorm")
    router_name = "gate.wg"
    shared_name = "shared_mlp"

    def rope(self, config: Config, head_dim: int) -> dict[str, Any]:
        section = super().rope(config, head_dim)
        scaling = section.get("scaling")
        name = scaling_sources(config)["model.positional.scaling"]  # the dict transformers reads
        params = config.get(name, {})
        alpha = params.get("alpha")
        if scaling is None or scaling["type"] != "dynamic" or not alpha:  # transformers' test: truthy
            return section
        valid = json_type(alpha) == "a number" and alpha > 0 and head_dim > 2
        config.require(
            valid,
            f"{name}.alpha",
            f"is {alpha!r}: HunYuan's NTK alpha raises theta by alpha^(head_dim / (head_dim - 2)), "
            f"which needs a number above 0 and heads wider than 2 (head_dim {head_dim})",
            "set it above 1 (Hunyuan-7B's 1000), or leave it out",
        )
        config.require(
            params.get("factor") is not None,
            f"{name}.factor",
            "is missing: transformers 5 refuses a dynamic RoPE without one, its NTK alpha's too",
            "set it (Hunyuan-7B's 1.0; the alpha alone sets theta)",
        )
        if valid and json_type(section["theta"]) == "a number":
            section["theta"] = section["theta"] * alpha ** (head_dim / (head_dim - 2))
        del section["scaling"]
        return section

    def candidate(self, spec: Spec) -> bool:
        """Never: Llama writes every LLaMA-family model, HunYuan's too (``written_as``)."""
        return False


@register("ernie4_5_moe")
class Ernie45Moe(Llama):
    """ERNIE 4.5 MoE: Llama's reading (MODEL_TYPES["ernie4_5_moe"]) of a checkpoint whose shared
    experts lie under ``mlp.shared_experts``, each router's selection bias (1 x experts) at
    ``mlp.moe_statics.e_score_correction_bias``; its multi-token prediction left out. Import only."""

    shared_name = "shared_experts"
    selection_bias_name = "moe_statics.e_score_correction_bias"

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """Llama's reading; the multi-token prediction's tensors (``mtp_*``, in the published
        checkpoints), which transformers leaves unread too, left out with a warning."""
        state = super().to_state(tensors, spec)
        left_out = tensors.skip("mtp")
        if left_out:
            warnings.warn(
                HFWarning(
                    f"{tensors.where}: left out {len(left_out)} tensors of ERNIE 4.5's multi-token "
                    f"prediction ({left_out[0]}, ...), which generation does not read"
                ),
                stacklevel=2,
            )
        return state

    def candidate(self, spec: Spec) -> bool:
        return False  # Llama writes ERNIE 4.5's attention; its routing, no writer


@register("glm4_moe", "dots1", "solar_open")
class Glm4Moe(Llama):
    """GLM-4.5, dots.llm1 and Solar Open: Llama's reading (MODEL_TYPES) of a checkpoint whose shared
    experts lie under ``mlp.shared_experts`` (empty where n_shared_experts is 0), each router's
    selection bias at ``mlp.gate.e_score_correction_bias``; the multi-token prediction layers past
    num_hidden_layers (num_nextn_predict_layers), which transformers leaves unread too, left out."""

    shared_name = "shared_experts"

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        state = super().to_state(tensors, spec)
        n = spec.model.n_layers
        # n_shared_experts 0: shared experts 0 wide, saved as empty tensors
        tensors.skip(
            *(x for x in tensors.left() if ".shared_experts." in x and not tensors.tensors[x].numel())
        )
        past = {name.split(".")[1] for name in tensors.left() if name.startswith("layers.")}
        layers = sorted(int(i) for i in past if i.isdigit() and int(i) >= n)
        left_out = tensors.skip(*(f"layers.{i}." for i in layers))
        if left_out:
            warnings.warn(
                HFWarning(
                    f"{tensors.where}: left out layers {layers} past num_hidden_layers ({n}): a "
                    f"multi-token prediction's (GLM-4.5's; {len(left_out)} tensors), which generation does "
                    "not read"
                ),
                stacklevel=2,
            )
        return state

    def candidate(self, spec: Spec) -> bool:
        """A LLaMA-like decoder of experts scored by their sigmoids, on whole heads or part of each."""
        model = rope_decoder_lm(spec)
        return llama_blocks(model) and deepseek_routed(model)

    def to_config(self, spec: Spec) -> dict[str, Any]:
        """Llama's fields with GLM-4.5's: q, k and v biases, q/k norms, the rotated fraction of each
        head at the top level (transformers 4) and in the RoPE dicts (5)."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        assert model.head_dim is not None
        config = super().to_config(spec)
        fraction = rotary_fraction(model.positional.width(model.head_dim), model.head_dim)
        scaling = config["rope_scaling"]
        return config | {
            "attention_bias": model.bias.qkv,
            "use_qk_norm": model.qk_norm,
            "partial_rotary_factor": fraction,
            "rope_scaling": None if scaling is None else scaling | {"partial_rotary_factor": fraction},
            "rope_parameters": config["rope_parameters"] | {"partial_rotary_factor": fraction},
        }

    def experts_tensors(self, state: State, ffn: str, layer: str, model: DecoderSpec) -> State:
        """Llama's, with the selection bias GLM-4.5's router always has (zeros where the model has
        none, which is exact) and shared experts 0 wide where it has none."""
        moe = model.moe
        assert moe is not None
        out = super().experts_tensors(state, ffn, layer, model)
        m = f"{layer}{self.moe_prefixes[0]}"
        out.setdefault(f"{m}{self.selection_bias_name}", torch.zeros(moe.experts))
        if moe.shared_d_ff is None:
            x, d = f"{m}{self.shared_name}.", model.d_model
            empty = {"gate_proj": (0, d), "up_proj": (0, d), "down_proj": (d, 0)}
            out |= {f"{x}{name}.weight": torch.zeros(shape) for name, shape in empty.items()}
        return out


@register("granitemoe", "granitemoeshared")
class GraniteMoe(Llama):
    """GraniteMoE and GraniteMoeShared: Llama's reading (MODEL_TYPES) of a checkpoint whose routed
    layers lie under ``block_sparse_moe``: the router's ``router.layer``, every expert's gate and up
    rows stacked in ``input_linear`` (experts x (gate; up) x d) and its down rows in
    ``output_linear`` (the Hub's and save_pretrained's; transformers 5 holds them as
    ``router.weight``, ``experts.gate_up_proj`` and ``experts.down_proj``, and so may a checkpoint),
    the shared expert's (gate; up) rows in ``shared_mlp.input_linear`` and its down rows in
    ``shared_mlp.output_linear``."""

    SAVED = ("router.layer.weight", "input_linear.weight", "output_linear.weight")
    HELD = ("router.weight", "experts.gate_up_proj", "experts.down_proj")

    def experts_state(self, tensors: Tensors, layer: str, ffn: str, spec: Spec) -> State:
        moe = spec.model.moe
        assert moe is not None
        m = f"{layer}block_sparse_moe."
        router, gate_up, down = self.SAVED if f"{m}{self.SAVED[0]}" in tensors else self.HELD
        state = {f"{ffn}router.weight": tensors.take(f"{m}{router}")}
        ins = stacked(tensors, f"{m}{gate_up}", moe.experts)
        outs = stacked(tensors, f"{m}{down}", moe.experts)
        for e in range(moe.experts):
            state[f"{ffn}experts.{e}.w_in.weight"] = ins[e]  # gate first
            state[f"{ffn}experts.{e}.w_out.weight"] = outs[e]
        if moe.shared_d_ff is not None:
            x = f"{layer}shared_mlp."
            state[f"{ffn}shared.w_in.weight"] = tensors.take(f"{x}input_linear.weight")
            state[f"{ffn}shared.w_out.weight"] = tensors.take(f"{x}output_linear.weight")
        return state

    def experts_tensors(self, state: State, ffn: str, layer: str, model: DecoderSpec) -> State:
        moe = model.moe
        assert moe is not None
        m = f"{layer}block_sparse_moe."
        router, gate_up, down = self.SAVED
        experts = range(moe.experts)
        out = {
            f"{m}{router}": state[f"{ffn}router.weight"],
            f"{m}{gate_up}": torch.stack([state[f"{ffn}experts.{e}.w_in.weight"] for e in experts]),
            f"{m}{down}": torch.stack([state[f"{ffn}experts.{e}.w_out.weight"] for e in experts]),
        }
        if moe.shared_d_ff is not None:
            x = f"{layer}shared_mlp."
            out[f"{x}input_linear.weight"] = state[f"{ffn}shared.w_in.weight"]
            out[f"{x}output_linear.weight"] = state[f"{ffn}shared.w_out.weight"]
        return out

    def candidate(self, spec: Spec) -> bool:
        """Never: Llama writes every LLaMA-family model, GraniteMoE's too (``written_as``)."""
        return False


def split(tensors: Tensors, name: str, rows: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The fused tensor's parts of ``rows`` rows each; an HFError when it has other rows."""
    fused = tensors.take(name)
    if fused.ndim != 2 or fused.shape[0] != sum(rows):
        raise HFError(
            f"{tensors.where}: the tensor {name} has shape {tuple(fused.shape)}, not "
            f"{' + '.join(map(str, rows))} rows; is config.json the checkpoint's own?"
        )
    return fused.split(list(rows))


class FusedFeedForward(Llama):
    """A LLaMA whose checkpoint holds some projections fused (the gate and up projections in one
    gate_up_proj, gate first: GLM's, Phi-3's), split into LLaMA's names before they are read."""

    def fused(self, model: DecoderSpec) -> dict[str, list[tuple[str, int]]]:
        """Each fused tensor of a layer -> the LLaMA tensors it holds, in order, and their rows."""
        assert model.d_ff is not None
        return {"mlp.gate_up_proj": [("mlp.gate_proj", model.d_ff), ("mlp.up_proj", model.d_ff)]}

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """The fused tensors split into LLaMA's names, then read as LLaMA's."""
        model = spec.model
        assert isinstance(model, DecoderSpec)
        parts: dict[str, torch.Tensor] = {}
        for i in range(model.n_layers):
            for name, pieces in self.fused(model).items():
                split_up = split(tensors, f"layers.{i}.{name}.weight", [rows for _, rows in pieces])
                parts |= {
                    f"layers.{i}.{part}.weight": t for (part, _), t in zip(pieces, split_up, strict=True)
                }
        unread = {name: t for name, t in tensors.tensors.items() if name not in tensors.used}
        llama = Tensors(unread | parts, tensors.where)
        state = super().to_state(llama, spec)
        tensors.used |= llama.used & set(unread)
        return state

    def from_state(self, state: State, spec: Spec) -> State:
        """Llama's tensors, those the checkpoint holds fused joined."""
        model = spec.model
        assert isinstance(model, DecoderSpec)
        out = dict(super().from_state(state, spec))
        for i in range(model.n_layers):
            h = f"model.layers.{i}."
            for name, pieces in self.fused(model).items():
                out[f"{h}{name}.weight"] = torch.cat([out.pop(f"{h}{part}.weight") for part, _ in pieces])
        return out


@register("nemotron")
class Nemotron(Llama):
    """Nemotron (Minitron, Nemotron-4): MODEL_TYPES' reading, its LayerNorms' weight + 1 folded in
    and their biases read."""

    sources: ClassVar[dict[str, str]] = Llama.sources | {"model.norm.eps": "norm_eps"}

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        state = super().to_state(tensors, spec)
        norms = [
            (f"layers.{i}.{hf}", f"blocks.{i}.{tfc}")
            for i in range(model.n_layers)
            for hf, tfc in self.layer_norms(model)
        ]
        for hf, tfc in [*norms, ("norm", "final_norm")]:
            state[f"{tfc}.weight"] = 1.0 + state[f"{tfc}.weight"]
            state[f"{tfc}.bias"] = tensors.take(f"{hf}.bias")
        return state

    def candidate(self, spec: Spec) -> bool:
        """Never: GPT-NeoX writes what Nemotron computes where it can (LayerNorms, a plain
        feed-forward, part of each head turned), with a K/V head per head."""
        return False


def glm_features(model: DecoderSpec) -> bool:
    """What GLM has that Phi-3 (part of each head turned) has not: q, k and v biases, or GLM-4's
    norms on each sublayer's output."""
    return model.bias.qkv or model.norm.position == "sandwich"


@register("glm", "glm4")
class Glm(FusedFeedForward):
    """GLM and GLM-4: MODEL_TYPES' reading, the feed-forward's gate and up in one gate_up_proj.
    export-hf writes a decoder that turns interleaved pairs (or halves, permuted) of part of each
    head with q, k and v biases as GLM, and one with sandwich norms as GLM-4."""

    layout = "interleaved"

    def layer_norms(self, model: DecoderSpec) -> tuple[tuple[str, str], ...]:
        """LLaMA's, and GLM-4's on each sublayer's output (sandwich)."""
        pre = layer_norms(model)
        if model.norm.position != "sandwich":
            return pre
        return (*pre, ("post_self_attn_layernorm", "attn_out_norm"), ("post_mlp_layernorm", "ffn_out_norm"))

    def candidate(self, spec: Spec) -> bool:
        """Part of each head turned, with GLM's features (Phi-3 writes the others)."""
        model = rope_decoder_lm(spec)
        return (
            llama_blocks(model)
            and partial_rotary(model)
            and glm_features(model)
            and not deepseek_routed(model)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        """Llama's needs of the model in pre-norm blocks, and what GLM lacks besides: an output
        projection or feed-forward bias, a window."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs("GLM")
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "swiglu")
        position = model.norm.position
        need(position in ("pre", "sandwich"), "model.norm.position", position, "pre, or sandwich (GLM-4's)")
        pre = model.norm.model_copy(update={"position": "pre"})
        llama = whole_heads(model).model_copy(update={"norm": pre})
        rope_and_norms(need, llama)
        need.plain_scales(llama)
        need(not model.bias.attn_out, "model.bias.attn_out", True, "false (GLM's output projection has none)")
        need(not model.bias.ffn, "model.bias.ffn", True, "false (GLM's feed-forward has none)")
        need(model.window is None, "model.window", model.window, "leave it unset (GLM has none)")
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        """Llama's fields as GlmConfig (Glm4Config, with sandwich norms) names them, the rotated
        fraction of each head at the top level (transformers 4) and in the RoPE dicts (5)."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        assert model.head_dim is not None
        config = {k: v for k, v in super().to_config(spec).items() if k != "mlp_bias"}
        fraction = rotary_fraction(model.positional.width(model.head_dim), model.head_dim)
        written = "glm4" if model.norm.position == "sandwich" else "glm"
        scaling = config["rope_scaling"]
        return config | {
            "architectures": [f"{written.title()}ForCausalLM"],
            "model_type": written,
            "attention_bias": model.bias.qkv,
            "partial_rotary_factor": fraction,
            "rope_scaling": None if scaling is None else scaling | {"partial_rotary_factor": fraction},
            "rope_parameters": config["rope_parameters"] | {"partial_rotary_factor": fraction},
        }

    def from_state(self, state: State, spec: Spec) -> State:
        """Llama's tensors (the q and k rows in interleaved pairs) but the output projection's bias
        (zeros: GLM has none), gate and up fused."""
        return {k: v for k, v in super().from_state(state, spec).items() if not k.endswith("o_proj.bias")}


def moe_config(model: DecoderSpec, written: str) -> dict[str, Any]:
    """A mixture of experts as the MoE model type ``written`` says it (its MoEType): the expert
    count in the field its config class reads and under each other name read over it (Qwen3-MoE's:
    4.57 reads num_experts, 5 num_local_experts over it), the experts' width, renormalisation where
    a field says it, dense layers where the type routes some, and the shared expert's width."""
    moe, kind = model.moe, MODEL_TYPES[written]
    assert moe is not None and moe.d_ff is not None and kind.moe is not None
    fields = kind.moe
    config: dict[str, Any] = {
        fields.top_k: moe.top_k,
        "router_aux_loss_coef": moe.balance_loss,
        "output_router_logits": False,
        fields.experts: moe.experts,
        fields.d_ff: moe.d_ff,
    }
    config |= {alias: moe.experts for alias, name in kind.aliases.items() if name == fields.experts}
    if fields.normalize is not None:
        config[fields.normalize] = bool(moe.normalize)
    if fields.sparse_layers:
        config |= {"decoder_sparse_step": 1, "mlp_only_layers": sorted(moe.dense_layers or ())}
    if fields.shared is not None:  # GraniteMoeShared's 0: none
        config[fields.shared] = moe.shared_d_ff or 0
    if fields.shared_count is not None:  # shared experts of d_ff (glm4_moe_own)
        config[fields.shared_count] = (moe.shared_d_ff or 0) // moe.d_ff
    if fields.deepseek:  # groups, scale and the first dense layers (glm4_moe_own)
        config |= {
            "n_group": moe.groups.count if moe.groups is not None else 1,
            "topk_group": moe.groups.top if moe.groups is not None else 1,
            "routed_scaling_factor": moe.scale,
        }
    if fields.first_dense is not None:  # the dense layers first (glm4_moe_own)
        config[fields.first_dense] = len(moe.dense_layers or ())
    return config


def stacked(tensors: Tensors, name: str, experts: int) -> torch.Tensor:
    """A tensor of every expert's weights stacked along its first dimension; an HFError where it
    holds another number of experts."""
    tensor = tensors.take(name)
    if tensor.ndim != 3 or tensor.shape[0] != experts:
        raise HFError(
            f"{tensors.where}: the tensor {name} has shape {tuple(tensor.shape)}, not {experts} experts' "
            "matrices; is config.json the checkpoint's own?"
        )
    return tensor


def layer_norms(model: DecoderSpec) -> tuple[tuple[str, str], ...]:
    """Each layer's norms, transformers' names -> tfcompile's: LLaMA's before each sublayer (its
    post_attention_layernorm is the feed-forward's), OLMo 2's on each sublayer's output, none
    where they learn nothing (OLMo's)."""
    if not model.norm.scale:
        return ()
    if model.norm.position == "output":
        return (("post_attention_layernorm", "attn_out_norm"), ("post_feedforward_layernorm", "ffn_out_norm"))
    return (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"))


def rope_decoder_lm(spec: Spec) -> DecoderSpec | None:
    """The spec's model where it is a decoder LM with RoPE (which Llama, Qwen3, Gemma or GPT-NeoX
    writes), else None."""
    model = spec.model
    if isinstance(model, DecoderSpec) and isinstance(spec.task, CausalLMTask):
        return model if isinstance(model.positional, RopePositional) else None
    return None


def llama_blocks(model: DecoderSpec | None) -> TypeGuard[DecoderSpec]:
    """A RoPE decoder (rope_decoder_lm's) of LLaMA's blocks, whose embeddings are not scaled."""
    return model is not None and not model.scale_embeddings and not neox_blocks(model)


def deepseek_routed(model: DecoderSpec | None) -> bool:
    """Whether the model's experts are scored by their sigmoids (DeepSeek-V3's routing): GLM-4.5
    writes them."""
    return model is not None and model.moe is not None and model.moe.scoring == "sigmoid"


def whole_heads(model: DecoderSpec) -> DecoderSpec:
    """The model with RoPE over whole heads (what Llama's needs read of a model that turns part of
    each head, apart from the width)."""
    assert isinstance(model.positional, RopePositional)
    positional = model.positional.model_copy(update={"rotary_dims": model.head_dim})
    return model.model_copy(update={"positional": positional})


def partial_rotary(model: DecoderSpec) -> bool:
    """Whether RoPE turns part of each head only."""
    assert isinstance(model.positional, RopePositional) and model.head_dim is not None
    return model.positional.width(model.head_dim) < model.head_dim


def neox_blocks(model: DecoderSpec) -> bool:
    """LayerNorm or parallel blocks: a RoPE decoder's blocks as GPT-NeoX has them, where LLaMA's
    are RMSNorm before each sublayer in turn."""
    return model.norm.type == "layernorm" or model.block.type == "parallel"


def rope_and_norms(need: Needs, model: DecoderSpec) -> None:
    """What every LLaMA-like architecture needs of the RoPE and norms: a RoPE on whole heads
    (``whole_head_rope``), pre-RMSNorm without bias, and a final norm."""
    whole_head_rope(need, model)
    need(model.norm.type == "rmsnorm", "model.norm.type", model.norm.type, "rmsnorm")
    need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
    need(not model.norm.bias, "model.norm.bias", True, "false")
    need(bool(model.norm.final), "model.norm.final", False, "true")


def whole_head_rope(need: Needs, model: DecoderSpec) -> None:
    """What a RoPE of transformers' default kind on whole heads needs: every dimension of a head
    rotated, one theta for every layer, dynamic scaling from at least max_seq_len."""
    assert isinstance(model.positional, RopePositional)
    dynamic_from_max_seq_len(need, model)
    one_rope(need, model)
    rotary = model.positional.rotary_dims
    need(rotary == model.head_dim, "model.positional.rotary_dims", rotary, "leave it unset (all of head_dim)")


def one_rope(need: Needs, model: DecoderSpec) -> None:
    """Every layer turning at one theta: the architectures whose configs have one RoPE."""
    assert isinstance(model.positional, RopePositional)
    local = model.positional.local
    found = local.model_dump(exclude_none=True) if local is not None else None
    need(local is None, "model.positional.local", found, "leave it unset (every layer at positional.theta)")
    nope = model.positional.nope_layers
    need(nope is None, "model.positional.nope_layers", nope, "leave it unset (every layer turns RoPE)")


def dynamic_from_max_seq_len(need: Needs, model: DecoderSpec) -> None:
    """Dynamic RoPE scaling from at least max_seq_len: transformers scales only past
    max_position_embeddings, which export-hf writes as max_seq_len."""
    assert isinstance(model.positional, RopePositional)
    scaling = model.positional.scaling
    if isinstance(scaling, DynamicRopeScaling):
        need(
            scaling.original_max_position_embeddings >= model.max_seq_len,
            "model.positional.scaling.original_max_position_embeddings",
            scaling.original_max_position_embeddings,
            f"max_seq_len ({model.max_seq_len}) or more: transformers' dynamic RoPE scales only "
            f"past max_position_embeddings, which is max_seq_len",
        )


def hidden_act(model: DecoderSpec) -> str | None:
    """The activation as LLaMA-like configs name it (hidden_act): a gated one's f, or a plain one
    (Arcee's feed-forward); None where none is."""
    return (EXPORTED_ACTIVATIONS if model.gated else PLAIN).get(model.activation)


def feed_forward_inputs(model: DecoderSpec) -> tuple[str, ...]:
    """The projections a LLaMA-like feed-forward's first matrix holds: gate and up (gated), or up."""
    return ("gate", "up") if model.gated else ("up",)


def written_as(model: DecoderSpec) -> str:
    """The model_type export-hf writes a decoder as: GPT-OSS where it has GPT-OSS's sinks, clamped
    SwiGLU or router bias; Arcee where its feed-forward is plain; FlexOlmo where its norms are on
    each sublayer's output and it has experts, else EXAONE 4 there where each head's q and k are
    normalised, else OLMo 2; SmolLM3 where some layers turn no RoPE; Granite where it has
    multipliers or another attention scale (and no experts); Ministral 3 where each query is scaled
    by its position; HunYuan where q and k are normalised after RoPE, Qwen3 where before; else
    Llama, whatever the biases (zeros where the model has none); GLM-4.5 where experts are scored by
    their sigmoids (DeepSeek-V3's routing). Not Qwen2, even for exactly q, k
    and v biases: transformers 5's AutoTokenizer reads a qwen2 folder with Qwen2's own tokenizer
    class, whatever its tokenizer.json holds (a character tokenizer lost its spaces).
    A sliding window is Mistral's where it covers every layer of a model without attention biases,
    else Qwen2's (on any layers, with q, k and v biases, zeros where the model has none), or
    Qwen3's with q/k norms.
    A mixture of experts (but in FlexOlmo's output norms, and in SmolLM3's, which refuses it) is
    HunYuan-MoE's where q and k are normalised after RoPE, GraniteMoE's where it
    has Granite's multipliers or attention scale (GraniteMoeShared's with a shared expert),
    GraniteMoeShared's where its shared expert is ungated, Qwen2-MoE's where it is gated, else
    OLMoE's with q/k norms over all heads, Qwen3-MoE's with each head's, else Mixtral's. Each
    writer's ``own`` refuses the others' features."""
    if model.attention_sinks or model.activation == "swiglu_clamped" or (model.moe and model.moe.router_bias):
        return "gpt_oss"
    if not model.gated:
        return "arcee"
    if deepseek_routed(model):
        return "glm4_moe"
    if model.norm.position == "output" and model.moe is not None:
        return "flex_olmo"
    if model.norm.position == "output":
        return "exaone4" if model.qk_norm and model.qk_norm_over == "head" else "olmo2"
    if isinstance(model.positional, RopePositional) and model.positional.nope_layers:
        return "smollm3"
    if granite_scales(model) and model.moe is None:
        return "granite"
    if model.moe is not None and model.qk_norm_after_rope:
        return "hunyuan_v1_moe"
    if isinstance(model.positional, RopePositional) and model.positional.query_scaling is not None:
        return "ministral3"
    if model.moe is not None and model.moe.shared_d_ff is not None:
        return "qwen2_moe" if model.moe.shared_gate and not granite_scales(model) else "granitemoeshared"
    if model.moe is not None and granite_scales(model):
        return "granitemoe"
    if model.moe is not None and model.qk_norm and model.qk_norm_over == "all_heads":
        return "olmoe"
    if model.moe is not None:
        return "qwen3_moe" if model.qk_norm else "mixtral"
    if model.qk_norm_after_rope:
        return "hunyuan_v1_dense"
    if model.qk_norm:
        return "qwen3"
    if model.window is None:
        return "llama"
    every = model.sliding_layers == set(range(model.n_layers))
    return "mistral" if every and not (model.bias.qkv or model.bias.attn_out) else "qwen2"


def granite_scales(model: DecoderSpec) -> bool:
    """Multipliers, or an attention scale other than 1/sqrt(head_dim): Granite's fields."""
    assert model.head_dim is not None
    default = math.isclose(model.attention_scale or 0.0, model.head_dim**-0.5, rel_tol=1e-12)
    return not default or any(getattr(model, name) != 1.0 for name in MULTIPLIERS)


def windowless(spec: Spec) -> Spec:
    """The spec without its window (Gemma 2 and 3 write theirs themselves)."""
    return spec.model_copy(update={"model": spec.model.model_copy(update={"window": None})})


def rotary_fraction(rotary: int, head_dim: int) -> float:
    """The fraction of a head that transformers reads back as ``rotary`` dimensions (it computes
    int(head_dim x fraction)): rotary / head_dim, or the next float above where that product
    rounds down (30 / 44 x 44 is 29.999...)."""
    fraction = rotary / head_dim
    while int(head_dim * fraction) < rotary:
        fraction = math.nextafter(fraction, 2.0)
    return fraction


def layout_orders(model: DecoderSpec, written: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The q and k rows reordered from the spec's RoPE layout to the ``written`` one's, within the
    rotated width of each head (halves_order, or its inverse to interleaved pairs); None where the
    layouts agree."""
    assert isinstance(model.positional, RopePositional) and model.head_dim is not None
    assert model.n_kv_heads is not None
    if model.positional.layout == written:
        return None, None
    rotary = model.positional.rotary_dims
    orders = [halves_order(n, model.head_dim, rotary) for n in (model.n_heads, model.n_kv_heads)]
    if written == "interleaved":
        orders = [order.argsort() for order in orders]
    return orders[0], orders[1]


def halves_order(n_heads: int, head_dim: int, rotary: int | None = None) -> torch.Tensor:
    """Rows of a q or k projection rotated as interleaved pairs, reordered so that transformers'
    halves rotate the same pairs: within the first ``rotary`` rows of each head (all by default),
    row i of the first half is interleaved row 2i, row i of the second half interleaved row
    2i + 1; the rows after them, unrotated, stay in place."""
    r = head_dim if rotary is None else rotary
    within = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, head_dim)])
    return (torch.arange(n_heads)[:, None] * head_dim + within).flatten()
