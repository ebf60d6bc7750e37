"""onnxruntime, from whichever build is installed.

The CPU build (`onnxruntime`) and the CUDA build (`onnxruntime-gpu`) install the same module and
cannot live side by side, so tfcompile's base install names neither: its extras `cpu` and `gpu`
pick one. Every use of onnxruntime in tfcompile imports it from here.
"""

from tfcompile.runtime.errors import OnnxRuntimeMissing

try:
    import onnxruntime as ort
except ImportError as error:
    raise OnnxRuntimeMissing(
        "onnxruntime is not installed; tfcompile needs it to export, verify and serve bundles. "
        "Install one build: pip install 'tfcompile[cpu]' for the CPU, or 'tfcompile[gpu]' for "
        "onnxruntime-gpu (CUDA)"
    ) from error

__all__ = ["ort"]
