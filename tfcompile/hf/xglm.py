"""XGLM (``XGLMForCausalLM``): fairseq's decoder (OPT's pre-LayerNorm blocks, biases on every
projection, a final norm), token embeddings multiplied by sqrt(d_model) (``scale_embedding``, true
by default) and fixed sinusoids: tensor2tensor's frequencies, the sines then the cosines, position
p encoded as p + 2 (``positional: {type: sinusoidal, layout: halves, spacing: tensor2tensor,
offset: 2}``). Every LayerNorm is nn.LayerNorm's default (epsilon 1e-5).

XGLM zeroes its table's row ``pad_token_id``, and row p + 2 encodes position p: a pad id from 2 to
max_position_embeddings + 1 (or one counted from the end that lands there) takes a position's
encoding away, and is refused (on import; on export, the run's pad id). transformers' forward
numbers positions by column (generate() passes them counted from the mask), tfcompile by the
tokens the mask marks real: the same but for left padding outside generate(). export-hf writes
as XGLM a decoder LM of those sinusoids."""

from __future__ import annotations

from typing import Any, ClassVar

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
    lm_head,
    pad_within,
    register,
)
from tfcompile.hf.errors import Problem
from tfcompile.hf.opt import (
    EPS,
    OFFSET,
    fairseq_needs,
    read_fairseq_lm,
    warn_of_layerdrop,
    written_fairseq_lm,
)
from tfcompile.spec import Spec
from tfcompile.spec.schema import CausalLMTask, DecoderSpec, SinusoidalPositional

HEAD = "XGLMForCausalLM"
POSITIONS = {"type": "sinusoidal", "layout": "halves", "spacing": "tensor2tensor", "offset": OFFSET}


def pad_problem(pad: Any, max_seq_len: int) -> str | None:
    """Why XGLM cannot take ``pad`` as its pad_token_id, or None where it can: its position table
    (max_seq_len + 2 rows, row p + 2 encoding position p) zeroes the pad id's row (counted from the
    end where negative), which must be row 0 or 1."""
    if not isinstance(pad, int) or isinstance(pad, bool):
        return None
    rows = max_seq_len + OFFSET
    if not -rows <= pad < rows:
        return (
            f"is {pad}, past XGLM's position table of max_position_embeddings + 2 ({rows}) rows, whose "
            f"row {pad} it zeroes: transformers fails to build the model"
        )
    row = pad % rows
    if row >= OFFSET:
        return f"is {pad}: XGLM zeroes its position table's row {row}, which encodes position {row - OFFSET}"
    return None


def sinusoidal_decoder_lm(spec: Spec) -> DecoderSpec | None:
    """The spec's model where it is a decoder LM with fixed sinusoids (which XGLM writes), else None."""
    model = spec.model
    if isinstance(model, DecoderSpec) and isinstance(spec.task, CausalLMTask):
        return model if isinstance(model.positional, SinusoidalPositional) else None
    return None


@register("xglm")
class XGLM(Writable):
    prefixes = ("model.",)
    ignored = ("embed_positions.weights",)  # the sinusoids, in older checkpoints (transformers computes them)
    # XGLMConfig's attribute_map: the names it reads its sizes under, over its own
    aliases: ClassVar[dict[str, str]] = {
        "num_attention_heads": "attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "num_layers",
    }
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "d_model",
        "model.n_layers": "num_layers",
        "model.n_heads": "attention_heads",
        "model.d_ff": "ffn_dim",
        "model.activation": "activation_function",
        "model.dropout.embedding": "dropout",
        "model.dropout.residual": "dropout",
        "model.dropout.attention": "attention_dropout",
        "model.init_std": "init_std",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture == HEAD,
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            f"import an {HEAD}",
        )
        config.require(
            not config.get("add_cross_attention", False),
            "add_cross_attention",
            "is true: each block attends to an encoder's states, which a decoder LM has none of",
            "import an XGLM without cross-attention",
        )
        warn_of_layerdrop(config)
        vocab, length = config.get("vocab_size", 256008), config.get("max_position_embeddings", 2048)
        pad_within(config.filled({}, nullable={"pad_token_id": 1}), vocab)
        problem = pad_problem(config.data.get("pad_token_id", 1), length) if isinstance(length, int) else None
        config.require(
            problem is None, "pad_token_id", str(problem), "0 or 1 (its table's first rows), or null"
        )
        residual = config.get("dropout", 0.1)
        model: dict[str, Any] = {
            "family": "decoder",
            "vocab_size": vocab,
            "max_seq_len": length,
            "d_model": config.get("d_model", 1024),
            "n_layers": config.get("num_layers", 24),
            "n_heads": config.get("attention_heads", 16),
            "d_ff": config.get("ffn_dim", 4096),
            "activation": config.choice("activation_function", "gelu", ACTIVATIONS, "activation"),
            "positional": POSITIONS,
            "norm": {"position": "pre", "type": "layernorm", "eps": EPS},
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
            "scale_embeddings": bool(config.get("scale_embedding", True)),
            "tie_embeddings": lm_head(
                config, tensors, architecture, ("lm_head.weight", "embed_tokens.weight"), True, HEAD
            ),
            "dropout": {
                "embedding": dropout(residual),
                "attention": dropout(config.get("attention_dropout", 0.1)),
                "residual": dropout(residual),
            },
            # XGLM names initializer_range init_std
            "init_std": init_std(Config({"initializer_range": config.get("init_std", 0.02)})),
        }
        return Imported(model, {"type": "causal_lm", "special_tokens": False})

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        return read_fairseq_lm(tensors, model, "lm_head.weight")  # its sinusoids hold no tensor

    def candidate(self, spec: Spec) -> bool:
        return sinusoidal_decoder_lm(spec) is not None

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, DecoderSpec) and isinstance(model.positional, SinusoidalPositional)
        need = Needs("XGLM")
        positional = model.positional
        need(positional.layout == "halves", "model.positional.layout", positional.layout, "halves")
        need(
            positional.spacing == "tensor2tensor",
            "model.positional.spacing",
            positional.spacing,
            "tensor2tensor",
        )
        need(positional.offset == OFFSET, "model.positional.offset", positional.offset, f"{OFFSET}")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        fairseq_needs(need, model, "dropout")
        return need.problems

    def token_problems(self, spec: Spec, tokens: dict[str, int]) -> list[Problem]:
        """The run's pad id, XGLM's pad_token_id, must leave every position its encoding."""
        model = spec.model
        assert isinstance(model, DecoderSpec)
        problem = pad_problem(tokens.get("pad"), model.max_seq_len)
        return (
            [] if problem is None else [Problem("tokens.pad", problem, "a pad token of id 0 or 1, or none")]
        )

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        return {
            "architectures": [HEAD],
            "model_type": "xglm",
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_seq_len,
            "d_model": model.d_model,
            "num_layers": model.n_layers,
            "attention_heads": model.n_heads,
            "ffn_dim": model.d_ff,
            "activation_function": EXPORTED_ACTIVATIONS[model.activation],
            "scale_embedding": model.scale_embeddings,
            "dropout": model.dropout.residual,
            "attention_dropout": model.dropout.attention,
            "activation_dropout": 0.0,
            "layerdrop": 0.0,
            "init_std": model.init_std,
            "add_cross_attention": False,
            "tie_word_embeddings": model.tie_embeddings,
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, DecoderSpec)
        return contiguous(written_fairseq_lm(state, model, "model.", "lm_head.weight"))
