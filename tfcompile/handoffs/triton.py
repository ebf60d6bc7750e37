"""A bundle as a Triton Inference Server model repository: one model per graph, for Triton's
ONNX Runtime backend.

    REPO/
      NAME-model/                 the forward graph ("model" in the manifest)
        config.pbtxt              platform onnxruntime_onnx, the graph's inputs and outputs with
                                  their types and dims, dynamic batching, an instance group
        1/model.onnx              the graph's checked bytes, unchanged (version 1)
        manifest.json             the bundle's manifest, as tfcompile validated it
        tokenizer.json            the bundle's tokenizer, when it has one
      NAME-step/                  a decoder's decode_step graph (a translator's: NAME-encoder and
        ...                       NAME-step), laid out the same way

NAME is the bundle folder's name unless given; each model is ``NAME-<graph>``, the graph's name in
the manifest. Triton reads only ``config.pbtxt`` and the numbered version folders of a model
folder: other files there are tolerated (its documented layout keeps label files beside
config.pbtxt), so each model folder carries what a client needs, the manifest (special tokens,
padding, stop tokens, the cache) and the tokenizer. The manifest's ``files`` sha256 of a graph is
that of its ``1/model.onnx``.

With ``max_batch_size`` > 0, every tensor's leading ``batch`` axis is Triton's implicit batch
dimension, left out of ``dims``; the other named (dynamic) axes are -1 and the fixed ones keep their
size. The dynamic batcher merges requests whose other dims agree (a step with the same past and
new lengths, a forward pass with the same sequence length): each row of these graphs is computed
on its own, so merging changes no result. ``max_batch_size=0`` turns Triton's batching off and
lists every axis.

**Driving a decoder's generation loop from a Triton client.** The repository holds no loop: the
client runs it over ``NAME-step``, which is stateless (every request carries the cache). For a
batch of prompts:

1. Tokenize (the manifest's tokenizer; special tokens as ``tokenizer.special_tokens`` and
   ``added_by_tokenizer`` say) and **left-pad** to the longest prompt with ``padding.pad_id``;
   ``attention_mask`` is 1 at real tokens and 0 at padding.
2. First request: ``input_ids`` = the padded prompts (batch, prompt; at most their last
   ``generation.context_length`` columns), ``attention_mask`` = their mask, and every
   ``past_key_i``/``past_value_i`` **empty**: shape (batch, n_kv_heads, 0, head_dim) of the
   graph's float type (zero elements; Triton accepts zero-sized variable dims).
3. Take ``logits[:, -1]`` (batch, vocab) over the tokenizer's ids (its first vocabulary-size
   columns: a checkpoint may pad its logits past them): the next token of each row (argmax, or sampled as the
   manifest's ``generation`` defaults say: ``temperature``, ``top_k``, ``top_p``, ``min_p``), after
   its ``repetition_penalty``, then its bans: -inf at the tokens of ``suppressed_ids``, at the stop
   tokens while the row has fewer than ``min_new_tokens`` new tokens or fewer than ``min_length``
   in all (its prompt's real tokens included), and at each token that would
   end an n-gram of ``no_repeat_ngram_size`` tokens occurring earlier in the row: its whole prompt,
   even beyond the context, and its new tokens, never its padding; and at the last token of each
   of ``banned_sequences`` whose other tokens end the row. A row whose every token is banned ends
   there).
4. Next request: ``input_ids`` = the new tokens (batch, 1); ``attention_mask`` = the previous mask
   with a column of 1 appended, so it always covers **past + new** tokens; each ``past_*_i`` = the
   ``present_*_i`` output of the previous response (the manifest's ``cache`` pairs them by index).
   Request the ``present_*`` outputs every time.
5. Stop a row at a ``generation.stop_token_ids`` token (keep it in the batch, feeding any token,
   until every row is done) or at your token budget. Once the cache holds
   ``generation.context_length`` columns (padding included), each further step re-reads the last
   ``context_length`` columns of the ids and of the mask from an empty cache, as tfcompile's
   runtime does (a sliding window).

Positions come from the mask inside the graph (its cumulative sum minus one), so left-padded rows
generate what each would alone. The forward model (``NAME-model``) gives whole-sequence logits
without a cache (scoring, or a client that re-runs the prompt each step).

**A translator's loop** (``NAME-encoder``, then ``NAME-step``), as the manifest's ``translation``
section defines it:

1. Encode each source without special tokens, cut it to ``model.max_seq_len`` less
   ``len(source_prefix_ids) + len(source_suffix_ids)`` ids (an empty one is the unk token), put
   ``source_prefix_ids`` before it and ``source_suffix_ids`` after it, and
   **right-pad** the batch with ``padding.pad_id``; ``source_mask`` is 1 at real tokens.
2. One ``NAME-encoder`` request: ``source_ids``, ``source_mask`` -> every ``memory_*`` output.
3. ``NAME-step`` requests: ``input_ids`` = (batch, 1 + len(target_prefix_ids)) tokens,
   ``translation.start_id`` then ``target_prefix_ids`` first (a target language's code, given
   rather than chosen), then (batch, 1) tokens, each row's last choice (targets are never padded:
   no target mask); ``source_mask`` and the ``memory_*`` tensors as the encoder gave them, every
   request; ``past_*`` empty at first, then the previous ``present_*``. Take ``logits[:, -1]``
   over the tokenizer's ids; a row ends at ``translation.stop_id`` or once the decoder holds
   ``max_decode_len`` tokens after the start (the prefix's included; with ``forced_eos`` the
   last of them is ``stop_id``, given rather than chosen). Before each choice, ban (-inf) the
   tokens of ``suppressed_ids``, ``stop_id`` while fewer than ``min_decode_len`` tokens follow
   the start, any token that would repeat an n-gram of ``no_repeat_ngram_size`` tokens, and the
   last token of each of ``banned_sequences`` whose other tokens end the decoder's.
4. Beam search keeps a source's hypotheses as rows of one batch: reorder ``past_*``, ``memory_*``
   and ``source_mask`` by the rows each step keeps, scored and ended as ``translation`` says
   (``beam_scoring``: fairseq's, or generate()'s with ``early_stopping``).

Why not Triton's sequence batcher with implicit state (``present_*`` fed back as ``past_*`` inside
Triton)? The cache grows by each request's new tokens and starts empty, rows of one batch would
need equal cache lengths, sliding past the context restarts it, and the mask over past + new must
still come from the client; none of it can be checked here without a Triton server. Stateless
requests are correct with any batcher and any number of instances, at the price of sending the
cache each step (2 x layers x n_kv_heads x head_dim x length floats per row).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tfcompile.destination import check_new_folder, check_outside, move_into_place, staging_folder
from tfcompile.errors import ExportError
from tfcompile.manifest import MANIFEST, Graph, Tensor
from tfcompile.runtime import check_bundle
from tfcompile.runtime.bundle import BundleFiles
from tfcompile.runtime.errors import BundleError

CONFIG = "config.pbtxt"
VERSION = "1"
MODEL_FILE = "model.onnx"  # the ONNX Runtime backend's default file name
PLATFORM = "onnxruntime_onnx"
TRITON_TYPES = {"int64": "TYPE_INT64", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
BATCH_AXIS = "batch"
# Names written into config.pbtxt's strings, and used as folder names: nothing to escape.
MAX_MODEL_NAME = 100
MODEL_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_MODEL_NAME - 1}}}")
TENSOR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,199}")
INT32_MAX, INT64_MAX, UINT64_MAX = 2**31 - 1, 2**63 - 1, 2**64 - 1
# Each setting's bounds: the least that makes sense, the most its ModelConfig field holds, that field's type.
SETTINGS = {
    "max_batch_size": (0, INT32_MAX, "an int32"),
    "instances": (1, INT32_MAX, "an int32"),
    "max_queue_delay_us": (0, UINT64_MAX, "a uint64"),
}


class ModelNameError(ExportError):
    """A name prefix that cannot name Triton models (the message says why): the caller's to change."""


def export_triton(
    bundle: Path,
    out: Path,
    max_batch_size: int = 8,
    instances: int = 1,
    max_queue_delay_us: int = 100,
    name: str | None = None,
) -> list[Path]:
    """Write a Triton model repository for ``bundle`` at ``out`` (a new or empty folder; nothing
    is ever overwritten): one model folder per graph, named ``NAME-<graph>``, NAME being ``name``
    or the bundle folder's name. Returns the model folders, in the manifest's order of graphs.
    ``max_batch_size``: the largest batch Triton forms (0: no Triton batching);
    ``instances``: CPU instances of each model; ``max_queue_delay_us``: how long the dynamic
    batcher waits for more requests; each bounded by its ModelConfig field's type. The bundle is
    first checked as the runtime's loader checks it."""
    _check_settings(max_batch_size, instances, max_queue_delay_us)
    check_outside(bundle, out)
    files = BundleFiles(bundle)
    manifest = files.manifest
    if files.format_version < 2:
        raise ExportError(
            f"{bundle} is a format 1 bundle, whose manifest leaves its conventions unstated (padding, "
            f"special tokens): export it again with this tfcompile"
        )
    prefix = name if name is not None else bundle.resolve().name
    if not MODEL_NAME.fullmatch(prefix):
        raise ModelNameError(
            f"{prefix!r} cannot name Triton models: use ASCII letters, digits, '_', '.' and '-' "
            f"(pass another name)"
        )
    if manifest.tokenizer is not None and manifest.tokenizer.file in (CONFIG, MANIFEST, VERSION):
        raise BundleError(
            f"{bundle}: its tokenizer's file name {manifest.tokenizer.file!r} is taken in a model folder"
        )
    check_new_folder(out, " (and move the model folders into an existing repository yourself)")
    check_bundle(files)
    configs = {}
    for graph_name, graph in manifest.graphs.items():
        model = f"{prefix}-{graph_name}"
        if not MODEL_NAME.fullmatch(f"x-{graph_name}"):  # with the shortest prefix
            raise BundleError(f"{bundle}: the graph name {graph_name!r} cannot name a Triton model")
        if not MODEL_NAME.fullmatch(model):  # a valid prefix, too long for this graph's name
            raise ModelNameError(
                f"{prefix!r} is too long to name Triton models: {model!r} has {len(model)} characters, "
                f"more than {MAX_MODEL_NAME} (pass a shorter name)"
            )
        about = f"tfcompile bundle {prefix}, graph {graph_name} ({graph.file})"
        configs[model] = (
            graph,
            model_config(model, graph, max_batch_size, instances, max_queue_delay_us, about),
        )

    manifest_text = manifest.model_dump_json(indent=2, exclude_none=True) + "\n"
    tokenizer = files.read(manifest.tokenizer.file) if manifest.tokenizer is not None else None
    tmp = staging_folder(out)
    try:
        for model, (graph, config) in configs.items():
            folder = tmp / model
            (folder / VERSION).mkdir(parents=True)
            (folder / VERSION / MODEL_FILE).write_bytes(files.read(graph.file))
            (folder / CONFIG).write_text(config)
            (folder / MANIFEST).write_text(manifest_text)
            if tokenizer is not None and manifest.tokenizer is not None:
                (folder / manifest.tokenizer.file).write_bytes(tokenizer)
        move_into_place(tmp, out, replacing=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out / model for model in configs]


def _check_settings(max_batch_size: int, instances: int, max_queue_delay_us: int) -> None:
    given = (max_batch_size, instances, max_queue_delay_us)
    for (arg, (least, most, field)), value in zip(SETTINGS.items(), given, strict=True):
        if type(value) is not int or not least <= value <= most:
            raise ExportError(
                f"{arg} must be a whole number from {least} to {most:,} (config.pbtxt holds it in "
                f"{field}), found {value!r}"
            )


def model_config(
    model: str, graph: Graph, max_batch_size: int, instances: int, max_queue_delay_us: int, about: str = ""
) -> str:
    """config.pbtxt (protobuf text format of Triton's ModelConfig) for one graph; ``about``, a
    line of plain words, becomes its first comment."""
    if "\n" in about:
        raise ValueError("about must be one line")
    _check_settings(max_batch_size, instances, max_queue_delay_us)
    lines = [
        f"# {about or 'tfcompile'}: manifest.json beside this file says what each tensor holds",
        f'name: "{model}"',
        f'platform: "{PLATFORM}"',
        f"max_batch_size: {max_batch_size}",
        *_tensors("input", graph.inputs, max_batch_size, graph.file),
        *_tensors("output", graph.outputs, max_batch_size, graph.file),
    ]
    if max_batch_size > 0:
        lines += ["dynamic_batching {", f"  max_queue_delay_microseconds: {max_queue_delay_us}", "}"]
    lines += ["instance_group [", "  {", "    kind: KIND_CPU", f"    count: {instances}", "  }", "]"]
    return "\n".join(lines) + "\n"


def _tensors(kind: str, tensors: list[Tensor], max_batch_size: int, where: str) -> list[str]:
    lines = [f"{kind} ["]
    for i, t in enumerate(tensors):
        if not TENSOR_NAME.fullmatch(t.name):
            raise BundleError(f"{where}: the tensor name {t.name!r} cannot be written into config.pbtxt")
        if max_batch_size > 0 and (not t.shape or t.shape[0] != BATCH_AXIS):
            raise ExportError(
                f"{where}: {t.name} {t.shape} has no leading {BATCH_AXIS!r} axis for Triton to batch; "
                f"export with max_batch_size=0"
            )
        dims = [d if isinstance(d, int) else -1 for d in (t.shape[1:] if max_batch_size > 0 else t.shape)]
        if max(dims, default=0) > INT64_MAX:
            raise BundleError(f"{where}: {t.name} {t.shape} has a size past the int64 dims Triton reads")
        # Triton wants at least one dim: a tensor of the batch axis alone is [1], reshaped to [].
        shape = (
            [f"    dims: [ {', '.join(map(str, dims))} ]"]
            if dims
            else ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
        )
        lines += [
            "  {",
            f'    name: "{t.name}"',
            f"    data_type: {TRITON_TYPES[t.dtype]}",
            *shape,
            "  }" + ("," if i < len(tensors) - 1 else ""),
        ]
    return [*lines, "]"]


__all__ = ["CONFIG", "MODEL_FILE", "PLATFORM", "export_triton", "model_config"]
