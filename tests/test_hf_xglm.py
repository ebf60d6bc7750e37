"""XGLM (``XGLMForCausalLM``): fairseq's pre-LayerNorm decoder with a final norm, embeddings scaled
by sqrt(d_model), fixed sinusoids (tensor2tensor's frequencies in halves, position p encoded as
p + 2). Tiny random transformers models saved with save_pretrained, imported, and held to
transformers' logits (float32, rows padded on the right, on the left and not), their parameter
counts and greedy generation through the ONNX bundle; export-hf writes them back as XGLM, and
tfcompile's own decoders of those sinusoids too. A row for every field of XGLMConfig
(tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
import shutil
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
from tokenizers import Tokenizer

from tfcompile.hf import exporter
from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
XGLM = dict(
    vocab_size=VOCAB, d_model=16, num_layers=2, attention_heads=2, ffn_dim=24, max_position_embeddings=32
)
FAMILIES["xglm"] = Family(T.XGLMConfig, T.XGLMForCausalLM, "gpt2", XGLM | TOKENS)


def xglm(**fields: Any) -> Any:
    return T.XGLMForCausalLM(T.XGLMConfig(**XGLM | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # XGLM's shape, shrunk: scaled embeddings, erf GELU, tied
    "xglm": xglm,
    # unscaled, ReLU, untied
    "xglm_plain": lambda: xglm(scale_embedding=False, activation_function="relu", tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match(length=20)


def test_a_left_padded_row_gives_the_logits_transformers_gives_it_alone(
    imported: dict[str, Imported],
) -> None:
    """Positions count the real tokens before each, as generate() passes them (the forward without
    position_ids counts the columns)."""
    imported["xglm"].assert_left_padded_match(positions=True)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    scaled, plain = imported["xglm"].spec.model, imported["xglm_plain"].spec.model
    positional = scaled.positional
    assert (positional.type, positional.layout, positional.spacing, positional.offset) == (
        "sinusoidal",
        "halves",
        "tensor2tensor",
        2,
    )
    assert (scaled.scale_embeddings, scaled.activation, scaled.tie_embeddings, scaled.norm.eps) == (
        True,
        "gelu",
        True,
        1e-5,
    )
    assert (plain.scale_embeddings, plain.activation, plain.tie_embeddings) == (False, "relu", False)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "XGLMForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


SINUSOIDS = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 16, "
    "positional: {type: sinusoidal, layout: halves, spacing: tensor2tensor, offset: 2}, "
    "activation: gelu_tanh, tie_embeddings: false"
)


def test_a_run_of_fixed_sinusoids_is_written_as_xglm(tmp_path: Path) -> None:
    """Which no architecture wrote before."""
    run = random_run(tmp_path, f"model: {{{SINUSOIDS}}}\n")
    spec = load_trained_model(run)[0]
    assert [type(a).__name__ for a in exporter.candidates(spec)] == ["XGLM"]
    assert export_hf(run, tmp_path / "out") == "XGLMForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_xglm_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    run = random_run(
        tmp_path,
        "model: {family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 16, "
        "positional: sinusoidal, norm: {position: post}, n_kv_heads: 2, window: {size: 4}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    fields = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    named = [
        "model.window",
        "model.positional.layout",
        "model.positional.spacing",
        "model.positional.offset",
        "model.norm.position",
        "model.norm.final",
        "model.n_kv_heads",
    ]
    assert fields == named, str(error.value)
    assert "XGLM" in str(error.value) and not (tmp_path / "out").exists()


def test_a_pad_id_that_takes_a_positions_encoding_is_refused_on_export(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """XGLM zeroes its position table's row pad_token_id: a run whose pad token has id 2 or more
    (within the table) would lose a position's encoding there; nothing is written."""
    run = tmp_path / "run"
    shutil.copytree(imported["xglm"].result.run_dir, run)
    token = Tokenizer.from_file(str(run / "tokenizer.json")).id_to_token(5)
    spec_file = run / "spec.yaml"
    spec_file.write_text(spec_file.read_text().replace("\n  pad: a\n", f"\n  pad: {token}\n"))
    with pytest.raises(HFError, match=r"  tokens\.pad: is 5: XGLM zeroes its position table's row 5, "):
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pad", [2, 33, -1, 34, -35])
def test_a_pad_id_that_takes_a_positions_encoding_or_breaks_the_table_is_refused(
    pad: int, tmp_path: Path
) -> None:
    """Rows 2 to 33 of the 34 encode positions 0 to 31 (-1 is row 33); 34 and -35 lie past the
    table, where transformers fails to build the model."""
    check(case("xglm", outcome="pad_token_id", json={"pad_token_id": pad}), tmp_path)


def test_another_head_class_is_refused_by_name(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["xglm"], "XGLMModel", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


# ------------------------------------------------------------------ every config field, by value

CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        "xglm",
        activation_function="gelu_new",
        scale_embedding=False,
        tie_word_embeddings=False,
        dropout=0.3,
        attention_dropout=0.2,
        activation_dropout=0.4,
        init_std=0.5,
        layerdrop=0.2,
        spec={"activation": "gelu_tanh", "scale_embeddings": False, "tie_embeddings": False},
    ),
    case("xglm", scale_embedding=False, spec={"scale_embeddings": False}, slow=True),
    case("xglm", activation_function="relu", spec={"activation": "relu"}, slow=True),
    case("xglm", outcome="activation_function", activation_function="quick_gelu"),
    case("xglm", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case(
        "xglm",
        dropout=0.3,
        attention_dropout=0.2,
        spec={"dropout.embedding": 0.3, "dropout.residual": 0.3, "dropout.attention": 0.2},
        slow=True,
    ),
    case("xglm", activation_dropout=0.5, slow=True),  # training only, not read
    case("xglm", layerdrop=0.3, slow=True),  # training only (a warning says so)
    case("xglm", init_std=0.5, spec={"init_std": 0.5}, slow=True),
    case("xglm", init_std=0.0, spec={"init_std": 0.02}, slow=True),  # initialisation only
    case("xglm", outcome="pad_token_id", **IDS),  # pad id 3: row 3, position 1's encoding
    case("xglm", pad_token_id=0, eos_token_id=4, decoder_start_token_id=3, slow=True),
    case("xglm", pad_token_id=None, slow=True),
    case("xglm", json={"pad_token_id": DELETE}, slow=True),  # the config class's 1
    case("xglm", outcome="add_cross_attention", add_cross_attention=True),
    case("xglm", use_cache=False, slow=True),
    case("xglm", max_position_embeddings=8, spec={"max_seq_len": 8}, length=8, slow=True),
    case("xglm", attention_heads=1, slow=True),
    case("xglm", attention_heads=8, slow=True),
    case("xglm", num_layers=1, spec={"n_layers": 1}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to XGLMConfig fails this until a row of CASES says what it does (or
    the family's tiny base sets it)."""
    assert uncovered("xglm", CASES) == set()


@pytest.mark.parametrize(("family", "value"), every_activation("xglm"))
def test_every_activation_name_is_computed_alike_or_refused_by_name(
    family: str, value: str, tmp_path: Path
) -> None:
    check_activation(family, "activation_function", value, tmp_path)
