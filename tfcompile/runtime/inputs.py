"""Every argument a runtime call takes, checked before onnxruntime or the tokenizer sees it: a bad
one raises InputError naming the argument, what it must be and what it was."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfcompile.images import ImageLike
from tfcompile.manifest import REPETITION_PENALTIES
from tfcompile.runtime.errors import InputError

Text = str | tuple[str, str]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def array(name: str, value: Any) -> np.ndarray:
    """``value`` as a numpy array; ragged nested lists and other odd shapes are an InputError."""
    try:
        out = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise InputError(
            f"{name} must be a rectangular array (equal-length rows), got {_shown(value)}: {e}"
        ) from None
    if out.dtype == object:
        raise InputError(f"{name} must hold numbers in equal-length rows, got {_shown(value)}")
    return out


def floats(name: str, value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` in the graph's float type ``dtype``: floats that stay finite in it (1e300 is
    finite in float64, not in float32)."""
    if not np.issubdtype(value.dtype, np.floating):
        raise InputError(f"{name} must hold finite floats, got dtype {value.dtype}")
    with np.errstate(over="ignore"):
        cast = value.astype(dtype, copy=False)
    if not np.isfinite(cast).all():
        raise InputError(f"{name} must hold finite floats within {dtype}'s range")
    return cast


def token_ids(value: Any, vocab_size: int, max_len: int | None, name: str = "input_ids") -> np.ndarray:
    """An int64 (batch, seq) array of ids in [0, vocab_size), 1 <= seq <= max_len (None: any)."""
    ids = array(name, value)
    if not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise InputError(f"{name} must have shape (batch, seq), got shape {ids.shape}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InputError(f"{name} must not be empty, got shape {ids.shape}")
    if max_len is not None and ids.shape[1] > max_len:
        raise InputError(f"{name} has {ids.shape[1]} tokens, more than the model's context of {max_len}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size})")
    return ids.astype(np.int64, copy=False)


def id_rows(name: str, value: Any, vocab_size: int) -> list[list[int]]:
    """Rows of token ids, of any lengths (a 2-D integer array, or sequences of ints), each id in
    [0, vocab_size)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 2 or not np.issubdtype(value.dtype, np.integer):
            raise InputError(
                f"{name} must be rows of integer token ids, got an array {value.dtype} {value.shape}"
            )
    elif not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise InputError(f"{name} must be rows of token ids, got {_shown(value)}")
    out = []
    for i, row in enumerate(value):
        if not isinstance(row, Sequence | np.ndarray) or isinstance(row, str | bytes):
            raise InputError(f"{name}[{i}] must be a row of token ids, got {_shown(row)}")
        ids = np.asarray(row) if len(row) else np.zeros(0, np.int64)  # checked at numpy's speed
        if (
            ids.ndim != 1
            or ids.dtype.kind not in "iu"
            or (ids.size and not 0 <= ids.min() <= ids.max() < vocab_size)
        ):
            j, token = next((j, t) for j, t in enumerate(row) if not _is_id(t, vocab_size))
            shown = _shown(token.item() if isinstance(token, np.generic) else token)
            raise InputError(f"{name}[{i}][{j}] is {shown}, not a token id in [0, {vocab_size})")
        out.append(ids.tolist())
    return out


def _is_id(token: Any, vocab_size: int) -> bool:
    return (
        isinstance(token, int | np.integer) and not isinstance(token, bool) and bool(0 <= token < vocab_size)
    )


def flags(name: str, value: Any, shape: tuple[int, ...], meaning: str) -> np.ndarray:
    """A 0/1 integer array of ``shape``; ``meaning`` says what 0 and 1 stand for."""
    out = array(name, value)
    if out.shape != shape:
        raise InputError(f"{name} has shape {out.shape}, but it must be {shape}")
    integer = np.issubdtype(out.dtype, np.integer) or out.dtype == np.bool_
    if not integer or not np.isin(out, (0, 1)).all():
        raise InputError(f"{name} must hold {meaning} only")
    return out.astype(np.int64, copy=False)


def count(name: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number >= minimum, and <= maximum where given (a bool or 2.5 is not one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InputError(f"{name} must be >= {minimum} and a whole number, got {_shown(value)}")
    if maximum is not None and int(value) > maximum:
        raise InputError(f"{name} must be at most {maximum:,}, got {_shown(value)}")
    return int(value)


def optional_count(name: str, value: Any, minimum: int = 1) -> int | None:
    return None if value is None else count(name, value, minimum)


def number(name: str, value: Any, low: float, high: float = math.inf, low_open: bool = False) -> float:
    """A finite real in [low, high] ((low, high] when ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {_shown(value)}")
    value = float(value)
    if value < low or (low_open and value == low) or value > high:
        if math.isinf(high):
            bounds = f"{'>' if low_open else '>='} {low:g}"
        else:
            bounds = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise InputError(f"{name} must be {bounds}, got {value!r}")
    return value


def sampling(
    temperature: Any, top_k: Any, top_p: Any, repetition_penalty: Any, min_p: Any
) -> tuple[float, int | None, float | None, float, float | None]:
    """Temperature >= 0 (0 is greedy), top_k >= 1, top_p in (0, 1], a repetition penalty within
    REPETITION_PENALTIES, min_p in [0, 1]."""
    return (
        number("temperature", temperature, 0.0),
        optional_count("top_k", top_k, 1),
        None if top_p is None else number("top_p", top_p, 0.0, 1.0, low_open=True),
        number("repetition_penalty", repetition_penalty, *REPETITION_PENALTIES),
        None if min_p is None else number("min_p", min_p, 0.0, 1.0),
    )


def seed(value: Any) -> int | None:
    return None if value is None else count("seed", value, 0)


def switch(name: str, value: Any) -> bool:
    """True or False (numpy's too), not any value Python reads as true or false."""
    if not isinstance(value, bool | np.bool_):
        raise InputError(f"{name} must be True or False, got {_shown(value)}")
    return bool(value)


def images(name: str, value: Any) -> list[ImageLike]:
    """One image (a path, a file's bytes, or an (H, W) or (H, W, C) array), a 4-D array of
    images, or a non-empty list of them -> the images; each array a rectangular array of numbers."""
    if isinstance(value, np.ndarray):
        items: list[Any] = [value] if value.ndim < 4 else list(value)
    elif isinstance(value, str | Path | bytes):
        items = [value]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise InputError(f"{name} takes image paths, bytes or arrays, got {_shown(value)}")
    if not items:
        raise InputError(f"{name} needs at least one image")
    return [
        item if isinstance(item, str | Path | bytes) else array(f"{name}[{i}]", item)
        for i, item in enumerate(items)
    ]


def texts(name: str, value: Any, pairs: bool = False) -> list[Text]:
    """A string, or a non-empty list of strings (and, with ``pairs``, of (first, second) pairs)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Sequence) or isinstance(value, bytes) or len(value) == 0:
        what = "strings or (first, second) string pairs" if pairs else "strings"
        raise InputError(f"{name} takes a string or a non-empty list of {what}, got {_shown(value)}")
    out: list[Text] = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif (
            pairs
            and isinstance(item, tuple | list)
            and len(item) == 2
            and all(isinstance(t, str) for t in item)
        ):
            out.append((item[0], item[1]))
        else:
            what = "strings or (first, second) string pairs" if pairs else "strings"
            raise InputError(f"{name} takes {what}, got {_shown(item)}")
    return out
