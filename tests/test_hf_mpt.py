"""MPT (``MptForCausalLM``): tiny random transformers models saved with save_pretrained, imported,
and held to transformers' logits (float32, rows padded on the right, on the left and not), its
parameter counts and greedy generation through the exported bundle; its ALiBi slopes against
transformers' for every head count to 256; export-hf refusing to write it (BLOOM, the one
architecture of ALiBi decoders, names what it lacks); a checkpoint's position table refused by the
tensor; a row for every field of MptConfig and of its attn_config (tests/test_hf_fields.py's table
and check), and each attn_config field left out or null, as test_hf_defaults.py does for the
top-level fields."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import VOCAB, Imported, imported_variants, perturb, write
from safetensors.torch import load_file, save_file
from test_hf_falcon_bloom import left_padded_difference
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
    edit_config,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.nn.positional import alibi_slopes

transformers = pytest.importorskip("transformers")
T = transformers

# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does (and
# MPT's GPT-NeoX tokenizer has it there too).
TOKENS = dict(bos_token_id=0, eos_token_id=0)
MPT = dict(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
FAMILIES["mpt"] = Family(T.MptConfig, T.MptForCausalLM, "gpt2", MPT | TOKENS)
CLIP = 0.05  # below the tiny models' largest q, k and v: the clip changes the outputs


def mpt(**fields: Any) -> Any:
    return T.MptForCausalLM(T.MptConfig(**MPT | TOKENS | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    # MPT-7B's shape: ALiBi of 4 heads (a power of two), no biases, tied
    "mpt": lambda: mpt(),
    # 6 heads (slopes of 4, then every other of 8), untied, another epsilon
    "mpt_6_heads_untied": lambda: mpt(
        d_model=48, n_heads=6, tie_word_embeddings=False, layer_norm_epsilon=1e-3
    ),
    # 5 heads, 3 layers, q, k and v clipped, q.k scaled by a softmax_scale of its own
    "mpt_5_heads_clip_scale": lambda: mpt(
        d_model=40, n_heads=5, n_layers=3, attn_config={"clip_qkv": CLIP, "softmax_scale": 0.5}
    ),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits_on_left_padded_rows(
    imported: dict[str, Imported], name: str
) -> None:
    """transformers' ALiBi counts each key's index in the padded row, tfcompile's its position among
    the real tokens: the same distances between real tokens."""
    variant = imported[name]
    assert left_padded_difference(variant.hf, variant.model) <= 1e-5


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_specs_say_what_each_model_is(imported: dict[str, Imported], name: str) -> None:
    model, config = imported[name].spec.model, imported[name].hf.config
    assert (model.positional.type, model.embedding_norm, model.block.type, model.activation) == (
        "alibi",
        False,
        "sequential",
        "gelu",
    )
    assert (model.n_heads, model.n_kv_heads, model.d_ff, model.tie_embeddings, model.max_seq_len) == (
        config.n_heads,
        config.n_heads,
        4 * config.d_model,
        config.tie_word_embeddings,
        config.max_seq_len,
    )
    assert (model.bias.qkv, model.bias.attn_out, model.bias.ffn, model.bias.lm_head) == (False,) * 4
    assert (model.norm.type, model.norm.position, model.norm.bias, model.norm.eps) == (
        "layernorm",
        "pre",
        False,
        config.layer_norm_epsilon,
    )
    scale = config.attn_config.softmax_scale
    assert model.attention_scale == pytest.approx(scale or model.head_dim**-0.5)
    assert model.qkv_clip == config.attn_config.clip_qkv


def test_the_clip_clamps_some_of_q_k_and_v(imported: dict[str, Imported]) -> None:
    """The clipped variant's first layer projects values past CLIP: a clip left out shows."""
    hf = imported["mpt_5_heads_clip_scale"].hf.transformer
    ids = torch.arange(12)[None]
    with torch.no_grad():
        qkv = hf.blocks[0].attn.Wqkv(hf.blocks[0].norm_1(hf.wte(ids)))
    assert qkv.abs().max() > CLIP


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_runtime_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """The bundle (ONNX, KV cache) decodes greedily as transformers' generate."""
    imported[name].assert_runtime_generates_as_transformers(tmp_path)


@pytest.mark.parametrize("heads", range(1, 257))
def test_the_alibi_slopes_are_mpts_for_every_head_count(heads: int) -> None:
    """transformers' float32 powers of 2 for its alibi_bias_max of 8 (the bias of the first of
    two keys, -slope): tfcompile's float32 slopes exactly up to 64 heads, within a float32
    rounding of the exact (float64) slopes past them."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    theirs, ours = -build_mpt_alibi_tensor(heads, 2)[:, 0, 0], alibi_slopes(heads)
    if heads <= 64:
        assert torch.equal(theirs, ours.float())
    torch.testing.assert_close(theirs.double(), ours, rtol=1e-7, atol=0)


def test_export_hf_writes_no_mpt(imported: dict[str, Imported], tmp_path: Path) -> None:
    """An ALiBi decoder is BLOOM's to write, which has no MPT's norms without a shift, its erf GELU
    or its missing embedding norm."""
    with pytest.raises(HFError) as error:
        export_hf(imported["mpt"].result.run_dir, tmp_path / "out")
    named = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert named == ["model.activation", "model.embedding_norm"], str(error.value)


def saved_copy(imported: dict[str, Imported], tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    write(imported["mpt"].hf, "gpt2", folder)
    return folder


def test_a_checkpoint_with_a_position_table_is_refused_by_the_tensor(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """learned_pos_emb is not read (transformers' MPT adds no position table): a checkpoint that
    holds one is the MosaicML code's of positions transformers does not compute."""
    folder = saved_copy(imported, tmp_path)
    weights = load_file(folder / "model.safetensors")
    save_file(weights | {"transformer.wpe.weight": torch.zeros(32, 32)}, folder / "model.safetensors")
    with pytest.raises(HFError, match=r"does not read: wpe\.weight"):
        import_folder(folder, "wpe", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "wpe").exists()


def test_attn_pdrop_drops_out_the_attention_and_each_sublayers_output(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """As transformers' MPT drops them out (resid_pdrop unread); transformers 5 refuses an attn_pdrop
    that is not an integer, 4 reads it, and the outputs are the same."""
    folder = saved_copy(imported, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["attn_config"] |= {"attn_pdrop": 0.3}
    (folder / "config.json").write_text(json.dumps(config | {"resid_pdrop": 0.1}))
    result = import_folder(folder, "drop", tmp_path / "specs", tmp_path / "runs")
    assert (result.spec.model.dropout.attention, result.spec.model.dropout.residual) == (0.3, 0.3)


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """An MPT row: export-hf writes none (an ALiBi decoder is BLOOM's, which refuses each)."""
    return case("mpt", exported=False, **fields)


def attn(**fields: Any) -> dict[str, Any]:
    """An attn_config of ``fields`` in config.json (transformers 5's types aside)."""
    return {"attn_config": fields}


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        tie_word_embeddings=False,
        layer_norm_epsilon=1e-3,
        attn_config={
            "clip_qkv": CLIP,
            "softmax_scale": 0.5,
            "attn_impl": "flash",
            "attn_uses_sequence_id": True,
        },
        resid_pdrop=0.2,
        emb_pdrop=0.1,
        embedding_fraction=0.5,
        learned_pos_emb=False,
        initializer_range=0.5,
        spec={"tie_embeddings": False, "norm.eps": 1e-3, "qkv_clip": CLIP, "attention_scale": 0.5},
    ),
    # ALiBi's slopes: head counts that are and are not powers of two
    row(n_heads=1, spec={"n_heads": 1}, slow=True),
    row(n_heads=2, spec={"n_heads": 2}, slow=True),
    row(d_model=48, n_heads=6, spec={"n_heads": 6}),
    row(d_model=40, n_heads=5, spec={"n_heads": 5}, slow=True),
    row(d_model=64, n_heads=16, spec={"n_heads": 16}, slow=True),
    row(outcome="n_heads", json={"n_heads": 5}),  # transformers fails: 32 is not 5 heads
    # MptConfig reads its attribute_map's names over d_model, n_heads and n_layers
    row(d_model=48, json={"d_model": 16, "hidden_size": 48}, spec={"d_model": 48, "d_ff": 192}, slow=True),
    row(n_heads=2, json={"n_heads": 4, "num_attention_heads": 2}, spec={"n_heads": 2}),
    row(n_layers=1, json={"n_layers": 2, "num_hidden_layers": 1}, spec={"n_layers": 1}, slow=True),
    row(n_layers=1, spec={"n_layers": 1}, slow=True),
    row(max_seq_len=8, spec={"max_seq_len": 8}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    row(json={"tie_word_embeddings": DELETE}, spec={"tie_embeddings": True}, slow=True),  # the default
    row(layer_norm_epsilon=1e-3, spec={"norm.eps": 1e-3}, slow=True),
    row(initializer_range=0.5, slow=True),
    row(initializer_range=0.0, slow=True),  # initialisation only: never read by an import
    row(use_cache=True, slow=True),
    row(slow=True, **IDS),
    row(pad_token_id=None, slow=True),
    # transformers builds a feed-forward 4 x d_model wide, no biases and LayerNorms whatever these say
    row(expansion_ratio=4, spec={"d_ff": 128}, slow=True),
    row(outcome="expansion_ratio", expansion_ratio=2),
    row(no_bias=True, slow=True),
    row(outcome="no_bias", no_bias=False),
    row(norm_type="layernorm", slow=True),
    row(outcome="norm_type", norm_type="rmsnorm"),
    row(outcome="norm_type", norm_type="low_precision_rmsnorm", slow=True),
    # the MosaicML code scales the logits by logit_scale, transformers does not
    row(logit_scale=None, slow=True),
    row(outcome="logit_scale", logit_scale=2.0),
    row(outcome="logit_scale", logit_scale="inv_sqrt_d_model", slow=True),
    # training only (the MosaicML code reads them, transformers none)
    row(resid_pdrop=0.2, emb_pdrop=0.1, embedding_fraction=0.5, slow=True),
    row(learned_pos_emb=False, slow=True),  # transformers adds no position table either way
    row(init_device="meta", slow=True),
    # attn_config: the clip (0: none, as transformers' truth test reads it) and the scale
    row(attn_config={"clip_qkv": CLIP}, spec={"qkv_clip": CLIP}, slow=True),
    row(attn_config={"clip_qkv": 0.0}, spec={"qkv_clip": None}, slow=True),
    row(outcome="attn_config.clip_qkv", attn_config={"clip_qkv": -1.0}),
    row(outcome="attn_config.clip_qkv", json=attn(clip_qkv="1.0"), slow=True),
    row(attn_config={"softmax_scale": 0.5}, spec={"attention_scale": 0.5}, slow=True),
    row(attn_config={"softmax_scale": None}, spec={"attention_scale": 1 / math.sqrt(8)}, slow=True),
    row(outcome="attn_config.softmax_scale", attn_config={"softmax_scale": 0.0}, slow=True),
    row(outcome="attn_config.softmax_scale", json=attn(softmax_scale=True)),
    row(attn_config={"attn_pdrop": 0}, spec={"dropout.attention": 0.0}, slow=True),
    row(attn_config={"attn_impl": "triton", "attn_uses_sequence_id": True}, slow=True),
    # attn_config: what transformers computes whatever it says, refused where MosaicML's differs
    row(attn_config={"alibi": True, "alibi_bias_max": 8}, slow=True),
    row(outcome="attn_config.alibi", attn_config={"alibi": False}),
    row(outcome="attn_config.alibi", json=attn(alibi=None), slow=True),  # transformers 5 refuses it
    row(outcome="attn_config.alibi_bias_max", attn_config={"alibi_bias_max": 16}),
    row(outcome="attn_config.attn_type", attn_config={"attn_type": "multiquery_attention"}),
    row(
        outcome="attn_config.attn_type",
        json=attn(attn_type="grouped_query_attention", kv_n_heads=2),
        slow=True,
    ),
    row(outcome="attn_config.qk_ln", attn_config={"qk_ln": True}),
    row(outcome="attn_config.prefix_lm", attn_config={"prefix_lm": True}, slow=True),
    row(json={"attn_config": DELETE}, spec={"qkv_clip": None}, slow=True),  # MptAttentionConfig's
    row(json={"attn_config": None}, slow=True),
    row(outcome="attn_config", json={"attn_config": "torch"}, slow=True),
    # llm-foundry's fields, which transformers does not read
    row(outcome="attn_config.rope", json=attn(alibi=False, rope=True), slow=True),
    row(outcome="attn_config.qk_gn", json=attn(qk_gn=True), slow=True),
    row(outcome="attn_config.sliding_window_size", json=attn(sliding_window_size=8)),
    row(json=attn(sliding_window_size=-1, rope=False, qk_gn=False), slow=True),
    row(outcome="ffn_config.ffn_type", json={"ffn_config": {"ffn_type": "mptglu"}}, slow=True),
    row(outcome="ffn_config.ffn_act_fn", json={"ffn_config": {"ffn_act_fn": {"name": "silu"}}}, slow=True),
    row(
        json={"ffn_config": {"ffn_type": "mptmlp", "ffn_act_fn": {"name": "gelu", "approximate": "none"}}},
        slow=True,
    ),
    row(json={"ffn_config": {"ffn_act_fn": {"name": "gelu"}}}, slow=True),  # torch's GELU: the erf one
    row(
        outcome="ffn_config.ffn_act_fn",
        json={"ffn_config": {"ffn_act_fn": {"name": "gelu", "approximate": "tanh"}}},
        slow=True,
    ),
    row(json={"verbose": 0, "init_config": {"name": "kaiming_normal_"}, "tokenizer_name": "gpt2"}, slow=True),
    # MosaicML's remote-code class (the published checkpoints' name); MPT's other heads
    row(json={"architectures": ["MPTForCausalLM"]}),
    row(outcome="architectures", json={"architectures": ["MptForSequenceClassification"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_every_config_field_has_a_case() -> None:
    """A field transformers adds to MptConfig fails this until a row of CASES says what it does
    (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES["mpt"].base)
    covered |= set().union(*(c.fields() for c in CASES))
    assert _class_fields("mpt") - covered == set()


def attn_fields() -> list[str]:
    """The fields of MptAttentionConfig, attn_config's class, less those every config has."""
    from transformers.models.mpt.configuration_mpt import MptAttentionConfig

    return sorted(set(MptAttentionConfig().to_dict()) - set(T.PretrainedConfig().to_dict()))


def test_every_attn_config_field_has_a_case() -> None:
    """The same for attn_config: a row sets each of its fields."""
    dicts = [
        d["attn_config"] for c in CASES for d in (c.edits, c.json) if isinstance(d.get("attn_config"), dict)
    ]
    assert set(attn_fields()) - set().union(*dicts) == set()


# attn_config's fields that import at other values than MptAttentionConfig's, each left out in turn.
SET = {"clip_qkv": CLIP, "softmax_scale": 0.5, "attn_impl": "flash", "attn_uses_sequence_id": True}


def saved_attn(folder: Path, name: str, value: Any) -> dict[str, Any]:
    """A tiny MPT of the SET attn_config saved into ``folder``; its attn_config with ``name`` set to
    ``value`` (DELETE: left out)."""
    torch.manual_seed(0)
    write(perturb(mpt(attn_config=SET)), "gpt2", folder)
    fields = json.loads((folder / "config.json").read_text())["attn_config"]
    return {k: v for k, v in fields.items() if k != name} | ({} if value is DELETE else {name: value})


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[] if n == "clip_qkv" else [pytest.mark.slow]) for n in attn_fields()]
)
def test_an_attn_config_field_left_out_imports_as_transformers_reads_it(name: str, tmp_path: Path) -> None:
    """As test_hf_defaults.py does for the top-level fields: transformers reads the class's default,
    and the import computes as it does, with the spec of the field as transformers read it."""
    from test_hf_defaults import check_left_out

    folder = tmp_path / "left_out"
    fields = saved_attn(folder, name, DELETE)
    check_left_out("mpt", ("attn_config",), folder, tmp_path, value=fields)


@pytest.mark.slow
@pytest.mark.parametrize("name", attn_fields())
def test_a_null_attn_config_field_imports_as_left_out_or_is_an_hf_error(name: str, tmp_path: Path) -> None:
    """transformers 5 refuses a null but for clip_qkv and softmax_scale (none, their default) and 4
    reads it as the default: the import reads it as left out, but for a null flag whose default is
    true (alibi), an HFError naming it."""
    spec = dict[str, Any]()
    for value in (None, DELETE):
        folder = tmp_path / str(value is None)
        fields = saved_attn(folder, name, value)
        edit_config(folder, {"attn_config": fields})
        if value is None and name == "alibi":
            with pytest.raises(HFError, match=r"  attn_config\.alibi: is null"):
                import_folder(folder, "null", tmp_path / "specs", tmp_path / "runs")
            return
        result = import_folder(folder, str(value is None), tmp_path / "specs", tmp_path / "runs")
        spec[str(value is None)] = result.spec.model.model_dump()
    assert spec["True"] == spec["False"]
