"""CodeGen (``CodeGenForCausalLM``: CodeGen-350M to 16B, mono, multi and nl): GPT-J's blocks (one
shared LayerNorm feeding attention and the feed-forward side by side, interleaved RoPE on the first
``rotary_dim`` dimensions of each head, an LM head with a bias) with q, k and v in one
``qkv_proj`` laid out for four model-parallel shards: each quarter of its rows a quarter of the
queries, then of the values, then of the keys. Tiny random transformers models saved with
save_pretrained, imported, and held to transformers' logits (float32, rows padded on the right and
not), their parameter counts and greedy generation through the ONNX bundle; import only (export-hf
refuses GPT-J's shared norm by field). A row for every field of CodeGenConfig
(tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import VOCAB, Imported, assert_head_refused, imported_variants
from test_hf_fields import FAMILIES, IDS, Case, Family, _pytest_cases, case, check, uncovered

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf

transformers = pytest.importorskip("transformers")
T = transformers

# No eos: transformers stops generating at one, the bundle check does not.
TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
CODEGEN = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=32, n_ctx=32)
FAMILIES["codegen"] = Family(T.CodeGenConfig, T.CodeGenForCausalLM, "gpt2", CODEGEN | TOKENS)


def codegen(**fields: Any) -> Any:
    return T.CodeGenForCausalLM(T.CodeGenConfig(**CODEGEN | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # CodeGen-350M's shape, shrunk: a quarter of each head turned, untied, GPT-2's tanh GELU
    "codegen": lambda: codegen(),
    # eight heads of 8 (two per shard), the whole head turned, tied, a narrower feed-forward
    "codegen_wide": lambda: codegen(n_embd=64, n_head=8, rotary_dim=8, n_inner=96, tie_word_embeddings=True),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # a parallel block's dropout: said, tested apart
        return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match(length=20)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


def test_the_shards_queries_keys_and_values_are_read_in_order(imported: dict[str, Imported]) -> None:
    """The spec's q rows are each shard's first quarter, its k rows each shard's third, its v rows
    each shard's second: held to the checkpoint's qkv_proj row by row."""
    variant = imported["codegen_wide"]
    fused = variant.hf.transformer.h[0].attn.qkv_proj.weight  # (3 x 64, 64): 4 shards of (q, v, k)
    shards = fused.view(4, 3, 16, 64)
    expected = torch.cat(
        [shards[:, 0].reshape(64, 64), shards[:, 2].reshape(64, 64), shards[:, 1].reshape(64, 64)]
    )
    torch.testing.assert_close(
        variant.model.state_dict()["blocks.0.attn.qkv.weight"], expected, rtol=0, atol=0
    )


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, wide = imported["codegen"].spec.model, imported["codegen_wide"].spec.model
    assert (plain.block.type, plain.block.shared_norm, plain.positional.layout) == (
        "parallel",
        True,
        "interleaved",
    )
    assert (plain.positional.rotary_dims, plain.bias.lm_head, plain.bias.qkv, plain.tie_embeddings) == (
        4,
        True,
        False,
        False,
    )
    assert (wide.positional.rotary_dims, wide.d_ff, wide.tie_embeddings, wide.activation) == (
        8,
        96,
        True,
        "gelu_tanh",
    )


def test_export_hf_refuses_the_shared_norm_by_field(imported: dict[str, Imported], tmp_path: Path) -> None:
    with pytest.raises(HFError, match=r"model\.block\.shared_norm"):
        export_hf(imported["codegen"].result.run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path, new=12)


def test_another_head_is_refused_by_architectures(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert_head_refused(imported["codegen"], "GPTJForCausalLM", tmp_path)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """A CodeGen row: import only, so a spec it imports to is refused by export-hf."""
    return case("codegen", exported=False, **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        rotary_dim=8,
        n_inner=40,
        activation_function="relu",
        layer_norm_epsilon=1e-3,
        tie_word_embeddings=True,
        resid_pdrop=0.3,
        embd_pdrop=0.2,
        attn_pdrop=0.1,
        initializer_range=0.5,
        spec={
            "positional.rotary_dims": 8,
            "d_ff": 40,
            "activation": "relu",
            "tie_embeddings": True,
            "dropout.residual": 0.3,
        },
    ),
    row(rotary_dim=8, spec={"positional.rotary_dims": 8}, slow=True),  # the whole head
    row(rotary_dim=2, spec={"positional.rotary_dims": 2}, slow=True),
    row(outcome="rotary_dim", json={"rotary_dim": 3}),  # transformers fails on an odd width
    row(outcome="rotary_dim", json={"rotary_dim": 16}, slow=True),  # more than a head
    row(outcome="rotary_dim", json={"rotary_dim": None}, slow=True),  # a table of n_embd: fails
    row(n_inner=None, spec={"d_ff": 128}, slow=True),
    row(activation_function="gelu", spec={"activation": "gelu"}, slow=True),
    row(outcome="activation_function", activation_function="quick_gelu", slow=True),
    row(layer_norm_epsilon=1e-3, slow=True),
    row(tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=True),
    row(resid_pdrop=0.3, embd_pdrop=0.2, attn_pdrop=0.1, slow=True),  # training only
    row(initializer_range=0.5, slow=True),
    row(use_cache=False, slow=True),
    row(slow=True, **IDS),
    row(n_positions=8, spec={"max_seq_len": 8}, slow=True),
    row(n_ctx=8, slow=True),  # unread: the context is n_positions
    row(n_layer=1, slow=True),
    row(vocab_size=VOCAB, slow=True),
    # heads that do not fill a shard: transformers 5 splits the shards by width alone
    row(n_embd=24, n_head=6, rotary_dim=4, spec={"n_heads": 6}, slow=True),
    row(outcome="n_embd", json={"n_embd": 30}, slow=True),  # no four equal shards
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # a parallel block's dropout: said, tested apart
        check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to CodeGenConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    assert uncovered("codegen", CASES) == set()
