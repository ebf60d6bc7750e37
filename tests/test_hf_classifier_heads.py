"""The sentence classifier heads of imported encoders, and the pooler a classifier starts from.

DistilBERT's classifier (pre_classifier -> ReLU -> classifier on [CLS]) is BERT's pooler with ReLU
for tanh (``model.pooler_activation: relu``): it imports to transformers' logits, trains, exports
with parity and classifies as transformers does; export-hf refuses it by field. bert-base-uncased,
a BertForMaskedLM, holds the pooler it was pretrained with: the import keeps it, so that a
classifier fine-tuned from the import starts from it, as transformers'
``BertForSequenceClassification.from_pretrained`` does; RoBERTa's classifier reads no pooler, and
roberta-base's stays out (tests/test_hf_roberta_distilbert.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import BERT, from_pretrained, max_difference, perturb, write
from pydantic import ValidationError
from safetensors.torch import load_file
from test_hf_fields import DELETE, edit_config
from test_hf_roberta_distilbert import save as save_family

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import ImportResult, import_folder
from tfcompile.models import Classifier
from tfcompile.spec import EncoderSpec, Spec, load_spec
from tfcompile.train import Trainer, TrainError, load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

ROWS = [("the cat sat", "pos"), ("that is a hit", "neg"), ("a hat", "neutral")]


def _table(folder: Path) -> Path:
    path = folder / "rows.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in ROWS))
    return path


def _fine_tune(imported: ImportResult, tmp_path: Path, *more: str) -> Spec:
    """The imported masked LM's spec as a classifier of ROWS that starts from its run."""
    table = _table(tmp_path)
    overrides = ["task={type: classification}", f"data.path={table}", f"data.val_path={table}"]
    overrides += [f"train.init_from={imported.run_dir}", f"train.runs_dir={tmp_path}", "train.device=cpu"]
    return load_spec(imported.spec_path, [*overrides, *more])


def _classifier(**model: Any) -> Spec:
    base = {
        "family": "encoder",
        "vocab_size": 40,
        "d_model": 16,
        "n_layers": 1,
        "n_heads": 2,
        "max_seq_len": 8,
    }
    task = {"type": "classification", "labels": ["a", "b"]}
    return Spec.model_validate({"model": base | model, "task": task})


def test_a_relu_pooler_is_relu_of_the_dense_layer_on_cls_with_tanhs_parameters() -> None:
    relu, tanh = _classifier(pooler_activation="relu"), _classifier()
    assert tanh.model.pooler_activation == "tanh" and relu.parameter_count() == tanh.parameter_count()
    assert isinstance(relu.model, EncoderSpec)
    torch.manual_seed(0)
    model = Classifier(relu.model, 2).eval()
    hidden = torch.randn(3, 5, 16)
    pooled = torch.relu(hidden[:, 0] @ model.pooler.weight.T + model.pooler.bias)
    assert torch.equal(model.pool(hidden), pooled) and (pooled == 0).any()
    with pytest.raises(ValidationError, match="pooler_activation"):
        _classifier(pooler_activation="swiglu")  # tanh, relu and gelu (ELECTRA's) only


# ------------------------------------------------------------------- DistilBERT's classifier


def _import_distilbert(root: Path, family: str) -> ImportResult:
    save_family(family, root / "hf" / family)
    return import_folder(root / "hf" / family, family, root / "specs", root / "runs")


@pytest.mark.slow
def test_a_distilbert_classifier_trains_exports_and_classifies_as_its_weights_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """import -> train (train.init_from: the pooler, ReLU and all, trains) -> export (ONNX parity)
    -> the bundle's probabilities are the trained model's on the ids transformers' tokenizer
    gives each text."""
    from tfcompile.runtime import load

    monkeypatch.chdir(tmp_path)
    result = _import_distilbert(tmp_path, "distilbert_cls")
    table = _table(tmp_path)
    sets = [f"data.path={table}", f"data.val_path={table}", "train.init_from=runs/distilbert_cls"]
    sets += ["train.name=tuned", "train.steps=2", "train.batch_size=3", "train.device=cpu"]
    sets += ["train.optimizer.lr=0.01"]
    assert main(["train", str(result.spec_path), *(a for s in sets for a in ("--set", s))]) == 0
    log = capsys.readouterr()
    assert "new: classifier;" in log.out + log.err  # the pooler is the import's
    _, parent = load_trained_model(result.run_dir)
    spec, tuned = load_trained_model(Path("runs/tuned"))
    assert spec.model.pooler_activation == "relu"
    assert not torch.equal(tuned.pooler.weight, parent.pooler.weight)

    assert main(["export", "runs/tuned", "--out", "bundle"]) == 0
    texts = [text for text, _ in ROWS]
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf" / "distilbert_cls")
    for text, prediction in zip(texts, load("bundle").classify(texts), strict=True):
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            expected = tuned(encoded["input_ids"], encoded["attention_mask"]).softmax(-1)[0]
        assert list(prediction.probabilities.values()) == pytest.approx(expected.tolist(), abs=1e-5)


def test_a_fractional_num_labels_is_refused_by_name(tmp_path: Path) -> None:
    """A number of labels that is not whole is refused at num_labels, not a traceback."""
    save_family("distilbert_cls", tmp_path / "hf")
    edit_config(tmp_path / "hf", {"num_labels": 1.5})
    with pytest.raises(HFError, match=r"  num_labels: 1\.5 is not a whole number of labels"):
        import_folder(tmp_path / "hf", "x", tmp_path / "specs", tmp_path / "runs")


def test_a_relu_classifier_fine_tunes_from_a_masked_lm_without_a_pooler(tmp_path: Path) -> None:
    """DistilBertForMaskedLM has no pooler: a classifier with a ReLU pooler starts it new, so its
    activation may differ from the run's (tanh, unused)."""
    result = _import_distilbert(tmp_path, "distilbert")
    spec = _fine_tune(result, tmp_path, "model.pooler=true", "model.pooler_activation=relu")
    trainer = Trainer(spec, tmp_path / "tuned", show_progress=False)
    assert "new: pooler, classifier" in str(trainer.initialized_from)


# ------------------------------------------------------- bert-base-uncased's pretrained pooler


def _bert_with_pooler(folder: Path) -> Any:
    """As bert-base-uncased is saved: a BertForMaskedLM whose checkpoint holds the pooler and the
    next-sentence head it was pretrained with (a BertForPreTraining's tensors)."""
    torch.manual_seed(0)
    model = write(perturb(T.BertForPreTraining(T.BertConfig(**BERT))), "bert", folder)
    edit_config(folder, {"architectures": ["BertForMaskedLM"]})
    return model


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> ImportResult:
    root = tmp_path_factory.mktemp("bert")
    _bert_with_pooler(root / "hf")
    with pytest.warns(
        HFWarning, match=r"left out cls\.seq_relationship\.bias, cls\.seq_relationship\.weight:"
    ):
        return import_folder(root / "hf", "bert", root / "specs", root / "runs")


def _folder(bert: ImportResult) -> Path:
    return bert.run_dir.parent.parent / "hf"


def test_a_masked_lm_keeps_the_pooler_its_checkpoint_holds(bert: ImportResult) -> None:
    """The masked LM's logits are transformers' (it reads no pooler); the pooler is the saved one,
    counted beside transformers' BertForMaskedLM, which does not build it."""
    spec, model = load_trained_model(bert.run_dir)
    assert spec.model.pooler and spec.model.pooler_activation == "tanh" and not spec.task.next_sentence
    hf = from_pretrained(_folder(bert))
    for padded in (False, True):
        assert max_difference(hf, model, padded) <= 1e-5
    saved = load_file(_folder(bert) / "model.safetensors")
    assert torch.equal(model.pooler.weight, saved["bert.pooler.dense.weight"])
    assert torch.equal(model.pooler.bias, saved["bert.pooler.dense.bias"])
    d = spec.model.d_model
    assert spec.parameter_count() == hf.num_parameters() + d * d + d


def test_a_classifier_fine_tuned_from_it_starts_from_the_pretrained_pooler(
    bert: ImportResult, tmp_path: Path
) -> None:
    """As transformers' BertForSequenceClassification.from_pretrained of the same folder: the body
    and the pooler the checkpoint's, the head alone new (the spec needs no model.pooler edit)."""
    trainer = Trainer(_fine_tune(bert, tmp_path), tmp_path / "tuned", show_progress=False)
    assert str(trainer.initialized_from).endswith(
        "tensors of its body; new: classifier; its mlm_dense, mlm_norm, lm_head not used"
    )
    theirs = T.BertForSequenceClassification.from_pretrained(_folder(bert), dtype=torch.float32)
    assert torch.equal(trainer.model.pooler.weight, theirs.bert.pooler.dense.weight)
    assert torch.equal(trainer.model.pooler.bias, theirs.bert.pooler.dense.bias)
    assert torch.equal(trainer.model.embed.weight, theirs.bert.embeddings.word_embeddings.weight)


def test_a_pretrained_tanh_pooler_is_not_fine_tuned_as_relu(bert: ImportResult, tmp_path: Path) -> None:
    """A pooler carried over keeps the activation it was trained with."""
    spec = _fine_tune(bert, tmp_path, "model.pooler_activation=relu")
    with pytest.raises(TrainError, match=re.escape("model.pooler_activation (run: 'tanh', spec: 'relu')")):
        Trainer(spec, tmp_path / "tuned", show_progress=False)


def test_export_hf_writes_the_masked_lm_without_the_pooler_it_does_not_build(
    bert: ImportResult, tmp_path: Path
) -> None:
    """BertForMaskedLM loads the folder with nothing missing or unexpected, to the same logits."""
    assert export_hf(bert.run_dir, tmp_path / "out") == "BertForMaskedLM"
    assert not any("pooler" in name for name in load_file(tmp_path / "out" / "model.safetensors"))
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    model = load_trained_model(bert.run_dir)[1]
    for padded in (False, True):
        assert max_difference(reloaded, model, padded) <= 1e-5


def test_a_bert_masked_lm_saved_without_a_pooler_imports_without_one(tmp_path: Path) -> None:
    torch.manual_seed(0)
    write(perturb(T.BertForMaskedLM(T.BertConfig(**BERT))), "bert", tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "bert", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.pooler is False


def test_a_num_labels_past_any_classifier_is_refused_before_its_labels_are_named(tmp_path: Path) -> None:
    """2^30 labels were named one by one (gigabytes) before the checkpoint's head was compared."""
    save_family("distilbert_cls", tmp_path / "hf")
    edit_config(tmp_path / "hf", {"num_labels": 1 << 30, "id2label": DELETE, "label2id": DELETE})
    with pytest.raises(HFError, match=r"  num_labels: is 1,073,741,824, more than 1,048,576 labels"):
        import_folder(tmp_path / "hf", "x", tmp_path / "specs", tmp_path / "runs")


def test_a_num_labels_other_than_id2labels_names_every_label_as_transformers_does(tmp_path: Path) -> None:
    """transformers builds num_labels outputs and names them LABEL_i, id2label's three names
    dropped: the checkpoint's head of three rows is then refused by its shape."""
    save_family("distilbert_cls", tmp_path / "hf")
    edit_config(tmp_path / "hf", {"num_labels": 2})
    with pytest.raises(HFError, match=r"classifier\.weight \(3, 16\) \(expected \(2, 16\)\)"):
        import_folder(tmp_path / "hf", "x", tmp_path / "specs", tmp_path / "runs")
    config = T.AutoConfig.from_pretrained(tmp_path / "hf")
    assert list(config.id2label.values()) == ["LABEL_0", "LABEL_1"]


def test_id2label_keys_are_read_as_transformers_reads_them(tmp_path: Path) -> None:
    """transformers keys id2label by int(key): "00" and " 1" name labels 0 and 1, which the import
    named LABEL_0 and LABEL_1; a key int() cannot read is refused by the field."""
    save_family("distilbert_cls", tmp_path / "hf")
    edit_config(tmp_path / "hf", {"id2label": {"00": "a", " 1": "b", "2": "c"}, "label2id": DELETE})
    result = import_folder(tmp_path / "hf", "x", tmp_path / "specs", tmp_path / "runs")
    expected = list(T.AutoConfig.from_pretrained(tmp_path / "hf").id2label.values())
    assert result.spec.task.labels == expected == ["a", "b", "c"]
    edit_config(tmp_path / "hf", {"id2label": {"zero": "a", "1": "b", "2": "c"}})
    with pytest.raises(HFError, match=r"  id2label: the key 'zero' is not an id"):
        import_folder(tmp_path / "hf", "y", tmp_path / "specs", tmp_path / "runs")
