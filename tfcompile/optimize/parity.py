"""A transformed graph against the graph it came from, both run by onnxruntime on the same fresh
inputs, built from the manifest alone: token ids inside the vocabulary, masks with a left-padded
row, other floats standard normal; a step graph runs a prompt from an empty cache and then single
tokens, each graph feeding back its own cache; the fixed step graph runs single tokens over a
window that the source bundle's step graph filled from a prompt (both graphs start from that one
window), each graph feeding back its own window; at batch 1 every graph reads the whole context
(up to sequences.LONGEST tokens, as export's check).
-> per case (a batch size, over its steps), the largest |difference| of the float outputs relative
to the largest finite |value| of the outputs (a step graph's: of its logits), read as float32, and
the largest over the cases, as `tfcompile verify` measures a graph against PyTorch; infinite where
one graph's output is NaN or infinite and the other's is not the same."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tfcompile.agreement import finite_scale, largest_difference
from tfcompile.manifest import FIXED_STEP_ROLE, STEP_ROLE, Graph, Manifest
from tfcompile.runtime.ort import ort, run
from tfcompile.runtime.session import SessionOptions
from tfcompile.sequences import left_pad, longest

# Sizes of the named axes: at batch 1 every graph reads the whole context (a forward graph or an
# encoder all of it at once, a step graph a prompt then single tokens up to its last position),
# and a short padded batch follows (a step graph's mask covers past + new).
BATCHES = (1, 3)
PROMPT, STEPS = 7, 2
SOURCE = 6


def relative_difference(
    source: bytes,
    transformed: bytes,
    graph: Graph,
    manifest: Manifest,
    prefill: bytes | None = None,
    seed: int = 0,
) -> float:
    """max over cases of max |a - b| / max |a| over every float output of the case (see the
    module's doc). ``prefill``: the source bundle's step graph, which fills the fixed step graph's
    window."""
    sessions = [_session(g) for g in (source, transformed)]
    rng = np.random.default_rng(seed)
    if graph.role == FIXED_STEP_ROLE:
        assert prefill is not None, "the fixed step graph's window is filled by the step graph"
        step = next(g for g in manifest.graphs.values() if g.role == STEP_ROLE)
        cases = _window_runs(sessions, _session(prefill), graph, step, manifest, rng)
    else:
        cases = _runs(sessions, graph, manifest, rng)
    relative = 0.0
    for case in cases:
        worst, scale = 0.0, 0.0
        for *outputs, scales in case:
            a, b = (np.asarray(o, dtype=np.float32) for o in outputs)
            worst = max(worst, largest_difference(a, b))
            scale = max(scale, finite_scale(a)) if scales else scale
        relative = max(relative, worst / scale if scale else worst)
    return relative


def _session(graph: bytes) -> object:
    options = SessionOptions().to_ort()  # the runtime's, for a graph the bundle's author wrote
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


# Each float output of both graphs over a case's steps, and whether it sets the case's scale: every
# output of a forward graph or an encoder, a step graph's logits alone (as verify scales them).
Case = list[tuple[np.ndarray, np.ndarray, bool]]


def _runs(sessions: list, graph: Graph, manifest: Manifest, rng: np.random.Generator) -> Iterator[Case]:
    """Each case's float outputs of both sessions, pairwise."""
    floats = [t.name for t in graph.outputs if t.dtype != "int64"]
    context = longest(manifest.model.max_seq_len)
    for batch in BATCHES:
        whole = batch == 1
        source = context if whole else min(SOURCE, context)
        if graph.cache is None:
            sequence = context if whole else min(PROMPT, context)
            feed = _feed(
                graph, manifest, rng, {"batch": batch, "sequence": sequence, "source_sequence": source}
            )
            results = [dict(zip(floats, run(s, feed, floats), strict=True)) for s in sessions]
            yield [(results[0][n], results[1][n], True) for n in floats]
            continue
        case: Case = []
        caches: list[dict[str, np.ndarray]] = [{}, {}]
        past = 0
        prompt = max(context - STEPS if whole else min(PROMPT, context - STEPS), 1)
        for new in (prompt, *([1] * STEPS)):
            sizes = {"batch": batch, "sequence": new, "past_sequence": past, "source_sequence": source}
            sizes["total_sequence"] = past + new
            feed = _feed(graph, manifest, rng, sizes)
            results = []
            for session, cache in zip(sessions, caches, strict=True):
                out = dict(zip(floats, run(session, {**feed, **cache}, floats), strict=True))
                cache.clear()
                cache.update({p: out[q] for p, q in zip(graph.cache.past, graph.cache.present, strict=True)})
                results.append(out)
            case += [(results[0][n], results[1][n], n == floats[0]) for n in floats]
            past += new
        yield case


def _window_runs(
    sessions: list, prefill: object, graph: Graph, step: Graph, manifest: Manifest, rng: np.random.Generator
) -> Iterator[Case]:
    """The fixed step graph's cases, fed as the runtime feeds it: a prompt read by the source's step
    graph, whose cache, left-padded with zeros, fills both graphs' window (max_seq_len - 1
    positions; the runtime's names: past_key_0 -> window_key_0), then single tokens, each graph
    sliding its own window. At batch 1 the window fills up; at batch 3 the last row's prompt
    starts with padding."""
    cache = step.cache
    assert cache is not None
    windows = [f"window_{name.removeprefix('past_')}" for name in cache.past]
    floats = [t.name for t in graph.outputs if t.dtype != "int64"]
    shapes = {t.name: t.shape for t in step.inputs}
    axes = [shapes[name].index(cache.axis) for name in cache.past]
    width = manifest.model.max_seq_len  # the window and the new token
    for batch, prompt, total in ((1, max(width - 3, 1), width), (3, min(5, width - 1), min(9, width))):
        sizes = {"batch": batch, "sequence": prompt, "past_sequence": 0, "total_sequence": prompt}
        feed = _feed(step, manifest, rng, sizes)
        mask = feed["attention_mask"]
        present = run(prefill, feed, cache.present)
        filled = [left_pad(p, width - 1, axis) for p, axis in zip(present, axes, strict=True)]
        held = [dict(zip(windows, filled, strict=True)) for _ in sessions]
        case: Case = []
        for _ in range(prompt, total):
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
            tokens = rng.integers(0, manifest.model.vocab_size or 2, (batch, 1), dtype=np.int64)
            results = []
            for session, window in zip(sessions, held, strict=True):
                feed = {"input_ids": tokens, "attention_mask": left_pad(mask, width, 1)} | window
                out = dict(zip(floats, run(session, feed, floats), strict=True))
                window.update({name: out[f"next_{name}"] for name in windows})
                results.append(out)
            case += [(results[0][n], results[1][n], n == floats[0]) for n in floats]
        yield case


def _feed(
    graph: Graph, manifest: Manifest, rng: np.random.Generator, sizes: dict[str, int]
) -> dict[str, np.ndarray]:
    vocab = manifest.model.vocab_size or 2
    feed: dict[str, np.ndarray] = {}
    for tensor in graph.inputs:
        shape = [d if isinstance(d, int) else sizes[d] for d in tensor.shape]
        if tensor.dtype != "int64":
            past = graph.cache is not None and tensor.name in graph.cache.past
            feed[tensor.name] = (np.zeros(shape) if past else rng.standard_normal(shape)).astype(np.float32)
        elif tensor.name == "token_type_ids":
            feed[tensor.name] = (np.arange(shape[-1]) >= shape[-1] // 2).astype(np.int64) * np.ones(
                shape, np.int64
            )
        elif tensor.name.endswith("_ids"):
            feed[tensor.name] = rng.integers(0, vocab, shape, dtype=np.int64)
        else:  # a mask: every row real, but the last row's first position is padding
            mask = np.ones(shape, dtype=np.int64)
            if shape[0] > 1:
                mask[-1, 0] = 0
            feed[tensor.name] = mask
    return feed
