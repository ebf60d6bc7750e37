"""Granite (``GraniteForCausalLM``, IBM Granite 3): LLaMA's blocks with muP-style multipliers,
``embedding_multiplier``, ``residual_multiplier`` and ``logits_scaling`` (the logits divided by it)
as the spec's ``embedding_multiplier``, ``residual_multiplier`` and ``logit_multiplier`` (its
inverse), and ``attention_multiplier`` as ``attention_scale`` (GraniteConfig's 1 where the config
leaves it out: q.k unscaled). Tiny random transformers models saved with save_pretrained,
imported, and held to transformers' logits (float32, rows padded on the right and not), their
parameter counts and greedy generation through the ONNX bundle; written back by export-hf
(tfcompile's own runs with multipliers or another attention scale too, or refused by field); a
row for every field of GraniteConfig (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants, max_difference
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

from tfcompile.hf import exporter
from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.models import DecoderLM
from tfcompile.spec import parse_spec
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=1)
GRANITE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
# Granite 3's multipliers for a width of 32 (its own: 12, 0.22, 8 and 1/128 at 2048)
SCALES = dict(
    embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0, attention_multiplier=0.125
)
FAMILIES["granite"] = Family(T.GraniteConfig, T.GraniteForCausalLM, "gpt2", GRANITE | TOKENS)


def granite(**fields: Any) -> Any:
    return T.GraniteForCausalLM(T.GraniteConfig(**GRANITE | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Granite 3's shape: grouped K/V heads, tied, its multipliers
    "granite": lambda: granite(tie_word_embeddings=True, **SCALES),
    # GraniteConfig's defaults (every multiplier 1: q.k unscaled), biases, untied, one K/V head
    "granite_defaults": lambda: granite(num_key_value_heads=1, attention_bias=True, mlp_bias=True),
    # a logits_scaling whose inverse is no power of two, a theta of its own
    "granite_scaled": lambda: granite(
        logits_scaling=3.0,
        embedding_multiplier=0.7,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0},
    ),
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
    plain, defaults = imported["granite"].spec.model, imported["granite_defaults"].spec.model
    assert (plain.embedding_multiplier, plain.residual_multiplier, plain.logit_multiplier) == (
        12.0,
        0.22,
        0.125,
    )
    assert (plain.attention_scale, plain.tie_embeddings, plain.n_kv_heads) == (0.125, True, 2)
    assert (defaults.embedding_multiplier, defaults.residual_multiplier, defaults.logit_multiplier) == (
        1,
        1,
        1,
    )
    assert (defaults.attention_scale, defaults.bias.qkv, defaults.bias.ffn) == (1.0, True, True)
    assert imported["granite_scaled"].spec.model.logit_multiplier == 1 / 3


def test_the_multipliers_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """The plain spec (every multiplier 1, the default scale) computes other logits."""
    variant = imported["granite"]
    plain = variant.spec.model.model_copy(
        update={"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "logit_multiplier": 1.0}
    )
    other = DecoderLM(plain).eval()
    other.load_state_dict(variant.model.state_dict())
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (variant.model(ids) - other(ids)).abs().max() > 1e-2


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "GraniteForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["granite"], "GraniteForSequenceClassification", tmp_path)


# ----------------------------------------------------------- tfcompile's own runs written as Granite

BASE = "family: decoder, vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 16, n_layers: 2"
LLAMA = f"{BASE}, norm: {{type: rmsnorm}}, activation: swiglu"
# Runs with multipliers or an attention scale of their own: interleaved RoPE (permuted to
# transformers' halves) or halves, grouped K/V heads, biases as zeros where the run has some.
WRITTEN = {
    "interleaved, grouped, multipliers, q/k/v biases": f"{LLAMA}, n_kv_heads: 2, positional: rope, "
    "residual_multiplier: 0.5, embedding_multiplier: 4, logit_multiplier: 0.25, "
    "bias: {qkv: true, attn_out: false, ffn: false}",
    "halves, an attention scale of its own, untied": f"{LLAMA}, positional: {{type: rope, layout: halves}}, "
    "attention_scale: 0.3, tie_embeddings: false, bias: {qkv: false, attn_out: false, ffn: true}",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_run_with_multipliers_is_written_as_granite(kind: str, tmp_path: Path) -> None:
    text = f"model: {{{WRITTEN[kind]}}}\n"
    assert exporter.candidates(parse_spec(text)) == [ARCHITECTURES["granite"]]
    run = random_run(tmp_path, text)
    assert export_hf(run, tmp_path / "out") == "GraniteForCausalLM"
    hf = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    for padded in (False, True):
        assert max_difference(hf, load_trained_model(run)[1], padded, length=16) <= 1e-5


def test_what_granite_cannot_compute_is_refused_by_field(tmp_path: Path) -> None:
    model = f"{LLAMA}, positional: rope, residual_multiplier: 2, qk_norm: true, window: {{size: 4}}"
    run = random_run(tmp_path, f"model: {{{model}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == ["model.qk_norm", "model.window"]
    assert "Granite" in str(error.value)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("granite", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        **SCALES,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "bias.ffn": True,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "logit_multiplier": 0.125,
            "attention_scale": 0.125,
        },
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    # a window and layer_types in config.json, which GraniteConfig does not read: transformers' forward
    # attends over every position, its generation cache keeps the last 4 of the sliding layers: refused
    row(
        outcome="sliding_window",
        json={"sliding_window": 4, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True},
        slow=True,
    ),
    # the multipliers: each alone, GraniteConfig's 1s, values the spec cannot hold
    row(embedding_multiplier=12.0, spec={"embedding_multiplier": 12.0}, slow=True),
    row(residual_multiplier=0.22, spec={"residual_multiplier": 0.22}, slow=True),
    row(logits_scaling=8.0, spec={"logit_multiplier": 0.125}, slow=True),
    row(logits_scaling=0.5, spec={"logit_multiplier": 2.0}, slow=True),
    row(attention_multiplier=0.0078125, spec={"attention_scale": 0.0078125}),
    row(attention_multiplier=0.125, spec={"attention_scale": 0.125}, slow=True),
    row(
        json=dict.fromkeys(
            ("embedding_multiplier", "residual_multiplier", "logits_scaling", "attention_multiplier"), DELETE
        ),
        spec={"embedding_multiplier": 1.0, "logit_multiplier": 1.0, "attention_scale": 1.0},
        slow=True,
    ),
    row(outcome="logits_scaling", json={"logits_scaling": 0}),  # transformers: inf and nan logits
    row(outcome="logits_scaling", json={"logits_scaling": -2.0}, slow=True),
    row(outcome="embedding_multiplier", json={"embedding_multiplier": -1.0}, slow=True),
    row(outcome="residual_multiplier", json={"residual_multiplier": 0.0}, slow=True),
    row(outcome="attention_multiplier", json={"attention_multiplier": -0.1}, slow=True),
    row(attention_dropout=0.3, slow=True),
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="architectures", json={"architectures": ["GraniteForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to GraniteConfig fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    assert uncovered("granite", CASES) == set()
