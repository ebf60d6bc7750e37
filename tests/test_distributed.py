"""Data parallelism: torchrun with two gloo processes on the CPU against one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from tfcompile.spec import load_spec
from tfcompile.tasks import build_model
from tfcompile.train import Trainer, load_trained_model, read_metrics
from tfcompile.train.distributed import World

SPEC = ROOT / "specs" / "shakespeare-char.yaml"
# Dropout off: each process draws its own masks, so only a model without dropout can match.
TINY = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.max_seq_len=32",
    "model.dropout={embedding: 0.0, attention: 0.0, residual: 0.0}",
    "train.batch_size=8",
    "train.grad_accum=2",
    "train.steps=2",
    "train.optimizer.lr=1.0e-2",
    "train.schedule={type: constant}",  # two steps at the full rate: the weights must move
    "train.eval_interval=100",
    "train.eval_batches=2",
    "train.log_interval=1",
]


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, "-m", "tfcompile", *args], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )


# 16 experts, one per token (its weight its router probability): on each rank's 4 x 32 tokens some
# expert has none, and DDP still needs its gradient. No load-balancing loss: each rank's is of its
# own tokens, which one process's is not; the selection bias's update counts every rank's choices.
MIXTURE = [
    "model.moe={experts: 16, top_k: 1, d_ff: 16, balance_loss: 0, selection_bias: true, bias_update: 0.01}"
]


@pytest.mark.parametrize(
    "model", [[], pytest.param(MIXTURE, marks=pytest.mark.slow)], ids=["dense", "mixture of experts"]
)
def test_two_ranks_take_the_same_steps_as_one_process_over_the_whole_batch(
    model: list[str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    overrides = [*TINY, *model, f"train.runs_dir={runs}"]
    result = torchrun(2, "train", str(SPEC), *(f"--set={o}" for o in overrides), "--set=train.name=two")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("finished at step 2") == 1  # rank 0 alone reports
    single = Trainer(load_spec(SPEC, [*overrides, "train.name=one"]), runs / "one", show_progress=False)
    single.train()

    _, two = load_trained_model(runs / "two")
    spec, one = load_trained_model(runs / "one")
    for (name, a), b in zip(two.state_dict().items(), one.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)
    torch.manual_seed(spec.train.seed)
    initial = build_model(spec)  # the weights both started from: the steps did move them
    assert not torch.allclose(initial.lm_head.weight, one.lm_head.weight, atol=1e-3)
    # One metrics line per logged step, from rank 0, with the loss averaged over both ranks.
    two_log, one_log = read_metrics(runs / "two"), read_metrics(runs / "one")
    assert [r["step"] for r in two_log] == [r["step"] for r in one_log]
    for a, b in zip(two_log, one_log, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)

    # The run resumes in a world of another size: here, one process.
    longer = load_spec(SPEC, [*overrides, "train.name=two", "train.steps=3"])
    resumed = Trainer(longer, runs / "two", resume=True, show_progress=False)
    assert resumed.step == 2 and resumed.train().step == 3


def test_a_batch_that_does_not_split_evenly_is_refused(tmp_path: Path) -> None:
    overrides = [*TINY, "train.batch_size=7", f"train.runs_dir={tmp_path}"]
    result = torchrun(2, "train", str(SPEC), *(f"--set={o}" for o in overrides))
    assert result.returncode != 0
    message = "train.batch_size (7) is the global batch and must divide evenly among the 2 processes"
    # Each process prints the message alone (torchrun then reports that they failed).
    assert message in result.stderr and "tfcompile/train/" not in result.stderr


def test_each_rank_takes_its_own_contiguous_share() -> None:
    shares = [World(rank, rank, 4).rows(12) for rank in range(4)]
    assert [(s.start, s.stop) for s in shares] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert World().rows(12) == slice(0, 12) and World().is_main and not World().distributed
