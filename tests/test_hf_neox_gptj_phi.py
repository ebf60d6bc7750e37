"""GPT-NeoX (Pythia), GPT-J and Phi (1, 1.5, 2): the architectures of parallel blocks and partial
rotary. Tiny random transformers models saved with save_pretrained, imported, and held to
transformers' logits (float32, rows padded on the right and not), its parameter counts and greedy
generation; GPT-NeoX written back with export-hf (and tfcompile's own runs with LayerNorm or
parallel blocks and RoPE written as GPT-NeoX); and a row for every field of the three config
classes (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, max_difference, perturb, write
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
    case,
    check,
    longrope,
)

from tfcompile.hf import exporter
from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import architecture_for, export_hf
from tfcompile.hf.gpt_neox import rotary_fraction
from tfcompile.hf.importer import import_folder
from tfcompile.spec import parse_spec
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

NEOX = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
)
# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does.
TOKENS = dict(bos_token_id=0, eos_token_id=0)
PHI = NEOX | TOKENS
GPTJ = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=32, **TOKENS)
FAMILIES |= {
    "gpt_neox": Family(T.GPTNeoXConfig, T.GPTNeoXForCausalLM, "gpt2", NEOX),
    "phi": Family(T.PhiConfig, T.PhiForCausalLM, "gpt2", PHI),
    "gptj": Family(T.GPTJConfig, T.GPTJForCausalLM, "gpt2", GPTJ),
}

# name -> (the model, the head class export-hf writes its import as; None: refused)
VARIANTS: dict[str, tuple[Callable[[], Any], str | None]] = {
    "neox": (  # Pythia's shape: parallel blocks of two norms, a quarter of each head rotated, untied
        lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**NEOX, **TOKENS)),
        "GPTNeoXForCausalLM",
    ),
    "neox_sequential_tied": (  # sublayers in turn, no attention biases, half of each head, tied
        lambda: T.GPTNeoXForCausalLM(
            T.GPTNeoXConfig(
                **NEOX,
                use_parallel_residual=False,
                attention_bias=False,
                tie_word_embeddings=True,
                rotary_pct=0.5,
                hidden_act="gelu_new",
                layer_norm_eps=1e-3,
                **TOKENS,
            )
        ),
        "GPTNeoXForCausalLM",
    ),
    "neox_linear": (  # linear RoPE scaling over the rotated width, theta of its own
        lambda: T.GPTNeoXForCausalLM(
            T.GPTNeoXConfig(
                **NEOX,
                rope_parameters={
                    "rope_type": "linear",
                    "factor": 2.0,
                    "rope_theta": 500.0,
                    "partial_rotary_factor": 0.75,
                },
                **TOKENS,
            )
        ),
        "GPTNeoXForCausalLM",
    ),
    "phi": (  # Phi-2's shape: one shared norm, half of each head rotated, biases on the head too
        lambda: T.PhiForCausalLM(T.PhiConfig(**PHI)),
        None,
    ),
    "phi_qk_norm_gqa_tied": (  # Phi's per-head q and k LayerNorms, grouped K/V heads, tied head
        lambda: T.PhiForCausalLM(
            T.PhiConfig(
                **PHI,
                qk_layernorm=True,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                hidden_act="gelu",
                layer_norm_eps=1e-3,
                rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.75},
            )
        ),
        None,
    ),
    "gptj": (  # GPT-J-6B's shape: one shared norm, interleaved pairs of part of each head, no
        # attention biases, an untied head with a bias
        lambda: T.GPTJForCausalLM(T.GPTJConfig(**GPTJ)),
        None,
    ),
    "gptj_whole_tied": (
        lambda: T.GPTJForCausalLM(
            T.GPTJConfig(
                **GPTJ | {"rotary_dim": 8},
                n_inner=40,
                tie_word_embeddings=True,
                activation_function="gelu",
                layer_norm_epsilon=1e-3,
            )
        ),
        None,
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

    neox, sequential, linear = model("neox"), model("neox_sequential_tied"), model("neox_linear")
    assert (neox.block.type, neox.block.shared_norm, neox.norm.type, neox.norm.bias) == (
        "parallel",
        False,
        "layernorm",
        True,
    )
    assert (neox.positional.layout, neox.positional.rotary_dims, neox.head_dim, neox.tie_embeddings) == (
        "halves",
        2,
        8,
        False,
    )
    assert (neox.bias.qkv, neox.bias.attn_out, neox.bias.ffn, neox.bias.lm_head) == (True, True, True, False)
    assert (sequential.block.type, sequential.positional.rotary_dims, sequential.tie_embeddings) == (
        "sequential",
        4,
        True,
    )
    assert (sequential.bias.qkv, sequential.bias.attn_out, sequential.bias.ffn) == (False, False, True)
    assert (sequential.activation, sequential.norm.eps) == ("gelu_tanh", 1e-3)
    assert (linear.positional.theta, linear.positional.rotary_dims, linear.positional.scaling.factor) == (
        500.0,
        6,
        2.0,
    )
    phi, qk = model("phi"), model("phi_qk_norm_gqa_tied")
    assert (phi.block.type, phi.block.shared_norm, phi.positional.rotary_dims, phi.tie_embeddings) == (
        "parallel",
        True,
        4,
        False,
    )
    assert (phi.bias.qkv, phi.bias.attn_out, phi.bias.ffn, phi.bias.lm_head, phi.qk_norm) == (
        True,
        True,
        True,
        True,
        False,
    )
    assert (phi.activation, phi.n_kv_heads, phi.positional.layout) == ("gelu_tanh", 4, "halves")
    assert (qk.qk_norm, qk.n_kv_heads, qk.tie_embeddings, qk.positional.rotary_dims) == (True, 2, True, 6)
    assert (qk.positional.theta, qk.norm.eps, qk.activation) == (500.0, 1e-3, "gelu")
    gptj, whole = model("gptj"), model("gptj_whole_tied")
    assert (gptj.block.type, gptj.block.shared_norm, gptj.positional.layout, gptj.positional.rotary_dims) == (
        "parallel",
        True,
        "interleaved",
        4,
    )
    assert (gptj.bias.qkv, gptj.bias.attn_out, gptj.bias.ffn, gptj.bias.lm_head, gptj.tie_embeddings) == (
        False,
        False,
        True,
        True,
        False,
    )
    assert (gptj.positional.theta, gptj.activation, gptj.d_ff) == (10000.0, "gelu_tanh", 128)
    assert (whole.positional.rotary_dims, whole.tie_embeddings, whole.d_ff, whole.norm.eps) == (
        8,
        True,
        40,
        1e-3,
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant, written = imported[name], VARIANTS[name][1]
    if written is None:
        with pytest.raises(HFError):
            export_hf(variant.result.run_dir, tmp_path / "out")
        return
    assert export_hf(variant.result.run_dir, tmp_path / "out") == written
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


def test_transformers_4_names_and_buffers_import_alike(imported: dict[str, Imported], tmp_path: Path) -> None:
    """The LM head as transformers 5 names it in memory (lm_head) or 4 and both save it
    (embed_out), and the causal mask and RoPE buffers older checkpoints hold, which hold no weights."""
    variant = imported["neox"]
    folder = tmp_path / "src"
    write(variant.hf, "gpt2", folder)
    weights = load_file(folder / "model.safetensors")
    assert "embed_out.weight" in weights
    weights["lm_head.weight"] = weights.pop("embed_out.weight")
    for i in range(2):
        weights[f"gpt_neox.layers.{i}.attention.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.bool).tril()
        weights[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
        weights[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(1)
    save_file(weights, folder / "model.safetensors")
    result = import_folder(folder, "old", tmp_path / "specs", tmp_path / "runs")
    ours = load_trained_model(result.run_dir)[1]
    for padded in (False, True):
        assert max_difference(variant.hf, ours, padded) <= 1e-5


def test_a_fused_qkv_of_other_rows_is_refused_by_name(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write(imported["neox"].hf, "gpt2", folder)
    weights = load_file(folder / "model.safetensors")
    fused = "gpt_neox.layers.1.attention.query_key_value.weight"
    save_file(weights | {fused: weights[fused][:-8]}, folder / "model.safetensors")
    with pytest.raises(HFError, match=re.escape("query_key_value.weight has shape (88, 32), not 96 rows")):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wrong").exists()


def test_a_parallel_blocks_residual_dropout_is_said_to_be_drawn_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    write(T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**NEOX, hidden_dropout=0.1)), "gpt2", tmp_path / "hf")
    with pytest.warns(HFWarning, match="hidden_dropout 0.1: tfcompile drops out a parallel block's"):
        result = import_folder(tmp_path / "hf", "drop", tmp_path / "specs", tmp_path / "runs")
    assert (result.spec.model.dropout.residual, result.spec.model.dropout.embedding) == (0.1, 0.1)


@pytest.mark.parametrize(
    ("head_dim", "rotary"), [(h, r) for h in (44, 47, 49, 64, 80, 96) for r in (2, 6, 30)]
)
def test_the_written_rotary_pct_is_read_back_as_the_same_dimensions(head_dim: int, rotary: int) -> None:
    """transformers computes int(head_dim x rotary_pct): 30 / 44 x 44 rounds down to 29."""
    assert int(head_dim * rotary_fraction(rotary, head_dim)) == rotary


@pytest.mark.parametrize("name", ["phi", "gptj"])
def test_phi_and_gpt_j_are_written_by_no_architecture(imported: dict[str, Imported], name: str) -> None:
    """Their blocks are GPT-NeoX's candidate, which has no shared norm and no LM head bias."""
    with pytest.raises(HFError) as error:
        architecture_for(imported[name].spec, "run")
    named = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert named == ["model.block.shared_norm", "model.bias.lm_head"], str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["neox", "neox_sequential_tied", "phi_qk_norm_gqa_tied", "gptj"])
def test_tfcompile_generate_gives_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts of different lengths, one left-padded batch in the bundle (ONNX, KV cache),
    each as transformers generates it alone."""
    imported[name].assert_generates_as_transformers(tmp_path, capsys)


# ------------------------------------------------------------ tfcompile's own runs as GPT-NeoX

ROPE = "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 16"
# Hand-written specs with RoPE -> the model_type of the one architecture whose candidate each is
# (decided by the embedding scale, then the norms and blocks), and the fields its refusal names.
NATIVE: dict[str, tuple[str, str, list[str]]] = {
    "layernorm": (f"{ROPE}, positional: rope", "gpt_neox", []),
    "parallel rmsnorm": (
        f"{ROPE}, positional: rope, block: parallel, norm: {{type: rmsnorm}}",
        "gpt_neox",
        ["model.norm.type"],
    ),
    "rmsnorm": (f"{ROPE}, positional: rope, norm: {{type: rmsnorm}}, activation: swiglu", "llama", []),
    "rmsnorm scaled": (
        f"{ROPE}, positional: rope, norm: {{type: rmsnorm}}, activation: geglu_tanh, scale_embeddings: true, "
        f"bias: {{qkv: false, attn_out: false, ffn: false}}",
        "gemma",
        [],
    ),
    "layernorm scaled": (
        f"{ROPE}, positional: rope, scale_embeddings: true",
        "gemma",
        ["model.activation", "model.norm.type", "model.norm.bias", "model.bias.ffn"],
    ),
    "shared norm": (
        f"{ROPE}, positional: rope, block: {{type: parallel, shared_norm: true}}, bias: {{lm_head: true}}",
        "gpt_neox",
        ["model.block.shared_norm", "model.bias.lm_head"],
    ),
    "post-norm gqa qk_norm": (
        f"{ROPE}, positional: rope, norm: {{position: post}}, n_kv_heads: 2, qk_norm: true, "
        "activation: swiglu",
        "starcoder2",
        ["model.activation", "model.norm.position", "model.norm.final", "model.qk_norm"],
    ),
    "parallel learned": (f"{ROPE}, block: parallel", "gpt2", ["model.block"]),
}


@pytest.mark.parametrize("name", list(NATIVE))
def test_exactly_one_architecture_writes_each_spec(name: str) -> None:
    model, model_type, refused = NATIVE[name]
    spec = parse_spec(f"model: {{{model}}}\n")
    candidates = exporter.candidates(spec)
    assert candidates == [ARCHITECTURES[model_type]]
    if not refused:
        assert architecture_for(spec, "run") is candidates[0]
        return
    with pytest.raises(HFError) as error:
        architecture_for(spec, "run")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == refused, str(error.value)


# tfcompile's own runs written as GPT-NeoX: interleaved pairs (partial or whole heads) permuted to
# transformers' halves, biases GPT-NeoX has and the run does not as zeros, a scaled output folded.
WRITTEN = {
    "interleaved partial, no biases": f"{ROPE}, positional: {{type: rope, rotary_dims: 4}}, "
    "block: parallel, bias: {qkv: false, attn_out: false, ffn: false}, norm: {bias: false}, activation: relu",
    "interleaved whole, qkv bias, dynamic": f"{ROPE}, positional: {{type: rope, theta: 500, scaling: "
    "{type: dynamic, factor: 2, original_max_position_embeddings: 16}}, bias: {qkv: true, attn_out: false}, "
    "tie_embeddings: false, scale_output: true",
    "halves, yarn, odd width": "family: decoder, vocab_size: 64, d_model: 44, n_layers: 1, n_heads: 1, "
    "max_seq_len: 16, positional: {type: rope, layout: halves, rotary_dims: 30, scaling: {type: yarn, "
    "factor: 2, original_max_position_embeddings: 8}}, block: parallel, activation: silu",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_run_with_layernorm_or_parallel_blocks_and_rope_is_written_as_gpt_neox(
    tmp_path: Path, kind: str
) -> None:
    run = random_run(tmp_path, f"model: {{{WRITTEN[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "GPTNeoXForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_gpt_neox_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    message = _problems(
        tmp_path,
        f"{ROPE}, positional: {{type: rope, scaling: {{type: dynamic, factor: 2, "
        "original_max_position_embeddings: 8}}, block: {type: parallel, shared_norm: true}, "
        "activation: geglu, norm: {final: false}, head_dim: 4, attention_scale: 0.25",
    )
    for field in (
        "model.activation: 'geglu' has no GPT-NeoX equivalent",
        "model.norm.final: False has no GPT-NeoX equivalent",
        "model.block.shared_norm: True has no GPT-NeoX equivalent",
        "model.positional.scaling.original_max_position_embeddings: 8 has no GPT-NeoX equivalent",
        "model.head_dim: 4 has no GPT-NeoX equivalent",
        "model.attention_scale: 0.25 has no GPT-NeoX equivalent",
    ):
        assert field in message, field


# ------------------------------------------------------------------ every config field, by value


def rope(**fields: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": 10000.0, **fields}}


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)

CASES: list[Case] = [
    # ------------------------------------------------------------------------- GPT-NeoX
    case(  # the fields that take any value at once: each row below sets one
        "gpt_neox",
        use_parallel_residual=False,
        attention_bias=False,
        tie_word_embeddings=True,
        hidden_act="relu",
        layer_norm_eps=1e-3,
        attention_dropout=0.3,
        hidden_dropout=0.2,
        classifier_dropout=0.4,
        initializer_range=0.5,
        is_decoder=True,
        spec={
            "block.type": "sequential",
            "bias.qkv": False,
            "bias.ffn": True,
            "tie_embeddings": True,
            "activation": "relu",
            "dropout.residual": 0.2,
        },
    ),
    case("gpt_neox", use_parallel_residual=True, spec={"block.type": "parallel", "block.shared_norm": False}),
    case("gpt_neox", use_parallel_residual=False, spec={"block.type": "sequential"}, slow=True),
    # transformers 5 refuses a null, 4 reads it as false: the same weights computed two ways
    case("gpt_neox", outcome="use_parallel_residual", json={"use_parallel_residual": None}),
    case("gpt_neox", attention_bias=False, spec={"bias.qkv": False, "bias.attn_out": False}, slow=True),
    case("gpt_neox", tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    case("gpt_neox", hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    case("gpt_neox", hidden_act="silu", spec={"activation": "silu"}, slow=True),
    case("gpt_neox", outcome="hidden_act", hidden_act="quick_gelu"),
    case("gpt_neox", layer_norm_eps=1e-3, slow=True),
    case("gpt_neox", attention_dropout=0.3, hidden_dropout=0.2, slow=True),  # training only
    case("gpt_neox", classifier_dropout=0.4, slow=True),  # GPTNeoXForSequenceClassification's
    case("gpt_neox", initializer_range=0.5, slow=True),
    case("gpt_neox", is_decoder=True, slow=True),  # causal either way
    case("gpt_neox", use_cache=False, slow=True),
    case("gpt_neox", slow=True, **IDS),
    case("gpt_neox", pad_token_id=None, slow=True),
    case("gpt_neox", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("gpt_neox", num_hidden_layers=1, slow=True),
    case("gpt_neox", num_attention_heads=1, spec={"positional.rotary_dims": 8}, slow=True),
    # RoPE: the rotated fraction and theta in rope_parameters (transformers 5), or rotary_pct and
    # rotary_emb_base (4's, which 5 reads where the dict has neither)
    case("gpt_neox", **rope(partial_rotary_factor=0.5), spec={"positional.rotary_dims": 4}),
    case("gpt_neox", **rope(partial_rotary_factor=1.0), spec={"positional.rotary_dims": 8}, slow=True),
    case(
        "gpt_neox",
        json={"rope_parameters": DELETE, "rotary_pct": 0.5, "rotary_emb_base": 500},
        spec={"positional.rotary_dims": 4, "positional.theta": 500.0},
    ),
    case("gpt_neox", json={"rope_parameters": DELETE}, spec={"positional.rotary_dims": 2}, slow=True),
    case(  # the dict's, over rotary_pct and rotary_emb_base
        "gpt_neox",
        json={"rotary_pct": 1.0, "rotary_emb_base": 7},
        spec={"positional.rotary_dims": 2, "positional.theta": 10000.0},
        slow=True,
    ),
    case(  # the top-level rope_theta and partial_rotary_factor are not GPT-NeoX's (transformers 4
        # overwrites them with rotary_emb_base and rotary_pct)
        "gpt_neox",
        json={"rope_parameters": DELETE, "rope_theta": 7, "partial_rotary_factor": 1.0},
        spec={"positional.rotary_dims": 2, "positional.theta": 10000.0},
        slow=True,
    ),
    # 3 of 8 dimensions: transformers' frequencies of an odd width are not RoPE's of any even one
    case("gpt_neox", outcome="rope_parameters.partial_rotary_factor", **rope(partial_rotary_factor=0.375)),
    case(
        "gpt_neox",
        outcome="rotary_pct",
        json={"rope_parameters": DELETE, "rotary_pct": 0.1},  # no dimension rotates
        slow=True,
    ),
    case("gpt_neox", outcome="rotary_pct", json={"rope_parameters": DELETE, "rotary_pct": 1.5}, slow=True),
    # a head_dim of its own sets RoPE's width alone (the attention's heads are hidden_size / heads)
    case("gpt_neox", json={"head_dim": 16}, spec={"head_dim": 8, "positional.rotary_dims": 4}, slow=True),
    case("gpt_neox", outcome="rope_parameters.partial_rotary_factor", json={"head_dim": 64}, slow=True),
    case("gpt_neox", **rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5), slow=True),
    case("gpt_neox", **rope(rope_type="dynamic", factor=2.0, partial_rotary_factor=0.5)),
    case("gpt_neox", **rope(**YARN, partial_rotary_factor=0.75), slow=True),
    case(
        "gpt_neox", **rope(**LLAMA3, original_max_position_embeddings=8, partial_rotary_factor=0.5), slow=True
    ),
    case("gpt_neox", **rope(**longrope(), partial_rotary_factor=1.0), slow=True),
    case("gpt_neox", **rope(**longrope(2), partial_rotary_factor=0.5), slow=True),
    case(  # transformers 4's legacy dict, over rope_parameters, theta and fraction from the top level
        "gpt_neox",
        json={
            "rope_scaling": {"type": "linear", "factor": 3.0},
            "rotary_pct": 0.5,
            "rotary_emb_base": 33,
            "rope_parameters": {"rope_type": "default", "rope_theta": 9.0, "partial_rotary_factor": 1.0},
        },
        spec={"positional.theta": 33.0, "positional.rotary_dims": 4, "positional.scaling.factor": 3.0},
        slow=True,
    ),
]


def phi(**fields: Any) -> Case:
    """A Phi row: import only, so a spec it imports to is refused by export-hf."""
    return case("phi", exported=False, **fields)


CASES += [
    # ------------------------------------------------------------------------------ Phi
    phi(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        qk_layernorm=True,
        tie_word_embeddings=True,
        hidden_act="relu",
        layer_norm_eps=1e-3,
        resid_pdrop=0.3,
        embd_pdrop=0.2,
        attention_dropout=0.1,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "qk_norm": True,
            "tie_embeddings": True,
            "activation": "relu",
            "dropout.embedding": 0.2,
            "dropout.residual": 0.3,
        },
    ),
    phi(qk_layernorm=True, spec={"qk_norm": True}, slow=True),
    phi(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    phi(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),
    phi(outcome="num_key_value_heads", num_key_value_heads=3, slow=True),
    phi(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    phi(hidden_act="gelu", spec={"activation": "gelu"}, slow=True),
    phi(outcome="hidden_act", hidden_act="quick_gelu"),
    phi(layer_norm_eps=1e-3, slow=True),
    phi(resid_pdrop=0.3, embd_pdrop=0.2, attention_dropout=0.1, slow=True),
    phi(initializer_range=0.5, slow=True),
    phi(use_cache=False, slow=True),
    phi(pad_token_id=3, bos_token_id=5, eos_token_id=6, slow=True),
    phi(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    phi(num_hidden_layers=1, slow=True),
    # heads of their own width: the q and k LayerNorms are hidden_size / heads wide, so refused with them
    phi(head_dim=16, spec={"head_dim": 16, "positional.rotary_dims": 8}, slow=True),
    phi(outcome="qk_layernorm", qk_layernorm=True, head_dim=16, slow=True),
    # RoPE: the fraction rotated (PhiConfig's 0.5 where none is named), theta, scaling
    phi(json={"rope_parameters": DELETE}, spec={"positional.rotary_dims": 4}, slow=True),
    phi(  # transformers 4's keys at the top level
        json={"rope_parameters": DELETE, "partial_rotary_factor": 0.75, "rope_theta": 77.0},
        spec={"positional.rotary_dims": 6, "positional.theta": 77.0},
    ),
    phi(
        **rope(partial_rotary_factor=1.0),
        spec={"positional.rotary_dims": 8},
        slow=True,
    ),
    phi(outcome="rope_parameters.partial_rotary_factor", **rope(partial_rotary_factor=0.375)),
    phi(outcome="rope_parameters.partial_rotary_factor", **rope(partial_rotary_factor=0.1), slow=True),
    phi(
        **rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5),
        slow=True,
    ),
    phi(**rope(rope_type="dynamic", factor=2.0, partial_rotary_factor=0.5)),
    phi(**rope(**YARN, partial_rotary_factor=0.75), slow=True),
    phi(json=rope(**longrope(2), partial_rotary_factor=0.5), slow=True),
    phi(
        json={
            "rope_parameters": DELETE,
            "rope_scaling": {"type": "linear", "factor": 3.0},
            "rope_theta": 33.0,
        },
        spec={"positional.theta": 33.0, "positional.rotary_dims": 4, "positional.scaling.factor": 3.0},
        slow=True,
    ),
]


def gptj(**fields: Any) -> Case:
    """A GPT-J row: import only, so a spec it imports to is refused by export-hf."""
    return case("gptj", exported=False, **fields)


CASES += [
    # ---------------------------------------------------------------------------- GPT-J
    gptj(  # the fields that take any value at once: each row below sets one
        rotary_dim=8,
        n_inner=40,
        activation_function="relu",
        layer_norm_epsilon=1e-3,
        tie_word_embeddings=True,
        resid_pdrop=0.3,
        embd_pdrop=0.2,
        attn_pdrop=0.1,
        initializer_range=0.5,
        spec={
            "positional.rotary_dims": 8,
            "d_ff": 40,
            "activation": "relu",
            "tie_embeddings": True,
            "dropout.residual": 0.3,
        },
    ),
    gptj(rotary_dim=8, spec={"positional.rotary_dims": 8}, slow=True),  # the whole head
    gptj(rotary_dim=2, spec={"positional.rotary_dims": 2}, slow=True),
    gptj(outcome="rotary_dim", json={"rotary_dim": 3}),  # transformers fails on an odd width
    gptj(outcome="rotary_dim", json={"rotary_dim": 16}, slow=True),  # more than a head
    gptj(outcome="rotary_dim", json={"rotary_dim": 0}, slow=True),  # none
    gptj(outcome="rotary_dim", json={"rotary_dim": None}, slow=True),  # transformers 5 refuses it
    gptj(n_head=1, rotary_dim=32, spec={"positional.rotary_dims": 32}, slow=True),
    gptj(n_inner=40, spec={"d_ff": 40}, slow=True),
    gptj(n_inner=None, spec={"d_ff": 128}, slow=True),
    gptj(activation_function="gelu", spec={"activation": "gelu"}, slow=True),
    gptj(activation_function="relu", spec={"activation": "relu"}, slow=True),
    gptj(outcome="activation_function", activation_function="quick_gelu"),
    gptj(layer_norm_epsilon=1e-3, slow=True),
    gptj(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    gptj(resid_pdrop=0.3, embd_pdrop=0.2, attn_pdrop=0.1, slow=True),  # training only
    gptj(initializer_range=0.5, slow=True),
    gptj(use_cache=False, slow=True),
    gptj(pad_token_id=3, bos_token_id=5, eos_token_id=6, slow=True),
    gptj(n_positions=8, spec={"max_seq_len": 8}, slow=True),
    gptj(n_layer=1, slow=True),
    gptj(outcome="sliding_window", json={"sliding_window": 4}, slow=True),  # unread, slid by the cache
    gptj(vocab_size=VOCAB, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # a parallel block's dropout: said, tested apart
        check(c, tmp_path)


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi", "gptj"])
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to one of the config classes fails this until a row of CASES says
    what it does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES[model_type].base)
    covered |= set().union(*(c.fields() for c in CASES if c.family == model_type))
    assert _class_fields(model_type) - covered == set()


ACTIVATION_FIELDS = {"gpt_neox": "hidden_act", "phi": "hidden_act", "gptj": "activation_function"}
EXPORTED = {"gpt_neox"}  # the families export-hf writes back


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
        check(case(family, exported=family in EXPORTED, **{field: value}), tmp_path)
    except HFError as error:  # refused by the import, which check does not expect of a SAME row
        assert f"  {field}: " in str(error)
