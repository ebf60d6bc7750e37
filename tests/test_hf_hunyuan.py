"""HunYuan (``HunYuanDenseV1ForCausalLM``: Hunyuan-0.5B to 7B): Llama's blocks with each head's q
and k normalised after RoPE turns them (``query_layernorm``, ``key_layernorm``:
``qk_norm_after_rope``), ``attention_bias`` on q, k, v and o, and HunYuan's NTK alpha (a dynamic RoPE
with an ``alpha``: no scaling, theta x alpha^(head_dim / (head_dim - 2))). Tiny random transformers
models saved with save_pretrained, imported, and held to transformers' logits (float32, rows padded
on the right and not), their parameter counts and greedy generation through the ONNX bundle;
export-hf writes them back as HunYuan, and tfcompile's own decoders of q/k norms after RoPE too. A
row for every field of HunYuanDenseV1Config (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import random_run
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants
from test_hf_export import _loads_alike
from test_hf_fields import (
    DELETE,
    FAMILIES,
    IDS,
    LLAMA3,
    YARN,
    Case,
    Family,
    _pytest_cases,
    case,
    check,
    rope,
    uncovered,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
HUNYUAN = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    head_dim=8,
)
FAMILIES["hunyuan_v1_dense"] = Family(
    T.HunYuanDenseV1Config, T.HunYuanDenseV1ForCausalLM, "gpt2", HUNYUAN | TOKENS
)
# Hunyuan-7B's RoPE, shrunk: a dynamic one with an alpha, read by transformers as a fixed larger theta
NTK_ALPHA = {"rope_type": "dynamic", "rope_theta": 100.0, "alpha": 1000.0, "factor": 1.0}


def hunyuan(**fields: Any) -> Any:
    return T.HunYuanDenseV1ForCausalLM(T.HunYuanDenseV1Config(**HUNYUAN | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Hunyuan-7B's shape, shrunk: the NTK alpha, grouped K/V heads, tied
    "hunyuan": lambda: hunyuan(rope_parameters=NTK_ALPHA, tie_word_embeddings=True),
    # biases on q, k, v and o, heads wider than hidden_size / heads, Llama 3's scaling, untied
    "hunyuan_biases": lambda: hunyuan(
        attention_bias=True,
        head_dim=16,
        rope_parameters={"rope_theta": 500.0, **LLAMA3, "original_max_position_embeddings": 8},
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
    ntk, biased = imported["hunyuan"].spec.model, imported["hunyuan_biases"].spec.model
    assert (ntk.qk_norm, ntk.qk_norm_after_rope, ntk.qk_norm_over) == (True, True, "head")
    assert ntk.positional.scaling is None
    assert ntk.positional.theta == pytest.approx(100.0 * 1000.0 ** (8 / 6), rel=1e-12)
    assert (biased.bias.qkv, biased.bias.attn_out, biased.bias.ffn, biased.head_dim) == (
        True,
        True,
        False,
        16,
    )
    assert biased.positional.scaling is not None and biased.positional.scaling.type == "llama3"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "HunYuanDenseV1ForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


BODY = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
    "max_seq_len: 16, norm: {type: rmsnorm}, qk_norm: true, qk_norm_after_rope: true, activation: swiglu"
)
# tfcompile's own decoders of q/k norms after RoPE: written as HunYuan
NATIVE = {
    # interleaved pairs: the q and k rows and the norms' scales reordered to halves
    "interleaved, biases": f"{BODY}, positional: rope, bias: {{qkv: true, attn_out: true, ffn: false}}",
    "halves, YaRN": f"{BODY}, positional: {{type: rope, layout: halves, scaling: {{type: yarn, factor: 2.0, "
    "original_max_position_embeddings: 8}}, bias: {qkv: false, attn_out: false, ffn: false}",
}


@pytest.mark.parametrize("kind", list(NATIVE))
def test_a_run_of_q_and_k_norms_after_rope_is_written_as_hunyuan(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{NATIVE[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "HunYuanDenseV1ForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


DYNAMIC = "{type: dynamic, factor: 2.0, original_max_position_embeddings: 16}"


@pytest.mark.parametrize(
    ("model", "fields", "written"),
    [
        (
            f"{BODY}, positional: {{type: rope, scaling: {DYNAMIC}}}, window: {{size: 4}}, "
            "bias: {qkv: false, attn_out: false, ffn: true}",
            ["model.window", "model.positional.scaling", "model.bias.ffn"],
            "HunYuan",
        ),
        # q/k norms after RoPE in a model another writer takes: refused by the field
        (
            BODY.replace("norm: {type: rmsnorm}", "norm: {type: rmsnorm, position: output}")
            + ", positional: rope, bias: {qkv: false, attn_out: false, ffn: false}",
            ["model.qk_norm_after_rope"],
            "EXAONE 4",
        ),
        (
            BODY.replace("swiglu", "geglu_tanh").replace(
                "{type: rmsnorm}", "{type: rmsnorm, position: sandwich}"
            )
            + ", positional: rope, scale_embeddings: true, bias: {qkv: false, attn_out: false, ffn: false}",
            ["model.qk_norm_after_rope"],
            "Gemma 3",
        ),
    ],
    ids=["hunyuan", "exaone4", "gemma3"],
)
def test_what_no_writer_computes_is_refused_by_field(
    model: str, fields: list[str], written: str, tmp_path: Path
) -> None:
    """HunYuan's own problems, or the field where another writer has q/k norms before RoPE."""
    run = random_run(tmp_path, f"model: {{{model}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    named = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert named == fields if written == "HunYuan" else set(fields) <= set(named), str(error.value)
    assert f"{written}" in str(error.value) and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["hunyuan"], "HunYuanDenseV1ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("hunyuan_v1_dense", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
        },
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(rms_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}, slow=True),  # HunYuanDenseV1Config's
    row(attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(eod_token_id=5, slow=True),  # a token id: computes nothing
    row(pretraining_tp=2, slow=True),  # training only in transformers 5
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(intermediate_size=40, spec={"d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    # left out or null: HunYuanDenseV1Config keeps none, and its attention fails
    row(outcome="head_dim", json={"head_dim": DELETE}),
    row(outcome="head_dim", json={"head_dim": None}, slow=True),
    row(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    row(outcome="sliding_window", json={"sliding_window": 4, "use_sliding_window": True}, slow=True),
    row(json={"sliding_window": 32, "use_sliding_window": True}, spec={"window": None}, slow=True),
    # published configs' fields transformers reads no more (its q/k norms are always there; no CLA)
    row(json={"use_qk_norm": False, "use_cla": True, "cla_share_factor": 2}, slow=True),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    # dynamic without an alpha: transformers' dynamic scaling (which transformers 4's HunYuan fails on)
    row(**rope(rope_type="dynamic", factor=2.0), spec={"positional.scaling.type": "dynamic"}, exported=False),
    # with one: NTK alpha, a fixed theta
    row(
        rope_parameters=NTK_ALPHA,
        spec={"positional.theta": 100.0 * 1000.0 ** (8 / 6), "positional.scaling": None},
    ),
    row(json={"rope_parameters": DELETE, "rope_theta": 100.0, "rope_scaling": NTK_ALPHA}, slow=True),
    row(
        rope_parameters=NTK_ALPHA | {"alpha": 0.0},
        spec={"positional.scaling.type": "dynamic"},
        exported=False,
    ),
    row(outcome="rope_parameters.alpha", json=rope(**NTK_ALPHA | {"alpha": -2.0}), slow=True),
    # an alpha without a factor: transformers 5 refuses the dynamic dict (4 computed the alpha)
    row(
        outcome="rope_parameters.factor",
        json={"rope_parameters": {k: v for k, v in NTK_ALPHA.items() if k != "factor"}},
        slow=True,
    ),
    row(outcome="rope_parameters.alpha", json=rope(**NTK_ALPHA | {"alpha": "1000"}), slow=True),
    row(**rope(**YARN), spec={"positional.scaling.factor": 4.0}, slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["HunYuanDenseV1ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to HunYuanDenseV1Config fails this until a row of CASES says what
    it does (or the family's tiny base sets it)."""
    assert uncovered("hunyuan_v1_dense", CASES) == set()
