"""`tfcompile import`: tiny random transformers models of every family and variant, saved with
save_pretrained, imported, and held to transformers' own outputs (float32, with and without
padding); their parameter counts, readable specs, checkpoint formats, and every refusal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import VARIANTS, Imported, copied, edited, from_pretrained, import_all, max_difference
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, processors

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.importer import import_folder
from tfcompile.spec import Spec, load_spec
from tfcompile.spec.schema import SlidingWindow
from tfcompile.train.runs import load_trained_model


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return import_all(tmp_path_factory.mktemp("hf"))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_outputs(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    case = imported[name]
    # transformers 5 keeps the head's bias twice when untied (one is read)
    case.assert_counts_match(case.hf.config.vocab_size if name == "bert_mlm_untied" else 0)


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    specs = {name: load_spec(case.result.spec_path) for name, case in imported.items()}
    llama = specs["llama"].model
    assert llama.positional.type == "rope" and llama.positional.layout == "halves"
    assert (llama.n_kv_heads, llama.norm.type, llama.norm.eps, llama.activation) == (
        2,
        "rmsnorm",
        1e-5,
        "swiglu",
    )
    yarn = specs["llama_yarn"].model.positional
    assert yarn.scaling is not None and yarn.scaling.type == "yarn" and yarn.scaling.factor == 4.0
    odd = specs["llama_tied_bias_head_dim"].model
    assert (odd.head_dim, odd.bias.qkv, odd.bias.attn_out, odd.bias.ffn, odd.activation) == (
        12,
        True,
        True,
        True,
        "geglu_tanh",
    )
    qwen2 = specs["qwen2"].model
    assert (qwen2.bias.qkv, qwen2.bias.attn_out, qwen2.tie_embeddings, qwen2.positional.theta) == (
        True,
        False,
        True,
        1e6,
    )
    mistral = specs["mistral"].model
    assert (mistral.max_seq_len, mistral.window) == (64, SlidingWindow(size=40))  # every layer slides
    t5, t5_1 = specs["t5_v1_0"].model, specs["t5_v1_1"].model
    assert (t5.head_dim, t5.attention_scale, t5.scale_output, t5.tie_embeddings) == (4, 1.0, True, True)
    assert (t5_1.activation, t5_1.scale_output, t5_1.tie_embeddings) == ("geglu_tanh", False, False)
    assert specs["t5_v1_1"].tokens is not None and specs["t5_v1_1"].tokens.roles()["bos"] == "<pad>"
    assert specs["bert_cls"].task.labels == ["neg", "pos", "neutral"]
    assert specs["bert_mlm"].model.pooler is False and specs["bert_pretraining"].task.next_sentence
    assert specs["vit"].task.labels == ["cat", "dog"] and specs["vit_no_qkv_bias"].model.bias.qkv is False
    preprocessing = json.loads((imported["vit"].result.run_dir / "preprocessing.json").read_text())
    assert preprocessing["mean"] == [0.4, 0.5, 0.6] and preprocessing["image_size"] == 8


def test_qwen2_without_layer_types_slides_from_max_window_layers_on(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """As transformers derives layer_types for a config saved without them: a window that no
    layer reaches is none; one the last layer reaches slides it, past the window as transformers."""
    fields: dict[str, Any] = {"use_sliding_window": True, "sliding_window": 8, "layer_types": None}
    folder = edited(imported, "qwen2", tmp_path / "none", max_window_layers=2, **fields)
    spec = _matches_transformers(folder, tmp_path / "none")
    assert (spec.model.max_seq_len, spec.model.window) == (64, None)
    folder = edited(imported, "qwen2", tmp_path / "last", max_window_layers=1, **fields)
    spec = _matches_transformers(folder, tmp_path / "last")  # 12 tokens past a window of 8
    assert (spec.model.max_seq_len, spec.model.window) == (64, SlidingWindow(size=8, layers=[1]))


def test_the_run_holds_the_tokenizer_and_where_it_came_from(imported: dict[str, Imported]) -> None:
    case = imported["gpt2"]
    run = case.result.run_dir
    held, saved = (json.loads((path / "tokenizer.json").read_text()) for path in (run, case.folder))
    assert held == saved  # saved without a truncation or padding, which the import would drop
    record = json.loads((run / "import.json").read_text())
    assert record["model_type"] == "gpt2" and list(record["files"]) == ["model.safetensors"]
    assert (run / "checkpoints" / "best").read_text().strip() == "step-000000"


def test_the_import_stages_in_a_folder_of_its_own(imported: dict[str, Imported], tmp_path: Path) -> None:
    """The run was staged in RUNS/.NAME.import, removed first whatever it held (a user's folder, or
    another import's of the same name as it ran)."""
    folder = copied(imported, "gpt2", tmp_path)
    theirs = tmp_path / "runs" / ".zz.import"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    import_folder(folder, "zz", tmp_path / "specs", tmp_path / "runs")
    assert (theirs / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [".zz.import", "zz"]


def test_the_import_writes_nothing_into_the_folder_it_reads(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """--specs or --runs inside the Hugging Face folder added the spec and run to it."""
    folder = copied(imported, "gpt2", tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    for specs, runs in ((folder, tmp_path / "runs"), (tmp_path / "specs", folder / "runs")):
        with pytest.raises(HFError, match="is inside the Hugging Face folder"):
            import_folder(folder, "inside", specs, runs)
    assert sorted(p.name for p in folder.iterdir()) == before
    (tmp_path / "a-file").write_text("mine")
    for specs, runs, flag in (
        (tmp_path / "a-file", tmp_path / "runs", "--specs"),
        (tmp_path, tmp_path / "a-file", "--runs"),
    ):
        with pytest.raises(HFError, match=f"{flag} .*a-file is not a folder"):  # was "File exists"
            import_folder(folder, "elsewhere", specs, runs)
    assert (tmp_path / "a-file").read_text() == "mine"


# ------------------------------------------------------------------ checkpoint formats


def _same_weights(folder: Path, case: Imported, tmp_path: Path) -> None:
    result = import_folder(folder, "again", tmp_path / "specs", tmp_path / "runs")
    _, model = load_trained_model(result.run_dir)
    for name, tensor in case.model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["one more token", "an id past a gap", "a template's token"])
def test_a_tokenizer_of_ids_past_the_embedding_rows_is_refused_at_import(
    imported: dict[str, Imported], tmp_path: Path, kind: str
) -> None:
    """A fine-tune that added a special token and did not resize its embeddings imported, and the
    run it wrote could not be trained or exported ("is it another run's?"); a vocabulary with a
    gap holds no more tokens than the rows, and an id past them all the same; so does a token the
    post-processor puts around every text (in no vocabulary: the bundle failed on every prompt)."""
    folder = copied(imported, "llama", tmp_path)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    highest = rows + 5 if kind == "an id past a gap" else rows
    if kind == "an id past a gap":  # the last plain token moved past the rows
        vocab = tokenizer["model"]["vocab"]
        vocab[max(vocab, key=vocab.get)] = highest
    elif kind == "one more token":
        extra = {"id": rows, "content": "<extra>", "single_word": False, "lstrip": False, "rstrip": False}
        tokenizer["added_tokens"].append(extra | {"normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    if kind == "a template's token":
        template = Tokenizer.from_file(str(folder / "tokenizer.json"))
        template.post_processor = processors.TemplateProcessing(
            single="<extra> $A", special_tokens=[("<extra>", rows)]
        )
        template.save(str(folder / "tokenizer.json"))
    said = rf"tokenizer\.json has token ids up to {highest}, past the {rows} rows of the embedding table"
    with pytest.raises(HFError, match=said + r".*resize_token_embeddings"):
        import_folder(folder, "extra", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "specs").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "config.json", "model.safetensors"])
@pytest.mark.parametrize("kind", ["link to /dev/zero", "pipe"])
def test_a_file_that_is_a_device_or_a_pipe_is_refused_not_read_without_end(
    imported: dict[str, Imported], tmp_path: Path, name: str, kind: str
) -> None:
    """A link to /dev/zero filled the memory, and a pipe blocked the import for ever."""
    import os

    folder = copied(imported, "llama", tmp_path)
    (folder / name).unlink()
    if kind == "pipe":
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to("/dev/zero")
    with pytest.raises(HFError, match=rf"{name} is not a regular file"):
        import_folder(folder, "device", tmp_path / "specs", tmp_path / "runs")


def test_a_hub_snapshot_of_links_into_its_blobs_imports(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """huggingface_hub's cache: each file of a snapshot is a link to a regular file in blobs/."""
    folder = copied(imported, "llama", tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for i, path in enumerate(sorted(folder.iterdir())):
        path.rename(blobs / str(i))
        path.symlink_to(blobs / str(i))
    import_folder(folder, "snapshot", tmp_path / "specs", tmp_path / "runs")
    assert (tmp_path / "runs" / "snapshot" / "tokenizer.json").is_file()


def test_a_tokenizer_that_multiplies_text_is_refused_before_anything_is_written(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """The runtime refuses such a tokenizer in a bundle; the import, which copies it as it is, says
    so before it writes a spec or a run."""
    folder = copied(imported, "llama", tmp_path)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    double = {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}
    tokenizer["normalizer"] = {"type": "Sequence", "normalizers": [double] * 20}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(HFError, match=r"tokenizer\.json: the tokenizer's encoding may make up to 1,048,576"):
        import_folder(folder, "bomb", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "specs").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_checkpoint_imports_in_float32_with_a_warning(
    imported: dict[str, Imported], tmp_path: Path, dtype: str
) -> None:
    """transformers 5 computes such a checkpoint in its saved type by default: the warning says
    how to compare the import's float32 outputs with it."""
    folder = edited(imported, "llama", tmp_path, dtype=dtype)
    with pytest.warns(HFWarning, match=rf"config\.json says {dtype}: the import computes in float32"):
        result = import_folder(folder, "half", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model == imported["llama"].spec.model


def test_sharded_safetensors(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    imported["llama"].hf.save_pretrained(folder, max_shard_size="20KB")
    shutil.copy(imported["llama"].folder / "tokenizer.json", folder)
    assert (folder / "model.safetensors.index.json").exists()
    _same_weights(folder, imported["llama"], tmp_path)


def test_a_pickled_state_dict_without_the_body_prefix_and_with_old_norm_names(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """pytorch_model.bin of an old BERT: no ``bert.`` prefix on the body, LayerNorm gamma/beta,
    position_ids kept; read with weights_only."""
    folder = copied(imported, "bert_cls", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    renamed = {
        name.removeprefix("bert.")
        .replace("LayerNorm.weight", "LayerNorm.gamma")
        .replace("LayerNorm.bias", "LayerNorm.beta"): t
        for name, t in tensors.items()
    }
    renamed["embeddings.position_ids"] = torch.arange(32)[None]
    (folder / "model.safetensors").unlink()
    torch.save(renamed, folder / "pytorch_model.bin")
    _same_weights(folder, imported["bert_cls"], tmp_path)


def test_a_tie_saved_under_both_names_and_half_precision(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = copied(imported, "gpt2", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].clone()
    save_file(
        {n: t.half() for n, t in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"}
    )
    result = import_folder(folder, "half", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.tie_embeddings
    _, model = load_trained_model(result.run_dir)
    assert model.embed.weight.dtype == torch.float32
    torch.testing.assert_close(model.embed.weight, imported["gpt2"].model.embed.weight, atol=1e-3, rtol=1e-3)


# ------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("name", "fields", "named"),
    [
        ("gpt2", {"model_type": "jetmoe"}, ["model_type: 'jetmoe' has no converter"]),
        ("gpt2", {"quantization_config": {"bits": 4}}, ["quantization_config"]),
        ("gpt2", {"architectures": None}, ["architectures: is missing"]),
        (
            "gpt2",
            {"scale_attn_by_inverse_layer_idx": True, "activation_function": "quick_gelu"},
            ["scale_attn_by_inverse_layer_idx", "activation_function: 'quick_gelu'"],
        ),
        ("gpt2", {"architectures": ["GPT2ForSequenceClassification"]}, ["architectures"]),
        ("bert_cls", {"position_embedding_type": "relative_key"}, ["position_embedding_type"]),
        ("bert_cls", {"problem_type": "multi_label_classification"}, ["problem_type"]),
        (
            "llama",
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}, "partial_rotary_factor": 0.5},
            ["rope_parameters.short_factor: is missing", "partial_rotary_factor"],
        ),
        ("llama", {"hidden_act": "relu2"}, ["hidden_act: 'relu2'"]),
        # A null choice imported as the default, where transformers 5 refuses it and 4 fails on it.
        ("llama", {"hidden_act": None}, ["hidden_act: is null, not a gated activation"]),
        ("vit", {"image_size": [8, 16]}, ["image_size: [8, 16] is not square"]),
        (
            "t5_v1_1",
            {"feed_forward_proj": "gated-relu", "dense_act_fn": "relu"},
            ["dense_act_fn: gated 'relu' (feed_forward_proj 'gated-relu')"],
        ),
        ("t5_v1_1", {"architectures": ["T5EncoderModel"]}, ["architectures"]),
        ("vit", {"num_channels": 1}, ["image_mean: [0.4, 0.5, 0.6] is not one value per channel (1)"]),
        # Sizes transformers accepts and the spec's rules do not (it floors the patches that fit).
        # ... each named by the config field it was read from, and the spec field it became.
        (
            "vit",
            {"image_size": 10},
            ["patch_size (the spec's model.patch_size): must divide image_size (10), found 4, in the spec"],
        ),
        (
            "t5_v1_0",
            {"relative_attention_max_distance": 4},
            ["relative_attention_max_distance (the spec's model.positional.max_distance): must exceed"],
        ),
        ("llama", {"num_key_value_heads": 3}, ["num_key_value_heads (the spec's model.n_kv_heads): n_heads"]),
        (
            "llama",
            {"rope_parameters": {"rope_type": "linear", "factor": 0.5}},
            ["rope_parameters.factor (the spec's model.positional.scaling.factor)"],
        ),
    ],
)
def test_what_cannot_be_converted_is_refused_by_name(
    imported: dict[str, Imported], tmp_path: Path, name: str, fields: dict, named: list[str]
) -> None:
    folder = edited(imported, name, tmp_path, **fields)
    with pytest.raises(HFError) as error:
        import_folder(folder, "refused", tmp_path / "specs", tmp_path / "runs")
    for text in named:
        assert text in str(error.value)
    assert not (tmp_path / "runs" / "refused").exists() and not (tmp_path / "specs").exists()


def _same_outputs(a: torch.nn.Module, b: torch.nn.Module) -> None:
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), atol=1e-6, rtol=0)


def test_mistral_and_qwen2_biases_are_theirs_whatever_the_config_says(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """transformers builds Mistral without biases and Qwen2 with q/k/v biases only, reading neither
    attention_bias nor mlp_bias; LLaMA reads both."""
    for name, model_type, qkv in (("llama", "mistral", False), ("qwen2", "qwen2", True)):
        folder = edited(
            imported, name, tmp_path / name, model_type=model_type, attention_bias=True, mlp_bias=True
        )
        result = import_folder(folder, name, tmp_path / "specs", tmp_path / "runs")
        bias = result.spec.model.bias
        assert (bias.qkv, bias.attn_out, bias.ffn) == (qkv, False, False)
        _same_outputs(load_trained_model(result.run_dir)[1], imported[name].model)


def test_dynamic_rope_scales_from_max_position_embeddings_as_transformers_does(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """transformers' dynamic NTK scaling ignores original_max_position_embeddings: within the
    context (max_position_embeddings), the angles are plain RoPE's."""
    config = json.loads((imported["llama_dynamic"].folder / "config.json").read_text())
    rope = config["rope_parameters"] | {"original_max_position_embeddings": 8}
    folder = edited(imported, "llama_dynamic", tmp_path, rope_parameters=rope)
    result = import_folder(folder, "dynamic", tmp_path / "specs", tmp_path / "runs")
    scaling = result.spec.model.positional.scaling
    assert (
        scaling is not None and scaling.original_max_position_embeddings == config["max_position_embeddings"]
    )
    _same_outputs(load_trained_model(result.run_dir)[1], imported["llama_dynamic"].model)


def _matches_transformers(folder: Path, tmp_path: Path) -> Spec:
    """Import the edited ``folder`` and hold it to transformers' outputs from the same folder."""
    result = import_folder(folder, "edited", tmp_path / "specs", tmp_path / "runs")
    hf, model = from_pretrained(folder), load_trained_model(result.run_dir)[1]
    for padded in (False, True):
        assert max_difference(hf, model, padded) <= 1e-5, padded
    return result.spec


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("gpt2", "activation_function", "gelu_fast"),
        ("bert_cls", "hidden_act", "gelu_python"),
        ("vit", "hidden_act", "gelu_accurate"),
        ("llama", "hidden_act", "gelu_python"),
        ("qwen2", "hidden_act", "gelu_fast"),
    ],
)
def test_activation_names_transformers_computes_alike_are_read_alike(
    imported: dict[str, Imported], tmp_path: Path, name: str, field: str, value: str
) -> None:
    """gelu_python is the erf GELU written out; gelu_fast and gelu_accurate are gelu_new's formula."""
    _matches_transformers(edited(imported, name, tmp_path, **{field: value}), tmp_path)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("t5_v1_0", {"feed_forward_proj": "silu", "dense_act_fn": "silu"}),
        ("t5_v1_0", {"feed_forward_proj": "gelu_new", "dense_act_fn": "gelu_new"}),
        ("t5_v1_1", {"feed_forward_proj": "gated-swish", "dense_act_fn": "swish"}),
        ("t5_v1_1", {"dense_act_fn": "gelu_python"}),  # read over feed_forward_proj's gated-gelu
    ],
)
def test_t5_feed_forward_is_any_activation_gated_or_not_as_transformers_reads_it(
    imported: dict[str, Imported], tmp_path: Path, name: str, fields: dict[str, str]
) -> None:
    """feed_forward_proj is ACT or gated-ACT, ACT any of transformers' activation names; the
    dense_act_fn and is_gated_act that every save writes beside it are what transformers reads."""
    _matches_transformers(edited(imported, name, tmp_path, **fields), tmp_path)


def test_gpt2_attention_without_its_scale_is_attention_scale_1(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = edited(imported, "gpt2_untied_relu", tmp_path, scale_attn_weights=False)
    assert _matches_transformers(folder, tmp_path).model.attention_scale == 1.0


def test_a_masked_lm_holding_its_pretraining_heads_leaves_the_next_sentence_head_out(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """As bert-base-uncased: a BertForMaskedLM whose checkpoint holds the pooler and the
    next-sentence head it was pretrained with; the pooler is kept, for a classifier fine-tuned from
    it (tests/test_hf_classifier_heads.py), the head left out as transformers leaves it unread."""
    folder = edited(imported, "bert_pretraining", tmp_path, architectures=["BertForMaskedLM"])
    with pytest.warns(
        HFWarning, match=r"left out cls\.seq_relationship\.bias, cls\.seq_relationship\.weight:"
    ):
        spec = _matches_transformers(folder, tmp_path)
    assert spec.model.pooler is True and not spec.task.next_sentence


def test_a_body_without_its_lm_head_is_refused_by_name(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = edited(imported, "llama", tmp_path, architectures=["LlamaModel"])
    tensors = load_file(folder / "model.safetensors")
    save_file({n: t for n, t in tensors.items() if n != "lm_head.weight"}, folder / "model.safetensors")
    with pytest.raises(HFError, match=r"architectures: LlamaModel holds no LM head .*ForCausalLM"):
        import_folder(folder, "body", tmp_path / "specs", tmp_path / "runs")


def test_a_tied_config_with_a_head_of_its_own_keeps_the_head(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """As transformers 5 loads it (and saves T5 v1.1: tie_word_embeddings true, a head of its own)."""
    folder = copied(imported, "gpt2", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = torch.randn_like(tensors["transformer.wte.weight"])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    result = import_folder(folder, "own-head", tmp_path / "specs", tmp_path / "runs")
    assert not result.spec.model.tie_embeddings
    torch.testing.assert_close(
        load_trained_model(result.run_dir)[1].lm_head.weight, tensors["lm_head.weight"]
    )


def test_a_tensor_the_mapping_does_not_read_is_an_error(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = copied(imported, "llama", tmp_path)
    tensors = load_file(folder / "model.safetensors") | {"model.layers.0.mlp.extra.weight": torch.zeros(2)}
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(HFError, match=r"does not read: model\.layers\.0\.mlp\.extra\.weight|mlp\.extra"):
        import_folder(folder, "extra", tmp_path / "specs", tmp_path / "runs")


def test_sizes_the_weights_contradict_are_an_error(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = edited(imported, "gpt2", tmp_path, n_inner=48)
    with pytest.raises(
        HFError, match=r"does not fit its config.json; tensors of other shapes: blocks\.0\.ffn"
    ):
        import_folder(folder, "wrong", tmp_path / "specs", tmp_path / "runs")


def test_a_folder_without_weights_names_what_it_holds(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = copied(imported, "gpt2", tmp_path)
    (folder / "model.safetensors").rename(folder / "tf_model.h5")
    with pytest.raises(HFError, match=r"tf_model\.h5 \(TensorFlow\).*save_pretrained"):
        import_folder(folder, "none", tmp_path / "specs", tmp_path / "runs")


# ----------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("name", ["a/b", "", ".."])
def test_a_name_no_run_can_have_is_a_usage_error_before_any_work(
    imported: dict[str, Imported], name: str, capsys: pytest.CaptureFixture
) -> None:
    """It exited 1 after "importing ...": a flag's value exits 2, as export-triton's --name does."""
    with pytest.raises(SystemExit) as exit_:
        main(["import", str(imported["gpt2"].folder), "--name", name])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --name: a run name is one folder name" in err
    assert "importing" not in err


def test_the_command_writes_the_spec_and_the_run_and_refuses_to_overwrite(
    imported: dict[str, Imported],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = str(imported["qwen2"].folder)
    assert main(["import", folder, "--name", "qwen"]) == 0
    assert "Qwen2ForCausalLM" in capsys.readouterr().out
    assert Path("specs/qwen.yaml").exists() and Path("runs/qwen/checkpoints/last").exists()
    text = Path("specs/qwen.yaml").read_text()
    assert text.startswith("# Imported from") and "train.init_from=runs/qwen" in text
    assert isinstance(load_spec("specs/qwen.yaml"), Spec)
    assert main(["summary", "specs/qwen.yaml"]) == 0
    assert main(["import", folder, "--name", "qwen"]) == 1
    assert "runs/qwen exists: choose another --name" in capsys.readouterr().err


# ------------------------------------------------------------------- export, generate


def test_an_imported_run_exports_to_onnx_with_parity(imported: dict[str, Imported], tmp_path: Path) -> None:
    assert main(["export", str(imported["bert_cls"].result.run_dir), "--out", str(tmp_path / "bundle")]) == 0


# bert_cls exports in the default suite and qwen2 in the generation test; masked LMs are pretraining,
# which tfcompile does not export.
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in VARIANTS if not n.startswith("bert") and n != "qwen2"])
def test_every_imported_run_exports_to_onnx_with_parity(
    imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    assert main(["export", str(imported[name].result.run_dir), "--out", str(tmp_path / "bundle")]) == 0


@pytest.mark.slow
def test_the_runtime_generates_transformers_greedy_tokens(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """Qwen2 (RoPE on halves, q/k/v biases, GQA, a tied head) exported with parity, then greedy
    decoding with the KV cache in onnxruntime against transformers' generate."""
    from tfcompile.runtime import load

    case = imported["qwen2"]
    assert main(["export", str(case.result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    prompt = torch.tensor([[5, 9, 13, 2, 30]])
    expected = case.hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12
    )
    ours = bundle.generate(prompt.numpy(), 12, temperature=0.0, stop=False)
    assert ours[0].tolist() == expected[0].tolist()


def test_importing_and_exporting_never_load_transformers() -> None:
    import subprocess
    import sys

    code = "import sys, tfcompile.hf.importer, tfcompile.hf.exporter; print('transformers' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )


@pytest.mark.slow
def test_an_imported_run_fine_tunes_and_resumes(
    imported: dict[str, Imported], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's path: import, fine-tune from it (train.init_from), or continue it (--resume)."""
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(imported["gpt2"].folder), "--name", "gpt2"]) == 0
    Path("corpus.txt").write_text("the cat sat on the mat, and the dog ran!\n" * 80)
    small = ["--set", "train.steps=4", "--set", "train.batch_size=4", "--set", "train.eval_interval=2"]
    small += ["--set", "train.eval_batches=1", "--set", "data.path=../corpus.txt"]
    tuned = ["--set", "train.init_from=runs/gpt2", "--set", "train.name=tuned"]
    assert main(["train", "specs/gpt2.yaml", *small, *tuned]) == 0
    assert main(["train", "specs/gpt2.yaml", "--resume", "runs/gpt2", *small]) == 0
    assert (
        Path("runs/gpt2/checkpoints/last").read_text().strip(),
        Path("runs/tuned/checkpoints/last").exists(),
    ) == (
        "step-000004",
        True,
    )


def test_a_bundle_names_the_imported_special_tokens_by_their_roles(imported: dict[str, Imported]) -> None:
    """T5 starts its decoder with <pad> and stops at </s>; GPT-2 stops at <|endoftext|>."""
    from tokenizers import Tokenizer

    from tfcompile.export.bundle import tokenizer_info

    def ids(name: str) -> dict[str, int]:
        case = imported[name]
        tokenizer = Tokenizer.from_file(str(case.result.run_dir / "tokenizer.json"))
        return {role: t.id for role, t in tokenizer_info(tokenizer, case.spec.tokens).special_tokens.items()}

    assert ids("t5_v1_1") == {"pad": 0, "bos": 0, "eos": 1, "unk": 2}
    assert ids("gpt2")["eos"] == 0 and ids("bert_cls")["mask"] == 4
