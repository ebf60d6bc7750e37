"""`tfcompile import` of mT5 (``MT5ForConditionalGeneration``): T5 v1.1's model under another
model_type, whose output transformers 5 never scales. Held to transformers' logits (float32, with
and without padding), its parameter count, and export-hf's round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import VOCAB, from_pretrained, max_difference, perturb, random_ids, write

from tfcompile.hf.errors import HFError, HFWarning
from tfcompile.hf.exporter import export_hf
from tfcompile.hf.importer import import_folder
from tfcompile.train.runs import load_trained_model

transformers = pytest.importorskip("transformers")
C = transformers
TINY = dict(
    vocab_size=VOCAB,
    d_model=16,
    d_kv=6,
    d_ff=32,
    num_layers=1,
    num_decoder_layers=2,
    num_heads=3,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
    decoder_start_token_id=0,
    n_positions=32,
)


def saved(folder: Path, untied: bool = True, **edits: Any) -> None:
    """A tiny mT5 saved as the published ones are: a head of its own, tie_word_embeddings false in
    config.json (transformers 5 writes true, then unties a loaded head that differs), ``edits``
    written into config.json."""
    torch.manual_seed(0)
    model = C.MT5ForConditionalGeneration(C.MT5Config(**TINY))
    if untied:
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    write(perturb(model), "t5", folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"tie_word_embeddings": not untied} | edits
    (folder / "config.json").write_text(json.dumps(config))


def imported(tmp_path: Path, **kwargs: Any) -> tuple[Any, Any, torch.nn.Module]:
    saved(tmp_path / "hf", **kwargs)
    hf = from_pretrained(tmp_path / "hf")
    result = import_folder(tmp_path / "hf", "mt5", tmp_path / "specs", tmp_path / "runs")
    spec, model = load_trained_model(result.run_dir)
    return hf, spec, model


def test_an_imported_mt5_gives_transformers_outputs_and_parameter_count(tmp_path: Path) -> None:
    hf, spec, model = imported(tmp_path)
    assert isinstance(hf, C.MT5ForConditionalGeneration)
    assert (spec.model.scale_output, spec.model.tie_embeddings, spec.model.activation) == (
        False,
        False,
        "geglu_tanh",
    )
    for padded in (False, True):
        assert max_difference(hf, model, padded) <= 1e-5, padded
    assert spec.parameter_count() == hf.num_parameters() == sum(p.numel() for p in model.parameters())


def test_an_mt5_config_is_never_scaled_as_transformers_5_computes_it(tmp_path: Path) -> None:
    """A tied mT5 warns (transformers 4 scales it, 5 does not); a scale_decoder_outputs in its
    config.json, which MT5ForConditionalGeneration never reads, changes nothing."""
    with pytest.warns(HFWarning, match="transformers 4 multiplies"):
        hf, spec, model = imported(tmp_path, untied=False, scale_decoder_outputs=True)
    assert spec.model.tie_embeddings and not spec.model.scale_output
    assert max_difference(hf, model, padded=True) <= 1e-5


def test_an_imported_mt5_writes_back_as_a_t5_transformers_computes_alike(tmp_path: Path) -> None:
    hf, _, _ = imported(tmp_path)
    export_hf(tmp_path / "runs" / "mt5", tmp_path / "back")
    back, info = from_pretrained(tmp_path / "back", loading_info=True)
    assert isinstance(back, C.T5ForConditionalGeneration)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ids, target = random_ids(2, 9), random_ids(2, 5, seed=2)
    with torch.no_grad():
        ours = back(input_ids=ids, decoder_input_ids=target).logits
        theirs = hf(input_ids=ids, decoder_input_ids=target).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_another_head_class_under_mt5_is_refused_by_name(tmp_path: Path) -> None:
    saved(tmp_path / "hf", architectures=["MT5EncoderModel"])
    with pytest.raises(HFError, match=r"architectures.*MT5EncoderModel.*MT5ForConditionalGeneration"):
        import_folder(tmp_path / "hf", "mt5", tmp_path / "specs", tmp_path / "runs")


def test_mt5_config_fields_are_t5s_so_t5s_field_table_covers_them() -> None:
    """tests/test_hf_fields.py holds every T5Config field to an outcome; mT5's are the same fields,
    less scale_decoder_outputs (which MT5ForConditionalGeneration does not read, as the test above
    holds), plus two T5Config leaves out of config.json when unset, decoder_start_token_id and
    bos_token_id (the decoder's start token, read as T5's are). A field mT5 adds fails this
    until it has its own row."""
    t5, mt5 = set(C.T5Config().to_dict()), set(C.MT5Config().to_dict())
    assert mt5 - t5 == {"decoder_start_token_id", "bos_token_id"}
    assert t5 - mt5 == {"scale_decoder_outputs"}
