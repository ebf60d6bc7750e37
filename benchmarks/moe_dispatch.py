"""Training speed of a mixture of experts: each token through its chosen experts only (how
tfcompile.nn.moe computes in PyTorch) against every expert through every token, the unchosen
weighted 0 (how the ONNX exporter traces it), eager and, with --compile, under torch.compile, in
the same run, rounds alternating.

Times forward, backward and an AdamW step of specs/shakespeare-char-moe.yaml (or --spec) on random
batches; prints tokens/s and writes the table to benchmarks/results/moe_dispatch-DEVICE.md.

    python benchmarks/moe_dispatch.py                        # this CPU, eager
    python benchmarks/moe_dispatch.py --compile --batch-size 64 --precision bf16   # a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import device_name, device_slug, write_results

from tfcompile.models import DecoderLM
from tfcompile.nn.moe import MoE, balance_loss
from tfcompile.spec import DecoderSpec, load_spec
from tfcompile.tasks.causal_lm import training_loss

ROOT = Path(__file__).resolve().parents[1]


class EveryExpert(MoE):
    """An MoE layer computing in PyTorch as the ONNX exporter traces it."""

    @property
    def dispatch(self) -> bool:
        return False


def every_expert(model: torch.nn.Module) -> torch.nn.Module:
    for layer in model.modules():
        if isinstance(layer, MoE):
            layer.__class__ = EveryExpert
    return model


def make_step(model: torch.nn.Module, runnable: Callable, ids: torch.Tensor, precision: str) -> Callable:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast(ids.device.type, torch.bfloat16, enabled=precision == "bf16")

    def step() -> None:
        with autocast:
            loss = training_loss(runnable, ids, ids.roll(-1, dims=1), None)
            balance = balance_loss(model)
        (loss if balance is None else loss + balance).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default=str(ROOT / "specs" / "shakespeare-char-moe.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="spec overrides")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time both under torch.compile")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    spec = load_spec(args.spec, args.set).model
    assert isinstance(spec, DecoderSpec) and spec.vocab_size is not None and spec.moe is not None
    T = spec.max_seq_len
    ids = torch.randint(0, spec.vocab_size, (args.batch_size, T), device=device)
    rows = {"dispatch, eager": (True, False), "every expert, eager": (False, False)}
    if args.compile:
        rows |= {"dispatch, torch.compile": (True, True), "every expert, torch.compile": (False, True)}
    steps = {}
    for row, (dispatch, compiled) in rows.items():
        torch.manual_seed(0)
        model = DecoderLM(spec).to(device).train()
        model = model if dispatch else every_expert(model)
        steps[row] = make_step(model, torch.compile(model) if compiled else model, ids, args.precision)

    def timed(row: str, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            steps[row]()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for row in steps:  # warm-up: allocator, kernels, compilation
        timed(row, 2)
    rates: dict[str, list[float]] = {row: [] for row in steps}
    for _ in range(args.rounds):
        for row in steps:
            rates[row].append(args.steps * args.batch_size * T / timed(row, args.steps))

    moe = spec.moe
    lines = [
        f"{' '.join([Path(args.spec).name, *args.set])}: {moe.experts} experts, {moe.top_k} per token, batch "
        f"{args.batch_size} x {T} tokens, {args.precision}, forward + backward + AdamW step; median of "
        f"{args.rounds} rounds of {args.steps} steps, rounds alternating",
        "",
        "| MoE layers | tokens/s | vs every expert, eager |",
        "| --- | ---: | ---: |",
    ]
    dense = statistics.median(rates["every expert, eager"])
    for row, values in rates.items():
        rate = statistics.median(values)
        lines.append(f"| {row} | {rate:,.0f} | {rate / dense:.2f}x |")
    name = device_name(device)
    write_results(f"moe_dispatch-{device_slug(name)}", "\n".join(lines), name)


if __name__ == "__main__":
    main()
