"""OLMo 3 (``Olmo3ForCausalLM``): OLMo 2's blocks (norms on each sublayer's output, q and k
normalised over all heads) sliding the layers its ``layer_types`` name ``sliding_attention``
(three of every four where it has none, as Olmo3Config derives them: ``window.layers``), with a
RoPE per layer type (``rope_parameters`` keyed by layer type): the sliding layers' is
``positional.local`` where it differs from the full layers'. Tiny random transformers models
saved with save_pretrained, imported, and held to transformers' logits (float32, rows padded on
the right and not, past the window), their parameter counts and greedy generation through the
ONNX bundle. export-hf writes an OLMo 3 as OLMo 2 where OLMo 2 computes it (no window, one
RoPE), and refuses it by field otherwise (``model.window``, ``model.positional.local``). What
transformers 5 cannot run (a null window), ignores, or reads otherwise than transformers 4 is
refused by field. A row for every field of Olmo3Config (tests/test_hf_fields.py's table and
check)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
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
    uncovered,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
SLIDING, FULL = "sliding_attention", "full_attention"
OLMO3 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    sliding_window=5,
)
FAMILIES["olmo3"] = Family(T.Olmo3Config, T.Olmo3ForCausalLM, "gpt2", OLMO3 | TOKENS)


def olmo3(**fields: Any) -> Any:
    return T.Olmo3ForCausalLM(T.Olmo3Config(**OLMO3 | TOKENS | fields))


def ropes(full: dict[str, Any], sliding: dict[str, Any]) -> dict[str, Any]:
    """rope_parameters keyed by layer type, as transformers 5 saves them."""
    return {
        "rope_parameters": {
            FULL: {"rope_type": "default", **full},
            SLIDING: {"rope_type": "default", **sliding},
        }
    }


VARIANTS: dict[str, Callable[[], Any]] = {
    # Olmo3Config's layer types (three sliding, then a full one) over 5 positions, one RoPE
    # (500,000), grouped K/V heads, an untied head
    "olmo3": lambda: olmo3(),
    # every other layer sliding at a theta of its own, the full layers' RoPE scaled (OLMo 3 7B's
    # YaRN on its full layers, shrunk); biases, tied
    "olmo3_local": lambda: olmo3(
        layer_types=[SLIDING, FULL, SLIDING, FULL],
        attention_bias=True,
        tie_word_embeddings=True,
        **ropes({"rope_theta": 500000.0, **YARN}, {"rope_theta": 100.0}),
    ),
    # a window of the whole context: none, one RoPE: OLMo 2
    "olmo3_unslid": lambda: olmo3(sliding_window=32, num_key_value_heads=4),
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
    plain, local = imported["olmo3"].spec.model, imported["olmo3_local"].spec.model
    unslid = imported["olmo3_unslid"].spec.model
    for model in (plain, local, unslid):
        assert (model.norm.position, model.norm.type, model.norm.eps) == ("output", "rmsnorm", 1e-5)
        assert (model.qk_norm, model.qk_norm_over, model.positional.layout) == (True, "all_heads", "halves")
    assert (plain.window.size, plain.window.layers, plain.positional.theta) == (5, [0, 1, 2], 500000.0)
    assert (plain.positional.local, plain.positional.scaling, plain.bias.qkv) == (None, None, False)
    assert (local.window.size, local.window.layers, local.bias.qkv, local.bias.attn_out) == (
        5,
        [0, 2],
        True,
        True,
    )
    assert local.positional.scaling.type == "yarn" and local.positional.theta == 500000.0
    assert local.positional.local.model_dump(exclude_none=True) == {"theta": 100.0, "layers": [0, 2]}
    assert (unslid.window, unslid.positional.local, unslid.n_kv_heads) == (None, None, 4)


def test_the_window_and_the_local_rope_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """transformers' own model without the window, or with the sliding layers turning as the full
    ones, differs past the window: the import holds both."""
    variant = imported["olmo3_local"]
    read = variant.hf.config.to_dict()
    for edit in ({"sliding_window": 32}, ropes({"rope_theta": 500000.0, **YARN}, {"rope_theta": 500000.0})):
        other = T.Olmo3ForCausalLM(T.Olmo3Config(**read | edit))
        other.load_state_dict(variant.hf.state_dict())
        assert max_difference(other.eval(), variant.model, False, length=20) > 1e-4, edit


@pytest.mark.parametrize(
    ("name", "refused"),
    [("olmo3", ["model.window"]), ("olmo3_local", ["model.positional.local", "model.window"])],
)
def test_export_hf_refuses_what_olmo_2_cannot_compute_by_field(
    imported: dict[str, Imported], name: str, refused: list[str], tmp_path: Path
) -> None:
    with pytest.raises(HFError) as error:
        export_hf(imported[name].result.run_dir, tmp_path / "out")
    assert sorted(re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)) == refused, str(error.value)
    assert "OLMo 2" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_export_hf_writes_an_olmo_3_without_window_as_olmo_2(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    variant = imported["olmo3_unslid"]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "Olmo2ForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)
    reloaded = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert max_difference(reloaded, variant.model, True, length=20) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["olmo3"], "Olmo3ForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A case whose import has a window (on the derived layers unless it says otherwise): export-hf
    refuses it, unless ``exported`` says otherwise."""
    return case("olmo3", **{"exported": False} | fields)


THREE = {"window.size": 5, "window.layers": [0, 1, 2]}
LOCAL = ropes({"rope_theta": 500000.0}, {"rope_theta": 100.0})
UNSLID = {"sliding_window": 32}  # the whole context: OLMo 2's computation, written back as it

CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        tie_word_embeddings=True,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        attention_bias=True,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "n_kv_heads": 1,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-2,
            "bias.qkv": True,
            "bias.attn_out": True,
            "dropout.attention": 0.3,
        }
        | THREE,
    ),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(num_key_value_heads=None, spec={"n_kv_heads": 4}, slow=True),  # as many as the heads
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu", slow=True),
    row(rms_norm_eps=1e-6, spec={"norm.eps": 1e-6}, slow=True),
    row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}, slow=True),  # Olmo3Config's
    row(attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    row(**UNSLID, attention_bias=True, exported=True, spec={"window": None}, slow=True),
    # the window: layer_types' sliding layers, three of four where it has none
    row(json={"layer_types": DELETE}, spec=THREE),
    row(json={"layer_types": None}, spec=THREE, slow=True),
    row(layer_types=[FULL, SLIDING, SLIDING, SLIDING], spec={"window.layers": [1, 2, 3]}, slow=True),
    row(layer_types=[SLIDING] * 4, spec={"window.size": 5, "window.layers": None}, slow=True),
    row(layer_types=[FULL] * 4, exported=True, spec={"window": None}),  # OLMo 2
    row(outcome="layer_types", json={"layer_types": [SLIDING, FULL, "chunked_attention", FULL]}),
    row(sliding_window=2, spec={"window.size": 2}, slow=True),
    row(exported=True, spec={"window": None}, slow=True, **UNSLID),
    # sliding_window left out: Olmo3Config's 4096, past the context
    row(json={"sliding_window": DELETE}, exported=True, spec={"window": None}, slow=True),
    # a null window: Olmo3Model builds the sliding mask from it all the same, and fails
    row(outcome="sliding_window", json={"sliding_window": None}),
    row(outcome="sliding_window", layer_types=[FULL] * 4, json={"sliding_window": None}, slow=True),
    # the RoPE per layer type: the sliding layers' as positional.local where it differs
    row(**LOCAL, spec={"positional.theta": 500000.0, "positional.local.theta": 100.0} | THREE),
    row(
        layer_types=[SLIDING] * 4,
        **LOCAL,
        spec={"positional.theta": 100.0, "positional.local": None},
        slow=True,
    ),
    row(layer_types=[FULL] * 4, **LOCAL, exported=True, spec={"positional.local": None}, slow=True),
    # no window, but a local RoPE: refused by export-hf (OLMo 2 turns every layer alike)
    row(**LOCAL | UNSLID, spec={"window": None, "positional.local.layers": [0, 1, 2]}, slow=True),
    row(
        **ropes({"rope_theta": 1000.0, "rope_type": "linear", "factor": 2.0}, {"rope_theta": 1000.0}),
        spec={"positional.scaling.factor": 2.0, "positional.local.theta": 1000.0},
    ),
    row(
        **ropes({"rope_theta": 1000.0, "rope_type": "dynamic", "factor": 2.0}, {"rope_theta": 1000.0}),
        slow=True,
    ),
    row(
        **ropes({"rope_theta": 1000.0}, {"rope_theta": 1000.0, **YARN}),
        spec={"positional.theta": 1000.0},
        slow=True,
    ),
    row(**ropes({"rope_theta": 9.0}, {"rope_theta": 9.0}), exported=True, spec={"window": None}, **UNSLID),
    # a dict left out or null: unscaled at the full layers' rope_theta, the sliding layers' 500,000
    row(json={"rope_parameters": {FULL: None, SLIDING: {"rope_type": "default", "rope_theta": 100.0}}}),
    row(json={"rope_parameters": {FULL: {"rope_type": "default", "rope_theta": 100.0}}}, slow=True),
    row(json={"rope_parameters": DELETE}, spec={"positional.theta": 500000.0, "positional.local": None}),
    row(json={"rope_parameters": None}, spec={"positional.theta": 500000.0}, slow=True),
    # transformers 4's fields: rope_theta for the full layers (and, in 4, the sliding ones),
    # rope_scaling updating the full layers' dict
    row(json={"rope_parameters": DELETE, "rope_theta": 500000.0}, slow=True),
    row(
        json={
            "rope_parameters": DELETE,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        spec={"positional.scaling.factor": 2.0, "positional.local.theta": 500000.0},
        slow=True,
    ),
    row(json={"rope_parameters": DELETE, "rope_theta": 777.0}, outcome="rope_theta"),
    row(
        json={"rope_parameters": DELETE, "rope_theta": 777.0},
        layer_types=[FULL] * 4,
        exported=True,
        slow=True,
    ),
    row(
        json={"rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 5.0}}, "rope_theta": 7.0},
        slow=True,
    ),
    row(outcome="rope_scaling.type", json={"rope_scaling": {"type": "linear", "factor": 2.0}}, slow=True),
    row(
        outcome="rope_scaling",
        json={
            "rope_parameters": {SLIDING: {"rope_type": "default"}},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        slow=True,
    ),
    # one RoPE for every layer: transformers 5 reads none but the per-type dicts
    row(outcome="rope_parameters", json={"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}),
    row(
        outcome="rope_parameters.full_attention.short_factor",
        json=ropes({"rope_type": "longrope"}, {}),
        slow=True,
    ),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    row(attention_dropout=0.3, spec={"dropout.attention": 0.3}, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(json={"pad_token_id": DELETE}, slow=True),  # Olmo3Config's 1
    row(max_position_embeddings=16, spec={"max_seq_len": 16}, slow=True),
    row(num_hidden_layers=2, spec={"window.layers": None}, slow=True),  # both sliding: every layer
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(head_dim=16, spec={"head_dim": 16}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(outcome="architectures", json={"architectures": ["Olmo3ForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Olmo3Config fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("olmo3", CASES) == set()
