"""Run folders that no crash, second writer, full disk or damaged file can corrupt: one writer at a
time, no mixing with an existing run, atomic re-saves, and resumes that skip damaged parts."""

from __future__ import annotations

import errno
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ROOT
from safetensors import SafetensorError
from test_train import SPEC, tiny_spec

from tfcompile.spec import Spec
from tfcompile.tasks import build_model
from tfcompile.train import CheckpointError, RunWarning, Trainer, TrainError, load_trained_model, read_metrics
from tfcompile.train import checkpoint as checkpoint_module
from tfcompile.train import metrics as metrics_module
from tfcompile.train.checkpoint import checkpoint_dir, checkpoint_folders, load_state, load_weights, resolve
from tfcompile.train.lock import LOCK_FILE, RunLock

# Dropout and gradient accumulation on, so that RNG state and batch order both matter on resume.
RESUMABLE = ("train.steps=12", "train.grad_accum=2", "train.eval_interval=5", "train.checkpoint_interval=4")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tfcompile", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, check=False)


def sets(tmp_path: Path, *overrides: str) -> list[str]:
    """tiny_spec's overrides as --set arguments."""
    spec = tiny_spec(tmp_path, *overrides)
    return [
        f"--set=model.n_layers={spec.model.n_layers}",
        f"--set=model.d_model={spec.model.d_model}",
        f"--set=model.n_heads={spec.model.n_heads}",
        f"--set=model.max_seq_len={spec.model.max_seq_len}",
        f"--set=train.batch_size={spec.train.batch_size}",
        f"--set=train.optimizer.lr={spec.train.optimizer.lr}",  # a resume refuses another
        f"--set=train.eval_batches={spec.train.eval_batches}",
        f"--set=train.runs_dir={spec.train.runs_dir}",
        *(f"--set={o}" for o in overrides),
    ]


def trainer(spec: Spec, run_dir: Path, **kwargs) -> Trainer:
    return Trainer(spec, run_dir, show_progress=False, **kwargs)


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder below ``folder`` with its contents."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def temporaries(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]


def weights(path: Path, spec: Spec) -> dict[str, torch.Tensor]:
    """The weights a checkpoint folder holds (its state must load too)."""
    model = build_model(spec)
    load_weights(model, path)
    load_state(path)
    return model.state_dict()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------- one writer


@pytest.mark.slow  # end to end: two training processes
def test_a_second_process_training_the_same_run_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "x"
    first = trainer(tiny_spec(tmp_path, "train.steps=2", "train.name=x"), run_dir)
    second = cli("train", str(SPEC), *sets(tmp_path, "train.steps=2", "train.name=x"))
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
    assert f"{run_dir} is being written by process {os.getpid()} on host " in second.stderr
    assert "wait for it or choose another name with --set train.name=NAME" in second.stderr
    assert first.train().step == 2  # the first run is untouched by the refusal
    assert not (run_dir / LOCK_FILE).exists()  # released at the end

    resuming = trainer(tiny_spec(tmp_path, "train.steps=4", "train.name=x"), run_dir, resume=True)
    again = cli("train", "--resume", str(run_dir), "--set=train.steps=4")
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr
    assert (
        f"is being written by process {os.getpid()}" in again.stderr
        and "wait for it to finish" in again.stderr
    )
    assert resuming.train().step == 4
    assert [r["step"] for r in read_metrics(run_dir)] == [2, 4]  # no step twice


def test_a_lock_is_released_when_its_owner_is_dropped(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "locked"
    lock = RunLock(folder, "wait")
    with pytest.raises(TrainError, match=f"{folder} is being written by process {os.getpid()} "):
        RunLock(folder, "wait")  # flock locks open files: a second lock in one process conflicts too
    del lock
    gc.collect()
    RunLock(folder, "wait").release()
    assert not folder.exists()  # the lock made the folder and nothing else wrote into it

    dropped = trainer(tiny_spec(tmp_path, "train.steps=1"), tmp_path / "runs" / "dropped")  # never trained
    with pytest.raises(TrainError, match="is being written by"):
        RunLock(dropped.run_dir, "wait")
    del dropped
    gc.collect()
    RunLock(tmp_path / "runs" / "dropped", "wait").release()


def test_a_stop_asked_for_during_the_test_ends_a_finished_run_whose_resume_tests_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the test split was measured (BLEU, minutes) reported a run whose every step and
    test were recorded as stopped (exit 130), and the resume it asked for recorded the test a
    second time (as did resuming any finished run)."""
    run_dir = tmp_path / "runs" / "tested"
    first = trainer(tiny_spec(tmp_path, "train.steps=2", "train.name=tested"), run_dir)

    def measured_then_stopped(model: Any, device: Any) -> dict[str, float]:
        first.stop_requested = True  # as a signal's handler does where it does not end the test
        return {"test_score": 0.5}

    monkeypatch.setattr(first.task, "test_metrics", measured_then_stopped)
    result = first.train()
    assert not result.interrupted and result.step == 2
    resumed = trainer(tiny_spec(tmp_path, "train.steps=2", "train.name=tested"), run_dir, resume=True)
    monkeypatch.setattr(resumed.task, "test_metrics", lambda model, device: {"test_score": 0.5})
    assert not resumed.train().interrupted
    assert [r for r in read_metrics(run_dir) if "test_score" in r] == [{"step": 2, "test_score": 0.5}]
    for _ in range(2):  # continued to step 3, then resumed there: step 2's test is history, kept
        longer = trainer(tiny_spec(tmp_path, "train.steps=3", "train.name=tested"), run_dir, resume=True)
        monkeypatch.setattr(longer.task, "test_metrics", lambda model, device: {"test_score": 0.25})
        longer.train()
    tests = [r for r in read_metrics(run_dir) if "test_score" in r]
    assert tests == [{"step": 2, "test_score": 0.5}, {"step": 3, "test_score": 0.25}]


def test_a_signal_during_the_test_ends_the_test_at_once_and_the_resume_measures_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM while the test split was measured waited for the whole measurement (a seq2seq
    run's BLEU: past eight minutes on a CPU, past any scheduler's grace period)."""
    run_dir = tmp_path / "runs" / "tested"
    first = trainer(tiny_spec(tmp_path, "train.steps=2", "train.name=tested"), run_dir)

    def a_long_test(model: Any, device: Any) -> dict[str, float]:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(600):  # a minute of measuring, in steps a signal handler runs between
            time.sleep(0.1)
        return {"test_score": 0.5}

    monkeypatch.setattr(first.task, "test_metrics", a_long_test)
    result = first.train()
    assert result.interrupted and result.step == 2 and not first.testing
    assert not [r for r in read_metrics(run_dir) if "test_score" in r]
    # A sweep would skip a finished trial: the run owes its test, and is listed as interrupted.
    from tfcompile.study.runs import read_run

    assert read_run(run_dir).state == "interrupted"
    resumed = trainer(tiny_spec(tmp_path, "train.steps=2", "train.name=tested"), run_dir, resume=True)
    monkeypatch.setattr(resumed.task, "test_metrics", lambda model, device: {"test_score": 0.5})
    assert not resumed.train().interrupted
    assert [r for r in read_metrics(run_dir) if "test_score" in r] == [{"step": 2, "test_score": 0.5}]
    assert read_run(run_dir).state == "finished"


def test_an_exported_bundle_is_not_listed_as_a_run(
    char_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle holds a spec.yaml too: `runs .` of a project listed each exported bundle as an
    interrupted run at step 0, and compare left them out as unfinished."""
    from tfcompile.cli import main
    from tfcompile.study.runs import find_runs

    bundle = shutil.copytree(char_bundle, tmp_path / "exported" / "char")
    run = trainer(tiny_spec(tmp_path, "train.steps=1", "train.name=one"), tmp_path / "runs" / "one")
    run.train()
    assert find_runs(tmp_path) == [tmp_path / "runs" / "one"]
    assert main(["runs", str(bundle)]) == 1  # a path of the wrong kind, as for every command
    assert f"{bundle} is a bundle, but `runs` takes a folder" in capsys.readouterr().err


def test_a_run_is_never_exported_into_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """export RUN --out RUN/bundle wrote the bundle into the run it read (export-hf, optimize and
    the hand-offs refused an --out inside their source)."""
    from tfcompile.cli import main

    run_dir = tmp_path / "runs" / "one"
    trainer(tiny_spec(tmp_path, "train.steps=1", "train.name=one"), run_dir).train()
    before = snapshot(run_dir)
    for out in (run_dir, run_dir / "bundle"):
        assert main(["export", str(run_dir), "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert "is the run itself" in error and "is inside the run" in error
    assert snapshot(run_dir) == before


def test_a_run_folders_temporaries_are_removed_by_name_and_the_users_kept(tmp_path: Path) -> None:
    """A failed write removed every hidden .*.tmp of the run folder, which may be a folder of the
    user's own files (a study's trial restart said it kept them, and did not)."""
    from tfcompile.study.trial import _clear_start
    from tfcompile.train.checkpoint import remove_temporaries

    ours, theirs = (
        [".spec.yaml.k2j3.tmp", ".metrics.jsonl.x.tmp", ".trial.json.a.tmp"],
        [".notes.tmp", ".x.tmp"],
    )
    for name in [*ours, *theirs]:
        (tmp_path / name).write_text("")
    remove_temporaries(tmp_path, ["spec.yaml"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*ours[1:], *theirs])
    _clear_start(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)


@pytest.mark.parametrize("held", ["my notes\n", '{"pid": 1}', "[]"])
def test_a_users_file_named_like_the_lock_is_refused_never_emptied_or_removed(
    tmp_path: Path, held: str
) -> None:
    """A folder's own .lock (another tool's, a user's) was emptied, written over and removed by the
    lock, even by a run refused a moment later; an empty one (its writer killed before it wrote)
    or a killed run's record (whole, or cut short by a full disk) is taken over."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(held)
    with pytest.raises(
        TrainError, match=r"\.lock is not a run's lock .*move it, or train into another folder"
    ):
        RunLock(folder, "wait")
    assert (folder / LOCK_FILE).read_text() == held
    record = json.dumps({"pid": 1, "host": "h", "started": "2026-01-01 00:00:00"})
    for left in ("", record, record[:20]):
        (folder / LOCK_FILE).write_text(left)
        RunLock(folder, "wait").release()
        assert not (folder / LOCK_FILE).exists()


def test_a_lock_left_by_a_process_killed_with_sigkill_does_not_block_the_next_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "killed"
    args = sets(tmp_path, "train.steps=100000", "train.checkpoint_interval=1", "train.name=killed")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tfcompile", "train", str(SPEC), *args]
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 120
        while not (checkpoint_dir(run_dir) / "last").exists():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the run wrote no checkpoint in 120 s"
            time.sleep(0.2)
        time.sleep(0.5)  # somewhere in the next steps
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert (run_dir / LOCK_FILE).exists()  # left behind, but no longer locked
    step = load_state(resolve(run_dir))["step"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RunWarning)  # the kill may have cut a metrics line
        resumed = trainer(tiny_spec(tmp_path, f"train.steps={step + 2}"), run_dir, resume=True)
    assert resumed.train().step == step + 2
    assert not temporaries(run_dir) and not (run_dir / LOCK_FILE).exists()


# ---------------------------------------------------------------------------------- no mixing


@pytest.mark.parametrize("files", ["a finished run", "a run killed before its first checkpoint"])
def test_a_new_run_into_a_folder_holding_a_run_is_refused_and_changes_nothing(
    tmp_path: Path, files: str
) -> None:
    run_dir = tmp_path / "runs" / "run"
    if files == "a finished run":
        trainer(tiny_spec(tmp_path, "train.steps=2"), run_dir).train()
        expected = "already holds a run: resume it with --resume"
    else:
        run_dir.mkdir(parents=True)
        (run_dir / "spec.yaml").write_text("model: {}\n")
        (run_dir / "metrics.jsonl").write_text('{"step": 10, "train_loss": 3.0}\n')
        expected = (
            r"already holds a run's files \(spec.yaml, metrics.jsonl\), but it holds no checkpoint to "
            r"resume: remove the folder or choose another name with --set train.name=NAME"
        )
    before = snapshot(run_dir)
    with pytest.raises(TrainError, match=expected):
        trainer(tiny_spec(tmp_path, "train.steps=2"), run_dir)
    assert snapshot(run_dir) == before


# ---------------------------------------------------------------------------------- atomic saves


class Crash(Exception):
    """A failure that is not an OSError: a bug, a signal turned into an exception."""


class CrashAt:
    """Wraps functions so that the n-th call among all of them raises Crash."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def wrap(self, real: Callable) -> Callable:
        def call(*args, **kwargs):
            self.calls += 1
            if self.calls == self.n:
                raise Crash(f"call {self.n}")
            return real(*args, **kwargs)

        return call


def crash_at_every_point_of_a_re_save(
    run: Trainer,
    monkeypatch: pytest.MonkeyPatch,
    steps: list[tuple[Any, str]],
    caught: type[BaseException] = Crash,
) -> int:
    """Save the run's step again and again, the n-th call among ``steps`` crashing, n = 1, 2, ...,
    until a save finishes. After each, ``last`` and ``best`` are complete and hold the old or the
    new weights, and no temporaries are left. -> the calls a whole save makes."""
    committed = {which: weights(resolve(run.run_dir, which), run.spec) for which in ("last", "best")}
    for crash_at in range(1, 100):
        crash = CrashAt(crash_at)
        with torch.no_grad():
            run.model.embed.weight.add_(1.0)
        # A copy of the weights, whole (a sharded model's gathered from every shard).
        now = {k: getattr(v, "full_tensor", v.clone)() for k, v in run.model.state_dict().items()}
        with monkeypatch.context() as patch:
            for owner, name in steps:
                patch.setattr(owner, name, crash.wrap(getattr(owner, name)))
            try:
                run.save(best=True)  # the same step again: a re-save
                finished = True
            except caught:
                finished = False
        for which in ("last", "best"):
            saved = weights(resolve(run.run_dir, which), run.spec)  # complete and loadable
            assert same(saved, committed[which]) or same(saved, now), (crash_at, which)
            committed[which] = saved
        assert not temporaries(run.run_dir), crash_at
        assert len(checkpoint_folders(run.run_dir)) <= 3, os.listdir(checkpoint_dir(run.run_dir))
        if finished:
            assert crash.calls == crash_at - 1, crash.calls  # each call failed once
            assert same(committed["last"], now) and same(committed["best"], now)
            return crash.calls
    raise AssertionError("no save finished")


def test_a_crash_at_any_point_of_a_re_save_leaves_last_and_best_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trainer(
        tiny_spec(tmp_path, "train.steps=4", "train.checkpoint_interval=2"), tmp_path / "runs" / "r"
    )
    run.train()
    steps = [
        (checkpoint_module, "save_model"),
        (torch, "save"),
        (os, "fsync"),
        (Path, "mkdir"),
        (Path, "rename"),
        (Path, "replace"),
        (Path, "write_text"),
    ]
    assert crash_at_every_point_of_a_re_save(run, monkeypatch, steps) >= 12


@pytest.mark.parametrize("writer", ["torch.save", "safetensors"])
def test_a_full_disk_while_checkpointing_names_the_intact_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    run = trainer(
        tiny_spec(tmp_path, "train.steps=4", "train.checkpoint_interval=2"), tmp_path / "runs" / "r"
    )
    run.train()
    before = weights(resolve(run.run_dir), run.spec)

    def full(*args, **kwargs):  # as the libraries report it: torch chains the OSError, safetensors quotes it
        if writer == "safetensors":
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 726"
            ) from None

    monkeypatch.setattr(
        *((torch, "save") if writer == "torch.save" else (checkpoint_module, "save_model")), full
    )
    run.step = 5
    with pytest.raises(CheckpointError) as error:
        run.save()
    last = checkpoint_dir(run.run_dir) / "step-000004"
    assert str(error.value) == (
        "no space left on device while writing the checkpoint of step 5; "
        f"the checkpoint of step 4 ({last}) is intact"
    )
    assert same(weights(resolve(run.run_dir), run.spec), before) and not temporaries(run.run_dir)


def test_a_full_disk_while_appending_metrics_is_one_error_and_leaves_no_half_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trainer(
        tiny_spec(tmp_path, "train.steps=2", "train.checkpoint_interval=2"), tmp_path / "runs" / "r"
    )
    run.train()
    before = (run.run_dir / "metrics.jsonl").read_bytes()
    real_open = open

    class HalfWriter:
        def __init__(self, path: Path, mode: str) -> None:
            self.file = real_open(path, mode)

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def write(self, text: str) -> None:
            self.file.write(text[: len(text) // 2])
            self.file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(metrics_module, "open", HalfWriter, raising=False)
    with pytest.raises(
        TrainError, match=r"^no space left on device while appending step 3 to .*metrics\.jsonl; "
    ):
        run.metrics.append({"step": 3, "train_loss": 1.0})
    assert (run.run_dir / "metrics.jsonl").read_bytes() == before


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB file system (tmpfs), for a real ENOSPC."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root in a sandbox): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Write into ``disk`` until it is full."""
    n = 0
    while (disk / f"filler-{n}").exists():
        n += 1
    with open(disk / f"filler-{n}", "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC


def test_a_real_full_disk_keeps_the_previous_checkpoint_and_metrics(tmp_path: Path, small_disk: Path) -> None:
    run = trainer(tiny_spec(tmp_path, "train.steps=2", "train.checkpoint_interval=2"), small_disk / "run")
    run.train()
    before = weights(resolve(run.run_dir), run.spec)
    metrics = (run.run_dir / "metrics.jsonl").read_bytes()
    fill(small_disk)
    with torch.no_grad():
        run.model.embed.weight.add_(1.0)
    run.step = 3
    with pytest.raises(CheckpointError) as error:
        run.save()
    last = checkpoint_dir(run.run_dir) / "step-000002"
    assert str(error.value) == (
        "no space left on device while writing the checkpoint of step 3; "
        f"the checkpoint of step 2 ({last}) is intact"
    )
    assert same(weights(resolve(run.run_dir), run.spec), before) and not temporaries(run.run_dir)
    fill(small_disk)  # the failed save freed what it had written
    with pytest.raises(
        TrainError, match=rf"^no space left on device while appending step 3 .*; .*{last}\) is intact$"
    ):
        run.metrics.append({"step": 3, "note": "x" * 20000})
    assert (run.run_dir / "metrics.jsonl").read_bytes() == metrics


# ---------------------------------------------------------------------------------- damaged runs


@pytest.fixture(scope="module")
def straight_and_stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trainer, Path]:
    """A run of 12 steps, and one stopped by Ctrl-C at step 7 (checkpoints: step 5, the best, and 7)."""
    tmp = tmp_path_factory.mktemp("runs")
    straight = trainer(tiny_spec(tmp, *RESUMABLE), tmp / "runs" / "straight")
    straight.train()

    def ctrl_c_at_step_7(run: Trainer, step: int) -> None:
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    stopped = trainer(tiny_spec(tmp, *RESUMABLE), tmp / "runs" / "stopped", on_step=ctrl_c_at_step_7)
    assert stopped.train().step == 7
    assert [p.name for p in checkpoint_folders(stopped.run_dir)] == ["step-000005", "step-000007"]
    return straight, stopped.run_dir


def damage(run_dir: Path, how: str) -> None:
    step_7 = checkpoint_dir(run_dir) / "step-000007"
    if how in ("model.safetensors", "state.pt"):
        data = (step_7 / how).read_bytes()
        (step_7 / how).write_bytes(data[: len(data) // 2])
    elif how == "garbage pointer":
        (checkpoint_dir(run_dir) / "last").write_bytes(b"\x00\xffgarbage")
    else:
        (checkpoint_dir(run_dir) / "last").write_text("step-000009\n")


@pytest.mark.parametrize(
    ("how", "skipped", "used"),
    [
        ("model.safetensors", r"step-000007 is damaged: model\.safetensors: ", "step-000005"),
        ("state.pt", r"step-000007 is damaged: state\.pt: ", "step-000005"),
        ("garbage pointer", r"checkpoints/last is damaged: it does not hold a checkpoint", "step-000007"),
        ("missing folder", r"checkpoints/last names step-000009, which is missing", "step-000007"),
    ],
    ids=["truncated weights", "truncated state", "garbage in last", "last names a missing folder"],
)
def test_resume_skips_a_damaged_checkpoint_and_reaches_the_uninterrupted_weights(
    tmp_path: Path, straight_and_stopped: tuple[Trainer, Path], how: str, skipped: str, used: str
) -> None:
    straight, stopped = straight_and_stopped
    run_dir = tmp_path / "stopped"
    shutil.copytree(stopped, run_dir)
    damage(run_dir, how)
    with pytest.warns(RunWarning, match=rf"{skipped}.*; resuming from .*{used}$"):
        resumed = trainer(tiny_spec(tmp_path, *RESUMABLE), run_dir, resume=True)
    assert resumed.step == int(used.removeprefix("step-"))
    resumed.train()
    assert same(resumed.model.state_dict(), straight.model.state_dict())
    strip = lambda ms: [{k: v for k, v in m.items() if k not in ("tokens_per_s", "elapsed_s")} for m in ms]  # noqa: E731
    assert strip(read_metrics(run_dir)) == strip(read_metrics(straight.run_dir))
    assert resolve(run_dir) == checkpoint_dir(run_dir) / "step-000012"


def test_a_damaged_pointer_or_every_checkpoint_damaged_is_one_clear_error(
    tmp_path: Path, straight_and_stopped: tuple[Trainer, Path]
) -> None:
    run_dir = tmp_path / "stopped"
    shutil.copytree(straight_and_stopped[1], run_dir)
    damage(run_dir, "garbage pointer")
    with pytest.warns(RunWarning, match=r"checkpoints/last is damaged.*; reading .*step-000007$"):
        load_trained_model(run_dir)  # export and sample fall back as a resume does
    for folder in checkpoint_folders(run_dir):
        (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(
        CheckpointError, match=r"^cannot resume .*step-000007 is damaged.*step-000005 is damaged"
    ):
        trainer(tiny_spec(tmp_path, *RESUMABLE), run_dir, resume=True)
    assert not (run_dir / LOCK_FILE).exists()


def test_damaged_metrics_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    run_dir = (
        trainer(tiny_spec(tmp_path, "train.steps=4", "train.checkpoint_interval=2"), tmp_path / "r")
        .train()
        .run_dir
    )
    path = run_dir / "metrics.jsonl"
    good = path.read_text().splitlines()
    assert len(good) == 1
    path.write_text("\n".join(['{"step": 2, "train_lo', *good, '{"no": "step"}', '"x"', ""]) + "\n")
    with pytest.warns(RunWarning, match=r"metrics\.jsonl: skipped damaged lines 1, 3, 4 \(not a JSON record"):
        assert [r["step"] for r in read_metrics(run_dir)] == [4]
    with pytest.warns(RunWarning, match="skipped damaged lines 1, 3, 4"):
        resumed = trainer(
            tiny_spec(tmp_path, "train.steps=6", "train.checkpoint_interval=2"), run_dir, resume=True
        )
    resumed.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the resume rewrote the file without the damaged lines
        assert [r["step"] for r in read_metrics(run_dir)] == [4, 6]


def test_a_metrics_file_that_is_a_pipe_is_damaged_not_waited_on(tmp_path: Path) -> None:
    """`tfcompile runs` and `plot` opened it to read and waited forever."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(CheckpointError, match=r"metrics\.jsonl is a named pipe \(FIFO\), not the run's file"):
        read_metrics(run)
    with pytest.raises(CheckpointError, match="not the run's file of metrics"):  # a resume trims it
        metrics_module.MetricsLog(run).truncate(4)


@pytest.mark.parametrize("kind", ["fifo", "endless", "large"])
def test_small_records_are_read_without_waiting_or_filling_memory(kind: str, tmp_path: Path) -> None:
    """trial.json (read by `runs` and `compare`), study.json, data.json and the checkpoint pointer
    were read whole, whatever was there: a FIFO blocked `tfcompile compare` for ever, a link to
    /dev/zero filled the memory (MemoryError)."""
    import threading

    from tfcompile.files import SMALL_FILE_BYTES, read_small_text
    from tfcompile.study.runs import TRIAL_FILE, read_trial

    path = tmp_path / TRIAL_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "endless":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(json.dumps({"failed": "x" * SMALL_FILE_BYTES}))
    read: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: read.append(read_trial(tmp_path)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    blocked = reader.is_alive()
    if blocked and kind == "fifo":  # waiting for a writer: one lets it go
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked and read == [{}]
    with pytest.raises(ValueError, match="not a regular file" if kind != "large" else "larger than"):
        read_small_text(path)


def test_a_fifo_in_place_of_the_lock_does_not_block_runs(tmp_path: Path) -> None:
    """is_locked opened train.lock blocking: a FIFO there hung `tfcompile runs` and compare."""
    import threading

    from tfcompile.train.lock import is_locked

    os.mkfifo(tmp_path / LOCK_FILE)
    found: list[bool] = []
    asking = threading.Thread(target=lambda: found.append(is_locked(tmp_path)), daemon=True)
    asking.start()
    asking.join(timeout=30)
    blocked = asking.is_alive()
    if blocked:  # waiting for a writer: one lets it go
        os.close(os.open(tmp_path / LOCK_FILE, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked and found == [False]
