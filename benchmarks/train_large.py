"""A few training steps of a model larger than one GPU's memory, as its spec sets it up (FSDP,
activation checkpointing, bf16, CPU offload), and what they cost: the set-up time, tokens/s and
MFU over the timed steps, the GPU's peak memory and the process's peak host memory. Each row runs
in a fresh process (its peaks are its own): the spec as written, then one row per --compare
override, the baselines. --gpu-memory-gib caps what PyTorch may allocate on the GPU in the spec's
row, so that a larger GPU answers for a smaller one (an 80 GB H100 holds 79.6 GiB); the baselines
have the whole GPU.

The checkpoints are not written (LLaMA 7B's weights and AdamW moments take 81 GB): the rows time
the steps. The first step (torch.compile) and the last (it evaluates) are not timed.

    python benchmarks/train_large.py specs/llama-7b.yaml --gpu-memory-gib 79.6 \\
        --compare train.cpu_offload=false
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import resource
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from common import device_name, device_slug, write_results

from tfcompile.errors import first_line
from tfcompile.spec import load_spec
from tfcompile.train import Trainer

GIB = 2**30


class StepsOnly(Trainer):
    """A Trainer that writes no checkpoints."""

    def save(self, best: bool = False) -> Path | None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="spec overrides")
    parser.add_argument(
        "--compare", action="append", default=[], metavar="FIELD=VALUE", help="a baseline row's override"
    )
    parser.add_argument("--steps", type=int, default=5, help="steps a row trains (at least 3)")
    parser.add_argument(
        "--gpu-memory-gib", type=float, help="the most PyTorch may allocate on the GPU in the spec's row"
    )
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3: the first and the last are not timed")
    rows = [("the spec", [], args.gpu_memory_gib), *((o, [o], None) for o in args.compare)]
    lines = [
        "| row | GPU memory allowed | set-up | tokens/s | MFU | step "
        "| peak GPU memory (allocated / reserved) | peak host memory |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    device = "cpu"
    for name, extra, cap in rows:
        # A fresh process a row: its peak memories are its own, and its pinned memory is freed.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            row = pool.submit(_row, args.spec, [*args.set, *extra], args.steps, cap).result()
        device = row["device"]
        allowed = f"{cap} GiB" if cap is not None else "all"
        if "error" in row:
            lines.append(f"| {name} | {allowed} | {row['error']} | | | | | |")
            continue
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        gpu = (
            f"{row['gpu_allocated'] / GIB:.1f} / {row['gpu_reserved'] / GIB:.1f} GiB"
            if row["gpu_allocated"] is not None
            else "-"
        )
        lines.append(
            f"| {name} | {allowed} | {row['setup_s']:.0f} s | {row['tokens_per_s']:,.0f} | {mfu} | "
            f"{row['step_s']:.2f} s | {gpu} | {row['host_rss'] / GIB:.1f} GiB |"
        )
    lines.append(
        f"\n{args.steps} steps a row, the median of steps 2 to {args.steps - 1} timed; parameters, "
        "tokens a step and precision as the spec says."
    )
    write_results(f"train_large-{Path(args.spec).stem}-{device_slug(device)}", "\n".join(lines), device)


def _row(path: str, overrides: list[str], steps: int, gpu_memory_gib: float | None) -> dict[str, Any]:
    """Train ``steps`` steps of the spec in this process -> set-up time, step times, peaks."""
    if gpu_memory_gib is not None and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_memory_gib * GIB / total))
    device = device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    ends: list[float] = []
    with tempfile.TemporaryDirectory() as runs:
        run = [f"train.runs_dir={runs}", f"train.steps={steps}", f"train.eval_interval={steps}"]
        start = time.perf_counter()
        try:
            spec = load_spec(path, [*overrides, *run])
            trainer = StepsOnly(spec, Path(runs) / "run", on_step=lambda *_: ends.append(time.perf_counter()))
            setup = time.perf_counter() - start
            trainer.train()
        except Exception as error:  # an out-of-memory row is a result
            return {"device": device, "error": first_line(error, 120)}
    step = statistics.median(b - a for a, b in itertools.pairwise(ends[:-1]))
    tokens = spec.train.batch_size * spec.train.grad_accum * spec.context_length
    cuda = trainer.device.type == "cuda"
    return {
        "device": device,
        "setup_s": setup,
        "step_s": step,
        "tokens_per_s": tokens / step,
        "mfu": tokens / step * trainer.train_flops_per_token / peak if (peak := trainer.peak_flops) else None,
        "gpu_allocated": torch.cuda.max_memory_allocated() if cuda else None,
        "gpu_reserved": torch.cuda.max_memory_reserved() if cuda else None,
        "host_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


if __name__ == "__main__":
    main()
