"""The bundle manifest: everything a client in any language needs to serve a bundle, as data.

The Pydantic models below are the contract: they validate a manifest when export writes it and
when a bundle loads, and ``manifest_schema()`` publishes them as the JSON Schema in
``schemas/manifest.schema.json`` (``tfcompile schema manifest``). Format 1 bundles, written by
earlier tfcompile versions, still load: ``parse_manifest`` reads them into format 2's shape.

This module imports neither torch nor onnxruntime: the runtime, the exporter and the tasks share it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from tfcompile.errors import BundleError
from tfcompile.sequences import SEQ2SEQ_TOKENS, SPECIAL_TOKENS

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SPEC_FILE = "spec.yaml"  # the resolved spec a bundle carries
MAX_MANIFEST_BYTES = 1 << 20

# A file of the bundle: one plain name inside its folder (no path, no "..", not hidden).
FileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", max_length=100)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[StrictInt, Field(gt=0)]
TokenId = Annotated[StrictInt, Field(ge=0)]
MAX_LENGTH_PENALTY = 10.0  # ((5 + length) / 6) ** alpha stays finite for any length a model reads
# How beam search scores a finished hypothesis and when it ends (TranslationInfo), and the length
# penalty each takes by default: fairseq's alpha as Vaswani et al. set it, generate()'s.
BeamScoringName = Literal["fairseq", "transformers"]
DEFAULT_LENGTH_PENALTY: dict[str, float] = {"fairseq": 0.6, "transformers": 1.0}
EarlyStopping = StrictBool | Literal["never"]
MAX_BEAM = 64  # a translation section's default beam
MAX_STOP_TOKENS = 64  # generation's stop tokens
MAX_SUPPRESSED_TOKENS = 1 << 16  # a translation's banned tokens
MAX_BANNED_SEQUENCES = 1024  # and its banned sequences (each checked at every step),
MAX_BANNED_SEQUENCE = 64  # of at most this many tokens
BannedSequences = Annotated[
    list[Annotated[list[TokenId], Field(min_length=2, max_length=MAX_BANNED_SEQUENCE)]],
    Field(max_length=MAX_BANNED_SEQUENCES),
]
MAX_NEW_TOKENS = 1 << 16  # a generation section's default limit (a caller may ask for more)
DEFAULT_MAX_NEW_TOKENS = 200  # the new tokens a request gets when it names no limit
DEFAULT_TEMPERATURE = 1.0  # and its temperature
REPETITION_PENALTIES = (0.01, 100.0)  # the repetition penalties a bundle or a request may set
MAX_INPUT_VALUES = 1 << 26  # a graph input's values with every named axis 1: 3 x 4,096 x 4,096 pixels fit


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Tensor(Part):
    """A graph input or output."""

    name: str = Field(description="the name the ONNX graph gives it, which a client feeds or reads")
    dtype: Literal["int64", "float32", "float16"] = Field(description="its element type, as numpy names it")
    shape: list[Count | str] = Field(description="sizes, or axis names for the dynamic axes")
    meaning: str = Field("", description="what the tensor holds, its axes and its convention")


class Cache(Part):
    """How a step graph's key/value cache works: start every ``past`` input with its
    ``past_sequence`` axis at 0 (zeros of shape [batch, n_kv_heads, 0, head_dim]); after each run,
    feed each ``present`` output back as the ``past`` input at the same index."""

    past: list[str] = Field(description="the cache inputs, in order (past_key_0, past_value_0, ...)")
    present: list[str] = Field(description="the cache outputs, each fed back as the past input at its index")
    axis: str = Field("past_sequence", description="the cache tensors' axis that grows by a step's tokens")


# The roles of a decoder's step graphs (Graph.role says what each does).
STEP_ROLE = "decode_step"
FIXED_STEP_ROLE = "decode_step_fixed"
Role = Literal["forward", "decode_step", "decode_step_fixed", "encoder", "decoder_step"]
# A graph's name in ``graphs``, by which a runtime finds it, and the roles a graph of that name has.
GraphName = Literal["model", "step", "fixed_step", "encoder"]
GRAPH_ROLES: dict[str, tuple[str, ...]] = {
    "model": ("forward",),
    "step": (STEP_ROLE, "decoder_step"),
    "fixed_step": (FIXED_STEP_ROLE,),
    "encoder": ("encoder",),
}
# The sections of the manifest a built-in task's bundle needs beside its graphs (the runtime
# classes of other tasks check their own).
TASK_SECTIONS: dict[str, tuple[str, ...]] = {
    "causal_lm": ("generation",),
    "classification": ("labels",),
    "seq2seq": ("translation",),
    "image_classification": ("labels",),
}


class Graph(Part):
    file: FileName = Field(description="the ONNX file, one of the bundle's files")
    role: Role = Field(
        description="forward: one pass over whole sequences; decode_step: new tokens with a "
        "key/value cache (a prompt first, from an empty cache, then one token per step); encoder: "
        "a source to the decoder's cross-attention keys and values; decoder_step: target tokens "
        "with a cache and the encoder's outputs; decode_step_fixed (optional, for CUDA graphs): "
        "decode_step at fixed shapes, one token per step with a window of the last "
        "max_seq_len - 1 positions' keys and values (after a prompt read by decode_step, its "
        "present tensors left-padded with zeros), which it returns slid by one position; a client "
        "may ignore it"
    )
    inputs: list[Tensor] = Field(description="what a run feeds, by name (an ONNX graph's inputs)")
    outputs: list[Tensor] = Field(description="what a run gives, by name, in the graph's order")
    cache: Cache | None = Field(None, description="a step graph's key/value cache; absent elsewhere")


class SpecialToken(Part):
    token: str = Field(description="the token as the tokenizer spells it ([EOS], </s>)")
    id: TokenId = Field(description="its id in the tokenizer's vocabulary")


class Truncation(Part):
    """How an over-long text is cut (the tokenizers library's truncation, as tokenizer.json says):
    at most ``max_length`` tokens, the added special tokens included, a sentence's tokens cut at
    its end (``right``) or its start (``left``); the special tokens are added after the cut.
    ``longest_first`` on a pair: the shorter sentence stays whole if it fits in half of the room
    left, the longer one taking the rest; otherwise each keeps half, the longer one the odd token
    (the second sentence, of two equally long). ``only_first`` and ``only_second`` cut that sentence
    of a pair alone; where it cannot make the room (a single text under only_second, a sentence
    shorter than the cut), the text or pair is cut longest-first."""

    max_length: Count
    strategy: Literal["longest_first", "only_first", "only_second"]
    direction: Literal["right", "left"]

    @classmethod
    def held_by(cls, cut: dict[str, Any] | None) -> Truncation | None:
        """A tokenizer's truncation as the tokenizers library reads it (``Tokenizer.truncation``,
        its defaults filled in); None where it has none."""
        if cut is None:
            return None
        return cls(max_length=cut["max_length"], strategy=cut["strategy"], direction=cut["direction"])


class TokenizerInfo(Part):
    """The tokenizer (the `tokenizers` library's JSON format) and its special tokens by role:
    pad, unk, bos, eos, cls, sep, mask (those the vocabulary has), and a translator's
    source_language and target_language codes (mBART's en_XX). Text becomes ids with the
    library's ``encode`` (``encode(first, second)`` for a sentence pair); text that spells a
    special token ("[SEP]", "[EOS]") becomes that token, as it does there. Ids become text with the
    special tokens skipped (the tokenizers library's ``decode(ids)``); a prompt and its
    continuation are decoded together.

    The tokenizer's vocabulary (``get_vocab_size()``, added tokens included) bounds the ids a
    client picks: where the logits are wider (``model.vocab_size``; a Hugging Face T5 has 32,128
    rows for 32,100 tokens), the columns from the tokenizer's size on are dropped before any
    softmax, argmax, sampling or beam search, in generation and translation alike."""

    file: FileName = Field(description="the tokenizer.json, one of the bundle's files")
    special_tokens: dict[str, SpecialToken] = Field(description="the special tokens by role")
    added_by_tokenizer: list[str] = Field(
        description="roles the tokenizer's post-processor inserts by itself; the client adds none of them"
    )
    unknown: Literal["map", "refuse"] = Field(
        description="map: a character outside the vocabulary becomes the unk token; refuse: it is an error"
    )
    truncation: Truncation | None = Field(
        None,
        description="applied when encoding, as in training; a classifier's text or pair at no more than "
        "model.max_seq_len tokens (encoded again, with this strategy and direction, at "
        "min(max_length, model.max_seq_len); a decoder's prompt is kept as cut, and generation reads "
        "its last generation.context_length tokens); none: a classifier's text or pair is cut longest_first "
        "from the right at model.max_seq_len tokens, the added special tokens included",
    )


class Padding(Part):
    """How a batch of sequences of different lengths is padded: ``side`` (left for generation, so
    that new tokens follow every row's last real token; right for classification and seq2seq, whose
    graphs were checked so; tfcompile's runtime refuses a bundle that says otherwise), with
    ``pad_id``, which the attention mask (0 at padding) hides: positions count real tokens, so a
    padded row reads as it would alone."""

    side: Literal["left", "right"]
    pad_id: TokenId


class GenerationInfo(Part):
    """Text generation (causal LMs): the longest sequence the model reads, the tokens that end a
    text, and the defaults a server uses when a request says nothing.

    Each step reads the logits of every row's last position, over the tokenizer's ids only (see
    tokenizer). Greedy decoding takes the largest, the lowest id of equal ones. A row stops at the
    first stop token it generates: that token is its last new id (and counts toward the limit),
    but not part of its text, which is the prompt and the tokens before the stop decoded together.

    A prompt longer than ``context_length`` tokens is read as its last ``context_length``; once a
    sequence (prompt and new tokens) is longer than ``context_length``, each step re-reads its last
    ``context_length`` tokens from an empty cache (a window that slides: a full pass a token). A
    left-padded batch may slide every row at once, as soon as its longest row is past the context
    (the last ``context_length`` columns of the ids and the mask): each row reads what it would
    alone. ``context_length`` is model.max_seq_len (tfcompile's runtime refuses another).

    Bans (transformers' logits processors of the same names), after the repetition penalty and
    before greedy or sampling: a token's logit is set to -inf if it is in ``suppressed_ids``; if
    it is a stop token and the row has generated fewer than ``min_new_tokens`` tokens, or holds
    fewer than ``min_length`` (its prompt's real tokens and those generated); or if,
    with ``no_repeat_ngram_size`` n > 0, the row's tokens (its whole prompt's, not only the
    context's, and those generated) with it after them would end in n tokens that occur in that
    order earlier in them; or if it is the last token of one of ``banned_sequences`` and the
    row's tokens end in the others. A row whose every token is banned ends there, without a new
    token."""

    context_length: Count
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKENS + 1)]
    max_new_tokens: Annotated[StrictInt, Field(gt=0, le=MAX_NEW_TOKENS)] = Field(
        DEFAULT_MAX_NEW_TOKENS,
        description="the new tokens a request gets when it names no limit, a stop token included",
    )
    temperature: Annotated[float, Field(ge=0)] = Field(
        DEFAULT_TEMPERATURE,
        description="0: greedy (tfcompile's runtime also decodes greedily below 1e-5); otherwise a "
        "token is drawn from the softmax of the logits divided by it (float64), after top_k, then "
        "top_p, then min_p. A seed repeats draws within one implementation only",
    )
    top_k: Count | None = Field(
        None, description="keep the k largest logits (and any equal to the k-th); null: every token"
    )
    top_p: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None,
        description="then, likeliest first, keep each token until those kept hold top_p of the "
        "probability (the token that reaches top_p is kept), and renormalise; null or 1: every token",
    )
    min_p: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None,
        description="then keep each token at least min_p times as probable as the likeliest, and "
        "renormalise (transformers' and vLLM's min_p); null or 0: every token",
    )
    repetition_penalty: Annotated[float, Field(ge=REPETITION_PENALTIES[0], le=REPETITION_PENALTIES[1])] = (
        Field(
            1.0,
            description="before greedy or sampling, the logit of each token the row holds already (its "
            "prompt's real tokens and those generated) is divided by it where positive and multiplied by "
            "it where negative, in float32, once per token (transformers' repetition_penalty); 1: none",
        )
    )
    min_new_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_NEW_TOKENS)] = Field(
        0, description="no stop token is chosen before a row has this many new tokens; 0 by default"
    )
    min_length: Annotated[StrictInt, Field(ge=0, le=MAX_NEW_TOKENS)] = Field(
        0,
        description="no stop token is chosen while a row holds fewer tokens, its prompt's real ones "
        "included (transformers' min_length); 0 by default",
    )
    no_repeat_ngram_size: Annotated[StrictInt, Field(ge=0, le=MAX_NEW_TOKENS)] = Field(
        0, description="no n-gram of this many tokens repeats in a row's tokens; 0 (no ban) by default"
    )
    suppressed_ids: Annotated[list[TokenId], Field(max_length=MAX_SUPPRESSED_TOKENS)] = Field(
        [], description="tokens never generated; none by default"
    )
    banned_sequences: BannedSequences = Field(
        [], description="sequences of two tokens or more never completed; none by default"
    )


class TranslationInfo(Part):
    """Translation (encoder-decoder). A source (``source_prefix_ids``, then the text encoded
    without the tokenizer's special tokens and cut to model.max_seq_len - len(source_prefix_ids) -
    len(source_suffix_ids) tokens, an empty one read as the unk token, then ``source_suffix_ids``)
    goes once through the encoder graph; its memory_key_i and memory_value_i outputs feed the
    decoder step's inputs of the same names at every step. The
    decoder starts from ``start_id`` and then ``target_prefix_ids`` (NLLB's target language code),
    given to it rather than chosen: the first step reads them all, and the first token chosen
    follows the last of them. A translation ends at ``stop_id`` or once the decoder has
    ``max_decode_len`` tokens after ``start_id``, the prefix's included (transformers'
    max_new_tokens; at most model.max_seq_len - 1 in all); with ``forced_eos`` the last of those
    is ``stop_id``, not chosen (transformers' forced_eos_token_id), so a translation cut there
    holds a token fewer. Each step reads the logits of the last
    position over the tokenizer's ids only (see tokenizer): the log-softmax below covers those ids
    alone. The translation's ids are the tokens chosen, without ``stop_id`` (neither the start
    nor the prefix); the text is decoded and stripped of leading and trailing ASCII whitespace
    (space, tab, newline, carriage return, form feed, vertical tab). A multilingual translator
    names its language codes among tokenizer.special_tokens (``source_language``,
    ``target_language``): to translate between other languages, a client puts another special
    token's id in place of the first in the source affixes and of the second in the prefix.

    Beam search with ``beam`` B and ``length_penalty`` a, as ``beam_scoring`` says. "fairseq"
    (Vaswani et al.'s; the default): one live hypothesis, no tokens chosen, summed
    log-probability 0 (the prefix is not scored). Each step, a candidate is a live hypothesis and
    a next token, scored by the hypothesis's sum plus the token's log-softmax of the logits
    (float64); the 2B best candidates are taken by score (ties: the lower index hypothesis *
    vocabulary + token first). In that order, a candidate whose token is
    ``stop_id`` finishes its hypothesis if it is among the first B, and is dropped otherwise;
    the others become the next live hypotheses, up to B. A finished hypothesis scores
    sum / ((5 + length) / 6) ** a, length counting its tokens chosen without ``stop_id``. The
    search ends once B hypotheses have finished. No hypothesis grows past ``max_decode_len``
    tokens less the prefix's: at the step whose candidates would, the stop candidates among the
    first B finish as above, then every live hypothesis finishes as it is, scored alike. With
    ``forced_eos``, the step before that one (whose token would be the last of them) ends every
    live hypothesis instead, its sum plus the log-softmax of ``stop_id`` scored as above. The
    translation is the best finished hypothesis (the first to finish, of equal scores); B = 1 is
    greedy decoding (the largest logit each step, the lowest id of equal ones), whatever the
    scoring.

    "transformers" (generate()'s beam search, 4's and 5's): B live hypotheses, copies with no
    tokens chosen, the first's sum 0 and the others' -1e9 (the prefix is not scored). Each step,
    candidates are scored as above (the bans below applied, and with ``forced_eos`` at the step
    whose token would be the last place, every candidate but each hypothesis's ``stop_id`` set to
    -inf and that one to 0), and the 2B best taken in the same order. A candidate ends if its
    token is ``stop_id`` or it would be the last place (``max_decode_len`` tokens after
    ``start_id``). Each ending candidate among the first B (but one scored -inf) is finished,
    scored sum / L ** a, L counting the decoder's tokens after ``start_id`` with the candidate's
    (the prefix's and ``stop_id`` included); the best B finished so far are kept (of equal scores,
    the earlier). The next live hypotheses are the B best candidates by score, an ending one's
    lowered by 1e9. The search ends at the last place, or after a step at which: with
    ``early_stopping`` true, B have finished; else B have finished and the best live hypothesis's
    sum / M ** a is at most the worst finished score, M its length (as L counts it) or, with
    ``early_stopping`` "never" and a > 0, ``max_decode_len``; or the best live sum / M ** a is at
    most -1e9 before B have finished. The translation is the best finished hypothesis, its tokens
    without ``stop_id``.

    Bans (transformers' logits processors of the same names): before each choice, greedy or a
    hypothesis's, a token is set to -inf (after the log-softmax, which the others keep) if it is
    in ``suppressed_ids``; if it is ``stop_id`` and the decoder holds fewer than
    ``min_decode_len`` tokens after ``start_id`` (the prefix's included); or if, with
    ``no_repeat_ngram_size`` n > 0, the decoder's tokens from ``start_id`` on, with it after them,
    would end in n tokens that occur in that order earlier in them; or if it is the last token of
    one of ``banned_sequences`` and the decoder's tokens end in the others. The ``stop_id`` that
    ``forced_eos`` puts in the last place is never banned. A greedy translation whose every token
    is banned ends there; "fairseq" never takes a banned candidate, and finishes a hypothesis whose
    every token is banned as it is (scored as above)."""

    start_id: TokenId
    stop_id: TokenId
    beam: Annotated[StrictInt, Field(gt=0, le=MAX_BEAM)]
    length_penalty: Annotated[float, Field(ge=-MAX_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY)] = Field(
        description="fairseq's alpha (at least 0), or the power of the length transformers divides by"
    )
    beam_scoring: BeamScoringName = Field(
        "fairseq", description="whose beam search: fairseq's (the default) or transformers' generate()'s"
    )
    early_stopping: EarlyStopping = Field(
        False, description="transformers' early_stopping (true, false or \"never\"); false with fairseq's"
    )
    max_decode_len: Count
    source_prefix_ids: list[TokenId] = Field(
        [], description="special tokens every source starts with (BART: its <s>); none by default"
    )
    source_suffix_ids: list[TokenId] = Field(
        [], description="special tokens every source ends with (T5: its </s>); none by default"
    )
    target_prefix_ids: list[TokenId] = Field(
        [],
        description="tokens the decoder reads after start_id before it chooses any (NLLB: the target "
        "language's code; transformers' forced_bos_token_id); none by default",
    )
    forced_eos: bool = Field(
        False,
        description="the last of the max_decode_len tokens is stop_id (transformers' forced_eos_token_id)",
    )
    min_decode_len: Annotated[StrictInt, Field(ge=0)] = Field(
        0, description="stop_id is banned while the decoder holds fewer tokens after start_id; 0 by default"
    )
    no_repeat_ngram_size: Annotated[StrictInt, Field(ge=0)] = Field(
        0, description="no n-gram of this many tokens repeats in the decoder's tokens; 0 (no ban) by default"
    )
    suppressed_ids: Annotated[list[TokenId], Field(max_length=MAX_SUPPRESSED_TOKENS)] = Field(
        [], description="tokens never chosen (Marian's pad); none by default"
    )
    banned_sequences: BannedSequences = Field(
        [], description="sequences of two tokens or more never completed; none by default"
    )


MEAN_RANGE, STD_RANGE = (-1e6, 1e6), (1e-6, 1e6)  # normalised pixels stay finite in float32


class ImageInfo(Part):
    """How an image becomes ``pixel_values``, step by step:

    1. decode the file to ``channel_order`` as Pillow's ``Image.convert`` does ("L": ITU-R 601-2
       luma with Pillow's integer rounding, alpha ignored; "RGB"), 16-bit samples taken as their
       high byte first (v >> 8 into an 8-bit image, then converted: Pillow's ``convert`` of a
       16-bit grey image clips at 255 instead; a file of 32-bit samples is refused); the pixels
       as stored (an EXIF orientation is not applied), the first frame of an animated or
       multi-page file;
    2. to float32 in [0, 1]: uint8 values divided by ``divide_by``; float arrays are taken as
       already in [0, 1] (an array of pixels is (height, width), or (height, width, channels)
       with exactly ``channels``: arrays are not colour converted);
    3. resize each channel (a float32 image) with Pillow's ``Image.resize(..., BILINEAR)`` (a
       triangle filter that widens when it shrinks, the horizontal pass first), as ``resize``
       says: ``shorter_side``, the shorter side becomes ``size`` and the other
       max(size, round(side * size / shorter side)), rounding half to even; ``stretch`` (as
       transformers' ViTImageProcessor), height and width both become ``size``; an image already
       size x size is left as it is;
    4. crop the centre square: offsets (height - size) // 2 and (width - size) // 2 (none after
       ``stretch``);
    5. subtract ``mean`` and divide by ``std``, per channel;
    6. lay out as ``layout`` (batch, channels, height, width), float32."""

    size: Count
    channels: Count
    channel_order: Literal["L", "RGB"]
    divide_by: Annotated[float, Field(ge=255, le=255)] = 255.0  # 8-bit images; named for clients
    resize: Literal["shorter_side", "stretch"] = "shorter_side"
    interpolation: Literal["bilinear"] = "bilinear"
    crop: Literal["center"] = "center"
    mean: list[Annotated[float, Field(ge=MEAN_RANGE[0], le=MEAN_RANGE[1])]]
    std: list[Annotated[float, Field(ge=STD_RANGE[0], le=STD_RANGE[1])]]
    layout: Literal["NCHW"] = "NCHW"

    @model_validator(mode="after")
    def _consistent(self) -> ImageInfo:
        """One mean and std per channel; files decode to as many channels as the colour mode has."""
        if not len(self.mean) == len(self.std) == self.channels:
            raise ValueError(f"mean and std need one value per channel ({self.channels})")
        if self.channels != {"L": 1, "RGB": 3}[self.channel_order]:
            raise ValueError(f"channel_order {self.channel_order} does not give {self.channels} channels")
        return self


class Transformation(Part):
    """One step of `tfcompile optimize`: what was done to every graph, by which tool, and how
    many operators of each kind it left (the fused or quantized ones)."""

    kind: Literal["fuse", "quantize", "precision"] = Field(
        description="fuse: operators fused into onnxruntime's (attention, layer norm, GELU); quantize: "
        "weights stored in fewer bits (int8, int4); precision: float32 tensors cast to float16"
    )
    tool: str = Field(description="the library and the call, with its version")
    settings: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="the call's settings that shaped the graphs, for a person to read"
    )
    operators: dict[str, StrictInt] = Field(
        default_factory=dict, description="operators the step introduced, counted over every graph"
    )


class Gate(Part):
    """The accuracy gate an optimized bundle passed: the task's held-out metric, measured with
    onnxruntime on the source bundle and on this one, and the change allowed."""

    metric: str = Field(description="the task's held-out metric (accuracy, loss, bleu)")
    data: str = Field(description="the held-out data it was measured on")
    source: float = Field(description="the metric of the source bundle")
    optimized: float = Field(description="the metric of this bundle")
    allowed: str = Field(description="the largest change accepted, e.g. +1% or -0.5")


class Optimization(Part):
    """How this bundle was made from another by `tfcompile optimize`."""

    source: Sha256 = Field(description="the sha256 of the source bundle's manifest.json")
    steps: list[Transformation] = Field(description="what optimize did, in order")
    parity: dict[str, float] = Field(
        description="per graph, over fresh inputs at several shapes (a fixed step graph over a window "
        "its step graph filled): at each shape, the largest |difference| of its float outputs from the "
        "source graph's relative to the largest |value| of the outputs (a step graph's: of its logits); "
        "the largest over the shapes, as verify measures a graph against PyTorch"
    )
    gate: Gate | None = Field(None, description="absent when no held-out data was given (--no-gate)")


class ModelInfo(Part):
    family: str = Field(description="the spec's model family (decoder, encoder, encoder_decoder, vit)")
    vocab_size: Count | None = Field(
        None,
        description="the token ids the graphs read and the width of their vocabulary logits; it may "
        "exceed the tokenizer's vocabulary, which bounds the ids a client picks (see tokenizer)",
    )
    max_seq_len: Count = Field(description="the longest sequence a graph reads (its context)")


class Manifest(Part):
    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, title="tfcompile bundle manifest"
    )

    format_version: Literal[2] = Field(
        description="this format's version; a client refuses a version it was not written for"
    )
    task: str = Field(
        description="what the graphs do, which says the sections that follow: causal_lm, "
        "classification, seq2seq or image_classification (a runtime may serve more tasks)"
    )
    precision: Literal["fp32", "fp16"] = Field(
        description="the graphs' floating-point inputs and outputs: float32, or float16 (a client "
        "feeds and reads the dtype each tensor names)"
    )
    model: ModelInfo
    graphs: dict[GraphName, Graph] = Field(
        description="the graphs by name, the name saying the role: model (forward), step "
        "(decode_step in a causal_lm bundle, decoder_step in a seq2seq one), fixed_step "
        "(decode_step_fixed) and encoder (encoder); a client may find each by either"
    )
    padding: Padding
    tokenizer: TokenizerInfo | None = None
    labels: Annotated[list[str], Field(min_length=1)] | None = Field(
        None,
        description="class names, by the index of the logits; the labels' probabilities are the "
        "softmax of a row's logits (computed in float64)",
    )
    generation: GenerationInfo | None = None
    translation: TranslationInfo | None = None
    image: ImageInfo | None = None
    opset: Count = Field(description="the ONNX opset of the graphs (the default domain's)")
    versions: dict[str, str] = Field(
        description="the versions of tfcompile and of the libraries that wrote the graphs, by name"
    )
    source: dict[str, Any] = Field(
        description="where the weights came from, for a person to read: a run (its folder, the "
        "checkpoint asked for and the one read), or a seed; no client reads it"
    )
    parity: dict[str, Any] = Field(
        description="the export's parity report per graph, against PyTorch on fresh inputs: its "
        "tolerance (relative to the outputs' scale where relative is true), passed, the largest "
        "max_abs_diff and max_rel_diff, and each case's (batch, seq, padded) figures; an optimized "
        "bundle keeps its export's, and its own graphs differ from those by what "
        "optimization[].parity records"
    )
    files: dict[FileName, Sha256] = Field(description="every file of the bundle but this one, and its sha256")
    optimization: list[Optimization] | None = Field(
        None, description="the optimizations that made this bundle from an export, oldest first"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for section in TASK_SECTIONS.get(self.task, ()):
            if getattr(self, section) is None:
                raise ValueError(f"a {self.task} bundle's manifest needs its {section}")
        for name, graph in self.graphs.items():
            if graph.role not in GRAPH_ROLES[name]:
                roles = " or ".join(GRAPH_ROLES[name])
                raise ValueError(f"graphs.{name}.role is {graph.role!r}; the {name} graph's is {roles}")
            if graph.file not in self.files:
                raise ValueError(f"graphs.{name}.file {graph.file!r} is not listed in files")
            _check_sizes(f"graphs.{name}.inputs", graph)
            if graph.cache is not None:
                _check_cache(f"graphs.{name}.cache", graph)
        if self.tokenizer is not None and self.tokenizer.file not in self.files:
            raise ValueError(f"tokenizer.file {self.tokenizer.file!r} is not listed in files")
        if self.labels is not None and (not all(self.labels) or len(set(self.labels)) != len(self.labels)):
            raise ValueError(f"labels must be distinct names, found {self.labels}")
        t = self.translation
        if t is not None and len(t.source_prefix_ids) + len(t.source_suffix_ids) >= self.model.max_seq_len:
            raise ValueError(
                f"translation.source_prefix_ids and source_suffix_ids leave no room for a source in "
                f"model.max_seq_len ({self.model.max_seq_len})"
            )
        if t is not None and t.beam_scoring == "fairseq" and (t.length_penalty < 0 or t.early_stopping):
            raise ValueError(
                f"translation.length_penalty ({t.length_penalty}) and early_stopping ({t.early_stopping}) "
                f"must be at least 0 and false with beam_scoring fairseq"
            )
        if t is not None and t.stop_id in t.target_prefix_ids:
            raise ValueError("translation.target_prefix_ids holds stop_id, which ends every translation")
        if t is not None and t.stop_id in t.suppressed_ids:
            raise ValueError(
                "translation.suppressed_ids holds stop_id: no translation could end before its limit"
            )
        if t is not None and t.min_decode_len > t.max_decode_len:
            raise ValueError(
                f"translation.min_decode_len ({t.min_decode_len}) is past max_decode_len ({t.max_decode_len})"
            )
        if t is not None and len(t.target_prefix_ids) >= min(t.max_decode_len, self.model.max_seq_len - 1):
            raise ValueError(
                f"translation.target_prefix_ids hold {len(t.target_prefix_ids)} tokens, which leave none to "
                f"choose within max_decode_len ({t.max_decode_len}) and model.max_seq_len - 1 "
                f"({self.model.max_seq_len - 1})"
            )
        g = self.generation
        if g is not None and (stopped := sorted(set(g.stop_token_ids) & set(g.suppressed_ids))):
            raise ValueError(
                f"generation.suppressed_ids holds the stop tokens {stopped}, which then never end a text"
            )
        if self.model.vocab_size is not None:
            for field, i in self._token_ids():
                if i >= self.model.vocab_size:
                    raise ValueError(f"{field} is {i}, outside the vocabulary of {self.model.vocab_size}")
        return self

    def _token_ids(self) -> list[tuple[str, int]]:
        """(field, id) of every token id the manifest gives."""
        ids = [("padding.pad_id", self.padding.pad_id)]
        if self.tokenizer is not None:
            ids += [
                (f"tokenizer.special_tokens.{r}.id", t.id) for r, t in self.tokenizer.special_tokens.items()
            ]
        if self.generation is not None:
            ids += [("generation.stop_token_ids", i) for i in self.generation.stop_token_ids]
            ids += [("generation.suppressed_ids", i) for i in self.generation.suppressed_ids]
            ids += [("generation.banned_sequences", i) for s in self.generation.banned_sequences for i in s]
        if self.translation is not None:
            t = self.translation
            ids += [("translation.start_id", t.start_id), ("translation.stop_id", t.stop_id)]
            ids += [("translation.source_prefix_ids", i) for i in t.source_prefix_ids]
            ids += [("translation.source_suffix_ids", i) for i in t.source_suffix_ids]
            ids += [("translation.target_prefix_ids", i) for i in t.target_prefix_ids]
            ids += [("translation.suppressed_ids", i) for i in t.suppressed_ids]
            ids += [("translation.banned_sequences", i) for s in t.banned_sequences for i in s]
        return ids


def _check_sizes(where: str, graph: Graph) -> None:
    """The smallest tensor each input takes (every named axis 1) holds at most
    MAX_INPUT_VALUES: the runtime builds such tensors from the manifest's sizes (a warm-up call,
    an empty cache), so the sizes must not ask it for more memory than a model's input needs."""
    for tensor in graph.inputs:
        values = math.prod(size for size in tensor.shape if isinstance(size, int))
        if values > MAX_INPUT_VALUES:
            raise ValueError(
                f"{where}: {tensor.name}'s fixed sizes {tensor.shape} make {values:,} values with each "
                f"named axis 1, more than the {MAX_INPUT_VALUES:,} a bundle's input may hold"
            )


def _check_cache(where: str, graph: Graph) -> None:
    """A cache's past tensors are inputs of the graph, each with the cache axis, and as many as
    its present tensors, which are outputs."""
    assert graph.cache is not None
    inputs = {t.name: t for t in graph.inputs}
    outputs = {t.name for t in graph.outputs}
    if len(graph.cache.past) != len(graph.cache.present):
        raise ValueError(
            f"{where}: past and present must pair up, found {len(graph.cache.past)} and "
            f"{len(graph.cache.present)}"
        )
    for name in graph.cache.past:
        if name not in inputs or graph.cache.axis not in inputs[name].shape:
            raise ValueError(
                f"{where}.past: {name!r} is not an input of the graph with a {graph.cache.axis} axis"
            )
    for name in graph.cache.present:
        if name not in outputs:
            raise ValueError(f"{where}.present: {name!r} is not an output of the graph")


def manifest_schema() -> dict[str, Any]:
    """The JSON Schema of format 2, as published in schemas/manifest.schema.json."""
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["allOf"] = [  # each task's section
        {
            "if": {"properties": {"task": {"const": task}}},
            "then": {
                "required": list(sections),
                "properties": {section: {"not": {"type": "null"}} for section in sections},
            },
        }
        for task, sections in TASK_SECTIONS.items()
    ]
    schema["allOf"] += [  # each graph's roles by its name
        {"properties": {"graphs": {"properties": {name: {"properties": {"role": {"enum": list(roles)}}}}}}}
        for name, roles in GRAPH_ROLES.items()
    ]
    _closed_keys(schema)
    return schema


def _closed_keys(node: Any) -> None:
    """Pydantic writes a dict whose keys have a pattern as ``patternProperties``, which lets a key
    that does not match through unchecked; the schema refuses such keys, as the parser does."""
    if isinstance(node, dict):
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and len(patterns) == 1:
            node["propertyNames"] = {**node.get("propertyNames", {}), "pattern": next(iter(patterns))}
            node["additionalProperties"] = False
        for value in node.values():
            _closed_keys(value)
    elif isinstance(node, list):
        for value in node:
            _closed_keys(value)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: parsers disagree on which of two equal keys wins,
    so a client and this loader could read two different manifests from one file."""
    twice = sorted(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
    if twice:
        raise ValueError(f"the keys {twice[:5]} appear twice in one object")
    return dict(pairs)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a JSON number that other parsers read")
    return value


def parse_manifest(data: bytes, where: str) -> tuple[Manifest, int]:
    """A manifest's bytes -> a validated Manifest (format 1 is read into format 2's shape) and the
    format the file declared; a BundleError naming the key at fault otherwise."""
    try:
        raw = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_float=_finite_float,
        )
        json.dumps(raw, ensure_ascii=False).encode("utf-8")  # no lone surrogate ("\\ud800") in a string
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, an integer of 4,300+ digits
        raise BundleError(f"{where} is not valid JSON ({e}); export the bundle again") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{where} must hold a JSON object, found {type(raw).__name__}")
    version = raw.get("format_version")
    if type(version) is not int or version < 1:
        raise BundleError(f"{where}: format_version must be a positive integer, found {version!r}")
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{where} has bundle format {version}, newer than this tfcompile reads (format "
            f"{FORMAT_VERSION}): upgrade tfcompile to load it"
        )
    try:
        fields = raw if version == FORMAT_VERSION else _upgrade(ManifestV1.model_validate(raw))
        return Manifest.model_validate(fields), version
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        text = first["msg"].removeprefix("Value error, ")
        message = f"{key}: {text}" if key else text
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise BundleError(f"{where}: {message}{more}") from None


# ------------------------------------------------------------------------ format 1


class ModelInfoV1(Part):
    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str
    vocab_size: Count | None = None
    max_seq_len: Count
    labels: list[str] | None = None
    image_size: Count | None = None
    channels: Count | None = None
    n_layers: Count | None = None
    n_kv_heads: Count | None = None
    head_dim: Count | None = None
    beam: Count | None = None
    length_penalty: Annotated[float, Field(ge=0)] | None = None
    max_decode_len: Count | None = None
    bos_id: TokenId | None = None
    eos_id: TokenId | None = None


class GraphV1(Part):
    file: FileName
    inputs: list[Tensor]
    outputs: list[Tensor]


class ManifestV1(Part):
    """Format 1 (tfcompile before bundle format 2): the same graphs without roles or meanings;
    special tokens, padding and image preprocessing were conventions, not data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1]
    task: str
    precision: Literal["fp32", "fp16"]
    model: ModelInfoV1
    graphs: dict[str, GraphV1]
    opset: Count
    versions: dict[str, str]
    source: dict[str, Any]
    parity: dict[str, Any]
    files: dict[FileName, Sha256]


# What format 1 left to convention: each task's special tokens, at fixed ids.
_V1_SPECIALS = {
    "classification": dict(zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS, strict=True)),
    "seq2seq": dict(zip(("pad", "unk", "bos", "eos"), SEQ2SEQ_TOKENS, strict=True)),
}
_V1_ROLES = {"model": "forward", "encoder": "encoder"}


def _upgrade(v1: ManifestV1) -> dict[str, Any]:
    """Format 1 -> format 2's fields (the graphs are unchanged: a format 1 decoder step graph
    counts positions from its cache, so its rows must not be left-padded)."""
    m = v1.model
    graphs = {}
    for name, g in v1.graphs.items():
        step = any(i.name.startswith("past_") for i in g.inputs)
        role = _V1_ROLES.get(name, "decoder_step" if v1.task == "seq2seq" else "decode_step")
        cache = None
        if step:
            cache = Cache(
                past=[i.name for i in g.inputs if i.name.startswith("past_")],
                present=[o.name for o in g.outputs if o.name.startswith("present_")],
            )
        graphs[name] = Graph(file=g.file, role=role, inputs=g.inputs, outputs=g.outputs, cache=cache)
    sections: dict[str, Any] = {}
    specials = _V1_SPECIALS.get(v1.task, {})
    if "tokenizer.json" in v1.files:
        sections["tokenizer"] = TokenizerInfo(
            file="tokenizer.json",
            special_tokens={
                role: SpecialToken(token=t, id=i) for i, (role, t) in enumerate(specials.items())
            },
            added_by_tokenizer=["cls", "sep"] if v1.task == "classification" else [],
            unknown="map" if specials else "refuse",
        )
    if v1.task == "causal_lm":
        sections["generation"] = GenerationInfo(context_length=m.max_seq_len, stop_token_ids=[])
    if v1.task == "seq2seq" and m.bos_id is not None and m.eos_id is not None:
        sections["translation"] = TranslationInfo(
            start_id=m.bos_id,
            stop_id=m.eos_id,
            beam=m.beam or 1,
            length_penalty=m.length_penalty or 0.0,
            max_decode_len=m.max_decode_len or m.max_seq_len - 1,
        )
    return {
        "format_version": 2,
        "task": v1.task,
        "padding": Padding(side="left" if v1.task == "causal_lm" else "right", pad_id=0),
        "precision": v1.precision,
        "model": {"family": m.family, "vocab_size": m.vocab_size, "max_seq_len": m.max_seq_len},
        "graphs": graphs,
        "labels": m.labels,
        "opset": v1.opset,
        "versions": v1.versions,
        "source": v1.source,
        "parity": v1.parity,
        "files": v1.files,
        **sections,
    }


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "Cache",
    "GenerationInfo",
    "Graph",
    "ImageInfo",
    "Manifest",
    "ModelInfo",
    "Padding",
    "SpecialToken",
    "Tensor",
    "TokenizerInfo",
    "TranslationInfo",
    "Truncation",
    "manifest_schema",
    "parse_manifest",
]
