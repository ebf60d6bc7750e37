"""StableLM (StableLM-3B-4E1T, StableLM 2, StableLM Zephyr): tiny random transformers models saved
with save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right
and not), its parameter counts and greedy generation; refused by export-hf by field (its gated
feed-forward has no GPT-NeoX equivalent); per-head q and k LayerNorms refused by name; and a row
for every field of StableLmConfig (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import VOCAB, Imported, perturb, write
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
from tfcompile.hf.exporter import architecture_for, export_hf
from tfcompile.hf.importer import import_folder

transformers = pytest.importorskip("transformers")
T = transformers

# StableLmConfig's num_key_value_heads is 32 whatever the heads: a tiny model names its own.
STABLELM = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
)
# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does.
TOKENS = dict(bos_token_id=0, eos_token_id=0)
FAMILIES |= {"stablelm": Family(T.StableLmConfig, T.StableLmForCausalLM, "gpt2", STABLELM | TOKENS)}


def stablelm(**fields: Any) -> Any:
    return T.StableLmForCausalLM(T.StableLmConfig(**STABLELM | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # StableLM-3B-4E1T's shape: sublayers in turn, no biases on the projections, a quarter of each
    # head rotated, untied
    "stablelm": lambda: stablelm(),
    # StableLM 2 1.6B's q, k and v biases, with one shared norm feeding both sublayers side by side
    "stablelm_qkv_bias_parallel": lambda: stablelm(
        use_qkv_bias=True, use_parallel_residual=True, tie_word_embeddings=False
    ),
    # grouped K/V heads (2 of 4), three quarters of each head rotated at a theta of its own, tied,
    # a GELU gate, another epsilon
    "stablelm_gqa_partial_tied": lambda: stablelm(
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.75},
        tie_word_embeddings=True,
        hidden_act="gelu",
        layer_norm_eps=1e-3,
    ),
    # linear RoPE scaling over the rotated quarter
    "stablelm_linear": lambda: stablelm(
        rope_parameters={
            "rope_type": "linear",
            "factor": 2.0,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        }
    ),
}


def imported_variant(root: Path, name: str) -> Imported:
    """The variant saved and imported (an HFWarning of the import is an error)."""

    def write_to(folder: Path) -> None:
        torch.manual_seed(0)
        write(perturb(VARIANTS[name]()), "gpt2", folder)

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

    plain, parallel = model("stablelm"), model("stablelm_qkv_bias_parallel")
    grouped, linear = model("stablelm_gqa_partial_tied"), model("stablelm_linear")
    assert (plain.block.type, plain.norm.type, plain.norm.bias, plain.activation) == (
        "sequential",
        "layernorm",
        True,
        "swiglu",
    )
    assert (plain.positional.layout, plain.positional.rotary_dims, plain.positional.theta) == (
        "halves",
        2,
        10000.0,
    )
    assert (plain.bias.qkv, plain.bias.attn_out, plain.bias.ffn, plain.bias.lm_head) == (False,) * 4
    assert (plain.n_kv_heads, plain.tie_embeddings, plain.qk_norm) == (4, False, False)
    assert (parallel.block.type, parallel.block.shared_norm, parallel.tie_embeddings) == (
        "parallel",
        True,
        False,
    )
    assert (parallel.bias.qkv, parallel.bias.attn_out, parallel.bias.ffn) == (True, False, False)
    assert (grouped.n_kv_heads, grouped.tie_embeddings, grouped.positional.rotary_dims) == (2, True, 6)
    assert (grouped.positional.theta, grouped.activation, grouped.norm.eps) == (500.0, "geglu", 1e-3)
    scaling = linear.positional.scaling
    assert (linear.positional.rotary_dims, scaling.type, scaling.factor) == (2, "linear", 2.0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_refuses_an_imported_stablelm_by_field(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """No architecture export-hf writes has a gated feed-forward among LayerNorm blocks: the spec is
    refused by its fields (the gate's among them, whichever writer's candidate it is), not a traceback,
    and nothing is written."""
    with pytest.raises(HFError) as error:
        architecture_for(imported[name].spec, "run")
    named = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert "model.activation" in named and all(n.startswith("model.") for n in named), str(error.value)
    with pytest.raises(HFError, match=r"model\.activation: '(swiglu|geglu)' has no \S+ equivalent"):
        export_hf(imported[name].result.run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_per_head_q_and_k_layernorms_are_refused_by_name(tmp_path: Path) -> None:
    """StableLM 2 12B's qk_layernorm: a LayerNorm of each head's own weights, which tfcompile's
    qk_norm (one scale shared by the heads) cannot hold; refused before anything is written."""
    torch.manual_seed(0)
    write(perturb(stablelm(qk_layernorm=True, num_key_value_heads=2)), "gpt2", tmp_path / "hf")
    with pytest.raises(HFError) as error:
        import_folder(tmp_path / "hf", "qk", tmp_path / "specs", tmp_path / "runs")
    message = str(error.value)
    assert "  qk_layernorm: is true: transformers' StableLM normalises each head's q and k" in message
    assert not (tmp_path / "runs" / "qk").exists() and not (tmp_path / "specs" / "qk.yaml").exists()


@pytest.mark.parametrize("parallel", [False, True])
def test_hidden_dropout_is_said_to_drop_the_attention_output_too(parallel: bool, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = stablelm(hidden_dropout=0.1, attention_dropout=0.2, use_parallel_residual=parallel)
    write(model, "gpt2", tmp_path / "hf")
    with pytest.warns(HFWarning, match="hidden_dropout 0.1: StableLM drops out the feed-forward's output"):
        result = import_folder(tmp_path / "hf", "drop", tmp_path / "specs", tmp_path / "runs")
    dropout = result.spec.model.dropout
    assert (dropout.residual, dropout.attention, dropout.embedding) == (0.1, 0.2, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stablelm", "stablelm_qkv_bias_parallel", "stablelm_gqa_partial_tied"])
def test_tfcompile_generate_gives_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts of different lengths, one left-padded batch in the bundle (ONNX, KV cache),
    each as transformers generates it alone."""
    imported[name].assert_generates_as_transformers(tmp_path, capsys)


# ------------------------------------------------------------------ every config field, by value


def rope(**fields: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": 10000.0, **fields}}


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)


def row(**fields: Any) -> Case:
    """A StableLM row: import only, so a spec it imports to is refused by export-hf."""
    return case("stablelm", exported=False, **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        use_qkv_bias=True,
        use_parallel_residual=True,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        hidden_act="gelu",
        layer_norm_eps=1e-3,
        hidden_dropout=0.2,
        attention_dropout=0.3,
        initializer_range=0.5,
        spec={
            "bias.qkv": True,
            "block.type": "parallel",
            "block.shared_norm": True,
            "n_kv_heads": 1,
            "tie_embeddings": True,
            "activation": "geglu",
            "norm.eps": 1e-3,
            "dropout.residual": 0.2,
            "dropout.attention": 0.3,
            "init_std": 0.5,
        },
    ),
    row(use_qkv_bias=True, spec={"bias.qkv": True, "bias.attn_out": False}, slow=True),
    row(use_parallel_residual=True, spec={"block.type": "parallel", "block.shared_norm": True}, slow=True),
    row(use_parallel_residual=False, spec={"block.type": "sequential"}, slow=True),
    # a LayerNorm of each head's own weights: tfcompile's qk_norm shares one among the heads
    row(outcome="qk_layernorm", qk_layernorm=True),
    row(outcome="qk_layernorm", qk_layernorm=True, use_parallel_residual=True, slow=True),
    row(num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=True),
    row(num_key_value_heads=2, spec={"n_kv_heads": 2}, slow=True),
    row(outcome="num_key_value_heads", num_key_value_heads=3),  # not a divisor of the heads
    # StableLmConfig's 32 where the config leaves it out, which 4 heads cannot group
    row(outcome="num_key_value_heads", json={"num_key_value_heads": DELETE}, slow=True),
    row(  # transformers fails on a null (32 heads, as many K/V heads as its default)
        outcome="num_key_value_heads",
        hidden_size=64,
        num_attention_heads=32,
        num_key_value_heads=32,
        **rope(partial_rotary_factor=1.0),
        json={"num_key_value_heads": None},
        slow=True,
    ),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(hidden_act="gelu", spec={"activation": "geglu"}, slow=True),
    row(hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
    row(hidden_act="swish", spec={"activation": "swiglu"}, slow=True),
    row(outcome="hidden_act", hidden_act="relu"),  # a gated ReLU is not in the spec
    row(layer_norm_eps=1e-3, spec={"norm.eps": 1e-3}, slow=True),
    row(hidden_dropout=0.2, attention_dropout=0.3, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    row(max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    row(num_hidden_layers=1, slow=True),
    row(num_attention_heads=1, num_key_value_heads=1, spec={"positional.rotary_dims": 8}, slow=True),
    row(intermediate_size=40, spec={"d_ff": 40}, slow=True),
    # RoPE: the rotated fraction (StableLmConfig's quarter where none is named) and theta in
    # rope_parameters (transformers 5), or at the top level (4's keys), and each scaling
    row(**rope(partial_rotary_factor=0.5), spec={"positional.rotary_dims": 4}),
    row(**rope(partial_rotary_factor=1.0), spec={"positional.rotary_dims": 8}, slow=True),
    row(json={"rope_parameters": DELETE}, spec={"positional.rotary_dims": 2}, slow=True),
    row(
        json={"rope_parameters": DELETE, "partial_rotary_factor": 0.75, "rope_theta": 77.0},
        spec={"positional.rotary_dims": 6, "positional.theta": 77.0},
    ),
    row(  # the dict's, over the top level's
        json={
            "partial_rotary_factor": 1.0,
            "rope_theta": 7.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 9.0, "partial_rotary_factor": 0.5},
        },
        spec={"positional.rotary_dims": 4, "positional.theta": 9.0},
        slow=True,
    ),
    # 3 of 8 dimensions: transformers' frequencies of an odd width are not RoPE's of any even one
    row(outcome="rope_parameters.partial_rotary_factor", **rope(partial_rotary_factor=0.375)),
    row(outcome="rope_parameters.partial_rotary_factor", **rope(partial_rotary_factor=0.1), slow=True),
    row(outcome="rope_parameters.partial_rotary_factor", json=rope(partial_rotary_factor=1.5), slow=True),
    row(**rope(rope_type="linear", factor=2.0, partial_rotary_factor=0.5), slow=True),
    row(**rope(rope_type="dynamic", factor=2.0, partial_rotary_factor=0.5)),
    row(**rope(**YARN, partial_rotary_factor=0.75), slow=True),
    row(**rope(**LLAMA3, original_max_position_embeddings=8, partial_rotary_factor=0.5), slow=True),
    row(json=rope(**longrope(1), partial_rotary_factor=0.25), slow=True),
    row(  # transformers 4's legacy dict, over rope_parameters, theta and fraction from the top level
        json={
            "rope_parameters": DELETE,
            "rope_scaling": {"type": "linear", "factor": 3.0},
            "rope_theta": 33.0,
            "partial_rotary_factor": 0.5,
        },
        spec={"positional.theta": 33.0, "positional.rotary_dims": 4, "positional.scaling.factor": 3.0},
        slow=True,
    ),
    # not StableLmConfig's, but read by its RoPE for the frequencies' width where the config has it
    # (the attention's heads are hidden_size / heads): the same width computes alike, another fails
    row(json={"head_dim": 8}, slow=True),
    row(json={"head_dim": 9}, spec={"positional.rotary_dims": 2}, slow=True),  # int(9 x 0.25) = 2
    row(outcome="head_dim", json={"head_dim": 16}),  # frequencies of 4 dimensions for 2: fails
    # int(6 x 0.5) = 3: as many frequencies as 4 dimensions take, at other rates
    row(outcome="head_dim", json={"head_dim": 6}, **rope(partial_rotary_factor=0.5), slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # hidden_dropout's placement: said, tested apart
        check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to StableLmConfig fails this until a row of CASES says what it
    does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES["stablelm"].base)
    covered |= set().union(*(c.fields() for c in CASES))
    assert _class_fields("stablelm") - covered == set()


def _activation_cases() -> list[Any]:
    from transformers.activations import ACT2CLS

    return [pytest.param(act, id=act, marks=pytest.mark.slow) for act in sorted(ACT2CLS)]


@pytest.mark.parametrize("value", _activation_cases())
def test_every_activation_name_is_computed_alike_or_refused_by_name(value: str, tmp_path: Path) -> None:
    try:
        stablelm(hidden_act=value)
    except Exception:  # transformers refuses it itself
        pytest.skip(f"transformers builds no model with hidden_act={value}")
    try:
        check(row(hidden_act=value), tmp_path)
    except HFError as error:  # refused by the import, which check does not expect of a SAME row
        assert "  hidden_act: " in str(error)
