"""Runs whose tokenizer was imported with the model: a classifier fine-tuned from an imported
RoBERTa, XLM-RoBERTa, CamemBERT or BERT frames sentences and pairs as that tokenizer does (its
post-processor kept, segment ids as it gives them), while tfcompile's own tokenizers get BERT's
template; a causal LM's documents end with the imported eos token; and a classifier bundle cuts
a text past its context by one rule whatever its tokenizer.json says about truncation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hf_models import Imported, build, write
from test_hf_roberta_distilbert import imported_variant
from tokenizers import Tokenizer, models, processors

from tfcompile.cli import main
from tfcompile.data import DataError
from tfcompile.hf.importer import import_folder
from tfcompile.manifest import Truncation
from tfcompile.runtime.classifier import cut_to_context
from tfcompile.spec import Spec, load_spec
from tfcompile.tasks.causal_lm import LanguageModelling
from tfcompile.tasks.classification import TextClassification
from tfcompile.train.runs import read_run_tokenizer

transformers = pytest.importorskip("transformers")

ROBERTAS = ["roberta_cls", "xlm-roberta_cls", "camembert_cls"]
PLACED = {"[CLS]": 40, "[SEP]": 41}  # an imported BERT's [CLS] and [SEP] away from tfcompile's 2 and 3
ROWS = [("the cat sat", "a hat", "pos"), ("that is a hit", "in a hat", "neg"), ("a", "the", "neutral")]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("imports")
    runs = {family: imported_variant(root, family) for family in ROBERTAS}
    # A BERT classifier whose tokenizer holds [CLS] and [SEP] at the PLACED ids.
    runs["bert_placed"] = Imported(
        root, "bert_placed", lambda folder: write(build("bert_cls"), "bert", folder, PLACED), "ignore"
    )
    return runs


def _table(folder: Path) -> Path:
    path = folder / "pairs.tsv"
    path.write_text("sentence\tother\tlabel\n" + "".join(f"{a}\t{b}\t{label}\n" for a, b, label in ROWS * 4))
    return path


def _classifier(spec: Spec, folder: Path, tokenizer: Tokenizer | None) -> TextClassification:
    data = {"path": str(_table(folder)), "val_path": None, "val_fraction": 0.25}
    changed = spec.replace({"data": data, "task": {"pair_column": "other"}})
    return TextClassification(changed, folder / "cache", tokenizer)


def _rows(task: TextClassification) -> list[tuple[list[int], list[int]]]:
    """Each training example's ids and segment ids, as a batch holds them (padding left out)."""
    n = len(task.examples["train"][1])
    batch = task._collate("train", list(range(n)))
    real = batch["attention_mask"].bool()
    return [
        (ids[mask].tolist(), types[mask].tolist())
        for ids, types, mask in zip(batch["input_ids"], batch["token_type_ids"], real, strict=True)
    ]


@pytest.mark.parametrize("family", [*ROBERTAS, "bert_placed"])
def test_a_classifier_frames_sentences_as_its_imported_tokenizer_does(
    imported: dict[str, Any], family: str, tmp_path: Path
) -> None:
    """Fine-tuning an imported classifier: each pair is what transformers' tokenizer makes of it
    (RoBERTa's <s> A </s></s> B </s>, every token segment 0; BERT's [CLS] A [SEP] B [SEP] at ids 40
    and 41, B's part segment 1), and the run keeps the tokenizer's post-processor."""
    case = imported[family]
    run = case.result.run_dir
    tokenizer = Tokenizer.from_file(str(run / "tokenizer.json"))
    task = _classifier(load_spec(run / "spec.yaml"), tmp_path, tokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(case.folder)
    for ids, types in _rows(task):
        pair = next((a, b) for a, b, _ in ROWS if theirs(a, b)["input_ids"] == ids)
        encoded = theirs(*pair, return_token_type_ids=True)
        assert types == encoded["token_type_ids"]
    saved = json.loads(task.run_files()["tokenizer.json"])
    assert saved["post_processor"] == json.loads((run / "tokenizer.json").read_text())["post_processor"]
    if family == "bert_placed":
        assert (ids[0], ids[-1], 1 in types) == (40, 41, True)
    else:
        assert set(types) == {0}


@pytest.mark.parametrize("kind", ["char", "bpe", "wordpiece"])
def test_tfcompile_tokenizers_get_berts_template(kind: str, tmp_path: Path) -> None:
    """A classifier trained from scratch: [CLS] A [SEP] B [SEP] at ids 2 and 3, B's part segment 1;
    a given tokenizer whose post-processor frames otherwise ($A [SEP]) is given the template too."""
    spec = load_spec(Path(__file__).parents[1] / "specs" / "sst2-finetune.yaml", ["train.init_from=null"])
    spec = spec.replace(
        {"data": {"tokenizer": {"type": kind}}, "task": {"labels": ["neg", "pos", "neutral"]}}
    )
    task = _classifier(spec, tmp_path, None)
    for ids, types in _rows(task):
        first = types.index(1)
        assert (ids[0], ids[first - 1], ids[-1]) == (2, 3, 3) and types == sorted(types)
        assert ids.count(2) == 1 and ids.count(3) == 2
    tokenizer = Tokenizer.from_str(task.run_files()["tokenizer.json"])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A [SEP]", special_tokens=[("[SEP]", 3)])
    again = _classifier(spec, tmp_path, tokenizer)
    assert _rows(again) == _rows(task)


def test_cut_to_context_cuts_as_the_manifest_says_within_the_context() -> None:
    """None: longest-first from the right at the context, whatever tokenizer.json holds; a longer
    max_length (a hub tokenizer's 512): the context, its strategy and direction kept; a shorter one
    (train.context_length): kept."""
    tokenizer = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    tokenizer.enable_truncation(8, strategy="only_first")
    cut_to_context(tokenizer, None, 32)
    assert tokenizer.truncation == {
        "max_length": 32,
        "stride": 0,
        "strategy": "longest_first",
        "direction": "right",
    }
    cut_to_context(tokenizer, Truncation(max_length=512, strategy="only_second", direction="left"), 32)
    assert tokenizer.truncation == {
        "max_length": 32,
        "stride": 0,
        "strategy": "only_second",
        "direction": "left",
    }
    cut_to_context(tokenizer, Truncation(max_length=16, strategy="longest_first", direction="right"), 32)
    assert tokenizer.truncation is not None and tokenizer.truncation["max_length"] == 16


def test_an_imported_causal_lm_ends_each_document_with_its_eos_token(tmp_path: Path) -> None:
    """task.special_tokens on an imported GPT-2: every file of the folder ends with <|endoftext|>
    (the spec's tokens.eos), not with a [EOS] the vocabulary lacks; a spec naming no eos is refused."""
    folder = tmp_path / "hf"
    write(build("gpt2"), "gpt2", folder)
    result = import_folder(folder, "gpt2", tmp_path / "specs", tmp_path / "runs")
    tokenizer = Tokenizer.from_file(str(result.run_dir / "tokenizer.json"))
    documents = tmp_path / "documents"
    documents.mkdir()
    for i in range(3):
        (documents / f"{i}.txt").write_text("the cat sat on the mat. " * 40)
    spec = result.spec.replace({"data": {"path": str(documents)}, "task": {"special_tokens": True}})
    task = LanguageModelling(spec, tmp_path / "cache", tokenizer)
    eos = tokenizer.token_to_id("<|endoftext|>")
    ids = torch.cat([task.corpus.train, task.corpus.val])
    assert int((ids == eos).sum()) == 3 and int(ids[-1]) == eos
    without = spec.replace({"tokens": {"eos": None, "bos": None, "unk": None}})
    with pytest.raises(DataError, match=r"tokens\.eos"):
        LanguageModelling(without, tmp_path / "cache", tokenizer)


def test_an_imported_tokenizer_cuts_and_pads_nothing_transformers_would_not(tmp_path: Path) -> None:
    """A tokenizer.json saved with a truncation and padding (a fine-tune saved after
    ``truncation=True``): transformers applies neither unless asked, and neither does the import's
    run (a prompt, a corpus and a bundle's text kept whole); a run imported before, whose file holds
    them, trains on its whole corpus, without padding in its stream."""
    folder = tmp_path / "hf"
    write(build("gpt2"), "gpt2", folder)
    fine_tuned = Tokenizer.from_file(str(folder / "tokenizer.json"))
    fine_tuned.enable_truncation(4)
    fine_tuned.enable_padding(pad_id=5000, pad_token="<pad>")  # past the rows: padding is no token
    fine_tuned.save(str(folder / "tokenizer.json"))
    text = "the cat sat on the mat. " * 3
    theirs = transformers.AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    assert len(theirs) == len(text)  # a character tokenizer, left whole
    result = import_folder(folder, "gpt2", tmp_path / "specs", tmp_path / "runs")
    ours = Tokenizer.from_file(str(result.run_dir / "tokenizer.json"))
    assert ours.truncation is None and ours.padding is None
    assert ours.encode(text).ids == theirs
    fine_tuned.save(str(result.run_dir / "tokenizer.json"))  # as an older import wrote it
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text * 400)  # pieces of unequal lengths, each past the saved max_length
    spec = result.spec.replace({"data": {"path": str(corpus)}})
    tokenizer = read_run_tokenizer(result.run_dir)
    assert tokenizer is not None
    task = LanguageModelling(spec, tmp_path / "cache", tokenizer)
    assert torch.cat([task.corpus.train, task.corpus.val]).tolist() == ours.encode(text * 400).ids


def _transformers_probabilities(case: Any, items: list[Any], context: int) -> np.ndarray:
    """transformers' model on its tokenizer's longest-first truncation at ``context`` tokens."""
    theirs = transformers.AutoTokenizer.from_pretrained(case.folder)
    rows = []
    for item in items:
        encoded = theirs(*((item,) if isinstance(item, str) else item), truncation=True, max_length=context)
        assert len(encoded["input_ids"]) == context
        with torch.no_grad():
            logits = case.hf(**{k: torch.tensor([v]) for k, v in encoded.items()}).logits
        rows.append(logits.softmax(-1)[0].numpy())
    return np.array(rows)


LONG = "the cat sat on a mat and the dog ran in a hat " * 8  # past any test model's 32 tokens


@pytest.mark.slow
def test_an_imported_classifier_bundle_cuts_long_text_to_its_context(
    imported: dict[str, Any], tmp_path: Path
) -> None:
    """Its tokenizer.json has no truncation: a text or pair past the context is read as
    transformers' tokenizer truncates it (longest first) to the context, not refused."""
    from tfcompile.runtime import load

    case = imported["roberta_cls"]
    assert main(["export", str(case.result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert bundle.manifest.tokenizer is not None and bundle.manifest.tokenizer.truncation is None
    items = [LONG, (LONG, "a hat"), ("a hat", LONG), (LONG, LONG[:60])]
    ours = np.array([list(p.probabilities.values()) for p in bundle.classify(items)])
    np.testing.assert_allclose(ours, _transformers_probabilities(case, items, bundle.max_seq_len), atol=1e-5)


@pytest.mark.slow
def test_a_tfcompile_classifier_bundle_cuts_long_text_by_the_same_rule(classifier_bundle: Path) -> None:
    """Its tokenizer.json truncates at the context itself: the same longest-first cut, read as
    the ids cut so and fed to the model graph."""
    from tfcompile.runtime import load

    bundle = load(classifier_bundle)
    context = bundle.max_seq_len
    reference = Tokenizer.from_file(str(classifier_bundle / "tokenizer.json"))
    reference.no_truncation()
    reference.enable_truncation(context)
    items = [LONG, (LONG, "a fine film"), ("a fine film", LONG), (LONG, LONG[:60])]
    for item, prediction in zip(items, bundle.classify(items), strict=True):
        encoded = reference.encode(*((item,) if isinstance(item, str) else item))
        assert len(encoded.ids) == context
        logits = bundle.logits(np.array([encoded.ids]), None, np.array([encoded.type_ids]))
        expected = np.exp(logits[0] - logits[0].max()) / np.exp(logits[0] - logits[0].max()).sum()
        assert list(prediction.probabilities.values()) == pytest.approx(expected.tolist(), abs=1e-6)


@pytest.mark.slow
def test_an_imported_roberta_classifier_fine_tunes_resumes_and_exports(
    imported: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's path on a RoBERTa classifier: import, fine-tune (train.init_from) or continue
    (--resume) on pairs; the tuned run's bundle frames a pair as the imported tokenizer does."""
    from tfcompile.runtime import load

    monkeypatch.chdir(tmp_path)
    case = imported["roberta_cls"]
    assert main(["import", str(case.folder), "--name", "roberta"]) == 0
    small = ["--set", "train.steps=2", "--set", "train.batch_size=4", "--set", "train.eval_interval=2"]
    small += ["--set", "train.eval_batches=1", "--set", f"data.path={_table(tmp_path)}"]
    small += ["--set", "task.pair_column=other", "--set", "train.device=cpu"]
    tuned = ["--set", "train.init_from=runs/roberta", "--set", "train.name=tuned"]
    assert main(["train", "specs/roberta.yaml", *small, *tuned]) == 0
    assert main(["train", "specs/roberta.yaml", "--resume", "runs/roberta", *small]) == 0
    assert main(["export", "runs/tuned", "--out", "bundle"]) == 0
    bundle = load("bundle")
    theirs = transformers.AutoTokenizer.from_pretrained(case.folder)
    encoded = bundle.encode([("the cat sat", "a hat")])[0]
    assert encoded.ids == theirs("the cat sat", "a hat")["input_ids"] and set(encoded.type_ids) == {0}
    assert bundle.manifest.tokenizer is not None and bundle.manifest.tokenizer.truncation is not None
