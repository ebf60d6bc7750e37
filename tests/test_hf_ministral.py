"""Ministral (``MinistralForCausalLM``): Mistral's blocks (no biases) sliding only the layers its
``layer_types`` name ``sliding_attention`` (every layer where it has none, as MinistralConfig
derives them), so a window on some layers (``window.layers``). Tiny random transformers models
saved with save_pretrained, imported, and held to transformers' logits (float32, rows padded on
the right and not, past the window), their parameter counts and greedy generation through the
ONNX bundle. export-hf writes no Ministral: it writes the import as Mistral (a window on every
layer) or Qwen2 (on some, with q/k/v biases of zeros), which transformers reloads to the same
logits. What transformers 5 cannot run (no head_dim, a null window) is refused by field. A row
for every field of MinistralConfig (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
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

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
SLIDING, FULL = "sliding_attention", "full_attention"
MINISTRAL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # MinistralConfig derives none
    max_position_embeddings=32,
    sliding_window=5,
    layer_types=[SLIDING, FULL, SLIDING, FULL],  # Ministral-8B's three sliding to one full, shrunk
)
FAMILIES["ministral"] = Family(T.MinistralConfig, T.MinistralForCausalLM, "gpt2", MINISTRAL | TOKENS)


def ministral(**fields: Any) -> Any:
    return T.MinistralForCausalLM(T.MinistralConfig(**MINISTRAL | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # every other layer sliding over 5 positions, grouped K/V heads, an untied head
    "ministral": lambda: ministral(),
    # every layer sliding, one K/V head, tied, a RoPE theta of its own
    "ministral_every": lambda: ministral(
        layer_types=[SLIDING] * 4,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000000.0},
    ),
    # a window of the whole context or more: none; wider heads than d_model / heads
    "ministral_unslid": lambda: ministral(sliding_window=32, head_dim=16),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    """Past the window: 20 positions over one of 5."""
    imported[name].assert_outputs_match(length=20)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, every = imported["ministral"].spec.model, imported["ministral_every"].spec.model
    unslid = imported["ministral_unslid"].spec.model
    assert (plain.window.size, plain.window.layers, plain.sliding_layers) == (5, [0, 2], {0, 2})
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.tie_embeddings) == (
        False,
        False,
        False,
        False,
    )
    assert (plain.positional.layout, plain.norm.type, plain.activation) == ("halves", "rmsnorm", "swiglu")
    assert (every.window.size, every.window.layers, every.n_kv_heads, every.tie_embeddings) == (
        5,
        None,
        1,
        True,
    )
    assert every.positional.theta == 1e8
    assert (unslid.window, unslid.head_dim) == (None, 16)


def test_the_layer_types_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """transformers' own model with every layer sliding (Mistral's reading) differs past the window:
    the full layers are what the import holds."""
    variant = imported["ministral"]
    every = T.MinistralForCausalLM(
        T.MinistralConfig(**variant.hf.config.to_dict() | {"layer_types": [SLIDING] * 4})
    )
    every.load_state_dict(variant.hf.state_dict())
    assert max_difference(every.eval(), variant.model, False, length=20) > 1e-3


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("ministral", "Qwen2ForCausalLM"),
        ("ministral_every", "MistralForCausalLM"),
        ("ministral_unslid", "LlamaForCausalLM"),
    ],
)
def test_export_hf_writes_each_import_as_a_model_type_that_computes_the_same(
    imported: dict[str, Imported], name: str, head: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == head
    _loads_alike(tmp_path / "out", variant.model)
    reloaded = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert max_difference(reloaded, variant.model, True, length=20) <= 1e-5  # past the window


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["ministral"], "MinistralForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("ministral", **fields)


EVERY_LAYER = {"window.size": 5, "window.layers": None}

CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "window.layers": [0, 2],
        },
    ),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    # K/V heads left out: MinistralConfig's 8, more than the 4 heads
    row(outcome="num_key_value_heads", json={"num_key_value_heads": DELETE}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    # MinistralConfig derives no head_dim: MinistralAttention fails without one
    row(outcome="head_dim", json={"head_dim": DELETE}),
    row(outcome="head_dim", json={"head_dim": None}, slow=True),
    # the window: layer_types' sliding layers, every layer where it has none
    row(layer_types=[FULL, SLIDING, SLIDING, SLIDING], spec={"window.layers": [1, 2, 3]}, slow=True),
    row(layer_types=[SLIDING] * 4, spec=EVERY_LAYER, slow=True),
    row(layer_types=[FULL] * 4, spec={"window": None}),
    row(json={"layer_types": DELETE}, spec=EVERY_LAYER),
    row(json={"layer_types": None}, spec=EVERY_LAYER, slow=True),
    row(sliding_window=2, spec={"window.size": 2}, slow=True),
    row(sliding_window=32, spec={"window": None}, slow=True),  # the whole context
    # sliding_window left out: MinistralConfig's 4096, past the context
    row(json={"sliding_window": DELETE}, spec={"window": None}, slow=True),
    # a null window: MinistralModel builds the sliding mask from it all the same, and fails
    row(outcome="sliding_window", json={"sliding_window": None}),
    row(outcome="sliding_window", layer_types=[FULL] * 4, json={"sliding_window": None}, slow=True),
    # Mistral's and Qwen2's fields, which MinistralConfig does not read
    row(
        json={"use_sliding_window": False, "max_window_layers": 3, "attention_bias": True, "mlp_bias": True},
        spec={"window.layers": [0, 2], "bias.qkv": False, "bias.ffn": False},
        slow=True,
    ),
    row(attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=2, layer_types=[SLIDING, FULL], slow=True),
    row(hidden_size=64, intermediate_size=40, head_dim=16, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 10000.0}, slow=True),  # the class's
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["MinistralForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to MinistralConfig fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    assert uncovered("ministral", CASES) == set()
