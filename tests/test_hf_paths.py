"""Imported checkpoints on every path, unchanged: the vocabularies, special-token ids, source end
tokens and image resizing of real checkpoints (T5's padded embedding table, BERT's [CLS] at 101,
T5's </s> after every source, ViT's stretch), fine-tuned, exported and served, and held to
transformers' own outputs."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hf_models import VOCAB, C, build, from_pretrained, perturb, write
from tokenizers import Tokenizer, models, processors

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import ImportResult, affixes, framing, import_folder, source_affixes
from tfcompile.runtime import Classifier, ImageClassifier, LanguageModel, Translator
from tfcompile.sequences import tidy
from tfcompile.spec import load_spec
from tfcompile.tasks.masked_lm import MaskedLanguageModelling
from tfcompile.train.checkpoint import load_state, resolve
from tfcompile.train.runs import load_run_spec

PADDED = VOCAB + 8  # embedding rows past the tokenizer's 64 tokens, as T5's 32128 for 32100
# BERT's layout, scaled to 64 tokens: [PAD] first, the others after the unused ids (101-103 in BERT).
BERT_IDS = {"[PAD]": 0, "[UNK]": 40, "[CLS]": 41, "[SEP]": 42, "[MASK]": 43}
TRAIN = ["--set", "train.steps=3", "--set", "train.batch_size=4", "--set", "train.eval_interval=3"]
TRAIN += ["--set", "train.eval_batches=1"]
SENTENCES = ["the cat sat.", "a dog ran!", "is it here?", "we go, now.", "the mat is red."]


def _import(
    model: Any, kind: str, root: Path, name: str, placed: dict[str, int] | None = None
) -> ImportResult:
    folder = root / "hf" / name
    write(model, kind, folder, placed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        return import_folder(folder, name, root / "specs", root / "runs")


def _tune(name: str, data: str) -> dict[str, Any]:
    """Fine-tune runs/NAME (train.init_from) for three steps on ``data``; -> the last metrics line."""
    tuned = ["--set", f"train.init_from=runs/{name}", "--set", f"train.name={name}-tuned"]
    data_path = ["--set", f"data.path={Path.cwd() / data}"]  # a relative one is the spec's
    assert main(["train", f"specs/{name}.yaml", *TRAIN, *tuned, *data_path]) == 0
    lines = Path(f"runs/{name}-tuned/metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def _t5(vocab: int) -> Any:
    """Weights twice T5's initial scale (and a seed) that make translations depend on the source."""
    torch.manual_seed(3)
    config = C.T5Config(
        vocab_size=vocab,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        decoder_start_token_id=0,
        n_positions=32,
        initializer_factor=2.0,
    )
    return perturb(C.T5ForConditionalGeneration(config))


def _qwen2(vocab: int) -> Any:
    torch.manual_seed(0)
    config = C.Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return perturb(C.Qwen2ForCausalLM(config))


# ------------------------------------------------------------ a vocabulary larger than the tokenizer


def test_t5_and_qwen2_with_padded_embedding_tables_fine_tune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _import(_t5(PADDED), "t5", tmp_path, "t5")
    _import(_qwen2(PADDED), "gpt2", tmp_path, "qwen2")
    for lang in ("de", "en"):
        Path(f"pairs.{lang}").write_text("\n".join(s[:: 1 if lang == "de" else -1] for s in SENTENCES * 8))
    Path("corpus.txt").write_text(" ".join(SENTENCES) * 40)
    t5 = _tune("t5", "pairs.{lang}")
    qwen2 = _tune("qwen2", "corpus.txt")
    sizes = [load_run_spec(Path(f"runs/{n}-tuned")).model.vocab_size for n in ("t5", "qwen2")]
    assert (sizes, t5["step"], qwen2["step"]) == ([PADDED, PADDED], 3, 3)
    assert np.isfinite([t5["val_loss"], qwen2["val_loss"]]).all()


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path: Path) -> None:
    """Refused at import (fine-tuning the run it wrote was refused, naming model.vocab_size)."""
    with pytest.raises(HFError, match=rf"has token ids up to {VOCAB - 1}, past the {VOCAB - 4} rows"):
        _import(_qwen2(VOCAB - 4), "gpt2", tmp_path, "qwen2")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_generation_never_picks_a_padded_row(tmp_path: Path) -> None:
    """The padded rows made the most likely tokens: the bundle's logits say so, generation still
    picks tokenizer ids only."""
    model = _qwen2(PADDED)
    with torch.no_grad():
        model.model.embed_tokens.weight[VOCAB:] *= 60.0
    result = _import(model, "gpt2", tmp_path, "qwen2")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = LanguageModel(tmp_path / "bundle")
    prompt = np.array([[5, 9, 13, 2]])
    assert bundle.logits(prompt)[0].argmax(-1).max() >= VOCAB
    assert max(bundle.generate(prompt, 8, temperature=0.0, stop=False)[0]) < VOCAB


# -------------------------------------------------------------- special tokens where BERT has them


def test_a_bert_vocabulary_masks_by_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[CLS] 41, [SEP] 42, [MASK] 43 (BERT: 101-103): examples, masking and random replacements
    use them, and a few steps of masked-LM fine-tuning run."""
    monkeypatch.chdir(tmp_path)
    result = _import(build("bert_mlm"), "bert", tmp_path, "bert_mlm", BERT_IDS)
    Path("corpus.txt").write_text("\n".join(SENTENCES * 8))
    spec = load_spec(result.spec_path).replace({"data": {"path": "corpus.txt"}})
    tokenizer = Tokenizer.from_file(str(result.run_dir / "tokenizer.json"))
    task = MaskedLanguageModelling(spec, tmp_path / "cache", tokenizer)
    batch = task.batch("train", 64, torch.Generator().manual_seed(0))
    chosen = batch["targets"] >= 0
    assert (batch["input_ids"][:, 0] == BERT_IDS["[CLS]"]).all()
    assert (batch["input_ids"] == BERT_IDS["[MASK]"]).any()
    assert not torch.isin(batch["targets"][chosen], torch.tensor(list(BERT_IDS.values()))).any()
    assert _tune("bert_mlm", "corpus.txt")["step"] == 3


@pytest.mark.slow
def test_a_bert_classifier_with_bert_ids_classifies_as_transformers_and_fine_tunes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = _import(build("bert_cls"), "bert", tmp_path, "bert_cls", BERT_IDS)
    hf, hf_tokenizer = (
        from_pretrained(tmp_path / "hf" / "bert_cls"),
        _hf_tokenizer(tmp_path / "hf" / "bert_cls"),
    )
    assert main(["export", str(result.run_dir), "--out", "bundle"]) == 0
    ours = Classifier("bundle").classify(SENTENCES)
    encoded = hf_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert encoded["input_ids"][0, 0] == BERT_IDS["[CLS]"]
    with torch.no_grad():
        theirs = hf(**encoded).logits.softmax(-1)
    labels = ["neg", "pos", "neutral"]
    got = np.array([[p.probabilities[label] for label in labels] for p in ours])
    assert np.abs(got - theirs.numpy()).max() < 1e-4
    rows = [f"{s}\t{labels[i % 3]}" for i, s in enumerate(SENTENCES * 8)]
    Path("table.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    assert _tune("bert_cls", "table.tsv")["step"] == 3
    assert main(["export", "runs/bert_cls-tuned", "--out", "tuned"]) == 0
    assert Classifier("tuned").classify(["the cat sat."])[0].label in labels


def _hf_tokenizer(folder: Path) -> Any:
    return C.AutoTokenizer.from_pretrained(folder)


# ------------------------------------------------------------- T5's source </s>, BART's <s> ... </s>


@pytest.mark.parametrize(
    ("processor", "around"),
    [
        (processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)]), ([], ["eos"])),
        (
            processors.TemplateProcessing(single="$A </s> <pad>", special_tokens=[("</s>", 1), ("<pad>", 0)]),
            ([], ["eos", "pad"]),
        ),
        (
            None,
            ([], []),
        ),  # a T5 trained without a source suffix, exported, then imported again: it gained [eos]
        # BART's: <s> is its cls (its bos is the decoder's start, </s>), and </s> its eos and sep
        (
            processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 5), ("</s>", 1)]),
            (["cls"], ["eos"]),
        ),
        (processors.RobertaProcessing(("</s>", 1), ("<s>", 5)), (["cls"], ["eos"])),
        (processors.BertProcessing(("</s>", 1), ("<s>", 5)), (["cls"], ["eos"])),
        (processors.TemplateProcessing(single="$A <x>", special_tokens=[("<x>", 3)]), None),  # no role
        (processors.TemplateProcessing(single="<x> $A", special_tokens=[("<x>", 3)]), None),
        (processors.TemplateProcessing(single="$A $B", pair="$A $B"), None),  # not one text
        (processors.ByteLevel(), None),
    ],
)
def test_a_translators_source_affixes_are_what_its_tokenizer_puts_around_a_text(
    tmp_path: Path, processor: Any, around: tuple[list[str], list[str]] | None
) -> None:
    tokenizer = Tokenizer(
        models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2, "<x>": 3, "a": 4, "<s>": 5}, unk_token="<unk>")
    )
    if processor is not None:
        tokenizer.post_processor = processor
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    roles = {"pad": "<pad>", "bos": "</s>", "eos": "</s>", "unk": "<unk>", "cls": "<s>", "sep": "</s>"}
    assert source_affixes(tmp_path, roles) == around
    assert source_affixes(tmp_path / "none", {"eos": "</s>"}) is None  # no tokenizer.json: T5's convention


@pytest.mark.parametrize(
    "single",
    [
        [{"SpecialToken": "x"}, {"Sequence": {"id": "A"}}],
        [{"SpecialToken": {"id": 3}}, {"Sequence": {"id": "A"}}],
        [1, {"Sequence": {"id": "A"}}],
        "$A",
    ],
)
def test_a_damaged_template_frames_nothing_and_raises_nothing(single: Any) -> None:
    """A tokenizer.json template whose pieces are no special tokens is not read as framing (the
    architecture's convention then stands), never a crash inside the import."""
    saved = {"post_processor": {"type": "TemplateProcessing", "single": single}}
    assert framing(saved) is None and affixes(saved, {"eos": "</s>"}) is None


@pytest.mark.slow
def test_a_t5_translates_as_transformers_greedy_generate(tmp_path: Path) -> None:
    result = _import(_t5(VOCAB), "t5", tmp_path, "t5")
    folder = tmp_path / "hf" / "t5"
    hf, hf_tokenizer = from_pretrained(folder), _hf_tokenizer(folder)
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = Translator(tmp_path / "bundle")
    eos = hf_tokenizer.convert_tokens_to_ids("</s>")
    assert bundle.manifest.translation is not None and bundle.manifest.translation.source_suffix_ids == [eos]
    ours = bundle.translate(SENTENCES, beam=1, max_len=10)
    theirs: list[str] = []
    without_end: list[str] = []
    for sentence in SENTENCES:
        ids = hf_tokenizer(sentence, return_tensors="pt")["input_ids"]
        assert ids[0, -1] == eos  # transformers' T5 tokenizer ends every source with </s>
        for source, out in ((ids, theirs), (ids[:, :-1], without_end)):
            generated = hf.generate(source, do_sample=False, num_beams=1, max_new_tokens=10)
            out.append(tidy(hf_tokenizer.decode(generated[0], skip_special_tokens=True)))
    assert ours == theirs and len(set(ours)) == len(SENTENCES)
    assert all(a != b for a, b in zip(ours, without_end, strict=True))  # </s> changes every translation


# ------------------------------------------------------------------------------ ViT's stretch


def test_a_vit_classifies_a_non_square_image_as_transformers(tmp_path: Path) -> None:
    result = _import(build("vit"), "image", tmp_path, "vit")
    folder = tmp_path / "hf" / "vit"
    assert json.loads((result.run_dir / "preprocessing.json").read_text())["resize"] == "stretch"
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = ImageClassifier(tmp_path / "bundle")
    assert bundle.manifest.image is not None and bundle.manifest.image.resize == "stretch"
    image = (np.random.default_rng(0).random((13, 29, 3)) * 255).astype(np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = C.AutoImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        theirs = from_pretrained(folder)(**processor(images=image, return_tensors="pt")).logits.softmax(-1)
    (ours,) = bundle.classify_images(image)
    got = np.array([ours.probabilities[label] for label in ("cat", "dog")])
    assert np.abs(got - theirs[0].numpy()).max() < 1e-4
    client = _python_client()  # the example client reads the manifest's resize too
    assert bundle.preprocessing is not None
    pixels = client.preprocess(bundle.manifest.image.model_dump(), image)
    assert np.array_equal(pixels, bundle.preprocessing.pixel_values([image])[0])


def test_exporting_a_cropping_vit_to_transformers_says_it_will_stretch(tmp_path: Path) -> None:
    result = _import(build("vit"), "image", tmp_path, "vit")
    record = result.run_dir / "preprocessing.json"
    record.write_text(json.dumps(json.loads(record.read_text()) | {"resize": "shorter_side"}))
    with pytest.warns(HFWarning, match="stretches it to a square"):
        export_hf(result.run_dir, tmp_path / "out")


def _python_client() -> Any:
    path = Path(__file__).parents[1] / "examples" / "python" / "client.py"
    spec = importlib.util.spec_from_file_location("example_client", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------- the checkpoint an import writes


def test_an_import_writes_the_checkpoint_train_resumes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step-0 checkpoint holds what Trainer.save writes (one helper writes both), so --resume
    continues the imported run itself."""
    monkeypatch.chdir(tmp_path)
    result = _import(build("gpt2"), "gpt2", tmp_path, "gpt2")
    checkpoint = resolve(result.run_dir, "best")
    assert checkpoint is not None and checkpoint == resolve(result.run_dir)
    state = load_state(checkpoint)
    assert (state["step"], state["best"], state["window_steps"], state["optimizer"]["state"]) == (
        0,
        None,
        0,
        {},
    )
    Path("corpus.txt").write_text(" ".join(SENTENCES) * 40)
    data = ["--set", f"data.path={tmp_path / 'corpus.txt'}"]
    assert main(["train", "specs/gpt2.yaml", "--resume", "runs/gpt2", *TRAIN, *data]) == 0
    assert load_state(resolve(result.run_dir) or checkpoint)["step"] == 3
