"""Serve a bundle with onnxruntime alone: load, check, validate inputs, run.

Imports onnxruntime, numpy and tokenizers only, never torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from tfcompile.runtime.bundle import read_manifest
from tfcompile.runtime.errors import InputError


def default_providers() -> list[str]:
    """CUDA when onnxruntime-gpu sees a GPU, the CPU otherwise (always kept as the fallback)."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class Model:
    """A loaded bundle. ``logits(input_ids, attention_mask)`` -> (batch, seq, vocab) float32."""

    def __init__(self, bundle: str | Path, providers: Sequence[str] | None = None) -> None:
        self.path = Path(bundle)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        graph = self.manifest["graphs"]["model"]
        self.session = ort.InferenceSession(
            str(self.path / graph["file"]), providers=list(providers or default_providers())
        )
        self.vocab_size: int = self.manifest["model"]["vocab_size"]
        self.max_seq_len: int = self.manifest["model"]["max_seq_len"]
        tokenizer = self.path / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(tokenizer)) if tokenizer.exists() else None

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def logits(self, input_ids: Any, attention_mask: Any | None = None) -> np.ndarray:
        ids = self._token_ids(input_ids)
        mask = np.ones_like(ids) if attention_mask is None else self._mask(attention_mask, ids.shape)
        (logits,) = self.session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
        return logits

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

    def _mask(self, value: Any, shape: tuple[int, ...]) -> np.ndarray:
        mask = np.asarray(value)
        if mask.shape != shape:
            raise InputError(f"attention_mask has shape {mask.shape}, but input_ids has shape {shape}")
        if (
            not (np.issubdtype(mask.dtype, np.integer) or mask.dtype == np.bool_)
            or not np.isin(mask, (0, 1)).all()
        ):
            raise InputError("attention_mask must hold 0 (padding) and 1 (real token) only")
        return mask.astype(np.int64, copy=False)


def load(bundle: str | Path, providers: Sequence[str] | None = None) -> Model:
    """Load and check a bundle written by ``tfcompile export``."""
    return Model(bundle, providers)
