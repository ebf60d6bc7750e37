"""Rules of the published manifest documentation (schemas/manifest.schema.json, from the
descriptions in tfcompile/manifest.py) that a client written from the docs alone missed, held to
what tfcompile.runtime does, so that the docs and the runtime cannot drift apart again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from helpers import damaged, edited_tokenizer, without_truncation
from tokenizers import Tokenizer

from tfcompile.runtime import load


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """The runtime's greedy new tokens, each step a full pass (no cache: no near-tie can differ
    between a cached step and a full pass)."""
    out = model.generate(np.array([prompt]), n, temperature=0, use_cache=False)
    return out[0, len(prompt) :].tolist()


def test_a_client_picks_only_ids_of_the_tokenizers_vocabulary(char_bundle: Path, tmp_path: Path) -> None:
    """tokenizer: logits past the tokenizer's get_vocab_size() (a padded embedding table, as
    T5's 32,128 rows for 32,100 tokens) are dropped before the argmax."""
    model = load(char_bundle)
    prompt = model.tokenizer.encode("A").ids
    cut = max(_greedy(model, prompt, 12))  # the tokenizer loses the largest id the model picks
    assert cut > max(prompt)

    def narrow(tokenizer: dict) -> None:
        tokenizer["model"]["vocab"] = {k: v for k, v in tokenizer["model"]["vocab"].items() if v < cut}

    tokenizer = edited_tokenizer(char_bundle, narrow)
    smaller = load(damaged(char_bundle, tmp_path, **{"tokenizer.json": tokenizer}))
    assert smaller.tokenizer.get_vocab_size() == cut < smaller.manifest.model.vocab_size
    ids = list(prompt)  # the documented loop: the argmax of the last logits below the cut
    for _ in range(12):
        ids.append(int(smaller.logits(np.array([ids]))[0, -1, :cut].argmax()))
    assert _greedy(smaller, prompt, 12) == ids[len(prompt) :]


def test_a_stop_token_ends_its_row_and_is_left_out_of_the_text(char_bundle: Path, tmp_path: Path) -> None:
    """generation: a row's last new id is the stop token; its text is the prompt and the tokens
    before the stop, decoded together, even when the stop token is no special token."""
    model = load(char_bundle)
    prompt = model.tokenizer.encode("ROMEO:").ids
    free = _greedy(model, prompt, 12)
    stop = free[3]
    first = free.index(stop)

    def stop_at(manifest: dict) -> None:
        manifest["generation"]["stop_token_ids"] = [stop]

    stopping = load(damaged(char_bundle, tmp_path, manifest=stop_at))
    assert _greedy(stopping, prompt, 12) == free[: first + 1]
    text = stopping.generate_text("ROMEO:", 12, temperature=0, use_cache=False)
    assert text == model.tokenizer.decode(prompt + free[:first])


def test_a_prompt_past_the_context_is_read_as_its_last_context_length_tokens(char_bundle: Path) -> None:
    """generation: a prompt longer than context_length is read as its last context_length
    tokens; the window then slides."""
    model = load(char_bundle)
    context = model.manifest.generation.context_length
    prompt = model.tokenizer.encode(("To be, or not to be: that is the question. " * 3)[: context + 9]).ids
    assert len(prompt) == context + 9
    longer = model.generate(np.array([prompt]), 4, temperature=0)[0, len(prompt) :]
    window = model.generate(np.array([prompt[-context:]]), 4, temperature=0)[0, context:]
    assert longer.tolist() == window.tolist()


def test_the_second_of_two_equally_long_sentences_keeps_the_odd_token(classifier_bundle: Path) -> None:
    """Truncation: longest_first gives each sentence of a pair half of the room left, the longer
    one the odd token; of two equally long, the second."""
    model = load(classifier_bundle)
    truncation = model.manifest.tokenizer.truncation
    room = truncation.max_length - 3  # [CLS] A [SEP] B [SEP]
    assert truncation.strategy == "longest_first" and room % 2 == 1
    sentence = " ".join(["a"] * 3 * truncation.max_length)  # past what the runtime pre-cuts a side to
    (encoding,) = model.encode([(sentence, sentence)])
    assert (encoding.type_ids.count(0) - 2, encoding.type_ids.count(1) - 1) == (room // 2, room - room // 2)


def test_without_truncation_a_pair_past_the_context_is_cut_longest_first_from_the_right(
    classifier_bundle: Path, tmp_path: Path
) -> None:
    """Truncation: a bundle whose manifest gives none (an imported tokenizer's) cuts a text or
    pair longest-first from the right at the context, its special tokens included."""
    bundle = without_truncation(classifier_bundle, tmp_path)
    model = load(bundle)
    assert model.manifest.tokenizer.truncation is None
    context = model.manifest.model.max_seq_len
    first, second = " ".join(["a"] * 2 * context), " ".join(["b"] * 3)
    (encoding,) = model.encode([(first, second)])
    whole = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(first, second)
    assert len(encoding.ids) == context < len(whole.ids)
    kept = encoding.type_ids.count(1) - 1  # the second sentence's tokens, less its [SEP]
    assert kept == 3 and encoding.ids[1 : context - 5] == whole.ids[1 : context - 5]


def test_text_that_spells_a_special_token_encodes_to_it(classifier_bundle: Path) -> None:
    """tokenizer: encoding is the tokenizers library's encode, which reads "[SEP]" in a text as
    the separator: a client in another language must do the same."""
    model = load(classifier_bundle)
    sep = model.manifest.tokenizer.special_tokens["sep"].id
    (encoding,) = model.encode(["good [SEP] bad"])
    assert encoding.ids.count(sep) == 2  # the one in the text, and the one the template adds


def test_an_images_exif_orientation_is_not_applied(image_bundle: Path, tmp_path: Path) -> None:
    """image: the pixels as stored; an EXIF orientation (6: turned 90 degrees) changes nothing."""
    from PIL import Image

    model = load(image_bundle)
    pixels = np.random.default_rng(0).integers(0, 256, (6, 11), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    Image.fromarray(pixels).save(tmp_path / "turned.png", exif=exif)
    assert Image.open(tmp_path / "turned.png").getexif()[0x0112] == 6
    (from_file,) = model.classify_images([tmp_path / "turned.png"])
    (as_stored,) = model.classify_images([pixels])
    assert from_file.probabilities == as_stored.probabilities
