"""dots.llm1 (``Dots1ForCausalLM``): Qwen3's attention (each head's q and k normalised before
RoPE, ``attention_bias`` on q, k, v and o, a window on the layers ``layer_types`` names, or where
it names none and a window is set, on those from ``max_window_layers`` on) with GLM-4.5's routing
(DeepSeek-V3's: sigmoid scores, the routers' selection biases, groups, the scaled top k beside
shared experts, the first ``first_k_dense_replace`` layers dense). Dots1Config leaves the experts,
the top k and the shared experts null: a config must name them.

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; a row for every field of the config class."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_models import VOCAB, Imported, imported_variants
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered

transformers = pytest.importorskip("transformers")
T = transformers

DOTS1 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_shared_experts=1,
    first_k_dense_replace=1,
    sliding_window=None,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
FAMILIES["dots1"] = Family(T.Dots1Config, T.Dots1ForCausalLM, "gpt2", DOTS1)


def model(**fields: Any) -> Any:
    return T.Dots1ForCausalLM(T.Dots1Config(**DOTS1 | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # dots.llm1's shape, shrunk: one dense layer, then the top 3 of 8 experts (not renormalised)
    # among the best 2 of 4 groups, scaled by 2.5, beside two shared experts; q, k, v and o biases
    "dots1": lambda: model(
        attention_bias=True, n_group=4, topk_group=2, routed_scaling_factor=2.5, n_shared_experts=2
    ),
    # a window of 6 on the layers from max_window_layers (1) on, renormalised, tied
    "dots1_window": lambda: model(
        sliding_window=6, max_window_layers=1, norm_topk_prob=True, tie_word_embeddings=True
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
    dots, window = imported["dots1"].spec.model, imported["dots1_window"].spec.model
    assert dots.moe is not None and window.moe is not None
    assert (dots.qk_norm, dots.bias.qkv, dots.bias.attn_out, dots.window) == (True, True, True, None)
    assert (dots.moe.scoring, dots.moe.selection_bias, dots.moe.normalize, dots.moe.scale) == (
        "sigmoid",
        True,
        False,
        2.5,
    )
    assert dots.moe.groups is not None and (dots.moe.groups.count, dots.moe.groups.top) == (4, 2)
    assert (dots.moe.shared_d_ff, dots.moe.dense_layers) == (32, [0])
    assert window.window is not None and (window.window.size, window.window.layers) == (6, [1, 2])
    assert (window.moe.normalize, window.moe.groups, window.tie_embeddings) == (True, None, True)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


# ------------------------------------------------------------------ every config field, by value


def dots(**fields: Any) -> Case:
    """A case of dots.llm1, which export-hf writes as GLM-4.5 where it can (no output bias, no
    window)."""
    return case("dots1", **fields)


CASES: list[Case] = [
    dots(  # the fields that take any value at once: each row below sets one (an o bias: not GLM-4.5's)
        exported=False,
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
    dots(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    dots(outcome="num_key_value_heads", num_key_value_heads=3),
    dots(outcome="hidden_act", hidden_act="relu", slow=True),
    dots(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    dots(use_cache=False, slow=True),
    dots(slow=True, **IDS),
    dots(pad_token_id=None, slow=True),
    dots(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    dots(intermediate_size=24, spec={"d_ff": 24}, slow=True),
    dots(vocab_size=VOCAB, slow=True),
    dots(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    dots(num_hidden_layers=2, slow=True),
    dots(moe_intermediate_size=8, spec={"moe.d_ff": 8, "moe.shared_d_ff": 8}),
    dots(n_routed_experts=4, spec={"moe.experts": 4}, slow=True),
    dots(num_experts_per_tok=1, spec={"moe.top_k": 1}, slow=True),
    dots(n_shared_experts=0, spec={"moe.shared_d_ff": None}, slow=True),
    dots(outcome="n_routed_experts", json={"n_routed_experts": None}),
    dots(outcome="num_experts_per_tok", json={"num_experts_per_tok": None}, slow=True),
    dots(outcome="n_shared_experts", json={"n_shared_experts": None}, slow=True),
    dots(routed_scaling_factor=0.5, spec={"moe.scale": 0.5}, slow=True),
    dots(n_group=2, topk_group=1, spec={"moe.groups.count": 2, "moe.groups.top": 1}),
    dots(outcome="n_group", n_group=3, topk_group=1, slow=True),
    dots(first_k_dense_replace=2, spec={"moe.dense_layers": [0, 1]}, slow=True),
    dots(norm_topk_prob=True, spec={"moe.normalize": True}, slow=True),
    dots(output_router_logits=True, slow=True),  # training only
    dots(sliding_window=6, spec={"window": None}, slow=True),  # from max_window_layers (62) on: none
    dots(sliding_window=6, max_window_layers=2, spec={"window.layers": [2]}, exported=False),  # GLM-4.5: none
    dots(
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        spec={"window.layers": [0, 2]},
        exported=False,
        slow=True,
    ),
    dots(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    dots(outcome="architectures", json={"architectures": ["Dots1ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Dots1Config fails this until a row of CASES says what it does
    (or the tiny base sets it)."""
    assert uncovered("dots1", CASES) == set()
