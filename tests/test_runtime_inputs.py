"""Whatever a caller passes, the runtime answers with a result or an InputError naming the
argument: never an exception from numpy, onnxruntime or the tokenizers library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ROOT, damaged
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcompile.runtime import InputError, LanguageModel, Translator, load

DATA = ROOT / "tests" / "data"

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.lists(st.integers(-3, 70), max_size=4),
    st.lists(st.lists(st.integers(-3, 70), max_size=4), max_size=3),
    st.lists(st.text(max_size=6), max_size=3),
    st.tuples(st.text(max_size=4), st.text(max_size=4)),
)
small_counts = st.one_of(anything, st.integers(0, 6))


@pytest.fixture(scope="module")
def decoder() -> LanguageModel:
    model = load(DATA / "format1-decoder")
    assert isinstance(model, LanguageModel)
    return model


@pytest.fixture(scope="module")
def translator() -> Translator:
    model = load(DATA / "format1-translator")
    assert isinstance(model, Translator)
    return model


def _result_or_input_error(call: Any) -> None:
    try:
        call()
    except InputError as e:
        assert str(e)  # says what was wrong


@settings(deadline=3000)
@given(
    ids=anything,
    mask=st.one_of(st.none(), anything),
    new=small_counts,
    temperature=st.one_of(st.none(), anything, st.floats(0, 3)),
    top_k=st.one_of(st.none(), anything),
    top_p=st.one_of(st.none(), anything, st.floats(0, 1)),
    seed=st.one_of(st.none(), anything),
)
def test_generate_takes_anything(
    decoder: LanguageModel, ids: Any, mask: Any, new: Any, temperature: Any, top_k: Any, top_p: Any, seed: Any
) -> None:
    _result_or_input_error(
        lambda: decoder.generate(ids, new, temperature, top_k, top_p, seed, attention_mask=mask)
    )
    _result_or_input_error(lambda: decoder.logits(ids, mask))


@settings(deadline=3000)
@given(prompt=st.one_of(anything, st.text(max_size=30)), new=small_counts)
def test_generate_text_takes_anything(decoder: LanguageModel, prompt: Any, new: Any) -> None:
    _result_or_input_error(lambda: decoder.generate_text(prompt, new, temperature=0))


@settings(deadline=3000)
@given(
    texts=st.one_of(anything, st.text(max_size=20)),
    beam=small_counts,
    penalty=st.one_of(anything, st.floats(0, 1e6)),
    max_len=small_counts,
)
def test_translate_takes_anything(
    translator: Translator, texts: Any, beam: Any, penalty: Any, max_len: Any
) -> None:
    _result_or_input_error(lambda: translator.translate(texts, beam, penalty, max_len))
    _result_or_input_error(lambda: translator.translate_ids(texts, None, beam, penalty, max_len))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.generate([[1, 2], [3]], 2), "rectangular"),
        (lambda m: m.generate([[1, 2]], 2.5), "max_new_tokens must be >= 0 and a whole number"),
        (lambda m: m.generate([[1, 2]], True), "max_new_tokens"),
        (lambda m: m.generate([[1, 2]], 2, temperature=float("nan")), "temperature must be a finite number"),
        (lambda m: m.generate([[1, 2]], 2, temperature=-1.0), "temperature must be >= 0"),
        (lambda m: m.generate([[1, 2]], 2, top_p=0.0), r"top_p must be in \(0, 1\]"),
        (lambda m: m.generate([[1, 2]], 2, top_k="5"), "top_k"),
        (lambda m: m.generate([[1, 2]], 2, seed=-1), "seed"),
        (lambda m: m.generate_text(None, 2), "prompt takes a string"),
        (lambda m: m.generate_text(42, 2), "prompt takes a string"),
        (lambda m: m.generate_text("", 2), "encodes to no tokens"),
        (lambda m: m.generate_text("¿qué?", 2), r"outside the bundle's vocabulary: \['¿', 'é'\]"),
    ],
)
def test_bad_arguments_name_themselves(decoder: LanguageModel, call: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        call(decoder)


def test_a_length_penalty_is_bounded_where_its_score_stays_finite(translator: Translator) -> None:
    """((5 + length) / 6) ** 1000 overflows a float: beam search's scores would."""
    with pytest.raises(InputError, match=r"length_penalty must be in \[0, 10\], got 1000\.0"):
        translator.translate_ids([[5, 6, 7]], beam=2, length_penalty=1000)
    with pytest.raises(InputError, match=r"length_penalty must be in \[0, 10\], got -1\.0"):
        translator.translate_ids([[5, 6, 7]], beam=2, length_penalty=-1)  # fairseq's alpha


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # a beam of 10**10 allocated 74.5 GiB in numpy; 100,000 ran for minutes to give ''
        (lambda m: m.translate_ids([[5, 6]], beam=10**10), "beam must be at most 64, got 10000000000"),
        (lambda m: m.translate(["ein Hund"], beam=65), "beam must be at most 64, got 65"),
        (lambda m: m.translate_ids([[5, 6], [7]]), "source_ids must be a rectangular array"),
        (lambda m: m.translate_ids([[5, 6]], source_mask=[[1, 2]]), "source_mask must hold 0"),
        (lambda m: m.translate_ids([[5, 6]], target_prefix_ids=[5, True]), "a flat list of token ids"),
        (lambda m: m.translate_ids([[5, 6]], target_prefix_ids=[[5]]), "a flat list of token ids"),
    ],
)
def test_a_translators_bad_arguments_name_themselves(translator: Translator, call: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        call(translator)


def test_a_translator_takes_numpy_for_its_prefix_and_its_switches(translator: Translator) -> None:
    prefix = translator.translate_ids([[5, 6]], beam=2, max_len=4, target_prefix_ids=[7])
    assert translator.translate_ids([[5, 6]], beam=2, max_len=4, target_prefix_ids=np.array([7])) == prefix
    plain = translator.translate_ids([[5, 6]], beam=2, max_len=4)
    assert translator.translate_ids([[5, 6]], beam=2, max_len=4, early_stopping=np.False_) == plain


def test_transformers_beam_search_takes_a_negative_length_penalty(
    translator_bundle: Path, tmp_path: Path
) -> None:
    """generate()'s length_penalty below 0 favours shorter translations: a bundle whose
    beam_scoring is transformers takes one, to -10, in its manifest and from a caller."""

    def scored(m: dict[str, Any]) -> None:
        m["translation"] |= {
            "beam_scoring": "transformers",
            "length_penalty": -2.0,
            "early_stopping": "never",
        }

    model = load(damaged(translator_bundle, tmp_path, scored), providers=["CPUExecutionProvider"])
    assert isinstance(model, Translator) and model.translation.length_penalty == -2.0
    assert (
        len(model.translate_ids([[5, 6, 7]], beam=2, length_penalty=-10)[0])
        <= model.translation.max_decode_len
    )
    with pytest.raises(InputError, match=r"length_penalty must be in \[-10, 10\], got -11\.0"):
        model.translate_ids([[5, 6, 7]], beam=2, length_penalty=-11)


def test_a_padded_batch_of_prompts_generates_as_each_prompt_alone(decoder: LanguageModel) -> None:
    """A format 1 graph counts positions from its cache, so the runtime generates its padded rows
    one by one; the answer is the same."""
    prompts = ["ROMEO:", "JU", "Now is the"]
    together = decoder.generate_text(prompts, 6, temperature=0)
    assert together == [decoder.generate_text(p, 6, temperature=0) for p in prompts]
    assert np.array_equal(
        decoder.generate(
            np.array([[0, 0, 5, 6], [1, 2, 3, 4]]),
            3,
            temperature=0,
            attention_mask=[[0, 0, 1, 1], [1, 1, 1, 1]],
        )[0, 4:],
        decoder.generate(np.array([[5, 6]]), 3, temperature=0)[0, 2:],
    )
