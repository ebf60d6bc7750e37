"""LLaVA (``LlavaForConditionalGeneration``: llava-1.5, BakLLaVA), LLaVA-NeXT
(``LlavaNextForConditionalGeneration``: llava-v1.6) and Mistral 3 (``Mistral3ForConditionalGeneration``:
Mistral-Small-3.1 and 3.2): a vision tower and a projector whose image embeddings take the place of
the image tokens, then a language model of ``text_config``, a model type of the LLaMA family
(``llama`` by default, Mistral 3's ``mistral``). The language model is imported alone, as a folder
of its own weights would be (its config class's defaults filling what ``text_config`` leaves out),
the head tied as transformers 5 reads it: LLaVA's top-level ``tie_word_embeddings`` or
``text_config``'s, Mistral 3's top-level one (true where left out), and neither where the
checkpoint holds a head of its own that differs from the embeddings (transformers 4 read
``text_config``'s alone: a warning says where the two differ). The image path's tensors are left
out, said in a warning: the run reads no images, and an image token is embedded as any other.
export-hf writes the run as its text model type. Import only."""

from __future__ import annotations

import dataclasses
import warnings

from tfcompile.hf.architecture import (
    ARCHITECTURES,
    Architecture,
    Config,
    Imported,
    State,
    Tensors,
    image_path_left_out,
    register,
    tied,
)
from tfcompile.hf.errors import HFWarning
from tfcompile.hf.llama import MODEL_TYPES, Llama
from tfcompile.spec import Spec

# Each multimodal model type's head, its text_config's model type where the dict names none, and
# whether its top-level tie_word_embeddings is true where config.json leaves it out.
HEADS = {
    "llava": ("LlavaForConditionalGeneration", "llama", False),
    "llava_next": ("LlavaNextForConditionalGeneration", "llama", False),
    "mistral3": ("Mistral3ForConditionalGeneration", "mistral", True),
}
# The language models read beside a vision tower: the LLaMA family's model types whose tensors Llama
# reads itself (not Mixtral's experts, GLM's fused projections, ...).
TEXT_TYPES = frozenset(t for t in MODEL_TYPES if type(ARCHITECTURES.get(t)) is Llama)
# The image path's tensors, under the names its checkpoints give them (transformers 5's model.
# prefix taken off): the vision tower, the projector, LLaVA-NeXT's image_newline.
IMAGE_TENSORS = ("vision_tower.", "multi_modal_projector.", "image_newline")


@register("llava", "llava_next", "mistral3")
class LlavaMultimodal(Architecture):
    reads_window = True  # its language model's, as Llama reads it in text_config
    # transformers 5 saves model.language_model.* and lm_head.weight; 4 language_model.model.* and
    # language_model.lm_head.weight
    prefixes = ("model.language_model.", "language_model.model.", "language_model.", "model.")
    ignored = Llama.ignored

    def cached_config(self, config: Config) -> Config:
        return config.within("text_config")  # its language model's, as transformers' cache reads it

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        model_type = config.data["model_type"]
        head, default_text, tie_default = HEADS[model_type]
        config.require(
            architecture == head,
            "architectures",
            f"{architecture} is not a language model tfcompile has",
            f"import a {head}",
        )
        text = config.within("text_config")
        text_type = text.data.setdefault("model_type", default_text)
        if text_type not in TEXT_TYPES:
            config.refuse(
                "text_config.model_type",
                f"{text_type!r} is not a language model tfcompile imports beside a vision tower",
                f"one of {sorted(TEXT_TYPES)}",
            )
            return Imported({}, {"type": "causal_lm"})
        language_model = ARCHITECTURES[text_type]
        text = text.aliased(language_model.aliases_for(text_type))
        top = config.get("tie_word_embeddings", tie_default)
        text_tie = bool(
            text.get("tie_word_embeddings", MODEL_TYPES[text_type].defaults.get("tie_word_embeddings", False))
        )
        text.data["tie_word_embeddings"] = bool(top) or (text_tie and not tie_default)
        tie = tied(text, tensors, "lm_head.weight", "embed_tokens.weight", False)
        if tie != text_tie:  # transformers 4 ties as text_config says, whatever the checkpoint holds
            warnings.warn(
                HFWarning(
                    f"{tensors.where}: the head is {'tied' if tie else 'untied'} as transformers 5 reads "
                    f"{head}'s config and checkpoint (top-level tie_word_embeddings {top!r}); transformers "
                    f"4 reads text_config's ({text_tie!r}) and computes otherwise"
                ),
                stacklevel=3,
            )
        imported = language_model.read(text, MODEL_TYPES[text_type].head, tensors)
        multiplier = imported.model.pop("logit_multiplier", 1.0)
        if multiplier != 1.0:  # Granite's 1 / logits_scaling, which only GraniteForCausalLM applies
            warnings.warn(
                HFWarning(
                    f"{tensors.where}: text_config's logits scaling ({1 / multiplier:g}) is not applied: "
                    f"transformers' {head} computes the logits with a plain linear head"
                ),
                stacklevel=3,
            )
        return dataclasses.replace(imported, sources=text.named(language_model.sources | imported.sources))

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        state = ARCHITECTURES["llama"].to_state(tensors, spec)  # every TEXT_TYPES' reading
        image_path_left_out(tensors, IMAGE_TENSORS, "multimodal model", "its text model type")
        return state
