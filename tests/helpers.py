"""Shared test helpers: small specs and the project's paths."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hypothesis import strategies as st

from tfcompile.spec import DecoderSpec, Spec
from tfcompile.spec.presets import merge

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2"]  # a spec's model, as --set overrides
ONE_STEP = ["train.steps=1", "train.batch_size=4", "train.eval_interval=1", "train.eval_batches=1"]
# A small decoder's model section as a spec file writes it (line 6 is max_seq_len: 32).
MODEL_YAML = """\
model:
  vocab_size: 65
  d_model: 64
  n_layers: 2
  n_heads: 4
  max_seq_len: 32
"""


_PREPARED: dict[str, Path] = {}  # a data section's JSON -> the token cache prepared for it


def share_token_cache(spec: Spec) -> Spec:
    """``spec``, its runs folder's token cache (runs_dir/.cache) seeded with copies of the files
    that preparing its data section left: tokenized once per process, not once per test (tiny
    shakespeare: 1.2 CPU s each time). A spec whose task adds special tokens finds no match, and
    prepares its own."""
    import atexit
    import tempfile

    from tfcompile.data import prepare_corpus

    key = spec.data.model_dump_json()
    if key not in _PREPARED:
        _PREPARED[key] = Path(tempfile.mkdtemp(prefix="token-cache-"))
        atexit.register(shutil.rmtree, _PREPARED[key], True)
        prepare_corpus(spec.data, _PREPARED[key])
    cache = Path(spec.train.runs_dir) / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    for file in _PREPARED[key].iterdir():
        if not (cache / file.name).exists():
            shutil.copyfile(file, cache / file.name)
    return spec


if TYPE_CHECKING:  # torch is imported where it is used: helpers serves torch-free tests too
    import torch

Module = TypeVar("Module", bound="torch.nn.Module")


def randomised(module: Module) -> Module:
    """The module in float64 and eval mode, every weight drawn from N(0, 0.3^2) (seed 0): norm
    scales and biases too, so that a misplaced one shows."""
    import torch

    module = module.double().eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.3)
    return module


def tiny_model(**overrides: Any) -> DecoderSpec:
    """A decoder small enough to run in milliseconds; fields as in a spec's `model:` section."""
    base = {"vocab_size": 50, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 16}
    return Spec.model_validate({"model": merge(base, overrides)}).model


def assert_follows_schema(bundle: Path) -> None:
    """The bundle's manifest.json validates against the published schema, read as any client
    would read it: with jsonschema, knowing nothing of tfcompile's models."""
    import json

    import jsonschema

    schema = json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())
    jsonschema.validate(json.loads((bundle / "manifest.json").read_text()), schema)


def png16(array: Any) -> bytes:
    """A PNG of 16-bit samples: (H, W) grey or (H, W, 3) RGB uint16 (Pillow writes no 16-bit
    colour PNG)."""
    import struct
    import zlib

    import numpy as np

    array = np.asarray(array, dtype=">u2")
    height, width = array.shape[:2]
    colour = 0 if array.ndim == 2 else 2
    rows = b"".join(b"\x00" + array[y].tobytes() for y in range(height))  # filter 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def damaged(source: Path, tmp_path: Path, manifest: Any = None, **files: bytes) -> Path:
    """A copy of bundle ``source`` with ``files`` written and ``manifest`` applied to its manifest,
    the hashes made to match: damage that only the loader's own checks can find."""
    out = tmp_path / "damaged"
    shutil.copytree(source, out)
    m = json.loads((out / "manifest.json").read_text())
    for name, data in files.items():
        (out / name).write_bytes(data)
        m["files"][name] = hashlib.sha256(data).hexdigest()
    if manifest is not None:
        manifest(m)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def edited_tokenizer(bundle: Path, change: Any) -> bytes:
    """The bundle's tokenizer.json with ``change`` applied to its JSON."""
    tokenizer = json.loads((bundle / "tokenizer.json").read_text())
    change(tokenizer)
    return json.dumps(tokenizer).encode()


def without_truncation(bundle: Path, tmp_path: Path) -> Path:
    """A copy of ``bundle`` whose tokenizer.json and manifest name no truncation, as an imported
    tokenizer's bundle does."""
    tokenizer = edited_tokenizer(bundle, lambda t: t.update(truncation=None))
    return damaged(
        bundle, tmp_path, lambda m: m["tokenizer"].update(truncation=None), **{"tokenizer.json": tokenizer}
    )


def truncating_one_side(bundle: Path, tmp_path: Path, strategy: str) -> Path:
    """A copy of ``bundle`` whose tokenizer.json and manifest cut one sentence of a pair
    (``strategy``: only_first or only_second), at the manifest's length, as an imported
    tokenizer's may."""
    length = json.loads((bundle / "manifest.json").read_text())["tokenizer"]["truncation"]["max_length"]
    cut = {
        "max_length": length,
        "strategy": strategy.title().replace("_", ""),
        "direction": "Right",
        "stride": 0,
    }
    tokenizer = edited_tokenizer(bundle, lambda t: t.update(truncation=cut))
    return damaged(
        bundle,
        tmp_path,
        lambda m: m["tokenizer"]["truncation"].update(strategy=strategy),
        **{"tokenizer.json": tokenizer},
    )


def json_paths(node: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a JSON document, as the keys and indices that reach it (() is the whole)."""
    if isinstance(node, dict):
        return [path, *(p for k, v in node.items() for p in json_paths(v, (*path, k)))]
    if isinstance(node, list):
        return [path, *(p for i, v in enumerate(node) for p in json_paths(v, (*path, i)))]
    return [path]


def mutate_json(
    document: dict, data: st.DataObject, junk: st.SearchStrategy[Any], spare: tuple[str, ...] = ()
) -> None:
    """One to three edits of ``document`` in place, drawn by hypothesis's ``data``: a key dropped,
    or a value (a key's or an item's) replaced by one of ``junk``; never the whole document, nor
    anything under a top-level key in ``spare``."""
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in json_paths(document) if p and p[0] not in spare]
        path = data.draw(st.sampled_from(paths))
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1])
        else:
            parent[path[-1]] = data.draw(junk)


def trained_decoder_generates_as_pytorch(tmp_path: Path, overrides: list[str]) -> Any:
    """specs/shakespeare-char-llama.yaml, tiny, with ``overrides``, trained one step, exported and
    fused by `tfcompile optimize` with parity; both bundles generate PyTorch's greedy tokens with
    the KV cache, and a left-padded row what it would alone. -> the optimize result."""
    import numpy as np
    import torch

    from tfcompile.export import Source, export_bundle
    from tfcompile.optimize import Plan, optimize_bundle
    from tfcompile.runtime import load
    from tfcompile.spec import load_spec
    from tfcompile.tasks.causal_lm import generate
    from tfcompile.train import Trainer
    from tfcompile.train.runs import load_trained_model

    sets = [*TINY, "model.d_model=32", "model.max_seq_len=32", *overrides, *ONE_STEP]
    spec = load_spec(ROOT / "specs" / "shakespeare-char-llama.yaml", [*sets, f"train.runs_dir={tmp_path}"])
    Trainer(spec, tmp_path / "run", show_progress=False).train()
    export_bundle(None, Source(run=tmp_path / "run"), tmp_path / "bundle")
    done = optimize_bundle(tmp_path / "bundle", tmp_path / "fused", Plan(fuse=True), None)
    assert done.parity and max(done.parity.values()) <= 1e-4
    _, model = load_trained_model(tmp_path / "run")
    prompt = np.array([[5, 9, 13, 2], [7, 1, 30, 4]])
    expected = generate(model, torch.from_numpy(prompt), 12, temperature=0).numpy()
    for bundle in ("bundle", "fused"):
        runtime = load(tmp_path / bundle)
        np.testing.assert_array_equal(runtime.generate(prompt, 12, temperature=0), expected)
        mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
        ragged = runtime.generate(prompt, 6, temperature=0, attention_mask=mask, stop=False)
        alone = runtime.generate(prompt[1:, 2:], 6, temperature=0, stop=False)
        np.testing.assert_array_equal(ragged[1, 4:], alone[0, 2:])
    return done


def random_run(tmp_path: Path, text: str) -> Path:
    """A run of the spec ``text``'s random model (seed 0, every bias and norm shift moved off its
    initial value so that a misplaced one shows), as training writes it (no tokenizer): tmp_path/run."""
    import torch

    from tfcompile.hf.importer import write_run
    from tfcompile.spec import parse_spec
    from tfcompile.tasks import build_model

    spec = parse_spec(text)
    torch.manual_seed(0)
    model = build_model(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    run = tmp_path / "run"
    write_run(run, spec, model, tmp_path, None)
    return run


def assert_exports_with_parity(text: str, folder: Path) -> None:
    """The spec ``text``'s random model (seed 0) exports into ``folder`` with every graph's parity
    check passed."""
    from tfcompile.export import Source, export_bundle
    from tfcompile.spec import parse_spec

    reports = export_bundle(parse_spec(text), Source(seed=0), folder)
    assert all(r.passed for r in reports.values()), {n: r.to_dict() for n, r in reports.items()}
