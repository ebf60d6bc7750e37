"""ONNX export: onnxruntime gives PyTorch's logits for every decoder choice, at several shapes."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from helpers import tiny_model

from tfcompile.export import check_decoder_parity, check_step_parity, export_decoder, export_decoder_step
from tfcompile.models import DecoderLM

# Every value of every axis appears at least once: norm position and type, each activation, each
# positional scheme, MHA/GQA/MQA, tied and untied heads.
VARIANTS = [
    {"norm": {"position": "pre", "type": "layernorm"}, "activation": "relu", "positional": "learned"},
    {"norm": {"position": "post", "type": "layernorm"}, "activation": "gelu", "positional": "sinusoidal"},
    {
        "norm": {"position": "pre", "type": "rmsnorm"},
        "activation": "swiglu",
        "positional": "rope",
        "n_kv_heads": 2,
    },
    {
        "norm": {"position": "post", "type": "rmsnorm"},
        "activation": "geglu",
        "positional": "relative",
        "n_kv_heads": 1,
    },
    {"activation": "gelu_tanh", "positional": "none", "tie_embeddings": False, "bias": {"lm_head": True}},
    {
        "activation": "silu",
        "positional": {"type": "rope", "theta": 500.0},
        "n_kv_heads": 1,
        "scale_embeddings": True,
    },
]


def _id(v: dict) -> str:
    pos = v["positional"] if isinstance(v["positional"], str) else v["positional"]["type"]
    return f"{v.get('norm', {}).get('position', 'pre')}-{v['activation']}-{pos}-kv{v.get('n_kv_heads', 4)}"


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_onnx_matches_torch_at_several_shapes(variant: dict, tmp_path: Path) -> None:
    model = DecoderLM(tiny_model(**variant))
    path = tmp_path / "model.onnx"
    proto = export_decoder(model, path, opset=18)
    assert [i.name for i in proto.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert all(d.dim_param for d in dims), "batch and sequence axes must be symbolic"
    report = check_decoder_parity(model, path, tolerance=1e-5)
    assert {(c.batch, c.seq) for c in report.cases} == {(1, 1), (1, 7), (4, 7), (2, 16)}
    assert report.passed, report.to_dict()
    assert report.max_abs_diff < 1e-5


def test_exported_graph_is_valid_onnx(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    export_decoder(DecoderLM(tiny_model()), path, opset=18)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    # The attention mask reaches SDPA in float form: a boolean one would add an IsNaN and a Where
    # over every layer's (batch, heads, seq, seq) scores, about a tenth of the CPU forward pass.
    assert not [n for n in proto.graph.node if n.op_type == "IsNaN"]


@pytest.mark.parametrize("variant", VARIANTS[2:4], ids=_id)
def test_incremental_graph_matches_torch_step_by_step(variant: dict, tmp_path: Path) -> None:
    model = DecoderLM(tiny_model(**variant))
    path = tmp_path / "step.onnx"
    proto = export_decoder_step(model, path, opset=18)
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input
    }
    kv = model.spec.n_kv_heads
    assert shapes["past_key_1"] == ["batch", kv, "past_sequence", 8]
    present = [d.dim_param for d in proto.graph.output[1].type.tensor_type.shape.dim]
    assert present[2] == "past_sequence + sequence"
    report = check_step_parity(model, path, tolerance=1e-5)
    assert report.passed and report.max_abs_diff < 1e-5, report.to_dict()
