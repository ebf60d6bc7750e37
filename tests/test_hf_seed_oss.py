"""Seed-OSS (``SeedOssForCausalLM``, ByteDance): LLaMA's blocks with ``attention_bias`` on q, k and
v only (on by default) and the output projection's bias read apart (``attention_out_bias``), and
SeedOssConfig's defaults (heads 128 wide, d_model / heads where null). Its ``residual_dropout``
(training only) is not read. Tiny random transformers models saved with save_pretrained, imported,
and held to transformers' logits (float32, rows padded on the right and not), their parameter
counts and greedy generation through the ONNX bundle. export-hf writes no Seed-OSS: it writes the
import as Llama (biases of zeros where the model has some but not others), which transformers
reloads to the same logits. A row for every field of SeedOssConfig (tests/test_hf_fields.py's
table and check)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants
from test_hf_export import _loads_alike
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

from tfcompile.hf.exporter import export_hf

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
SEED_OSS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # SeedOssConfig's 128 is not hidden_size / heads
    max_position_embeddings=32,
)
FAMILIES["seed_oss"] = Family(T.SeedOssConfig, T.SeedOssForCausalLM, "gpt2", SEED_OSS | TOKENS)


def seed_oss(**fields: Any) -> Any:
    return T.SeedOssForCausalLM(T.SeedOssConfig(**SEED_OSS | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Seed-OSS-36B's shape, shrunk: q/k/v biases (SeedOssConfig's default), none on o, untied
    "seed_oss": lambda: seed_oss(),
    # every bias: q/k/v, o and the feed-forward's; tied, a RoPE theta of its own
    "seed_oss_biases": lambda: seed_oss(
        attention_out_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0},
    ),
    # the output projection's bias alone, wider heads than d_model / heads
    "seed_oss_out_bias": lambda: seed_oss(attention_bias=False, attention_out_bias=True, head_dim=16),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, every = imported["seed_oss"].spec.model, imported["seed_oss_biases"].spec.model
    out = imported["seed_oss_out_bias"].spec.model
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.tie_embeddings) == (
        True,
        False,
        False,
        False,
    )
    assert (plain.positional.layout, plain.dropout.attention, plain.dropout.residual) == ("halves", 0.1, 0.0)
    assert (every.bias.qkv, every.bias.attn_out, every.bias.ffn, every.tie_embeddings) == (
        True,
        True,
        True,
        True,
    )
    assert (out.bias.qkv, out.bias.attn_out, out.head_dim) == (False, True, 16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_as_llama_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "LlamaForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["seed_oss"], "SeedOssForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("seed_oss", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=False,
        attention_out_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        residual_dropout=0.0,
        initializer_range=0.5,
        pretraining_tp=2,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": False,
            "bias.attn_out": True,
            "bias.ffn": True,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
        },
    ),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    # K/V heads left out: SeedOssConfig's 8, more than the 4 heads
    row(outcome="num_key_value_heads", json={"num_key_value_heads": DELETE}, slow=True),
    row(attention_bias=False, spec={"bias.qkv": False, "bias.attn_out": False}, slow=True),
    row(json={"attention_bias": DELETE}, spec={"bias.qkv": True}),  # SeedOssConfig's True
    # a null flag whose default is true: transformers 4 reads false, 5 refuses it
    row(outcome="attention_bias", json={"attention_bias": None}, slow=True),
    row(attention_out_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    row(head_dim=None, spec={"head_dim": 8}),  # null: hidden_size / heads, as SeedOssConfig derives it
    row(attention_dropout=0.3, slow=True),  # training only
    row(json={"attention_dropout": DELETE}, spec={"dropout.attention": 0.1}, slow=True),  # SeedOssConfig's
    row(residual_dropout=0.5, spec={"dropout.residual": 0.0}, slow=True),  # training only, not read
    row(initializer_range=0.5, slow=True),
    row(pretraining_tp=2, slow=True),  # transformers 4's; 5 computes as one
    row(outcome="pretraining_tp", json={"pretraining_tp": 0}, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # a window and layer_types in config.json, which SeedOssConfig does not read: transformers' forward
    # attends over every position, its generation cache keeps the last 4 of the sliding layers: refused
    row(
        outcome="sliding_window",
        json={"sliding_window": 4, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True},
        slow=True,
    ),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 10000.0}, slow=True),  # the class's
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["SeedOssForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to SeedOssConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("seed_oss", CASES) == set()
