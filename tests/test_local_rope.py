"""``positional.local``: a second RoPE (its own theta and scaling) for the layers it lists, as
Gemma 3's sliding-window layers turn at a base of 10,000 where its other layers turn at 1,000,000.
Held to RoPE's formula layer by layer, the whole model to its blocks run by hand, the KV cache to
the full forward; counted, refused where it has no meaning, exported with parity (step graphs
too), fused and generated in onnxruntime as PyTorch does, and refused by field by export-hf
where the architecture turns every layer alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    assert_exports_with_parity,
    random_run,
    randomised,
    tiny_model,
    trained_decoder_generates_as_pytorch,
)

from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.models import DecoderLM
from tfcompile.spec import Spec, parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks import build_model

LOCAL = {"theta": 100.0, "layers": [0, 2]}


def _angles(positions: torch.Tensor, theta: float, dims: int, factor: float = 1.0) -> torch.Tensor:
    """RoPE's angles m * theta^(-2i/d), positions divided by a linear scaling's factor -> (T, d/2)."""
    return positions[:, None].double() / factor * theta ** (-torch.arange(0, dims, 2).double() / dims)


def test_each_listed_layer_turns_at_the_local_theta_and_the_others_at_the_model_s() -> None:
    """Layers 0 and 2 at theta 100 unscaled; layer 1 at 10,000 with the model's linear scaling."""
    spec = tiny_model(
        n_layers=3, positional={"type": "rope", "scaling": {"type": "linear", "factor": 2}, "local": LOCAL}
    )
    model = DecoderLM(spec)
    positions = torch.arange(16)
    rotaries = model.positional.layer_rotaries(positions, 3)
    hd = spec.head_dim
    assert hd is not None
    local, shared = _angles(positions, 100.0, hd), _angles(positions, 10000.0, hd, factor=2)
    for i, angles in enumerate((local, shared, local)):
        rotary = rotaries[i]
        assert rotary is not None
        torch.testing.assert_close(rotary.cos, angles.cos().float())
        torch.testing.assert_close(rotary.sin, angles.sin().float())


def test_a_local_scaling_is_the_listed_layers_own() -> None:
    """Dynamic scaling on the local layers alone: their angles are a plain RoPE's of that theta
    and scaling, per row; the other layers stay unscaled."""
    dynamic = {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
    spec = tiny_model(
        positional={"type": "rope", "local": {"theta": 500.0, "scaling": dynamic, "layers": [1]}}
    )
    alone = DecoderLM(tiny_model(positional={"type": "rope", "theta": 500.0, "scaling": dynamic})).positional
    plain = DecoderLM(tiny_model(positional="rope")).positional
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7]])  # a left-padded row
    first, second = DecoderLM(spec).positional.layer_rotaries(positions, 2)
    assert first is not None and second is not None
    torch.testing.assert_close(second.cos, alone.rotary(positions).cos)
    torch.testing.assert_close(first.cos, plain.rotary(positions).cos)
    assert not torch.equal(second.cos[0, -1], second.cos[1, -3])  # each row its own length, as alone


def test_the_model_runs_each_block_with_its_layer_s_rope_and_the_cache_agrees() -> None:
    spec = tiny_model(
        n_layers=3, n_kv_heads=2, positional={"type": "rope", "layout": "halves", "local": LOCAL}
    )
    model = randomised(DecoderLM(spec))
    ids = torch.randint(0, 50, (2, 7))
    positions = torch.arange(7)
    with torch.no_grad():
        local = DecoderLM(tiny_model(positional={"type": "rope", "layout": "halves", "theta": 100.0}))
        shared = DecoderLM(tiny_model(positional={"type": "rope", "layout": "halves"}))
        turns = [local, shared, local]
        x = model.embed(ids)
        for block, source in zip(model.blocks, turns, strict=True):
            rotary = source.positional.rotary(positions)
            x = block(x, None, True, rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double()))
        expected = model.lm_head(model.final_norm(x))
        torch.testing.assert_close(model(ids), expected)
        cache = model.empty_cache(2)
        steps = [model(ids[:, t : t + 1], cache=cache) for t in range(7)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_the_spec_counts_no_parameters_for_it(family: str) -> None:
    task = {"decoder": "causal_lm", "encoder": "masked_lm", "encoder_decoder": "seq2seq"}[family]
    model: dict[str, Any] = {
        "family": family,
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 3,
        "n_heads": 4,
        "max_seq_len": 16,
        "positional": {"type": "rope", "local": LOCAL},
    }
    spec = Spec.model_validate({"model": model, "task": task})
    plain = Spec.model_validate({"model": model | {"positional": "rope"}, "task": task})
    with torch.device("meta"):
        built = build_model(spec)
    assert spec.parameter_count() == plain.parameter_count() == sum(p.numel() for p in built.parameters())


MODEL = "vocab_size: 20, d_model: 16, n_layers: 3, n_heads: 2, max_seq_len: 8"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            "positional: {type: rope, local: {theta: 10, layers: [0, 3]}}",
            "model.positional.local.layers",
            "of the model's 3, found 3",
        ),
        (
            "positional: {type: rope, local: {theta: 10, layers: [1, 1, 2, 2]}}",
            "model.positional.local.layers",
            "names layers 1, 2 more than once",
        ),
        (
            "positional: {type: rope, local: {theta: 10, layers: []}}",
            "model.positional.local.layers",
            "at least 1",
        ),
        (
            "positional: {type: rope, local: {theta: 10, layers: [" + ", ".join(["0"] * 1025) + "]}}",
            "model.positional.local.layers",
            "at most 1024",
        ),
        (
            "positional: {type: rope, local: {theta: 10, layers: [-1]}}",
            "model.positional.local.layers.0",
            "greater than or equal to 0",
        ),
        (
            "positional: {type: rope, local: {theta: 1, layers: [0]}}",
            "model.positional.local.theta",
            "greater than 1",
        ),
        ("positional: {type: rope, local: {layers: [0]}}", "model.positional.local.theta", ""),
        ("positional: {type: learned, local: {theta: 10, layers: [0]}}", "model.positional.local", ""),
        (
            "positional: {type: rope, rotary_dims: 2, local: {theta: 10, layers: [0], scaling: "
            "{type: dynamic, factor: 2, original_max_position_embeddings: 4}}}",
            "model.positional.local.scaling",
            "must exceed 2",
        ),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(fields: str, field: str, message: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, {fields}}}\n")
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


def test_an_encoder_decoder_counts_each_stack_s_layers() -> None:
    text = (
        "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 3, n_decoder_layers: 2, "
        "n_heads: 2, max_seq_len: 8, positional: {type: rope, local: {theta: 10, layers: [2]}}}\n"
        "task: seq2seq\n"
    )
    with pytest.raises(SpecError, match="the decoder has 2, found 2") as error:
        parse_spec(text)
    assert [issue.path for issue in error.value.issues] == ["model.positional.local.layers"]
    parse_spec(text.replace("layers: [2]", "layers: [1]"))


BUNDLES = {
    "decoder, interleaved, opset 17": f"model: {{{MODEL}, n_kv_heads: 1, "
    "positional: {type: rope, local: {theta: 10, layers: [0, 2]}}}\nexport: {opset: 17}\n",
    "decoder, halves, local dynamic scaling, opset 23, fp16": f"model: {{{MODEL}, positional: {{type: rope, "
    "layout: halves, theta: 1000000, local: {theta: 10, layers: [1], scaling: "
    "{type: dynamic, factor: 2, original_max_position_embeddings: 4}}}, norm: {type: rmsnorm}}\n"
    "export: {opset: 23, precision: fp16}\n",
    "encoder classifier": f"model: {{family: encoder, {MODEL}, positional: {{type: rope, "
    "local: {theta: 10, layers: [1]}}}\ntask: {type: classification, labels: [a, b]}\n",
    "encoder-decoder": f"model: {{family: encoder_decoder, {MODEL}, positional: {{type: rope, "
    "local: {theta: 10, layers: [0]}}}\ntask: seq2seq\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


DYNAMIC = "{type: dynamic, factor: 4, original_max_position_embeddings: 4}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "local",
    ["{theta: 10, layers: [0, 2]}", f"{{theta: 10, layers: [0, 2], scaling: {DYNAMIC}}}"],
    ids=["plain", "dynamic local scaling"],
)
def test_a_trained_decoder_with_local_layers_fuses_with_parity_and_generates_as_pytorch(
    local: str, tmp_path: Path
) -> None:
    """Three layers, the first and last local: the graphs mix both RoPEs (a left-padded row's
    dynamic angles from its own length)."""
    done = trained_decoder_generates_as_pytorch(
        tmp_path, ["model.n_layers=3", "model.positional.theta=1000000", f"model.positional.local={local}"]
    )
    assert any(op.startswith("com.microsoft::") for step in done.steps for op in step.operators), done.steps


@pytest.mark.parametrize(
    "model",
    [
        "norm: {type: rmsnorm}, bias: {qkv: false, attn_out: false, ffn: false}",  # Llama
        "norm: {type: layernorm}",  # GPT-NeoX
    ],
    ids=["llama", "gpt-neox"],
)
def test_export_hf_refuses_local_layers_by_field(model: str, tmp_path: Path) -> None:
    text = (
        f"model: {{{MODEL}, {model}, positional: {{type: rope, layout: halves, "
        "local: {theta: 10, layers: [1]}}}\n"
    )
    run = random_run(tmp_path, text)
    with pytest.raises(HFError, match=r"model\.positional\.local"):
        export_hf(run, tmp_path / "hf")
