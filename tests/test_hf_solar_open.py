"""Solar Open (``SolarOpenForCausalLM``: Solar Open 100B): GLM-4.5's attention without q/k norms
(``attention_bias`` on q, k and v; RoPE on whole heads of ``head_dim``: a ``partial_rotary_factor``,
on which its forward fails, is refused) with DeepSeek-V3's routing in every layer: sigmoid scores,
the routers' selection biases, groups, the scaled top k beside ``n_shared_experts`` shared experts.

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; export-hf writes them as GLM-4.5, which computes the same; a row for every field of
the config class."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_models import VOCAB, Imported, imported_variants
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered

transformers = pytest.importorskip("transformers")
T = transformers
if not hasattr(T, "SolarOpenConfig"):
    pytest.skip("this transformers has no Solar Open (5.x has)", allow_module_level=True)

SOLAR = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=32,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_shared_experts=1,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
HEAD = "SolarOpenForCausalLM"
FAMILIES["solar_open"] = Family(T.SolarOpenConfig, T.SolarOpenForCausalLM, "gpt2", SOLAR)


def model(**fields: Any) -> Any:
    return T.SolarOpenForCausalLM(T.SolarOpenConfig(**SOLAR | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Solar Open's shape, shrunk: q, k and v biases, the top 3 of 8 experts among the best 2 of 4
    # groups, scaled by 2.5, beside a shared expert
    "solar_open": lambda: model(attention_bias=True, n_group=4, topk_group=2, routed_scaling_factor=2.5),
    # the top 2 not renormalised, no shared expert, tied
    "solar_open_plain": lambda: model(
        num_experts_per_tok=2, norm_topk_prob=False, n_shared_experts=0, tie_word_embeddings=True
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
    solar, plain = imported["solar_open"].spec.model, imported["solar_open_plain"].spec.model
    assert solar.moe is not None and plain.moe is not None
    assert (solar.qk_norm, solar.bias.qkv, solar.bias.attn_out, solar.positional.theta) == (
        False,
        True,
        False,
        1000000.0,
    )
    assert solar.positional.width(8) == plain.positional.width(8) == 8
    assert (solar.moe.scoring, solar.moe.selection_bias, solar.moe.scale, solar.moe.dense_layers) == (
        "sigmoid",
        True,
        2.5,
        None,
    )
    assert solar.moe.groups is not None and (solar.moe.groups.count, solar.moe.groups.top) == (4, 2)
    assert (solar.moe.shared_d_ff, plain.moe.shared_d_ff, plain.moe.normalize) == (16, None, False)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


# ------------------------------------------------------------------ every config field, by value


def solar(**fields: Any) -> Case:
    """A case of Solar Open, which export-hf writes as GLM-4.5."""
    return case("solar_open", **fields)


CASES: list[Case] = [
    solar(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": False,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
        },
    ),
    solar(outcome="num_key_value_heads", num_key_value_heads=3),
    solar(outcome="hidden_act", hidden_act="relu", slow=True),
    solar(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    solar(use_cache=False, slow=True),
    solar(slow=True, **IDS),
    solar(pad_token_id=None, slow=True),
    solar(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    solar(vocab_size=VOCAB, slow=True),
    solar(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    solar(head_dim=16, spec={"head_dim": 16}, slow=True),
    solar(num_hidden_layers=1, slow=True),
    solar(moe_intermediate_size=8, spec={"moe.d_ff": 8, "moe.shared_d_ff": 8}),
    solar(n_routed_experts=4, spec={"moe.experts": 4}, slow=True),
    solar(num_experts_per_tok=1, spec={"moe.top_k": 1}, slow=True),
    solar(n_shared_experts=2, spec={"moe.shared_d_ff": 32}, slow=True),
    solar(routed_scaling_factor=0.5, spec={"moe.scale": 0.5}, slow=True),
    solar(n_group=2, topk_group=1, spec={"moe.groups.count": 2, "moe.groups.top": 1}),
    solar(outcome="n_group", n_group=3, topk_group=1, slow=True),
    solar(norm_topk_prob=False, spec={"moe.normalize": False}, slow=True),
    solar(output_router_logits=True, slow=True),  # training only
    solar(json={"first_k_dense_replace": 1}, spec={"moe.dense_layers": None}, slow=True),  # not Solar's field
    solar(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    solar(  # transformers' forward fails on it
        outcome="partial_rotary_factor",
        json={"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}},
        slow=True,
    ),
    solar(outcome="architectures", json={"architectures": ["SolarOpenForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to SolarOpenConfig fails this until a row of CASES says what it does
    (or the tiny base sets it)."""
    assert uncovered("solar_open", CASES) == set()
