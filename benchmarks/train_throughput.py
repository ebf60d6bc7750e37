"""Training throughput of the spec-built model against a hand-written nanoGPT-style baseline.

Both models have the same size (checked), read the same batches, and take AdamW steps with the
same settings (precision, torch.compile, fused AdamW on CUDA); rounds alternate between them so
that machine noise hits both alike. Prints tokens/s and model FLOPs utilisation (MFU, where the
device's peak is known) and writes the table to benchmarks/results/ with the device name.

    python benchmarks/train_throughput.py                       # shakespeare-char, CPU-sized batch
    python benchmarks/train_throughput.py --batch-size 64 --compile --precision bf16   # a GPU
    python benchmarks/train_throughput.py --spec specs/gpt2.yaml --batch-size 16 --compile --precision bf16
    # one tfcompile row per value of a spec field, then a profile of the first row's step
    python benchmarks/train_throughput.py --compare train.loss_chunk_tokens=null,4096 --profile 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from common import device_name, device_slug, write_results
from torch import nn

from tfcompile.models import DecoderLM
from tfcompile.spec import DecoderSpec, Spec, load_spec
from tfcompile.summary import forward_flops_per_token
from tfcompile.tasks.causal_lm import training_loss
from tfcompile.train.speed import peak_flops

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------- the baseline: nanoGPT's model.py, written out


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float, qkv_bias: bool) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=qkv_bias)
        self.c_proj = nn.Linear(d, d)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float, qkv_bias: bool, activation: nn.Module) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_heads, dropout, qkv_bias)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), activation, nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class BaselineGPT(nn.Module):
    def __init__(self, spec: DecoderSpec, activation: nn.Module) -> None:
        super().__init__()
        assert spec.vocab_size is not None
        d, dropout = spec.d_model, spec.dropout.residual
        self.wte, self.wpe = nn.Embedding(spec.vocab_size, d), nn.Embedding(spec.max_seq_len, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *[Block(d, spec.n_heads, dropout, spec.bias.qkv, activation) for _ in range(spec.n_layers)]
        )
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, spec.vocab_size, bias=spec.bias.lm_head)
        if spec.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        return self.lm_head(self.ln_f(self.blocks(x)))


BASELINE = "nanoGPT-style baseline"
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


def baseline_for(spec: DecoderSpec) -> BaselineGPT:
    """The baseline covers the Mini-GPT/GPT-2 family: pre-norm LayerNorm, learned positions, 4d MLP."""
    supported = (
        spec.norm.position == "pre"
        and spec.norm.type == "layernorm"
        and spec.positional.type == "learned"
        and spec.activation in ACTIVATIONS
        and spec.n_kv_heads == spec.n_heads
        and spec.d_ff == 4 * spec.d_model
    )
    if not supported:
        raise SystemExit(
            "the baseline is GPT-2's architecture: use specs/shakespeare-char.yaml or specs/gpt2.yaml"
        )
    return BaselineGPT(spec, ACTIVATIONS[spec.activation]())


# ------------------------------------------------------------------------------ measuring

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def logits_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """nanoGPT's loss: every position's logits, then cross-entropy over them (upcast by autocast)."""
    return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())


def trainer_loss(spec: Spec) -> Loss:
    """The loss as tfcompile's trainer takes it for ``spec`` (chunked when train.loss_chunk_tokens)."""
    return lambda model, x, y: training_loss(model, x, y, spec.train.loss_chunk_tokens)


def make_step(
    model: nn.Module, loss_of: Loss, batches: list[tuple[torch.Tensor, torch.Tensor]], precision: str
) -> Callable[[int], None]:
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with autocast:
            loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def variants(spec_path: str, overrides: list[str], compare: str | None) -> dict[str, Spec]:
    """One spec per value of ``compare`` (FIELD=V1,V2,...), named by it; else the spec alone."""
    if compare is None:
        return {"tfcompile": load_spec(spec_path, overrides)}
    field, _, values = compare.partition("=")
    return {
        f"tfcompile, {field.rsplit('.', 1)[-1]}={v}": load_spec(spec_path, [*overrides, f"{field}={v}"])
        for v in values.split(",")
    }


def profile_table(step: Callable[[int], None], device: torch.device, steps: int, rows: int = 15) -> str:
    """The operators that take the most device time (CPU time on the CPU) over ``steps`` steps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            step(i)
        sync(device)
    on_device = device.type == "cuda"
    key = "self_device_time_total" if on_device else "self_cpu_time_total"
    # On the GPU the kernels alone: an operator's row would count its kernels' time again.
    kernels = [e for e in prof.key_averages() if not on_device or e.device_type == DeviceType.CUDA]
    events = [e for e in kernels if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events)
    lines = [
        f"| {'kernel' if on_device else 'operator'} | calls per step | ms per step | share |",
        "| --- | ---: | ---: | ---: |",
    ]
    for e in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:rows]:
        name = e.key if len(e.key) <= 90 else e.key[:87] + "..."
        us = getattr(e, key)
        share = f"{us / steps / 1e3:.2f} | {us / total:.1%}"
        lines.append(f"| `{name.replace('|', '/')}` | {e.count / steps:g} | {share} |")
    lines.append(f"| all | | {total / steps / 1e3:.2f} | 100% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default=str(ROOT / "specs" / "shakespeare-char.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="spec overrides")
    parser.add_argument(
        "--compare", metavar="FIELD=V1,V2", help="one tfcompile row per value of a spec field"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="then profile the first tfcompile row"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":  # as the trainer does
        torch.backends.cuda.matmul.allow_tf32 = True
    specs = variants(args.spec, args.set, args.compare)
    spec = next(iter(specs.values())).model
    assert isinstance(spec, DecoderSpec) and spec.vocab_size is not None
    torch.manual_seed(0)
    models: dict[str, tuple[nn.Module, Loss]] = {
        name: (DecoderLM(s.model).to(device), trainer_loss(s))  # type: ignore[arg-type]
        for name, s in specs.items()
    }
    models[BASELINE] = (baseline_for(spec).to(device), logits_loss)
    # The baseline's table has vocab_size rows; a tfcompile table padded past it is left out.
    counts = {name: sum(p.numel() for p in m.parameters()) - padding(m) for name, (m, _) in models.items()}
    assert len(set(counts.values())) == 1, f"the models differ in size: {counts}"

    T = spec.max_seq_len
    batches = [
        (
            torch.randint(0, spec.vocab_size, (args.batch_size, T), device=device),
            torch.randint(0, spec.vocab_size, (args.batch_size, T), device=device),
        )
        for _ in range(4)
    ]
    steps = {}
    for name, (model, loss_of) in models.items():
        model.train()
        runnable = torch.compile(model) if args.compile else model
        steps[name] = make_step(runnable, loss_of, batches, args.precision)
        for i in range(2):  # warm-up: allocator, kernels, compilation
            steps[name](i)
    sync(device)

    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for i in range(args.steps):
                step(i)
            sync(device)
            rates[name].append(args.steps * args.batch_size * T / (time.perf_counter() - start))
    peak_memory = (
        f"; peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
        if device.type == "cuda"
        else ""
    )

    baseline = statistics.median(rates[BASELINE])
    mode = "torch.compile" if args.compile else "eager"
    # Model FLOPs: the baseline's, whose head has no padded rows; the same work for every row.
    train_flops = 3 * forward_flops_per_token(models[BASELINE][0], spec, T)
    peak = peak_flops(device, args.precision)
    setting = (
        f"{device_name(device)}; torch {torch.__version__}; {mode}; {args.precision}; "
        f"batch {args.batch_size} x {T} tokens; {counts[BASELINE]:,} parameters"
    )
    lines = [
        f"{setting}; median of {args.rounds} rounds of {args.steps} AdamW steps, rows in turns; "
        f"{train_flops / 1e9:.3f} GFLOPs per token (6N + attention)"
        + (f"; MFU against {peak / 1e12:.0f} TFLOP/s peak" if peak else "")
        + peak_memory,
        "",
        "| model | tokens/s | MFU | vs baseline |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, r in rates.items():
        median = statistics.median(r)
        mfu = f"{median * train_flops / peak:.1%}" if peak else "-"
        lines.append(f"| {name} | {median:,.0f} | {mfu} | {median / baseline:.3f}x |")
    slug = device_slug(device_name(device))
    suffix = (
        f"{mode.replace('.', '')}-{args.precision}" if args.precision != "fp32" else mode.replace(".", "")
    )
    name = f"{Path(args.spec).stem}-b{args.batch_size}-{suffix}-{slug[:40]}"
    write_results(f"train_throughput-{name}", "\n".join(lines), device_name(device))
    if args.profile:
        table = profile_table(steps[next(iter(models))], device, args.profile)
        heading = f"{next(iter(models))}, {setting}; {args.profile} steps under torch.profiler, busiest first"
        write_results(f"train_profile-{name}", heading + "\n\n" + table, device_name(device))


def padding(model: nn.Module) -> int:
    """The weights of embedding rows past the vocabulary (tfcompile's train.vocab_multiple_of)."""
    if not isinstance(model, DecoderLM) or not model.padded:
        return 0
    extra = model.spec.vocab_rows - model.vocab_size
    tied = model.lm_head.weight is model.embed.weight
    head = 0 if tied else extra * model.spec.d_model + (extra if model.lm_head.bias is not None else 0)
    return extra * model.spec.d_model + head


if __name__ == "__main__":
    main()
