"""What each Hugging Face architecture shares: reading its ``config.json`` into spec sections with
every problem collected, the tensors of a checkpoint consumed by name, and the registry of
converters by ``model_type``."""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import torch

from tfcompile.hf.errors import HFError, HFWarning, Problem
from tfcompile.spec import Spec
from tfcompile.spec.schema import EncoderSpec

# Hugging Face's names of the plain (ungated) activations -> the spec's, and back for export-hf:
# GPT-2 (activation_function), BERT and ViT (hidden_act) share them. Every name transformers
# computes as one of the spec's is read: gelu_python is the erf GELU written out, gelu_fast and
# gelu_accurate are gelu_new's tanh formula, relu2 is the squared ReLU.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
    "relu2": "relu2",
    "silu": "silu",
    "swish": "silu",
}
ACTIVATIONS |= dict.fromkeys(
    ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast", "gelu_accurate"), "gelu_tanh"
)
EXPORTED_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "relu2": "relu2",
    "silu": "silu",
}
# The same names gating a second projection (LLaMA's hidden_act, T5's gated-ACT): the spec has a
# gated form of each but ReLU.
GATES = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh"}
GATED_ACTIVATIONS = {hf: GATES[tfc] for hf, tfc in ACTIVATIONS.items() if tfc in GATES}


@dataclass
class Config:
    """``config.json`` as read: each field looked up with its default, and the problems found, so
    that one error names every field that cannot be converted."""

    data: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)
    # Where ``data`` lies in config.json ("text_config." for a multimodal model's language model),
    # so that each problem names the field as the file has it; ``top``: the fields read from the
    # top level all the same (the head class, a tie transformers reads there).
    prefix: str = ""
    top: tuple[str, ...] = ()
    # The fields read under another name the file sets (``aliased``): field -> that name.
    renamed: dict[str, str] = field(default_factory=dict)

    def within(self, name: str, top: tuple[str, ...] = ()) -> Config:
        """The config nested in the field ``name`` (a JSON object; missing or null: none, the
        config class's defaults; another value is a problem, and reads as none), with the ``top``
        fields this config holds in place of its own, as transformers reads them; its problems
        are this config's, named as the file has them."""
        inner = self.data.get(name)
        inner = {} if inner is None else inner
        if not isinstance(inner, dict):
            self.refuse(name, f"{inner!r} is not a JSON object", "fix the file")
            inner = {}
        data = {k: v for k, v in inner.items() if k not in top} | {
            k: self.data[k] for k in top if k in self.data
        }
        return Config(data, self.problems, f"{self.prefix}{name}.", top)

    def aliased(self, aliases: dict[str, str]) -> Config:
        """This config as its class reads ``aliases`` (another name -> the field it sets, as
        transformers' attribute_map and a class's legacy keywords have them): where the file sets
        the other name (not null), its value is the field's, and problems name it as the file does."""
        data, renamed = dict(self.data), {}
        for alias, name in aliases.items():
            if self.data.get(alias) is not None:
                data[name] = self.data[alias]
                renamed[name] = alias
        return replace(self, data=data, renamed=renamed)

    def over(self, data: dict[str, Any]) -> Config:
        """This config's problems and names over ``data`` (its fields as a config class reads them)."""
        return replace(self, data=data)

    def filled(self, defaults: dict[str, Any], nullable: dict[str, Any] | None = None) -> Config:
        """This config as its config class reads it: ``defaults`` where a field is missing or null
        (but for a flag: _null_flag), ``nullable`` where it is missing only (the class keeps a null
        there)."""
        data = dict(self.data)
        for name, value in defaults.items():
            if data.get(name) is None:
                self._null_flag(name, value)
                data[name] = value
        for name, value in (nullable or {}).items():
            data.setdefault(name, value)
        return self.over(data)

    def named(self, sources: dict[str, str]) -> dict[str, str]:
        """``sources`` (spec fields -> the fields of ``data`` they were read from) naming each field
        as the file has it."""
        return {spec: self.name(read) for spec, read in sources.items()}

    def name(self, path: str) -> str:
        """A field of ``data`` (dotted into nested ones) as config.json names it."""
        head, dot, rest = path.partition(".")
        path = self.renamed.get(head, head) + dot + rest
        return path if head in self.top else self.prefix + path

    def get(self, name: str, default: Any = None) -> Any:
        """The field's value (``default`` where it is missing or null, but for a flag: _null_flag);
        a value of another JSON type than ``default``'s is a problem, and reads as ``default``."""
        value = self.data.get(name, default)
        if value is None:
            self._null_flag(name, default)
            return default
        if default is not None and json_type(value) != json_type(default):
            self.refuse(name, f"{value!r} is not {json_type(default)}", "fix the file")
            return default
        if isinstance(value, float) and not math.isfinite(value):  # json.loads reads NaN, Infinity
            self.refuse(name, f"{value!r} is not a finite number", "fix the file")
            return default
        return value

    def _null_flag(self, name: str, default: Any) -> None:
        """A null flag whose default is true is a problem: transformers 4 reads it as false, and 5
        refuses it (any other null reads as the default, as a field left out)."""
        if default is True and name in self.data and self.data[name] is None:
            self.refuse(
                name, "is null: transformers 4 reads it as false, and 5 refuses it", "write true or false"
            )

    def refuse(self, name: str, message: str, hint: str) -> None:
        problem = Problem(self.name(name), message, hint)
        if problem not in self.problems:  # a field read twice is one problem
            self.problems.append(problem)

    def require(self, ok: bool, name: str, message: str, hint: str) -> None:
        if not ok:
            self.refuse(name, message, hint)

    def choice(self, name: str, default: str, mapping: dict[str, Any], what: str) -> Any:
        """The value ``mapping`` gives the field's, or a problem naming the choices. A null is one:
        transformers 5 refuses it, and 4 reads it as no choice (an activation it cannot look up)."""
        if name in self.data and self.data[name] is None:
            self.refuse(name, f"is null, not a {what}", f"one of {sorted(mapping)} imports")
            return next(iter(mapping.values()))
        value = self.get(name, default)
        if value not in mapping:
            self.refuse(name, f"{value!r} is not a {what} tfcompile has", f"one of {sorted(mapping)} imports")
            return next(iter(mapping.values()))
        return mapping[value]

    def refuse_true(self, *names: str, why: str) -> None:
        """Refuse each boolean field that is set."""
        for name in names:
            self.require(not self.get(name, False), name, f"is true: {why}", "import a model without it")


def json_type(value: Any) -> str:
    """What JSON holds ``value`` as, in words (a bool is not a number, an int is)."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list | tuple) else "a JSON object"


def whole_number(value: Any) -> bool:
    """Whether ``value`` is a finite whole JSON number (json.loads reads NaN and Infinity too)."""
    return json_type(value) == "a number" and math.isfinite(value) and value == int(value)


class Tensors:
    """A checkpoint's tensors by name; each one taken is marked used, and ``left`` names those no
    converter read, so that a tensor the mapping does not know about is an error, not a loss."""

    def __init__(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        self.tensors, self.where, self.used = tensors, where, set[str]()

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise HFError(f"{self.where}: the tensor {name} is missing, but the config.json says it is there")
        self.used.add(name)
        return self.tensors[name]

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.take(name) if name in self.tensors else None

    def cat(self, *names: str, rows: Sequence[int] | None = None) -> torch.Tensor:
        """The tensors one after another along their rows: each of as many rows as ``rows`` says
        (by default as the first), all alike in their other dimensions; else an HFError naming
        their shapes (q, k and v of wrong sizes that add up would load, and compute otherwise)."""
        parts = [self.take(name) for name in names]
        first = parts[0].shape
        expected = [(n, *first[1:]) for n in rows] if rows is not None else [tuple(first)] * len(parts)
        if parts[0].ndim == 0 or [tuple(p.shape) for p in parts] != expected:
            shapes = ", ".join(f"{name} {tuple(p.shape)}" for name, p in zip(names, parts, strict=True))
            raise HFError(
                f"{self.where}: tensors of shapes that do not fit together: {shapes}; "
                f"is config.json the checkpoint's own?"
            )
        return torch.cat(parts)

    def same(self, a: str, b: str) -> bool:
        """Whether both tensors are there and equal (a tie saved under both names)."""
        return a in self.tensors and b in self.tensors and torch.equal(self.tensors[a], self.tensors[b])

    def skip(self, *prefixes: str) -> list[str]:
        """Mark the tensors under ``prefixes`` that no converter read as read, and name them: the
        weights of a head the class does not build, which transformers ignores too."""
        names = sorted(n for n in self.tensors if n.startswith(prefixes) and n not in self.used)
        self.used.update(names)
        return names

    def left(self) -> list[str]:
        return sorted(set(self.tensors) - self.used)


State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Imported:
    """What an architecture makes of a config: the spec's sections, as a person would write them."""

    model: dict[str, Any]
    task: dict[str, Any]
    tokens: dict[str, str] | None = None
    # Spec fields -> the config.json fields this config gave them from, where they differ from the
    # architecture's ``sources`` (a RoPE dict saved as rope_scaling or as rope_parameters).
    sources: dict[str, str] = field(default_factory=dict)
    # A translator's: its decoder starts with decoder_start_token_id, the spec's bos whatever the
    # tokenizer calls its bos (T5's <pad>, BART's </s>).
    decoder_start: bool = False
    # A translator's config class's forced_eos_token_id, which transformers 4 takes where config.json
    # has none (transformers 5 none): the BART family's is its eos.
    forced_eos: int | None = None
    # The token id whose every occurrence the model's positions skip (RoBERTa's and M2M100's count
    # the tokens that are not the pad id; tfcompile's the ones the mask marks real): the importer
    # holds the tokenizer to padding with it alone (pad_positions). None: positions count columns.
    pad_positions: int | None = None


class Architecture(ABC):
    """One Hugging Face model type (and the head classes of it that tfcompile has): config.json to
    spec sections, checkpoint to state dict (``Writable``: and back, for ``export-hf``)."""

    model_types: ClassVar[tuple[str, ...]]
    # Names accepted in a checkpoint before the body's tensor names (saved from a head class, or not).
    prefixes: ClassVar[tuple[str, ...]] = ()
    ignored: ClassVar[tuple[str, ...]] = ()  # substrings of tensor names that hold no weights
    # Whether read() takes config.json's sliding_window (a window, or unread_window's refusal where
    # the attention reads none); else the importer refuses an unread one (unread_window).
    reads_window: ClassVar[bool] = False
    # Whether transformers generates with the model's own cache of keys and values (DynamicCache),
    # whose windows and chunks config.json says (unread_window, unread_chunks); an encoder has none.
    caches: ClassVar[bool] = True
    # Spec fields (dotted, from ``model.`` or ``task.``) -> the config.json field each is read
    # from, so that a value the spec's rules refuse is named as the config says it.
    sources: ClassVar[dict[str, str]] = {}
    # Other names of config fields the config class reads over them (its attribute_map): name -> field.
    aliases: ClassVar[dict[str, str]] = {}

    def aliases_for(self, model_type: str) -> dict[str, str]:
        """The other names of config fields that ``model_type``'s config class reads over them."""
        return self.aliases

    def cached_config(self, config: Config) -> Config:
        """The config transformers' generation cache reads its windows and chunks from (its
        get_text_config(decoder=True)): this one, a multimodal model type's text_config."""
        return config

    @abstractmethod
    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        """The spec's sections for ``config`` saved from the head class ``architecture`` (with
        ``tensors``, the checkpoint, for what the config leaves open); each field that cannot be
        converted is a problem in ``config``."""

    @abstractmethod
    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        """The checkpoint's tensors (names without the body's prefix) -> the model's state dict."""


Windows = Literal["none", "every", "any"]


class Writable(Architecture):
    """An architecture ``export-hf`` also writes: which specs are its to write, why one cannot be,
    and its config.json and tensors. The others are import only."""

    # The sliding windows its config.json says: none, one over every layer, or one over any layers.
    windows: ClassVar[Windows] = "none"

    @abstractmethod
    def candidate(self, spec: Spec) -> bool:
        """Whether the spec's family, task and positions are this architecture's (export-hf)."""

    @abstractmethod
    def exportable(self, spec: Spec) -> list[Problem]:
        """Why a candidate spec's model cannot be written as this architecture (empty when it can)."""

    @abstractmethod
    def to_config(self, spec: Spec) -> dict[str, Any]:
        """The ``config.json`` of the spec's model, in the keys every transformers version reads."""

    @abstractmethod
    def from_state(self, state: State, spec: Spec) -> State:
        """The model's state dict -> the tensors as ``save_pretrained`` names them, each tied
        tensor once."""

    def preprocessor(self, spec: Spec, preprocessing: dict[str, Any] | None) -> dict[str, Any] | None:
        """An image processor's ``preprocessor_config.json`` for export-hf; None for text models."""
        return None

    def token_problems(self, spec: Spec, tokens: dict[str, int]) -> list[Problem]:
        """Why the run's special token ids (role -> id; none without a tokenizer) cannot stand in
        this architecture's config.json beside the spec's model (empty when they can)."""
        return []


ARCHITECTURES: dict[str, Architecture] = {}


def register(*model_types: str) -> Callable[[type[Architecture]], type[Architecture]]:
    def add(cls: type[Architecture]) -> type[Architecture]:
        cls.model_types = model_types
        instance = cls()
        for name in model_types:
            ARCHITECTURES[name] = instance
        return cls

    return add


def source(path: str, sources: dict[str, str]) -> str | None:
    """The config.json field a spec field (``model.positional.scaling.factor``) was read from: the
    longest of ``sources`` it is or lies under, with the rest of the path after it
    (``rope_parameters.factor``); None where no config field gave it."""
    for prefix in sorted(sources, key=len, reverse=True):
        if path == prefix or path.startswith(prefix + "."):
            return sources[prefix] + path[len(prefix) :]
    return None


def tied(config: Config, tensors: Tensors, head: str, embeddings: str, default: bool) -> bool:
    """Whether the output head is the embedding table, as transformers decides: the config says
    so, unless the checkpoint holds a head that differs from the table."""
    return bool(config.get("tie_word_embeddings", default)) and (
        head not in tensors or tensors.same(head, embeddings)
    )


def lm_head(
    config: Config,
    tensors: Tensors,
    architecture: str,
    names: tuple[str, str],
    default: bool,
    checkpoint: str,
    bias: str | None = None,
) -> bool:
    """Whether a causal LM's head (``names``: the head's tensor and the embeddings') is tied, as
    ``tied`` decides with the config class's ``default``; a checkpoint that holds no head it does
    not tie (or no ``bias``, which a tie leaves the head's own) is a problem at architectures."""
    head, embeddings = names
    tie = tied(config, tensors, head, embeddings, default)
    held = head if bias is None else f"{head}, and {bias}, which a tie leaves its own"
    config.require(
        (tie or head in tensors) and (bias is None or bias in tensors),
        "architectures",
        f"{architecture} holds no LM head ({held}) and does not tie one to its embeddings",
        f"import the {checkpoint} checkpoint",
    )
    return tie


def unread_window(config: Config, length: Any) -> None:
    """A ``sliding_window`` of a model whose attention reads none: transformers' forward attends
    over every position, but the cache it generates with (DynamicCache: a decoder's, a translator's
    decoder's) keeps only the last sliding_window keys of the layers ``layer_types`` names sliding
    (every layer where it names none), so the two differ past the window; refused where it is
    shorter than the context (``length``; none: a model without one, a ViT). Sliding layers beside
    no sliding_window (missing or null) fail transformers' forward: refused too."""
    size, types = config.data.get("sliding_window"), config.data.get("layer_types")
    sliding = isinstance(types, list) and "sliding_attention" in types
    config.require(
        size is not None or not sliding,
        "layer_types",
        "names sliding_attention layers, and config.json no sliding_window: transformers fails on them",
        "list every layer as full_attention, or leave layer_types out",
    )
    if not isinstance(size, int | float) or isinstance(size, bool) or not isinstance(length, int):
        return
    config.require(
        size >= length or (isinstance(types, list) and not sliding),
        "sliding_window",
        f"is {size!r}, and this model type's attention reads no window: transformers' forward attends "
        f"over every position, its generation cache keeps only the last {size}, and the two differ "
        "past it",
        "remove it (null), or list every layer as full_attention in layer_types",
    )


def unread_chunks(config: Config, length: Any) -> None:
    """``attention_chunk_size``: Llama 4's chunked attention, which no model type tfcompile imports
    reads. transformers' forward attends over every position, but where the config has neither a
    sliding_window nor layer_types, its generation cache (DynamicCache, transformers 4 and 5) keeps
    only the last attention_chunk_size keys of every layer, so the two differ past it: refused where
    shorter than the context (``length``) and config.json lists no layer_types (a config class may
    derive them, or null a sliding_window config.json holds, as transformers 4's Qwen2-MoE without
    use_sliding_window: refused all the same, as no published checkpoint of these types holds a
    chunk). Layers that ``layer_types`` names chunked_attention are cached as such in transformers
    5: refused too."""
    size, types = config.data.get("attention_chunk_size"), config.data.get("layer_types")
    config.require(
        not (isinstance(types, list) and "chunked_attention" in types),
        "layer_types",
        "names chunked_attention layers, which no model type tfcompile imports reads (Llama 4's chunked "
        "attention): transformers' generation cache keeps only the last attention_chunk_size keys of them",
        "list every layer as full_attention or sliding_attention",
    )
    if not isinstance(size, int | float) or isinstance(size, bool) or not isinstance(length, int):
        return
    config.require(
        size >= length or types is not None,
        "attention_chunk_size",
        f"is {size!r}, and this model type's attention reads no chunks: transformers' forward attends "
        f"over every position, its generation cache keeps only the last {size}, and the two differ past it",
        "remove it (null), or list every layer as full_attention in layer_types",
    )


def image_path_left_out(tensors: Tensors, prefixes: tuple[str, ...], model: str, written: str) -> None:
    """A multimodal checkpoint's image path (its tensors under ``prefixes``) marked read and said to
    be left out: ``model``'s language model is imported alone, and export-hf writes it as ``written``."""
    left_out = tensors.skip(*prefixes)
    warnings.warn(
        HFWarning(
            f"{tensors.where}: the {model}'s language model is imported alone (text only): its vision tower "
            f"and projector ({len(left_out)} tensors) are left out, so the run reads no images (an image "
            f"token is embedded as any other token); export-hf writes the run as {written}"
        ),
        stacklevel=4,
    )


def pad_within(config: Config, vocab: Any) -> None:
    """transformers' token embedding takes the pad id as its padding_idx, which must be one of its
    rows (a negative one counted from the end): past the vocabulary the model fails to build."""
    pad = config.get("pad_token_id")
    config.require(
        not (isinstance(vocab, int) and isinstance(pad, int)) or -vocab <= pad < vocab,
        "pad_token_id",
        f"{pad} is past the vocabulary ({vocab} tokens): transformers' embedding fails on it",
        "set it to a token id below vocab_size, or null",
    )


def dropout(p: Any) -> float:
    """A dropout probability from a config (null: none)."""
    return float(p) if p is not None and 0 <= float(p) < 1 else 0.0


def init_std(config: Config) -> float:
    """``model.init_std`` from ``initializer_range``: it only draws a new model's weights (an import's
    are the checkpoint's), so a range the spec cannot hold (0: transformers' zeros) is the default."""
    value = config.get("initializer_range", 0.02)
    return float(value) if isinstance(value, int | float) and value > 0 else 0.02


def contiguous(state: State) -> State:
    return {name: t.contiguous() for name, t in state.items()}


class Needs:
    """What export-hf requires of a spec, collected: each unmet requirement a problem at its field."""

    def __init__(self, architecture: str) -> None:
        self.architecture, self.problems = architecture, list[Problem]()

    def __call__(self, ok: bool, field: str, found: Any, hint: str) -> None:
        if not ok:
            self.problems.append(Problem(field, f"{found!r} has no {self.architecture} equivalent", hint))

    def plain_attention(self, model: Any, unscaled: bool = False) -> None:
        """Heads of d_model / n_heads scaled by 1/sqrt(head_dim) (or by 1, where the architecture
        can leave q.k ``unscaled``), and no extra scales."""
        self(
            model.head_dim * model.n_heads == model.d_model,
            "model.head_dim",
            model.head_dim,
            "leave it unset",
        )
        self.plain_scales(model, unscaled)

    def plain_scales(
        self,
        model: Any,
        unscaled: bool = False,
        qk_norm: bool = False,
        moe: bool = False,
        after_rope: bool = False,
        query_scaling: bool = False,
    ) -> None:
        """Attention scaled by 1/sqrt(head_dim), whatever head_dim is (or by 1, where the
        architecture can leave q.k ``unscaled``), no extra scales, no norm of each head's q
        and k unless the architecture has one (``qk_norm``, before RoPE unless ``after_rope``), and
        no mixture of experts unless the architecture writes this one (``moe``: it has checked
        model.moe itself)."""
        self(
            abs(model.attention_scale * model.head_dim**0.5 - 1) < 1e-9
            or (unscaled and model.attention_scale == 1),
            "model.attention_scale",
            model.attention_scale,
            "leave it unset (1/sqrt(head_dim))" + (", or set it to 1" if unscaled else ""),
        )
        self.no_extras(model, qk_norm, moe, after_rope, query_scaling)

    def no_extras(
        self,
        model: Any,
        qk_norm: bool = False,
        moe: bool = False,
        after_rope: bool = False,
        query_scaling: bool = False,
    ) -> None:
        """No scale on the embeddings, no LM head bias, sequential blocks, no sandwich or output
        norms, no capped scores or logits, no attention sinks, no decoder's embedding norm, no query
        scaled by its position unless the architecture scales it (``query_scaling``), norms with a
        learned scale,
        no clipped q, k and v, no multipliers (Granite's), no mixture of experts unless the
        architecture writes this one (``moe``), and no norm of each head's q and k unless the
        architecture has one (``qk_norm``), and then over each head, before RoPE turns it (or after,
        where ``after_rope``)."""
        self(not model.scale_embeddings, "model.scale_embeddings", True, "set it false")
        self(not model.bias.lm_head, "model.bias.lm_head", True, "set it false")
        self(qk_norm or not model.qk_norm, "model.qk_norm", True, "set it false")
        over = model.qk_norm_over  # also where a writer set its norms aside (Gemma 3, as Gemma 2's)
        self(over == "head", "model.qk_norm_over", over, "head (each head's q and k)")
        after = model.qk_norm_after_rope
        if qk_norm:  # the architecture's own norms: before RoPE, or after where after_rope
            when = "after" if after_rope else "before"
            hint = f"{str(after_rope).lower()} ({self.architecture} normalises q and k {when} RoPE)"
            self(after == after_rope, "model.qk_norm_after_rope", after, hint)
        else:  # named where qk_norm is not: a writer that set its norms aside (Gemma 3, as Gemma 2)
            self(model.qk_norm or not after, "model.qk_norm_after_rope", after, "false")
        self(model.block.type == "sequential", "model.block", model.block.type, "sequential")
        # An architecture that holds the position to its own (pre or post) has named it already.
        if not any(problem.field == "model.norm.position" for problem in self.problems):
            self(
                model.norm.position in ("pre", "post"),
                "model.norm.position",
                model.norm.position,
                "pre or post",
            )
        self(
            model.attention_softcap is None,
            "model.attention_softcap",
            model.attention_softcap,
            "leave it unset",
        )
        cap = getattr(model, "logit_softcap", None)  # decoders only
        self(cap is None, "model.logit_softcap", cap, "leave it unset")
        self(not model.attention_sinks, "model.attention_sinks", True, "false")
        scaled = getattr(model.positional, "query_scaling", None)  # RoPE's only
        self(
            query_scaling or scaled is None,
            "model.positional.query_scaling",
            scaled.model_dump() if scaled is not None else None,
            f"leave it unset ({self.architecture} scales no query by its position)",
        )
        # BERT's encoder has a norm after its embeddings (bert.py requires it); a decoder's (BLOOM's)
        # and a translator's (BART's) are for their writers to allow
        embedding_norm = getattr(model, "embedding_norm", False)  # a ViT has none
        self(not embedding_norm or isinstance(model, EncoderSpec), "model.embedding_norm", True, "false")
        self(model.norm.scale, "model.norm.scale", False, "true (every norm written has a learned scale)")
        self(model.norm.first_attention, "model.norm.first_attention", False, "true")
        if isinstance(model, EncoderSpec):  # BERT's pooler: the [CLS] state, no norm
            self(model.pooling == "cls", "model.pooling", model.pooling, "cls")
            self(not model.pooler_norm, "model.pooler_norm", True, "false")
        self(model.qkv_clip is None, "model.qkv_clip", model.qkv_clip, "leave it unset")
        experts = model.moe.model_dump() if model.moe is not None else None
        self(
            moe or experts is None,
            "model.moe",
            experts,
            f"leave it unset (export-hf writes no mixture of experts as {self.architecture})",
        )
        if moe and model.moe is not None:  # the architecture's own experts: a softmax's top k, unbiased
            routed = model.moe
            self(not routed.router_bias, "model.moe.router_bias", True, "false")
            self(routed.scoring == "softmax", "model.moe.scoring", routed.scoring, "softmax")
            self(not routed.selection_bias, "model.moe.selection_bias", True, "false")
            groups = routed.groups.model_dump() if routed.groups is not None else None
            self(groups is None, "model.moe.groups", groups, "leave it unset (every expert chosen among)")
            self(routed.scale == 1.0, "model.moe.scale", routed.scale, "1")
        for name in MULTIPLIERS:  # the last two decoders' only
            value = getattr(model, name, 1.0)
            self(value == 1.0, f"model.{name}", value, "1")


# The spec's multipliers of the residual branches, the embeddings and the logits (Granite's).
MULTIPLIERS = ("residual_multiplier", "embedding_multiplier", "logit_multiplier")


def output_scale(model: Any) -> float:
    """What the last hidden state is multiplied by before the LM head (``scale_output``): folded
    into the final norm's weight (and bias), exactly, where transformers has no such scale."""
    return float(model.d_model**-0.5) if model.scale_output else 1.0


def zeros_if_none(t: torch.Tensor | None, size: int) -> torch.Tensor:
    """A bias transformers always has, as zeros where the model has none (which is exact)."""
    return t if t is not None else torch.zeros(size)
