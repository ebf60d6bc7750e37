"""Translation data, teacher forcing and greedy decoding."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import ROOT, SHARED_DATA, assert_follows_schema

from tfcompile.cli import main
from tfcompile.data import DataError
from tfcompile.models import Seq2Seq
from tfcompile.runtime import BundleError, InputError, Translator, load
from tfcompile.search import Bans, FairseqBeam
from tfcompile.spec import Spec, load_spec
from tfcompile.tasks.causal_lm import IGNORE_INDEX
from tfcompile.tasks.seq2seq import Translation, read_parallel, translate_tokens
from tfcompile.train import Trainer, TrainResult, load_trained_model, read_metrics

MULTI30K = SHARED_DATA / "multi30k"


def _spec(tmp_path: Path) -> Spec:
    return Spec.model_validate(
        {
            "model": {
                "family": "encoder_decoder",
                "d_model": 32,
                "n_layers": 1,
                "n_heads": 4,
                "d_ff": 64,
                "max_seq_len": 40,
            },
            "data": {
                "path": str(MULTI30K / "val.{lang}.gz"),
                "val_path": str(MULTI30K / "test_2016_flickr.{lang}.gz"),
                "tokenizer": {"type": "bpe", "vocab_size": 500},
            },
            "task": {"type": "seq2seq", "source": "de", "target": "en"},
            "train": {"runs_dir": str(tmp_path)},
        }
    )


def test_parallel_files_and_their_errors(tmp_path: Path) -> None:
    de, en = read_parallel(MULTI30K / "val.{lang}.gz", "de", "en")
    assert len(de) == len(en) == 1014
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    with pytest.raises(DataError, match="2 de lines but 1 en lines"):
        read_parallel(tmp_path / "a.{lang}", "de", "en")
    with pytest.raises(DataError, match="holds \\{lang\\}"):
        read_parallel(tmp_path / "a.de", "de", "en")


def test_a_line_blank_on_one_side_is_warned_of(tmp_path: Path) -> None:
    """A pair with a blank source was left out and one with a blank target taught an empty
    translation, both without a word: the usual sign of two files out of step."""
    from tfcompile.errors import DataWarning

    (tmp_path / "a.de").write_text("eins\n\ndrei\nvier\n\n")
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n\n\n")
    with pytest.warns(DataWarning, match=r"2 lines are blank on one side only \(line 2, 4\)"):
        de, en = read_parallel(tmp_path / "a.{lang}", "de", "en")
    assert len(de) == len(en) == 5  # read as they are; a blank line on both sides is no warning


def test_parallel_lines_end_at_newlines_only(tmp_path: Path) -> None:
    """A form feed or U+2028 inside a sentence (str.splitlines breaks there) kept the line count
    of one side and not the other's: every pair after it fell out of step, silently."""
    (tmp_path / "a.de").write_bytes(b"ein\x0cHund\r\nzwei Katzen\rdrei\n")
    (tmp_path / "a.en").write_bytes("a dog\u2028\nzwei\x85cats\nthree".encode())
    de, en = read_parallel(tmp_path / "a.{lang}", "de", "en")
    assert de == ["ein\x0cHund", "zwei Katzen", "drei"]
    assert en == ["a dog", "zwei\x85cats", "three"]


def test_batches_shift_the_target_and_pad_outside_the_loss(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.data is not None and spec.task.type == "seq2seq"
    objective = Translation(spec, tmp_path)
    batch = objective.batch("train", 16, torch.Generator().manual_seed(0))
    bos, eos, pad = objective.ids["bos"], objective.ids["eos"], objective.ids["pad"]
    assert (batch["input_ids"][:, 0] == bos).all()
    real = batch["targets"] != IGNORE_INDEX
    # The decoder reads the target shifted right by one: its input at t+1 is the target at t.
    assert torch.equal(batch["input_ids"][:, 1:][real[:, 1:]], batch["targets"][:, :-1][real[:, 1:]])
    assert (batch["targets"][real.sum(1) > 0, :].gather(1, real.sum(1, keepdim=True) - 1) == eos).all()
    assert (batch["input_ids"][~real] == pad).all()
    assert torch.equal(batch["source_mask"].bool(), batch["source_ids"] != pad)


def test_a_source_prefix_and_suffix_frame_every_source_and_reach_the_manifest(tmp_path: Path) -> None:
    """task.source_prefix (BART's <s>: its cls) and source_suffix (T5's </s>): a tokenizer trained
    here reserves [CLS] after [EOS]; every source row starts with it and ends with [EOS], cut to
    the context with both; the bundle's manifest names both ids for the runtime and the clients."""
    spec = _spec(tmp_path).replace({"task": {"source_prefix": ["cls"], "source_suffix": ["eos"]}})
    objective = Translation(spec, tmp_path)
    cls, eos = objective.ids["cls"], objective.ids["eos"]
    assert objective.tokenizer.id_to_token(cls) == "[CLS]" and cls == 4
    rows = [source for source, _ in objective.pairs["train"]]
    assert all(row[0] == cls and row[-1] == eos and len(row) <= spec.model.max_seq_len for row in rows)
    assert max(len(row) for row in rows) == spec.model.max_seq_len  # long sources cut with both
    info = Translation.manifest(spec, None, None)["translation"]
    assert (info.source_prefix_ids, info.source_suffix_ids) == ([4], [3])


LANGUAGES = {"pad": "[PAD]", "unk": "[UNK]", "bos": "[BOS]", "eos": "[EOS]"} | {
    "source_language": "<de>",
    "target_language": "<en>",
}


def test_language_codes_frame_every_source_and_start_every_target(tmp_path: Path) -> None:
    """A multilingual translator's codes (NLLB's): tokens: names their strings, which a tokenizer
    trained here reserves after tfcompile's own; every source starts with the source's code,
    every target with [BOS] and then the target's (task.target_prefix), which the decoder reads
    and the loss predicts; the manifest gives both ids."""
    spec = _spec(tmp_path).replace(
        {
            "tokens": LANGUAGES,
            "task": {
                "source_prefix": ["source_language"],
                "source_suffix": ["eos"],
                "target_prefix": ["target_language"],
            },
        }
    )
    objective = Translation(spec, tmp_path)
    source_code, target_code = (
        objective.tokenizer.token_to_id("<de>"),
        objective.tokenizer.token_to_id("<en>"),
    )
    assert (source_code, target_code) == (4, 5)
    assert objective.tokenizer.encode("<en> ein Hund", add_special_tokens=False).ids[0] == target_code
    assert all(source[0] == source_code for source, _ in objective.pairs["train"])
    assert all(target[:2] == [2, target_code] for _, target in objective.pairs["train"])
    assert max(len(target) for _, target in objective.pairs["train"]) == spec.context_length + 1
    batch = objective.batch("train", 8, torch.Generator().manual_seed(0))
    assert (batch["input_ids"][:, :2] == torch.tensor([2, target_code])).all()
    assert (batch["targets"][:, 0] == target_code).all()
    info = Translation.manifest(spec, _tokenizer_info(objective, spec), None)["translation"]
    assert (info.source_prefix_ids, info.target_prefix_ids) == ([4], [5])


def test_a_target_prefix_of_the_eos_is_refused_at_export(tmp_path: Path) -> None:
    """transformers ends a translation at a forced eos: a bundle whose decoder is given it is refused."""
    from tfcompile.errors import ExportError

    spec = _spec(tmp_path).replace(
        {"tokens": LANGUAGES | {"target_language": "[EOS]"}, "task": {"target_prefix": ["target_language"]}}
    )
    objective = Translation(spec, tmp_path)
    with pytest.raises(ExportError, match="target_prefix's target_language is the eos token"):
        Translation.manifest(spec, _tokenizer_info(objective, spec), None)


def _tokenizer_info(objective: Translation, spec: Spec) -> object:
    from tfcompile.export.bundle import tokenizer_info

    return tokenizer_info(objective.tokenizer, spec.tokens)


def test_language_codes_without_their_strings_and_a_prefix_past_the_decoding_are_refused_by_field() -> None:
    from tfcompile.spec import SpecError, parse_spec

    model = (
        "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, "
        "max_seq_len: 8}"
    )
    with pytest.raises(SpecError, match=r"task\.target_prefix") as error:
        parse_spec(f"{model}\ntask: {{type: seq2seq, target_prefix: [target_language]}}\n")
    assert "names target_language, a token tfcompile has no string of its own for" in str(error.value)
    assert "tokens: {target_language: ...}" in str(error.value)
    with pytest.raises(SpecError, match=r"task\.source_suffix"):
        parse_spec(
            f"{model}\ntokens: {{target_language: x}}\n"
            "task: {type: seq2seq, source_suffix: [source_language]}\n"
        )
    with pytest.raises(SpecError, match=r"task\.target_prefix") as error:
        parse_spec(f"{model}\ntask: {{type: seq2seq, max_decode_len: 2, target_prefix: [cls, cls]}}\n")
    assert "leaves none of the 2 the decoder adds after bos" in str(error.value)
    parse_spec(f"{model}\ntask: {{type: seq2seq, max_decode_len: 3, target_prefix: [cls, cls]}}\n")
    with pytest.raises(SpecError, match=r"train\.context_length"):  # [BOS], the prefix and a token
        parse_spec(
            f"{model}\ntrain: {{context_length: 3}}\ntask: {{type: seq2seq, target_prefix: [cls, cls]}}\n"
        )


def test_greedy_decoding_with_the_cache_equals_rerunning_the_decoder(tmp_path: Path) -> None:
    spec = _spec(tmp_path).replace({"model": {"vocab_size": 500}})
    torch.manual_seed(0)
    model = Seq2Seq(spec.model).eval()
    source = torch.randint(4, 500, (3, 9))
    mask = torch.ones_like(source)
    mask[1, 6:] = 0
    ours = translate_tokens(model, source, mask, [2], 3, max_len=12)
    for row in range(3):
        tokens = [2]
        while len(tokens) <= 12:
            with torch.no_grad():
                logits = model(source[row : row + 1], mask[row : row + 1], torch.tensor([tokens]))
            next_id = int(logits[0, -1].argmax())
            if next_id == 3 or len(tokens) > 12:
                break
            tokens.append(next_id)
        assert ours[row] == tokens[1:13]


def test_beam_of_one_is_greedy_and_wider_beams_score_at_least_as_well(tmp_path: Path) -> None:
    spec = _spec(tmp_path).replace({"model": {"vocab_size": 60}})
    torch.manual_seed(1)
    model = Seq2Seq(spec.model).eval()
    source = torch.randint(4, 60, (4, 7))
    mask = torch.ones_like(source)
    mask[2, 4:] = 0
    greedy = translate_tokens(model, source, mask, [2], 3, max_len=10)
    assert translate_tokens(model, source, mask, [2], 3, max_len=10, beam=1) == greedy
    wide = translate_tokens(model, source, mask, [2], 3, max_len=10, beam=5, scoring=FairseqBeam(0.0))
    for row in range(4):
        src = source[row : row + 1, mask[row].bool()]

        def log_p(tokens: list[int], src: torch.Tensor = src) -> float:
            full = torch.tensor([[2, *tokens]])
            with torch.no_grad():
                lp = model(src, None, full).log_softmax(-1)[0]
            total = sum(lp[i, t].item() for i, t in enumerate(tokens))
            return total + (lp[len(tokens), 3].item() if len(tokens) < 10 else 0.0)

        # Here beam search without a length penalty finds translations at least as likely as
        # greedy decoding's; not a law of beam search, but a search that did worse would be broken.
        assert log_p(wide[row]) >= log_p(greedy[row]) - 1e-4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainResult]:
    """A tiny translator trained for 300 CPU steps, scored on 100 sentences of test 2016."""
    tmp_path = tmp_path_factory.mktemp("translator")
    for lang in ("de", "en"):
        lines = read_parallel(MULTI30K / "test_2016_flickr.{lang}.gz", "de", "en")[lang == "en"][:100]
        (tmp_path / f"test.{lang}").write_text("\n".join(lines) + "\n")
    overrides = [
        "model.d_model=64",
        "model.d_ff=256",
        "model.n_layers=2",
        "model.n_decoder_layers=2",
        "model.dropout.residual=0",
        "data.tokenizer.vocab_size=1000",
        f"data.test_path={tmp_path}/test.{{lang}}",
        "task.beam=1",
        "train.steps=300",
        "train.eval_interval=300",
        "train.batch_size=64",
        "train.optimizer.lr=3e-3",
        "train.schedule={type: cosine, warmup_steps: 30}",
        f"train.runs_dir={tmp_path}",
    ]
    spec = load_spec(ROOT / "specs" / "multi30k-de-en.yaml", overrides)
    return tmp_path / "run", Trainer(spec, tmp_path / "run", show_progress=False).train()


@pytest.mark.slow  # a learning run: 300 steps and BLEU
def test_a_tiny_translator_learns_and_is_scored_with_bleu(trained: tuple[Path, TrainResult]) -> None:
    run, result = trained
    assert result.metrics["val_loss"] < 0.6 * math.log(1000)
    # An untrained model scores about 0.01 (sacrebleu smooths empty n-gram counts); 300 steps, ~3.
    assert result.metrics["test_bleu"] > 1.0
    assert read_metrics(run)[-1] == {"step": 300, "test_bleu": result.metrics["test_bleu"]}


def test_the_bundle_translates_exactly_as_pytorch_does(translator_bundle: Path) -> None:
    """The shared translator (tests/conftest.py: one step, wide weights) against its run."""
    bundle, run = translator_bundle, translator_bundle.parent / "run"
    parity = json.loads((bundle / "manifest.json").read_text())["parity"]
    assert set(parity) == {"encoder", "step"}
    assert all(r["passed"] and r["max_abs_diff"] < 1e-5 for r in parity.values()), parity
    assert_follows_schema(bundle)
    translator = load(bundle, providers=["CPUExecutionProvider"])
    assert isinstance(translator, Translator)
    spec, model = load_trained_model(run)
    assert isinstance(model, Seq2Seq) and spec.task.type == "seq2seq"
    tokenizer = translator.tokenizer
    assert tokenizer is not None
    # The shared translator's context is 48 tokens: the first 12 test sentences that fit in it.
    every = read_parallel(MULTI30K / "test_2016_flickr.{lang}.gz", "de", "en")[0]
    sources = [s for s in every if len(tokenizer.encode(s, add_special_tokens=False).ids) <= 40][:12]
    encoded = [e.ids for e in tokenizer.encode_batch(sources, add_special_tokens=False)]
    ids = np.zeros((len(encoded), max(map(len, encoded))), dtype=np.int64)
    for row, sentence in enumerate(encoded):
        ids[row, : len(sentence)] = sentence
    mask = (ids != 0).astype(np.int64)
    source, source_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    expected_greedy = translate_tokens(model, source, source_mask, [2], 3, max_len=30)
    assert translator.translate_ids(ids, mask, beam=1, max_len=30) == expected_greedy
    expected_beam = translate_tokens(model, source, source_mask, [2], 3, max_len=30, beam=4)
    assert translator.translate_ids(ids, mask, beam=4, max_len=30) == expected_beam
    texts = translator.translate(sources[:3], beam=1, max_len=30)
    assert texts == [t.strip() for t in tokenizer.decode_batch(expected_greedy[:3])]
    assert main(["translate", str(bundle), sources[0], "--beam", "1", "--max-len", "30"]) == 0
    assert main(["classify", str(bundle), "x"]) == 1  # a bundle of another task
    with pytest.raises(InputError, match="at least one real token"):
        translator.translate_ids(ids[:1], np.zeros_like(ids[:1]))
    # A batch of sources of different lengths translates as each source alone.
    for row in range(4):
        alone = translator.translate_ids(ids[row : row + 1, mask[row] == 1], beam=1, max_len=30)
        assert alone == [expected_greedy[row]]


def test_the_bundle_gives_the_decoder_its_target_prefix_as_pytorch_does(
    translator_bundle: Path, tmp_path: Path
) -> None:
    """translation.target_prefix_ids (NLLB's target language, transformers' forced_bos_token_id):
    the decoder reads [BOS] and them, unscored, before it chooses; greedy and beam search give
    pytorch's tokens after them, within max_len tokens after [BOS], the prefix's included."""

    run, bundle = translator_bundle.parent / "run", tmp_path / "prefixed"
    shutil.copytree(translator_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["translation"]["target_prefix_ids"] = [7, 9]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    translator, plain = load(bundle), load(translator_bundle)
    assert isinstance(translator, Translator) and isinstance(plain, Translator)
    _, model = load_trained_model(run)
    assert isinstance(model, Seq2Seq)
    ids = np.array([[11, 12, 13, 14], [21, 22, 0, 0]])
    mask = (ids != 0).astype(np.int64)
    source, source_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    for beam in (1, 3):
        expected = translate_tokens(model, source, source_mask, [2, 7, 9], 3, max_len=20, beam=beam)
        assert translator.translate_ids(ids, mask, beam=beam, max_len=20) == expected
        assert expected != plain.translate_ids(ids, mask, beam=beam, max_len=20)
        assert all(len(row) <= 18 for row in expected)
    limited = translator.translate_ids(ids, mask, beam=1, max_len=4)
    assert all(len(row) <= 2 for row in limited) and limited != [[], []]
    with pytest.raises(InputError, match="max_len must exceed the 2 tokens"):
        translator.translate_ids(ids, mask, max_len=2)
    with pytest.raises(InputError, match="holds the stop token"):  # transformers would end there, empty
        translator.translate_ids(ids, mask, target_prefix_ids=[7, 3])
    assert translator.translate_ids(ids, mask, target_prefix_ids=[]) == plain.translate_ids(ids, mask)
    translator.warm_up()  # reads the prefix and chooses a token
    manifest["translation"]["target_prefix_ids"] = [7, manifest["translation"]["stop_id"]]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="target_prefix_ids holds stop_id"):
        load(bundle)
    manifest["translation"]["target_prefix_ids"] = list(range(4, 4 + manifest["model"]["max_seq_len"]))
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="target_prefix_ids hold"):
        load(bundle)


def test_the_tasks_bans_reach_training_and_the_manifest_and_bad_ones_are_named(tmp_path: Path) -> None:
    """task.suppressed_tokens and banned_sequences (strings of the run's tokenizer), min_decode_len
    and no_repeat_ngram_size: test translation bans them, the manifest gives them as ids; a token the
    tokenizer lacks or the eos fails the data (or the export) by name; the spec locates the
    others."""
    from tfcompile.errors import ExportError
    from tfcompile.spec import SpecError, parse_spec

    bans = {"suppressed_tokens": ["[PAD]", "[UNK]"], "min_decode_len": 2, "no_repeat_ngram_size": 3}
    bans |= {"banned_sequences": [["[UNK]", "[UNK]", "[PAD]"]]}
    spec = _spec(tmp_path).replace({"task": bans})
    objective = Translation(spec, tmp_path)
    assert objective.bans == Bans((0, 1), 2, 3, ((1, 1, 0),))
    objective.tokenizer.save(str(tmp_path / "tokenizer.json"))
    info = Translation.manifest(spec, _tokenizer_info(objective, spec), tmp_path)["translation"]
    assert (info.suppressed_ids, info.min_decode_len, info.no_repeat_ngram_size) == ([0, 1], 2, 3)
    assert info.banned_sequences == [[1, 1, 0]]
    spec = _spec(tmp_path).replace({"task": {"banned_sequences": [["[PAD]", "<none>"]]}})
    with pytest.raises(DataError, match=r"task\.banned_sequences: '<none>' is no token"):
        Translation(spec, tmp_path)
    with pytest.raises(ExportError, match="there is no run's tokenizer"):
        Translation.manifest(spec, _tokenizer_info(objective, spec), None)
    for tokens, message in (
        (["[PAD]", "<none>"], "'<none>' is no token"),
        (["[EOS]"], "holds the eos token"),
    ):
        spec = _spec(tmp_path).replace({"task": {"suppressed_tokens": tokens}})
        with pytest.raises(DataError, match=message):
            Translation(spec, tmp_path)
        with pytest.raises(ExportError, match=message):
            Translation.manifest(spec, _tokenizer_info(objective, spec), tmp_path)
    model = (
        "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, "
        "max_seq_len: 8}"
    )
    for task, field in (
        ("max_decode_len: 4, min_decode_len: 5", "min_decode_len"),
        ("no_repeat_ngram_size: 9", "no_repeat_ngram_size"),
        ("no_repeat_ngram_size: -1", "no_repeat_ngram_size"),
        ("suppressed_tokens: [a, b, a]", "suppressed_tokens"),
    ):
        with pytest.raises(SpecError) as error:
            parse_spec(f"{model}\ntask: {{type: seq2seq, {task}}}\n")
        assert [issue.path for issue in error.value.issues] == [f"task.{field}"]
    parse_spec(f"{model}\ntask: {{type: seq2seq, min_decode_len: 7, no_repeat_ngram_size: 8}}\n")


def test_a_callers_scoring_options_are_the_manifests_and_bad_ones_are_named(
    translator_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """translate(length_penalty=, early_stopping=) searches as a bundle whose manifest says them,
    and `tfcompile translate --length-penalty --early-stopping` as translate() does; early_stopping
    is transformers' beam search's alone, and one of another kind is refused."""
    sources = ["Ein Mann schläft.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]

    def scored(name: str, **fields: Any) -> Translator:
        bundle = Path(shutil.copytree(translator_bundle, tmp_path / name))
        manifest = json.loads((bundle / "manifest.json").read_text())
        manifest["translation"] |= {"beam_scoring": "transformers", **fields}
        (bundle / "manifest.json").write_text(json.dumps(manifest))
        model = load(bundle)
        assert isinstance(model, Translator)
        return model

    base = scored("base")
    for stopping, penalty in ((True, 1.0), (False, -0.5), ("never", 2.0)):
        said = scored(f"said-{stopping}-{penalty}", early_stopping=stopping, length_penalty=penalty)
        assert base.translate(
            sources, beam=4, length_penalty=penalty, early_stopping=stopping
        ) == said.translate(sources, beam=4)
    args = ["translate", str(tmp_path / "base"), *sources, "--beam", "4", "--length-penalty", "2"]
    assert main([*args, "--early-stopping", "never"]) == 0
    assert capsys.readouterr().out.splitlines() == base.translate(
        sources, beam=4, length_penalty=2.0, early_stopping="never"
    )
    fairseq = load(translator_bundle)
    assert isinstance(fairseq, Translator)
    assert main(["translate", str(translator_bundle), "a", "--early-stopping", "true"]) == 1
    assert "early_stopping True is transformers' beam search's" in capsys.readouterr().err
    for stopping, message in ((True, "early_stopping True is transformers'"), ("soon", "true, false or")):
        with pytest.raises(InputError, match=message):
            fairseq.translate(sources, beam=2, early_stopping=stopping)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"length_penalty must be in \[0, 10\]"):
        fairseq.translate(sources, length_penalty=-0.5)


def test_the_bundle_bans_what_its_manifest_bans_as_pytorch_does(
    translator_bundle: Path, tmp_path: Path
) -> None:
    """translation.suppressed_ids, min_decode_len and no_repeat_ngram_size: greedy and beam search
    give pytorch's tokens under the same bans, which differ from the plain ones; a manifest that
    bans the stop token, asks for a minimum past the maximum or bans an id past the vocabulary is
    refused."""

    run, bundle = translator_bundle.parent / "run", tmp_path / "banned"
    shutil.copytree(translator_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    ids = np.array([[11, 12, 13, 14], [21, 22, 0, 0]])
    mask = (ids != 0).astype(np.int64)
    plain = load(translator_bundle)
    assert isinstance(plain, Translator)
    common = np.bincount(
        [t for row in plain.translate_ids(ids, mask, beam=1, max_len=20) for t in row]
    ).argmax()
    bans = {"suppressed_ids": [int(common)], "min_decode_len": 5, "no_repeat_ngram_size": 2}
    (bundle / "manifest.json").write_text(
        json.dumps(manifest | {"translation": manifest["translation"] | bans})
    )
    translator = load(bundle)
    assert isinstance(translator, Translator)
    _, model = load_trained_model(run)
    assert isinstance(model, Seq2Seq)
    source, source_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    banned = Bans((int(common),), 5, 2)
    for beam in (1, 3):
        expected = translate_tokens(model, source, source_mask, [2], 3, max_len=20, beam=beam, bans=banned)
        assert translator.translate_ids(ids, mask, beam=beam, max_len=20) == expected
        assert expected != plain.translate_ids(ids, mask, beam=beam, max_len=20)
        assert all(common not in row and len(row) >= 5 for row in expected)
    stop, vocab = manifest["translation"]["stop_id"], manifest["model"]["vocab_size"]
    for change, message in (
        ({"suppressed_ids": [stop]}, "suppressed_ids holds stop_id"),
        ({"min_decode_len": manifest["translation"]["max_decode_len"] + 1}, "is past max_decode_len"),
        ({"suppressed_ids": [vocab]}, "suppressed_ids is"),
    ):
        (bundle / "manifest.json").write_text(
            json.dumps(manifest | {"translation": manifest["translation"] | change})
        )
        with pytest.raises(BundleError, match=message):
            load(bundle)


def test_a_source_prefix_and_suffix_that_fill_the_context_are_refused_by_field() -> None:
    from tfcompile.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match=r"task\.source_prefix") as error:
        parse_spec(
            "model: {family: encoder_decoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, "
            "max_seq_len: 2}\ntask: {type: seq2seq, source_prefix: [cls], source_suffix: [eos]}\n"
        )
    assert "leaves no room for a source in model.max_seq_len (2)" in str(error.value)
