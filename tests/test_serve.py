"""tfcompile serve, through clients nobody here wrote: the official ``openai`` package for
completions (streamed and whole), ``tritonclient.http`` for the Open Inference Protocol, and
``httpx`` for the task routes, limits, authentication and error shapes. What comes back must
equal tfcompile.runtime's answer for the same input and seed."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import numpy as np
import pytest
from helpers import ROOT
from serving import BackgroundServer
from tokenizers import decoders
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tfcompile.errors import UserError
from tfcompile.runtime import LanguageModel
from tfcompile.serve import Served, Settings, load_models, server_config
from tfcompile.serve.engine import Finished, Job
from tfcompile.serve.openai import Answer, EventStream, _stream

openai = pytest.importorskip("openai")
httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak.", "a"]
TEXTS = ["a gorgeous, witty, seductive movie.", "dull", "the plot is thin , the acting wooden"]
SOURCES = ["Ein Hund rennt über eine Wiese.", "Eine Frau."]


@pytest.fixture(scope="module")
def server(char_bundle: Path, classifier_bundle: Path) -> Iterator[BackgroundServer]:
    bundles = {"char": char_bundle, "sst2": classifier_bundle}
    with BackgroundServer(bundles, Settings(max_wait_ms=5, max_tokens=100_000)) as s:
        yield s


@pytest.fixture(scope="module")
def second(translator_bundle: Path, image_bundle: Path) -> Iterator[BackgroundServer]:
    """The translator and the ViT (slow to build, so their tests are marked slow)."""
    with BackgroundServer({"de-en": translator_bundle, "digits": image_bundle}) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Any:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, _strict_response_validation=True
    )


@pytest.fixture(scope="module")
def streaming(server: BackgroundServer) -> Any:
    """A client for streams: the package types a chunk's finish_reason as never null, which its
    strict validation enforces, while OpenAI's own streams send null until a choice ends."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def model(server: BackgroundServer, name: str) -> Any:
    return server.served.models[name]


def new_text(lm: LanguageModel, prompt: str, **options: Any) -> str:
    """What the runtime generates after ``prompt``."""
    full = lm.generate_text(prompt, **options)
    assert isinstance(full, str)
    return full[len(prompt) :]


# ----------------------------------------------------------------------- OpenAI completions


def test_models_are_listed(client: Any) -> None:
    assert sorted(m.id for m in client.models.list().data) == ["char", "sst2"]
    assert client.models.retrieve("char").id == "char"


def test_greedy_completions_are_the_runtimes(server: BackgroundServer, client: Any) -> None:
    lm = model(server, "char")
    for prompt in PROMPTS:
        r = client.completions.create(model="char", prompt=prompt, max_tokens=12, temperature=0)
        assert r.choices[0].text == new_text(lm, prompt, max_new_tokens=12, temperature=0)
        assert r.choices[0].finish_reason == "length"
        prompt_tokens = len(lm.encode([prompt])[0].ids)
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_tokens, 12)


def test_seeded_samples_are_the_runtimes_row_by_row(server: BackgroundServer, client: Any) -> None:
    """Choice i (prompt i // n, sample i % n) draws with seed + i, as the runtime's row i does."""
    lm = model(server, "char")
    options = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 7}
    r = client.completions.create(
        model="char",
        prompt=PROMPTS[:2],
        n=2,
        max_tokens=10,
        extra_body={"top_k": 20},
        **{k: v for k, v in options.items() if k != "top_k"},
    )
    rows = [p for p in PROMPTS[:2] for _ in range(2)]
    expected = lm.generate_text(rows, 10, **options)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [e[len(p) :] for e, p in zip(expected, rows, strict=True)]
    assert r.choices[0].text != r.choices[1].text  # two samples of one prompt differ


def test_min_p_is_the_runtimes(server: BackgroundServer, client: Any) -> None:
    """vLLM's min_p (an extra field of the request): the runtime's seeded draws under the same
    min_p, which differ from those without it; one outside [0, 1] is refused."""
    lm = model(server, "char")
    texts = []
    for extra in ({}, {"min_p": 0.9}):
        r = client.completions.create(
            model="char", prompt=PROMPTS[:2], max_tokens=16, temperature=1.2, seed=3, extra_body=extra
        )
        expected = lm.generate_text(PROMPTS[:2], 16, temperature=1.2, seed=3, min_p=extra.get("min_p"))
        assert [c.text for c in r.choices] == [
            e[len(p) :] for e, p in zip(expected, PROMPTS[:2], strict=True)
        ]
        texts.append(expected)
    assert texts[0] != texts[1]
    bad = httpx.post(f"{server.url}/v1/completions", json={"model": "char", "prompt": "a", "min_p": 1.5})
    assert bad.status_code == 400 and "min_p" in bad.text


def test_a_repetition_penalty_is_the_runtimes(server: BackgroundServer, client: Any) -> None:
    """vLLM's repetition_penalty (an extra field of the request): the runtime's greedy text under
    the same penalty, which differs from the plain one."""
    lm = model(server, "char")
    r = client.completions.create(
        model="char", prompt=PROMPTS[:2], max_tokens=20, temperature=0, extra_body={"repetition_penalty": 1.8}
    )
    expected = [
        new_text(lm, p, max_new_tokens=20, temperature=0, repetition_penalty=1.8) for p in PROMPTS[:2]
    ]
    assert [c.text for c in r.choices] == expected
    assert expected != [new_text(lm, p, max_new_tokens=20, temperature=0) for p in PROMPTS[:2]]


def test_min_tokens_is_the_runtimes_min_new_tokens(char_bundle: Path, tmp_path: Path) -> None:
    """vLLM's min_tokens (an extra field of the request): the runtime's greedy text under the same
    min_new_tokens, which keeps a stop token from ending the text before it; here the stop token
    is the first one greedy generation chooses, so that without min_tokens the text is empty."""
    import shutil

    from tfcompile.runtime import load

    bundle = shutil.copytree(char_bundle, tmp_path / "stops")
    plain = load(char_bundle)
    assert isinstance(plain, LanguageModel)
    first = int(plain.generate(np.array([plain.encode(["ROMEO:"])[0].ids]), 1, temperature=0)[0, -1])
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["generation"]["stop_token_ids"] = [first]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with BackgroundServer({"stops": bundle}, Settings(max_wait_ms=5)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        lm = model(server, "stops")
        texts = []
        for extra in ({}, {"min_tokens": 6}):
            r = client.completions.create(
                model="stops", prompt="ROMEO:", max_tokens=20, temperature=0, extra_body=extra
            )
            expected = new_text(
                lm, "ROMEO:", max_new_tokens=20, temperature=0, min_new_tokens=extra.get("min_tokens")
            )
            assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
            texts.append(expected)
        assert texts[0] == "" and len(texts[1]) >= 6
        bad = httpx.post(
            f"{server.url}/v1/completions", json={"model": "stops", "prompt": "a", "min_tokens": -1}
        )
        assert bad.status_code == 400 and "min_tokens" in bad.text


def test_a_stream_is_the_whole_answer_in_pieces(client: Any, streaming: Any) -> None:
    whole = client.completions.create(model="char", prompt=PROMPTS, max_tokens=15, temperature=0, echo=True)
    chunks = list(
        streaming.completions.create(
            model="char",
            prompt=PROMPTS,
            max_tokens=15,
            temperature=0,
            echo=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {i: "" for i in range(len(PROMPTS))}
    reasons = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            reasons[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(len(PROMPTS))] == [c.text for c in whole.choices]
    assert whole.choices[0].text.startswith(PROMPTS[0])  # echo
    assert reasons == {i: "length" for i in range(len(PROMPTS))}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_stop_strings_end_a_choice_before_them_streamed_or_not(
    server: BackgroundServer, client: Any, streaming: Any
) -> None:
    lm = model(server, "char")
    greedy = new_text(lm, PROMPTS[0], max_new_tokens=20, temperature=0)
    stop = greedy[6:8]  # a two-character stop string inside the greedy continuation
    cut = greedy[: greedy.find(stop)]
    r = client.completions.create(
        model="char", prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=[stop, "\x00"]
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
    assert r.usage.completion_tokens < 20  # generation ended at the stop string
    streamed = streaming.completions.create(
        model="char", prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=stop, stream=True
    )
    pieces = [(c.choices[0].text, c.choices[0].finish_reason) for c in streamed]
    assert "".join(text for text, _ in pieces) == cut and pieces[-1][1] == "stop"


def test_a_streamed_choice_with_stop_strings_decodes_its_text_once_a_token_in_the_stream(
    server: BackgroundServer, streaming: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each token's text is decoded whole (the tokens decode together), so each decode more a token
    costs the length of the text: the stream decoded it three times, the worker once more."""
    lm = model(server, "char")
    calls = []
    decode = type(lm).decode_ids

    def counted(self: Any, rows: Any) -> list[str]:
        calls.append(len(rows[0]))
        return decode(self, rows)

    monkeypatch.setattr(type(lm), "decode_ids", counted)
    streamed = streaming.completions.create(
        model="char", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=["\x00", "\x01"], stream=True
    )
    finish = [c.choices[0].finish_reason for c in streamed][-1]
    assert finish == "length" and len(calls) <= 2 * 16 + 2  # the worker's and the stream's, then the end


class ByteFallbackAnswer:
    """What _stream reads of an Answer: one choice without stop strings, its tokens decoded as
    LLaMA's SentencePiece tokenizer decodes them (a character's bytes as <0x..> tokens)."""

    pieces = ("\u2581a", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "\u2581b")
    decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    rows = (SimpleNamespace(stop_texts=()),)
    echo = include_usage = False

    def text(self, i: int, tokens: list[int]) -> tuple[str, bool]:
        return str(self.decoder.decode([self.pieces[t] for t in tokens])), False

    def chunk(self, i: int, text: str, reason: str | None) -> str:
        return text


def test_a_stream_sends_a_character_split_over_byte_tokens_once_it_is_whole() -> None:
    """Two of an emoji's four byte tokens decode as two U+FFFD: one was held back, one sent, and
    the emoji never reached the client (its text went "a\ufffd", then nothing)."""

    async def streamed() -> list[str]:
        job = Job("generate", [], stream=True)
        tokens = list(range(len(ByteFallbackAnswer.pieces)))
        for token in tokens:
            job.events.put_nowait((0, token))
        job.events.put_nowait(None)
        job.result.set_result([Finished(tokens, "length")])
        return [c async for c in _stream(cast(Answer, ByteFallbackAnswer()), job) if c != "data: [DONE]\n\n"]

    chunks = asyncio.run(streamed())
    assert "".join(chunks) == "a\U0001f600 b" and all("\ufffd" not in c for c in chunks)


def _sentencepiece(tokenizer: dict) -> None:
    """The char bundle's tokenizer as LLaMA's reads and writes text: a space is the token "\u2581",
    and the decoder strips the text's first space."""
    vocab = tokenizer["model"]["vocab"]
    vocab["\u2581"] = vocab.pop(" ")
    tokenizer["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    tokenizer["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }


def test_a_continuation_keeps_the_space_a_sentencepiece_decoder_strips_from_a_texts_start(
    char_bundle: Path, tmp_path: Path
) -> None:
    """Decoded on its own, a continuation that starts a word lost its space (LLaMA's decoder
    strips a text's first one), and a stop string at its start went unseen: the text, the
    stream, echo and stop strings all read it after the prompt, as the runtime does."""
    from helpers import damaged, edited_tokenizer

    from tfcompile.runtime import load

    bundle = damaged(
        char_bundle, tmp_path, **{"tokenizer.json": edited_tokenizer(char_bundle, _sentencepiece)}
    )
    lm = load(bundle)
    assert isinstance(lm, LanguageModel) and lm.tokenizer is not None
    space, prompt = lm.tokenizer.token_to_id("\u2581"), "ROMEO:"
    ids = [lm.encode([prompt])[0].ids]
    seed = next(s for s in range(200) if lm.generate(ids, 1, temperature=1.0, seed=s)[0, -1] == space)
    expected = new_text(lm, prompt, max_new_tokens=8, temperature=1.0, seed=seed)
    assert expected.startswith(" ")
    body = {"model": "sp", "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": seed}
    with BackgroundServer({"sp": bundle}, Settings(max_wait_ms=5)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        assert client.completions.create(**body).choices[0].text == expected
        assert client.completions.create(**body, echo=True).choices[0].text == prompt + expected
        streamed = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        chunks = streamed.completions.create(**body, stream=True)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
        stopped = client.completions.create(**body, stop=[" "]).choices[0]
        assert (stopped.text, stopped.finish_reason) == ("", "stop")


def test_a_continuation_is_decoded_after_whole_characters_of_its_prompt() -> None:
    """LLaMA's byte-fallback tokens (a character its vocabulary lacks is its UTF-8 bytes, <0x..>
    tokens, a run of which that is not UTF-8 decodes as a U+FFFD a byte): the prompt's last tokens
    that text_of decodes before the new ones reach back to a character's start and past special
    tokens, and a character the prompt ends inside is the new text's. Before, a window that began
    inside a character garbled the continuation's characters of the same run."""
    from tokenizers import Tokenizer, models, normalizers

    from tfcompile.serve.engine import text_of

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {c: 259 + i for i, c in enumerate("\u2581abcdx")}
    tokenizer = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = ByteFallbackAnswer.decoder
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    model = cast(
        LanguageModel,
        SimpleNamespace(
            decode_ids=lambda rows: tokenizer.decode_batch([list(r) for r in rows]),
            generation=SimpleNamespace(stop_token_ids=[2]),
        ),
    )

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text).ids)

    zh, emoji = ids("中"), ids("\U0001f600")
    assert len(zh) == 3 and len(emoji) == 4  # each byte a token
    cases = [
        (ids("ab"), ids(" cd"), " cd"),  # the space SentencePiece's decoder strips from a text's start
        ([], ids(" cd"), "cd"),
        (ids("x") + [1] * 9, ids(" cd"), " cd"),  # the last 8 tokens decode to nothing
        (ids("a") + zh * 3, zh + ids(" c"), "中 c"),  # the last 8 begin inside a character
        (ids("ab") + emoji[:2], emoji[2:] + ids(" c"), "\U0001f600 c"),  # the prompt ends inside one
        (ids("ab") + emoji * 2 + emoji[:1], emoji[1:] + ids(" c"), "\U0001f600 c"),
        (ids("ab") + emoji[:2], emoji[2:3], "\ufffd"),  # still unfinished: the stream holds it back
        ([*ids("ab"), 3 + 0xFF], ids(" c"), " c"),  # a byte that is no UTF-8 stays the prompt's
    ]
    for prompt, new, expected in cases:
        assert text_of(model, prompt, [*new, 2]) == expected, (prompt, new)


def test_prompts_as_token_ids(server: BackgroundServer, client: Any) -> None:
    lm = model(server, "char")
    ids = [e.ids for e in lm.encode(PROMPTS[:2])]
    by_ids = client.completions.create(model="char", prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model="char", prompt=PROMPTS[:2], max_tokens=6, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    one = client.completions.create(model="char", prompt=ids[0], max_tokens=6, temperature=0)
    assert one.choices[0].text == by_text.choices[0].text


@pytest.mark.parametrize(
    ("request_body", "status", "needle"),
    [
        ({"model": "nope", "prompt": "a"}, 404, "does not exist"),
        ({"model": "sst2", "prompt": "a"}, 400, "not a language model"),
        ({"model": "char", "prompt": "a", "max_tokens": 1_000_000}, 400, "max_tokens may be at most"),
        ({"model": "char", "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "char", "prompt": "a", "max_tokens": True}, 400, "max_tokens"),
        ({"model": "char", "prompt": "a", "logprobs": 2}, 400, "logprobs"),
        ({"model": "char", "prompt": "a", "best_of": 3}, 400, "best_of"),
        ({"model": "char", "prompt": "a", "best_of": True}, 400, "takes a number, not true"),
        ({"model": "char", "prompt": "a", "logprobs": False}, 400, "takes a number, not false"),
        ({"model": "char", "prompt": "a", "logprobs": 10**30}, 400, "logprobs: a 31-digit number is past"),
        ({"model": "char", "prompt": "a", "presence_penalty": False}, 400, "takes a number, not false"),
        ({"model": "char", "prompt": "a", "frequency_penalty": 0.5}, 400, "frequency_penalty"),
        ({"model": "char", "prompt": "a", "colour": "blue"}, 400, "colour"),
        ({"model": "char", "prompt": "a", "temperature": -1}, 400, "temperature"),
        ({"model": "char", "prompt": "a", "repetition_penalty": 0}, 400, "repetition_penalty"),
        ({"model": "char", "prompt": "a", "repetition_penalty": 1e9}, 400, "repetition_penalty"),
        ({"model": "char", "prompt": "a", "n": 10_000}, 400, "at most"),
        ({"model": "char", "prompt": "x" * 65}, 400, "65 characters, more than the 64"),
        ({"model": "char", "prompt": [1] * 65}, 400, "65 tokens, more than the 64"),
        ({"model": "char", "prompt": "¿qué?"}, 400, "outside the bundle's vocabulary"),
        ({"model": "char", "prompt": [5, 10_000]}, 400, "outside the vocabulary"),
        ({"model": "char", "prompt": []}, 400, "prompt"),
        ({"model": "char", "prompt": "a", "stop": [""]}, 400, "stop must be a string or a list of at most 4"),
        ({"model": "char", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ],
)
def test_bad_completion_requests_get_openai_errors(
    server: BackgroundServer, request_body: dict, status: int, needle: str
) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json=request_body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_a_prompt_outside_the_vocabulary_is_named_as_the_param(server: BackgroundServer) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "char", "prompt": "a\u0000b"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt", error
    assert "outside the bundle's vocabulary" in error["message"]


def test_a_body_that_is_not_json_names_no_parameter(server: BackgroundServer) -> None:
    r = httpx.post(
        f"{server.url}/v1/completions",
        content=b'{"model": "char",',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith("the body is not valid JSON") and error["param"] is None


def test_usage_counts_each_prompt_once_however_many_choices(client: Any) -> None:
    one = client.completions.create(model="char", prompt=["ROMEO:", "JULIET: O"], max_tokens=2, n=1)
    three = client.completions.create(model="char", prompt=["ROMEO:", "JULIET: O"], max_tokens=2, n=3)
    assert one.usage.prompt_tokens == three.usage.prompt_tokens == len("ROMEO:") + len("JULIET: O")


def test_the_openai_client_raises_its_own_errors(client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="a")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="char", prompt="a", max_tokens=-3)
    assert bad.value.param == "max_tokens"


# --------------------------------------------------------------- Open Inference Protocol


@pytest.fixture(scope="module")
def triton(server: BackgroundServer) -> Any:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")


def test_health_and_metadata_come_from_the_manifests(server: BackgroundServer, triton: Any) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("char") and not triton.is_model_ready("nope")
    for name, bundle in server.served.models.items():
        meta = triton.get_model_metadata(name)
        graph = bundle.graph(bundle.MAIN_GRAPH)
        assert [i["name"] for i in meta["inputs"]] == [t.name for t in graph.inputs]
        assert [o["name"] for o in meta["outputs"]] == [t.name for t in graph.outputs]
        assert all(d == -1 or isinstance(d, int) for i in meta["inputs"] for d in i["shape"])


def test_head_is_answered_as_get_without_the_body(server: BackgroundServer) -> None:
    """Load balancers and uptime checks send HEAD: FastAPI's GET routes answered it 405."""
    for path in ("/health", "/v2/health/ready", "/v2/models/char", "/v1/models", "/metrics"):
        got, head = httpx.get(f"{server.url}{path}"), httpx.head(f"{server.url}{path}")
        assert (head.status_code, head.content) == (200, b""), path
        assert head.headers["content-type"] == got.headers["content-type"], path
    assert httpx.head(f"{server.url}/v2/models/nope").status_code == 404
    assert httpx.head(f"{server.url}/v1/completions").status_code == 405


@pytest.mark.parametrize("binary", [True, False])
def test_infer_gives_the_runtimes_logits(server: BackgroundServer, triton: Any, binary: bool) -> None:
    lm = model(server, "char")
    ids = np.array([[5, 6, 7, 8], [9, 10, 0, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=np.int64)
    inputs = [
        httpclient.InferInput("input_ids", [2, 4], "INT64"),
        httpclient.InferInput("attention_mask", [2, 4], "INT64"),
    ]
    inputs[0].set_data_from_numpy(ids, binary_data=binary)
    inputs[1].set_data_from_numpy(mask, binary_data=binary)
    result = triton.infer("char", inputs)
    np.testing.assert_array_equal(result.as_numpy("logits"), lm.logits(ids, mask))


def test_infer_takes_text_for_a_text_classifier(server: BackgroundServer, triton: Any) -> None:
    clf = model(server, "sst2")
    text = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array(TEXTS, dtype=object))
    result = triton.infer(
        "sst2",
        [text],
        outputs=[httpclient.InferRequestedOutput("label"), httpclient.InferRequestedOutput("probabilities")],
    )
    expected = clf.classify(TEXTS)
    assert [label.decode() if isinstance(label, bytes) else label for label in result.as_numpy("label")] == [
        p.label for p in expected
    ]
    np.testing.assert_allclose(
        result.as_numpy("probabilities"),
        [[p.probabilities[k] for k in clf.labels] for p in expected],
        atol=1e-6,
    )


@pytest.mark.slow
def test_infer_takes_pixels_for_an_image_classifier(second: BackgroundServer) -> None:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{second.port}")
    vit = model(second, "digits")
    pixels = np.random.default_rng(0).random((3, *vit.input_shape), dtype=np.float32)
    x = httpclient.InferInput("pixel_values", list(pixels.shape), "FP32")
    x.set_data_from_numpy(pixels)
    np.testing.assert_array_equal(triton.infer("digits", [x]).as_numpy("logits"), vit.logits(pixels))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]},
            "takes the inputs",
        ),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2]},
                    {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 1]},
                ]
            },
            "needs 3 INT64 values",
        ),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 99999]},
                    {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [1, 1]},
                ]
            },
            "outside the vocabulary",
        ),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
                    {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 1]},
                ]
            },
            "shape",
        ),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2]},
                    {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [1, 1]},
                ]
            },
            "integer token ids",
        ),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
                    {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
                ]
            },
            "0 and 1",
        ),
        (
            {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "COMPLEX", "data": [1, 2]}]},
            "datatype",
        ),
        ({"inputs": []}, "inputs"),
        ({"inputs": "nope"}, "inputs"),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [[1], [2, [3]]]}
                ]
            },
            "needs 2 INT64 values",
        ),
        (
            {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
            "takes the inputs",
        ),
        ({"inputs": [{"name": "text", "shape": [1], "datatype": [], "data": ["a"]}]}, "datatype"),
        (
            {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [5.9, 6]},
                    {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [True, 1]},
                ]
            },
            "needs 2 INT64 values for shape [1, 2], got 2 values (float, int)",
        ),
        (
            {
                "inputs": [{"name": "input_ids", "shape": [1], "datatype": "INT64", "data": [1]}],
                "outputs": [{"name": ["logits"]}],
            },
            '"outputs" must be a list',
        ),
        (
            {
                "inputs": [
                    {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"], "parameters": [1]}
                ]
            },
            "parameters must be an object",
        ),
        ({"inputs": [{"name": "text", "shape": [0, 10**30], "datatype": "BYTES", "data": []}]}, "below 2^31"),
        (
            {"id": "\ud800", "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
            "JSON",
        ),
    ],
)
def test_bad_infer_requests_get_kserve_errors(server: BackgroundServer, body: dict, needle: str) -> None:
    r = httpx.post(f"{server.url}/v2/models/char/infer", content=json.dumps(body))
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


def test_infer_bodies_a_parser_cannot_take_are_400s_and_the_connection_lives(
    server: BackgroundServer,
) -> None:
    url = f"{server.url}/v2/models/char/infer"
    with httpx.Client() as client:
        deep = client.post(url, content=b'{"inputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        assert deep.status_code == 400 and "not JSON" in deep.json()["error"]
        # "²" is a digit to str.isdigit(), not to int()
        odd = client.post(
            url, content=b"{}", headers={"Inference-Header-Content-Length": "\u00b2".encode("latin-1")}
        )
        assert odd.status_code == 400 and "Inference-Header-Content-Length" in odd.json()["error"]
        assert client.get(f"{server.url}/v2/health/live").status_code == 200


def test_infer_errors_reach_tritonclient_as_its_exception(triton: Any) -> None:
    x = httpclient.InferInput("input_ids", [1, 2], "INT64")
    x.set_data_from_numpy(np.array([[1, 2]], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="takes the inputs"):
        triton.infer("char", [x])
    with pytest.raises(InferenceServerException, match="does not exist"):
        triton.infer("nope", [x])


def test_binary_bodies_that_do_not_add_up_are_refused(server: BackgroundServer) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input_ids",
                    "shape": [1, 2],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": 16},
                }
            ]
        }
    ).encode()
    for extra, length in [
        (b"\0" * 8, len(header)),
        (b"\0" * 24, len(header)),
        (b"\0" * 16, len(header) + 999),
    ]:
        r = httpx.post(
            f"{server.url}/v2/models/char/infer",
            content=header + extra,
            headers={"Inference-Header-Content-Length": str(length)},
        )
        assert r.status_code == 400 and "error" in r.json()


# ------------------------------------------------------------------------ task routes


def _same_predictions(served: list[dict], expected: list[Any]) -> None:
    assert [p["label"] for p in served] == [e.label for e in expected]
    for got, want in zip(served, expected, strict=True):
        assert got["probabilities"] == pytest.approx(want.probabilities, abs=1e-6)


def test_classify_texts_and_pairs(server: BackgroundServer) -> None:
    clf = model(server, "sst2")
    pairs = [["a premise", "a hypothesis"], ["short", "longer second sentence"]]
    for texts in (TEXTS, pairs, "one text"):
        r = httpx.post(f"{server.url}/v1/classify", json={"model": "sst2", "texts": texts})
        assert r.status_code == 200, r.text
        expected = clf.classify([tuple(t) for t in texts] if isinstance(texts[0], list) else texts)
        _same_predictions(r.json()["predictions"], expected)


@pytest.mark.slow
def test_translate_greedy_and_beam(second: BackgroundServer) -> None:
    server = second
    translator = model(server, "de-en")
    for beam in (1, 3):
        r = httpx.post(
            f"{server.url}/v1/translate",
            json={"model": "de-en", "texts": SOURCES, "beam": beam, "max_len": 12},
        )
        assert r.status_code == 200, r.text
        assert r.json()["translations"] == translator.translate(SOURCES, beam=beam, max_len=12)
    scored = {"length_penalty": 2.5, "early_stopping": False}
    r = httpx.post(
        f"{server.url}/v1/translate", json={"model": "de-en", "texts": SOURCES, "beam": 3, **scored}
    )
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == translator.translate(SOURCES, beam=3, **scored)  # type: ignore[arg-type]


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.slow
def test_classify_image_uploads_and_arrays(second: BackgroundServer) -> None:
    server = second
    vit = model(server, "digits")
    rng = np.random.default_rng(1)
    grey = rng.integers(0, 256, (8, 8), dtype=np.uint8)
    rgb = rng.integers(0, 256, (20, 14, 3), dtype=np.uint8)
    files = [("images", ("a.png", _png(grey), "image/png")), ("images", ("b.png", _png(rgb), "image/png"))]
    r = httpx.post(f"{server.url}/v1/classify-image", data={"model": "digits"}, files=files)
    assert r.status_code == 200, r.text
    expected = vit.classify_images([_png(grey), _png(rgb)])
    _same_predictions(r.json()["predictions"], expected)
    upload = httpx.Request("POST", f"{server.url}/v1/classify-image", data={"model": "digits"}, files=files)
    kind = upload.headers["Content-Type"].replace("multipart/form-data", "Multipart/Form-Data")
    with httpx.Client() as client:  # a media type's case does not matter (RFC 9110)
        r = client.post(upload.url, content=upload.read(), headers={"Content-Type": kind})
    assert r.status_code == 200, r.text
    _same_predictions(r.json()["predictions"], expected)
    floats = rng.random((8, 8)).round(3)
    r = httpx.post(
        f"{server.url}/v1/classify-image",
        json={"model": "digits", "images": [grey.tolist(), floats.tolist()]},
    )
    assert r.status_code == 200, r.text
    _same_predictions(r.json()["predictions"], vit.classify_images([grey, floats.astype(np.float32)]))


@pytest.mark.parametrize(
    ("route", "kwargs", "needle"),
    [
        ("/v1/classify", {"json": {"model": "char", "texts": ["a"]}}, "does not serve /v1/classify"),
        # One message naming what texts take (pydantic's union said "texts.str: ... a valid string").
        (
            "/v1/classify",
            {"json": {"model": "sst2", "texts": []}},
            "texts takes a string or a non-empty list",
        ),
        ("/v1/classify", {"json": {"model": "sst2", "texts": 5}}, "texts takes a string or a non-empty list"),
        (
            "/v1/classify",
            {"json": {"model": "sst2", "texts": [["a", "b", "c"]]}},
            "texts takes strings or (first",
        ),
        ("/v1/classify", {"json": {"model": "sst2", "texts": ["a", 5]}}, "texts takes strings or (first"),
        ("/v1/classify", {"json": {"model": "sst2", "texts": ["a"], "top": 3}}, "top"),
        ("/v1/translate", {"json": {"model": "sst2", "texts": ["a"]}}, "does not serve /v1/translate"),
        ("/v1/classify-image", {"json": {"model": "sst2", "images": [[[1]]]}}, "does not serve"),
        ("/v1/classify-image", {"json": {"model": "sst2", "images": ["/etc/passwd"]}}, "images"),
        (
            "/v1/classify-image",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            "send JSON",
        ),
    ],
)
def test_bad_task_requests_get_400_with_a_reason(
    server: BackgroundServer, route: str, kwargs: dict, needle: str
) -> None:
    r = httpx.post(f"{server.url}{route}", **kwargs)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("route", "kwargs", "needle"),
    [
        ("/v1/translate", {"json": {"model": "de-en", "texts": ["a"], "beam": 99}}, "beam may be at most"),
        ("/v1/translate", {"json": {"model": "de-en", "texts": ["a"], "beam": 0}}, "beam"),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": []}},
            "texts takes a string or a non-empty list",
        ),
        ("/v1/translate", {"json": {"model": "de-en", "texts": [["a", "b"]]}}, "texts takes strings, got"),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "target_language": "fra_Latn"}},
            "target_language: the bundle places no target_language code to replace",
        ),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "source_language": "x" * 65}},
            "at most 64",
        ),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "early_stopping": True}},
            "early_stopping True is transformers' beam search's",
        ),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "early_stopping": "soon"}},
            "early_stopping",
        ),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "length_penalty": -1.0}},
            "length_penalty must be in [0, 10]",
        ),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "length_penalty": True}},
            "length_penalty",
        ),
        (
            "/v1/translate",
            {"json": {"model": "de-en", "texts": ["a"], "length_penalty": "1"}},
            "length_penalty",
        ),
        ("/v1/translate", {"json": {"model": "de-en", "texts": ["a"], "beam": 2.0}}, "beam"),
        ("/v1/classify-image", {"json": {"model": "digits", "images": [[[300, 2]]]}}, "outside 0-255"),
        ("/v1/classify-image", {"json": {"model": "digits", "images": [[[0.5, 2.0]]]}}, "[0, 1]"),
        ("/v1/classify-image", {"json": {"model": "digits", "images": [[[1], [1, 2]]]}}, "rectangular"),
        (
            "/v1/classify-image",
            {"data": {"model": "digits"}, "files": [("images", ("x.png", b"not a png", "image/png"))]},
            "cannot read",
        ),
    ],
)
def test_bad_translations_and_images_get_400(
    second: BackgroundServer, route: str, kwargs: dict, needle: str
) -> None:
    r = httpx.post(f"{second.url}{route}", **kwargs)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_one_bad_request_does_not_fail_the_batch_it_shares(server: BackgroundServer) -> None:
    """A request whose text the tokenizer refuses fails alone; the requests batched with it pass."""

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url) as http:
            bodies = [
                {"model": "char", "prompt": p, "max_tokens": 3, "temperature": 0} for p in ("ab", "¿", "cd")
            ]
            return await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))

    assert [r.status_code for r in asyncio.run(main())] == [200, 400, 200]


# ------------------------------------------------------------------- batching and streams


def test_concurrent_generations_batch_and_each_gets_its_own_tokens(server: BackgroundServer) -> None:
    """Prompts of different lengths, sent together, are batched (left-padded) and each row's
    tokens are those it generates alone. The batch metric counts the rows of each step: its sum
    is the tokens generated, its count the steps, fewer than the tokens when rows share them."""
    lm = model(server, "char")
    prompts = [PROMPTS[i % 3][: 1 + 5 * i] for i in range(8)]
    rows = server.served.batches.labels("char")
    before = rows._sum.get(), sum(bucket.get() for bucket in rows._buckets)

    async def main() -> list[dict]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            bodies = [{"model": "char", "prompt": p, "max_tokens": 10, "temperature": 0} for p in prompts]
            return [
                r.json()
                for r in await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))
            ]

    answers = asyncio.run(main())
    assert [a["choices"][0]["text"] for a in answers] == [
        new_text(lm, p, max_new_tokens=10, temperature=0) for p in prompts
    ]
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    steps = sum(bucket.get() for bucket in rows._buckets) - before[1]
    assert rows._sum.get() - before[0] == tokens
    assert steps < tokens / 2


def _metric(server: BackgroundServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def _until(condition: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_client_that_goes_away_stops_its_generation(server: BackgroundServer) -> None:
    worker = server.served.workers["char"]
    body = {"model": "char", "prompt": "ROMEO:", "max_tokens": 100_000, "temperature": 0}
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.5)
    generated = 'tfcompile_generated_tokens_total{model="char"}'
    _until(lambda: worker.jobs.qsize() == 0 and _metric(server, generated) > 0, 20)
    started = time.monotonic()
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and time.monotonic() - started < 10
    assert _metric(server, generated) < 100_000


@pytest.mark.parametrize("asgi", ["2.3", "2.4"])
def test_a_stream_whose_client_left_before_its_first_chunk_stops_its_rows(asgi: str) -> None:
    """The events generator's own cleanup runs only once it has started: a client gone while the
    response's start was going out (a disconnect heard first, or a send that fails) never started
    it, and its rows generated to max_tokens."""

    async def scenario() -> tuple[bool, bool]:
        job, started = Job("generate", []), []

        async def events() -> AsyncIterator[str]:
            started.append(True)
            yield "data: [DONE]\n\n"

        async def receive() -> dict:
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if asgi == "2.4":
                raise OSError("the client is gone")
            await asyncio.sleep(1)  # the response's start slow to go out

        with contextlib.suppress(Exception):
            await EventStream(events(), job)({"type": "http", "asgi": {"spec_version": asgi}}, receive, send)
        return bool(started), job.cancelled.is_set()

    assert asyncio.run(scenario()) == (False, True)


def test_only_requests_not_yet_handed_to_a_worker_count_as_arriving(server: BackgroundServer) -> None:
    """A batch waits for arriving requests: a stream in progress, an answered request or one
    refused before it had a job must not count, or every lone request would wait max_wait."""
    body = {"model": "char", "prompt": "ROMEO:", "max_tokens": 500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        assert next(r.iter_lines()).startswith("data: ")
        assert not any(server.served.arriving.values())  # streaming, its job handed over
        classify = f"{server.url}/v1/classify"
        assert httpx.post(classify, json={"model": "sst2", "texts": "dull"}).is_success
        assert httpx.post(classify, json={"model": "sst2"}).status_code == 400
        assert httpx.post(classify, json={"model": "none", "texts": "a"}).status_code == 404
        assert not any(server.served.arriving.values())


def test_metrics_count_requests_latency_batches_and_tokens(server: BackgroundServer) -> None:
    httpx.post(f"{server.url}/v1/classify", json={"model": "sst2", "texts": TEXTS})
    text = httpx.get(f"{server.url}/metrics").text
    assert re.search(r'tfcompile_requests_total\{route="/v1/classify",status="200"\} [1-9]', text)
    assert 'tfcompile_request_seconds_bucket{le="0.005",route="/v1/classify"}' in text
    assert 'tfcompile_batch_rows_count{model="sst2"}' in text
    assert 'tfcompile_queue_depth{model="sst2"}' in text
    assert "tfcompile_generated_tokens_total" in text


# -------------------------------------------------------- limits, auth, overload, drain


@pytest.fixture(scope="module")
def guarded(char_bundle: Path, classifier_bundle: Path) -> Iterator[BackgroundServer]:
    settings = Settings(api_key="s3cret", max_body_bytes=4096, max_queue=1, max_batch=4, max_tokens=100_000)
    with BackgroundServer({"char": char_bundle, "sst2": classifier_bundle}, settings) as s:
        yield s


def test_every_route_but_health_needs_the_key(guarded: BackgroundServer) -> None:
    body = {"model": "sst2", "texts": ["a"]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = httpx.post(f"{guarded.url}/v1/classify", json=body, headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{guarded.url}/v2/models/sst2").status_code == 401
    assert "error" in httpx.get(f"{guarded.url}/v2/models/sst2").json()
    for public in ("/health", "/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(f"{guarded.url}{public}").status_code == 200
    for given in ("Bearer s3cret", "bearer s3cret", "BEARER s3cret", "Bearer   s3cret"):  # RFC 9110, 11.4
        r = httpx.post(f"{guarded.url}/v1/classify", json=body, headers={"Authorization": given})
        assert r.status_code == 200
    twice = [("Authorization", "Bearer wrong"), ("Authorization", "Bearer s3cret")]  # the last was read
    assert httpx.post(f"{guarded.url}/v1/classify", json=body, headers=twice).status_code == 401
    client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="s3cret", max_retries=0)
    assert client.completions.create(model="char", prompt="a", max_tokens=2).choices[0].text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="nope", max_retries=0).models.list()


def test_bodies_and_batches_over_the_limits_are_refused(guarded: BackgroundServer) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    r = httpx.post(f"{guarded.url}/v1/classify", json={"model": "sst2", "texts": ["a" * 5000]}, headers=auth)
    assert r.status_code == 413 and "more than the 4,096 allowed" in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is met while reading
        yield b'{"model": "sst2", "texts": ["'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"]}'

    r = httpx.post(
        f"{guarded.url}/v1/classify", content=chunks(), headers={**auth, "Content-Type": "application/json"}
    )
    assert r.status_code == 413 and "error" in r.json()
    r = httpx.post(f"{guarded.url}/v1/classify", json={"model": "sst2", "texts": ["a"] * 5}, headers=auth)
    assert r.status_code == 400 and "at most 4 items" in r.json()["error"]["message"]
    rows = {"name": "text", "shape": [5], "datatype": "BYTES", "data": ["a"] * 5}
    r = httpx.post(f"{guarded.url}/v2/models/sst2/infer", json={"inputs": [rows]}, headers=auth)
    assert r.status_code == 400 and "at most 4 rows, got 5" in r.json()["error"]
    ids = [
        {"name": n, "shape": [5, 1], "datatype": "INT64", "data": [1] * 5}
        for n in ("input_ids", "attention_mask")
    ]
    r = httpx.post(f"{guarded.url}/v2/models/char/infer", json={"inputs": ids}, headers=auth)
    assert r.status_code == 400 and "at most 4 rows, got 5" in r.json()["error"]


def test_a_full_queue_answers_503_with_retry_after(guarded: BackgroundServer) -> None:
    """A running batch of --max-batch-size rows, a completion waiting for room in it, one in the
    queue (of 1): the next is refused."""
    auth = {"Authorization": "Bearer s3cret"}
    long = {"model": "char", "prompt": "ROMEO:", "max_tokens": 100_000, "temperature": 0, "stream": True}
    worker = guarded.served.workers["char"]

    async def main() -> httpx.Response:
        async with (
            httpx.AsyncClient(base_url=guarded.url, headers=auth, timeout=60) as http,
            http.stream("POST", "/v1/completions", json={**long, "n": 4}) as running,  # 4 rows: full
        ):
            lines = running.aiter_lines()  # kept: a dropped line iterator closes the stream
            await lines.__anext__()
            async with http.stream("POST", "/v1/completions", json=long) as waiting:
                _until(lambda: worker.carry is not None)  # taken, to join when a row leaves
                async with http.stream("POST", "/v1/completions", json=long) as queued:
                    _until(lambda: worker.jobs.qsize() == 1)
                    assert waiting.status_code == queued.status_code == 200
                    assert _metric(guarded, 'tfcompile_queue_depth{model="char"}') == 2  # and the held one
                    return await http.post("/v1/completions", json={**long, "stream": False})

    refused = asyncio.run(main())
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert "requests waiting" in refused.json()["error"]["message"]
    _until(lambda: guarded.served.workers["char"].jobs.qsize() == 0, 20)


def test_load_models_names_bundles_and_refuses_clashes(char_bundle: Path) -> None:
    assert list(load_models([f"lm={char_bundle}"])) == ["lm"]
    assert list(load_models([str(char_bundle)])) == [char_bundle.name]
    with pytest.raises(UserError, match="two bundles are named"):
        load_models([f"a={char_bundle}", f"a={char_bundle}"])
    with pytest.raises(UserError, match="cannot name a model"):
        load_models([f"../x={char_bundle}"])


def test_sigterm_drains_then_exits_cleanly(char_bundle: Path) -> None:
    """After SIGTERM: readiness is false and new requests get 503 at once, the stream in flight
    runs to [DONE], and the process exits 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "tfcompile",
        "serve",
        f"lm={char_bundle}",
        "--port",
        "0",
        "--max-tokens",
        "100000",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = None
        assert process.stderr is not None
        for line in process.stderr:
            if found := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                port = found.group(1)
                break
        assert port, "the server did not say where it listens"
        url = f"http://127.0.0.1:{port}"
        _until(lambda: httpx.get(f"{url}/health").json()["ready"], 30)
        body = {"model": "lm", "prompt": "ROMEO:", "max_tokens": 1500, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            process.send_signal(signal.SIGTERM)
            _until(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 503)
            refused = httpx.post(f"{url}/v1/completions", json={**body, "stream": False})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert process.wait(30) == 0
    finally:
        process.kill()


@pytest.mark.slow
def test_64_clients_for_30_seconds_get_the_single_request_answers(classifier_bundle: Path) -> None:
    """Under load, every answer is the one the same request gets alone (batched with others or
    not), and the only error is 503 when the queue is full. The clients share the server's process:
    a pause of the whole process (a collection, a loaded machine) past uvicorn's 5 s keep-alive let
    the server close a connection as its client sent the next request down it (an httpx.ReadError in
    CI); the keep-alive here outlasts any such pause."""
    inputs: list[Any] = [*TEXTS, ["a premise", "a hypothesis"], "naïve café 猫 🙂", "x " * 200]
    with BackgroundServer({"sst2": classifier_bundle}, Settings(max_queue=16, keep_alive_s=300)) as s:
        alone = [
            httpx.post(f"{s.url}/v1/classify", json={"model": "sst2", "texts": [t]}).json() for t in inputs
        ]
        statuses: dict[int, int] = {}
        mismatches: list[tuple[Any, Any]] = []

        async def client(k: int, deadline: float) -> int:
            done = 0
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as http:
                while time.monotonic() < deadline:
                    i = (k + done) % len(inputs)
                    r = await http.post("/v1/classify", json={"model": "sst2", "texts": [inputs[i]]})
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    done += 1
                    if r.status_code != 200:
                        continue
                    (got,), (want,) = r.json()["predictions"], alone[i]["predictions"]
                    if got["label"] != want["label"] or got["probabilities"] != pytest.approx(
                        want["probabilities"], abs=1e-5
                    ):
                        mismatches.append((got, want))
            return done

        async def main() -> list[int]:
            deadline = time.monotonic() + 30
            return await asyncio.gather(*(client(k, deadline) for k in range(64)))

        counts = asyncio.run(main())
    assert not mismatches, mismatches[:3]
    assert set(statuses) <= {200, 503} and statuses.get(200, 0) > 64, statuses
    assert min(counts) > 0  # every client was served


def test_the_server_runs_on_the_serve_extras_event_loop_and_http_parser(classifier_bundle: Path) -> None:
    config = server_config(Served(load_models([str(classifier_bundle)]), Settings()), "127.0.0.1", 0, "error")
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)  # not h11's pure Python
    assert config.get_loop_factory().__module__ == "uvloop"
