"""Serve exported bundles with onnxruntime, numpy and tokenizers: this package never imports torch."""

from tfcompile.runtime.bundle import FORMAT_VERSION, read_manifest
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.session import Model, default_providers, load, sample_next

__all__ = [
    "FORMAT_VERSION",
    "BundleError",
    "InputError",
    "Model",
    "default_providers",
    "load",
    "read_manifest",
    "sample_next",
]
