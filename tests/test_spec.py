"""Valid specs: defaults resolved at load time, presets, overrides, a lossless resolved copy."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT, tiny_model
from pydantic import ValidationError

from tfcompile.spec import PRESETS, SpecError, dump_spec, load_spec, parse_spec
from tfcompile.spec.presets import merge
from tfcompile.spec.schema import check_run_name


@pytest.mark.parametrize(
    ("activation", "d_model", "multiple_of", "d_ff"),
    [
        ("relu", 64, 64, 256),
        ("gelu", 384, 64, 1536),
        ("swiglu", 384, 64, 1024),  # 8/3 * 384 = 1024 exactly
        ("swiglu", 4096, 256, 11008),  # LLaMA 7B
        ("geglu", 100, 64, 320),  # 266.7 rounded up to a multiple of 64
        ("geglu", 100, 1, 267),
    ],
)
def test_d_ff_default_per_activation(activation: str, d_model: int, multiple_of: int, d_ff: int) -> None:
    spec = tiny_model(activation=activation, d_model=d_model, n_heads=4, d_ff_multiple_of=multiple_of)
    assert spec.d_ff == d_ff


def test_explicit_d_ff_wins() -> None:
    assert tiny_model(activation="swiglu", d_ff=100).d_ff == 100


def test_resolved_defaults() -> None:
    spec = tiny_model()
    assert spec.n_kv_heads == spec.n_heads
    assert spec.norm.bias is True and spec.norm.final is True
    rms_post = tiny_model(norm={"type": "rmsnorm", "position": "post"})
    assert rms_post.norm.bias is False and rms_post.norm.final is False


def test_a_whole_spec_validates_with_every_section() -> None:
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml")
    assert spec.task.type == "causal_lm"
    assert spec.train.steps == 5000 and spec.context_length == 256
    assert spec.data is not None and spec.data.path.is_absolute()
    assert spec.data.path.name == "tinyshakespeare.txt"
    assert spec.export.opset >= 17


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_alone(name: str) -> None:
    spec = parse_spec(f"preset: {name}\nmodel: {{}}\n")
    assert spec.preset == name
    assert spec.model.max_seq_len if spec.model.family == "vit" else spec.model.vocab_size


def test_spec_overrides_preset_key_by_key() -> None:
    spec = parse_spec(
        "preset: llama\nmodel:\n  d_model: 256\n  n_layers: 2\n  n_heads: 4\n  norm: {eps: 1.0e-5}\n"
    )
    assert spec.model.d_model == 256 and spec.model.n_heads == 4
    assert spec.model.norm.type == "rmsnorm" and spec.model.norm.eps == 1e-5  # merged, not replaced
    assert spec.model.positional.type == "rope"
    assert spec.model.d_ff == 768  # 8/3 * 256 = 682.7, rounded up to the preset's multiple of 256


def test_changing_a_variant_type_replaces_the_preset_variant() -> None:
    spec = parse_spec("preset: llama\nmodel:\n  positional: {type: learned}\n")
    assert spec.model.positional.type == "learned"
    assert merge({"p": {"type": "rope", "theta": 1}}, {"p": {"type": "learned"}}) == {
        "p": {"type": "learned"}
    }


def test_overrides_apply_last_and_parse_as_yaml() -> None:
    text = (ROOT / "specs" / "shakespeare-char.yaml").read_text()
    spec = parse_spec(text, overrides=["train.steps=100", "model.positional={type: rope, theta: 500}"])
    assert spec.train.steps == 100
    assert spec.model.positional.type == "rope" and spec.model.positional.theta == 500


def test_dumped_spec_reloads_to_the_same_spec() -> None:
    spec = load_spec(ROOT / "specs" / "llama.yaml")
    again = parse_spec(dump_spec(spec))
    assert again == spec
    assert yaml.safe_load(dump_spec(spec))["model"]["d_ff"] == spec.model.d_ff


def test_missing_spec_file_is_a_spec_error(tmp_path) -> None:
    from tfcompile.spec import SpecError

    with pytest.raises(SpecError, match="cannot read the spec"):
        load_spec(tmp_path / "nope.yaml")


def test_a_validated_spec_is_frozen_and_replace_makes_a_new_one() -> None:
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml")
    with pytest.raises(ValidationError, match="frozen"):
        spec.model.d_model = 128  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        spec.train = spec.train  # type: ignore[misc]
    smaller = spec.replace({"model": {"d_model": 192}})
    assert smaller.model.d_model == 192 and spec.model.d_model == 384
    assert smaller.model.d_ff == 4 * 384  # resolved values stay as resolved, explicit in the spec
    with pytest.raises(ValidationError):
        spec.replace({"model": {"n_heads": 7}})  # the new spec validates like any other


# Fields whose null means "none" (no such file, no pair, no clipping), not a default to guess.
ABSENT = {
    "preset",
    "data",  # a spec without data can be summarised and exported with random weights, not trained
    "data.path",  # exactly one of data.path and data.builtin is given
    "data.builtin",
    "data.val_path",
    "data.test_path",
    "data.test_fraction",
    "task.pair_column",
    "train.init_from",
    "tokens",  # the tokenizer's special tokens are tfcompile's own strings
    "model.positional.scaling",  # RoPE's frequencies as trained
    "model.positional.local",  # null: every layer turns at positional.theta
    "model.attention_softcap",  # null: scores uncapped, as its description says
    "model.qkv_clip",  # null: q, k and v unclamped
    "model.positional.nope_layers",  # null: every layer turns RoPE
    "model.positional.query_scaling",  # null: queries as RoPE turns them
    "model.logit_softcap",  # null: logits uncapped
    "model.window",  # null: every layer attends to every earlier position
    "model.moe",  # null: each layer's feed-forward is one dense one
    "model.moe.shared_d_ff",  # null: no shared expert
    "model.moe.dense_layers",  # null: every layer routes
    "model.moe.groups",  # null: a token chooses among every expert
    "train.loss_chunk_tokens",  # null: the loss over all logits at once, as its description says
    "train.threads",  # null: torch's own count, one per core
    "task.top_k",  # null: generation draws from every token
    "task.top_p",
    "task.min_p",  # null: no min-p filter
}


def _nulls(node: object, prefix: str = "") -> set[str]:
    if isinstance(node, dict):
        return {n for k, v in node.items() for n in _nulls(v, f"{prefix}{k}.")}
    return {prefix.rstrip(".")} if node is None else set()


@pytest.mark.parametrize(
    "name",
    ["shakespeare-char", "llama", "multi30k-de-en", "vit-digits", "sst2-finetune", "shakespeare-char-moe"],
)
def test_a_resolved_spec_fills_in_every_default(name: str) -> None:
    spec = load_spec(ROOT / "specs" / f"{name}.yaml")
    resolved = spec.replace(
        {"model": {"vocab_size": None if spec.model.family == "vit" else 100}, "task": {"labels": ["a", "b"]}}
        if spec.task.type in ("classification", "image_classification")
        else {"model": {"vocab_size": 100}},
    )
    assert resolved.train.context_length == resolved.model.max_seq_len
    pixels = {"model.vocab_size"} if spec.model.family == "vit" else set()  # a ViT reads no tokens
    # The run's name, its device's compile default and the bundle folder are filled in by training.
    left = (
        _nulls(resolved.model_dump(mode="json"))
        - ABSENT
        - pixels
        - {"train.compile", "train.name", "export.out"}
    )
    assert not left, f"nulls a reader would have to guess: {sorted(left)}"


def test_head_dim_and_attention_scale_resolve_and_may_be_given() -> None:
    plain = tiny_model()
    assert plain.head_dim == 8 and plain.attention_scale == pytest.approx(8**-0.5)
    t5 = tiny_model(d_model=30, n_heads=4, head_dim=6, attention_scale=1.0, positional="learned")
    assert (t5.head_dim, t5.attention_scale) == (6, 1.0)


def test_heads_that_do_not_divide_d_model_need_a_head_dim() -> None:
    with pytest.raises(SpecError, match=r"or give model.head_dim"):
        parse_spec("model: {vocab_size: 10, d_model: 30, n_layers: 1, n_heads: 4, max_seq_len: 8}\n")


ORIGINAL = {"original_max_position_embeddings": 8}


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        (
            {
                "type": "llama3",
                "factor": 8,
                "low_freq_factor": 4,
                "high_freq_factor": 1,
                "original_max_position_embeddings": 64,
            },
            "must exceed low_freq_factor",
        ),
        ({"type": "linear", "factor": 0.5}, "greater than or equal to 1"),
        ({"type": "yarn", "factor": 2}, "original_max_position_embeddings"),
        ({"type": "longrope", "factor": 2, "original_max_position_embeddings": 8}, "short_factor"),
        (
            {"type": "longrope", "factor": 2, "short_factor": [1, 1], "long_factor": [1], **ORIGINAL},
            "must have as many factors as short_factor",
        ),
        (
            {"type": "longrope", "factor": 2, "short_factor": [1] * 2, "long_factor": [1] * 2, **ORIGINAL},
            "holds 2 factors where a head's 8 rotated dimensions make 4 pairs",
        ),
        (
            {"type": "longrope", "factor": 2, "short_factor": [1] * 4, "long_factor": [1e4] * 4, **ORIGINAL},
            "at most 1000",
        ),
        ({"type": "longrope", "short_factor": [1] * 4, "long_factor": [1] * 4, **ORIGINAL}, "factor"),
        (
            {
                "type": "longrope",
                "factor": 2,
                "short_factor": [1] * 4,
                "long_factor": [1] * 4,
                "original_max_position_embeddings": 1,
            },
            "whose logarithm",
        ),
    ],
)
def test_rope_scaling_is_checked(scaling: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        tiny_model(positional={"type": "rope", "scaling": scaling})


def test_dynamic_rope_scaling_needs_more_than_two_rotated_dimensions() -> None:
    scaling = {"type": "dynamic", "factor": 2, "original_max_position_embeddings": 8}
    message = "for the 2 rotated dimensions of a head, so they must exceed 2"
    with pytest.raises(ValidationError, match=message):
        tiny_model(d_model=8, n_heads=4, positional={"type": "rope", "scaling": scaling})
    with pytest.raises(ValidationError, match=message):  # heads of 8, two of them rotated
        tiny_model(d_model=16, n_heads=2, positional={"type": "rope", "scaling": scaling, "rotary_dims": 2})
    tiny_model(d_model=16, n_heads=2, positional={"type": "rope", "scaling": scaling, "rotary_dims": 4})


def test_special_tokens_by_role() -> None:
    spec = parse_spec(
        "model: {vocab_size: 10, d_model: 8, n_layers: 1, n_heads: 2, max_seq_len: 8}\n"
        "tokens: {pad: <pad>, bos: <pad>, eos: </s>}\n"
    )
    assert spec.tokens is not None and spec.tokens.roles() == {"pad": "<pad>", "bos": "<pad>", "eos": "</s>"}
    with pytest.raises(SpecError, match=r"tokens\.eos"):
        parse_spec("model: {vocab_size: 10, d_model: 8, n_layers: 1, n_heads: 2}\ntokens: {eos: ''}\n")


@pytest.mark.parametrize("field", ["path", "val_path", "test_path"])
def test_a_translation_data_path_without_lang_is_refused_at_its_field(field: str) -> None:
    """Translation reads one file per side, {lang} filled with task.source and task.target: a path
    without it (a TSV of both columns) was refused only when training read the data."""
    paths = {"path": "train.{lang}", "val_path": "val.{lang}", "test_path": "test.{lang}", field: "pairs.tsv"}
    model = "{family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8}"
    data = "".join(f"  {name}: {path}\n" for name, path in paths.items())
    with pytest.raises(SpecError, match=rf"data\.{field}: a seq2seq data path holds \{{lang\}}") as error:
        parse_spec(f"model: {model}\ndata:\n{data}task: seq2seq\n")
    assert "e.g. train.{lang}.gz" in str(error.value) and str(error.value).count("error:") == 1


@pytest.mark.parametrize("name", ["ñame", "名前", "a b", "../x", ".hidden"])
def test_a_run_name_outside_ascii_folder_names_says_which_letters(name: str) -> None:
    """It said "letters" and refused ñ."""
    with pytest.raises(ValueError, match=r"one folder name of ASCII letters, digits"):
        check_run_name(name)
    assert check_run_name("run-1.b_2") == "run-1.b_2"


def test_a_long_run_name_is_quoted_cut_short() -> None:
    """A 500,000-character train.name was quoted whole: a 500 KB error message."""
    with pytest.raises(ValueError, match=r"found 'aaaa+'\.\.\. \(500,000 characters\)$") as error:
        check_run_name("a" * 500_000)
    assert len(str(error.value)) < 300
