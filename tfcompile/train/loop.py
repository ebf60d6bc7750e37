"""The training loop: deterministic batches, mixed precision, accumulation, clipping, periodic
validation, metrics, atomic checkpoints, Ctrl-C that stops after the current step and saves, and
resumption that reaches the same weights as a run that never stopped. On CUDA: TF32 matmuls,
torch.compile, batches built and pinned in a background thread. Under torchrun: data parallel."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from tfcompile.data import load_tokenizer
from tfcompile.files import TOKENIZER_FILE, atomic_write_text
from tfcompile.models import build_model
from tfcompile.spec import Spec, dump_spec
from tfcompile.summary import forward_flops_per_token
from tfcompile.tasks import Batch, build_objective
from tfcompile.train.checkpoint import load_state, load_weights, resolve, save_checkpoint
from tfcompile.train.distributed import join_world, leave_world
from tfcompile.train.optim import build_optimizer
from tfcompile.train.progress import Progress
from tfcompile.train.runs import (
    METRICS_FILE,
    SPEC_FILE,
    TrainError,
    init_from_run,
    load_run_spec,
    model_differences,
)
from tfcompile.train.schedule import learning_rate
from tfcompile.train.speed import peak_flops


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    step: int
    val_loss: float | None
    best: float | None  # the best value of best_metric so far
    best_metric: str
    interrupted: bool
    metrics: dict[str, float]  # the last validation's


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device is cuda, but no CUDA device is available; use auto or cpu")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


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
        self.spec = spec
        self.run_dir = run_dir
        self.on_step = on_step
        self.device = resolve_device(spec.train.device)
        self.world = join_world(self.device.type)
        if self.world.distributed:
            if self.device.type == "cuda":
                self.device = torch.device("cuda", self.world.local_rank)
                torch.cuda.set_device(self.device)
            if spec.train.batch_size % self.world.size:
                raise TrainError(
                    f"train.batch_size ({spec.train.batch_size}) is the global batch and must divide "
                    f"evenly among the {self.world.size} processes: use a multiple of {self.world.size}"
                )
        self.show_progress = show_progress and self.world.is_main
        self.stop_requested = False
        if self.device.type == "cuda":  # TF32 tensor cores for fp32 matmuls (10-bit mantissa)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self._prepare_run_dir(resume)

        init_run = spec.train.init_from
        if resume and (run_dir / TOKENIZER_FILE).exists():  # image runs have none
            tokenizer = load_tokenizer(run_dir / TOKENIZER_FILE)
        elif init_run is not None:
            if not (init_run / TOKENIZER_FILE).exists():
                raise TrainError(f"train.init_from: {init_run} is not a run: it has no {TOKENIZER_FILE}")
            tokenizer = load_tokenizer(init_run / TOKENIZER_FILE)  # the pretrained embeddings' vocabulary
        else:
            tokenizer = None
        self.objective = build_objective(spec, spec.train.runs_dir / ".cache", tokenizer)
        self._take_sizes_from_data()

        torch.manual_seed(spec.train.seed)
        model = build_model(spec)
        self.initialized_from = init_from_run(model, spec, init_run) if init_run and not resume else None
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model, spec.train.optimizer, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=spec.train.precision == "fp16")
        self.step = 0
        self.best: float | None = None  # of the objective's best_metric
        # The train loss logged every log_interval steps is the mean over that window; its running
        # sum is checkpointed so that a resumed run logs the same numbers.
        self.window_loss, self.window_steps = 0.0, 0
        if resume:
            self._restore()
        if self.world.distributed:  # dropout differs per rank, and a resumed run draws the same
            torch.manual_seed(hash((spec.train.seed, self.step, self.world.rank)) % 2**63)
        compile_model = spec.train.compile if spec.train.compile is not None else self.device.type == "cuda"
        forward = torch.compile(self.model) if compile_model else self.model
        if self.world.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            forward = DistributedDataParallel(forward, device_ids=ids)
        self.forward = forward
        flops = forward_flops_per_token(self.model, spec.model, spec.context_length)
        self.train_flops_per_token = 3 * flops  # forward + backward (summary.Summary)
        self.peak_flops = peak_flops(self.device, spec.train.precision)
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="batches")
        self._next: tuple[int, Future[list[Batch]]] | None = None
        if self.world.is_main:
            self._write_run_files()

    # ------------------------------------------------------------------ set-up

    def _prepare_run_dir(self, resume: bool) -> None:
        if resume:
            saved = load_run_spec(self.run_dir)
            # vocab_size is left out here: _take_sizes_from_data checks it against the tokenizer.
            differences = model_differences(
                saved.model.model_dump(), self.spec.model.model_dump(), "model", {"vocab_size"}
            )
            if differences:
                raise TrainError(
                    f"cannot resume {self.run_dir}: its model differs from the spec's in "
                    f"{', '.join(differences)}"
                )
            if resolve(self.run_dir) is None:
                raise TrainError(f"cannot resume {self.run_dir}: it has no checkpoint yet")
        elif resolve(self.run_dir) is not None:
            raise TrainError(
                f"{self.run_dir} already holds a run: resume it with --resume {self.run_dir}, "
                f"or choose another name with --set train.name=NAME"
            )

    def _take_sizes_from_data(self) -> None:
        """Fill model.vocab_size and task.labels from the tokenizer and the data, or check them."""
        assert self.spec.data is not None
        vocab = self.objective.vocab_size
        declared = self.spec.model.vocab_size
        if vocab is None:  # images: no tokenizer
            pass
        elif declared is None:
            self.spec.model.vocab_size = vocab
        elif declared != vocab:
            raise TrainError(
                f"model.vocab_size is {declared}, but the {self.spec.data.tokenizer.type} tokenizer of "
                f"data.path has {vocab} tokens: set model.vocab_size to {vocab}, or leave it out "
                f"to take it from the tokenizer"
            )
        if self.spec.task.type in ("classification", "image_classification"):
            self.spec.task.labels = self.objective.labels

    def _write_run_files(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.run_dir / SPEC_FILE, dump_spec(self.spec))
        for name, text in self.objective.run_files().items():
            atomic_write_text(self.run_dir / name, text)

    def _restore(self) -> None:
        path = resolve(self.run_dir)
        assert path is not None
        load_weights(self.model, path)
        state = load_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self.best = state["best"]
        self.window_loss, self.window_steps = state["window_loss"], state["window_steps"]
        torch.set_rng_state(state["rng_cpu"])
        if self.device.type == "cuda" and state.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(state["rng_cuda"])
        _truncate_metrics(self.run_dir / METRICS_FILE, self.step)

    # ------------------------------------------------------------------ batches

    def _generator(self, split: str, index: int, micro: int = 0) -> torch.Generator:
        """Batch ``index`` of a split depends only on (seed, split, index, micro): a resumed run
        reads exactly the batches the uninterrupted run would have read."""
        key = f"{self.spec.train.seed}:{split}:{index}:{micro}".encode()
        return torch.Generator().manual_seed(
            int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")
        )

    def _to_device(self, batch: Batch) -> Batch:
        return {name: t.to(self.device, non_blocking=True) for name, t in batch.items()}

    def _train_batches(self, step: int) -> list[Batch]:
        """Step ``step``'s micro-batches: this rank's rows of each global batch, pinned on CUDA so
        that the copy to the GPU is asynchronous."""
        t = self.spec.train
        out = []
        for micro in range(t.grad_accum):
            batch = self.objective.batch("train", t.batch_size, self._generator("train", step, micro))
            if self.world.distributed:
                rows = self.world.rows(t.batch_size)
                batch = {name: tensor[rows] for name, tensor in batch.items()}
            if self.device.type == "cuda":
                batch = {name: tensor.pin_memory() for name, tensor in batch.items()}
            out.append(batch)
        return out

    def _batches_for(self, step: int) -> list[Batch]:
        """Step ``step``'s batches, built while the previous step ran; the next step's start now."""
        pending = self._next
        batches = pending[1].result() if pending and pending[0] == step else self._train_batches(step)
        if step < self.spec.train.steps:
            self._next = (step + 1, self._prefetch.submit(self._train_batches, step + 1))
        return batches

    def _autocast(self) -> contextlib.AbstractContextManager:
        precision = self.spec.train.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    # ------------------------------------------------------------------ loop

    def train(self) -> TrainResult:
        t = self.spec.train
        val_loss, metrics = None, {}
        with _stop_on_sigint(self), Progress(t.steps, self.step, enabled=self.show_progress) as progress:
            if self.initialized_from is not None:
                progress.log(f"encoder initialised from {self.initialized_from}")
            window_tokens, window_start = 0, time.perf_counter()
            while self.step < t.steps and not self.world.any(self.stop_requested, self.device):
                step = self.step + 1
                lr = learning_rate(step, t.schedule, t.optimizer, t.steps, self.spec.model.d_model)
                loss, grad_norm, tokens = self._optimizer_step(step, lr)
                self.step = step
                self.window_loss += loss
                self.window_steps += 1
                window_tokens += tokens
                record: dict[str, Any] = {}
                if step % t.log_interval == 0 or step == t.steps:
                    elapsed = time.perf_counter() - window_start
                    tokens_per_s = window_tokens / max(elapsed, 1e-9)
                    record = {
                        "step": step,
                        "train_loss": self.window_loss / self.window_steps,
                        "lr": lr,
                        "tokens_per_s": tokens_per_s,
                        "grad_norm": grad_norm,
                    }
                    if self.peak_flops is not None:
                        achieved = tokens_per_s * self.train_flops_per_token / self.world.size
                        record["mfu"] = achieved / self.peak_flops
                    self.window_loss, self.window_steps = 0.0, 0
                    window_tokens, window_start = 0, time.perf_counter()
                improved = False
                if step % t.eval_interval == 0 or step == t.steps:
                    metrics = self.evaluate()
                    val_loss = metrics["val_loss"]
                    record = {"step": step, **record, **metrics}
                    score = metrics[self.objective.best_metric]
                    improved = self.best is None or (
                        score > self.best if self.objective.higher_is_better else score < self.best
                    )
                    if improved:
                        self.best = score
                    shown = ", ".join(
                        f"{k.removeprefix('val_').replace('_', ' ')} {v:.4f}" for k, v in metrics.items()
                    )
                    progress.log(f"step {step}: val {shown}" + (" (best)" if improved else ""))
                if record:
                    self._log(record)
                    progress.update(step, record)
                if self.world.is_main and (step % t.checkpoint_interval == 0 or step == t.steps or improved):
                    self.save(best=improved)
                if self.on_step is not None:
                    self.on_step(self, step)
            self.stop_requested = self.world.any(self.stop_requested, self.device)
            self._prefetch.shutdown(cancel_futures=True)
            if self.stop_requested:
                if self.world.is_main:
                    self.save()
                progress.log(f"stopped at step {self.step}; resume with --resume {self.run_dir}")
            elif self.world.is_main:
                test = self.objective.test_metrics(self.model, self.device)
                if test:
                    self._log({"step": self.step, **test})
                    progress.log(", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in test.items()))
                    metrics = {**metrics, **test}
        leave_world(self.world)
        return TrainResult(
            self.run_dir,
            self.step,
            val_loss,
            self.best,
            self.objective.best_metric,
            self.stop_requested,
            metrics,
        )

    def _optimizer_step(self, step: int, lr: float) -> tuple[float, float, int]:
        """One optimizer step over grad_accum micro-batches -> (mean loss, gradient norm before
        clipping, tokens seen, padding included)."""
        t = self.spec.train
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        losses, tokens = [], 0
        for micro, cpu_batch in enumerate(self._batches_for(step)):
            batch = self._to_device(cpu_batch)
            last = micro == t.grad_accum - 1
            # DDP averages gradients across ranks on the last micro-batch's backward only.
            sync = contextlib.nullcontext() if last or not self.world.distributed else self.forward.no_sync()
            with sync:
                with self._autocast():
                    loss = self.objective.loss(self.forward, batch) / t.grad_accum
                self.scaler.scale(loss).backward()
            losses.append(loss.detach())
            tokens += self.objective.tokens(batch) * self.world.size
        loss_sum = self.world.mean(torch.stack(losses).sum().item(), self.device)
        if not math.isfinite(loss_sum):
            raise TrainError(
                f"the training loss became {loss_sum} at step {step}; lower the learning rate or use "
                f"train.precision=fp32. The last checkpoint is {resolve(self.run_dir)}"
            )
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip or math.inf)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, float(grad_norm), tokens

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The objective's validation metrics (``val_loss`` and, by task, accuracy or F1)."""
        self.model.eval()
        t = self.spec.train
        batches = self.objective.eval_batches(
            t.eval_batches, t.batch_size, lambda i: self._generator("val", i)
        )
        with self._autocast():
            return self.objective.evaluate(self.forward, (self._to_device(b) for b in batches))

    def save(self, best: bool = False) -> Path:
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "best": self.best,
            "window_loss": self.window_loss,
            "window_steps": self.window_steps,
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
        }
        return save_checkpoint(self.run_dir, self.step, self.model, state, best=best)

    def _log(self, record: dict[str, Any]) -> None:
        if not self.world.is_main:
            return
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def _stop_on_sigint(trainer: Trainer) -> Iterator[None]:
    """First Ctrl-C: finish the current step, save, stop. Second: stop at once."""

    def handler(signum: int, frame: object) -> None:
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.stop_requested = True

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave Ctrl-C alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records past the checkpoint a run resumes from; they will be written again."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))
