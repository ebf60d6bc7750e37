"""torch -> ONNX export and parity checks against onnxruntime."""

from tfcompile.export.bundle import ExportError, Source, export_bundle, verify_bundle
from tfcompile.export.graph import DECODER_INPUTS, DECODER_OUTPUTS, export_decoder, export_decoder_step
from tfcompile.export.parity import (
    ParityCase,
    ParityReport,
    check_decoder_parity,
    check_step_parity,
    default_shapes,
)

__all__ = [
    "DECODER_INPUTS",
    "DECODER_OUTPUTS",
    "ExportError",
    "ParityCase",
    "ParityReport",
    "Source",
    "check_decoder_parity",
    "check_step_parity",
    "default_shapes",
    "export_bundle",
    "export_decoder",
    "export_decoder_step",
    "verify_bundle",
]
