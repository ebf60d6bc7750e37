"""OPT and GPT-BigCode: tiny random transformers models saved with save_pretrained, imported, and
held to transformers' logits (float32, rows padded on the right and not), its parameter counts,
its greedy generation (through a bundle and `tfcompile generate`), export-hf back to the
architecture that writes each spec (GPT-2 where GPT-2 can), and a row for every field of both
config classes (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import (
    VOCAB,
    Imported,
    from_pretrained,
    max_difference,
    perturb,
    write,
)
from test_hf_fields import (
    DELETE,
    FAMILIES,
    IDS,
    UNREAD,
    Case,
    Family,
    _class_fields,
    case,
    check,
    check_activation,
    every_activation,
)

from tfcompile.hf import exporter
from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import architecture_for, export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec import Spec, parse_spec

transformers = pytest.importorskip("transformers")
T = transformers

OPT_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=2,
    ffn_dim=24,
    max_position_embeddings=32,
    num_attention_heads=2,
)
BIGCODE_BASE = dict(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=4)
# The gpt2 tokenizer's <|endoftext|> is id 0: generation stops there, as the bundle's does.
TOKENS = dict(bos_token_id=0, eos_token_id=0)

# name -> (model, the head class export-hf writes its import as)
VARIANTS: dict[str, tuple[Callable[[], Any], str]] = {
    "opt": (  # OPT-125m's shape: pre-norm, final norm, ReLU, tied; GPT-2 writes it
        lambda: T.OPTForCausalLM(T.OPTConfig(**OPT_BASE, pad_token_id=1, **TOKENS)),
        "GPT2LMHeadModel",
    ),
    "opt_post": (  # OPT-350m's blocks: post-norm, no final norm
        lambda: T.OPTForCausalLM(
            T.OPTConfig(
                **OPT_BASE,
                do_layer_norm_before=False,
                activation_function="gelu",
                tie_word_embeddings=False,
                enable_bias=False,
                **TOKENS,
            )
        ),
        "OPTForCausalLM",
    ),
    "opt_no_final": (  # fine-tuned before transformers 4.20.1: pre-norm without the final norm
        lambda: T.OPTForCausalLM(T.OPTConfig(**OPT_BASE, _remove_final_layer_norm=True, **TOKENS)),
        "OPTForCausalLM",
    ),
    "bigcode": (  # StarCoder's shape: MQA, gelu_pytorch_tanh, tied
        lambda: T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(**BIGCODE_BASE, **TOKENS)),
        "GPTBigCodeForCausalLM",
    ),
    "bigcode_mha": (  # per-head [q, k, v] rows in c_attn; GPT-2 writes it
        lambda: T.GPTBigCodeForCausalLM(
            T.GPTBigCodeConfig(
                **BIGCODE_BASE,
                multi_query=False,
                tie_word_embeddings=False,
                scale_attn_weights=False,
                **TOKENS,
            )
        ),
        "GPT2LMHeadModel",
    ),
}


def imported_variant(root: Path, name: str) -> Imported:
    """The variant saved and imported (no tokenizer_config roles, which it warns of: said elsewhere)."""

    def write_to(folder: Path) -> None:
        torch.manual_seed(0)
        write(perturb(VARIANTS[name][0]()), "gpt2", folder)

    return Imported(root, name, write_to, "ignore")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("hf")
    return {name: imported_variant(root, name) for name in VARIANTS}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", ["opt", "opt_post"])
def test_left_padded_opt_rows_give_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    """OPT counts positions from the attention mask, as tfcompile's decoder does: a left-padded
    row (the runtime's batches) is encoded as it would be alone, in both."""
    imported[name].assert_left_padded_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    """Less OPT's two position rows before position 0's: only padding reads them (position -1)."""
    case = imported[name]
    case.assert_counts_match(2 * case.hf.config.hidden_size if name.startswith("opt") else 0)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def model(name: str) -> Any:
        return imported[name].spec.model

    pre, post, no_final = model("opt"), model("opt_post"), model("opt_no_final")
    assert (pre.norm.position, pre.norm.final, pre.activation, pre.tie_embeddings) == (
        "pre",
        True,
        "relu",
        True,
    )
    assert (pre.max_seq_len, pre.positional.type, pre.dropout.residual) == (32, "learned", 0.1)
    assert (post.norm.position, post.norm.final, post.bias.qkv, post.bias.ffn) == (
        "post",
        False,
        False,
        False,
    )
    assert (no_final.norm.position, no_final.norm.final) == ("pre", False)
    mqa, mha = model("bigcode"), model("bigcode_mha")
    assert (mqa.n_heads, mqa.n_kv_heads, mqa.activation) == (4, 1, "gelu_tanh")
    assert (mha.n_kv_heads, mha.attention_scale, mha.tie_embeddings) == (4, 1.0, False)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """The one architecture that writes the spec (GPT-2 for a GPT-2-shaped one), read by
    transformers with nothing missing or left over, to the run's logits."""
    case = imported[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # bigcode_mha's unscaled q.k in transformers 4: said
        assert export_hf(case.result.run_dir, tmp_path / "out") == VARIANTS[name][1]
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    for padded in (False, True):
        assert max_difference(reloaded, case.model, padded) <= 1e-5, (name, padded)


DECODER = "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 4, max_seq_len: 8"
ROPE = (
    f"{DECODER}, positional: rope, norm: {{type: rmsnorm}}, bias: {{qkv: false, attn_out: false, ffn: false}}"
)
OUTPUT = (
    f"{DECODER}, positional: rope, norm: {{type: rmsnorm, position: output}}, activation: swiglu, "
    "bias: {qkv: false, attn_out: false, ffn: false}"
)
# Hand-written specs -> the model_type of the one architecture whose candidate each is (decided by
# a learned-position decoder's MQA and norms, a RoPE decoder's embedding scale), and the fields its
# refusal names (none: it writes the spec).
NATIVE: dict[str, tuple[str, str, list[str]]] = {
    "pre-norm": (DECODER, "gpt2", []),
    "pre-norm-gqa": (f"{DECODER}, n_kv_heads: 2", "gpt2", ["model.n_kv_heads"]),
    "post-norm": (f"{DECODER}, norm: {{position: post}}", "opt", []),
    "no-final-norm": (f"{DECODER}, norm: {{final: false}}", "opt", []),
    "post-norm-gqa": (f"{DECODER}, norm: {{position: post}}, n_kv_heads: 2", "opt", ["model.n_kv_heads"]),
    "pre-norm-mqa": (f"{DECODER}, n_kv_heads: 1", "gpt_bigcode", []),
    "post-norm-mqa": (
        f"{DECODER}, norm: {{position: post}}, n_kv_heads: 1",
        "gpt_bigcode",
        ["model.norm.position", "model.norm.final"],
    ),
    "rmsnorm-mqa": (
        f"{DECODER}, norm: {{type: rmsnorm}}, n_kv_heads: 1",
        "gpt_bigcode",
        ["model.norm.type", "model.norm.bias"],
    ),
    "rope": (f"{ROPE}, activation: swiglu", "llama", []),
    "rope-relu": (f"{ROPE}, activation: relu", "llama", []),  # a plain feed-forward: as Arcee
    "rope-relu-qk_norm": (f"{ROPE}, activation: relu, qk_norm: true", "llama", ["model.qk_norm"]),
    # part of each head turned: Phi-3's, or GLM's with q, k and v biases or sandwich norms
    "rope-partial": (
        f"{DECODER}, positional: {{type: rope, rotary_dims: 2}}, norm: {{type: rmsnorm}}, "
        "activation: swiglu, bias: {qkv: false, attn_out: false, ffn: false}",
        "phi3",
        [],
    ),
    "rope-partial-qkv-bias": (
        f"{DECODER}, positional: {{type: rope, rotary_dims: 2}}, norm: {{type: rmsnorm}}, "
        "activation: swiglu, bias: {qkv: true, attn_out: true, ffn: false}",
        "glm",
        ["model.bias.attn_out"],
    ),
    # norms on each sublayer's output: EXAONE 4's with each head's q/k norms, else OLMo 2's
    "rope-output-qk_norm": (
        f"{OUTPUT}, qk_norm: true",
        "exaone4",
        [],
    ),
    "rope-output": (
        OUTPUT,
        "olmo2",
        ["model.qk_norm"],
    ),
    "rope-scale_embeddings": (f"{ROPE}, activation: geglu_tanh, scale_embeddings: true", "gemma", []),
    "rope-scale_embeddings-relu": (
        f"{ROPE}, activation: relu, scale_embeddings: true",
        "gemma",
        ["model.activation"],
    ),
}


@pytest.mark.parametrize("name", [*VARIANTS, *NATIVE])
def test_exactly_one_architecture_writes_each_spec(imported: dict[str, Imported], name: str) -> None:
    """So export-hf's choice does not hang on the order the architectures register in, and a
    refusal names only the problems of the architecture the spec is a candidate of."""
    if name in VARIANTS:
        spec, writer, refused = imported[name].spec, None, []
    else:
        model, model_type, refused = NATIVE[name]
        spec, writer = parse_spec(f"model: {{{model}}}\n"), ARCHITECTURES[model_type]
    candidates = exporter.candidates(spec)
    assert len(candidates) == 1 and writer in (None, candidates[0])
    if not refused:
        assert candidates == [architecture_for(spec, "run")]
        return
    with pytest.raises(HFError) as error:
        architecture_for(spec, "run")
    named = re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE)
    assert named == refused, str(error.value)


def test_a_gpt2_run_still_exports_as_gpt2(tmp_path: Path) -> None:
    torch.manual_seed(0)
    folder = tmp_path / "hf"
    config = T.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=1, n_head=2, **TOKENS)
    write(perturb(T.GPT2LMHeadModel(config)), "gpt2", folder)
    result = import_folder(folder, "gpt2", tmp_path / "specs", tmp_path / "runs")
    assert ARCHITECTURES["opt"].candidate(result.spec) is False
    assert ARCHITECTURES["gpt_bigcode"].candidate(result.spec) is False
    assert export_hf(result.run_dir, tmp_path / "out") == "GPT2LMHeadModel"


def test_an_exported_opt_imports_to_the_same_spec(imported: dict[str, Imported], tmp_path: Path) -> None:
    case = imported["opt_post"]
    export_hf(case.result.run_dir, tmp_path / "out")
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == case.spec.model


def _spec(imported: dict[str, Imported], name: str, **fields: Any) -> Spec:
    """The variant's spec with ``fields`` (dotted, under model) changed."""
    changes: dict[str, Any] = {}
    for dotted, value in fields.items():
        *path, last = ["model", *dotted.split(".")]
        node = changes
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return imported[name].spec.replace(changes)


@pytest.mark.parametrize(
    ("name", "fields", "refused"),
    [
        ("opt_post", {"norm.final": True}, "model.norm.final"),  # a post-norm OPT has no final norm
        ("opt_post", {"norm.eps": 1e-6}, "model.norm.eps"),  # nn.LayerNorm's default, not a field
        ("opt_post", {"n_kv_heads": 2, "n_heads": 4}, "model.n_kv_heads"),
        ("opt_post", {"attention_scale": 1.0}, "model.attention_scale"),
        ("opt_no_final", {"scale_output": True}, "model.scale_output"),  # no final norm to fold it into
        ("bigcode", {"norm.position": "post"}, "model.norm.position"),
        ("bigcode", {"norm.type": "rmsnorm"}, "model.norm.type"),
    ],
)
def test_a_spec_neither_architecture_writes_is_refused_by_field(
    imported: dict[str, Imported], name: str, fields: dict[str, Any], refused: str
) -> None:
    with pytest.raises(HFError, match=f"  {refused}: .* has no (OPT|GPT-BigCode) equivalent"):
        architecture_for(_spec(imported, name, **fields), "run")


def test_another_head_class_is_refused_by_name(imported: dict[str, Imported], tmp_path: Path) -> None:
    for name, head in (
        ("opt", "OPTForSequenceClassification"),
        ("bigcode", "GPTBigCodeForTokenClassification"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        config = json.loads((imported[name].folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"architectures": [head]}))
        for file in ("model.safetensors", "tokenizer.json"):
            (folder / file).write_bytes((imported[name].folder / file).read_bytes())
        with pytest.raises(HFError, match=f"  architectures: {head} is not a language model"):
            import_folder(folder, name, tmp_path / "specs", tmp_path / "runs")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["opt_post", "bigcode"])
def test_tfcompile_generate_gives_transformers_greedy_tokens(
    imported: dict[str, Imported], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two prompts of different lengths, one left-padded batch in the bundle, each as transformers
    generates it alone."""
    imported[name].assert_generates_as_transformers(tmp_path, capsys)


# ------------------------------------------------------------------ every config field, by value

FAMILIES.update(  # test_hf_fields' check builds a case's model from its FAMILIES
    {
        "opt": Family(T.OPTConfig, T.OPTForCausalLM, "gpt2", OPT_BASE),
        "gpt_bigcode": Family(T.GPTBigCodeConfig, T.GPTBigCodeForCausalLM, "gpt2", BIGCODE_BASE),
    }
)

CASES: list[Case] = [
    # ---------------------------------------------------------------------------- OPT
    case(  # the fields that take any value at once: each row below sets one
        "opt",
        activation_function="gelu_new",
        tie_word_embeddings=False,
        enable_bias=False,
        dropout=0.3,
        attention_dropout=0.2,
        init_std=0.5,
        layerdrop=0.2,
        spec={"activation": "gelu_tanh", "tie_embeddings": False, "bias.qkv": False, "dropout.residual": 0.3},
    ),
    case("opt", do_layer_norm_before=False, spec={"norm.position": "post", "norm.final": False}),
    case("opt", do_layer_norm_before=False, _remove_final_layer_norm=True, slow=True),
    case("opt", _remove_final_layer_norm=True, spec={"norm.position": "pre", "norm.final": False}),
    case(
        "opt",
        enable_bias=False,
        spec={"bias.qkv": False, "bias.attn_out": False, "bias.ffn": False},
        slow=True,
    ),
    case(  # one switch for every projection's bias; export-hf writes zeros where the post-norm model has none
        "opt", do_layer_norm_before=False, enable_bias=False, spec={"bias.ffn": False}, slow=True
    ),
    case("opt", activation_function="gelu", spec={"activation": "gelu"}, slow=True),
    case("opt", activation_function="silu", slow=True),
    case("opt", outcome="activation_function", activation_function="quick_gelu"),
    case("opt", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("opt", dropout=0.3, attention_dropout=0.2, spec={"dropout.attention": 0.2}, slow=True),
    case("opt", layerdrop=0.3, slow=True),  # training only (a warning says so)
    case("opt", init_std=0.5, spec={"init_std": 0.5}, slow=True),
    case("opt", init_std=0.0, spec={"init_std": 0.02}, slow=True),  # initialisation only
    case("opt", outcome="word_embed_proj_dim", word_embed_proj_dim=8),  # OPT-350m's project_in/out
    case("opt", word_embed_proj_dim=16, slow=True),
    case("opt", json={"word_embed_proj_dim": DELETE}, slow=True),  # the config class's hidden_size
    case("opt", outcome="layer_norm_elementwise_affine", layer_norm_elementwise_affine=False),
    case("opt", **IDS, slow=True),  # pad_token_id: the embedding's padding row is a row like the others
    case("opt", pad_token_id=None, slow=True),
    case("opt", use_cache=False, slow=True),
    case("opt", max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
    case("opt", num_attention_heads=1, slow=True),
    case("opt", num_attention_heads=8, slow=True),
    # ---------------------------------------------------------------------- GPT-BigCode
    case(  # the fields that take any value at once: each row below sets one
        "gpt_bigcode",
        n_inner=24,
        activation_function="relu",
        layer_norm_epsilon=1e-2,
        tie_word_embeddings=False,
        resid_pdrop=0.5,
        embd_pdrop=0.5,
        attn_pdrop=0.5,
        initializer_range=0.5,
        attention_softmax_in_fp32=False,
        scale_attention_softmax_in_fp32=False,
        spec={"d_ff": 24, "activation": "relu", "tie_embeddings": False, "n_kv_heads": 1},
    ),
    case("gpt_bigcode", multi_query=False, spec={"n_kv_heads": 4}),
    case("gpt_bigcode", multi_query=False, n_head=1, spec={"n_kv_heads": 1}, slow=True),
    case("gpt_bigcode", n_head=1, spec={"n_kv_heads": 1}, slow=True),  # MQA of one head is MHA
    case("gpt_bigcode", n_head=8, spec={"n_kv_heads": 1}, slow=True),
    case("gpt_bigcode", json={"num_key_value_heads": 2}, spec={"n_kv_heads": 1}, slow=True),  # derived
    case("gpt_bigcode", scale_attn_weights=False, spec={"attention_scale": 1.0}),
    case("gpt_bigcode", multi_query=False, scale_attn_weights=False, slow=True),
    # half-precision numerics only: float32 computes alike
    case("gpt_bigcode", attention_softmax_in_fp32=False, slow=True),
    case("gpt_bigcode", scale_attention_softmax_in_fp32=False, slow=True),
    case("gpt_bigcode", outcome="add_cross_attention", multi_query=False, add_cross_attention=True),
    case("gpt_bigcode", n_inner=24, spec={"d_ff": 24}, slow=True),
    case("gpt_bigcode", n_inner=None, spec={"d_ff": 64}, slow=True),
    case("gpt_bigcode", activation_function="gelu_new", slow=True),
    case("gpt_bigcode", activation_function="gelu", spec={"activation": "gelu"}, slow=True),
    case("gpt_bigcode", outcome="activation_function", activation_function="quick_gelu"),
    case("gpt_bigcode", layer_norm_epsilon=1e-2, slow=True),
    case("gpt_bigcode", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("gpt_bigcode", resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5, slow=True),
    case("gpt_bigcode", initializer_range=0.5, slow=True),
    case("gpt_bigcode", **IDS, slow=True),
    case("gpt_bigcode", use_cache=False, slow=True),
    case("gpt_bigcode", n_positions=8, spec={"max_seq_len": 8}, slow=True),
]


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


@pytest.mark.parametrize("c", _params(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize("model_type", ["opt", "gpt_bigcode"])
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to either config class fails this until a row of CASES says what
    it does (or the family's tiny base sets it)."""
    covered = set(UNREAD) | set(FAMILIES[model_type].base)
    covered |= set().union(*(c.fields() for c in CASES if c.family == model_type))
    assert _class_fields(model_type) - covered == set()


@pytest.mark.parametrize(("family", "value"), every_activation("opt", "gpt_bigcode"))
def test_every_activation_name_is_computed_alike_or_refused_by_name(
    family: str, value: str, tmp_path: Path
) -> None:
    check_activation(family, "activation_function", value, tmp_path)
