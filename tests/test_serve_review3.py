"""tfcompile serve as HTTP says a server answers: HEAD wherever GET is answered, a 405 that names
the methods allowed, 501 for a method or transfer coding it does not implement, 400 for an
HTTP/1.1 request without one Host, a connection closed (and said to close) where the client may
not send the body it announced, every refusal in the route family's JSON shape; and the request
bounds (head size and time, body, pixels) set from ``tfcompile serve``'s flags and refused out of
their range."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import ROOT
from PIL import Image
from serving import BackgroundServer

from tfcompile.cli import main
from tfcompile.serve import Settings

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(char_bundle: Path, image_bundle: Path) -> Iterator[BackgroundServer]:
    settings = Settings(api_key=KEY, max_body_bytes=4096)
    with BackgroundServer({"char": char_bundle, "digits": image_bundle}, settings) as s:
        yield s


def raw(port: int, data: bytes, wait_s: float = 10) -> tuple[bytes, bool]:
    """Send ``data`` -> what came back, and whether the server closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            return out, False
        return out, True


def answer(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """A raw response -> its status, headers (lower-case names) and JSON body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
    assert headers.get("content-type") == "application/json", raw
    return int(status_line.split()[1]), headers, json.loads(body)


def openai_error(body: Any) -> dict:
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# ------------------------------------------------------------------------------------ HEAD


def _get_routes(server: BackgroundServer) -> list[str]:
    """Every GET route of the app (its OpenAPI schema's, and the schema's own), path parameters
    filled in."""
    schema = httpx.get(f"{server.url}/openapi.json", headers=AUTH).json()
    paths = [path for path, methods in schema["paths"].items() if "get" in methods]
    return [p.replace("{name}", "char").replace("{version}", "1") for p in [*paths, "/openapi.json", "/docs"]]


def test_head_is_answered_wherever_get_is_with_its_status_and_headers(server: BackgroundServer) -> None:
    """FastAPI's GET routes answered HEAD 405; RFC 9110 asks the same status and headers as GET."""
    paths = _get_routes(server)
    assert {"/health", "/metrics", "/v1/models/char", "/v2", "/v2/models/char/versions/1/ready"} <= set(paths)
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        for path in [*paths, "/v1/models/nope", "/v2/models/nope", "/v1/completions"]:
            got, head = http.get(path), http.head(path)
            assert (head.status_code, head.content) == (got.status_code, b""), path
            same = {k: v for k, v in got.headers.items() if k not in ("date", "content-length")}
            assert {k: v for k, v in head.headers.items() if k not in ("date", "content-length")} == same, (
                path
            )
            if path != "/metrics":  # its counters move between the two requests
                assert head.headers["content-length"] == got.headers["content-length"], path


def test_head_needs_the_key_where_get_does(server: BackgroundServer) -> None:
    assert httpx.head(f"{server.url}/v1/models").status_code == 401
    assert httpx.head(f"{server.url}/v2/models/char").status_code == 401
    for public in ("/health", "/v2/health/ready", "/metrics"):
        assert httpx.head(f"{server.url}{public}").status_code == 200, public


def test_only_the_health_and_metrics_routes_answer_without_the_key(server: BackgroundServer) -> None:
    """Every path that began with a public route's path went past the key check (a 404 for
    /metrics/x, where any other unknown route is 401)."""
    for path in ("/metrics/x", "/healthz", "/health/x", "/v2/health/other"):
        assert httpx.get(f"{server.url}{path}").status_code == 401, path
        assert httpx.get(f"{server.url}{path}", headers=AUTH).status_code == 404, path


# ------------------------------------------------------------------------- methods, routes


def test_a_method_a_route_does_not_take_is_405_naming_the_allowed_ones(server: BackgroundServer) -> None:
    """The 405 said 'Method Not Allowed' with no code and no Allow header (Starlette's, dropped)."""
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        r = http.options("/v1/models")
        assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"
        error = openai_error(r.json())
        assert error["code"] == "method_not_allowed" and "takes GET and HEAD, not OPTIONS" in error["message"]
        r = http.get("/v1/completions")
        assert r.status_code == 405 and r.headers["Allow"] == "POST"
        assert openai_error(r.json())["message"] == "/v1/completions takes POST, not GET"
        r = http.delete("/v2/models/char/infer")
        assert r.status_code == 405 and r.headers["Allow"] == "POST"
        assert r.json() == {"error": "/v2/models/char/infer takes POST, not DELETE"}  # KServe's shape
        assert http.get("/v2").status_code == 200  # the connection is kept after each


def test_an_unknown_route_is_404_saying_so(server: BackgroundServer) -> None:
    r = httpx.get(f"{server.url}/v1/nope", headers=AUTH)
    error = openai_error(r.json())
    assert r.status_code == 404 and error["code"] == "not_found"
    assert error["message"] == "there is no route /v1/nope on this server"
    assert httpx.get(f"{server.url}/v2/nope", headers=AUTH).json() == {
        "error": "there is no route /v2/nope on this server"
    }


def test_a_method_the_server_does_not_know_is_501(server: BackgroundServer) -> None:
    """httptools refuses a method it does not know as it refuses bytes that are not HTTP: 400
    "Invalid HTTP request received"; RFC 9110 asks 501."""
    for line, shaped in ((b"BREW /v1/models", dict), (b"get /v2/models/char", str)):
        data, closed = raw(
            server.port, line + b" HTTP/1.1\r\nHost: x\r\n" + b"Authorization: Bearer k3y\r\n\r\n"
        )
        status, _, body = answer(data)
        assert status == 501 and closed and isinstance(body["error"], shaped), body
        assert "is not one this server knows" in str(body)
    status, _, body = answer(raw(server.port, b"\x16\x03\x01\x00\xa5\x01\x00" + b"\0" * 64)[0])
    assert status == 400 and "not valid HTTP" in body["error"]  # TLS to a plain port is no method


def test_an_http_1_1_request_without_one_host_is_400(server: BackgroundServer) -> None:
    """RFC 9112 (3.2): a server must answer 400 to an HTTP/1.1 request with no Host header or more
    than one; it was served."""
    for hosts in (b"", b"Host: a\r\nHost: b\r\n"):
        data, closed = raw(
            server.port, b"GET /v1/models HTTP/1.1\r\n" + hosts + b"Authorization: Bearer k3y\r\n\r\n"
        )
        status, _, body = answer(data)
        assert status == 400 and closed and "needs one Host header" in openai_error(body)["message"]
    data, _ = raw(server.port, b"GET /health HTTP/1.0\r\n\r\n")  # HTTP/1.0 has no Host to send
    assert answer(data)[0] == 200


# ------------------------------------------------------------------------------------- bodies


def test_a_chunked_body_over_the_limit_is_413_naming_it(server: BackgroundServer) -> None:
    """Starlette's limit, met while reading a body sent without Content-Length, said 'Content Too
    Large' (code null) where a Content-Length over it named the limit."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "char", "prompt": "'
        yield from (b"a" * 1000 for _ in range(10))
        yield b'"}'

    with httpx.Client(base_url=server.url, headers={**AUTH, "Content-Type": "application/json"}) as http:
        error = openai_error(http.post("/v1/completions", content=chunks()).json())
        assert error["code"] == "request_too_large"
        assert error["message"] == "the request body is over the 4,096 bytes allowed"
        r = http.post("/v2/models/char/infer", content=chunks())
        assert r.status_code == 413 and r.json() == {
            "error": "the request body is over the 4,096 bytes allowed"
        }
        assert (
            http.get("/v2").status_code == 200
        )  # the rest of the body was read past: the connection serves on


def test_a_body_in_a_transfer_coding_the_server_does_not_read_is_501(server: BackgroundServer) -> None:
    """gzip was stripped of its chunks and handed to the route as the body: a JSON error about
    bytes the client never meant as JSON."""
    data, _ = raw(
        server.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Type: "
        b"application/json\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
    )
    status, _, body = answer(data)
    assert status == 501 and openai_error(body)["code"] == "not_implemented"
    assert "transfer coding (gzip, chunked)" in body["error"]["message"]


def test_a_request_expecting_100_continue_answered_first_closes_its_connection(
    server: BackgroundServer,
) -> None:
    """Refused before its body was asked for, the connection stayed open waiting for that body,
    which the client need not send (RFC 9110, 10.1.1): its next request was read as the body."""
    follow = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for head in (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n",  # no key: 401
        b"POST /v2/models/char/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
        b"Content-Length: 100000\r\n",  # 413
    ):
        data, closed = raw(server.port, head + b"Expect: 100-continue\r\n\r\n" + follow, wait_s=5)
        status, headers, _ = answer(data)
        assert status in (401, 413) and headers["connection"] == "close" and closed, data
        assert b"100 Continue" not in data and data.count(b"HTTP/1.1") == 1
    # A body asked for is sent after 100 Continue, and the connection serves on.
    body = json.dumps({"model": "char", "prompt": "a", "max_tokens": 1}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body)
        )
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body + follow.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.count(b"HTTP/1.1 200 OK") == 2, out


# ----------------------------------------------------------------------- the server's faults


def test_a_500_says_the_connection_closes(server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn closes the connection after a 500 (Starlette re-raises the error); the answer said
    keep-alive, so a client's next request could go into the closing socket."""

    def broken(name: str) -> Any:
        raise RuntimeError("a fault of the server's")

    monkeypatch.setattr(server.served.models["char"], "graph", broken)
    r = httpx.get(f"{server.url}/v2/models/char", headers=AUTH)
    assert r.status_code == 500 and r.headers["connection"] == "close"
    assert r.json() == {"error": "internal error: the server's log has the details"}


# ------------------------------------------------------------------------ the request bounds


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_head_bytes", 0),
        ("max_head_bytes", 100),
        ("max_head_bytes", 1 << 30),
        ("head_timeout_s", 0),
        ("head_timeout_s", -1.0),
        ("head_timeout_s", math.nan),
        ("head_timeout_s", math.inf),
        ("head_timeout_s", 1e9),
        ("max_body_bytes", 0),
        ("max_body_bytes", 1 << 40),
        ("max_image_pixels", -5),
        ("max_image_pixels", 1 << 40),
        ("max_image_pixels", 2.5),
        ("max_batch", True),
        ("max_wait_ms", -1),
        ("max_prompt_tokens", 0),
        ("keep_alive_s", 0),
        ("keep_alive_s", 1.5),
        ("keep_alive_s", 7200),
    ],
)
def test_settings_refuse_a_limit_out_of_its_range_by_name(field: str, value: Any) -> None:
    """Settings(max_head_bytes=0) served a server that answered every request 431."""
    with pytest.raises(ValueError, match=rf"^Settings\.{field} must be an? (integer|number) "):
        Settings(**{field: value})


def test_settings_take_the_ends_of_each_range() -> None:
    Settings(max_head_bytes=1 << 10, head_timeout_s=0.1, max_body_bytes=1, max_image_pixels=1, max_wait_ms=0)
    Settings(max_head_bytes=1 << 20, head_timeout_s=3600, max_body_bytes=4 << 30, max_image_pixels=1 << 32)


@pytest.mark.parametrize(
    "flag",
    [
        "--max-head-kb=2048",
        "--head-timeout=1e9",
        "--head-timeout=inf",
        "--head-timeout=0.01",
        "--max-body-mb=0",
        "--max-body-mb=100000",
        "--max-image-pixels=0",
        "--max-image-pixels=10000000000000",
        "--max-wait-ms=70000",
        "--max-wait-ms=-1",
    ],
)
def test_serve_refuses_a_bound_out_of_its_range(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["serve", "b", flag])
    name = flag.split("=")[0]
    assert exit.value.code == 2 and f"argument {name}: expected " in capsys.readouterr().err


def test_serve_help_says_each_bounds_range_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for said in (
        "1 to 1,024 (default 64; 431 past it)",
        "0.1 to 3,600 (default 20; 408 past it)",
        "1 to 4,096 (default 16; 413 past it)",
        "1 to 2^32 (default 67,108,864: 8,192 x 8,192; 400 past it)",
    ):
        assert said in shown


def test_serve_flags_set_low_make_the_server_refuse(char_bundle: Path, image_bundle: Path) -> None:
    """Each request bound, set from its flag, refuses what passes it, in JSON."""
    command = [sys.executable, "-m", "tfcompile", "serve", f"char={char_bundle}", f"digits={image_bundle}"]
    command += ["--port", "0", "--max-head-kb", "1", "--head-timeout", "0.5", "--max-body-mb", "1"]
    command += ["--max-image-pixels", "100"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stderr is not None
        port = next(
            int(m.group(1)) for line in process.stderr if (m := re.search(r"127\.0\.0\.1:(\d+)", line))
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not httpx.get(f"{url}/health").json()["ready"] and time.monotonic() < deadline:
            time.sleep(0.05)

        status, _, body = answer(raw(port, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 1100 + b"\r\n\r\n")[0])
        assert status == 431 and "over 1,024 bytes" in body["error"]
        started = time.monotonic()
        status, _, body = answer(raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")[0])
        assert status == 408 and "took over 0.5 s" in openai_error(body)["message"]
        assert time.monotonic() - started < 5
        r = httpx.post(f"{url}/v1/completions", content=b"{" + b" " * (1 << 20) + b"}")
        assert r.status_code == 413 and "more than the 1,048,576 allowed" in openai_error(r.json())["message"]
        png = io.BytesIO()
        Image.new("L", (20, 20)).save(png, "PNG")
        r = httpx.post(f"{url}/v1/classify-image", data={"model": "digits"}, files={"images": png.getvalue()})
        error = openai_error(r.json())
        assert r.status_code == 400 and "hold 400 pixels in all, more than the 100" in error["message"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        process.kill()


def test_each_serve_flags_range_is_the_servers_in_its_units() -> None:
    """The CLI keeps the server's import lazy, so its flags restate Settings' BOUNDS in KiB, MiB,
    ms and s: each flag's ceiling, in the server's units, is the server's ceiling."""
    from tfcompile.cli import build_parser
    from tfcompile.serve.app import BOUNDS

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = {a.dest: a.type for a in commands.choices["serve"]._actions}
    for flag, field, unit in [
        ("max_head_kb", "max_head_bytes", 1 << 10),
        ("head_timeout", "head_timeout_s", 1),
        ("max_body_mb", "max_body_bytes", 1 << 20),
        ("max_image_pixels", "max_image_pixels", 1),
        ("max_wait_ms", "max_wait_ms", 1),
        ("max_beam", "max_beam", 1),
    ]:
        parse, high = serve[flag], BOUNDS[field][1] / unit
        text = str(int(high)) if high == int(high) else str(high)
        assert parse(text) * unit == BOUNDS[field][1], flag
        with pytest.raises(argparse.ArgumentTypeError):
            parse(str(high * 2))


@pytest.mark.slow  # the translator bundle: 20 s to build
def test_a_bundles_defaults_over_the_servers_limits_are_held_within_them(
    char_bundle: Path, translator_bundle: Path, tmp_path: Path
) -> None:
    """A request that names no beam, max_len or max_tokens takes the manifest's defaults: where
    they were over the server's limits, every such request was refused with a 400 naming fields
    the client never sent. They are held within the limits; what a request names still is not."""
    from helpers import damaged

    from tfcompile.runtime import load

    wide = damaged(
        translator_bundle, tmp_path / "t", lambda m: m["translation"].update(beam=6, max_decode_len=4096)
    )
    long = damaged(char_bundle, tmp_path / "c", lambda m: m["generation"].update(max_new_tokens=500))
    texts = ["Ein Hund rennt.", "Eine Frau."]
    with BackgroundServer({"de-en": wide, "char": long}, Settings(max_beam=2, max_tokens=5)) as server:
        r = httpx.post(f"{server.url}/v1/translate", json={"model": "de-en", "texts": texts})
        assert r.status_code == 200, r.text
        assert r.json()["translations"] == load(wide).translate(texts, beam=2, max_len=5)
        r = httpx.post(f"{server.url}/v1/translate", json={"model": "de-en", "texts": texts, "max_len": 4096})
        assert r.status_code == 400 and "at most 5, got 47 (asked 4096, cut to the context)" in r.text
        r = httpx.post(f"{server.url}/v1/translate", json={"model": "de-en", "texts": texts, "beam": 3})
        assert r.status_code == 400 and "beam may be at most 2, got 3" in r.text
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "char", "prompt": "ROMEO:"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "char", "prompt": "a", "max_tokens": 6})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
