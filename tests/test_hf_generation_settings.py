"""What a language model's files set generate() to do, imported as its task's and written back.
Stop tokens: transformers ends generation at every id of eos_token_id (a list in Llama 3's and
Qwen2.5's generation_config.json); the import makes those beside the eos the task's stop_tokens,
the bundle's generation stops at each (the runtime, as generate() does). Sampling: do_sample,
temperature, top_k, top_p, min_p, max_new_tokens and repetition_penalty become the bundle's defaults for a
request that names none. export-hf writes both back. Tiny random GPT-2s with a character tokenizer."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import random_run
from hf_models import build, from_pretrained, write

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.runtime import load
from tfcompile.spec import SpecError, parse_spec

transformers = pytest.importorskip("transformers")
PROMPT = [[5, 9, 13, 2, 30]]


def saved(folder: Path, eos: Any = 0, **fields: Any) -> Any:
    """The gpt2 variant (eos id 0, <|endoftext|>) saved with ``eos`` as generation_config.json's
    eos_token_id, and its other ``fields``."""
    model = write(build("gpt2"), "gpt2", folder)
    path = folder / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"eos_token_id": eos} | fields))
    return model


def greedy(model: Any, new: int, **fields: Any) -> list[int]:
    prompt = torch.tensor(PROMPT)
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new, **fields
        )
    return out[0, len(PROMPT[0]) :].tolist()


@pytest.fixture(scope="module")
def stop(tmp_path_factory: pytest.TempPathFactory) -> int:
    """The last distinct token of greedy generation's first eight, not the eos: where a stop there
    ends it early."""
    folder = tmp_path_factory.mktemp("probe")
    tokens = greedy(saved(folder, 0), 8, eos_token_id=None)
    return int([t for t in dict.fromkeys(tokens) if t != 0][-1])


@pytest.mark.slow
def test_the_bundle_stops_where_generate_stops(stop: int, tmp_path: Path) -> None:
    saved(tmp_path / "hf", [0, stop])
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "chat", tmp_path / "specs", tmp_path / "runs")
    vocabulary = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["model"]["vocab"]
    spelled = next(token for token, i in vocabulary.items() if i == stop)
    assert result.spec.task.stop_tokens == [spelled]
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert bundle.generation.stop_token_ids == [0, stop]
    theirs = greedy(hf, 12)
    assert theirs[-1] == stop and len(theirs) < 12
    ours = bundle.generate(np.array(PROMPT), 12, temperature=0.0)
    assert ours[0, len(PROMPT[0]) :].tolist() == theirs


def test_export_hf_writes_the_stop_tokens_into_eos_token_id(stop: int, tmp_path: Path) -> None:
    saved(tmp_path / "hf", [0, stop])
    result = import_folder(tmp_path / "hf", "chat", tmp_path / "specs", tmp_path / "runs")
    export_hf(result.run_dir, tmp_path / "out")
    for name in ("config.json", "generation_config.json"):
        assert json.loads((tmp_path / "out" / name).read_text())["eos_token_id"] == [0, stop]
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.task.stop_tokens == result.spec.task.stop_tokens


@pytest.mark.parametrize("given", ["null", "other", "others"])
def test_an_eos_token_id_that_leaves_the_tokenizers_eos_out_stops_there_alone(
    given: str, stop: int, tmp_path: Path
) -> None:
    """generate() ends a text at generation_config's eos_token_id alone: null runs to the limit,
    another id ends there and not at the tokenizer's eos; the bundle stopped at the tokenizer's eos
    too. export-hf writes the same back."""
    eos = {"null": None, "other": stop, "others": [stop]}[given]
    saved(tmp_path / "hf", eos)
    result = import_folder(tmp_path / "hf", "base", tmp_path / "specs", tmp_path / "runs")
    assert not result.spec.task.stop_at_eos and len(result.spec.task.stop_tokens) == (eos is not None)
    export_hf(result.run_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"]
    assert written == (None if eos is None else [stop])
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs").spec.task
    assert (again.stop_at_eos, again.stop_tokens) == (False, result.spec.task.stop_tokens)


def test_an_eos_token_id_no_file_gives_keeps_the_tokenizers_eos(tmp_path: Path) -> None:
    saved(tmp_path / "hf", 0)
    path = tmp_path / "hf" / "generation_config.json"
    path.write_text(
        json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "eos_token_id"})
    )
    assert import_folder(tmp_path / "hf", "base", tmp_path / "specs", tmp_path / "runs").spec.task.stop_at_eos


@pytest.mark.slow
def test_a_bundle_whose_eos_token_id_leaves_the_eos_out_generates_as_generate_does(
    stop: int, tmp_path: Path
) -> None:
    saved(tmp_path / "hf", [stop])
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "base", tmp_path / "specs", tmp_path / "runs")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert bundle.generation.stop_token_ids == [stop]
    ours = bundle.generate(np.array(PROMPT), 12, temperature=0.0)
    assert ours[0, len(PROMPT[0]) :].tolist() == greedy(hf, 12)


def test_a_single_eos_adds_no_stop_token_an_id_past_the_logits_none_and_one_unnamed_warns(
    tmp_path: Path,
) -> None:
    """An id past the model's 64 logits is never generated: nothing to stop at, nothing said. One
    the tokenizer cannot name (here: there is no tokenizer.json) stops transformers alone."""
    saved(tmp_path / "one", 0)
    assert (
        import_folder(tmp_path / "one", "one", tmp_path / "specs", tmp_path / "runs").spec.task.stop_tokens
        == []
    )
    saved(tmp_path / "past", [0, 63, 500])
    result = import_folder(tmp_path / "past", "past", tmp_path / "specs", tmp_path / "runs")
    assert len(result.spec.task.stop_tokens) == 1
    saved(tmp_path / "bare", [0, 5])
    (tmp_path / "bare" / "tokenizer.json").unlink()
    with pytest.warns(HFWarning) as caught:  # and that the run has no tokenizer
        bare = import_folder(tmp_path / "bare", "bare", tmp_path / "specs", tmp_path / "runs")
    assert bare.spec.task.stop_tokens == []
    assert any(
        "eos_token_id [0, 5]: the tokenizer names no token of id 0, 5" in str(w.message) for w in caught
    )


def test_an_eos_token_id_that_is_no_token_id_is_refused_by_field(tmp_path: Path) -> None:
    saved(tmp_path / "hf", [0, "x"])
    with pytest.raises(HFError, match=r"generation_config\.json: 1 problem:\n  eos_token_id: is \[0, 'x'\]"):
        import_folder(tmp_path / "hf", "bad", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "bad").exists()


def test_a_stop_token_named_twice_is_located(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(
            "model: {family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, "
            "max_seq_len: 16}\ntask: {type: causal_lm, stop_tokens: [a, b, a]}\n"
        )
    assert [issue.path for issue in error.value.issues] == ["task.stop_tokens"]
    assert "'a' more than once" in str(error.value)


def test_a_stop_token_the_runs_tokenizer_lacks_fails_the_export_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved(tmp_path / "hf", 0)
    run = import_folder(tmp_path / "hf", "run", tmp_path / "specs", tmp_path / "runs").run_dir
    spec_file = run / "spec.yaml"
    assert "  stop_tokens: []\n" in spec_file.read_text()
    spec_file.write_text(
        spec_file.read_text().replace("  stop_tokens: []\n", "  stop_tokens: ['<|none|>']\n")
    )
    assert main(["export", str(run), "--out", str(tmp_path / "bundle")]) == 1
    assert "task.stop_tokens: '<|none|>' is no token of the run's tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "bundle").exists()
    with pytest.raises(HFError, match=r"holds no token of task\.stop_tokens"):
        export_hf(run, tmp_path / "out")


def test_stop_tokens_without_a_tokenizer_fail_the_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = random_run(
        tmp_path,
        "model: {family: decoder, vocab_size: 64, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 16}\n"
        "task: {type: causal_lm, stop_tokens: [a]}\n",
    )
    assert main(["export", str(run), "--out", str(tmp_path / "bundle")]) == 1
    assert "no run's tokenizer to find them in" in capsys.readouterr().err


# the task's generation defaults, where the files set none: tfcompile's
SAMPLING = {
    "temperature": 1.0,
    "top_k": None,
    "top_p": None,
    "min_p": None,
    "max_new_tokens": 200,
    "repetition_penalty": 1.0,
}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {}),  # nothing set: tfcompile's defaults (sampling at temperature 1, 200 new tokens)
        ({"do_sample": False, "max_new_tokens": 30}, {"temperature": 0.0, "max_new_tokens": 30}),
        (
            {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
            {"temperature": 0.6, "top_k": 50, "top_p": 0.9},
        ),
        ({"do_sample": True, "top_k": 0}, {"temperature": 1.0}),  # top_k 0 and top_p 1: every token
        ({"temperature": 0.6}, {}),  # without do_sample, generate() decodes greedily: not a choice
        ({"repetition_penalty": 1.2}, {"repetition_penalty": 1.2}),  # with or without do_sample
        ({"do_sample": True, "repetition_penalty": 1.0}, {"temperature": 1.0, "top_k": 50}),
        (
            {"do_sample": True, "temperature": 0.7, "top_k": 0, "min_p": 0.05},
            {"temperature": 0.7, "min_p": 0.05},
        ),
        ({"do_sample": True, "min_p": 0.0}, {"temperature": 1.0, "top_k": 50}),  # 0: every token
        ({"min_p": 0.1}, {}),  # greedy
    ],
)
def test_sampling_settings_are_the_bundles_defaults_and_export_hf_writes_them_back(
    fields: dict[str, Any], expected: dict[str, Any], tmp_path: Path
) -> None:
    saved(tmp_path / "hf", **fields)
    result = import_folder(tmp_path / "hf", "chat", tmp_path / "specs", tmp_path / "runs")
    task = result.spec.task
    assert {name: getattr(task, name) for name in SAMPLING} == SAMPLING | expected
    export_hf(result.run_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert ("do_sample" in written) == any(
        [task.temperature != 1.0, task.top_k, task.top_p, task.min_p]
    )  # tfcompile's own: none
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs").spec.task
    assert {name: getattr(again, name) for name in SAMPLING} == {
        name: getattr(task, name) for name in SAMPLING
    }


@pytest.mark.slow
def test_a_greedy_folders_bundle_generates_by_default_as_generate_does(tmp_path: Path) -> None:
    """do_sample false and max_new_tokens 9: the bundle's generate() without options is
    transformers' generate() without options."""
    saved(tmp_path / "hf", None, do_sample=False, max_new_tokens=9)
    result = import_folder(tmp_path / "hf", "greedy", tmp_path / "specs", tmp_path / "runs")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert (bundle.generation.temperature, bundle.generation.max_new_tokens) == (0.0, 9)
    prompt = torch.tensor(PROMPT)
    with torch.no_grad():
        theirs = from_pretrained(tmp_path / "hf").generate(prompt, attention_mask=torch.ones_like(prompt))
    assert bundle.generate(np.array(PROMPT)).tolist() == theirs.tolist()


@pytest.mark.slow
def test_a_repetition_penalty_is_the_bundles_default_and_generates_as_generate_does(tmp_path: Path) -> None:
    """do_sample false and repetition_penalty 1.5: the bundle's greedy generation without options
    (onnxruntime, a batch of a padded row too), `tfcompile generate` and export-hf's folder give
    transformers' generate() without options, which the penalty changes."""
    hf = saved(tmp_path / "hf", None, do_sample=False, max_new_tokens=12, repetition_penalty=1.5)
    result = import_folder(tmp_path / "hf", "penalised", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.type == "causal_lm" and result.spec.task.repetition_penalty == 1.5
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert bundle.generation.repetition_penalty == 1.5
    prompt = torch.tensor(PROMPT)
    with torch.no_grad():
        theirs = from_pretrained(tmp_path / "hf").generate(prompt, attention_mask=torch.ones_like(prompt))
    assert theirs[0].tolist() != PROMPT[0] + greedy(hf, 12)
    assert bundle.generate(np.array(PROMPT)).tolist() == theirs.tolist()  # it runs past the eos too
    padded = bundle.generate(
        np.array([[0, 0, *PROMPT[0]], [3, 4, *PROMPT[0]]]),
        attention_mask=np.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7]),
    )
    assert padded[0, 2:].tolist() == theirs[0].tolist()
    export_hf(result.run_dir, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["repetition_penalty"] == 1.5
    with torch.no_grad():
        again = from_pretrained(tmp_path / "out").generate(prompt, attention_mask=torch.ones_like(prompt))
    assert again[0].tolist() == theirs[0].tolist()  # its eos_token_id written back: null


BANS = {
    "no_repeat_ngram_size": 2,
    "suppress_tokens": [49],
    "bad_words_ids": [[53], [2, 30, 36], [36, 61]],  # the second's first two tokens end the prompt
    "min_new_tokens": 6,
}


@pytest.mark.slow
def test_bans_are_the_bundles_and_generate_as_generate_does(tmp_path: Path) -> None:
    """no_repeat_ngram_size, suppress_tokens, bad_words_ids of one token and of several (suppressed
    tokens and banned sequences) and min_new_tokens, each of which changes what generate() chooses
    here: the bundle's greedy generation without options (onnxruntime, a padded row too) and
    export-hf's folder give transformers' generate()."""
    hf = saved(tmp_path / "hf", 0, do_sample=False, max_new_tokens=16, **BANS)
    result = import_folder(tmp_path / "hf", "banned", tmp_path / "specs", tmp_path / "runs")
    task = result.spec.task
    assert (task.no_repeat_ngram_size, task.min_new_tokens, len(task.suppressed_tokens)) == (2, 6, 2)
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert bundle.generation.suppressed_ids == [49, 53]
    assert bundle.generation.banned_sequences == [[2, 30, 36], [36, 61]]
    prompt = torch.tensor(PROMPT)
    with torch.no_grad():
        theirs = from_pretrained(tmp_path / "hf").generate(prompt, attention_mask=torch.ones_like(prompt))
    for name in BANS:  # each ban on its own changes the tokens
        others = {k: v for k, v in BANS.items() if k != name}
        assert PROMPT[0] + greedy(hf, 16, **others) != theirs[0].tolist(), name
    for word in BANS["bad_words_ids"]:
        others = BANS | {"bad_words_ids": [w for w in BANS["bad_words_ids"] if w != word]}
        assert PROMPT[0] + greedy(hf, 16, **others) != theirs[0].tolist(), word
    assert bundle.generate(np.array(PROMPT)).tolist() == theirs.tolist()
    padded = bundle.generate(
        np.array([[0, 0, *PROMPT[0]], [3, 4, *PROMPT[0]]]),
        attention_mask=np.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7]),
    )
    assert padded[0, 2 : 2 + theirs.shape[1]].tolist() == theirs[0].tolist()
    export_hf(result.run_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    names = ("no_repeat_ngram_size", "min_new_tokens", "suppress_tokens", "bad_words_ids")
    assert {k: written[k] for k in names} == {
        "no_repeat_ngram_size": 2,
        "min_new_tokens": 6,
        "suppress_tokens": [49, 53],
        "bad_words_ids": [[2, 30, 36], [36, 61]],
    }
    with torch.no_grad():
        again = from_pretrained(tmp_path / "out").generate(prompt, attention_mask=torch.ones_like(prompt))
    assert again.tolist() == theirs.tolist()


@pytest.mark.slow
def test_min_length_counts_the_prompt_as_generate_does(tmp_path: Path) -> None:
    """A language model's min_length counts the prompt's tokens: with the model's likeliest token
    (36) made a stop token, generate() ends at once, and under min_length goes on until the text
    is that long. It is task.min_length; the bundle's greedy generation without options, and
    export-hf's folder, give generate()'s tokens."""
    least = len(PROMPT[0]) + 4
    hf = saved(tmp_path / "hf", [0, 36], do_sample=False, max_new_tokens=16, min_length=least)
    result = import_folder(tmp_path / "hf", "held", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.min_length == least
    assert greedy(hf, 16, eos_token_id=[0, 36]) == [36]
    prompt = torch.tensor(PROMPT)
    with torch.no_grad():
        theirs = from_pretrained(tmp_path / "hf").generate(prompt, attention_mask=torch.ones_like(prompt))
    assert theirs.shape[1] > least
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = load(tmp_path / "bundle")
    assert bundle.generation.min_length == least
    assert bundle.generate(np.array(PROMPT)).tolist() == theirs.tolist()
    export_hf(result.run_dir, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["min_length"] == least
    with torch.no_grad():
        again = from_pretrained(tmp_path / "out").generate(prompt, attention_mask=torch.ones_like(prompt))
    assert again.tolist() == theirs.tolist()


def test_generation_settings_a_language_model_does_not_apply_are_warned_of(tmp_path: Path) -> None:
    """Beam search, forced_eos_token_id (which counts the prompt), a sequence bias and stop
    strings: generate() applies them, the bundle's generation (a token a step) does not. Sampling
    settings without do_sample change nothing; bans are applied (min_length is task.min_length,
    and a bad word of several tokens a banned sequence, of the tokens' strings), not warned of."""
    unapplied = dict(forced_eos_token_id=0, sequence_bias=[[[7], 2.0]], stop_strings=["\n\n"])
    saved(tmp_path / "hf", num_beams=4, min_length=3, bad_words_ids=[[7, 8]], temperature=0.3, **unapplied)
    with pytest.warns(HFWarning) as caught:
        task = import_folder(tmp_path / "hf", "beams", tmp_path / "specs", tmp_path / "runs").spec.task
    said = " ".join(str(w.message) for w in caught)
    assert "num_beams 4, forced_eos_token_id 0, sequence_bias [[[7], 2.0]], stop_strings" in said
    assert "bad_words_ids" not in said and "temperature" not in said and "min_length" not in said
    assert task.type == "causal_lm" and task.min_length == 3
    assert task.type == "causal_lm" and len(task.banned_sequences) == 1 and len(task.banned_sequences[0]) == 2


def test_sampling_settings_the_runtime_does_not_apply_are_warned_of_when_sampling(tmp_path: Path) -> None:
    """typical_p, epsilon_cutoff, eta_cutoff and top_h filter generate()'s draws, and the
    runtime's sampling does not: warned of with do_sample; without it generate() is greedy and
    they change nothing."""
    filters = {"typical_p": 0.9, "epsilon_cutoff": 3e-4, "eta_cutoff": 1e-3, "top_h": 0.4}
    saved(tmp_path / "sampled", do_sample=True, **filters)
    with pytest.warns(HFWarning) as caught:
        import_folder(tmp_path / "sampled", "sampled", tmp_path / "specs", tmp_path / "runs")
    said = " ".join(str(w.message) for w in caught)
    assert "typical_p 0.9, epsilon_cutoff 0.0003, eta_cutoff 0.001, top_h 0.4: generate() applies" in said
    assert "tfcompile's sampling does not" in said
    saved(tmp_path / "greedy", **filters)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import_folder(tmp_path / "greedy", "greedy", tmp_path / "specs", tmp_path / "runs")


def test_a_bad_word_that_is_a_stop_token_is_left_out_as_generate_leaves_it(tmp_path: Path) -> None:
    saved(tmp_path / "hf", [0, 5], bad_words_ids=[[5], [0], [7]])
    task = import_folder(tmp_path / "hf", "bad", tmp_path / "specs", tmp_path / "runs").spec.task
    assert task.type == "causal_lm" and len(task.stop_tokens) == 1 and len(task.suppressed_tokens) == 1


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"do_sample": True, "temperature": 0.0}, "temperature"),
        ({"do_sample": True, "temperature": math.nan}, "temperature"),  # was named as config.json's
        ({"do_sample": True, "temperature": math.inf}, "temperature"),
        ({"do_sample": True, "top_p": math.nan}, "top_p"),
        ({"repetition_penalty": math.nan}, "repetition_penalty"),
        ({"do_sample": True, "top_p": 1.5}, "top_p"),
        ({"do_sample": True, "top_k": -1}, "top_k"),
        ({"do_sample": True, "min_p": 1.5}, "min_p"),
        ({"do_sample": True, "min_p": "0.1"}, "min_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": "1.2"}, "repetition_penalty"),
        ({"repetition_penalty": 1e9}, "repetition_penalty"),
        ({"suppress_tokens": [0]}, "suppress_tokens"),  # the eos
        ({"suppress_tokens": [5], "eos_token_id": [0, 5]}, "suppress_tokens"),  # a stop token
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"),
        ({"min_new_tokens": "3"}, "min_new_tokens"),
    ],
)
def test_a_sampling_setting_generate_cannot_take_is_refused_by_field(
    fields: dict[str, Any], named: str, tmp_path: Path
) -> None:
    saved(tmp_path / "hf", **fields)
    with pytest.raises(HFError, match=rf"generation_config\.json: 1 problem:\n  {named}: "):
        import_folder(tmp_path / "hf", "bad", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "bad").exists()
