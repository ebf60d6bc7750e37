"""Norms against their formulas (notes: cmu-11711-transformers.txt, "Layer Normalization", "RMSNorm")."""

from pathlib import Path

import pytest
import torch

from tfcompile.nn import NORMS
from tfcompile.nn.norms import LayerNorm, RMSNorm


def _with_random_affine(norm: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        norm.weight.normal_()
        if norm.bias is not None:
            norm.bias.normal_()
    return norm


def test_layernorm_matches_formula() -> None:
    x = torch.randn(3, 5, 16) * 4 + 2
    norm = _with_random_affine(LayerNorm(16, eps=1e-5, bias=True))
    mu = x.mean(-1, keepdim=True)
    sigma = ((x - mu) ** 2).mean(-1, keepdim=True).add(1e-5).sqrt()  # biased variance, as in the notes
    expected = norm.weight * (x - mu) / sigma + norm.bias
    torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)


def test_layernorm_without_bias_has_no_shift() -> None:
    norm = LayerNorm(8, bias=False)
    assert norm.bias is None
    assert sum(p.numel() for p in norm.parameters()) == 8


def test_rmsnorm_matches_formula() -> None:
    x = torch.randn(3, 5, 16) * 3 + 1
    norm = _with_random_affine(RMSNorm(16, eps=1e-6))
    rms = (x**2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(norm(x), x / rms * norm.weight, atol=1e-5, rtol=1e-5)
    assert norm.bias is None  # RMSNorm drops LayerNorm's mean and bias


def test_rmsnorm_keeps_low_precision_dtype() -> None:
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert RMSNorm(8)(x).dtype == torch.bfloat16


@pytest.mark.parametrize("name", NORMS.names())
def test_every_registered_norm_builds_and_keeps_shape(name: str) -> None:
    norm = NORMS[name](16, eps=1e-5, bias=False)
    assert norm(torch.randn(2, 3, 16)).shape == (2, 3, 16)


@pytest.mark.parametrize("eps", [1e-8, 1e-12])
def test_an_rmsnorm_of_a_tiny_epsilon_keeps_it_in_onnx(eps: float, tmp_path: Path) -> None:
    """The exporter's optimizer drops the addition of a scalar within 1e-8 of 0 (Helium's epsilon is
    1e-8): a zero row (a pad token's embedding) then normalised to 0 / 0. The graph keeps it."""
    import onnxruntime

    norm = RMSNorm(16, eps=eps).eval()
    x = torch.zeros(1, 3, 16)
    x[0, 1] = torch.randn(16)
    path = tmp_path / "norm.onnx"
    torch.onnx.export(norm, (x,), str(path), opset_version=18, dynamo=True, verbose=False)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(out), norm(x), atol=1e-6)
