"""The bundle contract, tested through the clients in examples/: a Python one (onnxruntime,
tokenizers, numpy, Pillow; no tfcompile) and a Node.js one (onnxruntime-node,
@huggingface/tokenizers, pngjs). Each reads only a bundle's manifest.json and files, and must serve
every kind of bundle exactly as tfcompile.runtime does: the same greedy tokens (batched and
left-padded rows as each row alone, for every positional encoding), the same translations, and
probabilities within 1e-5.

Only the Python client on one decoder is in the default suite; the other bundles, and the npm
install the Node client needs (examples/node/node_modules), are marked slow."""

from __future__ import annotations

import ast
import collections
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ROOT, TINY, damaged, edited_tokenizer, png16, truncating_one_side, without_truncation

from tfcompile.cli import main
from tfcompile.export import Source, export_bundle
from tfcompile.runtime import InputError, load
from tfcompile.spec import load_spec

EXAMPLES = ROOT / "examples"
PYTHON_CLIENT = EXAMPLES / "python" / "client.py"
NODE_DIR = EXAMPLES / "node"
POSITIONAL = ["learned", "sinusoidal", "rope", "relative", "none"]
PROMPT_LENGTHS = (1, 5, 17, 40)
NEW_TOKENS = 8
SENTENCES = [
    "a gorgeous, witty, seductive movie.",
    "dull",
    "naïve café 猫 🙂 with an unknown character or two",
    "the plot is thin , the acting wooden , and the running time " * 6,  # past the context: truncated
]
PAIRS = [
    ("a premise", "a hypothesis"),
    ("short", "a second sentence that runs on and on and on " * 5),
    ("a first sentence that runs on and on and on " * 5, "and a second one, as long as it " * 5),
]
SOURCES = [
    "Ein Hund rennt über eine Wiese.",
    "Zwei Männer stehen vor einem großen Gebäude und schauen auf die Straße.",
    "Eine Frau.",
    "Ein kleines Mädchen in einem rosa Kleid klettert die Treppe hinauf " * 4,  # past the context
]


Client = Callable[..., Any]


def python_client(bundle: Path, *args: str) -> Any:
    return _run([sys.executable, str(PYTHON_CLIENT), str(bundle), *args])


def _run(command: list[str]) -> Any:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _with_manifest(bundle: Path, out: Path, section: str, **fields: Any) -> Path:
    """A copy of ``bundle`` whose manifest has other ``fields`` in ``section`` (the manifest is
    not among the hashed files): a client and the runtime must both follow it."""
    shutil.copytree(bundle, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest[section].update(fields)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


# ------------------------------------------------------------------------ bundles


@pytest.fixture(scope="module")
def positional_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random decoder per positional encoding, exported from the spec (no tokenizer); its weights
    wide enough (init_std 0.2) that attention, and so every position, tells."""
    root = tmp_path_factory.mktemp("positional")
    bundles = {}
    for kind in POSITIONAL:
        overrides = [*TINY, "model.max_seq_len=48", "model.init_std=0.2", f"model.positional={kind}"]
        spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml", overrides)
        export_bundle(spec, Source(seed=0), root / kind)
        bundles[kind] = root / kind
    return bundles


@pytest.fixture(scope="session")
def node_client() -> Client:
    """The Node.js client, its packages installed from the npm registry into examples/node/node_modules
    (no download from anywhere else: ONNXRUNTIME_NODE_INSTALL_CUDA=skip)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the Node.js example (Node 20 or newer)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < 20:
        pytest.skip(f"the Node.js example needs Node 20 or newer, found {version.strip()}")
    env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL_CUDA": "skip", "ONNXRUNTIME_NODE_INSTALL": "skip"}
    try:
        install = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install in examples/node timed out (is the npm registry reachable?)")
    if install.returncode != 0:
        pytest.skip(f"npm install in examples/node failed (offline?): {install.stderr.strip()[-500:]}")

    def client(bundle: Path, *args: str) -> Any:
        return _run([node, str(NODE_DIR / "client.mjs"), str(bundle), *args])

    return client


@pytest.fixture(params=["python", "node"])
def client(request: pytest.FixtureRequest) -> Client:
    return python_client if request.param == "python" else request.getfixturevalue("node_client")


# ------------------------------------------------------------------------ what the runtime says

# Prompts of three lengths: a left-padded batch whose rows generate as each alone.
PADDED_PROMPTS = [[5, 6, 7, 5], [8], [9, 10, 11, 12, 13, 9, 10]]


def runtime_alone(bundle: Path, prompts: list[list[int]], count: int) -> list[list[int]]:
    """Each prompt's greedy tokens, generated alone (no padding) by tfcompile.runtime."""
    model = load(bundle, providers=["CPUExecutionProvider"])
    return [model.generate(np.array([p]), count, temperature=0)[0, len(p) :].tolist() for p in prompts]


def runtime_batched(bundle: Path, prompts: list[list[int]], count: int) -> list[list[int]]:
    """The same prompts as one left-padded batch; each row's tokens up to its stop token."""
    model = load(bundle, providers=["CPUExecutionProvider"])
    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, count, temperature=0, attention_mask=mask)[:, width:].tolist()
    stops = model.manifest.generation.stop_token_ids  # type: ignore[attr-defined]
    return [row[: next((i + 1 for i, t in enumerate(row) if t in stops), len(row))] for row in out]


def first_new_token(row: list[int]) -> int:
    """The index of the first token after the first that has not come before: made a stop token,
    it ends the row there."""
    return next(i for i in range(1, len(row)) if row[i] not in row[:i])


def second_row_stopping(bundle: Path) -> tuple[list[list[int]], int, dict[str, list[int]]]:
    """The runtime's 16 greedy tokens after each of PADDED_PROMPTS, the index of the second row's
    first new token, and the generation section that makes that token a stop token (the second
    row then ends there)."""
    plain = runtime_alone(bundle, PADDED_PROMPTS, 16)
    end = first_new_token(plain[1])
    return plain, end, {"stop_token_ids": [plain[1][end]]}


def runtime_logits(bundle: Path, prompts: list[list[int]]) -> np.ndarray:
    """The full graph's logits after each prompt's last token, the prompts left-padded."""
    model = load(bundle, providers=["CPUExecutionProvider"])
    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return model.logits(ids, mask)[:, -1]  # type: ignore[attr-defined]


def generated_ids(client: Client, bundle: Path, prompts: list[list[int]], count: int) -> list[list[int]]:
    """A client's new tokens after each prompt, generated as one batch (its generate command)."""
    served = client(bundle, "generate", *id_args(prompts), "--max-new-tokens", str(count))
    return [s["new_ids"] for s in served]


def id_args(prompts: list[list[int]]) -> list[str]:
    return [arg for p in prompts for arg in ("--ids", ",".join(map(str, p)))]


def prompt_args(prompts: list[str]) -> list[str]:
    return [arg for p in prompts for arg in ("--prompt", p)]


def assert_same_predictions(served: list[dict], expected: list[Any]) -> None:
    assert [s["label"] for s in served] == [p.label for p in expected]
    for s, p in zip(served, expected, strict=True):
        assert s["probabilities"].keys() == p.probabilities.keys()
        np.testing.assert_allclose(
            list(s["probabilities"].values()), list(p.probabilities.values()), atol=1e-5
        )


# ------------------------------------------------------------------------ the default suite


def test_the_python_client_needs_no_tfcompile() -> None:
    tree = ast.parse(PYTHON_CLIENT.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    standard = {"__future__", "argparse", "hashlib", "json", "sys", "pathlib", "typing"}
    assert imported <= standard | {"numpy", "onnxruntime", "PIL", "tokenizers"}


def test_python_client_generates_a_left_padded_batch_as_the_runtime_does(char_bundle: Path) -> None:
    prompts = ["ROMEO:", "O", "But soft, what light through yonder window breaks?"]
    served = python_client(char_bundle, "generate", *prompt_args(prompts), "--max-new-tokens", "10")
    model = load(char_bundle, providers=["CPUExecutionProvider"])
    assert [s["text"] for s in served] == model.generate_text(prompts, 10, temperature=0)
    ids = [s["prompt_ids"] for s in served]
    assert ids == [e.ids for e in model.encode(prompts)]
    assert (
        [s["new_ids"] for s in served]
        == runtime_alone(char_bundle, ids, 10)
        == runtime_batched(char_bundle, ids, 10)
    )


def test_python_client_slides_past_the_context_and_reads_logits_as_the_runtime_does(
    char_bundle: Path,
) -> None:
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 65, n).tolist() for n in (3, 60)]  # 60 + 10 new tokens > context 64
    assert generated_ids(python_client, char_bundle, prompts, 10) == runtime_batched(char_bundle, prompts, 10)
    logits = python_client(char_bundle, "logits", *id_args(prompts))
    np.testing.assert_allclose(logits, runtime_logits(char_bundle, prompts), atol=1e-5)


def test_python_client_stops_a_row_at_a_stop_token(char_bundle: Path, tmp_path: Path) -> None:
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    first = runtime_alone(char_bundle, prompts, 10)
    end = first_new_token(first[0])  # row 0 stops there; the others where they reach the same token
    bundle = _with_manifest(char_bundle, tmp_path / "stops", "generation", stop_token_ids=[first[0][end]])
    expected = runtime_alone(bundle, prompts, 10)
    assert expected[0] == first[0][: end + 1] and expected == runtime_batched(bundle, prompts, 10)
    assert generated_ids(python_client, bundle, prompts, 10) == expected


def test_python_client_refuses_a_graph_whose_sha256_differs(char_bundle: Path, tmp_path: Path) -> None:
    bundle = shutil.copytree(char_bundle, tmp_path / "changed")
    with (bundle / "decoder_step.onnx").open("ab") as f:
        f.write(b"\0")
    result = subprocess.run(
        [sys.executable, str(PYTHON_CLIENT), str(bundle), "generate", "--ids", "1,2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "sha256" in result.stderr


# ------------------------------------------------------------------------ both clients, every kind


@pytest.mark.slow
def test_every_positional_encoding_generates_each_padded_row_as_alone(
    positional_bundles: dict[str, Path], client: Client
) -> None:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 65, n).tolist() for n in PROMPT_LENGTHS]
    for kind, bundle in positional_bundles.items():
        alone = runtime_alone(bundle, prompts, NEW_TOKENS)
        assert runtime_batched(bundle, prompts, NEW_TOKENS) == alone, kind
        served = client(bundle, "generate", *id_args(prompts), "--max-new-tokens", str(NEW_TOKENS))
        assert [s["new_ids"] for s in served] == alone, kind
        assert all(s["text"] is None for s in served)


@pytest.mark.slow
def test_node_client_generates_text_stops_and_reads_logits(
    char_bundle: Path, node_client: Client, tmp_path: Path
) -> None:
    prompts = ["ROMEO:", "O", "But soft, what light through yonder window breaks?"]
    served = node_client(char_bundle, "generate", *prompt_args(prompts), "--max-new-tokens", "10")
    model = load(char_bundle, providers=["CPUExecutionProvider"])
    assert [s["text"] for s in served] == model.generate_text(prompts, 10, temperature=0)
    assert [s["new_ids"] for s in served] == runtime_alone(char_bundle, [s["prompt_ids"] for s in served], 10)
    rng = np.random.default_rng(1)
    long = [rng.integers(0, 65, n).tolist() for n in (3, 60)]  # 60 + 10 new tokens > context 64
    assert generated_ids(node_client, char_bundle, long, 10) == runtime_batched(char_bundle, long, 10)
    logits = node_client(char_bundle, "logits", *id_args(long))
    np.testing.assert_allclose(logits, runtime_logits(char_bundle, long), atol=1e-5)
    short = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    first = runtime_alone(char_bundle, short, 10)[0]
    stop = first[first_new_token(first)]
    bundle = _with_manifest(char_bundle, tmp_path / "stops", "generation", stop_token_ids=[stop])
    assert generated_ids(node_client, bundle, short, 10) == runtime_alone(bundle, short, 10)
    with (bundle / "decoder_step.onnx").open("ab") as f:
        f.write(b"\0")
    result = subprocess.run(
        ["node", str(NODE_DIR / "client.mjs"), str(bundle), "generate", "--ids", "1,2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "sha256" in result.stderr


@pytest.mark.slow
def test_both_clients_penalise_repeats_as_the_runtime_does(
    char_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's repetition_penalty: each client's greedy tokens of a left-padded batch are the
    runtime's (each row's as alone, its real tokens penalised), which differ from the plain ones."""
    prompts = PADDED_PROMPTS
    bundle = _with_manifest(char_bundle, tmp_path / "penalised", "generation", repetition_penalty=1.8)
    alone = runtime_alone(bundle, prompts, 16)
    assert runtime_batched(bundle, prompts, 16) == alone != runtime_alone(char_bundle, prompts, 16)
    assert generated_ids(client, bundle, prompts, 16) == alone


@pytest.mark.slow
def test_both_clients_ban_what_the_runtime_bans_in_generation(
    char_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's generation bans: suppressed_ids (the token the rows choose most),
    min_new_tokens (past where a stop token ends the second row), no_repeat_ngram_size and
    banned_sequences (the first row's prompt's last token and its first new one), each of which
    changes the runtime's greedy tokens: each client's tokens of a left-padded batch are the
    runtime's (each row's as alone, its n-grams over its prompt and new tokens)."""
    prompts = PADDED_PROMPTS
    plain, end, stopping = second_row_stopping(char_bundle)
    (most, _), *_ = collections.Counter(t for row in plain for t in row if t != plain[1][end]).most_common(1)
    unbanned = runtime_alone(
        _with_manifest(char_bundle, tmp_path / "stops", "generation", **stopping), prompts, 16
    )

    def changes(name: str, value: Any) -> bool:
        folder = tmp_path / f"{name}-{value}"
        return (
            runtime_alone(
                _with_manifest(char_bundle, folder, "generation", **stopping, **{name: value}), prompts, 16
            )
            != unbanned
        )

    n = next(n for n in (3, 2, 1) if changes("no_repeat_ngram_size", n))  # the longest that bites
    word = [prompts[0][-1], unbanned[0][0]]
    assert changes("suppressed_ids", [most]) and changes("min_new_tokens", end + 2)
    assert changes("banned_sequences", [word])
    bans = {"suppressed_ids": [most], "min_new_tokens": end + 2, "no_repeat_ngram_size": n}
    bans |= {"banned_sequences": [word]}
    bundle = _with_manifest(char_bundle, tmp_path / "bans", "generation", **stopping, **bans)
    expected = runtime_alone(bundle, prompts, 16)
    assert runtime_batched(bundle, prompts, 16) == expected
    assert generated_ids(client, bundle, prompts, 16) == expected


@pytest.mark.slow
def test_both_clients_hold_off_the_stop_tokens_to_min_length(
    char_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """min_length counts a row's prompt: with a token of the second row's made the stop token,
    min_length past it keeps that row going (and the longer prompts' rows less far); each
    client's tokens of the batch are the runtime's."""
    prompts = PADDED_PROMPTS
    _, end, stopping = second_row_stopping(char_bundle)
    stops = _with_manifest(char_bundle, tmp_path / "stops", "generation", **stopping)
    held = _with_manifest(char_bundle, tmp_path / "held", "generation", **stopping, min_length=end + 4)
    expected = runtime_alone(held, prompts, 16)
    assert len(expected[1]) > len(runtime_alone(stops, prompts, 16)[1]) == end + 1
    assert generated_ids(client, held, prompts, 16) == expected


@pytest.mark.slow
def test_both_clients_end_a_row_whose_every_token_is_banned(
    char_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """no_repeat_ngram_size 1 bans each token a row holds, and min_new_tokens past the limit its
    stop tokens: a row takes each other token of the vocabulary once, then has none left and ends
    there, in the runtime as in each client."""
    bans = {"no_repeat_ngram_size": 1, "min_new_tokens": 150}
    bundle = _with_manifest(char_bundle, tmp_path / "spent", "generation", **bans)
    model = load(bundle, providers=["CPUExecutionProvider"])
    emitted = set(range(model.tokenizer.get_vocab_size())) - set(model.generation.stop_token_ids)  # type: ignore[attr-defined]
    prompts = [[5, 6, 7, 5], [8]]
    expected = runtime_alone(bundle, prompts, 150)
    assert [sorted(row) for row in expected] == [sorted(emitted - set(p)) for p in prompts]
    assert model.generate_prompts(prompts, [150, 150], model.sampling(2, temperature=0)) == expected  # type: ignore[attr-defined]
    assert generated_ids(client, bundle, prompts, 150) == expected


@pytest.mark.slow
def test_both_clients_pick_only_the_tokenizers_ids(char_bundle: Path, client: Client, tmp_path: Path) -> None:
    """A model may have more logits than its tokenizer has tokens (a Hugging Face T5: 32,128 for
    32,100): generation picks among the tokenizer's ids, as the runtime does."""
    prompt = [18, 27, 1]
    cut = max(runtime_alone(char_bundle, [prompt], 12)[0])  # the tokenizer loses the largest id picked

    def narrow(tokenizer: dict) -> None:
        tokenizer["model"]["vocab"] = {k: v for k, v in tokenizer["model"]["vocab"].items() if v < cut}

    bundle = damaged(char_bundle, tmp_path, **{"tokenizer.json": edited_tokenizer(char_bundle, narrow)})
    expected = runtime_alone(bundle, [prompt], 12)
    assert max(expected[0]) < cut
    assert generated_ids(client, bundle, [prompt], 12) == expected


@pytest.mark.slow
@pytest.mark.parametrize("length", [512, 20])
def test_both_clients_keep_a_prompt_as_the_decoders_tokenizer_cuts_it(
    char_bundle: Path, client: Client, tmp_path: Path, length: int
) -> None:
    """A decoder whose tokenizer.json (and manifest) truncates at ``length``: a prompt is cut there
    alone, not at the context (64), which only a classifier's texts are; past the context,
    generation reads the prompt's last 64 tokens. Each client's prompt and tokens are the runtime's."""
    cut = {"max_length": length, "strategy": "LongestFirst", "direction": "Right", "stride": 0}
    bundle = damaged(
        char_bundle,
        tmp_path,
        lambda m: m["tokenizer"].update(
            truncation={"max_length": length, "strategy": "longest_first", "direction": "right"}
        ),
        **{"tokenizer.json": edited_tokenizer(char_bundle, lambda t: t.update(truncation=cut))},
    )
    prompt = "But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
    model = load(bundle, providers=["CPUExecutionProvider"])
    ids = model.encode([prompt])[0].ids
    assert len(ids) == min(len(prompt), length)
    served = client(bundle, "generate", "--prompt", prompt, "--max-new-tokens", "8")
    assert served[0]["prompt_ids"] == ids
    assert served[0]["new_ids"] == runtime_alone(bundle, [ids], 8)[0]
    assert served[0]["text"] == model.generate_text(prompt, 8, temperature=0)


@pytest.mark.slow
def test_node_client_refuses_what_is_not_a_token_id(char_bundle: Path, node_client: Client) -> None:
    """--ids rows hold integers in [0, vocabulary) alone, as the runtime takes (an empty item, a
    negative id, one past the vocabulary, a fraction: refused, not read as 0 or generated from)."""
    model = load(char_bundle, providers=["CPUExecutionProvider"])
    for row in ["5,,6", "-1", "65", "1.5", "x", "5,"]:
        stderr = _node_fails(char_bundle, "generate", "--ids", row)
        assert "not a token id in [0, 65)" in stderr, (row, stderr)
    for bad in ([[5, -1]], [[65]]):
        with pytest.raises(InputError):
            model.generate(np.array(bad), 2, temperature=0)
    served = node_client(char_bundle, "generate", "--ids", "0,64", "--max-new-tokens", "2")
    assert served[0]["new_ids"] == runtime_alone(char_bundle, [[0, 64]], 2)[0]


def _node_fails(bundle: Path, *args: str) -> str:
    """The Node client's error message for a command it must refuse (a non-zero exit)."""
    result = subprocess.run(
        ["node", str(NODE_DIR / "client.mjs"), str(bundle), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0, result.stdout
    return result.stderr


@pytest.mark.slow
def test_classifier_sentences_and_pairs(classifier_bundle: Path, client: Client) -> None:
    served = client(classifier_bundle, "classify", *SENTENCES, *[a for p in PAIRS for a in ("--pair", *p)])
    classifier = load(classifier_bundle, providers=["CPUExecutionProvider"])
    assert_same_predictions(served, classifier.classify([*SENTENCES, *PAIRS]))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_classifier_without_truncation_cuts_as_the_runtime_does(
    classifier_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A bundle whose tokenizer has no truncation (an imported one): texts and pairs past the
    context are cut longest-first from the right at the context, as the runtime cuts them."""
    bundle = without_truncation(classifier_bundle, tmp_path)
    served = client(bundle, "classify", *SENTENCES, *[a for p in PAIRS for a in ("--pair", *p)])
    classifier = load(bundle, providers=["CPUExecutionProvider"])
    assert_same_predictions(served, classifier.classify([*SENTENCES, *PAIRS]))  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["only_first", "only_second"])
def test_classifier_truncating_one_side_cuts_as_the_runtime_does(
    classifier_bundle: Path, client: Client, tmp_path: Path, strategy: str
) -> None:
    """A manifest that cuts one sentence of a pair: that sentence is cut where it can make the
    room, and the text or pair longest-first where it cannot, as the runtime cuts them."""
    bundle = truncating_one_side(classifier_bundle, tmp_path, strategy)
    long = "a gorgeous witty seductive movie " * 20
    pairs = [("ok", long), (long, "ok"), (long, long), ("dull", "dull")]
    served = client(bundle, "classify", long, "fine", *[a for p in pairs for a in ("--pair", *p)])
    classifier = load(bundle, providers=["CPUExecutionProvider"])
    assert_same_predictions(served, classifier.classify([long, "fine", *pairs]))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_translator_greedy_batched_as_alone_and_beam_search(
    translator_bundle: Path, client: Client, tmp_path: Path
) -> None:
    translator = load(translator_bundle, providers=["CPUExecutionProvider"])
    alone = [translator.translate_ids(*_source(translator, s), beam=1)[0] for s in SOURCES]  # type: ignore[attr-defined]
    assert len(set(map(tuple, alone))) == len(SOURCES), "every source steers its translation"
    rows = [_source(translator, s)[0][0].tolist() for s in SOURCES]
    width = max(map(len, rows))
    ids = np.array([r + [0] * (width - len(r)) for r in rows])  # right-padded
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    assert translator.translate_ids(ids, mask, beam=1) == alone  # type: ignore[attr-defined]
    served = client(translator_bundle, "translate", *SOURCES, "--beam", "1")
    assert [s["ids"] for s in served] == alone
    assert [s["text"] for s in served] == translator.translate(SOURCES, beam=1)  # type: ignore[attr-defined]
    served = client(translator_bundle, "translate", *SOURCES)  # the manifest's beam, 4
    assert [s["text"] for s in served] == translator.translate(SOURCES)  # type: ignore[attr-defined]
    # A stop token that ends the first source early, while the others go on.
    end = first_new_token(alone[0])
    bundle = _with_manifest(translator_bundle, tmp_path / "stops", "translation", stop_id=alone[0][end])
    stopping = load(bundle, providers=["CPUExecutionProvider"])
    expected = [stopping.translate_ids(*_source(stopping, s), beam=1)[0] for s in SOURCES]  # type: ignore[attr-defined]
    assert expected[0] == alone[0][:end] and any(len(e) > end for e in expected)
    assert [s["ids"] for s in client(bundle, "translate", *SOURCES, "--beam", "1")] == expected
    beams = [stopping.translate_ids(*_source(stopping, s))[0] for s in SOURCES]  # type: ignore[attr-defined]
    assert any(len(b) < stopping.translation.max_decode_len for b in beams)  # type: ignore[attr-defined]
    assert [s["ids"] for s in client(bundle, "translate", *SOURCES)] == beams  # hypotheses that finish


@pytest.mark.slow
def test_both_clients_frame_a_source_as_the_runtime_does(
    translator_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's source_prefix_ids and source_suffix_ids (BART's <s> ... </s>): each client's
    source rows are the runtime's, so its translations are, and the prefix steers them."""
    framed = _with_manifest(
        translator_bundle, tmp_path / "framed", "translation", source_prefix_ids=[2], source_suffix_ids=[3]
    )
    expected = load(framed, providers=["CPUExecutionProvider"]).translate(SOURCES, beam=1)  # type: ignore[attr-defined]
    plain = load(translator_bundle, providers=["CPUExecutionProvider"]).translate(SOURCES, beam=1)  # type: ignore[attr-defined]
    assert expected != plain
    assert [s["text"] for s in client(framed, "translate", *SOURCES, "--beam", "1")] == expected
    assert [s["text"] for s in client(framed, "translate", *SOURCES)] == load(framed).translate(SOURCES)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_both_clients_give_the_decoder_the_target_prefix_as_the_runtime_does(
    translator_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's target_prefix_ids (NLLB's target language code): each client's decoder reads
    the start and them before it chooses, greedy and in beam search, and returns the tokens
    chosen alone, as the runtime does; the prefix steers them."""
    prefixed = _with_manifest(
        translator_bundle, tmp_path / "prefixed", "translation", target_prefix_ids=[7, 9]
    )
    runtime = load(prefixed, providers=["CPUExecutionProvider"])
    plain = load(translator_bundle, providers=["CPUExecutionProvider"])
    for beam in (1, 4):
        expected = [runtime.translate_ids(*_source(runtime, s), beam=beam)[0] for s in SOURCES]  # type: ignore[attr-defined]
        assert expected != [plain.translate_ids(*_source(plain, s), beam=beam)[0] for s in SOURCES]  # type: ignore[attr-defined]
        assert [s["ids"] for s in client(prefixed, "translate", *SOURCES, "--beam", str(beam))] == expected


@pytest.mark.slow
def test_both_clients_end_a_cut_translation_with_the_stop_token_as_the_runtime_does(
    translator_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's forced_eos (transformers' forced_eos_token_id): the last of max_decode_len
    places is the stop token's, greedy and in beam search, so a cut translation is a token
    shorter; each client's are the runtime's."""
    cut = {"max_decode_len": 4}
    plain = load(_with_manifest(translator_bundle, tmp_path / "cut", "translation", **cut))
    bundle = _with_manifest(translator_bundle, tmp_path / "forced", "translation", forced_eos=True, **cut)
    runtime = load(bundle, providers=["CPUExecutionProvider"])
    for beam in (1, 4):
        unforced = [plain.translate_ids(*_source(plain, s), beam=beam)[0] for s in SOURCES]  # type: ignore[attr-defined]
        expected = [runtime.translate_ids(*_source(runtime, s), beam=beam)[0] for s in SOURCES]  # type: ignore[attr-defined]
        assert max(map(len, expected)) == 3 and max(map(len, unforced)) == 4
        assert [s["ids"] for s in client(bundle, "translate", *SOURCES, "--beam", str(beam))] == expected


@pytest.mark.slow
def test_both_clients_ban_what_the_runtime_bans(
    translator_bundle: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's suppressed_ids (the token the translations choose most), min_decode_len (past
    where a stop token ends the first source's), no_repeat_ngram_size and banned_sequences (the
    first two tokens the others leave the second source): each client's translations, greedy and
    in beam search, are the runtime's, which the bans change."""
    plain = load(translator_bundle, providers=["CPUExecutionProvider"])
    alone = [plain.translate_ids(*_source(plain, s), beam=1)[0] for s in SOURCES]  # type: ignore[attr-defined]
    end = first_new_token(alone[0])
    stopping = {"stop_id": alone[0][end]}
    (most, _), *_ = collections.Counter(t for row in alone for t in row if t != alone[0][end]).most_common(1)
    bans = {"suppressed_ids": [most], "min_decode_len": end + 2, "no_repeat_ngram_size": 2}
    others = load(_with_manifest(translator_bundle, tmp_path / "others", "translation", **stopping, **bans))
    left = others.translate_ids(*_source(others, SOURCES[1]), beam=1)[0]  # type: ignore[attr-defined]
    bans |= {"banned_sequences": [left[:2]]}
    unbanned = load(_with_manifest(translator_bundle, tmp_path / "stops", "translation", **stopping))
    bundle = _with_manifest(translator_bundle, tmp_path / "bans", "translation", **stopping, **bans)
    runtime = load(bundle, providers=["CPUExecutionProvider"])
    for beam in (1, 4):
        expected = [runtime.translate_ids(*_source(runtime, s), beam=beam)[0] for s in SOURCES]  # type: ignore[attr-defined]
        assert expected != [unbanned.translate_ids(*_source(unbanned, s), beam=beam)[0] for s in SOURCES]  # type: ignore[attr-defined]
        assert most not in {t for row in expected for t in row} and min(map(len, expected)) >= end + 2
        assert beam > 1 or expected[1][:2] != left[:2]
        assert [s["ids"] for s in client(bundle, "translate", *SOURCES, "--beam", str(beam))] == expected


@pytest.fixture(scope="module")
def likely_eos_translator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An imported tiny BART (tests/test_hf_bart.py's) whose eos is likely, so that beam search's
    hypotheses finish at many lengths: its bundle, 12 tokens at most."""
    test_hf_bart = pytest.importorskip("test_hf_bart")
    from tfcompile.hf.importer import import_folder

    root = tmp_path_factory.mktemp("bart")
    hf = test_hf_bart.saved_with_bart_tokenizer(root / "hf").eval()
    test_hf_bart.with_likely_eos(root / "hf", hf)
    test_hf_bart.with_generation(root / "hf", max_new_tokens=12)
    result = import_folder(root / "hf", "run", root / "specs", root / "runs")
    assert main(["export", str(result.run_dir), "--out", str(root / "bundle")]) == 0
    return root / "bundle"


@pytest.mark.slow
def test_both_clients_search_beams_as_the_runtime_does_under_each_scoring(
    likely_eos_translator: Path, client: Client, tmp_path: Path
) -> None:
    """A manifest's beam_scoring "transformers" (generate()'s beam search, which
    tests/test_hf_bart.py holds the runtime to) under settings that each change a translation
    (test_hf_bart.BEAM_SETTINGS, and forced_eos), and "fairseq": each client's translations are
    the runtime's, which each setting changes."""
    from test_hf_bart import BEAM_SETTINGS
    from test_hf_paths import SENTENCES

    names = {"num_beams": "beam"}  # generation_config.json's name -> the manifest's
    settings = [{names.get(k, k): v for k, v in s.items()} for s in BEAM_SETTINGS]
    settings += [
        {"beam": 4, "forced_eos": True},
        {"beam": 4, "beam_scoring": "fairseq", "length_penalty": 2.0},
    ]
    seen = []
    for i, setting in enumerate(settings):
        bundle = _with_manifest(likely_eos_translator, tmp_path / str(i), "translation", **setting)
        runtime = load(bundle, providers=["CPUExecutionProvider"])
        assert runtime.translation.beam_scoring == setting.get("beam_scoring", "transformers")  # type: ignore[attr-defined]
        prefix, suffix, _ = runtime.framing()  # type: ignore[attr-defined]
        rows = [[*prefix, *e.ids, *suffix] for e in runtime.encode(SENTENCES, add_special_tokens=False)]
        expected = [runtime.translate_ids(np.array([row]))[0] for row in rows]  # type: ignore[attr-defined]
        seen.append(tuple(map(tuple, expected)))
        assert [s["ids"] for s in client(bundle, "translate", *SENTENCES)] == expected
    assert len(set(seen)) == len(settings)


def _source(translator: Any, text: str) -> tuple[np.ndarray, np.ndarray]:
    ids = translator.encode([text], add_special_tokens=False)[0].ids[: translator.max_seq_len]
    return np.array([ids]), np.ones((1, len(ids)), dtype=np.int64)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Arrays and PNG files: already 8 x 8, larger (down-sampled; 21 x 16 rounds 10.5 to 10),
    smaller (up-sampled), grey, RGB and RGBA (read as grey, as the bundle says), 16-bit grey and
    RGB."""
    from PIL import Image
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("images")
    digits, rng = load_digits().images, np.random.default_rng(0)
    np.save(folder / "float.npy", digits[0] / 16)
    np.save(folder / "uint8.npy", (digits[1] * 16).clip(0, 255).astype(np.uint8))
    np.save(folder / "float32_12x9.npy", rng.random((12, 9), dtype=np.float32))
    arrays = {
        "grey.png": (digits[2] * 16).clip(0, 255).astype(np.uint8),
        "grey_21x16.png": rng.integers(0, 256, (21, 16), dtype=np.uint8),
        "rgb_5x7.png": rng.integers(0, 256, (5, 7, 3), dtype=np.uint8),
        "rgb_40x32.png": rng.integers(0, 256, (40, 32, 3), dtype=np.uint8),
        "rgba_30x45.png": rng.integers(0, 256, (30, 45, 4), dtype=np.uint8),
    }
    for name, array in arrays.items():
        Image.fromarray(array).save(folder / name)
    (folder / "grey16_9x11.png").write_bytes(png16(rng.integers(0, 65536, (9, 11))))
    (folder / "rgb16_8x8.png").write_bytes(png16(rng.integers(0, 65536, (8, 8, 3))))
    return sorted(folder.iterdir())


@pytest.mark.slow
def test_image_classifier_files_and_arrays(image_bundle: Path, images: list[Path], client: Client) -> None:
    served = client(image_bundle, "classify-image", *map(str, images))
    vit = load(image_bundle, providers=["CPUExecutionProvider"])
    inputs = [np.load(p) if p.suffix == ".npy" else p for p in images]
    assert_same_predictions(served, vit.classify_images(inputs))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_node_client_refuses_the_arrays_the_runtime_refuses(
    image_bundle: Path, node_client: Client, tmp_path: Path
) -> None:
    """A grey (1-channel) model takes (H, W) and (H, W, 1) arrays, uint8 or floats in [0, 1], as the
    runtime does; an array of other channels, dimensions or values is refused, with its shape or
    values and what the model takes, not read as something else."""
    rng = np.random.default_rng(0)
    taken = {
        "hw.npy": rng.integers(0, 256, (9, 7), dtype=np.uint8),
        "hw1.npy": rng.integers(0, 256, (9, 7, 1), dtype=np.uint8),
        "hw1_float.npy": rng.random((6, 8, 1)),
    }
    refused = {
        "rgb.npy": (rng.integers(0, 256, (9, 7, 3), dtype=np.uint8), "(9, 7, 3)"),
        "rgba.npy": (rng.integers(0, 256, (8, 8, 4), dtype=np.uint8), "(8, 8, 4)"),
        "4d.npy": (rng.integers(0, 256, (8, 8, 1, 1), dtype=np.uint8), "(8, 8, 1, 1)"),
        "1d.npy": (rng.integers(0, 256, 64, dtype=np.uint8), "(64,)"),
        "empty.npy": (np.zeros((0, 8), dtype=np.uint8), "(0, 8)"),
        "float_255.npy": ((rng.random((8, 8)) * 255).astype(np.float32), "[0, 1]"),
        "float_negative.npy": (rng.random((8, 8)) - 0.5, "[0, 1]"),
        "float_nan.npy": (np.full((8, 8), np.nan, dtype=np.float32), "[0, 1]"),
        "int64.npy": (rng.integers(0, 256, (8, 8)), "uint8 (0-255) or float (0-1)"),
    }
    vit = load(image_bundle, providers=["CPUExecutionProvider"])
    for name, array in {**taken, **{n: a for n, (a, _) in refused.items()}}.items():
        np.save(tmp_path / name, array)
    served = node_client(image_bundle, "classify-image", *(str(tmp_path / n) for n in taken))
    assert_same_predictions(served, vit.classify_images(list(taken.values())))  # type: ignore[attr-defined]
    for name, (array, shown) in refused.items():
        with pytest.raises(InputError):
            vit.classify_images([array])  # type: ignore[attr-defined]
        stderr = _node_fails(image_bundle, "classify-image", str(tmp_path / name))
        assert shown in stderr, (name, stderr)
        if "float" not in name and name != "int64.npy":
            assert "(height, width, 1) or (height, width)" in stderr, (name, stderr)
