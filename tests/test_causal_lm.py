"""The causal-LM objective and sampling."""

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from tfcompile.models import DecoderLM
from tfcompile.tasks import IGNORE_INDEX, causal_lm_loss, generate, sample_next


def test_loss_ignores_padding_targets() -> None:
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    padded = targets.clone()
    padded[1, 3:] = IGNORE_INDEX
    real = torch.cat([logits[0], logits[1, :3]])
    expected = F.cross_entropy(real, torch.cat([targets[0], targets[1, :3]]))
    torch.testing.assert_close(causal_lm_loss(logits, padded), expected)


def test_greedy_forms_agree() -> None:
    logits = torch.randn(4, 30)
    greedy = logits.argmax(-1)
    assert torch.equal(sample_next(logits, temperature=0), greedy)
    assert torch.equal(sample_next(logits, top_k=1), greedy)
    assert torch.equal(sample_next(logits, top_p=1e-6), greedy)


def test_top_k_and_top_p_only_draw_from_the_kept_tokens() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, -1.0, -2.0]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, top_k=2, generator=g).tolist()) == {0, 1}
    probs = logits[0].softmax(-1)
    assert probs[:2].sum() < 0.95 < probs[:3].sum()
    assert set(sample_next(logits, top_p=0.95, generator=g).tolist()) == {0, 1, 2}


def test_sampling_is_reproducible_with_a_seed() -> None:
    model = DecoderLM(tiny_model())
    prompt = torch.randint(0, 50, (1, 3))

    def draw() -> torch.Tensor:
        return generate(model, prompt, 20, 16, temperature=1.0, generator=torch.Generator().manual_seed(7))

    out = draw()
    assert out.shape == (1, 23) and torch.equal(out, draw())
    assert torch.equal(out[:, :3], prompt)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_logits(temperature: float) -> None:
    logits = torch.tensor([[2.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, temperature, generator=g) for _ in range(4000)])
    p0 = (draws == 0).float().mean().item()
    assert p0 == pytest.approx(torch.softmax(logits[0] / temperature, -1)[0].item(), abs=0.03)
