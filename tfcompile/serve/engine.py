"""Dynamic batching: one worker thread per model owns it, takes jobs from a bounded queue, and runs
the jobs waiting for it together as one batch, off the event loop.

A job is a request's share of a batch: some rows (prompts, texts, sources, images) of one kind.
The worker takes the first job, then every job of the same kind already waiting (up to
``max_batch`` rows, waiting at most ``max_wait`` seconds for requests the server has read and not
yet handed over); under load the jobs that arrive while a batch runs form the next one, so
batches grow with the load without waiting.
Generation batches continuously: prompts of different lengths run as one left-padded batch (each
row generates what it would alone), the generation requests that arrive join it between its steps
and rows leave as they end, so that a long completion holds up no other; each step's tokens
stream to the jobs as they come, and a job's rows end when its client goes away. A full queue
refuses new jobs at once (the server answers 503 + Retry-After).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfcompile import search
from tfcompile.runtime import Classifier, ImageClassifier, LanguageModel, Translator
from tfcompile.runtime.session import Bundle

log = logging.getLogger("tfcompile.serve")
POLL_S = 0.0005  # how often a waiting batch looks again at the requests in flight


class Overloaded(Exception):
    """The model's queue is full."""


@dataclass
class GenerationRow:
    """One completion to generate: its prompt's ids, its limit, its sampling, its stop strings."""

    prompt: list[int]
    max_tokens: int
    sampling: search.Sampling
    stop_texts: tuple[str, ...] = ()


@dataclass
class Job:
    kind: str  # generate, classify, translate, classify_images, infer
    rows: list[Any]
    options: tuple = ()  # what jobs batched together must share (translation: beam, max_len, codes, scoring)
    stream: bool = False
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    result: asyncio.Future = field(init=False)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # streamed (row, token), then None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.result = self.loop.create_future()

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        """Hand the outcome to the event loop (the only thread that may touch the future)."""

        def settle() -> None:
            if not self.result.done():
                if error is not None:
                    self.result.set_exception(error)
                else:
                    self.result.set_result(value)
            self.events.put_nowait(None)  # a stream's end, after its last token

        self._on_loop(settle)

    def emit(self, row: int, token: int) -> None:
        self._on_loop(self.events.put_nowait, (row, token))

    def _on_loop(self, call: Callable[..., object], *args: object) -> None:
        """Schedule ``call`` on the request's event loop; once that loop is closed nobody awaits the
        job any more, and the outcome is dropped (the worker goes on with the next)."""
        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self.loop.call_soon_threadsafe(call, *args)


@dataclass(frozen=True)
class Finished:
    """A generated row: its new tokens (the stop token it ended with included) and why it ended."""

    tokens: list[int]
    reason: str  # stop (a stop token or string, or the client gone) or length


class Worker:
    def __init__(
        self,
        name: str,
        model: Bundle,
        max_batch: int,
        max_wait: float,
        max_queue: int,
        observe: Callable[[str, int, int], None] = lambda model, rows, tokens: None,
        arriving: Callable[[], int] = lambda: 0,
    ) -> None:
        self.name = name
        self.model = model
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.observe = observe  # (model, batch rows, tokens generated) after each batch
        self.arriving = arriving  # requests read but not yet handed to a worker: jobs on their way
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.carry: Job | None = None  # a job that could not join the last batch
        self.stopping = False
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"model-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Queue the stop after the jobs waiting, and wait for the thread; a queue that stays full
        only keeps this waiting while the thread is alive to empty it."""
        while self.thread.is_alive():
            try:
                self.jobs.put(None, timeout=0.1)
                break
            except queue.Full:
                continue
        self.thread.join()

    def submit(self, job: Job) -> Job:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise Overloaded(f"model {self.name!r} has {self.jobs.maxsize} requests waiting") from None
        return job

    def waiting(self) -> int:
        """Jobs waiting: the queue's, and the one held back for room in the running batch."""
        return self.jobs.qsize() + (self.carry is not None)

    def _run(self) -> None:
        try:
            self.model.warm_up()  # readiness waits for it
        except Exception:
            log.exception("model %r failed its warm-up call; it stays unready", self.name)
        else:
            self.ready.set()
        while (batch := self._next_batch()) is not None:
            live = [job for job in batch if not job.cancelled.is_set()]
            for job in batch:
                if job.cancelled.is_set():  # its client went away while it waited
                    job.finish(None)
            if not live:
                continue
            if live[0].kind == "generate" and isinstance(self.model, LanguageModel) and self.model.pads:
                self._generate(self.model, live)
            else:
                self._run_batch(live)

    def _generate(self, model: LanguageModel, jobs: list[Job]) -> None:
        """Generation with continuous batching: the jobs' prompts start a running batch; between
        its steps, the generation jobs waiting join it (up to ``max_batch`` rows) and rows leave
        as they end, each job answered when its last row ends."""
        batch = model.batch()
        rows = Rows(model)
        for job in jobs:
            self._join(model, batch, rows, job)
        while batch:
            try:
                stepped = batch.sample()
                batch.end(rows.step(stepped))
                batch.advance()
            except Exception as e:  # every job of the batch fails (a stream cannot take back tokens)
                for failed in rows.jobs():
                    failed.finish(error=e)
                return
            self.observe(self.name, len(stepped), len(stepped))  # counted before its answers go out
            for done, result in rows.collect(batch.finished):
                done.finish(result)
            while (joining := self._joining(len(batch))) is not None:
                self._join(model, batch, rows, joining)

    def _join(self, model: LanguageModel, batch: search.Batch, rows: Rows, job: Job) -> None:
        """A job's prompts join the running batch; a job whose prompts fail to (a bad token) fails
        alone."""
        try:
            keys = model.join(
                batch,
                [row.prompt for row in job.rows],
                [row.max_tokens for row in job.rows],
                [row.sampling for row in job.rows],
            )
        except Exception as e:
            job.finish(error=e)
            return
        rows.add(job, keys)
        for done, result in rows.collect(batch.finished):
            done.finish(result)

    def _joining(self, rows: int) -> Job | None:
        """The next job waiting, if it is a generation that fits beside ``rows`` running rows
        (one that does not waits as the carry, the first of the next batch). Jobs of other kinds
        (a decoder's raw ``infer``) run here, between two steps."""
        while not self.stopping:
            if self.carry is None:
                try:
                    self.carry = self.jobs.get(block=False)
                except queue.Empty:
                    return None
                self.stopping = self.carry is None  # stop() queued None
                continue
            job = self.carry
            if job.kind != "generate":
                self.carry = None
                if not job.cancelled.is_set():
                    self._run_batch([job])
                continue
            if rows + len(job.rows) > self.max_batch:
                return None
            self.carry = None
            if not job.cancelled.is_set():
                return job
            job.finish(None)  # its client went away while it waited
        return None

    def _run_batch(self, jobs: list[Job]) -> None:
        """Runs the jobs as one batch; if it fails, each alone, so that one request's bad input
        (a character outside the vocabulary, an unreadable image) fails that request only."""
        try:
            results = RUNNERS[jobs[0].kind](self.model, jobs)
        except Exception as e:  # raised on the event loop, where the request's handler answers it
            if len(jobs) == 1 or any(job.stream for job in jobs):  # a stream cannot take back tokens
                for job in jobs:
                    job.finish(error=e)
                return
            for job in jobs:
                self._run_batch([job])
        else:
            tokens = sum(
                len(f.tokens)
                for result in results
                if isinstance(result, list)
                for f in result
                if isinstance(f, Finished)
            )
            self.observe(self.name, sum(len(job.rows) for job in jobs), tokens)  # before the answers
            for job, result in zip(jobs, results, strict=True):
                job.finish(result)

    def _next_batch(self) -> list[Job] | None:
        """The next job and every job that may share its batch, up to ``max_batch`` rows (a job
        that would pass them starts the next batch). While
        requests are arriving (read, their jobs not yet handed over), it waits up to ``max_wait``
        for them: under load batches fill, while a lone request never waits, nor does one beside
        a long stream. None: the worker stops."""
        first, self.carry = self.carry, None
        if first is None and not self.stopping:
            first = self.jobs.get()
        if first is None:
            return None
        batch, rows = [first], len(first.rows)
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_batch and first.kind != "infer" and not self.stopping:
            job = self._take(deadline)
            if job is None:
                break
            if (job.kind, job.options) != (first.kind, first.options) or rows + len(
                job.rows
            ) > self.max_batch:
                self.carry = job  # the first of the next batch
                break
            batch.append(job)
            rows += len(job.rows)
        return batch

    def _take(self, deadline: float) -> Job | None:
        """A waiting job; else, while requests are arriving and the deadline allows, the next to
        come; else None."""
        while True:
            try:
                job = self.jobs.get(block=False)
            except queue.Empty:
                left = deadline - time.monotonic()
                if left <= 0 or self.arriving() == 0:
                    return None
                try:
                    job = self.jobs.get(timeout=min(left, POLL_S))
                except queue.Empty:
                    continue
            self.stopping = job is None  # stop() queued None
            return job


# ---------------------------------------------------------------------------- runners


class Rows:
    """Generated rows by key, for the jobs they belong to: each step's tokens go to the jobs that
    stream, and a row ends at a stop string or when its client has gone."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.owners: dict[int, tuple[Job, int, GenerationRow]] = {}  # key -> job, index, row
        self.generated: dict[int, list[int]] = {}
        self.by_text: set[int] = set()  # rows ended by a stop string
        self.answers: dict[int, list[Finished | None]] = {}  # by id(job)
        self.stops = set(model.generation.stop_token_ids)

    def add(self, job: Job, keys: Sequence[int]) -> None:
        self.answers[id(job)] = [None] * len(keys)
        for i, (key, row) in enumerate(zip(keys, job.rows, strict=True)):
            self.owners[key], self.generated[key] = (job, i, row), []

    def jobs(self) -> list[Job]:
        return list({id(job): job for job, _, _ in self.owners.values()}.values())

    def step(self, tokens: dict[int, int]) -> list[int]:
        """A step's new tokens by key -> the keys to end."""
        ended = []
        for key, token in tokens.items():
            job, i, row = self.owners[key]
            self.generated[key].append(token)
            if job.cancelled.is_set():
                ended.append(key)
                continue
            if job.stream:
                job.emit(i, token)
            if (
                row.stop_texts
                and stop_text(self.model, row.prompt, self.generated[key], row.stop_texts) is not None
            ):
                self.by_text.add(key)
                ended.append(key)
        return ended

    def collect(self, finished: dict[int, list[int]]) -> list[tuple[Job, list[Finished]]]:
        """The ended rows' tokens (taken out of ``finished``) -> the jobs all of whose rows have
        ended, with their answers."""
        done = []
        for key in [key for key in finished if key in self.owners]:
            tokens = finished.pop(key)
            job, i, row = self.owners.pop(key)
            del self.generated[key]
            stopped = (
                key in self.by_text
                or bool(tokens and tokens[-1] in self.stops)
                or len(tokens) < row.max_tokens
            )
            self.by_text.discard(key)
            answers = self.answers[id(job)]
            answers[i] = Finished(tokens, "stop" if stopped else "length")
            if all(a is not None for a in answers):
                del self.answers[id(job)]
                done.append((job, [a for a in answers if a is not None]))
        return done


def _generate(model: LanguageModel, jobs: Sequence[Job]) -> list[list[Finished]]:
    """Every job's prompts as one left-padded batch run to its end (format 1 bundles, whose step
    graphs cannot take prompts in between steps): see Rows."""
    rows = Rows(model)
    keys = iter(range(sum(len(job.rows) for job in jobs)))
    for job in jobs:
        rows.add(job, [next(keys) for _ in job.rows])
    prompts = [row for job in jobs for row in job.rows]
    new = model.generate_prompts(
        [row.prompt for row in prompts],
        [row.max_tokens for row in prompts],
        [row.sampling for row in prompts],
        on_step=rows.step,
    )
    answered = {id(job): answer for job, answer in rows.collect(dict(enumerate(new)))}
    return [answered[id(job)] for job in jobs]


CONTEXT_TOKENS = 8  # the prompt's last tokens that generated ones are decoded after
MAX_CONTEXT_TOKENS = 64  # more where those begin inside a character or decode to nothing


def text_of(model: LanguageModel, prompt: Sequence[int], tokens: Sequence[int]) -> str:
    """Generated tokens as text, the stop token that ended them left out, as they read after the
    prompt: decoded after its last CONTEXT_TOKENS tokens and cut from what those decode to alone.
    Decoded on their own, a SentencePiece decoder (LLaMA's Strip, a Metaspace that prepends) would
    drop the leading space of a continuation that starts a word. Where those tokens begin inside a
    character (byte-fallback tokens: U+FFFD), or are all special (decoded to nothing), the context
    reaches further back, up to MAX_CONTEXT_TOKENS."""
    new = search.strip_stop(list(tokens), tuple(model.generation.stop_token_ids))
    longest = min(len(prompt), MAX_CONTEXT_TOKENS)
    for k in range(min(len(prompt), CONTEXT_TOKENS), longest + 1):
        context = list(prompt[len(prompt) - k :])
        before, after = model.decode_ids([context, context + new])
        if before and not before.startswith("\ufffd"):
            break
    # The prompt ends inside a character the new tokens finish: its bytes, each a U+FFFD alone (a
    # byte-fallback decoder garbles the whole run of byte tokens they end), are cut from the
    # context, and the character is the new text's. A UTF-8 character is at most 4 bytes.
    for cut in range(1, min(3, len(context)) + 1):
        if not before.endswith("\ufffd") or after.startswith(before):
            break
        before = model.decode_ids([context[: len(context) - cut]])[0]
    shared = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), len(before))
    return after[shared:]


def stop_text(
    model: LanguageModel, prompt: Sequence[int], tokens: Sequence[int], stops: Sequence[str]
) -> int | None:
    """Where the first stop string begins in the text of the tokens generated after ``prompt``, or
    None."""
    return first_stop(text_of(model, prompt, tokens), stops)


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first of ``stops`` begins in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _split(jobs: Sequence[Job], results: Sequence[Any]) -> list[list[Any]]:
    """A batch's results, back to the jobs by their row counts."""
    out, start = [], 0
    for job in jobs:
        out.append(list(results[start : start + len(job.rows)]))
        start += len(job.rows)
    return out


def _classify(model: Classifier, jobs: Sequence[Job]) -> list[list[Any]]:
    return _split(jobs, model.classify([row for job in jobs for row in job.rows]))


def _classify_images(model: ImageClassifier, jobs: Sequence[Job]) -> list[list[Any]]:
    return _split(jobs, model.classify_images([row for job in jobs for row in job.rows]))


def _translate(model: Translator, jobs: Sequence[Job]) -> list[list[Any]]:
    beam, max_len, source_language, target_language, length_penalty, early_stopping = jobs[0].options
    rows = [row for job in jobs for row in job.rows]
    return _split(
        jobs,
        model.translate(
            rows, beam, length_penalty, max_len, source_language, target_language, early_stopping
        ),
    )


def _infer(model: Bundle, jobs: Sequence[Job]) -> list[Any]:
    return [model.infer(jobs[0].rows[0])]


RUNNERS: dict[str, Callable[[Any, Sequence[Job]], list[Any]]] = {
    "generate": _generate,
    "classify": _classify,
    "classify_images": _classify_images,
    "translate": _translate,
    "infer": _infer,
}
