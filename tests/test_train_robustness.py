"""What a user's own edits and signals do to a run: a spec edited after training, a checkpoint or
state of another run, settings changed on resume, SIGTERM, damaged files read by export and sample.
Each ends in one clear error, or a fallback to an intact checkpoint with a one-line warning."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ROOT
from test_train import SPEC, tiny_spec

from tfcompile.cli import main
from tfcompile.spec import Spec
from tfcompile.tasks import build_model
from tfcompile.train import (
    CheckpointError,
    RunWarning,
    Trainer,
    TrainError,
    load_run_spec,
    load_trained_model,
    read_metrics,
)
from tfcompile.train import checkpoint as checkpoint_module
from tfcompile.train.checkpoint import (
    STATE_FILE,
    checkpoint_dir,
    checkpoint_folders,
    load_state,
    load_weights,
    resolve,
)
from tfcompile.train.lock import LOCK_FILE

# A run of 4 steps with checkpoints at steps 2 and 4, on a cosine schedule.
SMALL = (
    "model.n_layers=1",
    "model.d_model=32",
    "model.n_heads=2",
    "model.max_seq_len=32",
    "train.batch_size=4",
    "train.eval_batches=1",
    "train.steps=4",
    "train.eval_interval=2",
    "train.checkpoint_interval=2",
    "train.schedule={type: cosine, warmup_steps: 1}",
)


def small_spec(tmp_path: Path, *overrides: str) -> Spec:
    return tiny_spec(tmp_path, *SMALL, *overrides)


def trainer(spec: Spec, run_dir: Path, **kwargs: Any) -> Trainer:
    return Trainer(spec, run_dir, show_progress=kwargs.pop("show_progress", False), **kwargs)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the specs here take for train.runs_dir's parent: one token cache for every test."""
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def trained(root: Path) -> Path:
    """The small run, trained to step 4 (checkpoints: step-000002 and step-000004)."""
    run_dir = trainer(small_spec(root), root / "runs" / "run").train().run_dir
    assert [p.name for p in checkpoint_folders(run_dir)] == ["step-000002", "step-000004"]
    return run_dir


@pytest.fixture
def run_dir(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run, the test's to damage."""
    copy = tmp_path / "runs" / "run"
    shutil.copytree(trained, copy)
    return copy


def step_folder(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:06d}"


def weights_of(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    model = build_model(load_run_spec(run_dir))
    load_weights(model, step_folder(run_dir, step))
    return model.state_dict()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def edit_spec(run_dir: Path, old: str, new: str) -> None:
    path = run_dir / "spec.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


# ------------------------------------------------------------------- weights that do not fit


@pytest.mark.parametrize(
    ("old", "new", "found"),
    [
        (
            "d_model: 32",
            "d_model: 48",
            r"embed\.weight is \(65, 48\) in the model, \(65, 32\) in the checkpoint",
        ),
        (
            "max_seq_len: 32",
            "max_seq_len: 64",
            r"positional\.table\.weight is \(64, 32\) in the model, \(32, 32\)",
        ),
        ("n_layers: 1", "n_layers: 2", r"the checkpoint lacks blocks\.1\."),
    ],
    ids=["d_model", "max_seq_len", "n_layers"],
)
def test_a_spec_edited_after_training_names_the_checkpoint_and_the_tensors(
    run_dir: Path, old: str, new: str, found: str, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_spec(run_dir, old, new)
    expected = (
        rf"^{step_folder(run_dir, 4)}/model\.safetensors does not fit the model of {run_dir}/spec\.yaml: "
        rf".*{found}.*was the spec edited after training"
    )
    with pytest.raises(CheckpointError, match=expected):
        load_trained_model(run_dir)
    with pytest.raises(CheckpointError, match=expected):
        trainer(load_run_spec(run_dir, ["train.steps=6"]), run_dir, resume=True)
    assert not (run_dir / LOCK_FILE).exists()
    assert main(["sample", str(run_dir), "--prompt", "A", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tfcompile sample: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_checkpoint_copied_from_another_run_is_refused(root: Path, run_dir: Path, tmp_path: Path) -> None:
    other = trainer(small_spec(root, "model.d_model=48", "train.steps=2"), tmp_path / "runs" / "other")
    other.train()
    shutil.rmtree(step_folder(run_dir, 4))
    shutil.copytree(step_folder(other.run_dir, 2), step_folder(run_dir, 4))
    with pytest.raises(
        CheckpointError,
        match=r"step-000004/model\.safetensors does not fit the model of .*: embed\.weight is \(65, 32\) "
        r"in the model, \(65, 48\) in the checkpoint.*or the checkpoint copied from another run\?",
    ):
        load_trained_model(run_dir)


# ------------------------------------------------------------------- foreign training states


def _foreign_state(run_dir: Path, how: str) -> None:
    path = step_folder(run_dir, 4) / STATE_FILE
    state = torch.load(path, weights_only=True)
    if how == "not a dict":
        state = [1, 2, 3]
    elif how == "missing keys":
        state = {"step": 4, "model": {}}
    elif how == "wrong types":
        state["step"] = "4"
    elif how == "another model's optimizer":
        state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3, 3)
    elif how == "another optimizer":
        for group in state["optimizer"]["param_groups"]:
            group["momentum"] = 0.9
        state["optimizer"]["state"] = {
            i: {"momentum_buffer": entry["exp_avg"]} for i, entry in state["optimizer"]["state"].items()
        }
    torch.save(state, path)


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("not a dict", "it holds a list, not a training state"),
        ("missing keys", "it is not a training state: it lacks scaler, best, window_loss"),
        ("wrong types", "its step is a str, not int"),
        (
            "another model's optimizer",
            r"its optimizer state does not fit the model: its exp_avg of parameter 0",
        ),
        ("another optimizer", r"its optimizer state is another optimizer's \(its settings momentum"),
    ],
)
def test_a_foreign_training_state_is_skipped_like_a_damaged_one(
    root: Path, run_dir: Path, how: str, why: str
) -> None:
    _foreign_state(run_dir, how)
    skipped = rf"the checkpoint {step_folder(run_dir, 4)} is damaged: state\.pt: {why}"
    with pytest.warns(RunWarning, match=rf"^{skipped}.*; resuming from {step_folder(run_dir, 2)}$"):
        resumed = trainer(small_spec(root, "train.steps=3"), run_dir, resume=True)
    assert resumed.step == 2 and resumed.train().step == 3


def test_a_garbled_training_state_is_skipped_like_a_damaged_one(root: Path, run_dir: Path) -> None:
    """A byte changed inside state.pt's pickle (a bad sector, a flipped bit): torch.load then raises
    what its unpickler meets (here a UnicodeDecodeError), not only OSError or RuntimeError."""
    path = step_folder(run_dir, 4) / STATE_FILE
    data = path.read_bytes()
    key = b"X\x04\x00\x00\x00step"  # the pickle's string "step"
    assert data.count(key) == 1
    path.write_bytes(data.replace(key, b"X\x04\x00\x00\x00\xfftep"))
    skipped = rf"the checkpoint {step_folder(run_dir, 4)} is damaged: state\.pt: 'utf-8' codec can't decode"
    with pytest.warns(RunWarning, match=rf"^{skipped}.*; resuming from {step_folder(run_dir, 2)}$"):
        resumed = trainer(small_spec(root, "train.steps=3"), run_dir, resume=True)
    assert resumed.step == 2 and resumed.train().step == 3


def test_resume_switching_to_fp16_starts_a_fresh_loss_scaler(root: Path, run_dir: Path) -> None:
    resumed = trainer(small_spec(root, "train.steps=5", "train.precision=fp16"), run_dir, resume=True)
    assert resumed.scaler.is_enabled() and resumed.train().step == 5


# ------------------------------------------------------------------- settings changed on resume


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ("train.seed=7", "train.seed (run: 1337, spec: 7)"),
        ("train.batch_size=8", "train.batch_size (run: 4, spec: 8)"),
        ("data.val_fraction=0.2", "data.val_fraction (run: 0.1, spec: 0.2)"),
        ("train.optimizer.lr=0.01", "train.optimizer.lr (run: 0.003, spec: 0.01)"),
        ("task.label_smoothing=0.1", "task.label_smoothing (run: 0.0, spec: 0.1)"),
        ("model.dropout.residual=0.5", "model.dropout.residual (run: 0.3, spec: 0.5)"),
    ],
)
def test_resume_refuses_settings_that_change_what_is_trained(
    root: Path, run_dir: Path, change: str, found: str
) -> None:
    recorded = (run_dir / "spec.yaml").read_bytes()
    with pytest.raises(TrainError) as refused:
        trainer(small_spec(root, "train.steps=6", "train.threads=1", change), run_dir, resume=True)
    differences, advice = str(refused.value).split("; ", 1)
    assert differences.startswith(f"cannot resume {run_dir}: the spec differs from its spec.yaml in ")
    assert found in differences and "train.steps" not in differences and "train.threads" not in differences
    assert advice.endswith("set the others back, or start a new run with --set train.name=NAME")
    assert (run_dir / "spec.yaml").read_bytes() == recorded and not (run_dir / LOCK_FILE).exists()


def test_a_run_that_has_not_trained_a_step_resumes_with_other_settings(root: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "unstarted"
    unstarted = trainer(small_spec(root), run_dir)
    unstarted.stop_requested = True  # a Ctrl-C before the first step: saved at step 0
    assert unstarted.train().step == 0
    resumed = trainer(small_spec(root, "train.batch_size=8", "train.seed=7"), run_dir, resume=True)
    assert resumed.train().step == 4
    assert load_run_spec(run_dir).train.batch_size == 8


def test_a_moved_run_resumes_where_it_is_and_writes_nothing_where_it_was(
    run_dir: Path, tmp_path: Path
) -> None:
    """The run was trained under another runs folder (gone now, or another machine's, or relative to
    another working directory): its resume keeps its token cache beside it and records where it is."""
    gone = tmp_path / "elsewhere" / "runs"
    edit_spec(run_dir, f"runs_dir: {load_run_spec(run_dir).train.runs_dir}", f"runs_dir: {gone}")
    assert trainer(load_run_spec(run_dir, ["train.steps=5"]), run_dir, resume=True).train().step == 5
    assert not (tmp_path / "elsewhere").exists()
    assert (run_dir.parent / ".cache").is_dir() and load_run_spec(run_dir).train.runs_dir == run_dir.parent


def test_steps_below_the_runs_step_are_refused(root: Path, run_dir: Path) -> None:
    """...and the refusal leaves the run as it was: it trimmed metrics.jsonl to the checkpoint first
    (here a line of a step 5 that a killed resume logged after it)."""
    metrics = run_dir / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 5, "train_loss": 1.0}\n')
    before = metrics.read_bytes()
    with pytest.raises(
        TrainError,
        match=rf"^cannot resume {run_dir}: it is at step 4, past train\.steps \(3\), so there is nothing to "
        r"train: set train\.steps above 4$",
    ):
        trainer(small_spec(root, "train.steps=3"), run_dir, resume=True)
    assert not (run_dir / LOCK_FILE).exists() and metrics.read_bytes() == before
    assert trainer(small_spec(root), run_dir, resume=True).train().step == 4  # finished: still fine


def test_extending_a_cosine_schedule_warns_of_the_jump(
    root: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer(small_spec(root, "train.steps=8"), run_dir, resume=True, show_progress=True).train()
    err = capsys.readouterr().err
    assert "warning: train.steps changed from 4 to 8: the cosine schedule's learning rate jumps from " in err
    trainer(small_spec(root, "train.steps=12"), run_dir, resume=True, show_progress=True).train()
    assert "train.steps changed from 8 to 12" in capsys.readouterr().err  # from the length trained last


# ------------------------------------------------------------------- a crash between the pointers


class Crash(Exception):
    """The process dying where the test says (a kill, a power cut)."""


def test_a_crash_between_the_pointer_writes_keeps_the_best_checkpoint_named(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step improves the validation loss, so each saves and moves both pointers; the process
    dies right after the first pointer of step 4's save is written. The resumed run's ``best`` must
    name the checkpoint of its best validation loss, as in a run that never crashed."""
    every_step = ("train.eval_interval=1", "train.checkpoint_interval=100")
    run_dir = tmp_path / "runs" / "crashed"
    real = checkpoint_module.atomic_write_text

    def dies_after_the_first_pointer(path: Path, text: str) -> None:
        real(path, text)
        if text == "step-000004\n":
            raise Crash(f"killed after writing {path.name}")

    monkeypatch.setattr(checkpoint_module, "atomic_write_text", dies_after_the_first_pointer)
    with pytest.raises(Crash):
        trainer(small_spec(root, *every_step), run_dir).train()
    monkeypatch.undo()
    result = trainer(small_spec(root, *every_step), run_dir, resume=True).train()
    val = {r["step"]: r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r}
    assert sorted(val) == [1, 2, 3, 4] and min(val.values()) == val[4] == result.best
    assert load_state(resolve(run_dir, "best"))["best"] == val[4]


# ------------------------------------------------------------------- SIGTERM


def test_sigterm_saves_a_checkpoint_and_stops_like_ctrl_c(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "term"
    spec = small_spec(tmp_path, "train.steps=100000", "train.eval_interval=1000", "train.name=term")
    settings = [f"--set={o}" for o in [*SMALL, "train.steps=100000", "train.eval_interval=1000"]]
    settings += ["--set=train.name=term", f"--set=train.runs_dir={spec.train.runs_dir}"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tfcompile", "train", str(SPEC), *settings]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (checkpoint_dir(run_dir) / "last").exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the run wrote no checkpoint in 120 s"
            time.sleep(0.1)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err  # 143, as a shell reports SIGTERM
    assert "SIGTERM: saving a checkpoint after this step, then stopping" in err and "Traceback" not in err
    step = load_state(resolve(run_dir))["step"]
    assert step >= 2 and f"stopped at step {step};" in err and f"stopped at step {step}" in out
    assert not (run_dir / LOCK_FILE).exists()
    assert not list(checkpoint_dir(run_dir).glob(".*.tmp"))


def test_a_stop_right_after_a_checkpoint_keeps_the_previous_one(root: Path, tmp_path: Path) -> None:
    """Ctrl-C in the step that was just checkpointed: the step is not saved a second time, which would
    have pruned the previous checkpoint (resume's fallback) for a copy of the same step."""

    def ctrl_c_at_step_4(run: Trainer, step: int) -> None:
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    run_dir = tmp_path / "runs" / "stopped"
    result = trainer(small_spec(root, "train.steps=8"), run_dir, on_step=ctrl_c_at_step_4).train()
    assert result.stopped_by == signal.SIGINT and result.step == 4
    assert [p.name for p in checkpoint_folders(run_dir)] == ["step-000002", "step-000004"]
    assert resolve(run_dir).name == "step-000004"


def test_a_crash_while_an_old_checkpoint_is_removed_leaves_no_part_of_one_listed(
    root: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning removed step-N in place: a kill half way left a step-N of some of its files, which
    runs listed and export by name read as damaged. It leaves a hidden temporary, removed later."""
    real_rmtree = shutil.rmtree

    def killed_half_way(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        next(Path(path).iterdir()).unlink()
        raise KeyboardInterrupt  # as a SIGKILL would end it, between two files

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        trainer(small_spec(root, "train.steps=6"), run_dir, resume=True).train()
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", real_rmtree)
    assert [p.name for p in checkpoint_folders(run_dir)] == ["step-000004", "step-000006"]
    assert len(list(checkpoint_dir(run_dir).glob(".step-000002.*.tmp"))) == 1
    trainer(small_spec(root, "train.steps=8"), run_dir, resume=True).train()
    assert not list(checkpoint_dir(run_dir).glob(".*.tmp"))


def test_the_signal_handlers_are_restored_after_training(root: Path, run_dir: Path) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    trainer(small_spec(root, "train.steps=5"), run_dir, resume=True).train()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ------------------------------------------------------------------- export and sample read a run


def test_export_and_sample_fall_back_from_a_damaged_last_checkpoint(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = step_folder(run_dir, 4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    skipped = rf"the checkpoint {step_folder(run_dir, 4)} is damaged: model\.safetensors: "
    with pytest.warns(RunWarning, match=rf"^{skipped}.*; reading {step_folder(run_dir, 2)}$"):
        _, model = load_trained_model(run_dir)
    assert same(model.state_dict(), weights_of(run_dir, 2))
    assert main(["sample", str(run_dir), "--prompt", "A", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("tfcompile sample: warning: the checkpoint ") and err.count("\n") == 1


def test_a_checkpoint_pruned_while_it_is_read_is_followed_to_the_new_one(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = weights_of(run_dir, 4)
    real_open = checkpoint_module.safe_open
    opened: list[str] = []

    def trainer_saves_meanwhile(path: str, *args: Any, **kwargs: Any) -> Any:
        """As the reader opens step 4, the trainer saves step 6 (here a copy) and prunes step 4."""
        if not opened:
            shutil.copytree(step_folder(run_dir, 4), step_folder(run_dir, 6))
            (checkpoint_dir(run_dir) / "last").write_text("step-000006\n")
            shutil.rmtree(step_folder(run_dir, 4))
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "safe_open", trainer_saves_meanwhile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing was damaged
        _, model = load_trained_model(run_dir)
    assert same(model.state_dict(), expected)
    assert [Path(p).parent.name for p in opened] == ["step-000004", "step-000006"]


# ------------------------------------------------------------------- damaged run files, NaN advice


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        (
            "spec.yaml",
            b"\xff\xfe model",
            r"spec\.yaml cannot be read: it is not UTF-8 text \(byte 0xff at offset 0\)",
        ),
        (
            "tokenizer.json",
            b"\xff\xfe",
            r"tokenizer\.json cannot be read: stream did not contain valid UTF-8",
        ),
        ("tokenizer.json", b'{"version": ', r"tokenizer\.json cannot be read: "),
    ],
    ids=["spec not UTF-8", "tokenizer not UTF-8", "tokenizer truncated"],
)
def test_an_unreadable_run_file_is_named(
    root: Path,
    run_dir: Path,
    tmp_path: Path,
    name: str,
    content: bytes,
    why: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (run_dir / name).write_bytes(content)
    expected = rf"^{run_dir}/{why}.*restore the run's file from a copy"
    with pytest.raises(TrainError, match=expected):
        load_trained_model(run_dir)
    with pytest.raises(TrainError, match=expected):
        trainer(small_spec(root, "train.steps=6"), run_dir, resume=True)
    for command in (
        ["sample", str(run_dir), "--prompt", "A"],
        ["export", str(run_dir), "--out", str(tmp_path / "b")],
    ):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert (
            f"tfcompile {command[0]}: error: {run_dir / name} cannot be read" in err
            and "Traceback" not in err
        )


def test_a_run_without_its_tokenizer_is_neither_resumed_nor_fine_tuned(root: Path, run_dir: Path) -> None:
    (run_dir / "tokenizer.json").unlink()
    with pytest.raises(
        TrainError,
        match=rf"^cannot resume {run_dir}: its tokenizer\.json is missing, and its checkpoints read the "
        r"token ids of the tokenizer they were trained with; put that tokenizer\.json back in the run",
    ):
        trainer(small_spec(root, "train.steps=6"), run_dir, resume=True)
    with pytest.raises(TrainError, match=rf"^train\.init_from: {run_dir}: its tokenizer\.json is missing"):
        trainer(small_spec(root, f"train.init_from={run_dir}", "train.name=tuned"), root / "runs" / "tuned")
    assert not (root / "runs" / "tuned").exists()
    assert not (run_dir / "tokenizer.json").exists() and not (run_dir / LOCK_FILE).exists()
    assert [p.name for p in checkpoint_folders(run_dir)] == ["step-000002", "step-000004"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_nan_loss_suggests_fp32_only_when_not_already_fp32(
    root: Path, tmp_path: Path, precision: str
) -> None:
    nan = trainer(small_spec(root, f"train.precision={precision}"), tmp_path / "runs" / precision)
    nan.task.loss = lambda forward, batch: torch.tensor(float("nan"), requires_grad=True)
    with pytest.raises(
        TrainError, match=r"^the training loss became nan at step 1; lower the learning rate"
    ) as e:
        nan.train()
    assert ("train.precision=fp32" in str(e.value)) == (precision != "fp32")


def test_a_nan_loss_names_a_weight_decay_that_moves_weights_by_more_than_themselves(
    root: Path, tmp_path: Path
) -> None:
    """AdamW moves each weight by lr x weight_decay times itself a step: at 1 or more the weights
    blow up, and the advice names the decay beside the learning rate (and only then)."""
    with pytest.raises(TrainError) as e:
        trainer(small_spec(root, "train.optimizer.weight_decay=1e300"), tmp_path / "runs" / "decay").train()
    assert re.search(
        r"lower the learning rate \(train\.optimizer\.lr\) or train\.optimizer\.weight_decay \(the "
        r"learning rate at its peak times it is \d(\.\d+)?e\+29\d: a step",
        str(e.value),
    ), e.value
    nan = trainer(small_spec(root), tmp_path / "runs" / "plain")
    nan.task.loss = lambda forward, batch: torch.tensor(float("nan"), requires_grad=True)
    with pytest.raises(TrainError) as e:
        nan.train()
    assert "weight_decay" not in str(e.value)


@pytest.mark.parametrize(
    ("sets", "decay"),
    [
        # a peak of 1000 / sqrt(d_model 32 x 1 warmup step) = 176.8, times 0.5: named
        (["train.schedule={type: vaswani, warmup_steps: 1, scale: 1000}"], "88.3883"),
        # a peak of 1 / sqrt(32 x 4000) = 0.0028, times 0.5, whatever optimizer.lr (ignored) says
        (["train.schedule={type: vaswani}", "train.optimizer.lr=10"], None),
    ],
    ids=["high peak", "low peak"],
)
def test_a_nan_loss_under_vaswani_s_schedule_names_its_scale_and_its_peak(
    root: Path, tmp_path: Path, sets: list[str], decay: str | None
) -> None:
    """The Vaswani schedule ignores optimizer.lr: the advice names the field that sets its rate,
    and weighs the decay against the rate at its peak."""
    spec = small_spec(root, *sets, "train.optimizer.weight_decay=0.5")
    nan = trainer(spec, tmp_path / "runs" / "vaswani")
    nan.task.loss = lambda forward, batch: torch.tensor(float("nan"), requires_grad=True)
    with pytest.raises(TrainError, match=r"lower the learning rate \(train\.schedule\.scale\)") as e:
        nan.train()
    assert ("weight_decay" in str(e.value)) == (decay is not None)
    assert decay is None or f"at its peak times it is {decay}:" in str(e.value)


def test_gradients_that_turn_nan_under_a_finite_loss_never_reach_a_checkpoint(
    root: Path, tmp_path: Path
) -> None:
    """The step was taken: the weights turned NaN, step 2's checkpoint saved them, and step 3's NaN
    loss then called that checkpoint intact."""
    nan = trainer(small_spec(root), tmp_path / "runs" / "nan")
    weight = next(nan.model.parameters())
    weight.register_hook(lambda grad: grad * math.nan if nan.step == 1 else grad)
    with pytest.raises(TrainError) as e:
        nan.train()
    assert re.match(
        r"the gradients became nan at step 2 \(its loss, [\d.]+, was finite\), so the step was not taken; "
        r"lower the learning rate .* no earlier checkpoint exists$",
        str(e.value),
    ), e.value
    assert torch.isfinite(weight).all() and not checkpoint_folders(nan.run_dir)


def test_the_nan_advice_is_one_a_resume_can_follow(root: Path, tmp_path: Path) -> None:
    """The learning rate is not a resume's to change: the message says to lower it in a new run, and
    what a resume may change (the precision) is offered as a resume."""
    nan = trainer(small_spec(root, "train.precision=bf16"), tmp_path / "runs" / "nan")
    real = nan.task.loss
    nan.task.loss = lambda forward, batch: real(forward, batch) * (math.nan if nan.step == 2 else 1.0)
    with pytest.raises(TrainError) as e:
        nan.train()
    kept = checkpoint_dir(nan.run_dir) / "step-000002"
    assert str(e.value) == (
        "the training loss became nan at step 3; lower the learning rate (train.optimizer.lr) in a new "
        "run with --set train.name=NAME (a resume keeps the run's), or resume with --set "
        f"train.precision=fp32; the checkpoint of step 2 ({kept}) is intact"
    )
    with pytest.raises(TrainError, match=r"train\.optimizer\.lr \(run: 0\.003, spec: 0\.0003\)"):
        trainer(small_spec(root, "train.precision=bf16", "train.optimizer.lr=3e-4"), nan.run_dir, resume=True)
    resumed = trainer(small_spec(root, "train.precision=fp32"), nan.run_dir, resume=True)
    assert resumed.step == 2 and resumed.train().step == 4
