"""GPT-Neo (``GPTNeoForCausalLM``): tiny random transformers models saved with save_pretrained,
imported, and held to transformers' logits (float32, rows padded on the right and not, sequences
past the local layers' window), its parameter counts and greedy generation past the window; its
local layers' mask as the spec's window; export-hf writing an import back as GPT-Neo (as GPT-2
where no layer slides within its context), tfcompile's own windowed runs of learned positions too,
or refusing them by field; and a row for every field of GPTNeoConfig (tests/test_hf_fields.py's
table and check)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants, write
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
)

from tfcompile.hf import exporter
from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec import parse_spec
from tfcompile.spec.schema import SlidingWindow
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does
# (GPTNeoConfig's own ids, 50256, lie past the tiny vocabulary).
TOKENS = dict(bos_token_id=0, eos_token_id=0)
# Global and local layers in turn, as GPT-Neo's; a window of 6 of 32 positions, which the 20
# compared (tests/test_hf_fields.py) pass.
GPT_NEO = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    max_position_embeddings=32,
    attention_types=[[["global", "local"], 1]],
    window_size=6,
)
FAMILIES["gpt_neo"] = Family(T.GPTNeoConfig, T.GPTNeoForCausalLM, "gpt2", GPT_NEO | TOKENS)


def gpt_neo(**fields: Any) -> Any:
    return T.GPTNeoForCausalLM(T.GPTNeoConfig(**GPT_NEO | TOKENS | fields))


# name -> (the model, the head class export-hf writes its import as; None: refused at model.window)
VARIANTS: dict[str, tuple[Callable[[], Any], str]] = {
    # GPT-Neo's shape: global and local in turn, here a window of 4, tied, gelu_new
    "gpt_neo": (lambda: gpt_neo(window_size=4), "GPTNeoForCausalLM"),
    # every layer local, an untied head, ReLU, a feed-forward of its own width
    "gpt_neo_local_untied_relu": (
        lambda: gpt_neo(
            attention_types=[[["local"], 2]],
            tie_word_embeddings=False,
            activation_function="relu",
            intermediate_size=40,
            layer_norm_epsilon=1e-3,
        ),
        "GPTNeoForCausalLM",
    ),
    # no local layer: GPT-2's blocks with q.k unscaled, written as GPT-2
    "gpt_neo_global": (lambda: gpt_neo(attention_types=[[["global"], 2]]), "GPT2LMHeadModel"),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    builders = {name: build for name, (build, _) in VARIANTS.items()}
    return imported_variants(tmp_path_factory.mktemp("hf"), builders)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()  # 12 positions: past each window


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def model(name: str) -> Any:
        return imported[name].spec.model

    neo, local, plain = model("gpt_neo"), model("gpt_neo_local_untied_relu"), model("gpt_neo_global")
    assert (neo.positional.type, neo.norm.position, neo.norm.type, neo.norm.final) == (
        "learned",
        "pre",
        "layernorm",
        True,
    )
    assert (neo.attention_scale, neo.activation, neo.d_ff, neo.tie_embeddings) == (
        1.0,
        "gelu_tanh",
        128,
        True,
    )
    assert (neo.bias.qkv, neo.bias.attn_out, neo.bias.ffn, neo.bias.lm_head) == (False, True, True, False)
    assert (neo.max_seq_len, neo.window) == (32, SlidingWindow(size=4, layers=[1]))
    assert local.window == SlidingWindow(size=6)  # every layer
    assert (local.tie_embeddings, local.activation, local.d_ff, local.norm.eps) == (False, "relu", 40, 1e-3)
    assert (plain.window, plain.attention_scale) == (None, 1.0)


def test_a_local_layer_attends_to_the_window_as_transformers_mask_says(imported: dict[str, Imported]) -> None:
    """transformers' local mask (tril xor tril(-window_size)): a query sees itself and the
    window_size - 1 positions before it, as the spec's window; a global layer's mask is causal."""
    attention = imported["gpt_neo"].hf.transformer.h
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    assert torch.equal(attention[1].attn.attention.bias[0, 0, :12, :12], (j <= i) & (i - j < 4))
    assert torch.equal(attention[0].attn.attention.bias[0, 0, :12, :12], j <= i)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_as_gpt_neo_or_without_a_window_as_gpt2(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant, written = imported[name], VARIANTS[name][1]
    if written == "GPT2LMHeadModel":
        with pytest.warns(HFWarning, match="scale_attn_weights is false"):  # transformers 4's SDPA scales
            assert export_hf(variant.result.run_dir, tmp_path / "out") == written
        config = json.loads((tmp_path / "out" / "config.json").read_text())
        assert config["scale_attn_weights"] is False
    else:
        assert export_hf(variant.result.run_dir, tmp_path / "out") == written
        again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
        assert again.spec.model == variant.spec.model
    _loads_alike(tmp_path / "out", variant.model)


MODEL = "family: decoder, vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 24"
# tfcompile's own windowed runs of learned positions: local layers as the window's, biases GPT-Neo
# has and the run does not (LayerNorm shifts included) as zeros.
WRITTEN = {
    "some layers local, no biases, untied": f"{MODEL}, n_layers: 3, attention_scale: 1, "
    "window: {size: 4, layers: [0, 2]}, norm: {bias: false}, tie_embeddings: false, "
    "bias: {qkv: false, attn_out: false, ffn: false}",
    "every layer local, ffn and output biases, relu": f"{MODEL}, n_layers: 2, attention_scale: 1, "
    "window: {size: 5}, activation: relu, bias: {qkv: false}",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_windowed_run_of_learned_positions_is_written_as_gpt_neo(kind: str, tmp_path: Path) -> None:
    text = f"model: {{{WRITTEN[kind]}}}\n"
    assert exporter.candidates(parse_spec(text)) == [ARCHITECTURES["gpt_neo"]]
    run = random_run(tmp_path, text)
    assert export_hf(run, tmp_path / "out") == "GPTNeoForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_gpt_neo_cannot_compute_is_refused_by_field(tmp_path: Path) -> None:
    """q.k scaled, q/k/v biases, grouped K/V heads, a gated activation: none is GPT-Neo's."""
    model = (
        f"{MODEL}, n_layers: 2, n_kv_heads: 2, window: {{size: 4, layers: [1]}}, activation: swiglu, "
        "bias: {qkv: true}"
    )
    assert exporter.candidates(parse_spec(f"model: {{{model}}}\n")) == [ARCHITECTURES["gpt_neo"]]
    message = _problems(tmp_path, model)
    assert re.findall(r"^  (\S+): ", message, re.MULTILINE) == [
        "model.activation",
        "model.n_kv_heads",
        "model.bias.qkv",
        "model.attention_scale",
    ], message
    assert "has no GPT-Neo equivalent" in message


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_runtime_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    """Exported to ONNX with parity, then greedy decoding with the KV cache in onnxruntime against
    transformers' generate: 20 tokens after 5, past the windows of 4 and 6."""
    imported[name].assert_runtime_generates_as_transformers(tmp_path, 20)


@pytest.mark.slow
def test_tfcompile_generate_gives_transformers_greedy_tokens(
    imported: dict[str, Imported], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts of different lengths, one left-padded batch in the bundle (ONNX, KV cache),
    each as transformers generates it alone, past the window of 4."""
    imported["gpt_neo"].assert_generates_as_transformers(tmp_path, capsys, new_tokens=8)


def test_the_mask_buffers_of_older_checkpoints_are_not_weights(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """EleutherAI's checkpoints hold each layer's mask (attn.attention.bias, masked_bias)."""
    folder = tmp_path / "src"
    write(imported["gpt_neo"].hf, "gpt2", folder)
    weights = load_file(folder / "model.safetensors")
    hf = imported["gpt_neo"].hf.transformer.h
    for i, block in enumerate(hf):
        weights[f"transformer.h.{i}.attn.attention.bias"] = block.attn.attention.bias.clone()
        weights[f"transformer.h.{i}.attn.attention.masked_bias"] = torch.tensor(-1e9)
    save_file(weights, folder / "model.safetensors")
    result = import_folder(folder, "buffers", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model == imported["gpt_neo"].spec.model


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["gpt_neo"], "GPTNeoForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A case on the tiny GPT-Neo (written back as GPT-Neo, or as GPT-2 where none of its layers
    slides within the context)."""
    return case("gpt_neo", **fields)


GLOBAL = [[["global"], 2]]
NO_WINDOW = {"window": None}


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        intermediate_size=40,
        activation_function="relu",
        layer_norm_epsilon=1e-3,
        tie_word_embeddings=False,
        embed_dropout=0.1,
        attention_dropout=0.2,
        resid_dropout=0.3,
        classifier_dropout=0.4,
        initializer_range=0.5,
        spec={
            "d_ff": 40,
            "activation": "relu",
            "norm.eps": 1e-3,
            "tie_embeddings": False,
            "dropout.embedding": 0.1,
            "dropout.attention": 0.2,
            "dropout.residual": 0.3,
            "window.size": 6,
            "window.layers": [1],
        },
    ),
    row(intermediate_size=None, spec={"d_ff": 128}, slow=True),
    row(activation_function="gelu", spec={"activation": "gelu"}, slow=True),
    row(activation_function="silu", spec={"activation": "silu"}, slow=True),
    row(activation_function="gelu_pytorch_tanh", spec={"activation": "gelu_tanh"}, slow=True),
    row(outcome="activation_function", activation_function="quick_gelu"),
    row(layer_norm_epsilon=1e-3, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(embed_dropout=0.1, attention_dropout=0.2, resid_dropout=0.3, slow=True),  # training only
    row(classifier_dropout=0.4, slow=True),  # a classifier head's, which tfcompile does not import
    row(initializer_range=0.5, slow=True),
    row(initializer_range=0.0, slow=True),  # initialisation only: never read by an import
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8, "window.size": 6}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(num_heads=2, spec={"n_heads": 2}, slow=True),
    row(num_heads=1, slow=True),  # one head of 32, q.k unscaled
    # which layers are local: attention_types expanded, item by item
    row(attention_types=[[["local"], 2]], spec={"window.size": 6, "window.layers": None}),
    row(attention_types=GLOBAL, spec=NO_WINDOW),  # written as GPT-2
    row(attention_types=[[["local", "global"], 1]], spec={"window.layers": [0]}, slow=True),
    row(attention_types=[[["global"], 1], [["local"], 1]], spec={"window.layers": [1]}, slow=True),
    row(num_layers=4, attention_types=[[["global", "local"], 2]], spec={"window.layers": [1, 3]}, slow=True),
    row(num_layers=1, attention_types=[[["local"], 1]], spec={"window.layers": None}, slow=True),
    row(outcome="attention_types", json={"attention_types": "global"}),  # transformers refuses it
    row(outcome="attention_types", json={"attention_types": [[["global"], 2.5]]}, slow=True),
    # attention_layers, which save_pretrained writes, over attention_types: transformers sets it
    # over the types' expansion (these types it only expands, never builds)
    row(json={"attention_types": [[["global", "sparse"], 1]]}, spec={"window.layers": [1]}),
    row(json={"attention_types": [[["global", "local"], 3]]}, spec={"window.layers": [1]}, slow=True),
    row(json={"attention_types": None}, spec={"window.layers": [1]}, slow=True),  # GPTNeoConfig's 24
    row(json={"attention_layers": ["local", "local"]}, spec={"window.layers": None}, slow=True),
    row(json={"attention_layers": ["local", "global"]}, spec={"window.layers": [0]}, slow=True),
    row(json={"attention_layers": DELETE}, spec={"window.layers": [1]}, slow=True),
    row(json={"attention_layers": ["global", "global"]}, spec=NO_WINDOW, slow=True),
    row(outcome="attention_layers", json={"attention_layers": ["global", "sparse"]}),
    row(outcome="attention_layers", json={"attention_layers": ["local"]}, slow=True),
    row(outcome="attention_layers", json={"attention_layers": "gl"}, slow=True),
    # ... and where config.json has none, the types: another kind, another count of layers
    row(
        outcome="attention_types",
        json={"attention_types": [[["global", "sparse"], 1]], "attention_layers": DELETE},
        slow=True,
    ),
    row(
        outcome="attention_types",
        json={"attention_types": [[["global", "local"], 2]], "attention_layers": DELETE},
    ),
    row(outcome="attention_types", json={"attention_types": None, "attention_layers": DELETE}, slow=True),
    # the local layers' window: tril(-window_size) holds window_size positions, the query's own
    # included; one of the whole context or more is none; 0 or less masks every key
    row(window_size=4, spec={"window.size": 4}, slow=True),
    row(window_size=1, spec={"window.size": 1}, slow=True),  # the query's own position alone
    row(window_size=31, spec={"window.size": 31}, length=32, slow=True),
    row(window_size=32, spec=NO_WINDOW, slow=True),
    row(window_size=40, spec=NO_WINDOW, slow=True),
    row(json={"window_size": DELETE}, spec=NO_WINDOW, slow=True),  # GPTNeoConfig's 256
    row(outcome="window_size", window_size=0),  # transformers computes even attention over every key
    row(outcome="window_size", window_size=-2, slow=True),
    row(attention_types=GLOBAL, window_size=0, spec=NO_WINDOW, slow=True),  # unread
    row(outcome="window_size", json={"window_size": 2.5}, slow=True),  # transformers 5 refuses it
    # the published configs' fields no transformers' GPT-Neo reads (GPT-2's summary head's)
    row(
        json={"summary_type": "cls_index", "summary_first_dropout": 0.1, "gradient_checkpointing": False},
        slow=True,
    ),
    row(outcome="architectures", json={"architectures": ["GPTNeoForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to GPTNeoConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES["gpt_neo"].base)
    covered |= set().union(*(c.fields() for c in CASES))
    assert _class_fields("gpt_neo") - covered == set()


def _activation_cases() -> list[Any]:
    from transformers.activations import ACT2CLS

    return [pytest.param(act, id=act, marks=pytest.mark.slow) for act in sorted(ACT2CLS)]


@pytest.mark.parametrize("value", _activation_cases())
def test_every_activation_name_is_computed_alike_or_refused_by_name(value: str, tmp_path: Path) -> None:
    try:
        FAMILIES["gpt_neo"].config(**(FAMILIES["gpt_neo"].base | {"activation_function": value}))
    except Exception:  # transformers refuses it itself
        pytest.skip(f"transformers builds no model with activation_function={value}")
    try:
        check(row(activation_function=value), tmp_path)
    except HFError as error:  # refused by the import, which check does not expect of a SAME row
        assert "  activation_function: " in str(error)
