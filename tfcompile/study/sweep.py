"""``tfcompile sweep``: a study's trials trained one after another here, or as Ray tasks on a
cluster. The study's folder holds its trials' runs and study.json (what compare reads: the
variants, the baseline, the trials, and the steps a wall-time budget gave each variant). Trials a
killed sweep finished are skipped; those it interrupted resume from their last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TextIO

from tfcompile.errors import UserError
from tfcompile.files import atomic_write_text, read_small_text
from tfcompile.spec import Spec, dump_spec
from tfcompile.study.plan import Plan, Trial
from tfcompile.study.runs import TRIAL_FILE, is_run, read_run, trained_otherwise
from tfcompile.study.schema import MAX_STEPS
from tfcompile.study.trial import run_trial
from tfcompile.train.metrics import test_owed
from tfcompile.train.runs import TrainingFailed

STUDY_RECORD = "study.json"
THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
PROBE_STEPS = 5  # timed steps of a wall-time budget's probe, after one untimed


class SweepError(UserError, RuntimeError):
    """A sweep that cannot go on; the message says what to do."""


@dataclass
class Sweep:
    plan: Plan
    command: list[str] = field(default_factory=list)  # what ran this sweep, kept in study.json
    out: TextIO = field(default_factory=lambda: sys.stderr)
    stopped_by: int = field(default=signal.SIGINT, init=False)  # the signal that stopped it, if one did

    def trials(self) -> list[Trial] | None:
        """The plan's trials, with a wall-time budget's steps (probed once, then kept in study.json);
        None: the probe was stopped (Ctrl-C, SIGTERM)."""
        if run := next((f for f in (self.plan.folder, *self.plan.folder.parents) if is_run(f)), None):
            raise SweepError(
                f"the study's folder {self.plan.folder} is in the run {run}: its trials would be hidden "
                f"in it (tfcompile runs lists {run} alone); give the study another `name:` or `runs_dir:`"
            )
        steps = None
        if self.plan.study.study.budget.seconds is not None:
            steps = self._recorded_steps() or self._probe(self.plan.study.study.budget.seconds)
            if steps is None:
                return None
        trials = self.plan.trials(steps)
        for trial in trials:  # a trial trained otherwise is refused before study.json says it is planned
            self.finished(trial)
        self._write(self._read() | plan_record(self.plan, trials, steps))
        return trials

    def run(self, launcher: Launcher) -> bool:
        """Train every trial not finished yet -> whether all are finished (False: interrupted)."""
        trials = self.trials()
        if trials is None:
            return False
        started = time.monotonic()
        this = self._this_sweep(launcher)
        sweeps = [*self._read().get("sweeps", []), this]
        self._write(self._read() | {"sweeps": sweeps})
        try:
            return self._run(trials, launcher)
        finally:
            this["seconds"] = round(time.monotonic() - started, 1)
            self._write(self._read() | {"sweeps": sweeps})

    def _run(self, trials: list[Trial], launcher: Launcher) -> bool:
        pending = []
        for k, trial in enumerate(trials, 1):
            if self.finished(trial):
                self._say(
                    f"trial {k} of {len(trials)}: {trial.name} finished already, skipped"
                    + self._unmeasured(trial)
                )
            else:
                pending.append((k, trial))
        started = time.monotonic()
        failed = []
        for done, (k, trial, outcome) in enumerate(launcher.run(self.plan.folder, pending, self._say), 1):
            if outcome["interrupted"]:
                self.stopped_by = outcome.get("stopped_by") or signal.SIGINT
                self._say(f"trial {k} of {len(trials)}: {trial.name} stopped at step {outcome['step']}")
                return False
            spent = time.monotonic() - started
            eta = spent / done * (len(pending) - done)
            ended = f"failed: {outcome['failed']}" if outcome.get("failed") else "finished"
            self._say(
                f"trial {k} of {len(trials)}: {trial.name} {ended} "
                f"({done} of {len(pending)} this sweep, {_duration(spent)} so far, ETA {_duration(eta)})"
            )
            failed += [trial.name] if outcome.get("failed") else []
        if failed:
            self._say(
                f"{len(failed)} of {len(trials)} trials failed ({', '.join(failed)}): compare leaves them "
                f"out and names them in the report; a sweep again tries them again from their last checkpoint"
            )
        return True

    def finished(self, trial: Trial) -> bool:
        run_dir = self.plan.folder / trial.name
        if not is_run(run_dir):
            return False
        run = read_run(run_dir)
        changed = trained_otherwise(run, trial.spec)
        if changed:
            raise SweepError(
                f"{run_dir} was trained otherwise than the study now gives it "
                f"({', '.join(changed)}): give the changed study another `name:`, "
                f"or remove {self.plan.folder}"
            )
        planned = trial.spec.train.steps
        if not run.running and run.saved_step > planned:
            raise SweepError(
                f"{run_dir} was trained to step {run.saved_step}, past the {planned} steps the study now "
                f"gives it (its budget was lowered): give the changed study another `name:`, or remove "
                f"{self.plan.folder}"
            )
        return not run.running and run.saved_step >= planned and not test_owed(run.records, planned)

    def _unmeasured(self, trial: Trial) -> str:
        """What a finished trial without its peak memory (a sweep killed after its last checkpoint,
        before RUN/trial.json) means for the report, and how to measure it; "" when it has it."""
        run_dir = self.plan.folder / trial.name
        if isinstance(read_run(run_dir).trial().get("peak_memory_bytes"), int):
            return ""
        return (
            f"; its peak memory was not recorded (stopped before {TRIAL_FILE} was written): the report "
            f"gives its variant's from the other seeds and says so; remove {run_dir} and sweep again "
            f"to measure it"
        )

    def _say(self, message: str) -> None:
        print(f"{self.plan.name}: {message}", file=self.out, flush=True)

    # ------------------------------------------------------------------ study.json

    def _read(self) -> dict[str, Any]:
        path = self.plan.folder / STUDY_RECORD
        if not path.exists():
            return {}
        try:
            found = json.loads(read_small_text(path))
        except ValueError:  # not JSON, not text, or not a file tfcompile wrote
            found = None
        if not isinstance(found, dict) or not isinstance(found.get("sweeps", []), list):
            raise SweepError(
                f"{path} is damaged: remove it to plan the study again (finished trials are kept)"
            )
        return found

    def _write(self, record: dict[str, Any]) -> None:
        self.plan.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.plan.folder / STUDY_RECORD, json.dumps(record, indent=2) + "\n")

    def _this_sweep(self, launcher: Launcher) -> dict[str, Any]:
        """What study.json notes of this sweep: its command, the commit, the machine, its start."""
        return {
            "command": shlex.join([*_settings(), *self.command]),
            "commit": _commit(),
            "launcher": launcher.describe(),
            "device": describe_machine(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": None,
        }

    def _recorded_steps(self) -> dict[str, int] | None:
        """The steps study.json keeps for each variant; None where it keeps none for one of them (a
        variant added since), and the variants are probed again."""
        steps = self._read().get("steps")
        labels = {v.label for v in self.plan.variants}
        if not isinstance(steps, dict) or not labels <= steps.keys():
            return None
        if bad := sorted(label for label in labels if not is_steps(steps[label])):
            raise SweepError(
                f"{self.plan.folder / STUDY_RECORD} is damaged: the steps of {', '.join(bad)} are no "
                f"number of steps from 1 to {MAX_STEPS:,}; remove it to plan the study again (finished "
                f"trials are kept)"
            )
        return steps

    def _probe(self, seconds: float) -> dict[str, int] | None:
        """Each variant's train.steps for ``seconds`` of training, evaluations included, from a
        few timed steps and one timed evaluation of it (in a temporary folder); None: stopped by
        Ctrl-C or SIGTERM."""
        steps = {}
        for variant in self.plan.variants:
            try:
                timed = probe(variant.spec)
            except TrainingFailed as e:
                failure = str(e).split(";")[0]
                raise SweepError(
                    f"probe: {variant.label} failed in the steps timed to plan a wall-time budget "
                    f"({failure}), and so would its trials: change the variant or leave it out"
                ) from None
            if isinstance(timed, signal.Signals):
                self.stopped_by = timed
                return None
            step_s, eval_s = timed
            interval = variant.spec.train.eval_interval
            steps[variant.label] = max(1, math.floor(seconds / (step_s + eval_s / interval)))
            if steps[variant.label] > MAX_STEPS:
                raise SweepError(
                    f"probe: {variant.label} takes {step_s:.2g} s a step, so {seconds:g} seconds are "
                    f"{steps[variant.label]:,} steps, over the limit of {MAX_STEPS:,}: give a shorter "
                    f"`budget:`, or budget steps"
                )
            self._say(
                f"probe: {variant.label} takes {step_s:.3f} s a step and {eval_s:.2f} s an evaluation: "
                f"{steps[variant.label]} steps"
            )
        return steps


def is_steps(value: Any) -> bool:
    """Whether a value read from study.json is a number of training steps a study may plan."""
    return type(value) is int and 0 < value <= MAX_STEPS


def plan_record(plan: Plan, trials: list[Trial], steps: dict[str, int] | None) -> dict[str, Any]:
    """What study.json records of a study's plan: its variants, baseline, seeds and trials."""
    return {
        "study": str(plan.study.path),
        "name": plan.name,
        "baseline": plan.baseline,
        "variants": [v.label for v in plan.variants],
        "seeds": plan.study.study.seeds,
        # Each trial's train.steps as this sweep planned it: compare leaves out a trial trained
        # for other steps (a budget changed, and the sweep not run again to the end).
        "trials": [
            {"name": t.name, "variant": t.variant, "seed": t.seed, "steps": t.spec.train.steps}
            for t in trials
        ],
        "steps": steps,
    }


def probe(spec: Spec) -> tuple[float, float] | signal.Signals:
    """(seconds per training step, seconds per evaluation) of ``spec``'s model, timed in a short
    run: one step untimed (warm-up), PROBE_STEPS timed, then a last step with an evaluation; or
    the signal that stopped it first (Ctrl-C, SIGTERM)."""
    from tfcompile.train import Trainer

    total = PROBE_STEPS + 2
    train = {"steps": total, "eval_interval": total, "log_interval": total, "checkpoint_interval": total}
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tfcompile-probe-") as tmp:
        trainer = Trainer(
            spec.replace({"train": train}),
            Path(tmp) / "probe",
            on_step=lambda _trainer, _step: times.append(time.perf_counter()),
            show_progress=False,
        )
        stopped_by = trainer.train().stopped_by
        if stopped_by is not None:
            return stopped_by
    step_s = (times[-2] - times[0]) / PROBE_STEPS
    return step_s, max(times[-1] - times[-2] - step_s, 0.0)


# ---------------------------------------------------------------------- launchers

Outcome = tuple[int, Trial, dict[str, Any]]  # (its number in the study, the trial, run_trial's result)
Say = Callable[[str], None]


class Launcher(Protocol):
    """Runs trials, yielding each one's outcome as it finishes."""

    def describe(self) -> str: ...

    def run(self, folder: Path, trials: list[tuple[int, Trial]], say: Say) -> Iterator[Outcome]: ...


class LocalLauncher:
    """One trial after another in this process; Ctrl-C stops the trial in hand at a checkpoint."""

    def describe(self) -> str:
        return "local"

    def run(self, folder: Path, trials: list[tuple[int, Trial]], say: Say) -> Iterator[Outcome]:
        for k, trial in trials:
            say(f"trial {k}: {trial.name} ({trial.spec.train.steps} steps)")
            yield k, trial, run_trial(dump_spec(trial.spec), str(folder / trial.name))


class RayLauncher:
    """Every trial a Ray task on the cluster at ``address`` (None: start a local one), with one
    GPU each where the cluster has GPUs, else one CPU; outcomes come back as tasks finish."""

    def __init__(self, address: str | None) -> None:
        self.address = address

    def describe(self) -> str:
        return f"ray ({self.address or 'a local instance'})"

    def run(self, folder: Path, trials: list[tuple[int, Trial]], say: Say) -> Iterator[Outcome]:
        try:
            import ray
        except ImportError:
            raise SweepError("--launcher ray needs Ray: pip install 'tfcompile[ray]'") from None
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False)
            except ConnectionError as e:
                raise SweepError(
                    f"cannot reach a Ray cluster at {self.address}: {e}; start one with `ray start --head`"
                ) from None
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        # A fresh worker process per trial (max_calls=1), so that its peak memory is its own.
        remote = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1, max_calls=1)(run_trial)
        pending = {
            remote.remote(dump_spec(trial.spec), str(folder / trial.name), False): (k, trial)
            for k, trial in trials
        }
        say(f"submitted {len(pending)} trials to Ray ({'one GPU' if gpus else 'one CPU'} each)")
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                k, trial = pending.pop(ready[0])
                yield k, trial, ray.get(ready[0])
        finally:
            for ref in pending:
                ray.cancel(ref)


LAUNCHERS: dict[str, Callable[[str | None], Launcher]] = {
    "local": lambda address: LocalLauncher(),
    "ray": RayLauncher,
}


def describe_machine() -> str:
    """This machine's accelerator, or its CPU and cores: where a local sweep's trials ran."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        if found:
            cpu = found[1].strip()
    return f"CPU: {cpu}, {os.cpu_count()} cores, torch threads: {torch.get_num_threads()}"


def _settings() -> list[str]:
    """The environment's settings that change how fast trials train, as a command's prefix."""
    return [f"{name}={os.environ[name]}" for name in THREAD_SETTINGS if name in os.environ]


def _commit() -> str | None:
    """The git commit of the tfcompile source that ran the sweep, when it is a checkout, marked
    when the checkout had uncommitted changes."""
    commit, changes = _git("rev-parse", "HEAD"), _git("status", "--porcelain", "--untracked-files=no")
    if not commit:
        return None
    return f"{commit} (with uncommitted changes)" if changes else commit


def _git(*args: str) -> str | None:
    try:
        found = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip()


def _duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"
