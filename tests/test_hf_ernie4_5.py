"""ERNIE 4.5 (``Ernie4_5ForCausalLM``, Baidu): LLaMA's blocks turning interleaved pairs of each head
(``layout: interleaved``, the q and k rows as saved), ``use_bias`` on q, k, v, o and the
feed-forward alike, and Ernie4_5Config's defaults (a RoPE theta of 500000, a tied head, heads 128
wide, d_model / heads where null); its attention drops nothing (no ``attention_dropout`` read).
Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), their parameter counts and greedy generation
through the ONNX bundle. export-hf writes no ERNIE 4.5: it writes the import as Llama (the q and k
rows permuted to its halves), which transformers reloads to the same logits. A row for every field
of Ernie4_5Config (tests/test_hf_fields.py's table and check)."""

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

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
ERNIE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # Ernie4_5Config's 128 is not hidden_size / heads
    max_position_embeddings=32,
)
FAMILIES["ernie4_5"] = Family(T.Ernie4_5Config, T.Ernie4_5ForCausalLM, "gpt2", ERNIE | TOKENS)


def ernie(**fields: Any) -> Any:
    return T.Ernie4_5ForCausalLM(T.Ernie4_5Config(**ERNIE | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # ERNIE-4.5-0.3B's shape, shrunk: grouped K/V heads, no biases, tied (Ernie4_5Config's default)
    "ernie4_5": lambda: ernie(),
    # every bias (use_bias), untied, wider heads than d_model / heads, a RoPE theta of its own
    "ernie4_5_biases": lambda: ernie(
        use_bias=True,
        tie_word_embeddings=False,
        head_dim=16,
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
    plain, biased = imported["ernie4_5"].spec.model, imported["ernie4_5_biases"].spec.model
    assert (plain.positional.layout, plain.positional.theta, plain.norm.eps) == (
        "interleaved",
        500000.0,
        1e-5,
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.tie_embeddings) == (
        False,
        False,
        False,
        True,
    )
    assert (biased.bias.qkv, biased.bias.attn_out, biased.bias.ffn, biased.tie_embeddings) == (
        True,
        True,
        True,
        False,
    )
    assert (biased.positional.layout, biased.head_dim, biased.positional.theta) == ("interleaved", 16, 500.0)


def test_the_interleaved_pairs_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """The same weights turned in halves (LLaMA's pairs) differ: the layout is what the import holds."""
    variant = imported["ernie4_5"]
    config = variant.hf.config.to_dict() | {"model_type": "llama", "attention_bias": False, "mlp_bias": False}
    llama = T.LlamaForCausalLM(T.LlamaConfig(**config))
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
    assert_head_refused(imported["ernie4_5"], "Ernie4_5ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("ernie4_5", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        use_bias=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "bias.ffn": True,
            "tie_embeddings": False,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "positional.layout": "interleaved",
        },
    ),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    row(json={"num_key_value_heads": DELETE}, spec={"n_kv_heads": 2}, slow=True),  # Ernie4_5Config's 2
    row(use_bias=True, spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": True}, slow=True),
    row(use_bias=None, spec={"bias.qkv": False, "bias.ffn": False}, slow=True),  # None: nn.Linear's no bias
    # LLaMA's bias fields, which Ernie4_5Config does not read
    row(json={"attention_bias": True, "mlp_bias": True}, spec={"bias.qkv": False, "bias.ffn": False}),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),  # the class's
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    row(head_dim=None, spec={"head_dim": 8}),  # null: hidden_size / heads, as Ernie4_5Config derives it
    # Ernie4_5Attention drops nothing, whatever config.json says
    row(json={"attention_dropout": 0.3}, spec={"dropout.attention": 0.0}, slow=True),
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # a window and layer_types in config.json, which Ernie4_5Config does not read: transformers' forward
    # attends over every position, its generation cache keeps the last 4 of the sliding layers: refused
    row(
        outcome="sliding_window",
        json={"sliding_window": 4, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True},
        slow=True,
    ),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    # RoPE left out: Ernie4_5Config's default_theta
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 500000.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), spec={"positional.layout": "interleaved"}),
    row(**rope(**YARN, mscale=0.7, mscale_all_dim=0.5), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["Ernie4_5ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Ernie4_5Config fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    assert uncovered("ernie4_5", CASES) == set()
