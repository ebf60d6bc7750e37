"""GPT-OSS (``GptOssForCausalLM``: gpt-oss-20b, gpt-oss-120b): Llama's sections with q, k, v and o
biases, a learned sink per head in every attention (``attention_sinks``), every other layer
sliding where ``layer_types`` names none (``window.layers``), GptOssConfig's YaRN, and in every
layer a mixture of experts with biases (``bias.ffn``), its clamped SwiGLU (``activation:
swiglu_clamped``; ``hidden_act`` unread) and a router with a bias (``moe.router_bias``), each
expert's gate and up columns interleaved in the stacked ``gate_up_proj``. Tiny random transformers
models (expert weights wide enough that the clamps bend, every bias and sink random) saved with
save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right and
not, past the window), their parameter counts and greedy generation through the ONNX bundle;
what transformers 4 reads otherwise than 5 (attention_bias, swiglu_limit and swiglu_alpha) is
refused by field. export-hf writes every decoder of GPT-OSS's choices back as GPT-OSS. A row for
every field of GptOssConfig (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, assert_head_refused, from_pretrained, imported_variants, max_difference
from test_hf_export import _loads_alike
from test_hf_fields import DELETE, FAMILIES, IDS, YARN, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
SLIDING, FULL = "sliding_attention", "full_attention"
GPT_OSS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # not hidden_size / heads, as gpt-oss's 64 of 2880 / 64
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=32,
    sliding_window=5,
)


def widened(model: Any) -> Any:
    """The experts' weights wide enough that gates pass 7 and ups +-7 (the clamps bend), and their
    biases, which transformers starts at zero, random."""
    with torch.no_grad():
        for layer in model.model.layers:
            experts = layer.mlp.experts
            experts.gate_up_proj.normal_(0, 1.5)
            experts.gate_up_proj_bias.normal_(0, 0.5)
            experts.down_proj_bias.normal_(0, 0.5)
    return model


def gpt_oss(**fields: Any) -> Any:
    return widened(T.GptOssForCausalLM(T.GptOssConfig(**GPT_OSS | TOKENS | fields)))


FAMILIES["gpt_oss"] = Family(
    T.GptOssConfig, lambda config: widened(T.GptOssForCausalLM(config)), "gpt2", GPT_OSS | TOKENS
)

VARIANTS: dict[str, Callable[[], Any]] = {
    # GptOssConfig's layer types (every other sliding, the first among them) over 5 positions, its
    # YaRN (factor 32 over 4,096 positions, unrounded), grouped K/V heads, an untied head
    "gpt_oss": lambda: gpt_oss(),
    # every layer full, RoPE at another theta and a YaRN of its own, tied, one expert per token
    "gpt_oss_full": lambda: gpt_oss(
        layer_types=[FULL] * 4,
        tie_word_embeddings=True,
        num_experts_per_tok=1,
        rope_parameters={"rope_theta": 1000.0, **YARN},
    ),
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
    plain, full = imported["gpt_oss"].spec.model, imported["gpt_oss_full"].spec.model
    for model in (plain, full):
        assert (model.attention_sinks, model.activation, model.head_dim) == (True, "swiglu_clamped", 16)
        assert model.bias.model_dump() == {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False}
        assert (model.moe.experts, model.moe.router_bias, model.moe.normalize) == (4, True, True)
        assert (model.norm.type, model.norm.eps) == ("rmsnorm", 1e-5)
    assert (plain.window.size, plain.window.layers, plain.moe.top_k, plain.tie_embeddings) == (
        5,
        [0, 2],
        2,
        False,
    )
    assert plain.positional.scaling.model_dump() == {
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": None,
        "mscale_all_dim": None,
        "attention_factor": None,
        "truncate": False,
    }
    assert plain.positional.theta == 150000.0
    assert (full.window, full.moe.top_k, full.tie_embeddings, full.positional.theta) == (
        None,
        1,
        True,
        1000.0,
    )


def test_the_sinks_and_the_clamps_are_what_makes_the_import_agree(imported: dict[str, Imported]) -> None:
    """transformers' own model without its sinks (their logit far below every score), or with its
    experts' gate and up projections unclamped, differs: the import holds both."""
    variant = imported["gpt_oss"]
    sinkless = T.GptOssForCausalLM(variant.hf.config).eval()
    sinkless.load_state_dict(variant.hf.state_dict())
    with torch.no_grad():
        for layer in sinkless.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
    assert max_difference(sinkless, variant.model, False, length=20) > 1e-3
    unclamped = T.GptOssForCausalLM(variant.hf.config).eval()
    unclamped.load_state_dict(variant.hf.state_dict())
    for layer in unclamped.model.layers:
        layer.mlp.experts.limit = 1e9
    assert max_difference(unclamped, variant.model, False, length=20) > 1e-3


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "GptOssForCausalLM"
    _loads_alike(tmp_path / "out", variant.model)
    assert max_difference(from_pretrained(tmp_path / "out"), variant.model, True, length=20) <= 1e-5
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


# GPT-OSS's choices in a decoder of tfcompile's own: no biases, no router bias (zeros written)
NATIVE = (
    "model: {vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, max_seq_len: 24, "
    "positional: rope, norm: {type: rmsnorm, bias: false}, activation: swiglu_clamped, "
    "attention_sinks: true, tie_embeddings: false, window: {size: 4, layers: [1]}, "
    "moe: {experts: 3, top_k: 2, d_ff: 16}}\n"
)


def test_export_hf_writes_a_decoder_of_gpt_oss_choices_as_gpt_oss(tmp_path: Path) -> None:
    run = random_run(tmp_path, NATIVE)
    assert export_hf(run, tmp_path / "out") == "GptOssForCausalLM"
    _, model = load_trained_model(run)
    _loads_alike(tmp_path / "out", model)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["layer_types"] == [FULL, SLIDING, FULL] and written["attention_bias"] is True


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ("attention_sinks: true", "model.attention_sinks: False has no GPT-OSS equivalent"),
        ("activation: swiglu_clamped", "model.activation: 'swiglu' has no GPT-OSS equivalent"),
        ("moe: {experts: 3, top_k: 2, d_ff: 16}", "model.moe: None has no GPT-OSS equivalent"),
        ("moe: {experts: 3, top_k: 2, d_ff: 16}", ""),
    ],
)
def test_export_hf_refuses_what_gpt_oss_lacks_by_field(tmp_path: Path, edit: str, field: str) -> None:
    """A decoder written as GPT-OSS for one of its choices needs the others: sinks, the clamped
    SwiGLU, experts in every layer (the last row: dense layers refused)."""
    replaced = {
        "attention_sinks: true": "attention_sinks: false",
        "activation: swiglu_clamped": "activation: swiglu",
        "moe: {experts: 3, top_k: 2, d_ff: 16}": "moe: null"
        if field
        else "moe: {experts: 3, top_k: 2, d_ff: 16, dense_layers: [0]}",
    }[edit]
    run = random_run(tmp_path, NATIVE.replace(edit, replaced))
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert (field or "model.moe.dense_layers: [0] has no GPT-OSS equivalent") in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_a_classifier_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["gpt_oss"], "GptOssForSequenceClassification", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A GPT-OSS row, written back by export-hf unless it says otherwise."""
    return case("gpt_oss", **fields)


ALTERNATE = {"window.size": 5, "window.layers": [0, 2]}

CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        tie_word_embeddings=True,
        hidden_act="gelu",  # unread: the experts' clamped SwiGLU
        rms_norm_eps=1e-2,
        attention_dropout=0.3,
        initializer_range=0.5,
        router_aux_loss_coef=0.5,
        num_experts_per_tok=3,
        spec={
            "n_kv_heads": 1,
            "tie_embeddings": True,
            "activation": "swiglu_clamped",
            "norm.eps": 1e-2,
            "dropout.attention": 0.3,
            "moe.balance_loss": 0.5,
            "moe.top_k": 3,
        }
        | ALTERNATE,
    ),
    row(num_key_value_heads=4, spec={"n_kv_heads": 4}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),
    row(hidden_act="relu", spec={"activation": "swiglu_clamped"}, slow=True),  # unread
    row(json={"rms_norm_eps": DELETE}, spec={"norm.eps": 1e-5}, slow=True),  # GptOssConfig's
    # transformers 4 biases q, k, v and o whatever attention_bias says, and clamps at 7 scaling by 1.702
    row(outcome="attention_bias", attention_bias=False),
    row(json={"attention_bias": DELETE}, spec={"bias.qkv": True}, slow=True),
    row(outcome="swiglu_limit", json={"swiglu_limit": 5.0}),
    row(outcome="swiglu_alpha", json={"swiglu_alpha": 1.0}, slow=True),
    row(json={"swiglu_limit": 7.0, "swiglu_alpha": 1.702}, slow=True),
    # the window: layer_types' sliding layers, every other one (the first among them) where it has none
    row(json={"layer_types": DELETE}, spec=ALTERNATE),
    row(json={"layer_types": None}, spec=ALTERNATE, slow=True),
    row(layer_types=[FULL, SLIDING, SLIDING, FULL], spec={"window.layers": [1, 2]}, slow=True),
    row(layer_types=[SLIDING] * 4, spec={"window.size": 5, "window.layers": None}, slow=True),
    row(layer_types=[FULL] * 4, spec={"window": None}),
    row(outcome="layer_types", json={"layer_types": [SLIDING, FULL, "chunked_attention", FULL]}),
    row(sliding_window=2, spec={"window.size": 2}, slow=True),
    row(sliding_window=32, spec={"window": None}, slow=True),  # the whole context
    # a null window: GptOssModel builds the sliding mask from it all the same, and fails
    row(outcome="sliding_window", json={"sliding_window": None}),
    row(outcome="sliding_window", layer_types=[FULL] * 4, json={"sliding_window": None}, slow=True),
    row(json={"sliding_window": DELETE}, spec={"window": None}, slow=True),  # GptOssConfig's 128: the context
    # the RoPE: GptOssConfig's YaRN where the config names none
    row(
        json={"rope_parameters": DELETE},
        spec={"positional.scaling.factor": 32.0, "positional.theta": 150000.0},
    ),
    row(rope_parameters={"rope_type": "default", "rope_theta": 100.0}, spec={"positional.scaling": None}),
    row(rope_parameters={"rope_theta": 500.0, **YARN}, spec={"positional.scaling.factor": 4.0}, slow=True),
    row(
        rope_parameters={
            "rope_theta": 500.0,
            "rope_type": "yarn",
            "factor": 4.0,
            "truncate": True,
            "original_max_position_embeddings": 8,
        },
        spec={"positional.scaling.truncate": True},
        slow=True,
    ),
    row(json={"rope_parameters": DELETE, "rope_scaling": None}, spec={"positional.scaling.factor": 32.0}),
    row(outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=True),
    # the experts
    row(num_local_experts=2, num_experts_per_tok=2, spec={"moe.experts": 2}, slow=True),
    row(outcome="num_experts_per_tok", num_experts_per_tok=5, slow=True),
    row(
        json={"num_local_experts": DELETE, "num_experts": 4}, spec={"moe.experts": 4}, slow=True
    ),  # its alias
    row(router_aux_loss_coef=0.0, spec={"moe.balance_loss": 0.0}, slow=True),  # training only
    row(output_router_logits=True, slow=True),
    row(attention_dropout=0.3, spec={"dropout.attention": 0.3}, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=16, spec={"max_seq_len": 16}, slow=True),
    row(num_hidden_layers=2, spec={"window.layers": [0]}, slow=True),
    row(hidden_size=64, intermediate_size=40, spec={"d_model": 64, "d_ff": 40}, slow=True),
    row(head_dim=8, spec={"head_dim": 8}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(outcome="architectures", json={"architectures": ["GptOssForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to GptOssConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("gpt_oss", CASES) == set()


# Run in transformers 4.57: a tiny GPT-OSS (its experts widened, their biases random), saved as 4.57
# saves it (rope_scaling, no rope_parameters), with its logits on the saved ids.
SAVE_457 = r"""
import json, sys, torch, transformers as T
out = sys.argv[1]
torch.manual_seed(0)
config = T.GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=32, sliding_window=5,
                        bos_token_id=0, eos_token_id=0, pad_token_id=1)
model = T.GptOssForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        p.add_(torch.randn_like(p) * (1.5 if name.endswith("gate_up_proj") else 0.3))
ids = torch.randint(2, 64, (2, 20))
with torch.no_grad():
    logits = model(ids).logits.tolist()
model.save_pretrained(out)
json.dump({"version": T.__version__, "ids": ids.tolist(), "logits": logits}, open(f"{out}/logits.json", "w"))
"""
PYTHON_457 = os.environ.get("TFCOMPILE_TRANSFORMERS_457")


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
def test_a_folder_transformers_4_57_saved_imports_to_its_logits(tmp_path: Path) -> None:
    """gpt-oss's published folders were saved by transformers 4 (rope_scaling's YaRN, rope_theta)."""
    assert PYTHON_457 is not None
    subprocess.run([PYTHON_457, "-c", SAVE_457, str(tmp_path / "saved")], check=True)
    saved = json.loads((tmp_path / "saved" / "logits.json").read_text())
    assert saved["version"].startswith("4.57")
    result = import_folder(tmp_path / "saved", "saved", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.positional.scaling.factor == 32.0
    _, model = load_trained_model(result.run_dir)
    with torch.no_grad():
        logits = model.eval()(torch.tensor(saved["ids"]))
    theirs = torch.tensor(saved["logits"])
    assert ((logits - theirs).abs().max() / theirs.abs().max()).item() <= 1e-5  # float32, as the others
