"""Hostile config.json values: each published config (tests/data/hf_configs), shrunk and saved
with a tiny random model, gets one or two fields (or values nested in its RoPE dict, labels or
layer types) changed to a value of another JSON type, a sign or size that makes no sense, or
deleted. ``tfcompile import`` then imports it or refuses it with an HFError (or another
UserError) that names a config field or file: never a traceback."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hf_published_configs import NAMES, published, save, shrunk

from tfcompile.errors import UserError
from tfcompile.hf.errors import HFError
from tfcompile.hf.importer import import_folder

HOSTILE: list[Any] = [None, True, False, 0, -1, 1.5, 1e308, -1e308, 2**70, "", "x", [], [1], {}, {"a": 1}]
HOSTILE += [math.nan, math.inf, -math.inf]  # json.loads reads NaN, Infinity and -Infinity
HOSTILE += [1 << 16, 1 << 24, 1 << 30]  # sizes within the spec's bounds that would allocate gigabytes
DELETED = "<deleted>"
NESTED = ("rope_scaling", "rope_parameters", "id2label", "label2id", "layer_types")
FOLDERS: dict[str, Path] = {}  # name -> its folder, saved once per worker


def folder_of(name: str, root: Path) -> Path:
    if name not in FOLDERS:
        FOLDERS[name] = root / name
        save(name, FOLDERS[name])
    return FOLDERS[name]


@st.composite
def edited(draw: st.DrawFn) -> tuple[str, dict[str, Any], list[str]]:
    """A published config's name, the config shrunk with one or two fields changed, and the
    changed fields' names."""
    name = draw(st.sampled_from(NAMES))
    config = shrunk(published(name))
    changed = []
    for _ in range(draw(st.integers(1, 2))):
        field = draw(st.sampled_from(sorted({*config, *NESTED})))
        value = draw(st.sampled_from([*HOSTILE, DELETED]))
        inner = config.get(field)
        if field in NESTED and isinstance(inner, dict | list) and inner and draw(st.booleans()):
            inner = dict(inner) if isinstance(inner, dict) else list(inner)
            keys = list(inner) if isinstance(inner, dict) else list(range(len(inner)))
            key = draw(st.sampled_from(keys))
            if value == DELETED and isinstance(inner, dict):
                del inner[key]
            else:
                inner[key] = None if value == DELETED else value
            value = inner
        if value == DELETED:
            config.pop(field, None)
        else:
            config[field] = value
        changed.append(field)
    return name, config, changed


def check(name: str, config: dict[str, Any], changed: list[str], root: Path) -> None:
    """Import ``config`` beside the published config's weights: it imports, or a UserError names a
    changed field or a file."""
    folder = folder_of(name, root / "hf")
    (folder / "config.json").write_text(json.dumps(config))
    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import_folder(folder, "x", out / "specs", out / "runs")
    except UserError as e:
        assert isinstance(e, HFError) or "config.json" in str(e), (type(e), str(e))
        named = [*changed, "config.json", "tokenizer", "preprocessor_config.json", "safetensors"]
        assert any(n in str(e) for n in named), str(e)


FUZZ = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(edited())
def test_a_hostile_config_imports_or_is_refused_by_name(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, dict[str, Any], list[str]]
) -> None:
    check(*case, tmp_path_factory.getbasetemp() / "fuzz")


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(edited())
def test_many_hostile_configs_import_or_are_refused_by_name(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, dict[str, Any], list[str]]
) -> None:
    check(*case, tmp_path_factory.getbasetemp() / "fuzz")


def refusal(name: str, changes: dict[str, Any], root: Path) -> str:
    """The message refusing the published config ``name`` shrunk with ``changes`` (a dict merged
    into the field's dict)."""
    config = shrunk(published(name))
    for field, value in changes.items():
        merged = isinstance(value, dict) and isinstance(config.get(field), dict)
        config[field] = config[field] | value if merged else value
    folder = folder_of(name, root / "hf")
    (folder / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(), pytest.raises(HFError) as e:
        warnings.simplefilter("ignore")
        import_folder(folder, "x", root / "specs", root / "runs")
    return str(e.value)


@pytest.mark.parametrize("value", ["x", "", [], {}, 8.5])
def test_an_image_size_of_another_type_is_refused_by_name(value: Any, tmp_path: Path) -> None:
    """int() read "x" and [] as a ValueError or IndexError, and 8.5 as 8."""
    assert "image_size" in refusal("vit-base-beans", {"image_size": value}, tmp_path)


def test_a_t5_width_of_0_is_refused_by_name(tmp_path: Path) -> None:
    """1 / sqrt(d_model) was a ZeroDivisionError."""
    assert "d_model" in refusal("t5-small", {"d_model": 0}, tmp_path)


def test_a_rope_scaling_trained_on_an_absurd_context_is_refused_by_name(tmp_path: Path) -> None:
    """2^70 was an OverflowError computing the RoPE tables."""
    changes = {"rope_scaling": {"original_max_position_embeddings": 2**70}}
    assert "rope_scaling.original_max_position_embeddings" in refusal("Llama-3.1-8B", changes, tmp_path)


def test_a_vocabulary_the_checkpoint_does_not_hold_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """2^24 rows of a table the checkpoint holds 64 of were built (gigabytes) before the shapes
    were compared; now compared on the meta device."""
    import tfcompile.hf.importer as importer

    built = []
    real = importer.build_model

    def counted(spec: Any) -> Any:
        model = real(spec)
        built.append(next(model.parameters()).device.type)
        return model

    importer.build_model = counted
    try:
        message = refusal("Llama-3.2-1B-Instruct", {"vocab_size": 1 << 24}, tmp_path)
    finally:
        importer.build_model = real
    assert built == ["meta"] and "embed.weight" in message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["NaN", "Infinity", "-Infinity"])
def test_a_config_of_non_finite_numbers_is_refused_by_name(
    tmp_path_factory: pytest.TempPathFactory, value: float
) -> None:
    """json.loads reads NaN and Infinity, and transformers with it: each published config with
    every number set to one is refused naming a field (int() of a NaN head size crashed the
    RoPE of ten model types, and of a NaN window pattern Command R7B's)."""
    for name in NAMES:
        config = shrunk(published(name))
        numbers = [f for f, v in config.items() if isinstance(v, int | float) and not isinstance(v, bool)]
        check(
            name, config | dict.fromkeys(numbers, value), numbers, tmp_path_factory.getbasetemp() / "finite"
        )
