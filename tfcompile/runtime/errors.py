"""Runtime errors: each names the bundle file or the input at fault and what to do."""

from tfcompile.errors import BundleError, InputError, UserError


class OnnxRuntimeMissing(UserError, ImportError):
    """Neither onnxruntime build is installed (tfcompile's `cpu` and `gpu` extras provide one)."""


__all__ = ["BundleError", "InputError", "OnnxRuntimeMissing"]
