"""FSDP2 and activation checkpointing: the same steps as one whole model, in one process or two
(gloo on the CPU), and sharded checkpoints that resume on another number of processes."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ROOT
from test_distributed import TINY, torchrun
from test_runs import crash_at_every_point_of_a_re_save

from tfcompile.export.bundle import Source, export_bundle, verify_bundle
from tfcompile.spec import Spec, SpecError, load_spec
from tfcompile.tasks import build_model
from tfcompile.train import CheckpointError, RunWarning, Trainer, checkpoint, load_trained_model, read_metrics
from tfcompile.train.checkpoint import MODEL_FILE, SHARDED_DIR, checkpoint_dir, checkpoint_folders, resolve
from tfcompile.train.distributed import World, leave_world
from tfcompile.train.parallel import FSDPUnavailable, blocks, prepare

SPEC = ROOT / "specs" / "shakespeare-char.yaml"
# A constant learning rate: a run stopped at step 2 and resumed to 4 takes the steps of a 4-step run.
STEPS = [
    *TINY,
    "train.schedule={type: constant, warmup_steps: 0}",
    "train.steps=4",
    "train.checkpoint_interval=2",
]
FSDP = "train.parallel=fsdp"


def spec(tmp_path: Path, name: str, *overrides: str) -> Spec:
    return load_spec(SPEC, [*STEPS, f"train.runs_dir={tmp_path / 'runs'}", f"train.name={name}", *overrides])


def train(tmp_path: Path, name: str, *overrides: str, resume: bool = False) -> Trainer:
    trainer = Trainer(spec(tmp_path, name, *overrides), tmp_path / "runs" / name, resume, show_progress=False)
    trainer.train()
    return trainer


def train_two(tmp_path: Path, name: str, *overrides: str, resume: bool = False) -> None:
    """Train the run ``name`` with two gloo processes under torchrun."""
    args = [
        f"--set={o}"
        for o in [*STEPS, f"train.runs_dir={tmp_path / 'runs'}", f"train.name={name}", *overrides]
    ]
    resumed = ["--resume", str(tmp_path / "runs" / name)] if resume else []
    result = torchrun(2, "train", str(SPEC), *args, *resumed)
    assert result.returncode == 0, result.stderr[-3000:]


def losses(tmp_path: Path, name: str) -> list[float]:
    return [r["train_loss"] for r in read_metrics(tmp_path / "runs" / name) if "train_loss" in r]


def assert_same_losses(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) == 4
    for x, y in zip(a, b, strict=True):
        assert x == pytest.approx(y, rel=1e-5)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, atol=2e-6, rtol=1e-5, msg=name)


# ------------------------------------------------------------------ one process: the default suite


def test_activation_checkpointing_recomputes_blocks_and_gives_identical_gradients() -> None:
    config = load_spec(SPEC, [*TINY, "model.vocab_size=65", "model.dropout={residual: 0.2, attention: 0.2}"])
    torch.manual_seed(0)
    plain = build_model(config)
    checkpointed = build_model(config)
    checkpointed.load_state_dict(plain.state_dict())
    ac = config.train.model_copy(update={"activation_checkpointing": True})
    prepare(checkpointed, ac, torch.device("cpu"), compiles=False)
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()  # checkpoints unchanged

    calls: list[str] = []
    for block in blocks(checkpointed):
        block.ffn.register_forward_hook(lambda module, args, out: calls.append("ffn"))
    ids = torch.randint(0, 65, (4, 32))
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # the same dropout masks, which the recomputation draws again
        model(ids).logsumexp(-1).mean().backward()
    assert len(calls) == 2 * len(blocks(checkpointed))  # each block ran again in the backward pass
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad), name
    with torch.no_grad():  # evaluation keeps nothing to recompute
        checkpointed(ids)
    assert len(calls) == 3 * len(blocks(checkpointed))


def test_fp16_or_cpu_offload_without_fsdp_is_refused_with_the_fix() -> None:
    with pytest.raises(SpecError, match=r"(?s)train\.precision: fp16 needs loss scaling.*use precision bf16"):
        load_spec(SPEC, [FSDP, "train.precision=fp16"])
    with pytest.raises(SpecError, match=r"(?s)train\.cpu_offload: .* parallel is ddp.*parallel to fsdp"):
        load_spec(SPEC, ["train.cpu_offload=true"])


def test_a_torch_without_fsdp2_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def without_fully_shard(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "torch.distributed.fsdp" and "fully_shard" in (args[2] if len(args) > 2 else ()):
            raise ImportError("cannot import name 'fully_shard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_fully_shard)
    config = load_spec(SPEC, [*TINY, "model.vocab_size=65", FSDP])
    with pytest.raises(
        FSDPUnavailable, match=r"needs FSDP2 .* install torch>=2\.6, or use train\.parallel=ddp"
    ):
        prepare(build_model(config), config.train, torch.device("cpu"), compiles=False)


# ------------------------------------------------------------------ processes: slow


@pytest.mark.slow
def test_fsdp_in_one_process_trains_as_the_whole_model_with_sharded_checkpoints(tmp_path: Path) -> None:
    whole = train(tmp_path, "whole")
    # Offloading to the CPU on the CPU moves nothing, but takes FSDP's offloading path.
    checkpointed, offloaded = "train.activation_checkpointing=true", "train.cpu_offload=true"
    sharded = train(tmp_path, "sharded", FSDP, checkpointed, offloaded)
    assert sharded.sharded and not whole.sharded
    assert_same_losses(losses(tmp_path, "sharded"), losses(tmp_path, "whole"))
    last = resolve(sharded.run_dir)
    assert last is not None and (last / SHARDED_DIR / ".metadata").is_file()
    assert_same_weights(load_trained_model(sharded.run_dir)[1], load_trained_model(whole.run_dir)[1])

    # A damaged shard is skipped for the checkpoint before it, as a damaged safetensors file is.
    (last / SHARDED_DIR / "__0_0.distcp").write_bytes(b"")
    with pytest.warns(RunWarning, match=r"step-000004 is damaged: sharded: .*resuming from .*step-000002"):
        resumed = Trainer(spec(tmp_path, "sharded", FSDP), sharded.run_dir, resume=True, show_progress=False)
    assert resumed.step == 2
    resumed.train()
    assert_same_losses(losses(tmp_path, "sharded"), losses(tmp_path, "whole"))

    # A sharded checkpoint resumes whole (ddp), whose next checkpoint is whole.
    extended = spec(tmp_path, "sharded", "train.steps=5")
    whole_again = Trainer(extended, sharded.run_dir, resume=True, show_progress=False)
    assert whole_again.step == 4 and not whole_again.sharded
    assert_same_weights(whole_again.model, whole.model)
    whole_again.train()
    assert (checkpoint_dir(sharded.run_dir) / "step-000005" / MODEL_FILE).is_file()

    # A whole-model checkpoint does not resume sharded, and says how it does.
    with pytest.raises(
        CheckpointError, match=r"holds a whole model .* resume with --set train\.parallel=ddp"
    ):
        Trainer(spec(tmp_path, "whole", FSDP), whole.run_dir, resume=True, show_progress=False)


@pytest.mark.slow
def test_a_crash_at_any_point_of_a_sharded_save_leaves_last_and_best_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Trainer(spec(tmp_path, "r", FSDP), tmp_path / "runs" / "r", show_progress=False)
    try:
        run.save(best=True)
        # torch.save too, but once: torch.distributed.checkpoint calls it for each tensor it writes.
        steps = [
            (checkpoint, "_write_state"),
            (os, "fsync"),
            (Path, "mkdir"),
            (Path, "rename"),
            (Path, "replace"),
        ]
        # The Crash, or torch.distributed.checkpoint's report of it.
        assert crash_at_every_point_of_a_re_save(run, monkeypatch, steps, caught=Exception) >= 15
    finally:
        leave_world(run.world)


@pytest.mark.slow
def test_fsdp_in_bf16_computes_with_bf16_weights_and_keeps_fp32_shards(tmp_path: Path) -> None:
    train(tmp_path, "whole", "train.steps=2")
    config = spec(tmp_path, "bf16", FSDP, "train.precision=bf16", "train.steps=2")
    trainer = Trainer(config, tmp_path / "runs" / "bf16", show_progress=False)
    gathered: list[torch.dtype] = []
    for block in blocks(trainer.model):
        block.ffn.register_forward_hook(lambda module, args, out: gathered.append(module.w_out.weight.dtype))
    trainer.train()
    assert set(gathered) == {torch.bfloat16}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # what the optimizer steps
    assert losses(tmp_path, "bf16") == pytest.approx(losses(tmp_path, "whole"), rel=1e-3)


@pytest.mark.slow
def test_two_fsdp_processes_take_the_steps_of_one_and_resume_in_one(tmp_path: Path) -> None:
    whole = train(tmp_path, "whole")
    train_two(tmp_path, "ddp", "train.steps=2")
    train_two(tmp_path, "fsdp", FSDP, "train.steps=2")
    # Two ranks' shards, every tensor whole in the metadata: any number of processes reads them.
    last = resolve(tmp_path / "runs" / "fsdp")
    assert last is not None and sorted(p.name for p in (last / SHARDED_DIR).glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert losses(tmp_path, "fsdp") == pytest.approx(losses(tmp_path, "ddp"), rel=1e-5)

    # Two processes' checkpoint of step 2, resumed by one to step 4: the losses of the whole run.
    resumed = train(tmp_path, "fsdp", FSDP, resume=True)
    assert resumed.step == 4
    assert_same_losses(losses(tmp_path, "fsdp"), losses(tmp_path, "whole"))
    assert_same_weights(load_trained_model(resumed.run_dir)[1], whole.model)

    # Its sharded checkpoint exports to a bundle that verifies against the run.
    out = tmp_path / "bundle"
    export_bundle(None, Source(run=resumed.run_dir), out)
    assert all(report.passed for report in verify_bundle(out, run=resumed.run_dir).values())


@pytest.mark.slow
def test_one_fsdp_process_resumes_in_two(tmp_path: Path) -> None:
    whole = train(tmp_path, "whole")
    train(tmp_path, "fsdp", FSDP, "train.steps=2")
    train_two(tmp_path, "fsdp", FSDP, resume=True)
    assert_same_losses(losses(tmp_path, "fsdp"), losses(tmp_path, "whole"))
    assert_same_weights(load_trained_model(tmp_path / "runs" / "fsdp")[1], whole.model)
    assert [f.name for f in checkpoint_folders(tmp_path / "runs" / "fsdp")] == ["step-000002", "step-000004"]
    assert not list(checkpoint_dir(tmp_path / "runs" / "fsdp").glob(".*.tmp"))


@pytest.mark.slow
def test_a_sharded_run_measures_its_test_metrics_on_the_whole_model(tmp_path: Path) -> None:
    small = [
        "model.n_layers=2",
        "model.d_model=32",
        "train.steps=3",
        "train.batch_size=16",
        "train.eval_batches=1",
        f"train.runs_dir={tmp_path}",
    ]
    vit = ROOT / "specs" / "vit-digits.yaml"
    results = [
        Trainer(load_spec(vit, [*small, *how]), tmp_path / name, show_progress=False).train().metrics
        for name, how in [("whole", []), ("sharded", [FSDP])]
    ]
    assert "test_accuracy" in results[1]
    assert results[1] == pytest.approx(results[0], rel=1e-5)


@pytest.mark.slow
def test_an_encoder_decoder_trains_sharded_as_whole(tmp_path: Path) -> None:
    """Its decoder blocks' cross-attention keys and values are computed outside the blocks' forward,
    so those blocks stay in the root's unit (sharded alone, their weights would not be gathered)."""
    small = [
        "model.n_layers=1",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.dropout={embedding: 0.0, attention: 0.0, residual: 0.0}",
        "data.test_path=null",
        "train.steps=2",
        "train.batch_size=8",
        "train.eval_batches=1",
        "train.log_interval=1",
        f"train.runs_dir={tmp_path}",
    ]
    translator = ROOT / "specs" / "multi30k-de-en.yaml"
    for name, how in [("whole", []), ("sharded", [FSDP, "train.activation_checkpointing=true"])]:
        Trainer(load_spec(translator, [*small, *how]), tmp_path / name, show_progress=False).train()
    sharded, whole = read_metrics(tmp_path / "sharded"), read_metrics(tmp_path / "whole")
    assert [r["train_loss"] for r in sharded] == pytest.approx([r["train_loss"] for r in whole], rel=1e-5)
    assert sharded[-1]["val_loss"] == pytest.approx(whole[-1]["val_loss"], rel=1e-5)


def _raise_on_main(rank: int, store_path: str, errors: Any) -> None:
    """One of two gloo processes: rank 0's failure in from_main reaches rank 1 too."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    world = World(rank, rank, 2, joined=True)
    try:
        assert world.from_main(lambda: f"made by rank {dist.get_rank()}") == "made by rank 0"
        world.from_main(lambda: Path(store_path, "missing").read_text())
    except OSError as e:
        errors.put((rank, type(e).__name__))
    finally:
        leave_world(world)


@pytest.mark.slow
def test_what_rank_0_raises_in_from_main_every_rank_raises(tmp_path: Path) -> None:
    context = torch.multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()
    torch.multiprocessing.start_processes(
        _raise_on_main, args=(str(tmp_path / "store"), errors), nprocs=2, start_method="spawn"
    )
    raised = sorted(errors.get() for _ in range(2))
    assert raised == [(0, "NotADirectoryError"), (1, "NotADirectoryError")]
