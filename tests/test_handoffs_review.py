"""Hand-offs given odd input: a byte-level BPE whose steps onnxruntime-genai's tokenizer would
ignore."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfcompile.errors import ExportError
from tfcompile.handoffs.genai import genai_tokenizer


def byte_level_bpe(edit: Callable[[Tokenizer], None] = lambda t: None) -> bytes:
    """A small byte-level BPE as tfcompile trains one (GPT-2's steps), then ``edit``-ed."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["ab ab cd, cd. ab"] * 20, trainer=trainer)
    tokenizer.add_special_tokens(["[EOS]"])
    edit(tokenizer)
    return tokenizer.to_str().encode("utf-8")


def test_a_gpt2_like_byte_level_bpe_goes_as_it_is() -> None:
    data = byte_level_bpe()
    assert genai_tokenizer(data) == data


EDITS: dict[str, Callable[[Tokenizer], None]] = {
    # Each of these changes the tokenizers library's ids (or text), and onnxruntime-extensions
    # (0.18's genai) gives GPT-2's whatever the file says: "ROMEO" lowercased, " x" for "x",
    # "ab ab" as one pre-token, an [EOS] in front, "Ġab" for " ab".
    "normalizer": lambda t: setattr(t, "normalizer", normalizers.Lowercase()),
    "add_prefix_space: true": lambda t: setattr(
        t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)
    ),
    "use_regex: false": lambda t: setattr(
        t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    ),
    "post-processor": lambda t: setattr(
        t,
        "post_processor",
        processors.TemplateProcessing(single="[EOS] $A", special_tokens=[("[EOS]", t.token_to_id("[EOS]"))]),
    ),
    "decoder": lambda t: setattr(t, "decoder", decoders.Metaspace()),
}


@pytest.mark.parametrize("setting", EDITS)
def test_a_byte_level_bpe_with_steps_genai_ignores_is_refused(setting: str) -> None:
    with pytest.raises(ExportError, match=f"would ignore this tokenizer's {setting}: its ids"):
        genai_tokenizer(byte_level_bpe(EDITS[setting]))


def test_a_byte_level_post_processor_is_gpt2s_own() -> None:
    data = byte_level_bpe(lambda t: setattr(t, "post_processor", processors.ByteLevel()))
    assert genai_tokenizer(data) == data
