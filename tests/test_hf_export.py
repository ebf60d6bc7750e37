"""`tfcompile export-hf`: an imported run written back loads in transformers with no missing or
unexpected tensors and gives the same outputs; a run of tfcompile's own (interleaved RoPE) does
too; what transformers cannot express is refused by field."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from helpers import random_run
from hf_models import VARIANTS, Imported, edited, from_pretrained, import_all
from hf_models import loads_alike as _loads_alike
from tokenizers import Tokenizer

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.spec.choices import ACTIVATIONS
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return import_all(tmp_path_factory.mktemp("hf"))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_round_trips(imported: dict[str, Imported], tmp_path: Path, name: str) -> None:
    case, out = imported[name], tmp_path / "out"
    assert main(["export-hf", str(case.result.run_dir), "--out", str(out)]) == 0
    _loads_alike(out, case.model)
    if (case.folder / "tokenizer.json").exists():
        ours = transformers.AutoTokenizer.from_pretrained(out)
        theirs = transformers.PreTrainedTokenizerFast.from_pretrained(case.folder)  # its files' tokens
        run = Tokenizer.from_file(str(case.result.run_dir / "tokenizer.json"))
        text = "hello, world! the cat"
        assert ours(text)["input_ids"] == run.encode(text).ids  # not a qwen2 folder's Qwen2Tokenizer
        assert ours.eos_token == theirs.eos_token and ours.pad_token == theirs.pad_token
    else:
        processor = transformers.AutoImageProcessor.from_pretrained(out)
        assert (
            list(processor.image_mean)
            == json.loads((case.result.run_dir / "preprocessing.json").read_text())["mean"]
        )


class _Transformers4Tokenizer(transformers.PreTrainedTokenizerFast):
    """PreTrainedTokenizerFast with transformers 4's default inputs (5's name no token_type_ids)."""

    model_input_names: ClassVar[list[str]] = ["input_ids", "token_type_ids", "attention_mask"]


@pytest.mark.parametrize("name", [name for name, (_, kind) in VARIANTS.items() if kind != "image"])
def test_the_tokenizer_gives_transformers_4_the_inputs_the_model_reads(
    imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    """transformers 4's PreTrainedTokenizerFast returns token_type_ids unless tokenizer_config.json
    names the model's inputs: GPT-2 added them through its token embeddings (logits up to 0.5
    off), T5 and generate() refused them. Only BERT, which reads segments, is given them."""
    out = tmp_path / "out"
    export_hf(imported[name].result.run_dir, out)
    encoded = _Transformers4Tokenizer.from_pretrained(out)("hello, world", "the cat", return_tensors="pt")
    assert ("token_type_ids" in encoded) == name.startswith("bert")
    if not name.startswith("bert"):  # what the model computes from the tokenizer's whole output
        reloaded = from_pretrained(out)
        target = {"decoder_input_ids": encoded["input_ids"][:, :3]} if name.startswith("t5") else {}
        with torch.no_grad():
            ids, mask = encoded["input_ids"], encoded["attention_mask"]
            alone = reloaded(input_ids=ids, attention_mask=mask, **target).logits
            assert torch.equal(reloaded(**encoded, **target).logits, alone)


# The configs the import tests edit (as transformers saves other models): each is written back as
# transformers read it.
EDITED: list[tuple[str, dict[str, Any]]] = [
    ("gpt2", {"activation_function": "gelu_fast"}),
    ("bert_cls", {"hidden_act": "gelu_python"}),
    ("vit", {"hidden_act": "gelu_accurate"}),
    ("llama", {"hidden_act": "gelu_python"}),
    ("qwen2", {"hidden_act": "gelu_fast"}),
    ("gpt2_untied_relu", {"scale_attn_weights": False}),
    ("t5_v1_0", {"feed_forward_proj": "silu", "dense_act_fn": "silu"}),
    ("t5_v1_0", {"feed_forward_proj": "gelu_new", "dense_act_fn": "gelu_new"}),
    ("t5_v1_1", {"feed_forward_proj": "gated-swish", "dense_act_fn": "swish"}),
    ("t5_v1_1", {"dense_act_fn": "gelu_python"}),  # gated erf GELU
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "layer_types": None, "max_window_layers": 2}),
    ("bert_pretraining", {"architectures": ["BertForMaskedLM"]}),
]


@pytest.mark.parametrize(
    ("name", "fields"), EDITED, ids=[" ".join([n, *(f"{k}={v}" for k, v in f.items())]) for n, f in EDITED]
)
def test_an_edited_import_round_trips(
    imported: dict[str, Imported], tmp_path: Path, name: str, fields: dict[str, Any]
) -> None:
    folder = edited(imported, name, tmp_path, **fields)
    with warnings.catch_warnings():
        # BertForMaskedLM leaves its pretraining heads out; an unscaled GPT-2 warns of transformers 4
        warnings.simplefilter("ignore", HFWarning)
        result = import_folder(folder, "edited", tmp_path / "specs", tmp_path / "runs")
        export_hf(result.run_dir, tmp_path / "out")
    _loads_alike(tmp_path / "out", load_trained_model(result.run_dir)[1])


NATIVE = {
    "llama": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
    "max_seq_len: 16, positional: rope, norm: {type: rmsnorm}, activation: swiglu, "
    "bias: {qkv: true, attn_out: false, ffn: true}",
    # Qwen2's biases, written as Llama's (zeros on o): not as a qwen2 folder (see written_as)
    "llama qkv biases": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, n_heads: 4, "
    "max_seq_len: 16, positional: {type: rope, theta: 500000, scaling: {type: linear, factor: 2}}, "
    "norm: {type: rmsnorm}, "
    "activation: geglu, bias: {qkv: true, attn_out: false, ffn: false}, tie_embeddings: false",
    "gpt2": "family: decoder, vocab_size: 64, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 16, "
    "bias: {qkv: false, attn_out: true, ffn: false}",
    "gpt2 unscaled": "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, "
    "max_seq_len: 16, attention_scale: 1",  # scale_attn_weights false
    # scale_output folded into the final norm, as T5's untied head has it
    "gpt2 scaled output": "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, "
    "max_seq_len: 16, scale_output: true",
    "llama scaled output": "family: decoder, vocab_size: 64, d_model: 32, n_layers: 1, n_heads: 4, "
    "max_seq_len: 16, positional: rope, norm: {type: rmsnorm}, activation: swiglu, scale_output: true",
}


@pytest.mark.filterwarnings("ignore:scale_attn_weights is false")  # tested on its own below
@pytest.mark.parametrize("kind", list(NATIVE))
def test_a_run_of_tfcompiles_own_loads_in_transformers(tmp_path: Path, kind: str) -> None:
    """Interleaved RoPE pairs become transformers' halves by a permutation of the q and k rows;
    biases transformers has and the model does not are written as zeros."""
    run = random_run(tmp_path, f"model: {{{NATIVE[kind]}}}\n")
    architecture = export_hf(run, tmp_path / "out")
    assert architecture.lower().startswith(kind.split()[0])
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


T5 = (
    "family: encoder_decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, head_dim: 6, "
    "max_seq_len: 16, positional: relative, norm: {type: rmsnorm}, attention_scale: 1, "
    "bias: {qkv: false, attn_out: false, ffn: false}"
)


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a != "swiglu_clamped"])
def test_every_activation_is_a_t5_feed_forward(tmp_path: Path, activation: str) -> None:
    """feed_forward_proj ACT or gated-ACT, with the dense_act_fn and is_gated_act transformers
    derives from it and reads over it (but GPT-OSS's clamped SwiGLU, which no T5 has: refused by
    field, as by every writer)."""
    run = random_run(tmp_path, f"model: {{{T5}, activation: {activation}}}\ntask: {{type: seq2seq}}\n")
    export_hf(run, tmp_path / "out")
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    derived = transformers.T5Config(feed_forward_proj=config["feed_forward_proj"])
    assert (config["dense_act_fn"], config["is_gated_act"]) == (derived.dense_act_fn, derived.is_gated_act)


def test_the_clamped_swiglu_is_no_t5_feed_forward(tmp_path: Path) -> None:
    assert "model.activation: 'swiglu_clamped' has no T5 equivalent" in _problems(
        tmp_path, f"{T5}, activation: swiglu_clamped", "task: {type: seq2seq}\n"
    )


def _problems(tmp_path: Path, model: str, task: str = "") -> str:
    run = random_run(tmp_path, f"model: {{{model}}}\n{task}")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    return str(error.value)


def test_what_transformers_cannot_express_is_refused_by_field(tmp_path: Path) -> None:
    """By the one architecture the spec's MQA decides (GPT-BigCode), which has MQA."""
    message = _problems(
        tmp_path,
        "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
        "norm: {type: rmsnorm}, n_kv_heads: 1, scale_embeddings: true, attention_scale: 0.5",
    )
    scale = "model.attention_scale: 0.5 has no GPT-BigCode equivalent; "
    scale += "leave it unset (1/sqrt(head_dim)), or set it to 1"
    for field in ("model.norm.type: 'rmsnorm'", "model.norm.bias", "model.scale_embeddings", scale):
        assert field in message
    assert "4 problems" in message and "n_kv_heads" not in message


@pytest.mark.parametrize(
    ("model", "task", "named"),
    [
        (  # a norm after the last block, which BERT's post-norm blocks do not have
            "family: encoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
            "norm: {position: post, final: true}, embedding_norm: true",
            "task: {type: classification, labels: [a, b]}\n",
            "model.norm.final: True has no BERT equivalent",
        ),
        (  # transformers' dynamic RoPE scales past max_position_embeddings, whatever else is said
            "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, "
            "norm: {type: rmsnorm}, activation: swiglu, positional: {type: rope, "
            "scaling: {type: dynamic, factor: 2, original_max_position_embeddings: 4}}",
            "",
            "model.positional.scaling.original_max_position_embeddings: 4 has no Llama equivalent",
        ),
        (  # BERT's pooler reads [CLS] and has no norm; its attention no window (ModernBERT's choices)
            "family: encoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
            "norm: {position: post}, embedding_norm: true, pooling: mean, pooler_norm: true",
            "task: {type: classification, labels: [a, b]}\n",
            "model.pooling: 'mean' has no BERT equivalent",
        ),
        (
            "family: encoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
            "norm: {position: post}, embedding_norm: true, window: {size: 3}",
            "task: {type: classification, labels: [a, b]}\n",
            "model.window: Bert has no sliding window",
        ),
    ],
    ids=["bert-final-norm", "llama-dynamic-rope-from-4", "bert-mean-pooling", "bert-window"],
)
def test_a_choice_transformers_would_compute_otherwise_is_refused(
    tmp_path: Path, model: str, task: str, named: str
) -> None:
    """Not written into a folder whose outputs differ from the run's."""
    assert named in _problems(tmp_path, model, task)


def test_a_model_no_architecture_takes_is_refused(tmp_path: Path) -> None:
    message = _problems(
        tmp_path,
        "family: vit, image_size: 8, patch_size: 4, d_model: 16, n_layers: 1, n_heads: 2, pooling: mean",
        "task: {type: image_classification, labels: [a, b]}\n",
    )
    assert "model.pooling: 'mean' has no ViT equivalent" in message
    unplaced = _problems(
        tmp_path / "2",
        "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
        "positional: none",
    )
    assert "has no transformers architecture" in unplaced


def test_an_existing_folder_is_replaced_only_when_asked(
    imported: dict[str, Imported], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run, out = str(imported["gpt2"].result.run_dir), tmp_path / "out"
    assert main(["export-hf", run, "--out", str(out)]) == 0
    assert main(["export-hf", run, "--out", str(out)]) == 1
    assert "pass --force" in capsys.readouterr().err
    assert main(["export-hf", run, "--out", str(out), "--force"]) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["export-hf", run, "--out", str(other), "--force"]) == 1
    assert (other / "notes.txt").read_text() == "mine"


def test_the_folder_a_run_was_imported_from_is_never_replaced(
    imported: dict[str, Imported], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """It holds the file names export-hf writes, and --force replaced the user's model with it."""
    source = tmp_path / "gpt2"
    shutil.copytree(imported["gpt2"].folder, source)
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    run = import_folder(source, "again", tmp_path / "specs", tmp_path / "runs").run_dir
    assert main(["export-hf", str(run), "--out", str(source), "--force"]) == 1
    assert f"{source} is the folder {run} was imported from" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_the_config_is_read_by_transformers_4_as_well(imported: dict[str, Imported], tmp_path: Path) -> None:
    """transformers 4 reads rope_theta and rope_scaling, 5 rope_parameters: both are written, the
    same; T5's tie is said by tie_word_embeddings alone (4 ignores scale_decoder_outputs)."""
    export_hf(imported["llama_yarn"].result.run_dir, tmp_path / "llama")
    config: dict[str, Any] = json.loads((tmp_path / "llama" / "config.json").read_text())
    assert config["rope_scaling"] == {k: v for k, v in config["rope_parameters"].items() if k != "rope_theta"}
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    export_hf(imported["t5_gated_silu_tied"].result.run_dir, tmp_path / "t5")
    t5 = json.loads((tmp_path / "t5" / "config.json").read_text())
    assert t5["tie_word_embeddings"] is False and "scale_decoder_outputs" not in t5


def test_an_unscaled_gpt2_warns_of_transformers_4s_sdpa_attention(tmp_path: Path) -> None:
    """transformers 4.57's GPT-2 passes no scale to SDPA, its default attention, which then scales
    q.k by 1/sqrt(head_dim) whatever scale_attn_weights says; its eager attention reads it."""
    run = random_run(tmp_path, f"model: {{{NATIVE['gpt2 unscaled']}}}\n")
    with pytest.warns(HFWarning, match="transformers 4's default SDPA attention ignores it"):
        export_hf(run, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["scale_attn_weights"] is False
