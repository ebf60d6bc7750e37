"""Every field of every supported transformers config class, field by field: a config.json of a
supported model_type either imports to a model whose outputs are transformers' (float32, within
1e-5 of the logits' scale, rows padded and not, sequences past every window and original length
the case sets) and writes back with ``export-hf`` to a folder transformers reads to the same
outputs, or is refused with an HFError naming the config field; never a silent mismatch, never
a traceback.

``CASES`` is the table: one row per field and value (non-default values, edge values, each enum
string), built on a tiny model of the family, with the outcome transformers' code implies:
``SAME`` or the config field the refusal names. A field is set through the config class where
transformers builds such a model, else written into the saved config.json (``json=``), as a
folder saved by another version, or by hand, holds it. ``test_every_config_field_has_a_case``
holds the table to the installed config classes: a field transformers adds fails it until a row
says what it does. The default suite runs one or a few rows per field; ``-m slow`` runs them all,
and every activation name transformers has in every family."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import BERT, DECODER, VIT, VOCAB, from_pretrained, perturb, random_ids, right_padding, write

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.models import Encoder, Seq2Seq
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SAME = "same"
DELETE = object()  # a json= value: the key is removed from config.json


@dataclass(frozen=True)
class Family:
    config: Callable[..., Any]
    model: Callable[[Any], Any]
    tokenizer: str  # hf_models.write's kind
    base: dict[str, Any]  # tiny sizes, set in every case (so covered)


FAMILIES = {
    "gpt2": Family(
        T.GPT2Config,
        T.GPT2LMHeadModel,
        "gpt2",
        dict(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2),
    ),
    "llama": Family(T.LlamaConfig, T.LlamaForCausalLM, "llama", DECODER),
    "mistral": Family(T.MistralConfig, T.MistralForCausalLM, "llama", DECODER | {"sliding_window": None}),
    "qwen2": Family(T.Qwen2Config, T.Qwen2ForCausalLM, "gpt2", DECODER),
    "qwen3": Family(T.Qwen3Config, T.Qwen3ForCausalLM, "gpt2", DECODER | {"head_dim": 8}),  # its default: 128
    "bert": Family(T.BertConfig, T.BertForMaskedLM, "bert", BERT),
    "bert_cls": Family(
        T.BertConfig,
        T.BertForSequenceClassification,
        "bert",
        BERT
        | {"id2label": {0: "neg", 1: "pos", 2: "neutral"}, "label2id": {"neg": 0, "pos": 1, "neutral": 2}},
    ),
    "bert_pretraining": Family(T.BertConfig, T.BertForPreTraining, "bert", BERT),
    "t5": Family(
        T.T5Config,
        T.T5ForConditionalGeneration,
        "t5",
        dict(
            vocab_size=VOCAB,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=20,
            decoder_start_token_id=0,
        ),
    ),
    "vit": Family(
        T.ViTConfig,
        T.ViTForImageClassification,
        "image",
        VIT,
    ),
}
# Which config class each model_type's rows check (bert_cls and bert_pretraining are BERT's heads).
CLASSES = {
    "gpt2": ["gpt2"],
    "llama": ["llama"],
    "mistral": ["mistral"],
    "qwen2": ["qwen2"],
    "qwen3": ["qwen3"],
    "bert": ["bert", "bert_cls", "bert_pretraining"],
    "t5": ["t5"],
    "vit": ["vit"],
}


@dataclass(frozen=True)
class Case:
    family: str
    edits: dict[str, Any]  # config class arguments
    json: dict[str, Any]  # then written into config.json as saved (DELETE removes the key)
    outcome: str  # SAME, or the config field the refusal names
    spec: dict[str, Any] = field(default_factory=dict)  # dotted spec fields the import must write
    length: int = 20  # the longest sequence compared (capped at the context)
    exported: bool = True  # export-hf writes it back (a refusal there names a spec field)
    slow: bool = False
    bug: str | None = None  # a known mismatch: strict xfail until fixed

    @property
    def id(self) -> str:
        def shown(value: Any) -> str:
            if value is DELETE:
                return "DELETE"
            if isinstance(value, dict):
                return "{" + ",".join(f"{k}={shown(v)}" for k, v in value.items() if k != "rope_theta") + "}"
            return str(value).replace(" ", "")

        parts = [f"{k}={shown(v)}" for k, v in self.edits.items()]
        parts += [f"json:{k}={shown(v)}" for k, v in self.json.items()]
        return f"{self.family}-" + ",".join(parts)

    def fields(self) -> set[str]:
        return set(self.edits) | set(self.json)


def case(
    family: str,
    outcome: str = SAME,
    json: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    slow: bool = False,
    exported: bool = True,
    length: int = 20,
    bug: str | None = None,
    **edits: Any,
) -> Case:
    return Case(family, edits, json or {}, outcome, spec or {}, length, exported, slow, bug)


def rope(**fields: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": 10000.0, **fields}}


LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8)


def longrope(pairs: int = 4, **fields: Any) -> dict[str, Any]:
    """A LongRoPE dict of ``pairs`` rotated pairs, each pair's factors their own, whose original
    length (8) the tables' rows of 15 to 20 tokens pass: they turn at the long factors."""
    short = [1.0 + i / 2 for i in range(pairs)]
    return (
        dict(
            rope_type="longrope",
            short_factor=short,
            long_factor=[3.0 + f for f in short],
            original_max_position_embeddings=8,
        )
        | fields
    )


@pytest.mark.parametrize(
    "window",
    [
        {"sliding_window": 4},  # unread_window
        {"attention_chunk_size": 4},  # unread_chunks
        {"layer_types": ["full_attention", "chunked_attention"], "attention_chunk_size": 4},
    ],
)
def test_transformers_generation_slides_a_window_its_forward_ignores(window: dict[str, Any]) -> None:
    """Why a sliding_window or attention_chunk_size the model type reads not is refused:
    transformers' forward of a Llama attends over every position, its cached decoding over the last
    window (chunk)."""
    torch.manual_seed(0)
    config = T.LlamaConfig(**DECODER | window)
    model = perturb(T.LlamaForCausalLM(config)).eval()
    ids = random_ids(1, 12)
    with torch.no_grad():
        forward = model(ids).logits
        out = model(ids[:, :6], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(6, 12):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
    assert (torch.cat(steps, 1) - forward).abs().max() > 1e-2


# A token id in range that is not 0 (the special tokens' ids do not change the computation).
IDS = dict(pad_token_id=3, bos_token_id=5, eos_token_id=6)


def llama_family(f: str) -> list[Case]:
    """The rows every LLaMA-family config shares (the four read the same fields alike)."""
    slow = True  # one by one in the slow sweep; the default suite the combined row and a few
    return [
        case(  # the fields that take any value at once: each row below sets one
            f,
            head_dim=16,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rms_norm_eps=1e-2,
            hidden_act="gelu",
            initializer_range=0.5,
            attention_dropout=0.3,
            spec={"head_dim": 16, "n_kv_heads": 1, "tie_embeddings": True, "activation": "geglu"},
        ),
        case(f, head_dim=16, spec={"head_dim": 16}, slow=slow),  # heads wider than d_model / heads
        case(f, head_dim=4, slow=True),
        case(f, num_key_value_heads=1, spec={"n_kv_heads": 1}, slow=slow),  # MQA
        case(f, num_key_value_heads=4, slow=True),  # MHA
        case(f, outcome="num_key_value_heads", num_key_value_heads=3, slow=f != "llama"),  # not a divisor
        case(f, tie_word_embeddings=True, spec={"tie_embeddings": True}, slow=slow),
        case(f, rms_norm_eps=1e-2, slow=slow),
        case(f, hidden_act="gelu", spec={"activation": "geglu"}, slow=slow),
        case(f, hidden_act="gelu_pytorch_tanh", spec={"activation": "geglu_tanh"}, slow=True),
        case(f, hidden_act="swish", slow=True),
        case(
            f, outcome="hidden_act", hidden_act="relu", slow=f != "llama"
        ),  # a gated ReLU is not in the spec
        case(f, outcome="hidden_act", hidden_act="quick_gelu", slow=True),
        case(f, initializer_range=0.5, slow=slow),
        case(f, initializer_range=0.0, slow=True),  # initialisation only: never read by an import
        case(f, attention_dropout=0.3, slow=slow),  # training only
        case(f, use_cache=False, slow=True),
        case(f, slow=True, **IDS),
        case(f, eos_token_id=[6, 7], slow=True),
        case(f, max_position_embeddings=8, spec={"max_seq_len": 8}, slow=True),
        case(f, num_hidden_layers=1, slow=True),
        # RoPE: theta, each scaling type, as transformers 5 writes it and 4 (legacy keys)
        case(f, **{"rope_parameters": {"rope_theta": 500.0, "rope_type": "default"}}, slow=slow),
        case(f, **rope(rope_type="linear", factor=2.0), slow=f != "llama"),
        case(f, outcome="rope_parameters", **rope(rope_type="linear", factor=0.5), slow=True),
        case(f, **rope(rope_type="dynamic", factor=2.0), slow=f != "llama"),
        # dynamic scales from max_position_embeddings, whatever original_max_position_embeddings says
        case(f, **rope(rope_type="dynamic", factor=2.0, original_max_position_embeddings=8), slow=True),
        case(f, **rope(**YARN), slow=slow),
        case(f, **rope(rope_type="yarn", factor=4.0), slow=True),  # original: max_position_embeddings
        case(f, **rope(**YARN, mscale=0.7, mscale_all_dim=0.5), slow=f != "llama"),
        case(f, **rope(**YARN, mscale=0.7), slow=True),  # mscale alone is not read
        case(f, **rope(**YARN, mscale=0, mscale_all_dim=0, beta_fast=0, beta_slow=0), slow=True),  # 0: unset
        case(f, **rope(**YARN, attention_factor=1.3), slow=True),
        case(f, **rope(**YARN, beta_fast=8, beta_slow=2, truncate=False), slow=slow),
        case(f, **rope(rope_type="yarn", factor=1.0, original_max_position_embeddings=8), slow=True),
        case(f, outcome="rope_parameters", **rope(**YARN, attention_factor=0.0), slow=True),
        case(f, **rope(**LLAMA3, original_max_position_embeddings=8), slow=slow),
        case(f, **rope(**LLAMA3), slow=True),  # original: max_position_embeddings
        case(
            f,
            outcome="rope_parameters",
            **rope(rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=4.0),
            slow=True,
        ),
        # LongRoPE: within the original length (32 here) at the short factors, past it at the long ones
        case(f, **rope(**longrope(original_max_position_embeddings=32)), slow=True),
        case(f, **rope(**longrope()), slow=f != "llama"),
        case(f, **rope(**longrope(factor=2.0)), slow=True),  # the attention factor from it
        case(f, **rope(**longrope(attention_factor=0.5)), slow=True),
        case(
            f,
            json={"original_max_position_embeddings": 8},
            **rope(**longrope(original_max_position_embeddings=99)),
            slow=True,
        ),
        case(f, outcome="rope_parameters.short_factor", json=rope(**longrope(short_factor=None)), slow=True),
        case(f, outcome="rope_parameters", json=rope(**longrope(pairs=3)), slow=True),
        # a number written as text (the spec would parse it; transformers fails on it)
        case(f, outcome="rope_parameters.factor", json=rope(**YARN | {"factor": "4"}), slow=True),
        case(
            f,
            outcome="rope_parameters.short_factor",
            json=rope(**longrope(short_factor=["1"] * 4)),
            slow=True,
        ),
        case(f, outcome="rope_parameters.truncate", json=rope(**YARN | {"truncate": 0}), slow=True),
        # an object in the dict: no RoPE per layer type (those are keyed by layer type), refused by its key
        case(
            f, outcome="rope_parameters.long_factor", json=rope(**longrope(long_factor={"a": 1})), slow=True
        ),
        case(  # a RoPE per layer type, which LLaMA's config classes do not read
            f,
            outcome="rope_parameters",
            json={"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
            slow=f != "llama",
        ),
        # a top-level original_max_position_embeddings (Phi-3's way) is read over the dict's
        case(f, json={"original_max_position_embeddings": 4}, **rope(**LLAMA3), slow=f != "llama"),
        case(  # (1000 in the dict, 4 read: another ramp)
            f,
            json={"original_max_position_embeddings": 4},
            **rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=1000),
            slow=True,
        ),
        case(f, outcome="partial_rotary_factor", json={"partial_rotary_factor": 0.5}, slow=f != "llama"),
        case(
            f,
            outcome="partial_rotary_factor",
            **rope(rope_type="default", partial_rotary_factor=0.5),
            slow=True,
        ),
        case(f, json={"partial_rotary_factor": 1.0}, slow=True),
        case(f, json={"rope_parameters": DELETE, "rope_theta": 777.0}, slow=slow),  # transformers 4's keys
        case(
            f,
            json={"rope_parameters": DELETE, "rope_scaling": {"type": "linear", "factor": 3.0}},
            slow=f != "llama",
        ),
        case(
            f,
            json={"rope_parameters": DELETE, "rope_scaling": {"rope_type": "dynamic", "factor": 3.0}},
            slow=True,
        ),
        case(
            f,
            json={
                "rope_parameters": DELETE,
                "rope_scaling": {**LLAMA3, "original_max_position_embeddings": 8},
            },
            slow=True,
        ),
        case(f, json={"rope_parameters": DELETE, "rope_scaling": {"type": "yarn", "factor": 2.0}}, slow=True),
        case(  # rope_scaling over rope_parameters, its rope_theta over the top-level one
            f,
            json={
                "rope_parameters": {"rope_type": "default", "rope_theta": 10.0},
                "rope_scaling": {"type": "linear", "factor": 2.0, "rope_theta": 33.0},
                "rope_theta": 50.0,
            },
            slow=True,
        ),
        # Qwen2 has no head_dim; Qwen3's must be a number (it refuses null)
        *([case(f, json={"head_dim": None}, slow=True)] if f not in ("qwen2", "qwen3") else []),
        case(f, json={"pretraining_tp": 2}, slow=True),  # transformers 4's; 5 computes as one
    ]


EVERY_LAYER_6 = {"window.size": 6, "window.layers": None}  # a window of 6 on every layer


def qwen_windows(f: str) -> list[Case]:
    """The sliding-window rows Qwen2 and Qwen3 share (their configs derive layer_types alike)."""
    every, second = EVERY_LAYER_6, {"window.size": 6, "window.layers": [1]}
    return [
        # each slides from max_window_layers on, and only with use_sliding_window
        case(f, use_sliding_window=True, sliding_window=6, max_window_layers=0, spec=every, slow=True),
        case(f, use_sliding_window=True, sliding_window=6, max_window_layers=1, spec=second),
        case(
            f,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
            json={"layer_types": DELETE},
            spec=second,
            slow=True,
        ),
        case(f, use_sliding_window=True, sliding_window=6, max_window_layers=2, spec={"window": None}),
        case(f, use_sliding_window=False, sliding_window=6, max_window_layers=0, spec={"window": None}),
        case(
            f,
            use_sliding_window=True,
            sliding_window=6,
            layer_types=["full_attention", "full_attention"],
            spec={"window": None},
            slow=True,
        ),
        case(
            f,
            use_sliding_window=True,
            sliding_window=6,
            layer_types=["full_attention", "sliding_attention"],
            spec=second | {"max_seq_len": 32},
            slow=True,
        ),
        case(f, use_sliding_window=True, sliding_window=None, max_window_layers=0, slow=True),
        # a kind a LLaMA-like model builds no mask for, or of another count than the layers:
        # transformers fails on them
        case(
            f,
            outcome="layer_types",
            use_sliding_window=True,
            sliding_window=6,
            json={"layer_types": ["sliding_attention", "chunked_attention"]},
        ),
        case(
            f,
            outcome="layer_types",
            use_sliding_window=True,
            sliding_window=6,
            json={"layer_types": ["sliding_attention"] * 3},
            slow=True,
        ),
    ]


CASES: list[Case] = [
    # ------------------------------------------------------------------------ GPT-2
    case(  # the fields that take any value at once: each row below sets one
        "gpt2",
        n_inner=24,
        activation_function="relu",
        layer_norm_epsilon=1e-2,
        tie_word_embeddings=False,
        resid_pdrop=0.5,
        embd_pdrop=0.5,
        attn_pdrop=0.5,
        initializer_range=0.5,
        spec={"d_ff": 24, "activation": "relu", "tie_embeddings": False},
    ),
    case("gpt2", n_inner=24, spec={"d_ff": 24}, slow=True),
    case("gpt2", n_inner=None, spec={"d_ff": 64}, slow=True),
    case("gpt2", activation_function="relu", spec={"activation": "relu"}, slow=True),
    case("gpt2", activation_function="gelu", slow=True),
    case("gpt2", activation_function="silu", slow=True),
    case("gpt2", activation_function="gelu_pytorch_tanh", slow=True),
    case("gpt2", outcome="activation_function", activation_function="quick_gelu"),
    case("gpt2", outcome="activation_function", activation_function="tanh", slow=True),
    case("gpt2", layer_norm_epsilon=1e-2, slow=True),
    case("gpt2", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("gpt2", scale_attn_weights=False, spec={"attention_scale": 1.0}, slow=True),
    case("gpt2", outcome="scale_attn_by_inverse_layer_idx", scale_attn_by_inverse_layer_idx=True),
    case("gpt2", reorder_and_upcast_attn=True, slow=True),  # float32: the same attention, reordered
    case("gpt2", reorder_and_upcast_attn=True, scale_attn_weights=False, spec={"attention_scale": 1.0}),
    case("gpt2", outcome="add_cross_attention", add_cross_attention=True, slow=True),
    # a window GPT-2 reads not, which transformers' generation cache slides (unread_window): refused
    case("gpt2", outcome="sliding_window", json={"sliding_window": 4}),
    case("gpt2", json={"sliding_window": 32}, slow=True),  # the whole context: no position falls out
    case("gpt2", outcome="attention_chunk_size", json={"attention_chunk_size": 4}),  # unread_chunks
    case("gpt2", json={"attention_chunk_size": 32}, slow=True),
    case(
        "gpt2",
        outcome="layer_types",
        json={"attention_chunk_size": 4, "layer_types": ["full_attention", "chunked_attention"]},
        slow=True,
    ),
    # a sliding layer beside no window, which transformers fails on in every model type
    case(
        "gpt2",
        outcome="layer_types",
        json={"layer_types": ["full_attention", "sliding_attention"]},
        slow=True,
    ),
    case("gpt2", resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5, slow=True),
    case("gpt2", initializer_range=0.5, slow=True),
    case(  # GPT2DoubleHeadsModel's summary head: not in a GPT2LMHeadModel
        "gpt2",
        summary_type="last",
        summary_use_proj=False,
        summary_activation="tanh",
        summary_proj_to_labels=False,
        summary_first_dropout=0.3,
        slow=True,
    ),
    case("gpt2", json={"summary_last_dropout": 0.3}, slow=True),
    case("gpt2", **IDS, slow=True),
    case("gpt2", use_cache=False, slow=True),
    case("gpt2", n_positions=8, spec={"max_seq_len": 8}, slow=True),
    case("gpt2", n_head=1, slow=True),
    case("gpt2", n_head=8, slow=True),
    case("gpt2", json={"n_ctx": 8}, spec={"max_seq_len": 32}, slow=True),  # old configs; unread
    # ----------------------------------------------------------- LLaMA, Mistral, Qwen2
    *llama_family("llama"),
    case(
        "llama",
        attention_bias=True,
        mlp_bias=True,
        spec={"bias.qkv": True, "bias.attn_out": True, "bias.ffn": True},
    ),
    case("llama", attention_bias=True, spec={"bias.qkv": True, "bias.attn_out": True}, slow=True),
    case("llama", mlp_bias=True, spec={"bias.ffn": True}, slow=True),
    case("llama", outcome="pretraining_tp", json={"pretraining_tp": 0}, slow=True),
    # a window Llama's attention reads not: transformers' forward attends over every position, its
    # generation cache (DynamicCache) keeps only the last sliding_window of the layers layer_types
    # names sliding (every layer where it names none): refused, but a window of the whole context
    case("llama", outcome="sliding_window", json={"sliding_window": 6}, slow=True),
    case("llama", json={"sliding_window": 32}, spec={"max_seq_len": 32, "window": None}, slow=True),
    case("llama", json={"sliding_window": 6, "layer_types": ["full_attention"] * 2}, slow=True),
    case(
        "llama",
        outcome="sliding_window",
        json={"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 4},
        slow=True,
    ),
    # Llama 4's attention_chunk_size, which Llama reads not: where config.json has no layer_types and
    # no window, transformers' generation cache keeps the last chunk of every layer (unread_chunks)
    case("llama", outcome="attention_chunk_size", json={"attention_chunk_size": 4}),
    case("llama", json={"attention_chunk_size": 32}, spec={"max_seq_len": 32}, slow=True),
    case("llama", json={"attention_chunk_size": 4, "layer_types": ["full_attention"] * 2}, slow=True),
    case(
        "llama",
        outcome="layer_types",
        json={"attention_chunk_size": 4, "layer_types": ["full_attention", "chunked_attention"]},
        slow=True,
    ),
    # layer_types, unread by Llama, but transformers 5 refuses a list of another count than the layers,
    # and fails on a sliding layer without a sliding_window (missing or null)
    case("llama", json={"layer_types": ["full_attention"] * 2}, slow=True),
    case(
        "llama",
        outcome="layer_types",
        json={"layer_types": ["full_attention", "sliding_attention"]},
        slow=True,
    ),
    case(
        "llama",
        outcome="layer_types",
        json={"layer_types": ["full_attention", "sliding_attention"], "sliding_window": None},
        slow=True,
    ),
    case("llama", outcome="layer_types", json={"layer_types": ["full_attention"]}, slow=True),
    *llama_family("mistral"),
    case("mistral", outcome="sliding_window", json={"sliding_window": 0}, slow=True),  # its forward fails
    # Mistral slides every layer (a window of the whole context or more is none)
    case("mistral", sliding_window=6, spec={"max_seq_len": 32, **EVERY_LAYER_6}, slow=True),
    case("mistral", sliding_window=64, spec={"max_seq_len": 32, "window": None}, slow=True),
    # MistralForCausalLM reads no layer_types, AutoModel reads them as Ministral: refused where the two
    # differ, past the window
    case(
        "mistral",
        outcome="layer_types",
        sliding_window=6,
        json={"layer_types": ["full_attention", "sliding_attention"]},
    ),
    case("mistral", sliding_window=6, json={"layer_types": ["sliding_attention"] * 2}, spec=EVERY_LAYER_6),
    case("mistral", sliding_window=64, json={"layer_types": ["full_attention"] * 2}, slow=True),
    # no window: the cache keeps the last attention_chunk_size of every layer, past which it differs
    case("mistral", outcome="attention_chunk_size", json={"attention_chunk_size": 4}, slow=True),
    # beside a window too: transformers 4 nulls some configs' windows (Qwen2-MoE's without use_sliding_window)
    case(
        "mistral",
        outcome="attention_chunk_size",
        sliding_window=6,
        json={"attention_chunk_size": 4},
        slow=True,
    ),
    case("mistral", sliding_window=6, json={"use_sliding_window": False, "max_window_layers": 5}, slow=True),
    case("mistral", json={"attention_bias": True, "mlp_bias": True}, spec={"bias.qkv": False}, slow=True),
    *llama_family("qwen2"),
    *qwen_windows("qwen2"),
    case("qwen2", json={"attention_bias": False, "mlp_bias": True}, spec={"bias.qkv": True}, slow=True),
    *llama_family("qwen3"),
    *qwen_windows("qwen3"),
    # Qwen2Config and Qwen3Config: null is one K/V head per head (left out: 32)
    *(
        case(f, num_key_value_heads=4, json={"num_key_value_heads": None}, spec={"n_kv_heads": 4}, slow=True)
        for f in ("qwen2", "qwen3")
    ),
    # Qwen3: q/k norms always; attention_bias on q, k, v and o; mlp_bias is not a Qwen3 field
    case(
        "qwen3",
        attention_bias=True,
        spec={"qk_norm": True, "bias.qkv": True, "bias.attn_out": True, "bias.ffn": False},
    ),
    case("qwen3", json={"mlp_bias": True}, spec={"qk_norm": True, "bias.ffn": False}, slow=True),
    case("qwen3", head_dim=128, json={"head_dim": DELETE}, spec={"head_dim": 128}, slow=True),  # the default
    # --------------------------------------------------------------------------- BERT
    case(  # the fields that take any value at once: each row below sets one
        "bert",
        hidden_act="relu",
        layer_norm_eps=1e-3,
        tie_word_embeddings=False,
        type_vocab_size=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.5,
        classifier_dropout=0.4,
        pad_token_id=7,
        chunk_size_feed_forward=2,
        spec={"activation": "relu", "tie_embeddings": False, "type_vocab_size": 5},
    ),
    case("bert", hidden_act="relu", spec={"activation": "relu"}, slow=True),
    case("bert", hidden_act="gelu_new", slow=True),
    case("bert", hidden_act="silu", slow=True),
    case("bert", outcome="hidden_act", hidden_act="quick_gelu", slow=True),
    case("bert", layer_norm_eps=1e-3, slow=True),
    case("bert", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    case("bert", type_vocab_size=5, spec={"type_vocab_size": 5}, slow=True),
    case("bert", type_vocab_size=1, spec={"type_vocab_size": 1}, slow=True),
    case("bert", max_position_embeddings=12, spec={"max_seq_len": 12}, slow=True),
    case(
        "bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5, classifier_dropout=0.4, slow=True
    ),
    case("bert", initializer_range=0.5, slow=True),
    case("bert", chunk_size_feed_forward=2, slow=True),  # the same feed-forward, in chunks
    # an encoder: no generation cache to slide (unread_window, unread_chunks)
    case("bert", json={"attention_chunk_size": 4, "sliding_window": 4}, slow=True),
    case("bert", use_cache=False, slow=True),
    case("bert", pad_token_id=7, bos_token_id=5, eos_token_id=6, slow=True),
    case("bert", pad_token_id=None, slow=True),
    case("bert", outcome="is_decoder", is_decoder=True),  # causal attention
    case("bert", outcome="add_cross_attention", json={"add_cross_attention": True}, slow=True),
    # transformers 4 reads relative position scores; 5 reads none: refused either way
    case("bert", outcome="position_embedding_type", json={"position_embedding_type": "relative_key"}),
    case(
        "bert",
        outcome="position_embedding_type",
        json={"position_embedding_type": "relative_key_query"},
        slow=True,
    ),
    case("bert", json={"position_embedding_type": "absolute"}, slow=True),
    case("bert_cls", num_labels=5, slow=True),
    case("bert_cls", hidden_act="gelu_python", layer_norm_eps=1e-3, classifier_dropout=0.4, slow=True),
    case("bert_cls", outcome="is_decoder", is_decoder=True, slow=True),
    case("bert_cls", outcome="num_labels", id2label={0: "only"}, label2id={"only": 0}, slow=True),
    case("bert_cls", outcome="problem_type", problem_type="multi_label_classification"),
    case("bert_cls", outcome="problem_type", problem_type="regression", slow=True),
    case("bert_cls", problem_type="single_label_classification", slow=True),
    # a sentence classifier's bundle reads the second sentence of a pair as segment 1
    case("bert_cls", outcome="type_vocab_size", type_vocab_size=1, slow=True),
    case("bert_pretraining", type_vocab_size=3, hidden_act="gelu_new", tie_word_embeddings=False),
    # ----------------------------------------------------------------------------- T5
    case(  # the fields that take any value at once: each row below sets one
        "t5",
        d_kv=8,
        num_decoder_layers=1,
        relative_attention_num_buckets=9,  # odd: 4 each way in the encoder, 9 in the decoder
        relative_attention_max_distance=7,
        layer_norm_epsilon=1e-2,
        dropout_rate=0.5,
        classifier_dropout=0.3,
        initializer_factor=3.0,
        spec={"head_dim": 8, "n_decoder_layers": 1},
    ),
    case("t5", feed_forward_proj="gated-gelu", spec={"activation": "geglu_tanh"}, slow=True),
    case("t5", feed_forward_proj="gated-silu", spec={"activation": "swiglu"}, slow=True),
    case("t5", feed_forward_proj="gated-gelu_python", spec={"activation": "geglu"}, slow=True),
    case("t5", feed_forward_proj="gelu", spec={"activation": "gelu"}, slow=True),
    case("t5", feed_forward_proj="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    case("t5", feed_forward_proj="silu", slow=True),
    case("t5", outcome="dense_act_fn", feed_forward_proj="gated-relu"),
    case("t5", outcome="dense_act_fn", feed_forward_proj="tanh", slow=True),
    case("t5", outcome="dense_act_fn", json={"dense_act_fn": "tanh"}, slow=True),
    # transformers reads dense_act_fn and is_gated_act over feed_forward_proj
    case(
        "t5",
        feed_forward_proj="gated-gelu",
        json={"dense_act_fn": "gelu_python"},
        spec={"activation": "geglu"},
    ),
    case(
        "t5", feed_forward_proj="gated-gelu", json={"dense_act_fn": DELETE, "is_gated_act": DELETE}, slow=True
    ),
    case("t5", d_kv=8, spec={"head_dim": 8}, slow=True),
    case("t5", d_kv=3, num_heads=3, spec={"head_dim": 3}, slow=True),
    case("t5", num_decoder_layers=1, spec={"n_decoder_layers": 1}, slow=True),
    case("t5", num_decoder_layers=3, slow=True),
    case("t5", num_decoder_layers=None, spec={"n_decoder_layers": 2}, slow=True),
    case("t5", relative_attention_num_buckets=9, relative_attention_max_distance=7, slow=True),
    case("t5", relative_attention_num_buckets=4, relative_attention_max_distance=5, slow=True),
    case("t5", relative_attention_num_buckets=32, relative_attention_max_distance=128, slow=True),
    case("t5", outcome="relative_attention_max_distance", relative_attention_max_distance=4),
    case("t5", outcome="relative_attention_num_buckets", relative_attention_num_buckets=2, slow=True),
    case("t5", layer_norm_epsilon=1e-2, slow=True),
    # transformers 5 ties T5's head whatever tie_word_embeddings says; False drops the output scale
    case("t5", tie_word_embeddings=False, spec={"scale_output": False}),
    case("t5", json={"scale_decoder_outputs": False}, spec={"scale_output": False}, slow=True),
    case(
        "t5",
        tie_word_embeddings=False,
        json={"scale_decoder_outputs": True},
        spec={"scale_output": True},
        slow=True,
    ),
    case("t5", initializer_factor=3.0, slow=True),
    case("t5", dropout_rate=0.5, classifier_dropout=0.3, slow=True),
    case("t5", pad_token_id=3, eos_token_id=4, decoder_start_token_id=3, slow=True),
    case("t5", use_cache=False, slow=True),
    case("t5", json={"n_positions": 8}, spec={"max_seq_len": 8}, length=8, slow=True),
    case("t5", outcome="is_decoder", json={"is_decoder": True}, slow=True),
    # ---------------------------------------------------------------------------- ViT
    case(  # the fields that take any value at once: each row below sets one
        "vit",
        hidden_act="relu",
        qkv_bias=False,
        layer_norm_eps=1e-3,
        image_size=12,
        num_channels=1,
        encoder_stride=2,
        pooler_output_size=8,
        pooler_act="relu",
        spec={"activation": "relu", "bias.qkv": False, "image_size": 12, "channels": 1},
    ),
    case("vit", hidden_act="relu", spec={"activation": "relu"}, slow=True),
    case("vit", hidden_act="gelu_new", slow=True),
    case("vit", outcome="hidden_act", hidden_act="quick_gelu", slow=True),
    case("vit", qkv_bias=False, spec={"bias.qkv": False}, slow=True),
    case("vit", layer_norm_eps=1e-3, slow=True),
    case("vit", image_size=12, patch_size=4, slow=True),
    case("vit", image_size=8, patch_size=8, slow=True),
    case("vit", image_size=8, patch_size=2, slow=True),
    case("vit", outcome="patch_size", image_size=10, patch_size=4),  # transformers floors the patches
    case("vit", json={"image_size": [8, 8], "patch_size": [4, 4]}, slow=True),
    case("vit", outcome="image_size", json={"image_size": [8, 16]}, slow=True),
    case("vit", num_channels=1, spec={"channels": 1}, slow=True),
    case("vit", num_channels=4, slow=True),
    case("vit", encoder_stride=2, pooler_output_size=8, pooler_act="relu", slow=True),  # other heads' fields
    case("vit", hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3, slow=True),
    case("vit", initializer_range=0.5, slow=True),
    case("vit", num_labels=5, slow=True),
    case("vit", outcome="num_labels", id2label={0: "only"}, label2id={"only": 0}, slow=True),
    case("vit", head_dim=4, spec={"head_dim": 4}, exported=False),  # transformers 5 reads it; 4 does not
]

# Fields that hold no computation and need no row: the tokenizer's and generation's settings.
UNREAD = {"use_cache"}


def _pytest_cases(cases: list[Case]) -> list[Any]:
    return [
        pytest.param(
            c,
            id=c.id,
            marks=([pytest.mark.slow] if c.slow else [])
            + ([pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else []),
        )
        for c in cases
    ]


def edit_config(folder: Path, edits: dict[str, Any]) -> None:
    """Write ``edits`` into the folder's config.json (DELETE removes the key)."""
    if edits:
        saved = json.loads((folder / "config.json").read_text())
        for key, value in edits.items():
            if value is DELETE:
                saved.pop(key, None)
            else:
                saved[key] = value
        (folder / "config.json").write_text(json.dumps(saved))


def _save(c: Case, folder: Path) -> None:
    family = FAMILIES[c.family]
    torch.manual_seed(0)
    config = family.config(**(family.base | c.edits))
    write(perturb(family.model(config)), family.tokenizer, folder)
    edit_config(folder, c.json)


def difference(hf: Any, ours: torch.nn.Module, length: int) -> float:
    """The largest |difference| of the two models' logits, over the logits' scale where it is past
    1 (float32 rounds large logits by more than 1e-5), on random inputs: a batch of rows of several
    lengths up to ``length`` (right padding) and the batch without padding."""
    worst = 0.0

    def gap(theirs: torch.Tensor, mine: torch.Tensor) -> float:
        return ((theirs - mine).abs().max() / theirs.abs().max().clamp(min=1)).item()

    with torch.no_grad():
        if isinstance(hf, T.ViTForImageClassification):
            size, channels = hf.config.image_size, hf.config.num_channels
            size = size[0] if isinstance(size, list | tuple) else size
            pixels = torch.randn(3, channels, size, size, generator=torch.Generator().manual_seed(0))
            return gap(hf(pixel_values=pixels).logits, ours(pixels))
        ids = random_ids(3, length)
        for mask in (right_padding(3, length), torch.ones(3, length, dtype=torch.long)):
            real = mask.bool()
            if isinstance(ours, Seq2Seq):  # whatever is_encoder_decoder says (generate() reads it)
                target = random_ids(3, min(7, length), seed=1)
                theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
                worst = max(worst, gap(theirs, ours(ids, mask, target)))
            elif isinstance(ours, Encoder):  # BERT's and ELECTRA's heads, reading segments
                types = (
                    (torch.arange(length) >= length // 2).long()
                    * (getattr(hf.config, "type_vocab_size", 1) - 1)
                ).expand(3, -1)
                theirs_out, mine = (
                    hf(input_ids=ids, attention_mask=mask, token_type_ids=types),
                    ours(ids, mask, types),
                )
                if not isinstance(mine, tuple):  # a classifier's logits
                    worst = max(worst, gap(theirs_out.logits, mine))
                elif mine[1] is not None:  # BertForPreTraining's
                    worst = max(worst, gap(theirs_out.seq_relationship_logits, mine[1]))
                    worst = max(worst, gap(theirs_out.prediction_logits[real], mine[0][real]))
                else:
                    worst = max(worst, gap(theirs_out.logits[real], mine[0][real]))
            else:
                worst = max(
                    worst, gap(hf(input_ids=ids, attention_mask=mask).logits[real], ours(ids, mask)[real])
                )
    return worst


def _spec_value(spec: Any, dotted: str) -> Any:
    value = spec.model
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def check(
    c: Case,
    tmp_path: Path,
    save: Callable[[Case, Path], None] = _save,
    compare: Callable[[Any, torch.nn.Module, int], float] = difference,
) -> None:
    """The case's folder (written by ``save``) imports to transformers' outputs and exports back to
    them (as ``compare`` measures them), or is refused by the field the case names, before
    anything is written; nothing else."""
    folder = tmp_path / "hf"
    save(c, folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # a capped context, heads left out: said, tested apart
        if c.outcome != SAME:
            with pytest.raises(HFError) as error:
                import_folder(folder, "case", tmp_path / "specs", tmp_path / "runs")
            assert f"  {c.outcome}" in str(error.value), str(error.value)
            assert not (tmp_path / "runs" / "case").exists()
            return
        result = import_folder(folder, "case", tmp_path / "specs", tmp_path / "runs")
        spec, ours = load_trained_model(result.run_dir)
        for dotted, expected in c.spec.items():
            assert _spec_value(spec, dotted) == expected, dotted
        length = min(c.length, getattr(spec.model, "max_seq_len", None) or c.length)
        assert compare(from_pretrained(folder), ours, length) <= 1e-5
        if not c.exported:
            with pytest.raises(HFError):
                export_hf(result.run_dir, tmp_path / "out")
            return
        export_hf(result.run_dir, tmp_path / "out")
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    assert compare(reloaded, ours, length) <= 1e-5


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def _class_fields(model_type: str) -> set[str]:
    """The fields the installed config class of ``model_type`` writes to config.json, less those
    every config has (names, labels, output switches)."""
    common = set(transformers.PretrainedConfig().to_dict())
    return set(transformers.AutoConfig.for_model(model_type).to_dict()) - common


def uncovered(model_type: str, cases: list[Case]) -> set[str]:
    """The fields of ``model_type``'s installed config class that none of a family file's
    ``cases`` (on families of that model type) sets, nor their tiny bases."""
    covered = set(UNREAD)
    for c in cases:
        covered |= c.fields() | set(FAMILIES[c.family].base)
    return _class_fields(model_type) - covered


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to a supported config class fails this until a row of CASES says
    what it does (or the family's tiny base sets it)."""
    covered = set(UNREAD)
    for family in CLASSES[model_type]:
        covered |= set(FAMILIES[family].base)
        covered |= set().union(*(c.fields() for c in CASES if c.family == family))
    assert _class_fields(model_type) - covered == set()


# transformers' activation names: each family's activation field, every name, either computed
# alike or refused by the field.
ACTIVATION_FIELDS = {
    "gpt2": "activation_function",
    "llama": "hidden_act",
    "mistral": "hidden_act",
    "qwen2": "hidden_act",
    "qwen3": "hidden_act",
    "bert": "hidden_act",
    "vit": "hidden_act",
    "t5": "feed_forward_proj",
}


def every_activation(*families: str) -> list[Any]:
    """pytest params (family, name), slow: every activation name transformers has, for each of a
    family file's ``families`` (check_activation sets it)."""
    from transformers.activations import ACT2CLS

    return [
        pytest.param(family, act, id=f"{family}-{act}", marks=pytest.mark.slow)
        for family in families
        for act in sorted(ACT2CLS)
    ]


def check_activation(family: str, field_name: str, value: str, tmp_path: Path) -> None:
    """The family's activation field ``field_name`` set to ``value`` imports to transformers'
    outputs and back, or is refused by that field."""
    try:
        check(case(family, **{field_name: value}), tmp_path)
    except HFError as error:  # refused by the import, which check does not expect of a SAME row
        assert f"  {field_name}: " in str(error)


def _activation_cases() -> list[Any]:
    from transformers.activations import ACT2CLS

    cases = []
    for family, name in ACTIVATION_FIELDS.items():
        for act in sorted(ACT2CLS):
            values = [act, f"gated-{act}"] if family == "t5" else [act]
            cases += [
                pytest.param(family, name, v, id=f"{family}-{v}", marks=pytest.mark.slow) for v in values
            ]
    return cases


@pytest.mark.parametrize(("family", "name", "value"), _activation_cases())
def test_every_activation_name_is_computed_alike_or_refused_by_name(
    family: str, name: str, value: str, tmp_path: Path
) -> None:
    try:
        FAMILIES[family].config(**(FAMILIES[family].base | {name: value}))
    except Exception:  # transformers refuses it itself
        pytest.skip(f"transformers builds no model with {name}={value}")
    c = case(family, **{name: value})
    folder = tmp_path / "hf"
    _save(c, folder)
    try:
        import_folder(folder, "case", tmp_path / "specs", tmp_path / "runs")
    except HFError as error:
        assert f"  {'dense_act_fn' if family == 't5' else name}" in str(error)
        return
    check(c, tmp_path / "again")
