"""The causal-LM objective, and sampling through the shared search."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from tfcompile.models import DecoderLM
from tfcompile.search import sample_next
from tfcompile.tasks.causal_lm import IGNORE_INDEX, causal_lm_loss, generate


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


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_logits(temperature: float) -> None:
    logits = np.tile(np.array([[2.0, 0.0]]), (4000, 1))
    p0 = (sample_next(logits, temperature, rng=np.random.default_rng(0)) == 0).mean()
    expected = 1 / (1 + np.exp(-2.0 / temperature))
    assert p0 == pytest.approx(expected, abs=0.03)
