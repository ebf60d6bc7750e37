"""GLM-4.5 (``Glm4MoeForCausalLM``: GLM-4.5, GLM-4.6, GLM-4.7): Llama's blocks with
``attention_bias`` on q, k and v, RoPE on half of each head, each head's q and k normalised with
``use_qk_norm``, and DeepSeek-V3's routing: each of ``n_routed_experts`` experts scored by its
sigmoid, the router's ``e_score_correction_bias`` added to choose (``moe.selection_bias``), the
top ``num_experts_per_tok`` among the best ``topk_group`` of ``n_group`` groups (``moe.groups``),
their weights renormalised (``norm_topk_prob``) and times ``routed_scaling_factor``
(``moe.scale``), beside ``n_shared_experts`` shared experts in one; the first
``first_k_dense_replace`` layers dense. The multi-token prediction layers past
``num_hidden_layers`` are left out, with a warning.

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; a row for every field of the config class."""

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
    with_tensors,
)
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered
from test_hf_moe import PYTHON_457, assert_4_57_loads_written, assert_4_57_saved_imports

transformers = pytest.importorskip("transformers")
T = transformers

GLM4_MOE = dict(
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
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
HEAD = "Glm4MoeForCausalLM"
FAMILIES["glm4_moe"] = Family(T.Glm4MoeConfig, T.Glm4MoeForCausalLM, "gpt2", GLM4_MOE)


def model(**fields: Any) -> Any:
    return T.Glm4MoeForCausalLM(T.Glm4MoeConfig(**GLM4_MOE | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # GLM-4.5's shape, shrunk: q, k and v biases, q/k norms, one dense layer, then the top 3 of 8
    # experts among the best 2 of 4 groups, scaled by 2.5, beside two shared experts
    "glm4_moe": lambda: model(
        attention_bias=True,
        use_qk_norm=True,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        n_shared_experts=2,
    ),
    # no biases or q/k norms, one group, the top 2 not renormalised, every layer routed, no shared
    # expert, RoPE on a quarter of each head, tied
    "glm4_moe_plain": lambda: model(
        num_experts_per_tok=2,
        norm_topk_prob=False,
        first_k_dense_replace=0,
        n_shared_experts=0,
        partial_rotary_factor=0.25,
        tie_word_embeddings=True,
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
    glm, plain = imported["glm4_moe"].spec.model, imported["glm4_moe_plain"].spec.model
    assert glm.moe is not None and plain.moe is not None
    assert (glm.qk_norm, glm.bias.qkv, glm.bias.attn_out, glm.d_ff, glm.positional.rotary_dims) == (
        True,
        True,
        False,
        48,
        4,
    )
    assert glm.moe.model_dump() == dict(
        experts=8,
        top_k=3,
        d_ff=16,
        normalize=True,
        shared_d_ff=32,
        shared_gate=False,
        router_bias=False,
        scoring="sigmoid",
        selection_bias=True,
        bias_update=0.0,  # read and held fixed, as transformers holds it
        groups={"count": 4, "top": 2},
        scale=2.5,
        dense_layers=[0],
        balance_loss=0.001,
    )
    assert (plain.qk_norm, plain.bias.qkv, plain.positional.rotary_dims, plain.tie_embeddings) == (
        False,
        False,
        2,
        True,
    )
    assert (plain.moe.top_k, plain.moe.normalize, plain.moe.groups, plain.moe.scale) == (2, False, None, 1.0)
    assert (plain.moe.shared_d_ff, plain.moe.dense_layers) == (None, None)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    assert_round_trips(imported[name], HEAD, tmp_path)


BASE = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "norm: {type: rmsnorm}, activation: swiglu, d_ff: 48"
)
NO_BIAS = "bias: {qkv: false, attn_out: false, ffn: false}"
SIGMOID = f"{BASE}, positional: rope, {NO_BIAS}"
OWN = {
    "groups, scale, shared experts, a dense layer": "moe: {experts: 8, top_k: 3, d_ff: 16, scoring: sigmoid, "
    "groups: {count: 4, top: 2}, scale: 2.5, shared_d_ff: 32, dense_layers: [0]}",
    "no selection bias, unnormalised, no shared expert": "moe: {experts: 4, top_k: 2, d_ff: 16, "
    "scoring: sigmoid, normalize: false}",
}


@pytest.mark.parametrize("moe", OWN.values(), ids=OWN)
def test_a_run_of_tfcompiles_own_sigmoid_scored_experts_is_written_as_glm_4_5(
    moe: str, tmp_path: Path
) -> None:
    ours, again = own_run_written(f"{SIGMOID}, {moe}", HEAD, tmp_path)
    assert again.moe is not None and ours.moe is not None
    assert again.moe.model_copy(update={"selection_bias": False}) == ours.moe  # GLM-4.5's router has one


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        (
            f"{NO_BIAS}, moe: {{experts: 4, d_ff: 16, scoring: sigmoid, shared_d_ff: 24}}",
            ["model.moe.shared_d_ff"],
        ),
        (
            f"{NO_BIAS}, moe: {{experts: 4, scoring: sigmoid, shared_d_ff: 48, shared_gate: true}}",
            ["model.moe.shared_gate"],
        ),
        (f"{NO_BIAS}, moe: {{experts: 4, scoring: sigmoid, dense_layers: [1]}}", ["model.moe.dense_layers"]),
        (
            "bias: {qkv: true, attn_out: true, ffn: false}, moe: {experts: 4, scoring: sigmoid}",
            ["model.bias.attn_out"],
        ),
        (f"{NO_BIAS}, window: {{size: 8}}, moe: {{experts: 4, scoring: sigmoid}}", ["model.window"]),
    ],
    ids=["shared-not-a-multiple", "gated", "dense-not-first", "output-bias", "window"],
)
def test_what_glm_4_5_cannot_express_is_refused_by_field(
    extra: str, fields: list[str], tmp_path: Path
) -> None:
    assert_export_refused(f"{BASE}, positional: rope, {extra}", fields, "GLM-4.5", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
def test_transformers_4_57_loads_a_written_glm_4_5_to_the_runs_logits(tmp_path: Path) -> None:
    moe = OWN["groups, scale, shared experts, a dense layer"]
    rope = "positional: {type: rope, rotary_dims: 4}, bias: {qkv: true, attn_out: false, ffn: false}"
    spec = f"model: {{{BASE}, qk_norm: true, {rope}, {moe}}}\n"
    assert_4_57_loads_written({HEAD: spec}, tmp_path)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["glm4_moe"], "Glm4MoeForSequenceClassification", tmp_path)


def test_the_multi_token_prediction_layers_are_left_out_with_a_warning(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """GLM-4.5's checkpoints hold a layer past num_hidden_layers (``model.layers.92``): its
    multi-token prediction, which transformers leaves unread, and the import too."""
    import torch

    from tfcompile.hf.errors import HFWarning
    from tfcompile.hf.importer import import_folder

    mtp = {f"model.layers.3.{name}": torch.zeros(4, 32) for name in ("eh_proj.weight", "enorm.weight")}
    folder = with_tensors(imported, "glm4_moe", tmp_path, mtp)
    with pytest.warns(HFWarning, match=r"left out layers \[3\] past num_hidden_layers \(3\).*2 tensors"):
        import_folder(folder, "mtp", tmp_path / "specs", tmp_path / "runs")


# Run in transformers 4.57 (the published GLM-4.5 and dots.llm1 checkpoints were saved by 4): tiny
# models of both, grouped and scaled, their weights and selection biases moved off their initial
# values, saved, with their logits on the saved ids.
SAVE_457 = r"""
import json, sys, torch, transformers as T
out = sys.argv[1]
torch.manual_seed(0)
ids = torch.randint(2, 64, (2, 12))
results = {"version": T.__version__, "ids": ids.tolist()}
shape = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=32, moe_intermediate_size=16, n_routed_experts=8,
    num_experts_per_tok=3, n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
    first_k_dense_replace=1, attention_bias=True)
for name, config in (("glm4_moe", T.Glm4MoeConfig(**shape, use_qk_norm=True)),
                     ("dots1", T.Dots1Config(**shape, norm_topk_prob=True))):
    model = T.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.normal_(0, 0.05)
        results[name] = model(ids).logits.tolist()
    model.save_pretrained(f"{out}/{name}")
json.dump(results, open(f"{out}/logits.json", "w"))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
@pytest.mark.filterwarnings("ignore:.*has no tokenizer.json")
def test_folders_transformers_4_57_saved_import_to_its_logits(tmp_path: Path) -> None:
    specs = assert_4_57_saved_imports(SAVE_457, tmp_path)
    assert set(specs) == {"glm4_moe", "dots1"}
    assert all(spec.model.moe is not None and spec.model.moe.groups is not None for spec in specs.values())


# ------------------------------------------------------------------ every config field, by value


def glm(**fields: Any) -> Case:
    return case("glm4_moe", **fields)


CASES: list[Case] = [
    glm(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        use_qk_norm=True,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": False,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "qk_norm": True,
        },
    ),
    glm(outcome="num_key_value_heads", num_key_value_heads=3),
    glm(outcome="hidden_act", hidden_act="relu", slow=True),
    glm(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    glm(use_cache=False, slow=True),
    glm(slow=True, **IDS),
    glm(pad_token_id=None, slow=True),
    glm(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    glm(intermediate_size=24, spec={"d_ff": 24}, slow=True),
    glm(vocab_size=VOCAB, slow=True),
    glm(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    glm(num_hidden_layers=2, slow=True),
    glm(moe_intermediate_size=8, spec={"moe.d_ff": 8, "moe.shared_d_ff": 8}),
    glm(n_routed_experts=4, spec={"moe.experts": 4}, slow=True),
    glm(num_experts_per_tok=1, spec={"moe.top_k": 1, "moe.normalize": True}, slow=True),
    glm(outcome="num_experts_per_tok", num_experts_per_tok=9, slow=True),
    glm(n_shared_experts=3, spec={"moe.shared_d_ff": 48}, slow=True),
    glm(n_shared_experts=0, spec={"moe.shared_d_ff": None}, slow=True),
    glm(outcome="n_shared_experts", json={"n_shared_experts": -1}, slow=True),
    glm(outcome="n_shared_experts", json={"n_shared_experts": None}, slow=True),  # transformers fails
    glm(outcome="n_shared_experts", json={"n_shared_experts": float("inf")}, slow=True),
    glm(outcome="first_k_dense_replace", json={"first_k_dense_replace": float("nan")}, slow=True),
    glm(routed_scaling_factor=0.5, spec={"moe.scale": 0.5}),
    glm(outcome="routed_scaling_factor", routed_scaling_factor=0.0, slow=True),
    glm(n_group=2, topk_group=1, spec={"moe.groups.count": 2, "moe.groups.top": 1}),
    glm(outcome="n_group", n_group=3, topk_group=1, slow=True),  # 8 experts in 3 groups
    glm(outcome="topk_group", n_group=2, topk_group=3, slow=True),
    glm(outcome="topk_group", json={"n_group": 1, "topk_group": 2}, slow=True),
    glm(first_k_dense_replace=2, spec={"moe.dense_layers": [0, 1]}, slow=True),
    glm(first_k_dense_replace=0, spec={"moe.dense_layers": None}, slow=True),
    # every layer dense: a dense model, which export-hf writes (as Phi-3, RoPE on part of each head)
    case("glm4_moe", first_k_dense_replace=3, spec={"moe": None}, slow=True),
    glm(outcome="first_k_dense_replace", json={"first_k_dense_replace": -1}, slow=True),
    glm(norm_topk_prob=False, spec={"moe.normalize": False}, slow=True),
    glm(output_router_logits=True, slow=True),  # training only
    glm(num_nextn_predict_layers=2, slow=True),  # the checkpoint's MTP layers: never built
    glm(partial_rotary_factor=1.0, spec={"positional.rotary_dims": 8}, slow=True),
    glm(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    glm(outcome="architectures", json={"architectures": ["Glm4MoeForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Glm4MoeConfig fails this until a row of CASES says what it does
    (or the tiny base sets it)."""
    assert uncovered("glm4_moe", CASES) == set()
