"""Generation speed on the CPU: tfcompile's runtime against onnxruntime-genai on the same
decode_step graph, greedy, batch 1, N new tokens after a fixed prompt.

Two decoders: a tiny LLaMA-style char model (RMSNorm, SwiGLU, RoPE, grouped-query attention;
specs/shakespeare-char.yaml with the llama choices, trained a few steps) and a LLaMA-style model
with a 32k vocabulary (specs/llama.yaml at d_model 256, 4 layers, random weights: speed does not
depend on the weights). Each runs under four contenders, all loaded once and kept alive, timed in
alternating turns (an untimed run opens each turn): tfcompile and genai with their defaults, and
each with onnxruntime's default of one thread per core. Every contender must generate the same
tokens. Prints a table of median tokens/s and writes it to benchmarks/results/.

    python benchmarks/generation_speed.py                    # builds the two bundles first
    python benchmarks/generation_speed.py --char BUNDLE --llama BUNDLE
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort  # before onnxruntime_genai, which otherwise aborts the process on Linux
import onnxruntime_genai as og  # type: ignore[import-untyped]
import torch
from common import ROOT, device_name, trained, write_results

from tfcompile.export import Source, export_bundle
from tfcompile.handoffs.genai import GENAI_CONFIG, export_genai, genai_config
from tfcompile.runtime import LanguageModel, SessionOptions, load
from tfcompile.runtime.session import step_threads
from tfcompile.spec import load_spec

PROMPT = "First Citizen:\n"
LLAMA_CHOICES = [
    "model.norm={position: pre, type: rmsnorm, eps: 1.0e-6}",
    "model.activation=swiglu",
    "model.positional={type: rope, theta: 10000.0}",
    "model.bias={qkv: false, attn_out: false, ffn: false, lm_head: false}",
    "model.dropout={embedding: 0, attention: 0, residual: 0}",
]
CHAR = ["model.d_model=128", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2", *LLAMA_CHOICES]
LLAMA_32K = ["model.d_model=256", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2"]
Generate = Callable[[list[int]], list[int]]


def build_char(folder: Path, steps: int) -> Path:
    """The tiny LLaMA-style char model, trained ``steps`` steps and exported."""
    train = [f"train.steps={steps}", "train.batch_size=16", f"train.eval_interval={steps}"]
    run = trained("shakespeare-char.yaml", folder, [*CHAR, *train, "train.eval_batches=2"], "char-run")
    export_bundle(None, Source(run=run), folder / "char")
    return folder / "char"


def build_llama(folder: Path) -> Path:
    """specs/llama.yaml, small, with random weights (no tokenizer: it runs on token ids)."""
    spec = load_spec(ROOT / "specs" / "llama.yaml", [*LLAMA_32K, "model.max_seq_len=512"])
    export_bundle(spec, Source(seed=0), folder / "llama32k")
    return folder / "llama32k"


def language_model(bundle: Path, options: SessionOptions | None = None) -> LanguageModel:
    model = load(bundle, providers=["CPUExecutionProvider"], options=options)
    if not isinstance(model, LanguageModel):
        raise SystemExit(f"{bundle} holds a {model.manifest.task} model, not a decoder")
    return model


def genai_folder(bundle: Path, out: Path, avoid: set[int]) -> Path:
    """The bundle as an onnxruntime-genai folder: ``export_genai`` when the bundle has a tokenizer;
    otherwise the step graph and a genai_config.json of its own, with an end token outside
    ``avoid`` (genai stops there; tfcompile has none)."""
    model = language_model(bundle)
    if model.tokenizer is not None:
        return export_genai(bundle, out)
    step = model.graph("step")
    assert step.cache is not None
    past = next(t for t in step.inputs if t.name == step.cache.past[0])
    kv_heads, head_dim = int(past.shape[1]), int(past.shape[3])
    spec = model.manifest.model
    heads = {
        "head_size": head_dim,
        "hidden_size": getattr(spec, "d_model", kv_heads * head_dim),
        "num_attention_heads": getattr(spec, "n_heads", kv_heads),
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": len(step.cache.past) // 2,
    }
    end = min(set(range(model.vocab_size)) - avoid)
    ids = {"eos_token_id": [end], "pad_token_id": end, "bos_token_id": end}
    out.mkdir(parents=True)
    shutil.copyfile(bundle / step.file, out / step.file)
    config = genai_config(model.manifest, step, heads, model.vocab_size, ids)
    (out / GENAI_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out


def with_threads(folder: Path, out: Path, threads: int) -> Path:
    """A copy of a genai folder whose session uses ``threads`` intra-op threads (0: one per core)."""
    shutil.copytree(folder, out)
    config = json.loads((out / GENAI_CONFIG).read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    (out / GENAI_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out


def tfcompile_generate(model: LanguageModel, new_tokens: int) -> Generate:
    def generate(prompt: list[int]) -> list[int]:
        out = model.generate(np.array([prompt]), new_tokens, temperature=0, stop=False)
        return out[0, len(prompt) :].tolist()

    return generate


def genai_generate(folder: Path, new_tokens: int) -> Generate:
    model = og.Model(str(folder))

    def generate(prompt: list[int]) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return list(generator.get_sequence(0))[len(prompt) :]

    return generate


def tokens_per_s(
    contenders: dict[str, Generate], prompt: list[int], new_tokens: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each contender's tokens per second of wall time and per second of the process's CPU time
    (every thread's: spinning counts), in ``rounds`` alternating turns, the order rotated each
    round (an untimed run opens each turn); every contender must generate the first one's tokens.
    On a shared CPU, CPU time varies less than wall time: it leaves out the time other jobs hold
    the cores."""
    expected = next(iter(contenders.values()))(prompt)
    for name, generate in contenders.items():
        if (got := generate(prompt)) != expected:
            raise SystemExit(f"{name} generated other tokens than the runtime:\n{got}\n{expected}")
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    cpu_rates: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders.items())
    for turn in range(rounds):
        for name, generate in order[turn % len(order) :] + order[: turn % len(order)]:
            generate(prompt)
            start, cpu = time.perf_counter(), time.process_time()
            generate(prompt)
            rates[name].append(new_tokens / (time.perf_counter() - start))
            cpu_rates[name].append(new_tokens / (time.process_time() - cpu))
    return rates, cpu_rates


def model_rows(label: str, bundle: Path, work: Path, new_tokens: int, rounds: int) -> list[str]:
    ours = language_model(bundle)
    per_core = language_model(bundle, SessionOptions(threads=0))  # onnxruntime's default
    if ours.tokenizer is not None:
        prompt = ours.encode([PROMPT])[0].ids
    else:
        prompt = np.random.default_rng(0).integers(0, ours.vocab_size, size=8).tolist()
    reference = tfcompile_generate(ours, new_tokens)(prompt)
    folder = genai_folder(bundle, work / f"{bundle.name}-genai", {*prompt, *reference})
    contenders = {
        "tfcompile runtime": tfcompile_generate(ours, new_tokens),
        "onnxruntime-genai": genai_generate(folder, new_tokens),
        "tfcompile runtime, one thread per core": tfcompile_generate(per_core, new_tokens),
        "onnxruntime-genai, one thread per core": genai_generate(
            with_threads(folder, work / f"{bundle.name}-genai-per-core", 0), new_tokens
        ),
    }
    rates, cpu_rates = tokens_per_s(contenders, prompt, new_tokens, rounds)
    threads = {name: "per core" if "per core" in name else str(step_threads()) for name in contenders}
    genai, genai_cpu = (statistics.median(r["onnxruntime-genai"]) for r in (rates, cpu_rates))
    rows = []
    for name, values in rates.items():
        median, cpu = statistics.median(values), statistics.median(cpu_rates[name])
        rows.append(
            f"| {label} | {name} | {threads[name]} | {median:,.0f} | {min(values):,.0f} to "
            f"{max(values):,.0f} | {median / genai:.2f}x | {cpu:,.0f} | {cpu / genai_cpu:.2f}x |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--char", type=Path, help="the char decoder bundle (default: train and export one)")
    parser.add_argument("--llama", type=Path, help="the 32k-vocabulary bundle (default: export one)")
    parser.add_argument("--steps", type=int, default=30, help="training steps of the char model it builds")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9, help="timed turns per contender")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_dir:
        work = Path(tmp_dir)
        char = args.char or build_char(work, args.steps)
        llama = args.llama or build_llama(work)
        rows = [
            *model_rows("char, LLaMA-style, 65 tokens", char, work, args.new_tokens, args.rounds),
            *model_rows("LLaMA-style, 32k vocabulary", llama, work, args.new_tokens, args.rounds),
        ]
    lines = [
        f"onnxruntime {ort.__version__}, onnxruntime-genai {og.__version__}, CPUExecutionProvider; "
        f"greedy, batch 1, {args.new_tokens} new tokens after a fixed prompt, the same decode_step "
        f"graph; every contender generated the same tokens. Median (and range) of {args.rounds} "
        f"alternating turns with every session kept alive; the CPU is shared with other jobs, so "
        f"single turns vary widely; tokens/CPU-s (per second of the process's CPU time, every "
        f"thread's) varies less. threads: onnxruntime's intra-op threads (tfcompile's default for "
        f"step graphs and genai's: half the logical cores; 'per core': onnxruntime's default).",
        "",
        "| model | contender | threads | tokens/s | range | vs genai | tokens/CPU-s | vs genai |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]
    write_results("generation_speed-cpu", "\n".join(lines), device_name(torch.device("cpu")))


if __name__ == "__main__":
    main()
