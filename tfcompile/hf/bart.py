"""BART's encoder-decoder and the model types built on its code: Marian (``MarianMTModel``, the
Opus-MT translators), Pegasus (``PegasusForConditionalGeneration``), BART
(``BartForConditionalGeneration``), mBART (``MBartForConditionalGeneration``) and M2M100
(``M2M100ForConditionalGeneration``: M2M100 and NLLB-200). Each is one encoder-decoder of
LayerNorms (epsilon 1e-5, a config has no field for it) and biases on every projection, whose head
adds ``final_logits_bias`` where the checkpoint holds one (the spec's ``bias.lm_head``); they differ
in three choices, which the model type fixes:

============  ==========================================  ====================  ==============
model type    positions                                   norms                 embedding norm
============  ==========================================  ====================  ==============
marian        sinusoidal, sines then cosines (``halves``)  post                  none
pegasus       sinusoidal, ``halves``                       pre, a final norm     none
bart          learned, two unused rows in front            post                  one per stack
mbart         learned, two unused rows in front            pre, a final norm     one per stack
m2m_100       sinusoidal, ``halves``, tensor2tensor's      pre, a final norm     none
              frequencies, from pad id + 1
============  ==========================================  ====================  ==============

(M2M100 numbers the tokens that are not the pad id from pad id + 1, tfcompile the tokens its mask
marks real: the same but for a real token that is the pad id, the text "<pad>" itself.)

The rest is the config's: sizes (the encoder's and the decoder's heads and feed-forward width must
agree: the spec's stacks share them), ``activation_function``, ``scale_embedding`` (sqrt(d_model)),
Marian's ``share_encoder_decoder_embeddings``; each stack's table and the head are the ones
transformers 5 ties as ``tables`` says. Layer drop and the dropout inside the feed-forward act in
training only and are not read. export-hf writes each from a translator with these choices (the
sinusoidal ones in the halves layout; M2M100 where the run's pad id is the offset - 1, and padding
alone: no other role's token, nor the decoder's start)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

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
    pad_within,
    register,
    zeros_if_none,
)
from tfcompile.hf.errors import HFError, HFWarning, Problem
from tfcompile.nn.positional import sinusoidal_table
from tfcompile.spec import Spec
from tfcompile.spec.schema import EncoderDecoderSpec, LearnedPositional, Seq2SeqTask, SinusoidalPositional

EPS = 1e-5  # nn.LayerNorm's default, every norm's
OFFSET = 2  # BART's learned positions start at this row
BIAS = "final_logits_bias"
SHARED = "shared.weight"  # the table the stacks and the head tie to (but Marian's without one)
STACK_TABLES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


@dataclass(frozen=True)
class Kind:
    """What a model type fixes: its head class, positions, norm position and embedding norms."""

    head: str
    positions: Literal["sinusoidal", "learned", "tensor2tensor"]  # the last: M2M100's, from pad id + 1
    norm: Literal["pre", "post"]
    embedding_norm: bool
    vocab_size: int  # the config class's defaults
    pad_token_id: int
    activation: str = "gelu"
    scale_embedding: bool = False
    attention_dropout: float = 0.0
    logits_bias: bool = True  # a final_logits_bias (M2M100 has none)
    forced_eos: int | None = 2  # the config class's forced_eos_token_id (M2M100's has none)


KINDS = {
    "marian": Kind("MarianMTModel", "sinusoidal", "post", False, 58101, 58100, forced_eos=0),
    "pegasus": Kind("PegasusForConditionalGeneration", "sinusoidal", "pre", False, 50265, 0, forced_eos=1),
    "bart": Kind("BartForConditionalGeneration", "learned", "post", True, 50265, 1),
    "mbart": Kind("MBartForConditionalGeneration", "learned", "pre", True, 50265, 1),
    "m2m_100": Kind(
        "M2M100ForConditionalGeneration",
        "tensor2tensor",
        "pre",
        False,
        128112,
        1,
        "relu",
        True,
        0.1,
        False,
        None,
    ),
}
# transformers' q, k and v projections (tfcompile's packed qkv, and cross-attention's q and kv)
QKV = ("q_proj", "k_proj", "v_proj")
# tfcompile's names within a block -> transformers' (each a weight and a bias)
LAYER = (
    ("attn_norm", "self_attn_layer_norm"),
    ("attn.out", "self_attn.out_proj"),
    ("ffn_norm", "final_layer_norm"),
    ("ffn.w_in", "fc1"),
    ("ffn.w_out", "fc2"),
)
CROSS = (("cross_norm", "encoder_attn_layer_norm"), ("cross.out", "encoder_attn.out_proj"))


@register("marian", "pegasus", "bart", "mbart", "m2m_100")
class Bart(Writable):
    prefixes = ("model.",)
    # fairseq's, in older BART checkpoints; M2M100's fixed table, in older ones (5 computes its own)
    ignored = (".version", "embed_positions.weights")
    # the attribute_map the four config classes share
    aliases: ClassVar[dict[str, str]] = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "encoder_layers",
    }
    sources: ClassVar[dict[str, str]] = {
        "model.vocab_size": "vocab_size",
        "model.max_seq_len": "max_position_embeddings",
        "model.d_model": "d_model",
        "model.n_layers": "encoder_layers",
        "model.n_decoder_layers": "decoder_layers",
        "model.n_heads": "encoder_attention_heads",
        "model.d_ff": "encoder_ffn_dim",
        "model.activation": "activation_function",
        "model.dropout.embedding": "dropout",
        "model.dropout.residual": "dropout",
        "model.dropout.attention": "attention_dropout",
        "model.init_std": "init_std",
        "model.positional.offset": "pad_token_id",  # M2M100's positions start at pad id + 1
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        model_type = config.data["model_type"]
        kind = KINDS[model_type]
        config.require(
            architecture == kind.head,
            "architectures",
            f"{architecture} is not a sequence-to-sequence model tfcompile has",
            f"import a {kind.head}",
        )
        # is_encoder_decoder changes generate() alone: the four classes compute the same without it
        config.refuse_true("is_decoder", why="a decoder alone is not a sequence-to-sequence model")
        vocab = config.get("vocab_size", kind.vocab_size)
        pad_within(config.filled({}, nullable={"pad_token_id": kind.pad_token_id}), vocab)
        pad = config.data.get("pad_token_id", kind.pad_token_id)  # null: none (M2M100 fails on it)
        skips_pad = kind.positions == "tensor2tensor"  # M2M100's positions skip the pad id
        rows = config.get("max_position_embeddings", 1024)
        rows = rows + 2 if isinstance(rows, int) else 0  # M2M100's table, whose pad row it zeroes
        has_pad = isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < rows
        config.require(
            not skips_pad or has_pad,
            "pad_token_id",
            f"is {pad!r}: M2M100 numbers positions from the pad id + 1 and zeroes its row of a table of "
            f"max_position_embeddings + 2 ({rows}) rows (transformers fails without one, or past it)",
            "name the tokenizer's pad id",
        )
        start = config.get("decoder_start_token_id", 2)  # M2M100Config's: its eos
        config.require(
            not skips_pad or start != pad,
            "decoder_start_token_id",
            f"is the pad id ({pad!r}), which M2M100 gives no position (a row of zeros) where tfcompile's "
            "decoder starts its positions",
            "import a model whose decoder starts with another token (M2M100's: </s>)",
        )
        heads, d_ff = config.get("encoder_attention_heads", 16), config.get("encoder_ffn_dim", 4096)
        for field, value, default in (
            ("decoder_attention_heads", heads, 16),
            ("decoder_ffn_dim", d_ff, 4096),
        ):
            found = config.get(field, default)
            config.require(
                found == value,
                field,
                f"{found!r} differs from the encoder's {value!r}: tfcompile's encoder and decoder have the "
                "same heads and feed-forward width",
                "import a model whose two stacks have the same sizes",
            )
        if model_type == "marian" and not config.get("share_encoder_decoder_embeddings", True):
            decoder_vocab = config.get("decoder_vocab_size", vocab)  # the decoder's own table's rows
            config.require(
                decoder_vocab == vocab,
                "decoder_vocab_size",
                f"{decoder_vocab!r} differs from vocab_size {vocab!r}: tfcompile's source and target "
                "share one vocabulary",
                "import a model of one vocabulary",
            )
        if not config.get("tie_word_embeddings", True):  # transformers 5 then ties no table to another
            for name in (*STACK_TABLES, "lm_head.weight"):
                config.require(
                    name in tensors,
                    "tie_word_embeddings",
                    f"is false and the checkpoint holds no {name}: transformers 5 draws it at random",
                    "import the checkpoint its config.json came with",
                )
        source, target, head = tables(tensors)
        if SHARED in tensors and not source == target == SHARED:
            warnings.warn(
                HFWarning(
                    f"the checkpoint's {'encoder' if source != SHARED else 'decoder'} embeddings are not its "
                    "shared table: transformers 5 computes with them, as the import does, and transformers 4 "
                    "with the shared table"
                ),
                stacklevel=2,
            )
        model: dict[str, Any] = {
            "family": "encoder_decoder",
            "vocab_size": vocab,
            "max_seq_len": config.get("max_position_embeddings", 1024),
            "d_model": config.get("d_model", 1024),
            "n_layers": config.get("encoder_layers", 12),
            "n_decoder_layers": config.get("decoder_layers", 12),
            "n_heads": heads,
            "d_ff": d_ff,
            "activation": config.choice("activation_function", kind.activation, ACTIVATIONS, "activation"),
            "positional": positional(kind, pad),
            "norm": {"position": kind.norm, "type": "layernorm", "eps": EPS},
            "embedding_norm": kind.embedding_norm,
            "bias": {"qkv": True, "attn_out": True, "ffn": True, "lm_head": BIAS in tensors},
            "share_embeddings": source == target or tensors.same(source, target),
            "tie_embeddings": head == target or tensors.same(head, target),
            "scale_embeddings": config.get("scale_embedding", kind.scale_embedding),
            "dropout": {
                "embedding": dropout(config.get("dropout", 0.1)),
                "residual": dropout(config.get("dropout", 0.1)),
                "attention": dropout(config.get("attention_dropout", kind.attention_dropout)),
            },
            "init_std": init_std(config),
        }
        # every tokenizer of the four ends a source with </s> (mBART's then adds a language code)
        skipped = pad if skips_pad and has_pad else None
        return Imported(
            model,
            {"type": "seq2seq", "source_suffix": ["eos"]},
            decoder_start=True,
            pad_positions=skipped,
            forced_eos=kind.forced_eos,
        )

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        source, target, head = tables(tensors)
        state = {
            "embed.weight": tensors.take(source),
            "target_embed.weight": tensors.take(target),
            "lm_head.weight": tensors.take(head),
        }
        for name in (SHARED, *STACK_TABLES, "lm_head.weight"):
            tensors.maybe(name)  # copies of those, or a shared table no stack reads
        if model.bias.lm_head:
            state["lm_head.bias"] = tensors.take(BIAS).reshape(-1)
        for stack in ("encoder", "decoder"):
            state |= positions(tensors, stack, model)
            if model.embedding_norm:
                for kind in ("weight", "bias"):
                    state[f"{stack}_embed_norm.{kind}"] = tensors.take(f"{stack}.layernorm_embedding.{kind}")
            if model.norm.final:
                for kind in ("weight", "bias"):
                    state[f"{stack}_norm.{kind}"] = tensors.take(f"{stack}.layer_norm.{kind}")
        for h, b, cross in _layers(model):
            for kind in ("weight", "bias"):
                names = (f"{h}self_attn.{x}.{kind}" for x in QKV)
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(*names)
                for tfc, hf in LAYER + (CROSS if cross else ()):
                    state[f"{b}{tfc}.{kind}"] = tensors.take(f"{h}{hf}.{kind}")
                if cross:
                    state[f"{b}cross.q.{kind}"] = tensors.take(f"{h}encoder_attn.q_proj.{kind}")
                    kv = (f"{h}encoder_attn.{x}_proj.{kind}" for x in "kv")
                    state[f"{b}cross.kv.{kind}"] = tensors.cat(*kv)
        return state

    def candidate(self, spec: Spec) -> bool:
        """A translator of sinusoidal or learned positions (T5 writes the others)."""
        return (
            isinstance(spec.model, EncoderDecoderSpec)
            and isinstance(spec.task, Seq2SeqTask)
            and isinstance(spec.model.positional, SinusoidalPositional | LearnedPositional)
        )

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        model_type = kind_of(model)
        kind = KINDS[model_type]
        need = Needs(kind.head)
        positional = model.positional
        if isinstance(positional, SinusoidalPositional):
            need(positional.layout == "halves", "model.positional.layout", positional.layout, "halves")
            if kind.positions == "tensor2tensor":  # from the pad id + 1: token_problems checks it
                need(positional.offset >= 1, "model.positional.offset", positional.offset, "the pad id + 1")
            else:
                need(positional.offset == 0, "model.positional.offset", positional.offset, "0")
        need(
            model.norm.position == kind.norm,
            "model.norm.position",
            model.norm.position,
            f"{kind.norm}, as {kind.head} ({positional.type} positions) has it",
        )
        need(
            not model.bias.lm_head or kind.logits_bias,
            "model.bias.lm_head",
            True,
            f"false: {kind.head} has no bias on its head",
        )
        need(
            model.embedding_norm == kind.embedding_norm,
            "model.embedding_norm",
            model.embedding_norm,
            f"{str(kind.embedding_norm).lower()}, as {kind.head} ({positional.type} positions, "
            f"{kind.norm}-norm) has it",
        )
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.eps == EPS, "model.norm.eps", model.norm.eps, f"{EPS} (nn.LayerNorm's)")
        need(
            model.norm.final == (kind.norm == "pre"),
            "model.norm.final",
            model.norm.final,
            f"{str(kind.norm == 'pre').lower()}: {kind.head} ({kind.norm}-norm)",
        )
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need(
            model.activation in EXPORTED_ACTIVATIONS,
            "model.activation",
            model.activation,
            f"one of {sorted(EXPORTED_ACTIVATIONS)} (no gated feed-forward)",
        )
        need(
            model.share_embeddings or model_type == "marian",
            "model.share_embeddings",
            False,
            "true (only Marian has a table per stack, and Marian's positions are sinusoidal)",
        )
        # the head's bias (final_logits_bias), the embeddings' scale and norm are written as they are
        # (a head bias checked above)
        written = {"bias": model.bias.model_copy(update={"lm_head": False}), "scale_embeddings": False}
        need.plain_attention(model.model_copy(update=written | {"embedding_norm": False}))
        return need.problems

    def token_problems(self, spec: Spec, tokens: dict[str, int]) -> list[Problem]:
        """M2M100 numbers the tokens that are not its pad id from the pad id + 1 (the spec's offset),
        and zeroes the pad id's row of a table of max_position_embeddings + 2 rows: the run's pad
        id must be the offset - 1, within the table, and no other role's (the decoder's start, an
        eos that ends every source), which M2M100 would give no position."""
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        positional = model.positional
        if kind_of(model) != "m2m_100" or not isinstance(positional, SinusoidalPositional):
            return []
        pad = tokens.get("pad")
        if pad is None:
            return [
                Problem("tokens.pad", "is none: M2M100 numbers positions from its pad id + 1", "name one")
            ]
        problems = []
        if positional.offset != pad + 1:
            message = (
                f"is {positional.offset}: M2M100 numbers positions from the pad id + 1, the run's {pad + 1}"
            )
            problems.append(Problem("model.positional.offset", message, f"{pad + 1}"))
        if pad >= model.max_seq_len + 2:
            message = f"is {pad}, past M2M100's table of max_seq_len + 2 ({model.max_seq_len + 2}) rows"
            problems.append(Problem("tokens.pad", message, "a pad token of a lower id"))
        for role, other in tokens.items():
            if role != "pad" and other == pad:
                message = f"is also the run's {role} token ({pad}), which M2M100 would give no position"
                problems.append(Problem("tokens.pad", message, "a pad token that is padding alone"))
        return problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        model_type = kind_of(model)
        config = {
            "architectures": [KINDS[model_type].head],
            "model_type": model_type,
            "vocab_size": model.vocab_size,
            "max_position_embeddings": model.max_seq_len,
            "d_model": model.d_model,
            "encoder_layers": model.n_layers,
            "decoder_layers": model.n_decoder_layers,
            "encoder_attention_heads": model.n_heads,
            "decoder_attention_heads": model.n_heads,
            "encoder_ffn_dim": model.d_ff,
            "decoder_ffn_dim": model.d_ff,
            "activation_function": EXPORTED_ACTIVATIONS[model.activation],
            "scale_embedding": model.scale_embeddings,
            "dropout": model.dropout.residual,
            "attention_dropout": model.dropout.attention,
            "activation_dropout": 0.0,
            "init_std": model.init_std,
            "tie_word_embeddings": model.tie_embeddings,
            "is_encoder_decoder": True,
        }
        if model_type == "marian":
            config["decoder_vocab_size"] = model.vocab_size
            config["share_encoder_decoder_embeddings"] = model.share_embeddings
        return config

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, EncoderDecoderSpec)
        p = "model."
        if model.share_embeddings:
            out = {f"{p}shared.weight": state["embed.weight"]}
            if not model.tie_embeddings:  # transformers 5 then ties no table to another: each stack's too
                out |= {f"{p}{name}": state["embed.weight"].clone() for name in STACK_TABLES}
        else:
            out = {
                f"{p}encoder.embed_tokens.weight": state["embed.weight"],
                f"{p}decoder.embed_tokens.weight": state["target_embed.weight"],
            }
        if not model.tie_embeddings:
            out["lm_head.weight"] = state["lm_head.weight"]
        written = KINDS[kind_of(model)]
        if written.logits_bias:
            out[BIAS] = part(state, "lm_head", "bias")[None, :]
        for stack in ("encoder", "decoder"):
            if isinstance(model.positional, LearnedPositional):
                table = state[f"{stack}_positional.table.weight"]  # after BART's two unused rows
                unused = torch.zeros(OFFSET, model.d_model)
                out[f"{p}{stack}.embed_positions.weight"] = torch.cat((unused, table))
            elif written.positions == "sinusoidal":  # the fixed table (Pegasus's loading reports it missing)
                out[f"{p}{stack}.embed_positions.weight"] = sinusoidal_table(
                    model.max_seq_len, model.d_model, "halves"
                )
            for kind in ("weight", "bias"):
                if model.embedding_norm:
                    out[f"{p}{stack}.layernorm_embedding.{kind}"] = part(state, f"{stack}_embed_norm", kind)
                if model.norm.final:
                    out[f"{p}{stack}.layer_norm.{kind}"] = part(state, f"{stack}_norm", kind)
        for h, b, cross in _layers(model, p):
            for kind in ("weight", "bias"):
                qkv = part(state, f"{b}attn.qkv", kind).chunk(3)
                out |= {f"{h}self_attn.{x}.{kind}": t for x, t in zip(QKV, qkv, strict=True)}
                for tfc, hf in LAYER + (CROSS if cross else ()):
                    out[f"{h}{hf}.{kind}"] = part(state, f"{b}{tfc}", kind)
                if cross:
                    out[f"{h}encoder_attn.q_proj.{kind}"] = part(state, f"{b}cross.q", kind)
                    k, v = part(state, f"{b}cross.kv", kind).chunk(2)
                    out |= {f"{h}encoder_attn.k_proj.{kind}": k, f"{h}encoder_attn.v_proj.{kind}": v}
        return contiguous(out)


def tables(tensors: Tensors) -> tuple[str, str, str]:
    """The tensors transformers 5 computes with as the encoder's embeddings, the decoder's and the
    head. Each is tied to the shared table (Marian's head without one: to the decoder's) unless the
    checkpoint holds one of its own that differs from it: transformers then unties the pair (and
    with tie_word_embeddings false ties nothing: ``read`` refuses a table missing then)."""
    source, target = (own(tensors, name, SHARED) for name in STACK_TABLES)
    return source, target, own(tensors, "lm_head.weight", SHARED if SHARED in tensors else target)


def own(tensors: Tensors, name: str, tied_to: str) -> str:
    """``name`` where the checkpoint holds it and it differs from ``tied_to``, else ``tied_to``
    (``name`` where neither is held: a missing tensor)."""
    if name in tensors and not tensors.same(name, tied_to):
        return name
    return tied_to if tied_to in tensors else name


def kind_of(model: EncoderDecoderSpec) -> str:
    """The model type export-hf writes a translator as: its positions and norm position decide
    (tensor2tensor's frequencies: M2M100's alone)."""
    sinusoidal = isinstance(model.positional, SinusoidalPositional)
    if isinstance(model.positional, SinusoidalPositional) and model.positional.spacing == "tensor2tensor":
        return "m2m_100"
    pre = model.norm.position == "pre"
    return {(True, False): "marian", (True, True): "pegasus", (False, False): "bart", (False, True): "mbart"}[
        (sinusoidal, pre)
    ]


def positions(tensors: Tensors, stack: str, model: EncoderDecoderSpec) -> State:
    """A stack's position table: BART's learned rows after its two unused ones; Marian's and
    Pegasus's fixed table, which older checkpoints saved (transformers then computes with the
    saved one, which must be the formula's)."""
    name = f"{stack}.embed_positions.weight"
    if isinstance(model.positional, LearnedPositional):
        table = tensors.take(name)
        if table.shape != (model.max_seq_len + OFFSET, model.d_model):
            raise HFError(
                f"{tensors.where}: {name} has shape {tuple(table.shape)}, not max_position_embeddings + "
                f"{OFFSET} rows of d_model: is config.json the checkpoint's own?"
            )
        return {f"{stack}_positional.table.weight": table[OFFSET:]}
    saved = tensors.maybe(name)
    if saved is not None:
        table = sinusoidal_table(model.max_seq_len, model.d_model, "halves")  # Marian's and Pegasus's
        if saved.shape != table.shape or not torch.allclose(saved.float(), table, atol=1e-6, rtol=0):
            raise HFError(
                f"{tensors.where}: {name} is not the sinusoidal table of max_position_embeddings "
                f"({model.max_seq_len}) x d_model ({model.d_model}) that transformers computes, and "
                "transformers reads the one saved: tfcompile's table is fixed"
            )
    return {}


def positional(kind: Kind, pad: Any) -> dict[str, Any]:
    """The model type's positions: learned (BART's table), sinusoidal in halves (Marian's and
    Pegasus's), or M2M100's tensor2tensor frequencies from the pad id + 1."""
    if kind.positions == "learned":
        return {"type": "learned"}
    sinusoidal = {"type": "sinusoidal", "layout": "halves"}
    if kind.positions == "sinusoidal":
        return sinusoidal
    offset = pad + 1 if isinstance(pad, int) else 0  # else refused (pad_token_id)
    return sinusoidal | {"spacing": "tensor2tensor", "offset": offset}


def init_std(config: Config) -> float:
    """``model.init_std`` from ``init_std`` (initialisation only: one the spec cannot hold is 0.02)."""
    value = config.get("init_std", 0.02)
    return float(value) if isinstance(value, int | float) and value > 0 else 0.02


def part(state: State, name: str, kind: str) -> torch.Tensor:
    """A layer's weight, or its bias: zeros where the run has none, which is exact."""
    weight = state[f"{name}.weight"]
    return weight if kind == "weight" else zeros_if_none(state.get(f"{name}.bias"), weight.shape[0])


def _layers(model: EncoderDecoderSpec, prefix: str = "") -> Iterator[tuple[str, str, bool]]:
    """Each block's prefix in transformers' names (after ``prefix``) and in tfcompile's, and
    whether it cross-attends (the decoder's)."""
    stacks = (("encoder", model.n_layers, False), ("decoder", model.n_decoder_layers or 0, True))
    for stack, count, cross in stacks:
        for i in range(count):
            yield f"{prefix}{stack}.layers.{i}.", f"{stack}_blocks.{i}.", cross
