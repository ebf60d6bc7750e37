"""BART's encoder-decoder and the model types on its code (tfcompile/hf/bart.py): Marian
(``MarianMTModel``, the Opus-MT translators: sinusoidal positions in the halves layout,
post-norm), Pegasus (the same positions, pre-norm with a final norm per stack), BART (learned
positions after two unused rows, post-norm, a norm after the embeddings) and mBART (BART's
positions and embedding norms, pre-norm). Tiny random transformers models saved with
save_pretrained, imported, and held to transformers' logits (float32, sources padded on the
right and not), their parameter counts and greedy translation through the ONNX bundle; written
back by export-hf (tfcompile's own translators of these choices too, or refused by field); a row
for every field of the four config classes (tests/test_hf_fields.py's table and check)."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import random_run
from hf_models import VOCAB, Imported, copied, edited, from_pretrained, imported_variants, max_difference
from safetensors.torch import load_file, save_file
from test_hf_export import _loads_alike
from test_hf_fields import FAMILIES, Case, Family, _pytest_cases, case, check, uncovered
from test_hf_paths import SENTENCES

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.runtime import Translator
from tfcompile.sequences import tidy
from tfcompile.spec.schema import SinusoidalPositional
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers

# hf_models' "t5" tokenizer: <pad> 0, </s> 1, <unk> 2, sources ending with </s>
TINY = dict(
    vocab_size=VOCAB,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
    forced_eos_token_id=None,
    init_std=0.5,  # weights wide enough that each source translates otherwise
)
CLASSES = {
    "marian": (T.MarianConfig, T.MarianMTModel),
    "pegasus": (T.PegasusConfig, T.PegasusForConditionalGeneration),
    "bart": (T.BartConfig, T.BartForConditionalGeneration),
    "mbart": (T.MBartConfig, T.MBartForConditionalGeneration),
}
FAMILIES.update({name: Family(config, model, "t5", TINY) for name, (config, model) in CLASSES.items()})


def built(model_type: str, **fields: Any) -> Any:
    """A tiny model of ``model_type`` with a final_logits_bias of its own (as converted Marian
    models have)."""
    config, head = CLASSES[model_type]
    model = head(config(**TINY | fields))
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.1)
    return model


VARIANTS: dict[str, Callable[[], Any]] = {
    # Opus-MT's shape: swish, embeddings scaled, one table for source, target and head
    "marian": lambda: built("marian", activation_function="swish", scale_embedding=True),
    # a table per stack (the head tied to the decoder's), one decoder layer, gelu_new
    "marian_unshared": lambda: built(
        "marian",
        share_encoder_decoder_embeddings=False,
        decoder_layers=1,
        activation_function="gelu_new",
        scale_embedding=True,
    ),
    # pegasus-xsum's ReLU and scale
    "pegasus": lambda: built("pegasus", activation_function="relu", scale_embedding=True),
    # BART's decoder starts with </s>
    "bart": lambda: built("bart", decoder_start_token_id=1),
    "mbart": lambda: built("mbart", encoder_layers=1, scale_embedding=True),
}
HEADS = {
    "marian": "MarianMTModel",
    "marian_unshared": "MarianMTModel",
    "pegasus": "PegasusForConditionalGeneration",
    "bart": "BartForConditionalGeneration",
    "mbart": "MBartForConditionalGeneration",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    return imported_variants(tmp_path_factory.mktemp("hf"), VARIANTS, tokenizer="t5")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_imported_model_gives_transformers_logits(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_outputs_match()


def unread(hf: Any) -> int:
    """transformers' parameters the import leaves out, less the one it adds: Marian's and Pegasus's
    fixed position tables (parameters transformers never trains) or BART's two unused position rows,
    in each stack, and a shared table neither stack reads (tie_word_embeddings false); the
    final_logits_bias, a buffer there, is the spec's LM head bias."""
    config = hf.config
    rows = 2 if config.model_type in ("bart", "mbart") else config.max_position_embeddings
    unused = hasattr(hf.model, "shared") and not config.tie_word_embeddings
    return (2 * rows + config.vocab_size * unused) * config.d_model - config.vocab_size


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_counts_equal_transformers(imported: dict[str, Imported], name: str) -> None:
    imported[name].assert_counts_match(unread(imported[name].hf))


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    def said(name: str) -> tuple[Any, ...]:
        model = imported[name].spec.model
        positional = model.positional
        layout = positional.layout if isinstance(positional, SinusoidalPositional) else None
        return (
            positional.type,
            layout,
            model.norm.position,
            model.norm.final,
            model.embedding_norm,
            model.scale_embeddings,
            model.share_embeddings,
            model.tie_embeddings,
            model.activation,
        )

    assert said("marian") == ("sinusoidal", "halves", "post", False, False, True, True, True, "silu")
    assert said("marian_unshared") == (
        "sinusoidal",
        "halves",
        "post",
        False,
        False,
        True,
        False,
        True,
        "gelu_tanh",
    )
    assert said("pegasus") == ("sinusoidal", "halves", "pre", True, False, True, True, True, "relu")
    assert said("bart") == ("learned", None, "post", False, True, False, True, True, "gelu")
    assert said("mbart") == ("learned", None, "pre", True, True, True, True, True, "gelu")
    for variant in imported.values():
        model = variant.spec.model
        assert (model.norm.eps, model.bias.lm_head, model.bias.qkv) == (1e-5, True, True)
        assert variant.spec.task.source_suffix == ["eos"]
    assert imported["marian_unshared"].spec.model.n_decoder_layers == 1


def test_a_translators_bos_is_the_token_its_decoder_starts_with(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """Marian's decoder starts with <pad>, BART's with </s>: decoder_start_token_id, over a bos_token
    the tokenizer names (BART's is <s>, which its decoder never starts with)."""
    assert imported["marian"].spec.tokens is not None and imported["marian"].spec.tokens.bos == "<pad>"
    assert imported["bart"].spec.tokens is not None and imported["bart"].spec.tokens.bos == "</s>"
    folder = copied(imported, "bart", tmp_path)
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(saved | {"bos_token": "a"}))
    result = import_folder(folder, "named", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.tokens is not None and result.spec.tokens.bos == "</s>"


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_tables_of_their_own_are_computed_as_transformers_5_computes_them(
    model_type: str, tmp_path: Path
) -> None:
    """tie_word_embeddings false: transformers 5 ties no table to another, so each stack reads its
    own and the head is its own (the shared table of three of the types is read by nothing);
    transformers 4 reads the shared one in both stacks, which the import warns of. export-hf
    writes such a model as Marian only, which has a table per stack in both versions."""
    from hf_models import perturb, write

    torch.manual_seed(0)
    model = perturb(built(model_type, tie_word_embeddings=False))
    write(model, "t5", tmp_path / "hf")
    hf = from_pretrained(tmp_path / "hf")
    with pytest.warns(HFWarning, match="transformers 4 with the shared table"):
        result = import_folder(tmp_path / "hf", "own", tmp_path / "specs", tmp_path / "runs")
    spec, ours = load_trained_model(result.run_dir)
    assert (spec.model.share_embeddings, spec.model.tie_embeddings) == (False, False)
    for padded in (False, True):
        assert max_difference(hf, ours, padded) <= 1e-5
    assert spec.parameter_count() == hf.num_parameters() - unread(hf)
    if model_type == "marian":
        assert export_hf(result.run_dir, tmp_path / "out") == "MarianMTModel"
        _loads_alike(tmp_path / "out", ours)
    else:
        with pytest.raises(HFError, match=r"  model.share_embeddings: False has no"):
            export_hf(result.run_dir, tmp_path / "out")


def test_tie_word_embeddings_false_without_a_table_is_refused(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    """A tied checkpoint saves one table; read untied, transformers 5 draws the others at random."""
    folder = edited(imported, "bart", tmp_path, tie_word_embeddings=False)
    with pytest.raises(HFError, match=r"  tie_word_embeddings: is false and the checkpoint holds no encoder"):
        import_folder(folder, "untied", tmp_path / "specs", tmp_path / "runs")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_hf_writes_each_import_back_to_the_same_logits(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    variant = imported[name]
    assert export_hf(variant.result.run_dir, tmp_path / "out") == HEADS[name]
    _loads_alike(tmp_path / "out", variant.model)
    again = import_folder(tmp_path / "out", "again", tmp_path / "specs", tmp_path / "runs")
    assert again.spec.model == variant.spec.model


TRANSLATOR = (
    f"model: {{family: encoder_decoder, vocab_size: {VOCAB}, d_model: 16, n_layers: 2, n_heads: 4, "
    "max_seq_len: 16"
)
# tfcompile's own translators of the four types' choices (biases and norm shifts it lacks are
# written as zeros)
NATIVE = {
    "MarianMTModel": f"{TRANSLATOR}, norm: {{position: post}}, positional: {{type: sinusoidal, layout: "
    "halves}, scale_embeddings: true, bias: {lm_head: true}, share_embeddings: false, activation: silu}",
    "PegasusForConditionalGeneration": f"{TRANSLATOR}, n_decoder_layers: 1, positional: {{type: sinusoidal, "
    "layout: halves}, tie_embeddings: false, activation: relu, bias: {qkv: false}}",
    "BartForConditionalGeneration": f"{TRANSLATOR}, norm: {{position: post}}, positional: learned, "
    "embedding_norm: true, activation: gelu_tanh}",
    "MBartForConditionalGeneration": f"{TRANSLATOR}, positional: learned, embedding_norm: true, "
    "norm: {bias: false}, bias: {ffn: false, lm_head: true}}",
}


@pytest.mark.parametrize("head", list(NATIVE))
def test_export_hf_writes_tfcompiles_translators_as_the_type_of_their_choices(
    head: str, tmp_path: Path
) -> None:
    run = random_run(tmp_path, NATIVE[head] + "\ntask: seq2seq\n")
    assert export_hf(run, tmp_path / "out") == head
    _loads_alike(tmp_path / "out", load_trained_model(run)[1])


MARIAN = NATIVE["MarianMTModel"][: -len("}")]
REFUSED = [
    # Vaswani's interleaved sines and cosines: transformers' Marian computes the halves layout
    (MARIAN.replace("layout: halves", "layout: interleaved") + "}", "model.positional.layout"),
    (MARIAN + ", embedding_norm: true}", "model.embedding_norm"),
    (MARIAN.replace("norm: {position: post}", "norm: {position: post, eps: 1.0e-6}") + "}", "model.norm.eps"),
    (
        MARIAN.replace("norm: {position: post}", "norm: {position: post, type: rmsnorm}") + "}",
        "model.norm.type",
    ),
    (
        MARIAN.replace("norm: {position: post}", "norm: {position: post, final: true}") + "}",
        "model.norm.final",
    ),
    (MARIAN.replace("activation: silu", "activation: swiglu") + "}", "model.activation"),
    (MARIAN + ", n_kv_heads: 2}", "model.n_kv_heads"),
    (MARIAN + ", attention_scale: 1.0}", "model.attention_scale"),
    (MARIAN + ", qkv_clip: 8.0}", "model.qkv_clip"),
    # BART's learned positions: an embedding norm, and one table for source and target
    (f"{TRANSLATOR}, norm: {{position: post}}, positional: learned}}", "model.embedding_norm"),
    (
        f"{TRANSLATOR}, positional: learned, embedding_norm: true, share_embeddings: false}}",
        "model.share_embeddings",
    ),
]


@pytest.mark.parametrize(("text", "field"), REFUSED, ids=[field for _, field in REFUSED])
def test_export_hf_refuses_what_the_four_types_cannot_compute_by_field(
    text: str, field: str, tmp_path: Path
) -> None:
    run = random_run(tmp_path, text + "\ntask: seq2seq\n")
    with pytest.raises(HFError, match=rf"  {field}: "):
        export_hf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_t5_still_writes_translators_of_other_positions(tmp_path: Path) -> None:
    run = random_run(tmp_path, f"{TRANSLATOR}, positional: rope}}\ntask: seq2seq\n")
    with pytest.raises(HFError, match=r"  model.positional: 'rope' has no T5 equivalent"):
        export_hf(run, tmp_path / "out")


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("marian", "MarianModel"),
        ("marian", "MarianForCausalLM"),
        ("bart", "BartForSequenceClassification"),
        ("bart", "MarianMTModel"),  # another type's head
        ("pegasus", "PegasusForCausalLM"),
    ],
)
def test_another_head_class_is_refused_by_architectures(
    imported: dict[str, Imported], name: str, head: str, tmp_path: Path
) -> None:
    folder = edited(imported, name, tmp_path, architectures=[head])
    with pytest.raises(HFError, match=rf"  architectures: {head} is not a sequence-to-sequence model"):
        import_folder(folder, "head", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "head").exists()


def with_position_tables(folder: Path, hf: Any, change: float = 0.0) -> None:
    """Save transformers' position tables into the folder's weights, as older Marian and Pegasus
    checkpoints hold them (save_pretrained now leaves them out), the encoder's moved by ``change``
    at one place."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    for stack in ("encoder", "decoder"):
        tensors[f"model.{stack}.embed_positions.weight"] = getattr(
            hf.model, stack
        ).embed_positions.weight.clone()
    tensors["model.encoder.embed_positions.weight"][3, 5] += change
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("name", ["marian", "pegasus"])
def test_a_saved_sinusoidal_table_is_read_and_must_be_the_formula(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """transformers computes with a saved table (one that is not the formula's changes its
    outputs), so the import reads it: the formula's imports as the folder without it, another is
    refused naming the tensor, before anything is written."""
    variant = imported[name]
    formula = copied(imported, name, tmp_path / "formula")
    with_position_tables(formula, variant.hf)
    result = import_folder(formula, "formula", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model == variant.spec.model
    changed = copied(imported, name, tmp_path / "changed")
    with_position_tables(changed, variant.hf, change=0.5)
    assert (
        from_pretrained(changed).model.encoder.embed_positions.weight[3, 5]
        != (variant.hf.model.encoder.embed_positions.weight[3, 5])
    )
    with pytest.raises(HFError, match=r"encoder.embed_positions.weight is not the sinusoidal table"):
        import_folder(changed, "changed", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "changed").exists()


def test_learned_positions_of_other_rows_than_the_config_says_are_refused(
    imported: dict[str, Imported], tmp_path: Path
) -> None:
    folder = copied(imported, "bart", tmp_path)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    table = tensors["model.decoder.embed_positions.weight"]
    tensors["model.decoder.embed_positions.weight"] = table[:-2].clone()  # no offset rows
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(HFError, match=r"decoder.embed_positions.weight has shape \(32, 16\)"):
        import_folder(folder, "rows", tmp_path / "specs", tmp_path / "runs")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_bundle_translates_as_transformers_greedy_generate(
    imported: dict[str, Imported], name: str, tmp_path: Path
) -> None:
    """`tfcompile export` (parity checked), then greedy translation in onnxruntime of sources the
    folder's tokenizer ends with </s>, as transformers' generate translates them."""
    variant = imported[name]
    assert main(["export", str(variant.result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    tokenizer = T.AutoTokenizer.from_pretrained(variant.folder)
    ours = Translator(tmp_path / "bundle").translate(SENTENCES, beam=1, max_len=10)
    theirs = []
    for sentence in SENTENCES:
        ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
        generated = variant.hf.generate(ids, do_sample=False, num_beams=1, max_new_tokens=10)
        theirs.append(tidy(tokenizer.decode(generated[0], skip_special_tokens=True)))
    assert ours == theirs and len(set(ours)) > 1


def saved_with_bart_tokenizer(folder: Path, **fields: Any) -> Any:
    """A BART saved with BART's tokenizer: <s> 0, <pad> 1, </s> 2 (its eos and its decoder's start),
    sources <s> ... </s> (RobertaProcessing); ``fields`` in both config files."""
    from hf_models import perturb, write

    torch.manual_seed(0)
    ids = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    model = write(perturb(built("bart", **ids)), "bart", folder)
    for name in ("config.json", "generation_config.json"):
        saved = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps(saved | fields))
    return model


def test_a_source_between_bart_tokenizers_s_and_eos_is_the_specs_prefix_and_suffix(tmp_path: Path) -> None:
    """BART's tokenizer puts <s> (its cls) before a source and </s> after it: the spec's
    source_prefix and source_suffix, which export-hf writes back into the tokenizer."""
    saved_with_bart_tokenizer(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "bart", tmp_path / "specs", tmp_path / "runs")
    task, tokens = result.spec.task, result.spec.tokens
    assert (task.source_prefix, task.source_suffix) == (["cls"], ["eos"])
    assert tokens is not None and (tokens.bos, tokens.cls, tokens.eos) == ("</s>", "<s>", "</s>")
    export_hf(result.run_dir, tmp_path / "out")
    text = "the cat sat"
    ours, theirs = (
        T.AutoTokenizer.from_pretrained(f)(text)["input_ids"] for f in (tmp_path / "out", tmp_path / "hf")
    )
    assert ours == theirs and theirs[0] == 0 and theirs[-1] == 2


@pytest.mark.slow
def test_the_bundle_translates_a_bart_source_as_transformers_with_its_tokenizer(tmp_path: Path) -> None:
    """`tfcompile translate`'s rows are <s> text </s>, as transformers' tokenizer encodes a source:
    the greedy translations are generate's."""
    hf = saved_with_bart_tokenizer(tmp_path / "hf").eval()
    result = import_folder(tmp_path / "hf", "bart", tmp_path / "specs", tmp_path / "runs")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = Translator(tmp_path / "bundle")
    assert bundle.manifest.translation is not None and bundle.manifest.translation.source_prefix_ids == [0]
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
    theirs = []
    for sentence in SENTENCES:
        generated = hf.generate(
            tokenizer(sentence, return_tensors="pt")["input_ids"],
            do_sample=False,
            num_beams=1,
            max_new_tokens=10,
        )
        theirs.append(tidy(tokenizer.decode(generated[0], skip_special_tokens=True)))
    assert bundle.translate(SENTENCES, beam=1, max_len=10) == theirs and len(set(theirs)) > 1


@pytest.mark.slow
def test_bart_large_cnns_forced_s_starts_every_translation_as_in_transformers(tmp_path: Path) -> None:
    """BART-large-CNN forces <s> (its cls) after the decoder's </s> (forced_bos_token_id 0): the
    spec's task.target_prefix: [cls]; the bundle translates as generate() does, and export-hf writes
    it back, where transformers reads it."""
    saved_with_bart_tokenizer(tmp_path / "hf", forced_bos_token_id=0)
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "cnn", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.type == "seq2seq" and result.spec.task.target_prefix == ["cls"]
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    bundle = Translator(tmp_path / "bundle")
    assert bundle.translation.target_prefix_ids == [0]
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf")

    def generated(model: Any, **forced: Any) -> list[str]:
        out = []
        for sentence in SENTENCES:
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
            tokens = model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=10, **forced)[0]
            assert tokens[0] == 2 and (tokens[1] == 0 or forced)
            out.append(tidy(tokenizer.decode(tokens, skip_special_tokens=True)))
        return out

    theirs = generated(hf)
    assert (
        bundle.translate(SENTENCES, beam=1, max_len=10) == theirs != generated(hf, forced_bos_token_id=None)
    )
    export_hf(result.run_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert written["forced_bos_token_id"] == 0
    assert generated(from_pretrained(tmp_path / "out")) == theirs


@pytest.mark.slow
def test_a_forced_eos_ends_a_cut_translation_as_in_transformers(tmp_path: Path) -> None:
    """forced_eos_token_id (the BART family's configs set it to their eos): generate() puts </s>
    in the last place max_new_tokens leaves, so a translation cut there is a token shorter. The
    spec's task.forced_eos, which the bundle follows and export-hf writes back (null where the
    spec has none, which the config class would otherwise read as its eos)."""
    saved_with_bart_tokenizer(tmp_path / "hf", forced_eos_token_id=2)
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "forced", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.type == "seq2seq" and result.spec.task.forced_eos
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf")

    def generated(model: Any, **fields: Any) -> list[str]:
        out = []
        for sentence in SENTENCES:
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
            tokens = model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=4, **fields)[0]
            out.append(tidy(tokenizer.decode(tokens, skip_special_tokens=True)))
        return out

    theirs, unforced = generated(hf), generated(hf, forced_eos_token_id=None)
    assert theirs != unforced
    assert Translator(tmp_path / "bundle").translate(SENTENCES, beam=1, max_len=4) == theirs
    export_hf(result.run_dir, tmp_path / "out")
    for name in ("config.json", "generation_config.json"):
        assert json.loads((tmp_path / "out" / name).read_text())["forced_eos_token_id"] == 2
    assert generated(from_pretrained(tmp_path / "out")) == theirs
    spec_file = result.run_dir / "spec.yaml"
    spec_file.write_text(spec_file.read_text().replace("forced_eos: true", "forced_eos: false"))
    export_hf(result.run_dir, tmp_path / "plain")
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["forced_eos_token_id"] is None
    assert generated(from_pretrained(tmp_path / "plain")) == unforced


def test_a_forced_eos_that_is_not_the_eos_is_refused_and_one_read_otherwise_by_transformers_4_warns(
    tmp_path: Path,
) -> None:
    """transformers forces forced_eos_token_id last whatever token it is: tfcompile ends with the
    eos alone. A config.json without the field (and no generation_config.json) forces nothing
    in transformers 5 and the config class's eos in 4: the import follows 5 and says so."""
    saved_with_bart_tokenizer(tmp_path / "other", forced_eos_token_id=0)
    with pytest.raises(
        HFError, match=r"generation_config\.json.*\n  forced_eos_token_id: is 0, .* neither eos_token_id"
    ):
        import_folder(tmp_path / "other", "other", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "other").exists()
    folder = tmp_path / "hf"
    saved_with_bart_tokenizer(folder)
    (folder / "generation_config.json").unlink()
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({k: v for k, v in saved.items() if k != "forced_eos_token_id"})
    )
    with pytest.warns(
        HFWarning, match="forced_eos_token_id is None as transformers 5 reads the folder and 2 as 4"
    ):
        result = import_folder(folder, "bart", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.task.type == "seq2seq" and not result.spec.task.forced_eos


def with_generation(folder: Path, **fields: Any) -> None:
    """``fields`` written into the folder's generation_config.json."""
    path = folder / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


@pytest.mark.slow
def test_the_bundle_translates_by_default_as_generate_does_by_the_folders_settings(tmp_path: Path) -> None:
    """generation_config.json's num_beams and max_length are the task's beam and max_decode_len
    (max_length less the decoder's start): `translate` without arguments gives generate()'s
    translations without arguments (greedy, cut at 6 tokens with the forced eos)."""
    saved_with_bart_tokenizer(tmp_path / "hf", forced_eos_token_id=2)
    with_generation(tmp_path / "hf", num_beams=1, max_length=6)
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "set", tmp_path / "specs", tmp_path / "runs")
    task = result.spec.task
    assert task.type == "seq2seq" and (task.beam, task.max_decode_len, task.forced_eos) == (1, 5, True)
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
    theirs = [
        tidy(
            tokenizer.decode(
                hf.generate(tokenizer(s, return_tensors="pt")["input_ids"])[0], skip_special_tokens=True
            )
        )
        for s in SENTENCES
    ]
    assert Translator(tmp_path / "bundle").translate(SENTENCES) == theirs
    assert max(len(t.split()) for t in theirs) == 4  # cut: five places, the last the eos's


# generate()'s beam search settings, each of which changes some translation of SENTENCES by a
# tiny BART whose eos is likely (searched by test_the_bundle_searches_beams_as_generate_does)
BEAM_SETTINGS: list[dict[str, Any]] = [
    {"num_beams": 4},  # length_penalty 1.0, early_stopping False: generate()'s defaults
    {"num_beams": 4, "early_stopping": True},
    {"num_beams": 4, "length_penalty": 2.0},
    {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True},
    {"num_beams": 4, "length_penalty": 2.0, "early_stopping": "never"},
    {"num_beams": 3, "length_penalty": -1.0},
    {"num_beams": 4, "length_penalty": 0.0, "early_stopping": "never", "no_repeat_ngram_size": 2},
]


def with_likely_eos(folder: Path, model: Any) -> None:
    """``model`` saved again with its eos's logit raised, so that hypotheses finish at many lengths."""
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] = 4.0
    model.save_pretrained(folder)


def setting_id(setting: dict[str, Any]) -> str:
    return "-".join(f"{k}={v}" for k, v in setting.items())


@pytest.mark.slow
@pytest.mark.parametrize("setting", BEAM_SETTINGS, ids=setting_id)
def test_the_bundle_searches_beams_as_generate_does(setting: dict[str, Any], tmp_path: Path) -> None:
    """generation_config.json's num_beams, length_penalty and early_stopping (and a ban) are the
    task's beam search, generate()'s: `translate` without arguments gives generate()'s
    translations without arguments, which fairseq's beam search does not (for some setting) and
    greedy does not; export-hf writes the settings back, and transformers translates the written
    folder alike."""
    hf = saved_with_bart_tokenizer(tmp_path / "hf").eval()
    with_likely_eos(tmp_path / "hf", hf)
    with_generation(tmp_path / "hf", max_new_tokens=12, **setting)
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "beams", tmp_path / "specs", tmp_path / "runs")
    task = result.spec.task
    assert task.type == "seq2seq" and (task.beam_scoring, task.beam) == ("transformers", setting["num_beams"])
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
    theirs = [
        tidy(tokenizer.decode(row, skip_special_tokens=True)) for row in generated_ids(hf, tmp_path / "hf")
    ]
    bundle = Translator(tmp_path / "bundle")
    assert bundle.translate(SENTENCES) == theirs != bundle.translate(SENTENCES, beam=1)
    export_hf(result.run_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert {k: written[k] for k in setting if k != "no_repeat_ngram_size"} == {
        k: v for k, v in setting.items() if k != "no_repeat_ngram_size"
    }
    assert generated_ids(from_pretrained(tmp_path / "out"), tmp_path / "out") == generated_ids(
        hf, tmp_path / "hf"
    )


def test_each_beam_setting_changes_generates_translations(tmp_path: Path) -> None:
    """The settings BEAM_SETTINGS tests are told apart by transformers itself: each gives
    translations of SENTENCES that the others do not."""
    hf = saved_with_bart_tokenizer(tmp_path / "hf").eval()
    with_likely_eos(tmp_path / "hf", hf)
    seen = {
        tuple(map(tuple, generated_ids(hf, tmp_path / "hf", max_new_tokens=12, **s))) for s in BEAM_SETTINGS
    }
    assert len(seen) == len(BEAM_SETTINGS)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"num_beams": 3}, {"beam": 3}),
        ({"length_penalty": 2, "early_stopping": True}, {"length_penalty": 2.0, "early_stopping": True}),
        (
            {"length_penalty": -0.5, "early_stopping": "never"},
            {"length_penalty": -0.5, "early_stopping": "never"},
        ),
        ({"max_length": 12}, {"max_decode_len": 11}),
        ({"max_length": 12, "max_new_tokens": 7}, {"max_decode_len": 7}),  # max_new_tokens first
        ({"max_length": 500}, {"max_decode_len": 31}),  # at most the positions the model has
        ({}, {}),
    ],
)
def test_the_folders_beam_search_and_length_are_the_tasks(
    fields: dict[str, Any], expected: dict[str, Any], tmp_path: Path
) -> None:
    """generate()'s beam search, with the folder's num_beams (1 where it has none, as generate()),
    length_penalty and early_stopping; max_decode_len from max_new_tokens or max_length (the
    task's default where it has neither, not transformers' max_length 20). None is warned of."""
    saved_with_bart_tokenizer(tmp_path / "hf")
    with_generation(tmp_path / "hf", **fields)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = import_folder(tmp_path / "hf", "set", tmp_path / "specs", tmp_path / "runs").spec.task
    assert not [w for w in caught if issubclass(w.category, HFWarning)]
    defaults = {
        "beam": 1,
        "beam_scoring": "transformers",
        "length_penalty": 1.0,
        "early_stopping": False,
        "max_decode_len": 31,  # max_seq_len - 1
    }
    assert {name: getattr(task, name) for name in defaults} == defaults | expected


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"num_beams": 0}, "num_beams"),
        ({"num_beams": 65}, "num_beams"),
        ({"max_length": 1.5}, "max_length"),
        ({"length_penalty": 11}, "length_penalty"),
        ({"length_penalty": True}, "length_penalty"),
        ({"length_penalty": "2"}, "length_penalty"),
        ({"early_stopping": "sometimes"}, "early_stopping"),
        ({"early_stopping": 1}, "early_stopping"),
    ],
)
def test_a_beam_search_or_length_tfcompile_cannot_hold_is_refused_by_field(
    fields: dict[str, Any], named: str, tmp_path: Path
) -> None:
    saved_with_bart_tokenizer(tmp_path / "hf")
    with_generation(tmp_path / "hf", **fields)
    with pytest.raises(HFError, match=rf"generation_config\.json: 1 problem:\n  {named}: "):
        import_folder(tmp_path / "hf", "set", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "set").exists()


def test_generation_settings_translations_do_not_apply_are_warned_of(tmp_path: Path) -> None:
    """A repetition_penalty, an encoder_repetition_penalty and a sequence bias. Sampling settings
    without do_sample change nothing; BART-large-CNN's length_penalty is the task's, and bad words
    are its bans: one token's suppressed, several tokens' a banned sequence."""
    saved_with_bart_tokenizer(tmp_path / "hf")
    fields = dict(
        bad_words_ids=[[1], [7, 8]], length_penalty=2.0, repetition_penalty=1.2, min_length=3, top_k=5
    ) | dict(encoder_repetition_penalty=1.5, sequence_bias=[[[7], -1.0]])
    with_generation(tmp_path / "hf", **fields)
    with pytest.warns(HFWarning) as caught:
        task = import_folder(tmp_path / "hf", "set", tmp_path / "specs", tmp_path / "runs").spec.task
    said = " ".join(str(w.message) for w in caught)
    assert (
        "repetition_penalty 1.2, encoder_repetition_penalty 1.5, sequence_bias [[[7], -1.0]]: generate()"
        in said
    )
    assert "length_penalty" not in said
    assert "bad_words_ids" not in said and "top_k" not in said and "min_length" not in said
    assert task.type == "seq2seq" and (task.suppressed_tokens, task.min_decode_len) == (["<pad>"], 2)
    assert len(task.banned_sequences) == 1 and len(task.banned_sequences[0]) == 2
    assert task.length_penalty == 2.0


def generated_ids(model: Any, folder: Path, **fields: Any) -> list[list[int]]:
    """``model``'s generate() of SENTENCES (encoded by the folder's tokenizer) with ``fields``:
    each row's tokens after the decoder's start."""
    tokenizer = T.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return [
            model.generate(tokenizer(s, return_tensors="pt")["input_ids"], **fields)[0, 1:].tolist()
            for s in SENTENCES
        ]


def with_bans(folder: Path, model: Any) -> dict[str, Any]:
    """Bans that change ``model``'s greedy translations of SENTENCES (10 new tokens), written into
    the folder's generation_config.json with num_beams 1 and max_new_tokens 10: the two tokens it
    chooses most (one as Marian bans its pad, in bad_words_ids, one in suppress_tokens), a
    min_length past its shortest translation, no_repeat_ngram_size 2; the model saved with its
    eos's logit raised (``with_likely_eos``), so that some translations end early (two of five).
    -> the bans."""
    with_likely_eos(folder, model)
    plain = generated_ids(model, folder, do_sample=False, num_beams=1, max_new_tokens=10)
    assert sorted(map(len, plain))[:3] == [1, 3, 10]
    (first, _), (second, _) = Counter(t for row in plain for t in row if t > 3).most_common(2)
    bans = dict(
        bad_words_ids=[[first]],
        suppress_tokens=[second],
        min_length=min(map(len, plain)) + 3,
        no_repeat_ngram_size=2,
    )
    with_generation(folder, num_beams=1, max_new_tokens=10, **bans)
    return bans


@pytest.mark.slow
def test_the_folders_bans_are_the_tasks_and_the_bundle_translates_under_them_as_generate_does(
    tmp_path: Path,
) -> None:
    """generation_config.json's bad_words_ids of one token and suppress_tokens (as the tokenizer
    spells them), min_length (less the decoder's start) and no_repeat_ngram_size: the task's
    suppressed_tokens, min_decode_len and no_repeat_ngram_size. `translate` without arguments
    gives generate()'s translations without arguments, which the bans change; export-hf writes
    them back (min_new_tokens, suppress_tokens), and transformers translates the written folder
    alike."""
    hf = saved_with_bart_tokenizer(tmp_path / "hf").eval()
    bans = with_bans(tmp_path / "hf", hf)
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "bans", tmp_path / "specs", tmp_path / "runs")
    task, vocabulary = (
        result.spec.task,
        T.AutoTokenizer.from_pretrained(tmp_path / "hf").convert_ids_to_tokens,
    )
    assert task.type == "seq2seq"
    assert task.suppressed_tokens == vocabulary([*bans["suppress_tokens"], bans["bad_words_ids"][0][0]])
    assert (task.min_decode_len, task.no_repeat_ngram_size) == (bans["min_length"] - 1, 2)
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "bundle")]) == 0
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
    theirs = [
        tidy(tokenizer.decode(row, skip_special_tokens=True)) for row in generated_ids(hf, tmp_path / "hf")
    ]
    unbanned = generated_ids(
        hf, tmp_path / "hf", suppress_tokens=None, bad_words_ids=None, min_length=0, no_repeat_ngram_size=0
    )
    assert [tidy(tokenizer.decode(row, skip_special_tokens=True)) for row in unbanned] != theirs
    for lifted in (
        {"suppress_tokens": None},
        {"bad_words_ids": None},
        {"min_length": 0},
        {"no_repeat_ngram_size": 0},
    ):
        assert generated_ids(hf, tmp_path / "hf", **lifted) != generated_ids(hf, tmp_path / "hf"), lifted
    assert Translator(tmp_path / "bundle").translate(SENTENCES) == theirs
    export_hf(result.run_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    suppressed = [*bans["suppress_tokens"], bans["bad_words_ids"][0][0]]
    assert (written["min_new_tokens"], written["no_repeat_ngram_size"], written["suppress_tokens"]) == (
        bans["min_length"] - 1,
        2,
        suppressed,
    )
    assert generated_ids(
        from_pretrained(tmp_path / "out"), tmp_path / "out", num_beams=1, max_new_tokens=10
    ) == (generated_ids(hf, tmp_path / "hf"))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"suppress_tokens": [2]}, "suppress_tokens: bans '</s>', which ends a text, so no translation ends"),
        ({"suppress_tokens": "<pad>"}, "suppress_tokens: is '<pad>'"),
        ({"bad_words_ids": [1]}, "bad_words_ids: is \\[1\\]"),
        ({"bad_words_ids": [[]]}, "bad_words_ids: is"),
        ({"min_length": -1}, "min_length: is -1, no count"),
        ({"min_new_tokens": 1.5}, "min_new_tokens: is 1.5, no count"),
        ({"no_repeat_ngram_size": True}, "no_repeat_ngram_size: is True"),
    ],
)
def test_a_ban_tfcompile_cannot_hold_is_refused_by_field(
    fields: dict[str, Any], named: str, tmp_path: Path
) -> None:
    saved_with_bart_tokenizer(tmp_path / "hf")
    with_generation(tmp_path / "hf", **fields)
    with pytest.raises(HFError, match=rf"generation_config\.json: 1 problem:\n  {named}"):
        import_folder(tmp_path / "hf", "set", tmp_path / "specs", tmp_path / "runs")
    assert not (tmp_path / "runs" / "set").exists()


def test_a_bad_word_that_is_the_eos_is_left_out_as_generate_leaves_it(tmp_path: Path) -> None:
    """transformers' NoBadWordsLogitsProcessor drops a bad word that is an eos id: the eos stays
    allowed, the pad is suppressed."""
    saved_with_bart_tokenizer(tmp_path / "hf")
    with_generation(tmp_path / "hf", bad_words_ids=[[2], [1]])
    task = import_folder(tmp_path / "hf", "set", tmp_path / "specs", tmp_path / "runs").spec.task
    assert task.type == "seq2seq" and task.suppressed_tokens == ["<pad>"]


def test_suppressed_ids_past_the_logits_are_left_out_and_ones_without_a_name_warned_of(
    tmp_path: Path,
) -> None:
    """An id past vocab_size is never generated (nothing to ban); the tokenizer names every id of
    the tiny BART below it, so a folder without tokenizer.json names none: warned of."""
    saved_with_bart_tokenizer(tmp_path / "hf")
    with_generation(tmp_path / "hf", suppress_tokens=[VOCAB + 5, 7], min_length=100)
    task = import_folder(tmp_path / "hf", "past", tmp_path / "specs", tmp_path / "runs").spec.task
    assert task.type == "seq2seq" and len(task.suppressed_tokens) == 1
    assert task.min_decode_len == task.max_decode_len == 31  # a longer one bans the eos as long
    (tmp_path / "hf" / "tokenizer.json").unlink()
    with pytest.warns(HFWarning) as caught:
        task = import_folder(tmp_path / "hf", "unnamed", tmp_path / "specs", tmp_path / "runs").spec.task
    assert "token ids 7, which the tokenizer cannot name" in " ".join(str(w.message) for w in caught)
    assert task.type == "seq2seq" and task.suppressed_tokens == []


def test_export_hf_writes_an_mbarts_language_codes_and_refuses_a_longer_prefix(tmp_path: Path) -> None:
    """An mBART with NLLB's tokenizer (eng_Latn ... </s>) forcing fra_Latn: export-hf writes the
    source's code the spec names (another than the tokenizer's) into the tokenizer's template, the
    target's as forced_bos_token_id; a prefix of two tokens has no transformers field."""
    from hf_models import LANGUAGES, perturb, write

    torch.manual_seed(0)
    write(perturb(built("mbart", encoder_layers=1)), "nllb", tmp_path / "hf")
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    forced = 3 + LANGUAGES.index("fra_Latn")  # after <pad>, </s> and <unk>
    (tmp_path / "hf" / "generation_config.json").write_text(
        json.dumps(generation | {"forced_bos_token_id": forced})
    )
    result = import_folder(tmp_path / "hf", "mbart", tmp_path / "specs", tmp_path / "runs")
    spec_file = result.run_dir / "spec.yaml"
    spec_file.write_text(
        spec_file.read_text().replace("source_language: eng_Latn", "source_language: deu_Latn")
    )
    export_hf(result.run_dir, tmp_path / "out")
    tokenizer = T.AutoTokenizer.from_pretrained(tmp_path / "out")
    codes = tokenizer.convert_tokens_to_ids(["deu_Latn", "fra_Latn"])
    encoded = tokenizer("the cat")["input_ids"]
    assert encoded[0] == codes[0] and encoded[-1] == tokenizer.convert_tokens_to_ids("</s>")
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert "source_language_token" not in config and "target_language_token" not in config
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert written["forced_bos_token_id"] == codes[1] == forced
    spec_file.write_text(
        spec_file.read_text().replace("  - target_language\n", "  - target_language\n  - target_language\n")
    )
    with pytest.raises(HFError, match=r"task\.target_prefix: gives the decoder 2 tokens after its start"):
        export_hf(result.run_dir, tmp_path / "longer")
    assert not (tmp_path / "longer").exists()


# ---------------------------------------------------------------- every field of the four classes

IDS = dict(pad_token_id=3, eos_token_id=4, decoder_start_token_id=3, forced_eos_token_id=4)


def family_rows(f: str) -> list[Case]:
    """The rows the four share (their configs hold the same fields, read alike)."""
    return [
        case(  # the fields that take any value at once: each row below sets one
            f,
            activation_function="relu",
            scale_embedding=True,
            dropout=0.3,
            attention_dropout=0.2,
            activation_dropout=0.4,
            encoder_layerdrop=0.2,
            decoder_layerdrop=0.2,
            init_std=0.5,
            use_cache=False,
            spec={"activation": "relu", "scale_embeddings": True, "dropout.residual": 0.3},
        ),
        case(f, activation_function="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
        case(f, activation_function="swish", spec={"activation": "silu"}, slow=True),
        case(f, outcome="activation_function", activation_function="quick_gelu", slow=f != "marian"),
        case(f, scale_embedding=True, spec={"scale_embeddings": True}, slow=True),
        case(f, dropout=0.5, attention_dropout=0.1, spec={"dropout.attention": 0.1}, slow=True),
        case(f, activation_dropout=0.5, slow=True),  # training only, not read
        case(f, encoder_layerdrop=0.5, decoder_layerdrop=0.5, slow=True),  # training only, not read
        case(f, init_std=0.0, slow=True),  # initialisation only
        case(f, encoder_layers=1, spec={"n_layers": 1}, slow=True),
        case(f, decoder_layers=1, spec={"n_decoder_layers": 1}, slow=f != "bart"),
        case(f, decoder_layers=3, spec={"n_decoder_layers": 3}, slow=True),
        case(f, outcome="decoder_attention_heads", decoder_attention_heads=2, slow=f != "pegasus"),
        case(f, outcome="decoder_ffn_dim", decoder_ffn_dim=48, slow=f != "mbart"),
        case(f, encoder_attention_heads=2, decoder_attention_heads=2, spec={"n_heads": 2}, slow=True),
        case(f, max_position_embeddings=16, spec={"max_seq_len": 16}, length=16, slow=True),
        # a table per stack and a head of its own (only Marian's writer has them)
        case(f, tie_word_embeddings=False, spec={"tie_embeddings": False}, exported=f == "marian", slow=True),
        case(f, use_cache=False, slow=True),
        case(f, slow=True, **IDS),
        case(f, outcome="forced_eos_token_id", forced_eos_token_id=2, slow=f != "pegasus"),
        case(f, outcome="is_decoder", json={"is_decoder": True}, slow=True),
        case(f, json={"is_encoder_decoder": False}, slow=f != "marian"),  # generate() alone reads it
    ]


CASES: list[Case] = [
    *(row for f in CLASSES for row in family_rows(f)),
    case("marian", bos_token_id=5, slow=True),
    case("bart", bos_token_id=5, classifier_dropout=0.3, slow=True),
    case("mbart", bos_token_id=5, classifier_dropout=0.3, slow=True),
    # a table per stack of one vocabulary; one of another size (the target's) is refused
    case(
        "marian",
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=VOCAB,
        spec={"share_embeddings": False},
    ),
    case(
        "marian",
        outcome="decoder_vocab_size",
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=48,
        slow=True,
    ),
    case("marian", share_encoder_decoder_embeddings=False, spec={"share_embeddings": False}, slow=True),
    case("marian", decoder_vocab_size=48, slow=True),  # a shared table: the decoder's size is not read
    case("marian", outcome="pad_token_id", json={"pad_token_id": VOCAB}, slow=True),  # past the vocabulary
]


@pytest.mark.parametrize("c", _pytest_cases(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path)


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_every_config_field_has_a_case(model_type: str) -> None:
    assert uncovered(model_type, [c for c in CASES if c.family == model_type]) == set()
