"""RoBERTa, XLM-RoBERTa, CamemBERT and DistilBERT imported from tiny random transformers models,
each with a tokenizer of its own kind (byte-level BPE, Unigram, WordPiece) built without downloads:
transformers' logits in float32, padded and not; the parameters transformers counts, less the
position rows RoBERTa never reads; export-hf back to a folder transformers reads to the same
outputs (a DistilBERT classifier, whose ReLU pooler BERT has not, refused by field); a
classifier's bundle answering a sentence pair as transformers does; and every field of the four
config classes, value by value, imported alike or refused by name."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import BERT, VOCAB, Imported, from_pretrained, perturb, write
from test_hf_fields import UNREAD, Case, case, check, edit_config

from tfcompile.cli import main
from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.summary import summarize
from tfcompile.tasks.task import special_ids
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
T = transformers
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

LETTERS = list("abcdefghijklmnopqrstuvwxyz")
PUNCTUATION = list(".,!?")
SIZES = dict(
    vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
)
LABELS = {"id2label": {0: "neg", 1: "pos", 2: "neutral"}, "label2id": {"neg": 0, "pos": 1, "neutral": 2}}


def _filled(tokens: list[str]) -> list[str]:
    """``tokens`` with fillers up to VOCAB - 1, then <mask> last (where RoBERTa's vocabularies hold it)."""
    return [*tokens, *(f"<unused{i}>" for i in range(VOCAB - 1 - len(tokens))), "<mask>"]


def roberta_tokenizer() -> Any:
    """Byte-level BPE with RoBERTa's ids (<s> 0, <pad> 1, </s> 2, <unk> 3) and its pair template."""
    merges = [("Ġ", "t"), ("t", "h"), ("Ġt", "h"), ("e", "r"), ("Ġ", "a"), ("i", "n")]
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *LETTERS, "Ġ", *PUNCTUATION, *(a + b for a, b in merges)]
    vocab = {t: i for i, t in enumerate(_filled(tokens))}
    return T.RobertaTokenizer(vocab=vocab, merges=merges)


def xlm_roberta_tokenizer(pad: int = 4) -> Any:
    """Unigram over SentencePiece pieces, <pad> at ``pad`` (4: positions from row 5 on; 1:
    xlm-roberta-base's)."""
    pieces = ["<s>", "</s>", "▁", "<unk>", *LETTERS, *(f"▁{c}" for c in "tahsi"), *PUNCTUATION]
    pieces.insert(pad, "<pad>")
    return T.XLMRobertaTokenizer(vocab=[(p, -float(i % 7)) for i, p in enumerate(_filled(pieces))])


def camembert_tokenizer() -> Any:
    """CamemBERT's ids: <s>NOTUSED 0, <pad> 1, </s>NOTUSED 2, <unk> 3, <unk>NOTUSED 4, <s> 5, </s> 6."""
    pieces = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>", "▁", *LETTERS]
    return T.CamembertTokenizer(vocab=[(p, -float(i % 5)) for i, p in enumerate(_filled(pieces))])


def wordpiece_tokenizer() -> Any:
    """BERT's WordPiece (DistilBERT's tokenizer), [PAD] 0 ... [MASK] 4."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *(f"##{c}" for c in LETTERS[:20])]
    tokens += ["the", "cat", *PUNCTUATION]
    tokens += [f"[unused{i}]" for i in range(VOCAB - len(tokens))]
    return T.DistilBertTokenizer(vocab={t: i for i, t in enumerate(tokens)})


@dataclass(frozen=True)
class Family:
    config: Callable[..., Any]
    model: Callable[[Any], Any]
    tokenizer: Callable[[], Any]
    base: dict[str, Any]  # tiny sizes, set in every model of the family


ROBERTA = SIZES | dict(max_position_embeddings=34, type_vocab_size=1)
DISTILBERT = dict(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=32)
FAMILIES = {
    "roberta": Family(T.RobertaConfig, T.RobertaForMaskedLM, roberta_tokenizer, ROBERTA),
    "roberta_cls": Family(
        T.RobertaConfig, T.RobertaForSequenceClassification, roberta_tokenizer, ROBERTA | LABELS
    ),
    "xlm-roberta": Family(
        T.XLMRobertaConfig,
        T.XLMRobertaForMaskedLM,
        xlm_roberta_tokenizer,
        SIZES | dict(max_position_embeddings=37, pad_token_id=4, bos_token_id=0, eos_token_id=1),
    ),
    "xlm-roberta_cls": Family(
        T.XLMRobertaConfig,
        T.XLMRobertaForSequenceClassification,
        xlm_roberta_tokenizer,
        SIZES | dict(max_position_embeddings=37, pad_token_id=4, bos_token_id=0, eos_token_id=1) | LABELS,
    ),
    "camembert": Family(
        T.CamembertConfig,
        T.CamembertForMaskedLM,
        camembert_tokenizer,
        ROBERTA | dict(bos_token_id=5, eos_token_id=6),
    ),
    "camembert_cls": Family(
        T.CamembertConfig,
        T.CamembertForSequenceClassification,
        camembert_tokenizer,
        ROBERTA | dict(bos_token_id=5, eos_token_id=6) | LABELS,
    ),
    "data2vec-text": Family(T.Data2VecTextConfig, T.Data2VecTextForMaskedLM, roberta_tokenizer, ROBERTA),
    "data2vec-text_cls": Family(
        T.Data2VecTextConfig, T.Data2VecTextForSequenceClassification, roberta_tokenizer, ROBERTA | LABELS
    ),
    "distilbert": Family(T.DistilBertConfig, T.DistilBertForMaskedLM, wordpiece_tokenizer, DISTILBERT),
    "distilbert_cls": Family(
        T.DistilBertConfig, T.DistilBertForSequenceClassification, wordpiece_tokenizer, DISTILBERT | LABELS
    ),
}
CLASSES = {
    "roberta": ["roberta", "roberta_cls"],
    "xlm-roberta": ["xlm-roberta", "xlm-roberta_cls"],
    "camembert": ["camembert", "camembert_cls"],
    "data2vec-text": ["data2vec-text", "data2vec-text_cls"],
    "distilbert": ["distilbert", "distilbert_cls"],
}
# The families export-hf writes (as BERT's classes): not DistilBERT's classifier, whose ReLU
# pooler BERT has not.
EXPORTED = [family for family in FAMILIES if family != "distilbert_cls"]


def save(family: str, folder: Path, edits: dict[str, Any] | None = None) -> Any:
    """The family's tiny model (``edits`` over its base), random, norms and biases off 1 and 0,
    saved with its tokenizer into ``folder``."""
    f = FAMILIES[family]
    torch.manual_seed(0)
    model = perturb(f.model(f.config(**(f.base | (edits or {})))))
    model.save_pretrained(folder)
    f.tokenizer().save_pretrained(folder)
    return model


def pad_id(hf: Any) -> int:
    """The pad id (a DistilBERT's may be null: it numbers no positions from it)."""
    return int(hf.config.pad_token_id or 0)


def inputs(hf: Any, length: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids without the pad id (RoBERTa gives a real token that is the pad id no position),
    and a mask of rows of 3 lengths (right padding, as tfcompile pads) filled out with the pad id."""
    pad = pad_id(hf)
    ids = torch.randint(0, VOCAB, (3, length), generator=torch.Generator().manual_seed(0))
    ids[ids == pad] = (pad + 1) % VOCAB
    mask = torch.ones(3, length, dtype=torch.long)
    if padded:
        mask[1, length - 4 :] = 0
        mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, pad), mask


def difference(hf: Any, ours: Callable[..., Any], length: int) -> float:
    """The largest |difference| of two models' logits (``ours`` tfcompile's or a transformers
    model), over their scale past 1, at real tokens, rows padded and not."""
    worst = 0.0
    with torch.no_grad():
        for padded in (True, False):
            ids, mask = inputs(hf, length, padded)
            theirs, mine = hf(input_ids=ids, attention_mask=mask).logits, ours(ids, mask)
            mine = mine[0] if isinstance(mine, tuple) else getattr(mine, "logits", mine)
            if theirs.ndim == 3:  # token logits: those of real tokens
                theirs, mine = theirs[mask.bool()], mine[mask.bool()]
            gap = (theirs - mine).abs().max() / theirs.abs().max().clamp(min=1)
            worst = max(worst, gap.item())
    return worst


def unused_rows(hf: Any) -> int:
    """The parameters transformers counts that the import leaves out: RoBERTa's position rows up to
    the pad id's, read by padding alone; less a classifier's copied second segment row."""
    config = hf.config
    if config.model_type == "distilbert":
        return 0
    copied = config.type_vocab_size == 1 and "SequenceClassification" in type(hf).__name__
    return (pad_id(hf) + 1 - copied) * config.hidden_size


def imported_variant(root: Path, family: str) -> Imported:
    """The family's tiny model saved and imported, with no warning."""
    return Imported(root, family, partial(save, family), "error")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Imported]:
    root = tmp_path_factory.mktemp("imports")
    return {family: imported_variant(root, family) for family in FAMILIES}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_import_gives_transformers_logits_padded_and_not(
    imported: dict[str, Imported], family: str
) -> None:
    case_ = imported[family]
    assert difference(case_.hf, case_.model, case_.spec.model.max_seq_len) <= 1e-5


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parameter_counts_are_transformers_less_the_unread_position_rows(
    imported: dict[str, Imported], family: str
) -> None:
    case_ = imported[family]
    expected = case_.hf.num_parameters() - unused_rows(case_.hf)
    assert case_.spec.parameter_count() == expected == sum(p.numel() for p in case_.model.parameters())
    assert summarize(case_.spec).total_params == expected


def test_the_specs_say_what_each_model_is(imported: dict[str, Imported]) -> None:
    """Positions from past the pad id (RoBERTa's 34 rows, pad 1: 32 positions; XLM-R's 37, pad 4:
    32); a RoBERTa classifier's one segment row as two; DistilBERT without segments, its masked LM
    without pooler, its classifier's pre_classifier as a ReLU pooler."""
    model = {name: case_.spec.model for name, case_ in imported.items()}
    assert {name: m.max_seq_len for name, m in model.items()} == dict.fromkeys(FAMILIES, 32)
    names = ("roberta", "roberta_cls", "distilbert", "distilbert_cls")
    assert [model[n].type_vocab_size for n in names] == [1, 2, 0, 0]
    assert [model[n].pooler for n in names] == [False, True, False, True]
    assert [model[n].pooler_activation for n in names] == ["tanh", "tanh", "tanh", "relu"]
    assert model["distilbert"].norm.eps == 1e-12 and model["distilbert"].positional.type == "learned"
    assert imported["roberta_cls"].spec.task.labels == ["neg", "pos", "neutral"]
    assert imported["distilbert_cls"].spec.task.labels == ["neg", "pos", "neutral"]
    second = imported["roberta_cls"].model.segment_embed.weight
    assert torch.equal(second[0], second[1])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_masked_lm_run_frames_a_sentence_as_the_imported_tokenizer_does(
    imported: dict[str, Imported], family: str
) -> None:
    """The masked-LM task frames a sentence [cls, ..., sep] with the spec's tokens: RoBERTa's
    <s> ... </s>, CamemBERT's <s> at 5, DistilBERT's [CLS] ... [SEP], the tokenizer's own ends,
    and pads with the id the model's positions skip."""
    from tokenizers import Tokenizer

    case_ = imported[family]
    tokenizer = Tokenizer.from_file(str(case_.result.run_dir / "tokenizer.json"))
    ids = special_ids(case_.spec, tokenizer, ("cls", "sep", "pad", "mask"))
    encoded = tokenizer.encode("the cat").ids
    assert (ids["cls"], ids["sep"], ids["pad"]) == (encoded[0], encoded[-1], pad_id(case_.hf))
    assert ids["mask"] == (4 if family.startswith("distilbert") else VOCAB - 1)


@pytest.mark.parametrize("family", EXPORTED)
def test_export_hf_writes_a_folder_transformers_reads_to_the_same_logits(
    imported: dict[str, Imported], family: str, tmp_path: Path
) -> None:
    """Written as BERT's classes (positions from 0; DistilBERT with a zero segment row), which
    compute these models exactly."""
    case_ = imported[family]
    written = export_hf(case_.result.run_dir, tmp_path / "out")
    reloaded, info = from_pretrained(tmp_path / "out", loading_info=True)
    assert not any(info.values()), info
    assert written == ("BertForMaskedLM" if family in CLASSES else "BertForSequenceClassification")
    assert difference(reloaded, case_.model, case_.spec.model.max_seq_len) <= 1e-5
    assert difference(reloaded, case_.hf, case_.spec.model.max_seq_len) <= 1e-5


def test_export_hf_refuses_a_relu_pooler_by_field(imported: dict[str, Imported], tmp_path: Path) -> None:
    """DistilBERT's classifier reads ReLU of its pooler; BERT's pooler is tanh, and export-hf writes
    no DistilBERT class: refused at model.pooler_activation, nothing written."""
    with pytest.raises(HFError, match=r"model\.pooler_activation: 'relu' has no BERT equivalent; tanh"):
        export_hf(imported["distilbert_cls"].result.run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _probabilities(hf: Any, folder: Path, first: str, second: str) -> list[float]:
    encoded = T.AutoTokenizer.from_pretrained(folder)(first, second, return_tensors="pt")
    with torch.no_grad():
        return hf(**encoded).logits.softmax(-1)[0].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["roberta_cls", "xlm-roberta_cls", "camembert_cls", "distilbert_cls"])
def test_a_classifier_bundle_answers_a_pair_as_transformers_does(
    imported: dict[str, Imported], family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exported with parity, its tokenizer frames the pair as transformers' does (<s> A </s></s> B
    </s>, every token segment 0, padded with <pad>; DistilBERT's [CLS] A [SEP] B [SEP], without
    segments): the runtime's and `tfcompile classify`'s probabilities are transformers' for the
    pair, and for pairs of several lengths in one batch."""
    from tfcompile.runtime import load

    case_ = imported[family]
    bundle = tmp_path / "bundle"
    assert main(["export", str(case_.result.run_dir), "--out", str(bundle)]) == 0
    pairs = [("the cat sat", "a hat"), ("that is a hit", "in a hat"), ("a", "the")]
    runtime = load(bundle)
    for (first, second), prediction in zip(pairs, runtime.classify(pairs), strict=True):
        expected = _probabilities(case_.hf, case_.folder, first, second)
        assert list(prediction.probabilities.values()) == pytest.approx(expected, abs=1e-5)
    capsys.readouterr()
    assert main(["classify", str(bundle), pairs[1][0], "--pair", pairs[1][1]]) == 0
    shown = [float(p) for p in re.findall(r"\d\.\d{3}", capsys.readouterr().out)]
    expected = _probabilities(case_.hf, case_.folder, *pairs[1])
    assert shown == pytest.approx(expected, abs=1e-3)


def test_what_cannot_be_expressed_is_refused_by_name(tmp_path: Path) -> None:
    def refused(family: str, model: Callable[[Any], Any] | None = None, **edits: Any) -> str:
        folder = tmp_path / f"hf{len(list(tmp_path.iterdir()))}"
        f = FAMILIES[family]
        (model or f.model)(f.config(**(f.base | edits))).save_pretrained(folder)
        f.tokenizer().save_pretrained(folder)
        with pytest.raises(HFError) as error:
            import_folder(folder, "x", tmp_path / "specs", tmp_path / "runs")
        assert not (tmp_path / "runs" / "x").exists()
        return str(error.value)

    assert "  architectures" in refused("distilbert", T.DistilBertForQuestionAnswering)
    assert "  architectures" in refused("roberta", T.RobertaForTokenClassification)
    assert "  hidden_act" in refused("roberta", hidden_act="relu")
    assert "  is_decoder" in refused("roberta", T.RobertaForCausalLM, is_decoder=True)


def test_a_roberta_masked_lm_saved_with_its_pooler_leaves_it_out_with_a_warning(tmp_path: Path) -> None:
    """roberta-base holds a pooler that no RoBERTa head reads (its classifier's dense layer is its
    own): left out, unlike BERT's, which BERT's classifier reads."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    save("roberta", folder)
    tensors = load_file(folder / "model.safetensors")
    tensors |= {
        "roberta.pooler.dense.weight": torch.ones(16, 16),
        "roberta.pooler.dense.bias": torch.ones(16),
    }
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(HFWarning, match="pooler.dense.bias, pooler.dense.weight: a pooler no RoBERTa head"):
        result = import_folder(folder, "x", tmp_path / "specs", tmp_path / "runs")
    assert result.spec.model.pooler is False


# The masked-LM head's bias as saved: the head's own and the decoder's, each there or not.
HEAD_BIASES = {
    "bert": ("cls.predictions.bias", "cls.predictions.decoder.bias"),
    "roberta": ("lm_head.bias", "lm_head.decoder.bias"),
}


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize(
    ("tie", "saved"),
    [
        (True, ("shared", "decoder")),  # unequal: the decoder's (a tie joins only equal tensors)
        (False, ("shared", "decoder")),
        (True, ("shared",)),  # the decoder's tied to the shared one
        (False, ("shared",)),  # the decoder's missing, initialised to zeros: no bias
        (True, ("decoder",)),  # the shared one tied to the decoder's
    ],
    ids=["tied-both", "untied-both", "tied-shared", "untied-shared", "tied-decoder"],
)
def test_a_masked_lm_head_adds_the_bias_transformers_5_adds(
    family: str, tie: bool, saved: tuple[str, ...], tmp_path: Path
) -> None:
    """transformers 5 adds the decoder's bias where saved, else the head's own where
    tie_word_embeddings is true, else none; one rule for BERT's and RoBERTa's heads."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    if family == "bert":
        torch.manual_seed(0)
        write(perturb(T.BertForMaskedLM(T.BertConfig(**BERT, tie_word_embeddings=tie))), "bert", folder)
    else:
        save(family, folder, {"tie_word_embeddings": tie})
    tensors = load_file(folder / "model.safetensors")
    shared, decoder = HEAD_BIASES[family]
    for name in (shared, decoder):
        tensors.pop(name, None)
    bias = torch.randn(VOCAB)
    values = {"shared": (shared, bias), "decoder": (decoder, bias + 0.5)}
    tensors |= dict(values[x] for x in saved)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    hf = from_pretrained(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HFWarning)
        result = import_folder(folder, "x", tmp_path / "specs", tmp_path / "runs")
    unbiased = not tie and "decoder" not in saved
    assert any("transformers 5 adds no bias" in str(w.message) for w in caught) == unbiased
    assert result.spec.model.bias.lm_head == (not unbiased)
    assert difference(hf, load_trained_model(result.run_dir)[1], 12) <= 1e-5


# ------------------------------------------------------------------------- every config field


def roberta_rows(f: str) -> list[Case]:
    """The rows RoBERTa, XLM-RoBERTa, CamemBERT and data2vec-text share (their config classes are
    one)."""
    cls = f"{f}_cls"
    slow = f != "roberta"  # the two others one by one in the slow sweep
    return [
        case(  # the fields that take any value at once: each row below sets one
            f,
            tie_word_embeddings=False,
            layer_norm_eps=1e-3,
            initializer_range=0.5,
            hidden_dropout_prob=0.3,
            attention_probs_dropout_prob=0.3,
            classifier_dropout=0.2,
            use_cache=False,
            spec={"tie_embeddings": False},
        ),
        case(f, tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
        case(f, layer_norm_eps=1e-3, slow=True),
        case(f, hidden_act="gelu_python", slow=True),
        case(f, outcome="hidden_act", hidden_act="gelu_new", slow=slow),  # the head's GELU is erf's
        case(f, outcome="hidden_act", hidden_act="quick_gelu", slow=True),
        case(cls, hidden_act="relu", spec={"activation": "relu"}, slow=slow),  # no MLM head: any
        case(cls, hidden_act="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
        case(cls, outcome="hidden_act", hidden_act="quick_gelu", slow=True),
        case(f, type_vocab_size=2, spec={"type_vocab_size": 2}, slow=slow),
        case(cls, type_vocab_size=2, spec={"type_vocab_size": 2}, slow=True),
        case(cls, type_vocab_size=1, spec={"type_vocab_size": 2}, slow=slow),  # the row twice
        case(
            f,
            max_position_embeddings=40,
            spec={"max_seq_len": 40 - 1 - FAMILIES[f].base.get("pad_token_id", 1)},
        ),
        case(f, outcome="pad_token_id", json={"pad_token_id": None}, slow=slow),
        case(f, outcome="pad_token_id", json={"pad_token_id": 40}, slow=True),
        case(f, initializer_range=0.5, slow=True),
        case(f, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3, classifier_dropout=0.2, slow=True),
        case(f, bos_token_id=7, eos_token_id=8, slow=True),
        case(f, use_cache=False, slow=True),
        case(f, outcome="is_decoder", is_decoder=True, slow=slow),
        case(f, outcome="add_cross_attention", json={"add_cross_attention": True}, slow=True),
        case(
            f, outcome="position_embedding_type", json={"position_embedding_type": "relative_key"}, slow=True
        ),
        case(f, json={"position_embedding_type": "absolute"}, slow=True),  # transformers 4's key
        case(cls, num_labels=5, slow=True),
        case(cls, outcome="num_labels", id2label={0: "only"}, label2id={"only": 0}, slow=True),
        case(cls, outcome="problem_type", problem_type="regression", slow=slow),
        case(cls, problem_type="single_label_classification", slow=True),
        case(f, num_hidden_layers=1, num_attention_heads=4, intermediate_size=24, slow=True),
    ]


CASES: list[Case] = [
    *roberta_rows("roberta"),
    *roberta_rows("xlm-roberta"),
    *roberta_rows("camembert"),
    *roberta_rows("data2vec-text"),
    case(  # the fields that take any value at once: each row below sets one
        "distilbert",
        activation="relu",
        tie_word_embeddings=False,
        sinusoidal_pos_embds=True,
        dropout=0.3,
        attention_dropout=0.3,
        qa_dropout=0.3,
        seq_classif_dropout=0.3,
        initializer_range=0.5,
        spec={"activation": "relu", "tie_embeddings": False},
    ),
    case("distilbert", activation="relu", spec={"activation": "relu"}, slow=True),
    case("distilbert", activation="gelu_new", spec={"activation": "gelu_tanh"}, slow=True),
    case("distilbert", outcome="activation", activation="quick_gelu"),
    case("distilbert", tie_word_embeddings=False, spec={"tie_embeddings": False}, slow=True),
    # the table transformers computes, read as saved (as it reads it)
    case("distilbert", sinusoidal_pos_embds=True, spec={"positional.type": "learned"}, slow=True),
    case("distilbert", dropout=0.3, attention_dropout=0.3, slow=True),
    case("distilbert", qa_dropout=0.3, seq_classif_dropout=0.3, slow=True),  # other heads' dropout
    case("distilbert", initializer_range=0.5, slow=True),
    case("distilbert", pad_token_id=3, bos_token_id=2, eos_token_id=3, slow=True),
    case("distilbert", n_layers=1, n_heads=4, hidden_dim=24, slow=True),
    case("distilbert", max_position_embeddings=12, spec={"max_seq_len": 12}, slow=True),
    # DistilBERT's classifier: the body's rows are the masked LM's; export-hf refuses its ReLU pooler.
    case(
        "distilbert_cls",
        activation="relu",
        dropout=0.3,
        seq_classif_dropout=0.3,  # the head's dropout, while training
        spec={"activation": "relu", "pooler": True, "pooler_activation": "relu"},
        exported=False,
    ),
    case("distilbert_cls", num_labels=5, exported=False, slow=True),
    case("distilbert_cls", outcome="num_labels", id2label={0: "only"}, label2id={"only": 0}, slow=True),
    case("distilbert_cls", outcome="problem_type", problem_type="regression"),
    case("distilbert_cls", outcome="problem_type", problem_type="multi_label_classification", slow=True),
    case("distilbert_cls", problem_type="single_label_classification", exported=False, slow=True),
]


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


def _save_case(c: Case, folder: Path) -> None:
    save(c.family, folder, c.edits)
    edit_config(folder, c.json)


@pytest.mark.parametrize("c", _params(CASES))
def test_a_field_value_imports_to_transformers_outputs_or_is_refused_by_name(c: Case, tmp_path: Path) -> None:
    check(c, tmp_path, _save_case, difference)


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_every_config_field_has_a_case(model_type: str) -> None:
    """A field transformers adds to one of the four config classes fails this until a row of CASES
    says what it does (or the family's tiny base sets it)."""
    common = set(transformers.PretrainedConfig().to_dict())
    fields = set(transformers.AutoConfig.for_model(model_type).to_dict()) - common
    covered = set(UNREAD)
    for family in CLASSES[model_type]:
        covered |= set(FAMILIES[family].base)
        covered |= set().union(*(c.fields() for c in CASES if c.family == family))
    assert fields - covered == set()
