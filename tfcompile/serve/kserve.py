"""The Open Inference Protocol (KServe v2, which Triton speaks too) for every bundle: health,
readiness, model metadata from the manifest, and ``infer`` on the main graph's tensors.

Tensors come as JSON (``data`` flat in row-major order, or nested) or in the binary tensor data
extension (the JSON header, then each input's raw little-endian bytes, as ``tritonclient`` sends
by default); answers are JSON. A text classifier also takes one BYTES input ``text`` (shape [N],
or [N, 2] for sentence pairs) and answers ``label`` (BYTES [N]) and ``probabilities`` (FP32 [N,
labels]).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tfcompile import __version__
from tfcompile.errors import InputError
from tfcompile.runtime import Classifier
from tfcompile.runtime.session import Bundle
from tfcompile.serve.app import Served, check_lengths, outcome
from tfcompile.serve.engine import Job

router = APIRouter(prefix="/v2")

DATATYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
OF_DTYPE = {"int64": "INT64", "float32": "FP32", "float16": "FP16"}
TEXT_INPUT = "text"
MAX_RANK = 32  # a tensor's axes, as deep as its nested data may go (numpy holds at most 64)


def served(request: Request) -> Served:
    return request.app.state.served


@router.get("")
async def server_metadata() -> dict:
    return {"name": "tfcompile", "version": __version__, "extensions": ["binary_tensor_data"]}


@router.get("/health/live")
async def live() -> dict:
    return {"live": True}


@router.get("/health/ready")
async def ready(request: Request) -> JSONResponse:
    is_ready = served(request).ready
    return JSONResponse({"ready": is_ready}, 200 if is_ready else 503)


@router.get("/models/{name}")
@router.get("/models/{name}/versions/{version}")
async def model_metadata(name: str, request: Request, version: str = "1") -> dict:
    model = _model(request, name, version)
    graph = model.graph(model.MAIN_GRAPH)
    return {
        "name": name,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [_tensor_metadata(t.name, t.dtype, t.shape) for t in graph.inputs],
        # The runtime gives float outputs as float32, an fp16 bundle's too (runtime.ort).
        "outputs": [
            _tensor_metadata(t.name, "float32" if t.dtype == "float16" else t.dtype, t.shape)
            for t in graph.outputs
        ],
    }


@router.get("/models/{name}/ready")
@router.get("/models/{name}/versions/{version}/ready")
async def model_ready(name: str, request: Request, version: str = "1") -> JSONResponse:
    _model(request, name, version)
    is_ready = served(request).ready and served(request).worker(name).ready.is_set()
    return JSONResponse({"name": name, "ready": is_ready}, 200 if is_ready else 503)


@router.post("/models/{name}/infer")
@router.post("/models/{name}/versions/{version}/infer")
async def infer(name: str, request: Request, version: str = "1") -> dict:
    model = _model(request, name, version)
    body, header_length = await request.body(), request.headers.get("inference-header-content-length")
    limit = served(request).settings.max_batch
    header, feed = await asyncio.to_thread(_read_feed, body, header_length, limit)  # megabytes: off the loop
    if isinstance(model, Classifier) and list(feed) == [TEXT_INPUT]:
        texts = _texts(feed[TEXT_INPUT])
        check_lengths(model, texts, TEXT_INPUT)
        predictions = await outcome(served(request).submit(request, name, Job("classify", texts)), request)
        labels = model.labels
        outputs = {
            "label": np.array([p.label for p in predictions], dtype=object),
            "probabilities": np.array(
                [[p.probabilities[k] for k in labels] for p in predictions], np.float32
            ),
        }
    else:
        outputs = await outcome(served(request).submit(request, name, Job("infer", [feed])), request)
    wanted = [o.get("name") for o in header.get("outputs") or []] or list(outputs)
    unknown = [w for w in wanted if w not in outputs]
    if unknown:
        raise InputError(f"the model {name!r} has no outputs {unknown}; it has {list(outputs)}")
    answer: dict[str, Any] = {
        "model_name": name,
        "model_version": "1",
        "outputs": [_output(w, outputs[w]) for w in wanted],
    }
    if "id" in header:
        answer["id"] = header["id"]
    return answer


def _model(request: Request, name: str, version: str) -> Bundle:
    model = served(request).worker(name, request).model
    if version != "1":
        raise InputError(f"the model {name!r} has one version, 1; asked for {version!r}")
    return model


def _tensor_metadata(name: str, dtype: str, shape: list[int | str]) -> dict:
    return {
        "name": name,
        "datatype": OF_DTYPE[dtype],
        "shape": [d if isinstance(d, int) else -1 for d in shape],
    }


def _read_feed(body: bytes, header_length: str | None, limit: int) -> tuple[dict, dict[str, np.ndarray]]:
    """The request's JSON header and its inputs as arrays by name. Each input's first axis is the
    batch: at most ``limit`` rows (the server's --max-batch-size, as on the task routes), checked
    on the shapes the request declares, before any of its values is read."""
    header, tensors = _read_request(body, header_length)
    shapes = {t["name"]: _shape(t) for t in header["inputs"]}
    rows = max(shape[0] if shape else 1 for shape in shapes.values())
    if rows > limit:
        raise InputError(f"a request may hold at most {limit} rows, got {rows}")
    return header, {t["name"]: _array(t, shapes[t["name"]], tensors.get(t["name"])) for t in header["inputs"]}


def _read_request(body: bytes, header_length: str | None) -> tuple[dict, dict[str, bytes]]:
    """The JSON header and, with the binary extension, each binary input's bytes by name."""
    if header_length is None:
        size = len(body)
    elif header_length.isascii() and header_length.isdigit() and int(header_length) <= len(body):
        size = int(header_length)
    else:
        raise InputError(
            f"Inference-Header-Content-Length {header_length!r} does not fit the {len(body)}-byte body"
        )
    try:
        header = json.loads(body[:size])
        json.dumps(header, ensure_ascii=False).encode("utf-8")  # no lone surrogate ("\\ud800")
    except (ValueError, RecursionError) as e:
        raise InputError(f"the request is not JSON: {e}") from None
    inputs = header.get("inputs") if isinstance(header, dict) else None
    if not isinstance(inputs, list) or not inputs or not all(isinstance(t, dict) for t in inputs):
        raise InputError('the request needs "inputs": a non-empty list of tensors')
    if not isinstance(header.get("outputs", []), list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in header.get("outputs") or []
    ):
        raise InputError('"outputs" must be a list of {"name": ...} objects')
    if not isinstance(header.get("id", ""), str):
        raise InputError(f'"id" must be a string, got {json.dumps(header["id"])[:40]}')
    names = [t.get("name") for t in inputs]
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise InputError(f"each input needs a distinct name, got {names}")
    tensors, offset = {}, size
    for tensor in inputs:
        parameters = tensor.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InputError(f"input {tensor['name']!r}: parameters must be an object, got {parameters!r}")
        length = parameters.get("binary_data_size")
        if length is None:
            continue
        if "data" in tensor:
            raise InputError(f"input {tensor['name']!r} has both data and binary_data_size: send one")
        if (
            header_length is None
            or not isinstance(length, int)
            or isinstance(length, bool)
            or length < 0
            or offset + length > len(body)
        ):
            raise InputError(
                f"input {tensor['name']!r}: binary_data_size {length!r} does not fit the request body"
            )
        tensors[tensor["name"]] = body[offset : offset + length]
        offset += length
    if offset != len(body):
        raise InputError(f"the request body has {len(body) - offset} bytes after its tensors")
    return header, tensors


def _shape(tensor: dict) -> list[int]:
    """A request tensor's shape: at most MAX_RANK sizes whose product (zeros left out, as numpy
    counts an empty array's room) is below 2^31."""
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or math.prod(d for d in shape if d) >= 2**31
    ):
        shown = f"{len(shape)} sizes" if isinstance(shape, list) and len(shape) > MAX_RANK else repr(shape)
        raise InputError(
            f"input {tensor['name']!r} needs a shape: a list of at most {MAX_RANK} sizes whose product "
            f"(zeros left out) is below 2^31, got {shown[:200]}"
        )
    return shape


def _array(tensor: dict, shape: list[int], raw: bytes | None) -> np.ndarray:
    """One request tensor as a numpy array of its (checked) shape and datatype."""
    name, datatype = tensor["name"], tensor.get("datatype")
    count = math.prod(shape)
    if datatype == "BYTES":
        items = _bytes_items(name, raw, count) if raw is not None else tensor.get("data")
        flat = _flat(name, items)
        if len(flat) != count or not all(isinstance(x, str | bytes) for x in flat):
            raise InputError(f"input {name!r} needs {count} strings for shape {shape}")
        texts = [x if isinstance(x, str) else _utf8(name, i, x) for i, x in enumerate(flat)]
        return np.array(texts, dtype=object).reshape(shape)
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InputError(
            f"input {name!r} has datatype {datatype!r}; this server takes {[*DATATYPES, 'BYTES']}"
        )
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if raw is not None:
        if len(raw) != count * dtype.itemsize:
            raise InputError(f"input {name!r}: {len(raw)} bytes is not {count} {datatype} values")
        return np.frombuffer(raw, dtype).reshape(shape)
    flat = _flat(name, tensor.get("data"))
    if len(flat) != count or not all(_of_kind(x, datatype) for x in flat):
        raise InputError(
            f"input {name!r} needs {count} {datatype} values for shape {shape}, got {len(flat)} values "
            f"({', '.join(sorted({type(x).__name__ for x in flat}))})"
        )
    try:
        return np.array(flat, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError) as e:
        raise InputError(f"input {name!r}: its data does not fit {datatype}: {e}") from None


def _of_kind(value: Any, datatype: str) -> bool:
    """Whether a JSON value is one of the datatype's: true or false for BOOL, an integer for the
    integer types (5.9 is not 5, nor true 1), a number for the floats."""
    if datatype == "BOOL" or isinstance(value, bool):
        return datatype == "BOOL" and isinstance(value, bool)
    return (
        isinstance(value, int)
        if np.issubdtype(DATATYPES[datatype], np.integer)
        else isinstance(value, int | float)
    )


def _flat(name: str, data: Any) -> list:
    """``data`` flat, whether sent flat or nested."""
    if not isinstance(data, list):
        raise InputError(f'input {name!r} needs its values in "data" (a list) or as binary data')
    out: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > MAX_RANK:
                    raise InputError(f"input {name!r} is nested too deeply")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _bytes_items(name: str, raw: bytes, count: int) -> list[bytes]:
    """The binary extension's BYTES: each element a little-endian uint32 length, then its bytes."""
    items: list[bytes] = []
    offset = 0
    while offset < len(raw) and len(items) <= count:
        if offset + 4 > len(raw):
            raise InputError(f"input {name!r}: its binary BYTES data ends inside a length")
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    if offset != len(raw):
        raise InputError(f"input {name!r}: its binary BYTES data does not hold {count} elements")
    return items


def _utf8(name: str, index: int, item: bytes) -> str:
    """A binary BYTES element as text: bytes that are not UTF-8 are refused, not replaced (the
    model would read another text than the one sent)."""
    try:
        return item.decode()
    except UnicodeDecodeError as e:
        raise InputError(f"input {name!r}[{index}] is not UTF-8 ({e.reason} at byte {e.start})") from None


def _texts(values: np.ndarray) -> list[str] | list[tuple[str, str]]:
    """The ``text`` input: shape [N] (or [N, 1]) of texts, or [N, 2] of sentence pairs."""
    if values.dtype != object:
        raise InputError(f"input {TEXT_INPUT!r} must be BYTES, got {_datatype(values.dtype)}")
    if values.size == 0:
        raise InputError(
            f"input {TEXT_INPUT!r} holds no texts (shape {list(values.shape)}): send one or more"
        )
    if values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1):
        return [str(v) for v in values.reshape(-1)]
    if values.ndim == 2 and values.shape[1] == 2:
        return [(str(a), str(b)) for a, b in values]
    raise InputError(f"input {TEXT_INPUT!r} must have shape [N] or [N, 2] (pairs), got {list(values.shape)}")


def _output(name: str, value: np.ndarray) -> dict:
    if value.dtype == object:
        return {
            "name": name,
            "datatype": "BYTES",
            "shape": list(value.shape),
            "data": value.reshape(-1).tolist(),
        }
    value = value.astype(np.float32) if np.issubdtype(value.dtype, np.floating) else value
    return {
        "name": name,
        "datatype": _datatype(value.dtype),
        "shape": list(value.shape),
        "data": value.reshape(-1).tolist(),
    }


def _datatype(dtype: np.dtype) -> str:
    return next(k for k, v in DATATYPES.items() if np.dtype(v) == dtype)
