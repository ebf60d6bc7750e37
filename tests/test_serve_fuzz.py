"""The server under random mixes of concurrent requests: completions (text or token-id prompts,
lengths up to past the context, greedy or seeded sampling with top-k and top-p, n, stop strings,
echo, whole or streamed, some streams and requests abandoned midway), classifications (texts and
pairs) and invalid requests, each after a random delay, against servers with small batches (so
that prompts join running batches and wait as the carry). Every answer must equal what
tfcompile.runtime gives for the same request alone (each row alone, with its seed), every refusal
be the documented 4xx, nothing hang, and the server come back to empty: no job queued or carried,
no request arriving, the queue depth metric 0, and no row left in the running batch."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import ROOT
from serving import BackgroundServer

from tfcompile.runtime import Classifier, LanguageModel, load
from tfcompile.search import Sampling
from tfcompile.serve import Settings

FORMAT_1 = ROOT / "tests" / "data" / "format1-decoder"
PHRASES = ["a gorgeous , witty movie", "dull", "the plot is thin", "acting wooden", "naïve café 猫", "a"]
STOP_CHARS = " e\nt,o"  # frequent in the char decoder's output, so that stop strings end some choices


@dataclass
class Case:
    """One request: its route and body, when it is sent, whether it is streamed, and where its
    client goes away (after so many stream chunks, or at a read timeout); ``status`` when it must
    be refused."""

    route: str
    body: dict
    delay: float
    stream: bool = False
    drop_after: int | None = None  # stream chunks read before the client closes the connection
    timeout: float | None = None  # a whole request's client gives up after this
    status: int = 200


@dataclass
class Outcome:
    """What a request's client received."""

    status: int | None = None  # None: the client went away
    body: Any = None
    chunks: list[dict] = field(default_factory=list)
    done: bool = False  # a stream's [DONE]


@dataclass(frozen=True)
class Models:
    """The bundles the server serves, and the runtime's own copies of them."""

    bundles: dict[str, Path]
    lms: dict[str, LanguageModel]
    clf: Classifier


@pytest.fixture(scope="module")
def models(char_bundle: Path, classifier_bundle: Path) -> Models:
    """The char decoder, the classifier, and a format 1 decoder (context 16), whose batches run
    to their end."""
    bundles = {"char": char_bundle, "old": FORMAT_1, "sst2": classifier_bundle}
    loaded = {name: load(path) for name, path in bundles.items()}
    lms = {name: m for name, m in loaded.items() if isinstance(m, LanguageModel)}
    assert isinstance(loaded["sst2"], Classifier) and sorted(lms) == ["char", "old"]
    return Models(bundles, lms, loaded["sst2"])


# ------------------------------------------------------------------------- random requests


def random_cases(rng: random.Random, models: Models, count: int, max_batch: int) -> list[Case]:
    cases = []
    for _ in range(count):
        delay = rng.choice([0.0, 0.0, rng.uniform(0, 0.05), rng.uniform(0, 0.3)])
        kind = rng.random()
        if kind < 0.6:
            cases.append(_completion(rng, models, max_batch, delay))
        elif kind < 0.85:
            cases.append(_classification(rng, max_batch, delay))
        else:
            route, body, status = rng.choice(INVALID)
            cases.append(Case(route, body, delay, status=status))
    return cases


def _completion(rng: random.Random, models: Models, max_batch: int, delay: float) -> Case:
    name = rng.choice(["char", "char", "char", "old"])
    lm = models.lms[name]
    chars = sorted(lm.tokenizer.get_vocab()) if lm.tokenizer else []
    context = lm.max_seq_len

    def length() -> int:
        return rng.choice([1, 2, rng.randint(1, 20), rng.randint(1, context), context, context + 3])

    prompts = ["".join(rng.choice(chars) for _ in range(length())) for _ in range(rng.choice([1, 1, 2]))]
    n = rng.choice([1, 1, 1, 2, 3])
    body: dict[str, Any] = {"model": name, "max_tokens": rng.choice([1, 2, rng.randint(1, 30), 60])}
    if rng.random() < 0.15:  # token ids
        ids = [[rng.randrange(lm.vocab_size) for _ in p] for p in prompts]
        body["prompt"] = ids[0] if len(ids) == 1 else ids
    else:
        body["prompt"] = prompts[0] if len(prompts) == 1 and rng.random() < 0.7 else prompts
    if n > 1 or rng.random() < 0.2:
        body["n"] = n
    if rng.random() < 0.4:
        body["temperature"] = rng.choice([0, 0.0, 1e-6])
    else:
        body["temperature"] = round(rng.uniform(0.3, 1.6), 2)
        body["seed"] = rng.randrange(1000)
        if rng.random() < 0.5:
            body["top_k"] = rng.choice([1, 2, 5, 30, 100])
        if rng.random() < 0.5:
            body["top_p"] = rng.choice([0.3, 0.8, 0.95, 1.0])
    if rng.random() < 0.35:
        stops = ["".join(rng.choices(STOP_CHARS, k=rng.randint(1, 2))) for _ in range(rng.randint(1, 2))]
        body["stop"] = stops[0] if len(stops) == 1 and rng.random() < 0.5 else stops
    if rng.random() < 0.3:
        body["echo"] = True
    case = Case("/v1/completions", body, delay, stream=rng.random() < 0.5)
    if case.stream:
        body["stream"] = True
        if rng.random() < 0.3:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.25:
            case.drop_after = rng.randint(1, 4)
    elif rng.random() < 0.1:
        case.timeout = rng.uniform(0.001, 0.05)
    if len(prompts) * n > max_batch or max(map(len, prompts)) > context:
        case.status, case.drop_after, case.timeout = 400, None, None
    return case


def _classification(rng: random.Random, max_batch: int, delay: float) -> Case:
    def text() -> str:
        return " ".join(rng.choices(PHRASES, k=rng.randint(1, 6)))

    texts: list[Any] = [[text(), text()] if rng.random() < 0.3 else text() for _ in range(rng.randint(1, 3))]
    body = {"model": "sst2", "texts": texts[0] if len(texts) == 1 and isinstance(texts[0], str) else texts}
    return Case("/v1/classify", body, delay, status=200 if len(texts) <= max_batch else 400)


INVALID: list[tuple[str, dict, int]] = [
    ("/v1/completions", {"model": "nope", "prompt": "a"}, 404),
    ("/v1/completions", {"model": "sst2", "prompt": "a"}, 400),
    ("/v1/completions", {"model": "char", "prompt": "a", "max_tokens": 0}, 400),
    ("/v1/completions", {"model": "char", "prompt": "a", "temperature": -1}, 400),
    ("/v1/completions", {"model": "char", "prompt": "a", "logprobs": 2}, 400),
    ("/v1/completions", {"model": "char", "prompt": "a", "stream": "yes"}, 400),
    ("/v1/completions", {"model": "char", "prompt": "¿qué?", "stream": True}, 400),
    ("/v1/completions", {"model": "char", "prompt": [5, 10_000]}, 400),
    ("/v1/completions", {"model": "char", "prompt": []}, 400),
    ("/v1/completions", {"model": "char", "prompt": "a", "stop": [""]}, 400),
    ("/v1/completions", {"model": "char", "prompt": "a", "n": 10_000}, 400),
    ("/v1/classify", {"model": "char", "texts": ["a"]}, 400),
    ("/v1/classify", {"model": "sst2", "texts": []}, 400),
    ("/v1/classify", {"model": "sst2", "texts": [["a", "b", "c"]]}, 400),
]


# -------------------------------------------------------------------- sending them at once


async def send(http: httpx.AsyncClient, case: Case) -> Outcome:
    await asyncio.sleep(case.delay)
    if not case.stream:
        try:
            r = await http.post(case.route, json=case.body, timeout=case.timeout or 60)
        except httpx.TimeoutException:
            assert case.timeout is not None
            return Outcome()
        return Outcome(r.status_code, r.json())
    out = Outcome()
    async with http.stream("POST", case.route, json=case.body, timeout=60) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.body = json.loads(await r.aread())
            return out
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                out.done = True
                continue
            out.chunks.append(json.loads(line[len("data: ") :]))
            if case.drop_after is not None and len(out.chunks) >= case.drop_after:
                return out  # leaving the block closes the connection midway
    return out


async def fire(url: str, cases: list[Case]) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=url) as http:
        return await asyncio.wait_for(asyncio.gather(*(send(http, c) for c in cases)), 120)


# ---------------------------------------------------------------- what each request gets alone


class Expected:
    """The runtime's answers, row by row alone, memoised."""

    def __init__(self, models: Models) -> None:
        self.models = models
        self.rows: dict[tuple, list[int]] = {}

    def row(self, model: str, ids: list[int], max_tokens: int, sampling: Sampling) -> list[int]:
        key = (model, tuple(ids), max_tokens, sampling)
        if key not in self.rows:
            self.rows[key] = self.models.lms[model].generate_prompts([ids], [max_tokens], [sampling])[0]
        return self.rows[key]

    def completion(self, body: dict) -> tuple[list[tuple[str, str]], dict]:
        """Each choice's (text, finish_reason), and the usage."""
        lm = self.models.lms[body["model"]]
        prompt = body["prompt"]
        prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
        ids = [p if isinstance(p, list) else lm.encode([p])[0].ids for p in prompts]
        n = body.get("n", 1)
        rows = [p for p in ids for _ in range(n)]
        samplings = lm.sampling(
            len(rows), body.get("temperature"), body.get("top_k"), body.get("top_p"), body.get("seed")
        )
        max_tokens = lm.max_new_tokens(body.get("max_tokens"))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        choices, generated = [], 0
        for p, sampling in zip(rows, samplings, strict=True):
            tokens = self.row(body["model"], p, max_tokens, sampling)
            reason = "stop" if len(tokens) < max_tokens else "length"
            text = lm.decode([tokens])[0]
            for end in range(1, len(tokens) + 1):  # the first token whose text holds a stop string
                cut = [i for i in (lm.decode([tokens[:end]])[0].find(s) for s in stops) if i >= 0]
                if cut:
                    tokens, text, reason = tokens[:end], lm.decode([tokens[:end]])[0][: min(cut)], "stop"
                    break
            echo = lm.decode([p])[0] if body.get("echo") else ""
            choices.append((echo + text, reason))
            generated += len(tokens)
        used = sum(map(len, ids))
        return choices, {
            "prompt_tokens": used,
            "completion_tokens": generated,
            "total_tokens": used + generated,
        }

    def classification(self, texts: Any) -> list[Any]:
        items = [texts] if isinstance(texts, str) else texts
        return [self.models.clf.classify([t if isinstance(t, str) else tuple(t)])[0] for t in items]


def check(expected: Expected, case: Case, out: Outcome) -> None:
    """The outcome is the request's answer alone (a stream's chunks add up to it; those that came
    before its client left, to the start of it), or its refusal."""
    where = json.dumps(case.body)
    if out.status is None:  # the client went away
        return
    if case.status != 200:
        assert out.status == case.status, (where, out.status, out.body)
        assert set(out.body["error"]) == {"message", "type", "param", "code"}, where
        return
    assert out.status == 200, (where, out.body)
    if case.route == "/v1/classify":
        want = expected.classification(case.body["texts"])
        got = out.body["predictions"]
        assert [p["label"] for p in got] == [w.label for w in want], where
        for g, w in zip(got, want, strict=True):
            assert g["probabilities"] == pytest.approx(w.probabilities, abs=1e-5), where
        return
    choices, usage = expected.completion(case.body)
    if not case.stream:
        got = [(c["text"], c["finish_reason"]) for c in out.body["choices"]]
        assert [c["index"] for c in out.body["choices"]] == list(range(len(choices))), where
        assert got == choices, where
        assert out.body["usage"] == usage, where
        return
    texts, reasons = [""] * len(choices), [None] * len(choices)
    usage_chunks = []
    for chunk in out.chunks:
        assert "error" not in chunk, (where, chunk)
        if not chunk["choices"]:
            usage_chunks.append(chunk["usage"])
            continue
        (choice,) = chunk["choices"]
        i = choice["index"]
        assert reasons[i] is None, (where, "a chunk after the choice's end")
        texts[i] += choice["text"]
        reasons[i] = choice["finish_reason"]
    if case.drop_after is not None and not out.done:  # what came before the client left is a prefix
        for text, (want, _) in zip(texts, choices, strict=True):
            assert want.startswith(text), (where, text, want)
        return
    assert out.done, where
    assert list(zip(texts, reasons, strict=True)) == choices, where
    include_usage = case.body.get("stream_options", {}).get("include_usage", False)
    assert usage_chunks == ([usage] if include_usage else []), where


# --------------------------------------------------------------------------- the server after


def metric(server: BackgroundServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def settle(server: BackgroundServer, seconds: float = 10) -> None:
    """Waits until the server is idle: nothing queued, carried or arriving, and no token generated
    for a while (the rows of clients that went away end at their next step)."""
    workers = server.served.workers.values()
    deadline = time.monotonic() + seconds
    tokens = -1.0
    while True:
        idle = not any(server.served.arriving.values()) and all(w.waiting() == 0 for w in workers)
        now = metric(server, "tfcompile_generated_tokens_total")
        if idle and now == tokens:
            return
        tokens = now
        assert time.monotonic() < deadline, "the server did not come back to idle"
        time.sleep(0.1)


def assert_empty(server: BackgroundServer) -> None:
    """No request queued (the metric too), and no row left running: a lone greedy completion of
    5 tokens runs 5 steps of 1 row."""
    settle(server)
    for model in server.served.models:
        assert metric(server, f'tfcompile_queue_depth{{model="{model}"}}') == 0, model
    rows = server.served.batches.labels("char")
    steps, total = sum(b.get() for b in rows._buckets), rows._sum.get()
    body = {"model": "char", "prompt": "ROMEO:", "max_tokens": 5, "temperature": 0}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 200
    assert (sum(b.get() for b in rows._buckets) - steps, rows._sum.get() - total) == (5, 5)


def run_rounds(models: Models, settings: Settings, seeds: list[int], count: int) -> None:
    """One server; per seed, ``count`` random requests at once, each checked, then the server
    checked empty."""
    expected = Expected(models)
    with BackgroundServer(models.bundles, settings) as server:
        for seed in seeds:
            cases = random_cases(random.Random(seed), models, count, settings.max_batch)
            outcomes = asyncio.run(fire(server.url, cases))
            for case, out in zip(cases, outcomes, strict=True):
                check(expected, case, out)
            assert_empty(server)


SETTINGS = [
    Settings(max_batch=2, max_wait_ms=0),
    Settings(max_batch=3, max_wait_ms=5),
    Settings(max_batch=4, max_wait_ms=0),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"batch{s.max_batch}-wait{s.max_wait_ms:g}")
def test_random_mixes_get_the_answers_they_get_alone(models: Models, settings: Settings) -> None:
    run_rounds(models, settings, [settings.max_batch * 100 + i for i in range(2)], 14)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [*SETTINGS, Settings(max_batch=8, max_wait_ms=5), Settings(max_batch=1, max_wait_ms=0)],
    ids=lambda s: f"batch{s.max_batch}-wait{s.max_wait_ms:g}",
)
def test_many_random_mixes(models: Models, settings: Settings) -> None:
    run_rounds(models, settings, [10_000 + settings.max_batch * 1000 + i for i in range(20)], 24)


def test_the_queue_depth_metric_is_0_once_waiting_jobs_are_dropped(models: Models) -> None:
    """Two completions wait behind a format 1 generation (which runs to its end) and their clients
    go away: the worker drops them unrun, after the last batch it observed. The metric had kept
    the depth that batch saw (2)."""
    long = {"model": "old", "prompt": "ROMEO:", "max_tokens": 100_000, "temperature": 0, "stream": True}
    with BackgroundServer({"old": FORMAT_1}, Settings(max_batch=1, max_tokens=100_000)) as server:
        worker = server.served.workers["old"]
        with httpx.stream("POST", f"{server.url}/v1/completions", json=long, timeout=30) as running:
            lines = running.iter_lines()  # kept: a dropped line iterator closes the stream
            next(lines)
            for _ in range(2):
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(f"{server.url}/v1/completions", json={**long, "stream": False}, timeout=0.3)
            deadline = time.monotonic() + 10
            while worker.jobs.qsize() < 2:  # both handed over, then given up on
                assert time.monotonic() < deadline
                time.sleep(0.01)
        settle(server)
        assert metric(server, 'tfcompile_queue_depth{model="old"}') == 0
