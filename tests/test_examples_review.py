"""The Python client against bundles a review found it served otherwise than the runtime, without
an error: a tokenizer.json that pads (an imported one may), and image arrays the runtime refuses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import damaged, edited_tokenizer
from test_examples import (
    NODE_DIR,
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
