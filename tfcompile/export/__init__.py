"""torch -> ONNX export and parity checks against onnxruntime."""

from tfcompile.export.graph import DECODER_INPUTS, DECODER_OUTPUTS, export_decoder
from tfcompile.export.parity import ParityCase, ParityReport, check_decoder_parity, default_shapes

__all__ = [
    "DECODER_INPUTS",
    "DECODER_OUTPUTS",
    "ParityCase",
    "ParityReport",
    "check_decoder_parity",
    "default_shapes",
    "export_decoder",
]
