"""Tokenizers, all in the `tokenizers` library's format, so that a run's ``tokenizer.json`` is what
the onnxruntime side loads too: ``char`` (one token per character seen in the corpus), ``bpe``
(byte-level BPE trained on the training text) and ``wordpiece`` (BERT's).

Encoder tasks add BERT's special tokens at ids 0-4; a classifier frames a sentence and a pair as
its tokenizer's post-processor does where that begins them with the classification token and
ends them with the separator (an imported RoBERTa's ``<s> A </s></s> B </s>``), else with BERT's
template, ``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]`` with segment ids 0 and 1.
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfcompile.errors import DataWarning
from tfcompile.sequences import UNK
from tfcompile.spec.schema import BpeTokenizer, CharTokenizer, WordPieceTokenizer


def train_tokenizer(
    spec: CharTokenizer | BpeTokenizer | WordPieceTokenizer,
    texts: Sequence[str],
    specials: Sequence[str] = (),
) -> Tokenizer:
    """Fit a tokenizer on ``texts`` (lines or documents); ``specials`` take the first ids."""
    specials = list(specials)
    if isinstance(spec, CharTokenizer):
        chars = sorted(set().union(*map(set, texts)))
        vocab = {token: i for i, token in enumerate([*specials, *chars])}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK if UNK in specials else None))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        tokenizer.add_special_tokens(specials)
        return tokenizer
    if isinstance(spec, WordPieceTokenizer):
        return _wordpiece(spec, texts, specials or [UNK])
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=specials,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def _wordpiece(spec: WordPieceTokenizer, texts: Sequence[str], specials: list[str]) -> Tokenizer:
    """BERT's WordPiece, its vocabulary learned by the library's trainer. That trainer numbers the
    '##' continuation of each character in a hash map's order, which changes from run to run, and
    breaks ties between merges by those numbers (tokenizers issue #1794): the same texts gave
    another vocabulary. A first pass, without merges, finds those pieces; the second takes them,
    sorted, after ``specials`` as if special, so that its numbering is fixed; the tokenizer is then
    built on the vocabulary learned, with only ``specials`` special."""

    def learned(vocab_size: int, first: list[str]) -> dict[str, int]:
        tokenizer = _bert_wordpiece(spec.lowercase)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=spec.min_frequency, special_tokens=first, show_progress=False
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return tokenizer.get_vocab(with_added_tokens=False)

    pieces = sorted(token for token in learned(0, specials) if token.startswith(WORDPIECE_PREFIX))
    tokenizer = _bert_wordpiece(spec.lowercase, learned(spec.vocab_size, [*specials, *pieces]))
    tokenizer.add_special_tokens(specials)
    if (size := tokenizer.get_vocab_size()) > spec.vocab_size:
        warnings.warn(
            f"data.tokenizer.vocab_size {spec.vocab_size:,} is below what WordPiece keeps of any corpus: "
            f"its special tokens, every character and each one's '##' continuation, {size:,} tokens "
            f"here, the vocabulary's size; a larger vocab_size would learn whole words too",
            DataWarning,
            stacklevel=3,
        )
    return tokenizer


WORDPIECE_PREFIX = "##"


def _bert_wordpiece(lowercase: bool, vocab: dict[str, int] | None = None) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=UNK, continuing_subword_prefix=WORDPIECE_PREFIX))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(WORDPIECE_PREFIX)
    return tokenizer


def frame_sentences(tokenizer: Tokenizer, cls: int, sep: int, max_length: int) -> None:
    """Frame a sentence and a sentence pair for a classifier, which reads the state of the first
    token: a tokenizer whose post-processor begins both with ``cls`` and ends them with ``sep``
    keeps it, and the segment ids it gives (BERT's [CLS] A [SEP] B [SEP], segments 0 and 1;
    RoBERTa's <s> A </s></s> B </s>, all segment 0), so that training encodes as the exported
    bundle's tokenizer then does; any other (none: tfcompile's own tokenizers, a masked-LM run's)
    gets BERT's template with these tokens, ``cls A sep`` (segment 0) and ``cls A sep B sep``
    (B's part segment 1). Truncated to ``max_length`` tokens (the longer sentence of a pair
    first); padding is left to the batching code."""
    tokenizer.no_padding()
    empty = tokenizer.encode("").ids, tokenizer.encode("", "").ids  # the post-processor's tokens alone
    if not all(ids[:1] == [cls] and ids[-1:] == [sep] for ids in empty):
        first, last = tokenizer.id_to_token(cls), tokenizer.id_to_token(sep)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=[f"{first}:0", "$A:0", f"{last}:0"],
            pair=[f"{first}:0", "$A:0", f"{last}:0", "$B:1", f"{last}:1"],
            special_tokens=[(first, cls), (last, sep)],
        )
    tokenizer.enable_truncation(max_length)


# Characters encoded at a time: the library's encodings (offsets, masks, token strings) take about
# 100 bytes a token, so a corpus encoded at once took over 100 times its size in memory (a text8-
# like corpus, 100 MB on one line: 10 GB).
ENCODE_CHARS = 1 << 16
PIECES = 16  # a batch's pieces, which the library encodes in parallel
# Where a text is cut into the pieces encoded apart: before a space between two other characters,
# where every tokenizer tfcompile trains, and the byte-level BPE (GPT-2's), WordPiece and splitting
# Metaspace ones it imports, start a pre-token (a Metaspace piece that starts with a space gets no
# second one), so that the ids are those of the whole text. A Metaspace that does not split, or a
# normalizer that prepends a word start (LLaMA tokenizers), gives a piece one more word start: a
# token more every ENCODE_CHARS / PIECES characters. Failing a space (text without spaces, such as
# Chinese), after a line break between two other characters, which holds for all but Metaspace.
# Cut at every line end, an indented line or a run of blank lines lost GPT-2's tokens for line
# breaks with what follows ("\n   ", "\n\n"), and Metaspace began each line with a word start.
SPACE_CUT = re.compile(r"(?<=\S)(?= \S)")
CUT = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")  # a SPACE_CUT or a line break's


def encode(tokenizer: Tokenizer, text: str, special_tokens: bool = False) -> np.ndarray:
    """Token ids (int64) of ``text``, encoded about ENCODE_CHARS characters at a time, in pieces
    cut where the ids do not change (SPACE_CUT); a character the vocabulary lacks is a ValueError
    naming it. ``special_tokens``: what the tokenizer's post-processor adds (a LLaMA tokenizer's
    <s>), to each piece: for a prompt, which is one; a corpus is a stream of text without them."""
    chunks = [np.zeros(0, dtype=np.int64)]
    try:
        for batch in _batches(text):
            encodings = tokenizer.encode_batch(batch, add_special_tokens=special_tokens)
            chunks.append(np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64))
    except Exception as e:
        unknown = sorted({c for c in text if tokenizer.token_to_id(c) is None})
        raise ValueError(
            f"the text has characters outside the tokenizer's vocabulary: {unknown[:10]!r}"
        ) from e
    return np.concatenate(chunks)


def _batches(text: str) -> Iterator[list[str]]:
    """``text`` as lists of pieces of about ENCODE_CHARS characters in all; the pieces joined are
    ``text``."""
    batch: list[str] = []
    size = 0
    for piece in _pieces(text):
        batch.append(piece)
        size += len(piece)
        if size >= ENCODE_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _pieces(text: str) -> Iterator[str]:
    """``text`` cut past each ENCODE_CHARS / PIECES characters: at a SPACE_CUT within as many more,
    else at the first CUT (a text without one stays whole)."""
    size = ENCODE_CHARS // PIECES
    start = 0
    while len(text) - start > size:
        at = start + size
        cut = SPACE_CUT.search(text, at, at + size) or CUT.search(text, at)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:]


def load_tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))
