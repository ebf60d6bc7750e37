"""`tfcompile export-hf`, reviewed: what a transformers user of the written folder reads (the
tokenizer's outputs) computes what the run computes, and the folder is written only where it may
be."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_models import Imported, from_pretrained
from tokenizers import Tokenizer

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf

transformers = pytest.importorskip("transformers")


def test_a_sentence_pair_reaches_bert_as_two_segments(tmp_path: Path) -> None:
    """The tokenizer transformers loads gives the pair's token_type_ids, as the run's tokenizer
    does (without them, BERT read both sentences as segment 0: the logits were 0.46 apart)."""
    case = Imported(tmp_path, "bert_cls")
    out = tmp_path / "out"
    export_hf(case.result.run_dir, out)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    ours = Tokenizer.from_file(str(case.result.run_dir / "tokenizer.json"))
    reloaded = from_pretrained(out)
    for first, second in [("a good movie", "it was fine"), ("bad", "terrible acting, truly")]:
        encoded = theirs(first, second, return_tensors="pt")
        expected = ours.encode(first, second)
        assert encoded["token_type_ids"][0].tolist() == expected.type_ids
        ids, types = torch.tensor([expected.ids]), torch.tensor([expected.type_ids])
        with torch.no_grad():
            logits = reloaded(**encoded).logits
            assert (logits - case.model(ids, torch.ones_like(ids), types)).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Imported(tmp_path_factory.mktemp("hf"), "gpt2").result.run_dir


def test_the_folder_is_never_written_inside_the_run(gpt2_run: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(gpt2_run)
    for out in (gpt2_run / "hf", gpt2_run / "checkpoints" / "hf", link / "hf"):
        with pytest.raises(HFError, match="inside the run"):
            export_hf(gpt2_run, out)
        assert not out.exists()


def test_force_replaces_only_a_folder_export_hf_wrote(gpt2_run: Path, tmp_path: Path) -> None:
    """A file export-hf does not write (a model card, a script, another tokenizer's vocabulary)
    keeps the folder from being replaced, --force or not: it was deleted with the folder."""
    out = tmp_path / "out"
    export_hf(gpt2_run, out)
    (out / "README.md").write_text("mine")
    with pytest.raises(HFError, match=r"does not write \(README.md\)"):
        export_hf(gpt2_run, out, force=True)
    assert (out / "README.md").read_text() == "mine"
    (out / "README.md").unlink()
    export_hf(gpt2_run, out, force=True)
