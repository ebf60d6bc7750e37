"""tfcompile.runtime as a library another application embeds: one loaded model called from many
threads, what a loaded model holds and releases, execution providers asked for by name, the
runtime classes built directly, and the types a user's checker sees."""

from __future__ import annotations

import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ROOT

from tfcompile.runtime import (
    Classifier,
    InputError,
    LanguageModel,
    SessionOptions,
    Translator,
    load,
)
from tfcompile.runtime.ort import ort
from tfcompile.search import GREEDY

PROMPTS = ["ROMEO:", "O", "First Citizen:\nBefore we proceed"]
TEXTS: list[Any] = ["a gorgeous , witty movie", ("a premise that runs on and on", "a hypothesis"), ("x", "y")]
SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]


def test_one_model_called_from_eight_threads_gives_the_single_threaded_answers(
    char_bundle: Path, classifier_bundle: Path, translator_bundle: Path
) -> None:
    """Every answer from 8 threads at once equals the one a single thread gets, seeded sampling
    included (a seed gives the same tokens whatever other threads draw). The models are fresh, so
    their first calls (the pair tokenizer set up on the first pair) race too; the references come
    from a second load of each bundle."""
    models = [load(char_bundle), load(classifier_bundle), load(translator_bundle)]
    references = [load(char_bundle), load(classifier_bundle), load(translator_bundle)]

    def calls(lm: Any, classifier: Any, translator: Any) -> list[Any]:
        return [
            lambda: [
                lm.generate_text(p, 12, temperature=1.0, top_k=8, seed=i) for i, p in enumerate(PROMPTS)
            ],
            lambda: lm.generate_text(PROMPTS, 12, temperature=0),
            lambda: lm.generate(np.array([[5, 6, 7]], dtype=np.int32), 12, temperature=0.9, seed=3).tolist(),
            lambda: classifier.classify(TEXTS),
            lambda: translator.translate(SOURCES, max_len=8),
            lambda: translator.translate(SOURCES, beam=3, max_len=8),
        ]

    expected = [call() for call in calls(*references)]
    jobs = calls(*models) * 6
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: job(), jobs))
    assert answers == expected * 6


def test_a_loaded_model_keeps_no_copy_of_its_graphs_and_no_file_open(char_bundle: Path) -> None:
    """onnxruntime keeps the bytes a session was built from for as long as it lives (to rebuild
    it on the CPU should a provider fail): a second copy of every weight, 76 of the 202 MiB a
    loaded shakespeare-char bundle took. The runtime drops it; no bundle file stays open, and a
    dropped model is freed at once (no reference cycle)."""
    open_before = sorted(os.listdir("/proc/self/fd"))
    model = load(char_bundle)
    for name, session in model.sessions.items():
        size = (char_bundle / model.graph(name).file).stat().st_size
        held = [k for k, v in vars(session).items() if isinstance(v, bytes) and len(v) >= size]
        assert held == [], f"the {name} session holds its graph's bytes in {held}"
    links = [
        os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if fd not in open_before
    ]
    assert not [link for link in links if str(char_bundle) in link]
    freed = weakref.ref(model)
    del model, session
    assert freed() is None


def test_a_provider_named_but_not_started_is_an_error_not_a_silent_cpu(
    char_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime-gpu lists the CUDA provider on a machine where it cannot start (no GPU, no CUDA
    libraries) and then runs on the CPU with a warning. A provider the caller named must start;
    the default (CUDA when it starts, else the CPU) may fall back, as documented. Simulated on
    the CPU build by listing CUDA as available."""
    available = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: [*available, "CUDAExecutionProvider"])
    with (
        pytest.warns(UserWarning, match="CUDAExecutionProvider"),
        pytest.raises(
            InputError, match=r"could not start the execution providers \['CUDAExecutionProvider'\]"
        ),
    ):
        load(char_bundle, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        assert load(char_bundle).providers == ["CPUExecutionProvider"]


def test_providers_with_options_are_refused_by_name(char_bundle: Path) -> None:
    with pytest.raises(InputError, match=r"providers must be execution provider names .*got \('CPU"):
        load(char_bundle, [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})])  # type: ignore[list-item]


def test_session_options_reach_every_graph(char_bundle: Path) -> None:
    model = load(char_bundle, options=SessionOptions(threads=2))
    assert {n: s.get_session_options().intra_op_num_threads for n, s in model.sessions.items()} == {
        "model": 2,
        "step": 2,
    }
    for threads in (-1, 1.5, True, 1 << 20):
        with pytest.raises(InputError, match="threads must be"):
            SessionOptions(threads=threads)  # type: ignore[arg-type]


def test_a_runtime_class_given_another_tasks_bundle_says_which_class_serves_it(
    char_bundle: Path, classifier_bundle: Path, translator_bundle: Path
) -> None:
    """Built directly (the typed way to load), a class refuses a bundle of another task by naming
    both, not by blaming the manifest for lacking the other task's sections."""
    with pytest.raises(InputError, match=r"holds a classification model; LanguageModel serves causal_lm"):
        LanguageModel(classifier_bundle)
    with pytest.raises(InputError, match=r"holds a causal_lm model; Classifier serves classification"):
        Classifier(char_bundle)
    with pytest.raises(InputError, match=r"holds a causal_lm model; Translator serves seq2seq"):
        Translator(char_bundle)
    assert isinstance(LanguageModel(char_bundle), LanguageModel)


def test_an_exception_in_on_step_leaves_the_model_usable(char_bundle: Path) -> None:
    model = load(char_bundle)
    assert isinstance(model, LanguageModel)
    prompts = [e.ids for e in model.encode(PROMPTS)]
    before = model.generate_prompts(prompts, [6] * 3, [GREEDY] * 3)

    def interrupt(tokens: dict[int, int]) -> list[int]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model.generate_prompts(prompts, [6] * 3, [GREEDY] * 3, on_step=interrupt)
    assert model.generate_prompts(prompts, [6] * 3, [GREEDY] * 3) == before


@pytest.mark.slow  # mypy over the package: 7 s
def test_a_user_script_type_checks_under_mypy_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented calls, checked as an application's checker sees them: generate_text gives a
    str for a str and a list for a list (overloads), the classes built directly are typed."""
    from mypy import api

    script = tmp_path / "app.py"
    script.write_text(
        "from tfcompile.runtime import Classifier, LanguageModel, Prediction, SessionOptions\n"
        "model = LanguageModel('exported/quickstart', options=SessionOptions(threads=1))\n"
        "text: str = model.generate_text('ROMEO:', 100, temperature=0.8, top_k=40, seed=1)\n"
        "texts: list[str] = model.generate_text(['ROMEO:', 'JULIET:'], 100, temperature=0)\n"
        "predictions: list[Prediction] = Classifier('exported/sst2').classify(['a', ('b', 'c')])\n"
        "label: str = predictions[0].label\n"
    )
    (tmp_path / "mypy.ini").write_text("[mypy]\n")  # the user's settings, not this project's
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    options = ["--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache")]
    out, err, status = api.run([*options, "--strict", "--follow-imports=silent", str(script)])
    assert status == 0, out + err


def test_a_registered_subclass_of_a_built_in_runtime_serves_its_own_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It inherited its parent's TASK, so every bundle of its own task was refused at load."""
    import tfcompile.runtime as runtime

    monkeypatch.setattr(runtime, "RUNTIMES", dict(runtime.RUNTIMES))

    @runtime.register_runtime("my_tagging")
    class Tagger(runtime.Classifier):
        pass

    assert Tagger.TASK == "my_tagging" and runtime.Classifier.TASK == "classification"
