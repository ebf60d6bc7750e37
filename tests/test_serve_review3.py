"""tfcompile serve's request bounds (head size and time, body, pixels) set from its flags and
refused out of their range."""

from __future__ import annotations

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
