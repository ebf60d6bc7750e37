"""Helium (``HeliumForCausalLM``, Kyutai): LLaMA's blocks turning interleaved pairs of each head
(``layout: interleaved``, the q and k rows as saved), ``attention_bias`` on q, k and v only (its
output projection has none), and HeliumConfig's defaults (an epsilon of 1e-8, a RoPE theta of
100000, heads 128 wide). Tiny random transformers models saved with save_pretrained, imported, and
held to transformers' logits (float32, rows padded on the right and not), their parameter counts
and greedy generation through the ONNX bundle. export-hf writes no Helium: it writes the import as
Llama (the q and k rows permuted to its halves, an output bias of zeros), which transformers
reloads to the same logits. Heads whose total width is not hidden_size (transformers' forward
fails) are refused by field. A row for every field of HeliumConfig (tests/test_hf_fields.py's
table and check)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
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

from tfcompile.hf.exporter import export_hf

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not. A pad id of its own: its
# embedding row, zeros as transformers initialises it, is normalised at HeliumConfig's epsilon of
# 1e-8, which the exported graph keeps (the exporter's optimizer once dropped it: 0 / 0).
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
HELIUM = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # HeliumConfig's 128 is hidden_size / heads of its own 2560 over 20
    max_position_embeddings=32,
)
FAMILIES["helium"] = Family(T.HeliumConfig, T.HeliumForCausalLM, "gpt2", HELIUM | TOKENS)


def helium(**fields: Any) -> Any:
    return T.HeliumForCausalLM(T.HeliumConfig(**HELIUM | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Helium-1's shape, shrunk: a K/V head per head, no biases, an untied head
    "helium": lambda: helium(num_key_value_heads=4),
    # grouped K/V heads, q/k/v and feed-forward biases, tied, a RoPE theta of its own
    "helium_biases": lambda: helium(
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
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
    plain, biased = imported["helium"].spec.model, imported["helium_biases"].spec.model
    assert (plain.positional.layout, plain.positional.theta, plain.norm.eps) == (
        "interleaved",
        100000.0,
        1e-8,
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.tie_embeddings) == (
        False,
        False,
        False,
        False,
    )
    assert (biased.bias.qkv, biased.bias.attn_out, biased.bias.ffn, biased.tie_embeddings) == (
        True,
        False,
        True,
        True,
    )
    assert (biased.positional.layout, biased.n_kv_heads, biased.window) == ("interleaved", 2, None)


def test_the_interleaved_pairs_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """The same weights turned in halves (LLaMA's pairs) differ: the layout is what the import holds."""
    variant = imported["helium"]
    llama = T.LlamaForCausalLM(T.LlamaConfig(**variant.hf.config.to_dict() | {"model_type": "llama"}))
    llama.load_state_dict(variant.hf.state_dict())
    assert max_difference(llama.eval(), variant.model, False) > 1e-3


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
    assert_head_refused(imported["helium"], "HeliumForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("helium", **fields)


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
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": False,
            "bias.ffn": True,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "positional.layout": "interleaved",
        },
    ),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    # K/V heads left out: HeliumConfig's 20, more than the 4 heads
    row(outcome="num_key_value_heads", json={"num_key_value_heads": DELETE}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": False}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
    row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-8}),  # HeliumConfig's, not LlamaConfig's
    # heads of another total width than hidden_size: HeliumAttention's output projection fails
    row(outcome="head_dim", head_dim=16),
    row(outcome="head_dim", json={"head_dim": DELETE}, slow=True),  # HeliumConfig's 128
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
    # a window and layer_types in config.json, which HeliumConfig does not read: transformers' forward
    # attends over every position, its generation cache keeps the last 4 of the sliding layers: refused
    row(
        outcome="sliding_window",
        json={"sliding_window": 4, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True},
        slow=True,
    ),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    # RoPE left out: HeliumConfig's default_theta
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 100000.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), spec={"positional.layout": "interleaved"}),
    row(**rope(**YARN, mscale=0.7, mscale_all_dim=0.5), slow=True),
    row(
        **rope(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
        json={"original_max_position_embeddings": 4},
        slow=True,
    ),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["HeliumForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to HeliumConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("helium", CASES) == set()
