"""Feed-forward sublayers against FFN(x) = f(xW1 + b1)W2 + b2 and the gated forms."""

import math

import pytest
import torch
import torch.nn.functional as F

from tfcompile.nn import ACTIVATIONS
from tfcompile.nn.feedforward import FeedForward

PLAIN = {
    "relu": lambda x: torch.clamp(x, min=0),
    "relu2": lambda x: torch.clamp(x, min=0) ** 2,
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * torch.sigmoid(x),
}
GATED = {"swiglu": PLAIN["silu"], "geglu": PLAIN["gelu"], "geglu_tanh": PLAIN["gelu_tanh"]}


def test_the_registry_holds_exactly_the_documented_activations() -> None:
    """And GPT-OSS's clamped SwiGLU, held to its formula in tests/test_sinks_clamped_swiglu.py."""
    assert set(ACTIVATIONS.names()) == set(PLAIN) | set(GATED) | {"swiglu_clamped"}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_ffn_matches_formula(name: str) -> None:
    ffn = FeedForward(8, 24, name, bias=True)
    x = torch.randn(2, 5, 8)
    h = PLAIN[name](x @ ffn.w_in.weight.T + ffn.w_in.bias)
    torch.testing.assert_close(ffn(x), h @ ffn.w_out.weight.T + ffn.w_out.bias, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(GATED))
def test_gated_ffn_matches_formula(name: str) -> None:
    ffn = FeedForward(8, 24, name, bias=False)
    w_gate, w_up = ffn.w_in.weight.chunk(2, dim=0)
    x = torch.randn(2, 5, 8)
    expected = (GATED[name](x @ w_gate.T) * (x @ w_up.T)) @ ffn.w_out.weight.T
    torch.testing.assert_close(ffn(x), expected, atol=1e-5, rtol=1e-5)
    assert ffn.w_in.out_features == 48  # gate and up fused


def test_unknown_activation_names_the_choices() -> None:
    with pytest.raises(KeyError, match="did you mean 'swiglu'"):
        FeedForward(8, 16, "swiglo", bias=False)


def test_gelu_registry_entry_is_exact_gelu() -> None:
    x = torch.randn(100)
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), F.gelu(x))
