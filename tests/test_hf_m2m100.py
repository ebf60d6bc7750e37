"""M2M100 (``M2M100ForConditionalGeneration``: M2M100 418M and 1.2B, NLLB-200's dense models):
BART's pre-norm encoder-decoder with a final norm per stack, no embedding norm, embeddings scaled
by sqrt(d_model), and fixed sinusoidal positions of tensor2tensor's frequencies in the halves
layout from the pad id + 1 (``positional: {type: sinusoidal, layout: halves, spacing:
tensor2tensor, offset}``). Tiny random transformers models saved with save_pretrained, imported,
and held to transformers' logits (float32, sources padded on the right and not, tokens other than
the pad id: M2M100 numbers the tokens that are not it), their parameter counts and greedy
translation through the ONNX bundle, written back by export-hf (the offset from the run's pad id);
NLLB's language codes as roles. A row for every field of M2M100Config (tests/test_hf_fields.py's
table and check)."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import (
    LANGUAGES,
    VOCAB,
    Imported,
    copied,
    from_pretrained,
    perturb,
    random_ids,
    right_padding,
    write,
)
from test_hf_bart import TINY as BART_TINY
from test_hf_fields import FAMILIES, Case, Family, _pytest_cases, case, check, uncovered
from test_hf_paths import SENTENCES

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.models import Seq2Seq
from tfcompile.nn.positional import sinusoidal_table
from tfcompile.runtime import InputError, Translator
from tfcompile.sequences import tidy

transformers = pytest.importorskip("transformers")
T = transformers

# test_hf_bart's tiny sizes and "t5" tokenizer (<pad> 0, </s> 1, <unk> 2); the decoder starts with 2,
# M2M100Config's (its </s>), another id than the pad id M2M100Config has where none is named (1)
TINY = BART_TINY | dict(bos_token_id=None, decoder_start_token_id=2)
FAMILIES["m2m_100"] = Family(T.M2M100Config, T.M2M100ForConditionalGeneration, "t5", TINY)


def m2m100(**fields: Any) -> Any:
    return T.M2M100ForConditionalGeneration(T.M2M100Config(**TINY | fields))


VARIANTS: dict[str, Callable[[], Any]] = {
    "m2m100": lambda: m2m100(),  # M2M100Config's ReLU, scaled embeddings, one table for all three
    # another pad id, the tokenizer's <pad> there (PADS)
    "m2m100_pad": lambda: m2m100(pad_token_id=27, activation_function="gelu", scale_embedding=False),
}


# the tokenizer's <pad> placed at the config's pad id (M2M100 skips it), </s> and <unk> where TINY's
# eos and decoder start are
PADS = {"m2m100_pad": 27}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("hf")

    def writer(name: str) -> Callable[[Path], None]:
        def write_to(folder: Path) -> None:
            torch.manual_seed(0)
            placed = {"<pad>": PADS[name], "</s>": 1, "<unk>": 2} if name in PADS else None
            write(perturb(VARIANTS[name]()), "t5", folder, placed)

        return write_to

    return {name: Imported(root, name, writer(name), "error") for name in VARIANTS}


def compare(hf: Any, ours: torch.nn.Module, length: int) -> float:
    """The largest |difference| of the logits over their scale where it is past 1 (as
    test_hf_fields.difference), sources padded on the right and not, on tokens that are not the pad
    id (nor the other special tokens), targets starting with the decoder's start."""
    assert isinstance(ours, Seq2Seq)
    pad = hf.config.pad_token_id
    ids = random_ids(3, length, low=3)
    ids[ids == pad] = 3
    target = random_ids(3, min(7, length), seed=1, low=3)
    target[target == pad] = 3
    target[:, 0] = hf.config.decoder_start_token_id
    worst = 0.0
    with torch.no_grad():
        for mask in (right_padding(3, length), torch.ones(3, length, dtype=torch.long)):
            theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
            gap = (theirs - ours(ids, mask, target)).abs().max() / theirs.abs().max().clamp(min=1)
            worst = max(worst, gap.item())
    return worst


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    assert compare(imported[name].hf, imported[name].model, 20) <= 1e-5


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    """transformers counts no parameter in its fixed tables, nor does the spec."""
    imported[name].assert_counts_match()


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    plain, padded = imported["m2m100"].spec.model, imported["m2m100_pad"].spec.model
    assert plain.positional.model_dump() == {
        "type": "sinusoidal",
        "layout": "halves",
        "spacing": "tensor2tensor",
        "offset": 1,
    }
    assert padded.positional.model_dump()["offset"] == 28
    assert (plain.norm.position, plain.norm.final, plain.embedding_norm, plain.scale_embeddings) == (
        "pre",
        True,
        False,
        True,
    )
    assert (plain.activation, plain.bias.lm_head, plain.share_embeddings, plain.tie_embeddings) == (
        "relu",
        False,
        True,
        True,
    )
    assert (padded.activation, padded.scale_embeddings) == ("gelu", False)


def test_the_table_is_m2m100s_formula() -> None:
    """tensor2tensor's frequencies, 10000^(-k/(d/2 - 1)), from the offset: M2M100's own table's rows."""
    ours = sinusoidal_table(10, 16, "halves", "tensor2tensor", offset=3)
    theirs = T.models.m2m_100.modeling_m2m_100.M2M100SinusoidalPositionalEmbedding.get_embedding(13, 16)
    torch.testing.assert_close(ours, theirs[3:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """The positions' offset is the run's pad id + 1, which config.json's pad_token_id says; no
    final_logits_bias, no position table saved (M2M100 computes its own)."""
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == "M2M100ForConditionalGeneration"
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    assert compare(reloaded, variant.model, 20) <= 1e-5
    assert reloaded.config.pad_token_id == PADS.get(name, 0)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


def test_export_hf_refuses_an_offset_that_is_not_the_runs_pad_id_plus_one(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """M2M100 numbers positions from its pad id + 1: a run whose offset is another (edited here,
    or a spec of tfcompile's own without a tokenizer) has no M2M100 config; nor one whose pad id is
    also its decoder's start, which M2M100 would give no position."""
    run = tmp_path / "run"
    shutil.copytree(imported["m2m100"].result.run_dir, run)
    (run / "spec.yaml").write_text((run / "spec.yaml").read_text().replace("offset: 1", "offset: 5"))
    with pytest.raises(
        HFError, match=r"  model\.positional\.offset: is 5: M2M100 numbers positions from the pad id \+ 1"
    ):
        export_hf(run, tmp_path / "out")
    spec = (run / "spec.yaml").read_text().replace("offset: 5", "offset: 1")
    (run / "spec.yaml").write_text(spec.replace("bos: <unk>", "bos: <pad>"))
    with pytest.raises(HFError, match=r"  tokens\.pad: is also the run's bos token \(0\)"):
        export_hf(run, tmp_path / "out")
    native = random_run(
        tmp_path / "native",
        f"model: {{family: encoder_decoder, vocab_size: {VOCAB}, d_model: 16, n_layers: 1, n_heads: 2, "
        "max_seq_len: 16, positional: {type: sinusoidal, layout: halves, spacing: tensor2tensor, offset: 2}, "
        "norm: {position: pre}}\ntask: seq2seq\n",
    )
    with pytest.raises(
        HFError, match=r"  tokens\.pad: is none: M2M100 numbers positions from its pad id \+ 1"
    ):
        export_hf(native, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_decoder_start_that_is_the_pad_id_is_refused_where_generation_config_says_it(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """generate() starts with generation_config.json's decoder_start_token_id, over config.json's: as
    the pad id, M2M100 gives it no position."""
    folder = copied(imported, "m2m100", tmp_path)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | {"decoder_start_token_id": 0}))
    with pytest.raises(HFError, match="  pad_token_id: is 0, the tokenizer's bos token"):
        import_folder(folder, "start", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "start").exists()


@pytest.mark.slow
def test_the_bundle_translates_as_transformers_greedy_generate(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """`tfcompile export` (parity checked), then greedy translation in onnxruntime of sources the
    folder's tokenizer ends with </s>, as transformers' generate translates them (the positions from
    the offset in both stacks, the KV cache's steps too); the variant whose random weights translate
    each source otherwise."""
    variant = imported["m2m100_pad"]
    assert main(["export", str(variant.result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    tokenizer = T.AutoTokenizer.from_pretrained(variant.folder)
    ours = Translator(tmp_path / "bundle").translate(SENTENCES, beam=1, max_len=10)
    theirs = []
    for sentence in SENTENCES:
        ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
        generated = variant.hf.generate(ids, do_sample=False, num_beams=1, max_new_tokens=10)
        theirs.append(tidy(tokenizer.decode(generated[0], skip_special_tokens=True)))
    assert ours == theirs and len(set(ours)) > 1


# ------------------------------------------------------------------ language codes (NLLB's)


def nllb(folder: Path, forced: str | None = "fra_Latn", **generation: Any) -> T.PreTrainedTokenizerFast:
    """A tiny M2M100 saved with the "nllb" tokenizer (sources eng_Latn ... </s>), its
    generation_config.json forcing ``forced`` after the decoder's start (NLLB's target language)."""
    torch.manual_seed(1)  # weights whose translations tell the sources and the target codes apart
    write(perturb(m2m100(activation_function="gelu", scale_embedding=False)), "nllb", folder)
    codes = T.AutoTokenizer.from_pretrained(folder)
    path = folder / "generation_config.json"
    saved = json.loads(path.read_text())
    if forced is not None:
        saved["forced_bos_token_id"] = codes.convert_tokens_to_ids(forced)
    path.write_text(json.dumps(saved | generation))
    return codes


def test_an_nllb_imports_its_language_codes_as_roles(tmp_path: Path) -> None:
    """The code the tokenizer puts before a text is the source's language, the one generate()
    forces after the decoder's start the target's, which every translation starts with."""
    nllb(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "nllb", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.tokens is not None and result.spec.task.type == "seq2seq"
    assert (result.spec.tokens.source_language, result.spec.tokens.target_language) == (
        "eng_Latn",
        "fra_Latn",
    )
    task = result.spec.task
    assert (task.source_prefix, task.source_suffix, task.target_prefix) == (
        ["source_language"],
        ["eos"],
        ["target_language"],
    )


@pytest.mark.slow
def test_an_nllb_bundle_translates_into_the_forced_language_as_transformers_does(tmp_path: Path) -> None:
    """Greedy and into two target languages: the bundle's translations are transformers' generate()
    with forced_bos_token_id (the code read, not chosen; max_new_tokens counting it), and a spec
    whose tokens.target_language is another code translates into that one, as generate() forcing it."""
    tokenizer = nllb(tmp_path / "hf")
    hf = T.M2M100ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    result = import_folder(tmp_path / "hf", "nllb", tmp_path / "specs", tmp_path / "runs")
    german = tmp_path / "specs" / "german.yaml"
    german.write_text(
        result.spec_path.read_text().replace("target_language: fra_Latn", "target_language: deu_Latn")
    )
    runs = {"fra_Latn": result.run_dir}
    spec_text = result.run_dir / "spec.yaml"
    runs["deu_Latn"] = tmp_path / "runs" / "german"
    shutil.copytree(result.run_dir, runs["deu_Latn"])
    (runs["deu_Latn"] / "spec.yaml").write_text(spec_text.read_text().replace("fra_Latn", "deu_Latn"))
    seen = []
    for code, run in runs.items():
        assert main(["export", str(run), "--out", str(tmp_path / code)]) == 0
        ours = Translator(tmp_path / code).translate(SENTENCES, beam=1, max_len=10)
        theirs = []
        for sentence in SENTENCES:
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
            assert ids[0, 0] == tokenizer.convert_tokens_to_ids("eng_Latn")
            forced = tokenizer.convert_tokens_to_ids(code)
            generated = hf.generate(
                ids, do_sample=False, num_beams=1, max_new_tokens=10, forced_bos_token_id=forced
            )
            assert generated[0, 1] == forced
            theirs.append(tidy(tokenizer.decode(generated[0], skip_special_tokens=True)))
        assert ours == theirs and len(set(ours)) > 1
        seen.append(ours)
    assert seen[0] != seen[1]
    # Another code asked of the French bundle: its German translations, the spec's own for German;
    # a German source's code in place of eng_Latn, as transformers' tokenizer would put it.
    french = Translator(tmp_path / "fra_Latn")
    assert french.translate(SENTENCES, beam=1, max_len=10, target_language="deu_Latn") == seen[1]
    codes = tokenizer.convert_tokens_to_ids(["deu_Latn", "fra_Latn"])
    theirs = []
    for sentence in SENTENCES:
        ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
        ids[0, 0] = codes[0]
        generated = hf.generate(
            ids, do_sample=False, num_beams=1, max_new_tokens=10, forced_bos_token_id=codes[1]
        )
        theirs.append(tidy(tokenizer.decode(generated[0], skip_special_tokens=True)))
    assert french.translate(SENTENCES, beam=1, max_len=10, source_language="deu_Latn") == theirs != seen[0]
    served(tmp_path / "fra_Latn", seen[1])


def served(bundle: Path, german: list[str]) -> None:
    """`tfcompile serve`'s /v1/translate and `tfcompile translate` take the codes too."""
    import httpx
    from serving import BackgroundServer

    with BackgroundServer({"nllb": bundle}) as server:
        body = {"model": "nllb", "texts": SENTENCES, "beam": 1, "max_len": 10, "target_language": "deu_Latn"}
        answer = httpx.post(f"{server.url}/v1/translate", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["translations"] == german
        answer = httpx.post(f"{server.url}/v1/translate", json=body | {"target_language": "xx_Latn"})
        assert (
            answer.status_code == 400 and "'xx_Latn' is no special token" in answer.json()["error"]["message"]
        )


@pytest.mark.slow  # an import and an export of its own: 8 s
def test_a_translators_codes_are_asked_by_string_and_refused_where_they_cannot_stand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """translate(source_language=, target_language=): a special token of the tokenizer, in place of a
    code the bundle places; `tfcompile translate --target-language` says why it cannot."""
    nllb(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "nllb", tmp_path / "specs", tmp_path / "runs")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = Translator(tmp_path / "bundle")
    prefix, suffix, given = bundle.framing("deu_Latn", "eng_Latn")
    codes = bundle.tokenizer.token_to_id("deu_Latn"), bundle.tokenizer.token_to_id("eng_Latn")
    assert (prefix, suffix, given) == ([codes[0]], [1], [codes[1]])
    for asked, message in [
        ({"target_language": "xx_Latn"}, "target_language: 'xx_Latn' is no special token"),
        (
            {"source_language": "a"},
            "source_language: 'a' is no special token of the bundle's tokenizer (its code is 'eng_Latn')",
        ),
        ({"target_language": 7}, "target_language must be a token string"),
        (
            {"target_language": "</s>"},
            "target_language: '</s>' is the stop token, which ends every translation",
        ),
    ]:
        with pytest.raises(InputError) as error:
            bundle.translate(["a cat"], beam=1, max_len=4, **asked)
        assert message in str(error.value)
    assert main(["translate", str(tmp_path / "bundle"), "a cat", "--target-language", "xx_Latn"]) != 0
    assert "'xx_Latn' is no special token" in capsys.readouterr().err
    assert (
        main(
            [
                "translate",
                str(tmp_path / "bundle"),
                "a cat",
                "--max-len",
                "4",
                "--target-language",
                "deu_Latn",
            ]
        )
        == 0
    )
    assert (
        capsys.readouterr().out.strip()
        == bundle.translate(["a cat"], max_len=4, target_language="deu_Latn")[0]
    )


def test_a_forced_token_the_files_disagree_on_or_the_tokenizer_lacks_is_refused_by_field(
    tmp_path: Path,
) -> None:
    """transformers 4 rebuilds a generation_config.json made from the model's config from config.json
    where that holds generation fields off their defaults (a forced_bos_token_id, mBART-50's
    num_beams), and forces config.json's forced_bos_token_id or none; 5 reads the former alone. An
    id past the tokenizer names no token; the eos ends every translation empty. Each refusal names
    the file the value was read from."""
    code = 3 + LANGUAGES.index("fra_Latn")
    for n, (config, generation, message, named) in enumerate(
        [
            (
                {"forced_bos_token_id": 4},
                {"_from_model_config": True},
                "is 4 in config.json and unset in generation_config",
                "config.json",
            ),
            (
                {"num_beams": 5, "max_length": 200},
                {"_from_model_config": True, "forced_bos_token_id": code},
                f"is None in config.json and {code} in generation_config",
                "config.json",
            ),
            (
                {},
                {"forced_bos_token_id": 10_000},
                "is 10000, no token of the tokenizer's",
                "generation_config.json",
            ),
            ({}, {"forced_bos_token_id": "fra_Latn"}, "is 'fra_Latn', no token id", "generation_config.json"),
            (
                {},
                {"forced_bos_token_id": 1},
                "is 1, its eos ('</s>'), which ends every",
                "generation_config.json",
            ),
        ]
    ):
        folder = tmp_path / str(n)
        nllb(folder, forced=None, **generation)
        saved = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(saved | config))
        with pytest.raises(HFError, match="forced_bos_token_id") as error:
            import_folder(folder, "nllb", tmp_path / "specs", tmp_path / "runs")
        assert message in str(error.value) and str(error.value).startswith(str(folder / named))
    assert not (tmp_path / "runs").exists()


def test_generation_fields_at_their_defaults_leave_generation_config_json_alone(tmp_path: Path) -> None:
    """transformers 4 rebuilds nothing where config.json's generation fields are their defaults."""
    nllb(tmp_path / "hf", _from_model_config=True)
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(saved | {"num_beams": 1, "max_length": 20}))
    result = import_folder(tmp_path / "hf", "nllb", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.type == "seq2seq" and result.spec.task.target_prefix == ["target_language"]


def test_a_template_of_two_codes_the_spec_cannot_place_is_said(tmp_path: Path) -> None:
    """mBART-style "en_XX $A </s> ro_RO": two special tokens of no role; the import warns that it
    frames sources as M2M100 does."""
    from tokenizers import Tokenizer, processors

    nllb(tmp_path / "hf", forced=None)
    path = tmp_path / "hf" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    ids = {t: tokenizer.token_to_id(t) for t in ("eng_Latn", "fra_Latn", "</s>")}
    tokenizer.post_processor = processors.TemplateProcessing(
        single="eng_Latn $A </s> fra_Latn", special_tokens=list(ids.items())
    )
    tokenizer.save(str(path))
    with pytest.warns(
        HFWarning, match="2 special tokens of no role around a text \\('eng_Latn', 'fra_Latn'\\)"
    ):
        result = import_folder(tmp_path / "hf", "two", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.type == "seq2seq" and result.spec.task.source_suffix == ["eos"]


def test_a_forced_token_in_config_json_alone_is_read_where_transformers_4_and_5_both_read_it(
    tmp_path: Path,
) -> None:
    """Without generation_config.json both read config.json's; with one not made from the model's
    config, neither does."""
    for n, drop in enumerate((True, False)):
        folder = tmp_path / str(n)
        nllb(folder, forced=None)
        saved = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(saved | {"forced_bos_token_id": 4}))
        generation = json.loads((folder / "generation_config.json").read_text())
        if drop:
            (folder / "generation_config.json").unlink()
        else:
            generation.pop("_from_model_config", None)
            (folder / "generation_config.json").write_text(json.dumps(generation))
        result = import_folder(folder, f"nllb{n}", tmp_path / "specs", tmp_path / "runs")
        assert result.spec.task.type == "seq2seq"
        assert result.spec.task.target_prefix == (["target_language"] if drop else [])


# ------------------------------------------------------------------ every config field, by value


def row(**fields: Any) -> Case:
    """An M2M100 row, written back by export-hf unless it says otherwise."""
    return case("m2m_100", **fields)


CASES: list[Case] = [
    row(  # the fields that take any value at once: each row below sets one
        activation_function="gelu",
        scale_embedding=False,
        dropout=0.3,
        attention_dropout=0.2,
        activation_dropout=0.4,
        encoder_layerdrop=0.2,
        decoder_layerdrop=0.2,
        init_std=0.02,
        use_cache=False,
        spec={"activation": "gelu", "scale_embeddings": False, "dropout.residual": 0.3},
    ),
    row(activation_function="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    row(outcome="activation_function", activation_function="quick_gelu", slow=True),
    row(scale_embedding=False, spec={"scale_embeddings": False}, slow=True),
    row(dropout=0.5, attention_dropout=0.1, activation_dropout=0.5, slow=True),  # training only
    row(encoder_layerdrop=0.5, decoder_layerdrop=0.5, slow=True),  # training only, not read
    row(init_std=0.0, slow=True),  # initialisation only
    row(encoder_layers=1, decoder_layers=3, spec={"n_layers": 1, "n_decoder_layers": 3}, slow=True),
    row(outcome="decoder_attention_heads", decoder_attention_heads=2, slow=True),
    row(outcome="decoder_ffn_dim", decoder_ffn_dim=48, slow=True),
    row(encoder_attention_heads=2, decoder_attention_heads=2, spec={"n_heads": 2}, slow=True),
    row(max_position_embeddings=16, spec={"max_seq_len": 16}, length=16, slow=True),
    row(d_model=32, spec={"d_model": 32}, slow=True),
    row(vocab_size=VOCAB, slow=True),
    row(  # a table per stack: BART's writer shares one (Marian's alone has two)
        tie_word_embeddings=False,
        spec={"tie_embeddings": False, "share_embeddings": False},
        exported=False,
        slow=True,
    ),
    # the positions: from the pad id + 1, which must be the tokenizer's <pad> (0) and no other role's
    # token (M2M100 gives every occurrence of it no position); the decoder's start must be another
    row(outcome="pad_token_id", pad_token_id=7),  # a letter of the tokenizer's
    row(outcome="pad_token_id", pad_token_id=1, slow=True),  # </s>, which ends every source
    row(outcome="pad_token_id", json={"pad_token_id": None}, slow=True),
    # transformers zeroes the pad id's row of a table of max_position_embeddings + 2: it fails past it
    row(outcome="pad_token_id", json={"pad_token_id": 34}, slow=True),
    row(outcome="decoder_start_token_id", decoder_start_token_id=0, slow=True),
    row(bos_token_id=2, eos_token_id=1, slow=True),
    row(outcome="is_decoder", json={"is_decoder": True}, slow=True),
    row(json={"is_encoder_decoder": False}, slow=True),  # generate() alone reads it
    row(outcome="architectures", json={"architectures": ["M2M100Model"]}, slow=True),
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFWarning)
        check(c, tmp_path, compare=compare)


def test_every_config_field_has_a_case() -> None:
    assert uncovered("m2m_100", CASES) == set()
