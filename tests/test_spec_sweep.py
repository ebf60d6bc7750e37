"""A sweep of random valid specs, one per family, drawn with a fixed seed across the choices a
spec offers: each exports with parity, and its bundle answers a padded batch as it answers each
row alone, as the PyTorch model does."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tfcompile import runtime
from tfcompile.export import Source, export_bundle
from tfcompile.spec import Spec, parse_spec
from tfcompile.spec.choices import ACTIVATIONS, NORMS
from tfcompile.tasks.causal_lm import generate
from tfcompile.tasks.seq2seq import translate_tokens
from tfcompile.tasks.task import build_model

FAMILIES = {
    "decoder": "causal_lm",
    "encoder": "classification",
    "encoder_decoder": "seq2seq",
    "vit": "image_classification",
}


def _positional(rng: random.Random, family: str) -> Any:
    if family == "vit":
        return rng.choice(["learned", "sinusoidal", "none"])
    kind = rng.choice(["sinusoidal", "learned", "rope", "relative", "none"])
    if kind == "relative":
        return {"type": kind, "num_buckets": rng.choice([4, 8, 32]), "max_distance": rng.choice([17, 128])}
    if kind != "rope":
        return kind
    scalings = [
        None,
        {"type": "linear", "factor": 2.0},
        {"type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 4},
        {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8},
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    ]  # fmt: skip
    rope = {
        "type": "rope",
        "theta": rng.choice([500.0, 10000.0]),
        "layout": rng.choice(["interleaved", "halves"]),
    }
    scaling = rng.choice(scalings)
    return rope if scaling is None else {**rope, "scaling": scaling}


def draw(rng: random.Random, family: str) -> Spec:
    """A small valid spec of ``family`` with random architecture and export choices."""
    heads = rng.choice([1, 2, 4])
    model: dict[str, Any] = {
        "family": family,
        "d_model": 16,
        "n_layers": rng.choice([1, 2]),
        "n_heads": heads,
        "n_kv_heads": rng.choice([k for k in (1, 2, 4) if heads % k == 0]),
        "head_dim": rng.choice([4, 8]),
        "activation": rng.choice(ACTIVATIONS),
        "norm": {"position": rng.choice(["pre", "post"]), "type": rng.choice(NORMS), "eps": 1e-6},
        "positional": _positional(rng, family),
        "bias": {"qkv": rng.random() < 0.5, "attn_out": rng.random() < 0.5, "ffn": rng.random() < 0.5},
        "attention_scale": rng.choice([None, 0.5]),
        "init_std": rng.choice([0.02, 0.2]),
    }
    if family == "vit":
        model |= {"image_size": 8, "channels": rng.choice([1, 3]), "patch_size": rng.choice([2, 4])}
        model["pooling"] = rng.choice(["cls", "mean"])
    else:
        model |= {"vocab_size": rng.choice([13, 40]), "max_seq_len": rng.choice([6, 12])}
        model |= {"tie_embeddings": rng.random() < 0.5, "scale_embeddings": rng.random() < 0.5}
    if family == "decoder":
        model["vocab_multiple_of"] = rng.choice([1, 8])
    if family == "encoder":
        model["type_vocab_size"] = rng.choice([0, 2])
    task: dict[str, Any] = {"type": FAMILIES[family]}
    if family in ("encoder", "vit"):
        task["labels"] = ["a", "b", "c"]
    export = {"opset": rng.choice(range(17, 24)), "precision": rng.choice(["fp32", "fp16"])}
    return parse_spec(json.dumps({"model": model, "task": task, "export": export}))


def _check_rows(spec: Spec, model: torch.nn.Module, bundle: runtime.Bundle) -> None:
    """A batch with a padded row, against the PyTorch model and against each row alone."""
    rng = np.random.default_rng(0)
    tolerance = 2e-2 if spec.export.precision == "fp16" else 1e-3
    if spec.model.family == "vit":
        size = spec.model.image_size
        pixels = rng.standard_normal((2, spec.model.channels, size, size)).astype(np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(pixels)).numpy()
        np.testing.assert_allclose(
            bundle.logits(pixels), expected, atol=tolerance * max(1, abs(expected).max())
        )
        return
    length = spec.model.max_seq_len
    ids = rng.integers(0, spec.model.vocab_size, (2, length))
    mask = np.ones_like(ids)
    if spec.model.family == "decoder":  # prompts are left-padded
        mask[1, : length // 2] = 0
        batch = bundle.generate(ids, 2, temperature=0, attention_mask=mask, stop=False)
        for row in range(2):
            alone = ids[row : row + 1, mask[row].astype(bool)]
            expected = generate(model, torch.from_numpy(alone), 2, temperature=0)
            assert batch[row, -2:].tolist() == expected[0, -2:].tolist()
    elif spec.model.family == "encoder":
        mask[1, length // 2 :] = 0
        logits = bundle.logits(ids, mask)
        alone = bundle.logits(ids[1:, : length // 2])
        with torch.no_grad():
            expected = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(logits, expected, atol=tolerance * max(1, abs(expected).max()))
        np.testing.assert_allclose(logits[1:], alone, atol=tolerance * max(1, abs(alone).max()))
    else:
        mask[1, length // 2 :] = 0
        t = bundle.translation
        rows = translate_tokens(
            model, torch.from_numpy(ids), torch.from_numpy(mask), [t.start_id], t.stop_id, t.max_decode_len
        )
        assert bundle.translate_ids(ids, mask, beam=1) == rows
        assert bundle.translate_ids(ids[1:, : length // 2], beam=1) == rows[1:]


# The draw per family: together they take RoPE with llama3 and dynamic scaling, 2-D sinusoidal positions,
# gated and plain activations, MQA and GQA, both norms in both positions, fp16 and fp32.
SEEDS = {"decoder": 3, "encoder": 7, "encoder_decoder": 2, "vit": 2}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_random_valid_spec_exports_and_serves_rows_as_alone(family: str, tmp_path: Path) -> None:
    spec = draw(random.Random(f"{family}-{SEEDS[family]}"), family)
    export_bundle(spec, Source(seed=0), tmp_path / "bundle")
    torch.manual_seed(0)
    model = build_model(spec).eval()
    _check_rows(spec, model, runtime.load(tmp_path / "bundle", ["CPUExecutionProvider"]))
