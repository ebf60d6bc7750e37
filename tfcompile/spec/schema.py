"""The spec schema: one Pydantic model per section, variants as discriminated unions on ``type``.

A validated spec is frozen and explicit: defaults that depend on other fields (``d_ff``,
``n_kv_heads``, norm bias, final norm, the training context, ...) are resolved while it validates,
so a saved copy rebuilds the same model and a reader never has to guess what a null means.
Cross-field rules report each violation at the field to fix (see ``Rules``).

Tasks are an open set: ``register_task_section`` adds a task's section to the ``task:`` union
(tfcompile.tasks registers the built-in ones' behaviour; a test registers its own task). This
module imports no torch, so that checking a spec is fast.
"""

from __future__ import annotations

import collections
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from tfcompile.manifest import (
    DEFAULT_LENGTH_PENALTY,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    MAX_BANNED_SEQUENCE,
    MAX_BANNED_SEQUENCES,
    MAX_BEAM,
    MAX_LENGTH_PENALTY,
    MAX_NEW_TOKENS,
    MAX_STOP_TOKENS,
    MAX_SUPPRESSED_TOKENS,
    REPETITION_PENALTIES,
    BeamScoringName,
    EarlyStopping,
)
from tfcompile.sequences import CAUSAL_LM_TOKENS, CLS, SEQ2SEQ_TOKENS, SPECIAL_ROLES, SPECIAL_TOKENS
from tfcompile.spec.choices import GATED, ActivationName, NormName

# Integers are strict (YAML `true` or "4" is an error, not 1 or 4); floats stay lax because YAML 1.1
# reads 1e-5 (no dot) as a string.
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0)]
Probability = Annotated[float, Field(ge=0, lt=1)]
# Choices that building blocks register: adding one to its registry makes it valid here.


def _bound(outside: Callable[[float], bool], words: str, bound: float, why: str) -> AfterValidator:
    """A number field's bound: a value ``outside`` it is a ``spec_bound`` error, which the loader
    reports at the value with ``why`` (what the bound is for) as the hint."""

    def shown(number: float) -> str:
        return f"{number:,}" if isinstance(number, int) else f"{number:g}"

    def check(value: float) -> float:
        if outside(value):
            raise PydanticCustomError(
                "spec_bound",
                f"must be {words} {{bound}}, found {{found}}",
                {"bound": shown(bound), "found": shown(value), "hint": why},
            )
        return value

    return AfterValidator(check)


def at_most(bound: float, why: str) -> AfterValidator:
    return _bound(lambda value: value > bound, "at most", bound, why)


def at_least(bound: float, why: str) -> AfterValidator:
    return _bound(lambda value: value < bound, "at least", bound, why)


# float32's smallest normal number (1.18e-38), rounded down: an eps below it is 0 or a subnormal there
TINY_EPS = 1e-38


# Sizes far past any model trained today (Llama 3.1 405B: d_model 16,384, d_ff 53,248, 126 layers,
# 128 heads; vocabularies of about 256,000). A larger value is a typo, and would overflow a count or
# take minutes to summarise. Contexts go to 2^30, past LongNet's billion tokens: the T x T attention
# scores of a longer one overflow 64-bit sizes, even on the meta device.
MAX_WIDTH = 1 << 16
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_SEQ_LEN = 1 << 30
MAX_BYTES = (1 << 63) - 1  # the largest size in bytes of one tensor (a 64-bit count)
MAX_VOCAB = 1 << 24
MAX_VOCAB_MULTIPLE = 4096
MAX_IMAGE_SIZE = 8192
MAX_CHANNELS = 1024
BEYOND = "the bound is far past any model trained today: Llama 3.1 405B has {}"
VOCABULARIES = "the largest vocabularies in use have about 256,000 tokens"
Width = Annotated[PositiveInt, at_most(MAX_WIDTH, BEYOND.format("d_model 16,384 and head_dim 128"))]
FeedForward = Annotated[PositiveInt, at_most(4 * MAX_WIDTH, BEYOND.format("d_ff 53,248"))]
Depth = Annotated[
    PositiveInt, at_most(MAX_LAYERS, BEYOND.format("126 layers (DeepNet trained 1,000 to show it could)"))
]
Heads = Annotated[PositiveInt, at_most(MAX_HEADS, BEYOND.format("128 heads"))]
VocabSize = Annotated[PositiveInt, at_most(MAX_VOCAB, VOCABULARIES)]
BYTES = 256  # the tokens a byte-level BPE begins with
TokenizerVocab = Annotated[int, Field(strict=True, ge=32), at_most(MAX_VOCAB, VOCABULARIES)]  # trained
# A seed is stored as a signed 64-bit integer (torch's generators refuse 2^64 and up); numpy's take
# no negative one.
MAX_SEED = (1 << 63) - 1
Seed = Annotated[
    int, Field(strict=True, ge=0), at_most(MAX_SEED, "a seed is a signed 64-bit integer: below 2^63")
]
# Threads for PyTorch's CPU operators: torch crashes past some tens of thousands; the largest
# machines have a few hundred cores. A fixed bound keeps a spec valid on every machine.
MAX_THREADS = 1024
MAX_STEPS = 10**9  # a run's steps: 12 days at a millisecond a step, years at a real model's pace
Threads = Annotated[
    PositiveInt,
    at_most(
        MAX_THREADS,
        "torch crashes when asked for tens of thousands, and the largest machines have a few hundred "
        "cores; the bound does not depend on this machine, so a spec is valid on every one",
    ),
]


class Section(BaseModel):
    # Floats are finite: YAML's .inf and .nan are refused wherever a number is meant.
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        """YAML 1.1 reads yes, no, on and off as booleans, which Pydantic takes for 1.0 and 0.0 in a
        field of decimals (``lr: yes`` trained at a learning rate of 1): passed on as a
        BooleanNotNumber there, which it refuses (as a field of whole numbers refuses booleans)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            name: _boolean_not_number(fields[name].annotation, value) if name in fields else value
            for name, value in data.items()
        }

    @model_validator(mode="before")
    @classmethod
    def _default_variant(cls, data: Any) -> Any:
        """A section written without its ``type`` where the field's default is a variant of one
        (``schedule: {warmup_steps: 10}``, or --set train.schedule.warmup_steps=10 beside no
        schedule) is of the default's type where that has all its fields, as a section of one
        class changes its default's; else its ``type`` is missing (and the hint names the variant
        with those fields)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            default = cls.model_fields[name].default if name in cls.model_fields else None
            if not isinstance(value, dict) or "type" in value or not isinstance(default, BaseModel):
                continue
            fields = type(default).model_fields
            if "type" in fields and set(value) <= set(fields):
                out[name] = {"type": default.type, **value}  # type: ignore[attr-defined]
        return out

    def _resolve(self, **values: Any) -> None:
        """Fill derived defaults while validating (the section is frozen once validated)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)


class BooleanNotNumber:
    """A YAML boolean where a field takes a number and no boolean: no number to Pydantic."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return str(self.value).lower()  # as YAML writes it


def _boolean_not_number(annotation: Any, value: Any) -> Any:
    """``value`` with each boolean where ``annotation`` takes a number and no boolean (the field's
    own value, or an item of its list or tuple: ``betas: [0.9, no]``) a BooleanNotNumber."""
    leaves = _leaves(annotation)
    if isinstance(value, bool):
        return BooleanNotNumber(value) if float in leaves and bool not in leaves else value
    if isinstance(value, list | tuple):
        for leaf in leaves:
            items = typing.get_args(leaf)
            if typing.get_origin(leaf) in (list, tuple) and items:
                shape = items[:1] * len(value) if len(items) == 1 or items[1:] == (...,) else items
                return [_boolean_not_number(a, v) for a, v in zip(shape, value, strict=False)] + list(
                    value[len(shape) :]
                )
    return value


def _leaves(annotation: Any) -> list[Any]:
    """The types an annotation is made of, through unions, Optional and Annotated."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _leaves(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


class Rules:
    """Collects cross-field rule violations; ``check`` raises one error that the loader expands
    into one report per violation, each at its own field."""

    def __init__(self) -> None:
        self.violations: list[tuple[tuple[str, ...], str, str]] = []

    def require(self, ok: bool, field: tuple[str, ...], message: str, hint: str | Callable[[], str]) -> None:
        """``hint`` may be a function, computed only when the rule fails."""
        if not ok:
            self.violations.append((field, message, hint() if callable(hint) else hint))

    def check(self) -> None:
        if self.violations:
            summary = "; ".join(f"{'.'.join(f)}: {m}" for f, m, _ in self.violations)
            raise PydanticCustomError("spec_rule", summary, {"violations": self.violations})


def require_distinct(rules: Rules, layers: Sequence[int], field: tuple[str, ...]) -> None:
    """Each layer of a list of layers named once."""
    repeated = sorted(i for i, n in collections.Counter(layers).items() if n > 1)
    rules.require(
        not repeated,
        field,
        f"names layer{'s' if len(repeated) > 1 else ''} {', '.join(map(str, repeated))} more than once",
        "list each layer once",
    )


def require_within(
    rules: Rules,
    layers: Sequence[int],
    n_layers: int,
    field: tuple[str, ...],
    counts: str = "of the model's {n}",
    more: str = "",
) -> None:
    """Each layer of a list of layers one of the stack's ``n_layers`` (``counts`` says which
    stack, ``more`` what else would do)."""
    beyond = [i for i in layers if i >= n_layers]
    rules.require(
        not beyond,
        field,
        f"counts layers from 0 {counts.format(n=n_layers)}, found {', '.join(map(str, beyond))}",
        f"list layers from 0 to {n_layers - 1}{more}",
    )


def _type_shorthand(value: Any) -> Any:
    """Let ``positional: rope`` stand for ``positional: {type: rope}``."""
    return {"type": value} if isinstance(value, str) else value


SHORT_FORMS: set[str] = set()  # the fields that take a variant's name for {type: NAME}


def short_form(*fields: str) -> Any:
    """The before-validator that lets each of ``fields`` take a variant's name alone."""
    SHORT_FORMS.update(fields)
    return field_validator(*fields, mode="before")(_type_shorthand)


# ---------------------------------------------------------------------------- model


class NormSpec(Section):
    position: Literal["pre", "post", "sandwich", "output"] = Field(
        "pre",
        description="pre: x + f(norm(x)) (GPT-2, LLaMA); post: norm(x + f(x)) (Vaswani); sandwich: "
        "x + norm'(f(norm(x))), a norm on each sublayer's output too (Gemma 2 and 3); output: "
        "x + norm(f(x)), on each sublayer's output only (OLMo 2)",
    )
    type: NormName = "layernorm"
    eps: Annotated[
        float,
        at_least(
            TINY_EPS,
            "float32's smallest normal number: a smaller eps is 0 or a subnormal there, and a norm of a "
            "zero vector divides by it",
        ),
    ] = 1e-5
    scale: bool = Field(
        True, description="learned scale; false: the norm only normalises (and shifts, where bias), as OLMo's"
    )
    bias: bool | None = Field(None, description="learned shift; default: on for layernorm only")
    final: bool | None = Field(None, description="norm after the last block; default: off for post-norm only")
    first_attention: bool = Field(
        True,
        description="the norm before the first layer's attention (in each stack); false: that attention "
        "reads the embeddings as they are (ModernBERT's, whose embeddings end in a norm); pre-norm only",
    )

    @model_validator(mode="after")
    def _defaults(self) -> NormSpec:
        if self.bias is None:
            self._resolve(bias=self.type == "layernorm")
        if self.final is None:
            self._resolve(final=self.position != "post")
        rules = Rules()
        rules.require(
            self.first_attention or self.position == "pre",
            ("first_attention",),
            f"leaves out a norm before the first attention, and a {self.position}-norm block has none there",
            "set norm.position: pre, or leave first_attention out",
        )
        rules.check()
        return self

    def parameters(self, dim: int) -> int:
        return dim * (self.scale + bool(self.bias))


class SinusoidalPositional(Section):
    type: Literal["sinusoidal"] = "sinusoidal"
    layout: Literal["interleaved", "halves"] = Field(
        "interleaved",
        description="where the sines and cosines lie: interleaved, PE[t, 2k] = sin(t w_k) and PE[t, 2k+1] = "
        "cos(t w_k), as in Vaswani et al.; or halves, the sines in the first half of the features and the "
        "cosines in the second (Marian, Pegasus); the frequencies w_k = 10000^(-2k/d) are the same",
    )
    spacing: Literal["vaswani", "tensor2tensor"] = Field(
        "vaswani",
        description="the frequencies of the d/2 pairs: vaswani, w_k = 10000^(-2k/d); tensor2tensor, "
        "w_k = 10000^(-k/(d/2 - 1)), the last exactly 1/10000 (fairseq's, M2M100's and NLLB's); d at least 4",
    )
    offset: Annotated[int, Field(strict=True, ge=0), at_most(MAX_SEQ_LEN, "a position past any context")] = (
        Field(
            0,
            description="the position the first token is encoded at, the next at offset + 1, ... (M2M100 and "
            "NLLB: their pad id + 1, 2); sequences and ViTs only from 0",
        )
    )

    def parameters(self, model: TransformerSpec) -> int:
        return 0


class LearnedPositional(Section):
    type: Literal["learned"] = "learned"

    def parameters(self, model: TransformerSpec) -> int:
        assert model.max_seq_len is not None
        return model.max_seq_len * model.embedding_width  # one vector per position


ScalingFactor = Annotated[float, Field(ge=1)]

# A RoPE base above 1: frequencies fall from pair to pair, and YaRN divides by its logarithm.
RopeBase = Annotated[float, Field(gt=1)]


# The context a scaled RoPE was trained on, held to max_seq_len's bound: the tables are computed
# with it in torch's 64-bit integers and floats.
OriginalLength = Annotated[
    PositiveInt, at_most(MAX_SEQ_LEN, "a context longer than max_seq_len's bound was never trained")
]


class LinearRopeScaling(Section):
    """Position interpolation (Chen et al. 2023): every frequency divided by ``factor``."""

    type: Literal["linear"] = "linear"
    factor: ScalingFactor


class DynamicRopeScaling(Section):
    """NTK-aware scaling that follows the sequence: with L = max(longest position + 1,
    original_max_position_embeddings), theta becomes theta * (factor * L / original - (factor - 1))
    ^ (head_dim / (head_dim - 2)); up to the original length it is plain RoPE."""

    type: Literal["dynamic"] = "dynamic"
    factor: ScalingFactor
    original_max_position_embeddings: OriginalLength = Field(description="the length trained without scaling")


class Llama3RopeScaling(Section):
    """Llama 3.1's: wavelengths above original / low_freq_factor are divided by ``factor``, those
    below original / high_freq_factor kept, and those between interpolated smoothly."""

    type: Literal["llama3"] = "llama3"
    factor: ScalingFactor
    low_freq_factor: PositiveFloat
    high_freq_factor: PositiveFloat
    original_max_position_embeddings: OriginalLength

    @model_validator(mode="after")
    def _rules(self) -> Llama3RopeScaling:
        rules = Rules()
        rules.require(
            self.high_freq_factor > self.low_freq_factor,
            ("high_freq_factor",),
            f"must exceed low_freq_factor ({self.low_freq_factor}), found {self.high_freq_factor}",
            "Llama 3.1 uses low_freq_factor 1 and high_freq_factor 4",
        )
        rules.check()
        return self


class YarnRopeScaling(Section):
    """YaRN (Peng et al. 2023): frequencies that turn fewer than ``beta_slow`` times over the
    original length are divided by ``factor``, those that turn more than ``beta_fast`` times kept,
    a linear ramp between; cos and sin are multiplied by the attention factor (default
    0.1 ln(factor) + 1, or the ratio of that with mscale and with mscale_all_dim)."""

    type: Literal["yarn"] = "yarn"
    factor: ScalingFactor
    original_max_position_embeddings: OriginalLength
    beta_fast: PositiveFloat = 32.0
    beta_slow: PositiveFloat = 1.0
    mscale: PositiveFloat | None = Field(None, description="with mscale_all_dim: their ratio sets the factor")
    mscale_all_dim: PositiveFloat | None = None
    attention_factor: PositiveFloat | None = Field(None, description="given outright instead of computed")
    truncate: bool = Field(True, description="round the ramp's ends to whole dimensions")

    @model_validator(mode="after")
    def _rules(self) -> YarnRopeScaling:
        rules = Rules()
        rules.require(
            self.beta_fast >= self.beta_slow,
            ("beta_fast",),
            f"must be at least beta_slow ({self.beta_slow}), found {self.beta_fast}: the pairs that turn "
            f"more than beta_fast times keep their frequency, those that turn fewer than beta_slow times "
            f"are interpolated",
            "YaRN uses beta_fast 32 and beta_slow 1",
        )
        rules.check()
        return self


# A LongRoPE factor divides one pair's frequency: past 1,000 either way a pair would turn a thousand
# times faster or slower than RoPE's own, which no trained model does (Phi-3's lie in 1 to 100).
PairFactor = Annotated[
    float,
    at_least(1e-3, "a pair would turn a thousand times faster than RoPE's own"),
    at_most(1e3, "a pair would turn a thousand times slower than RoPE's own"),
]
PairFactors = Annotated[list[PairFactor], Field(min_length=1, max_length=MAX_WIDTH // 2)]


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's attention factor where none is given, as transformers computes it: 1 for a context
    no longer than the original, else sqrt(1 + ln(factor) / ln(original)) (an original length above
    1: the caller's to hold)."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


class LongRopeScaling(Section):
    """LongRoPE (Ding et al. 2024; Phi-3, Phi-3.5, Phi-4-mini): pair i's frequency divided by
    ``short_factor[i]`` while a sequence lies within original_max_position_embeddings, and by
    ``long_factor[i]`` for the whole sequence once its last position is past it (chosen per row by
    its longest position, as transformers chooses per call); cos and sin are multiplied by the
    attention factor, sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) unless given."""

    type: Literal["longrope"] = "longrope"
    short_factor: PairFactors = Field(description="one per rotated pair: rotary_dims / 2 of them")
    long_factor: PairFactors = Field(description="one per rotated pair, past the original length")
    original_max_position_embeddings: OriginalLength = Field(
        description="the length trained with the short factors"
    )
    factor: ScalingFactor = Field(description="how much longer the context is than the original")
    attention_factor: PositiveFloat | None = Field(
        None, description="given outright instead of computed from factor"
    )

    @model_validator(mode="after")
    def _resolve_and_check(self) -> LongRopeScaling:
        rules = Rules()
        rules.require(
            len(self.long_factor) == len(self.short_factor),
            ("long_factor",),
            f"must have as many factors as short_factor ({len(self.short_factor)}), found "
            f"{len(self.long_factor)}: one for each rotated pair",
            "give one long and one short factor for each pair of rotated dimensions",
        )
        original = self.original_max_position_embeddings
        rules.require(
            self.attention_factor is not None or original > 1,
            ("original_max_position_embeddings",),
            "is 1, whose logarithm (0) the attention factor's formula divides by",
            "give attention_factor, or the length the short factors were trained on",
        )
        rules.check()
        if self.attention_factor is None:
            self._resolve(attention_factor=longrope_attention_factor(self.factor, original))
        return self


RopeScaling = Annotated[
    LinearRopeScaling | DynamicRopeScaling | Llama3RopeScaling | YarnRopeScaling | LongRopeScaling,
    Field(discriminator="type"),
]


class LocalRope(Section):
    """A second RoPE for some layers: Gemma 3's sliding-window layers turn at a base of 10,000,
    unscaled, where its other layers turn at 1,000,000 (scaled in the larger models)."""

    theta: RopeBase = Field(description="the base of these layers' frequencies")
    scaling: RopeScaling | None = Field(None, description="these layers' own scaling; default: none")
    layers: Annotated[
        list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1, max_length=MAX_LAYERS)
    ] = Field(
        description="the layers (counted from 0, in each stack) that turn at this theta; the others "
        f"turn at positional.theta with positional.scaling; at most {MAX_LAYERS:,}"
    )

    @model_validator(mode="after")
    def _rules(self) -> LocalRope:
        rules = Rules()
        require_distinct(rules, self.layers, ("layers",))
        rules.check()
        return self


class QueryScaling(Section):
    """Longer contexts sharpen attention: each query, after RoPE turns it, times
    1 + beta ln(1 + floor(m / length)) at position m (Llama 4's attention temperature, as Ministral 3
    applies it in every layer that turns RoPE); 1 within the first ``length`` positions."""

    beta: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        description="how much each further stretch of length positions sharpens (Ministral 3's 0.1)"
    )
    length: PositiveInt = Field(
        description="the positions each step of the scale spans: the trained context (Ministral 3's "
        "original_max_position_embeddings, 16,384)"
    )


class RopePositional(Section):
    type: Literal["rope"] = "rope"
    theta: RopeBase = 10000.0
    layout: Literal["interleaved", "halves"] = Field(
        "interleaved",
        description="which dimensions rotate together: interleaved pairs (x_2i, x_2i+1), as in the RoPE "
        "paper and Meta's Llama code; or halves (x_i, x_i+head_dim/2), as in Hugging Face transformers",
    )
    scaling: RopeScaling | None = Field(
        None, description="for a longer context than trained: how the frequencies change"
    )
    rotary_dims: Annotated[int, Field(strict=True, ge=2)] | None = Field(
        None,
        description="partial rotary: how many of each head's dimensions rotate, the first ones, the rest "
        "passing through unrotated (GPT-NeoX's rotary_pct, GPT-J's rotary_dim, Phi's "
        "partial_rotary_factor); frequencies, layout and scaling are those of a head this wide; even, at "
        "most head_dim; default: head_dim (all)",
    )
    local: LocalRope | None = Field(
        None,
        description="another theta (and scaling) for the layers it lists, the layout and rotated "
        "width shared (Gemma 3's sliding-window layers); default: every layer alike",
    )
    nope_layers: (
        Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1, max_length=MAX_LAYERS)]
        | None
    ) = Field(
        None,
        description="the layers (counted from 0, in each stack) whose queries and keys turn no RoPE "
        "(NoPE: they attend by content and the mask alone, as SmolLM3's every fourth); default: none",
    )
    query_scaling: QueryScaling | None = Field(
        None,
        description="{beta, length}: each query after RoPE times 1 + beta ln(1 + floor(position / "
        "length)), sharper attention far into a long context (Ministral 3); default: none",
    )

    @model_validator(mode="after")
    def _rules(self) -> RopePositional:
        rules = Rules()
        nope = self.nope_layers or []
        require_distinct(rules, nope, ("nope_layers",))
        both = sorted(set(nope) & set(self.local.layers if self.local is not None else []))
        rules.require(
            not both,
            ("nope_layers",),
            f"lists layers local.layers turns at a theta of their own: {', '.join(map(str, both))}",
            "list each layer in one of the two",
        )
        rules.check()
        return self

    def parameters(self, model: TransformerSpec) -> int:
        return 0

    def layer_lists(self) -> dict[tuple[str, ...], list[int]]:
        """The lists of layers it names, by field: local.layers, nope_layers."""
        lists: dict[tuple[str, ...], list[int]] = {("positional", "nope_layers"): self.nope_layers or []}
        if self.local is not None:
            lists[("positional", "local", "layers")] = self.local.layers
        return lists

    def width(self, head_dim: int) -> int:
        """The dimensions of a head that rotate."""
        return head_dim if self.rotary_dims is None else self.rotary_dims


class RelativePositional(Section):
    type: Literal["relative"] = "relative"
    num_buckets: Annotated[int, Field(strict=True, ge=4)] = 32
    max_distance: PositiveInt = 128

    @model_validator(mode="after")
    def _rules(self) -> RelativePositional:
        rules = Rules()
        rules.require(
            self.max_distance > self.num_buckets // 2,
            ("max_distance",),
            f"must exceed num_buckets / 2 = {self.num_buckets // 2}, found {self.max_distance}",
            "offsets below num_buckets / 2 get exact buckets; max_distance bounds the log-spaced rest",
        )
        rules.check()
        return self

    def parameters(self, model: TransformerSpec) -> int:
        return self.num_buckets * model.n_heads  # a scalar bias per bucket and head


class AlibiPositional(Section):
    type: Literal["alibi"] = Field(
        "alibi",
        description="ALiBi (Press et al. 2021): no position added to the tokens; each head's scores get "
        "-m_h * distance (query position - key position; its absolute value where the stack looks "
        "both ways), m_h = 2^(-8h/n) for n heads, a power of two (other counts: BLOOM's interleaved "
        "slopes); nothing learned",
    )

    def parameters(self, model: TransformerSpec) -> int:
        return 0


class NoPositional(Section):
    type: Literal["none"] = "none"

    def parameters(self, model: TransformerSpec) -> int:
        return 0


Positional = Annotated[
    SinusoidalPositional
    | LearnedPositional
    | RopePositional
    | RelativePositional
    | AlibiPositional
    | NoPositional,
    Field(discriminator="type"),
]


class BiasSpec(Section):
    qkv: bool = True
    attn_out: bool = True
    ffn: bool = True
    lm_head: bool = False


class SequentialBlock(Section):
    type: Literal["sequential"] = Field(
        "sequential", description="one sublayer after the other: x + attn(norm(x)), then + ffn(norm(.))"
    )


class ParallelBlock(Section):
    type: Literal["parallel"] = Field(
        "parallel",
        description="attention and feed-forward read the same input and their outputs are added to it "
        "together: x + attn(norm1(x)) + ffn(norm2(x)) (GPT-J, GPT-NeoX, PaLM); pre-norm only",
    )
    shared_norm: bool = Field(
        False,
        description="one norm feeds both sublayers, x + attn(norm(x)) + ffn(norm(x)) (GPT-J, Phi); "
        "else each has its own (GPT-NeoX)",
    )


Block = Annotated[SequentialBlock | ParallelBlock, Field(discriminator="type")]


class DropoutSpec(Section):
    embedding: Probability = 0.0
    attention: Probability = Field(0.0, description="on the attention weights")
    residual: Probability = Field(0.0, description="on each sublayer's output, before the residual add")
    path: Probability = Field(
        0.0,
        description="stochastic depth: the last block's sublayers are skipped for a whole example with "
        "this probability while training, earlier blocks' linearly less, the first block's never",
    )


MAX_EXPERTS = 1024


class ExpertGroups(Section):
    """Group-limited routing (DeepSeek-V3, GLM-4.5): the experts fall in ``count`` equal groups of
    consecutive experts, each group scored by the sum of its two highest scores, and a token
    chooses its top_k among the experts of its ``top`` best groups alone."""

    count: Annotated[int, Field(strict=True, ge=2)] = Field(description="groups (n_group); at least 2")
    top: PositiveInt = Field(description="the groups each token chooses among (topk_group); at most count")


class MoESpec(Section):
    """Mixture-of-experts feed-forward (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral;
    DeepSeek-V3): a router scores each token against the ``experts`` feed-forwards, sends it to
    the ``top_k`` of highest score and sums their outputs weighted by those scores."""

    experts: Annotated[
        int, Field(strict=True, ge=2), at_most(MAX_EXPERTS, "the largest MoE models in use route among 512")
    ] = Field(description=f"feed-forwards per MoE layer; at least 2, at most {MAX_EXPERTS:,}")
    top_k: PositiveInt = Field(2, description="experts each token goes through; at most experts")
    d_ff: FeedForward | None = Field(
        None, description="each expert's hidden width (moe_intermediate_size); default: model.d_ff"
    )
    normalize: bool | None = Field(
        None,
        description="rescale the chosen experts' probabilities to sum to 1 (Mixtral, Qwen3-MoE); false: "
        "use them as the softmax over every expert gave them (Switch, Qwen2-MoE, OLMoE); default: true "
        "where top_k > 1 (one chosen expert's weight would always be 1, and the router would learn from "
        "the load-balancing loss alone)",
    )
    shared_d_ff: FeedForward | None = Field(
        None,
        description="the hidden width of a shared expert that every token goes through beside its "
        "routed ones (Qwen2-MoE's shared_expert_intermediate_size); default: none",
    )
    shared_gate: bool = Field(
        False,
        description="multiply the shared expert's output by sigmoid(x . w), a learned gate per token "
        "(Qwen2-MoE); needs shared_d_ff",
    )
    router_bias: bool = Field(
        False, description="a learned bias on the router's logits, one per expert (GPT-OSS)"
    )
    scoring: Literal["softmax", "sigmoid"] = Field(
        "softmax",
        description="the router's scores: a softmax over the experts (Mixtral, Qwen, OLMoE), or each "
        "expert's sigmoid (DeepSeek-V3, GLM-4.5)",
    )
    selection_bias: bool = Field(
        False,
        description="a bias per expert added to the scores to choose the experts, not to weight them "
        "(DeepSeek-V3's e_score_correction_bias, for balancing without a loss); read with the weights, "
        "held fixed in training unless bias_update is set",
    )
    bias_update: Annotated[
        float, Field(ge=0), at_most(1.0, "a bias moves by it each step; scores lie in 0 to 1")
    ] = Field(
        0.0,
        description="while training, after each optimizer step, each expert's selection bias moves by "
        "this toward balance: up where the expert took fewer of the step's choices than the mean, down "
        "where more, over every micro-batch and process (DeepSeek-V3's auxiliary-loss-free "
        "balancing, 0.001); 0: the bias stays as read; needs selection_bias",
    )
    groups: ExpertGroups | None = Field(
        None, description="choose among the experts of the best groups alone; default: none, among all"
    )
    scale: PositiveFloat = Field(
        1.0, description="the routed experts' weights times this, after normalize (routed_scaling_factor)"
    )
    dense_layers: (
        Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(max_length=MAX_LAYERS)] | None
    ) = Field(
        None,
        description="layers (counted from 0, in each stack) that keep the plain feed-forward of "
        "model.d_ff (Qwen2-MoE's mlp_only_layers); default: none, every layer routes",
    )
    balance_loss: Annotated[float, Field(ge=0)] = Field(
        0.01,
        description="while training, this times the load-balancing loss, E * sum_e f_e P_e (f_e: the "
        "share of the tokens' choices that went to expert e; P_e: e's mean router probability), "
        "averaged over the MoE layers, is added to the task's loss (Switch: 0.01; MixtralConfig: 0.001); "
        "0: none",
    )

    @model_validator(mode="after")
    def _rules(self) -> MoESpec:
        if self.normalize is None:
            self._resolve(normalize=self.top_k > 1)
        rules = Rules()
        rules.require(
            self.top_k <= self.experts,
            ("top_k",),
            f"chooses {self.top_k} of {self.experts} experts",
            f"use at most {self.experts}, or more experts",
        )
        rules.require(
            not self.shared_gate or self.shared_d_ff is not None,
            ("shared_gate",),
            "gates the shared expert, and there is none",
            "set model.moe.shared_d_ff, or leave shared_gate out",
        )
        require_distinct(rules, self.dense_layers or [], ("dense_layers",))
        rules.require(
            not self.bias_update or self.selection_bias,
            ("bias_update",),
            "updates the selection bias, and there is none",
            "set model.moe.selection_bias: true, or leave bias_update out",
        )
        if (groups := self.groups) is not None:
            each = self.experts // groups.count
            splits = self.experts % groups.count == 0 and each >= 2
            rules.require(
                splits,
                ("groups", "count"),
                f"cannot split {self.experts} experts into {groups.count} equal groups of two or more "
                "(a group is scored by its two highest)",
                "use a divisor of experts that leaves groups of two or more",
            )
            rules.require(
                groups.top <= groups.count,
                ("groups", "top"),
                f"chooses {groups.top} of {groups.count} groups",
                f"use at most {groups.count}",
            )
            rules.require(
                self.top_k <= groups.top * each or not splits,
                ("top_k",),
                f"chooses {self.top_k} experts among the {groups.top * each} of {groups.top} groups",
                f"use at most {groups.top * each}, or more groups.top",
            )
        rules.check()
        return self


class TransformerSpec(Section):
    """The choices every family shares: sizes, norms, activation, positions, biases, dropout.

    ``data_sizes`` names the fields training may take from the data when the spec leaves them
    out; the ``*_parameters`` methods count what the assemblies in ``tfcompile.models`` build
    (a test holds the two equal), so that validating a spec needs no torch."""

    data_sizes: ClassVar[tuple[str, ...]] = ("vocab_size",)

    vocab_size: VocabSize | None = Field(
        None, description=f"None: taken from the tokenizer; at most {MAX_VOCAB:,}"
    )
    d_model: Width = Field(description=f"the width of each token's vector; at most {MAX_WIDTH:,}")
    n_layers: Depth = Field(description=f"at most {MAX_LAYERS:,}")
    n_heads: Heads = Field(description=f"at most {MAX_HEADS:,}")
    n_kv_heads: Heads | None = Field(None, description="K/V heads: n_heads MHA, 1 MQA; default n_heads")
    d_ff: FeedForward | None = Field(
        None,
        description="default 4 * d_model; gated activations: 8/3 * d_model rounded up to d_ff_multiple_of; "
        f"at most {4 * MAX_WIDTH:,}",
    )
    d_ff_multiple_of: FeedForward = 64
    max_seq_len: Annotated[
        int,
        Field(ge=2, strict=True),
        at_most(MAX_SEQ_LEN, "the T x T attention scores of a longer sequence overflow 64-bit sizes"),
    ] = Field(
        description="the longest sequence the model reads; at least 2 (one token has no sequence to export), "
        f"at most {MAX_SEQ_LEN:,}, and less as n_heads grows: one sequence's attention, n_heads x "
        "max_seq_len^2 float32s, must have a size in bytes that 64 bits can count"
    )
    norm: NormSpec = NormSpec()
    activation: ActivationName = "gelu"
    positional: Positional = LearnedPositional()
    bias: BiasSpec = BiasSpec()
    block: Block = Field(SequentialBlock(), description="how a layer's sublayers meet the residual stream")
    moe: MoESpec | None = Field(
        None, description="a mixture of experts in place of each layer's feed-forward; default: none"
    )
    head_dim: Width | None = Field(
        None, description="size of each attention head; default d_model / n_heads (T5 sets its own)"
    )
    attention_scale: PositiveFloat | None = Field(
        None, description="what q.k is multiplied by before the softmax; default 1/sqrt(head_dim); T5: 1"
    )
    attention_softcap: PositiveFloat | None = Field(
        None,
        description="cap the scaled scores to c * tanh(scores / c) before the mask and the softmax "
        "(Gemma 2: 50, Grok: 30); attention then runs unfused; default none",
    )
    qkv_clip: PositiveFloat | None = Field(
        None,
        description="clamp every query, key and value to [-c, c] after their projections (OLMo's and "
        "MPT's clip_qkv); default none",
    )
    attention_sinks: bool = Field(
        False,
        description="a learned logit per head in each self-attention that joins every query's softmax "
        "as a key with no value, so that a query may give part of its attention to nothing (GPT-OSS's "
        "sinks; Xiao et al. 2023's attention sink, learned); attention then runs with an explicit mask",
    )
    qk_norm: bool = Field(
        False,
        description="normalise each head's queries and keys over head_dim after their projections and "
        "before RoPE, with one learned scale (and shift, where the norm has one) of head_dim for q and "
        "one for k, shared by the heads (Qwen3, Gemma 3); the norm is the norm section's type, eps and bias",
    )
    qk_norm_over: Literal["head", "all_heads"] = Field(
        "head",
        description="what qk_norm normalises over: head, each head's head_dim (Qwen3, Gemma 3); all_heads, "
        "all the queries' n_heads x head_dim at once and all the keys' n_kv_heads x head_dim (OLMo 2)",
    )
    qk_norm_after_rope: bool = Field(
        False,
        description="apply qk_norm to each head's queries and keys after RoPE turns them, not before "
        "(HunYuan's query_layernorm and key_layernorm); its scale then weighs the turned pairs' "
        "dimensions",
    )
    tie_embeddings: bool = True
    scale_embeddings: bool = Field(False, description="multiply token embeddings by sqrt(d_model)")
    residual_multiplier: PositiveFloat = Field(
        1.0,
        description="each sublayer's output (a parallel block's sum) times this as it joins the residual "
        "stream (Granite's residual_multiplier)",
    )
    dropout: DropoutSpec = DropoutSpec()
    init_std: PositiveFloat = 0.02

    _shorthands = short_form("positional", "block")

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    @property
    def embedding_width(self) -> int:
        """The width of the token embeddings, of the positions added to them and of an LM head tied
        to them: d_model (an encoder may set its own, embedding_size)."""
        return self.d_model

    @model_validator(mode="after")
    def _resolve_and_check(self) -> TransformerSpec:
        if self.n_kv_heads is None:
            self._resolve(n_kv_heads=self.n_heads)
        if self.head_dim is None and self.d_model % self.n_heads == 0:
            self._resolve(head_dim=self.d_model // self.n_heads)
        if self.attention_scale is None and self.head_dim is not None:
            self._resolve(attention_scale=1 / math.sqrt(self.head_dim))  # as scaled_dot_product_attention
        if self.d_ff is None:
            if self.gated:
                # 2/3 of 4d keeps a gated FFN's three matrices at the cost of a plain FFN's two.
                m = self.d_ff_multiple_of
                d_ff = -(-(8 * self.d_model) // 3 // m) * m if m > 1 else -(-8 * self.d_model // 3)
            else:
                d_ff = 4 * self.d_model
            self._resolve(d_ff=d_ff)
        assert self.n_kv_heads is not None
        rules = Rules()
        rules.require(
            self.head_dim is not None,
            ("n_heads",),
            f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})",
            lambda: (
                f"use a divisor of {self.d_model}, e.g. {_nearest_divisor(self.d_model, self.n_heads)}, "
                f"or give model.head_dim"
            ),
        )
        rules.require(
            not (self.attention_sinks and self.attention_softcap),
            ("attention_sinks",),
            "with attention_softcap: a capped score beside an uncapped sink has no model that defines it",
            "use one of the two",
        )
        rules.require(
            self.n_kv_heads <= self.n_heads and self.n_heads % self.n_kv_heads == 0,
            ("n_kv_heads",),
            f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})",
            f"use a divisor of {self.n_heads}: {self.n_heads} for MHA, 1 for MQA, between for GQA",
        )
        if isinstance(self.positional, RopePositional) and self.head_dim is not None:
            rotary = self.positional.width(self.head_dim)
            rules.require(
                self.positional.rotary_dims is not None or self.head_dim % 2 == 0,
                ("positional",),
                f"RoPE rotates pairs of dimensions, so the head size must be even, found {self.head_dim}",
                "change d_model or n_heads (or model.head_dim) so that the head size is even, or rotate "
                "part of each head (positional.rotary_dims)",
            )
            rules.require(
                self.positional.rotary_dims is None or (rotary % 2 == 0 and rotary <= self.head_dim),
                ("positional", "rotary_dims"),
                f"rotates pairs of a head's {self.head_dim} dimensions, so it must be even and at most "
                f"{self.head_dim}, found {rotary}",
                f"use an even number from 2 to {self.head_dim}, or leave it unset to rotate them all",
            )
            local = self.positional.local
            scalings: dict[tuple[str, ...], RopeScaling | None] = {
                ("positional", "scaling"): self.positional.scaling
            }
            if local is not None:
                scalings[("positional", "local", "scaling")] = local.scaling
            for where, scaling in scalings.items():
                rules.require(
                    not isinstance(scaling, DynamicRopeScaling) or rotary > 2,
                    where,
                    f"dynamic scaling raises theta to the power d / (d - 2) for the {rotary} rotated "
                    f"dimensions of a head, so they must exceed 2",
                    "rotate more dimensions, or use another scaling",
                )
                if isinstance(scaling, LongRopeScaling):
                    rules.require(
                        len(scaling.short_factor) == rotary // 2,
                        (*where, "short_factor"),
                        f"holds {len(scaling.short_factor)} factors where a head's {rotary} rotated "
                        f"dimensions make {rotary // 2} pairs, one factor each",
                        f"give {rotary // 2} short and {rotary // 2} long factors",
                    )
            for field, layers in self.positional.layer_lists().items():
                require_within(rules, layers, self.n_layers, field)
            if self.positional.rotary_dims is None:
                self._resolve(positional=self.positional.model_copy(update={"rotary_dims": rotary}))
        if self.moe is not None:
            if self.moe.d_ff is None:
                self._resolve(moe=self.moe.model_copy(update={"d_ff": self.d_ff}))
            require_within(rules, self.moe.dense_layers or [], self.n_layers, ("moe", "dense_layers"))
        rules.require(
            self.norm.first_attention
            or not (isinstance(self.block, ParallelBlock) and self.block.shared_norm),
            ("norm", "first_attention"),
            "leaves out the first layer's attention norm, which a parallel block's shared norm is for its "
            "feed-forward too",
            "set block.shared_norm: false, or leave first_attention out",
        )
        rules.require(
            self.qk_norm or self.qk_norm_over == "head",
            ("qk_norm_over",),
            "says what qk_norm normalises over, and qk_norm is false",
            "set model.qk_norm: true, or leave qk_norm_over out",
        )
        rules.require(
            not self.qk_norm_after_rope or (self.qk_norm and self.qk_norm_over == "head"),
            ("qk_norm_after_rope",),
            "says when each head's q/k norm comes, and there is none"
            if not self.qk_norm
            else "normalises after RoPE, which turns each head: there are no norms over all heads then",
            "set model.qk_norm: true" if not self.qk_norm else "leave qk_norm_over out (head)",
        )
        rules.require(
            not self.qk_norm_after_rope or isinstance(self.positional, RopePositional),
            ("qk_norm_after_rope",),
            f"says the q/k norms come after RoPE, and the positions are {self.positional.type}: there is "
            "no RoPE to come after",
            "leave qk_norm_after_rope out",
        )
        rules.require(
            self.block.type == "sequential" or self.norm.position == "pre",
            ("block",),
            "a parallel block normalises its sublayers' common input, x + attn(norm(x)) + ffn(norm(x)), "
            f"and nothing else: it has no {self.norm.position}-norm form",
            "set model.norm.position: pre, or use block: sequential",
        )
        if isinstance(self.positional, SinusoidalPositional):
            width = self.embedding_width
            rules.require(
                width % 2 == 0,
                ("positional",),
                f"sinusoidal encodings pair sin and cos, so the embeddings' width (d_model, or an "
                f"encoder's embedding_size) must be even, found {width}",
                "use an even width",
            )
            rules.require(
                self.positional.spacing == "vaswani" or width >= 4,
                ("positional", "spacing"),
                f"spaces d/2 frequencies over d/2 - 1 steps, and the embeddings' width is {width}",
                "use a width of 4 or more, or spacing: vaswani",
            )
        if self.max_seq_len is not None:  # a ViT's follows from its sizes (VitSpec checks it there)
            self._require_scores_fit(rules, self.max_seq_len, ("max_seq_len",))
        rules.check()
        return self

    def _require_scores_fit(self, rules: Rules, length: int, field: tuple[str, ...]) -> None:
        """One sequence's attention, which even the summary on the meta device builds (the scores,
        n_heads x length x length float32s; a causal mask, length x length int64s), must have a
        size in bytes that 64 bits can count."""
        per_pair = max(4 * self.n_heads, 8)
        rules.require(
            per_pair * length**2 <= MAX_BYTES,
            field,
            f"one sequence's attention ({self.n_heads} heads x {length:,} x {length:,} positions) takes "
            f"more bytes than a 64-bit size counts",
            lambda: f"use a sequence of at most {math.isqrt(MAX_BYTES // per_pair):,}, or fewer heads",
        )

    # Parameter counts, matching tfcompile.models (tests/test_counts.py).

    def routed_layers(self, count: int) -> frozenset[int]:
        """The layers of a stack of ``count`` whose feed-forward is a mixture of experts."""
        if self.moe is None:
            return frozenset()
        return frozenset(range(count)) - set(self.moe.dense_layers or ())

    def stack_parameters(self, count: int, cross_attention: bool = False) -> int:
        """A stack of ``count`` TransformerBlocks (the first without its attention's norm, where
        norm.first_attention is false)."""
        routed = len(self.routed_layers(count))
        dense = (count - routed) * self.block_parameters(cross_attention)
        first = 0 if self.norm.first_attention or not count else self.norm.parameters(self.d_model)
        return dense + (routed * self.block_parameters(cross_attention, routed=True) if routed else 0) - first

    def block_parameters(self, cross_attention: bool = False, routed: bool = False) -> int:
        """One TransformerBlock: norms (sandwich: on each sublayer's output too; output: there
        only), self-attention (packed QKV, q and k norms), [cross-attention], feed-forward (where
        ``routed``, the mixture of experts: router, experts, shared expert and its gate)."""
        assert self.n_kv_heads is not None and self.d_ff is not None and self.head_dim is not None
        d, hd, bias = self.d_model, self.head_dim, self.bias
        q, kv = self.n_heads * hd, 2 * self.n_kv_heads * hd
        out = q * d + bias.attn_out * d
        widths = (hd, hd) if self.qk_norm_over == "head" else (q, self.n_kv_heads * hd)
        qk_norms = sum(self.norm.parameters(width) for width in widths) * self.qk_norm
        attention = d * (q + kv) + bias.qkv * (q + kv) + qk_norms + out
        ffn = self.ffn_parameters(self.d_ff)
        if routed:
            moe = self.moe
            assert moe is not None and moe.d_ff is not None  # resolved above
            shared = self.ffn_parameters(moe.shared_d_ff) if moe.shared_d_ff is not None else 0
            router = (d + moe.router_bias) * moe.experts
            ffn = router + moe.experts * self.ffn_parameters(moe.d_ff) + shared + d * moe.shared_gate
        norms = 1 if isinstance(self.block, ParallelBlock) and self.block.shared_norm else 2
        per_sublayer = 2 if self.norm.position == "sandwich" else 1
        sinks = self.n_heads * self.attention_sinks  # self-attention's alone
        total = norms * per_sublayer * self.norm.parameters(d) + attention + sinks + ffn
        if cross_attention:
            total += per_sublayer * self.norm.parameters(d) + attention
        return total

    def ffn_parameters(self, d_ff: int) -> int:
        """One feed-forward of hidden width ``d_ff`` (a gated one's input projection twice as wide)."""
        width = d_ff * (2 if self.gated else 1)
        return (self.d_model + self.bias.ffn) * width + (d_ff + self.bias.ffn) * self.d_model

    def final_norm_parameters(self) -> int:
        return self.norm.parameters(self.d_model) if self.norm.final else 0

    def lm_head_parameters(self) -> int:
        """The projection to the vocabulary: free unless tied to the embedding, plus its bias."""
        rows = self.vocab_rows
        return rows * self.embedding_width * (not self.tie_embeddings) + rows * self.bias.lm_head

    @property
    def vocab_rows(self) -> int:
        """Rows of the token embedding and the LM head: the vocabulary (a decoder may pad it)."""
        return self._vocab()

    def body_parameters(self) -> int:
        """Everything the family builds below a task's head."""
        raise NotImplementedError

    def _vocab(self) -> int:
        if self.vocab_size is None:
            raise ValueError("model.vocab_size is not set")
        return self.vocab_size

    def describe_input(self, context: int) -> str:
        return f"(batch 1, seq {context}) token ids"


def listed(names: Iterable[Any]) -> str:
    """Names as a spec message lists them: each quoted as Python would, comma-separated."""
    return ", ".join(repr(n) for n in names)


def _nearest_divisor(n: int, near: int, reach: int = 10_000) -> int:
    """The divisor of ``n`` closest to ``near`` (the larger on a tie), looking at most ``reach``
    away so that a hint about a huge size costs no time; 1 divides everything."""
    for distance in range(min(reach, max(near, n))):
        for d in (near + distance, near - distance):
            if 0 < d <= n and n % d == 0:
                return d
    return 1


class SlidingWindow(Section):
    """Local attention (Mistral, Gemma 2 and 3, Qwen2 from a layer on; ModernBERT): in the layers
    it lists, a decoder's query attends to itself and the ``size`` - 1 positions before it, no
    further back, an encoder's to itself and the (``size`` - 1) / 2 positions on either side of
    it (an odd size); the other layers attend to every position (a decoder's, every one before)."""

    size: Annotated[int, Field(strict=True, ge=1), at_most(MAX_SEQ_LEN, "a longer window is no window")] = (
        Field(description="the positions a query attends to, its own included")
    )
    layers: (
        Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1, max_length=MAX_LAYERS)]
        | None
    ) = Field(None, description="the layers (counted from 0) that slide; default: every layer")

    @model_validator(mode="after")
    def _rules(self) -> SlidingWindow:
        rules = Rules()
        require_distinct(rules, self.layers or [], ("layers",))
        rules.check()
        return self


def sliding_layers(window: SlidingWindow | None, n_layers: int) -> frozenset[int]:
    """The layers of ``n_layers`` whose attention slides over ``window``: those it lists, else every one."""
    if window is None:
        return frozenset()
    return frozenset(range(n_layers) if window.layers is None else window.layers)


EMBEDDING_NORM = "a norm after the summed embeddings (BERT, BLOOM)"

# T5 v1.0 multiplies the final hidden state by d_model^-0.5 before its LM head, which is tied to the
# embeddings (whose scale is that of the inputs).
SCALE_OUTPUT = "multiply the last hidden state by d_model^-0.5 before the LM head (T5 with a tied head)"


class DecoderSpec(TransformerSpec):
    """A decoder-only Transformer (GPT, LLaMA): causal self-attention, an LM head."""

    family: Literal["decoder"] = "decoder"
    scale_output: bool = Field(False, description=SCALE_OUTPUT)
    embedding_norm: bool = Field(False, description=EMBEDDING_NORM)
    logit_softcap: PositiveFloat | None = Field(
        None,
        description="cap the logits to c * tanh(logits / c), in training and generation (Gemma 2: 30); "
        "default none",
    )
    embedding_multiplier: PositiveFloat = Field(
        1.0,
        description="the token embeddings times this (after scale_embeddings' sqrt(d_model)), before "
        "positions are added (Granite's embedding_multiplier)",
    )
    logit_multiplier: PositiveFloat = Field(
        1.0,
        description="the logits times this, before logit_softcap, in training and generation (Cohere's "
        "logit_scale, Granite's 1 / logits_scaling)",
    )
    window: SlidingWindow | None = Field(
        None, description="sliding-window attention in some or every layer; default: none"
    )
    vocab_multiple_of: Annotated[
        PositiveInt,
        at_most(
            MAX_VOCAB_MULTIPLE,
            "GPU matmuls want multiples of 64 or 128 (Megatron pads to 128 per tensor-parallel GPU); "
            "a larger multiple only adds rows that are never used",
        ),
    ] = Field(
        1,
        description="pad the embedding and LM head to a multiple of this many rows (64: GPT-2's 50257 -> "
        "50304) for faster GPU matmuls; the padded rows are never input, target or sampled (the logits "
        f"have vocab_size columns) and exports drop them; at most {MAX_VOCAB_MULTIPLE:,}",
    )

    @model_validator(mode="after")
    def _window_layers(self) -> DecoderSpec:
        rules = Rules()
        if self.window is not None:
            require_within(rules, self.window.layers or [], self.n_layers, ("window", "layers"))
        rules.check()
        return self

    @property
    def causal(self) -> bool:
        return True

    @property
    def sliding_layers(self) -> frozenset[int]:
        """The layers whose attention slides over ``window.size`` positions."""
        return sliding_layers(self.window, self.n_layers)

    @property
    def vocab_rows(self) -> int:
        m = self.vocab_multiple_of
        return -(-self._vocab() // m) * m

    def body_parameters(self) -> int:
        return (
            self.vocab_rows * self.d_model
            + self.positional.parameters(self)
            + (self.norm.parameters(self.d_model) if self.embedding_norm else 0)
            + self.stack_parameters(self.n_layers)
            + self.final_norm_parameters()
        )


class EncoderSpec(TransformerSpec):
    """A bidirectional encoder (BERT): no causal mask, segment embeddings, a task head on top."""

    family: Literal["encoder"] = "encoder"
    type_vocab_size: Annotated[int, Field(strict=True, ge=0), at_most(MAX_VOCAB, VOCABULARIES)] = Field(
        2, description="segment (token type) embeddings: 2 for sentence pairs, 0 for none"
    )
    embedding_norm: bool = Field(False, description=EMBEDDING_NORM)
    embedding_size: Width | None = Field(
        None,
        description="factorized embeddings (ALBERT, ELECTRA): the token, position and segment embeddings "
        "and their norm are this wide, and a linear layer projects them to d_model; a masked LM's head "
        "projects back to it before the vocabulary; default d_model (no projection)",
    )
    share_layers: bool = Field(
        False,
        description="cross-layer sharing (ALBERT): every one of the n_layers layers applies the same block's "
        "weights, so the blocks count once; no stochastic depth (dropout.path) with it",
    )
    pooler: bool = Field(
        True,
        description="BERT's pooler, tanh(dense) of the final [CLS] state, which classification and "
        "next-sentence prediction read; a masked LM alone needs none",
    )
    pooler_activation: Literal["tanh", "relu", "gelu"] = Field(
        "tanh",
        description="what follows the pooler's dense layer: tanh (BERT's pooler), relu (DistilBERT's "
        "classifier head, pre_classifier and ReLU) or gelu (ELECTRA's classifier head, its erf GELU); "
        "the parameters are the same",
    )
    pooling: Literal["cls", "mean"] = Field(
        "cls",
        description="what the pooler reads: cls, the final state at position 0 ([CLS], BERT's); mean, "
        "the mean of the real tokens' final states (ModernBERT's classifier_pooling: mean)",
    )
    pooler_norm: bool = Field(
        False,
        description="a norm (the norm section's type, eps, scale and bias) after the pooler's "
        "activation (ModernBERT's head: dense, GELU, LayerNorm)",
    )
    window: SlidingWindow | None = Field(
        None,
        description="local attention in some or every layer: a query attends to the (size - 1) / 2 "
        "positions on either side of it and itself (ModernBERT's local_attention + 1); an odd size; "
        "default: none",
    )

    @property
    def causal(self) -> bool:
        return False

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.d_model

    @property
    def projects_embeddings(self) -> bool:
        """Whether a linear layer takes the embeddings (embedding_size wide) to d_model."""
        return self.embedding_width != self.d_model

    @model_validator(mode="after")
    def _encoder_rules(self) -> EncoderSpec:
        if self.embedding_size is None:
            self._resolve(embedding_size=self.d_model)
        rules = Rules()
        rules.require(
            not self.share_layers or self.dropout.path == 0,
            ("dropout", "path"),
            "stochastic depth drops each layer at its own rate, and shared layers are one block",
            "set model.dropout.path: 0, or model.share_layers: false",
        )
        rules.require(
            not self.share_layers or self.norm.first_attention,
            ("norm", "first_attention"),
            "leaves out the first layer's attention norm, and shared layers are one block",
            "set model.norm.first_attention: true, or model.share_layers: false",
        )
        for name, default in (("pooling", "cls"), ("pooler_norm", False)):
            rules.require(
                self.pooler or getattr(self, name) == default,
                (name,),
                "shapes the pooler, and the model has none",
                "set model.pooler: true, or leave it out",
            )
        if self.window is not None:
            require_within(rules, self.window.layers or [], self.n_layers, ("window", "layers"))
            rules.require(
                self.window.size % 2 == 1,
                ("window", "size"),
                f"is {self.window.size}: an encoder's window holds a query and as many positions on either "
                "side of it, an odd count",
                f"use {self.window.size + 1} ({self.window.size // 2} on either side), or "
                f"{self.window.size - 1}",
            )
        rules.check()
        return self

    @property
    def sliding_layers(self) -> frozenset[int]:
        """The layers whose attention slides over ``window.size`` positions."""
        return sliding_layers(self.window, self.n_layers)

    def body_parameters(self) -> int:
        d, e = self.d_model, self.embedding_width
        return (
            (self._vocab() + self.type_vocab_size) * e
            + self.positional.parameters(self)
            + (self.norm.parameters(e) if self.embedding_norm else 0)
            + (e * d + d) * self.projects_embeddings
            + self.stack_parameters(1 if self.share_layers else self.n_layers)
            + self.final_norm_parameters()
            + (d * d + d + (self.norm.parameters(d) if self.pooler_norm else 0)) * self.pooler
        )


class EncoderDecoderSpec(TransformerSpec):
    """The Transformer of Vaswani et al. 2017 (and T5): an encoder over the source, a causal
    decoder over the target with cross-attention to the encoder's output in every block.
    ``n_layers`` is the encoder's depth."""

    family: Literal["encoder_decoder"] = "encoder_decoder"
    n_decoder_layers: Depth | None = Field(None, description=f"default: n_layers; at most {MAX_LAYERS:,}")
    share_embeddings: bool = Field(True, description="one embedding table for source and target")
    scale_output: bool = Field(False, description=SCALE_OUTPUT)
    embedding_norm: bool = Field(
        False, description="a norm after the summed embeddings, one in each stack (BART, mBART)"
    )

    @model_validator(mode="after")
    def _resolve_depth_and_check_stacks(self) -> EncoderDecoderSpec:
        if self.n_decoder_layers is None:
            self._resolve(n_decoder_layers=self.n_layers)
        assert self.n_decoder_layers is not None
        rules = Rules()
        rules.require(
            self.block.type == "sequential",
            ("block",),
            "the decoder's blocks attend to the encoder's output between self-attention and "
            "feed-forward, which a parallel block has no place for",
            "use block: sequential",
        )
        lists = self.positional.layer_lists() if isinstance(self.positional, RopePositional) else {}
        for field, layers in lists.items():
            require_within(
                rules,
                layers,
                self.n_decoder_layers,
                field,
                counts="in each stack, and the decoder has {n}",
                more=", or give the decoder more (n_decoder_layers)",
            )
        rules.check()
        return self

    def body_parameters(self) -> int:
        assert self.n_decoder_layers is not None
        return (
            self._vocab() * self.d_model * (1 if self.share_embeddings else 2)
            + 2 * self.positional.parameters(self)  # the encoder's and the decoder's
            + 2 * (self.norm.parameters(self.d_model) if self.embedding_norm else 0)
            + self.stack_parameters(self.n_layers)
            + self.stack_parameters(self.n_decoder_layers, cross_attention=True)
            + 2 * self.final_norm_parameters()
        )


class VitSpec(TransformerSpec):
    """The Vision Transformer (Dosovitskiy et al. 2020): an image cut into square patches, each
    projected linearly, a learned [CLS] token in front, an encoder, and a classifier head on the
    final [CLS] state (or on the mean of the patch states). The sequence is the patches (+ [CLS]),
    so ``max_seq_len`` follows from the sizes."""

    data_sizes: ClassVar[tuple[str, ...]] = ()  # pixels, not tokens: no vocabulary

    family: Literal["vit"] = "vit"
    image_size: Annotated[
        PositiveInt, at_most(MAX_IMAGE_SIZE, "8,192 x 8,192 pixels are 67M patches of one pixel")
    ] = Field(description=f"height and width in pixels; images are resized to it; at most {MAX_IMAGE_SIZE:,}")
    channels: Annotated[
        PositiveInt, at_most(MAX_CHANNELS, "RGB has 3; hyperspectral images have a few hundred")
    ] = Field(3, description=f"3 for RGB, 1 for grey; at most {MAX_CHANNELS:,}")
    patch_size: PositiveInt = Field(description="side of the square patches; must divide image_size")
    pooling: Literal["cls", "mean"] = Field(
        "cls", description="cls: classify the final [CLS] state; mean: the mean patch state (no [CLS])"
    )
    max_seq_len: PositiveInt | None = Field(  # type: ignore[assignment]
        None, description="the patches, plus one for [CLS]: set from the sizes"
    )

    @property
    def grid(self) -> int:
        """Patches along each side."""
        return self.image_size // self.patch_size

    @property
    def prefix_tokens(self) -> int:
        """Tokens in front of the patches: [CLS] with cls pooling."""
        return int(self.pooling == "cls")

    @model_validator(mode="after")
    def _vit_rules(self) -> VitSpec:
        rules = Rules()
        divides = self.image_size % self.patch_size == 0
        rules.require(
            divides,
            ("patch_size",),
            f"must divide image_size ({self.image_size}), found {self.patch_size}",
            lambda: (
                f"use a divisor of {self.image_size}, e.g. "
                f"{_nearest_divisor(self.image_size, self.patch_size)}"
            ),
        )
        rules.require(
            self.vocab_size is None,
            ("vocab_size",),
            f"a ViT reads pixels, not tokens, found vocab_size {self.vocab_size}",
            "remove model.vocab_size",
        )
        rules.require(
            not self.scale_embeddings,
            ("scale_embeddings",),
            "a ViT has no token embeddings to scale (its patches are projected)",
            "remove model.scale_embeddings",
        )
        rules.require(
            not self.bias.lm_head,
            ("bias", "lm_head"),
            "a ViT has no language-model head (its classifier head always has a bias)",
            "remove model.bias.lm_head",
        )
        rules.require(
            self.positional.type in ("learned", "sinusoidal", "none"),
            ("positional",),
            f"a ViT's positions are patch indices: learned, sinusoidal (2-D) or none, "
            f"found {self.positional.type!r}",
            "use learned (as in the ViT paper) or sinusoidal",
        )
        if isinstance(self.positional, SinusoidalPositional):
            rules.require(
                self.positional.offset == 0,
                ("positional", "offset"),
                "moves the patches' positions, which are grid indices from 0",
                "leave it out",
            )
            rules.require(
                self.positional.spacing == "vaswani" or self.d_model >= 8,
                ("positional", "spacing"),
                f"spaces each axis's d_model/4 frequencies over d_model/4 - 1 steps, and d_model is "
                f"{self.d_model}",
                "use a d_model of 8 or more, or spacing: vaswani",
            )
            rules.require(
                self.d_model % 4 == 0,
                ("d_model",),
                f"2-D sinusoidal positions give half of d_model to rows and half to columns, each "
                f"as sin/cos pairs, so d_model must be a multiple of 4, found {self.d_model}",
                f"use {self.d_model + (-self.d_model) % 4}",
            )
        if divides:
            length = self.grid**2 + self.prefix_tokens
            rules.require(
                self.max_seq_len in (None, length),
                ("max_seq_len",),
                f"is set by the sizes: {self.grid}x{self.grid} patches"
                f"{' + [CLS]' if self.prefix_tokens else ''} = {length}, found {self.max_seq_len}",
                "remove model.max_seq_len",
            )
            self._resolve(max_seq_len=length)
            self._require_scores_fit(rules, length, ("image_size",))
        rules.check()
        return self

    @property
    def causal(self) -> bool:
        return False

    def body_parameters(self) -> int:
        d = self.d_model
        return (
            (self.channels * self.patch_size**2 + 1) * d  # the patch projection and its bias
            + self.prefix_tokens * d  # the [CLS] token
            + self.positional.parameters(self)
            + self.stack_parameters(self.n_layers)
            + self.final_norm_parameters()
        )

    def describe_input(self, context: int) -> str:
        return (
            f"(batch 1, {self.channels}, {self.image_size}, {self.image_size}) pixel values, "
            f"{self.grid}x{self.grid} patches of {self.patch_size}, sequence {context}"
        )


def _family(value: Any) -> str | None:
    """``family`` picks the model variant; a spec without one is a decoder."""
    if isinstance(value, dict):
        return value.get("family", "decoder")
    return getattr(value, "family", None)


ModelSpec = Annotated[
    Annotated[DecoderSpec, Tag("decoder")]
    | Annotated[EncoderSpec, Tag("encoder")]
    | Annotated[EncoderDecoderSpec, Tag("encoder_decoder")]
    | Annotated[VitSpec, Tag("vit")],
    Discriminator(_family),
]


# ----------------------------------------------------------------------------- data


class CharTokenizer(Section):
    type: Literal["char"] = "char"


class BpeTokenizer(Section):
    """Byte-level BPE: the 256 bytes, the task's special tokens, then merges up to vocab_size."""

    type: Literal["bpe"] = "bpe"
    vocab_size: TokenizerVocab = 8000
    min_frequency: PositiveInt = 2

    @field_validator("vocab_size")
    @classmethod
    def _holds_the_bytes(cls, value: int) -> int:
        if value < BYTES:
            raise ValueError(
                f"byte-level BPE begins with its {BYTES} byte tokens, so vocab_size must be at least "
                f"{BYTES}, found {value} (tokenizer: char gives a vocabulary of the text's characters)"
            )
        return value


class WordPieceTokenizer(Section):
    """BERT's subword tokenizer: words split on whitespace and punctuation, then into pieces."""

    type: Literal["wordpiece"] = "wordpiece"
    vocab_size: TokenizerVocab = 8000
    min_frequency: PositiveInt = 2
    lowercase: bool = True


Tokenizer = Annotated[CharTokenizer | BpeTokenizer | WordPieceTokenizer, Field(discriminator="type")]


# The data fields that name a file or folder.
DATA_PATHS = ("path", "val_path", "test_path")


class DataSpec(Section):
    # The data sets data.builtin names (shipped with an installed package), and what each is.
    builtins: ClassVar[dict[str, str]] = {"digits": "an image set"}

    path: Path | None = Field(
        None,
        description="relative to the spec file: a text file or a folder of .txt files (language "
        "modelling), a .tsv/.csv/.jsonl table, optionally gzipped (classification), or a folder "
        "with one sub-folder of images per class (image classification)",
    )
    builtin: Literal["digits"] | None = Field(
        None, description="a data set shipped with a package instead of path: scikit-learn's 8x8 digits"
    )
    val_path: Path | None = Field(None, description="a separate validation file; default: split off path")
    test_path: Path | None = Field(
        None, description="scored after training: BLEU for translation, accuracy for images"
    )
    tokenizer: Tokenizer = CharTokenizer()
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = Field(0.1, description="the last part is validation")
    test_fraction: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="images: hold out this part for the test accuracy, when there is no test_path"
    )

    _tokenizer_shorthand = short_form("tokenizer")

    @field_validator(*DATA_PATHS, mode="before")
    @classmethod
    def _not_blank(cls, value: Any) -> Any:
        """An empty path would be the spec's own folder (Path("") is ".")."""
        if isinstance(value, str) and not value.strip():
            raise ValueError(
                f"expected the path of a file or folder, found {value!r}: write the path, relative to "
                "the spec's folder (. for the folder itself), or leave the field out"
            )
        return value

    @model_validator(mode="after")
    def _rules(self) -> DataSpec:
        rules = Rules()
        rules.require(
            (self.path is None) != (self.builtin is None),
            ("path",),
            "give exactly one of data.path and data.builtin"
            + (", found both" if self.path is not None else ", found neither"),
            "data.path names a file or folder; data.builtin: digits is scikit-learn's digits set",
        )
        rules.check()
        return self

    def relative_to(self, folder: Path) -> DataSpec:
        """The same section with relative paths resolved against ``folder`` (the spec's)."""
        return self.model_copy(
            update={
                f: _resolved(folder / getattr(self, f)) for f in DATA_PATHS if getattr(self, f) is not None
            }
        )


def _resolved(path: Path) -> Path:
    """``path`` with its links followed; as it is (made absolute) where they loop, for the reader to
    say so (Path.resolve raises RuntimeError for a loop, before Python 3.13)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return path.absolute()


# ----------------------------------------------------------------------------- task


# The data fields that name or size a split beside data.path, read by the tasks that declare them.
SPLIT_FIELDS = ("val_path", "test_path", "test_fraction")


class TaskSection(Section):
    """A ``task:`` section. Each task declares, besides its fields, what the spec layer checks
    without knowing the task: the model families it trains, the built-in data sets it reads, the
    optional data fields it reads (``data_splits``: a spec setting another would be ignored), the
    fields training takes from the data when the spec leaves them out, whether its loss can run
    in chunks (``train.loss_chunk_tokens``), the placeholder its data paths must hold
    (``path_placeholder``: one file per side, as translation's ``{lang}``), and the parameters of
    the head it puts on the family's body."""

    families: ClassVar[tuple[str, ...]]
    builtin_data: ClassVar[tuple[str, ...]] = ()
    data_splits: ClassVar[tuple[str, ...]] = ()
    path_placeholder: ClassVar[str | None] = None
    data_sizes: ClassVar[tuple[str, ...]] = ()
    chunked_loss: ClassVar[bool] = False

    type: str

    def resolved(self, model: Any) -> TaskSection:
        """The section with defaults that depend on the model filled in."""
        return self

    def check(self, model: Any, rules: Rules) -> None:
        """Rules that join the task's fields with the model's (report each at ``("task", field)``)."""

    def shortest_example(self) -> tuple[int, str]:
        """The fewest tokens an example of the task takes, and what they are: the training context
        (train.context_length, default model.max_seq_len) must hold them."""
        return 1, "one token or image"

    def reserved_tokens(self) -> tuple[str, ...]:
        """The special tokens the task reserves at the first ids of a vocabulary it trains: the
        model's vocab_size must hold them and a token of text."""
        return ()

    def roles(self) -> dict[str, str]:
        """The roles of the special tokens (the spec's ``tokens:``) the task's fields name, each
        with the first field that names it."""
        return {}

    def head_parameters(self, model: Any) -> int:
        """Parameters of what the task adds on top of ``model.body_parameters()``."""
        raise NotImplementedError

    def data_files(self, path: Path) -> dict[str, Path]:
        """The files (or image folders) a data path names, by side where the task's paths hold
        ``path_placeholder`` (one each), else {"": path}."""
        return {"": path}


TASK_SECTIONS: dict[str, type[TaskSection]] = {}


def register_task_section(cls: type[TaskSection]) -> type[TaskSection]:
    """Add a task's section to the ``task:`` union of ``Spec`` (which is rebuilt)."""
    name = cls.model_fields["type"].default
    if TASK_SECTIONS.get(name, cls) is not cls:
        raise ValueError(f"task {name!r} is already registered")
    TASK_SECTIONS[name] = cls
    if "Spec" in globals():
        Spec.model_fields["task"] = FieldInfo.from_annotated_attribute(_task_union(), CausalLMTask())
        Spec.model_rebuild(force=True)
    return cls


def _task_union() -> Any:
    return Annotated[Union[tuple(TASK_SECTIONS.values())], Field(discriminator="type")]  # noqa: UP007


def _require_pooler(model: Any, rules: Rules, reader: str) -> None:
    rules.require(
        getattr(model, "pooler", True),
        ("model", "pooler"),
        f"{reader} reads the pooled [CLS] state, but the model has no pooler",
        "set model.pooler: true",
    )


def _require_segments(model: Any, rules: Rules, reader: str, fine_tuning: str = "") -> None:
    rules.require(
        getattr(model, "type_vocab_size", 2) != 1,
        ("model", "type_vocab_size"),
        f"{reader} reads sentence pairs, the second as segment 1, but type_vocab_size 1 embeds segment 0 "
        "alone",
        f"set model.type_vocab_size: 2{fine_tuning}, or 0 for no segment embeddings (not with "
        "train.init_from a run that has them)",
    )


def _check_labels(labels: list[str]) -> list[str]:
    """A task's class names: two at least (as training requires of the data's), each once (the
    n-th is the head's n-th output)."""
    rules = Rules()
    rules.require(
        len(labels) >= 2,
        (),
        f"names {listed(labels) or 'no class'}, but a classifier tells two classes at least",
        "list the class names in class-index order, or leave task.labels out to take them from the data",
    )
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    rules.require(
        not repeated,
        (),
        f"names {listed(repeated)} more than once, so two outputs would have one name",
        "give each class one name, in class-index order",
    )
    rules.check()
    return labels


Labels = Annotated[list[str], AfterValidator(_check_labels)]


def _once_each(tokens: list[str]) -> list[str]:
    """A task's list of token strings names each once."""
    rules = Rules()
    repeated = sorted(t for t, n in collections.Counter(tokens).items() if n > 1)
    rules.require(
        not repeated, (), f"names {', '.join(map(repr, repeated))} more than once", "list each token once"
    )
    rules.check()
    return tokens


# Tokens of the run's tokenizer, by their strings, each once.
TokenStrings = Annotated[list[Annotated[str, Field(min_length=1)]], AfterValidator(_once_each)]
# Sequences of two tokens or more that generation never completes, each token a string of the run's
# tokenizer (transformers' bad_words_ids of several tokens).
BannedSequences = Annotated[
    list[
        Annotated[
            list[Annotated[str, Field(min_length=1)]], Field(min_length=2, max_length=MAX_BANNED_SEQUENCE)
        ]
    ],
    Field(max_length=MAX_BANNED_SEQUENCES),
]


def _labels_head(model: Any, labels: list[str] | None) -> int:
    if labels is None:
        raise ValueError("task.labels is not set")
    return (model.d_model + 1) * len(labels)


# A causal_lm task's fields that are its bundle's generation defaults (the manifest's fields of the
# same names), which `tfcompile sample` and `generate` options override.
GENERATION_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")


@register_task_section
class CausalLMTask(TaskSection):
    families = ("decoder",)
    chunked_loss = True

    type: Literal["causal_lm"] = "causal_lm"
    label_smoothing: Probability = 0.0
    special_tokens: bool = Field(
        True,
        description="reserve [PAD], [UNK] and [EOS] at ids 0-2 of a new vocabulary; [EOS] ends each "
        "document (each file of a folder), so generation can stop. false: the corpus's symbols alone",
    )
    stop_tokens: Annotated[TokenStrings, Field(max_length=MAX_STOP_TOKENS)] = Field(
        [],
        description="tokens beside the eos at which generated text ends, each one token of the run's "
        "tokenizer (an instruct model's end of turn, Llama 3's <|eot_id|>: transformers' eos_token_id "
        "list); none by default",
    )
    stop_at_eos: bool = Field(
        True,
        description="generated text ends at the tokenizer's eos. false: at task.stop_tokens alone (a "
        "checkpoint whose eos_token_id is null, or leaves the tokenizer's eos out: generate() runs past it)",
    )
    # The bundle's generation defaults, for a request that names none.
    max_new_tokens: Annotated[PositiveInt, Field(le=MAX_NEW_TOKENS)] = Field(
        DEFAULT_MAX_NEW_TOKENS, description="new tokens a request gets by default, a stop token included"
    )
    temperature: Annotated[float, Field(ge=0)] = Field(
        DEFAULT_TEMPERATURE, description="generation's default temperature (0: greedy)"
    )
    top_k: PositiveInt | None = Field(None, description="generation's default top_k; null: every token")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="generation's default top_p; null: every token"
    )
    min_p: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None,
        description="generation's default min_p: after top_k and top_p, keep the tokens at least min_p "
        "times as probable as the likeliest (transformers' and vLLM's); null: every token",
    )
    repetition_penalty: Annotated[float, Field(ge=REPETITION_PENALTIES[0], le=REPETITION_PENALTIES[1])] = (
        Field(
            1.0,
            description="generation's default repetition penalty: the logit of a token the text holds "
            "already divided by it where positive, multiplied where negative (transformers'); 1: none",
        )
    )
    min_new_tokens: Annotated[int, Field(strict=True, ge=0, le=MAX_NEW_TOKENS)] = Field(
        0,
        description="generation's default least new tokens: no stop token ends a text before it has "
        "generated this many (transformers' min_new_tokens); 0: any length",
    )
    min_length: Annotated[int, Field(strict=True, ge=0, le=MAX_NEW_TOKENS)] = Field(
        0,
        description="no stop token ends a text while it holds fewer tokens, its prompt's included "
        "(transformers' min_length); 0: any length",
    )
    no_repeat_ngram_size: Annotated[int, Field(strict=True, ge=0, le=MAX_NEW_TOKENS)] = Field(
        0,
        description="no n-gram of this many tokens occurs twice in a text, its prompt included "
        "(transformers' no_repeat_ngram_size); 0: no such ban",
    )
    suppressed_tokens: Annotated[TokenStrings, Field(max_length=MAX_SUPPRESSED_TOKENS)] = Field(
        [],
        description="tokens generation never chooses, each one token of the run's tokenizer "
        "(transformers' suppress_tokens and bad_words_ids of one token); none by default",
    )
    banned_sequences: BannedSequences = Field(
        [],
        description="sequences of two tokens or more a text never holds: the last is never chosen right "
        "after the others (transformers' bad_words_ids of several tokens); none by default",
    )

    def reserved_tokens(self) -> tuple[str, ...]:
        return CAUSAL_LM_TOKENS if self.special_tokens else ()

    def check(self, model: Any, rules: Rules) -> None:
        stopped = [t for t in self.suppressed_tokens if t in self.stop_tokens]
        rules.require(
            not stopped,
            ("task", "suppressed_tokens"),
            f"holds the stop tokens {stopped}, which would then never end a text",
            "leave them out of one of task.stop_tokens and task.suppressed_tokens",
        )
        rules.require(
            self.min_new_tokens <= self.max_new_tokens,
            ("task", "min_new_tokens"),
            f"must be at most task.max_new_tokens ({self.max_new_tokens}), found {self.min_new_tokens}: no "
            f"text would end at a stop token by default",
            f"lower it to {self.max_new_tokens} or below, or raise task.max_new_tokens",
        )

    def head_parameters(self, model: Any) -> int:
        return model.lm_head_parameters()


@register_task_section
class MaskedLMTask(TaskSection):
    """BERT pretraining: of the non-special tokens, ``mask_prob`` are chosen; of those, 80% become
    [MASK], 10% a random token, 10% stay; the loss covers the chosen positions only."""

    families = ("encoder",)

    type: Literal["masked_lm"] = "masked_lm"
    mask_prob: Annotated[float, Field(gt=0, lt=1)] = 0.15
    mask_token_prob: Probability = Field(0.8, description="of the chosen: replaced by [MASK]")
    random_token_prob: Probability = Field(0.1, description="of the chosen: replaced by a random token")
    next_sentence: bool = Field(
        False, description="also predict whether B follows A in [CLS] A [SEP] B [SEP] (half do)"
    )

    @model_validator(mode="after")
    def _rules(self) -> MaskedLMTask:
        rules = Rules()
        rules.require(
            self.mask_token_prob + self.random_token_prob <= 1,
            ("random_token_prob",),
            f"mask_token_prob + random_token_prob must be at most 1, found "
            f"{self.mask_token_prob} + {self.random_token_prob}",
            "BERT uses 0.8 and 0.1: the remaining 0.1 of the chosen tokens stay unchanged",
        )
        rules.check()
        return self

    def shortest_example(self) -> tuple[int, str]:
        if self.next_sentence:
            return 5, "[CLS] A [SEP] B [SEP], a token to mask in each sentence"
        return 3, "[CLS] A [SEP], a token to mask in A"

    def reserved_tokens(self) -> tuple[str, ...]:
        return SPECIAL_TOKENS

    def check(self, model: Any, rules: Rules) -> None:
        if self.next_sentence:
            _require_pooler(model, rules, "next-sentence prediction")
            _require_segments(model, rules, "next-sentence prediction")

    def head_parameters(self, model: Any) -> int:
        d, e = model.d_model, model.embedding_width
        transform = d * e + e + model.norm.parameters(e)  # dense to the embeddings' width + norm
        return transform + model.lm_head_parameters() + (2 * d + 2 if self.next_sentence else 0)


@register_task_section
class ClassificationTask(TaskSection):
    """Label a sentence, or a pair ``[CLS] A [SEP] B [SEP]``, from the final [CLS] state."""

    families = ("encoder",)
    data_splits = ("val_path",)
    data_sizes = ("labels",)

    type: Literal["classification"] = "classification"
    text_column: str = "sentence"
    pair_column: str | None = Field(None, description="the second sentence of a pair, if any")
    label_column: str = "label"
    labels: Labels | None = Field(
        None, description="label names in class-index order; default: the training file's, sorted"
    )
    label_smoothing: Probability = 0.0

    def shortest_example(self) -> tuple[int, str]:
        # BERT's framing, which tfcompile's tokenizers get. An imported tokenizer keeps its own
        # (RoBERTa's <s> A </s></s> B </s> takes 6), which the spec cannot see: the task counts it
        # against the context when it reads the data.
        if self.pair_column:
            return 5, "[CLS] A [SEP] B [SEP], a token of each sentence"
        return 3, "[CLS] A [SEP], a token of the sentence"

    def reserved_tokens(self) -> tuple[str, ...]:
        return SPECIAL_TOKENS

    def check(self, model: Any, rules: Rules) -> None:
        _require_pooler(model, rules, "a sentence classifier")
        # Whatever its tokenizer gives (RoBERTa's puts a pair in segment 0): a bundle's
        # token_type_ids take 0 and 1, which its graphs are checked on.
        _require_segments(
            model,
            rules,
            "a sentence classifier's bundle",
            " (train.init_from a run with one row, an imported RoBERTa's, starts the second as a copy of it)",
        )

    def head_parameters(self, model: Any) -> int:
        return _labels_head(model, self.labels)


@register_task_section
class Seq2SeqTask(TaskSection):
    """Translation: teacher-forced next-token loss on the target, given the source."""

    families = ("encoder_decoder",)
    data_splits = ("val_path", "test_path")
    path_placeholder = "{lang}"

    type: Literal["seq2seq"] = "seq2seq"
    source: str = Field("de", description="the source side: what {lang} becomes in data paths")
    target: str = Field("en", description="the target side")
    label_smoothing: Probability = 0.1
    beam: Annotated[PositiveInt, Field(le=MAX_BEAM)] = Field(
        4, description="beam size for the test translations (and the bundle's default); 1 is greedy"
    )
    beam_scoring: BeamScoringName = Field(
        "fairseq",
        description="whose beam search: fairseq's (Vaswani et al.'s: a finished hypothesis scores "
        "log p / ((5 + length) / 6) ** length_penalty, Wu et al. 2016; it ends once beam have finished) "
        "or transformers' generate()'s (log p / length ** length_penalty, ending as early_stopping says)",
    )
    length_penalty: Annotated[float, Field(ge=-MAX_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY)] | None = Field(
        None,
        description="fairseq's alpha, at least 0 (default 0.6), or transformers' power of the length "
        "(default 1.0; below 0 favours shorter translations)",
    )
    early_stopping: EarlyStopping = Field(
        False,
        description="transformers' beam search ends once beam have finished (true), once the best live "
        "hypothesis cannot beat them at its present length (false), or at its longest length (never)",
    )
    max_decode_len: PositiveInt | None = Field(None, description="default: the model's max_seq_len - 1")
    forced_eos: bool = Field(
        False,
        description="a translation that reaches max_decode_len ends with eos in its last place, a token "
        "sooner (transformers' forced_eos_token_id, which the BART family's configs set)",
    )
    min_decode_len: Annotated[int, Field(strict=True, ge=0)] = Field(
        0,
        description="the eos cannot end a translation before the decoder holds this many tokens after "
        "bos, counted as max_decode_len counts them (transformers' min_new_tokens); 0: any length",
    )
    no_repeat_ngram_size: Annotated[int, Field(strict=True, ge=0)] = Field(
        0,
        description="no n-gram of this many tokens occurs twice in a translation, bos and the target "
        "prefix included (transformers' no_repeat_ngram_size); 0: no such ban",
    )
    suppressed_tokens: Annotated[TokenStrings, Field(max_length=MAX_SUPPRESSED_TOKENS)] = Field(
        [],
        description="tokens a translation never holds, each one token of the run's tokenizer (Marian's "
        "<pad>: transformers' suppress_tokens and bad_words_ids of one token); none by default",
    )
    banned_sequences: BannedSequences = Field(
        [],
        description="sequences of two tokens or more a translation never holds: the last is never chosen "
        "right after the others (transformers' bad_words_ids of several tokens); none by default",
    )
    source_suffix: list[Literal["eos", "source_language"]] = Field(
        [],
        description="special tokens appended to every source, by role (T5's tokenizer appends eos, "
        "mBART's eos and the source's language code)",
    )
    source_prefix: list[Literal["cls", "source_language"]] = Field(
        [],
        description="special tokens put before every source, by role (BART's tokenizer puts its <s>, "
        "its cls token; NLLB's the source's language code); a tokenizer trained here then reserves "
        "[CLS] after [EOS]",
    )
    target_prefix: list[Literal["cls", "target_language"]] = Field(
        [],
        description="special tokens every target starts with after bos, by role, given to the decoder "
        "rather than predicted when translating (transformers' forced_bos_token_id: NLLB's and M2M100's "
        "target language code, BART-large-CNN's <s>); trained as the target's first tokens",
    )

    def reserved_tokens(self) -> tuple[str, ...]:
        return SEQ2SEQ_TOKENS + ((CLS,) if "cls" in self.roles() else ())

    def roles(self) -> dict[str, str]:
        named: dict[str, str] = {}
        for field in ("source_prefix", "source_suffix", "target_prefix"):
            for role in getattr(self, field):
                named.setdefault(role, field)
        return named

    def shortest_example(self) -> tuple[int, str]:
        if not self.target_prefix:
            return super().shortest_example()
        return 2 + len(self.target_prefix), "[BOS], the task's target_prefix and a token of the target"

    def resolved(self, model: Any) -> Seq2SeqTask:
        penalty = DEFAULT_LENGTH_PENALTY[self.beam_scoring] if self.length_penalty is None else None
        longest = max(model.max_seq_len - 1, 1) if self.max_decode_len is None else None
        defaults = {"length_penalty": penalty, "max_decode_len": longest}
        return self.model_copy(update={k: v for k, v in defaults.items() if v is not None})

    def check(self, model: Any, rules: Rules) -> None:
        longest = max(model.max_seq_len - 1, 1)  # the decoder reads [BOS] and the tokens before the last
        rules.require(
            self.max_decode_len is None or self.max_decode_len <= longest,
            ("task", "max_decode_len"),
            f"must be at most model.max_seq_len - 1 = {longest}, found {self.max_decode_len}",
            f"lower it to {longest} or raise model.max_seq_len",
        )
        special = len(self.source_prefix) + len(self.source_suffix)
        rules.require(
            special < model.max_seq_len,
            ("task", "source_prefix"),
            f"with source_suffix puts {special} special tokens in every source, which leaves no room for "
            f"a source in model.max_seq_len ({model.max_seq_len})",
            "put fewer, or raise model.max_seq_len",
        )
        fairseq = self.beam_scoring == "fairseq"
        rules.require(
            not fairseq or (self.length_penalty or 0) >= 0,
            ("task", "length_penalty"),
            f"must be at least 0 with beam_scoring fairseq, found {self.length_penalty}",
            "raise it, or set task.beam_scoring: transformers, whose length penalty may be negative",
        )
        rules.require(
            not fairseq or self.early_stopping is False,
            ("task", "early_stopping"),
            f"is transformers' beam search's: fairseq's ends once beam have finished, found "
            f"{self.early_stopping!r}",
            "leave it out, or set task.beam_scoring: transformers",
        )
        decoded = longest if self.max_decode_len is None else self.max_decode_len
        rules.require(
            self.min_decode_len <= decoded,
            ("task", "min_decode_len"),
            f"must be at most task.max_decode_len ({decoded}), found {self.min_decode_len}: no translation "
            f"could end with eos",
            f"lower it to {decoded} or below",
        )
        rules.require(
            self.no_repeat_ngram_size <= model.max_seq_len,
            ("task", "no_repeat_ngram_size"),
            f"must be at most model.max_seq_len ({model.max_seq_len}), found {self.no_repeat_ngram_size}: "
            f"no translation holds an n-gram that long",
            "lower it, or set 0 for no ban",
        )
        rules.require(
            len(self.target_prefix) < decoded,
            ("task", "target_prefix"),
            f"puts {len(self.target_prefix)} tokens before every translation, which leaves none of the "
            f"{decoded} the decoder adds after bos (task.max_decode_len, at most model.max_seq_len - 1)",
            "put fewer, or raise task.max_decode_len or model.max_seq_len",
        )

    def head_parameters(self, model: Any) -> int:
        return model.lm_head_parameters()

    def data_files(self, path: Path) -> dict[str, Path]:
        return {side: self.side_file(path, side) for side in (self.source, self.target)}

    @classmethod
    def side_file(cls, path: Path, side: str) -> Path:
        """``path`` with the placeholder replaced by ``side``: train.{lang}.gz -> train.de.gz."""
        return Path(str(path).replace(cls.path_placeholder or "", side))


class AugmentSpec(Section):
    """Random changes to each training image (never to validation or test images)."""

    shift: Annotated[int, Field(strict=True, ge=0)] = Field(
        0, description="move by up to this many pixels each way (zero-padded, cropped back)"
    )
    flip: bool = Field(False, description="mirror left-right half the time; off where that changes the class")
    rotate: Annotated[float, Field(ge=0, le=180)] = Field(
        0.0, description="turn about the centre by an angle drawn from [-rotate, rotate] degrees"
    )
    scale: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="zoom about the centre by a factor drawn from [1 - scale, 1 + scale]"
    )


@register_task_section
class ImageClassificationTask(TaskSection):
    """Label an image from the final [CLS] state (or the mean patch state)."""

    families = ("vit",)
    builtin_data = ("digits",)
    data_splits = ("val_path", "test_path", "test_fraction")
    data_sizes = ("labels",)

    type: Literal["image_classification"] = "image_classification"
    labels: Labels | None = Field(
        None, description="class names in class-index order; default: the data's, sorted"
    )
    label_smoothing: Probability = 0.0
    augment: AugmentSpec = AugmentSpec()

    def head_parameters(self, model: Any) -> int:
        return _labels_head(model, self.labels)


# ---------------------------------------------------------------------------- train


# A learning rate (or what scales one) that float32 holds, with room for the schedule's factors.
Rate = Annotated[
    PositiveFloat,
    at_most(1e38, "the optimizer steps in float32, whose largest number is 3.4e38; Adam's rates are below 1"),
]


class OptimizerSpec(Section):
    type: Literal["adam", "adamw"] = "adamw"
    lr: Rate = Field(3e-4, description="peak learning rate (constant and cosine schedules)")
    betas: tuple[Probability, Probability] = (0.9, 0.95)
    eps: Annotated[
        float,
        at_least(
            TINY_EPS,
            "float32's smallest normal number: a smaller eps is 0 or a subnormal there, and Adam divides "
            "a weight's first gradients by it (0 / 0 where a weight has none yet)",
        ),
    ] = Field(1e-8, description=f"added to Adam's divisor; at least {TINY_EPS:g}")
    weight_decay: Annotated[float, Field(ge=0)] = Field(
        0.1, description="matrices only, never norms or biases"
    )


class ConstantSchedule(Section):
    type: Literal["constant"] = "constant"
    warmup_steps: Annotated[int, Field(strict=True, ge=0)] = 0


class CosineSchedule(Section):
    type: Literal["cosine"] = "cosine"
    warmup_steps: Annotated[int, Field(strict=True, ge=0)] = 100
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1


class VaswaniSchedule(Section):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5); ignores optimizer.lr."""

    type: Literal["vaswani"] = "vaswani"
    warmup_steps: PositiveInt = 4000
    scale: Rate = 1.0


Schedule = Annotated[ConstantSchedule | CosineSchedule | VaswaniSchedule, Field(discriminator="type")]


# A run's folder name: one path component that cannot climb out of runs_dir or hide.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def is_run_name(name: Any) -> bool:
    """One folder name: ASCII letters, digits, '.', '_' and '-', from a letter or digit, no '..'."""
    return isinstance(name, str) and RUN_NAME.fullmatch(name) is not None and ".." not in name


def check_run_name(name: str) -> str:
    if not is_run_name(name):
        found = repr(name) if len(name) <= 100 else f"{name[:60]!r}... ({len(name):,} characters)"
        raise ValueError(
            f"a run name is one folder name of ASCII letters, digits, '.', '_' and '-' (at most 100, "
            f"starting with a letter or digit, no '..'), found {found}"
        )
    return name


LONGEST = "a billion steps take 12 days at a millisecond each: a run that would not end"


class TrainSpec(Section):
    steps: Annotated[PositiveInt, at_most(MAX_STEPS, LONGEST)] = 5000
    batch_size: PositiveInt = 64
    context_length: PositiveInt | None = Field(None, description="default: model.max_seq_len")
    grad_accum: PositiveInt = 1
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: Schedule = CosineSchedule()
    grad_clip: PositiveFloat | None = Field(1.0, description="max gradient norm; null: no clipping")
    seed: Seed = Field(1337, description=f"from 0 to 2^63 - 1 = {MAX_SEED:,}")
    eval_seed: Seed | None = Field(
        None, description="draws the validation batches; default: seed (a study fixes it for every trial)"
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: Threads | None = Field(
        None,
        description="CPU threads for PyTorch's operators while training; default: torch's, one per core. "
        f"A small model's steps can be faster on fewer: its operators are too short to split. At most "
        f"{MAX_THREADS:,}",
    )
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    compile: bool | None = Field(
        None, description="torch.compile the model; default: on CUDA, off on the CPU"
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="how torchrun's processes share the model: ddp, each holds all of it; fsdp, the "
        "weights, gradients and optimizer state are sharded across them per block (FSDP2), with "
        "sharded checkpoints that resume on any number of processes",
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each block's activations in the backward pass instead of keeping them"
    )
    cpu_offload: bool = Field(
        False,
        description="with parallel fsdp: the sharded weights, gradients and optimizer state kept in host "
        "memory, each block's weights copied to the GPU for its forward and backward, the optimizer "
        "stepping on the CPU (a model whose training state exceeds the GPUs' memory)",
    )
    loss_chunk_tokens: PositiveInt | None = Field(
        None,
        description="causal_lm: the loss over this many tokens' logits at a time, each chunk's recomputed "
        "in backward, so that (tokens x vocabulary) logits never exist at once; null: all at once",
    )
    eval_interval: PositiveInt = 250
    eval_batches: PositiveInt = 20
    checkpoint_interval: PositiveInt = 500
    log_interval: PositiveInt = 10
    runs_dir: Path = Path("runs")
    name: str | None = Field(None, description="run folder name; default: the spec file's stem")
    init_from: Path | None = Field(
        None, description="a pretraining run whose encoder weights and tokenizer start this one"
    )

    _schedule_shorthand = short_form("schedule")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str | None) -> str | None:
        return None if name is None else check_run_name(name)

    @model_validator(mode="after")
    def _default_eval_seed(self) -> TrainSpec:
        if self.eval_seed is None:
            self._resolve(eval_seed=self.seed)
        return self

    @model_validator(mode="after")
    def _sharding_rules(self) -> TrainSpec:
        rules = Rules()
        rules.require(
            self.parallel != "fsdp" or self.precision != "fp16",
            ("precision",),
            "fp16 needs loss scaling, which tfcompile does not do over FSDP's sharded gradients",
            "use precision bf16 (or fp32) with parallel fsdp",
        )
        rules.require(
            self.parallel == "fsdp" or not self.cpu_offload,
            ("cpu_offload",),
            "cpu_offload keeps FSDP's shards in host memory, but parallel is ddp",
            "set train.parallel to fsdp, or leave cpu_offload out",
        )
        rules.check()
        return self


# --------------------------------------------------------------------------- export


# The ONNX opsets an export may ask for: torch.onnx writes opset 18 and converts to 17 and up to
# its ONNX_MAX_OPSET, 23 (its converter fails on later ones).
MIN_OPSET, MAX_OPSET = 17, 23
OPSETS = f"torch.onnx exports opsets {MIN_OPSET} to {MAX_OPSET}: its converter fails on later ones"


class ExportSpec(Section):
    opset: Annotated[int, Field(strict=True, ge=MIN_OPSET), at_most(MAX_OPSET, OPSETS)] = Field(
        18, description=f"from {MIN_OPSET} to {MAX_OPSET}"
    )
    precision: Literal["fp32", "fp16"] = Field(
        "fp32", description="fp16: half-size weights and activations, for GPU serving"
    )
    tolerance: PositiveFloat = Field(
        1e-4,
        description="fp32 graphs: the bound on max |onnxruntime - torch| / max(1, max |torch output|) "
        "against the fp32 model (absolute for outputs within +-1; past that, float32's rounding "
        "grows with the values)",
    )
    fp16_tolerance: PositiveFloat = Field(
        1e-2,
        description="fp16 graphs: the bound on max |difference| / max |torch output| (half precision "
        "keeps about three significant digits whatever the magnitude)",
    )
    cuda_graphs: bool = Field(
        False,
        description="decoders: also write fixed_step.onnx, the decode step at fixed shapes (one token, "
        "a cache of max_seq_len - 1 positions that slides), which the runtime captures once and "
        "replays as a CUDA graph for every token on a GPU",
    )
    out: Path | None = Field(None, description="bundle folder; default exported/NAME")

    @field_validator("tolerance", mode="before")
    @classmethod
    def _legacy_null(cls, value: Any) -> Any:
        """Runs written before fp16_tolerance existed say ``tolerance: null`` for the default."""
        return 1e-4 if value is None else value

    @property
    def parity_tolerance(self) -> float:
        return self.tolerance if self.precision == "fp32" else self.fp16_tolerance


# --------------------------------------------------------------------------- tokens

TokenString = Annotated[str, Field(min_length=1)]


class SpecialTokens(Section):
    """The tokenizer's special tokens by role, for a vocabulary that does not use tfcompile's own
    strings ([PAD] [UNK] [BOS] [EOS] [CLS] [SEP] [MASK]), such as a checkpoint imported from
    Hugging Face. A role left out is one the vocabulary has no token for."""

    pad: TokenString | None = None
    unk: TokenString | None = None
    bos: TokenString | None = Field(
        None, description="what a sequence starts with; a translation decoder's first input (T5: <pad>)"
    )
    eos: TokenString | None = Field(None, description="what ends a sequence: generation stops there")
    cls: TokenString | None = None
    sep: TokenString | None = None
    mask: TokenString | None = None
    source_language: TokenString | None = Field(
        None,
        description="a multilingual translator's code for the sources' language (NLLB: eng_Latn; "
        "M2M100: __en__; mBART-50: en_XX), which task.source_prefix or source_suffix places",
    )
    target_language: TokenString | None = Field(
        None,
        description="its code for the language to translate into (NLLB: fra_Latn), which "
        "task.target_prefix places",
    )

    def roles(self) -> dict[str, str]:
        """Role -> token string, for the roles the vocabulary has."""
        return {role: token for role, token in self.model_dump().items() if token is not None}


# ----------------------------------------------------------------------------- spec


class Spec(Section):
    preset: str | None = Field(None, description="a named preset this spec extends (see presets.py)")
    model: ModelSpec
    data: DataSpec | None = None
    tokens: SpecialTokens | None = Field(
        None, description="special tokens by role; default: tfcompile's own, where the tokenizer has them"
    )
    task: _task_union() = CausalLMTask()  # type: ignore[valid-type]
    train: TrainSpec = TrainSpec()
    export: ExportSpec = ExportSpec()

    _task_shorthand = short_form("task")

    @property
    def context_length(self) -> int:
        assert self.train.context_length is not None  # resolved by _rules
        return self.train.context_length

    @model_validator(mode="after")
    def _rules(self) -> Spec:
        rules = Rules()
        families = self.task.families
        fits = self.model.family in families
        rules.require(
            fits,
            ("task", "type"),
            f"task {self.task.type!r} needs a model of family {' or '.join(map(repr, families))}, "
            f"found {self.model.family!r}",
            f"set model.family: {families[0]}, or a task for {self.model.family} models: "
            f"{listed(t for t, s in TASK_SECTIONS.items() if self.model.family in s.families)}",
        )
        # A task for another family (the default causal_lm for a ViT without `task:`) is one mistake:
        # the rules that join the task with the data or the model would report it again.
        if fits and self.data is not None and self.data.builtin is not None:
            rules.require(
                self.data.builtin in self.task.builtin_data,
                ("data", "builtin"),
                f"{self.data.builtin!r} is {DataSpec.builtins[self.data.builtin]}, but the task is "
                f"{self.task.type!r}",
                "use data.path, or a task that reads it: "
                f"{listed(t for t, s in TASK_SECTIONS.items() if self.data.builtin in s.builtin_data)}",
            )
        for field in SPLIT_FIELDS:
            if fits and self.data is not None and getattr(self.data, field) is not None:
                rules.require(
                    field in self.task.data_splits,
                    ("data", field),
                    f"task {self.task.type!r} does not read data.{field}: it would be ignored",
                    f"leave data.{field} out; the tasks that read it: "
                    f"{listed(t for t, s in TASK_SECTIONS.items() if field in s.data_splits)}",
                )
        mark = self.task.path_placeholder
        for field in DATA_PATHS:
            path = getattr(self.data, field) if fits and self.data is not None and mark else None
            if path is not None:
                rules.require(
                    mark in str(path),
                    ("data", field),
                    f"a {self.task.type} data path holds {mark}, which each side's name replaces, "
                    f"found {str(path)!r}",
                    f"one file per side, named as one path with {mark} in place of the side: "
                    f"e.g. train.{mark}.gz",
                )
        rules.require(
            not fits or self.train.loss_chunk_tokens is None or self.task.chunked_loss,
            ("train", "loss_chunk_tokens"),
            f"task {self.task.type!r} computes its loss in one piece",
            "leave train.loss_chunk_tokens out, or use a task whose loss runs in chunks: "
            f"{listed(t for t, s in TASK_SECTIONS.items() if s.chunked_loss)}",
        )
        assert self.model.max_seq_len is not None  # every family resolves it
        if self.train.context_length is not None:
            rules.require(
                self.train.context_length <= self.model.max_seq_len,
                ("train", "context_length"),
                f"context_length ({self.train.context_length}) exceeds model.max_seq_len "
                f"({self.model.max_seq_len})",
                f"lower it to at most {self.model.max_seq_len} or raise model.max_seq_len",
            )
        shortest, example = self.task.shortest_example()
        context = self.train.context_length or self.model.max_seq_len
        given = self.train.context_length is not None
        rules.require(
            not fits or context >= shortest,
            ("train", "context_length") if given else ("model", "max_seq_len"),
            f"a {self.task.type} example is {example}: {shortest} tokens, more than a context of {context}",
            f"raise it to {shortest} at least",
        )
        reserved = self.task.reserved_tokens()
        vocab_size = getattr(self.model, "vocab_size", None)
        rules.require(
            vocab_size is None or vocab_size > len(reserved),
            ("model", "vocab_size"),
            f"a {self.task.type} vocabulary begins with {len(reserved)} special tokens "
            f"({' '.join(reserved)}), so vocab_size {vocab_size} leaves no token of text",
            f"raise it above {len(reserved)}, or leave it out to take it from the tokenizer",
        )
        own = set(SPECIAL_ROLES.values())
        named = self.tokens.roles() if self.tokens is not None else {}
        for role, field in self.task.roles().items():
            rules.require(
                role in own or role in named,
                ("task", field),
                f"names {role}, a token tfcompile has no string of its own for",
                f"give its string in the spec's tokens: section (tokens: {{{role}: ...}})",
            )
        if fits:
            self.task.check(self.model, rules)
        rules.check()
        if self.train.context_length is None:
            self._resolve(train=self.train.model_copy(update={"context_length": self.model.max_seq_len}))
        self._resolve(task=self.task.resolved(self.model))
        return self

    def sizes_from_data(self) -> list[str]:
        """The dotted fields this spec leaves for training to take from the data."""
        sections = (("model", self.model), ("task", self.task))
        return [
            f"{name}.{field}"
            for name, section in sections
            for field in section.data_sizes
            if getattr(section, field) is None
        ]

    def parameter_count(self) -> int | None:
        """Parameters of the model this spec builds, or None while sizes wait for the data."""
        if self.sizes_from_data():
            return None
        return self.model.body_parameters() + self.task.head_parameters(self.model)

    def replace(self, changes: dict[str, Any]) -> Spec:
        """A new, validated spec with ``changes`` (nested like the YAML) merged in."""
        from tfcompile.spec.presets import merge

        return Spec.model_validate(merge(self.model_dump(), changes))
