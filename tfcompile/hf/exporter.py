"""``tfcompile export-hf``: a run -> a folder that ``transformers``' ``AutoModel*.from_pretrained``
loads with no code of tfcompile's, in the on-disk names and config keys that transformers 4 and 5
both read.

    config.json               the architecture and its sizes (RoPE both as transformers 4 and 5 write it)
    generation_config.json    the special token ids generation uses
    model.safetensors         the weights, each tied tensor once (sharded past 5 GB, with an index)
    tokenizer.json            the run's tokenizer, with tokenizer_config.json naming its special tokens
    preprocessor_config.json  image models: resize, rescale and normalisation
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, processors

from tfcompile.destination import check_not_a_file, check_outside, move_into_place, staging_folder
from tfcompile.errors import ExportError
from tfcompile.files import PREPROCESSING_FILE, TOKENIZER_FILE, atomic_write_text
from tfcompile.hf import families  # noqa: F401 (registers every architecture)
from tfcompile.hf.architecture import ARCHITECTURES, Writable
from tfcompile.hf.errors import HFError, Problem, refuse
from tfcompile.hf.folder import (
    CONFIG,
    GENERATION_CONFIG,
    PREPROCESSOR_CONFIG,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    TOKENIZER_CONFIG,
    write_json,
    write_weights,
)
from tfcompile.hf.importer import GENERATION_DEFAULTS, ROLES, affixes, imported_from
from tfcompile.manifest import DEFAULT_MAX_NEW_TOKENS, DEFAULT_TEMPERATURE
from tfcompile.sequences import SPECIAL_ROLES
from tfcompile.spec import Spec
from tfcompile.spec.schema import CausalLMTask, EncoderSpec, Seq2SeqTask, sliding_layers
from tfcompile.tasks.causal_lm import bans as text_bans
from tfcompile.tasks.seq2seq import bans as translation_bans
from tfcompile.tasks.task import listed_token_ids
from tfcompile.train.runs import load_trained_model

MAX_SHARD_BYTES = 5 * 1024**3  # as save_pretrained shards
WRITTEN_BY = "4.57.0"  # the oldest transformers the folders are tested with


def candidates(spec: Spec) -> list[Writable]:
    """The architectures whose to write the spec is (one at most: families.py)."""
    writers = [a for a in dict.fromkeys(ARCHITECTURES.values()) if isinstance(a, Writable)]
    return [a for a in writers if a.candidate(spec)]


def architecture_for(spec: Spec, where: str) -> Writable:
    """The architecture that writes the spec's model; an HFError lists why none can."""
    found_candidates = candidates(spec)
    problems: list[Problem] = []
    for candidate in found_candidates:
        found = window_problems(candidate, spec) + prefix_problems(spec) + candidate.exportable(spec)
        if not found:
            return candidate
        problems += found
    if not found_candidates:
        problems.append(
            Problem(
                "model.family",
                f"a {spec.model.family} model for {spec.task.type} has no transformers architecture here",
                "export-hf writes GPT-2, GPT-Neo, OPT, GPT-BigCode, Llama, Mistral, Qwen2, Qwen3, OLMo 2, "
                "SmolLM3, Granite, Arcee, Phi-3, GLM, GLM-4, Gemma, Gemma 2, Gemma 3, GPT-NeoX, Starcoder2, "
                "BLOOM, BERT, ELECTRA, ALBERT, ModernBERT, ViT, T5, Marian, Pegasus, BART, mBART and "
                "M2M100 models",
            )
        )
    raise refuse(where, problems)


def window_problems(architecture: Writable, spec: Spec) -> list[Problem]:
    """The spec's sliding window, where the architecture's config.json cannot say it."""
    model = spec.model
    window = getattr(model, "window", None)  # a decoder's or an encoder's
    if window is None or architecture.windows == "any":
        return []
    name = type(architecture).__name__
    if architecture.windows == "every":
        if sliding_layers(window, model.n_layers) == set(range(model.n_layers)):
            return []
        message = f"{window.layers}: {name} slides every layer"
        return [Problem("model.window.layers", message, "every layer")]
    return [Problem("model.window", f"{name} has no sliding window", "leave it unset")]


def prefix_problems(spec: Spec) -> list[Problem]:
    """transformers' generate() forces one token after the decoder's start (forced_bos_token_id)."""
    given = spec.task.target_prefix if isinstance(spec.task, Seq2SeqTask) else []
    if len(given) <= 1:
        return []
    message = f"gives the decoder {len(given)} tokens after its start; transformers forces one at most"
    return [Problem("task.target_prefix", message, "one token (forced_bos_token_id), or none")]


def sampling(task: Any) -> dict[str, Any]:
    """A causal LM task's generation defaults, where they are not tfcompile's own (sampling at
    temperature 1 from every token, 200 new tokens, no repetition penalty), as
    generation_config.json's fields (what the importer reads back): greedy is do_sample false;
    other sampling, do_sample with the temperature, top_k (0: every token), top_p and min_p."""
    if not isinstance(task, CausalLMTask):
        return {}
    out: dict[str, Any] = {}
    out |= {} if task.max_new_tokens == DEFAULT_MAX_NEW_TOKENS else {"max_new_tokens": task.max_new_tokens}
    out |= {} if task.repetition_penalty == 1 else {"repetition_penalty": task.repetition_penalty}
    if task.temperature == 0:
        return out | {"do_sample": False}
    if (
        task.temperature == DEFAULT_TEMPERATURE
        and task.top_k is None
        and task.top_p is None
        and not task.min_p
    ):
        return out
    return out | {
        "do_sample": True,
        "temperature": task.temperature,
        "top_k": task.top_k or 0,
        "top_p": task.top_p or 1.0,
        **({"min_p": task.min_p} if task.min_p else {}),
    }


def decoding(task: Any) -> dict[str, Any]:
    """A translator's length limit and beam search as generation_config.json's fields (what the
    importer reads back): max_decode_len is max_new_tokens; where the beam search is generate()'s
    (task.beam_scoring transformers), num_beams, length_penalty and early_stopping off
    generate()'s defaults. fairseq's beam search has no such fields: its folder's generate()
    decodes greedily, as with one beam."""
    if not isinstance(task, Seq2SeqTask):
        return {}
    limit = {"max_new_tokens": task.max_decode_len}
    if task.beam_scoring != "transformers":
        return limit
    out = {
        "num_beams": task.beam,
        "length_penalty": task.length_penalty,
        "early_stopping": task.early_stopping,
    }
    return limit | {k: v for k, v in out.items() if v != GENERATION_DEFAULTS[k]}


def bans(task: Any, run: Path, eos: int | None) -> dict[str, Any]:
    """A translator's or a language model's bans (tasks.seq2seq.bans, tasks.causal_lm.bans), where
    it has them, as generation_config.json's fields (what the importer reads back): min_decode_len
    or min_new_tokens is min_new_tokens, a language model's min_length min_length, suppressed_tokens
    suppress_tokens and banned_sequences bad_words_ids (ids of the run's tokenizer)."""
    try:
        if isinstance(task, Seq2SeqTask):
            banned = translation_bans(task, run, eos, ExportError)
        elif isinstance(task, CausalLMTask):
            banned = text_bans(task, run, [] if eos is None else [eos], ExportError)
        else:
            return {}
    except ExportError as error:
        raise HFError(f"{run}: suppress_tokens and bad_words_ids: {error}") from None
    out = {
        "min_new_tokens": banned.min_len,
        "min_length": banned.min_total,
        "no_repeat_ngram_size": banned.no_repeat_ngram,
    }
    lists = {"suppress_tokens": list(banned.suppressed), "bad_words_ids": [list(s) for s in banned.sequences]}
    return {k: v for k, v in (out | lists).items() if v}


def export_hf(run: Path, out: Path, which: str = "best", force: bool = False) -> str:
    """Write the run's ``which`` checkpoint to ``out`` as a transformers folder; returns the
    transformers class that loads it."""
    spec, model = load_trained_model(run, which)
    architecture = architecture_for(spec, str(run))
    replaced = destination(run, out, force)
    config = architecture.to_config(spec) | {"torch_dtype": "float32", "transformers_version": WRITTEN_BY}
    state = without_vocabulary_padding({name: t.detach() for name, t in model.state_dict().items()}, spec)
    tensors = architecture.from_state(state, spec)
    tokens = token_ids(spec, run)
    if problems := architecture.token_problems(spec, tokens):
        raise refuse(str(run), problems)
    # A role the run lacks (every role, without a tokenizer) is null, not the config class's default
    # id, which may lie past the vocabulary (SmolLM3's pad id, 128004).
    config |= {f"{role}_token_id": tokens.get(role) for role in ("bos", "eos", "pad")}
    config |= {name: tokens.get(role) for role in ("cls", "sep") if (name := f"{role}_token_id") in config}
    if config.get("is_encoder_decoder") and "bos" in tokens:  # the decoder's first input
        config["decoder_start_token_id"] = tokens["bos"]
    if isinstance(spec.task, Seq2SeqTask) and spec.task.target_prefix:  # the one prefix_problems allows
        role = spec.task.target_prefix[0]
        if role not in tokens:
            raise HFError(f"{run}: the run's tokenizer holds no token for task.target_prefix's {role}")
        config["forced_bos_token_id"] = tokens[role]
    stops: list[int] = []
    if isinstance(spec.task, CausalLMTask) and spec.task.stop_tokens:  # generate() stops at each
        try:
            stops = listed_token_ids(spec.task, "stop_tokens", run)
        except ExportError as error:
            raise HFError(
                f"{run}: the run's tokenizer holds no token of task.stop_tokens for eos_token_id: {error}"
            ) from None
        eos = [tokens["eos"]] if "eos" in tokens else []
        config["eos_token_id"] = list(dict.fromkeys([*eos, *stops]))
    if isinstance(spec.task, Seq2SeqTask):  # null, not the BART family's class default: its eos
        config["forced_eos_token_id"] = tokens.get("eos") if spec.task.forced_eos else None  # as eos_token_id
    # generate()'s settings beside the token ids
    choices = sampling(spec.task) | decoding(spec.task) | bans(spec.task, run, tokens.get("eos"))
    tmp = staging_folder(out)
    try:
        write_json(tmp / CONFIG, config)
        write_weights(tmp, tensors, MAX_SHARD_BYTES)
        generation = {k: v for k, v in config.items() if k.endswith("_token_id")} | choices
        if isinstance(spec.task, CausalLMTask) and not spec.task.stop_at_eos:  # its stop tokens alone
            generation["eos_token_id"] = stops or None
        write_json(tmp / GENERATION_CONFIG, generation | {"transformers_version": WRITTEN_BY})
        if (run / TOKENIZER_FILE).exists():
            write_tokenizer(spec, run, tmp / TOKENIZER_FILE)
            write_json(tmp / TOKENIZER_CONFIG, tokenizer_config(spec, run))
        preprocessing = run / PREPROCESSING_FILE
        processor = architecture.preprocessor(
            spec, json.loads(preprocessing.read_text()) if preprocessing.exists() else None
        )
        if processor is not None:
            write_json(tmp / PREPROCESSOR_CONFIG, processor)
        move_into_place(tmp, out, replaced)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(config["architectures"][0])


# The tensors with a row per token: a decoder pads them to model.vocab_multiple_of.
VOCABULARY_TABLES = ("embed.weight", "lm_head.weight", "lm_head.bias")


def without_vocabulary_padding(state: dict[str, torch.Tensor], spec: Spec) -> dict[str, torch.Tensor]:
    """The token tables cut back to vocab_size rows: the padded rows are never used, and the folder
    is written as if there were none (config vocab_size = the tokenizer's, as transformers' GPT-2
    has it), so its logits are the run's and its tokenizer covers every row."""
    rows = spec.model.vocab_size
    return {name: t[:rows] if name in VOCABULARY_TABLES else t for name, t in state.items()}


def destination(run: Path, out: Path, force: bool) -> bool:
    """Whether ``out`` holds a folder export-hf wrote, which the export replaces (with ``force``); a
    missing or empty folder is fine. Anything else is refused, untouched: a file or link, the run
    or a folder inside it (links followed), the folder the run was imported from (it holds the
    same file names), a folder holding files export-hf does not write."""
    check_not_a_file(out, HFError)
    check_outside(run, out, HFError, "run")
    if (source := imported_from(run)) is not None and source == out.resolve():
        raise HFError(
            f"{out} is the folder {run} was imported from: export-hf never replaces a run's source, even "
            f"with --force; choose another --out"
        )
    if not out.exists() or not any(out.iterdir()):
        return False
    if not (out / CONFIG).exists():
        raise HFError(f"{out} holds files but no {CONFIG}: it is left untouched; choose another --out")
    others = sorted(p.name for p in out.iterdir() if not written_here(p))
    if others:
        raise HFError(
            f"{out} holds files export-hf does not write ({', '.join(others[:5])}); it is left "
            f"untouched: move them, or choose another --out"
        )
    if not force:
        raise HFError(f"{out} already holds a model: pass --force to replace it, or choose another --out")
    return True


# What export-hf writes into its folder: the files it replaces with --force.
WRITTEN = {
    CONFIG,
    GENERATION_CONFIG,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    TOKENIZER_FILE,
    TOKENIZER_CONFIG,
    PREPROCESSOR_CONFIG,
}
SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def written_here(path: Path) -> bool:
    """Whether ``path`` is a file export-hf writes (a link or folder never is)."""
    name = path.name
    return path.is_file() and not path.is_symlink() and (name in WRITTEN or SHARD.fullmatch(name) is not None)


def special_strings(spec: Spec, run: Path) -> dict[str, str]:
    """Role -> token string: the spec's ``tokens`` section, else tfcompile's own strings where the
    tokenizer has them."""
    if spec.tokens is not None:
        return spec.tokens.roles()
    vocab = json.loads((run / TOKENIZER_FILE).read_text()) if (run / TOKENIZER_FILE).exists() else {}
    present = {t["content"] for t in vocab.get("added_tokens", [])}
    return {role: token for token, role in SPECIAL_ROLES.items() if token in present}


def token_ids(spec: Spec, run: Path) -> dict[str, int]:
    """Role -> id in the run's tokenizer (tfcompile's translation starts the target with its bos,
    [BOS]; an imported T5 names <pad> there)."""
    if not (run / TOKENIZER_FILE).exists():
        return {}
    tokenizer = Tokenizer.from_file(str(run / TOKENIZER_FILE))
    ids = {role: tokenizer.token_to_id(token) for role, token in special_strings(spec, run).items()}
    return {role: i for role, i in ids.items() if i is not None}


def write_tokenizer(spec: Spec, run: Path, path: Path) -> None:
    """The run's tokenizer.json; a translator's made to put around a text what the run puts around
    a source (``task.source_prefix`` and ``source_suffix``), so that a transformers user encodes a
    source with the tokenizer alone (T5's appends </s>, BART's puts <s> before it)."""
    roles = special_strings(spec, run)
    saved = json.loads((run / TOKENIZER_FILE).read_text(encoding="utf-8"))
    task = spec.task
    if not isinstance(task, Seq2SeqTask) or affixes(saved, roles) == (task.source_prefix, task.source_suffix):
        shutil.copyfile(run / TOKENIZER_FILE, path)
        return
    prefix: list[str] = list(task.source_prefix)
    suffix: list[str] = list(task.source_suffix)
    # Its post-processor adds what the run does not (an edited T5 spec, BERT's [CLS]) or not what it
    # does: the run's prefix and suffix replace it, after a ByteLevel one (which only trims offsets).
    tokenizer = Tokenizer.from_str(json.dumps(saved))
    head, tail = (" ".join(roles[role] for role in side) for side in (prefix, suffix))
    template = (
        processors.TemplateProcessing(
            single=f"{head} $A {tail}".strip(),
            pair=f"{head} $A {tail} $B {tail}".strip(),
            special_tokens=[
                (roles[role], tokenizer.token_to_id(roles[role])) for role in dict.fromkeys(prefix + suffix)
            ],
        )
        if prefix or suffix
        else None
    )
    kept = (
        tokenizer.post_processor if (saved.get("post_processor") or {}).get("type") == "ByteLevel" else None
    )
    steps = [s for s in (kept, template) if s is not None]
    tokenizer.post_processor = processors.Sequence(steps) if len(steps) > 1 else (steps[0] if steps else None)
    atomic_write_text(path, tokenizer.to_str())


def tokenizer_config(spec: Spec, run: Path) -> dict[str, Any]:
    """What ``AutoTokenizer`` needs besides tokenizer.json: the class, the inputs the model reads,
    and the special tokens."""
    roles = special_strings(spec, run)
    # The inputs the model reads, named: PreTrainedTokenizerFast's default is token_type_ids too in
    # transformers 4 (GPT-2 and GPT-BigCode add them through their token embeddings; T5, a
    # one-segment BERT's pair and generate() fail on them) and none in 5 (a sentence pair would
    # reach BERT as one segment).
    segments = isinstance(spec.model, EncoderSpec) and bool(spec.model.type_vocab_size)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.model.max_seq_len,
        "model_input_names": ["input_ids", *(["token_type_ids"] if segments else []), "attention_mask"],
    } | {f"{role}_token": token for role, token in roles.items() if role in ROLES}
