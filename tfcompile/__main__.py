"""The ``tfcompile`` command and ``python -m tfcompile``: the CLI, where Ctrl-C while its modules
load (a third of a second) ends the command as an interruption anywhere else does: one line and
status 130, no traceback."""

from __future__ import annotations

import sys


def run() -> int:
    try:
        from tfcompile.cli import main
    except KeyboardInterrupt:
        print("tfcompile: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
