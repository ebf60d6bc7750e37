"""Translation data, teacher forcing and greedy decoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import SHARED_DATA

from tfcompile.data import DataError
from tfcompile.models import Seq2Seq
from tfcompile.spec import Spec
from tfcompile.tasks import IGNORE_INDEX, Seq2SeqObjective, greedy_translate, read_parallel

MULTI30K = SHARED_DATA / "multi30k"


def _spec(tmp_path: Path) -> Spec:
    return Spec.model_validate(
        {
            "model": {
                "family": "encoder_decoder",
                "d_model": 32,
                "n_layers": 1,
                "n_heads": 4,
                "d_ff": 64,
                "max_seq_len": 40,
            },
            "data": {
                "path": str(MULTI30K / "val.{lang}.gz"),
                "val_path": str(MULTI30K / "test_2016_flickr.{lang}.gz"),
                "tokenizer": {"type": "bpe", "vocab_size": 500},
            },
            "task": {"type": "seq2seq", "source": "de", "target": "en"},
            "train": {"runs_dir": str(tmp_path)},
        }
    )


def test_parallel_files_and_their_errors(tmp_path: Path) -> None:
    de, en = read_parallel(MULTI30K / "val.{lang}.gz", "de", "en")
    assert len(de) == len(en) == 1014
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    with pytest.raises(DataError, match="2 de lines but 1 en lines"):
        read_parallel(tmp_path / "a.{lang}", "de", "en")
    with pytest.raises(DataError, match="holds \\{lang\\}"):
        read_parallel(tmp_path / "a.de", "de", "en")


def test_batches_shift_the_target_and_pad_outside_the_loss(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.data is not None and spec.task.type == "seq2seq"
    objective = Seq2SeqObjective(spec.task, spec.data, 40, 0, None)
    batch = objective.batch("train", 16, torch.Generator().manual_seed(0))
    bos, eos, pad = objective.ids["[BOS]"], objective.ids["[EOS]"], objective.ids["[PAD]"]
    assert (batch["input_ids"][:, 0] == bos).all()
    real = batch["targets"] != IGNORE_INDEX
    # The decoder reads the target shifted right by one: its input at t+1 is the target at t.
    assert torch.equal(batch["input_ids"][:, 1:][real[:, 1:]], batch["targets"][:, :-1][real[:, 1:]])
    assert (batch["targets"][real.sum(1) > 0, :].gather(1, real.sum(1, keepdim=True) - 1) == eos).all()
    assert (batch["input_ids"][~real] == pad).all()
    assert torch.equal(batch["source_mask"].bool(), batch["source_ids"] != pad)


def test_greedy_decoding_with_the_cache_equals_rerunning_the_decoder(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec.model.vocab_size = 500
    torch.manual_seed(0)
    model = Seq2Seq(spec.model).eval()
    source = torch.randint(4, 500, (3, 9))
    mask = torch.ones_like(source)
    mask[1, 6:] = 0
    ours = greedy_translate(model, source, mask, bos=2, eos=3, max_len=12)
    for row in range(3):
        tokens = [2]
        while len(tokens) <= 12:
            with torch.no_grad():
                logits = model(source[row : row + 1], mask[row : row + 1], torch.tensor([tokens]))
            next_id = int(logits[0, -1].argmax())
            if next_id == 3 or len(tokens) > 12:
                break
            tokens.append(next_id)
        assert ours[row] == tokens[1:13]
