"""Ministral 3 (``Ministral3ForCausalLM``, and the language model of the Ministral 3 checkpoints'
``Mistral3ForConditionalGeneration``): Mistral's blocks (a window on every layer where one is set)
under YaRN by default, each query scaled after RoPE by 1 + beta ln(1 + floor(m / L)) at position m
(``positional.query_scaling``: beta the RoPE dict's ``llama_4_scaling_beta``, L its
``original_max_position_embeddings``).

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right, on the left with generate()'s positions, and not) past
several lengths L, parameter counts and greedy generation through the ONNX bundle (KV cache);
export-hf writes them back as Ministral 3, and refuses a query scaling elsewhere by field; a row
for every field of the config class."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import (
    VOCAB,
    Imported,
    assert_export_refused,
    assert_head_refused,
    assert_round_trips,
    edited,
    imported_variants,
    own_run_written,
)
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError
from tfcompile.hf.importer import import_folder
from tfcompile.nn.positional import RotaryPositional
from tfcompile.spec import parse_spec

transformers = pytest.importorskip("transformers")
T = transformers

# Ministral3Config's RoPE, its original length shrunk to 4 so that rows of 20 cross four steps
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 4,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.5,
}
MINISTRAL3 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=32,
    rope_parameters=YARN,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
FAMILIES["ministral3"] = Family(T.Ministral3Config, T.Ministral3ForCausalLM, "gpt2", MINISTRAL3)


def model(**fields: Any) -> Any:
    return T.Ministral3ForCausalLM(T.Ministral3Config(**MINISTRAL3 | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Ministral-3's RoPE and scaling, shrunk
    "ministral3": lambda: model(),
    # no RoPE scaling, a sharper query scaling of steps of 3, a window of 6 on every layer, tied
    "ministral3_window": lambda: model(
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 500.0,
            "original_max_position_embeddings": 3,
            "llama_4_scaling_beta": 1.0,
        },
        sliding_window=6,
        tie_word_embeddings=True,
    ),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match(length=20)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_left_padded_batch_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    """Each row's queries scaled by its own positions, as generate() numbers them."""
    imported[name].assert_left_padded_match(positions=True)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, window = imported["ministral3"].spec.model, imported["ministral3_window"].spec.model
    assert plain.positional.query_scaling.model_dump() == {"beta": 0.5, "length": 4}  # type: ignore[union-attr]
    assert plain.positional.scaling.type == "yarn"  # type: ignore[union-attr]
    assert window.positional.query_scaling.model_dump() == {"beta": 1.0, "length": 3}  # type: ignore[union-attr]
    assert window.window is not None and window.window.size == 6 and window.sliding_layers == {0, 1}


def test_the_query_scale_is_the_formula() -> None:
    """1 + beta ln(1 + floor(m / L)): 1 within the first L positions, per row of positions."""
    spec = parse_spec(
        "model: {family: decoder, vocab_size: 16, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 40, "
        "positional: {type: rope, query_scaling: {beta: 0.25, length: 8}}}\n"
    )
    rope = spec.model.positional
    assert rope.query_scaling is not None  # type: ignore[union-attr]
    from tfcompile.nn.positional import PositionalDims

    positional = RotaryPositional(rope, PositionalDims(16, 2, 8, 40, bidirectional=False))  # type: ignore[arg-type]
    positions = torch.tensor([[0, 7, 8, 15, 16, 39], [0, 0, 0, 1, 2, 3]])
    scale = positional.rotary(positions).query_scale
    assert scale is not None and scale.shape == (2, 6, 1)
    expected = [[1 + 0.25 * math.log(1 + m // 8) for m in row] for row in positions.tolist()]
    torch.testing.assert_close(scale[..., 0], torch.tensor(expected))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    assert_round_trips(imported[name], "Ministral3ForCausalLM", tmp_path)


LLAMA_LIKE = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "norm: {type: rmsnorm}, activation: swiglu, d_ff: 48, bias: {qkv: false, attn_out: false, ffn: false}"
)


def test_a_run_of_tfcompiles_own_query_scaling_is_written_as_ministral3(tmp_path: Path) -> None:
    positional = "positional: {type: rope, query_scaling: {beta: 0.3, length: 5}}"
    ours, again = own_run_written(f"{LLAMA_LIKE}, {positional}", "Ministral3ForCausalLM", tmp_path)
    assert again.positional.query_scaling == ours.positional.query_scaling


@pytest.mark.parametrize(
    ("extra", "fields", "written"),
    [
        (
            "positional: {type: rope, query_scaling: {beta: 0.3, length: 5}, "
            "scaling: {type: yarn, factor: 2.0, original_max_position_embeddings: 12}}",
            ["model.positional.query_scaling.length"],
            "Ministral 3",
        ),
        (
            "positional: {type: rope, query_scaling: {beta: 0.3, length: 5}, "
            "scaling: {type: dynamic, factor: 2.0, original_max_position_embeddings: 24}}",
            ["model.positional.scaling"],
            "Ministral 3",
        ),
        (
            "positional: {type: rope, query_scaling: {beta: 0.3, length: 5}}, window: {size: 4, layers: [0]}",
            ["model.window.layers"],
            "Ministral 3",
        ),
        (
            "positional: {type: rope, query_scaling: {beta: 0.3, length: 5}}, moe: {experts: 4}",
            ["model.moe"],
            "Ministral 3",
        ),
    ],
    ids=["another-original-length", "dynamic", "some-layers-slide", "experts"],
)
def test_what_ministral3_cannot_express_is_refused_by_field(
    extra: str, fields: list[str], written: str, tmp_path: Path
) -> None:
    assert_export_refused(f"{LLAMA_LIKE}, {extra}", fields, written, tmp_path)


@pytest.mark.parametrize(
    ("rope", "named"),
    [
        (
            {k: v for k, v in YARN.items() if k != "llama_4_scaling_beta"},
            "rope_parameters.llama_4_scaling_beta",
        ),
        (YARN | {"llama_4_scaling_beta": -0.1}, "rope_parameters.llama_4_scaling_beta"),
    ],
    ids=["no-beta", "negative-beta"],
)
def test_a_query_scaling_transformers_cannot_run_or_the_spec_cannot_hold_is_refused_by_name(
    imported: dict[str, Imported], rope: dict[str, Any], named: str, tmp_path: Path
) -> None:
    folder = edited(imported, "ministral3", tmp_path, rope_parameters=rope)
    with pytest.raises(HFError, match=rf"  {re.escape(named)}"):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wrong").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["ministral3"], "Ministral3ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value

F = "ministral3"
CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        F,
        num_key_value_heads=1,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={"n_kv_heads": 1, "activation": "geglu", "norm.eps": 1e-2, "dropout.attention": 0.3},
    ),
    # null: Ministral3Config's 8 (transformers 5 refuses it), more than the heads
    case(F, outcome="num_key_value_heads", json={"num_key_value_heads": None}, slow=True),
    case(F, outcome="num_key_value_heads", num_key_value_heads=3),
    case(F, outcome="hidden_act", hidden_act="relu", slow=True),
    case(F, tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    case(F, use_cache=False, slow=True),
    case(F, slow=True, **IDS),
    case(F, pad_token_id=None, slow=True),
    case(F, max_position_embeddings=24, spec={"max_seq_len": 24}, slow=True),
    case(F, intermediate_size=24, spec={"d_ff": 24}, slow=True),
    case(F, vocab_size=VOCAB, slow=True),
    case(F, head_dim=16, spec={"head_dim": 16}, slow=True),
    case(F, hidden_size=64, num_attention_heads=8, head_dim=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    case(F, num_hidden_layers=1, slow=True),
    case(F, sliding_window=5, spec={"window.size": 5}),
    case(F, sliding_window=None, spec={"window": None}, slow=True),
    case(
        F,
        rope_parameters=YARN | {"llama_4_scaling_beta": 0.0},
        spec={"positional.query_scaling.beta": 0.0},
        slow=True,
    ),
    case(
        F,
        rope_parameters=YARN | {"original_max_position_embeddings": 8, "factor": 4.0},
        spec={"positional.query_scaling.length": 8, "positional.scaling.original_max_position_embeddings": 8},
        slow=True,
    ),
    case(F, outcome="architectures", json={"architectures": ["Ministral3ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Ministral3Config fails this until a row of CASES says what it
    does (or the tiny base sets it)."""
    assert uncovered("ministral3", CASES) == set()
