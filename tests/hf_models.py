"""Tiny random Hugging Face models of every family tfcompile imports, built with transformers' own
config classes (nothing is downloaded) and saved with ``save_pretrained``, with a tokenizer each.

Each ``VARIANTS`` entry builds one model; ``save(name, folder)`` writes its folder. Norm weights
and biases are moved off their initial 1 and 0, so that a norm or bias mapped to the wrong place
changes the outputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: E402

from tfcompile.hf.errors import HFError, HFWarning  # noqa: E402
from tfcompile.hf.exporter import export_hf  # noqa: E402
from tfcompile.hf.importer import import_folder  # noqa: E402
from tfcompile.models import Encoder, Seq2Seq  # noqa: E402
from tfcompile.summary import summarize  # noqa: E402
from tfcompile.train.runs import load_trained_model  # noqa: E402

CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?")
VOCAB = 64  # every tokenizer below fits
C = transformers
# Tiny sizes of the LLaMA-like, BERT and ViT variants (tests/test_hf_fields.py starts its rows from
# them too).
DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
BERT = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=32,
)
VIT = dict(
    image_size=8,
    patch_size=4,
    num_channels=3,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    id2label={0: "cat", 1: "dog"},
    label2id={"cat": 0, "dog": 1},
)

# name -> (model builder, tokenizer kind)
VARIANTS: dict[str, tuple[Callable[[], Any], str]] = {
    "gpt2": (
        lambda: C.GPT2LMHeadModel(
            C.GPT2Config(
                vocab_size=VOCAB,
                n_positions=32,
                n_embd=16,
                n_layer=2,
                n_head=2,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        "gpt2",
    ),
    "gpt2_untied_relu": (
        lambda: C.GPT2LMHeadModel(
            C.GPT2Config(
                vocab_size=VOCAB,
                n_positions=24,
                n_embd=16,
                n_layer=1,
                n_head=4,
                n_inner=40,
                activation_function="relu",
                layer_norm_epsilon=1e-3,
                tie_word_embeddings=False,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        "gpt2",
    ),
    "llama": (
        lambda: C.LlamaForCausalLM(
            C.LlamaConfig(**(DECODER | {"max_position_embeddings": 64}), rms_norm_eps=1e-5)
        ),
        "llama",
    ),
    "llama_tied_bias_head_dim": (
        lambda: C.LlamaForCausalLM(
            C.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=40,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=12,
                max_position_embeddings=48,
                tie_word_embeddings=True,
                attention_bias=True,
                mlp_bias=True,
                hidden_act="gelu_pytorch_tanh",
            )
        ),
        "llama",
    ),
    "llama_linear": (lambda: _llama_rope({"rope_type": "linear", "factor": 2.0}), "llama"),
    "llama_dynamic": (lambda: _llama_rope({"rope_type": "dynamic", "factor": 2.0}), "llama"),
    "llama3": (
        lambda: _llama_rope(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            theta=500000.0,
        ),
        "llama",
    ),
    "llama_yarn": (
        lambda: _llama_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
        "llama",
    ),
    "mistral": (
        lambda: C.MistralForCausalLM(
            C.MistralConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                sliding_window=40,
            )
        ),
        "llama",
    ),
    "qwen2": (
        lambda: C.Qwen2ForCausalLM(
            C.Qwen2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                tie_word_embeddings=True,
                rope_theta=1e6,
            )
        ),
        "gpt2",
    ),
    "qwen3": (  # q/k norms, biases on q, k, v and o, heads wider than d_model / heads, untied
        lambda: C.Qwen3ForCausalLM(
            C.Qwen3Config(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=64,
                attention_bias=True,
                rms_norm_eps=1e-5,
                rope_theta=1e6,
            )
        ),
        "gpt2",
    ),
    "bert_mlm": (lambda: C.BertForMaskedLM(_bert()), "bert"),
    "bert_mlm_untied": (
        lambda: C.BertForMaskedLM(
            _bert(tie_word_embeddings=False, hidden_act="gelu_new", layer_norm_eps=1e-6)
        ),
        "bert",
    ),
    "bert_pretraining": (lambda: C.BertForPreTraining(_bert()), "bert"),
    "bert_cls": (
        lambda: C.BertForSequenceClassification(
            _bert(id2label={0: "neg", 1: "pos", 2: "neutral"}, label2id={"neg": 0, "pos": 1, "neutral": 2})
        ),
        "bert",
    ),
    "vit": (
        lambda: C.ViTForImageClassification(C.ViTConfig(**VIT)),
        "image",
    ),
    "vit_no_qkv_bias": (
        lambda: C.ViTForImageClassification(
            C.ViTConfig(
                image_size=12,
                patch_size=4,
                num_channels=3,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=24,
                qkv_bias=False,
                layer_norm_eps=1e-6,
                hidden_act="gelu_new",
            )
        ),
        "image",
    ),
    "t5_v1_0": (
        lambda: C.T5ForConditionalGeneration(
            C.T5Config(
                vocab_size=VOCAB,
                d_model=16,
                d_kv=4,
                d_ff=32,
                num_layers=2,
                num_decoder_layers=1,
                num_heads=4,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=20,
                decoder_start_token_id=0,
                n_positions=32,
            )
        ),
        "t5",
    ),
    "t5_gated_silu_tied": (
        lambda: C.T5ForConditionalGeneration(
            C.T5Config(
                vocab_size=VOCAB,
                d_model=16,
                d_kv=8,
                d_ff=24,
                num_layers=1,
                num_heads=2,
                feed_forward_proj="gated-silu",
                tie_word_embeddings=False,  # transformers 5 ties it anyway, without the output scale
                decoder_start_token_id=0,
                n_positions=32,
            )
        ),
        "t5",
    ),
    "t5_v1_1": (
        lambda: _untied(
            C.T5Config(
                vocab_size=VOCAB,
                d_model=16,
                d_kv=6,
                d_ff=32,
                num_layers=1,
                num_decoder_layers=2,
                num_heads=3,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=20,
                feed_forward_proj="gated-gelu",
                tie_word_embeddings=False,
                decoder_start_token_id=0,
                n_positions=32,
            )
        ),
        "t5",
    ),
}


def _untied(config: Any) -> Any:
    """T5 v1.1 with its own head: transformers 5 ties a new model's head whatever the config says,
    and unties a loaded one whose head differs from the embeddings."""
    model = C.T5ForConditionalGeneration(config)
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    return model


def _llama_rope(rope: dict[str, Any], theta: float = 10000.0) -> Any:
    config = C.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": theta, **rope},
    )
    return C.LlamaForCausalLM(config)


def _bert(**fields: Any) -> Any:
    return C.BertConfig(**BERT | fields)


def build(name: str, seed: int = 0) -> Any:
    """The variant's model, random, in eval mode, its norms and biases off their initial values."""
    torch.manual_seed(seed)
    return perturb(VARIANTS[name][0]())


def perturb(model: Any) -> Any:
    """``model`` in eval mode, its norms and biases moved off 1 and 0 (the routers' selection
    biases, buffers, too: by more than sigmoid scores differ, so that they change choices), an
    untied head unlike the embeddings."""
    model.eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
            elif "lm_head" in pname or "decoder.weight" in pname:
                p.normal_(0, 0.5)  # an untied head unlike the embeddings
        for name, t in [*model.named_buffers(), *model.named_parameters()]:  # ERNIE 4.5's: a parameter
            if name.endswith("e_score_correction_bias"):
                t.normal_(0, 0.05)
    return model


def save(name: str, folder: Path, seed: int = 0) -> Any:
    """Build the variant and save it, with its tokenizer (or image processor), into ``folder``."""
    return write(build(name, seed), VARIANTS[name][1], folder)


def write(model: Any, kind: str, folder: Path, placed: dict[str, int] | None = None) -> Any:
    """Save ``model`` into ``folder`` with the tokenizer of ``kind`` (its special tokens at the
    ``placed`` ids, if given) or, for "image", an image processor."""
    model.save_pretrained(folder)
    if kind == "image":
        size, channels = model.config.image_size, model.config.num_channels
        size = size[0] if isinstance(size, list | tuple) else size
        mean, std = [round(0.4 + 0.1 * c, 3) for c in range(channels)], [0.5] * channels  # one per channel
        processor = C.ViTImageProcessor(size={"height": size, "width": size}, image_mean=mean, image_std=std)
        processor.save_pretrained(folder)
    else:
        tokenizer(kind, placed or {}).save_pretrained(folder)
    return model


LANGUAGES = ["eng_Latn", "fra_Latn", "deu_Latn"]  # the "nllb" tokenizer's codes, after its special tokens


def tokenizer(kind: str, placed: dict[str, int] | None = None) -> Any:
    """A character tokenizer of VOCAB tokens with the family's special tokens (first, or at the
    ``placed`` ids: BERT's [CLS] is 101), as a PreTrainedTokenizerFast."""
    specials = {
        "gpt2": {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
        "llama": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        "bert": {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
        "t5": {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
        # NLLB's: T5's tokens, then language codes; sources eng_Latn ... </s>
        "nllb": {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
        # BART's: <s> its bos and cls, </s> its eos and sep; sources <s> ... </s>
        "bart": {
            "bos_token": "<s>",
            "pad_token": "<pad>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "cls_token": "<s>",
            "sep_token": "</s>",
            "mask_token": "<mask>",
        },
    }[kind]
    codes = LANGUAGES if kind == "nllb" else []
    tokens = list(dict.fromkeys([*specials.values(), *codes]))
    fillers = [f"<unused{i}>" for i in range(VOCAB - len(tokens) - len(CHARS))]  # as many ids as the model
    order = [t for t in [*tokens, *CHARS, *fillers] if t not in (placed or {})]
    for token, i in sorted((placed or {}).items(), key=lambda item: item[1]):
        order.insert(i, token)
    vocab = {t: i for i, t in enumerate(order)}
    unk = specials.get("unk_token")
    model = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    model.normalizer = normalizers.Lowercase()
    model.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    model.add_special_tokens(tokens)
    if kind == "bert":
        model.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
    elif kind == "t5":
        model.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])]
        )
    elif kind == "nllb":
        model.post_processor = processors.TemplateProcessing(
            single="eng_Latn $A </s>",
            pair="eng_Latn $A $B </s>",
            special_tokens=[("eng_Latn", vocab["eng_Latn"]), ("</s>", vocab["</s>"])],
        )
    elif kind == "bart":
        model.post_processor = processors.RobertaProcessing(("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]))
    extra = {"additional_special_tokens": codes} if codes else {}
    return C.PreTrainedTokenizerFast(tokenizer_object=model, **specials, **extra)


def random_ids(batch: int, length: int, seed: int = 0, low: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, VOCAB, (batch, length), generator=generator)


def right_padding(batch: int, length: int) -> torch.Tensor:
    """A mask whose rows hold length, length - 3, length - 5, ... real tokens, then padding."""
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        mask[row, max(1, length - 1 - 2 * row) :] = 0
    return mask


def max_difference(hf: Any, tfc: torch.nn.Module, padded: bool, seed: int = 0, length: int = 12) -> float:
    """The largest |difference| between the two models' outputs on random inputs of ``length``
    (rows of several lengths when ``padded``), at the positions of real tokens."""
    batch = 3
    ids = random_ids(batch, length, seed)
    mask = right_padding(batch, length) if padded else torch.ones(batch, length, dtype=torch.long)
    real = mask.bool()
    with torch.no_grad():
        if isinstance(hf, C.ViTForImageClassification):
            size = hf.config.image_size
            pixels = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))
            return (hf(pixel_values=pixels).logits - tfc(pixels)).abs().max().item()
        if isinstance(tfc, Seq2Seq):
            target = random_ids(batch, 7, seed + 1)
            theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
            return (theirs - tfc(ids, mask, target)).abs().max().item()
        if isinstance(tfc, Encoder):  # BERT's and ELECTRA's heads, reading segments
            types = (torch.arange(length) >= length // 2).long().expand(batch, -1)
            theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
            ours = tfc(ids, mask, types)
            if not isinstance(ours, tuple):  # a classifier's logits
                return (theirs.logits - ours).abs().max().item()
            if ours[1] is not None:  # BertForPreTraining's
                nsp = (theirs.seq_relationship_logits - ours[1]).abs().max().item()
                return max(nsp, (theirs.prediction_logits - ours[0])[real].abs().max().item())
            return (theirs.logits - ours[0])[real].abs().max().item()
        theirs = hf(input_ids=ids, attention_mask=mask).logits
        return (theirs - tfc(ids, mask))[real].abs().max().item()


# ------------------------------------------------ transformers' folders and tfcompile's imports

AUTO = {
    "CausalLM": "AutoModelForCausalLM",
    "LMHeadModel": "AutoModelForCausalLM",
    "MaskedLM": "AutoModelForMaskedLM",
    "PreTraining": "AutoModelForPreTraining",
    "SequenceClassification": "AutoModelForSequenceClassification",
    "ImageClassification": "AutoModelForImageClassification",
    "ConditionalGeneration": "AutoModelForSeq2SeqLM",
    "MTModel": "AutoModelForSeq2SeqLM",  # Marian's
}
# Head classes whose names end as another kind's (a multimodal model's ForConditionalGeneration is
# no sequence-to-sequence model): loaded by their own class.
# Multimodal models of a language model: their own classes (AutoModelForSeq2SeqLM reads none)
OWN_CLASSES = (
    "Gemma3ForConditionalGeneration",
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
)


def from_pretrained(folder: Path, loading_info: bool = False) -> Any:
    """The folder as transformers reads it (ties and unties as it decides), in float32 as tfcompile
    imports it whatever config.json's dtype says; with ``loading_info``, also the tensors it found
    missing, unexpected or mismatched."""
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    auto = (
        getattr(transformers, architecture)
        if architecture in OWN_CLASSES
        else next(getattr(transformers, cls) for suffix, cls in AUTO.items() if architecture.endswith(suffix))
    )
    if loading_info:
        model, info = auto.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
        return model.eval(), info
    return auto.from_pretrained(folder, dtype=torch.float32).eval()


class Imported:
    """A model saved by transformers into root/hf/NAME (by ``write_to``: VARIANTS[name] by
    default), read back by it, and imported into tfcompile as NAME; ``warnings_as``, where given,
    is what an HFWarning of the import becomes ("ignore", "error")."""

    def __init__(
        self,
        root: Path,
        name: str,
        write_to: Callable[[Path], Any] | None = None,
        warnings_as: Literal["ignore", "error"] | None = None,
    ) -> None:
        self.name, self.folder = name, root / "hf" / name
        (write_to or partial(save, name))(self.folder)
        self.hf = from_pretrained(self.folder)
        with warnings.catch_warnings():
            if warnings_as is not None:
                warnings.simplefilter(warnings_as, HFWarning)
            self.result = import_folder(self.folder, name, root / "specs", root / "runs")
        self.spec, self.model = load_trained_model(self.result.run_dir)

    def assert_outputs_match(self, length: int = 12) -> None:
        """tfcompile's model gives transformers' outputs in float32, padded and not, on inputs of
        ``length`` (past a window or an original length the variant sets)."""
        for padded in (False, True):
            assert max_difference(self.hf, self.model, padded, length=length) <= 1e-5, (self.name, padded)

    def assert_left_padded_match(self, positions: bool = False) -> None:
        """A left-padded batch (the runtime's) gives transformers' logits at its real tokens: each
        row reads as it would alone. ``positions``: transformers' forward numbers positions by
        column, so it is given the ones generate() passes it (the real tokens before each)."""
        ids, mask = random_ids(3, 10), right_padding(3, 10).flip(-1)
        given = {"position_ids": (mask.cumsum(-1) * mask - 1).clamp(min=0)} if positions else {}
        with torch.no_grad():
            theirs = self.hf(input_ids=ids, attention_mask=mask, **given).logits
            ours = self.model(ids, mask)
        assert (theirs - ours)[mask.bool()].abs().max() <= 1e-5

    def assert_generates_as_transformers(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], new_tokens: int = 12
    ) -> None:
        """`tfcompile export`, then `tfcompile generate` of two prompts of different lengths, one
        left-padded batch in the bundle (ONNX, KV cache), each as transformers generates it alone
        (greedy)."""
        from tfcompile.cli import main

        bundle = str(tmp_path / "bundle")
        assert main(["export", str(self.result.run_dir), "--out", bundle]) == 0
        prompts = ["the cat sat", "hi"]
        capsys.readouterr()
        arguments = ["--max-new-tokens", str(new_tokens), "--temperature", "0"]
        assert main(["generate", bundle, *(a for p in prompts for a in ("--prompt", p)), *arguments]) == 0
        tokenizer = Tokenizer.from_file(str(self.result.run_dir / "tokenizer.json"))
        expected = []
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt).ids])
            with torch.no_grad():
                out = self.hf.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens
                )
            expected.append(tokenizer.decode(out[0].tolist()))
        assert capsys.readouterr().out == "\n\n".join(expected) + "\n"

    def assert_runtime_generates_as_transformers(self, tmp_path: Path, new: int = 7) -> None:
        """`tfcompile export` (parity checked), then greedy decoding of ``new`` ids after 5 with the
        KV cache in tfcompile.runtime against transformers' generate."""
        from tfcompile.cli import main
        from tfcompile.runtime import load

        assert main(["export", str(self.result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
        prompt = torch.tensor([[5, 9, 13, 2, 30]])
        expected = self.hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new
        )
        ours = load(tmp_path / "bundle").generate(prompt.numpy(), new, temperature=0.0, stop=False)
        assert ours[0].tolist() == expected[0].tolist()

    def assert_counts_match(self, unread: int = 0) -> None:
        """The spec, the model and the summary count transformers' parameters, less ``unread``
        ones transformers keeps and tfcompile does not."""
        expected = self.hf.num_parameters() - unread
        assert self.spec.parameter_count() == expected == sum(p.numel() for p in self.model.parameters())
        assert summarize(self.spec).total_params == expected


def copied(imported: dict[str, Imported], name: str, tmp_path: Path) -> Path:
    """A copy of the variant's saved folder, to change."""
    folder = tmp_path / "src"
    shutil.copytree(imported[name].folder, folder)
    return folder


def edited(imported: dict[str, Imported], name: str, tmp_path: Path, **fields: Any) -> Path:
    """A copy of the variant's saved folder with ``fields`` changed in its config.json."""
    folder = copied(imported, name, tmp_path)
    config = json.loads((folder / "config.json").read_text()) | fields
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def with_tensors(imported: dict[str, Imported], name: str, tmp_path: Path, tensors: dict[str, Any]) -> Path:
    """A copy of the variant's saved folder with ``tensors`` added to its checkpoint (tensors a
    published checkpoint holds beside the model's)."""
    from safetensors.torch import load_file, save_file

    folder = copied(imported, name, tmp_path)
    path = folder / "model.safetensors"
    save_file(load_file(path) | tensors, path, metadata={"format": "pt"})
    return folder


def import_all(root: Path) -> dict[str, Imported]:
    """Every variant, imported under its name (a module's fixture: a few seconds in all); the
    warning of Mistral's capped context is tested on its own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        return {name: Imported(root, name) for name in VARIANTS}


def imported_variants(
    root: Path, variants: dict[str, Callable[[], Any]], tokenizer: str = "gpt2"
) -> dict[str, Imported]:
    """Each of a family file's ``variants`` (name -> model builder): built with seed 0, its weights
    perturbed, saved with a ``tokenizer`` (``write``'s kind) and imported (an HFWarning an error)."""

    def writer(name: str) -> Callable[[Path], None]:
        def write_to(folder: Path) -> None:
            torch.manual_seed(0)
            write(perturb(variants[name]()), tokenizer, folder)

        return write_to

    return {name: Imported(root, name, writer(name), "error") for name in variants}


def loads_alike(out: Path, model: torch.nn.Module) -> None:
    """transformers loads ``out`` with no missing, unexpected or mismatched tensors, and its
    outputs are ``model``'s, with and without padding."""
    reloaded, info = from_pretrained(out, loading_info=True)
    assert not any(info.values()), info
    for padded in (False, True):
        assert max_difference(reloaded, model, padded) <= 1e-5, padded


def assert_round_trips(variant: Imported, head: str, tmp_path: Path) -> None:
    """export-hf writes the variant's run as ``head``, which transformers loads to the run's
    outputs, and which imports back to the same model."""
    assert export_hf(variant.result.run_dir, tmp_path / "out") == head
    loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


def own_run_written(spec_text: str, head: str, tmp_path: Path) -> tuple[Any, Any]:
    """A random run of ``model: {spec_text}``, which export-hf writes as ``head`` and transformers
    loads to its outputs -> the run's model spec, and the spec of the folder imported back."""
    from helpers import random_run

    run = random_run(tmp_path, f"model: {{{spec_text}}}\n")
    spec, ours = load_trained_model(run)
    assert export_hf(run, tmp_path / "out") == head
    loads_alike(tmp_path / "out", ours)
    with pytest.warns(HFWarning, match="no tokenizer.json"):  # a random run has none
        again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    return spec.model, again.spec.model


def assert_export_refused(spec_text: str, fields: list[str], written: str, tmp_path: Path) -> None:
    """export-hf refuses a random run of ``model: {spec_text}`` by exactly ``fields``, as
    ``written`` (the architecture it would write) lacks them, and writes nothing."""
    from helpers import random_run

    run = random_run(tmp_path, f"model: {{{spec_text}}}\n")
    with pytest.raises(HFError) as error:
        export_hf(run, tmp_path / "out")
    assert re.findall(r"^  (\S+): ", str(error.value), re.MULTILINE) == fields, str(error.value)
    assert f"{written} equivalent" in str(error.value) and not (tmp_path / "out").exists()


def assert_head_refused(variant: Imported, head: str, tmp_path: Path) -> None:
    """The variant's folder saved under another head class of its model type (``head``) is
    refused by ``architectures``, before anything is written."""
    folder = edited({variant.name: variant}, variant.name, tmp_path, architectures=[head])
    with pytest.raises(HFError, match=rf"  architectures: {head} is not a language"):
        import_folder(folder, "head", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "head").exists()


# transformers 5.24 saves a multimodal model under the names transformers 4 reads; its own, which it
# reads too, are these (its language model's, the image path's).
FIVE = "_5_names"
OWN_NAMES = {
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
    "vision_tower.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
    "image_newline": "model.image_newline",
}


def own_names(folder: Path) -> None:
    """The multimodal folder's checkpoint under transformers 5's own names."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    renamed = {}
    for name, tensor in load_file(path).items():
        old = next(prefix for prefix in OWN_NAMES if name.startswith(prefix))
        renamed[OWN_NAMES[old] + name[len(old) :]] = tensor
    save_file(renamed, path, metadata={"format": "pt"})
