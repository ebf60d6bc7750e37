"""Hand-offs given odd input: a byte-level BPE whose steps onnxruntime-genai's tokenizer would
ignore, a Triton name prefix too long to leave room for the graph names, and a tokenizer file
named like the version folder of a Triton model."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfcompile.errors import BundleError, ExportError
from tfcompile.handoffs.genai import export_genai, genai_tokenizer
from tfcompile.handoffs.triton import export_triton


def byte_level_bpe(edit: Callable[[Tokenizer], None] = lambda t: None) -> bytes:
    """A small byte-level BPE as tfcompile trains one (GPT-2's steps), then ``edit``-ed."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["ab ab cd, cd. ab"] * 20, trainer=trainer)
    tokenizer.add_special_tokens(["[EOS]"])
    edit(tokenizer)
    return tokenizer.to_str().encode("utf-8")


def test_a_gpt2_like_byte_level_bpe_goes_as_it_is() -> None:
    data = byte_level_bpe()
    assert genai_tokenizer(data) == data


EDITS: dict[str, Callable[[Tokenizer], None]] = {
    # Each of these changes the tokenizers library's ids (or text), and onnxruntime-extensions
    # (0.18's genai) gives GPT-2's whatever the file says: "ROMEO" lowercased, " x" for "x",
    # "ab ab" as one pre-token, an [EOS] in front, "Ġab" for " ab".
    "normalizer": lambda t: setattr(t, "normalizer", normalizers.Lowercase()),
    "add_prefix_space: true": lambda t: setattr(
        t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)
    ),
    "use_regex: false": lambda t: setattr(
        t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    ),
    "post-processor": lambda t: setattr(
        t,
        "post_processor",
        processors.TemplateProcessing(single="[EOS] $A", special_tokens=[("[EOS]", t.token_to_id("[EOS]"))]),
    ),
    "decoder": lambda t: setattr(t, "decoder", decoders.Metaspace()),
}


@pytest.mark.parametrize("setting", EDITS)
def test_a_byte_level_bpe_with_steps_genai_ignores_is_refused(setting: str) -> None:
    with pytest.raises(ExportError, match=f"would ignore this tokenizer's {setting}: its ids"):
        genai_tokenizer(byte_level_bpe(EDITS[setting]))


def test_a_byte_level_post_processor_is_gpt2s_own() -> None:
    data = byte_level_bpe(lambda t: setattr(t, "post_processor", processors.ByteLevel()))
    assert genai_tokenizer(data) == data


# ------------------------------------------------------------------------ Triton


def edited_copy(bundle: Path, to: Path, edit: Callable[[Path, dict[str, Any]], None]) -> Path:
    shutil.copytree(bundle, to)
    manifest = json.loads((to / "manifest.json").read_text())
    edit(to, manifest)
    (to / "manifest.json").write_text(json.dumps(manifest))
    return to


def test_a_prefix_too_long_for_the_graph_names_is_the_users_to_change(
    char_bundle: Path, tmp_path: Path
) -> None:
    """A 96-character name is a valid model name, but "-model" and "-step" take it past 100: the
    name asked for is at fault, not the bundle's graph names."""
    with pytest.raises(
        ExportError, match=r"too long to name Triton models: '(a){96}-model' has 102 characters"
    ):
        export_triton(char_bundle, tmp_path / "repo", name="a" * 96)
    assert not (tmp_path / "repo").exists()
    long_folder = shutil.copytree(char_bundle, tmp_path / ("b" * 96))
    with pytest.raises(ExportError, match="pass a shorter name"):
        export_triton(long_folder, tmp_path / "repo")
    assert [f.name for f in export_triton(char_bundle, tmp_path / "repo", name="a" * 94)] == [
        "a" * 94 + "-model",
        "a" * 94 + "-step",
    ]


def test_a_tokenizer_named_like_the_version_folder_is_refused(char_bundle: Path, tmp_path: Path) -> None:
    """The manifest takes "1" as a file name, and the runtime loads such a bundle; written beside
    the model's version folder 1/, it failed half-way with "Is a directory"."""

    def rename(bundle: Path, manifest: dict[str, Any]) -> None:
        (bundle / "tokenizer.json").rename(bundle / "1")
        manifest["files"]["1"] = manifest["files"].pop("tokenizer.json")
        manifest["tokenizer"]["file"] = "1"
        assert manifest["files"]["1"] == hashlib.sha256((bundle / "1").read_bytes()).hexdigest()

    bundle = edited_copy(char_bundle, tmp_path / "bundle", rename)
    with pytest.raises(BundleError, match="its tokenizer's file name '1' is taken in a model folder"):
        export_triton(bundle, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging folder left


# ------------------------------------------------------------------------ GenAI's head counts


def with_spec(text: Callable[[str], str]) -> Callable[[Path, dict[str, Any]], None]:
    def edit(bundle: Path, manifest: dict[str, Any]) -> None:
        spec = bundle / "spec.yaml"
        spec.write_text(text(spec.read_text()))
        manifest["files"]["spec.yaml"] = hashlib.sha256(spec.read_bytes()).hexdigest()

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s + "\nnot_a_section: 1\n", r"its spec.yaml is not a spec \(.*not_a_section"),
        (
            lambda s: s.replace("n_kv_heads: 2", "n_kv_heads: 1", 1),
            r"gives \(n_kv_heads, head_dim\) \(1, 8\), but its step graph's cache holds \(2, 8\)",
        ),
    ],
)
def test_genai_refuses_a_spec_yaml_that_is_not_the_graphs_as_a_bundle_error(
    char_bundle: Path, tmp_path: Path, edit: Callable[[str], str], message: str
) -> None:
    """A spec.yaml that did not parse ended export-genai with a SpecError (a spec's error, exit 2);
    one whose heads were not the graph's wrote them into genai_config.json."""
    bundle = edited_copy(char_bundle, tmp_path / "bundle", with_spec(edit))
    with pytest.raises(BundleError, match=message):
        export_genai(bundle, tmp_path / "genai")
    assert not (tmp_path / "genai").exists()


def test_genai_pads_with_the_stop_token_where_the_vocabulary_has_no_pad_token(
    char_bundle: Path, tmp_path: Path
) -> None:
    """A char vocabulary with a stop token and no pad token padded with the model's least likely
    character: a prompt ending in it was read as padding (a space is rarely the least likely)."""
    space = json.loads((char_bundle / "tokenizer.json").read_text())["model"]["vocab"][" "]

    def stop_at_space(bundle: Path, manifest: dict[str, Any]) -> None:
        manifest["generation"]["stop_token_ids"] = [space]

    bundle = edited_copy(char_bundle, tmp_path / "bundle", stop_at_space)
    config = json.loads((export_genai(bundle, tmp_path / "genai") / "genai_config.json").read_text())["model"]
    assert config["eos_token_id"] == [space] and config["pad_token_id"] == config["bos_token_id"] == space
    with pytest.raises(ExportError, match=r"names its own end tokens \(\[\d+\]\): leave --end-token out"):
        export_genai(bundle, tmp_path / "chosen", end_token="$")


JSON_EDITS: dict[str, Callable[[dict], None]] = {
    # what an imported tokenizer.json may set that the tokenizers library reads and genai does not:
    # "hi [EOS] there" was [74, 75, 223, 2, ...] in genai, [74, 75, 2, ...] in the runtime (lstrip)
    **{
        f"added tokens' {flag}": lambda saved, flag=flag: saved["added_tokens"][-1].update({flag: True})
        for flag in ("lstrip", "rstrip", "single_word")
    },
    "model.end_of_word_suffix": lambda saved: saved["model"].update(end_of_word_suffix="</w>"),
}


@pytest.mark.parametrize("setting", JSON_EDITS)
def test_a_byte_level_bpe_with_token_settings_genai_ignores_is_refused(setting: str) -> None:
    saved = json.loads(byte_level_bpe())
    JSON_EDITS[setting](saved)
    with pytest.raises(ExportError, match=f"would ignore this tokenizer's {setting}: its ids"):
        genai_tokenizer(json.dumps(saved).encode())
