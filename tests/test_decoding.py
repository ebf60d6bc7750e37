"""tfcompile.search against references written here: a scripted decoder whose logits are a pure
function of the real tokens it has read, so that a row's tokens in any batch (left-padded, joined
between steps, ended early, past the context) can be checked against a plain loop over that row
alone; the runtime's batches against each prompt alone and a plain loop; beam search with a beam
wide enough to keep every hypothesis against brute force; and the sampling filters against the
manifest's rules."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tfcompile import search
from tfcompile.runtime import InputError, LanguageModel, load

VOCAB = 7
VASWANI = search.FairseqBeam(0.6)


def scripted_logits(tokens: Sequence[int], vocab: int = VOCAB) -> np.ndarray:
    """The logits after ``tokens``: fixed pseudo-random numbers keyed by the whole sequence."""
    seed = zlib.crc32(np.array(tokens, dtype=np.int64).tobytes())
    return (3 * np.random.default_rng(seed).normal(size=vocab)).astype(np.float32)


class Scripted:
    """A search.Decoder (and Joinable) whose cache is each row's columns, None at padding. It holds
    the batch to the protocol: the mask covers exactly the cache and the new tokens, agrees with
    what earlier steps marked as padding, and every row's last token is real."""

    def __init__(self, vocab: int = VOCAB) -> None:
        self.vocab = vocab
        self.columns: list[list[int | None]] = []

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        if not self.columns:
            self.columns = [[] for _ in tokens]
        assert len(self.columns) == len(tokens)
        width = len(self.columns[0]) + tokens.shape[1]
        real = np.ones((len(tokens), width), dtype=np.int64) if mask is None else mask
        assert real.shape == (len(tokens), width)
        for row, new, flags in zip(self.columns, tokens.tolist(), real.tolist(), strict=True):
            row += [t if flag else None for t, flag in zip(new, flags[-len(new) :], strict=True)]
            assert [c is not None for c in row] == [bool(f) for f in flags]
            assert row[-1] is not None, "a row's last token is padding"
        return np.stack(
            [scripted_logits([c for c in row if c is not None], self.vocab) for row in self.columns]
        )

    def reorder(self, rows: np.ndarray) -> None:
        self.columns = [list(self.columns[r]) for r in rows.tolist()]

    def reset(self) -> None:
        self.columns = []

    def join(self, other: search.Decoder, columns: int) -> None:
        assert isinstance(other, Scripted)
        self.columns = [[*[None] * (columns - len(row)), *row] for row in self.columns + other.columns]

    def trim(self, columns: int) -> None:
        assert all(c is None for row in self.columns for c in row[:columns]), "trimmed a real token"
        self.columns = [row[columns:] for row in self.columns]


class Uncached:
    """The scripted decoder without join and trim (as the runtime's full-graph decoder)."""

    def __init__(self) -> None:
        self.inner = Scripted()

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return self.inner.step(tokens, mask)

    def reorder(self, rows: np.ndarray) -> None:
        self.inner.reorder(rows)

    def reset(self) -> None:
        self.inner.reset()


def greedy_alone(prompt: Sequence[int], limit: int, context: int | None, stop: Sequence[int]) -> list[int]:
    """One row, the plainest way: the argmax after the last ``context`` tokens, to a stop token."""
    sequence, new = list(prompt), list[int]()
    while len(new) < limit and not (new and new[-1] in stop):
        window = sequence if context is None else sequence[-context:]
        new.append(int(scripted_logits(window).argmax()))
        sequence.append(new[-1])
    return new


def left_padded(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray | None]:
    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + list(p) for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    return ids, None if mask.all() else mask


prompts = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)
contexts = st.sampled_from([None, 1, 3, 5, 8])
stops = st.lists(st.integers(0, VOCAB - 1), max_size=1)
penalties = st.sampled_from([1.0, 0.7, 1.3, 2.0])
bans = st.one_of(
    st.just(search.NO_BANS),
    st.builds(
        search.Bans,
        suppressed=st.lists(st.integers(0, 8), max_size=3).map(tuple),
        min_len=st.integers(0, 4),
        no_repeat_ngram=st.integers(0, 3),
        sequences=st.lists(st.lists(st.integers(0, 8), min_size=2, max_size=3).map(tuple), max_size=3).map(
            tuple
        ),
        min_total=st.integers(0, 14),
    ),
)
samplings = st.one_of(
    st.just(search.GREEDY),
    st.builds(search.Sampling, st.just(0.0), repetition_penalty=penalties, bans=bans),
    st.builds(
        search.Sampling,
        st.sampled_from([0.5, 1.0, 4.0]),
        st.sampled_from([None, 1, 2, 5, VOCAB + 1]),
        st.sampled_from([None, 1e-9, 0.5, 0.95, 1.0]),
        st.integers(0, 2**32),
        penalties,
    ),
)


@settings(deadline=None)  # the first example imports transformers
@given(
    rows=st.lists(st.tuples(prompts, st.integers(0, 12)), min_size=1, max_size=3),
    context=contexts,
    penalty=penalties,
)
def test_greedy_with_a_repetition_penalty_is_transformers(
    rows: list[tuple[list[int], int]], context: int | None, penalty: float
) -> None:
    """A left-padded batch under a repetition penalty: each row chooses what transformers'
    RepetitionPenaltyLogitsProcessor and an argmax choose after its prompt and tokens (alone,
    the whole sequence penalised, the model reading its last ``context`` tokens)."""
    torch = pytest.importorskip("torch")
    processors = pytest.importorskip("transformers.generation.logits_process")
    processor = processors.RepetitionPenaltyLogitsProcessor(penalty)

    def alone(prompt: list[int], limit: int) -> list[int]:
        sequence = list(prompt)
        while len(sequence) < len(prompt) + limit:
            window = sequence if context is None else sequence[-context:]
            scores = torch.from_numpy(scripted_logits(window))[None]
            sequence.append(int(processor(torch.tensor([sequence]), scores).argmax()))
        return sequence[len(prompt) :]

    ids, mask = left_padded([p for p, _ in rows])
    sampling = search.Sampling(0.0, repetition_penalty=penalty)
    got = search.generate(Scripted(), ids, [n for _, n in rows], sampling, (), context, mask)
    assert got == [alone(p, n) for p, n in rows]


@settings(deadline=None)  # the first example imports transformers
@given(
    rows=st.lists(st.tuples(prompts, st.integers(0, 12)), min_size=1, max_size=3),
    context=contexts,
    stop=st.lists(st.integers(0, VOCAB - 1), max_size=2, unique=True),
    banned=bans,
)
def test_greedy_with_bans_is_transformers(
    rows: list[tuple[list[int], int]], context: int | None, stop: list[int], banned: search.Bans
) -> None:
    """A left-padded batch under bans, a language model's: each row chooses what transformers'
    SuppressTokens, MinNewTokensLength (its stop tokens, after its prompt), MinLength (the
    prompt counted), NoRepeatNGram and NoBadWords processors and an argmax choose after its
    prompt and tokens (alone, the n-grams counting the whole prompt while the model reads its
    last ``context`` tokens), and ends at a stop token, or where every token is banned (there
    transformers' argmax would choose token 0, banned as all)."""
    torch = pytest.importorskip("torch")
    processors = pytest.importorskip("transformers.generation.logits_process")

    def alone(prompt: list[int], limit: int) -> list[int]:
        suppressed = [t for t in banned.suppressed if t < VOCAB]
        chain = [processors.SuppressTokensLogitsProcessor(suppressed)] if suppressed else []
        if stop:  # without stop tokens there is nothing to ban before min_len
            chain.append(processors.MinNewTokensLengthLogitsProcessor(len(prompt), banned.min_len, stop))
            chain.append(processors.MinLengthLogitsProcessor(banned.min_total, stop))
        if banned.no_repeat_ngram:
            chain.append(processors.NoRepeatNGramLogitsProcessor(banned.no_repeat_ngram))
        if words := [list(s) for s in banned.sequences if max(s) < VOCAB]:  # others never match
            chain.append(processors.NoBadWordsLogitsProcessor(words))
        sequence = list(prompt)
        while len(sequence) < len(prompt) + limit and not (
            len(sequence) > len(prompt) and sequence[-1] in stop
        ):
            window = sequence if context is None else sequence[-context:]
            scores = torch.from_numpy(scripted_logits(window))[None]
            for processor in chain:
                scores = processor(torch.tensor([sequence]), scores)
            if torch.isneginf(scores).all():
                break
            sequence.append(int(scores.argmax()))
        return sequence[len(prompt) :]

    ids, mask = left_padded([p for p, _ in rows])
    sampling = replace(search.GREEDY, bans=banned)
    got = search.generate(Scripted(), ids, [n for _, n in rows], sampling, stop, context, mask)
    assert got == [alone(p, n) for p, n in rows]


@given(
    rows=st.lists(st.tuples(prompts, st.integers(0, 12)), min_size=1, max_size=4),
    context=contexts,
    stop=stops,
    cached=st.booleans(),
)
def test_a_left_padded_batch_generates_each_rows_tokens_alone(
    rows: list[tuple[list[int], int]], context: int | None, stop: list[int], cached: bool
) -> None:
    ids, mask = left_padded([p for p, _ in rows])
    decoder = Scripted() if cached else Uncached()
    got = search.generate(decoder, ids, [n for _, n in rows], search.GREEDY, stop, context, mask)
    assert got == [greedy_alone(p, n, context, stop) for p, n in rows]


@given(
    plan=st.lists(
        st.tuples(
            st.integers(0, 8),
            st.lists(st.tuples(prompts, st.integers(0, 12), samplings), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(1, 14), min_size=12, max_size=12),
    context=contexts,
    stop=stops,
)
def test_rows_joining_and_ending_between_steps_generate_what_they_would_alone(
    plan: list[tuple[int, list[tuple[list[int], int, search.Sampling]]]],
    cuts: list[int],
    context: int | None,
    stop: list[int],
) -> None:
    """Continuous batching: groups of prompts (each with its limit and its sampling, seeded) join
    a running batch at given steps, and the caller ends each row after its own count of tokens."""
    batch, expected, cut, step = search.Batch(stop, context), {}, {}, 0
    while step <= 8 or batch:
        for _, group in [entry for entry in plan if entry[0] == step]:
            ids, mask = left_padded([p for p, _, _ in group])
            keys = batch.join(Scripted(), ids, mask, [n for _, n, _ in group], [s for _, _, s in group])
            for key, (prompt, limit, sampling) in zip(keys, group, strict=True):
                cut[key] = cuts[key % len(cuts)]
                alone = search.generate(Scripted(), np.array([prompt]), limit, [sampling], stop, context)[0]
                expected[key] = alone[: cut[key]]
        if batch:
            stepped = batch.sample()
            for key in stepped:
                cut[key] -= 1
            batch.end(key for key in stepped if cut[key] == 0)
            batch.advance()
        step += 1
    assert {key: batch.finished[key] for key in expected} == expected


def test_row_r_of_a_seeded_batch_draws_as_seed_plus_r_alone() -> None:
    prompt = np.array([[1, 2, 3]] * 3)
    together = search.generate(Scripted(), prompt, 10, search.Sampling(1.5, seed=7))
    alone = [
        search.generate(Scripted(), prompt[:1], 10, search.Sampling(1.5, seed=7 + r))[0] for r in range(3)
    ]
    assert together == alone
    assert len({tuple(row) for row in together}) > 1, "the rows draw independently"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    scores = logits.astype(np.float64)
    shifted = scores - scores.max()
    return shifted - np.log(np.exp(shifted).sum())


def best_by_brute_force(
    start: list[int],
    eos: int,
    max_len: int,
    alpha: float,
    vocab: int,
    forced_eos: bool = False,
    bans: search.Bans = search.NO_BANS,
) -> list[int] | None:
    """Every hypothesis after ``start``: words then [EOS] within max_len words, or max_len words
    unfinished (with ``forced_eos``: words then [EOS] within max_len tokens, [EOS]'s included,
    the last place's never banned), none of whose tokens ``bans`` bans where it stands; the best
    by length-normalised summed log-probability of the words and [EOS] (the first of equal
    scores, shortest first). None: the bans leave no hypothesis."""

    def allowed(sequence: list[int], token: int) -> bool:
        grown, n = [*sequence, token], bans.no_repeat_ngram
        repeats = n and any(grown[i : i + n] == grown[-n:] for i in range(len(grown) - n))
        early = token == eos and len(sequence) - 1 < bans.min_len
        return not (token in bans.suppressed or early or repeats)

    best: tuple[float, list[int]] | None = None
    words = [t for t in range(vocab) if t != eos]
    for length in range(max_len if forced_eos else max_len + 1):
        for hypothesis in itertools.product(words, repeat=length):
            sequence, score = list(start), 0.0
            for word in hypothesis:
                if not allowed(sequence, word):
                    break
                score += log_softmax(scripted_logits(sequence, vocab))[word]
                sequence.append(word)
            else:
                forced = forced_eos and length == max_len - 1
                ends = [score + log_softmax(scripted_logits(sequence, vocab))[eos]]
                ends = ends if forced or allowed(sequence, eos) else []
                ends += [score] if length == max_len and not forced_eos else []
                for end in ends:
                    normalised = end / ((5 + length) / 6) ** alpha  # Wu et al., [EOS] not counted
                    if best is None or normalised > best[0]:
                        best = (normalised, list(hypothesis))
    return None if best is None else best[1]


def test_the_length_penalty_is_wu_et_als() -> None:
    """score / ((5 + length) / 6) ** alpha, as the README says: 7 words at alpha 0.6 divide by 2 ** 0.6."""
    assert search.length_normalised(-6.0, 7, 0.6) == pytest.approx(-6.0 / 2**0.6)
    assert search.length_normalised(-6.0, 1, 0.6) == -6.0
    assert search.length_normalised(-6.0, 19, 0.0) == -6.0


@given(
    vocab=st.integers(2, 4),
    max_len=st.integers(1, 3),
    alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0]),
    start=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    eos=st.integers(0, 3),
    forced_eos=st.booleans(),
    banned=bans,
)
def test_a_beam_that_keeps_every_hypothesis_finds_the_best(
    vocab: int, max_len: int, alpha: float, start: list[int], eos: int, forced_eos: bool, banned: search.Bans
) -> None:
    """``start``: the start token, then any the decoder is given (a target language's code);
    ``forced_eos``: the max_len-th token is [EOS], scored (fairseq's end at the limit). A banned
    candidate scores -inf and the others keep their log-probabilities (transformers' logits
    processors after the log-softmax): the best hypothesis the bans allow wins."""
    start, eos = [t % vocab for t in start], eos % vocab
    banned = search.Bans(
        tuple(t for t in banned.suppressed if t != eos), banned.min_len, banned.no_repeat_ngram
    )
    best = best_by_brute_force(start, eos, max_len, alpha, vocab, forced_eos, banned)
    assume(best is not None)  # some bans leave no hypothesis (never none)
    beam = 2 * vocab ** (max_len + 1)  # wider than the hypotheses: none is dropped, none ends early
    assert (
        search.beam_search(
            Scripted(vocab), start, eos, max_len, beam, search.FairseqBeam(alpha), forced_eos, banned
        )
        == best
    )


@given(
    vocab=st.integers(2, 9),
    max_len=st.integers(1, 8),
    start=st.lists(st.integers(0, 8), min_size=1, max_size=3),
    eos=st.integers(0, 8),
    forced_eos=st.booleans(),
    banned=bans,
)
def test_beam_one_is_greedy(
    vocab: int, max_len: int, start: list[int], eos: int, forced_eos: bool, banned: search.Bans
) -> None:
    """With ``forced_eos``, greedy decoding that reaches the limit ends a token sooner; greedy
    translation (the rows batched, bans through each row's sampling, whose min_len counts the
    tokens chosen, not the given ones) chooses what beam search of one beam chooses."""
    start, eos = [t % vocab for t in start], eos % vocab
    chosen = max_len - 1 if forced_eos else max_len
    given = replace(banned, min_len=max(banned.min_len - (len(start) - 1), 0))
    greedy = search.generate(
        Scripted(vocab), np.array([start]), chosen, replace(search.GREEDY, bans=given), (eos,)
    )[0]
    beam = search.beam_search(Scripted(vocab), start, eos, max_len, 1, VASWANI, forced_eos, banned)
    assert beam == search.strip_stop(greedy, (eos,))
    rows = search.translate(
        lambda _: Scripted(vocab), 2, start, eos, max_len + len(start) - 1, 1, VASWANI, forced_eos, banned
    )
    assert rows == [beam, beam]


@given(
    rows=st.integers(1, 3),
    given_tokens=st.lists(st.integers(0, VOCAB - 1), max_size=3),
    max_len=st.integers(1, 8),
    beam=st.sampled_from([1, 3]),
)
def test_translate_counts_the_given_tokens_in_max_len_and_returns_the_chosen_alone(
    rows: int, given_tokens: list[int], max_len: int, beam: int
) -> None:
    """The decoder holds at most max_len tokens after the first (transformers' max_new_tokens, the
    given ones included); a row's result is what beam search chooses after them, alone."""
    start, eos = [1, *given_tokens], VOCAB  # an id the decoder never emits: every row runs to the end
    decoders: list[Scripted] = []

    def decoder_for(row: int | None) -> Scripted:
        decoders.append(Scripted())
        return decoders[-1]

    got = search.translate(decoder_for, rows, start, eos, max_len, beam, VASWANI)
    chosen = max(max_len - len(given_tokens), 0)
    alone = search.beam_search(Scripted(), start, eos, chosen, beam, VASWANI)
    assert got == [alone] * rows
    assert all(len(row) == chosen for row in got)
    assert len(decoders) == (1 if beam == 1 else rows)
    held = [len(column) for d in decoders for column in d.columns]
    assert max(held, default=0) <= max(1 + max_len, len(start))


@settings(deadline=None)  # the first example imports transformers
@given(
    data=st.data(),
    vocab=st.integers(2, 12),
    rows=st.integers(1, 4),
    length=st.integers(1, 9),
    banned=bans,
    ends=st.lists(st.integers(0, 11), min_size=1, max_size=3, unique=True),
    given=st.integers(1, 9),
)
def test_bans_are_transformers_logits_processors(
    data: st.DataObject,
    vocab: int,
    rows: int,
    length: int,
    banned: search.Bans,
    ends: list[int],
    given: int,
) -> None:
    """Bans.ban sets -inf where transformers' SuppressTokens, MinNewTokensLength, MinLength,
    NoRepeatNGram and NoBadWords logits processors do, on a sequence whose first ``given`` tokens are not
    counted as chosen (a prompt; a translation's decoder start) and whose ends are ``ends`` (an
    eos; a language model's stop tokens)."""
    torch = pytest.importorskip("torch")
    processors = pytest.importorskip("transformers.generation.logits_process")
    ends, given = sorted({t % vocab for t in ends}), min(given, length)
    sequences = data.draw(
        st.lists(
            st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length),
            min_size=rows,
            max_size=rows,
        )
    )
    scores = np.random.default_rng(length).normal(size=(rows, vocab))
    ours = scores.copy()
    for row, sequence in enumerate(sequences):
        banned.ban(ours[row], sequence, length - given, ends)
    ids, theirs = torch.tensor(sequences), torch.tensor(scores)
    chain = [
        processors.SuppressTokensLogitsProcessor([t for t in banned.suppressed if t < vocab]),
        processors.MinNewTokensLengthLogitsProcessor(given, banned.min_len, ends),
        processors.MinLengthLogitsProcessor(banned.min_total, ends),
    ]
    if banned.no_repeat_ngram:
        chain.append(processors.NoRepeatNGramLogitsProcessor(banned.no_repeat_ngram))
    if words := [list(s) for s in banned.sequences if max(s) < vocab]:  # the others never match
        chain.append(processors.NoBadWordsLogitsProcessor(words))
    for processor in chain:
        theirs = processor(ids, theirs)
    np.testing.assert_array_equal(ours, theirs.numpy())


class Recomputed:
    """A search.Decoder over a transformers translator that reads every row's tokens again each
    step (no cache: nothing of generate()'s is reused), from one source's encoder states."""

    def __init__(self, model: Any, source: Any) -> None:
        import torch

        self.torch, self.model, self.rows = torch, model, np.zeros((1, 0), dtype=np.int64)
        with torch.no_grad():
            self.memory = model.get_encoder()(input_ids=source).last_hidden_state

    def step(self, tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        self.rows = np.concatenate([self.rows, tokens], axis=1)
        with self.torch.no_grad():
            memory = self.memory.expand(len(self.rows), -1, -1)
            out = self.model(encoder_outputs=(memory,), decoder_input_ids=self.torch.from_numpy(self.rows))
        return out.logits[:, -1].numpy()

    def reorder(self, rows: np.ndarray) -> None:
        self.rows = self.rows[rows]

    def reset(self) -> None:
        self.rows = np.zeros((1, 0), dtype=np.int64)


@pytest.fixture(scope="module")
def likely_eos_bart() -> Any:
    """A tiny random BART (16 tokens; eos 2, its decoder starting at 0) whose eos is likely, so that
    hypotheses finish at many lengths and each early_stopping tells."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=16,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
        forced_eos_token_id=None,
        init_std=0.5,
    )
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias[0, 2] = 3.0
    return model


@settings(deadline=None, derandomize=True, max_examples=60)
@given(
    source=st.lists(st.integers(3, 15), min_size=1, max_size=6),
    beam=st.integers(2, 4),
    length_penalty=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]),
    early_stopping=st.sampled_from([True, False, "never"]),
    max_len=st.integers(1, 12),
    forced_eos=st.booleans(),
    prefix=st.lists(st.integers(3, 15), max_size=1),
    banned=st.builds(
        search.Bans,
        suppressed=st.lists(st.integers(3, 15), max_size=2).map(tuple),
        min_len=st.integers(0, 3),
        no_repeat_ngram=st.sampled_from([0, 2, 3]),
        sequences=st.lists(st.lists(st.integers(2, 15), min_size=2, max_size=3).map(tuple), max_size=2).map(
            tuple
        ),
    ),
)
def test_transformers_beam_search_is_generates(
    likely_eos_bart: Any,
    source: list[int],
    beam: int,
    length_penalty: float,
    early_stopping: bool | str,
    max_len: int,
    forced_eos: bool,
    prefix: list[int],
    banned: search.Bans,
) -> None:
    """TransformersBeam chooses what transformers' generate() chooses with num_beams,
    length_penalty, early_stopping, max_new_tokens (``max_len``, the forced prefix's included),
    forced_eos_token_id, forced_bos_token_id (a target prefix, unscored) and the bans' processors:
    the same tokens after the prefix, without the eos."""
    import torch

    assume(max_len > len(prefix) and not set(prefix) & set(banned.suppressed))
    ids = torch.tensor([source])
    scoring = search.TransformersBeam(length_penalty, early_stopping)  # type: ignore[arg-type]
    ours = search.translate(
        lambda _: Recomputed(likely_eos_bart, ids),
        1,
        [0, *prefix],
        2,
        max_len,
        beam,
        scoring,
        forced_eos,
        banned,
    )[0]
    theirs = likely_eos_bart.generate(
        ids,
        do_sample=False,
        num_beams=beam,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        max_new_tokens=max_len,
        forced_eos_token_id=2 if forced_eos else None,
        forced_bos_token_id=prefix[0] if prefix else None,
        suppress_tokens=list(banned.suppressed) or None,
        min_new_tokens=banned.min_len,
        no_repeat_ngram_size=banned.no_repeat_ngram,
        bad_words_ids=[list(s) for s in banned.sequences] or None,
    )[0, 1 + len(prefix) :].tolist()
    assert ours == search.strip_stop(theirs, (2,))


def test_beam_search_ends_at_once_on_eos_first_and_never_passes_max_len() -> None:
    start = [next(t for t in range(50) if scripted_logits([t]).argmax() == 2)]
    assert search.beam_search(Scripted(), start, 2, 5, 4, VASWANI) == []  # [EOS] is the likeliest first
    never = search.beam_search(Scripted(), start, VOCAB, 5, 4, VASWANI)  # an id the decoder never emits
    assert len(never) == 5


def draws(logits: Sequence[float], options: dict[str, Any], n: int = 4000) -> np.ndarray:
    """Each token's share of ``n`` seeded draws with the sampling ``options``."""
    rows = np.tile(np.array(logits, dtype=np.float32), (n, 1))
    tokens = search.sample_next(rows, rng=np.random.default_rng(0), **options)
    return np.bincount(tokens, minlength=len(logits)) / n


@pytest.mark.parametrize(
    ("logits", "options", "expected"),
    [
        # top_k keeps the k largest logits and any equal to the k-th
        ([1, 1, 1, 0], {"top_k": 1}, [1 / 3, 1 / 3, 1 / 3, 0]),
        ([3, 2, 1, 0], {"top_k": 9}, np.exp([3, 2, 1, 0]) / np.exp([3, 2, 1, 0]).sum()),
        # top_p keeps tokens, likeliest first, up to the one that reaches p
        (np.log([0.4, 0.3, 0.3]), {"top_p": 0.5}, [4 / 7, 3 / 7, 0]),
        (np.log([0.25, 0.25, 0.5]), {"top_p": 0.5}, [0, 0, 1]),
        (np.log([0.2, 0.3, 0.5]), {"top_p": 0.6}, [0, 3 / 8, 5 / 8]),
        (np.log([0.1, 0.2, 0.7]), {"top_p": 1e-9}, [0, 0, 1]),
        (np.log([0.1, 0.2, 0.7]), {"top_p": 1.0}, [0.1, 0.2, 0.7]),
        # temperature: below 1e-5 the argmax (the lowest id of equal logits), huge ones uniform
        ([0, 3, 3, 1], {"temperature": 1e-6}, [0, 1, 0, 0]),
        ([0, 3, -np.inf, 1], {"temperature": 1e12}, [1 / 3, 1 / 3, 0, 1 / 3]),
        ([0, 3, -np.inf, 1], {"temperature": 1e-4, "top_k": 3}, [0, 1, 0, 0]),
        # min_p keeps tokens at least min_p times as likely as the likeliest, after the temperature
        (np.log([0.5, 0.3, 0.15, 0.05]), {"min_p": 0.25}, np.array([0.5, 0.3, 0.15, 0]) / 0.95),
        ([2, 1, 0], {"temperature": 0.5, "min_p": 0.1}, np.exp([4, 2, -np.inf]) / np.exp([4, 2]).sum()),
        (np.log([0.1, 0.2, 0.7]), {"min_p": 0.0}, [0.1, 0.2, 0.7]),
        (np.log([0.1, 0.2, 0.7]), {"min_p": 1.0}, [0, 0, 1]),
        # top-p, then min-p: 0.4, 0.3 and 0.2 reach 0.8, and of those 0.2 < 0.6 * 0.4
        (np.log([0.4, 0.3, 0.2, 0.1]), {"top_p": 0.8, "min_p": 0.6}, [4 / 7, 3 / 7, 0, 0]),
    ],
)
def test_sampling_draws_as_the_manifest_says(
    logits: Sequence[float], options: dict[str, Any], expected: Sequence[float]
) -> None:
    shares = draws(logits, options)
    assert np.abs(shares - np.asarray(expected)).max() < 0.03
    assert ((shares > 0) == (np.asarray(expected) > 0)).all()


@settings(deadline=None)  # the first example imports transformers
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.3, 1.0, 2.5]),
    top_k=st.sampled_from([None, 1, 3, 12]),
    top_p=st.sampled_from([None, 0.3, 0.9, 1.0]),
    min_p=st.sampled_from([None, 0.0, 0.05, 0.3, 1.0]),
)
def test_sampling_draws_from_what_transformers_warpers_keep(
    seed: int, temperature: float, top_k: int | None, top_p: float | None, min_p: float | None
) -> None:
    """The runtime's sampling distribution is the softmax of transformers' Temperature, TopK, TopP
    and MinP warpers' scores, applied in generate()'s order (float32 there, float64 here)."""
    torch = pytest.importorskip("torch")
    processors = pytest.importorskip("transformers.generation.logits_process")
    logits = (3 * np.random.default_rng(seed).normal(size=(4, 12))).astype(np.float32)
    scores = processors.TemperatureLogitsWarper(temperature)(None, torch.from_numpy(logits))
    if top_k is not None:
        scores = processors.TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1:
        scores = processors.TopPLogitsWarper(top_p)(None, scores)
    if min_p is not None:
        scores = processors.MinPLogitsWarper(min_p)(None, scores)
    theirs = torch.softmax(scores, dim=-1).numpy()
    ours = search.probabilities(logits, temperature, top_k, top_p, min_p)
    assert ((ours > 0) == (theirs > 0)).all()
    assert np.abs(ours - theirs).max() < 1e-5


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_whose_every_token_is_banned_ends_there_and_the_others_go_on(temperature: float) -> None:
    """With no_repeat_ngram_size 1, a row holding every token of the vocabulary has none left:
    it ends without a token (not the argmax of -inf everywhere, nor a draw from NaNs), and the
    row beside it generates what it would alone, until it too has used every token."""
    bans = search.Bans(no_repeat_ngram=1)
    sampling = search.Sampling(temperature, seed=0, bans=bans)
    ids, mask = left_padded([list(range(VOCAB)), [0]])
    full, short = search.generate(Scripted(), ids, 20, sampling, (), None, mask)
    assert full == []
    assert sorted(short) == list(range(1, VOCAB))  # each token the prompt lacks, once
    alone = search.generate(Scripted(), np.array([[0]]), 20, replace(sampling, seed=1))
    assert short == alone[0]


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_runtime_batches_prompts_around_the_context_as_each_alone(
    char_bundle: Path, use_cache: bool
) -> None:
    """Prompts of 1 token, one short of the context (64), at it, past it and far past it, with
    limits of 0 and more, greedy and seeded: together as alone, and the greedy row at the context
    as a plain loop over the full graph reading the last 64 tokens."""
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    context = model.generation.context_length
    assert model.tokenizer is not None
    text = model.tokenizer.encode("First Citizen:\nBefore we proceed any further, hear me speak. " * 2).ids
    prompts = [text[:1], text[: context - 1], text[:context], text[: context + 1], text[: context + 30]]
    limits = [5, 3, 0, 6, 4]
    samplings = [search.Sampling(1.0, 5, 0.9, seed=3), search.GREEDY, search.GREEDY, search.GREEDY]
    samplings.append(search.Sampling(2.0, None, None, seed=11))
    together = model.generate_prompts(prompts, limits, samplings, use_cache=use_cache)
    alone = [
        model.generate_prompts([p], [n], [s], use_cache=use_cache)[0]
        for p, n, s in zip(prompts, limits, samplings, strict=True)
    ]
    assert together == alone
    assert [len(row) for row in together] == limits
    sequence = list(prompts[3])
    for _ in range(limits[3]):
        sequence.append(int(model.logits(np.array([sequence[-context:]]))[0, -1].argmax()))
    assert together[3] == sequence[len(prompts[3]) :]


def test_a_prompt_that_ends_in_padding_is_refused(char_bundle: Path) -> None:
    """Generation continues each row from its last column: a right-padded mask would continue
    from padding (other tokens than the prompt alone gives), so it is an InputError."""
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    prompt = [18, 27, 3, 9]
    with pytest.raises(InputError, match="left-padded"):
        model.generate(np.array([[*prompt, 0, 0]]), 3, temperature=0, attention_mask=[[1, 1, 1, 1, 0, 0]])
    alone = model.generate(np.array([prompt]), 3, temperature=0)[0, 4:]
    gapped = model.generate(np.array([[18, 0, 27, 3, 9]]), 3, temperature=0, attention_mask=[[1, 0, 1, 1, 1]])
    assert gapped[0, 5:].tolist() == alone.tolist()  # padding inside a prompt is only masked
