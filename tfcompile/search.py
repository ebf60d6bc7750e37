"""Decoding, written once: sampling (greedy, temperature, top-k, top-p) and beam search with a
length penalty, over a ``Decoder``, anything that extends token sequences one step at a time and
keeps its own key/value cache. The runtime wraps its onnxruntime graphs as decoders; training
wraps the PyTorch model (tfcompile.tasks). numpy only: no torch and no onnxruntime here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Decoder(Protocol):
    """A model with a cache. ``step`` reads the next tokens of every row and returns the logits
    that follow the last of them; ``reorder`` keeps (and repeats) rows of the cache, as beam
    search needs when hypotheses branch; ``reset`` empties the cache."""

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """tokens (B, T) int64, the mask (B, cached + T) over the cache and them (1 at real tokens;
        None when every token is real) -> logits (B, V) float32 for the token after the last one."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Row i of the cache becomes the old row ``rows[i]``."""
        ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class Sampling:
    """How a row picks its next token: greedy at temperature 0; otherwise from the softmax of the
    logits over ``temperature``, filtered by top-k and top-p, drawn with its own ``seed`` (row r
    of a batch asked for with one seed draws with seed + r, so a prompt gives the same tokens
    whatever else shares its batch)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None


GREEDY = Sampling(temperature=0.0)


def sample_next(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | Sequence[np.random.Generator] | None = None,
) -> np.ndarray:
    """logits (B, V) -> next token ids (B,). Temperature 0 is greedy (argmax); top-k keeps the k
    most likely tokens, top-p the fewest whose probabilities reach p. ``rng``: one generator for
    every row, or one per row."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    scores = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = np.sort(scores, axis=-1)[:, -top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    rngs = rng if isinstance(rng, Sequence) else [rng or np.random.default_rng()] * len(probs)
    return np.array([r.choice(len(p), p=p) for r, p in zip(rngs, probs, strict=True)])


def generate(
    decoder: Decoder,
    prompt: np.ndarray,
    max_new_tokens: int | Sequence[int],
    sampling: Sampling | Sequence[Sampling] = Sampling(),
    stop: Sequence[int] = (),
    context: int | None = None,
    prompt_mask: np.ndarray | None = None,
    on_step: Callable[[dict[int, int]], Iterable[int]] | None = None,
) -> list[list[int]]:
    """prompt (B, P) -> each row's new tokens, at most ``max_new_tokens`` (one count, or one per
    row); a row ends at its first token in ``stop``, which is returned as its last. ``sampling``:
    one for every row (rows then draw with seed, seed + 1, ...), or one per row. ``prompt_mask``
    (B, P) marks the real tokens of padded prompts (None: all are real). ``on_step`` sees each
    step's new token of every row still going and returns the rows to end there (a stop string,
    a client gone). Rows are independent: each generates what it would alone.

    With ``context``, the model reads at most that many tokens: once the sequence is longer, each
    step re-reads its last ``context`` tokens from an empty cache (as nanoGPT samples), which costs
    a full pass over them per token."""
    batch = len(prompt)
    limits = [max_new_tokens] * batch if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if isinstance(sampling, Sampling):
        seeds = [None if sampling.seed is None else sampling.seed + r for r in range(batch)]
        rows = [Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed) for seed in seeds]
    else:
        rows = list(sampling)
    rngs = [np.random.default_rng(s.seed) for s in rows]
    groups: dict[tuple, list[int]] = {}
    for r, s in enumerate(rows):
        groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(r)
    # Each group's options, its rows (a slice when they are the whole batch: a view, no copy) and
    # their generators.
    picks = [
        (options, slice(None) if len(members) == batch else members, [rngs[r] for r in members])
        for options, members in groups.items()
    ]
    new: list[list[int]] = [[] for _ in prompt]
    done = [limit <= 0 for limit in limits]
    going = [r for r in range(batch) if not done[r]]  # the rows still generating
    if not going:
        return new
    ids, mask = prompt, prompt_mask
    window = slice(-context if context is not None else None, None)
    logits = decoder.step(ids[:, window], None if mask is None else mask[:, window])
    cached = ids[:, window].shape[1]
    columns: list[np.ndarray] = []  # the new tokens of every row since ``ids`` was last extended
    while True:
        next_ids = np.zeros((batch, 1), dtype=np.int64)
        for (temperature, top_k, top_p), members, generators in picks:
            next_ids[members, 0] = sample_next(logits[members], temperature, top_k, top_p, generators)
        tokens = next_ids[:, 0].tolist()
        stepped = {r: tokens[r] for r in going}
        for row, token in stepped.items():
            new[row].append(token)
            done[row] = token in stop or len(new[row]) >= limits[row]
        if on_step is not None:
            for row in on_step(stepped):
                done[row] = True
        going = [r for r in going if not done[r]]
        if not going:
            break
        columns.append(next_ids)
        if mask is not None:
            mask = np.concatenate([mask, np.ones_like(next_ids)], axis=1)
        if cached == context:
            ids, columns = np.concatenate([ids, *columns], axis=1), []
            decoder.reset()
            logits = decoder.step(ids[:, window], None if mask is None else mask[:, window])
        else:
            cached += 1
            logits = decoder.step(next_ids, None if mask is None else mask[:, -cached:])
    return new


def strip_stop(tokens: list[int], stop: Sequence[int]) -> list[int]:
    """A row of ``generate`` without the stop token it ended with, if it did."""
    return tokens[:-1] if tokens and tokens[-1] in stop else tokens


def length_normalised(log_prob: float, length: int, alpha: float) -> float:
    """A finished hypothesis's score: log p / ((5 + length) / 6) ** alpha (Wu et al. 2016, as in
    Vaswani et al. 2017 with alpha 0.6)."""
    return log_prob / ((5 + length) / 6) ** alpha


def beam_search(decoder: Decoder, start: int, eos: int, max_len: int, beam: int, alpha: float) -> list[int]:
    """One sequence (the decoder's cache holds one row): keep the ``beam`` best partial
    hypotheses by summed log-probability, starting after ``start``; a finished one is scored by
    ``length_normalised``. ``eos`` ends a hypothesis only from within the top ``beam`` candidates,
    as in fairseq, so beam 1 is greedy decoding. -> the best hypothesis, without ``eos``."""
    hypotheses: list[tuple[float, list[int]]] = [(0.0, [])]  # (summed log p, tokens after start)
    finished: list[tuple[float, list[int]]] = []  # (length-normalised score, tokens)
    logits = decoder.step(np.array([[start]], dtype=np.int64), None)
    for step in range(max_len + 1):
        scores64 = logits.astype(np.float64)
        log_probs = scores64 - scores64.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        scores = np.array([s for s, _ in hypotheses])[:, None] + log_probs  # (n, V)
        order = np.argsort(-scores, axis=None, kind="stable")[: min(2 * beam, scores.size)]
        survivors: list[tuple[float, list[int], int]] = []
        for rank, index in enumerate(order):
            parent, token = divmod(int(index), log_probs.shape[1])
            score, words = float(scores[parent, token]), hypotheses[parent][1]
            if token == eos:
                if rank < beam:
                    finished.append((length_normalised(score, len(words), alpha), words))
            elif len(survivors) < beam:
                survivors.append((score, [*words, token], parent))
        if len(finished) >= beam:
            break
        if step == max_len:  # out of length: the current hypotheses end here, unfinished
            finished += [(length_normalised(s, len(w), alpha), w) for s, w in hypotheses]
            break
        decoder.reorder(np.array([parent for _, _, parent in survivors]))
        hypotheses = [(score, words) for score, words, _ in survivors]
        logits = decoder.step(np.array([[words[-1]] for _, words in hypotheses], dtype=np.int64), None)
    return max(finished, key=lambda f: f[0])[1]
