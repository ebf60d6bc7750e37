"""GPT-Neo (``GPTNeoForCausalLM``: GPT-Neo 125M, 1.3B, 2.7B, the TinyStories models): GPT-2's
learned positions, pre-LayerNorm blocks and tied head, with q.k unscaled (``attention_scale: 1``),
q, k and v projections without biases (an output projection and a feed-forward with them) and
``attention_layers`` (or, where config.json has none, ``attention_types`` expanded) saying which
layers are ``local``: those attend to the ``window_size`` positions up to the query's own
(transformers' tril(-window_size) mask), the spec's ``window`` over those layers.

export-hf writes a decoder LM of learned positions, GPT-2's norms and a window as GPT-Neo: its
window as ``window_size`` over the local layers (``attention_layers`` and ``attention_types``), the
feed-forward's and output projection's biases, LayerNorm shifts and the head's tie as the run has
them (zeros where it has none); it needs q.k unscaled and q, k and v without biases. An import
none of whose layers slides within its context is written as GPT-2 (``scale_attn_weights:
false``), which computes it exactly."""

from __future__ import annotations

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
    Windows,
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
from tfcompile.hf.gpt2 import gpt2_norms, learned_decoder_lm, multi_query
from tfcompile.hf.llama import context
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

# GPTNeoConfig's layers where the config names none: 24, global and local in turn.
ATTENTION_TYPES = [[["global", "local"], 12]]
KINDS = ("global", "local")
# GPT-Neo's names within a block -> tfcompile's (q, k and v apart, without biases); each has a bias.
LAYER = (
    ("ln_1", "attn_norm"),
    ("attn.attention.out_proj", "attn.out"),
    ("ln_2", "ffn_norm"),
    ("mlp.c_fc", "ffn.w_in"),
    ("mlp.c_proj", "ffn.w_out"),
)


def attention_layers(config: Config, n_layers: Any) -> list[str]:
    """Each layer's attention type, as transformers reads it: ``attention_layers`` where config.json
    holds it (save_pretrained writes it; transformers sets it over its own expansion), else
    ``attention_types`` expanded (each item a list of types and how many times they repeat, in
    turn), which transformers expands either way. An ``attention_types`` of another shape, a type
    neither global nor local, or another number of layers than ``num_layers`` (which transformers
    refuses) is a problem, and reads as no layer."""
    types: Any = config.data.get("attention_types")
    types = ATTENTION_TYPES if types is None else types  # GPTNeoConfig's where it is null too
    well_formed = isinstance(types, list) and all(
        isinstance(item, list)
        and len(item) == 2
        and isinstance(item[0], list)
        and isinstance(item[1], int)
        and not isinstance(item[1], bool)
        for item in types
    )
    if not well_formed:
        config.refuse(
            "attention_types",
            f"{types!r} is not a list of [[types...], count] pairs",
            'fix the file: [[["global", "local"], 12]] is 24 layers, global and local in turn',
        )
        return []
    layers: Any = config.data.get("attention_layers")  # a null: left out
    field = "attention_types" if layers is None else "attention_layers"
    if layers is None:
        count = sum(len(kinds) * max(repeats, 0) for kinds, repeats in types)  # none where negative
        if count != n_layers:  # counted first: the repeats may be too many to expand
            config.refuse(
                field,
                f"lists {count} layers and num_layers is {n_layers!r}: transformers refuses the config",
                "list one attention type per layer",
            )
            return []
        layers = [kind for kinds, repeats in types for kind in list(kinds) * repeats]
    elif not isinstance(layers, list) or len(layers) != n_layers:
        config.refuse(
            field,
            f"{layers!r} is not a list of num_layers ({n_layers!r}) attention types: transformers "
            "refuses the config",
            "list one attention type per layer, or leave it out (attention_types then says them)",
        )
        return []
    if unknown := sorted({repr(kind) for kind in layers if kind not in KINDS}):
        config.refuse(
            field,
            f"names {', '.join(unknown)}: transformers' GPT-Neo has only global and local attention",
            "list each layer as global or local",
        )
        return []
    return list(layers)


def window(config: Config, layers: list[str]) -> dict[str, Any] | None:
    """The spec's ``window``: ``window_size`` over the local layers, or None where no layer is local
    or the window holds the whole context (transformers' local layers are then global). A window
    of less than one position transformers computes, masking every key (each query then attends
    evenly to every position, later ones included): a problem."""
    local = [i for i, kind in enumerate(layers) if kind == "local"]
    if not local:
        return None  # window_size is unread
    size = config.get("window_size", 256)
    if not isinstance(size, int):
        config.refuse("window_size", f"{size!r} is not a whole number", "fix the file")
        return None
    config.require(
        size >= 1,
        "window_size",
        f"is {size}: transformers' local layers then mask every key, and each query attends evenly "
        "to every position, later ones included",
        "set it to a positive length, or list every layer as global",
    )
    if size < 1 or size >= context(config):
        return None
    return {"size": size} if len(local) == len(layers) else {"size": size, "layers": local}


@register("gpt_neo")
class GPTNeo(Writable):
    windows: ClassVar[Windows] = "any"  # attention_layers says which layers are local
    prefixes = ("transformer.",)
    # GPTNeoConfig's attribute_map: the names it reads its head and layer counts under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "num_attention_heads": "num_heads",
        "num_hidden_layers": "num_layers",
    }
    # the causal and local masks, buffers in older checkpoints (EleutherAI's)
    ignored = (".attn.attention.bias", ".attn.attention.masked_bias")
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_layers",
        "model.n_heads": "num_heads",
        "model.d_ff": "intermediate_size",
        "model.activation": "activation_function",
        "model.norm.eps": "layer_norm_epsilon",
        "model.dropout.embedding": "embed_dropout",
        "model.dropout.attention": "attention_dropout",
        "model.dropout.residual": "resid_dropout",
        "model.init_std": "initializer_range",
        "model.window.size": "window_size",
        "model.window.layers": "attention_types",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in ("GPTNeoForCausalLM", "GPTNeoModel"),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            "import a GPTNeoForCausalLM",
        )
        names = ("lm_head.weight", "wte.weight")
        tie = lm_head(config, tensors, architecture, names, True, "GPTNeoForCausalLM")
        d, n_layers = config.get("hidden_size", 2048), config.get("num_layers", 24)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": config.get("vocab_size", 50257),
            "max_seq_len": context(config),
            "d_model": d,
            "n_layers": n_layers,
            "n_heads": config.get("num_heads", 16),
            "d_ff": config.get("intermediate_size", 4 * d),
            "activation": config.choice("activation_function", "gelu_new", ACTIVATIONS, "GPT-Neo activation"),
            "positional": "learned",
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_epsilon", 1e-5)},
            "attention_scale": 1.0,  # q.k unscaled
            "bias": {"qkv": False, "attn_out": True, "ffn": True, "lm_head": False},
            "tie_embeddings": tie,
            "dropout": {
                "embedding": dropout(config.get("embed_dropout", 0.0)),
                "attention": dropout(config.get("attention_dropout", 0.0)),
                "residual": dropout(config.get("resid_dropout", 0.0)),
            },
            "init_std": init_std(config),
        }
        if (slides := window(config, attention_layers(config, n_layers))) is not None:
            model["window"] = slides
        saved = config.data.get("attention_layers") is not None  # read over attention_types
        sources = {"model.window.layers": "attention_layers"} if saved else {}
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

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
            state[f"{b}attn.qkv.weight"] = tensors.cat(*(f"{h}attn.attention.{x}_proj.weight" for x in "qkv"))
            for hf, tfc in LAYER:
                for kind in ("weight", "bias"):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
        return state

    def candidate(self, spec: Spec) -> bool:
        """A decoder LM with learned positions, GPT-2's norms, no MQA, and a window."""
        model = learned_decoder_lm(spec)
        return model is not None and not multi_query(model) and gpt2_norms(model) and model.window is not None

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        need = Needs("GPT-Neo")
        need(
            model.activation in EXPORTED_ACTIVATIONS,
            "model.activation",
            model.activation,
            "gelu_tanh (gelu_new)",
        )
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need(not model.bias.qkv, "model.bias.qkv", True, "false (GPT-Neo's q, k and v have no biases)")
        need(
            model.attention_scale == 1,
            "model.attention_scale",
            model.attention_scale,
            "1 (GPT-Neo does not scale q.k)",
        )
        need.plain_attention(model, unscaled=True)
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.window is not None
        sliding = model.sliding_layers
        layers = ["local" if i in sliding else "global" for i in range(model.n_layers)]
        return {
            "architectures": ["GPTNeoForCausalLM"],
            "model_type": "gpt_neo",
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_seq_len,
            "hidden_size": model.d_model,
            "num_layers": model.n_layers,
            "num_heads": model.n_heads,
            "intermediate_size": model.d_ff,
            "attention_types": [[[kind], 1] for kind in layers],
            "attention_layers": layers,
            "window_size": model.window.size,
            "activation_function": EXPORTED_ACTIVATIONS[model.activation],
            "layer_norm_epsilon": model.norm.eps,
            "embed_dropout": model.dropout.embedding,
            "attention_dropout": model.dropout.attention,
            "resid_dropout": model.dropout.residual,
            "initializer_range": model.init_std,
            "tie_word_embeddings": model.tie_embeddings,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        p, d, scale = "transformer.", model.d_model, output_scale(model)
        out = {
            f"{p}wte.weight": state["embed.weight"],
            f"{p}wpe.weight": state["positional.table.weight"],
            f"{p}ln_f.weight": state["final_norm.weight"] * scale,
            f"{p}ln_f.bias": zeros_if_none(state.get("final_norm.bias"), d) * scale,
        }
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        for i in range(model.n_layers):
            h, b = f"{p}h.{i}.", f"blocks.{i}."
            q, k, v = state[f"{b}attn.qkv.weight"].chunk(3)
            out |= {f"{h}attn.attention.{x}_proj.weight": t for x, t in zip("qkv", (q, k, v), strict=True)}
            for hf, tfc in LAYER:
                weight: torch.Tensor = state[f"{b}{tfc}.weight"]
                out[f"{h}{hf}.weight"] = weight
                out[f"{h}{hf}.bias"] = zeros_if_none(state.get(f"{b}{tfc}.bias"), weight.shape[0])
        return contiguous(out)
