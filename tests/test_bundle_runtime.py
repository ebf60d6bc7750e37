"""Bundles and the onnxruntime-only runtime: manifest, hashes, format versions, input checks,
logits equal to PyTorch's, no torch import, and verification from the run's checkpoint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from helpers import ROOT, assert_follows_schema, damaged, random_run

from tfcompile.cli import main
from tfcompile.export import ExportError, Source, export_bundle, verify_bundle
from tfcompile.runtime import FORMAT_VERSION, BundleError, InputError, LanguageModel, load
from tfcompile.runtime.ort import ort
from tfcompile.runtime.session import session_providers
from tfcompile.spec import load_spec
from tfcompile.train import Trainer, load_trained_model

SETS = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.max_seq_len=24",
    "model.positional=rope",
    "train.steps=4",
    "train.batch_size=4",
    "train.eval_interval=2",
    "train.eval_batches=1",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml", [*SETS, f"train.runs_dir={root}"])
    trainer = Trainer(spec, root / "tiny", show_progress=False)
    trainer.train()
    return trainer.run_dir


@pytest.fixture(scope="module")
def bundle(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exported") / "tiny"
    export_bundle(None, Source(run=run_dir), out)
    return out


def test_bundle_holds_the_files_and_a_complete_manifest(bundle: Path) -> None:
    files = {"model.onnx", "decoder_step.onnx", "tokenizer.json", "spec.yaml"}
    assert {p.name for p in bundle.iterdir()} == files | {"manifest.json"}
    assert_follows_schema(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION == 2 and manifest["opset"] == 18
    graph = manifest["graphs"]["model"]
    assert graph["role"] == "forward"
    assert [(t["name"], t["dtype"], t["shape"]) for t in graph["inputs"]] == [
        ("input_ids", "int64", ["batch", "sequence"]),
        ("attention_mask", "int64", ["batch", "sequence"]),
    ]
    assert graph["outputs"][0]["name"] == "logits" and graph["outputs"][0]["shape"][2] == 65
    every = [t for g in manifest["graphs"].values() for t in g["inputs"] + g["outputs"]]
    assert all(t["meaning"] for t in every), "every input and output is explained"
    present = [t["shape"] for t in manifest["graphs"]["step"]["outputs"] if t["name"].startswith("present")]
    assert present[0][2] == "past_sequence + sequence" and all(s == present[0] for s in present)
    assert set(manifest["versions"]) == {"tfcompile", "torch", "onnx", "onnxscript", "onnxruntime"}
    assert set(manifest["files"]) == files
    for graph in ("model", "step"):
        assert manifest["parity"][graph]["passed"] and manifest["parity"][graph]["max_abs_diff"] < 1e-5
    assert manifest["model"] == {"family": "decoder", "vocab_size": 65, "max_seq_len": 24}
    step = manifest["graphs"]["step"]
    assert step["role"] == "decode_step"
    layers = range(2)
    assert step["cache"] == {
        "past": [f"past_key_{i}" for i in layers] + [f"past_value_{i}" for i in layers],
        "present": [f"present_key_{i}" for i in layers] + [f"present_value_{i}" for i in layers],
        "axis": "past_sequence",
    }
    past_key = next(t for t in step["inputs"] if t["name"] == "past_key_0")
    assert (past_key["dtype"], past_key["shape"]) == ("float32", ["batch", 2, "past_sequence", 8])
    assert manifest["generation"]["context_length"] == 24
    assert manifest["generation"]["stop_token_ids"] == []  # the lecture's vocabulary has no [EOS]
    tokenizer = manifest["tokenizer"]
    assert manifest["padding"] == {"side": "left", "pad_id": 0} and tokenizer["unknown"] == "refuse"


def test_runtime_logits_equal_torch_logits(bundle: Path, run_dir: Path) -> None:
    model = load(bundle)
    assert "CPUExecutionProvider" in model.providers
    _, reference = load_trained_model(run_dir)
    ids = np.random.default_rng(5).integers(0, 65, size=(3, 24))
    mask = np.ones_like(ids)
    mask[2, 10:] = 0
    with torch.no_grad():
        expected = reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(model.logits(ids, mask), expected, atol=1e-5, rtol=0)
    text = "ROMEO:"
    assert model.tokenizer is not None and model.tokenizer.decode(model.tokenizer.encode(text).ids) == text


def test_cuda_provider_runs_in_full_fp32_and_unknown_providers_are_refused(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    assert session_providers(["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        ("CUDAExecutionProvider", {"use_tf32": "0"}),  # TF32 moves fp32 logits by ~1e-3
        ("CPUExecutionProvider", {}),
    ]
    monkeypatch.undo()
    with pytest.raises(InputError, match=r"'NoSuchExecutionProvider' is not available.*tfcompile\[gpu\]"):
        load(bundle, providers=["NoSuchExecutionProvider"])


@pytest.mark.parametrize(
    ("ids", "mask", "message"),
    [
        (np.zeros((1, 4), dtype=np.float32), None, "integer token ids, got dtype float32"),
        (np.zeros(4, dtype=np.int64), None, r"shape \(batch, seq\), got shape \(4,\)"),
        (np.zeros((1, 0), dtype=np.int64), None, "must not be empty"),
        (np.full((1, 4), 65), None, r"token id 65, outside the vocabulary \[0, 65\)"),
        (np.full((1, 4), -1), None, "token id -1"),
        (np.zeros((1, 25), dtype=np.int64), None, "25 tokens, more than the model's context of 24"),
        (np.zeros((2, 4), dtype=np.int64), np.ones((2, 5)), r"attention_mask has shape \(2, 5\)"),
        (np.zeros((1, 4), dtype=np.int64), np.full((1, 4), 2), "0 \\(padding\\) and 1"),
    ],
)
def test_bad_inputs_get_clear_errors(
    bundle: Path, ids: np.ndarray, mask: np.ndarray | None, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        load(bundle).logits(ids, mask)


def test_a_changed_file_is_refused(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    with open(copy / "model.onnx", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(BundleError, match=r"model\.onnx was changed after export"):
        load(copy)
    shutil.rmtree(copy)
    shutil.copytree(bundle, copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match=r"tokenizer\.json is missing"):
        load(copy)


def test_a_newer_format_is_refused(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"newer than this tfcompile reads .* upgrade tfcompile"):
        load(copy)
    with pytest.raises(BundleError, match="not a tfcompile bundle"):
        load(tmp_path)


def test_runtime_never_imports_torch(bundle: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "from tfcompile.runtime import load\n"
        f"m = load({str(bundle)!r})\n"
        "assert m.logits(np.zeros((2, 5), dtype=np.int64)).shape == (2, 5, 65)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_verify_reruns_parity_from_the_run(bundle: Path, run_dir: Path) -> None:
    with pytest.raises(ExportError, match=r"exported from the run .*tiny'.*pass --run RUN"):
        verify_bundle(bundle)  # the manifest names the run, but its word opens nothing outside it
    reports = verify_bundle(bundle, run=run_dir)
    assert reports["model"].passed and len(reports["model"].cases) == 4 and reports["step"].passed
    assert all(r.passed for r in verify_bundle(bundle, run=run_dir).values())


def test_verify_names_a_run_or_a_spec_that_is_not_the_bundles(bundle: Path, tmp_path: Path) -> None:
    """Another run, or a spec.yaml of another model, failed inside onnxruntime as if the graphs
    were broken ("Invalid input name: token_type_ids")."""
    text = "model: {family: decoder, vocab_size: 65, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16}\n"
    other = random_run(tmp_path / "other", text)
    latest = damaged(
        bundle, tmp_path / "latest", lambda m: m.update(source={"run": str(other), "checkpoint": "last"})
    )
    with pytest.raises(
        ExportError, match=r"is not the run .* was exported from: its causal_lm model differs .* in d_model"
    ):
        verify_bundle(latest, run=other)
    spec = (bundle / "spec.yaml").read_text().replace("vocab_size: 65", "vocab_size: 70")
    assert "vocab_size: 70" in spec
    folder = damaged(bundle, tmp_path, **{"spec.yaml": spec.encode()})
    with pytest.raises(
        BundleError, match=r"spec\.yaml is not the spec of the manifest's graphs: .*\('causal_lm', 70"
    ):
        verify_bundle(folder)


def test_spec_export_is_verified_from_its_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "from-spec"
    args = ["export", str(ROOT / "specs" / "vaswani-decoder.yaml"), "--out", str(out), "--seed", "3"]
    args += ["--set", "model.n_layers=1", "--set", "model.d_model=64", "--set", "model.max_seq_len=16"]
    assert main(args) == 0
    assert "within tolerance" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["source"] == {"seed": 3}
    assert main(["verify", str(out)]) == 0


def test_export_fails_cleanly_when_parity_does_not_hold(tmp_path: Path) -> None:
    spec = load_spec(
        ROOT / "specs" / "vaswani-decoder.yaml",
        ["model.n_layers=1", "model.d_model=64", "model.max_seq_len=16", "export.tolerance=1.0e-15"],
    )
    out = tmp_path / "strict"
    message = (
        r"disagree by \S+ \(relative to the outputs' scale past 1\) on the model graph's outputs, more than"
    )
    with pytest.raises(ExportError, match=message + r" export\.tolerance 1e-15"):
        export_bundle(spec, Source(seed=0), out)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.slow  # end to end: CLI processes exporting a run
def test_cli_export_of_a_run_and_errors(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert (out / "manifest.json").exists()
    assert main(["verify", str(tmp_path)]) == 1
    assert "not a tfcompile bundle" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "count"),
    [
        ("vocab_size: 16777216, d_model: 65536, max_seq_len: 8", "1,151,052,742,656"),  # weights
        ("vocab_size: 100, d_model: 64, max_seq_len: 1000000000, positional: rope", "56,512"),  # buffers
    ],
)
def test_exporting_a_spec_too_large_for_memory_is_refused_before_anything_is_allocated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, count: str
) -> None:
    """Random weights of a 1.6-trillion-parameter spec, or RoPE's tables for a billion positions:
    a named error, not PyTorch's failed allocation; the summary, on the meta device, reads both."""
    spec = tmp_path / "huge.yaml"
    spec.write_text(f"model: {{family: decoder, n_heads: 2, n_layers: 1, {model}}}\n")
    assert main(["export", str(spec), "--out", str(tmp_path / "bundle")]) == 1
    assert re.search(
        rf"error: the model's {count} parameters and its buffers \(positions, masks\) take [\d,.]+ GB, "
        r"more than this machine's memory .*: lower model\.d_model, model\.n_layers, model\.max_seq_len",
        capsys.readouterr().err,
    )
    assert not (tmp_path / "bundle").exists()
    assert main(["summary", str(spec)]) == 0


def test_greedy_generation_matches_torch_with_and_without_cache(bundle: Path, run_dir: Path) -> None:
    from tfcompile.tasks.causal_lm import generate

    model = load(bundle)
    _, reference = load_trained_model(run_dir)
    prompt = np.array([model.tokenizer.encode("ROMEO:").ids, model.tokenizer.encode("JULIET").ids])
    expected = generate(reference, torch.from_numpy(prompt), 14, temperature=0).numpy()
    with_cache = model.generate(prompt, 14, temperature=0)
    without_cache = model.generate(prompt, 14, temperature=0, use_cache=False)
    np.testing.assert_array_equal(with_cache, expected)
    np.testing.assert_array_equal(without_cache, expected)


def test_sampling_is_seeded_and_respects_top_k(bundle: Path) -> None:
    from tfcompile.runtime import sample_next

    model = load(bundle)
    a = model.generate_text("ROMEO:", 10, temperature=1.0, top_k=5, seed=3)
    assert a == model.generate_text("ROMEO:", 10, temperature=1.0, top_k=5, seed=3)
    assert a.startswith("ROMEO:") and len(a) == 16
    logits = np.tile(np.array([[4.0, 3.0, 2.0, -1.0, -2.0]]), (400, 1))
    rng = np.random.default_rng(0)
    assert set(sample_next(logits, top_k=2, rng=rng).tolist()) == {0, 1}
    assert set(sample_next(logits, top_p=0.95, rng=rng).tolist()) == {0, 1, 2}
    assert sample_next(logits, temperature=0).tolist() == [0] * 400


def test_generation_past_the_context_reads_the_last_context_tokens_as_sample_does(
    bundle: Path, run_dir: Path
) -> None:
    from tfcompile.tasks.causal_lm import generate

    prompt = np.zeros((1, 5), dtype=np.int64)
    _, reference = load_trained_model(run_dir)
    expected = generate(reference, torch.from_numpy(prompt), 30, temperature=0).numpy()  # 35 > 24
    assert np.array_equal(load(bundle).generate(prompt, 30, temperature=0), expected)
    assert np.array_equal(load(bundle).generate(prompt, 30, temperature=0, use_cache=False), expected)


def test_cli_generate_uses_the_runtime(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["generate", str(bundle), "--prompt", "ROMEO:", "--max-new-tokens", "8", "--temperature", "0"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out.rstrip("\n")) == 14
    args = ["generate", str(bundle), "--prompt", "ROMEO:", "--prompt", "JU", "--max-new-tokens", "8"]
    assert main([*args, "--temperature", "0"]) == 0  # a batch: each prompt as it would go alone
    batch = capsys.readouterr().out.rstrip("\n").split("\n\n")
    assert batch[0] == out.rstrip("\n") and batch[1].startswith("JU") and len(batch) == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
        ({"min_p": "0.1"}, "min_p must be a finite number"),
    ],
)
def test_bad_sampling_options_are_refused(bundle: Path, options: dict, message: str) -> None:
    arguments = {"max_new_tokens": 2, **options}
    with pytest.raises(InputError, match=message):
        load(bundle).generate(np.zeros((1, 3), dtype=np.int64), **arguments)


@pytest.mark.slow  # an export of its own: 9 s
def test_the_specs_sampling_defaults_are_the_bundles_and_the_commands(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """task.min_p and task.temperature become the manifest's defaults: generation without options
    draws as they say (min_p 1 keeps the likeliest token alone: greedy), and `tfcompile generate`
    and `sample` without options generate with the bundle's and the spec's defaults."""
    from tfcompile.spec import dump_spec

    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    (run / "spec.yaml").write_text(
        dump_spec(load_spec(run / "spec.yaml", ["task.min_p=1", "task.temperature=0.7"]))
    )
    export_bundle(None, Source(run=run), tmp_path / "bundle")
    model = load(tmp_path / "bundle")
    assert isinstance(model, LanguageModel) and model.generation is not None
    assert (model.generation.min_p, model.generation.temperature) == (1.0, 0.7)
    greedy = model.generate_text("ROMEO:", 12, temperature=0)
    assert model.generate_text("ROMEO:", 12, seed=3) == greedy
    drawn = model.generate_text("ROMEO:", 12, seed=3, min_p=0)
    assert drawn != greedy
    for command, source in (("generate", tmp_path / "bundle"), ("sample", run)):
        assert main([command, str(source), "--prompt", "ROMEO:", "--max-new-tokens", "12"]) == 0
        assert capsys.readouterr().out == greedy + "\n", command
    assert (
        main(
            [
                "generate",
                str(tmp_path / "bundle"),
                "--prompt",
                "ROMEO:",
                "--max-new-tokens",
                "12",
                "--min-p",
                "0",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == drawn + "\n"


def test_export_never_replaces_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "specs" / "vaswani-decoder.yaml", ["model.n_layers=1", "model.d_model=64"])
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(ExportError, match="exists and is not a bundle"):
        export_bundle(spec, Source(seed=0), tmp_path)
    assert precious.read_text() == "keep me"


@pytest.mark.slow  # an fp16 export and its parity: 10 s
def test_an_fp16_bundle_holds_parity_to_the_fp32_model_and_serves_float32(
    run_dir: Path, bundle: Path, tmp_path: Path
) -> None:
    half_dir = tmp_path / "half"
    reports = export_bundle(None, Source(run=run_dir), half_dir, precision="fp16")
    for report in reports.values():  # bounded relative to the logits' scale, 1% by default
        assert report.relative and report.tolerance == 1e-2 and report.passed
        assert 0 < report.max_rel_diff
    manifest = json.loads((half_dir / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    pasts = [i for i in manifest["graphs"]["step"]["inputs"] if i["name"].startswith("past_")]
    assert {i["dtype"] for i in pasts} == {"float16"}
    weights = [w for w in onnx.load(str(half_dir / "model.onnx")).graph.initializer if len(w.dims) == 2]
    assert weights and {w.data_type for w in weights} == {onnx.TensorProto.FLOAT16}
    half, full = load(half_dir), load(bundle)
    ids = np.random.default_rng(3).integers(0, 65, size=(2, 10))
    served, reference = half.logits(ids), full.logits(ids)
    assert served.dtype == np.float32
    assert np.abs(served - reference).max() <= 1e-2 * np.abs(reference).max()
    generated = half.generate(ids[:, :4], 12, temperature=0)  # fp16 caches through the I/O binding
    assert generated.shape == (2, 16) and np.array_equal(generated[:, :4], ids[:, :4])
    assert all(r.passed and r.relative for r in verify_bundle(half_dir, run_dir).values())


@pytest.mark.slow  # a training run and an export of its own: 10 s
def test_documents_end_with_eos_and_generation_stops_there(tmp_path: Path) -> None:
    """A folder's files are documents: training sees [EOS] after each, the bundle's manifest names
    it as the stop token, and generation ends when the model emits it."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for i in range(200):
        (corpus / f"{i:03d}.txt").write_text("to be")
    spec = load_spec(
        ROOT / "specs" / "shakespeare-char.yaml",
        [
            *SETS,
            "model.max_seq_len=16",
            "model.vocab_size=null",
            "model.dropout={embedding: 0.0, attention: 0.0, residual: 0.0}",
            f"data.path={corpus}",
            "task.special_tokens=true",
            "train.steps=120",
            "train.optimizer.lr=1.0e-2",
            "train.eval_interval=120",
            f"train.runs_dir={tmp_path}",
        ],
    )
    trainer = Trainer(spec, tmp_path / "eos", show_progress=False)
    trainer.train()
    export_bundle(None, Source(run=trainer.run_dir), tmp_path / "bundle")
    model = load(tmp_path / "bundle")
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    eos = manifest["tokenizer"]["special_tokens"]["eos"]
    assert eos == {"token": "[EOS]", "id": 2} and manifest["generation"]["stop_token_ids"] == [2]
    assert manifest["tokenizer"]["unknown"] == "map"  # [UNK] is in the vocabulary
    assert model.generate_text("to", 10, temperature=0) == "to be"  # stopped, [EOS] not shown
    ids = model.generate(np.array([model.tokenizer.encode("to").ids]), 10, temperature=0)
    assert ids.shape == (1, 2 + 4) and ids[0, -1] == 2  # " be", then the [EOS] that ended it
    assert model.generate_text("to", 10, temperature=0, stop=False) != "to be"
