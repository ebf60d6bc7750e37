"""FlexOlmo (``FlexOlmoForCausalLM``: FlexOlmo-7x7B-1T): OLMo 2's blocks (RMSNorms on each
sublayer's output, q and k normalised over all heads, ``attention_bias`` on q, k, v and o) with
every layer routed among ``num_experts`` experts of ``intermediate_size`` as OLMoE routes them (the
top ``num_experts_per_tok`` of a softmax, renormalised with ``norm_topk_prob``).

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; export-hf writes them back as FlexOlmo, and tfcompile's own mixtures of experts
with output norms too; what FlexOlmo cannot compute is refused by field; a row for every field of
the config class."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_models import (
    VOCAB,
    Imported,
    assert_export_refused,
    assert_head_refused,
    assert_round_trips,
    imported_variants,
    own_run_written,
)
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
from test_hf_moe import PYTHON_457, assert_4_57_loads_written

transformers = pytest.importorskip("transformers")
T = transformers

FLEX_OLMO = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    num_experts=4,
    num_experts_per_tok=2,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
FLEX = "FlexOlmoForCausalLM"
FAMILIES["flex_olmo"] = Family(T.FlexOlmoConfig, T.FlexOlmoForCausalLM, "gpt2", FLEX_OLMO)


def model(**fields: Any) -> Any:
    return T.FlexOlmoForCausalLM(T.FlexOlmoConfig(**FLEX_OLMO | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # FlexOlmo-7x7B's shape, shrunk: top 2 of 4 experts as the softmax gave them, grouped K/V heads
    "flex_olmo": lambda: model(),
    # q, k, v and o biases, the top k renormalised, a K/V head per head, YaRN
    "flex_olmo_biased": lambda: model(
        attention_bias=True,
        norm_topk_prob=True,
        num_key_value_heads=4,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
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
    plain, biased = imported["flex_olmo"].spec.model, imported["flex_olmo_biased"].spec.model
    assert plain.moe is not None and biased.moe is not None
    assert (plain.norm.position, plain.qk_norm, plain.qk_norm_over) == ("output", True, "all_heads")
    assert (plain.moe.experts, plain.moe.top_k, plain.moe.normalize, plain.d_ff) == (4, 2, False, 16)
    assert (biased.bias.qkv, biased.bias.attn_out, biased.moe.normalize, biased.n_kv_heads) == (
        True,
        True,
        True,
        4,
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    assert_round_trips(imported[name], FLEX, tmp_path)


OUTPUT_NORMS = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "positional: rope, norm: {type: rmsnorm, position: output}, qk_norm: true, qk_norm_over: all_heads, "
    "activation: swiglu, d_ff: 48, bias: {qkv: false, attn_out: false, ffn: false}"
)


def test_a_run_of_tfcompiles_own_mixture_of_experts_with_output_norms_is_written_as_flex_olmo(
    tmp_path: Path,
) -> None:
    ours, again = own_run_written(f"{OUTPUT_NORMS}, moe: {{experts: 3, top_k: 2, d_ff: 16}}", FLEX, tmp_path)
    assert again.moe == ours.moe


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        ("moe: {experts: 4, dense_layers: [0]}", ["model.moe.dense_layers"]),
        ("moe: {experts: 4, shared_d_ff: 8}", ["model.moe.shared_d_ff"]),
        ("window: {size: 4}, moe: {experts: 4}", ["model.window"]),
    ],
    ids=["dense-layers", "shared-expert", "window"],
)
def test_what_flex_olmo_cannot_express_is_refused_by_field(
    extra: str, fields: list[str], tmp_path: Path
) -> None:
    assert_export_refused(f"{OUTPUT_NORMS}, {extra}", fields, "FlexOlmo", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
def test_transformers_4_57_loads_a_written_flex_olmo_to_the_runs_logits(tmp_path: Path) -> None:
    spec = f"model: {{{OUTPUT_NORMS}, moe: {{experts: 3, top_k: 2, d_ff: 16}}}}\n"
    assert_4_57_loads_written({FLEX: spec}, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["flex_olmo"], "FlexOlmoForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value

F = "flex_olmo"
CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        F,
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        router_aux_loss_coef=0.02,
        norm_topk_prob=True,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "moe.balance_loss": 0.02,
            "moe.normalize": True,
        },
    ),
    case(F, num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    case(F, outcome="num_key_value_heads", num_key_value_heads=3),
    case(F, hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    case(F, outcome="hidden_act", hidden_act="relu", slow=True),
    case(F, rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
    case(F, use_cache=False, slow=True),
    case(F, slow=True, **IDS),
    case(F, pad_token_id=None, slow=True),
    case(F, max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case(F, intermediate_size=40, spec={"d_ff": 40}, slow=True),
    case(F, vocab_size=VOCAB, slow=True),
    case(F, hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    case(F, num_hidden_layers=1, slow=True),
    case(F, num_experts=3, spec={"moe.experts": 3}, slow=True),
    case(F, num_experts_per_tok=1, spec={"moe.top_k": 1}, slow=True),
    case(F, outcome="num_experts_per_tok", num_experts_per_tok=5, slow=True),
    case(F, output_router_logits=True, slow=True),  # training only: the loss's balance term
    case(  # 5's attribute_map: read over num_experts
        F, json={"num_local_experts": 4, "num_experts": 3}, spec={"moe.experts": 4}, slow=True
    ),
    case(F, rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    # left out: FlexOlmoConfig's default_theta
    case(F, json={"rope_parameters": DELETE}, spec={"positional.theta": 500000.0}),
    case(F, **rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    case(F, **rope(**YARN), spec={"positional.scaling.factor": 4.0}, slow=True),
    case(F, outcome="architectures", json={"architectures": ["FlexOlmoForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to FlexOlmoConfig fails this until a row of CASES says what it
    does (or the tiny base sets it)."""
    assert uncovered("flex_olmo", CASES) == set()
