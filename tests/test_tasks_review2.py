"""The tasks' metrics against recomputations from their definitions, and their refusals: each test
failed before the change it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SHARED_DATA
from tokenizers import Tokenizer, models

from tfcompile.data import DataError
from tfcompile.spec import Spec
from tfcompile.tasks import build_model
from tfcompile.tasks.causal_lm import IGNORE_INDEX, LanguageModelling
from tfcompile.tasks.classification import TextClassification, resolve_labels
from tfcompile.tasks.masked_lm import MaskedLanguageModelling
from tfcompile.tasks.seq2seq import Translation

MULTI30K = SHARED_DATA / "multi30k"


def _spec(model: dict[str, Any], data: dict[str, Any], task: dict[str, Any], **train: Any) -> Spec:
    return Spec.model_validate({"model": model, "data": data, "task": task, "train": train})


def _sized(spec: Spec, vocab_size: int) -> Spec:
    return spec.replace({"model": {"vocab_size": vocab_size}})


ENCODER = {"family": "encoder", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}


# ---------------------------------------------------------------------------- causal LM


def test_causal_lm_validation_loss_is_the_mean_over_every_real_token(tmp_path: Path) -> None:
    """It was the mean of the batches' means: a batch of one window weighed as much as one of
    three, and a batch's padding targets changed the others' weight."""
    (tmp_path / "c.txt").write_text("to be or not to be, that is the question\n" * 20)
    model_section = {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16}
    spec = _spec(model_section, {"path": str(tmp_path / "c.txt"), "tokenizer": "char"}, {"type": "causal_lm"})
    task = LanguageModelling(spec, tmp_path)
    model = build_model(_sized(spec, task.corpus.tokenizer.get_vocab_size())).eval()
    g = torch.Generator().manual_seed(0)
    batches = [task.batch("val", 1, g), task.batch("val", 3, g)]
    batches[1]["targets"] = batches[1]["targets"].clone()  # a view of the windows input_ids shares
    batches[1]["targets"][0, 5:] = IGNORE_INDEX  # a row that ends early
    with torch.no_grad():
        logits = [model(b["input_ids"]) for b in batches]
    nll = [  # token by token
        -torch.log_softmax(x[r, t].double(), -1)[b["targets"][r, t]].item()
        for x, b in zip(logits, batches, strict=True)
        for r in range(len(x))
        for t in range(x.shape[1])
        if b["targets"][r, t] != IGNORE_INDEX
    ]
    with torch.no_grad():
        got = task.evaluate(model, iter(batches))["val_loss"]
    assert got == pytest.approx(sum(nll) / len(nll), rel=1e-6)


# ---------------------------------------------------------------------------- masked LM


def _masked_lm(tmp_path: Path, lines: int) -> tuple[MaskedLanguageModelling, Spec]:
    """Lines 0000, 0001, ...: a line's number says which line follows it."""
    (tmp_path / "lines.txt").write_text("".join(f"{i:04d}\n" for i in range(lines)))
    data = {"path": str(tmp_path / "lines.txt"), "tokenizer": "char", "val_fraction": 0.1}
    spec = _spec(ENCODER, data, {"type": "masked_lm", "next_sentence": True})
    task = MaskedLanguageModelling(spec, tmp_path)
    return task, _sized(spec, task.tokenizer.get_vocab_size())


def test_masked_lm_validation_loss_is_per_masked_token_and_per_example(tmp_path: Path) -> None:
    """val_loss was the mean of the batches' means, so a batch with fewer masked tokens counted as
    much as one with more; now the MLM part is the mean over every masked token and the NSP part
    the mean over every example, whatever the batches."""
    task, spec = _masked_lm(tmp_path, 200)
    model = build_model(spec).eval()
    g = torch.Generator().manual_seed(3)
    batches = [task.batch("val", 1, g), task.batch("val", 9, g)]
    mlm_nll, nsp_nll, right = [], [], 0
    with torch.no_grad():
        for b in batches:
            logits, nsp = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
            chosen = (b["targets"] != IGNORE_INDEX).nonzero().tolist()
            assert chosen, "every example has a masked token"
            for r, t in chosen:
                mlm_nll.append(-torch.log_softmax(logits[r, t].double(), -1)[b["targets"][r, t]].item())
                right += int(logits[r, t].argmax() == b["targets"][r, t])
            nsp_nll += (-torch.log_softmax(nsp.double(), -1).gather(1, b["is_next"][:, None]))[:, 0].tolist()
        got = task.evaluate(model, iter(batches))
    expected = sum(mlm_nll) / len(mlm_nll) + sum(nsp_nll) / len(nsp_nll)
    assert got["val_loss"] == pytest.approx(expected, rel=1e-6)
    assert got["val_mlm_accuracy"] == right / len(mlm_nll)


def test_a_random_second_sentence_is_never_the_line_that_follows(tmp_path: Path) -> None:
    """B was drawn from every line, the one after A included: 1 in (lines) of the 'not next'
    examples was a true next sentence labelled 0."""
    task, _ = _masked_lm(tmp_path, 40)  # 36 training lines: a clash per ~36 draws
    batch = task.batch("train", 400, torch.Generator().manual_seed(1))
    original = torch.where(batch["targets"] != IGNORE_INDEX, batch["targets"], batch["input_ids"])
    for row, is_next in enumerate(batch["is_next"].tolist()):
        text = "".join(str(task.tokenizer.id_to_token(int(t))) for t in original[row] if t != task.ids["pad"])
        a, b = (part.split() for part in text.removeprefix("[CLS]").split("[SEP]")[:2])
        assert (int(b[0]) == int(a[-1]) + 1) == bool(is_next), (row, a, b, is_next)


# ---------------------------------------------------------------------------- translation


def _translation(tmp_path: Path, **data: str) -> tuple[Translation, Spec]:
    spec = _spec(
        {"family": "encoder_decoder", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 24},
        {"path": str(MULTI30K / "val.{lang}.gz"), "tokenizer": {"type": "bpe", "vocab_size": 300}, **data},
        {"type": "seq2seq"},
    )
    task = Translation(spec, tmp_path)
    return task, _sized(spec, task.tokenizer.get_vocab_size())


def test_translation_validation_is_the_whole_split_whatever_the_batch_size(tmp_path: Path) -> None:
    """Validation drew eval_batches random batches (with replacement), so its loss and accuracy
    changed with train.batch_size; now every validation pair counts once, in order (up to
    eval_batches batches, which hold the split here at either size)."""
    task, spec = _translation(tmp_path, val_fraction="0.05")
    model = build_model(spec).eval()
    draws = lambda i: torch.Generator().manual_seed(i)  # noqa: E731
    count = len(task.pairs["val"]) // 7 + 1
    with torch.no_grad():
        results = [task.evaluate(model, task.eval_batches(count, size, draws)) for size in (7, 64)]
        first = task.evaluate(model, task.eval_batches(1, 7, draws))  # a bounded sample: the first 7 pairs
        assert first["val_loss"] != results[0]["val_loss"]
        nll, right = 0.0, 0
        for source, target in task.pairs["val"]:  # one pair at a time, no padding
            logits = model(torch.tensor([source]), None, torch.tensor([target[:-1]]), None)[0].double()
            nll -= torch.log_softmax(logits, -1).gather(1, torch.tensor(target[1:])[:, None]).sum().item()
            right += (logits.argmax(-1) == torch.tensor(target[1:])).sum().item()
    tokens = sum(len(target) - 1 for _, target in task.pairs["val"])
    for got in results:
        assert got["val_loss"] == pytest.approx(nll / tokens, rel=1e-5)
        assert got["val_token_accuracy"] == right / tokens


@pytest.mark.parametrize("split", ["val_path", "test_path"])
def test_an_empty_translation_split_is_refused_before_training(tmp_path: Path, split: str) -> None:
    """An empty validation file failed at the first evaluation (torch.randint's RuntimeError), an
    empty test file after the last step (sacrebleu's IndexError)."""
    for lang in ("de", "en"):
        (tmp_path / f"empty.{lang}").write_text("" if split == "test_path" else "\n\n")
    with pytest.raises(
        DataError, match=rf"the (validation|test) split \(data\.{split} .*empty.*holds no sentence pair"
    ):
        _translation(tmp_path, **{split: str(tmp_path / "empty.{lang}")})


# ---------------------------------------------------------------------------- classification


def _table(tmp_path: Path) -> Path:
    rows = [("a good film", "pos"), ("a bad film", "neg")] * 4
    (tmp_path / "t.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows))
    return tmp_path / "t.tsv"


def test_a_classifier_refuses_a_parent_tokenizer_without_the_encoder_tokens(tmp_path: Path) -> None:
    """A causal LM's tokenizer (train.init_from a decoder run) was a bare ValueError from deep in
    the tokenizer code; now it is a DataError naming the run and the missing tokens."""
    data = {"path": str(_table(tmp_path)), "tokenizer": "char"}
    spec = _spec(ENCODER, data, {"type": "classification"}, init_from=str(tmp_path / "gpt"))
    chars = Tokenizer(models.WordLevel({c: i for i, c in enumerate("abdfgilmno [UNK]")}, unk_token="[UNK]"))
    with pytest.raises(DataError, match=r"tokenizer of train\.init_from .*gpt has no special token for pad"):
        TextClassification(spec, tmp_path, chars)


def test_a_label_only_in_validation_says_what_to_do_when_task_labels_is_not_set() -> None:
    """The advice was 'leave task.labels out', which it already was."""
    with pytest.raises(
        DataError, match=r"outside task\.labels \['neg', 'pos'\]; task\.labels is taken from"
    ) as e:
        resolve_labels(None, {"training": ["pos", "neg"], "validation": ["meh"]}, "t.tsv")
    assert "leave task.labels out" not in str(e.value)


def test_bleu_is_sacrebleu_s_corpus_bleu_with_its_13a_tokenizer() -> None:
    """13a splits punctuation from words: the same sentence spaced otherwise scores 100 (with no
    tokenization it would not), so runs' BLEU cannot move with a new sacrebleu default."""
    from tfcompile.tasks.seq2seq import bleu

    assert bleu(["Two dogs, running."], ["Two dogs , running ."]) == pytest.approx(100.0)
    assert bleu(["two dogs, running."], ["Two dogs , running ."]) < 100  # case-sensitive
