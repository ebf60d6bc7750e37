"""A transformed graph against the graph it came from, both run by onnxruntime on the same fresh
inputs, built from the manifest alone: token ids inside the vocabulary, masks with a left-padded
row, other floats standard normal; a step graph runs a prompt from an empty cache and then single
tokens, each graph feeding back its own cache; at batch 1 every graph reads the whole context
(up to sequences.LONGEST tokens, as export's check).
-> the largest |difference| of the float outputs, relative to their largest finite |value|
(outputs read as float32); infinite where one graph's output is NaN or infinite and the other's
is not the same."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tfcompile.agreement import finite_scale, largest_difference
from tfcompile.manifest import Graph, Manifest
from tfcompile.runtime.ort import ort, run
from tfcompile.runtime.session import SessionOptions
from tfcompile.sequences import longest

# Sizes of the named axes: at batch 1 every graph reads the whole context (a forward graph or an
# encoder all of it at once, a step graph a prompt then single tokens up to its last position),
# and a short padded batch follows (a step graph's mask covers past + new).
BATCHES = (1, 3)
PROMPT, STEPS = 7, 2
SOURCE = 6


@dataclass(frozen=True)
class Case:
    batch: int
    sizes: dict[str, int]


def relative_difference(
    source: bytes, transformed: bytes, graph: Graph, manifest: Manifest, seed: int = 0
) -> float:
    """max |a - b| / max |a| over every float output and every case (see the module's doc)."""
    options = SessionOptions().to_ort()  # the runtime's, for a graph the bundle's author wrote
    sessions = [
        ort.InferenceSession(g, options, providers=["CPUExecutionProvider"]) for g in (source, transformed)
    ]
    rng = np.random.default_rng(seed)
    worst, scale = 0.0, 0.0
    for outputs in _runs(sessions, graph, manifest, rng):
        a, b = (np.asarray(o, dtype=np.float32) for o in outputs)
        worst = max(worst, largest_difference(a, b))
        scale = max(scale, finite_scale(a))
    return worst / scale if scale else worst


def _runs(
    sessions: list, graph: Graph, manifest: Manifest, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each float output of both sessions, pairwise, over every case."""
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
            yield from ((results[0][n], results[1][n]) for n in floats)
            continue
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
            yield from ((results[0][n], results[1][n]) for n in floats)
            past += new


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
