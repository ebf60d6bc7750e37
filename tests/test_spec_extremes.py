"""A spec that validates builds: every float of every shipped spec's model section, set in turn to
0, the ends of the floats (the smallest subnormal, 1e-300, 1e300, the largest double), just
below, at and just above 1, NaN and infinity, is either refused by the spec, by field, or builds
a model that runs a forward pass (its outputs may be anything: a useless value is the user's to
choose, a crash deep inside the build is not). The RoPE scalings are added to a RoPE spec, so
that their fields are swept too. Before this sweep a YaRN beta_fast of 1e308 or beta_slow of
1e-308 validated and then failed building (math domain error, OverflowError), as did a YaRN
theta of 1 (ZeroDivisionError).

The floats of the train, task, data and export sections are swept the same way through two
steps of training: a learning rate past float32's range failed in the optimizer (RuntimeError),
and a ViT test fraction that left nothing to split the validation set from failed in numpy
(ValueError), before this sweep."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ROOT, TINY
from pydantic import ValidationError

from tfcompile.errors import UserError
from tfcompile.models import Assembly, Classifier, DecoderLM, MaskedLM, Seq2Seq, VisionTransformer
from tfcompile.spec import load_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks.task import build_model
from tfcompile.train import Trainer

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


# What the training sweep trains: each shipped spec's data and task, tiny, for two steps.
TRAINED = {
    "shakespeare-char": (ROOT / "specs" / "shakespeare-char.yaml", []),
    "vaswani-schedule": (
        ROOT / "specs" / "shakespeare-char.yaml",
        ["train.schedule={type: vaswani, warmup_steps: 2}"],
    ),
    "vit-digits": (ROOT / "specs" / "vit-digits.yaml", []),
    "bert-mini-shakespeare": (ROOT / "specs" / "bert-mini-shakespeare.yaml", ["model.vocab_size=256"]),
}
TWO_STEPS = [
    *TINY,
    "model.max_seq_len=16",
    "train.steps=2",
    "train.batch_size=2",
    "train.eval_interval=1",
    "train.eval_batches=1",
    "train.checkpoint_interval=1",
]
SECTIONS = ("train", "task", "data", "export")
TRAINED_CASES = [
    (base, name)
    for base, (path, sets) in TRAINED.items()
    for section in SECTIONS
    for name in _floats(getattr(load_spec(path, [*TWO_STEPS, *sets]), section).model_dump(), section)
]


@pytest.mark.slow
@pytest.mark.parametrize(("base", "name"), TRAINED_CASES)
def test_a_training_float_at_the_ends_of_the_floats_is_refused_or_trains_or_fails_by_name(
    base: str, name: str, tmp_path: Path
) -> None:
    """Two steps of training with the value: the run ends, or stops with one of tfcompile's named
    errors (a loss turned NaN, a split left empty), never another exception."""
    path, sets = TRAINED[base]
    for i, value in enumerate(EXTREMES):
        overrides = [*TWO_STEPS, *sets, f"{name}={_yaml(value)}", f"train.runs_dir={tmp_path / str(i)}"]
        try:
            spec = load_spec(path, overrides)
        except (SpecError, ValidationError):
            continue
        with contextlib.suppress(UserError):
            Trainer(spec, tmp_path / str(i) / "run", show_progress=False).train()


def test_a_rate_float32_cannot_hold_is_refused_by_field() -> None:
    """A learning rate (or Vaswani scale) past float32's range failed in the optimizer's first step
    (RuntimeError: value cannot be converted to type float without overflow)."""
    path = ROOT / "specs" / "shakespeare-char.yaml"
    for overrides in (
        ["train.optimizer.lr=1e300"],
        ["train.schedule={type: vaswani, warmup_steps: 2}", "train.schedule.scale=1e300"],
    ):
        with pytest.raises(SpecError, match=r"must be at most 1e\+38"):
            load_spec(path, overrides)


def test_an_adam_eps_float32_holds_as_zero_is_refused_by_field() -> None:
    """An eps of 1e-300 is 0 in float32: a weight without gradients divided 0 by 0, and the run
    stopped at its second step with a NaN loss that named the learning rate."""
    with pytest.raises(SpecError, match=r"must be at least 1e-38"):
        load_spec(ROOT / "specs" / "shakespeare-char.yaml", ["train.optimizer.eps=1e-300"])


def test_a_norm_eps_float32_holds_as_zero_is_refused_by_field() -> None:
    """A norm's eps of 1e-50 validated and was 0 in float32, where a zero vector's norm is 0 / 0."""
    with pytest.raises(SpecError, match=r"model\.norm\.eps: must be at least 1e-38"):
        load_spec(ROOT / "specs" / "shakespeare-char.yaml", ["model.norm.eps=1e-50"])
    assert (
        load_spec(ROOT / "specs" / "shakespeare-char.yaml", ["model.norm.eps=1e-12"]).model.norm.eps == 1e-12
    )
