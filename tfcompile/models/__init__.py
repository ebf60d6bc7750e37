"""Assemblies: a spec in, an ``nn.Module`` out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from tfcompile.models.decoder import DecoderLM
from tfcompile.models.encoder import Classifier, Encoder, MaskedLM
from tfcompile.models.encoder_decoder import Seq2Seq
from tfcompile.models.vit import VisionTransformer

if TYPE_CHECKING:
    from tfcompile.spec.schema import Spec


def build_model(spec: Spec) -> nn.Module:
    """The model that the spec's family and task call for."""
    model, task = spec.model, spec.task
    if model.family == "decoder":
        return DecoderLM(model)
    if model.family == "encoder_decoder":
        return Seq2Seq(model)
    if task.type == "masked_lm":
        return MaskedLM(model, next_sentence=task.next_sentence)
    if task.type in ("classification", "image_classification"):
        if not task.labels:
            raise ValueError(
                "task.labels is not set: set it in the spec, or train, which takes it from the data"
            )
        if model.family == "vit":
            return VisionTransformer(model, len(task.labels))
        return Classifier(model, len(task.labels))
    raise ValueError(f"no {model.family} model for task {task.type!r}")


__all__ = ["Classifier", "DecoderLM", "Encoder", "MaskedLM", "Seq2Seq", "VisionTransformer", "build_model"]
