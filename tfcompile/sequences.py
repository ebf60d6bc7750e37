"""What training and serving share about token sequences, in numpy and plain Python (no torch and
no onnxruntime, so that both sides import it): the special tokens and padding rows into a batch."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # an encoder tokenizer's ids 0..4, in this order
BOS, EOS = "[BOS]", "[EOS]"
SEQ2SEQ_TOKENS = (PAD, UNK, BOS, EOS)  # a translation tokenizer's ids 0..3: targets are [BOS] ... [EOS]
CAUSAL_LM_TOKENS = (PAD, UNK, EOS)  # a causal LM's reserved ids 0..2: [EOS] ends a document
# What each special token is for, as a bundle's manifest names them.
SPECIAL_ROLES = {PAD: "pad", UNK: "unk", BOS: "bos", EOS: "eos", CLS: "cls", SEP: "sep", MASK: "mask"}


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> np.ndarray:
    """Rows of ids -> (len(rows), longest) int64, each row left-aligned and filled out with
    ``value``; built in one scatter rather than an assignment per row."""
    lengths = np.array([len(row) for row in rows])
    out = np.full((len(rows), int(lengths.max())), value, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.fromiter(chain.from_iterable(rows), dtype=np.int64)
    return out


def left_pad(a: np.ndarray, size: int, axis: int) -> np.ndarray:
    """``a`` with zeros before its entries along ``axis``, to ``size`` there (padding: masked, and
    the id 0 is in every vocabulary)."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (size - a.shape[axis], 0)
    return np.pad(a, widths)


def length_groups(lengths: Sequence[int], waste: float = 1.25, slack: int = 32) -> list[list[int]]:
    """Row indices grouped by length so that each group, padded to its longest row, holds at most
    ``waste`` times its real tokens plus ``slack`` (a run's fixed cost is worth some padding): a
    batch of mixed lengths run as a few batches instead of one mostly padding. Rows keep their
    order within a group; groups go shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:
        if groups and lengths[i] * (len(groups[-1]) + 1) <= waste * (real + lengths[i]) + slack:
            groups[-1].append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return [sorted(group) for group in groups]


def source_row(
    ids: Sequence[int], length: int, prefix: Sequence[int], suffix: Sequence[int], unk: int
) -> list[int]:
    """A translation source as the encoder reads it: ``prefix`` (the special tokens every source
    starts with, BART's <s>), its ids cut so that the row holds at most ``length`` tokens, then
    ``suffix`` (those it ends with, T5's </s>); an empty source is the unk token."""
    return [*prefix, *(list(ids[: length - len(prefix) - len(suffix)]) or [unk]), *suffix]


def tidy(text: str) -> str:
    """A decoded translation without leading and trailing ASCII whitespace (as the manifest states,
    so that a client in any language strips the same characters)."""
    return text.strip(" \t\n\r\f\v")


# The longest sequence a parity check runs (export's against PyTorch, optimize's against the
# source graph): a longer context is checked up to it. The full-context case
# holds (batch, heads, T, T) scores and the step graphs run one forward per token, so a context of
# 4,096 took 100 s and 1.5 GB on a CPU, and one of 2^24 more memory than any machine has; the
# graph computes later positions as it does these.
LONGEST = 1024


def longest(max_seq_len: int) -> int:
    """The length of a check's longest sequence: the full context, up to LONGEST."""
    return min(max_seq_len, LONGEST)
