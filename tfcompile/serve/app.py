"""The HTTP server over the runtime: one FastAPI app serving several bundles by name.

Routes: OpenAI-compatible completions (openai.py), the Open Inference Protocol (kserve.py), plain
JSON task routes (tasks.py), and here health, readiness and Prometheus metrics. Around them, pure
ASGI layers (FastAPI's http middleware would hide client disconnects): HTTP's own rules (HEAD,
Host, 100-continue), a body guard that answers in JSON, API-key authentication, a gate that
refuses new work while the server drains on SIGTERM, and request metrics. Errors are JSON
(OpenAI's shape under /v1, KServe's under /v2); no traceback ever reaches a client.
"""

from __future__ import annotations

import asyncio
import email.message
import functools
import hmac
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, model_validator
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from tfcompile.errors import InputError
from tfcompile.manifest import MAX_BEAM
from tfcompile.runtime.session import Bundle
from tfcompile.serve.engine import Job, Overloaded, Worker

log = logging.getLogger("tfcompile.serve")

Scope = dict[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
PUBLIC = frozenset({"/health", "/v2/health/live", "/v2/health/ready", "/metrics"})  # no API key needed
CHARS_PER_TOKEN = 32  # a text's characters a token of its model's context (a token holds 4 or so)
ARRIVING = "tfcompile.arrival"  # a POST request's Arrival, in its ASGI scope
REFUSED = "tfcompile.refused"  # in its scope: the status the protocol answered a request with
CLIENT_CLOSED = 499  # the status of a request whose client left before its answer (nginx's)


@dataclass(frozen=True)
class Settings:
    api_key: str | None = None
    max_batch: int = 32  # rows (prompts, texts, images) in one batch
    max_wait_ms: float = 5.0  # how long a batch may wait for requests in flight (a lone one never waits)
    max_queue: int = 256  # requests waiting per model; more are refused with 503
    max_body_bytes: int = 16 << 20
    max_tokens: int = 1024  # per completion
    max_prompt_tokens: int | None = None  # default: the model's context
    max_n: int = 16  # completions per prompt
    max_beam: int = 8  # translation beam width
    max_image_pixels: int = 1 << 26  # in all the uploaded images of a request (as in the largest one)
    retry_after_s: int = 1
    max_head_bytes: int = 64 << 10  # a request's line and headers
    # from a request's first byte (or its connection) to its headers' end; and a body's longest pause
    head_timeout_s: float = 20.0
    # an idle connection's wait for its next request; behind a load balancer, set it above the
    # balancer's idle timeout, or the balancer may send a request down a connection as it closes
    keep_alive_s: int = 5

    def __post_init__(self) -> None:
        """Each limit a number in its range, refused by name: a limit of 0 refuses every request,
        and one past its ceiling bounds nothing (``tfcompile serve``'s flags take the same ranges)."""
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if value is None and name == "max_prompt_tokens":  # the model's context
                continue
            kinds = (int, float) if name in FRACTIONAL else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
                kind = "a number" if name in FRACTIONAL else "an integer"
                span = f"at least {low:,}" if high == math.inf else f"from {low:,} to {high:,}"
                raise ValueError(f"Settings.{name} must be {kind} {span}, got {value!r}")


# Each limit's range. The request bounds have ceilings, past which they bound nothing: a head is
# joined in time quadratic in its size (protocol.py), a body is held in memory whole, and so are
# an upload's decoded pixels.
BOUNDS: dict[str, tuple[float, float]] = {
    "max_batch": (1, math.inf),
    "max_wait_ms": (0, 60_000),
    "max_queue": (1, math.inf),
    "max_body_bytes": (1, 4 << 30),
    "max_tokens": (1, math.inf),
    "max_prompt_tokens": (1, math.inf),
    "max_n": (1, math.inf),
    "max_beam": (1, MAX_BEAM),  # the widest beam a translator runs
    "max_image_pixels": (1, 1 << 32),
    "retry_after_s": (0, 86_400),
    "max_head_bytes": (1 << 10, 1 << 20),
    "head_timeout_s": (0.1, 3_600),
    "keep_alive_s": (1, 3_600),
}
FRACTIONAL = frozenset({"max_wait_ms", "head_timeout_s"})  # the other limits are integers


@dataclass
class Served:
    """The models by name, their workers, and the server's own state."""

    models: dict[str, Bundle]
    settings: Settings
    workers: dict[str, Worker] = field(default_factory=dict)
    draining: bool = False
    # POST requests read but not yet handed to a worker, by the model they named (None: not named
    # yet): work about to join that model's batch
    arriving: dict[str | None, int] = field(default_factory=dict)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "tfcompile_requests", "requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "tfcompile_request_seconds", "request latency by route", ["route"], registry=r
        )
        self.queue = Gauge("tfcompile_queue_depth", "requests waiting, by model", ["model"], registry=r)
        self.batches = Histogram(
            "tfcompile_batch_rows",
            "rows per batch (per step, for a generation), by model",
            ["model"],
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.tokens = Counter(
            "tfcompile_generated_tokens", "tokens generated, by model", ["model"], registry=r
        )

    @property
    def ready(self) -> bool:
        return not self.draining and all(w.ready.is_set() for w in self.workers.values())

    def worker(self, name: str, request: Request | None = None) -> Worker:
        """Model ``name``'s worker; ``request``, a request for it, is from now on arriving for it
        alone (a lone request for one model waited max_wait_ms for a long prompt of another's)."""
        if name not in self.workers:
            raise ModelNotFound(name, sorted(self.workers))
        if request is not None and (arrival := request.scope.get(ARRIVING)) is not None:
            arrival.aim(name)
        return self.workers[name]

    def arriving_for(self, name: str) -> int:
        """The requests arriving that may join model ``name``'s batch: its own, and those that
        have not named their model yet."""
        return self.arriving.get(name, 0) + self.arriving.get(None, 0)

    def submit(self, request: Request, name: str, job: Job) -> Job:
        """Hand ``job`` to model ``name``'s worker; from now on its request is no longer arriving
        (a batch forming waits for arriving requests only, not for those already queued or
        answered, nor for a long stream)."""
        worker = self.worker(name)
        if (arrival := request.scope.get(ARRIVING)) is not None:
            arrival.close()
        return worker.submit(job)

    def observe(self, model: str, rows: int, tokens: int) -> None:
        self.batches.labels(model).observe(rows)
        self.tokens.labels(model).inc(tokens)


def check_lengths(model: Bundle, texts: Sequence[str | tuple[str, str]], name: str) -> None:
    """Each text (and each of a pair) at most CHARS_PER_TOKEN characters a token of the model's
    context, before it is tokenized: the model reads no further (it truncates), while the
    tokenizer's time grows with a text's length."""
    most = model.max_seq_len * CHARS_PER_TOKEN
    for i, item in enumerate(texts):
        if max(map(len, (item,) if isinstance(item, str) else item)) > most:
            what = "over" if isinstance(item, str) else "a sentence of over"
            raise InputError(
                f"{name}[{i}] has {what} {most:,} characters, {CHARS_PER_TOKEN} for each token of the "
                f"model's {model.max_seq_len}-token context, which reads no further: send the beginning"
            )


class RequestBody(BaseModel):
    """A JSON request's fields, each model's problems reported one per field at most: pydantic
    reports every unknown key and every bad item of a list, and FastAPI builds each report on the
    event loop; a 16 MB body of a million unknown keys held every client for 20 s and took 1.5 GB.
    Of the unknown keys only the first is validated (and refused), and lists stop at their first
    bad item (``fail_fast``: each list field sets it)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _first_unknown_key(cls, data: Any) -> Any:
        fields = cls.model_fields
        if not isinstance(data, dict):
            return data
        unknown = list(itertools.islice((key for key in data if key not in fields), 2))
        if len(unknown) < 2:
            return data
        return {key: data[key] for key in [*(key for key in fields if key in data), unknown[0]]}


class Arrival:
    """A POST request's place in ``Served.arriving``, from when its body is read (``read``) until
    it hands over its job or ends (``close``), under the model it names once it names one
    (``aim``). Counted from its headers instead, a client sending its body slowly (or never) held
    every batch for max_wait_ms. The routes may see a copy of the request's ASGI scope; each copy
    holds this same object."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.model: str | None = None
        self.counted = self.ended = False

    def read(self) -> None:
        if not (self.counted or self.ended):
            self.counted = True
            self._count(1)

    def aim(self, model: str) -> None:
        if self.counted:
            self._count(-1)
        self.model = model
        if self.counted:
            self._count(1)

    def close(self) -> None:
        if self.counted:
            self._count(-1)
        self.counted, self.ended = False, True

    def _count(self, change: int) -> None:
        arriving = self.served.arriving
        arriving[self.model] = arriving.get(self.model, 0) + change


class FieldError(InputError):
    """Bad input in one field of the request, which OpenAI's error shape names as its param."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(Exception):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"the model {name!r} does not exist; this server has {known}")
        self.name = name


async def outcome(job: Job, request: Request, watch: bool = False) -> Any:
    """A job's result, once the worker has it. With ``watch`` (long jobs: generation, beam
    search), a client that goes away first cancels the job (its rows stop) and the request ends
    with 499, which nobody reads; short jobs finish regardless, which costs less than watching."""
    if not watch:
        return await job.result
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job.result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not job.result.done():
        job.cancelled.set()
        raise ClientGone()
    return job.result.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


def is_json(request: Request) -> bool:
    """Whether FastAPI reads the request's body as JSON: sent as application/json or
    application/*+json (without a Content-Type, not: FastAPI's strict_content_type)."""
    message = email.message.Message()
    message["content-type"] = request.headers.get("content-type", "")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def not_json(request: Request) -> str:
    kind = request.headers.get("content-type")
    return f"the body must be JSON, sent with Content-Type: application/json, not {kind or 'none'}"


def error_body(
    path: str, status: int, message: str, code: str | None = None, param: str | None = None
) -> dict:
    """OpenAI's error shape under /v1 (its clients read it), KServe's elsewhere."""
    if path.startswith("/v1"):
        kind = {401: "authentication_error", 404: "invalid_request_error", 503: "server_error"}.get(
            status, "invalid_request_error" if status < 500 else "server_error"
        )
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return {"error": message}


def create_app(served: Served) -> ASGI:
    """The ASGI application: FastAPI's routes inside the body guard, the key check, the drain gate
    and the metrics layer."""
    from tfcompile.serve import kserve, openai, tasks

    tasks.bound_png_text()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = served.settings
        for name, model in served.models.items():
            worker = Worker(
                name,
                model,
                s.max_batch,
                s.max_wait_ms / 1000,
                s.max_queue,
                served.observe,
                functools.partial(served.arriving_for, name),
            )
            served.workers[name] = worker
            # Read when scraped (a depth set after each batch stayed stale when the jobs left
            # waiting were dropped unrun, their clients gone).
            served.queue.labels(name).set_function(worker.waiting)
            worker.start()
        yield
        for worker in served.workers.values():
            worker.stop()

    app = FastAPI(title="tfcompile", lifespan=lifespan, max_body_size=served.settings.max_body_bytes)
    app.state.served = served

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        """Starlette's own refusals, in the route family's shape and saying what would do."""
        path, status, headers = request.url.path, e.status_code, dict(e.headers or {})
        message, code = str(e.detail), None
        if status == 404:
            message, code = f"there is no route {path} on this server", "not_found"
        elif status == 405:
            allowed = headers["Allow"].split(", ")
            allowed += ["HEAD"] if "GET" in allowed and "HEAD" not in allowed else []  # Head answers it
            headers["Allow"] = ", ".join(allowed)
            message = f"{path} takes {' and '.join(allowed)}, not {request.method}"
            code = "method_not_allowed"
        elif status == 413:  # a body without a Content-Length (chunked), found too large while read
            message, code = too_large(None, served.settings.max_body_bytes), "request_too_large"
        elif status == 400:  # a form the multipart parser refused (too many files, a part too large)
            code = "invalid_request"
        elif status == 415:
            code = "unsupported_media_type"
        return JSONResponse(error_body(path, status, message, code), status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        if first["type"] == "json_invalid":  # its loc is a character offset, not a field
            reason, at = first.get("ctx", {}).get("error", first["msg"]), first["loc"][-1]
            message = f"the body is not valid JSON: {reason} (at character {at})"
            return JSONResponse(error_body(request.url.path, 400, message, "invalid_json"), 400)
        if first["type"] == "missing" and first["loc"] == ("body",):
            message = "the body is empty: send a JSON object"
            return JSONResponse(error_body(request.url.path, 400, message, "invalid_request"), 400)
        if first["loc"] == ("body",) and isinstance(first.get("input"), bytes):  # not read as JSON
            message = not_json(request)
            return JSONResponse(error_body(request.url.path, 415, message, "unsupported_media_type"), 415)
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        reason = first["msg"]
        if first["type"] == "int_parsing_size" and type(first.get("input")) is int:  # pydantic's
            reason = f"a {len(str(abs(first['input'])))}-digit number is past any value it takes"
        message = f"{param}: {reason}" if param else reason
        return JSONResponse(error_body(request.url.path, 400, message, "invalid_request", param), 400)

    @app.exception_handler(InputError)
    async def bad_input(request: Request, e: InputError) -> JSONResponse:
        param = e.param if isinstance(e, FieldError) else None
        return JSONResponse(error_body(request.url.path, 400, str(e), "invalid_input", param), 400)

    @app.exception_handler(ModelNotFound)
    async def not_found(request: Request, e: ModelNotFound) -> JSONResponse:
        return JSONResponse(error_body(request.url.path, 404, str(e), "model_not_found", "model"), 404)

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, e: Overloaded) -> JSONResponse:
        body = error_body(request.url.path, 503, f"{e}: try again shortly", "overloaded")
        return JSONResponse(body, 503, headers={"Retry-After": str(served.settings.retry_after_s)})

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # while its body was read
    async def gone(request: Request, e: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def crashed(request: Request, e: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)  # the traceback stays in the log
        # A constant message: the server's own errors name its files (a bundle's path), not the client's.
        message = "internal error: the server's log has the details"
        # Starlette re-raises the error once this is sent, and uvicorn then closes the connection:
        # the client is told so, rather than sending its next request into a closing socket.
        body = error_body(request.url.path, 500, message, "internal_error")
        return JSONResponse(body, 500, headers={"Connection": "close"})

    @app.get("/health")
    async def health() -> dict:
        return {"live": True, "ready": served.ready}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(served.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(openai.router)
    app.include_router(kserve.router)
    app.include_router(tasks.router)
    guarded = BodyGuard(Metrics(Gate(Auth(app, served), served), served), served.settings.max_body_bytes)
    return Conformance(guarded)


# ------------------------------------------------------------------------ ASGI layers


async def _json(
    send: Callable[[Any], Awaitable[None]], scope: Scope, status: int, body: dict, headers: dict | None = None
) -> None:
    await JSONResponse(body, status, headers=headers)(scope, _no_body, send)


async def _no_body() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


def _values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower case), in order: a header may be sent more than once."""
    return [value for key, value in scope["headers"] if key == name]


def too_large(size: int | None, most: int) -> str:
    """413's message, for a body of ``size`` bytes or, where that is not known, one read to past the limit."""
    if size is None:
        return f"the request body is over the {most:,} bytes allowed"
    return f"the request body is {size:,} bytes, more than the {most:,} allowed"


class Conformance:
    """What HTTP asks of a server whatever the route. HEAD is answered as GET would be, without
    the body (RFC 9110, 9.3.2); load balancers and uptime checks send it: the routes see GET, and
    uvicorn, which holds the request's own scope, leaves the body out. An HTTP/1.1 request without
    one Host header is 400 (RFC 9112, 3.2). A request that expects ``100-continue`` and is
    answered before its body is asked for (a 401, a 413, a 404) is answered with ``Connection:
    close``: its client may never send the body (RFC 9110, 10.1.1), and the server would read its
    next request as that body."""

    def __init__(self, app: ASGI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        hosts = len(_values(scope, b"host"))
        if scope["http_version"] == "1.1" and hosts != 1:
            message = f"an HTTP/1.1 request needs one Host header, this one has {hosts}"
            body = error_body(scope["path"], 400, message, "bad_http_request")
            return await _json(send, scope, 400, body, {"Connection": "close"})
        if scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        if b"100-continue" not in (v.lower() for v in _values(scope, b"expect")):
            return await self.app(scope, receive, send)
        asked = False

        async def receiving() -> Any:
            nonlocal asked
            asked = True  # uvicorn sends 100 Continue now
            return await receive()

        async def sending(message: Any) -> None:
            headers = message.get("headers", [])
            if message["type"] == "http.response.start" and not asked and b"connection" not in dict(headers):
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receiving, sending)


class BodyGuard:
    """A Content-Length over the limit is refused before the body is read, in JSON (FastAPI's own
    limit catches chunked bodies as they are read). A body in a transfer coding other than
    chunked (gzip, ...) is refused with 501 (RFC 9112, 6.1): the routes would read its coded bytes."""

    def __init__(self, app: ASGI, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            length = dict(scope["headers"]).get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_bytes:
                message = too_large(int(length), self.max_bytes)
                return await _json(send, scope, 413, error_body(path, 413, message, "request_too_large"))
            codings = [c.strip().lower() for v in _values(scope, b"transfer-encoding") for c in v.split(b",")]
            if any(c != b"chunked" for c in codings):
                shown = b", ".join(codings).decode("latin-1")
                message = f"the body's transfer coding ({shown}) is not served: send it plain or chunked"
                return await _json(send, scope, 501, error_body(path, 501, message, "not_implemented"))
        await self.app(scope, receive, send)


class Auth:
    """With an API key, every route but health and metrics needs ``Authorization: Bearer KEY``."""

    def __init__(self, app: ASGI, served: Served) -> None:
        self.app, self.key = app, served.settings.api_key

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.key and scope["type"] == "http" and scope["path"] not in PUBLIC:
            # Exactly one Authorization header (of two, the last one used to count), its scheme
            # case-insensitive and one or more spaces before the key (RFC 9110, 11.4).
            given = [value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"]
            scheme, _, key = given[0].partition(" ") if len(given) == 1 else ("", "", "")
            key = key.lstrip(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(key.encode(), self.key.encode()):
                message = "a valid API key is needed: send the header Authorization: Bearer KEY"
                body = error_body(scope["path"], 401, message, "invalid_api_key")
                return await _json(send, scope, 401, body, {"WWW-Authenticate": "Bearer"})
        await self.app(scope, receive, send)


class Gate:
    """While the server drains (SIGTERM), new work is refused with 503; in-flight work finishes."""

    def __init__(self, app: ASGI, served: Served) -> None:
        self.app, self.served = app, served

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.served.draining and scope["type"] == "http" and scope["path"] not in PUBLIC:
            body = error_body(scope["path"], 503, "the server is shutting down", "shutting_down")
            headers = {"Retry-After": str(self.served.settings.retry_after_s), "Connection": "close"}
            return await _json(send, scope, 503, body, headers)
        await self.app(scope, receive, send)


class Metrics:
    """Requests by route and status, and their latency (a stream's, to its end); and each POST
    request's Arrival, counted from its body's end until the request hands a job to a worker or ends.
    A request whose client left before its answer began is counted as CLIENT_CLOSED, or as the
    status the protocol refused it with (a body that stopped arriving: 408), whatever the routes
    made of its cut body afterwards (a 500, a 400 for bad JSON)."""

    def __init__(self, app: ASGI, served: Served) -> None:
        self.app, self.served = app, served

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 500
        arrival = scope[ARRIVING] = Arrival(self.served) if scope["method"] == "POST" else None
        answered = left = False

        async def receiving() -> Any:
            nonlocal left
            message = await receive()
            if arrival is not None and message["type"] == "http.request" and not message.get("more_body"):
                arrival.read()  # the body is in: its job is on its way
            left = left or (message["type"] == "http.disconnect" and not answered)
            return message

        async def sending(message: Any) -> None:
            nonlocal answered, status
            if message["type"] == "http.response.start" and not left:
                answered, status = True, message["status"]
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            if arrival is not None:
                arrival.close()  # a request that ended without handing over a job
            route = scope.get("route")
            name = getattr(route, "path", None) or "unmatched"
            code = scope.get(REFUSED, CLIENT_CLOSED) if left else status
            self.served.requests.labels(name, str(code)).inc()
            self.served.latency.labels(name).observe(time.perf_counter() - start)
