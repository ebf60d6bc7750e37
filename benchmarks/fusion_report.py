"""Which of onnxruntime's fusions `tfcompile optimize --fuse` achieves on each shipped spec, and why
the others do not happen.

Exports each spec with random weights (fusion depends on the graph's shape, not its weights),
small enough to export quickly (`--set` below), runs both fusion tools on every graph, and counts
the fused operators each leaves: attention (MultiHeadAttention, GroupQueryAttention, Attention),
residual + norm (SkipLayerNormalization, SkipSimplifiedLayerNormalization), RoPE
(RotaryEmbedding) and GELU (Gelu, FastGelu, BiasGelu). Prints a table and writes it to
benchmarks/results/.

    python benchmarks/fusion_report.py
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import onnx
import torch
from common import device_name, write_results

from tfcompile.export import Source, export_bundle
from tfcompile.optimize.passes import FUSERS, operator_counts
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["model.d_model=64", "model.n_layers=2"]
SPECS = {
    "shakespeare-char.yaml": [*SMALL, "model.n_heads=4"],
    "vaswani-decoder.yaml": [*SMALL, "model.n_heads=4", "model.vocab_size=100"],
    "gpt2.yaml": [*SMALL, "model.n_heads=4", "model.vocab_size=1000", "model.max_seq_len=128"],
    "llama.yaml": [
        *SMALL,
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.vocab_size=1000",
        "model.max_seq_len=128",
    ],
    "sst2-finetune.yaml": [
        *SMALL,
        "model.n_heads=4",
        "model.vocab_size=1000",
        "task.labels=[neg, pos]",
        "train.init_from=null",
    ],
    "vit-digits.yaml": [*SMALL, "model.n_heads=4", "task.labels=[a, b, c]"],
    "multi30k-de-en.yaml": [*SMALL, "model.n_heads=4", "model.vocab_size=200", "model.n_decoder_layers=2"],
}
FAMILIES = {
    "attention": ("MultiHeadAttention", "GroupQueryAttention", "Attention"),
    "norm": ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"),
    "rope": ("RotaryEmbedding",),
    "gelu": ("Gelu", "FastGelu", "BiasGelu"),
}
# Why a fusion does not happen, from reading both tools' pattern rules against the exported graphs
# (the others fuse in every shipped spec).
WHY = {
    "rope": "onnxscript's RotaryEmbedding rule matches only transformers' form, x cos + "
    "concat(-x2, x1) sin with full-width tables computed from position ids by a MatMul with the "
    "inverse frequencies, and onnxruntime's optimizer only its Llama attention subgraph; the export "
    "rotates (x1, x2) to (x1 cos - x2 sin, x2 cos + x1 sin) with half-width tables gathered by "
    "position, in either layout",
}


def expected(spec: Spec) -> set[str]:
    """The fusions the spec's choices could give."""
    model = spec.model
    out = {"attention", "norm"}
    if model.positional.type == "rope":
        out.add("rope")
    if "gelu" in model.activation:
        out.add("gelu")
    return out


def fused(model: onnx.ModelProto) -> dict[str, int]:
    counts = operator_counts(model)
    return {
        family: sum(
            n for op, n in counts.items() if op.split("::")[-1] in ops and op.startswith("com.microsoft")
        )
        for family, ops in FAMILIES.items()
    }


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    rows = []
    not_fused: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in SPECS.items():
            spec = load_spec(ROOT / "specs" / name, overrides)
            bundle = Path(tmp) / name
            export_bundle(spec, Source(seed=0), bundle)
            files = BundleFiles(bundle)
            for graph_name, graph in files.manifest.graphs.items():
                data = files.read(graph.file)
                by_tool = {tool: fused(run(onnx.load_from_string(data))) for tool, run in FUSERS.items()}
                best = {family: max(counts[family] for counts in by_tool.values()) for family in FAMILIES}
                missing = sorted(f for f in expected(spec) if best[f] == 0)
                cells = [
                    ", ".join(f"{family} {n}" for family, n in counts.items() if n) or "-"
                    for counts in by_tool.values()
                ]
                not_fused.update(missing)
                rows.append((f"{Path(name).stem} / {graph_name}", *cells, ", ".join(missing) or "-"))
    lines = [
        "Fused operators each tool leaves in each graph (random weights; specs shrunk to 2 layers, "
        "d_model 64); `tfcompile optimize --fuse` keeps, per graph, the tool that fuses more.",
        "",
        f"| spec / graph | {' | '.join(FUSERS)} | not fused |",
        "| --- |" + " --- |" * (len(FUSERS) + 1),
        *(f"| {' | '.join(row)} |" for row in rows),
        "",
        "Why each missing fusion does not happen:",
        "",
        *(f"- **{family}**: {WHY.get(family, 'not investigated')}" for family in sorted(not_fused)),
    ]
    write_results("fusion_report", "\n".join(lines), device_name(torch.device("cpu")))


if __name__ == "__main__":
    main()
