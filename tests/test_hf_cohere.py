"""Cohere (``CohereForCausalLM``: Command-R, Aya 23) and Cohere 2 (``Cohere2ForCausalLM``: Command
R7B): one bias-free LayerNorm feeding attention and the feed-forward side by side (``block: {type:
parallel, shared_norm: true}``), RoPE as interleaved pairs, the logits times ``logit_scale``
(``logit_multiplier``); Cohere 2's sliding layers (``layer_types``, or every
``sliding_window_pattern``-th layer full) turn RoPE over a window, its full layers none
(``positional.nope_layers``). Tiny random transformers models saved with save_pretrained, imported,
and held to transformers' logits (float32, rows padded on the right and not, past the window),
their parameter counts and greedy generation through the ONNX bundle; export-hf refuses them by
field (no architecture it writes has such blocks); a row for every field of CohereConfig and
Cohere2Config (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants
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

transformers = pytest.importorskip("transformers")
T = transformers

TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=1)
COHERE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
# Four layers, every second one full (NoPE), the others sliding over 5 positions: fewer than the
# 12 and 20 the comparisons run.
COHERE2 = COHERE | dict(num_hidden_layers=4, sliding_window=5, sliding_window_pattern=2)
FAMILIES["cohere"] = Family(T.CohereConfig, T.CohereForCausalLM, "gpt2", COHERE | TOKENS)
FAMILIES["cohere2"] = Family(T.Cohere2Config, T.Cohere2ForCausalLM, "gpt2", COHERE2 | TOKENS)


def cohere(**fields: Any) -> Any:
    return T.CohereForCausalLM(T.CohereConfig(**COHERE | TOKENS | fields))


def cohere2(**fields: Any) -> Any:
    return T.Cohere2ForCausalLM(T.Cohere2Config(**COHERE2 | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # Command-R's shape, shrunk: grouped K/V heads, no biases, tied, logits times a quarter
    "cohere": lambda: cohere(logit_scale=0.25),
    # one K/V head, q/k/v/o biases, an untied head, logits times 2, a RoPE theta of its own
    "cohere_biased": lambda: cohere(
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=False,
        logit_scale=2.0,
        rope_parameters={"rope_type": "default", "rope_theta": 8000000.0},
    ),
    # Command R7B's pattern, shrunk: layers 0 and 2 slide over 5 positions with RoPE, 1 and 3 NoPE
    "cohere2": lambda: cohere2(logit_scale=0.25),
    # layer types of its own, biases, untied, a RoPE theta of its own
    "cohere2_types": lambda: cohere2(
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        attention_bias=True,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
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
    plain, biased = imported["cohere"].spec.model, imported["cohere_biased"].spec.model
    second, typed = imported["cohere2"].spec.model, imported["cohere2_types"].spec.model
    assert plain.norm.model_dump() == {
        "position": "pre",
        "type": "layernorm",
        "eps": 1e-5,
        "scale": True,
        "bias": False,
        "final": True,
        "first_attention": True,
    }
    assert (plain.block.type, plain.block.shared_norm, plain.positional.layout) == (
        "parallel",
        True,
        "interleaved",
    )
    assert (plain.activation, plain.n_kv_heads, plain.tie_embeddings, plain.logit_multiplier) == (
        "swiglu",
        2,
        True,
        0.25,
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.positional.nope_layers) == (
        False,
        False,
        False,
        None,
    )
    assert (biased.n_kv_heads, biased.bias.qkv, biased.bias.attn_out, biased.bias.ffn) == (
        1,
        True,
        True,
        False,
    )
    assert (biased.tie_embeddings, biased.logit_multiplier, biased.positional.theta) == (False, 2.0, 8e6)
    assert (second.positional.nope_layers, second.window.size, second.window.layers) == ([1, 3], 5, [0, 2])
    assert (second.positional.theta, second.logit_multiplier, second.window is not None) == (1e4, 0.25, True)
    assert (typed.positional.nope_layers, typed.window.layers, typed.positional.theta) == (
        [0, 3],
        [1, 2],
        5e4,
    )
    assert (typed.bias.qkv, typed.bias.attn_out, typed.tie_embeddings) == (True, True, False)


def test_the_logit_multiplier_is_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """Without logit_scale the logits are 4 times transformers'."""
    model, spec = imported["cohere"].model, imported["cohere"].spec.model
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = imported["cohere"].hf(ids).logits
        model.spec = spec.model_copy(update={"logit_multiplier": 1.0})
        unscaled = model(ids)
        model.spec = spec
    assert torch.allclose(unscaled, 4 * expected, atol=1e-4)


def test_the_nope_layers_and_the_window_are_what_makes_cohere_2_agree(imported: dict[str, Imported]) -> None:
    """Turning RoPE in the full layers too, or attending past the window, changes the logits of 12
    positions past the comparisons' tolerance: without either the import would differ."""
    model, spec = imported["cohere2"].model, imported["cohere2"].spec.model
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        model.positional.nope_layers = frozenset()
        rotated = model(ids)
        model.positional.nope_layers = frozenset({1, 3})
        model.spec = spec.model_copy(update={"window": None})
        unwindowed = model(ids)
        model.spec = spec
    # ten times the 1e-5 the comparisons allow, on logits a quarter of the head's
    assert (expected - rotated).abs().max() > 1e-4
    assert (expected - unwindowed).abs().max() > 1e-4


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_refuses_a_cohere_by_field(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """No architecture export-hf writes has Cohere's blocks: GPT-NeoX's, the candidate of a
    parallel LayerNorm block, names what it cannot write."""
    with pytest.raises(HFError) as error:
        export_hf(imported[name].result.run_dir, tmp_path / "out")
    fields = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert {"model.activation", "model.block.shared_norm", "model.logit_multiplier"} <= set(fields), fields
    assert ("model.window" in fields) == name.startswith("cohere2")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


@pytest.mark.parametrize(("name", "head"), [("cohere", "Cohere"), ("cohere2", "Cohere2")])
def test_a_classifier_head_is_refused_by_architectures(
    imported: dict[str, Imported], name: str, head: str, tmp_path: Path
) -> None:
    assert_head_refused(imported[name], f"{head}ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    return case("cohere", exported=False, **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        layer_norm_eps=1e-2,
        logit_scale=3.0,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "tie_embeddings": False,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "logit_multiplier": 3.0,
            "dropout.attention": 0.3,
        },
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # CohereConfig: one per head
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": False}, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),  # the class's
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="quick_gelu"),
    row(layer_norm_eps=1e-2, spec={"norm.eps": 1e-2}, slow=True),
    row(logit_scale=0.0625, spec={"logit_multiplier": 0.0625}, slow=True),
    row(json={"logit_scale": DELETE}, spec={"logit_multiplier": 0.0625}, slow=True),  # the class's
    row(outcome="logit_scale", json={"logit_scale": 0}),  # every logit 0: the spec's multiplier is above 0
    row(outcome="logit_scale", json={"logit_scale": -1.0}, slow=True),
    row(outcome="use_qk_norm", use_qk_norm=True),  # a norm weight per head: not the spec's qk_norm
    row(use_qk_norm=False, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),  # not a field of CohereConfig; transformers reads it
    row(attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # RoPE: theta, each scaling type, as transformers 5 writes it and 4 (legacy keys)
    row(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 500000.0}, slow=True),  # the class's
    row(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row(**rope(**YARN), slow=True),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row(outcome="architectures", json={"architectures": ["CohereForTokenClassification"]}, slow=True),
]


def row2(**fields: Any) -> Case:
    return case("cohere2", exported=False, **fields)


CASES2: list[Case] = [
    row2(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        layer_norm_eps=1e-2,
        logit_scale=3.0,
        attention_dropout=0.3,
        initializer_range=0.5,
        sliding_window=3,
        spec={
            "n_kv_heads": 1,
            "bias.qkv": True,
            "bias.attn_out": True,
            "tie_embeddings": False,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "logit_multiplier": 3.0,
            "dropout.attention": 0.3,
            "window.size": 3,
            "window.layers": [0, 2],
            "positional.nope_layers": [1, 3],
        },
    ),
    row2(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row2(outcome="num_key_value_heads", num_key_value_heads=3),
    row2(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),
    row2(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row2(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row2(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row2(outcome="hidden_act", hidden_act="quick_gelu"),
    row2(layer_norm_eps=1e-2, spec={"norm.eps": 1e-2}, slow=True),
    row2(logit_scale=0.0625, spec={"logit_multiplier": 0.0625}, slow=True),
    row2(outcome="logit_scale", json={"logit_scale": 0}, slow=True),
    row2(head_dim=16, spec={"head_dim": 16}, slow=True),
    # Cohere's q/k norm flag, which Cohere 2 does not read
    row2(json={"use_qk_norm": True}, spec={"qk_norm": False}, slow=True),
    # the layers: layer_types, or every sliding_window_pattern-th full (Cohere2Config's 4th)
    row2(
        layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
        spec={"window.layers": [0, 3], "positional.nope_layers": [1, 2]},
    ),
    row2(
        layer_types=["sliding_attention"] * 4,
        spec={"window.size": 5, "window.layers": None, "positional.nope_layers": None},
        slow=True,
    ),
    row2(layer_types=["full_attention"] * 4, spec={"window": None, "positional.nope_layers": [0, 1, 2, 3]}),
    row2(outcome="layer_types", json={"layer_types": ["sliding_attention", "full_attention"]}),
    row2(
        outcome="layer_types", json={"layer_types": ["sliding_attention", "chunked_attention"] * 2}, slow=True
    ),
    row2(
        sliding_window_pattern=4,
        spec={"window.layers": [0, 1, 2], "positional.nope_layers": [3]},
        slow=True,
    ),
    row2(
        json={"layer_types": DELETE, "sliding_window_pattern": 3},
        spec={"window.layers": [0, 1, 3], "positional.nope_layers": [2]},
    ),
    row2(
        json={"layer_types": DELETE, "sliding_window_pattern": DELETE},  # Cohere2Config's 4
        spec={"window.layers": [0, 1, 2], "positional.nope_layers": [3]},
        slow=True,
    ),
    row2(
        json={"layer_types": DELETE, "sliding_window_pattern": 1},
        spec={"window": None, "positional.nope_layers": [0, 1, 2, 3]},
        slow=True,
    ),
    row2(
        outcome="sliding_window_pattern", json={"layer_types": DELETE, "sliding_window_pattern": 0}, slow=True
    ),
    # the window: any size, past the context (none), null and 0 (transformers fails)
    row2(sliding_window=1, spec={"window.size": 1}, slow=True),
    row2(sliding_window=40, spec={"window": None, "positional.nope_layers": [1, 3]}, slow=True),
    row2(json={"sliding_window": DELETE}, spec={"window": None}, slow=True),  # 4096: past the context
    row2(outcome="sliding_window", json={"sliding_window": None}),
    row2(outcome="sliding_window", json={"sliding_window": 0}, slow=True),
    row2(attention_dropout=0.3, slow=True),
    row2(initializer_range=0.5, slow=True),
    row2(use_cache=False, slow=True),
    row2(slow=True, **IDS),
    row2(pad_token_id=None, slow=True),
    row2(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row2(num_hidden_layers=2, spec={"window.layers": [0], "positional.nope_layers": [1]}, slow=True),
    # past the spec's layers: refused by name, with no layer list of a billion entries built first
    row2(outcome="num_hidden_layers", json={"num_hidden_layers": 1 << 30, "layer_types": DELETE}),
    row2(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row2(vocab_size=VOCAB, slow=True),
    row2(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    row2(json={"rope_parameters": DELETE}, spec={"positional.theta": 10000.0}, slow=True),  # the class's
    row2(**rope(rope_type="linear", factor=2.0), spec={"positional.scaling.factor": 2.0}, slow=True),
    row2(**rope(rope_type="dynamic", factor=2.0), slow=True),
    row2(**rope(**YARN), slow=True),
    row2(json={"rope_parameters": DELETE, "rope_theta": 777.0}, spec={"positional.theta": 777.0}, slow=True),
    row2(outcome="architectures", json={"architectures": ["Cohere2ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES + CASES2))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize(("model_type", "cases"), [("cohere", CASES), ("cohere2", CASES2)])
def test_every_config_field_has_a_case(model_type: str, cases: list[Case]) -> None:
    """A field transformers adds to CohereConfig or Cohere2Config fails this until a row says what
    it does (or the family's tiny base sets it)."""
    assert uncovered(model_type, cases) == set()
