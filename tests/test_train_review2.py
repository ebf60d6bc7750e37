"""Fine-tuning's parent run (train.init_from), refused by name before any data is read: a parent
of another family, and a damaged tokenizer file of one."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from tfcompile.spec import dump_spec, load_spec
from tfcompile.train import Trainer, TrainError

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2"]


def _parent(folder: Path, spec_file: str, tokenizer: str | None) -> Path:
    """A run folder as far as fine-tuning reads it before the checkpoint: its spec and tokenizer."""
    folder.mkdir()
    spec = load_spec(ROOT / "specs" / spec_file, [*TINY, "model.vocab_size=100"])
    (folder / "spec.yaml").write_text(dump_spec(spec))
    if tokenizer is not None:
        (folder / "tokenizer.json").write_text(tokenizer)
    return folder


def _finetune(parent: Path, tmp_path: Path) -> None:
    overrides = [*TINY, f"train.init_from={parent}", f"train.runs_dir={tmp_path}"]
    Trainer(load_spec(ROOT / "specs" / "sst2-finetune.yaml", overrides), tmp_path / "x", show_progress=False)


def test_a_parent_of_another_family_is_named_as_such(tmp_path: Path) -> None:
    """It was found only once the decoder's tokenizer reached the classifier (a DataError about
    special tokens) or its weights were compared (ten fields that differ)."""
    parent = _parent(tmp_path / "gpt", "shakespeare-char.yaml", None)
    with pytest.raises(
        TrainError,
        match=r"train\.init_from: .*gpt trained a model of family decoder \(task causal_lm\), and "
        r"this spec's is encoder",
    ):
        _finetune(parent, tmp_path)


def test_a_damaged_parent_tokenizer_is_a_train_error_naming_the_file(tmp_path: Path) -> None:
    """The tokenizers library's bare Exception ('key must be a string') reached the user."""
    parent = _parent(tmp_path / "bert", "bert-mini-shakespeare.yaml", '{"model": {"vocab": {1: 2}}}')
    with pytest.raises(TrainError, match=r"train\.init_from: .*bert.tokenizer\.json cannot be read"):
        _finetune(parent, tmp_path)
