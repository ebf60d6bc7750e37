"""Serve exported bundles with onnxruntime, numpy and tokenizers: this package never imports torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tfcompile.manifest import FORMAT_VERSION, Manifest
from tfcompile.runtime.bundle import BundleFiles, bundle_files, read_manifest
from tfcompile.runtime.classifier import Classifier, ImageClassifier, Prediction
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.generation import LanguageModel
from tfcompile.runtime.session import Bundle, SessionOptions, default_providers
from tfcompile.runtime.translation import Translator
from tfcompile.search import sample_next

# The runtime's side of the task table: a manifest's task name -> the class that serves it.
RUNTIMES: dict[str, type[Bundle]] = {
    "causal_lm": LanguageModel,
    "classification": Classifier,
    "seq2seq": Translator,
    "image_classification": ImageClassifier,
}


def register_runtime(task: str) -> Callable[[type[Bundle]], type[Bundle]]:
    """Serve bundles of ``task`` with the decorated class (a task added outside tfcompile)."""

    def add(cls: type[Bundle]) -> type[Bundle]:
        if RUNTIMES.get(task, cls) is not cls:
            raise ValueError(f"bundles of task {task!r} already have a runtime class")
        RUNTIMES[task] = cls
        cls.TASK = task  # a subclass of a built-in class serves its own task, not its parent's
        return cls

    return add


def load(
    bundle: str | Path | BundleFiles,
    providers: Sequence[str] | None = None,
    options: SessionOptions | None = None,
) -> Bundle:
    """Load and check a bundle written by ``tfcompile export``: a LanguageModel for a decoder, a
    Classifier for a text classifier, a Translator for an encoder-decoder, an ImageClassifier for
    a ViT. ``providers``: onnxruntime execution providers, in order of preference (default: CUDA
    when available, then the CPU); ``options``: threads and spinning (SessionOptions)."""
    files = bundle_files(bundle)
    task = files.manifest.task
    if task not in RUNTIMES:
        raise BundleError(f"{files.folder} holds a model of task {task!r}, which this runtime cannot serve")
    return RUNTIMES[task](files, providers, options)


def check_bundle(bundle: str | Path | BundleFiles) -> None:
    """The checks ``load`` runs, for a bundle handed on rather than served (tfcompile optimize,
    export-triton, export-genai): on the CPU, every graph the manifest lists opened and checked
    against it, and the tokenizer read; a BundleError says what is wrong."""
    served = load(bundle, ["CPUExecutionProvider"])
    for name in served.manifest.graphs.keys() - served.sessions.keys():
        served.open_graph(name)


__all__ = [
    "FORMAT_VERSION",
    "RUNTIMES",
    "Bundle",
    "BundleError",
    "Classifier",
    "ImageClassifier",
    "InputError",
    "LanguageModel",
    "Manifest",
    "Prediction",
    "SessionOptions",
    "Translator",
    "check_bundle",
    "default_providers",
    "load",
    "read_manifest",
    "register_runtime",
    "sample_next",
]
