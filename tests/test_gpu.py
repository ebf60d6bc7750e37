"""CUDA paths: skipped, with the reason, on machines without a GPU (CI); run on the GPU device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, tiny_model

from tfcompile.spec import Spec, load_spec
from tfcompile.train import Trainer, read_metrics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SETS = [
    "model.n_layers=2",
    "model.d_model=64",
    "model.n_heads=4",
    "model.max_seq_len=64",
    "train.batch_size=16",
    "train.steps=20",
    "train.eval_interval=20",
    "train.eval_batches=2",
    "train.log_interval=5",
    "train.precision=bf16",
    "model.vocab_size=null",
]


def spec_on_own_text(tmp_path: Path) -> Spec:
    """The char recipe, shrunk, on a text written here: the GPU machine has no ../shared."""
    text = tmp_path / "text.txt"
    rng = np.random.default_rng(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "away"]
    text.write_text(" ".join(rng.choice(words, size=8000)) + "\n")
    return load_spec(
        ROOT / "specs" / "shakespeare-char.yaml", [*SETS, f"data.path={text}", f"train.runs_dir={tmp_path}"]
    )


def test_cuda_training_compiles_by_default_and_reports_mfu(tmp_path: Path) -> None:
    spec = spec_on_own_text(tmp_path)
    trainer = Trainer(spec, tmp_path / "gpu", show_progress=False)
    assert trainer.device.type == "cuda" and trainer.forward is not trainer.model  # compiled
    result = trainer.train()
    assert result.val_loss is not None and np.isfinite(result.val_loss)
    logged = [r for r in read_metrics(tmp_path / "gpu") if "tokens_per_s" in r]
    if trainer.peak_flops is not None:
        assert all(0 < r["mfu"] < 1 for r in logged)


def test_generate_takes_a_prompt_on_the_gpu() -> None:
    """The model and its prompt on CUDA, as a trainer holds them: the same tokens as on the CPU."""
    from tfcompile.models import DecoderLM
    from tfcompile.tasks.causal_lm import generate

    model = DecoderLM(tiny_model()).eval()
    prompt = torch.tensor([[1, 2, 3]])
    on_cpu = generate(model, prompt, 8, temperature=0.0)
    on_gpu = generate(model.cuda(), prompt.cuda(), 8, temperature=0.0)
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.cpu(), on_cpu)


def run_for_onnxruntime_gpu(tmp_path: Path) -> Path:
    """A run of the shrunk char recipe trained on the GPU, where onnxruntime-gpu can serve it."""
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu (tfcompile[gpu])")
    return Trainer(spec_on_own_text(tmp_path), tmp_path / "run", show_progress=False).train().run_dir


def test_onnxruntime_cuda_generation_keeps_pytorch_tokens(tmp_path: Path) -> None:
    from tfcompile.export import Source, export_bundle
    from tfcompile.runtime import LanguageModel, load

    run = run_for_onnxruntime_gpu(tmp_path)
    for precision in ("fp32", "fp16"):
        export_bundle(None, Source(run=run), tmp_path / precision, precision=precision)
    cpu = load(tmp_path / "fp32", providers=["CPUExecutionProvider"])
    prompt = np.random.default_rng(0).integers(0, cpu.vocab_size, size=(2, 6))
    for precision in ("fp32", "fp16"):
        gpu = load(tmp_path / precision)
        assert isinstance(gpu, LanguageModel) and gpu.providers[0] == "CUDAExecutionProvider"
        reference = cpu.logits(prompt)
        bound = 1e-4 if precision == "fp32" else 1e-2 * np.abs(reference).max()  # export's defaults
        assert np.abs(gpu.logits(prompt) - reference).max() <= bound
    fp32 = load(tmp_path / "fp32")
    assert np.array_equal(fp32.generate(prompt, 40, temperature=0), cpu.generate(prompt, 40, temperature=0))


def test_the_fixed_step_replays_as_cuda_graphs_with_the_step_graphs_tokens(tmp_path: Path) -> None:
    from tfcompile.export import Source, export_bundle
    from tfcompile.runtime import LanguageModel, SessionOptions, load

    run = run_for_onnxruntime_gpu(tmp_path)
    export_bundle(None, Source(run=run), tmp_path / "bundle", cuda_graphs=True)
    graphed, plain = (
        load(tmp_path / "bundle"),
        load(tmp_path / "bundle", options=SessionOptions(fixed_step=False)),
    )
    assert isinstance(graphed, LanguageModel) and graphed.fixed  # on CUDA by default
    prompt = np.random.default_rng(0).integers(0, graphed.vocab_size, size=(2, 6))
    for _ in range(2):  # captured at the first steps, replayed after
        np.testing.assert_array_equal(
            graphed.generate(prompt, 80, temperature=0), plain.generate(prompt, 80, temperature=0)
        )
    assert graphed.window(2).session.get_providers()[0] == "CUDAExecutionProvider"
