"""Task routes in plain JSON: ``/v1/classify`` (texts or sentence pairs), ``/v1/translate``
(sources, beam size, length limit) and ``/v1/classify-image`` (PNG/JPEG uploads as
multipart/form-data, or pixel arrays as JSON). Each answers in the runtime's own terms: labels with
every label's probability, or translations. The pixels a request's uploads hold are counted from
their headers before any is decoded (a small PNG can hold a huge image)."""

from __future__ import annotations

import asyncio
import codecs
import io
import json
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request
from PIL import Image, PngImagePlugin
from pydantic import ConfigDict, Field, StrictInt, ValidationError, WithJsonSchema
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from tfcompile.errors import InputError
from tfcompile.images import FORMATS
from tfcompile.manifest import EarlyStopping
from tfcompile.runtime import Classifier, ImageClassifier, Translator, inputs
from tfcompile.runtime.classifier import Prediction
from tfcompile.runtime.session import Bundle
from tfcompile.serve.app import FieldError, RequestBody, Served, check_lengths, is_json, not_json, outcome
from tfcompile.serve.engine import Job

router = APIRouter(prefix="/v1")

# Texts are checked by the runtime's rule (inputs.texts) in the route, which names what a wrong value
# is ("texts takes a string or a non-empty list of strings, got []"); pydantic's union gave a message
# per branch, the first one "texts.str: Input should be a valid string" for a list. The schema
# still says what they take.
_STRING = {"type": "string"}
_PAIR = {"type": "array", "items": _STRING, "minItems": 2, "maxItems": 2}
Texts = Annotated[
    Any, WithJsonSchema({"anyOf": [_STRING, {"type": "array", "items": _STRING, "minItems": 1}]})
]
TextsOrPairs = Annotated[
    Any,
    WithJsonSchema(
        {"anyOf": [_STRING, {"type": "array", "items": {"anyOf": [_STRING, _PAIR]}, "minItems": 1}]}
    ),
]


class ClassifyRequest(RequestBody):
    model: str
    texts: TextsOrPairs


MAX_CODE = 64  # characters of a language code (NLLB's are 8)


class TranslateRequest(RequestBody):
    model_config = ConfigDict(strict=True)  # strict: true is not 1, nor "1" 1.0
    model: str
    texts: Texts
    beam: StrictInt | None = Field(
        None,
        ge=1,
        description="beam width; the manifest's default (at most the server's --max-beam) when left out",
    )
    max_len: StrictInt | None = Field(
        None,
        ge=1,
        description="target tokens at most; the manifest's default (at most the server's --max-tokens)",
    )
    source_language: Annotated[str, Field(max_length=MAX_CODE)] | None = Field(
        None, description="a multilingual translator's code for the sources' language (NLLB's deu_Latn)"
    )
    target_language: Annotated[str, Field(max_length=MAX_CODE)] | None = Field(
        None, description="its code for the language to translate into; the bundle's where left out"
    )
    length_penalty: float | None = Field(
        None, description="beam search's length penalty (the bundle's beam_scoring's); the manifest's default"
    )
    early_stopping: EarlyStopping | None = Field(
        None, description="true, false or \"never\" (transformers' beam search alone); the manifest's default"
    )


class ImagesRequest(RequestBody):
    model: str
    images: Annotated[list[list[Any]], Field(min_length=1, fail_fast=True)] = Field(
        description="images as (height, width) or (height, width, channels) arrays: 0-255 "
        "integers or 0-1 floats"
    )


def served(request: Request) -> Served:
    return request.app.state.served


def _model(request: Request, name: str, kind: type[Bundle], route: str) -> Bundle:
    model = served(request).worker(name, request).model
    if not isinstance(model, kind):
        raise InputError(f"the model {name!r} does not serve {route}: it is a {type(model).__name__}")
    return model


def _rows(request: Request, count: int) -> None:
    limit = served(request).settings.max_batch
    if count > limit:
        raise InputError(f"a request may hold at most {limit} items, got {count}")


def _predictions(name: str, predictions: list[Prediction]) -> dict:
    return {
        "model": name,
        "predictions": [{"label": p.label, "probabilities": p.probabilities} for p in predictions],
    }


@router.post("/classify")
async def classify(body: ClassifyRequest, request: Request) -> dict:
    model = _model(request, body.model, Classifier, "/v1/classify")
    texts = inputs.texts("texts", body.texts, pairs=True)
    _rows(request, len(texts))
    check_lengths(model, texts, "texts")
    job = served(request).submit(request, body.model, Job("classify", texts))
    return _predictions(body.model, await outcome(job, request))


@router.post("/translate")
async def translate(body: TranslateRequest, request: Request) -> dict:
    model = _model(request, body.model, Translator, "/v1/translate")
    assert isinstance(model, Translator)
    s = served(request).settings
    texts = inputs.texts("texts", body.texts)
    _rows(request, len(texts))
    check_lengths(model, texts, "texts")
    # The manifest's defaults within the server's limits; what a request names is held to them, its
    # max_len after the cut to the context that decoding makes anyway.
    beam = min(model.translation.beam, s.max_beam) if body.beam is None else body.beam
    max_len = model.decode_limit(body.max_len)
    max_len = min(max_len, s.max_tokens) if body.max_len is None else max_len
    if beam > s.max_beam:
        raise FieldError("beam", f"beam may be at most {s.max_beam}, got {beam}")
    if max_len > s.max_tokens:
        asked = "" if body.max_len == max_len else f" (asked {body.max_len}, cut to the context)"
        raise FieldError("max_len", f"max_len may be at most {s.max_tokens}, got {max_len}{asked}")
    model.framing(body.source_language, body.target_language)  # a code it cannot take: a 400 now
    model.scoring(body.length_penalty, body.early_stopping)  # and a bad scoring option
    options = (
        beam,
        max_len,
        body.source_language,
        body.target_language,
        body.length_penalty,
        body.early_stopping,
    )
    job = served(request).submit(request, body.model, Job("translate", texts, options=options))
    return {"model": body.model, "translations": await outcome(job, request, watch=True)}


@router.post("/classify-image")
async def classify_image(request: Request) -> dict:
    """multipart/form-data with a ``model`` field and one or more ``images`` files, or JSON
    ``{"model": ..., "images": [array, ...]}``. Never a path: the server reads no files."""
    images: list[bytes] | list[np.ndarray]
    if request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        name, images = await _uploads(request)
        _model(request, name, ImageClassifier, "/v1/classify-image")
        _rows(request, len(images))
        await asyncio.to_thread(_check_pixels, images, served(request).settings.max_image_pixels)
    elif not is_json(request):
        raise HTTPException(415, f'{not_json(request)}; or multipart/form-data with "images" files')
    else:  # off the event loop, and the cheap checks before any array is made
        name, arrays = await asyncio.to_thread(_images_request, await request.body())
        _model(request, name, ImageClassifier, "/v1/classify-image")
        _rows(request, len(arrays))
        most = served(request).settings.max_image_pixels
        images = await asyncio.to_thread(_arrays, arrays, most)
    job = served(request).submit(request, name, Job("classify_images", images))
    return _predictions(name, await outcome(job, request))


async def _uploads(request: Request) -> tuple[str, list[bytes]]:
    limit = served(request).settings.max_batch
    async with request.form(max_files=limit, max_fields=8) as form:
        name = form.get("model")
        files = form.getlist("images")
        if not isinstance(name, str) or not name:
            raise InputError('the form needs a "model" field naming the model')
        if not files or not all(isinstance(f, UploadFile) for f in files):
            raise InputError('the form needs one or more "images" files (PNG, JPEG, ...)')
        images = [await f.read() for f in files if isinstance(f, UploadFile)]
    return name, images


def _check_pixels(images: list[bytes], most: int) -> None:
    """Uploads of more than ``most`` pixels in all, by their headers, are refused (off the event
    loop: Pillow reads a PNG's text chunks as it opens the file)."""
    pixels = sum(map(_pixels, images))
    if pixels > most:
        raise InputError(
            f"the uploaded images hold {pixels:,} pixels in all, more than the {most:,} a request may"
        )


def bound_png_text() -> None:
    """Pillow inflates a PNG's text chunks (never read here) as it opens the file, up to 1 MiB
    each and 64 MiB in all: 2 MB of uploads held the server's cores for 20 s. The server's process
    (Pillow's setting is the process's) lets a file's text chunks take 1 MiB in all; a PNG of more
    is refused as unreadable."""
    PngImagePlugin.MAX_TEXT_MEMORY = PngImagePlugin.MAX_TEXT_CHUNK


def _pixels(image: bytes) -> int:
    """An image file's pixels, from its header; 0 for a file Pillow cannot open, which the model's
    worker refuses with the reason."""
    try:
        with Image.open(io.BytesIO(image), formats=FORMATS) as opened:
            return opened.width * opened.height
    except Exception:
        return 0


def _images_request(body: bytes) -> tuple[str, list[list[Any]]]:
    """The JSON request's model name and images, as nested lists."""
    try:
        request = ImagesRequest.model_validate_json(body.removeprefix(codecs.BOM_UTF8))  # as json.loads
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(
            f"{where + ': ' if where else ''}{first['msg']}; send JSON "
            f'{{"model": ..., "images": [array, ...]}}, or multipart/form-data with a "model" field '
            f'and "images" files'
        ) from None
    return request.model, request.images


def _arrays(images: list[list[Any]], most: int) -> list[np.ndarray]:
    """Each image (nested lists) as an array; refused: more than ``most`` pixels in all, counted
    from the lists' lengths before any array is made."""
    pixels = sum(
        len(image) * (len(image[0]) if isinstance(image[0], list) else 1) for image in images if image
    )
    if pixels > most:
        raise InputError(f"the images hold {pixels:,} pixels in all, more than the {most:,} a request may")
    arrays = []
    for i, image in enumerate(images):
        array = inputs.array(f"images[{i}]", image)
        if np.issubdtype(array.dtype, np.integer):
            if array.size and (array.min() < 0 or array.max() > 255):
                raise InputError(f"images[{i}] holds integers outside 0-255")
            array = array.astype(np.uint8)
        elif np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32)
        else:
            raise InputError(f"images[{i}] must hold numbers, got {json.dumps(image)[:60]}")
        arrays.append(array)
    return arrays
