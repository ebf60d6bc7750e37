"""tfcompile serve under hostile or careless clients: each class of request that once got a 500,
stalled other clients or was read as something it is not, answered as the rules say (a 4xx in
the route family's JSON shape, limits held before the work they bound)."""

from __future__ import annotations

import codecs
import io
import json
import re
import socket
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError
from pydantic.types import FailFast
from serving import BackgroundServer

from tfcompile.errors import BundleError
from tfcompile.serve import Settings
from tfcompile.serve.app import CHARS_PER_TOKEN, RequestBody
from tfcompile.serve.openai import CompletionRequest
from tfcompile.serve.tasks import ImagesRequest

SETTINGS = Settings(max_wait_ms=5, max_head_bytes=4096, head_timeout_s=1.0, max_image_pixels=20_000)


@pytest.fixture(scope="module")
def server(char_bundle: Path, classifier_bundle: Path, image_bundle: Path) -> Iterator[BackgroundServer]:
    with BackgroundServer(
        {"char": char_bundle, "sst2": classifier_bundle, "digits": image_bundle}, SETTINGS
    ) as s:
        yield s


def complete(server: BackgroundServer, **fields: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": "char", "max_tokens": 4, **fields})


def openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ------------------------------------------------------------------------------ sampling


def test_a_temperature_too_small_to_divide_by_decodes_greedily(server: BackgroundServer) -> None:
    """Logits divided by 1e-320 overflow to NaN probabilities: that was a 500, and it failed every
    completion generating in the same batch."""
    greedy = complete(server, prompt="ROMEO:", temperature=0).json()["choices"][0]["text"]
    for temperature in (1e-320, 5e-324, 1e-6):
        r = complete(server, prompt="ROMEO:", temperature=temperature, seed=1)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == greedy


# ------------------------------------------------------------------- types and fields


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "1"),
        ("temperature", True),
        ("top_p", "0.5"),
        ("stream", "yes"),
        ("stream", 1),
        ("echo", "true"),
        ("stream_options", {"include_usage": 1}),
        ("max_tokens", 2.0),
        ("n", True),
    ],
)
def test_json_values_of_another_type_are_not_coerced(
    server: BackgroundServer, field: str, value: Any
) -> None:
    error = openai_error(complete(server, prompt="a", **{field: value}), 400)
    assert error["param"].startswith(field), error


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"prompt": {"a": 1}}, "prompt", "prompt must be a string, a list of strings, a list of token ids"),
        ({"prompt": None}, "prompt", "prompt must be a string"),
        ({"prompt": [1, "a"]}, "prompt", "prompt must be a string"),
        ({"prompt": [[1], [True]]}, "prompt", "prompt must be a string"),
        ({"prompt": "a", "stop": ["x"] * 5000}, "stop", "stop must be a string or a list of at most 4"),
        ({"prompt": "a", "stop": 5}, "stop", "stop must be"),
        ({"prompt": "a", "max_tokens": 10**100}, "max_tokens", "max_tokens may be at most"),
        ({"prompt": "a", "n": 10**100}, "n", "at most 16 completions per prompt"),
        ({"prompt": [[1]] * 33}, "prompt", "32 in all, got 33 prompts"),
    ],
)
def test_bad_fields_are_named_as_openai_names_them(
    server: BackgroundServer, fields: dict, param: str, needle: str
) -> None:
    error = openai_error(complete(server, **fields), 400)
    assert error["param"] == param and needle in error["message"], error


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"model": "char", "prompt": "a"}),
        ("/v1/classify-image", {"model": "digits", "images": [[[0.5] * 8] * 8]}),  # its JSON read by hand
    ],
)
def test_a_body_not_sent_as_json_is_415_naming_its_content_type(
    server: BackgroundServer, route: str, body: dict
) -> None:
    for kind in ("text/plain", "application/x-www-form-urlencoded", "text/json", None):
        headers = {"Content-Type": kind} if kind else {}
        r = httpx.post(f"{server.url}{route}", content=json.dumps(body), headers=headers)
        error = openai_error(r, 415)
        assert (
            "Content-Type: application/json" in error["message"] and str(kind or "none") in error["message"]
        )
        assert route != "/v1/classify-image" or "or multipart/form-data" in error["message"]
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = httpx.post(f"{server.url}{route}", content=json.dumps(body), headers={"Content-Type": kind})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/classify", {"model": "sst2", "texts": ["a"]}),
        ("/v1/classify-image", {"model": "digits", "images": [[[0.5] * 8] * 8]}),
        (
            "/v2/models/sst2/infer",
            {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
        ),
    ],
)
def test_a_json_body_that_begins_with_a_byte_order_mark_is_read_on_every_route(
    server: BackgroundServer, route: str, body: dict
) -> None:
    """json.loads, which FastAPI reads bodies with, skips a UTF-8 BOM; classify-image's own reading
    (pydantic's) refused it as invalid JSON at column 1."""
    content = codecs.BOM_UTF8 + json.dumps(body).encode()
    r = httpx.post(f"{server.url}{route}", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("route", "content", "needle"),
    [
        ("/v1/completions", b"", "the body is empty: send a JSON object"),
        ("/v1/classify", b"", "the body is empty: send a JSON object"),
        (
            "/v1/completions",
            b'{"model": "char",',
            "Expecting property name enclosed in double quotes (at character 17)",
        ),
        ("/v1/translate", b'{"model": 1 2}', "Expecting ',' delimiter (at character 12)"),
    ],
)
def test_an_empty_or_broken_json_body_is_a_400_saying_what_is_wrong(
    server: BackgroundServer, route: str, content: bytes, needle: str
) -> None:
    r = httpx.post(f"{server.url}{route}", content=content, headers={"Content-Type": "application/json"})
    error = openai_error(r, 400)
    assert needle in error["message"] and error["param"] is None, error


# --------------------------------------------------- work bounded before it is done


def _request_bodies() -> list[type[RequestBody]]:
    def below(model: type[RequestBody]) -> list[type[RequestBody]]:
        return [m for sub in model.__subclasses__() for m in (sub, *below(sub))]

    return below(RequestBody)


def test_the_request_models_are_all_request_bodies() -> None:
    assert {m.__name__ for m in _request_bodies()} == {
        "CompletionRequest",
        "StreamOptions",
        "ClassifyRequest",
        "TranslateRequest",
        "ImagesRequest",
    }


@pytest.mark.parametrize("model", _request_bodies(), ids=lambda m: m.__name__)
def test_a_body_of_many_unknown_keys_is_refused_at_the_first(model: type[RequestBody]) -> None:
    """pydantic reported each unknown key, and FastAPI built each report on the event loop: 16 MB
    of them held every client for 20 s."""
    with pytest.raises(ValidationError) as refused:
        model.model_validate({f"unknown{i}": 0 for i in range(100_000)})
    assert [e["loc"] for e in refused.value.errors() if e["type"] == "extra_forbidden"] == [("unknown0",)]
    assert refused.value.error_count() <= len(model.model_fields) + 1


def _collects(annotation: Any) -> bool:
    """Whether a field's type is a list or a dict, or a union or annotation of one."""
    if typing.get_origin(annotation) in (list, dict):
        return True
    parts = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        parts = parts[:1]
    return any(_collects(part) for part in parts)


def test_every_list_of_a_request_stops_at_its_first_bad_item() -> None:
    lists = 0
    for model in _request_bodies():
        for name, field in model.model_fields.items():
            if _collects(field.annotation):
                lists += 1
                assert FailFast(True) in field.metadata or name == "logit_bias", (model, name)
    assert lists == 2  # images, and logit_bias, refused when it holds anything before its items are read
    with pytest.raises(ValidationError) as refused:
        ImagesRequest.model_validate({"model": "m", "images": ["x"] * 100_000})
    assert refused.value.error_count() == 1
    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate(
            {"model": "m", "prompt": "a", "logit_bias": {str(i): "x" for i in range(100_000)}}
        )
    assert refused.value.error_count() == 1 and "not served" in refused.value.errors()[0]["msg"]


def test_a_body_of_many_unknown_keys_is_a_400_naming_the_first(server: BackgroundServer) -> None:
    body = {"model": "sst2", "texts": ["a"], **{f"unknown{i}": 0 for i in range(200_000)}}
    error = openai_error(httpx.post(f"{server.url}/v1/classify", json=body, timeout=60), 400)
    assert error["param"] == "unknown0"


def test_prompts_are_counted_and_sized_before_any_is_tokenized(server: BackgroundServer) -> None:
    """A request's prompts are counted, and each text's length bounded by the characters the
    context's tokens can hold, before the tokenizer runs (on the event loop it stalled every client:
    10 MB took 40 s)."""
    many = openai_error(complete(server, prompt=["¿"] * 100_000), 400)  # "¿" is outside the vocabulary
    assert "got 100000 prompts" in many["message"]
    long = openai_error(complete(server, prompt="¿" * 3_000_000), 400)
    assert "3,000,000 characters, more than the 64" in long["message"]
    ids = openai_error(complete(server, prompt=[[1] * 65, [True]]), 400)
    assert "prompt[0] has 65 tokens" in ids["message"]


def test_texts_longer_than_the_context_reads_are_refused_before_tokenizing(server: BackgroundServer) -> None:
    """A text may hold CHARS_PER_TOKEN characters a token of the model's context (which reads no
    further): the tokenizer's time grows with a text's length and with the square of a pair's
    (a pair of 72 KB texts took 23 GB)."""
    most = server.served.models["sst2"].max_seq_len * CHARS_PER_TOKEN
    text = ("a gorgeous, witty, seductive movie. " * 100)[:most]
    r = httpx.post(f"{server.url}/v1/classify", json={"model": "sst2", "texts": [text, [text, text]]})
    assert r.status_code == 200, r.text
    expected = server.served.models["sst2"].classify([text, (text, text)])
    assert [p["probabilities"] for p in r.json()["predictions"]] == [
        pytest.approx(e.probabilities, abs=1e-6) for e in expected
    ]
    long = text * 4000
    for texts, needle in [
        ([long], "texts[0] has over"),
        (["a", [text, long]], "texts[1] has a sentence of over"),
    ]:
        r = httpx.post(f"{server.url}/v1/classify", json={"model": "sst2", "texts": texts})
        assert needle in openai_error(r, 400)["message"]
    tensor = {"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": [long, long]}
    r = httpx.post(f"{server.url}/v2/models/sst2/infer", json={"inputs": [tensor]})
    assert r.status_code == 400 and "text[0] has a sentence of over" in r.json()["error"], r.text


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (width, height)).save(out, format="PNG")
    return out.getvalue()


def test_uploaded_pixels_are_counted_before_any_image_is_decoded(server: BackgroundServer) -> None:
    """A few kilobytes of PNG can hold a 64-megapixel image (3 s and 1 GB to decode and scale);
    32 of them held the model's worker for minutes."""
    url = f"{server.url}/v1/classify-image"
    small = [("images", (f"{i}.png", _png(100, 100), "image/png")) for i in range(2)]
    assert httpx.post(url, data={"model": "digits"}, files=small).status_code == 200
    big = [*small, ("images", ("c.png", _png(1, 1), "image/png"))]
    error = openai_error(httpx.post(url, data={"model": "digits"}, files=big), 400)
    assert "20,001 pixels in all, more than the 20,000" in error["message"]


def _with_text(png: bytes, inflated: list[int]) -> bytes:
    """``png`` with a zTXt chunk (zlib text) of each of the ``inflated`` sizes after its header."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    text = b"".join(chunk(b"zTXt", b"k\0\0" + zlib.compress(b"\0" * n, 9)) for n in inflated)
    return png[:33] + text + png[33:]  # 33: the signature and IHDR


def test_an_uploads_text_chunks_are_bounded_and_read_off_the_event_loop(server: BackgroundServer) -> None:
    """Pillow inflated a PNG's text chunks (1 MB each, 64 MB in all) as it opened the file, on the
    event loop: 2 MB of such uploads held every client for 9 s. A file's text chunks take at most
    1 MiB now (a PNG of more is unreadable), and the pixels are counted after the model is checked."""
    url = f"{server.url}/v1/classify-image"
    fine = [("images", ("a.png", _with_text(_png(8, 8), [1 << 19]), "image/png"))]
    assert httpx.post(url, data={"model": "digits"}, files=fine).status_code == 200
    bomb = [("images", (f"{i}.png", _with_text(_png(8, 8), [1 << 20] * 2), "image/png")) for i in range(2)]
    error = openai_error(httpx.post(url, data={"model": "digits"}, files=bomb), 400)
    assert "cannot read the uploaded image" in error["message"] and "text chunks" in error["message"]
    big = [("images", ("big.png", _png(200, 200), "image/png"))]
    error = openai_error(httpx.post(url, data={"model": "sst2"}, files=big), 400)
    assert "does not serve /v1/classify-image" in error["message"]


def test_a_form_the_multipart_parser_refuses_is_a_400_with_its_code(server: BackgroundServer) -> None:
    """More files than a batch holds (Starlette's own limit): its HTTPException came back with a
    null code, where every other 400 names one."""
    url = f"{server.url}/v1/classify-image"
    files = [("images", (f"{i}.png", _png(1, 1), "image/png")) for i in range(SETTINGS.max_batch + 1)]
    error = openai_error(httpx.post(url, data={"model": "digits"}, files=files), 400)
    assert "Too many files" in error["message"] and error["code"] == "invalid_request"


def test_json_images_are_counted_and_checked_before_any_array_is_made(server: BackgroundServer) -> None:
    """JSON arrays as uploads are: their pixels in all against max_image_pixels, their count
    against max_batch and the model's kind, from the lists' lengths. Before, 16 MB of one-pixel
    images took 30 s and 1.3 GB to turn into arrays only to be refused (the wrong model)."""
    url = f"{server.url}/v1/classify-image"
    row = [0] * 100
    small = {"model": "digits", "images": [[row] * 100, [row] * 100]}
    assert httpx.post(url, json=small).status_code == 200
    big = {"model": "digits", "images": [[row] * 100, [row] * 100, [[0]]]}
    assert (
        "20,001 pixels in all, more than the 20,000"
        in openai_error(httpx.post(url, json=big), 400)["message"]
    )
    # a megabyte of JSON each: httpx's 5 s default ran out on a machine busy with other tests
    many = {"model": "digits", "images": [[[0]]] * 100_000}
    refused = openai_error(httpx.post(url, json=many, timeout=60), 400)
    assert "at most 32 items, got 100000" in refused["message"]
    wrong = {"model": "sst2", "images": [[[0]]] * 100_000}
    refused = openai_error(httpx.post(url, json=wrong, timeout=60), 400)
    assert "does not serve /v1/classify-image" in refused["message"]


def _image(kind: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (8, 8), 128).save(out, format=kind)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["EPS", "PPM", "PCX", "TGA", "SGI", "IM"])
def test_an_upload_of_a_format_training_does_not_read_is_refused(server: BackgroundServer, kind: str) -> None:
    """Pillow opens some 40 formats, each its own decoder, and hands an EPS to Ghostscript when
    it is installed: an upload is decoded only as one of the formats a training folder holds."""
    files = [("images", ("a.png", _image(kind), "image/png"))]
    r = httpx.post(f"{server.url}/v1/classify-image", data={"model": "digits"}, files=files)
    assert "(PNG, JPEG, BMP, GIF, WebP or TIFF)" in openai_error(r, 400)["message"]


def test_uploads_of_the_formats_training_reads_are_classified(server: BackgroundServer) -> None:
    kinds = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF")
    files = [("images", (f"{i}", _image(kind), "application/octet-stream")) for i, kind in enumerate(kinds)]
    r = httpx.post(f"{server.url}/v1/classify-image", data={"model": "digits"}, files=files)
    assert r.status_code == 200, r.text
    assert len(r.json()["predictions"]) == len(kinds)


# ------------------------------------------------------------------- the HTTP layer


def _raw(server: BackgroundServer, data: bytes, wait_s: float = 10) -> tuple[bytes, bool]:
    """Send ``data`` -> what came back, and whether the server closed the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            return out, False
        return out, True


def _json_answer(raw: bytes) -> tuple[int, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), raw
    return int(head.split()[1]), json.loads(body)


def test_a_request_head_over_its_size_is_431_before_it_is_all_read(server: BackgroundServer) -> None:
    """httptools buffers a head whole, joining its pieces on the event loop in quadratic time: a
    20 MB header held every other client for minutes."""
    for head in (
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n",
        b"GET /v1/models?" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(1000)) + b"\r\n",
    ):
        raw, closed = _raw(server, head)
        status, body = _json_answer(raw)
        assert status == 431 and closed and "over 4,096 bytes" in str(body)
    # a body is no part of the head, however large, nor is a request that follows on the connection
    body = json.dumps({"model": "sst2", "texts": ["a" * 1000] * 5}).encode()  # over 4,096 bytes
    request = (
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    raw, _ = _raw(server, request * 3 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.count(b"HTTP/1.1 200 OK") == 4, raw[:300]


def test_a_request_head_that_stops_arriving_is_408(server: BackgroundServer) -> None:
    started_at = time.monotonic()
    raw, closed = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
    status, body = _json_answer(raw)
    assert status == 408 and closed and time.monotonic() - started_at < 5
    assert set(body["error"]) == {"message", "type", "param", "code"}  # OpenAI's shape under /v1
    raw, closed = _raw(server, b"")  # a connection that never sends a byte
    assert _json_answer(raw)[0] == 408 and closed


def test_a_body_still_arriving_holds_no_batch(classifier_bundle: Path) -> None:
    """A batch forming waits up to max_wait_ms for the requests arriving; one counts as arriving once
    its body is read, not from its headers, when a client sending its body slowly (or never) held
    every batch, a lone request's too, for max_wait_ms."""
    head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 99\r\n\r\n"
    with (
        BackgroundServer({"sst2": classifier_bundle}, Settings(max_wait_ms=3000)) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as stalled,
    ):
        stalled.sendall(head + b'{"model": ')
        time.sleep(0.3)
        assert not any(server.served.arriving.values())
        started = time.monotonic()
        r = httpx.post(f"{server.url}/v1/classify", json={"model": "sst2", "texts": ["a fine film"]})
        assert r.status_code == 200 and time.monotonic() - started < 2  # not the 3 s a batch may wait
        assert not any(server.served.arriving.values())


def test_an_idle_connection_is_kept_for_keep_alive_seconds_then_closed(char_bundle: Path) -> None:
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with (
        BackgroundServer({"char": char_bundle}, Settings(keep_alive_s=2)) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as s,
    ):
        for pause in (0.0, 1.0):  # within the keep-alive: the connection serves the next request
            time.sleep(pause)
            s.sendall(health)
            assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
        idle_from = time.monotonic()
        assert s.recv(65536) == b""  # closed by the server
        assert 1.5 < time.monotonic() - idle_from < 4  # not uvicorn's 5 s


def test_a_request_that_is_not_http_gets_a_json_400(server: BackgroundServer) -> None:
    for data, shape in [
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: \x01\r\n\r\n", dict),
        (b"POST /v2/models/char/infer HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", str),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\0" * 64, str),  # TLS to a plain port
    ]:
        raw, closed = _raw(server, data)
        status, body = _json_answer(raw)
        assert status == 400 and closed and isinstance(body["error"], shape), body
    assert httpx.get(f"{server.url}/health").json()["live"]


# ------------------------------------------------------------------------- the server's own faults


def test_a_fault_of_the_servers_bundle_is_a_500_that_names_none_of_its_files(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A BundleError's message (its bundle's path on the server's disk) went to the client."""
    digits = server.served.models["digits"]

    def broken(feed: dict) -> dict:
        raise BundleError(f"{digits.path / 'model.onnx'} gave logits that are not finite")

    monkeypatch.setattr(digits, "infer", broken)
    pixels = np.zeros((1, *digits.input_shape), np.float32)
    body = {"inputs": [{"name": "pixel_values", "shape": list(pixels.shape), "datatype": "FP32"}]}
    body["inputs"][0]["data"] = pixels.ravel().tolist()
    r = httpx.post(f"{server.url}/v2/models/digits/infer", json=body)
    assert r.status_code == 500 and r.json() == {"error": "internal error: the server's log has the details"}
    assert str(digits.path) in caplog.text  # the operator's log has it


def test_a_request_body_that_stops_arriving_is_408(server: BackgroundServer) -> None:
    """A body declared and never sent was held for ever (2,000 such connections stayed open), each
    keeping every batch waiting for it as a request arriving; one that keeps arriving is read."""
    head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 100\r\n\r\n"
    started_at = time.monotonic()
    raw, closed = _raw(server, head + b"{")
    status, body = _json_answer(raw)
    assert status == 408 and closed and time.monotonic() - started_at < 5
    assert "the request body stopped arriving: no byte of it for 1 s" in body["error"]["message"]
    payload = json.dumps({"model": "sst2", "texts": ["a good film"]}).encode().ljust(1000)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head.replace(b"100", str(len(payload)).encode()) + payload[:200])
        for i in range(200, len(payload), 200):  # a piece every 0.3 s: 1.2 s in all, past the 1 s clock
            time.sleep(0.3)
            s.sendall(payload[i : i + 200])
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]


def _requests_by_status(server: BackgroundServer, route: str) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    pattern = rf'tfcompile_requests_total\{{route="{re.escape(route)}",status="(\d+)"\}} (\S+)'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text)}


@pytest.mark.parametrize(
    "route", ["/v2/models/{name}/infer", "/v1/classify-image", "/v1/classify", "/v1/completions"]
)
def test_a_body_cut_short_is_counted_as_its_clients_not_as_a_server_error(
    server: BackgroundServer, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A body that stopped arriving was answered 408, but the route then met the cut body: KServe's
    infer and classify-image logged an internal error with a traceback and /metrics counted a 500
    (the JSON routes a 400). A client that hangs up mid-body is counted as 499, logged as nothing."""
    head = f"POST {route.format(name='digits')} HTTP/1.1\r\nHost: x\r\n".encode()
    head += b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    before = _requests_by_status(server, route)
    raw, _ = _raw(server, head + b"{")
    assert _json_answer(raw)[0] == 408
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + b"{")
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while sum(_requests_by_status(server, route).values()) < sum(before.values()) + 2:
        assert time.monotonic() < deadline, _requests_by_status(server, route)
        time.sleep(0.05)
    after = _requests_by_status(server, route)
    assert {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)} == {
        "408": 1,
        "499": 1,
    }
    assert "internal error" not in caplog.text and "Traceback" not in caplog.text


def test_a_request_arriving_for_one_model_holds_no_batch_of_another(
    char_bundle: Path, classifier_bundle: Path
) -> None:
    """Requests arriving were counted for the whole server: a lone request for one model waited up
    to max_wait_ms (here 3 s) while another model's long prompt was tokenized."""
    from tfcompile.serve.app import Arrival

    with BackgroundServer(
        {"char": char_bundle, "sst2": classifier_bundle}, Settings(max_wait_ms=3000)
    ) as server:
        elsewhere = Arrival(server.served)
        elsewhere.read()  # a request's body is in, its model not named yet: it may join any batch
        assert server.served.arriving_for("sst2") == server.served.arriving_for("char") == 1
        elsewhere.aim("char")
        assert (server.served.arriving_for("sst2"), server.served.arriving_for("char")) == (0, 1)
        started = time.monotonic()
        r = httpx.post(f"{server.url}/v1/classify", json={"model": "sst2", "texts": ["a fine film"]})
        assert r.status_code == 200 and time.monotonic() - started < 2  # not the 3 s a batch may wait
        elsewhere.close()
        assert not any(server.served.arriving.values())


def test_a_request_body_that_trickles_is_408_once_its_first_clock_has_run(server: BackgroundServer) -> None:
    """A byte every half second never let the body's clock (1 s without a byte) run out: a few
    hundred such connections held every descriptor of the process, and its shutdown, for as long
    as their clients liked. Past its first second a body averages 240 bytes/s or is refused."""
    head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 100000\r\n\r\n"
    started_at = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + b"{")
        answer = b""
        while not answer and time.monotonic() - started_at < 10:
            time.sleep(0.5)
            try:
                s.sendall(b" ")
                s.settimeout(0.01)
                answer = s.recv(65536)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:  # the server closed it while we sent
                answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert re.search(rb"the request body is arriving at \d bytes/s, under 240 bytes/s", answer)
    assert time.monotonic() - started_at < 3
