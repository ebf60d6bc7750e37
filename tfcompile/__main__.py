"""The ``tfcompile`` command and ``python -m tfcompile``: the CLI, where Ctrl-C while its modules
load (a third of a second) ends the command as an interruption anywhere else does: one line and
status 130, no traceback; and where a training process that joined a process group ends without
finalizing the interpreter (tfcompile.train.distributed.end_process says why)."""

from __future__ import annotations

import sys


def run() -> int:
    try:
        from tfcompile.cli import main
    except KeyboardInterrupt:
        print("tfcompile: interrupted", file=sys.stderr)
        return 130
    status = main()
    # A process that never imported the module created no process group (and loads no torch here).
    distributed = sys.modules.get("tfcompile.train.distributed")
    return status if distributed is None else int(distributed.end_process(status))


if __name__ == "__main__":
    raise SystemExit(run())
