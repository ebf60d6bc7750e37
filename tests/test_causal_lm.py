"""The causal-LM objective, and sampling through the shared search."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from tfcompile.errors import ExportError
from tfcompile.models import DecoderLM
from tfcompile.search import Bans, sample_next
from tfcompile.spec.schema import CausalLMTask
from tfcompile.tasks.causal_lm import IGNORE_INDEX, bans, causal_lm_loss, generate
from tfcompile.train import load_run_spec, load_trained_model


def test_loss_ignores_padding_targets() -> None:
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    padded = targets.clone()
    padded[1, 3:] = IGNORE_INDEX
    real = torch.cat([logits[0], logits[1, :3]])
    expected = F.cross_entropy(real, torch.cat([targets[0], targets[1, :3]]))
    torch.testing.assert_close(causal_lm_loss(logits, padded), expected)


def test_greedy_forms_agree() -> None:
    logits = np.random.default_rng(0).standard_normal((4, 30))
    greedy = logits.argmax(-1)
    rng = np.random.default_rng(1)
    assert np.array_equal(sample_next(logits, temperature=0), greedy)
    assert np.array_equal(sample_next(logits, top_k=1, rng=rng), greedy)
    assert np.array_equal(sample_next(logits, top_p=1e-6, rng=rng), greedy)
    for tiny in (1e-6, 1e-320, 5e-324):  # logits over these overflow: NaN probabilities, were a crash
        assert np.array_equal(sample_next(logits, temperature=tiny, rng=rng), greedy)


def test_top_k_and_top_p_only_draw_from_the_kept_tokens() -> None:
    logits = np.tile(np.array([[4.0, 3.0, 2.0, -1.0, -2.0]]), (500, 1))
    rng = np.random.default_rng(0)
    assert set(sample_next(logits, top_k=2, rng=rng).tolist()) == {0, 1}
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert probs[:2].sum() < 0.95 < probs[:3].sum()
    assert set(sample_next(logits, top_p=0.95, rng=rng).tolist()) == {0, 1, 2}


def test_sampling_is_reproducible_with_a_seed_and_reads_the_last_context_tokens() -> None:
    model = DecoderLM(tiny_model())  # max_seq_len 16: 3 + 20 tokens slide past it
    prompt = torch.randint(0, 50, (1, 3))

    def draw() -> torch.Tensor:
        return generate(model, prompt, 20, temperature=1.0, seed=7)

    out = draw()
    assert out.shape == (1, 23) and torch.equal(out, draw())
    assert torch.equal(out[:, :3], prompt)
    greedy = generate(model, prompt, 20, temperature=0)
    with torch.no_grad():  # each token is the argmax after the 16 tokens before it, at most
        for t in range(3, 23):
            window = greedy[:, max(0, t - 16) : t]
            assert greedy[0, t] == model(window)[0, -1].argmax()


def test_an_embedding_table_padded_past_the_tokenizer_never_yields_a_padded_id() -> None:
    model = DecoderLM(tiny_model(bias={"lm_head": True}))  # 50 rows; say the tokenizer has 40
    with torch.no_grad():
        model.lm_head.bias[40:] = 100.0  # the padded rows would win every step
    prompt = torch.randint(0, 40, (2, 3))
    assert (generate(model, prompt, 8, temperature=0)[:, 3:] >= 40).all()
    for draw in (dict(temperature=0), dict(temperature=1.0, seed=3)):
        assert (generate(model, prompt, 8, emitted=40, **draw)[:, 3:] < 40).all()


def test_a_row_the_bans_leave_no_token_ends_there() -> None:
    """no_repeat_ngram_size 1 over 50 tokens: a row takes each token its prompt lacks once, then
    ends; rows that end apart cannot stack, and are refused by name rather than by torch."""
    model = DecoderLM(tiny_model())
    once = Bans(no_repeat_ngram=1)
    alone = generate(model, torch.tensor([[0, 1, 2]]), 60, temperature=0, bans=once)
    assert sorted(alone[0, 3:].tolist()) == list(range(3, 50))
    with pytest.raises(ValueError, match=r"the bans ended rows at \[47, 49\] tokens"):
        generate(model, torch.tensor([[0, 1, 2], [0, 0, 0]]), 60, temperature=0, bans=once)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_logits(temperature: float) -> None:
    logits = np.tile(np.array([[2.0, 0.0]]), (4000, 1))
    p0 = (sample_next(logits, temperature, rng=np.random.default_rng(0)) == 0).mean()
    expected = 1 / (1 + np.exp(-2.0 / temperature))
    assert p0 == pytest.approx(expected, abs=0.03)


def banned_run(run: Path, to: Path, overrides: list[str]) -> Path:
    """A copy of a run whose spec's task says ``overrides``."""
    from tfcompile.spec import dump_spec, load_spec

    shutil.copytree(run, to)
    spec = load_spec(to / "spec.yaml", overrides)
    (to / "spec.yaml").write_text(dump_spec(spec))
    return to


@pytest.mark.slow
def test_the_tasks_bans_reach_the_manifest_and_the_bundle_generates_as_pytorch_does(
    char_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """task.suppressed_tokens and banned_sequences (strings of the run's tokenizer), min_new_tokens
    and no_repeat_ngram_size: the manifest gives them as ids; the bundle's greedy generation (a batch
    with a padded row) chooses PyTorch's tokens under the same bans, and `tfcompile sample` too,
    which differ from the plain ones; the bundle ends no text at its stop token (the token the
    bans would choose first) before min_new_tokens; a token the tokenizer lacks or a stop token
    among the suppressed fails the export by name."""
    from tfcompile.cli import main
    from tfcompile.export import Source, export_bundle
    from tfcompile.runtime import LanguageModel, load

    plain = load(char_bundle)
    assert isinstance(plain, LanguageModel) and plain.tokenizer is not None
    vocab = plain.tokenizer.get_vocab()
    _, trained = load_trained_model(char_bundle.parent / "run", "last")
    assert isinstance(trained, DecoderLM)
    prompts = [plain.tokenizer.encode(text).ids for text in ("the", "ROMEO:\nthe the")]
    banned = Bans((vocab["e"], vocab[" "]), 0, 2, ((vocab["t"], vocab["h"]),))
    first = int(generate(trained, torch.tensor([prompts[0]]), 1, temperature=0, bans=banned)[0, -1])
    stop = plain.tokenizer.id_to_token(first)
    overrides = [f"task.stop_tokens=[{json.dumps(stop)}]", "task.suppressed_tokens=[e, ' ']"]
    overrides += ["task.min_new_tokens=5", "task.no_repeat_ngram_size=2", "task.banned_sequences=[[t, h]]"]
    overrides += ["task.min_length=3"]  # the first prompt's length: it holds off no stop token
    run = banned_run(char_bundle.parent / "run", tmp_path / "run", overrides)
    export_bundle(None, Source(run=run), tmp_path / "bundle")
    model = load(tmp_path / "bundle")
    assert isinstance(model, LanguageModel)
    g = model.generation
    assert (g.suppressed_ids, g.min_new_tokens, g.no_repeat_ngram_size) == ([vocab["e"], vocab[" "]], 5, 2)
    assert g.banned_sequences == [[vocab["t"], vocab["h"]]] and g.min_length == 3
    assert g.stop_token_ids == [first]
    for prompt in prompts:
        ours = model.generate(np.array([prompt]), 24, temperature=0, stop=False)
        pytorch = generate(trained, torch.tensor([prompt]), 24, temperature=0, bans=banned)
        assert ours.tolist() == pytorch.tolist()
        assert ours.tolist() != plain.generate(np.array([prompt]), 24, temperature=0, stop=False).tolist()
    width = len(prompts[1])
    padded = [[0] * (width - len(prompts[0])) + prompts[0], prompts[1]]
    mask = [[0] * (width - len(prompts[0])) + [1] * len(prompts[0]), [1] * width]
    batch = model.generate(np.array(padded), 24, temperature=0, attention_mask=np.array(mask), stop=False)
    alone = model.generate(np.array([prompts[0]]), 24, temperature=0, stop=False)
    assert batch[0, width - len(prompts[0]) :].tolist() == alone[0].tolist()
    assert model.generate(np.array([prompts[0]]), 24, temperature=0, min_new_tokens=0).tolist() == [
        [*prompts[0], first]
    ]
    new = model.generate(np.array([prompts[0]]), 24, temperature=0)[0, len(prompts[0]) :].tolist()
    assert first not in new[:5] and len(new) > 5
    assert main(["sample", str(run), "--prompt", "the", "--max-new-tokens", "24", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == model.generate_text("the", 24, temperature=0, stop=False) + "\n"
    bad = banned_run(run, tmp_path / "bad", ["task.suppressed_tokens=[e, Ω]"])
    with pytest.raises(ExportError, match="'Ω' is no token"):
        export_bundle(None, Source(run=bad), tmp_path / "out")
    spec = load_run_spec(run)
    assert isinstance(spec.task, CausalLMTask)
    with pytest.raises(ExportError, match=rf"holds the stop token ids \[{vocab['e']}\] \(the eos"):
        bans(spec.task, run, [vocab["e"]], ExportError)  # an eos the spec's tokens: section names


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ("stop_tokens: [a], suppressed_tokens: [b, a]", "suppressed_tokens"),
        ("max_new_tokens: 4, min_new_tokens: 5", "min_new_tokens"),
        ("no_repeat_ngram_size: -1", "no_repeat_ngram_size"),
        ("suppressed_tokens: [a, b, a]", "suppressed_tokens"),
        ("banned_sequences: [[a, b], [a]]", "banned_sequences.1"),  # one token: suppressed_tokens
    ],
)
def test_a_bad_ban_is_located(task: str, field: str) -> None:
    from tfcompile.spec import SpecError, parse_spec

    model = "model: {family: decoder, vocab_size: 20, d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 8}"
    with pytest.raises(SpecError) as error:
        parse_spec(f"{model}\ntask: {{type: causal_lm, {task}}}\n")
    assert [issue.path for issue in error.value.issues] == [f"task.{field}"]
