"""Published Hugging Face config.json files (tests/data/hf_configs, sources in SOURCES.md), each
shrunk to tiny sizes with every other field as published: transformers builds the model from it,
the folder keeps the published config.json, and the import gives transformers' logits in float32,
padded and not, or is refused naming the config field that tfcompile cannot compute."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import BERT as TINY_BERT
from hf_models import VOCAB, max_difference, perturb, write
from test_hf_roberta_distilbert import (
    camembert_tokenizer,
    difference,
    roberta_tokenizer,
    wordpiece_tokenizer,
    xlm_roberta_tokenizer,
)

from tfcompile.hf.bert import distinct
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers
CONFIGS = Path(__file__).parent / "data" / "hf_configs"
# Tiny heads, and a head of this width where the config's heads are d / heads: 16, of which the
# fraction each published config rotates (a quarter, Pythia's; 0.4, Phi-2's) is an even width.
HEADS, HEAD = 4, 16
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id")
# model_type -> (the field names of its sizes: width, heads, K/V heads, head width, feed-forward,
# layers, positions, further layers), the tokenizer its folder gets
BERT = ("hidden_size", "num_attention_heads", "", "", "intermediate_size", "num_hidden_layers")
SIZES: dict[str, tuple[tuple[str, ...], str]] = {
    "llama": (
        (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "num_hidden_layers",
            "max_position_embeddings",
        ),
        "llama",
    ),
    "gpt2": (("n_embd", "n_head", "", "", "n_inner", "n_layer", "n_positions"), "gpt2"),
    "opt": ((*BERT[:4], "ffn_dim", "num_hidden_layers", "max_position_embeddings"), "gpt2"),
    "gpt_neox": ((*BERT[:4], "intermediate_size", "num_hidden_layers", "max_position_embeddings"), "gpt2"),
    "gpt_bigcode": (("n_embd", "n_head", "", "", "n_inner", "n_layer", "n_positions"), "gpt2"),
    "gptj": (("n_embd", "n_head", "", "", "n_inner", "n_layer", "n_positions"), "gpt2"),
    # intermediate_size left null (4 x hidden_size); the window in shrunk
    "gpt_neo": (("hidden_size", "num_heads", "", "", "", "num_layers", "max_position_embeddings"), "gpt2"),
    "falcon": (
        (
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "",
            "ffn_hidden_size",
            "num_hidden_layers",
            "",
        ),
        "gpt2",
    ),
    "bloom": (("hidden_size", "n_head", "", "", "", "n_layer", ""), "gpt2"),  # 4 x hidden_size wide
    "mpt": (("d_model", "n_heads", "", "", "", "n_layers", "max_seq_len"), "gpt2"),  # 4 x d_model wide
    "bert": ((*BERT, "max_position_embeddings"), "bert"),
    "distilbert": (("dim", "n_heads", "", "", "hidden_dim", "n_layers", "max_position_embeddings"), "bert"),
    "t5": (("d_model", "num_heads", "", "d_kv", "d_ff", "num_layers", "", "num_decoder_layers"), "t5"),
    "vit": ((*BERT, ""), "image"),
}
SIZES |= dict.fromkeys(
    ("mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "phi", "starcoder2"),
    SIZES["llama"],
)
SIZES |= dict.fromkeys(("olmo", "olmo2", "smollm3", "granite"), SIZES["llama"])
SIZES |= dict.fromkeys(("cohere", "cohere2"), SIZES["llama"])
SIZES |= dict.fromkeys(("roberta", "xlm-roberta", "camembert"), SIZES["bert"])
SIZES["electra"] = ((*BERT, "max_position_embeddings", "embedding_size"), "bert")  # embeddings: 32 wide
SIZES["mt5"] = SIZES["t5"]
# BART's and the model types on its code: the encoder's sizes (the decoder's are set alike in shrunk)
BART = (
    "d_model",
    "encoder_attention_heads",
    "",
    "",
    "encoder_ffn_dim",
    "encoder_layers",
    "max_position_embeddings",
)
SIZES |= dict.fromkeys(("marian", "pegasus", "bart", "mbart"), (BART, "t5"))
TOKENIZERS = {
    "roberta": roberta_tokenizer,
    "xlm-roberta": lambda: xlm_roberta_tokenizer(pad=1),  # the published config's pad id
    "camembert": camembert_tokenizer,
    "distilbert": wordpiece_tokenizer,
}
AUTO = {
    "CausalLM": T.AutoModelForCausalLM,
    "LMHeadModel": T.AutoModelForCausalLM,
    "MaskedLM": T.AutoModelForMaskedLM,
    "PreTraining": T.AutoModelForPreTraining,
    "SequenceClassification": T.AutoModelForSequenceClassification,
    "ImageClassification": T.AutoModelForImageClassification,
    "ConditionalGeneration": T.AutoModelForSeq2SeqLM,
    "MTModel": T.AutoModelForSeq2SeqLM,  # Marian's
    "QuestionAnswering": T.AutoModelForQuestionAnswering,
}
# name -> the config field its refusal names (the README says each is refused)
REFUSED = {
    "opt-350m": "word_embed_proj_dim",
    "distilbert-base-uncased-distilled-squad": "architectures",
    "electra-small-discriminator": "architectures",  # ElectraForPreTraining: a replaced-token head
}


def published(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its sizes tiny and every other field as published: heads of HEAD wide (a
    head_dim, d_kv or rotary_dim in the published ratio to d / heads, rounded to even), as many
    K/V heads per head as published (at least one), two layers, 64 positions (a RoBERTa's pad
    offset kept past them), VOCAB tokens (token ids past them taken modulo VOCAB), 8-pixel
    images of 4-pixel patches."""
    names, _ = SIZES[config["model_type"]]
    width, heads, kv, head_dim, ff, layers, positions, *more = names
    out = dict(config)
    n = config.get(heads, 0)
    wide = config.get(width, 0) / max(n, 1)
    out |= {width: HEADS * HEAD, heads: HEADS, layers: 2} | ({ff: 64} if ff else {})
    if kv and config.get(kv) is not None:
        out[kv] = max(1, HEADS * config[kv] // n)
    if head_dim and config.get(head_dim) is not None:
        out[head_dim] = 2 * round(HEAD * config[head_dim] / wide / 2)  # even, as RoPE needs
    if isinstance(config.get("rotary_dim"), int):  # GPT-J's rotated dimensions, in the published ratio
        out["rotary_dim"] = 2 * round(HEAD * config["rotary_dim"] / wide / 2)
    if positions and config.get(positions) is not None:
        offset = config[positions] % 512 if config[positions] in (514, 515) else 0
        out[positions] = 64 + offset
    for name in (*more, "n_ctx", "word_embed_proj_dim", "pooler_output_size"):
        if config.get(name) is not None:
            shrink = config[name] == config.get(width) or name == "n_ctx"
            out[name] = {"n_ctx": 64, "num_decoder_layers": 1}.get(name, out[width] if shrink else 32)
    if "vocab_size" in config or config["model_type"] != "vit":
        out["vocab_size"] = VOCAB
    for name in TOKEN_IDS:
        value = config.get(name)
        if isinstance(value, int):
            out[name] = value % VOCAB
        elif isinstance(value, list):
            out[name] = [v % VOCAB for v in value]
    if config["model_type"] == "gpt_neo":  # the first two layers, the window in its ratio to the context
        out["attention_types"] = [[config["attention_layers"][:2], 1]]
        out["attention_layers"] = config["attention_layers"][:2]
        out["window_size"] = 64 * config["window_size"] // config["max_position_embeddings"]
    if config["model_type"] == "smollm3":  # two layers of the published pattern, one of them NoPE
        out["no_rope_layers"] = config["no_rope_layers"][2:4]
    if config["model_type"] == "cohere2":  # a sliding layer and a full (NoPE) one, a window the inputs pass
        out |= {"sliding_window_pattern": 2, "sliding_window": 8}
    if "decoder_attention_heads" in config:  # a translator's decoder: the encoder's heads and width, a layer
        out |= {"decoder_attention_heads": HEADS, "decoder_ffn_dim": 64, "decoder_layers": 1}
    if config["model_type"] == "vit":
        out |= {"image_size": 8, "patch_size": 4}
        if "encoder_stride" in config:
            out["encoder_stride"] = 4
    return out


def auto_class(config: dict[str, Any]) -> Any:
    """The Auto class transformers loads the config's head with (T5's old T5WithLMHeadModel is a
    sequence-to-sequence model, as its model_type says)."""
    if config["model_type"] in ("t5", "mt5"):
        return T.AutoModelForSeq2SeqLM
    return next(auto for suffix, auto in AUTO.items() if config["architectures"][0].endswith(suffix))


def save(name: str, folder: Path) -> dict[str, Any]:
    """The published config shrunk, a random model transformers builds from it saved into
    ``folder`` with a tokenizer (or image processor), and config.json written back as published
    (shrunk): save_pretrained would write it in its own version's fields."""
    config = shrunk(published(name))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = T.AutoConfig.from_pretrained(folder)
        model = auto_class(config).from_config(hf_config, dtype=torch.float32)
    head = getattr(model, "lm_head", None)
    if config.get("tie_word_embeddings") is False and head is not None:  # transformers 5 ties a new one
        head.weight = torch.nn.Parameter(torch.randn_like(head.weight))
    perturb(model)
    kind = SIZES[config["model_type"]][1]
    if config["model_type"] in TOKENIZERS:
        model.save_pretrained(folder)
        TOKENIZERS[config["model_type"]]().save_pretrained(folder)
    else:
        write(model, kind, folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return config


def loaded(folder: Path, config: dict[str, Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return auto_class(config).from_pretrained(folder, dtype=torch.float32).eval()


def imported(folder: Path, root: Path) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        result = import_folder(folder, "published", root / "specs", root / "runs")
    return load_trained_model(result.run_dir)[1]


def gap(hf: Any, ours: torch.nn.Module, config: dict[str, Any]) -> float:
    """The largest |difference| of the two models' outputs, padded and not."""
    if config["model_type"] in TOKENIZERS:
        return difference(hf, ours, 12)
    return max(max_difference(hf, ours, padded) for padded in (True, False))


NAMES = sorted(p.stem for p in CONFIGS.glob("*.json"))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in REFUSED])
def test_a_published_config_imports_to_transformers_logits(name: str, tmp_path: Path) -> None:
    config = save(name, tmp_path / "hf")
    hf = loaded(tmp_path / "hf", config)
    ours = imported(tmp_path / "hf", tmp_path)
    assert gap(hf, ours, config) < 2e-5
    qkv = next(p for n, p in ours.named_parameters() if n.endswith("qkv.weight"))
    with torch.no_grad():  # the comparison sees a mapping error: q, k and v of one layer off, ten
        qkv.add_(0.1 * torch.randn_like(qkv))  # times the bound above (BART's logits are small)
    assert gap(hf, ours, config) > 2e-4


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_published_config_tfcompile_cannot_compute_is_refused_by_field(name: str, tmp_path: Path) -> None:
    save(name, tmp_path / "hf")
    with pytest.raises(HFError, match=REFUSED[name]):
        imported(tmp_path / "hf", tmp_path)


def test_every_published_config_is_in_the_sources() -> None:
    sources = (CONFIGS / "SOURCES.md").read_text()
    assert [n for n in NAMES if f"`{n}.json`" not in sources] == []


def test_labels_published_twice_are_told_apart_by_id(tmp_path: Path) -> None:
    """google/vit-base-patch16-224 names ImageNet classes 134 and 517 both "crane": the second
    output is "crane (517)", with a warning that says so."""
    save("vit-base-patch16-224", tmp_path / "hf")
    with pytest.warns(HFWarning, match=r"'crane' -> 'crane \(517\)'"):
        result = import_folder(tmp_path / "hf", "vit", tmp_path / "specs", tmp_path / "runs")
    labels = result.spec.task.labels
    assert (labels[134], labels[517], len(set(labels))) == ("crane", "crane (517)", 1000)


@pytest.mark.parametrize(
    ("names", "renamed"),
    [
        (["a", "a", "a (1)"], ["a", "a (1) (1)", "a (1)"]),  # "a (1)" is the third label's name
        (["crane", "x", "crane (0)", "crane"], ["crane", "x", "crane (0)", "crane (3)"]),
        (["a", "a", "a"], ["a", "a (1)", "a (2)"]),
    ],
)
def test_a_repeated_label_is_renamed_to_a_name_no_other_label_has(
    names: list[str], renamed: list[str]
) -> None:
    with pytest.warns(HFWarning, match="names a label more than once"):
        assert distinct(names) == renamed


def test_a_classifier_whose_renamed_label_is_another_label_imports(tmp_path: Path) -> None:
    config = transformers.BertConfig(**TINY_BERT, id2label={0: "a", 1: "a", 2: "a (1)"}, label2id={"a": 0})
    write(transformers.BertForSequenceClassification(config), "bert", tmp_path / "hf")
    with pytest.warns(HFWarning, match=r"'a' -> 'a \(1\) \(1\)'"):
        result = import_folder(tmp_path / "hf", "x", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.labels == ["a", "a (1) (1)", "a (1)"]
