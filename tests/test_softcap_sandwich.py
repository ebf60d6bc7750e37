"""Gemma 2's choices as spec fields: ``attention_softcap`` (scores c * tanh(scores / c) before the
softmax), ``logit_softcap`` (a decoder's logits capped the same way) and ``norm.position:
sandwich`` (a norm on each sublayer's input and on its output: x + norm'(f(norm(x)))). Held to
their formulas, counted by the spec in every family, trained through the capped logits, exported
with parity (step graphs too), generated with the KV cache in onnxruntime as PyTorch does, and
refused by field by export-hf, whose architectures have none of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import random_run, tiny_model, trained_decoder_generates_as_pytorch

from tfcompile.export import Source, export_bundle
from tfcompile.models import DecoderLM
from tfcompile.nn.attention import may_attend
from tfcompile.nn.block import TransformerBlock
from tfcompile.spec import Spec, parse_spec
from tfcompile.spec.errors import SpecError
from tfcompile.tasks import build_model


def _randomised(module: torch.nn.Module) -> torch.nn.Module:
    """float64, eval, every weight random (norm scales and biases too), large enough that the
    caps bend the scores."""
    module = module.double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.5)
    return module


@pytest.mark.parametrize("padded", [False, True])
def test_capped_scores_are_c_tanh_of_the_scores_before_the_mask(padded: bool) -> None:
    """Self-attention with grouped K/V heads against the formula softmax(c tanh(s / c) + mask) v,
    s = q.k / sqrt(hd); with the KV cache, the same one token at a time."""
    spec = tiny_model(attention_softcap=2.0, n_kv_heads=2, positional="rope")
    model = _randomised(DecoderLM(spec))
    attn, hd = model.blocks[0].attn, spec.head_dim
    assert hd is not None
    x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split([4 * hd, 2 * hd, 2 * hd], -1)
    q, k, v = (t.reshape(2, 6, -1, hd).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
    rotary = model.positional.rotary(torch.arange(6))
    from tfcompile.nn.positional import apply_rotary

    q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q @ k.transpose(-1, -2) / hd**0.5
    assert scores.abs().max() > 4  # the cap (2) bends them
    allowed = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6)
    padding = torch.ones(2, 6, dtype=torch.bool)
    if padded:
        padding[1, 4:] = False
        allowed = may_attend(torch.arange(6), torch.arange(6), True, padding)
    capped = (2.0 * torch.tanh(scores / 2.0)).masked_fill(~allowed, float("-inf"))
    y = (capped.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, -1)
    expected = F.linear(y, attn.out.weight, attn.out.bias)
    close = {"rtol": 1e-6, "atol": 1e-6}  # RoPE turns q and k in float32
    with torch.no_grad():
        mask = may_attend(torch.arange(6), torch.arange(6), True, padding if padded else None)
        torch.testing.assert_close(attn(x, mask, rotary=rotary), expected, **close)
        if not padded:
            torch.testing.assert_close(attn(x, is_causal=True, rotary=rotary), expected, **close)
            cache = model.empty_cache(2)[0]
            steps = [
                attn(x[:, t : t + 1], rotary=model.positional.rotary(torch.tensor([t])), cache=cache)
                for t in range(6)
            ]
            torch.testing.assert_close(torch.cat(steps, 1), expected, **close)


def test_capped_logits_are_what_training_and_sampling_read() -> None:
    """logits = c tanh(head(h) / c); the training loss is the cross-entropy of those logits."""
    spec = parse_spec(
        "model: {vocab_size: 50, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 16, logit_softcap: 3.0}\n"
    )
    model = _randomised(build_model(spec))
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        hidden = model.hidden(ids)
        raw = model.lm_head(hidden)
        assert raw.abs().max() > 6
        logits = model(ids)
        torch.testing.assert_close(logits, 3.0 * torch.tanh(raw / 3.0))
        assert logits.abs().max() < 3.0
        loss = model(ids, loss=lambda h, head: F.cross_entropy(head(h).flatten(0, 1), ids.flatten()))
        torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), ids.flatten()))


@pytest.mark.parametrize("cross", [False, True], ids=["self", "with cross-attention"])
def test_a_sandwich_block_normalises_each_sublayers_input_and_output(cross: bool) -> None:
    spec = tiny_model(norm={"position": "sandwich", "type": "rmsnorm"})
    block = _randomised(TransformerBlock(spec, cross_attention=cross))
    x = torch.randn(2, 5, spec.d_model, dtype=torch.float64)
    memory = block.cross.project_memory(torch.randn(2, 3, spec.d_model).double()) if block.cross else None
    with torch.no_grad():
        expected = x + block.attn_out_norm(block.attn(block.attn_norm(x), is_causal=True))
        if block.cross is not None and memory is not None:
            expected = expected + block.cross_out_norm(block.cross(block.cross_norm(expected), memory))
        expected = expected + block.ffn_out_norm(block.ffn(block.ffn_norm(expected)))
        torch.testing.assert_close(block(x, is_causal=True, memory=memory), expected)
    outputs = [block.attn_out_norm, block.ffn_out_norm] + ([block.cross_out_norm] if cross else [])
    assert all(isinstance(norm, type(block.attn_norm)) for norm in outputs)


FAMILIES = {
    "decoder": ({"positional": "rope", "n_kv_heads": 2}, {"type": "causal_lm"}, 2 * 2),
    "encoder": ({}, {"type": "masked_lm"}, 2 * 2),
    "encoder_decoder": ({}, {"type": "seq2seq"}, 2 * 2 + 2 * 3),
    "vit": (
        {"image_size": 8, "patch_size": 4},
        {"type": "image_classification", "labels": ["a", "b"]},
        2 * 2,
    ),
}


def _spec(family: str, **fields: Any) -> Spec:
    model, task, _ = FAMILIES[family]
    base: dict[str, Any] = {"family": family, "d_model": 32, "n_layers": 2, "n_heads": 4}
    if family != "vit":
        base |= {"vocab_size": 50, "max_seq_len": 16}
    return Spec.model_validate({"model": base | model | fields, "task": task})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_spec_counts_a_norm_on_every_sublayers_output(family: str) -> None:
    """Sandwich norms add one norm per sublayer (two per layer, three with cross-attention; the
    FAMILIES' third column counts them over two layers) and a final norm by default; softcaps add
    nothing."""
    spec = _spec(family, norm={"position": "sandwich"}, attention_softcap=50.0)
    assert spec.model.norm.final
    with torch.device("meta"):
        model = build_model(spec)
    assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
    sublayers = FAMILIES[family][2]
    assert spec.parameter_count() - _spec(family).parameter_count() == sublayers * 2 * 32  # weight and bias


@pytest.mark.parametrize(
    ("model", "field", "message"),
    [
        ({"attention_softcap": 0}, "model.attention_softcap", "greater than 0"),
        ({"logit_softcap": -1.0}, "model.logit_softcap", "greater than 0"),
        ({"norm": {"position": "sandwich"}, "block": "parallel"}, "model.block", "no sandwich-norm form"),
        ({"norm": {"position": "peri"}}, "model.norm.position", ""),
    ],
)
def test_the_schema_refuses_at_the_field(model: dict[str, Any], field: str, message: str) -> None:
    fields = ", ".join(f"{k}: {v!r}".replace("'", "") for k, v in model.items())
    with pytest.raises(SpecError) as error:
        parse_spec(
            f"model: {{vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, {fields}}}\n"
        )
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


def test_only_a_decoder_caps_its_logits() -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(
            "model: {family: encoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
            "logit_softcap: 30}\ntask: masked_lm\n"
        )
    assert error.value.issues[0].path == "model.logit_softcap"


TINY_DECODER = "vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16"  # for export-hf
TINY_MODEL = "vocab_size: 20, d_model: 16, n_layers: 2, n_heads: 2, max_seq_len: 8"
BUNDLES = {
    "decoder, opset 17": f"model: {{{TINY_MODEL}, attention_softcap: 1.5, logit_softcap: 2.0, "
    "norm: {position: sandwich}, positional: rope, n_kv_heads: 1}\nexport: {opset: 17}\n",
    "decoder, opset 23, fp16": f"model: {{{TINY_MODEL}, attention_softcap: 1.5, logit_softcap: 2.0, "
    "norm: {position: sandwich, type: rmsnorm}, positional: {type: rope, layout: halves}}\n"
    "export: {opset: 23, precision: fp16}\n",
    "translator": f"model: {{family: encoder_decoder, {TINY_MODEL}, attention_softcap: 1.5, "
    "norm: {position: sandwich}}\ntask: seq2seq\nexport: {opset: 18}\n",
    "vit": "model: {family: vit, image_size: 8, patch_size: 4, d_model: 16, n_layers: 1, n_heads: 2, "
    "attention_softcap: 1.5, norm: {position: sandwich}}\n"
    "task: {type: image_classification, labels: [a, b]}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    reports = export_bundle(parse_spec(text), Source(seed=0), tmp_path / "bundle")
    assert all(r.passed for r in reports.values()), {n: r.to_dict() for n, r in reports.items()}


@pytest.mark.slow
def test_a_trained_gemma2_shaped_decoder_fuses_with_parity_and_generates_as_pytorch(tmp_path: Path) -> None:
    """Trained through capped logits, exported, optimized with parity; the bundles generate
    PyTorch's greedy tokens with the KV cache, a left-padded row as it would alone."""
    overrides = [
        "model.n_kv_heads=1",
        "model.norm.position=sandwich",
        "model.attention_softcap=2.0",
        "model.logit_softcap=5.0",
    ]
    trained_decoder_generates_as_pytorch(tmp_path, overrides)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("attention_softcap: 50.0", "model.attention_softcap: 50.0 has no GPT-2 equivalent"),
        ("logit_softcap: 30.0", "model.logit_softcap: 30.0 has no GPT-2 equivalent"),
        ("norm: {position: sandwich, final: false}", "model.norm.position: 'sandwich' has no OPT equivalent"),
        (
            "positional: rope, norm: {type: rmsnorm, bias: false, position: sandwich}, activation: swiglu",
            "model.norm.position: 'sandwich' has no Llama equivalent",
        ),
    ],
)
def test_export_hf_refuses_them_by_field(tmp_path: Path, model: str, field: str) -> None:
    """No architecture export-hf writes has capped scores or logits or sandwich norms: written
    without them, the folder would compute otherwise (an OPT folder would be post-norm)."""
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    run = random_run(
        tmp_path,
        f"model: {{vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, {model}}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert field in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        ("positional: rope, norm: {position: sandwich}", "has no GPT-NeoX equivalent; pre"),
        (
            "positional: rope, norm: {type: rmsnorm, bias: false, position: sandwich}, activation: swiglu",
            "has no Llama equivalent; pre",
        ),
        ("norm: {position: sandwich, final: false}", "has no OPT equivalent; pre or post"),
    ],
)
def test_export_hf_names_a_sandwich_norm_once_with_the_architectures_own_hint(
    tmp_path: Path, model: str, hint: str
) -> None:
    """no_extras named it a second time, with OPT's hint (pre or post) for every architecture."""
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    run = random_run(
        tmp_path,
        f"model: {{vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, {model}}}\n",
    )
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    lines = [line for line in str(error.value).splitlines() if "model.norm.position" in line]
    assert len(lines) == 1 and lines[0].endswith(f"'sandwich' {hint}"), lines
