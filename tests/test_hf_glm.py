"""GLM and GLM-4 (``GlmForCausalLM``, ``Glm4ForCausalLM``: GLM-4-9B, GLM-4-0414, GLM-Z1): LLaMA's
blocks turning interleaved pairs of the first half of each head (``layout: interleaved`` and
``rotary_dims``, the q and k rows as saved), q, k and v biases (``attention_bias``, true where left
out), the gate and up projections in one ``gate_up_proj``; GLM-4 adds a norm on each sublayer's
output (``norm.position: sandwich``). Tiny random transformers models saved with save_pretrained,
imported, and held to transformers' logits (float32, rows padded on the right and not), their
parameter counts and greedy generation through the ONNX bundle. export-hf writes them back as GLM
and GLM-4, and tfcompile's own decoders with q, k and v biases or sandwich norms that turn part of
each head (halves permuted to interleaved pairs); a GLM without them is written as Phi-3 (its pairs
permuted to halves within the rotated width); transformers reloads each to the same logits. A row
for every field of GlmConfig and Glm4Config (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
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
    longrope,
    rope,
    uncovered,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.models import DecoderLM
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not (GlmConfig's are past the
# tiny vocabulary, as is its pad id).
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
GLM = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # GlmConfig's 128
    max_position_embeddings=32,
)
FAMILIES["glm"] = Family(T.GlmConfig, T.GlmForCausalLM, "gpt2", GLM | TOKENS)
FAMILIES["glm4"] = Family(T.Glm4Config, T.Glm4ForCausalLM, "gpt2", GLM | TOKENS)


def glm(**fields: Any) -> Any:
    return T.GlmForCausalLM(T.GlmConfig(**GLM | TOKENS | fields))


def glm4(**fields: Any) -> Any:
    return T.Glm4ForCausalLM(T.Glm4Config(**GLM | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # GLM-4-9B's shape, shrunk: grouped K/V heads, q/k/v biases, half of each head turned, untied
    "glm": lambda: glm(),
    # GLM-4-0414's: the sandwich norms, one K/V head, tied, a RoPE theta of its own
    "glm4": lambda: glm4(
        num_key_value_heads=1,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    ),
    # no biases, three quarters of each head turned: written as Phi-3
    "glm_no_bias": lambda: glm(
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
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
    plain, sandwich = imported["glm"].spec.model, imported["glm4"].spec.model
    assert (plain.positional.layout, plain.positional.rotary_dims, plain.norm.position) == (
        "interleaved",
        4,
        "pre",
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.tie_embeddings) == (
        True,
        False,
        False,
        False,
    )
    assert (sandwich.norm.position, sandwich.n_kv_heads, sandwich.tie_embeddings) == ("sandwich", 1, True)
    assert (sandwich.positional.theta, sandwich.positional.rotary_dims) == (500.0, 4)
    assert imported["glm_no_bias"].spec.model.positional.rotary_dims == 6


def test_the_interleaved_pairs_and_the_output_norms_are_what_makes_the_import_agree(
    imported: dict[str, Imported],
) -> None:
    """The same weights turned in halves, or read without GLM-4's output norms (GLM's blocks),
    differ: the layout and the norms are what the import holds."""
    variant = imported["glm"]
    positional = variant.spec.model.positional.model_copy(update={"layout": "halves"})
    halves = DecoderLM(variant.spec.model.model_copy(update={"positional": positional}))
    halves.load_state_dict(variant.model.state_dict())
    assert max_difference(variant.hf, halves.eval(), False) > 1e-3
    sandwich = imported["glm4"]
    without = T.GlmForCausalLM(T.GlmConfig(**sandwich.hf.config.to_dict() | {"model_type": "glm"}))
    state = sandwich.hf.state_dict()
    without.load_state_dict(
        {k: v for k, v in state.items() if "post_self_attn" not in k and "post_mlp" not in k}
    )
    assert max_difference(without.eval(), sandwich.model, False) > 1e-3


def test_export_hf_writes_a_glm_without_biases_as_phi3(imported: dict[str, Imported], tmp_path: Path) -> None:
    variant = imported["glm_no_bias"]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "Phi3ForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


@pytest.mark.parametrize(("name", "written"), [("glm", "GlmForCausalLM"), ("glm4", "Glm4ForCausalLM")])
def test_an_imported_run_round_trips(
    imported: dict[str, Imported], tmp_path: Path, name: str, written: str
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == written
    _loads_alike(tmp_path / "out", variant.model)


# tfcompile's own decoders that GLM writes
NATIVE = {
    "halves, q/k/v biases, grouped, untied": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, "
    "n_heads: 4, n_kv_heads: 2, max_seq_len: 16, norm: {type: rmsnorm}, activation: swiglu, "
    "tie_embeddings: false, bias: {qkv: true, attn_out: false, ffn: false}, "
    "positional: {type: rope, layout: halves, rotary_dims: 6}",
    "interleaved, sandwich norms, yarn": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, "
    "n_heads: 2, max_seq_len: 16, norm: {type: rmsnorm, position: sandwich}, activation: geglu_tanh, "
    "bias: {qkv: false, attn_out: false, ffn: false}, positional: {type: rope, rotary_dims: 8, "
    "scaling: {type: yarn, factor: 2, original_max_position_embeddings: 8}}",
}


@pytest.mark.parametrize("kind", list(NATIVE))
def test_a_run_with_glms_features_is_written_as_glm(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{NATIVE[kind]}}}\n")
    sandwich = "sandwich" in kind
    assert export_hf(run, tmp_path / "out") == ("Glm4ForCausalLM" if sandwich else "GlmForCausalLM")
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_glm_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    run = random_run(
        tmp_path,
        "model: {family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, "
        "norm: {type: rmsnorm}, activation: swiglu, bias: {qkv: true, attn_out: true, ffn: true}, "
        "window: {size: 4}, positional: {type: rope, rotary_dims: 4}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    fields = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert fields == ["model.bias.attn_out", "model.bias.ffn", "model.window"], str(error.value)
    assert "GLM" in str(error.value) and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["glm"], "GlmForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def rows(family: str) -> Callable[..., Case]:
    def row(**fields: Any) -> Case:
        return case(family, **fields)

    return row


def shared(family: str) -> list[Case]:
    """The rows GLM and GLM-4 read alike (GlmConfig's fields are Glm4Config's)."""
    row = rows(family)
    return [
        row(  # the fields that take any value at once (without biases, a GLM is written as Phi-3)
            num_key_value_heads=1,
            attention_bias=False,
            tie_word_embeddings=True,
            hidden_act="gelu",
            rms_norm_eps=1e-2,
            attention_dropout=0.3,
            initializer_range=0.5,
            spec={
                "n_kv_heads": 1,
                "bias.qkv": False,
                "tie_embeddings": True,
                "activation": "geglu",
                "norm.eps": 1e-2,
                "dropout.attention": 0.3,
                "positional.layout": "interleaved",
                "positional.rotary_dims": 4,
            },
        ),
        row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
        row(outcome="num_key_value_heads", num_key_value_heads=3),
        # K/V heads left out: GlmConfig's 2; null: GLM's attention fails
        row(json={"num_key_value_heads": DELETE}, spec={"n_kv_heads": 2}, slow=True),
        row(outcome="num_key_value_heads", json={"num_key_value_heads": None}, slow=True),
        row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": False}, slow=True),
        row(json={"attention_bias": DELETE}, spec={"bias.qkv": True}, slow=True),  # GlmConfig's default
        row(json={"mlp_bias": True}, spec={"bias.ffn": False}, slow=True),  # LlamaConfig's; not GLM's
        row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
        row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
        row(outcome="hidden_act", hidden_act="relu", slow=True),
        row(rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
        row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1.5625e-07}),  # GlmConfig's, not LlamaConfig's
        row(head_dim=16, spec={"head_dim": 16, "positional.rotary_dims": 8}, slow=True),  # wider heads
        row(hidden_size=512, head_dim=128, json={"head_dim": DELETE}, spec={"head_dim": 128}, slow=True),
        row(outcome="head_dim", json={"head_dim": None}, slow=True),
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
        # a window in config.json, which GlmConfig does not read: transformers' forward attends over
        # every position, its generation cache keeps the last 4 (refused); one of the whole context is none
        row(outcome="sliding_window", json={"sliding_window": 4, "use_sliding_window": True}, slow=True),
        row(json={"sliding_window": 32, "use_sliding_window": True}, spec={"window": None}, slow=True),
        row(
            rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
            spec={"positional.theta": 500.0},
        ),
        # the rotated fraction: the dict's, else the top-level field, else GlmConfig's 0.5
        row(
            json={"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
            spec={"positional.rotary_dims": 4},
            slow=True,
        ),
        row(  # whole heads: written as Llama (GLM-4's norms refused)
            exported=family == "glm",
            json={
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                "partial_rotary_factor": 1.0,
            },
            spec={"positional.rotary_dims": 8},
            slow=True,
        ),
        row(outcome="rope_parameters.partial_rotary_factor", json=rope(partial_rotary_factor=0.0), slow=True),
        # 3 of a head's 8 dimensions: an odd number, which the spec refuses as rotary_dims, named as read
        row(outcome="rope_parameters.partial_rotary_factor", json=rope(partial_rotary_factor=0.375)),
        row(
            outcome="partial_rotary_factor",
            json={
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                "partial_rotary_factor": 0.375,
            },
            slow=True,
        ),
        row(
            json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True
        ),
        row(**rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5), slow=True),
        row(**rope(rope_type="dynamic", factor=2.0, partial_rotary_factor=0.5), slow=True),
        row(**rope(**YARN, partial_rotary_factor=0.5), spec={"positional.scaling.factor": 4.0}),
        row(**rope(**longrope(2), partial_rotary_factor=0.5), slow=True),
        row(outcome="architectures", json={"architectures": [f"{family.title()}ForTokenClassification"]}),
    ]


CASES: list[Case] = [
    *shared("glm"),
    # GLM-4's rows as GLM's, slow but its first (every field at once, in sandwich blocks)
    *[c if i == 0 else replace(c, slow=True) for i, c in enumerate(shared("glm4"))],
    # without biases and in pre-norm blocks, GLM is Phi-3's computation: written as it
    case("glm", attention_bias=False, spec={"bias.qkv": False}),
    case("glm4", attention_bias=False, spec={"norm.position": "sandwich"}),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize("model_type", ["glm", "glm4"])
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to GlmConfig or Glm4Config fails this until a row of CASES says
    what it does (or the family's tiny base sets it)."""
    assert uncovered(model_type, [c for c in CASES if c.family == model_type]) == set()
