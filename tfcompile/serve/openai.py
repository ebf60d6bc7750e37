"""OpenAI-compatible completions for decoder bundles: ``GET /v1/models`` and
``POST /v1/completions`` (the legacy completions API that the ``openai`` package's
``client.completions.create`` calls), streamed as server-sent events or answered whole.

Sampling options left out (or null) take the bundle manifest's generation defaults, ``max_tokens``
too (at most the server's limit). ``top_k`` is accepted beside OpenAI's fields
(``extra_body={"top_k": 40}``). Row ``i`` of a request (choice ``i``: prompt ``i // n``, sample
``i % n``) draws with ``seed + i``, as row ``i`` of ``LanguageModel.generate_text`` does, so a seeded
request gives the runtime's tokens. Fields this server cannot honour (logprobs, best_of, penalties,
logit_bias, suffix) are refused with 400 rather than ignored, and JSON values of another type are
never coerced ("1" is not a temperature, nor true a stream flag). A temperature below 1e-5 decodes
greedily, as vLLM's does: logits divided by it overflow. The prompts are counted and their lengths
bounded before any is tokenized, off the event loop."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BeforeValidator, ConfigDict, Field

from tfcompile.errors import InputError
from tfcompile.manifest import MAX_NEW_TOKENS, REPETITION_PENALTIES
from tfcompile.runtime import LanguageModel
from tfcompile.serve.app import FieldError, RequestBody, Served, Settings, error_body, log, outcome
from tfcompile.serve.engine import Finished, GenerationRow, Job, first_stop, text_of

router = APIRouter(prefix="/v1")

PROMPT_KINDS = "a string, a list of strings, a list of token ids or a list of lists of token ids"
STOPS = "a string or a list of at most 4 strings, none empty"


def _no_flag(value: Any) -> Any:
    """true and false are not the numbers 1 and 0 (a strict Literal of a number takes them)."""
    if isinstance(value, bool):
        raise ValueError(f"takes a number, not {str(value).lower()}")
    return value


NoFlag = BeforeValidator(_no_flag)


def _empty(value: Any) -> Any:
    """An empty mapping, checked before its entries are (a million of them were each validated)."""
    if isinstance(value, dict) and value:
        raise ValueError("logit biases are not served: send {} or leave the field out")
    return value


class StreamOptions(RequestBody):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class CompletionRequest(RequestBody):
    """The fields of OpenAI's completions request that this server honours, and those it refuses
    unless they ask for nothing (so that a client is never silently given less than it asked)."""

    model_config = ConfigDict(strict=True)  # strict: true is not 1, nor "1" 1.0

    model: str
    prompt: Any = Field(description=PROMPT_KINDS)  # checked by _given_prompts, counted first
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    min_p: float | None = Field(
        None,
        ge=0,
        le=1,
        description="vLLM's (not OpenAI's): after top_k and top_p, sample among the tokens at least min_p "
        "times as probable as the likeliest; default: the bundle's",
    )
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Any = Field(None, description=STOPS)  # checked by _stops
    seed: int | None = Field(None, ge=0)
    echo: bool | None = False
    user: str | None = None
    logprobs: Annotated[Literal[0] | None, NoFlag] = Field(
        None, description="log probabilities are not served"
    )
    best_of: Annotated[Literal[1] | None, NoFlag] = None
    repetition_penalty: float | None = Field(
        None,
        ge=REPETITION_PENALTIES[0],
        le=REPETITION_PENALTIES[1],
        description="vLLM's and transformers' (not OpenAI's): the logit of a token the text holds already "
        "divided by it where positive, multiplied where negative; default: the bundle's",
    )
    min_tokens: int | None = Field(
        None,
        ge=0,
        le=MAX_NEW_TOKENS,
        description="vLLM's (not OpenAI's): no stop token ends a text before it has this many tokens "
        "(a stop string may); default: the bundle's min_new_tokens",
    )
    presence_penalty: Annotated[Literal[0] | None, NoFlag] = None
    frequency_penalty: Annotated[Literal[0] | None, NoFlag] = None
    logit_bias: Annotated[dict[str, float], BeforeValidator(_empty)] | None = None
    suffix: Literal[""] | None = None


def served(request: Request) -> Served:
    return request.app.state.served


@router.get("/models")
async def models(request: Request) -> dict:
    return {"object": "list", "data": [_model_card(name) for name in served(request).models]}


@router.get("/models/{name}")
async def model(name: str, request: Request) -> dict:
    served(request).worker(name)  # 404 when unknown
    return _model_card(name)


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tfcompile"}


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> dict | StreamingResponse:
    s = served(request)
    model = s.worker(body.model, request).model
    if not isinstance(model, LanguageModel) or model.tokenizer is None:
        raise InputError(
            f"the model {body.model!r} is not a language model with a tokenizer: completions need one"
        )
    limit = s.settings.max_prompt_tokens or model.max_seq_len
    n = body.n or 1
    given = _given_prompts(body.prompt, n, limit, s.settings)
    max_tokens = model.max_new_tokens(body.max_tokens)
    if body.max_tokens is None:  # the manifest's default, within the server's limit
        max_tokens = min(max_tokens, s.settings.max_tokens)
    if max_tokens > s.settings.max_tokens:
        raise FieldError("max_tokens", f"max_tokens may be at most {s.settings.max_tokens}, got {max_tokens}")
    stops = _stops(body.stop)
    prompts = await _prompts(model, given, limit)
    samplings = model.sampling(
        len(prompts) * n,
        body.temperature,
        body.top_k,
        body.top_p,
        body.seed,
        body.repetition_penalty,
        body.min_tokens,
        body.min_p,
    )
    rows = [
        GenerationRow(prompt, max_tokens, sampling, stops)
        for prompt, sampling in zip([p for p in prompts for _ in range(n)], samplings, strict=True)
    ]
    job = s.submit(request, body.model, Job("generate", rows, stream=bool(body.stream)))
    answer = Answer(body, model, rows, echo=bool(body.echo))
    if body.stream:
        return EventStream(_stream(answer, job), job)
    return answer.whole(await outcome(job, request, watch=True))


def _stops(stop: Any) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise FieldError("stop", f"stop must be {STOPS}")
    return tuple(stops)


def _given_prompts(prompt: Any, n: int, limit: int, settings: Settings) -> list[Any]:
    """The request's prompts as given (strings, or lists of token ids), counted with their ``n``
    choices each and a prompt of ids held to ``limit`` tokens before any element is looked at."""
    if not isinstance(prompt, str | list):
        raise FieldError("prompt", f"prompt must be {PROMPT_KINDS}")
    prompts = [prompt] if isinstance(prompt, str) or (prompt and _is_id(prompt[0])) else prompt
    if not prompts:
        raise FieldError("prompt", "prompt must not be empty")
    if n > settings.max_n or len(prompts) * n > settings.max_batch:
        raise FieldError(
            "n" if n > 1 else "prompt",
            f"a request may ask for at most {settings.max_n} completions per prompt and "
            f"{settings.max_batch} in all, got {len(prompts)} prompts x n={n}",
        )
    for name, p in zip(_names(prompts), prompts, strict=True):
        if isinstance(p, list) and len(p) > limit:
            raise FieldError("prompt", f"{name} has {len(p)} tokens, more than the {limit} this server takes")
    if all(isinstance(p, str) for p in prompts) or all(
        isinstance(p, list) and all(_is_id(t) for t in p) for p in prompts
    ):
        return prompts
    raise FieldError("prompt", f"prompt must be {PROMPT_KINDS}")


def _names(prompts: Sequence[Any]) -> list[str]:
    return ["prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _prompts(model: LanguageModel, given: list[Any], limit: int) -> list[list[int]]:
    """The prompts as token ids, each 1 to ``limit`` tokens of the vocabulary. Texts are
    tokenized off the event loop, and only those that may fit: ``limit`` tokens stand for at most
    ``limit`` times the longest token's characters."""
    texts = [p for p in given if isinstance(p, str)]
    names = _names(given)
    if texts:
        most = limit * _longest_token(model)
        for name, text in zip(names, texts, strict=True):
            if len(text) > most:
                raise FieldError(
                    "prompt",
                    f"{name} has {len(text):,} characters, more than the {most:,} that {limit} tokens "
                    f"of this model's vocabulary can hold",
                )
        try:
            rows = [e.ids for e in await asyncio.to_thread(model.encode, texts)]
        except InputError as e:  # characters outside the vocabulary
            raise FieldError("prompt", str(e)) from None
    else:
        rows = [p for p in given if isinstance(p, list)]
    for name, row in zip(names, rows, strict=True):
        if not row:
            raise FieldError(
                "prompt",
                f"{name} encodes to no tokens (the tokenizer keeps none of its characters: whitespace "
                f"alone, for some): give a text that holds a token",
            )
        if len(row) > limit:
            raise FieldError(
                "prompt", f"{name} has {len(row)} tokens, more than the {limit} this server takes"
            )
        if min(row) < 0 or max(row) >= model.vocab_size:
            raise FieldError(
                "prompt", f"{name} holds token ids outside the vocabulary [0, {model.vocab_size})"
            )
    return rows


@functools.lru_cache(maxsize=64)
def _longest_token(model: LanguageModel) -> int:
    """The most characters one token of the model's vocabulary stands for: a token's text (a
    byte-level token's, one character a byte) is at least as long as the text it encodes."""
    assert model.tokenizer is not None
    return max(map(len, model.tokenizer.get_vocab(with_added_tokens=True)), default=1)


class Answer:
    """A request's choices as OpenAI's completion objects, whole or as stream chunks."""

    def __init__(
        self, body: CompletionRequest, model: LanguageModel, rows: Sequence[GenerationRow], echo: bool
    ) -> None:
        self.model, self.rows, self.echo = model, rows, echo
        self.name, self.n = body.model, body.n or 1  # rows: each prompt's n choices in turn
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def head(self, choices: list[dict], **extra: Any) -> dict:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.name,
            "system_fingerprint": None,
            "choices": choices,
            **extra,
        }

    def prefix(self, i: int) -> str:
        return self.model.decode([self.rows[i].prompt])[0] if self.echo else ""

    def text(self, i: int, tokens: Sequence[int]) -> tuple[str, bool]:
        """Choice ``i``'s text: the tokens' text (decoded once), cut where a stop string begins,
        and whether one did."""
        text = text_of(self.model, self.rows[i].prompt, tokens)
        cut = first_stop(text, self.rows[i].stop_texts)
        return (text, False) if cut is None else (text[:cut], True)

    def usage(self, finished: Sequence[Finished]) -> dict:
        """Token counts as OpenAI gives them: each prompt once, however many choices it has."""
        prompt = sum(len(row.prompt) for row in self.rows[:: self.n])
        completion = sum(len(f.tokens) for f in finished)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self, finished: Sequence[Finished]) -> dict:
        choices = [
            {
                "text": self.prefix(i) + self.text(i, f.tokens)[0],
                "index": i,
                "logprobs": None,
                "finish_reason": f.reason,
            }
            for i, f in enumerate(finished)
        ]
        return self.head(choices, usage=self.usage(finished))

    def chunk(self, i: int, text: str, reason: str | None) -> str:
        extra = {"usage": None} if self.include_usage else {}
        choice = {"text": text, "index": i, "logprobs": None, "finish_reason": reason}
        return _event(self.head([choice], **extra))


async def _stream(answer: Answer, job: Job) -> AsyncIterator[str]:
    """Each choice's new text as it is generated. Text that could still turn out to start a stop
    string, or that ends inside a character, waits until the next token decides it."""
    tokens: list[list[int]] = [[] for _ in answer.rows]
    sent = [0] * len(answer.rows)  # characters of each choice's text already sent
    done = [False] * len(answer.rows)
    for i in range(len(answer.rows)):
        if answer.echo:
            yield answer.chunk(i, answer.prefix(i), None)
    while (event := await job.events.get()) is not None:
        i, token = event
        if done[i]:
            continue
        tokens[i].append(token)
        row = answer.rows[i]
        text, stopped = answer.text(i, tokens[i])  # cut where a stop string begins
        if stopped:
            ready, done[i] = len(text), True
        else:
            hold = max((len(stop) - 1 for stop in row.stop_texts), default=0)
            # A character whose bytes are still coming decodes as one U+FFFD (byte-level BPE) or
            # one for each byte (a byte-fallback decoder): each waits for the next token.
            ready = min(len(text) - hold, len(text.rstrip("\ufffd")))
        if ready > sent[i]:
            yield answer.chunk(i, text[sent[i] : ready], None)
            sent[i] = ready
            await asyncio.sleep(0)  # a disconnect's cancellation lands here, however long the backlog
    try:
        finished: list[Finished] = await job.result
    except Exception as e:  # after the 200 went out: OpenAI's in-stream error, which its client raises
        if not isinstance(e, InputError):
            log.exception("generation failed in a stream")
        yield _event(error_body("/v1", 500, _message(e), "generation_failed"))
        return
    for i, f in enumerate(finished):
        text, _ = answer.text(i, f.tokens)
        yield answer.chunk(i, text[sent[i] :], f.reason)
    if answer.include_usage:
        yield _event(answer.head([], usage=answer.usage(finished)))
    yield "data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """A completion's server-sent events; its job is cancelled however the response ends (the
    stream over, or the client gone), so that its rows stop generating. The generator's own
    ``finally`` would run only once it had started: a client gone before the first chunk left
    its rows generating to max_tokens."""

    def __init__(self, events: AsyncIterator[str], job: Job) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancelled.set()


def _message(e: Exception) -> str:
    return str(e) if isinstance(e, InputError) else "generation failed: the server's log has the details"


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
