"""Text generation from a decoder bundle: greedy, temperature, top-k and top-p sampling
(tfcompile.search, shared with training), batched over prompts of different lengths (left-padded;
positions count each row's real tokens, so a row generates what it would alone), stopping at the
manifest's stop tokens, with the KV-cache graph (one token per step) or the full graph.

With the cache, the keys and values stay where the execution provider keeps them between steps:
on the GPU, onnxruntime's I/O binding hands each step's outputs to the next step without a copy
and only the logits come back; on the CPU, each step's numpy outputs are the next step's inputs.
Past the context, each step re-reads the last context tokens.

A bundle exported with export.cuda_graphs also holds the step at fixed shapes (the fixed_step
graph: one token, a window of the last max_seq_len - 1 positions). Where the step graph runs on
CUDA, the tokens after a prompt go through it: bound once per batch size, two sets of window
buffers taken in turn, each step a replay of one of two CUDA graphs that onnxruntime captured,
with the token and the mask copied in and the logits out."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from tfcompile import search
from tfcompile.manifest import GenerationInfo, Tensor
from tfcompile.runtime import inputs
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.ort import failures, ort
from tfcompile.runtime.session import Bundle, SessionOptions
from tfcompile.sequences import left_pad, pad_rows


class LanguageModel(Bundle):
    """A decoder bundle. ``logits(input_ids, attention_mask)`` -> (batch, seq, vocab) float32;
    ``generate`` (token ids) and ``generate_text`` (strings) decode with the KV-cache graph."""

    TASK = "causal_lm"
    PADDING_SIDE = "left"  # new tokens follow every row's last real token

    def __init__(
        self,
        bundle: str | Path | BundleFiles,
        providers: Sequence[str] | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        super().__init__(bundle, providers, options)
        if self.manifest.generation is None:
            raise BundleError(f"{self.path}: the manifest of a language model needs a generation section")
        self.generation: GenerationInfo = self.manifest.generation
        if self.generation.context_length != self.max_seq_len:
            raise BundleError(
                f"{self.path}: the manifest's generation.context_length ({self.generation.context_length}) "
                f"is not model.max_seq_len ({self.max_seq_len}), the context the graphs were checked at "
                "and this runtime generates over: a client that slides at the manifest's would disagree"
            )
        self.expect("model", ["input_ids", "attention_mask"], ["logits"])
        step = self.graph("step")
        if step.cache is None:
            raise BundleError(f"{self.path}: the manifest gives the step graph no cache section")
        self.expect(
            "step", ["input_ids", "attention_mask", *step.cache.past], ["logits", *step.cache.present]
        )
        for graph in ("model", "step"):
            self.expect_vocabulary_logits(graph)
        self.step = self.open_graph("step")  # the incremental graph's session
        # Format 1 step graphs count positions from the cache, not from the mask: no padding.
        self.pads = self.files.format_version >= 2
        self.fixed = self._uses_fixed_step()  # whether single tokens go through FIXED_STEP
        self._windows: dict[int, _Window] = {}  # FIXED_STEP bound for each batch size it ran at
        self._opening = threading.Lock()  # one thread opens windows at a time
        if self.fixed:
            self.window(1)  # opened at load, as every graph the runtime runs: a broken one fails here

    def _uses_fixed_step(self) -> bool:
        """Whether the fixed-shape step graph generates the tokens after a prompt (SessionOptions
        .fixed_step), checked to read and write a window shaped as the step graph's cache at the
        full context: its buffers are allocated from these shapes."""
        wanted = self._options.fixed_step
        if FIXED_STEP not in self.manifest.graphs:
            if wanted:
                raise InputError(
                    f"{self.path} has no {FIXED_STEP} graph (fixed_step=True): export it with "
                    "--cuda-graphs (export.cuda_graphs: true)"
                )
            return False
        on_cuda = self.step.get_providers()[0] == "CUDAExecutionProvider"
        if not (wanted or (wanted is None and on_cuda)):
            return False
        step = self.graph("step")
        assert step.cache is not None
        window = [f"window_{name.removeprefix('past_')}" for name in step.cache.past]
        graph = self.expect(
            FIXED_STEP, ["input_ids", "attention_mask", *window], ["logits", *(f"next_{w}" for w in window)]
        )
        self.expect_vocabulary_logits(FIXED_STEP)
        found = {t.name: (t.shape, t.dtype) for t in [*graph.inputs, *graph.outputs]}
        past = {t.name: (t.shape, t.dtype) for t in step.inputs}
        expected: dict[str, tuple[list[int | str], str]] = {
            "input_ids": (["batch", 1], "int64"),
            "attention_mask": (["batch", self.max_seq_len], "int64"),
        }
        for name, step_name in zip(window, step.cache.past, strict=True):
            cache_shape, cache_dtype = past[step_name]
            full = [self.max_seq_len - 1 if d == step.cache.axis else d for d in cache_shape]
            expected |= {name: (full, cache_dtype), f"next_{name}": (full, cache_dtype)}
        for name, required in expected.items():
            if found[name] != required:
                raise BundleError(
                    f"{self.path}: the {FIXED_STEP} graph's {name} is {found[name][1]} of the shape "
                    f"{found[name][0]}, not {required[1]} of the shape {required[0]}: a window of the step "
                    "graph's cache at the full context"
                )
        return True

    def warm_up(self) -> None:
        super().warm_up()
        # The step graph too; where the fixed step runs, 4 steps of batch 1's window after it, so
        # that onnxruntime has captured both of its CUDA graphs (each a regular run, then the capture).
        tokens = 5 if self.fixed else 1
        self.generate(np.zeros((1, 1), dtype=np.int64), tokens, temperature=0, stop=False)

    def logits(self, input_ids: Any, attention_mask: Any | None = None) -> np.ndarray:
        ids = self._token_ids(input_ids)
        mask = np.ones_like(ids) if attention_mask is None else self._mask(attention_mask, ids.shape)
        (logits,) = self.run_graph("model", {"input_ids": ids, "attention_mask": mask}, ["logits"])
        return logits

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_cache: bool = True,
        attention_mask: Any | None = None,
        stop: bool = True,
        repetition_penalty: float | None = None,
        min_new_tokens: int | None = None,
        min_p: float | None = None,
    ) -> np.ndarray:
        """input_ids (batch, prompt) [+ attention_mask, 0 at left padding] -> (batch, prompt + n): each
        row's prompt and its new tokens, up to ``max_new_tokens``; a row that reached a stop token
        (with ``stop``) ends with it and is filled out with the pad id. Options left out take the
        manifest's generation defaults; its bans apply (``min_new_tokens`` may be set per call).
        Rows generate what they would alone; past the context, each step reads the last
        ``max_seq_len`` tokens. Where the RoPE scaling follows the sequence (``dynamic``,
        ``longrope``), the cache keeps each key as the step that wrote it scaled it, as transformers'
        generate does, and ``use_cache=False`` scales every position as the longest: their tokens
        may differ."""
        ids = inputs.token_ids(input_ids, self.vocab_size, None)  # past the context, generation slides
        mask = None if attention_mask is None else self._mask(attention_mask, ids.shape)
        count = self.max_new_tokens(max_new_tokens)
        rows = self.sampling(
            len(ids), temperature, top_k, top_p, seed, repetition_penalty, min_new_tokens, min_p
        )
        new = self.generate_batch(
            ids,
            mask,
            [count] * len(ids),
            rows,
            inputs.switch("stop", stop),
            inputs.switch("use_cache", use_cache),
        )
        if not any(new):
            return ids
        return np.concatenate([ids, pad_rows(new, self._pad_id())], axis=1)

    @overload
    def generate_text(  # type: ignore[overload-overlap]  # a str is a Sequence[str] too
        self,
        prompt: str,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: bool = True,
        use_cache: bool = True,
        repetition_penalty: float | None = None,
        min_new_tokens: int | None = None,
        min_p: float | None = None,
    ) -> str: ...

    @overload
    def generate_text(
        self,
        prompt: Sequence[str],
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: bool = True,
        use_cache: bool = True,
        repetition_penalty: float | None = None,
        min_new_tokens: int | None = None,
        min_p: float | None = None,
    ) -> list[str]: ...

    def generate_text(
        self,
        prompt: str | Sequence[str],
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: bool = True,
        use_cache: bool = True,
        repetition_penalty: float | None = None,
        min_new_tokens: int | None = None,
        min_p: float | None = None,
    ) -> str | list[str]:
        """A prompt (or a list of prompts, generated as one batch) -> the prompt and its
        continuation, decoded; generation ends at a stop token, which is not shown."""
        encodings = self.encode(inputs.texts("prompt", prompt))
        count = self.max_new_tokens(max_new_tokens)
        rows = self.sampling(
            len(encodings), temperature, top_k, top_p, seed, repetition_penalty, min_new_tokens, min_p
        )
        new = self.generate_prompts(
            [e.ids for e in encodings],
            [count] * len(encodings),
            rows,
            inputs.switch("stop", stop),
            inputs.switch("use_cache", use_cache),
        )
        stops = tuple(self.generation.stop_token_ids)
        texts = self.decode_ids(
            [e.ids + search.strip_stop(n, stops) for e, n in zip(encodings, new, strict=True)]
        )
        return texts[0] if isinstance(prompt, str) else texts

    def max_new_tokens(self, value: Any | None) -> int:
        """A checked token limit, the manifest's default when None."""
        return inputs.count("max_new_tokens", self.generation.max_new_tokens if value is None else value)

    def sampling(
        self,
        rows: int,
        temperature: Any = None,
        top_k: Any = None,
        top_p: Any = None,
        seed: Any = None,
        repetition_penalty: Any = None,
        min_new_tokens: Any = None,
        min_p: Any = None,
    ) -> list[search.Sampling]:
        """Checked sampling options for ``rows`` rows, the manifest's defaults where None, with the
        manifest's bans; row r draws with seed + r."""
        g = self.generation
        t, k, p, penalty, p_min = inputs.sampling(
            g.temperature if temperature is None else temperature,
            g.top_k if top_k is None else top_k,
            g.top_p if top_p is None else top_p,
            g.repetition_penalty if repetition_penalty is None else repetition_penalty,
            g.min_p if min_p is None else min_p,
        )
        least = inputs.count("min_new_tokens", g.min_new_tokens if min_new_tokens is None else min_new_tokens)
        sequences = tuple(map(tuple, g.banned_sequences))
        bans = search.Bans(tuple(g.suppressed_ids), least, g.no_repeat_ngram_size, sequences, g.min_length)
        first = inputs.seed(seed)
        return [
            search.Sampling(t, k, p, None if first is None else first + r, penalty, bans, p_min)
            for r in range(rows)
        ]

    def generate_prompts(
        self,
        prompts: Sequence[Sequence[int]],
        limits: Sequence[int],
        sampling: Sequence[search.Sampling],
        stop: bool = True,
        use_cache: bool = True,
        on_step: Callable[[dict[int, int]], Iterable[int]] | None = None,
    ) -> list[list[int]]:
        """Prompts of token ids of any lengths, generated as one left-padded batch -> each
        prompt's new tokens (see generate_batch)."""
        ids, mask = self._left_padded(prompts)
        return self.generate_batch(ids, mask, limits, sampling, stop, use_cache, on_step)

    def batch(self, stop: bool = True) -> search.Batch:
        """An empty running batch over the step graph, which prompts join between its steps
        (``join``) and rows leave as they end: continuous batching, as the server runs it. Format 1
        bundles cannot (their step graphs take no padding)."""
        if not self.pads:
            raise BundleError(f"{self.path}: a format 1 bundle cannot batch prompts between steps")
        return search.Batch(tuple(self.generation.stop_token_ids) if stop else (), self.max_seq_len)

    def join(
        self,
        batch: search.Batch,
        prompts: Sequence[Sequence[int]],
        limits: Sequence[int],
        sampling: Sequence[search.Sampling],
    ) -> list[int]:
        """Prompts of token ids join a running ``batch`` (left-padded, as in generate_prompts) ->
        their rows' keys in it."""
        ids, mask = self._left_padded(prompts)
        # A server's batch changes size as requests come and go: its steps take the fixed step's
        # windows already open (batch 1's from the load), and open none (each would be a session).
        decoder = _FixedStepDecoder(self, open_windows=False) if self.fixed else _StepDecoder(self)
        return batch.join(decoder, ids, mask, limits, sampling)

    def _left_padded(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray | None]:
        """Prompts of token ids -> checked ids (B, longest), left-padded, and their mask (None
        when no prompt is padded)."""
        if not all(prompts):
            raise InputError(
                "a prompt encodes to no tokens (its tokenizer keeps none of its characters: "
                "whitespace alone, for some): give a text that holds a token"
            )
        ids = pad_rows([list(p)[::-1] for p in prompts], self._pad_id())[:, ::-1]
        ids = inputs.token_ids(ids, self.vocab_size, None, "prompt")
        mask = pad_rows([[1] * len(p) for p in prompts], 0)[:, ::-1]
        return ids, None if mask.all() else mask

    def generate_batch(
        self,
        ids: np.ndarray,
        mask: np.ndarray | None,
        limits: Sequence[int],
        sampling: Sequence[search.Sampling],
        stop: bool = True,
        use_cache: bool = True,
        on_step: Callable[[dict[int, int]], Iterable[int]] | None = None,
    ) -> list[list[int]]:
        """The batch engine under ``generate``, for callers that mix requests in one batch (the
        server): checked ids (B, P) and mask, and per row its token limit and its sampling;
        ``on_step`` sees each step's new tokens by row and returns rows to end (search.generate)."""
        if mask is not None and not mask.any(axis=1).all():
            raise InputError("every prompt needs at least one real token in attention_mask")
        if mask is not None and not mask[:, -1].all():  # a row would continue from its padding
            raise InputError("attention_mask must be left-padded: every prompt's last token is real")
        stops = tuple(self.generation.stop_token_ids) if stop else ()
        if mask is not None and not mask.all() and not self.pads:  # format 1: one row at a time
            return [
                self.generate_batch(
                    ids[r : r + 1, mask[r].astype(bool)],
                    None,
                    limits[r : r + 1],
                    sampling[r : r + 1],
                    stop,
                    use_cache,
                    None if on_step is None else _as_row(on_step, r),
                )[0]
                for r in range(len(ids))
            ]
        decoder: search.Decoder = _FullDecoder(self)
        if use_cache:
            decoder = _FixedStepDecoder(self) if self.fixed else _StepDecoder(self)
        try:
            return search.generate(decoder, ids, limits, sampling, stops, self.max_seq_len, mask, on_step)
        finally:
            if isinstance(decoder, _FixedStepDecoder):
                decoder.release()  # its window, for the next generation

    def window(
        self, batch: int, open_new: bool = True, holder: _FixedStepDecoder | None = None
    ) -> _Window | None:
        """The fixed step graph bound for ``batch`` rows, opened (and on CUDA captured) at first use
        in place of the least recently used that no generation holds, and taken for ``holder``
        where given; None where it is not open yet and ``open_new`` is False or MAX_WINDOWS are
        held, or another generation holds it (the steps then stay on the step graph)."""
        with self._opening:
            if batch not in self._windows and open_new:
                free = [b for b, window in self._windows.items() if not window.held]  # least recent first
                for b in free[: max(0, len(self._windows) + 1 - MAX_WINDOWS)]:
                    del self._windows[b]
                if len(self._windows) < MAX_WINDOWS:
                    self._windows[batch] = _Window(self, batch)
            window = self._windows.pop(batch, None)
            if window is None:
                return None
            self._windows[batch] = window  # the most recently used, last
            return window if holder is None or window.take(holder) else None

    def _pad_id(self) -> int:
        """What fills padding (the mask hides it)."""
        return self.manifest.padding.pad_id


class _StepDecoder:
    """The step graph as a search.Decoder: each step feeds the new tokens, the mask and the cache,
    runs, and keeps the present keys and values as the next past. Names and the device are
    looked up once, not per step."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.session = model.step
        cache = model.graph("step").cache
        assert cache is not None  # LanguageModel refuses a step graph without one at load
        self.past_names, self.present_names = cache.past, cache.present
        self.outputs = ["logits", *cache.present]
        shapes = {t.name: t.shape for t in model.graph("step").inputs}
        # Each past tensor's batch and cache axes (the manifest names them; the batch axis is
        # the first when it has no name).
        self.axes = [
            (shapes[name].index("batch") if "batch" in shapes[name] else 0, shapes[name].index(cache.axis))
            for name in cache.past
        ]
        self.device = "cuda" if self.session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.bound = self.device != "cpu"  # whether the cache stays on the device, bound
        self.binding = self.session.io_binding()
        self.past: list[Any] = []  # numpy arrays, or OrtValues on the device when bound
        self.length = 0  # tokens in the cache

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        if not self.past:
            self.past = self.model.empty_cache("step", len(tokens))
        self.length += tokens.shape[1]
        full = np.ones((len(tokens), self.length), dtype=np.int64) if mask is None else mask
        feed = {
            "input_ids": np.ascontiguousarray(tokens, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(full, dtype=np.int64),
            **dict(zip(self.past_names, self.past, strict=True)),
        }
        logits, *present = self._run(feed)
        self.model.check_outputs("step", feed, [logits, *present], self.outputs)
        self.past = present
        return logits[:, -1, : self.model.emitted].astype(np.float32, copy=False)  # the last position only

    def _run(self, feed: dict[str, Any]) -> list[Any]:
        """The step graph on ``feed`` -> the logits (numpy) and the present keys and values. On the
        CPU, a plain run: its outputs are numpy arrays that the next run reads in place, and it
        costs less Python per step than binding (about 50 us of a 0.7 ms step of a tiny model).
        Bound (on a device), I/O binding keeps the cache there between steps; only the logits
        come back."""
        if not self.bound:
            with failures():
                return self.session.run(self.outputs, feed)
        binding = self.binding
        for name, value in feed.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")
        for name in self.present_names:
            binding.bind_output(name, self.device)
        with failures():
            self.session.run_with_iobinding(binding)
        logits, *present = binding.get_outputs()
        return [logits.numpy(), *present]

    def reorder(self, rows: np.ndarray) -> None:
        self.past = [
            np.take(p, rows, axis=batch) for p, (batch, _) in zip(self._host(), self.axes, strict=True)
        ]

    def reset(self) -> None:
        self.past, self.length = [], 0

    def join(self, other: search.Decoder, columns: int) -> None:
        assert isinstance(other, _StepDecoder)
        self.past = [
            np.concatenate([left_pad(a, columns, cache), left_pad(b, columns, cache)], axis=batch)
            for a, b, (batch, cache) in zip(self._host(), other._host(), self.axes, strict=True)
        ]
        self.length = columns

    def trim(self, columns: int) -> None:
        if columns:
            self.past = [
                np.take(p, range(columns, p.shape[cache]), axis=cache)
                for p, (_, cache) in zip(self._host(), self.axes, strict=True)
            ]
            self.length -= columns

    def _host(self) -> list[np.ndarray]:
        """The cache as numpy arrays (copied from the device when bound there)."""
        return [p if isinstance(p, np.ndarray) else p.numpy() for p in self.past]


FIXED_STEP = "fixed_step"
MAX_WINDOWS = 4  # batch sizes whose fixed step graph stays bound (each a session and two windows)


class _Window:
    """The fixed step graph opened for one batch size, every input and output bound once where it
    runs: the token, the mask, the logits, and two sets of window buffers that the steps take in
    turn (each reads one and writes the other), so that each step runs on the same addresses and
    the CUDA provider replays one of two captured CUDA graphs. One generation's decoder holds it at
    a time (``take``, ``give``); a decoder dropped without giving it back (a finished running batch)
    holds it no more."""

    def __init__(self, model: LanguageModel, batch: int) -> None:
        self.model, self.batch = model, batch
        graph = model.graph(FIXED_STEP)
        self.session = model.open_graph(FIXED_STEP, batch)
        cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"

        def bound(tensor: Tensor) -> Any:
            shape = [batch if d == "batch" else d for d in tensor.shape]
            return ort.OrtValue.ortvalue_from_shape_and_type(
                shape, np.dtype(tensor.dtype).type, "cuda" if cuda else "cpu", 0
            )

        self.names = [t.name for t in graph.inputs[2:]], [t.name for t in graph.outputs[1:]]
        self.ids, self.mask = (bound(t) for t in graph.inputs[:2])
        self.logits = bound(graph.outputs[0])
        self.windows = [[bound(t) for t in graph.inputs[2:]] for _ in range(2)]
        self.bindings, self.run_options = [], []
        for turn in (0, 1):
            binding = self.session.io_binding()
            binding.bind_ortvalue_input("input_ids", self.ids)
            binding.bind_ortvalue_input("attention_mask", self.mask)
            binding.bind_ortvalue_output("logits", self.logits)
            for name, value in zip(self.names[0], self.windows[turn], strict=True):
                binding.bind_ortvalue_input(name, value)
            for name, value in zip(self.names[1], self.windows[1 - turn], strict=True):
                binding.bind_ortvalue_output(name, value)
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(turn + 1))  # a CUDA graph for each turn
            self.bindings.append(binding)
            self.run_options.append(options)
        self.turn = 0  # the buffers that hold the window now
        self._holder: weakref.ref[_FixedStepDecoder] | None = None
        self._guard = threading.Lock()

    @property
    def held(self) -> bool:
        return self._holder is not None and self._holder() is not None

    def take(self, decoder: _FixedStepDecoder) -> bool:
        """Hold the window for ``decoder`` -> whether it could (no other decoder alive holds it)."""
        with self._guard:
            holder = self._holder() if self._holder is not None else None
            if holder is not None and holder is not decoder:
                return False
            self._holder = weakref.ref(decoder)
            return True

    def give(self, decoder: _FixedStepDecoder) -> None:
        with self._guard:
            if self._holder is not None and self._holder() is decoder:
                self._holder = None

    def load(self, window: list[np.ndarray]) -> None:
        """Copy a window (numpy, each of its input's shape and type) into the buffers the next step
        reads."""
        for value, array in zip(self.windows[self.turn], window, strict=True):
            value.update_inplace(np.ascontiguousarray(array))

    def host(self) -> list[np.ndarray]:
        """The window now held, as numpy arrays."""
        return [value.numpy() for value in self.windows[self.turn]]

    def step(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """tokens (B, 1) and the mask (B, max_seq_len) over the window and them -> the logits
        (B, 1, V); the window slides by one."""
        self.ids.update_inplace(np.ascontiguousarray(tokens, dtype=np.int64))
        self.mask.update_inplace(np.ascontiguousarray(mask, dtype=np.int64))
        with failures():
            self.session.run_with_iobinding(self.bindings[self.turn], self.run_options[self.turn])
        self.turn = 1 - self.turn
        logits = self.logits.numpy()
        feed = {"input_ids": tokens, "attention_mask": mask} | dict(
            zip(self.names[0], self.windows[1 - self.turn], strict=True)
        )
        self.model.check_outputs(FIXED_STEP, feed, [logits, *self.windows[self.turn]])
        return logits


class _FixedStepDecoder:
    """A _StepDecoder whose single-token steps go through the fixed step graph: a prompt (and
    anything after a reset) reads through the step graph, whose cache then moves into the window,
    left-padded; the window's steps follow. Reordering, joining or trimming rows moves the cache
    back to the step graph's form first (a window is bound to its batch size). Where another
    generation holds the window of a batch size, or (``open_windows`` False) none is open, steps
    stay on the step graph."""

    def __init__(self, model: LanguageModel, open_windows: bool = True) -> None:
        self.model, self.open_windows = model, open_windows
        self.inner = _StepDecoder(model)
        self.window: _Window | None = None  # while the window holds the cache
        self.length = 0  # tokens in the cache while the window holds it

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        if tokens.shape[1] != 1:  # a prompt
            self._leave()
            return self.inner.step(tokens, mask)
        if self.window is None and not (self.inner.length and self._enter(len(tokens))):
            return self.inner.step(tokens, mask)
        assert self.window is not None
        width = self.model.max_seq_len
        full = np.zeros((len(tokens), width), dtype=np.int64)
        full[:, width - self.length - 1 :] = 1 if mask is None else mask
        logits = self.window.step(tokens, full)
        self.length += 1
        return logits[:, -1, : self.model.emitted].astype(np.float32, copy=False)

    def _enter(self, batch: int) -> bool:
        """Move the step graph's cache into the window of ``batch`` rows -> whether it could (no
        other generation holds that window)."""
        window = self.model.window(batch, self.open_windows, holder=self)
        if window is None:
            return False
        empty = self.model.max_seq_len - 1 - self.inner.length
        window.load(
            [
                left_pad(p, p.shape[axis] + empty, axis)
                for p, (_, axis) in zip(self.inner._host(), self.inner.axes, strict=True)
            ]
        )
        self.window, self.length = window, self.inner.length
        return True

    def _leave(self) -> None:
        """Move the window's cache back into the step graph's form (its last ``length`` positions)."""
        if self.window is not None:
            self.inner.past = [
                np.take(p, range(p.shape[axis] - self.length, p.shape[axis]), axis=axis)
                for p, (_, axis) in zip(self.window.host(), self.inner.axes, strict=True)
            ]
            self.inner.length = self.length
            self.release()

    def release(self) -> None:
        """Let the window go (its cache is dropped), for another generation."""
        if self.window is not None:
            self.window.give(self)
            self.window = None

    def reorder(self, rows: np.ndarray) -> None:
        self._leave()
        self.inner.reorder(rows)

    def reset(self) -> None:
        self.release()
        self.inner.reset()

    def join(self, other: search.Decoder, columns: int) -> None:
        assert isinstance(other, _FixedStepDecoder)  # both made by LanguageModel.join
        self._leave()
        other._leave()
        self.inner.join(other.inner, columns)

    def trim(self, columns: int) -> None:
        self._leave()
        self.inner.trim(columns)


class _FullDecoder:
    """The full graph as a search.Decoder: no cache, the whole sequence each step."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.ids: np.ndarray | None = None

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        self.ids = tokens if self.ids is None else np.concatenate([self.ids, tokens], axis=1)
        return self.model.logits(self.ids, mask)[:, -1, : self.model.emitted]

    def reorder(self, rows: np.ndarray) -> None:
        assert self.ids is not None
        self.ids = self.ids[rows]

    def reset(self) -> None:
        self.ids = None


def _as_row(
    on_step: Callable[[dict[int, int]], Iterable[int]], row: int
) -> Callable[[dict[int, int]], list[int]]:
    """``on_step`` of a batch, for row ``row`` generated alone (as row 0)."""
    return lambda tokens: [0] if row in on_step({row: tokens[0]}) else []
