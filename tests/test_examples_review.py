"""The Python client against bundles a review found it served otherwise than the runtime, without
an error: a tokenizer.json that pads (an imported one may), and image arrays the runtime refuses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import damaged, edited_tokenizer
from test_examples import (
    NODE_DIR,
    PAIRS,
    PYTHON_CLIENT,
    SENTENCES,
    assert_same_predictions,
    node_client,  # noqa: F401 (a fixture)
    python_client,
)

from tfcompile.errors import BundleError, InputError
from tfcompile.runtime import load


@pytest.mark.slow
def test_the_python_client_pads_as_the_manifest_says_not_as_tokenizer_json_does(
    classifier_bundle: Path, tmp_path: Path
) -> None:
    """A Hub tokenizer.json that pads to a multiple of 8 keeps its setting through import and
    export: the client counted that padding as tokens (0.7126 for 0.7243)."""
    padding = {
        "strategy": "BatchLongest",
        "direction": "Right",
        "pad_to_multiple_of": 8,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    bundle = damaged(
        classifier_bundle,
        tmp_path,
        **{"tokenizer.json": edited_tokenizer(classifier_bundle, lambda t: t.update(padding=padding))},
    )
    served = python_client(bundle, "classify", *SENTENCES)
    classifier = load(bundle, providers=["CPUExecutionProvider"])
    assert_same_predictions(served, classifier.classify(SENTENCES))  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("array", "refusal"),
    [
        (np.full((8, 8), 200, dtype=np.int64), "must be uint8 (0-255) or float (0-1), got int64"),
        (np.full((8, 8), 200.0, dtype=np.float32), "must hold values in [0, 1], found [200, 200]"),
        (np.zeros((8, 8, 3), dtype=np.uint8), "must have shape (height, width, 1)"),
    ],
    ids=["int64 0-255", "float 0-255", "three channels for one"],
)
def test_the_python_client_refuses_the_image_arrays_the_runtime_refuses(
    image_bundle: Path, tmp_path: Path, array: np.ndarray, refusal: str
) -> None:
    """An int64 array of 0-255 was read as floats in [0, 1], and floats of 0-255 as they were."""
    with pytest.raises(InputError):
        load(image_bundle, providers=["CPUExecutionProvider"]).classify_images([array])  # type: ignore[attr-defined]
    np.save(tmp_path / "image.npy", array)
    command = [
        sys.executable,
        str(PYTHON_CLIENT),
        str(image_bundle),
        "classify-image",
        str(tmp_path / "image.npy"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode != 0 and refusal in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("node_client")  # the Node client's packages installed
@pytest.mark.parametrize("labels", [["negative"], ["negative", "positive", "neutral"]], ids=["1", "3"])
def test_both_clients_refuse_a_manifest_of_other_labels_than_the_logits(
    classifier_bundle: Path, tmp_path: Path, labels: list[str]
) -> None:
    """The Node client named the classes of a damaged manifest's labels (a 2-way model read as
    {"negative": 1}); the Python one failed in zip. Both refuse, as the runtime does at load."""
    bundle = damaged(classifier_bundle, tmp_path, lambda m: m.update(labels=labels))
    with pytest.raises(BundleError):
        load(bundle, providers=["CPUExecutionProvider"])
    node = [str(shutil.which("node")), str(NODE_DIR / "client.mjs")]
    for command in ([sys.executable, str(PYTHON_CLIENT)], node):
        result = subprocess.run(
            [*command, str(bundle), "classify", "fine"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode != 0, result.stdout
        assert f"names {len(labels)} labels, but the graph gives 2 logits a row" in result.stderr


def served_by(kind: str, request: pytest.FixtureRequest) -> Any:
    """The Python or the Node client (its packages installed)."""
    return python_client if kind == "python" else request.getfixturevalue("node_client")


def _refusal(kind: str, bundle: Path, *args: str) -> str:
    """A client's error message for a command it must refuse: a non-zero exit, no traceback."""
    command = (
        [sys.executable, str(PYTHON_CLIENT)] if kind == "python" else ["node", str(NODE_DIR / "client.mjs")]
    )
    result = subprocess.run(
        [*command, str(bundle), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "    at " not in result.stderr, result.stderr
    return result.stderr


def test_the_python_client_refuses_what_is_not_a_token_id(char_bundle: Path) -> None:
    """--ids rows hold integers in [0, vocabulary) alone, as the runtime takes them: -1 was read
    as 64 (onnxruntime's Gather wraps), 65 and "5,,6" ended in a traceback."""
    for row in ["-1", "5,-3", "65", "5,,6", "1.5", "x", "²"]:
        assert "not a token id in [0, 65)" in _refusal("python", char_bundle, "generate", f"--ids={row}"), row
        assert "not a token id in [0, 65)" in _refusal("python", char_bundle, "logits", f"--ids={row}"), row
    served = python_client(char_bundle, "generate", "--ids", "0,64", "--max-new-tokens", "2")
    model = load(char_bundle, providers=["CPUExecutionProvider"])
    assert served[0]["new_ids"] == model.generate(np.array([[0, 64]]), 2, temperature=0)[0, 2:].tolist()


def test_the_python_client_refuses_logits_past_the_context(char_bundle: Path) -> None:
    """The full graph reads no more than the context (64), as the runtime's logits() refuses;
    generation slides past it. The client gave onnxruntime's INVALID_ARGUMENT traceback."""
    prompt = ",".join(["5"] * 65)
    stderr = _refusal("python", char_bundle, "logits", "--ids", prompt)
    assert "a prompt of 65 tokens is longer than the context (64)" in stderr
    with pytest.raises(InputError):
        load(char_bundle, providers=["CPUExecutionProvider"]).logits(np.full((1, 65), 5))
    assert (
        len(python_client(char_bundle, "generate", "--ids", prompt, "--max-new-tokens", "2")[0]["new_ids"])
        == 2
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
def test_both_clients_refuse_the_counts_the_runtime_refuses(
    char_bundle: Path,
    translator_bundle: Path,
    classifier_bundle: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """--beam 0 or -1 translated greedily and --max-new-tokens -3 generated nothing, where the
    runtime refuses beam < 1 and max_new_tokens < 0; classify with no text crashed."""
    served_by(kind, request)  # the Node client's packages installed
    translator = load(translator_bundle, providers=["CPUExecutionProvider"])
    for beam in ["0", "-1", "1.5", "x"]:
        if beam.lstrip("-").isdigit():
            with pytest.raises(InputError):
                translator.translate(["x"], beam=int(beam))
        stderr = _refusal(kind, translator_bundle, "translate", "x", "--beam", beam)
        assert "--beam" in stderr and "must be a whole number >= 1" in stderr, stderr
    with pytest.raises(InputError):
        load(char_bundle, providers=["CPUExecutionProvider"]).generate(np.array([[5]]), -3)
    for count in ["-3", "2.5"]:
        stderr = _refusal(kind, char_bundle, "generate", "--ids", "5", "--max-new-tokens", count)
        assert "--max-new-tokens" in stderr and "must be a whole number >= 0" in stderr, stderr
    assert "give at least one text or --pair" in _refusal(kind, classifier_bundle, "classify")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
@pytest.mark.parametrize("strategy", ["longest_first", "only_first"])
def test_both_clients_truncate_from_the_left_as_the_runtime_does(
    classifier_bundle: Path, tmp_path: Path, strategy: str, kind: str, request: pytest.FixtureRequest
) -> None:
    """A manifest (and tokenizer.json) whose truncation cuts from the left: a text or pair keeps
    its last tokens, as the tokenizers library and the runtime cut it; the Node client refused it."""
    length = json.loads((classifier_bundle / "manifest.json").read_text())["tokenizer"]["truncation"]
    length = length["max_length"]
    cut = {
        "max_length": length,
        "strategy": strategy.title().replace("_", ""),
        "direction": "Left",
        "stride": 0,
    }
    bundle = damaged(
        classifier_bundle,
        tmp_path,
        lambda m: m["tokenizer"]["truncation"].update(strategy=strategy, direction="left"),
        **{"tokenizer.json": edited_tokenizer(classifier_bundle, lambda t: t.update(truncation=cut))},
    )
    long = "a gorgeous witty seductive movie " * 10 + "but dull dull dull"
    other = "the plot is thin and the acting wooden " * 5
    texts = [long, "fine", *SENTENCES]
    pairs = [("ok", long), (long, "ok"), (long, other), *PAIRS]
    expected = load(bundle, providers=["CPUExecutionProvider"]).classify([*texts, *pairs])
    right = load(classifier_bundle, providers=["CPUExecutionProvider"]).classify([*texts, *pairs])
    assert [p.probabilities for p in expected] != [p.probabilities for p in right]
    served = served_by(kind, request)(bundle, "classify", *texts, *[a for p in pairs for a in ("--pair", *p)])
    assert_same_predictions(served, expected)
