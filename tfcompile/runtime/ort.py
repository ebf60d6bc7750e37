"""onnxruntime, from whichever build is installed.

The CPU build (`onnxruntime`) and the CUDA build (`onnxruntime-gpu`) install the same module and
cannot live side by side, so tfcompile's base install names neither: its extras `cpu` and `gpu`
pick one. Every use of onnxruntime in tfcompile imports it from here.
"""

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tfcompile.errors import first_line
from tfcompile.runtime.errors import BundleError, InputError, OnnxRuntimeMissing

try:
    import onnxruntime as ort
except ImportError as error:
    raise OnnxRuntimeMissing(
        "onnxruntime is not installed; tfcompile needs it to export, verify and serve bundles. "
        "Install one build: pip install 'tfcompile[cpu]' for the CPU, or 'tfcompile[gpu]' for "
        "onnxruntime-gpu (CUDA)"
    ) from error

FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def run(session: Any, feed: dict[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
    """``session.run`` for graphs of any precision: float inputs are cast to the graph's float
    type (an fp16 bundle takes float16), float outputs come back as float32."""
    types = {i.name: FLOAT_TYPES.get(i.type) for i in session.get_inputs()}
    cast = {
        name: value.astype(types[name], copy=False)
        if types.get(name) is not None and np.issubdtype(value.dtype, np.floating)
        else value
        for name, value in feed.items()
    }
    rows = {value.shape[0] for value in feed.values() if value.ndim}
    with failures(rows == {1}):
        results = session.run(None if outputs is None else list(outputs), cast)
    return [r.astype(np.float32) if r.dtype == np.float16 else r for r in results]


@contextlib.contextmanager
def failures(one_row: bool = False) -> Iterator[None]:
    """onnxruntime failing on inputs that the runtime checked against the manifest: out of memory
    is the batch's size (InputError), or with ``one_row`` (a batch of one) the input's length or
    the graph's own needs; anything else means the graph is not what its manifest says, a
    BundleError, not onnxruntime's own exception."""
    try:
        yield
    except Exception as e:  # onnxruntime's Fail, InvalidArgument, RuntimeException, ...
        first = first_line(e)
        if "alloc" in first.lower():
            advice = (
                "a shorter input may fit; else the graph needs more memory than this machine has"
                if one_row
                else "send a smaller batch"
            )
            raise InputError(f"onnxruntime ran out of memory ({first}): {advice}") from None
        raise BundleError(
            f"onnxruntime failed on inputs the bundle's manifest allows (its graph does not do what "
            f"the manifest says): {first}"
        ) from None


__all__ = ["FLOAT_TYPES", "failures", "ort", "run"]
