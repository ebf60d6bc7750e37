"""The decode step at fixed shapes (export.cuda_graphs): exported with parity against PyTorch's
cached forward as the runtime feeds it, and generation through it (bound once per batch size, two
windows in turn; CUDA graphs on a GPU, tests/test_gpu.py) gives the step graph's tokens wherever
the search takes it: past the context, rows ending at different steps, padded prompts, sampling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, assert_follows_schema
from test_handoff_inputs import copy_bundle, edit_manifest, replace_file

from tfcompile.cli import main
from tfcompile.errors import ExportError
from tfcompile.export import Source, export_bundle, verify_bundle
from tfcompile.graphs import export as graph_export
from tfcompile.runtime import InputError, LanguageModel, SessionOptions, load
from tfcompile.runtime.errors import BundleError
from tfcompile.runtime.generation import MAX_WINDOWS, _FixedStepDecoder, _Window
from tfcompile.spec import Spec, load_spec

CONTEXT = 16
# Weights far from the initial 0.02, so that greedy decoding meets no near-ties that rounding breaks.
SETS = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.vocab_size=65",
    "model.init_std=0.3",
]


def spec(*sets: str) -> Spec:
    return load_spec(
        ROOT / "specs" / "shakespeare-char-llama.yaml", [*SETS, f"model.max_seq_len={CONTEXT}", *sets]
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fixed") / "bundle"
    export_bundle(spec(), Source(seed=0), out, cuda_graphs=True)
    return out


def served(bundle: Path, fixed: bool) -> LanguageModel:
    model = load(bundle, providers=["CPUExecutionProvider"], options=SessionOptions(fixed_step=fixed))
    assert isinstance(model, LanguageModel) and model.fixed == fixed
    return model


def test_the_fixed_step_is_exported_with_parity_only_when_asked(bundle: Path, char_bundle: Path) -> None:
    assert "fixed_step" not in json.loads((char_bundle / "manifest.json").read_text())["graphs"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    graph = manifest["graphs"]["fixed_step"]
    assert (
        graph["file"] == "fixed_step.onnx" and graph["role"] == "decode_step_fixed" and "cache" not in graph
    )
    shapes = {t["name"]: t["shape"] for t in graph["inputs"] + graph["outputs"]}
    step = {t["name"]: t["shape"] for t in manifest["graphs"]["step"]["inputs"]}
    assert shapes["input_ids"] == ["batch", 1] and shapes["attention_mask"] == ["batch", CONTEXT]
    for i in range(2):
        window = [CONTEXT - 1 if d == "past_sequence" else d for d in step[f"past_key_{i}"]]
        assert shapes[f"window_key_{i}"] == shapes[f"next_window_value_{i}"] == window
    parity = manifest["parity"]["fixed_step"]
    assert parity["passed"] and [(c["batch"], c["seq"]) for c in parity["cases"]] == [(1, CONTEXT), (3, 9)]
    assert_follows_schema(bundle)
    assert "fixed_step" in verify_bundle(bundle)  # the bundle's spec.yaml asks for it


@pytest.mark.slow
def test_the_export_command_writes_the_fixed_step_with_cuda_graphs(tmp_path: Path) -> None:
    command = ["export", str(ROOT / "specs" / "shakespeare-char-llama.yaml"), *(f"--set={s}" for s in SETS)]
    assert main([*command, "--out", str(tmp_path / "cli"), "--cuda-graphs"]) == 0
    assert "fixed_step" in json.loads((tmp_path / "cli" / "manifest.json").read_text())["graphs"]


@pytest.mark.slow
def test_parity_fails_a_window_that_slides_the_wrong_way(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A graph that drops the newest position instead of the oldest is written by torch as asked;
    the check, fed as the runtime feeds it, refuses it and nothing is written."""

    def wrong(
        self: graph_export.FixedDecoderStep,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        window_keys: list[torch.Tensor],
        window_values: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        pairs = zip(window_keys, window_values, strict=True)
        cache = [graph_export.KVCache(k, v) for k, v in pairs]
        logits = self.model(input_ids, attention_mask, cache=cache)
        return logits, [c.key[:, :, :-1] for c in cache], [c.value[:, :, :-1] for c in cache]

    monkeypatch.setattr(graph_export.FixedDecoderStep, "forward", wrong)
    with pytest.raises(ExportError, match="fixed_step graph"):
        export_bundle(spec(), Source(seed=0), tmp_path / "out", cuda_graphs=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("prompts", "limits", "temperature", "window_steps"),
    [
        # 13 steps fill the window; past the context each step re-reads the last 16 tokens afresh
        ([[5, 9, 13]], [40], 0.0, 13),
        ([[5, 9, 13, 2, 7], [1], [30, 4, 4]], [12, 3, 20], 0.0, None),  # padded; rows end apart
        ([list(range(CONTEXT))], [6], 0.0, 0),  # a prompt of the whole context: no window step
        ([[5, 9], [13, 2]], [25, 25], 0.8, 14),  # sampling
    ],
)
def test_generation_through_the_fixed_step_gives_the_step_graphs_tokens(
    bundle: Path,
    monkeypatch: pytest.MonkeyPatch,
    prompts: list[list[int]],
    limits: list[int],
    temperature: float,
    window_steps: int | None,
) -> None:
    plain, fixed = served(bundle, False), served(bundle, True)
    steps = []
    window_step = _Window.step
    monkeypatch.setattr(_Window, "step", lambda self, *a: steps.append(self.batch) or window_step(self, *a))
    expected = plain.generate_prompts(prompts, limits, plain.sampling(len(prompts), temperature, seed=3))
    assert not steps
    got = fixed.generate_prompts(prompts, limits, fixed.sampling(len(prompts), temperature, seed=3))
    assert got == expected
    assert len(steps) == window_steps if window_steps is not None else len(set(steps)) > 1  # batch sizes
    assert not any(w.held for w in fixed._windows.values())  # given back at the end


def test_a_held_window_does_not_let_the_others_grow_past_their_bound(bundle: Path) -> None:
    """The oldest window held (a long generation) stopped the eviction, and every new batch size
    opened another session: 11 open of MAX_WINDOWS 4."""
    fixed = served(bundle, True)
    holder = _FixedStepDecoder(fixed)
    window = fixed.window(1)
    assert window is not None and window.take(holder)
    for batch in range(2, 9):
        fixed.generate(np.ones((batch, 3), dtype=np.int64), 2, temperature=0, stop=False)
        assert len(fixed._windows) <= MAX_WINDOWS and fixed._windows[1] is window  # the held one stays
    assert list(fixed._windows) == [1, 6, 7, 8]
    holders = [_FixedStepDecoder(fixed) for _ in range(3)]  # a window's holder is held weakly
    for batch, other_holder in zip((9, 10, 11), holders, strict=True):
        other = fixed.window(batch)
        assert other is not None and other.take(other_holder)
    assert fixed.window(12) is None and len(fixed._windows) == MAX_WINDOWS


def test_the_least_recently_used_window_goes_first(bundle: Path) -> None:
    fixed = served(bundle, True)
    for batch in (2, 3, 4, 1):  # 1 was opened at load: used again now
        fixed.window(batch)
    fixed.window(5)
    assert list(fixed._windows) == [3, 4, 1, 5]


def test_a_window_another_generation_holds_leaves_the_steps_on_the_step_graph(bundle: Path) -> None:
    plain, fixed = served(bundle, False), served(bundle, True)
    window, other = fixed.window(1), _FixedStepDecoder(fixed)
    assert window is not None and window.take(other)
    prompt = np.array([[5, 9, 13]])
    expected = plain.generate(prompt, 10, temperature=0)
    np.testing.assert_array_equal(fixed.generate(prompt, 10, temperature=0), expected)
    assert window.held  # still the other's
    del other  # a decoder dropped without giving its window back holds it no more
    assert not window.held and window.take(_FixedStepDecoder(fixed))


def test_fixed_step_options_are_checked(bundle: Path, char_bundle: Path) -> None:
    with pytest.raises(InputError, match="fixed_step must be"):
        SessionOptions(fixed_step="yes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"no fixed_step graph.*--cuda-graphs"):
        load(char_bundle, options=SessionOptions(fixed_step=True))
    assert not served(char_bundle, False).fixed
    assert not load(bundle, providers=["CPUExecutionProvider"]).fixed  # by default only on CUDA


@pytest.mark.parametrize(
    ("tensor", "field", "value"),
    [
        ("window_key_0", "shape", ["batch", 4, 2 * CONTEXT, 8]),  # buffers are allocated from these
        ("next_window_value_1", "shape", ["batch", 4, CONTEXT, 8]),
        ("attention_mask", "shape", ["batch", CONTEXT - 1]),
        ("window_value_1", "dtype", "float16"),  # the step graph's cache is copied into it
    ],
)
def test_a_fixed_step_that_is_no_window_of_the_cache_is_refused(
    bundle: Path, tmp_path: Path, tensor: str, field: str, value: object
) -> None:
    damaged = copy_bundle(bundle, tmp_path / "damaged")

    def reshape(manifest: dict) -> None:
        graph = manifest["graphs"]["fixed_step"]
        for t in graph["inputs"] + graph["outputs"]:
            if t["name"] == tensor:
                t[field] = value

    edit_manifest(damaged, reshape)
    with pytest.raises(BundleError, match=f"fixed_step graph's {tensor} is .* a window of the step graph"):
        load(damaged, options=SessionOptions(fixed_step=True))
    assert not served(damaged, False).fixed  # never read where it is not used


def test_cuda_graphs_is_refused_where_there_is_no_fixed_step(tmp_path: Path) -> None:
    vit = load_spec(ROOT / "specs" / "vit-digits.yaml", ["export.cuda_graphs=true"])
    with pytest.raises(ExportError, match="which image_classification bundles do not have"):
        export_bundle(vit, Source(seed=0), tmp_path / "vit")
    assert not any(tmp_path.iterdir())


def test_an_optimized_bundle_keeps_a_fused_fixed_step(bundle: Path, tmp_path: Path) -> None:
    import onnx

    from tfcompile.optimize import Plan, optimize_bundle

    done = optimize_bundle(bundle, tmp_path / "fused", Plan(fuse=True), None)
    assert done.parity["fixed_step"] <= 1e-4
    graph = onnx.load(str(tmp_path / "fused" / "fixed_step.onnx"))
    assert any(n.op_type == "MultiHeadAttention" for n in graph.graph.node)
    prompt = np.array([[5, 9, 13], [2, 7, 1]])
    expected = served(bundle, False).generate(prompt, 20, temperature=0)
    np.testing.assert_array_equal(
        served(tmp_path / "fused", True).generate(prompt, 20, temperature=0), expected
    )


def test_a_broken_fixed_step_fails_at_load(bundle: Path, tmp_path: Path) -> None:
    """The graph is opened at load (batch 1) wherever it is used, as every graph the runtime runs."""
    damaged = copy_bundle(bundle, tmp_path / "damaged")
    replace_file(damaged, "fixed_step.onnx", (bundle / "decoder_step.onnx").read_bytes())
    with pytest.raises(BundleError, match=r"fixed_step\.onnx has inputs"):
        load(damaged, options=SessionOptions(fixed_step=True))
    assert not served(damaged, False).fixed


def test_a_server_batch_steps_through_the_windows_already_open(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Continuous batching: a lone stream steps through batch 1's window (opened at load); a
    request joining it makes a batch of 2, whose steps stay on the step graph (the server opens
    no window: each would be a session), and when it ends the stream is back in the window. Every
    row gets the tokens it generates alone."""
    import asyncio

    from tfcompile.search import GREEDY
    from tfcompile.serve.engine import GenerationRow, Job, Worker

    plain, fixed = served(bundle, False), served(bundle, True)
    steps = []
    window_step = _Window.step
    monkeypatch.setattr(_Window, "step", lambda self, *a: steps.append(self.batch) or window_step(self, *a))
    worker = Worker("m", fixed, max_batch=8, max_wait=0.05, max_queue=64, arriving=lambda: 0)
    worker.start()
    assert worker.ready.wait(5)
    long_prompt, short_prompt = [5, 9, 13], [2, 7]

    async def main() -> tuple[list, list]:
        long = worker.submit(Job("generate", [GenerationRow(long_prompt, 12, GREEDY)], stream=True))
        await long.events.get()  # its first token: it runs
        short = worker.submit(Job("generate", [GenerationRow(short_prompt, 4, GREEDY)]))
        return await short.result, await long.result

    (short,), (long,) = asyncio.run(main())
    worker.stop()
    assert short.tokens == plain.generate_prompts([short_prompt], [4], [GREEDY])[0]
    assert long.tokens == plain.generate_prompts([long_prompt], [12], [GREEDY])[0]
    assert steps and set(steps) == {1} and list(fixed._windows) == [1]
    assert not fixed._windows[1].held  # the finished batch's decoder is gone


def test_warming_up_runs_both_turns_of_batch_1s_window_twice(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So that a server's first request finds both CUDA graphs captured (each a regular run, then
    the capture)."""
    turns = []
    window_step = _Window.step
    monkeypatch.setattr(_Window, "step", lambda self, *a: turns.append(self.turn) or window_step(self, *a))
    served(bundle, True).warm_up()
    assert turns == [0, 1, 0, 1]
