"""The runtime's fast generation loop (tfcompile.runtime.generation's step decoder, the step
graph's session options) against a plain loop written here with onnxruntime alone: the same
greedy tokens, batched or not, on the CPU path and on the bound (device) path run on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tfcompile import search
from tfcompile.runtime import LanguageModel, SessionOptions, load
from tfcompile.runtime.generation import _StepDecoder
from tfcompile.runtime.session import step_threads

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5], [8]]
NEW_TOKENS = 12


def reference_tokens(bundle: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding of one prompt the plainest way: a fresh session on the step graph, every
    input a numpy array, every present fed back as the next past, the argmax of the last logits."""
    model = load(bundle)
    graph = model.graph("step")
    assert graph.cache is not None
    session = ort.InferenceSession(str(bundle / graph.file), providers=["CPUExecutionProvider"])
    past = dict(zip(graph.cache.past, model.empty_cache("step", 1), strict=True))
    ids = np.array([prompt], dtype=np.int64)
    new: list[int] = []
    for _ in range(new_tokens):
        length = len(prompt) + len(new)
        feed = {"input_ids": ids, "attention_mask": np.ones((1, length), dtype=np.int64), **past}
        logits, *present = session.run(["logits", *graph.cache.present], feed)
        new.append(int(logits[0, -1].argmax()))
        past = dict(zip(graph.cache.past, present, strict=True))
        ids = np.array([[new[-1]]], dtype=np.int64)
    return new


@pytest.fixture(scope="module")
def expected(char_bundle: Path) -> list[list[int]]:
    return [reference_tokens(char_bundle, p, NEW_TOKENS) for p in PROMPTS]


def test_generate_gives_the_plain_loops_tokens(char_bundle: Path, expected: list[list[int]]) -> None:
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        out = model.generate(np.array([prompt]), NEW_TOKENS, temperature=0, stop=False)
        assert out[0, len(prompt) :].tolist() == tokens
    greedy = [search.GREEDY] * len(PROMPTS)
    batch = model.generate_prompts(PROMPTS, [NEW_TOKENS] * len(PROMPTS), greedy, stop=False)
    assert batch == expected  # left-padded together, each row as alone


@pytest.mark.parametrize("bound", [False, True])
def test_both_step_paths_give_the_plain_loops_tokens(
    char_bundle: Path, expected: list[list[int]], bound: bool
) -> None:
    """The bound path is what CUDA takes; bound to the CPU here, it must give the same tokens."""
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    decoder = _StepDecoder(model)
    decoder.bound = bound
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        decoder.reset()
        got = search.generate(decoder, np.array([prompt]), NEW_TOKENS, search.GREEDY)[0]
        assert got == tokens
        assert all(isinstance(p, np.ndarray) != bound for p in decoder.past)


@pytest.mark.parametrize("bound", [False, True])
def test_reordered_rows_continue_as_their_source_row(char_bundle: Path, bound: bool) -> None:
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    decoder = _StepDecoder(model)
    decoder.bound = bound
    decoder.step(np.array([PROMPTS[0]]), None)
    decoder.reorder(np.array([0, 0]))
    twice = decoder.step(np.array([[7], [7]]), None)
    decoder.reset()
    decoder.step(np.array([PROMPTS[0]]), None)
    once = decoder.step(np.array([[7]]), None)
    np.testing.assert_allclose(twice, np.concatenate([once, once]), rtol=1e-5, atol=1e-6)


def test_step_graphs_run_on_step_threads_unless_threads_are_given(char_bundle: Path) -> None:
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    assert model.step.get_session_options().intra_op_num_threads == step_threads()
    assert model.session.get_session_options().intra_op_num_threads == 0  # one per core
    chosen = load(char_bundle, options=SessionOptions(threads=3))
    assert isinstance(chosen, LanguageModel)
    assert chosen.step.get_session_options().intra_op_num_threads == 3
    assert chosen.session.get_session_options().intra_op_num_threads == 3


@pytest.mark.parametrize(("cores", "threads"), [(None, 1), (1, 1), (2, 1), (8, 4), (64, 16)])
def test_step_threads_are_half_the_cores_within_bounds(
    monkeypatch: pytest.MonkeyPatch, cores: int | None, threads: int
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert step_threads() == threads
