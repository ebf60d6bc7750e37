"""Train a spec as committed and record what it reached and what it cost: the wall time, the
process's CPU time, the machine's load while it ran (on a shared machine the wall time is the
load's as much as the spec's), the best validation metric, the test metrics, and for a text
decoder a sample. With --seeds, the same spec is then trained again with each of those seeds
(side by side, their wall time not measured) and their final metrics tabled beside the spec's
own, so that the figure reads with its spread. Writes benchmarks/results/train_run-SPEC-DEVICE.md.

    python benchmarks/train_run.py specs/quickstart.yaml
    python benchmarks/train_run.py specs/vit-digits.yaml --seeds 1,2,3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from common import device_name, write_results

from tfcompile.spec import load_spec
from tfcompile.train import Trainer
from tfcompile.train.metrics import read_metrics


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--seeds", default="", help="more train.seed values to train, comma-separated")
    parser.add_argument("--tag", default="", help="added to the results file's name (runs with --set)")
    args = parser.parse_args()
    name = Path(args.spec).stem
    with tempfile.TemporaryDirectory() as runs:
        spec = load_spec(args.spec, [*args.set, f"train.runs_dir={runs}"])
        load_before = os.getloadavg()[0]
        cpu_before, start = _cpu_seconds(), time.perf_counter()
        trainer = Trainer(spec, Path(runs) / name)
        result = trainer.train()
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_before
        load_after = os.getloadavg()[0]
        sample = _sample(trainer) if spec.task.type == "causal_lm" else None
        evaluations = [r for r in read_metrics(trainer.run_dir) if "val_loss" in r]
    device = device_name(trainer.device)
    metric = result.best_metric.removeprefix("val_").replace("_", " ")
    rows = [
        ("steps", f"{result.step:,}"),
        ("wall time (the whole `Trainer.train()`)", f"{wall:.0f} s"),
        ("CPU time of the process (all threads)", f"{cpu:.0f} s"),
        ("load average at the start and the end", f"{load_before:.1f}, {load_after:.1f}"),
        (f"best validation {metric}", f"{result.best:.4f}" if result.best is not None else "-"),
        *((k.replace("_", " "), f"{v:.4f}") for k, v in result.metrics.items() if k.startswith("test_")),
    ]
    table = "\n".join(["| measure | value |", "| --- | ---: |", *(f"| {k} | {v} |" for k, v in rows)])
    if evaluations:
        table += "\n\n" + "\n".join(
            [
                "| step | " + " | ".join(f"{r['step']:,}" for r in evaluations) + " |",
                "| --- | " + " | ".join("---:" for _ in evaluations) + " |",
                "| validation loss | " + " | ".join(f"{r['val_loss']:.4f}" for r in evaluations) + " |",
            ]
        )
    if sample is not None:
        table += "\n\nSample (`ROMEO:`, temperature 0.8, top-k 40, seed 1, 200 characters):\n\n"
        table += "\n".join("    " + line for line in sample.splitlines())
    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    if seeds:
        table += "\n\n" + _seed_table(args.spec, args.set, spec.train.seed, result.metrics, seeds)
    tag = f"-{args.tag}" if args.tag else ""
    write_results(f"train_run-{name}{tag}-{'cpu' if trainer.device.type == 'cpu' else 'gpu'}", table, device)


def _seed_table(
    path: str, overrides: list[str], seed: int, metrics: dict[str, float], seeds: list[int]
) -> str:
    """The final metrics of the spec's seed and of each other seed, one row each."""
    workers = min(len(seeds), os.cpu_count() or 1)  # fresh processes: forking torch's threads can hang
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        others = list(pool.map(_final_metrics, [path] * len(seeds), [overrides] * len(seeds), seeds))
    names = [k for k in metrics if k.startswith("test_")] or [k for k in metrics if k.startswith("val_")]
    rows = [(f"{seed} (the spec's)", metrics), *((str(s), m) for s, m in zip(seeds, others, strict=True))]
    lines = [
        "| train.seed | " + " | ".join(n.replace("_", " ") for n in names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
        *(f"| {s} | " + " | ".join(f"{m[n]:.4f}" for n in names) + " |" for s, m in rows),
    ]
    return "\n".join(lines)


def _final_metrics(path: str, overrides: list[str], seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as runs:
        spec = load_spec(path, [*overrides, f"train.seed={seed}", f"train.runs_dir={runs}"])
        return Trainer(spec, Path(runs) / "run", show_progress=False).train().metrics


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sample(trainer: Trainer) -> str:
    from tfcompile.data import encode, load_tokenizer
    from tfcompile.files import TOKENIZER_FILE
    from tfcompile.models import DecoderLM
    from tfcompile.tasks.causal_lm import generate

    assert isinstance(trainer.model, DecoderLM)
    tokenizer = load_tokenizer(trainer.run_dir / TOKENIZER_FILE)
    prompt = torch.from_numpy(encode(tokenizer, "ROMEO:"))[None].to(trainer.device)
    ids = generate(trainer.model, prompt, 200, temperature=0.8, top_k=40, top_p=None, seed=1)
    return str(tokenizer.decode(ids[0].tolist()))


if __name__ == "__main__":
    main()
