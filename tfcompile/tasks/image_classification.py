"""Image classification: labelled images, normalised with the training split's statistics,
randomly turned, zoomed, shifted and flipped (as far as the spec allows) while training; accuracy
on validation and on a held-out test split."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tfcompile.data import DataError
from tfcompile.data.images import (
    LabelledImages,
    image_files,
    load_digits,
    read_image_folder,
    stratified_split,
)
from tfcompile.files import PREPROCESSING_FILE
from tfcompile.graphs.export import Graph, export_image_classifier
from tfcompile.graphs.parity import check_image_classifier_parity
from tfcompile.images import ImagePreprocessing
from tfcompile.manifest import ImageInfo, TokenizerInfo
from tfcompile.models import VisionTransformer
from tfcompile.spec.schema import AugmentSpec, ImageClassificationTask, Spec, VitSpec
from tfcompile.tasks.classification import label_index, resolve_labels
from tfcompile.tasks.task import Batch, DataSize, GateRule, ModelFn, Task, register_task, served

if TYPE_CHECKING:
    from tfcompile.runtime import Bundle


def augment(images: torch.Tensor, spec: AugmentSpec, generator: torch.Generator) -> torch.Tensor:
    """(B, C, S, S) -> the same, each image turned by up to ``spec.rotate`` degrees and zoomed by
    up to ``spec.scale`` about its centre (bilinear; what comes from outside the image is 0), then
    moved by up to ``spec.shift`` whole pixels each way (the uncovered border is 0) and, with
    ``spec.flip``, mirrored left-right with probability 1/2."""
    B, _, S, _ = images.shape
    if spec.rotate or spec.scale:
        degrees = (2 * torch.rand(B, generator=generator) - 1) * spec.rotate
        zoom = 1 + (2 * torch.rand(B, generator=generator) - 1) * spec.scale
        images = turn_and_zoom(images, degrees, zoom)
    if spec.shift:
        k = spec.shift
        padded = F.pad(images, (k, k, k, k))
        top, left = (torch.randint(0, 2 * k + 1, (2, B), generator=generator)).unbind(0)
        rows = (top[:, None] + torch.arange(S))[:, None, :, None]  # (B, 1, S, 1)
        cols = (left[:, None] + torch.arange(S))[:, None, None, :]  # (B, 1, 1, S)
        images = padded[
            torch.arange(B)[:, None, None, None], torch.arange(images.shape[1])[:, None, None], rows, cols
        ]
    if spec.flip:
        flip = torch.rand(B, generator=generator) < 0.5
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    return images


def turn_and_zoom(images: torch.Tensor, degrees: torch.Tensor, zoom: torch.Tensor) -> torch.Tensor:
    """Image b of (B, C, S, S) turned clockwise by ``degrees[b]`` and magnified ``zoom[b]`` times
    about its centre: output pixel p samples the input at R(-angle) p / zoom, p measured from the
    centre (bilinear; what comes from outside the image is 0)."""
    angle = torch.deg2rad(degrees)
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    zero = torch.zeros_like(cos)
    rows = (torch.stack((cos, sin, zero), -1), torch.stack((-sin, cos, zero), -1))
    theta = torch.stack(rows, 1)  # (B, 2, 3): output (x, y) -> input, in [-1, 1] coordinates
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@register_task
class ImageClassification(Task):
    section = ImageClassificationTask
    graphs: ClassVar[dict[str, Graph]] = {
        "model": Graph("forward", export_image_classifier, check_image_classifier_parity)
    }
    best_metric = "val_accuracy"
    higher_is_better = True
    gate = GateRule("accuracy", higher_is_better=True, tolerance={"int8": 0.005})

    @staticmethod
    def folder_files(folder: Path) -> list[Path]:
        return image_files(folder)

    @staticmethod
    def build_model(spec: Spec) -> VisionTransformer:
        assert isinstance(spec.model, VitSpec) and isinstance(spec.task, ImageClassificationTask)
        assert spec.task.labels is not None
        return VisionTransformer(spec.model, len(spec.task.labels))

    @classmethod
    def manifest(cls, spec: Spec, tokenizer: TokenizerInfo | None, run: Path | None) -> dict[str, Any]:
        """The labels, and the preprocessing of the run's training images (a spec's random weights
        saw no images: their bundle takes pixel_values only)."""
        assert isinstance(spec.task, ImageClassificationTask)
        sections: dict[str, Any] = {"labels": spec.task.labels}
        if run is not None and (run / PREPROCESSING_FILE).exists():
            p = ImagePreprocessing.from_dict(json.loads((run / PREPROCESSING_FILE).read_text()))
            channel_order = "L" if p.channels == 1 else "RGB"
            sections["image"] = ImageInfo(
                size=p.image_size,
                channels=p.channels,
                channel_order=channel_order,
                mean=list(p.mean),
                std=list(p.std),
                resize=p.resize,
            )
        return sections

    def __init__(self, spec: Spec, cache_dir: Path, tokenizer: Tokenizer | None = None) -> None:
        task, data, model = spec.task, spec.data, spec.model
        assert isinstance(task, ImageClassificationTask) and isinstance(model, VitSpec) and data is not None
        self.task = task
        self.tokens_per_image = model.max_seq_len or 1
        size, channels = model.image_size, model.channels

        if data.builtin == "digits":
            everything = load_digits(channels, size)
        else:
            assert data.path is not None  # the schema asks for one of path and builtin
            everything = read_image_folder(data.path, channels, size)
        splits: dict[str, LabelledImages] = {}
        if data.test_path is not None:
            splits["test"] = read_image_folder(data.test_path, channels, size, "data.test_path")
        elif data.test_fraction is not None:
            rest, held = stratified_split(everything.labels, data.test_fraction)
            everything, splits["test"] = everything.subset(rest), everything.subset(held)
        if data.val_path is not None:
            splits["val"] = read_image_folder(data.val_path, channels, size, "data.val_path")
        else:
            rest, held = stratified_split(everything.labels, data.val_fraction, seed=1)
            everything, splits["val"] = everything.subset(rest), everything.subset(held)
        splits["train"] = everything

        for split, part in splits.items():
            if not part.labels:
                raise DataError(f"the {split} split holds no images: give it more data or a smaller fraction")
        names = {"train": "training", "val": "validation", "test": "test"}
        self.labels = resolve_labels(
            task.labels,
            {names[split]: splits[split].labels for split in ("train", "val", "test") if split in splits},
            str(data.path or f"data.builtin {data.builtin}"),
        )
        index = label_index(self.labels, {label for part in splits.values() for label in part.labels})

        train = splits["train"].images  # statistics of the training images only, before augmentation
        self.preprocessing = ImagePreprocessing(
            size,
            channels,
            tuple(float(m) for m in train.mean(axis=(0, 2, 3), dtype=np.float64)),
            tuple(max(float(s), 1e-6) for s in train.std(axis=(0, 2, 3), dtype=np.float64)),
        )
        self.images = {name: torch.from_numpy(part.images) for name, part in splits.items()}
        self.targets = {name: torch.tensor([index[x] for x in part.labels]) for name, part in splits.items()}

    def sizes(self, spec: Spec) -> list[DataSize]:
        return [DataSize("task.labels", self.labels, f"the data's labels are {self.labels}")]

    def run_files(self) -> dict[str, str]:
        return {PREPROCESSING_FILE: json.dumps(self.preprocessing.to_dict(), indent=2) + "\n"}

    def tokens(self, batch: Batch) -> int:
        return batch["pixel_values"].shape[0] * self.tokens_per_image

    def _normalised(self, images: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.preprocessing.mean, dtype=torch.float32)[:, None, None]
        std = torch.tensor(self.preprocessing.std, dtype=torch.float32)[:, None, None]
        return (images - mean) / std

    def _batch(self, split: str, rows: torch.Tensor, generator: torch.Generator | None = None) -> Batch:
        images = self.images[split][rows]
        if generator is not None:
            images = augment(images, self.task.augment, generator)
        return {"pixel_values": self._normalised(images), "labels": self.targets[split][rows]}

    def batch(self, split: str, size: int, generator: torch.Generator) -> Batch:
        rows = torch.randint(len(self.targets[split]), (size,), generator=generator)
        return self._batch(split, rows, generator if split == "train" else None)

    def eval_batches(
        self, count: int, size: int, generator_for: Callable[[int], torch.Generator]
    ) -> Iterator[Batch]:
        """The whole validation split, in order: accuracy is reported on every image."""
        yield from self._in_order("val", size)

    def _in_order(self, split: str, size: int) -> Iterator[Batch]:
        n = len(self.targets[split])
        for start in range(0, n, size):
            yield self._batch(split, torch.arange(start, min(start + size, n)))

    def loss(self, model: ModelFn, batch: Batch) -> torch.Tensor:
        logits = model(batch["pixel_values"]).float()
        return F.cross_entropy(logits, batch["labels"], label_smoothing=self.task.label_smoothing)

    def evaluate(self, model: ModelFn, batches: Iterator[Batch]) -> dict[str, float]:
        loss_sum = correct = count = 0.0
        for batch in batches:
            logits, labels = model(batch["pixel_values"]).float(), batch["labels"]
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(-1) == labels).sum().item()
            count += len(labels)
        return {"val_loss": loss_sum / count, "val_accuracy": correct / count}

    def held_out(self, bundle: Bundle, limit: int | None) -> tuple[float, str]:
        """Accuracy over the test split (the validation split when there is none), its first
        ``limit`` images, preprocessed as in training."""
        from tfcompile.runtime import ImageClassifier

        assert isinstance(bundle, ImageClassifier)
        split = "test" if "test" in self.images else "val"
        n = min(len(self.targets[split]), limit or len(self.targets[split]))
        batches = (self._batch(split, torch.arange(i, min(i + 256, n))) for i in range(0, n, 256))
        accuracy = self.evaluate(served(bundle.logits), batches)["val_accuracy"]
        return accuracy, f"{n} images of the {'test' if split == 'test' else 'validation'} split"

    @torch.no_grad()
    def test_metrics(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """Accuracy and loss on the test split (data.test_path or data.test_fraction), if any."""
        if "test" not in self.images:
            return {}
        model.eval()
        batches = ({k: v.to(device) for k, v in b.items()} for b in self._in_order("test", 256))
        metrics = self.evaluate(model, batches)
        return {"test_accuracy": metrics["val_accuracy"], "test_loss": metrics["val_loss"]}
