"""`tfcompile export-hf`, reviewed: what a transformers user of the written folder reads (the
tokenizer's outputs) computes what the run computes, and the folder is written only where it may
be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import Imported, from_pretrained
from tokenizers import Tokenizer, processors

from tfcompile.data.tokenizer import train_tokenizer
from tfcompile.hf.errors import HFError
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import write_run
from tfcompile.sequences import BOS, CAUSAL_LM_TOKENS, EOS, SEQ2SEQ_TOKENS
from tfcompile.spec import parse_spec
from tfcompile.spec.schema import CharTokenizer
from tfcompile.tasks import build_model
from tfcompile.tasks.seq2seq import translate_tokens

transformers = pytest.importorskip("transformers")


def test_a_sentence_pair_reaches_bert_as_two_segments(tmp_path: Path) -> None:
    """The tokenizer transformers loads gives the pair's token_type_ids, as the run's tokenizer
    does (without them, BERT read both sentences as segment 0: the logits were 0.46 apart)."""
    case = Imported(tmp_path, "bert_cls")
    out = tmp_path / "out"
    export_hf(case.result.run_dir, out)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    ours = Tokenizer.from_file(str(case.result.run_dir / "tokenizer.json"))
    reloaded = from_pretrained(out)
    for first, second in [("a good movie", "it was fine"), ("bad", "terrible acting, truly")]:
        encoded = theirs(first, second, return_tensors="pt")
        expected = ours.encode(first, second)
        assert encoded["token_type_ids"][0].tolist() == expected.type_ids
        ids, types = torch.tensor([expected.ids]), torch.tensor([expected.type_ids])
        with torch.no_grad():
            logits = reloaded(**encoded).logits
            assert (logits - case.model(ids, torch.ones_like(ids), types)).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Imported(tmp_path_factory.mktemp("hf"), "gpt2").result.run_dir


def test_the_folder_is_never_written_inside_the_run(gpt2_run: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(gpt2_run)
    for out in (gpt2_run / "hf", gpt2_run / "checkpoints" / "hf", link / "hf"):
        with pytest.raises(HFError, match="inside the run"):
            export_hf(gpt2_run, out)
        assert not out.exists()
    with pytest.raises(HFError, match="is the run itself"):
        export_hf(gpt2_run, gpt2_run)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "to-elsewhere").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HFError, match="to-elsewhere is a symbolic link: choose an --out that is not one"):
        export_hf(gpt2_run, tmp_path / "to-elsewhere")


def test_force_replaces_only_a_folder_export_hf_wrote(gpt2_run: Path, tmp_path: Path) -> None:
    """A file export-hf does not write (a model card, a script, another tokenizer's vocabulary)
    keeps the folder from being replaced, --force or not: it was deleted with the folder."""
    out = tmp_path / "out"
    export_hf(gpt2_run, out)
    (out / "README.md").write_text("mine")
    with pytest.raises(HFError, match=r"does not write \(README.md\)"):
        export_hf(gpt2_run, out, force=True)
    assert (out / "README.md").read_text() == "mine"
    (out / "README.md").unlink()
    export_hf(gpt2_run, out, force=True)


@pytest.mark.slow
def test_a_translators_source_suffix_is_in_the_tokenizer_written(tmp_path: Path) -> None:
    """transformers' users encode a source with the tokenizer alone: a run whose sources end with
    [EOS] (task.source_suffix) writes a tokenizer that appends it, and the folder translates as the
    run does (without it, 4 of 5 sentences translated otherwise)."""
    texts = ["ein hund läuft.", "zwei kinder.", "eine frau singt"]
    tokenizer = train_tokenizer(CharTokenizer(), texts, SEQ2SEQ_TOKENS)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    spec = parse_spec(
        f"model: {{family: encoder_decoder, vocab_size: {tokenizer.get_vocab_size()}, d_model: 16, "
        "n_layers: 1, n_heads: 2, max_seq_len: 16, positional: relative, norm: {type: rmsnorm}, "
        "attention_scale: 1, bias: {qkv: false, attn_out: false, ffn: false}, activation: relu}\n"
        "task: {type: seq2seq, source_suffix: [eos]}\n"
    )
    torch.manual_seed(0)
    model = build_model(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    run, out = tmp_path / "run", tmp_path / "out"
    write_run(run, spec, model, tmp_path, None)
    export_hf(run, out)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    reloaded = from_pretrained(out)
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    for text in texts:
        source = [*tokenizer.encode(text, add_special_tokens=False).ids, eos]
        encoded = theirs(text, return_tensors="pt")
        assert encoded["input_ids"][0].tolist() == source
        ids = torch.tensor([source])
        ours = translate_tokens(model, ids, torch.ones_like(ids), [bos], eos, 15)[0]
        with torch.no_grad():
            generated = reloaded.generate(**encoded, max_new_tokens=15, do_sample=False)[0, 1:].tolist()
        assert generated[: len(ours) + 1] == [*ours, eos][: len(generated)]


@pytest.mark.parametrize(
    ("processor", "suffix"),
    [
        (lambda eos, bos: processors.ByteLevel(), ["eos"]),  # adds nothing: the suffix was left out
        (
            lambda eos, bos: processors.TemplateProcessing(
                single="$A [EOS]", special_tokens=[("[EOS]", eos)]
            ),
            [],
        ),
        (
            lambda eos, bos: processors.TemplateProcessing(
                single="[BOS] $A", special_tokens=[("[BOS]", bos)]
            ),
            ["eos"],
        ),
    ],
    ids=["byte-level", "a suffix the run dropped", "a prefix"],
)
def test_a_translators_tokenizer_written_appends_exactly_the_runs_suffix(
    tmp_path: Path, processor: Any, suffix: list[str]
) -> None:
    """Any post-processor counted as appending the suffix: a run whose tokenizer had one wrote it
    unchanged, whatever it appended."""
    texts = ["ein hund läuft.", "zwei kinder."]
    tokenizer = train_tokenizer(CharTokenizer(), texts, SEQ2SEQ_TOKENS)
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processor(eos, bos)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    spec = parse_spec(
        f"model: {{family: encoder_decoder, vocab_size: {tokenizer.get_vocab_size()}, d_model: 16, "
        "n_layers: 1, n_heads: 2, max_seq_len: 16, positional: relative, norm: {type: rmsnorm}, "
        "attention_scale: 1, bias: {qkv: false, attn_out: false, ffn: false}, activation: relu}\n"
        f"task: {{type: seq2seq, source_suffix: {suffix}}}\n"
    )
    write_run(tmp_path / "run", spec, build_model(spec), tmp_path, None)
    export_hf(tmp_path / "run", tmp_path / "out")
    written = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert written.encode(text).ids == [*ids, *([eos] if suffix else [])]


def test_a_special_token_the_tokenizer_lacks_is_null_in_the_config(tmp_path: Path) -> None:
    """Not the config class's default: GPT-2's 50256 (past a small vocabulary, which transformers
    warns of at every load), Llama's bos 1 (tfcompile's [UNK])."""
    tokenizer = train_tokenizer(CharTokenizer(), ["hello, world"], CAUSAL_LM_TOKENS)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    for positional in ("learned", "rope"):
        spec = parse_spec(
            f"model: {{vocab_size: {tokenizer.get_vocab_size()}, d_model: 16, n_layers: 1, n_heads: 2, "
            f"max_seq_len: 8, positional: {positional}, norm: {{type: "
            f"{'layernorm' if positional == 'learned' else 'rmsnorm'}}}, "
            f"activation: {'gelu' if positional == 'learned' else 'swiglu'}}}\n"
        )
        run, out = tmp_path / positional / "run", tmp_path / positional / "out"
        write_run(run, spec, build_model(spec), tmp_path, None)
        export_hf(run, out)
        config = transformers.AutoConfig.from_pretrained(out)
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (None, 2, 0)
