"""ERNIE 4.5 MoE (``Ernie4_5_MoeForCausalLM``: ERNIE-4.5-21B-A3B, 300B-A47B): ERNIE 4.5's
attention (RoPE on interleaved pairs) with the top ``moe_k`` of a softmax over ``moe_num_experts``
experts of ``moe_intermediate_size``, chosen with the router's selection bias
(``mlp.moe_statics.e_score_correction_bias``: ``moe.selection_bias``) and renormalised, beside
``moe_num_shared_experts`` shared experts in one, in the layers ``moe_layer_start_index``,
``moe_layer_end_index`` and ``moe_layer_interval`` route. ``use_bias`` is refused: its experts have
no biases where its other feed-forwards do.

Tiny random transformers models saved with save_pretrained, imported, and held to transformers'
logits (float32, rows padded on the right and not), parameter counts and greedy generation through
the ONNX bundle; a row for every field of the config class."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_models import VOCAB, Imported, imported_variants, with_tensors
from test_hf_fields import DELETE, FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered
from test_hf_moe import PYTHON_457, assert_4_57_saved_imports

transformers = pytest.importorskip("transformers")
T = transformers

ERNIE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    moe_intermediate_size=16,
    moe_num_experts=6,
    moe_k=2,
    moe_num_shared_experts=1,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=None,  # transformers stops generating at one, the bundle check does not
    pad_token_id=1,
)
HEAD = "Ernie4_5_MoeForCausalLM"
FAMILIES["ernie4_5_moe"] = Family(T.Ernie4_5_MoeConfig, T.Ernie4_5_MoeForCausalLM, "gpt2", ERNIE)


def model(**fields: Any) -> Any:
    return T.Ernie4_5_MoeForCausalLM(T.Ernie4_5_MoeConfig(**ERNIE | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # ERNIE-4.5-21B-A3B's shape, shrunk: the first layer dense, the others routed, two shared experts
    "ernie4_5_moe": lambda: model(moe_num_shared_experts=2),
    # every other layer routed from the first (layers 1 and 3 of 4), no shared expert, tied
    "ernie4_5_moe_interval": lambda: model(
        num_hidden_layers=4,
        moe_layer_start_index=0,
        moe_layer_interval=2,
        moe_num_shared_experts=0,
        tie_word_embeddings=True,
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
    """transformers keeps each router's selection bias as a parameter, tfcompile as a buffer."""
    model = imported[name].spec.model
    assert model.moe is not None
    imported[name].assert_counts_match(unread=len(model.routed_layers(model.n_layers)) * model.moe.experts)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    ernie, interval = imported["ernie4_5_moe"].spec.model, imported["ernie4_5_moe_interval"].spec.model
    assert ernie.moe is not None and interval.moe is not None
    assert (ernie.positional.layout, ernie.bias.qkv, ernie.tie_embeddings) == ("interleaved", False, False)
    assert (ernie.moe.experts, ernie.moe.top_k, ernie.moe.d_ff, ernie.moe.normalize) == (6, 2, 16, True)
    assert (ernie.moe.scoring, ernie.moe.selection_bias, ernie.moe.groups, ernie.moe.scale) == (
        "softmax",
        True,
        None,
        1.0,
    )
    assert (ernie.moe.shared_d_ff, ernie.moe.dense_layers) == (32, [0])
    assert (interval.moe.shared_d_ff, interval.moe.dense_layers, interval.tie_embeddings) == (
        None,
        [0, 2],
        True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_the_multi_token_prediction_is_left_out_with_a_warning(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """The published checkpoints hold an MTP block (``model.mtp_block.0``, ``mtp_linear_proj.0``,
    ...), which transformers leaves unread (its _keys_to_ignore_on_load_unexpected), and the
    import too."""
    import torch

    from tfcompile.hf.errors import HFWarning
    from tfcompile.hf.importer import import_folder

    names = (
        "model.mtp_block.0.input_layernorm.weight",
        "model.mtp_linear_proj.0.weight",
        "model.mtp_emb_norm.0.weight",
    )
    folder = with_tensors(imported, "ernie4_5_moe", tmp_path, {name: torch.zeros(32) for name in names})
    with pytest.warns(HFWarning, match=r"left out 3 tensors of ERNIE 4.5's multi-token prediction"):
        import_folder(folder, "mtp", tmp_path / "specs", tmp_path / "runs")


# Run in transformers 4.57 (the published checkpoints were saved by 4): a tiny ERNIE 4.5 MoE, its
# weights and selection biases moved off their initial values, saved, with its logits.
SAVE_457 = r"""
import json, sys, torch, transformers as T
out = sys.argv[1]
torch.manual_seed(0)
ids = torch.randint(2, 64, (2, 12))
config = T.Ernie4_5_MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, moe_intermediate_size=16,
    moe_num_experts=6, moe_k=2, moe_num_shared_experts=2, tie_word_embeddings=False)
model = T.AutoModelForCausalLM.from_config(config).eval()
with torch.no_grad():
    for n, p in model.named_parameters():
        p.add_(torch.randn_like(p) * 0.05)
    logits = model(ids).logits.tolist()
model.save_pretrained(f"{out}/ernie4_5_moe")
saved = {"version": T.__version__, "ids": ids.tolist(), "ernie4_5_moe": logits}
json.dump(saved, open(f"{out}/logits.json", "w"))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not PYTHON_457, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
)
@pytest.mark.filterwarnings("ignore:.*has no tokenizer.json")
def test_a_folder_transformers_4_57_saved_imports_to_its_logits(tmp_path: Path) -> None:
    moe = assert_4_57_saved_imports(SAVE_457, tmp_path)["ernie4_5_moe"].model.moe
    assert moe is not None and moe.selection_bias


# ------------------------------------------------------------------ every config field, by value


def ernie(**fields: Any) -> Case:
    """A case of ERNIE 4.5 MoE, which export-hf does not write (import only)."""
    return case("ernie4_5_moe", exported=False, **fields)


CASES: list[Case] = [
    ernie(  # the fields that take any value at once: each row below sets one
        num_key_value_heads=1,
        hidden_act="gelu",
        rms_norm_eps=1e-2,
        initializer_range=0.5,
        spec={"n_kv_heads": 1, "activation": "geglu", "norm.eps": 1e-2},
    ),
    ernie(outcome="num_key_value_heads", json={"num_key_value_heads": None}, slow=True),  # transformers fails
    ernie(
        num_key_value_heads=4, json={"num_key_value_heads": DELETE}, spec={"n_kv_heads": 4}, slow=True
    ),  # the class's 4
    ernie(outcome="num_key_value_heads", num_key_value_heads=3),
    ernie(outcome="hidden_act", hidden_act="relu", slow=True),
    ernie(outcome="use_bias", use_bias=True),
    ernie(use_bias=False, slow=True),
    ernie(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    ernie(use_cache=False, slow=True),
    ernie(slow=True, **IDS),
    ernie(pad_token_id=None, slow=True),
    ernie(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    ernie(intermediate_size=24, spec={"d_ff": 24}, slow=True),
    ernie(vocab_size=VOCAB, slow=True),
    ernie(hidden_size=64, num_attention_heads=8, spec={"d_model": 64, "n_heads": 8}, slow=True),
    ernie(num_hidden_layers=2, slow=True),
    ernie(moe_intermediate_size=8, spec={"moe.d_ff": 8, "moe.shared_d_ff": 8}),
    ernie(moe_num_experts=4, spec={"moe.experts": 4}, slow=True),
    ernie(moe_k=1, spec={"moe.top_k": 1, "moe.normalize": True}, slow=True),
    ernie(json={"num_experts_per_tok": 1, "moe_k": 2}, spec={"moe.top_k": 1}, slow=True),  # the alias
    ernie(outcome="moe_k", moe_k=7, slow=True),
    ernie(moe_num_shared_experts=3, spec={"moe.shared_d_ff": 48}, slow=True),
    ernie(outcome="moe_num_shared_experts", json={"moe_num_shared_experts": -1}, slow=True),
    ernie(moe_layer_start_index=2, spec={"moe.dense_layers": [0, 1]}),
    ernie(moe_layer_end_index=1, spec={"moe.dense_layers": [0, 2]}, slow=True),  # layer 1 alone
    ernie(moe_layer_interval=2, spec={"moe.dense_layers": [0, 2]}, slow=True),  # layer 1 alone
    case("ernie4_5_moe", moe_layer_start_index=3, spec={"moe": None}, slow=True),  # dense: Llama writes it
    ernie(outcome="moe_layer_interval", json={"moe_layer_interval": 0}, slow=True),
    ernie(moe_norm_min=1e-13, slow=True),  # a floor on the chosen probabilities' sum below 1e-12: never acts
    ernie(outcome="moe_norm_min", moe_norm_min=0.3),  # it may: the selection bias chooses
    ernie(outcome="moe_norm_min", json={"moe_norm_min": None}, slow=True),  # transformers fails
    ernie(outcome="moe_layer_start_index", json={"moe_layer_start_index": None}, slow=True),
    ernie(outcome="moe_layer_end_index", json={"moe_layer_end_index": None}, slow=True),
    ernie(outcome="moe_layer_interval", json={"moe_layer_interval": float("nan")}, slow=True),
    ernie(outcome="moe_layer_start_index", json={"moe_layer_start_index": float("inf")}, slow=True),
    ernie(output_router_logits=True, slow=True),  # training only
    ernie(router_aux_loss_coef=0.01, spec={"moe.balance_loss": 0.01}, slow=True),
    ernie(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, spec={"positional.theta": 500.0}),
    ernie(outcome="architectures", json={"architectures": ["Ernie4_5_MoeForTokenClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to Ernie4_5_MoeConfig fails this until a row of CASES says what it
    does (or the tiny base sets it)."""
    assert uncovered("ernie4_5_moe", CASES) == set()
