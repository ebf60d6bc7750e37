"""Corpora, tokenizers (the `tokenizers` library), on-disk token caches and batching."""

from tfcompile.data.corpus import (
    DataError,
    TokenizedCorpus,
    check_fits_context,
    lm_batch,
    prepare_corpus,
    read_corpus,
    text_lines,
)
from tfcompile.data.tokenizer import encode, load_tokenizer, train_tokenizer

__all__ = [
    "DataError",
    "TokenizedCorpus",
    "check_fits_context",
    "encode",
    "lm_batch",
    "load_tokenizer",
    "prepare_corpus",
    "read_corpus",
    "text_lines",
    "train_tokenizer",
]
