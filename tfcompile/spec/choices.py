"""The names a spec may use for each kind of building block, declared without torch.

The schema validates against these names; ``tfcompile.nn`` maps each one to its implementation.
A test checks that the two agree both ways (tests/test_registries.py), so adding a norm is one
name here and one registered block in ``nn/``.
"""

from __future__ import annotations

from typing import Literal, get_args

NormName = Literal["layernorm", "rmsnorm"]
NORMS: tuple[str, ...] = get_args(NormName)

ActivationName = Literal[
    "relu", "relu2", "gelu", "gelu_tanh", "silu", "swiglu", "swiglu_clamped", "geglu", "geglu_tanh"
]
ACTIVATIONS: tuple[str, ...] = get_args(ActivationName)
# The gated ones compute f(x W_gate) * (x W_up) (Shazeer 2020): the feed-forward's first matrix is
# twice as wide, and its default width is 2/3 of a plain one's. gelu_tanh and geglu_tanh take
# GELU's tanh approximation (GPT-2's "gelu_new", T5 v1.1's gated-gelu); relu2 is the squared ReLU,
# relu(x)^2 (So et al. 2021, Primer; Nemotron's and Arcee's). swiglu_clamped is GPT-OSS's:
# g * sigmoid(1.702 g) * (u + 1), the gate g clamped to at most 7 and the up projection u to [-7, 7].
GATED = frozenset({"swiglu", "swiglu_clamped", "geglu", "geglu_tanh"})
