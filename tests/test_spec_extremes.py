"""A spec that validates builds: every float of every shipped spec's model section, set in turn to
0, the ends of the floats (the smallest subnormal, 1e-300, 1e300, the largest double), just
below, at and just above 1, NaN and infinity, is either refused by the spec, by field, or builds
a model that runs a forward pass (its outputs may be anything: a useless value is the user's to
choose, a crash deep inside the build is not). The RoPE scalings are added to a RoPE spec, so
that their fields are swept too. Before this sweep a YaRN beta_fast of 1e308 or beta_slow of
1e-308 validated and then failed building (math domain error, OverflowError), as did a YaRN
theta of 1 (ZeroDivisionError)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from helpers import ROOT, TINY
from pydantic import ValidationError

from tfcompile.models import Assembly, Classifier, DecoderLM, MaskedLM, Seq2Seq, VisionTransformer
from tfcompile.spec import load_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks.task import build_model

EXTREMES = [
    0.0,
    5e-324,
    1e-300,
    0.999999,
    1.0,
    1.000001,
    1e300,
    sys.float_info.max,
    float("nan"),
    float("inf"),
]
SCALINGS = {
    "linear": "{type: linear, factor: 2.0}",
    "dynamic": "{type: dynamic, factor: 2.0, original_max_position_embeddings: 8}",
    "llama3": "{type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
    "original_max_position_embeddings: 8}",
    "yarn": "{type: yarn, factor: 4.0, original_max_position_embeddings: 8, mscale: 1.0, "
    "mscale_all_dim: 0.5}",
}
# The sizes a spec leaves to its data, and a short context, so that every model is tiny.
SIZES = {"model.vocab_size": "model.vocab_size=32", "task.labels": "task.labels=[a, b, c]"}
BASES = {
    **{
        path.stem: (path, [*TINY, "model.max_seq_len=16"]) for path in sorted((ROOT / "specs").glob("*.yaml"))
    },
    **{
        f"rope-{name}": (
            ROOT / "specs" / "shakespeare-char-llama.yaml",
            [*TINY, "model.max_seq_len=16", f"model.positional.scaling={scaling}"],
        )
        for name, scaling in SCALINGS.items()
    },
}


def _spec(base: str, overrides: list[str]) -> Any:
    path, sets = BASES[base]
    spec = load_spec(path, [*sets, *overrides])
    missing = spec.sizes_from_data()
    return load_spec(path, [*sets, *(SIZES[name] for name in missing), *overrides]) if missing else spec


def _floats(node: Any, prefix: str) -> list[str]:
    """The dotted names of the float leaves under ``node`` (a spec section as a dict)."""
    if isinstance(node, dict):
        return [name for k, v in node.items() for name in _floats(v, f"{prefix}.{k}")]
    return [prefix] if isinstance(node, float) else []


def _run(model: Assembly) -> None:
    """One forward pass on a padded batch of two rows."""
    s = model.spec
    ids = torch.randint(0, s.vocab_size or 2, (2, 6)) if hasattr(s, "vocab_size") else None
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6])
    if isinstance(model, VisionTransformer):
        model(torch.randn(2, s.channels, s.image_size, s.image_size))
    elif isinstance(model, Seq2Seq):
        model(ids, mask, ids)
    elif isinstance(model, DecoderLM | Classifier | MaskedLM):
        model(ids, mask)
    else:
        raise AssertionError(f"a model this sweep does not know how to run: {type(model).__name__}")


CASES = [(base, name) for base in BASES for name in _floats(_spec(base, []).model.model_dump(), "model")]


def _yaml(value: float) -> str:
    return ".nan" if value != value else ".inf" if value == float("inf") else repr(value)


def _sweep(base: str, name: str) -> None:
    for value in EXTREMES:
        try:
            spec = _spec(base, [f"{name}={_yaml(value)}"])
        except (SpecError, ValidationError):
            continue
        torch.manual_seed(0)
        with torch.no_grad():
            _run(build_model(spec).eval())


@pytest.mark.parametrize(("base", "name"), [c for c in CASES if c[0] == "rope-yarn"])
def test_a_yarn_float_at_the_ends_of_the_floats_is_refused_or_builds(base: str, name: str) -> None:
    _sweep(base, name)


@pytest.mark.slow
@pytest.mark.parametrize(("base", "name"), [c for c in CASES if c[0] != "rope-yarn"])
def test_a_model_float_at_the_ends_of_the_floats_is_refused_or_builds(base: str, name: str) -> None:
    _sweep(base, name)


def test_the_sweep_reaches_every_scaling_field() -> None:
    names = {name for _, name in CASES}
    assert {"model.positional.scaling.beta_fast", "model.positional.scaling.mscale_all_dim"} <= names
    assert "model.positional.scaling.low_freq_factor" in names
    assert {"model.norm.eps", "model.init_std", "model.positional.theta"} <= names
