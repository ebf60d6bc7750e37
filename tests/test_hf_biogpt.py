"""BioGPT (``BioGptForCausalLM``): OPT's pre-LayerNorm blocks with a final norm, embeddings scaled
by sqrt(hidden_size), learned positions from row 2 of their table. Tiny random transformers models
saved with save_pretrained, imported, and held to transformers' logits (float32, rows padded on
the right, on the left and not), their parameter counts and greedy generation through the ONNX
bundle; export-hf writes them back (as BioGPT where the embeddings are scaled, else as GPT-2), and
tfcompile's own decoders of learned positions and scaled embeddings too. A row for every field of
BioGptConfig (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import random_run
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants
from test_hf_export import _loads_alike
from test_hf_fields import (
    DELETE,
    FAMILIES,
    IDS,
    Case,
    Family,
    _pytest_cases,
    case,
    check,
    check_activation,
    every_activation,
    uncovered,
)

from tfcompile.hf import exporter
from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
BIOGPT = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=32,
)
FAMILIES["biogpt"] = Family(T.BioGptConfig, T.BioGptForCausalLM, "gpt2", BIOGPT | TOKENS)


def biogpt(**fields: Any) -> Any:
    return T.BioGptForCausalLM(T.BioGptConfig(**BIOGPT | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # BioGPT's shape, shrunk: scaled embeddings, erf GELU, tied
    "biogpt": biogpt,
    # unscaled, ReLU, untied: GPT-2's blocks
    "biogpt_plain": lambda: biogpt(scale_embedding=False, hidden_act="relu", tie_word_embeddings=False),
}
WRITTEN_AS = {"biogpt": "BioGptForCausalLM", "biogpt_plain": "GPT2LMHeadModel"}  # by export-hf


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match(length=20)


def test_a_left_padded_row_gives_the_logits_transformers_gives_it_alone(
    imported: dict[str, Imported],
) -> None:
    """Positions count the real tokens before each (transformers 4's forward, and 5's generate(),
    which passes them; 5's forward without position_ids counts the columns)."""
    imported["biogpt"].assert_left_padded_match(positions=True)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    """Less the two position rows before position 0's: only padding reads them (position -1)."""
    variant = imported[name]
    variant.assert_counts_match(2 * variant.hf.config.hidden_size)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    scaled, plain = imported["biogpt"].spec.model, imported["biogpt_plain"].spec.model
    assert (scaled.scale_embeddings, scaled.activation, scaled.tie_embeddings, scaled.norm.eps) == (
        True,
        "gelu",
        True,
        1e-5,
    )
    assert (scaled.positional.type, scaled.norm.position, scaled.norm.final) == ("learned", "pre", True)
    assert (plain.scale_embeddings, plain.activation, plain.tie_embeddings) == (False, "relu", False)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == WRITTEN_AS[name]
    _loads_alike(tmp_path / "out", variant.model)


SCALED = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 16, "
    "positional: learned, scale_embeddings: true, activation: gelu_tanh, tie_embeddings: false"
)


def test_a_run_of_learned_positions_and_scaled_embeddings_is_written_as_biogpt(tmp_path: Path) -> None:
    """Which no architecture wrote before (GPT-2 has no scale on its embeddings)."""
    run = random_run(tmp_path, f"model: {{{SCALED}}}\n")
    spec = load_trained_model(run)[0]
    assert [type(a).__name__ for a in exporter.candidates(spec)] == ["BioGpt"]
    assert export_hf(run, tmp_path / "out") == "BioGptForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_biogpt_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    run = random_run(
        tmp_path,
        f"model: {{{SCALED}, norm: {{type: rmsnorm}}, n_kv_heads: 2, "
        "dropout: {embedding: 0.1, residual: 0.2}, head_dim: 4}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    fields = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    named = [
        "model.norm.type",
        "model.norm.bias",
        "model.n_kv_heads",
        "model.dropout.embedding",
        "model.head_dim",
    ]
    assert fields == named, str(error.value)
    assert "BioGPT" in str(error.value) and not (tmp_path / "out").exists()


def test_another_head_class_is_refused_by_name(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["biogpt"], "BioGptForSequenceClassification", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


# ------------------------------------------------------------------ every config field, by value

CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        "biogpt",
        hidden_act="gelu_new",
        scale_embedding=False,
        tie_word_embeddings=False,
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.2,
        activation_dropout=0.4,
        initializer_range=0.5,
        layerdrop=0.2,
        layer_norm_eps=1e-2,
        spec={"activation": "gelu_tanh", "scale_embeddings": False, "tie_embeddings": False},
    ),
    case("biogpt", scale_embedding=False, spec={"scale_embeddings": False}, slow=True),
    case("biogpt", hidden_act="relu", spec={"activation": "relu"}, slow=True),
    case("biogpt", outcome="hidden_act", hidden_act="quick_gelu"),
    case("biogpt", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case(
        "biogpt",
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.2,
        spec={"dropout.embedding": 0.3, "dropout.residual": 0.3, "dropout.attention": 0.2},
        slow=True,
    ),
    case("biogpt", activation_dropout=0.5, slow=True),  # training only, not read
    case("biogpt", layerdrop=0.3, slow=True),  # training only (a warning says so)
    case("biogpt", layer_norm_eps=1e-2, spec={"norm.eps": 1e-5}, slow=True),  # no LayerNorm reads it
    case("biogpt", initializer_range=0.5, spec={"init_std": 0.5}, slow=True),
    case("biogpt", initializer_range=0.0, spec={"init_std": 0.02}, slow=True),  # initialisation only
    case("biogpt", **IDS, slow=True),  # pad_token_id: the embedding's padding row is a row like the others
    case("biogpt", pad_token_id=None, slow=True),
    case("biogpt", outcome="pad_token_id", json={"pad_token_id": VOCAB}),  # transformers fails to build
    case("biogpt", json={"pad_token_id": DELETE}, slow=True),  # the config class's 1
    case("biogpt", use_cache=False, slow=True),
    case("biogpt", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("biogpt", num_attention_heads=1, slow=True),
    case("biogpt", num_attention_heads=8, slow=True),
    case("biogpt", outcome="num_attention_heads", json={"num_attention_heads": 3}),  # nor does transformers
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to BioGptConfig fails this until a row of CASES says what it does (or
    the family's tiny base sets it)."""
    assert uncovered("biogpt", CASES) == set()


@pytest.mark.parametrize(("family", "value"), every_activation("biogpt"))
def test_every_activation_name_is_computed_alike_or_refused_by_name(
    family: str, value: str, tmp_path: Path
) -> None:
    check_activation(family, "hidden_act", value, tmp_path)
