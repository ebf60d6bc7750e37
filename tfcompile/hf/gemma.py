"""Gemma (``GemmaForCausalLM``, Gemma 1): LLaMA's layout with embeddings multiplied by
sqrt(hidden_size), a gated GELU (tanh), RMSNorms that scale by (1 + weight), heads of their own
``head_dim`` and one ``attention_bias`` for q, k, v and o. The (1 + weight) is folded into the
spec's RMSNorm weight at import (transformers computes it in float32, as tfcompile does) and
unfolded at export.

Gemma 2 (``Gemma2ForCausalLM``) adds a norm on each sublayer's output (``norm.position:
sandwich``), attention scores and logits capped by c * tanh(x / c) (``attention_softcap``,
``logit_softcap``), q.k scaled by query_pre_attn_scalar^-0.5 (``attention_scale``) and a sliding
window on every other layer (the context is the window where it is shorter).

Gemma 3 (``Gemma3ForCausalLM``, model type ``gemma3_text``) is Gemma 2 with each head's q and k
normalised (``qk_norm``, RMSNorms of (1 + weight) folded as the others), no caps by default, five
sliding-window layers to each global one (``layer_types``, or ``sliding_window_pattern``), and a
RoPE per layer type: the sliding layers turn at ``rope_local_base_freq`` (10,000), unscaled, the
global ones at ``rope_theta`` (1,000,000) with ``rope_scaling`` (``positional.local``).

Gemma 3's multimodal model (``Gemma3ForConditionalGeneration``, model type ``gemma3``: Gemma 3
4B, 12B, 27B) is imported as its language model alone, a Gemma 3 of its ``text_config``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    Architecture,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Windows,
    image_path_left_out,
    json_type,
    register,
    whole_number,
)
from tfcompile.hf.errors import Problem
from tfcompile.hf.llama import (
    Llama,
    layer_type_dicts,
    rope_and_norms,
    rope_decoder_lm,
    rope_section,
    windowless,
)
from tfcompile.spec import Spec
from tfcompile.spec.schema import MAX_LAYERS, DecoderSpec, RopePositional

# GemmaConfig's defaults where LlamaConfig's differ: a config.json that leaves a field out (or
# null) is read as transformers reads it. Its head_dim's is llama.MODEL_TYPES'.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,  # whatever num_attention_heads is
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
# GemmaConfig reads the erf GELU's name as the tanh GELU that Gemma was trained with: the erf GELU
# is written as gelu_python, which it leaves alone. Older transformers 4 releases read
# hidden_activation instead of hidden_act: both are written, the same.
EXPORTED_ACTIVATIONS = {"geglu_tanh": "gelu_pytorch_tanh", "geglu": "gelu_python", "swiglu": "silu"}


# Gemma2Config's defaults where GemmaConfig's differ. A null cap is none, not the default:
# Gemma2Config keeps the null (a null window, which transformers fails on, is refused in read).
GEMMA2_DEFAULTS: dict[str, Any] = {
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256,
}
GEMMA2_NULLABLE: dict[str, Any] = {
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "sliding_window": 4096,
}


# Gemma3TextConfig's defaults where Gemma2Config's differ (its caps are none: null or missing).
GEMMA3_DEFAULTS: dict[str, Any] = {"vocab_size": 262208, "max_position_embeddings": 131072}
GEMMA3_NULLABLE: dict[str, Any] = GEMMA2_NULLABLE | {
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
}
SLIDING, FULL = "sliding_attention", "full_attention"
# Each layer type's theta where its rope_parameters name none: transformers 4's field, its default.
GEMMA3_THETAS = {FULL: ("rope_theta", 1_000_000.0), SLIDING: ("rope_local_base_freq", 10_000.0)}


def as_gemma_reads(config: Config) -> Config:
    """``config`` with GemmaConfig's defaults where a field is missing or null, and hidden_act
    "gelu" as the tanh GELU, as GemmaConfig reads it; its problems are ``config``'s."""
    read = config.filled(DEFAULTS)
    if read.data["hidden_act"] == "gelu":
        read.data["hidden_act"] = "gelu_pytorch_tanh"
    return read


def as_gemma2_reads(config: Config) -> Config:
    """``config`` with Gemma2Config's defaults where a field is missing or null (a cap or the
    window: missing only), as Gemma2Config reads it; its problems are ``config``'s. Its activation
    is hidden_activation's (hidden_act is unread), with no legacy renaming."""
    return config.filled(DEFAULTS | GEMMA2_DEFAULTS, GEMMA2_NULLABLE)


def as_gemma3_reads(config: Config) -> Config:
    """``config`` with Gemma3TextConfig's defaults where a field is missing or null (the window
    and the caps, none: missing only), and its ``layer_types`` where it has none: every
    ``sliding_window_pattern``-th layer (6th) global, the others sliding, as Gemma3TextConfig
    derives them."""
    read = config.filled(DEFAULTS | GEMMA2_DEFAULTS | GEMMA3_DEFAULTS, GEMMA3_NULLABLE)
    data = read.data
    # Read here without problems (this is read more than once); Gemma3.rope names a bad pattern.
    pattern, layers = data.get("sliding_window_pattern", 6), data["num_hidden_layers"]
    if data.get("layer_types") is None and whole_number(pattern) and pattern >= 1 and _depth(layers):
        data["layer_types"] = [SLIDING if (i + 1) % pattern else FULL for i in range(int(layers))]
    return read


def _depth(value: Any) -> bool:
    """A layer count the spec takes (another is refused there, by its field)."""
    return whole_number(value) and 1 <= value <= MAX_LAYERS


@register("gemma")
class Gemma(Llama):
    windows: ClassVar[Windows] = "none"
    title = "Gemma"

    def reads(self, config: Config) -> Config:
        """The config as this model type's config class reads it."""
        return as_gemma_reads(config)

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        gemma = self.reads(config)
        imported = super().read(gemma, architecture, tensors)
        gemma.refuse_true(
            "use_bidirectional_attention", why="attention over every token is not a causal LM's"
        )
        return imported

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        state = super().to_state(tensors, spec)
        norms = [f"blocks.{i}.{n}_norm.weight" for i in range(spec.model.n_layers) for n in ("attn", "ffn")]
        for name in [*norms, "final_norm.weight"]:
            state[name] = 1.0 + state[name]  # as GemmaRMSNorm computes it, in float32
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE whose embeddings are scaled (without, it is Llama's), without
        sandwich norms (Gemma 2's)."""
        model = rope_decoder_lm(spec)
        return model is not None and model.scale_embeddings and model.norm.position != "sandwich"

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs(self.title)
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "geglu_tanh")
        rope_and_norms(need, model)
        need(not model.bias.ffn, "model.bias.ffn", True, "false")
        # Gemma scales its embeddings always (the candidate's): the other scales, and no q/k norms,
        # as Llama's.
        need.plain_scales(model.model_copy(update={"scale_embeddings": False}))
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        config = super().to_config(windowless(spec))
        config.pop("mlp_bias")  # Llama's alone (Gemma 2 and 3 write their windows themselves)
        activation = EXPORTED_ACTIVATIONS[model.activation]
        return config | {
            "architectures": ["GemmaForCausalLM"],
            "model_type": "gemma",
            "hidden_act": activation,
            "hidden_activation": activation,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.n_kv_heads is not None
        out = super().from_state(state, windowless(spec))
        norms = [
            f"model.layers.{i}.{n}_layernorm.weight"
            for i in range(model.n_layers)
            for n in ("input", "post_attention")
        ]
        for name in [*norms, "model.norm.weight"]:
            out[name] = out[name] - 1.0
        return out


@register("gemma2")
class Gemma2(Gemma):
    windows: ClassVar[Windows] = "any"
    title = "Gemma 2"
    sources: ClassVar[dict[str, str]] = Gemma.sources | {
        "model.activation": "hidden_activation",
        "model.attention_scale": "query_pre_attn_scalar",
        "model.attention_softcap": "attn_logit_softcapping",
        "model.logit_softcap": "final_logit_softcapping",
    }

    def reads(self, config: Config) -> Config:
        return as_gemma2_reads(config)

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        gemma2 = self.reads(config)
        imported = super().read(config, architecture, tensors)
        model = imported.model
        scalar = gemma2.data["query_pre_attn_scalar"]
        if json_type(scalar) == "a number" and scalar > 0:
            model["attention_scale"] = float(scalar) ** -0.5
        else:
            gemma2.refuse("query_pre_attn_scalar", f"{scalar!r} is not a positive number", "fix the file")
        model["attention_softcap"] = gemma2.data["attn_logit_softcapping"]  # a bad cap: the spec refuses it
        model["logit_softcap"] = gemma2.data["final_logit_softcapping"]
        model["norm"]["position"] = "sandwich"
        gemma2.require(
            gemma2.data["sliding_window"] is not None,
            "sliding_window",
            f"is null: transformers' {self.title} builds its sliding layers' mask from a window, even where "
            "no layer slides, and fails without one",
            "give a window (at least max_position_embeddings where no layer should slide)",
        )
        return imported

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """Gemma's, whose ffn_norm took post_attention_layernorm: that is the attention's output
        norm here, and the feed-forward has a norm before and after it."""
        state = super().to_state(tensors, spec)
        for i in range(spec.model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            state[f"{b}attn_out_norm.weight"] = state.pop(f"{b}ffn_norm.weight")
            state[f"{b}ffn_norm.weight"] = 1.0 + tensors.take(f"{h}pre_feedforward_layernorm.weight")
            state[f"{b}ffn_out_norm.weight"] = 1.0 + tensors.take(f"{h}post_feedforward_layernorm.weight")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE, scaled embeddings and sandwich norms, and no q/k norms (Gemma 3's)."""
        model = rope_decoder_lm(spec)
        return (
            model is not None
            and model.scale_embeddings
            and model.norm.position == "sandwich"
            and not model.qk_norm
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        """Gemma's needs of the model with Gemma 2's own four taken out: sandwich norms (the
        candidate's), the two caps, and an attention scale of 1/sqrt(n) for a whole n
        (query_pre_attn_scalar, an integer in Gemma2Config)."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.attention_scale
        need = Needs(self.title)
        scalar = query_pre_attn_scalar(model.attention_scale)
        need(
            scalar >= 1 and math.isclose(scalar**-0.5, model.attention_scale, rel_tol=1e-12),
            "model.attention_scale",
            model.attention_scale,
            "1/sqrt(n) for a whole number n (Gemma 2's query_pre_attn_scalar)",
        )
        as_gemma = model.model_copy(
            update={
                "norm": model.norm.model_copy(update={"position": "pre"}),
                "attention_scale": model.head_dim**-0.5,
                "attention_softcap": None,
                "logit_softcap": None,
            }
        )
        return need.problems + super().exportable(spec.model_copy(update={"model": as_gemma}))

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.n_layers and model.attention_scale
        return super().to_config(spec) | {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "query_pre_attn_scalar": query_pre_attn_scalar(model.attention_scale),
            "attn_logit_softcapping": model.attention_softcap,  # null: none (missing: 50)
            "final_logit_softcapping": model.logit_softcap,
            # without a window, one of the whole context (transformers wants one all the same)
            "sliding_window": model.max_seq_len if model.window is None else model.window.size,
            "layer_types": [SLIDING if i in model.sliding_layers else FULL for i in range(model.n_layers)],
        }

    def from_state(self, state: State, spec: Spec) -> State:
        out = super().from_state(state, spec)
        for i in range(spec.model.n_layers):
            h, b = f"model.layers.{i}.", f"blocks.{i}."
            out[f"{h}post_attention_layernorm.weight"] = state[f"{b}attn_out_norm.weight"] - 1.0
            out[f"{h}pre_feedforward_layernorm.weight"] = state[f"{b}ffn_norm.weight"] - 1.0
            out[f"{h}post_feedforward_layernorm.weight"] = state[f"{b}ffn_out_norm.weight"] - 1.0
        return out


def query_pre_attn_scalar(scale: float) -> int:
    """The whole n nearest to the one whose n^-0.5 is ``scale``."""
    return round(scale**-2)


@register("gemma3_text")
class Gemma3(Gemma2):
    title = "Gemma 3"
    sources: ClassVar[dict[str, str]] = Gemma2.sources | {
        "model.positional.local.theta": "rope_local_base_freq",
        "model.positional.local.scaling": "rope_parameters.sliding_attention",
        "model.positional.local.layers": "layer_types",
    }

    def reads(self, config: Config) -> Config:
        return as_gemma3_reads(config)

    def rope(self, config: Config, head_dim: int) -> dict[str, Any]:
        """Each layer type's RoPE, as Gemma3TextConfig reads them: its dict in rope_parameters
        (transformers 5), else rope_theta with rope_scaling for the global layers and
        rope_local_base_freq, unscaled, for the sliding ones (transformers 4). The global layers'
        is the model's, the sliding layers' ``local`` (or the model's, where every layer slides)."""
        n_layers = config.get("num_hidden_layers", 26)
        if config.data.get("layer_types") is None:  # not derived: no pattern, or no layer count, to take
            if _depth(n_layers):
                pattern = config.data.get("sliding_window_pattern")
                config.refuse(
                    "sliding_window_pattern", f"{pattern!r} is not a positive whole number", "fix it"
                )
            return {"type": "rope"}
        types = config.get("layer_types", [])
        if len(types) != n_layers or not all(t in (SLIDING, FULL) for t in types):
            config.refuse(
                "layer_types",
                f"is not one of {SLIDING!r} or {FULL!r} for each of the {n_layers} layers",
                "fix it",
            )
            return {"type": "rope"}
        # A layer type without its dict (or with a null one) turns unscaled at its theta field's
        # value (its default), as Gemma3TextConfig fills it in.
        dicts = layer_type_dicts(config, given=bool(config.data.get("rope_parameters")))
        if dicts is None:
            return {"type": "rope"}
        params, legacy = dicts
        section = {}
        for kind, (theta, default) in GEMMA3_THETAS.items():
            own = params.get(kind) or {}
            if kind == FULL and legacy:  # Gemma3TextConfig updates the global layers' dict with it
                own = {"rope_type": "default"} | own | legacy
            one = config.over(
                {
                    "rope_parameters": own,
                    "rope_theta": config.get(theta, default),
                }
                | {
                    k: config.data[k]
                    for k in ("max_position_embeddings", "partial_rotary_factor")
                    if k in config.data
                }
            )
            called = "rope_scaling" if kind == FULL and legacy else f"rope_parameters.{kind}"
            section[kind] = rope_section(one, head_dim, called=called)
        if any("theta" not in s for s in section.values()):  # refused by rope_section
            return {"type": "rope"}
        sliding = [i for i, t in enumerate(types) if t == SLIDING]
        if not sliding:
            return section[FULL]
        if len(sliding) == n_layers:
            return section[SLIDING]
        local = {"theta": section[SLIDING]["theta"], "layers": sliding}
        if "scaling" in section[SLIDING]:
            local["scaling"] = section[SLIDING]["scaling"]
        return section[FULL] | {"local": local}

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """Gemma 2's, each head's q and k norm scaling by (1 + weight) too."""
        state = super().to_state(tensors, spec)
        for i in range(spec.model.n_layers):
            for name in ("q_norm", "k_norm"):
                state[f"blocks.{i}.attn.{name}.weight"] = 1.0 + state[f"blocks.{i}.attn.{name}.weight"]
        return state

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        """Gemma 2's, without the attention cap (transformers' Gemma 3 keeps attn_logit_softcapping
        and caps no score with it), the RoPE fields named where this config holds them."""
        imported = super().read(config, architecture, tensors)
        imported.model["attention_softcap"] = None
        params = config.data.get("rope_parameters")
        params = params if isinstance(params, dict) else {}

        def theta(kind: str) -> str:
            own = params.get(kind)
            return (
                f"rope_parameters.{kind}.rope_theta"
                if isinstance(own, dict) and "rope_theta" in own
                else GEMMA3_THETAS[kind][0]
            )

        named = {"model.positional.local.theta": theta(SLIDING)}
        if params and not config.data.get("rope_scaling"):
            named |= {
                "model.positional.theta": theta(FULL),
                "model.positional.scaling": f"rope_parameters.{FULL}",
            }
        types = self.reads(config).data.get("layer_types")
        if isinstance(types, list) and types and FULL not in types:  # the model's RoPE: the sliding one
            named = {
                "model.positional.theta": theta(SLIDING),
                "model.positional.scaling": f"rope_parameters.{SLIDING}",
            }
        return dataclasses.replace(imported, sources=imported.sources | named)

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with RoPE, scaled embeddings, sandwich norms and q/k norms."""
        model = rope_decoder_lm(spec)
        return (
            model is not None
            and model.scale_embeddings
            and model.norm.position == "sandwich"
            and model.qk_norm
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        """Gemma 2's needs of the model without its q/k norms and local RoPE (the candidate's and
        Gemma 3's own), local layers unscaled (transformers 4 scales none of them) and attention
        scores uncapped."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        need = Needs(self.title)
        need(
            model.attention_softcap is None,
            "model.attention_softcap",
            model.attention_softcap,
            "leave it unset (transformers' Gemma 3 caps no attention score)",
        )
        local = model.positional.local
        if local is not None and local.scaling is not None:
            scaling = local.scaling.model_dump(exclude_none=True)
            need(
                False,
                "model.positional.local.scaling",
                scaling,
                "leave it unset (sliding layers turn unscaled)",
            )
        if local is not None and model.window is not None:
            need(
                model.sliding_layers == set(local.layers),
                "model.window.layers",
                model.window.layers,
                f"the local RoPE's layers, {local.layers} (Gemma 3's sliding layers turn at its theta)",
            )
        return need.problems + super().exportable(as_gemma2(spec))

    def to_config(self, spec: Spec) -> dict[str, Any]:
        """Gemma 2's, with each layer type's RoPE in both transformers' fields, the sliding layers
        those of the window or of the local RoPE (where there is no window, over one of the whole
        context: none slides), which turn at the local theta."""
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
        config = super().to_config(as_gemma2(spec))
        local = model.positional.local
        theta = local.theta if local is not None else model.positional.theta
        sliding = set(local.layers) if local is not None else model.sliding_layers
        return config | {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "rope_parameters": {
                FULL: config["rope_parameters"],
                SLIDING: {"rope_type": "default", "rope_theta": theta},
            },
            "rope_local_base_freq": theta,
            "layer_types": [SLIDING if i in sliding else FULL for i in range(model.n_layers)],
        }

    def from_state(self, state: State, spec: Spec) -> State:
        out = super().from_state(state, spec)
        for i in range(spec.model.n_layers):
            for name in ("q_norm", "k_norm"):
                key = f"model.layers.{i}.self_attn.{name}.weight"
                out[key] = out[key] - 1.0  # a new tensor: the run's own is not changed
        return out


def as_gemma2(spec: Spec) -> Spec:
    """The spec without what Gemma 3 adds to Gemma 2: q/k norms and a local RoPE."""
    model = spec.model
    assert isinstance(model, DecoderSpec) and isinstance(model.positional, RopePositional)
    positional = model.positional.model_copy(update={"local": None})
    return spec.model_copy(
        update={"model": model.model_copy(update={"qk_norm": False, "positional": positional})}
    )


# The tensors of the multimodal Gemma 3's image path, under the names its checkpoints give them
# (transformers 5's model. prefix taken off).
IMAGE_TENSORS = ("vision_tower.", "multi_modal_projector.")


@register("gemma3")
class Gemma3Multimodal(Architecture):
    """Gemma 3's multimodal model (``Gemma3ForConditionalGeneration``, model type ``gemma3``): a
    SigLIP vision tower and a projector whose image embeddings take the place of the image
    tokens, then a Gemma 3 language model. Its language model is imported alone, as a
    gemma3_text folder of its weights would be: the config is ``text_config`` (Gemma3Config builds
    a Gemma3TextConfig of it, its defaults filling what it leaves out), the head tied as the top
    level's ``tie_word_embeddings`` says (transformers 5 reads it there, 4 in text_config), and
    the logits uncapped (the multimodal model applies no final_logit_softcapping). The image
    path's tensors are left out, said in a warning; export-hf writes the run as Gemma3ForCausalLM.
    Import only: the language model is Gemma 3's to write."""

    reads_window = True  # its language model's, as Gemma 3 reads it in text_config
    # transformers 5 saves model.language_model.* and lm_head.weight; 4 (and 5, to stay readable
    # by 4) language_model.model.* and language_model.lm_head.weight
    prefixes = ("model.language_model.", "language_model.model.", "language_model.", "model.")
    ignored = Gemma3.ignored
    language_model: ClassVar[Gemma3] = Gemma3()

    def cached_config(self, config: Config) -> Config:
        return config.within("text_config")  # its language model's, as transformers' cache reads it

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture == "Gemma3ForConditionalGeneration",
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a Gemma3ForConditionalGeneration",
        )
        text = config.within("text_config", top=("architectures", "tie_word_embeddings"))
        text.data["model_type"] = "gemma3_text"  # Gemma3Config's class for it, whatever the dict says
        if "tie_word_embeddings" in config.data and config.data["tie_word_embeddings"] is None:
            text.data["tie_word_embeddings"] = False  # Gemma3Config keeps the null, which ties nothing
        imported = self.language_model.read(text, "Gemma3ForCausalLM", tensors)
        imported.model["logit_softcap"] = None
        sources = text.named(self.language_model.sources | imported.sources)
        return dataclasses.replace(imported, sources=sources)

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        state = self.language_model.to_state(tensors, spec)
        image_path_left_out(tensors, IMAGE_TENSORS, "Gemma3ForConditionalGeneration", "Gemma3ForCausalLM")
        return state
