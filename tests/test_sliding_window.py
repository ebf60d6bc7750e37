"""``model.window``: sliding-window attention (Mistral, Gemma 2 and 3, Qwen2 from a layer on). In
the layers it lists (every layer by default) a query at position i attends to the keys at
i - size + 1 .. i only. Held to that formula (a one-layer RoPE model's logits at i are the
windowless model's on the last ``size`` tokens alone), the whole model to its blocks run by hand
with masks built here, the KV cache to the full forward past the window; refused where it has no
meaning; exported with parity past the window (step graphs too), fused, and generated in
onnxruntime as PyTorch does, a left-padded row as it would alone; counted in FLOPs by its window;
written by export-hf as each architecture that has one, to transformers' logits past the window,
and refused by field by the others. (Imports: the Hugging Face family tests.)"""

from __future__ import annotations

import re
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

from tfcompile.models import DecoderLM
from tfcompile.spec import parse_spec
from tfcompile.spec.errors import SpecError

MODEL = "vocab_size: 20, d_model: 16, n_layers: 3, n_heads: 2, max_seq_len: 12"


@pytest.mark.parametrize("size", [1, 3, 5])
def test_a_sliding_layer_reads_its_window_and_nothing_before(size: int) -> None:
    """One RoPE layer (scores depend on relative positions only): the logits at each position i
    are the windowless model's at the last position of tokens i - size + 1 .. i run alone."""
    rope = {"type": "rope", "layout": "halves"}
    windowed = randomised(DecoderLM(tiny_model(n_layers=1, positional=rope, window={"size": size})))
    plain = DecoderLM(tiny_model(n_layers=1, positional=rope)).double().eval()
    plain.load_state_dict(windowed.state_dict())
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = windowed(ids)
        for i in range(16):
            alone = plain(ids[:, max(0, i - size + 1) : i + 1])[:, -1]
            torch.testing.assert_close(logits[:, i], alone, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(logits[:, -1], plain(ids)[:, -1], atol=1e-3)  # the window mattered


def _masks(T: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal and sliding may-attend masks (1, 1, T, T), built from their definitions."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    band = torch.ones(T, T, dtype=torch.bool).triu(-(size - 1))
    return causal[None, None], (causal & band)[None, None]


def test_the_model_runs_each_listed_layer_over_the_window_and_the_cache_agrees() -> None:
    spec = tiny_model(n_layers=3, n_kv_heads=2, positional="rope", window={"size": 4, "layers": [0, 2]})
    assert spec.sliding_layers == {0, 2}
    model = randomised(DecoderLM(spec))
    ids = torch.randint(0, 50, (2, 11))
    causal, sliding = _masks(11, 4)
    with torch.no_grad():
        rotary = model.positional.rotary(torch.arange(11))
        rotary = rotary._replace(cos=rotary.cos.double(), sin=rotary.sin.double())
        x = model.embed(ids)
        for block, mask in zip(model.blocks, (sliding, causal, sliding), strict=True):
            x = block(x, mask, False, rotary)
        expected = model.lm_head(model.final_norm(x))
        torch.testing.assert_close(model(ids), expected)
        cache = model.empty_cache(2)
        steps = [model(ids[:, t : t + 1], cache=cache) for t in range(11)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)
        cache = model.empty_cache(2)  # a prompt, then one token at a time
        steps = [model(ids[:, :6], cache=cache)]
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(6, 11)]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


def test_every_layer_slides_where_the_window_lists_none() -> None:
    spec = tiny_model(n_layers=3, window={"size": 2})
    assert spec.sliding_layers == {0, 1, 2}
    assert spec.body_parameters() == tiny_model(n_layers=3).body_parameters()


def test_a_left_padded_row_reads_the_window_it_would_alone() -> None:
    model = randomised(DecoderLM(tiny_model(positional="rope", window={"size": 3})))
    ids = torch.randint(1, 50, (1, 7))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, mask)[:, 4:], model(ids))


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ("window: {size: 0}", "model.window.size", "greater than or equal to 1"),
        ("window: {size: 4, layers: [1, 1]}", "model.window.layers", "more than once"),
        ("window: {size: 4, layers: [3]}", "model.window.layers", "of the model's 3, found 3"),
        ("window: {size: 4, layers: []}", "model.window.layers", "at least 1"),
        ("window: {layers: [0]}", "model.window.size", ""),
        ("window: {size: 4, every: 2}", "model.window.every", ""),
    ],
)
def test_the_schema_refuses_what_has_no_meaning_at_its_field(fields: str, field: str, message: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{{MODEL}, {fields}}}\n")
    assert any(issue.path == field and message in issue.message for issue in error.value.issues), error.value


def test_an_encoder_decoder_has_no_window() -> None:
    """(An encoder's, bidirectional: tests/test_encoder_local.py.)"""
    with pytest.raises(SpecError) as error:
        parse_spec(f"model: {{family: encoder_decoder, {MODEL}, window: {{size: 4}}}}\ntask: seq2seq\n")
    assert any(issue.path == "model.window" for issue in error.value.issues), error.value


BUNDLES = {
    "every layer, learned positions, opset 17": f"model: {{{MODEL}, window: {{size: 3}}}}\n"
    "export: {opset: 17}\n",
    "layers 0 and 2, RoPE, grouped K/V, opset 23": f"model: {{{MODEL}, n_kv_heads: 1, positional: rope, "
    "window: {size: 5, layers: [0, 2]}}\nexport: {opset: 23}\n",
    "capped scores (the softcap's own attention)": f"model: {{{MODEL}, attention_softcap: 20, "
    "positional: rope, window: {size: 4, layers: [1]}}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity_past_the_window(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


@pytest.mark.slow
def test_a_trained_decoder_with_sliding_layers_fuses_with_parity_and_generates_as_pytorch(
    tmp_path: Path,
) -> None:
    """A window of 3 over 16 tokens generated from 4, in the first of two layers; a left-padded
    row generates what it would alone."""
    trained_decoder_generates_as_pytorch(tmp_path, ["model.window={size: 3, layers: [0]}"])


def _run(tmp_path: Path, model: str) -> Path:
    return random_run(
        tmp_path, f"model: {{vocab_size: 64, d_model: 32, n_heads: 4, max_seq_len: 24, {model}}}\n"
    )


def random_window_run(tmp_path: Path, architecture: str) -> Path:
    """A random run export-hf writes as ``architecture`` (a key of WRITTEN), with its window."""
    return _run(tmp_path, WRITTEN[architecture])


WRITTEN = {
    # every layer, no attention biases: Mistral's sliding_window
    "MistralForCausalLM": "n_layers: 2, positional: {type: rope, layout: halves}, norm: {type: rmsnorm}, "
    "activation: swiglu, bias: {qkv: false, attn_out: false, ffn: false}, window: {size: 5}",
    # the second layer only, q/k/v biases: Qwen2's layer_types
    "Qwen2ForCausalLM": "n_layers: 2, n_kv_heads: 2, positional: {type: rope, layout: halves}, "
    "norm: {type: rmsnorm}, activation: swiglu, bias: {qkv: true, attn_out: false, ffn: false}, "
    "window: {size: 5, layers: [1]}",
    # q/k norms: Qwen3's layer_types
    "Qwen3ForCausalLM": "n_layers: 2, positional: rope, norm: {type: rmsnorm}, activation: swiglu, "
    "qk_norm: true, bias: {qkv: false, attn_out: false, ffn: false}, window: {size: 4, layers: [0]}",
    # sandwich norms, scaled embeddings: Gemma 2's layer_types
    "Gemma2ForCausalLM": "n_layers: 3, positional: {type: rope, layout: halves}, "
    "norm: {type: rmsnorm, position: sandwich}, activation: geglu_tanh, scale_embeddings: true, "
    "bias: {qkv: false, attn_out: false, ffn: false}, window: {size: 3, layers: [0, 2]}",
    # learned positions, q.k unscaled: GPT-Neo's attention_layers
    "GPTNeoForCausalLM": "n_layers: 2, attention_scale: 1, bias: {qkv: false}, "
    "window: {size: 5, layers: [1]}",
    # LayerNorm blocks with grouped K/V heads: Starcoder2's sliding_window, every layer
    "Starcoder2ForCausalLM": "n_layers: 2, n_kv_heads: 2, positional: {type: rope, layout: halves}, "
    "activation: gelu_tanh, window: {size: 6}",
}


@pytest.mark.slow
@pytest.mark.parametrize("architecture", WRITTEN)
def test_export_hf_writes_the_window_that_transformers_computes_past(
    architecture: str, tmp_path: Path
) -> None:
    """A run's window written back: transformers' logits over 20 tokens, past the window, are the
    run's (rows padded and not)."""
    transformers = pytest.importorskip("transformers")
    from hf_models import max_difference

    from tfcompile.hf.exporter import export_hf
    from tfcompile.train.runs import load_trained_model

    run = random_window_run(tmp_path, architecture)
    assert export_hf(run, tmp_path / "out") == architecture
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    model = load_trained_model(run)[1]
    for padded in (False, True):
        assert max_difference(hf, model, padded, length=20) <= 1e-5, padded


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("n_layers: 1, norm: {position: post}, window: {size: 4}", "model.window"),  # OPT
        (  # Starcoder2, which slides every layer
            "n_layers: 2, n_kv_heads: 2, positional: rope, activation: gelu_tanh, "
            "window: {size: 4, layers: [1]}",
            "model.window.layers",
        ),
        (
            "n_layers: 2, positional: rope, norm: {type: rmsnorm}, activation: swiglu, "
            "bias: {qkv: true, attn_out: true, ffn: false}, window: {size: 4}",
            "model.bias.attn_out",
        ),  # Qwen2
    ],
    ids=["opt", "starcoder2", "qwen2"],
)
def test_export_hf_refuses_a_window_it_cannot_write_by_field(model: str, field: str, tmp_path: Path) -> None:
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    with pytest.raises(HFError, match=rf"\n  {re.escape(field)}: "):
        export_hf(_run(tmp_path, model), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_sliding_layer_counts_the_attention_flops_of_its_window() -> None:
    """PaLM's accounting: 4 * context * heads * head_dim per layer and token, a window's keys where
    it is shorter than the context (two layers of 16 positions, one over a window of 4)."""
    from tfcompile.summary import forward_flops_per_token

    plain, windowed = tiny_model(), tiny_model(window={"size": 4, "layers": [1]})
    per_key = 4 * 4 * 8  # 4 FLOPs per key, head and dimension: 4 heads of 8
    assert (
        forward_flops_per_token(DecoderLM(plain), plain)
        == forward_flops_per_token(DecoderLM(windowed), windowed) + (16 - 4) * per_key
    )
    assert forward_flops_per_token(DecoderLM(windowed), windowed, context=3) == forward_flops_per_token(
        DecoderLM(plain), plain, context=3
    )


def test_the_summary_notes_each_sliding_layer() -> None:
    from tfcompile.spec import Spec
    from tfcompile.summary import summarize

    spec = Spec.model_validate(
        {"model": tiny_model(n_layers=3, window={"size": 5, "layers": [0, 2]}).model_dump()}
    )
    notes = {row.name: row.note for row in summarize(spec).rows if row.name.endswith(".attn")}
    assert notes == {
        "blocks.0.attn": "slides over 5 positions",
        "blocks.1.attn": "",
        "blocks.2.attn": "slides over 5 positions",
    }
