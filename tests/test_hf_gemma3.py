"""Gemma 3 (``Gemma3ForCausalLM``, model type ``gemma3_text``): tiny random transformers models
saved with save_pretrained, imported, and held to transformers' outputs (float32, padded and not)
and parameter counts; written back with export-hf as Gemma3ForCausalLM; tfcompile's own runs with
q/k norms and sandwich norms written as Gemma 3 or refused by field; and every field of
Gemma3TextConfig, value by value, in the field table of tests/test_hf_fields.py.

The multimodal Gemma 3 (``Gemma3ForConditionalGeneration``, model type ``gemma3``) imports as its
language model: transformers' logits on text, the language model's parameter count, the spec and
weights a Gemma3ForCausalLM of them imports to, greedy generation, the image path's tensors left
out with a warning (nothing else), its config's fields by a table of their own, and a folder
saved by transformers 4.57 (where TFCOMPILE_TRANSFORMERS_457 names its python)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import DECODER, FIVE, Imported, copied, own_names, perturb, random_ids, right_padding, write
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

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec.schema import SlidingWindow
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

S, F = "sliding_attention", "full_attention"
# Gemma3TextConfig's own defaults are 26 layers of 256-wide heads scaled by 1/16: three layers,
# the middle one global (every 2nd), heads of 8 scaled by 1/sqrt(8).
GEMMA3 = DECODER | {
    "head_dim": 8,
    "query_pre_attn_scalar": 8,
    "num_hidden_layers": 3,
    "sliding_window_pattern": 2,
}
WINDOW_6 = {"window.size": 6, "window.layers": [0, 2]}  # a window of 6 on GEMMA3's sliding layers
FAMILIES["gemma3_text"] = Family(T.Gemma3TextConfig, T.Gemma3ForCausalLM, "llama", GEMMA3)


def rope(full: dict[str, Any], sliding: dict[str, Any]) -> dict[str, Any]:
    return {"rope_parameters": {F: {"rope_type": "default", **full}, S: {"rope_type": "default", **sliding}}}


# name -> the model, random (its norms and biases moved off their initial values)
VARIANTS: dict[str, Callable[[], Any]] = {
    # layers 0 and 2 slide (theta 10,000), layer 1 is global (1,000,000); the attention cap is
    # stored and unused by transformers, the logit cap applied
    "gemma3": lambda: T.Gemma3ForCausalLM(
        T.Gemma3TextConfig(**GEMMA3, attn_logit_softcapping=0.5, final_logit_softcapping=1.5)
    ),
    # the global layer linearly scaled, the sliding ones at 100 over a window of 12, biases, untied
    "gemma3_scaled_window_bias_untied": lambda: T.Gemma3ForCausalLM(
        T.Gemma3TextConfig(
            **GEMMA3 | rope({"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}, {"rope_theta": 100.0}),
            layer_types=[S, F, S],
            sliding_window=12,
            attention_bias=True,
            tie_word_embeddings=False,
        )
    ),
    # every layer slides (the pattern's 6th layer is past the model): one RoPE, at 10,000
    "gemma3_all_sliding": lambda: T.Gemma3ForCausalLM(
        T.Gemma3TextConfig(**GEMMA3 | {"sliding_window_pattern": 6})
    ),
}


def imported_variant(root: Path, name: str) -> Imported:
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
    assert export_hf(imported[name].result.run_dir, tmp_path / "out") == "Gemma3ForCausalLM"
    _loads_alike(tmp_path / "out", imported[name].model)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain = imported["gemma3"].spec.model
    assert (plain.norm.position, plain.qk_norm, plain.scale_embeddings, plain.activation) == (
        "sandwich",
        True,
        True,
        "geglu_tanh",
    )
    assert (plain.attention_softcap, plain.logit_softcap, plain.attention_scale) == (None, 1.5, 8**-0.5)
    positional = plain.positional
    assert positional.theta == 1e6 and positional.scaling is None and positional.local is not None
    assert (positional.local.theta, positional.local.scaling, positional.local.layers) == (
        10000.0,
        None,
        [0, 2],
    )
    scaled = imported["gemma3_scaled_window_bias_untied"].spec.model
    assert scaled.positional.scaling is not None and scaled.positional.scaling.type == "linear"
    assert scaled.positional.local is not None and scaled.positional.local.theta == 100.0
    assert (scaled.max_seq_len, scaled.bias.qkv, scaled.tie_embeddings) == (32, True, False)
    assert scaled.window == SlidingWindow(size=12, layers=[0, 2])  # the local RoPE's layers
    alike = imported["gemma3_all_sliding"].spec.model.positional
    assert (alike.theta, alike.local) == (10000.0, None)
    # Gemma3RMSNorm's (1 + weight) on each head's q, folded
    hf_norm = imported["gemma3"].hf.model.layers[1].self_attn.q_norm.weight
    assert torch.equal(imported["gemma3"].model.blocks[1].attn.q_norm.weight, 1.0 + hf_norm)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_runtime_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    """Exported to ONNX with parity, then greedy decoding with the KV cache in onnxruntime against
    transformers' generate (20 tokens past the window of 12, where there is one)."""
    imported[name].assert_runtime_generates_as_transformers(tmp_path, 20 if "window" in name else 7)


# tfcompile's own runs with scaled embeddings, sandwich norms and q/k norms: written as Gemma 3
# (interleaved RoPE permuted to halves, the local layers as the sliding ones).
GEMMA3_OWN = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, "
    "max_seq_len: 16, norm: {type: rmsnorm, position: sandwich}, activation: geglu_tanh, "
    "scale_embeddings: true, qk_norm: true, bias: {qkv: false, attn_out: false, ffn: false}, "
    "logit_softcap: 3.0"
)
WRITTEN = {
    "local layers, interleaved": f"{GEMMA3_OWN}, positional: {{type: rope, theta: 50000, "
    "local: {theta: 100, layers: [0, 2]}}",
    "one RoPE, linear, halves": f"{GEMMA3_OWN}, positional: {{type: rope, layout: halves, "
    "scaling: {type: linear, factor: 2}}",
}


@pytest.mark.parametrize("kind", list(WRITTEN))
def test_a_run_with_sandwich_and_q_k_norms_is_written_as_gemma_3(tmp_path: Path, kind: str) -> None:
    run = random_run(tmp_path, f"model: {{{WRITTEN[kind]}}}\n")
    assert export_hf(run, tmp_path / "out") == "Gemma3ForCausalLM"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    local = "local" in WRITTEN[kind]
    assert config["layer_types"] == ([S, F, S] if local else [F, F, F])
    assert config["rope_parameters"][S]["rope_theta"] == (100.0 if local else 10000.0)
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


def test_what_gemma_3_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    message = _problems(
        tmp_path,
        f"{GEMMA3_OWN}, attention_softcap: 20.0, qk_norm_over: all_heads, positional: {{type: rope, "
        "local: {theta: 100, layers: [1], scaling: {type: linear, factor: 2}}}",
    )
    for field in (
        "model.attention_softcap: 20.0 has no Gemma 3 equivalent",
        "model.positional.local.scaling: {'type': 'linear', 'factor': 2.0} has no Gemma 3 equivalent",
        "model.qk_norm_over: 'all_heads' has no Gemma 3 equivalent",  # its folder did not load
    ):
        assert field in message, message


# ------------------------------------------------------------------------------ the field table

CASES: list[Case] = [
    case(  # the fields that take any value at once: each row below sets one
        "gemma3_text",
        head_dim=16,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        rms_norm_eps=1e-2,
        attention_bias=True,
        hidden_activation="gelu",
        final_logit_softcapping=2.0,
        query_pre_attn_scalar=3,
        initializer_range=0.5,
        attention_dropout=0.3,
        spec={
            "head_dim": 16,
            "n_kv_heads": 1,
            "bias.attn_out": True,
            "activation": "geglu",
            "logit_softcap": 2.0,
            "attention_scale": 3**-0.5,
            "norm.position": "sandwich",
            "qk_norm": True,
            "positional.local.layers": [0, 2],
        },
    ),
    case("gemma3_text", head_dim=256, json={"head_dim": DELETE}, spec={"head_dim": 256}, slow=True),
    case("gemma3_text", outcome="num_key_value_heads", num_key_value_heads=3, slow=True),
    case("gemma3_text", json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),
    case("gemma3_text", json={"hidden_activation": DELETE}, spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma3_text", json={"hidden_act": "silu"}, spec={"activation": "geglu_tanh"}, slow=True),
    case("gemma3_text", hidden_activation="silu", spec={"activation": "swiglu"}, slow=True),
    case("gemma3_text", outcome="hidden_activation", hidden_activation="relu"),
    # the caps: none where missing; the attention cap is stored and never applied by transformers
    case("gemma3_text", attn_logit_softcapping=0.5, spec={"attention_softcap": None}),
    case(
        "gemma3_text",
        json={"attn_logit_softcapping": DELETE, "final_logit_softcapping": DELETE},
        spec={"attention_softcap": None, "logit_softcap": None},
        slow=True,
    ),
    case("gemma3_text", outcome="final_logit_softcapping", final_logit_softcapping=-1.0, slow=True),
    case("gemma3_text", json={"query_pre_attn_scalar": DELETE}, spec={"attention_scale": 1 / 16}, slow=True),
    case("gemma3_text", outcome="query_pre_attn_scalar", json={"query_pre_attn_scalar": 0}, slow=True),
    # which layers slide: layer_types, else every sliding_window_pattern-th layer is global (6th)
    case("gemma3_text", sliding_window=6, spec={"max_seq_len": 32, **WINDOW_6}),
    case("gemma3_text", json={"sliding_window": DELETE}, spec={"window": None}, slow=True),  # 4096 > 32
    case("gemma3_text", outcome="sliding_window", json={"sliding_window": None}),
    case(
        "gemma3_text",
        sliding_window=6,
        layer_types=[F, F, F],
        spec={"window": None, "positional.local": None, "positional.theta": 1e6},
        slow=True,
    ),
    case("gemma3_text", layer_types=[F, S, S], spec={"positional.local.layers": [1, 2]}, slow=True),
    case(
        "gemma3_text",
        json={"layer_types": DELETE, "sliding_window_pattern": 3},
        spec={"positional.local.layers": [0, 1]},
        slow=True,
    ),
    case(  # 6: every one of the three layers slides, at 10,000
        "gemma3_text",
        json={"layer_types": DELETE, "sliding_window_pattern": DELETE},
        spec={"positional.local": None, "positional.theta": 10000.0},
        slow=True,
    ),
    case(  # transformers' own field for the pattern it read, never read back
        "gemma3_text",
        json={"layer_types": DELETE, "sliding_window_pattern": DELETE, "_sliding_window_pattern": 2},
        spec={"positional.local": None},
        slow=True,
    ),
    case(
        "gemma3_text",
        outcome="sliding_window_pattern",
        json={"layer_types": DELETE, "sliding_window_pattern": 0},
    ),
    case("gemma3_text", outcome="layer_types", json={"layer_types": [S, F]}, slow=True),
    case("gemma3_text", outcome="layer_types", json={"layer_types": [S, "chunked_attention", S]}, slow=True),
    # a RoPE per layer type: transformers 5's rope_parameters, or 4's fields (the scaling the global layers')
    case(
        "gemma3_text",
        **rope({"rope_theta": 500.0}, {"rope_theta": 50.0}),
        spec={"positional.theta": 500.0, "positional.local.theta": 50.0},
    ),
    case(
        "gemma3_text", **rope({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}, {"rope_theta": 1e4})
    ),
    case(
        "gemma3_text",
        **rope(
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "rope_theta": 1e4}, {}
        ),
        slow=True,
    ),
    case(  # transformers 5 scales a sliding layer too; export-hf writes no such thing
        "gemma3_text",
        **rope({"rope_theta": 1e4}, {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}),
        spec={"positional.local.scaling.factor": 2.0},
        exported=False,
        slow=True,
    ),
    case(
        "gemma3_text",
        json={
            "rope_parameters": DELETE,
            "rope_theta": 777.0,
            "rope_local_base_freq": 77.0,
            "rope_scaling": {"rope_type": "linear", "factor": 3.0},
        },
        spec={"positional.theta": 777.0, "positional.local.theta": 77.0, "positional.scaling.factor": 3.0},
        slow=True,
    ),
    case(
        "gemma3_text",
        json={"rope_parameters": DELETE},
        spec={"positional.theta": 1e6, "positional.local.theta": 1e4},
        slow=True,
    ),
    case("gemma3_text", outcome="rope_parameters", json={"rope_parameters": {"rope_theta": 5.0}}, slow=True),
    case(  # transformers 5 updates the global layers' dict with rope_scaling, keeping its theta
        "gemma3_text",
        **rope({"rope_theta": 500.0}, {"rope_theta": 50.0}),
        json={"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        spec={"positional.theta": 500.0, "positional.scaling.factor": 2.0, "positional.local.theta": 50.0},
    ),
    # a layer type without its dict (or with a null one) turns unscaled at its theta field's value,
    # as transformers 5 fills it in
    case(
        "gemma3_text",
        json={
            "rope_parameters": {F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
            "rope_local_base_freq": 77.0,
        },
        spec={"positional.theta": 500.0, "positional.scaling.factor": 2.0, "positional.local.theta": 77.0},
    ),
    case(
        "gemma3_text",
        json={"rope_parameters": {F: {"rope_type": "default", "rope_theta": 500.0}, S: None}},
        spec={"positional.theta": 500.0, "positional.local.theta": 1e4},
        slow=True,
    ),
    case(
        "gemma3_text",
        json={"rope_parameters": {S: {"rope_type": "default", "rope_theta": 50.0}}, "rope_theta": 700.0},
        spec={"positional.theta": 700.0, "positional.scaling": None, "positional.local.theta": 50.0},
        slow=True,
    ),
    case(  # transformers 5 updates a global layers' dict that is not there, and fails
        "gemma3_text",
        outcome="rope_scaling",
        json={
            "rope_parameters": {S: {"rope_type": "default"}},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    case(  # transformers 5 leaves the global layers unscaled, transformers 4 fails
        "gemma3_text",
        outcome="rope_scaling.type",
        json={"rope_parameters": DELETE, "rope_scaling": {"type": "linear", "factor": 2.0}},
    ),
    case(
        "gemma3_text",
        outcome="rope_parameters.sliding_attention",
        json={"rope_parameters": {F: {"rope_type": "default"}, S: {"rope_type": "default", "x": {"a": 1}}}},
    ),
    case("gemma3_text", outcome="max_position_embeddings", json={"max_position_embeddings": float("inf")}),
    case(
        "gemma3_text", outcome="sliding_window", json={"sliding_window": float("nan")}
    ),  # transformers 5 refuses it
    case(  # every layer slides: the model's RoPE is the sliding layers', named as theirs
        "gemma3_text",
        outcome="rope_local_base_freq",
        json={"rope_parameters": DELETE, "layer_types": [S, S, S], "rope_local_base_freq": -5.0},
    ),
    case("gemma3_text", **rope(longrope(rope_theta=1e4), {}), slow=True),
    case("gemma3_text", outcome="use_bidirectional_attention", use_bidirectional_attention=True),
    case("gemma3_text", initializer_range=0.5, slow=True),
    case("gemma3_text", attention_dropout=0.3, slow=True),
    case("gemma3_text", use_cache=False, slow=True),
    case("gemma3_text", slow=True, **IDS),
    case("gemma3_text", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("gemma3_text", num_hidden_layers=1, slow=True),
    case("gemma3_text", hidden_size=48, intermediate_size=40, vocab_size=80, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Gemma3TextConfig fails this until a row of CASES says what
    it does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES["gemma3_text"].base)
    covered |= set().union(*(c.fields() for c in CASES))
    assert _class_fields("gemma3_text") - covered == set()


# ---------------------------------------------------- the multimodal Gemma 3 (model type gemma3)

# A SigLIP tower of one layer over 8-pixel images of 4-pixel patches, pooled to 4 image tokens.
VISION = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=8,
    patch_size=4,
)
MULTIMODAL = {"vision_config": VISION, "mm_tokens_per_image": 4}
FAMILIES["gemma3"] = Family(
    T.Gemma3Config, T.Gemma3ForConditionalGeneration, "llama", MULTIMODAL | {"text_config": GEMMA3}
)


def multimodal(text: dict[str, Any] | None = None, **fields: Any) -> Any:
    """A Gemma3ForConditionalGeneration of GEMMA3's language model (``text`` changed)."""
    config = T.Gemma3Config(text_config=GEMMA3 | (text or {}), **MULTIMODAL | fields)
    return T.Gemma3ForConditionalGeneration(config)


MULTIMODAL_VARIANTS: dict[str, Callable[[], Any]] = {
    "gemma3_mm": multimodal,
    # (its greedy tokens are 1, Gemma3TextConfig's eos: another eos, so that generate goes on)
    "gemma3_mm_scaled_window_bias_untied": lambda: multimodal(
        rope({"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}, {"rope_theta": 100.0})
        | {"layer_types": [S, F, S], "sliding_window": 12, "attention_bias": True, "eos_token_id": 63},
        tie_word_embeddings=False,
    ),
}
MULTIMODAL_NAMES = [*MULTIMODAL_VARIANTS, *(name + FIVE for name in MULTIMODAL_VARIANTS)]


def image_path(hf: Any) -> int:
    """The parameters of the vision tower and the projector."""
    return sum(
        p.numel() for m in (hf.model.vision_tower, hf.model.multi_modal_projector) for p in m.parameters()
    )


@pytest.fixture(scope="module")
def multimodal_imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("hf")

    def imported(name: str) -> Imported:
        def write_to(folder: Path) -> None:
            torch.manual_seed(0)
            write(perturb(MULTIMODAL_VARIANTS[name.removesuffix(FIVE)]()), "llama", folder)
            if name.endswith(FIVE):
                own_names(folder)

        return Imported(root, name, write_to, "ignore")

    return {name: imported(name) for name in MULTIMODAL_NAMES}


@pytest.mark.parametrize("name", MULTIMODAL_NAMES)
def test_the_multimodal_gemma_3_imports_as_its_language_model(
    multimodal_imported: dict[str, Imported], name: str
) -> None:
    """transformers' logits on text (padded and not), and the language model's parameters
    (the LM head's counted once where tied)."""
    imported = multimodal_imported[name]
    imported.assert_outputs_match()
    imported.assert_counts_match(unread=image_path(imported.hf))


@pytest.mark.parametrize("name", list(MULTIMODAL_VARIANTS))
def test_its_spec_and_weights_are_its_language_models_as_gemma3_text(
    multimodal_imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    hf = multimodal_imported[name].hf
    config = copy.deepcopy(hf.config.text_config)
    config.tie_word_embeddings = hf.config.tie_word_embeddings
    text = T.Gemma3ForCausalLM(config)
    language_model = {f"model.{k}": v for k, v in hf.model.language_model.state_dict().items()}
    text.load_state_dict(language_model | {"lm_head.weight": hf.lm_head.weight})
    write(text, "llama", tmp_path / "text")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        result = import_folder(tmp_path / "text", "text", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model == multimodal_imported[name].spec.model
    ours = multimodal_imported[name].model.state_dict()
    assert all(torch.equal(t, ours[k]) for k, t in load_trained_model(result.run_dir)[1].state_dict().items())


@pytest.mark.parametrize("name", list(MULTIMODAL_VARIANTS))
def test_an_imported_multimodal_run_is_written_as_gemma3_for_causal_lm(
    multimodal_imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    assert export_hf(multimodal_imported[name].result.run_dir, tmp_path / "out") == "Gemma3ForCausalLM"
    _loads_alike(tmp_path / "out", multimodal_imported[name].model)


def test_the_import_says_the_image_path_is_left_out(
    multimodal_imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = multimodal_imported["gemma3_mm"].folder
    n = sum(
        name.startswith(("vision_tower.", "multi_modal_projector."))
        for name in load_file(folder / "model.safetensors")
    )
    expected = (
        rf"language model is imported alone \(text only\): its vision tower and projector \({n} tensors\) "
        r"are left out, .* export-hf writes the run as Gemma3ForCausalLM"
    )
    with pytest.warns(HFWarning, match=expected):
        import_folder(folder, "again", tmp_path / "specs", tmp_path / "runs")


@pytest.mark.parametrize("extra", ["language_model.model.layers.0.extra.weight", "vision.weight"])
def test_only_the_image_path_is_left_out(
    multimodal_imported: dict[str, Imported], tmp_path: Path, extra: str
) -> None:
    folder = copied(multimodal_imported, "gemma3_mm", tmp_path)
    tensors = load_file(folder / "model.safetensors") | {extra: torch.zeros(2)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with (
        warnings.catch_warnings(),
        pytest.raises(HFError, match="holds tensors a Gemma3ForConditionalGeneration does not read"),
    ):
        warnings.simplefilter("ignore", HFWarning)
        import_folder(folder, "extra", tmp_path / "specs", tmp_path / "runs")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MULTIMODAL_VARIANTS))
def test_the_runtime_generates_the_multimodal_models_greedy_tokens(
    multimodal_imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    multimodal_imported[name].assert_runtime_generates_as_transformers(tmp_path)


@pytest.mark.slow
def test_the_bundle_generates_the_multimodal_models_greedy_text(
    multimodal_imported: dict[str, Imported], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    multimodal_imported["gemma3_mm"].assert_generates_as_transformers(tmp_path, capsys)


def _save_multimodal(c: Case, folder: Path) -> None:
    """The case's model saved: ``text_config`` (class arguments) changes GEMMA3's, and a ``json``
    key ``text_config.NAME`` is the text config's field NAME."""
    edits = dict(c.edits)
    torch.manual_seed(0)
    write(perturb(multimodal(edits.pop("text_config", {}), **edits)), "llama", folder)
    saved = json.loads((folder / "config.json").read_text())
    for key, value in c.json.items():
        inner = key.startswith("text_config.")
        place, name = (saved["text_config"], key.removeprefix("text_config.")) if inner else (saved, key)
        if value is DELETE:
            place.pop(name, None)
        else:
            place[name] = value
    (folder / "config.json").write_text(json.dumps(saved))


MULTIMODAL_CASES: list[Case] = [
    case("gemma3", tie_word_embeddings=False, spec={"tie_embeddings": False}),
    case("gemma3", json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),
    case(  # transformers 5 ties the head as the top level says (transformers 4: as text_config says)
        "gemma3",
        json={"tie_word_embeddings": DELETE, "text_config.tie_word_embeddings": False},
        spec={"tie_embeddings": True},
    ),
    case("gemma3", outcome="architectures", json={"tie_word_embeddings": None}),  # no head, none tied
    case("gemma3", outcome="tie_word_embeddings", json={"tie_word_embeddings": "yes"}),
    case("gemma3", outcome="architectures", json={"architectures": ["Gemma3ForSequenceClassification"]}),
    case("gemma3", outcome="text_config", json={"text_config": 5}),
    # the language model's fields, read as Gemma3Config builds a Gemma3TextConfig of them
    case(
        "gemma3",
        json={"text_config.query_pre_attn_scalar": DELETE, "text_config.model_type": DELETE},
        spec={"attention_scale": 1 / 16},
    ),
    case("gemma3", text_config={"sliding_window": 6}, spec=WINDOW_6, slow=True),
    case(  # the multimodal model caps no logit, whatever its text config says
        "gemma3", text_config={"final_logit_softcapping": 2.0}, spec={"logit_softcap": None}
    ),
    case("gemma3", outcome="text_config.num_key_value_heads", json={"text_config.num_key_value_heads": 3}),
    case(  # read where transformers' generation cache reads it (unread_chunks), refused without layer_types
        "gemma3",
        outcome="text_config.attention_chunk_size",
        json={"text_config.layer_types": DELETE, "text_config.attention_chunk_size": 4},
        slow=True,
    ),
    case(
        "gemma3",
        outcome="text_config.rope_scaling.type",
        json={
            "text_config.rope_parameters": DELETE,
            "text_config.rope_scaling": {"type": "linear", "factor": 2.0},
        },
    ),
    case(
        "gemma3",
        outcome="text_config.rope_parameters.sliding_attention.short_factor",
        json={"text_config.rope_parameters": {S: {"rope_type": "longrope"}}},
        slow=True,
    ),
    case(
        "gemma3",
        outcome="text_config.use_bidirectional_attention",
        json={"text_config.use_bidirectional_attention": True},
    ),
    # the image path's fields: an image token in a text is a token as any other
    case("gemma3", image_token_index=5, boi_token_index=6, eoi_token_index=7),
    case("gemma3", mm_tokens_per_image=1, initializer_range=0.5, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(MULTIMODAL_CASES))
def test_a_multimodal_field_value_imports_to_transformers_outputs_or_is_refused_by_name(
    c: Case, tmp_path: Path
) -> None:
    check(c, tmp_path, save=_save_multimodal)


def test_every_multimodal_config_field_has_a_case() -> None:
    covered = set(UNREAD) | set(FAMILIES["gemma3"].base)
    covered |= set().union(*(c.fields() for c in MULTIMODAL_CASES))
    assert _class_fields("gemma3") - covered == set()


PYTHON_457 = os.environ.get("TFCOMPILE_TRANSFORMERS_457")  # as tests/test_hf_export_457.py runs it
# Run in transformers 4.57: a Gemma3ForConditionalGeneration (its head tied as text_config says, 4's
# field, and the top level alike) saved into a folder, its logits on the saved inputs and its
# language model's parameter count written beside it.
SAVE_457 = r"""
import json, sys, torch, transformers as T
folder, io, text, vision, tie = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:6])
torch.manual_seed(0)
config = T.Gemma3Config(text_config=text | {"tie_word_embeddings": tie}, vision_config=vision,
                        mm_tokens_per_image=4, tie_word_embeddings=tie)
model = T.Gemma3ForConditionalGeneration(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.ndim == 1:
            p.add_(torch.randn_like(p) * 0.1)
        elif "lm_head" in name:
            p.normal_(0, 0.5)
model.save_pretrained(folder)
inputs = torch.load(io)
with torch.no_grad():
    logits = [model(input_ids=inputs["ids"], attention_mask=mask).logits for mask in inputs["masks"]]
count = model.model.language_model.num_parameters() + (0 if tie else model.lm_head.weight.numel())
torch.save(inputs | {"logits": logits, "count": count, "version": T.__version__}, io)
"""
# transformers 4's RoPE fields, a window shorter than the inputs, biases
LEGACY_WINDOW = {
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "sliding_window": 6,
    "attention_bias": True,
}


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57"
)
@pytest.mark.parametrize("tie", [True, False])
def test_a_multimodal_gemma_3_saved_by_transformers_4_57_gives_its_logits(tmp_path: Path, tie: bool) -> None:
    assert PYTHON_457 is not None
    folder, io = tmp_path / "hf", tmp_path / "io.pt"
    masks = [torch.ones(3, 12, dtype=torch.long), right_padding(3, 12)]
    torch.save({"ids": random_ids(3, 12), "masks": masks}, io)
    text = GEMMA3 | ({} if tie else LEGACY_WINDOW)
    arguments = [str(folder), str(io), *(json.dumps(x) for x in (text, VISION, tie))]
    subprocess.run([PYTHON_457, "-c", SAVE_457, *arguments], check=True, capture_output=True)
    saved = torch.load(io)
    assert saved["version"].startswith("4.57")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        result = import_folder(folder, "g", tmp_path / "specs", tmp_path / "runs")
    spec, ours = load_trained_model(result.run_dir)
    assert (spec.model.tie_embeddings, spec.parameter_count()) == (tie, saved["count"])
    n = spec.model.max_seq_len  # past the window of 6
    with torch.no_grad():
        for mask, theirs in zip(masks, saved["logits"], strict=True):
            mask = mask[:, :n]
            assert (theirs[:, :n] - ours(saved["ids"][:, :n], mask))[mask.bool()].abs().max() <= 1e-5
