"""The training-throughput paths, each against the plain one on the CPU: the vocabulary padded to
a multiple of 64 (never a logit, a target or an exported row), the chunked cross-entropy (equal
loss and gradients, no more than a chunk of rows through the LM head at once), and SDPA's grouped
K/V heads (equal to repeating them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, tiny_model

from tfcompile.export import Source, check_decoder_parity, export_bundle, export_decoder
from tfcompile.models import DecoderLM
from tfcompile.nn.attention import Attention, KVCache, additive_mask, may_attend
from tfcompile.runtime import LanguageModel, load
from tfcompile.spec import DecoderSpec, Spec, load_spec, parse_spec
from tfcompile.tasks.causal_lm import IGNORE_INDEX, ChunkedLoss, LanguageModelling, causal_lm_loss, generate
from tfcompile.train import Trainer

PADDED = {"vocab_multiple_of": 64}  # tiny_model's 50 tokens -> 64 rows


def _gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| (Euclidean norms): the difference as a fraction of the tensor's size."""
    return ((a - b).norm() / b.norm()).item()


# ------------------------------------------------------------------ vocabulary padding


@pytest.mark.parametrize(
    "head", [{}, {"tie_embeddings": False, "bias": {"lm_head": True}}], ids=["tied", "untied"]
)
def test_the_padded_table_is_counted_and_built(head: dict[str, Any]) -> None:
    spec = Spec.model_validate({"model": tiny_model(**PADDED, **head).model_dump()})  # a causal LM
    assert isinstance(spec.model, DecoderSpec)
    model = DecoderLM(spec.model)
    assert model.embed.weight.shape[0] == model.lm_head.weight.shape[0] == 64
    assert spec.parameter_count() == sum(p.numel() for p in model.parameters())
    gpt2 = load_spec(ROOT / "specs" / "gpt2.yaml")
    assert gpt2.model.vocab_rows == 50304 and gpt2.parameter_count() == 124_439_808 + 47 * 768


def _unpadded_twin(padded: DecoderLM) -> DecoderLM:
    """The same model without the padded rows."""
    spec = padded.spec.model_copy(update={"vocab_multiple_of": 1})
    twin = DecoderLM(spec)
    state = {
        name: t[:50] if name.startswith(("embed.", "lm_head.")) else t
        for name, t in padded.state_dict().items()
    }
    twin.load_state_dict(state)
    return twin


def test_padded_rows_are_never_a_logit_a_target_or_a_gradient() -> None:
    torch.manual_seed(0)
    model = DecoderLM(tiny_model(**PADDED, tie_embeddings=False, bias={"lm_head": True}))
    with torch.no_grad():
        model.lm_head.bias[50:] = 100.0  # the padded rows would win every prediction
    twin = _unpadded_twin(model)
    ids, targets = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    logits = model(ids)
    assert logits.shape == (3, 16, 50)
    torch.testing.assert_close(logits, twin(ids), rtol=0, atol=0)
    loss = causal_lm_loss(logits, targets)
    torch.testing.assert_close(loss, causal_lm_loss(twin(ids), targets), rtol=0, atol=0)
    grads = _gradients(model, loss)
    assert not grads["lm_head.weight"][50:].any() and not grads["lm_head.bias"][50:].any()
    assert not grads["embed.weight"][50:].any()
    prompt = torch.randint(0, 50, (2, 3))
    for draw in (dict(temperature=0), dict(temperature=1.0, seed=3)):
        assert (generate(model, prompt, 8, **draw)[:, 3:] < 50).all()


def test_the_graph_of_a_padded_model_has_vocab_size_logits(tmp_path: Path) -> None:
    """The forward graph here; the step graph in the slow run below."""
    model = DecoderLM(tiny_model(**PADDED, n_kv_heads=2))
    proto = export_decoder(model, tmp_path / "model.onnx", 18)
    assert proto.graph.output[0].type.tensor_type.shape.dim[-1].dim_value == 50
    report = check_decoder_parity(model, tmp_path / "model.onnx", tolerance=1e-5)
    assert report.passed, report.to_dict()


@pytest.mark.slow
def test_a_padded_run_exports_as_if_unpadded(tmp_path: Path) -> None:
    """Trained with the table padded (65 -> 128 rows) and the chunked loss, the bundle's graphs
    give 65 logits, the manifest says 65, and the runtime generates what PyTorch does."""
    sets = [
        "model.n_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.max_seq_len=16",
        "model.vocab_multiple_of=64",
        "train.loss_chunk_tokens=24",
        "train.steps=2",
        "train.batch_size=4",
        "train.eval_interval=2",
        "train.eval_batches=1",
        f"train.runs_dir={tmp_path}",
    ]
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml", sets)
    trainer = Trainer(spec, tmp_path / "padded", show_progress=False)
    trainer.train()
    model = trainer.model.eval()
    assert isinstance(model, DecoderLM) and model.lm_head.weight.shape[0] == 128
    export_bundle(None, Source(run=trainer.run_dir), tmp_path / "bundle")
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["model"]["vocab_size"] == 65
    for graph in manifest["graphs"].values():
        assert graph["outputs"][0]["shape"][-1] == 65
    assert all(report["passed"] for report in manifest["parity"].values())
    bundle = load(tmp_path / "bundle")
    assert isinstance(bundle, LanguageModel)
    ids = np.array([[5, 9, 13, 2]], dtype=np.int64)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(bundle.logits(ids), expected, atol=1e-5)
    greedy = generate(model, torch.from_numpy(ids), 6, temperature=0).numpy()
    np.testing.assert_array_equal(bundle.generate(ids, 6, temperature=0, stop=False), greedy)


def test_export_hf_drops_the_padded_rows(tmp_path: Path) -> None:
    """The folder is GPT-2 as transformers knows it: config vocab_size 50, a (50, d) table, and
    logits equal to the run's."""
    transformers = pytest.importorskip("transformers")
    from tfcompile.hf.exporter import export_hf
    from tfcompile.hf.importer import write_run

    spec = parse_spec(
        "model: {family: decoder, vocab_size: 50, vocab_multiple_of: 64, d_model: 16, n_layers: 1, "
        "n_heads: 2, max_seq_len: 16, activation: gelu_tanh}\n"
    )
    torch.manual_seed(0)
    assert isinstance(spec.model, DecoderSpec)
    model = DecoderLM(spec.model).eval()
    write_run(tmp_path / "run", spec, model, tmp_path, None)
    export_hf(tmp_path / "run", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == 50
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(info.values()), info
    assert hf.transformer.wte.weight.shape == (50, 16)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        assert (hf.eval()(input_ids=ids).logits - model(ids)).abs().max() < 1e-5


# ------------------------------------------------------------------ chunked cross-entropy


@pytest.mark.parametrize("chunk", [1, 7, 48, 1000])
@pytest.mark.parametrize(
    "variant", [{}, {**PADDED, "tie_embeddings": False, "bias": {"lm_head": True}}], ids=["plain", "padded"]
)
def test_the_chunked_loss_equals_the_plain_one(chunk: int, variant: dict[str, Any]) -> None:
    """Loss and every gradient within 1e-6 of their scale, with padding targets and label smoothing."""
    torch.manual_seed(0)
    model = DecoderLM(tiny_model(**variant))
    ids, targets = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    targets[1, 9:] = IGNORE_INDEX
    plain = causal_lm_loss(model(ids), targets, label_smoothing=0.1)
    expected = _gradients(model, plain)
    chunked = model(ids, loss=ChunkedLoss(targets, chunk, label_smoothing=0.1))
    grads = _gradients(model, chunked)
    assert abs(chunked.item() - plain.item()) <= 1e-6 * plain.item()
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        assert _relative(grad, expected[name]) <= 1e-6, name


def test_the_lm_head_never_sees_more_than_a_chunk() -> None:
    """Forward and the recomputation in backward both run the head a chunk of rows at a time."""
    model = DecoderLM(tiny_model(**PADDED))
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    ids, targets = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    model(ids, loss=ChunkedLoss(targets, 10)).backward()
    assert max(rows) == 10 and sum(rows) == 2 * 48  # each of the 48 tokens: forward, then backward


def test_the_task_trains_through_the_chunked_loss(tmp_path: Path) -> None:
    """train.loss_chunk_tokens reaches the task's loss, which the trainer calls."""
    spec = load_spec(ROOT / "specs" / "shakespeare-char.yaml", ["train.loss_chunk_tokens=40"])
    task = LanguageModelling(spec, tmp_path)
    torch.manual_seed(0)
    model = DecoderLM(tiny_model(vocab_size=65, max_seq_len=256)).eval()
    batch = task.batch("train", 2, torch.Generator().manual_seed(0))
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[-2]))
    loss = task.loss(model, batch)
    assert max(rows) == 40
    plain = causal_lm_loss(model(batch["input_ids"]), batch["targets"])
    assert abs(loss.item() - plain.item()) <= 1e-6 * plain.item()


# ------------------------------------------------------------------ grouped K/V heads in SDPA


def _repeated(
    attn: Attention, x: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, past: KVCache | None
) -> torch.Tensor:
    """The attention with every K/V head repeated for its query heads, as before enable_gqa."""
    H, Hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = attn.qkv(x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    q, k, v = attn._heads(q, H), attn._heads(k, Hkv), attn._heads(v, Hkv)
    if past is not None:
        k, v = torch.cat([past.key, k], dim=2), torch.cat([past.value, v], dim=2)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=additive_mask(mask, None, q.dtype), is_causal=is_causal
    )
    return attn.out(y.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


@pytest.mark.parametrize("n_kv_heads", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("case", ["causal-kernel", "no-mask", "padding-mask", "cache", "cache-and-mask"])
def test_grouped_heads_equal_repeated_heads(
    n_kv_heads: int, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    attn = Attention(32, 4, n_kv_heads, qkv_bias=True, out_bias=True, dropout=0.0).eval()
    B, T, P = 2, 5, 3 if case.startswith("cache") else 0
    x = torch.randn(B, T, 32)
    past = KVCache(torch.randn(B, n_kv_heads, P, 8), torch.randn(B, n_kv_heads, P, 8)) if P else None
    mask = None
    if case.endswith("mask"):
        padding = torch.ones(B, P + T, dtype=torch.bool)
        padding[1, :2] = False  # a left-padded row
        mask = may_attend(torch.arange(P, P + T), torch.arange(P + T), True, padding)
    is_causal = case == "causal-kernel"
    calls: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    cache = None if past is None else KVCache(past.key.clone(), past.value.clone())
    with torch.no_grad():
        got = attn(x, mask, is_causal, cache=cache)
        expected = _repeated(attn, x, mask, is_causal, past)
    assert calls[0] == (mask is None)  # grouped heads go to SDPA as they are unless there is a mask
    assert (got - expected).abs().max() <= 1e-6


def test_a_grouped_query_decoder_trains_as_with_repeated_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training path (causal kernel, no mask) with enable_gqa against the repeated form,
    which an ONNX export takes: the same loss and gradients."""
    torch.manual_seed(0)
    model = DecoderLM(tiny_model(n_kv_heads=1, positional="rope", activation="swiglu"))
    ids, targets = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    loss = causal_lm_loss(model(ids), targets)
    grads = _gradients(model, loss)
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    repeated = causal_lm_loss(model(ids), targets)
    expected = _gradients(model, repeated)
    assert abs(loss.item() - repeated.item()) <= 1e-6 * repeated.item()
    for name, grad in grads.items():
        assert _relative(grad, expected[name]) <= 1e-6, name


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_with_the_chunked_loss_take_the_plain_steps(tmp_path: Path, parallel: str) -> None:
    """The loss runs inside forward, so DDP averages its gradients and FSDP has the head's weights
    gathered: two gloo ranks with the chunked loss and a padded table end where one plain process
    does."""
    from test_distributed import SPEC, TINY, torchrun

    from tfcompile.train import load_trained_model

    sets = [*TINY, f"train.runs_dir={tmp_path}", "model.vocab_multiple_of=64"]
    chunked = [f"--set=train.parallel={parallel}", "--set=train.loss_chunk_tokens=50", "--set=train.name=two"]
    result = torchrun(2, "train", str(SPEC), *(f"--set={o}" for o in sets), *chunked)
    assert result.returncode == 0, result.stderr[-3000:]
    Trainer(load_spec(SPEC, [*sets, "train.name=one"]), tmp_path / "one", show_progress=False).train()
    _, two = load_trained_model(tmp_path / "two")
    _, one = load_trained_model(tmp_path / "one")
    # Summed in another order (two ranks, chunks), the gradients differ by rounding, which Adam's
    # division by sqrt(v) enlarges where a gradient is near zero: 3.4e-6 at most on an Intel Xeon.
    for (name, a), b in zip(two.state_dict().items(), one.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)
