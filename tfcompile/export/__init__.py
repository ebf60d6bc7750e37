"""Bundles: the graphs a task declares (tfcompile.graphs), checked against PyTorch, with the
tokenizer, the spec and a manifest, in a folder that onnxruntime alone serves."""

from tfcompile.export.bundle import ExportError, Source, export_bundle, verify_bundle
from tfcompile.graphs.export import (
    CLASSIFIER_INPUTS,
    DECODER_INPUTS,
    OUTPUTS,
    Graph,
    export_classifier,
    export_decoder,
    export_decoder_step,
    export_forward,
    export_image_classifier,
)
from tfcompile.graphs.parity import (
    ParityCase,
    ParityReport,
    check_classifier_parity,
    check_decoder_parity,
    check_forward_parity,
    check_image_classifier_parity,
    check_step_parity,
    default_shapes,
)

__all__ = [
    "CLASSIFIER_INPUTS",
    "DECODER_INPUTS",
    "OUTPUTS",
    "ExportError",
    "Graph",
    "ParityCase",
    "ParityReport",
    "Source",
    "check_classifier_parity",
    "check_decoder_parity",
    "check_forward_parity",
    "check_image_classifier_parity",
    "check_step_parity",
    "default_shapes",
    "export_bundle",
    "export_classifier",
    "export_decoder",
    "export_decoder_step",
    "export_forward",
    "export_image_classifier",
    "verify_bundle",
]
