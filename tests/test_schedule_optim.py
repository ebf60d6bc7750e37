"""Learning-rate schedules against their formulas, and weight decay on matrices only."""

import math

import pytest
import torch
from helpers import tiny_model

from tfcompile.models import DecoderLM
from tfcompile.spec.schema import ConstantSchedule, CosineSchedule, OptimizerSpec, VaswaniSchedule
from tfcompile.train.optim import build_optimizer, parameter_groups
from tfcompile.train.schedule import learning_rate

OPT = OptimizerSpec(lr=1e-3)


@pytest.mark.parametrize("step", [1, 10, 3999, 4000, 4001, 10000, 100000])
def test_vaswani_schedule_matches_formula(step: int) -> None:
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert learning_rate(step, VaswaniSchedule(warmup_steps=4000), OPT, 100000, 512) == pytest.approx(
        expected
    )


def test_vaswani_schedule_peaks_at_warmup() -> None:
    lrs = [learning_rate(s, VaswaniSchedule(warmup_steps=100), OPT, 1000, 256) for s in range(1, 1000)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 100
    assert lrs[99] == pytest.approx(256**-0.5 * 100**-0.5)


def test_cosine_warms_up_then_decays_to_the_floor() -> None:
    sched = CosineSchedule(warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(5, sched, OPT, 110, 64) == pytest.approx(5e-4)
    assert learning_rate(10, sched, OPT, 110, 64) == pytest.approx(1e-3)
    assert learning_rate(60, sched, OPT, 110, 64) == pytest.approx(
        1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi / 2))
    )
    assert learning_rate(110, sched, OPT, 110, 64) == pytest.approx(1e-4)


def test_constant_schedule() -> None:
    assert learning_rate(1, ConstantSchedule(), OPT, 10, 64) == 1e-3
    assert learning_rate(2, ConstantSchedule(warmup_steps=4), OPT, 10, 64) == pytest.approx(5e-4)


def test_weight_decay_skips_norms_and_biases() -> None:
    model = DecoderLM(tiny_model(bias={"qkv": True, "lm_head": True}, tie_embeddings=False))
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(n.endswith("bias") or "norm" in n for n in skipped)
    assert "blocks.0.attn_norm.weight" in skipped and "blocks.0.attn.qkv.bias" in skipped
    assert "lm_head.bias" in skipped
    assert {
        "blocks.0.attn.qkv.weight",
        "blocks.0.ffn.w_in.weight",
        "lm_head.weight",
        "embed.weight",
    } <= decayed
    assert len(decayed) + len(skipped) == len(list(model.parameters()))


def test_decay_acts_only_on_the_decayed_group() -> None:
    model = DecoderLM(tiny_model())
    opt = build_optimizer(model, OptimizerSpec(lr=0.1, weight_decay=0.5), torch.device("cpu"))
    norm_before = model.final_norm.weight.detach().clone()
    matrix_before = model.blocks[0].attn.qkv.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(model.final_norm.weight, norm_before)  # zero grad, no decay: unchanged
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, matrix_before * (1 - 0.1 * 0.5))
