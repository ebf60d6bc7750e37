"""Hostile bundles and hostile calls, by class: whatever a bundle holds, the runtime raises a
BundleError (or, for a caller's argument, an InputError) naming what is wrong; it never lets an
exception of numpy, onnxruntime or the tokenizers library escape, never fills the memory or hangs
because a file says so, and never reads a file outside the bundle."""

from __future__ import annotations

import json
import re
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import damaged, edited_tokenizer, mutate_json, truncating_one_side
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models

from tfcompile.expansion import Unbounded, expansion
from tfcompile.runtime import BundleError, InputError, LanguageModel, SessionOptions, load
from tfcompile.runtime.session import _check_self_contained


def _ints(name: str, values: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _zeros(name: str, shape: tuple[int, ...], value: float = 0.0) -> TensorProto:
    return numpy_helper.from_array(np.full(shape, value, dtype=np.float32), name)


def _graph(nodes: list[Any], inputs: list[Any], outputs: list[Any], constants: list[Any]) -> bytes:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, initializer=constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    return model.SerializeToString()


def _tensor(name: str, kind: int, shape: list[Any]) -> Any:
    return helper.make_tensor_value_info(name, kind, shape)


# The char bundle's graphs' inputs and outputs (a 65-token vocabulary, one layer, 2 heads of 8).
IDS = _tensor("input_ids", TensorProto.INT64, ["batch", "sequence"])
LOGITS = _tensor("logits", TensorProto.FLOAT, ["batch", "sequence", 65])


def _forward(size: int, value: float = 0.0) -> bytes:
    """A forward graph that declares (batch, sequence, 65) logits but gives (1, 1, ``size``)
    logits (or, with ``value``, logits of that value), whatever it is fed: onnxruntime lets a
    graph's outputs differ from the shapes it declares."""
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Concat", ["ids_shape", "vocab"], ["logits_shape"], axis=0),
        helper.make_node("Expand", ["fill", "logits_shape"], ["full"]),
        helper.make_node("Slice", ["full", "start", "end", "last"], ["logits"]),
    ]
    constants = [_ints("vocab", [65]), _zeros("fill", (1, 1, 65), value)]
    constants += [_ints("start", [0, 0, 0]), _ints("end", [1, 1, size]), _ints("last", [0, 1, 2])]
    mask = _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    return _graph(nodes, [IDS, mask], [LOGITS], constants)


def _step(copies: int) -> bytes:
    """A decode-step graph whose present keys and values hold ``copies`` copies of the past
    before the new tokens (1 is what a cache does; 2 doubles it at every step)."""
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Concat", ["ids_shape", "vocab"], ["logits_shape"], axis=0),
        helper.make_node("Expand", ["fill", "logits_shape"], ["logits"]),
        helper.make_node("Gather", ["ids_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["ids_shape", "one"], ["new"], axis=0),
        helper.make_node("Concat", ["batch", "heads", "new", "width"], ["new_shape"], axis=0),
        helper.make_node("Expand", ["head", "new_shape"], ["new_keys"]),
    ]
    for kind in ("key", "value"):
        past = [f"past_{kind}_0"] * copies
        nodes.append(helper.make_node("Concat", [*past, "new_keys"], [f"present_{kind}_0"], axis=2))
    constants = [_ints("vocab", [65]), _zeros("fill", (1, 1, 65)), _ints("zero", [0]), _ints("one", [1])]
    constants += [_ints("heads", [2]), _ints("width", [8]), _zeros("head", (1, 2, 1, 8))]
    mask = _tensor("attention_mask", TensorProto.INT64, ["batch", "total_sequence"])
    past = [
        _tensor(f"past_{k}_0", TensorProto.FLOAT, ["batch", 2, "past_sequence", 8]) for k in ("key", "value")
    ]
    present_shape = ["batch", 2, "past_sequence + sequence", 8]
    present = [_tensor(f"present_{k}_0", TensorProto.FLOAT, present_shape) for k in ("key", "value")]
    return _graph(nodes, [IDS, mask, *past], [LOGITS, *present], constants)


# ------------------------------------------------------------ graphs that read other files


@pytest.mark.parametrize("location", ["weights.bin", "../weights.bin", "/etc/passwd"])
def test_a_graph_whose_weights_live_in_another_file_is_refused(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    """onnxruntime opens external data relative to the working directory when a graph comes as
    bytes: a bundle would read a file outside itself, unchecked by its sha256."""
    model = onnx.load(str(char_bundle / "model.onnx"))
    weights = next(t for t in model.graph.initializer if t.name == "embed.weight")
    values = numpy_helper.to_array(weights)
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": str(values.nbytes)}.items():
        weights.external_data.add(key=key, value=value)
    folder = damaged(char_bundle, tmp_path / "bundles", **{"model.onnx": model.SerializeToString()})
    (tmp_path / "weights.bin").write_bytes(values.tobytes())  # where onnxruntime would look
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        BundleError, match=r"model\.onnx: the tensor 'embed\.weight' keeps its values in another file"
    ):
        load(folder)


def test_a_function_whose_default_weights_live_in_another_file_is_refused(
    char_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model-local function's default attribute is a tensor too: a Constant in the function
    that takes it read its external data from the working directory. (Functions are refused now
    as such; the walk of every tensor for external data would refuse it as well.)"""
    weights = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1, 1, 65])
    weights.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "weights.bin", "offset": "0", "length": str(65 * 4)}.items():
        weights.external_data.add(key=key, value=value)
    constant = helper.make_node("Constant", [], ["fill"])
    constant.attribute.add(name="value", ref_attr_name="w", type=onnx.AttributeProto.TENSOR)
    function = helper.make_function("local", "Fill", [], ["fill"], [constant], [helper.make_opsetid("", 18)])
    function.attribute_proto.append(helper.make_attribute("w", weights))
    nodes = [
        helper.make_node("Fill", [], ["fill"], domain="local"),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Concat", ["ids_shape", "vocab"], ["logits_shape"], axis=0),
        helper.make_node("Expand", ["fill", "logits_shape"], ["logits"]),
    ]
    mask = _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [IDS, mask], [LOGITS], initializer=[_ints("vocab", [65])]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
        functions=[function],
        ir_version=10,
    )
    folder = damaged(char_bundle, tmp_path / "bundles", **{"model.onnx": model.SerializeToString()})
    np.arange(65, dtype=np.float32).tofile(tmp_path / "weights.bin")  # read as the logits before
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BundleError, match=r"model\.onnx: the graph defines functions \['Fill'\]"):
        load(folder)
    with pytest.raises(BundleError, match=r"x\.onnx: the tensor 'w' keeps its values in another file"):
        _check_self_contained(Path("x.onnx"), model)


def test_a_graph_with_an_ep_context_node_is_refused(char_bundle: Path, tmp_path: Path) -> None:
    """An EPContext node names a file of compiled code that some execution providers read."""
    node = helper.make_node(
        "EPContext",
        ["input_ids"],
        ["logits"],
        domain="com.microsoft",
        name="ctx",
        ep_cache_context="../x.bin",
    )
    model = helper.make_model(
        helper.make_graph(
            [node], "g", [IDS, _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])], [LOGITS]
        ),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
    )
    folder = damaged(char_bundle, tmp_path, **{"model.onnx": model.SerializeToString()})
    with pytest.raises(BundleError, match=r"model\.onnx: the node 'ctx' is an EPContext"):
        load(folder)


# ------------------------------------------------------- graphs that cost more than their size


def test_a_graph_of_functions_that_call_each_other_is_refused_at_once(
    char_bundle: Path, tmp_path: Path
) -> None:
    """onnxruntime inlines every call of a model-local function: 40 functions, each calling the
    one before twice, are 2^40 nodes in a file of 4 KB (14 of them took 11 s to load, 40 for ever)."""
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
    functions = [
        helper.make_function("local", "F0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], opsets)
    ]
    for depth in range(1, 41):
        calls = [
            helper.make_node(f"F{depth - 1}", ["x"], ["half"], domain="local"),
            helper.make_node(f"F{depth - 1}", ["half"], ["y"], domain="local"),
        ]
        functions.append(helper.make_function("local", f"F{depth}", ["x"], ["y"], calls, opsets))
    nodes = [
        helper.make_node("F40", ["fill"], ["logits"], domain="local"),
    ]
    mask = _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [IDS, mask], [LOGITS], initializer=[_zeros("fill", (1, 1, 65))]),
        opset_imports=opsets,
        functions=functions,
        ir_version=8,
    )
    folder = damaged(char_bundle, tmp_path, **{"model.onnx": model.SerializeToString()})
    with pytest.raises(BundleError, match=r"model\.onnx: the graph defines functions \['F0', 'F1', 'F2'"):
        load(folder)


def test_a_graph_that_loops_is_refused_at_load(char_bundle: Path, tmp_path: Path) -> None:
    """A Loop runs its body as many times as a tensor says: 10^12 here, a first call (a server's
    warm-up) that never returned; Scan and onnxruntime's BeamSearch run theirs as often."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["go"], ["again"]), helper.make_node("Identity", ["x"], ["x_out"])],
        "body",
        [
            _tensor("i", TensorProto.INT64, []),
            _tensor("go", TensorProto.BOOL, []),
            _tensor("x", TensorProto.FLOAT, [1]),
        ],
        [_tensor("again", TensorProto.BOOL, []), _tensor("x_out", TensorProto.FLOAT, [1])],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "", "zero"], ["fill"], name="spin", body=body),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Concat", ["ids_shape", "vocab"], ["logits_shape"], axis=0),
        helper.make_node("Expand", ["fill", "logits_shape"], ["logits"]),
    ]
    constants = [_ints("trips", 10**12), _zeros("zero", (1,)), _ints("vocab", [65])]
    graph = _graph(
        nodes, [IDS, _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])], [LOGITS], constants
    )
    folder = damaged(char_bundle, tmp_path, **{"model.onnx": graph})
    with pytest.raises(BundleError, match=r"model\.onnx: the node 'spin' is a Loop, which runs its body"):
        load(folder)


def test_sessions_leave_out_the_quadratic_subexpression_pass(tmp_path: Path) -> None:
    """onnxruntime's common-subexpression elimination takes time quadratic in a chain of nodes
    that read one tensor twice: 16,000 Adds (460 KB) took 28 s to load, 64,000 (2 MB) minutes.
    Held by what the pass does, not by a time: two equal Exps stay two in the graph a session
    with the runtime's options optimizes, where onnxruntime's defaults merge them."""
    x = _tensor("x", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("Exp", ["x"], ["a"]),
        helper.make_node("Exp", ["x"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "twice", [x], [_tensor("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8
    ).SerializeToString()

    def optimized(options: Any) -> list[str]:
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return [node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]

    assert optimized(ort.SessionOptions()) == ["Exp", "Add"]  # the pass, where it is on
    assert optimized(SessionOptions().to_ort()) == ["Exp", "Exp", "Add"]


def test_a_graph_of_too_many_nodes_is_refused_before_onnxruntime_reads_it(
    char_bundle: Path, tmp_path: Path
) -> None:
    """onnxruntime takes time superlinear in a graph's nodes to load it: 262,144 (6.6 MB) took
    27 s, and a graph of 2 GB holds 80 million."""
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(70_000)]
    nodes += [
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Concat", ["ids_shape", "vocab"], ["logits_shape"], axis=0),
        helper.make_node("Expand", ["t70000", "logits_shape"], ["logits"]),
    ]
    mask = _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    graph = _graph(nodes, [IDS, mask], [LOGITS], [_zeros("t0", (1,)), _ints("vocab", [65])])
    folder = damaged(char_bundle, tmp_path, **{"model.onnx": graph})
    with pytest.raises(BundleError, match=r"model\.onnx holds 70,003 nodes, more than the 65,536"):
        load(folder)


def test_nodes_in_if_branches_count_toward_the_limit(char_bundle: Path, tmp_path: Path) -> None:
    """Two branches of 40,000 nodes under one If: a graph of 4 nodes at its top level."""

    def branch(name: str) -> Any:
        chain = [helper.make_node("Relu", [f"{name}{i}"], [f"{name}{i + 1}"]) for i in range(40_000)]
        out = _tensor(f"{name}40000", TensorProto.FLOAT, [1])
        return helper.make_graph(chain, name, [], [out], initializer=[_zeros(f"{name}0", (1,))])

    nodes = [
        helper.make_node(
            "Constant", [], ["yes"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])
        ),
        helper.make_node("If", ["yes"], ["picked"], then_branch=branch("a"), else_branch=branch("b")),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Expand", ["picked", "ids_shape"], ["logits"]),
    ]
    mask = _tensor("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    folder = damaged(char_bundle, tmp_path, **{"model.onnx": _graph(nodes, [IDS, mask], [LOGITS], [])})
    with pytest.raises(BundleError, match=r"holds more than 65,536 nodes with its If branches"):
        load(folder)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([1 << 40], r"big0\.bin holds 1,099,511,627,776 bytes, more than the 2,147,483,647 a bundle's file"),
        (
            [(1 << 31) - 1] * 5,
            r"the files its manifest\.json lists hold 10,7[\d,]+ bytes, more than the 8,589,934,592",
        ),
    ],
    ids=["a terabyte", "five files of 2 GiB"],
)
def test_files_too_large_to_hash_are_refused_before_they_are_read(
    char_bundle: Path, tmp_path: Path, sizes: list[int], message: str
) -> None:
    """Sparse files take no disk but as long to hash as their size: an hour for a terabyte."""
    names = [f"big{i}.bin" for i in range(len(sizes))]
    folder = damaged(char_bundle, tmp_path, lambda m: m["files"].update(dict.fromkeys(names, "0" * 64)))
    for name, size in zip(names, sizes, strict=True):
        with open(folder / name, "wb") as f:
            f.truncate(size)
    with pytest.raises(BundleError, match=message):
        load(folder)


# ---------------------------------------------- graphs whose outputs are not what they declare


@pytest.mark.parametrize(
    ("graph", "call", "message"),
    [
        (
            _forward(3),
            lambda m: m.logits([[1, 2]]),
            r"logits of shape \(1, 1, 3\), not \['batch', 'sequence', 65\]",
        ),
        (_forward(0), lambda m: m.generate([[1]], 2, use_cache=False), r"logits of shape \(1, 1, 0\)"),
        (_forward(65, np.nan), lambda m: m.generate([[1]], 2, use_cache=False), "logits that are not finite"),
        (_forward(65, np.inf), lambda m: m.logits([[1]]), "logits that are not finite"),
    ],
    ids=["narrow logits", "no logits", "NaN logits sampled", "infinite logits"],
)
def test_graph_outputs_are_held_to_the_manifest(
    char_bundle: Path, tmp_path: Path, graph: bytes, call: Any, message: str
) -> None:
    folder = damaged(char_bundle, tmp_path, **{"model.onnx": graph})
    with pytest.raises(BundleError, match=r"model\.onnx gave " + message):
        call(load(folder))


def test_a_cache_that_grows_by_more_than_the_new_tokens_is_a_bundle_error(
    char_bundle: Path, tmp_path: Path
) -> None:
    """A step graph that doubles its cache each step would fill the memory in 30 steps."""
    honest = load(damaged(char_bundle, tmp_path / "honest", **{"decoder_step.onnx": _step(1)}))
    assert honest.generate([[1, 2]], 8, temperature=0).shape == (1, 10)
    doubling = load(damaged(char_bundle, tmp_path / "doubling", **{"decoder_step.onnx": _step(2)}))
    with pytest.raises(BundleError, match=r"gave present_key_0 of shape \(1, 2, 5, 8\), not \[1, 2, 3, 8\]"):
        doubling.generate([[1, 2]], 8, temperature=0)


# ------------------------------------------------------- manifests read one way by everyone


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (lambda t: t.replace("{", '{"task": "seq2seq", ', 1), r"the keys \['task'\] appear twice"),
        (
            lambda t: t.replace('"files": {', '"files": {' + '"a": 1, ' * 40_000, 1),
            r"the keys \['a'\] appear",
        ),
        (lambda t: t.replace('"checkpoint": "last"', '"checkpoint": NaN'), "NaN is not a JSON number"),
        (
            lambda t: t.replace('"checkpoint": "last"', '"checkpoint": -Infinity'),
            "-Infinity is not a JSON number",
        ),
        (lambda t: t.replace('"checkpoint": "last"', '"checkpoint": 1e999'), "1e999 is too large"),
        (lambda t: "\ufeff" + t, "BOM"),
    ],
    ids=[
        "a key twice",
        "a key 40,000 times",
        "NaN",
        "infinity",
        "a number past float64",
        "a byte-order mark",
    ],
)
def test_a_manifest_other_parsers_would_read_differently_is_refused(
    char_bundle: Path, tmp_path: Path, text: Any, message: str
) -> None:
    folder = damaged(char_bundle, tmp_path)
    (folder / "manifest.json").write_text(text((folder / "manifest.json").read_text()))
    with pytest.raises(BundleError, match=r"manifest\.json is not valid JSON \(.*" + message):
        load(folder)
    (folder / "manifest.json").write_bytes((char_bundle / "manifest.json").read_text().encode("utf-16"))
    with pytest.raises(BundleError, match=r"manifest\.json is not valid JSON \('utf-8' codec"):
        load(folder)


def _past_batch(size: int) -> Any:
    def change(m: dict) -> None:
        for tensor in m["graphs"]["step"]["inputs"][2:]:
            tensor["shape"][0] = size

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_past_batch(2**62), r"graphs\.step\.inputs: past_key_0's fixed sizes \[4611686018427387904, 2"),
        (
            lambda m: m["graphs"]["model"]["inputs"][0]["shape"].__setitem__(1, 10**9),
            "input_ids's fixed sizes",
        ),
    ],
    ids=["a cache of 2^62 rows", "a billion tokens"],
)
def test_a_manifest_cannot_size_an_input_past_memory(
    char_bundle: Path, tmp_path: Path, change: Any, message: str
) -> None:
    """A graph may leave an axis open that the manifest fixes; the runtime builds empty caches
    and warm-up inputs of the manifest's sizes, so those are bounded at load."""
    with pytest.raises(BundleError, match=message + r".* more than the 67,108,864 a bundle's input may hold"):
        load(damaged(char_bundle, tmp_path, change)).generate([[1]], 1)


# ------------------------------------------------------------------- tokenizers that lie


@pytest.mark.parametrize("strategy", [{"Fixed": 40}, "BatchLongest"])
def test_a_tokenizer_json_padding_setting_is_not_applied(
    classifier_bundle: Path, tmp_path: Path, strategy: Any
) -> None:
    """The runtime pads as the manifest says; tokenizer.json's own padding is switched off: it
    pads every text to a length of its choosing (past the context here; {"Fixed": 10**8} took
    18 GB and minutes a text) and its padding would count as real tokens."""
    padding = {"strategy": strategy, "direction": "Left", "pad_to_multiple_of": None}
    padding |= {"pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    tokenizer = edited_tokenizer(classifier_bundle, lambda t: t.update(padding=padding))
    padded = load(damaged(classifier_bundle, tmp_path, **{"tokenizer.json": tokenizer}))
    texts = ["a fine film", ("dull", "and far too long")]
    assert padded.classify(texts) == load(classifier_bundle).classify(texts)


@pytest.mark.parametrize(
    ("truncation", "said"),
    [
        (None, "as None, but the manifest"),  # tokenizer.json cuts nothing, the manifest says it does
        (
            {"max_length": 9, "strategy": "OnlyFirst", "direction": "Left", "stride": 0},
            "'max_length': 9, 'strategy': 'only_first'",
        ),
    ],
)
def test_a_tokenizer_json_that_truncates_otherwise_than_the_manifest_says_is_refused(
    classifier_bundle: Path, tmp_path: Path, truncation: Any, said: str
) -> None:
    """A client cuts as the manifest says, the runtime as tokenizer.json does: the two must agree."""
    tokenizer = edited_tokenizer(classifier_bundle, lambda t: t.update(truncation=truncation))
    with pytest.raises(BundleError, match=said):
        load(damaged(classifier_bundle, tmp_path, **{"tokenizer.json": tokenizer}))


def test_a_truncation_stride_the_library_panics_on_is_refused_before_any_text_is_cut(
    classifier_bundle: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """tokenizers panics (a Rust backtrace on stderr) on every text it cuts with a stride not below
    max_length less the special tokens its post-processor adds to a text: refused at load, silently."""
    manifest = json.loads((classifier_bundle / "manifest.json").read_text())
    cut = manifest["tokenizer"]["truncation"]
    edit = {"max_length": cut["max_length"], "strategy": "LongestFirst", "direction": "Right"}
    stride = cut["max_length"] - 2  # [CLS] a [SEP]: 2 special tokens on a text
    tokenizer = edited_tokenizer(classifier_bundle, lambda t: t.update(truncation=edit | {"stride": stride}))
    with pytest.raises(BundleError, match=rf"stride {stride} is not below .* the 2 special tokens it adds"):
        load(damaged(classifier_bundle, tmp_path / "panics", **{"tokenizer.json": tokenizer}))
    assert "panicked" not in capfd.readouterr().err
    tokenizer = edited_tokenizer(
        classifier_bundle, lambda t: t.update(truncation=edit | {"stride": stride - 1})
    )
    load(damaged(classifier_bundle, tmp_path / "cuts", **{"tokenizer.json": tokenizer})).classify(
        ["a " * 500]
    )


def test_a_manifest_without_truncation_loads_and_cuts_by_the_clients_rule(
    classifier_bundle: Path, tmp_path: Path
) -> None:
    """A bundle of a version before the manifest's truncation field: its tokenizer.json truncates,
    its manifest says nothing; it loads, and a pair is cut as a client cuts it (longest-first from
    the right at the context). A truncation saved without its direction reads as the library's."""
    old = load(damaged(classifier_bundle, tmp_path / "old", lambda m: m["tokenizer"].update(truncation=None)))
    context = old.manifest.model.max_seq_len
    first, second = " ".join(["a"] * 3 * context), "b b b"
    expected = Tokenizer.from_file(str(classifier_bundle / "tokenizer.json"))
    expected.enable_truncation(context, strategy="longest_first", direction="right")
    (encoding,) = old.encode([(first, second)])
    assert encoding.ids == expected.encode(first, second).ids and len(encoding.ids) == context

    def undirected(tokenizer: dict) -> None:
        del tokenizer["truncation"]["direction"]

    tokenizer = edited_tokenizer(classifier_bundle, undirected)
    loaded = load(damaged(classifier_bundle, tmp_path / "undirected", **{"tokenizer.json": tokenizer}))
    assert loaded.classify(["a fine film"]) == load(classifier_bundle).classify(["a fine film"])


@pytest.mark.parametrize("strategy", ["only_first", "only_second"])
def test_a_truncation_of_one_side_cuts_longest_first_where_that_side_cannot_make_the_room(
    classifier_bundle: Path, tmp_path: Path, strategy: str
) -> None:
    """The tokenizers library fails a batch where a one-sided truncation cannot make the room (a
    single text under only_second; a pair whose side to cut is too short), and the runtime blamed
    the text's characters. Such a text or pair is cut longest-first, and the batch's others as
    the manifest says, each as alone: a long text or pair is never refused."""
    folder = truncating_one_side(classifier_bundle, tmp_path, strategy)
    one_sided, longest_first = load(folder), load(classifier_bundle)
    context = one_sided.manifest.tokenizer.truncation.model_dump()  # type: ignore[union-attr]
    tokenizer = (folder / "tokenizer.json").read_bytes()
    long = "a gorgeous witty seductive movie " * 20
    cuttable = (long, "ok") if strategy == "only_first" else ("ok", long)
    items: list[Any] = [long, ("ok", long), (long, "ok"), (long, long), cuttable]
    encoded = one_sided.encode(items)
    assert all(len(e.ids) == context["max_length"] for e in encoded)
    assert [e.ids for e in encoded[:-1]] == [e.ids for e in longest_first.encode(items[:-1])]
    assert encoded[-1].ids == Tokenizer.from_str(tokenizer.decode()).encode(*cuttable).ids
    assert one_sided.classify(items[:-1]) == longest_first.classify(items[:-1])


WORDS = st.sampled_from(["the", "movie", "unaffable", "is", ",", "playing", "zzqqj", "caf\u00e9", " ", "\t"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.lists(WORDS, max_size=120).map(" ".join),
    second=st.lists(WORDS, max_size=120).map(" ".join),
)
def test_a_sentence_pair_encodes_as_the_tokenizer_truncates_it(
    classifier_bundle: Path, first: str, second: str
) -> None:
    """The runtime cuts a long side before the tokenizers library truncates the pair (which builds
    every combination of the sides' overflowing pieces); what the pair keeps is the same."""
    model = load(classifier_bundle)
    assert model.tokenizer is not None and model.tokenizer.truncation is not None
    expected = model.tokenizer.encode(first, second)
    (encoded,) = model.encode([(first, second)])
    assert (encoded.ids, encoded.type_ids) == (expected.ids, expected.type_ids)


def test_a_long_sentence_pair_costs_what_its_length_does(classifier_bundle: Path) -> None:
    """A 200 KB pair: the tokenizers library alone took gigabytes (quadratic in the length)."""
    model = load(classifier_bundle)
    side = "the movie is good and " * 10_000
    (prediction,) = model.classify([(side, side)])
    assert prediction == model.classify([(side[:300], side[:300])])[0]


@pytest.mark.parametrize(
    ("change", "call", "error", "message"),
    [
        (
            lambda t: t["model"].update(vocab={}),
            lambda m: m.generate([[1]], 2),
            BundleError,
            r"tokenizer\.json holds no tokens",
        ),
        (
            lambda t: t.update(
                pre_tokenizer={
                    "type": "Split",
                    "pattern": {"Regex": "(a|a)+$"},
                    "behavior": "Isolated",
                    "invert": False,
                }
            ),
            lambda m: m.generate_text("a" * 40 + "!", 1),
            BundleError,
            r"tokenizer\.json is a tokenizer that fails: .*retry-limit",
        ),
        (
            lambda t: t.update(
                post_processor={
                    "type": "TemplateProcessing",
                    "single": [
                        {"SpecialToken": {"id": "<x>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}},
                    ],
                    "pair": [
                        {"Sequence": {"id": "A", "type_id": 0}},
                        {"Sequence": {"id": "B", "type_id": 1}},
                    ],
                    "special_tokens": {"<x>": {"id": "<x>", "ids": [99999], "tokens": ["<x>"]}},
                }
            ),
            lambda m: m.generate_text("ROMEO", 1),
            BundleError,
            r"tokenizer\.json holds token ids up to 99,999, past the model's vocabulary \(65\)",  # at load
        ),
    ],
    ids=["no tokens", "a regex that gives up", "a template id past the vocabulary"],
)
def test_a_tokenizer_that_fails_is_a_bundle_error_not_the_callers(
    char_bundle: Path, tmp_path: Path, change: Any, call: Any, error: type[Exception], message: str
) -> None:
    folder = damaged(char_bundle, tmp_path, **{"tokenizer.json": edited_tokenizer(char_bundle, change)})
    with pytest.raises(error, match=message):
        call(load(folder))


def test_a_word_outside_the_vocabulary_is_the_callers(char_bundle: Path, tmp_path: Path) -> None:
    """Every character is a token, but the pre-tokenizer makes a word the vocabulary lacks."""
    split = {"type": "Split", "pattern": {"Regex": "a+"}, "behavior": "Isolated", "invert": False}
    tokenizer = edited_tokenizer(char_bundle, lambda t: t.update(pre_tokenizer=split))
    model = load(damaged(char_bundle, tmp_path, **{"tokenizer.json": tokenizer}))
    with pytest.raises(InputError, match=r"the text holds a word outside the bundle's vocabulary"):
        model.generate_text("aaa", 1)


# ------------------------------------------------------------ tokenizers that multiply text

DOUBLE = {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}


@pytest.mark.parametrize(
    ("part", "step", "what"),
    [
        ("normalizer", {"type": "Sequence", "normalizers": [DOUBLE] * 24}, "encoding"),
        ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKC"}] * 3}, "encoding"),
        ("pre_tokenizer", {"type": "Sequence", "pretokenizers": [{"type": "Metaspace"}] * 11}, "encoding"),
        ("decoder", {"type": "Sequence", "decoders": [DOUBLE] * 24}, "decoding"),
        ("decoder", {"type": "Replace", "pattern": {"Regex": "x*"}, "content": "a" * 600}, "decoding"),
    ],
    ids=["replaces", "nfkc thrice", "metaspaces", "decoder replaces", "decoder empty matches"],
)
def test_a_tokenizer_that_multiplies_text_is_refused_at_load(
    char_bundle: Path, tmp_path: Path, part: str, step: dict, what: str
) -> None:
    """Twenty-four Replaces of "a" by "aa" made 16 million characters of each "a" (a short prompt:
    gigabytes): a tokenizer that may make more than 1,024 characters of one does not load."""
    if part == "pre_tokenizer":
        step["pretokenizers"] = [
            {**s, "replacement": "\u2581", "prepend_scheme": "always"} for s in step["pretokenizers"]
        ]
    tokenizer = edited_tokenizer(char_bundle, lambda t: t.update({part: step}))
    folder = damaged(char_bundle, tmp_path, **{"tokenizer.json": tokenizer})
    with pytest.raises(
        BundleError, match=rf"tokenizer\.json: the tokenizer's {what} may make up to [\d,]+ characters of one"
    ):
        load(folder)


STEPS = {
    "normalizer": [
        st.sampled_from([{"type": t} for t in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Nmt")]),
        st.just(
            {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "lowercase": True}
        ),
        st.builds(lambda p: {"type": "Prepend", "prepend": p}, st.text("ab▁", min_size=1, max_size=3)),
        st.just({"type": "ByteLevel"}),
        st.just({"type": "Strip", "strip_left": True, "strip_right": True}),
    ],
    "pre_tokenizer": [
        st.builds(
            lambda prefix: {
                "type": "ByteLevel",
                "add_prefix_space": prefix,
                "trim_offsets": True,
                "use_regex": True,
            },
            st.booleans(),
        ),
        st.just({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}),
        st.just({"type": "BertPreTokenizer"}),
        st.builds(
            lambda pattern, behavior, invert: {
                "type": "Split",
                "pattern": {"Regex": pattern},
                "behavior": behavior,
                "invert": invert,
            },
            st.sampled_from(["a+", " ", "x*", "."]),
            st.sampled_from(["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]),
            st.booleans(),
        ),
        st.sampled_from(
            [
                {"type": "Punctuation", "behavior": "Isolated"},
                {"type": "Digits", "individual_digits": True},
                {"type": "CharDelimiterSplit", "delimiter": "a"},
                {"type": "WhitespaceSplit"},
                {"type": "Whitespace"},
                {"type": "UnicodeScripts"},
                {"type": "FixedLength", "length": 2},
            ]
        ),
    ],
    "decoder": [
        st.sampled_from(
            [
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "WordPiece", "prefix": "##", "cleanup": True},
            ]
        ),
        st.just({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}),
        st.builds(
            lambda suffix: {"type": "BPEDecoder", "suffix": suffix}, st.sampled_from(["", "a", "</w>"])
        ),
        st.builds(
            lambda pad, delimiter: {
                "type": "CTC",
                "pad_token": pad,
                "word_delimiter_token": delimiter,
                "cleanup": True,
            },
            st.sampled_from(["", "a", "<pad>"]),
            st.sampled_from(["", "|", "a"]),
        ),
        st.builds(
            lambda prefix: {"type": "WordPiece", "prefix": prefix, "cleanup": False},
            st.sampled_from(["", "a"]),
        ),
    ],
}
REPLACE = st.builds(
    lambda pattern, content: {"type": "Replace", "pattern": pattern, "content": content},
    st.one_of(
        st.builds(lambda s: {"String": s}, st.text("aé ", min_size=1, max_size=3)),
        st.builds(lambda r: {"Regex": r}, st.sampled_from(["a*", "é", " +", "x?", "[aé]"])),
    ),
    st.text("ab ", max_size=4),
)
SEQUENCE_KEYS = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders"}
TEXT = st.text(st.sampled_from(list("aAé\u0301 İß中\ufdfa\u2581\U0001f600x")), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), part=st.sampled_from(list(STEPS)))
def test_the_expansion_bound_holds_for_any_chain_of_steps(data: st.DataObject, part: str) -> None:
    """The bound read from a chain's settings is never below what the tokenizers library makes
    of texts: the characters a normalizer or pre-tokenizer writes, or a decoder makes of tokens."""
    replace = [REPLACE] if part != "pre_tokenizer" else []
    chain = data.draw(st.lists(st.one_of(*STEPS[part], *replace), min_size=1, max_size=3))
    step = {"type": "Sequence", SEQUENCE_KEYS[part]: chain}
    document = json.loads(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")).to_str())
    tokenizer = Tokenizer.from_str(json.dumps({**document, part: step}))
    texts = data.draw(st.lists(TEXT, min_size=1, max_size=4))
    try:
        if part == "normalizer":
            made = sum(len(tokenizer.normalizer.normalize_str(x)) for x in texts)
        elif part == "pre_tokenizer":
            made = sum(len(p) for x in texts for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str(x))
        else:
            made = len(tokenizer.decoder.decode(texts))
    except BaseException as e:  # the library panics on some chains (the runtime: a BundleError)
        if type(e).__name__ != "PanicException":
            raise
        reject()
    assert made <= expansion(step, decoder=part == "decoder") * sum(map(len, texts))


def test_a_step_the_runtime_does_not_know_is_not_bounded() -> None:
    with pytest.raises(Unbounded, match="'Stretch'"):
        expansion({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Stretch"}]})


# -------------------------------------------------------------- sections checked at load


def test_a_format_1_preprocessing_record_is_checked_as_the_image_section_is(
    image_bundle: Path, tmp_path: Path
) -> None:
    record = {"image_size": 8, "channels": 1, "mean": [0.5, 0.5], "std": [0.2, 0.2]}
    folder = damaged(
        image_bundle,
        tmp_path,
        lambda m: m.pop("image"),
        **{"preprocessing.json": json.dumps(record).encode()},
    )
    with pytest.raises(
        BundleError,
        match=r"preprocessing\.json is not a valid preprocessing record: mean and std need one value per",
    ):
        load(folder)


@pytest.mark.parametrize(
    ("bundle", "change", "said"),
    [
        (
            "char_bundle",
            lambda m: m["padding"].update(side="right"),
            r"padding\.side is 'right', where a causal_lm",
        ),
        (
            "classifier_bundle",
            lambda m: m["padding"].update(side="left"),
            r"a classification bundle's rows are",
        ),
        (
            "translator_bundle",
            lambda m: m["padding"].update(side="left"),
            r"a seq2seq bundle's rows are padded",
        ),
        ("char_bundle", lambda m: m["generation"].update(context_length=8), r"context_length \(8\) is not"),
        (
            "char_bundle",
            lambda m: m["generation"].update(context_length=10**6),
            r"context_length \(1000000\)",
        ),
    ],
    ids=["decoder padded right", "classifier padded left", "translator padded left", "short", "long"],
)
def test_a_manifest_that_says_to_pad_or_slide_otherwise_than_the_runtime_is_refused(
    bundle: str, change: Any, said: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A client that follows the manifest (examples/python/client.py) pads on padding.side and
    slides at generation.context_length; the runtime pads a task's rows on its one side and
    generates over model.max_seq_len. Where they differ, the two gave other tokens for one bundle
    (and a context past max_seq_len feeds the graph past its positions): refused at load."""
    with pytest.raises(BundleError, match=said):
        load(damaged(request.getfixturevalue(bundle), tmp_path, change))


def test_each_runtime_pads_on_the_side_its_task_exports() -> None:
    """The runtime cannot import the tasks (it is torch-free), so each class states its side: the
    one its task's export writes in the manifest (an image classifier pads nothing)."""
    from tfcompile.runtime import RUNTIMES
    from tfcompile.tasks.task import TASKS

    served = [name for name in TASKS if name in RUNTIMES]
    assert {"causal_lm", "classification", "seq2seq"} <= set(served)
    for name in served:
        assert RUNTIMES[name].PADDING_SIDE in (None, TASKS[name].padding_side), name


def test_a_translator_without_an_unknown_token_is_refused_at_load(
    translator_bundle: Path, tmp_path: Path
) -> None:
    folder = damaged(translator_bundle, tmp_path, lambda m: m["tokenizer"]["special_tokens"].pop("unk"))
    with pytest.raises(BundleError, match=r"names no unk token, which translate reads an empty source as"):
        load(folder)


def test_a_translator_whose_stop_id_no_decoding_chooses_is_refused_at_load(
    translator_bundle: Path, tmp_path: Path
) -> None:
    """Ids past the tokenizer's (a checkpoint's padded embedding rows) are never chosen: a stop id
    there ended no translation, and beam search failed with an IndexError."""
    size = Tokenizer.from_file(str(translator_bundle / "tokenizer.json")).get_vocab_size()

    def trim(t: dict) -> None:
        t["model"]["vocab"] = {k: i for k, i in t["model"]["vocab"].items() if i < size - 10}
        t["model"]["merges"] = []
        t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < size - 10]

    tokenizer = edited_tokenizer(translator_bundle, trim)
    folder = damaged(
        translator_bundle,
        tmp_path,
        lambda m: m["translation"].update(stop_id=size - 5),
        **{"tokenizer.json": tokenizer},
    )
    with pytest.raises(
        BundleError, match=rf"translation\.stop_id {size - 5} is outside the tokenizer's {size - 10} tokens"
    ):
        load(folder)


# ------------------------------------------------------------------------- hostile calls


def test_what_load_is_given_is_checked(char_bundle: Path, tmp_path: Path) -> None:
    for bundle in (None, 5, b"/tmp"):
        with pytest.raises(InputError, match=r"a bundle is given as its folder's path, got"):
            load(bundle)  # type: ignore[arg-type]
    with pytest.raises(BundleError, match=r"cannot read the bundle folder .*: File name too long"):
        load(tmp_path / ("a" * 5000))
    for providers in (5, "CPUExecutionProvider"):
        with pytest.raises(InputError, match=r"providers must be a list of execution provider names"):
            load(char_bundle, providers=providers)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"options must be a SessionOptions, got dict"):
        load(char_bundle, options={"threads": 1})  # type: ignore[arg-type]
    for threads, message in (
        (-1, "threads must be >= 0"),
        (2**40, "threads must be at most 1,024"),
        ("2", "threads"),
    ):
        with pytest.raises(InputError, match=message):
            SessionOptions(threads=threads)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="spin must be True or False"):
        SessionOptions(spin="no")  # type: ignore[arg-type]


def test_switches_take_true_or_false(char_bundle: Path) -> None:
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    for value in (np.zeros(0), np.ones((1, 2)), "yes", None):
        with pytest.raises(InputError, match=r"use_cache must be True or False"):
            model.generate([[1, 2]], 2, use_cache=value)
        with pytest.raises(InputError, match=r"stop must be True or False"):
            model.generate_text("RO", 2, stop=value)
    assert model.generate([[1, 2]], 2, use_cache=np.bool_(False), temperature=0).shape == (1, 4)


def test_infer_refuses_a_mask_row_without_a_real_token(
    classifier_bundle: Path, translator_bundle: Path
) -> None:
    """translate_ids refused a source of padding alone, while KServe's infer ran it and answered
    the logits of a row that reads nothing; token_type_ids of zeros stay a first sentence."""
    for folder, mask in ((classifier_bundle, "attention_mask"), (translator_bundle, "source_mask")):
        model = load(folder)
        feed = {t.name: np.ones((2, 5), np.int64) for t in model.graph(model.MAIN_GRAPH).inputs}
        feed.update({name: np.zeros((2, 5), np.int64) for name in feed if name == "token_type_ids"})
        assert model.infer(feed)
        feed[mask][1] = 0
        with pytest.raises(InputError, match=rf"every row of {mask} needs at least one real token"):
            model.infer(feed)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ([[[1, 2], [3]]], r"images\[0\] must be a rectangular array"),
        ([np.zeros((8, 8), np.uint8), [[None]]], r"images\[1\] must hold numbers"),
        (5, r"images takes image paths, bytes or arrays, got 5"),
        ([], r"images needs at least one image"),
    ],
)
def test_images_are_rectangular_arrays_paths_or_bytes(image_bundle: Path, images: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load(image_bundle).classify_images(images)


# -------------------------------------------------------- any manifest, of any kind of bundle


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2, 65, 2**31, 2**62, 10**30]),
    st.floats(),
    st.sampled_from(
        ["", "batch", "sequence", "logits", "input_ids", "model.onnx", "../x", "float16", "step"]
    ),
    st.lists(st.integers(-2, 70), max_size=3),
    st.dictionaries(
        st.sampled_from(["file", "name", "id", "token", "shape"]), st.integers(-1, 3), max_size=2
    ),
)


CALLS: dict[str, Any] = {
    "classifier": lambda m: m.classify(["a fine film", ("a", "b")]),
    "translator": lambda m: m.translate(["ein Hund"], max_len=3),
    "image": lambda m: m.classify_images([np.zeros((8, 8), np.uint8), np.ones((5, 9), np.float32)]),
}


@pytest.mark.parametrize("kind", CALLS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutated_manifest_of_any_bundle_serves_or_raises_a_named_error(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    source = request.getfixturevalue(f"{kind}_bundle")
    manifest = json.loads((source / "manifest.json").read_text())
    mutate_json(manifest, data, junk, spare=("parity", "versions"))
    folder = tmp_path_factory.mktemp(kind) / "b"
    shutil.copytree(source, folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    try:
        model = load(folder)
        model.warm_up()
        CALLS[kind](model)
    except (BundleError, InputError) as e:
        assert str(e)


def test_reading_a_small_file_asks_for_no_more_memory_than_it_holds(tmp_path: Path) -> None:
    """read(n) allocates n bytes first: asking for the 2 GiB limit failed every load under a
    memory limit (ulimit -v), whatever the file's size."""
    from tfcompile.runtime.bundle import MAX_FILE_BYTES, read_regular_file

    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"{}" * 500)
    tracemalloc.start()
    try:
        assert read_regular_file(path, MAX_FILE_BYTES) == b"{}" * 500
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    path.write_bytes(b"x" * 11)
    with pytest.raises(BundleError, match="larger than the 10 bytes"):
        read_regular_file(path, 10)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda t: t.update(normalizer={"type": "Sequence", "normalizers": [], "decoders": 5}),
            "a Sequence's decoders that is not a list: '5'",
        ),
        (
            lambda t: t.update(
                truncation={"max_length": 0, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
            ),
            "its truncation's max_length 0 is not one the manifest can hold",
        ),
    ],
    ids=["sequence-key-not-a-list", "truncation-to-0"],
)
def test_a_tokenizer_the_library_reads_and_tfcompile_cannot_is_a_bundle_error(
    classifier_bundle: Path, tmp_path: Path, change: Any, message: str
) -> None:
    tokenizer = edited_tokenizer(classifier_bundle, change)
    folder = damaged(classifier_bundle, tmp_path, **{"tokenizer.json": tokenizer})
    with pytest.raises(BundleError, match=re.escape(message)):
        load(folder)


@pytest.mark.parametrize("seed", [2**70, -1, True, "7"])
def test_verify_refuses_a_recorded_seed_torch_cannot_take(
    char_bundle: Path, tmp_path: Path, seed: Any
) -> None:
    """A seed past int64 failed inside torch.manual_seed with an OverflowError's ValueError."""
    from tfcompile.export.bundle import verify_bundle

    folder = damaged(char_bundle, tmp_path, lambda m: m.update(source={"seed": seed}))
    with pytest.raises(BundleError, match=r"source records neither a run nor a seed \(a whole number from 0"):
        verify_bundle(folder)


def test_decode_and_encode_name_a_bad_argument(char_bundle: Path) -> None:
    """Ids past int64, negative or not integers, and texts that are not strings, were an
    OverflowError or a TypeError from inside the tokenizers library."""
    model = load(char_bundle)
    assert model.decode([[], np.array([1, 2])]) == ["", model.decode([[1, 2]])[0]]
    for rows, named in [
        ([[-1]], r"rows\[0\]\[0\] is -1, not a token id in \[0, 65\)"),
        ([[1], [10**20]], r"rows\[1\]\[0\] is 100000000000000000000, not a token id"),
        ([[1.5]], r"rows\[0\]\[0\] is 1.5"),
        ([[True]], r"rows\[0\]\[0\] is True"),
        ("abc", "rows must be rows of token ids, got 'abc'"),
        ([None], r"rows\[0\] must be a row of token ids, got None"),
        (np.array([[2**63]], np.uint64), r"rows\[0\]\[0\] is 9223372036854775808"),
        (np.zeros((2, 2), np.float32), "rows must be rows of integer token ids, got an array float32"),
    ]:
        with pytest.raises(InputError, match=named):
            model.decode(rows)
    with pytest.raises(InputError, match=r"texts takes strings or .* got 5"):
        model.encode(["a", 5])  # type: ignore[list-item]


def test_a_classifier_tokenizer_of_segment_ids_the_model_does_not_read_is_refused_at_load(
    classifier_bundle: Path, tmp_path: Path
) -> None:
    """Segment ids other than 0 and 1 failed every classify() call as the caller's error
    ("token_type_ids must hold 0 ... and 1"), though the caller passed none."""
    changed = []

    def seven(node: Any) -> None:
        if isinstance(node, dict):
            if "type_id" in node:
                node["type_id"] = 7
                changed.append(node)
            for value in node.values():
                seven(value)
        elif isinstance(node, list):
            for item in node:
                seven(item)

    tokenizer = edited_tokenizer(classifier_bundle, lambda t: seven(t["post_processor"]))
    assert changed
    folder = damaged(classifier_bundle, tmp_path, **{"tokenizer.json": tokenizer})
    with pytest.raises(
        BundleError, match=r"its post-processor gives the segment ids \[7\], and the model reads 0"
    ):
        load(folder)


@pytest.mark.parametrize(
    ("batch", "advice"),
    [(1, "a shorter input may fit; else the graph needs more"), (4, "send a smaller batch")],
)
def test_onnxruntime_out_of_memory_is_told_by_the_batch_it_ran(batch: int, advice: str) -> None:
    """A graph that allocates terabytes was blamed on the batch size, for a batch of one token."""
    from types import SimpleNamespace

    from tfcompile.runtime.ort import run

    class OutOfMemory:
        def get_inputs(self) -> list[Any]:
            return [SimpleNamespace(name="input_ids", type="tensor(int64)")]

        def run(self, *args: Any) -> list[Any]:
            raise RuntimeError("Failed to allocate memory for requested buffer of size 1099511627776")

    with pytest.raises(InputError, match=re.escape(advice)):
        run(OutOfMemory(), {"input_ids": np.zeros((batch, 1), np.int64)})


def test_verify_refuses_what_the_runtime_refuses(classifier_bundle: Path, tmp_path: Path) -> None:
    """verify reran parity alone: a manifest naming three labels for two logits, which every load
    refuses, verified (exit 0)."""
    from tfcompile.export import verify_bundle

    bundle = tmp_path / "bundle"
    shutil.copytree(classifier_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["labels"] = [*manifest["labels"], "third"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="3 labels"):
        verify_bundle(bundle, classifier_bundle.parent / "run")
