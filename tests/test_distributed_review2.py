"""Multi-process training under review: torchrun's environment, a process that stops, memory per
process. The processes are simulated where a real torchrun is not needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from helpers import ROOT
from test_distributed import TINY, torchrun

from tfcompile.spec import load_spec
from tfcompile.tasks.task import Batch, Task
from tfcompile.train import load_trained_model
from tfcompile.train.batches import BatchStream
from tfcompile.train.device import Placement
from tfcompile.train.distributed import World, WorldError, join_world
from tfcompile.train.runs import TrainError

SPEC = ROOT / "specs" / "shakespeare-char.yaml"
# What a gloo collective raises when the process at the other end was killed.
GLOO_LOST = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:20392. This is typically caused by a remote worker crashing."
)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (
            {"WORLD_SIZE": "2"},
            "WORLD_SIZE is 2 in the environment, but RANK, MASTER_ADDR, MASTER_PORT are missing",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "0"},
            "but MASTER_ADDR, MASTER_PORT are missing: start the processes",
        ),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE is 'two' in the environment, not a number of processes"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE is '0' in the environment"),
        (
            {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
            "RANK is 2 in the environment, not below WORLD_SIZE (2)",
        ),
    ],
)
def test_an_environment_that_torchrun_did_not_make_is_named(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], message: str
) -> None:
    """A WORLD_SIZE left in a shell, or set by a scheduler without the rest, was a KeyError, a
    ValueError from the rendezvous, or a wait for processes that never come."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(WorldError) as raised:
        join_world("cpu")
    assert message in str(raised.value)


def test_a_collective_that_lost_another_process_is_one_named_error() -> None:
    """A process whose partner was killed (or failed with its own error) said so in a gloo (or NCCL)
    traceback; it now says that another process stopped, and which checkpoint is intact."""
    world = World(rank=0, local_rank=0, size=2)
    with (
        pytest.raises(WorldError) as raised,
        world.stops_with_others(lambda: "the checkpoint of step 4 is intact"),
    ):
        raise RuntimeError(GLOO_LOST)
    assert str(raised.value) == (
        "process 0 of 2 stops: another process of the run stopped (the first failure torchrun reports "
        "says why); the checkpoint of step 4 is intact"
    )
    with pytest.raises(WorldError), world.stops_with_others(str):
        raise torch.distributed.DistBackendError("NCCL communicator was aborted")
    # Any other failure, or one in a world of one, is left as it is.
    with pytest.raises(RuntimeError, match="shape mismatch"), world.stops_with_others(str):
        raise RuntimeError("shape mismatch")
    with pytest.raises(RuntimeError, match="Connection closed") as alone, World().stops_with_others(str):
        raise RuntimeError(GLOO_LOST)
    assert not isinstance(alone.value, WorldError)


def test_memory_is_checked_for_the_rows_each_process_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """train.batch_size is the global batch: a process holds 1/N of its rows, so a batch that fits
    on each of 8 GPUs was refused as if one held it all."""
    spec = load_spec(SPEC, ["train.batch_size=4096"])
    state = 16 * (spec.parameter_count() or 0)
    outputs = 2 * 4096 * spec.context_length * spec.model.d_model  # d_model exceeds the 65 characters
    monkeypatch.setattr(Placement, "memory", lambda self: state + outputs)
    with pytest.raises(TrainError, match=r"for one batch's outputs \(4,096 x 256 tokens\)"):
        Placement(torch.device("cpu"), World(), "fp32").check_fits(spec)
    Placement(torch.device("cpu"), World(0, 0, 8), "fp32").check_fits(spec)  # 512 rows each: fits
    monkeypatch.setattr(Placement, "memory", lambda self: state)
    share = r"\(512 x 256 tokens, this process's share of the 4,096 rows\)"
    with pytest.raises(TrainError, match=share):
        Placement(torch.device("cpu"), World(0, 0, 8), "fp32").check_fits(spec)


class _Validation:
    """A task's validation batches: 8 rows, then a last one of 3 (a split that ends there)."""

    def eval_batches(self, count: int, size: int, generator_for: Callable[[int], Any]) -> Iterator[Batch]:
        assert (count, size) == (2, 8)
        yield {"input_ids": torch.arange(16).view(8, 2), "labels": torch.arange(8)}
        yield {"input_ids": torch.arange(6).view(3, 2), "labels": torch.arange(8, 11)}


def test_each_process_evaluates_every_row_in_pieces_of_its_training_share() -> None:
    """Every process evaluated each global validation batch at once: with train.batch_size set for
    8 GPUs, 8 times the rows one holds in training (the whole batch's logits), where training fit."""
    train = load_spec(SPEC, ["train.batch_size=8", "train.eval_batches=2"]).train
    task = cast(Task, _Validation())
    pieces = list(BatchStream(task, train, World(1, 1, 2), torch.device("cpu")).validation())
    assert [len(p["labels"]) for p in pieces] == [4, 4, 3]
    assert torch.cat([p["labels"] for p in pieces]).tolist() == list(range(11))  # every row, once, in order
    assert torch.equal(torch.cat([p["input_ids"] for p in pieces[:2]]), torch.arange(16).view(8, 2))
    whole = list(BatchStream(task, train, World(), torch.device("cpu")).validation())
    assert [len(p["labels"]) for p in whole] == [8, 3]  # one process: the batches as they are


# ------------------------------------------------------------------ with loop.py's patch: slow


def _distributed_run(tmp_path: Path, name: str, *overrides: str) -> list[str]:
    return [
        "train",
        str(SPEC),
        *(f"--set={o}" for o in [*TINY, f"train.runs_dir={tmp_path}", f"train.name={name}", *overrides]),
    ]


@pytest.mark.slow
def test_a_resumed_run_draws_the_dropout_masks_of_one_that_never_stopped(tmp_path: Path) -> None:
    """Under torchrun each process reseeded its dropout once, from the step it started at: a run
    stopped at step 2 and resumed drew other masks than one that never stopped (weights 1e-3 apart)."""
    dropout = ["model.dropout={embedding: 0.1, attention: 0.1, residual: 0.1}"]
    constant = "train.schedule={type: constant, warmup_steps: 0}"
    for name, steps in (("whole", 4), ("stopped", 2)):
        result = torchrun(2, *_distributed_run(tmp_path, name, *dropout, constant, f"train.steps={steps}"))
        assert result.returncode == 0, result.stderr[-3000:]
    result = torchrun(2, "train", "--resume", str(tmp_path / "stopped"), "--set=train.steps=4")
    assert result.returncode == 0, result.stderr[-3000:]
    _, whole = load_trained_model(tmp_path / "whole")
    _, resumed = load_trained_model(tmp_path / "stopped")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_a_killed_process_stops_the_others_with_one_line(tmp_path: Path) -> None:
    """The process left behind when another was killed printed gloo's traceback
    ('Connection closed by peer ... GLHF!'); it now says what happened and which checkpoint is intact."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
    overrides = ["train.steps=100000", "train.checkpoint_interval=5", "train.eval_interval=100000"]
    run = subprocess.Popen(
        [*command, "tfcompile", *_distributed_run(tmp_path, "killed", *overrides)],
        cwd=ROOT,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        last = tmp_path / "killed" / "checkpoints" / "last"
        deadline = time.monotonic() + 120
        while not last.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert last.exists()
        workers = sorted(
            int(p) for p in subprocess.check_output(["pgrep", "-P", str(run.pid)], text=True).split()
        )
        os.kill(workers[-1], signal.SIGKILL)  # one of the two; the other is left
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert "tfcompile train: error: process " in stderr
    assert "stops: another process of the run stopped" in stderr
    assert "is intact" in stderr and "[rank0]: Traceback" not in stderr and "GLHF" not in stderr


def test_fsdp_training_does_not_warn_of_the_logits_view(tmp_path: Path) -> None:
    """FSDP2 warned on every rank at the first step that the root returned a view (its logits);
    no loss writes into them. The command filters the warning (library code leaves filters be)."""
    import warnings

    from test_fsdp import FSDP, SPEC, STEPS

    from tfcompile.cli import main

    overrides = [*STEPS, FSDP, "train.steps=1", f"train.runs_dir={tmp_path}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["train", str(SPEC), *(f"--set={o}" for o in overrides)]) == 0
    assert not [w for w in caught if "returned a view tensor" in str(w.message)]
