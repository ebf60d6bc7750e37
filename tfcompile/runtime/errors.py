"""Runtime errors: each names the bundle file or the input at fault and what to do."""

from tfcompile.errors import UserError


class BundleError(UserError):
    """A bundle that cannot be trusted or read: missing files, changed files, a newer format."""


class InputError(UserError, ValueError):
    """An input that does not fit the model: wrong dtype, rank, vocabulary range or length."""


class OnnxRuntimeMissing(UserError, ImportError):
    """Neither onnxruntime build is installed (tfcompile's `cpu` and `gpu` extras provide one)."""
