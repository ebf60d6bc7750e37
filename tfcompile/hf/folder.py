"""A ``save_pretrained`` folder on disk, read and written without transformers: ``config.json``,
the weights (``model.safetensors``, sharded safetensors with their index, or ``pytorch_model.bin``
read with ``weights_only``), the tokenizer's files and an image processor's configuration."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tfcompile.files import atomic_write_text, umask_mode
from tfcompile.hf.errors import HFError

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"  # written by transformers 4
PREPROCESSOR_CONFIG = "preprocessor_config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
# Formats transformers writes that tfcompile does not read, and what to do instead.
OTHER_FORMATS = {
    "tf_model.h5": "TensorFlow",
    "flax_model.msgpack": "Flax",
    "model.gguf": "GGUF",
}
RESAVE = "load it in transformers and save it again with model.save_pretrained(DIR) (safetensors)"


MAX_JSON_BYTES = 1 << 30  # a config or tokenizer file (the largest tokenizer.json: tens of MB)


def regular_file(path: Path) -> Path:
    """``path``, refused unless it is a regular file (a link to one, as a Hub snapshot's into its
    blobs, is one): a device (/dev/zero) or a pipe would be read without end."""
    if path.exists() and not path.is_file():
        raise HFError(f"{path} is not a regular file: a save_pretrained folder holds files")
    return path


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; an HFError naming the file when it is missing, not a regular
    file, over MAX_JSON_BYTES, or malformed."""
    try:
        if regular_file(path).stat().st_size > MAX_JSON_BYTES:
            raise HFError(
                f"{path} holds more than {MAX_JSON_BYTES:,} bytes, which no JSON file of a folder does"
            )
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HFError(f"{path} is missing: a save_pretrained folder holds it") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise HFError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def read_optional_json(path: Path) -> dict[str, Any]:
    return read_json(path) if path.exists() else {}


def weight_files(folder: Path) -> list[Path]:
    """The files holding the weights, in transformers' order of preference: one safetensors file,
    the shards of an index, a PyTorch pickle, the shards of its index."""
    for single, index in ((SAFETENSORS, SAFETENSORS_INDEX), (PICKLE, PICKLE_INDEX)):
        if (folder / single).exists():
            return [regular_file(folder / single)]
        if (folder / index).exists():
            weight_map = read_json(folder / index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map or not all(map(plain, weight_map.values())):
                raise HFError(f"{folder / index}: weight_map must name each tensor's shard, a file beside it")
            shards = sorted(set(weight_map.values()))
            missing = [name for name in shards if not (folder / name).is_file()]
            if missing:
                raise HFError(f"{folder / index} names shards that are missing: {', '.join(missing[:5])}")
            return [folder / name for name in shards]
    others = [f"{name} ({kind})" for name, kind in OTHER_FORMATS.items() if (folder / name).exists()]
    found = f"; it holds {', '.join(others)}, which tfcompile does not read" if others else ""
    raise HFError(
        f"{folder} holds no weights tfcompile reads ({SAFETENSORS}, {SAFETENSORS_INDEX}, {PICKLE} or "
        f"{PICKLE_INDEX}){found}: {RESAVE}"
    )


def plain(name: Any) -> bool:
    """Whether ``name`` is a file name alone (save_pretrained's shards), not a path elsewhere."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint by its name on disk, as float32 on the CPU (checkpoints are
    often saved in bf16 or fp16; tfcompile trains and exports from float32)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        for name, tensor in _read_file(path).items():
            if name in tensors:
                raise HFError(f"{path}: the tensor {name} is also in another shard")
            tensors[name] = tensor.float() if tensor.is_floating_point() else tensor
    return tensors


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if path.name.endswith(".safetensors"):
        try:
            with safe_open(str(path), framework="pt") as f:
                return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
        except (SafetensorError, OSError) as e:
            raise HFError(f"{path} cannot be read as safetensors: {e}") from None
    try:  # weights_only: a pickle may hold tensors and plain containers, never code to run
        # mmap reads only torch's zip format; a file saved before torch 1.6 is read whole
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError:  # torch's advice, to load it with weights_only=False, may run code
        raise HFError(
            f"{path} cannot be read as tensors alone (a corrupt file, or one that builds other "
            f"objects, which a pickle does by running code): {RESAVE}"
        ) from None
    except Exception as e:  # torch raises a RuntimeError or an OSError
        raise HFError(f"{path} cannot be read as a PyTorch state dict: {str(e).splitlines()[0]}") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise HFError(f"{path} does not hold a state dict of tensors: {RESAVE}")
    return state


def write_weights(folder: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> None:
    """``model.safetensors``, or shards of at most ``max_shard_bytes`` (a tensor larger than that
    alone in its shard) with ``model.safetensors.index.json``, as save_pretrained writes them."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(folder / SAFETENSORS), metadata=metadata)
        umask_mode(folder / SAFETENSORS)
        return
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata=metadata)
        umask_mode(folder / file)
        weight_map |= dict.fromkeys(shard, file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    write_json(folder / SAFETENSORS_INDEX, index)


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
