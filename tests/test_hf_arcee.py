"""Arcee (``ArceeForCausalLM``, AFM-4.5B): LLaMA's blocks with a plain feed-forward (``up_proj``,
the activation, ``down_proj``: no gate), ArceeConfig's squared ReLU by default (``activation:
relu2``), ``attention_bias`` on q, k, v and o, ``mlp_bias``. Tiny random transformers models saved
with save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right
and not), their parameter counts and greedy generation through the ONNX bundle; export-hf writes
them back as Arcee, and tfcompile's own RoPE decoders of a plain feed-forward too. A row for every
field of ArceeConfig (tests/test_hf_fields.py's table and check)."""

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
    YARN,
    Case,
    Family,
    _pytest_cases,
    case,
    check,
    longrope,
    rope,
    uncovered,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
ARCEE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
FAMILIES["arcee"] = Family(T.ArceeConfig, T.ArceeForCausalLM, "gpt2", ARCEE | TOKENS)


def arcee(**fields: Any) -> Any:
    return T.ArceeForCausalLM(T.ArceeConfig(**ARCEE | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # AFM-4.5B's shape, shrunk: the squared ReLU, grouped K/V heads, untied, YaRN
    "arcee": lambda: arcee(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
    # biases on every projection, the tanh GELU, one K/V head, tied
    "arcee_biases": lambda: arcee(
        attention_bias=True,
        mlp_bias=True,
        hidden_act="gelu_pytorch_tanh",
        num_key_value_heads=1,
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
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, biased = imported["arcee"].spec.model, imported["arcee_biases"].spec.model
    assert (plain.activation, plain.gated, plain.bias.qkv, plain.bias.ffn, plain.tie_embeddings) == (
        "relu2",
        False,
        False,
        False,
        False,
    )
    assert (biased.activation, biased.bias.qkv, biased.bias.attn_out, biased.bias.ffn) == (
        "gelu_tanh",
        True,
        True,
        True,
    )
    assert (biased.n_kv_heads, biased.tie_embeddings, biased.d_ff) == (1, True, 48)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "ArceeForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


# tfcompile's own RoPE decoders of a plain feed-forward: written as Arcee
NATIVE = {
    "interleaved, relu, untied": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, "
    "n_kv_heads: 2, max_seq_len: 16, norm: {type: rmsnorm}, activation: relu, tie_embeddings: false, "
    "positional: rope, bias: {qkv: false, attn_out: false, ffn: false}",
    "halves, erf GELU, q/k/v biases": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, "
    "n_heads: 2, max_seq_len: 16, norm: {type: rmsnorm, eps: 1.0e-3}, activation: gelu, "
    "positional: {type: rope, layout: halves, theta: 500}, bias: {qkv: true, attn_out: false, ffn: true}",
}


@pytest.mark.parametrize("kind", list(NATIVE))
def test_a_run_of_a_plain_feed_forward_is_written_as_arcee(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{NATIVE[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "ArceeForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_arcee_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    run = random_run(
        tmp_path,
        "model: {family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, "
        "norm: {type: rmsnorm}, activation: relu2, qk_norm: true, window: {size: 4}, positional: rope}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    fields = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert fields == ["model.qk_norm", "model.window"], str(error.value)
    assert "Arcee" in str(error.value) and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["arcee"], "ArceeForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("arcee", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        hidden_act="silu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "bias.ffn": True,
            "tie_embeddings": True,
            "activation": "silu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
        },
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=4, json={"num_key_value_heads": DELETE}, spec={"n_kv_heads": 4}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    # the activation: ArceeConfig's squared ReLU where left out; any plain one transformers has
    row(json={"hidden_act": DELETE}, spec={"activation": "relu2"}, slow=True),
    row(hidden_act="relu", spec={"activation": "relu"}, slow=True),
    row(hidden_act="gelu", spec={"activation": "gelu"}, slow=True),
    row(hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}),  # ArceeConfig's, not LlamaConfig's
    row(head_dim=16, spec={"head_dim": 16}, slow=True),  # heads of their own width
    row(json={"head_dim": DELETE}, spec={"head_dim": 8}, slow=True),
    row(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    row(attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(intermediate_size=40, spec={"d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # a window in config.json, which ArceeConfig does not read: transformers' forward attends over every
    # position, its generation cache keeps the last 4 (refused); a window of the whole context is none
    row(outcome="sliding_window", json={"sliding_window": 4, "use_sliding_window": True}, slow=True),
    row(json={"sliding_window": 32, "use_sliding_window": True}, spec={"window": None}, slow=True),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), spec={"positional.scaling.factor": 4.0}),
    row(**rope(**longrope()), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["ArceeForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to ArceeConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("arcee", CASES) == set()
