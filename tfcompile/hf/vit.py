"""ViT (``ViTForImageClassification``): a Conv2d patch projection (the linear projection of
flattened channel-first patches), [CLS] in front, learned positions, pre-LayerNorm blocks, the
classifier on the final norm of [CLS] (no pooler). Its image processor's resize, rescale and
normalisation become the run's preprocessing."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from tfcompile.hf.architecture import (
    ACTIVATIONS,
    EXPORTED_ACTIVATIONS,
    Config,
    Imported,
    Needs,
    State,
    Tensors,
    Writable,
    contiguous,
    dropout,
    init_std,
    json_type,
    register,
    zeros_if_none,
)
from tfcompile.hf.bert import labels
from tfcompile.hf.errors import HFError, HFWarning, Problem, refuse
from tfcompile.images import ImagePreprocessing
from tfcompile.manifest import MEAN_RANGE, STD_RANGE
from tfcompile.spec import Spec
from tfcompile.spec.schema import ImageClassificationTask, LearnedPositional, VitSpec

LAYER = (
    ("layernorm_before", "attn_norm"),
    ("attention.output.dense", "attn.out"),
    ("layernorm_after", "ffn_norm"),
    ("intermediate.dense", "ffn.w_in"),
    ("output.dense", "ffn.w_out"),
)
PIXEL = 1 / 255  # transformers rescales uint8 pixels by this before normalising, as tfcompile does
BILINEAR = 2  # Pillow's number for the filter, in preprocessor_config.json's resample


def side(config: Config, name: str, default: int) -> Any:
    """A square size: an int, or a pair of equal ints (any other value is left for the spec to
    refuse by its name: int() would read 8.5 as 8, and "x" not at all)."""
    value = config.data.get(name)
    if isinstance(value, list | tuple):
        config.require(
            len(value) == 2 and value[0] == value[1], name, f"{value} is not square", "import square images"
        )
        value = value[0] if value else default
    return default if value is None else value


@register("vit")
class ViT(Writable):
    caches = False  # an encoder: transformers generates nothing with it
    prefixes = ("vit.",)
    ignored = ("pooler.dense.",)  # ViTForImageClassification builds no pooler; a ViTModel's is unused
    sources: ClassVar[dict[str, str]] = {
        "model.image_size": "image_size",
        "model.patch_size": "patch_size",
        "model.channels": "num_channels",
        "model.d_model": "hidden_size",
        "model.n_layers": "num_hidden_layers",
        "model.n_heads": "num_attention_heads",
        "model.head_dim": "head_dim",
        "model.d_ff": "intermediate_size",
        "model.activation": "hidden_act",
        "model.norm.eps": "layer_norm_eps",
        "model.dropout.embedding": "hidden_dropout_prob",
        "model.dropout.residual": "hidden_dropout_prob",
        "model.dropout.attention": "attention_probs_dropout_prob",
        "model.init_std": "initializer_range",
        "task.labels": "id2label",
    }

    def read(self, config: Config, architecture: str, tensors: Tensors) -> Imported:
        config.require(
            architecture == "ViTForImageClassification",
            "architectures",
            f"{architecture} is not an image classifier tfcompile has",
            "import a ViTForImageClassification",
        )
        image, patch = side(config, "image_size", 224), side(config, "patch_size", 16)
        d, heads = config.get("hidden_size", 768), config.get("num_attention_heads", 12)
        hidden_dropout = dropout(config.get("hidden_dropout_prob", 0.0))
        model: dict[str, Any] = {
            "family": "vit",
            "image_size": image,
            "patch_size": patch,
            "channels": config.get("num_channels", 3),
            "d_model": d,
            "n_layers": config.get("num_hidden_layers", 12),
            "n_heads": heads,
            "d_ff": config.get("intermediate_size", 3072),
            "activation": config.choice("hidden_act", "gelu", ACTIVATIONS, "ViT activation"),
            "positional": "learned",
            "pooling": "cls",
            "norm": {"position": "pre", "type": "layernorm", "eps": config.get("layer_norm_eps", 1e-12)},
            "bias": {"qkv": config.get("qkv_bias", True), "attn_out": True, "ffn": True},
            "dropout": {
                "embedding": hidden_dropout,
                "residual": hidden_dropout,
                "attention": dropout(config.get("attention_probs_dropout_prob", 0.0)),
            },
            "init_std": init_std(config),
        }
        if config.get("head_dim", d // max(heads, 1)) * heads != d:  # 0 heads: the spec refuses them
            model["head_dim"] = config.get("head_dim")
        return Imported(model, {"type": "image_classification", "labels": labels(config)})

    def to_state(self, tensors: Tensors, spec: Spec) -> State:
        model = spec.model
        state = {
            "cls_token": tensors.take("embeddings.cls_token"),
            "positional.table.weight": tensors.take("embeddings.position_embeddings")[0],
            "patch_embed.proj.weight": tensors.take("embeddings.patch_embeddings.projection.weight").flatten(
                1
            ),
            "patch_embed.proj.bias": tensors.take("embeddings.patch_embeddings.projection.bias"),
            "final_norm.weight": tensors.take("layernorm.weight"),
            "final_norm.bias": tensors.take("layernorm.bias"),
            "head.weight": tensors.take("classifier.weight"),
            "head.bias": tensors.take("classifier.bias"),
        }
        for i in range(model.n_layers):
            h, b = f"encoder.layer.{i}.", f"blocks.{i}."
            a = f"{h}attention.attention."
            kinds = ("weight", "bias") if model.bias.qkv else ("weight",)
            for kind in kinds:
                state[f"{b}attn.qkv.{kind}"] = tensors.cat(
                    *(f"{a}{x}.{kind}" for x in ("query", "key", "value"))
                )
            for hf, tfc in LAYER:
                state[f"{b}{tfc}.weight"] = tensors.take(f"{h}{hf}.weight")
                state[f"{b}{tfc}.bias"] = tensors.take(f"{h}{hf}.bias")
        return state

    def candidate(self, spec: Spec) -> bool:
        return isinstance(spec.model, VitSpec) and isinstance(spec.task, ImageClassificationTask)

    def exportable(self, spec: Spec) -> list[Problem]:
        model = spec.model
        assert isinstance(model, VitSpec)
        need = Needs("ViT")
        need(model.activation in EXPORTED_ACTIVATIONS, "model.activation", model.activation, "gelu")
        need(model.norm.type == "layernorm", "model.norm.type", model.norm.type, "layernorm")
        need(model.norm.position == "pre", "model.norm.position", model.norm.position, "pre")
        need(bool(model.norm.bias), "model.norm.bias", False, "true")
        need(bool(model.norm.final), "model.norm.final", False, "true")
        need(model.pooling == "cls", "model.pooling", model.pooling, "cls")
        need(
            isinstance(model.positional, LearnedPositional),
            "model.positional",
            model.positional.type,
            "learned",
        )
        need(model.n_kv_heads == model.n_heads, "model.n_kv_heads", model.n_kv_heads, "n_heads (no GQA)")
        need.plain_attention(model)
        return need.problems

    def to_config(self, spec: Spec) -> dict[str, Any]:
        model, task = spec.model, spec.task
        assert isinstance(model, VitSpec) and isinstance(task, ImageClassificationTask)
        assert task.labels is not None
        return {
            "architectures": ["ViTForImageClassification"],
            "model_type": "vit",
            "image_size": model.image_size,
            "patch_size": model.patch_size,
            "num_channels": model.channels,
            "hidden_size": model.d_model,
            "num_hidden_layers": model.n_layers,
            "num_attention_heads": model.n_heads,
            "intermediate_size": model.d_ff,
            "hidden_act": EXPORTED_ACTIVATIONS[model.activation],
            "layer_norm_eps": model.norm.eps,
            "qkv_bias": model.bias.qkv,
            "hidden_dropout_prob": model.dropout.residual,
            "attention_probs_dropout_prob": model.dropout.attention,
            "initializer_range": model.init_std,
            "id2label": dict(enumerate(task.labels)),
            "label2id": {label: i for i, label in enumerate(task.labels)},
        }

    def from_state(self, state: State, spec: Spec) -> State:
        model = spec.model
        assert isinstance(model, VitSpec)
        d, p = model.d_model, model.patch_size
        e = "vit.embeddings."
        out = {
            f"{e}cls_token": state["cls_token"],
            f"{e}position_embeddings": state["positional.table.weight"][None],
            f"{e}patch_embeddings.projection.weight": state["patch_embed.proj.weight"].reshape(
                d, model.channels, p, p
            ),
            f"{e}patch_embeddings.projection.bias": state["patch_embed.proj.bias"],
            "vit.layernorm.weight": state["final_norm.weight"],
            "vit.layernorm.bias": state["final_norm.bias"],
            "classifier.weight": state["head.weight"],
            "classifier.bias": state["head.bias"],
        }
        for i in range(model.n_layers):
            h, b = f"vit.encoder.layer.{i}.", f"blocks.{i}."
            a = f"{h}attention.attention."
            for name, part in zip(
                ("query", "key", "value"), state[f"{b}attn.qkv.weight"].chunk(3), strict=True
            ):
                out[f"{a}{name}.weight"] = part
            if model.bias.qkv:
                for name, part in zip(
                    ("query", "key", "value"), state[f"{b}attn.qkv.bias"].chunk(3), strict=True
                ):
                    out[f"{a}{name}.bias"] = part
            for hf, tfc in LAYER:
                weight = state[f"{b}{tfc}.weight"]
                out[f"{h}{hf}.weight"] = weight
                out[f"{h}{hf}.bias"] = zeros_if_none(state.get(f"{b}{tfc}.bias"), weight.shape[0])
        return contiguous(out)

    def preprocessor(self, spec: Spec, preprocessing: dict[str, Any] | None) -> dict[str, Any] | None:
        model = spec.model
        assert isinstance(model, VitSpec)
        if preprocessing is None:
            raise HFError("the run has no preprocessing.json (image mean and std): train it, then export")
        if ImagePreprocessing.from_dict(preprocessing).resize != "stretch":
            warnings.warn(
                "the run resizes an image's shorter side and crops the centre; transformers' "
                "ViTImageProcessor stretches it to a square: images that are not square classify "
                "differently there (resize them to a square first)",
                HFWarning,
                stacklevel=2,
            )
        return {
            "image_processor_type": "ViTImageProcessor",
            "do_resize": True,
            "size": {"height": model.image_size, "width": model.image_size},
            "resample": 2,  # bilinear
            "do_rescale": True,
            "rescale_factor": PIXEL,
            "do_normalize": True,
            "image_mean": list(preprocessing["mean"]),
            "image_std": list(preprocessing["std"]),
        }


def takes_images(spec: Spec) -> bool:
    return isinstance(spec.model, VitSpec)


def preprocessing(processor: dict[str, Any], spec: Spec, where: str) -> dict[str, Any]:
    """``preprocessor_config.json`` -> the run's ``preprocessing.json`` (image size, channels, mean
    and std of pixels in [0, 1], resize ``stretch``). Refused: a rescale other than 1/255, which
    tfcompile's image reading fixes, and a size other than the model's; another resize filter than
    bilinear (tfcompile's) is warned of: it changes only images of another size."""
    model = spec.model
    assert isinstance(model, VitSpec)
    config = Config(processor)
    rescale = config.get("rescale_factor", PIXEL) if config.get("do_rescale", True) else 1.0
    config.require(
        abs(rescale - PIXEL) < 1e-9,
        "rescale_factor",
        f"is {rescale}: tfcompile reads pixels as value / 255",
        "import a processor that rescales by 1/255",
    )
    normalize = config.get("do_normalize", True)
    mean = (
        per_channel(config, "image_mean", model.channels, MEAN_RANGE) if normalize else [0.0] * model.channels
    )
    std = per_channel(config, "image_std", model.channels, STD_RANGE) if normalize else [1.0] * model.channels
    channels = model.channels
    config.require(
        len(mean) == channels,
        "image_mean",
        f"{mean} is not one value per channel ({channels})",
        "fix the file",
    )
    config.require(
        len(std) == channels and min(std) > 0,
        "image_std",
        f"{std} is not one positive value per channel ({channels})",
        "fix the file",
    )
    square = {"height": model.image_size, "width": model.image_size}
    size = config.data.get("size", square)  # a dict, or an int
    config.require(
        size in (square, model.image_size),
        "size",
        f"{size} is not the model's image_size, {model.image_size} square",
        "import the processor saved with the model",
    )
    resample, resizes = config.get("resample", BILINEAR), config.get("do_resize", True)
    if config.problems:
        raise refuse(where, config.problems)
    if resizes and resample != BILINEAR:
        warnings.warn(
            HFWarning(
                f"{where}: resample {resample!r} is not bilinear ({BILINEAR}), the filter tfcompile resizes "
                f"with: an image of another size than {model.image_size} square is resized a little "
                f"differently than transformers does"
            ),
            stacklevel=3,
        )
    # ViTImageProcessor resizes to (height, width) whatever the aspect ratio: stretch, not crop
    return {
        "image_size": model.image_size,
        "channels": model.channels,
        "mean": mean,
        "std": std,
        "resize": "stretch",
    }


def per_channel(config: Config, name: str, channels: int, bounds: tuple[float, float]) -> list[float]:
    """``image_mean`` or ``image_std``: a list of numbers, or one number for every channel (0.5,
    ViTImageProcessor's default, where the file has none), each within ``bounds`` (a bundle's:
    normalised pixels stay finite in float32)."""
    value = config.data.get(name)
    value = [0.5 if value is None else value] * channels if not isinstance(value, list) else value
    low, high = bounds
    if not all(json_type(x) == "a number" and low <= x <= high for x in value):
        config.refuse(
            name,
            f"{config.data.get(name)!r} is not a number per channel from {low:g} to {high:g}",
            "fix the file",
        )
        return [0.5] * channels
    return [float(x) for x in value]
