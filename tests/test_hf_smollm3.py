"""SmolLM3 (``SmolLM3ForCausalLM``): LLaMA's blocks with some layers turning no RoPE
(``no_rope_layers``' 0s, or every ``no_rope_layer_interval``-th layer, as ``positional.nope_layers``)
and, with ``use_sliding_window``, a window over those layers (or ``layer_types``' sliding ones).
Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), their parameter counts and greedy generation
through the ONNX bundle; written back by export-hf (tfcompile's own runs of its blocks too, or
refused by field); a row for every field of SmolLM3Config (tests/test_hf_fields.py's table and
check)."""

from __future__ import annotations

import json
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
SMOLLM3 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    no_rope_layer_interval=2,  # layers 1 and 3 turn no RoPE
)
FAMILIES["smollm3"] = Family(T.SmolLM3Config, T.SmolLM3ForCausalLM, "gpt2", SMOLLM3 | TOKENS)


def smollm3(**fields: Any) -> Any:
    return T.SmolLM3ForCausalLM(T.SmolLM3Config(**SMOLLM3 | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # every second layer NoPE, tied (SmolLM3-3B's every fourth, shrunk)
    "smollm3": lambda: smollm3(),
    # NoPE layers sliding over 5 positions, attention biases, an untied head
    "smollm3_window": lambda: smollm3(
        use_sliding_window=True, sliding_window=5, attention_bias=True, tie_word_embeddings=False
    ),
    # a list of its own, feed-forward biases, a RoPE theta of its own
    "smollm3_list": lambda: smollm3(
        no_rope_layers=[0, 1, 1, 0],
        mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
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
    plain, window = imported["smollm3"].spec.model, imported["smollm3_window"].spec.model
    listed = imported["smollm3_list"].spec.model
    assert (plain.positional.nope_layers, plain.window, plain.tie_embeddings) == ([1, 3], None, True)
    assert (plain.norm.type, plain.positional.layout, plain.activation) == ("rmsnorm", "halves", "swiglu")
    assert (window.positional.nope_layers, window.window.size, window.window.layers) == ([1, 3], 5, [1, 3])
    assert (window.bias.qkv, window.bias.attn_out, window.tie_embeddings) == (True, True, False)
    assert (listed.positional.nope_layers, listed.bias.ffn, listed.positional.theta) == ([0, 3], True, 5e6)


def test_the_nope_layers_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """Turning RoPE in the NoPE layers too changes the logits: without them the import would differ."""
    model = imported["smollm3"].model
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        model.positional.nope_layers = frozenset()
        rotated = model(ids)
        model.positional.nope_layers = frozenset({1, 3})
    assert (expected - rotated).abs().max() > 1e-3


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "SmolLM3ForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["smollm3"], "SmolLM3ForSequenceClassification", tmp_path)


# ----------------------------------------------------------- tfcompile's own runs written as SmolLM3

BASE = "family: decoder, vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 16, n_layers: 3"
LLAMA = f"{BASE}, norm: {{type: rmsnorm}}, activation: swiglu"
# Runs with NoPE layers: interleaved RoPE (permuted to transformers' halves) or halves, grouped K/V
# heads, a window on any layers (SmolLM3's layer_types), biases as zeros where the run has some.
WRITTEN = {
    "interleaved, grouped, a window on a RoPE layer": f"{LLAMA}, n_kv_heads: 2, "
    "positional: {type: rope, nope_layers: [1]}, window: {size: 4, layers: [0, 1]}, "
    "bias: {qkv: true, attn_out: false, ffn: false}",
    "halves, one K/V head, untied, no biases": f"{LLAMA}, n_kv_heads: 1, "
    "positional: {type: rope, layout: halves, nope_layers: [0, 2]}, tie_embeddings: false, "
    "bias: {qkv: false, attn_out: false, ffn: false}",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_run_with_nope_layers_is_written_as_smollm3(kind: str, tmp_path: Path) -> None:
    text = f"model: {{{WRITTEN[kind]}}}\n"
    assert exporter.candidates(parse_spec(text)) == [ARCHITECTURES["smollm3"]]
    run = random_run(tmp_path, text)
    assert export_hf(run, tmp_path / "out") == "SmolLM3ForCausalLM"
    # A run without a tokenizer has no special tokens: null ids, not SmolLM3Config's (its pad id,
    # 128004, past the vocabulary, would fail transformers' embedding).
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert [config[f"{role}_token_id"] for role in ("bos", "eos", "pad")] == [None] * 3
    hf = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    for padded in (False, True):
        assert max_difference(hf, load_trained_model(run)[1], padded, length=16) <= 1e-5


def test_what_smollm3_cannot_compute_is_refused_by_field(tmp_path: Path) -> None:
    model = f"{BASE}, norm: {{type: rmsnorm}}, positional: {{type: rope, nope_layers: [1]}}, qk_norm: true"
    run = random_run(tmp_path, f"model: {{{model}, activation: swiglu}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == ["model.qk_norm"]
    assert "SmolLM3" in str(error.value)
    assert not (tmp_path / "out").exists()
    # a plain feed-forward is Arcee's, which turns RoPE in every layer
    run = random_run(tmp_path / "plain", f"model: {{{model}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "plain" / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == [
        "model.qk_norm",
        "model.positional.nope_layers",
    ]
    assert "Arcee" in str(error.value)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("smollm3", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        no_rope_layers=[1, 0, 0, 1],
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "bias.ffn": True,
            "tie_embeddings": False,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "positional.nope_layers": [1, 2],
        },
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),
    row(json={"num_key_value_heads": DELETE}, num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(rms_norm_eps=1e-5, spec={"norm.eps": 1e-5}, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    # the NoPE layers: a list, one past the layers (unread), an interval, none
    row(no_rope_layers=[1, 1, 1, 0], spec={"positional.nope_layers": [3]}),
    # transformers 5 refuses a list of other than integers (4 reads true and false as 1 and 0)
    row(outcome="no_rope_layers", json={"no_rope_layers": [True, False, True, True]}, slow=True),
    row(no_rope_layers=[1, 1, 1, 1], spec={"positional.nope_layers": None}, slow=True),
    row(no_rope_layers=[0, 0, 0, 0], spec={"positional.nope_layers": [0, 1, 2, 3]}, slow=True),
    row(json={"no_rope_layers": [1, 0, 1, 0, 0, 0]}, spec={"positional.nope_layers": [1, 3]}, slow=True),
    row(outcome="no_rope_layers", json={"no_rope_layers": [1, 0]}),  # transformers: an IndexError
    row(outcome="no_rope_layers", json={"no_rope_layers": [1, 2, 1, 0]}, slow=True),
    row(outcome="no_rope_layers", json={"no_rope_layers": "every fourth"}, slow=True),
    row(no_rope_layer_interval=4, spec={"positional.nope_layers": [3]}, slow=True),
    row(no_rope_layer_interval=1, spec={"positional.nope_layers": [0, 1, 2, 3]}, slow=True),
    row(
        json={"no_rope_layers": DELETE, "no_rope_layer_interval": 4},
        spec={"positional.nope_layers": [3]},
        slow=True,
    ),
    row(json={"no_rope_layers": None, "no_rope_layer_interval": 2}, spec={"positional.nope_layers": [1, 3]}),
    row(
        outcome="no_rope_layer_interval",
        json={"no_rope_layers": None, "no_rope_layer_interval": 0},
        slow=True,
    ),
    # the window: over the NoPE layers with use_sliding_window, or layer_types' sliding layers
    row(
        use_sliding_window=True,
        sliding_window=6,
        spec={"window.size": 6, "window.layers": [1, 3]},
    ),
    row(use_sliding_window=False, sliding_window=6, spec={"window": None}, slow=True),
    row(use_sliding_window=True, sliding_window=None, spec={"window": None}, slow=True),
    row(use_sliding_window=True, sliding_window=40, spec={"window": None}, slow=True),
    row(
        use_sliding_window=True,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
        spec={"window.layers": [0, 3]},
        slow=True,
    ),
    row(
        use_sliding_window=True,
        sliding_window=6,
        json={"layer_types": DELETE},
        spec={"window.layers": [1, 3]},
        slow=True,
    ),
    # SmolLM3Config's window where the config leaves it out: none (not Qwen2's 4096)
    row(
        use_sliding_window=True,
        max_position_embeddings=8192,
        json={"sliding_window": DELETE, "layer_types": DELETE},
        spec={"window": None},
        length=12,
        slow=True,
    ),
    row(json={"max_window_layers": 1}, slow=True),  # Qwen2's, which SmolLM3 does not read
    row(attention_dropout=0.3, slow=True),
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=2, no_rope_layers=[1, 0], slow=True),
    # more layers than the spec takes: refused by the field, no list of them made first
    row(outcome="num_hidden_layers", json={"num_hidden_layers": 2**40, "no_rope_layers": None}),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 2000000.0}, slow=True),  # the class's
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="architectures", json={"architectures": ["SmolLM3ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to SmolLM3Config fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    assert uncovered("smollm3", CASES) == set()
