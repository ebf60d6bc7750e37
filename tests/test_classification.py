"""Classification: tables, F1, SST-2 on the CPU, fine-tuning from a pretraining run, the bundle."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, SHARED_DATA, assert_follows_schema

from tfcompile.cli import main
from tfcompile.data import DataError
from tfcompile.data.table import read_table
from tfcompile.export import ExportError, Source, check_classifier_parity, export_bundle
from tfcompile.runtime import Classifier, InputError, load
from tfcompile.spec import load_spec
from tfcompile.tasks.classification import f1_score, label_index, resolve_labels
from tfcompile.train import Trainer, TrainError, load_trained_model, read_metrics
from tfcompile.train.checkpoint import checkpoint_dir, resolve

SST2 = SHARED_DATA / "sst2"
TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.max_seq_len=48",
    "data.tokenizer.vocab_size=1000",
    "train.batch_size=32",
    "train.optimizer.lr=1e-3",
    "train.schedule.warmup_steps=10",
]


def test_tables_in_every_format_and_the_errors_that_name_the_fix(tmp_path: Path) -> None:
    rows = [("a good film", "no", "pos"), ("a bad film", "yes", "neg")]
    (tmp_path / "t.tsv").write_text("text\tpair\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows))
    (tmp_path / "t.csv.gz").write_bytes(
        gzip.compress(("text,pair,label\n" + "".join(",".join(r) + "\n" for r in rows)).encode())
    )
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps(dict(zip(("text", "pair", "label"), r, strict=True))) + "\n" for r in rows)
    )
    for name in ("t.tsv", "t.csv.gz", "t.jsonl"):
        table = read_table(tmp_path / name, "text", "pair", "label")
        assert table.texts == ["a good film", "a bad film"] and table.pairs == ["no", "yes"]
        assert table.labels == ["pos", "neg"]
    with pytest.raises(DataError, match=r"no column 'sentence'; it has \['text', 'pair', 'label'\]"):
        read_table(tmp_path / "t.tsv", "sentence", None, "label")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(DataError, match=r"expected one of \.tsv, \.csv, \.jsonl"):
        read_table(tmp_path / "t.txt", "text", None, "label")
    (tmp_path / "e.tsv").write_text("text\tlabel\nfine\t\n")
    with pytest.raises(DataError, match="row 1: the 'label' cell is empty"):
        read_table(tmp_path / "e.tsv", "text", None, "label")


def test_label_values_are_names_or_indices_into_the_names() -> None:
    names = ["negative", "positive"]
    # SST-2's 0 and 1, named by task.labels.
    assert resolve_labels(names, {"training": ["1", "0"], "validation": ["0"]}, "sst2") == names
    assert label_index(names, {"0", "1"}) == {"0": 0, "1": 1}
    assert label_index(names, {"positive", "negative"}) == {"negative": 0, "positive": 1}
    # Names that are numbers are names: the star ratings 1-3 are classes 0-2.
    assert label_index(["1", "2", "3"], {"1", "3"}) == {"1": 0, "2": 1, "3": 2}
    # A mix, or an index past the names, is neither, and says what to do.
    with pytest.raises(DataError, match=r"labels \['0'\] outside task.labels \['1', '2', '3'\]"):
        resolve_labels(["1", "2", "3"], {"training": ["0", "1"]}, "stars")
    with pytest.raises(DataError, match=r"labels \['0', '2'\] outside task.labels"):
        resolve_labels(names, {"training": ["0", "2"]}, "sst2")


def test_f1_binary_and_macro() -> None:
    predicted, actual = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1])
    assert f1_score(predicted, actual, 2) == pytest.approx(
        2 * 2 / (2 * 2 + 1 + 1)
    )  # class 1: tp 2, fp 1, fn 1
    three_p, three_a = np.array([0, 1, 2, 2]), np.array([0, 1, 1, 2])
    assert f1_score(three_p, three_a, 3) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)


# The fixtures' runs are small: pretraining takes batches of 8 (not the spec's 128 sequences of 128
# tokens), and fine-tuning reads SST-2's dev split alone (not train's 67,000 rows to encode).
PRETRAIN = [*TINY, "train.steps=4", "train.eval_interval=4", "train.eval_batches=1", "train.batch_size=8"]
DEV_ONLY = [f"data.path={SST2 / 'dev.tsv.gz'}", "data.val_path=null"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    spec = load_spec(
        ROOT / "specs" / "bert-mini-shakespeare.yaml",
        [*PRETRAIN, f"train.runs_dir={runs}"],
    )
    Trainer(spec, runs / "pretrain", show_progress=False).train()
    return runs / "pretrain"


@pytest.fixture(scope="module")
def finetuned(pretrained: Path) -> Path:
    spec = load_spec(
        ROOT / "specs" / "sst2-finetune.yaml",
        [*TINY, f"train.init_from={pretrained}", "train.steps=2", "train.eval_interval=2", *DEV_ONLY],
    ).replace({"train": {"runs_dir": pretrained.parent}})
    Trainer(spec, pretrained.parent / "finetune", show_progress=False).train()
    return pretrained.parent / "finetune"


@pytest.mark.slow  # a learning run: 300 steps on SST-2
def test_sst2_from_scratch_on_the_cpu_is_well_above_chance(tmp_path: Path) -> None:
    overrides = ["model.d_model=64", "train.batch_size=64", "train.steps=300", "train.eval_interval=100"]
    spec = load_spec(
        ROOT / "specs" / "sst2-finetune.yaml",
        [*TINY, *overrides, "train.init_from=null", f"train.runs_dir={tmp_path}"],
    )
    result = Trainer(spec, tmp_path / "sst2", show_progress=False).train()
    # The dev split is 444 positive, 428 negative: chance is 51%.
    assert result.metrics["val_accuracy"] > 0.7, result.metrics
    assert result.metrics["val_f1"] > 0.6
    # The best checkpoint is the most accurate one, whatever the loss did.
    evaluations = [r for r in read_metrics(tmp_path / "sst2") if "val_accuracy" in r]
    best = max(evaluations, key=lambda r: r["val_accuracy"])
    assert result.best_metric == "val_accuracy" and result.best == best["val_accuracy"]
    assert (
        resolve(tmp_path / "sst2", "best") == checkpoint_dir(tmp_path / "sst2") / f"step-{best['step']:06d}"
    )
    saved = load_spec(tmp_path / "sst2" / "spec.yaml")
    assert saved.task.type == "classification" and saved.task.labels == ["negative", "positive"]


def test_fine_tuning_starts_from_the_pretrained_encoder(pretrained: Path, finetuned: Path) -> None:
    _, source = load_trained_model(pretrained, "best")
    spec = load_spec(finetuned / "spec.yaml")
    assert (finetuned / "tokenizer.json").read_text().startswith("{")
    # Weights after 2 steps at lr 1e-3 stay within a few lr of the pretrained ones; fresh ones would not.
    tuned = load_trained_model(finetuned, "last")[1].state_dict()
    for name, tensor in source.state_dict().items():
        if name.startswith(("mlm_", "lm_head", "nsp_head")):
            assert name not in tuned
            continue
        assert (tuned[name] - tensor).abs().max() < 0.01, name
    assert spec.model.vocab_size == load_spec(pretrained / "spec.yaml").model.vocab_size


def test_init_from_a_run_that_does_not_fit_lists_what_differs(pretrained: Path, tmp_path: Path) -> None:
    overrides = [*TINY, f"train.init_from={pretrained}", f"train.runs_dir={tmp_path}"]
    spec = load_spec(
        ROOT / "specs" / "sst2-finetune.yaml", [*overrides, "model.n_layers=3", "model.d_model=64"]
    )
    with pytest.raises(TrainError) as error:
        Trainer(spec, tmp_path / "x", show_progress=False)
    message = str(error.value)
    assert "model.n_layers (run: 2, spec: 3)" in message and "model.d_model (run: 32, spec: 64)" in message
    assert "embed.weight (run: (1000, 32), spec: (1000, 64))" in message
    assert "tensors the run lacks: blocks.2." in message
    # Dropout may change between pretraining and fine-tuning.
    spec = load_spec(ROOT / "specs" / "sst2-finetune.yaml", [*overrides, "model.dropout.residual=0.3"])
    initialised = str(Trainer(spec, tmp_path / "y", show_progress=False).initialized_from)
    assert initialised.startswith(f"initialised from {pretrained}")  # what the log's line says
    assert initialised.endswith(
        "tensors of its body; new: classifier; its mlm_dense, mlm_norm, lm_head, nsp_head not used"
    )
    spec = load_spec(ROOT / "specs" / "sst2-finetune.yaml", [*overrides, f"train.init_from={tmp_path}"])
    with pytest.raises(TrainError, match=r"train\.init_from: .* is not a run: it has no spec\.yaml"):
        Trainer(spec, tmp_path / "z", show_progress=False)


def test_classifier_bundle_parity_and_runtime_classify(finetuned: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    reports = export_bundle(None, Source(run=finetuned), bundle)
    assert set(reports) == {"model"} and reports["model"].max_abs_diff < 1e-5
    assert_follows_schema(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["task"] == "classification" and manifest["labels"] == ["negative", "positive"]
    names = [i["name"] for i in manifest["graphs"]["model"]["inputs"]]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]

    _, model = load_trained_model(finetuned)
    shapes = [(1, 2, False), (3, 11, True), (8, 30, True), (2, 48, True)]
    report = check_classifier_parity(model, bundle / "model.onnx", 1e-5, shapes, seed=3)
    assert report.passed, report.to_dict()

    runtime = load(bundle, providers=["CPUExecutionProvider"])
    assert isinstance(runtime, Classifier) and runtime.labels == ["negative", "positive"]
    texts = [
        "a gorgeous , witty , seductive movie .",
        "the plot is nothing but boilerplate clichés from start to finish",
        "it 's a charming and often affecting journey .",
    ]
    predictions = runtime.classify(texts)
    tokenizer = runtime.tokenizer
    assert tokenizer is not None
    for text, prediction in zip(texts, predictions, strict=True):
        e = tokenizer.encode(text)
        with torch.no_grad():
            logits = model(torch.tensor([e.ids]), None, torch.tensor([e.type_ids]))
        expected = torch.softmax(logits.double(), -1)[0].tolist()
        assert list(prediction.probabilities.values()) == pytest.approx(expected, abs=1e-5)
        assert prediction.label == ["negative", "positive"][int(np.argmax(expected))]
    pair = runtime.classify([("a good film", "i liked it")])[0]
    e = tokenizer.encode("a good film", "i liked it")
    assert e.type_ids[-1] == 1 and e.tokens[0] == "[CLS]"
    with torch.no_grad():
        expected = torch.softmax(model(torch.tensor([e.ids]), None, torch.tensor([e.type_ids])).double(), -1)
    assert list(pair.probabilities.values()) == pytest.approx(expected[0].tolist(), abs=1e-5)

    # Longer than the context: truncated to 48 tokens, as in training.
    assert runtime.classify(["so very long " * 100])[0].label in runtime.labels
    with pytest.raises(InputError, match=r"token_type_ids must hold 0 \(first sentence\) and 1"):
        runtime.logits([[2, 7, 3]], None, [[0, 2, 0]])
    with pytest.raises(InputError, match="strings or"):
        runtime.classify([3])  # type: ignore[list-item]
    assert main(["classify", str(bundle), texts[0], "--pair", "x", "y"]) == 2
    assert main(["classify", str(bundle), texts[0]]) == 0
    assert main(["generate", str(bundle)]) == 1  # a bundle of another task


def test_a_masked_lm_run_is_not_exported(pretrained: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="fine-tune it"):
        export_bundle(None, Source(run=pretrained), tmp_path / "b")


def test_labels_come_from_the_training_split_and_every_split_must_fit_them() -> None:
    splits = {"training": ["pos", "neg", "pos"], "validation": ["neg"]}
    assert resolve_labels(None, splits, "t.tsv") == ["neg", "pos"]
    assert resolve_labels(["pos", "neg"], splits, "t.tsv") == ["pos", "neg"]  # declared order kept
    with pytest.raises(DataError, match=r"the test data has labels \['meh'\] outside task\.labels"):
        resolve_labels(None, {**splits, "test": ["meh"]}, "t.tsv")
    with pytest.raises(DataError, match=r"t\.tsv: a classifier needs at least two labels, found \['pos'\]"):
        resolve_labels(None, {"training": ["pos"]}, "t.tsv")
