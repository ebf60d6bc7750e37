"""A text classifier fine-tuned from an imported masked LM (BERT's BertForMaskedLM and
BertForPreTraining, RoBERTa's, XLM-RoBERTa's and CamemBERT's *ForMaskedLM, DistilBERT's): the
body loads, a pooler the masked LM lacks starts new as the head does, a RoBERTa-family model's one
segment row is copied to the classifier's two, training encodes each pair as transformers'
tokenizer does, and the bundle answers pairs. What cannot work is refused by field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hf_models import save as save_bert
from test_hf_roberta_distilbert import save as save_family
from tokenizers import Tokenizer, processors

from tfcompile.cli import main
from tfcompile.data import DataError
from tfcompile.hf.importer import import_folder
from tfcompile.spec import Spec, load_spec
from tfcompile.tasks.classification import TextClassification
from tfcompile.train import Trainer, TrainError, load_trained_model

transformers = pytest.importorskip("transformers")

ROWS = [("the cat sat", "a hat", "pos"), ("that is a hit", "in a hat", "neg"), ("a", "the", "neg")]
# The masked LMs, each saved as its published checkpoint is: BERT's with two segment rows, the
# RoBERTa family's with one (xlm-roberta-base's too), DistilBERT's with none; none with a pooler
# but BertForPreTraining.
MODELS = {
    "bert": lambda folder: save_bert("bert_mlm", folder),
    "bert_pretraining": lambda folder: save_bert("bert_pretraining", folder),
    "roberta": lambda folder: save_family("roberta", folder),
    "xlm-roberta": lambda folder: save_family("xlm-roberta", folder, {"type_vocab_size": 1}),
    "camembert": lambda folder: save_family("camembert", folder),
    "distilbert": lambda folder: save_family("distilbert", folder),
}
ONE_ROW = {"roberta", "xlm-roberta", "camembert"}


def _table(folder: Path) -> Path:
    path = folder / "pairs.tsv"
    path.write_text("sentence\tother\tlabel\n" + "".join(f"{a}\t{b}\t{label}\n" for a, b, label in ROWS))
    return path


def classifier_overrides(name: str, table: Path) -> list[str]:
    """What turns an imported masked LM's spec into a pair classifier's that fine-tunes from it:
    the task, the data (validated on the training file, so the rows stay in order), a pooler, and
    two segment rows where the import has one."""
    overrides = [
        "task={type: classification, pair_column: other}",
        f"data.path={table}",
        f"data.val_path={table}",
        "model.pooler=true",
        f"train.init_from=runs/{name}",
        f"train.name={name}-tuned",
        "train.steps=2",
        "train.batch_size=3",
        "train.eval_interval=2",
        "train.device=cpu",
    ]
    return overrides + (["model.type_vocab_size=2"] if name in ONE_ROW else [])


def _import(name: str, root: Path) -> Path:
    folder = root / "hf" / name
    MODELS[name](folder)
    import_folder(folder, name, root / "specs", root / "runs")
    return folder


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every masked LM of MODELS imported under one folder (specs/NAME.yaml, runs/NAME)."""
    root = tmp_path_factory.mktemp("imports")
    for name in MODELS:
        _import(name, root)
    return root


def _spec(root: Path, name: str, table: Path, *more: str) -> Spec:
    overrides = [
        o.replace(f"runs/{name}", str(root / "runs" / name)) for o in classifier_overrides(name, table)
    ]
    return load_spec(root / "specs" / f"{name}.yaml", [*overrides, f"train.runs_dir={table.parent}", *more])


def _rows(task: TextClassification) -> list[tuple[list[int], list[int]]]:
    """Each training example's ids and segment ids, as a batch holds them (padding left out)."""
    batch = task._collate("train", list(range(len(task.examples["train"][1]))))
    real = batch["attention_mask"].bool()
    return [
        (ids[mask].tolist(), types[mask].tolist())
        for ids, types, mask in zip(batch["input_ids"], batch["token_type_ids"], real, strict=True)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_a_classifier_fine_tunes_from_an_imported_masked_lm(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """import -> train (train.init_from) on pairs -> export -> classify --pair, through the CLI.
    Each training pair is what transformers' tokenizer makes of it, ids and segment ids; the
    body is the import's, the pooler (where the masked LM has none) and the head start new."""
    from tfcompile.runtime import load

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "hf" / name
    MODELS[name](folder)
    assert main(["import", str(folder), "--name", name]) == 0
    table = _table(tmp_path)
    sets = [arg for override in classifier_overrides(name, table) for arg in ("--set", override)]
    capsys.readouterr()
    assert main(["train", f"specs/{name}.yaml", *sets]) == 0
    log = capsys.readouterr()
    started = re.search(r"initialised from .*", log.out + log.err)
    assert started is not None
    new = "new: classifier" if name == "bert_pretraining" else "new: pooler, classifier"
    assert new in started.group(0)
    assert ("its one segment row copied to each of 2" in started.group(0)) == (name in ONE_ROW)

    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    spec = load_spec(Path(f"runs/{name}-tuned/spec.yaml"))
    task = TextClassification(spec, tmp_path / "cache", Tokenizer.from_file(f"runs/{name}/tokenizer.json"))
    for (a, b, _), (ids, types) in zip(ROWS, _rows(task), strict=True):
        encoded = theirs(a, b, return_token_type_ids=True)
        assert (ids, types) == (encoded["input_ids"], encoded["token_type_ids"])

    _, parent = load_trained_model(Path(f"runs/{name}"))
    _, tuned = load_trained_model(Path(f"runs/{name}-tuned"))
    parent_state, tuned_state = parent.state_dict(), tuned.state_dict()
    assert (tuned_state["embed.weight"] - parent_state["embed.weight"]).abs().max() < 1e-3
    if name in ONE_ROW:  # both rows RoBERTa's one, within two small steps
        assert (tuned_state["segment_embed.weight"] - parent_state["segment_embed.weight"]).abs().max() < 1e-3

    assert main(["export", f"runs/{name}-tuned", "--out", "bundle"]) == 0
    (served,) = load("bundle").encode([("the cat sat", "a hat")])
    encoded = theirs("the cat sat", "a hat", return_token_type_ids=True)
    assert (served.ids, served.type_ids) == (encoded["input_ids"], encoded["token_type_ids"])
    capsys.readouterr()
    assert main(["classify", "bundle", "the cat sat", "that is a hit", "--pair", "a hat", "in a hat"]) == 0
    assert len(re.findall(r"\b(pos|neg)\b", capsys.readouterr().out)) >= 2


def test_a_pooler_the_parent_lacks_starts_new_and_the_lm_heads_fields_may_differ(
    imported: Path, tmp_path: Path
) -> None:
    """BERT's masked LM has no pooler: the classifier's starts as its head does (zero bias), the
    body is the import's; the LM head's tie and bias, which a classifier has no use for, may
    differ from the import's."""
    table = _table(tmp_path)
    spec = _spec(imported, "bert", table, "model.tie_embeddings=false", "model.bias.lm_head=false")
    trainer = Trainer(spec, tmp_path / "tuned", show_progress=False)
    assert str(trainer.initialized_from).endswith(
        "tensors of its body; new: pooler, classifier; its mlm_dense, mlm_norm, lm_head not used"
    )
    _, parent = load_trained_model(imported / "runs" / "bert")
    model = trainer.model
    assert torch.equal(model.embed.weight, parent.embed.weight)
    assert torch.equal(model.segment_embed.weight, parent.segment_embed.weight)
    assert not model.pooler.bias.any() and model.pooler.weight.std() < 2 * spec.model.init_std


def test_a_one_row_parent_gives_each_segment_row_its_row(imported: Path, tmp_path: Path) -> None:
    """An imported RoBERTa masked LM (one segment row) under a classifier with two: both rows
    are its row, so a pair reads as RoBERTa reads it whatever segment a client gives."""
    spec = _spec(imported, "roberta", _table(tmp_path))
    trainer = Trainer(spec, tmp_path / "tuned", show_progress=False)
    assert "its one segment row copied to each of 2; new: pooler, classifier" in str(trainer.initialized_from)
    _, parent = load_trained_model(imported / "runs" / "roberta")
    rows = trainer.model.segment_embed.weight
    assert torch.equal(rows, parent.segment_embed.weight.expand(2, -1))


def test_a_masked_lm_fine_tuned_from_pretraining_leaves_the_pooler_behind(
    imported: Path, tmp_path: Path
) -> None:
    """BertForPreTraining's pooler serves its next-sentence head: a masked LM without either
    fine-tunes from it, the pooler left behind as the heads are."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{a} {b}\n" for a, b, _ in ROWS * 4))
    overrides = [
        f"data.path={corpus}",
        "model.pooler=false",
        "task.next_sentence=false",
        f"train.init_from={imported / 'runs' / 'bert_pretraining'}",
        f"train.runs_dir={tmp_path}",
        "train.device=cpu",
    ]
    spec = load_spec(imported / "specs" / "bert_pretraining.yaml", overrides)
    trainer = Trainer(spec, tmp_path / "mlm", show_progress=False)
    assert str(trainer.initialized_from).endswith(
        "its pooler, mlm_dense, mlm_norm, lm_head, nsp_head not used"
    )


def test_what_a_fine_tune_cannot_carry_over_is_refused_by_field(imported: Path, tmp_path: Path) -> None:
    """A pooler and one segment row are all that may change: a RoBERTa body without its segment
    row, or BERT's two rows as three, would lose or invent weights."""
    table = _table(tmp_path)
    spec = _spec(imported, "roberta", table, "model.type_vocab_size=0")
    with pytest.raises(TrainError, match=r"model\.type_vocab_size \(run: 1, spec: 0\)"):
        Trainer(spec, tmp_path / "a", show_progress=False)
    spec = _spec(imported, "bert", table, "model.type_vocab_size=3")
    with pytest.raises(TrainError) as error:
        Trainer(spec, tmp_path / "b", show_progress=False)
    assert "model.type_vocab_size (run: 2, spec: 3)" in str(error.value)
    assert "segment_embed.weight (run: (2, 16), spec: (3, 16))" in str(error.value)
    spec = _spec(imported, "roberta", table, "model.d_model=32")  # the one row, not copied, as held
    with pytest.raises(TrainError, match=r"segment_embed\.weight \(run: \(1, 16\), spec: \(2, 32\)\)"):
        Trainer(spec, tmp_path / "c", show_progress=False)


def test_the_lm_heads_fields_still_bind_where_the_body_holds_the_lm_head(tmp_path: Path) -> None:
    """A decoder's LM head is part of what fine-tuning loads: untying GPT-2's is refused."""
    folder = tmp_path / "hf"
    save_bert("gpt2", folder)
    result = import_folder(folder, "gpt2", tmp_path / "specs", tmp_path / "runs")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. " * 40)
    tied = result.spec.model.tie_embeddings
    overrides = [f"data.path={corpus}", f"train.init_from={result.run_dir}", f"train.runs_dir={tmp_path}"]
    spec = load_spec(tmp_path / "specs" / "gpt2.yaml", [*overrides, f"model.tie_embeddings={not tied}"])
    with pytest.raises(TrainError, match=rf"model\.tie_embeddings \(run: {tied}, spec: {not tied}\)"):
        Trainer(spec, tmp_path / "tuned", show_progress=False)


def test_a_classifier_spec_from_an_imported_masked_lm_names_what_to_set(
    imported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The task changed alone: the spec's lines of model.pooler and model.type_vocab_size, each
    with the value to set (a RoBERTa's one row is copied to the two a classifier's bundle reads)."""
    table = _table(imported)
    spec = str(imported / "specs" / "roberta.yaml")
    assert (
        main(
            [
                "train",
                spec,
                "--set",
                "task={type: classification, pair_column: other}",
                "--set",
                f"data.path={table}",
            ]
        )
        != 0
    )
    err = capsys.readouterr().err
    assert re.search(r"roberta\.yaml:\d+:\d+: error: model\.pooler: .*no pooler", err)
    assert re.search(r"roberta\.yaml:\d+:\d+: error: model\.type_vocab_size: .*embeds segment 0 alone", err)
    assert "set model.type_vocab_size: 2 (train.init_from a run with one row" in err


def test_a_context_that_cuts_the_imported_framings_second_sentence_is_refused(
    imported: Path, tmp_path: Path
) -> None:
    """RoBERTa frames a pair with 4 special tokens: at a context of 5 its tokenizer cuts the second
    sentence away whole (BERT's framing, which the spec counts, fits), so the task refuses it."""
    table = _table(tmp_path)
    spec = _spec(imported, "roberta", table, "train.context_length=5")
    tokenizer = Tokenizer.from_file(str(imported / "runs" / "roberta" / "tokenizer.json"))
    with pytest.raises(
        DataError, match=r"train\.context_length: .*4 special tokens \(<s> </s> </s> </s>\).* 6"
    ):
        TextClassification(spec, tmp_path / "cache", tokenizer)
    spec = _spec(imported, "roberta", table, "train.context_length=6")
    ids, _ = _rows(TextClassification(spec, tmp_path / "cache", tokenizer))[0]
    assert len(ids) == 6 and ids[3] == ids[-1] != ids[-2]  # a token of B between its </s>s


def test_segment_ids_past_type_vocab_size_are_refused(imported: Path, tmp_path: Path) -> None:
    """A tokenizer that puts a pair's second sentence in segment 2 and a model with two rows: a
    DataError names model.type_vocab_size, not an index error mid-training."""
    tokenizer = Tokenizer.from_file(str(imported / "runs" / "bert" / "tokenizer.json"))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:2 [SEP]:2",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    spec = _spec(imported, "bert", _table(tmp_path))
    with pytest.raises(
        DataError, match=r"model\.type_vocab_size: .*segment ids 0 to 2, but type_vocab_size 2"
    ):
        TextClassification(spec, tmp_path / "cache", tokenizer)
