"""GPU inference: onnxruntime-gpu against PyTorch CUDA, in one run.

Exports the spec's model to fp32 and fp16 bundles with the fixed-shape step graph
(export.cuda_graphs), serves each with the CUDA execution provider two ways: the step graph with
the KV cache bound on the GPU (I/O binding), and after the prompt the fixed step replayed as CUDA
graphs; with --fused, a fused copy of each too (tfcompile optimize --fuse: MultiHeadAttention and
skip-norm contrib operators), the second way. Times, against PyTorch CUDA eager and torch.compile, a
forward pass and greedy generation of 256 tokens with the cache, at batch 1 and 16. Also
measures parity on the GPU: each bundle's logits against PyTorch fp32 (TF32 off on both sides),
and whether greedy generation gives PyTorch's tokens, every way. Prints a table and writes it to
benchmarks/results/.

    python benchmarks/runtime_gpu.py                      # specs/shakespeare-char.yaml, context 512
    python benchmarks/runtime_gpu.py --spec specs/gpt2.yaml --context 1024 --precisions fp16
    python benchmarks/runtime_gpu.py --run runs/NAME      # a trained run: greedy tokens mean something
    python benchmarks/runtime_gpu.py --run runs/NAME --fused   # fused copies too

With random weights the logits are nearly flat, so greedy decoding meets near-ties that any
rounding breaks; token agreement is meaningful with a trained run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from common import device_name, device_slug, write_results
from runtime_latency import median_ms, torch_generate

from tfcompile.export import Source, export_bundle
from tfcompile.models import DecoderLM
from tfcompile.optimize import Plan, optimize_bundle
from tfcompile.runtime import LanguageModel, SessionOptions, load
from tfcompile.spec import load_spec
from tfcompile.train import load_trained_model

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def synced(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` followed by a CUDA synchronisation, so that its time includes the GPU's work."""

    def run() -> object:
        result = fn()
        torch.cuda.synchronize()
        return result

    return run


START = time.perf_counter()


def progress(done: str) -> None:
    """A line as each phase ends, so that a run stopped at its time limit says where it was."""
    print(f"[{time.perf_counter() - START:6.1f} s] {done}", flush=True)


def agreeing(a: np.ndarray, b: np.ndarray, prompt_len: int) -> int:
    """How many generated tokens (1, prompt + new) ``a`` and ``b`` share before they first differ."""
    differ = np.flatnonzero(a[0, prompt_len:] != b[0, prompt_len:])
    return int(differ[0]) if len(differ) else a.shape[1] - prompt_len


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default=str(ROOT / "specs" / "shakespeare-char.yaml"))
    parser.add_argument("--run", help="a trained run to serve instead of the spec's random weights")
    parser.add_argument("--context", type=int, default=512, help="model.max_seq_len for the benchmark")
    parser.add_argument("--seq", type=int, default=256, help="forward-pass length")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--fused", action="store_true", help="also a fused copy of each bundle")
    parser.add_argument("--precisions", default="fp32,fp16", help="the bundles' precisions, comma-separated")
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available() or "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit("needs a CUDA GPU, PyTorch with CUDA and onnxruntime-gpu (tfcompile[gpu])")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity: onnxruntime runs with use_tf32=0

    if args.run:
        spec, trained = load_trained_model(Path(args.run))
        source, name = Source(run=Path(args.run)), Path(args.run).name
        assert isinstance(trained, DecoderLM)
        model = trained
    else:
        spec = load_spec(args.spec, [f"model.max_seq_len={args.context}"])
        source, name = Source(seed=0), Path(args.spec).stem
        torch.manual_seed(0)
        model = DecoderLM(spec.model).eval()
    vocab = spec.model.vocab_size
    assert vocab is not None
    prompt_len = 8
    if prompt_len + args.new_tokens > spec.model.max_seq_len:
        raise SystemExit(f"{prompt_len} prompt + {args.new_tokens} new tokens exceed the context")
    device = torch.device("cuda")
    model = model.to(device)
    compiled = torch.compile(model)
    compiled_dynamic = torch.compile(model, dynamic=True)  # the cache grows every step
    rng = np.random.default_rng(0)
    precisions = args.precisions.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        # Each bundle served two ways, the step graph throughout and the fixed step as CUDA graphs,
        # and its fused copy (--fused) the second.
        bundles: dict[str, LanguageModel] = {}
        forwards: list[str] = []  # the ways whose forward graphs differ
        for precision in precisions:
            out = Path(tmp) / precision
            export_bundle(None if args.run else spec, source, out, precision=precision, cuda_graphs=True)
            progress(f"exported the {precision} bundle")
            served_ways = [(precision, out, False), (f"{precision}, CUDA graphs", out, True)]
            forwards.append(precision)
            if args.fused:
                fused = Path(tmp) / f"{precision}-fused"
                optimize_bundle(out, fused, Plan(fuse=True), None)
                progress(f"fused the {precision} bundle")
                served_ways.append((f"{precision} fused, CUDA graphs", fused, True))
                forwards.append(f"{precision} fused, CUDA graphs")
            for way, folder, graphs in served_ways:
                served = load(folder, providers=PROVIDERS, options=SessionOptions(fixed_step=graphs))
                assert isinstance(served, LanguageModel) and served.providers[0] == "CUDAExecutionProvider"
                assert served.fixed == graphs
                bundles[way] = served
        ways = list(bundles)

        ids = rng.integers(0, vocab, size=(4, args.seq))
        with torch.no_grad():
            reference = model(torch.from_numpy(ids).to(device)).float().cpu().numpy()
        scale = float(np.abs(reference).max())
        parity = {p: float(np.abs(bundles[p].logits(ids) - reference).max()) for p in precisions}
        prompt = rng.integers(0, vocab, size=(1, prompt_len))
        with torch.no_grad():
            torch_tokens = torch_generate(model, torch.from_numpy(prompt).to(device), args.new_tokens).cpu()
        same = {
            w: agreeing(b.generate(prompt, args.new_tokens, temperature=0), torch_tokens.numpy(), prompt_len)
            for w, b in bundles.items()
        }

        try:  # dynamo may not trace the cache's in-place growth on every torch version
            with torch.no_grad():
                torch_generate(compiled_dynamic, torch.from_numpy(prompt).to(device), 4)
            compiled_generates = True
        except Exception as error:  # reported in the table, not fatal to the other columns
            print(f"torch.compile generation failed: {type(error).__name__}: {error}"[:500])
            compiled_generates = False
        generator = compiled_dynamic if compiled_generates else model

        progress(
            "parity, greedy tokens" + ("" if compiled_generates else "; torch.compile could not generate")
        )
        rows = []
        for batch in (1, 16):
            x = rng.integers(0, vocab, size=(batch, args.seq))
            xt = torch.from_numpy(x).to(device)
            with torch.no_grad():
                times = median_ms(
                    [
                        synced(lambda xt=xt: model(xt)),
                        synced(lambda xt=xt: compiled(xt)),
                        *(lambda x=x, w=w: bundles[w].logits(x) for w in forwards),
                    ],
                    args.repeats,
                )
            forward = dict(zip(forwards, times[2:], strict=True))  # the same graphs elsewhere
            times = times[:2] + [forward.get(w, float("nan")) for w in ways]
            rows.append((f"forward, batch {batch} x {args.seq}", times, None))
            progress(rows[-1][0])
        for batch in (1, 16):
            p = rng.integers(0, vocab, size=(batch, prompt_len))
            pt = torch.from_numpy(p).to(device)
            n = args.new_tokens
            with torch.no_grad():
                times = median_ms(
                    [
                        synced(lambda pt=pt, n=n: torch_generate(model, pt, n)),
                        synced(lambda pt=pt, n=n: torch_generate(generator, pt, n)),
                        *(lambda p=p, n=n, w=w: bundles[w].generate(p, n, temperature=0) for w in ways),
                    ],
                    max(args.repeats // 2, 2),
                )
            if not compiled_generates:
                times[1] = float("nan")
            rows.append((f"generate {n} tokens, KV cache, batch {batch}", times, batch * n))
            progress(rows[-1][0])

    columns = ["PyTorch eager", "torch.compile", *(f"onnxruntime {w}" for w in ways)]
    lines = [
        f"| workload | {' | '.join(columns)} | fastest onnxruntime vs torch.compile |",
        f"| --- | {' | '.join('---:' for _ in columns)} | ---: |",
    ]
    for workload, times, tokens in rows:
        cells = [
            "-" if t != t else f"{t:,.2f} ms" + (f" ({1000 * tokens / t:,.0f} tok/s)" if tokens else "")
            for t in times
        ]
        fastest = min(t for t in times[2:] if t == t)
        lines.append(f"| {workload} | {' | '.join(cells)} | {times[1] / fastest:.2f}x |")
    agreement = "; ".join(f"{w}: the first {k} of {args.new_tokens}" for w, k in same.items())
    differences = "; ".join(
        f"{p} bundle max |diff| {d:.2e} ({d / scale:.2e} of the scale)" for p, d in parity.items()
    )
    lines += [
        "",
        f"Parity on the GPU, logits of 4 x {args.seq} tokens against PyTorch fp32 (max |logit| {scale:.2f}): "
        f"{differences}. Greedy generation of {args.new_tokens} tokens, PyTorch's tokens given: {agreement}.",
    ]
    described = (
        f"{device_name(device)}; torch {torch.__version__}; onnxruntime {ort.__version__} "
        f"CUDAExecutionProvider (I/O binding for the cache; CUDA graphs: the fixed step after the prompt); "
        f"{name} at context {spec.model.max_seq_len}, {sum(p.numel() for p in model.parameters()):,} "
        f"parameters, {'trained weights' if args.run else 'random weights'}; PyTorch in fp32 (TF32 off); "
        "medians, taken in turns"
    )
    slug = device_slug(device_name(device))
    write_results(f"runtime_gpu-{name}-{slug[:40]}", "\n".join(lines), described)


if __name__ == "__main__":
    main()
