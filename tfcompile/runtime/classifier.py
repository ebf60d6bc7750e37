"""Sentence and sentence-pair classification from a classifier bundle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfcompile.runtime.errors import InputError
from tfcompile.runtime.session import Bundle


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
        (logits,) = self.session.run(["logits"], {name: feed[name] for name in names})
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
        T = max(len(e.ids) for e in encodings)
        ids, mask, types = (np.zeros((len(items), T), dtype=np.int64) for _ in range(3))
        ids[:] = self.tokenizer.token_to_id("[PAD]")
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)], types[row, : len(e.ids)], mask[row, : len(e.ids)] = e.ids, e.type_ids, 1
        logits = self.logits(ids, mask, types).astype(np.float64)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        return [
            Prediction(
                self.labels[int(p.argmax())],
                {label: float(q) for label, q in zip(self.labels, p, strict=True)},
            )
            for p in probs
        ]
