"""GPU inference: onnxruntime-gpu against PyTorch CUDA, in one run.

Exports the spec's model (random weights: speed does not depend on them) to an fp32 and an fp16
bundle, serves both with the CUDA execution provider (the KV cache stays on the GPU between
steps through I/O binding), and times, against PyTorch CUDA eager and torch.compile, a forward
pass and greedy generation of 256 tokens with the cache, at batch 1 and 16. Also measures parity
on the GPU: each bundle's logits against PyTorch fp32 (TF32 off on both sides), and whether
greedy generation gives PyTorch's tokens. Prints a table and writes it to benchmarks/results/.

    python benchmarks/runtime_gpu.py                      # specs/shakespeare-char.yaml, context 512
    python benchmarks/runtime_gpu.py --spec specs/gpt2.yaml --context 1024
    python benchmarks/runtime_gpu.py --run runs/NAME      # a trained run: greedy tokens mean something

With random weights the logits are nearly flat, so greedy decoding meets near-ties that any
rounding breaks; token agreement is meaningful with a trained run.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from common import device_name, device_slug
from runtime_latency import median_ms, torch_generate

from tfcompile.export import Source, export_bundle
from tfcompile.models import DecoderLM
from tfcompile.runtime import LanguageModel, load
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
    with tempfile.TemporaryDirectory() as tmp:
        bundles: dict[str, LanguageModel] = {}
        for precision in ("fp32", "fp16"):
            out = Path(tmp) / precision
            export_bundle(None if args.run else spec, source, out, precision=precision)
            served = load(out, providers=PROVIDERS)
            assert isinstance(served, LanguageModel) and served.providers[0] == "CUDAExecutionProvider"
            bundles[precision] = served

        ids = rng.integers(0, vocab, size=(4, args.seq))
        with torch.no_grad():
            reference = model(torch.from_numpy(ids).to(device)).float().cpu().numpy()
        scale = float(np.abs(reference).max())
        parity = {p: float(np.abs(b.logits(ids) - reference).max()) for p, b in bundles.items()}
        prompt = rng.integers(0, vocab, size=(1, prompt_len))
        with torch.no_grad():
            torch_tokens = torch_generate(model, torch.from_numpy(prompt).to(device), args.new_tokens).cpu()
        same = {
            p: agreeing(b.generate(prompt, args.new_tokens, temperature=0), torch_tokens.numpy(), prompt_len)
            for p, b in bundles.items()
        }

        try:  # dynamo may not trace the cache's in-place growth on every torch version
            with torch.no_grad():
                torch_generate(compiled_dynamic, torch.from_numpy(prompt).to(device), 4)
            compiled_generates = True
        except Exception as error:  # reported in the table, not fatal to the other columns
            print(f"torch.compile generation failed: {type(error).__name__}: {error}"[:500])
            compiled_generates = False
        generator = compiled_dynamic if compiled_generates else model

        rows = []
        for batch in (1, 16):
            x = rng.integers(0, vocab, size=(batch, args.seq))
            xt = torch.from_numpy(x).to(device)
            with torch.no_grad():
                times = median_ms(
                    [
                        synced(lambda xt=xt: model(xt)),
                        synced(lambda xt=xt: compiled(xt)),
                        lambda x=x: bundles["fp32"].logits(x),
                        lambda x=x: bundles["fp16"].logits(x),
                    ],
                    args.repeats,
                )
            rows.append((f"forward, batch {batch} x {args.seq}", times, None))
        for batch in (1, 16):
            p = rng.integers(0, vocab, size=(batch, prompt_len))
            pt = torch.from_numpy(p).to(device)
            n = args.new_tokens
            with torch.no_grad():
                times = median_ms(
                    [
                        synced(lambda pt=pt, n=n: torch_generate(model, pt, n)),
                        synced(lambda pt=pt, n=n: torch_generate(generator, pt, n)),
                        lambda p=p, n=n: bundles["fp32"].generate(p, n, temperature=0),
                        lambda p=p, n=n: bundles["fp16"].generate(p, n, temperature=0),
                    ],
                    max(args.repeats // 2, 2),
                )
            if not compiled_generates:
                times[1] = float("nan")
            rows.append((f"generate {n} tokens, KV cache, batch {batch}", times, batch * n))

    columns = ["PyTorch eager", "torch.compile", "onnxruntime fp32", "onnxruntime fp16"]
    lines = [
        f"device: {device_name(device)}; torch {torch.__version__}; onnxruntime {ort.__version__} "
        f"CUDAExecutionProvider (I/O binding for the cache); {name} at context "
        f"{spec.model.max_seq_len}, {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{'trained weights' if args.run else 'random weights'}; "
        "PyTorch in fp32 (TF32 off); medians, taken in turns",
        "",
        f"| workload | {' | '.join(columns)} | fp16 vs eager |",
        f"| --- | {' | '.join('---:' for _ in columns)} | ---: |",
    ]
    for workload, times, tokens in rows:
        cells = [
            "failed" if t != t else f"{t:,.2f} ms" + (f" ({1000 * tokens / t:,.0f} tok/s)" if tokens else "")
            for t in times
        ]
        lines.append(f"| {workload} | {' | '.join(cells)} | {times[0] / times[3]:.2f}x |")
    lines += [
        "",
        f"Parity on the GPU, logits of 4 x {args.seq} tokens against PyTorch fp32 (max |logit| {scale:.2f}): "
        f"fp32 bundle max |diff| {parity['fp32']:.2e}; fp16 bundle max |diff| {parity['fp16']:.2e} "
        f"({parity['fp16'] / scale:.2e} of the scale). Greedy generation of {args.new_tokens} tokens: "
        f"the fp32 bundle gives PyTorch's first {same['fp32']} of {args.new_tokens} tokens, the fp16 "
        f"bundle its first {same['fp16']}.",
    ]
    table = "\n".join(lines)
    print(table)
    slug = device_slug(device_name(device))
    out = ROOT / "benchmarks" / "results" / f"runtime_gpu-{name}-{slug[:40]}.md"
    out.write_text(table + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
