"""Classification bundles: sentences and sentence pairs (Classifier), images (ImageClassifier)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfcompile.files import PREPROCESSING_FILE
from tfcompile.images import ImageLike, ImagePreprocessing
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.ort import run
from tfcompile.runtime.session import Bundle
from tfcompile.sequences import PAD, pad_rows


@dataclass(frozen=True)
class Prediction:
    label: str
    probabilities: dict[str, float]  # every label's, summing to 1


class Classifier(Bundle):
    """A classifier bundle. ``classify(texts or pairs)`` -> one Prediction per text;
    ``logits(input_ids, attention_mask, token_type_ids)`` -> (batch, labels) float32."""

    @property
    def labels(self) -> list[str]:
        return self.manifest["model"]["labels"]

    def logits(
        self, input_ids: Any, attention_mask: Any | None = None, token_type_ids: Any | None = None
    ) -> np.ndarray:
        ids = self._token_ids(input_ids)
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids)
            if attention_mask is None
            else self._mask(attention_mask, ids.shape),
            "token_type_ids": np.zeros_like(ids)
            if token_type_ids is None
            else self._flags(
                "token_type_ids", token_type_ids, ids.shape, "0 (first sentence) and 1 (second)"
            ),
        }
        names = [i["name"] for i in self.manifest["graphs"]["model"]["inputs"]]
        (logits,) = run(self.session, {name: feed[name] for name in names}, ["logits"])
        return logits

    def classify(self, texts: str | Sequence[str] | Sequence[tuple[str, str]]) -> list[Prediction]:
        """Texts, or (first, second) sentence pairs, -> the most likely label and every label's
        probability. Text longer than the model's context is truncated, as in training."""
        if self.tokenizer is None:
            raise InputError(f"{self.path} has no tokenizer.json: pass token ids to logits() instead")
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise InputError("classify needs at least one text")
        for item in items:
            pair = isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(t, str) for t in item)
            if not (isinstance(item, str) or pair):
                raise InputError(f"classify takes strings or (first, second) string pairs, got {item!r}")
        encodings = self.tokenizer.encode_batch([tuple(i) if not isinstance(i, str) else i for i in items])
        ids = pad_rows([e.ids for e in encodings], self.special_ids(PAD)[PAD])
        types = pad_rows([e.type_ids for e in encodings], 0)
        mask = pad_rows([[1] * len(e.ids) for e in encodings], 0)
        return predictions(self.logits(ids, mask, types), self.labels)


def predictions(logits: np.ndarray, labels: list[str]) -> list[Prediction]:
    """(batch, labels) logits -> each row's most likely label and every label's probability."""
    logits = logits.astype(np.float64)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return [
        Prediction(labels[int(p.argmax())], {label: float(q) for label, q in zip(labels, p, strict=True)})
        for p in probs
    ]


class ImageClassifier(Bundle):
    """An image classifier bundle (ViT). ``classify_images(paths or arrays)`` -> one Prediction
    per image, preprocessed as in training; ``logits(pixel_values)`` -> (batch, labels) float32
    for images already preprocessed to (batch, channels, size, size)."""

    def __init__(self, bundle: str | Path, providers: Sequence[str] | None = None) -> None:
        super().__init__(bundle, providers)
        file = self.path / PREPROCESSING_FILE
        try:
            self.preprocessing = (
                ImagePreprocessing.from_dict(json.loads(file.read_text())) if file.exists() else None
            )
        except (ValueError, KeyError, TypeError) as e:
            raise BundleError(f"{file} is not a valid preprocessing record: {e}") from None
        sizes = self.manifest["model"]
        self.input_shape = (sizes["channels"], sizes["image_size"], sizes["image_size"])

    @property
    def labels(self) -> list[str]:
        return self.manifest["model"]["labels"]

    def logits(self, pixel_values: Any) -> np.ndarray:
        pixels = np.asarray(pixel_values)
        if pixels.ndim != 4 or pixels.shape[1:] != self.input_shape or pixels.shape[0] == 0:
            raise InputError(
                f"pixel_values must have shape (batch, {', '.join(map(str, self.input_shape))}), "
                f"got {pixels.shape}"
            )
        if not np.issubdtype(pixels.dtype, np.floating) or not np.isfinite(pixels).all():
            raise InputError(f"pixel_values must hold finite floats, got dtype {pixels.dtype}")
        (logits,) = run(self.session, {"pixel_values": pixels.astype(np.float32, copy=False)}, ["logits"])
        return logits

    def classify_images(
        self, images: ImageLike | Sequence[ImageLike], batch_size: int = 64
    ) -> list[Prediction]:
        """Image files (PNG, JPEG, ...) or arrays ((H, W) or (H, W, C); uint8 0-255 or float 0-1)
        -> the most likely class and every class's probability. A single path or array is one
        image; a 4-D array is a batch of (H, W, C) images."""
        if self.preprocessing is None:
            raise InputError(
                f"{self.path} has no {PREPROCESSING_FILE} (it was not exported from a run): "
                f"pass preprocessed pixel_values to logits() instead"
            )
        if isinstance(images, str | Path) or (isinstance(images, np.ndarray) and images.ndim < 4):
            items: list[ImageLike] = [images]
        else:
            items = list(images)
        if not items:
            raise InputError("classify_images needs at least one image")
        out: list[Prediction] = []
        for start in range(0, len(items), batch_size):
            pixels = self.preprocessing.pixel_values(items[start : start + batch_size])
            out += predictions(self.logits(pixels), self.labels)
        return out
