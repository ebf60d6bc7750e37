"""Tokenizers, all in the `tokenizers` library's format, so that a run's ``tokenizer.json`` is what
the onnxruntime side loads too: ``char`` (one token per character seen in the corpus), ``bpe``
(byte-level BPE trained on the training text) and ``wordpiece`` (BERT's).

Encoder tasks add BERT's special tokens at ids 0-4 and a template that wraps a sentence as
``[CLS] A [SEP]`` and a pair as ``[CLS] A [SEP] B [SEP]`` with segment ids 0 and 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfcompile.sequences import CLS, SEP, SPECIAL_TOKENS, UNK
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
        tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=spec.lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer: trainers.Trainer = trainers.WordPieceTrainer(
            vocab_size=spec.vocab_size,
            min_frequency=spec.min_frequency,
            special_tokens=specials or [UNK],
            show_progress=False,
        )
    else:
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


def add_sentence_template(tokenizer: Tokenizer, max_length: int) -> None:
    """[CLS] A [SEP] (segment 0) and [CLS] A [SEP] B [SEP] (B's part segment 1), truncated to
    ``max_length`` (the longer sentence first). Padding is left to the batching code."""
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(f"the tokenizer lacks the special tokens {missing}: it was not made for an encoder")
    cls, sep = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls), (SEP, sep)],
    )
    tokenizer.enable_truncation(max_length)


# Lines encoded at a time: the library's encodings (offsets, masks, token strings) take about 100
# bytes a token, so a corpus encoded at once took over 100 times its size in memory.
ENCODE_LINES = 4096


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text``, encoded ENCODE_LINES lines at a time; a character the vocabulary
    lacks is a ValueError naming it."""
    lines = text.splitlines(keepends=True)
    ids: list[int] = []
    try:
        for start in range(0, len(lines), ENCODE_LINES):
            ids += [i for e in tokenizer.encode_batch(lines[start : start + ENCODE_LINES]) for i in e.ids]
    except Exception as e:
        unknown = sorted({c for c in text if tokenizer.token_to_id(c) is None})
        raise ValueError(
            f"the text has characters outside the tokenizer's vocabulary: {unknown[:10]!r}"
        ) from e
    return ids


def load_tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))
