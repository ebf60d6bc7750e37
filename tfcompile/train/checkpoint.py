"""Checkpoints that survive crashes and full disks.

    RUN/checkpoints/step-000500/model.safetensors   weights (safetensors; tied tensors stored once)
    RUN/checkpoints/step-000500/state.pt            optimizer, scaler, RNG states, step, best val loss
    RUN/checkpoints/last, RUN/checkpoints/best      one line each: the folder they point to

Each save writes a new folder (``step-000500``, or ``step-000500-2`` when the step is saved again)
under a temporary name, flushes it and renames it into place; only then are the pointers replaced
(write then rename: the commit point), and only after that are the folders no longer needed
removed. So ``last`` and ``best`` name a complete checkpoint at every instant, whatever fails or
crashes. The folder ``last`` named before is kept too: a resume (or export, or sample) that finds
``last`` damaged falls back to the newest checkpoint that loads, with a warning. A state.pt that is
not a training state of the model (foreign keys or types, another model's optimizer) counts as
damaged; weights that do not fit the model (a spec edited after training) are an error naming them.

A run sharded with FSDP (``train.parallel: fsdp``) writes its weights and optimizer state as each
process holds them, with torch.distributed.checkpoint, into the same kind of folder:

    RUN/checkpoints/step-000500/sharded/            .metadata and one __RANK_0.distcp per process
    RUN/checkpoints/step-000500/state.pt            as above, less the optimizer

Every process writes its shard into the temporary folder, and rank 0 commits it as above once all
have; the shards are read back by any number of processes (they are resharded on load), and
``load_weights`` reads them into a whole model in one process (export, init_from).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import itertools
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model
from torch import nn

from tfcompile.errors import UserError, first_line
from tfcompile.files import atomic_write_text, fsync_dir, fsync_file, read_small_text, umask_mode
from tfcompile.spec.schema import OptimizerSpec
from tfcompile.train.distributed import World, is_sharded
from tfcompile.train.optim import build_optimizer

SPEC_FILE = "spec.yaml"  # RUN/spec.yaml: the resolved spec of the run's model
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
SHARDED_DIR = "sharded"
POINTERS = ("last", "best")
FOLDER_NAME = re.compile(r"step-(\d{6,})(?:-(\d+))?")
T = TypeVar("T")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or does not fit the model."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint or pointer that cannot be read: truncated, garbage, or naming a missing folder."""


class RunWarning(UserWarning):
    """A damaged part of a run folder (a checkpoint, a metrics line) that was skipped."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(
    run_dir: Path, step: int, model: nn.Module, state: dict[str, Any], best: bool = False
) -> Path:
    """Write the checkpoint of ``step`` (rank 0 alone: the model is whole on every process) and move
    ``last`` (and ``best``) to it; see ``_commit``."""

    def write(folder: Path) -> None:
        save_model(model, str(folder / MODEL_FILE))
        umask_mode(folder / MODEL_FILE)
        _write_state(folder, state)

    return _commit(run_dir, step, best, World(), lambda folder: None, write)


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    world: World,
    best: bool = False,
) -> Path:
    """Every process calls it: each writes its shard of the weights and the optimizer's state;
    rank 0 adds ``state`` (no optimizer in it) and commits the folder; see ``_commit``."""

    import torch.distributed.checkpoint as dcp  # here: importing it takes about a second
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def write_shards(folder: Path) -> None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        try:
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder / SHARDED_DIR)
        except CheckpointException as e:  # a BaseException, each process's failure in .failures
            raise RuntimeError(f"writing the shards failed: {first_line(e, 160)}") from e

    return _commit(run_dir, step, best, world, write_shards, lambda folder: _write_state(folder, state))


def _commit(
    run_dir: Path,
    step: int,
    best: bool,
    world: World,
    write_all: Callable[[Path], None],
    write_main: Callable[[Path], None],
) -> Path:
    """Rank 0 makes the temporary folder; every process ``write_all``s into it (a collective write
    that fails on every process together); rank 0 ``write_main``s, flushes, renames the folder into
    place and moves the pointers. Whatever fails, the temporaries go, and so does the new folder
    unless a pointer names it already (the commit point); a failed write is a CheckpointError naming
    the intact checkpoint, on every process."""
    root = checkpoint_dir(run_dir)
    try:
        previous, final = world.from_main(lambda: _start(root, step))
    except Exception as e:
        failure = _write_failure(e, step, run_dir)
        if failure is None:
            raise
        raise failure from e
    tmp = root / f".{final.name}.tmp"
    try:
        write_all(tmp)
        world.from_main(lambda: _finish(root, tmp, final, best, write_main))
    except Exception as e:
        failure = _write_failure(e, step, run_dir)
        if failure is None:
            raise
        raise failure from e
    finally:
        if world.is_main:
            remove_temporaries(root)
            if final.name in _named(root):  # committed: the folders no longer needed go
                _prune(root, previous)
            else:
                shutil.rmtree(final, ignore_errors=True)
    return final


def _write_failure(error: BaseException, step: int, run_dir: Path) -> CheckpointError | None:
    """A CheckpointError for a write the operating system refused, or None for any other failure."""
    cause = os_error(error)
    if cause is None:
        return None
    return CheckpointError(write_failure(cause, f"writing the checkpoint of step {step}", run_dir))


def _start(root: Path, step: int) -> tuple[str | None, Path]:
    """-> (the folder ``last`` names now, the new checkpoint's folder), its temporary folder made."""
    root.mkdir(parents=True, exist_ok=True)
    previous = _pointed(root / "last")
    final = _new_folder(root, step)
    remove_temporaries(root)  # a killed process's
    (root / f".{final.name}.tmp").mkdir()
    return previous, final


def _finish(root: Path, tmp: Path, final: Path, best: bool, write: Callable[[Path], None]) -> None:
    write(tmp)
    for path in sorted(tmp.rglob("*")):
        if path.is_file():
            fsync_file(path)
        else:
            fsync_dir(path)
    tmp.rename(final)
    fsync_dir(root)  # the folder's name is on disk before any pointer names it
    # ``best`` first: a crash between the two then resumes from the previous ``last`` and takes the
    # step again, moving ``best`` once more; the other way round, the resumed run's best score would
    # be this checkpoint's while ``best`` named an older one.
    if best:
        atomic_write_text(root / "best", final.name + "\n")
    atomic_write_text(root / "last", final.name + "\n")


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    with open(folder / STATE_FILE, "wb") as f:  # a file object: torch then chains the OSError
        torch.save(state, f)


def training_state(
    step: int,
    optimizer: torch.optim.Optimizer | None,
    scaler: torch.amp.GradScaler,
    best: float | None,
    window: tuple[float, int] = (0.0, 0),
    elapsed_s: float = 0.0,
    cuda: bool = False,
) -> dict[str, Any]:
    """What a checkpoint's state.pt keeps besides the weights, the keys ``train --resume`` reads:
    the step, the optimizer's (None: it is sharded with the weights) and scaler's states, the best
    validation score, the loss window (summed loss, steps) not yet logged, the training time so
    far, and the RNG states."""
    return {
        "step": step,
        **({"optimizer": optimizer.state_dict()} if optimizer is not None else {}),
        "scaler": scaler.state_dict(),
        "best": best,
        "window_loss": window[0],
        "window_steps": window[1],
        "elapsed_s": elapsed_s,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state() if cuda else None,
    }


def save_initial_checkpoint(run_dir: Path, model: nn.Module, optimizer: OptimizerSpec) -> Path:
    """The checkpoint of step 0 (``last`` and ``best``): ``model``'s weights and the state training
    has before its first step (a fresh optimizer), so that ``train --resume`` continues from them."""
    state = training_state(
        0,
        build_optimizer(model, optimizer, torch.device("cpu")),
        torch.amp.GradScaler("cpu", enabled=False),
        best=None,
    )
    return save_checkpoint(run_dir, 0, model, state, best=True)


def resolve(run_dir: Path, which: str = "last") -> Path | None:
    """The checkpoint folder that ``last`` or ``best`` points to, or None before the first save.
    A pointer that does not name an existing checkpoint folder is a DamagedCheckpoint."""
    pointer = checkpoint_dir(run_dir) / which
    if not pointer.exists():
        return None
    name = _pointed(pointer)
    if name is None:
        raise DamagedCheckpoint(f"the pointer {pointer} is damaged: it does not hold a checkpoint's name")
    path = checkpoint_dir(run_dir) / name
    if not path.is_dir():
        raise DamagedCheckpoint(f"the pointer {pointer} names {name}, which is missing")
    return path


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders, oldest first (by step, then by save)."""
    root = checkpoint_dir(run_dir)
    folders = [p for p in root.glob("step-*") if FOLDER_NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(folders, key=lambda p: _order(p.name))


def folder_step(folder: Path) -> int:
    """The step a checkpoint folder holds, from its name."""
    return _order(folder.name)[0]


def load_latest(
    run_dir: Path, load: Callable[[Path], T], repair: bool, resuming: bool = True
) -> tuple[Path, T]:
    """``load`` the checkpoint that ``last`` names or, when it (or the pointer) is damaged, the newest
    one that loads, with a RunWarning that says what was skipped and why; with ``repair`` (the
    caller holds the run's lock), ``last`` then names it, so that the next save keeps it as the
    previous checkpoint. A CheckpointError when none loads; ``resuming`` or reading the run, as the
    messages say."""
    skipped: list[str] = []
    try:
        loaded = load_pointed(run_dir, "last", load)
        if loaded is not None:
            return loaded
    except DamagedCheckpoint as e:
        skipped = [str(e)]
    last = _pointed(checkpoint_dir(run_dir) / "last")
    for path in reversed(checkpoint_folders(run_dir)):
        if path.name == last:  # tried above
            continue
        try:
            loaded_state = load(path)
        except DamagedCheckpoint as e:
            skipped.append(str(e))
            continue
        if skipped:
            using = "resuming from" if resuming else "reading"
            warnings.warn(f"{'; '.join(skipped)}; {using} {path}", RunWarning, stacklevel=2)
            if repair:
                _repoint(run_dir, path)
        return path, loaded_state
    why = "; ".join(skipped) or "it has no checkpoint yet"
    raise CheckpointError(f"cannot {'resume' if resuming else 'read'} {run_dir}: {why}")


def load_pointed(run_dir: Path, which: str, load: Callable[[Path], T]) -> tuple[Path, T] | None:
    """``load`` the checkpoint that ``last`` or ``best`` names (None: no pointer yet). When it fails
    as damaged or missing but the pointer names another folder by then (the trainer saved and
    pruned the one being read), the pointer is read again, once; otherwise the DamagedCheckpoint
    stands."""
    pointer = checkpoint_dir(run_dir) / which

    def attempt() -> tuple[Path, T] | None:
        path = resolve(run_dir, which)
        return None if path is None else (path, load(path))

    named = _pointed(pointer)
    try:
        return attempt()
    except DamagedCheckpoint:
        if _pointed(pointer) in (None, named):
            raise
    return attempt()


def load_weights(model: nn.Module, path: Path) -> None:
    """The checkpoint's weights into a whole ``model`` in this process alone, sharded or not; a
    checkpoint whose tensors do not fit the model is a CheckpointError naming them."""
    if is_sharded_checkpoint(path):
        state = {"model": model.state_dict()}
        _load_shards(state, path, no_dist=True)
        model.load_state_dict(state["model"])
        return
    file = path / MODEL_FILE
    try:
        with safe_open(str(file), "pt") as f:  # the header alone: the names and shapes
            names: list[str] = f.keys()  # a safe_open is not iterable
            saved = {name: tuple(f.get_slice(name).get_shape()) for name in names}
        _check_fits(file, _untied(model.state_dict(), saved), saved)
        load_model(model, str(file), strict=False)
    except (SafetensorError, OSError) as e:
        raise _damaged(path, MODEL_FILE, first_line(e, 160)) from e


def load_training(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """The checkpoint's weights and optimizer state into the trainer's ``model`` and ``optimizer``
    (every process calls it): a sharded checkpoint into a model sharded over any number of
    processes, or whole; an unsharded one into a whole model (``state``: its state.pt)."""
    if is_sharded_checkpoint(path):
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        shards: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
        _load_shards(shards, path, no_dist=not dist.is_initialized())
        set_state_dict(
            model, optimizer, model_state_dict=shards["model"], optim_state_dict=shards["optimizer"]
        )
        return
    if is_sharded(model):
        raise CheckpointError(
            f"the checkpoint {path} holds a whole model (written with train.parallel=ddp), which a run "
            f"sharded with FSDP does not resume: resume with --set train.parallel=ddp"
        )
    load_weights(model, path)
    _check_optimizer_state(path, state.get("optimizer"), optimizer)
    optimizer.load_state_dict(state["optimizer"])


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / SHARDED_DIR).is_dir()


def _load_shards(state: dict[str, Any], path: Path, no_dist: bool) -> None:
    """Fill ``state`` ({"model": ..., "optimizer": ...}, tensors sharded or whole) in place from a
    sharded checkpoint, after checking that its weights fit ``state["model"]``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    folder = path / SHARDED_DIR
    try:
        metadata = FileSystemReader(folder).read_metadata()
    except Exception as e:
        raise _damaged(path, SHARDED_DIR, first_line(e, 160)) from e
    _check_fits(folder, state["model"], _saved_shapes(metadata))
    try:
        with warnings.catch_warnings():  # no_dist: torch warns that it reads in one process
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=folder, no_dist=no_dist)
    except (Exception, CheckpointException) as e:
        raise _damaged(path, SHARDED_DIR, first_line(e, 160)) from e


def _damaged(path: Path, file: str, why: str) -> DamagedCheckpoint:
    """'the checkpoint PATH is damaged: FILE: WHY'."""
    return DamagedCheckpoint(f"the checkpoint {path} is damaged: {file}: {why}")


def _saved_shapes(metadata: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of the weights a sharded checkpoint holds, by name; ``metadata``: its
    torch.distributed.checkpoint Metadata."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {
        name.removeprefix("model."): tuple(entry.size)
        for name, entry in metadata.state_dict_metadata.items()
        if name.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }


def _untied(model_state: dict[str, torch.Tensor], saved: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``model_state`` less the tensors tied to another one that ``saved`` holds (safetensors stores
    tied tensors once)."""
    stored = {_storage(tensor) for name, tensor in model_state.items() if name in saved}
    return {
        name: tensor
        for name, tensor in model_state.items()
        if name in saved or _storage(tensor) not in stored
    }


def _storage(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape)


def _check_fits(file: Path, model_state: dict[str, Any], saved: dict[str, tuple[int, ...]]) -> None:
    """A CheckpointError when the weights in ``file`` (``saved``: their shapes by name) are not those
    of the model whose tensors ``model_state`` holds: named, with the shapes that differ."""
    problems = [
        f"{name} is {tuple(tensor.shape)} in the model, {saved[name]} in the checkpoint"
        for name, tensor in model_state.items()
        if name in saved and saved[name] != tuple(tensor.shape)
    ]
    lacking = [name for name in model_state if name not in saved]
    extra = [name for name in saved if name not in model_state]
    problems += [f"the checkpoint lacks {_some(lacking)}"] if lacking else []
    problems += [f"the model has no {_some(extra)}"] if extra else []
    if problems:
        run_dir = file.parent.parent.parent
        raise CheckpointError(
            f"{file} does not fit the model of {run_dir / SPEC_FILE}: {'; '.join(problems[:3])}"
            f"{f' (and {len(problems) - 3} more)' if len(problems) > 3 else ''}; was the spec edited "
            f"after training, or the checkpoint copied from another run? Restore the spec's model "
            f"section, or train a new run"
        )


def _some(names: list[str]) -> str:
    """'a, b, c and 4 more'."""
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


# What state.pt must hold (``training_state``), by type; elapsed_s, rng_cuda and optimizer may be absent.
_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "scaler": (dict,),
    "best": (float, int, type(None)),
    "window_loss": (float, int),
    "window_steps": (int,),
    "rng_cpu": (torch.Tensor,),
    "elapsed_s": (float, int),
    "rng_cuda": (torch.Tensor, type(None)),
    "optimizer": (dict,),
}
_OPTIONAL_STATE = {"elapsed_s", "rng_cuda", "optimizer"}


def load_state(path: Path) -> dict[str, Any]:
    """The checkpoint's state.pt; one that does not hold what ``training_state`` writes, with its
    types, is a DamagedCheckpoint."""
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # garbled bytes raise whatever its unpickler meets (KeyError, TypeError...)
        raise _damaged(path, STATE_FILE, first_line(e, 160)) from e
    problem = _state_problem(state)
    if problem is not None:
        raise _damaged(path, STATE_FILE, problem)
    return state


def _state_problem(state: Any) -> str | None:
    """What makes ``state`` other than a training state, or None."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a training state"
    lacking = [key for key in _STATE_TYPES if key not in state and key not in _OPTIONAL_STATE]
    if lacking:
        return f"it is not a training state: it lacks {', '.join(lacking)}"
    for key, types in _STATE_TYPES.items():
        if key in state and (not isinstance(state[key], types) or isinstance(state[key], bool)):
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            return f"its {key} is a {type(state[key]).__name__}, not {expected}"
    if state["rng_cpu"].dtype != torch.uint8:
        return f"its rng_cpu is a {state['rng_cpu'].dtype} tensor, not a random generator's state"
    return None


def _indices(value: Any) -> bool:
    """Whether ``value`` is a list of parameter indices, as an optimizer's state_dict holds them."""
    return isinstance(value, list) and all(isinstance(i, int) for i in value)


def _check_optimizer_state(path: Path, saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """A DamagedCheckpoint when ``saved`` (state.pt's optimizer) is not a state of ``optimizer``: of
    another optimizer, or of another model's parameters."""

    def damaged(why: str) -> DamagedCheckpoint:
        return _damaged(path, STATE_FILE, f"its optimizer state {why}")

    if saved is None:
        raise damaged("is missing")
    groups, state = saved.get("param_groups"), saved.get("state")
    if (
        not isinstance(groups, list)
        or not isinstance(state, dict)
        or not all(isinstance(g, dict) for g in groups)
    ):
        raise damaged("is not an optimizer's (it has no param_groups and state)")
    own = optimizer.param_groups
    counts = [len(g["params"]) if _indices(g.get("params")) else -1 for g in groups]
    if counts != [len(g["params"]) for g in own]:
        raise damaged(
            f"holds parameter groups of {counts} tensors, where the model's optimizer has "
            f"{[len(g['params']) for g in own]}"
        )
    foreign = sorted({key for g in groups for key in g} - {key for g in own for key in g})
    if foreign:
        raise damaged(
            f"is another optimizer's (its settings {', '.join(foreign)} are not {type(optimizer).__name__}'s)"
        )
    params = {
        i: p
        for g, mine in zip(groups, own, strict=True)
        for i, p in zip(g["params"], mine["params"], strict=True)
    }
    needed = {"step", "exp_avg", "exp_avg_sq"} if isinstance(optimizer, torch.optim.Adam) else set()
    for index, entry in state.items():
        param = params.get(index)
        if param is None or not isinstance(entry, dict) or not needed <= set(entry):
            raise damaged(f"has an entry {index!r} that is not the state of one of the model's parameters")
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise damaged(
                    f"does not fit the model: its {key} of parameter {index} has shape "
                    f"{tuple(value.shape)}, the parameter {tuple(param.shape)}"
                )


def intact(run_dir: Path) -> str:
    """Which checkpoint a failure left intact, for its message."""
    name = _pointed(checkpoint_dir(run_dir) / "last")
    if name is None or not (checkpoint_dir(run_dir) / name).is_dir():
        return "no earlier checkpoint exists"
    return f"the checkpoint of step {_order(name)[0]} ({checkpoint_dir(run_dir) / name}) is intact"


def write_failure(error: OSError, what: str, run_dir: Path) -> str:
    """'no space left on device while writing X; the checkpoint of step M (path) is intact'."""
    reason = "no space left on device" if error.errno == errno.ENOSPC else error.strerror or str(error)
    return f"{reason} while {what}; {intact(run_dir)}"


def os_error(error: BaseException) -> OSError | None:
    """The operating system's error behind a failed write, or None for any other failure. torch
    chains it under a RuntimeError; safetensors quotes it as '(os error N)';
    torch.distributed.checkpoint gathers each process's failure into a CheckpointException."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        failures = getattr(seen, "failures", None)  # a CheckpointException: {rank: (error, trace)}
        if isinstance(failures, dict):
            causes = (os_error(failure) for failure, _ in failures.values())
            return next((cause for cause in causes if cause is not None), None)
        code = re.search(r"\(os error (\d+)\)", str(seen))
        if code:
            return OSError(int(code[1]), os.strerror(int(code[1])))
        seen = seen.__cause__ or seen.__context__
    return None


def remove_temporaries(folder: Path, names: Iterable[str] | None = None) -> None:
    """Remove the hidden ``.NAME.*.tmp`` files and folders that writes in ``folder`` leave while
    they run (the caller holds the run's lock, so none is another process's): those of ``names``
    alone where given (a run folder may hold the user's own files), else every one (a folder only
    tfcompile writes, as checkpoints/)."""
    patterns = [f".{glob.escape(name)}.*.tmp" for name in names] if names is not None else [".*.tmp"]
    for path in (path for pattern in patterns for path in folder.glob(pattern)):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _new_folder(root: Path, step: int) -> Path:
    """``step-000500``, or ``step-000500-2`` and so on when the step was saved before: a re-save never
    replaces a folder that a pointer may name."""
    name = f"step-{step:06d}"
    names = itertools.chain([name], (f"{name}-{n}" for n in itertools.count(2)))
    return next(root / n for n in names if not (root / n).exists())


def _repoint(run_dir: Path, folder: Path) -> None:
    """Point ``last`` at ``folder``; best effort, as the next save moves it anyway."""
    try:
        atomic_write_text(checkpoint_dir(run_dir) / "last", folder.name + "\n")
    except OSError:
        remove_temporaries(checkpoint_dir(run_dir))


def _pointed(pointer: Path) -> str | None:
    """The folder name a pointer file holds, or None when it holds anything else."""
    try:
        name = read_small_text(pointer).strip()
    except (OSError, ValueError):  # unreadable, not text, or not a file tfcompile wrote
        return None
    return name if FOLDER_NAME.fullmatch(name) else None


def _order(name: str) -> tuple[int, int]:
    match = FOLDER_NAME.fullmatch(name)
    assert match is not None
    return int(match[1]), int(match[2] or 1)


def _named(root: Path) -> set[str]:
    """The folders that ``last`` and ``best`` name."""
    return {name for which in POINTERS if (name := _pointed(root / which))}


def _prune(root: Path, previous: str | None) -> None:
    """Keep the checkpoints that ``last`` and ``best`` name and the one ``last`` named before this
    save (resume's fallback); remove the rest, each renamed to a hidden temporary first: a crash
    while one was removed left a ``step-N`` of some of its files, listed as a checkpoint."""
    keep = _named(root) | {previous}
    for folder in checkpoint_folders(root.parent):
        if folder.name not in keep:
            doomed = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}.tmp")
            with contextlib.suppress(OSError):
                folder.rename(doomed)
                shutil.rmtree(doomed, ignore_errors=True)
