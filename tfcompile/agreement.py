"""How two runs of a graph are compared, in numpy alone: export's check of onnxruntime against
PyTorch and optimize's of a transformed graph against the graph it came from."""

from __future__ import annotations

import numpy as np


def largest_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b|, infinite where one side holds a NaN or an infinity that the other does not:
    NaN compares false, so a running max() would skip it and a graph giving NaN would pass. The
    same NaN or infinity on both sides agrees."""
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):  # inf - inf, masked out by ``same`` or counted as NaN
        difference = np.where(same, 0.0, np.abs(a - b))
    return float(np.nan_to_num(difference, nan=np.inf, posinf=np.inf).max(initial=0.0))


def finite_scale(a: np.ndarray) -> float:
    """max |a| over its finite values (a NaN there is a difference, not a scale)."""
    return float(np.abs(a[np.isfinite(a)]).max(initial=0.0))
