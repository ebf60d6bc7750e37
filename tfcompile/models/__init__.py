"""Assemblies: a model spec in, an ``nn.Module`` out."""

from torch import nn

from tfcompile.models.decoder import DecoderLM
from tfcompile.spec.schema import ModelSpec

FAMILIES: dict[str, type[nn.Module]] = {"decoder": DecoderLM}


def build_model(spec: ModelSpec) -> nn.Module:
    return FAMILIES[spec.family](spec)


__all__ = ["FAMILIES", "DecoderLM", "build_model"]
