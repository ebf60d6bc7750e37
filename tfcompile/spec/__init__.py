"""The spec: schema, presets, YAML loading with line marks, error formatting."""

from tfcompile.spec.errors import SpecError, SpecIssue
from tfcompile.spec.loader import dump_spec, load_spec, parse_spec
from tfcompile.spec.presets import PRESETS
from tfcompile.spec.schema import DecoderSpec, ModelSpec, Spec

__all__ = [
    "PRESETS",
    "DecoderSpec",
    "ModelSpec",
    "Spec",
    "SpecError",
    "SpecIssue",
    "dump_spec",
    "load_spec",
    "parse_spec",
]
