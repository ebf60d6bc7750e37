"""`tfcompile import`, reviewed a second time: folders and config.json files that transformers'
save_pretrained would not write (a field of another JSON type, an index naming a file elsewhere,
tensors whose shapes do not fit together, a tokenizer the library cannot read or none at all), each
refused by name or warned of, never a traceback and never a model that computes otherwise; and the
ones it would (a pickle of torch before 1.6, a Mistral config without its sliding window, an image
processor resizing with another filter) imported as transformers reads them."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import from_pretrained, max_difference, save
from safetensors.torch import load_file, save_file

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny folders saved by transformers, one per family these tests change."""
    root = tmp_path_factory.mktemp("saved")
    for name in ("gpt2", "llama", "mistral", "vit"):
        save(name, root / name)
    return {name: root / name for name in ("gpt2", "llama", "mistral", "vit")}


def _copy(saved: dict[str, Path], name: str, tmp_path: Path, **fields: Any) -> Path:
    """A copy of the saved folder, with ``fields`` set in its config.json (None: removed)."""
    folder = tmp_path / "src"
    shutil.copytree(saved[name], folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in fields.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _import(folder: Path, tmp_path: Path, name: str = "x") -> Any:
    return import_folder(folder, name, tmp_path / "specs", tmp_path / "runs")


def _refused(folder: Path, tmp_path: Path, match: str) -> None:
    with pytest.raises(HFError, match=match):
        _import(folder, tmp_path)
    assert not (tmp_path / "runs" / "x").exists() and not (tmp_path / "specs" / "x.yaml").exists()


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("gpt2", "model_type", ["gpt2"]),
        ("gpt2", "architectures", "GPT2LMHeadModel"),
        ("gpt2", "tie_word_embeddings", "no"),  # was read as true
        ("llama", "num_attention_heads", "4"),
        ("llama", "hidden_act", ["silu"]),
        ("llama", "rope_parameters", [10000.0]),
        ("llama", "rms_norm_eps", "1e-5"),
    ],
)
def test_a_field_of_another_json_type_is_refused_by_name(
    saved: dict[str, Path], tmp_path: Path, name: str, field: str, value: Any
) -> None:
    _refused(_copy(saved, name, tmp_path, **{field: value}), tmp_path, rf"\n  {field}: ")


def test_a_rope_type_that_is_not_a_string_is_refused_by_name(saved: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(saved, "llama", tmp_path, rope_parameters={"rope_type": ["linear"], "factor": 2.0})
    _refused(folder, tmp_path, r"\n  rope_parameters.rope_type: ")


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/x.safetensors", 5, "sub/a.safetensors"])
def test_an_index_naming_anything_but_a_file_beside_it_is_refused(
    saved: dict[str, Path], tmp_path: Path, shard: Any
) -> None:
    """save_pretrained names each shard by its file name; a path elsewhere is never read."""
    folder = _copy(saved, "gpt2", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").rename(tmp_path / "outside.safetensors")
    (folder / "sub").mkdir()
    save_file(tensors, folder / "sub" / "a.safetensors")
    index = {"weight_map": dict.fromkeys(tensors, shard)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(folder, tmp_path, "weight_map must name each tensor's shard, a file beside it")


def test_a_pickle_saved_before_torch_1_6_imports(saved: dict[str, Path], tmp_path: Path) -> None:
    """torch's legacy format cannot be memory-mapped: it is read whole (with weights_only)."""
    folder = _copy(saved, "gpt2", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(tensors, folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    _, model = load_trained_model(_import(folder, tmp_path).run_dir)
    assert max_difference(from_pretrained(saved["gpt2"]), model, padded=True) <= 1e-5


def test_a_pickle_that_builds_other_objects_is_refused_without_being_run(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    folder = _copy(saved, "gpt2", tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"h.0.ln_1.weight": torch.ones(2), "code": print}, folder / "pytorch_model.bin")
    _refused(folder, tmp_path, r"pytorch_model\.bin cannot be read as tensors alone .*save_pretrained")


@pytest.mark.parametrize(
    "shapes",
    [
        {"q_proj": (40, 32), "k_proj": (8, 32)},  # the rows add up: loaded, they would compute otherwise
        {"q_proj": (32, 30)},  # columns of another width
    ],
)
def test_projections_whose_shapes_do_not_fit_together_are_refused_by_shape(
    saved: dict[str, Path], tmp_path: Path, shapes: dict[str, tuple[int, ...]]
) -> None:
    folder = _copy(saved, "llama", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    for projection, shape in shapes.items():
        tensors[f"model.layers.0.self_attn.{projection}.weight"] = torch.randn(shape)
    save_file(tensors, folder / "model.safetensors")
    _refused(folder, tmp_path, r"shapes that do not fit together: layers\.0\.self_attn\.q_proj\.weight")


def test_a_tokenizer_json_the_library_cannot_read_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(saved, "gpt2", tmp_path)
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unknown"}}))
    _refused(folder, tmp_path, r"tokenizer\.json is not a tokenizer the tokenizers library reads")


def test_a_folder_without_tokenizer_json_warns_naming_the_files_it_holds(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    folder = _copy(saved, "llama", tmp_path)
    (folder / "tokenizer.json").rename(folder / "tokenizer.model")  # as a sentencepiece folder holds it
    with pytest.warns(HFWarning, match=r"no tokenizer\.json; it holds tokenizer\.model, which tfcompile"):
        result = _import(folder, tmp_path)
    assert not (result.run_dir / "tokenizer.json").exists()


def test_a_spec_path_that_is_a_folder_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "specs" / "x.yaml").mkdir(parents=True)
    with pytest.raises(HFError, match=r"x\.yaml exists: choose another --name"):
        _import(saved["gpt2"], tmp_path)
    assert not (tmp_path / "runs" / "x").exists()


def test_mistral_without_a_sliding_window_slides_as_its_config_class_says(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    """MistralConfig's sliding window is 4096 where config.json leaves it out (null: none)."""
    folder = _copy(saved, "mistral", tmp_path, sliding_window=None, max_position_embeddings=8192)
    hf = from_pretrained(folder)
    assert hf.config.sliding_window == 4096
    spec, model = load_trained_model(_import(folder, tmp_path).run_dir)
    assert (spec.model.max_seq_len, spec.model.window.size, spec.model.window.layers) == (8192, 4096, None)
    assert max_difference(hf, model, padded=True) <= 1e-5
    null = _copy(saved, "mistral", tmp_path / "null", max_position_embeddings=8192)
    null_config = json.loads((null / "config.json").read_text()) | {"sliding_window": None}
    (null / "config.json").write_text(json.dumps(null_config))
    assert _import(null, tmp_path / "null").spec.model.window is None


def test_an_image_processor_resizing_with_another_filter_is_warned_of(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    folder = _copy(saved, "vit", tmp_path)
    path = folder / "preprocessor_config.json"
    processor = json.loads(path.read_text()) | {"resample": 3, "image_mean": 0.5, "size": 8}
    path.write_text(json.dumps(processor))
    with pytest.warns(HFWarning, match=r"resample 3 is not bilinear \(2\)"):
        result = _import(folder, tmp_path)
    preprocessing = json.loads((result.run_dir / "preprocessing.json").read_text())
    assert preprocessing["mean"] == [0.5, 0.5, 0.5]
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFWarning)
        _import(saved["vit"], tmp_path, "bilinear")  # ViTImageProcessor's own filter: no warning


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("image_mean", [math.nan, 0.5, 0.5]),
        ("image_std", 1e-7),
        ("image_std", math.inf),
        ("image_mean", -1e7),
    ],
)
def test_an_image_processor_s_mean_or_std_a_bundle_cannot_hold_is_refused_by_name(
    saved: dict[str, Path], tmp_path: Path, field: str, value: Any
) -> None:
    """Each imported and failed the export later, with pydantic's error of the manifest's image
    section, which holds each value finite and a std from 1e-6 (NaN made every pixel NaN)."""
    folder = _copy(saved, "vit", tmp_path)
    path = folder / "preprocessor_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {field: value}))
    with pytest.raises(HFError, match=rf"{field}: .* is not a number per channel from"):
        _import(folder, tmp_path)


def test_an_image_processor_s_resample_of_another_type_is_refused_by_name(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    """resample and do_resize were read after the problems were raised: a resample of another JSON
    type was recorded, never reported, and read as bilinear."""
    folder = _copy(saved, "vit", tmp_path)
    path = folder / "preprocessor_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"resample": "bicubic"}))
    with pytest.raises(HFError, match="resample"):
        _import(folder, tmp_path)
