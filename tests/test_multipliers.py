"""``model.residual_multiplier`` (each sublayer's output times m as it joins the residual stream),
and a decoder's ``embedding_multiplier`` and ``logit_multiplier`` (the token embeddings and the
logits times theirs): Granite's multipliers, Cohere's logit scale. Held to their definitions (the
block written out, the model against itself with the factors moved by hand), the KV cache to the
full forward, the loss to the logits it trains; counted as nothing, refused where they have no
meaning, exported with parity, fused and generated in onnxruntime as PyTorch does, and refused by
field by the export-hf architectures that have none. (Granite, which export-hf writes them as,
and its import: tests/test_hf_granite.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
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
from tfcompile.nn.block import TransformerBlock
from tfcompile.spec import parse_spec
from tfcompile.spec.errors import SpecError

MODEL = "vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 12"


@pytest.mark.parametrize(
    "norm", [{"position": "pre"}, {"position": "post"}, {"position": "sandwich"}], ids=lambda n: n["position"]
)
def test_each_sublayers_output_joins_the_residual_stream_times_the_multiplier(norm: dict[str, str]) -> None:
    spec = tiny_model(norm=norm, residual_multiplier=0.25)
    block = randomised(TransformerBlock(spec))
    x = torch.randn(2, 5, spec.d_model, dtype=torch.float64)
    with torch.no_grad():
        if norm["position"] == "post":
            h = block.attn_norm(x + 0.25 * block.attn(x, is_causal=True))
            expected = block.ffn_norm(h + 0.25 * block.ffn(h))
        else:
            h = x + 0.25 * block.attn_out_norm(block.attn(block.attn_norm(x), is_causal=True))
            expected = h + 0.25 * block.ffn_out_norm(block.ffn(block.ffn_norm(h)))
        torch.testing.assert_close(block(x, is_causal=True), expected)


def test_a_parallel_blocks_sum_joins_times_the_multiplier() -> None:
    spec = tiny_model(block={"type": "parallel"}, residual_multiplier=3.0)
    block = randomised(TransformerBlock(spec))
    x = torch.randn(2, 5, spec.d_model, dtype=torch.float64)
    with torch.no_grad():
        expected = x + 3.0 * (block.attn(block.attn_norm(x), is_causal=True) + block.ffn(block.ffn_norm(x)))
        torch.testing.assert_close(block(x, is_causal=True), expected)


def test_the_embeddings_and_logits_are_multiplied_and_the_cache_agrees() -> None:
    """A model with multipliers of 4 (embeddings, over sqrt(d_model)) and 0.5 (logits) is the plain
    model fed embeddings scaled by hand, its logits halved; then capped by logit_softcap."""
    fields = dict(scale_embeddings=True, embedding_multiplier=4.0, logit_multiplier=0.5, logit_softcap=3.0)
    model = randomised(DecoderLM(tiny_model(positional="rope", **fields)))
    plain = DecoderLM(tiny_model(positional="rope")).double().eval()
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = plain.embed(ids) * 32**0.5 * 4.0
        for block in plain.blocks:
            rotary = plain.positional.rotary(torch.arange(9))
            x = block(x, None, True, rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double()))
        expected = 3.0 * torch.tanh(plain.lm_head(plain.final_norm(x)) * 0.5 / 3.0)
        torch.testing.assert_close(model(ids), expected)
        cache = model.empty_cache(2)
        steps = [model(ids[:, :4], cache=cache)]  # a prompt, then one token at a time
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)
        loss = model(ids, loss=lambda h, head: F.cross_entropy(head(h).flatten(0, 1), ids.flatten()))
        torch.testing.assert_close(loss, F.cross_entropy(expected.flatten(0, 1), ids.flatten()))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ("residual_multiplier: 0", "model.residual_multiplier"),
        ("embedding_multiplier: -1", "model.embedding_multiplier"),
        ("logit_multiplier: 0", "model.logit_multiplier"),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(fields: str, field: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, {fields}}}\n")
    assert [issue.path for issue in error.value.issues] == [field], error.value


@pytest.mark.parametrize(
    "family", ["family: encoder, task: masked_lm", "family: encoder_decoder, task: seq2seq"], ids=str
)
def test_the_embedding_and_logit_multipliers_are_a_decoders(family: str) -> None:
    kind, task = family.split(", task: ")
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, {kind}, logit_multiplier: 2}}\ntask: {task}\n")
    assert [issue.path for issue in error.value.issues] == ["model.logit_multiplier"]
    spec = parse_spec(f"model: {{{MODEL}, {kind}, residual_multiplier: 2}}\ntask: {task}\n")
    assert (
        spec.parameter_count() == parse_spec(f"model: {{{MODEL}, {kind}}}\ntask: {task}\n").parameter_count()
    )


BUNDLES = {
    "decoder, RoPE, opset 23": f"model: {{{MODEL}, positional: rope, residual_multiplier: 0.25, "
    "embedding_multiplier: 12, logit_multiplier: 0.125}\nexport: {opset: 23}\n",
    "decoder, learned positions, softcap, opset 17": f"model: {{{MODEL}, residual_multiplier: 2, "
    "logit_multiplier: 4, logit_softcap: 5}\nexport: {opset: 17}\n",
    "encoder-decoder": f"model: {{{MODEL}, family: encoder_decoder, residual_multiplier: 0.5}}\n"
    "task: seq2seq\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_granite_shaped_decoder_fuses_with_parity_and_generates_as_pytorch(tmp_path: Path) -> None:
    trained_decoder_generates_as_pytorch(
        tmp_path,
        ["model.residual_multiplier=0.25", "model.embedding_multiplier=6", "model.logit_multiplier=0.25"],
    )


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("n_layers: 1, residual_multiplier: 0.5", "model.residual_multiplier"),  # GPT-2
        ("n_layers: 1, logit_multiplier: 0.5", "model.logit_multiplier"),
        (  # GPT-NeoX
            "n_layers: 1, positional: rope, embedding_multiplier: 3",
            "model.embedding_multiplier",
        ),
    ],
    ids=["gpt2 residual", "gpt2 logits", "gpt_neox embeddings"],
)
def test_export_hf_refuses_them_by_field_where_the_architecture_has_none(
    model: str, field: str, tmp_path: Path
) -> None:
    run = random_run(
        tmp_path, f"model: {{vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 24, {model}}}\n"
    )
    with pytest.raises(HFError, match=rf"\n  {re.escape(field)}: "):
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()
