"""A bundle opened for serving: manifest and file checks, execution providers, input checks.

Imports onnxruntime, numpy and tokenizers only, never torch (as all of tfcompile.runtime).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tfcompile.runtime.bundle import read_manifest
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.ort import ort
from tfcompile.sequences import token_ids

# Bundles are checked against PyTorch's fp32 logits. The CUDA provider's default TF32 matmuls
# move those logits by about 1e-3 (measured on an H100), enough to change greedy tokens.
PROVIDER_OPTIONS: dict[str, dict[str, str]] = {"CUDAExecutionProvider": {"use_tf32": "0"}}


def default_providers() -> list[str]:
    """CUDA when onnxruntime-gpu sees a GPU, the CPU otherwise (always kept as the fallback)."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def session_providers(providers: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """Provider names -> (name, options) for onnxruntime, refusing names this build lacks."""
    available = ort.get_available_providers()
    for name in providers:
        if name not in available:
            raise InputError(
                f"execution provider {name!r} is not available in this onnxruntime build; it has "
                f"{available}. For CUDAExecutionProvider install onnxruntime-gpu (tfcompile[gpu])"
            )
    return [(name, dict(PROVIDER_OPTIONS.get(name, {}))) for name in providers]


class Bundle:
    """A loaded and checked bundle: its manifest, a session on its main graph, its tokenizer, and
    the checks every input goes through before onnxruntime sees it."""

    MAIN_GRAPH = "model"  # the graph opened at load; others open on first use

    def __init__(self, bundle: str | Path, providers: Sequence[str] | None = None) -> None:
        self.path = Path(bundle)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        graph = self.manifest["graphs"][self.MAIN_GRAPH]
        self._providers = session_providers(providers or default_providers())
        self.session = ort.InferenceSession(str(self.path / graph["file"]), providers=self._providers)
        self.vocab_size: int = self.manifest["model"]["vocab_size"]
        self.max_seq_len: int = self.manifest["model"]["max_seq_len"]
        tokenizer = self.path / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(tokenizer)) if tokenizer.exists() else None

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def special_ids(self, *tokens: str) -> dict[str, int]:
        """The ids of special tokens in the bundle's tokenizer; a BundleError when it lacks one."""
        try:
            return token_ids(self.tokenizer, tokens)
        except ValueError as e:
            raise BundleError(f"{self.path / 'tokenizer.json'}: {e}") from None

    def empty_cache(self, graph: str, batch: int) -> list[np.ndarray]:
        """Every past_key_i/past_value_i input of ``graph`` holding no tokens, (batch, n_kv_heads, 0,
        head_dim), in the graph's float type (float16 for an fp16 bundle)."""
        sizes = self.manifest["model"]
        pasts = [i for i in self.manifest["graphs"][graph]["inputs"] if i["name"].startswith("past_")]
        shape = (batch, sizes["n_kv_heads"], 0, sizes["head_dim"])
        return [np.zeros(shape, dtype=np.dtype(past["dtype"])) for past in pasts]

    def _token_ids(self, value: Any) -> np.ndarray:
        ids = np.asarray(value)
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
        if ids.ndim != 2:
            raise InputError(f"input_ids must have shape (batch, seq), got shape {ids.shape}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise InputError(f"input_ids must not be empty, got shape {ids.shape}")
        if ids.shape[1] > self.max_seq_len:
            raise InputError(
                f"input_ids has {ids.shape[1]} tokens, more than the model's context of {self.max_seq_len}"
            )
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InputError(f"input_ids holds token id {bad}, outside the vocabulary [0, {self.vocab_size})")
        return ids.astype(np.int64, copy=False)

    def _flags(self, name: str, value: Any, shape: tuple[int, ...], meaning: str) -> np.ndarray:
        """A 0/1 integer array shaped like input_ids; ``meaning`` says what 0 and 1 stand for."""
        array = np.asarray(value)
        if array.shape != shape:
            raise InputError(f"{name} has shape {array.shape}, but input_ids has shape {shape}")
        integer = np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_
        if not integer or not np.isin(array, (0, 1)).all():
            raise InputError(f"{name} must hold {meaning} only")
        return array.astype(np.int64, copy=False)

    def _mask(self, value: Any, shape: tuple[int, ...]) -> np.ndarray:
        return self._flags("attention_mask", value, shape, "0 (padding) and 1 (real token)")
