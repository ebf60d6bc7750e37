"""EXAONE 4 (``Exaone4ForCausalLM``, EXAONE-4.0-1.2B, 32B): OLMo 2's norms on each sublayer's output
(``norm.position: output``) with each head's q and k normalised (Qwen3's ``qk_norm``), no biases,
sliding the layers ``layer_types`` names (where none, all but every ``sliding_window_pattern``-th,
as Exaone4Config derives them); where a window is set, the full-attention layers turn no RoPE
(``positional.nope_layers``). Tiny random transformers models saved with save_pretrained,
imported, and held to transformers' logits (float32, rows padded on the right and not, past the
window), their parameter counts and greedy generation through the ONNX bundle; export-hf writes
them back as EXAONE 4, and tfcompile's own decoders of output norms and q/k norms too. A row for
every field of Exaone4Config (tests/test_hf_fields.py's table and check)."""

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
    longrope,
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
SLIDING, FULL = "sliding_attention", "full_attention"
EXAONE4 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    sliding_window=5,
)
FAMILIES["exaone4"] = Family(T.Exaone4Config, T.Exaone4ForCausalLM, "gpt2", EXAONE4 | TOKENS)


def exaone4(**fields: Any) -> Any:
    return T.Exaone4ForCausalLM(T.Exaone4Config(**EXAONE4 | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # EXAONE-4.0-32B's shape, shrunk: three sliding layers (RoPE, 5 positions), then a full one
    # (no RoPE), Exaone4Config's derivation; grouped K/V heads, Llama 3's RoPE scaling, untied
    "exaone4": lambda: exaone4(
        rope_parameters={"rope_theta": 1e6, **LLAMA3, "original_max_position_embeddings": 8}
    ),
    # EXAONE-4.0-1.2B's: no window (every layer full, every layer turns RoPE), tied
    "exaone4_global": lambda: exaone4(
        sliding_window=None, layer_types=[FULL] * 4, tie_word_embeddings=True, num_key_value_heads=1
    ),
    # a window of the whole context over every other layer: no window, the full layers NoPE
    "exaone4_unslid": lambda: exaone4(sliding_window=32, layer_types=[SLIDING, FULL] * 2),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    """Past the window: 20 positions over one of 5."""
    imported[name].assert_outputs_match(length=20)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    hybrid, whole = imported["exaone4"].spec.model, imported["exaone4_global"].spec.model
    unslid = imported["exaone4_unslid"].spec.model
    assert (hybrid.norm.position, hybrid.qk_norm, hybrid.qk_norm_over) == ("output", True, "head")
    assert hybrid.window is not None and (hybrid.window.size, hybrid.window.layers) == (5, [0, 1, 2])
    assert hybrid.positional.nope_layers == [3]
    assert hybrid.positional.scaling is not None and hybrid.positional.scaling.type == "llama3"
    assert (whole.window, whole.positional.nope_layers, whole.tie_embeddings) == (None, None, True)
    assert (unslid.window, unslid.positional.nope_layers) == (None, [1, 3])
    assert not (hybrid.bias.qkv or hybrid.bias.attn_out or hybrid.bias.ffn)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], name: str, tmp_path: Path) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "Exaone4ForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)


NO_BIAS = "bias: {qkv: false, attn_out: false, ffn: false}"
OWN = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, "
    "max_seq_len: 16, norm: {type: rmsnorm, position: output}, qk_norm: true, activation: swiglu, "
    f"{NO_BIAS}"
)
# tfcompile's own decoders of output norms and each head's q and k normalised: written as EXAONE 4
NATIVE = {
    "halves, no window": f"{OWN}, positional: {{type: rope, layout: halves}}",
    # interleaved pairs (rows reordered), a window on the layers that turn RoPE
    "interleaved, window": f"{OWN}, positional: {{type: rope, nope_layers: [1]}}, "
    "window: {size: 3, layers: [0, 2]}",
    # NoPE layers without a window: EXAONE's sliding layers over all 16 positions
    "nope, no window": f"{OWN}, positional: {{type: rope, layout: halves, nope_layers: [0, 2]}}",
}


@pytest.mark.parametrize("kind", list(NATIVE))
def test_a_run_of_output_norms_and_qk_norms_is_written_as_exaone4(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{NATIVE[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "Exaone4ForCausalLM"
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        # a full layer that turns RoPE beside a window: EXAONE's full layers turn none
        (f"positional: rope, window: {{size: 3, layers: [0]}}, {NO_BIAS}", ["model.positional.nope_layers"]),
        # a sliding layer that turns no RoPE: EXAONE's sliding layers turn it
        (
            f"positional: {{type: rope, nope_layers: [0]}}, window: {{size: 3}}, {NO_BIAS}",
            ["model.positional.nope_layers"],
        ),
        (
            "positional: rope, bias: {qkv: true, attn_out: true, ffn: true}",
            ["model.bias.qkv", "model.bias.attn_out", "model.bias.ffn"],
        ),
    ],
)
def test_what_exaone4_cannot_express_is_refused_by_field(
    tmp_path: Path, extra: str, fields: list[str]
) -> None:
    run = random_run(
        tmp_path,
        "model: {family: decoder, vocab_size: 64, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 16, "
        f"norm: {{type: rmsnorm, position: output}}, qk_norm: true, activation: swiglu, {extra}}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == fields, str(error.value)
    assert "EXAONE 4" in str(error.value) and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["exaone4"], "Exaone4ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("exaone4", **fields)


THREE = {"window.size": 5, "window.layers": [0, 1, 2], "positional.nope_layers": [3]}
NO_WINDOW = {"window": None, "positional.nope_layers": None}

CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
        }
        | THREE,
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    # left out: Exaone4Config's 32 (not a divisor of 4 heads); null: its attention fails
    row(outcome="num_key_value_heads", json={"num_key_value_heads": DELETE}, slow=True),
    row(outcome="num_key_value_heads", json={"num_key_value_heads": None}, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(rms_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}, slow=True),  # Exaone4Config's
    row(attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8, "window.size": 5}, slow=True),
    row(intermediate_size=40, spec={"d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # heads of their own width (read where config.json names one), or of hidden_size / heads
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    row(outcome="head_dim", json={"head_dim": None}, slow=True),
    row(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    row(num_hidden_layers=2, spec={"window.size": 5, "window.layers": None, "positional.nope_layers": None}),
    # the layers: layer_types' sliding ones, else every sliding_window_pattern-th full
    row(json={"layer_types": DELETE}, spec=THREE),
    row(json={"layer_types": None}, spec=THREE, slow=True),
    row(json={"layer_types": DELETE, "sliding_window_pattern": 2}, spec={"window.layers": [0, 2]}),
    row(
        json={"layer_types": DELETE, "sliding_window_pattern": -2}, spec={"window.layers": [0, 2]}, slow=True
    ),
    row(json={"layer_types": DELETE, "sliding_window_pattern": 1}, spec={"window": None}, slow=True),
    row(outcome="sliding_window_pattern", json={"layer_types": DELETE, "sliding_window_pattern": 0}),
    row(outcome="sliding_window_pattern", json={"layer_types": DELETE, "sliding_window_pattern": "LLLG"}),
    row(
        outcome="sliding_window_pattern",
        json={"layer_types": DELETE, "sliding_window_pattern": None},
        slow=True,
    ),
    # unread beside layer_types (EXAONE-4.0-32B's config.json names both)
    row(sliding_window_pattern="LLLG", layer_types=[SLIDING] * 3 + [FULL], spec=THREE, slow=True),
    row(
        layer_types=[FULL, SLIDING, SLIDING, FULL],
        spec={"window.layers": [1, 2], "positional.nope_layers": [0, 3]},
    ),
    row(layer_types=[SLIDING] * 4, spec={"window.layers": None, "positional.nope_layers": None}, slow=True),
    # a window, but no layer slides: every layer full and NoPE
    row(layer_types=[FULL] * 4, spec={"window": None, "positional.nope_layers": [0, 1, 2, 3]}),
    row(outcome="layer_types", json={"layer_types": [SLIDING, FULL, "chunked_attention", FULL]}),
    row(outcome="layer_types", json={"layer_types": [SLIDING, FULL]}, slow=True),
    row(sliding_window=2, spec={"window.size": 2}, slow=True),
    row(outcome="sliding_window", sliding_window=0, slow=True),
    # left out: Exaone4Config's 4096, past the context (no window), the full layer NoPE
    row(json={"sliding_window": DELETE}, spec={"window": None, "positional.nope_layers": [3]}, slow=True),
    # null: every layer turns RoPE, full (no layer slides without a window)
    row(sliding_window=None, layer_types=[FULL] * 4, spec=NO_WINDOW),
    row(outcome="sliding_window", json={"sliding_window": None, "layer_types": DELETE}),
    row(outcome="sliding_window", json={"sliding_window": None}, slow=True),  # beside sliding layers
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), spec={"positional.scaling.factor": 4.0}),
    row(**rope(**LLAMA3, original_max_position_embeddings=8), slow=True),
    row(**rope(**longrope()), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(outcome="architectures", json={"architectures": ["Exaone4ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Exaone4Config fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("exaone4", CASES) == set()
