"""OLMo (``OlmoForCausalLM``): LLaMA's blocks with LayerNorms that learn nothing (``norm: {type:
layernorm, scale: false, bias: false}``, epsilon 1e-5 whatever the config says) and ``clip_qkv``
as ``qkv_clip``; OLMo 2 (``Olmo2ForCausalLM``): RMSNorms on each sublayer's output only (``norm:
{position: output}``) and q and k each normalised over all heads at once (``qk_norm_over:
all_heads``). Tiny random transformers models saved with save_pretrained, imported, and held to
transformers' logits (float32, rows padded on the right and not), their parameter counts and
greedy generation through the ONNX bundle; export-hf writes OLMo 2 back (tfcompile's own runs of
its blocks too, or refuses them by field) and refuses OLMo by field (no architecture it writes has
such norms); a row for every field of OlmoConfig and Olmo2Config (tests/test_hf_fields.py's table
and check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
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

from tfcompile.hf import exporter
from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec import parse_spec
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=1)
OLMO = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
FAMILIES["olmo"] = Family(T.OlmoConfig, T.OlmoForCausalLM, "gpt2", OLMO | TOKENS)
FAMILIES["olmo2"] = Family(T.Olmo2Config, T.Olmo2ForCausalLM, "gpt2", OLMO | TOKENS)


def olmo(**fields: Any) -> Any:
    return T.OlmoForCausalLM(T.OlmoConfig(**OLMO | TOKENS | fields))


def olmo2(**fields: Any) -> Any:
    return T.Olmo2ForCausalLM(T.Olmo2Config(**OLMO | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # OLMo-1B's shape: a K/V head per head, no biases, an untied head
    "olmo": lambda: olmo(num_key_value_heads=4),
    # OLMo 1.7's clip_qkv at a value that clamps some of the tiny model's q, k and v
    "olmo_clipped": lambda: olmo(clip_qkv=0.05, attention_bias=True, tie_word_embeddings=True),
    # OLMo 2's shape: a K/V head per head, no biases, tied (the 1B's)
    "olmo2": lambda: olmo2(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-6),
    # grouped K/V heads (the k norm narrower than the q norm), biases, untied, a RoPE theta of its own
    "olmo2_gqa": lambda: olmo2(
        attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}
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
    plain, clipped = imported["olmo"].spec.model, imported["olmo_clipped"].spec.model
    second, grouped = imported["olmo2"].spec.model, imported["olmo2_gqa"].spec.model
    assert second.norm.model_dump() == {
        "position": "output",
        "type": "rmsnorm",
        "eps": 1e-6,
        "scale": True,
        "bias": False,
        "final": True,
        "first_attention": True,
    }
    assert (second.qk_norm, second.qk_norm_over, second.tie_embeddings, grouped.norm.eps) == (
        True,
        "all_heads",
        True,
        1e-5,  # Olmo2Config's
    )
    assert (grouped.n_kv_heads, grouped.bias.qkv, grouped.bias.attn_out, grouped.positional.theta) == (
        2,
        True,
        True,
        500000.0,
    )
    q_norm = imported["olmo2_gqa"].model.blocks[0].attn.q_norm.weight
    k_norm = imported["olmo2_gqa"].model.blocks[0].attn.k_norm.weight
    assert (q_norm.numel(), k_norm.numel()) == (32, 16)
    assert plain.norm.model_dump() == {
        "position": "pre",
        "type": "layernorm",
        "eps": 1e-5,
        "scale": False,
        "bias": False,
        "final": True,
        "first_attention": True,
    }
    assert (plain.qkv_clip, plain.n_kv_heads, plain.tie_embeddings, plain.activation) == (
        None,
        4,
        False,
        "swiglu",
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn) == (False, False, False)
    assert (clipped.qkv_clip, clipped.bias.qkv, clipped.bias.attn_out, clipped.tie_embeddings) == (
        0.05,
        True,
        True,
        True,
    )


def test_the_clip_is_what_makes_the_clipped_model_agree(imported: dict[str, Imported]) -> None:
    """The clip of 0.05 changes the tiny model's logits: without it the import would differ."""
    variant = imported["olmo_clipped"]
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        clipped = variant.model(ids)
        for module in variant.model.modules():
            if hasattr(module, "clip"):
                module.clip = None
        unclipped = variant.model(ids)
    assert (clipped - unclipped).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["olmo2", "olmo2_gqa"])
def test_export_hf_writes_each_olmo_2_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "Olmo2ForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


@pytest.mark.parametrize("name", ["olmo", "olmo_clipped"])
def test_export_hf_refuses_an_olmo_by_its_norms(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    with pytest.raises(HFError, match=r"\n  model\.norm\.scale: ") as error:
        export_hf(imported[name].result.run_dir, tmp_path / "out")
    assert ("  model.qkv_clip: " in str(error.value)) == (name == "olmo_clipped")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["olmo"], "OlmoForSequenceClassification", tmp_path)


# ----------------------------------------------------------- tfcompile's own runs written as OLMo 2

ROPE = "family: decoder, vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 16, n_layers: 2"
OUTPUT = f"{ROPE}, norm: {{type: rmsnorm, position: output}}, activation: swiglu"
# Runs with OLMo 2's blocks: RoPE interleaved (permuted to transformers' halves, the q and k norms'
# dimensions with them) or in halves, grouped K/V heads, q/k biases as zeros where the run has none.
WRITTEN = {
    "interleaved, grouped, q/k/v biases": f"{OUTPUT}, positional: rope, n_kv_heads: 2, qk_norm: true, "
    "qk_norm_over: all_heads, bias: {qkv: true, attn_out: false, ffn: false}",
    "halves, one K/V head, untied, no biases": f"{OUTPUT}, positional: {{type: rope, layout: halves}}, "
    "n_kv_heads: 1, qk_norm: true, qk_norm_over: all_heads, tie_embeddings: false, "
    "bias: {qkv: false, attn_out: false, ffn: false}",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_run_of_olmo_2_blocks_is_written_as_olmo_2(kind: str, tmp_path: Path) -> None:
    run = random_run(tmp_path, f"model: {{{WRITTEN[kind]}}}\n")
    assert exporter.candidates(parse_spec(f"model: {{{WRITTEN[kind]}}}\n")) == [ARCHITECTURES["olmo2"]]
    assert export_hf(run, tmp_path / "out") == "Olmo2ForCausalLM"
    hf = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    for padded in (False, True):
        assert max_difference(hf, load_trained_model(run)[1], padded, length=16) <= 1e-5


# Runs of output norms with what OLMo 2 cannot compute -> the fields its refusal names.
REFUSED = {
    "no q/k norms": (f"{OUTPUT}, positional: rope, bias: {{ffn: false}}", ["model.qk_norm"]),
    # (each head's q/k norms: EXAONE 4's, tests/test_hf_exaone4.py)
    "ffn biases": (
        f"{OUTPUT}, positional: rope, qk_norm: true, qk_norm_over: all_heads",
        ["model.bias.ffn"],
    ),
    "a window, a final norm of none": (
        f"{ROPE}, norm: {{type: rmsnorm, position: output, final: false}}, activation: swiglu, "
        "positional: rope, qk_norm: true, qk_norm_over: all_heads, window: {size: 4}, bias: {ffn: false}",
        ["model.window", "model.norm.final"],
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_olmo_2_cannot_compute_is_refused_by_field(name: str, tmp_path: Path) -> None:
    model, refused = REFUSED[name]
    run = random_run(tmp_path, f"model: {{{model}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    fields = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert fields == refused, str(error.value)
    assert "OLMo 2" in str(error.value)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("olmo", exported=False, **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=True,
        hidden_act="gelu",
        clip_qkv=0.1,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "tie_embeddings": True,
            "activation": "geglu",
            "qkv_clip": 0.1,
            "dropout.attention": 0.3,
        },
    ),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # OlmoConfig: as many as heads
    row(num_key_value_heads=4, json={"num_key_value_heads": DELETE}, spec={"n_kv_heads": 4}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": False}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(clip_qkv=0.02, spec={"qkv_clip": 0.02}),
    row(clip_qkv=None, spec={"qkv_clip": None}, slow=True),
    row(outcome="clip_qkv", json={"clip_qkv": 0}),  # transformers clamps everything to 0
    row(outcome="clip_qkv", json={"clip_qkv": -1.0}, slow=True),
    # a window and layer_types in config.json, which OlmoConfig does not read: transformers' forward
    # attends over every position, its generation cache keeps the last 4 of the sliding layers: refused
    row(
        outcome="sliding_window",
        json={"sliding_window": 4, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True},
        slow=True,
    ),
    # a head_dim in config.json, which OlmoConfig does not name and transformers reads
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    # epsilons OlmoLayerNorm does not read (its 1e-5 is fixed)
    row(json={"rms_norm_eps": 0.5, "layer_norm_eps": 0.5}, spec={"norm.eps": 1e-5}),
    row(attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(json={"pad_token_id": DELETE}, slow=True),  # the class's 1
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # RoPE: theta, each scaling type, as transformers 5 writes it and 4 (legacy keys)
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="architectures", json={"architectures": ["OlmoForTokenClassification"]}, slow=True),
]


def row2(**fields: Any) -> Case:
    return case("olmo2", **fields)


CASES2: list[Case] = [
    row2(  # the fields that take any value at once: each row below sets one
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
    row2(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row2(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row2(outcome="num_key_value_heads", num_key_value_heads=3),
    row2(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),
    row2(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row2(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row2(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row2(outcome="hidden_act", hidden_act="quick_gelu"),
    row2(rms_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row2(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}),  # Olmo2Config's, not LlamaConfig's
    row2(outcome="rms_norm_eps", json={"rms_norm_eps": 0}, slow=True),
    row2(head_dim=16, spec={"head_dim": 16}, slow=True),
    # a window and layer_types in config.json, which Olmo2Config does not read: transformers' forward
    # attends over every position, its generation cache keeps the last 4 of the sliding layers: refused
    row2(
        outcome="sliding_window",
        json={"sliding_window": 4, "layer_types": ["sliding_attention"] * 2, "use_sliding_window": True},
        slow=True,
    ),
    # OLMo's clip_qkv, which OLMo 2 does not read
    row2(json={"clip_qkv": 0.01}, spec={"qkv_clip": None}, slow=True),
    row2(attention_dropout=0.3, slow=True),
    row2(initializer_range=0.5, slow=True),
    row2(use_cache=False, slow=True),
    row2(slow=True, **IDS),
    row2(pad_token_id=None, slow=True),
    row2(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row2(num_hidden_layers=1, slow=True),
    row2(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row2(vocab_size=VOCAB, slow=True),
    row2(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row2(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row2(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row2(**rope(**YARN), slow=True),
    row2(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row2(outcome="architectures", json={"architectures": ["Olmo2ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES + CASES2))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize(("model_type", "cases"), [("olmo", CASES), ("olmo2", CASES2)])
def test_every_config_field_has_a_case(model_type: str, cases: list[Case]) -> None:
    """A field transformers adds to OlmoConfig or Olmo2Config fails this until a row says what it
    does (or the family's tiny base sets it)."""
    assert uncovered(model_type, cases) == set()
