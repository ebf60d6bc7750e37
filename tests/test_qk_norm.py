"""``model.qk_norm``: each head's queries and keys normalised over head_dim before RoPE (Qwen3,
Gemma 3), with the norm section's type, eps and bias. Held to its formula in self- and
cross-attention, counted by the spec in every family, trained, exported with parity (step graphs
too), generated with the KV cache in onnxruntime as PyTorch does, fused or left alone by
``tfcompile optimize`` with parity, and written by export-hf as Qwen3 (or refused by field)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ONE_STEP, ROOT, SHARED_DATA, TINY, assert_exports_with_parity, random_run, tiny_model

from tfcompile.export import Source, export_bundle
from tfcompile.models import DecoderLM
from tfcompile.nn.attention import CrossAttention
from tfcompile.nn.block import build_attention
from tfcompile.optimize import Plan, optimize_bundle
from tfcompile.runtime import load
from tfcompile.spec import Spec, load_spec
from tfcompile.tasks import build_model
from tfcompile.tasks.causal_lm import generate
from tfcompile.train import Trainer
from tfcompile.train.runs import load_trained_model


def _norm(x: torch.Tensor, module: torch.nn.Module, kind: str, eps: float) -> torch.Tensor:
    """The norm's formula over the last axis, from its weight (and bias) alone."""
    if kind == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    y = x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * module.weight
    return y if module.bias is None else y + module.bias


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """softmax(scale q.k) v, each K/V head serving n_heads / n_kv_heads consecutive query heads."""
    repeats = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeats, 1), v.repeat_interleave(repeats, 1)
    scores = scale * q @ k.transpose(-1, -2)  # (B, H, T, S)
    if causal:
        T = q.shape[2]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1) @ v  # (B, H, T, hd)


def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    """float64, eval, every weight random: norm scales and biases too, so that their places show."""
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize(
    "norm", [{"type": "rmsnorm", "eps": 0.1}, {"type": "layernorm", "eps": 1e-5}], ids=lambda n: n["type"]
)
def test_self_attention_normalises_each_heads_q_and_k_before_rope(norm: dict[str, Any]) -> None:
    """A decoder layer's attention against the formula: q_h = norm_q(x W_q)_h, k_h = norm_k(x W_k)_h
    (one scale of head_dim for every head), then RoPE; with the KV cache, the same one token at a
    time."""
    spec = tiny_model(qk_norm=True, norm=norm, positional={"type": "rope", "layout": "halves"}, n_kv_heads=2)
    model = _randomised(DecoderLM(spec))
    attn, hd = model.blocks[0].attn, spec.head_dim
    assert spec.n_kv_heads is not None and hd is not None and spec.attention_scale is not None
    x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split(
        [spec.n_heads * hd, spec.n_kv_heads * hd, spec.n_kv_heads * hd], -1
    )
    q, k, v = (t.reshape(2, 6, -1, hd).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
    q, k = _norm(q, attn.q_norm, norm["type"], norm["eps"]), _norm(k, attn.k_norm, norm["type"], norm["eps"])
    angles = torch.arange(6)[:, None] * spec.positional.theta ** (-torch.arange(0, hd, 2) / hd)  # (T, hd/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rope(t: torch.Tensor) -> torch.Tensor:  # transformers' rotate_half
        return t * cos + torch.cat([-t[..., hd // 2 :], t[..., : hd // 2]], -1) * sin

    y = _attend(rope(q), rope(k), v, spec.attention_scale, causal=True)
    expected = F.linear(y.transpose(1, 2).reshape(2, 6, -1), attn.out.weight, attn.out.bias)
    rotary = model.positional.rotary(torch.arange(6))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, is_causal=True, rotary=rotary), expected)
        cache = model.empty_cache(2)[0]
        steps = [
            attn(x[:, t : t + 1], rotary=model.positional.rotary(torch.tensor([t])), cache=cache)
            for t in range(6)
        ]
        torch.testing.assert_close(torch.cat(steps, 1), expected)


def test_cross_attention_normalises_the_decoders_queries_and_the_sources_keys() -> None:
    spec = tiny_model(qk_norm=True, norm={"type": "layernorm", "eps": 0.1}, n_kv_heads=2)
    cross = _randomised(build_attention(CrossAttention, spec))
    hd, kind, eps = spec.head_dim, spec.norm.type, spec.norm.eps
    assert hd is not None and spec.attention_scale is not None
    x, memory = torch.randn(2, 5, spec.d_model).double(), torch.randn(2, 7, spec.d_model).double()
    q = F.linear(x, cross.q.weight, cross.q.bias).reshape(2, 5, -1, hd).transpose(1, 2)  # (B, H, T, hd)
    k, v = (
        t.reshape(2, 7, -1, hd).transpose(1, 2)
        for t in F.linear(memory, cross.kv.weight, cross.kv.bias).chunk(2, -1)
    )  # (B, Hkv, S, hd)
    q, k = _norm(q, cross.q_norm, kind, eps), _norm(k, cross.k_norm, kind, eps)
    y = _attend(q, k, v, spec.attention_scale, causal=False)
    expected = F.linear(y.transpose(1, 2).reshape(2, 5, -1), cross.out.weight, cross.out.bias)
    with torch.no_grad():
        torch.testing.assert_close(cross(x, cross.project_memory(memory)), expected)


FAMILIES = {
    "decoder": ({"positional": "rope", "n_kv_heads": 2}, {"type": "causal_lm"}),
    "encoder": ({"norm": {"type": "layernorm"}}, {"type": "masked_lm"}),
    "encoder_decoder": ({"norm": {"type": "rmsnorm", "bias": True}}, {"type": "seq2seq"}),
    "vit": ({"image_size": 8, "patch_size": 4}, {"type": "image_classification", "labels": ["a", "b"]}),
}


def _spec(family: str, **fields: Any) -> Spec:
    model, task = FAMILIES[family]
    base: dict[str, Any] = {"family": family, "d_model": 32, "n_layers": 2, "n_heads": 4, "head_dim": 6}
    if family != "vit":
        base |= {"vocab_size": 50, "max_seq_len": 16}
    return Spec.model_validate({"model": base | model | fields, "task": task})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_spec_counts_the_q_and_k_norms_of_every_attention(family: str) -> None:
    """Two norms of head_dim per attention (self and cross), each with the norm section's bias."""
    spec = _spec(family, qk_norm=True)
    with torch.device("meta"):
        model = build_model(spec)
    norms = {
        name: p.numel() for name, p in model.named_parameters() if ".q_norm." in name or ".k_norm." in name
    }
    attentions = {"decoder": 2, "encoder": 2, "encoder_decoder": 2 + 2 * 2, "vit": 2}[family]
    per_norm = 6 * (1 + bool(spec.model.norm.bias))
    assert sum(norms.values()) == 2 * attentions * per_norm
    assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
    assert spec.parameter_count() == _spec(family).parameter_count() + sum(norms.values())


# Random models of each kind of graph with q/k norms: the step graphs read and extend the cache of
# normalised keys; opset 23 writes RMSNorm as RMSNormalization (over head_dim too), fp16 as well.
BUNDLES = {
    "decoder, opset 17": "model: {vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8, "
    "activation: swiglu, positional: rope, norm: {type: rmsnorm}, qk_norm: true}\nexport: {opset: 17}\n",
    "decoder, opset 23, fp16": "model: {vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, "
    "n_kv_heads: 1, max_seq_len: 8, positional: {type: rope, layout: halves}, norm: {type: rmsnorm}, "
    "qk_norm: true}\nexport: {opset: 23, precision: fp16}\n",
    "cross-attention, opset 23": "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 1, "
    "n_heads: 2, max_seq_len: 8, qk_norm: true}\ntask: seq2seq\nexport: {opset: 23}\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", BUNDLES.values(), ids=BUNDLES)
def test_every_graph_exports_with_parity(text: str, tmp_path: Path) -> None:
    assert_exports_with_parity(text, tmp_path / "bundle")


# Each family's bundle, trained one step from a committed spec with q/k norms added.
TRAINED = {
    "decoder": ("shakespeare-char-llama.yaml", [*TINY, "model.n_kv_heads=1", "model.max_seq_len=32"]),
    "classifier": (
        "sst2-finetune.yaml",
        [
            *TINY,
            "model.max_seq_len=32",
            "train.init_from=null",
            "data.tokenizer.vocab_size=300",
            f"data.path={SHARED_DATA / 'sst2' / 'dev.tsv.gz'}",
            "data.val_path=null",
        ],
    ),
    "translator": (
        "multi30k-de-en.yaml",
        [
            "model.d_model=32",
            "model.n_layers=1",
            "model.n_decoder_layers=1",
            "model.n_heads=2",
            "model.max_seq_len=48",
            "data.tokenizer.vocab_size=400",
            "data.test_path=null",
            f"data.path={SHARED_DATA}/multi30k/val.{{lang}}.gz",
            f"data.val_path={SHARED_DATA}/multi30k/test_2016_flickr.{{lang}}.gz",
        ],
    ),
    "vit": ("vit-digits.yaml", TINY),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(TRAINED))
def test_a_trained_model_exports_fuses_with_parity_and_generates_as_pytorch(
    kind: str, tmp_path: Path
) -> None:
    """Trained, exported (every graph checked against the model), fused by `tfcompile optimize`
    with its attention as onnxruntime's MultiHeadAttention and parity kept; a decoder's bundles,
    source and fused, generate PyTorch's greedy tokens with the KV cache."""
    name, overrides = TRAINED[kind]
    spec = load_spec(
        ROOT / "specs" / name, [*overrides, *ONE_STEP, "model.qk_norm=true", f"train.runs_dir={tmp_path}"]
    )
    Trainer(spec, tmp_path / "run", show_progress=False).train()
    export_bundle(None, Source(run=tmp_path / "run"), tmp_path / "bundle")
    done = optimize_bundle(tmp_path / "bundle", tmp_path / "fused", Plan(fuse=True), None)
    (step,) = done.steps
    assert step.operators.get("com.microsoft::MultiHeadAttention", 0) > 0, step.operators
    assert done.parity and max(done.parity.values()) <= 1e-4
    if kind == "decoder":
        _, model = load_trained_model(tmp_path / "run")
        prompt = np.array([[5, 9, 13, 2], [7, 1, 30, 4]])
        expected = generate(model, torch.from_numpy(prompt), 12, temperature=0).numpy()
        for bundle in ("bundle", "fused"):
            np.testing.assert_array_equal(
                load(tmp_path / bundle).generate(prompt, 12, temperature=0), expected
            )


QWEN3 = (
    "family: decoder, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 16, "
    "positional: rope, norm: {type: rmsnorm}, activation: swiglu, qk_norm: true"
)


@pytest.mark.parametrize(
    "bias", ["{qkv: true, attn_out: false, ffn: false}", "{qkv: false, attn_out: false, ffn: false}"]
)
def test_export_hf_writes_qwen3_that_transformers_loads_to_the_same_outputs(
    tmp_path: Path, bias: str
) -> None:
    """Interleaved RoPE pairs become Qwen3's halves by a permutation of each head's q and k rows,
    and of the q and k norms' scales with them; Qwen3's o_proj bias is written as zeros."""
    pytest.importorskip("transformers")
    from hf_models import from_pretrained, max_difference

    from tfcompile.hf.exporter import export_hf

    run = random_run(tmp_path, f"model: {{{QWEN3}, bias: {bias}}}\n")
    assert export_hf(run, tmp_path / "out") == "Qwen3ForCausalLM"
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    for padded in (False, True):
        assert max_difference(reloaded, load_trained_model(run)[1], padded) <= 1e-5, padded


def test_export_hf_refuses_by_field_what_qwen3_cannot_express(tmp_path: Path) -> None:
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    model = QWEN3.replace("rmsnorm", "rmsnorm, bias: true") + ", bias: {ffn: true}"
    run = random_run(tmp_path, f"model: {{{model}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    for field in ("model.norm.bias: True has no Qwen3", "model.bias.ffn: True has no Qwen3"):
        assert field in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_imported_qwen3_generates_transformers_greedy_tokens_from_its_bundle(tmp_path: Path) -> None:
    """Qwen3 (q/k norms, four attention biases, heads of 16 over d_model 32, GQA) imported,
    exported with parity, then greedy decoding with the KV cache in onnxruntime against
    transformers' generate."""
    pytest.importorskip("transformers")
    from hf_models import from_pretrained, save

    from tfcompile.hf.importer import import_folder

    save("qwen3", tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "qwen3", tmp_path / "specs", tmp_path / "runs")
    export_bundle(None, Source(run=result.run_dir), tmp_path / "bundle")
    prompt = torch.tensor([[5, 9, 13, 2, 30]])
    expected = from_pretrained(tmp_path / "hf").generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12
    )
    ours = load(tmp_path / "bundle").generate(prompt.numpy(), 12, temperature=0.0, stop=False)
    assert ours[0].tolist() == expected[0].tolist()


@pytest.mark.parametrize(
    "model",
    [
        "family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, "
        "qk_norm: true",
        "family: encoder_decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16, "
        "positional: relative, norm: {type: rmsnorm}, attention_scale: 1, qk_norm: true, "
        "bias: {qkv: false, attn_out: false, ffn: false}",
    ],
    ids=["gpt2", "t5"],
)
def test_export_hf_refuses_qk_norm_where_the_architecture_has_none(tmp_path: Path, model: str) -> None:
    """GPT-2's or T5's config has no q/k norms: written without them, the folder would compute
    otherwise."""
    from tfcompile.hf.errors import HFError
    from tfcompile.hf.exporter import export_hf

    task = "task: seq2seq\n" if "encoder_decoder" in model else ""
    run = random_run(tmp_path, f"model: {{{model}}}\n{task}")
    with pytest.raises(HFError, match=r"model\.qk_norm: True has no (GPT-2|T5) equivalent"):
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()
