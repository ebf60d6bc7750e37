"""Bundles are untrusted input, and their manifest is a published contract: the schema file is
the models' schema, format 1 bundles still serve, and no manifest or file can make the loader
open something outside the bundle, crash with anything but BundleError, or hang."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import onnx
import pytest
from helpers import ROOT, assert_follows_schema, damaged, edited_tokenizer, mutate_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfcompile.export import Source, export_bundle
from tfcompile.manifest import manifest_schema
from tfcompile.runtime import BundleError, InputError, LanguageModel, Translator, load
from tfcompile.spec import load_spec

DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "tiny"
    spec = load_spec(
        ROOT / "specs" / "shakespeare-char.yaml",
        ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=8"],
    )
    export_bundle(spec, Source(seed=0), out)
    return out


def test_the_committed_schema_is_the_manifest_models_schema() -> None:
    committed = json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())
    assert committed == manifest_schema(), (
        "regenerate it: tfcompile schema manifest > schemas/manifest.schema.json"
    )


def test_an_exported_manifest_follows_the_published_schema(bundle: Path) -> None:
    assert_follows_schema(bundle)


def test_format_1_bundles_still_serve_as_their_tfcompile_served_them() -> None:
    expected = json.loads((DATA / "format1-expected.json").read_text())
    decoder = load(DATA / "format1-decoder")
    assert isinstance(decoder, LanguageModel)
    ids = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    assert float(decoder.logits(ids).astype(np.float64).sum()) == pytest.approx(
        expected["decoder_logits_sum"], abs=1e-4
    )
    assert decoder.generate(ids[:1], 8, temperature=0).tolist() == expected["decoder_greedy"]
    assert decoder.generate_text("ROMEO:", 6, temperature=0) == expected["decoder_text"]
    translator = load(DATA / "format1-translator")
    assert isinstance(translator, Translator)
    assert translator.translate_ids(ids, beam=1, max_len=6) == expected["translator_greedy"]
    assert translator.translate_ids(ids, beam=3, max_len=6) == expected["translator_beam"]


def test_a_format_1_classifier_classifies_as_its_tfcompile_did() -> None:
    """Its tokenizer.json truncates and its manifest names no truncation (no field then): it loads,
    and texts and pairs past the context encode and classify as that version's runtime did."""
    expected = json.loads((DATA / "format1-classifier-expected.json").read_text())
    classifier = load(DATA / "format1-classifier")
    items = [*expected["texts"], *map(tuple, expected["pairs"])]
    encodings = classifier.encode(items)
    assert [e.ids for e in encodings] == expected["ids"]
    assert [e.type_ids for e in encodings] == expected["type_ids"]
    for prediction, said in zip(classifier.classify(items), expected["predictions"], strict=True):
        assert prediction.label == said["label"]
        assert prediction.probabilities == pytest.approx(said["probabilities"], abs=1e-6)


# ----------------------------------------------------------------- untrusted bundles


@pytest.fixture
def copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(bundle, out)
    return out


def _edit(folder: Path, change: Any) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


class _Opens:
    """Records every file the process opens (an audit hook: open() and os.open() alike)."""

    paths: list[str] | None = None

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.paths is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            cls.paths.append(os.fsdecode(args[0]))


sys.addaudithook(_Opens.hook)


@pytest.fixture
def opened() -> Iterator[list[str]]:
    _Opens.paths = []
    yield _Opens.paths
    _Opens.paths = None


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(b"outside the bundle")
    return secret


@pytest.mark.parametrize("name", ["../secret.onnx", "/etc/passwd", "sub/model.onnx", ".hidden", ""])
def test_a_manifest_naming_a_path_that_leaves_the_bundle_is_refused(
    copy: Path, tmp_path: Path, opened: list[str], name: str
) -> None:
    secret = _outside(tmp_path)

    def point(m: dict) -> None:
        m["files"][name] = m["files"].pop("model.onnx")
        m["graphs"]["model"]["file"] = name

    _edit(copy, point)
    opened.clear()  # from here on, what load opens
    with pytest.raises(BundleError, match=r"files|file"):
        load(copy)
    assert not [p for p in opened if Path(p).resolve() in (secret.resolve(), Path("/etc/passwd"))]
    with pytest.raises(jsonschema.ValidationError):  # a client that checks the published schema
        assert_follows_schema(copy)


def test_a_symlinked_file_is_not_followed(copy: Path, tmp_path: Path, opened: list[str]) -> None:
    secret = _outside(tmp_path)
    (copy / "model.onnx").unlink()
    (copy / "model.onnx").symlink_to(secret)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    _edit(copy, lambda m: m["files"].update({"model.onnx": digest}))
    opened.clear()  # from here on, what load opens
    with pytest.raises(BundleError, match=r"model\.onnx.*(plain files|regular file)"):
        load(copy)
    assert str(secret) not in opened and str(secret.resolve()) not in opened


def test_a_file_left_out_of_the_list_is_refused_not_skipped(copy: Path) -> None:
    _edit(copy, lambda m: m["files"].pop("decoder_step.onnx"))
    with pytest.raises(BundleError, match=r"graphs\.step\.file 'decoder_step\.onnx' is not listed in files"):
        load(copy)


@pytest.mark.parametrize("special", ["dev_zero", "fifo", "huge"])
def test_the_manifest_must_be_a_bounded_regular_file(copy: Path, special: str) -> None:
    manifest = copy / "manifest.json"
    manifest.unlink()
    if special == "dev_zero":
        manifest.symlink_to("/dev/zero")
    elif special == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.write_text(json.dumps({"padding": "x" * (1 << 21)}))
    with pytest.raises(BundleError, match=r"manifest\.json"):
        load(copy)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(format_version=0), "format_version must be a positive integer, found 0"),
        (lambda m: m.update(format_version=-1), "format_version must be a positive integer, found -1"),
        (lambda m: m.update(format_version=True), "format_version must be a positive integer, found True"),
        (lambda m: m.update(format_version="2"), "format_version must be a positive integer, found '2'"),
        (lambda m: m.pop("graphs"), r"graphs: Field required"),
        (lambda m: m["model"].update(max_seq_len="8"), r"model\.max_seq_len"),
        (lambda m: m["model"].update(vocab_size=-3), r"model\.vocab_size"),
        (lambda m: m["generation"].update(stop_token_ids="none"), r"generation\.stop_token_ids"),
        (lambda m: m.update(surprise=1), r"surprise: Extra inputs are not permitted"),
    ],
)
def test_a_malformed_manifest_names_the_key(copy: Path, change: Any, message: str) -> None:
    _edit(copy, change)
    with pytest.raises(BundleError, match=message):
        load(copy)


def test_a_garbage_graph_with_a_matching_hash_is_a_bundle_error(copy: Path) -> None:
    (copy / "model.onnx").write_bytes(b"not an onnx graph at all")
    digest = hashlib.sha256(b"not an onnx graph at all").hexdigest()
    _edit(copy, lambda m: m["files"].update({"model.onnx": digest}))
    with pytest.raises(BundleError, match=r"model\.onnx is not a graph onnxruntime can run"):
        load(copy)


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(deadline=4000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutated_manifest_serves_or_raises_bundle_error(
    bundle: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("mutated") / "b"
    shutil.copytree(bundle, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    mutate_json(manifest, data, junk)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    try:
        model = load(folder)
        assert isinstance(model, LanguageModel)
        # A bundle that loads serves (text, or ids without a tokenizer), or says why.
        if model.tokenizer is None:
            model.generate(np.array([[1, 2, 3]]), 3, temperature=0)
        else:
            model.generate_text("ROMEO:", 3, temperature=0)
    except BundleError:
        return


# ------------------------------------------- a bundle that lies about itself, by kind


DAMAGE: dict[str, tuple[str, Any, dict[str, Any], str]] = {
    # name: (bundle, manifest change, files, message)
    "a lone surrogate in a label": (
        "classifier",
        lambda m: m.update(labels=["neg\ud800", "pos"]),
        {},
        r"not valid JSON",
    ),
    "fewer labels than logits": (
        "classifier",
        lambda m: m.update(labels=["only"]),
        {},
        r"not \(batch, 1\) for the manifest's 1 labels",
    ),
    "a pad id past the vocabulary": (
        "char",
        lambda m: m["padding"].update(pad_id=10**6),
        {},
        r"padding\.pad_id is 1000000, outside the vocabulary",
    ),
    "a stop id past the vocabulary": (
        "char",
        lambda m: m["generation"].update(stop_token_ids=[999]),
        {},
        r"generation\.stop_token_ids is 999",
    ),
    "a suppressed id past the vocabulary": (
        "char",
        lambda m: m["generation"].update(suppressed_ids=[3, 999]),
        {},
        r"generation\.suppressed_ids is 999",
    ),
    "a banned sequence past the vocabulary": (
        "char",
        lambda m: m["generation"].update(banned_sequences=[[3, 4], [5, 999]]),
        {},
        r"generation\.banned_sequences is 999",
    ),
    "a banned sequence of one token": (
        "char",
        lambda m: m["generation"].update(banned_sequences=[[3]]),
        {},
        r"generation\.banned_sequences\.0",
    ),
    "too many banned sequences": (
        "char",
        lambda m: m["generation"].update(banned_sequences=[[3, 4]] * 1025),
        {},
        r"generation\.banned_sequences",
    ),
    "a stop token suppressed": (
        "char",
        lambda m: m["generation"].update(stop_token_ids=[3, 5], suppressed_ids=[5]),
        {},
        r"generation\.suppressed_ids holds the stop tokens \[5\]",
    ),
    "a min_p above 1": (
        "char",
        lambda m: m["generation"].update(min_p=1.5),
        {},
        r"generation\.min_p",
    ),
    "a negative min_length": (
        "char",
        lambda m: m["generation"].update(min_length=-1),
        {},
        r"generation\.min_length",
    ),
    "a negative min_new_tokens": (
        "char",
        lambda m: m["generation"].update(min_new_tokens=-1),
        {},
        r"generation\.min_new_tokens",
    ),
    "a cache naming no input": (
        "char",
        lambda m: m["graphs"]["step"]["cache"]["past"].__setitem__(0, "nope"),
        {},
        r"'nope' is not an input",
    ),
    "a step graph without its cache section": (
        "char",
        lambda m: m["graphs"]["step"].pop("cache"),
        {},
        r"gives the step graph no cache section",
    ),
    "logits as a present tensor": (
        "char",
        lambda m: m["graphs"]["step"]["cache"].update(present=["logits"]),
        {},
        r"past and present must pair up",
    ),
    "a negative size": (
        "char",
        lambda m: m["graphs"]["step"]["inputs"][2]["shape"].__setitem__(1, -1),
        {},
        r"shape",
    ),
    "an input of another type": (
        "classifier",
        lambda m: m["graphs"]["model"]["inputs"][1].update(dtype="float32"),
        {},
        r"attention_mask is tensor\(int64\) .* but the manifest says float32",
    ),
    "a fixed size the graph does not have": (
        "char",
        lambda m: m["graphs"]["step"]["inputs"][2]["shape"].__setitem__(1, 7),
        {},
        r"past_key_0 is tensor\(float\) of shape .* manifest says float32 of shape \['batch', 7",
    ),
    "no vocabulary size": (
        "char",
        lambda m: m["model"].pop("vocab_size"),
        {},
        r"model\.vocab_size is missing",
    ),
    "a vocabulary smaller than the tokenizer's": (
        "char",
        lambda m: m["model"].update(vocab_size=10),
        {},
        r"holds token ids up to 64, past the model's vocabulary \(10\)",
    ),
    "a special token at another id": (
        "classifier",
        lambda m: m["tokenizer"]["special_tokens"]["cls"].update(id=7),
        {},
        r"does not hold the cls token '\[CLS\]' at id 7",
    ),
    "one mean for three channels": (
        "image",
        lambda m: m["image"].update(mean=[0.5, 0.5]),
        {},
        r"one value per channel",
    ),
    "an image size the graph does not take": (
        "image",
        lambda m: m["image"].update(size=4),
        {},
        r"makes 1 x 4 x 4 pixel values, but the graph takes \(1, 8, 8\)",
    ),
    "a std too small for float32 pixels": (
        "image",
        lambda m: m["image"].update(std=[1e-320]),
        {},
        r"image\.std",
    ),
    "a mean past float32 pixels": ("image", lambda m: m["image"].update(mean=[3e38]), {}, r"image\.mean"),
    "pixels divided by another number": (
        "image",
        lambda m: m["image"].update(divide_by=1.0),
        {},
        r"image\.divide_by",
    ),
    "a colour mode of other channels": (
        "image",
        lambda m: m["image"].update(channel_order="RGB"),
        {},
        r"channel_order RGB does not give 1",
    ),
    "labels twice": ("image", lambda m: m.update(labels=["a"] * 10), {}, r"labels must be distinct names"),
    "a source suffix filling the context": (
        "translator",
        lambda m: m["translation"].update(source_suffix_ids=[3] * 48),
        {},
        r"source_prefix_ids and source_suffix_ids leave no room for a source",
    ),
    "a source prefix and suffix filling the context": (
        "translator",
        lambda m: m["translation"].update(source_prefix_ids=[2] * 24, source_suffix_ids=[3] * 24),
        {},
        r"source_prefix_ids and source_suffix_ids leave no room for a source",
    ),
    "a source prefix id past the vocabulary": (
        "translator",
        lambda m: m["translation"].update(source_prefix_ids=[10**6]),
        {},
        r"translation.source_prefix_ids is 1000000, outside the vocabulary",
    ),
    "a translator's banned sequence past the vocabulary": (
        "translator",
        lambda m: m["translation"].update(banned_sequences=[[4, 10**6]]),
        {},
        r"translation\.banned_sequences is 1000000, outside the vocabulary",
    ),
    "a length penalty that overflows": (
        "translator",
        lambda m: m["translation"].update(length_penalty=1e6),
        {},
        r"translation\.length_penalty",
    ),
    "fairseq's beam search with transformers' early stopping": (
        "translator",
        lambda m: m["translation"].update(early_stopping=True),
        {},
        r"length_penalty \(0\.6\) and early_stopping \(True\) must be at least 0 and false with beam_scoring",
    ),
    "fairseq's beam search with a negative length penalty": (
        "translator",
        lambda m: m["translation"].update(length_penalty=-0.5),
        {},
        r"must be at least 0 and false with beam_scoring fairseq",
    ),
    "an early stopping transformers has not": (
        "translator",
        lambda m: m["translation"].update(beam_scoring="transformers", early_stopping="sometimes"),
        {},
        r"translation\.early_stopping",
    ),
    "a beam search of no one's": (
        "translator",
        lambda m: m["translation"].update(beam_scoring="marian"),
        {},
        r"translation\.beam_scoring",
    ),
    "a default beam past 64": (
        "translator",
        lambda m: m["translation"].update(beam=100_000),
        {},
        r"translation\.beam",
    ),
    "a default completion of a trillion tokens": (
        "char",
        lambda m: m["generation"].update(max_new_tokens=10**12),
        {},
        r"generation\.max_new_tokens",
    ),
    "a graph without the inputs the runtime feeds": (
        "image",
        lambda m: m["graphs"]["model"]["inputs"][0].update(name="pixels"),
        {},
        r"has inputs \['pixel_values'\], but the manifest says \['pixels'\]",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_bundle_that_contradicts_itself_is_refused_at_load(
    damage: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kind, change, files, message = DAMAGE[damage]
    source = request.getfixturevalue(f"{kind}_bundle")
    folder = damaged(source, tmp_path, change, **files)
    with pytest.raises(BundleError, match=message):
        load(folder)


def _renamed(graphs: dict, old: str, new: str) -> None:
    graphs[new] = graphs.pop(old)


SCHEMA_AND_LOADER = {
    "a graph of a name no runtime looks for": (
        "char",
        lambda m: _renamed(m["graphs"], "step", "decode"),
        r"graphs\.decode",
    ),
    "a graph whose name and role disagree": (
        "char",
        lambda m: m["graphs"]["step"].update(role="forward"),
        r"graphs\.step\.role is 'forward'; the step graph's is decode_step or decoder_step",
    ),
    "a role no format 2 graph has": ("char", lambda m: m["graphs"]["model"].update(role="logits"), r"role"),
    "a language model without its generation": (
        "char",
        lambda m: m.pop("generation"),
        r"a causal_lm bundle's manifest needs its generation",
    ),
    "a classifier of null labels": (
        "classifier",
        lambda m: m.update(labels=None),
        r"a classification bundle's manifest needs its labels",
    ),
    "a classifier of no labels": ("classifier", lambda m: m.update(labels=[]), r"labels"),
    "an image classifier without labels": (
        "image",
        lambda m: m.pop("labels"),
        r"a image_classification bundle's manifest needs its labels",
    ),
    "a translator without its translation": (
        "translator",
        lambda m: m.pop("translation"),
        r"a seq2seq bundle's manifest needs its translation",
    ),
}


@pytest.mark.parametrize("damage", SCHEMA_AND_LOADER)
def test_what_the_loader_refuses_by_field_the_published_schema_refuses(
    damage: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The runtime found graphs by their names, which the schema left open (a graph renamed, its
    role unchanged, validated and did not load), as it did a built-in task's sections."""
    kind, change, message = SCHEMA_AND_LOADER[damage]
    folder = damaged(request.getfixturevalue(f"{kind}_bundle"), tmp_path, change)
    with pytest.raises(BundleError, match=message):
        load(folder)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads((folder / "manifest.json").read_text()), manifest_schema())


def test_an_integer_too_long_for_python_to_read_is_a_bundle_error(copy: Path) -> None:
    """Python refuses to read integers of more than 4,300 digits (a ValueError, not JSON's)."""
    (copy / "manifest.json").write_bytes(b'{"format_version": ' + b"1" * 5000 + b"}")
    with pytest.raises(BundleError, match=r"not valid JSON .*integer"):
        load(copy)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.update(normalizer={"type": "Precompiled", "precompiled_charsmap": "/////w=="}),
        lambda t: t.update(decoder={"type": "Strip", "content": " ", "start": 100, "stop": 100}),
    ],
    ids=["normalizer", "decoder"],
)
def test_a_tokenizer_that_panics_is_a_bundle_error(char_bundle: Path, tmp_path: Path, change: Any) -> None:
    """The tokenizers library panics (a BaseException) on these: at load, or at the first text."""
    folder = damaged(char_bundle, tmp_path, **{"tokenizer.json": edited_tokenizer(char_bundle, change)})
    with pytest.raises(BundleError, match=r"tokenizer\.json is a tokenizer that fails"):
        load(folder).generate_text("ROMEO:", 2, temperature=0)


def test_a_tokenizer_with_an_id_past_the_vocabulary_is_a_bundle_error(
    char_bundle: Path, tmp_path: Path
) -> None:
    """Few tokens, but one of them at id 9,999: counting the tokens would not see it."""
    tokenizer = edited_tokenizer(char_bundle, lambda t: t["model"]["vocab"].update({"zzzz": 9999}))
    folder = damaged(char_bundle, tmp_path, **{"tokenizer.json": tokenizer})
    with pytest.raises(BundleError, match=r"holds token ids up to 9,999, past the model's vocabulary \(65\)"):
        load(folder)


def test_a_folder_in_place_of_a_file_is_a_bundle_error(copy: Path) -> None:
    (copy / "spec.yaml").unlink()
    (copy / "spec.yaml").mkdir()
    with pytest.raises(BundleError, match=r"spec\.yaml is not a regular file"):
        load(copy)


def test_commands_reading_a_damaged_file_name_it(
    classifier_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tfcompile.cli import main

    folder = damaged(classifier_bundle, tmp_path, **{"spec.yaml": b"\xff\xfe task", "model.onnx": b"garbage"})
    assert main(["optimize", str(folder), "--out", str(tmp_path / "fused"), "--fuse"]) == 1
    assert re.search(r"error: .*model\.onnx is not a graph onnxruntime can run", capsys.readouterr().err)
    assert main(["verify", str(folder)]) == 1
    assert re.search(r"error: .*spec\.yaml is not UTF-8 text", capsys.readouterr().err)


def test_floats_that_overflow_the_model_are_the_callers_to_change(image_bundle: Path) -> None:
    """Pixels of 3e38 (finite float32s) made the logits NaN, which infer called the bundle's fault:
    a server answered 500 with the bundle's path, and logged a traceback, whenever asked."""
    model = load(image_bundle)
    (tensor,) = model.manifest.graphs["model"].inputs
    shape = [d if isinstance(d, int) else 1 for d in tensor.shape]
    with pytest.raises(InputError, match=r"pixel_values hold values up to 3e\+38 in magnitude"):
        model.infer({tensor.name: np.full(shape, 3e38, np.float32)})
    assert np.isfinite(model.infer({tensor.name: np.full(shape, 0.5, np.float32)})["logits"]).all()


def test_a_bundle_whose_logits_are_nan_on_any_pixels_is_the_bundles_fault(
    image_bundle: Path, tmp_path: Path
) -> None:
    """...but not when the graph is NaN on zeros too (NaN weights): then every request got a 400
    blaming its pixels, and a server's warm-up gave that as why the model is not ready."""
    graph = onnx.load(str(image_bundle / "model.onnx"))
    weight = max(graph.graph.initializer, key=lambda w: len(w.raw_data))
    nan = np.full(onnx.numpy_helper.to_array(weight).shape, np.nan, np.float32)
    weight.CopyFrom(onnx.numpy_helper.from_array(nan, weight.name))
    model = load(damaged(image_bundle, tmp_path, **{"model.onnx": graph.SerializeToString()}))
    (tensor,) = model.manifest.graphs["model"].inputs
    shape = [d if isinstance(d, int) else 1 for d in tensor.shape]
    with pytest.raises(BundleError, match="gave logits that are not finite"):
        model.infer({tensor.name: np.full(shape, 0.5, np.float32)})
    with pytest.raises(BundleError, match="gave logits that are not finite"):
        model.warm_up()


def test_infer_takes_a_dict_of_named_tensors(classifier_bundle: Path) -> None:
    model = load(classifier_bundle)
    for feed in (None, 5, {0: 1, "input_ids": 1, "attention_mask": 1}):
        with pytest.raises(InputError, match=r"infer takes a dict of the inputs"):
            model.infer(feed)  # type: ignore[arg-type]
