"""Falcon and BLOOM: tiny random transformers models saved with save_pretrained, imported, and
held to transformers' logits (float32, rows padded on the right and not; BLOOM's ALiBi on the left
too), its parameter counts and greedy generation; Falcons of GPT-NeoX's blocks written back by
export-hf as GPT-NeoX, the rest refused by field; BLOOM written back as BLOOM, and tfcompile's own
ALiBi decoders written as BLOOM or refused by field; BLOOM's slopes against transformers' for every
head count to 256; and a row for every field of FalconConfig and BloomConfig
(tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, from_pretrained, perturb, write
from safetensors.torch import load_file, save_file
from test_hf_export import _loads_alike
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
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import architecture_for, export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec import parse_spec
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does.
TOKENS = dict(bos_token_id=0, eos_token_id=0)
FALCON = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32
)
BLOOM = dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
FAMILIES |= {
    "falcon": Family(T.FalconConfig, T.FalconForCausalLM, "gpt2", FALCON | TOKENS),
    "bloom": Family(T.BloomConfig, T.BloomForCausalLM, "gpt2", BLOOM | TOKENS),
}


def falcon(**fields: Any) -> Any:
    return T.FalconForCausalLM(T.FalconConfig(**FALCON, **TOKENS, **fields))


def bloom(**fields: Any) -> Any:
    return T.BloomForCausalLM(T.BloomConfig(**BLOOM | TOKENS | fields))


# name -> (the model, the head class export-hf writes its import as; None: refused)
VARIANTS: dict[str, tuple[Callable[[], Any], str | None]] = {
    # Falcon-7B's shape: one K/V head, a parallel block of one shared norm, no biases, tied
    "falcon": (lambda: falcon(), None),
    # Falcon-40B's: grouped K/V heads (2 of 4) in its grouped fused layout, a parallel block of two
    # norms (ln_attn, ln_mlp); biases, untied, linear RoPE scaling, a narrower feed-forward
    "falcon_new_gqa_bias_untied": (
        lambda: falcon(
            new_decoder_architecture=True,
            num_kv_heads=2,
            bias=True,
            tie_word_embeddings=False,
            ffn_hidden_size=40,
            activation="gelu_new",
            layer_norm_epsilon=1e-3,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        ),
        None,
    ),
    # the new architecture with one norm shared by both sublayers (num_ln_in_parallel_attn 1)
    "falcon_new_one_norm": (
        lambda: falcon(new_decoder_architecture=True, num_kv_heads=1, num_ln_in_parallel_attn=1),
        None,
    ),
    # a K/V head per head and two norms: GPT-NeoX's blocks, written as GPT-NeoX
    "falcon_new_mha": (
        lambda: falcon(new_decoder_architecture=True, activation="relu"),
        "GPTNeoXForCausalLM",
    ),
    # sublayers in turn, a K/V head per head (per-head fused layout), biases: written as GPT-NeoX
    "falcon_sequential_mha_bias": (
        lambda: falcon(multi_query=False, parallel_attn=False, bias=True, tie_word_embeddings=False),
        "GPTNeoXForCausalLM",
    ),
    # sublayers in turn with one K/V head, dynamic RoPE scaling: Starcoder2's blocks (its missing
    # biases written as zeros), written as Starcoder2
    "falcon_sequential_mqa_dynamic": (
        lambda: falcon(parallel_attn=False, rope_parameters={"rope_type": "dynamic", "factor": 2.0}),
        "Starcoder2ForCausalLM",
    ),
    # BLOOM: ALiBi of 4 heads (a power of two), its embedding LayerNorm, tied
    "bloom": (lambda: bloom(), "BloomForCausalLM"),
    # 6 heads (slopes of 4, then every other of 8), untied, another epsilon
    "bloom_6_heads_untied": (
        lambda: bloom(hidden_size=48, n_head=6, tie_word_embeddings=False, layer_norm_epsilon=1e-3),
        "BloomForCausalLM",
    ),
    # 3 heads, 3 layers, pretraining_tp (unread without slow_but_exact)
    "bloom_3_heads_tp": (
        lambda: bloom(hidden_size=24, n_head=3, n_layer=3, pretraining_tp=2),
        "BloomForCausalLM",
    ),
}
FALCONS = [name for name in VARIANTS if name.startswith("falcon")]
BLOOMS = [name for name in VARIANTS if name.startswith("bloom")]


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


def test_the_falcon_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def model(name: str) -> Any:
        return imported[name].spec.model

    seven = model("falcon")
    assert (seven.n_kv_heads, seven.block.type, seven.block.shared_norm, seven.tie_embeddings) == (
        1,
        "parallel",
        True,
        True,
    )
    assert (seven.bias.qkv, seven.bias.attn_out, seven.bias.ffn, seven.bias.lm_head) == (False,) * 4
    assert (seven.positional.layout, seven.positional.rotary_dims, seven.positional.theta) == (
        "halves",
        8,
        10000.0,
    )
    assert (seven.d_ff, seven.activation, seven.norm.type, seven.norm.bias) == (
        128,
        "gelu",
        "layernorm",
        True,
    )
    forty = model("falcon_new_gqa_bias_untied")
    assert (forty.n_kv_heads, forty.block.type, forty.block.shared_norm, forty.tie_embeddings) == (
        2,
        "parallel",
        False,
        False,
    )
    assert (forty.bias.qkv, forty.bias.attn_out, forty.bias.ffn, forty.bias.lm_head) == (
        True,
        True,
        True,
        False,
    )
    assert (forty.d_ff, forty.activation, forty.norm.eps) == (40, "gelu_tanh", 1e-3)
    assert (forty.positional.theta, forty.positional.scaling.type, forty.positional.scaling.factor) == (
        500.0,
        "linear",
        2.0,
    )
    one = model("falcon_new_one_norm")
    assert (one.n_kv_heads, one.block.shared_norm) == (1, True)
    assert (model("falcon_new_mha").n_kv_heads, model("falcon_new_mha").block.shared_norm) == (4, False)
    sequential, dynamic = model("falcon_sequential_mha_bias"), model("falcon_sequential_mqa_dynamic")
    assert (sequential.block.type, sequential.n_kv_heads, sequential.bias.ffn) == ("sequential", 4, True)
    assert (dynamic.block.type, dynamic.n_kv_heads, dynamic.positional.scaling.type) == (
        "sequential",
        1,
        "dynamic",
    )


@pytest.mark.parametrize("name", FALCONS)
def test_export_hf_writes_gpt_neox_blocks_back_and_refuses_the_rest_by_field(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """A Falcon of a K/V head per head and no shared norm is GPT-NeoX's computation, one of
    sublayers in turn with fewer K/V heads Starcoder2's (their missing biases written as zeros);
    the others are refused by the fields GPT-NeoX lacks."""
    variant, written = imported[name], VARIANTS[name][1]
    if written is None:
        with pytest.raises(HFError) as error:
            export_hf(variant.result.run_dir, tmp_path / "out")
        named = set(re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE))
        assert named and named <= {"model.n_kv_heads", "model.block.shared_norm"}, str(error.value)
        return
    assert export_hf(variant.result.run_dir, tmp_path / "out") == written
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    if variant.spec.model.bias.ffn:  # else GPT-NeoX's feed-forward biases, as zeros
        assert again.spec.model == variant.spec.model


def test_each_fused_layout_is_reordered_to_tfcompiles(imported: dict[str, Imported]) -> None:
    """q, k and v of each head as transformers splits them: one K/V head after the queries
    (multi_query), each group's queries then its key and value (new architecture), [q, k, v] of
    each head in turn (neither)."""
    for name in ("falcon", "falcon_new_gqa_bias_untied", "falcon_sequential_mha_bias"):
        variant = imported[name]
        spec, attention = variant.spec.model, variant.hf.transformer.h[0].self_attention
        x = torch.randn(1, 3, spec.d_model)
        with torch.no_grad():
            q, k, v = attention._split_heads(attention.query_key_value(x))
            ours = variant.model.blocks[0].attn.qkv(x)
        kv = spec.n_kv_heads * spec.head_dim
        q_rows, k_rows, v_rows = ours.split([spec.d_model, kv, kv], dim=-1)
        torch.testing.assert_close(q.flatten(2), q_rows)
        groups = spec.n_heads // spec.n_kv_heads if spec.n_kv_heads > 1 else 1  # broadcast in transformers
        torch.testing.assert_close(k[:, :, ::groups].flatten(2), k_rows)
        torch.testing.assert_close(v[:, :, ::groups].flatten(2), v_rows)


def test_a_fused_qkv_of_other_rows_is_refused_by_name(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write(imported["falcon_new_gqa_bias_untied"].hf, "gpt2", folder)
    weights = load_file(folder / "model.safetensors")
    fused = "transformer.h.1.self_attention.query_key_value.weight"
    save_file(weights | {fused: weights[fused][:-8]}, folder / "model.safetensors")
    with pytest.raises(HFError, match=re.escape("query_key_value.weight has shape (56, 32), not 64 rows")):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wrong").exists()


def test_a_sequential_blocks_attention_dropout_is_said_to_be_the_residuals(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = falcon(parallel_attn=False, attention_dropout=0.1, hidden_dropout=0.2)
    write(model, "gpt2", tmp_path / "hf")
    with pytest.warns(HFWarning, match="attention_dropout 0.1: Falcon drops out a sequential block's"):
        result = import_folder(tmp_path / "hf", "drop", tmp_path / "specs", tmp_path / "runs")
    assert (result.spec.model.dropout.residual, result.spec.model.dropout.attention) == (0.2, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["falcon", "falcon_new_gqa_bias_untied", "falcon_sequential_mqa_dynamic", *BLOOMS]
)
def test_tfcompile_generate_gives_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts of different lengths, one left-padded batch in the bundle (ONNX, KV cache),
    each as transformers generates it alone."""
    imported[name].assert_generates_as_transformers(tmp_path, capsys)


# ----------------------------------------------------------------------------- BLOOM


def left_padded_difference(hf: Any, model: torch.nn.Module) -> float:
    """The largest difference of the logits at the real tokens of rows padded on the left."""
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :3], mask[2, :7] = 0, 0
    with torch.no_grad():
        theirs, ours = hf(input_ids=ids, attention_mask=mask).logits, model(ids, mask)
    return (theirs - ours)[mask.bool()].abs().max().item()


@pytest.mark.parametrize("name", BLOOMS)
def test_bloom_gives_transformers_logits_on_left_padded_rows(
    imported: dict[str, Imported], name: str
) -> None:
    """ALiBi counts the positions of a left-padded row's real tokens from its first, as BLOOM's
    build_alibi_tensor does."""
    variant = imported[name]
    assert left_padded_difference(variant.hf, variant.model) <= 1e-5


@pytest.mark.parametrize("heads", range(1, 257))
def test_the_alibi_slopes_are_blooms_for_every_head_count(heads: int) -> None:
    """transformers' float32 powers of a float32 base, within their rounding (2.3e-6 of the
    slope at 256 heads, which are exact in float64 here)."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    from tfcompile.nn.positional import alibi_slopes

    theirs = _get_alibi_slopes(heads, torch.device("cpu")).double()
    torch.testing.assert_close(alibi_slopes(heads), theirs, rtol=3e-6, atol=0)


@pytest.mark.parametrize("name", BLOOMS)
def test_the_bloom_specs_say_what_each_model_is(imported: dict[str, Imported], name: str) -> None:
    model, config = imported[name].spec.model, imported[name].hf.config
    assert (model.positional.type, model.embedding_norm, model.block.type, model.activation) == (
        "alibi",
        True,
        "sequential",
        "gelu_tanh",
    )
    assert (model.n_heads, model.n_kv_heads, model.d_ff, model.tie_embeddings) == (
        config.n_head,
        config.n_head,
        4 * config.hidden_size,
        config.tie_word_embeddings,
    )
    assert (model.bias.qkv, model.bias.attn_out, model.bias.ffn, model.bias.lm_head) == (
        True,
        True,
        True,
        False,
    )
    assert (model.norm.eps, model.max_seq_len) == (config.layer_norm_epsilon, 2048)


@pytest.mark.parametrize("name", BLOOMS)
def test_export_hf_writes_bloom_back(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    """With no missing or unexpected tensors, to the run's logits (rows padded on the left too),
    and imported again to the same model."""
    variant, out = imported[name], tmp_path / "out"
    assert export_hf(variant.result.run_dir, out) == VARIANTS[name][1]
    _loads_alike(out, variant.model)
    assert left_padded_difference(from_pretrained(out), variant.model) <= 1e-5
    again = import_folder(out, "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


ALIBI = "family: decoder, vocab_size: 64, n_layers: 2, max_seq_len: 16, positional: alibi"
BLOOMS_OWN = f"{ALIBI}, d_model: 32, n_heads: 4, embedding_norm: true, activation: gelu_tanh"
# tfcompile's own ALiBi decoders that BLOOM computes: written as it, biases it has and the run
# does not as zeros, scale_output folded into ln_f.
WRITTEN = {
    "bloom's": BLOOMS_OWN,
    "6 heads, untied, no biases": f"{ALIBI}, d_model: 48, n_heads: 6, embedding_norm: true, "
    "activation: gelu_tanh, bias: {qkv: false, attn_out: false, ffn: false}, "
    "norm: {bias: false, eps: 0.001}, tie_embeddings: false",
    "q, k, v biases alone, scaled output, padded vocabulary": f"{BLOOMS_OWN}, "
    "bias: {qkv: true, attn_out: false, ffn: false}, scale_output: true, vocab_multiple_of: 48",
}


@pytest.mark.parametrize("name", list(WRITTEN))
def test_a_run_of_tfcompiles_own_with_alibi_is_written_as_bloom(tmp_path: Path, name: str) -> None:
    run = random_run(tmp_path, f"model: {{{WRITTEN[name]}}}\n")
    assert export_hf(run, tmp_path / "out") == "BloomForCausalLM"
    model = load_trained_model(run)[1]
    _loads_alike(tmp_path / "out", model)
    assert left_padded_difference(from_pretrained(tmp_path / "out"), model) <= 1e-5


# ALiBi decoders BLOOM does not compute -> the fields its refusal names, each once.
REFUSED: dict[str, tuple[str, list[str]]] = {
    "no embedding norm": (
        f"{ALIBI}, d_model: 32, n_heads: 4, activation: gelu_tanh",
        ["model.embedding_norm"],
    ),
    "swiglu": (
        f"{ALIBI}, d_model: 32, n_heads: 4, embedding_norm: true, activation: swiglu",
        ["model.activation"],  # 8/3 x d_model rounded up to a multiple of 64: 4 x d_model
    ),
    "erf gelu, narrow": (
        f"{ALIBI}, d_model: 32, n_heads: 4, embedding_norm: true, activation: gelu, d_ff: 64",
        ["model.activation", "model.d_ff"],
    ),
    "post-norm rmsnorm gqa": (
        f"{BLOOMS_OWN}, norm: {{type: rmsnorm, position: post}}, n_kv_heads: 2",
        ["model.norm.type", "model.norm.position", "model.norm.final", "model.n_kv_heads"],
    ),
    "sandwich": (f"{BLOOMS_OWN}, norm: {{position: sandwich}}", ["model.norm.position"]),
    "no final norm": (f"{BLOOMS_OWN}, norm: {{final: false}}", ["model.norm.final"]),
    "extras": (
        f"{BLOOMS_OWN}, block: parallel, qk_norm: true, bias: {{lm_head: true}}, head_dim: 4, "
        "attention_softcap: 50, logit_softcap: 30, scale_embeddings: true",
        [
            "model.head_dim",
            "model.scale_embeddings",
            "model.bias.lm_head",
            "model.qk_norm",
            "model.block",
            "model.attention_softcap",
            "model.logit_softcap",
        ],
    ),
    "attention scale": (f"{BLOOMS_OWN}, attention_scale: 1", ["model.attention_scale"]),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_alibi_decoder_bloom_does_not_compute_is_refused_by_field(name: str) -> None:
    """By BLOOM, the one architecture whose candidate an ALiBi decoder LM is."""
    model, refused = REFUSED[name]
    spec = parse_spec(f"model: {{{model}}}\n")
    candidates = exporter.candidates(spec)
    assert candidates == [ARCHITECTURES["bloom"]]
    with pytest.raises(HFError) as error:
        architecture_for(spec, "run")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == refused, str(error.value)


# ------------------------------------------------------------------ every config field, by value


def rope(**fields: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": 10000.0, **fields}}


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
NEW = dict(new_decoder_architecture=True)


def row(exported: bool = False, **fields: Any) -> Case:
    """A Falcon row: export-hf writes it (as GPT-NeoX) only where ``exported`` says."""
    return case("falcon", exported=exported, **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        **NEW,
        num_kv_heads=2,
        bias=True,
        tie_word_embeddings=False,
        activation="relu",
        layer_norm_epsilon=1e-3,
        ffn_hidden_size=40,
        hidden_dropout=0.2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 2,
            "block.shared_norm": False,
            "bias.qkv": True,
            "bias.ffn": True,
            "tie_embeddings": False,
            "activation": "relu",
            "d_ff": 40,
            "dropout.residual": 0.2,
            "dropout.attention": 0.0,
        },
    ),
    # the attention: one K/V head (multi_query), one per head, or num_kv_heads (new architecture)
    row(multi_query=True, spec={"n_kv_heads": 1, "block.shared_norm": True}, slow=True),
    row(multi_query=False, spec={"n_kv_heads": 4, "block.shared_norm": True}),
    row(multi_query=True, num_kv_heads=2, spec={"n_kv_heads": 1}, slow=True),  # unread with multi_query
    row(outcome="num_kv_heads", multi_query=False, num_kv_heads=2),  # transformers fails
    row(multi_query=False, num_kv_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(multi_query=False, num_kv_heads=None, spec={"n_kv_heads": 4}, slow=True),
    row(exported=True, **NEW, spec={"n_kv_heads": 4, "block.shared_norm": False}),
    row(**NEW, num_kv_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(**NEW, num_kv_heads=2, multi_query=False, spec={"n_kv_heads": 2}, slow=True),
    row(outcome="num_kv_heads", **NEW, num_kv_heads=3),  # not a divisor of the heads
    # the blocks: parallel_attn, and the new architecture's norms
    row(exported=True, parallel_attn=False, spec={"block.type": "sequential", "n_kv_heads": 1}, slow=True),
    row(exported=True, parallel_attn=False, multi_query=False, spec={"block.type": "sequential"}),
    row(**NEW, num_ln_in_parallel_attn=1, spec={"block.shared_norm": True}, slow=True),
    row(exported=True, **NEW, num_ln_in_parallel_attn=2, spec={"block.shared_norm": False}, slow=True),
    row(outcome="num_ln_in_parallel_attn", **NEW, num_ln_in_parallel_attn=3, slow=True),
    row(outcome="parallel_attn", **NEW, parallel_attn=False),  # transformers fails
    row(outcome="parallel_attn", **NEW, parallel_attn=False, num_ln_in_parallel_attn=1, slow=True),
    row(outcome="num_ln_in_parallel_attn", num_ln_in_parallel_attn=2),  # transformers fails
    row(num_ln_in_parallel_attn=1, spec={"block.shared_norm": True}, slow=True),
    row(num_ln_in_parallel_attn=3, spec={"block.shared_norm": True}, slow=True),  # unread
    row(
        exported=True,
        parallel_attn=False,
        num_ln_in_parallel_attn=2,
        spec={"block.type": "sequential"},
        slow=True,
    ),
    row(bias=True, spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": True}, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),  # the default
    row(activation="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    row(activation="silu", spec={"activation": "silu"}, slow=True),
    row(outcome="activation", activation="quick_gelu"),
    row(ffn_hidden_size=40, spec={"d_ff": 40}, slow=True),
    row(ffn_hidden_size=None, spec={"d_ff": 128}, slow=True),
    row(layer_norm_epsilon=1e-3, spec={"norm.eps": 1e-3}, slow=True),
    row(
        hidden_dropout=0.2, attention_dropout=0.3, spec={"dropout.residual": 0.2}, slow=True
    ),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(num_attention_heads=1, spec={"n_kv_heads": 1}, slow=True),
    # FalconConfig reads a legacy n_embed over hidden_size
    row(hidden_size=48, json={"n_embed": 48, "hidden_size": 16}, spec={"d_model": 48}, slow=True),
    row(outcome="alibi", alibi=True),
    row(alibi=False, slow=True),
    # in published configs, for the RefinedWeb code; transformers reads none
    row(
        outcome="apply_residual_connection_post_layernorm",
        json={"apply_residual_connection_post_layernorm": True},
    ),
    row(json={"apply_residual_connection_post_layernorm": False}, slow=True),
    # RoPE on whole heads: theta, each scaling, transformers 5's dict and 4's keys
    row(**rope(rope_theta=500.0, rope_type="default"), spec={"positional.theta": 500.0}, slow=True),
    row(**rope(rope_type="linear", factor=2.0), slow=True),
    row(**rope(rope_type="dynamic", factor=2.0)),
    row(**rope(**YARN), slow=True),
    row(**rope(**LLAMA3, original_max_position_embeddings=8), slow=True),
    row(**rope(**longrope()), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(
        json={
            "rope_parameters": DELETE,
            "rope_scaling": {"type": "linear", "factor": 3.0},
            "rope_theta": 33.0,
        },
        spec={"positional.theta": 33.0, "positional.scaling.factor": 3.0},
        slow=True,
    ),
    # Falcon's own default RoPE turns whole heads, whatever the fraction; a scaled one fails on part
    row(json=rope(partial_rotary_factor=0.5), spec={"positional.rotary_dims": 8}),
    row(json={"partial_rotary_factor": 0.5}, spec={"positional.rotary_dims": 8}, slow=True),
    row(
        outcome="partial_rotary_factor", json=rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5)
    ),
    row(json=rope(rope_type="linear", factor=2.0, partial_rotary_factor=1.0), slow=True),
]


def bloom_row(**fields: Any) -> Case:
    """A BLOOM row: export-hf writes each import back as BLOOM."""
    return case("bloom", **fields)


CASES += [
    bloom_row(  # the fields that take any value at once: each row below sets one
        n_head=8,
        tie_word_embeddings=False,
        layer_norm_epsilon=1e-3,
        hidden_dropout=0.2,
        attention_dropout=0.3,
        pretraining_tp=2,
        initializer_range=0.5,
        spec={
            "n_heads": 8,
            "tie_embeddings": False,
            "norm.eps": 1e-3,
            "dropout.residual": 0.2,
            "dropout.attention": 0.3,
            "positional.type": "alibi",
            "embedding_norm": True,
        },
    ),
    # ALiBi's slopes: head counts that are and are not powers of two
    bloom_row(n_head=1, spec={"n_heads": 1}, slow=True),
    bloom_row(hidden_size=24, n_head=3, spec={"n_heads": 3}, slow=True),
    bloom_row(hidden_size=48, n_head=6, spec={"n_heads": 6}),
    bloom_row(hidden_size=40, n_head=10, spec={"n_heads": 10}, slow=True),
    bloom_row(n_head=16, spec={"n_heads": 16}, slow=True),
    bloom_row(outcome="n_head", json={"n_head": 5}),  # transformers fails: 32 is not 5 heads
    bloom_row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    bloom_row(json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),  # the default
    bloom_row(layer_norm_epsilon=1e-3, spec={"norm.eps": 1e-3}, slow=True),
    bloom_row(hidden_dropout=0.2, attention_dropout=0.3, slow=True),  # training only
    bloom_row(
        outcome="apply_residual_connection_post_layernorm", apply_residual_connection_post_layernorm=True
    ),
    bloom_row(apply_residual_connection_post_layernorm=False, slow=True),
    # with slow_but_exact, transformers sums the output projections in slices without their biases
    bloom_row(outcome="slow_but_exact", pretraining_tp=2, slow_but_exact=True),
    bloom_row(outcome="slow_but_exact", pretraining_tp=3, slow_but_exact=True, slow=True),
    bloom_row(pretraining_tp=4, slow=True),  # unread without slow_but_exact
    bloom_row(pretraining_tp=1, slow_but_exact=True, slow=True),  # one slice: nothing left out
    bloom_row(initializer_range=0.5, slow=True),
    bloom_row(use_cache=False, slow=True),
    bloom_row(slow=True, **IDS),
    bloom_row(pad_token_id=None, slow=True),
    bloom_row(n_layer=1, spec={"n_layers": 1}, slow=True),
    # BloomConfig reads num_hidden_layers and num_attention_heads over n_layer and n_head, and a
    # legacy n_embed over hidden_size
    bloom_row(n_layer=1, json={"n_layer": 2, "num_hidden_layers": 1}, spec={"n_layers": 1}, slow=True),
    bloom_row(n_head=2, json={"n_head": 4, "num_attention_heads": 2}, spec={"n_heads": 2}),
    bloom_row(hidden_size=48, json={"hidden_size": 16, "n_embed": 48}, spec={"d_model": 48}, slow=True),
    bloom_row(  # bigscience/bloom-560m's Megatron-DeepSpeed fields, which transformers does not read
        json={
            "attention_softmax_in_fp32": True,
            "bias_dropout_fusion": True,
            "masked_softmax_fusion": True,
            "n_inner": None,
            "offset_alibi": 100,
            "skip_bias_add": True,
            "skip_bias_add_qkv": False,
            "unk_token_id": 0,
        },
        slow=True,
    ),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # a Falcon sequential block's dropout: said, tested apart
        check(c, tmp_path)


@pytest.mark.parametrize("model_type", ["falcon", "bloom"])
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to the config class fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES[model_type].base)
    covered |= set().union(*(c.fields() for c in CASES if c.family == model_type))
    assert _class_fields(model_type) - covered == set()


ACTIVATION_FIELDS = {"falcon": "activation"}


def _activation_cases() -> list[Any]:
    from transformers.activations import ACT2CLS

    return [
        pytest.param(family, field, act, id=f"{family}-{act}", marks=pytest.mark.slow)
        for family, field in ACTIVATION_FIELDS.items()
        for act in sorted(ACT2CLS)
    ]


@pytest.mark.parametrize(("family", "field", "value"), _activation_cases())
def test_every_activation_name_is_computed_alike_or_refused_by_name(
    family: str, field: str, value: str, tmp_path: Path
) -> None:
    try:
        FAMILIES[family].config(**(FAMILIES[family].base | {field: value}))
    except Exception:  # transformers refuses it itself
        pytest.skip(f"transformers builds no model with {field}={value}")
    try:
        check(case(family, exported=False, **{field: value}), tmp_path)
    except HFError as error:  # refused by the import, which check does not expect of a SAME row
        assert f"  {field}: " in str(error)
