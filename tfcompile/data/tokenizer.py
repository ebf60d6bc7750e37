"""Tokenizers, all in the `tokenizers` library's format, so that a run's ``tokenizer.json`` is what
the onnxruntime side loads too: ``char`` (one token per character seen in the corpus) and ``bpe``
(byte-level BPE trained on the training text)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from tfcompile.spec.schema import BpeTokenizer, CharTokenizer


def train_tokenizer(spec: CharTokenizer | BpeTokenizer, text: str) -> Tokenizer:
    if isinstance(spec, CharTokenizer):
        vocab = {c: i for i, c in enumerate(sorted(set(text)))}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        return tokenizer
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text``; a character the vocabulary lacks is a ValueError naming it."""
    try:
        return [i for e in tokenizer.encode_batch(text.splitlines(keepends=True)) for i in e.ids]
    except Exception as e:
        unknown = sorted({c for c in text if tokenizer.token_to_id(c) is None})
        raise ValueError(
            f"the text has characters outside the tokenizer's vocabulary: {unknown[:10]!r}"
        ) from e


def load_tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))
