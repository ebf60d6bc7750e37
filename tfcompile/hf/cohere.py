"""Cohere (``CohereForCausalLM``: Command-R, Aya 23, Aya Expanse) and Cohere 2
(``Cohere2ForCausalLM``: Command R7B, Command A): one LayerNorm without a bias
(``input_layernorm``, CohereLayerNorm: a weight only, ``norm: {type: layernorm, bias: false}``)
feeding attention and the feed-forward side by side
(a parallel block with a shared norm, x + attn(ln(x)) + mlp(ln(x))), RoPE on whole heads as
interleaved pairs (Cohere's rotate_half of x[..., ::2] and x[..., 1::2] with each frequency
repeated twice: ``layout: interleaved``), grouped K/V heads, ``attention_bias`` on q, k, v and o, a
gated feed-forward without biases, and the logits times ``logit_scale`` (``logit_multiplier``);
tied unless the config says otherwise. CohereConfig's RoPE theta is 500,000 where the config
names none (transformers 5's; 4 wrote its 10,000 into every config.json it saved).

Cohere 2's ``layer_types`` (where none: every ``sliding_window_pattern``-th layer, the 4th, full,
the others sliding, as Cohere2Config derives them): the sliding layers turn RoPE and attend over
``sliding_window`` positions (``window.layers``; a query at i sees i - size + 1 .. i, as
transformers' mask), the full layers turn no RoPE and see every position
(``positional.nope_layers``).

Refused by field: Cohere's ``use_qk_norm`` (a LayerNorm of each head's q and k with weights of
their own per head, shape (heads, head_dim), where the spec's ``qk_norm`` is one over head_dim
that every head shares), Cohere 2's null or non-positive ``sliding_window`` (transformers fails to
build the sliding layers' mask), layer types of neither kind or of another count than the layers.
export-hf writes neither: a spec of these blocks is GPT-NeoX's candidate, which refuses the
gated feed-forward, the shared norm and the logit multiplier by field."""

from __future__ import annotations

from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    GATED_ACTIVATIONS,
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
from tfcompile.hf.gpt_neox import rope_sources
from tfcompile.hf.llama import FALLBACKS, context, listable, rope_section
from tfcompile.spec import Spec
from tfcompile.spec.schema import DecoderSpec

# The config classes' defaults for the fields the reads below fall back on (both classes alike;
# their RoPE thetas differ: each class's ``theta``).
DEFAULTS = {
    "vocab_size": 256000,
    "hidden_size": 8192,
    "intermediate_size": 22528,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "max_position_embeddings": 8192,
}
LAYER_TYPES = ("sliding_attention", "full_attention")


@register("cohere")
class Cohere(Architecture):
    prefixes = ("model.",)
    ignored = ("rotary_emb.inv_freq",)  # a buffer in old checkpoints
    head: ClassVar[str] = "CohereForCausalLM"
    theta: ClassVar[float] = 500000.0  # CohereConfig.default_theta
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
        "model.logit_multiplier": "logit_scale",
        "model.dropout.attention": "attention_dropout",
        "model.init_std": "initializer_range",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture in (self.head, self.head.replace("ForCausalLM", "Model")),
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            f"import a {self.head}",
        )
        config = config.filled(DEFAULTS | {"rope_theta": self.theta})
        tie = lm_head(
            config, tensors, architecture, ("lm_head.weight", "embed_tokens.weight"), True, self.head
        )
        d, heads = config.get("hidden_size", 8192), config.get("num_attention_heads", 64)
        head_dim = config.get("head_dim", d // max(heads, 1))  # 0 heads: refused by the spec
        biased = bool(config.get("attention_bias", False))
        vocab = config.get("vocab_size", 256000)
        pad_within(config, vocab)
        positional = rope_section(config, head_dim) | {"layout": "interleaved"}  # rotate_half of pairs
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": context(config),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 40),
            "n_heads": heads,
            "n_kv_heads": config.get("num_key_value_heads", heads),
            "d_ff": config.get("intermediate_size", 22528),
            "activation": config.choice("hidden_act", "silu", GATED_ACTIVATIONS, "gated activation"),
            "positional": positional,
            "norm": {
                "position": "pre",
                "type": "layernorm",
                "eps": config.get("layer_norm_eps", 1e-5),
                "bias": False,
            },
            "block": {"type": "parallel", "shared_norm": True},
            "bias": {"qkv": biased, "attn_out": biased, "ffn": False, "lm_head": False},
            "tie_embeddings": tie,
            "logit_multiplier": config.get("logit_scale", 0.0625),  # not above 0: refused by the spec
            "dropout": {"attention": dropout(config.get("attention_dropout", 0.0))},
            "init_std": init_std(config),
        }
        if head_dim * heads != d:
            model["head_dim"] = head_dim
        sources = rope_sources(config, FALLBACKS) | self.layers(config, model)
        return Imported(model, {"type": "causal_lm", "special_tokens": False}, sources=sources)

    def layers(self, config: Config, model: dict[str, Any]) -> dict[str, str]:
        """What the model type reads of its layers into ``model``, and the config fields it was
        read from: Cohere's q and k norms, refused."""
        config.refuse_true(
            "use_qk_norm",
            why="Cohere normalises each head's q and k with weights of that head's own (heads x "
            "head_dim), where tfcompile's qk_norm has one weight over head_dim for every head",
        )
        return {}

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec) and model.head_dim is not None and model.n_kv_heads is not None
        qkv_rows = [model.n_heads * model.head_dim] + [model.n_kv_heads * model.head_dim] * 2
        embed = tensors.take("embed_tokens.weight")
        state = {
            "embed.weight": embed,
            "final_norm.weight": tensors.take("norm.weight"),
            "lm_head.weight": embed if model.tie_embeddings else tensors.take("lm_head.weight"),
        }
        tensors.maybe("lm_head.weight")  # a tie saved under both names
        for i in range(model.n_layers):
            h, b = f"layers.{i}.", f"blocks.{i}."
            a, m = f"{h}self_attn.", f"{h}mlp."
            state[f"{b}attn_norm.weight"] = tensors.take(f"{h}input_layernorm.weight")
            for kind in ("weight", "bias") if model.bias.qkv else ("weight",):
                names = (f"{a}{x}_proj.{kind}" for x in "qkv")
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names, rows=qkv_rows)
                state[f"{b}attn.out.{kind}"] = tensors.take(f"{a}o_proj.{kind}")
            gate_up = (f"{m}gate_proj.weight", f"{m}up_proj.weight")  # gate first, as the spec's swiglu
            state[f"{b}ffn.w_in.weight"] = tensors.cat(*gate_up)
            state[f"{b}ffn.w_out.weight"] = tensors.take(f"{m}down_proj.weight")
        return state


@register("cohere2")
class Cohere2(Cohere):
    reads_window = True  # its sliding layers' window
    head: ClassVar[str] = "Cohere2ForCausalLM"
    theta: ClassVar[float] = 10000.0  # Cohere2Config's: transformers' default

    def layers(self, config: Config, model: dict[str, Any]) -> dict[str, str]:
        """The sliding layers (``layer_types``, or where none every ``sliding_window_pattern``-th
        layer full, the others sliding, as Cohere2Config derives them): RoPE and a window of
        ``sliding_window``; the full layers: no RoPE, no window. Cohere 2 reads no q and k norms."""
        n_layers = model["n_layers"]
        if "sliding_window" in config.data and config.data["sliding_window"] is None:
            config.refuse(
                "sliding_window",
                "is null: transformers fails to build the sliding layers' mask with it",
                "set it to the positions a sliding layer attends over (Cohere2Config's 4096)",
            )
        size = config.get("sliding_window", 4096)
        config.require(
            size >= 1,
            "sliding_window",
            f"is {size!r}: a sliding layer attends over no position (transformers fails on it)",
            "set it to 1 or more",
        )
        given = config.get("layer_types", [])
        named = "layer_types" if config.data.get("layer_types") is not None else "sliding_window_pattern"
        sources = {
            "model.window.size": "sliding_window",
            "model.window.layers": named,
            "model.positional.nope_layers": named,
        }
        if not listable(n_layers):
            return sources
        if named == "layer_types":
            config.require(
                len(given) == n_layers and all(isinstance(t, str) and t in LAYER_TYPES for t in given),
                "layer_types",
                f"{given!r} is not one of {list(LAYER_TYPES)} for each of the {n_layers} layers",
                "list sliding_attention or full_attention for each layer",
            )
            types = list(given)
        else:
            pattern = config.get("sliding_window_pattern", 4)
            config.require(
                isinstance(pattern, int) and pattern >= 1,
                "sliding_window_pattern",
                f"{pattern!r} is not a positive whole number",
                "set it to the interval between full-attention layers, e.g. 4",
            )
            every = max(int(pattern), 1) if isinstance(pattern, int | float) else 4
            types = [LAYER_TYPES[(i + 1) % every == 0] for i in range(n_layers)]
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            model["positional"]["nope_layers"] = full
        if sliding and isinstance(size, int | float) and 1 <= size < context(config):
            model["window"] = {"size": int(size)} | ({} if len(sliding) == n_layers else {"layers": sliding})
        return sources
