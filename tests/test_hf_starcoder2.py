"""Starcoder2 (``Starcoder2ForCausalLM``): tiny random transformers models saved with
save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right and
not), its parameter counts and greedy generation; written back with export-hf (as Starcoder2, or
with a K/V head per head as GPT-NeoX); tfcompile's own runs of LayerNorm blocks in turn with
grouped K/V heads written as Starcoder2 or refused by field; and a row for every field of
Starcoder2Config (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, perturb, write
from test_hf_export import _loads_alike, _problems
from test_hf_fields import (
    DELETE,
    FAMILIES,
    IDS,
    UNREAD,
    Case,
    Family,
    _class_fields,
    _pytest_cases,
    case,
    check,
    longrope,
)

from tfcompile.hf import exporter
from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec import parse_spec
from tfcompile.spec.schema import SlidingWindow
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does
# (Starcoder2Config's own ids, 50256, lie past the tiny vocabulary).
TOKENS = dict(bos_token_id=0, eos_token_id=0)
STARCODER2 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
FAMILIES["starcoder2"] = Family(T.Starcoder2Config, T.Starcoder2ForCausalLM, "gpt2", STARCODER2 | TOKENS)


def starcoder2(**fields: Any) -> Any:
    return T.Starcoder2ForCausalLM(T.Starcoder2Config(**STARCODER2 | TOKENS | fields))


# name -> (the model, the head class export-hf writes its import as)
VARIANTS: dict[str, tuple[Callable[[], Any], str]] = {
    # StarCoder2's shape: 2 K/V heads of 4, biases on every projection, the tanh GELU, tied
    "starcoder2": (lambda: starcoder2(), "Starcoder2ForCausalLM"),
    # no biases, an untied head, a K/V head per head: GPT-NeoX's blocks, written as GPT-NeoX
    "starcoder2_mha_untied_no_bias": (
        lambda: starcoder2(
            num_key_value_heads=4,
            use_bias=False,
            tie_word_embeddings=False,
            hidden_act="gelu",
            norm_epsilon=1e-3,
        ),
        "GPTNeoXForCausalLM",
    ),
    # every layer slides over 12 positions of 32
    "starcoder2_window": (lambda: starcoder2(sliding_window=12), "Starcoder2ForCausalLM"),
    # linear RoPE scaling at a theta of its own, heads wider than hidden_size / heads, one K/V head
    "starcoder2_linear": (
        lambda: starcoder2(
            head_dim=12,
            num_key_value_heads=1,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        ),
        "Starcoder2ForCausalLM",
    ),
}


def imported_variant(root: Path, name: str) -> Imported:
    """The variant saved and imported."""

    def write_to(folder: Path) -> None:
        torch.manual_seed(0)
        write(perturb(VARIANTS[name][0]()), "gpt2", folder)

    return Imported(root, name, write_to, "error")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("hf")
    return {name: imported_variant(root, name) for name in VARIANTS}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def model(name: str) -> Any:
        return imported[name].spec.model

    plain, mha = model("starcoder2"), model("starcoder2_mha_untied_no_bias")
    window, linear = model("starcoder2_window"), model("starcoder2_linear")
    assert (plain.norm.type, plain.norm.position, plain.norm.bias, plain.norm.final) == (
        "layernorm",
        "pre",
        True,
        True,
    )
    assert (plain.block.type, plain.activation, plain.n_kv_heads, plain.tie_embeddings) == (
        "sequential",
        "gelu_tanh",
        2,
        True,
    )
    assert (plain.positional.layout, plain.positional.rotary_dims, plain.positional.theta) == (
        "halves",
        8,
        10000.0,
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.bias.lm_head) == (
        True,
        True,
        True,
        False,
    )
    assert (plain.max_seq_len, plain.d_ff) == (32, 48)
    assert (mha.bias.qkv, mha.bias.attn_out, mha.bias.ffn, mha.tie_embeddings) == (False, False, False, False)
    assert (mha.n_kv_heads, mha.activation, mha.norm.eps) == (4, "gelu", 1e-3)
    assert (window.max_seq_len, window.window) == (32, SlidingWindow(size=12))
    assert (
        linear.head_dim,
        linear.n_kv_heads,
        linear.positional.theta,
        linear.positional.scaling.factor,
    ) == (
        12,
        1,
        500.0,
        2.0,
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant, written = imported[name], VARIANTS[name][1]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == written
    _loads_alike(tmp_path / "out", variant.model)
    if written == "Starcoder2ForCausalLM":  # GPT-NeoX's feed-forward biases are there, as zeros
        again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
        assert again.spec.model == variant.spec.model


def test_the_window_is_written_back_and_a_run_without_one_slides_no_layer_within_its_context(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """A run without a window is written with one of max_seq_len: the folder computes the run's
    causal attention over every length the run has."""
    export_hf(imported["starcoder2"].result.run_dir, tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert (config["sliding_window"], config["max_position_embeddings"]) == (32, 32)
    export_hf(imported["starcoder2_window"].result.run_dir, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["sliding_window"], config["max_position_embeddings"]) == (12, 32)
    assert (config["use_bias"], config["hidden_act"], config["rope_theta"]) == (
        True,
        "gelu_pytorch_tanh",
        10000.0,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_tfcompile_generate_gives_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts of different lengths, one left-padded batch in the bundle (ONNX, KV cache),
    each as transformers generates it alone."""
    imported[name].assert_generates_as_transformers(tmp_path, capsys, new_tokens=8)


# -------------------------------------------------------------- tfcompile's own runs as Starcoder2

TINY = "family: decoder, vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 16"
ROPE = f"{TINY}, n_layers: 2, positional: rope"
# Hand-written RoPE specs -> the model_type of the one architecture whose candidate each is: LayerNorm
# blocks in turn with fewer K/V heads than heads are Starcoder2's, the other LayerNorm or parallel
# blocks GPT-NeoX's.
NATIVE: dict[str, tuple[str, str]] = {
    "layernorm gqa": (f"{ROPE}, n_kv_heads: 2", "starcoder2"),
    "layernorm mqa": (f"{ROPE}, n_kv_heads: 1", "starcoder2"),
    "layernorm mha": (f"{ROPE}, n_kv_heads: 4", "gpt_neox"),
    "parallel gqa": (f"{ROPE}, n_kv_heads: 2, block: parallel", "gpt_neox"),
    "rmsnorm gqa": (f"{ROPE}, n_kv_heads: 2, norm: {{type: rmsnorm}}", "llama"),
    "layernorm gqa scaled": (f"{ROPE}, n_kv_heads: 2, scale_embeddings: true", "gemma"),
}


@pytest.mark.parametrize("name", list(NATIVE))
def test_exactly_one_architecture_writes_each_spec(name: str) -> None:
    model, model_type = NATIVE[name]
    assert exporter.candidates(parse_spec(f"model: {{{model}}}\n")) == [ARCHITECTURES[model_type]]


# tfcompile's own runs written as Starcoder2: interleaved pairs permuted to transformers' halves,
# biases Starcoder2 has and the run does not (LayerNorm biases included) as zeros, a scaled output
# folded into the final norm.
WRITTEN = {
    "interleaved, some biases, untied, scaled output": f"{ROPE}, n_kv_heads: 2, "
    "bias: {qkv: true, attn_out: false, ffn: false}, norm: {bias: false}, tie_embeddings: false, "
    "scale_output: true",
    "interleaved, no biases, dynamic, relu": f"{TINY}, n_layers: 2, n_kv_heads: 1, positional: {{type: rope, "
    "theta: 500, scaling: {type: dynamic, factor: 2, original_max_position_embeddings: 16}}, "
    "bias: {qkv: false, attn_out: false, ffn: false}, activation: relu",
    "halves, yarn, heads of their own width, ffn biases only": f"{TINY}, n_layers: 1, n_kv_heads: 2, "
    "head_dim: 12, positional: {type: rope, layout: halves, scaling: {type: yarn, factor: 2, "
    "original_max_position_embeddings: 8}}, bias: {qkv: false, attn_out: false, ffn: true}, activation: silu",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_layernorm_run_with_grouped_kv_heads_is_written_as_starcoder2(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{WRITTEN[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "Starcoder2ForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_a_layernorm_run_with_a_kv_head_per_head_is_still_written_as_gpt_neox(tmp_path: Path) -> None:
    run = random_run(tmp_path, f"model: {{{ROPE}, bias: {{qkv: false}}}}\n")
    assert export_hf(run, tmp_path / "out") == "GPTNeoXForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


# Specs of Starcoder2's blocks with what it cannot compute -> the fields its refusal names, in order.
REFUSED = {
    "extras": (
        f"{ROPE}, n_kv_heads: 2, activation: swiglu, norm: {{final: false}}, qk_norm: true, "
        "attention_scale: 0.25, bias: {lm_head: true}, attention_softcap: 50, logit_softcap: 30",
        [
            "model.activation",
            "model.norm.final",
            "model.attention_scale",
            "model.bias.lm_head",
            "model.qk_norm",
            "model.attention_softcap",
            "model.logit_softcap",
        ],
    ),
    "rope": (
        f"{TINY}, n_layers: 2, n_kv_heads: 2, positional: {{type: rope, rotary_dims: 4, "
        "scaling: {type: dynamic, factor: 2, original_max_position_embeddings: 8}, "
        "local: {theta: 100, layers: [1]}}",
        [
            "model.positional.scaling.original_max_position_embeddings",
            "model.positional.local",
            "model.positional.rotary_dims",
        ],
    ),
    "post-norm": (
        f"{ROPE}, n_kv_heads: 2, norm: {{position: post}}",
        ["model.norm.position", "model.norm.final"],
    ),
    "sandwich": (f"{ROPE}, n_kv_heads: 2, norm: {{position: sandwich}}", ["model.norm.position"]),
    "embedding norm": (f"{ROPE}, n_kv_heads: 2, embedding_norm: true", ["model.embedding_norm"]),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_starcoder2_cannot_compute_is_refused_by_field(name: str, tmp_path: Path) -> None:
    model, refused = REFUSED[name]
    assert exporter.candidates(parse_spec(f"model: {{{model}}}\n")) == [ARCHITECTURES["starcoder2"]]
    message = _problems(tmp_path, model)
    assert re.findall(r"^  (\S+): ", message, re.MULTILINE) == refused, message
    assert "has no Starcoder2 equivalent" in message


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write(imported["starcoder2"].hf, "gpt2", folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Starcoder2ForSequenceClassification"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        HFError, match=r"  architectures: Starcoder2ForSequenceClassification is not a language"
    ):
        import_folder(folder, "cls", tmp_path / "specs", tmp_path / "runs")


def test_a_checkpoint_missing_a_bias_use_bias_names_is_refused(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "src"
    write(imported["starcoder2"].hf, "gpt2", folder)
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.c_proj.bias"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(HFError, match=r"the tensor layers\.1\.mlp\.c_proj\.bias is missing"):
        import_folder(folder, "missing", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "missing").exists()


# ------------------------------------------------------------------ every config field, by value


def rope(**fields: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": 10000.0, **fields}}


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)


def row(**fields: Any) -> Case:
    return case("starcoder2", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        use_bias=False,
        tie_word_embeddings=False,
        hidden_act="relu",
        norm_epsilon=1e-3,
        attention_dropout=0.3,
        residual_dropout=0.2,
        embedding_dropout=0.1,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": False,
            "bias.attn_out": False,
            "bias.ffn": False,
            "tie_embeddings": False,
            "activation": "relu",
            "norm.eps": 1e-3,
            "dropout.attention": 0.3,
            "dropout.residual": 0.2,
            "dropout.embedding": 0.1,
        },
    ),
    # the attention: MQA, grouped, a K/V head per head (written as GPT-NeoX), not a divisor
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(json={"num_key_value_heads": DELETE}, spec={"n_kv_heads": 2}, slow=True),  # the class's 2
    row(num_attention_heads=2, num_key_value_heads=1, spec={"n_heads": 2}, slow=True),
    # a head_dim in config.json, which Starcoder2Config does not name and transformers reads
    row(head_dim=16, spec={"head_dim": 16, "positional.rotary_dims": 16}),
    row(head_dim=4, spec={"head_dim": 4}, slow=True),
    row(json={"head_dim": None}, spec={"head_dim": 8}, slow=True),
    row(use_bias=False, spec={"bias.qkv": False, "bias.ffn": False}),
    row(use_bias=True, spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": True}, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu", spec={"activation": "gelu"}, slow=True),
    row(hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    row(hidden_act="silu", spec={"activation": "silu"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(norm_epsilon=1e-3, slow=True),
    row(attention_dropout=0.3, residual_dropout=0.2, embedding_dropout=0.1, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(initializer_range=0.0, slow=True),  # initialisation only: never read by an import
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # every layer slides over sliding_window (a window of the whole context or more is none)
    row(sliding_window=6, spec={"max_seq_len": 32, "window.size": 6, "window.layers": None}),
    row(sliding_window=32, spec={"window": None}, slow=True),
    row(sliding_window=40, spec={"window": None}, slow=True),
    row(sliding_window=None, spec={"window": None}, slow=True),
    row(json={"sliding_window": DELETE}, spec={"window": None}, slow=True),
    row(outcome="sliding_window", json={"sliding_window": 0}),  # transformers fails on it
    # unread by Starcoder2, which slides every layer: Mistral's and Qwen2's switches
    row(
        json={"sliding_window": 6, "use_sliding_window": False, "layer_types": ["full_attention"] * 2},
        slow=True,
    ),
    # RoPE: theta, each scaling type, as transformers 5 writes it and 4 (legacy keys)
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0)),
    row(**rope(rope_type="dynamic", factor=2.0), sliding_window=6, slow=True),  # scales past 32, unseen
    row(**rope(**YARN), slow=True),
    row(**rope(**LLAMA3, original_max_position_embeddings=8), slow=True),
    row(**rope(**longrope())),
    row(outcome="partial_rotary_factor", **rope(rope_type="default", partial_rotary_factor=0.5)),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(
        json={
            "rope_parameters": DELETE,
            "rope_theta": 33.0,
            "rope_scaling": {"type": "linear", "factor": 3.0},
        },
        spec={"positional.theta": 33.0, "positional.scaling.factor": 3.0},
        slow=True,
    ),
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 10000.0}, slow=True),
    # the published configs' fields no transformers reads
    row(json={"mlp_type": "default", "norm_type": "layer_norm"}, slow=True),
    row(outcome="architectures", json={"architectures": ["Starcoder2ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Starcoder2Config fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES["starcoder2"].base)
    covered |= set().union(*(c.fields() for c in CASES))
    assert _class_fields("starcoder2") - covered == set()


def _activation_cases() -> list[Any]:
    from transformers.activations import ACT2CLS

    return [pytest.param(act, id=act, marks=pytest.mark.slow) for act in sorted(ACT2CLS)]


@pytest.mark.parametrize("value", _activation_cases())
def test_every_activation_name_is_computed_alike_or_refused_by_name(value: str, tmp_path: Path) -> None:
    try:
        FAMILIES["starcoder2"].config(**(FAMILIES["starcoder2"].base | {"hidden_act": value}))
    except Exception:  # transformers refuses it itself
        pytest.skip(f"transformers builds no model with hidden_act={value}")
    try:
        check(case("starcoder2", hidden_act=value), tmp_path)
    except HFError as error:  # refused by the import, which check does not expect of a SAME row
        assert "  hidden_act: " in str(error)
