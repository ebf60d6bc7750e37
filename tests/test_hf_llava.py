"""LLaVA (``LlavaForConditionalGeneration``), LLaVA-NeXT (``LlavaNextForConditionalGeneration``) and
Mistral 3 (``Mistral3ForConditionalGeneration``): a vision tower and a projector, then a language
model of ``text_config`` (Llama, Mistral, Qwen2, ...), imported as that language model alone.
Tiny random transformers models (CLIP or Pixtral towers of one layer) saved with save_pretrained
(transformers 4's names, which 5.24 writes) and under transformers 5's own names, imported, and held
to transformers' logits on text (float32, rows padded on the right and not) and the language
model's parameter count; the head tied as transformers 5 reads it (a warning where 4 reads
otherwise); the image path left out with a warning, and nothing else; export-hf writes the run as
its text model type; a text model type tfcompile does not read beside a vision tower refused by
field; greedy generation through the ONNX bundle (slow)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import FIVE, VOCAB, Imported, copied, from_pretrained, own_names, perturb, write
from safetensors.torch import load_file, save_file
from test_hf_export import _loads_alike

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder

transformers = pytest.importorskip("transformers")
T = transformers

TOKENS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=1)
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    **TOKENS,
)
CLIP = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=8,
    patch_size=4,
)
PIXTRAL = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=8,
    patch_size=4,
    head_dim=8,
)
IMAGE = dict(image_token_index=VOCAB - 1)  # a token of the vocabulary, embedded as any other on text


def llava(text: Any, **fields: Any) -> Any:
    return T.LlavaForConditionalGeneration(
        T.LlavaConfig(text_config=text, vision_config=T.CLIPVisionConfig(**CLIP), **IMAGE | fields)
    )


def llava_next(text: Any, **fields: Any) -> Any:
    config = T.LlavaNextConfig(
        text_config=text,
        vision_config=T.CLIPVisionConfig(**CLIP),
        image_grid_pinpoints=[[8, 8]],
        **IMAGE | fields,
    )
    return T.LlavaNextForConditionalGeneration(config)


def mistral3(text: Any, **fields: Any) -> Any:
    config = T.Mistral3Config(
        text_config=text, vision_config=T.PixtralVisionConfig(**PIXTRAL), **IMAGE | fields
    )
    return T.Mistral3ForConditionalGeneration(config)


VARIANTS: dict[str, tuple[Callable[[], Any], str]] = {
    # llava-1.5's: a Llama, untied
    "llava": (lambda: llava(T.LlamaConfig(**TEXT)), "LlamaForCausalLM"),
    # a Qwen2 of q, k, v biases beside the tower, tied in text_config (transformers 5 ties it too)
    "llava_qwen2_tied": (
        lambda: llava(T.Qwen2Config(**TEXT, tie_word_embeddings=True)),
        "LlamaForCausalLM",
    ),
    # llava-v1.6-mistral's: a Mistral of a window, untied
    "llava_next_mistral": (
        lambda: llava_next(T.MistralConfig(**TEXT, sliding_window=6)),
        "MistralForCausalLM",
    ),
    # granite-vision's: a Granite, whose logits_scaling only GraniteForCausalLM applies (the
    # multimodal head is a plain linear one)
    "llava_next_granite": (
        lambda: llava_next(T.GraniteConfig(**TEXT, logits_scaling=8.0, residual_multiplier=0.5)),
        "GraniteForCausalLM",
    ),
    # Mistral-Small-3.1's: a Mistral, untied at both levels
    "mistral3": (
        lambda: mistral3(T.MistralConfig(**TEXT, head_dim=8, sliding_window=None), tie_word_embeddings=False),
        "LlamaForCausalLM",
    ),
    # Ministral 3's: its language model scales each query by its position (an original length of 4)
    "mistral3_ministral3": (
        lambda: mistral3(
            T.Ministral3Config(
                **TEXT,
                head_dim=8,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "original_max_position_embeddings": 4,
                    "llama_4_scaling_beta": 0.5,
                },
            ),
            tie_word_embeddings=False,
        ),
        "Ministral3ForCausalLM",
    ),
}
NAMES = [*VARIANTS, *(name + FIVE for name in VARIANTS)]


def image_path(hf: Any) -> int:
    """The parameters of the vision tower, the projector and LLaVA-NeXT's image_newline."""
    model = hf.model
    parts = [p for m in (model.vision_tower, model.multi_modal_projector) for p in m.parameters()]
    newline = getattr(model, "image_newline", None)
    return sum(p.numel() for p in parts) + (newline.numel() if newline is not None else 0)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("hf")

    def one(name: str) -> Imported:
        def write_to(folder: Path) -> None:
            torch.manual_seed(0)
            write(perturb(VARIANTS[name.removesuffix(FIVE)][0]()), "llama", folder)
            if name.endswith(FIVE):
                own_names(folder)

        return Imported(root, name, write_to, "ignore")

    return {name: one(name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_a_multimodal_model_imports_as_its_language_model(imported: dict[str, Imported], name: str) -> None:
    """transformers' logits on text (padded and not), and the language model's parameters (the
    LM head's counted once where tied)."""
    variant = imported[name]
    variant.assert_outputs_match()
    variant.assert_counts_match(unread=image_path(variant.hf))


def test_the_specs_are_the_language_models(imported: dict[str, Imported]) -> None:
    plain, qwen2 = imported["llava"].spec.model, imported["llava_qwen2_tied"].spec.model
    mistral = imported["llava_next_mistral"].spec.model
    assert (plain.tie_embeddings, plain.bias.qkv, plain.window) == (False, False, None)
    assert (qwen2.tie_embeddings, qwen2.bias.qkv, qwen2.bias.attn_out) == (True, True, False)
    assert mistral.window is not None and mistral.window.size == 6 and not mistral.tie_embeddings


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_run_is_written_as_its_text_model_type(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    assert export_hf(imported[name].result.run_dir, tmp_path / "out") == VARIANTS[name][1]
    _loads_alike(tmp_path / "out", imported[name].model)


def test_the_import_says_the_image_path_is_left_out(imported: dict[str, Imported], tmp_path: Path) -> None:
    folder = imported["llava_next_mistral"].folder
    n = sum(
        name.startswith(("vision_tower.", "multi_modal_projector.", "image_newline"))
        for name in load_file(folder / "model.safetensors")
    )
    expected = rf"imported alone \(text only\): its vision tower and projector \({n} tensors\) are left out"
    with pytest.warns(HFWarning, match=expected):
        import_folder(folder, "again", tmp_path / "specs", tmp_path / "runs")


@pytest.mark.parametrize("extra", ["language_model.model.layers.0.extra.weight", "vision.weight"])
def test_only_the_image_path_is_left_out(imported: dict[str, Imported], tmp_path: Path, extra: str) -> None:
    folder = copied(imported, "llava", tmp_path)
    tensors = load_file(folder / "model.safetensors") | {extra: torch.zeros(2)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with warnings.catch_warnings(), pytest.raises(HFError, match="holds tensors"):
        warnings.simplefilter("ignore", HFWarning)
        import_folder(folder, "extra", tmp_path / "specs", tmp_path / "runs")


def test_a_top_level_tie_over_an_untied_checkpoint_unties_as_transformers_5(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """Mistral 3's tie_word_embeddings is true where config.json leaves it out; transformers 5 then
    ties nothing where the checkpoint holds a head that differs (Mistral-Small's), and 4 reads
    text_config's tie alone: the same untied model, and no warning."""
    folder = copied(imported, "mistral3", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    hf = from_pretrained(folder)
    assert hf.lm_head.weight.data_ptr() != hf.model.language_model.embed_tokens.weight.data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFWarning)
        warnings.filterwarnings("ignore", ".*the multimodal model's language model", HFWarning)
        result = import_folder(folder, "untied", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.tie_embeddings is False


def test_a_granite_text_models_logits_scaling_is_said_to_be_left_out(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """The logits were divided by logits_scaling (8 apart from transformers', which the
    multimodal model's plain head leaves as they are): left out, and said."""
    folder = copied(imported, "llava_next_granite", tmp_path)
    with pytest.warns(HFWarning, match=r"logits scaling \(8\) is not applied: .* plain linear head"):
        result = import_folder(folder, "granite", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.logit_multiplier == 1.0
    assert result.spec.model.residual_multiplier == 0.5


def test_a_tie_that_transformers_4_reads_otherwise_is_said(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """LLaVA's top-level tie over a text_config that ties nothing and a checkpoint of one table:
    transformers 5 ties, 4 reads text_config's and would not."""
    folder = copied(imported, "llava_qwen2_tied", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["tie_word_embeddings"] = False
    config["tie_word_embeddings"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.warns(HFWarning, match=r"the head is tied as transformers 5 reads .* transformers 4 reads"):
        result = import_folder(folder, "tied", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.tie_embeddings is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ({"model_type": "gemma"}, "'gemma' is not a language model tfcompile imports beside a vision tower"),
        ({"model_type": "mixtral"}, "'mixtral' is not"),
    ],
)
def test_a_text_model_type_it_does_not_read_is_refused_by_field(
    imported: dict[str, Imported], tmp_path: Path, text: dict[str, Any], message: str
) -> None:
    folder = copied(imported, "llava", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"] |= text
    (folder / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(), pytest.raises(HFError, match=r"text_config\.model_type") as error:
        warnings.simplefilter("ignore", HFWarning)
        import_folder(folder, "other", tmp_path / "specs", tmp_path / "runs")
    assert message in str(error.value)
    assert not (tmp_path / "runs" / "other").exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_act", "quick_gelu"),
        ("attention_chunk_size", 4),  # the generation cache reads text_config's chunk: unread_chunks
    ],
)
def test_a_problem_of_the_language_model_is_named_in_text_config(
    imported: dict[str, Imported], tmp_path: Path, field: str, value: Any
) -> None:
    folder = copied(imported, "llava", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"][field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(), pytest.raises(HFError, match=rf"text_config\.{field}"):
        warnings.simplefilter("ignore", HFWarning)
        import_folder(folder, "act", tmp_path / "specs", tmp_path / "runs")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_generates_the_language_models_greedy_tokens(
    imported: dict[str, Imported], tmp_path: Path, name: str
) -> None:
    imported[name].assert_runtime_generates_as_transformers(tmp_path)
