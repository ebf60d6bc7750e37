"""Shared fixtures: the bundles of each kind that several test files serve (trained one step,
exported once per session)."""

from pathlib import Path

import pytest
import torch
from helpers import ONE_STEP, ROOT, SHARED_DATA, TINY
from hypothesis import settings

# The default suite's property tests are bounded and repeatable; the deep profile hunts.
settings.register_profile("default", max_examples=60, derandomize=True)
settings.register_profile("deep", max_examples=3000, derandomize=False)
settings.load_profile("default")

# One PyTorch thread: the tests' models are tiny, and a second thread only waits. On 2 cores its
# spinning fights onnxruntime's (the parity checks alternate the two) and anything else running:
# a step of check_step_parity took 17-39 ms with two threads and 0.5 ms with one; the default
# suite took 116 CPU s (21%) less. Subprocesses get OMP_NUM_THREADS=1 where they train.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _train(spec_name: str, root: Path, overrides: list[str]) -> Path:
    from tfcompile.export import Source, export_bundle
    from tfcompile.spec import load_spec
    from tfcompile.train import Trainer

    spec = load_spec(ROOT / "specs" / spec_name, [*overrides, f"train.runs_dir={root}"])
    Trainer(spec, root / "run", show_progress=False).train()
    export_bundle(None, Source(run=root / "run"), root / "bundle")
    return root / "bundle"


@pytest.fixture(scope="session")
def char_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The char-level decoder (WordLevel tokenizer, no special tokens), context 64."""
    root = tmp_path_factory.mktemp("char")
    return _train("shakespeare-char.yaml", root, [*TINY, "model.max_seq_len=64", *ONE_STEP])


@pytest.fixture(scope="session")
def classifier_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SST-2 classifier from scratch: WordPiece, [CLS] A [SEP] B [SEP], truncation at 32; wide
    weights (init_std 0.3), so that a token more or less moves the probabilities."""
    sst2 = SHARED_DATA / "sst2"
    overrides = [*TINY, "model.max_seq_len=32", "train.init_from=null", "data.tokenizer.vocab_size=300"]
    overrides += [f"data.path={sst2 / 'dev.tsv.gz'}", "data.val_path=null", "model.init_std=0.3", *ONE_STEP]
    return _train("sst2-finetune.yaml", tmp_path_factory.mktemp("sst2"), overrides)


@pytest.fixture(scope="session")
def translator_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A de -> en translator (byte-level BPE), its weights wide enough (init_std 0.2) that every
    source steers its translation."""
    multi30k = SHARED_DATA / "multi30k"
    overrides = ["model.d_model=32", "model.n_layers=1", "model.n_decoder_layers=1", "model.n_heads=2"]
    overrides += ["model.d_ff=64", "model.max_seq_len=48"]
    overrides += [
        f"data.path={multi30k}/val.{{lang}}.gz",
        f"data.val_path={multi30k}/test_2016_flickr.{{lang}}.gz",
    ]
    overrides += ["data.test_path=null", "data.tokenizer.vocab_size=400", "model.init_std=0.2", *ONE_STEP]
    return _train("multi30k-de-en.yaml", tmp_path_factory.mktemp("translator"), overrides)


@pytest.fixture(scope="session")
def image_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ViT on scikit-learn's 8 x 8 digits (grey), its weights wide (init_std 0.3), so that a
    pixel's value moves the probabilities."""
    return _train("vit-digits.yaml", tmp_path_factory.mktemp("vit"), [*TINY, "model.init_std=0.3", *ONE_STEP])
