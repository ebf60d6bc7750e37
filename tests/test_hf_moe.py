"""Mixtures of experts (``model.moe``) imported from transformers: Mixtral (``MixtralForCausalLM``:
Mistral's attention, every layer routed among ``num_local_experts`` experts of
``intermediate_size``, the top ``num_experts_per_tok`` probabilities renormalised), Qwen2-MoE
(``Qwen2MoeForCausalLM``: Qwen2's q, k and v biases, experts of ``moe_intermediate_size`` and a
shared expert gated by sigmoid(x . w) in the layers ``decoder_sparse_step`` and ``mlp_only_layers``
leave routed, the others a dense feed-forward of ``intermediate_size``), Qwen3-MoE
(``Qwen3MoeForCausalLM``: Qwen3's q and k norms of each head, no shared expert) and OLMoE
(``OlmoeForCausalLM``: q and k normalised over all heads in pre-norm blocks, every layer routed);
``norm_topk_prob`` as ``moe.normalize`` and ``router_aux_loss_coef`` as ``moe.balance_loss``.

Tiny random transformers models saved with save_pretrained (which writes each expert's tensors by
name, as the Hub's checkpoints hold them: ``block_sparse_moe.experts.{e}.w1/w3/w2`` and
``block_sparse_moe.gate`` for Mixtral, ``mlp.experts.{e}.gate_proj/up_proj/down_proj`` and
``mlp.gate`` for the others), imported, and held to transformers' logits (float32, rows padded on
the right and not), parameter counts and greedy generation through the ONNX bundle; a checkpoint
of transformers 5's stacked experts (``mlp.experts.gate_up_proj``) imports alike; export-hf
writes the Mixtral, Qwen2-MoE and Qwen3-MoE imports back (and tfcompile's own MoE runs as the
type their features pick), refuses OLMoE's and what no MoE type computes by field; a row for every
field of the four config classes (tests/test_hf_fields.py's table and check); folders transformers
4.57 saved import to its logits (slow, where TFCOMPILE_TRANSFORMERS_457 names a python with it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, assert_head_refused, from_pretrained, imported_variants, max_difference
from safetensors import safe_open
from safetensors.torch import save_file
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

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.models import DecoderLM
from tfcompile.spec import Spec
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=1)
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
ROUTED = dict(num_experts_per_tok=2)
MIXTRAL = BASE | ROUTED | dict(intermediate_size=16, num_local_experts=4)
QWEN2_MOE = (
    BASE
    | ROUTED
    | dict(intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4)
)
QWEN3_MOE = BASE | ROUTED | dict(intermediate_size=48, moe_intermediate_size=16, num_experts=4)
OLMOE = BASE | ROUTED | dict(intermediate_size=16, num_experts=4)
FAMILIES["mixtral"] = Family(T.MixtralConfig, T.MixtralForCausalLM, "gpt2", MIXTRAL | TOKENS)
FAMILIES["qwen2_moe"] = Family(T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM, "gpt2", QWEN2_MOE | TOKENS)
FAMILIES["qwen3_moe"] = Family(T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM, "gpt2", QWEN3_MOE | TOKENS)
FAMILIES["olmoe"] = Family(T.OlmoeConfig, T.OlmoeForCausalLM, "gpt2", OLMOE | TOKENS)
MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def model(family: str, **fields: Any) -> Any:
    f = FAMILIES[family]
    return f.model(f.config(**f.base | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Mixtral 8x7B's shape: grouped K/V heads, untied, no window, its router_aux_loss_coef
    "mixtral": lambda: model("mixtral", router_aux_loss_coef=0.02),
    # Mistral's window of 6 on every layer (the inputs run past it), heads wider than d / heads
    "mixtral_window": lambda: model("mixtral", sliding_window=6, head_dim=16, tie_word_embeddings=True),
    # Qwen1.5-MoE's: every layer routed, a gated shared expert, q/k/v biases, the top k unnormalised
    "qwen2_moe": lambda: model("qwen2_moe"),
    # every second layer routed (decoder_sparse_step 2), the last of those dense (mlp_only_layers),
    # the top k renormalised: layer 1 routes, 0, 2 and 3 are dense
    "qwen2_moe_sparse": lambda: model(
        "qwen2_moe", num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=True
    ),
    # Qwen3-30B-A3B's: q/k norms of each head, the top k renormalised
    "qwen3_moe": lambda: model("qwen3_moe", norm_topk_prob=True),
    # the first layer dense, biases on q, k, v and o, the top k unnormalised, heads of 16
    "qwen3_moe_dense_first": lambda: model(
        "qwen3_moe", mlp_only_layers=[0], attention_bias=True, head_dim=16, tie_word_embeddings=True
    ),
    # OLMoE-1B-7B's: a K/V head per head, the top k unnormalised
    "olmoe": lambda: model("olmoe", num_key_value_heads=4),
    # grouped K/V heads (the k norm narrower than the q norm), biases, the top k renormalised
    "olmoe_gqa": lambda: model("olmoe", attention_bias=True, norm_topk_prob=True),
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


def moe_of(imported: dict[str, Imported], name: str) -> dict[str, Any]:
    moe = imported[name].spec.model.moe
    assert moe is not None
    return moe.model_dump()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    routing = dict(scoring="softmax", selection_bias=False, bias_update=0.0, groups=None, scale=1.0)
    plain = routing | dict(
        shared_d_ff=None, shared_gate=False, dense_layers=None, balance_loss=0.001, router_bias=False
    )
    assert moe_of(imported, "mixtral") == plain | dict(
        experts=4, top_k=2, d_ff=16, normalize=True, balance_loss=0.02
    )
    mixtral = imported["mixtral_window"].spec.model
    assert mixtral.window is not None and (mixtral.window.size, mixtral.window.layers) == (6, None)
    assert (mixtral.head_dim, mixtral.positional.theta, mixtral.norm.eps) == (16, 1000000.0, 1e-5)
    assert (mixtral.bias.qkv, mixtral.bias.attn_out, mixtral.qk_norm) == (False, False, False)
    qwen2 = routing | dict(
        experts=4, top_k=2, d_ff=16, shared_d_ff=24, shared_gate=True, balance_loss=0.001, router_bias=False
    )
    assert moe_of(imported, "qwen2_moe") == qwen2 | dict(normalize=False, dense_layers=None)
    assert moe_of(imported, "qwen2_moe_sparse") == qwen2 | dict(normalize=True, dense_layers=[0, 2, 3])
    sparse = imported["qwen2_moe_sparse"].spec.model
    assert (sparse.d_ff, sparse.bias.qkv, sparse.bias.attn_out, sparse.window) == (48, True, False, None)
    assert moe_of(imported, "qwen3_moe") == plain | dict(experts=4, top_k=2, d_ff=16, normalize=True)
    assert moe_of(imported, "qwen3_moe_dense_first") == plain | dict(
        experts=4, top_k=2, d_ff=16, normalize=False, dense_layers=[0]
    )
    qwen3 = imported["qwen3_moe"].spec.model
    assert (qwen3.qk_norm, qwen3.qk_norm_over, qwen3.head_dim, qwen3.d_ff) == (True, "head", 8, 48)
    assert imported["qwen3_moe_dense_first"].spec.model.bias.attn_out is True
    olmoe = dict(experts=4, top_k=2, d_ff=16, balance_loss=0.01)
    assert moe_of(imported, "olmoe") == plain | olmoe | dict(normalize=False)
    assert moe_of(imported, "olmoe_gqa") == plain | olmoe | dict(normalize=True)
    grouped = imported["olmoe_gqa"].spec.model
    assert (grouped.qk_norm, grouped.qk_norm_over, grouped.norm.position, grouped.qkv_clip) == (
        True,
        "all_heads",
        "pre",
        None,
    )
    attention = imported["olmoe_gqa"].model.blocks[0].attn
    assert (attention.q_norm.weight.numel(), attention.k_norm.weight.numel()) == (32, 16)
    blocks = imported["qwen2_moe_sparse"].model.blocks
    assert [hasattr(block.ffn, "router") for block in blocks] == [False, True, False, False]


def saved_names(folder: Path) -> set[str]:
    with safe_open(folder / "model.safetensors", "pt") as f:
        return set(f.keys())


def test_save_pretrained_writes_each_expert_by_name(imported: dict[str, Imported]) -> None:
    """What transformers 5.24 writes (its save reverses the stacking it loads with): each expert's
    tensors by name, as the Hub's checkpoints hold them."""
    mixtral = saved_names(imported["mixtral"].folder)
    layer = "model.layers.0.block_sparse_moe."
    expected = {f"{layer}gate.weight"} | {f"{layer}experts.3.{w}.weight" for w in ("w1", "w2", "w3")}
    assert expected <= mixtral and not any(".mlp." in name for name in mixtral)
    qwen = saved_names(imported["qwen2_moe_sparse"].folder)
    routed, dense = "model.layers.1.mlp.", "model.layers.0.mlp."
    assert {f"{routed}gate.weight", f"{routed}shared_expert_gate.weight"} <= qwen
    assert {f"{routed}experts.3.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")} <= qwen
    assert {f"{routed}shared_expert.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")} <= qwen
    assert {f"{dense}{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")} <= qwen
    assert not any(name.startswith(dense) and "expert" in name for name in qwen)


def stacked_copy(variant: Imported, tmp_path: Path) -> Path:
    """The variant's folder with the weights as transformers 5 holds them in memory: each layer's
    experts stacked in ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj``."""
    folder = tmp_path / "stacked"
    folder.mkdir()
    for path in variant.folder.iterdir():
        if path.name != "model.safetensors":
            (folder / path.name).write_bytes(path.read_bytes())
    state = {name: t.contiguous() for name, t in variant.hf.state_dict().items()}
    if variant.hf.config.tie_word_embeddings:
        del state["lm_head.weight"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe_sparse"])
def test_a_checkpoint_of_stacked_experts_imports_alike(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    folder = stacked_copy(variant, tmp_path)
    assert "model.layers.1.mlp.experts.gate_up_proj" in saved_names(folder)
    hf, info = from_pretrained(folder, loading_info=True)
    assert not any(info.values()), info
    result = import_folder(folder, "stacked", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model == variant.spec.model
    ours = load_trained_model(result.run_dir)[1]
    for padded in (False, True):
        assert max_difference(hf, ours, padded) <= 1e-5
    for key, value in ours.state_dict().items():
        assert torch.equal(value, variant.model.state_dict()[key]), key


def test_stacked_experts_of_another_count_are_an_hf_error(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = stacked_copy(imported["qwen2_moe"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_experts": 3}))
    with pytest.raises(HFError, match=r"experts\.gate_up_proj has shape \(4, 32, 32\), not 3 experts"):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wrong").exists()


def _loads_alike(out: Path, model: torch.nn.Module) -> None:
    """transformers loads ``out`` with no missing, unexpected or mismatched tensors, and its
    logits are ``model``'s, with and without padding."""
    reloaded, info = from_pretrained(out, loading_info=True)
    assert not any(info.values()), info
    for padded in (False, True):
        assert max_difference(reloaded, model, padded) <= 1e-5, padded


WRITTEN = {
    "mixtral": "mixtral",
    "mixtral_window": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen2_moe_sparse": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "qwen3_moe_dense_first": "qwen3_moe",
    "olmoe": "olmoe",
    "olmoe_gqa": "olmoe",
}


@pytest.mark.parametrize("name", list(WRITTEN))
def test_an_imported_mixture_of_experts_round_trips(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """Written as the model type it was read from, each expert's tensors by name as save_pretrained
    writes them; transformers computes the import's logits, and the folder imports to its spec."""
    variant, out = imported[name], tmp_path / "out"
    export_hf(variant.result.run_dir, out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == WRITTEN[name]
    assert saved_names(out) == saved_names(variant.folder)
    _loads_alike(out, variant.model)
    again = import_folder(out, "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ("window: {size: 6}, moe: {experts: 4, d_ff: 16}", "model.window"),
        ("moe: {experts: 4, d_ff: 16, dense_layers: [0]}", "model.moe.dense_layers"),
        ("head_dim: 16, moe: {experts: 4, d_ff: 16}", "model.head_dim"),
    ],
)
def test_export_hf_refuses_what_olmoe_cannot_compute_by_field(edit: str, field: str, tmp_path: Path) -> None:
    """OLMoE (q and k normalised over all heads): every layer routed, no window, heads of d_model."""
    run = random_run(tmp_path, f"model: {{{OLMOE}, {edit}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == [field]
    assert "OLMoE" in str(error.value)
    assert not (tmp_path / "out").exists()


LLAMA_LIKE = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "positional: rope, norm: {type: rmsnorm}, activation: swiglu, d_ff: 48"
)
NO_BIASES = "bias: {qkv: false, attn_out: false, ffn: false}"
OLMOE = f"{LLAMA_LIKE}, qk_norm: true, qk_norm_over: all_heads, {NO_BIASES}"  # but its experts
OWN = {
    # every layer routed among experts of d_ff, renormalised, a window over every layer
    "mixtral": f"{LLAMA_LIKE}, {NO_BIASES}, window: {{size: 6}}, moe: {{experts: 4, balance_loss: 0.02}}",
    # no window, experts of their own width, top 1
    "mixtral top 1": f"{LLAMA_LIKE}, {NO_BIASES}, moe: {{experts: 3, top_k: 1, d_ff: 48, normalize: true}}",
    # q/k norms, biases on q, k, v and o, the first layer dense, the top k as the softmax gave it
    "qwen3_moe": f"{LLAMA_LIKE}, qk_norm: true, bias: {{qkv: true, attn_out: true, ffn: false}}, "
    "moe: {experts: 4, d_ff: 16, normalize: false, dense_layers: [0]}",
    # q/k norms, no biases (written as zeros), a window over every layer, heads of 16
    "qwen3_moe window": f"{LLAMA_LIKE}, head_dim: 16, qk_norm: true, {NO_BIASES}, window: {{size: 6}}, "
    "moe: {experts: 4, d_ff: 16, top_k: 3}",
    # a gated shared expert, q, k and v biases, the middle layer dense, a window on layers 0 and 2
    "qwen2_moe": f"{LLAMA_LIKE}, bias: {{qkv: true, attn_out: false, ffn: false}}, "
    "window: {size: 6, layers: [0, 2]}, "
    "moe: {experts: 4, d_ff: 16, shared_d_ff: 24, shared_gate: true, dense_layers: [1], normalize: true}",
    # without biases, every layer routed, unnormalised
    "qwen2_moe plain": f"{LLAMA_LIKE}, {NO_BIASES}, "
    "moe: {experts: 3, d_ff: 16, shared_d_ff: 8, shared_gate: true, normalize: false, balance_loss: 0}",
    # q and k normalised over all heads, no biases (written as zeros), the top k renormalised
    "olmoe": f"{OLMOE}, moe: {{experts: 4, d_ff: 16}}",
    # unnormalised, q, k, v and o biases
    "olmoe biased": f"{OLMOE.replace(NO_BIASES, 'bias: {qkv: true, attn_out: true, ffn: false}')}, "
    "moe: {experts: 3, d_ff: 16, normalize: false}",
}


@pytest.mark.parametrize("name", list(OWN))
def test_a_run_of_tfcompiles_own_mixture_of_experts_loads_in_transformers(name: str, tmp_path: Path) -> None:
    """A random MoE run is written as the model type its features pick, with the fields its config
    class reads, and transformers computes its logits; the folder imports back to the spec."""
    run = random_run(tmp_path, f"model: {{{OWN[name]}}}\n")
    spec, model = load_trained_model(run)
    assert spec.model.moe is not None
    architecture = export_hf(run, tmp_path / "out")
    written = name.split()[0]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == written
    assert architecture == config["architectures"][0]
    moe = spec.model.moe
    assert (config["num_experts_per_tok"], config["router_aux_loss_coef"]) == (moe.top_k, moe.balance_loss)
    assert config["num_local_experts" if written == "mixtral" else "num_experts"] == moe.experts
    if written != "mixtral":
        assert config["norm_topk_prob"] == moe.normalize
    if written in ("qwen2_moe", "qwen3_moe"):  # dense layers of intermediate_size
        assert config["mlp_only_layers"] == (moe.dense_layers or [])
        assert (config["intermediate_size"], config["moe_intermediate_size"]) == (spec.model.d_ff, moe.d_ff)
    _loads_alike(tmp_path / "out", model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs").spec.model
    assert again.moe == moe and again.window == spec.model.window
    assert again.qk_norm == spec.model.qk_norm and again.head_dim == spec.model.head_dim
    assert (again.bias.qkv, again.bias.attn_out) == (
        spec.model.bias.qkv or (written in ("qwen3_moe", "olmoe") and spec.model.bias.attn_out),
        spec.model.bias.attn_out or (written in ("qwen3_moe", "olmoe") and spec.model.bias.qkv),
    )


@pytest.mark.parametrize(
    ("model", "fields", "written"),
    [
        # no q/k norms, no shared expert: Mixtral, which routes every layer
        (
            f"{LLAMA_LIKE}, {NO_BIASES}, moe: {{experts: 4, dense_layers: [0]}}",
            ["model.moe.dense_layers"],
            "Mixtral",
        ),
        (
            f"{LLAMA_LIKE}, {NO_BIASES}, moe: {{experts: 4, normalize: false}}",
            ["model.moe.normalize"],
            "Mixtral",
        ),
        (
            f"{LLAMA_LIKE}, bias: {{qkv: true, attn_out: true, ffn: false}}, moe: {{experts: 4}}",
            ["model.bias.qkv", "model.bias.attn_out"],
            "Mixtral",
        ),
        (
            f"{LLAMA_LIKE}, {NO_BIASES}, window: {{size: 6, layers: [0]}}, moe: {{experts: 4}}",
            ["model.window.layers"],
            "Mixtral",
        ),
        # q/k norms: Qwen3-MoE, which slides every layer or none
        (
            f"{LLAMA_LIKE}, qk_norm: true, {NO_BIASES}, window: {{size: 6, layers: [1]}}, "
            "moe: {experts: 4}",
            ["model.window.layers"],
            "Qwen3-MoE",
        ),
        # a gated shared expert: Qwen2-MoE, with no q/k norms or output bias
        (
            f"{LLAMA_LIKE}, qk_norm: true, bias: {{qkv: true, attn_out: true, ffn: false}}, "
            "moe: {experts: 4, shared_d_ff: 8, shared_gate: true}",
            ["model.qk_norm", "model.bias.attn_out"],
            "Qwen2-MoE",
        ),
        # an ungated one: GraniteMoeShared (tests/test_hf_granitemoe.py), with no q/k norms
        (
            f"{LLAMA_LIKE}, qk_norm: true, {NO_BIASES}, moe: {{experts: 4, shared_d_ff: 8}}",
            ["model.qk_norm"],
            "GraniteMoeShared",
        ),
        # the experts' biases: no MoE type has them
        (
            f"{LLAMA_LIKE}, bias: {{qkv: false, attn_out: false, ffn: true}}, moe: {{experts: 4}}",
            ["model.bias.ffn"],
            "Mixtral",
        ),
        # Granite's multipliers: GraniteMoE, which routes every layer
        (
            f"{LLAMA_LIKE}, {NO_BIASES}, residual_multiplier: 0.5, moe: {{experts: 4, dense_layers: [1]}}",
            ["model.moe.dense_layers"],
            "GraniteMoE",
        ),
    ],
    ids=[
        "mixtral-dense-layers",
        "mixtral-unnormalised",
        "mixtral-biases",
        "mixtral-window-on-some-layers",
        "qwen3_moe-window-on-some-layers",
        "qwen2_moe-gated",
        "granitemoeshared-ungated",
        "expert-biases",
        "granitemoe",
    ],
)
def test_a_mixture_of_experts_no_moe_type_computes_is_refused_by_field(
    model: str, fields: list[str], written: str, tmp_path: Path
) -> None:
    run = random_run(tmp_path, f"model: {{{model}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == fields
    assert f"{written} equivalent" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_gpt2_like_mixture_of_experts_is_refused_at_model_moe(tmp_path: Path) -> None:
    """Only the LLaMA family's MoE types are written: GPT-2's writer refuses model.moe."""
    run = random_run(
        tmp_path,
        "model: {family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 24, "
        "moe: {experts: 4}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert "model.moe" in re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert "export-hf writes no mixture of experts" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_olmoe_clamps_after_its_norms_where_the_specs_clip_is_before(imported: dict[str, Imported]) -> None:
    """Why clip_qkv is refused: transformers' OLMoE with a clip and the import with qkv_clip (the
    clamp OLMo and MPT have, before the q and k norms) compute other logits, where the import
    without a clip gives the unclipped model's."""
    variant = imported["olmoe_gqa"]
    clip = 0.01  # bites both before the norms (small projections) and after them (about 1)
    clipped = DecoderLM(variant.spec.model.model_copy(update={"qkv_clip": clip})).eval()
    clipped.load_state_dict(variant.model.state_dict())
    assert max_difference(variant.hf, variant.model, padded=False) <= 1e-5
    variant.hf.config.clip_qkv = clip
    try:
        assert max_difference(variant.hf, clipped, padded=False) > 1e-2
        assert max_difference(variant.hf, variant.model, padded=False) > 1e-2
    finally:
        variant.hf.config.clip_qkv = None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral_window", "qwen2_moe_sparse", "qwen3_moe_dense_first", "olmoe_gqa"])
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


@pytest.mark.parametrize(
    ("name", "head"),
    [("mixtral", "MixtralForSequenceClassification"), ("qwen2_moe", "Qwen2MoeForTokenClassification")],
)
def test_a_classifier_head_is_refused_by_architectures(
    imported: dict[str, Imported], name: str, head: str, tmp_path: Path
) -> None:
    assert_head_refused(imported[name], head, tmp_path)


# ------------------------------------------------------------------ every config field, by value

EVERY_LAYER_6 = {"window.size": 6, "window.layers": None}


def rows(family: str) -> Callable[..., Case]:
    """Cases of ``family``: each SAME row written back by export-hf."""

    def row(**fields: Any) -> Case:
        return case(family, **fields)

    return row


def shared(family: str) -> list[Case]:
    """The rows the four read alike (LLaMA's fields, the router's)."""
    row = rows(family)
    slow = True
    return [
        row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=slow),
        row(num_key_value_heads=4, slow=True),
        row(outcome="num_key_value_heads", num_key_value_heads=3, slow=True),
        row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=slow),
        row(rms_norm_eps=1e-2, spec={"norm.eps": 1e-2}, slow=slow),
        row(hidden_act="gelu", spec={"activation": "geglu"}, slow=slow),
        row(outcome="hidden_act", hidden_act="relu", slow=True),  # a gated ReLU is not in the spec
        row(initializer_range=0.5, slow=True),
        row(attention_dropout=0.3, spec={"dropout.attention": 0.3}, slow=True),  # training only
        row(use_cache=False, slow=True),
        row(slow=True, **IDS),
        row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
        row(num_hidden_layers=1, slow=True),
        row(vocab_size=VOCAB, slow=True),
        row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
        row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
        row(**rope(**YARN), **({"head_dim": 8} if family == "mixtral" else {}), slow=True),
        row(
            json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True
        ),
        # the router: top k, the load-balancing coefficient (training only), the training switches
        row(num_experts_per_tok=1, spec={"moe.top_k": 1}, slow=slow),
        row(num_experts_per_tok=4, spec={"moe.top_k": 4}, slow=True),  # every expert
        row(outcome="num_experts_per_tok", num_experts_per_tok=5),  # transformers' top-k fails
        row(router_aux_loss_coef=0.3, spec={"moe.balance_loss": 0.3}, slow=True),
        row(outcome="router_aux_loss_coef", router_aux_loss_coef=-1.0, slow=True),  # the spec's ge 0
        row(output_router_logits=True, slow=True),  # training only (transformers' aux loss)
        row(outcome="architectures", json={"architectures": ["LlamaForTokenClassification"]}, slow=True),
    ]


MIXTRAL_CASES: list[Case] = [
    *shared("mixtral"),
    rows("mixtral")(  # the MoE fields at once
        num_local_experts=3,
        num_experts_per_tok=3,
        intermediate_size=24,
        router_aux_loss_coef=0.02,
        router_jitter_noise=0.1,  # training only
        spec={
            "moe.experts": 3,
            "moe.top_k": 3,
            "moe.d_ff": 24,
            "moe.normalize": True,
            "moe.balance_loss": 0.02,
        },
    ),
    rows("mixtral")(outcome="num_local_experts", num_local_experts=1, num_experts_per_tok=1),
    rows("mixtral")(head_dim=16, spec={"head_dim": 16}, slow=True),
    rows("mixtral")(json={"head_dim": None}, spec={"head_dim": 8}, slow=True),
    # MixtralConfig derives no head_dim, which transformers' dynamic and YaRN RoPE read: they fail
    rows("mixtral")(outcome="head_dim", json=rope(**YARN)),
    rows("mixtral")(outcome="head_dim", json={"rope_parameters": DELETE, "rope_scaling": YARN}, slow=True),
    rows("mixtral")(head_dim=8, **rope(rope_type="dynamic", factor=2.0), slow=True),
    rows("mixtral")(
        **rope(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0), slow=True
    ),
    # Mistral's window over every layer; none where it holds the context
    rows("mixtral")(sliding_window=6, spec=EVERY_LAYER_6),
    rows("mixtral")(sliding_window=64, spec={"window": None}, slow=True),
    # layer_types and use_sliding_window are not Mixtral's: every layer slides
    rows("mixtral")(
        sliding_window=6,
        json={"layer_types": ["full_attention"] * 3, "use_sliding_window": False},
        spec=EVERY_LAYER_6,
        slow=True,
    ),
    # no biases, whatever the config says; num_experts is the expert count (read over num_local_experts)
    rows("mixtral")(json={"attention_bias": True, "mlp_bias": True}, spec={"bias.qkv": False}, slow=True),
    rows("mixtral")(json={"num_experts": 4, "num_local_experts": DELETE}, spec={"moe.experts": 4}, slow=True),
    rows("mixtral")(json={"num_experts": 4, "num_local_experts": 3}, spec={"moe.experts": 4}),
    rows("mixtral")(json={"norm_topk_prob": False}, spec={"moe.normalize": True}, slow=True),
    # MixtralConfig's defaults: theta 1,000,000, epsilon 1e-5, the aux coefficient 0.001
    rows("mixtral")(
        json={"rope_parameters": DELETE, "rms_norm_eps": DELETE, "router_aux_loss_coef": DELETE},
        spec={"positional.theta": 1000000.0, "norm.eps": 1e-5, "moe.balance_loss": 0.001},
        slow=True,
    ),
]

QWEN2_MOE_CASES: list[Case] = [
    *shared("qwen2_moe"),
    rows("qwen2_moe")(  # the MoE fields at once
        num_experts=3,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=12,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[2],
        intermediate_size=40,
        spec={
            "d_ff": 40,
            "moe.experts": 3,
            "moe.d_ff": 8,
            "moe.shared_d_ff": 12,
            "moe.shared_gate": True,
            "moe.normalize": True,
            "moe.dense_layers": [0, 2],
        },
    ),
    rows("qwen2_moe")(norm_topk_prob=True, spec={"moe.normalize": True}, slow=True),
    rows("qwen2_moe")(decoder_sparse_step=3, spec={"moe.dense_layers": [0, 1]}, slow=True),
    rows("qwen2_moe")(decoder_sparse_step=-2, spec={"moe.dense_layers": [0, 2]}, slow=True),  # as 2
    rows("qwen2_moe")(
        outcome="decoder_sparse_step", json={"decoder_sparse_step": 0}
    ),  # transformers divides by it
    rows("qwen2_moe")(mlp_only_layers=[0, 7], spec={"moe.dense_layers": [0]}, slow=True),  # 7: no layer
    rows("qwen2_moe")(outcome="mlp_only_layers", json={"mlp_only_layers": "1"}, slow=True),
    rows("qwen2_moe")(json={"mlp_only_layers": None}, spec={"moe.dense_layers": None}, slow=True),
    # no layer routes: a dense model, which export-hf writes as Llama
    case("qwen2_moe", num_experts=0, spec={"moe": None, "d_ff": 48}),
    case("qwen2_moe", mlp_only_layers=[0, 1, 2], spec={"moe": None}, slow=True),
    rows("qwen2_moe")(outcome="num_experts", num_experts=1, num_experts_per_tok=1, slow=True),  # the spec's 2
    rows("qwen2_moe")(
        outcome="shared_expert_intermediate_size", shared_expert_intermediate_size=0, slow=True
    ),
    rows("qwen2_moe")(moe_intermediate_size=8, spec={"moe.d_ff": 8}, slow=True),
    # q, k and v biases with qkv_bias (true where left out), never o's; attention_bias is not Qwen2-MoE's
    rows("qwen2_moe")(qkv_bias=False, spec={"bias.qkv": False}),
    rows("qwen2_moe")(json={"qkv_bias": DELETE}, spec={"bias.qkv": True, "bias.attn_out": False}, slow=True),
    rows("qwen2_moe")(json={"attention_bias": True}, spec={"bias.attn_out": False}, slow=True),
    # not a field: read where set; not written back (transformers 4.57's Qwen2-MoE ignores it)
    rows("qwen2_moe")(head_dim=16, spec={"head_dim": 16}, exported=False, slow=True),
    # the window: every other layer below max_window_layers slides, with use_sliding_window
    rows("qwen2_moe")(
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=3,
        spec={"window.size": 6, "window.layers": [0, 2]},
    ),
    rows("qwen2_moe")(
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=1,
        json={"layer_types": DELETE},
        spec={"window.size": 6, "window.layers": [0]},
        slow=True,
    ),
    rows("qwen2_moe")(use_sliding_window=False, sliding_window=6, spec={"window": None}, slow=True),
    rows("qwen2_moe")(
        use_sliding_window=True,
        sliding_window=6,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        spec={"window.size": 6, "window.layers": [1, 2]},
        slow=True,
    ),
    # sliding layers without use_sliding_window: a window of 0, which transformers' forward fails on
    rows("qwen2_moe")(
        outcome="layer_types",
        use_sliding_window=False,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
    ),
    # Qwen2MoeConfig's defaults where the config leaves a field out
    rows("qwen2_moe")(
        json={"router_aux_loss_coef": DELETE, "norm_topk_prob": DELETE, "decoder_sparse_step": DELETE},
        spec={"moe.balance_loss": 0.001, "moe.normalize": False, "moe.dense_layers": None},
        slow=True,
    ),
]

QWEN3_MOE_CASES: list[Case] = [
    *shared("qwen3_moe"),
    rows("qwen3_moe")(  # the MoE fields at once
        moe_intermediate_size=8,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        attention_bias=True,
        spec={
            "moe.experts": 4,
            "moe.d_ff": 8,
            "moe.normalize": True,
            "moe.dense_layers": [0, 2],
            "moe.shared_d_ff": None,
            "qk_norm": True,
            "bias.qkv": True,
            "bias.attn_out": True,
        },
    ),
    rows("qwen3_moe")(mlp_only_layers=[1], spec={"moe.dense_layers": [1]}, slow=True),
    rows("qwen3_moe")(outcome="decoder_sparse_step", json={"decoder_sparse_step": 0}, slow=True),
    rows("qwen3_moe")(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    case("qwen3_moe", num_experts=0, spec={"moe": None, "qk_norm": True}),  # dense: written as Qwen3
    # the expert count as published (num_experts) and as transformers 5 saves it (num_local_experts,
    # which it reads over num_experts)
    rows("qwen3_moe")(
        json={"num_experts": 4, "num_local_experts": DELETE}, spec={"moe.experts": 4}, slow=True
    ),
    rows("qwen3_moe")(json={"num_experts": 3, "num_local_experts": 4}, spec={"moe.experts": 4}),
    # heads of hidden_size / heads where no head_dim (not Qwen3's 128)
    rows("qwen3_moe")(head_dim=16, spec={"head_dim": 16}, slow=True),
    rows("qwen3_moe")(json={"head_dim": DELETE}, spec={"head_dim": 8}, slow=True),
    # every layer slides with use_sliding_window (no layer_types, no max_window_layers)
    rows("qwen3_moe")(use_sliding_window=True, sliding_window=6, spec=EVERY_LAYER_6),
    rows("qwen3_moe")(
        use_sliding_window=True,
        sliding_window=6,
        json={"layer_types": ["full_attention"] * 3, "max_window_layers": 2},
        spec=EVERY_LAYER_6,
        slow=True,
    ),
    rows("qwen3_moe")(use_sliding_window=False, sliding_window=6, spec={"window": None}, slow=True),
    rows("qwen3_moe")(json={"mlp_bias": True}, spec={"bias.ffn": False}, slow=True),
]

OLMOE_CASES: list[Case] = [
    *shared("olmoe"),
    rows("olmoe")(  # the MoE fields at once
        num_experts=3,
        intermediate_size=24,
        norm_topk_prob=True,
        attention_bias=True,
        spec={
            "moe.experts": 3,
            "moe.d_ff": 24,
            "moe.normalize": True,
            "qk_norm_over": "all_heads",
            "bias.qkv": True,
            "bias.attn_out": True,
        },
    ),
    rows("olmoe")(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    rows("olmoe")(norm_topk_prob=True, spec={"moe.normalize": True}, slow=True),
    # OLMoE clamps q and k after their norms; the spec's qkv_clip before them
    rows("olmoe")(outcome="clip_qkv", clip_qkv=0.5),
    rows("olmoe")(clip_qkv=None, spec={"qkv_clip": None}, slow=True),
    # OlmoeAttention's q norm reads hidden_size features: other heads fail transformers' forward
    rows("olmoe")(outcome="head_dim", json={"head_dim": 16}, slow=True),
    rows("olmoe")(json={"head_dim": 8}, slow=True),
    rows("olmoe")(json={"num_local_experts": 4, "num_experts": 3}, spec={"moe.experts": 4}, slow=True),
    # OLMoE's mask is causal whatever sliding_window says, but transformers' generation cache keeps
    # only the last sliding_window keys: refused; a window of the whole context is none
    rows("olmoe")(
        outcome="sliding_window", json={"sliding_window": 4, "use_sliding_window": True}, slow=True
    ),
    rows("olmoe")(json={"sliding_window": 32, "use_sliding_window": True}, spec={"window": None}, slow=True),
    # OlmoeConfig's defaults: epsilon 1e-5, the aux coefficient 0.01
    rows("olmoe")(
        json={"rms_norm_eps": DELETE, "router_aux_loss_coef": DELETE},
        spec={"norm.eps": 1e-5, "moe.balance_loss": 0.01},
        slow=True,
    ),
]

CASES = MIXTRAL_CASES + QWEN2_MOE_CASES + QWEN3_MOE_CASES + OLMOE_CASES


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to one of the four config classes fails this until a row of CASES
    says what it does (or the family's tiny base sets it)."""
    assert uncovered(model_type, [c for c in CASES if c.family == model_type]) == set()


# Run in transformers 4.57: a tiny model of each type, its weights moved off their initial values,
# saved as 4.57 saves it, with its logits on the saved ids.
SAVE_457 = r"""
import json, sys, torch, transformers as T
out = sys.argv[1]
torch.manual_seed(0)
base = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=1, num_experts_per_tok=2)
models = {
    "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                dict(intermediate_size=16, num_local_experts=4, sliding_window=6)),
    "qwen2_moe": (T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM,
                  dict(intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                       num_experts=4, decoder_sparse_step=2, mlp_only_layers=[2], num_hidden_layers=4)),
    "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                  dict(intermediate_size=48, moe_intermediate_size=16, num_experts=4, norm_topk_prob=True)),
    "olmoe": (T.OlmoeConfig, T.OlmoeForCausalLM, dict(intermediate_size=16, num_experts=4)),
    "granitemoeshared": (T.GraniteMoeSharedConfig, T.GraniteMoeSharedForCausalLM,
                         dict(intermediate_size=16, num_local_experts=4, shared_intermediate_size=8,
                              residual_multiplier=0.5, logits_scaling=2.0, attention_multiplier=0.1)),
    "flex_olmo": (T.FlexOlmoConfig, T.FlexOlmoForCausalLM,
                  dict(intermediate_size=16, num_experts=4, attention_bias=True, norm_topk_prob=True)),
    "hunyuan_v1_moe": (T.HunYuanMoEV1Config, T.HunYuanMoEV1ForCausalLM,
                       dict(intermediate_size=16, num_experts=4, moe_topk=[2, 2, 2], head_dim=8)),
}
ids = torch.randint(2, 64, (2, 12))
results = {"version": T.__version__, "ids": ids.tolist()}
for name, (config, cls, fields) in models.items():
    model = cls(config(**(base | fields))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        results[name] = model(ids).logits.tolist()
    model.save_pretrained(f"{out}/{name}")
json.dump(results, open(f"{out}/logits.json", "w"))
"""
PYTHON_457 = os.environ.get("TFCOMPILE_TRANSFORMERS_457")


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
def test_folders_transformers_4_57_saved_import_to_its_logits(tmp_path: Path) -> None:
    """Published checkpoints were saved by transformers 4: its config.json (Qwen3-MoE's num_experts,
    Qwen2-MoE's sparse steps; those of GraniteMoeShared, FlexOlmo and HunYuan-MoE, a top k per
    layer, the model types of their own test files) and tensors import to the logits 4.57
    computes."""
    assert PYTHON_457 is not None
    subprocess.run([PYTHON_457, "-c", SAVE_457, str(tmp_path / "saved")], check=True)
    saved = json.loads((tmp_path / "saved" / "logits.json").read_text())
    assert saved["version"].startswith("4.57")
    ids = torch.tensor(saved["ids"])
    for name in (*MODEL_TYPES, "granitemoeshared", "flex_olmo", "hunyuan_v1_moe"):
        import_folder(tmp_path / "saved" / name, name, tmp_path / "specs", tmp_path / "runs")
        spec, model = load_trained_model(tmp_path / "runs" / name)
        assert spec.model.moe is not None
        with torch.no_grad():
            logits = model.eval()(ids)
        torch.testing.assert_close(logits, torch.tensor(saved[name]), atol=1e-5, rtol=1e-5, msg=name)


# Run in transformers 4.57: each export-hf folder's logits on the given ids, and what loading reported.
LOAD_457 = r"""
import json, sys, torch, transformers as T
ids, results = torch.tensor(json.loads(sys.argv[1])), {}
for folder in sys.argv[2:]:
    model, info = T.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, torch_dtype=torch.float32)
    with torch.no_grad():
        results[folder] = [model.eval()(ids).logits.tolist(), {k: list(v) for k, v in info.items() if v}]
print(json.dumps(results))
"""
BODY_457 = (
    "vocab_size: 64, d_model: 32, n_heads: 4, n_kv_heads: 2, n_layers: 3, max_seq_len: 24, positional: rope, "
)
BODY_457 += "norm: {type: rmsnorm}, activation: swiglu, tie_embeddings: false"
NO_BIAS = "bias: {qkv: false, attn_out: false, ffn: false}"
HEADS_457 = {
    "MixtralForCausalLM": f"{NO_BIAS}, moe: {{experts: 4, d_ff: 16}}",
    "Qwen3MoeForCausalLM": f"{NO_BIAS}, qk_norm: true, "
    "moe: {experts: 4, d_ff: 16, normalize: false, dense_layers: [1]}",
    "Qwen2MoeForCausalLM": "bias: {qkv: true, attn_out: false, ffn: false}, "
    "moe: {experts: 4, d_ff: 16, shared_d_ff: 24, shared_gate: true}",
    "GraniteMoeForCausalLM": "bias: {qkv: true, attn_out: true, ffn: false}, residual_multiplier: 0.5, "
    "moe: {experts: 4, d_ff: 16}",
    "GraniteMoeSharedForCausalLM": f"{NO_BIAS}, attention_scale: 0.1, "
    "moe: {experts: 4, d_ff: 16, shared_d_ff: 8}",
}


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
def test_transformers_4_57_loads_each_written_mixture_of_experts_to_the_runs_logits(tmp_path: Path) -> None:
    written = {head: f"model: {{{BODY_457}, {fields}}}\n" for head, fields in HEADS_457.items()}
    assert_4_57_loads_written(written, tmp_path)


def assert_4_57_saved_imports(script: str, tmp_path: Path) -> dict[str, Spec]:
    """``script``, run in transformers 4.57, saves models (as the published checkpoints were saved)
    into folders under its argument, with logits.json: {"version", "ids", folder: logits}. Each
    folder imports to its logits -> the specs by folder."""
    assert PYTHON_457 is not None
    subprocess.run([PYTHON_457, "-c", script, str(tmp_path / "saved")], check=True)
    saved = json.loads((tmp_path / "saved" / "logits.json").read_text())
    assert saved["version"].startswith("4.57")
    specs = {}
    for name in (key for key in saved if key not in ("version", "ids")):
        result = import_folder(tmp_path / "saved" / name, name, tmp_path / "specs", tmp_path / "runs")
        spec, ours = load_trained_model(result.run_dir)
        with torch.no_grad():
            logits = ours.eval()(torch.tensor(saved["ids"]))
        torch.testing.assert_close(logits, torch.tensor(saved[name]), atol=1e-5, rtol=1e-5, msg=name)
        specs[name] = spec
    return specs


def assert_4_57_loads_written(written: dict[str, str], tmp_path: Path) -> None:
    """A random run of each spec (head -> spec text), which export-hf writes as that head:
    transformers 4.57 loads each folder with no missing, unexpected or mismatched tensors, to the
    run's logits (one python of 4.57 for them all)."""
    assert PYTHON_457 is not None
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    expected = {}
    for head, text in written.items():
        run = random_run(tmp_path / head, text)
        assert export_hf(run, tmp_path / head / "hf") == head
        _, model = load_trained_model(run)
        with torch.no_grad():
            expected[str(tmp_path / head / "hf")] = model.eval()(ids)
    result = subprocess.run(
        [PYTHON_457, "-c", LOAD_457, json.dumps(ids.tolist()), *expected],
        capture_output=True,
        text=True,
        check=True,
    )
    read = json.loads(result.stdout.strip().splitlines()[-1])
    for folder, logits in expected.items():
        assert read[folder][1] == {}, read[folder][1]  # no missing, unexpected or mismatched tensors
        torch.testing.assert_close(torch.tensor(read[folder][0]), logits, atol=1e-5, rtol=1e-5, msg=folder)


def test_export_hf_refuses_heads_of_their_own_width_where_transformers_4_reads_hidden_size(
    tmp_path: Path,
) -> None:
    """Qwen2-MoE (written for a gated shared expert): transformers 4.57 derives its heads' width
    from hidden_size, and refused the folder of a head_dim of its own."""
    moe = "moe: {experts: 4, d_ff: 16, shared_d_ff: 8, shared_gate: true}"
    run = random_run(tmp_path, f"model: {{{LLAMA_LIKE}, {NO_BIASES}, head_dim: 16, {moe}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == ["model.head_dim"]
    assert "Qwen2-MoE" in str(error.value) and not (tmp_path / "out").exists()
