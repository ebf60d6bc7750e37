"""Inference latency: onnxruntime against PyTorch eager on the same machine, in one run.

Exports the spec's model (random weights: speed does not depend on them) to a temporary bundle,
then times a full forward pass at batch 1 and 8 and the generation of 128 tokens with the KV
cache, each side with its own cache. Prints a table and writes it to benchmarks/results/.

    python benchmarks/runtime_latency.py                  # specs/shakespeare-char.yaml
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from common import device_name

from tfcompile.export import Source, export_bundle
from tfcompile.models import DecoderLM
from tfcompile.runtime import load
from tfcompile.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def median_ms(fns: Sequence[Callable[[], object]], repeats: int, rounds: int = 4) -> list[float]:
    """The median time of each function over ``repeats`` runs, taken in ``rounds`` turns so that a
    change in the machine's load falls on all of them alike. Each turn starts with an untimed run:
    the other library's threads may still be spinning from its last call."""
    times: list[list[float]] = [[] for _ in fns]
    for turn in range(rounds):
        for fn, fn_times in zip(fns, times, strict=True):
            fn()
            for _ in range(repeats // rounds + (turn < repeats % rounds)):
                start = time.perf_counter()
                fn()
                fn_times.append(time.perf_counter() - start)
    return [1000 * statistics.median(t) for t in times]


@torch.no_grad()
def torch_generate(model: DecoderLM, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    cache = model.empty_cache(ids.shape[0], ids.device)
    logits = model(ids, cache=cache)
    for _ in range(new_tokens):
        next_ids = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_ids], dim=1)
        logits = model(next_ids, cache=cache)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default=str(ROOT / "specs" / "shakespeare-char.yaml"))
    parser.add_argument("--seq", type=int, default=None, help="forward-pass length (default: the context)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    spec = load_spec(args.spec)
    seq = args.seq or spec.model.max_seq_len
    prompt_len = 8
    if prompt_len + args.new_tokens > spec.model.max_seq_len:
        raise SystemExit("prompt + new tokens exceed the model's context")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        export_bundle(spec, Source(seed=0), bundle)
        runtime = load(bundle, providers=["CPUExecutionProvider"])
        torch.manual_seed(0)
        model = DecoderLM(spec.model).eval()

        rows = []
        rng = np.random.default_rng(0)
        assert spec.model.vocab_size is not None
        for batch in (1, 8):
            ids = rng.integers(0, spec.model.vocab_size, size=(batch, seq))
            ids_t = torch.from_numpy(ids)
            with torch.no_grad():
                t_torch, t_ort = median_ms(
                    [lambda ids_t=ids_t: model(ids_t), lambda ids=ids: runtime.logits(ids)], args.repeats
                )
            rows.append((f"forward, batch {batch} x {seq} tokens", t_torch, t_ort, "ms"))
        prompt = rng.integers(0, spec.model.vocab_size, size=(1, prompt_len))
        prompt_t = torch.from_numpy(prompt)
        ours = runtime.generate(prompt, args.new_tokens, temperature=0)
        assert np.array_equal(ours, torch_generate(model, prompt_t, args.new_tokens).numpy())
        repeats = max(args.repeats // 3, 3)
        t_torch, t_ort = median_ms(
            [
                lambda: torch_generate(model, prompt_t, args.new_tokens),
                lambda: runtime.generate(prompt, args.new_tokens, temperature=0),
            ],
            repeats,
        )
        rows.append((f"generate {args.new_tokens} tokens, KV cache, batch 1", t_torch, t_ort, "ms"))

    lines = [
        f"device: {device_name(torch.device('cpu'))}; torch {torch.__version__} eager; "
        f"onnxruntime {ort.__version__} CPUExecutionProvider; {Path(args.spec).stem}, "
        f"median of {args.repeats} runs, taken in turns",
        "",
        "| workload | PyTorch eager | onnxruntime | speed-up |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, t_torch, t_ort, unit in rows:
        lines.append(f"| {name} | {t_torch:,.1f} {unit} | {t_ort:,.1f} {unit} | {t_torch / t_ort:.2f}x |")
    gen_torch, gen_ort = rows[-1][1], rows[-1][2]
    lines.append(
        f"| generation tokens/s | {1000 * args.new_tokens / gen_torch:,.0f} | "
        f"{1000 * args.new_tokens / gen_ort:,.0f} | |"
    )
    table = "\n".join(lines)
    print(table)
    out = ROOT / "benchmarks" / "results" / f"runtime_latency-{Path(args.spec).stem}-cpu.md"
    out.write_text(table + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
