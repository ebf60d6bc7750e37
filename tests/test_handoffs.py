"""Hand-offs to other servers: a bundle as a Triton model repository (tfcompile.handoffs.triton) and
as an ONNX Runtime GenAI folder (tfcompile.handoffs.genai).

Triton: every config.pbtxt parses as Triton's own ModelConfig message (shipped by tritonclient) and
names exactly its graph's inputs and outputs, with their types and dims read from the ONNX file;
the graphs are the bundle's bytes; and a client that follows the repository's documented loop over
the step model (left padding, empty cache, presents fed back, mask over past + new) generates what
tfcompile's runtime generates. There is no Triton server here.

GenAI: onnxruntime_genai loads the folder as it is, its greedy search gives exactly the runtime's
greedy tokens and text (under the repetition penalty and the n-gram ban too; the bans genai cannot
apply are refused), and its tokenizer the bundle tokenizer's ids; for a char tokenizer without
special tokens, a byte-level BPE without them, a char tokenizer with [PAD]/[UNK]/[EOS], and fp16."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime  # before onnxruntime_genai, which otherwise aborts the process on Linux
import pytest
from helpers import ONE_STEP, ROOT, TINY
from tokenizers import Tokenizer, models

from tfcompile.cli import main
from tfcompile.errors import ExportError, UserError
from tfcompile.export import Source, export_bundle
from tfcompile.handoffs.genai import GENAI_CONFIG, export_genai, genai_tokenizer, least_likely, sliced_logits
from tfcompile.handoffs.triton import export_triton
from tfcompile.manifest import MANIFEST
from tfcompile.runtime import load
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.generation import LanguageModel
from tfcompile.search import strip_stop
from tfcompile.spec import load_spec
from tfcompile.train import Trainer

PROMPTS = ["ROMEO:", "First Citizen:\nWe are", "O"]
# Prompts holding n-grams that the char bundle's barely trained model writes ("sMaBqtW&Yees..."):
# with no_repeat_ngram_size 2 or 3, the first token the ban changes after each would have repeated
# an n-gram that begins in the prompt.
REPEATING_PROMPTS = ["qtW", "GsZs", "sMaBqtW&Y", "tW&Ye ee"]
NEW_TOKENS = 20
TEXTS = ["ROMEO:\nWhat say you?", "  two  spaces, and\nlines\n\n", "KING HENRY VI: 'tis so; is't not?"]
TYPES = {"int64": "TYPE_INT64", "float": "TYPE_FP32", "float16": "TYPE_FP16"}


# ------------------------------------------------------------------------ bundles


def _train(root: Path, overrides: list[str]) -> Path:
    spec = load_spec(
        ROOT / "specs" / "shakespeare-char.yaml",
        [*TINY, "model.max_seq_len=64", *ONE_STEP, *overrides, f"train.runs_dir={root}"],
    )
    Trainer(spec, root / "run", show_progress=False).train()
    export_bundle(None, Source(run=root / "run"), root / "bundle")
    return root / "bundle"


@pytest.fixture(scope="module")
def char_run(char_bundle: Path) -> Path:
    """The char-level decoder of specs/shakespeare-char.yaml (WordLevel, no special tokens): the
    folder holding its run and its bundle."""
    return char_bundle.parent


class Bundles(dict):
    """Bundles by kind, each built on first use (the slow-marked kinds cost most): char; bpe
    (byte-level, no special tokens); char-special ([PAD] [UNK] [EOS] at 0-2, [EOS] stops);
    char-parallel (parallel blocks, RoPE on 4 of each head's 8 dimensions); char-padded (128 logits
    for the char tokenizer's 65 ids);
    char-fp16 (the char run's fp16 export); translator (encoder and decoder_step graphs) and vit
    (no tokenizer), tiny and random, exported from their specs."""

    def __init__(self, char_run: Path, root: Path) -> None:
        super().__init__(char=char_run / "bundle")
        self.char_run, self.root = char_run, root

    def __missing__(self, kind: str) -> Path:
        out = self.root / kind
        if kind == "char-fp16":
            export_bundle(None, Source(run=self.char_run / "run"), out, precision="fp16")
        elif kind == "bpe":
            _train(out, ["data.tokenizer={type: bpe, vocab_size: 300}", "model.vocab_size=null"])
            out = out / "bundle"
        elif kind == "char-special":
            _train(out, ["task.special_tokens=true", "model.vocab_size=null"])
            out = out / "bundle"
        elif kind == "char-padded":  # logits wider than the tokenizer, as a padded checkpoint's
            _train(out, ["model.vocab_size=128", "model.init_std=0.3"])
            out = out / "bundle"
        elif kind == "char-parallel":
            _train(out, ["model.positional={type: rope, rotary_dims: 4}", "model.block=parallel"])
            out = out / "bundle"
        else:
            name, overrides = {
                "translator": (
                    "multi30k-de-en.yaml",
                    ["model.vocab_size=50", "model.n_decoder_layers=1", "model.max_seq_len=16"],
                ),
                "vit": ("vit-digits.yaml", ["task.labels=[a,b,c]"]),
            }[kind]
            export_bundle(load_spec(ROOT / "specs" / name, [*TINY, *overrides]), Source(seed=0), out)
        self[kind] = out
        return out


def with_generation(bundle: Path, out: Path, **changes: Any) -> Path:
    """A copy of ``bundle`` at ``out``, its manifest's generation section changed."""
    shutil.copytree(bundle, out)
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["generation"].update(changes)
    (out / MANIFEST).write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def bundles(char_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    return Bundles(char_run, tmp_path_factory.mktemp("bundles"))


# ------------------------------------------------------------------------ Triton


@pytest.fixture(scope="module")
def pb() -> ModuleType:
    """Triton's ModelConfig protobuf module as tritonclient ships it. With only tritonclient[http]
    installed, tritonclient.grpc's __init__ needs grpcio: load the generated file by its path
    (it needs google.protobuf only)."""
    tritonclient = pytest.importorskip("tritonclient", reason="tritonclient is not installed")
    try:
        from tritonclient.grpc import model_config_pb2 as module

        return module
    except (ImportError, RuntimeError):
        path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
        spec = importlib.util.spec_from_file_location("model_config_pb2", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["model_config_pb2"] = module
        spec.loader.exec_module(module)
        return module


def parse_config(pb: ModuleType, path: Path) -> Any:
    from google.protobuf import text_format

    return text_format.Parse(path.read_text(), pb.ModelConfig())


def onnx_tensors(values: Any, batched: bool) -> list[tuple[str, str, list[int]]]:
    """(name, Triton type, Triton dims) of ONNX graph inputs or outputs, read from the file."""
    out = []
    for v in values:
        dims = v.type.tensor_type.shape.dim
        if batched:
            assert dims[0].dim_param == "batch", v.name
            dims = dims[1:]
        elem = onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower()
        out.append((v.name, TYPES[elem], [d.dim_value if d.HasField("dim_value") else -1 for d in dims]))
    return out


def config_tensors(entries: Any, pb: ModuleType) -> list[tuple[str, str, list[int]]]:
    return [(e.name, pb.DataType.Name(e.data_type), list(e.dims)) for e in entries]


@pytest.mark.parametrize(
    "kind", ["char", *(pytest.param(k, marks=pytest.mark.slow) for k in ("char-fp16", "translator", "vit"))]
)
def test_triton_repository_is_one_model_per_graph(
    pb: ModuleType, bundles: Bundles, kind: str, tmp_path: Path
) -> None:
    bundle = bundles[kind]
    manifest = json.loads((bundle / "manifest.json").read_text())
    folders = export_triton(bundle, tmp_path / "repo", max_batch_size=4, instances=2, max_queue_delay_us=250)

    assert folders == [tmp_path / "repo" / f"{bundle.name}-{g}" for g in manifest["graphs"]]
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == sorted(p.name for p in folders)
    for folder, (graph_name, graph) in zip(folders, manifest["graphs"].items(), strict=True):
        config = parse_config(pb, folder / "config.pbtxt")
        proto = onnx.load(str(folder / "1" / "model.onnx"))
        assert (folder / "1" / "model.onnx").read_bytes() == (bundle / graph["file"]).read_bytes()
        assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.onnx"]
        assert config.name == folder.name == f"{bundle.name}-{graph_name}"
        assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 4
        assert config_tensors(config.input, pb) == onnx_tensors(proto.graph.input, batched=True)
        assert config_tensors(config.output, pb) == onnx_tensors(proto.graph.output, batched=True)
        assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
        assert config.dynamic_batching.max_queue_delay_microseconds == 250
        assert [(g.kind, g.count) for g in config.instance_group] == [(pb.ModelInstanceGroup.KIND_CPU, 2)]
        # what a client needs, beside the config, where Triton does not look for versions
        assert json.loads((folder / "manifest.json").read_text())["graphs"] == manifest["graphs"]
        if "tokenizer" in manifest:
            assert (folder / "tokenizer.json").read_bytes() == (bundle / "tokenizer.json").read_bytes()
        else:
            assert not (folder / "tokenizer.json").exists()
    types = {t.data_type for f in folders for t in parse_config(pb, f / "config.pbtxt").output}
    assert types == {pb.TYPE_FP16 if kind == "char-fp16" else pb.TYPE_FP32}


def test_triton_without_batching_lists_every_axis(pb: ModuleType, bundles: Bundles, tmp_path: Path) -> None:
    for folder in export_triton(bundles["char"], tmp_path / "repo", max_batch_size=0, name="lm"):
        config = parse_config(pb, folder / "config.pbtxt")
        proto = onnx.load(str(folder / "1" / "model.onnx"))
        assert folder.name.startswith("lm-") and config.max_batch_size == 0
        assert config_tensors(config.input, pb) == onnx_tensors(proto.graph.input, batched=False)
        assert config_tensors(config.output, pb) == onnx_tensors(proto.graph.output, batched=False)
        assert config.WhichOneof("scheduling_choice") is None


def test_triton_refuses_to_overwrite_and_bad_settings(bundles: Bundles, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match=r"not empty.*choose a new --out"):
        export_triton(bundles["char"], out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"
    with pytest.raises(UserError, match="instances must be"):
        export_triton(bundles["char"], tmp_path / "other", instances=0)
    with pytest.raises(UserError, match="cannot name Triton models"):
        export_triton(bundles["char"], tmp_path / "other", name='a"b')
    for name in ("a b", "a" * 99):  # a flag's value to change (too long with "-model"): exit 2
        argv = ["export-triton", str(bundles["char"]), "--out", str(tmp_path / "other"), "--name", name]
        assert main(argv) == 2
    assert not (tmp_path / "other").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_triton(bundles["char"], empty)[0].parent == empty  # an empty folder is fine


@pytest.mark.slow  # end to end: the whole client loop through tritonclient's model
def test_triton_client_loop_generates_what_the_runtime_does(bundles: Bundles, tmp_path: Path) -> None:
    """The loop the triton module documents, run over the repository's step model with
    onnxruntime in place of Triton: a left-padded batch, an empty cache, presents fed back."""
    bundle = bundles["char-special"]
    step = next(f for f in export_triton(bundle, tmp_path / "repo") if f.name.endswith("-step"))
    manifest = json.loads((step / "manifest.json").read_text())
    graph = next(g for g in manifest["graphs"].values() if g["role"] == "decode_step")
    tokenizer = Tokenizer.from_file(str(step / "tokenizer.json"))
    session = onnxruntime.InferenceSession(str(step / "1" / "model.onnx"), providers=["CPUExecutionProvider"])

    rows = [tokenizer.encode(p).ids for p in PROMPTS]
    width = max(map(len, rows))
    pad = manifest["padding"]["pad_id"]
    ids = np.array([[pad] * (width - len(r)) + r for r in rows], dtype=np.int64)
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=np.int64)
    inputs = {t["name"]: t for t in graph["inputs"]}
    past = {
        name: np.zeros(
            [len(rows) if d == "batch" else 0 if d == "past_sequence" else d for d in inputs[name]["shape"]],
            np.float32,
        )
        for name in graph["cache"]["past"]
    }
    new: list[list[int]] = []
    for _ in range(NEW_TOKENS):
        outputs = session.run(None, {"input_ids": ids, "attention_mask": mask, **past})
        named = dict(zip([o.name for o in session.get_outputs()], outputs, strict=True))
        ids = named["logits"][:, -1].argmax(axis=1)[:, None].astype(np.int64)
        new.append(ids[:, 0].tolist())
        mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
        past = dict(zip(graph["cache"]["past"], (named[p] for p in graph["cache"]["present"]), strict=True))

    model = load(bundle)
    for r, row in enumerate(rows):
        alone = model.generate(np.array([row]), NEW_TOKENS, temperature=0, stop=False)[0, len(row) :]
        assert [n[r] for n in new] == alone.tolist()


@pytest.mark.slow
def test_triton_translator_loop_translates_what_the_runtime_does(bundles: Bundles, tmp_path: Path) -> None:
    """The translator's loop the triton module documents, over its encoder and step models with
    onnxruntime in place of Triton: right-padded sources of different lengths (one at the context),
    greedy. (The tiny translator has no tokenizer: its sources are ids.)"""
    folders = {f.name.rsplit("-", 1)[1]: f for f in export_triton(bundles["translator"], tmp_path / "repo")}
    manifest = json.loads((folders["step"] / "manifest.json").read_text())
    t, context, vocab = (
        manifest["translation"],
        manifest["model"]["max_seq_len"],
        manifest["model"]["vocab_size"],
    )
    sessions = {
        name: onnxruntime.InferenceSession(
            str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        for name, folder in folders.items()
    }
    sources = [[5, 6, 7, 8, 9, 10], [7], [11, 12] * context]
    rows = [[*ids[: context - len(t["source_suffix_ids"])], *t["source_suffix_ids"]] for ids in sources]
    width = max(map(len, rows))
    pad = manifest["padding"]["pad_id"]
    source_ids = np.array([r + [pad] * (width - len(r)) for r in rows], dtype=np.int64)
    source_mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    encoder = sessions["encoder"]
    memory = dict(
        zip(
            [o.name for o in encoder.get_outputs()],
            encoder.run(None, {"source_ids": source_ids, "source_mask": source_mask}),
            strict=True,
        )
    )
    step_graph = manifest["graphs"]["step"]
    shapes = {i["name"]: i["shape"] for i in step_graph["inputs"]}
    past = {
        name: np.zeros(
            [len(rows) if d == "batch" else 0 if isinstance(d, str) else d for d in shapes[name]], np.float32
        )
        for name in step_graph["cache"]["past"]
    }
    tokens = np.full((len(rows), 1), t["start_id"], dtype=np.int64)
    out: list[list[int]] = [[] for _ in rows]
    done = [False] * len(rows)
    for _ in range(min(t["max_decode_len"], context - 1)):
        feed = {"input_ids": tokens, "source_mask": source_mask, **past, **memory}
        named = dict(
            zip(
                [o.name for o in sessions["step"].get_outputs()],
                sessions["step"].run(None, feed),
                strict=True,
            )
        )
        tokens = named["logits"][:, -1, :vocab].argmax(axis=1)[:, None].astype(np.int64)
        for r, token in enumerate(tokens[:, 0].tolist()):
            done[r] = done[r] or token == t["stop_id"]
            if not done[r]:
                out[r].append(token)
        if all(done):
            break
        past = dict(
            zip(step_graph["cache"]["past"], (named[p] for p in step_graph["cache"]["present"]), strict=True)
        )
    assert out == load(bundles["translator"]).translate_ids(source_ids, source_mask, beam=1)
    assert any(len(row) > 1 for row in out)  # the loop ran some steps


# ------------------------------------------------------------------------ GenAI


@pytest.fixture(scope="module")
def og() -> ModuleType:
    return pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")


def genai_greedy(og: ModuleType, model: Any, ids: list[int], count: int, **search: Any) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(**{"max_length": len(ids) + count, "do_sample": False, **search})
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(ids, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(ids) :]


def runtime_greedy(runtime: Any, ids: list[int], config: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The runtime's greedy new tokens after ``ids`` (without stopping), and those up to genai's
    end token, which genai leaves out."""
    expected = runtime.generate(np.array([ids]), NEW_TOKENS, temperature=0, stop=False)[
        0, len(ids) :
    ].tolist()
    ended = next((i for i, t in enumerate(expected) if t in config["model"]["eos_token_id"]), None)
    return expected, expected[:ended]


def valid_part(text: str) -> str:
    """Text up to the first U+FFFD: invalid UTF-8, which a barely trained byte-level model writes,
    decodes differently (tokenizers writes U+FFFD for each bad byte, genai stops)."""
    return text.split("\ufffd")[0]


@pytest.mark.parametrize(
    "kind",
    [
        "char",
        "char-special",
        *(
            pytest.param(k, marks=pytest.mark.slow)
            for k in ("bpe", "char-fp16", "char-parallel", "char-padded")
        ),
    ],
)
def test_genai_greedy_generates_the_runtimes_tokens(
    og: ModuleType, bundles: Bundles, kind: str, tmp_path: Path
) -> None:
    bundle = bundles[kind]
    folder = export_genai(bundle, tmp_path / "genai")
    config = json.loads((folder / GENAI_CONFIG).read_text())
    stops = config["model"]["eos_token_id"]
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    runtime = load(bundle)
    assert runtime.tokenizer is not None
    for prompt in PROMPTS:
        ids = [int(i) for i in tokenizer.encode(prompt)]
        assert ids == runtime.tokenizer.encode(prompt).ids
        new = genai_greedy(og, model, ids, NEW_TOKENS)
        expected = runtime.generate(np.array([ids]), NEW_TOKENS, temperature=0, stop=False)[0, len(ids) :]
        end = next((i + 1 for i, t in enumerate(expected.tolist()) if t in stops), NEW_TOKENS)
        # genai ends at its end token, where tfcompile stops too (a stop token) or goes on
        assert new == expected[:end].tolist()
        text = runtime.generate_text(prompt, len(new), temperature=0)
        assert isinstance(text, str)
        decoded = tokenizer.decode(np.array(ids + new, dtype=np.int32))
        assert valid_part(decoded) == valid_part(text)
        if "\ufffd" not in text:
            assert decoded == text


def test_logits_wider_than_the_tokenizer_are_sliced_to_its_ids(bundles: Bundles, tmp_path: Path) -> None:
    """genai's search cannot mask scores: a padded model's extra columns, which the runtime never
    decodes, were taken by genai's greedy search (4 of 5 prompts diverged)."""
    bundle = bundles["char"]
    step = json.loads((bundle / MANIFEST).read_text())["graphs"]["step"]
    data = (bundle / step["file"]).read_bytes()
    cut = onnx.load_from_string(sliced_logits(data, 10))
    onnx.checker.check_model(cut, full_check=True)
    whole = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    sliced = onnxruntime.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    feed: dict[str, np.ndarray] = {
        t["name"]: np.zeros(
            [1 if d == "batch" else 0 if isinstance(d, str) else d for d in t["shape"]], np.float32
        )
        for t in step["inputs"][2:]  # an empty cache: (batch, heads, 0, head_dim)
    }
    feed |= {"input_ids": np.array([[5, 6, 7]], np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    expected, got = whole.run(None, feed), sliced.run(None, feed)
    names = [o.name for o in whole.get_outputs()]
    assert [o.name for o in sliced.get_outputs()] == names
    for name, a, b in zip(names, expected, got, strict=True):
        np.testing.assert_array_equal(a[..., :10] if name == "logits" else a, b)


@pytest.mark.slow  # builds the padded bundle
def test_the_least_likely_token_is_one_of_the_tokenizers(
    bundles: Bundles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training pushes a padded model's extra columns lowest: the reserved end token was one of them,
    outside the tokenizer's ids, and export-genai refused the bundle."""

    def logits(self: Any, ids: np.ndarray, mask: Any = None) -> np.ndarray:
        scores = np.zeros((len(ids), 1, 128), np.float32)
        scores[..., 65:] = -100.0  # the padding
        scores[..., 7] = -50.0
        return scores

    monkeypatch.setattr(LanguageModel, "logits", logits)
    assert least_likely(BundleFiles(bundles["char-padded"])) == 7


def test_genai_samples_within_the_vocabulary_and_its_top_p(
    og: ModuleType, bundles: Bundles, tmp_path: Path
) -> None:
    """A manifest without top_k wrote genai's 0, with which genai samples from every token and
    ignores top_p; one with a top_k past the vocabulary made every og.Generator fail."""
    for top_k, written in ((None, 65), (100, 65), (5, 5)):
        bundle = with_generation(
            bundles["char"], tmp_path / f"k{top_k}", top_k=top_k, top_p=0.6, temperature=1.0
        )
        folder = export_genai(bundle, tmp_path / f"genai{top_k}")
        search = json.loads((folder / GENAI_CONFIG).read_text())["search"]
        assert (search["top_k"], search["top_p"]) == (written, 0.6)
        model = og.Model(str(folder))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=4)
        og.Generator(model, params)


def test_genai_penalises_repeats_as_the_runtime_does(
    og: ModuleType, bundles: Bundles, tmp_path: Path
) -> None:
    """The manifest's repetition_penalty is genai_config.json's: genai's greedy tokens are the
    runtime's under it, which differ from the plain ones."""
    bundle = with_generation(bundles["char"], tmp_path / "penalised", repetition_penalty=1.8)
    folder = export_genai(bundle, tmp_path / "genai")
    config = json.loads((folder / GENAI_CONFIG).read_text())
    assert config["search"]["repetition_penalty"] == 1.8
    model, runtime, plain = og.Model(str(folder)), load(bundle), load(bundles["char"])
    assert runtime.tokenizer is not None
    for prompt in PROMPTS:
        ids = runtime.tokenizer.encode(prompt).ids
        expected, ending = runtime_greedy(runtime, ids, config)
        assert genai_greedy(og, model, ids, NEW_TOKENS) == ending
        unpenalised = plain.generate(np.array([ids]), NEW_TOKENS, temperature=0, stop=False)
        assert expected != unpenalised[0, len(ids) :].tolist()


@pytest.mark.parametrize("n", [2, 3])
def test_genai_bans_repeated_ngrams_as_the_runtime_does(
    og: ModuleType, bundles: Bundles, n: int, tmp_path: Path
) -> None:
    """The manifest's no_repeat_ngram_size is genai_config.json's: genai's greedy tokens (and its
    sampling's at top_k 1) are the runtime's under it, which differ from the plain ones, and its
    n-grams hold the prompt's tokens as the runtime's do: the first token the ban changes after
    each prompt would have repeated an n-gram that begins in the prompt."""
    bundle = with_generation(bundles["char"], tmp_path / "banned", no_repeat_ngram_size=n)
    folder = export_genai(bundle, tmp_path / "genai")
    config = json.loads((folder / GENAI_CONFIG).read_text())
    assert config["search"]["no_repeat_ngram_size"] == n
    model, runtime, plain = og.Model(str(folder)), load(bundle), load(bundles["char"])
    assert runtime.tokenizer is not None
    for prompt in REPEATING_PROMPTS:
        ids = runtime.tokenizer.encode(prompt).ids
        expected, ending = runtime_greedy(runtime, ids, config)
        assert genai_greedy(og, model, ids, NEW_TOKENS) == ending
        assert genai_greedy(og, model, ids, NEW_TOKENS, do_sample=True, top_k=1) == ending
        unbanned = plain.generate(np.array([ids]), NEW_TOKENS, temperature=0, stop=False)[0, len(ids) :]
        first = next((i for i, (a, b) in enumerate(zip(expected, unbanned, strict=True)) if a != b), None)
        assert first is not None, f"{prompt!r}: the ban changed nothing"
        seen = [*ids, *expected[:first]]
        gram = [*seen[len(seen) - n + 1 :], int(unbanned[first])]
        assert any(seen[j : j + n] == gram for j in range(len(ids))), (
            f"{prompt!r}: {gram} is not the prompt's"
        )


def test_genai_holds_off_the_stop_tokens_to_min_length_as_the_runtime_does(
    og: ModuleType, bundles: Bundles, tmp_path: Path
) -> None:
    """The manifest's min_length is genai_config.json's search.min_length: both count the prompt's
    tokens. With the first prompt's first greedy token made the stop token, the plain runtime
    ends there; under min_length the runtime, and genai alike, go on until the text is that long."""
    plain = load(bundles["char"])
    assert plain.tokenizer is not None
    ids = plain.tokenizer.encode(PROMPTS[0]).ids
    first = int(plain.generate(np.array([ids]), 1, temperature=0)[0, -1])
    least = len(ids) + 6
    bundle = with_generation(bundles["char"], tmp_path / "held", stop_token_ids=[first], min_length=least)
    folder = export_genai(bundle, tmp_path / "genai")
    config = json.loads((folder / GENAI_CONFIG).read_text())
    assert config["search"]["min_length"] == least
    model, runtime = og.Model(str(folder)), load(bundle)
    assert runtime.tokenizer is not None
    for prompt in PROMPTS:
        ids = runtime.tokenizer.encode(prompt).ids
        expected = runtime.generate(np.array([ids]), NEW_TOKENS, temperature=0)[0, len(ids) :].tolist()
        assert genai_greedy(og, model, ids, NEW_TOKENS) == strip_stop(expected, [first])  # genai's lacks it
        assert first not in expected[: max(least - len(ids), 0)]
        if prompt == PROMPTS[0]:  # which, unheld, would have ended at once
            assert expected[0] != first and len(expected) > 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"suppressed_ids": [5]},
            r"generation\.suppressed_ids \(\[5\]\).*cannot ban tokens.*without task\.suppressed_tokens",
        ),
        (
            {"min_new_tokens": 3},
            r"generation\.min_new_tokens \(3\).*search\.min_length, counts the prompt's tokens too.*"
            r"without task\.min_new_tokens",
        ),
        ({"min_p": 0.1}, r"generation\.min_p \(0\.1\).*search options have no min_p.*without task\.min_p"),
        (
            {"banned_sequences": [[5, 6]]},
            r"generation\.banned_sequences \(\[\[5, 6\]\]\).*cannot ban.*without task\.banned_sequences",
        ),
    ],
)
def test_genai_refuses_the_bans_it_cannot_apply(
    bundles: Bundles, changes: dict[str, Any], message: str, tmp_path: Path
) -> None:
    """genai_config.json has no setting that suppresses tokens, its min_length counts the prompt's
    tokens too, and its search has no min_p: a bundle with any of them is refused, nothing
    written."""
    bundle = with_generation(bundles["char"], tmp_path / "banned", **changes)
    with pytest.raises(ExportError, match=message):
        export_genai(bundle, tmp_path / "genai")
    assert not (tmp_path / "genai").exists()


@pytest.mark.parametrize("kind", ["char", "char-special", pytest.param("bpe", marks=pytest.mark.slow)])
def test_genai_tokenizer_gives_the_bundles_ids(
    og: ModuleType, bundles: Bundles, kind: str, tmp_path: Path
) -> None:
    folder = export_genai(bundles[kind], tmp_path / "genai")
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    bundle_tokenizer = load(bundles[kind]).tokenizer
    assert bundle_tokenizer is not None
    assert (folder / "decoder_step.onnx").read_bytes() == (bundles[kind] / "decoder_step.onnx").read_bytes()
    if kind == "bpe":  # a byte-level BPE goes as it is
        assert (folder / "tokenizer.json").read_bytes() == (bundles[kind] / "tokenizer.json").read_bytes()
    for text in TEXTS:
        ids = bundle_tokenizer.encode(text).ids
        assert [int(i) for i in tokenizer.encode(text)] == ids
        assert tokenizer.decode(np.array(ids, dtype=np.int32)) == bundle_tokenizer.decode(ids) == text


def test_genai_batch_rows_generate_what_they_would_alone(
    og: ModuleType, bundles: Bundles, tmp_path: Path
) -> None:
    """genai right-pads a batch's prompts with pad_token_id (and a row that ended with it); the
    graph counts positions from the mask, so each row gets the runtime's tokens for it alone."""
    bundle = bundles["char-special"]
    folder = export_genai(bundle, tmp_path / "genai")
    config = json.loads((folder / GENAI_CONFIG).read_text())["model"]
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=40, do_sample=False, batch_size=len(PROMPTS))
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode_batch(PROMPTS))
    while not generator.is_done():
        generator.generate_next_token()
    runtime = load(bundle)
    rows = [[int(i) for i in tokenizer.encode(p)] for p in PROMPTS]
    width = max(map(len, rows))
    for r, ids in enumerate(rows):
        sequence = [int(t) for t in generator.get_sequence(r)]
        assert sequence[len(ids) : width] == [config["pad_token_id"]] * (width - len(ids))
        new = sequence[width:]
        alone = runtime.generate(np.array([ids]), len(new), temperature=0, stop=False)[0, len(ids) :].tolist()
        end = next((i + 1 for i, t in enumerate(alone) if t in config["eos_token_id"]), len(alone))
        assert new[:end] == alone[:end]
        assert new[end:] == [config["pad_token_id"]] * (len(new) - end)


@pytest.mark.slow
def test_genai_special_tokens_and_the_reserved_end(bundles: Bundles, tmp_path: Path) -> None:
    """[EOS] and [PAD] where the vocabulary has them; without, a byte no UTF-8 text holds (byte-level
    BPE), the model's least likely token (char), or the token asked for."""
    ids = {}
    for kind in ("char", "bpe", "char-special"):
        config = json.loads((export_genai(bundles[kind], tmp_path / kind) / GENAI_CONFIG).read_text())
        ids[kind] = config["model"]
        assert config["search"]["past_present_share_buffer"] is False
        assert config["model"]["decoder"]["filename"] == "decoder_step.onnx"
    special = load(bundles["char-special"])
    assert ids["char-special"]["eos_token_id"] == [special.special_id("eos")]
    assert ids["char-special"]["pad_token_id"] == special.special_id("pad")
    bpe = Tokenizer.from_file(str(bundles["bpe"] / "tokenizer.json"))
    never_in_utf8 = bpe.token_to_id("ÿ")  # the byte 0xFF
    assert ids["bpe"]["eos_token_id"] == [never_in_utf8] and ids["bpe"]["pad_token_id"] == never_in_utf8
    char = load(bundles["char"])
    assert char.tokenizer is not None
    ids_all = np.arange(char.vocab_size)[:, None]
    probs = np.exp(char.logits(ids_all)[:, -1].astype(np.float64))
    mean = (probs / probs.sum(axis=1, keepdims=True)).mean(axis=0)
    assert ids["char"]["eos_token_id"] == [int(mean.argmin())]

    chosen = export_genai(bundles["char"], tmp_path / "chosen", end_token="$")
    model = json.loads((chosen / GENAI_CONFIG).read_text())["model"]
    assert model["eos_token_id"] == [char.tokenizer.token_to_id("$")]
    assert model["pad_token_id"] == model["bos_token_id"] == char.tokenizer.token_to_id("$")
    with pytest.raises(UserError, match="leave --end-token out"):
        export_genai(bundles["char-special"], tmp_path / "no", end_token="$")
    with pytest.raises(UserError, match="not an entry"):
        export_genai(bundles["char"], tmp_path / "no", end_token="[END]")


def test_genai_refuses_what_it_cannot_serve(bundles: Bundles, tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty"):
        export_genai(bundles["char"], out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    with pytest.raises(UserError, match="inside the bundle"):
        export_genai(bundles["char"], bundles["char"] / "genai")

    # a char vocabulary beyond ASCII cannot be one byte per token
    wide = Tokenizer(models.WordLevel({"a": 0, "é": 1, "猫": 2}, unk_token=None))
    with pytest.raises(UserError, match=r"'é', '猫'"):
        genai_tokenizer(wide.to_str().encode("utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["translator", "vit"])
def test_genai_refuses_bundles_that_are_not_decoders(bundles: Bundles, kind: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="serves decoders"):
        export_genai(bundles[kind], tmp_path / kind)


def test_the_commands_write_both_and_refuse_to_overwrite(
    bundles: Bundles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = str(bundles["char-special"])
    assert main(["export-triton", bundle, "--out", str(tmp_path / "repo"), "--max-batch-size", "4"]) == 0
    assert "bundle-model, bundle-step" in capsys.readouterr().out
    assert main(["export-genai", bundle, "--out", str(tmp_path / "genai")]) == 0
    assert (tmp_path / "genai" / GENAI_CONFIG).is_file()
    assert main(["export-genai", bundle, "--out", str(tmp_path / "genai")]) == 1
    assert "left untouched" in capsys.readouterr().err


@pytest.mark.slow
def test_genai_pads_a_byte_level_bpe_without_a_pad_token_with_a_byte_no_text_holds(
    bundles: Bundles, tmp_path: Path
) -> None:
    """With a stop token and no pad token, a byte-level BPE keeps padding with 0xFF, which no prompt
    can end in, not with its stop token (an imported GPT-2's <|endoftext|>)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["bpe"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    stop = tokenizer.token_to_id("a")
    manifest["generation"]["stop_token_ids"] = [stop]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    model = json.loads((export_genai(bundle, tmp_path / "genai") / GENAI_CONFIG).read_text())["model"]
    assert model["eos_token_id"] == [stop] and model["pad_token_id"] == tokenizer.token_to_id("ÿ")
