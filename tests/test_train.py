"""Training end to end on tiny shakespeare: learning, bit-exact resumption, clear failures."""

from __future__ import annotations

import errno
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from helpers import ROOT, share_token_cache

from tfcompile.data import DataError
from tfcompile.spec import Spec, load_spec
from tfcompile.train import CheckpointError, Trainer, TrainError, load_trained_model, read_metrics
from tfcompile.train import checkpoint as checkpoint_module
from tfcompile.train import progress as progress_module
from tfcompile.train.checkpoint import load_state, resolve
from tfcompile.train.progress import Progress
from tfcompile.train.speed import peak_flops

SPEC = ROOT / "specs" / "shakespeare-char.yaml"


def tiny_spec(tmp_path: Path, *overrides: str) -> Spec:
    """The shakespeare-char spec shrunk to train in seconds on a CPU; its corpus, unless overrides
    change data or task, tokenized once per process (share_token_cache)."""
    spec = load_spec(
        SPEC,
        [
            "model.n_layers=2",
            "model.d_model=64",
            "model.n_heads=4",
            "model.max_seq_len=64",
            "train.batch_size=16",
            "train.steps=60",
            "train.optimizer.lr=3.0e-3",
            "train.eval_interval=30",
            "train.eval_batches=5",
            "train.checkpoint_interval=20",
            "train.log_interval=10",
            f"train.runs_dir={tmp_path / 'runs'}",
            *overrides,
        ],
    )
    return spec if any(o.startswith(("data.", "task.")) for o in overrides) else share_token_cache(spec)


def run(spec: Spec, tmp_path: Path, name: str = "run", **kwargs) -> Trainer:
    trainer = Trainer(spec, tmp_path / "runs" / name, show_progress=False, **kwargs)
    trainer.train()
    return trainer


def test_validation_loss_falls_well_below_uniform_guess(tmp_path: Path) -> None:
    trainer = run(
        tiny_spec(tmp_path, "model.dropout={residual: 0.0, attention: 0.0, embedding: 0.0}"), tmp_path
    )
    metrics = read_metrics(trainer.run_dir)
    val = [m["val_loss"] for m in metrics if "val_loss" in m]
    uniform = math.log(65)
    assert val[-1] < 0.7 * uniform, val
    assert val[-1] < val[0]
    assert {"step", "train_loss", "lr", "tokens_per_s", "grad_norm", "val_loss"} <= set(metrics[-1])
    assert (trainer.run_dir / "tokenizer.json").exists() and (trainer.run_dir / "spec.yaml").exists()
    assert resolve(trainer.run_dir, "best") is not None


def test_train_threads_hold_while_training_and_are_restored_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    seen: list[int] = []
    spec = tiny_spec(tmp_path, "train.steps=3", f"train.threads={wanted}")
    Trainer(
        spec, tmp_path / "runs" / "t", on_step=lambda _, step: seen.append(torch.get_num_threads())
    ).train()
    assert seen == [wanted] * 3 and torch.get_num_threads() == before
    assert f"{wanted} CPU thread" in capsys.readouterr().err  # the banner says so


def test_interrupted_and_resumed_run_equals_uninterrupted_run(tmp_path: Path) -> None:
    # Dropout and gradient accumulation on, so that RNG state and batch order both matter.
    spec_args = (
        "train.steps=12",
        "train.grad_accum=2",
        "train.eval_interval=5",
        "train.checkpoint_interval=4",
    )

    straight = run(tiny_spec(tmp_path, *spec_args), tmp_path, "straight")

    def ctrl_c_at_step_7(trainer: Trainer, step: int) -> None:
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: finish the step, save, stop

    first = Trainer(
        tiny_spec(tmp_path, *spec_args),
        tmp_path / "runs" / "split",
        show_progress=False,
        on_step=ctrl_c_at_step_7,
    )
    result = first.train()
    assert result.stopped_by == signal.SIGINT and result.step == 7
    assert load_state(resolve(first.run_dir))["step"] == 7
    resumed = Trainer(tiny_spec(tmp_path, *spec_args), first.run_dir, resume=True, show_progress=False)
    assert resumed.step == 7
    resumed.train()

    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    strip = lambda ms: [{k: v for k, v in m.items() if k not in ("tokens_per_s", "elapsed_s")} for m in ms]  # noqa: E731
    assert strip(read_metrics(straight.run_dir)) == strip(read_metrics(resumed.run_dir))


def test_a_new_run_will_not_overwrite_an_existing_one(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path, "train.steps=2")
    run(spec, tmp_path)
    with pytest.raises(TrainError, match="already holds a run: resume it with --resume"):
        Trainer(spec, tmp_path / "runs" / "run", show_progress=False)


def test_resume_with_a_different_model_is_refused(tmp_path: Path) -> None:
    run(tiny_spec(tmp_path, "train.steps=2"), tmp_path)
    with pytest.raises(TrainError, match=r"model.n_layers \(run: 2, spec: 3\)"):
        Trainer(tiny_spec(tmp_path, "model.n_layers=3"), tmp_path / "runs" / "run", resume=True)


def test_corpus_shorter_than_one_context(tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be: that is the question.\n" * 2)
    with pytest.raises(DataError, match="fewer than one context of 64"):
        Trainer(tiny_spec(tmp_path, f"data.path={short}"), tmp_path / "runs" / "short")
    assert not (tmp_path / "runs" / "short").exists()  # nothing written for a run that never started


def test_vocab_size_must_hold_the_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match=r"model\.vocab_size is 60, but the char tokenizer .* has 65 tokens"):
        Trainer(tiny_spec(tmp_path, "model.vocab_size=60"), tmp_path / "runs" / "v")
    padded = Trainer(tiny_spec(tmp_path, "model.vocab_size=70", "train.steps=1"), tmp_path / "runs" / "p")
    assert padded.spec.model.vocab_size == 70  # an embedding table padded past the tokenizer
    trainer = Trainer(tiny_spec(tmp_path, "model.vocab_size=null", "train.steps=1"), tmp_path / "runs" / "v")
    assert trainer.spec.model.vocab_size == 65


def test_missing_data_path_names_the_field_and_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"data.path: no file or folder at {tmp_path / 'nope.txt'}"):
        Trainer(tiny_spec(tmp_path, f"data.path={tmp_path / 'nope.txt'}"), tmp_path / "runs" / "x")


def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    trainer = run(tiny_spec(tmp_path, "train.steps=4", "train.checkpoint_interval=2"), tmp_path)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    real_save = checkpoint_module.torch.save

    def disk_full(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)  # a partial write, then the disk fills up
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_full)
    with torch.no_grad():
        trainer.model.embed.weight.add_(1.0)
    trainer.step = 5
    with pytest.raises(
        CheckpointError,
        match=r"^no space left on device while writing the checkpoint of step 5; "
        r"the checkpoint of step 4 \(.*step-000004\) is intact$",
    ):
        trainer.save()
    monkeypatch.undo()
    _, reloaded = load_trained_model(trainer.run_dir)
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert not list((trainer.run_dir / "checkpoints").glob(".*tmp"))


def test_bf16_autocast_trains_on_cpu(tmp_path: Path) -> None:
    trainer = run(
        tiny_spec(tmp_path, "train.steps=3", "train.precision=bf16", "train.eval_batches=1"), tmp_path
    )
    assert math.isfinite(read_metrics(trainer.run_dir)[-1]["val_loss"])


def test_mfu_uses_the_datasheet_peak_of_the_gpu_and_none_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    assert peak_flops(torch.device("cpu"), "bf16") is None
    for name, bf16, fp32 in [
        ("NVIDIA H100 80GB HBM3", 989.4e12, 494.7e12),
        ("NVIDIA H100 PCIe", 756e12, 378e12),
        ("NVIDIA A100-SXM4-40GB", 312e12, 156e12),
        ("NVIDIA A10G", 125e12, 62.5e12),
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert (peak_flops(cuda, "bf16"), peak_flops(cuda, "fp32")) == (bf16, fp32)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Some Future GPU")
    assert peak_flops(cuda, "bf16") is None


def test_compile_is_on_by_default_on_cuda_only(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path)
    assert spec.train.compile is None  # resolved by the device: off here, on the CPU
    trainer = Trainer(spec, tmp_path / "runs" / "c", show_progress=False)
    assert trainer.forward is trainer.model
    forced = Trainer(tiny_spec(tmp_path, "train.compile=true"), tmp_path / "runs" / "d", show_progress=False)
    assert forced.forward is not forced.model


def test_the_run_records_its_spec_with_every_default_filled_in(tmp_path: Path) -> None:
    trainer = run(tiny_spec(tmp_path, "train.steps=1", "model.vocab_size=null"), tmp_path, "filled")
    saved = yaml.safe_load((trainer.run_dir / "spec.yaml").read_text())
    assert saved["model"]["vocab_size"] == 65 and saved["train"]["context_length"] == 64
    assert saved["train"]["compile"] is False and saved["train"]["name"] == "filled"
    assert saved["export"]["out"] == "exported/filled"
    nulls = [
        f"{s}.{k}"
        for s, section in saved.items()
        if isinstance(section, dict)
        for k, v in section.items()
        if v is None
    ]
    assert sorted(nulls) == [
        "data.builtin",
        "data.test_fraction",
        "data.test_path",
        "data.val_path",
        "model.attention_softcap",
        "model.logit_softcap",
        "model.moe",
        "model.qkv_clip",
        "model.window",
        "task.min_p",
        "task.top_k",
        "task.top_p",
        "train.init_from",
        "train.loss_chunk_tokens",
        "train.threads",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["train.batch_size=100000000"],
            r"for one batch's outputs \(100,000,000 x 64 tokens\).*lower train\.batch_size",
        ),
        (
            ["model.d_model=65536", "model.n_layers=1024", "model.n_heads=8"],
            r"for the model's [\d,]+ parameters.*lower model\.d_model",
        ),
    ],
)
def test_a_spec_too_large_for_this_machine_is_refused_before_anything_is_allocated(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(TrainError, match=message):
        Trainer(tiny_spec(tmp_path, *overrides), tmp_path / "runs" / "big", show_progress=False)
    assert not (tmp_path / "runs" / "big").exists()


def test_images_too_large_for_memory_are_refused_before_loading(tmp_path: Path) -> None:
    spec = load_spec(
        ROOT / "specs" / "vit-digits.yaml",
        ["model.image_size=8192", "model.patch_size=8192", f"train.runs_dir={tmp_path}"],
    )
    with pytest.raises(
        DataError, match=r"1,797 images of 1 x 8192 x 8192 take [\d.]+ GB.*lower model\.image_size"
    ):
        Trainer(spec, tmp_path / "vit", show_progress=False)


@pytest.mark.parametrize(("term", "bar"), [("xterm-256color", True), ("dumb", False)])
def test_a_dumb_terminal_gets_the_lines_a_log_gets(
    monkeypatch: pytest.MonkeyPatch, term: str, bar: bool
) -> None:
    """On a terminal of TERM=dumb (Emacs' shell) the bar, which cannot redraw its line there, was
    drawn once at the end, and the per-step lines were off: nothing showed while training ran."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # a terminal, as rich sees it
    monkeypatch.setenv("TERM", term)
    assert Progress(total=10, start=0).bar is bar


@pytest.mark.parametrize("width", [40, 60, 100])
def test_a_narrow_terminal_cuts_the_stats_not_the_step_or_the_time_left(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """At 60 columns the bar read "train ╸ … loss 3.1710 val 3.0221 tok/s 567 lr 3.72e-04 0…": the
    step count and the time left went first."""
    import io

    from rich.console import Console

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm")
    progress = Progress(total=1003, start=0)
    progress.update(250, {"train_loss": 3.171, "val_loss": 3.0221, "tokens_per_s": 567.0, "lr": 3.72e-4})
    shown = Console(width=width, file=io.StringIO(), color_system=None)
    with shown.capture() as captured:
        shown.print(progress._rich.make_tasks_table(progress._rich.tasks))
    line = captured.get().rstrip("\n")
    assert "250/1003" in line and line.endswith("-:--:--") and "loss 3." in line, line


def test_progress_lines_in_a_log_say_how_far_and_how_long_is_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a terminal (a CI log) there is no bar: each logged step says of how many, and the
    time left once the pace is known."""
    clock = iter([10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0])  # each step's end: 0.5 s apart
    monkeypatch.setattr(progress_module, "perf_counter", lambda: next(clock))
    with Progress(total=1003, start=0) as progress:
        for step in range(1, 8):
            progress.advance(step)
            progress.update(step, {"train_loss": 1.0, "lr": 1e-3})
    lines = capsys.readouterr().err.splitlines()
    assert "step 1/1,003: loss 1.0000  lr 1.00e-03" in lines  # the pace not known yet
    assert "step 7/1,003: loss 1.0000  lr 1.00e-03  about 8 min 18 s left" in lines
