"""Gemma (1 and 2) and Phi-3 imports: tiny random transformers models saved with save_pretrained,
imported, and held to transformers' outputs (float32, padded and not) and parameter counts;
written back with export-hf (Gemma as GemmaForCausalLM, Gemma 2 as Gemma2ForCausalLM, Phi-3 as
LlamaForCausalLM, the same computation); and every field of GemmaConfig, Gemma2Config and
Phi3Config, value by value, in the field table of tests/test_hf_fields.py (its rows' check, on
these families)."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import DECODER, Imported, perturb, write
from safetensors.torch import load_file, save_file
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
    _save,
    case,
    check,
    longrope,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec.schema import SlidingWindow
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

GEMMA = DECODER | {"head_dim": 8}  # GemmaConfig's own default is 256
# Gemma2Config's query_pre_attn_scalar default (256) scales q.k by 1/16; its caps (50 and 30) bend
# no score of a random model this small: the variants set smaller ones.
GEMMA2 = GEMMA | {"query_pre_attn_scalar": 8}
PHI3 = DECODER | {"pad_token_id": 0, "eos_token_id": 1}  # Phi3Config's 32000 is past the vocabulary
LONGROPE_FROM = 6  # the phi3_longrope variant's original length
# test_hf_fields' check builds a row's model from its FAMILIES: these two families join them.
FAMILIES |= {
    "gemma": Family(T.GemmaConfig, T.GemmaForCausalLM, "llama", GEMMA),
    "gemma2": Family(T.Gemma2Config, T.Gemma2ForCausalLM, "llama", GEMMA2),
    "phi3": Family(T.Phi3Config, T.Phi3ForCausalLM, "llama", PHI3),
}

# name -> the model, random (its norms and biases moved off their initial values)
VARIANTS: dict[str, Callable[[], Any]] = {
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**GEMMA)),
    # heads wider than hidden_size / heads, biases on q, k, v and o, a head of its own
    "gemma_wide_bias_untied": lambda: T.GemmaForCausalLM(
        T.GemmaConfig(**GEMMA | {"head_dim": 12}, attention_bias=True, tie_word_embeddings=False)
    ),
    # capped scores and logits, sandwich norms, q.k scaled by 1/sqrt(8)
    "gemma2": lambda: T.Gemma2ForCausalLM(
        T.Gemma2Config(**GEMMA2, attn_logit_softcapping=0.5, final_logit_softcapping=1.5)
    ),
    # no caps, biases, untied, q.k by 1/sqrt(20), every other layer sliding over 12 tokens
    "gemma2_window_bias_untied": lambda: T.Gemma2ForCausalLM(
        T.Gemma2Config(
            **GEMMA2 | {"query_pre_attn_scalar": 20},
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            sliding_window=12,
            attention_bias=True,
            tie_word_embeddings=False,
        )
    ),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**PHI3, resid_pdrop=0.1)),
    "phi3_window_tied": lambda: T.Phi3ForCausalLM(
        T.Phi3Config(**PHI3 | {"num_key_value_heads": 1}, sliding_window=12, tie_word_embeddings=True)
    ),
    # Phi-3.5-mini's LongRoPE: rows of 7 tokens and more (the padded tables' all) turn at the long
    # factors, fewer at the short ones; cos and sin times sqrt(1 + ln(32 / 6) / ln 6)
    "phi3_longrope": lambda: T.Phi3ForCausalLM(
        T.Phi3Config(**PHI3, original_max_position_embeddings=LONGROPE_FROM, rope_scaling=longrope())
    ),
    # Phi-4-mini's RoPE: LongRoPE on three quarters of each head (6 of 8 dimensions, 3 pairs)
    "phi3_partial_longrope": lambda: T.Phi3ForCausalLM(
        T.Phi3Config(
            **PHI3,
            partial_rotary_factor=0.75,
            original_max_position_embeddings=LONGROPE_FROM,
            rope_scaling=longrope(3),
            sliding_window=12,
        )
    ),
}


def imported_variant(root: Path, name: str) -> Imported:
    """The variant saved and imported."""

    def write_to(folder: Path) -> None:
        torch.manual_seed(0)
        write(perturb(VARIANTS[name]()), "llama", folder)

    return Imported(root, name, write_to, "ignore")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("hf")
    return {name: imported_variant(root, name) for name in VARIANTS}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_outputs(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], tmp_path: Path, name: str) -> None:
    architecture = export_hf(imported[name].result.run_dir, tmp_path / "out")
    expected = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "phi3": "LlamaForCausalLM"}
    expected["phi3_window_tied"] = "MistralForCausalLM"  # a window on every layer, no attention biases
    expected["phi3_partial_longrope"] = "Phi3ForCausalLM"  # part of each head turns
    assert architecture == expected.get(name, expected[name.split("_")[0]])
    _loads_alike(tmp_path / "out", imported[name].model)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, wide = imported["gemma"].spec.model, imported["gemma_wide_bias_untied"].spec.model
    assert (plain.scale_embeddings, plain.activation, plain.tie_embeddings, plain.bias.qkv) == (
        True,
        "geglu_tanh",
        True,
        False,
    )
    assert (wide.head_dim, wide.bias.qkv, wide.bias.attn_out, wide.bias.ffn, wide.tie_embeddings) == (
        12,
        True,
        True,
        False,
        False,
    )
    # GemmaRMSNorm's (1 + weight), folded
    hf_norm = imported["gemma"].hf.model.norm.weight
    assert torch.equal(imported["gemma"].model.final_norm.weight, 1.0 + hf_norm)
    fused, window = imported["phi3"].spec.model, imported["phi3_window_tied"].spec.model
    assert (fused.max_seq_len, fused.dropout.residual, fused.tie_embeddings) == (32, 0.1, False)
    assert (window.max_seq_len, window.n_kv_heads, window.tie_embeddings) == (32, 1, True)
    assert window.window == SlidingWindow(size=12)  # every Phi-3 layer slides
    capped, sliding = imported["gemma2"].spec.model, imported["gemma2_window_bias_untied"].spec.model
    assert (capped.norm.position, capped.attention_softcap, capped.logit_softcap) == ("sandwich", 0.5, 1.5)
    assert (capped.attention_scale, capped.max_seq_len, capped.scale_embeddings) == (8**-0.5, 32, True)
    assert (sliding.attention_softcap, sliding.logit_softcap, sliding.attention_scale) == (
        None,
        None,
        20**-0.5,
    )
    assert (sliding.max_seq_len, sliding.bias.qkv, sliding.tie_embeddings) == (32, True, False)
    assert sliding.window == SlidingWindow(size=12, layers=[0])  # every other layer, the first included
    # the post-feed-forward norm's (1 + weight), folded
    hf_norm = imported["gemma2"].hf.model.layers[1].post_feedforward_layernorm.weight
    assert torch.equal(imported["gemma2"].model.blocks[1].ffn_out_norm.weight, 1.0 + hf_norm)


def test_longrope_turns_at_the_long_factors_from_one_past_the_original_length(
    imported: dict[str, Imported],
) -> None:
    """transformers turns a sequence at the long factors where its length exceeds the original
    (LONGROPE_FROM): the logits of sequences of that length and one more, both sides of the switch,
    as transformers'; the import's attention factor is transformers'."""
    variant = imported["phi3_longrope"]
    scaling = variant.spec.model.positional.scaling
    assert scaling is not None and scaling.type == "longrope"
    assert scaling.attention_factor == variant.hf.model.rotary_emb.attention_scaling
    ids = torch.randint(2, 64, (1, LONGROPE_FROM + 1), generator=torch.Generator().manual_seed(3))
    for length in (LONGROPE_FROM, LONGROPE_FROM + 1):
        with torch.no_grad():
            theirs, ours = variant.hf(ids[:, :length]).logits, variant.model(ids[:, :length])
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_the_bundle_generates_transformers_tokens_across_the_longrope_switch(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """A prompt of 5 tokens turns at the short factors, the tokens from the 7th on at the long
    ones, in the KV cache of the exported graphs as in transformers' generate."""
    imported["phi3_longrope"].assert_runtime_generates_as_transformers(tmp_path, new=12)


@pytest.mark.parametrize(
    ("name", "rows"),
    [("self_attn.qkv_proj", "32 + 16 + 16 rows"), ("mlp.gate_up_proj", "48 + 48 rows")],
)
def test_a_fused_tensor_of_other_rows_is_refused_by_name(
    imported: dict[str, Imported], tmp_path: Path, name: str, rows: str
) -> None:
    folder = tmp_path / "src"
    write(imported["phi3"].hf, "llama", folder)
    weights = load_file(folder / "model.safetensors")
    fused = f"model.layers.1.{name}.weight"
    save_file(weights | {fused: weights[fused][:-8]}, folder / "model.safetensors")
    with pytest.raises(
        HFError, match=re.escape(f"layers.1.{name}.weight has shape (") + r"\d+, 32\), not " + re.escape(rows)
    ):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wrong").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["gemma_wide_bias_untied", "gemma2", "gemma2_window_bias_untied", "phi3_window_tied"]
)
def test_the_runtime_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    """Exported to ONNX with parity, then greedy decoding with the KV cache in onnxruntime against
    transformers' generate (Phi-3's and a Gemma 2's 20 tokens past their windows of 12)."""
    imported[name].assert_runtime_generates_as_transformers(tmp_path, 20 if "window" in name else 7)


# tfcompile's own runs with scaled embeddings: written as Gemma (interleaved RoPE permuted to
# halves, biases Gemma has and the run does not as zeros, the erf GELU as gelu_python).
NATIVE = {
    "interleaved, q/k/v biases": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, "
    "n_kv_heads: 2, max_seq_len: 16, positional: rope, norm: {type: rmsnorm}, activation: geglu_tanh, "
    "scale_embeddings: true, bias: {qkv: true, attn_out: false, ffn: false}",
    "erf GELU, untied, scaled output": "family: decoder, vocab_size: 64, d_model: 24, n_layers: 1, "
    "n_heads: 2, head_dim: 16, max_seq_len: 16, positional: {type: rope, layout: halves, theta: 500}, "
    "norm: {type: rmsnorm, eps: 1.0e-3}, activation: geglu, scale_embeddings: true, "
    "tie_embeddings: false, scale_output: true, bias: {qkv: false, attn_out: true, ffn: false}",
    "SwiGLU, linear RoPE": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, n_heads: 4, "
    "max_seq_len: 16, positional: {type: rope, scaling: {type: linear, factor: 2}}, norm: {type: rmsnorm}, "
    "activation: swiglu, scale_embeddings: true, bias: {qkv: false, attn_out: false, ffn: false}",
}


@pytest.mark.parametrize("kind", list(NATIVE))
def test_a_run_with_scaled_embeddings_is_written_as_gemma(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{NATIVE[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "GemmaForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_gemma_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    message = _problems(
        tmp_path,
        "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
        "positional: rope, activation: gelu, scale_embeddings: true, attention_scale: 0.5, "
        "bias: {ffn: true, lm_head: true}, qk_norm: true",
    )
    for field in (
        "model.activation: 'gelu' has no Gemma equivalent",
        "model.norm.type: 'layernorm' has no Gemma equivalent",
        "model.norm.bias: True has no Gemma equivalent",
        "model.bias.ffn: True has no Gemma equivalent",
        "model.bias.lm_head: True has no Gemma equivalent",
        "model.attention_scale: 0.5 has no Gemma equivalent",
        "model.qk_norm: True has no Gemma equivalent",
    ):
        assert field in message, field


# tfcompile's own decoders that turn part of each head: written as Phi-3
NO_BIAS = "bias: {qkv: false, attn_out: false, ffn: false}"
PARTIAL = {
    "interleaved, grouped, a window, LongRoPE": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, "
    f"n_heads: 4, n_kv_heads: 2, max_seq_len: 24, norm: {{type: rmsnorm}}, activation: swiglu, {NO_BIAS}, "
    "window: {size: 5}, positional: {type: rope, rotary_dims: 4, scaling: {type: longrope, factor: 4, "
    "original_max_position_embeddings: 6, short_factor: [1, 2], long_factor: [3, 5]}}",
    "halves, one K/V head, untied, tanh GELU": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, "
    "n_heads: 2, n_kv_heads: 1, max_seq_len: 16, norm: {type: rmsnorm, eps: 1.0e-3}, activation: geglu_tanh, "
    f"tie_embeddings: false, {NO_BIAS}, "
    "positional: {type: rope, layout: halves, theta: 500, rotary_dims: 10}",
}


@pytest.mark.parametrize("kind", list(PARTIAL))
def test_a_run_that_turns_part_of_each_head_is_written_as_phi3(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{PARTIAL[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "Phi3ForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_phi3_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    message = _problems(
        tmp_path,
        "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
        "norm: {type: rmsnorm}, activation: swiglu, bias: {qkv: false, attn_out: true, ffn: true}, "
        "qk_norm: true, positional: {type: rope, rotary_dims: 4, scaling: {type: linear, factor: 2}}",
    )  # (q, k and v biases on part of each head are GLM's: tests/test_hf_glm.py)
    for field in (
        "model.bias.attn_out: True has no Phi-3 equivalent",
        "model.bias.ffn: True has no Phi-3 equivalent",
        "model.qk_norm: True has no Phi-3 equivalent",
        "model.positional.scaling.type: 'linear' has no Phi-3 equivalent",
    ):
        assert field in message, field
    # Phi-3's LongRoPE: the attention factor of max_seq_len over the original length, 32 / 8 here
    message = _problems(
        tmp_path / "longrope",
        f"family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 32, {NO_BIAS}, "
        "norm: {type: rmsnorm}, activation: swiglu, positional: {type: rope, rotary_dims: 4, scaling: "
        "{type: longrope, factor: 2, original_max_position_embeddings: 8, short_factor: [1, 1], "
        "long_factor: [2, 2]}}",
    )
    expected = (1 + math.log(4) / math.log(8)) ** 0.5
    assert f"model.positional.scaling.attention_factor: {(1 + math.log(2) / math.log(8)) ** 0.5}" in message
    assert f"{expected} (Phi-3 computes it from max_seq_len" in message
    # an original length of 1, whose logarithm Phi-3's formula divides by
    message = _problems(
        tmp_path / "one",
        f"family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, {NO_BIAS}, "
        "norm: {type: rmsnorm}, activation: swiglu, positional: {type: rope, rotary_dims: 4, scaling: "
        "{type: longrope, factor: 2, original_max_position_embeddings: 1, attention_factor: 1.2, "
        "short_factor: [1, 1], long_factor: [2, 2]}}",
    )
    assert "model.positional.scaling.original_max_position_embeddings: 1 has no Phi-3 equivalent" in message


# ------------------------------------------------------------------------------ the field table


def rope(**fields: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": 10000.0, **fields}}


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)


def su(**fields: Any) -> dict[str, Any]:
    """LongRoPE's dict as the first Phi-3 128k checkpoints named it."""
    return {k: v for k, v in longrope(**fields).items() if k != "rope_type"} | {"type": "su"}


CASES: list[Case] = [
    # ---------------------------------------------------------------------------- Gemma
    case(  # the fields that take any value at once: each row below sets one
        "gemma",
        head_dim=16,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        rms_norm_eps=1e-2,
        attention_bias=True,
        hidden_act="gelu_python",
        initializer_range=0.5,
        attention_dropout=0.3,
        spec={
            "head_dim": 16,
            "n_kv_heads": 1,
            "tie_embeddings": False,
            "bias.qkv": True,
            "bias.attn_out": True,
            "activation": "geglu",
            "scale_embeddings": True,
        },
    ),
    case("gemma", head_dim=16, spec={"head_dim": 16}, slow=True),
    case("gemma", head_dim=4, spec={"head_dim": 4}, slow=True),
    case("gemma", head_dim=256, json={"head_dim": DELETE}, spec={"head_dim": 256}, slow=True),  # the default
    case("gemma", num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    case("gemma", num_key_value_heads=4, slow=True),
    case("gemma", outcome="num_key_value_heads", num_key_value_heads=3, slow=True),
    case("gemma", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case(
        "gemma", json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True
    ),  # its default
    case("gemma", rms_norm_eps=1e-2, slow=True),
    case("gemma", attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    case("gemma", json={"mlp_bias": True}, spec={"bias.ffn": False}, slow=True),  # Llama's; not Gemma's
    # hidden_act: GemmaConfig reads "gelu" as the tanh GELU (the legacy value of the releases);
    # hidden_activation, which older transformers read, is not read
    case("gemma", spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma", json={"hidden_act": "gelu"}, spec={"activation": "geglu_tanh"}),
    case("gemma", json={"hidden_act": DELETE}, spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma", json={"hidden_activation": "silu"}, spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma", hidden_act="gelu_python", spec={"activation": "geglu"}, slow=True),
    case("gemma", hidden_act="gelu_new", spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma", hidden_act="silu", spec={"activation": "swiglu"}, slow=True),
    case("gemma", outcome="hidden_act", hidden_act="relu"),
    case("gemma", initializer_range=0.5, slow=True),
    case("gemma", attention_dropout=0.3, slow=True),
    case("gemma", use_cache=False, slow=True),
    case("gemma", slow=True, **IDS),
    case("gemma", eos_token_id=[6, 7], slow=True),
    case("gemma", pad_token_id=None, slow=True),
    case("gemma", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("gemma", num_hidden_layers=1, slow=True),
    case("gemma", hidden_size=48, spec={"d_model": 48, "head_dim": 8}, slow=True),  # another sqrt(d)
    case("gemma", outcome="use_bidirectional_attention", use_bidirectional_attention=True),
    case("gemma", use_bidirectional_attention=False, slow=True),
    case("gemma", **{"rope_parameters": {"rope_theta": 500.0, "rope_type": "default"}}, slow=True),
    case("gemma", **rope(rope_type="linear", factor=2.0)),
    case("gemma", **rope(rope_type="dynamic", factor=2.0), slow=True),
    case("gemma", **rope(**YARN), slow=True),
    case("gemma", **rope(**LLAMA3, original_max_position_embeddings=8), slow=True),
    case("gemma", **rope(**longrope()), slow=True),
    case("gemma", json={"rope_parameters": DELETE, "rope_theta": 777.0}, slow=True),  # transformers 4's keys
    case(
        "gemma",
        json={"rope_parameters": DELETE, "rope_scaling": {"type": "linear", "factor": 3.0}},
        slow=True,
    ),
    # Gemma's default RoPE rotates whole heads whatever it says; refused all the same
    case("gemma", outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    # ---------------------------------------------------------------------------- Phi-3
    case(  # the fields that take any value at once: each row below sets one
        "phi3",
        num_key_value_heads=1,
        tie_word_embeddings=True,
        rms_norm_eps=1e-2,
        hidden_act="gelu",
        resid_pdrop=0.3,
        embd_pdrop=0.3,
        attention_dropout=0.3,
        initializer_range=0.5,
        original_max_position_embeddings=8,
        spec={"n_kv_heads": 1, "tie_embeddings": True, "activation": "geglu", "dropout.residual": 0.3},
    ),
    case("phi3", num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    case("phi3", num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # MHA
    case("phi3", outcome="num_key_value_heads", num_key_value_heads=3, slow=True),
    case("phi3", tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    case("phi3", rms_norm_eps=1e-2, slow=True),
    case("phi3", json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}, slow=True),  # Phi3Config's default
    case("phi3", hidden_act="gelu", spec={"activation": "geglu"}, slow=True),
    case("phi3", hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    case("phi3", outcome="hidden_act", hidden_act="relu", slow=True),
    case("phi3", resid_pdrop=0.3, spec={"dropout.residual": 0.3}, slow=True),  # training only
    case("phi3", embd_pdrop=0.3, spec={"dropout.embedding": 0.0}, slow=True),  # Phi3Model applies none
    case("phi3", attention_dropout=0.3, slow=True),
    case("phi3", initializer_range=0.5, slow=True),
    case("phi3", use_cache=False, slow=True),
    case("phi3", slow=True, **IDS),
    case("phi3", pad_token_id=None, slow=True),
    case("phi3", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("phi3", num_hidden_layers=1, slow=True),
    # Phi-3 slides every layer (a window of the whole context or more is none)
    case("phi3", sliding_window=6, spec={"max_seq_len": 32, "window.size": 6, "window.layers": None}),
    case("phi3", sliding_window=64, spec={"max_seq_len": 32, "window": None}, slow=True),
    case(  # none, not MistralConfig's 4096
        "phi3",
        max_position_embeddings=5000,
        json={"sliding_window": DELETE},
        spec={"max_seq_len": 5000, "window": None},
        slow=True,
    ),
    case("phi3", outcome="sliding_window", sliding_window=0, slow=True),
    # RoPE: default or LongRoPE (Phi3Config refuses other types, and reads su and yarn as longrope),
    # the original length from the top level (Phi3Config's 4096 where it is left out), over the dict's
    case("phi3", **{"rope_parameters": {"rope_theta": 500.0, "rope_type": "default"}}, slow=True),
    case("phi3", json={"rope_parameters": DELETE, "rope_theta": 777.0}, slow=True),  # transformers 4's keys
    case("phi3", original_max_position_embeddings=8, slow=True),  # longrope's alone
    case("phi3", original_max_position_embeddings=8, **rope(**longrope())),  # Phi-3.5-mini's way
    case(  # within the original length: the short factors, an attention factor of 1 (32 / 4096 < 1)
        "phi3",
        json={"original_max_position_embeddings": DELETE},
        **rope(**longrope()),
        spec={"positional.scaling.original_max_position_embeddings": 4096},
        slow=True,
    ),
    case(  # transformers 5 reads the dict's factor, 4 the ratio: warned
        "phi3", json={"original_max_position_embeddings": 8, **rope(**longrope(factor=2.0))}, slow=True
    ),
    case("phi3", original_max_position_embeddings=8, **rope(**longrope(attention_factor=0.5)), slow=True),
    case(
        "phi3",
        outcome="rope_parameters.long_factor",
        json={"original_max_position_embeddings": 8, **rope(**longrope(long_factor=None))},
        slow=True,
    ),
    case("phi3", outcome="rope_parameters.short_factor", json=rope(**YARN), slow=True),  # read as longrope
    case(
        "phi3", json={"original_max_position_embeddings": 8, **rope(**longrope(rope_type="yarn"))}, slow=True
    ),
    case("phi3", outcome="rope_parameters.rope_type", json=rope(rope_type="linear", factor=2.0), slow=True),
    case(
        "phi3",
        json={
            "original_max_position_embeddings": 8,
            "rope_parameters": DELETE,
            "rope_scaling": su(),
        },
        slow=True,
    ),
    case(  # transformers 5 fails on su without the original length in its dict
        "phi3",
        outcome="rope_scaling.original_max_position_embeddings",
        json={
            "original_max_position_embeddings": 8,
            "rope_parameters": DELETE,
            "rope_scaling": su(original_max_position_embeddings=None),
        },
        slow=True,
    ),
    # Phi3Config reads a top-level partial_rotary_factor into rope_parameters where it has none
    case(  # Phi-4-mini's
        "phi3",
        json={"partial_rotary_factor": 0.75, **rope(rope_type="default")},
        spec={"positional.rotary_dims": 6},
        slow=True,
    ),
    case("phi3", json={"partial_rotary_factor": 0.75}, slow=True),  # the saved dict's 1.0 is read
    case(
        "phi3",
        **rope(rope_type="default", partial_rotary_factor=0.5),
        spec={"positional.rotary_dims": 4},
    ),
    case(  # Phi-4-mini's RoPE: LongRoPE on three quarters of each head
        "phi3",
        original_max_position_embeddings=8,
        **rope(**longrope(3), partial_rotary_factor=0.75),
        spec={"positional.rotary_dims": 6, "positional.scaling.factor": 4.0},
    ),
    case("phi3", outcome="rope_parameters", json=rope(**longrope(3))),  # 3 factors for 4 pairs
    case("phi3", json={"partial_rotary_factor": 1.0}, slow=True),
    # ---------------------------------------------------------------------------- Gemma 2
    case(  # the fields that take any value at once: each row below sets one
        "gemma2",
        head_dim=16,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        rms_norm_eps=1e-2,
        attention_bias=True,
        hidden_activation="gelu",
        attn_logit_softcapping=0.5,
        final_logit_softcapping=2.0,
        query_pre_attn_scalar=3,
        initializer_range=0.5,
        attention_dropout=0.3,
        spec={
            "head_dim": 16,
            "n_kv_heads": 1,
            "bias.attn_out": True,
            "activation": "geglu",
            "attention_softcap": 0.5,
            "logit_softcap": 2.0,
            "attention_scale": 3**-0.5,
            "norm.position": "sandwich",
        },
    ),
    case("gemma2", head_dim=256, json={"head_dim": DELETE}, spec={"head_dim": 256}, slow=True),  # the default
    case("gemma2", outcome="num_key_value_heads", num_key_value_heads=3, slow=True),
    case("gemma2", outcome="sliding_window", sliding_window=0, slow=True),  # transformers' forward fails
    case("gemma2", json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),
    case("gemma2", json={"mlp_bias": True}, spec={"bias.ffn": False}, slow=True),  # Llama's; not Gemma 2's
    # hidden_activation is read, as it is (no legacy renaming); hidden_act is not
    case("gemma2", json={"hidden_activation": DELETE}, spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma2", json={"hidden_act": "silu"}, spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma2", hidden_activation="silu", spec={"activation": "swiglu"}, slow=True),
    case("gemma2", outcome="hidden_activation", hidden_activation="relu"),
    # the caps: transformers' defaults where missing, none where null, refused where not positive
    case(
        "gemma2", attn_logit_softcapping=None, final_logit_softcapping=None, spec={"attention_softcap": None}
    ),
    case(
        "gemma2",
        json={"attn_logit_softcapping": DELETE, "final_logit_softcapping": DELETE},
        spec={"attention_softcap": 50.0, "logit_softcap": 30.0},
        slow=True,
    ),
    case("gemma2", outcome="attn_logit_softcapping", attn_logit_softcapping=0.0, slow=True),
    case("gemma2", outcome="final_logit_softcapping", final_logit_softcapping=-1.0, slow=True),
    case("gemma2", json={"query_pre_attn_scalar": DELETE}, spec={"attention_scale": 1 / 16}, slow=True),
    case("gemma2", outcome="query_pre_attn_scalar", json={"query_pre_attn_scalar": 0}, slow=True),
    case("gemma2", outcome="query_pre_attn_scalar", json={"query_pre_attn_scalar": "8"}, slow=True),
    # every other layer slides (layer_types, or its default), the first included
    case("gemma2", sliding_window=6, spec={"max_seq_len": 32, "window.size": 6, "window.layers": [0]}),
    case("gemma2", json={"sliding_window": DELETE}, spec={"window": None}, slow=True),  # 4096 > 32
    case("gemma2", outcome="sliding_window", json={"sliding_window": None}),  # transformers fails on it
    case(
        "gemma2",
        sliding_window=6,
        layer_types=["full_attention", "full_attention"],
        spec={"window": None},
        slow=True,
    ),
    case("gemma2", sliding_window=6, json={"layer_types": DELETE}, spec={"window.layers": [0]}, slow=True),
    case("gemma2", initializer_range=0.5, slow=True),
    case("gemma2", attention_dropout=0.3, slow=True),
    case("gemma2", use_cache=False, slow=True),
    case("gemma2", slow=True, **IDS),
    case("gemma2", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("gemma2", num_hidden_layers=1, slow=True),
    case("gemma2", hidden_size=48, intermediate_size=40, vocab_size=80, slow=True),
    case("gemma2", num_attention_heads=2, num_key_value_heads=2, slow=True),
    case("gemma2", outcome="use_bidirectional_attention", use_bidirectional_attention=True),
    case("gemma2", **{"rope_parameters": {"rope_theta": 500.0, "rope_type": "default"}}, slow=True),
    case("gemma2", **rope(rope_type="linear", factor=2.0), slow=True),
]
CLASSES = {"gemma": "gemma", "gemma2": "gemma2", "phi3": "phi3"}


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to GemmaConfig or Phi3Config fails this until a row of CASES says
    what it does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES[model_type].base)
    covered |= set().union(*(c.fields() for c in CASES if c.family == model_type))
    assert _class_fields(model_type) - covered == set()


def _activation_cases() -> list[Any]:
    from transformers.activations import ACT2CLS

    return [
        pytest.param(family, act, id=f"{family}-{act}", marks=pytest.mark.slow)
        for family in CLASSES
        for act in sorted(ACT2CLS)
    ]


@pytest.mark.parametrize(("family", "value"), _activation_cases())
def test_every_activation_name_is_computed_alike_or_refused_by_name(
    family: str, value: str, tmp_path: Path
) -> None:
    name = "hidden_activation" if family == "gemma2" else "hidden_act"  # what Gemma2Config reads
    try:
        FAMILIES[family].config(**(FAMILIES[family].base | {name: value}))
    except Exception:  # transformers refuses it itself
        pytest.skip(f"transformers builds no model with {name}={value}")
    c = case(family, **{name: value})
    _save(c, tmp_path / "hf")
    try:
        import_folder(tmp_path / "hf", "case", tmp_path / "specs", tmp_path / "runs")
    except HFError as error:
        assert f"  {name}" in str(error)
        return
    check(c, tmp_path / "again")


@pytest.mark.parametrize(
    ("family", "json", "warned"),
    [
        ("phi3", {"original_max_position_embeddings": 8, **rope(**longrope())}, False),  # Phi-3.5's
        ("phi3", {"original_max_position_embeddings": 8, **rope(**longrope(factor=2.0))}, True),
        (
            "phi3",
            {"original_max_position_embeddings": 8, **rope(**longrope(factor=2.0, attention_factor=1.2))},
            False,
        ),
        ("gemma", rope(**longrope(original_max_position_embeddings=32)), False),  # max_position_embeddings
        ("gemma", rope(**longrope()), True),  # 8 in the dict alone: transformers 4 reads 32
    ],
)
def test_a_longrope_transformers_4_reads_otherwise_is_imported_with_a_warning(
    tmp_path: Path, family: str, json: dict[str, Any], warned: bool
) -> None:
    _save(case(family, json=json), tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import_folder(tmp_path / "hf", "case", tmp_path / "specs", tmp_path / "runs")
    said = [str(w.message) for w in caught if "transformers 4 reads LongRoPE" in str(w.message)]
    assert len(said) == warned, said
