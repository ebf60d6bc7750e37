"""The runtime calls a server builds on: prompts with their own limits and sampling batched
together, a per-step hook that ends rows, raw-tensor infer, and onnxruntime session options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from tfcompile.runtime import BundleError, InputError, LanguageModel, SessionOptions, load
from tfcompile.search import GREEDY, Sampling

PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed", "O"]


@pytest.fixture(scope="module")
def model(char_bundle: Path) -> LanguageModel:
    loaded = load(char_bundle)
    assert isinstance(loaded, LanguageModel)
    return loaded


def ids(model: LanguageModel, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in model.encode(texts)]


def test_each_row_keeps_its_limit_and_its_sampling_in_a_batch(model: LanguageModel) -> None:
    prompts = ids(model, PROMPTS)
    limits = [3, 9, 6]
    samplings = [GREEDY, Sampling(0.9, 20, 0.95, seed=4), Sampling(1.2, None, None, seed=11)]
    together = model.generate_prompts(prompts, limits, samplings)
    alone = [
        model.generate_prompts([p], [n], [s])[0] for p, n, s in zip(prompts, limits, samplings, strict=True)
    ]
    assert together == alone
    assert [len(row) for row in together] == limits


def test_a_seed_gives_row_r_the_seed_plus_r(model: LanguageModel) -> None:
    rows = model.sampling(3, temperature=1.0, seed=5)
    assert [r.seed for r in rows] == [5, 6, 7]
    texts = model.generate_text([PROMPTS[0]] * 3, 8, temperature=1.0, seed=5)
    assert texts[1] == model.generate_text(PROMPTS[0], 8, temperature=1.0, seed=6)
    assert len(set(texts)) > 1


def test_on_step_sees_each_token_and_ends_the_rows_it_returns(model: LanguageModel) -> None:
    prompts = ids(model, PROMPTS[:2])
    seen: list[dict[int, int]] = []

    def on_step(tokens: dict[int, int]) -> list[int]:
        seen.append(dict(tokens))
        return [0] if len(seen) == 2 else []  # row 0 ends after its second token

    rows = model.generate_prompts(prompts, [6, 6], [GREEDY, GREEDY], on_step=on_step)
    assert len(rows[0]) == 2 and len(rows[1]) == 6
    assert [step[1] for step in seen] == rows[1]
    assert [step[0] for step in seen if 0 in step] == rows[0]


def test_prompts_joining_a_running_batch_generate_what_they_would_alone(model: LanguageModel) -> None:
    """Continuous batching: prompts join a running batch between its steps (shorter and longer than
    it, one past the context of 64 at once and one later) and rows leave as they end; each row
    gets the tokens it would alone, and the batch is never wider than its longest row."""
    prompts = ids(model, [*PROMPTS, "First Citizen:\nBefore we proceed any further, hear me speak."])
    plan = {  # step -> (prompt, limit, sampling) joining then
        0: (0, 40, GREEDY),
        3: (2, 80, GREEDY),
        5: (1, 12, Sampling(0.8, 10, None, seed=3)),
        9: (3, 6, GREEDY),
        20: (3, 0, GREEDY),
    }
    batch, keys, length, step = model.batch(), {}, {}, 0
    while step == 0 or batch:
        if step in plan:
            p, limit, sampling = plan[step]
            (key,) = model.join(batch, [prompts[p]], [limit], [sampling])
            keys[key], length[key] = (p, limit, sampling), len(prompts[p])
        batch.sample()
        batch.advance()
        if batch:
            assert batch.width == max(length[row.key] + len(row.tokens) for row in batch.rows)
        step += 1
    assert step == 80 + 3 and sorted(batch.finished) == sorted(keys)
    for key, (p, limit, sampling) in keys.items():
        assert batch.finished[key] == model.generate_prompts([prompts[p]], [limit], [sampling])[0]


def test_a_format_1_bundle_cannot_batch_between_steps() -> None:
    format_1 = load(ROOT / "tests" / "data" / "format1-decoder")  # its step graph takes no padding
    assert isinstance(format_1, LanguageModel)
    with pytest.raises(BundleError, match="format 1"):
        format_1.batch()


def test_infer_runs_the_main_graph_on_checked_tensors(model: LanguageModel) -> None:
    batch = np.array([[5, 6, 7], [8, 9, 0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    out = model.infer({"input_ids": batch, "attention_mask": mask})
    np.testing.assert_array_equal(out["logits"], model.logits(batch, mask))
    for feed, needle in [
        ({"input_ids": batch}, "takes the inputs"),
        ({"input_ids": batch, "attention_mask": mask[:, :2]}, "shape"),
        ({"input_ids": batch[:, :0], "attention_mask": mask[:, :0]}, "shape"),
        ({"input_ids": batch + 1000, "attention_mask": mask}, "outside the vocabulary"),
        ({"input_ids": batch, "attention_mask": mask * 2}, "0 and 1"),
        ({"input_ids": batch.astype(float), "attention_mask": mask}, "integer token ids"),
    ]:
        with pytest.raises(InputError, match=needle):
            model.infer(feed)


def test_session_options_reach_onnxruntime(char_bundle: Path) -> None:
    model = load(char_bundle, options=SessionOptions(threads=1, spin=False))
    options = model.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert (
        load(char_bundle)
        .session.get_session_options()
        .get_session_config_entry("session.intra_op.allow_spinning")
        == "1"
    )
