"""Nemotron (``NemotronForCausalLM``: Minitron 4B and 8B, Nemotron-4): LLaMA's blocks with
LayerNorms whose scale is weight + 1 (NemotronLayerNorm1P: the 1 folded in on import) and which
learn a shift (``norm: {type: layernorm, bias: true}``, epsilon ``norm_eps``), RoPE on the first
half of each head (``rotary_dims``, NemotronConfig's ``partial_rotary_factor`` 0.5 where none is
named), a plain feed-forward of the squared ReLU (``activation: relu2``), ``attention_bias`` on q,
k, v and o, ``mlp_bias``. Tiny random transformers models saved with save_pretrained, imported,
and held to transformers' logits (float32, rows padded on the right and not), their parameter
counts and greedy generation through the ONNX bundle. export-hf writes a Nemotron of a K/V head
per head as GPT-NeoX (its sequential blocks), which transformers reloads to the same logits, and
refuses grouped K/V heads by field. A row for every field of NemotronConfig."""

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
    longrope,
    rope,
    uncovered,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
NEMOTRON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
FAMILIES["nemotron"] = Family(T.NemotronConfig, T.NemotronForCausalLM, "gpt2", NEMOTRON | TOKENS)


def nemotron(**fields: Any) -> Any:
    return T.NemotronForCausalLM(T.NemotronConfig(**NEMOTRON | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Minitron's shape, shrunk: grouped K/V heads, no biases, untied
    "nemotron": lambda: nemotron(),
    # a K/V head per head, biases on every projection, tied, three quarters of each head turned:
    # written as GPT-NeoX
    "nemotron_mha_biases": lambda: nemotron(
        num_key_value_heads=4,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.75},
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
    plain, biased = imported["nemotron"].spec.model, imported["nemotron_mha_biases"].spec.model
    assert (plain.activation, plain.norm.type, plain.norm.bias, plain.norm.eps) == (
        "relu2",
        "layernorm",
        True,
        1e-5,
    )
    assert (plain.positional.rotary_dims, plain.positional.layout, plain.bias.qkv) == (4, "halves", False)
    assert (biased.positional.rotary_dims, biased.bias.attn_out, biased.bias.ffn) == (6, True, True)
    # NemotronLayerNorm1P's weight + 1, folded
    hf_norm = imported["nemotron"].hf.model.norm.weight
    assert imported["nemotron"].model.final_norm.weight.equal(1.0 + hf_norm)


def test_export_hf_writes_a_nemotron_of_a_kv_head_per_head_as_gpt_neox(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    variant = imported["nemotron_mha_biases"]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "GPTNeoXForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


def test_export_hf_refuses_grouped_kv_heads_on_part_of_each_head_by_field(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    with pytest.raises(HFError, match=r"  model\.positional\.rotary_dims: "):
        export_hf(imported["nemotron"].result.run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["nemotron"], "NemotronForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value

MHA = {"num_key_value_heads": 4}  # written as GPT-NeoX (grouped K/V heads on part of a head: refused)


def row(**fields: Any) -> Case:
    exported = fields.get("num_key_value_heads", 2) == 4
    return case("nemotron", **{"exported": exported} | fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        hidden_act="gelu",
        norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "bias.ffn": True,
            "tie_embeddings": True,
            "activation": "gelu",
            "norm.eps": 1e-2,
            "norm.type": "layernorm",
            "dropout.attention": 0.3,
        },
    ),
    row(**MHA, spec={"n_kv_heads": 4}),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    # left out or null: NemotronConfig keeps None, on which its attention fails
    row(**MHA, outcome="num_key_value_heads", json={"num_key_value_heads": DELETE}, slow=True),
    row(outcome="num_key_value_heads", json={"num_key_value_heads": None}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(json={"hidden_act": DELETE}, spec={"activation": "relu2"}, slow=True),  # NemotronConfig's
    row(hidden_act="silu", spec={"activation": "silu"}, slow=True),
    row(hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(json={"norm_eps": DELETE}, spec={"norm.eps": 1e-5}),
    row(json={"rms_norm_eps": 1e-2}, spec={"norm.eps": 1e-5}, slow=True),  # LlamaConfig's: unread
    row(head_dim=16, spec={"head_dim": 16, "positional.rotary_dims": 8}, slow=True),
    row(json={"head_dim": None}, spec={"head_dim": 8}, slow=True),  # hidden_size / heads
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
    row(
        **MHA,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
        spec={"positional.theta": 500.0},
    ),
    # the rotated fraction: the dict's, else the top-level field, else NemotronConfig's 0.5
    row(
        json={"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
        spec={"positional.rotary_dims": 4},
    ),
    row(  # whole heads: written as Starcoder2 (LayerNorms, a plain feed-forward, grouped K/V heads)
        exported=True,
        json={"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "partial_rotary_factor": 1.0},
        spec={"positional.rotary_dims": 8},
        slow=True,
    ),
    row(**rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5), slow=True),
    row(**rope(rope_type="dynamic", factor=2.0, partial_rotary_factor=0.5), slow=True),
    row(**rope(**YARN, partial_rotary_factor=0.5), spec={"positional.scaling.factor": 4.0}),
    row(**rope(**longrope(2), partial_rotary_factor=0.5), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="architectures", json={"architectures": ["NemotronForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to NemotronConfig fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    assert uncovered("nemotron", CASES) == set()
