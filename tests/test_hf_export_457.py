"""`tfcompile export-hf` folders read by transformers 4.57, the oldest version they are written for
(exporter.WRITTEN_BY), in a python of its own: a folder of each family loads with its Auto class
with no missing, unexpected or mismatched tensors, computes the run's outputs in float32 (padded
and not; an OPT and a BLOOM left-padded too), and its tokenizer encodes a text to the run's ids,
returning only the inputs the model reads.

Slow, and run only where TFCOMPILE_TRANSFORMERS_457 names a python with transformers 4.57, torch
and safetensors installed (the project's venv holds transformers 5), e.g.
``python3 -m venv /tmp/tf457 && /tmp/tf457/bin/pip install torch 'transformers==4.57.*'``."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import test_hf_albert
import test_hf_bart
import test_hf_electra
import test_hf_ernie
import test_sliding_window
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, imported_variants, random_ids, right_padding
from tokenizers import Tokenizer

from tfcompile.hf.errors import HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.train.runs import load_trained_model

PYTHON = os.environ.get("TFCOMPILE_TRANSFORMERS_457")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not PYTHON, reason="TFCOMPILE_TRANSFORMERS_457 names no python with transformers 4.57 installed"
    ),
]
TEXT = "hello, world! the cat"

# Run in transformers 4.57: each folder's outputs on the saved inputs, what loading reported, and
# what the tokenizer gives.
CHECK = r"""
import json, os, sys, torch, transformers
AUTO = {"CausalLM": "AutoModelForCausalLM", "LMHeadModel": "AutoModelForCausalLM",
        "MaskedLM": "AutoModelForMaskedLM", "PreTraining": "AutoModelForPreTraining",
        "SequenceClassification": "AutoModelForSequenceClassification",
        "ImageClassification": "AutoModelForImageClassification",
        "ConditionalGeneration": "AutoModelForSeq2SeqLM", "MTModel": "AutoModelForSeq2SeqLM"}
results = {"version": transformers.__version__}
text, folders = sys.argv[1], sys.argv[2:]
for folder in folders:
    config = json.load(open(f"{folder}/config.json"))
    auto = next(getattr(transformers, c) for s, c in AUTO.items() if config["architectures"][0].endswith(s))
    # transformers 4's SDPA attention ignores GPT-2's scale_attn_weights false; its eager reads it
    eager = config["model_type"] == "gpt2" and config.get("scale_attn_weights") is False
    model, info = auto.from_pretrained(folder, output_loading_info=True, torch_dtype=torch.float32,
                                       **({"attn_implementation": "eager"} if eager else {}))
    worst = 0.0
    with torch.no_grad():
        for call in torch.load(f"{folder}/calls.pt"):
            got = model.eval()(**call["kwargs"])
            for key, ref in call["refs"].items():
                d = getattr(got, key) - ref
                real = call["real"] is not None and d.ndim == 3
                worst = max(worst, (d[call["real"]] if real else d).abs().max().item())
    results[folder] = {"info": {k: list(map(str, v)) for k, v in info.items()}, "difference": worst}
    transformers.GenerationConfig.from_pretrained(folder)
    if os.path.exists(f"{folder}/tokenizer.json"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        results[folder] |= {"ids": tokenizer(text)["input_ids"],
                            "inputs": sorted(tokenizer("a good movie", "it was fine"))}
print(json.dumps(results))
"""


def _imported(module: str, name: str) -> Callable[[Path], Path]:
    """The import of a family file's variant (its VARIANTS[name]: test_hf_arcee's, test_hf_glm's,
    test_hf_nemotron's, test_hf_exaone4's, test_hf_hunyuan's)."""

    def run(root: Path) -> Path:
        variants = {name: importlib.import_module(module).VARIANTS[name]}
        return imported_variants(root, variants)[name].result.run_dir

    return run


def _gemma_phi3(name: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_gemma_phi3

        return test_hf_gemma_phi3.imported_variant(root, name).result.run_dir

    return run


def _gemma3(name: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_gemma3

        return test_hf_gemma3.imported_variant(root, name).result.run_dir

    return run


def _gemma3_own(root: Path) -> Path:
    """Local layers at their own theta, interleaved RoPE permuted to halves."""
    import test_hf_gemma3

    return random_run(root, f"model: {{{test_hf_gemma3.WRITTEN['local layers, interleaved']}}}\n")


def _biogpt_own(root: Path) -> Path:
    """Learned positions and scaled embeddings, untied."""
    import test_hf_biogpt

    return random_run(root, f"model: {{{test_hf_biogpt.SCALED}}}\n")


def _xglm_own(root: Path) -> Path:
    """tensor2tensor's sinusoids in halves from position 2, untied."""
    import test_hf_xglm

    return random_run(root, f"model: {{{test_hf_xglm.SINUSOIDS}}}\n")


def _opt_bigcode(name: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_opt_bigcode

        return test_hf_opt_bigcode.imported_variant(root, name).result.run_dir

    return run


def _neox(name: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_neox_gptj_phi

        return test_hf_neox_gptj_phi.imported_variant(root, name).result.run_dir

    return run


def _neox_own(root: Path) -> Path:
    """Interleaved RoPE on part of each head, permuted to transformers' halves."""
    import test_hf_neox_gptj_phi

    spec = test_hf_neox_gptj_phi.WRITTEN["interleaved partial, no biases"]
    return random_run(root, f"model: {{{spec}}}\n")


def _bloom(name: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_falcon_bloom

        return test_hf_falcon_bloom.imported_variant(root, name).result.run_dir

    return run


def _bloom_own(root: Path) -> Path:
    """ALiBi of 6 heads, no biases: zeros in BLOOM's."""
    import test_hf_falcon_bloom

    spec = test_hf_falcon_bloom.WRITTEN["6 heads, untied, no biases"]
    return random_run(root, f"model: {{{spec}}}\n")


def _starcoder2(name: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_starcoder2

        return test_hf_starcoder2.imported_variant(root, name).result.run_dir

    return run


def _starcoder2_own(root: Path) -> Path:
    """Grouped K/V heads, interleaved RoPE permuted to halves, missing biases as zeros."""
    import test_hf_starcoder2

    spec = test_hf_starcoder2.WRITTEN["interleaved, some biases, untied, scaled output"]
    return random_run(root, f"model: {{{spec}}}\n")


def _roberta(family: str) -> Callable[[Path], Path]:
    def run(root: Path) -> Path:
        import test_hf_roberta_distilbert

        return test_hf_roberta_distilbert.imported_variant(root, family).result.run_dir

    return run


def _mt5(root: Path) -> Path:
    import test_hf_mt5

    test_hf_mt5.imported(root)
    return root / "runs" / "mt5"


def _qwen3(root: Path) -> Path:
    import test_qk_norm

    return random_run(
        root, f"model: {{{test_qk_norm.QWEN3}, bias: {{qkv: true, attn_out: false, ffn: false}}}}\n"
    )


def _olmo2(kind: str) -> Callable[[Path], Path]:
    """A run of OLMo 2's blocks (test_hf_olmo.WRITTEN's)."""

    def run(root: Path) -> Path:
        import test_hf_olmo

        return random_run(root, f"model: {{{test_hf_olmo.WRITTEN[kind]}}}\n")

    return run


def _smollm3(kind: str) -> Callable[[Path], Path]:
    """A run with NoPE layers (test_hf_smollm3.WRITTEN's)."""

    def run(root: Path) -> Path:
        import test_hf_smollm3

        return random_run(root, f"model: {{{test_hf_smollm3.WRITTEN[kind]}}}\n")

    return run


def _granite(kind: str) -> Callable[[Path], Path]:
    """A run with multipliers (test_hf_granite.WRITTEN's)."""

    def run(root: Path) -> Path:
        import test_hf_granite

        return random_run(root, f"model: {{{test_hf_granite.WRITTEN[kind]}}}\n")

    return run


def _windowed(architecture: str) -> Callable[[Path], Path]:
    """A run of tfcompile's own with a window shorter than the 12 tokens compared."""

    def run(root: Path) -> Path:
        import test_sliding_window

        return test_sliding_window.random_window_run(root, architecture)

    return run


def _bart(name: str) -> Callable[[Path], Path]:
    """An import of test_hf_bart's variant, or a translator of tfcompile's own (its NATIVE's)."""

    def run(root: Path) -> Path:
        if name in test_hf_bart.NATIVE:
            return random_run(root, test_hf_bart.NATIVE[name] + "\ntask: seq2seq\n")
        variants = {name: test_hf_bart.VARIANTS[name]}
        return imported_variants(root, variants, tokenizer="t5")[name].result.run_dir

    return run


def _encoder(module: Any, name: str) -> Callable[[Path], Path]:
    """An import of an encoder family file's variant (test_hf_electra's, test_hf_albert's,
    test_hf_ernie's), or an encoder of tfcompile's own (its NATIVE's, where it has one)."""

    def run(root: Path) -> Path:
        if name in getattr(module, "NATIVE", {}):
            return random_run(root, module.NATIVE[name])
        variants = {name: module.VARIANTS[name]}
        return imported_variants(root, variants, tokenizer="bert")[name].result.run_dir

    return run


def _modernbert(name: str) -> Callable[[Path], Path]:
    """An import of test_hf_modernbert's variant, or a ModernBERT of tfcompile's own (its RUNS')."""

    def run(root: Path) -> Path:
        import test_hf_modernbert

        if name in test_hf_modernbert.RUNS:
            return random_run(root, json.dumps(test_hf_modernbert.RUNS[name]))
        variants = {name: test_hf_modernbert.VARIANTS[name]}
        return imported_variants(root, variants, tokenizer="bert")[name].result.run_dir

    return run


def _variant(name: str) -> Callable[[Path], Path]:
    return lambda root: Imported(root, name).result.run_dir


# One run of each family and of each architecture export-hf writes, and the runs written as
# another architecture (Phi-3 as Llama, mT5 as T5, XLM-RoBERTa and DistilBERT as BERT, a Falcon of
# sublayers in turn with one K/V head as Starcoder2).
RUNS: dict[str, Callable[[Path], Path]] = {
    "gpt2": _variant("gpt2"),
    "llama_yarn": _variant("llama_yarn"),
    "qwen2": _variant("qwen2"),
    "qwen3": _variant("qwen3"),
    "qwen3 of tfcompile's own (no tokenizer)": _qwen3,
    "olmo2 of tfcompile's own (interleaved, no tokenizer)": _olmo2("interleaved, grouped, q/k/v biases"),
    "olmo2 of tfcompile's own (halves, untied, no tokenizer)": _olmo2(
        "halves, one K/V head, untied, no biases"
    ),
    "smollm3 of tfcompile's own (a window, no tokenizer)": _smollm3(
        "interleaved, grouped, a window on a RoPE layer"
    ),
    "smollm3 of tfcompile's own (halves, untied, no tokenizer)": _smollm3(
        "halves, one K/V head, untied, no biases"
    ),
    "granite of tfcompile's own (multipliers, no tokenizer)": _granite(
        "interleaved, grouped, multipliers, q/k/v biases"
    ),
    "granite of tfcompile's own (an attention scale, no tokenizer)": _granite(
        "halves, an attention scale of its own, untied"
    ),
    "bert_pretraining": _variant("bert_pretraining"),
    "bert_cls": _variant("bert_cls"),
    "vit": _variant("vit"),
    "t5_v1_0": _variant("t5_v1_0"),
    "t5_v1_1": _variant("t5_v1_1"),
    "gemma": _gemma_phi3("gemma_wide_bias_untied"),
    "phi3 as llama": _gemma_phi3("phi3"),
    "phi3 of LongRoPE as llama": _gemma_phi3("phi3_longrope"),
    "phi3 of LongRoPE on part of each head": _gemma_phi3("phi3_partial_longrope"),
    "glm": _imported("test_hf_glm", "glm"),
    "glm4": _imported("test_hf_glm", "glm4"),
    "glm without biases as phi3": _imported("test_hf_glm", "glm_no_bias"),
    "arcee": _imported("test_hf_arcee", "arcee"),
    "arcee of biases": _imported("test_hf_arcee", "arcee_biases"),
    "nemotron as gpt_neox": _imported("test_hf_nemotron", "nemotron_mha_biases"),
    "exaone4": _imported("test_hf_exaone4", "exaone4"),
    "exaone4 without a window": _imported("test_hf_exaone4", "exaone4_global"),
    "exaone4 of NoPE layers, no window": _imported("test_hf_exaone4", "exaone4_unslid"),
    "hunyuan of NTK alpha": _imported("test_hf_hunyuan", "hunyuan"),
    "hunyuan of biases": _imported("test_hf_hunyuan", "hunyuan_biases"),
    "olmoe": _imported("test_hf_moe", "olmoe"),
    "gpt_oss": _imported("test_hf_gpt_oss", "gpt_oss"),
    "gpt_oss, every layer full": _imported("test_hf_gpt_oss", "gpt_oss_full"),
    "olmoe of biases, renormalised": _imported("test_hf_moe", "olmoe_gqa"),
    "modernbert": _modernbert("modernbert"),
    "modernbert_mean": _modernbert("modernbert_mean"),
    "modernbert of tfcompile's own (local theta, no window, no tokenizer)": _modernbert("no window"),
    "gemma3": _gemma3("gemma3_scaled_window_bias_untied"),
    "gemma3 of tfcompile's own (no tokenizer)": _gemma3_own,
    "opt": _opt_bigcode("opt_post"),
    "biogpt": _imported("test_hf_biogpt", "biogpt"),
    "biogpt of tfcompile's own (no tokenizer)": _biogpt_own,
    "xglm": _imported("test_hf_xglm", "xglm"),
    "ernie of task types as bert": _encoder(test_hf_ernie, "ernie_task"),
    "ernie classifier as bert": _encoder(test_hf_ernie, "ernie_cls"),
    "xglm untied, unscaled": _imported("test_hf_xglm", "xglm_plain"),
    "xglm of tfcompile's own (no tokenizer)": _xglm_own,
    "gpt_bigcode": _opt_bigcode("bigcode"),
    "gpt_bigcode as gpt2, unscaled": _opt_bigcode("bigcode_mha"),
    "gpt_neox": _neox("neox"),
    "gpt_neox sequential, tied": _neox("neox_sequential_tied"),
    "gpt_neox linear RoPE": _neox("neox_linear"),
    "gpt_neox of tfcompile's own (interleaved, no tokenizer)": _neox_own,
    "starcoder2": _starcoder2("starcoder2"),
    "starcoder2 window": _starcoder2("starcoder2_window"),
    "starcoder2 linear RoPE, head_dim, MQA": _starcoder2("starcoder2_linear"),
    "starcoder2 of tfcompile's own (interleaved, no tokenizer)": _starcoder2_own,
    "falcon sequential MQA as starcoder2": _bloom("falcon_sequential_mqa_dynamic"),
    "bloom": _bloom("bloom_6_heads_untied"),
    "bloom of tfcompile's own (no tokenizer)": _bloom_own,
    "xlm-roberta as bert": _roberta("xlm-roberta_cls"),
    "distilbert as bert": _roberta("distilbert"),
    "mt5 as t5": _mt5,
    **{name: _bart(name) for name in ("marian", "marian_unshared", "pegasus", "bart", "mbart")},
    **{f"{head} of tfcompile's own (no tokenizer)": _bart(head) for head in test_hf_bart.NATIVE},
    **{
        name: _encoder(test_hf_electra, name)
        for name in ("electra_cls", "electra_generator", "electra_generator_untied")
    },
    **{
        f"electra {name} of tfcompile's own (no tokenizer)": _encoder(test_hf_electra, name)
        for name in test_hf_electra.NATIVE
    },
    **{name: _encoder(test_hf_albert, name) for name in ("albert", "albert_cls", "albert_untied_wide")},
    **{
        f"albert {name} of tfcompile's own (no tokenizer)": _encoder(test_hf_albert, name)
        for name in test_hf_albert.NATIVE
    },
    **{f"{name} window (no tokenizer)": _windowed(name) for name in test_sliding_window.WRITTEN},
}


def _calls(run: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The inputs transformers is given, and the run's outputs on them (at real tokens)."""
    model = load_trained_model(run)[1]
    architecture, vocab = config["architectures"][0], config.get("vocab_size")
    ids = random_ids(3, 12) % (vocab or VOCAB)
    masks = [torch.ones(3, 12, dtype=torch.long), right_padding(3, 12)]
    # positions counted from the mask, in both (BioGPT's, in transformers 4)
    if architecture in ("OPTForCausalLM", "BloomForCausalLM", "BioGptForCausalLM"):
        masks.append(right_padding(3, 12).flip(-1))
    calls = []
    with torch.no_grad():
        if architecture.startswith("ViT"):
            size = config["image_size"]
            pixels = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(0))
            return [{"kwargs": {"pixel_values": pixels}, "refs": {"logits": model(pixels)}, "real": None}]
        for mask in masks:
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
            if config.get("is_encoder_decoder"):
                kwargs["decoder_input_ids"] = random_ids(3, 7, 1)
                refs = {"logits": model(ids, mask, kwargs["decoder_input_ids"])}
                calls.append({"kwargs": kwargs, "refs": refs, "real": None})  # every target position
                continue
            elif architecture.startswith(("Bert", "Electra", "Albert", "ModernBert")):
                outputs = model(ids, mask)
                refs = (
                    {"prediction_logits": outputs[0], "seq_relationship_logits": outputs[1]}
                    if architecture == "BertForPreTraining"
                    else {"logits": outputs[0] if isinstance(outputs, tuple) else outputs}
                )
            else:
                refs = {"logits": model(ids, mask)}
            calls.append({"kwargs": kwargs, "refs": refs, "real": mask.bool()})
    return calls


@pytest.fixture(scope="module")
def read_by_457(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every run exported, and what transformers 4.57 makes of each folder (one process for all)."""
    root = tmp_path_factory.mktemp("hf457")
    folders: dict[str, Path] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # GPT-2's unscaled q.k in transformers 4: read eager
        for i, (name, make) in enumerate(RUNS.items()):
            run = make(root / str(i))
            out = folders[name] = root / str(i) / "out"
            export_hf(run, out)
            torch.save(_calls(run, json.loads((out / "config.json").read_text())), out / "calls.pt")
            (out / "run_tokenizer.txt").write_text(json.dumps(_run_ids(out)))
    assert PYTHON is not None
    done = subprocess.run(
        [PYTHON, "-c", CHECK, TEXT, *map(str, folders.values())],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert results["version"].startswith("4.57"), results["version"]
    return {name: results[str(folder)] | {"folder": folder} for name, folder in folders.items()}


def _run_ids(out: Path) -> list[int] | None:
    """The ids of TEXT by the tokenizer written (the run's, with a translator's suffix appended)."""
    path = out / "tokenizer.json"
    return Tokenizer.from_file(str(path)).encode(TEXT).ids if path.exists() else None


@pytest.mark.parametrize("name", list(RUNS))
def test_transformers_4_57_loads_each_folder_to_the_runs_outputs(
    read_by_457: dict[str, Any], name: str
) -> None:
    result = read_by_457[name]
    assert not any(result["info"].values()), result["info"]
    assert result["difference"] <= 1e-5


@pytest.mark.parametrize("name", [name for name in RUNS if name != "vit" and "no tokenizer" not in name])
def test_transformers_4_57s_tokenizer_gives_the_runs_ids_and_the_models_inputs(
    read_by_457: dict[str, Any], name: str
) -> None:
    """A pair's token_type_ids only for BERT with segments: transformers 4's PreTrainedTokenizerFast
    returns them unless told which inputs the model reads, and GPT-2 adds them to its embeddings."""
    result = read_by_457[name]
    assert result["ids"] == json.loads((result["folder"] / "run_tokenizer.txt").read_text())
    segments = name.startswith(("bert", "xlm-roberta", "electra_", "albert", "ernie"))
    assert result["inputs"] == sorted(
        ["input_ids", "attention_mask", *(["token_type_ids"] if segments else [])]
    )


GENERATE = r"""
import json, sys, torch, transformers
folder, rows, fields = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
out = []
for row in rows:
    ids = tokenizer(row, return_tensors="pt")["input_ids"]
    out.append(model.generate(ids, **fields)[0].tolist())
print(json.dumps([transformers.__version__, out]))
"""


def _mbart_forcing_french(folder: Path) -> None:
    from hf_models import LANGUAGES, perturb, write

    torch.manual_seed(0)
    write(perturb(test_hf_bart.built("mbart", encoder_layers=1)), "nllb", folder)
    path = folder / "generation_config.json"
    code = 3 + LANGUAGES.index("fra_Latn")  # after <pad>, </s> and <unk>
    path.write_text(json.dumps(json.loads(path.read_text()) | {"forced_bos_token_id": code}))


FORCING: dict[str, tuple[Callable[[Path], Any], str]] = {
    "bart-large-cnn's <s>": (
        lambda f: test_hf_bart.saved_with_bart_tokenizer(f, forced_bos_token_id=0),
        "cls",
    ),
    "an mBART's fra_Latn": (_mbart_forcing_french, "target_language"),
    "an NLLB's fra_Latn": (lambda f: importlib.import_module("test_hf_m2m100").nllb(f), "target_language"),
}


@pytest.mark.parametrize("name", list(FORCING))
def test_transformers_4_57_forces_the_runs_target_prefix(name: str, tmp_path: Path) -> None:
    """export-hf's forced_bos_token_id: transformers 4.57's greedy generate() from the folder, its
    tokenizer framing each source, starts with the decoder's start and the forced token, then the
    bundle's translation."""
    from test_hf_paths import SENTENCES

    make, forced = FORCING[name]
    make(tmp_path / "hf")
    result, bundle, ours, theirs = _both_translate(tmp_path)
    assert result.spec.task.type == "seq2seq" and result.spec.task.target_prefix == [forced]
    assert bundle.translation.target_prefix_ids
    start = [bundle.translation.start_id, *bundle.translation.target_prefix_ids]
    stop = bundle.translation.stop_id
    assert [row[: len(start)] for row in theirs] == [start] * len(SENTENCES)
    chosen = 10 - (len(start) - 1)  # max_new_tokens and max_len count the forced token
    assert [row[len(start) :] for row in theirs] == [row + [stop] * (len(row) < chosen) for row in ours]
    assert len({tuple(row) for row in ours}) > 1


def test_transformers_4_57_ends_a_cut_translation_with_the_forced_eos(tmp_path: Path) -> None:
    """export-hf's forced_eos_token_id: transformers 4.57's greedy generate() from the folder puts
    the eos in the last place max_new_tokens leaves, after the bundle's translation, which holds a
    token fewer than the limit where it is cut."""
    test_hf_bart.saved_with_bart_tokenizer(tmp_path / "hf", forced_eos_token_id=2)
    result, bundle, ours, theirs = _both_translate(tmp_path)
    assert result.spec.task.type == "seq2seq" and result.spec.task.forced_eos
    start, stop = bundle.translation.start_id, bundle.translation.stop_id
    assert theirs == [[start, *row, stop] for row in ours]
    assert any(len(row) == 9 for row in ours)


def test_transformers_4_57_bans_what_the_bundle_bans(tmp_path: Path) -> None:
    """export-hf's suppress_tokens, min_new_tokens and no_repeat_ngram_size: transformers 4.57's
    greedy generate() from the folder gives the bundle's translations, which the bans change (some
    held past their eos by min_new_tokens)."""
    hf = test_hf_bart.saved_with_bart_tokenizer(tmp_path / "hf")
    bans = test_hf_bart.with_bans(tmp_path / "hf", hf)
    result, bundle, ours, theirs = _both_translate(tmp_path)
    task = result.spec.task
    assert task.type == "seq2seq" and len(task.suppressed_tokens) == 2 and task.no_repeat_ngram_size == 2
    start, stop = bundle.translation.start_id, bundle.translation.stop_id
    assert theirs == [[start, *row, *[stop] * (len(row) < 10)] for row in ours]
    assert min(map(len, ours)) == bans["min_length"] - 1  # the shortest held to the minimum


GREEDY = {"do_sample": False, "num_beams": 1, "max_new_tokens": 10}


@pytest.mark.parametrize("setting", test_hf_bart.BEAM_SETTINGS, ids=test_hf_bart.setting_id)
def test_transformers_4_57_searches_beams_as_the_bundle_does(setting: dict[str, Any], tmp_path: Path) -> None:
    """export-hf's max_new_tokens, num_beams, length_penalty and early_stopping: transformers
    4.57's generate() from the folder, without arguments, gives the bundle's translations without
    arguments (generate()'s beam search, as the manifest says)."""
    hf = test_hf_bart.saved_with_bart_tokenizer(tmp_path / "hf").eval()
    test_hf_bart.with_likely_eos(tmp_path / "hf", hf)
    test_hf_bart.with_generation(tmp_path / "hf", max_new_tokens=12, **setting)
    result, bundle, ours, theirs = _both_translate(tmp_path, {})
    assert result.spec.task.type == "seq2seq" and bundle.translation.beam_scoring == "transformers"
    start, stop = bundle.translation.start_id, bundle.translation.stop_id
    assert theirs == [[start, *row, *[stop] * (len(row) < 12)] for row in ours]
    assert len({tuple(row) for row in ours}) > 1


def _both_translate(
    tmp_path: Path, fields: dict[str, Any] = GREEDY
) -> tuple[Any, Any, list[list[int]], list[list[int]]]:
    """tmp_path/hf imported, written back by export-hf and exported as a bundle -> the import, the
    bundle, its translations of test_hf_paths' sentences, and transformers 4.57's generate() of
    them from the written folder: greedy, max_len 10 and max_new_tokens 10, or with no ``fields``
    the bundle's defaults and generate()'s (the folder's)."""
    from test_hf_paths import SENTENCES

    from tfcompile.cli import main
    from tfcompile.hf.importer import import_folder
    from tfcompile.runtime import Translator

    result = import_folder(tmp_path / "hf", "run", tmp_path / "specs", tmp_path / "runs")
    export_hf(result.run_dir, tmp_path / "out")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = Translator(tmp_path / "bundle")
    limits = {"beam": 1, "max_len": 10} if fields else {}
    ours = bundle.translate_ids(*_framed(bundle, SENTENCES), **limits)
    theirs = _generated_by_457(GENERATE, tmp_path / "out", SENTENCES, fields)
    return result, bundle, ours, theirs


def _generated_by_457(script: str, folder: Path, *arguments: Any) -> Any:
    """What a generate() ``script`` prints (transformers' version, then its tokens) run by
    transformers 4.57 on ``folder`` with the JSON ``arguments``: its tokens."""
    assert PYTHON is not None
    done = subprocess.run(
        [PYTHON, "-c", script, str(folder), *map(json.dumps, arguments)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    version, theirs = json.loads(done.stdout.splitlines()[-1])
    assert version.startswith("4.57")
    return theirs


def _framed(bundle: Any, texts: list[str]) -> tuple[Any, Any]:
    """The sources as the runtime's translate() frames them, right-padded, and their mask."""
    from tfcompile.sequences import pad_rows, source_row

    t = bundle.translation
    rows = [
        source_row(
            e.ids, bundle.max_seq_len, t.source_prefix_ids, t.source_suffix_ids, bundle.special_id("unk")
        )
        for e in bundle.encode(texts, add_special_tokens=False)
    ]
    return pad_rows(rows, bundle.manifest.padding.pad_id), pad_rows([[1] * len(r) for r in rows], 0)


GENERATE_TEXT = r"""
import json, sys, torch, transformers
folder, prompt = sys.argv[1], json.loads(sys.argv[2])
model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
ids = torch.tensor([prompt])
out = model.generate(ids, attention_mask=torch.ones_like(ids))[0].tolist()
print(json.dumps([transformers.__version__, out]))
"""


def test_transformers_4_57_bans_what_a_language_models_bundle_bans(tmp_path: Path) -> None:
    """export-hf's suppress_tokens, bad_words_ids, min_new_tokens and no_repeat_ngram_size of a
    language model: transformers 4.57's generate() from the folder, without arguments, gives the
    bundle's greedy tokens under those bans, which each change them."""
    import numpy as np
    from test_hf_generation_settings import BANS, PROMPT, saved

    from tfcompile.cli import main
    from tfcompile.hf.importer import import_folder
    from tfcompile.runtime import load

    saved(tmp_path / "hf", 0, do_sample=False, max_new_tokens=16, **BANS)
    result = import_folder(tmp_path / "hf", "banned", tmp_path / "specs", tmp_path / "runs")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    export_hf(result.run_dir, tmp_path / "out")
    theirs = _generated_by_457(GENERATE_TEXT, tmp_path / "out", PROMPT[0])
    ours = load(tmp_path / "bundle").generate(np.array(PROMPT))[0].tolist()
    assert theirs == ours and len(ours) < len(PROMPT[0]) + 16  # ended at its eos, past min_new_tokens
