"""A decoder bundle as a folder that ONNX Runtime GenAI (``onnxruntime-genai``) loads as it is.

    genai_config.json       generated from the manifest: the step graph's inputs and outputs, the
                            cache's name templates and sizes, the context, the end, padding and
                            start token ids, the manifest's sampling defaults
    decoder_step.onnx       the bundle's decode_step graph, its checked bytes, unchanged; where
                            its logits are wider than the tokenizer's vocabulary (a checkpoint's
                            padded embedding table), with a Slice to the tokenizer's ids, which
                            alone the runtime decodes (genai's search has no mask for the rest)
    tokenizer.json          a tokenizer genai's (onnxruntime-extensions') reads: a byte-level BPE
                            as the bundle has it (GPT-2's steps only: genai ignores any other); a
                            char (WordLevel) tokenizer rewritten as a byte-level BPE without
                            merges, one token per byte (ASCII only)
    tokenizer_config.json   the tokenizer's class for genai (GPT2Tokenizer) and its special tokens

Then ``og.Model(folder)``, ``og.Tokenizer(model)`` and ``og.Generator`` serve it: greedy search
gives exactly the tokens of ``tfcompile.runtime``'s ``generate(..., temperature=0)`` (and genai's
right-padded batches give each row what it gives alone, since the graph counts positions from the
attention mask; but see the bans and windows below). ``import onnxruntime`` before
``import onnxruntime_genai``: on Linux the other order aborts the process.

What genai does differently, and what it needs that a bundle may not have:

- **An end-of-text id, a padding id and a start id, all inside the vocabulary.** They are the
  manifest's: the stop tokens (``generation.stop_token_ids``), the ``pad`` token (else, for a
  byte-level BPE, a byte UTF-8 text never holds, else the first stop token) and the ``bos`` token
  (else the first stop token). Where the vocabulary has none (a tokenizer trained with
  ``task.special_tokens: false``), one real token is reserved for all three: for a byte-level BPE,
  the byte 0xFF (or another byte that never occurs in UTF-8 text), so nothing changes for any text;
  otherwise ``end_token`` if given, else the token the model finds least likely (its mean
  probability after each one-token context, from the forward graph). genai stops a text when it
  generates that token (tfcompile would go on), and it reads a prompt's trailing copies of it as
  padding: the continuation of a prompt that ends in it is not the model's.
- **A vocabulary entry per byte.** genai's tokenizer turns a character outside the vocabulary
  into the id -1 (never ``[UNK]``), which the graph reads as the last row of its embedding: check
  ``ids >= 0`` before generating. A byte-level BPE has every byte, so this only concerns char
  vocabularies.
- **Generation ends at the context** (``search.max_length``, at most ``context_length`` tokens,
  prompt included); tfcompile slides its window on past it.
- Text with invalid UTF-8 (which only a barely trained model writes) decodes differently: genai
  stops at the first bad byte, tokenizers writes U+FFFD for each.
- **Of the bans, only no_repeat_ngram_size and min_length.** genai's
  ``search.no_repeat_ngram_size`` is the manifest's, and genai bans as the runtime does, over the
  prompt's tokens and the new ones (in greedy search and in sampling; on the CPU only: genai
  refuses it on another device); its ``search.min_length`` is the manifest's, both counting the
  prompt's tokens. But a right-padded batch puts its padding in a shorter row's n-grams and
  length: with either set, generate one prompt at a time (or prompts of one length together) to
  get the runtime's tokens. Bundles with
  ``suppressed_ids`` or ``banned_sequences`` are refused (genai_config.json cannot ban tokens), as
  are those with ``min_p`` (genai's search has no such option) and with ``min_new_tokens``
  (genai's ``search.min_length`` counts the prompt's tokens too: no one value holds off the stop
  tokens for that many new ones after every prompt; a client can set it per prompt to the prompt's
  length plus ``min_new_tokens``).

- **A sliding window (``model.window``) counts columns, not positions**: in a right-padded batch a
  shorter row's padding sits inside its window, so its tokens are not what it gives alone (the
  runtime and Triton's loop left-pad, and are exact). With a window, generate one prompt at a time
  (or prompts of one length together).
- **The manifest's top_k**, where it has none, is the vocabulary's size (genai's 0 would sample
  from every token, ignoring top_p); one past the vocabulary is cut to it (genai refuses it).

fp32 and fp16 bundles both work (genai runs the graph in its own precision and searches in fp32).
Format 1 bundles are refused: their step graph counts positions from the cache, which genai's
right-padded batches would misread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tfcompile.destination import check_new_folder, check_outside, move_into_place, staging_folder
from tfcompile.errors import ExportError, first_line
from tfcompile.manifest import SPEC_FILE, STEP_ROLE, Graph, Manifest
from tfcompile.onnx_nodes import graph_nodes
from tfcompile.runtime import check_bundle
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.errors import BundleError
from tfcompile.runtime.generation import LanguageModel
from tfcompile.spec import SpecError, parse_spec

GENAI_CONFIG = "genai_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENAI_TOKENIZER = "tokenizer.json"
# genai's model type for a plain decoder with a key/value cache: names every input and output.
GENAI_MODEL_TYPE = "decoder"
# Bytes that never occur in UTF-8 text: a byte-level vocabulary can give one of them a job.
NEVER_IN_UTF8 = (*range(0xFF, 0xF4, -1), 0xC1, 0xC0)
STEP_INPUTS = ("input_ids", "attention_mask")
STEP_OUTPUTS = ("logits",)
# What genai's JSON parser takes: whole numbers as int32, other numbers as float32.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


def export_genai(bundle: Path, out: Path, end_token: str | None = None) -> Path:
    """Write an onnxruntime-genai folder for the decoder ``bundle`` at ``out`` (a new or empty
    folder; nothing is ever overwritten) and return it. ``end_token``: for a vocabulary without
    an end-of-text token, the vocabulary entry that genai ends a text at and pads with (default:
    chosen as the module says). The bundle is first checked as the runtime's loader checks it."""
    files = BundleFiles(bundle)
    manifest = files.manifest
    _check_bundle(bundle, files)
    check_outside(bundle, out)
    check_new_folder(out)
    check_bundle(files)
    step = _step_graph(bundle, manifest)
    if step.file in (GENAI_CONFIG, TOKENIZER_CONFIG, GENAI_TOKENIZER):
        raise BundleError(
            f"{bundle}: its step graph's file name {step.file!r} is one genai gives another file"
        )
    assert manifest.tokenizer is not None  # _check_bundle
    data = files.read(manifest.tokenizer.file)
    original = _tokenizer_json(bundle / manifest.tokenizer.file, data)
    tokenizer_json = genai_tokenizer(data)
    width = _vocab_size(bundle, manifest, step)
    vocab_size = min(width, Tokenizer.from_str(data.decode("utf-8")).get_vocab_size())  # the runtime's
    ids = _token_ids(bundle, files, original, vocab_size, end_token)
    config = genai_config(manifest, step, _heads(files, step), vocab_size, ids)
    graph = files.read(step.file)
    specials = {role: t.token for role, t in manifest.tokenizer.special_tokens.items()}

    tmp = staging_folder(out)
    try:
        (tmp / step.file).write_bytes(graph if vocab_size == width else sliced_logits(graph, vocab_size))
        (tmp / GENAI_TOKENIZER).write_bytes(tokenizer_json)
        (tmp / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config(specials), indent=2) + "\n")
        (tmp / GENAI_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        move_into_place(tmp, out, replacing=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- checks


def _check_bundle(bundle: Path, files: BundleFiles) -> None:
    manifest = files.manifest
    if files.format_version < 2:
        raise ExportError(
            f"{bundle} is a format 1 bundle: its step graph counts positions from the cache, which "
            f"genai's right-padded batches would misread; export it again with this tfcompile"
        )
    if not any(g.role == STEP_ROLE for g in manifest.graphs.values()):
        roles = ", ".join(sorted({g.role for g in manifest.graphs.values()}))
        raise ExportError(
            f"{bundle} holds a model of task {manifest.task!r} (graphs: {roles}); onnxruntime-genai "
            f"serves decoders, whose bundle has a {STEP_ROLE} graph: export a causal language model"
        )
    if manifest.generation is None:
        raise BundleError(f"{bundle}: the manifest of a language model needs a generation section")
    if manifest.tokenizer is None:
        raise ExportError(
            f"{bundle} has no tokenizer (it was exported from a spec, not from a trained run): genai "
            f"needs one; export the bundle from a run"
        )
    g = manifest.generation
    for field, value, task_field, why in (
        ("suppressed_ids", g.suppressed_ids, "suppressed_tokens", "its genai_config.json cannot ban tokens"),
        (
            "banned_sequences",
            g.banned_sequences,
            "banned_sequences",
            "its genai_config.json cannot ban tokens",
        ),
        (
            "min_new_tokens",
            g.min_new_tokens,
            "min_new_tokens",
            "its one such setting, search.min_length, counts the prompt's tokens too",
        ),
        ("min_p", g.min_p, "min_p", "its search options have no min_p"),
    ):
        if value:
            raise ExportError(
                f"{bundle}'s manifest sets generation.{field} ({value}), which onnxruntime-genai cannot "
                f"apply ({why}): its tokens would not be the runtime's. Export the bundle again, its "
                f"spec without task.{task_field}"
            )


def _step_graph(bundle: Path, manifest: Manifest) -> Graph:
    """The decode_step graph, checked to have the inputs and outputs genai's config can name."""
    name, step = next((n, g) for n, g in manifest.graphs.items() if g.role == STEP_ROLE)
    where = f"{bundle}: the {name!r} graph"
    if step.cache is None:
        raise BundleError(f"{where} has no cache section, which a {STEP_ROLE} graph needs")
    inputs = [t.name for t in step.inputs]
    outputs = [t.name for t in step.outputs]
    layers = _layers(where, step.cache.past, "past")
    if _layers(where, step.cache.present, "present") != layers:
        raise BundleError(f"{where}: its past and present cache tensors do not pair up by layer")
    for kind, found, plain, cache in (
        ("inputs", inputs, STEP_INPUTS, step.cache.past),
        ("outputs", outputs, STEP_OUTPUTS, step.cache.present),
    ):
        if sorted(found) != sorted([*plain, *cache]):
            raise ExportError(
                f"{where} has {kind} {found}; genai's decoder config names only {list(plain)} and the "
                f"cache, so this graph cannot be served by it"
            )
    return step


def _layers(where: str, names: list[str], kind: str) -> int:
    """The number of layers of a cache named ``{kind}_key_{i}``/``{kind}_value_{i}``, i = 0..n-1."""
    count = len(names) // 2
    expected = {f"{kind}_{kv}_{i}" for i in range(count) for kv in ("key", "value")}
    if not names or len(names) % 2 or set(names) != expected:
        raise ExportError(
            f"{where}: its cache tensors {names[:4]}... are not {kind}_key_%d / {kind}_value_%d for "
            f"layers 0 to n-1, the name templates genai's config takes"
        )
    return count


def _vocab_size(bundle: Path, manifest: Manifest, step: Graph) -> int:
    logits = next(t for t in step.outputs if t.name == "logits")
    last = logits.shape[-1] if logits.shape else None
    if not isinstance(last, int):
        raise BundleError(f"{bundle}: the step graph's logits have no fixed vocabulary axis: {logits.shape}")
    if manifest.model.vocab_size is not None and manifest.model.vocab_size != last:
        raise BundleError(
            f"{bundle}: model.vocab_size is {manifest.model.vocab_size}, but the step graph's logits "
            f"have {last} scores"
        )
    return last


def _heads(files: BundleFiles, step: Graph) -> dict[str, int]:
    """head_size, num_key_value_heads, num_hidden_layers from the cache tensors' shapes;
    num_attention_heads and hidden_size from the bundle's spec.yaml (for genai, informative only)."""
    manifest = files.manifest
    assert step.cache is not None
    past = next(t for t in step.inputs if t.name == "past_key_0")
    if len(past.shape) != 4 or not all(isinstance(d, int) for d in past.shape[1::2]):
        raise BundleError(
            f"{files.folder}: past_key_0 has the shape {past.shape}, not (batch, n_kv_heads, "
            f"past_sequence, head_dim) with fixed heads and head_dim"
        )
    kv_heads, head_dim = int(past.shape[1]), int(past.shape[3])
    heads, hidden = kv_heads, kv_heads * head_dim
    if SPEC_FILE in manifest.files:
        try:
            model = parse_spec(files.text(SPEC_FILE), source=str(files.folder / SPEC_FILE)).model
        except SpecError as e:
            raise BundleError(f"{files.folder}: its {SPEC_FILE} is not a spec ({first_line(e, 300)})") from e
        said = (getattr(model, "n_kv_heads", None), getattr(model, "head_dim", None))
        if said != (kv_heads, head_dim):
            raise BundleError(
                f"{files.folder}: its {SPEC_FILE} gives (n_kv_heads, head_dim) {said}, but its step "
                f"graph's cache holds {(kv_heads, head_dim)}"
            )
        heads, hidden = model.n_heads, model.d_model
    return {
        "head_size": head_dim,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": len(step.cache.past) // 2,
    }


# --------------------------------------------------------------------------- tokenizer


def _tokenizer_json(where: Path, data: bytes) -> dict[str, Any]:
    try:
        saved = json.loads(data)
        Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # not UTF-8, not JSON, or not a tokenizer
        raise BundleError(f"{where}: not a tokenizer the tokenizers library reads: {e}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise BundleError(f"{where}: a tokenizer without a model section")
    return saved


def genai_tokenizer(data: bytes) -> bytes:
    """A tokenizer.json (the tokenizers library's format) -> one that onnxruntime-extensions
    reads and that gives the same ids: a byte-level BPE with GPT-2's steps as it is (the same
    bytes; one with other steps is refused, see _check_gpt2_steps); a char (WordLevel)
    vocabulary as a byte-level BPE without merges, one ASCII character per token, its special
    tokens kept at their ids."""
    saved = _tokenizer_json(Path("tokenizer.json"), data)
    model = saved["model"]
    if model.get("type") == "BPE" and (saved.get("pre_tokenizer") or {}).get("type") == "ByteLevel":
        _check_gpt2_steps(saved)
        return data
    if model.get("type") != "WordLevel" or saved.get("normalizer"):
        kind = model.get("type")
        raise ExportError(
            f"onnxruntime-genai reads byte-level BPE tokenizers (and SentencePiece ones), and tfcompile "
            f"rewrites its char tokenizer as one; this bundle's tokenizer is a {kind} model, which it cannot"
        )
    added = {a["content"]: a["id"] for a in saved.get("added_tokens", [])}
    vocab: dict[str, int] = model["vocab"]
    bad = sorted(t for t in vocab if t not in added and not (len(t) == 1 and ord(t) < 128))
    if bad:
        raise ExportError(
            f"the char vocabulary holds {len(bad)} entries that are not single ASCII characters "
            f"({', '.join(map(repr, bad[:12]))}{', ...' if len(bad) > 12 else ''}): genai's tokenizer "
            f"reads a char vocabulary only as a byte-level BPE without merges, one byte per token. Train "
            f"with data.tokenizer: bpe, or on ASCII text"
        )
    unk = model.get("unk_token")
    bpe = {(t if t in added else BYTE_CHARS[ord(t)]): i for t, i in vocab.items()}
    new = Tokenizer(models.BPE(vocab=bpe, merges=[], unk_token=unk if unk in vocab else None))
    new.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    new.decoder = decoders.ByteLevel()
    new.add_special_tokens(sorted(added, key=added.__getitem__))
    _check_same(Tokenizer.from_str(json.dumps(saved)), new, vocab, added)
    return new.to_str(pretty=True).encode("utf-8")


def _check_gpt2_steps(saved: dict[str, Any]) -> None:
    """A byte-level BPE goes to genai as it is, and onnxruntime-extensions reads it as GPT-2's:
    no normalizer, GPT-2's split regex, no prefix space, nothing added, bytes decoded, no subword
    prefix or suffix, added tokens matched as they are (no lstrip, rstrip or single_word), whatever
    tokenizer.json says. Any other setting would give other ids (or text): refused."""
    pre = saved["pre_tokenizer"]
    post = saved.get("post_processor")
    ignored = [
        what
        for what, differs in (
            ("normalizer", saved.get("normalizer") is not None),
            ("add_prefix_space: true", pre.get("add_prefix_space") is True),
            ("use_regex: false", pre.get("use_regex", True) is not True),
            ("post-processor", post is not None and post.get("type") != "ByteLevel"),
            ("decoder", (saved.get("decoder") or {}).get("type") != "ByteLevel"),
            *(
                (f"model.{field}", bool(saved["model"].get(field)))
                for field in ("continuing_subword_prefix", "end_of_word_suffix")
            ),
            *(
                (f"added tokens' {flag}", any(token.get(flag) for token in saved.get("added_tokens") or []))
                for flag in ("lstrip", "rstrip", "single_word")
            ),
        )
        if differs
    ]
    if ignored:
        raise ExportError(
            f"onnxruntime-genai reads a byte-level BPE as GPT-2's, and would ignore this tokenizer's "
            f"{', '.join(ignored)}: its ids (or its text) would not be the bundle tokenizer's"
        )


def _check_same(old: Tokenizer, new: Tokenizer, vocab: dict[str, int], added: dict[str, int]) -> None:
    """Every entry encodes to its id alone, all of them together to the same ids, and back."""
    for token, i in vocab.items():
        if new.token_to_id(token if token in added else BYTE_CHARS[ord(token)]) != i:
            raise ExportError(f"the rewritten tokenizer lost {token!r} (id {i}); please report this")
    text = "".join(t for t in sorted(vocab, key=vocab.__getitem__) if t not in added)
    ids = old.encode(text).ids
    if new.encode(text).ids != ids or new.decode(ids) != old.decode(ids) or old.decode(ids) != text:
        raise ExportError(
            "the rewritten tokenizer does not give the char tokenizer's ids; please report this"
        )


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table, as the byte-level BPE's vocabulary spells bytes."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {
        **{b: chr(b) for b in printable},
        **{b: chr(256 + n) for n, b in enumerate(others)},
    }


BYTE_CHARS = _byte_chars()


def tokenizer_config(specials: dict[str, str]) -> dict[str, Any]:
    """tokenizer_config.json for onnxruntime-extensions: GPT-2's byte-level BPE class, nothing
    added to a text (genai encodes without special tokens and decodes skipping them)."""
    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    for role in ("bos", "eos", "unk", "pad"):
        if role in specials:
            config[f"{role}_token"] = specials[role]
    return config


# --------------------------------------------------------------------------- token ids


def _token_ids(
    bundle: Path, files: BundleFiles, saved: dict[str, Any], vocab_size: int, end_token: str | None
) -> dict[str, Any]:
    """eos (a list), pad and bos for genai_config.json, each inside the vocabulary."""
    manifest = files.manifest
    assert manifest.tokenizer is not None and manifest.generation is not None
    specials = {role: t.id for role, t in manifest.tokenizer.special_tokens.items()}
    stops = list(manifest.generation.stop_token_ids)
    pad = specials.get("pad")
    if stops and end_token is not None:
        raise ExportError(f"{bundle} names its own end tokens ({stops}): leave --end-token out")
    if not stops:
        stops = [_reserved_id(bundle, files, saved, end_token, pad)]
    # Without a pad token, genai pads with a token no prompt ends in (it reads a prompt's trailing
    # copies of it as padding): a byte no UTF-8 text holds, else the end token, as GPT-2's
    # configuration does.
    if pad is None:
        unused = _never_in_text(saved)
        pad = stops[0] if unused is None else unused
    bos = specials.get("bos", stops[0])
    for role, i in [*(("eos", i) for i in stops), ("pad", pad), ("bos", bos)]:
        if not 0 <= i < vocab_size:
            raise BundleError(f"{bundle}: the {role} token id {i} is outside the vocabulary of {vocab_size}")
    return {"eos_token_id": stops, "pad_token_id": pad, "bos_token_id": bos}


def _reserved_id(
    bundle: Path, files: BundleFiles, saved: dict[str, Any], end_token: str | None, pad: int | None
) -> int:
    """The id genai ends texts at (and pads with) when the vocabulary has no end-of-text token."""
    tokenizer = Tokenizer.from_str(json.dumps(saved))
    if end_token is not None:
        found = tokenizer.token_to_id(end_token)
        if found is None:
            raise ExportError(f"--end-token {end_token!r} is not an entry of {bundle}'s vocabulary")
        return int(found)
    if pad is not None:
        return pad  # a padding token: the model never learned to write it
    unused = _never_in_text(saved)
    return least_likely(files) if unused is None else unused


def _never_in_text(saved: dict[str, Any]) -> int | None:
    """A byte-level BPE's id of a byte no UTF-8 text holds (0xFF first); None for another tokenizer."""
    if (saved.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        return None
    tokenizer = Tokenizer.from_str(json.dumps(saved))
    found = (tokenizer.token_to_id(BYTE_CHARS[byte]) for byte in NEVER_IN_UTF8)
    return next((int(i) for i in found if i is not None), None)


def least_likely(files: BundleFiles) -> int:
    """The token a decoder bundle's model finds least likely: the smallest mean probability of
    the next token over every one-token context (the forward graph, on the CPU)."""
    model = LanguageModel(files, ["CPUExecutionProvider"])
    # The tokenizer's ids alone: a padded model's extra columns, trained to be unlikely, are no token.
    vocab = model.emitted or model.vocab_size or int(model.session.get_outputs()[0].shape[-1])
    total = np.zeros(vocab, dtype=np.float64)
    for start in range(0, vocab, 256):
        ids = np.arange(start, min(start + 256, vocab), dtype=np.int64)[:, None]
        logits = model.logits(ids)[:, -1, :vocab].astype(np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        total += (probs / probs.sum(axis=1, keepdims=True)).sum(axis=0)
    return int(total.argmin())


def sliced_logits(graph: bytes, width: int) -> bytes:
    """The step graph with its ``logits`` output cut to its first ``width`` scores: a Slice on the
    last axis after the node that made it, the declared shape cut too."""
    model = onnx.load_from_string(graph)
    taken = {name for node in graph_nodes(model.graph) for name in (node.name, *node.input, *node.output)}
    taken |= {t.name for t in model.graph.initializer}

    def fresh(name: str) -> str:
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    full = fresh("logits_unsliced")
    for node in graph_nodes(model.graph):
        for names in (node.input, node.output):
            renamed = [full if name == "logits" else name for name in names]
            del names[:]
            names.extend(renamed)
    bounds = {fresh(f"logits_slice_{k}"): v for k, v in (("starts", 0), ("ends", width), ("axes", -1))}
    model.graph.initializer.extend(
        onnx.numpy_helper.from_array(np.array([v], dtype=np.int64), name) for name, v in bounds.items()
    )
    model.graph.node.append(
        onnx.helper.make_node("Slice", [full, *bounds], ["logits"], name=fresh("logits_slice"))
    )
    logits = next(o for o in model.graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[-1].dim_value = width
    return model.SerializeToString()


# --------------------------------------------------------------------------- config


def genai_config(
    manifest: Manifest, step: Graph, heads: dict[str, int], vocab_size: int, ids: dict[str, Any]
) -> dict[str, Any]:
    """genai_config.json: genai's ``decoder`` model type over the step graph, with the
    manifest's generation defaults as its search options."""
    assert manifest.generation is not None
    g = manifest.generation
    decoder = {
        "filename": step.file,
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        **heads,
        "inputs": {
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "past_key_names": "past_key_%d",
            "past_value_names": "past_value_%d",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present_key_%d",
            "present_value_names": "present_value_%d",
        },
    }
    model = dict(
        type=GENAI_MODEL_TYPE,
        vocab_size=vocab_size,
        context_length=g.context_length,
        **ids,
        decoder=decoder,
    )
    search = {
        "do_sample": g.temperature > 0,
        "temperature": g.temperature if g.temperature > 0 else 1.0,
        # genai's 0 samples from every token and ignores top_p; past the vocabulary, it refuses.
        "top_k": min(g.top_k or vocab_size, vocab_size),
        "top_p": g.top_p or 1.0,
        "max_length": g.context_length,
        "min_length": g.min_length,  # prompt included, as the runtime's
        "num_beams": 1,
        "num_return_sequences": 1,
        "repetition_penalty": g.repetition_penalty,
        "length_penalty": 1.0,
        "no_repeat_ngram_size": g.no_repeat_ngram_size,  # prompt included, as the runtime's
        "early_stopping": True,
        # The step graph concatenates its cache: genai must not preallocate it to max_length.
        "past_present_share_buffer": False,
    }
    config = {"model": model, "search": search}
    _check_numbers(config, "")
    return config


def _check_numbers(node: Any, where: str) -> None:
    """Every number of the config inside what genai reads (whole numbers int32, others finite
    float32); one outside comes from the bundle's manifest, which is a BundleError."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_numbers(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for value in node:
            _check_numbers(value, where)
    elif isinstance(node, bool):
        return
    elif isinstance(node, int) and not INT32_MIN <= node <= INT32_MAX:
        raise BundleError(
            f"{GENAI_CONFIG}'s {where} would be {node:,}, past the int32 range onnxruntime-genai reads: "
            f"the bundle's manifest gives it, and genai cannot serve the bundle as it is"
        )
    elif isinstance(node, float) and not abs(node) <= FLOAT32_MAX:
        raise BundleError(
            f"{GENAI_CONFIG}'s {where} would be {node:g}, past the float32 range onnxruntime-genai reads: "
            f"the bundle's manifest gives it, and genai cannot serve the bundle as it is"
        )


__all__ = [
    "GENAI_CONFIG",
    "TOKENIZER_CONFIG",
    "export_genai",
    "genai_config",
    "genai_tokenizer",
    "least_likely",
]
