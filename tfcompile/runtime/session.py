"""A bundle opened for serving: manifest and file checks, execution providers, input checks.

Imports onnxruntime, numpy and tokenizers only, never torch (as all of tfcompile.runtime).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from pydantic import ValidationError
from tokenizers import Tokenizer

from tfcompile.errors import first_line
from tfcompile.expansion import excess
from tfcompile.manifest import Graph, Manifest, Tensor, Truncation
from tfcompile.onnx_nodes import graph_nodes
from tfcompile.runtime import inputs
from tfcompile.runtime.bundle import BundleFiles, bundle_files
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.ort import ort, run

# Bundles are checked against PyTorch's fp32 logits. The CUDA provider's default TF32 matmuls
# move those logits by about 1e-3 (measured on an H100), enough to change greedy tokens.
PROVIDER_OPTIONS: dict[str, dict[str, str]] = {"CUDAExecutionProvider": {"use_tf32": "0"}}
CUDA_GRAPH = {"enable_cuda_graph": "1"}  # the provider's options for a graph replayed as a CUDA graph
MAX_THREADS = 1024  # onnxruntime takes a C int
MAX_NODES = 1 << 16  # a graph's (tfcompile's one-layer exports hold 64 to 72)
TRUNCATION_ERROR = "Truncation error"  # how the tokenizers library's message of a cut it cannot make begins


def default_providers() -> list[str]:
    """CUDA when onnxruntime-gpu sees a GPU, the CPU otherwise (always kept as the fallback)."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def session_providers(providers: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """Provider names -> (name, options) for onnxruntime, refusing names this build lacks."""
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise InputError(f"providers must be a list of execution provider names, got {providers!r}"[:200])
    available = ort.get_available_providers()
    for name in providers:
        if not isinstance(name, str):
            shown = repr(name)[:100]
            raise InputError(
                f"providers must be execution provider names (the runtime sets their options), got {shown}"
            )
        if name not in available:
            raise InputError(
                f"execution provider {name!r} is not available in this onnxruntime build; it has "
                f"{available}. For CUDAExecutionProvider install onnxruntime-gpu (tfcompile[gpu])"
            )
    return [(name, dict(PROVIDER_OPTIONS.get(name, {}))) for name in providers]


def step_threads() -> int:
    """Intra-op threads for a graph with a cache, which reads one token per call: half the logical
    cores, at least 1 and at most 16, as onnxruntime-genai chooses. A token's matrix products are
    too small to share among every core: waking and joining the threads costs about what they
    save (on this 2-core CPU one thread generated 3.5x the tokens/s of two for the char model,
    and as many for a 32k-vocabulary one at half the CPU time; see
    benchmarks/results/generation_speed-cpu.md)."""
    return min(16, max(1, (os.cpu_count() or 1) // 2))


class NonFiniteLogits(BundleError):
    """A graph gave logits that are NaN or infinite: the bundle's fault where the caller's inputs
    are ids and masks the manifest allows (floats the caller chose may overflow any model)."""


@dataclass(frozen=True)
class SessionOptions:
    """How onnxruntime runs a bundle's graphs on the CPU. ``threads``: intra-op threads (None: one
    per core for the graphs that read whole sequences, ``step_threads()`` for those that read one
    token at a time). ``spin``: whether idle threads spin, waiting for the next run; that shaves
    latency off back-to-back calls from one caller, but the spinning threads take the cores from
    everything else in the process, so a server, whose event loop needs them between runs, turns
    it off. ``threads`` 0 is onnxruntime's default, one per core. ``fixed_step``: whether a
    decoder bundle's fixed-shape step graph (exported with export.cuda_graphs) generates the tokens
    after a prompt: None, where the step graph runs on CUDA, which replays it as a CUDA graph;
    True, wherever it runs (on the CPU it attends over the whole window at every step, so it is
    slower there: for checking it); False, never."""

    threads: int | None = None
    spin: bool = True
    fixed_step: bool | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and inputs.count("threads", self.threads) > MAX_THREADS:
            raise InputError(f"threads must be at most {MAX_THREADS:,}, got {self.threads:,}")
        inputs.switch("spin", self.spin)
        if self.fixed_step is not None:
            inputs.switch("fixed_step", self.fixed_step)

    def to_ort(self, one_token: bool = False) -> Any:
        """onnxruntime's options for a graph; ``one_token``: a step graph, with a cache."""
        options = ort.SessionOptions()
        threads = step_threads() if self.threads is None and one_token else self.threads
        if threads is not None:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spin else "0")
        options.add_session_config_entry("session.load_model_format", "ONNX")  # as open_graph checked it
        # Common-subexpression elimination takes time quadratic in a chain of nodes that read one
        # tensor twice (16,000 Adds, 460 KB: 28 s to load); the exporter has already done it.
        options.add_session_config_entry(
            "optimization.disable_specified_optimizers", "CommonSubexpressionElimination"
        )
        return options


@dataclass(frozen=True)
class _OutputChecks:
    """What check_outputs holds a graph's outputs to, read once from its manifest entry: the named
    axes of its inputs (input, index, name), each output's declared shape, and each present
    output's past input and cache axis."""

    named: tuple[tuple[str, int, str], ...]
    shapes: dict[str, list[int | str]]
    grows: dict[str, tuple[str, int]]

    @classmethod
    def of(cls, graph: Graph) -> _OutputChecks:
        grows = {}
        if graph.cache is not None:
            inputs = {t.name: t.shape for t in graph.inputs}
            pairs = zip(graph.cache.past, graph.cache.present, strict=True)
            grows = {present: (past, inputs[past].index(graph.cache.axis)) for past, present in pairs}
        named = [
            (t.name, i, axis) for t in graph.inputs for i, axis in enumerate(t.shape) if isinstance(axis, str)
        ]
        return cls(tuple(named), {t.name: t.shape for t in graph.outputs}, grows)


class Bundle:
    """A loaded and checked bundle: its manifest, a session on its main graph, its tokenizer, and
    the checks every input goes through before onnxruntime sees it."""

    MAIN_GRAPH = "model"  # the graph opened here; each runtime opens the others it runs at load too
    TASK: str | None = None  # the manifest task a runtime class serves (None: any)
    PADDING_SIDE: str | None = None  # the side it pads a batch's rows on (None: it pads none)

    def __init__(
        self,
        bundle: str | Path | BundleFiles,
        providers: Sequence[str] | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        self.files = bundle_files(bundle)
        self.path = self.files.folder
        self.manifest: Manifest = self.files.manifest
        if self.TASK is not None and self.manifest.task != self.TASK:
            raise InputError(
                f"{self.path} holds a {self.manifest.task} model; {type(self).__name__} serves "
                f"{self.TASK} bundles (tfcompile.runtime.load picks the class from the manifest)"
            )
        side = self.manifest.padding.side
        if self.PADDING_SIDE is not None and side != self.PADDING_SIDE:
            raise BundleError(
                f"{self.path}: the manifest's padding.side is {side!r}, where a {self.manifest.task} "
                f"bundle's rows are padded on the {self.PADDING_SIDE}: what this runtime does and its "
                f"graphs were checked with, so a client that pads as the manifest says would disagree"
            )
        self._providers = session_providers(providers or default_providers())
        self._chosen = bool(providers)  # providers the caller named must all start (open_graph)
        if not isinstance(options, SessionOptions | None):
            raise InputError(f"options must be a SessionOptions, got {type(options).__name__}")
        self._options = options or SessionOptions()
        self.sessions: dict[str, Any] = {}  # the graphs open_graph checked, by name
        self._checks: dict[str, _OutputChecks] = {}  # and what their outputs are held to
        self.session = self.open_graph(self.MAIN_GRAPH)
        if self.manifest.model.vocab_size is None and any(
            is_token_ids(t.name) for g in self.manifest.graphs.values() for t in g.inputs
        ):
            raise BundleError(
                f"{self.path}: the manifest's model.vocab_size is missing; its graphs read token ids"
            )
        self.vocab_size = self.manifest.model.vocab_size or 0
        self.max_seq_len = self.manifest.model.max_seq_len
        self.tokenizer = self._load_tokenizer()
        self._side_tokenizer: Tokenizer | None = None  # see _cut_pairs
        self._longest_first: Tokenizer | None = None  # see _encode_batch
        # The ids decoding may pick: the tokenizer's, not the rows a checkpoint pads its embedding
        # table with past them (T5: 32128 for 32100 tokens); all of the model's without a tokenizer.
        self.emitted = self.tokenizer.get_vocab_size() if self.tokenizer is not None else None

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def graph(self, name: str) -> Graph:
        if name not in self.manifest.graphs:
            raise BundleError(f"{self.path} has no {name!r} graph, which a {self.manifest.task} bundle needs")
        return self.manifest.graphs[name]

    def expect(self, name: str, inputs: Sequence[str], outputs: Sequence[str], exact: bool = True) -> Graph:
        """The graph ``name``, refused (BundleError) unless its inputs are ``inputs`` (with
        ``exact=False``: begin with them) and its outputs begin with ``outputs``: the tensors this
        runtime feeds and reads, by name."""
        graph = self.graph(name)
        found = [t.name for t in graph.inputs]
        if found[: len(inputs)] != list(inputs) or (exact and len(found) != len(inputs)):
            raise BundleError(
                f"{self.path}: the {name!r} graph takes {found}; a {self.manifest.task} "
                f"bundle's takes {list(inputs)}{'' if exact else ' first'}"
            )
        given = [t.name for t in graph.outputs]
        if given[: len(outputs)] != list(outputs):
            raise BundleError(
                f"{self.path}: the {name!r} graph gives {given}; a {self.manifest.task} "
                f"bundle's gives {list(outputs)} first"
            )
        return graph

    def expect_vocabulary_logits(self, name: str) -> None:
        """The graph ``name`` gives (batch, sequence, vocab_size) logits: one per token of the
        manifest's vocabulary, the ids a caller may feed back."""
        shape = self.expect(name, [], ["logits"], exact=False).outputs[0].shape
        if len(shape) != 3 or shape[2] != self.vocab_size:
            raise BundleError(
                f"{self.path}: the {name!r} graph's logits have the shape {shape}, not (batch, sequence, "
                f"{self.vocab_size}) for the manifest's model.vocab_size"
            )

    def open_graph(self, name: str, batch: int | None = None) -> Any:
        """An onnxruntime session on the graph, from the bytes whose sha256 was checked; a graph that
        onnxruntime cannot load, or whose inputs and outputs are not the manifest's, is a BundleError.
        With ``batch``, the graph's batch axis is that size, so that onnxruntime folds every shape
        computation, and the CUDA provider captures the graph as a CUDA graph (its caller binds
        every input and output on the device); the caller keeps that session."""
        graph = self.graph(name)
        data = self.files.read(graph.file)
        _check_graph(self.path / graph.file, data)
        options = self._options.to_ort(one_token=graph.cache is not None or batch is not None)
        providers = self._providers
        if batch is not None:
            options.add_free_dimension_override_by_name("batch", batch)
            providers = [(p, o | CUDA_GRAPH if p == "CUDAExecutionProvider" else o) for p, o in providers]
        try:
            session = ort.InferenceSession(data, options, providers=providers)
        except Exception as e:  # onnxruntime's own errors: InvalidProtobuf, Fail, InvalidGraph
            raise BundleError(
                f"{self.path / graph.file} is not a graph onnxruntime can run: {first_line(e)}"
            ) from None
        # onnxruntime keeps the graph's bytes, a second copy of every weight for as long as the
        # session lives, to rebuild it on the CPU should a provider fail (at load, or later at a
        # run); the runtime never lets it switch providers, so it keeps neither.
        session.disable_fallback()
        if isinstance(getattr(session, "_model_bytes", None), bytes):  # a private name: kept only if bytes
            session._model_bytes = None
        started = session.get_providers()
        if self._chosen and (missing := [name for name, _ in self._providers if name not in started]):
            raise InputError(
                f"onnxruntime could not start the execution providers {missing} (it would run "
                f"{self.path / graph.file} on {started} instead; onnxruntime's warning says why). Check "
                f"the GPU and its CUDA libraries, or pass providers=['CPUExecutionProvider']"
            )
        for kind, found, declared in (
            ("inputs", session.get_inputs(), graph.inputs),
            ("outputs", session.get_outputs(), graph.outputs),
        ):
            if [f.name for f in found] != [t.name for t in declared]:
                raise BundleError(
                    f"{self.path / graph.file} has {kind} {[f.name for f in found]}, but the manifest "
                    f"says {[t.name for t in declared]}"
                )
            for f, t in zip(found, declared, strict=True):
                if not _same_tensor(f, t):
                    raise BundleError(
                        f"{self.path / graph.file}: {f.name} is {f.type} of shape {f.shape}, but the "
                        f"manifest says {t.dtype} of shape {t.shape}"
                    )
        if batch is None:
            self.sessions[name] = session
        self._checks[name] = _OutputChecks.of(graph)
        return session

    def run_graph(
        self, name: str, feed: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> list[np.ndarray]:
        """The opened graph ``name`` on checked inputs -> its outputs (``outputs``, by default
        all), float32, each checked against the manifest (check_outputs)."""
        values = run(self.sessions[name], feed, outputs)
        self.check_outputs(name, feed, values, outputs)
        return values

    def check_outputs(
        self, name: str, feed: dict[str, Any], values: Sequence[Any], outputs: Sequence[str] | None = None
    ) -> None:
        """onnxruntime does not hold a graph's outputs to the shapes it declares, so the runtime
        does, before anything indexes them: each output (numpy or OrtValue) has its manifest rank
        and fixed sizes, an axis named as an input's has that input's size (and one name, one
        size), a cache graph's present tensors are its past ones with the new tokens
        (input_ids' second axis) appended on the cache axis, and logits are finite. A graph that
        breaks this is a BundleError: it does not do what its manifest says."""
        checks = self._checks[name]
        sizes = {axis: _shape(feed[tensor])[i] for tensor, i, axis in checks.named}
        for output, value in zip(outputs or checks.shapes, values, strict=True):
            shape = _shape(value)
            expected: list[int | str]
            if output in checks.grows:  # its past had the manifest's shape, as the cache began
                past, axis = checks.grows[output]
                expected = list(_shape(feed[past]))
                expected[axis] = _shape(feed[past])[axis] + _shape(feed["input_ids"])[1]
                wrong = list(shape) != expected
            else:
                expected = checks.shapes[output]
                wrong = len(shape) != len(expected) or any(
                    size != (axis if isinstance(axis, int) else sizes.setdefault(axis, size))
                    for axis, size in zip(expected, shape, strict=True)
                )
            if wrong:
                shapes = {k: _shape(v) for k, v in feed.items()}
                raise BundleError(
                    f"{self.path / self.graph(name).file} gave {output} of shape {shape}, not "
                    f"{expected} as the manifest says, for inputs of shapes {shapes}"
                )
            if output == "logits" and not np.isfinite(value).all():
                raise NonFiniteLogits(
                    f"{self.path / self.graph(name).file} gave logits that are not finite (NaN or "
                    f"infinity) for inputs the manifest allows"
                )

    def infer(self, feed: dict[str, Any]) -> dict[str, np.ndarray]:
        """The main graph on raw tensors (the Open Inference Protocol's ``infer``): exactly the
        manifest's inputs, each of its rank and fixed sizes; token ids inside the vocabulary, masks
        0 or 1 with a 1 in every row (translate_ids' rule), floats finite. -> every output by name
        (float32)."""
        graph = self.graph(self.MAIN_GRAPH)
        declared = [t.name for t in graph.inputs]
        if not isinstance(feed, dict) or not all(isinstance(name, str) for name in feed):
            raise InputError(
                f"infer takes a dict of the inputs {declared} by name, got {type(feed).__name__}"
            )
        if sorted(feed) != sorted(declared):
            raise InputError(f"the {self.MAIN_GRAPH} graph takes the inputs {declared}, got {sorted(feed)}")
        checked: dict[str, np.ndarray] = {}
        sizes: dict[int | str, int] = {}  # sizes: a named axis's size, which every input sharing it must have
        for tensor in graph.inputs:
            value = inputs.array(tensor.name, feed[tensor.name])
            if value.ndim != len(tensor.shape):
                raise InputError(f"{tensor.name} must have shape {tensor.shape}, got {value.shape}")
            for axis, size in zip(tensor.shape, value.shape, strict=True):
                if size == 0 or sizes.setdefault(axis, axis if isinstance(axis, int) else size) != size:
                    shapes = {t.name: t.shape for t in graph.inputs}
                    raise InputError(
                        f"{tensor.name} has shape {value.shape}; the inputs' shapes are {shapes}"
                    )
            if is_token_ids(tensor.name):
                value = inputs.token_ids(value, self.vocab_size, self.max_seq_len, tensor.name)
            elif tensor.dtype == "int64":
                value = inputs.flags(tensor.name, value, value.shape, "0 and 1")
                row_without_token = value.ndim and not value.reshape(len(value), -1).any(axis=1).all()
                if tensor.name.endswith("_mask") and row_without_token:
                    raise InputError(f"every row of {tensor.name} needs at least one real token (a 1)")
            else:
                value = inputs.floats(tensor.name, value, tensor.dtype)
            checked[tensor.name] = value
        outputs = [t.name for t in graph.outputs]
        try:
            values = self.run_graph(self.MAIN_GRAPH, checked, outputs)
        except NonFiniteLogits:
            floats = [t.name for t in graph.inputs if np.issubdtype(checked[t.name].dtype, np.floating)]
            if not floats:
                raise
            # The caller's floats are at fault only if the graph is finite on zeros of their shapes;
            # a bundle that is not (NaN weights) raises its NonFiniteLogits here.
            self.run_graph(
                self.MAIN_GRAPH,
                {n: np.zeros_like(v) if n in floats else v for n, v in checked.items()},
                outputs,
            )
            largest = max(float(np.abs(checked[name]).max()) for name in floats)
            raise InputError(
                f"the logits are not finite (NaN or infinity) for these inputs: {', '.join(floats)} "
                f"hold values up to {largest:.3g} in magnitude, more than the model computes with"
            ) from None
        return dict(zip(outputs, values, strict=True))

    def warm_up(self) -> None:
        """One smallest call, so that a server's first request does not pay onnxruntime's
        first-run cost: the main graph on ones (batch 1, every dynamic axis 1)."""
        feed = {
            t.name: np.ones([d if isinstance(d, int) else 1 for d in t.shape], np.dtype(t.dtype))
            for t in self.graph(self.MAIN_GRAPH).inputs
        }
        self.infer(feed)

    def special_id(self, role: str) -> int:
        """The id of a special token by role (pad, unk, bos, eos, cls, sep, mask)."""
        info = self.manifest.tokenizer
        if info is None or role not in info.special_tokens:
            raise BundleError(f"{self.path}: the manifest names no {role} token, which this call needs")
        return info.special_tokens[role].id

    def encode(self, items: Sequence[str | tuple[str, str]], add_special_tokens: bool = True) -> list[Any]:
        """Texts (or pairs) -> tokenizer encodings. A character outside a vocabulary without an
        unknown token is an InputError naming it (the manifest's tokenizer.unknown says which
        applies); a tokenizer that panics on the text, or gives ids past the model's vocabulary,
        is a BundleError."""
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer: pass token ids instead")
        items = inputs.texts("texts", items, pairs=True) if len(items) else []
        with self._tokenizer_panics():
            try:
                encodings = self._encode_batch(items, add_special_tokens)
            except Exception as e:  # the tokenizers library's error for a symbol its vocabulary lacks
                vocab = self.tokenizer.get_vocab()
                text = "".join(t if isinstance(t, str) else "".join(t) for t in items)
                unknown = sorted({c for c in text if c not in vocab})
                if not unknown:  # each character is a token, but not a word of this vocabulary
                    raise InputError(
                        f"the text holds a word outside the bundle's vocabulary ({first_line(e, 200)})"
                    ) from None
                raise InputError(
                    f"the text holds characters outside the bundle's vocabulary: {unknown[:10]!r}"
                ) from None
        # A post-processor's template names its special tokens by id, outside the vocabulary.
        highest = max((max(e.ids, default=0) for e in encodings), default=0)
        if highest >= self.vocab_size:
            raise BundleError(
                f"{self._tokenizer_file()} gave the token id {highest}, past the model's vocabulary "
                f"({self.vocab_size:,})"
            )
        return encodings

    def _encode_batch(self, items: list[str | tuple[str, str]], add_special_tokens: bool) -> list[Any]:
        """The tokenizer's encodings of ``items``. Where a truncation that cuts one side of a pair
        (only_first, only_second) cannot make the room, for a single text or a side too short to
        take the cut, the tokenizers library fails the whole batch: each such item is cut
        longest-first instead, so that a long text or pair is never refused."""
        tokenizer = self.tokenizer
        assert tokenizer is not None
        try:
            return tokenizer.encode_batch(
                self._cut_pairs(items, tokenizer), add_special_tokens=add_special_tokens
            )
        except Exception as e:
            if not str(e).startswith(TRUNCATION_ERROR):
                raise
        if self._longest_first is None:  # set up before it is shared, as _side_tokenizer
            longest_first = Tokenizer.from_str(tokenizer.to_str())
            cut = tokenizer.truncation
            assert cut is not None
            longest_first.enable_truncation(
                cut["max_length"], strategy="longest_first", direction=cut["direction"]
            )
            self._longest_first = longest_first
        out = []
        for item in items:
            try:
                out += tokenizer.encode_batch([item], add_special_tokens=add_special_tokens)
            except Exception as e:
                if not str(e).startswith(TRUNCATION_ERROR):
                    raise
                fallback = self._longest_first
                out += fallback.encode_batch(
                    self._cut_pairs([item], fallback), add_special_tokens=add_special_tokens
                )
        return out

    def _cut_pairs(
        self, items: list[str | tuple[str, str]], tokenizer: Tokenizer
    ) -> list[str | tuple[str, str]]:
        """Sentence pairs with a long side cut after twice the tokens truncation keeps. The
        tokenizers library truncates a pair by building every combination of its sides'
        overflowing pieces, in time and memory quadratic in their length (a 32 KB pair: 1.4 GB),
        while a side truncated alone costs time linear in its length. Its longest-first
        truncation reads no more of the sides than their lengths up to ``max_length`` and which
        is the longer, and a cut keeps both; the margin keeps a cut word's tokens (merged
        otherwise) out of what the pair keeps."""
        truncation = tokenizer.truncation
        if (
            truncation is None
            or truncation["strategy"] != "longest_first"
            or truncation["direction"] != "right"
            or not any(isinstance(item, tuple) for item in items)
        ):
            return items
        keep = 2 * truncation["max_length"]
        if self._side_tokenizer is None:  # set up before it is shared: threads may be encoding with it
            side_tokenizer = Tokenizer.from_str(tokenizer.to_str())
            side_tokenizer.enable_truncation(keep + 1)  # one more: see ``cut`` below
            self._side_tokenizer = side_tokenizer
        sides = iter(
            self._side_tokenizer.encode_batch(
                [side for item in items if isinstance(item, tuple) for side in item], add_special_tokens=False
            )
        )

        def cut(text: str, side: Any, tokens: int) -> str:
            return text[: side.offsets[tokens - 1][1]] if tokens < _length(side) else text

        out: list[str | tuple[str, str]] = []
        for item in items:
            if isinstance(item, tuple):
                (first, second), a, b = item, next(sides), next(sides)
                n, m = _length(a), _length(b)
                # Each side keeps ``keep`` tokens, the longer one more where that would tie them.
                k, j = min(n, keep), min(m, keep)
                k, j = k + (n > m and k == j), j + (m > n and k == j)
                item = (cut(first, a, k), cut(second, b, j))
            out.append(item)
        return out

    def decode(self, rows: Sequence[Sequence[int]]) -> list[str]:
        """Rows of token ids -> their texts, the special tokens skipped; an id outside the model's
        vocabulary is an InputError."""
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer: read the token ids instead")
        return self.decode_ids(inputs.id_rows("rows", rows, self.vocab_size))

    def decode_ids(self, rows: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` of ids the runtime chose or checked itself, unchecked: the server decodes a
        stream's whole text at every token, where the check would cost half again the decoding."""
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer: read the token ids instead")
        with self._tokenizer_panics():
            return self.tokenizer.decode_batch([list(row) for row in rows])

    @contextlib.contextmanager
    def _tokenizer_panics(self) -> Iterator[None]:
        """A damaged tokenizer.json can make the tokenizers library panic (a Rust panic is a
        BaseException, which ``except Exception`` misses): that is a BundleError."""
        try:
            yield
        except Exception:
            raise
        except BaseException as e:
            if type(e).__name__ != "PanicException":
                raise
            raise BundleError(f"{self._tokenizer_file()} is a tokenizer that fails: {e}") from None

    def _tokenizer_file(self) -> Path:
        assert self.manifest.tokenizer is not None
        return self.path / self.manifest.tokenizer.file

    def empty_cache(self, graph: str, batch: int) -> list[np.ndarray]:
        """Every past input of ``graph`` holding no tokens, as the manifest's cache section says:
        the batch axis ``batch``, the cache axis 0, in the graph's float type."""
        g = self.graph(graph)
        if g.cache is None:
            raise BundleError(f"{self.path}: the {graph!r} graph has no cache")
        inputs = {t.name: t for t in g.inputs}
        empty = []
        for name in g.cache.past:
            tensor = inputs[name]
            shape = [batch if d == "batch" else 0 if d == g.cache.axis else d for d in tensor.shape]
            sizes = [d for d in shape if isinstance(d, int)]
            if len(sizes) != len(shape):
                raise BundleError(f"{self.path}: the manifest gives {name} the unknown axes {tensor.shape}")
            empty.append(np.zeros(sizes, dtype=np.dtype(tensor.dtype)))
        return empty

    def _token_ids(self, value: Any, name: str = "input_ids") -> np.ndarray:
        return inputs.token_ids(value, self.vocab_size, self.max_seq_len, name)

    def _mask(self, value: Any, shape: tuple[int, ...], name: str = "attention_mask") -> np.ndarray:
        return inputs.flags(name, value, shape, "0 (padding) and 1 (real token)")

    def _load_tokenizer(self) -> Tokenizer | None:
        """The tokenizer, checked against the manifest: no id past the model's vocabulary, each
        special token at its id, the truncation the manifest gives, where it gives one (a client
        cuts as the manifest says); then a text and the first ids through it, which a damaged
        tokenizer.json can make panic."""
        info = self.manifest.tokenizer
        if info is None:
            return None
        where = self.path / info.file
        text = self.files.text(info.file)
        try:
            with self._tokenizer_panics():
                tokenizer = Tokenizer.from_str(text)
        except Exception as e:  # not JSON, or not a tokenizer
            raise BundleError(f"{where} is not a tokenizer the tokenizers library reads: {e}") from None
        if (why := excess(json.loads(text))) is not None:
            raise BundleError(f"{where}: {why}")
        truncation = checked_truncation(tokenizer, where)
        # A manifest without one (format 1's; format 2's before the field) leaves the cut to the
        # client's rule, which a classifier follows whatever tokenizer.json says (cut_to_context).
        if info.truncation is not None and truncation != info.truncation:
            said = info.truncation.model_dump() if info.truncation else None
            held = truncation.model_dump() if truncation else None
            raise BundleError(
                f"{where} truncates as {held}, but the manifest's tokenizer.truncation says {said}: "
                f"a client that follows the manifest would cut texts otherwise"
            )
        # The runtime pads batches itself, as the manifest's padding section says: a padding
        # setting in tokenizer.json would pad each text as the manifest does not (to a length
        # of its choosing: 10^9 tokens fill the memory), and count the padding as real tokens.
        tokenizer.no_padding()
        with self._tokenizer_panics():
            size = id_span(tokenizer)
        if size == 0:
            raise BundleError(f"{where} holds no tokens")
        if size > self.vocab_size:
            raise BundleError(
                f"{where} holds token ids up to {size - 1:,}, past the model's vocabulary "
                f"({self.vocab_size:,})"
            )
        for role, special in info.special_tokens.items():
            if tokenizer.token_to_id(special.token) != special.id:
                raise BundleError(
                    f"{where} does not hold the {role} token {special.token!r} at id {special.id}"
                )
        # A text outside the vocabulary is refused (an exception), not broken (a panic).
        with self._tokenizer_panics(), contextlib.suppress(Exception):
            tokenizer.encode("Aa 1.")
        with self._tokenizer_panics(), contextlib.suppress(Exception):
            tokenizer.decode_batch([[i] for i in range(min(size, 256))])
        return tokenizer


def _shape(value: Any) -> tuple[int, ...]:
    """The shape of a numpy array or an OrtValue (whose shape is a method)."""
    return tuple(value.shape) if isinstance(value, np.ndarray) else tuple(value.shape())


def _check_graph(path: Path, data: bytes) -> None:
    """An ONNX graph's bytes, checked before onnxruntime sees them (_check_self_contained,
    _check_bounded)."""
    try:
        model = onnx.ModelProto.FromString(data)
    except Exception as e:  # protobuf's DecodeError; a RecursionError past 100 nested subgraphs
        raise BundleError(f"{path} is not a graph onnxruntime can run: {first_line(e)}") from None
    _check_bounded(path, model)  # first: it bounds the walk of every message that follows
    _check_self_contained(path, model)


def _check_self_contained(path: Path, model: onnx.ModelProto) -> None:
    """An ONNX graph that reads nothing but its own bytes: no tensor whose values live in another
    file (external data: onnxruntime opens its location relative to the working directory when a
    graph comes as bytes, outside the bundle and unchecked by its sha256), and no EPContext node,
    whose compiled context an execution provider reads from a file it names. Every tensor and node
    of the model is looked at, wherever it is: initializers, sparse ones, node attributes, the
    bodies of subgraphs and functions, a function's default attributes."""
    for message in _messages(model):
        if isinstance(message, onnx.NodeProto) and message.op_type == "EPContext":
            raise BundleError(f"{path}: the node {message.name!r} is an EPContext, which reads another file")
        if isinstance(message, onnx.TensorProto) and message.data_location == onnx.TensorProto.EXTERNAL:
            raise BundleError(
                f"{path}: the tensor {message.name!r} keeps its values in another file; a bundle's "
                f"graphs hold their weights (export the bundle again)"
            )


def _check_bounded(path: Path, model: onnx.ModelProto) -> None:
    """An ONNX graph that onnxruntime loads and runs in a time its size and its inputs bound: no
    model-local functions (tfcompile writes none). onnxruntime inlines every call of one, and calls
    of calls multiply: 40 functions, each calling the one before twice, are 2^40 nodes in 4 KB;
    and it inlines one level of calls at a time, each pass over the whole graph. No subgraph but an
    If's branches, which run once: a Loop, a Scan (and onnxruntime's BeamSearch and the like) run
    their bodies as many times as a tensor says, 10^12 for one number in the file. At most
    MAX_NODES nodes, If branches included: onnxruntime takes time superlinear in them to load a
    graph (262,144 took 27 s; a graph of 2 GB holds 80 million)."""
    if model.functions:
        names = [f.name for f in model.functions]
        raise BundleError(
            f"{path}: the graph defines functions {names[:5]}{' ...' if len(names) > 5 else ''}, which "
            f"onnxruntime inlines at every call; a bundle's graphs define none (export the bundle again)"
        )
    too_many = f"more than the {MAX_NODES:,} a bundle's graph may hold"
    if len(model.graph.node) > MAX_NODES:  # at once, before any walk
        raise BundleError(f"{path} holds {len(model.graph.node):,} nodes, {too_many}")
    for count, node in enumerate(graph_nodes(model.graph), 1):
        if count > MAX_NODES:
            raise BundleError(f"{path} holds more than {MAX_NODES:,} nodes with its If branches, {too_many}")
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            continue
        if any(a.HasField("g") or a.graphs for a in node.attribute):
            raise BundleError(
                f"{path}: the node {node.name!r} is a {node.op_type}, which runs its body as many times "
                f"as a tensor says; a bundle's graphs hold no subgraph but an If's branches"
            )


def _messages(message: Message) -> Iterator[Message]:
    """``message`` and every message it holds, at any depth (protobuf bounds the depth at 100)."""
    yield message
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for item in (value,) if isinstance(value, Message) else value:
                yield from _messages(item)


def checked_truncation(tokenizer: Tokenizer, where: Path | str) -> Truncation | None:
    """The tokenizer's truncation as a manifest holds it; a BundleError for one it cannot hold (a
    max_length of 0, which the library takes) or one the library fails on every text it cuts."""
    try:
        truncation = Truncation.held_by(tokenizer.truncation)
    except ValidationError as e:
        error = e.errors()[0]
        raise BundleError(
            f"{where}: its truncation's {error['loc'][0]} {error['input']!r} is not one the manifest "
            f"can hold ({error['msg']}); a tokenizer must keep at least one token"
        ) from None
    if (cut := tokenizer.truncation) is not None:
        processor = tokenizer.post_processor
        added = processor.num_special_tokens_to_add(False) if processor else 0
        if cut["stride"] >= cut["max_length"] - added:
            raise BundleError(
                f"{where}: its truncation's stride {cut['stride']} is not below the {cut['max_length']} "
                f"tokens it keeps less the {added} special tokens it adds to a text; the tokenizers "
                "library fails on every text it cuts"
            )
    return truncation


def id_span(tokenizer: Tokenizer) -> int:
    """One past the highest id of the tokenizer's vocabulary, added tokens and the tokens its
    post-processor puts around a text or pair (a template's ``<s>``, which need be in neither): the
    rows an embedding table needs for it (a vocabulary with gaps holds fewer tokens than that). Of a
    tokenizer that does not pad (its padding would be counted, and encoded to its length)."""
    ids = list(tokenizer.get_vocab(with_added_tokens=True).values())
    for pair in (None, ""):
        with contextlib.suppress(Exception):  # a template without a pair's (a bare Exception)
            ids += tokenizer.encode("", pair).ids
    return max(ids, default=-1) + 1


def is_token_ids(name: str) -> bool:
    """Whether a graph input holds token ids (input_ids, source_ids), checked against the vocabulary."""
    return name.endswith("_ids") and name != "token_type_ids"


ORT_TYPES = {"int64": "tensor(int64)", "float32": "tensor(float)", "float16": "tensor(float16)"}


def _same_tensor(found: Any, declared: Tensor) -> bool:
    """Whether onnxruntime's view of a graph input or output (its NodeArg) is the manifest's:
    the same type and rank, and the same size on every axis both fix (a graph may leave an axis
    open that the manifest fixes, never fix one at another size; a graph that records no shape
    for it leaves the shape to the manifest)."""
    if found.type != ORT_TYPES[declared.dtype]:
        return False
    if not found.shape:
        return True
    if len(found.shape) != len(declared.shape):
        return False
    return all(
        not (isinstance(f, int) and isinstance(d, int)) or f == d
        for f, d in zip(found.shape, declared.shape, strict=True)
    )


def _length(encoding: Any) -> int:
    """The tokens of a text that was truncated alone: those kept and those overflowing."""
    return len(encoding.ids) + sum(len(piece.ids) for piece in encoding.overflowing)
