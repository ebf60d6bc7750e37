"""DBRX (``DbrxForCausalLM``): LLaMA's blocks with LayerNorms that learn no shift, q, k and v
clamped to ``attn_config.clip_qkv``, every layer routed among SwiGLU experts stacked in ``w1``,
``v1`` and ``w2`` (the top ``ffn_config.moe_top_k`` of a softmax, rescaled by their 1-norm); the
config nests the attention's fields in ``attn_config`` and the experts' in ``ffn_config``.

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; a refusal names the nested field as the file has it; a row for every field of the
config class and of its two nested ones; a folder transformers 4.57 saved (the Hub's: a theta in
``attn_config`` alone, which transformers 5 ignores) imports to 4.57's logits."""

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
from hf_models import VOCAB, Imported, copied, edited, imported_variants, max_difference
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# transformers 5's DBRX attention fails without attn_config.rope_theta, and turns RoPE at the
# top-level rope_parameters' theta: both set alike, so that 5 computes what 4 does.
ATTN = {"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 10000.0}
FFN = {"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2}
DBRX = dict(
    vocab_size=VOCAB,
    d_model=32,
    n_heads=4,
    n_layers=2,
    max_seq_len=32,
    attn_config=ATTN,
    ffn_config=FFN,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
FAMILIES["dbrx"] = Family(T.DbrxConfig, T.DbrxForCausalLM, "gpt2", DBRX)


def attn(**fields: Any) -> dict[str, Any]:
    return {"attn_config": ATTN | fields}


def ffn(**fields: Any) -> dict[str, Any]:
    return {"ffn_config": FFN | fields}


def model(**fields: Any) -> Any:
    return T.DbrxForCausalLM(T.DbrxConfig(**DBRX | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # DBRX's shape, shrunk: top 2 of 4 experts rescaled, grouped K/V heads, q, k and v clamped
    "dbrx": lambda: model(),
    # the top 1 of 3 as the softmax gave it (no rescaling), a head per K/V head, a clamp that clamps
    # nothing (transformers 5 fails without one), GELU experts, theta 500000 (DBRX's) in both places
    "dbrx_plain": lambda: model(
        **attn(kv_n_heads=4, clip_qkv=100.0, rope_theta=500000.0),
        **ffn(moe_num_experts=3, moe_top_k=1, moe_normalize_expert_weights=None, ffn_act_fn={"name": "gelu"}),
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
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
    dbrx, plain = imported["dbrx"].spec.model, imported["dbrx_plain"].spec.model
    assert dbrx.moe is not None and plain.moe is not None
    assert (dbrx.norm.type, dbrx.norm.bias, dbrx.norm.scale, dbrx.norm.eps) == (
        "layernorm",
        False,
        True,
        1e-5,
    )
    assert (dbrx.n_kv_heads, dbrx.qkv_clip, dbrx.d_ff, dbrx.activation) == (2, 0.5, 16, "swiglu")
    assert (dbrx.moe.experts, dbrx.moe.top_k, dbrx.moe.normalize, dbrx.moe.balance_loss) == (4, 2, True, 0.01)
    assert (plain.n_kv_heads, plain.qkv_clip, plain.activation) == (4, 100.0, "geglu")
    assert (plain.moe.experts, plain.moe.top_k, plain.moe.normalize) == (3, 1, False)
    assert plain.positional.theta == 500000.0  # type: ignore[union-attr]


def test_the_router_rescales_the_top_k_by_their_sum(imported: dict[str, Imported]) -> None:
    """With the last layer's router sharpened (the top 2's weights far apart), the logits are still
    transformers': the 1-norm rescaling is the spec's ``normalize``."""
    variant = imported["dbrx"]
    hf, ours = variant.hf, variant.model
    with torch.no_grad():
        hf.transformer.blocks[1].ffn.router.layer.weight.mul_(20)
        ours.state_dict()["blocks.1.ffn.router.weight"].mul_(20)
    try:
        for padded in (False, True):
            assert max_difference(hf, ours, padded) <= 1e-5
    finally:
        with torch.no_grad():
            hf.transformer.blocks[1].ffn.router.layer.weight.div_(20)
            ours.state_dict()["blocks.1.ffn.router.weight"].div_(20)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (attn(kv_n_heads=3), "attn_config.kv_n_heads"),
        (ffn(moe_normalize_expert_weights=2.0), "ffn_config.moe_normalize_expert_weights"),
        (ffn(ffn_act_fn={"name": "relu"}), "ffn_config.ffn_act_fn.name"),
        (ffn(ffn_act_fn="silu"), "ffn_config.ffn_act_fn"),
        (ffn(moe_top_k=5), "ffn_config.moe_top_k"),
        ({"attn_config": {"kv_n_heads": 2, "clip_qkv": 0.5}}, "attn_config.rope_theta"),
        ({"attn_config": [2]}, "attn_config"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"resid_pdrop": "0.1"}, "resid_pdrop"),
    ],
    ids=[
        "kv-heads",
        "2-norm",
        "relu",
        "act-not-object",
        "top-k",
        "no-theta",
        "attn-not-object",
        "tied",
        "dropout",
    ],
)
def test_a_nested_field_is_refused_by_its_name_in_the_file(
    imported: dict[str, Imported], fields: dict[str, Any], named: str, tmp_path: Path
) -> None:
    folder = edited(imported, "dbrx", tmp_path, **fields)
    with pytest.raises(HFError) as error:
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")
    assert re.search(
        rf"^  {re.escape(named)}( \(the spec's [a-z_.]+\))?: ", str(error.value), re.MULTILINE
    ), str(error.value)
    assert not (tmp_path / "runs" / "wrong").exists()


def test_a_2_norm_of_one_expert_is_its_sum(imported: dict[str, Imported], tmp_path: Path) -> None:
    """One chosen expert's weight is 1 under any norm: the top 1 imports whatever p is."""
    folder = edited(imported, "dbrx", tmp_path, **ffn(moe_top_k=1, moe_normalize_expert_weights=2.0))
    spec = import_folder(folder, "top1", tmp_path / "specs", tmp_path / "runs").spec
    assert spec.model.moe is not None and (spec.model.moe.top_k, spec.model.moe.normalize) == (1, True)


def test_stacked_experts_of_another_width_are_an_hf_error(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = edited(imported, "dbrx", tmp_path, **ffn(ffn_hidden_size=8))
    with pytest.raises(HFError, match=r"experts\.mlp\.w1 has shape \(64, 32\), not \(32, 32\)"):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")


def test_a_theta_transformers_5_reads_otherwise_is_warned_of(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """The Hub's config: a theta in attn_config alone. transformers 5 turns RoPE at 10000 there;
    the import at the model's own theta, and says so."""
    folder = copied(imported, "dbrx_plain", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["rope_parameters"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.warns(
        HFWarning,
        match=r"transformers 4 turns it at theta 500000\.0 \(attn_config\.rope_theta\), 5 at 10000\.0",
    ):
        spec = import_folder(folder, "hub", tmp_path / "specs", tmp_path / "runs").spec
    assert spec.model.positional.theta == 500000.0  # type: ignore[union-attr]


def test_export_hf_refuses_a_dbrx_by_field(imported: dict[str, Imported], tmp_path: Path) -> None:
    with pytest.raises(HFError, match=r"  model\.moe: "):
        export_hf(imported["dbrx"].result.run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A row of DBRX's: it imports only (export-hf writes no DBRX)."""
    return case("dbrx", exported=False, **fields)


CASES: list[Case] = [
    row(**attn(kv_n_heads=4), spec={"n_kv_heads": 4}),
    row(**attn(kv_n_heads=1), spec={"n_kv_heads": 1}, slow=True),
    row(**attn(clip_qkv=0.1), spec={"qkv_clip": 0.1}, slow=True),
    row(**attn(attn_pdrop=0.3), spec={"dropout.attention": 0.3}, slow=True),  # training only
    row(**ffn(ffn_hidden_size=24), spec={"d_ff": 24}, slow=True),
    row(**ffn(ffn_act_fn={"name": "gelu_pytorch_tanh"}), spec={"activation": "geglu_tanh"}, slow=True),
    row(**ffn(moe_num_experts=3), spec={"moe.experts": 3}, slow=True),
    row(**ffn(moe_top_k=1), spec={"moe.top_k": 1, "moe.normalize": True}),
    row(**ffn(moe_top_k=4), spec={"moe.top_k": 4}, slow=True),
    row(**ffn(moe_normalize_expert_weights=None), spec={"moe.normalize": False}),
    row(**ffn(moe_jitter_eps=0.01), slow=True),  # training only: the router's input jittered
    row(**ffn(moe_loss_weight=0.05), spec={"moe.balance_loss": 0.05}, slow=True),
    row(**ffn(hidden_size=32), slow=True),  # DbrxConfig sets it to d_model
    row(resid_pdrop=0.2, spec={"dropout.residual": 0.2}, slow=True),  # training only
    row(emb_pdrop=0.2, slow=True),  # unread by transformers
    row(initializer_range=0.5, slow=True),
    row(output_router_logits=True, slow=True),  # training only: the loss's balance term
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(tie_word_embeddings=False, slow=True),
    row(max_seq_len=8, spec={"max_seq_len": 8}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(d_model=64, n_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    row(n_layers=1, spec={"n_layers": 1}, slow=True),
    row(
        **attn(rope_theta=500.0),
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        spec={"positional.theta": 500.0},
    ),
    row(outcome="ffn_config.moe_top_k", **ffn(moe_top_k=5), slow=True),
    row(outcome="architectures", json={"architectures": ["DbrxForSequenceClassification"]}, slow=True),
    # DbrxConfig writes it from attn_config.kv_n_heads, and reads that
    row(json={"num_key_value_heads": 1}, spec={"n_kv_heads": 2}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to DbrxConfig fails this until a row of CASES says what it does
    (or the tiny base sets it)."""
    assert uncovered("dbrx", CASES) == set()


@pytest.mark.parametrize("section", ["attn_config", "ffn_config"])
def test_every_nested_field_has_a_case(section: str) -> None:
    """A field transformers adds to DbrxAttentionConfig or DbrxFFNConfig fails this until a row of
    CASES sets it (or the tiny base does)."""
    fields = set(type(getattr(T.DbrxConfig(), section))().to_dict()) - set(T.PretrainedConfig().to_dict())
    covered = {name for c in CASES for name in c.edits.get(section, {})} | set(DBRX[section])
    assert fields - covered == set()


# Run in transformers 4.57: tiny DBRXs as the Hub's are (the theta in attn_config alone), one of
# them unclamped (transformers 5 fails without a clip_qkv), their weights moved off their initial
# values, saved, with their logits on the saved ids.
SAVE_457 = r"""
import json, sys, torch, transformers as T
out = sys.argv[1]
torch.manual_seed(0)
ids = torch.randint(2, 64, (2, 12))
results = {"version": T.__version__, "ids": ids.tolist()}
for name, clip in (("hub", 8.0), ("unclamped", None)):
    config = T.DbrxConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=32,
        attn_config={"kv_n_heads": 2, "clip_qkv": clip, "rope_theta": 500000.0},
        ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2})
    model = T.DbrxForCausalLM(config).eval()
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
@pytest.mark.filterwarnings("ignore:.*has no tokenizer.json")
def test_folders_transformers_4_57_saved_import_to_its_logits(tmp_path: Path) -> None:
    """The published DBRX checkpoints were saved by transformers 4: a theta of 500000 in
    attn_config, no rope_parameters. The import computes 4.57's logits (and warns that 5 turns
    RoPE at 10000), clamped or not."""
    assert PYTHON_457 is not None
    subprocess.run([PYTHON_457, "-c", SAVE_457, str(tmp_path / "saved")], check=True)
    saved = json.loads((tmp_path / "saved" / "logits.json").read_text())
    assert saved["version"].startswith("4.57")
    for name, clip in (("hub", 8.0), ("unclamped", None)):
        with pytest.warns(HFWarning, match=r"5 at 10000\.0"):
            result = import_folder(tmp_path / "saved" / name, name, tmp_path / "specs", tmp_path / "runs")
        spec, ours = load_trained_model(result.run_dir)
        assert spec.model.qkv_clip == clip
        with torch.no_grad():
            logits = ours.eval()(torch.tensor(saved["ids"]))
        torch.testing.assert_close(logits, torch.tensor(saved[name]), atol=1e-5, rtol=1e-5, msg=name)
