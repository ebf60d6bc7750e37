"""Serve exported bundles with onnxruntime, numpy and tokenizers: this package never imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfcompile.runtime.bundle import FORMAT_VERSION, read_manifest
from tfcompile.runtime.classifier import Classifier, ImageClassifier, Prediction
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.generation import LanguageModel, sample_next
from tfcompile.runtime.session import Bundle, default_providers
from tfcompile.runtime.translation import Translator


def load(
    bundle: str | Path, providers: Sequence[str] | None = None
) -> LanguageModel | Classifier | Translator | ImageClassifier:
    """Load and check a bundle written by ``tfcompile export``: a LanguageModel for a decoder, a
    Classifier for a text classifier, a Translator for an encoder-decoder, an ImageClassifier for
    a ViT. ``providers``: onnxruntime execution providers, in order of preference (default: CUDA
    when available, then the CPU)."""
    task = read_manifest(Path(bundle))["task"]
    kinds: dict[str, type[LanguageModel | Classifier | Translator | ImageClassifier]] = {
        "causal_lm": LanguageModel,
        "classification": Classifier,
        "seq2seq": Translator,
        "image_classification": ImageClassifier,
    }
    if task not in kinds:
        raise BundleError(f"{bundle} holds a {task!r} model, which this runtime cannot serve")
    return kinds[task](bundle, providers)


__all__ = [
    "FORMAT_VERSION",
    "Bundle",
    "BundleError",
    "Classifier",
    "ImageClassifier",
    "InputError",
    "LanguageModel",
    "Prediction",
    "Translator",
    "default_providers",
    "load",
    "read_manifest",
    "sample_next",
]
