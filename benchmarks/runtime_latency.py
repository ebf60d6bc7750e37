"""Inference latency on the CPU: PyTorch eager against tfcompile's bundles (fp32, fused, int8,
int4) and onnxruntime-genai, in one run.

Three models: the shakespeare-char decoder (specs/shakespeare-char.yaml, 10.8 M parameters) and
the SST-2 classifier (specs/sst2-finetune.yaml from scratch), each trained briefly (or given as
runs) so that the quantized bundles pass their accuracy gates on real held-out data; and a
LLaMA-style decoder with grouped-query attention and a 32k vocabulary (specs/llama.yaml, context
512, random weights: tiny shakespeare cannot train a 32k vocabulary, and speed does not depend
on the weights; its int8 and int4 bundles are written ungated). Each decoder is timed on a forward
pass of batch 1 and 8 x 256 tokens and on greedy generation of 128 tokens with the cache; the
classifier on SST-2 dev sentences at batch 1 and 32. Every contender is timed in turns, in rounds,
with one onnxruntime session alive at a time (idle sessions' spinning threads slow the others).
Prints a table and writes it to benchmarks/results/.

    python benchmarks/runtime_latency.py                     # trains the two short runs first
    python benchmarks/runtime_latency.py --char-run runs/shakespeare-char --sst2-run runs/sst2
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort  # before onnxruntime_genai, which otherwise aborts the process on Linux
import torch
from common import ROOT, device_name, trained, write_results

from tfcompile.data.table import read_table
from tfcompile.export import Source, export_bundle
from tfcompile.handoffs.genai import export_genai
from tfcompile.models import DecoderLM
from tfcompile.optimize import GateData, OptimizeError, Plan, optimize_bundle
from tfcompile.runtime import load
from tfcompile.spec import load_spec
from tfcompile.train import load_trained_model

SHARED = ROOT.parent / "shared" / "data"
PLANS = {"fused": Plan(fuse=True), "int8": Plan(quantize="int8"), "int4": Plan(quantize="int4")}
SEQ, PROMPT, NEW_TOKENS = 256, 8, 128
NO_DROPOUT = "model.dropout={embedding: 0, attention: 0, residual: 0}"  # a short run learns faster


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


class Contender:
    """A way to run a workload: PyTorch eager, a bundle, or onnxruntime-genai. ``open`` loads it
    (untimed), ``close`` releases it, so that one onnxruntime session is alive at a time."""

    def __init__(self, name: str, open_: Callable[[], Any]) -> None:
        self.name, self.open_, self.loaded = name, open_, None

    def __enter__(self) -> Any:
        self.loaded = self.open_()
        return self.loaded

    def __exit__(self, *exc: object) -> None:
        self.loaded = None
        gc.collect()


def timed(
    contenders: list[Contender], workload: Callable[[Any], object], repeats: int, rounds: int = 3
) -> list[float]:
    """Median ms of ``workload(loaded)`` per contender, in ``rounds`` turns, each contender loaded
    alone in its turn."""
    times: list[list[float]] = [[] for _ in contenders]
    for _ in range(rounds):
        for contender, samples in zip(contenders, times, strict=True):
            with contender as loaded:
                workload(loaded)  # warm-up
                for _ in range(max(repeats // rounds, 1)):
                    start = time.perf_counter()
                    workload(loaded)
                    samples.append(time.perf_counter() - start)
    return [1000 * statistics.median(t) for t in times]


def bundles(
    source: Source, spec: Any, folder: Path, plans: list[str], gate: GateData | None
) -> dict[str, Path]:
    """The fp32 export and the optimizations of it named in ``plans`` (int8 and int4 gated on
    ``gate``'s held-out data when given; a bundle that fails its gate is reported and left out)."""
    out = {"fp32 bundle": folder / "fp32"}
    export_bundle(spec, source, out["fp32 bundle"])
    for name in plans:
        plan = PLANS[name]
        try:
            optimize_bundle(out["fp32 bundle"], folder / name, plan, gate if plan.quantize else None)
        except OptimizeError as e:
            print(f"{folder.name} {name}: {e}")
            continue
        out[name] = folder / name
    return out


def size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 2**20


def size_rows(model: str, folders: dict[str, Path]) -> list[str]:
    """Table rows: each bundle's size, its share of the fp32 bundle's, and its gate."""
    fp32 = size_mb(folders["fp32 bundle"])
    return [
        f"| {model} | {kind} | {size_mb(f):.1f} MiB | {size_mb(f) / fp32:.0%} | {gate_of(f)} |"
        for kind, f in folders.items()
    ]


def gate_of(folder: Path) -> str:
    """The bundle's accuracy gate as its manifest records it."""
    optimizations = load(folder).manifest.optimization or []
    quantized = any(step.kind == "quantize" for o in optimizations for step in o.steps)
    gate = next((o.gate for o in reversed(optimizations) if o.gate is not None), None)
    if gate is None:
        return "ungated (random weights)" if quantized else "-"
    return f"{gate.metric} {gate.optimized:.4f} vs {gate.source:.4f}, allowed {gate.allowed}"


def decoder_rows(
    name: str, model: DecoderLM, folders: dict[str, Path], genai: Path | None, repeats: int
) -> list[dict[str, str]]:
    vocab = model.spec.vocab_size
    rng = np.random.default_rng(0)
    contenders = [Contender("PyTorch eager", lambda: model)]
    contenders += [
        Contender(kind, lambda f=f: load(f, providers=["CPUExecutionProvider"]))
        for kind, f in folders.items()
    ]
    rows = []
    for batch in (1, 8):
        ids = rng.integers(0, vocab, size=(batch, SEQ))
        ids_t = torch.from_numpy(ids)

        def forward(loaded: Any, ids: np.ndarray = ids, ids_t: torch.Tensor = ids_t) -> object:
            if isinstance(loaded, DecoderLM):
                with torch.no_grad():
                    return loaded(ids_t)
            return loaded.logits(ids)

        times = timed(contenders, forward, repeats)
        rows.append(_row(f"{name}: forward {batch} x {SEQ}", contenders, times, "ms"))
    prompt = rng.integers(0, vocab, size=(1, PROMPT))
    prompt_t = torch.from_numpy(prompt)
    generation = list(contenders)
    if genai is not None:
        generation.append(Contender("onnxruntime-genai", lambda: _genai_model(genai)))

    def generate(loaded: Any) -> object:
        if isinstance(loaded, DecoderLM):
            return torch_generate(loaded, prompt_t, NEW_TOKENS)
        if isinstance(loaded, tuple):
            return _genai_generate(*loaded, prompt[0], NEW_TOKENS)
        return loaded.generate(prompt, NEW_TOKENS, temperature=0)

    times = timed(generation, generate, max(repeats // 3, 3))
    tokens_per_s = [1000 * NEW_TOKENS / t for t in times]
    rows.append(
        _row(
            f"{name}: generate {NEW_TOKENS} tokens, batch 1 (tokens/s)",
            generation,
            tokens_per_s,
            "tok/s",
            higher=True,
        )
    )
    return rows


def classifier_rows(
    model: torch.nn.Module, folders: dict[str, Path], texts: list[str], repeats: int
) -> list[dict[str, str]]:
    bundle = load(folders["fp32 bundle"])
    contenders = [Contender("PyTorch eager", lambda: model)]
    contenders += [
        Contender(kind, lambda f=f: load(f, providers=["CPUExecutionProvider"]))
        for kind, f in folders.items()
    ]
    rows = []
    for batch in (1, 32):
        encodings = bundle.encode(texts[:batch])
        width = max(len(e.ids) for e in encodings)
        ids = np.array([e.ids + [0] * (width - len(e.ids)) for e in encodings])
        mask = np.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings])
        types = np.array([e.type_ids + [0] * (width - len(e.ids)) for e in encodings])
        tensors = [torch.from_numpy(a) for a in (ids, mask, types)]

        def forward(loaded: Any, arrays: tuple = (ids, mask, types), tensors: list = tensors) -> object:
            if isinstance(loaded, torch.nn.Module):
                with torch.no_grad():
                    return loaded(*tensors)
            return loaded.logits(*arrays)

        times = timed(contenders, forward, repeats)
        rows.append(_row(f"sst2 classifier: batch {batch} (SST-2 dev sentences)", contenders, times, "ms"))
    return rows


def _genai_model(folder: Path) -> tuple:
    import onnxruntime_genai as og

    return (og, og.Model(str(folder)))


def _genai_generate(og: Any, model: Any, prompt: np.ndarray, new_tokens: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.astype(np.int32)[None])
    while not generator.is_done():
        generator.generate_next_token()
    return list(generator.get_sequence(0))


def _row(
    workload: str, contenders: list[Contender], values: list[float], unit: str, higher: bool = False
) -> dict[str, str]:
    """The workload's cells by contender: the value and its speed-up over PyTorch eager (first)."""
    eager = values[0]
    row = {"workload": workload}
    for contender, value in zip(contenders, values, strict=True):
        ratio = value / eager if higher else eager / value
        row[contender.name] = f"{value:,.1f} {unit} ({ratio:.2f}x)"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--char-run", type=Path, help="a trained shakespeare-char run (default: train one)")
    parser.add_argument("--sst2-run", type=Path, help="a trained SST-2 classifier run (default: train one)")
    parser.add_argument(
        "--char-steps", type=int, default=400, help="steps of the char run it trains (batch 16, lr 1e-3)"
    )
    parser.add_argument(
        "--sst2-steps", type=int, default=2000, help="steps of the SST-2 run it trains (the spec's recipe)"
    )
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument(
        "--gate-examples", type=int, default=128, help="held-out windows of the decoder's gate"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        char_run = args.char_run or trained(
            "shakespeare-char.yaml",
            tmp / "char",
            [
                f"train.steps={args.char_steps}",
                "train.batch_size=16",
                "train.optimizer.lr=1e-3",
                "train.eval_interval=100",
                "train.eval_batches=8",
                NO_DROPOUT,
            ],
        )
        sst2_run = args.sst2_run or trained(
            "sst2-finetune.yaml",
            tmp / "sst2",
            [
                "train.init_from=null",
                f"train.steps={args.sst2_steps}",
                f"train.schedule.warmup_steps={max(1, args.sst2_steps // 10)}",
            ],
        )
        rows: list[dict[str, str]] = []
        sizes: list[str] = []  # table rows

        _, char_model = load_trained_model(char_run)
        char_gate = GateData(char_run, args.gate_examples)
        char = bundles(Source(run=char_run), None, tmp / "char", ["fused", "int8", "int4"], char_gate)
        genai = export_genai(char["fp32 bundle"], tmp / "char-genai")
        rows += decoder_rows("char (trained)", char_model, char, genai, args.repeats)
        sizes += size_rows("char", char)

        llama = load_spec(ROOT / "specs" / "llama.yaml", ["model.max_seq_len=512"])
        torch.manual_seed(0)
        llama_model = DecoderLM(llama.model).eval()
        llama_bundles = bundles(Source(seed=0), llama, tmp / "llama", ["fused", "int8", "int4"], None)
        rows += decoder_rows(
            "llama GQA 32k (random)", llama_model, llama_bundles, None, max(args.repeats // 2, 4)
        )
        sizes += size_rows("llama GQA 32k", llama_bundles)

        _, sst2_model = load_trained_model(sst2_run)
        sst2 = bundles(Source(run=sst2_run), None, tmp / "sst2", ["fused", "int8"], GateData(sst2_run))
        texts = read_table(SHARED / "sst2" / "dev.tsv.gz", "sentence", None, "label").texts
        rows += classifier_rows(sst2_model, sst2, texts, args.repeats)
        sizes += size_rows("sst2 classifier", sst2)

    columns = ["workload", "PyTorch eager", "fp32 bundle", "fused", "int8", "int4", "onnxruntime-genai"]
    lines = [
        f"onnxruntime {ort.__version__} CPUExecutionProvider, torch {torch.__version__} eager; medians of "
        f"{args.repeats} runs in 3 rounds of turns; (x): speed-up over PyTorch eager; char trained "
        f"{args.char_steps} steps and sst2 {args.sst2_steps} from scratch (or the runs given), llama with "
        f"random weights",
        "",
        "| " + " | ".join(columns) + " |",
        "| --- |" + " ---: |" * (len(columns) - 1),
        *("| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows),
        "",
        "Sizes on disk and accuracy gates (the task's held-out metric, fp32 bundle against this one):",
        "",
        "| model | bundle | size on disk | of fp32 | accuracy gate |",
        "| --- | --- | ---: | ---: | --- |",
        *sizes,
    ]
    write_results("runtime_latency-cpu", "\n".join(lines), device_name(torch.device("cpu")))


if __name__ == "__main__":
    main()
