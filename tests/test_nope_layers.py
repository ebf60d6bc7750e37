"""``positional.nope_layers``: the layers whose queries and keys turn no RoPE (NoPE), as SmolLM3's
every fourth layer. Held to its definition (a listed layer's block is the block run without a
rotary), the KV cache to the full forward; counted, refused where it has no meaning, exported
with parity (step graphs too), fused and generated in onnxruntime as PyTorch does, and refused by
field by export-hf where the architecture turns every layer. (SmolLM3, which export-hf writes it
as, and its import: tests/test_hf_smollm3.py.)"""

from __future__ import annotations

from pathlib import Path

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
from tfcompile.spec import parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.summary import summarize

MODEL = "vocab_size: 20, d_model: 16, n_layers: 3, n_heads: 2, max_seq_len: 12"


def test_each_listed_layer_runs_without_a_rotary_and_the_cache_agrees() -> None:
    spec = tiny_model(
        n_layers=3,
        n_kv_heads=2,
        positional={"type": "rope", "nope_layers": [1], "local": {"theta": 100.0, "layers": [2]}},
    )
    model = randomised(DecoderLM(spec))
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(9)
    rotaries = model.positional.layer_rotaries(positions, 3)
    assert rotaries[1] is None and rotaries[0] is not None and rotaries[2] is not None
    with torch.no_grad():
        x = model.embed(ids)
        for block, rotary in zip(model.blocks, rotaries, strict=True):
            double = (
                None if rotary is None else rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double())
            )
            x = block(x, None, True, double)
        expected = model.lm_head(model.final_norm(x))
        torch.testing.assert_close(model(ids), expected)
        cache = model.empty_cache(2)
        steps = [model(ids[:, :3], cache=cache)] + [
            model(ids[:, t : t + 1], cache=cache) for t in range(3, 9)
        ]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


def test_a_layer_without_rope_reads_no_position() -> None:
    """A one-layer NoPE model's last position reads the tokens before it as a set: swapping two
    earlier ones changes nothing (no rotation tells them apart), where a RoPE layer's changes."""
    model = randomised(DecoderLM(tiny_model(n_layers=1, positional={"type": "rope", "nope_layers": [0]})))
    ids = torch.tensor([[3, 7, 11, 5]])
    swapped = torch.tensor([[7, 3, 11, 5]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, -1], model(swapped)[:, -1])
        rotated = randomised(DecoderLM(tiny_model(n_layers=1, positional="rope")))
        assert not torch.allclose(rotated(ids)[:, -1], rotated(swapped)[:, -1], atol=1e-4)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ("positional: {type: rope, nope_layers: [1, 1]}", "model.positional.nope_layers", "more than once"),
        ("positional: {type: rope, nope_layers: [3]}", "model.positional.nope_layers", "found 3"),
        ("positional: {type: rope, nope_layers: []}", "model.positional.nope_layers", "at least 1"),
        (
            "positional: {type: rope, nope_layers: [0], local: {theta: 10, layers: [0, 1]}}",
            "model.positional.nope_layers",
            "local.layers turns at a theta of their own: 0",
        ),
        ("positional: {type: learned, nope_layers: [0]}", "model.positional.nope_layers", ""),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(fields: str, field: str, message: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, {fields}}}\n")
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


def test_an_encoder_decoder_holds_the_list_to_each_stack() -> None:
    text = (
        "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 3, n_decoder_layers: 2, "
        "n_heads: 2, max_seq_len: 8, positional: {type: rope, nope_layers: [2]}}\ntask: seq2seq\n"
    )
    with pytest.raises(SpecError, match="the decoder has 2, found 2") as error:
        parse_spec(text)
    assert [issue.path for issue in error.value.issues] == ["model.positional.nope_layers"]
    spec = parse_spec(text.replace("nope_layers: [2]", "nope_layers: [1]"))
    assert spec.parameter_count() == parse_spec(text.replace(", nope_layers: [2]", "")).parameter_count()


BUNDLES = {
    "decoder, interleaved, grouped K/V, opset 17": f"model: {{{MODEL}, n_kv_heads: 1, "
    "positional: {type: rope, nope_layers: [0, 2]}}\nexport: {opset: 17}\n",
    "decoder, halves, a window over the NoPE layer, opset 23": f"model: {{{MODEL}, positional: {{type: rope, "
    "layout: halves, nope_layers: [1]}, norm: {type: rmsnorm}, window: {size: 4, layers: [1]}}\n"
    "export: {opset: 23}\n",
    "encoder-decoder": f"model: {{family: encoder_decoder, {MODEL}, positional: {{type: rope, "
    "nope_layers: [1]}}\ntask: seq2seq\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_decoder_with_nope_layers_fuses_with_parity_and_generates_as_pytorch(
    tmp_path: Path,
) -> None:
    trained_decoder_generates_as_pytorch(tmp_path, ["model.n_layers=2", "model.positional.nope_layers=[1]"])


@pytest.mark.parametrize(
    "model",
    [
        "n_layers: 2, n_kv_heads: 2, positional: {type: rope, nope_layers: [1]}, activation: gelu_tanh",
        "n_layers: 2, positional: {type: rope, nope_layers: [1]}, block: parallel",
    ],
    ids=["starcoder2", "gpt_neox"],
)
def test_export_hf_refuses_nope_layers_by_field(model: str, tmp_path: Path) -> None:
    run = random_run(
        tmp_path, f"model: {{vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 24, {model}}}\n"
    )
    with pytest.raises(HFError, match=r"\n  model\.positional\.nope_layers: "):
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_summary_notes_each_layer_that_turns_no_rope_in_every_stack() -> None:
    spec = parse_spec(
        f"model: {{family: encoder_decoder, {MODEL}, positional: {{type: rope, nope_layers: [1]}}}}\n"
        "task: seq2seq\n"
    )
    notes = {row.name: row.note for row in summarize(spec).rows if row.name.endswith(".attn")}
    assert notes == {
        "encoder_blocks.0.attn": "",
        "encoder_blocks.1.attn": "turns no RoPE",
        "encoder_blocks.2.attn": "",
        "decoder_blocks.0.attn": "",
        "decoder_blocks.1.attn": "turns no RoPE",
        "decoder_blocks.2.attn": "",
    }
    windowed = parse_spec(
        f"model: {{{MODEL}, positional: {{type: rope, nope_layers: [1]}}, "
        "window: {size: 4, layers: [1, 2]}}\n"
    )
    notes = {row.name: row.note for row in summarize(windowed).rows if row.name.endswith(".attn")}
    assert notes["blocks.1.attn"] == "slides over 4 positions; turns no RoPE"
