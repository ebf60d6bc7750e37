"""Assemblies: a family's spec section in, an ``nn.Module`` out. Which assembly a spec builds is
its task's to say (tfcompile.tasks)."""

from tfcompile.models.common import Assembly
from tfcompile.models.decoder import DecoderLM
from tfcompile.models.encoder import Classifier, Encoder, MaskedLM
from tfcompile.models.encoder_decoder import Seq2Seq
from tfcompile.models.vit import VisionTransformer

__all__ = ["Assembly", "Classifier", "DecoderLM", "Encoder", "MaskedLM", "Seq2Seq", "VisionTransformer"]
