"""HunYuan-MoE (``HunYuanMoEV1ForCausalLM``: Hunyuan-A13B): HunYuan's attention (each head's q and
k normalised after RoPE, ``attention_bias`` on q, k, v and o) with every layer routed among
``num_experts`` experts of ``intermediate_size`` (the top ``moe_topk`` of a softmax, renormalised)
beside an ungated shared expert as wide (``mlp.shared_mlp``); the router is ``mlp.gate.wg``.
``moe_topk`` may be a list, one per layer.

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; export-hf writes them back as HunYuan-MoE, and tfcompile's own mixtures of experts
with q/k norms after RoPE too; what HunYuan-MoE cannot compute is refused by field; a row for every
field of the config class."""

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
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered
from test_hf_moe import PYTHON_457, assert_4_57_loads_written

transformers = pytest.importorskip("transformers")
T = transformers

HUNYUAN_MOE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    head_dim=8,
    num_experts=4,
    moe_topk=2,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
HEAD = "HunYuanMoEV1ForCausalLM"
FAMILIES["hunyuan_v1_moe"] = Family(T.HunYuanMoEV1Config, T.HunYuanMoEV1ForCausalLM, "gpt2", HUNYUAN_MOE)


def model(**fields: Any) -> Any:
    return T.HunYuanMoEV1ForCausalLM(T.HunYuanMoEV1Config(**HUNYUAN_MOE | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Hunyuan-A13B's shape, shrunk: top 2 of 4 experts and a shared one, grouped K/V heads
    "hunyuan_moe": lambda: model(),
    # q, k, v and o biases, a top k per layer as Hunyuan-A13B's config has it, top 1 of 3, tied
    "hunyuan_moe_lists": lambda: model(
        attention_bias=True, num_experts=3, moe_topk=[1, 1], tie_word_embeddings=True
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
    plain, lists = imported["hunyuan_moe"].spec.model, imported["hunyuan_moe_lists"].spec.model
    assert plain.moe is not None and lists.moe is not None
    assert (plain.qk_norm, plain.qk_norm_after_rope, plain.d_ff) == (True, True, 16)
    assert (plain.moe.experts, plain.moe.top_k, plain.moe.normalize) == (4, 2, True)
    assert (plain.moe.shared_d_ff, plain.moe.shared_gate) == (16, False)
    assert (lists.moe.experts, lists.moe.top_k, lists.bias.qkv, lists.tie_embeddings) == (3, 1, True, True)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    assert_round_trips(imported[name], HEAD, tmp_path)


AFTER_ROPE = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "positional: rope, norm: {type: rmsnorm}, qk_norm: true, qk_norm_after_rope: true, activation: swiglu, "
    "d_ff: 16, bias: {qkv: false, attn_out: false, ffn: false}"
)


def test_a_run_of_tfcompiles_own_experts_with_q_and_k_normed_after_rope_is_written_as_hunyuan_moe(
    tmp_path: Path,
) -> None:
    ours, again = own_run_written(
        f"{AFTER_ROPE}, moe: {{experts: 3, top_k: 2, shared_d_ff: 16}}", HEAD, tmp_path
    )
    assert again.moe == ours.moe


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        ("moe: {experts: 4}", ["model.moe.shared_d_ff"]),
        ("moe: {experts: 4, d_ff: 8, shared_d_ff: 16}", ["model.moe.d_ff"]),
        ("moe: {experts: 4, shared_d_ff: 16, shared_gate: true}", ["model.moe.shared_gate"]),
        ("moe: {experts: 4, top_k: 2, normalize: false, shared_d_ff: 16}", ["model.moe.normalize"]),
        ("moe: {experts: 4, shared_d_ff: 16, dense_layers: [0]}", ["model.moe.dense_layers"]),
    ],
    ids=["no-shared-expert", "narrow-experts", "gated", "unnormalised", "dense-layers"],
)
def test_what_hunyuan_moe_cannot_express_is_refused_by_field(
    extra: str, fields: list[str], tmp_path: Path
) -> None:
    assert_export_refused(f"{AFTER_ROPE}, {extra}", fields, "HunYuan-MoE", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
def test_transformers_4_57_loads_a_written_hunyuan_moe_to_the_runs_logits(tmp_path: Path) -> None:
    spec = f"model: {{{AFTER_ROPE}, moe: {{experts: 3, top_k: 2, shared_d_ff: 16}}}}\n"
    assert_4_57_loads_written({HEAD: spec}, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["hunyuan_moe"], "HunYuanMoEV1ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value

F = "hunyuan_v1_moe"
CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        F,
        num_key_value_heads=1,
        attention_bias=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
        },
    ),
    case(F, num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    case(F, outcome="num_key_value_heads", num_key_value_heads=3),
    case(F, outcome="hidden_act", hidden_act="relu", slow=True),
    case(F, tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    case(F, use_cache=False, slow=True),
    case(F, pretraining_tp=1, slow=True),
    case(F, slow=True, **IDS),
    case(F, eod_token_id=5, sep_token_id=6, slow=True),  # ids the model does not read
    case(F, pad_token_id=None, slow=True),
    case(F, max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case(F, intermediate_size=24, spec={"d_ff": 24, "moe.shared_d_ff": 24}, slow=True),
    case(F, vocab_size=VOCAB, slow=True),
    case(F, head_dim=16, spec={"head_dim": 16}, slow=True),
    case(F, outcome="head_dim", json={"head_dim": None}, slow=True),
    case(F, hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    case(F, num_hidden_layers=1, slow=True),
    case(F, num_experts=3, spec={"moe.experts": 3}, slow=True),
    case(F, moe_topk=1, spec={"moe.top_k": 1, "moe.normalize": True}),
    case(F, moe_topk=[2, 2, 1], spec={"moe.top_k": 2}, slow=True),  # past the layers: unread
    case(F, outcome="moe_topk", json={"moe_topk": [2, 1]}),  # a top k per layer
    case(F, outcome="moe_topk", json={"moe_topk": [2]}, slow=True),  # fewer than the layers
    case(F, outcome="num_experts", json={"num_experts": [4, 4]}, slow=True),  # transformers 5 refuses a list
    case(F, outcome="moe_topk", moe_topk=5, slow=True),
    case(F, json={"num_experts_per_tok": 1, "moe_topk": 2}, spec={"moe.top_k": 1}, slow=True),  # the alias
    case(F, output_router_logits=True, slow=True),  # training only: the loss's balance term
    case(F, rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    case(
        F,
        outcome="architectures",
        json={"architectures": ["HunYuanMoEV1ForTokenClassification"]},
        slow=True,
    ),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to HunYuanMoEV1Config fails this until a row of CASES says what it
    does (or the tiny base sets it)."""
    assert uncovered("hunyuan_v1_moe", CASES) == set()
