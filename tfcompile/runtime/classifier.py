"""Classification bundles: sentences and sentence pairs (Classifier), images (ImageClassifier)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tfcompile.images import ImageLike, ImagePreprocessing
from tfcompile.manifest import Truncation
from tfcompile.runtime import inputs
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.errors import BundleError, InputError
from tfcompile.runtime.session import Bundle, SessionOptions
from tfcompile.sequences import length_groups, pad_rows


@dataclass(frozen=True)
class Prediction:
    label: str
    probabilities: dict[str, float]  # every label's, summing to 1


def _type_ids(node: Any) -> set[Any]:
    """Every segment id (``type_id``) a tokenizer's post-processor (its JSON) gives its tokens."""
    if isinstance(node, dict):
        found = {node["type_id"]} if "type_id" in node else set()
        return found.union(*(_type_ids(value) for key, value in node.items() if key != "type_id"))
    if isinstance(node, list):
        return set().union(*(_type_ids(item) for item in node))
    return set()


class Classifier(Bundle):
    """A classifier bundle. ``classify(texts or pairs)`` -> one Prediction per text;
    ``logits(input_ids, attention_mask, token_type_ids)`` -> (batch, labels) float32."""

    TASK = "classification"
    PADDING_SIDE = "right"

    def __init__(
        self,
        bundle: str | Path | BundleFiles,
        providers: Sequence[str] | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        super().__init__(bundle, providers, options)
        names = [t.name for t in self.graph("model").inputs]
        if "input_ids" not in names or not set(names) <= {"input_ids", "attention_mask", "token_type_ids"}:
            raise BundleError(
                f"{self.path}: the model graph takes {names}; a classifier's takes input_ids, and "
                f"optionally attention_mask and token_type_ids"
            )
        _check_labels(self)
        info = self.manifest.tokenizer  # there is a tokenizer exactly where the manifest names one
        if self.tokenizer is not None and info is not None:
            cut_to_context(self.tokenizer, info.truncation, self.max_seq_len)
            given = _type_ids(json.loads(self.files.text(info.file)).get("post_processor"))
            if "token_type_ids" in names and not given <= {0, 1}:
                raise BundleError(
                    f"{self.path / info.file}: its post-processor gives the segment ids {sorted(given)}, "
                    f"and the model reads 0 (first sentence) and 1 (second) only"
                )

    @property
    def labels(self) -> list[str]:
        return _labels(self)

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
            else inputs.flags(
                "token_type_ids", token_type_ids, ids.shape, "0 (first sentence) and 1 (second)"
            ),
        }
        names = [t.name for t in self.graph("model").inputs]
        (logits,) = self.run_graph("model", {name: feed[name] for name in names}, ["logits"])
        return logits

    def classify(self, texts: str | Sequence[str | tuple[str, str]]) -> list[Prediction]:
        """Texts, or (first, second) sentence pairs, -> the most likely label and every label's
        probability. A text or pair longer than the model's context is cut (``cut_to_context``),
        as in training."""
        encodings = self.encode(inputs.texts("texts", texts, pairs=True))
        out: list[Prediction] = [Prediction("", {})] * len(encodings)
        for group in length_groups([len(e.ids) for e in encodings]):  # little padding per batch
            rows = [encodings[i] for i in group]
            ids = pad_rows([e.ids for e in rows], self.manifest.padding.pad_id)
            types = pad_rows([e.type_ids for e in rows], 0)
            mask = pad_rows([[1] * len(e.ids) for e in rows], 0)
            for i, prediction in zip(
                group, predictions(self.logits(ids, mask, types), self.labels), strict=True
            ):
                out[i] = prediction
        return out


def cut_to_context(tokenizer: Tokenizer, truncation: Truncation | None, context: int) -> None:
    """One rule for a text or pair longer than a classifier reads, whatever tokenizer.json says:
    it is cut as the manifest's tokenizer.truncation says (its strategy and direction), at no more
    than the model's ``context`` tokens, the framing's special tokens included; a manifest without
    one (an imported tokenizer's; a bundle of a version before the field) cuts longest-first from
    the right at the context, as training does (tfcompile.data.tokenizer.frame_sentences)."""
    cut = truncation or Truncation(max_length=context, strategy="longest_first", direction="right")
    tokenizer.enable_truncation(min(cut.max_length, context), strategy=cut.strategy, direction=cut.direction)


def _labels(bundle: Bundle) -> list[str]:
    if not bundle.manifest.labels:
        raise BundleError(f"{bundle.path}: the manifest of a classifier needs its labels")
    return bundle.manifest.labels


def _check_labels(bundle: Bundle) -> None:
    """A classifier's model graph gives (batch, labels) logits, one per label of the manifest."""
    labels = _labels(bundle)
    logits = bundle.expect("model", [], ["logits"], exact=False).outputs[0]
    if len(logits.shape) != 2 or logits.shape[1] != len(labels):
        raise BundleError(
            f"{bundle.path}: the logits have the shape {logits.shape}, not (batch, {len(labels)}) "
            f"for the manifest's {len(labels)} labels"
        )


def predictions(logits: np.ndarray, labels: list[str]) -> list[Prediction]:
    """(batch, labels) logits -> each row's most likely label and every label's probability."""
    if logits.shape[-1] != len(labels):
        raise BundleError(
            f"the graph gives {logits.shape[-1]} logits a row for the manifest's {len(labels)} labels"
        )
    logits = logits.astype(np.float64)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return [
        Prediction(labels[int(p.argmax())], {label: float(q) for label, q in zip(labels, p, strict=True)})
        for p in probs
    ]


class ImageClassifier(Bundle):
    """An image classifier bundle (ViT). ``classify_images(paths or arrays)`` -> one Prediction
    per image, preprocessed as the manifest's image section says (as in training);
    ``logits(pixel_values)`` -> (batch, labels) float32 for images already preprocessed to
    (batch, channels, size, size)."""

    TASK = "image_classification"

    def __init__(
        self,
        bundle: str | Path | BundleFiles,
        providers: Sequence[str] | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        super().__init__(bundle, providers, options)
        image = self.manifest.image
        self.preprocessing = (
            None
            if image is None
            else ImagePreprocessing(
                image.size, image.channels, tuple(image.mean), tuple(image.std), image.resize
            )
        )
        shape = self.expect("model", ["pixel_values"], ["logits"]).inputs[0].shape[1:]
        if not all(isinstance(d, int) for d in shape) or len(shape) != 3:
            raise BundleError(
                f"{self.path}: pixel_values must have fixed (channels, size, size), found {shape}"
            )
        self.input_shape = tuple(int(d) for d in shape)
        if image is not None and (image.channels, image.size, image.size) != self.input_shape:
            raise BundleError(
                f"{self.path}: the image section makes {image.channels} x {image.size} x {image.size} "
                f"pixel values, but the graph takes {self.input_shape}"
            )
        _check_labels(self)

    @property
    def labels(self) -> list[str]:
        return _labels(self)

    def logits(self, pixel_values: Any) -> np.ndarray:
        pixels = inputs.array("pixel_values", pixel_values)
        if pixels.ndim != 4 or pixels.shape[1:] != self.input_shape or pixels.shape[0] == 0:
            raise InputError(
                f"pixel_values must have shape (batch, {', '.join(map(str, self.input_shape))}), "
                f"got {pixels.shape}"
            )
        pixels = inputs.floats("pixel_values", pixels, self.graph("model").inputs[0].dtype)
        (logits,) = self.run_graph("model", {"pixel_values": pixels}, ["logits"])
        return logits

    def classify_images(
        self, images: ImageLike | Sequence[ImageLike], batch_size: int = 64
    ) -> list[Prediction]:
        """Image files (PNG, JPEG, ...) or arrays ((H, W) or (H, W, C); uint8 0-255 or float 0-1)
        -> the most likely class and every class's probability. A single path or array is one
        image; a 4-D array is a batch of (H, W, C) images."""
        if self.preprocessing is None:
            raise InputError(
                f"{self.path} has no image preprocessing (it was not exported from a run): "
                f"pass preprocessed pixel_values to logits() instead"
            )
        items = inputs.images("images", images)
        batch = inputs.count("batch_size", batch_size, 1)
        out: list[Prediction] = []
        for start in range(0, len(items), batch):
            pixels = self.preprocessing.pixel_values(items[start : start + batch])
            out += predictions(self.logits(pixels), self.labels)
        return out
