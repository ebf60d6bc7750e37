"""A config.json that leaves a field out, for every model_type tfcompile imports: transformers reads
the config class's default there, and so must the import, or a folder saved without the field (by
an older transformers, by hand, trimmed) imports as another model or with another context.

Each field of the config class (less bookkeeping and the token ids, which compute nothing) is
deleted in turn from a tiny model's saved config.json. Then either transformers loads the folder,
every tensor fitting, and runs it: the import gives transformers' logits in float32 and its
parameter count, and the spec it gives the folder with the field written as transformers read it
(the context above all, which short inputs do not show); or transformers cannot load or run it
(a hidden_size of 4096 over tensors of 32), and the import is an HFError, never another exception.

The same for a field set to null (test_a_null_field...: its docstring says what each outcome
means) and for a pad id past the vocabulary. The default suite deletes max_position_embeddings
from each LLaMA-like model type and nulls a few fields; ``-m slow`` sweeps every field of every
model type. The tiny models are the family test files' own."""

from __future__ import annotations

import inspect
import json
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import test_hf_albert  # noqa: F401
import test_hf_arcee  # noqa: F401
import test_hf_bart
import test_hf_biogpt  # noqa: F401
import test_hf_codegen  # noqa: F401
import test_hf_cohere  # noqa: F401
import test_hf_dbrx  # noqa: F401
import test_hf_dots1  # noqa: F401
import test_hf_electra  # noqa: F401
import test_hf_ernie  # noqa: F401
import test_hf_ernie4_5  # noqa: F401
import test_hf_ernie4_5_moe  # noqa: F401
import test_hf_exaone4  # noqa: F401
import test_hf_falcon_bloom  # noqa: F401 (each of these adds its families to test_hf_fields.FAMILIES)
import test_hf_flex_olmo  # noqa: F401
import test_hf_gemma3  # noqa: F401
import test_hf_gemma_phi3  # noqa: F401
import test_hf_glm  # noqa: F401
import test_hf_glm4_moe  # noqa: F401
import test_hf_gpt_neo  # noqa: F401
import test_hf_gpt_oss  # noqa: F401
import test_hf_granite  # noqa: F401
import test_hf_granitemoe  # noqa: F401
import test_hf_helium  # noqa: F401
import test_hf_hunyuan  # noqa: F401
import test_hf_hunyuan_moe  # noqa: F401
import test_hf_m2m100
import test_hf_ministral  # noqa: F401
import test_hf_ministral3  # noqa: F401
import test_hf_modernbert  # noqa: F401
import test_hf_moe  # noqa: F401
import test_hf_mpt  # noqa: F401
import test_hf_nemotron  # noqa: F401
import test_hf_neox_gptj_phi  # noqa: F401
import test_hf_olmo  # noqa: F401
import test_hf_olmo3  # noqa: F401
import test_hf_opt_bigcode  # noqa: F401
import test_hf_persimmon  # noqa: F401
import test_hf_roberta_distilbert as roberta
import test_hf_seed_oss  # noqa: F401
import test_hf_smollm3  # noqa: F401
import test_hf_solar_open  # noqa: F401
import test_hf_stablelm  # noqa: F401
import test_hf_starcoder2  # noqa: F401
import test_hf_xglm  # noqa: F401
import torch
from hf_models import from_pretrained, max_difference, random_ids
from test_hf_fields import DELETE, Case, _pytest_cases, _save, case, check, difference, edit_config
from test_hf_mt5 import saved as save_mt5

from tfcompile.hf.architecture import ARCHITECTURES
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

Compare = Callable[[Any, torch.nn.Module, int], float]


@dataclass(frozen=True)
class Source:
    """How a model type's tiny folder is saved, its logits compared, and how many of transformers'
    parameters its import leaves out (RoBERTa's position rows up to the pad id, OPT's offset rows)."""

    save: Callable[[Path], Any]
    compare: Compare = difference
    unread: Callable[[Any], int] = lambda hf: 0


def from_fields(family: str) -> Source:
    """A family of test_hf_fields.FAMILIES (where the family test files add theirs)."""
    return Source(lambda folder: _save(case(family), folder))


def from_roberta(family: str) -> Source:
    return Source(lambda folder: roberta.save(family, folder), roberta.difference, roberta.unused_rows)


def mt5_difference(hf: Any, ours: torch.nn.Module, length: int) -> float:
    return max(max_difference(hf, ours, padded) for padded in (False, True))


SOURCES: dict[str, Source] = {
    name: from_fields(name)
    for name in (
        "gpt2",
        "gpt_neo",
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo",
        "olmo2",
        "olmo3",
        "smollm3",
        "granite",
        "granitemoe",
        "granitemoeshared",
        "ministral",
        "helium",
        "glm",
        "glm4",
        "arcee",
        "nemotron",
        "exaone4",
        "hunyuan_v1_dense",
        "seed_oss",
        "ernie4_5",
        "starcoder2",
        "stablelm",
        "gpt_neox",
        "phi",
        "gptj",
        "codegen",
        "persimmon",
        "falcon",
        "bloom",
        "cohere",
        "cohere2",
        "mpt",
        "gpt_bigcode",
        "bert",
        "electra",
        "albert",
        "t5",
        "vit",
        "mixtral",
        "dbrx",
        "flex_olmo",
        "hunyuan_v1_moe",
        "glm4_moe",
        "dots1",
        "ernie4_5_moe",
        "solar_open",
        "ministral3",
        "qwen2_moe",
        "qwen3_moe",
        "olmoe",
        "gpt_oss",
        "xglm",
    )
}
SOURCES |= {
    name: from_roberta(name)
    for name in ("roberta", "xlm-roberta", "camembert", "data2vec-text", "distilbert")
}
SOURCES["ernie"] = Source(  # its task-type table, folded into the positions
    lambda folder: _save(case("ernie"), folder),
    unread=lambda hf: hf.config.task_type_vocab_size * hf.config.hidden_size if hf.config.use_task_id else 0,
)
SOURCES |= {  # the two position rows before position 0's
    name: Source(
        lambda folder, name=name: _save(case(name), folder), unread=lambda hf: 2 * hf.config.hidden_size
    )
    for name in ("opt", "biogpt")
}
SOURCES["mt5"] = Source(save_mt5, mt5_difference)
SOURCES["ernie4_5_moe"] = Source(  # its routers' selection biases: parameters there, buffers here
    lambda folder: _save(case("ernie4_5_moe"), folder),
    unread=lambda hf: sum(
        p.numel() for n, p in hf.named_parameters() if n.endswith("e_score_correction_bias")
    ),
)
SOURCES["m2m_100"] = Source(lambda folder: _save(case("m2m_100"), folder), test_hf_m2m100.compare)
# ModernBERT's head's dense layer has no bias without classifier_bias; the spec's is one of zeros
SOURCES["modernbert"] = Source(
    lambda folder: _save(case("modernbert"), folder),
    unread=lambda hf: 0 if hf.config.classifier_bias else -hf.config.hidden_size,
)
SOURCES |= {
    name: Source(lambda folder, name=name: _save(case(name), folder), unread=test_hf_bart.unread)
    for name in test_hf_bart.CLASSES
}

# Fields that say nothing about the computation: names, output switches, the special tokens' ids.
BOOKKEEPING = {
    "model_type",
    "architectures",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "_name_or_path",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
}
# Model types whose config nests another's: the multimodal Gemma 3's language model is a
# gemma3_text config in text_config, which Gemma3Config fills with Gemma3TextConfig's defaults.
# Multimodal model types, whose language model (text_config: its model type's rows) is what imports
NESTED = {"gemma3": "gemma3_text", "llava": "llama", "llava_next": "llama", "mistral3": "mistral"}
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "starcoder2")


def fields(model_type: str) -> list[str]:
    """The fields the installed config class of ``model_type`` writes, less bookkeeping."""
    return sorted(set(T.AutoConfig.for_model(model_type).to_dict()) - BOOKKEEPING)


def field_cases(in_default_suite: Callable[[str, str], bool]) -> list[Any]:
    """Every (model type, field), slow but for the pairs ``in_default_suite``."""
    return [
        pytest.param(
            model_type,
            name,
            id=f"{model_type}-{name}",
            marks=[] if in_default_suite(model_type, name) else [pytest.mark.slow],
        )
        for model_type in SOURCES
        for name in fields(model_type)
    ]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Each model type's tiny folder, saved once."""
    root, folders = tmp_path_factory.mktemp("defaults"), dict[str, Path]()

    def folder(model_type: str) -> Path:
        if model_type not in folders:
            folders[model_type] = root / model_type
            SOURCES[model_type].save(folders[model_type])
        return folders[model_type]

    return folder


def transformers_reads(folder: Path) -> Any:
    """The folder as transformers loads it, where every tensor fits and the model runs; else None."""
    try:
        hf, info = from_pretrained(folder, loading_info=True)
        if any(info.values()):
            return None
        config, ids = hf.config, random_ids(2, 8)
        with torch.no_grad():
            if config.model_type == "vit":
                hf(pixel_values=torch.zeros(1, config.num_channels, config.image_size, config.image_size))
            elif "decoder_input_ids" in inspect.signature(hf.forward).parameters:
                hf(input_ids=ids, decoder_input_ids=ids)
            else:
                hf(input_ids=ids)
    except Exception:
        return None
    return hf


def imported(folder: Path, root: Path) -> tuple[Any, torch.nn.Module]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)  # a capped context, heads left out: said, tested apart
        result = import_folder(folder, "case", root / "specs", root / "runs")
    return load_trained_model(result.run_dir)


def test_every_model_type_tfcompile_imports_has_a_source() -> None:
    assert set(SOURCES) == set(ARCHITECTURES) - set(NESTED)


def check_left_out(
    model_type: str, names: tuple[str, ...], folder: Path, tmp_path: Path, value: Any = DELETE
) -> None:
    """Delete ``names`` from the folder's config.json (or set them to ``value``); then transformers
    loads and runs it and the import computes as it does, or it cannot and the import is an
    HFError."""
    edit_config(folder, dict.fromkeys(names, value))
    hf = transformers_reads(folder)
    if hf is None:
        with pytest.raises(HFError), warnings.catch_warnings():
            warnings.simplefilter("ignore", HFWarning)
            import_folder(folder, "case", tmp_path / "specs", tmp_path / "runs")
        assert not (tmp_path / "runs" / "case").exists()
        return
    spec, ours = imported(folder, tmp_path / "a")
    source = SOURCES[model_type]
    length = min(20, getattr(spec.model, "max_seq_len", None) or 20)
    assert source.compare(hf, ours, length) <= 1e-5
    expected = hf.num_parameters() - source.unread(hf)
    assert spec.parameter_count() == expected == sum(p.numel() for p in ours.parameters())
    # The same spec as the folder with the field as transformers read it: the context, the RoPE
    # scaling computed from it, everything short inputs do not show.
    written = tmp_path / "written"
    shutil.copytree(folder, written)
    read = hf.config.to_dict()
    edit_config(
        written, {name: json.loads(json.dumps(read.get(name))) for name in names}
    )  # label ids: strings
    assert imported(written, tmp_path / "b")[0].model.model_dump() == spec.model.model_dump()


@pytest.mark.parametrize(
    ("model_type", "name"),
    field_cases(lambda model_type, name: name == "max_position_embeddings" and model_type in LLAMA_LIKE),
)
def test_a_field_left_out_imports_as_transformers_reads_it_or_is_an_hf_error(
    model_type: str, name: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = tmp_path / "left_out"
    shutil.copytree(saved(model_type), folder)
    if (model_type, name) in STACKS_DIFFER:
        edit_config(folder, {name: DELETE})
        with pytest.raises(HFError, match="  decoder_attention_heads: "):
            imported(folder, tmp_path / "a")
        return
    if (model_type, name) in PAD_IS_ANOTHER_TOKEN:
        edit_config(folder, {name: DELETE})
        with pytest.raises(HFError, match=r"  pad_token_id: is 1 \('</s>'\), and the tokenizer pads with"):
            imported(folder, tmp_path / "a")
        return
    check_left_out(model_type, (name,), folder, tmp_path)


# A translator's head count left out is its config class's (16), the other stack's the tiny model's
# (4): transformers computes stacks of different heads (their tensors' shapes are the same), which
# tfcompile's encoder-decoder, whose stacks share their heads, cannot hold.
STACKS_DIFFER = {
    (model_type, f"{stack}_attention_heads")
    for model_type in (*test_hf_bart.CLASSES, "m2m_100")
    for stack in ("encoder", "decoder")
}


# Left out, the pad id is the config class's 1, which the tiny folder's tokenizer holds </s> at (its
# eos, ending every source): a model whose positions skip the pad id gives that no position, and the
# import refuses it (importer.pad_positions), though transformers runs.
PAD_IS_ANOTHER_TOKEN = {("xlm-roberta", "pad_token_id"), ("m2m_100", "pad_token_id")}


# A null transformers keeps (no window), one it fills (the K/V heads), ones it refuses (a size, a
# flag whose default is true).
NULL_SAMPLES = {
    ("mistral", "sliding_window"),
    ("llama", "num_key_value_heads"),
    ("llama", "rms_norm_eps"),
    ("gpt2", "tie_word_embeddings"),
}


# Nulls that transformers 5 computes with and 4 otherwise: T5's output scale is scale_decoder_outputs'
# (a null: none) in 5, tie_word_embeddings' in 4 (a null tie: none, and no tie; 5 ties and scales).
VERSIONS_DIFFER = {("t5", "scale_decoder_outputs"), ("t5", "tie_word_embeddings")}


@pytest.mark.parametrize(
    ("model_type", "name"), field_cases(lambda model_type, name: (model_type, name) in NULL_SAMPLES)
)
def test_a_null_field_imports_as_transformers_reads_it_or_is_an_hf_error(
    model_type: str, name: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    """Where transformers 5 computes with a null, the import computes as it does. Elsewhere (it
    refuses the null, a flag, a size, an epsilon, or cannot run with it) transformers 4 kept it
    for each model class to read: a flag as false, so the import computes as transformers with the
    flag false, or is an HFError; another field as good as none, so the import reads it as if
    left out, or is an HFError."""
    folder, other = tmp_path / "null", tmp_path / "other"
    shutil.copytree(saved(model_type), folder)
    edit_config(folder, {name: None})
    if (model_type, name) in VERSIONS_DIFFER:
        with pytest.raises(HFError, match=name):
            imported(folder, tmp_path / "a")
        return
    if transformers_reads(folder) is not None:
        check_left_out(model_type, (name,), folder, tmp_path, value=None)
        return
    flag = isinstance(getattr(T.AutoConfig.for_model(model_type), name, None), bool)
    shutil.copytree(saved(model_type), other)
    edit_config(other, {name: False if flag else DELETE})
    try:
        ours = imported(folder, tmp_path / "a")
    except HFError:
        return
    if flag:
        hf = transformers_reads(other)
        assert hf is not None and SOURCES[model_type].compare(hf, ours[1], 8) <= 1e-5
    else:
        assert ours[0].model_dump() == imported(other, tmp_path / "b")[0].model_dump()


# Fields that say one thing together, left out together: a feed-forward of neither a
# feed_forward_proj nor what transformers derives from it is mT5's gated GELU (T5's is a ReLU).
TOGETHER = [("mt5", ("feed_forward_proj", "dense_act_fn", "is_gated_act"))]


@pytest.mark.parametrize(
    ("model_type", "names"), [pytest.param(*t, id="-".join([t[0], *t[1]])) for t in TOGETHER]
)
def test_fields_left_out_together_import_as_transformers_reads_them(
    model_type: str, names: tuple[str, ...], saved: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = tmp_path / "left_out"
    shutil.copytree(saved(model_type), folder)
    check_left_out(model_type, names, folder, tmp_path)


# The model types that read a RoPE scaling: dynamic scales past max_position_embeddings, YaRN from
# it where the dict names no original length.
SCALED = ("llama", "mistral", "qwen2", "qwen3", "starcoder2", "stablelm", "gpt_neox", "phi", "falcon")


@pytest.mark.parametrize(
    ("model_type", "scaling"),
    [
        pytest.param(t, s, marks=[] if (t, s) == ("qwen2", "yarn") else [pytest.mark.slow])
        for t in SCALED
        for s in ("dynamic", "yarn")
    ],
)
def test_a_scaling_of_a_context_left_out_scales_from_the_config_class_default(
    model_type: str, scaling: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = tmp_path / "left_out"
    shutil.copytree(saved(model_type), folder)
    rope = json.loads((folder / "config.json").read_text())["rope_parameters"]
    edit_config(folder, {"rope_parameters": rope | {"rope_type": scaling, "factor": 4.0}})
    check_left_out(model_type, ("max_position_embeddings",), folder, tmp_path)


# A window left out is the config class's, where the config slides a layer: Mistral's every layer,
# Qwen's from max_window_layers on with use_sliding_window.
WINDOWS = [
    case(
        "mistral",
        json={"sliding_window": DELETE, "max_position_embeddings": DELETE},
        spec={"max_seq_len": 131072, "window.size": 4096, "window.layers": None},
    ),
    *(
        case(
            f,
            use_sliding_window=True,
            max_window_layers=1,
            max_position_embeddings=8192,
            json={"sliding_window": DELETE},
            spec={"max_seq_len": 8192, "window.size": 4096, "window.layers": [1]},
            slow=f != "qwen2",
        )
        for f in ("qwen2", "qwen3")
    ),
]


@pytest.mark.parametrize("c", _pytest_cases(WINDOWS))
def test_a_window_left_out_is_the_config_class_default(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


def test_a_gemma_of_more_heads_reads_its_k_v_heads_left_out_as_gemma_configs_16(tmp_path: Path) -> None:
    """GemmaConfig's 16 K/V heads whatever num_attention_heads is (LlamaConfig's: one per head),
    which a tiny model of 4 heads cannot show: 32 heads of 4 in 16 groups."""
    folder = tmp_path / "left_out"
    _save(case("gemma", num_attention_heads=32, num_key_value_heads=16, head_dim=4), folder)
    check_left_out("gemma", ("num_key_value_heads",), folder, tmp_path)


@pytest.mark.parametrize(
    "model_type",
    [pytest.param(t, marks=[] if t == "bert" else [pytest.mark.slow]) for t in SOURCES if t != "vit"],
)  # ViT reads pixels, no tokens
def test_a_pad_id_past_the_vocabulary_imports_as_transformers_reads_it_or_is_an_hf_error(
    model_type: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    """transformers' embeddings take the pad id as their padding_idx, which must be a row of
    theirs: past the vocabulary, a model that builds computes as transformers does, and one that
    does not is an HFError."""
    folder = tmp_path / "pad"
    shutil.copytree(saved(model_type), folder)
    config = json.loads((folder / "config.json").read_text())
    check_left_out(model_type, ("pad_token_id",), folder, tmp_path, value=config["vocab_size"] + 5)


def attribute_map(model_type: str) -> dict[str, str]:
    """The installed config class's attribute_map (another name -> the field it sets), its own and
    its bases', less the ids of a multimodal model's image tokens."""
    aliases: dict[str, str] = {}
    for cls in reversed(type(T.AutoConfig.for_model(model_type)).__mro__):
        aliases |= vars(cls).get("attribute_map") or {}
    return {alias: name for alias, name in aliases.items() if not alias.endswith("token_id")}


ALIASED = [(model_type, alias) for model_type in SOURCES for alias in attribute_map(model_type)]


def test_every_model_type_reads_its_config_class_attribute_map() -> None:
    """An alias transformers reads over a field (GPT-2's num_attention_heads over n_head) is read by
    the import too: a config.json may hold either name."""
    for model_type in SOURCES:
        expected = REVERSED.get(model_type, attribute_map(model_type)) | LEGACY.get(model_type, {})
        assert ARCHITECTURES[model_type].aliases_for(model_type) == expected


def settable_properties(model_type: str) -> set[str]:
    """The properties with a setter the installed config class (not PretrainedConfig) defines: a
    config.json key of that name sets what the setter sets, as an attribute_map alias does."""
    cls = type(T.AutoConfig.for_model(model_type))
    own = [
        klass
        for klass in cls.__mro__
        if issubclass(klass, T.PretrainedConfig) and klass is not T.PretrainedConfig
    ]
    return {
        n for klass in own for n, v in vars(klass).items() if isinstance(v, property) and v.fset is not None
    }


def test_every_property_a_config_class_sets_is_read() -> None:
    """ModernBertConfig's sliding_window sets local_attention to twice it (transformers 5; 4 reads
    none): test_hf_modernbert's rows hold the import to it. Another such property fails this until
    a family file's rows say what the import makes of it."""
    found = {(model_type, name) for model_type in SOURCES for name in settable_properties(model_type)}
    assert found == {("modernbert", "sliding_window")}


LEGACY = {"bloom": {"n_embed": "hidden_size"}}  # BloomConfig's legacy keyword for hidden_size
# Qwen3MoeConfig's attribute_map sends num_experts, its own field, to num_local_experts, which is no
# field: set after the fields, a num_local_experts in config.json is what the class reads.
REVERSED = {"qwen3_moe": {"num_local_experts": "num_experts"}}


def check_aliased(model_type: str, edits: dict[str, Any], folder: Path, tmp_path: Path) -> None:
    """The folder with ``edits`` in config.json computes as transformers reads it."""
    edit_config(folder, edits)
    hf = transformers_reads(folder)
    assert hf is not None, "transformers builds and runs the edited folder"
    spec, ours = imported(folder, tmp_path)
    length = min(20, getattr(spec.model, "max_seq_len", None) or 20)
    assert SOURCES[model_type].compare(hf, ours, length) <= 1e-5
    assert spec.parameter_count() == hf.num_parameters() - SOURCES[model_type].unread(hf)


# DbrxConfig sizes its experts from d_model before the alias sets it: transformers 5 builds them 2048
# wide and cannot load the folder (4, as the import, reads the alias as d_model).
ALIAS_FAILS_IN_5 = {("dbrx", "hidden_size")}


@pytest.mark.parametrize(
    ("model_type", "alias"), [pytest.param(*c, id="-".join(c)) for c in ALIASED if c not in ALIAS_FAILS_IN_5]
)
def test_a_field_under_its_alias_imports_as_transformers_reads_it(
    model_type: str, alias: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    """The field written under its alias alone."""
    folder = tmp_path / "aliased"
    shutil.copytree(saved(model_type), folder)
    name = attribute_map(model_type)[alias]
    value = json.loads((folder / "config.json").read_text()).get(name)
    check_aliased(model_type, {alias: value, name: DELETE}, folder, tmp_path / "run")


# Where the head count sets no tensor's shape (T5's sets its widths, multi-query GPT-BigCode's K/V's,
# DBRX's its fused q, k and v: its K/V heads are d_model / heads wide).
HEAD_ALIASES = [
    (m, a) for m, a in ALIASED if a == "num_attention_heads" and m not in ("t5", "mt5", "gpt_bigcode", "dbrx")
]


@pytest.mark.parametrize(("model_type", "alias"), [pytest.param(*c, id="-".join(c)) for c in HEAD_ALIASES])
def test_a_head_count_under_its_alias_is_read_over_the_fields_own(
    model_type: str, alias: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    """Twice the heads under the alias beside the field's own count: transformers reads the alias
    (the tensors' shapes are the same, so only the outputs tell)."""
    folder = tmp_path / "aliased"
    shutil.copytree(saved(model_type), folder)
    config = json.loads((folder / "config.json").read_text())
    heads = config[attribute_map(model_type)[alias]]
    decoder = {"decoder_attention_heads": 2 * heads} if "decoder_attention_heads" in config else {}
    check_aliased(model_type, {alias: 2 * heads} | decoder, folder, tmp_path / "run")  # stacks alike


@pytest.mark.parametrize("model_type", list(SOURCES))
def test_a_layer_count_past_the_specs_bound_is_an_hf_error_not_a_list_of_its_layers(
    model_type: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    """2^40 layers (num_hidden_layers, every class's name or alias for it) with a window of every
    kind: refused by name before any list of the layers is made (a MemoryError before)."""
    folder = tmp_path / "deep"
    shutil.copytree(saved(model_type), folder)
    config = json.loads((folder / "config.json").read_text())
    deep = {
        "num_hidden_layers": 2**40,
        "sliding_window": 4,
        "use_sliding_window": True,
        "layer_types": DELETE,
    }
    if isinstance(config.get("text_config"), dict):  # a multimodal model's language model
        config["text_config"] |= {k: v for k, v in deep.items() if v is not DELETE}
        (folder / "config.json").write_text(json.dumps(config))
    edit_config(folder, deep)
    with pytest.raises(HFError), warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        import_folder(folder, "deep", tmp_path / "specs", tmp_path / "runs")
