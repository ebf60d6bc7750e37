"""``tfcompile import``: a ``save_pretrained`` folder -> a readable spec and a run folder.

    specs/NAME.yaml                         the model and task sections, as a person would write them
    runs/NAME/spec.yaml                     the resolved spec (what ``train`` writes)
    runs/NAME/tokenizer.json                the folder's tokenizer, less a saved truncation and padding
    runs/NAME/preprocessing.json            image models: size, channels, mean and std
    runs/NAME/checkpoints/step-000000/      the weights (``last`` and ``best`` point there)
    runs/NAME/import.json                   where they came from: folder, model type, sha256 of each file

Nothing of transformers is imported: the config is JSON, the weights safetensors (or a pickle
read with ``weights_only``), the tokenizer the ``tokenizers`` library's own file.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from tokenizers import Tokenizer

from tfcompile.destination import check_outside
from tfcompile.expansion import excess
from tfcompile.files import PREPROCESSING_FILE, TOKENIZER_FILE, atomic_write_text, make_folder_beside
from tfcompile.hf import families, vit  # noqa: F401 (families registers every architecture)
from tfcompile.hf.architecture import (
    ARCHITECTURES,
    Architecture,
    Config,
    Tensors,
    source,
    unread_chunks,
    unread_window,
)
from tfcompile.hf.errors import HFError, HFWarning, Problem, refuse
from tfcompile.hf.folder import (
    CONFIG,
    GENERATION_CONFIG,
    PREPROCESSOR_CONFIG,
    RESAVE,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    read_json,
    read_optional_json,
    read_weights,
    weight_files,
    write_json,
)
from tfcompile.images import ImagePreprocessing
from tfcompile.manifest import (
    MAX_BANNED_SEQUENCE,
    MAX_BANNED_SEQUENCES,
    MAX_BEAM,
    MAX_LENGTH_PENALTY,
    MAX_NEW_TOKENS,
    REPETITION_PENALTIES,
)
from tfcompile.memory import TooLarge
from tfcompile.runtime.session import id_span
from tfcompile.spec import Spec, SpecError, dump_spec, parse_spec
from tfcompile.spec.schema import TASK_SECTIONS, check_run_name
from tfcompile.tasks.task import build_model
from tfcompile.train.checkpoint import save_initial_checkpoint
from tfcompile.train.runs import SPEC_FILE

IMPORT_RECORD = "import.json"
ROLES = ("pad", "unk", "bos", "eos", "cls", "sep", "mask")
QUANTIZED = "quantization_config"
# The files of transformers' slow tokenizers (sentencepiece, WordPiece, byte-level BPE).
OTHER_TOKENIZERS = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.txt", "vocab.json")
CANNOT_HOLD = "tfcompile's spec cannot hold this model; import another"


@dataclass(frozen=True)
class ImportResult:
    spec_path: Path
    run_dir: Path
    spec: Spec
    model_type: str
    architecture: str


def import_folder(folder: Path, name: str, specs_dir: Path, runs_dir: Path) -> ImportResult:
    """Convert the ``save_pretrained`` folder into ``specs_dir/NAME.yaml`` and ``runs_dir/NAME``;
    an HFError names every config field or tensor that cannot be converted, before anything is
    written."""
    try:
        check_run_name(name)
    except ValueError as e:
        raise HFError(f"--name {name!r}: {e}") from None
    run_dir, spec_path = runs_dir / name, specs_dir / f"{name}.yaml"
    for path, flag in ((run_dir, "--runs"), (spec_path, "--specs")):  # the folder it reads is left as it is
        check_outside(folder, path, HFError, "Hugging Face folder", flag)
        if path.parent.exists() and not path.parent.is_dir():  # else an OSError: "File exists"
            raise HFError(f"{flag} {path.parent} is not a folder: choose a folder (it is made if missing)")
    # the run may be an empty folder (made for it); the spec nothing at all
    for path, free in ((run_dir, run_dir.is_dir() and not any(run_dir.iterdir())), (spec_path, False)):
        if path.exists() and not free:
            raise HFError(f"{path} exists: choose another --name, or remove it")
    data = read_json(folder / CONFIG)
    head_class = head_classof(data, folder)
    model_type = str(data.get("model_type"))
    converter = ARCHITECTURES[model_type]
    tensors = Tensors(normalise(read_weights(folder), converter), str(folder))
    config = Config(data).aliased(converter.aliases_for(model_type))
    imported = converter.read(config, head_class, tensors)
    if converter.caches:
        if not converter.reads_window:
            unread_window(config, imported.model.get("max_seq_len"))
        unread_chunks(converter.cached_config(config), imported.model.get("max_seq_len"))
    if config.problems:
        raise refuse(str(folder / CONFIG), config.problems)
    sections: dict[str, Any] = {"model": imported.model, "task": imported.task}
    check_tokenizer(folder)
    warn_of_half_precision(data)
    vocabulary, generation = token_strings(folder), Generation.of(folder, data)  # each read once
    tokens = special_tokens(folder, generation, imported.decoder_start, vocabulary)
    if imported.pad_positions is not None:
        pad_positions(str(folder / CONFIG), imported.pad_positions, tokens, vocabulary)
    decoding: dict[str, Any] = {}  # the task's fields of how the files set generate() to decode
    if imported.decoder_start:
        codes, target_prefix = language_codes(folder, generation, tokens, vocabulary)
        tokens |= codes
        decoding = {"target_prefix": target_prefix} if target_prefix else {}
        if forced_end(generation, imported.forced_eos, tokens, vocabulary):
            decoding["forced_eos"] = True
        decoding |= decoding_limits(generation, imported.model["max_seq_len"])
        longest = decoding.get("max_decode_len", max(imported.model["max_seq_len"] - 1, 1))
        decoding |= decoding_bans(generation, tokens, vocabulary, imported.model.get("vocab_size"), longest)
    fields = TASK_SECTIONS[imported.task["type"]].model_fields
    if "stop_tokens" in fields:
        decoding |= stop_tokens(generation, tokens, vocabulary, imported.model.get("vocab_size"))
    if "temperature" in fields:
        decoding |= sampling_defaults(generation)
        stops = [tokens["eos"]] if "eos" in tokens and decoding.get("stop_at_eos", True) else []
        decoding |= generation_bans(
            generation,
            stops + decoding.get("stop_tokens", []),
            vocabulary,
            imported.model.get("vocab_size"),
            decoding.get("max_new_tokens", fields["max_new_tokens"].default),
        )
        warn_unapplied(
            generation, UNAPPLIED_BY_LANGUAGE_MODELS, "tfcompile's generation does not (one token a step)"
        )
        if generation.field("do_sample")[0]:
            warn_unapplied(generation, UNAPPLIED_SAMPLING, "tfcompile's sampling does not")
    if tokens:
        sections["tokens"] = tokens
    if "source_suffix" in imported.task and (around := source_affixes(folder, tokens)) is not None:
        prefix, suffix = around
        sections["task"] = {
            **imported.task,
            **({"source_prefix": prefix} if prefix else {}),
            "source_suffix": suffix,
        }
    sections["task"] = sections["task"] | decoding
    text = readable_spec(sections, folder, name, runs_dir)
    try:
        spec = parse_spec(text, source=str(spec_path))
    except SpecError as e:  # sizes transformers accepts and the spec's rules do not
        sources = config.named(converter.sources | imported.sources)
        raise refuse(str(folder / CONFIG), spec_problems(e, sources)) from None
    preprocessing = image_preprocessing(folder, spec)
    if preprocessing is None and not (folder / TOKENIZER_FILE).exists():
        warn_without_tokenizer(folder)
    check_tokens_fit(folder, spec)
    state = converter.to_state(tensors, spec)
    left = tensors.left()
    if left:
        shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        raise HFError(
            f"{folder}: the checkpoint holds tensors a {head_class} does not read: {shown}; "
            f"is config.json the checkpoint's own?"
        )
    model = load_state(spec, state, folder)
    record = {
        "source": str(folder.resolve()),
        "model_type": model_type,
        "architecture": head_class,
        "transformers_version": data.get("transformers_version"),
        "source_dtype": data.get("dtype", data.get("torch_dtype")),
        "files": {p.name: sha256(p) for p in weight_files(folder)},
    }
    write_run(run_dir, spec, model, folder, preprocessing, record)
    specs_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(spec_path, text)
    return ImportResult(spec_path, run_dir, spec, model_type, head_class)


def imported_from(run: Path) -> Path | None:
    """The folder ``run`` was imported from, as its import.json records it; None for a run trained
    here (or a record that does not say)."""
    try:
        source = json.loads((run / IMPORT_RECORD).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(source) if isinstance(source, str) else None


def spec_problems(error: SpecError, sources: dict[str, str]) -> list[Problem]:
    """The spec's refusals of values read from config.json, each named by the config field it was
    read from (and the spec field it became)."""
    problems = []
    for issue in error.issues:
        field = source(issue.path, sources)
        named = f"{field} (the spec's {issue.path})" if field else issue.path
        problems.append(Problem(named, f"{issue.message}, in the spec written from it", CANNOT_HOLD))
    return problems


def head_classof(data: dict[str, Any], folder: Path) -> str:
    """The head class the folder was saved from; refused: a model type without a converter, a
    quantized checkpoint, a config that names no class."""
    model_type = data.get("model_type")
    problems = []
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        problems.append(
            Problem(
                "model_type", f"{model_type!r} has no converter", f"tfcompile imports {sorted(ARCHITECTURES)}"
            )
        )
    if data.get(QUANTIZED):
        problems.append(
            Problem(
                QUANTIZED, "the weights are quantized", "import the float checkpoint the model was made from"
            )
        )
    names = data.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(Problem("architectures", f"{names!r} is not a list of class names", RESAVE))
    elif not names:
        problems.append(
            Problem(
                "architectures",
                "is missing: the config does not say which head the weights are for",
                "save the model (not its config alone) with model.save_pretrained(DIR)",
            )
        )
    elif len(names) > 1:
        problems.append(Problem("architectures", f"names several classes {names}", "keep the one saved"))
    if problems:
        raise refuse(str(folder / CONFIG), problems)
    return str(names[0])


def normalise(tensors: dict[str, torch.Tensor], converter: Architecture) -> dict[str, torch.Tensor]:
    """Names as the converter reads them: the body's prefix (``transformer.``, ``bert.``, ...)
    removed where a head class wrote it, TensorFlow-era ``gamma``/``beta`` as ``weight``/``bias``,
    buffers that hold no weights dropped."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(converter.ignored):
            continue
        for prefix in converter.prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[name] = tensor
    return out


def special_tokens(
    folder: Path, files: Generation, decoder_start: bool, vocabulary: dict[int, str]
) -> dict[str, str]:
    """The special tokens by role, as the tokenizer's files say (and, for a role they leave
    out, the config's token ids); with ``decoder_start`` (a translator's) the bos is what its
    decoder starts with, ``decoder_start_token_id`` where the config has one (T5's pad, BART's
    </s>), whatever the tokenizer calls its bos. ``vocabulary``: the tokenizer's strings."""
    tokenizer = read_optional_json(folder / TOKENIZER_CONFIG) | read_optional_json(
        folder / SPECIAL_TOKENS_MAP
    )
    generation, config = files.saved or {}, files.config
    start = generation.get("decoder_start_token_id", config.get("decoder_start_token_id"))
    roles: dict[str, str] = {}
    for role in ROLES:
        value = tokenizer.get(f"{role}_token")
        token = value.get("content") if isinstance(value, dict) else value
        if role == "bos" and decoder_start and isinstance(start, int):
            token = vocabulary.get(start)
        elif token is None:
            token_id = generation.get(f"{role}_token_id", config.get(f"{role}_token_id"))
            token = vocabulary.get(token_id) if isinstance(token_id, int) else None
        if isinstance(token, str) and token in vocabulary.values():
            roles[role] = token
    return roles


def pad_positions(where: str, pad: int, tokens: dict[str, str], vocabulary: dict[int, str]) -> None:
    """A model whose positions skip every token that is the pad id (RoBERTa's, M2M100's) computes
    as tfcompile's, which numbers the tokens its mask marks real, only where that token is padding
    alone: the tokenizer's pad token and none of its other roles' (an eos that is the pad id ends
    every source without a position, and shifts none after it in tfcompile). Without a tokenizer
    there is nothing to hold."""
    token = vocabulary.get(pad)
    if not vocabulary or token is None:
        return
    problems = []
    if tokens.get("pad") != token:
        problems.append(
            Problem(
                "pad_token_id",
                f"is {pad} ({token!r}), and the tokenizer pads with {tokens.get('pad')!r}: the model gives "
                f"no position to {token!r} wherever it stands, tfcompile to padding alone",
                "set it to the tokenizer's pad token's id",
            )
        )
    for role, other in tokens.items():
        if role != "pad" and other == token:
            problems.append(
                Problem(
                    "pad_token_id",
                    f"is {pad}, the tokenizer's {role} token ({token!r}), which the model gives no position",
                    f"import a model whose pad id is no other token's (the {role}'s is {token!r})",
                )
            )
    if problems:
        raise refuse(where, problems)


def source_affixes(folder: Path, tokens: dict[str, str]) -> Affixes | None:
    """The roles of the special tokens the folder's tokenizer puts before and after one text,
    which a translator puts around every source (``affixes``); None (the architecture's
    convention) when there is no tokenizer.json."""
    path = folder / TOKENIZER_FILE
    return affixes(read_json(path), tokens) if path.exists() else None


Affixes = tuple[list[str], list[str]]  # the roles before a text, and after it
# The role a special token plays before a text (BART's <s> is its cls) and after it (its </s>,
# also its sep and its decoder's start, is its eos): the first of these whose token it is.
BEFORE = ("cls", "bos", "sep", "eos", "pad", "unk", "mask", "source_language")
AFTER = ("eos", "sep", "bos", "cls", "pad", "unk", "mask", "source_language")
# Post-processors of one form, [cls] $A [sep], by the fields naming their two tokens.
FIXED_AROUND = {"RobertaProcessing": ("cls", "sep"), "BertProcessing": ("cls", "sep")}


def affixes(saved: dict[str, Any], tokens: dict[str, str]) -> Affixes | None:
    """The roles (``tokens``: role -> token) of the special tokens a tokenizer's post-processor puts
    before one text and after it: its single template's tokens around the text (T5's "$A </s>" is
    ([], ["eos"]), BART's "<s> $A </s>" (["cls"], ["eos"]), NLLB's "eng_Latn $A </s>"
    (["source_language"], ["eos"]) where tokens names eng_Latn so), or RoBERTa's and BERT's
    processors' cls and sep; ([], []) when it has no post-processor; None when it has another, or
    tokens of no role."""
    around = framing(saved)
    if around is None:
        return None
    roles: list[list[str]] = []
    for side, order in zip(around, (BEFORE, AFTER), strict=True):
        found = [next((r for r in order if tokens.get(r) == token), None) for token in side]
        if None in found:
            return None
        roles.append([r for r in found if r is not None])
    return roles[0], roles[1]


def framing(saved: dict[str, Any]) -> tuple[list[str], list[str]] | None:
    """The special tokens a tokenizer's post-processor puts before one text and after it (see
    ``affixes``); None when it puts them otherwise."""
    processor = saved.get("post_processor")
    if processor is None:
        return [], []
    if not isinstance(processor, dict):
        return None
    if processor.get("type") in FIXED_AROUND:
        # each field a [token, id] pair: [cls] $A [sep], as a template
        around = [processor.get(field) for field in FIXED_AROUND[processor["type"]]]
        before, after = (
            {"SpecialToken": {"id": t[0]}} if isinstance(t, list) and t else None for t in around
        )
        single: Any = [before, {"Sequence": {"id": "A"}}, after]
    elif processor.get("type") == "TemplateProcessing":
        single = processor.get("single")
    else:
        return None
    if not isinstance(single, list):
        return None
    text = [i for i, piece in enumerate(single) if isinstance(piece, dict) and "Sequence" in piece]
    if len(text) != 1:
        return None  # no text, or a pair's two
    sides: list[list[str]] = []
    for side in (single[: text[0]], single[text[0] + 1 :]):
        specials = [piece.get("SpecialToken") if isinstance(piece, dict) else None for piece in side]
        tokens = [special.get("id") if isinstance(special, dict) else None for special in specials]
        if not all(isinstance(token, str) for token in tokens):  # a damaged template: not framing
            return None
        sides.append([str(token) for token in tokens])
    return sides[0], sides[1]


def language_codes(
    folder: Path, generation: Generation, tokens: dict[str, str], vocabulary: dict[int, str]
) -> tuple[dict[str, str], list[str]]:
    """A translator's language codes, as its files say -> (the roles to add to ``tokens``, the
    task's target_prefix). Its source's: the one special token of no role that its tokenizer's
    post-processor puts around a text (NLLB's and mBART-50's eng_Latn / en_XX before it,
    mBART's after its </s>), ``source_language`` (more than one: a warning, as the spec cannot
    place them). Its target's: the token generate() forces after the decoder's start
    (``forced_bos_token_id``: NLLB's and M2M100's target language, BART-large-CNN's <s>, its cls),
    ``target_language`` where it is no cls. Refused by field where transformers 4 and 5 would force
    different tokens, one the tokenizer lacks, or its eos (which ends every translation empty)."""
    added: dict[str, str] = {}
    path = folder / TOKENIZER_FILE
    around = framing(read_json(path)) if path.exists() else None
    if around is not None:
        codes = list(dict.fromkeys(token for token in around[0] + around[1] if token not in tokens.values()))
        if len(codes) == 1:
            added["source_language"] = codes[0]
        elif codes:
            warnings.warn(
                f"{path}: its template puts {len(codes)} special tokens of no role around a text "
                f"({', '.join(map(repr, codes))}), which a spec cannot place: the import frames a source as "
                f"the model type does, so translations differ from transformers' with this tokenizer",
                HFWarning,
                stacklevel=2,
            )
    forced, where = forced_start(generation), generation.where
    if forced is None:
        return added, []
    if not vocabulary:
        warnings.warn(
            f"{where}: forced_bos_token_id {forced}, which transformers' generate() puts after the decoder's "
            f"start, is not applied: with no tokenizer.json there is no token to name; set "
            f"task.target_prefix: [target_language] and tokens.target_language to its string",
            HFWarning,
            stacklevel=2,
        )
        return added, []
    token = vocabulary.get(forced)
    if token is None or token == tokens.get("eos"):
        why = (
            "no token of the tokenizer's"
            if token is None
            else f"its eos ({token!r}), which ends every translation"
        )
        fix = "set it to a token's id, or leave it out"
        raise refuse(where, [Problem("forced_bos_token_id", f"is {forced}, {why}", fix)])
    if tokens.get("cls") == token:
        return added, ["cls"]
    return added | {"target_language": token}, ["target_language"]


# The generation fields transformers 4 reads from config.json (PretrainedConfig's global generation
# defaults), but forced_eos_token_id, which the BART family's config classes set by default.
GENERATION_DEFAULTS: dict[str, Any] = {
    "max_length": 20,
    "min_length": 0,
    "do_sample": False,
    "early_stopping": False,
    "num_beams": 1,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "typical_p": 1.0,
    "repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "num_return_sequences": 1,
    "output_scores": False,
    "return_dict_in_generate": False,
    "forced_bos_token_id": None,
    "remove_invalid_values": False,
    "exponential_decay_length_penalty": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
}
# generate()'s defaults (4's) for its fields that change what it chooses which config.json's
# global defaults lack.
LATER_DEFAULTS: dict[str, Any] = {
    "min_p": None,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
    "forced_eos_token_id": None,
    "encoder_repetition_penalty": 1.0,
    "sequence_bias": None,
    "force_words_ids": None,
    "penalty_alpha": None,
    "dola_layers": None,
    "guidance_scale": None,
    "stop_strings": None,
    "token_healing": False,
    "watermarking_config": None,
}


@dataclass(frozen=True)
class Generation:
    """What generate() reads from a folder, read once: generation_config.json's fields (``saved``)
    where the folder has one, else config.json's (``config``): ``where`` names the file.
    Transformers 4 takes a config class's default where config.json has none, and where
    generation_config.json was made from the model's config and config.json holds generation
    fields off their defaults (``rebuilt``), it rebuilds it from config.json."""

    folder: Path
    config: dict[str, Any]
    saved: dict[str, Any] | None
    rebuilt: bool

    @classmethod
    def of(cls, folder: Path, config: dict[str, Any]) -> Generation:
        path = folder / GENERATION_CONFIG
        saved = read_json(path) if path.exists() else None
        rebuilt = (saved or {}).get("_from_model_config") is True and any(
            key in config and config[key] is not None and config[key] != value
            for key, value in GENERATION_DEFAULTS.items()
        )
        return cls(folder, config, saved, rebuilt)

    @property
    def where(self) -> str:
        return str(self.folder / (CONFIG if self.saved is None else GENERATION_CONFIG))

    def gives(self, name: str) -> bool:
        """Whether the file transformers 5 reads the field from holds it (null included)."""
        return name in (self.config if self.saved is None else self.saved)

    def field(self, name: str, default: Any = None) -> tuple[Any, Any]:
        """The field as transformers 5 and 4 read it (``default``: the config class's)."""
        five = self.config.get(name) if self.saved is None else self.saved.get(name)
        four = self.config.get(name, default) if self.rebuilt or self.saved is None else five
        return five, four

    def token(self, name: str, default: int | None = None) -> tuple[int | None, int | None]:
        """``field``'s token id (forced_bos_token_id, forced_eos_token_id); refused by field: a
        value that is no token id."""
        five, four = self.field(name, default)
        for value in (five, four):
            if value is not None and not count(value):
                raise refuse(
                    self.where, [Problem(name, f"is {value!r}, no token id", "a token's id, or null")]
                )
        return five, four


def count(value: Any, least: int = 0) -> bool:
    """Whether a JSON value is a whole number of at least ``least`` (true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def number(value: Any, low: float, high: float) -> bool:
    """Whether a JSON value is a number from ``low`` to ``high`` (true and false are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high


def decoding_limits(generation: Generation, max_seq_len: int) -> dict[str, Any]:
    """How a translator's files set generate() to decode, as the task's fields: generate()'s beam
    search (task.beam_scoring transformers) with num_beams its beam (1, greedy, where the files
    leave it out, as generate()), length_penalty and early_stopping; max_new_tokens (else
    max_length, less the decoder's start) its max_decode_len, at most max_seq_len - 1 (the
    positions the model has; where the files set neither, the task's default, not transformers'
    max_length 20). Refused by field: a value that is no count, a beam past the spec's largest, a
    length penalty past tfcompile's bound, an early_stopping that is not true, false or "never".
    The fields that change generate()'s choices that the task has none for (``UNAPPLIED``), set off
    their defaults, are warned of."""
    fields: dict[str, int] = {}
    for name, bound in (("num_beams", MAX_BEAM), ("max_new_tokens", None), ("max_length", None)):
        value = generation.field(name)[0]
        if value is None:
            continue
        if not count(value, 2 if name == "max_length" else 1):
            problem = Problem(name, f"is {value!r}, no count of tokens or beams", "a positive count")
            raise refuse(generation.where, [problem])
        if bound is not None and value > bound:
            problem = Problem(name, f"is {value}, past tfcompile's {bound}", f"at most {bound}")
            raise refuse(generation.where, [problem])
        fields[name] = value
    penalty, stopping = (generation.field(name)[0] for name in ("length_penalty", "early_stopping"))
    penalty = GENERATION_DEFAULTS["length_penalty"] if penalty is None else penalty
    stopping = GENERATION_DEFAULTS["early_stopping"] if stopping is None else stopping
    problems = []
    if not number(penalty, -MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY):
        fix = f"a number from -{MAX_LENGTH_PENALTY:g} to {MAX_LENGTH_PENALTY:g}"
        problems.append(Problem("length_penalty", f"is {penalty!r}, past tfcompile's bounds", fix))
    if not isinstance(stopping, bool) and stopping != "never":
        problems.append(Problem("early_stopping", f"is {stopping!r}", 'true, false or "never"'))
    if problems:
        raise refuse(generation.where, problems)
    limits: dict[str, Any] = {
        "beam": fields.get("num_beams", GENERATION_DEFAULTS["num_beams"]),
        "beam_scoring": "transformers",
        "length_penalty": float(penalty),
        "early_stopping": stopping,
    }
    new = fields.get("max_new_tokens", fields["max_length"] - 1 if "max_length" in fields else None)
    if new is not None:
        limits["max_decode_len"] = min(new, max(max_seq_len - 1, 1))
    warn_unapplied(generation, UNAPPLIED, "tfcompile's translations do not")
    return limits


def warn_unapplied(generation: Generation, names: tuple[str, ...], whose: str) -> None:
    """Warn of the generation fields ``names`` the files set off their defaults, which generate()
    applies and ``whose`` (what the bundle does instead) not."""
    defaults = GENERATION_DEFAULTS | LATER_DEFAULTS
    unapplied = []
    for name in names:
        value = generation.field(name)[0]
        if value is not None and value != defaults[name]:
            unapplied.append(f"{name} {value!r}")
    if unapplied:
        warnings.warn(
            f"{generation.where}: {', '.join(unapplied)}: generate() applies them and {whose}, so they may "
            f"differ",
            HFWarning,
            stacklevel=2,
        )


def decoding_bans(
    generation: Generation,
    tokens: dict[str, str],
    vocabulary: dict[int, str],
    vocab_size: Any,
    max_decode_len: int,
) -> dict[str, Any]:
    """What a translator's files ban generate() from choosing, as the task's fields: min_new_tokens
    (else min_length less the decoder's start) its min_decode_len, at most ``max_decode_len`` (a
    larger one bans the eos as long), and ``banned``'s."""
    fields = counts(generation, ("min_new_tokens", "min_length"))
    least = min(max(fields["min_new_tokens"], fields["min_length"] - 1), max_decode_len)
    ends = [tokens["eos"]] if "eos" in tokens else []
    return ({"min_decode_len": least} if least else {}) | banned(
        generation, ends, vocabulary, vocab_size, "no translation ends"
    )


def generation_bans(
    generation: Generation,
    stops: list[str],
    vocabulary: dict[int, str],
    vocab_size: Any,
    max_new_tokens: int,
) -> dict[str, Any]:
    """What a language model's files ban generate() from choosing, as the task's fields: their
    min_new_tokens, at most ``max_new_tokens`` (the task's default; a larger one bans the stop
    tokens as long), min_length (which counts the prompt), and ``banned``'s. Refused by field: a
    min_length past MAX_NEW_TOKENS."""
    fields = counts(generation, ("min_new_tokens", "min_length"))
    if fields["min_length"] > MAX_NEW_TOKENS:
        problem = Problem("min_length", f"is {fields['min_length']:,}", f"at most {MAX_NEW_TOKENS:,}")
        raise refuse(generation.where, [problem])
    least = min(fields["min_new_tokens"], max_new_tokens)
    return (
        ({"min_new_tokens": least} if least else {})
        | ({"min_length": fields["min_length"]} if fields["min_length"] else {})
        | banned(generation, stops, vocabulary, vocab_size, "generation never stops there")
    )


def counts(generation: Generation, names: tuple[str, ...]) -> dict[str, int]:
    """The files' counts of these names, 0 where unset; refused by field: a value that is no count."""
    out = {}
    for name in names:
        value = generation.field(name)[0]
        if value is not None and not count(value):
            raise refuse(generation.where, [Problem(name, f"is {value!r}, no count", "a count, or 0")])
        out[name] = value or 0
    return out


def banned(
    generation: Generation, ends: list[str], vocabulary: dict[int, str], vocab_size: Any, why: str
) -> dict[str, Any]:
    """no_repeat_ngram_size, suppress_tokens and the bad_words_ids of one token as the task's
    suppressed_tokens, and those of several tokens as its banned_sequences, as the tokenizer
    spells them (``vocabulary``). A bad word that is a token ending a text (``ends``) is left out,
    as generate() leaves it; one holding an id past the model's logits (``vocab_size``) is never
    generated and left out; one the tokenizer cannot name is warned of. Refused by field: a value
    that is no count or list of token ids, more bad words than a spec holds, and a token that
    ends a text among suppress_tokens (``why``: what follows)."""
    where = generation.where
    out: dict[str, Any] = {}
    if n := counts(generation, ("no_repeat_ngram_size",))["no_repeat_ngram_size"]:
        out["no_repeat_ngram_size"] = n
    suppress, bad = generation.field("suppress_tokens")[0] or [], generation.field("bad_words_ids")[0] or []
    if not isinstance(suppress, list) or not all(count(i) for i in suppress):
        raise refuse(where, [Problem("suppress_tokens", f"is {suppress!r}", "a list of token ids")])
    if not isinstance(bad, list) or not all(
        isinstance(w, list) and w and all(count(i) for i in w) for w in bad
    ):
        raise refuse(where, [Problem("bad_words_ids", f"is {bad!r}", "a list of lists of token ids")])
    longer = [w for w in bad if len(w) > 1 and (not isinstance(vocab_size, int) or max(w) < vocab_size)]
    if len(longer) > MAX_BANNED_SEQUENCES or any(len(w) > MAX_BANNED_SEQUENCE for w in longer):
        problem = Problem(
            "bad_words_ids",
            f"holds {len(longer)} words of several tokens, the longest of {max(map(len, longer))}",
            f"at most {MAX_BANNED_SEQUENCES:,} of at most {MAX_BANNED_SEQUENCE} tokens",
        )
        raise refuse(where, [problem])
    listed = dict.fromkeys(
        [*suppress, *(w[0] for w in bad if len(w) == 1 and vocabulary.get(w[0]) not in ends)]
    )
    ids = [i for i in listed if not isinstance(vocab_size, int) or i < vocab_size]
    named = {i: vocabulary.get(i) for i in [*ids, *(i for w in longer for i in w)]}
    unnamed = [i for i, token in named.items() if token is None]
    if ending := [token for token in ends if token in (named[i] for i in ids)]:
        problem = Problem(
            "suppress_tokens", f"bans {ending[0]!r}, which ends a text, so {why}", "leave it out"
        )
        raise refuse(where, [problem])
    if unnamed:
        warnings.warn(
            f"{where}: suppress_tokens and bad_words_ids ban token ids {', '.join(map(str, unnamed))}, "
            f"which the tokenizer cannot name: tfcompile's bundle does not ban them (transformers' "
            f"generate() does), so they may differ",
            HFWarning,
            stacklevel=2,
        )
    suppressed = list(dict.fromkeys(token for i in ids if (token := named[i]) is not None))
    spelled = [[token for i in w if (token := named[i]) is not None] for w in longer]
    sequences = [tokens for tokens, w in zip(spelled, longer, strict=True) if len(tokens) == len(w)]
    return (
        out
        | ({"suppressed_tokens": suppressed} if suppressed else {})
        | ({"banned_sequences": sequences} if sequences else {})
    )


def stop_tokens(
    generation: Generation, tokens: dict[str, str], vocabulary: dict[int, str], vocab_size: Any
) -> dict[str, Any]:
    """The task's stop_tokens: the tokens beside the eos at which generate() ends a text
    (eos_token_id, a list of several: an instruct model's end of turn), as the tokenizer spells them
    (``vocabulary``); and ``stop_at_eos: false`` where eos_token_id is given and leaves the
    tokenizer's eos out (null: generate() ends at no token). An id below ``vocab_size`` the
    tokenizer lacks, or any without a tokenizer.json to name it, is warned of (an id past the
    model's logits it never generates: nothing to stop at)."""
    value, where = generation.field("eos_token_id")[0], generation.where
    ids = value if isinstance(value, list) else [value] if value is not None else []
    if not all(count(i) for i in ids):
        raise refuse(
            where, [Problem("eos_token_id", f"is {value!r}, no token id", "a token's id, or a list")]
        )
    within = [i for i in ids if not isinstance(vocab_size, int) or i < vocab_size]
    named = [vocabulary.get(i) for i in within]
    unnamed = [i for i, token in zip(within, named, strict=True) if token is None]
    if unnamed and (vocabulary or len(within) > 1):
        warnings.warn(
            f"{where}: eos_token_id {value}: the tokenizer names no token of id "
            f"{', '.join(map(str, unnamed))}, so generation does not stop there (transformers' does)",
            HFWarning,
            stacklevel=2,
        )
    stops = list(dict.fromkeys(t for t in named if t is not None and t != tokens.get("eos")))
    at_eos = (
        not generation.gives("eos_token_id")
        or "eos" not in tokens
        or not vocabulary
        or tokens["eos"] in named
    )
    return ({"stop_tokens": stops} if stops else {}) | ({} if at_eos else {"stop_at_eos": False})


def sampling_defaults(generation: Generation) -> dict[str, Any]:
    """How a language model's files set generate() to choose tokens, as the task's generation
    defaults: where they set do_sample, greedy (temperature 0) if false, else their temperature,
    top_k (transformers' 50 where unset; 0: every token), top_p (1: every token) and min_p (0:
    every token); their max_new_tokens and repetition_penalty (greedy or not). Where they set
    none, the bundle keeps tfcompile's defaults. Refused by field: a value generate() cannot
    take, or a penalty past tfcompile's range."""
    out: dict[str, Any] = {}
    new = generation.field("max_new_tokens")[0]
    if new is not None:
        if not count(new, 1) or new > MAX_NEW_TOKENS:
            problem = Problem("max_new_tokens", f"is {new!r}", f"a count up to {MAX_NEW_TOKENS:,}")
            raise refuse(generation.where, [problem])
        out["max_new_tokens"] = new
    penalty = generation.field("repetition_penalty")[0]
    if penalty is not None:
        low, high = REPETITION_PENALTIES
        if not number(penalty, low, high):
            problem = Problem("repetition_penalty", f"is {penalty!r}", f"a number from {low:g} to {high:g}")
            raise refuse(generation.where, [problem])
        out |= {"repetition_penalty": float(penalty)} if penalty != 1 else {}
    sample = generation.field("do_sample")[0]
    if sample is None:
        return out
    if not sample:
        return out | {"temperature": 0.0}
    temperature, top_k, top_p = (
        GENERATION_DEFAULTS[name] if (value := generation.field(name)[0]) is None else value
        for name in ("temperature", "top_k", "top_p")
    )
    problems = []
    if not (number(temperature, 0, math.inf) and 0 < temperature < math.inf):  # NaN is not
        problems.append(
            Problem("temperature", f"is {temperature!r}, with do_sample", "a finite number above 0")
        )
    if not count(top_k):
        problems.append(Problem("top_k", f"is {top_k!r}", "a count, or 0 for every token"))
    if not isinstance(top_p, int | float) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        problems.append(Problem("top_p", f"is {top_p!r}", "a share above 0, at most 1"))
    least = generation.field("min_p")[0] or 0
    if not number(least, 0, 1):
        problems.append(Problem("min_p", f"is {least!r}", "a share from 0 to 1, or null"))
    if problems:
        raise refuse(generation.where, problems)
    out |= {"temperature": float(temperature)} | ({"top_k": top_k} if top_k else {})
    return out | ({"top_p": float(top_p)} if top_p < 1 else {}) | ({"min_p": float(least)} if least else {})


# The generation fields that change what generate() chooses, or when it stops, which any task has no
# field for: a bias on token sequences, constrained beam search, contrastive search, DoLa,
# classifier-free guidance, stop strings, token healing and watermarks.
UNAPPLIED_BY_ANY = (
    "sequence_bias",
    "force_words_ids",
    "penalty_alpha",
    "dola_layers",
    "guidance_scale",
    "stop_strings",
    "token_healing",
    "watermarking_config",
)
# Those, with the fields of their own, which a language model's task has no field for (a forced
# first token after a one-token prompt, and a forced eos at max_length, which counts the prompt).
UNAPPLIED_BY_LANGUAGE_MODELS = (
    "num_beams",
    "begin_suppress_tokens",
    "exponential_decay_length_penalty",
    "forced_bos_token_id",
    "forced_eos_token_id",
    *UNAPPLIED_BY_ANY,
)
# Those of its sampling fields (acting with do_sample alone) that it has no field for.
UNAPPLIED_SAMPLING = ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
# The generation fields that change what generate() chooses which a translator's task has no field
# for (sampling's temperature, top_k, top_p and min_p act only with do_sample).
UNAPPLIED = (
    "do_sample",
    "repetition_penalty",
    "encoder_repetition_penalty",
    "encoder_no_repeat_ngram_size",
    "begin_suppress_tokens",
    "num_beam_groups",
    "diversity_penalty",
    "exponential_decay_length_penalty",
    *UNAPPLIED_BY_ANY,
)


def forced_start(generation: Generation) -> int | None:
    """The token transformers' generate() forces after the decoder's start (forced_bos_token_id);
    refused where transformers 4 and 5 would force different tokens."""
    forced, four = generation.token("forced_bos_token_id")
    if forced != four:
        message = (
            f"is {four} in config.json and {'unset' if forced is None else forced} in "
            f"generation_config.json, made from the model's config: transformers 4 rebuilds the latter "
            f"from config.json's generation fields and forces config.json's, 5 generation_config.json's"
        )
        problem = Problem("forced_bos_token_id", message, "give both files one value")
        raise refuse(str(generation.folder / CONFIG), [problem])
    return forced


def forced_end(
    generation: Generation, default: int | None, tokens: dict[str, str], vocabulary: dict[int, str]
) -> bool:
    """Whether transformers' generate() ends a translation that reaches its length limit with its
    eos (forced_eos_token_id; ``default``: the config class's), the task's forced_eos. Where
    transformers 4 and 5 read it otherwise (4 takes the class's default for a config.json without
    one), the import follows 5, with a warning, as the two differ in the last token of a cut
    translation alone. Refused by field: a forced token that is neither the config's eos_token_id
    nor the tokenizer's eos (``tokens``' eos role; ``vocabulary``: the tokenizer's strings)."""
    forced, four = generation.token("forced_eos_token_id", default)
    where = generation.where
    if forced != four:
        warnings.warn(
            f"{where}: forced_eos_token_id is {forced} as transformers 5 reads the folder and {four} as "
            f"4 does (config.json's, or its config class's where it has none): the import follows 5, so "
            f"under transformers 4 a translation cut at the length limit ends otherwise; give config.json "
            f"the value",
            HFWarning,
            stacklevel=2,
        )
    if forced is None:
        return False
    eos = generation.field("eos_token_id")[0]
    stops = eos if isinstance(eos, list) else [eos]
    token = vocabulary.get(forced)
    if forced not in stops and (token is None or token != tokens.get("eos")):
        message = (
            f"is {forced}, which generate() puts last in a translation cut at its length limit, and "
            f"neither eos_token_id ({eos}) nor the tokenizer's eos ({tokens.get('eos')!r})"
        )
        raise refuse(where, [Problem("forced_eos_token_id", message, "set it to the eos's id, or null")])
    return True


def warn_of_half_precision(config: dict[str, Any]) -> None:
    """A checkpoint saved in bfloat16 or float16 imports exactly, computed in float32; transformers
    5 loads it in its saved type by default (dtype="auto"), so its outputs differ from the
    import's by half precision's rounding unless it is loaded in float32."""
    saved = config.get("dtype", config.get("torch_dtype"))
    if saved in ("bfloat16", "float16"):
        warnings.warn(
            HFWarning(
                f"config.json says {saved}: the import computes in float32 (the weights exactly); "
                f"transformers 5 computes in {saved} by default, about 1e-2 apart: compare with "
                f"from_pretrained(..., dtype=torch.float32)"
            ),
            stacklevel=3,
        )


def check_tokenizer(folder: Path) -> None:
    """A tokenizer.json the tokenizers library cannot read, or that may make gigabytes of a short
    text (what a bundle's loader refuses), is refused before the import writes anything."""
    path = folder / TOKENIZER_FILE
    if not path.exists():
        return
    if (why := excess(read_json(path))) is not None:
        raise HFError(f"{path}: {why}")
    try:
        Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises its own Exception for any file it cannot read
        raise HFError(f"{path} is not a tokenizer the tokenizers library reads: {e}") from None


def uncut_tokenizer(path: Path) -> str:
    """The text of tokenizer.json without the truncation and padding it may have saved (a fine-tune
    saved with ``truncation=True``): transformers applies neither unless a call asks, so neither
    cuts a prompt, a corpus or a bundle's text at a length the model does not have; tfcompile's
    tasks cut and pad as their own rules say. The rest is kept as it is."""
    saved = read_json(path)
    saved["truncation"] = saved["padding"] = None
    return json.dumps(saved, ensure_ascii=False)


def check_tokens_fit(folder: Path, spec: Spec) -> None:
    """A tokenizer.json of more tokens than the embedding table has rows (a fine-tune that added
    special tokens and did not resize the embeddings) is refused: its last ids have no embedding,
    and the run could not be trained or exported."""
    path, rows = folder / TOKENIZER_FILE, getattr(spec.model, "vocab_size", None)
    if rows is None or not path.exists():
        return
    tokens = id_span(Tokenizer.from_str(uncut_tokenizer(path)))  # as the run will hold it
    if tokens > rows:
        raise HFError(
            f"{path} has token ids up to {tokens - 1}, past the {rows} rows of the embedding table "
            f"(config.json's vocab_size): ids from {rows} on have no embedding, and transformers fails "
            f"on them too; resize it (model.resize_token_embeddings(len(tokenizer)), then "
            f"save_pretrained) or remove the tokens tokenizer.json adds past it, then import again"
        )


def warn_without_tokenizer(folder: Path) -> None:
    """A text model's folder without tokenizer.json imports without a tokenizer: said, naming the
    slow tokenizer's files it holds instead."""
    others = [name for name in OTHER_TOKENIZERS if (folder / name).exists()]
    held = f"; it holds {', '.join(others)}, which tfcompile does not read" if others else ""
    warnings.warn(
        HFWarning(
            f"{folder} has no {TOKENIZER_FILE}{held}: the run has no tokenizer (train, generate and "
            f"serve need one); write it with transformers' AutoTokenizer.from_pretrained(DIR)"
            f".save_pretrained(DIR) (a fast tokenizer), then import again"
        ),
        stacklevel=3,
    )


def token_strings(folder: Path) -> dict[int, str]:
    """Id -> token string of the folder's tokenizer.json (its model's vocabulary and the added tokens)."""
    path = folder / TOKENIZER_FILE
    if not path.exists():
        return {}
    saved = read_json(path)
    vocab = saved.get("model", {}).get("vocab") or {}
    out: dict[int, str] = {}
    if isinstance(vocab, dict):
        out = {int(i): str(token) for token, i in vocab.items()}
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs
        out = {i: str(entry[0]) for i, entry in enumerate(vocab)}
    for added in saved.get("added_tokens") or []:
        out[int(added["id"])] = str(added["content"])
    return out


def readable_spec(sections: dict[str, Any], folder: Path, name: str, runs_dir: Path) -> str:
    """The spec as a person would write it, with how to fine-tune it."""
    header = [
        f"# Imported from {folder} by `tfcompile import`; the weights are in {runs_dir / name}.",
        "# Fine-tune: add a data section, then",
        f"#   tfcompile train {name}.yaml --set train.init_from={runs_dir / name} "
        f"--set train.name={name}-tuned",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(sections, sort_keys=False)


def load_state(spec: Spec, state: dict[str, torch.Tensor], folder: Path) -> torch.nn.Module:
    """The spec's model holding ``state``; a tensor of another shape than the config implies is an
    HFError naming it, found on the meta device before anything is allocated (a config.json of
    2^24 tokens beside a checkpoint of 64 would otherwise build gigabytes to refuse), as is a
    model too large for this machine's memory (buffers the checkpoint does not hold, such as
    RoPE's tables of max_position_embeddings rows)."""
    with torch.device("meta"):
        own = build_model(spec).state_dict()
    wrong = [
        f"{name} {tuple(tensor.shape)} (expected {tuple(own[name].shape)})"
        for name, tensor in state.items()
        if name in own and own[name].shape != tensor.shape
    ]
    missing = sorted(set(own) - set(state))
    if wrong or missing:
        found = [f"tensors of other shapes: {', '.join(wrong[:5])}" if wrong else ""]
        found += [f"tensors missing: {', '.join(missing[:5])}" if missing else ""]
        raise HFError(
            f"{folder}: the checkpoint does not fit its config.json; {'; '.join(f for f in found if f)}"
        )
    try:
        model = build_model(spec)
    except TooLarge as e:
        raise HFError(f"{folder / CONFIG}: {e}") from None
    model.load_state_dict(state, strict=True)
    return model.eval()


def image_preprocessing(folder: Path, spec: Spec) -> dict[str, Any] | None:
    path = folder / PREPROCESSOR_CONFIG
    if not vit.takes_images(spec):
        return None
    if not path.exists():
        raise HFError(f"{path} is missing: an image model's folder holds its image processor's settings")
    return vit.preprocessing(read_json(path), spec, str(path))


def write_run(
    run_dir: Path,
    spec: Spec,
    model: torch.nn.Module,
    folder: Path,
    preprocessing: dict[str, Any] | None,
    record: dict[str, Any] | None = None,
) -> None:
    """The run folder ``train`` would have written at step 0 (so that ``train --resume`` continues
    from the weights with a fresh optimizer), from a staging folder moved into place."""
    # Its own name, never a folder of the user's; one a killed import left is removed.
    staging = make_folder_beside(run_dir, ".import", staging=True)
    try:
        (staging / SPEC_FILE).write_text(dump_spec(spec))
        if (folder / TOKENIZER_FILE).exists():
            atomic_write_text(staging / TOKENIZER_FILE, uncut_tokenizer(folder / TOKENIZER_FILE))
        if preprocessing is not None:
            write_json(staging / PREPROCESSING_FILE, ImagePreprocessing.from_dict(preprocessing).to_dict())
        if record is not None:
            write_json(staging / IMPORT_RECORD, record)
        save_initial_checkpoint(staging, model, spec.train.optimizer)
        if run_dir.exists():
            run_dir.rmdir()  # empty (checked before)
        staging.rename(run_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
