"""The example clients against what a second review found them to serve otherwise than the runtime:
PNGs with a tRNS colour key, a capital sigma under a lowercasing normaliser, manifests the runtime
refuses at load (a truncation too short for the special tokens, the wrong padding side, another
context), and the Node client's command line (unknown flags read as texts)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import damaged, edited_tokenizer
from test_examples import (
    NODE_DIR,
    PYTHON_CLIENT,
    assert_same_predictions,
    node_client,  # noqa: F401 (a fixture)
    python_client,
)
from test_examples_review import served_by

from tfcompile.errors import BundleError
from tfcompile.runtime import load

NODE_README = NODE_DIR / "README.md"


def _command(kind: str) -> list[str]:
    if kind == "python":
        return [sys.executable, str(PYTHON_CLIENT)]
    return [str(shutil.which("node")), str(NODE_DIR / "client.mjs")]


def _fails(kind: str, bundle: Path, *args: str) -> subprocess.CompletedProcess:
    """A client's run of a command it must refuse: a non-zero exit and no traceback."""
    result = subprocess.run(
        [*_command(kind), str(bundle), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "    at " not in result.stderr, result.stderr
    return result


def _png(array: np.ndarray, depth: int, key: tuple[int, ...]) -> bytes:
    """A grey (H, W) or RGB (H, W, 3) PNG of 8- or 16-bit samples with a tRNS colour key (Pillow
    writes no 16-bit colour PNG, nor a 16-bit key)."""
    array = np.asarray(array, dtype=">u2" if depth == 16 else np.uint8)
    height, width = array.shape[:2]
    colour = 0 if array.ndim == 2 else 2
    rows = b"".join(b"\x00" + array[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"tRNS", struct.pack(f">{len(key)}H", *key))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
def test_both_clients_keep_the_colour_of_a_png_colour_key_as_the_runtime_does(
    image_bundle: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """A grey or RGB PNG with a tRNS colour key: pngjs made the key's pixels transparent black
    (0, 0, 0, 0), where Pillow, as the runtime reads PNGs, keeps their colour."""
    from PIL import Image

    rng = np.random.default_rng(3)
    grey = rng.integers(0, 256, (8, 8), dtype=np.uint8)
    grey[2:6, 1:5] = 200
    rgb = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    rgb[1:6, 2:7] = (200, 180, 160)
    Image.fromarray(grey).save(tmp_path / "grey8.png", transparency=200)
    Image.fromarray(rgb).save(tmp_path / "rgb8.png", transparency=(200, 180, 160))
    grey16 = rng.integers(0, 65536, (8, 8))
    grey16[2:6, 1:5] = 51_234
    rgb16 = rng.integers(0, 65536, (8, 8, 3))
    rgb16[1:6, 2:7] = (51_234, 46_000, 41_000)
    (tmp_path / "grey16.png").write_bytes(_png(grey16, 16, (51_234,)))
    (tmp_path / "rgb16.png").write_bytes(_png(rgb16, 16, (51_234, 46_000, 41_000)))
    paths = [tmp_path / name for name in ("grey8.png", "rgb8.png", "grey16.png", "rgb16.png")]
    vit = load(image_bundle, providers=["CPUExecutionProvider"])
    expected = vit.classify_images([str(p) for p in paths])  # type: ignore[attr-defined]
    # the key's pixels tell: as black, the probabilities move
    keyed_black = [np.where(grey == 200, 0, grey).astype(np.uint8)]
    assert vit.classify_images(keyed_black)[0].probabilities != expected[0].probabilities  # type: ignore[attr-defined]
    served = served_by(kind, request)(image_bundle, "classify-image", *map(str, paths))
    assert_same_predictions(served, expected)


def _with_greek_words(bundle: Path, tmp_path: Path, normalizer: dict | None = None) -> Path:
    """A copy of the classifier whose last two vocabulary words are "οδοσ" and "οδος" (and whose
    normaliser is ``normalizer``, where given)."""

    def change(tokenizer: dict) -> None:
        vocab = tokenizer["model"]["vocab"]
        last = sorted(vocab, key=vocab.get)[-2:]
        vocab["οδοσ"], vocab["οδος"] = vocab.pop(last[0]), vocab.pop(last[1])
        if normalizer is not None:
            tokenizer["normalizer"] = normalizer

    return damaged(bundle, tmp_path, **{"tokenizer.json": edited_tokenizer(bundle, change)})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
@pytest.mark.parametrize(
    "normalizer",
    [None, {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}],
    ids=["BertNormalizer", "NFKC then Lowercase"],
)
def test_both_clients_lowercase_a_capital_sigma_as_the_runtime_does(
    classifier_bundle: Path,
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
    normalizer: dict | None,
) -> None:
    """The Rust tokenizers library lowercases the capital sigma that ends a word to the small
    sigma; JavaScript's toLowerCase() to the final sigma (Final_Sigma): the Node client read
    "ΟΔΟΣ" as another token than the runtime."""
    bundle = _with_greek_words(classifier_bundle, tmp_path, normalizer)
    texts = ["ΟΔΟΣ", "ΟΔΟΣ ΟΔΟΣ.", "οδος", "οδοσ"]
    if normalizer is not None:
        texts += ["ΟΔΟ\U0001d6ba", "ΟΔΟϹ"]  # NFKC makes a Σ of each
    model = load(bundle, providers=["CPUExecutionProvider"])
    assert [e.tokens[1] for e in model.encode(["ΟΔΟΣ", "οδος"])] == ["οδοσ", "οδος"]
    expected = model.classify(texts)  # type: ignore[attr-defined]
    assert expected[0].probabilities != expected[2].probabilities  # the two sigmas' tokens tell
    assert_same_predictions(served_by(kind, request)(bundle, "classify", *texts), expected)


def _truncating_at(bundle: Path, tmp_path: Path, length: int, manifest_length: int | None = None) -> Path:
    """A copy of the classifier whose tokenizer.json truncates at ``length`` tokens, and whose
    manifest says ``manifest_length`` (default: the same)."""
    cut = {"max_length": length, "strategy": "LongestFirst", "direction": "Right", "stride": 0}
    said = length if manifest_length is None else manifest_length
    return damaged(
        bundle,
        tmp_path,
        lambda m: m["tokenizer"]["truncation"].update(max_length=said),
        **{"tokenizer.json": edited_tokenizer(bundle, lambda t: t.update(truncation=cut))},
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
def test_both_clients_refuse_a_truncation_shorter_than_the_special_tokens(
    classifier_bundle: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """max_length 2 for [CLS] and [SEP]: the runtime refuses the bundle at load; the Node client
    computed a negative limit, kept nearly every token and crashed in onnxruntime (a stack trace),
    and the Python client gave the tokenizers library's error for each text it cut."""
    if kind == "node":
        request.getfixturevalue("node_client")
    bundle = _truncating_at(classifier_bundle, tmp_path, 2)
    with pytest.raises(BundleError, match="special tokens"):
        load(bundle, providers=["CPUExecutionProvider"])
    for args in (["classify", "--pair", "w " * 40, "v " * 40], ["classify", "a short one"]):
        stderr = _fails(kind, bundle, *args).stderr.strip()
        assert len(stderr.splitlines()) == 1, stderr
        assert "stride 0 is not below the 2 tokens it keeps less the 2 special tokens" in stderr, stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
def test_both_clients_refuse_a_manifest_truncation_that_is_not_the_tokenizers(
    classifier_bundle: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """A manifest that says 7 tokens where tokenizer.json cuts at 20: the runtime refuses it at
    load; the Node client cut as the manifest says, without an error."""
    if kind == "node":
        request.getfixturevalue("node_client")
    bundle = _truncating_at(classifier_bundle, tmp_path, 20, manifest_length=7)
    with pytest.raises(BundleError, match=r"tokenizer\.truncation"):
        load(bundle, providers=["CPUExecutionProvider"])
    stderr = _fails(kind, bundle, "classify", "a gorgeous witty seductive movie " * 3).stderr
    assert "but the manifest's tokenizer.truncation says" in stderr, stderr


def _refused_manifests() -> list[Any]:
    """(bundle fixture, manifest change, command, what the refusal says) the runtime refuses at load."""
    return [
        pytest.param(
            "char_bundle",
            lambda m: m["padding"].update(side="right"),
            ["generate", "--ids", "5,6,7", "--ids", "8", "--max-new-tokens", "3"],
            "padding.side",
            id="decoder padded right",
        ),
        pytest.param(
            "char_bundle",
            lambda m: m["generation"].update(context_length=10),
            ["generate", "--ids", ",".join(["5"] * 12), "--max-new-tokens", "3"],
            "generation.context_length (10) is not model.max_seq_len (64)",
            id="decoder of another context",
        ),
        pytest.param(
            "classifier_bundle",
            lambda m: m["padding"].update(side="left"),
            ["classify", "a gorgeous movie", "bad"],
            "padding.side",
            id="classifier padded left",
        ),
        pytest.param(
            "translator_bundle",
            lambda m: m["padding"].update(side="left"),
            ["translate", "Ein Hund rennt.", "Eine Frau."],
            "padding.side",
            id="translator padded left",
        ),
        pytest.param(
            "translator_bundle",
            lambda m: m["translation"].update(stop_id=100_000),
            ["translate", "Eine Frau."],
            "no translation could end",
            id="translator stop_id outside the tokenizer",
        ),
        pytest.param(
            "translator_bundle",
            lambda m: m["tokenizer"]["special_tokens"].pop("unk"),
            ["translate", "Eine Frau."],
            "names no unk token",
            id="translator without unk",
        ),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
@pytest.mark.parametrize(("fixture", "change", "args", "refusal"), _refused_manifests())
def test_both_clients_refuse_the_manifests_the_runtime_refuses_at_load(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind: str,
    fixture: str,
    change: Any,
    args: list[str],
    refusal: str,
) -> None:
    """A manifest the runtime refuses at load was served by both clients without an error, and not
    as the runtime checked the graphs: a decoder padded on the right or sliding at another context,
    a classifier or translator padded on the left, a translator that can never stop."""
    if kind == "node":
        request.getfixturevalue("node_client")
    bundle = damaged(request.getfixturevalue(fixture), tmp_path, change)
    with pytest.raises(BundleError):
        load(bundle, providers=["CPUExecutionProvider"])
    stderr = _fails(kind, bundle, *args).stderr.strip()
    assert refusal in stderr and len(stderr.splitlines()) == 1, stderr


# Command lines the Python client's argparse refuses (exit status 2): unknown or misspelled flags,
# a flag without its value, stray inputs, no input.
BAD_COMMAND_LINES = [
    ("char", ["generate", "--prompt"], "argument --prompt: expected one argument"),
    ("char", ["generate", "--prompt", "--ids", "5"], "argument --prompt: expected one argument"),
    ("char", ["generate", "--prompt", "ROMEO", "--max_new_tokens", "3"], "unrecognized arguments"),
    ("char", ["generate", "--prompt", "ROMEO", "stray"], "unrecognized arguments: stray"),
    ("char", ["generate", "--ids", "5", "--beam", "2"], "unrecognized arguments"),
    ("char", ["bogus", "x"], "invalid choice"),
    ("classifier", ["classify", "--typo", "good"], "unrecognized arguments: --typo"),
    ("classifier", ["classify", "--pair", "only one"], "argument --pair: expected 2 arguments"),
    ("translator", ["translate"], "the following arguments are required: texts"),
    ("translator", ["translate", "x", "--bean", "2"], "unrecognized arguments"),
    ("image", ["classify-image"], "the following arguments are required: images"),
]


@pytest.mark.slow
def test_the_node_command_line_refuses_what_the_python_one_refuses(
    char_bundle: Path,
    classifier_bundle: Path,
    translator_bundle: Path,
    image_bundle: Path,
    request: pytest.FixtureRequest,
) -> None:
    """An unknown or misspelled flag was read as a text to serve, a flag without its value crashed
    inside the tokenizer library, and a command without inputs printed []: argparse's usage errors
    (exit status 2) in the Python client. The flags both take still work, in argparse's forms."""
    bundles = {
        "char": char_bundle,
        "classifier": classifier_bundle,
        "translator": translator_bundle,
        "image": image_bundle,
    }
    node = request.getfixturevalue("node_client")
    for name, args, refusal in BAD_COMMAND_LINES:
        for kind in ("python", "node"):
            result = _fails(kind, bundles[name], *args)
            assert result.returncode == 2 and refusal in result.stderr, (kind, args, result.stderr)
            assert "usage:" in result.stderr, (kind, args, result.stderr)
    for args in (
        ["generate", "--ids=0,64", "--max-new-tokens=2"],
        ["generate", "--ids", "0,64", "--max", "2"],  # a prefix that names one flag
        ["generate", "--prompt", "ROMEO:", "--prompt", "JULIET:", "--max-new-tokens", "3"],
    ):
        assert node(char_bundle, *args) == python_client(char_bundle, *args), args
    logits = ["logits", "--ids", "5,6"]
    np.testing.assert_allclose(node(char_bundle, *logits), python_client(char_bundle, *logits), atol=1e-5)
    pair = ["classify", "fine", "--pair", "a premise", "a hypothesis", "--", "--not-a-flag"]
    assert_same_predictions(
        node(classifier_bundle, *pair),
        load(classifier_bundle, providers=["CPUExecutionProvider"]).classify(  # type: ignore[attr-defined]
            ["fine", "--not-a-flag", ("a premise", "a hypothesis")]
        ),
    )
    served = node(translator_bundle, "translate", "Eine Frau.", "--beam", "2")
    assert served == python_client(translator_bundle, "translate", "Eine Frau.", "--beam", "2")


@pytest.mark.slow
@pytest.mark.usefixtures("node_client")  # the Node client's packages installed
def test_the_node_readme_lists_the_fortran_order_arrays_it_refuses(
    image_bundle: Path, tmp_path: Path
) -> None:
    """The runtime takes a Fortran-order .npy (np.save of a transposed array); the Node client
    refuses it, and its README's list of the arrays it refuses that the runtime takes named it not."""
    array = np.random.default_rng(0).integers(0, 256, (8, 9), dtype=np.uint8).T
    np.save(tmp_path / "fortran.npy", array)
    assert "fortran_order': True" in (tmp_path / "fortran.npy").read_bytes()[:128].decode("latin1")
    vit: Any = load(image_bundle, providers=["CPUExecutionProvider"])
    vit.classify_images([np.load(tmp_path / "fortran.npy")])  # taken
    refused = _fails("node", image_bundle, "classify-image", str(tmp_path / "fortran.npy"))
    assert "Fortran-ordered" in refused.stderr
    # the sentence of the README's Images section that lists what the runtime takes and this refuses
    images = " ".join(NODE_README.read_text().split("## Images", 1)[1].split())
    listed = next(sentence for sentence in images.split(". ") if "which the runtime takes" in sentence)
    assert "Fortran" in listed, listed


def test_the_python_client_refuses_a_decoder_padded_on_the_right(char_bundle: Path, tmp_path: Path) -> None:
    """The default suite's check of the load refusals: the Python client padded a decoder's
    prompts on the right, as the manifest said, and generated from the padding."""
    bundle = damaged(char_bundle, tmp_path, lambda m: m["padding"].update(side="right"))
    with pytest.raises(BundleError):
        load(bundle, providers=["CPUExecutionProvider"])
    stderr = _fails("python", bundle, "generate", "--ids", "5,6,7", "--ids", "8").stderr
    assert "padding.side is 'right', where a causal_lm bundle's rows are padded on the left" in stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "node"])
def test_both_clients_cut_a_prompt_as_tokenizer_json_says_under_a_manifest_truncation_of_null(
    char_bundle: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """A manifest whose tokenizer.truncation is null (as one without the field: the runtime checks
    neither against tokenizer.json) leaves a decoder's prompt to tokenizer.json's truncation, as the
    runtime cuts it; the Node client read null as no truncation, and kept the whole prompt."""
    cut = {"max_length": 20, "strategy": "LongestFirst", "direction": "Right", "stride": 0}
    bundle = damaged(
        char_bundle,
        tmp_path,
        lambda m: m["tokenizer"].update(truncation=None),
        **{"tokenizer.json": edited_tokenizer(char_bundle, lambda t: t.update(truncation=cut))},
    )
    prompt = "But soft, what light through yonder window breaks? It is the east."
    model = load(bundle, providers=["CPUExecutionProvider"])
    ids = model.encode([prompt])[0].ids
    assert len(ids) == 20
    served = served_by(kind, request)(bundle, "generate", "--prompt", prompt, "--max-new-tokens", "4")
    assert served[0]["prompt_ids"] == ids
