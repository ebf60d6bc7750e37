"""torch -> ONNX export and parity checks against onnxruntime."""

from tfcompile.export.bundle import ExportError, Source, export_bundle, verify_bundle
from tfcompile.export.graph import (
    CLASSIFIER_INPUTS,
    DECODER_INPUTS,
    OUTPUTS,
    export_classifier,
    export_decoder,
    export_decoder_step,
    export_image_classifier,
)
from tfcompile.export.parity import (
    ParityCase,
    ParityReport,
    check_classifier_parity,
    check_decoder_parity,
    check_image_classifier_parity,
    check_step_parity,
    default_shapes,
)

__all__ = [
    "CLASSIFIER_INPUTS",
    "DECODER_INPUTS",
    "OUTPUTS",
    "ExportError",
    "ParityCase",
    "ParityReport",
    "Source",
    "check_classifier_parity",
    "check_decoder_parity",
    "check_image_classifier_parity",
    "check_step_parity",
    "default_shapes",
    "export_bundle",
    "export_classifier",
    "export_decoder",
    "export_decoder_step",
    "export_image_classifier",
    "verify_bundle",
]
