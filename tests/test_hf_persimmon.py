"""Persimmon (``PersimmonForCausalLM``: Persimmon-8B, Fuyu-8B's language model): GPT-NeoX's blocks in
turn, its fused [q, k, v] of each head, RoPE on half of each head (halves), each head's q and k
normalised by a LayerNorm with a bias shared by the heads (``qk_layernorm``), the squared ReLU.
Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), their parameter counts and greedy generation
through the ONNX bundle; import only (export-hf writes such a model as GPT-NeoX, which refuses q/k
norms by field). A row for every field of PersimmonConfig (tests/test_hf_fields.py's table and
check)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants, write
from test_hf_fields import (
    DELETE,
    FAMILIES,
    IDS,
    YARN,
    Case,
    Family,
    _pytest_cases,
    case,
    check,
    rope,
    uncovered,
)

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
PERSIMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=32,
)
FAMILIES["persimmon"] = Family(T.PersimmonConfig, T.PersimmonForCausalLM, "gpt2", PERSIMMON | TOKENS)


def persimmon(**fields: Any) -> Any:
    return T.PersimmonForCausalLM(T.PersimmonConfig(**PERSIMMON | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Persimmon-8B's shape, shrunk: q/k LayerNorms, half of each head turned at theta 25,000, relu2
    "persimmon": lambda: persimmon(rope_parameters={"rope_type": "default", "rope_theta": 25000.0}),
    # no q/k norms, the whole head turned, the tanh GELU, tied
    "persimmon_plain": lambda: persimmon(
        qk_layernorm=False,
        hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    ),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match(length=20)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    normed, plain = imported["persimmon"].spec.model, imported["persimmon_plain"].spec.model
    assert (normed.qk_norm, normed.norm.type, normed.norm.bias, normed.block.type) == (
        True,
        "layernorm",
        True,
        "sequential",
    )
    assert (normed.positional.layout, normed.positional.rotary_dims, normed.positional.theta) == (
        "halves",
        4,
        25000.0,
    )
    assert (normed.activation, normed.bias.qkv, normed.bias.attn_out, normed.tie_embeddings) == (
        "relu2",
        True,
        True,
        False,
    )
    assert (plain.qk_norm, plain.positional.rotary_dims, plain.activation, plain.tie_embeddings) == (
        False,
        8,
        "gelu_tanh",
        True,
    )


def test_export_hf_refuses_the_qk_norms_by_field(imported: dict[str, Imported], tmp_path: Path) -> None:
    with pytest.raises(HFError) as error:
        export_hf(imported["persimmon"].result.run_dir, tmp_path / "out")
    assert "model.qk_norm" in str(error.value) and "GPT-NeoX" in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["persimmon"], "PersimmonForSequenceClassification", tmp_path)


def test_a_feed_forward_dropout_is_said_to_drop_both_sublayers(tmp_path: Path) -> None:
    write(persimmon(hidden_dropout=0.1), "gpt2", tmp_path / "hf")
    with pytest.warns(HFWarning, match="hidden_dropout 0.1: Persimmon drops out its feed-forward"):
        result = import_folder(tmp_path / "hf", "dropout", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.dropout.residual == 0.1


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A Persimmon row: import only where the model has q/k norms (GPT-NeoX refuses them)."""
    return case("persimmon", **{"exported": False} | fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        tie_word_embeddings=True,
        hidden_act="gelu",
        layer_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={"tie_embeddings": True, "activation": "gelu", "norm.eps": 1e-2, "dropout.attention": 0.3},
    ),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="relu", spec={"activation": "relu"}, slow=True),
    row(json={"hidden_act": DELETE}, spec={"activation": "relu2"}, slow=True),  # PersimmonConfig's
    row(outcome="hidden_act", hidden_act="quick_gelu", slow=True),
    row(layer_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(attention_dropout=0.3, slow=True),  # training only
    row(hidden_dropout=0.3, spec={"dropout.residual": 0.3}, slow=True),  # training only, with a warning
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(intermediate_size=40, spec={"d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    # q/k norms: on by default; off, GPT-NeoX writes the model back
    row(qk_layernorm=False, spec={"qk_norm": False}, exported=True),
    row(json={"qk_layernorm": DELETE}, spec={"qk_norm": True}, slow=True),
    row(outcome="qk_layernorm", json={"qk_layernorm": None}, slow=True),
    # the RoPE: half of each head where no fraction is named
    row(
        json={"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
        spec={"positional.rotary_dims": 4},
    ),
    row(
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        slow=True,
    ),
    row(**rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5), slow=True),
    row(**rope(**YARN, partial_rotary_factor=0.5), spec={"positional.scaling.factor": 4.0}, slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="architectures", json={"architectures": ["PersimmonForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to PersimmonConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("persimmon", CASES) == set()
