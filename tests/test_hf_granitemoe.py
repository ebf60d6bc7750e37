"""GraniteMoE (``GraniteMoeForCausalLM``: Granite 3.0 1B-A400M, 3B-A800M) and GraniteMoeShared
(``GraniteMoeSharedForCausalLM``): Granite's attention (``attention_multiplier`` as the attention
scale, ``attention_bias`` on q, k, v and o) and multipliers (embeddings, residual branches, logits
divided by ``logits_scaling``) with every layer routed among ``num_local_experts`` experts of
``intermediate_size``, the softmax of the top ``num_experts_per_tok`` router logits (``moe.normalize``);
GraniteMoeShared adds an ungated shared expert of ``shared_intermediate_size`` (none where 0).

Tiny random transformers models saved with save_pretrained (which writes the Hub's names: every
expert stacked in ``block_sparse_moe.input_linear`` and ``output_linear``, the router's
``router.layer``, the shared expert's ``shared_mlp``), imported, and held to transformers' logits
(float32, rows padded on the right and not), parameter counts and greedy generation through the
ONNX bundle; a checkpoint of transformers 5's in-memory names imports alike; export-hf writes them
back, and tfcompile's own mixtures of experts with multipliers or an ungated shared expert too; a
row for every field of both config classes (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import (
    VOCAB,
    Imported,
    assert_head_refused,
    edited,
    from_pretrained,
    imported_variants,
    max_difference,
)
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
from test_hf_moe import saved_names, stacked_copy

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
GRANITE_MOE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    # Granite 3.0's multipliers, shrunk: each one a field the import must read
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    logits_scaling=6.0,
    attention_multiplier=0.015625,
)
FAMILIES["granitemoe"] = Family(T.GraniteMoeConfig, T.GraniteMoeForCausalLM, "gpt2", GRANITE_MOE | TOKENS)
FAMILIES["granitemoeshared"] = Family(
    T.GraniteMoeSharedConfig,
    T.GraniteMoeSharedForCausalLM,
    "gpt2",
    GRANITE_MOE | TOKENS | {"shared_intermediate_size": 24},
)
MODEL_TYPES = ("granitemoe", "granitemoeshared")


def model(family: str, **fields: Any) -> Any:
    f = FAMILIES[family]
    return f.model(f.config(**f.base | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Granite 3.0 1B-A400M's shape, shrunk: top 2 of 4 experts, grouped K/V heads, untied
    "granitemoe": lambda: model("granitemoe"),
    # biases on q, k, v and o, top 1, tied, YaRN
    "granitemoe_biases": lambda: model(
        "granitemoe",
        attention_bias=True,
        num_experts_per_tok=1,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
    ),
    # an ungated shared expert of 24 beside the routed ones
    "granitemoeshared": lambda: model("granitemoeshared"),
    # a shared expert of 0: none
    "granitemoeshared_none": lambda: model("granitemoeshared", shared_intermediate_size=0),
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
    plain, biased = imported["granitemoe"].spec.model, imported["granitemoe_biases"].spec.model
    shared, none = imported["granitemoeshared"].spec.model, imported["granitemoeshared_none"].spec.model
    assert plain.moe is not None and biased.moe is not None and shared.moe is not None
    assert (plain.moe.experts, plain.moe.top_k, plain.moe.normalize, plain.d_ff) == (4, 2, True, 16)
    assert (plain.moe.shared_d_ff, plain.moe.dense_layers) == (None, None)
    assert (plain.embedding_multiplier, plain.residual_multiplier) == (12.0, 0.22)
    assert (plain.logit_multiplier, plain.attention_scale) == (1 / 6.0, 0.015625)
    assert (biased.bias.qkv, biased.bias.attn_out, biased.moe.top_k, biased.moe.normalize) == (
        True,
        True,
        1,
        True,
    )
    assert (shared.moe.shared_d_ff, shared.moe.shared_gate) == (24, False)
    assert none.moe is not None and none.moe.shared_d_ff is None


def test_a_checkpoint_of_transformers_5s_names_imports_alike(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """The weights as transformers 5 holds them in memory (``router.weight``,
    ``experts.gate_up_proj``, ``experts.down_proj``): the same spec and tensors."""
    variant = imported["granitemoeshared"]
    folder = stacked_copy(variant, tmp_path)
    assert "model.layers.1.block_sparse_moe.experts.gate_up_proj" in saved_names(folder)
    result = import_folder(folder, "held", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model == variant.spec.model
    ours = load_trained_model(result.run_dir)[1]
    for key, value in ours.state_dict().items():
        assert torch.equal(value, variant.model.state_dict()[key]), key


def test_stacked_experts_of_another_count_are_an_hf_error(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = edited(imported, "granitemoe", tmp_path, num_local_experts=3)
    with pytest.raises(HFError, match=r"input_linear\.weight has shape \(4, 32, 32\), not 3 experts"):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wrong").exists()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    variant = imported[name]
    written = "GraniteMoeSharedForCausalLM" if name == "granitemoeshared" else "GraniteMoeForCausalLM"
    assert export_hf(variant.result.run_dir, tmp_path / "out") == written
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model.moe == variant.spec.model.moe


LLAMA_LIKE = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "positional: rope, norm: {type: rmsnorm}, activation: swiglu, d_ff: 48, "
    "bias: {qkv: false, attn_out: false, ffn: false}"
)
# tfcompile's own mixtures of experts that GraniteMoE or GraniteMoeShared write
OWN = {
    # multipliers: GraniteMoE
    "multipliers": (
        f"{LLAMA_LIKE}, embedding_multiplier: 2.0, logit_multiplier: 0.5, moe: {{experts: 4, d_ff: 16}}",
        "GraniteMoeForCausalLM",
    ),
    # an attention scale of its own, top 1: GraniteMoE
    "attention scale": (
        f"{LLAMA_LIKE}, attention_scale: 0.1, moe: {{experts: 3, top_k: 1, normalize: true}}",
        "GraniteMoeForCausalLM",
    ),
    # an ungated shared expert, no multipliers: GraniteMoeShared at scales of 1 (Qwen2-MoE gates its own)
    "ungated shared expert": (
        f"{LLAMA_LIKE}, moe: {{experts: 4, d_ff: 16, shared_d_ff: 8}}",
        "GraniteMoeSharedForCausalLM",
    ),
}


@pytest.mark.parametrize("name", list(OWN))
def test_a_run_of_tfcompiles_own_mixture_of_experts_is_written_as_granitemoe(
    name: str, tmp_path: Path
) -> None:
    spec_text, written = OWN[name]
    run = random_run(tmp_path, f"model: {{{spec_text}}}\n")
    spec, ours = load_trained_model(run)
    assert export_hf(run, tmp_path / "out") == written
    _loads_alike(tmp_path / "out", ours)
    with pytest.warns(HFWarning, match="no tokenizer.json"):  # a random run has none
        again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs").spec.model
    assert again.moe == spec.model.moe


@pytest.mark.parametrize(
    ("extra", "fields", "written"),
    [
        (
            "residual_multiplier: 0.5, qk_norm: true, moe: {experts: 4, dense_layers: [0]}",
            ["model.moe.dense_layers", "model.qk_norm"],
            "GraniteMoE",
        ),
        (
            "residual_multiplier: 0.5, moe: {experts: 4, top_k: 2, normalize: false}",
            ["model.moe.normalize"],
            "GraniteMoE",
        ),
        (
            "residual_multiplier: 0.5, window: {size: 4}, "
            "moe: {experts: 4, shared_d_ff: 8, shared_gate: true}",
            ["model.moe.shared_gate", "model.window"],
            "GraniteMoeShared",
        ),
        (  # transformers 4.57's GraniteMoE reads hidden_size / heads: its folder did not load there
            "residual_multiplier: 0.5, head_dim: 16, moe: {experts: 4}",
            ["model.head_dim"],
            "GraniteMoE",
        ),
    ],
    ids=["dense-layers-qk-norm", "unnormalised", "gated-shared-expert-window", "head-dim"],
)
def test_what_granitemoe_cannot_express_is_refused_by_field(
    extra: str, fields: list[str], written: str, tmp_path: Path
) -> None:
    run = random_run(tmp_path, f"model: {{{LLAMA_LIKE}, {extra}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == fields, str(error.value)
    assert f"{written} equivalent" in str(error.value) and not (tmp_path / "out").exists()


def test_the_router_takes_the_top_ks_softmax(imported: dict[str, Imported]) -> None:
    """GraniteMoE takes the softmax of the top k logits; the spec's renormalised softmax over every
    expert is the same, and so are the logits, where the last layer's router is sharpened."""
    variant = imported["granitemoe"]
    hf, ours = variant.hf, variant.model
    with torch.no_grad():
        hf.model.layers[1].block_sparse_moe.router.weight.mul_(20)
        ours.state_dict()["blocks.1.ffn.router.weight"].mul_(20)
    try:
        for padded in (False, True):
            assert max_difference(hf, ours, padded) <= 1e-5
    finally:
        with torch.no_grad():
            hf.model.layers[1].block_sparse_moe.router.weight.div_(20)
            ours.state_dict()["blocks.1.ffn.router.weight"].div_(20)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["granitemoe"], "GraniteMoeForSequenceClassification", tmp_path)


def test_from_pretrained_reads_every_tensor_of_an_export(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    export_hf(imported["granitemoeshared"].result.run_dir, tmp_path / "out")
    _, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info


# ------------------------------------------------------------------ every config field, by value


def rows(f: str) -> list[Case]:
    return [
        case(  # the fields that take any value at once: each row below sets one
            f,
            num_key_value_heads=1,
            attention_bias=True,
            tie_word_embeddings=True,
            hidden_act="gelu",
            rms_norm_eps=1e-2,
            attention_dropout=0.3,
            initializer_range=0.5,
            router_aux_loss_coef=0.02,
            spec={
                "n_kv_heads": 1,
                "bias.qkv": True,
                "bias.attn_out": True,
                "tie_embeddings": True,
                "activation": "geglu",
                "norm.eps": 1e-2,
                "dropout.attention": 0.3,
                "moe.balance_loss": 0.02,
            },
        ),
        case(f, num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
        case(f, num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
        case(f, outcome="num_key_value_heads", num_key_value_heads=3),
        case(f, attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
        case(f, tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
        case(f, hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
        case(f, outcome="hidden_act", hidden_act="relu", slow=True),
        case(f, rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
        case(f, attention_dropout=0.3, slow=True),  # training only
        case(f, initializer_range=0.5, slow=True),
        case(f, use_cache=False, slow=True),
        case(f, slow=True, **IDS),
        case(f, pad_token_id=None, slow=True),
        case(f, max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
        case(f, intermediate_size=40, spec={"d_ff": 40}, slow=True),
        case(f, vocab_size=VOCAB, slow=True),
        # not written back: transformers 4.57's GraniteMoE reads hidden_size / heads, not head_dim
        case(f, head_dim=16, spec={"head_dim": 16}, exported=False, slow=True),
        case(f, hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
        case(f, num_hidden_layers=1, slow=True),
        # the multipliers; logits_scaling divides the logits
        case(f, embedding_multiplier=1.0, spec={"embedding_multiplier": 1.0}, slow=True),
        case(f, residual_multiplier=1.0, spec={"residual_multiplier": 1.0}, slow=True),
        case(f, logits_scaling=0.5, spec={"logit_multiplier": 2.0}),
        case(f, outcome="logits_scaling", logits_scaling=0.0, slow=True),
        case(f, attention_multiplier=0.5, spec={"attention_scale": 0.5}, slow=True),
        # null: transformers' SDPA scales by its default, 1/sqrt(head_dim)
        case(f, json={"attention_multiplier": None}, spec={"attention_scale": 1 / math.sqrt(8)}),
        # the experts
        case(f, num_local_experts=3, spec={"moe.experts": 3}, slow=True),
        case(f, num_experts_per_tok=1, spec={"moe.top_k": 1, "moe.normalize": True}),
        case(f, num_experts_per_tok=4, spec={"moe.top_k": 4}, slow=True),
        case(f, outcome="num_experts_per_tok", num_experts_per_tok=5, slow=True),
        case(f, router_aux_loss_coef=0.0, spec={"moe.balance_loss": 0.0}, slow=True),
        case(f, output_router_logits=True, slow=True),  # training only: the loss's balance term
        case(f, outcome="sliding_window", json={"sliding_window": 4, "use_sliding_window": True}, slow=True),
        case(f, json={"sliding_window": 32, "use_sliding_window": True}, spec={"window": None}, slow=True),
        case(
            f, rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}
        ),
        case(f, **rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
        case(f, **rope(**YARN), spec={"positional.scaling.factor": 4.0}, slow=True),
        case(
            f,
            json={"rope_parameters": DELETE, "rope_theta": 777.0},
            spec={"positional.theta": 777.0},
            slow=True,
        ),
        case(
            f,
            outcome="architectures",
            json={"architectures": ["GraniteMoeForTokenClassification"]},
            slow=True,
        ),
    ]


CASES: list[Case] = [
    *rows("granitemoe"),
    *rows("granitemoeshared"),
    case(
        "granitemoeshared", shared_intermediate_size=8, spec={"moe.shared_d_ff": 8, "moe.shared_gate": False}
    ),
    case("granitemoeshared", shared_intermediate_size=0, spec={"moe.shared_d_ff": None}, slow=True),
    # left out: GraniteMoeSharedConfig's 0, no shared expert
    case(
        "granitemoeshared",
        shared_intermediate_size=0,
        json={"shared_intermediate_size": DELETE},
        spec={"moe.shared_d_ff": None},
        slow=True,
    ),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to either config class fails this until a row of CASES says what
    it does (or the family's tiny base sets it)."""
    assert uncovered(model_type, CASES) == set()
