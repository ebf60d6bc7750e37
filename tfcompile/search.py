"""Decoding, written once: sampling (greedy, temperature, top-k, top-p, min-p) and beam search with a
length penalty, over a ``Decoder``, anything that extends token sequences one step at a time and
keeps its own key/value cache. The runtime wraps its onnxruntime graphs as decoders; training
wraps the PyTorch model (tfcompile.tasks). numpy only: no torch and no onnxruntime here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from tfcompile.sequences import left_pad


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
class Bans:
    """What a sequence may not take next, as transformers' generate() bans it: the ``suppressed``
    tokens ever (suppress_tokens, bad_words_ids of one token); its ends (the eos, a language
    model's stop tokens) while it has chosen fewer than ``min_len`` tokens (min_new_tokens), or
    holds fewer than ``min_total`` (a language model's min_length, its prompt's tokens counted); a
    token that would make an n-gram of ``no_repeat_ngram`` tokens it holds already
    (no_repeat_ngram_size; 0: none); the last token of each of the ``sequences`` right after the
    others (bad_words_ids of several tokens)."""

    suppressed: tuple[int, ...] = ()
    min_len: int = 0
    no_repeat_ngram: int = 0
    sequences: tuple[tuple[int, ...], ...] = ()
    min_total: int = 0

    def ban(self, scores: np.ndarray, sequence: Sequence[int], chosen: int, ends: Sequence[int]) -> None:
        """scores (V,), in place: -inf at each token that may not follow ``sequence`` (every token
        the n-grams count: a prompt's, or the decoder's from its first), ``chosen`` of which
        count toward ``min_len``, whose ``ends`` it bans."""
        width = len(scores)
        scores[[t for t in self.suppressed if t < width]] = -np.inf
        if chosen < self.min_len or len(sequence) < self.min_total:
            scores[[t for t in ends if t < width]] = -np.inf
        n, tokens = self.no_repeat_ngram, np.asarray(sequence, dtype=np.int64)
        for *head, last in self.sequences:
            if (
                last < width
                and len(head) <= len(tokens)
                and tokens[len(tokens) - len(head) :].tolist() == head
            ):
                scores[last] = -np.inf
        if n and len(tokens) >= n:
            followers = tokens[n - 1 :]  # the token after each earlier (n - 1)-gram
            if n > 1:
                heads = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n - 1)
                followers = followers[(heads == tokens[len(tokens) - n + 1 :]).all(axis=1)]
            scores[followers[followers < width]] = -np.inf

    def __bool__(self) -> bool:
        return bool(
            self.suppressed or self.min_len or self.no_repeat_ngram or self.sequences or self.min_total
        )


NO_BANS = Bans()


@dataclass(frozen=True)
class Sampling:
    """How a row picks its next token: greedy at temperature 0 (or below GREEDY_BELOW); otherwise
    from the softmax of the logits over ``temperature``, filtered by top-k and top-p, drawn with
    its own ``seed`` (row r of a batch asked for with one seed draws with seed + r, so a prompt
    gives the same tokens whatever else shares its batch). Before either, the logits of the
    tokens the row holds already are penalised by ``repetition_penalty`` (``penalise_repeats``;
    1: not), and what ``bans`` bans is set to -inf (its min_len counting the row's new tokens).
    A row whose every token is banned ends there, without a token."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    repetition_penalty: float = 1.0
    bans: Bans = NO_BANS
    min_p: float | None = None


GREEDY = Sampling(temperature=0.0)
# A lower temperature decodes greedily, as vLLM's does: the logits divided by it would overflow.
GREEDY_BELOW = 1e-5


def penalise_repeats(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """CTRL's repetition penalty (Keskar et al. 2019) as transformers' repetition_penalty, in
    place: the logit (V,) of each token in ``seen`` divided by ``penalty`` where positive,
    multiplied by it where negative, once whatever its count."""
    tokens = np.unique(seen[seen < len(logits)])
    scores = logits[tokens]
    logits[tokens] = np.where(scores < 0, scores * penalty, scores / penalty)


def probabilities(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """logits (B, V) -> what sampling draws from (B, V), float64: the softmax of the logits over
    ``temperature`` (above 0), filtered in transformers' order and renormalised: top-k keeps the k
    most likely tokens (and any as likely as the k-th), top-p the fewest whose probabilities reach
    p, and min-p those at least min_p times as likely as the likeliest (Nguyen et al. 2024)."""
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
    if min_p:
        probs = np.where(probs < min_p * probs.max(axis=-1, keepdims=True), 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample_next(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | Sequence[np.random.Generator] | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """logits (B, V) -> next token ids (B,): greedy (argmax) at temperature 0 (below GREEDY_BELOW),
    else drawn from ``probabilities``. ``rng``: one generator for every row, or one per row."""
    if temperature < GREEDY_BELOW:
        return logits.argmax(axis=-1)
    probs = probabilities(logits, temperature, top_k, top_p, min_p)
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
    a full pass over them per token. Every row of the batch is re-read then: a RoPE whose angles
    follow a row's length (dynamic, longrope) reads a row still within the context as it would
    without a cache, not as its own cache alone would."""
    batch = len(prompt)
    limits = [max_new_tokens] * batch if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if isinstance(sampling, Sampling):
        seeds = [None if sampling.seed is None else sampling.seed + r for r in range(batch)]
        rows = [replace(sampling, seed=seed) for seed in seeds]
    else:
        rows = list(sampling)
    running = Batch(stop, context)
    keys = running.join(decoder, prompt, prompt_mask, limits, rows)
    while running:
        stepped = running.sample()
        if on_step is not None:
            running.end(on_step(stepped))
        running.advance()
    return [running.finished.pop(key) for key in keys]


@runtime_checkable
class Joinable(Decoder, Protocol):
    """A decoder whose cache can take in another's rows and lose columns that no row uses: what
    rows joining a running batch need."""

    def join(self, other: Decoder, columns: int) -> None:
        """Append ``other``'s rows after this one's, both caches left-padded to ``columns``
        positions (the padding is masked)."""
        ...

    def trim(self, columns: int) -> None:
        """Drop the first ``columns`` positions of the cache (padding in every row)."""
        ...


@dataclass
class _Row:
    key: int
    limit: int
    sampling: Sampling
    rng: np.random.Generator
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class Batch:
    """Rows generating together, a token each per step: the loop of ``generate``, and a server's
    continuous batching, where prompts join between steps (``join``) and rows leave as they end,
    so that a long generation does not hold up the requests that come after it.

    Each step: ``sample`` picks every row's next token (a row ends at a stop token or its limit),
    ``end`` ends rows early, ``advance`` lets the ended rows go (their tokens into ``finished``)
    and runs the decoder on the others' new tokens. ``ids`` (B, W) holds every row's tokens
    left-padded to the longest, ``mask`` (B, W) its real ones (None: none is padding); the
    decoder's cache holds the last min(W, context) columns, ``logits`` (B, V) what follows them.
    Columns that are padding in every row are dropped when the decoder can (``Joinable``)."""

    def __init__(self, stop: Sequence[int] = (), context: int | None = None) -> None:
        self.stop, self.context = tuple(stop), context
        self.finished: dict[int, list[int]] = {}  # an ended row's tokens by key, for the caller
        self.next_key = 0
        self._empty()

    def _empty(self) -> None:
        self.rows: list[_Row] = []
        self.decoder: Decoder | None = None
        self.mask: np.ndarray | None = None
        self.logits = np.zeros((0, 0), dtype=np.float32)
        self._ids = np.zeros((0, 0), dtype=np.int64)
        self._columns: list[np.ndarray] = []  # the new tokens since ``_ids`` was last extended

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def ids(self) -> np.ndarray:
        if self._columns:
            self._ids, self._columns = np.concatenate([self._ids, *self._columns], axis=1), []
        return self._ids

    @property
    def width(self) -> int:
        return self._ids.shape[1] + len(self._columns)

    def join(
        self,
        decoder: Decoder,
        prompt: np.ndarray,
        mask: np.ndarray | None,
        limits: Sequence[int],
        sampling: Sequence[Sampling],
    ) -> list[int]:
        """Prompt rows (B, P), left-padded as ``mask`` says, join the batch: ``decoder`` (with an
        empty cache) reads them, then its cache joins the batch's. -> the rows' keys, by which
        ``sample`` and ``finished`` name them (a row with a limit of 0 is finished at once)."""
        keys = list(range(self.next_key, self.next_key + len(prompt)))
        going = [r for r, limit in enumerate(limits) if limit > 0]
        if len(going) < len(prompt):
            prompt, mask = prompt[going], None if mask is None else mask[going]
        window = slice(-self.context if self.context is not None else None, None)
        if going:  # the prompts read first: if that fails, the batch is as it was
            logits = decoder.step(prompt[:, window], None if mask is None else mask[:, window])
        self.next_key += len(keys)
        self.finished.update((key, []) for key, limit in zip(keys, limits, strict=True) if limit <= 0)
        if not going:
            return keys
        rows = [_Row(keys[r], limits[r], sampling[r], np.random.default_rng(sampling[r].seed)) for r in going]
        if self.decoder is None:
            self.decoder, self._ids, self.mask, self.logits, self.rows = decoder, prompt, mask, logits, rows
            return keys
        if not isinstance(self.decoder, Joinable):
            raise TypeError(f"{type(self.decoder).__name__} cannot take in rows between steps")
        ids, width = self.ids, max(self.width, prompt.shape[1])
        self.decoder.join(decoder, self._cached(width))
        self.mask = np.concatenate(
            [left_pad(_real(self.mask, ids.shape), width, 1), left_pad(_real(mask, prompt.shape), width, 1)]
        )
        self._ids = np.concatenate([left_pad(ids, width, 1), left_pad(prompt, width, 1)])
        self.logits = np.concatenate([self.logits, logits])
        self.rows += rows
        self._trim()
        return keys

    def sample(self) -> dict[int, int]:
        """Every row's next token, by key; a row whose token is a stop token, or its last, ends, and
        one whose every token is banned ends without a token."""
        groups: dict[tuple, list[int]] = {}
        for r, row in enumerate(self.rows):
            options = (row.sampling.temperature, row.sampling.top_k, row.sampling.top_p, row.sampling.min_p)
            groups.setdefault(options, []).append(r)
        tokens = np.zeros(len(self.rows), dtype=np.int64)
        logits = self.logits
        changed = [
            r for r, row in enumerate(self.rows) if row.sampling.repetition_penalty != 1 or row.sampling.bans
        ]
        if changed:
            logits = logits.copy()
        for r in changed:  # over each row's real tokens: its prompt and what it has chosen
            row = self.rows[r]
            ids = self.ids[r] if self.mask is None else self.ids[r][self.mask[r].astype(bool)]
            if row.sampling.repetition_penalty != 1:
                penalise_repeats(logits[r], ids, row.sampling.repetition_penalty)
            row.sampling.bans.ban(logits[r], ids, len(row.tokens), self.stop)
        banned = [r for r in changed if np.isneginf(logits[r]).all()]
        for r in banned:  # the row ends; its logits are left finite for the draws
            logits[r], self.rows[r].done = 0, True
        for (temperature, top_k, top_p, min_p), members in groups.items():
            rows = slice(None) if len(members) == len(self.rows) else members  # a view, no copy
            generators = [self.rows[r].rng for r in members]
            tokens[rows] = sample_next(logits[rows], temperature, top_k, top_p, generators, min_p)
        stepped = {}
        for row, token in zip(self.rows, tokens.tolist(), strict=True):
            if row.done:
                continue
            row.tokens.append(token)
            row.done = token in self.stop or len(row.tokens) >= row.limit
            stepped[row.key] = token
        return stepped

    def end(self, keys: Iterable[int]) -> None:
        """End these rows after the tokens they have."""
        ending = set(keys)
        for row in self.rows:
            row.done = row.done or row.key in ending

    def advance(self) -> None:
        """The ended rows leave (their tokens into ``finished``); the decoder reads the others'
        newest tokens."""
        assert self.decoder is not None, "advance() before join()"
        for row in self.rows:
            if row.done:
                self.finished[row.key] = row.tokens
        keep = [r for r, row in enumerate(self.rows) if not row.done]
        if not keep:
            self._empty()
            return
        new = np.array([[self.rows[r].tokens[-1]] for r in keep], dtype=np.int64)
        if len(keep) < len(self.rows):
            self.decoder.reorder(np.array(keep))
            self.rows = [self.rows[r] for r in keep]
            self._ids, self.mask = self.ids[keep], None if self.mask is None else self.mask[keep]
            self._trim()
        cached = self._cached(self.width)
        self._columns.append(new)
        if self.mask is not None:
            self.mask = np.concatenate([self.mask, np.ones_like(new)], axis=1)
        if cached == self.context:  # past the context: the last ``context`` tokens, afresh
            window = slice(-self.context, None)
            self.decoder.reset()
            self.logits = self.decoder.step(
                self.ids[:, window], None if self.mask is None else self.mask[:, window]
            )
        else:
            self.logits = self.decoder.step(new, None if self.mask is None else self.mask[:, -(cached + 1) :])

    def _cached(self, width: int) -> int:
        """Columns the cache holds of ``width`` tokens."""
        return width if self.context is None else min(width, self.context)

    def _trim(self) -> None:
        """Drop the leading columns that are padding in every row (rows that needed them have
        left) from the ids, the mask and the cache, when the decoder can; a mask with no padding
        left becomes None."""
        if self.mask is None or not isinstance(self.decoder, Joinable):
            return
        first = int(self.mask.any(axis=0).argmax())  # the first column real in some row
        if first:
            width = self.width
            self.decoder.trim(self._cached(width) - self._cached(width - first))
            self._ids, self.mask = self.ids[:, first:], self.mask[:, first:]
        if self.mask.all():
            self.mask = None


def _real(mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """A mask, ones where None."""
    return np.ones(shape, dtype=np.int64) if mask is None else mask


def strip_stop(tokens: list[int], stop: Sequence[int]) -> list[int]:
    """A row of ``generate`` without the stop token it ended with, if it did."""
    return tokens[:-1] if tokens and tokens[-1] in stop else tokens


def length_normalised(log_prob: float, length: int, alpha: float) -> float:
    """A finished hypothesis's score: log p / ((5 + length) / 6) ** alpha (Wu et al. 2016, as in
    Vaswani et al. 2017 with alpha 0.6)."""
    return log_prob / ((5 + length) / 6) ** alpha


def translate(
    decoder_for: Callable[[int | None], Decoder],
    rows: int,
    start: Sequence[int],
    eos: int,
    max_len: int,
    beam: int,
    scoring: BeamScoring,
    forced_eos: bool = False,
    bans: Bans = NO_BANS,
) -> list[list[int]]:
    """Each of ``rows`` sources -> its translation's tokens, without ``eos``: greedy (``beam`` 1,
    the rows together: ``decoder_for(None)`` reads every source) or ``beam_search`` as
    ``scoring`` says (a row at a time: ``decoder_for(row)`` reads that source alone). The decoder
    reads ``start`` (the start token, then any it is given: a target language's code) before it
    chooses a token; it holds at most ``max_len`` tokens after the first, ``start``'s included
    (transformers' max_new_tokens). With ``forced_eos`` the last of them is ``eos``
    (transformers' forced_eos_token_id): a translation that reaches the limit ends a token
    sooner. No token ``bans`` bans is chosen (its min_len counting ``start``'s after the first)."""
    limit = max(max_len - (len(start) - 1), 0)
    if beam == 1:
        first = np.tile(np.array(start, dtype=np.int64), (rows, 1))
        chosen = max(limit - 1, 0) if forced_eos else limit
        given = replace(bans, min_len=max(bans.min_len - (len(start) - 1), 0))
        decoded = generate(decoder_for(None), first, chosen, replace(GREEDY, bans=given), stop=(eos,))
        return [strip_stop(tokens, (eos,)) for tokens in decoded]
    return [
        beam_search(decoder_for(row), start, eos, limit, beam, scoring, forced_eos, bans)
        for row in range(rows)
    ]


def beam_search(
    decoder: Decoder,
    start: Sequence[int],
    eos: int,
    max_len: int,
    beam: int,
    scoring: BeamScoring,
    forced_eos: bool = False,
    bans: Bans = NO_BANS,
) -> list[int]:
    """One sequence (the decoder's cache holds one row), after the tokens ``start`` (the decoder's
    first, then any it is given: not scored) -> the best hypothesis as ``scoring`` scores them, at
    most ``max_len`` tokens after ``start``, without ``eos``. With ``forced_eos``, the
    ``max_len``-th token is ``eos``. ``bans``: a candidate it bans scores -inf (the others keep
    their log-probabilities, as transformers' logits processors leave them); the forced eos is
    never banned."""
    return scoring.search(decoder, start, eos, max_len, beam, forced_eos, bans)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """logits (n, V) -> their log-softmax, float64."""
    scores = logits.astype(np.float64)
    scores -= scores.max(-1, keepdims=True)
    return scores - np.log(np.exp(scores).sum(-1, keepdims=True))


@dataclass(frozen=True)
class FairseqBeam:
    """fairseq's beam search (Vaswani et al.'s): a finished hypothesis scores ``length_normalised``
    with alpha ``length_penalty``; the search ends once ``beam`` hypotheses have finished."""

    length_penalty: float

    def search(
        self,
        decoder: Decoder,
        start: Sequence[int],
        eos: int,
        max_len: int,
        beam: int,
        forced_eos: bool = False,
        bans: Bans = NO_BANS,
    ) -> list[int]:
        """Keep the ``beam`` best partial hypotheses by summed log-probability. ``eos`` ends a
        hypothesis only from within the top ``beam`` candidates, as in fairseq, so beam 1 is greedy
        decoding. With ``forced_eos``, the step that chooses the ``max_len``-th token chooses ``eos``
        for every live hypothesis, scored by its log-probability (fairseq's end at the length
        limit). A banned candidate (-inf) is never taken: a hypothesis whose every candidate is
        banned finishes as it is, as greedy decoding's row ends there."""
        alpha = self.length_penalty
        hypotheses: list[tuple[float, list[int]]] = [(0.0, [])]  # (summed log p, tokens after start)
        finished: list[tuple[float, list[int]]] = []  # (length-normalised score, tokens)
        logits = decoder.step(np.array([start], dtype=np.int64), None)
        for step in range(max_len + 1):
            log_probs = log_softmax(logits)
            if forced_eos and step == max_len - 1:  # the last place is eos's: every hypothesis ends
                for row, (score, words) in enumerate(hypotheses):
                    finished.append(
                        (length_normalised(score + float(log_probs[row, eos]), len(words), alpha), words)
                    )
                break
            for row, (_, words) in enumerate(hypotheses):
                bans.ban(log_probs[row], [*start, *words], len(start) - 1 + len(words), (eos,))
            ended = [bool(np.isneginf(row).all()) for row in log_probs]  # nothing may follow
            finished += [
                (length_normalised(s, len(w), alpha), w)
                for (s, w), e in zip(hypotheses, ended, strict=True)
                if e
            ]
            scores = np.array([s for s, _ in hypotheses])[:, None] + log_probs  # (n, V)
            order = np.argsort(-scores, axis=None, kind="stable")[: min(2 * beam, scores.size)]
            survivors: list[tuple[float, list[int], int]] = []
            for rank, index in enumerate(order):
                parent, token = divmod(int(index), log_probs.shape[1])
                score, words = float(scores[parent, token]), hypotheses[parent][1]
                if score == -np.inf:  # banned, as every candidate after it
                    break
                if token == eos:
                    if rank < beam:
                        finished.append((length_normalised(score, len(words), alpha), words))
                elif len(survivors) < beam:
                    survivors.append((score, [*words, token], parent))
            if len(finished) >= beam:
                break
            if step == max_len:  # out of length: the current hypotheses end here, unfinished
                going = [h for h, e in zip(hypotheses, ended, strict=True) if not e]
                finished += [(length_normalised(s, len(w), alpha), w) for s, w in going]
                break
            if not survivors:
                break
            decoder.reorder(np.array([parent for _, _, parent in survivors]))
            hypotheses = [(score, words) for score, words, _ in survivors]
            logits = decoder.step(np.array([[words[-1]] for _, words in hypotheses], dtype=np.int64), None)
        return max(finished, key=lambda f: f[0])[1]


# transformers' score of a beam that holds nothing yet, and its penalty for a candidate that ended
UNSCORED = -1e9


@dataclass(frozen=True)
class TransformersBeam:
    """transformers' generate() beam search (5's, as 4's BeamSearchScorer): a finished hypothesis
    scores its summed log-probability / length ** ``length_penalty``, length counting the tokens
    after the decoder's first, the given ones and ``eos`` included; ``early_stopping`` says when
    it ends: True once ``beam`` have finished, False once the best live hypothesis, scored at its
    present length, cannot beat the worst of ``beam`` finished, "never" the same at the longest
    length it could reach (with a positive ``length_penalty``)."""

    length_penalty: float
    early_stopping: bool | Literal["never"] = False

    def search(
        self,
        decoder: Decoder,
        start: Sequence[int],
        eos: int,
        max_len: int,
        beam: int,
        forced_eos: bool = False,
        bans: Bans = NO_BANS,
    ) -> list[int]:
        """``beam`` live hypotheses, the first scored 0 and the rest UNSCORED (copies of it, which
        only a step with fewer than 2 * ``beam`` likely candidates reaches). Each step takes the
        2 * ``beam`` best candidates (ties: the lower index hypothesis * vocabulary + token first);
        of them, those among the first ``beam`` that end (on ``eos``, or at ``max_len``) join the
        ``beam`` best finished ones, the others the next live hypotheses (those that ended last,
        at UNSCORED below their score). With ``forced_eos``, the last step's candidates are each
        hypothesis's ``eos``, at log-probability 0 (transformers' ForcedEOSTokenLogitsProcessor)."""
        given, alpha, ending = len(start) - 1, self.length_penalty, self.early_stopping
        scores = np.full(beam, UNSCORED)
        scores[0] = 0.0
        hypotheses: list[list[int]] = [[] for _ in range(beam)]  # the tokens after start
        rows = np.zeros(beam, dtype=np.int64)  # each hypothesis's row in the decoder's cache
        finished: list[tuple[float, list[int]]] = []  # (length-normalised score, tokens): best first
        logits = decoder.step(np.array([start], dtype=np.int64), None)
        for step in range(max_len):
            log_probs = log_softmax(logits)[rows]  # (beam, V)
            for row, words in enumerate(hypotheses):
                bans.ban(log_probs[row], [*start, *words], given + len(words), (eos,))
            last = step == max_len - 1
            if forced_eos and last:
                log_probs[:] = -np.inf
                log_probs[:, eos] = 0.0
            totals = (scores[:, None] + log_probs).reshape(-1)
            order = np.argsort(-totals, kind="stable")[: 2 * beam]
            parents, tokens = np.divmod(order, log_probs.shape[1])
            ends = (tokens == eos) | last
            length = given + step + 1  # the tokens after the decoder's first, this one's included
            for rank in np.flatnonzero(ends[:beam]):  # a banned candidate (-inf) never finishes
                if np.isfinite(totals[order[rank]]):
                    words = hypotheses[parents[rank]] + ([] if tokens[rank] == eos else [int(tokens[rank])])
                    finished.append((float(totals[order[rank]]) / length**alpha, words))
            finished = sorted(finished, key=lambda f: -f[0])[:beam]  # stable: the earlier first
            if last or ends.all():
                break
            live = np.where(ends, totals[order] + UNSCORED, totals[order])
            keep = np.argsort(-live, kind="stable")[:beam]
            scores = live[keep]
            hypotheses = [[*hypotheses[parents[k]], int(tokens[k])] for k in keep]
            full = len(finished) == beam
            if ending is True and full:
                break
            longest = given + max_len if ending == "never" and alpha > 0 else length
            if not scores[0] / longest**alpha > (finished[-1][0] if full else UNSCORED):
                break  # the best live hypothesis cannot beat the worst finished one
            decoder.reorder(rows[parents[keep]])
            rows = np.arange(len(keep))
            logits = decoder.step(tokens[keep][:, None].astype(np.int64), None)
        return finished[0][1] if finished else []


BeamScoring = FairseqBeam | TransformersBeam


def beam_scoring(
    kind: str, length_penalty: float, early_stopping: bool | Literal["never"] = False
) -> BeamScoring:
    """The manifest's (and the spec's) ``beam_scoring``, with its length penalty and early stopping."""
    if kind == "transformers":
        return TransformersBeam(length_penalty, early_stopping)
    return FairseqBeam(length_penalty)
