"""The spec: schema, presets, YAML loading with line marks, error formatting."""

from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.loader import dump_spec, load_spec, parse_spec
from tfcompile.spec.presets import PRESETS
from tfcompile.spec.schema import DecoderSpec, EncoderSpec, ModelSpec, Spec, TransformerSpec

__all__ = [
    "PRESETS",
    "DecoderSpec",
    "EncoderSpec",
    "ModelSpec",
    "Spec",
    "SpecError",
    "SpecIssue",
    "TransformerSpec",
    "dump_spec",
    "load_spec",
    "parse_spec",
]
