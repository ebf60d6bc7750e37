"""The Open Inference Protocol's ``infer`` under hostile clients: each request that once got a
500 or was read as something it is not, answered with a 400 naming the input."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving import BackgroundServer


@pytest.fixture(scope="module")
def server(char_bundle: Path, classifier_bundle: Path) -> Iterator[BackgroundServer]:
    with BackgroundServer({"char": char_bundle, "sst2": classifier_bundle}) as s:
        yield s


def infer(server: BackgroundServer, model: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", content=json.dumps(body))


def binary(tensor: dict, data: bytes) -> tuple[bytes, dict[str, str]]:
    """One input in the binary tensor data extension -> the body and its header."""
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(data)}}]}).encode()
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def error(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize(
    "tensor",
    [
        {"name": "text", "shape": [1] * 65, "datatype": "BYTES", "data": ["a"]},
        {"name": "text", "shape": [0] * 100, "datatype": "BYTES", "data": []},
        {"name": "input_ids", "shape": [1] * 65, "datatype": "INT64", "data": [1]},
        {"name": "input_ids", "shape": [2**31 - 1] * 10_000, "datatype": "INT64", "data": []},
    ],
)
def test_a_shape_of_more_axes_than_a_tensor_may_have_is_a_400(server: BackgroundServer, tensor: dict) -> None:
    """numpy holds at most 64 axes (reshaping to more raised ValueError: a 500), and the element
    count of 10,000 sizes has more digits than Python turns into a string (a 500 too)."""
    assert "at most 32 sizes" in error(infer(server, "sst2", {"inputs": [tensor]}))


@pytest.mark.parametrize("shape", [[0], [0, 2], [0, 1]])
def test_a_text_input_of_no_texts_is_named_as_the_input(server: BackgroundServer, shape: list[int]) -> None:
    """It said "texts takes a string or a non-empty list": the name of /v1/classify's field."""
    tensor = {"name": "text", "shape": shape, "datatype": "BYTES", "data": []}
    assert f"input 'text' holds no texts (shape {shape})" in error(
        infer(server, "sst2", {"inputs": [tensor]})
    )


def test_a_binary_tensor_of_more_axes_than_a_tensor_may_have_is_a_400(server: BackgroundServer) -> None:
    body, headers = binary({"name": "input_ids", "shape": [1] * 65, "datatype": "INT64"}, b"\0" * 8)
    r = httpx.post(f"{server.url}/v2/models/char/infer", content=body, headers=headers)
    assert "at most 32 sizes" in error(r)


HUGE = [0, 2**31 - 1, 2**31 - 1, 2**31 - 1]  # no element, but more room than numpy can count


@pytest.mark.parametrize(
    ("model", "name", "datatype"), [("sst2", "text", "BYTES"), ("char", "input_ids", "INT64")]
)
def test_an_empty_tensor_of_huge_axes_is_a_400(
    server: BackgroundServer, model: str, name: str, datatype: str
) -> None:
    """An empty tensor whose other sizes multiply past what numpy can count: reshaping the empty
    data raised ValueError ("array is too big") from JSON BYTES and binary data alike, a 500."""
    tensor = {"name": name, "shape": HUGE, "datatype": datatype}
    assert "(zeros left out) is below 2^31" in error(
        infer(server, model, {"inputs": [{**tensor, "data": []}]})
    )
    body, headers = binary(tensor, b"")
    r = httpx.post(f"{server.url}/v2/models/{model}/infer", content=body, headers=headers)
    assert "(zeros left out) is below 2^31" in error(r)


def test_the_rows_are_counted_on_the_declared_shape_before_any_value_is_read(
    server: BackgroundServer,
) -> None:
    """16 MB of binary BYTES (4 million empty strings) took 7 s of the server's CPU to read only
    to be refused for its rows: the declared shape's rows are checked first."""
    data = struct.pack("<I", 0) * 100_000
    body, headers = binary({"name": "text", "shape": [100_000], "datatype": "BYTES"}, data)
    r = httpx.post(f"{server.url}/v2/models/sst2/infer", content=body, headers=headers)
    assert error(r) == "a request may hold at most 32 rows, got 100000"
    tensor = {"name": "text", "shape": [33, 2], "datatype": "BYTES", "data": [1]}  # values never read
    assert error(infer(server, "sst2", {"inputs": [tensor]})) == "a request may hold at most 32 rows, got 33"


@pytest.mark.parametrize(("datatype", "data"), [("FP32", [1.0]), ("INT64", [7]), ("BOOL", [True])])
def test_a_text_input_of_numbers_is_refused_not_read_as_their_digits(
    server: BackgroundServer, datatype: str, data: list
) -> None:
    """A classifier's ``text`` input of another datatype was classified as the text of its
    numbers ("1.0"), with a 200."""
    tensor = {"name": "text", "shape": [1], "datatype": datatype, "data": data}
    assert f"input 'text' must be BYTES, got {datatype}" in error(infer(server, "sst2", {"inputs": [tensor]}))


def test_binary_text_that_is_not_utf8_is_refused_not_replaced(server: BackgroundServer) -> None:
    """Bytes that are not UTF-8 were decoded with U+FFFD in their place: the model classified
    another text than the one sent."""
    items = [b"a gorgeous movie", b"caf\xe9"]  # Latin-1
    data = b"".join(struct.pack("<I", len(item)) + item for item in items)
    body, headers = binary({"name": "text", "shape": [2], "datatype": "BYTES"}, data)
    r = httpx.post(f"{server.url}/v2/models/sst2/infer", content=body, headers=headers)
    assert "input 'text'[1] is not UTF-8" in error(r)
    good = b"".join(struct.pack("<I", len(item)) + item for item in [items[0], "café".encode()])
    body, headers = binary({"name": "text", "shape": [2], "datatype": "BYTES"}, good)
    r = httpx.post(f"{server.url}/v2/models/sst2/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [
        p.label for p in server.served.models["sst2"].classify(["a gorgeous movie", "café"])
    ]


def test_request_fields_of_another_type_than_the_protocols_are_refused(server: BackgroundServer) -> None:
    """An ``id`` that is no string was echoed as sent; an input with both ``data`` and
    ``binary_data_size`` was read from its binary data, its ``data`` dropped unread; a
    binary_data_size of true was read as 1 byte."""
    ids = {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}
    mask = {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [1, 1]}
    r = infer(server, "char", {"id": {"run": 1}, "inputs": [ids, mask]})
    assert '"id" must be a string, got {"run": 1}' in error(r)  # as JSON writes it, not Python's type
    assert '"id" must be a string, got null' in error(
        infer(server, "char", {"id": None, "inputs": [ids, mask]})
    )
    assert infer(server, "char", {"id": "7", "inputs": [ids, mask]}).json()["id"] == "7"
    body, headers = binary(ids, struct.pack("<2q", 1, 2))
    r = httpx.post(f"{server.url}/v2/models/char/infer", content=body, headers=headers)
    assert "has both data and binary_data_size" in error(r)
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": True}}
    header = json.dumps({"inputs": [tensor]}).encode()
    r = httpx.post(
        f"{server.url}/v2/models/sst2/infer",
        content=header + b"a",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert "binary_data_size True does not fit" in error(r)
