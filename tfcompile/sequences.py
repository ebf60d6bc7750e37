"""What training and serving share about token sequences, in numpy and plain Python (no torch and
no onnxruntime, so that both sides import it): padding rows into a batch, and the length penalty
that ranks finished beam-search hypotheses."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> np.ndarray:
    """Rows of ids -> (len(rows), longest) int64, each row left-aligned and filled out with
    ``value``; built in one scatter rather than an assignment per row."""
    lengths = np.array([len(row) for row in rows])
    out = np.full((len(rows), int(lengths.max())), value, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.fromiter(chain.from_iterable(rows), dtype=np.int64)
    return out


def length_normalised(log_prob: float, length: int, alpha: float) -> float:
    """A finished hypothesis's score: log p / ((5 + length) / 6) ** alpha (Wu et al. 2016, as in
    Vaswani et al. 2017 with alpha 0.6)."""
    return log_prob / ((5 + length) / 6) ** alpha
