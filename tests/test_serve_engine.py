"""The server's batching engine without HTTP: how batches form, and what a failing batch does."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ROOT

from tfcompile.errors import InputError
from tfcompile.runtime import LanguageModel, load
from tfcompile.search import GREEDY
from tfcompile.sequences import length_groups
from tfcompile.serve.engine import Finished, GenerationRow, Job, Overloaded, Worker


class FakeClassifier:
    """Records each batch; a text "bad" fails the batch it is in, as the tokenizer would."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.seconds = seconds
        self.gate = threading.Event()
        self.gate.set()

    def warm_up(self) -> None:
        pass

    def classify(self, texts: list[str]) -> list[str]:
        self.gate.wait()
        self.batches.append(list(texts))
        time.sleep(self.seconds)
        if "bad" in texts:
            raise InputError("bad text")
        return [text.upper() for text in texts]


def started(
    model: Any, arriving: Callable[[], int] = lambda: 0, max_wait: float = 0.05, max_queue: int = 64
) -> Worker:
    worker = Worker("m", model, max_batch=8, max_wait=max_wait, max_queue=max_queue, arriving=arriving)
    worker.start()
    assert worker.ready.wait(5)
    return worker


def test_a_lone_request_does_not_wait_for_company() -> None:
    model = FakeClassifier()
    worker = started(model, max_wait=1.0)

    async def main() -> float:
        start = time.perf_counter()
        assert await worker.submit(Job("classify", ["a"])).result == ["A"]
        return time.perf_counter() - start

    assert asyncio.run(main()) < 0.5  # far below max_wait
    worker.stop()


def test_arriving_requests_are_waited_for_and_batched() -> None:
    """With 3 more requests arriving, the first waits (up to max_wait) for them, and no longer
    once they are in: the batch runs long before the deadline."""
    model = FakeClassifier()
    coming = [3]
    worker = started(model, arriving=lambda: coming[0], max_wait=30.0)

    async def main() -> list[Any]:
        jobs = []
        for i, text in enumerate("abcd"):
            jobs.append(worker.submit(Job("classify", [text])))
            coming[0] = 3 - i  # handed over: no longer arriving
            await asyncio.sleep(0.02)  # they arrive one by one
        return [await job.result for job in jobs]

    start = time.perf_counter()
    assert asyncio.run(main()) == [["A"], ["B"], ["C"], ["D"]]
    assert time.perf_counter() - start < 10  # not max_wait: nothing was arriving after "d"
    assert model.batches == [["a", "b", "c", "d"]]
    worker.stop()


def test_jobs_of_other_kinds_or_options_are_not_mixed() -> None:
    model = FakeClassifier()
    model.gate.clear()  # hold the worker so that every job queues
    worker = started(model)

    async def main() -> None:
        first = worker.submit(Job("classify", ["x"]))
        await asyncio.sleep(0.05)  # the worker holds "x"
        jobs = [
            worker.submit(Job("classify", ["a"])),
            worker.submit(Job("translate", ["b"], options=(1, 5, None, None, None, None))),
            worker.submit(Job("classify", ["c"])),
        ]
        model.gate.set()
        await first.result
        await jobs[0].result
        await jobs[2].result
        with pytest.raises(AttributeError):  # the fake cannot translate: that job alone fails
            await jobs[1].result

    asyncio.run(main())
    assert model.batches == [["x"], ["a"], ["c"]]
    worker.stop()


def test_a_batch_never_passes_max_batch_rows() -> None:
    """Queued jobs of 5 and 4 rows (max_batch 8): the second starts the next batch, as it would
    pass 8 rows beside the first."""
    model = FakeClassifier()
    model.gate.clear()  # hold the worker so that every job queues
    worker = started(model)

    async def main() -> None:
        first = worker.submit(Job("classify", ["x"]))
        await asyncio.sleep(0.05)  # the worker holds "x"
        jobs = [worker.submit(Job("classify", list("abcde"))), worker.submit(Job("classify", list("fghi")))]
        model.gate.set()
        for job in (first, *jobs):
            await job.result

    asyncio.run(main())
    assert model.batches == [["x"], list("abcde"), list("fghi")]
    worker.stop()


def test_a_bad_request_fails_alone_and_its_batch_reruns_without_it() -> None:
    model = FakeClassifier()
    model.gate.clear()
    worker = started(model)

    async def main() -> list[Any]:
        first = worker.submit(Job("classify", ["x"]))
        await asyncio.sleep(0.05)
        jobs = [worker.submit(Job("classify", [text])) for text in ("a", "bad", "b")]
        model.gate.set()
        await first.result
        return await asyncio.gather(*(job.result for job in jobs), return_exceptions=True)

    a, bad, b = asyncio.run(main())
    assert (a, b) == (["A"], ["B"]) and isinstance(bad, InputError)
    assert model.batches[1] == ["a", "bad", "b"] and ["a"] in model.batches and ["b"] in model.batches
    worker.stop()


def test_a_full_queue_refuses_at_once() -> None:
    model = FakeClassifier()
    model.gate.clear()
    worker = started(model, max_queue=2)

    async def main() -> None:
        worker.submit(Job("classify", ["held"]))
        await asyncio.sleep(0.05)
        worker.submit(Job("classify", ["1"]))
        worker.submit(Job("classify", ["2"]))
        with pytest.raises(Overloaded, match="2 requests waiting"):
            worker.submit(Job("classify", ["3"]))
        model.gate.set()

    asyncio.run(main())
    worker.stop()


def test_jobs_outliving_their_event_loop_are_dropped_and_the_worker_goes_on() -> None:
    model = FakeClassifier()
    model.gate.clear()
    worker = started(model, max_queue=3)

    async def main() -> None:  # returns, closing its loop, with every job still unanswered
        for text in ("a", "b", "c"):
            worker.submit(Job("classify", [text]))

    asyncio.run(main())
    model.gate.set()
    deadline = time.monotonic() + 10
    while sum(map(len, model.batches)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(t for batch in model.batches for t in batch) == ["a", "b", "c"]
    assert worker.thread.is_alive()  # answering a closed loop did not end it

    async def again() -> list[str]:
        return await worker.submit(Job("classify", ["d"])).result

    assert asyncio.run(again()) == ["D"]
    worker.stop()
    assert not worker.thread.is_alive()


def test_cancelled_jobs_are_dropped_before_they_run() -> None:
    model = FakeClassifier()
    model.gate.clear()
    worker = started(model)

    async def main() -> None:
        held = worker.submit(Job("classify", ["held"]))
        await asyncio.sleep(0.05)
        gone = worker.submit(Job("classify", ["gone"]))
        gone.cancelled.set()
        model.gate.set()
        await held.result
        assert await gone.result is None

    asyncio.run(main())
    assert ["gone"] not in model.batches
    worker.stop()


@pytest.mark.parametrize(
    "lengths", [[5], [1, 100], [10, 12, 11, 40, 41, 3], list(range(1, 60)), [7] * 20, [128, 1, 1, 1, 1, 128]]
)
def test_length_groups_cover_every_row_once_with_little_padding(lengths: list[int]) -> None:
    groups = length_groups(lengths, waste=1.25, slack=8)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert group == sorted(group)
        longest, real = max(lengths[i] for i in group), sum(lengths[i] for i in group)
        assert len(group) == 1 or longest * len(group) <= 1.25 * real + 8


# ------------------------------------------------------------------- generation


def language_model(bundle: Path) -> LanguageModel:
    model = load(bundle)
    assert isinstance(model, LanguageModel)
    return model


def test_a_long_generation_holds_up_no_other(char_bundle: Path) -> None:
    """Continuous batching: a completion that arrives while a long one runs joins its batch and
    is answered at once, with the tokens it generates alone, and a raw infer call runs between
    two steps; the long one goes on."""
    model = language_model(char_bundle)
    worker = started(model)
    long_prompt, short_prompt = [e.ids for e in model.encode(["ROMEO:", "O"])]

    async def main() -> tuple[list[Any], list[Any]]:
        long = worker.submit(Job("generate", [GenerationRow(long_prompt, 1000, GREEDY)], stream=True))
        await long.events.get()  # its first token: it runs
        short = worker.submit(Job("generate", [GenerationRow(short_prompt, 3, GREEDY)]))
        answer = await short.result
        ids = np.array([short_prompt])
        raw = await worker.submit(
            Job("infer", [{"input_ids": ids, "attention_mask": np.ones_like(ids)}])
        ).result
        np.testing.assert_array_equal(raw["logits"], model.logits(ids))
        assert not long.result.done()
        long.cancelled.set()  # its client goes away: it ends at the next step
        return answer, await long.result

    (short,), (long,) = asyncio.run(main())
    worker.stop()
    assert short == Finished(model.generate_prompts([short_prompt], [3], [GREEDY])[0], "length")
    assert long.reason == "stop" and 0 < len(long.tokens) < 1000


def test_a_format_1_bundle_runs_each_generation_batch_to_its_end() -> None:
    """Its step graph takes no padding: prompts of different lengths batched together run one at
    a time, and none joins a running batch."""
    model = language_model(ROOT / "tests" / "data" / "format1-decoder")
    assert not model.pads
    worker = started(model)
    prompts = [e.ids for e in model.encode(["ROMEO:", "O", "First Citizen:"])]

    async def main() -> list[Any]:
        jobs = [
            worker.submit(Job("generate", [GenerationRow(p, 4 + i, GREEDY)])) for i, p in enumerate(prompts)
        ]
        return await asyncio.gather(*(job.result for job in jobs))

    answers = asyncio.run(main())
    worker.stop()
    assert answers == [
        [Finished(model.generate_prompts([p], [4 + i], [GREEDY])[0], "length")] for i, p in enumerate(prompts)
    ]
