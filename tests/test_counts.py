"""The spec layer counts parameters without torch (validate prints the count); the count must be
what the assemblies build, for every family, task and block choice."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

from tfcompile.spec import PRESETS, Spec
from tfcompile.spec.presets import merge
from tfcompile.tasks import build_model

CHOICES = {
    "norm": [
        {"type": "layernorm", "position": "pre"},
        {"type": "rmsnorm", "position": "post"},
        {"type": "rmsnorm", "bias": True, "final": True},
        {"type": "layernorm", "bias": False, "position": "post"},
    ],
    "activation": ["relu", "gelu_tanh", "swiglu", "swiglu_clamped", "geglu", "geglu_tanh"],
    "positional": ["learned", "sinusoidal", "rope", "relative", "none"],
    "bias": [
        {"qkv": True, "attn_out": True, "ffn": True, "lm_head": False},
        {"qkv": False, "attn_out": False, "ffn": False, "lm_head": True},
        {"qkv": True, "attn_out": False, "ffn": True, "lm_head": True},
    ],
    "tie_embeddings": [True, False],
    "n_kv_heads": [4, 2, 1],
    "moe": [
        None,
        {"experts": 3, "top_k": 1},
        {"experts": 4, "d_ff": 24, "shared_d_ff": 16, "shared_gate": True, "dense_layers": [1]},
        {"experts": 4, "top_k": 2, "router_bias": True},
    ],
    "attention_sinks": [False, True],
}
TASKS = [
    ({"family": "decoder"}, {"type": "causal_lm"}),
    ({"family": "encoder", "embedding_norm": True}, {"type": "masked_lm", "next_sentence": True}),
    ({"family": "encoder", "type_vocab_size": 0}, {"type": "masked_lm"}),
    ({"family": "encoder", "embedding_size": 12, "embedding_norm": True}, {"type": "masked_lm"}),
    ({"family": "encoder", "embedding_size": 12, "share_layers": True}, {"type": "masked_lm"}),
    (
        {"family": "encoder", "embedding_size": 40, "pooler_activation": "gelu"},
        {"type": "classification", "labels": ["a", "b"]},
    ),
    ({"family": "encoder", "pooler": False, "head_dim": 6}, {"type": "masked_lm"}),
    ({"family": "decoder", "head_dim": 10, "scale_output": True}, {"type": "causal_lm"}),
    ({"family": "encoder_decoder", "head_dim": 6, "attention_scale": 1.0}, {"type": "seq2seq"}),
    ({"family": "encoder"}, {"type": "classification", "labels": ["a", "b", "c"]}),
    ({"family": "encoder_decoder", "n_decoder_layers": 3}, {"type": "seq2seq"}),
    ({"family": "encoder_decoder", "share_embeddings": False}, {"type": "seq2seq"}),
    ({"family": "encoder_decoder", "embedding_norm": True}, {"type": "seq2seq"}),
    (
        {"family": "vit", "image_size": 8, "patch_size": 2, "channels": 3, "pooling": "cls"},
        {"type": "image_classification", "labels": ["x", "y"]},
    ),
    (
        {"family": "vit", "image_size": 8, "patch_size": 4, "channels": 1, "pooling": "mean"},
        {"type": "image_classification", "labels": ["x", "y"]},
    ),
]


def _cases() -> list[dict[str, Any]]:
    rng = random.Random(0)
    combos = list(itertools.product(*CHOICES.values()))
    cases = []
    for family, task in TASKS:
        for combo in rng.sample(combos, 12):
            model = {"d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 16, "vocab_size": 50}
            model |= dict(zip(CHOICES, combo, strict=True)) | family
            if family["family"] == "vit":
                if model["positional"] not in ("learned", "sinusoidal", "none"):
                    model["positional"] = "learned"
                del model["vocab_size"], model["max_seq_len"]
                model["bias"] = {**model["bias"], "lm_head": False}  # a ViT has no language-model head
            cases.append({"model": model, "task": task})
    return cases


def _count(spec: Spec) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(spec).parameters())


@pytest.mark.parametrize("raw", _cases(), ids=lambda c: f"{c['task']['type']}")
def test_the_spec_counts_what_the_model_builds(raw: dict[str, Any]) -> None:
    spec = Spec.model_validate(raw)
    assert spec.parameter_count() == _count(spec)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_count_as_built(name: str) -> None:
    sizes = {"task": {"labels": [str(i) for i in range(1000)]}} if "vit" in name else {}
    spec = Spec.model_validate(merge(merge(PRESETS[name], {"model": {}}), sizes))
    assert spec.parameter_count() == _count(spec)


def test_sizes_left_to_the_data_leave_the_count_open() -> None:
    spec = Spec.model_validate({"model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "max_seq_len": 8}})
    assert spec.sizes_from_data() == ["model.vocab_size"] and spec.parameter_count() is None
