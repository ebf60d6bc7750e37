"""The training loop, as in the notes: for each step, forward, loss, backward, clip, optimizer step,
learning-rate schedule; every so often evaluate and checkpoint.

Around it, in small pieces of their own: where it runs (train.device: the device, torchrun, TF32,
autocast), how the processes share the model (train.parallel: compile, DDP or FSDP, activation
checkpointing), the batches (train.batches: reproducible, prefetched), checkpoints
(train.checkpoint: atomic, whole or sharded), metrics (train.metrics), progress (train.progress),
the run folder's lock (train.lock: one writer at a time), and Ctrl-C (or SIGTERM), which finishes
the current step, saves and stops. A resumed run reaches the weights of a run that never stopped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from tfcompile.data.digest import DATA_FILE, changed_data, data_digests, recorded_digests
from tfcompile.files import PREPROCESSING_FILE, TOKENIZER_FILE, atomic_write_text
from tfcompile.nn.moe import balance_loss, update_selection_biases
from tfcompile.signals import handling
from tfcompile.spec import Spec, dump_spec
from tfcompile.summary import forward_flops_per_token
from tfcompile.tasks.task import Task, build_model, task_of
from tfcompile.train import parallel
from tfcompile.train.batches import BatchStream
from tfcompile.train.checkpoint import (
    checkpoint_folders,
    folder_step,
    intact,
    load_latest,
    load_state,
    load_training,
    remove_temporaries,
    save_checkpoint,
    save_sharded_checkpoint,
    training_state,
    write_failure,
)
from tfcompile.train.device import cpu_threads, place
from tfcompile.train.distributed import is_sharded, leave_world
from tfcompile.train.lock import RunLock
from tfcompile.train.metrics import (
    METRICS_FILE,
    TEST_PREFIX,
    UNTESTED,
    MetricsLog,
    TrainingClock,
    Window,
    tested_at,
)
from tfcompile.train.optim import build_optimizer
from tfcompile.train.progress import Progress
from tfcompile.train.runs import (
    SPEC_FILE,
    TrainError,
    TrainingFailed,
    init_from_run,
    load_run_spec,
    load_run_tokenizer,
    read_run_tokenizer,
    resume_differences,
    runs_folder,
)
from tfcompile.train.schedule import learning_rate, peak
from tfcompile.train.speed import peak_flops

# What makes a folder a run's: a new run refuses to write into a folder that holds any of them.
RUN_FILES = (SPEC_FILE, DATA_FILE, TOKENIZER_FILE, PREPROCESSING_FILE, METRICS_FILE, "checkpoints")
# What a second writer of a run folder is told to do, by whether it resumes.
_LOCKED_ADVICE = {
    False: "wait for it or choose another name with --set train.name=NAME",
    True: "wait for it to finish",
}


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    step: int
    val_loss: float | None
    best: float | None  # the best value of best_metric so far
    best_metric: str
    stopped_by: signal.Signals | None  # what stopped the run before train.steps (None: it finished)
    metrics: dict[str, float]  # the last validation's

    @property
    def interrupted(self) -> bool:
        return self.stopped_by is not None


class Trainer:
    def __init__(
        self,
        spec: Spec,
        run_dir: Path,
        resume: bool = False,
        on_step: Callable[[Trainer, int], None] | None = None,
        show_progress: bool = True,
    ) -> None:
        if spec.data is None:
            raise TrainError("the spec has no data section: add `data: {path: ...}` to train")
        self.run_dir = run_dir
        self.on_step = on_step
        self.placement = place(spec.train)
        self.device, self.world = self.placement.device, self.placement.world
        self.show_progress = show_progress and self.world.is_main
        self.stop_requested = False
        self.stop_signal = signal.SIGINT  # the signal that asked to stop (another rank's: Ctrl-C)
        self.testing = False  # while the test split is measured, a stop ends it at once
        self.lock = RunLock(run_dir, _LOCKED_ADVICE[resume]) if self.world.is_main else None
        try:
            with self.world.stops_with_others(lambda: intact(run_dir)):
                self._set_up(spec, resume)
        except BaseException:
            self._unlock()
            leave_world(self.world)
            raise

    def _set_up(self, spec: Spec, resume: bool) -> None:
        """Everything but the lock: from here on the run folder is this process's to write."""
        # Checked by rank 0 alone: the others could see the files it writes below as another run's.
        self.recorded = self.world.from_main(lambda: _check_run_dir(self.run_dir, spec, resume))
        runs_dir = runs_folder(self.run_dir, spec) if resume else spec.train.runs_dir
        self.task = task_of(spec)(spec, runs_dir / ".cache", self._tokenizer(spec, resume))
        self.spec = self._resolved(spec, runs_dir)
        t = self.spec.train

        self.placement.check_fits(self.spec)
        torch.manual_seed(t.seed)
        with out_of_memory("building the model"):
            model = build_model(self.spec)
        init_run = t.init_from
        self.initialized_from = init_from_run(model, self.spec, init_run) if init_run and not resume else None
        with out_of_memory("moving the model to the device"):
            self.model = model.to(self.device)
        parallel.prepare(self.model, t, self.device, self.placement.compiles(t))  # sharded in place (FSDP)
        self.sharded = is_sharded(self.model)
        self.optimizer = build_optimizer(self.model, t.optimizer, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=t.precision == "fp16")
        self.step = 0
        self.saved_step: int | None = None  # the step the newest checkpoint holds
        self.best: float | None = None  # of the task's best_metric
        self.window = Window()
        self.clock = TrainingClock()
        self.metrics = MetricsLog(self.run_dir, enabled=self.world.is_main)
        if resume:
            self._restore()
            if self.step > t.steps:
                raise TrainError(
                    f"cannot resume {self.run_dir}: it is at step {self.step:,}, past train.steps "
                    f"({t.steps:,}), so there is nothing to train: set train.steps above {self.step}"
                )
            self.metrics.truncate(self.step)  # what was logged after the checkpoint is trained again
        self.forward = self.placement.wrap(self.model, t)
        self.batches = BatchStream(self.task, t, self.world, self.device)
        self.train_flops_per_token = 3 * forward_flops_per_token(
            self.model, self.spec.model, self.spec.context_length
        )
        self.peak_flops = peak_flops(self.device, t.precision)
        if self.world.is_main:
            self._write_run_files()

    # ------------------------------------------------------------------ the loop

    def train(self) -> TrainResult:
        """Train to ``train.steps`` (or until Ctrl-C); the run folder's lock is released and the
        process group left at the end, however it ends."""
        try:
            with self.world.stops_with_others(lambda: intact(self.run_dir)):
                return self._train()
        finally:
            self._unlock()
            leave_world(self.world)

    def _train(self) -> TrainResult:
        t = self.spec.train
        val_loss, metrics = None, {}
        with (
            _stop_on_signals(self),
            cpu_threads(t.threads),
            Progress(t.steps, self.step, enabled=self.show_progress) as progress,
        ):
            for line in self._banner():
                progress.log(line)
            if self.initialized_from is not None:
                progress.log(str(self.initialized_from))
            self.window.restart_clock()
            self.clock.start()
            while self.step < t.steps and not self.world.any(self.stop_requested, self.device):
                step = self.step + 1
                lr = self._schedule(step)
                with out_of_memory(f"training step {step}", self.run_dir):
                    loss, tokens = self._forward_backward(step)
                grad_norm = self._clip_and_update(step, loss)
                self.step = step
                self.window.add(loss, tokens)
                progress.advance(step)
                record = self._train_record(step, lr, grad_norm) if self._due(step, t.log_interval) else {}
                improved = False
                if self._due(step, t.eval_interval):
                    metrics = self.evaluate()
                    val_loss = metrics["val_loss"]
                    improved = self._improves(metrics[self.task.best_metric])
                    record = {"step": step, **record, **metrics}
                    progress.log(_describe(step, metrics, improved))
                if record:
                    record["elapsed_s"] = self.clock.seconds()
                    self.metrics.append(record)
                    progress.update(step, record)
                if self._due(step, t.checkpoint_interval) or improved:
                    self.save(best=improved)
                if self.on_step is not None:
                    self.on_step(self, step)
            # A stop asked for by now ends the run here; one asked for during the test ends the test.
            stopped = self.stop_requested = self.world.any(self.stop_requested, self.device)
            self.batches.close()
            if stopped:
                if self.saved_step != self.step:  # a second copy would push out the previous checkpoint
                    self.save()
                progress.log(f"stopped at step {self.step}; resume with --resume {self.run_dir}")
            elif not self.world.from_main(lambda: tested_at(self.run_dir, self.step)):
                test = self._test_metrics()
                if test is None:  # the run is saved at its last step: a resume measures the test
                    stopped = True
                    self.metrics.append({"step": self.step, UNTESTED: True})
                    progress.log(f"stopped during the test; measure it with --resume {self.run_dir}")
                elif test:
                    self.metrics.append({"step": self.step, **test})
                    progress.log(f"test {_shown(test, TEST_PREFIX)}")
                    metrics = {**metrics, **test}
        return TrainResult(
            self.run_dir,
            self.step,
            val_loss,
            self.best,
            self.task.best_metric,
            self.stop_signal if stopped else None,
            metrics,
        )

    def _schedule(self, step: int) -> float:
        t = self.spec.train
        lr = learning_rate(step, t.schedule, t.optimizer, t.steps, self.spec.model.d_model)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _forward_backward(self, step: int) -> tuple[float, int]:
        """Forward, loss and backward over the step's grad_accum micro-batches -> (mean loss over
        every process, tokens seen, padding included)."""
        t = self.spec.train
        self.model.train()
        if self.world.distributed:  # dropout differs per rank, and a resumed run draws the same
            torch.manual_seed(hash((t.seed, step, self.world.rank)) % 2**63)
        losses, tokens = [], 0
        for micro, cpu_batch in enumerate(self.batches.for_step(step)):
            batch = self.batches.to_device(cpu_batch)
            last = micro == t.grad_accum - 1
            # DDP and FSDP reduce gradients across ranks on the last micro-batch's backward only.
            with parallel.gradient_sync(self.forward, self.world, sync=last):
                with self.placement.autocast():
                    loss = self.task.loss(self.forward, batch) / t.grad_accum
                # An MoE's load balancing joins the gradient; the loss reported is the task's.
                balance = balance_loss(self.model)
                objective = loss if balance is None else loss + balance / t.grad_accum
                self.scaler.scale(objective).backward()
            losses.append(loss.detach())
            tokens += self.task.tokens(batch) * self.world.size
        loss_sum = self.world.mean(torch.stack(losses).sum().item(), self.device)
        if not math.isfinite(loss_sum):
            raise TrainingFailed(
                f"the training loss became {loss_sum} at step {step}; {self._not_finite_advice()}"
            )
        return loss_sum, tokens

    def _clip_and_update(self, step: int, loss: float) -> float:
        """Clip the gradient norm, take the optimizer step -> the norm before clipping. Gradients
        that are not finite are refused before they reach the weights, which the next checkpoint
        would save; fp16's loss scaler skips such a step itself and lowers its scale."""
        t = self.spec.train
        self.scaler.unscale_(self.optimizer)
        grad_norm = parallel.full_norm(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip or math.inf)
        )
        if not math.isfinite(grad_norm) and not self.scaler.is_enabled():
            raise TrainingFailed(
                f"the gradients became {grad_norm} at step {step} (its loss, {loss:.4g}, was finite), so "
                f"the step was not taken; {self._not_finite_advice()}"
            )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        update_selection_biases(self.model)
        return grad_norm

    def _not_finite_advice(self) -> str:
        """What to do when training turns NaN or infinite, and which checkpoint is intact."""
        fp32 = ", or resume with --set train.precision=fp32" if self.spec.train.precision != "fp32" else ""
        t = self.spec.train
        lr, field = peak(t.schedule, t.optimizer, self.spec.model.d_model)
        shrink = lr * t.optimizer.weight_decay
        decay = (
            f" or train.optimizer.weight_decay (the learning rate at its peak times it is {shrink:g}: a "
            f"step moves each weight by that multiple of itself)"
            if shrink >= 1
            else ""
        )
        return (
            f"lower the learning rate ({field}){decay} in a new run with --set train.name=NAME (a resume "
            f"keeps the run's){fp32}; {intact(self.run_dir)}"
        )

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The task's validation metrics (``val_loss`` and, by task, accuracy or F1)."""
        self.model.eval()
        with self.placement.autocast():
            return self.task.evaluate(self.forward, self.batches.validation())

    def save(self, best: bool = False) -> Path | None:
        """Checkpoint the step (every process calls it) -> its folder, on the processes that wrote
        it: rank 0 alone for a whole model, every process for a sharded one."""
        state = training_state(
            self.step,
            None if self.sharded else self.optimizer,  # sharded: saved with the weights
            self.scaler,
            self.best,
            (self.window.loss, self.window.steps),
            self.clock.seconds(),
            cuda=self.device.type == "cuda",
        )
        folder = None
        if self.sharded:
            folder = save_sharded_checkpoint(
                self.run_dir, self.step, self.model, self.optimizer, state, self.world, best=best
            )
        elif self.world.is_main:
            folder = save_checkpoint(self.run_dir, self.step, self.model, state, best=best)
        self.saved_step = self.step
        return folder

    def _test_metrics(self) -> dict[str, float] | None:
        """The task's metrics on its test split after training, measured by rank 0 on the whole
        model (under FSDP gathered from every process's shard, when the task has any to measure);
        None: a stop asked for while rank 0 measured them ended the measurement."""
        if not self.sharded:
            if not self.world.is_main:
                return {}
            return self._stoppable(lambda: self.task.test_metrics(self.model, self.device))
        if type(self.task).test_metrics is Task.test_metrics:  # none: nothing worth gathering
            return {}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # on rank 0 alone
        state = get_model_state_dict(self.model, options=options)
        if not self.world.is_main:
            return {}
        model = build_model(self.spec)
        model.load_state_dict(state)
        return self._stoppable(lambda: self.task.test_metrics(model.to(self.device), self.device))

    def _stoppable(self, measure: Callable[[], dict[str, float]]) -> dict[str, float] | None:
        """``measure()``, or None where a stop was asked for meanwhile (the signal handler raises
        _StoppedDuringTest while ``testing``; rank 0 alone, past every collective)."""
        try:
            try:
                self.testing = True
                return measure()
            finally:
                self.testing = False  # a signal here still raises: caught below
        except _StoppedDuringTest:
            return None

    # ------------------------------------------------------------------ bookkeeping

    def _banner(self) -> list[str]:
        """What the run is, where it goes, and what in its spec will not do what it seems to."""
        t = self.spec.train
        params = sum(p.numel() for p in self.model.parameters())
        batch = t.batch_size * t.grad_accum
        how: list[str] = [t.precision]
        how += [f"{t.threads} CPU thread{'s' * (t.threads > 1)}"] if t.threads else []
        how += [f"{self.world.size} processes"] if self.world.distributed else []
        how += [f"sharded (fsdp{', cpu offload' if t.cpu_offload else ''})"] if self.sharded else []
        how += ["activation checkpointing"] if t.activation_checkpointing else []
        lines = [
            f"{self.run_dir.name}: {params:,} parameters on {self.device} ({', '.join(how)}), "
            f"{batch:,} x {self.spec.context_length:,} = {batch * self.spec.context_length:,} tokens a step "
            f"at most, {t.steps:,} steps" + (f" from step {self.step:,}" if self.step else ""),
            f"checkpoints: {self.run_dir / 'checkpoints'} (every {t.checkpoint_interval:,} steps, at each "
            f"best {self.task.best_metric.replace('_', ' ')} and at the end); Ctrl-C saves and stops",
        ]
        lines += self._schedule_change()
        if t.schedule.warmup_steps > t.steps:
            lines.append(
                f"warning: train.schedule.warmup_steps ({t.schedule.warmup_steps:,}) exceeds train.steps "
                f"({t.steps:,}): the learning rate is still warming up when the run ends; lower "
                f"warmup_steps"
            )
        return lines

    def _schedule_change(self) -> list[str]:
        """A warning when a resume's train.steps moves the learning rate of the step it continues
        with (a cosine schedule's decay, stretched or squeezed to the new length)."""
        t, recorded = self.spec.train, self.recorded
        if recorded is None or not 0 < self.step < t.steps or recorded.train.steps == t.steps:
            return []
        d_model, step = self.spec.model.d_model, self.step + 1
        before = learning_rate(step, t.schedule, t.optimizer, recorded.train.steps, d_model)
        after = learning_rate(step, t.schedule, t.optimizer, t.steps, d_model)
        if math.isclose(before, after, rel_tol=1e-6):
            return []
        return [
            f"warning: train.steps changed from {recorded.train.steps:,} to {t.steps:,}: the "
            f"{t.schedule.type} schedule's learning rate jumps from {before:.3g} to {after:.3g} at step "
            f"{step:,} (its curve is recomputed over the new length)"
        ]

    def _due(self, step: int, interval: int) -> bool:
        return step % interval == 0 or step == self.spec.train.steps

    def _improves(self, score: float) -> bool:
        better = self.best is None or (score > self.best if self.task.higher_is_better else score < self.best)
        if better:
            self.best = score
        return better

    def _train_record(self, step: int, lr: float, grad_norm: float) -> dict[str, Any]:
        loss, tokens_per_s = self.window.close()
        record = {
            "step": step,
            "train_loss": loss,
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "grad_norm": grad_norm,
        }
        if self.peak_flops is not None:
            achieved = tokens_per_s * self.train_flops_per_token / self.world.size
            record["mfu"] = achieved / self.peak_flops
        return record

    # ------------------------------------------------------------------ set-up

    def _tokenizer(self, spec: Spec, resume: bool) -> Tokenizer | None:
        """A resumed run keeps its tokenizer; a fine-tuned one starts with its pretraining run's
        (the vocabulary of the embeddings it loads); a new one trains its own (None). A run whose
        model reads token ids must have the tokenizer it was trained with: a new one would give its
        embeddings other ids."""
        init_run = spec.train.init_from
        if resume and self.recorded is not None:
            tokenizer = load_run_tokenizer(self.run_dir, self.recorded)
            if tokenizer is None and _reads_ids(self.recorded):
                raise TrainError(f"cannot resume {self.run_dir}: {_NO_TOKENIZER}")
            return tokenizer
        if init_run is not None and not resume:
            try:
                parent = load_run_spec(init_run)
                tokenizer = read_run_tokenizer(init_run)  # checked against this spec's model
            except TrainError as e:  # no run, or a damaged file of one
                raise TrainError(f"train.init_from: {e}") from None
            if parent.model.family != spec.model.family:
                raise TrainError(
                    f"train.init_from: {init_run} trained a model of family {parent.model.family} "
                    f"(task {parent.task.type}), and this spec's is {spec.model.family}: fine-tune "
                    f"from a run of family {spec.model.family}"
                )
            if tokenizer is None and _reads_ids(parent):
                raise TrainError(f"train.init_from: {init_run}: {_NO_TOKENIZER}")
            return tokenizer
        return None

    def _resolved(self, spec: Spec, runs_dir: Path) -> Spec:
        """The spec with the sizes the task took from the data, the runs folder and the device's
        defaults filled in: what the run folder records. A size the spec declares must equal the
        data's."""
        changes: dict[str, Any] = {}
        for size in self.task.sizes(spec):
            section, field = size.field.split(".")
            declared = getattr(getattr(spec, section), field)
            if declared is not None and declared != size.value:
                raise TrainError(
                    f"{size.field} is {declared!r}, but {size.origin}: set {size.field} to "
                    f"{size.value!r}, or leave it out to take it from the data"
                )
            changes.setdefault(section, {})[field] = size.value
        name = spec.train.name or self.run_dir.name
        changes.setdefault("train", {}).update(
            name=name, runs_dir=runs_dir, compile=self.placement.compiles(spec.train)
        )
        if spec.export.out is None:
            changes["export"] = {"out": str(Path("exported") / name)}
        return spec.replace(changes)

    def _write_run_files(self) -> None:
        try:
            atomic_write_text(self.run_dir / SPEC_FILE, dump_spec(self.spec))
            if not (self.run_dir / DATA_FILE).exists():  # a run from before digests were kept: from now on
                atomic_write_text(self.run_dir / DATA_FILE, json.dumps(data_digests(self.spec), indent=1))
            for name, text in self.task.run_files().items():
                atomic_write_text(self.run_dir / name, text)
        except OSError as e:
            remove_temporaries(self.run_dir, RUN_FILES)
            raise TrainError(write_failure(e, "writing the run's files", self.run_dir)) from e

    def _unlock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _restore(self) -> None:
        """Load the newest checkpoint that loads (``last``, unless it is damaged) and continue from it."""

        def load(path: Path) -> dict[str, Any]:
            state = load_state(path)
            load_training(path, self.model, self.optimizer, state)
            return state

        _, state = load_latest(self.run_dir, load, repair=self.world.is_main)
        if state["scaler"]:  # empty: saved without fp16, whose scaler then starts afresh
            self.scaler.load_state_dict(state["scaler"])
        self.step = self.saved_step = state["step"]
        self.best = state["best"]
        self.window = Window(state["window_loss"], state["window_steps"])
        self.clock = TrainingClock(state.get("elapsed_s", 0.0))  # 0 for checkpoints saved before it
        torch.set_rng_state(state["rng_cpu"])
        if self.device.type == "cuda" and state.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(state["rng_cuda"])


_NO_TOKENIZER = (
    f"its {TOKENIZER_FILE} is missing, and its checkpoints read the token ids of the tokenizer they "
    f"were trained with; put that {TOKENIZER_FILE} back in the run (an imported model's is in the "
    "folder it came from), or train a new run"
)


def _reads_ids(spec: Spec) -> bool:
    """Whether the spec's model reads token ids (it has a vocabulary; an image model has none)."""
    return getattr(spec.model, "vocab_size", None) is not None


def _check_run_dir(run_dir: Path, spec: Spec, resume: bool) -> Spec | None:
    """A resumed run exists and trains as it did (-> its recorded spec); a new run does not write into
    a folder that holds any run's files (it would mix its metrics and checkpoints with theirs)."""
    if resume:
        recorded = load_run_spec(run_dir)
        folders = checkpoint_folders(run_dir)
        differences = resume_differences(recorded, spec, any(folder_step(f) > 0 for f in folders))
        if differences:
            raise TrainError(
                f"cannot resume {run_dir}: the spec differs from its {SPEC_FILE} in "
                f"{', '.join(differences)}; "
                f"a resume may change train.steps, the intervals, eval_batches and where and how it runs "
                f"(device, threads, precision, compile, parallel): set the others back, or start a new run "
                f"with --set train.name=NAME"
            )
        if not folders:
            raise TrainError(f"cannot resume {run_dir}: it has no checkpoint yet")
        if changed := changed_data(recorded_digests(run_dir), spec):
            raise TrainError(
                f"cannot resume {run_dir}: its data changed since it was trained ({', '.join(changed)}; "
                f"{DATA_FILE} records what it read): put the data back as it was, or train a new run on "
                f"it with --set train.name=NAME"
            )
        return recorded
    if checkpoint_folders(run_dir):
        raise TrainError(
            f"{run_dir} already holds a run: resume it with --resume {run_dir}, "
            f"or choose another name with --set train.name=NAME"
        )
    if inner := sorted(p.parent.name for p in run_dir.glob(f"*/{SPEC_FILE}")):
        raise TrainError(
            f"{run_dir} holds runs ({', '.join(inner[:3])}{', ...' * (len(inner) > 3)}: a study's trials, "
            "say), which a run written over them would hide: choose another name with --set train.name=NAME"
        )
    if found := [name for name in RUN_FILES if (run_dir / name).exists()]:
        raise TrainError(
            f"{run_dir} already holds a run's files ({', '.join(found)}), but it holds no checkpoint "
            "to resume: remove the folder or choose another name with --set train.name=NAME"
        )
    return None


def _describe(step: int, metrics: dict[str, float], improved: bool) -> str:
    return f"step {step}: val {_shown(metrics, 'val_')}" + (" (best)" if improved else "")


def _shown(metrics: dict[str, float], prefix: str) -> str:
    """Metrics as the log reads them: ``accuracy 0.9916, loss 0.1047`` (four decimals: on a test
    split of a few hundred examples, one example moves an accuracy by a few tenths of a percent)."""
    return ", ".join(f"{k.removeprefix(prefix).replace('_', ' ')} {v:.4f}" for k, v in metrics.items())


@contextlib.contextmanager
def out_of_memory(what: str, run_dir: Path | None = None) -> Iterator[None]:
    """A failed allocation becomes a TrainingFailed that says what to lower, not a traceback."""
    try:
        yield
    except (MemoryError, torch.OutOfMemoryError, RuntimeError) as e:
        if not isinstance(e, MemoryError | torch.OutOfMemoryError) and "memory" not in str(e).lower():
            raise
        kept = f"; {intact(run_dir)}" if run_dir is not None else ""
        raise TrainingFailed(
            f"ran out of memory {what}: lower train.batch_size (raise train.grad_accum to keep the "
            f"tokens per step) or train.context_length, or the model's sizes{kept}"
        ) from None


# The signals that stop training after the current step, by the name its message gives them.
STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class _StoppedDuringTest(BaseException):
    """A stop asked for while the test split is measured (BLEU with beam search: minutes on a CPU,
    past a scheduler's grace period): the measurement ends there, unrecorded."""


@contextlib.contextmanager
def _stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """The first Ctrl-C or SIGTERM (a scheduler's or a container's stop): finish the current step,
    save, stop; during the test, which follows the last save, stop it at once. The same signal
    again: stop at once, by the operating system's default action (the process ends even inside a
    long PyTorch call, which a Python handler would wait for; the checkpoints on disk stay intact,
    being written atomically)."""

    def handler(signum: int, frame: object) -> None:
        trainer.stop_requested, trainer.stop_signal = True, signal.Signals(signum)
        signal.signal(signum, signal.SIG_DFL)
        if trainer.show_progress:  # a raw write: safe inside a signal handler, unlike print
            name = STOP_SIGNALS[trainer.stop_signal]
            doing = "saving a checkpoint after this step, then stopping"
            doing = "stopping the test (the run is saved)" if trainer.testing else doing
            os.write(2, f"\n{name}: {doing}; {name} again stops at once\n".encode())
        if trainer.testing:
            raise _StoppedDuringTest

    with handling(STOP_SIGNALS, handler):
        yield
